"""Bad input for every consumer (imported as `garbage_support`): hypothesis strategies and a corpus builder.

The broker tests cannot run hypothesis's engine once per example (one broker
per example would take minutes, and function-scoped async fixtures do not
mix with `@given`). So `corpus()` runs the engine on a plain sync function
that only collects what it draws, and the test sends the whole corpus
through one broker. The pure tests use `@given` directly and keep shrinking.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import structlog
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from toolservice_base.transport import LARGE_MESSAGE

CRASH_EVENTS = frozenset(
    {"consumer.handler_failed", "request.handler_failed", "toolset.reload_crashed", "registry.merge_failed"}
)
"""Log events that mean a handler raised instead of answering or dropping a message."""

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=20), children, max_size=5),
    max_leaves=25,
)
"""Any JSON document (NaN and Infinity included: Python's `json` writes them)."""

random_json = json_values.map(lambda value: json.dumps(value).encode())
random_bytes = st.binary(max_size=2048)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _paths(child, (*prefix, index))


def _replace(document: Any, path: tuple[Any, ...], new: Any, delete: bool) -> Any:
    if not path:
        return new
    copy = json.loads(json.dumps(document))
    parent = copy
    for step in path[:-1]:
        parent = parent[step]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = new
    return copy


@st.composite
def mutated(draw: st.DrawFn, valid: list[dict[str, Any]]) -> bytes:
    """A valid document changed once: a field replaced, deleted or added, or its bytes cut or flipped."""
    document = draw(st.sampled_from(valid))
    how = draw(st.sampled_from(["replace", "delete", "add", "truncate", "flip"]))
    if how in ("truncate", "flip"):
        data = bytearray(json.dumps(document).encode())
        index = draw(st.integers(0, len(data) - 1))
        if how == "truncate":
            return bytes(data[:index])
        data[index] ^= draw(st.integers(1, 255))
        return bytes(data)
    if how == "add":
        objects = [path for path in _paths(document) if isinstance(_at(document, path), dict)]
        where = draw(st.sampled_from(objects))
        return json.dumps(
            _replace(document, (*where, draw(st.text(min_size=1, max_size=10))), draw(json_values), False)
        ).encode()
    path = draw(st.sampled_from([path for path in _paths(document) if path]))
    return json.dumps(_replace(document, path, draw(json_values), how == "delete")).encode()


def _at(document: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        document = document[step]
    return document


def corpus(strategy: st.SearchStrategy[Any], count: int) -> list[Any]:
    """`count` examples drawn by hypothesis's engine (not `.example()`), the same on every run."""
    found: list[Any] = []

    @settings(
        max_examples=count,
        database=None,
        phases=[Phase.generate],
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(value: Any) -> None:
        found.append(value)

    collect()
    return found


def batches(messages: list[bytes], size: int) -> list[list[bytes]]:
    """`messages` in order, in batches of up to `size` to send concurrently; each one over 64 KiB alone.

    Beside a message that large, the broker may drop others on the same
    connection (`Capabilities.separate_bulk_connection` in
    `toolservice_base.transport`; docs/operators.md, "Large answers"): a loss
    of the broker's, which is not what a test of a consumer is about.
    """
    out: list[list[bytes]] = [[]]
    for data in messages:
        if len(data) > LARGE_MESSAGE:
            out += [[data], []]
        else:
            if len(out[-1]) == size:
                out.append([])
            out[-1].append(data)
    return [batch for batch in out if batch]


def only(items: list[bytes], refused: Callable[[bytes], bool]) -> list[bytes]:
    """The items a local check refuses: what a consumer must drop without a trace in the store."""
    return [item for item in items if refused(item)]


@contextmanager
def captured_logs() -> Iterator[list[dict[str, Any]]]:
    """Every warning and error logged meanwhile, as dicts (structlog's own capture)."""
    with structlog.testing.capture_logs() as logs:
        yield logs


def crashes(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry.get("event") in CRASH_EVENTS]


def figures(consumer: str, **values: object) -> None:
    """One line per consumer for the closing note (`pytest -s` shows it)."""
    print(f"\nFIGURES consumer={consumer} " + " ".join(f"{key}={value}" for key, value in values.items()), flush=True)

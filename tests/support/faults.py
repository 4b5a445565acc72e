"""Run `toolreg` with one start-up step made to fail, then report what the process left behind.

    python tests/support/faults.py STEP REPORT -- toolreg-args...

STEP names the step (see `STEPS`); the failure is injected after the steps
before it succeeded, so their undo is what is being tested. After `main()`
returns, the process writes a JSON report: exit status, live OS threads,
asyncio tasks still pending. Used by `test_startup_faults.py`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from discovery.errors import BrokerError
from toolservice_base import BrokerUnreachable, TransportError


def _fail(error: Exception) -> Callable[..., Any]:
    def raiser(*args: Any, **kwargs: Any) -> Any:
        raise error

    return raiser


def _after(original: Callable[..., Any], error: Exception) -> Callable[..., Any]:
    """The step runs to completion, then fails: whatever it opened must be undone by the caller."""

    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        await original(*args, **kwargs)
        raise error

    return wrapped


def inject(step: str) -> None:
    import discovery.cli.up as cli
    import discovery.registry.service as registry
    from discovery.broker.embedded import EmbeddedBroker
    from discovery.store.service import ConfigStoreService

    if step == "broker":
        EmbeddedBroker.start = _fail(BrokerError("injected: the embedded broker did not start"))  # type: ignore[method-assign]
    elif step == "transport":
        cli.open_transport = _fail(BrokerUnreachable("injected: cannot reach the broker"))  # type: ignore[assignment]
    elif step == "store":
        ConfigStoreService.start = _after(ConfigStoreService.start, TransportError("injected: store start failed"))  # type: ignore[method-assign]
    elif step == "registry":
        # Mid-way through Registry.start: the store client, probe producer and descriptor subscription are open.
        registry.watch_config = _fail(TransportError("injected: cannot subscribe to config pushes"))  # type: ignore[assignment]
    elif step == "registry-after":
        registry.Registry.start = _after(registry.Registry.start, TransportError("injected: registry start failed"))  # type: ignore[method-assign]
    elif step != "none":
        raise SystemExit(f"unknown step {step!r}")


STEPS = ["broker", "transport", "store", "registry", "registry-after"]


def _settled_threads(idle: int = 2, wait: float = 3.0) -> int:
    """OS threads still alive once those already on their way out have ended.

    pulsar-client ends a closed client's threads on its own schedule: on a loaded machine one may still be
    finishing a few milliseconds after `close()` returned. A leak is a thread that stays, so the count is read
    once it reaches `idle` (main and pulsar-client's own) or `wait` seconds have passed.
    """
    deadline = time.monotonic() + wait
    while (count := len(os.listdir("/proc/self/task"))) > idle and time.monotonic() < deadline:
        time.sleep(0.05)
    return count


def main() -> None:
    step, report, _, *argv = sys.argv[1:]
    inject(step)
    import asyncio

    from discovery.cli.main import main as toolreg

    status = toolreg(argv)
    try:
        pending = len(asyncio.all_tasks())
    except RuntimeError:  # no running loop: none can be pending on it
        pending = 0
    with open(report, "w") as handle:
        json.dump({"status": status, "threads": _settled_threads(), "tasks": pending}, handle)
    sys.exit(status)


if __name__ == "__main__":
    main()

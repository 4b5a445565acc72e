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
        json.dump({"status": status, "threads": len(os.listdir("/proc/self/task")), "tasks": pending}, handle)
    sys.exit(status)


if __name__ == "__main__":
    main()

"""`toolreg serve MODULE:CLASS`: run a tool service until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from contextlib import AsyncExitStack

from toolservice_base import DynamicToolService, ServiceDefinitionError
from toolservice_base.signing import SigningError

from .announce import check_ttl
from .common import CommandError, settings_of
from .http_surface import start_health


def load_service_class(target: str) -> type[DynamicToolService]:
    module_name, _, class_name = target.partition(":")
    if not module_name or not class_name:
        raise CommandError(f"expected MODULE:CLASS, got {target!r} (e.g. toolservice_base.examples.joke:JokeService)")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: services in the current directory are found
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CommandError(f"cannot import {module_name!r}: {exc}") from None
    if not hasattr(module, class_name):
        raise CommandError(
            f"module {module_name!r} has no {class_name!r} ({getattr(module, '__file__', None) or module_name})"
        )
    cls = getattr(module, class_name)
    if not (isinstance(cls, type) and issubclass(cls, DynamicToolService)):
        what = f"a {type(cls).__name__}" if not isinstance(cls, type) else f"the class {cls.__qualname__}"
        raise CommandError(f"{target!r} is {what}, not a DynamicToolService subclass")
    return cls


async def cmd_serve(args: argparse.Namespace) -> int:
    if args.ttl is not None:
        check_ttl(args.ttl)  # before the service is imported, let alone subscribed
    cls = load_service_class(args.target)
    try:
        service = cls(
            settings=settings_of(args),
            ttl=args.ttl,
            announce=False if args.no_announce else None,
            workspace=args.workspace,
            signing_key=args.signing_key,
            call_timeout=args.call_timeout,
        )
    except (ServiceDefinitionError, SigningError) as exc:
        raise CommandError(f"{args.target}: {exc}") from None
    async with AsyncExitStack() as stack:
        health = await start_health(stack, args.metrics_port)
        if health is not None:
            health.add_check("service", service.readiness)
        await service.run()
    return 0

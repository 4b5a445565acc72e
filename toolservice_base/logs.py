"""structlog set-up: readable console lines on a terminal, JSON lines otherwise."""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(level: str | None = None, *, json: bool | None = None, stream: TextIO | None = None) -> None:
    """Configure structlog once per process.

    `TOOLREG_LOG_LEVEL` and `TOOLREG_LOG_FORMAT` (`console`|`json`) override
    the defaults, so a deployment can switch to JSON without a code change.
    Logs go to stderr: stdout belongs to command output.
    """
    name = (level or os.environ.get("TOOLREG_LOG_LEVEL") or "info").lower()
    out = stream or sys.stderr
    if json is None:
        fmt = os.environ.get("TOOLREG_LOG_FORMAT", "").lower()
        json = fmt == "json" if fmt else not out.isatty()
    renderer: structlog.typing.Processor
    if json:
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info if json else structlog.dev.set_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(name, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )

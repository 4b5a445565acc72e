"""Logging: structured events from the libraries, printed only when an application asks.

The library packages log through `get_logger(name)`: structlog loggers that
hand finished event dicts to the standard library's `logging` module under
the same name. Their package loggers carry a `NullHandler`, so a program that
imports `toolservice_base`, `discovery` or `agent_bridge` and configures no
logging prints nothing (not even warnings to stderr), as a library should.

An application turns them on either with its own `logging` set-up (our events
then flow through its handlers), or with `configure_logging()`, which is what
`toolreg` does: one handler on stderr, readable console lines on a terminal,
JSON lines otherwise. stdout always belongs to command output (and to the MCP
protocol over stdio).
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog

from . import settings

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
LIBRARY_LOGGERS = ("toolservice_base", "discovery", "agent_bridge", "bench")
CLIENT_LOGGER = "toolservice_base.transport.pulsar_client"
"""Where pulsar-client's own log lines go (see `transport.pulsar`)."""

_FILTER = structlog.stdlib.filter_by_level
_PROCESSORS: list[Any] = [
    _FILTER,
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_logger_name,
    structlog.stdlib.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    structlog.processors.StackInfoRenderer(),
    structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
]

for _name in LIBRARY_LOGGERS:
    logging.getLogger(_name).addHandler(logging.NullHandler())


class _Logger(structlog.stdlib.BoundLogger):
    """structlog's stdlib logger, whose `debug` and `info` return at once when `filter_by_level` would drop the event.

    Why: a dropped event still built its event dict and went through the processor chain to be refused by its
    first processor (an exception raised and caught). The MCP front makes two such calls per tool call at the
    default level (`mcp.call_tool`, and `mcp.call` under `warning`): 1.5 % of its loop. The test is
    `filter_by_level`'s own, made only while `filter_by_level` heads the chain, so what is logged is unchanged:
    `structlog.testing.capture_logs` replaces the chain's processors in place, and then every event is captured.
    """

    def _dropped(self, level: int) -> bool:
        logger = self._logger
        return _PROCESSORS[0] is _FILTER and (logger.disabled or level < logger.getEffectiveLevel())

    def debug(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        if self._dropped(logging.DEBUG):
            return None
        return self._proxy_to_logger("debug", event, *args, **kw)

    def info(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        if self._dropped(logging.INFO):
            return None
        return self._proxy_to_logger("info", event, *args, **kw)


def get_logger(name: str) -> Any:
    """A structured logger for library code: silent until the application configures logging.

    Bound at once (not structlog's lazy proxy, which binds a logger again on every call): its processors are these
    whatever `structlog.configure` says, as they were with the proxy."""
    return _Logger(logging.getLogger(name), processors=_PROCESSORS, context={})


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the handler `configure_logging` installed, so a second call replaces it."""


def configure_logging(level: str | None = None, *, json: bool | None = None, stream: TextIO | None = None) -> None:
    """Print the product's events (and any other `logging` records) on `stream`, stderr by default.

    `TOOLREG_LOG_LEVEL` and `TOOLREG_LOG_FORMAT` (`console`|`json`) override
    the defaults, so a deployment can switch to JSON without a code change.
    Calling it again replaces the earlier set-up.
    """
    name = (level or settings.log_level() or "info").lower()
    out = stream or sys.stderr
    if json is None:
        fmt = settings.log_format()
        json = fmt == "json" if fmt else not out.isatty()
    renderer: Any
    if json:
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty() and not settings.no_color())
    formatter = structlog.stdlib.ProcessorFormatter(
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info if json else structlog.dev.set_exc_info,
            renderer,
        ],
        foreign_pre_chain=[
            structlog.stdlib.add_logger_name,
            structlog.stdlib.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
        ],
    )
    handler = _Handler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(_LEVELS.get(name, logging.INFO))
    # APScheduler logs every run of every job at info (four lines a second for the registry's sweep).
    logging.getLogger("apscheduler").setLevel(max(logging.WARNING, root.level))
    # httpx logs every request at info (`toolreg init`'s calls to the admin API): only when debugging.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, root.level) if root.level > logging.DEBUG else root.level)
    # pulsar-client repeats every connection retry: only when debugging.
    logging.getLogger(CLIENT_LOGGER).setLevel(logging.WARNING if root.level <= logging.DEBUG else logging.CRITICAL)
    # Structlog's own default (used by code that calls structlog.get_logger directly) goes the same way.
    structlog.configure(
        processors=_PROCESSORS,
        wrapper_class=structlog.stdlib.BoundLogger,
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=False,
    )

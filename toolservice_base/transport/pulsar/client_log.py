"""pulsar-client's own log lines: where they go, and why by default nowhere."""

from __future__ import annotations

import logging
import os

import pulsar

from ...logs import CLIENT_LOGGER

CLIENT_LOG = logging.getLogger(CLIENT_LOGGER)
"""pulsar-client's own (C++) log lines, routed into `logging`: its console logger writes to stdout, which
belongs to command output and to MCP over stdio. They repeat what the product reports itself (a refused
connection, every retry), so they are off unless the application sets this logger's level
(`configure_logging("debug")` shows its warnings and errors)."""
if CLIENT_LOG.level == logging.NOTSET:
    CLIENT_LOG.setLevel(logging.CRITICAL)


def client_logger() -> logging.Logger | pulsar.FileLogger:
    """The logger a new pulsar-client gets: `CLIENT_LOG` only while someone listens to it.

    Given a Python logger, pulsar-client calls it for every line it makes,
    debug ones included, from its I/O threads under the GIL, and `logging`
    drops them only afterwards. Measured with `python -m bench --quick --only
    throughput` on pulsar-lite: registry CPU at 5,000 heartbeats/s 90% with the
    Python logger, 37% without. So unless `CLIENT_LOG` is enabled for warnings
    (`configure_logging("debug")`), the library's own logger writes its errors
    to the null device: never to stdout, which belongs to command output and to
    MCP over stdio. pulsar-client keeps the first client's logger for the whole
    process (measured: later clients' loggers received nothing), so configure
    logging before opening a transport.
    """
    if CLIENT_LOG.isEnabledFor(logging.WARNING):
        return CLIENT_LOG
    return pulsar.FileLogger(pulsar.LoggerLevel.Error, os.devnull)

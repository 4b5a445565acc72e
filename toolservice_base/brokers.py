"""The kinds of broker the product knows, named once: what `TOOLREG_BROKER` may say and what a transport is opened for.

Settings check the environment against it and the transport picks its capabilities by it; both import these names
from here (neither may import the other at module level: the transport package reads settings).
"""

from __future__ import annotations

APACHE_PULSAR = "apache-pulsar"
PULSAR_LITE = "pulsar-lite"
MEMORY = "memory"
"""The in-process broker (`transport/memory.py`): for contract tests and a service's own tests, never named by a URL."""

BROKER_KINDS = (APACHE_PULSAR, PULSAR_LITE, MEMORY)
"""Every kind a transport can be opened for."""
NETWORK_BROKERS = (APACHE_PULSAR, PULSAR_LITE)
"""The kinds a `pulsar://` URL can point at, so the ones `TOOLREG_BROKER` may name."""

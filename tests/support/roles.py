"""A role per kind of process on the run's Apache Pulsar: what the tests of authorization start from.

Each kind (store, service, agent, operator) gets a role of its own, freshly named so that tests sharing the broker
never share a role, granted on one tenant what deploy/pulsar-init.sh grants that kind, and `Settings` carrying a
token of that role.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from pathlib import Path

from apache_pulsar import KIND_GRANTS, ApachePulsar

from toolservice_base import Settings


def kind_settings(
    apache: ApachePulsar, tenant: str, root: Path, kinds: Iterable[str] = tuple(KIND_GRANTS)
) -> dict[str, Settings]:
    """Each of `kinds`' settings on `tenant`, its data directory under `root`; the role is `<kind>-<random>`."""
    suffix = uuid.uuid4().hex[:6]
    tokens = apache.grant_kinds(tenant, {kind: f"{kind}-{suffix}" for kind in kinds})
    return {
        kind: Settings(
            data_dir=root / kind,
            pulsar_url=apache.url,
            broker="apache-pulsar",
            topicspace=tenant,
            auth_token=token,
            operation_timeout=5,
        )
        for kind, token in tokens.items()
    }

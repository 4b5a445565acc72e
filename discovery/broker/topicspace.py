"""What a topicspace is on an Apache Pulsar cluster, and making one: `toolreg init`.

A topicspace is a tenant with the product's namespaces (`topics.NAMESPACES`).
Everything is non-persistent but `state`, where the replicated config store
keeps its log, snapshots and locks in persistent topics that must be kept
without limit, and `audit`, where the MCP front's audit records are kept for
a while (30 days unless told): their retention is set on every run, so a
namespace made by hand (or by an older release) gets it too. With authorization on, each role named
is granted what its kind of process needs on each namespace (`GRANTS`).

`prepare` is safe to run again: what exists is kept, and the policies and
grants are set every time. deploy/pulsar-init.sh does the same with
`bin/pulsar-admin`, for a cluster where the product is not installed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

from discovery.errors import ClusterAdminError
from toolservice_base.topics import NAMESPACES

from .admin import PulsarAdmin

UNLIMITED_RETENTION = {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}
DEFAULT_AUDIT_RETENTION = "30d"
"""How long `audit` keeps the MCP front's audit records unless told (deploy/pulsar-init.sh's default too)."""
_MINUTES = {"s": 1 / 60, "m": 1, "h": 60, "d": 1440, "w": 10080, "y": 525600}
_TIME = re.compile(r"^(\d+)([smhdwy]?)$")


def retention_minutes(text: str) -> int:
    """A retention time as pulsar-admin takes it (`30d`, `12h`, `90m`, `2w`, `1y`; a bare number is seconds; -1 keeps
    everything), in the admin API's minutes; one line for anything else."""
    text = text.strip()
    if text == "-1":
        return -1
    found = _TIME.match(text)
    if found is None or int(found.group(1)) == 0:
        raise ClusterAdminError(
            f"audit retention {text!r} is not a time: give a number and a unit (30d, 12h, 2w, 1y) or -1 for no limit"
        )
    return max(1, math.ceil(int(found.group(1)) * _MINUTES[found.group(2) or "s"]))


def policies(audit_retention: str = DEFAULT_AUDIT_RETENTION) -> dict[str, dict[str, dict[str, int]]]:
    """Policies set on a namespace (by its name in the topicspace) every time, after it is made: `state` (the
    replicated store's log) kept for good, `audit` for `audit_retention`."""
    audit = {"retentionTimeInMinutes": retention_minutes(audit_retention), "retentionSizeInMB": -1}
    return {"state": {"retention": UNLIMITED_RETENTION}, "audit": {"retention": audit}}


ALL_PROCESSES = "toolreg"
"""The one kind of role there is today: every toolreg process alike, as deploy/pulsar-init.sh grants it."""
GRANTS: Mapping[str, Mapping[str, tuple[str, ...]]] = {
    ALL_PROCESSES: {namespace: ("produce", "consume") for namespace in NAMESPACES},
}
"""What a role of each kind may do in each namespace of the topicspace. The one place grants are decided: a kind of
process with less to do (a tool service, an agent) is a new entry here, and `--role` gives a role its kind."""


async def allowed_cluster(admin: PulsarAdmin, cluster: str | None) -> str:
    """The cluster a new tenant may use: `cluster` if given, else the cluster's own name when it has exactly one."""
    if cluster:
        return cluster
    clusters = [str(name) for name in await admin.get("clusters") or []]
    if len(clusters) != 1:
        raise ClusterAdminError(
            f"the admin API at {admin.url} knows {len(clusters)} clusters ({', '.join(clusters) or 'none'}): name the"
            " one the topicspace may use with --cluster (or PULSAR_CLUSTER)"
        )
    return clusters[0]


async def prepare(
    admin: PulsarAdmin,
    topicspace: str,
    *,
    cluster: str | None = None,
    roles: Iterable[tuple[str, str]] = (),
    audit_retention: str = DEFAULT_AUDIT_RETENTION,
) -> list[str]:
    """Tenant `topicspace`, its namespaces and their policies, and the grants of `roles` (role, kind); one line per
    step, saying what was made and what was there already."""
    wanted = policies(audit_retention)  # a retention that is not a time: one line before anything is made
    said = []
    if topicspace in (await admin.get("tenants") or []):
        said.append(f"tenant {topicspace}: exists")
    else:
        allowed = await allowed_cluster(admin, cluster)
        await admin.put(f"tenants/{topicspace}", {"allowedClusters": [allowed], "adminRoles": []})
        said.append(f"tenant {topicspace}: created (cluster {allowed})")
    existing = set(await admin.get(f"namespaces/{topicspace}") or [])
    grants = [(role, GRANTS[kind]) for role, kind in roles]
    for name in NAMESPACES:
        namespace = f"{topicspace}/{name}"
        if namespace in existing:
            said.append(f"namespace {namespace}: exists")
        else:
            await admin.put(f"namespaces/{namespace}")
            said.append(f"namespace {namespace}: created")
        for policy, value in wanted.get(name, {}).items():
            await admin.post(f"namespaces/{namespace}/{policy}", value)
            kept = "unlimited" if value == UNLIMITED_RETENTION else audit_retention.strip()
            said.append(f"namespace {namespace}: {policy} {kept}")
        for role, actions in grants:
            if name in actions:
                await admin.post(f"namespaces/{namespace}/permissions/{role}", list(actions[name]))
                said.append(f"namespace {namespace}: role {role} may {' and '.join(actions[name])}")
    return said

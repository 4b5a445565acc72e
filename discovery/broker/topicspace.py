"""What a topicspace is on an Apache Pulsar cluster, and making one: `toolreg init`.

A topicspace is a tenant with the product's namespaces (`topics.NAMESPACES`).
Everything is non-persistent but `state`, where the replicated config store
keeps its log, snapshots and locks in persistent topics that must be kept
without limit, and `audit`, where the MCP front's audit records are kept for
a while (30 days unless told): their retention is set on every run, so a
namespace made by hand (or by an older release) gets it too. With authorization on, each role named
is granted what its kind of process needs on each namespace (`GRANTS`), and the store's subscriptions
are reserved for the store's roles.

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


ALL_PROCESSES = "all"
"""Every toolreg process alike (`--role`, TOOLREG_ROLE): produce and consume everywhere, no least privilege."""
GRANTS: Mapping[str, Mapping[str, tuple[str, ...]]] = {
    "store": {namespace: ("produce", "consume") for namespace in NAMESPACES},
    "service": {"request": ("consume",), "response": ("produce",), "discovery": ("produce", "consume")},
    "agent": {
        "request": ("produce",),
        "response": ("produce", "consume"),
        "notify": ("consume",),
        "audit": ("produce",),
    },
    "operator": {
        "request": ("produce",),
        "response": ("produce", "consume"),
        "notify": ("consume",),
        "state": ("consume",),
        "audit": ("consume",),
    },
    ALL_PROCESSES: {namespace: ("produce", "consume") for namespace in NAMESPACES},
}
"""What a role of each kind of process may do in each namespace of the topicspace: the store's replicas and the
registry (`store`: the only kind that may produce on `state`), tool services, agents and MCP fronts, operators. The
one place toolreg decides grants; deploy/pulsar-init.sh's `actions` and scripts/apache_pulsar.py's `KIND_GRANTS` say
the same (tests/deploy keep the three equal)."""
RESERVED_SUBSCRIPTIONS = ("config-store", "tool-registry")
"""The request namespace's subscriptions only a store role may use: a tool service's role may consume requests, and
could otherwise join the config store's shared subscription and swallow config requests."""


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
    roles = list(roles)
    grants = [(role, kind, GRANTS[kind]) for role, kind in roles]
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
        for role, kind, actions in grants:
            if name in actions:
                await admin.post(f"namespaces/{namespace}/permissions/{role}", list(actions[name]))
                said.append(f"namespace {namespace}: role {role} ({kind}) may {' and '.join(actions[name])}")
    store_roles = sorted({role for role, kind in roles if kind in ("store", ALL_PROCESSES)})
    for subscription in RESERVED_SUBSCRIPTIONS if store_roles else ():
        await admin.post(f"namespaces/{topicspace}/request/permissions/subscription/{subscription}", store_roles)
        said.append(f"namespace {topicspace}/request: subscription {subscription} only for {', '.join(store_roles)}")
    return said

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
from toolservice_base.rpc.wire import CANCEL_SUFFIX
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
OWN_QUEUES_GRANTS: Mapping[str, tuple[str, ...]] = {"discovery": ("produce", "consume")}
"""A service role's namespace grants when each service is granted its own queues (`prepare(per_service=True)`,
`toolreg init --per-service`): announcing and probes only; its queues come from `grant_service`."""
STORE_QUEUES = ("config", "tool-registry")
"""The queues of the store's replicas and the registry (and each workspace's `config:<workspace>`, as TrustGraph
names them): never a tool service's to consume or answer."""
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
    per_service: bool = False,
) -> list[str]:
    """Tenant `topicspace`, its namespaces and their policies, and the grants of `roles` (role, kind); one line per
    step, saying what was made and what was there already.

    `per_service`: a service role gets no namespace-wide consume on `request` nor produce on `response` (with it, any
    tool service may read every other's calls and the config store's, and answer them): each service is then granted
    its own queues by `grant_service`. A role that had the namespace grants keeps none of them there."""
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
    grants = [
        (role, kind, OWN_QUEUES_GRANTS if per_service and kind == "service" else GRANTS[kind]) for role, kind in roles
    ]
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
            elif kind == "service" and name in GRANTS["service"]:  # what an earlier, shared-role init granted
                await admin.delete(f"namespaces/{namespace}/permissions/{role}", missing_ok=True)
                said.append(f"namespace {namespace}: role {role} ({kind}) may do nothing namespace-wide")
    store_roles = sorted({role for role, kind in roles if kind in ("store", ALL_PROCESSES)})
    for subscription in RESERVED_SUBSCRIPTIONS if store_roles else ():
        await admin.post(f"namespaces/{topicspace}/request/permissions/subscription/{subscription}", store_roles)
        said.append(f"namespace {topicspace}/request: subscription {subscription} only for {', '.join(store_roles)}")
    return said


def service_queues(topicspace: str, service_id: str) -> tuple[str, str]:
    """A service's request and response queues by the default naming (`Topics.request_queue`, `response_queue`)."""
    return f"non-persistent://{topicspace}/request/{service_id}", f"non-persistent://{topicspace}/response/{service_id}"


async def grant_service(
    admin: PulsarAdmin,
    topicspace: str,
    service_id: str,
    role: str,
    *,
    request_queue: str | None = None,
    response_queue: str | None = None,
) -> list[str]:
    """Let `role` serve exactly one tool service: consume its request queue and its cancel queue, produce on its
    response queue (topic-level grants), and announce it (`discovery`). One line per step.

    Apache Pulsar 4.0 grants on a topic only while it exists, and a
    non-persistent topic exists only while in use, so each queue is made
    first; the grant is kept in the namespace's policies, and holds when the
    topic is made again. Callers' private reply queues cannot be granted
    ahead (their names are the callers'): the service answers on the shared
    response queue, which callers also read.
    """
    default_request, default_response = service_queues(topicspace, service_id)
    request = request_queue or default_request
    response = response_queue or default_response
    own = {f"{topicspace}/request", f"{topicspace}/response"}
    for queue in (request, response):
        if _namespace_of(queue) not in own:
            raise ClusterAdminError(
                f"{queue} is not in {topicspace}/request or {topicspace}/response: a service's queues live there"
            )
    for queue in (request, response):
        name = queue.rpartition("/")[2]
        if name in STORE_QUEUES or name.startswith("config:"):
            raise ClusterAdminError(
                f"{queue} is the store's or the registry's queue, never a tool service's: choose another id or queue"
            )
    said = []
    for queue, actions in ((request, ("consume",)), (request + CANCEL_SUFFIX, ("consume",)), (response, ("produce",))):
        path = queue.replace("://", "/", 1)
        await admin.put(path, exists_ok=True)
        await admin.post(f"{path}/permissions/{role}", list(actions))
        said.append(f"topic {queue}: role {role} (service {service_id}) may {' and '.join(actions)}")
    for name, allowed in OWN_QUEUES_GRANTS.items():
        await admin.post(f"namespaces/{topicspace}/{name}/permissions/{role}", list(allowed))
        said.append(f"namespace {topicspace}/{name}: role {role} (service {service_id}) may {' and '.join(allowed)}")
    return said


def _namespace_of(queue: str) -> str:
    return queue.split("://", 1)[-1].rpartition("/")[0]

"""Replicated state on the broker itself: one active replica elected by Apache Pulsar, standbys tailing a log.

Three layers, none of which knows what the state is (the config store and the
registry plug in on top):

- `membership`: each replica's status once a second (`toolreg replicas`), the
  record itself in `status`;
- `election`: the lock, an exclusive producer the broker hands to one replica
  at a time (`wait`), taken over from a silent holder (`fence`), with terms
  that only grow and writers (`elected`) that a deposed active can no longer use;
- `log`: an append-only log of JSON entries with versions that never go back
  at any reader, and snapshots for a bounded start (`snapshots`); `wholeness` tells when
  the broker deleted entries under it (a namespace without retention).

Wiring, in this order (each step undone if a later one fails)::

    async with AsyncExitStack() as stack:
        members = await stack.enter_async_context(
            Membership(transport, rid, "config-store", version=lambda: log.version)
        )
        election = Election(transport, transport.topics.state_lock, rid, membership=members)
        log = await stack.enter_async_context(ReplicatedLog(transport, state, election=election))
        await stack.enter_async_context(election)

Needs Apache Pulsar (`Capabilities.replicated_state`): pulsar-lite has no
producer access modes; each layer refuses it in one line.
"""

from .election import ElectedWriter, Election, RoleChange
from .groupkey import GroupKey, GroupKeyError, group_key_from
from .log import FORMAT, LogEntry, Manifest, ReplicatedLog, StateMachine
from .membership import Membership
from .status import ReplicaStatus, Role, differing_settings, settings_digest

__all__ = [
    "FORMAT",
    "ElectedWriter",
    "Election",
    "GroupKey",
    "GroupKeyError",
    "LogEntry",
    "Manifest",
    "Membership",
    "ReplicaStatus",
    "ReplicatedLog",
    "Role",
    "RoleChange",
    "StateMachine",
    "differing_settings",
    "group_key_from",
    "settings_digest",
]

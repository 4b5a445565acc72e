"""What the config store asks of a journal (the replicated log) around each request: the lock confirmed before it
answers from its state, a write made durable before it is answered, and a write it already made answered as made."""

from __future__ import annotations

from typing import Protocol

from toolservice_base.logs import get_logger
from toolservice_base.schemas import ConfigRequest, ConfigResponse, ErrorBody

from .operations import Outcome
from .sqlite import Write

__all__ = ["Journal", "already_made", "made_durable", "not_active"]

log = get_logger("discovery.store")

RETRY = "retry, the active replica will answer"


class Journal(Protocol):
    """Where a write is made durable before it is acknowledged, when the store itself is not (the replicated log)."""

    async def append(self, write: Write, request: str | None = None) -> None:
        """Return once `write` is durable; raise if it may not be (the caller then stops serving). `request`: the id of
        the request that made it, kept with it (`made`)."""
        ...

    def must_log(self, write: Write | None) -> bool:
        """Whether `write` (what a request changed, None: nothing) is appended before it is answered: the replicated
        group's durability rule (`ReplicaCore.executed`)."""
        ...

    def made(self, request: str) -> int | None:
        """The version at which the request with this id was made, if it was (None: not that the journal knows).

        The broker hands a request again to the next active replica when the
        one that made it was cut off before it could acknowledge the message:
        made twice, a conditional write would fail its own condition, and a
        put would overwrite what came after it.
        """
        ...

    def lost(self, reason: str) -> None:
        """The local state may hold a write the log does not: stop serving and rebuild from the log."""
        ...

    async def confirm(self) -> str | None:
        """None while this store may still answer from its state (it holds the log's lock, as confirmed within a
        grace); else why not, and it stops serving."""
        ...


def not_active(reason: str) -> Outcome:
    return Outcome(ConfigResponse(error=ErrorBody(type="store-error", message=f"{reason}; {RETRY}")))


def already_made(
    journal: Journal | None, request: ConfigRequest, request_id: str | None, trustgraph: bool
) -> Outcome | None:
    """The answer to a write the journal already holds (delivered again after a failover), as it was first given."""
    if journal is None or request_id is None or request.operation not in ("put", "delete"):
        return None
    version = journal.made(request_id)
    if version is None:
        return None
    log.info("config.request_already_made", operation=request.operation, version=version, id=request_id)
    return Outcome(ConfigResponse() if trustgraph else ConfigResponse(version=version))


async def made_durable(
    journal: Journal, write: Write, outcome: Outcome, operation: str, request_id: str | None
) -> tuple[Outcome, str | None]:
    """`outcome` once `write` is in the journal; else an error answer, and why the store can no longer vouch for its
    state.

    The write is already in the local state, and an append that failed may
    or may not have reached the log (a timeout), so the journal stops this
    replica serving and rebuilds it from the log. The caller retries and
    meets the active one.
    """
    try:
        await journal.append(write, request_id)
    except Exception as exc:
        reason = f"the write was not acknowledged by the replicated log ({exc}); {RETRY}"
        log.warning("config.write_not_durable", operation=operation, version=write.version, error=str(exc))
        journal.lost(reason)
        return Outcome(ConfigResponse(error=ErrorBody(type="store-error", message=reason))), reason
    return outcome, None

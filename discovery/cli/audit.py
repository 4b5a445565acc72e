"""`toolreg audit verify`: which records of the MCP fronts' audit topic are their own, forged, or missing.

It reads `persistent://<topicspace>/audit/mcp-calls` from the start of what
the broker keeps to its end, judging each record with the trust policy's
audit fronts (`toolreg trust add-front`; `discovery.audit_chain`),
prints one line per problem (at most `--show`), and ends with one line:
how many records are good and, when anything is wrong, what. It exits 1 when
any record is forged, unsigned, replayed, out of order or broken, or any is
missing or was dropped by its front: a trail with any of these cannot be
taken as whole.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from discovery.registry.settings import RegistrySettings

from .common import Deadline, connect, lazy, opened
from .parsing import subcommands

if TYPE_CHECKING:
    from discovery.audit_chain import AuditVerifier, Checked, Gap
    from toolservice_base.transport import Transport

TIMEOUT = 5.0
"""Seconds `--timeout` gives reaching the broker and opening the reader, as the other commands that ask."""
QUIET = 2.0
"""On a broker that cannot say where the topic ends (pulsar-lite), the end is when nothing came for this long."""
SHOW = 20
"""Problems listed by default; the summary counts them all."""
EXAMPLES = """examples:
  toolreg trust add-front front-eu --public-key keys/front-eu.key.pub
  toolreg audit verify                      # the audit fronts of ./trust.json (or TOOLREG_TRUST_POLICY)
  toolreg audit verify --policy /etc/toolreg/trust.json --show 100
  toolreg audit verify --json | jq .forged
"""


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    audit = sub.add_parser(
        "audit",
        parents=[common],
        help="check the MCP fronts' audit trail",
        description="Check the audit records the MCP fronts publish (toolreg mcp --audit-topic --audit-key).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EXAMPLES,
    )
    actions = subcommands(audit, dest="audit_command", metavar="ACTION", required=True)
    verify = actions.add_parser(
        "verify",
        parents=[common],
        help="say which audit records are forged, which are missing, and how many are good",
        description=(
            "Read the audit topic and check every record: signed by an audit front of the trust policy, and in its"
            " place in that front's chain. Exit 1 when anything is wrong."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EXAMPLES,
    )
    verify.add_argument(
        "--policy",
        default=None,
        help=f"the trust policy naming the audit fronts (env {RegistrySettings.env('trust_policy')}, trust.json)",
    )
    verify.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    verify.add_argument("--show", type=int, default=SHOW, metavar="N", help=f"problems listed at most (default {SHOW})")
    verify.add_argument(
        "--timeout",
        type=float,
        default=TIMEOUT,
        metavar="SECONDS",
        help=f"the longest to wait for the broker before reading (default {TIMEOUT:g})",
    )
    verify.set_defaults(handler=lazy("audit", "cmd_audit_verify"))


async def cmd_audit_verify(args: argparse.Namespace) -> int:
    from discovery.audit_chain import AuditVerifier
    from discovery.registry.trust import TrustPolicy

    from .trust import policy_path

    policy = TrustPolicy.load(policy_path(args))
    if not policy.fronts:
        print(
            f"toolreg: {policy_path(args)} names no audit front, so no record can verify: trust each front's key with"
            " `toolreg trust add-front NAME --public-key KEY`",
            file=sys.stderr,
        )
    names = {kid: key.name for kid, key in policy.fronts.items()}
    verifier = AuditVerifier(policy.front_keys())
    deadline = Deadline(args.timeout)
    connection = await connect(args, deadline)
    problems: list[Checked] = []
    try:
        topic = connection.topics.mcp_audit
        read = await _read(connection, topic, verifier, problems, deadline)
    finally:
        await connection.close()
    missing, trimmed = verifier.gaps()
    if args.json:
        print(json.dumps(_document(topic, read, verifier, problems, missing, trimmed, names)))
    else:
        for checked in problems[: max(0, args.show)]:
            print(_problem(checked, names))
        if len(problems) > args.show:
            print(f"... and {len(problems) - args.show} more")
        for gap in missing:
            print(f"missing    {gap.count} record(s) of front {gap.front} ({_signer(gap.key, names)}): {_places(gap)}")
        print(_summary(topic, read, verifier, missing, trimmed))
    return 0 if _whole(verifier, missing) else 1


async def _read(
    connection: Transport, topic: str, verifier: AuditVerifier, problems: list[Checked], deadline: Deadline
) -> int:
    """Every record the topic keeps, judged in order; returns how many were read."""
    opening = asyncio.ensure_future(connection.reader(topic, "earliest"))
    await opened(opening, connection.url, topic, deadline)
    source = opening.result()
    read = 0
    try:
        knows_end = connection.capabilities.replicated_state  # pulsar-lite cannot say where a topic ends
        while not knows_end or await source.has_message_available():
            envelope = await source.read_next(timeout=QUIET if not knows_end else 30.0)
            if envelope is None:
                break
            read += 1
            checked = verifier.check_bytes(envelope.data)
            if checked.verdict != "good":
                problems.append(checked)
    finally:
        await connection.close_reader(source)
    return read


def _whole(verifier: AuditVerifier, missing: list[Gap]) -> bool:
    wrong = sum(n for verdict, n in verifier.counts.items() if verdict != "good")
    return not wrong and not missing and not verifier.dropped


def _signer(kid: str, names: dict[str, str]) -> str:
    return f"key {names[kid]!r}" if kid in names else f"key {kid}"


def _places(gap: Gap) -> str:
    return f"sequence {gap.first}" if gap.first == gap.last else f"sequences {gap.first}-{gap.last}"


def _problem(checked: Checked, names: dict[str, str]) -> str:
    from toolservice_base.schemas import printable

    record = checked.record
    if record is None:
        return f"{checked.verdict:<10} {checked.reason}"
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.at))
    place = f" #{record.sequence}" if record.sequence is not None else ""
    what = f"subject {record.subject!r} tool {record.tool!r} at {when}, front {printable(record.front)}{place}"
    return f"{checked.verdict:<10} {what}: {checked.reason}"


def _summary(topic: str, read: int, verifier: AuditVerifier, missing: list[Gap], trimmed: list[Gap]) -> str:
    """One line: the good count, and every kind of trouble there is, or that the trail verifies."""
    counts = verifier.counts
    chains = len({(c.key, c.front) for c in verifier.chains.values()})
    trouble = [f"{n} {verdict}" for verdict, n in counts.items() if verdict != "good" and n]
    if missing:
        trouble.append(f"{sum(g.count for g in missing)} missing ({len(missing)} gap{'s' * (len(missing) != 1)})")
    if verifier.dropped:
        trouble.append(f"{verifier.dropped} dropped by their front")
    aged = sum(g.count for g in trimmed)
    before = f"; {aged} older record(s) no longer kept by the topic" if aged else ""
    good = f"{counts['good']} good record(s) of {read} from {chains} front chain(s)"
    if trouble:
        return f"audit trail NOT verified ({topic}): {good}; {', '.join(trouble)}{before}"
    return f"audit trail verified ({topic}): {good}{before}"


def _document(
    topic: str,
    read: int,
    verifier: AuditVerifier,
    problems: list[Checked],
    missing: list[Gap],
    trimmed: list[Gap],
    names: dict[str, str],
) -> dict[str, object]:
    def gap(g: Gap) -> dict[str, object]:
        return {"front": g.front, "key": names.get(g.key, g.key), "first": g.first, "last": g.last, "count": g.count}

    return {
        "topic": topic,
        "verified": _whole(verifier, missing),
        "read": read,
        **{str(verdict): n for verdict, n in verifier.counts.items()},
        "dropped": verifier.dropped,
        "missing": [gap(g) for g in missing],
        "trimmed": [gap(g) for g in trimmed],
        "problems": [
            {"verdict": c.verdict, "reason": c.reason, **({"record": c.record.to_wire()} if c.record else {})}
            for c in problems
        ],
    }

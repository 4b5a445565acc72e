"""`toolreg keygen` and `toolreg trust ...`: signing keys and the registry's trust policy."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from discovery.registry.settings import RegistrySettings
from discovery.registry.trust import CONFIG_WRITES, PolicyError, TrustedKey, TrustPolicy, operator_key, trusted_key
from toolservice_base.signing import (
    generate_key_pair,
    load_private_key,
    public_key_text,
)

from .common import fail
from .output import Column, add_output_options, render
from .parsing import Parser, subcommands


def policy_path(args: argparse.Namespace) -> Path:
    return Path(args.policy or RegistrySettings.variable("trust_policy").read() or "trust.json")


async def cmd_keygen(args: argparse.Namespace) -> int:
    private, public = generate_key_pair(Path(args.path))
    print(f"private key  {private} (mode 0600; give it to the service: toolreg serve --signing-key {private})")
    print(f"public key   {public}: {public.read_text().strip()}")
    print(f"trust it     toolreg trust add NAME --public-key {public} --services 'SERVICE-ID*' --tools 'TOOL*'")
    return 0


def _load_or_new(path: Path) -> TrustPolicy:
    return TrustPolicy.load(path) if path.exists() else TrustPolicy(path=path)


def _key_text(value: str) -> str:
    """A public key given inline, as a `.pub` file, or as a private key file (its public half)."""
    candidate = Path(value)
    if candidate.is_file():
        text = candidate.read_text().strip()
        if text.startswith("-----BEGIN"):
            return public_key_text(load_private_key(candidate).public_key())
        return text
    return value


async def cmd_trust_add(args: argparse.Namespace) -> int:
    path = policy_path(args)
    policy = _load_or_new(path)
    entry = trusted_key(
        args.name, _key_text(args.public_key), args.services, args.tools, getattr(args, "workspaces", None)
    )
    replaced = [
        k for k in policy.keys.values() if k.name == entry.name or k.id == entry.id
    ]  # one entry per name, and per key
    for old in replaced:
        del policy.keys[old.id]
    policy.add(entry)
    policy.save(path)
    verb = "replaced" if replaced else "added"
    renamed = [old.name for old in replaced if old.name != entry.name]
    also = f" (the same public key was trusted as {', '.join(map(repr, renamed))})" if renamed else ""
    print(f"{verb} key {entry.name!r} ({entry.id}) in {path}{also}: it may announce {entry.scope()}")
    print("the registry reads the policy at start: restart it (or `toolreg up`) to apply")
    return 0


async def cmd_trust_remove(args: argparse.Namespace) -> int:
    path = policy_path(args)
    policy = TrustPolicy.load(path)
    matches = [k for k in policy.keys.values() if args.name in (k.name, k.id)]
    if not matches:
        if any(args.name in (k.name, k.id) for k in policy.operators.values()):
            return fail(
                f"no key named {args.name!r} in {path}; {args.name!r} is an operator: remove it with `toolreg trust"
                f" remove-operator {args.name}`"
            )
        return fail(f"no key named {args.name!r} in {path}")
    for key in matches:
        del policy.keys[key.id]
    policy.save(path)
    print(f"removed key {args.name!r} from {path}")
    return 0


KEY_COLUMNS: list[Column[TrustedKey]] = [
    Column("NAME", lambda k: k.name),
    Column("KEY ID", lambda k: k.id),
    Column("PUBLIC KEY", lambda k: k.text, wide=True),
    Column("SERVICES", lambda k: ",".join(k.services)),
    Column("TOOLS", lambda k: ",".join(k.tools)),
    Column("WORKSPACES", lambda k: _workspaces(k.workspaces)),
]


def _key_record(k: TrustedKey) -> dict[str, object]:
    return {
        "name": k.name,
        "id": k.id,
        "public_key": k.text,
        "services": list(k.services),
        "tools": list(k.tools),
        "workspaces": list(k.workspaces),
        "may": f"announce {k.scope()}",
    }


async def cmd_trust_add_operator(args: argparse.Namespace) -> int:
    path = policy_path(args)
    policy = _load_or_new(path)
    key = operator_key({"name": args.name, "public-key": _key_text(args.public_key)}, f"operator {args.name!r}")
    replaced = [k for k in policy.operators.values() if k.name == key.name or k.id == key.id]
    for old in replaced:
        del policy.operators[old.id]
    policy.operators[key.id] = key
    policy.save(path)
    print(f"{'replaced' if replaced else 'added'} operator {key.name!r} ({key.id}) in {path}")
    if policy.config_writes != "signed":
        print(f"writes of tools are not yet checked: `toolreg trust config-writes signed --policy {path}` turns it on")
    print("the store reads the policy at start: restart `toolreg up` to apply")
    return 0


async def cmd_trust_add_front(args: argparse.Namespace) -> int:
    path = policy_path(args)
    policy = _load_or_new(path)
    key = operator_key({"name": args.name, "public-key": _key_text(args.public_key)}, f"audit front {args.name!r}")
    replaced = [k for k in policy.fronts.values() if k.name == key.name or k.id == key.id]
    for old in replaced:
        del policy.fronts[old.id]
    policy.fronts[key.id] = key
    policy.save(path)
    print(f"{'replaced' if replaced else 'added'} audit front {key.name!r} ({key.id}) in {path}")
    print(
        "the registry reads the policy at start: restart it to count this front's records (`toolreg audit verify`"
        " reads it on each run)"
    )
    return 0


async def cmd_trust_remove_front(args: argparse.Namespace) -> int:
    path = policy_path(args)
    policy = TrustPolicy.load(path)
    matches = [k for k in policy.fronts.values() if args.name in (k.name, k.id)]
    if not matches:
        return fail(f"no audit front named {args.name!r} in {path}")
    for key in matches:
        del policy.fronts[key.id]
    policy.save(path)
    print(f"removed audit front {args.name!r} from {path}: its records count as forged from now on")
    return 0


async def cmd_trust_remove_operator(args: argparse.Namespace) -> int:
    path = policy_path(args)
    policy = TrustPolicy.load(path)
    matches = [k for k in policy.operators.values() if args.name in (k.name, k.id)]
    if not matches:
        also = (
            f"; {args.name!r} is a trusted key: remove it with `toolreg trust remove {args.name}`"
            if any(args.name in (k.name, k.id) for k in policy.keys.values())
            else ""
        )
        return fail(f"no operator named {args.name!r} in {path}{also}")
    if policy.config_writes == "signed" and len(matches) == len(policy.operators):
        return fail(
            f"{args.name!r} is the last operator of {path}, and config writes must be signed: add another first"
            " (`toolreg trust add-operator NAME --public-key KEY`), or turn signing off (`toolreg trust config-writes"
            " any`)"
        )
    for key in matches:
        del policy.operators[key.id]
    policy.save(path)
    print(f"removed operator {args.name!r} from {path}: writes it signs are refused once the store restarts")
    print("the store reads the policy at start: restart `toolreg up` to apply")
    return 0


async def cmd_trust_config_writes(args: argparse.Namespace) -> int:
    path = policy_path(args)
    policy = _load_or_new(path)
    if args.mode == "signed" and not policy.operators:
        raise PolicyError(
            f"{path} has no operator key to sign writes with: add one first (`toolreg trust add-operator NAME"
            " --public-key KEY`)"
        )
    policy.config_writes = args.mode
    policy.save(path)
    if args.mode == "signed":
        print(
            f"{path}: the store takes writes of tool and tool-service items, and of the registry's records, only when"
            " an operator (or the registry) signed them"
        )
    else:
        print(f"{path}: the policy covers announcements only; the config queue is left to the broker's permissions")
    print("the store reads the policy at start: restart `toolreg up` to apply")
    return 0


async def cmd_trust_list(args: argparse.Namespace) -> int:
    policy = TrustPolicy.load(policy_path(args))
    keys = sorted(policy.keys.values(), key=lambda k: k.name)
    empty = f"no trusted keys in {policy_path(args)}: a registry using it refuses every announcement"
    chosen = render(args, keys, KEY_COLUMNS, name=lambda k: k.name, record=_key_record, empty=empty)
    if chosen in ("table", "wide") and not args.no_headers:
        if keys:
            print()
        for key in keys:
            print(f"{key.name} may announce {key.scope()}")
        _print_config_writes(policy)
        for front in sorted(policy.fronts.values(), key=lambda k: k.name):
            print(f"audit front {front.name} ({front.id}): its signed audit records are believed")
    return 0


def _print_config_writes(policy: TrustPolicy) -> None:
    operators = ", ".join(f"{k.name} ({k.id})" for k in sorted(policy.operators.values(), key=lambda k: k.name))
    if policy.config_writes == "signed":
        print(f"config writes of tools: only when signed by an operator: {operators}")
    else:
        print(
            "config writes of tools: not checked (the policy covers announcements only)"
            + (f"; operators listed: {operators}" if operators else "")
        )


def _workspaces(patterns: tuple[str, ...]) -> str:
    return "* (every workspace)" if patterns == ("*",) else ",".join(patterns)


TRUST_EXAMPLES = """examples:
  toolreg keygen keys/jokes.key
  toolreg trust add jokes-team --public-key keys/jokes.key.pub --services 'joke-*' --tools 'tell-*'
  toolreg trust add research --public-key keys/research.key.pub --services 'rs-*' --tools '*' --workspaces 'research-*'
  toolreg trust list --json
  toolreg keygen keys/alice.key && toolreg trust add-operator alice --public-key keys/alice.key.pub
  toolreg trust remove-operator bob
  toolreg trust config-writes signed          # then: toolreg config put tool/X --signing-key keys/alice.key
  toolreg keygen keys/front-eu.key && toolreg trust add-front front-eu --public-key keys/front-eu.key.pub
  toolreg up --trust-policy trust.json
  toolreg serve toolservice_base.examples.joke:JokeService --signing-key keys/jokes.key
"""


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    keygen = sub.add_parser(
        "keygen",
        parents=[common],
        help="write an Ed25519 key pair for signing announcements",
        description="Write PATH (private key, PEM, mode 0600) and PATH.pub (public key, base64).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=TRUST_EXAMPLES,
    )
    keygen.add_argument("path", metavar="PATH", help="where to write the private key, e.g. keys/joke-service.key")
    keygen.set_defaults(handler=cmd_keygen)
    _add_trust_command(sub, common)


def _add_trust_command(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    """`toolreg trust add|remove|list`: edit the trust policy file."""
    policy = Parser(add_help=False)
    policy.add_argument(
        "--policy",
        default=None,
        help=f"the policy file (env {RegistrySettings.env('trust_policy')}, default ./trust.json)",
    )
    trust = sub.add_parser(
        "trust",
        parents=[common],
        help="edit the registry's trust policy",
        description=(
            "Edit the trust policy: which public keys may announce which service ids and tool names, into which"
            " workspaces."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=TRUST_EXAMPLES,
    )
    trust_sub = subcommands(trust, dest="trust_command", metavar="ACTION", required=True)
    _add_key_commands(trust_sub, [common, policy])
    _add_config_writes_commands(trust_sub, [common, policy])


def _add_key_commands(trust_sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """`toolreg trust add|remove|list`: the announcing keys, and what each may claim."""
    add = trust_sub.add_parser(
        "add",
        parents=parents,
        help="trust a public key for some services and tools",
        description=(
            "Add (or replace, by name) a trusted key with the service ids, tool names and workspaces it may claim."
        ),
    )
    add.add_argument("name", metavar="NAME", help="a name for the key, e.g. jokes-team")
    add.add_argument("--public-key", required=True, help="base64 public key, or a .pub file from `toolreg keygen`")
    add.add_argument(
        "--services", nargs="+", required=True, metavar="PATTERN", help="service ids it may announce (shell patterns)"
    )
    add.add_argument(
        "--tools", nargs="+", required=True, metavar="PATTERN", help="tool names it may announce (shell patterns)"
    )
    add.add_argument(
        "--workspaces",
        nargs="+",
        default=None,
        metavar="PATTERN",
        help="workspaces it may announce into (shell patterns; default: every workspace)",
    )
    add.set_defaults(handler=cmd_trust_add)
    remove = trust_sub.add_parser(
        "remove", parents=parents, help="stop trusting a key", description="Remove a key by name or id."
    )
    remove.add_argument("name", metavar="NAME")
    remove.set_defaults(handler=cmd_trust_remove)
    listing = trust_sub.add_parser(
        "list",
        parents=parents,
        help="list trusted keys and what each may announce",
        description="List the trusted keys: the services, tools and workspaces each may announce.",
    )
    listing.add_argument("--json", action="store_true", help="print a JSON list of objects instead of a table")
    add_output_options(listing, wide="each PUBLIC KEY", name="key name")
    listing.set_defaults(handler=cmd_trust_list)


def _add_config_writes_commands(trust_sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """`toolreg trust add-operator|remove-operator|config-writes`: whether, and by whom, guarded writes on the config
    queue are signed."""
    operator = trust_sub.add_parser(
        "add-operator",
        parents=parents,
        help="trust a public key to sign writes of tools through the config queue",
        description=(
            "Add (or replace, by name) an operator key: with `config-writes signed`, the store takes writes of tool"
            " and tool-service items only when one of these signed them (toolreg config put --signing-key)."
        ),
    )
    operator.add_argument("name", metavar="NAME", help="a name for the operator, e.g. alice")
    operator.add_argument("--public-key", required=True, help="base64 public key, or a .pub file from `toolreg keygen`")
    operator.set_defaults(handler=cmd_trust_add_operator)
    dropped = trust_sub.add_parser(
        "remove-operator",
        parents=parents,
        help="stop trusting an operator key to sign writes through the config queue",
        description="Remove an operator key by name or id: the store refuses writes it signs once restarted.",
    )
    dropped.add_argument("name", metavar="NAME")
    dropped.set_defaults(handler=cmd_trust_remove_operator)
    writes = trust_sub.add_parser(
        "config-writes",
        parents=parents,
        help="whether the policy covers the config queue: signed or any",
        description=(
            "signed: the store takes writes of tool and tool-service items only when an operator key of the policy"
            " (or the registry) signed them. any (the default): the policy covers announcements only."
        ),
    )
    writes.add_argument("mode", choices=CONFIG_WRITES)
    writes.set_defaults(handler=cmd_trust_config_writes)
    front = trust_sub.add_parser(
        "add-front",
        parents=parents,
        help="trust an MCP front's public key to sign audit records",
        description=(
            "Add (or replace, by name) an audit front: the registry's page counts, and `toolreg audit verify` believes,"
            " only audit records signed by one of these (the front's key: toolreg mcp --audit-key)."
        ),
    )
    front.add_argument("name", metavar="NAME", help="a name for the front, e.g. front-eu")
    front.add_argument("--public-key", required=True, help="base64 public key, or a .pub file from `toolreg keygen`")
    front.set_defaults(handler=cmd_trust_add_front)
    unfront = trust_sub.add_parser(
        "remove-front",
        parents=parents,
        help="stop believing an MCP front's audit records",
        description="Remove an audit front by name or id: its records count as forged from then on.",
    )
    unfront.add_argument("name", metavar="NAME")
    unfront.set_defaults(handler=cmd_trust_remove_front)

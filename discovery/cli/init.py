"""`toolreg init`: prepare a topicspace on an Apache Pulsar cluster, as deploy/pulsar-init.sh does.

The embedded broker needs no preparing (pulsar-lite makes topics as they are
used); an Apache Pulsar cluster does: `toolreg up` on a topicspace without
its namespaces stops at the first one. This makes the tenant, its namespaces
and their policies, and grants roles what toolreg's processes need
(`discovery.broker.topicspace`), through the cluster's admin API. Safe to
run again.
"""

from __future__ import annotations

import argparse
from typing import Any

from discovery.broker.admin import PulsarAdmin, admin_url_for
from discovery.broker.settings import AdminSettings
from discovery.broker.topicspace import ALL_PROCESSES, DEFAULT_AUDIT_RETENTION, grant_service, prepare
from toolservice_base.errors import SettingsError
from toolservice_base.settings import Settings

from .common import CommandError, settings_of, waiting_for

ADMIN_URL_ENV = AdminSettings.env("admin_url")
ADMIN_TOKEN_FILE_ENV = AdminSettings.env("admin_token")
CLUSTER_ENV = AdminSettings.env("cluster")
AUDIT_RETENTION_ENV = AdminSettings.env("audit_retention")


def add_command(sub: Any, common: argparse.ArgumentParser) -> None:
    init = sub.add_parser(
        "init",
        parents=[common],
        help="prepare a topicspace on an Apache Pulsar cluster (tenant, namespaces, grants); safe to run again",
        description=(
            "Make the tenant of the topicspace (--topicspace, env TOOLREG_TOPICSPACE, default tg) and the namespaces"
            " toolreg uses in it (request, response, notify, discovery, state kept without limit, and audit) through"
            " the cluster's admin API, and grant each kind of process's role what that kind needs there (--store-role,"
            " --service-role, --agent-role, --operator-role; the config store's subscriptions only for the store's"
            " role). What exists is kept; the policies and grants are set on every run. The embedded broker needs"
            " none of this."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "examples:\n"
            "  PULSAR_URL=pulsar://broker:6650 toolreg init                       # topicspace tg, admin API on :8080\n"
            "  toolreg init --topicspace research --admin-url http://broker:8080 \\\n"
            "      --store-role toolreg-store --service-role toolreg-service --agent-role agent --operator-role ops\n"
            f"  {ADMIN_TOKEN_FILE_ENV}=admin.token toolreg init --topicspace research   # with authentication on\n"
        ),
    )
    init.add_argument(
        "--admin-url",
        default=None,
        metavar="URL",
        help=(
            f"the cluster's admin API (env {ADMIN_URL_ENV}; default: port 8080 of the PULSAR_URL host). A superuser's"
            f" token, with authentication on, is read from {ADMIN_TOKEN_FILE_ENV} (else PULSAR_AUTH_TOKEN's is used)"
        ),
    )
    _add_role_options(init)
    init.add_argument(
        "--per-service",
        action="store_true",
        help=(
            "grant the --service-role roles no namespace-wide consume on request nor produce on response (any tool"
            " service could otherwise read and answer every other's calls, and the config store's): grant each service"
            " its own queues with `toolreg grant service ID --role R`"
        ),
    )
    init.add_argument(
        "--audit-retention",
        default=None,
        metavar="TIME",
        help=(
            f"how long the audit namespace keeps the MCP front's audit records: 30d, 12h, 2w, 1y, or -1 for no limit"
            f" (env {AUDIT_RETENTION_ENV}; default {DEFAULT_AUDIT_RETENTION})"
        ),
    )
    init.add_argument(
        "--cluster",
        default=None,
        help=f"the cluster a new tenant may use (env {CLUSTER_ENV}; default: the cluster's own, if it has one)",
    )
    init.set_defaults(handler=cmd_init)


def _add_role_options(init: argparse.ArgumentParser) -> None:
    for kind, who in KINDS.items():
        init.add_argument(
            f"--{kind}-role",
            action="append",
            default=[],
            metavar="ROLE",
            help=f"a role (a token's subject) {who} run as; repeatable",
        )
    init.add_argument(
        "--role",
        action="append",
        default=[],
        metavar="ROLE",
        help="a role every kind of process runs as: it may produce and consume everywhere (no least privilege)",
    )


def admin_url(args: argparse.Namespace, settings: Settings, admin: AdminSettings) -> str:
    """--admin-url, PULSAR_ADMIN_URL, or the admin port of the PULSAR_URL broker; else one line saying what to give."""
    if args.admin_url or admin.admin_url:
        return str(args.admin_url or admin.admin_url)
    if settings.pulsar_url:
        return admin_url_for(settings.pulsar_url)
    raise CommandError(
        "toolreg init prepares a topicspace on an Apache Pulsar cluster: give its admin API with --admin-url (or"
        f" {ADMIN_URL_ENV}), or its broker with PULSAR_URL; the embedded broker of `toolreg up` needs no init"
    )


KINDS = {
    "store": "the config store's replicas and the registry (toolreg up, toolreg registry)",
    "service": "tool services (toolreg serve, toolreg announce)",
    "agent": "agents and MCP fronts (a ToolSet, toolreg mcp, toolreg call)",
    "operator": "operators (toolreg config, tools, replicas, store export)",
}
"""The kinds of process `toolreg init` grants a role to (`topicspace.GRANTS`), as deploy/pulsar-init.sh's
TOOLREG_<KIND>_ROLE."""


def roles_of(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(role, kind) for every role named, by kind; --role is every kind at once."""
    named = [(role, kind) for kind in KINDS for role in getattr(args, f"{kind}_role")]
    return [*named, *((role, ALL_PROCESSES) for role in args.role)]


def _settings(args: argparse.Namespace) -> tuple[Settings, AdminSettings]:
    """The broker's settings and the admin API's; a value either cannot use is a `CommandError`."""
    try:
        return settings_of(args), AdminSettings.from_env()
    except SettingsError as exc:
        raise CommandError(str(exc)) from None


async def cmd_init(args: argparse.Namespace) -> int:
    settings, admin_settings = _settings(args)
    url = admin_url(args, settings, admin_settings)
    token = admin_settings.admin_token or settings.auth_token
    async with PulsarAdmin(url, token) as admin:
        with waiting_for(f"the admin API at {url}"):
            said = await prepare(
                admin,
                settings.topicspace,
                cluster=args.cluster or admin_settings.cluster,
                roles=roles_of(args),
                audit_retention=args.audit_retention or admin_settings.audit_retention,
                per_service=args.per_service,
            )
    for line in said:
        print(line)
    print(f"topicspace {settings.topicspace} ready on {url}", flush=True)
    return 0


def add_grant_command(sub: Any, common: argparse.ArgumentParser) -> None:
    grant = sub.add_parser(
        "grant",
        parents=[common],
        help="let a role serve exactly one tool service: its own queues, through topic-level grants",
        description=(
            "Grant ROLE what one tool service needs and nothing of any other's: consume on its request queue (and"
            " its cancel queue), produce on its response queue, and announce on the discovery namespace. With"
            " `toolreg init --per-service`, a service role may then neither read another service's calls (or the"
            " config store's) nor answer them. Safe to run again."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "examples:\n"
            "  toolreg grant service joke-service --role joke-team\n"
            "  toolreg grant service maps --role maps --request-queue non-persistent://tg/request/maps-v2\n"
        ),
    )
    grant.add_argument("what", choices=["service"], help="what the role is granted to serve")
    grant.add_argument("service_id", metavar="SERVICE_ID", help="the service's id (its descriptor's `id`)")
    grant.add_argument("--role", required=True, help="the role (a token's subject) the service runs as")
    grant.add_argument("--request-queue", default=None, help="its request queue (default: request/SERVICE_ID)")
    grant.add_argument("--response-queue", default=None, help="its response queue (default: response/SERVICE_ID)")
    grant.add_argument("--admin-url", default=None, metavar="URL", help="the cluster's admin API (as toolreg init)")
    grant.set_defaults(handler=cmd_grant)


async def cmd_grant(args: argparse.Namespace) -> int:
    settings, admin_settings = _settings(args)
    url = admin_url(args, settings, admin_settings)
    async with PulsarAdmin(url, admin_settings.admin_token or settings.auth_token) as admin:
        with waiting_for(f"the admin API at {url}"):
            said = await grant_service(
                admin,
                settings.topicspace,
                args.service_id,
                args.role,
                request_queue=args.request_queue,
                response_queue=args.response_queue,
            )
    for line in said:
        print(line)
    return 0

"""What `toolreg init` reads to prepare a topicspace through Apache Pulsar's admin API (deploy/pulsar-init.sh reads
the same names). Its flags win (`discovery.cli.init`)."""

from __future__ import annotations

from dataclasses import dataclass

from toolservice_base.variables import FromEnv, file_contents, setting, text

from .topicspace import DEFAULT_AUDIT_RETENTION


@dataclass(frozen=True)
class AdminSettings(FromEnv):
    """The admin API's settings; None where `toolreg init` decides (see each)."""

    admin_url: str | None = setting(
        "PULSAR_ADMIN_URL", text, None, "Apache Pulsar's admin API; None: port 8080 of the PULSAR_URL host"
    )
    admin_token: str | None = setting(
        "PULSAR_ADMIN_TOKEN_FILE",
        file_contents(),
        None,
        "a file holding a superuser's token for the admin API; None: PULSAR_AUTH_TOKEN's",
    )
    cluster: str | None = setting(
        "PULSAR_CLUSTER", text, None, "the cluster a tenant `toolreg init` makes may use; None: the cluster's own"
    )
    audit_retention: str = setting(
        "TOOLREG_AUDIT_RETENTION", text, DEFAULT_AUDIT_RETENTION, "how long the audit namespace keeps records (`30d`)"
    )

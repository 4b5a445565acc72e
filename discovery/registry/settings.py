"""What a registry (`toolreg up`, `toolreg registry`) reads from the environment: its trust policy and its bounds on
what announcements may claim. Its flags win (`discovery.cli.registry`); the rest of its tuning is
`RegistryOptions`, whose defaults these share."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toolservice_base.variables import FromEnv, flag, names, number, path, setting, whole

from .options import RegistryOptions
from .validation import DEFAULT_MAX_SKEW


@dataclass(frozen=True)
class RegistrySettings(FromEnv):
    """The registry's settings from the environment."""

    trust_policy: Path | None = setting(
        "TOOLREG_TRUST_POLICY", path, None, "the registry's trust policy file (`toolreg trust` edits it); None: none"
    )
    allowed_namespaces: tuple[str, ...] = setting(
        "TOOLREG_ALLOWED_NAMESPACES",
        names,
        (),
        "comma-separated `tenant/namespace`s announced queues may live in; none: the topicspace's own",
    )
    max_clock_skew: float = setting(
        "TOOLREG_MAX_CLOCK_SKEW",
        number("seconds"),
        DEFAULT_MAX_SKEW,
        "seconds an announcement's clock may be ahead of the registry's",
    )
    max_instances: int = setting(
        "TOOLREG_MAX_INSTANCES",
        whole(" of instances"),
        RegistryOptions.max_instances,
        "instance leases the registry holds at most, all services together",
    )
    pin_definitions: bool = setting(
        "TOOLREG_PIN_DEFINITIONS", flag, False, "pin each announced tool's definition (`--pin-definitions`)"
    )

"""How one registry is tuned: sweeps, coalescing, self-preservation, caps, trust.

The defaults suit production and tests alike; `toolreg up` and `toolreg
registry` set the trust and bad-input ones from their flags.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from toolservice_base.schemas import check_namespace
from toolservice_base.search.settings import DEFAULT_EMBEDDER

from .validation import DEFAULT_MAX_SKEW, TrustCheck

AutoApprove = Literal["same-key-higher-version"]
AUTO_APPROVE: tuple[AutoApprove, ...] = ("same-key-higher-version",)


@dataclass
class RegistryOptions:
    """Tuning of one registry. The defaults suit production and tests alike."""

    sweep_interval: float = 0.25
    """Seconds between lease sweeps (at most 1): how late past its ttl a dead instance goes. A tick at which no lease
    can run out is skipped (`Expiry.due_at`); the registry sweeps once a second all the same."""
    self_preservation_share: float = 0.5
    """Hold the deletions when more than this share of all leases expire in one sweep..."""
    self_preservation_min: int = 3
    """...and at least this many: so one service with one or two instances dying goes normally."""
    max_rejections: int = 200
    allowed_namespaces: tuple[str, ...] | None = None
    """`tenant/namespace` a service's queues may live in; None: the topicspace's `request` and `response`."""
    max_clock_skew: float = DEFAULT_MAX_SKEW
    """Seconds `sent-at` may be ahead of the registry's clock; also the longest a message may be in flight."""
    max_instances: int = 10_000
    """Instance leases held at once, all services together: a flood of fresh instance ids stops here."""
    max_instances_per_service: int = 256
    """Instances of one service at once: one noisy service cannot use up `max_instances`."""
    probe_interval: float = 1.0
    """At most one probe per instance per this many seconds."""
    max_probes_per_second: float = 50.0
    store_timeout: float = 5.0
    max_retry_delay: float = 2.0
    """Longest wait between retries of a store write that failed (broker or store down)."""
    trust: TrustCheck | None = None
    """A trust policy (`discovery.registry.trust.TrustPolicy`): accept only announcements signed by a key
    allowed the service and tools they claim. None accepts every valid announcement."""
    pin_definitions: bool = False
    """Pin each announced tool's definition when first accepted; hold later changes for an operator (`pins`)."""
    follow_audit: bool = False
    """Read the MCP fronts' audit topic for the page's calls per caller (`callers.CallerBook`)."""
    audit_fronts: Mapping[str, Ed25519PublicKey] = field(default_factory=dict)
    """The fronts whose signed audit records are counted, by key id (the trust policy's `"audit-fronts"`); every
    other record is counted apart as unverified, never as a caller."""
    auto_approve: AutoApprove | None = None
    """With `pin_definitions`: `same-key-higher-version` approves a held definition signed by the key that signed
    the pinned one, under a higher service version. None: every change waits for an operator."""

    search_embedder: str = DEFAULT_EMBEDDER
    """What the page's search embeds tools and queries with (`SearchSettings.embedder`)."""
    search_embedder_key: str | None = None

    def __post_init__(self) -> None:
        if not 0 < self.sweep_interval <= 1:
            raise ValueError("sweep_interval must be in (0, 1] seconds")
        if not 0 < self.self_preservation_share <= 1:
            raise ValueError("self_preservation_share must be in (0, 1]")
        if self.self_preservation_min < 1 or self.max_rejections < 1:
            raise ValueError("self_preservation_min and max_rejections must be at least 1")
        if not self.max_clock_skew > 0:
            raise ValueError("max_clock_skew must be positive")
        if self.max_instances < 1 or not 1 <= self.max_instances_per_service <= self.max_instances:
            raise ValueError("max_instances_per_service must be at least 1 and at most max_instances")
        if self.auto_approve is not None and self.auto_approve not in AUTO_APPROVE:
            raise ValueError(f"auto_approve must be one of: {', '.join(AUTO_APPROVE)}")
        if self.allowed_namespaces is None:
            return
        self.allowed_namespaces = tuple(check_namespace(namespace) for namespace in self.allowed_namespaces)
        if not self.allowed_namespaces:
            raise ValueError("allowed_namespaces must name at least one tenant/namespace")

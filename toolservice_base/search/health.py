"""How a tool's health moves it in search results: the rules and their weights.

What is known of a tool's health, and by whom (`Health`):

- `status`: the registry's word for it (`toolreg tools` STATUS): `live`, `configured`, `grace`, `held` (its lease
  ran out, self-preservation keeps it), `unavailable` (a static tool whose service is missing or invalid), ...
  Known to an agent that asks the registry's query API, and to the registry page.
- `failure_share`: the share of its recent calls that failed, from 0 to 1; `None` when too few calls were seen to
  say. An agent knows its own calls' outcomes at no cost (`agent_bridge`'s `CallOutcomes`); the registry knows
  calls/s and errors/s per tool from the services' heartbeats, over every caller.

The rules, in order:

1. `EXCLUDED` statuses (`held`, `unavailable`) are never returned: the tool's service is gone or was never
   there, and a call would only time out.
2. A tool failing most of its calls ranks below a healthy one that matches as well: its text score is
   multiplied by `1 - FAILING_WEIGHT * failure_share` once the share passes `HEALTHY_SHARE` (so a tool failing
   every call keeps a fifth of its score: it still shows when nothing else matches, since the model may have
   no other way). Below `HEALTHY_SHARE` (noise: a bad argument the service refused, a retry) the score stands.
3. Unknown health (no status, no calls) changes nothing: a new tool is not punished for being new.

Latency (p95) is not used: a slow tool that answers is still the right tool.
"""

from __future__ import annotations

from dataclasses import dataclass

EXCLUDED = frozenset({"held", "unavailable"})
"""Registry statuses whose tools are never returned."""
HEALTHY_SHARE = 0.1
"""A failure share up to this is taken as noise: no penalty."""
FAILING_WEIGHT = 0.8
"""How much of its score a tool failing every call loses; a share `f` above `HEALTHY_SHARE` keeps `1 - 0.8 f`."""


@dataclass(frozen=True)
class Health:
    """What is known of one tool's health; `None` fields are not known."""

    status: str | None = None
    failure_share: float | None = None

    @property
    def excluded(self) -> bool:
        return self.status in EXCLUDED

    def weight(self) -> float:
        """The factor a text score is multiplied by (rules 2 and 3); 0 for an excluded tool (rule 1)."""
        if self.excluded:
            return 0.0
        share = self.failure_share
        if share is None or share <= HEALTHY_SHARE:
            return 1.0
        return 1.0 - FAILING_WEIGHT * min(1.0, share)


UNKNOWN = Health()


def combine(own: Health | None, reported: Health | None) -> Health:
    """The agent's own outcomes and the registry's report as one: the registry's status; the agent's own failure
    share when it has one (it saw those calls itself), else the registry's."""
    own = own or UNKNOWN
    reported = reported or UNKNOWN
    share = own.failure_share if own.failure_share is not None else reported.failure_share
    return Health(status=reported.status or own.status, failure_share=share)


def share_of(calls_per_s: float | None, errors_per_s: float | None) -> float | None:
    """A failure share from rates (the registry's errors/s over calls/s); None when no calls were counted."""
    if not calls_per_s or errors_per_s is None or calls_per_s <= 0:
        return None
    return max(0.0, min(1.0, errors_per_s / calls_per_s))

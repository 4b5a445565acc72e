"""The kind of process each `toolreg` command runs as, and the line a command refused for its role says.

With authorization on, each kind of process has a role of its own, granted
what the kind needs (`topicspace.GRANTS`, what `toolreg init` grants): the
store (`toolreg up`, `toolreg registry`), tool services, agents, operators.
The broker's refusal names only a namespace and a role; a newcomer who ran
`toolreg up` with the service's token was told to grant the service's role
produce and consume on `state`, which would give it the store's rights. A
command refused here says instead which kind it runs as, what that kind's role
is granted on the namespace, and to run it with that kind's token: it never
suggests widening the grant of the role it was given, which may be another
kind's.
"""

from __future__ import annotations

from toolservice_base.errors import NotAuthorized

COMMAND_KINDS = {
    "up": "store",
    "registry": "store",
    "group-key": "store",
    "serve": "service",
    "announce": "service",
    "call": "agent",
    "mcp": "agent",
    "config": "operator",
    "tools": "operator",
    "rejections": "operator",
    "conflicts": "operator",
    "release": "operator",
    "pending": "operator",
    "approve": "operator",
    "reject": "operator",
    "trust": "operator",
    "store": "operator",
    "replicas": "operator",
}
"""The kind of process each command that talks to the broker runs as (`toolreg init`'s --<kind>-role)."""


def granted(kind: str, namespace: str) -> str:
    """What a role of `kind` is granted on `namespace` (`tenant/name`), in words, from `topicspace.GRANTS`."""
    from discovery.broker.topicspace import GRANTS  # the one table of grants; loaded only for this line

    actions = GRANTS.get(kind, {}).get(namespace.rpartition("/")[2], ())
    return " and ".join(actions) if actions else "nothing"


def role_refusal(command: str, error: NotAuthorized) -> str | None:
    """The line for a command refused for its role (None for a command of no kind: the error says it as it is)."""
    kind = COMMAND_KINDS.get(command)
    if kind is None:
        return None
    namespace, role = error.namespace, error.role or "(the token names none)"
    said = str(error)
    cause = said[said.find("(") + 1 : said.find("):")] if "(" in said and "):" in said else "AuthorizationError"
    tenant = namespace.partition("/")[0]
    rights = granted(kind, namespace)
    return (
        f"`toolreg {command}` runs as the {kind}'s role, which is granted {rights} on {namespace}; the broker"
        f" refused role {role} there ({cause}): run it with a token of the {kind}'s role (PULSAR_AUTH_TOKEN; a role"
        f" gets the {kind}'s grants, and only those, with `toolreg init --topicspace {tenant} --{kind}-role ROLE`, one"
        " role per kind of process)"
    )

"""Environment variables, each declared once: its name, how its text is read, its default and what it means.

Every package's settings class (`toolservice_base.settings.Settings` for reaching the broker,
`discovery.mcp.settings.McpSettings` for the MCP front, ...) is a frozen dataclass whose fields are
declared with `setting(name, parse, default, help)`: the field is the value, the declaration is the
variable. `FromEnv.from_env(environ)` reads them all from a mapping (`os.environ` unless a test passes
its own), so a variable is spelled in one place, and its help cannot be left out; docs/operators.md
describes each one (tests/test_settings.py checks every declaration against its table).

A small table rather than pydantic-settings: the product's messages for a value it cannot use are one
line naming the variable and what it takes (`TOOLREG_METRICS_PORT='nine' is not a whole number (a
port)`), blank means unset, flags are `1`, `true` or `yes` and lists are comma-separated; pydantic-settings
reports a multi-line validation error, parses lists as JSON and reads booleans its own way, so each field
would need its own validator to keep them, behind a new dependency.

A parser takes the variable's name and its (stripped, non-blank) text, and raises `SettingsError` (or, for
the variables that say how to reach the broker, `NoBrokerError`) in one line naming the variable.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Self, TypeVar

from .errors import SettingsError, ToolDiscoveryError

T = TypeVar("T")
Parse = Callable[[str, str], T]
"""(variable name, its text) -> its value; raises a `ToolDiscoveryError` in one line naming the variable."""

_VARIABLE = "variable"
DECLARED: dict[str, Variable[Any]] = {}
"""Every variable declared so far, by name: what the operators' guide is checked against."""


@dataclass(frozen=True)
class Variable(Generic[T]):
    """One environment variable: read as `parse` says, `default` when unset or blank."""

    name: str
    parse: Parse[T]
    default: T
    help: str

    def __post_init__(self) -> None:
        if not self.help.strip():
            raise ValueError(f"{self.name} is declared without its help")
        DECLARED[self.name] = self

    def read(self, environ: Mapping[str, str] | None = None) -> T:
        text = (os.environ if environ is None else environ).get(self.name, "").strip()
        return self.parse(self.name, text) if text else self.default


def setting(name: str, parse: Parse[T], default: T, help: str) -> T:
    """A settings field that is the variable `name` (typed as its value, as `dataclasses.field` is)."""
    variable = Variable(name, parse, default, help)
    return dataclasses.field(default=default, metadata={_VARIABLE: variable})


def variables(cls: type) -> dict[str, Variable[Any]]:
    """The variables a settings class declares, by field name."""
    return {f.name: f.metadata[_VARIABLE] for f in dataclasses.fields(cls) if _VARIABLE in f.metadata}


def read(cls: type, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The value of every variable `cls` declares, by field name, read from `environ` (`os.environ` when None)."""
    return {name: variable.read(environ) for name, variable in variables(cls).items()}


class FromEnv:
    """What every settings class does: read its variables from the environment, and name them."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Every variable this class declares, read from `environ` (`os.environ` when None) and checked."""
        build: Callable[..., Self] = cls
        return build(**read(cls, environ))

    @classmethod
    def variable(cls, field: str) -> Variable[Any]:
        """The variable behind `field`: to read it alone, where the rest of its class is none of the reader's
        business."""
        return variables(cls)[field]

    @classmethod
    def env(cls, field: str) -> str:
        """The name of the variable behind `field`: for help texts and messages that point at it."""
        return cls.variable(field).name


# --- parsers -------------------------------------------------------------------------------


def text(name: str, value: str) -> str:
    return value


def path(name: str, value: str) -> Path:
    return Path(value)


def flag(name: str, value: str) -> bool:
    """`1`, `true` or `yes` (any case) is on; anything else is off."""
    return value.lower() in ("1", "true", "yes")


def names(name: str, value: str) -> tuple[str, ...]:
    """Comma-separated names, each stripped; empty items left out."""
    return tuple(item.strip() for item in value.split(",") if item.strip())


def whole(what: str = "") -> Parse[int]:
    """A whole number; `what` ends the message for one that is not (`" of instances"`)."""

    def parse(name: str, value: str) -> int:
        try:
            return int(value)
        except ValueError:
            raise SettingsError(f"{name}={value!r} is not a whole number{what}") from None

    return parse


def number(what: str, low: float = -math.inf, high: float = math.inf) -> Parse[float]:
    """A number of `what` (`seconds`) from `low` to `high`."""

    def parse(name: str, value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise SettingsError(f"{name}={value!r} is not a number of {what}") from None
        if math.isnan(number) and math.isinf(low) and math.isinf(high):
            raise SettingsError(f"{name}={value!r} is not a number of {what}")
        if not low <= number <= high:  # NaN fails this too
            raise SettingsError(f"{name}={value!r} is out of range: use {low:g} to {high:g} {what}")
        return number

    return parse


def file_contents(error: type[ToolDiscoveryError] = SettingsError) -> Parse[str | None]:
    """The stripped contents of the file the variable names (a token's); None for an empty file."""

    def parse(name: str, value: str) -> str | None:
        try:
            return Path(value).read_text().strip() or None
        except OSError as exc:
            raise error(f"cannot read {name} {value!r}: {exc.strerror}; fix the path or unset it") from None

    return parse

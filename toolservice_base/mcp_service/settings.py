"""How much one message of an HTTP MCP server behind `toolreg announce --mcp-url` may hold: the sidecar's own
setting."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SettingsError
from ..transport.base import MESSAGE_LIMIT
from ..variables import FromEnv, setting, whole


@dataclass(frozen=True)
class SidecarSettings(FromEnv):
    """What the MCP sidecar (`McpToolService`) reads from the environment."""

    max_message: int = setting(
        "TOOLREG_MCP_MAX_MESSAGE",
        whole(" of bytes"),
        MESSAGE_LIMIT,
        "bytes one message of an HTTP MCP server may hold; the default is the broker's message limit (5 MiB)",
    )

    def __post_init__(self) -> None:
        if self.max_message < 1024:
            raise SettingsError(f"{self.env('max_message')}={self.max_message!r}: give at least 1024 bytes")

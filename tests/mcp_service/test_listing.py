"""What an MCP server lists, as one service's descriptors: names kept or mapped, service ids, limits (no broker)."""

from __future__ import annotations

import pytest

from toolservice_base.errors import McpServerError
from toolservice_base.mcp_service import Selection, service_id_of, tool_name
from toolservice_base.mcp_service.listing import offer_of
from toolservice_base.topics import DEFAULT as TOPICS


def _tool(name: str, **more: object) -> dict[str, object]:
    return {"name": name, "description": f"does {name}", "inputSchema": {"type": "object"}, **more}


def test_a_valid_name_is_kept_and_any_other_is_mapped_within_128_characters() -> None:
    assert tool_name("get-weather.v2_x") == "get-weather.v2_x"
    assert tool_name("github/create issue") == "github_create_issue"
    assert tool_name("") == "_"
    long = tool_name("é" * 300)
    assert len(long) == 128 and long.startswith("_" * 100) and long != tool_name("ü" * 300)


def test_the_service_id_comes_from_the_servers_name_or_is_asked_for() -> None:
    assert service_id_of("mcp-servers/everything") == "mcp-servers-everything"
    assert service_id_of("Echo Server with logging and progress updates").startswith("echo-server-with-logging")
    with pytest.raises(McpServerError, match="gives no service id; name one"):
        service_id_of("/// ")
    with pytest.raises(McpServerError):
        service_id_of(None)


def test_an_offer_carries_what_mcp_says_of_each_tool_and_the_name_each_is_called_by() -> None:
    hints = {"readOnlyHint": True, "openWorldHint": False}
    offer = offer_of(
        [_tool("files/read", annotations=hints, outputSchema={"type": "object"}), _tool("echo", title="Echo")],
        "files",
        TOPICS,
    )
    read, echo = offer.tools
    assert read.name == "files_read" and read.title == "files/read" and read.annotations is not None
    assert read.annotations.to_wire() == hints and read.output_schema == {"type": "object"}
    assert echo.title == "Echo" and offer.mcp_names == {"files_read": "files/read", "echo": "echo"}
    assert offer.service.request_queue.endswith("/request/files")


def test_only_and_exclude_choose_by_mcp_name() -> None:
    listed = [_tool("get-a"), _tool("get-b"), _tool("set-a")]
    chosen = offer_of(listed, "s", TOPICS, Selection(include=("get-*",), exclude=("*-b",)))
    assert [t.name for t in chosen.tools] == ["get-a"] and chosen.listed == 3
    with pytest.raises(McpServerError, match="choose none of them"):
        offer_of(listed, "s", TOPICS, Selection(include=("nothing",)))


def test_a_long_description_is_cut_not_refused() -> None:
    (tool,) = offer_of([{"name": "t", "description": "x" * 10_000}], "s", TOPICS).tools
    assert len(tool.description) == 4096 and tool.description.endswith("\u2026")

"""The registry's `list` answer in pages, so a listing never has to fit every tool in one message."""

from __future__ import annotations

from toolservice_base.schemas import PAGE_BYTES

from .protocol import ToolStatus


def page_of(
    tools: list[ToolStatus], after: str | None, limit: int, budget: int = PAGE_BYTES
) -> tuple[list[ToolStatus], bool]:
    """Tools named after `after` (`tools` is in name order), up to `limit` and about `budget` bytes; and whether more
    follow.

    A page holds at least one tool if any is left: one status is far below
    any message limit, so a listing always makes progress.
    """
    page: list[ToolStatus] = []
    used = 0
    for tool in tools:
        if after is not None and tool.name <= after:
            continue
        cost = len(tool.model_dump_json())
        if page and (len(page) >= limit or used + cost > budget):
            return page, True
        page.append(tool)
        used += cost
    return page, False

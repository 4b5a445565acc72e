"""An echo tool service under any id, run as its own process: `python -m bench.serve --id ID [--ttl S]`.

The benchmarks need many distinct services (one per process, so each can be
SIGTERMed or kill -9ed alone and measured on its own). The product's
`toolreg serve` takes a class; this builds the class for an id and runs it the
same way (`DynamicToolService.run()`: SIGTERM withdraws, then stops).
"""

from __future__ import annotations

import argparse
from typing import Any

from toolservice_base import DynamicToolService, configure_logging

from .common import run


def echo_class(service_id: str, tool: str | None = None) -> type[DynamicToolService]:
    """An echo service whose id and one tool are both `service_id` (or `tool`)."""

    class Echo(DynamicToolService):
        descriptor = {"id": service_id}
        tools = [
            {
                "name": tool or service_id,
                "description": "Return the text it is given",
                "arguments": [{"name": "text", "type": "string", "description": "The text to return"}],
            }
        ]
        version = "bench"

        async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
            return str(arguments.get("text", ""))

    Echo.__name__ = Echo.__qualname__ = f"Echo_{service_id.replace('-', '_')}"
    return Echo


async def main(service_id: str, ttl: float, announce: bool) -> None:
    service = echo_class(service_id)(ttl=ttl, announce=announce)
    await service.run()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--id", required=True)
    parser.add_argument("--ttl", type=float, default=15.0)
    parser.add_argument("--no-announce", action="store_true")
    args = parser.parse_args()
    configure_logging("info", json=True)
    run(main(args.id, args.ttl, not args.no_announce))

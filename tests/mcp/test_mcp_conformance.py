"""The official MCP conformance suite (`@modelcontextprotocol/conformance` 0.1.16, on Node.js 22) against
`toolreg mcp --http`, with the tools its scenarios call served two ways on the bus:

- by a `DynamicToolService` (`support.conformance.service`), and
- by an MCP server written with the official SDK (`support.conformance.sdk_server`), brought onto the bus by the
  product's sidecar, `toolreg announce --mcp -- python sdk_server.py`, as an operator runs it.

Every tools-and-transport scenario passes both ways, on pulsar-lite and on Apache Pulsar (`server-sse-polling`
with the two SHOULD warnings the baseline explains); the scenarios out of scope fail as
`conformance-baseline.yml` says, each with its reason (the suite itself fails a run on any other
failure, and on a listed scenario that passes). The suite and its Node.js are installed once into
`~/.cache/tool-discovery/` by `scripts/mcp_conformance.py`; a run of all 32 scenarios takes about 3 s.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import mcp_conformance
import pytest
from support import conformance, eventually
from support.conformance.data import TOOL_DESCRIPTIONS
from support.conformance.service import ConformanceService
from support.mcp_sidecar import sidecar

from discovery.registry.service import Registry
from toolservice_base import ConfigClient, Settings

pytestmark = pytest.mark.brokers

BASELINE = Path(__file__).with_name("conformance-baseline.yml")
SDK_SERVER = Path(conformance.__file__).with_name("sdk_server.py")
"""The suite's tools as an MCP server on the official SDK (stdio), run as a third party's would be."""
IN_SCOPE = (
    "server-initialize",
    "ping",
    "tools-list",
    "tools-call-simple-text",
    "tools-call-image",
    "tools-call-audio",
    "tools-call-embedded-resource",
    "tools-call-mixed-content",
    "tools-call-error",
    "tools-call-with-progress",
    "json-schema-2020-12",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
)
SSE_POLLING_WARNINGS = ("server-sse-priming-event", "server-sse-retry-field")
"""What `server-sse-polling` reports, and nothing else: see the baseline."""


@asynccontextmanager
async def on_the_bus(settings: Settings, log: Path) -> AsyncIterator[object]:
    async with ConformanceService(settings=settings) as service:
        yield service


def from_an_sdk_server(settings: Settings, log: Path) -> AbstractAsyncContextManager[object]:
    command = ["--service-id", "conformance-sdk", "--mcp", "--", sys.executable, str(SDK_SERVER)]
    return sidecar(settings, log, *command)


WAYS: dict[str, Callable[[Settings, Path], AbstractAsyncContextManager[object]]] = {
    "dynamic-tool-service": on_the_bus,
    "mcp-sdk-server": from_an_sdk_server,
}


@pytest.fixture(scope="module")
def suite() -> mcp_conformance.Suite:
    """Installed once per machine (about 12 s the first time), then found in the cache."""
    try:
        return mcp_conformance.fetch()
    except SystemExit as exc:  # the script's one-line refusals (no npm, no Node.js package for this platform)
        pytest.fail(str(exc), pytrace=False)


@asynccontextmanager
async def mcp_http(settings: Settings, token: str | None, log: Path) -> AsyncIterator[str]:
    """`toolreg mcp --http 127.0.0.1:0` as its own process, on the test's broker; the URL it serves."""
    env = settings.child_env(TOOLREG_LOG_FORMAT="json", PYTHONUNBUFFERED="1", TOOLREG_DATA_DIR=str(log.parent / "mcp"))
    if token:
        env["PULSAR_AUTH_TOKEN"] = token
    with open(log, "ab") as errors:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "discovery.cli",
            "mcp",
            "--http",
            "127.0.0.1:0",
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=errors,
        )
    assert process.stdout is not None
    try:
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        assert line.startswith("mcp "), f"{line!r}; see {log}"
        yield line.split()[1]
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 10)


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.timeout(240)
async def test_every_tools_and_transport_scenario_passes_and_only_the_baseline_fails(
    way: str,
    suite: mcp_conformance.Suite,
    settings: Settings,
    registry: Registry,
    config_client: ConfigClient,
    tmp_path: Path,
) -> None:
    async with WAYS[way](settings, tmp_path / "sidecar.log"):
        await eventually(lambda: _listed(config_client), timeout=15)
        async with mcp_http(settings, settings.auth_token, tmp_path / "mcp.log") as url:
            run = await asyncio.to_thread(mcp_conformance.run, url, baseline=BASELINE, output_dir=tmp_path / "results")
    failed = {name: outcome.failed for name, outcome in run.outcomes.items() if not outcome.ok}
    assert not {name: failed[name] for name in IN_SCOPE if name in failed}, "in-scope scenarios failed"
    assert set(IN_SCOPE) <= set(run.outcomes), f"scenarios not run: {set(IN_SCOPE) - set(run.outcomes)}"
    assert run.returncode == 0, f"the suite says the baseline no longer holds:\n{run.output[-3000:]}"
    polling = run.outcomes["server-sse-polling"]
    assert polling.ok and set(polling.warnings) == set(SSE_POLLING_WARNINGS), polling
    out_of_scope = set(_baseline()) - {"server-sse-polling"}
    assert set(failed) == out_of_scope, "every out-of-scope scenario fails, as the baseline says"


async def _listed(config_client: ConfigClient) -> bool:
    return set(TOOL_DESCRIPTIONS) <= set(await config_client.list("tool"))


def _baseline() -> list[str]:
    return [line.strip()[2:] for line in BASELINE.read_text().splitlines() if line.strip().startswith("- ")]

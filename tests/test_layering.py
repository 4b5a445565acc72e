"""The shape the product promises: one module talks to Pulsar, one error tree, silent libraries."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import agent_bridge
import discovery
import toolservice_base
from toolservice_base import ToolDiscoveryError

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("toolservice_base", "discovery", "agent_bridge")
THE_PULSAR_MODULE = Path("toolservice_base/transport/pulsar.py")


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_only_the_pulsar_transport_imports_pulsar() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.relative_to(ROOT) != THE_PULSAR_MODULE and _imports(path) & {"pulsar", "_pulsar"}
    ]
    assert offenders == []
    assert _imports(ROOT / THE_PULSAR_MODULE) >= {"pulsar", "_pulsar"}


def test_layers_import_downward_only() -> None:
    def importers(package: str, forbidden: str) -> list[str]:
        return [str(p.relative_to(ROOT)) for p in (ROOT / package).rglob("*.py") if forbidden in _imports(p)]

    assert importers("toolservice_base", "discovery") == [] and importers("toolservice_base", "agent_bridge") == []
    assert importers("agent_bridge", "discovery") == []


def test_every_public_error_is_a_tool_discovery_error_and_no_pulsar_error_is_exported() -> None:
    for package in (toolservice_base, discovery, agent_bridge):
        names = set(package.__all__)
        assert not {name for name in names if "PULSAR" in name.upper() and name != "PULSAR"}
        errors = [getattr(package, name) for name in names if isinstance(getattr(package, name), type)]
        errors = [cls for cls in errors if issubclass(cls, BaseException)]
        assert errors and all(issubclass(cls, ToolDiscoveryError) for cls in errors), [c for c in errors if not issubclass(c, ToolDiscoveryError)]


LIBRARY_USE = """
import asyncio
from toolservice_base.testing import ServiceHarness
from toolservice_base.examples.calculator import CalculatorService
from toolservice_base import ToolError

async def main():
    async with ServiceHarness(CalculatorService) as h:
        try:
            await h.invoke("calculate", {"expression": "1/0"})   # the service logs invoke.failed (a warning)
        except ToolError:
            pass
asyncio.run(main())
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLREG_")}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_an_unconfigured_library_prints_nothing() -> None:
    done = _run(LIBRARY_USE)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == ""


def test_configured_logging_goes_to_stderr_as_structured_events_never_stdout() -> None:
    done = _run("from toolservice_base import configure_logging\nconfigure_logging('info', json=True)\n" + LIBRARY_USE)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert '"event": "invoke.failed"' in done.stderr and '"logger": "toolservice_base.service"' in done.stderr

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
THE_PULSAR_PACKAGE = Path("toolservice_base/transport/pulsar")


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
        if THE_PULSAR_PACKAGE not in path.relative_to(ROOT).parents and _imports(path) & {"pulsar", "_pulsar"}
    ]
    assert offenders == []
    assert set().union(*(_imports(path) for path in (ROOT / THE_PULSAR_PACKAGE).glob("*.py"))) >= {"pulsar", "_pulsar"}


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
        assert errors and all(issubclass(cls, ToolDiscoveryError) for cls in errors), [
            c for c in errors if not issubclass(c, ToolDiscoveryError)
        ]


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


# --- the rooms of the house: which subsystem may import which ------------------------------

SUBSYSTEMS = ("store", "registry", "broker", "web", "mcp", "cli", "replicas")


def _project_imports(path: Path) -> set[str]:
    """Every project module a file imports, relative imports resolved, as dotted names."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}
    return {name for name in found if name.split(".")[0] in PACKAGES}


def _subsystem_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {name: set() for name in SUBSYSTEMS}
    for name in SUBSYSTEMS:
        for path in (ROOT / "discovery" / name).rglob("*.py"):
            for module in _project_imports(path):
                parts = module.split(".")
                if parts[0] == "discovery" and len(parts) > 1 and parts[1] in SUBSYSTEMS and parts[1] != name:
                    edges[name].add(parts[1])
    return edges


def test_store_and_registry_never_import_each_other_and_only_cli_assembles_subsystems() -> None:
    edges = _subsystem_edges()
    assert "registry" not in edges["store"] and "store" not in edges["registry"]
    # the page renders the registry's overview; mcp serves a ToolSet over the web's hardened HTTP server;
    # broker runs a process; replicas (election, log, membership) know nothing of what they replicate
    assert edges["web"] <= {"registry"} and edges["mcp"] <= {"web"} and edges["broker"] <= set(), edges
    assert edges["replicas"] == set(), edges
    assert edges["store"] <= {"replicas"} and edges["registry"] <= {"replicas"}, edges
    assert {"store", "registry", "broker", "web", "mcp"} <= edges["cli"]


def test_only_the_faces_toward_agents_use_the_agent_bridge() -> None:
    """Inside `discovery`, only `cli` (`toolreg call`, `toolreg mcp`, the demo) and `mcp` (it serves a `ToolSet`)
    import `agent_bridge`; the registry, the store and the rest talk to agents over Pulsar only."""
    users = {
        path.relative_to(ROOT / "discovery").parts[0]
        for path in (ROOT / "discovery").rglob("*.py")
        if "agent_bridge" in _imports(path)
    }
    assert users <= {"cli", "mcp"}, users


def test_the_floor_manages_no_broker_process() -> None:
    """`toolservice_base` is what a tool-service author installs: no subprocesses, pid files or ports of a broker."""
    assert not (ROOT / "toolservice_base" / "broker.py").exists()
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "toolservice_base").rglob("*.py")
        if {"subprocess", "pulsar_lite"} & _imports(path)
    ]
    assert offenders == []


def _loaded_by(statement: str) -> set[str]:
    done = _run(f"import sys\n{statement}\nprint(' '.join(sorted(sys.modules)))")
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_the_registry_and_the_store_load_no_web_stack_and_not_each_other() -> None:
    web = {"starlette", "uvicorn", "mcp"}
    registry = _loaded_by("import discovery.registry")
    store = _loaded_by("import discovery.store")
    assert not web & registry and not web & store
    assert "discovery.store.service" not in registry and "discovery.registry.service" not in store


def test_a_command_loads_only_the_subsystems_it_uses() -> None:
    """Building the parser (every `toolreg` command does) loads no subsystem; `trust` loads no store and no web."""
    parser = _loaded_by("from discovery.cli.main import build_parser\nbuild_parser()")
    assert (
        not {"starlette", "uvicorn", "mcp", "discovery.store.service", "discovery.registry.service", "agent_bridge"}
        & parser
    )
    trust = _loaded_by(
        "from discovery.cli.main import main\nmain(['trust', 'list', '--policy', '/nonexistent/policy.json'])"
    )
    assert not {"starlette", "uvicorn", "mcp", "discovery.store.service", "agent_bridge"} & trust


def test_the_parser_shares_its_defaults_with_the_subsystems_it_does_not_load() -> None:
    import importlib

    cli_main = importlib.import_module("discovery.cli.main")
    from discovery.store.operations import STORE_PROTOCOLS
    from discovery.web.health import DEFAULT_METRICS_PORT

    assert cli_main.STORE_PROTOCOLS == STORE_PROTOCOLS and cli_main.DEFAULT_METRICS_PORT == DEFAULT_METRICS_PORT


def test_only_the_mcp_service_package_of_the_floor_imports_the_mcp_sdk_and_the_floor_does_not_load_it() -> None:
    """A tool-service author's `import toolservice_base` stays free of the MCP SDK; `mcp_service` (`McpToolService`)
    is the one place the floor talks to MCP servers."""
    sdk = {"mcp", "mcp_types", "httpx2"}
    offenders = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "toolservice_base").rglob("*.py"))
        if "mcp_service" not in path.parts and _imports(path) & sdk
    ]
    assert offenders == []
    done = _run(
        "import sys, toolservice_base\nprint(sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types')))"
    )
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr

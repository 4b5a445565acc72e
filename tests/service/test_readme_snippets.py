"""The README's Python snippets run as pasted: the `ServiceHarness` test with pytest in a directory of its own
(no project configuration, so pytest-asyncio in its default strict mode), and the agent example against a broker,
where it prints its `on_change` line when a service arrives."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support import eventually, toolreg_env

from discovery.registry.service import Registry
from toolservice_base import ConfigClient, Settings
from toolservice_base.examples.calculator import CalculatorService
from toolservice_base.examples.joke import JokeService

ROOT = Path(__file__).resolve().parents[2]


def readme_block(section: str, language: str = "python") -> str:
    """The first ```language block under the README heading `section`."""
    text = (ROOT / "README.md").read_text()
    start = text.index(f"{section}\n")
    end = text.find("\n##", start + len(section))  # the next heading (a code comment has one #)
    found = re.search(rf"```{language}\n(.*?)```", text[start : end if end != -1 else None], re.S)
    assert found, f"no {language} block under {section!r}"
    return found.group(1)


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("PULSAR_", "TOOLREG_", "PYTEST_"))}


def test_the_service_harness_snippet_passes_with_pytest_in_a_directory_of_its_own(tmp_path: Path) -> None:
    snippet = readme_block("#### Testing a service, with no broker")
    assert snippet.startswith("# test_my_services.py\n")
    (tmp_path / "test_my_services.py").write_text(snippet)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_services.py"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout


def test_the_testing_extra_is_light_and_named_where_the_snippet_is() -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert sorted(re.split(r"[<>=!~ ]", requirement)[0] for requirement in extras["testing"]) == [
        "pytest",
        "pytest-asyncio",
    ]
    assert "tool-discovery[testing]" in readme_block("#### Testing a service, with no broker", "sh")


@pytest.fixture
async def joke(settings: Settings, registry: Registry, config_client: ConfigClient) -> AsyncIterator[None]:
    service = JokeService(settings=settings)
    await service.start()
    await eventually(lambda: _listed(config_client, "tell-joke"), timeout=10)
    yield
    await service.stop()


async def _listed(client: ConfigClient, name: str) -> bool:
    return name in await client.list("tool")


async def test_the_agent_example_prints_its_on_change_line_when_the_calculator_arrives(
    settings: Settings, joke: None, config_client: ConfigClient, tmp_path: Path
) -> None:
    snippet = readme_block("### Calling tools from an agent")
    (tmp_path / "agent.py").write_text(snippet)
    assert settings.pulsar_url is not None
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(tmp_path / "agent.py"),
        cwd=tmp_path,
        env=toolreg_env(settings.pulsar_url, tmp_path / "agent-data"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    calculator = CalculatorService(settings=settings)
    try:
        names = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        assert "tell-joke" in names and "calculate" not in names, names
        assert "cats" in (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        await calculator.start()  # the example is waiting for it
        out, err = await asyncio.wait_for(process.communicate(), 60)
    finally:
        await calculator.stop()
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()[-3000:]
    now = [line for line in out.decode().splitlines() if line.startswith("now ")]
    assert now and "calculate" in now[-1], out.decode()

"""The table on the terminal, `bench/results.json` and `bench/RESULTS.md`.

Results name the machine (CPU model, core count, memory, OS), the versions of
Python, pulsar-client, pulsar-lite and the product, the date and the command;
never a path, a host name or a user: the files are committed.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

HEADERS = ("benchmark", "figure", "ours", "reference", "target", "met")


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gb = None
    try:
        import psutil

        memory_gb = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": memory_gb, "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version()}


def versions() -> dict[str, str]:
    found = {}
    for package in ("tool-discovery", "pulsar-client", "pulsar-lite", "pydantic", "psutil"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found


def _cell(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        text = f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}" if abs(value) < 1000 else f"{value:,.0f}"
    elif isinstance(value, int):
        text = f"{value:,}"
    else:
        text = str(value)
    return f"{text} {unit}".strip()


def rows(results: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    out = []
    for result in results:
        for row in result.get("rows", []):
            unit = row.get("unit", "")
            out.append((
                result["name"], row["figure"], _cell(row.get("ours"), unit), _cell(row.get("reference"), unit),
                row.get("target", "-"), _cell(row.get("met")) if "met" in row else "-",
            ))
    return out


def table(results: list[dict[str, Any]], markdown: bool = False) -> str:
    body = rows(results)
    if markdown:
        lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in body]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(HEADERS)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*HEADERS), fmt.format(*("-" * w for w in widths)), *(fmt.format(*r) for r in body)])


PATH_OPTIONS = ("--out", "--profile")


def command_line(argv: list[str]) -> str:
    """How the run was asked for, with no path in it: `make bench` runs `python -m bench`."""
    words, hide = [], False
    for arg in argv:
        if hide:
            words.append("DIR")
            hide = False
        elif arg in PATH_OPTIONS:
            words.append(arg)
            hide = True
        elif arg.startswith(tuple(f"{o}=" for o in PATH_OPTIONS)):
            words.append(arg.split("=", 1)[0] + "=DIR")
        else:
            words.append(shlex.quote(arg))
    return " ".join(["python -m bench", *words])


def write(results: list[dict[str, Any]], out_dir: Path, argv: list[str], wall_s: float, broker: str) -> tuple[Path, Path]:
    meta = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command_line(argv),
        "wall_seconds": round(wall_s, 1),
        "broker": broker,
        "machine": machine(),
        "versions": versions(),
    }
    json_path = out_dir / "results.json"
    json_path.write_text(json.dumps({"meta": meta, "benchmarks": results}, indent=2, default=str) + "\n")
    md_path = out_dir / "RESULTS.md"
    m = meta["machine"]
    lines = [
        "# Benchmark results",
        "",
        f"- date: {meta['date']}",
        f"- command: `{meta['command']}` (what `make bench` runs), wall time {meta['wall_seconds']} s",
        f"- broker: {broker}",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB, {m['os']}, Python {m['python']}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
        "",
        "Each figure is measured with its reference in the same run; `reference` says what bare pulsar-client",
        "(or the product without discovery) does with the same messages on the same broker. Details per",
        "benchmark, including every sample summary, are in `results.json`.",
        "",
        table(results, markdown=True),
        "",
        "## What each reference is",
        "",
    ]
    for result in results:
        lines.append(f"- **{result['name']}** ({result['title']}): {result.get('reference_is', '-')}")
    notes = [(r["name"], n) for r in results for n in r.get("notes", [])]
    if notes:
        lines += ["", "## Notes", ""]
        lines += [f"- **{name}**: {note}" for name, note in notes]
    md_path.write_text("\n".join(lines) + "\n")
    return json_path, md_path


def python_tag() -> str:
    return f"Python {sys.version.split()[0]}"

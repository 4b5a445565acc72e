"""The table on the terminal, `bench/results-<broker>.json` and `bench/RESULTS.md`.

Each run writes its own broker's results file; RESULTS.md is rendered from
the latest file of every broker, side by side, so one `make bench` per broker
fills the table.

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
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": memory_gb,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


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
            out.append(
                (
                    result["name"],
                    row["figure"],
                    _cell(row.get("ours"), unit),
                    _cell(row.get("reference"), unit),
                    row.get("target", "-"),
                    _cell(row.get("met")) if "met" in row else "-",
                )
            )
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


BROKERS = {"pulsar-lite": "pulsar-lite", "apache-pulsar": "Apache Pulsar", "external": "PULSAR_URL"}
"""Broker key (in the results file's name) -> its column heading, in the order RESULTS.md shows them."""


def results_path(out_dir: Path, broker_key: str) -> Path:
    return out_dir / f"results-{broker_key}.json"


def write(
    results: list[dict[str, Any]],
    out_dir: Path,
    argv: list[str],
    wall_s: float,
    broker: str,
    broker_key: str,
    partial: list[str] | None = None,
    keep: list[str] | None = None,
) -> tuple[Path, Path]:
    """This run's `results-<broker>.json`, then RESULTS.md from every broker's latest results in `out_dir`.

    `partial` (every benchmark's name, in order) when only some ran: their results replace those of the
    earlier run in the same file, which keeps the others, and the re-run is noted beside the full run's date.
    `keep`: benchmarks a full run leaves out (opt-in); a full run carries their earlier results over, with the
    notes of the re-runs that made them.
    """
    meta = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command_line(argv),
        "wall_seconds": round(wall_s, 1),
        "broker": broker,
        "broker_key": broker_key,
        "machine": machine(),
        "versions": versions(),
    }
    json_path = results_path(out_dir, broker_key)
    if partial and json_path.exists():  # `--only`: these benchmarks' figures replace theirs, the others' stay
        earlier = json.loads(json_path.read_text())
        ran = {result["name"] for result in results}
        kept = [result for result in earlier["benchmarks"] if result["name"] not in ran]
        order = {name: index for index, name in enumerate(partial)}
        results = sorted(kept + results, key=lambda result: order.get(result["name"], len(order)))
        reruns = [
            *earlier["meta"].get("reruns", []),
            {"names": sorted(ran), "date": meta["date"], "command": meta["command"]},
        ]
        meta = {**earlier["meta"], "reruns": reruns}
    elif keep and json_path.exists():  # a full run: the opt-in benchmarks' latest figures stay
        earlier = json.loads(json_path.read_text())
        ran = {result["name"] for result in results}
        carried = [result for result in earlier["benchmarks"] if result["name"] in keep and result["name"] not in ran]
        names = {result["name"] for result in carried}
        reruns = [
            {**rerun, "names": [n for n in rerun["names"] if n in names]}
            for rerun in earlier["meta"].get("reruns", [])
            if names.intersection(rerun["names"])
        ]
        results = results + carried
        if reruns:
            meta["reruns"] = reruns
    json_path.write_text(json.dumps({"meta": meta, "benchmarks": results}, indent=2, default=str) + "\n")
    runs = {
        key: json.loads(results_path(out_dir, key).read_text())
        for key in BROKERS
        if results_path(out_dir, key).exists()
    }
    md_path = out_dir / "RESULTS.md"
    md_path.write_text(markdown(runs))
    return json_path, md_path


def side_by_side(runs: dict[str, dict[str, Any]]) -> str:
    """One row per figure, each broker's `ours` and `reference` next to each other; rows align by benchmark and
    figure."""
    keys = list(runs)
    order: list[tuple[str, str]] = []
    cells: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    targets: dict[tuple[str, str], str] = {}
    for key in keys:
        for result in runs[key]["benchmarks"]:
            for row in result.get("rows", []):
                ident = (result["name"], row["figure"])
                if ident not in cells:
                    order.append(ident)
                    cells[ident] = {}
                cells[ident][key] = row
                targets.setdefault(ident, row.get("target", "-"))
    headers = ["benchmark", "figure"]
    for key in keys:
        headers += [f"ours, {BROKERS[key]}", f"reference, {BROKERS[key]}"]
    headers += ["target", "met" + (" (" + " / ".join(BROKERS[k] for k in keys) + ")" if len(keys) > 1 else "")]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for ident in order:
        row_cells = [ident[0], ident[1]]
        met = []
        for key in keys:
            row = cells[ident].get(key)
            unit = row.get("unit", "") if row else ""
            row_cells += [_cell(row.get("ours"), unit), _cell(row.get("reference"), unit)] if row else ["not run", "-"]
            met.append(_cell(row.get("met")) if row and "met" in row else "-")
        row_cells += [targets[ident], " / ".join(met) if any(m != "-" for m in met) else "-"]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row_cells) + " |")
    return "\n".join(lines)


def markdown(runs: dict[str, dict[str, Any]]) -> str:
    first = next(iter(runs.values()))["meta"]
    m = first["machine"]
    lines = ["# Benchmark results", ""]
    for key, run in runs.items():
        meta = run["meta"]
        lines.append(
            f"- **{BROKERS[key]}**: {meta['broker']}; {meta['date']};"
            f" `{meta['command']}`{' with BENCH_BROKER=apache-pulsar' if key == 'apache-pulsar' else ''}, wall time"
            f" {meta['wall_seconds']} s"
        )
        for rerun in meta.get("reruns", []):
            lines.append(f"  - re-run since: {', '.join(rerun['names'])}; {rerun['date']}; `{rerun['command']}`")
    lines += [
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB, {m['os']}, Python {m['python']}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in first["versions"].items()),
        "",
        "Each figure is measured with its reference in the same run on the same broker; `reference` says what",
        "bare pulsar-client (or the product without discovery) does with the same messages on that broker.",
        "Details per benchmark, including every sample summary, are in `results-<broker>.json`.",
        "",
        side_by_side(runs),
        "",
        "## What each reference is",
        "",
    ]
    seen: set[str] = set()
    for run in runs.values():
        for result in run["benchmarks"]:
            if result["name"] not in seen:
                seen.add(result["name"])
                lines.append(f"- **{result['name']}** ({result['title']}): {result.get('reference_is', '-')}")
    notes = [
        f"- **{r['name']}** on {BROKERS[key]}: {note}"
        for key, run in runs.items()
        for r in run["benchmarks"]
        for note in r.get("notes", [])
    ]
    if notes:
        lines += ["", "## Notes", "", *notes]
    return "\n".join(lines) + "\n"


def python_tag() -> str:
    return f"Python {sys.version.split()[0]}"

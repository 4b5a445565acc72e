"""The architecture map names every product module: one added, moved or removed without the map fails here.

docs/architecture.md ends with a table of every module and the first sentence of its docstring, written by
`scripts/module_map.py`; a reader who opens the map finds every room in it, and what its author says it is for.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import module_map
import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_every_product_module_is_on_the_architecture_map_as_its_docstring_describes_it() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    on_map = module_map.current(text)
    assert on_map is not None, "docs/architecture.md lost its module-map markers"
    missing = [str(p) for p in module_map.modules() if f"| `{p.as_posix()}` |" not in on_map]
    assert not missing, f"not on the map (run python scripts/module_map.py): {missing}"
    assert on_map == module_map.section(), "the map is stale: run python scripts/module_map.py"


def test_the_check_fails_on_a_map_missing_a_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = tmp_path / "architecture.md"
    full = module_map.section()
    doc.write_text("# Architecture\n\n" + "\n".join(line for line in full.splitlines() if "rpc/expiry.py" not in line))
    monkeypatch.setattr(module_map, "DOC", doc)
    assert module_map.main(["--check"]) == 1
    assert module_map.main([]) == 0
    assert "`toolservice_base/rpc/expiry.py`" in doc.read_text() and module_map.main(["--check"]) == 0


def test_the_script_runs_as_documented() -> None:
    done = subprocess.run(
        [sys.executable, "scripts/module_map.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr

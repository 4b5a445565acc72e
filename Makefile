# The set-up commands of the README: `make demo`, `make test`, `make docs` and `make bench`.
# Each creates .venv and installs the project into it when needed.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test docs bench clean

# pip (26.3 here) repeats a local project's build-backend warnings even with --quiet. One is noise here, and only that
# one is filtered (any other warning still shows): setuptools' notice that an editable install is one.
PIP_INSTALL := $(BIN)/python -W 'ignore:Editable installation:UserWarning' -m pip install --quiet

# `make test` needs the test extra (linters, TrustGraph, a browser driver, the agent frameworks: about 578 MB); `make
# demo` needs the product alone, so it installs only that (the test install includes it, and stamps it too).
DEMO_STAMP := $(VENV)/.installed-demo

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(PIP_INSTALL) -e '.[test]'
	touch $(STAMP) $(DEMO_STAMP) $(DOCS_STAMP)

$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(PIP_INSTALL) -e .
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/toolreg demo

# The suite spends most of its time waiting on brokers and processes, not on a core: it runs on TEST_WORKERS pytest
# workers. Every test that reaches Apache Pulsar is in one group, on one worker (tests/conftest.py, `--dist
# loadgroup`), so a run still starts one Apache Pulsar and a test that restarts it stops no other test's broker.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy toolservice_base discovery agent_bridge
	$(MKDOCS) build --strict
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

# The documentation site (mkdocs.yml): docs/, with README.md as its home page, into site/ (git-ignored). `make test`
# builds it too, with --strict. Material's banner about MkDocs 2 is not ours to act on: it is turned off.
DOCS_STAMP := $(VENV)/.installed-docs
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs

$(DOCS_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(PIP_INSTALL) -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(MKDOCS) build

# The benchmark suite (bench/): every figure beside its reference, about 6 minutes per broker on 2 cores.
# Writes bench/results-<broker>.json and renders bench/RESULTS.md from every broker's latest results. BENCH_ARGS=--quick for a smoke run;
# BENCH_BROKER=apache-pulsar runs it on a real Apache Pulsar 4.0 standalone (started for the run).
BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP)
	$(PIP_INSTALL) -e '.[test,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	BENCH_BROKER=$(or $(BENCH_BROKER),pulsar-lite) $(BIN)/python -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .toolreg .pytest_cache site

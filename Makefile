# The two set-up commands of the README: `make demo` and `make test`.
# Each creates .venv and installs the project into it when needed.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/toolreg demo

test: $(STAMP)
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .toolreg .pytest_cache

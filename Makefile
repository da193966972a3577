# Everything a fresh machine needs: `make test` and `make demo` create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip

.PHONY: test test-fast demo docs lint format install clean

$(BIN)/nanomt: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e ".[dev]"
	touch $(BIN)/nanomt

install: $(BIN)/nanomt

test: install
	$(BIN)/ruff check nanomt tests benchmarks scripts
	$(BIN)/ruff format --check nanomt tests benchmarks scripts
	$(BIN)/python -m pytest

# The same without subprocess trainings, the browser and the served load (the tests marked slow).
# Two workers: most of the fast tests' time is subprocesses starting Python and torch, which overlap well (1m41s
# against 2m51s serially on 2 cores, 2026-11-27). `make test` (CI) stays serial.
test-fast: install
	$(BIN)/python -m pytest -m "not slow" -n 2

demo: install
	$(BIN)/nanomt demo

# The docs' tables of decoding settings, from the settings' fields (scripts/docs.py; a test fails while they differ).
docs: install
	$(BIN)/python -m scripts.docs

format: install
	$(BIN)/ruff format nanomt tests benchmarks scripts
	$(BIN)/ruff check --fix nanomt tests benchmarks scripts

clean:
	rm -rf $(VENV) runs/demo

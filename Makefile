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

# Two pytest-xdist workers, each taking its half of the tests in file order and then stealing from the other's
# (--dist worksteal: a module's tests mostly stay on one worker, which sets up its fixtures once); the tests marked
# serial (a ratio of two timings) run first, while the other worker waits (tests/conftest.py). No pytest plugin is
# loaded for being installed (schemathesis', hypothesis' and anyio's, which no test uses, cost each process ~1.5 s):
# xdist is named. On 2 cores, alone: 4m05s against 7m29s serially (2026-12-05).
test: install
	$(BIN)/ruff check nanomt tests benchmarks scripts
	$(BIN)/ruff format --check nanomt tests benchmarks scripts
	PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 $(BIN)/python -m pytest -p xdist.plugin -n 2 --dist worksteal

# The same without the tests marked slow: trainings, torch.compile, the foreign converters, runtimes and clients
# (CTranslate2, ONNX Runtime, Marian, Argos, LibreTranslate's), commands run as processes, corpus scans, long documents,
# the browser and the served load. 1m42s on an AVX2-only host (2026-12-06), where make test takes 7m21s.
test-fast: install
	PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 $(BIN)/python -m pytest -p xdist.plugin -m "not slow" -n 2 --dist worksteal

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

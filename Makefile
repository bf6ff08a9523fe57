# featurelab: `make demo` and `make test` do all their set-up themselves on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
FL     := $(VENV)/bin/featurelab
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-slow test-gpu lint format bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU machines get the pinned CPU build of torch; a CUDA machine keeps pip's default build.
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
	  $(PY) -m pip install -q "torch>=2.13.0"; \
	else \
	  $(PY) -m pip install -q "torch==2.13.0"; \
	fi
	$(PY) -m pip install -q -e ".[dev,ray]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(FL) run leaky-bottleneck --preset quick --out runs/demo --resume

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not cuda"

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/ruff format --check src tests
	$(VENV)/bin/pyright

format: $(STAMP)
	$(VENV)/bin/ruff check --fix src tests
	$(VENV)/bin/ruff format src tests

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# The CUDA checks run from the checkout with the machine's own torch (no venv, nothing downloaded); a
# PYTHONPATH already set (a folder of extra packages, say) is kept behind src.
GPU_NEEDS := torch numpy scipy pandas matplotlib sklearn tqdm pydantic safetensors yaml pytest
test-gpu:
	@PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) -c "import importlib.util as u, sys; \
	missing = [m for m in '$(GPU_NEEDS)'.split() if u.find_spec(m) is None]; \
	sys.exit('make test-gpu: ' + ', '.join(missing) + ' cannot be imported by $(PYTHON): install them, or put a folder that holds them on PYTHONPATH' if missing else 0)"
	PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) -m pytest -q -m cuda

bench: $(STAMP)
	$(FL) bench

clean:
	rm -rf $(VENV) runs build src/*.egg-info .pytest_cache

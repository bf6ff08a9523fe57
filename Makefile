# featurelab: `make demo` and `make test` do all their set-up themselves on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
FL     := $(VENV)/bin/featurelab
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-slow test-gpu gpu-check lint typecheck format bench clean wheel-check

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

# lint: ruff's rules and format (seconds); typecheck: pyright on src and tests (about a minute: it reads torch's
# stubs). CI runs both (.ci/run).
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/ruff format --check src tests

typecheck: $(STAMP)
	$(VENV)/bin/pyright --threads 2

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

# make gpu-check [DEVICE=cuda] [BUDGET=minutes] [TABLE=gpu-check.md] [ONLY=exp,...] [RUNS=dir]: the CUDA tests,
# featurelab bench and as many paper presets as fit the budget (ONLY: those experiments), each step under a timeout
# that fits a 10-minute command, into one markdown table (featurelab/gpucheck.py); RUNS keeps the presets' run
# folders, so that the same command again resumes a preset the limit cut short. On CUDA it runs like test-gpu (the
# machine's python3, PYTHONPATH=src); DEVICE=cpu is a dry run of the same steps at CPU sizes, with the venv.
DEVICE ?= cuda
BUDGET ?= 30
TABLE  ?= gpu-check.md
ONLY   ?=
RUNS   ?=
gpu-check: $(if $(filter cpu,$(DEVICE)),$(STAMP))
	PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $(if $(filter cpu,$(DEVICE)),$(PY),$(PYTHON)) -m featurelab.gpucheck \
	  --device $(DEVICE) --budget $(BUDGET) --out $(TABLE) $(if $(ONLY),--only $(ONLY)) $(if $(RUNS),--runs $(RUNS))

# The wheel works outside the checkout: built from the tree, installed into a fresh venv that borrows .venv's
# dependencies (a .pth line: nothing is downloaded, and .venv's editable featurelab is not seen), it runs a tiny
# preset and an analysis of the model it trained, from another folder. Exit 1 of the run (a failed claim) is fine.
WHEEL_DIR := build/wheel-check
wheel-check: $(STAMP)
	rm -rf $(WHEEL_DIR) && mkdir -p $(WHEEL_DIR)/elsewhere
	$(PY) -m pip wheel -q --no-deps --no-build-isolation . -w $(WHEEL_DIR)/dist
	$(PY) -c "import sys, venv; venv.create(sys.argv[1], with_pip=False)" $(WHEEL_DIR)/venv
	$(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > "$$($(WHEEL_DIR)/venv/bin/python -c \
	  "import sysconfig; print(sysconfig.get_paths()['purelib'])")/borrowed-dependencies.pth"
	$(PY) -m pip --python $(WHEEL_DIR)/venv/bin/python install -q --no-deps $(WHEEL_DIR)/dist/featlab-*.whl
	cd $(WHEEL_DIR)/elsewhere && ../venv/bin/python -c "import featurelab, sys; \
	  sys.exit(0 if '/venv/' in featurelab.__file__ else 'featurelab imported from ' + featurelab.__file__)"
	cd $(WHEEL_DIR)/elsewhere && OMP_NUM_THREADS=1 ../venv/bin/featurelab run leaky-bottleneck --preset tiny \
	  --out tiny --quiet; test $$? -le 1 && test -f tiny/results.json && test -f tiny/report.html
	cd $(WHEEL_DIR)/elsewhere && OMP_NUM_THREADS=1 ../venv/bin/featurelab analyze \
	  "$$(ls tiny/units/*/model.safetensors | head -n 1)" --out analysis && test -f analysis/report.html

bench: $(STAMP)
	$(FL) bench

clean:
	rm -rf $(VENV) runs build src/*.egg-info .pytest_cache

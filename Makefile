# The two commands that work on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test test-fast bench clean

venv: $(STAMP)

# torch is pinned explicitly first: a plain `torch` would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q torch==2.13.0
	$(VPY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# part 1 (single process): capture + plan llama2-7b on A100s; part 2, the main job: profile (cached),
# plan and train gpt-tiny on 4 CPU processes, predicted vs measured (examples/train.py, runs/demo/)
demo: venv
	$(VPY) examples/demo.py
	OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --standalone --nproc-per-node 4 examples/train.py

# (tests/dist by name: ruff leaves out what .gitignore matches, and it ignores folders named dist)
LINTED := galvatron_fx tests tests/dist benchmarks examples

# unit tests (one process each) spread over the cores; then the spawned-gloo tests, whose ranks
# use the cores themselves, one module at a time
test: venv
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/mypy
	$(VPY) -m pytest -q -ra -n auto tests/unit
	$(VPY) -m pytest -q -ra tests/dist

test-fast: venv
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/mypy
	$(VPY) -m pytest -q -ra -n auto -m "not slow" tests/unit
	$(VPY) -m pytest -q -ra -m "not slow" tests/dist

# every benchmark; each prints a table and writes benchmarks/results/<name>.json (~20 min)
bench: venv
	$(VPY) benchmarks/capture_speed.py
	$(VPY) benchmarks/comm_model_accuracy.py
	$(VPY) benchmarks/search_speed.py
	$(VPY) benchmarks/plan_quality.py
	$(VPY) benchmarks/published_replay.py
	OMP_NUM_THREADS=1 $(VPY) benchmarks/runtime_overhead.py
	OMP_NUM_THREADS=1 $(VPY) benchmarks/cost_model_accuracy.py

clean:
	rm -rf $(VENV) build *.egg-info

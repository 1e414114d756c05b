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

# The spawned-gloo tests run one module at a time, their ranks using the cores themselves; they
# leave the cores idle a fifth of the time (ranks waiting on each other, processes starting). The
# unit tests run beside them in the idle scheduling class (chrt --idle; nice where there is none):
# they get only the cycles no spawned test wants, and a rank that wakes takes its core back at once.
# Their output is shown when the spawned tests are done. Last, alone, the tests marked `timing`
# (they check wall-clock time, or measure this machine and check what they measured).
IDLE := $(shell command -v chrt >/dev/null 2>&1 && echo chrt --idle 0 || echo nice -n 19)
UNIT_LOG := $(VENV)/unit-tests.log

test: venv
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/mypy
	@rm -f $(UNIT_LOG) $(UNIT_LOG).rc
	@( $(IDLE) $(VPY) -m pytest -q -ra -n 2 -m "not timing" tests/unit >$(UNIT_LOG) 2>&1; echo $$? >$(UNIT_LOG).rc ) & \
	$(VPY) -m pytest -q -ra -m "not timing" tests/dist; dist=$$?; \
	wait; echo "--- unit tests (run beside the spawned ones):"; cat $(UNIT_LOG); unit=$$(cat $(UNIT_LOG).rc); \
	echo "--- tests that time themselves, alone:"; \
	$(VPY) -m pytest -q -ra -m timing tests/dist; timing=$$?; \
	$(VPY) -m pytest -q -ra -n auto -m timing tests/unit; timing_unit=$$?; \
	test $$dist -eq 0 && test $$unit -eq 0 && test $$timing -eq 0 && test $$timing_unit -eq 0

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

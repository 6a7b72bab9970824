# Two entry points for a fresh machine: `make run` (the main job) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CHROMIUM := /usr/bin/chromium
PLAN ?= harness/plans/ci.yaml

.PHONY: run test lint typecheck browser clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

# The report test drives a real browser: Debian's Chromium (no downloads of its own).
browser:
	@test -x $(CHROMIUM) || { apt-get update -q && apt-get install -y -q chromium; }

run: $(STAMP)
	$(BIN)/kvgate run $(PLAN)

test: $(STAMP) browser
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

clean:
	rm -rf $(VENV) runs

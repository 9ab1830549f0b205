# Two commands for a fresh machine (both create or reuse .venv and install what they need):
#   make demo   set up, then run the main job on the embedded default (sweeps/tiny.yaml)
#   make test   set up, then run the unit and integration tests
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test unit integration lint setup setup-test clean

setup:
	VENV=$(VENV) scripts/setup.sh

setup-test:
	VENV=$(VENV) scripts/setup.sh test

demo: setup
	$(BIN)/specray run sweeps/tiny.yaml

test: setup-test lint
	$(BIN)/pytest -q

unit: setup-test
	$(BIN)/pytest -q -m "not integration"

integration: setup-test
	$(BIN)/pytest -q -m integration

lint: setup-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info

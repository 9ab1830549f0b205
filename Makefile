# Two commands for a fresh machine (both create or reuse .venv and install what they need):
#   make demo   set up, then run the main job on the embedded default (sweeps/demo.yaml)
#   make test   set up, then run lint, the docs site build and the unit and integration tests
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo study test unit integration lint docs setup setup-test record-demo test-vllm-api clean

setup:
	VENV=$(VENV) scripts/setup.sh

setup-test:
	VENV=$(VENV) scripts/setup.sh test

demo: setup
	$(BIN)/specray run sweeps/demo.yaml

# The published study on the tiny zoo: the demo's sweep with three training replicates and τ_dec 1.5 and 2.0
# (after `make demo` it trains only replicates 1 and 2), recorded into docs/results/study.json and rendered
# into the docs: the verdicts docs/results.md and README.md quote are this run's.
study: setup
	SPECRAY_RECORD=$(CURDIR)/docs/results/study.json SPECRAY_RECORD_COMMAND="make study" \
		$(BIN)/specray run sweeps/study.yaml
	$(BIN)/python scripts/results.py

# The unit tests run on one pytest-xdist worker per core. The integration tests run three modules at a time
# (`--dist loadfile`: a module's tests and its shared sweep stay on one worker): a sweep has single-process
# phases (the driver's start, its report, Ray's and Train's start) and waits (a server starting, a killed
# process noticed), so fewer modules than cores + 1 leave a 2-core machine partly idle (measured:
# benchmarks/README.md, "The test suite on a fresh clone"). Each test's Ray asks for 2 CPUs, so three Rays
# share the cores; no test depends on timing. --no-loadscope-reorder keeps the modules in the order
# tests/integration/conftest.py gives them (the longest first) instead of xdist's (by number of tests).
#
# The type checker runs beside the unit tests: it keeps one core busy for about a minute on a fresh clone
# (a cold cache), while the unit tests' workers leave room; run one after the other, each waited for the
# other. Its output is printed once both are done, and either failing fails the target.
test: setup-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mkdocs build --strict --quiet
	mkdir -p build
	$(BIN)/mypy specray > build/mypy.log 2>&1 & typing=$$!; \
		$(BIN)/pytest -q -m "not integration" -n auto --durations=15; unit=$$?; \
		wait $$typing; typed=$$?; echo "$(BIN)/mypy specray"; cat build/mypy.log; \
		[ $$unit -eq 0 ] && [ $$typed -eq 0 ]
	$(BIN)/pytest -q -m integration -n 3 --dist loadfile --no-loadscope-reorder --durations=40

unit: setup-test
	$(BIN)/pytest -q -m "not integration" -n auto

integration: setup-test
	$(BIN)/pytest -q -m integration -n 3 --dist loadfile --no-loadscope-reorder

# The vLLM API lane: specray's vLLM settings built by the real vLLM wheel in its own virtualenv (CPU only;
# not part of `make test`). Needs the package index the first time.
test-vllm-api:
	scripts/setup_vllm_api.sh
	VLLM_TARGET_DEVICE=cpu PYTHONPATH=$(CURDIR) .venv-vllm-api/bin/python -m pytest -q -p no:cacheprovider tests/vllm_api

lint: setup-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy specray

# The docs site (mkdocs.yml) into build/site/; --strict fails on a broken link or anchor and on a page
# missing from the site's navigation.
docs: setup-test
	$(BIN)/mkdocs build --strict --quiet

# Re-measure what the docs quote of `make demo` (run it on a fresh clone with nothing cached: rm -rf
# ~/.cache/specray), then rewrite every figure the docs quote and refresh the front page's heatmap.
record-demo:
	SPECRAY_RECORD=$(CURDIR)/docs/results/demo.json SPECRAY_RECORD_SINCE=$$(date +%s) \
		SPECRAY_RECORD_COMMAND="make demo" $(MAKE) demo
	$(BIN)/python scripts/results.py
	cp outputs/demo/report/heatmap_speedup_model_in_domain.png docs/figures/demo_heatmap_speedup_model_in_domain.png

clean:
	rm -rf $(VENV) .venv-vllm-api .pytest_cache .ruff_cache .mypy_cache build *.egg-info

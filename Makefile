# The README's two commands: `make demo` and `make test`. Each sets up the venv,
# starts the part of the local stack (kasper_py.stack) it uses and runs: the demo
# needs Kafka alone, the tests everything they test. Set KASPER_BOOTSTRAP_SERVERS to
# use an existing Kafka cluster instead of the local broker.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO_STAMP := $(VENV)/.demo-stamp
STACK_COMPONENTS := $(if $(KASPER_BOOTSTRAP_SERVERS),schema-registry redis cassandra opensearch prometheus postgres,kafka schema-registry redis cassandra opensearch prometheus postgres)
DEMO_COMPONENTS := $(if $(KASPER_BOOTSTRAP_SERVERS),,kafka)
PYTEST_ARGS ?=
# This clone's own stack, whatever another clone recorded for `kasper stack` from any
# folder (docs/getting-started.md): a second checkout must not start, test against or
# stop the first one's servers.
export KASPER_STACK_DIR ?= $(CURDIR)/.kasper-stack
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: setup stack containers demo test unit lint docs docs-check chromium bench down clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[all,dev]' -c constraints.txt
	touch $(STAMP)

# What the demo imports and nothing more (no Spark wheel, no store clients): a first
# `make demo` must not wait for the test tooling.
$(DEMO_STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[prometheus]' -c constraints.txt
	touch $(DEMO_STAMP)

stack: setup
	$(BIN)/python -m kasper_py.stack up $(STACK_COMPONENTS)
	$(BIN)/python -m kasper_py.stack spark-jars > /dev/null

demo: $(DEMO_STAMP)
	$(if $(DEMO_COMPONENTS),$(BIN)/python -m kasper_py.stack up $(DEMO_COMPONENTS))
	$(BIN)/python examples/demo.py

lint: setup
	$(BIN)/ruff check kasper_py tests examples bench docsite
	$(BIN)/mypy kasper_py

# The documentation site on http://127.0.0.1:8000, rebuilt on every change (`python -m
# docsite` is mkdocs without Material's end-of-life banner: docsite/__main__.py says why
# the site stays on mkdocs). `make test` builds it with --strict
# (tests/unit/test_docs_site.py), runs its code blocks, and opens it in Chromium.
docs: setup
	$(BIN)/python -m docsite serve

# The docs check: the built site in headless Chromium, with screenshots of the key pages
# in site-shots/ (tests/integration/test_docs_browser.py)
docs-check: setup chromium
	KASPER_DOCS_SHOTS=site-shots $(BIN)/pytest tests/integration/test_docs_browser.py -q

# Headless Chromium for the docs check: Debian's package, installed when missing
chromium:
	@command -v chromium > /dev/null || command -v chromium-browser > /dev/null || { \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; }

unit: setup
	$(BIN)/pytest tests/unit -q

# The container engine (Podman from Debian's packages, the Docker API on a unix socket)
# and the images its tests run, built locally once (docs/testing.md)
containers: setup
	$(BIN)/python -m kasper_py.stack up podman
	$(BIN)/python -m kasper_py.stack images $(CONTAINER_IMAGES)

# Only the images CONTAINER_TESTS start are built (each built once, then found by its tag)
CONTAINER_IMAGES := kafka redis schema-registry cassandra postgres opensearch

# The core integration tests again with Kafka, Redis and the external stores in
# containers (docs/testing.md)
CONTAINER_TESTS := \
	tests/integration/test_containers.py::test_with_kasper_stack_containers_the_suite_runs_on_containers \
	tests/integration/test_store_containers.py \
	tests/integration/test_stores_cassandra.py::test_word_count_is_exact \
	tests/integration/test_stores_postgres.py::test_a_failed_turn_writes_nothing_and_a_replay_is_not_applied_twice \
	tests/integration/test_stores_opensearch.py::test_word_count_values_scans_and_deletes \
	tests/integration/test_topic_processor.py::test_happy_path_outputs_exactly_and_commits \
	tests/integration/test_topic_processor.py::test_processor_error_leaves_offsets_unchanged \
	tests/integration/test_topic_processor.py::test_kill_minus_nine_loses_nothing \
	tests/integration/test_exactly_once.py::test_kill_minus_nine_loses_and_repeats_nothing \
	tests/integration/test_stores_redis.py::test_word_count_is_exact \
	tests/integration/test_stores_redis.py::test_kill_minus_nine_never_undercounts

# Three workers: the integration tests mostly wait on servers and subprocesses; a file's
# tests stay on one worker, in order (tests/conftest.py groups them).
TEST_WORKERS ?= 3

test: stack containers lint chromium
	$(BIN)/pytest tests -q --timeout 900 --durations 15 -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)
	KASPER_STACK=containers $(BIN)/pytest $(CONTAINER_TESTS) -q --timeout 900 --durations 5

bench: stack
	$(BIN)/python bench/bench_passthrough.py
	$(BIN)/python bench/bench_defaults.py
	$(BIN)/python bench/bench_stores.py
	$(BIN)/python bench/bench_reprocess.py
	$(BIN)/python bench/bench_stream.py
	$(BIN)/python bench/bench_scaling.py
	$(BIN)/python bench/bench_windows.py
	$(BIN)/python bench/bench_ttl.py
	$(BIN)/python bench/bench_async.py
	$(BIN)/python bench/bench_arrow.py
	$(BIN)/python bench/bench_failover.py
	$(BIN)/python bench/bench_warm_owner.py
	$(BIN)/python bench/bench_latency.py
	$(BIN)/python bench/bench_turn.py
	$(BIN)/python bench/bench_app.py
	$(BIN)/python bench/bench_hop_parts.py
	$(BIN)/python bench/bench_dsl.py
	$(BIN)/python bench/bench_dsl.py --rows wc_dsl-best,wc_dsl_plain-best,wc_dsl_uncached-best,wc_dsl_uncached_plain-best,wc_dsl-default,wc_dsl_plain-default
	$(BIN)/python bench/bench_chain.py

down:
	$(BIN)/python -m kasper_py.stack down all

clean: down
	rm -rf $(VENV) .kasper-stack kasper-state site site-shots

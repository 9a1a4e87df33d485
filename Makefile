# Every target creates or refreshes .venv itself, so a fresh machine needs only Python 3.11 (and Java 17 for Spark).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench venv clean cluster

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,spark]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/upr server --data-dir ./data --host 127.0.0.1 --port 8000

# etcd and three nodes on 127.0.0.1:8001-8003 with their own data dirs under ./cluster-data (Ctrl-C stops them)
cluster: $(STAMP)
	$(BIN)/python -m app.cluster.local

# tests.ui.browser installs Debian's chromium for the console's browser tests when missing (as root)
# Three pytest workers on two cores, each taking whole test files (module fixtures such as a cluster
# stay in one process): the end-to-end tests spend much of their time waiting on real processes
# (lease expiries, node starts), and a third worker fills that time.  Files go out
# in the order tests/conftest.py sorts them, longest first, and the files that use the shared
# SparkSession go to one worker together, so one JVM serves them (docs/testing.md, "Suite time").
# The suite starts hundreds of Python processes (nodes, CLI commands, Spark's workers); compiling
# the project's modules once here spares each of them compiling from source where the environment
# sets PYTHONDONTWRITEBYTECODE (as this machine's does).
test: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/python -m compileall -q app engine clients spark_connector tests bench
	$(BIN)/python -m tests.ui.browser
	$(BIN)/python -m pytest -n 3 --dist loadfile --no-loadscope-reorder

# Full size, by hand (several minutes); installs the peers' Debian packages and Python clients if missing.
bench: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,spark,bench]'
	$(BIN)/python -m bench --full $(BENCH_ARGS)

clean:
	rm -rf $(VENV)

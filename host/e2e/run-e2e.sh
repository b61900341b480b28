#!/usr/bin/env bash
# Run the full-server smoke (tests/e2e) on its own: the real Paperclip 2026.916.1 server on a
# throwaway PostgreSQL with the CreateOS emulator, driven by the real CLI. The first run installs
# Node 24 + the server into .cache/paperclip/host (about 1.5 GB from npm) and, as root on a
# Debian-like machine without PostgreSQL, the postgresql package. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
[[ -x .venv/bin/pytest ]] || { echo "run-e2e.sh: no .venv here; run 'make setup' first" >&2; exit 1; }
exec .venv/bin/pytest tests/e2e -m e2e -s -q "$@"

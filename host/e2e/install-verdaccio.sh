#!/usr/bin/env bash
# Install verdaccio (a real npm registry) into a cache folder, for the install-by-name e2e test.
#
# Default folder: <repo>/.cache/verdaccio (gitignored); VERDACCIO_CACHE overrides it. Idempotent:
# a folder whose stamp records the pinned version is left alone. Concurrent runs serialise on
# "<folder>.lock". Prints the path of the verdaccio bin script as its last stdout line; npm output
# goes to stderr. Verdaccio 6 needs Node 22+ to run: the test runs it with the full server's
# Node 24 (host/e2e/install-host.sh); any npm installs it.
set -euo pipefail

VERDACCIO_VERSION="6.10.4"
STAMP_TEXT="verdaccio=${VERDACCIO_VERSION}"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cache_dir="${VERDACCIO_CACHE:-${repo_root}/.cache/verdaccio}"
stamp="${cache_dir}/.installed"
bin_js="${cache_dir}/node_modules/verdaccio/bin/verdaccio"

installed() {
  [[ -f "${stamp}" && "$(cat "${stamp}")" == "${STAMP_TEXT}" && -f "${bin_js}" ]]
}

# shellcheck source=cache-lock.sh
source "$(dirname "${BASH_SOURCE[0]}")/cache-lock.sh"
cache_lock install-verdaccio "${cache_dir}" "${bin_js}"

rm -rf "${cache_dir}"
mkdir -p "${cache_dir}"
cd "${cache_dir}"
echo "install-verdaccio: verdaccio@${VERDACCIO_VERSION}" >&2
printf '{"name":"paperclip-verdaccio","private":true}\n' > package.json
npm install --no-fund --no-audit --ignore-scripts --loglevel=error "verdaccio@${VERDACCIO_VERSION}" >&2
test -f "${bin_js}" || { echo "install-verdaccio: ${bin_js} missing after install" >&2; exit 1; }
printf '%s' "${STAMP_TEXT}" > "${stamp}"
echo "${bin_js}"

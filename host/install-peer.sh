#!/usr/bin/env bash
# Install the real Paperclip worker manager (docs/protocol.md H9.1) into a cache folder.
#
# Default folder: <repo>/.cache/paperclip/peer; PAPERCLIP_PEER_CACHE overrides it. Idempotent:
# a folder whose stamp file records the pinned versions is left alone. Prints the folder path
# as its last stdout line. Never vendored: .cache/ is gitignored.
set -euo pipefail

PAPERCLIP_VERSION="2026.916.1"
PINNED_DEPS=(
  "@paperclipai/plugin-sdk@${PAPERCLIP_VERSION}"
  "@paperclipai/adapter-utils@${PAPERCLIP_VERSION}"
  "pino@^10.0.0"
  "pino-http@^11.0.0"
  "pino-pretty@^13.1.3"
)
STAMP_TEXT="paperclip-peer server=${PAPERCLIP_VERSION} deps=${PINNED_DEPS[*]}"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
peer_dir="${PAPERCLIP_PEER_CACHE:-${repo_root}/.cache/paperclip/peer}"
manager_js="node_modules/@paperclipai/server/dist/services/plugin-worker-manager.js"
stamp="${peer_dir}/.installed"

if [[ -f "${stamp}" && "$(cat "${stamp}")" == "${STAMP_TEXT}" && -f "${peer_dir}/${manager_js}" ]]; then
  echo "${peer_dir}"
  exit 0
fi

command -v node >/dev/null || { echo "install-peer: node is not on PATH" >&2; exit 1; }
command -v npm >/dev/null || { echo "install-peer: npm is not on PATH" >&2; exit 1; }

mkdir -p "${peer_dir}"
# Several test runs may share the cache: one installs, the others wait and then find the stamp.
exec 9>"${peer_dir}.lock"
flock 9
if [[ -f "${stamp}" && "$(cat "${stamp}")" == "${STAMP_TEXT}" && -f "${peer_dir}/${manager_js}" ]]; then
  echo "${peer_dir}"
  exit 0
fi
cd "${peer_dir}"
rm -f "${stamp}"
printf '{"name":"paperclip-peer","private":true,"type":"module"}\n' > package.json
npm install --no-fund --no-audit --ignore-scripts --loglevel=error "${PINNED_DEPS[@]}" >&2
tarball="paperclipai-server-${PAPERCLIP_VERSION}.tgz"
if [[ ! -f "${tarball}" ]]; then
  npm pack "@paperclipai/server@${PAPERCLIP_VERSION}" --pack-destination . --loglevel=error >&2
fi
rm -rf node_modules/@paperclipai/server
mkdir -p node_modules/@paperclipai/server
tar -xzf "${tarball}" -C node_modules/@paperclipai/server --strip-components=1 \
  package/package.json package/dist
test -f "${manager_js}" || { echo "install-peer: ${manager_js} missing after unpack" >&2; exit 1; }
printf '%s' "${STAMP_TEXT}" > "${stamp}"
echo "${peer_dir}"

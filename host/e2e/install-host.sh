#!/usr/bin/env bash
# Install the full Paperclip server (docs/protocol.md H9.2) into a cache folder:
# Node 24 from the npm package node-linux-<arch>, then paperclipai and @paperclipai/server.
#
# Default folder: <repo>/.cache/paperclip/host (gitignored); PAPERCLIP_HOST_CACHE overrides it.
# Idempotent: a folder whose stamp records the pinned versions is left alone. Concurrent runs
# serialise on "<folder>.lock". Prints the folder path as its last stdout line; npm output goes
# to stderr. Layout: <folder>/node24/bin/node, <folder>/node_modules/.bin/paperclipai.
set -euo pipefail

PAPERCLIP_VERSION="2026.916.1"
NODE_VERSION="24.22.3"
MIN_NODE_MAJOR=24
MIN_NODE_MINOR=11

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
host_dir="${PAPERCLIP_HOST_CACHE:-${repo_root}/.cache/paperclip/host}"

case "$(uname -m)" in
  x86_64 | amd64) node_arch="x64" ;;
  aarch64 | arm64) node_arch="arm64" ;;
  *) echo "install-host: unsupported machine $(uname -m) (need x86_64 or aarch64)" >&2; exit 1 ;;
esac
node_pkg="node-linux-${node_arch}"
STAMP_TEXT="paperclip-host node=${node_pkg}@${NODE_VERSION} paperclipai=${PAPERCLIP_VERSION} server=${PAPERCLIP_VERSION}"
stamp="${host_dir}/.installed"
node_bin="${host_dir}/node24/bin/node"
cli_bin="${host_dir}/node_modules/.bin/paperclipai"

installed() {
  [[ -f "${stamp}" && "$(cat "${stamp}")" == "${STAMP_TEXT}" && -x "${node_bin}" && -x "${cli_bin}" ]]
}

# shellcheck source=cache-lock.sh
source "$(dirname "${BASH_SOURCE[0]}")/cache-lock.sh"
cache_lock install-host "${host_dir}" "${host_dir}"

rm -rf "${host_dir}"
mkdir -p "${host_dir}/node24"
cd "${host_dir}"

echo "install-host: ${node_pkg}@${NODE_VERSION}" >&2
npm pack "${node_pkg}@${NODE_VERSION}" --pack-destination . --loglevel=error >&2
tar -xzf "${node_pkg}-${NODE_VERSION}.tgz" -C node24 --strip-components=1
rm -f "${node_pkg}-${NODE_VERSION}.tgz"
node_version="$("${node_bin}" --version)"
if ! [[ "${node_version}" =~ ^v([0-9]+)\.([0-9]+)\. ]] \
  || (( BASH_REMATCH[1] < MIN_NODE_MAJOR || (BASH_REMATCH[1] == MIN_NODE_MAJOR && BASH_REMATCH[2] < MIN_NODE_MINOR) )); then
  echo "install-host: ${node_bin} reports ${node_version}; need >= ${MIN_NODE_MAJOR}.${MIN_NODE_MINOR}" >&2
  exit 1
fi

# npm itself comes from the machine; with node24 first on PATH it runs under Node 24 too.
export PATH="${host_dir}/node24/bin:${PATH}"
echo "install-host: paperclipai@${PAPERCLIP_VERSION} @paperclipai/server@${PAPERCLIP_VERSION} (about 1.5 GB)" >&2
printf '{"name":"paperclip-host","private":true,"type":"module"}\n' > package.json
npm install --no-fund --no-audit --ignore-scripts --loglevel=error \
  "paperclipai@${PAPERCLIP_VERSION}" "@paperclipai/server@${PAPERCLIP_VERSION}" >&2
cli_version="$("${node_bin}" "${cli_bin}" --version)"
if [[ "${cli_version}" != "${PAPERCLIP_VERSION}" ]]; then
  echo "install-host: paperclipai reports ${cli_version}, expected ${PAPERCLIP_VERSION}" >&2
  exit 1
fi
printf '%s' "${STAMP_TEXT}" > "${stamp}"
echo "${host_dir}"

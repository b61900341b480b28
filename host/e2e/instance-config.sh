#!/usr/bin/env bash
# Generate a Paperclip instance config with the real CLI and point it at an external database:
#
#   instance-config.sh <data-dir> <database-url> <port>
#
# "paperclipai test-drive -d <data-dir>" writes <data-dir>/instances/default/config.json, then
# tries its embedded PostgreSQL, which fails (this script makes sure it does: a plain file sits
# where the embedded cluster would go, so no embedded server can start even where it would
# work). configure.mjs then switches the config to <database-url>, turns telemetry, update
# checks and backups off and sets the server port. Needs install-host.sh to have run
# (PAPERCLIP_HOST_CACHE names a non-default install folder). Prints the config path.
set -euo pipefail

[[ $# == 3 ]] || { echo "usage: instance-config.sh <data-dir> <database-url> <port>" >&2; exit 2; }
data_dir="$1" database_url="$2" port="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
host_dir="${PAPERCLIP_HOST_CACHE:-${here}/../../.cache/paperclip/host}"
node="${host_dir}/node24/bin/node"
cli="${host_dir}/node_modules/paperclipai/dist/index.js"
[[ -x "${node}" && -f "${cli}" ]] || { echo "instance-config.sh: run host/e2e/install-host.sh first" >&2; exit 1; }

instance="${data_dir}/instances/default"
config="${instance}/config.json"
mkdir -p "${instance}" "${data_dir}/cli"
# test-drive drops every PAPERCLIP_* variable (PAPERCLIP_UPDATE_CHECK too): a fresh cached
# answer keeps it from asking the npm registry for a newer CLI. DO_NOT_TRACK survives.
printf '{"checkedAt":%s,"latest":null}\n' "$(date +%s%3N)" > "${data_dir}/cli/update-check.json"
touch "${instance}/db"
log="${data_dir}/test-drive.log"
set +e
DO_NOT_TRACK=1 NO_COLOR=1 timeout -k 5 120 "${node}" "${cli}" test-drive -d "${data_dir}" \
  --no-browser --api-key unused-by-this-smoke < /dev/null > "${log}" 2>&1
set -e
[[ -f "${config}" ]] || { echo "instance-config.sh: test-drive wrote no ${config}:" >&2; tail -30 "${log}" >&2; exit 1; }
"${node}" "${here}/configure.mjs" "${config}" "${database_url}" "${port}"
echo "${config}"

# Sourced by the cache installers (install-host.sh, install-verdaccio.sh): the one way they
# decide that a cache folder is ready or take it over.
#
#   installed() { ...; }          # the caller's check: true when the cache is complete
#   cache_lock NAME DIR RESULT    # prints RESULT and exits 0 when installed; otherwise checks
#                                 # npm and flock, takes "DIR.lock" (held until the script ends;
#                                 # concurrent runs wait) and checks again, for a run that
#                                 # finished while we waited. Returns only when we must install.
cache_lock() {
  local name="$1" dir="$2" result="$3"
  if installed; then
    echo "${result}"
    exit 0
  fi
  command -v npm >/dev/null || { echo "${name}: npm is not on PATH (Node 20+ with npm is needed)" >&2; exit 1; }
  command -v flock >/dev/null || { echo "${name}: flock (util-linux) is missing" >&2; exit 1; }
  mkdir -p "$(dirname "${dir}")"
  exec 9>"${dir}.lock"
  flock 9
  if installed; then  # another run finished while we waited for the lock
    echo "${result}"
    exit 0
  fi
}

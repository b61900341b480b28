#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the full-server smoke (docs/protocol.md H9.2).
#
#   postgres.sh bin                 print the bin folder of the system PostgreSQL (15 preferred),
#                                   installing the Debian package first when none is found
#   postgres.sh start <dir> <port>  initdb <dir>/data (user paperclip, trust auth), start it on
#                                   127.0.0.1:<port> (TCP only, no Unix socket), create database
#                                   paperclip; prints the connection string as the last line
#   postgres.sh stop <dir>          fast shutdown; kills the postmaster if pg_ctl cannot
#
# As root, initdb and the server run as the postgres user (initdb refuses root): <dir> is
# created and handed to that user, so its parent folders must be traversable by it. As any
# other user they run as that user. Nothing here outlives "stop"; <dir> is the caller's to delete.
set -euo pipefail

die() { echo "postgres.sh: $*" >&2; exit 1; }

find_pg_bin() {
  local dir
  for dir in /usr/lib/postgresql/15/bin /usr/pgsql-15/bin; do
    [[ -x "${dir}/pg_ctl" && -x "${dir}/initdb" ]] && { echo "${dir}"; return 0; }
  done
  # Any other installed major version, newest first.
  for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5 -rn); do
    [[ -x "${dir}/pg_ctl" && -x "${dir}/initdb" ]] && { echo "${dir}"; return 0; }
  done
  if command -v pg_ctl >/dev/null; then
    dir="$(dirname "$(readlink -f "$(command -v pg_ctl)")")"
    [[ -x "${dir}/initdb" ]] && { echo "${dir}"; return 0; }
  fi
  return 1
}

install_postgres() {
  [[ "$(id -u)" == 0 ]] || die "PostgreSQL is not installed and only root can install it (apt-get install postgresql)"
  command -v apt-get >/dev/null || die "PostgreSQL is not installed and apt-get is not available"
  export DEBIAN_FRONTEND=noninteractive
  echo "postgres.sh: PostgreSQL not found; installing it with apt-get" >&2
  apt-get update -qq >&2
  local candidate
  candidate="$(apt-cache policy postgresql | awk '/Candidate:/ {print $2}')"
  [[ -n "${candidate}" && "${candidate}" != "(none)" ]] \
    || die "apt-cache policy postgresql shows no installable candidate"
  echo "postgres.sh: apt candidate postgresql ${candidate}" >&2
  # Keep the package's own cluster from starting: no service may outlive the smoke.
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [[ ! -e "${policy}" ]]; then
    printf '#!/bin/sh\nexit 101\n' > "${policy}" && chmod 755 "${policy}" && made_policy=1
  fi
  local status=0
  apt-get install -y -qq --no-install-recommends postgresql >&2 || status=$?
  (( made_policy )) && rm -f "${policy}"
  (( status == 0 )) || die "apt-get install postgresql failed (exit ${status})"
}

pg_bin() {
  find_pg_bin && return 0
  install_postgres
  find_pg_bin || die "PostgreSQL was installed but no pg_ctl/initdb folder was found"
}

# Run a command as the cluster owner: postgres when we are root, else ourselves.
as_owner() {
  if [[ "$(id -u)" != 0 ]]; then
    "$@"
  elif command -v runuser >/dev/null; then
    runuser -u postgres -- "$@"
  else
    su postgres -s /bin/sh -c "$(printf '%q ' "$@")"
  fi
}

cmd_start() {
  local dir="$1" port="$2" bin
  [[ "${port}" =~ ^[0-9]+$ ]] || die "port must be a number, got '${port}'"
  bin="$(pg_bin)"
  if [[ "$(id -u)" == 0 ]]; then
    id postgres >/dev/null 2>&1 || die "there is no postgres user to own the cluster"
    mkdir -p "${dir}"
    chown postgres: "${dir}"
    as_owner test -w "${dir}" || die "${dir} is not reachable by the postgres user (check its parent folders)"
  else
    mkdir -p "${dir}"
  fi
  as_owner "${bin}/initdb" -D "${dir}/data" -U paperclip --auth=trust -E UTF8 --no-locale \
    > "${dir}/initdb.log" 2>&1 || { tail -20 "${dir}/initdb.log" >&2; die "initdb failed"; }
  as_owner sh -c "cat >> '${dir}/data/postgresql.conf'" <<EOF
port = ${port}
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
  as_owner "${bin}/pg_ctl" -D "${dir}/data" -l "${dir}/server.log" -w -t 60 start >/dev/null \
    || { tail -20 "${dir}/server.log" >&2; die "pg_ctl start failed on port ${port}"; }
  "${bin}/createdb" -h 127.0.0.1 -p "${port}" -U paperclip paperclip \
    || die "createdb paperclip failed on port ${port}"
  echo "postgres://paperclip@127.0.0.1:${port}/paperclip"
}

cmd_stop() {
  local dir="$1" bin pid
  [[ -f "${dir}/data/postmaster.pid" ]] || return 0
  bin="$(find_pg_bin)" || die "no PostgreSQL binaries to stop ${dir}/data with"
  if ! as_owner "${bin}/pg_ctl" -D "${dir}/data" -m fast -w -t 30 stop >/dev/null; then
    pid="$(head -1 "${dir}/data/postmaster.pid" 2>/dev/null || true)"
    if [[ "${pid}" =~ ^[0-9]+$ ]]; then
      echo "postgres.sh: pg_ctl stop failed; sending SIGQUIT to postmaster ${pid}" >&2
      kill -QUIT "${pid}" 2>/dev/null || true
    fi
    return 1
  fi
}

case "${1:-}" in
  bin) pg_bin ;;
  start) [[ $# == 3 ]] || die "usage: postgres.sh start <dir> <port>"; cmd_start "$2" "$3" ;;
  stop) [[ $# == 2 ]] || die "usage: postgres.sh stop <dir>"; cmd_stop "$2" ;;
  *) die "usage: postgres.sh bin | start <dir> <port> | stop <dir>" ;;
esac

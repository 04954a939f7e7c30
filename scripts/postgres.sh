#!/usr/bin/env bash
# A throwaway PostgreSQL server on 127.0.0.1, from Debian's `postgresql` package.
#
#   scripts/postgres.sh install              install the server (apt-get) unless present
#   scripts/postgres.sh start [--owner PID]  start a fresh cluster, print its URL on stdout
#   scripts/postgres.sh stop [URL]           stop the cluster at URL (without one: those started from
#                                            the same shell, never another caller's)
#   scripts/postgres.sh pause URL            stop the server at URL (fast), keeping its data
#   scripts/postgres.sh resume URL           start the paused server at URL again, on its port
#   scripts/postgres.sh installed            exit 0 when the server is installed
#
# Each `start` makes a new cluster in a temporary folder (trust authentication for
# the user `tiller`, listening on loopback only, fsync off: it is for tests) on a free
# port and prints `postgres://tiller@127.0.0.1:PORT/postgres`. `--owner PID` stops it
# when process PID ends (the test suite uses it). PostgreSQL refuses to run as root:
# as root, the cluster belongs to the package's `postgres` user.
set -euo pipefail

RUN="${TILLER_PG_RUN:-${TMPDIR:-/tmp}/tiller-postgres}"

say() { printf 'postgres: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

bin_dir() {
  local dir
  for dir in /usr/lib/postgresql/*/bin; do
    if [ -x "$dir/pg_ctl" ]; then echo "$dir"; fi
  done | sort -V | tail -1
}

installed() { [ -n "$(bin_dir)" ]; }

install() {
  if installed; then return; fi
  say "installing Debian's postgresql"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql >/dev/null
  installed || die "the postgresql package installed no pg_ctl"
}

# as_owner CMD...: runs CMD as the cluster's owner.
as_owner() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start() {
  local owner=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --owner) owner="$2"; shift 2 ;;
      *) die "unknown option $1" ;;
    esac
  done
  install
  local bin; bin="$(bin_dir)"
  mkdir -p "$RUN"; chmod 1777 "$RUN"
  local dir; dir="$(mktemp -d "$RUN/cluster.XXXXXX")"
  chmod 0777 "$dir"
  local port; port="$(free_port)"
  as_owner "$bin/initdb" --pgdata "$dir/data" --username tiller --auth trust --no-sync \
    --encoding UTF8 --locale C >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; die "initdb failed"; }
  echo "$port" >"$dir/port"
  # Who started it: `stop` without a URL stops only what its own caller started.
  echo "$PPID" >"$dir/caller"
  start_server "$dir"
  if [ -n "$owner" ]; then
    ( while kill -0 "$owner" 2>/dev/null; do sleep 1; done; stop_cluster "$dir" ) >/dev/null 2>&1 &
    disown
  fi
  echo "postgres://tiller@127.0.0.1:$port/postgres"
}

# Starts (again) the server of the cluster in $1, on the port it keeps.
start_server() {
  local dir="$1" bin port; bin="$(bin_dir)"; port="$(cat "$dir/port")"
  as_owner "$bin/pg_ctl" --pgdata "$dir/data" --log "$dir/server.log" --wait --timeout 60 start \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
    >/dev/null || { cat "$dir/server.log" >&2; die "the server did not start"; }
}

# The cluster directory of the server at URL $1.
cluster_of() {
  local dir
  for dir in "$RUN"/cluster.*; do
    if [ "$1" = "postgres://tiller@127.0.0.1:$(cat "$dir/port" 2>/dev/null)/postgres" ]; then
      echo "$dir"; return
    fi
  done
  die "no cluster of this script serves $1"
}

# Stops the server at URL $1 as an operator restarting it would (fast: its
# connections are cut, what they committed is kept), keeping its data.
pause() {
  local dir bin; dir="$(cluster_of "$1")"; bin="$(bin_dir)"
  as_owner "$bin/pg_ctl" --pgdata "$dir/data" --mode fast --wait stop >/dev/null
}

stop_cluster() {
  local dir="$1" bin; bin="$(bin_dir)"
  if [ -d "$dir/data" ]; then
    as_owner "$bin/pg_ctl" --pgdata "$dir/data" --mode immediate stop >/dev/null 2>&1 || true
  fi
  rm -rf "$dir"
}

stop() {
  local url="${1:-}" dir
  for dir in "$RUN"/cluster.*; do
    [ -d "$dir" ] || continue
    if { [ -z "$url" ] && [ "$(cat "$dir/caller" 2>/dev/null)" = "$PPID" ]; } \
      || [ "$url" = "postgres://tiller@127.0.0.1:$(cat "$dir/port" 2>/dev/null)/postgres" ]; then
      stop_cluster "$dir"
    fi
  done
}

case "${1:-}" in
  install) install; say "installed: $(bin_dir)" ;;
  start) shift; start "$@" ;;
  stop) shift; stop "${1:-}" ;;
  pause) pause "${2:?pause URL}" ;;
  resume) start_server "$(cluster_of "${2:?resume URL}")" ;;
  installed) installed ;;
  *) die "usage: $0 install|start [--owner PID]|stop [URL]|pause URL|resume URL|installed" ;;
esac

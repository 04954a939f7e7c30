#!/usr/bin/env bash
# Clients no one here wrote, for the tests that talk to `tiller serve` as its users
# would: Python's `httpx`, `httpx-sse`, `openai` and `ag-ui-protocol` and the API
# fuzzer `schemathesis` from PyPI, in a virtualenv, and pi-agent-core (its `Agent`
# and `streamProxy`), `openai`, the AI SDK (`ai`) and AG-UI's `@ag-ui/client` from
# the npm registry (with esbuild, which bundles a test's chat page for the
# browser), both cached under ~/.cache/tiller/http-clients.
#
#   scripts/http-clients.sh install        install both unless present
#   scripts/http-clients.sh python         print the virtualenv's python (exit 1 when not installed);
#                                          its bin/ also holds `schemathesis`
#   scripts/http-clients.sh node-modules   print pi-agent-core's node_modules folder (exit 1 when not installed)
set -euo pipefail

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/tiller/http-clients"
VENV="$CACHE/venv"
PACKAGES=(httpx==0.28.1 httpx-sse==0.4.3 openai==3.57.0 ag-ui-protocol==1.0.0 schemathesis==4.32.5)
NODE="$CACHE/node"
NPM_PACKAGES=(@mariozechner/pi-agent-core@0.73.1 openai@6.26.0 ai@7.0.173 @ag-ui/client@1.0.0 esbuild@0.28.2)

say() { printf 'http-clients: %s\n' "$*" >&2; }

python_installed() { "$VENV/bin/python" -c 'import httpx, httpx_sse, openai, ag_ui.core, schemathesis' 2>/dev/null; }

node_installed() {
  [ -f "$NODE/node_modules/@mariozechner/pi-agent-core/dist/proxy.js" ] &&
    [ -f "$NODE/node_modules/openai/index.mjs" ] &&
    [ -f "$NODE/node_modules/ai/dist/index.js" ] &&
    [ -f "$NODE/node_modules/@ag-ui/client/dist/index.mjs" ] &&
    [ -x "$NODE/node_modules/.bin/esbuild" ]
}

install() {
  if ! python_installed; then
    say "installing ${PACKAGES[*]} into $VENV"
    rm -rf "$VENV"
    mkdir -p "$CACHE"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet "${PACKAGES[@]}"
    python_installed || { say "the install left httpx_sse, openai, ag_ui or schemathesis unimportable"; exit 1; }
  fi
  if ! node_installed; then
    command -v npm >/dev/null || { say "npm is needed to install ${NPM_PACKAGES[*]}"; exit 1; }
    say "installing ${NPM_PACKAGES[*]} into $NODE"
    rm -rf "$NODE"
    mkdir -p "$NODE"
    npm install --prefix "$NODE" --no-audit --no-fund --loglevel=error "${NPM_PACKAGES[@]}" >&2
    node_installed || { say "the install left no pi-agent-core, openai, ai, @ag-ui/client or esbuild"; exit 1; }
  fi
}

case "${1:-}" in
  install) install ;;
  python) python_installed && echo "$VENV/bin/python" ;;
  node-modules) node_installed && echo "$NODE/node_modules" ;;
  *) echo "usage: $0 install|python|node-modules" >&2; exit 2 ;;
esac

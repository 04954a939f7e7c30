#!/usr/bin/env bash
# MCP servers and clients no one here wrote, for the MCP tests: the reference
# servers `@modelcontextprotocol/server-everything` and
# `@modelcontextprotocol/server-filesystem` from the npm registry, and the official
# Python SDK `mcp` from PyPI (its client drives `tiller mcp`), cached under
# ~/.cache/tiller/mcp.
#
#   scripts/mcp.sh install   install both unless present
#   scripts/mcp.sh bin       print the folder holding `mcp-server-everything` and
#                            `mcp-server-filesystem` (exit 1 when not installed)
#   scripts/mcp.sh python    print the virtualenv's python, which imports `mcp`
#                            (exit 1 when not installed)
set -euo pipefail

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/tiller/mcp"
NODE="$CACHE/node"
NPM_PACKAGES=(@modelcontextprotocol/server-everything@2026.8.31 @modelcontextprotocol/server-filesystem@2026.8.31)
VENV="$CACHE/venv"
PACKAGES=(mcp==2.3.0)

say() { printf 'mcp: %s\n' "$*" >&2; }

node_installed() { [ -x "$NODE/node_modules/.bin/mcp-server-everything" ] && [ -x "$NODE/node_modules/.bin/mcp-server-filesystem" ]; }

python_installed() { "$VENV/bin/python" -c 'import mcp.client.stdio' 2>/dev/null; }

install() {
  if ! node_installed; then
    command -v npm >/dev/null || { say "npm is needed to install ${NPM_PACKAGES[*]}"; exit 1; }
    say "installing ${NPM_PACKAGES[*]} into $NODE"
    rm -rf "$NODE"
    mkdir -p "$NODE"
    npm install --prefix "$NODE" --no-audit --no-fund --loglevel=error "${NPM_PACKAGES[@]}" >&2
    node_installed || { say "the install left no mcp-server-everything or mcp-server-filesystem"; exit 1; }
  fi
  if ! python_installed; then
    say "installing ${PACKAGES[*]} into $VENV"
    rm -rf "$VENV"
    mkdir -p "$CACHE"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet "${PACKAGES[@]}"
    python_installed || { say "the install left mcp unimportable"; exit 1; }
  fi
}

case "${1:-}" in
  install) install ;;
  bin) node_installed && echo "$NODE/node_modules/.bin" ;;
  python) python_installed && echo "$VENV/bin/python" ;;
  *) echo "usage: $0 install|bin|python" >&2; exit 2 ;;
esac

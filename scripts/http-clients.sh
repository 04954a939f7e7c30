#!/usr/bin/env bash
# HTTP clients no one here wrote, for the tests that talk to `tiller serve` as its
# users would: Python's `httpx` and `httpx-sse` from PyPI, in a virtualenv cached
# under ~/.cache/tiller/http-clients.
#
#   scripts/http-clients.sh install   create the virtualenv unless present
#   scripts/http-clients.sh python    print its python's path (exit 1 when not installed)
set -euo pipefail

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/tiller/http-clients"
VENV="$CACHE/venv"
PACKAGES=(httpx==0.28.1 httpx-sse==0.4.3)

say() { printf 'http-clients: %s\n' "$*" >&2; }

installed() { "$VENV/bin/python" -c 'import httpx, httpx_sse' 2>/dev/null; }

install() {
  if installed; then return; fi
  say "installing ${PACKAGES[*]} into $VENV"
  rm -rf "$VENV"
  mkdir -p "$CACHE"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet "${PACKAGES[@]}"
  installed || { say "the install left no importable httpx_sse"; exit 1; }
}

case "${1:-}" in
  install) install ;;
  python) installed && echo "$VENV/bin/python" ;;
  *) echo "usage: $0 install|python" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Tiller in Python, built as its users build it: a project virtualenv (python/.venv)
# with maturin, pytest, pydantic and httpx from PyPI, into which `maturin develop`
# builds the `tiller` package from python/.
#
#   scripts/python.sh install   make the virtualenv unless present, then build the package into it
#   scripts/python.sh python    print the virtualenv's python (exit 1 when not installed)
#   scripts/python.sh test      install, then run the pytest suite (python/tests)
#   scripts/python.sh bench     a second virtualenv (python/.venv-bench) with the peers measured beside
#                               Tiller (PyPI pydantic-ai-slim, openai-agents), the package built --release
#                               into it, then python/benches/bench.py
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="python/.venv"
PACKAGES=(maturin==1.16.0 pytest==9.2.0 pydantic==2.14.4 httpx==0.28.1)

BENCH_VENV="python/.venv-bench"
BENCH_PACKAGES=(maturin==1.16.0 "pydantic-ai-slim[openai]==2.66.0" openai-agents==0.24.0)

say() { printf 'python: %s\n' "$*" >&2; }

tools_installed() { "$VENV/bin/python" -c 'import pytest, pydantic, httpx' 2>/dev/null && [ -x "$VENV/bin/maturin" ]; }

install() {
  if ! tools_installed; then
    say "installing ${PACKAGES[*]} into $VENV"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet "${PACKAGES[@]}"
    tools_installed || { say "the install left maturin, pytest, pydantic or httpx missing"; exit 1; }
  fi
  # The package from this checkout, into the virtualenv (a debug build; the benches
  # build with --release). Cargo's own checks skip it when nothing changed.
  say "building the tiller package (maturin develop)"
  (cd python && VIRTUAL_ENV="$PWD/.venv" .venv/bin/maturin develop --locked --quiet "$@" >&2)
}

bench() {
  if ! "$BENCH_VENV/bin/python" -c 'import pydantic_ai, agents' 2>/dev/null; then
    say "installing ${BENCH_PACKAGES[*]} into $BENCH_VENV"
    rm -rf "$BENCH_VENV"
    python3 -m venv "$BENCH_VENV"
    "$BENCH_VENV/bin/pip" install --quiet "${BENCH_PACKAGES[@]}"
  fi
  say "building the tiller package with --release (maturin develop)"
  (cd python && VIRTUAL_ENV="$PWD/.venv-bench" .venv-bench/bin/maturin develop --release --locked --quiet >&2)
  "$BENCH_VENV/bin/python" python/benches/bench.py "$@"
}

case "${1:-}" in
  install) shift; install "$@" ;;
  python) tools_installed && echo "$VENV/bin/python" ;;
  test) shift; install; "$VENV/bin/python" -m pytest python/tests "$@" ;;
  bench) shift; bench "$@" ;;
  *) echo "usage: $0 install [maturin options]|python|test [pytest options]|bench [bench options]" >&2; exit 2 ;;
esac

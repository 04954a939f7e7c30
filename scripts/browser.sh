#!/usr/bin/env bash
# A real headless browser for the dashboard test: Debian's `chromium` and
# `chromium-driver` (WebDriver).
#
#   scripts/browser.sh install     install both unless present
#   scripts/browser.sh installed   exit 0 when both are installed
set -euo pipefail

say() { printf 'browser: %s\n' "$*" >&2; }

installed() { command -v chromium >/dev/null && command -v chromedriver >/dev/null; }

install() {
  if installed; then return; fi
  say "installing Debian's chromium and chromium-driver"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver >/dev/null
  installed || { say "the packages installed no chromium or chromedriver"; exit 1; }
}

case "${1:-}" in
  install) install ;;
  installed) installed ;;
  *) echo "usage: $0 install|installed" >&2; exit 2 ;;
esac

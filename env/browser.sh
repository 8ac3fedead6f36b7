#!/usr/bin/env bash
# Make Debian's headless-capable Chromium available for the browser tests
# (tests/test_mlflow_ui.py) and print its path. Installs the `chromium` package with
# apt-get when it is missing and this user may (root: CI and the dev machines, about
# 30 s); otherwise exits non-zero with the reason on its last line of stderr, which the
# test shows as its skip reason. Not a pip browser package: playwright and pyppeteer
# download a browser build of their own, which this project's machines cannot fetch.
set -uo pipefail

if path=$(command -v chromium); then
  echo "$path"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "browser: chromium is not installed and there is no apt-get to install it with (install Debian's chromium package, or any chromium on PATH)" >&2
  exit 1
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "browser: chromium is not installed and installing it needs root (run: sudo apt-get install -y chromium)" >&2
  exit 1
fi
log=$(mktemp)
if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >"$log" 2>&1; then
  tail -n 20 "$log" >&2
  echo "browser: apt-get install chromium failed (log above)" >&2
  rm -f "$log"
  exit 1
fi
rm -f "$log"
if ! path=$(command -v chromium); then
  echo "browser: apt-get installed chromium but no chromium is on PATH" >&2
  exit 1
fi
echo "$path"

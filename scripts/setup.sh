#!/usr/bin/env bash
# Installs the Debian packages sparq needs beyond gcc/make. Idempotent: a
# package already installed is left alone, so `make run` / `make test` call it
# every time at no cost.
# With --run (make run) only what building and running the command needs:
#   zlib1g-dev          reading .gz evaluation data (the command links -lz)
#   libmicrohttpd-dev   the HTTP server of `sparq serve` (linked into the command)
# Without it (make test) also:
#   libclang-rt-14-dev  libFuzzer runtime for the GGUF fuzz harness (clang)
#   gnuplot-nox         --plot output of bench/eval
#   libfaiss-dev, libopenblas-dev   the optional HNSW index (Faiss)
#   python3-pytest, python3-numpy   the Python package's tests (numpy: logits as arrays)
#   python3-setuptools, python3-pip, python3-venv   installing the Python package offline
#   pkg-config          building the C example against an installed tree (sparq.pc)
#   nodejs, npm, curl   the server test (the official openai npm client, which
#                       `npm ci` installs in tests/server from its lock file; raw HTTP)
#   nginx               the deploy test (three replicas behind deploy/nginx/sparq.conf)
#   chromium            the chat page's test (tests/test_webui.c), driven headless by
#                       puppeteer-core, which `npm ci` installs in tests/webui from its lock file
#   gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user-static
#                       make test-arm64: the ARM64 (NEON) build cross-compiled
#                       and its tests run under emulation on this x86 machine
# With --train (make testmodel) also:
#   python3-torch, python3-matplotlib   training models/tiny-d64.gguf and its loss plot
set -u
run_pkgs="zlib1g-dev libmicrohttpd-dev"
pkgs="$run_pkgs clang libclang-rt-14-dev gnuplot-nox libfaiss-dev libopenblas-dev
      python3-pytest python3-numpy python3-setuptools python3-pip python3-venv pkg-config curl
      nginx chromium gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static"
mode=${1:-}
case "$mode" in
  --run) pkgs=$run_pkgs ;;
  --train) pkgs="$pkgs python3-torch python3-matplotlib" ;;
  "") ;;
  *) echo "usage: scripts/setup.sh [--run | --train]" >&2; exit 2 ;;
esac
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# node from any source will do (nodesource's bundles npm; Debian's splits it)
if [ "$mode" != "--run" ]; then
  command -v node >/dev/null || missing="$missing nodejs"
  command -v npm >/dev/null || missing="$missing npm"
fi
# The node tests' npm packages, exactly as locked: the server test's openai
# client (tests/server) and the browser test's puppeteer-core (tests/webui).
# Installed here, not by a test, so a test run never reaches the registry;
# again whenever a lock file is newer than the install (npm writes
# node_modules/.package-lock.json).
npm_modules() { # dir, a package that must be there afterwards
  local dir
  dir="$(dirname "$0")/../$1"
  if [ ! -d "$dir/node_modules/$2" ] || [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]; then
    echo "setup: npm ci in $1" >&2
    (cd "$dir" && timeout 600 npm ci --prefer-offline --no-audit --no-fund >&2) ||
      echo "setup: npm ci in $1 failed; the tests that use it fail until it succeeds" >&2
  fi
}
webui_modules() {
  [ "$mode" = "--run" ] && return 0
  command -v npm >/dev/null || return 0
  npm_modules tests/server openai
  npm_modules tests/webui puppeteer-core
  return 0
}
if [ -z "$missing" ]; then
  webui_modules
  exit 0
fi
echo "setup: installing$missing" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
if ! { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends $missing; } >&2; then
  if [ "$mode" = "--run" ]; then
    # not fatal: they may be installed another way than dpkg knows
    echo "setup: could not install$missing; building sparq needs them (apt-get install$missing)" >&2
    exit 0
  fi
  echo "setup: could not install$missing; the parts that need them (fuzzing, plots, HNSW, Python tests, test-arm64) are skipped" >&2
fi
webui_modules
exit 0

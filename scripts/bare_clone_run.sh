#!/usr/bin/env bash
# A fresh `git clone` of this repository's HEAD into an empty temporary
# directory - no ../shared beside it, SPARQ_MODEL_PATH unset - runs
# `make run`; it must exit 0 and print a non-empty generated text on stdout
# (make -s: stdout is then the command's output alone). Used by .ci/run.
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d /tmp/sparq_bare_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
git clone -q "$repo" "$tmp/sparq"
[ ! -e "$tmp/shared" ] || { echo "bare clone: $tmp/shared exists" >&2; exit 1; }
cd "$tmp/sparq"
if ! env -u SPARQ_MODEL_PATH make -s run >"$tmp/out.txt" 2>"$tmp/err.txt"; then
  tail -n 30 "$tmp/err.txt" >&2
  echo "bare clone: make run failed" >&2
  exit 1
fi
# the generated text: printable, with at least one letter
if ! grep -q "[[:alpha:]]" "$tmp/out.txt" || LC_ALL=C.UTF-8 grep -q '[^[:print:][:space:]]' "$tmp/out.txt"; then
  echo "bare clone: make run printed no text: '$(cat "$tmp/out.txt")'" >&2
  exit 1
fi
echo "bare clone: make run printed: $(head -c 200 "$tmp/out.txt")"

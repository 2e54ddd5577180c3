#!/usr/bin/env bash
# Runs every test program in BUILD/tests and prints one closing line
# "N passed, M failed" (the sum of the checks of all programs).
# Each program prints its own "name: N passed, M failed" as its last line.
set -u
build=${1:-build}
export SPARQ_BUILD="$build"
total_pass=0; total_fail=0; crashed=""
for t in "$build"/tests/test_*; do
  [ -x "$t" ] || continue
  out=$("$t" 2>&1); rc=$?
  line=$(printf '%s\n' "$out" | grep -E '^[a-z_0-9]+: [0-9]+ passed, [0-9]+ failed' | tail -n 1)
  if [ -z "$line" ] || [ $rc -ne 0 ]; then
    printf '%s\n' "$out" | tail -n 40
  fi
  if [ -z "$line" ]; then
    echo "$(basename "$t"): CRASHED or printed no summary (exit $rc)"
    crashed="$crashed $(basename "$t")"; total_fail=$((total_fail + 1)); continue
  fi
  echo "$line"
  p=$(echo "$line" | sed -E 's/^[^:]+: ([0-9]+) passed, ([0-9]+) failed.*/\1/')
  f=$(echo "$line" | sed -E 's/^[^:]+: ([0-9]+) passed, ([0-9]+) failed.*/\2/')
  total_pass=$((total_pass + p)); total_fail=$((total_fail + f))
  [ $rc -ne 0 ] && [ "$f" -eq 0 ] && total_fail=$((total_fail + 1))
done
[ -n "$crashed" ] && echo "crashed:$crashed"
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]

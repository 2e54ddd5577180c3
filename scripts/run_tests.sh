#!/usr/bin/env bash
# Runs every test program in BUILD/tests, then the Python package's pytest
# suite (tests/python), and prints one closing line
#   "N passed, M failed, K skipped"
# (the sums over all programs and pytest). Each C program prints its own
# "name: N passed, M failed[, K skipped]" as its last line and "SKIP why"
# for each skip. Exit status is non-zero on any failure.
#
# With CI=true a skip caused by missing reference data (a model, a golden
# file, a dataset: everything but the hardware and optional-build reasons
# listed in SKIP_OK below) counts as a failure: CI must have ../shared.
#
# SPARQ_TESTS="test_a test_b ..." runs only those programs (and pytest only
# if the list names "python"): a run that exists for one part of the code,
# such as the forced-AVX2 pass over the kernels.
#
# Each program (and the pytest run) gets at most SPARQ_TEST_TIMEOUT seconds
# (default 1800; 0 = none): a deadlock then fails that one test, named, and
# the rest still run. Each summary line ends with the test's wall time.
set -u
build=${1:-build}
export SPARQ_BUILD="$build"
# The reference data beside the checkout (../shared), which neither the
# library nor the command searches by itself; the test programs add it as
# well (tests/test.h), this covers what they start and the pytest run.
export SPARQ_MODEL_PATH="${SPARQ_MODEL_PATH:+$SPARQ_MODEL_PATH:}models:../shared/models:../shared"
ci=0
case "${CI:-}" in true|1|yes) ci=1 ;; esac
# Skips that are not missing data: CPU features, SIMD levels without a twin,
# optional build parts and tools a machine may lack (another Python to
# install the package into).
SKIP_OK=${SPARQ_SKIP_OK:-'AVX-512|AVX512|F16C|SIMD level|Faiss not built|not compiled in|build without|not on this machine'}
tmo=${SPARQ_TEST_TIMEOUT:-1800}
case "$tmo" in ''|*[!0-9]*) echo "SPARQ_TEST_TIMEOUT must be a number of seconds, not '$tmo'" >&2; exit 2 ;; esac
# timeout(1) sends TERM, then KILL 10 s later if the test ignores it; its
# exit status 124 (137 after the KILL) says the limit struck.
run_limited() {
  if [ "$tmo" -gt 0 ]; then timeout -k 10 "$tmo" "$@"; else "$@"; fi
}
timed_out() { # exit status -> true if timeout(1) ended the test
  [ "$tmo" -gt 0 ] && { [ "$1" -eq 124 ] || [ "$1" -eq 137 ]; }
}
now_ms() { date +%s%3N; }
wall() { # start in ms -> " (12.3 s)"
  local ms=$(( $(now_ms) - $1 ))
  printf ' (%d.%d s)' $((ms / 1000)) $((ms % 1000 / 100))
}
total_pass=0; total_fail=0; total_skip=0; crashed=""; ci_fail=""

count_line() { # "name: N passed, M failed[, K skipped]" -> adds to the totals
  local line=$1 p f s
  p=$(echo "$line" | sed -E 's/^[^:]+: ([0-9]+) passed.*/\1/')
  f=$(echo "$line" | sed -E 's/^[^:]+: [0-9]+ passed, ([0-9]+) failed.*/\1/')
  s=$(echo "$line" | sed -nE 's/.*, ([0-9]+) skipped.*/\1/p')
  total_pass=$((total_pass + p)); total_fail=$((total_fail + f)); total_skip=$((total_skip + ${s:-0}))
  LAST_FAIL=$f
}

ci_skips() { # name, then the skip reasons on stdin (not a pipe: the totals
             # must change in this shell): in CI, data skips fail
  local name=$1 why
  while IFS= read -r why; do
    [ -z "$why" ] && continue
    if printf '%s\n' "$why" | grep -qE "$SKIP_OK"; then continue; fi
    if [ $ci -eq 1 ]; then
      echo "$name: CI: skipped for missing reference data: $why"
      # counted as a failure instead of a skip
      total_fail=$((total_fail + 1)); total_skip=$((total_skip - 1))
      case " $ci_fail " in *" $name "*) ;; *) ci_fail="$ci_fail $name" ;; esac
    fi
  done
}

for t in "$build"/tests/test_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  if [ -n "${SPARQ_TESTS:-}" ]; then case " $SPARQ_TESTS " in *" $name "*) ;; *) continue ;; esac; fi
  t0=$(now_ms)
  out=$(run_limited "$t" 2>&1); rc=$?
  took=$(wall "$t0")
  line=$(printf '%s\n' "$out" | grep -E '^[a-z_0-9]+: [0-9]+ passed, [0-9]+ failed' | tail -n 1)
  if [ -z "$line" ] || [ $rc -ne 0 ]; then
    printf '%s\n' "$out" | tail -n 40
  fi
  if timed_out $rc; then
    echo "$name: TIMED OUT after ${tmo}s and was killed (SPARQ_TEST_TIMEOUT)$took"
    crashed="$crashed $name"; total_fail=$((total_fail + 1)); continue
  fi
  if [ -z "$line" ]; then
    echo "$name: CRASHED or printed no summary (exit $rc)$took"
    crashed="$crashed $name"; total_fail=$((total_fail + 1)); continue
  fi
  echo "$line$took"
  # every skip says why, on the next lines (unless already shown above)
  [ $rc -eq 0 ] && printf '%s\n' "$out" | sed -nE 's/^SKIP (.*)/  skipped: \1/p'
  count_line "$line"
  [ $rc -ne 0 ] && [ "$LAST_FAIL" -eq 0 ] && total_fail=$((total_fail + 1))
  ci_skips "$name" <<< "$(printf '%s\n' "$out" | sed -nE 's/^SKIP (.*)/\1/p')"
done

# ---- the Python package (pytest) -------------------------------------------
# Debian's python3 has python3-pytest (scripts/setup.sh); $PYTHON overrides.
py=${PYTHON:-}
run_py=1
if [ -n "${SPARQ_TESTS:-}" ]; then case " $SPARQ_TESTS " in *" python "*) ;; *) run_py=0 ;; esac; fi
if [ -z "$py" ]; then
  for cand in /usr/bin/python3 python3; do
    if command -v "$cand" >/dev/null && "$cand" -c 'import pytest' 2>/dev/null; then py=$cand; break; fi
  done
fi
if [ $run_py -eq 0 ]; then
  :
elif [ -z "$py" ]; then
  echo "python: no python3 with pytest (scripts/setup.sh installs python3-pytest)"
  total_fail=$((total_fail + 1)); crashed="$crashed python"
elif [ -d tests/python ]; then
  junit=$(mktemp /tmp/sparq_pytest_XXXXXX.xml)
  pre=""
  # A sanitizer build's library needs its runtime loaded first.
  if readelf -d "$build/libsparq.so" 2>/dev/null | grep -q libasan; then
    pre="$(${CC:-cc} -print-file-name=libasan.so):$(${CC:-cc} -print-file-name=libubsan.so)"
  fi
  t0=$(now_ms)
  out=$(PYTHONDONTWRITEBYTECODE=1 LD_PRELOAD="$pre" ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0}" \
        run_limited "$py" -m pytest -q -rs -p no:cacheprovider --junitxml="$junit" tests/python 2>&1); rc=$?
  took=$(wall "$t0")
  timed_out $rc && echo "python: pytest TIMED OUT after ${tmo}s and was killed (SPARQ_TEST_TIMEOUT)"
  counts=$("$py" - "$junit" <<'PYEOF'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception:
    sys.exit(1)
suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
t = f = s = 0
for st in suites:
    t += int(st.get("tests", 0)); s += int(st.get("skipped", 0))
    f += int(st.get("failures", 0)) + int(st.get("errors", 0))
print(t - f - s, f, s)
for case in root.iter("testcase"):
    for sk in case.findall("skipped"):
        print("SKIP", (sk.get("message") or "").replace("\n", " "))
PYEOF
)
  rm -f "$junit"
  if [ -z "$counts" ] || [ $rc -gt 1 ]; then
    printf '%s\n' "$out" | tail -n 40
    echo "python: pytest CRASHED or reported nothing (exit $rc)$took"
    crashed="$crashed python"; total_fail=$((total_fail + 1))
  else
    [ $rc -ne 0 ] && printf '%s\n' "$out" | tail -n 60
    set -- $(printf '%s\n' "$counts" | head -n 1)
    line="python: $1 passed, $2 failed"
    [ "$3" -gt 0 ] && line="$line, $3 skipped"
    echo "$line$took"
    printf '%s\n' "$counts" | sed -nE 's/^SKIP (.*)/\1/p' | sort | uniq -c | sed -E 's/^ *([0-9]+) /  skipped (x\1): /'
    count_line "$line"
    [ $rc -ne 0 ] && [ "$2" -eq 0 ] && total_fail=$((total_fail + 1))
    ci_skips python <<< "$(printf '%s\n' "$counts" | sed -nE 's/^SKIP (.*)/\1/p')"
  fi
fi

[ -n "$crashed" ] && echo "crashed:$crashed"
[ -n "$ci_fail" ] && echo "CI: skips for missing reference data in:$ci_fail"
echo "$total_pass passed, $total_fail failed, $total_skip skipped"
[ "$total_fail" -eq 0 ]

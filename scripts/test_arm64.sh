#!/usr/bin/env bash
# `make test-arm64`: runs the ARM64 cross build (BUILD, default build-arm64)
# under qemu-user. Every NEON kernel twin is checked against its plain-C
# reference twin by the kernel tests (each compares the level running with
# the reference, zero tolerance), and test_model checks stories260K's
# logits and greedy tokens against the same llama.cpp golden files the x86
# suite uses (../shared). The tests run here at the best level (the
# emulated CPU, qemu's "max", has dotprod: neon+dotprod), and test_cpu runs
# the kernel tests and test_model again at neon (SPARQ_TEST_LEVELS; the
# plain-C level is the code the x86 suite checks, and under emulation
# each program costs minutes). binfmt_misc is not needed: each program
# is started through qemu explicitly. Prints "N passed, M failed, K skipped".
set -u
build=${1:-build-arm64}
qemu=${QEMU_AARCH64:-qemu-aarch64-static}
sysroot=${ARM64_SYSROOT:-/usr/aarch64-linux-gnu}
levels=${ARM64_LEVELS:-neon+dotprod}
tests=${ARM64_TESTS:-test_quant test_gemm test_attn test_prefill test_index test_model test_generate test_cpu}
export SPARQ_BUILD="$build" SPARQ_TEST_QUICK=1 SPARQ_TEST_RUNNER="$qemu -L $sysroot" \
  SPARQ_TEST_LEVELS=${SPARQ_TEST_LEVELS:-neon}
command -v "$qemu" >/dev/null || { echo "test-arm64: $qemu not found (scripts/setup.sh installs qemu-user-static)" >&2; exit 1; }
run() { "$qemu" -L "$sysroot" "$@"; }
pass=0; fail=0; skip=0; failed=""

# `sparq --version` names the level chosen, and each level forced
for lv in "" neon neon+dotprod ref; do
  out=$(SPARQ_CPU=$lv run "$build/sparq" --version 2>&1)
  want=${lv:-neon+dotprod}
  if printf '%s' "$out" | grep -qF "cpu $want)"; then pass=$((pass + 1))
  else echo "sparq --version at SPARQ_CPU=${lv:-(unset)}: '$out', want 'cpu $want)'"; fail=$((fail + 1)); failed="$failed version"; fi
done
out=$(SPARQ_CPU=avx2 run "$build/sparq" --version 2>&1); rc=$?
if [ $rc -eq 2 ] && printf '%s' "$out" | grep -q "cannot run"; then pass=$((pass + 1))
else echo "SPARQ_CPU=avx2 on ARM64: exit $rc, '$out'"; fail=$((fail + 1)); failed="$failed version-avx2"; fi

for lv in $levels; do
  for t in $tests; do
    [ -x "$build/tests/$t" ] || { echo "$t: not built"; fail=$((fail + 1)); failed="$failed $t"; continue; }
    start=$(date +%s)
    out=$(SPARQ_CPU=$lv run "$build/tests/$t" 2>&1); rc=$?
    line=$(printf '%s\n' "$out" | grep -E "^$t: [0-9]+ passed, [0-9]+ failed" | tail -n 1)
    if [ -z "$line" ] || [ $rc -ne 0 ] || ! printf '%s' "$line" | grep -q ' 0 failed'; then
      printf '%s\n' "$out" | grep -vE '^ok ' | tail -n 30
      echo "$t at $lv: exit $rc: ${line:-no summary}"
      fail=$((fail + 1)); failed="$failed $t@$lv"; continue
    fi
    if [ "$t" = test_quant ] && ! printf '%s\n' "$out" | grep -qxF "kernels: $lv"; then
      echo "test_quant at $lv did not run the $lv kernels"; fail=$((fail + 1)); failed="$failed $t@$lv"; continue
    fi
    p=$(printf '%s' "$line" | sed -E 's/^[^:]+: ([0-9]+) passed.*/\1/')
    s=$(printf '%s' "$line" | sed -nE 's/.*, ([0-9]+) skipped.*/\1/p')
    pass=$((pass + p)); skip=$((skip + ${s:-0}))
    printf '%s\n' "$out" | grep -E '^SKIP' | sed "s/^/  $t@$lv: /"
    echo "SPARQ_CPU=$lv $line ($(( $(date +%s) - start ))s)"
  done
done
echo "test-arm64: $pass passed, $fail failed, $skip skipped${failed:+ (failed:$failed)}"
[ $fail -eq 0 ]

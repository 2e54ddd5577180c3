#!/usr/bin/env bash
# eval_adaptive_k.sh - SparQ's per-head adaptive k against fixed k on the
# fidelity task of docs/EVALUATION.md ("Per-head adaptive k on tiny-d64"):
# same model, texts and windows as scripts/eval_testmodel.sh, raw JSON kept.
#
# usage: scripts/eval_adaptive_k.sh [--out DIR] [--model GGUF] [--quick]
#   --out DIR    results (default docs/eval-results/adaptive-k)
#   --model F    the model (default models/tiny-d64.gguf)
#   --quick      2 windows per run (a smoke test; not for the report)
# environment: THREADS (default 2), SPARQ (default build/sparq)
#
# Runs, each on WikiText-2 (test) and the held-out tenth of Tiny Shakespeare:
#   fixed      SparQ at the ratios 1/2 .. 1/16 (r, k from the ratio rule)
#   adaptive   the same r and k, --sparq-adaptive-k: the group's g*k
#              positions shared by entropy (same total budget)
# and on WikiText-2 at r = 8 (the ratio 1/8's r), k = 116 (its k at S ~ 1920):
#   perhead    --sparq-adaptive-k --sparq-k-min 116: every head exactly k, each
#              by its own scores (per-head selection without the allotment)
#   fixed2k    fixed SparQ with k = 232 = g*k: every head gets the whole
#              budget the adaptive step may read (its transfer bound)
# Each run writes DIR/NAME.json (`--json`) and DIR/NAME.err (its stderr);
# DIR/commands.txt has every command; DIR/report.md the tables.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=docs/eval-results/adaptive-k MODEL=models/tiny-d64.gguf LIMIT=16
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --quick) LIMIT=2; shift ;;
    -h|--help) sed -n 2,24p "$0"; exit 0 ;;
    *) echo "error: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
. scripts/eval_setup.sh

run() { # NAME ARGS...: sparq ARGS --json > OUT/NAME.json
  local name=$1; shift
  echo "$SPARQ $* -m $MODEL -t $T --json > $name.json" | sed "s|$WORK/|<work>/|g" >> "$OUT/commands.txt"
  if ! "$SPARQ" "$@" -m "$MODEL" -t "$T" --json > "$OUT/$name.json" 2> "$OUT/$name.err"; then
    echo "error: $name failed: $(tail -1 "$OUT/$name.err")" >&2
    exit 1
  fi
  sed -i "s|$WORK/|<work>/|g" "$OUT/$name.json" "$OUT/$name.err"
  echo "$name: done" >&2
}

for text in wiki shakespeare; do
  f=$WIKI; [ $text = shakespeare ] && f=$SHAKE
  run fixed_$text eval fidelity --attn sparq --sweep ratio=$RATIOS --limit $LIMIT -f "$f"
  run adaptive_$text eval fidelity --attn sparq --sweep ratio=$RATIOS --sparq-adaptive-k --limit $LIMIT -f "$f"
done
run perhead_wiki eval fidelity --attn sparq --sparq-r 8 --sweep k=116 --sparq-adaptive-k --sparq-k-min 116 \
    --limit $LIMIT -f "$WIKI"
run fixed_k116_232_wiki eval fidelity --attn sparq --sparq-r 8 --sweep k=116,232 --limit $LIMIT -f "$WIKI"
run adaptive_k116_wiki eval fidelity --attn sparq --sparq-r 8 --sweep k=116 --sparq-adaptive-k --limit $LIMIT \
    -f "$WIKI"

/usr/bin/python3 - "$OUT" > "$OUT/report.md" <<'EOF'
import json, sys, os
out = sys.argv[1]
def rows(name):
    return [r for r in json.load(open(os.path.join(out, name + ".json")))["rows"] if r["policy"] == "sparq"]
def cell(r):
    return "%.4f +-%.4f | %.5f +-%.5f | %.1f | %.3f" % (r["top1_agreement"], r["stderr"], r["kl_mean"],
                                                     r["kl_stderr"], r["first_divergence"], r["transfer_ratio"])
print("# SparQ adaptive k vs fixed k, tiny-d64 fidelity (top-1, KL, first divergence, measured transfer)\n")
for text in ("wiki", "shakespeare"):
    print("## %s\n" % text)
    print("| ratio | params | fixed top-1 | KL | first div. | transfer | adaptive top-1 | KL | first div. | transfer |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for a, b in zip(rows("fixed_" + text), rows("adaptive_" + text)):
        print("| %s | %s | %s | %s |" % (a["params"].split()[0], " ".join(a["params"].split()[1:]), cell(a), cell(b)))
    print()
print("## wiki, r = 8, k = 116 (and 232)\n")
print("| run | params | top-1 | KL | first div. | transfer |")
print("|---|---|---|---|---|---|")
for name in ("fixed_k116_232_wiki", "adaptive_k116_wiki", "perhead_wiki"):
    for r in rows(name):
        print("| %s | %s | %s |" % (name, r["params"], cell(r)))
EOF
echo "wrote $OUT (report.md, *.json)" >&2

#!/usr/bin/env bash
# eval_testmodel.sh - the evaluations of docs/EVALUATION.md ("Results on
# tiny-d64") on the trained test model, raw JSON kept for the report.
#
# usage: scripts/eval_testmodel.sh [--out DIR] [--model GGUF] [--quick]
#   --out DIR    results (default docs/eval-results/tiny-d64)
#   --model F    the model (default models/tiny-d64.gguf)
#   --quick      2 windows / examples per run (a smoke test; not for the report)
# environment: THREADS (default 2), SPARQ (default build/sparq)
#
# Held-out text: WikiText-2 test (never trained on) and the last 10% of Tiny
# Shakespeare (cut exactly as scripts/train_testmodel.py cuts it, recreated
# here from ../shared so no third-party text is committed).
# Each run writes DIR/NAME.json (`--json`) and DIR/NAME.err (its stderr);
# DIR/commands.txt has every command; then scripts/eval_report.py turns the
# JSON into the tables of docs/EVALUATION.md (DIR/report.md).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=docs/eval-results/tiny-d64 MODEL=models/tiny-d64.gguf LIMIT=16 LIMIT_T=24 LIMIT_Q=20
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --quick) LIMIT=2 LIMIT_T=2 LIMIT_Q=2; shift ;;
    -h|--help) sed -n 2,17p "$0"; exit 0 ;;
    *) echo "error: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
. scripts/eval_setup.sh

run() { # NAME ARGS...: sparq ARGS --json > OUT/NAME.json
  local name=$1; shift
  echo "$SPARQ $* -m $MODEL -t $T --json > $name.json" | sed "s|$WORK/|<work>/|g" >> "$OUT/commands.txt"
  local t0=$SECONDS
  if ! "$SPARQ" "$@" -m "$MODEL" -t "$T" --json > "$OUT/$name.json" 2> "$OUT/$name.err"; then
    echo "error: $name failed: $(tail -1 "$OUT/$name.err")" >&2
    exit 1
  fi
  sed -i "s|$WORK/|<work>/|g" "$OUT/$name.json" "$OUT/$name.err"
  echo "$name: $((SECONDS - t0)) s" >&2
}

# fidelity on held-out text: every policy at every ratio, then the same k for all
run fidelity_wiki eval fidelity --attn all --sweep ratio=$RATIOS --limit $LIMIT -f "$WIKI"
run fidelity_shakespeare eval fidelity --attn all --sweep ratio=$RATIOS --limit $LIMIT -f "$SHAKE"
run fidelity_wiki_matchk eval fidelity --attn sparq,oracle,flexgen,h2o,streaming --sweep ratio=$RATIOS \
    --match k --limit $LIMIT -f "$WIKI"
# bits per character, teacher-forced (WikiText-2: never trained on)
run wikitext eval wikitext --attn dense,sparq,h2o,streaming --sweep ratio=$RATIOS --limit $LIMIT_T
# repetition: copy an excerpt of the context (held-out Shakespeare)
run repetition eval repetition --attn dense,sparq,h2o,streaming --sweep ratio=$RATIOS --limit $LIMIT_T \
    --data "$SHAKE"
# attention statistics (the paper's Figure 4) on WikiText
run stats stats -f "$WIKI" --n-query 64 --stats-k 32
# the plot needs matplotlib (scripts/setup.sh --train installs it); without
# it the figures are all in stats.json and the rest of the runs go on
if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  /usr/bin/python3 scripts/plot_stats.py "$OUT/stats.json" -o "$OUT/stats.png" \
      --title "tiny-d64 (d = 64) on WikiText-2: query kurtosis, top-32 agreement by r, alpha vs mass"
else
  echo "note: stats.png not redrawn: Debian's python3-matplotlib is not installed (scripts/setup.sh --train)" >&2
fi
# the other tasks end to end
for t in squad triviaqa cnndm kvret; do
  run "$t" eval $t --limit $LIMIT_Q --attn dense,sparq,h2o,streaming --sweep ratio=1/4,1/8
done
run niah eval niah --niah-depths 5 --attn dense,sparq,h2o,streaming --sweep ratio=1/4,1/8
/usr/bin/python3 scripts/eval_report.py "$OUT" > "$OUT/report.md"
echo "wrote $OUT (report.md, *.json, stats.png)" >&2

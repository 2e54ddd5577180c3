# eval_setup.sh - sourced by the tiny-d64 evaluation scripts (eval_testmodel.sh,
# eval_adaptive_k.sh) after they parse OUT and MODEL: the binary, the data
# on the search path, the held-out Shakespeare cut once the same way for
# both, and the header of OUT/commands.txt.
SPARQ=${SPARQ:-build/sparq}
T=${THREADS:-2}
DATA=../shared/data/text
# the evaluation data (data/qa, data/text) is found on the search path
export SPARQ_MODEL_PATH="${SPARQ_MODEL_PATH:+$SPARQ_MODEL_PATH:}../shared/models:../shared"
[ -x "$SPARQ" ] || { echo "error: $SPARQ not built (make)" >&2; exit 1; }
[ -r "$MODEL" ] || { echo "error: $MODEL not found (make testmodel)" >&2; exit 1; }
[ -r "$DATA/wikitext-2-raw_wiki.test.raw" ] || { echo "error: $DATA not found (../shared)" >&2; exit 1; }
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# the held-out Shakespeare: from the last blank line before 90% of the file
/usr/bin/python3 - "$DATA/tinyshakespeare_input.txt" "$WORK/heldout_shakespeare.txt" <<'PY'
import sys
s = open(sys.argv[1], encoding="utf-8").read()
cut = s.rfind("\n\n", 0, int(len(s) * 0.9)) + 2
open(sys.argv[2], "w", encoding="utf-8").write(s[cut:])
PY
WIKI=$DATA/wikitext-2-raw_wiki.test.raw
SHAKE=$WORK/heldout_shakespeare.txt
RATIOS=1/2,1/4,1/8,1/16
: > "$OUT/commands.txt"
{ echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null || echo '?')"; \
  echo "# model $MODEL sha256 $(sha256sum "$MODEL" | cut -d' ' -f1)"; \
  echo "# heldout_shakespeare.txt = last 10% of tinyshakespeare_input.txt (scripts/eval_setup.sh)"; } >> "$OUT/commands.txt"

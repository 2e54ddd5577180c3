#!/usr/bin/env bash
# bench_million.sh - a document of N tokens end to end on this machine:
# sparse prefill into a KV file (q8_0, built in the file), then a question
# asked of the loaded file. Prints one summary line and keeps every raw
# output.
#
# usage: scripts/bench_million.sh [--shape S] [--type T] [--tokens N] [--out | --results DIR]
#                                 [-- EXTRA PREFILL OPTIONS]
#   --shape S       gen-model shape (default smollm2-135m; e.g. llama-3.2-1b)
#   --type T        weight type (default Q8_0)
#   --tokens N      document tokens (default 1048576; k/M suffixes as bench lists take)
#   --out           results in docs/bench-results/million-<UTC date>-<shape>-<tokens>/ (to commit)
#   --results DIR   results in DIR (default /tmp/sparq-bench-million)
# environment:
#   MODEL_DIR=DIR   generated models (default /tmp/sparq-bench-models, shared with bench.sh)
#   WORK=DIR        the document and the KV file (default /tmp/sparq-bench-million-work;
#                   the file of a 1M-token smollm2 cache is ~12 GB)
#   THREADS=N       threads (default 2)
#
# The document is the texts of ../shared/data/text (essays, Tiny Shakespeare,
# WikiText-2) concatenated and repeated until it has N tokens: repetition is
# part of the document, which the results say. The model has random weights
# (gen-model), so the answer text means nothing; times and memory are what
# is measured. Time to the first answer token = loading the file + the
# question (fed through the topk policy, --prefill-attn policy) + one token;
# with --kv-preload the load (reading the file into memory) is given apart.
set -euo pipefail
cd "$(dirname "$0")/.."
shape=smollm2-135m type=Q8_0 tokens=1048576 results=/tmp/sparq-bench-million out=0
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --shape) shape=$2; shift 2 ;;
    --type) type=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    --out) out=1; shift ;;
    --results) results=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "bench_million: unknown option '$1'" >&2; exit 2 ;;
  esac
done
case $tokens in *k|*K) tokens=$(( ${tokens%[kK]} * 1024 )) ;; *M|*m) tokens=$(( ${tokens%[mM]} * 1048576 )) ;; esac
[[ $tokens =~ ^[0-9]+$ ]] && [ "$tokens" -ge 1024 ] || { echo "bench_million: --tokens must be >= 1024" >&2; exit 2; }
[ $out = 1 ] && results=docs/bench-results/million-$(date -u +%Y%m%dT%H%M)-$shape-$tokens
S=./build/sparq
MODEL_DIR=${MODEL_DIR:-/tmp/sparq-bench-models}
WORK=${WORK:-/tmp/sparq-bench-million-work}
THREADS=${THREADS:-2}
mkdir -p "$results" "$MODEL_DIR" "$WORK"
make -s all >/dev/null
model=$MODEL_DIR/$shape-${type,,}.gguf
[ -f "$model" ] || $S gen-model --shape "$shape" --type "$type" -o "$model" >&2

# the document: the shared texts, repeated, cut to N tokens by the prefill's own count
data=../shared/data/text
doc=$WORK/doc-$tokens.txt
if [ ! -s "$doc" ]; then
  src=("$data/PaulGrahamEssays_all_sorted.txt" "$data/tinyshakespeare_input.txt" "$data/wikitext-2-raw_wiki.test.raw")
  for f in "${src[@]}"; do [ -f "$f" ] || { echo "bench_million: $f missing" >&2; exit 1; }; done
  : > "$doc"
  # ~1.5 bytes a token for gen-model's byte-heavy vocabulary: 2 bytes a token is enough
  while [ "$(stat -c %s "$doc")" -lt $(( tokens * 2 )) ]; do cat "${src[@]}" >> "$doc"; done
fi
# keep the first N tokens' worth of bytes: bisect on the byte length with the tokenizer
cut=$WORK/doc-cut-$tokens.txt
lo=1; hi=$(stat -c %s "$doc")
while [ $((hi - lo)) -gt 64 ]; do
  mid=$(( (lo + hi) / 2 ))
  head -c $mid "$doc" > "$cut"
  # `run -c 1` refuses the document and says how many tokens it has
  n=$( { $S run -m "$model" -f "$cut" -n 0 -c 1 2>&1 || true; } | sed -nE 's/.*the prompt has ([0-9]+) tokens.*/\1/p')
  if [ "${n:-0}" -le "$tokens" ]; then lo=$mid; else hi=$mid; fi
done
head -c $lo "$doc" > "$cut"

{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  lscpu | grep -E "Model name|^CPU\(s\)|Flags" | sed 's/^Flags:.*\(avx512[a-z_]*\).*/Flags: ... \1 .../'
  free -g | sed -n 2p
  df -h "$WORK" | tail -1
  echo "model: $model (random weights, gen-model --shape $shape --type $type)"
  echo "document: $cut, $(stat -c %s "$cut") bytes of ../shared/data/text (essays, Tiny Shakespeare, WikiText-2) repeated"
} > "$results/machine.txt"

kv=$WORK/doc-$shape-$tokens.kv
rm -f "$kv" "$kv.tmp"
ctx=$(( tokens + 4096 ))
prefill=("$S" prefill -m "$model" -f "$cut" -c $ctx --kv-type q8_0 --prefill-attn topk --index ivf
         --save-kv "$kv" -t "$THREADS" --json --progress "${extra[@]}")
echo "${prefill[*]}" > "$results/commands.txt"
SPARQ_PROGRESS_SECONDS=60 /usr/bin/time -v "${prefill[@]}" > "$results/prefill.json" 2> "$results/prefill.log"
sync
ask=("$S" run -m "$model" --load-kv "$kv" --attn topk --index ivf --prefill-attn policy -t "$THREADS"
     -p " Question: what did the author of the essays say about startups? Answer:" -n 16 --temp 0 --ignore-eos --json)
echo "${ask[*]}" >> "$results/commands.txt"
# Two asks, each from a cold page cache (root drops it; otherwise said so):
# reading the file on demand (ask.json), then with --kv-preload
# (ask-preload.json), which reads the file in one sequential pass first
# when it fits the memory, as `serve --kv-preload` does once at start.
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(page cache not dropped: not root)" >> "$results/machine.txt"; }
drop
/usr/bin/time -v "${ask[@]}" > "$results/ask.json" 2> "$results/ask.log"
echo "${ask[*]} --kv-preload" >> "$results/commands.txt"
drop
/usr/bin/time -v "${ask[@]}" --kv-preload > "$results/ask-preload.json" 2> "$results/ask-preload.log"

/usr/bin/python3 - "$results" <<'EOF'
import json, re, sys
d = sys.argv[1]
p = json.load(open(d + "/prefill.json"))
def ask(name):
    a = json.load(open(d + "/" + name))
    per_tok = (a["decode_ms"] / 1e3) / max(1, len(a["tokens"]) - 1)
    return a, a["prefill_ms"] / 1e3 + per_tok, per_tok
a, q_first, per_tok = ask("ask.json")
b, qb_first, per_tok_b = ask("ask-preload.json")
s = ("tokens %d | prefill %.0f s (%.1f tok/s) | file %.2f GiB (%.2f GiB on disk) | peak private %.2f GiB, "
     "peak RSS %.2f GiB | read on demand: first answer token %.1f s after start (load %.1f s, question + a token %.1f s), "
     "decode %.3f s/token | --kv-preload: load %.1f s, then first answer token %.1f s, decode %.3f s/token"
     % (p["tokens"], p["prefill_s"], p["tokens"] / p["prefill_s"], p["file_bytes"] / 2**30, p["disk_bytes"] / 2**30,
        p["peak_private_bytes"] / 2**30, p["peak_rss_bytes"] / 2**30, a["load_ms"] / 1e3 + q_first, a["load_ms"] / 1e3,
        q_first, per_tok, b["load_ms"] / 1e3, qb_first, per_tok_b))
open(d + "/summary.txt", "w").write(s + "\n")
print(s)
EOF

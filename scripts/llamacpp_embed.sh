#!/usr/bin/env bash
# llamacpp_embed.sh - have llama-server compute pooled embeddings of a few
# prompts (/v1/embeddings), the reference tests/test_embed.c compares
# sparq's embeddings with.
#
# usage: scripts/llamacpp_embed.sh LLAMA_BIN_DIR MODEL OUT_JSON POOLING NORMALIZE PROMPT...
#   LLAMA_BIN_DIR  directory holding llama-server (a llama.cpp build's bin/)
#   MODEL          the GGUF
#   OUT_JSON       written: {"pooling", "normalize", "inputs", "tokens", "embeddings"}
#   POOLING        mean, last or cls (llama-server --pooling)
#   NORMALIZE      the request's embd_normalize (2 = L2, -1 = none)
#   PROMPT...      the inputs, sent as one array; tokens are llama-server's
#                  /tokenize with add_special (BOS as the model says)
set -euo pipefail
[ $# -ge 6 ] || { sed -n 2,13p "$0" >&2; exit 2; }
bin=$1 model=$2 out=$3 pooling=$4 norm=$5
shift 5
[ -x "$bin/llama-server" ] || { echo "llamacpp_embed: no llama-server in $bin" >&2; exit 1; }
dir=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin/llama-server" -m "$model" --host 127.0.0.1 --port "$port" -np 1 -t "${THREADS:-1}" -c 512 \
  --embedding --pooling "$pooling" > "$dir/server.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break
  kill -0 $pid 2>/dev/null || { cat "$dir/server.log" >&2; exit 1; }
  sleep 0.5
done
/usr/bin/python3 - "$port" "$out" "$pooling" "$norm" "$@" <<'PY'
import json, sys, urllib.request
port, out, pooling, norm, prompts = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:]
def post(path, body):
    req = urllib.request.Request("http://127.0.0.1:%s%s" % (port, path), data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)
r = post("/v1/embeddings", {"input": prompts, "embd_normalize": norm})
toks = [post("/tokenize", {"content": p, "add_special": True})["tokens"] for p in prompts]
assert r["usage"]["prompt_tokens"] == sum(len(t) for t in toks)
doc = {"pooling": pooling, "normalize": norm, "inputs": prompts, "tokens": toks,
       "embeddings": [d["embedding"] for d in sorted(r["data"], key=lambda d: d["index"])]}
with open(out, "w") as f:
    json.dump(doc, f)
    f.write("\n")
PY

#!/usr/bin/env bash
# llamacpp_state.sh - have llama.cpp prefill a prompt and save the sequence
# state (what `sparq import --llama-state` reads), through llama-server's
# slot save, as a user who prefilled on a GPU would.
#
# usage: scripts/llamacpp_state.sh LLAMA_BIN_DIR MODEL PROMPT_FILE OUT [LLAMA-SERVER OPTIONS...]
#   LLAMA_BIN_DIR  directory holding llama-server (a llama.cpp build's bin/)
#   MODEL          the GGUF (the same file sparq imports with)
#   PROMPT_FILE    text to prefill (llama-server adds BOS as the model says)
#   OUT            the state file to write
#   options        passed to llama-server, e.g. -fa on -ctk q8_0 -ctv q8_0 -c 4096
# One token is generated after the prompt (llama-server needs n_predict >= 1);
# the state's token list then has one id more than its cached positions,
# which the import reports and leaves out.
set -euo pipefail
[ $# -ge 4 ] || { sed -n 2,14p "$0" >&2; exit 2; }
bin=$1 model=$2 prompt=$3 out=$4
shift 4
[ -x "$bin/llama-server" ] || { echo "llamacpp_state: no llama-server in $bin" >&2; exit 1; }
dir=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin/llama-server" -m "$model" --host 127.0.0.1 --port "$port" -np 1 -t "${THREADS:-2}" \
  --slot-save-path "$dir" "$@" > "$dir/server.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break
  kill -0 $pid 2>/dev/null || { cat "$dir/server.log" >&2; exit 1; }
  sleep 0.5
done
/usr/bin/python3 - "$prompt" "$port" <<'EOF'
import json, sys, urllib.request
text = open(sys.argv[1], encoding="utf-8").read()
def post(path, body):
    req = urllib.request.Request("http://127.0.0.1:%s%s" % (sys.argv[2], path), data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=36000) as r:
        return json.load(r)
r = post("/completion", {"prompt": text, "n_predict": 1, "temperature": 0, "cache_prompt": True})
print("llama.cpp: prompt %d tokens in %.1f ms" % (r["timings"]["prompt_n"], r["timings"]["prompt_ms"]), file=sys.stderr)
post("/slots/0?action=save", {"filename": "state.bin"})
EOF
cp "$dir/state.bin" "$out"
"$bin/llama-server" --version 2>&1 | grep -E "version|built" | sed 's/^/llama.cpp /' >&2 || true
echo "wrote $out ($(stat -c %s "$out") bytes)" >&2

#!/usr/bin/env bash
# bench_prefill_llamacpp.sh - llama.cpp's exact prefill of a long document,
# timed as a user meets it: llama-server given the document as one prompt,
# the time to its first token. Its prompt-processing progress lines are
# kept with timestamps, so a run stopped at a time limit still says how far
# the prefill got and when (a measured lower bound on its total, never an
# extrapolation).
#
# usage: scripts/bench_prefill_llamacpp.sh LLAMA_BIN_DIR MODEL DOC LIMIT_S RESULTS_DIR [LLAMA-SERVER OPTIONS...]
#   LIMIT_S   seconds after which the prefill is stopped (0: none)
# Writes RESULTS_DIR/llamacpp-server.log, llamacpp-progress.txt (seconds since
# the request, tokens done), llamacpp-summary.txt.
set -euo pipefail
[ $# -ge 5 ] || { sed -n 2,13p "$0" >&2; exit 2; }
bin=$1 model=$2 doc=$3 limit=$4 out=$5
shift 5
mkdir -p "$out"
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
tok=$(( $(stat -c %s "$doc") / 2 + 8192 ))
"$bin/llama-server" -m "$model" --host 127.0.0.1 --port "$port" -np 1 -t "${THREADS:-2}" -c "${CTX:-$tok}" \
  --log-timestamps "$@" > "$out/llamacpp-server.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 1200); do
  curl -sf "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break
  kill -0 $pid 2>/dev/null || { tail -5 "$out/llamacpp-server.log" >&2; exit 1; }
  sleep 0.5
done
echo "llama-server $* (pid $pid, port $port); $("$bin/llama-server" --version 2>&1 | tr '\n' ' ')" > "$out/llamacpp-summary.txt"
/usr/bin/python3 - "$doc" "$port" "$limit" "$out" "$pid" <<'EOF'
import json, os, re, sys, threading, time, urllib.request
doc, port, limit, out, pid = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], int(sys.argv[5])
text = open(doc, encoding="utf-8").read()
result = {}
def ask():
    req = urllib.request.Request("http://127.0.0.1:%s/completion" % port,
                                 data=json.dumps({"prompt": text, "n_predict": 1, "temperature": 0}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10 ** 6) as r:
            result["reply"] = json.load(r)
    except Exception as e:
        result["error"] = str(e)
    result["t"] = time.time()
t0 = time.time()
th = threading.Thread(target=ask, daemon=True)
th.start()
log = open(out + "/llamacpp-server.log", errors="replace")
prog = open(out + "/llamacpp-progress.txt", "w")
prog.write("# seconds since the request, prompt tokens processed (llama-server's progress lines)\n")
last = 0
while th.is_alive() and (limit <= 0 or time.time() - t0 < limit):
    for line in log.readlines():
        m = re.search(r"n_tokens =\s*(\d+), progress =\s*([0-9.]+)", line)
        if m and "prompt processing" in line:
            prog.write("%.1f %s\n" % (time.time() - t0, m.group(1)))
            prog.flush()
            last = int(m.group(1))
    time.sleep(1.0)
for line in log.readlines():
    m = re.search(r"n_tokens =\s*(\d+), progress =\s*([0-9.]+)", line)
    if m and "prompt processing" in line:
        last = int(m.group(1))
s = open(out + "/llamacpp-summary.txt", "a")
if "reply" in result:
    t = result["reply"]["timings"]
    s.write("finished: prompt %d tokens, prompt_ms %.0f (%.1f tok/s); first token %.1f s after the request\n"
            % (t["prompt_n"], t["prompt_ms"], t["prompt_per_second"], result["t"] - t0))
elif "error" in result:
    s.write("failed after %.1f s: %s\n" % (result["t"] - t0, result["error"]))
else:
    s.write("stopped at the limit: %.0f s after the request, %d prompt tokens processed, not finished\n"
            % (time.time() - t0, last))
s.close()
print(open(out + "/llamacpp-summary.txt").read(), end="")
EOF

# Per commit: tok/s of each (policy, depth) and pp512@2048, both rounds, in run order.
import json
order = ["685fa1e", "50c43a8", "6971e25", "27ed68f"]
print("| commit | round | dense 0 | dense 4096 | dense 16384 | SparQ 0 | SparQ 4096 | SparQ 16384 | pp512 at 2048 |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for c in order:
    for r in (1, 2):
        d = json.load(open(f"decode-{c}-{r}.json"))
        row = {(x["policy"], x["depth"]): x["tok_s"] for x in d}
        p = json.load(open(f"prefill-{c}-{r}.json"))[0]["tok_s"]
        cells = [row[(pol, dep)] for pol in ("dense", "sparq") for dep in (0, 4096, 16384)]
        print(f"| {c} | {r} | " + " | ".join(f"{v:.1f}" for v in cells) + f" | {p:.1f} |")

#!/usr/bin/env python3
"""Tables of a scripts/bench_levels.sh run, from its raw files only.

usage: bench_levels_summary.py DIR

Decode tok/s is tokens / total time (tok_s_mean; llama-bench's definition),
the median step's rate beside it; prefill tok/s is from the median
repetition. llama.cpp: mean +- sd of its repetitions, the better -fa counts.
"""
import glob
import json
import os
import statistics
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def best_llama(rows, **match):
    best = None
    for r in rows or []:
        if all(r.get(k) == v for k, v in match.items()):
            if best is None or r["avg_ts"] > best["avg_ts"]:
                best = r
    return best


def llama_cell(b):
    if not b:
        return "not run", None
    return "%.2f ± %.2f (-fa %s)" % (b["avg_ts"], b["stddev_ts"], b["flash_attn"]), b["avg_ts"]


def ratio(a, b):
    return "%.2fx" % (a / b) if a and b else "-"


def main():
    out = sys.argv[1]
    levels = ["avx2", "avx512", "ref"]

    print("## Decode, smollm2-135m Q8_0 (scaled weights), 32 tokens after a random fill to the depth")
    print()
    print("| depth | policy | llama.cpp AVX2 (best -fa) | sparq avx2 | avx2 / llama.cpp | sparq avx512 | sparq ref |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    ll = load(os.path.join(out, "llama-decode-smol.json"))
    runs = {lv: load(os.path.join(out, "decode-smol-%s.json" % lv)) or [] for lv in levels}
    depths = sorted({r["depth"] for rows in runs.values() for r in rows})
    for depth in depths:
        cell, lts = llama_cell(best_llama(ll, n_depth=depth, n_gen=32))
        for pol in ("dense", "sparq"):
            vals = {}
            for lv in levels:
                for r in runs[lv]:
                    if r["depth"] == depth and r["policy"] == pol:
                        vals[lv] = r
            def fmt(lv):
                r = vals.get(lv)
                return "%.2f (median step %.2f)" % (r["tok_s_mean"], r["tok_s"]) if r else "-"
            a = vals.get("avx2")
            name = pol if pol == "dense" else "SparQ 1/8 (r %d, k %d)" % (a["r"], a["k"]) if a else pol
            print("| %d | %s | %s | %s | %s | %s | %s |" % (
                depth, name, cell, fmt("avx2"), ratio(a["tok_s_mean"] if a else None, lts),
                fmt("avx512"), fmt("ref")))
    print()

    print("## Decode at depth 0, llama-3.2-1b Q8_0 (scaled weights), 32 tokens (ref: 8)")
    print()
    print("| llama.cpp AVX2 (best -fa) | sparq avx2 | avx2 / llama.cpp | sparq avx512 | sparq ref |")
    print("|---:|---:|---:|---:|---:|")
    cell, lts = llama_cell(best_llama(load(os.path.join(out, "llama-decode-l1b.json")), n_depth=0, n_gen=32))
    vals = {}
    for lv in levels:
        rows = load(os.path.join(out, "decode-l1b-%s.json" % lv)) or []
        vals[lv] = rows[0] if rows else None
    fmt = lambda r: "%.2f (median step %.2f)" % (r["tok_s_mean"], r["tok_s"]) if r else "-"
    a = vals["avx2"]
    print("| %s | %s | %s | %s | %s |" % (cell, fmt(a), ratio(a["tok_s_mean"] if a else None, lts),
                                          fmt(vals["avx512"]), fmt(vals["ref"])))
    print()

    print("## Prefill (tok/s, median of the repetitions, min..max)")
    print()
    print("| model | prompt | llama.cpp AVX2 (best -fa) | sparq avx2 | avx2 / llama.cpp | sparq avx512 | sparq ref |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    ll = load(os.path.join(out, "llama-prefill-l1b.json"))

    def pf(path):
        rows = load(path) or []
        if not rows:
            return "-", None
        r = rows[0]
        n = r["n_prompt"]
        return "%.1f (%.1f..%.1f)" % (r["tok_s"], n / (r["ms_max"] / 1e3), n / (r["ms_min"] / 1e3)), r["tok_s"]

    lens = sorted(int(os.path.basename(f).split("-")[2])
                  for f in glob.glob(os.path.join(out, "prefill-l1b-*-avx2.json")))
    for n in lens:
        cell, lts = llama_cell(best_llama(ll, n_prompt=n, n_gen=0))
        c2, v2 = pf(os.path.join(out, "prefill-l1b-%d-avx2.json" % n))
        c5, _ = pf(os.path.join(out, "prefill-l1b-%d-avx512.json" % n))
        print("| llama-3.2-1b Q8_0 | %d | %s | %s | %s | %s | - |" % (n, cell, c2, ratio(v2, lts), c5))
    cs = [pf(os.path.join(out, "prefill-smol-512-%s.json" % lv))[0] for lv in levels]
    print("| smollm2-135m Q8_0 | 512 | - | %s | - | %s | %s |" % (cs[0], cs[1], cs[2]))
    print()

    peer_rounds(out)

    ab = sorted(glob.glob(os.path.join(out, "ab-*-portable-decode.json")))
    if ab:
        print("## Run-time dispatch: portable build at avx512 against a -march=native build")
        print()
        print("| round | decode portable | decode native | prefill portable | prefill native |")
        print("|---:|---:|---:|---:|---:|")
        cols = {k: [] for k in ("pd", "nd", "pp", "np")}
        i = 1
        while True:
            files = {"pd": "ab-%d-portable-decode", "nd": "ab-%d-native-decode",
                     "pp": "ab-%d-portable-prefill", "np": "ab-%d-native-prefill"}
            rows = {k: load(os.path.join(out, (v % i) + ".json")) for k, v in files.items()}
            if not all(rows.values()):
                break
            vals = {k: rows[k][0]["tok_s"] for k in rows}
            for k in vals:
                cols[k].append(vals[k])
            print("| %d | %.2f | %.2f | %.1f | %.1f |" % (i, vals["pd"], vals["nd"], vals["pp"], vals["np"]))
            i += 1
        if cols["pd"]:
            md = {k: statistics.median(v) for k, v in cols.items()}
            print("| median | %.2f | %.2f | %.1f | %.1f |" % (md["pd"], md["nd"], md["pp"], md["np"]))
            print()
            print("portable / native, medians: decode %.3f, prefill %.3f (decode: the median step's rate of 64 "
                  "tokens at depth 0; prefill: one 512-token prompt)" % (md["pd"] / md["nd"], md["pp"] / md["np"]))


def peer_rounds(out):
    """Interleaved prefill rounds: per round and prompt length, sparq avx2
    over llama.cpp's better -fa of that round; the median of those ratios."""
    ratios, rows = {}, []
    i = 1
    while True:
        sp = load(os.path.join(out, "peer-%d-sparq.json" % i))
        ll = load(os.path.join(out, "peer-%d-llama.json" % i))
        if not sp or not ll:
            break
        for r in sp:
            n = r["n_prompt"]
            b = best_llama(ll, n_prompt=n, n_gen=0)
            if b:
                ratios.setdefault(n, []).append(r["tok_s"] / b["avg_ts"])
                rows.append((i, n, r["tok_s"], b["avg_ts"], b["flash_attn"]))
        i += 1
    if not rows:
        return
    print("## Prefill in interleaved rounds: sparq avx2 against llama.cpp AVX2, one repetition each")
    print()
    print("| round | prompt | sparq avx2 | llama.cpp AVX2 (better -fa) | ratio |")
    print("|---:|---:|---:|---:|---:|")
    for i, n, s, l, fa in rows:
        print("| %d | %d | %.1f | %.2f (-fa %s) | %.3f |" % (i, n, s, l, fa, s / l))
    print()
    for n in sorted(ratios):
        v = ratios[n]
        print("prompt %d: median ratio %.3f (%.3f..%.3f) over %d rounds" % (
            n, statistics.median(v), min(v), max(v), len(v)))
    print()


if __name__ == "__main__":
    main()

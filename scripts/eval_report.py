#!/usr/bin/env python3
"""Markdown tables from the `sparq eval/stats --json` files of a results
directory (scripts/eval_testmodel.sh writes them). Numbers are copied from
the JSON, never recomputed, except the per-layer means of the statistics.

  /usr/bin/python3 scripts/eval_report.py docs/eval-results/tiny-d64 > report.md
"""
import json
import os
import sys


def load(d, name):
    p = os.path.join(d, name + ".json")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)


def fmt(v, se=None, digits=4):
    if v is None:
        return ""
    s = f"{v:.{digits}f}"
    if se is not None:
        s += f" +-{se:.{digits}f}"
    return s


def fidelity(d, name, title):
    j = load(d, name)
    if not j:
        return
    print(f"### {title}\n")
    print(f"`{name}.json`: {j['rows'][0]['n']} windows. Top-1 agreement, mean KL(dense || policy) in nats and greedy "
          "tokens before the first divergence (each +- standard error), measured transfer ratio.\n")
    print("| policy | setting | top-1 | KL (nats) | first div. | transfer |")
    print("|---|---|---|---|---|---|")
    for r in j["rows"]:
        if r.get("value") is None:
            print(f"| {r['policy']} | {r['params']} | n/a: {r.get('skip_reason', 'not run')} | | | |")
            continue
        print(f"| {r['policy']} | {r['params']} | {fmt(r['top1_agreement'], r['stderr'])} | "
              f"{fmt(r['kl_mean'], r['kl_stderr'], 5)} | {fmt(r['first_divergence'], r['first_divergence_stderr'], 1)} | "
              f"{r['transfer_ratio']:.4f} |")
    print()


def task(d, name, title):
    j = load(d, name)
    if not j:
        return
    rows = j["rows"]
    print(f"### {title}\n")
    print(f"`{name}.json`: metric `{rows[0]['metric']}`, {rows[0]['n']} examples; the paired difference to dense "
          "over the same examples +- its standard error.\n")
    print("| policy | setting | value | vs dense | transfer |")
    print("|---|---|---|---|---|")
    for r in rows:
        if r.get("value") is None:
            print(f"| {r['policy']} | {r['params']} | n/a: {r.get('skip_reason', 'not run')} | | |")
            continue
        delta = fmt(r.get("delta_vs_dense"), r.get("delta_stderr")) if "delta_vs_dense" in r else ""
        print(f"| {r['policy']} | {r['params']} | {fmt(r['value'], r['stderr'])} | {delta} | "
              f"{r['transfer_ratio']:.4f} |")
    print()


def stats(d):
    j = load(d, "stats")
    if not j:
        return
    heads = j["heads"]
    rs = j["r"]
    print("### Attention statistics\n")
    print(f"`stats.json`: {j['tokens']} tokens, decode steps S = {j['s_first']}..{j['s_last']}, k = {j['k']}, "
          f"d = {j['head_dim']}, alpha at r = {j['alpha_r']}; means over the heads of each layer. "
          "Plots: `stats.png`.\n")
    cols = ["kurtosis", "kurtosis_pooled", "entropy", "keys75", "topk_mass", "alpha"]
    print("| layer | kurtosis | kurt_pool | entropy | keys75 | top-k mass | alpha | " +
          " | ".join(f"agr r={r}" for r in rs) + " |")
    print("|---" * (7 + len(rs)) + "|")
    layers = sorted({h["layer"] for h in heads})
    for l in layers + ["all"]:
        hs = [h for h in heads if l == "all" or h["layer"] == l]
        m = [sum(h[c] for h in hs) / len(hs) for c in cols]
        a = [sum(h["agreement"][i] for h in hs) / len(hs) for i in range(len(rs))]
        print(f"| {l} | " + " | ".join(f"{x:.3f}" for x in m) + " | " + " | ".join(f"{x:.3f}" for x in a) + " |")
    print()


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print("usage: eval_report.py RESULTS_DIR", file=sys.stderr)
        return 2
    d = sys.argv[1]
    fidelity(d, "fidelity_wiki", "Fidelity vs dense on WikiText-2 (held out)")
    fidelity(d, "fidelity_shakespeare", "Fidelity vs dense on held-out Shakespeare")
    fidelity(d, "fidelity_wiki_matchk", "Same k for every policy (`--match k`), WikiText-2")
    task(d, "wikitext", "Bits per character, WikiText-2 (teacher-forced)")
    task(d, "repetition", "Repetition (held-out Shakespeare)")
    stats(d)
    for t, title in (("squad", "SQuAD"), ("triviaqa", "TriviaQA"), ("cnndm", "CNN/DailyMail"),
                     ("kvret", "Key-value retrieval"), ("niah", "Needle in a haystack")):
        task(d, t, title)
    return 0


if __name__ == "__main__":
    sys.exit(main())

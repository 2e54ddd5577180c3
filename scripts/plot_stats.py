#!/usr/bin/env python3
"""Plots `sparq stats --json` as the SparQ paper's Figure 4 panels.

  ./build/sparq stats -m MODEL --json > stats.json
  /usr/bin/python3 scripts/plot_stats.py stats.json -o stats.png

Panels (one point or line per attention head, from the JSON's "heads"):
  (a) query kurtosis: the excess kurtosis of the query components, pooled
      over the measured steps (the paper: heavy-tailed, > 0, for most heads);
  (b) top-k agreement: the fraction of the true top-k keys that SparQ's
      r-component approximate scores also rank top-k, against r; the thick
      line is the mean over heads, the dashed one k/S (a random choice);
  (c) alpha, SparQ's estimate of the attention mass its k keys hold (from
      the approximate scores, at --alpha-r), against the true top-k mass.
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("stats_json")
    ap.add_argument("-o", "--out", required=True, help="PNG to write")
    ap.add_argument("--title", default=None)
    a = ap.parse_args()
    with open(a.stats_json) as f:
        d = json.load(f)
    heads = d.get("heads")
    rs = d.get("r")
    if not heads or not rs or any(len(h.get("agreement", [])) != len(rs) for h in heads):
        print("error: %s is not `sparq stats --json` output with per-head agreement" % a.stats_json,
              file=sys.stderr)
        return 1
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(13, 3.8))
    kp = [h["kurtosis_pooled"] for h in heads]
    ax[0].hist(kp, bins=20, color="tab:blue", alpha=0.8)
    ax[0].axvline(0, color="k", lw=0.8, ls="--")
    ax[0].set_xlabel("query excess kurtosis (pooled over steps)")
    ax[0].set_ylabel("heads")
    ax[0].set_title("(a) query kurtosis, %d heads" % len(heads))

    for h in heads:
        ax[1].plot(rs, h["agreement"], color="tab:gray", lw=0.5, alpha=0.5)
    mean = [sum(h["agreement"][i] for h in heads) / len(heads) for i in range(len(rs))]
    ax[1].plot(rs, mean, "o-", color="tab:red", lw=2, label="mean over heads")
    S = (d["s_first"] + d["s_last"]) / 2
    ax[1].axhline(d["k"] / S, color="k", ls="--", lw=0.8, label="k/S (random)")
    ax[1].set_xscale("log", base=2)
    ax[1].set_xticks(rs)
    ax[1].set_xticklabels([str(r) for r in rs])
    ax[1].set_ylim(0, 1.02)
    ax[1].set_xlabel("r (query components)")
    ax[1].set_ylabel("top-%d agreement" % d["k"])
    ax[1].set_title("(b) approximate vs true top-%d, d = %d" % (d["k"], d["head_dim"]))
    ax[1].legend(loc="lower right", fontsize=8)

    ax[2].scatter([h["topk_mass"] for h in heads], [h["alpha"] for h in heads], s=12)
    ax[2].plot([0, 1], [0, 1], "k--", lw=0.8)
    ax[2].set_xlim(0, 1.02)
    ax[2].set_ylim(0, 1.02)
    ax[2].set_xlabel("true top-%d attention mass" % d["k"])
    ax[2].set_ylabel("alpha (r = %d)" % d["alpha_r"])
    ax[2].set_title("(c) alpha vs true mass, per head")
    fig.suptitle(a.title or "%s: %d tokens, steps S = %d..%d" % (d["model"].split("/")[-1], d["tokens"],
                                                                   d["s_first"], d["s_last"]), fontsize=10)
    fig.tight_layout()
    fig.savefig(a.out, dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())

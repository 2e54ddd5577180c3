#!/usr/bin/env python3
"""Trains models/tiny-d64.gguf: a small Llama with real head geometry.

Why: stories260K has heads of size 8, so SparQ at a 1/8 transfer ratio uses
r = 1 query component, a regime the SparQ paper never tests. This model has
head size 64 and grouped-query attention (4 query heads of 64, 2 KV heads), trained
at a 2048-token context so that attention has something to find far back.

  python3 scripts/train_testmodel.py --out-dir build/testmodel     (make testmodel)

Deterministic: fixed seeds, a fixed number of steps, a fixed thread count
(2) and torch's deterministic algorithms; the same machine type reproduces
the same weights. Steps, not wall time, decide when training ends.

Data (../shared/data): Tiny Shakespeare (its last 10% held out), the Paul
Graham essays, the SQuAD 1.1 dev contexts and the CNN/DailyMail articles.
WikiText-2 (test) is never trained on: it is the held-out text of the
evaluation (fidelity, bits per character).

Tokens: the stories260K SentencePiece vocabulary (512 pieces, tok512),
tokenized by sparq itself (python/sparq, ctypes) so the training ids are
exactly the ids the engine will see. Each document starts with BOS.

Architecture as llama.cpp's "llama": RMSNorm (eps 1e-5), Q/K/V without bias,
RoPE base 10000 rotating adjacent pairs (x[2i], x[2i+1]) (GGML's normal mode,
the layout GGUF llama files store, so no permutation at export), causal GQA
attention, SwiGLU feed-forward, untied output. Export: the weights go to
build/testmodel/weights.f32 (raw f32, the tensor order `sparq gen-model`
writes), and `sparq gen-model --shape tiny-d64 --weights ... --vocab-from
stories260K.gguf --type F16` writes the GGUF with the project's own writer.

Outputs in --out-dir: weights.f32, train_log.csv (step, tokens, loss, lr,
held-out loss), loss.png, manifest.json (seed, steps, shapes, data sha256,
torch version, final losses), heldout_shakespeare.txt.
"""
import argparse
import hashlib
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))

# The shape; `sparq gen-model --shape tiny-d64` has the same numbers.
CFG = dict(n_embd=256, n_layer=4, n_head=4, n_kv_head=2, n_ff=768, n_vocab=512,
           n_ctx=2048, rope_base=10000.0, rms_eps=1e-5)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_texts(data):
    """Returns (training documents, held-out Shakespeare text, files used)."""
    files = []

    def read(rel):
        p = os.path.join(data, rel)
        files.append(p)
        with open(p, encoding="utf-8") as f:
            return f.read()

    shakespeare = read("text/tinyshakespeare_input.txt")
    cut = shakespeare.rfind("\n\n", 0, int(len(shakespeare) * 0.9)) + 2
    docs = [shakespeare[:cut]]
    heldout = shakespeare[cut:]
    # one essay per document: the file separates them with blank-line runs
    # too often to split reliably, so it is cut into ~8k-char pieces at
    # paragraph boundaries instead
    essays = read("text/PaulGrahamEssays_all_sorted.txt")
    start = 0
    while start < len(essays):
        end = essays.find("\n\n", start + 8000)
        end = len(essays) if end < 0 else end + 2
        docs.append(essays[start:end])
        start = end
    seen = set()
    for part in ("qa/squad/dev-v1.1.part1of2.json", "qa/squad/dev-v1.1.part2of2.json"):
        for art in json.loads(read(part))["data"]:
            ctxs = [p["context"] for p in art["paragraphs"] if p["context"] not in seen]
            seen.update(ctxs)
            if ctxs:
                docs.append(art["title"].replace("_", " ") + "\n\n" + "\n\n".join(ctxs))
    for a in json.loads(read("qa/cnn_dailymail/cnn_dailymail_test_first100.json")):
        docs.append(a["article"])
    return docs, heldout, files


def tokenize(docs, vocab_model):
    import sparq
    with sparq.Model(vocab_model) as m:
        out = []
        for d in docs:
            out.extend(m.tokenize(d, add_special=True))  # BOS + pieces
        return out


# ---- the model ---------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(n_ctx, hd, base):
    inv = base ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)   # [hd/2]
    ang = torch.arange(n_ctx, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def rope(x, cos, sin):
    """x [B, H, T, hd]; rotates adjacent pairs (x[2i], x[2i+1])."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    T = x.shape[2]
    c, s = cos[:T], sin[:T]
    y0 = x0 * c - x1 * s
    y1 = x0 * s + x1 * c
    return torch.stack((y0, y1), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        e, hd = c["n_embd"], c["n_embd"] // c["n_head"]
        self.nh, self.nkv, self.hd = c["n_head"], c["n_kv_head"], hd
        self.attn_norm = RMSNorm(e, c["rms_eps"])
        self.wq = nn.Linear(e, self.nh * hd, bias=False)
        self.wk = nn.Linear(e, self.nkv * hd, bias=False)
        self.wv = nn.Linear(e, self.nkv * hd, bias=False)
        self.wo = nn.Linear(self.nh * hd, e, bias=False)
        self.ffn_norm = RMSNorm(e, c["rms_eps"])
        self.w_gate = nn.Linear(e, c["n_ff"], bias=False)
        self.w_up = nn.Linear(e, c["n_ff"], bias=False)
        self.w_down = nn.Linear(c["n_ff"], e, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.wk(h).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.wv(h).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        g = self.nh // self.nkv
        k = k.repeat_interleave(g, dim=1)   # query head h reads KV head h // g
        v = v.repeat_interleave(g, dim=1)
        # torch 1.13 (Debian 12) has no scaled_dot_product_attention
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hd)) + mask[:T, :T]
        a = torch.softmax(att, dim=-1) @ v
        x = x + self.wo(a.transpose(1, 2).reshape(B, T, -1))
        h = self.ffn_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.tok = nn.Embedding(c["n_vocab"], c["n_embd"])
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["n_layer"]))
        self.norm = RMSNorm(c["n_embd"], c["rms_eps"])
        self.out = nn.Linear(c["n_embd"], c["n_vocab"], bias=False)
        cos, sin = rope_tables(c["n_ctx"], c["n_embd"] // c["n_head"], c["rope_base"])
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.register_buffer("mask", torch.full((c["n_ctx"], c["n_ctx"]), float("-inf")).triu(1), persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * c["n_layer"]) if name.endswith(("wo.weight", "w_down.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, ids):
        x = self.tok(ids)
        for b in self.blocks:
            x = b(x, self.cos, self.sin, self.mask)
        return self.out(self.norm(x))

    def gguf_tensors(self):
        """(name, tensor) in the order `sparq gen-model` writes them."""
        yield "token_embd.weight", self.tok.weight
        yield "output_norm.weight", self.norm.weight
        yield "output.weight", self.out.weight
        for i, b in enumerate(self.blocks):
            yield f"blk.{i}.attn_norm.weight", b.attn_norm.weight
            yield f"blk.{i}.attn_q.weight", b.wq.weight
            yield f"blk.{i}.attn_k.weight", b.wk.weight
            yield f"blk.{i}.attn_v.weight", b.wv.weight
            yield f"blk.{i}.attn_output.weight", b.wo.weight
            yield f"blk.{i}.ffn_norm.weight", b.ffn_norm.weight
            yield f"blk.{i}.ffn_gate.weight", b.w_gate.weight
            yield f"blk.{i}.ffn_up.weight", b.w_up.weight
            yield f"blk.{i}.ffn_down.weight", b.w_down.weight


def load_weights(model, path):
    """The inverse of the export: fills the model from weights.f32."""
    import numpy as np
    flat = np.fromfile(path, dtype="<f4")
    off = 0
    with torch.no_grad():
        for name, t in model.gguf_tensors():
            n = t.numel()
            if off + n > len(flat):
                raise SystemExit(f"error: {path} ends inside {name}")
            t.copy_(torch.from_numpy(flat[off:off + n].copy()).view_as(t))
            off += n
    if off != len(flat):
        raise SystemExit(f"error: {path} holds {len(flat)} values, the model {off}")


def export(a, wpath):
    """GGUF files through `sparq gen-model` (the project's writer): F16 (the
    committed model) and F32 (for the check below)."""
    import subprocess
    outs = {}
    for typ in ("F16", "F32"):
        out = os.path.join(a.out_dir, "tiny-d64%s.gguf" % ("" if typ == "F16" else "-f32"))
        subprocess.run([a.sparq, "gen-model", "--shape", "tiny-d64", "--weights", wpath, "--vocab-from",
                        a.vocab_model, "--type", typ, "-o", out], check=True)
        outs[typ] = out
    return outs


@torch.no_grad()
def check_export(model, ggufs, ids):
    """sparq's logits for a held-out sequence against this file's own forward
    pass: the F32 file must agree to float rounding (a transposed tensor, a
    RoPE pair layout or a norm epsilon off would show at once), the F16 file
    to F16 rounding (F16 weights and KV cache). Returns {type: (max |diff|, top-1 agreement)}."""
    import numpy as np
    import sparq
    model.eval()
    ref = model(ids[None, :])[0].numpy()
    res = {}
    for typ, path in ggufs.items():
        # F32 weights with an f32 KV cache: nothing rounds but the order of sums
        kv = "f32" if typ == "F32" else "f16"
        with sparq.Model(path) as m, sparq.Context(m, n_ctx=len(ids), n_threads=2, kv_type=kv) as c:
            got = np.asarray(c.eval_all(ids.tolist()), dtype=np.float32).reshape(ref.shape)
        res[typ] = (float(np.abs(got - ref).max()), float((got.argmax(-1) == ref.argmax(-1)).mean()))
        print(f"check {typ}: max |logit diff| {res[typ][0]:.2e}, top-1 agreement {res[typ][1]:.4f} "
              f"over {len(ids)} held-out tokens", file=sys.stderr)
    model.train()
    return res


# ---- training ----------------------------------------------------------------

def batch_at(data, starts, T):
    x = torch.stack([data[s:s + T] for s in starts])
    y = torch.stack([data[s + 1:s + T + 1] for s in starts])
    return x, y


def lr_at(step, steps, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


@torch.no_grad()
def heldout_loss(model, data, T, n, gen):
    model.eval()
    starts = torch.randint(0, len(data) - T - 1, (n,), generator=gen).tolist()
    tot = 0.0
    for s in starts:
        x, y = batch_at(data, [s], T)
        tot += F.cross_entropy(model(x).view(-1, model.c["n_vocab"]), y.view(-1)).item()
    model.train()
    return tot / n


def plot(log, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["tokens"] / 1e6 for r in log], [r["loss"] for r in log], lw=0.8, label="train (batch)")
    ev = [r for r in log if r.get("heldout") is not None]
    ax.plot([r["tokens"] / 1e6 for r in ev], [r["heldout"] for r in ev], "o-", label="held-out Shakespeare")
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_title("tiny-d64 training (tok512 vocabulary, context 2048)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "build", "testmodel"))
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data"))
    ap.add_argument("--vocab-model", default=os.path.join(ROOT, "..", "shared", "models", "stories260K.gguf"))
    ap.add_argument("--steps", type=int, default=450)
    ap.add_argument("--batch", type=int, default=2, help="sequences of --ctx tokens per step")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--seed", type=int, default=20261125)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--bench", type=int, default=0, help="time N steps and exit (no output)")
    ap.add_argument("--sparq", default=os.path.join(ROOT, "build", "sparq"), help="the sparq binary (export)")
    ap.add_argument("--export-only", action="store_true",
                    help="skip training: export and check --out-dir's weights.f32 (train_log.csv, manifest kept)")
    a = ap.parse_args()
    if a.steps <= 0 or a.batch <= 0 or a.ctx <= 1 or a.ctx > CFG["n_ctx"] or a.threads <= 0:
        ap.error("--steps, --batch, --threads must be positive and --ctx in 2..%d" % CFG["n_ctx"])

    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    torch.use_deterministic_algorithms(True)
    os.makedirs(a.out_dir, exist_ok=True)

    t0 = time.time()
    docs, heldout, files = load_texts(a.data)
    train_ids = torch.tensor(tokenize(docs, a.vocab_model), dtype=torch.long)
    held_ids = torch.tensor(tokenize([heldout], a.vocab_model), dtype=torch.long)
    print(f"data: {len(docs)} documents, {len(train_ids)} training tokens, {len(held_ids)} held-out "
          f"({time.time() - t0:.1f} s)", file=sys.stderr)
    with open(os.path.join(a.out_dir, "heldout_shakespeare.txt"), "w", encoding="utf-8") as f:
        f.write(heldout)

    model = Llama(CFG)
    n_params = sum(p.numel() for p in model.parameters())
    wpath = os.path.join(a.out_dir, "weights.f32")
    if a.export_only:
        load_weights(model, wpath)
        return finish(a, model, wpath, held_ids, None)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(a.seed + 1)
    eval_gen_seed = a.seed + 2
    T = a.ctx
    log = []
    logf = None if a.bench else open(os.path.join(a.out_dir, "train_log.csv"), "w")
    if logf:
        logf.write("step,tokens,loss,lr,heldout,seconds\n")
    t_start = time.time()
    steps = a.bench or a.steps
    for step in range(steps):
        lr = lr_at(step, a.steps, a.lr, a.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(train_ids) - T - 1, (a.batch,), generator=gen).tolist()
        x, y = batch_at(train_ids, starts, T)
        loss = F.cross_entropy(model(x).view(-1, CFG["n_vocab"]), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        held = None
        last = step == steps - 1
        if not a.bench and (step % a.eval_every == 0 or last):
            held = heldout_loss(model, held_ids, T, 4, torch.Generator().manual_seed(eval_gen_seed))
        el = time.time() - t_start
        r = dict(step=step, tokens=(step + 1) * a.batch * T, loss=loss.item(), lr=lr, heldout=held, seconds=el)
        log.append(r)
        if logf:
            logf.write(f"{step},{r['tokens']},{r['loss']:.5f},{lr:.6g},{'' if held is None else f'{held:.5f}'},{el:.1f}\n")
            logf.flush()
        if step % 10 == 0 or held is not None or last:
            eta = el / (step + 1) * (steps - step - 1)
            print(f"step {step + 1}/{steps} loss {loss.item():.4f}" + ("" if held is None else f" held-out {held:.4f}")
                  + f" lr {lr:.2e} {r['tokens'] / el:.0f} tok/s eta {eta / 60:.1f} min", file=sys.stderr, flush=True)
    if a.bench:
        el = time.time() - t_start
        print(f"bench: {steps} steps of {a.batch}x{T} in {el:.1f} s: {steps * a.batch * T / el:.0f} tok/s, "
              f"{n_params / 1e6:.2f} M params", file=sys.stderr)
        return 0
    logf.close()

    with open(wpath, "wb") as f:
        for name, t in model.gguf_tensors():
            f.write(t.detach().float().contiguous().numpy().astype("<f4").tobytes())
    plot(log, os.path.join(a.out_dir, "loss.png"))
    manifest = dict(
        shape="tiny-d64", config=CFG, params=n_params, seed=a.seed, steps=a.steps, batch=a.batch, ctx=T,
        lr=a.lr, warmup=a.warmup, threads=a.threads, torch=torch.__version__,
        train_tokens_seen=a.steps * a.batch * T, train_tokens=len(train_ids), heldout_tokens=len(held_ids),
        final_train_loss=log[-1]["loss"], final_heldout_loss=log[-1]["heldout"],
        seconds=round(time.time() - t_start, 1),
        data={os.path.relpath(p, a.data): sha256(p) for p in files},
        vocab_model=dict(file=os.path.basename(a.vocab_model), sha256=sha256(a.vocab_model)),
        weights_sha256=sha256(wpath),
    )
    print(f"wrote {wpath} ({n_params / 1e6:.2f} M params), train_log.csv, loss.png", file=sys.stderr)
    return finish(a, model, wpath, held_ids, manifest)


def finish(a, model, wpath, held_ids, manifest):
    """Export, check the export against this forward pass, write the manifest."""
    mpath = os.path.join(a.out_dir, "manifest.json")
    if manifest is None:
        with open(mpath) as f:
            manifest = json.load(f)
    ggufs = export(a, wpath)
    res = check_export(model, ggufs, held_ids[:512])
    manifest["export_check"] = {t: dict(max_abs_logit_diff=d, top1_agreement=g, tokens=512)
                                for t, (d, g) in res.items()}
    manifest["gguf_sha256"] = {os.path.basename(p): sha256(p) for p in ggufs.values()}
    with open(mpath, "w") as f:
        json.dump(manifest, f, indent=1)
    d32, g32 = res["F32"]
    if d32 > 1e-3 or g32 < 1.0:
        print(f"error: sparq's F32 logits differ from the training forward pass by {d32:.2e}", file=sys.stderr)
        return 1
    print(f"wrote {', '.join(ggufs.values())} and {mpath}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

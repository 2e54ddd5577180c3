"""Embeddings through the Python package: Context.embed and llama-cpp-python's
Llama.embed / create_embedding, against llama.cpp's vectors for the same GGUF
(tests/data/llamacpp/embed/, see its README) and the C library's identities."""
import json
import math
import os

import pytest

import sparq
from conftest import ROOT

DATA = os.path.join(ROOT, "tests", "data", "llamacpp", "embed")


def golden(name):
    with open(os.path.join(DATA, "stories260K-%s.json" % name)) as f:
        return json.load(f)


def close(a, b):
    """llama.cpp's tolerance of tests/test_embed.c: cosine >= 0.9999 and no
    component off by more than 1e-3 of the largest."""
    a, b = list(map(float, a)), list(map(float, b))
    assert len(a) == len(b)
    dot = sum(x * y for x, y in zip(a, b))
    cos = dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
    top = max(abs(y) for y in b)
    assert cos >= 0.9999 and max(abs(x - y) for x, y in zip(a, b)) <= 1e-3 * max(top, 1.0), cos


def test_context_embed_matches_llamacpp(model):
    for name in ("mean-l2", "cls-raw", "last-l2"):
        g = golden(name)
        with sparq.Context(model, n_ctx=64, n_threads=1) as ctx:
            for text, toks, want in zip(g["inputs"], g["tokens"], g["embeddings"]):
                assert model.tokenize(text) == toks
                got = ctx.embed(toks, pooling=g["pooling"], normalize=g["normalize"])
                assert len(got) == model.n_embd == len(want)
                close(got, want)


def test_context_embed_none_and_errors(model):
    with sparq.Context(model, n_ctx=16, n_threads=1) as ctx:
        ids = model.tokenize("Once upon a time")
        rows = ctx.embed(ids, pooling="none", normalize=-1)
        assert len(rows) == len(ids) and len(rows[0]) == model.n_embd
        last = ctx.embed(ids, pooling="last", normalize=-1)
        assert list(rows[len(ids) - 1]) == list(last)
        with pytest.raises(ValueError, match="pooling"):
            ctx.embed(ids, pooling="rank")
        with pytest.raises(ValueError, match="at least one token"):
            ctx.embed([])
        with pytest.raises(sparq.SparqError, match="context size"):
            ctx.embed(ids * 5)


def test_llama_embed_and_create_embedding(model_path):
    raw, l2 = golden("mean-raw"), golden("mean-l2")
    with sparq.Llama(model_path, n_ctx=64, n_threads=1) as llm:
        assert llm.tokenize(b"Lily") == raw["tokens"][2]
        llm("Once upon a time", max_tokens=4, temperature=0)
        before = llm.n_tokens if hasattr(llm, "n_tokens") else None
        v = llm.embed(raw["inputs"][0])  # llama-cpp-python: not normalised by default
        close(v, raw["embeddings"][0])
        close(llm.embed(raw["inputs"][1], normalize=True), l2["embeddings"][1])
        vs, n = llm.embed(raw["inputs"], return_count=True)
        assert n == sum(len(t) for t in raw["tokens"])
        for got, want in zip(vs, raw["embeddings"]):
            close(got, want)
        if before is not None:
            assert llm.n_tokens == before  # the generation cache is left alone
        r = llm.create_embedding(raw["inputs"][:2], model="m")
        assert r["object"] == "list" and r["model"] == "m"
        assert [d["index"] for d in r["data"]] == [0, 1] and r["data"][0]["object"] == "embedding"
        assert r["usage"] == {"prompt_tokens": len(raw["tokens"][0]) + len(raw["tokens"][1]),
                              "total_tokens": len(raw["tokens"][0]) + len(raw["tokens"][1])}
        close(r["data"][1]["embedding"], raw["embeddings"][1])
        with pytest.raises(ValueError, match="empty"):
            llm.embed("")
        with pytest.raises(ValueError, match="exceed n_ctx"):
            llm.embed("Once upon a time " * 40, truncate=False)
        assert len(llm.embed("Once upon a time " * 40)) == llm.model.n_embd  # truncated
    with sparq.Llama(model_path, n_ctx=64, n_threads=1, pooling_type=2) as llm:
        close(llm.embed(raw["inputs"][1], normalize=True), golden("cls-l2")["embeddings"][1])
    with sparq.Llama(model_path, n_ctx=64, n_threads=1, pooling_type=0) as llm:
        rows = llm.embed("Once upon a time")
        assert len(rows) == len(raw["tokens"][0]) and len(rows[0]) == llm.model.n_embd
    with pytest.raises(ValueError, match="pooling_type"):
        sparq.Llama(model_path, n_ctx=64, pooling_type=4)

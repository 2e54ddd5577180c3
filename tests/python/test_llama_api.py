"""The parts of llama-cpp-python's Llama that programs call: state objects,
metadata, n_tokens, tokenizer round trips, logprobs, keyword checking, and
a program written for llama-cpp-python run unchanged."""
import math
import os
import subprocess
import sys

import pytest

import sparq
from conftest import PROMPT, ROOT

PKG = os.path.join(ROOT, "python")


def _env(**over):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONHOME", None)
    env.update(over)
    return env


def test_unknown_keywords_raise(model_path):
    with pytest.raises(TypeError, match="unexpected keyword argument 'n_ctxx'"):
        sparq.Llama(model_path, n_ctxx=64)
    with pytest.raises(ValueError, match="not supported by sparq: lora_path"):
        sparq.Llama(model_path, lora_path="adapter.gguf")
    # hardware and speed options of llama-cpp-python are accepted and change nothing
    with sparq.Llama(model_path, n_ctx=64, n_threads=1, n_gpu_layers=-1, use_mlock=True, logits_all=True,
                     lora_path=None, seed=-1, verbose=False) as llm:
        assert llm.n_ctx() == 64
        assert llm.ignored_options == {"n_gpu_layers": -1, "use_mlock": True, "logits_all": True}
        with pytest.raises(TypeError, match="unexpected keyword argument 'max_tokenz'"):
            llm(PROMPT, max_tokenz=3)


TEXTS = [b"Once upon a time", b"Once upon a time, there was a cat.", b" leading space", b"  two",
         b"a\nb", b"", b"x", b"Hello, world!", b"end with space "]


def test_detokenize_round_trip(model_path):
    with sparq.Llama(model_path, n_ctx=64, n_threads=1) as llm:
        tok = llm.tokenizer()
        for t in TEXTS:
            for bos in (True, False):
                ids = llm.tokenize(t, add_bos=bos)
                assert llm.detokenize(ids) == t, (t, bos, ids)
            assert tok.decode(tok.encode(t.decode())) == t.decode()
            assert tok.detokenize(tok.tokenize(t)) == t
        # a continuation keeps its space: prev_tokens says text came before
        ids = llm.tokenize(b"Once upon a time", add_bos=False)
        assert llm.detokenize(ids[1:], prev_tokens=ids[:1]) == b" upon a time"
        assert llm.detokenize(ids[:1]) + llm.detokenize(ids[1:], prev_tokens=ids[:1]) == b"Once upon a time"


def test_metadata_and_n_tokens(model_path):
    with sparq.Llama(model_path, n_ctx=64, n_threads=1) as llm:
        md = llm.metadata
        assert md["general.architecture"] == llm.model.arch
        assert md["llama.context_length"] == str(llm.model.n_ctx_train)
        assert md["tokenizer.ggml.bos_token_id"] == str(llm.token_bos())
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in md.items())
        assert "tokenizer.ggml.tokens" not in md  # arrays are left out, as llama.cpp does
        vocab = sparq.gguf_metadata(model_path, arrays=True)["tokenizer.ggml.tokens"]
        assert len(vocab) == llm.n_vocab()
        assert llm.n_tokens == 0
        ids = llm.tokenize(PROMPT.encode())
        llm.eval(ids)
        assert llm.n_tokens == len(ids) and list(llm.input_ids) == ids
        llm(PROMPT, max_tokens=4, temperature=0)
        assert llm.n_tokens == len(ids) + 3  # the last sampled token is not evaluated
        llm.reset()
        assert llm.n_tokens == 0


def _greedy(llm, n):
    out = []
    for _ in range(n):
        t = llm.sample(temp=0)
        out.append(t)
        llm.eval([t])
    return out


def test_state_object_round_trip(model_path, tmp_path):
    with sparq.Llama(model_path, n_ctx=128, n_threads=1) as llm:
        ids = llm.tokenize(PROMPT.encode())
        llm.eval(ids)
        state = llm.save_state()
        assert isinstance(state, sparq.LlamaState)
        assert state.n_tokens == len(ids) and state.input_ids == ids and state.llama_state_size > 0
        first = _greedy(llm, 10)
        assert llm.n_tokens == len(ids) + 10
        llm.load_state(state)
        assert llm.n_tokens == len(ids) and llm.ctx.pos == len(ids)
        assert _greedy(llm, 10) == first
        # a completion of the state's own tokens needs no evaluation, and agrees
        llm.load_state(state)
        text = llm(PROMPT, max_tokens=10, temperature=0)["choices"][0]["text"]
        assert text == llm.detokenize(first, prev_tokens=ids).decode()
        # the state outlives a reset and goes into another Llama of the model
        llm.reset()
        with sparq.Llama(model_path, n_ctx=128, n_threads=1) as other:
            other.load_state(state)
            assert _greedy(other, 10) == first
        # an empty state empties the cache
        empty = llm.save_state()
        assert empty.n_tokens == 0
        llm.eval(ids)
        llm.load_state(empty)
        assert llm.n_tokens == 0
        # the path form is still there: save_state(path) / load_state(path)
        path = str(tmp_path / "s.kv")
        llm.eval(ids)
        llm.save_state(path)
        llm.reset()
        llm.load_state(path)
        assert llm.n_tokens == len(ids)
        with pytest.raises(TypeError, match="load_state takes"):
            llm.load_state(42)


def _log_softmax(v):
    m = max(v)
    s = m + math.log(math.fsum(math.exp(x - m) for x in v))
    return [x - s for x in v]


def test_completion_logprobs(model_path):
    with sparq.Llama(model_path, n_ctx=128, n_threads=1) as llm:
        out = llm(PROMPT, max_tokens=6, temperature=0, logprobs=3)
        ch = out["choices"][0]
        lp = ch["logprobs"]
        assert set(lp) == {"tokens", "text_offset", "token_logprobs", "top_logprobs"}
        assert "".join(lp["tokens"]) == ch["text"]
        assert len(lp["tokens"]) == out["usage"]["completion_tokens"] == 6
        assert lp["text_offset"][0] == len(PROMPT)
        for i in range(1, 6):
            assert lp["text_offset"][i] == lp["text_offset"][i - 1] + len(lp["tokens"][i - 1])
        for tok, l, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
            assert l <= 0 and 3 <= len(top) <= 4
            assert top[tok] == l and l == max(top.values())  # greedy: the likeliest
        # against the model's own logits, evaluated here
        ids = llm.tokenize(PROMPT.encode())
        ctx = sparq.Context(llm.model, n_ctx=128, n_threads=1)
        row = _log_softmax(list(ctx.eval(ids)))
        for i in range(6):  # greedy, as the completion
            t = max(range(len(row)), key=lambda j: (row[j], -j))
            assert llm.model.token_to_piece(t).decode() == lp["tokens"][i]
            assert abs(row[t] - lp["token_logprobs"][i]) < 1e-4
            row = _log_softmax(list(ctx.eval([t])))
        ctx.close()
        # echo: the prompt's tokens too, the first without a logprob
        out = llm(PROMPT, max_tokens=3, temperature=0, logprobs=1, echo=True)
        lp = out["choices"][0]["logprobs"]
        assert "".join(lp["tokens"]) == out["choices"][0]["text"]
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert len(lp["tokens"]) == len(ids) + 3
        assert all(x <= 0 for x in lp["token_logprobs"][1:])
        # streamed: the pieces' logprobs add up to the whole
        whole = llm(PROMPT, max_tokens=8, temperature=0, logprobs=2)["choices"][0]
        toks = []
        for c in llm(PROMPT, max_tokens=8, temperature=0, logprobs=2, stream=True):
            if c["choices"][0]["logprobs"]:
                toks += c["choices"][0]["logprobs"]["tokens"]
        assert toks == whole["logprobs"]["tokens"]
        # a stop string drops the tokens past it
        cut = llm(PROMPT, max_tokens=8, temperature=0, logprobs=1, stop=[" was"])["choices"][0]
        assert cut["finish_reason"] == "stop" and " was" not in cut["text"]
        assert "".join(cut["logprobs"]["tokens"]).startswith(cut["text"])
        assert len(cut["logprobs"]["tokens"]) < len(whole["logprobs"]["tokens"])
        assert llm(PROMPT, max_tokens=2)["choices"][0]["logprobs"] is None
        with pytest.raises(ValueError):
            llm(PROMPT, max_tokens=2, logprobs=-1)


# A program written for llama-cpp-python, run unchanged against sparq through
# a `llama_cpp` module that re-exports it.
LLAMA_CPP_SCRIPT = r'''
import sys
from llama_cpp import Llama

llm = Llama(model_path=sys.argv[1], n_ctx=256, seed=42, verbose=False, chat_format="chatml")
assert llm.n_ctx() == 256

out = llm("Q: Once upon a time there was a girl. A:", max_tokens=16, stop=["\n"], echo=False,
          temperature=0)
text = out["choices"][0]["text"]
assert "\n" not in text and out["choices"][0]["finish_reason"] in ("stop", "length")
assert out["usage"]["completion_tokens"] <= 16
again = llm("Q: Once upon a time there was a girl. A:", max_tokens=16, stop=["\n"], temperature=0)
assert again["choices"][0]["text"] == text

chat = llm.create_chat_completion(messages=[
    {"role": "system", "content": "You tell stories."},
    {"role": "user", "content": "Tell me about a cat."}], max_tokens=8, temperature=0)
msg = chat["choices"][0]["message"]
assert msg["role"] == "assistant" and isinstance(msg["content"], str)

tokens = llm.tokenize(b"Hello, world!")
assert tokens[0] == llm.token_bos()
assert llm.detokenize(tokens) == b"Hello, world!"
assert llm.tokenizer().decode(llm.tokenizer().encode("Hello, world!")) == "Hello, world!"
assert llm.metadata["general.architecture"] == "llama"

prompt = llm.tokenize(b"Once upon a time")
llm.reset()
llm.eval(prompt)
state = llm.save_state()
first = []
for _ in range(8):
    t = llm.sample(temp=0)
    first.append(t)
    llm.eval([t])
llm.load_state(state)
assert llm.n_tokens == len(prompt)
second = []
for t in llm.generate(prompt, temp=0):
    second.append(t)
    if len(second) == 8:
        break
assert first == second, (first, second)
print("OK", repr(text), repr(llm.detokenize(first)))
'''


def test_llama_cpp_python_script(model_path, tmp_path):
    alias = tmp_path / "llama_cpp"
    alias.mkdir()
    (alias / "__init__.py").write_text("from sparq import *  # noqa\nfrom sparq import Llama  # noqa\n")
    script = tmp_path / "app.py"
    script.write_text(LLAMA_CPP_SCRIPT)
    env = _env(PYTHONPATH=os.pathsep.join([str(tmp_path), PKG]))
    r = subprocess.run([sys.executable, str(script), model_path], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout
    assert r.stdout.startswith("OK ")

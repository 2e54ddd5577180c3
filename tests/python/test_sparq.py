"""The Python package against independent references: `sparq run`'s output,
dense attention, a numpy attention written here, and the C library's own
error messages."""
import ctypes
import json
import math
import os
import struct
import shutil
import subprocess
import sys

import pytest

import sparq
from sparq import _lib
from conftest import BUILD, PROMPT, ROOT, sparq_run

try:  # only the tests that need numpy skip without it (and fail under CI)
    import numpy as np
except ImportError:
    np = None


def _numpy_or_skip():
    if np is not None:
        return
    if os.environ.get("CI", "") in ("true", "1", "yes"):
        pytest.fail("numpy is missing (scripts/setup.sh installs python3-numpy); CI requires it")
    pytest.skip("numpy is not installed (scripts/setup.sh installs python3-numpy)")


@pytest.fixture
def needs_numpy():
    _numpy_or_skip()


uses_numpy = pytest.mark.usefixtures("needs_numpy")


# ---- the library and its ABI ------------------------------------------------

def test_library_loads_and_reports_version():
    assert sparq.version() == sparq.__version__


def test_cpu_level_is_the_forced_or_a_known_level():
    forced = os.environ.get("SPARQ_CPU")
    if forced:
        assert sparq.cpu_level() == forced
    else:
        assert sparq.cpu_level() in ("avx512", "avx2", "ref")


def test_struct_mirrors_match_library():
    lib = _lib.load()
    for st in _lib.MIRRORS:
        assert lib.sparq_abi_sizeof(st.__name__.encode()) == ctypes.sizeof(st), st.__name__
        for f, _ in st._fields_:
            assert lib.sparq_abi_offsetof(st.__name__.encode(), f.encode()) == getattr(st, f).offset
    assert lib.sparq_abi_sizeof(b"no_such_struct") == 0
    assert lib.sparq_abi_offsetof(b"sparq_attn_params", b"no_such_field") == -1
    assert lib.sparq_abi_field(b"sparq_sampler_params", 3) == b"seed"
    assert lib.sparq_abi_field(b"sparq_sampler_params", 8) == b"penalty_last_n"
    assert lib.sparq_abi_field(b"sparq_sampler_params", 9) is None
    assert lib.sparq_abi_field(b"no_such_struct", 0) is None


def test_struct_drift_fails_loudly(monkeypatch):
    # a mirror that lacks the last field, as if C had grown one
    class sparq_attn_params(ctypes.Structure):
        _fields_ = _lib.sparq_attn_params._fields_[:-1]
    monkeypatch.setattr(_lib, "MIRRORS", [sparq_attn_params])
    with pytest.raises(sparq.SparqABIError, match=r"fields of sparq_attn_params"):
        _lib.check_abi(_lib.load())

    class sparq_sampler_params(ctypes.Structure):  # same names, a field's type changed
        _fields_ = [("temp", ctypes.c_float), ("top_k", ctypes.c_int64), ("top_p", ctypes.c_float),
                    ("seed", ctypes.c_uint64), ("min_p", ctypes.c_float), ("repeat_penalty", ctypes.c_float),
                    ("presence_penalty", ctypes.c_float), ("frequency_penalty", ctypes.c_float),
                    ("penalty_last_n", ctypes.c_int)]
    monkeypatch.setattr(_lib, "MIRRORS", [sparq_sampler_params])
    with pytest.raises(sparq.SparqABIError, match=r"sizeof\(sparq_sampler_params\): library 48, python 56"):
        _lib.check_abi(_lib.load())


def test_missing_library_is_a_clear_error():
    with pytest.raises(sparq.SparqError, match="cannot load libsparq.*/no/such/libsparq.so"):
        _lib.load("/no/such/libsparq.so")


def test_library_found_without_sparq_lib_next_to_package(tmp_path):
    """The package finds a libsparq.so placed beside it (no SPARQ_LIB)."""
    pkg = tmp_path / "sparq"
    shutil.copytree(os.path.join(ROOT, "python", "sparq"), pkg)
    shutil.copy(os.path.realpath(os.path.join(BUILD, "libsparq.so")), pkg / "libsparq.so.0")
    env = dict(os.environ)
    env.pop("SPARQ_LIB", None)
    code = "import sparq, sparq._lib as L; print(sparq.version()); print(L.load()._name)"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[1] == str(pkg / "libsparq.so.0")


# ---- pip install, offline ------------------------------------------------------

def test_pip_install_offline_in_venv(tmp_path, model_path):
    """`pip install --no-build-isolation ./python` into a venv that sees
    the system's packages, with no index (offline); the installed package
    generates. (System-wide on Debian 12 it needs --break-system-packages;
    test_packaging.py installs into bare venvs.)"""
    src = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "python"), src)  # builds write beside the source
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                   check=True)
    py = str(venv / "bin" / "python")
    r = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-deps",
                        "--disable-pip-version-check", str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    code = ("import sparq, sys; assert 'venv' in sparq.__file__, sparq.__file__; "
            "llm = sparq.Llama(sys.argv[1], n_ctx=128, n_threads=1); "
            "print(llm('Once upon a time', max_tokens=8, temperature=0)['choices'][0]['text'])")
    r = subprocess.run([py, "-c", code, model_path], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip()) > 5


def test_pip_install_system_wide_staged(tmp_path):
    """System-wide on Debian 12 pip needs --break-system-packages (PEP 668);
    staged with --root so the test leaves the system alone."""
    src = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "python"), src)
    root = tmp_path / "root"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-index",
                        "--no-deps", "--disable-pip-version-check", "--break-system-packages",
                        "--root", str(root), str(src)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    found = [p for p, _, files in os.walk(root) if "llama.py" in files and p.endswith("sparq")]
    assert len(found) == 1, found


def test_library_found_on_system_path(tmp_path):
    """Without SPARQ_LIB or a copy beside the package, the package loads
    libsparq.so.0 from the loader's path (as after `make install`)."""
    pkg = tmp_path / "sparq"
    shutil.copytree(os.path.join(ROOT, "python", "sparq"), pkg)
    libdir = tmp_path / "lib"
    libdir.mkdir()
    shutil.copy(os.path.realpath(os.path.join(BUILD, "libsparq.so")), libdir / "libsparq.so.0")
    env = dict(os.environ, LD_LIBRARY_PATH=str(libdir))
    env.pop("SPARQ_LIB", None)
    code = "import sparq, sparq._lib as L; sparq.version(); print(L.load()._name)"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() in ("libsparq.so.0", str(libdir / "libsparq.so.0"))
    env.pop("LD_LIBRARY_PATH")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    if r.returncode != 0:  # not installed system-wide: the error names every place it looked
        assert "cannot load libsparq" in r.stderr and "SPARQ_LIB" in r.stderr


# ---- low level ------------------------------------------------------------------

def test_model_properties(model):
    assert (model.n_vocab, model.n_layer, model.n_head, model.n_kv_head, model.head_dim) == (512, 5, 8, 4, 8)
    assert model.arch == "llama"
    assert model.token_bos == 1 and model.token_eos == 2
    assert model.is_eog(2) and not model.is_eog(100)


def test_tokenize_roundtrip(model):
    ids = model.tokenize("Once upon a time, there was a cat.")
    assert ids[0] == model.token_bos
    assert model.detokenize(ids[1:]).lstrip() == b"Once upon a time, there was a cat."
    assert model.tokenize(b"hello", add_special=False) == model.tokenize("hello", add_special=False)
    assert model.tokenize("", add_special=False) == []


@uses_numpy
def test_eval_logits_numpy_and_consistent(model):
    ids = model.tokenize(PROMPT)
    with sparq.Context(model, n_ctx=64, n_threads=1) as c:
        last = c.eval(ids)
        assert isinstance(last, np.ndarray) and last.shape == (512,) and last.dtype == np.float32
        assert c.pos == len(ids)
        c.reset()
        assert c.pos == 0
        allrows = c.eval_all(ids)
        assert allrows.shape == (len(ids), 512)
        np.testing.assert_allclose(allrows[-1], last, rtol=0, atol=1e-4)
        # teacher forcing one token at a time gives the same rows (prefill vs decode path)
        c.reset()
        rows = [c.eval([t]) for t in ids]
        np.testing.assert_allclose(np.stack(rows), allrows, rtol=0, atol=2e-3)


def test_eval_logits_memoryview_without_numpy(model, monkeypatch):
    from sparq import core
    monkeypatch.setattr(core, "_np", None)
    with sparq.Context(model, n_ctx=32, n_threads=1) as c:
        mv = c.eval(model.tokenize(PROMPT))
        assert isinstance(mv, memoryview) and mv.format == "f" and len(mv) == 512
        s = sparq.Sampler(512, temp=0)
        best = max(range(512), key=lambda i: (mv[i], -i))
        assert s.sample(mv) == best
        s.close()


def test_attention_stats_count_decode_steps(model):
    with sparq.Context(model, n_ctx=64, attn=sparq.AttnParams("sparq", r=4, k=8)) as c:
        c.eval(model.tokenize(PROMPT + ", there was a little girl named Lily. She loved to play."))
        for t in (300, 301, 302):
            c.eval([t])
        st = c.attn_stats()
        assert st["steps"] == 3
        assert 0 < st["elements"] < st["dense_elements"]


def _greedy_ids(ctx, model, ids, n):
    logits = ctx.eval(ids)
    out = []
    for _ in range(n):
        t = int(np.argmax(logits))
        out.append(t)
        logits = ctx.eval([t])
    return out, logits


@uses_numpy
@pytest.mark.parametrize("select_always", [0, 1])
def test_sparq_with_k_at_least_S_equals_dense(model, select_always):
    """SparQ that keeps every position (r = d, k >= S) is dense attention:
    through its dense shortcut, and (select_always) through its selecting
    path, top-k of all S positions, gathered, mean-value reallocation."""
    ids = model.tokenize(PROMPT)
    n = 40
    d = model.head_dim
    with sparq.Context(model, n_ctx=64, kv_type="f32") as dense, \
            sparq.Context(model, n_ctx=64, kv_type="f32",
                          attn=sparq.AttnParams("sparq", r=d, k=64, l=0,
                                                select_always=select_always)) as sq:
        a, la = _greedy_ids(dense, model, ids, n)
        b, lb = _greedy_ids(sq, model, ids, n)
        assert a == b
        np.testing.assert_allclose(la, lb, rtol=0, atol=1e-4)
        assert sq.attn_stats()["steps"] == n


@uses_numpy
def test_sparq_selecting_fewer_than_S_differs_from_dense(model):
    """The control of the identity above: the selecting path keeping k = 4
    of the positions is not dense, and the comparison sees it."""
    ids = model.tokenize(PROMPT)
    d = model.head_dim
    with sparq.Context(model, n_ctx=64, kv_type="f32") as dense, \
            sparq.Context(model, n_ctx=64, kv_type="f32",
                          attn=sparq.AttnParams("sparq", r=d, k=4, l=0, select_always=1)) as sq:
        _, la = _greedy_ids(dense, model, ids, 40)
        _, lb = _greedy_ids(sq, model, ids, 40)
        assert float(np.max(np.abs(np.asarray(la) - np.asarray(lb)))) > 1e-2


@uses_numpy
def test_sparq_adaptive_k_options(model):
    """The per-head adaptive k through AttnParams: with k >= S and the
    selecting path it is dense attention; a small k is not (the control);
    k_min without adaptive_k is the library's one-line error."""
    ids = model.tokenize(PROMPT)
    d = model.head_dim
    with sparq.Context(model, n_ctx=64, kv_type="f32") as dense, \
            sparq.Context(model, n_ctx=64, kv_type="f32",
                          attn=sparq.AttnParams("sparq", r=d, k=64, adaptive_k=1,
                                                select_always=1)) as full, \
            sparq.Context(model, n_ctx=64, kv_type="f32",
                          attn=dict(policy="sparq", r=d, k=4, l=0, adaptive_k=1, k_min=1)) as small:
        a, la = _greedy_ids(dense, model, ids, 30)
        b, lb = _greedy_ids(full, model, ids, 30)
        _, lc = _greedy_ids(small, model, ids, 30)
        assert a == b
        np.testing.assert_allclose(la, lb, rtol=0, atol=1e-4)
        assert float(np.max(np.abs(np.asarray(la) - np.asarray(lc)))) > 1e-2
    with pytest.raises(sparq.SparqError) as e:
        sparq.Context(model, n_ctx=64, attn=sparq.AttnParams("sparq", k=16, k_min=4))
    assert "k_min=4 applies only with adaptive_k" in str(e.value)
    assert "\n" not in str(e.value)


def _naive_attention(q, K, V):
    s = (K @ q.T) / math.sqrt(K.shape[1])  # [S][g]
    p = np.exp(s - s.max(axis=0))
    p /= p.sum(axis=0)
    return (p.T @ V)


@uses_numpy
def test_attn_run_one_head_against_numpy():
    rng = np.random.default_rng(7)
    S, d, g = 96, 16, 2
    q = rng.standard_normal((g, d)).astype(np.float32)
    K = rng.standard_normal((S, d)).astype(np.float32)
    V = rng.standard_normal((S, d)).astype(np.float32)
    want = _naive_attention(q.astype(np.float64), K.astype(np.float64), V.astype(np.float64))
    dense = sparq.attn_run("dense", q, K, V, S, d, g)
    np.testing.assert_allclose(dense["out"], want, rtol=0, atol=1e-5)
    assert dense["elements"] == dense["formula_elements"] > 0
    full = sparq.attn_run(dict(policy="sparq", r=d, k=S), q, K, V, S, d, g)
    np.testing.assert_allclose(full["out"], want, rtol=0, atol=1e-5)
    assert full["sel"] == list(range(S))
    # a real SparQ step reads fewer elements and still points the right way
    small = sparq.attn_run(dict(policy="sparq", r=4, k=24, l=4), q, K, V, S, d, g)
    assert small["elements"] == small["formula_elements"] < dense["elements"]
    assert len(small["sel"]) == 24 and S - 1 in small["sel"]
    # nested lists work without numpy arrays
    lists = sparq.attn_run("dense", q.tolist(), K.tolist(), V.tolist(), S, d, g)
    np.testing.assert_allclose(lists["out"], dense["out"], rtol=0, atol=0)


@uses_numpy
def test_kv_file_roundtrip_low_level(model, tmp_path):
    ids = model.tokenize(PROMPT + ", there was a")
    path = str(tmp_path / "p.kv")
    with sparq.Context(model, n_ctx=64, n_threads=1) as c:
        c.eval(ids[:-1])
        c.save_kv(path, tokens=ids[:-1])
        want = c.eval(ids[-1:])
    with sparq.Context.load_kv(model, path) as c2:
        assert c2.pos == len(ids) - 1 and c2.n_ctx == 64
        got = c2.eval(ids[-1:])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@uses_numpy
def test_import_llama_state(model, tmp_path):
    """A state llama.cpp wrote (tests/data/llamacpp) imports, loads, and
    continues as sparq's own prefill of its tokens; a file that is no state
    raises with the library's reason."""
    state = os.path.join(ROOT, "tests", "data", "llamacpp", "stories260K-f16-fa.state")
    kv = str(tmp_path / "imported.kv")
    n = sparq.import_llama_state(model, state, kv, indexes="ivf")
    ids = list(struct.unpack_from("<%di" % n, open(state, "rb").read(), 12))
    assert n == 221 and len(ids) == n
    with sparq.Context(model, n_ctx=n + 8, n_threads=1) as own, sparq.Context.load_kv(model, kv) as got:
        assert got.pos == n
        own.eval(ids)
        a, b = own.eval([ids[-1]]), got.eval([ids[-1]])
    assert int(np.argmax(a)) == int(np.argmax(b))
    np.testing.assert_allclose(b, a, rtol=0, atol=2e-2)  # both caches f16; llama.cpp's keys differ by rounding
    bad = tmp_path / "bad.state"
    bad.write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(sparq.SparqError, match="not a sequence state"):
        sparq.import_llama_state(model, str(bad), str(tmp_path / "x.kv"))
    with pytest.raises(ValueError):
        sparq.import_llama_state(model, state, kv, kv_type="q4_0")


# ---- high level: output equals `sparq run` --------------------------------------

@pytest.mark.parametrize("prompt,n", [(PROMPT, 48), ("The dog", 30)])
def test_greedy_equals_sparq_run(model_path, sparq_bin, prompt, n):
    want = sparq_run(sparq_bin, model_path, "-p", prompt, "-n", str(n), "--temp", "0", "-c", "512", "-t", "2")
    with sparq.Llama(model_path, n_ctx=512, n_threads=2) as llm:
        out = llm(prompt, max_tokens=n, temperature=0)
    assert out["object"] == "text_completion"
    assert out["choices"][0]["text"].encode() == want
    assert out["usage"]["completion_tokens"] <= n
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"]


@pytest.mark.parametrize("ratio", ["1/4", "1/8"])
def test_sparq_ratio_equals_sparq_run(model_path, sparq_bin, ratio):
    """attn="sparq", sparq_ratio picks the command's r, k, l; the text and
    the counted attention traffic are the command's."""
    out = sparq_run(sparq_bin, model_path, "-p", PROMPT, "-n", "60", "--temp", "0", "-c", "256",
                    "--attn", "sparq", "--sparq-ratio", ratio, "-t", "1", "--json")
    want = json.loads(out)
    llm = sparq.Llama(model_path, n_ctx=256, attn="sparq", sparq_ratio=ratio, n_threads=1)
    v = llm.attn.values
    assert (v["r"], v["k"], v["l"]) == (want["attn"]["r"], want["attn"]["k"], want["attn"]["l"])
    got = llm.create_completion(PROMPT, max_tokens=60, temperature=0)
    assert got["choices"][0]["text"] == want["text"]
    st = llm.ctx.attn_stats()
    assert st["elements"] == want["attn"]["elements"] < want["attn"]["dense_elements"] == st["dense_elements"]
    llm.close()


def test_sampling_equals_sparq_run(model_path, sparq_bin):
    """Temperature/top-k/top-p go through the library's sampler, so a seed
    reproduces the command's output."""
    want = sparq_run(sparq_bin, model_path, "-p", PROMPT, "-n", "40", "--temp", "0.9", "--top-k", "20",
                     "--top-p", "0.9", "--seed", "123", "-c", "512", "-t", "1")
    with sparq.Llama(model_path, n_ctx=512, n_threads=1) as llm:
        out = llm(PROMPT, max_tokens=40, temperature=0.9, top_k=20, top_p=0.9, seed=123)
        assert out["choices"][0]["text"].encode() == want
        again = llm(PROMPT, max_tokens=40, temperature=0.9, top_k=20, top_p=0.9, seed=123)
        assert again["choices"][0]["text"] == out["choices"][0]["text"]



@uses_numpy
def test_sampler_logit_bias(model):
    """Sampler(logit_bias=...) against the reference argmax(logits + bias);
    a banned id is never drawn; bad lists are refused."""
    with sparq.Context(model, n_ctx=32, n_threads=1) as c:
        logits = np.array(c.eval(model.tokenize(PROMPT)), dtype=np.float32)
    top = int(np.argmax(logits))
    rng = np.random.default_rng(5)
    for trial in range(20):
        ids = rng.choice(512, size=12, replace=False)
        vals = rng.uniform(-6, 6, size=12)
        vals[:3] = -np.inf
        bias = {int(i): float(v) for i, v in zip(ids, vals)}
        want = logits.astype(np.float64)
        for i, v in bias.items():
            want[i] += v
        s = sparq.Sampler(512, temp=0, logit_bias=bias)
        assert s.sample(logits) == int(np.argmax(want)), trial
        s.close()
    # a ban or -100 on the argmax moves greedy to the next best; keys as
    # OpenAI's JSON strings or numpy ints
    second = int(np.argsort(-logits, kind="stable")[1])
    for bias in ({top: float("-inf")}, {str(top): -100}, {np.int64(top): np.float32(-100)}):
        s = sparq.Sampler(512, temp=0, logit_bias=bias)
        assert s.sample(logits) == second, bias
        s.set_logit_bias(None)  # cleared: the argmax again
        assert s.sample(logits) == top
        s.close()
    # hot sampling never draws a banned id (here the 20 most likely)
    banned = {int(i) for i in np.argsort(-logits)[:20]}
    s = sparq.Sampler(512, temp=1.5, top_k=0, top_p=1.0, seed=9, logit_bias={i: float("-inf") for i in banned})
    drawn = {s.sample(logits) for _ in range(3000)}
    s.close()
    assert not drawn & banned
    assert len(drawn) > 20
    # refused, with the library's message or a type error
    for bias, exc, msg in (({512: 1.0}, ValueError, "outside the vocabulary"),
                           ({-1: 1.0}, ValueError, "outside the vocabulary"),
                           ({3: float("nan")}, ValueError, "finite"), ({3: float("inf")}, ValueError, "finite"),
                           ({"x3": 1.0}, ValueError, "not a token id"), ({"-3": 1.0}, ValueError, "not a token id"),
                           ({3: "a"}, TypeError, "number"), ({True: 1.0}, TypeError, "int"),
                           ([3, 4], TypeError, "dict"),
                           ({i: float("-inf") for i in range(512)}, ValueError, "every")):
        with pytest.raises(exc, match=msg):
            sparq.Sampler(512, temp=0, logit_bias=bias)
    s = sparq.Sampler(512, temp=0, logit_bias={top: float("-inf")})
    with pytest.raises(ValueError, match="outside the vocabulary"):
        s.set_logit_bias({top: 0.0, 9999: 1.0})
    assert s.sample(logits) == second  # the old list still holds
    s.close()


def test_logit_bias_equals_sparq_run(model_path, sparq_bin):
    """create_completion(logit_bias=...) is `sparq run -l ...` (the same
    library sampler); the chat form takes OpenAI's string keys."""
    want = sparq_run(sparq_bin, model_path, "-p", PROMPT, "-n", "24", "--temp", "0", "-c", "512", "-t", "1",
                     "-l", "432-inf", "-l", "383+2.5")
    plain = sparq_run(sparq_bin, model_path, "-p", PROMPT, "-n", "24", "--temp", "0", "-c", "512", "-t", "1")
    assert want != plain
    with sparq.Llama(model_path, n_ctx=512, n_threads=1, chat_format="chatml") as llm:
        out = llm(PROMPT, max_tokens=24, temperature=0, logit_bias={432: float("-inf"), 383: 2.5})
        assert out["choices"][0]["text"].encode() == want
        out = llm(PROMPT, max_tokens=24, temperature=0, logit_bias={})
        assert out["choices"][0]["text"].encode() == plain
        # every id but 383 at -100: each greedy step picks 383
        msgs = [{"role": "user", "content": "hi"}]
        ban = {str(i): -100 for i in range(512) if i != 383}
        got = llm.create_chat_completion(msgs, max_tokens=6, temperature=0, logit_bias=ban)
        assert got["choices"][0]["message"]["content"].encode() == llm.model.token_to_piece(383) * 6
        with pytest.raises(ValueError, match="outside the vocabulary"):
            llm(PROMPT, max_tokens=2, logit_bias={100000: 1.0})

def test_stream_equals_non_stream(model_path):
    with sparq.Llama(model_path, n_ctx=512, n_threads=1) as llm:
        full = llm(PROMPT, max_tokens=40, temperature=0)
        chunks = list(llm(PROMPT, max_tokens=40, temperature=0, stream=True))
    assert len(chunks) > 5
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == full["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"][0]["finish_reason"] == full["choices"][0]["finish_reason"] == "length"


def test_echo_and_stop(model_path):
    with sparq.Llama(model_path, n_ctx=512, n_threads=1) as llm:
        full = llm(PROMPT, max_tokens=40, temperature=0)["choices"][0]["text"]
        assert "Lily" in full
        cut = llm(PROMPT, max_tokens=40, temperature=0, stop=["Lily"])
        assert cut["choices"][0]["text"] == full[:full.index("Lily")]
        assert cut["choices"][0]["finish_reason"] == "stop"
        streamed = "".join(c["choices"][0]["text"] for c in
                           llm(PROMPT, max_tokens=40, temperature=0, stop="Lily", stream=True))
        assert streamed == cut["choices"][0]["text"]
        echo = llm(PROMPT, max_tokens=5, temperature=0, echo=True)["choices"][0]["text"]
        assert echo.startswith(PROMPT) and len(echo) > len(PROMPT)


def test_chat_completion_and_stream(model_path, model):
    msgs = [{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "A cat"}]
    with sparq.Llama(model_path, n_ctx=512, chat_format="chatml", n_threads=1) as llm:
        out = llm.create_chat_completion(msgs, max_tokens=20, temperature=0)
        assert out["object"] == "chat.completion"
        msg = out["choices"][0]["message"]
        assert msg["role"] == "assistant" and isinstance(msg["content"], str) and msg["content"]
        assert out["usage"]["prompt_tokens"] == len(model.chat_tokenize(msgs, template="chatml"))
        chunks = list(llm.create_chat_completion(msgs, max_tokens=20, temperature=0, stream=True))
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        assert text == msg["content"]
        assert chunks[-1]["choices"][0]["finish_reason"] == out["choices"][0]["finish_reason"]
    with sparq.Llama(model_path, n_ctx=512, n_threads=1) as llm:  # no template in this GGUF
        with pytest.raises(sparq.SparqError, match="chat_template"):
            llm.create_chat_completion(msgs)


def test_save_state_load_state(model_path, tmp_path):
    path = str(tmp_path / "state.kv")
    cont = PROMPT + ", there was a little"
    with sparq.Llama(model_path, n_ctx=256, n_threads=1) as llm:
        fresh = llm(cont, max_tokens=30, temperature=0)["choices"][0]["text"]
        llm.reset()
        llm.eval(llm.tokenize(PROMPT))
        llm.save_state(path)
    with open(path + ".ids.json") as f:
        assert json.load(f)["ids"] == sparq.Model(model_path).tokenize(PROMPT)
    with sparq.Llama(model_path, n_ctx=256, n_threads=1) as llm2:
        llm2.load_state(path)
        assert llm2.ctx.pos == len(llm2.tokenize(PROMPT))
        out = llm2(cont, max_tokens=30, temperature=0)
        assert out["choices"][0]["text"] == fresh
        # the state is reused again after the cache moved on
        assert llm2(cont, max_tokens=30, temperature=0)["choices"][0]["text"] == fresh


# ---- errors: exceptions with the library's message, never a crash ---------------

def test_missing_model():
    with pytest.raises(sparq.SparqError, match="not found"):
        sparq.Llama("/no/such/model.gguf")
    with pytest.raises(sparq.SparqError, match="no/such"):
        sparq.Model("/no/such/model.gguf")


def test_not_a_gguf(tmp_path):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"this is not a gguf file at all" * 10)
    with pytest.raises(sparq.SparqError) as e:
        sparq.Model(str(p))
    assert str(e.value) and "\n" not in str(e.value)


def test_closed_model_and_context(model_path):
    m = sparq.Model(model_path)
    c = sparq.Context(m, n_ctx=32)
    m.close()
    assert c.closed  # closing the model closed its context
    for f in (lambda: m.tokenize("x"), lambda: m.n_vocab, lambda: c.eval([1]), lambda: c.pos,
              lambda: sparq.Context(m, n_ctx=8), lambda: c.attn_stats()):
        with pytest.raises(sparq.SparqError, match="closed"):
            f()
    m.close()  # twice is fine
    llm = sparq.Llama(model_path, n_ctx=32, n_threads=1)
    llm.close()
    with pytest.raises(sparq.SparqError, match="closed"):
        llm("hi", max_tokens=2)


def test_wrong_types(model):
    with pytest.raises(TypeError):
        model.tokenize(123)
    with sparq.Context(model, n_ctx=16, n_threads=1) as c:
        with pytest.raises(TypeError):
            c.eval("Once upon")
        with pytest.raises(TypeError):
            c.eval([1, "a"])
        with pytest.raises(TypeError):
            c.eval(5)
        with pytest.raises(ValueError):
            c.eval([])
    with pytest.raises(TypeError):
        sparq.Context("model.gguf")
    with pytest.raises(TypeError):
        sparq.Context(model, n_ctx="big")
    with pytest.raises(TypeError):
        sparq.AttnParams("sparq", nonsense=3)
    with pytest.raises(TypeError):
        sparq.attn_run("dense", "q", [0.0] * 4, [0.0] * 4, 1, 4)
    with pytest.raises(ValueError):
        sparq.attn_run("dense", [0.0] * 3, [0.0] * 4, [0.0] * 4, 1, 4)


def test_library_errors_carry_its_message(model):
    with sparq.Context(model, n_ctx=16, n_threads=1) as c:
        with pytest.raises(sparq.SparqError) as e:
            c.eval([1, 100000])  # bad token id: the library says so
        assert str(e.value) and "\n" not in str(e.value)
    with pytest.raises(sparq.SparqError):
        sparq.Context(model, n_ctx=16, attn="no-such-policy")
    with pytest.raises(sparq.SparqError):
        sparq.attn_run("no-such-policy", [0.0] * 4, [0.0] * 4, [0.0] * 4, 1, 4)
    with pytest.raises(sparq.SparqError):
        model.chat_tokenize([{"role": "user", "content": "x"}], template="no-such-template")


def test_context_full(model, model_path):
    ids = model.tokenize(PROMPT)
    with sparq.Context(model, n_ctx=8, n_threads=1) as c:
        c.eval(ids)
        with pytest.raises(sparq.SparqError) as e:
            c.eval([300] * 4)
        assert str(e.value)
        assert c.pos == len(ids)  # the failed call changed nothing
        c.eval([300] * (8 - len(ids)))  # filling it exactly works
        with pytest.raises(sparq.SparqError):
            c.eval([300])
    with sparq.Llama(model_path, n_ctx=16, n_threads=1) as llm:
        out = llm(PROMPT, max_tokens=100, temperature=0)
        assert out["choices"][0]["finish_reason"] == "length"
        assert out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"] <= 16 + 1
        with pytest.raises(sparq.SparqError, match="context holds"):
            llm("word " * 40, max_tokens=4)


def test_bad_sampling_options(model_path):
    with sparq.Llama(model_path, n_ctx=64, n_threads=1) as llm:
        for kw in (dict(temperature=float("nan")), dict(temperature=-1), dict(top_p=0), dict(top_k=-3),
                   dict(top_p=1.5)):
            with pytest.raises(ValueError):
                llm(PROMPT, max_tokens=2, **kw)
        with pytest.raises(TypeError):
            llm(12345)
        # min_p and the penalties are the library sampler's; out-of-range values are refused
        out = llm(PROMPT, max_tokens=3, temperature=0, repeat_penalty=1.1, min_p=0.05, logprobs=None,
                  frequency_penalty=0.5, presence_penalty=0.5, grammar=None)
        assert out["usage"]["completion_tokens"] == 3
        for kw in (dict(min_p=1.5), dict(repeat_penalty=float("nan")), dict(frequency_penalty="x")):
            with pytest.raises(ValueError):
                llm(PROMPT, max_tokens=2, **kw)
        # llama-cpp-python options sparq lacks: "off" is accepted, anything else refused
        for kw in (dict(grammar="root ::= x"), dict(mirostat_mode=2)):
            with pytest.raises(ValueError, match="not supported by sparq: " + list(kw)[0]):
                llm(PROMPT, max_tokens=2, **kw)
            with pytest.raises(ValueError, match="not supported"):
                llm.create_chat_completion([{"role": "user", "content": "x"}], **kw)
        with pytest.raises(ValueError, match="not supported by sparq: logprobs"):
            llm.create_chat_completion([{"role": "user", "content": "x"}], logprobs=5)
        # a name llama-cpp-python does not have is a misspelling: TypeError, as Python's own
        for kw in (dict(no_such_option=1), dict(no_such_option=None), dict(max_tokenz=3)):
            with pytest.raises(TypeError, match="unexpected keyword argument '%s'" % list(kw)[0]):
                llm(PROMPT, max_tokens=2, **kw)
            with pytest.raises(TypeError, match="unexpected keyword argument"):
                llm.create_chat_completion([{"role": "user", "content": "x"}], **kw)
        with pytest.raises(ValueError):
            sparq.Llama(model_path, attn="dense", sparq_ratio="1/8", n_threads=1)
        with pytest.raises(ValueError):
            sparq.ratio_params("2/1", 512, 64)

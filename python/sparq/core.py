"""The low-level API: one Python class per C object of include/sparq.h.

Every call checks the object is open and the argument types before it
reaches C, and turns the library's -1 + message into SparqError, so misuse
raises instead of crashing.
"""
import ctypes
import os
import struct
import weakref

from . import _lib as L
from ._lib import SparqError

try:  # optional: logits and attention outputs as arrays
    import numpy as _np
except ImportError:  # pragma: no cover - exercised where numpy is absent
    _np = None

KV_TYPES = {"f32": 0, "f16": 1}
KEY_TYPES = {None: 0, "default": 0, "f16": 1, "bf16": 2, "i8": 3, "int8": 3}
SCHEDULES = {None: 0, "uniform": 0, "linear": 1}
ERR_SIZE = 512


def lib():
    return L.load()


def version():
    return lib().sparq_version().decode()


def cpu_level():
    """The SIMD kernel level the library runs: "avx512", "avx2" or "ref"."""
    return lib().sparq_cpu_level().decode()


def find_model(name):
    """Resolves a model or data file: the name itself, then
    $SPARQ_MODEL_PATH (colon-separated), then the checkout's models/ when
    the package runs from one (python/sparq/../../models, as the C library
    finds models/ beside build/). A development layout (reference data
    beside the checkout) is added through $SPARQ_MODEL_PATH, as the tests
    do. Returns the path, or None."""
    if not isinstance(name, (str, bytes, os.PathLike)):
        raise TypeError("model path must be a str or path, not %s" % type(name).__name__)
    name = os.fsdecode(name)
    if os.access(name, os.R_OK):
        return name
    if os.path.isabs(name):
        return None
    dirs = [d for d in os.environ.get("SPARQ_MODEL_PATH", "").split(":") if d]
    here = os.path.dirname(os.path.abspath(__file__))
    for d in dirs + [os.path.join(here, "..", "..", "models")]:
        p = os.path.join(d, name)
        if os.access(p, os.R_OK):
            return p
    return None


def _bytes(s, what):
    if isinstance(s, bytes):
        return s
    if isinstance(s, str):
        return s.encode("utf-8")
    raise TypeError("%s must be str or bytes, not %s" % (what, type(s).__name__))


def _int(v, what):
    if isinstance(v, bool) or not isinstance(v, int):
        if _np is not None and isinstance(v, _np.integer):
            return int(v)
        raise TypeError("%s must be an int, not %s" % (what, type(v).__name__))
    return v


def _ids(tokens, what="tokens"):
    """A ctypes int32 array from a sequence of ints (or a numpy int array)."""
    if isinstance(tokens, (str, bytes)):
        raise TypeError("%s must be a sequence of token ids, not %s (tokenize it first)" %
                        (what, type(tokens).__name__))
    try:
        seq = list(tokens)
    except TypeError:
        raise TypeError("%s must be a sequence of token ids, not %s" % (what, type(tokens).__name__))
    vals = [_int(t, "token id") for t in seq]
    for t in vals:
        if not -2**31 <= t < 2**31:
            raise ValueError("token id %d out of range" % t)
    return (ctypes.c_int32 * len(vals))(*vals), len(vals)


def _floats_out(buf, shape=None):
    """A float buffer as a numpy array (numpy present) or a memoryview."""
    if _np is not None:
        a = _np.frombuffer(buf, dtype=_np.float32)
        return a.reshape(shape) if shape else a
    mv = memoryview(buf).cast("B").cast("f")
    return mv.cast("B").cast("f", shape) if shape else mv


def _floats_in(x, n, what):
    """A C float pointer over x (numpy array, float32 buffer or sequence),
    checked to hold n floats; returns (pointer, keepalive)."""
    if x is None:
        return None, None
    if _np is not None and not isinstance(x, (bytes, str)):
        try:
            a = _np.ascontiguousarray(x, dtype=_np.float32)
        except (TypeError, ValueError) as e:
            raise TypeError("%s must be an array of floats (%s)" % (what, e))
        if a.size != n:
            raise ValueError("%s has %d elements, expected %d" % (what, a.size, n))
        return a.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), a
    try:
        mv = memoryview(x)
        if mv.format == "f" and mv.c_contiguous:
            if mv.nbytes != 4 * n:
                raise ValueError("%s has %d elements, expected %d" % (what, mv.nbytes // 4, n))
            arr = (ctypes.c_float * n).from_buffer_copy(mv)
            return arr, arr
    except TypeError:
        pass
    flat = []

    def walk(v):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            flat.append(float(v))
        elif isinstance(v, (str, bytes)):
            raise TypeError("%s must hold numbers, not %s" % (what, type(v).__name__))
        else:
            try:
                for e in v:
                    walk(e)
            except TypeError:
                raise TypeError("%s must hold numbers, not %s" % (what, type(v).__name__))
    walk(x)
    if len(flat) != n:
        raise ValueError("%s has %d elements, expected %d" % (what, len(flat), n))
    arr = (ctypes.c_float * n)(*flat)
    return arr, arr


def ratio_params(ratio, S, d):
    """SparQ's r and k for a transfer ratio (e.g. "1/8") at context S and head
    size d: sparq_attn_params_from_ratio, the arithmetic of `sparq run
    --sparq-ratio` and the server's "ratio"."""
    if isinstance(ratio, (int, float)) and not isinstance(ratio, bool):
        text = str(ratio)  # a float's str() reads back as the same double
    elif isinstance(ratio, str):
        text = ratio
    else:
        raise TypeError("sparq_ratio must be a str like '1/8' or a number")
    if "\0" in text:  # C would read only up to the NUL
        raise ValueError("sparq_ratio %r must be a fraction in (0, 1], e.g. 1/8" % ratio)
    p = lib().sparq_attn_default_params()
    p.policy = b"sparq"
    err = ctypes.create_string_buffer(256)
    if lib().sparq_attn_params_from_ratio(ctypes.byref(p), text.encode("utf-8", "replace"), _int(S, "S"),
                                          _int(d, "d"), b"sparq_ratio", err, len(err)):
        raise ValueError(err.value.decode("utf-8", "replace"))
    return p.r, p.k


class AttnParams:
    """sparq_attn_params with keyword arguments: AttnParams("sparq", r=16, k=64).
    Zero (or -1 for l) means the policy's default, as in C."""

    FIELDS = ("r", "k", "l", "select_logits", "no_realloc", "n_sink", "topk_schedule",
              "index_key_type", "ivf_nlist", "ivf_nprobe", "hnsw_ef_search", "topk_check",
              "select_always", "adaptive_k", "k_min")

    def __init__(self, policy="dense", index=None, **kw):
        self.policy = policy
        self.index = index
        d = lib().sparq_attn_default_params()
        self.values = {f: getattr(d, f) for f in self.FIELDS}
        for k, v in kw.items():
            if k == "topk_schedule" and (isinstance(v, str) or v is None):
                if v not in SCHEDULES:
                    raise ValueError("topk_schedule must be uniform or linear, not %r" % v)
                v = SCHEDULES[v]
            if k == "index_key_type" and (isinstance(v, str) or v is None):
                if v not in KEY_TYPES:
                    raise ValueError("index_key_type must be f16, bf16 or i8, not %r" % v)
                v = KEY_TYPES[v]
            if k not in self.values:
                raise TypeError("unknown attention parameter %r (known: policy, index, %s)" %
                                (k, ", ".join(self.FIELDS)))
            self.values[k] = _int(v, k)

    @classmethod
    def coerce(cls, attn):
        if attn is None:
            return cls()
        if isinstance(attn, cls):
            return attn
        if isinstance(attn, str):
            return cls(attn)
        if isinstance(attn, dict):
            return cls(**attn)
        raise TypeError("attn must be a policy name, a dict or AttnParams, not %s" % type(attn).__name__)

    def to_c(self):
        """The C struct and the bytes objects its pointers borrow (keep both)."""
        pol = _bytes(self.policy, "policy") if self.policy is not None else None
        idx = _bytes(self.index, "index") if self.index is not None else None
        s = L.sparq_attn_params(policy=pol, index=idx, **self.values)
        return s, (pol, idx)

    def __repr__(self):
        return "AttnParams(%r, index=%r, %s)" % (self.policy, self.index,
                                                 ", ".join("%s=%d" % kv for kv in self.values.items()))


class Model:
    """A loaded GGUF model (sparq_model). Close it with close() or `with`;
    closing a model closes its contexts first."""

    def __init__(self, path, use_mmap=False):
        p = _bytes(os.fspath(path) if isinstance(path, os.PathLike) else path, "model path")
        self._lib = lib()
        self._h = None
        self._contexts = weakref.WeakSet()
        self.path = os.fsdecode(p)
        mp = self._lib.sparq_model_default_params()
        mp.use_mmap = 1 if use_mmap else 0
        out = ctypes.c_void_p()
        err = ctypes.create_string_buffer(ERR_SIZE)
        if self._lib.sparq_model_load_params(p, ctypes.byref(mp), ctypes.byref(out), err, ERR_SIZE) != 0:
            raise SparqError(err.value.decode("utf-8", "replace") or "cannot load %s" % self.path)
        self._h = out

    def _handle(self):
        if self._h is None:
            raise SparqError("the model is closed")
        return self._h

    @property
    def closed(self):
        return self._h is None

    def close(self):
        for c in list(self._contexts):
            c.close()
        if self._h is not None:
            self._lib.sparq_model_free(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- properties ------------------------------------------------------
    n_vocab = property(lambda s: s._lib.sparq_model_n_vocab(s._handle()))
    n_layer = property(lambda s: s._lib.sparq_model_n_layer(s._handle()))
    n_head = property(lambda s: s._lib.sparq_model_n_head(s._handle()))
    n_kv_head = property(lambda s: s._lib.sparq_model_n_kv_head(s._handle()))
    head_dim = property(lambda s: s._lib.sparq_model_head_dim(s._handle()))
    n_ctx_train = property(lambda s: s._lib.sparq_model_n_ctx_train(s._handle()))
    n_embd = property(lambda s: s._lib.sparq_model_n_embd(s._handle()))
    arch = property(lambda s: (s._lib.sparq_model_arch(s._handle()) or b"").decode())
    token_bos = property(lambda s: s._lib.sparq_token_bos(s._handle()))
    token_eos = property(lambda s: s._lib.sparq_token_eos(s._handle()))

    def is_eog(self, token):
        return bool(self._lib.sparq_token_is_eog(self._handle(), _int(token, "token")))

    # -- text ------------------------------------------------------------
    def tokenize(self, text, add_special=True):
        """Token ids of text (str or bytes); add_special adds BOS/EOS as the
        vocabulary asks."""
        b = _bytes(text, "text")
        h = self._handle()
        n = self._lib.sparq_tokenize(h, b, len(b), 1 if add_special else 0, None, 0)
        if n < 0:
            raise SparqError("cannot tokenize the text")
        ids = (ctypes.c_int32 * max(n, 1))()
        m = self._lib.sparq_tokenize(h, b, len(b), 1 if add_special else 0, ids, n)
        if m != n:
            raise SparqError("tokenization changed between calls")
        return list(ids[:n])

    def token_to_piece(self, token):
        """The bytes one token prints as."""
        t = _int(token, "token")
        h = self._handle()
        if not 0 <= t < self.n_vocab:
            raise SparqError("token id %d is outside the vocabulary (0..%d)" % (t, self.n_vocab - 1))
        buf = ctypes.create_string_buffer(256)
        n = self._lib.sparq_token_to_piece(h, t, buf, 256)
        if n < 0:
            raise SparqError("no piece for token %d" % t)
        if n > 256:
            buf = ctypes.create_string_buffer(n)
            n = self._lib.sparq_token_to_piece(h, t, buf, n)
        return buf.raw[:n]

    def detokenize(self, tokens):
        """The bytes of a sequence of tokens (what `sparq run` prints)."""
        arr, n = _ids(tokens)
        return b"".join(self.token_to_piece(arr[i]) for i in range(n))

    def chat_tokenize(self, messages, template=None, add_assistant=True):
        """Token ids of chat messages [{"role":..., "content":...}] rendered
        with a template (llama3, chatml, phi3, mistral, gemma; None: the
        model's own)."""
        if not isinstance(messages, (list, tuple)):
            raise TypeError("messages must be a list of {'role', 'content'} dicts")
        keep = []
        arr = (L.sparq_chat_msg * max(len(messages), 1))()
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise TypeError("message %d must be a dict with 'role' and 'content'" % i)
            role, content = _bytes(m["role"], "role"), _bytes(m["content"] or "", "content")
            keep += [role, content]
            arr[i].role, arr[i].content = role, content
        tmpl = _bytes(template, "template") if template is not None else None
        h = self._handle()
        err = ctypes.create_string_buffer(ERR_SIZE)
        n = self._lib.sparq_chat_tokenize(h, tmpl, arr, len(messages), 1 if add_assistant else 0,
                                          None, 0, err, ERR_SIZE)
        if n < 0:
            raise SparqError(err.value.decode("utf-8", "replace") or "cannot render the chat")
        ids = (ctypes.c_int32 * max(n, 1))()
        self._lib.sparq_chat_tokenize(h, tmpl, arr, len(messages), 1 if add_assistant else 0,
                                      ids, n, err, ERR_SIZE)
        return list(ids[:n])


class Context:
    """A KV cache and scratch for one sequence (sparq_context).

    Context(model, n_ctx=512, n_threads=0, attn=AttnParams("sparq", r=16, k=64))
    eval(tokens) runs them and returns the last position's logits."""

    def __init__(self, model, n_ctx=0, n_threads=0, n_batch=0, kv_type="f16", attn=None,
                 _load_path=None, _verify=0):
        if not isinstance(model, Model):
            raise TypeError("model must be a sparq.Model, not %s" % type(model).__name__)
        self._lib = lib()
        self._h = None
        self.model = model
        if kv_type not in KV_TYPES:
            raise ValueError("kv_type must be 'f16' or 'f32', not %r" % (kv_type,))
        cp = self._lib.sparq_context_default_params()
        cp.n_ctx = _int(n_ctx, "n_ctx")
        cp.n_threads = _int(n_threads, "n_threads")
        cp.n_batch = _int(n_batch, "n_batch")
        cp.kv_type = KV_TYPES[kv_type]
        if cp.n_ctx < 0 or cp.n_threads < 0 or cp.n_batch < 0:
            raise ValueError("n_ctx, n_threads and n_batch must be >= 0 (0 = the default)")
        self.attn = AttnParams.coerce(attn)
        cp.attn, self._keep = self.attn.to_c()  # the context keeps pointers to these strings
        out = ctypes.c_void_p()
        err = ctypes.create_string_buffer(ERR_SIZE)
        mh = model._handle()
        if _load_path is None:
            rc = self._lib.sparq_context_create(mh, ctypes.byref(cp), ctypes.byref(out), err, ERR_SIZE)
        else:
            rc = self._lib.sparq_context_load_kv(mh, ctypes.byref(cp), _bytes(_load_path, "path"),
                                                 _verify, ctypes.byref(out), err, ERR_SIZE)
        if rc != 0:
            raise SparqError(err.value.decode("utf-8", "replace") or "cannot create the context")
        self._h = out
        self.n_vocab = model.n_vocab
        model._contexts.add(self)

    @classmethod
    def load_kv(cls, model, path, n_threads=0, n_batch=0, attn=None, verify_all=False):
        """A context whose cache is the KV file at path (docs/KVFILE.md); its
        capacity and KV type are the file's."""
        p = os.fsdecode(path) if isinstance(path, (bytes, os.PathLike)) else path
        if not isinstance(p, str):
            raise TypeError("path must be a str or path")
        return cls(model, 0, n_threads, n_batch, "f16", attn, _load_path=p, _verify=1 if verify_all else 0)

    def _handle(self):
        if self._h is None:
            raise SparqError("the context is closed")
        if self.model.closed:
            raise SparqError("the context's model is closed")
        return self._h

    @property
    def closed(self):
        return self._h is None

    def close(self):
        if self._h is not None:
            self._lib.sparq_context_free(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    pos = property(lambda s: s._lib.sparq_context_pos(s._handle()))
    n_ctx = property(lambda s: s._lib.sparq_context_n_ctx(s._handle()))

    def _error(self, what):
        msg = self._lib.sparq_context_error(self._h)
        return SparqError((msg or b"").decode("utf-8", "replace") or what)

    def eval(self, tokens):
        """Appends tokens and runs the model (n > 1: a dense prefill; n == 1: a
        decode step through the attention policy). Returns the last token's
        logits [n_vocab] (numpy float32 array, or a memoryview of floats)."""
        h = self._handle()
        arr, n = _ids(tokens)
        if n == 0:
            raise ValueError("eval needs at least one token")
        buf = (ctypes.c_float * self.n_vocab)()
        if self._lib.sparq_eval(h, arr, n, buf) != 0:
            raise self._error("eval failed")
        return _floats_out(buf)

    def eval_all(self, tokens):
        """Like eval, returning logits of every token: [n][n_vocab]."""
        h = self._handle()
        arr, n = _ids(tokens)
        if n == 0:
            raise ValueError("eval needs at least one token")
        buf = (ctypes.c_float * (n * self.n_vocab))()
        if self._lib.sparq_eval_all(h, arr, n, buf) != 0:
            raise self._error("eval failed")
        return _floats_out(buf, (n, self.n_vocab))

    def embed(self, tokens, pooling="mean", normalize=2):
        """The embedding of tokens as llama.cpp computes it (sparq_embed):
        final hidden states pooled by "mean", "cls", "last" ([n_embd]) or
        "none" ([n][n_embd], one row per token), each row normalised
        (normalize: -1 none, 0 int16 range, 1 taxicab, 2 euclidean, p > 2
        p-norm). Resets the cache first; the tokens stay in it."""
        h = self._handle()
        if not isinstance(pooling, str):
            raise TypeError("pooling must be a str, not %s" % type(pooling).__name__)
        pid = self._lib.sparq_pooling_find(pooling.encode())
        if pid < 0:
            raise ValueError("pooling must be none, mean, cls or last, not %r" % pooling)
        normalize = _int(normalize, "normalize")
        if not -2**31 <= normalize < 2**31:
            raise ValueError("normalize out of range")
        arr, n = _ids(tokens)
        if n == 0:
            raise ValueError("embed needs at least one token")
        E = self.model.n_embd
        rows = n if pid == 0 else 1
        buf = (ctypes.c_float * (rows * E))()
        if self._lib.sparq_embed(h, arr, n, pid, normalize, buf) != 0:
            raise self._error("embed failed")
        return _floats_out(buf, (n, E) if pid == 0 else None)

    def reset(self):
        self._lib.sparq_context_reset(self._handle())

    def mark_prefix(self):
        self._lib.sparq_context_mark_prefix(self._handle())

    def fill_random(self, n, seed=1):
        if self._lib.sparq_context_fill_random(self._handle(), _int(n, "n"), _int(seed, "seed")) != 0:
            raise self._error("fill_random failed")

    def save_kv(self, path, indexes=None, tokens=None):
        """Writes the cache to a KV file, with the prefix's token ids if given
        and prebuilt indexes ("exact,ivf", ...)."""
        h = self._handle()
        p = _bytes(os.fsdecode(path) if isinstance(path, os.PathLike) else path, "path")
        idx = _bytes(indexes, "indexes") if indexes is not None else None
        arr, n = (None, 0) if tokens is None else _ids(tokens)
        err = ctypes.create_string_buffer(ERR_SIZE)
        if self._lib.sparq_context_save_kv(h, p, idx, arr, n, err, ERR_SIZE) != 0:
            raise SparqError(err.value.decode("utf-8", "replace") or "cannot save the KV file")

    def attn_stats(self):
        """Attention transfer accounting summed over the decode steps so far."""
        s = L.sparq_attn_stats()
        self._lib.sparq_context_attn_stats(self._handle(), ctypes.byref(s))
        return {f: getattr(s, f) for f, _ in s._fields_}


def import_llama_state(model, state_path, kv_path, indexes="ivf", kv_type=None, n_ctx=0, n_threads=0):
    """Converts a llama.cpp sequence state (llama-server's /slots/ID?action=save,
    llama.cpp b5913 or later) of the same GGUF into the KV file kv_path with
    the index kinds `indexes` (comma list, "" for none); the cache keeps the
    state's type unless kv_type ("f32", "f16", "q8_0") says otherwise.
    Returns the positions imported; Context.load_kv(model, kv_path) reads it."""
    paths = []
    for what, p in (("state_path", state_path), ("kv_path", kv_path)):
        p = os.fsdecode(p) if isinstance(p, (bytes, os.PathLike)) else p
        if not isinstance(p, str):
            raise TypeError("%s must be a str or path" % what)
        paths.append(p)
    types = dict(KV_TYPES, q8_0=2)
    if kv_type is not None and kv_type not in types:
        raise ValueError("kv_type must be one of %s or None, not %r" % (sorted(types), kv_type))
    lib_ = lib()
    cp = lib_.sparq_context_default_params()
    cp.n_ctx = _int(n_ctx, "n_ctx")
    cp.n_threads = _int(n_threads, "n_threads")
    n = ctypes.c_int64(0)
    err = ctypes.create_string_buffer(ERR_SIZE)
    rc = lib_.sparq_import_llama_state(model._handle(), ctypes.byref(cp), _bytes(paths[0], "state_path"),
                                       _bytes(paths[1], "kv_path"), _bytes(indexes or "", "indexes"),
                                       -1 if kv_type is None else types[kv_type], ctypes.byref(n), err, ERR_SIZE)
    if rc != 0:
        raise SparqError(err.value.decode("utf-8", "replace") or "cannot import the state")
    return n.value


def _logit_bias(logit_bias):
    """{token id: bias} as two ctypes arrays (ids, biases) and their length.
    Keys are ints or, as in OpenAI's JSON, decimal strings ("50256"); a
    bias is a number, float("-inf") banning the id. The library checks the
    ranges (ids in the vocabulary, no NaN or +inf)."""
    if not isinstance(logit_bias, dict):
        raise TypeError("logit_bias must be a dict {token id: bias}, not %s" % type(logit_bias).__name__)
    ids, vals = [], []
    for k, v in logit_bias.items():
        if isinstance(k, str):
            if not k.isascii() or not k.isdigit():
                raise ValueError("logit_bias key %r is not a token id" % k)
            k = int(k)
        k = _int(k, "logit_bias token id")
        if isinstance(v, bool) or not isinstance(v, (int, float)) and not (
                _np is not None and isinstance(v, (_np.integer, _np.floating))):
            raise TypeError("logit_bias of token %d must be a number, not %s" % (k, type(v).__name__))
        ids.append(k)
        vals.append(float(v))
    arr, n = _ids(ids, "logit_bias token ids")
    return arr, (ctypes.c_float * n)(*vals), n


class Sampler:
    """The library's sampler (sparq_sampler): temp 0 is greedy (argmax, ties
    to the lowest id); else penalties over the last penalty_last_n ids,
    temperature, top-k (0 = off), top-p (1 = off), min-p (0 = off).
    logit_bias {token id: bias} is added to the logits before all of that
    (OpenAI's and llama.cpp's logit_bias; float("-inf") bans an id)."""

    def __init__(self, n_vocab, temp=0.0, top_k=0, top_p=1.0, seed=42, min_p=0.0, repeat_penalty=1.0,
                 presence_penalty=0.0, frequency_penalty=0.0, penalty_last_n=64, logit_bias=None):
        self._lib = lib()
        self._h = None
        for v, name in ((temp, "temp"), (top_p, "top_p")):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
                raise ValueError("%s must be a number, not %r" % (name, v))
        if temp < 0:
            raise ValueError("temp must be >= 0")
        if not 0 < top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if _int(top_k, "top_k") < 0:
            raise ValueError("top_k must be >= 0")
        self.n_vocab = _int(n_vocab, "n_vocab")
        for v, name in ((min_p, "min_p"), (repeat_penalty, "repeat_penalty"),
                        (presence_penalty, "presence_penalty"), (frequency_penalty, "frequency_penalty")):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
                raise ValueError("%s must be a number, not %r" % (name, v))
        p = L.sparq_sampler_params(float(temp), top_k, float(top_p), _int(seed, "seed") & (2**64 - 1),
                                   float(min_p), float(repeat_penalty), float(presence_penalty),
                                   float(frequency_penalty), _int(penalty_last_n, "penalty_last_n"))
        err = ctypes.create_string_buffer(256)
        if self._lib.sparq_sampler_check(ctypes.byref(p), err, len(err)):
            raise ValueError(err.value.decode("utf-8", "replace"))
        h = self._lib.sparq_sampler_create(ctypes.byref(p), self.n_vocab)
        if not h:
            raise SparqError("cannot create a sampler for %d tokens" % self.n_vocab)
        self._h = h
        if logit_bias:
            self.set_logit_bias(logit_bias)  # a bad one raises; __del__ frees the sampler

    def set_logit_bias(self, logit_bias):
        """Replaces the logit bias ({token id: bias}; None or {} clears it)."""
        if self._h is None:
            raise SparqError("the sampler is closed")
        ids, vals, n = _logit_bias(logit_bias or {})
        err = ctypes.create_string_buffer(ERR_SIZE)
        if self._lib.sparq_sampler_set_logit_bias(self._h, ids, vals, n, err, ERR_SIZE):
            raise ValueError(err.value.decode("utf-8", "replace"))

    def accept(self, token):
        """Adds a token to the penalty window without drawing (prompt ids)."""
        if self._h is None:
            raise SparqError("the sampler is closed")
        self._lib.sparq_sampler_accept(self._h, _int(token, "token"))

    def sample(self, logits):
        if self._h is None:
            raise SparqError("the sampler is closed")
        ptr, keep = _floats_in(logits, self.n_vocab, "logits")
        return self._lib.sparq_sample(self._h, ptr)

    def close(self):
        if self._h is not None:
            self._lib.sparq_sampler_free(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def attn_run(attn, q, K, V, S, d, g=1, KT=None, v_mean=None, kv_type="f32"):
    """One decode step of an attention policy for ONE KV head and its g query
    heads (sparq_attn_run; include/sparq_attn.h for the layouts):
    q [g][d], K and V [S][d], KT [d][S] or None, v_mean [d] or None.
    Returns {"out": [g][d], "sel": positions read, "i1": SparQ's r
    components, "alpha": [g], "elements": cache traffic}."""
    lb = lib()
    ap = AttnParams.coerce(attn)
    S, d, g = _int(S, "S"), _int(d, "d"), _int(g, "g")
    if S < 1 or d < 1 or g < 1:
        raise ValueError("S, d and g must be >= 1")
    if kv_type not in KV_TYPES:
        raise ValueError("kv_type must be 'f16' or 'f32'")
    cp, keep = ap.to_c()
    qp, k1 = _floats_in(q, g * d, "q")
    Kp, k2 = _floats_in(K, S * d, "K")
    Vp, k3 = _floats_in(V, S * d, "V")
    KTp, k4 = _floats_in(KT, d * S, "KT")
    vmp, k5 = _floats_in(v_mean, d, "v_mean")
    out = (ctypes.c_float * (g * d))()
    sel = (ctypes.c_int32 * S)()
    i1 = (ctypes.c_int32 * d)()
    alpha = (ctypes.c_float * g)()
    fp, ip = ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_int32)
    io = L.sparq_attn_io(kv_type=KV_TYPES[kv_type], d=d, g=g, S=S, q=qp, K=Kp, KT=KTp, V=Vp, v_mean=vmp,
                         out=ctypes.cast(out, fp), sel=ctypes.cast(sel, ip), i1=ctypes.cast(i1, ip),
                         alpha=ctypes.cast(alpha, fp))
    err = ctypes.create_string_buffer(ERR_SIZE)
    rc = lb.sparq_attn_run(ctypes.byref(cp), ctypes.byref(io), err, ERR_SIZE)
    if rc != 0:
        raise SparqError(err.value.decode("utf-8", "replace") or "sparq_attn_run failed")
    formula = lb.sparq_attn_formula(ctypes.byref(cp), S, d, g, err, ERR_SIZE)
    r = ap.values["r"]
    return {"out": _floats_out(out, (g, d)), "sel": sorted(sel[:io.n_sel]),
            "i1": list(i1[:r]) if ap.policy == "sparq" and r > 0 else [],
            "alpha": _floats_out(alpha), "elements": io.elements, "formula_elements": formula}


# ---- GGUF metadata ---------------------------------------------------------
# The C API gives typed accessors (arch, n_vocab, ...) but no key/value
# listing, so the header is read here: it is a plain little-endian format
# (docs: gguf.md of ggml), and only its key/value section is needed.

_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                 10: "<Q", 11: "<q", 12: "<d"}


def gguf_metadata(path, arrays=False):
    """The key/value pairs of a GGUF file's header as {key: str}, the way
    llama.cpp's llama_model_meta_val_str prints them (what llama-cpp-python's
    Llama.metadata holds): numbers in decimal, floats as C's %f, bools as
    true/false; arrays (the vocabulary, ...) are left out unless arrays=True,
    which keeps them as Python lists."""
    with open(os.fspath(path), "rb") as f:
        def read(n):
            b = f.read(n)
            if len(b) != n:
                raise SparqError("%s: truncated GGUF header" % path)
            return b

        def unpack(fmt):
            return struct.unpack(fmt, read(struct.calcsize(fmt)))[0]

        if read(4) != b"GGUF":
            raise SparqError("%s is not a GGUF file" % path)
        version = unpack("<I")
        count = "<I" if version == 1 else "<Q"
        unpack(count)  # tensors
        n_kv = unpack(count)

        def string():
            return read(unpack(count)).decode("utf-8", "replace")

        def value(t, keep=True):
            if t == 8:
                return string()
            if t in _GGUF_SCALARS:
                return unpack(_GGUF_SCALARS[t])
            if t == 9:
                et, n = unpack("<I"), unpack(count)
                if not keep and et in _GGUF_SCALARS:
                    f.seek(n * struct.calcsize(_GGUF_SCALARS[et]), 1)
                    return None
                vals = [value(et, keep) for _ in range(n)]
                return vals if keep else None
            raise SparqError("%s: unknown GGUF value type %d" % (path, t))

        out = {}
        for _ in range(n_kv):
            key = string()
            t = unpack("<I")
            v = value(t, keep=arrays or t != 9)
            if t == 9:
                if arrays:
                    out[key] = v
                continue
            if t == 7:
                v = "true" if v else "false"
            elif t in (6, 12):
                v = "%f" % v
            else:
                v = str(v)
            out[key] = v
        return out

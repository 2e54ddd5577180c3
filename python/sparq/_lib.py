"""Finds libsparq.so, declares every C prototype, and checks the struct mirrors.

The library is looked for, in order: the file named by $SPARQ_LIB; a
libsparq.so* beside this package; build/libsparq.so.0 of the checkout the
package sits in (python/sparq/../../build, what `make` just built); the same
in the checkout around the current directory (an installed package used from
inside a checkout); the system's library path (what `make install` sets up:
/usr/local/lib after ldconfig). It is loaded on first use, so `import sparq`
works without it and the error says where it looked.
"""
import ctypes
import ctypes.util
import glob
import os
import threading

c_int, c_int32, c_int64, c_float, c_double = (ctypes.c_int, ctypes.c_int32, ctypes.c_int64,
                                              ctypes.c_float, ctypes.c_double)
c_char_p, c_void_p, c_size_t, c_uint64 = ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64
P = ctypes.POINTER


class SparqError(RuntimeError):
    """An error reported by libsparq (the message is the library's)."""


class SparqABIError(SparqError):
    """The Python struct mirrors do not match the loaded library."""


# ---- struct mirrors of include/sparq.h (checked against the library) ------

class sparq_attn_params(ctypes.Structure):
    _fields_ = [
        ("policy", c_char_p), ("r", c_int), ("k", c_int), ("l", c_int),
        ("select_logits", c_int), ("no_realloc", c_int), ("n_sink", c_int),
        ("index", c_char_p), ("topk_schedule", c_int), ("index_key_type", c_int),
        ("ivf_nlist", c_int), ("ivf_nprobe", c_int), ("hnsw_ef_search", c_int),
        ("topk_check", c_int), ("select_always", c_int), ("adaptive_k", c_int), ("k_min", c_int),
    ]


class sparq_attn_io(ctypes.Structure):
    """One KV head's step for sparq_attn_run (include/sparq_attn.h)."""
    _fields_ = [
        ("kv_type", c_int), ("d", c_int), ("g", c_int), ("S", c_int64),
        ("q", P(c_float)), ("K", P(c_float)), ("KT", P(c_float)), ("V", P(c_float)),
        ("v_mean", P(c_float)), ("out", P(c_float)), ("sel", P(c_int32)), ("i1", P(c_int32)),
        ("alpha", P(c_float)), ("n_sel", c_int64), ("elements", c_int64),
    ]


class sparq_model_params(ctypes.Structure):
    _fields_ = [("use_mmap", c_int), ("no_repack", c_int)]


class sparq_chat_msg(ctypes.Structure):
    _fields_ = [("role", c_char_p), ("content", c_char_p)]


class sparq_prefill_params(ctypes.Structure):
    _fields_ = [("mode", c_int), ("window", c_int), ("n_sink", c_int), ("k", c_int),
                ("nlist", c_int), ("nprobe", c_int)]


PROGRESS_FN = ctypes.CFUNCTYPE(None, c_void_p, c_int64, c_int64)


class sparq_context_params(ctypes.Structure):
    _fields_ = [
        ("n_ctx", c_int64), ("n_threads", c_int), ("n_batch", c_int), ("kv_type", c_int),
        ("attn", sparq_attn_params), ("progress", PROGRESS_FN), ("progress_user", c_void_p),
        ("abort_flag", P(ctypes.c_int)),  # volatile sig_atomic_t* (int on Linux)
        ("prefill", sparq_prefill_params),
    ]


class sparq_attn_stats(ctypes.Structure):
    _fields_ = [
        ("elements", c_int64), ("dense_elements", c_int64), ("formula_elements", c_int64),
        ("bytes", c_int64), ("steps", c_int64), ("recall_hits", c_int64),
        ("recall_total", c_int64), ("index_seconds", c_double), ("nominal_elements", c_int64),
    ]


class sparq_sampler_params(ctypes.Structure):
    _fields_ = [("temp", c_float), ("top_k", c_int), ("top_p", c_float), ("seed", c_uint64),
                ("min_p", c_float), ("repeat_penalty", c_float), ("presence_penalty", c_float),
                ("frequency_penalty", c_float), ("penalty_last_n", c_int)]


MIRRORS = [sparq_attn_params, sparq_attn_io, sparq_model_params, sparq_chat_msg, sparq_prefill_params,
           sparq_context_params, sparq_attn_stats, sparq_sampler_params]

# name: (restype, argtypes)
PROTOTYPES = {
    "sparq_attn_default_params": (sparq_attn_params, []),
    "sparq_attn_params_from_ratio": (c_int, [P(sparq_attn_params), c_char_p, c_int64, c_int, c_char_p, c_char_p,
                                             c_size_t]),
    "sparq_model_load": (c_int, [c_char_p, P(c_void_p), c_char_p, c_size_t]),
    "sparq_model_default_params": (sparq_model_params, []),
    "sparq_model_load_params": (c_int, [c_char_p, P(sparq_model_params), P(c_void_p), c_char_p, c_size_t]),
    "sparq_model_free": (None, [c_void_p]),
    "sparq_model_n_vocab": (c_int, [c_void_p]),
    "sparq_model_n_layer": (c_int, [c_void_p]),
    "sparq_model_n_head": (c_int, [c_void_p]),
    "sparq_model_n_kv_head": (c_int, [c_void_p]),
    "sparq_model_head_dim": (c_int, [c_void_p]),
    "sparq_model_n_ctx_train": (c_int64, [c_void_p]),
    "sparq_model_arch": (c_char_p, [c_void_p]),
    "sparq_model_n_embd": (c_int, [c_void_p]),
    "sparq_pooling_name": (c_char_p, [c_int]),
    "sparq_pooling_find": (c_int, [c_char_p]),
    "sparq_embed": (c_int, [c_void_p, P(c_int32), c_int, c_int, c_int, P(c_float)]),
    "sparq_tokenize": (c_int, [c_void_p, c_char_p, c_int, c_int, P(c_int32), c_int]),
    "sparq_token_to_piece": (c_int, [c_void_p, c_int32, c_char_p, c_int]),
    "sparq_token_bos": (c_int, [c_void_p]),
    "sparq_token_eos": (c_int, [c_void_p]),
    "sparq_token_is_eog": (c_int, [c_void_p, c_int32]),
    "sparq_chat_tokenize": (c_int, [c_void_p, c_char_p, P(sparq_chat_msg), c_int, c_int, P(c_int32),
                                    c_int, c_char_p, c_size_t]),
    "sparq_context_default_params": (sparq_context_params, []),
    "sparq_context_create": (c_int, [c_void_p, P(sparq_context_params), P(c_void_p), c_char_p, c_size_t]),
    "sparq_context_free": (None, [c_void_p]),
    "sparq_eval": (c_int, [c_void_p, P(c_int32), c_int, P(c_float)]),
    "sparq_eval_all": (c_int, [c_void_p, P(c_int32), c_int, P(c_float)]),
    "sparq_context_pos": (c_int64, [c_void_p]),
    "sparq_context_n_ctx": (c_int64, [c_void_p]),
    "sparq_context_error": (c_char_p, [c_void_p]),
    "sparq_context_fill_random": (c_int, [c_void_p, c_int64, c_uint64]),
    "sparq_context_reset": (None, [c_void_p]),
    "sparq_context_mark_prefix": (None, [c_void_p]),
    "sparq_context_save_kv": (c_int, [c_void_p, c_char_p, c_char_p, P(c_int32), c_int64, c_char_p, c_size_t]),
    "sparq_context_load_kv": (c_int, [c_void_p, P(sparq_context_params), c_char_p, c_int, P(c_void_p),
                                      c_char_p, c_size_t]),
    "sparq_import_llama_state": (c_int, [c_void_p, P(sparq_context_params), c_char_p, c_char_p, c_char_p, c_int,
                                         P(c_int64), c_char_p, c_size_t]),
    "sparq_context_attn_stats": (None, [c_void_p, P(sparq_attn_stats)]),
    "sparq_sampler_default_params": (sparq_sampler_params, []),
    "sparq_sampler_create": (c_void_p, [P(sparq_sampler_params), c_int]),
    "sparq_sampler_free": (None, [c_void_p]),
    "sparq_sampler_check": (c_int, [P(sparq_sampler_params), ctypes.c_char_p, ctypes.c_size_t]),
    "sparq_sample": (c_int32, [c_void_p, P(c_float)]),
    "sparq_sampler_accept": (None, [c_void_p, c_int32]),
    "sparq_sampler_set_logit_bias": (c_int, [c_void_p, P(c_int32), P(c_float), c_int, c_char_p, c_size_t]),
    "sparq_attn_run": (c_int, [P(sparq_attn_params), P(sparq_attn_io), c_char_p, c_size_t]),
    "sparq_attn_formula": (c_int64, [P(sparq_attn_params), c_int64, c_int, c_int, c_char_p, c_size_t]),
    "sparq_abi_sizeof": (c_size_t, [c_char_p]),
    "sparq_abi_offsetof": (c_int64, [c_char_p, c_char_p]),
    "sparq_abi_field": (c_char_p, [c_char_p, c_int]),
    "sparq_version": (c_char_p, []),
    "sparq_cpu_level": (c_char_p, []),
}

_lock = threading.Lock()
_lib = None


def _is_checkout(root):
    # a sparq source tree: its header and its Python package side by side
    return (os.path.isfile(os.path.join(root, "include", "sparq.h")) and
            os.path.isdir(os.path.join(root, "python", "sparq")))


def _checkout_of(d):
    """The sparq checkout holding directory d (d or a parent), or None."""
    d = os.path.abspath(d)
    while True:
        if _is_checkout(d):
            return d
        up = os.path.dirname(d)
        if up == d:
            return None
        d = up


def candidates():
    """Where the library is looked for, in order (for errors and tests)."""
    out = []
    env = os.environ.get("SPARQ_LIB")
    if env:
        return [env]  # an explicit choice is not second-guessed
    here = os.path.dirname(os.path.abspath(__file__))
    out += sorted(glob.glob(os.path.join(here, "libsparq.so*")))
    for root in (os.path.dirname(os.path.dirname(here)), _checkout_of(os.getcwd())):
        if root and _is_checkout(root):
            lib = os.path.join(root, "build", "libsparq.so.0")
            if os.path.exists(lib) and lib not in out:
                out.append(lib)
    found = ctypes.util.find_library("sparq")
    if found:
        out.append(found)
    out += ["libsparq.so.0", "/usr/local/lib/libsparq.so.0"]
    return out


def check_abi(lib):
    """Raises SparqABIError unless every mirror's size and field offsets are
    the library's (a field added in C without its Python twin lands here)."""
    problems = []
    for st in MIRRORS:
        name = st.__name__.encode()
        theirs, i = [], 0
        while True:
            f = lib.sparq_abi_field(name, i)
            if f is None:
                break
            theirs.append(f.decode())
            i += 1
        mine = [f for f, _ in st._fields_]
        if theirs != mine:
            problems.append("fields of %s: library %s, python %s" % (st.__name__, theirs, mine))
            continue
        size = lib.sparq_abi_sizeof(name)
        if size != ctypes.sizeof(st):
            problems.append("sizeof(%s): library %d, python %d" % (st.__name__, size, ctypes.sizeof(st)))
            continue
        for fname, _ in st._fields_:
            off = lib.sparq_abi_offsetof(name, fname.encode())
            mine = getattr(st, fname).offset
            if off != mine:
                problems.append("offsetof(%s, %s): library %d, python %d" % (st.__name__, fname, off, mine))
    if problems:
        raise SparqABIError("libsparq's structs differ from the Python mirrors in sparq/_lib.py "
                            "(rebuild or update the package): " + "; ".join(problems))


def load(path=None):
    """Loads and checks the library (once); returns the ctypes handle."""
    global _lib
    with _lock:
        if _lib is not None and path is None:
            return _lib
        tried = []
        lib = None
        for cand in ([path] if path else candidates()):
            try:
                lib = ctypes.CDLL(cand)
                break
            except OSError as e:
                tried.append("%s (%s)" % (cand, e))
        if lib is None:
            raise SparqError("cannot load libsparq: tried " + "; ".join(tried) +
                             ". Build it (make), install it (make install), or set SPARQ_LIB")
        missing = [n for n in PROTOTYPES if not hasattr(lib, n)]
        if missing:
            raise SparqABIError("libsparq at %s lacks %s (an older library?)" % (lib._name, ", ".join(missing)))
        for n, (res, args) in PROTOTYPES.items():
            f = getattr(lib, n)
            f.restype = res
            f.argtypes = args
        check_abi(lib)
        if path is None:
            _lib = lib
        return lib

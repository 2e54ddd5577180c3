"""The high-level API, shaped like llama-cpp-python's `Llama`, so a program
can switch by changing its import:

    from sparq import Llama
    llm = Llama("stories260K.gguf", n_ctx=512, attn="sparq", sparq_ratio="1/8")
    out = llm("Once upon a time", max_tokens=32, temperature=0)
    print(out["choices"][0]["text"])

Generation is a loop here over Context.eval and the library's sampler (the
same calls `sparq run` makes, so greedy output is the command's).
"""
import codecs
import json
import math
import os
import tempfile
import time
import uuid

from .core import (AttnParams, Context, Model, Sampler, SparqError, _int, _np, find_model, gguf_metadata,
                   ratio_params)


def _check_num(v, name, lo=None, hi=None):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        raise ValueError("%s must be a number, not %r" % (name, v))
    if lo is not None and v < lo or hi is not None and v > hi:
        raise ValueError("%s must be in [%s, %s], not %r" % (name, lo, hi, v))
    return v


# Sampling options of llama-cpp-python that sparq does not implement, with
# the value that means "off". Any other value is refused, not ignored.
_NEUTRAL = {"typical_p": (None, 1, 1.0), "mirostat_mode": (None, 0),
            "tfs_z": (None, 1, 1.0), "suffix": (None, ""), "grammar": (None,),
            "logits_processor": (None,), "stopping_criteria": (None,), "logprobs": (None, False, 0),
            "top_logprobs": (None, 0)}


# llama-cpp-python's create_completion / create_chat_completion arguments
# that change nothing here whatever their value (the mirostat constants act
# only with mirostat_mode, refused above; model names the model in a server).
_ANY = {"mirostat_tau", "mirostat_eta", "model"}
# create_chat_completion's OpenAI-side arguments, accepted at "off".
_CHAT_NEUTRAL = {"functions": (None,), "function_call": (None,), "tools": (None,),
                 "tool_choice": (None,), "response_format": (None,)}


def _refuse_unsupported(opts, func, neutral=_NEUTRAL):
    """Options sparq lacks: accepted at their "off" value, refused (ValueError)
    otherwise; a name llama-cpp-python does not know is a TypeError, as
    Python's own for a misspelt keyword (n_ctxx=64 must not pass silently)."""
    bad = []
    for k, v in opts.items():
        if k in neutral:
            if not any(v == n and type(v) is type(n) or v is n for n in neutral[k]):
                bad.append(k)
        elif k not in _ANY:
            raise TypeError("%s() got an unexpected keyword argument %r" % (func, k))
    if bad:
        raise ValueError("not supported by sparq: %s" % ", ".join(sorted(bad)))


# llama-cpp-python's Llama(...) options. These steer hardware, speed or
# buffers only: accepted with any value so a program switches by import.
_LLAMA_IGNORED = {"n_gpu_layers", "split_mode", "main_gpu", "tensor_split", "rpc_servers", "use_mlock",
                  "n_ubatch", "n_threads_batch", "offload_kqv", "flash_attn", "op_offload", "swa_full",
                  "no_perf", "numa", "last_n_tokens_size", "logits_all", "embedding"}
# These would change the results: accepted only at their default ("off").
_LLAMA_NEUTRAL = {"vocab_only": (False,), "kv_overrides": (None,), "rope_scaling_type": (None, -1),
                  "rope_freq_base": (0, 0.0), "rope_freq_scale": (0, 0.0),
                  "yarn_ext_factor": (-1, -1.0), "yarn_attn_factor": (1, 1.0), "yarn_beta_fast": (32, 32.0),
                  "yarn_beta_slow": (1, 1.0), "yarn_orig_ctx": (0,), "lora_base": (None,),
                  "lora_scale": (1, 1.0), "lora_path": (None,), "chat_handler": (None,),
                  "draft_model": (None,), "tokenizer": (None,), "type_k": (None,), "type_v": (None,),
                  "spm_infill": (False,)}


def _log_softmax(logits):
    """log-probabilities of a logits vector (a list, or numpy's array)."""
    if _np is not None:
        x = _np.asarray(logits, dtype=_np.float64)
        m = x.max()
        return x - (m + _np.log(_np.exp(x - m).sum()))
    x = list(logits)
    m = max(x)
    lse = m + math.log(math.fsum(math.exp(v - m) for v in x))
    return [v - lse for v in x]


def _top(lp, n):
    """The n most likely ids of a log-probability vector, most likely first."""
    if n <= 0:
        return []
    if _np is not None:
        idx = _np.argpartition(-lp, min(n, len(lp) - 1))[:n]
        return sorted((int(i) for i in idx), key=lambda i: (-lp[i], i))
    return sorted(range(len(lp)), key=lambda i: (-lp[i], i))[:n]


class LlamaState:
    """What Llama.save_state() returns and load_state() takes, as in
    llama-cpp-python: the tokens in the cache (input_ids, n_tokens), the
    last position's logits (scores: that one vector, None before any eval)
    and the cache itself (llama_state: the bytes of a KV file,
    docs/KVFILE.md)."""

    def __init__(self, input_ids, scores, llama_state, seed):
        self.input_ids = list(input_ids)
        self.n_tokens = len(self.input_ids)
        self.scores = scores
        self.llama_state = llama_state
        self.llama_state_size = len(llama_state)
        self.seed = seed

    def __repr__(self):
        return "LlamaState(n_tokens=%d, %d bytes)" % (self.n_tokens, self.llama_state_size)


class LlamaTokenizer:
    """llm.tokenizer(): llama-cpp-python's LlamaTokenizer over this model.
    encode/decode take and give str, tokenize/detokenize bytes."""

    def __init__(self, llama):
        self.llama = llama

    def tokenize(self, text, add_bos=True, special=True):
        return self.llama.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens, prev_tokens=None, special=False):
        return self.llama.detokenize(tokens, prev_tokens=prev_tokens, special=special)

    def encode(self, text, add_bos=True, special=True):
        return self.tokenize(text.encode("utf-8", "ignore") if isinstance(text, str) else text,
                             add_bos=add_bos, special=special)

    def decode(self, tokens):
        return self.detokenize(tokens).decode("utf-8", errors="ignore")


class Llama:
    def __init__(self, model_path, n_ctx=512, n_threads=None, n_batch=512, seed=None, attn="dense",
                 sparq_ratio=None, attn_params=None, kv_type="f16", use_mmap=False, chat_format=None,
                 verbose=False, **llama_cpp_options):
        # llama-cpp-python's options with no meaning here (n_gpu_layers, ...)
        # are accepted so programs switch by import; any other name is a
        # TypeError, so a misspelt option (n_ctxx=64) does not pass silently.
        pooling_type = llama_cpp_options.pop("pooling_type", None)
        ignored = {k: v for k, v in llama_cpp_options.items() if k in _LLAMA_IGNORED}
        _refuse_unsupported({k: v for k, v in llama_cpp_options.items() if k not in _LLAMA_IGNORED},
                            "Llama", _LLAMA_NEUTRAL)
        self.ignored_options = ignored
        pools = {None: "mean", -1: "mean", 0: "none", 1: "mean", 2: "cls", 3: "last"}
        if pooling_type not in pools or isinstance(pooling_type, bool):
            raise ValueError("pooling_type must be -1 (unspecified: mean), 0 none, 1 mean, 2 cls or 3 last")
        self._pooling = pools[pooling_type]
        if seed in (-1, 0xFFFFFFFF):  # llama.cpp's LLAMA_DEFAULT_SEED: a random seed
            seed = None
        path = find_model(model_path)
        if path is None:
            raise SparqError("model '%s' not found (searched the path, $SPARQ_MODEL_PATH, "
                             "the checkout's models/)" % model_path)
        self.model_path = path
        self.verbose = verbose
        self.chat_format = chat_format
        self.seed = seed if seed is not None else int.from_bytes(os.urandom(8), "little")
        self._model = Model(path, use_mmap=use_mmap)
        try:
            n_ctx = _int(n_ctx, "n_ctx")
            if n_ctx <= 0:
                n_ctx = self._model.n_ctx_train
            params = dict(attn_params or {})
            if sparq_ratio is not None:
                if attn != "sparq":
                    raise ValueError("sparq_ratio needs attn='sparq'")
                r, k = ratio_params(sparq_ratio, n_ctx, self._model.head_dim)
                params.setdefault("r", r)
                params.setdefault("k", k)
                if params.get("l", -1) < 0:
                    params["l"] = params["k"] // 4
            self.attn = AttnParams(attn, **params) if isinstance(attn, str) else AttnParams.coerce(attn)
            self._n_threads = _int(n_threads or 0, "n_threads")
            self._ctx = Context(self._model, n_ctx=n_ctx, n_threads=self._n_threads,
                                n_batch=_int(n_batch, "n_batch"), kv_type=kv_type, attn=self.attn)
        except Exception:
            self._model.close()
            raise
        self._ids = []  # the tokens in the cache, in order
        self._logits = None  # the last evaluated position's logits
        self._state = None  # after load_state: (opener of its context, its ids, its logits or None)
        self._space_prefix = None  # see _adds_space_prefix

    # ---- plumbing ------------------------------------------------------
    @property
    def model(self):
        return self._model

    @property
    def ctx(self):
        return self._ctx

    def n_ctx(self):
        return self._ctx.n_ctx

    def n_vocab(self):
        return self._model.n_vocab

    def token_bos(self):
        return self._model.token_bos

    def token_eos(self):
        return self._model.token_eos

    def close(self):
        self._model.close()  # closes the context too

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def n_tokens(self):
        """Tokens in the cache (llama-cpp-python's Llama.n_tokens)."""
        return len(self._ids)

    @property
    def input_ids(self):
        """The tokens in the cache, in order (a numpy array where numpy is)."""
        return _np.array(self._ids, dtype=_np.intc) if _np is not None else list(self._ids)

    @property
    def scores(self):
        """The last evaluated position's logits, one row (llama-cpp-python
        keeps every row only with logits_all)."""
        if self._logits is None:
            return None
        if _np is not None:
            return _np.asarray(self._logits).reshape(1, -1)
        return [list(self._logits)]

    @property
    def metadata(self):
        """The GGUF header's key/value pairs as {key: str} (llama-cpp-python's
        Llama.metadata): arrays such as the vocabulary are left out."""
        if getattr(self, "_metadata", None) is None:
            self._metadata = gguf_metadata(self.model_path)
        return self._metadata

    def tokenizer(self):
        return LlamaTokenizer(self)

    def tokenize(self, text, add_bos=True, special=False):
        if isinstance(text, str):
            # llama-cpp-python takes bytes; str is accepted here too
            text = text.encode("utf-8")
        return self._model.tokenize(text, add_special=add_bos)

    def _adds_space_prefix(self):
        # SentencePiece-style vocabularies prepend a space to the text they
        # tokenize ("a" -> "▁a"); the first piece then starts with a space
        # that was not in the text. Probed once, as the C API does not say.
        if self._space_prefix is None:
            ids = self._model.tokenize(b"a", add_special=False)
            self._space_prefix = self._model.detokenize(ids) == b" a"
        return self._space_prefix

    def detokenize(self, tokens, prev_tokens=None, special=False):
        """The bytes of tokens, such that detokenize(tokenize(text)) == text:
        the space a SentencePiece vocabulary adds in front is taken off the
        first piece (not when prev_tokens says the tokens continue a text).
        Special tokens (BOS, EOS) print as nothing."""
        tokens = list(tokens)
        pieces = [b"" if self._model.is_eog(t) or t == self._model.token_bos else self._model.token_to_piece(t)
                  for t in tokens]
        if prev_tokens is None and self._adds_space_prefix():
            for i, p in enumerate(pieces):
                if p:
                    if p.startswith(b" "):
                        pieces[i] = p[1:]
                    break
        return b"".join(pieces)

    def reset(self):
        self._ctx.reset()
        self._ids = []
        self._logits = None

    def sample(self, top_k=40, top_p=0.95, min_p=0.05, typical_p=1.0, temp=0.80, repeat_penalty=1.0,
               frequency_penalty=0.0, presence_penalty=0.0, tfs_z=1.0, mirostat_mode=0, mirostat_eta=0.1,
               mirostat_tau=5.0, penalize_nl=True, logits_processor=None, grammar=None, idx=None):
        """A token sampled from the last evaluated position's logits
        (llama-cpp-python's Llama.sample); temp 0 is greedy."""
        _refuse_unsupported(dict(typical_p=typical_p, tfs_z=tfs_z, mirostat_mode=mirostat_mode,
                                 logits_processor=logits_processor, grammar=grammar), "sample")
        if idx is not None:
            raise ValueError("not supported by sparq: idx (only the last position's logits are kept)")
        if self._logits is None:
            raise SparqError("nothing evaluated yet: call eval(tokens) first")
        recent = self._ids[-64:]
        s = Sampler(self._model.n_vocab, temp=temp, top_k=top_k, top_p=top_p, min_p=min_p,
                    repeat_penalty=repeat_penalty, presence_penalty=presence_penalty,
                    frequency_penalty=frequency_penalty,
                    seed=(self.seed + len(self._ids)) & (2**64 - 1))
        try:
            if repeat_penalty != 1.0 or presence_penalty or frequency_penalty:
                for t in recent:  # the penalties look at the tokens already in the cache
                    s.accept(t)
            return s.sample(self._logits)
        finally:
            s.close()

    # ---- embeddings --------------------------------------------------------
    def embed(self, input, normalize=False, truncate=True, return_count=False):
        """llama-cpp-python's embed: the embedding of a text (a list of floats)
        or of each text of a list, pooled as pooling_type says (Llama(...,
        pooling_type=): 1 mean, the default here, 2 cls, 3 last; 0 none
        gives a list per token), L2-normalised if normalize. Longer texts
        are cut to n_ctx tokens (truncate) or refused. Each text runs in a
        context of its own: the generation cache is left as it was."""
        single = isinstance(input, (str, bytes))
        texts = [input] if single else list(input)
        out, total = [], 0
        for t in texts:
            if not t:  # OpenAI's API refuses it too, though BOS alone has a state
                raise ValueError("cannot embed an empty text")
            ids = self.tokenize(t.encode("utf-8") if isinstance(t, str) else t)
            if len(ids) > self.n_ctx():
                if not truncate:
                    raise ValueError("%d tokens exceed n_ctx %d" % (len(ids), self.n_ctx()))
                ids = ids[:self.n_ctx()]
            total += len(ids)
            ctx = Context(self._model, n_ctx=len(ids), n_threads=self._n_threads)
            try:
                v = ctx.embed(ids, pooling=self._pooling, normalize=2 if normalize else -1)
            finally:
                ctx.close()
            out.append(v.tolist())
        res = out[0] if single else out
        return (res, total) if return_count else res

    def create_embedding(self, input, model=None):
        """llama-cpp-python's create_embedding: OpenAI's response shape."""
        data, total = self.embed(input, return_count=True)
        if isinstance(input, (str, bytes)):
            data = [data]
        return {"object": "list", "model": model or self.model_path,
                "data": [{"object": "embedding", "embedding": e, "index": i} for i, e in enumerate(data)],
                "usage": {"prompt_tokens": total, "total_tokens": total}}

    def eval(self, tokens):
        """Appends tokens to the cache (llama-cpp-python's Llama.eval)."""
        tokens = list(tokens)
        if not tokens:
            return
        room = self._ctx.n_ctx - self._ctx.pos
        if len(tokens) > room:
            raise SparqError("%d tokens do not fit: the context holds %d more (n_ctx %d)" %
                             (len(tokens), room, self._ctx.n_ctx))
        self._logits = self._ctx.eval(tokens)
        self._ids += tokens

    def _prefill(self, ids, all_logits=False):
        """Makes the cache hold ids, with the last position's logits. A
        prompt that is or extends the tokens of a loaded state evaluates
        only the rest (the state is loaded again if the cache has moved on
        since; a state without logits needs at least one more token); the
        cache holding exactly ids with their logits evaluates nothing;
        anything else starts over. all_logits: start over, returning every
        position's logits (for the prompt's logprobs)."""
        if all_logits:
            self.reset()
            rows = self._ctx.eval_all(ids)
            if _np is None:  # a 2-D memoryview has no row views: slice the flat one
                flat, nv = rows.cast("B").cast("f"), self._model.n_vocab
                rows = [flat[i * nv:(i + 1) * nv] for i in range(len(ids))]
            self._ids = list(ids)
            self._logits = rows[len(ids) - 1]
            return rows
        if self._logits is not None and ids == self._ids:
            return None
        st = self._state
        if st is not None and ids[:len(st[1])] == st[1] and (len(ids) > len(st[1]) or st[2] is not None):
            if self._ids != st[1] or self._logits is None and st[2] is not None:
                self._swap_context(st[0](), list(st[1]))
                self._logits = st[2]
            if len(ids) > len(st[1]):
                self.eval(ids[len(st[1]):])
            return None
        self.reset()
        self.eval(ids)
        return None

    def _swap_context(self, new, ids):
        self._ctx.close()
        self._ctx = new
        self._ids = ids
        self._logits = None

    # ---- state: in memory (llama-cpp-python's form) or in KV files ------
    def save_state(self, path=None, indexes=None):
        """save_state() returns a LlamaState (the cache, its tokens and last
        logits, in memory) for load_state, as llama-cpp-python does.
        save_state(path) writes the cache to a KV file instead (with its
        token ids, also kept in PATH.ids.json so load_state(path) can match
        a later prompt against them); same as save_state_file(path)."""
        if path is None:
            if indexes is not None:
                raise ValueError("indexes go with a KV file: save_state(path, indexes=...)")
            return self._save_state_memory()
        return self.save_state_file(path, indexes=indexes)

    def _save_state_memory(self):
        logits = None
        if self._logits is not None:
            logits = _np.array(self._logits, copy=True) if _np is not None else list(self._logits)
        if not self._ids:
            return LlamaState([], logits, b"", self.seed)
        fd, tmp = tempfile.mkstemp(prefix="sparq-state-", suffix=".kv")
        os.close(fd)
        try:
            self._ctx.save_kv(tmp, tokens=self._ids)
            with open(tmp, "rb") as f:
                data = f.read()
        finally:
            os.unlink(tmp)
        return LlamaState(self._ids, logits, data, self.seed)

    def _open_state(self, data):
        """A context over a LlamaState's bytes: they go to a temporary file
        that is mapped (privately) and removed at once."""
        fd, tmp = tempfile.mkstemp(prefix="sparq-state-", suffix=".kv")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return Context.load_kv(self._model, tmp, n_threads=self._n_threads, attn=self.attn)
        finally:
            os.unlink(tmp)

    def save_state_file(self, path, indexes=None):
        """Writes the cache to a KV file (save_state(path))."""
        self._ctx.save_kv(path, indexes=indexes, tokens=self._ids)
        tmp = os.fspath(path) + ".ids.json.tmp"
        with open(tmp, "w") as f:
            json.dump({"model": os.path.basename(self.model_path), "ids": self._ids}, f)
        os.replace(tmp, os.fspath(path) + ".ids.json")

    def load_state(self, state):
        """Replaces the cache by a LlamaState from save_state(), or by a KV
        file written by save_state(path) when given a path (load_state_file).
        A later prompt that starts with its tokens evaluates only the rest;
        a LlamaState also brings back the logits, so sample() and a prompt
        equal to its tokens need no evaluation."""
        if isinstance(state, LlamaState):
            if not state.input_ids:
                self.reset()
                self._state = None
                return
            new = self._open_state(state.llama_state)
            if new.pos != state.n_tokens:
                new.close()
                raise SparqError("the state lists %d tokens but its cache holds %d" % (state.n_tokens, new.pos))
            self._swap_context(new, list(state.input_ids))
            self._logits = state.scores
            self.seed = state.seed
            data = state.llama_state
            self._state = (lambda: self._open_state(data), list(state.input_ids), state.scores)
            return
        if isinstance(state, (str, bytes, os.PathLike)):
            return self.load_state_file(state)
        raise TypeError("load_state takes what save_state() returned (or a KV file's path), not %s" %
                        type(state).__name__)

    def load_state_file(self, path):
        """Replaces the cache by a KV file written by save_state(path)."""
        path = os.fsdecode(path)
        try:
            with open(path + ".ids.json") as f:
                ids = json.load(f)["ids"]
            if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
                raise ValueError("ids is not a list of ints")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SparqError("%s.ids.json (written by save_state) is missing or unreadable: %s" % (path, e))
        new = Context.load_kv(self._model, path, n_threads=self._n_threads, attn=self.attn)
        if len(ids) != new.pos:
            new.close()
            raise SparqError("%s.ids.json lists %d tokens but the cache holds %d" % (path, len(ids), new.pos))
        self._swap_context(new, ids)
        self._state = (lambda: Context.load_kv(self._model, path, n_threads=self._n_threads, attn=self.attn),
                       list(ids), None)

    # ---- generation ----------------------------------------------------
    def generate(self, tokens, temp=0.8, top_k=40, top_p=0.95, seed=None, reset=True):
        """Yields sampled token ids after evaluating tokens, forever (the caller
        stops); each yielded id is evaluated before the next is sampled."""
        if reset:
            self._prefill(list(tokens))
        else:
            self.eval(list(tokens))
        s = Sampler(self._model.n_vocab, temp=temp, top_k=top_k, top_p=top_p,
                    seed=self.seed if seed is None else seed)
        try:
            while True:
                tok = s.sample(self._logits)
                yield tok
                self.eval([tok])
        finally:
            s.close()

    def _token_logprobs(self, logits, token, n_top):
        """(token's text, its log-probability, {text: logprob} of the n_top
        likeliest and the token) under logits, as llama-cpp-python reports."""
        lp = _log_softmax(logits)
        text = self._model.detokenize([token]).decode("utf-8", errors="ignore")
        top = {}
        for i in _top(lp, n_top):
            top[self._model.detokenize([i]).decode("utf-8", errors="ignore")] = float(lp[i])
        top[text] = float(lp[token])
        return text, float(lp[token]), top

    def _completion_stream(self, prompt_ids, max_tokens, temperature, top_k, top_p, seed, stop,
                           ignore_eos, make_chunk, penalties=None, logprobs=None, prompt_rows=False):
        """Yields make_chunk(text, finish_reason, records) pieces: text never
        contains a stop string, finish_reason is set on the last piece only;
        with logprobs (the number of alternatives), records lists the
        (text, logprob, top) of each token whose text the piece carries
        (prompt_rows: the prompt's tokens first, the first one's logprob None)."""
        if len(prompt_ids) > self._ctx.n_ctx:
            raise SparqError("the prompt has %d tokens but the context holds %d (n_ctx)" %
                             (len(prompt_ids), self._ctx.n_ctx))
        rows = self._prefill(prompt_ids, all_logits=prompt_rows)
        records = []  # logprob records not yet handed out
        tail = 0  # characters of held whose tokens' records went out already
        n_prompt = len(prompt_ids) if rows is not None else 0  # prompt records in records
        if rows is not None:
            strip = self._adds_space_prefix()  # the prompt's text has no added leading space
            for i, t in enumerate(prompt_ids):
                if i == 0:
                    rec = (self.detokenize([t]).decode("utf-8", errors="ignore"), None, None)
                else:
                    rec = self._token_logprobs(rows[i - 1], t, logprobs)
                if strip and rec[0]:
                    if rec[0].startswith(" "):
                        rec = (rec[0][1:],) + rec[1:]
                    strip = False
                records.append(rec)
        sampler = Sampler(self._model.n_vocab, temp=temperature, top_k=top_k, top_p=top_p,
                          seed=self.seed if seed is None else seed, **(penalties or {}))
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        held = ""  # text not yet emitted: it may begin a stop string
        n_out = 0
        finish = "length"
        try:
            while max_tokens is None or max_tokens <= 0 or n_out < max_tokens:
                if self._ctx.pos >= self._ctx.n_ctx:
                    break  # context full: finish_reason "length"
                tok = sampler.sample(self._logits)
                n_out += 1
                self.completion_tokens += 1
                if not ignore_eos and self._model.is_eog(tok):
                    finish = "stop"
                    break
                if logprobs is not None:
                    records.append(self._token_logprobs(self._logits, tok, logprobs))
                held += decoder.decode(self._model.token_to_piece(tok))
                hit = min((held.find(s) for s in stop if s in held), default=-1)
                if hit >= 0:
                    held = held[:hit]
                    finish = "stop"
                    break
                # emit all but the longest tail that could start a stop string
                keep = 0
                for s in stop:
                    for j in range(min(len(s) - 1, len(held)), 0, -1):
                        if held.endswith(s[:j]):
                            keep = max(keep, j)
                            break
                if len(held) > keep:
                    yield make_chunk(held[:len(held) - keep], None, records)
                    held = held[len(held) - keep:]
                    records, tail, n_prompt = [], keep, 0
                if max_tokens is not None and 0 < max_tokens <= n_out:
                    break  # the last token needs no forward pass (as `sparq run`)
                if self._ctx.pos >= self._ctx.n_ctx:
                    break
                self.eval([tok])
        finally:
            sampler.close()
        held += decoder.decode(b"", final=True)
        if finish == "stop" and len(records) > n_prompt:
            # a stop string cut the text: keep the tokens that start inside it
            kept, n = records[:n_prompt], tail
            for r in records[n_prompt:]:
                if n >= len(held):
                    break
                kept.append(r)
                n += len(r[0])
            records = kept
        yield make_chunk(held, finish, records)

    def _normalize(self, max_tokens, temperature, top_p, top_k, stop):
        if max_tokens is not None:
            _int(max_tokens, "max_tokens")
        _check_num(temperature, "temperature", 0)
        _check_num(top_p, "top_p", 0, 1)
        top_k = _int(top_k, "top_k")
        if top_k < 0:
            raise ValueError("top_k must be >= 0")
        if top_p <= 0:
            raise ValueError("top_p must be in (0, 1]")
        if stop is None:
            stop = []
        elif isinstance(stop, str):
            stop = [stop]
        elif not all(isinstance(s, str) for s in stop):
            raise TypeError("stop must be a str or a list of str")
        return [s for s in stop if s]

    def create_completion(self, prompt, suffix=None, max_tokens=16, temperature=0.8, top_p=0.95, echo=False, stop=None,
                          top_k=40, stream=False, seed=None, ignore_eos=False, min_p=0.05, repeat_penalty=1.0,
                          presence_penalty=0.0, frequency_penalty=0.0, logit_bias=None, logprobs=None,
                          **other):
        """An OpenAI-shaped text completion ("text_completion"), or a generator
        of chunks when stream=True. prompt: str or a list of token ids.
        min_p, the penalties and logit_bias ({token id: bias}, ids as ints or
        decimal strings, float("-inf") bans) act as in llama-cpp-python (the
        library sampler, as `sparq run`); logprobs=N reports each token's
        log-probability and the N likeliest alternatives (log-softmax of the
        model's logits, before sampling changes them; with echo the prompt's
        tokens too); options sparq lacks (grammar, mirostat, ...) are
        accepted at their "off" value and refused otherwise; unknown names
        raise TypeError."""
        _refuse_unsupported(dict(other, suffix=suffix), "create_completion")
        if logprobs is not None:
            logprobs = _int(logprobs, "logprobs")
            if logprobs < 0:
                raise ValueError("logprobs must be >= 0")
        if isinstance(prompt, (list, tuple)):
            prompt_ids = list(prompt)
            prompt_text = self.detokenize(prompt_ids).decode("utf-8", "replace")
        elif isinstance(prompt, (str, bytes)):
            prompt_ids = self._model.tokenize(prompt, add_special=True)
            prompt_text = prompt.decode("utf-8", "replace") if isinstance(prompt, bytes) else prompt
        else:
            raise TypeError("prompt must be a str or a list of token ids, not %s" % type(prompt).__name__)
        stop = self._normalize(max_tokens, temperature, top_p, top_k, stop)
        cid = "cmpl-" + uuid.uuid4().hex
        created = int(time.time())
        self.completion_tokens = 0

        offset = [len(prompt_text)]  # text_offset counts from the prompt's start, as llama-cpp-python

        def lp_dict(records):
            if logprobs is None:
                return None
            d = {"tokens": [], "text_offset": [], "token_logprobs": [], "top_logprobs": []}
            for text, lp, top in records:
                d["tokens"].append(text)
                d["text_offset"].append(offset[0])
                d["token_logprobs"].append(lp)
                d["top_logprobs"].append(top)
                offset[0] += len(text)
            return d

        def chunk(text, finish, records=()):
            return {"id": cid, "object": "text_completion", "created": created, "model": self.model_path,
                    "choices": [{"text": text, "index": 0, "logprobs": lp_dict(records),
                                 "finish_reason": finish}]}

        prompt_rows = bool(echo and logprobs is not None)
        if prompt_rows:
            offset[0] = 0
        gen = self._completion_stream(prompt_ids, max_tokens, float(temperature), top_k, float(top_p),
                                      seed, stop, ignore_eos, chunk,
                                      dict(min_p=min_p, repeat_penalty=repeat_penalty,
                                           presence_penalty=presence_penalty,
                                           frequency_penalty=frequency_penalty, logit_bias=logit_bias),
                                      logprobs=logprobs, prompt_rows=prompt_rows)
        if stream:
            def streamer():
                if echo:
                    yield chunk(prompt_text, None)
                yield from gen
            return streamer()
        text, finish, merged = [], None, None
        for c in gen:
            text.append(c["choices"][0]["text"])
            finish = c["choices"][0]["finish_reason"]
            lp = c["choices"][0]["logprobs"]
            if lp is not None:
                if merged is None:
                    merged = lp
                else:
                    for k in merged:
                        merged[k] += lp[k]
        out = chunk((prompt_text if echo else "") + "".join(text), finish)
        out["choices"][0]["logprobs"] = merged
        out["usage"] = {"prompt_tokens": len(prompt_ids), "completion_tokens": self.completion_tokens,
                        "total_tokens": len(prompt_ids) + self.completion_tokens}
        return out

    __call__ = create_completion

    def create_chat_completion(self, messages, temperature=0.2, top_p=0.95, top_k=40, stream=False, stop=None,
                               seed=None, max_tokens=None, ignore_eos=False, min_p=0.05, repeat_penalty=1.0,
                               presence_penalty=0.0, frequency_penalty=0.0, logit_bias=None, **other):
        """An OpenAI-shaped chat completion ("chat.completion"), or a generator
        of "chat.completion.chunk" dicts when stream=True. The template is
        chat_format (llama3, chatml, phi3, mistral, gemma) or the model's own.
        logit_bias as in create_completion (OpenAI sends its keys as strings)."""
        _refuse_unsupported(other, "create_chat_completion", dict(_NEUTRAL, **_CHAT_NEUTRAL))
        prompt_ids = self._model.chat_tokenize(messages, template=self.chat_format, add_assistant=True)
        stop = self._normalize(max_tokens, temperature, top_p, top_k, stop)
        cid = "chatcmpl-" + uuid.uuid4().hex
        created = int(time.time())
        self.completion_tokens = 0

        def chunk(text, finish, records=()):
            return (text, finish)

        gen = self._completion_stream(prompt_ids, max_tokens, float(temperature), top_k, float(top_p),
                                      seed, stop, ignore_eos, chunk,
                                      dict(min_p=min_p, repeat_penalty=repeat_penalty,
                                           presence_penalty=presence_penalty,
                                           frequency_penalty=frequency_penalty, logit_bias=logit_bias))
        if stream:
            def streamer():
                base = {"id": cid, "object": "chat.completion.chunk", "created": created,
                        "model": self.model_path}
                yield dict(base, choices=[{"index": 0, "delta": {"role": "assistant"}, "logprobs": None,
                                           "finish_reason": None}])
                for text, finish in gen:
                    if text:
                        yield dict(base, choices=[{"index": 0, "delta": {"content": text}, "logprobs": None,
                                                   "finish_reason": None}])
                    if finish:
                        yield dict(base, choices=[{"index": 0, "delta": {}, "logprobs": None,
                                                   "finish_reason": finish}])
            return streamer()
        parts, finish = [], None
        for text, f in gen:
            parts.append(text)
            finish = f
        return {"id": cid, "object": "chat.completion", "created": created, "model": self.model_path,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(parts)},
                             "logprobs": None, "finish_reason": finish}],
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": self.completion_tokens,
                          "total_tokens": len(prompt_ids) + self.completion_tokens}}

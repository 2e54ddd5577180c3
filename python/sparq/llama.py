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
import os
import time
import uuid

from .core import AttnParams, Context, Model, Sampler, SparqError, _int, find_model, ratio_params


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


def _refuse_unsupported(opts):
    bad = []
    for k, v in opts.items():
        if k in _NEUTRAL:
            if not any(v == n and type(v) is type(n) or v is n for n in _NEUTRAL[k]):
                bad.append(k)
        elif v is not None:
            bad.append(k)
    if bad:
        raise ValueError("not supported by sparq: %s" % ", ".join(sorted(bad)))


class Llama:
    def __init__(self, model_path, n_ctx=512, n_threads=None, n_batch=512, seed=None, attn="dense",
                 sparq_ratio=None, attn_params=None, kv_type="f16", use_mmap=False, chat_format=None,
                 verbose=False, **unsupported):
        if unsupported:
            # llama-cpp-python options with no meaning here (n_gpu_layers, ...) are
            # accepted so programs switch by import; they change nothing.
            self.ignored_options = dict(unsupported)
        path = find_model(model_path)
        if path is None:
            raise SparqError("model '%s' not found (searched the path, $SPARQ_MODEL_PATH, "
                             "the checkout's models/, ../shared/models, ../shared)" % model_path)
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
        self._state = None  # (KV file, its ids) after load_state

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

    def tokenize(self, text, add_bos=True, special=False):
        return self._model.tokenize(text, add_special=add_bos)

    def detokenize(self, tokens):
        return self._model.detokenize(tokens)

    def reset(self):
        self._ctx.reset()
        self._ids = []
        self._logits = None

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

    def _prefill(self, ids):
        """Makes the cache hold ids. A prompt that extends the tokens of a
        loaded state evaluates only the rest (the state's file is mapped
        again if the cache has moved on since); anything else starts over."""
        st = self._state
        if st is not None and len(ids) > len(st[1]) and ids[:len(st[1])] == st[1]:
            if self._ids != st[1]:
                self._swap_context(Context.load_kv(self._model, st[0], n_threads=self._n_threads,
                                                   attn=self.attn), list(st[1]))
            self.eval(ids[len(st[1]):])
            return
        self.reset()
        self.eval(ids)

    def _swap_context(self, new, ids):
        self._ctx.close()
        self._ctx = new
        self._ids = ids
        self._logits = None

    # ---- state over KV files ------------------------------------------
    def save_state(self, path, indexes=None):
        """Writes the cache to a KV file (with its token ids, also kept in
        PATH.ids.json so load_state can match a later prompt against them)."""
        self._ctx.save_kv(path, indexes=indexes, tokens=self._ids)
        tmp = os.fspath(path) + ".ids.json.tmp"
        with open(tmp, "w") as f:
            json.dump({"model": os.path.basename(self.model_path), "ids": self._ids}, f)
        os.replace(tmp, os.fspath(path) + ".ids.json")

    def load_state(self, path):
        """Replaces the cache by a KV file written by save_state; a later
        prompt that starts with its tokens evaluates only the rest."""
        path = os.fspath(path)
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
        self._state = (path, list(ids))

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

    def _completion_stream(self, prompt_ids, max_tokens, temperature, top_k, top_p, seed, stop,
                           ignore_eos, make_chunk, penalties=None):
        """Yields (text, finish_reason) pieces: text never contains a stop
        string, finish_reason is set on the last piece only."""
        if len(prompt_ids) > self._ctx.n_ctx:
            raise SparqError("the prompt has %d tokens but the context holds %d (n_ctx)" %
                             (len(prompt_ids), self._ctx.n_ctx))
        self._prefill(prompt_ids)
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
                    yield make_chunk(held[:len(held) - keep], None)
                    held = held[len(held) - keep:]
                if max_tokens is not None and 0 < max_tokens <= n_out:
                    break  # the last token needs no forward pass (as `sparq run`)
                if self._ctx.pos >= self._ctx.n_ctx:
                    break
                self.eval([tok])
        finally:
            sampler.close()
        held += decoder.decode(b"", final=True)
        yield make_chunk(held, finish)

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
                          presence_penalty=0.0, frequency_penalty=0.0, logit_bias=None, **other):
        """An OpenAI-shaped text completion ("text_completion"), or a generator
        of chunks when stream=True. prompt: str or a list of token ids.
        min_p, the penalties and logit_bias ({token id: bias}, ids as ints or
        decimal strings, float("-inf") bans) act as in llama-cpp-python (the
        library sampler, as `sparq run`); options sparq lacks (grammar,
        mirostat, ...) are accepted at their "off" value and refused otherwise."""
        _refuse_unsupported(dict(other, suffix=suffix))
        if isinstance(prompt, (list, tuple)):
            prompt_ids = list(prompt)
            prompt_text = self._model.detokenize(prompt_ids).decode("utf-8", "replace")
        elif isinstance(prompt, (str, bytes)):
            prompt_ids = self._model.tokenize(prompt, add_special=True)
            prompt_text = prompt.decode("utf-8", "replace") if isinstance(prompt, bytes) else prompt
        else:
            raise TypeError("prompt must be a str or a list of token ids, not %s" % type(prompt).__name__)
        stop = self._normalize(max_tokens, temperature, top_p, top_k, stop)
        cid = "cmpl-" + uuid.uuid4().hex
        created = int(time.time())
        self.completion_tokens = 0

        def chunk(text, finish):
            return {"id": cid, "object": "text_completion", "created": created, "model": self.model_path,
                    "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}

        gen = self._completion_stream(prompt_ids, max_tokens, float(temperature), top_k, float(top_p),
                                      seed, stop, ignore_eos, chunk,
                                      dict(min_p=min_p, repeat_penalty=repeat_penalty,
                                           presence_penalty=presence_penalty,
                                           frequency_penalty=frequency_penalty, logit_bias=logit_bias))
        if stream:
            def streamer():
                if echo:
                    yield chunk(prompt_text, None)
                yield from gen
            return streamer()
        text, finish = [], None
        for c in gen:
            text.append(c["choices"][0]["text"])
            finish = c["choices"][0]["finish_reason"]
        out = chunk((prompt_text if echo else "") + "".join(text), finish)
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
        _refuse_unsupported(other)
        prompt_ids = self._model.chat_tokenize(messages, template=self.chat_format, add_assistant=True)
        stop = self._normalize(max_tokens, temperature, top_p, top_k, stop)
        cid = "chatcmpl-" + uuid.uuid4().hex
        created = int(time.time())
        self.completion_tokens = 0

        def chunk(text, finish):
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

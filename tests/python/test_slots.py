"""llama-server's slot endpoints on `sparq serve`: GET /slots and
POST /slots/ID?action=save|restore|erase over sparq KV files in
--slot-save-path. The round trip goes through the file between two server
processes, so what the second one reuses can only come from the restore."""
import contextlib
import json
import os
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

# a 40-token prompt (BOS included): with -b 16 its first 32 tokens are a
# reusable prefix (cut at a multiple of the batch, short of the last token)
PROMPT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
          "with her friends and her dog.")


@contextlib.contextmanager
def serve(sparq_bin, model_path, *extra):
    d = tempfile.mkdtemp()
    port_file = os.path.join(d, "port")
    p = subprocess.Popen([sparq_bin, "serve", "-m", model_path, "--port", "0", "--port-file", port_file,
                          "-np", "2", "-c", "256", "-b", "16", "-t", "1", *extra],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(600):
            if os.path.exists(port_file) and open(port_file).read().strip():
                break
            assert p.poll() is None, p.stderr.read().decode(errors="replace")
            time.sleep(0.05)
        yield "http://127.0.0.1:%s" % open(port_file).read().strip()
    finally:
        p.terminate()
        p.wait(timeout=30)


def call(base, path, body=None, method=None, raw=None):
    data = raw if raw is not None else json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method or ("POST" if data is not None else "GET"),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def idle_slots(base, timeout=10.0):
    """/slots once no slot is processing: a reply can reach the client before
    the server has released its slot and published the cache it kept."""
    end = time.time() + timeout
    while True:
        st, slots = call(base, "/slots")
        assert st == 200, slots
        if not any(s["is_processing"] for s in slots) or time.time() > end:
            return slots
        time.sleep(0.01)


def complete(base, prompt=PROMPT, **kw):
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0}
    body.update(kw)
    st, r = call(base, "/v1/completions", body)
    assert st == 200, r
    return r


def test_get_slots_shape(sparq_bin, model_path):
    with serve(sparq_bin, model_path) as base:
        st, slots = call(base, "/slots")
        assert st == 200 and [s["id"] for s in slots] == [0, 1]
        for s in slots:
            assert s["n_ctx"] == 256 and s["is_processing"] is False and s["id_task"] == -1
            assert {"n_predict", "seed", "temperature", "top_k", "top_p", "min_p", "repeat_penalty",
                    "presence_penalty", "frequency_penalty", "max_tokens", "stream", "samplers"} <= set(s["params"])
            assert set(s["next_token"]) == {"has_next_token", "has_new_line", "n_remain", "n_decoded"}
        r = complete(base, temperature=0.5, seed=7, max_tokens=5, ignore_eos=True)
        st, slots = call(base, "/slots")
        used = [s for s in slots if s["id_task"] == 0]
        assert len(used) == 1, slots
        s = used[0]
        assert s["params"]["temperature"] == 0.5 and s["params"]["seed"] == 7 and s["params"]["max_tokens"] == 5
        assert s["next_token"]["n_decoded"] == r["usage"]["completion_tokens"] == 5
        assert s["sparq"]["n_cache"] == 0  # no --slot-save-path: caches are not kept
        # a long stream: its slot shows it processing, and fail_on_no_slot
        # answers 503 only when every slot is busy (one of two here)
        req = urllib.request.Request(base + "/v1/completions", data=json.dumps(
            {"prompt": PROMPT, "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as stream:
            stream.readline()  # the first event: the request is running
            st, slots = call(base, "/slots")
            st2, _ = call(base, "/slots?fail_on_no_slot=1")
            stream.read()
        busy = [s for s in slots if s["is_processing"]]
        if busy:  # it may have finished already on a fast machine; then nothing is claimed
            assert busy[0]["next_token"]["has_next_token"] is True and busy[0]["params"]["stream"] is True
        assert st2 == 200
        # save and restore need the directory
        st, r = call(base, "/slots/0?action=save", {"filename": "x.kv"})
        assert st == 501 and "--slot-save-path" in r["error"]["message"], r
    with serve(sparq_bin, model_path, "--no-slots") as base:
        st, r = call(base, "/slots")
        assert st == 501 and "--no-slots" in r["error"]["message"]


def test_save_restore_round_trip(sparq_bin, model_path):
    d = tempfile.mkdtemp()
    with serve(sparq_bin, model_path, "--slot-save-path", d) as base:
        first = complete(base)
        assert first["usage"]["prompt_tokens"] == 40 and first["timings"]["cache_n"] == 0
        slots = idle_slots(base)
        sid = [s["id"] for s in slots if s["id_task"] == 0][0]
        n_cached = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"] - 1  # the last is not fed
        assert slots[sid]["sparq"]["n_cache"] == n_cached
        st, r = call(base, "/slots/%d?action=save" % sid, {"filename": "story.kv"})
        assert st == 200, r
        assert r["id_slot"] == sid and r["filename"] == "story.kv" and r["n_saved"] == n_cached
        assert r["n_written"] == os.path.getsize(os.path.join(d, "story.kv")) > 0 and "save_ms" in r["timings"]
    # a fresh server: nothing cached but what the file brings
    with serve(sparq_bin, model_path, "--slot-save-path", d) as base:
        st, r = call(base, "/slots/1?action=restore", {"filename": "story.kv"})
        assert st == 200 and r["n_restored"] == n_cached and r["id_slot"] == 1, r
        st, slots = call(base, "/slots")
        assert slots[1]["sparq"]["n_cache"] == n_cached and slots[0]["sparq"]["n_cache"] == 0
        again = complete(base)
        assert again["choices"][0]["text"] == first["choices"][0]["text"]
        assert again["timings"]["cache_n"] == 32 and again["timings"]["prompt_n"] == 8, again["timings"]
        # the restored slot served it: its cache is now this request's, once
        # the slot is idle (the reply can reach us before the slot is released)
        slots = idle_slots(base)
        assert slots[1]["id_task"] == 0 and slots[1]["sparq"]["n_cache"] == n_cached
        st, r = call(base, "/slots/1?action=erase", {})
        assert st == 200 and r == {"id_slot": 1, "n_erased": n_cached}
        st, r = call(base, "/slots/1?action=save", {"filename": "empty.kv"})
        assert st == 400 and "no cache" in r["error"]["message"]
    # control: without the restore the same prompt is prefilled whole
    with serve(sparq_bin, model_path, "--slot-save-path", d) as base:
        cold = complete(base)
        assert cold["choices"][0]["text"] == first["choices"][0]["text"] and cold["timings"]["cache_n"] == 0


def test_slot_action_errors(sparq_bin, model_path):
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "junk.kv"), "wb") as f:
        f.write(b"not a KV file" * 100)
    os.mkfifo(os.path.join(d, "fifo.kv"))
    with serve(sparq_bin, model_path, "--slot-save-path", d) as base:
        for sid in ("2", "-1", "abc", "1x", "99999999999"):
            st, r = call(base, "/slots/%s?action=save" % sid, {"filename": "a.kv"})
            assert st == 400 and "no slot" in r["error"]["message"], (sid, r)
        st, r = call(base, "/slots/0?action=explode", {"filename": "a.kv"})
        assert st == 400 and "save, restore or erase" in r["error"]["message"]
        st, r = call(base, "/slots/0", {"filename": "a.kv"})
        assert st == 400 and "?action=" in r["error"]["message"]
        st, r = call(base, "/slots/0?action=save", method="GET")
        assert st == 405
        complete(base)  # slot 0 now holds a cache
        for name in ("../a.kv", "a/b.kv", "..", ".", "", "x" * 256, "a\u0000b", "a\nb", "..hidden"):
            st, r = call(base, "/slots/0?action=save", {"filename": name})
            assert st == 400 and "filename" in r["error"]["message"], (name, r)
        for body in ({}, {"filename": 5}, {"filename": None}, ["a.kv"]):
            st, r = call(base, "/slots/0?action=save", body)
            assert st == 400 and ("filename" in r["error"]["message"] or "object" in r["error"]["message"]), (body, r)
        st, r = call(base, "/slots/0?action=save", raw=b"{not json")
        assert st == 400
        assert sorted(os.listdir(d)) == ["fifo.kv", "junk.kv"]  # nothing was written anywhere
        st, r = call(base, "/slots/0?action=restore", {"filename": "missing.kv"})
        assert st == 404 and "missing.kv" in r["error"]["message"], r
        st, r = call(base, "/slots/0?action=restore", {"filename": "junk.kv"})
        assert st == 400 and "no KV file" in r["error"]["message"], r
        st, r = call(base, "/slots/0?action=restore", {"filename": "fifo.kv"})  # never opened: it would block
        assert st == 400 and "not a regular file" in r["error"]["message"], r
        # a failed restore leaves the slot's cache as it was
        st, r = call(base, "/slots/0?action=save", {"filename": "ok.kv"})
        assert st == 200 and r["n_saved"] > 0
    # a file of the right model but another KV type is refused, not mixed in
    with serve(sparq_bin, model_path, "--slot-save-path", d, "--kv-type", "f32") as base:
        st, r = call(base, "/slots/0?action=restore", {"filename": "ok.kv"})
        assert st == 400 and "ok.kv" in r["error"]["message"], r

"""Structured output through `sparq serve`: response_format json_object /
json_schema and llama-server's grammar. Each output is checked with
json.loads and a validator written here (not the server's grammar engine);
bad constraints are 400s saying what is wrong; a grammar that admits the
free greedy answer leaves it unchanged under every attention policy; a
batch of constrained requests gives what each gives alone."""
import json
import os
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest

from conftest import PROMPT


@pytest.fixture(scope="module")
def server(sparq_bin, model_path):
    d = tempfile.mkdtemp()
    port_file = os.path.join(d, "port")
    p = subprocess.Popen([sparq_bin, "serve", "-m", model_path, "--port", "0", "--port-file", port_file,
                          "-np", "4", "-c", "512", "-t", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(300):
            if os.path.exists(port_file) and open(port_file).read().strip():
                break
            assert p.poll() is None, p.stderr.read().decode(errors="replace")
            time.sleep(0.05)
        yield "http://127.0.0.1:%s" % open(port_file).read().strip()
    finally:
        p.terminate()
        p.wait(timeout=30)


def post(base, body, path="/v1/completions"):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# ---- a minimal validator for the subset, independent of the engine ----
def valid(v, s):
    if "const" in s and v != s["const"]:
        return False
    if "enum" in s and not any(v == e and type(v) is type(e) for e in s["enum"]):
        return False
    if "anyOf" in s and not any(valid(v, x) for x in s["anyOf"]):
        return False
    types = s.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        ok = {"string": lambda: isinstance(v, str), "boolean": lambda: isinstance(v, bool),
              "null": lambda: v is None, "array": lambda: isinstance(v, list), "object": lambda: isinstance(v, dict),
              "integer": lambda: isinstance(v, int) and not isinstance(v, bool),
              "number": lambda: isinstance(v, (int, float)) and not isinstance(v, bool)}
        if not any(ok[t]() for t in types):
            return False
    if isinstance(v, str):
        if len(v) < s.get("minLength", 0) or len(v) > s.get("maxLength", 1 << 30):
            return False
    if isinstance(v, list):
        if len(v) < s.get("minItems", 0) or len(v) > s.get("maxItems", 1 << 30):
            return False
        if "items" in s and not all(valid(x, s["items"]) for x in v):
            return False
    if isinstance(v, dict):
        props = s.get("properties", {})
        if any(k not in v for k in s.get("required", [])):
            return False
        for k, x in v.items():
            if k in props:
                if not valid(x, props[k]):
                    return False
            elif s.get("additionalProperties") is False:
                return False
    return True


def no_duplicate_keys(pairs):
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), "duplicate keys %r" % keys
    return dict(pairs)


SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer"},
                                      "ok": {"type": "boolean"}}, "required": ["name", "age"]},
    {"type": "array", "minItems": 1, "maxItems": 3,
     "items": {"type": "object", "additionalProperties": False, "required": ["c"],
               "properties": {"c": {"enum": ["red", "green", 7]}, "n": {"type": ["number", "null"]}}}},
    {"type": "object", "required": ["tags", "inner"],
     "properties": {"tags": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 4}},
                    "inner": {"type": "object", "required": ["v"],
                              "properties": {"v": {"anyOf": [{"type": "integer"}, {"const": "x"}]}}}}},
]


def test_json_schema_outputs_validate(server):
    done = 0
    for i, schema in enumerate(SCHEMAS):
        for temp, seeds in ((0.0, [1]), (0.8, [1, 2, 3]), (1.5, [4, 5])):
            for seed in seeds:
                st, r = post(server, {"prompt": PROMPT, "max_tokens": 400, "temperature": temp, "seed": seed,
                                      "response_format": {"type": "json_schema",
                                                          "json_schema": {"name": "s%d" % i, "schema": schema}}})
                assert st == 200, r
                text, fin = r["choices"][0]["text"], r["choices"][0]["finish_reason"]
                if fin == "stop":
                    v = json.loads(text, object_pairs_hook=no_duplicate_keys)
                    assert valid(v, schema), (schema, text)
                    done += 1
    assert done >= 12, "only %d of 18 constrained generations ended" % done


def test_json_object_and_top_level_json_schema(server):
    for seed in (1, 2, 3):
        st, r = post(server, {"messages": [{"role": "user", "content": "Give me JSON"}], "max_tokens": 300,
                              "temperature": 0.7, "seed": seed, "response_format": {"type": "json_object"}},
                     "/v1/chat/completions")
        assert st == 200, r
        if r["choices"][0]["finish_reason"] == "stop":
            assert isinstance(json.loads(r["choices"][0]["message"]["content"]), dict)
    schema = {"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]}
    st, r = post(server, {"prompt": PROMPT, "max_tokens": 100, "temperature": 0, "json_schema": schema})
    assert st == 200 and r["choices"][0]["finish_reason"] == "stop", r
    assert valid(json.loads(r["choices"][0]["text"]), schema)
    st, r = post(server, {"prompt": PROMPT, "max_tokens": 40, "temperature": 0,
                          "grammar": 'root ::= " " ("yes" | "no") "."'})
    assert st == 200 and r["choices"][0]["text"] in (" yes.", " no."), r


def test_bad_constraints_are_400(server):
    st, r = post(server, {"prompt": PROMPT, "response_format": {"type": "json_schema", "json_schema": {
        "schema": {"type": "object", "properties": {"a": {"type": "number", "multipleOf": 2}}}}}})
    assert st == 400 and "unsupported keyword 'multipleOf'" in r["error"]["message"], r
    st, r = post(server, {"prompt": PROMPT, "grammar": 'root ::= "a" [b-'})
    assert st == 400 and "grammar: line 1" in r["error"]["message"], r
    st, r = post(server, {"prompt": PROMPT, "grammar": "root ::= root \"a\""})
    assert st == 400 and "left-recursive" in r["error"]["message"], r


@pytest.mark.parametrize("attn", ["dense", "sparq", "streaming", "h2o"])
def test_admitting_grammar_keeps_greedy(server, attn):
    base = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "sparq": {"attn": attn}}
    st, free = post(server, base)
    assert st == 200, free
    text = free["choices"][0]["text"]
    lit = "".join("\\x%02X" % b if b < 0x20 or b in (0x22, 0x5C) else chr(b) for b in text.encode())
    for g in ("root ::= .*", 'root ::= "%s" [a-z., ]*' % lit):
        st, con = post(server, dict(base, grammar=g))
        assert st == 200, con
        assert con["choices"][0]["text"] == text, (attn, g)


def test_batch_equals_alone(server):
    bodies = [{"prompt": PROMPT, "max_tokens": 120, "temperature": 0.8, "seed": 10 + i,
               "response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMAS[i % 3]}}}
              for i in range(4)]
    alone = [post(server, b)[1]["choices"][0]["text"] for b in bodies]
    together = [None] * 4

    def go(i):
        together[i] = post(server, bodies[i])[1]["choices"][0]["text"]
    ts = [threading.Thread(target=go, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert together == alone


def test_cli_grammar_flags(sparq_bin, model_path, tmp_path):
    """sparq run --grammar-file / -j: the output matches; bad input is exit 2 with the message."""
    g = tmp_path / "g.gbnf"
    g.write_text('root ::= " " [0-9]{2,3} " " ("cats" | "dogs") "."\n')
    r = subprocess.run([sparq_bin, "run", "-m", model_path, "-p", PROMPT, "-n", "30", "--temp", "0.8", "-s", "5",
                        "--grammar-file", str(g)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode().rstrip("\n")
    words = out.split(" ")
    assert len(words) == 3 and words[0] == "" and words[1].isdigit() and 2 <= len(words[1]) <= 3 \
        and words[2] in ("cats.", "dogs."), out
    schema = SCHEMAS[0]
    r = subprocess.run([sparq_bin, "run", "-m", model_path, "-p", PROMPT, "-n", "300", "--temp", "0",
                        "-j", json.dumps(schema)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert r.returncode == 0, r.stderr
    assert valid(json.loads(r.stdout), schema), r.stdout
    for args, msg in ((["--grammar", "root ::= ("], b"expected ')'"),
                      (["-j", '{"type":"string","format":"uri"}'], b"unsupported keyword 'format'")):
        r = subprocess.run([sparq_bin, "run", "-m", model_path, "-p", PROMPT, "-n", "4", *args],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert r.returncode == 2 and msg in r.stderr, r.stderr

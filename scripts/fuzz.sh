#!/usr/bin/env bash
# fuzz.sh - short libFuzzer runs over every parser that reads untrusted
# bytes (`make fuzz`, and .ci/run):
#   fuzz_gguf       the GGUF reader
#   fuzz_kvfile     KV cache files (the harness recomputes the checksums)
#   fuzz_tokenizer  tokenizers + chat templates over several vocabularies
#   fuzz_json       the JSON reader and string writer
#   fuzz_index      key-index images (exact, ivf; hnsw needs Faiss) and search
#   fuzz_request    the server's request bodies (server/request.h), every endpoint
#   fuzz_llama_state  llama.cpp sequence states (io/llama_state.h), seeded with tests/data/llamacpp
#   fuzz_grammar    GBNF grammars, JSON Schemas and the grammar matcher (core/grammar.h)
#   fuzz/fuzz_*.c   any other harness added there (seeds: none but the corpus)
#
# The library is built once with clang, ASan + UBSan and fuzzer coverage into
# build-fuzz/obj; each harness links against it. Seeds come from our own
# writers and from the search path's real files. Each harness runs for
# FUZZ_SECONDS (default 30; FUZZ_ONLY=name runs one). New inputs accumulate
# in build-fuzz/corpus-NAME across runs; a crash leaves build-fuzz/crash-*
# and makes this script exit non-zero. A longer run, e.g. before a release:
#   FUZZ_SECONDS=3600 FUZZ_ONLY=fuzz_kvfile scripts/fuzz.sh
#   FUZZ_SECONDS=3600 FUZZ_ONLY=fuzz_request scripts/fuzz.sh
# Without clang or the libFuzzer runtime (libclang-rt-14-dev, see
# scripts/setup.sh) it prints why and "fuzz: skipped", exit 0; with CI=true
# that is a failure (exit 1): CI must fuzz, and a missing tool must not
# pass as a green run.
set -u
cd "$(dirname "$0")/.." || exit 1

OUT=build-fuzz
SECONDS_TOTAL=${FUZZ_SECONDS:-30}
skip() { # why: a missing tool skips a local run and fails CI
  echo "fuzz: $1" >&2
  case "${CI:-}" in
    true|1|yes) echo "fuzz: FAILED: CI requires the fuzzers"; exit 1 ;;
  esac
  echo "fuzz: skipped"
  exit 0
}
CC_FUZZ=""
for c in clang clang-14 clang-15 clang-16; do
  command -v "$c" >/dev/null 2>&1 && { CC_FUZZ=$c; break; }
done
if [ -z "$CC_FUZZ" ]; then
  skip "clang not found (apt-get install clang libclang-rt-14-dev)"
fi
mkdir -p "$OUT/seeds" "$OUT/obj" || exit 1

# Can this clang link a fuzzer at all? (the runtime is a separate package)
probe="$OUT/probe.c"
printf '#include <stdint.h>\n#include <stddef.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' > "$probe"
if ! "$CC_FUZZ" -fsanitize=fuzzer "$probe" -o "$OUT/probe" >/dev/null 2>&1; then
  skip "$CC_FUZZ cannot link -fsanitize=fuzzer (libFuzzer runtime missing: apt-get install libclang-rt-14-dev)"
fi
rm -f "$probe" "$OUT/probe"

# The harnesses find their data through the library's search path, which
# knows no directory relative to the working directory: the checkout's
# models/ and the reference data beside it are added here, as tests/test.h does.
export SPARQ_MODEL_PATH="${SPARQ_MODEL_PATH:+$SPARQ_MODEL_PATH:}models:../shared/models:../shared"

SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
FLAGS="-std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer -fopenmp -Iinclude -Isrc"
# As the Makefile: the portable baseline, and the kernel twins (chosen at
# run time, src/util/cpu.h) compiled for their instruction sets.
SIMD_AVX2=""; SIMD_AVX512=""
if [ "$(uname -m)" = x86_64 ]; then
  FLAGS="$FLAGS -march=x86-64-v2"
  SIMD_AVX2="-mavx2 -mfma -mf16c -mbmi -mbmi2 -mlzcnt -mpopcnt"
  SIMD_AVX512="$SIMD_AVX2 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512bf16"
fi
LIBS="-lz -lm -fopenmp -lpthread"
# The library (every layer but the command and the server; no Faiss shim),
# instrumented for coverage; rebuilt only where a source is newer. Of the
# server, everything but the HTTP daemon (server.c) and the embedded page:
# the request parser and the files it reaches (the scheduler's
# srv_request_release, documents, slots).
echo "fuzz: building the instrumented library with $CC_FUZZ"
objs=""
for src in $(ls src/*/*.c | grep -v -e '^src/cli/' -e '^src/server/server.c$' -e '^src/server/webui.c$'); do
  o="$OUT/obj/$(echo "${src#src/}" | tr / _).o"
  # SIMD kernel files are not parsers, and clang takes minutes and GBs to
  # instrument their intrinsics: they are built plain (the sanitizer suite,
  # make test-asan, covers them).
  case $src in *_avx512.c|*_avx2.c|*_sse*.c) san="" ;; *) san="$SAN -fsanitize=fuzzer-no-link" ;; esac
  case $src in *_avx512.c) simd=$SIMD_AVX512 ;; *_avx2.c) simd=$SIMD_AVX2 ;; *) simd="" ;; esac
  if [ ! -e "$o" ] || [ "$src" -nt "$o" ] || [ -n "$(find src include -name '*.h' -newer "$o" | head -1)" ]; then
    "$CC_FUZZ" $FLAGS $simd $san -c "$src" -o "$o" || { echo "fuzz: build of $src failed" >&2; exit 1; }
  fi
  objs="$objs $o"
done
rm -f "$OUT/libsparq-fuzz.a"
ar rcs "$OUT/libsparq-fuzz.a" $objs || exit 1
harnesses=""
for h in fuzz/fuzz_*.c; do
  name=$(basename "$h" .c)
  [ -n "${FUZZ_ONLY:-}" ] && [ "$name" != "$FUZZ_ONLY" ] && continue
  "$CC_FUZZ" $FLAGS $SAN -fsanitize=fuzzer "$h" "$OUT/libsparq-fuzz.a" $LIBS -o "$OUT/$name" ||
    { echo "fuzz: build of $h failed" >&2; exit 1; }
  harnesses="$harnesses $name"
done

# Seeds made with our writer: a tiny model (several tensor types, a vocab),
# and a metadata-only file.
cat > "$OUT/gen_seeds.c" <<'GEN'
#include "tensor/gguf.h"
#include "tensor/quant.h"
#include <stdio.h>
#include <string.h>
static int fill(void *u, void *dst, size_t n) { memset(dst, (int)(size_t)u, n); return 0; }
int main(int argc, char **argv)
{
    if (argc < 3) return 2;
    const char *toks[4] = { "<unk>", "<s>", "</s>", "a" };
    float scores[4] = { 0, 0, 0, -1 };
    int32_t types[4] = { 2, 3, 3, 1 };
    char err[256];
    for (int k = 0; k < 2; k++) {
        gguf_writer *w = gguf_writer_create();
        gguf_writer_set_str(w, "general.architecture", "llama");
        gguf_writer_set_u32(w, "llama.block_count", 1);
        gguf_writer_set_u32(w, "general.alignment", 32);
        gguf_writer_set_i32(w, "x.i32", -3);
        gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
        gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", 1);
        gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
        gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores, 4);
        gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, 4);
        if (k == 0) {
            gguf_writer_add_tensor(w, "token_embd.weight", QT_F32, 2, (const int64_t[]){ 8, 4 }, fill, (void *)1);
            gguf_writer_add_tensor(w, "blk.0.attn_q.weight", QT_Q8_0, 2, (const int64_t[]){ 32, 2 }, fill, (void *)2);
            gguf_writer_add_tensor(w, "blk.0.ffn_up.weight", QT_Q4_K, 1, (const int64_t[]){ 256 }, fill, (void *)3);
            gguf_writer_add_tensor(w, "output_norm.weight", QT_F16, 3, (const int64_t[]){ 3, 1, 2 }, fill, (void *)4);
        }
        if (gguf_writer_write(w, argv[1 + k], err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
        gguf_writer_free(w);
    }
    return 0;
}
GEN
mkdir -p "$OUT/seeds/fuzz_gguf" "$OUT/seeds/fuzz_kvfile" "$OUT/seeds/fuzz_tokenizer" "$OUT/seeds/fuzz_json" \
         "$OUT/seeds/fuzz_index" "$OUT/seeds/fuzz_request"
if "$CC_FUZZ" $FLAGS "$OUT/gen_seeds.c" src/tensor/gguf.c src/tensor/quant_types.c src/util/err.c src/util/paths.c -o "$OUT/gen_seeds" &&
   "$OUT/gen_seeds" "$OUT/seeds/fuzz_gguf/gen-model.gguf" "$OUT/seeds/fuzz_gguf/gen-vocab.gguf"; then :; else
  echo "fuzz: could not generate seeds (continuing with the others)" >&2
fi

# Real files from the search path ($SPARQ_MODEL_PATH, with the fallbacks above).
find_data() {
  local IFS=:
  for d in ${SPARQ_MODEL_PATH:-}; do
    [ -n "$d" ] && [ -r "$d/$1" ] && { echo "$d/$1"; return 0; }
  done
  return 1
}
n_real=0
if p=$(find_data stories260K.gguf); then cp -f "$p" "$OUT/seeds/fuzz_gguf/" && n_real=$((n_real + 1)); fi
if t=$(find_data golden/llamacpp/tokenizer/ggml-vocab-llama-spm.gguf); then
  for f in "$(dirname "$t")"/*.gguf; do cp -f "$f" "$OUT/seeds/fuzz_gguf/" && n_real=$((n_real + 1)); done
fi

# KV files: two small caches made by the library's own writer (f16 with an
# exact index and K^T, f32 without), so the harness starts from valid files.
cat > "$OUT/gen_kv.c" <<'GEN'
#include "attn/attn.h"
#include "io/kvfile.h"
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv)
{
    if (argc < 3) return 2;
    enum { L = 2, H = 2, D = 8, N = 20, CAP = 24 };
    char err[512];
    for (int f = 0; f < 2; f++) {
        const int elem = f == 0 ? KV_F16 : KV_F32, es = f == 0 ? 2 : 4;
        kvf_fingerprint fp;
        kvf_synthetic_fingerprint(&fp, L, 4, H, D);
        kvf_writer *w;
        int32_t tokens[N];
        for (int i = 0; i < N; i++) tokens[i] = i * 7;
        const kvf_shape shape = { .elem = elem, .n = N, .cap = CAP, .with_kt = f == 0,
                                  .n_tokens = f == 0 ? N : 0, .kinds = f == 0 ? "exact" : "" };
        if (kvf_writer_create(argv[1 + f], &fp, &shape, &w, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
        if (f == 0) kvf_writer_tokens(w, tokens);
        unsigned char *k = calloc(N * D, 4), *v = calloc(N * D, 4);
        for (int i = 0; i < N * D * es; i++) { k[i] = (unsigned char)(i * 13 % 61); v[i] = (unsigned char)(i % 31); }
        sparq_attn_params ap = sparq_attn_default_params();
        ap.policy = "topk";
        for (int hh = 0; hh < L * H; hh++) {
            if (kvf_writer_head(w, hh / H, hh % H, k, v, NULL, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
            if (f == 0) {
                attn_kv_view view = { N, D, elem, k, v, NULL, N, NULL };
                void *img; size_t bytes;
                if (attn_topk_index_image(&ap, "exact", &view, N, 1, &img, &bytes, err, sizeof err) ||
                    kvf_writer_index(w, hh / H, hh % H, "exact", img, bytes, N, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
                if (hh == 0 && argc > 3) { /* the image alone seeds fuzz_index */
                    FILE *o = fopen(argv[3], "wb");
                    if (!o || fwrite(img, 1, bytes, o) != bytes || fclose(o)) return 1;
                }
                free(img);
            }
        }
        if (kvf_writer_finish(w, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
        free(k); free(v);
    }
    return 0;
}
GEN
if ! { "$CC_FUZZ" $FLAGS $SAN "$OUT/gen_kv.c" "$OUT/libsparq-fuzz.a" $LIBS -o "$OUT/gen_kv" &&
       "$OUT/gen_kv" "$OUT/seeds/fuzz_kvfile/f16-exact.kv" "$OUT/seeds/fuzz_kvfile/f32.kv" \
                     "$OUT/seeds/fuzz_index/exact-f16.idx"; }; then
  echo "fuzz: could not generate KV-file seeds" >&2; exit 1
fi
# Tokenizer: the golden input texts, each behind a vocabulary/template byte.
if inp0=$(find_data golden/llamacpp/tokenizer/ggml-vocab-llama-spm.gguf.inp); then
  i=0
  for inp in "$(dirname "$inp0")"/*.inp; do
    { printf '%b' "\\x$(printf %02x $((i * 7 % 256)))"; head -c 2000 "$inp"; } > "$OUT/seeds/fuzz_tokenizer/t$i"
    i=$((i + 1))
  done
fi
printf '\x03Hello <|im_start|>world [INST] \xf0\x9f\x98\x80 \xe2\x96\x81\n\n' > "$OUT/seeds/fuzz_tokenizer/chat"
# JSON: small documents of every kind.
printf '{"a":[1,-2.5e3,true,false,null],"s":"x\\u00e9\\ud83d\\ude00\\n","o":{}}' > "$OUT/seeds/fuzz_json/doc"
printf '[[[["deep"]]]]' > "$OUT/seeds/fuzz_json/nest"
printf '"\\u0000 \xc3\xa9"' > "$OUT/seeds/fuzz_json/str"
# Request bodies: valid ones for each endpoint and every field (each is
# accepted by its endpoint's parser, tests/test_request.c; every input goes
# to every endpoint).
R="$OUT/seeds/fuzz_request"
printf '{"model":"m","prompt":"Once upon a time","max_tokens":8,"temperature":0.7,"top_p":0.9,"top_k":40,"seed":7}' > "$R/completion"
printf '{"prompt":[1,400,29,7],"max_tokens":4,"stop":["\\n","."],"logprobs":3,"echo":true,"stream":true}' > "$R/ids"
printf '{"prompt":["Lily \\u00e9\\ud83d\\ude00"],"stop":"end","min_p":0.05,"repeat_penalty":1.1,"presence_penalty":0.5,"ignore_eos":true}' > "$R/prompt-array"
printf '{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Tell a story."}],"logprobs":true,"top_logprobs":2,"max_completion_tokens":16}' > "$R/chat"
printf '{"messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":"c"}],"n":1}' > "$R/chat-parts"
printf '{"prompt":"x","sparq":{"attn":"sparq","ratio":"1/8","select":"logits","no_realloc":true,"l":4}}' > "$R/sparq"
printf '{"prompt":"x","sparq":{"attn":"topk","index":"ivf","topk_k":32,"schedule":"linear","ivf_nlist":4,"ivf_nprobe":2,"key_type":"i8"}}' > "$R/topk"
printf '{"prompt":"x","sparq":{"attn":"streaming","attn_k":64,"n_sink":4}}' > "$R/streaming"
printf '{"content":"Once upon a time","add_special":true}' > "$R/tokenize"
printf '{"tokens":[1,2,3]}' > "$R/detokenize"
printf '{"prompt":[1,5],"logit_bias":{"3":-100,"258":2.5},"sparq":{"prefix_id":"doc-42"}}' > "$R/bias-prefix"

mkdir -p "$OUT/seeds/fuzz_llama_state" && cp -f tests/data/llamacpp/*.state "$OUT/seeds/fuzz_llama_state/" 2>/dev/null
echo "fuzz: harnesses:$harnesses; ${SECONDS_TOTAL}s each; $n_real real GGUF seeds"
failed=0
for name in $harnesses; do
  mkdir -p "$OUT/corpus-$name" "$OUT/seeds/$name"
  # max_len keeps executions fast: big seeds are cut (GGUF: the header,
  # metadata and tensor infos are in the first 64 KiB; KV files need their
  # 4 KiB-aligned sections)
  case $name in
    fuzz_kvfile|fuzz_llama_state) max_len=262144 ;;
    fuzz_gguf) max_len=65536 ;;
    *) max_len=4096 ;;
  esac
  echo "fuzz: $name"
  "$OUT/$name" -max_total_time="$SECONDS_TOTAL" -rss_limit_mb=2048 -max_len=$max_len -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$OUT/$name-" "$OUT/corpus-$name" "$OUT/seeds/$name" 2>&1 |
    grep -E '^(stat::number_of_executed_units|stat::new_units_added|==|SUMMARY|INFO: Seed)|ERROR|Assert|abort' | head -40
  rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    echo "fuzz: $name FAILED (exit $rc); reproducer in $OUT/$name-crash-* / -leak-* / -timeout-*" >&2
    failed=1
  fi
done
[ $failed -eq 0 ] || exit 1
echo "fuzz: ok"

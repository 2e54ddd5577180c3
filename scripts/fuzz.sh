#!/usr/bin/env bash
# fuzz.sh - a short libFuzzer run over the GGUF reader (`make fuzz`).
#
# Builds fuzz/fuzz_gguf.c with clang's fuzzer + ASan + UBSan into build-fuzz/,
# seeds build-fuzz/seeds with valid GGUFs (stories260K.gguf and llama.cpp's
# vocab files from the search path, plus small files made with our writer),
# and fuzzes for FUZZ_SECONDS (default 60). New inputs accumulate in
# build-fuzz/corpus across runs; a crash leaves build-fuzz/crash-* and makes
# this script exit non-zero. Without clang or the libFuzzer runtime
# (libclang-rt-14-dev, see scripts/setup.sh) it prints why and "fuzz: skipped".
set -u
cd "$(dirname "$0")/.." || exit 1

OUT=build-fuzz
SECONDS_TOTAL=${FUZZ_SECONDS:-60}
CC_FUZZ=""
for c in clang clang-14 clang-15 clang-16; do
  command -v "$c" >/dev/null 2>&1 && { CC_FUZZ=$c; break; }
done
if [ -z "$CC_FUZZ" ]; then
  echo "fuzz: clang not found (apt-get install clang libclang-rt-14-dev)" >&2
  echo "fuzz: skipped"
  exit 0
fi
mkdir -p "$OUT/seeds" "$OUT/corpus" || exit 1

# Can this clang link a fuzzer at all? (the runtime is a separate package)
probe="$OUT/probe.c"
printf '#include <stdint.h>\n#include <stddef.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' > "$probe"
if ! "$CC_FUZZ" -fsanitize=fuzzer "$probe" -o "$OUT/probe" >/dev/null 2>&1; then
  echo "fuzz: $CC_FUZZ cannot link -fsanitize=fuzzer (libFuzzer runtime missing: apt-get install libclang-rt-14-dev)" >&2
  echo "fuzz: skipped"
  exit 0
fi
rm -f "$probe" "$OUT/probe"

FLAGS="-std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer -Iinclude -Isrc"
echo "fuzz: building $OUT/fuzz_gguf with $CC_FUZZ"
"$CC_FUZZ" $FLAGS -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  fuzz/fuzz_gguf.c src/tensor/gguf.c src/tensor/quant_types.c -o "$OUT/fuzz_gguf" || { echo "fuzz: build failed" >&2; exit 1; }

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
if "$CC_FUZZ" $FLAGS "$OUT/gen_seeds.c" src/tensor/gguf.c src/tensor/quant_types.c -o "$OUT/gen_seeds" &&
   "$OUT/gen_seeds" "$OUT/seeds/gen-model.gguf" "$OUT/seeds/gen-vocab.gguf"; then :; else
  echo "fuzz: could not generate seeds (continuing with the others)" >&2
fi

# Real files from the search path: $SPARQ_MODEL_PATH, ../shared/models, ../shared.
find_data() {
  local IFS=:
  for d in ${SPARQ_MODEL_PATH:-} ../shared/models ../shared; do
    [ -n "$d" ] && [ -r "$d/$1" ] && { echo "$d/$1"; return 0; }
  done
  return 1
}
n_real=0
if p=$(find_data stories260K.gguf); then cp -f "$p" "$OUT/seeds/" && n_real=$((n_real + 1)); fi
if t=$(find_data golden/llamacpp/tokenizer/ggml-vocab-llama-spm.gguf); then
  for f in "$(dirname "$t")"/*.gguf; do cp -f "$f" "$OUT/seeds/" && n_real=$((n_real + 1)); done
fi
echo "fuzz: $(ls "$OUT/seeds" | wc -l) seeds ($n_real real files), ${SECONDS_TOTAL}s"

# max_len keeps executions fast: big seeds are cut to their first 64 KiB
# (the header, metadata and tensor infos, where the parsing happens).
"$OUT/fuzz_gguf" -max_total_time="$SECONDS_TOTAL" -rss_limit_mb=2048 -max_len=65536 -timeout=10 \
  -print_final_stats=1 -artifact_prefix="$OUT/" "$OUT/corpus" "$OUT/seeds"
rc=$?
if [ $rc -ne 0 ]; then
  echo "fuzz: FAILED (exit $rc); reproducer in $OUT/crash-* / $OUT/leak-* / $OUT/timeout-*" >&2
  exit $rc
fi
echo "fuzz: ok"

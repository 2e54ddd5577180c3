/* fuzz_gguf.c - libFuzzer harness for the GGUF reader (scripts/fuzz.sh).
 *
 * Parses the input and, when it is accepted, touches everything the parser
 * handed out: every key and string, every array element through the typed
 * accessors, and every tensor's first and last data byte, so ASan flags any
 * view that points outside the input.
 */
#include "tensor/gguf.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static volatile uint64_t sink; /* keeps the reads from being optimised away */

static uint64_t touch_str(gguf_str s)
{
    return s.len ? (uint8_t)s.data[0] + (uint8_t)s.data[s.len - 1] : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gguf_file *f = NULL;
    char err[256];
    if (gguf_parse(data, size, &f, err, sizeof err) != 0) {
        /* errors are one line */
        if (!memchr(err, '\n', strnlen(err, sizeof err))) sink += err[0];
        return 0;
    }
    uint64_t acc = 0;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        acc += touch_str(kv->key);
        if (kv->strs)
            for (uint64_t j = 0; j < kv->n; j++) acc += touch_str(kv->strs[j]);
        else
            for (uint64_t j = 0; j < kv->n; j++) acc += (uint64_t)gguf_arr_int(kv, j) + (gguf_arr_float(kv, j) > 0.5); /* no float->int cast: 1e300 */
        /* lookups by the key itself exercise the getters on every type */
        char key[64];
        size_t n = kv->key.len < sizeof key - 1 ? (size_t)kv->key.len : sizeof key - 1;
        memcpy(key, kv->key.data, n);
        key[n] = 0;
        int64_t iv;
        double dv;
        int bv;
        gguf_str sv;
        acc += (uint64_t)gguf_get_int(f, key, &iv) + (uint64_t)gguf_get_float(f, key, &dv) +
               (uint64_t)gguf_get_bool(f, key, &bv) + (uint64_t)gguf_get_str(f, key, &sv);
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        acc += touch_str(t->name) + (uint64_t)t->ne[0] + t->type;
        if (t->nbytes) {
            const uint8_t *p = t->data;
            acc += p[0] + p[t->nbytes - 1];
        }
    }
    sink += acc;
    gguf_close(f);
    return 0;
}

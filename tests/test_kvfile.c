/* test_kvfile.c - KV cache files: CRC-32C twins, a synthetic round trip
 * (every byte back, holes, sums, K^T, index images), hostile files
 * (corrupt, truncated, another version or model: one-line errors), and on
 * stories260K: prefill + save, then load + decode == decoding on in the
 * original process, bit for bit, for several policies. */
#include "test.h"
#include "io/kvfile.h"
#include "util/paths.h"
#include "util/sysmem.h"
#include "tensor/quant.h"
#include "sparq.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t rng_state = 0x1234567887654321ull;
static uint32_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

static void test_crc(void)
{
    const char *s = "123456789";
    CHECK(kvf_crc32c_ref(0, s, 9) == 0xE3069283u, "crc32c check value: %08x", kvf_crc32c_ref(0, s, 9));
    CHECK(kvf_crc32c(0, s, 9) == 0xE3069283u, "dispatched crc32c check value");
    uint8_t buf[1200];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)rnd();
    for (size_t off = 0; off < 9; off++)
        for (size_t n = 0; n < 300; n += 1 + n / 7) {
            uint32_t a = kvf_crc32c_ref(0, buf + off, n);
#ifdef KVF_HAVE_SSE42
            CHECK(kvf_crc32c_sse42(0, buf + off, n) == a, "sse42 vs ref at off %zu n %zu", off, n);
#endif
            /* continuation = one pass */
            CHECK(kvf_crc32c(kvf_crc32c(0, buf + off, n / 3), buf + off + n / 3, n - n / 3) == a,
                  "chained crc at n %zu", n);
        }
}

static char tmp_path[256];

static int write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(p, 1, n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* Opening `bytes` must fail with a message containing `want`, on one line. */
static void expect_reject(const uint8_t *bytes, size_t n, const kvf_fingerprint *fp, const char *want,
                          const char *what)
{
    char path[300], err[512];
    snprintf(path, sizeof path, "%s.bad", tmp_path);
    CHECK(write_file(path, bytes, n) == 0, "write %s", path);
    kvf_file *f = NULL;
    int rc = kvf_open(path, fp, KVF_VERIFY_AUTO, &f, err, sizeof err);
    CHECK(rc == -1 && f == NULL, "%s: accepted", what);
    CHECK(strstr(err, want) != NULL, "%s: message '%s' lacks '%s'", what, err, want);
    CHECK(strchr(err, '\n') == NULL && strlen(err) > 10, "%s: one-line message '%s'", what, err);
    kvf_close(f);
    unlink(path);
}

static void put_u32(uint8_t *b, size_t at, uint32_t v) { memcpy(b + at, &v, 4); }

/* Re-seals a header edited in place, so only the edited field is wrong. */
static void reseal(uint8_t *b) { put_u32(b, KVF_PAGE - 4, kvf_crc32c(0, b, KVF_PAGE - 4)); }

static void test_synthetic(int elem)
{
    enum { L = 2, H = 2, D = 8, N = 37, CAP = 5000 };
    const size_t es = elem == KV_F16 ? 2 : 4, rowb = (size_t)D * es;
    kvf_fingerprint fp;
    kvf_synthetic_fingerprint(&fp, L, 4, H, D);
    uint8_t *k = malloc((size_t)L * H * N * rowb), *v = malloc((size_t)L * H * N * rowb);
    float *kf = malloc((size_t)N * D * sizeof(float));
    int32_t tokens[N];
    for (int i = 0; i < N; i++) tokens[i] = 100 + i;
    for (size_t i = 0; i < (size_t)L * H * N * D; i++) {
        float a = (float)((int)(rnd() % 2001) - 1000) / 300.0f, b = (float)((int)(rnd() % 2001) - 1000) / 300.0f;
        if (elem == KV_F16) {
            ((uint16_t *)k)[i] = fp32_to_fp16(a);
            ((uint16_t *)v)[i] = fp32_to_fp16(b);
        } else {
            ((float *)k)[i] = a;
            ((float *)v)[i] = b;
        }
    }
    char err[512];
    kvf_writer *w = NULL;
    const kvf_shape shape = {.elem = elem, .n = N, .cap = CAP, .with_kt = 1, .n_tokens = N, .kinds = "sparq,exact"};
    CHECK(kvf_writer_create(tmp_path, &fp, &shape, &w, err, sizeof err) == 0, "%s", err);
    if (!w) return;
    kvf_writer_tokens(w, tokens);
    sparq_attn_params ap = sparq_attn_default_params();
    ap.policy = "topk";
    void *imgs[L * H][2];
    size_t img_bytes[L * H][2];
    for (int hh = 0; hh < L * H; hh++) {
        const uint8_t *kh = k + (size_t)hh * N * rowb, *vh = v + (size_t)hh * N * rowb;
        CHECK(kvf_writer_head(w, hh / H, hh % H, kh, vh, NULL, err, sizeof err) == 0, "%s", err);
        attn_kv_view view = { N, D, elem, kh, vh, NULL, N, NULL, NULL, NULL, 0, 0 };
        const char *kinds[2] = { "sparq", "exact" };
        for (int i = 0; i < 2; i++) {
            CHECK(attn_topk_index_image(&ap, kinds[i], &view, N, 1, &imgs[hh][i], &img_bytes[hh][i], err,
                                        sizeof err) == 0, "%s", err);
            CHECK(kvf_writer_index(w, hh / H, hh % H, kinds[i], imgs[hh][i], img_bytes[hh][i], N, err,
                                   sizeof err) == 0, "%s", err);
        }
    }
    CHECK(kvf_writer_finish(w, err, sizeof err) == 0, "%s", err);

    struct stat st;
    CHECK(stat(tmp_path, &st) == 0, "stat");
    /* K and V alone span 2 * L*H*CAP*D*es = 640 KB (f16); the written data
     * is far less: the unused capacity must be holes */
    CHECK((int64_t)st.st_blocks * 512 < (int64_t)st.st_size / 2, "sparse file: %lld of %lld bytes allocated",
          (long long)st.st_blocks * 512, (long long)st.st_size);

    kvf_file *f = NULL;
    CHECK(kvf_open(tmp_path, &fp, KVF_VERIFY_AUTO, &f, err, sizeof err) == 0, "%s", err);
    if (!f) return;
    CHECK(f->verified == 1, "small file: data checksums verified");
    CHECK(f->n == N && f->cap == CAP && f->elem == elem && f->n_tokens == N, "shape back");
    CHECK(memcmp(f->tokens, tokens, sizeof tokens) == 0, "tokens back");
    int same = 1, holes = 1, kt_ok = 1, sums = 1;
    for (int hh = 0; hh < L * H; hh++) {
        const uint8_t *fk = f->k + (size_t)hh * CAP * rowb, *fv = f->v + (size_t)hh * CAP * rowb;
        same &= memcmp(fk, k + (size_t)hh * N * rowb, N * rowb) == 0;
        same &= memcmp(fv, v + (size_t)hh * N * rowb, N * rowb) == 0;
        for (size_t b = N * rowb; b < (size_t)CAP * rowb; b += 97) holes &= fk[b] == 0 && fv[b] == 0;
        for (int j = 0; j < D; j++) {
            float s = 0;
            for (int i = 0; i < N; i++) {
                size_t at = ((size_t)hh * N + i) * D + j;
                s += elem == KV_F16 ? fp16_to_fp32(((uint16_t *)v)[at]) : ((float *)v)[at];
                kt_ok &= memcmp(f->kt + ((size_t)hh * CAP * D + (size_t)j * CAP + i) * es,
                                k + at * es, es) == 0;
            }
            sums &= f->v_sum[hh * D + j] == s;
        }
        for (int i = 0; i < 2; i++) {
            size_t bytes = 0;
            const void *img = kvf_find_index(f, hh / H, hh % H, i ? "exact" : "sparq", &bytes);
            CHECK(img && bytes == img_bytes[hh][i] && memcmp(img, imgs[hh][i], bytes) == 0,
                  "index image %d of head %d back", i, hh);
            CHECK(((uintptr_t)img & 63) == 0, "image aligned for in-place use");
        }
    }
    CHECK(kvf_find_index(f, 0, 0, "ivf", &(size_t){ 0 }) == NULL, "absent kind not found");
    CHECK(same, "K and V rows back bit for bit");
    CHECK(holes, "capacity beyond n reads as zeros");
    CHECK(kt_ok, "K^T columns equal K rows");
    CHECK(sums, "V sums in position order");
    size_t ib = 0;
    const size_t img_off = (size_t)((const uint8_t *)kvf_find_index(f, 1, 1, "exact", &ib) - f->map);
    /* the mapping is private: writing a suffix row leaves the file alone */
    f->k[(size_t)N * rowb] = 0x55;
    kvf_close(f);

    /* hostile variants of the file */
    size_t n;
    uint8_t *b = test_read_file(tmp_path, &n);
    CHECK(b && n == (size_t)st.st_size, "read back");
    if (!b) return;
    const uint64_t k_off = *(uint64_t *)(b + 144), meta_off = *(uint64_t *)(b + 128);
    CHECK(b[k_off + N * rowb] == 0, "suffix write did not reach the file");
    uint8_t *c = malloc(n);
    kvf_fingerprint other = fp;
    other.n_layer = 3;
    expect_reject(b, n, &other, "another model", "other model shape");
    other = fp;
    other.model_hash = 42;
    expect_reject(b, n, &other, "another model", "other model hash");
    memcpy(c, b, n); c[0] = 'X';
    expect_reject(c, n, &fp, "bad magic", "magic");
    memcpy(c, b, n); put_u32(c, 8, 2); reseal(c);
    expect_reject(c, n, &fp, "format version 2", "version");
    memcpy(c, b, n); c[100] ^= 1;
    expect_reject(c, n, &fp, "header checksum", "header bit flip");
    memcpy(c, b, n); c[meta_off + 5] ^= 0x10;
    expect_reject(c, n, &fp, "metadata checksum", "metadata bit flip");
    memcpy(c, b, n); c[k_off + rowb * 3 + 1] ^= 0x20;
    expect_reject(c, n, &fp, "data checksum mismatch in K of layer 0 head 0", "K bit flip");
    memcpy(c, b, n); c[img_off + ib / 2] ^= 0x01;
    expect_reject(c, n, &fp, "exact index of layer 1 head 1", "index image bit flip");
    expect_reject(b, n - 4096, &fp, "truncated", "truncated by a page");
    expect_reject(b, 100, &fp, "truncated", "truncated to 100 bytes");
    expect_reject(b, n / 2, &fp, "truncated", "truncated to half");
    memcpy(c, b, n); put_u32(c, 56, 1000000); reseal(c);
    expect_reject(c, n, NULL, "bad header", "absurd layer count");
    memcpy(c, b, n); *(uint64_t *)(c + 144) += 4096; reseal(c);
    expect_reject(c, n, NULL, "offsets", "moved section");
    /* bytes quoted from the file are escaped: an architecture and an index
     * kind with control bytes, a quote and a byte >= 0x80 */
    memcpy(c, b, n); memcpy(c + 24, "ev\x1b[31mil\x01'\xff", 12); reseal(c);
    expect_reject(c, n, &fp, "file: ev\\x1b[31mil\\x01\\x27\\xff, 2 layers", "escaped architecture");
    {
        char err2[512];
        kvf_file *g = NULL;
        write_file(tmp_path, c, n);
        CHECK(kvf_open(tmp_path, &fp, KVF_VERIFY_AUTO, &g, err2, sizeof err2) == -1, "escaped arch rejected");
        int raw = 0;
        for (const char *q = err2; *q; q++) raw |= (unsigned char)*q < 0x20 || (unsigned char)*q >= 0x7f;
        CHECK(!raw, "no raw control or high bytes in '%s'", err2);
        kvf_close(g);
    }
    {
        const uint64_t meta_bytes = *(uint64_t *)(b + 136);
        memcpy(c, b, n);
        uint8_t *e = NULL; /* the first directory entry of kind exact */
        for (uint64_t o = 0; o + 64 <= meta_bytes && !e; o += 4)
            if (memcmp(c + meta_off + o, "exact\0\0\0", 8) == 0) e = c + meta_off + o;
        CHECK(e != NULL, "exact entry found");
        if (e) {
            memcpy(e, "ex\x07\xfe\nct", 8);
            put_u32(c, 192, kvf_crc32c(0, c + meta_off, (size_t)meta_bytes));
            reseal(c);
            expect_reject(c, n, &fp, "('ex\\x07\\xfe\\x0act', layer", "escaped index kind");
        }
    }
    uint8_t *longer = calloc(1, n + 4096);
    memcpy(longer, b, n);
    expect_reject(longer, n + 4096, &fp, "unexpected bytes", "trailing garbage");
    free(longer);
    free(c);
    free(b);
    for (int hh = 0; hh < L * H; hh++) free(imgs[hh][0]), free(imgs[hh][1]);
    free(k);
    free(v);
    free(kf);
    unlink(tmp_path);
}

/* ---- with the model ------------------------------------------------------------ */

static sparq_model *model;

typedef struct run_out {
    float  *logits;   /* [steps][V] after the question and each decode step */
    int32_t toks[64];
} run_out;

/* Greedy decode of `steps` tokens from a context holding the prefix; the
 * question (if any) is prefilled first. */
static int decode_rest(sparq_context *c, const int32_t *question, int n_q, int steps, run_out *o)
{
    const int V = sparq_model_n_vocab(model);
    float *lg = o->logits;
    if (sparq_eval(c, question, n_q, lg)) return -1;
    for (int i = 1; i < steps; i++) {
        const float *prev = lg + (size_t)(i - 1) * V;
        int32_t best = 0;
        for (int t = 1; t < V; t++)
            if (prev[t] > prev[best]) best = t;
        o->toks[i - 1] = best;
        if (sparq_eval(c, &best, 1, lg + (size_t)i * V)) return -1;
    }
    return 0;
}

static void test_model_roundtrip(const int32_t *story, int n_story)
{
    enum { N_PREFIX = 300, N_Q = 7, STEPS = 24 };
    const int V = sparq_model_n_vocab(model);
    int32_t prefix[N_PREFIX], question[N_Q];
    for (int i = 0; i < N_PREFIX; i++) prefix[i] = story[i % n_story];
    for (int i = 0; i < N_Q; i++) question[i] = story[(i * 7 + 3) % n_story];
    struct { const char *policy, *index, *save; int k, key; } cases[] = {
        { "dense", NULL, "", 0, 0 },
        { "topk", "exact", "exact,ivf,sparq", 16, 0 },
        { "topk", "ivf", "exact,ivf,sparq", 8, 0 },
        { "topk", "sparq", "sparq", 16, 0 },
        { "topk", "exact", "exact", 16, SPARQ_KEY_I8 },
        { "sparq", NULL, "", 24, 0 },
    };
    char err[512];
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        sparq_context_params cp = sparq_context_default_params();
        cp.n_ctx = 512;
        cp.n_threads = 2;
        cp.attn.policy = cases[ci].policy;
        cp.attn.index = cases[ci].index;
        cp.attn.k = cases[ci].k;
        cp.attn.index_key_type = cases[ci].key;
        if (strcmp(cases[ci].policy, "sparq") == 0) cp.attn.r = 2;
        run_out a = { 0 }, b = { 0 };
        a.logits = malloc((size_t)STEPS * V * sizeof(float));
        b.logits = malloc((size_t)STEPS * V * sizeof(float));
        sparq_context *ca = NULL, *cb = NULL;
        CHECK(sparq_context_create(model, &cp, &ca, err, sizeof err) == 0, "%s", err);
        if (!ca) continue;
        CHECK(sparq_eval(ca, prefix, N_PREFIX, NULL) == 0, "prefill");
        sparq_context_mark_prefix(ca);
        CHECK(sparq_context_save_kv(ca, tmp_path, cases[ci].save, prefix, N_PREFIX, err, sizeof err) == 0,
              "%s", err);
        CHECK(decode_rest(ca, question, N_Q, STEPS, &a) == 0, "decode in the original process");

        sparq_context_params lp = cp;
        lp.n_ctx = 0;
        /* read into the page cache first on odd cases: nothing it decodes may change */
        if (ci % 2) CHECK(sparq_kv_preload(tmp_path, NULL, NULL, err, sizeof err) == 0, "preload: %s", err);
        CHECK(sparq_context_load_kv(model, &lp, tmp_path, SPARQ_VERIFY_ALWAYS, &cb, err, sizeof err) == 0,
              "%s", err);
        if (cb) {
            CHECK(sparq_context_pos(cb) == N_PREFIX && sparq_context_n_ctx(cb) == 512, "loaded shape");
            CHECK(decode_rest(cb, question, N_Q, STEPS, &b) == 0, "decode after load");
            CHECK(memcmp(a.logits, b.logits, (size_t)STEPS * V * sizeof(float)) == 0,
                  "%s/%s: load + decode is bit-identical to decoding on", cases[ci].policy,
                  cases[ci].index ? cases[ci].index : "-");
            sparq_attn_stats sa, sb;
            sparq_context_attn_stats(ca, &sa);
            sparq_context_attn_stats(cb, &sb);
            CHECK(sa.elements == sb.elements && sa.formula_elements == sb.formula_elements,
                  "%s: same transfers (%lld vs %lld)", cases[ci].policy, (long long)sa.elements,
                  (long long)sb.elements);
            /* reset works on a mapped cache: back to an empty sequence */
            sparq_context_reset(cb);
            CHECK(sparq_context_pos(cb) == 0, "reset");
        }
        sparq_context_free(ca);
        sparq_context_free(cb);
        free(a.logits);
        free(b.logits);
    }

    /* a file saved without K^T (dense context) loaded by SparQ: the cache
     * rebuilds K^T from K and takes the V sums from the file, and decodes
     * like a SparQ context that prefilled the prefix itself */
    {
        sparq_context_params cp = sparq_context_default_params();
        cp.n_ctx = 512;
        cp.n_threads = 2;
        sparq_context *cd = NULL, *cs = NULL, *cl = NULL;
        CHECK(sparq_context_create(model, &cp, &cd, err, sizeof err) == 0, "%s", err);
        CHECK(cd && sparq_eval(cd, prefix, N_PREFIX, NULL) == 0, "prefill dense");
        CHECK(cd && sparq_context_save_kv(cd, tmp_path, "", NULL, 0, err, sizeof err) == 0, "%s", err);
        cp.attn.policy = "sparq";
        cp.attn.r = 2;
        cp.attn.k = 24;
        run_out a = { 0 }, b = { 0 };
        a.logits = malloc((size_t)STEPS * V * sizeof(float));
        b.logits = malloc((size_t)STEPS * V * sizeof(float));
        CHECK(sparq_context_create(model, &cp, &cs, err, sizeof err) == 0, "%s", err);
        CHECK(cs && sparq_eval(cs, prefix, N_PREFIX, NULL) == 0, "prefill sparq");
        CHECK(cs && decode_rest(cs, question, N_Q, STEPS, &a) == 0, "decode sparq");
        sparq_context_params lp = cp;
        lp.n_ctx = 0;
        CHECK(sparq_context_load_kv(model, &lp, tmp_path, SPARQ_VERIFY_AUTO, &cl, err, sizeof err) == 0, "%s", err);
        CHECK(cl && decode_rest(cl, question, N_Q, STEPS, &b) == 0, "decode sparq after load");
        CHECK(memcmp(a.logits, b.logits, (size_t)STEPS * V * sizeof(float)) == 0,
              "sparq from a K^T-less file = sparq prefilled in process");
        sparq_context_free(cd);
        sparq_context_free(cs);
        sparq_context_free(cl);
        free(a.logits);
        free(b.logits);
    }

    /* a context size other than the file's is refused, with a message */
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = 1024;
    sparq_context *c = NULL;
    CHECK(sparq_context_load_kv(model, &cp, tmp_path, SPARQ_VERIFY_AUTO, &c, err, sizeof err) == -1 &&
              strstr(err, "capacity 512"), "n_ctx mismatch: %s", err);
    unlink(tmp_path);
}

/* sparq_kv_preload reads a file it can hold, refuses one larger than the
 * memory available without reading it, and says why for a bad path. */
typedef struct { int64_t calls, last_done, total, backwards; } preload_seen;
static void preload_cb(void *user, int64_t done, int64_t total)
{
    preload_seen *s = user;
    if (done < s->last_done) s->backwards++;
    s->calls++;
    s->last_done = done;
    s->total = total;
}

static void test_preload(void)
{
    char err[512], path[sizeof tmp_path + 16];
    snprintf(path, sizeof path, "%s.preload", tmp_path);
    const size_t n = ((size_t)40 << 20) + 12345; /* more than one read chunk, not a multiple of one */
    uint8_t *buf = malloc(n);
    CHECK(buf != NULL, "alloc");
    if (!buf) return;
    for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)(i * 31 + 7);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(buf, 1, n, f) == n && fclose(f) == 0, "write %s", path);
    free(buf);
    preload_seen s = { 0 };
    CHECK(sparq_kv_preload(path, preload_cb, &s, err, sizeof err) == 0, "preload: %s", err);
    CHECK(s.total == (int64_t)n && s.last_done == (int64_t)n && s.backwards == 0 && s.calls >= 3,
          "progress reaches the file's size in order (%lld calls, last %lld of %lld)", (long long)s.calls,
          (long long)s.last_done, (long long)s.total);
    CHECK(sparq_kv_preload(path, NULL, NULL, err, sizeof err) == 0, "preload without progress: %s", err);

    /* a sparse file 2 GiB larger than the available memory: refused, unread */
    const int64_t avail = sysmem_available();
    CHECK(avail > 0, "MemAvailable readable");
    CHECK(truncate(path, (off_t)(avail + ((int64_t)2 << 30))) == 0, "make a sparse file: %s", strerror(errno));
    preload_seen big = { 0 };
    err[0] = 0;
    CHECK(sparq_kv_preload(path, preload_cb, &big, err, sizeof err) == 1 && strstr(err, "memory available") &&
              big.calls == 0,
          "a file larger than memory is not read (rc, %lld progress calls): %s", (long long)big.calls, err);
    unlink(path);

    CHECK(sparq_kv_preload(path, NULL, NULL, err, sizeof err) == -1 && strstr(err, path), "missing file: %s", err);
    CHECK(sparq_kv_preload("/tmp", NULL, NULL, err, sizeof err) == -1 && err[0], "a directory: %s", err);
}

/* `sparq prefill` checks what would only fail after the long prefill
 * (duplicate index kinds, an output path it cannot write) before it. */
static void test_prefill_checks(const char *model_path)
{
    const char *b = getenv("SPARQ_BUILD");
    char bin[1024], cmd[4096], dir[] = "/tmp/test_kvfile_prefill_XXXXXX", errp[300];
    snprintf(bin, sizeof bin, "%s/sparq", b ? b : "build");
    if (access(bin, X_OK) != 0) {
        CHECK(0, "%s not built", bin);
        return;
    }
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    snprintf(errp, sizeof errp, "%s/err", dir);
    struct { const char *save, *index, *want; int ok; } cases[] = {
        { "x.kv", "exact,exact", "--index: index kind 'exact' given twice", 0 },
        { "no/such/dir/x.kv", "exact", "--save-kv: kvfile: cannot create", 0 },
        { "", "exact", "is not a regular file", 0 }, /* the directory itself */
        { "ok.kv", "exact", NULL, 1 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s prefill -m %s -p 'Once upon a time there was a cat' --save-kv %s/%s --index %s "
                 ">/dev/null 2>%s", bin, model_path, dir, cases[i].save, cases[i].index, errp);
        const int rc = system(cmd);
        size_t n = 0;
        char *e = test_read_file(errp, &n);
        const char *line = e ? strstr(e, "error: ") : NULL;
        if (cases[i].ok) {
            char tmp[300];
            snprintf(tmp, sizeof tmp, "%s/%s.tmp", dir, cases[i].save);
            CHECK(rc == 0 && !line && access(tmp, F_OK) != 0, "prefill to %s: exit %d, %s", cases[i].save, rc,
                  e ? e : "");
        } else {
            CHECK(rc != 0 && line && strstr(line, cases[i].want) && strchr(line, '\n') == line + strlen(line) - 1,
                  "prefill case %zu: exit %d, '%s'", i, rc, line ? line : "(no error line)");
            CHECK(e && !strstr(e, "prefill: "), "case %zu refused before the prefill: %s", i, e ? e : "");
        }
        free(e);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "cleanup");
}

int main(void)
{
    snprintf(tmp_path, sizeof tmp_path, "/tmp/test_kvfile_%d.kv", (int)getpid());
    test_crc();
    test_synthetic(KV_F16);
    test_synthetic(KV_F32);
    test_preload();

    char path[1024], err[512];
    if (path_find("stories260K.gguf", path, sizeof path)) {
        test_skip("stories260K.gguf not found");
        return test_summary("test_kvfile");
    }
    test_prefill_checks(path);
    CHECK(sparq_model_load(path, &model, err, sizeof err) == 0, "%s", err);
    size_t nb = 0;
    int32_t *story = NULL;
    if (path_find("golden/llamacpp/stories260K/boy_cat_story.tokens.i32", path, sizeof path) == 0)
        story = test_read_file(path, &nb);
    if (!model || !story) {
        test_skip("boy_cat_story tokens missing");
    } else {
        test_model_roundtrip(story, (int)(nb / 4));
    }
    free(story);
    sparq_model_free(model);
    return test_summary("test_kvfile");
}

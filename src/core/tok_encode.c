/* tok_encode.c - text -> token ids (tok_encode), matching llama.cpp's
 * llama_tokenize(add_special, parse_special = false).
 *
 * Map of this file:
 *   1. small growable arrays and the bigram heap shared by SPM and BPE
 *   2. special-token partition: user-defined tokens are cut out of the text
 *      first, longest first; the pieces between them are tokenized alone
 *   3. SPM: spaces -> "▁", optional leading "▁", then greedy merging of the
 *      adjacent pair whose merged text is the best-scoring token (ties: the
 *      leftmost), bytes of anything left unmatched -> <0xNN> tokens
 *   4. BPE: pre-tokenize into words, map bytes to the byte-level alphabet,
 *      merge the adjacent pair with the lowest merge rank (ties: leftmost)
 *   5. tok_encode
 */
#include "core/tok_internal.h"
#include "core/tokenizer.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* 1. containers                                                        */

typedef struct idvec { int32_t *v; size_t n, cap; } idvec;

static int push_id(idvec *o, int32_t id)
{
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 64;
        int32_t *v = realloc(o->v, cap * sizeof(*v));
        if (!v) return -1;
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = id;
    return 0;
}

/* A symbol is a byte span of the text being merged; merged-away symbols
 * keep n = 0 and leave the prev/next chain. */
typedef struct sym { size_t off, n; int prev, next; } sym;

/* A candidate merge of adjacent symbols left, right. key orders the heap:
 * -score for SPM (best score first), the merge rank for BPE. */
typedef struct bigram { double key; int left, right; size_t size; } bigram;

typedef struct heap { bigram *v; size_t n, cap; } heap;

static int before(const bigram *a, const bigram *b)
{
    return a->key < b->key || (a->key == b->key && a->left < b->left);
}

static int heap_push(heap *h, bigram b)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 64;
        bigram *v = realloc(h->v, cap * sizeof(*v));
        if (!v) return -1;
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0 && before(&b, &h->v[(i - 1) / 2])) {
        h->v[i] = h->v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->v[i] = b;
    return 0;
}

static bigram heap_pop(heap *h)
{
    bigram top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && before(&h->v[c + 1], &h->v[c])) c++;
        if (!before(&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n) h->v[i] = last;
    return top;
}

/* Splits s[0..len) into one symbol per UTF-8 character (by lead byte, so
 * invalid input still splits), chained in order. Returns the count. */
static int split_chars(const char *s, size_t len, sym *out)
{
    int n = 0;
    for (size_t off = 0; off < len; n++) {
        size_t l = tok_utf8_len((uint8_t)s[off]);
        if (l > len - off) l = len - off;
        out[n].off = off;
        out[n].n = l;
        out[n].prev = n - 1;
        off += l;
        out[n].next = off == len ? -1 : n + 1;
    }
    return n;
}

/* Applies the best bigram until none is left (the common core of SPM and
 * BPE) among the chained symbols sy[first .. first + n). A popped bigram is
 * stale when either side was merged meanwhile; since symbols only grow,
 * comparing the sizes detects exactly that. */
typedef int (*add_fn)(const tokenizer *t, const char *s, sym *sy, int l, int r, heap *h);

static int merge_all(const tokenizer *t, const char *s, sym *sy, int first, int n, heap *h, add_fn add)
{
    h->n = 0;
    for (int i = first + 1; i < first + n; i++)
        if (add(t, s, sy, i - 1, i, h)) return -1;
    while (h->n) {
        bigram b = heap_pop(h);
        sym *l = &sy[b.left], *r = &sy[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sy[r->next].prev = b.left;
        if (add(t, s, sy, l->prev, b.left, h) || add(t, s, sy, b.left, l->next, h)) return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* 2. special-token partition                                           */

typedef struct frag { size_t off, len; int32_t tok; } frag;  /* tok -1: text */
typedef struct fragvec { frag *v; size_t n, cap; } fragvec;

static int push_frag(fragvec *o, size_t off, size_t len, int32_t tok)
{
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 16;
        frag *v = realloc(o->v, cap * sizeof(*v));
        if (!v) return -1;
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = (frag){ off, len, tok };
    return 0;
}

/* C-locale isspace, which llama.cpp uses for LSTRIP/RSTRIP */
static int c_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* Some vocabularies have thousands of user-defined tokens; a token with a
 * byte pair that the text lacks cannot occur, which skips most of them
 * without scanning the text once per token. */
typedef struct pairset { uint64_t bits[65536 / 64]; uint64_t single[4]; } pairset;

static void pairset_fill(pairset *ps, const char *s, size_t len)
{
    memset(ps, 0, sizeof(*ps));
    for (size_t i = 0; i < len; i++) {
        unsigned b = (uint8_t)s[i];
        ps->single[b >> 6] |= 1ull << (b & 63);
        if (i + 1 < len) {
            unsigned p = b << 8 | (uint8_t)s[i + 1];
            ps->bits[p >> 6] |= 1ull << (p & 63);
        }
    }
}

static int pairset_may_contain(const pairset *ps, const char *s, size_t len)
{
    if (len == 1) return (ps->single[(uint8_t)s[0] >> 6] >> ((uint8_t)s[0] & 63)) & 1;
    for (size_t i = 0; i + 1 < len; i++) {
        unsigned p = (unsigned)(uint8_t)s[i] << 8 | (uint8_t)s[i + 1];
        if (!((ps->bits[p >> 6] >> (p & 63)) & 1)) return 0;
    }
    return 1;
}

static int partition(const tokenizer *t, const char *text, size_t len, fragvec *cur)
{
    fragvec next = { 0 };
    pairset *ps = NULL;
    cur->n = 0;
    if (len && push_frag(cur, 0, len, -1)) return -1;
    if (t->n_specials > 16 && len > 0) {
        ps = malloc(sizeof(*ps));
        if (!ps) return -1;
        pairset_fill(ps, text, len);
    }
    for (int32_t k = 0; k < t->n_specials; k++) {
        int32_t id = t->specials[k];
        const char *tx = t->text_arena + t->text_off[id];
        size_t tl = t->text_len[id];
        if (ps && !pairset_may_contain(ps, tx, tl)) continue;
        if (!memmem(text, len, tx, tl)) continue;
        next.n = 0;
        for (size_t i = 0; i < cur->n; i++) {
            frag f = cur->v[i];
            if (f.tok >= 0) { if (push_frag(&next, f.off, f.len, f.tok)) goto oom; continue; }
            size_t pos = f.off, end = f.off + f.len;
            const char *m;
            while (pos < end && (m = memmem(text + pos, end - pos, tx, tl))) {
                size_t at = (size_t)(m - text), left = at;
                if (t->attr[id] & TA_LSTRIP)
                    while (left > pos && c_space(text[left - 1])) left--;
                if (left > pos && push_frag(&next, pos, left - pos, -1)) goto oom;
                if (push_frag(&next, at, tl, id)) goto oom;
                pos = at + tl;
                if (t->attr[id] & TA_RSTRIP)
                    while (pos < end && c_space(text[pos])) pos++;
            }
            if (pos < end && push_frag(&next, pos, end - pos, -1)) goto oom;
        }
        fragvec sw = *cur; *cur = next; next = sw;
    }
    free(next.v);
    free(ps);
    return 0;
oom:
    free(next.v);
    free(ps);
    return -1;
}

/* ------------------------------------------------------------------ */
/* 3. SPM                                                               */

static int spm_add(const tokenizer *t, const char *s, sym *sy, int l, int r, heap *h)
{
    if (l < 0 || r < 0) return 0;
    size_t size = sy[l].n + sy[r].n;
    int32_t id = tok_find(t, s + sy[l].off, size);
    if (id < 0) return 0;
    return heap_push(h, (bigram){ -(double)t->scores[id], l, r, size });
}

/* Merges the chained symbols sy[first .. first + n) and appends their ids. */
static int spm_emit(const tokenizer *t, const char *s, sym *sy, int first, int n, heap *h, idvec *out)
{
    if (merge_all(t, s, sy, first, n, h, spm_add)) return -1;
    for (int i = first; i != -1; i = sy[i].next) {
        int32_t id = tok_find(t, s + sy[i].off, sy[i].n);
        if (id >= 0) { if (push_id(out, id)) return -1; continue; }
        /* no token for this character: spell it in bytes */
        for (size_t k = 0; k < sy[i].n; k++) {
            int32_t b = t->byte_tok[(uint8_t)s[sy[i].off + k]];
            if (b < 0) b = t->unk;              /* llama.cpp would throw here */
            if (b >= 0 && push_id(out, b)) return -1;
        }
    }
    return 0;
}

static int is_space_sym(const char *s, const sym *y)
{
    return y->n == 3 && memcmp(s + y->off, "\xe2\x96\x81", 3) == 0;
}

/* s[0..len) is already escaped ("▁" for spaces).
 *
 * Merging the whole text as one sequence costs a heap as long as the text.
 * When the vocabulary has "▁" only at the start of its tokens (checked at
 * load: t->spm_word_chunks), no token can span the start of a word (a "▁"
 * after something that is not "▁"), so every word merges alone with the
 * same result, and the heap stays word-sized. */
static int spm_tokenize(const tokenizer *t, const char *s, size_t len, sym *sy, heap *h, idvec *out)
{
    int n = split_chars(s, len, sy);
    for (int first = 0; first < n; ) {
        int end = first + 1;
        if (t->spm_word_chunks)
            while (end < n && !(is_space_sym(s, &sy[end]) && !is_space_sym(s, &sy[end - 1]))) end++;
        else
            end = n;
        sy[first].prev = -1;
        sy[end - 1].next = -1;
        if (spm_emit(t, s, sy, first, end - first, h, out)) return -1;
        first = end;
    }
    return 0;
}

static int spm_encode(const tokenizer *t, const char *text, const fragvec *fr, idvec *out)
{
    size_t max_len = 0;
    for (size_t i = 0; i < fr->n; i++)
        if (fr->v[i].tok < 0 && fr->v[i].len > max_len) max_len = fr->v[i].len;
    /* every byte may become "▁" (3 bytes), plus the prefix */
    size_t cap = 3 * (max_len + 1);
    char *buf = malloc(cap);
    sym *sy = malloc(cap * sizeof(*sy));
    heap h = { 0 };
    int rc = -1;
    if (!buf || !sy) goto done;

    int prev_special = 1;   /* the text start counts as "after a special token" */
    for (size_t i = 0; i < fr->n; i++) {
        const frag *f = &fr->v[i];
        if (f->tok >= 0) {
            if (push_id(out, f->tok)) goto done;
            prev_special = 1;
            continue;
        }
        size_t n = 0;
        if (t->add_space_prefix && prev_special) { memcpy(buf, "\xe2\x96\x81", 3); n = 3; }
        for (size_t k = 0; k < f->len; k++) {
            char c = text[f->off + k];
            if (c == ' ') { memcpy(buf + n, "\xe2\x96\x81", 3); n += 3; }
            else buf[n++] = c;
        }
        if (spm_tokenize(t, buf, n, sy, &h, out)) goto done;
        prev_special = 0;
    }
    rc = 0;
done:
    free(buf);
    free(sy);
    free(h.v);
    return rc;
}

/* ------------------------------------------------------------------ */
/* 4. BPE                                                               */

static int bpe_add(const tokenizer *t, const char *s, sym *sy, int l, int r, heap *h)
{
    if (l < 0 || r < 0) return 0;
    int32_t rank = tok_merge_rank(t, s + sy[l].off, sy[l].n, s + sy[r].off, sy[r].n);
    if (rank < 0) return 0;
    return heap_push(h, (bigram){ (double)rank, l, r, sy[l].n + sy[r].n });
}

/* One word (already in the byte-level alphabet) -> ids. */
static int bpe_word(const tokenizer *t, const char *w, size_t len, sym *sy, heap *h, idvec *out)
{
    if (t->ignore_merges) {
        int32_t id = tok_find(t, w, len);
        if (id >= 0) return push_id(out, id);
    }
    int n = split_chars(w, len, sy);
    if (merge_all(t, w, sy, 0, n, h, bpe_add)) return -1;
    for (int i = 0; i < n; i++) {
        if (sy[i].n == 0) continue;
        int32_t id = tok_find(t, w + sy[i].off, sy[i].n);
        if (id >= 0) { if (push_id(out, id)) return -1; continue; }
        /* not in the vocabulary: llama.cpp tries each byte of the symbol as
         * a one-byte token and silently drops the ones that are not */
        for (size_t k = 0; k < sy[i].n; k++) {
            int32_t b = t->char_tok[(uint8_t)w[sy[i].off + k]];
            if (b >= 0 && push_id(out, b)) return -1;
        }
    }
    return 0;
}

static int bpe_fragment(const tokenizer *t, const char *text, size_t len, idvec *out)
{
    pt_text pt;
    if (pt_split(t->pre, text, len, &pt)) return -1;
    /* a codepoint is <= 4 UTF-8 bytes, each <= 2 bytes in the alphabet */
    size_t cap = 8 * pt.n + 1;
    char *w = malloc(cap);
    sym *sy = malloc(cap * sizeof(*sy));
    heap h = { 0 };
    int rc = -1;
    if (!w || !sy) goto done;
    size_t start = 0;
    for (size_t p = 0; p < pt.n_pieces; p++) {
        size_t end = pt.ends[p], n = 0;
        for (size_t i = start; i < end; i++) {
            char u8[4];
            /* re-encoded from the codepoint: invalid bytes became U+FFFD */
            size_t ul = utf8_encode(pt.cps[i], u8);
            for (size_t k = 0; k < ul; k++) n += utf8_encode(tok_byte_to_cp((uint8_t)u8[k]), w + n);
        }
        if (bpe_word(t, w, n, sy, &h, out)) goto done;
        start = end;
    }
    rc = 0;
done:
    free(w);
    free(sy);
    free(h.v);
    pt_free(&pt);
    return rc;
}

/* ------------------------------------------------------------------ */
/* 5. entry point                                                       */

int tok_encode(const tokenizer *t, const char *text, size_t len, int add_special,
               int32_t *ids, int max_ids)
{
    if (!t || (!text && len > 0) || (max_ids > 0 && !ids)) return -1;
    /* symbol indexes are int; one id per byte at most, plus BOS/EOS */
    if (len > (size_t)(INT32_MAX / 4)) return -1;
    if (!text) text = "";

    idvec out = { 0 };
    fragvec fr = { 0 };
    int rc = -1;
    if (partition(t, text, len, &fr)) goto done;

    if (add_special && t->add_bos && t->bos >= 0 && push_id(&out, t->bos)) goto done;
    if (t->type == TOK_SPM) {
        if (spm_encode(t, text, &fr, &out)) goto done;
    } else {
        for (size_t i = 0; i < fr.n; i++) {
            const frag *f = &fr.v[i];
            if (f->tok >= 0) { if (push_id(&out, f->tok)) goto done; continue; }
            if (bpe_fragment(t, text + f->off, f->len, &out)) goto done;
        }
    }
    if (add_special && t->add_eos && t->eos >= 0 && push_id(&out, t->eos)) goto done;

    if (out.n > (size_t)INT32_MAX) goto done;
    size_t c = max_ids > 0 ? (out.n < (size_t)max_ids ? out.n : (size_t)max_ids) : 0;
    if (c) memcpy(ids, out.v, c * sizeof(*ids));
    rc = (int)out.n;
done:
    free(out.v);
    free(fr.v);
    return rc;
}

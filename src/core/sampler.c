/* sampler.c - next-token choice from logits: logit bias, repetition
 * penalties, greedy, min-p, temperature, top-k, top-p. The sampler owns its
 * RNG (xorshift64*), its logit-bias list and the window of recent ids the
 * penalties look at. The defaults live here only
 * (sparq_sampler_default_params); `sparq run` and the server start from
 * them. */
#include "sparq.h"
#include "core/grammar.h"
#include "core/model.h"
#include "util/err.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

typedef struct { float p; int32_t id; } prob_id;

struct sparq_sampler {
    sparq_sampler_params p;
    int      n_vocab;
    uint64_t rng, seed;
    prob_id *buf;            /* [n_vocab] */
    float   *work;           /* [n_vocab] biased and penalised logits, or
                                NULL while neither stage is on            */
    int32_t *bias_id;        /* [n_bias] logit bias: bias_val[i] is added  */
    float   *bias_val;       /*   to the logit of bias_id[i]               */
    int      n_bias;
    int32_t *hist;           /* ring of the last `hist_cap` accepted ids   */
    int      hist_cap, hist_n, hist_at;
    int     *count;          /* [n_vocab] scratch: occurrences in window   */
    /* grammar (sparq_sampler_set_grammar): the matcher and the model's
     * token pieces it tests; first[] caches the bytes that may come next
     * for the current step (first_ok) */
    gmatcher *gm;
    const sparq_model *gmodel;
    uint8_t   first[256];
    int       first_ok, n_checked;
};

sparq_sampler_params sparq_sampler_default_params(void)
{
    /* llama.cpp's defaults, so a user moving over gets the same draws'
     * distribution; the seed is fresh per run unless fixed */
    sparq_sampler_params p = { 0.8f, 40, 0.95f, SPARQ_SEED_RANDOM, 0.05f, 1.0f, 0.0f, 0.0f, 64 };
    return p;
}

int sparq_sampler_check(const sparq_sampler_params *p, char *err, size_t err_size)
{
    if (!(p->temp >= 0.0f) || isinf(p->temp))
        return err_set(err, err_size, "temperature %g must be a finite number >= 0", (double)p->temp);
    if (p->top_k < 0) return err_set(err, err_size, "top-k %d must be >= 0 (0 = off)", p->top_k);
    if (!(p->top_p >= 0.0f && p->top_p <= 1.0f))
        return err_set(err, err_size, "top-p %g must be in [0, 1] (1 = off)", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return err_set(err, err_size, "min-p %g must be in [0, 1] (0 = off)", (double)p->min_p);
    if (!(p->repeat_penalty >= 0.0f) || isinf(p->repeat_penalty))
        return err_set(err, err_size, "repeat penalty %g must be a finite number > 0 (1 = off)",
                       (double)p->repeat_penalty);
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return err_set(err, err_size, "presence and frequency penalties must be finite numbers");
    if (p->penalty_last_n < -1)
        return err_set(err, err_size, "penalty window %d must be >= -1 (-1 = all, 0 = off)", p->penalty_last_n);
    return 0;
}

static uint64_t fresh_seed(void)
{
    uint64_t s = 0;
    if (getrandom(&s, sizeof s, GRND_NONBLOCK) != (ssize_t)sizeof s) {
        struct timespec ts; /* no entropy source: time and pid still differ per run */
        clock_gettime(CLOCK_REALTIME, &ts);
        s = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 32);
    }
    return s == SPARQ_SEED_RANDOM ? 1 : s;
}

static int penalties_on(const sparq_sampler_params *p)
{
    return p->penalty_last_n != 0 &&
           ((p->repeat_penalty != 0.0f && p->repeat_penalty != 1.0f) || p->presence_penalty != 0.0f ||
            p->frequency_penalty != 0.0f);
}

sparq_sampler *sparq_sampler_create(const sparq_sampler_params *p, int n_vocab)
{
    char err[128];
    if (n_vocab <= 0 || sparq_sampler_check(p, err, sizeof err)) return NULL;
    sparq_sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->buf = malloc((size_t)n_vocab * sizeof *s->buf);
    int ok = s->buf != NULL;
    if (ok && penalties_on(p)) {
        /* -1 = every accepted id: the window grows as needed */
        s->hist_cap = p->penalty_last_n > 0 ? p->penalty_last_n : 256;
        s->work = malloc((size_t)n_vocab * sizeof *s->work);
        s->count = calloc((size_t)n_vocab, sizeof *s->count);
        s->hist = malloc((size_t)s->hist_cap * sizeof *s->hist);
        ok = s->work && s->count && s->hist;
    }
    if (!ok) {
        sparq_sampler_free(s);
        return NULL;
    }
    s->seed = p->seed == SPARQ_SEED_RANDOM ? fresh_seed() : p->seed;
    s->rng = s->seed ? s->seed : 0x9E3779B97F4A7C15ull; /* xorshift must not start at 0 */
    return s;
}

void sparq_sampler_free(sparq_sampler *s)
{
    if (!s) return;
    free(s->buf);
    free(s->work);
    free(s->bias_id);
    free(s->bias_val);
    free(s->count);
    free(s->hist);
    gm_free(s->gm);
    free(s);
}

uint64_t sparq_sampler_seed(const sparq_sampler *s) { return s->seed; }

void sparq_sampler_accept(sparq_sampler *s, int32_t id)
{
    if (!s->hist) return;
    if (s->p.penalty_last_n < 0 && s->hist_n == s->hist_cap) { /* unbounded: grow, else forget */
        int32_t *bigger = s->hist_cap < (1 << 28) ? realloc(s->hist, (size_t)s->hist_cap * 2 * sizeof *bigger) : NULL;
        if (bigger) {
            /* unroll the ring so the oldest id is at 0 */
            memmove(bigger + s->hist_cap, bigger, (size_t)s->hist_at * sizeof *bigger);
            memmove(bigger, bigger + s->hist_at, (size_t)s->hist_cap * sizeof *bigger);
            s->hist = bigger;
            s->hist_at = s->hist_cap;
            s->hist_cap *= 2;
        }
    }
    s->hist[s->hist_at] = id;
    s->hist_at = (s->hist_at + 1) % s->hist_cap;
    if (s->hist_n < s->hist_cap) s->hist_n++;
}

static float rng_uniform(uint64_t *state) /* [0, 1) */
{
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return (float)((x * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

static int by_prob_desc(const void *a, const void *b)
{
    const prob_id *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id - y->id;
}

/* The first id of the largest logit (ties go to the lowest id; a NaN never
 * wins, except at id 0, which then stays: what the one-line loop
 * `if (x[i] > x[best]) best = i` gives). Sixteen running maxima instead of
 * that loop: its compare and select made a chain through every element,
 * 0.45 ms at a 128k vocabulary alone, and sparq_sample was 2.9% of the
 * server's samples serving llama-3.2-1b to 16 greedy clients
 * (bench-results/greedy-argmax-20261126.txt); 6-9 us here: these lanes
 * vectorise, and the second pass stops at the winner. */
int32_t logits_argmax(const float *logits, int n)
{
    enum { LANES = 16 };
    if (n < 2 * LANES || logits[0] != logits[0]) {
        int32_t best = 0;
        for (int i = 1; i < n; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    float lane[LANES];
    for (int l = 0; l < LANES; l++) lane[l] = logits[0];
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) lane[l] = logits[i + l] > lane[l] ? logits[i + l] : lane[l];
    float mx = lane[0];
    for (int l = 1; l < LANES; l++) mx = lane[l] > mx ? lane[l] : mx;
    for (; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    for (i = 0; i < n; i++)
        if (logits[i] == mx) break;
    return i < n ? i : 0;
}

int sparq_sampler_set_logit_bias(sparq_sampler *s, const int32_t *ids, const float *bias, int n, char *err,
                                 size_t err_size)
{
    if (n < 0) return err_set(err, err_size, "logit bias count %d must be >= 0", n);
    if (n > 0 && (!ids || !bias)) return err_set(err, err_size, "logit bias: %d entries but no ids or biases", n);
    int n_ban = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= s->n_vocab)
            return err_set(err, err_size, "logit bias: token id %d is outside the vocabulary [0, %d)", (int)ids[i],
                           s->n_vocab);
        if (!isfinite(bias[i]) && bias[i] != -INFINITY)
            return err_set(err, err_size, "logit bias of token %d: %g must be a finite number or -inf (a ban)",
                           (int)ids[i], (double)bias[i]);
        n_ban += bias[i] == -INFINITY;
    }
    if (n_ban > 0 && n_ban >= s->n_vocab) { /* maybe every id banned: nothing could be drawn */
        unsigned char *seen = calloc((size_t)s->n_vocab, 1);
        if (!seen) return err_set(err, err_size, "out of memory");
        int distinct = 0;
        for (int i = 0; i < n; i++)
            if (bias[i] == -INFINITY && !seen[ids[i]]) {
                seen[ids[i]] = 1;
                distinct++;
            }
        free(seen);
        if (distinct == s->n_vocab)
            return err_set(err, err_size, "logit bias bans every one of the %d token ids", s->n_vocab);
    }
    /* the new list is built whole before the old one goes: on failure the
     * sampler is unchanged */
    int32_t *nid = NULL;
    float *nval = NULL, *work = s->work;
    if (n > 0) {
        nid = malloc((size_t)n * sizeof *nid);
        nval = malloc((size_t)n * sizeof *nval);
        if (!work) work = malloc((size_t)s->n_vocab * sizeof *work);
        if (!nid || !nval || !work) {
            free(nid);
            free(nval);
            if (work != s->work) free(work);
            return err_set(err, err_size, "out of memory for %d logit biases", n);
        }
        memcpy(nid, ids, (size_t)n * sizeof *nid);
        memcpy(nval, bias, (size_t)n * sizeof *nval);
    }
    free(s->bias_id);
    free(s->bias_val);
    s->bias_id = nid;
    s->bias_val = nval;
    s->n_bias = n;
    s->work = work;
    return 0;
}

/* The logits every later stage sees: the caller's, plus the logit bias
 * (each entry in turn, so repeated ids add up as in llama.cpp), then
 * llama.cpp's penalties: each id in the window is divided (positive
 * logit) or multiplied (negative) by the repeat penalty once, then lowered
 * by count * frequency + presence. Returns logits itself when neither
 * stage acts, else s->work. A finite bias or a penalty never makes a
 * logit infinite (clamped to +-FLT_MAX), so -inf always means a ban and
 * the ban-all check of sparq_sampler_set_logit_bias is the whole story. */
static float clamp_overflow(float v, float was)
{
    return isinf(v) && isfinite(was) ? copysignf(FLT_MAX, v) : v;
}

static const float *prepare_logits(sparq_sampler *s, const float *logits)
{
    const int pen = s->hist && s->hist_n > 0;
    if (!pen && s->n_bias == 0) return logits;
    float *w = s->work;
    memcpy(w, logits, (size_t)s->n_vocab * sizeof *w);
    for (int i = 0; i < s->n_bias; i++) {
        const int32_t id = s->bias_id[i];
        const float b = s->bias_val[i];
        w[id] = b == -INFINITY ? -INFINITY : clamp_overflow(w[id] + b, w[id]);
    }
    if (!pen) return w;
    for (int i = 0; i < s->hist_n; i++) {
        int32_t id = s->hist[i];
        if (id >= 0 && id < s->n_vocab) s->count[id]++;
    }
    const float rp = s->p.repeat_penalty == 0.0f ? 1.0f : s->p.repeat_penalty;
    for (int i = 0; i < s->hist_n; i++) {
        int32_t id = s->hist[i];
        if (id < 0 || id >= s->n_vocab || s->count[id] == 0) continue;
        const float was = w[id]; /* -inf (banned) stays -inf */
        float l = was <= 0.0f ? was * rp : was / rp;
        l -= (float)s->count[id] * s->p.frequency_penalty + s->p.presence_penalty;
        w[id] = clamp_overflow(l, was);
        s->count[id] = 0; /* once per distinct id; also leaves count zeroed */
    }
    return w;
}

static int32_t draw(sparq_sampler *s, int m);
static int32_t sample_grammar(sparq_sampler *s, const float *logits);

int32_t sparq_sample(sparq_sampler *s, const float *logits_in)
{
    if (s->gm) return sample_grammar(s, logits_in);
    const int n = s->n_vocab;
    const float *logits = prepare_logits(s, logits_in);
    int32_t chosen;
    if (s->p.temp <= 0.0f) {
        chosen = logits_argmax(logits, n);
        sparq_sampler_accept(s, chosen);
        return chosen;
    }
    const float mx = logits[logits_argmax(logits, n)];
    /* min-p on the untempered distribution: p_i >= min_p * p_max */
    const float floor_logit = s->p.min_p > 0.0f ? mx + logf(s->p.min_p) : -INFINITY;
    float sum = 0.0f;
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (logits[i] < floor_logit || logits[i] == -INFINITY) continue; /* -inf: banned by the bias */
        s->buf[m].id = i;
        s->buf[m].p = expf((logits[i] - mx) / s->p.temp);
        sum += s->buf[m].p;
        m++;
    }
    for (int i = 0; i < m; i++) s->buf[i].p /= sum;
    chosen = draw(s, m);
    sparq_sampler_accept(s, chosen);
    return chosen;
}

/* top-k, top-p and the draw over buf[0..m) (probabilities summing to 1) */
static int32_t draw(sparq_sampler *s, int m)
{
    /* Sorting the whole vocabulary costs ~1 ms at 128k: negligible next to
     * a forward pass, and it keeps top-k and top-p one simple code path. */
    qsort(s->buf, (size_t)m, sizeof *s->buf, by_prob_desc);
    int keep = m;
    if (s->p.top_k > 0 && s->p.top_k < keep) keep = s->p.top_k;
    if (s->p.top_p > 0.0f && s->p.top_p < 1.0f) {
        float cum = 0.0f;
        for (int i = 0; i < keep; i++) {
            cum += s->buf[i].p;
            if (cum >= s->p.top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    float total = 0.0f;
    for (int i = 0; i < keep; i++) total += s->buf[i].p;
    float r = rng_uniform(&s->rng) * total, acc = 0.0f;
    int at = -1;
    for (int i = 0; i < keep; i++) {
        acc += s->buf[i].p;
        if (r < acc) {
            at = i;
            break;
        }
    }
    /* r rounded up to total: the least likely id that has any probability
     * (a large negative bias can underflow an id's p to 0; it must stay
     * undrawable); buf[0] is the maximum, p = 1 / sum > 0 */
    if (at < 0)
        for (at = keep - 1; at > 0 && !(s->buf[at].p > 0.0f); at--) {}
    return s->buf[at].id;
}

/* ---- grammar-constrained draws -------------------------------------- */

int sparq_sampler_set_grammar(sparq_sampler *s, const sparq_model *m, const sparq_grammar *g, char *err,
                              size_t err_size)
{
    if (!g) {
        gm_free(s->gm);
        s->gm = NULL;
        s->gmodel = NULL;
        return 0;
    }
    if (!m || sparq_model_n_vocab(m) != s->n_vocab)
        return err_set(err, err_size, "grammar: the model's vocabulary is not the sampler's (%d ids)", s->n_vocab);
    gmatcher *gm = gm_create(g);
    if (!gm) return err_set(err, err_size, "grammar: out of memory");
    gm_free(s->gm);
    s->gm = gm;
    s->gmodel = m;
    return 0;
}

int sparq_sampler_grammar_done(const sparq_sampler *s) { return s->gm && gm_complete(s->gm); }

/* May token id come next? End-of-generation tokens: only when the grammar
 * is complete; tokens that print nothing (control tokens): never. After a
 * few checks in one step the first-byte table pays for itself: most
 * tokens are then refused on their first byte. */
static int token_allowed(sparq_sampler *s, int32_t id)
{
    const sparq_model *m = s->gmodel;
    if (m->piece_eog[id]) return gm_complete(s->gm);
    const uint32_t a = m->piece_off[id], b = m->piece_off[id + 1];
    if (a == b) return 0;
    const uint8_t *bytes = (const uint8_t *)m->piece_blob + a;
    if (!s->first_ok && ++s->n_checked > 16) {
        gm_first_bytes(s->gm, s->first);
        s->first_ok = 1;
    }
    if (s->first_ok) {
        if (!s->first[bytes[0]]) return 0;
        if (b - a == 1) return 1;
    }
    return gm_allows(s->gm, bytes, b - a);
}

static int by_logit_desc(const void *a, const void *b) { return by_prob_desc(a, b); }

/* The grammar's answer when it allows nothing (it cannot end yet no token
 * extends it, e.g. the vocabulary lacks a byte it needs): end the
 * generation rather than emit text outside it. */
static int32_t dead_end(sparq_sampler *s)
{
    const sparq_model *m = s->gmodel;
    int eos = sparq_token_eos(m);
    if (eos >= 0 && eos < s->n_vocab) return eos;
    for (int i = 0; i < s->n_vocab; i++)
        if (m->piece_eog[i]) return i;
    return 0;
}

static int32_t take(sparq_sampler *s, int32_t id)
{
    const sparq_model *m = s->gmodel;
    if (!m->piece_eog[id])
        gm_accept(s->gm, (const uint8_t *)m->piece_blob + m->piece_off[id], m->piece_off[id + 1] - m->piece_off[id]);
    sparq_sampler_accept(s, id);
    return id;
}

/* The same stages as sparq_sample over the allowed tokens only: the
 * candidates sorted by logit, checked from the top; greedy stops at the
 * first allowed, sampling keeps the allowed ones down to the min-p floor
 * (relative to the best allowed token) and at most top-k of them, over
 * which top-p then renormalises (llama.cpp's chain does so too; the free
 * path normalises over all min-p survivors): checking every allowed token
 * only to normalise would cost ~20 ms a draw at a 128k vocabulary. With
 * neither min-p nor top-k every token is checked. */
static int32_t sample_grammar(sparq_sampler *s, const float *logits_in)
{
    const int n = s->n_vocab;
    const float *logits = prepare_logits(s, logits_in);
    s->first_ok = 0;
    s->n_checked = 0;
    int32_t best = logits_argmax(logits, n);
    if (logits[best] == -INFINITY) return take(s, dead_end(s));
    if (s->p.temp <= 0.0f && token_allowed(s, best)) return take(s, best);
    const float gmax = logits[best];
    const int cap = s->p.top_k > 0 ? s->p.top_k : n;
    /* Sorting all of a 128k vocabulary costs milliseconds: sort only the
     * logits within delta of the maximum, and widen delta while that band
     * holds too few allowed tokens to decide the draw. */
    for (float delta = 4.0f;; delta *= 4.0f) {
        const int all = !(delta < 1e6f);
        const float band = all ? -INFINITY : gmax - delta;
        int m = 0, more = 0;
        for (int i = 0; i < n; i++) {
            if (logits[i] == -INFINITY) continue;
            if (logits[i] >= band) {
                s->buf[m].id = i;
                s->buf[m].p = logits[i];
                m++;
            } else more = 1;
        }
        qsort(s->buf, (size_t)m, sizeof *s->buf, by_logit_desc);
        int first = 0;
        while (first < m && !token_allowed(s, s->buf[first].id)) first++;
        if (first == m) {
            if (more) continue;
            return take(s, dead_end(s));
        }
        if (s->p.temp <= 0.0f) return take(s, s->buf[first].id);
        const float mx = s->buf[first].p;
        const float floor_logit = s->p.min_p > 0.0f ? mx + logf(s->p.min_p) : -INFINITY;
        int k = 0, i = first;
        float sum = 0.0f;
        for (; i < m && k < cap && s->buf[i].p >= floor_logit; i++) {
            if (i > first && !token_allowed(s, s->buf[i].id)) continue;
            s->buf[k].id = s->buf[i].id;
            s->buf[k].p = expf((s->buf[i].p - mx) / s->p.temp);
            sum += s->buf[k].p;
            k++;
        }
        /* the band ran out before top-k or the floor did: widen it */
        if (i == m && more && k < cap && !(floor_logit > band)) continue;
        for (int j = 0; j < k; j++) s->buf[j].p /= sum;
        return take(s, draw(s, k));
    }
}

/* attn_adaptive.c - entropy of a head's approximate scores and the per-head
 * allotment of a group's k (contract in attn_adaptive.h). */
#include "attn/attn_adaptive.h"
#include "attn/attn.h"

#include <math.h>

double attn_scores_entropy(const float *e, const float *scale, int64_t n)
{
    double h = 0;
    for (int64_t b0 = 0; b0 < n; b0 += ATTN_EXP_BLOCK) {
        const double sc = scale[b0 / ATTN_EXP_BLOCK];
        if (!(sc > 0)) continue; /* the whole block's probabilities are 0 */
        const double lsc = log(sc);
        const int64_t b1 = n - b0 < ATTN_EXP_BLOCK ? n : b0 + ATTN_EXP_BLOCK;
        double s = 0;
        for (int64_t i = b0; i < b1; i++)
            if (e[i] > 0) s += e[i] * (lsc + log((double)e[i]));
        h -= sc * s;
    }
    return h > 0 ? h : 0; /* rounding can leave -0.0 for a one-hot row */
}

static double share_sum(const double *H, int g, double lambda, double lo, double hi)
{
    double s = 0;
    for (int h = 0; h < g; h++) {
        const double x = lambda * H[h];
        s += x < lo ? lo : x > hi ? hi : x;
    }
    return s;
}

int attn_adaptive_allot(const double *H, int g, int64_t total, int64_t lo, int64_t hi, int64_t *k, double *x)
{
    if (g < 1 || lo < 1 || lo > hi || total < (int64_t)g * lo || total > (int64_t)g * hi) return -1;
    int n0 = 0;
    double hmin = INFINITY;
    for (int h = 0; h < g; h++) {
        if (!(H[h] >= 0) || !isfinite(H[h])) return -1;
        if (H[h] == 0) n0++;
        else if (H[h] < hmin) hmin = H[h];
    }
    const double T = (double)total, L = (double)lo, U = (double)hi;
    if ((double)n0 * L + (double)(g - n0) * U <= T) {
        /* the heads that have entropy cannot take more than hi: the rest
         * goes to the heads at zero, equally */
        const double rest = n0 ? (T - (double)(g - n0) * U) / n0 : 0;
        for (int h = 0; h < g; h++) x[h] = H[h] > 0 ? U : rest;
    } else {
        double a = 0, b = U / hmin; /* share_sum(a) <= T < share_sum(b) */
        for (int it = 0; it < 200 && a < b; it++) {
            const double m = 0.5 * (a + b);
            if (m <= a || m >= b) break;
            if (share_sum(H, g, m, L, U) <= T) a = m;
            else b = m;
        }
        for (int h = 0; h < g; h++) {
            const double v = a * H[h];
            x[h] = v < L ? L : v > U ? U : v;
        }
    }
    /* largest remainders; the sum of the floors is within g of total */
    int64_t sum = 0;
    for (int h = 0; h < g; h++) {
        double f = floor(x[h]);
        if (f < L) f = L;
        if (f > U) f = U;
        k[h] = (int64_t)f;
        x[h] -= f; /* the fractional part from here on */
        sum += k[h];
    }
    while (sum < total) { /* one position to the largest remainder below hi */
        int best = -1;
        for (int h = 0; h < g; h++)
            if (k[h] < hi && (best < 0 || x[h] > x[best])) best = h;
        if (best < 0) return -1; /* cannot happen: total <= g*hi */
        k[best]++;
        x[best] = -1; /* once each before any head takes a second */
        sum++;
    }
    while (sum > total) { /* rounding surplus (x above its real share): undo the smallest remainder */
        int best = -1;
        for (int h = g - 1; h >= 0; h--)
            if (k[h] > lo && (best < 0 || x[h] < x[best])) best = h;
        if (best < 0) return -1;
        k[best]--;
        x[best] = 2;
        sum--;
    }
    return 0;
}

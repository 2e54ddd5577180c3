/* test_kvcache.c - the KV cache layout: rows, K^T copy and V sums agree
 * with what was written, for both element types. */
#include "test.h"
#include "core/kvcache.h"
#include "tensor/quant.h"

static float value(int layer, int head, int64_t pos, int j, int is_v)
{
    return (float)((layer * 7 + head * 3 + pos * 11 + j * 5 + is_v * 13) % 17) / 4.0f - 2.0f;
}

static float load(const void *base, int elem, size_t i)
{
    return elem == KV_F16 ? fp16_to_fp32(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

static void check_type(int elem)
{
    kv_cache c;
    char err[256];
    const int L = 2, H = 3, d = 8;
    const int64_t cap = 100;
    CHECK(kv_create(&c, L, H, d, cap, elem, 1, 1, err, sizeof err) == 0, "%s", err);
    float k[3 * 8], v[3 * 8];
    const int64_t n = 37;
    for (int64_t p = 0; p < n; p++) {
        for (int l = 0; l < L; l++) {
            for (int h = 0; h < H; h++)
                for (int j = 0; j < d; j++) {
                    k[h * d + j] = value(l, h, p, j, 0);
                    v[h * d + j] = value(l, h, p, j, 1);
                }
            kv_write(&c, l, p, k, v);
        }
        c.n++;
    }
    int bad_rows = 0, bad_kt = 0, bad_sum = 0;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++) {
            attn_kv_view view;
            kv_view(&c, l, h, n, &view);
            CHECK(view.S == n && view.d == d && view.elem == elem && view.kt_stride == cap, "view fields");
            for (int j = 0; j < d; j++) {
                double sum = 0;
                for (int64_t p = 0; p < n; p++) {
                    /* the test values are multiples of 1/4: exact in f16 */
                    bad_rows += load(view.K, elem, (size_t)p * d + j) != value(l, h, p, j, 0);
                    bad_rows += load(view.V, elem, (size_t)p * d + j) != value(l, h, p, j, 1);
                    bad_kt += load(view.KT, elem, (size_t)j * cap + p) != value(l, h, p, j, 0);
                    sum += value(l, h, p, j, 1);
                }
                bad_sum += fabs(view.v_sum[j] - sum) > 1e-4;
            }
        }
    CHECK(bad_rows == 0, "%d row values differ", bad_rows);
    CHECK(bad_kt == 0, "%d K^T values differ", bad_kt);
    CHECK(bad_sum == 0, "%d V sums differ", bad_sum);
    kv_reset(&c);
    CHECK(c.n == 0 && c.v_sum[0] == 0.0f, "reset");
    kv_free(&c);
    kv_free(&c); /* idempotent */
}

int main(void)
{
    check_type(KV_F32);
    check_type(KV_F16);
    kv_cache c;
    char err[256];
    CHECK(kv_create(&c, 1, 1, 8, 0, KV_F16, 0, 0, err, sizeof err) != 0, "zero capacity rejected");
    CHECK(kv_create(&c, 32, 8, 128, INT64_C(1) << 40, KV_F16, 0, 0, err, sizeof err) != 0 &&
              strstr(err, "too large"), "absurd capacity rejected: %s", err);
    /* a large reservation costs address space only */
    CHECK(kv_create(&c, 16, 8, 64, 1 << 20, KV_F16, 1, 1, err, sizeof err) == 0, "1M-token reserve: %s", err);
    kv_free(&c);
    return test_summary("test_kvcache");
}

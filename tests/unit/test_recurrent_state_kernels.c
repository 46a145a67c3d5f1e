/* The state-carrying CPU references of Gated DeltaNet (causal_conv1d_silu_state_cpu, gated_delta_rule_forward_state
 * _cpu): a sequence run in chunks (of 1 token, of fewer tokens than the conv history, of more) with the state carried
 * between them gives the bits of one packed run over the whole sequence, and leaves the state a whole run leaves. */
#include <stdint.h>

#include "causal_conv1d.h"
#include "gated_delta_rule.h"
#include "rng.h"
#include "tests/test.h"

static void fill(float *x, size_t n, uint64_t seed, float lo, float hi)
{
    rng r;
    rng_seed(&r, seed, 0, 0, 0);
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * (float)rng_below(&r, 1u << 20) / (float)(1u << 20);
}

static const int chunks[] = {1, 2, 5, 1, 3}; /* 12 tokens */
enum { T = 12, NCH = 5 };

TEST(conv_in_chunks_equals_packed)
{
    const int C = 5, K = 4, ld = 7; /* row stride wider than C */
    float x[T * 7], w[5 * 4], ref[T * 7], y[T * 7], state[3 * 5] = {0};
    fill(x, sizeof x / sizeof x[0], 1, -2, 2);
    fill(w, sizeof w / sizeof w[0], 2, -1, 1);
    int32_t cu[2] = {0, T};
    causal_conv1d_silu_cpu(ref, ld, x, ld, w, C, K, cu, 1);
    int t = 0;
    for (int i = 0; i < NCH; t += chunks[i++])
        causal_conv1d_silu_state_cpu(y + (size_t)t * ld, ld, x + (size_t)t * ld, ld, w, C, K, chunks[i], state);
    for (int r = 0; r < T; r++) EXPECT(memcmp(y + r * ld, ref + r * ld, sizeof(float) * C) == 0);
    /* the state holds the last K-1 input rows */
    for (int r = 0; r < K - 1; r++) EXPECT(memcmp(state + r * C, x + (T - (K - 1) + r) * ld, sizeof(float) * C) == 0);
    /* NULL state: a sequence start, as the packed form's */
    memset(y, 0, sizeof y);
    causal_conv1d_silu_state_cpu(y, ld, x, ld, w, C, K, T, NULL);
    for (int r = 0; r < T; r++) EXPECT(memcmp(y + r * ld, ref + r * ld, sizeof(float) * C) == 0);
}

TEST(delta_rule_in_chunks_equals_packed)
{
    const int hk = 2, hv = 4, dk = 3, dv = 2, qk = hk * dk, vd = hv * dv;
    float q[T * 6], k[T * 6], v[T * 8], g[T * 4], b[T * 4], ref[T * 8], out[T * 8], S[4 * 3 * 2] = {0};
    fill(q, sizeof q / sizeof q[0], 3, -0.5f, 0.5f);
    fill(k, sizeof k / sizeof k[0], 4, -0.5f, 0.5f);
    fill(v, sizeof v / sizeof v[0], 5, -1, 1);
    fill(g, sizeof g / sizeof g[0], 6, -1, 0);
    fill(b, sizeof b / sizeof b[0], 7, 0, 1);
    /* two packed sequences: [0, 5) and [5, T); the state run of the second starts from zero */
    int32_t cu[3] = {0, 5, T};
    gated_delta_rule_forward_cpu(ref, vd, q, qk, k, qk, v, vd, g, hv, b, hv, cu, 2, hk, hv, dk, dv);
    gated_delta_rule_forward_state_cpu(out + 5 * vd, vd, q + 5 * qk, qk, k + 5 * qk, qk, v + 5 * vd, vd, g + 5 * hv,
                                       hv, b + 5 * hv, hv, T - 5, hk, hv, dk, dv, S);
    EXPECT(memcmp(out + 5 * vd, ref + 5 * vd, sizeof(float) * (T - 5) * vd) == 0);
    /* one sequence in chunks, the state carried */
    int32_t cu1[2] = {0, T};
    gated_delta_rule_forward_cpu(ref, vd, q, qk, k, qk, v, vd, g, hv, b, hv, cu1, 1, hk, hv, dk, dv);
    memset(S, 0, sizeof S);
    int t = 0;
    for (int i = 0; i < NCH; t += chunks[i++])
        gated_delta_rule_forward_state_cpu(out + t * vd, vd, q + t * qk, qk, k + t * qk, qk, v + t * vd, vd,
                                           g + t * hv, hv, b + t * hv, hv, chunks[i], hk, hv, dk, dv, S);
    EXPECT(memcmp(out, ref, sizeof(float) * T * vd) == 0);
    /* the state after the whole run: the next token's output from it equals a packed run over T+1 tokens */
    float q1[(T + 1) * 6], k1[(T + 1) * 6], v1[(T + 1) * 8], g1[(T + 1) * 4], b1[(T + 1) * 4], ref1[(T + 1) * 8];
    memcpy(q1, q, sizeof q), memcpy(k1, k, sizeof k), memcpy(v1, v, sizeof v), memcpy(g1, g, sizeof g);
    memcpy(b1, b, sizeof b);
    fill(q1 + T * qk, qk, 8, -0.5f, 0.5f), fill(k1 + T * qk, qk, 9, -0.5f, 0.5f), fill(v1 + T * vd, vd, 10, -1, 1);
    fill(g1 + T * hv, hv, 11, -1, 0), fill(b1 + T * hv, hv, 12, 0, 1);
    int32_t cu2[2] = {0, T + 1};
    gated_delta_rule_forward_cpu(ref1, vd, q1, qk, k1, qk, v1, vd, g1, hv, b1, hv, cu2, 1, hk, hv, dk, dv);
    gated_delta_rule_forward_state_cpu(out, vd, q1 + T * qk, qk, k1 + T * qk, qk, v1 + T * vd, vd, g1 + T * hv, hv,
                                       b1 + T * hv, hv, 1, hk, hv, dk, dv, S);
    EXPECT(memcmp(out, ref1 + T * vd, sizeof(float) * vd) == 0);
}

TEST_MAIN

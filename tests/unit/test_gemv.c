/* test_gemv: the CPU reference of the few-row linear layer (kernels/gemv.h) against matmul_forward_cpu (OpenBLAS):
 * plain, with a residual from another buffer, and in place (c == y), with row strides wider than the rows. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gemv.h"
#include "matmul.h"
#include "tests/test.h"

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

TEST(gemv_cpu_matches_matmul_cpu_plain_residual_and_in_place)
{
    enum { M = 5, N = 37, K = 72, LDX = 80, LDY = 41 };
    uint64_t s = 7;
    float x[M * LDX], w[N * K], c[M * LDY], y[M * LDY], ref[M * LDY];
    for (int i = 0; i < M * LDX; i++) x[i] = frand(&s);
    for (int i = 0; i < N * K; i++) w[i] = frand(&s);
    for (int i = 0; i < M * LDY; i++) c[i] = frand(&s);
    double worst = 0;
    /* plain: y = x wᵀ; the columns past N are left alone */
    for (int i = 0; i < M * LDY; i++) y[i] = 123.0f, ref[i] = 123.0f;
    gemv_forward_cpu(y, LDY, NULL, 0, 0.0f, x, LDX, w, M, N, K);
    matmul_forward_cpu(ref, LDY, x, LDX, w, M, N, K, 0);
    for (int i = 0; i < M * LDY; i++) worst = fmax(worst, fabs(y[i] - ref[i]));
    /* residual from c into y, and in place (c == y): matmul_forward_cpu's accumulate */
    memcpy(ref, c, sizeof c);
    matmul_forward_cpu(ref, LDY, x, LDX, w, M, N, K, 1);
    float y2[M * LDY];
    memcpy(y2, c, sizeof c);
    for (int i = 0; i < M * LDY; i++) y[i] = 123.0f;
    gemv_forward_cpu(y, LDY, c, LDY, 1.0f, x, LDX, w, M, N, K);
    gemv_forward_cpu(y2, LDY, y2, LDY, 1.0f, x, LDX, w, M, N, K);
    for (int r = 0; r < M; r++)
        for (int j = 0; j < N; j++) {
            worst = fmax(worst, fabs(y[r * LDY + j] - ref[r * LDY + j]));
            worst = fmax(worst, fabs(y2[r * LDY + j] - ref[r * LDY + j]));
        }
    EXPECT(worst < 1e-4);
    for (int r = 0; r < M; r++) /* the padding columns of y were not written */
        for (int j = N; j < LDY; j++) EXPECT(y[r * LDY + j] == 123.0f);
}

TEST_MAIN

/* logits_mask on the GPU against its CPU reference, then argmax_rows over the masked rows against the CPU's (what
 * `dflash generate --backend cuda --suppress` runs): rows whose maximum is a suppressed id (so the argmax must move
 * to the best id left), a suppressed id listed twice, ids at both ends of the vocabulary, rows not masked (n
 * smaller than the buffer). The masked values must be exactly -inf and every other value unchanged.
 * Prints "ok <case> ..." / "FAIL <case> ..."; exit status 0 only when every case passed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "argmax.h"
#include "cuda_check.h"
#include "gpu_test.h"
#include "logits_mask.h"
#include "util.h"

int main(void)
{
    CHECK_CUDA(cudaSetDevice(0));
    const int rows = 9, n = 8, V = 151936, ld = V + 64, nids = 5;
    const int32_t ids[5] = {0, 151935, 77, 4242, 77};
    float *f = xmalloc(sizeof *f * (size_t)rows * ld);
    uint16_t *h = rnd_bf16((size_t)rows * ld, 4.0, f);
    for (int r = 0; r < rows; r++) { /* the maximum on a suppressed id, the runner-up on a kept one */
        size_t o = (size_t)r * ld;
        h[o + (size_t)ids[r % 4]] = f32_to_bf16(9.0f), f[o + (size_t)ids[r % 4]] = 9.0f;
        h[o + 1000 + (size_t)r] = f32_to_bf16(8.0f), f[o + 1000 + (size_t)r] = 8.0f;
    }
    uint16_t *d = dev_upload(h, sizeof *h * (size_t)rows * ld);
    int32_t *d_ids = dev_upload(ids, sizeof ids), *d_out = dev_upload(NULL, sizeof(int32_t) * (size_t)rows);
    logits_mask_rows_cpu(f, ld, n, ids, nids);
    logits_mask_rows_cuda(d, ld, n, d_ids, nids, NULL);
    uint16_t *got = dev_get(d, sizeof *got * (size_t)rows * ld);
    size_t wrong = 0;
    for (size_t i = 0; i < (size_t)rows * ld; i++) {
        float g = bf16_to_f32(got[i]);
        wrong += isinf(f[i]) ? !(isinf(g) && g < 0) : got[i] != h[i];
    }
    printf("%s logits_mask %d of %d rows, %d ids (one twice, 0 and V-1), V=%d ld=%d: %zu values differ from the CPU's\n",
           wrong ? "FAIL" : "ok", n, rows, nids, V, ld, wrong);
    if (wrong) failures++;
    int32_t ref[9], out[9];
    argmax_rows_cpu(ref, f, ld, n, V);
    argmax_rows_cuda(d_out, d, ld, n, V, NULL);
    CHECK_CUDA(cudaMemcpy(out, d_out, sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToHost));
    int ok = !memcmp(out, ref, sizeof(int32_t) * (size_t)n);
    for (int r = 0; r < n; r++) ok = ok && ref[r] == 1000 + r;
    printf("%s argmax after the mask (the best id left): gpu %d %d %d .. cpu %d %d %d .. (want 1000+row)\n",
           ok ? "ok" : "FAIL", out[0], out[1], out[2], ref[0], ref[1], ref[2]);
    if (!ok) failures++;
    CHECK_CUDA(cudaFree(d));
    CHECK_CUDA(cudaFree(d_ids));
    CHECK_CUDA(cudaFree(d_out));
    free(f), free(h), free(got);
    printf("%s test_logits_mask_gpu: %d failure(s)\n", failures ? "FAIL" : "ok", failures);
    return failures ? 1 : 0;
}

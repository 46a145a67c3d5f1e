/* gpu_test: what the GPU test programs share (one test program includes it once): the failure count, a stream,
 * the xorshift generator (seed GPU_TEST_SEED, defined before the include to change it), random bf16 data with its
 * exact fp32 values, device upload/download, and the bf16-against-fp32 comparison by relative norm and max error. */
#ifndef DFLASH_GPU_TEST_H
#define DFLASH_GPU_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "tests/compare_bf16.h"
#include "util.h"

#ifndef GPU_TEST_SEED
#define GPU_TEST_SEED 0x9e3779b97f4a7c15ull
#endif

static int failures;
static cudaStream_t stream;
static uint64_t rng_state = GPU_TEST_SEED;

static inline double rnd_uniform(void) /* [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* n bf16 values of amplitude amp, and their exact fp32 values in f (may be NULL). */
static inline uint16_t *rnd_bf16(size_t n, double amp, float *f)
{
    uint16_t *h = xmalloc((n ? n : 1) * sizeof *h);
    for (size_t i = 0; i < n; i++) {
        h[i] = f32_to_bf16((float)(amp * rnd_uniform()));
        if (f) f[i] = bf16_to_f32(h[i]);
    }
    return h;
}

/* Device memory holding bytes of src (NULL: uninitialised). */
static inline void *dev_upload(const void *src, size_t bytes)
{
    void *d = NULL;
    CHECK_CUDA(cudaMalloc(&d, bytes ? bytes : 16));
    if (bytes && src) CHECK_CUDA(cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice));
    return d;
}

/* n bf16 of device memory (and 16 bytes more, for shifted views) filled with 0xffff (NaN): a value a kernel
 * should have written and did not shows. */
static inline uint16_t *dev_poisoned(size_t n)
{
    uint16_t *d = dev_upload(NULL, n * 2 + 16);
    CHECK_CUDA(cudaMemset(d, 0xff, n * 2 + 16));
    return d;
}

/* bytes of device memory d, after the test stream's work, in a new host buffer. */
static inline void *dev_get(const void *d, size_t bytes)
{
    void *h = xmalloc(bytes ? bytes : 1);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    if (bytes) CHECK_CUDA(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
    return h;
}

/* got (host bf16) against ref (fp32): ‖got − ref‖/‖ref‖ <= tol_norm and max|got − ref| / max(1, max|ref|) <= tol_max,
 * no NaN. Prints the line and counts a failure. */
static inline void compare_bf16(const char *name, const uint16_t *got, const float *ref, size_t n, double tol_norm,
                                double tol_max)
{
    if (!compare_bf16_line(name, got, ref, n, tol_norm, tol_max)) failures++;
}

#endif

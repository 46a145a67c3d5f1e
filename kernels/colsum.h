/* colsum: dw[c] += Σ_p part[p][c] over the rows of an (nparts, dim) fp32 matrix, in a fixed order: the last step of
 * the deterministic weight gradients of the norms (each chunk of rows writes its partial sums, this adds them). */
#ifndef DFLASH_COLSUM_H
#define DFLASH_COLSUM_H

#ifdef __cplusplus
extern "C" {
#endif
/* CPU reference: the same sums in the same order (per column: 32 strided partial sums p = j, j+32, ..., then those 32
 * in order), so the CUDA version is bit-identical. */
void colsum_add_cpu(float *dw, const float *part, int nparts, int dim);
/* CUDA; device pointers; stream is a cudaStream_t. */
void colsum_add_cuda(float *dw, const float *part, int nparts, int dim, void *stream);
#ifdef __cplusplus
}
#endif

#endif

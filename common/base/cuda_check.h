/* cuda_check: the one check-macro family for CUDA runtime, driver, cuBLAS/cuBLASLt and NCCL calls. A failing call
 * prints the expression, the library's error string, file:line and the current device ordinal, then exits
 * non-zero (the supervisor restarts the worker). Usable from C and CUDA C++. CHECK_CU needs <cuda.h>,
 * CHECK_CUBLAS needs <cublas_api.h> (or cublasLt.h) and CHECK_NCCL needs <nccl.h> included by the caller. */
#ifndef DFLASH_CUDA_CHECK_H
#define DFLASH_CUDA_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

/* Report a failed call and exit(1); the device is asked for here so the message names it. */
static inline __attribute__((noreturn, cold)) void df_cuda_fail(const char *lib, const char *expr, int code,
                                                                 const char *msg, const char *file, int line)
{
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) dev = -1;
    fprintf(stderr, "%s error %d (%s) in %s at %s:%d on device %d\n", lib, code, msg ? msg : "?", expr, file, line,
            dev);
    fflush(stderr);
    exit(1);
}

#define CHECK_CUDA(expr)                                                                                  \
    do {                                                                                                  \
        cudaError_t df_e_ = (expr);                                                                       \
        if (df_e_ != cudaSuccess)                                                                         \
            df_cuda_fail("CUDA", #expr, (int)df_e_, cudaGetErrorString(df_e_), __FILE__, __LINE__);       \
    } while (0)

/* After a kernel launch: the launch error (bad config, no kernel image), not the asynchronous execution one. */
#define CHECK_CUDA_LAUNCH() CHECK_CUDA(cudaGetLastError())

#define CHECK_CU(expr)                                                                                    \
    do {                                                                                                  \
        CUresult df_r_ = (expr);                                                                          \
        if (df_r_ != CUDA_SUCCESS) {                                                                      \
            const char *df_s_ = NULL;                                                                     \
            cuGetErrorString(df_r_, &df_s_);                                                              \
            df_cuda_fail("CUDA driver", #expr, (int)df_r_, df_s_, __FILE__, __LINE__);                    \
        }                                                                                                 \
    } while (0)

#define CHECK_CUBLAS(expr)                                                                                \
    do {                                                                                                  \
        cublasStatus_t df_s_ = (expr);                                                                    \
        if (df_s_ != CUBLAS_STATUS_SUCCESS)                                                               \
            df_cuda_fail("cuBLAS", #expr, (int)df_s_, cublasGetStatusString(df_s_), __FILE__, __LINE__);  \
    } while (0)

#define CHECK_NCCL(expr)                                                                                  \
    do {                                                                                                  \
        ncclResult_t df_n_ = (expr);                                                                      \
        if (df_n_ != ncclSuccess)                                                                         \
            df_cuda_fail("NCCL", #expr, (int)df_n_, ncclGetErrorString(df_n_), __FILE__, __LINE__);       \
    } while (0)

#endif

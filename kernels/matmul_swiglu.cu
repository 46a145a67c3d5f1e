// matmul_swiglu: act = swiglu(x · w_guᵀ) on Hopper (sm_90a), the gate|up GEMM with the SwiGLU in its epilogue, so the
// (T, 2I) gate|up product never goes to memory (at Qwen3-8B's T = 19218, I = 12288: 945 MB written and read again per
// layer by the two-kernel path).
//
// The kernel is gemm_sm90.cuh's (its schedules and their shapes are described there) with the SwiGLU epilogue: this
// file holds the table of schedules, the rule that picks one, and the entry points.
#include <cuda_runtime.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda_check.h"
#include "gemm_sm90.cuh"
#include "matmul_swiglu.h"

namespace {

using namespace gemm_sm90;

template <int KERNEL>
void launch(uint16_t *act, int ldact, const uint16_t *x, int ldx, const uint16_t *w_gu, int T, int I, int H,
            cudaStream_t st)
{
    gemm_launch<KERNEL, GEMM_EPI_SWIGLU>("matmul_swiglu_forward_cuda", act, ldact, x, ldx, w_gu, T, I, H, st);
}

// The schedules, one row each, the one place that maps a MATMUL_SWIGLU_* value and a DFLASH_MATMUL_SWIGLU name to a
// launch. A TMA-store schedule's act must make a tensor map (16-byte aligned, ldact a multiple of 8); where it does
// not, its direct-store twin runs instead (the same bits).
typedef void (*ms_launch_fn)(uint16_t *, int, const uint16_t *, int, const uint16_t *, int, int, int, cudaStream_t);
const struct ms_schedule {
    int kernel;
    const char *name;
    ms_launch_fn launch;
    int direct; // the twin storing from the registers (itself for those that do)
} ms_schedules[] = {
    {MATMUL_SWIGLU_COOPERATIVE, "cooperative", launch<MATMUL_SWIGLU_COOPERATIVE>, MATMUL_SWIGLU_COOPERATIVE},
    {MATMUL_SWIGLU_PINGPONG, "pingpong", launch<MATMUL_SWIGLU_PINGPONG>, MATMUL_SWIGLU_PINGPONG},
    {MATMUL_SWIGLU_CLUSTER, "cluster", launch<MATMUL_SWIGLU_CLUSTER>, MATMUL_SWIGLU_CLUSTER},
    {MATMUL_SWIGLU_COOPERATIVE_TMASTORE, "cooperative_tmastore", launch<MATMUL_SWIGLU_COOPERATIVE_TMASTORE>,
     MATMUL_SWIGLU_COOPERATIVE},
    {MATMUL_SWIGLU_CLUSTER_TMASTORE, "cluster_tmastore", launch<MATMUL_SWIGLU_CLUSTER_TMASTORE>,
     MATMUL_SWIGLU_CLUSTER},
    {MATMUL_SWIGLU_PINGPONG_TMASTORE, "pingpong_tmastore", launch<MATMUL_SWIGLU_PINGPONG_TMASTORE>,
     MATMUL_SWIGLU_PINGPONG},
    {MATMUL_SWIGLU_PINGPONG_WIDE, "pingpong_wide", launch<MATMUL_SWIGLU_PINGPONG_WIDE>, MATMUL_SWIGLU_PINGPONG_WIDE},
};
constexpr int kNSchedules = (int)(sizeof ms_schedules / sizeof ms_schedules[0]);
static_assert(kNSchedules == MATMUL_SWIGLU_NKERNELS - 1, "a row for every MATMUL_SWIGLU_* but AUTO");

const ms_schedule *ms_schedule_of(int kernel)
{
    for (int i = 0; i < kNSchedules; i++)
        if (ms_schedules[i].kernel == kernel) return &ms_schedules[i];
    return NULL;
}

// MATMUL_SWIGLU_AUTO's schedule: DFLASH_MATMUL_SWIGLU's name (read once), when unset or empty the cooperative one
// with the TMA-store epilogue (the fastest on the H200 at the 8B shape: 5.19 ms, 746 TFLOP/s, against cooperative's
// 5.78 and cuBLASLt + swiglu's 5.70; bench/RESULTS.md, 2026-12-05)
int ms_auto(void)
{
    static int kernel = -1;
    if (kernel < 0) {
        const char *e = getenv("DFLASH_MATMUL_SWIGLU");
        kernel = MATMUL_SWIGLU_COOPERATIVE_TMASTORE;
        if (e && *e) {
            int i = 0;
            while (i < kNSchedules && strcmp(ms_schedules[i].name, e)) i++;
            if (i == kNSchedules) {
                fprintf(stderr, "matmul_swiglu_forward_cuda: DFLASH_MATMUL_SWIGLU=%s is none of", e);
                for (i = 0; i < kNSchedules; i++) fprintf(stderr, " %s", ms_schedules[i].name);
                fprintf(stderr, "\n");
                exit(1);
            }
            kernel = ms_schedules[i].kernel;
        }
    }
    return kernel;
}

} // namespace

extern "C" const char *matmul_swiglu_kernel_name(int kernel)
{
    const ms_schedule *s = ms_schedule_of(kernel);
    return s ? s->name : NULL;
}

extern "C" int matmul_swiglu_cuda_takes(const uint16_t *act, int ldact, const uint16_t *x, int ldx,
                                        const uint16_t *w_gu, int T, int I, int H)
{
    return T >= 0 && I > 0 && H > 0 && I % 64 == 0 && H % 64 == 0 && ldx >= H && ldx % 8 == 0 && ldact >= I &&
           ldact % 2 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)w_gu % 16 == 0 && (uintptr_t)act % 4 == 0 &&
           sm90a_device() && encode_tiled() != NULL;
}

extern "C" void matmul_swiglu_forward_cuda_with(int kernel, uint16_t *act, int ldact, const uint16_t *x, int ldx,
                                                const uint16_t *w_gu, int T, int I, int H, void *stream)
{
    if (!matmul_swiglu_cuda_takes(act, ldact, x, ldx, w_gu, T, I, H)) {
        fprintf(stderr,
                "matmul_swiglu_forward_cuda: T=%d I=%d H=%d ldx=%d ldact=%d (x %p, w_gu %p, act %p) is not a shape "
                "it takes: I and H multiples of 64, ldx >= H a multiple of 8, ldact >= I even, x and w_gu 16-byte "
                "aligned, act 4-byte aligned, an sm_90 device whose driver makes tensor maps\n",
                T, I, H, ldx, ldact, (const void *)x, (const void *)w_gu, (const void *)act);
        exit(1);
    }
    const ms_schedule *s = ms_schedule_of(kernel == MATMUL_SWIGLU_AUTO ? ms_auto() : kernel);
    if (!s) {
        fprintf(stderr, "matmul_swiglu_forward_cuda_with: kernel %d is none of MATMUL_SWIGLU_*\n", kernel);
        exit(1);
    }
    if (T == 0) return;
    if ((uintptr_t)act % 16 != 0 || ldact % 8 != 0) s = ms_schedule_of(s->direct); // no tensor map of act
    s->launch(act, ldact, x, ldx, w_gu, T, I, H, (cudaStream_t)stream);
}

extern "C" void matmul_swiglu_forward_cuda(uint16_t *act, int ldact, const uint16_t *x, int ldx, const uint16_t *w_gu,
                                           int T, int I, int H, void *stream)
{
    matmul_swiglu_forward_cuda_with(MATMUL_SWIGLU_AUTO, act, ldact, x, ldx, w_gu, T, I, H, stream);
}

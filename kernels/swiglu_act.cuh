// swiglu_act: silu(g) * u in fp32, the one formula of swiglu.cu's forward and of the GEMV that folds SwiGLU into the
// gate|up projection (gemv.cu): both give the same bits from the same bf16 gate and up values.
// __fdividef: the IEEE division's instruction sequence cost as much issue time as the loads (two MUFU ops and a few
// FMAs per element remain); a saturated gate (exp(-g) = inf) still gives -0, as g / inf.
#ifndef DFLASH_KERNEL_SWIGLU_ACT_CUH
#define DFLASH_KERNEL_SWIGLU_ACT_CUH

static __device__ __forceinline__ float swiglu_act(float g, float u) { return __fdividef(g, 1.0f + __expf(-g)) * u; }

#endif

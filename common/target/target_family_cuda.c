/* target_family_cuda: the CUDA operations of each row of target_families.def. */
#include "target_model_cuda_impl.h"

#define TARGET_FAMILY(id) extern const target_family target_##id##_family; extern const target_cuda_ops target_##id##_cuda;
#include "target_families.def"
#undef TARGET_FAMILY

const target_cuda_ops *target_family_cuda_ops(const target_family *f)
{
#define TARGET_FAMILY(id) if (f == &target_##id##_family) return &target_##id##_cuda;
#include "target_families.def"
#undef TARGET_FAMILY
    DF_ASSERT(!"a target family without its CUDA operations");
    return NULL;
}

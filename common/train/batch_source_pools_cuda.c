/* GPU hidden-state pools for the batch source (common/train/step.h): each pool's control segment, and its data
 * imported from the VMM allocation its target deposited (dflashd passed the fd; the GPU is found by the UUID the
 * pool records and must be the drafter's own). The taps are read in place on the GPU; the token arrays of a leased
 * slot (a few KiB) are copied to pinned host memory for the anchors: the one small synchronous copy of a step. */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <string.h>

#include "batch_source_pools_cuda.h"
#include "cuda_check.h"
#include "slot_pool.h"
#include "vmm_pool_cuda.h"

typedef struct gpu_access {
    int device;
    cudaStream_t stream;
    vmm_alloc *va[64];
    char *host;              /* pinned: the token part of one slot */
    size_t host_bytes;
} gpu_access;

static int gpu_attach(void *ctx, int i, const char *name, int fd, struct slot_pool **pool, errbuf *err)
{
    gpu_access *g = ctx;
    uint8_t uuid[16];
    uint64_t bytes = 0;
    int dev, rc = slot_pool_attach_control(name, pool, err);
    if (rc) return rc;
    if (slot_pool_device(*pool, uuid, &bytes)) return errbuf_set(err, EPROTO, "%s: no GPU allocation recorded", name);
    if ((rc = vmm_device_by_uuid(uuid, &dev, err))) return errbuf_wrap(err, rc, "%s", name);
    if (dev != g->device)
        return errbuf_set(err, EXDEV, "%s: the pool lives on GPU %d, this drafter trains on GPU %d (targets and "
                          "drafters on different GPUs are not supported yet)", name, dev, g->device);
    return vmm_alloc_attach(dev, fd, (size_t)bytes, &g->va[i], err);
}

static int gpu_fill(void *ctx, const job_plan *p, struct slot_pool *pool, int i, int slot, drafter_batch *bt,
                    errbuf *err)
{
    gpu_access *g = ctx;
    const hidden_slot_layout *L = &p->slot;
    const char *data = (const char *)(uintptr_t)g->va[i]->ptr + (size_t)slot * slot_pool_slot_bytes(pool);
    const size_t tok = L->bytes - L->input_ids; /* input_ids .. loss_mask: the token part, contiguous */
    if (tok > g->host_bytes) return errbuf_set(err, EOVERFLOW, "slot token part of %zu bytes", tok);
    CHECK_CUDA(cudaMemcpyAsync(g->host, data + L->input_ids, tok, cudaMemcpyDeviceToHost, g->stream));
    CHECK_CUDA(cudaStreamSynchronize(g->stream));
    bt->aux = data + L->aux;
    bt->input_ids = (const int32_t *)g->host;
    bt->positions = (const int32_t *)(g->host + (L->positions - L->input_ids));
    bt->cu_seqlens = (const int32_t *)(g->host + (L->cu_seqlens - L->input_ids));
    bt->loss_mask = (const uint8_t *)(g->host + (L->loss_mask - L->input_ids));
    return 0;
}

static void gpu_destroy(void *ctx)
{
    gpu_access *g = ctx;
    for (int i = 0; i < 64; i++) vmm_alloc_destroy(&g->va[i]);
    cudaFreeHost(g->host);
    free(g);
}

int batch_source_pools_cuda_create(batch_source **out, worker_ctx *w, int device, void *stream, errbuf *err)
{
    gpu_access *g = xcalloc(1, sizeof *g);
    g->device = device;
    g->stream = (cudaStream_t)stream;
    g->host_bytes = w->plan.slot.bytes - w->plan.slot.input_ids;
    CHECK_CUDA(cudaMallocHost((void **)&g->host, g->host_bytes));
    pool_access acc = {.attach = gpu_attach, .fill = gpu_fill, .destroy = gpu_destroy, .ctx = g};
    return batch_source_pools_create(out, w, &acc, err);
}

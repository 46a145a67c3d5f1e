#include "reduce_cuda.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "adamw.h"
#include "cast.h"
#include "cuda_check.h"
#include "job_state.h"
#include "keeper_proto.h"
#include "log.h"
#include "train_init.h"
#include "vmm_pool_cuda.h"

#define REDUCE_CUDA_MAGIC 0x52444355u /* "RDCU" */

/* The head of the allocation (device memory). */
typedef struct dev_header {
    uint32_t magic, reserved;
    uint64_t numel;
    double sq_sum;          /* Σ (g / W)² of the step being reduced */
    float loss_guard;       /* 0, or NaN when the step's loss is not finite (the NaN guard skips it) */
    int32_t skipped;        /* set by apply */
} dev_header;

typedef struct reduce_cuda {
    reducer base;
    const drafter_layout *L;
    size_t numel;
    int device;
    cudaStream_t stream;
    vmm_alloc *va;
    dev_header *h;          /* device */
    float *state[2];        /* device: w, m, v (3 x numel each) */
    float *grads;           /* device: numel */
    uint16_t *w_bf16;       /* device: the compute copy */
    uint64_t bf16_step;     /* the step w_bf16 holds (UINT64_MAX: none) */
    adamw_range *ranges;    /* device: decay per tensor */
    int nranges;
    void *sq_ws;            /* grad_sq_sum_cuda workspace */
    double *host_sq;        /* pinned */
    int32_t *host_skipped;  /* pinned */
    float *export_buf;      /* host: 3 x numel, made at the first checkpoint */
} reduce_cuda;

static size_t align256(size_t n) { return (n + 255) / 256 * 256; }
static size_t state_bytes(size_t numel) { return align256(sizeof(dev_header)) + 7 * numel * sizeof(float); }

static void bind(reduce_cuda *s)
{
    char *base = (char *)(uintptr_t)s->va->ptr;
    s->h = (dev_header *)base;
    float *f = (float *)(base + align256(sizeof(dev_header)));
    s->state[0] = f;
    s->state[1] = f + 3 * s->numel;
    s->grads = f + 6 * s->numel;
}

static float *w_of(reduce_cuda *s, uint64_t k) { return s->state[k & 1]; }
static float *m_of(reduce_cuda *s, uint64_t k) { return s->state[k & 1] + s->numel; }
static float *v_of(reduce_cuda *s, uint64_t k) { return s->state[k & 1] + 2 * s->numel; }

static const void *cu_weights(reducer *r, uint64_t k)
{
    reduce_cuda *s = (reduce_cuda *)r;
    if (s->bf16_step != k) {
        cast_f32_bf16_cuda(s->w_bf16, w_of(s, k), s->numel, s->stream);
        s->bf16_step = k;
    }
    return s->w_bf16;
}

static float *cu_grads(reducer *r, uint64_t k)
{
    (void)k;
    return ((reduce_cuda *)r)->grads;
}

static void cu_reduce(reducer *r, uint64_t k, double weight_sum)
{
    reduce_cuda *s = (reduce_cuda *)r;
    const float inv = weight_sum > 0 ? (float)(1.0 / weight_sum) : 0.0f;
    grad_sq_sum_cuda(&s->h->sq_sum, s->grads, s->numel, inv, s->sq_ws, s->stream);
    /* done on the device before the protocol says so: a rank killed after publishing must leave it complete */
    CHECK_CUDA(cudaStreamSynchronize(s->stream));
}

static double cu_apply(reducer *r, uint64_t k, double weight_sum, const adamw_params *ap, float clip, int apply,
                       int *applied)
{
    reduce_cuda *s = (reduce_cuda *)r;
    const float inv = weight_sum > 0 ? (float)(1.0 / weight_sum) : 0.0f, guard = apply ? 0.0f : NAN;
    CHECK_CUDA(cudaMemcpyAsync(&s->h->loss_guard, &guard, sizeof guard, cudaMemcpyHostToDevice, s->stream));
    adamw_apply_cuda(w_of(s, k + 1), m_of(s, k + 1), v_of(s, k + 1), s->w_bf16, w_of(s, k), m_of(s, k), v_of(s, k),
                     s->grads, inv, s->numel, s->ranges, s->nranges, &s->h->sq_sum, &s->h->loss_guard, clip, ap,
                     (long)k + 1, &s->h->skipped, s->stream);
    s->bf16_step = k + 1;
    CHECK_CUDA(cudaMemcpyAsync(s->host_sq, &s->h->sq_sum, sizeof(double), cudaMemcpyDeviceToHost, s->stream));
    CHECK_CUDA(cudaMemcpyAsync(s->host_skipped, &s->h->skipped, sizeof(int32_t), cudaMemcpyDeviceToHost, s->stream));
    CHECK_CUDA(cudaStreamSynchronize(s->stream));
    *applied = !*s->host_skipped;
    return sqrt(*s->host_sq);
}

static int cu_export(reducer *r, uint64_t k, optim_state *host, errbuf *err)
{
    reduce_cuda *s = (reduce_cuda *)r;
    if (!s->export_buf) s->export_buf = xmalloc(3 * s->numel * sizeof(float));
    CHECK_CUDA(cudaMemcpyAsync(s->export_buf, s->state[k & 1], 3 * s->numel * sizeof(float), cudaMemcpyDeviceToHost,
                               s->stream));
    CHECK_CUDA(cudaStreamSynchronize(s->stream));
    *host = (optim_state){s->export_buf, s->export_buf + s->numel, s->export_buf + 2 * s->numel};
    (void)err;
    return 0;
}

static void cu_destroy(reducer *r)
{
    reduce_cuda *s = (reduce_cuda *)r;
    if (s->stream) cudaStreamSynchronize(s->stream);
    cudaFree(s->w_bf16);
    cudaFree(s->ranges);
    cudaFree(s->sq_ws);
    cudaFreeHost(s->host_sq);
    cudaFreeHost(s->host_skipped);
    free(s->export_buf);
    vmm_alloc_destroy(&s->va);
    free(s);
}

static const reducer_ops cu_ops = {.weights = cu_weights, .grads = cu_grads, .reduce = cu_reduce, .apply = cu_apply,
                                   .export_state = cu_export, .destroy = cu_destroy};

/* First start: a VMM allocation with the state of `step` (made on the host by train_init), deposited. */
static int make_state(reduce_cuda *s, worker_ctx *w, uint64_t step, errbuf *err)
{
    int rc = vmm_alloc_create(s->device, state_bytes(s->numel), &s->va, err);
    if (rc) return rc;
    bind(s);
    const double t0 = now_seconds();
    float *host = xmalloc(3 * s->numel * sizeof(float));
    optim_state hs = {host, host + s->numel, host + 2 * s->numel};
    rc = train_init_state(&w->plan, step, hs, err);
    if (!rc) {
        dev_header h = {.magic = REDUCE_CUDA_MAGIC, .numel = s->numel};
        CHECK_CUDA(cudaMemcpy(s->h, &h, sizeof h, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemcpy(s->state[step & 1], host, 3 * s->numel * sizeof(float), cudaMemcpyHostToDevice));
    }
    free(host);
    if (rc) return rc;
    uint8_t uuid[16];
    int fd = -1;
    if ((rc = vmm_device_uuid(s->device, uuid, err)) || (rc = vmm_alloc_export_fd(s->va, &fd, err))) return rc;
    rc = keeper_deposit_memory(w->plan.keeper_socket, KEEPER_DEPOSIT_TRAIN_STATE, w->index, w->epoch, fd, uuid,
                               s->va->size, 30.0, err);
    close(fd);
    if (!rc)
        log_info("made and deposited the training state of step %llu on GPU %d: %zu bytes (%.2f s)",
                 (unsigned long long)step, s->device, s->va->size, now_seconds() - t0);
    return rc;
}

/* A restart: the deposited allocation, on the GPU its UUID names. */
static int import_state(reduce_cuda *s, worker_ctx *w, errbuf *err)
{
    const job_train_state *t = &w->js.h->train_state[w->train_index];
    if (!t->gpu) return errbuf_set(err, EPROTO, "training state %d is host memory, this rank runs on a GPU",
                                   w->train_index);
    int dev, rc = vmm_device_by_uuid(t->device_uuid, &dev, err);
    if (rc) return errbuf_wrap(err, rc, "training state %d", w->train_index);
    if (dev != s->device)
        return errbuf_set(err, EXDEV, "training state %d lives on GPU %d, this rank runs on GPU %d", w->train_index,
                          dev, s->device);
    if ((rc = vmm_alloc_attach(dev, w->train_fd, (size_t)t->bytes, &s->va, err))) return rc;
    bind(s);
    dev_header h;
    CHECK_CUDA(cudaMemcpy(&h, s->h, sizeof h, cudaMemcpyDeviceToHost));
    if (h.magic != REDUCE_CUDA_MAGIC || h.numel != s->numel)
        return errbuf_set(err, EINVAL, "training state %d: made for %llu parameters (magic %#x), this job has %zu",
                          w->train_index, (unsigned long long)h.numel, h.magic, s->numel);
    log_info("re-imported the training state from dflashd: %llu bytes on GPU %d", (unsigned long long)t->bytes, dev);
    return 0;
}

int reduce_cuda_open(reducer **out, worker_ctx *w, const drafter_layout *L, uint64_t step, int device, void *stream,
                     errbuf *err)
{
    if (w->plan.cfg.workers.drafters != 1)
        return errbuf_set(err, ENOTSUP, "workers.drafters = %d: several GPU drafters need the NCCL reducer",
                          w->plan.cfg.workers.drafters);
    reduce_cuda *s = xcalloc(1, sizeof *s);
    s->base.ops = &cu_ops;
    s->L = L;
    s->numel = L->numel;
    s->device = device;
    s->stream = (cudaStream_t)stream;
    s->bf16_step = UINT64_MAX;
    CHECK_CUDA(cudaSetDevice(device));
    int rc = w->train_fd >= 0 && w->train_index == w->index ? import_state(s, w, err) : make_state(s, w, step, err);
    if (rc) {
        cu_destroy(&s->base);
        return rc;
    }
    adamw_range *hr = xcalloc((size_t)L->nparams, sizeof *hr);
    for (int i = 0; i < L->nparams; i++)
        hr[i] = (adamw_range){.offset = L->params[i].offset, .numel = L->params[i].numel, .decay = L->params[i].decay};
    s->nranges = L->nparams;
    CHECK_CUDA(cudaMalloc((void **)&s->ranges, sizeof *hr * (size_t)L->nparams));
    CHECK_CUDA(cudaMemcpy(s->ranges, hr, sizeof *hr * (size_t)L->nparams, cudaMemcpyHostToDevice));
    free(hr);
    CHECK_CUDA(cudaMalloc((void **)&s->w_bf16, sizeof(uint16_t) * s->numel));
    CHECK_CUDA(cudaMalloc(&s->sq_ws, grad_sq_sum_cuda_workspace(s->numel)));
    CHECK_CUDA(cudaMallocHost((void **)&s->host_sq, sizeof(double)));
    CHECK_CUDA(cudaMallocHost((void **)&s->host_skipped, sizeof(int32_t)));
    *out = &s->base;
    return 0;
}

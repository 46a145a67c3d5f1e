/* dflash-target: runs the frozen target forward over packed token batches and writes the tapped layers straight
 * into a hidden-state slot of its pool (plus a copy of the batch's tokens, so the drafter needs nothing else), then
 * publishes the slot. A pool slot is claimed before a token batch is leased, so a target never holds a batch while
 * it waits for room; batches already committed (re-deliveries after a crash) are dropped. Built with DFLASH_CUDA
 * (dflash-target-cuda) it also runs job.backend = cuda: the pool is a VMM allocation on its GPU that it creates and
 * deposits with dflashd at its first start and re-imports after a restart; taps are bf16, written by the forward
 * straight into the slot, and a slot is published once the CUDA event after its work has completed. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "log.h"
#include "slot_pool.h"
#include "target_model.h"
#include "token_ring.h"
#include "worker.h"

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "keeper_proto.h"
#include "target_model_cuda.h"
#include "vmm_pool_cuda.h"
#endif

/* Lease the next token batch, feeding the heartbeat; -1 when the job finished first. */
static int lease_batch(worker_ctx *w, struct token_ring *ring, uint16_t owner)
{
    while (!worker_job_finished(w)) {
        worker_tick(w);
        int i = token_ring_lease(ring, owner, w->epoch, 200);
        if (i >= 0) return i;
    }
    return -1;
}

static int claim_slot(worker_ctx *w, struct slot_pool *pool, uint16_t owner)
{
    while (!worker_job_finished(w)) {
        worker_tick(w);
        int i = slot_pool_claim(pool, owner, w->epoch, 200);
        if (i >= 0) return i;
    }
    return -1;
}

/* One unit of work: a claimed pool slot *s and a leased token batch *t. Returns 1 with both held, 0 to ask again
 * (the batch was held back or dropped), -1 when the job finished. */
static int next_work(worker_ctx *w, struct slot_pool *pool, struct token_ring *ring, uint16_t owner, int *s, int *t)
{
    const uint64_t D = (uint64_t)w->plan.cfg.workers.drafters;
    if ((*s = claim_slot(w, pool, owner)) < 0) return -1;
    if ((*t = lease_batch(w, ring, owner)) < 0) {
        slot_pool_abandon(pool, *s, owner, w->epoch);
        return -1;
    }
    uint64_t id = token_ring_batch(ring, *t).meta->batch_id;
    if (job_state_batch_held(&w->js, id, (uint32_t)D)) { /* paused (beyond the step in flight) or drained */
        token_ring_unlease(ring, *t, owner, w->epoch);
        slot_pool_abandon(pool, *s, owner, w->epoch);
        uint32_t seen = atomic_load(&w->js.h->gen);
        job_state_wait(&w->js, seen, 200);
        return 0;
    }
    if (id < atomic_load(&w->js.h->committed_step) * D) { /* re-delivered after a crash, already trained */
        log_info("batch %llu already committed: dropped", (unsigned long long)id);
        token_ring_release(ring, *t, owner, w->epoch);
        slot_pool_abandon(pool, *s, owner, w->epoch);
        return 0;
    }
    return 1;
}

/* The slot's token part from batch b: input_ids, positions (restarting at each sequence), cu_seqlens, loss_mask,
 * laid out as in the slot from offset p->slot.input_ids (tok points at that offset, host memory). */
static void fill_tokens(const job_plan *p, char *tok, const struct token_batch *b)
{
    const size_t base = p->slot.input_ids;
    int T = (int)b->meta->ntok, S = (int)b->meta->nseq;
    int32_t *ids = (int32_t *)(tok + p->slot.input_ids - base), *pos = (int32_t *)(tok + p->slot.positions - base);
    int32_t *cu = (int32_t *)(tok + p->slot.cu_seqlens - base);
    memcpy(ids, b->input_ids, sizeof(int32_t) * (size_t)T);
    memcpy(cu, b->cu_seqlens, sizeof(int32_t) * (size_t)(S + 1));
    memcpy(tok + p->slot.loss_mask - base, b->loss_mask, (size_t)T);
    for (int q = 0; q < S; q++)
        for (int i = cu[q]; i < cu[q + 1]; i++) pos[i] = i - cu[q];
}

/* Descriptor fields, then READY (the payload is complete: written by this thread, or by a completed CUDA event). */
static int publish_slot(worker_ctx *w, struct slot_pool *pool, int s, uint64_t id, int T, int S, uint16_t owner)
{
    struct slot_pool_desc *d = slot_pool_desc(pool, s);
    d->batch_id = id;
    d->ntok = (uint32_t)T;
    d->nseq = (uint32_t)S;
    d->bytes_used = w->plan.slot.bytes;
    int rc = slot_pool_publish(pool, s, owner, w->epoch);
    if (rc) log_error("publish of batch %llu: %s (slot reclaimed?)", (unsigned long long)id, strerror(-rc));
    return rc;
}

/* The cpu backend: the pool is a memfd mapped here; the forward writes fp32 taps into the slot. */
static int run_cpu(worker_ctx *w, struct token_ring *ring, const char *pool_name, int deepest)
{
    const job_plan *p = &w->plan;
    const uint16_t owner = (uint16_t)(1 + w->index);
    errbuf err = {{0}};
    struct slot_pool *pool = NULL;
    target_model *tm = NULL;
    int rc;
    if (w->nfds != 1 || slot_pool_attach(pool_name, w->fds[0], &pool, &err) ||
        target_model_load(&tm, p->cfg.target.model, deepest, &err)) {
        log_error("%s", w->nfds != 1 ? "keeper passed no pool fd" : err.msg);
        return 1;
    }
    if (slot_pool_slot_bytes(pool) < p->slot.bytes) {
        log_error("%s: slots of %llu bytes, %zu needed", pool_name, (unsigned long long)slot_pool_slot_bytes(pool),
                  p->slot.bytes);
        return 1;
    }
    log_info("target %s loaded up to layer %d; taps %d", p->cfg.target.model, deepest, p->ntaps);
    worker_ready(w, "running");
    while (!worker_job_finished(w)) {
        if (worker_restart_requested(w)) {
            log_info("restart requested by dflashd");
            return JOB_EXIT_RESTART;
        }
        int s, t, got = next_work(w, pool, ring, owner, &s, &t);
        if (got < 0) break;
        if (got == 0) continue;
        struct token_batch b = token_ring_batch(ring, t);
        uint64_t id = b.meta->batch_id;
        char *slot = slot_pool_data(pool, s);
        int T = (int)b.meta->ntok, S = (int)b.meta->nseq;
        fill_tokens(p, slot + p->slot.input_ids, &b);
        target_batch tb = {.ntok = T, .nseq = S, .input_ids = (int32_t *)(slot + p->slot.input_ids),
                           .positions = (int32_t *)(slot + p->slot.positions),
                           .cu_seqlens = (int32_t *)(slot + p->slot.cu_seqlens)};
        if ((rc = target_model_forward(tm, &tb, p->drafter.taps, p->ntaps, (float *)(slot + p->slot.aux), NULL, NULL,
                                       &err))) {
            log_error("batch %llu: %s", (unsigned long long)id, err.msg);
            return 1;
        }
        if (publish_slot(w, pool, s, id, T, S, owner)) return 1;
        token_ring_release(ring, t, owner, w->epoch);
        worker_count_batch(w, (uint64_t)T);
        log_debug("batch %llu: %d tokens published in slot %d", (unsigned long long)id, T, s);
    }
    target_model_destroy(&tm);
    slot_pool_destroy(&pool);
    return 0;
}

#ifdef DFLASH_CUDA
/* The GPU pool: re-import the deposited allocation on the GPU its UUID names (restart), or create one on GPU
 * `index` and deposit it with dflashd (first start). Leaves that GPU current. */
static int gpu_pool_open(worker_ctx *w, struct slot_pool *pool, vmm_alloc *va, errbuf *err)
{
    const job_plan *p = &w->plan;
    uint8_t uuid[16];
    uint64_t bytes = 0;
    int dev = -1, rc;
    if (w->nfds == 1) {
        if (slot_pool_device(pool, uuid, &bytes))
            return errbuf_set(err, EPROTO, "keeper passed a pool fd but the pool records no GPU");
        if ((rc = vmm_device_by_uuid(uuid, &dev, err))) return errbuf_wrap(err, rc, "pool %d", w->index);
        CHECK_CUDA(cudaSetDevice(dev));
        if ((rc = vmm_alloc_import_fd(va, dev, w->fds[0], (size_t)bytes, err))) return rc;
        log_info("re-imported pool %d (%llu bytes) on GPU %d", w->index, (unsigned long long)bytes, dev);
        return 0;
    }
    if (w->nfds != 0) return errbuf_set(err, EPROTO, "keeper passed %d pool fds, expected 0 or 1", w->nfds);
    int ndev = 0;
    CHECK_CUDA(cudaGetDeviceCount(&ndev));
    if (w->index >= ndev)
        return errbuf_set(err, ENODEV, "target %d: the cuda backend maps target i to GPU i, and %d are visible",
                          w->index, ndev);
    dev = w->index;
    CHECK_CUDA(cudaSetDevice(dev));
    size_t need = (size_t)slot_pool_nslots(pool) * slot_pool_slot_bytes(pool);
    int fd = -1;
    if ((rc = vmm_alloc_create(va, dev, need, err)) || (rc = vmm_device_uuid(dev, uuid, err)) ||
        (rc = vmm_alloc_export_fd(va, &fd, err)))
        return rc;
    rc = keeper_deposit_pool(p->keeper_socket, w->index, w->epoch, fd, uuid, va->size, 30.0, err);
    close(fd);
    if (rc) return rc;
    log_info("created and deposited pool %d: %zu bytes on GPU %d", w->index, va->size, dev);
    return 0;
}

/* One forward of the largest configured batch (max_batch_tokens in max_batch_seqs sequences) into a scratch aux
 * buffer of the slots' stride, so that every workspace and algorithm choice is settled before the first real batch;
 * nothing is published. */
static int gpu_warm_up(target_cuda *tc, const job_plan *p, errbuf *err)
{
    int T = (int)p->ring.max_tokens, S = (int)p->ring.max_seqs, H = p->hidden, V = p->vocab;
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)T), *pos = xmalloc(sizeof(int32_t) * (size_t)T);
    int32_t *cu = xmalloc(sizeof(int32_t) * (size_t)(S + 1));
    for (int q = 0; q <= S; q++) cu[q] = (int)((int64_t)T * q / S);
    for (int q = 0; q < S; q++)
        for (int i = cu[q]; i < cu[q + 1]; i++) pos[i] = i - cu[q], ids[i] = (int32_t)((i * 7919u) % (unsigned)V);
    uint16_t *aux = NULL;
    CHECK_CUDA(cudaMalloc((void **)&aux, (size_t)T * (size_t)p->ntaps * (size_t)H * 2));
    target_batch tb = {.ntok = T, .nseq = S, .input_ids = ids, .positions = pos, .cu_seqlens = cu};
    double t0 = now_seconds();
    int rc = target_cuda_forward(tc, &tb, p->drafter.taps, p->ntaps, aux, p->ntaps * H, NULL, NULL, err);
    CHECK_CUDA(cudaStreamSynchronize((cudaStream_t)target_cuda_stream(tc)));
    CHECK_CUDA(cudaFree(aux));
    free(ids), free(pos), free(cu);
    if (!rc) log_info("warm-up: %d tokens in %d sequences, %.3f s", T, S, now_seconds() - t0);
    return rc;
}

/* The cuda backend: the pool lives in GPU memory; per batch the tokens go into the slot, the forward writes its bf16
 * taps straight into the slot's aux (row stride K*H), and the slot is published after the event behind that work
 * has completed (cudaEventSynchronize on that event, never a device-wide wait). No allocation per batch. */
static int run_cuda(worker_ctx *w, struct token_ring *ring, const char *pool_name, int deepest)
{
    const job_plan *p = &w->plan;
    const uint16_t owner = (uint16_t)(1 + w->index);
    errbuf err = {{0}};
    struct slot_pool *pool = NULL;
    target_cuda *tc = NULL;
    vmm_alloc va = {0};
    int rc;
    if ((rc = slot_pool_attach_control(pool_name, &pool, &err)) || (rc = gpu_pool_open(w, pool, &va, &err))) {
        log_error("%s", err.msg);
        return 1;
    }
    if (slot_pool_slot_bytes(pool) < p->slot.bytes) {
        log_error("%s: slots of %llu bytes, %zu needed", pool_name, (unsigned long long)slot_pool_slot_bytes(pool),
                  p->slot.bytes);
        return 1;
    }
    if ((rc = target_cuda_load(&tc, p->cfg.target.model, deepest, (int)p->ring.max_tokens, (int)p->ring.max_seqs,
                               NULL, &err)) ||
        (rc = gpu_warm_up(tc, p, &err))) {
        log_error("%s", err.msg);
        return 1;
    }
    cudaStream_t st = (cudaStream_t)target_cuda_stream(tc);
    const size_t tok_bytes = p->slot.bytes - p->slot.input_ids;
    char *stage = NULL; /* pinned: the slot's token part, uploaded with one copy */
    CHECK_CUDA(cudaMallocHost((void **)&stage, tok_bytes));
    cudaEvent_t done;
    CHECK_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    log_info("target %s on the GPU up to layer %d; taps %d; %.1f MiB of weights and workspaces",
             p->cfg.target.model, deepest, p->ntaps, (double)target_cuda_device_bytes(tc) / (1 << 20));
    worker_ready(w, "running");
    const size_t sb = slot_pool_slot_bytes(pool);
    int ret = 0;
    while (!worker_job_finished(w)) {
        if (worker_restart_requested(w)) {
            log_info("restart requested by dflashd");
            ret = JOB_EXIT_RESTART;
            break;
        }
        int s, t, got = next_work(w, pool, ring, owner, &s, &t);
        if (got < 0) break;
        if (got == 0) continue;
        struct token_batch b = token_ring_batch(ring, t);
        uint64_t id = b.meta->batch_id;
        int T = (int)b.meta->ntok, S = (int)b.meta->nseq;
        char *slot = (char *)(uintptr_t)va.ptr + (size_t)s * sb;
        fill_tokens(p, stage, &b);
        CHECK_CUDA(cudaMemcpyAsync(slot + p->slot.input_ids, stage, tok_bytes, cudaMemcpyHostToDevice, st));
        const size_t base = p->slot.input_ids;
        target_batch tb = {.ntok = T, .nseq = S, .input_ids = (int32_t *)(stage + p->slot.input_ids - base),
                           .positions = (int32_t *)(stage + p->slot.positions - base),
                           .cu_seqlens = (int32_t *)(stage + p->slot.cu_seqlens - base)};
        if ((rc = target_cuda_forward(tc, &tb, p->drafter.taps, p->ntaps, (uint16_t *)(slot + p->slot.aux),
                                      p->ntaps * p->hidden, NULL, NULL, &err))) {
            log_error("batch %llu: %s", (unsigned long long)id, err.msg);
            return 1;
        }
        CHECK_CUDA(cudaEventRecord(done, st));
        CHECK_CUDA(cudaEventSynchronize(done)); /* the slot's payload (and the stage's upload) is complete */
        if (publish_slot(w, pool, s, id, T, S, owner)) return 1;
        token_ring_release(ring, t, owner, w->epoch);
        worker_count_batch(w, (uint64_t)T);
        log_debug("batch %llu: %d tokens published in slot %d", (unsigned long long)id, T, s);
    }
    CHECK_CUDA(cudaEventDestroy(done));
    CHECK_CUDA(cudaFreeHost(stage));
    target_cuda_destroy(&tc);
    vmm_alloc_release(&va);
    slot_pool_destroy(&pool);
    return ret;
}
#endif

int main(int argc, char **argv)
{
    worker_ctx w;
    int done;
    int rc = worker_start(&w, JOB_ROLE_TARGET, argc, argv,
                          "Runs the frozen target forward and publishes tapped hidden states.", &done);
    if (rc || done) return rc;
    const job_plan *p = &w.plan;
    errbuf err = {{0}};
    char pool_name[128];
    job_plan_pool_name(p, w.index, pool_name, sizeof pool_name);
    struct token_ring *ring = NULL;
    int deepest = 0;
    for (int i = 0; i < p->ntaps; i++)
        if (p->drafter.taps[i] > deepest) deepest = p->drafter.taps[i];
    if (token_ring_open(p->ring_name, &p->ring, &ring, &err)) {
        log_error("%s", err.msg);
        return 1;
    }
    if (p->slot.gpu) {
#ifdef DFLASH_CUDA
        rc = run_cuda(&w, ring, pool_name, deepest);
#else
        log_error("%s: job.backend = cuda needs dflash-target-cuda (this is the cpu build)", p->cfg.target.model);
        rc = 1;
#endif
    } else {
        rc = run_cpu(&w, ring, pool_name, deepest);
    }
    if (rc) return rc;
    log_info("job finished");
    token_ring_destroy(&ring);
    worker_stop(&w);
    return 0;
}

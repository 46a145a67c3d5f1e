/* dflash-target: runs the frozen target forward over packed token batches and writes the tapped layers straight
 * into a hidden-state slot of its pool (plus a copy of the batch's tokens, so the drafter needs nothing else), then
 * publishes the slot. A pool slot is claimed before a token batch is leased, so a target never holds a batch while
 * it waits for room; batches already committed (re-deliveries after a crash) are dropped. One worker loop (run);
 * what differs between the backends sits behind struct target_backend. Built with DFLASH_CUDA (dflash-target-cuda)
 * it also runs job.backend = cuda: the pool is a VMM allocation on its GPU that it creates and deposits with dflashd
 * at its first start and re-imports after a restart, and so are its device weights (target.keep_weights: a restarted
 * target re-imports them when they hold the same checkpoint and layout, and reads the checkpoint again otherwise,
 * saying why); taps are bf16, written by the forward straight into the slot,
 * and a slot is published once the CUDA event after its work has completed. Before a slot is published its taps are
 * checked for NaN and infinities (kernels/nonfinite.h; a flag per tap, on the device for cuda): such a batch is never
 * published; the worker logs the tapped layer and the first weight that is not finite, and exits JOB_EXIT_FATAL. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "log.h"
#include "nonfinite.h"
#include "slot_pool.h"
#include "target_model.h"
#include "token_ring.h"
#include "weights_check.h"
#include "worker.h"

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "job_identity.h"
#include "keeper_proto.h"
#include "target_model_cuda.h"
#include "vmm_pool_cuda.h"
#endif

/* One target worker's run: its ring and pool, and the backend's state. */
typedef struct target_run {
    worker_ctx *w;
    const job_plan *p;
    uint16_t owner;
    int deepest; /* the deepest tapped layer: the forward stops there */
    const char *pool_name;
    struct token_ring *ring;
    struct slot_pool *pool;
    int poisoned;     /* the last forward's taps were not finite: exit JOB_EXIT_FATAL */
    uint32_t bad[HF_MAX_TAPS]; /* per tap: it holds a NaN or an infinity */
    target_model *tm; /* cpu */
#ifdef DFLASH_CUDA
    target_cuda *tc;  /* cuda: the model, the pool's VMM mapping, the pinned token stage, the slot's done event */
    vmm_alloc *va;
    char *stage;
    cudaEvent_t done;
    uint32_t *d_bad, *h_bad; /* (ntaps) the flags on the device, and their pinned copy */
#endif
} target_run;

/* What differs between the backends. Each returns 0 or -errno with a message in err. */
typedef struct target_backend {
    /* map the pool's control segment and its data (sets r->pool) */
    int (*attach)(target_run *r, errbuf *err);
    /* load the model and settle its workspaces */
    int (*load)(target_run *r, errbuf *err);
    /* batch b's tokens and taps into slot s; returns once the slot's payload is complete */
    int (*forward)(target_run *r, int s, const struct token_batch *b, errbuf *err);
    /* free what attach and load made (the pool itself is the loop's) */
    void (*close)(target_run *r);
} target_backend;

/* A token batch to lease (lease = 1) or a pool slot to claim, waiting in 200 ms slices that feed the heartbeat.
 * The index, or -1 when the job finished first. */
static int wait_slot(target_run *r, int lease)
{
    while (!worker_job_finished(r->w)) {
        worker_tick(r->w);
        int i = lease ? token_ring_lease(r->ring, r->owner, r->w->epoch, 200)
                      : slot_pool_claim(r->pool, r->owner, r->w->epoch, 200);
        if (i >= 0) return i;
    }
    return -1;
}

/* One unit of work: a claimed pool slot *s and a leased token batch *t. Returns 1 with both held, 0 to ask again
 * (the batch was held back or dropped), -1 when the job finished, -2 (message in err) when the batch does not fit
 * the ring's geometry. */
static int next_work(target_run *r, int *s, int *t, errbuf *err)
{
    worker_ctx *w = r->w;
    if ((*s = wait_slot(r, 0)) < 0) return -1;
    if ((*t = wait_slot(r, 1)) < 0) {
        slot_pool_abandon(r->pool, *s, r->owner, w->epoch);
        return -1;
    }
    int bad = token_ring_slot_check(r->ring, *t, err);
    uint64_t id = token_ring_batch(r->ring, *t).meta->batch_id;
    if (bad || job_state_batch_held(&w->js, id)) { /* broken, or paused (beyond the step in flight) */
        token_ring_unlease(r->ring, *t, r->owner, w->epoch);
        slot_pool_abandon(r->pool, *s, r->owner, w->epoch);
        if (bad) return -2;
        uint32_t seen = atomic_load(&w->js.h->gen);
        job_state_wait(&w->js, seen, 200);
        return 0;
    }
    if (id < step_plan_first_batch(&w->js.h->plan, atomic_load(&w->js.h->committed_step))) { /* re-delivered after a crash, already trained */
        log_info("batch %llu already committed: dropped", (unsigned long long)id);
        token_ring_release(r->ring, *t, r->owner, w->epoch);
        slot_pool_abandon(r->pool, *s, r->owner, w->epoch);
        return 0;
    }
    return 1;
}

/* The slot's token part from batch b: input_ids, positions (restarting at each sequence), cu_seqlens, loss_mask,
 * laid out as in the slot from offset p->slot.input_ids (tok points at that offset, host memory). Returns the
 * forward's view of them. */
static target_batch fill_tokens(const job_plan *p, char *tok, const struct token_batch *b)
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
    return (target_batch){.ntok = T, .nseq = S, .input_ids = ids, .positions = pos, .cu_seqlens = cu};
}

/* After batch b's forward, with r->bad[] set per tap: 0 when every tap is finite, else an error naming the shallowest
 * tapped layer that is not (where it first shows) and the first weight that is not finite; r->poisoned is set. */
static int taps_check(target_run *r, const struct token_batch *b, errbuf *err)
{
    const job_plan *p = r->p;
    int k = -1;
    for (int i = 0; i < p->ntaps; i++)
        if (r->bad[i] && (k < 0 || p->drafter.taps[i] < p->drafter.taps[k])) k = i;
    if (k < 0) return 0;
    char why[400];
    weights_explain_nonfinite(p->cfg.target.model, why, sizeof why);
    r->poisoned = 1;
    return errbuf_set(err, ERANGE, "the target's hidden state tapped after layer %d (tap %d of %d) is not finite "
                      "(NaN or inf) in batch %llu: %s", p->drafter.taps[k], k + 1, p->ntaps,
                      (unsigned long long)b->meta->batch_id, why);
}

/* Descriptor fields, then READY (the payload is complete: written by this thread, or by a completed CUDA event). */
static int publish_slot(target_run *r, int s, const struct token_batch *b)
{
    struct slot_pool_desc *d = slot_pool_desc(r->pool, s);
    d->batch_id = b->meta->batch_id;
    d->ntok = b->meta->ntok;
    d->nseq = b->meta->nseq;
    d->bytes_used = r->p->slot.bytes;
    int rc = slot_pool_publish(r->pool, s, r->owner, r->w->epoch);
    if (rc) log_error("publish of batch %llu: %s (slot reclaimed?)", (unsigned long long)d->batch_id, strerror(-rc));
    return rc;
}

/* The worker loop of every backend: attach the pool, load, then claim a slot, lease a batch, forward, publish,
 * until the job finishes. Returns the process's exit status. */
static int run(target_run *r, const target_backend *be)
{
    worker_ctx *w = r->w;
    const job_plan *p = r->p;
    errbuf err = {{0}};
    int ret = 1;
    if (be->attach(r, &err)) {
        log_error("%s", err.msg);
        goto out;
    }
    if (slot_pool_slot_bytes(r->pool) < p->slot.bytes) {
        log_error("%s: slots of %llu bytes, %zu needed", r->pool_name,
                  (unsigned long long)slot_pool_slot_bytes(r->pool), p->slot.bytes);
        goto out;
    }
    if (be->load(r, &err)) {
        log_error("%s", err.msg);
        goto out;
    }
    worker_ready(w, "running");
    ret = 0;
    while (!worker_job_finished(w)) {
        if (worker_restart_requested(w)) {
            log_info("restart requested by dflashd");
            ret = JOB_EXIT_RESTART;
            break;
        }
        int s, t, got = next_work(r, &s, &t, &err);
        if (got == -2) {
            log_error("%s", err.msg);
            ret = 1;
            break;
        }
        if (got < 0) break;
        if (got == 0) continue;
        struct token_batch b = token_ring_batch(r->ring, t);
        uint64_t id = b.meta->batch_id;
        if (be->forward(r, s, &b, &err)) {
            log_error("batch %llu: %s", (unsigned long long)id, err.msg);
            ret = r->poisoned ? JOB_EXIT_FATAL : 1; /* the next instance would compute the same: give up */
            break;
        }
        if (publish_slot(r, s, &b)) {
            ret = 1;
            break;
        }
        token_ring_release(r->ring, t, r->owner, w->epoch);
        worker_count_batch(w, (uint64_t)b.meta->ntok);
        log_debug("batch %llu: %u tokens published in slot %d", (unsigned long long)id, b.meta->ntok, s);
    }
out:
    be->close(r);
    slot_pool_destroy(&r->pool);
    return ret;
}

/* ---- the cpu backend: the pool is a memfd mapped here; the forward writes fp32 taps into the slot ---- */

static int cpu_attach(target_run *r, errbuf *err)
{
    if (r->w->nfds != 1)
        return errbuf_set(err, EPROTO, "%s: keeper passed %d pool fds, expected 1", r->pool_name, r->w->nfds);
    return slot_pool_attach(r->pool_name, r->w->fds[0], &r->pool, err);
}

static int cpu_load(target_run *r, errbuf *err)
{
    const job_plan *p = r->p;
    int rc = target_model_load(&r->tm, p->cfg.target.model, r->deepest, err);
    if (!rc) log_info("target %s loaded up to layer %d; taps %d", p->cfg.target.model, r->deepest, p->ntaps);
    return rc;
}

static int cpu_forward(target_run *r, int s, const struct token_batch *b, errbuf *err)
{
    const job_plan *p = r->p;
    char *slot = slot_pool_data(r->pool, s);
    target_batch tb = fill_tokens(p, slot + p->slot.input_ids, b);
    float *aux = (float *)(slot + p->slot.aux); /* (T, K*H) */
    int rc = target_model_forward(r->tm, &tb, p->drafter.taps, p->ntaps, aux, NULL, NULL, err);
    if (rc) return rc;
    memset(r->bad, 0, sizeof r->bad);
    nonfinite_groups_cpu(r->bad, aux, p->ntaps * p->hidden, tb.ntok, p->ntaps, p->hidden);
    return taps_check(r, b, err);
}

static void cpu_close(target_run *r) { target_model_destroy(&r->tm); }

static const target_backend cpu_backend = {cpu_attach, cpu_load, cpu_forward, cpu_close};

#ifdef DFLASH_CUDA
/* ---- the cuda backend: the pool lives in GPU memory; per batch the tokens go into the slot, the forward writes its
 * bf16 taps straight into the slot's aux (row stride K*H), and the slot is complete once the event behind that work
 * has (cudaEventSynchronize on that event, never a device-wide wait). No allocation per batch. ---- */

/* Re-import the deposited allocation on the GPU its UUID names (restart), or create one on GPU `index` and deposit
 * it with dflashd (first start). Leaves that GPU current. */
static int cuda_attach(target_run *r, errbuf *err)
{
    worker_ctx *w = r->w;
    uint8_t uuid[16];
    uint64_t bytes = 0;
    int dev = -1, rc;
    if ((rc = slot_pool_attach_control(r->pool_name, &r->pool, err))) return rc;
    if (w->nfds == 1) {
        if (slot_pool_device(r->pool, uuid, &bytes))
            return errbuf_set(err, EPROTO, "keeper passed a pool fd but the pool records no GPU");
        if ((rc = vmm_device_by_uuid(uuid, &dev, err))) return errbuf_wrap(err, rc, "pool %d", w->index);
        CHECK_CUDA(cudaSetDevice(dev));
        if ((rc = vmm_alloc_attach(dev, w->fds[0], (size_t)bytes, &r->va, err))) return rc;
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
    size_t need = (size_t)slot_pool_nslots(r->pool) * slot_pool_slot_bytes(r->pool);
    int fd = -1;
    if ((rc = vmm_alloc_create(dev, need, &r->va, err)) || (rc = vmm_device_uuid(dev, uuid, err)) ||
        (rc = vmm_alloc_export_fd(r->va, &fd, err)))
        return rc;
    rc = keeper_deposit_memory(r->p->keeper_socket, KEEPER_DEPOSIT_POOL, w->index, w->epoch, fd, uuid, r->va->size,
                               30.0, err);
    close(fd);
    if (rc) return rc;
    log_info("created and deposited pool %d: %zu bytes on GPU %d", w->index, r->va->size, dev);
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

/* The model in device memory kept by dflashd (target.keep_weights): the deposited allocation when it lives on this
 * GPU (re-imported as it is when it holds this checkpoint and layout, else loaded again), or a new one, deposited. */
static int cuda_load_kept(target_run *r, errbuf *err)
{
    const job_plan *p = r->p;
    worker_ctx *w = r->w;
    char ident[1280];
    int rc, dev, kdev = -1;
    if ((rc = job_identity_checkpoint(p->cfg.target.model, ident, sizeof ident, err))) return rc;
    CHECK_CUDA(cudaGetDevice(&dev));
    target_cuda_keep keep = {.identity = ident, .fd = -1};
    char elsewhere[128] = "";
    if (w->weights_fd >= 0) {
        const job_train_state *t = &w->js.h->target_weights[w->index];
        if (vmm_device_by_uuid(t->device_uuid, &kdev, err) || kdev != dev)
            snprintf(elsewhere, sizeof elsewhere, "the deposited weights live on %s, this target runs on GPU %d",
                     kdev < 0 ? "no visible GPU" : "another GPU", dev);
        else
            keep.fd = w->weights_fd, keep.bytes = (size_t)t->bytes;
    }
    double t0 = now_seconds();
    if ((rc = target_cuda_load_kept(&r->tc, p->cfg.target.model, r->deepest, (int)p->ring.max_tokens,
                                    (int)p->ring.max_seqs, NULL, &keep, err)))
        return rc;
    double dt = now_seconds() - t0;
    if (keep.result == TARGET_KEEP_REIMPORTED) {
        log_info("re-imported the target's weights from dflashd: %zu bytes on GPU %d, %s, in %.3f s", keep.bytes, dev,
                 ident, dt);
        return 0;
    }
    if (elsewhere[0]) log_warn("the deposited target weights were not reused: %s", elsewhere);
    if (keep.result == TARGET_KEEP_RELOADED) {
        log_info("reloaded the target's weights from %s into the deposited allocation in %.2f s", p->cfg.target.model,
                 dt);
        return 0;
    }
    int fd = -1;
    size_t bytes = 0;
    uint8_t uuid[16];
    if ((rc = vmm_device_uuid(dev, uuid, err)) || (rc = target_cuda_keep_export(r->tc, &fd, &bytes, err))) return rc;
    rc = keeper_deposit_memory(p->keeper_socket, KEEPER_DEPOSIT_WEIGHTS, w->index, w->epoch, fd, uuid, bytes, 30.0,
                               err);
    close(fd);
    if (!rc) log_info("loaded the target's weights in %.2f s and deposited them with dflashd: %zu bytes on GPU %d",
                      dt, bytes, dev);
    return rc;
}

static int cuda_load(target_run *r, errbuf *err)
{
    const job_plan *p = r->p;
    int rc = p->cfg.target.keep_weights
                 ? cuda_load_kept(r, err)
                 : target_cuda_load(&r->tc, p->cfg.target.model, r->deepest, (int)p->ring.max_tokens,
                                    (int)p->ring.max_seqs, NULL, err);
    if (rc || (rc = gpu_warm_up(r->tc, p, err))) return rc;
    /* pinned: the slot's token part, uploaded with one copy */
    CHECK_CUDA(cudaMallocHost((void **)&r->stage, p->slot.bytes - p->slot.input_ids));
    CHECK_CUDA(cudaEventCreateWithFlags(&r->done, cudaEventDisableTiming));
    CHECK_CUDA(cudaMalloc((void **)&r->d_bad, sizeof(uint32_t) * (size_t)p->ntaps));
    CHECK_CUDA(cudaMallocHost((void **)&r->h_bad, sizeof(uint32_t) * (size_t)p->ntaps));
    log_info("target %s on the GPU up to layer %d; taps %d; %.1f MiB of weights and workspaces",
             p->cfg.target.model, r->deepest, p->ntaps, (double)target_cuda_device_bytes(r->tc) / (1 << 20));
    return 0;
}

static int cuda_forward(target_run *r, int s, const struct token_batch *b, errbuf *err)
{
    const job_plan *p = r->p;
    cudaStream_t st = (cudaStream_t)target_cuda_stream(r->tc);
    char *slot = (char *)(uintptr_t)r->va->ptr + (size_t)s * slot_pool_slot_bytes(r->pool);
    target_batch tb = fill_tokens(p, r->stage, b);
    CHECK_CUDA(cudaMemcpyAsync(slot + p->slot.input_ids, r->stage, p->slot.bytes - p->slot.input_ids,
                               cudaMemcpyHostToDevice, st));
    uint16_t *aux = (uint16_t *)(slot + p->slot.aux); /* (T, K*H) bf16 */
    int rc = target_cuda_forward(r->tc, &tb, p->drafter.taps, p->ntaps, aux, p->ntaps * p->hidden, NULL, NULL, err);
    if (rc) return rc;
    /* a flag per tap on the device, read back with the slot's completion: no extra synchronisation */
    CHECK_CUDA(cudaMemsetAsync(r->d_bad, 0, sizeof(uint32_t) * (size_t)p->ntaps, st));
    nonfinite_groups_cuda(r->d_bad, aux, p->ntaps * p->hidden, tb.ntok, p->ntaps, p->hidden, st);
    CHECK_CUDA(cudaMemcpyAsync(r->h_bad, r->d_bad, sizeof(uint32_t) * (size_t)p->ntaps, cudaMemcpyDeviceToHost, st));
    CHECK_CUDA(cudaEventRecord(r->done, st));
    CHECK_CUDA(cudaEventSynchronize(r->done)); /* the slot's payload (and the stage's upload) is complete */
    for (int i = 0; i < p->ntaps; i++) r->bad[i] = r->h_bad[i];
    return taps_check(r, b, err);
}

static void cuda_close(target_run *r)
{
    if (r->done) CHECK_CUDA(cudaEventDestroy(r->done));
    if (r->d_bad) CHECK_CUDA(cudaFree(r->d_bad));
    if (r->h_bad) CHECK_CUDA(cudaFreeHost(r->h_bad));
    if (r->stage) CHECK_CUDA(cudaFreeHost(r->stage));
    target_cuda_destroy(&r->tc);
    vmm_alloc_destroy(&r->va);
}

static const target_backend cuda_backend = {cuda_attach, cuda_load, cuda_forward, cuda_close};
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
    const target_backend *be = &cpu_backend;
    if (p->slot.gpu) {
#ifdef DFLASH_CUDA
        be = &cuda_backend;
#else
        log_error("%s: job.backend = cuda needs dflash-target-cuda (this is the cpu build)", p->cfg.target.model);
        return 1;
#endif
    }
    target_run r = {.w = &w, .p = p, .owner = (uint16_t)(1 + w.index), .pool_name = pool_name};
    for (int i = 0; i < p->ntaps; i++)
        if (p->drafter.taps[i] > r.deepest) r.deepest = p->drafter.taps[i];
    if (token_ring_open(p->ring_name, &p->ring, &r.ring, &err)) {
        log_error("%s", err.msg);
        return 1;
    }
    if ((rc = run(&r, be))) return rc;
    log_info("job finished");
    token_ring_destroy(&r.ring);
    worker_stop(&w);
    return 0;
}

/* GPU system test consumer (tests/gpu/gpu_pipeline.sh): registers with dflashd as drafter-0 of a job.backend = cuda
 * job (so it gets every pool's VMM fd once every target has deposited its pool), imports the pools on the GPU their
 * UUID names, and leases READY slots in batch-id order 0..N-1. For each it copies the slot to the host, checks the
 * token part (cu_seqlens, positions restarting per sequence, ids in the vocabulary) and compares the bf16 taps with
 * the CPU forward (target_model_forward) on the slot's own tokens, tolerances as in test_target_gpu.c; then releases
 * the slot. With -K a,b,... it SIGKILLs target-0 after releasing batch a (b, ...) at a moment when a slot of its pool
 * is FILLING (the target holds a slot and a token batch), for the script to restart it. After N batches it marks the
 * job finished so the workers exit. Prints "ok"/"FAIL" lines; exit 0 only
 * when every batch arrived once, in order, and checked out. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "job_plan.h"
#include "job_state.h"
#include "keeper_proto.h"
#include "log.h"
#include "slot_pool.h"
#include "target_model.h"
#include "vmm_pool_cuda.h"

/* ‖gpu − cpu‖/‖cpu‖ and max|gpu − cpu| / max(1, max|cpu|), as test_target_gpu.c: bf16 weights 2e-2, fp32 weights
 * (rounded to bf16 on the GPU) 3e-2; max 6e-2. */
#define TOL_NORM_REL_BF16 2e-2
#define TOL_NORM_REL_F32 3e-2
#define TOL_MAX_REL 6e-2
#define OWNER 100 /* drafter rank 0's owner id, as services/drafter */

typedef struct consumer {
    job_plan plan;
    job_state js;
    job_worker *entry;
    uint64_t epoch;
    int npools;
    struct slot_pool *pools[64];
    vmm_alloc *va[64];
    target_model *tm;
    double tol_norm;
} consumer;

static int setup(consumer *c, const char *config, errbuf *err)
{
    job_plan *p = &c->plan;
    int rc = job_plan_load(p, config, NULL, 0, err);
    if (rc) return rc;
    if (!p->slot.gpu) return errbuf_set(err, EINVAL, "%s: job.backend is not cuda", config);
    keeper_reply rp;
    int fds[64];
    if ((rc = keeper_register(p->keeper_socket, JOB_ROLE_DRAFTER, 0, &rp, fds, 64, 300.0, err))) return rc;
    c->epoch = rp.epoch;
    c->npools = (int)rp.npools;
    if (c->npools != p->cfg.workers.targets)
        return errbuf_set(err, EPROTO, "keeper passed %d pool fds for %d targets", c->npools, p->cfg.workers.targets);
    if ((rc = job_state_open(&c->js, p->state_name, (uint32_t)p->cfg.workers.drafters, p->numel, err))) return rc;
    c->entry = job_state_worker(&c->js, JOB_ROLE_DRAFTER, 0);
    job_worker_heartbeat(c->entry);
    for (int i = 0; i < c->npools; i++) {
        char name[128];
        uint8_t uuid[16];
        uint64_t bytes;
        int dev;
        job_plan_pool_name(p, i, name, sizeof name);
        if ((rc = slot_pool_attach_control(name, &c->pools[i], err))) return rc;
        if (slot_pool_device(c->pools[i], uuid, &bytes)) return errbuf_set(err, EPROTO, "%s: no GPU recorded", name);
        for (uint32_t s = 0; s < slot_pool_nslots(c->pools[i]); s++)
            if (memcmp(slot_pool_desc(c->pools[i], (int)s)->device_uuid, uuid, 16))
                return errbuf_set(err, EPROTO, "%s: slot %u's descriptor names another GPU", name, s);
        if ((rc = vmm_device_by_uuid(uuid, &dev, err))) return rc;
        CHECK_CUDA(cudaSetDevice(dev));
        if ((rc = vmm_alloc_attach(dev, fds[i], (size_t)bytes, &c->va[i], err))) return rc;
        close(fds[i]);
        printf("ok gpu_consumer_import_pool_%d %llu bytes on GPU %d (found by UUID)\n", i,
               (unsigned long long)bytes, dev);
    }
    int deepest = 0;
    for (int i = 0; i < p->ntaps; i++)
        if (p->drafter.taps[i] > deepest) deepest = p->drafter.taps[i];
    if ((rc = target_model_load(&c->tm, p->cfg.target.model, deepest, err))) return rc;
    c->tol_norm = strcmp(p->target.torch_dtype, "bfloat16") ? TOL_NORM_REL_F32 : TOL_NORM_REL_BF16;
    return 0;
}

/* Lease the READY slot with the lowest batch id from any pool, feeding the heartbeat; -ETIMEDOUT after wait_sec. */
static int lease_next(consumer *c, int *pool, double wait_sec)
{
    double until = now_seconds() + wait_sec;
    while (now_seconds() < until) {
        job_worker_heartbeat(c->entry);
        int best = -1;
        uint64_t best_id = UINT64_MAX, ids[SLOT_POOL_MAX_SLOTS];
        for (int i = 0; i < c->npools; i++) {
            int n = slot_pool_find_ready(c->pools[i], ids, SLOT_POOL_MAX_SLOTS);
            for (int j = 0; j < n && j < SLOT_POOL_MAX_SLOTS; j++)
                if (ids[j] < best_id) best_id = ids[j], best = i;
        }
        if (best < 0) {
            usleep(20000);
            continue;
        }
        int s = slot_pool_lease_batch(c->pools[best], best_id, OWNER, c->epoch, 0);
        if (s >= 0) {
            *pool = best;
            return s;
        }
    }
    return -ETIMEDOUT;
}

/* Check slot s of pool i (leased): token part, then taps against the CPU forward. 1 when it checks out. */
static int check_slot(consumer *c, int i, int s, uint64_t id, char *host, float *ref)
{
    const job_plan *p = &c->plan;
    const struct slot_pool_desc *d = slot_pool_desc(c->pools[i], s);
    int T = (int)d->ntok, S = (int)d->nseq, KH = p->ntaps * p->hidden;
    struct slot_pool_shape shape = {p->ring.max_tokens, p->ring.max_seqs, p->slot.cu_seqlens};
    errbuf err = {{0}};
    if (slot_pool_slot_check(c->pools[i], s, &shape, &err)) { /* GPU data: the descriptor only */
        printf("FAIL gpu_consumer_batch_%llu shape: %s\n", (unsigned long long)id, err.msg);
        return 0;
    }
    if (T < 1 || T > (int)p->ring.max_tokens || S < 1 || S > (int)p->ring.max_seqs || d->bytes_used != p->slot.bytes) {
        printf("FAIL gpu_consumer_batch_%llu descriptor: %d tokens, %d sequences, %llu bytes\n",
               (unsigned long long)id, T, S, (unsigned long long)d->bytes_used);
        return 0;
    }
    const size_t sb = slot_pool_slot_bytes(c->pools[i]);
    const char *slot = (const char *)(uintptr_t)c->va[i]->ptr + (size_t)s * sb;
    CHECK_CUDA(cudaMemcpy(host, slot, p->slot.bytes, cudaMemcpyDeviceToHost));
    const int32_t *ids = (const int32_t *)(host + p->slot.input_ids), *pos = (const int32_t *)(host + p->slot.positions);
    const int32_t *cu = (const int32_t *)(host + p->slot.cu_seqlens);
    int tok_ok = cu[0] == 0 && cu[S] == T;
    for (int q = 0; tok_ok && q < S; q++) {
        tok_ok = cu[q + 1] > cu[q];
        for (int t = cu[q]; tok_ok && t < cu[q + 1]; t++) tok_ok = pos[t] == t - cu[q] && ids[t] >= 0 && ids[t] < p->vocab;
    }
    if (!tok_ok) {
        printf("FAIL gpu_consumer_batch_%llu tokens: cu_seqlens/positions/ids inconsistent\n", (unsigned long long)id);
        return 0;
    }
    target_batch tb = {.ntok = T, .nseq = S, .input_ids = ids, .positions = pos, .cu_seqlens = cu};
    if (target_model_forward(c->tm, &tb, p->drafter.taps, p->ntaps, ref, NULL, NULL, &err)) {
        printf("FAIL gpu_consumer_batch_%llu cpu forward: %s\n", (unsigned long long)id, err.msg);
        return 0;
    }
    const uint16_t *aux = (const uint16_t *)(host + p->slot.aux);
    double se = 0, sr = 0, e = 0, mx = 0;
    int nan = 0;
    for (size_t k = 0; k < (size_t)T * KH; k++) {
        double g = bf16_to_f32(aux[k]), w = ref[k];
        if (isnan(g)) nan = 1;
        se += (g - w) * (g - w), sr += w * w;
        e = fmax(e, fabs(g - w)), mx = fmax(mx, fabs(w));
    }
    double nr = sr > 0 ? sqrt(se / sr) : sqrt(se), maxrel = e / fmax(1.0, mx);
    int ok = !nan && nr <= c->tol_norm && maxrel <= TOL_MAX_REL;
    printf("%s gpu_consumer_batch_%llu pool %d slot %d: %d tokens in %d sequences, taps norm_rel=%.3g (tol %.0e) "
           "max_err/max(1,max|ref|)=%.3g (tol %.0e)\n", ok ? "ok" : "FAIL", (unsigned long long)id, i, s, T, S, nr,
           c->tol_norm, maxrel, TOL_MAX_REL);
    fflush(stdout);
    return ok;
}

/* SIGKILL target-0 while its pool has a FILLING slot (polled; the target claims the slot just released at once). */
static int kill_target_filling(consumer *c, int nth)
{
    double until = now_seconds() + 20;
    while (now_seconds() < until) {
        int filling = 0;
        for (int i = 0; i < c->npools; i++) {
            int f;
            slot_pool_stats(c->pools[i], NULL, &f, NULL, NULL);
            filling += f;
        }
        pid_t pid = atomic_load(&job_state_worker(&c->js, JOB_ROLE_TARGET, 0)->pid);
        if (filling && pid > 0 && kill(pid, SIGKILL) == 0) {
            printf("ok gpu_consumer_kill_%d target-0 pid %d SIGKILLed with a slot FILLING\n", nth, (int)pid);
            fflush(stdout);
            return 1;
        }
        job_worker_heartbeat(c->entry);
        sched_yield();
    }
    printf("FAIL gpu_consumer_kill_%d: no FILLING slot of target-0 seen within 20 s\n", nth);
    return 0;
}

int main(int argc, char **argv)
{
    const char *config = NULL;
    long n = 0;
    double wait_sec = 300;
    long kill_at[16];
    int nkill = 0, o;
    while ((o = getopt(argc, argv, "c:n:w:K:")) != -1) {
        if (o == 'K') {
            for (char *q = optarg; *q && nkill < 16; q += *q == ',') kill_at[nkill++] = strtol(q, &q, 10);
        } else if (o == 'c') config = optarg;
        else if (o == 'n') n = strtol(optarg, NULL, 10);
        else if (o == 'w') wait_sec = strtod(optarg, NULL);
        else break;
    }
    if (!config || n < 1) {
        fprintf(stderr, "usage: slot_consumer -c CONFIG -n BATCHES [-w WAIT_SEC] [-K BATCH,...]\n");
        return 2;
    }
    log_init("slot-consumer", LOG_LEVEL_INFO);
    static consumer c;
    errbuf err = {{0}};
    if (setup(&c, config, &err)) {
        printf("FAIL gpu_consumer_setup: %s\n", err.msg);
        return 1;
    }
    const job_plan *p = &c.plan;
    char *host = xmalloc(p->slot.bytes);
    float *ref = xmalloc(sizeof(float) * p->ring.max_tokens * (size_t)p->ntaps * (size_t)p->hidden);
    int failed = 0;
    for (uint64_t k = 0; k < (uint64_t)n; k++) {
        int i = -1, s = lease_next(&c, &i, wait_sec);
        if (s < 0) {
            printf("FAIL gpu_consumer_batch_%llu: no READY slot within %.0f s\n", (unsigned long long)k, wait_sec);
            failed = 1;
            break;
        }
        uint64_t id = slot_pool_desc(c.pools[i], s)->batch_id;
        if (id != k) {
            printf("FAIL gpu_consumer_order: expected batch %llu, got %llu\n", (unsigned long long)k,
                   (unsigned long long)id);
            failed = 1;
            break;
        }
        if (!check_slot(&c, i, s, id, host, ref)) failed = 1;
        int rc = slot_pool_release(c.pools[i], s, OWNER, c.epoch);
        if (rc) {
            printf("FAIL gpu_consumer_release batch %llu: %s\n", (unsigned long long)id, strerror(-rc));
            failed = 1;
        }
        for (int j = 0; j < nkill; j++)
            if ((uint64_t)kill_at[j] == k && !kill_target_filling(&c, j + 1)) failed = 1;
    }
    /* nothing beyond N may have been published twice or out of order: what is READY now must be > N-1 */
    for (int i = 0; !failed && i < c.npools; i++) {
        uint64_t ids[SLOT_POOL_MAX_SLOTS];
        int m = slot_pool_find_ready(c.pools[i], ids, SLOT_POOL_MAX_SLOTS);
        for (int j = 0; j < m && j < SLOT_POOL_MAX_SLOTS; j++)
            if (ids[j] < (uint64_t)n) {
                printf("FAIL gpu_consumer_duplicate: batch %llu is READY again\n", (unsigned long long)ids[j]);
                failed = 1;
            }
    }
    if (!failed) printf("ok gpu_consumer_batches %ld batches, ids 0..%ld once each in order, taps within tolerance\n", n, n - 1);
    atomic_store(&c.js.h->finished, 1); /* the test's end: workers exit 0 */
    job_state_wake(&c.js);
    for (int i = 0; i < c.npools; i++) {
        vmm_alloc_destroy(&c.va[i]);
        slot_pool_destroy(&c.pools[i]);
    }
    target_model_destroy(&c.tm);
    job_state_close(&c.js);
    free(host);
    free(ref);
    return failed;
}

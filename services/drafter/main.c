/* dflash-drafter: one data-parallel rank of drafter training. Start, pick the model backend and the reducer, loop:
 * the step protocol is common/train/step.c, the training state lives in the reducer (common/train/reducer.h), the
 * forward and backward in the model backend (common/drafter/drafter.h). The CUDA build (dflash-drafter-cuda, this
 * file with DFLASH_CUDA) trains job.backend = cuda jobs on GPU <index>; the CPU build trains cpu jobs. */
#include <errno.h>
#include <stdio.h>

#include "drafter.h"
#include "log.h"
#include "reduce_shm.h"
#include "step.h"
#include "worker.h"
#ifdef DFLASH_CUDA
#include "batch_source_pools_cuda.h"
#include "drafter_cuda.h"
#include "reduce_cuda.h"
#endif

/* The backend, reducer and batch source of this build for the job's backend. */
static int open_parts(step_ctx *s, worker_ctx *w, const drafter_layout *layout, uint64_t at, errbuf *err)
{
    const job_plan *p = &w->plan;
    const drafter_train_config tc = {.drafter = &p->drafter, .max_anchors = p->cfg.drafter.max_anchors,
                                     .seed = (uint64_t)p->cfg.job.seed, .gamma = p->gamma};
    int rc;
    if (p->slot.gpu) {
#ifdef DFLASH_CUDA
        const int device = w->index;
        if ((rc = drafter_cuda_create(&s->model, &tc, p->cfg.target.model, device, (int)p->ring.max_tokens,
                                      (int)p->ring.max_seqs, err)))
            return rc;
        void *stream = drafter_cuda_stream(s->model);
        if ((rc = batch_source_pools_cuda_create(&s->src, w, device, stream, err))) return rc;
        if ((rc = reduce_cuda_open(&s->red, w, layout, at, device, stream, err))) return rc;
        return drafter_cuda_warm_up(s->model, s->red->ops->weights(s->red, at), err); /* before READY */
#else
        return errbuf_set(err, ENOTSUP, "job.backend = cuda: this is the CPU build, run dflash-drafter-cuda");
#endif
    }
    if ((rc = batch_source_pools_create(&s->src, w, NULL, err)) ||
        (rc = drafter_cpu_create(&s->model, &tc, p->cfg.target.model, err)))
        return rc;
    return reduce_shm_open(&s->red, w, layout, at, err);
}

int main(int argc, char **argv)
{
    static worker_ctx w;
    int done;
    int rc = worker_start(&w, JOB_ROLE_DRAFTER, argc, argv,
                          "Trains the drafter (one data-parallel rank) on published hidden-state slots.", &done);
    if (rc || done) return rc;
    const job_plan *p = &w.plan;
    errbuf err = {{0}};
    drafter_layout layout;
    drafter_layout_init(&layout, &p->drafter);
    step_ctx s = {.plan = p, .js = &w.js, .w = &w, .rank = w.index, .nranks = p->cfg.workers.drafters};
    const uint64_t at = atomic_load(&w.js.h->committed_step);
    if (open_parts(&s, &w, &layout, at, &err)) {
        log_error("%s", err.msg);
        return 1;
    }
    log_info("rank %d of %d: %zu parameters, %d pools, %s backend; at step %llu", s.rank, s.nranks, layout.numel,
             w.nfds, p->slot.gpu ? "cuda" : "cpu", (unsigned long long)at);
    worker_ready(&w, "training");
    rc = step_train(&s);
    if (rc == 0) log_info("job finished");
    batch_source_destroy(&s.src);
    reducer_destroy(&s.red);
    drafter_backend_destroy(&s.model);
    drafter_layout_destroy(&layout);
    worker_stop(&w);
    return rc;
}

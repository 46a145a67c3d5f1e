/* dflash-drafter: one data-parallel rank of drafter training. Start, pick the model backend and the reducer, loop:
 * the step protocol is common/train/step.c, the training state lives in the reducer (common/train/reducer.h), the
 * forward and backward in the model backend (common/model/drafter.h). */
#include <stdio.h>

#include "drafter.h"
#include "log.h"
#include "reduce_shm.h"
#include "step.h"
#include "worker.h"

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
    const drafter_train_config tc = {.drafter = &p->drafter, .max_anchors = p->cfg.drafter.max_anchors,
                                     .seed = (uint64_t)p->cfg.job.seed, .gamma = p->gamma};
    step_ctx s = {.plan = p, .js = &w.js, .w = &w, .rank = w.index, .nranks = p->cfg.workers.drafters};
    const uint64_t at = atomic_load(&w.js.h->committed_step);
    if ((rc = batch_source_pools_create(&s.src, &w, &err)) ||
        (rc = drafter_cpu_create(&s.model, &tc, p->cfg.target.model, &err)) ||
        (rc = reduce_shm_open(&s.red, &w, &layout, at, &err))) {
        log_error("%s", err.msg);
        return 1;
    }
    log_info("rank %d of %d: %zu parameters, %d pools; at step %llu", s.rank, s.nranks, layout.numel, w.nfds,
             (unsigned long long)at);
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

#include "train_init.h"

#include <errno.h>
#include <string.h>

#include "checkpoint.h"
#include "drafter_model.h"

int train_init_state(const job_plan *p, uint64_t step, optim_state s, errbuf *err)
{
    const size_t n = p->numel;
    if (step > 0) {
        char root[4096];
        job_config_path(&p->cfg, "ckpt", root, sizeof root);
        checkpoint_state st;
        int rc = checkpoint_read(root, NULL, s.w, s.m, s.v, n, &st, err);
        if (rc) return errbuf_wrap(err, rc, "training state of step %llu", (unsigned long long)step);
        if (st.step != step)
            return errbuf_set(err, ESTALE, "%s/latest holds step %llu, the job resumes at step %llu", root,
                              (unsigned long long)st.step, (unsigned long long)step);
        return 0;
    }
    memset(s.m, 0, sizeof(float) * n);
    memset(s.v, 0, sizeof(float) * n);
    if (p->cfg.drafter.init[0]) {
        drafter_model *dm = NULL;
        int rc = drafter_model_load(&dm, p->cfg.drafter.init, &p->target, err);
        if (rc) return errbuf_wrap(err, rc, "drafter.init");
        DF_ASSERT(drafter_numel(dm) == n);
        memcpy(s.w, drafter_weights(dm), sizeof(float) * n);
        drafter_model_destroy(&dm);
        return 0;
    }
    drafter_layout L;
    drafter_layout_init(&L, &p->drafter);
    DF_ASSERT(L.numel == n);
    drafter_layout_init_weights(&L, s.w, (uint64_t)p->cfg.job.seed);
    drafter_layout_destroy(&L);
    return 0;
}

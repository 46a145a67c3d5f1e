#include "job_plan.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "anchors.h"
#include "drafter_layout.h"
#include "target_family.h"
#include "target_model.h"

static size_t align64(size_t n) { return (n + 63) / 64 * 64; }

/* dir made absolute and canonical: the realpath of its longest existing ancestor, then the components that do not
 * exist yet. dflashd loads the plan before it creates run_dir and the workers after, and both must get the same. */
static void canonical_dir(const char *dir, char *out, size_t n)
{
    char abs[2 * PATH_MAX], head[2 * PATH_MAX], real[PATH_MAX];
    abs[0] = '\0';
    if (dir[0] != '/' && !getcwd(abs, sizeof abs)) abs[0] = '\0';
    size_t k = strlen(abs);
    snprintf(abs + k, sizeof abs - k, "/%s", dir);
    /* no repeated or trailing slashes, so that the part that does not exist yet reads the same later */
    char *w = abs;
    for (const char *r = abs; *r; r++)
        if (!(*r == '/' && (r[1] == '/' || r[1] == '\0') && w > abs)) *w++ = *r;
    *w = '\0';
    snprintf(head, sizeof head, "%s", abs);
    while (!realpath(head, real)) {
        char *slash = strrchr(head, '/');
        if (!slash || slash == head) {
            snprintf(real, sizeof real, "/");
            head[0] = '\0';
            break;
        }
        *slash = '\0';
    }
    const char *tail = abs + strlen(head);
    snprintf(out, n, "%s%s", strcmp(real, "/") == 0 && tail[0] ? "" : real, tail);
}

/* FNV-1a, folded to 32 bits: the run_dir part of the segment names. */
static uint32_t name_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return (uint32_t)(h ^ (h >> 32));
}

/* The segment names of the job (see the header). */
static int plan_names(job_plan *p, const char *config_path, errbuf *err)
{
    const char *name = p->cfg.job.name;
    if (!name[0] || strchr(name, '/'))
        return errbuf_set(err, EINVAL, "%s: job.name \"%s\": must be non-empty and without '/' (it is part of the "
                          "shared-memory segment names)", config_path, name);
    canonical_dir(p->cfg.job.run_dir, p->run_dir, sizeof p->run_dir);
    snprintf(p->shm_prefix, sizeof p->shm_prefix, "/dflash-%.64s-%08x", name, name_hash(p->run_dir));
    snprintf(p->state_name, sizeof p->state_name, "%s-state", p->shm_prefix);
    snprintf(p->ring_name, sizeof p->ring_name, "%s-tokens", p->shm_prefix);
    return 0;
}

/* A fresh drafter: the target's attention/MLP shapes, the job's drafter settings. */
static int derive_drafter(job_plan *p, errbuf *err)
{
    const job_config *c = &p->cfg;
    hf_config *d = &p->drafter;
    *d = p->target;
    d->is_dflash = 1;
    d->num_layers = c->drafter.layers;
    d->block_size = c->drafter.block_size;
    d->num_target_layers = p->target.num_layers;
    d->mask_token_id = c->drafter.mask_token_id >= 0 ? c->drafter.mask_token_id : hf_reserved_token(&p->target, NULL);
    hf_config_as_qwen3(d); /* a Qwen3-style drafter whatever the target's family (hybrid fields dropped) */
    memset(d->layer_sliding, 0, sizeof d->layer_sliding); /* drafter.layer_types (job_config_load checked them) */
    memcpy(d->layer_sliding, c->drafter.sliding, (size_t)c->drafter.nlayer_types);
    d->sliding_window = c->drafter.sliding_window;
    if (c->drafter.taps.n > 0) {
        for (int i = 0; i < c->drafter.taps.n; i++)
            for (int j = 0; j < i; j++)
                if (c->drafter.taps.v[i] == c->drafter.taps.v[j])
                    return errbuf_set(err, EINVAL, "drafter.taps: layer %d is listed twice (taps %d and %d of the "
                                      "list): each tapped layer once", c->drafter.taps.v[i], j + 1, i + 1);
        d->num_taps = c->drafter.taps.n;
        memcpy(d->taps, c->drafter.taps.v, sizeof(int) * (size_t)d->num_taps);
    } else {
        if (c->drafter.num_taps > p->target.num_layers)
            return errbuf_set(err, EINVAL, "drafter.num_taps = %d is more than the %d layers of the target %s: the "
                              "taps would repeat layers", c->drafter.num_taps, p->target.num_layers, c->target.model);
        d->num_taps = c->drafter.num_taps;
        target_default_taps(p->target.num_layers, d->num_taps, d->taps);
    }
    for (int i = 0; i < d->num_taps; i++)
        if (d->taps[i] < 0 || d->taps[i] >= p->target.num_layers)
            return errbuf_set(err, EINVAL, "drafter.taps: layer %d outside the target's %d layers", d->taps[i],
                              p->target.num_layers);
    if (d->mask_token_id >= p->target.vocab_size)
        return errbuf_set(err, EINVAL, "drafter.mask_token_id: %d outside the target vocabulary (%d)",
                          d->mask_token_id, p->target.vocab_size);
    return 0;
}

/* drafter.layer_types / sliding_window, when given with drafter.init, must be the checkpoint's own. */
static int check_init_windows(const job_config *c, const hf_config *d, errbuf *err)
{
    int differ = (c->drafter.nlayer_types > 0 && c->drafter.nlayer_types != d->num_layers) ||
                 (c->drafter.sliding_window > 0 && c->drafter.sliding_window != d->sliding_window);
    for (int i = 0; i < c->drafter.nlayer_types && !differ; i++) differ = c->drafter.sliding[i] != d->layer_sliding[i];
    if (!differ) return 0;
    char have[160] = "";
    for (int i = 0, o = 0; i < d->num_layers && o < (int)sizeof have - 24; i++)
        o += snprintf(have + o, sizeof have - (size_t)o, "%s%s", i ? "," : "", d->layer_sliding[i] ? "sliding" : "full");
    return errbuf_set(err, EINVAL, "drafter.layer_types = \"%s\", drafter.sliding_window = %d disagree with "
                      "drafter.init %s (layer_types %s, sliding_window %d): leave them empty to take the "
                      "checkpoint's", c->drafter.layer_types, c->drafter.sliding_window, c->drafter.init, have,
                      d->sliding_window);
}

int job_plan_load(job_plan *p, const char *config_path, const char *const *overrides, int noverrides, errbuf *err)
{
    memset(p, 0, sizeof *p);
    int rc = job_config_load(&p->cfg, config_path, overrides, noverrides, err);
    if (rc) return rc;
    const job_config *c = &p->cfg;
    if (!c->target.model[0]) return errbuf_set(err, EINVAL, "%s: target.model is not set", config_path);
    if (!c->data.path[0]) return errbuf_set(err, EINVAL, "%s: data.path is not set", config_path);
    if ((rc = plan_names(p, config_path, err))) return rc;
    if ((rc = hf_config_load(&p->target, c->target.model, err))) return errbuf_wrap(err, rc, "target.model");
    /* the target's family runs on the job's backend (its row says; the message names the family) */
    if ((rc = target_family_require(&p->target, c->job.backend == JOB_BACKEND_CUDA ? TARGET_BACKEND_CUDA
                                                                                  : TARGET_BACKEND_CPU,
                                    TARGET_CAN_FORWARD, "the target forward", NULL, err)))
        return errbuf_wrap(err, rc, "target.model %s", c->target.model);
    if (c->drafter.init[0]) {
        if ((rc = hf_config_load(&p->drafter, c->drafter.init, err))) return errbuf_wrap(err, rc, "drafter.init");
        if (!p->drafter.is_dflash)
            return errbuf_set(err, EINVAL, "drafter.init %s: not a DFlash drafter config", c->drafter.init);
        if (p->drafter.hidden_size != p->target.hidden_size || p->drafter.vocab_size != p->target.vocab_size)
            return errbuf_set(err, EINVAL, "drafter.init %s: hidden size %d / vocab %d disagree with the target's "
                              "%d / %d", c->drafter.init, p->drafter.hidden_size, p->drafter.vocab_size,
                              p->target.hidden_size, p->target.vocab_size);
        if ((rc = check_init_windows(c, &p->drafter, err))) return rc;
    } else if ((rc = derive_drafter(p, err))) {
        return errbuf_wrap(err, rc, "%s", config_path);
    }
    p->ntaps = p->drafter.num_taps;
    p->hidden = p->target.hidden_size;
    p->vocab = p->target.vocab_size;
    p->gamma = c->drafter.gamma > 0 ? c->drafter.gamma : drafter_default_gamma(p->drafter.block_size);
    p->numel = drafter_layout_numel(&p->drafter);
    p->ring.nslots = (uint32_t)c->ring.token_slots;
    p->ring.max_tokens = (uint32_t)c->data.max_batch_tokens;
    p->ring.max_seqs = (uint32_t)(c->data.max_batch_seqs < c->data.max_batch_tokens ? c->data.max_batch_seqs
                                                                                      : c->data.max_batch_tokens);
    size_t T = p->ring.max_tokens, S = p->ring.max_seqs, off = 0;
    p->slot.gpu = c->job.backend == JOB_BACKEND_CUDA;
    p->slot.aux_elem = p->slot.gpu ? sizeof(uint16_t) : sizeof(float);
    p->slot.aux = off;
    off = align64(off + T * (size_t)p->ntaps * (size_t)p->hidden * p->slot.aux_elem);
    p->slot.input_ids = off;
    off = align64(off + T * sizeof(int32_t));
    p->slot.positions = off;
    off = align64(off + T * sizeof(int32_t));
    p->slot.cu_seqlens = off;
    off = align64(off + (S + 1) * sizeof(int32_t));
    p->slot.loss_mask = off;
    off = align64(off + T);
    p->slot.bytes = off;
    job_config_path(c, "keeper.sock", p->keeper_socket, sizeof p->keeper_socket);
    return 0;
}

void job_plan_pool_name(const job_plan *p, int i, char *out, size_t n)
{
    snprintf(out, n, "%s-pool-%d", p->shm_prefix, i);
}

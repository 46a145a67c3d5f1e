#include "run_record.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "anchors.h"
#include "config.h"
#include "job_state.h"
#include "json_util.h"

/* Batch b's content: the data (the record's second part), job.seed and the batch limits (batch_plan), the anchors
 * and blocks drawn in it (anchors: seed, max_anchors, block size, mask token). Which batches make step k is the
 * record's plan (step_plan): the numbers of drafters and targets may change on a resume (run_record_resume). */
const char *const run_record_plan_keys[] = {
    "job.seed",          "data.max_batch_tokens", "data.max_batch_seqs",   "drafter.block_size",
    "drafter.max_anchors", "drafter.mask_token_id", NULL,
};

#define SAFE_TO_CHANGE                                                                                              \
    "workers.drafters and workers.targets (the steps after the checkpoint use the new numbers), train.* (steps, lr, min_lr, warmup_steps, checkpoint_every, the optimizer settings), drafter.gamma, ring.*, "  \
    "the workers' timeouts, control.*, data.path to the same shards moved elsewhere"

void run_record_compute(run_record *r, const job_plan *p, const dataset *ds)
{
    memset(r, 0, sizeof *r);
    for (int i = 0; run_record_plan_keys[i]; i++) {
        DF_ASSERT(i < (int)(sizeof r->values / sizeof r->values[0]));
        config_get(job_config_table, &p->cfg, run_record_plan_keys[i], r->values[i], sizeof r->values[i]);
        r->nkeys = i + 1;
    }
    snprintf(r->data_path, sizeof r->data_path, "%s", p->cfg.data.path);
    step_plan_init(&r->plan, (uint32_t)p->cfg.workers.drafters, (uint32_t)p->cfg.workers.targets);
    r->nshards = dataset_nshards(ds);
    r->shards = xcalloc(r->nshards ? r->nshards : 1, sizeof *r->shards);
    for (size_t k = 0; k < r->nshards; k++) {
        const shard *s = dataset_shard(ds, k);
        const char *path = shard_path(s), *slash = strrchr(path, '/');
        snprintf(r->shards[k].name, sizeof r->shards[k].name, "%s", slash ? slash + 1 : path);
        snprintf(r->shards[k].path, sizeof r->shards[k].path, "%s", path);
        r->shards[k].bytes = shard_file_bytes(s);
        snprintf(r->shards[k].header_digest, sizeof r->shards[k].header_digest, "%016llx",
                 (unsigned long long)shard_header_digest(s));
    }
}

void run_record_free(run_record *r)
{
    free(r->shards);
    r->shards = NULL;
    r->nshards = 0;
}

void run_record_path(const job_plan *p, char *out, size_t n) { job_config_path(&p->cfg, "ckpt/run.json", out, n); }

int run_record_write(const run_record *r, const char *path, errbuf *err)
{
    json_t *settings = json_object(), *shards = json_array();
    for (int i = 0; i < r->nkeys; i++) json_object_set_new(settings, run_record_plan_keys[i], json_string(r->values[i]));
    for (size_t k = 0; k < r->nshards; k++)
        json_array_append_new(shards, json_pack("{s:s, s:I, s:s}", "name", r->shards[k].name, "bytes",
                                                (json_int_t)r->shards[k].bytes, "header_digest",
                                                r->shards[k].header_digest));
    json_t *plan = json_array();
    for (uint32_t i = 0; i < r->plan.n; i++) {
        const step_plan_segment *s = &r->plan.seg[i];
        json_array_append_new(plan, json_pack("{s:I, s:I, s:i, s:i}", "from_step", (json_int_t)s->from_step,
                                              "first_batch", (json_int_t)s->first_batch, "drafters", (int)s->drafters,
                                              "targets", (int)s->targets));
    }
    json_t *o = json_pack("{s:o, s:o, s:o}", "settings", settings, "plan", plan, "shards", shards);
    if (!o) return errbuf_set(err, ENOMEM, "%s: cannot build the run record", path);
    int rc = json_file_save(o, path, JSON_INDENT(2), err);
    json_decref(o);
    return rc;
}

/* The record's "plan": its segments in order; a record from before plans were recorded has one segment from its
 * settings' workers.drafters / workers.targets. */
static int read_plan(run_record *r, json_t *o, json_t *settings, const char *path, errbuf *err)
{
    json_t *plan = json_object_get(o, "plan");
    if (!plan) {
        const char *d = json_string_value(json_object_get(settings, "workers.drafters")),
                   *t = json_string_value(json_object_get(settings, "workers.targets"));
        if (!d || !t || atoi(d) < 1 || atoi(t) < 1)
            return errbuf_set(err, EINVAL, "%s: no \"plan\" and no settings workers.drafters / workers.targets", path);
        step_plan_init(&r->plan, (uint32_t)atoi(d), (uint32_t)atoi(t));
        return 0;
    }
    const size_t n = json_array_size(plan);
    if (!json_is_array(plan) || n == 0 || n > STEP_PLAN_MAX_SEGMENTS)
        return errbuf_set(err, EINVAL, "%s: \"plan\" must be a list of 1 to %d segments", path, STEP_PLAN_MAX_SEGMENTS);
    r->plan.n = (uint32_t)n;
    for (size_t i = 0; i < n; i++) {
        json_int_t from = 0, first = 0;
        int d = 0, t = 0;
        json_error_t je;
        if (json_unpack_ex(json_array_get(plan, i), &je, 0, "{s:I, s:I, s:i, s:i}", "from_step", &from,
                           "first_batch", &first, "drafters", &d, "targets", &t) != 0)
            return errbuf_set(err, EINVAL, "%s: plan[%zu]: %s", path, i, je.text);
        step_plan_segment *s = &r->plan.seg[i];
        *s = (step_plan_segment){(uint64_t)from, (uint64_t)first, (uint32_t)d, (uint32_t)t};
        const step_plan_segment *prev = i ? &r->plan.seg[i - 1] : NULL;
        int ok = from >= 0 && first >= 0 && d >= 1 && d <= JOB_MAX_DRAFTERS && t >= 1 && t <= JOB_MAX_TARGETS &&
                 (prev ? s->from_step > prev->from_step &&
                             s->first_batch == prev->first_batch + (s->from_step - prev->from_step) * prev->drafters
                       : from == 0 && first == 0);
        if (!ok)
            return errbuf_set(err, EINVAL, "%s: plan[%zu] (from_step %lld, first_batch %lld, %d drafters, %d targets) "
                              "does not continue the segment before it", path, i, (long long)from, (long long)first, d, t);
    }
    return 0;
}

int run_record_resume(const run_record *was, run_record *now, uint64_t step, uint64_t batches_committed,
                      const char *path, errbuf *err)
{
    const uint32_t D = now->plan.seg[0].drafters, T = now->plan.seg[0].targets;
    now->plan = was->plan;
    const uint64_t frontier = step_plan_first_batch(&now->plan, step);
    if (frontier != batches_committed)
        return errbuf_set(err, EINVAL, "--resume: the checkpoint of step %llu has %llu batches committed, but %s's plan "
                          "puts %llu batches before that step: the checkpoint is not this run's",
                          (unsigned long long)step, (unsigned long long)batches_committed, path,
                          (unsigned long long)frontier);
    int rc = step_plan_resume(&now->plan, step, D, T);
    if (rc == -E2BIG)
        return errbuf_set(err, E2BIG, "--resume: %s: the run has changed its number of workers %d times, the most a "
                          "run records", path, STEP_PLAN_MAX_SEGMENTS - 1);
    return rc;
}

int run_record_read(run_record *r, const char *path, errbuf *err)
{
    memset(r, 0, sizeof *r);
    json_error_t je;
    json_t *o;
    int lrc = json_file_load(&o, path, 0, err);
    if (lrc != 0) return lrc;
    json_t *settings = json_object_get(o, "settings"), *shards = json_object_get(o, "shards");
    int rc = 0;
    if (!json_is_object(settings) || !json_is_array(shards)) {
        rc = errbuf_set(err, EINVAL, "%s: expected {\"settings\": {...}, \"shards\": [...]}", path);
        goto done;
    }
    for (int i = 0; run_record_plan_keys[i]; i++) {
        const char *v = json_string_value(json_object_get(settings, run_record_plan_keys[i]));
        snprintf(r->values[i], sizeof r->values[i], "%s", v ? v : "(not recorded)");
        r->nkeys = i + 1;
    }
    if ((rc = read_plan(r, o, settings, path, err))) goto done;
    r->nshards = json_array_size(shards);
    r->shards = xcalloc(r->nshards ? r->nshards : 1, sizeof *r->shards);
    for (size_t k = 0; k < r->nshards; k++) {
        const char *name = NULL, *digest = NULL;
        json_int_t bytes = 0;
        if (json_unpack_ex(json_array_get(shards, k), &je, 0, "{s:s, s:I, s:s}", "name", &name, "bytes", &bytes,
                           "header_digest", &digest) != 0) {
            rc = errbuf_set(err, EINVAL, "%s: shards[%zu]: %s", path, k, je.text);
            run_record_free(r);
            goto done;
        }
        snprintf(r->shards[k].name, sizeof r->shards[k].name, "%s", name);
        r->shards[k].bytes = (uint64_t)bytes;
        snprintf(r->shards[k].header_digest, sizeof r->shards[k].header_digest, "%s", digest);
    }
done:
    json_decref(o);
    return rc;
}

int run_record_check_settings(const run_record *was, const run_record *now, const char *path, errbuf *err)
{
    for (int i = 0; i < now->nkeys && i < was->nkeys; i++) {
        if (!strcmp(was->values[i], now->values[i])) continue;
        char keys[512] = "";
        for (int k = 0; run_record_plan_keys[k]; k++)
            snprintf(keys + strlen(keys), sizeof keys - strlen(keys), "%s%s", k ? ", " : "", run_record_plan_keys[k]);
        const char *key = run_record_plan_keys[i];
        return errbuf_set(err, EINVAL, "--resume: %s = %s, but the run was started with %s = %s (%s): a resume keeps "
                          "every setting that decides which batches make a step or what a batch holds (%s, and the "
                          "data); resume with %s = %s, or start over with --fresh. Safe to change on a resume: "
                          SAFE_TO_CHANGE, key, now->values[i], key, was->values[i], path, keys, key, was->values[i]);
    }
    return 0;
}

int run_record_check_data(const run_record *was, const run_record *now, const char *path, const char *who,
                          errbuf *err)
{
    const char *fix = "restore the data set the job started with, or start over with --fresh";
    for (size_t k = 0; k < was->nshards || k < now->nshards; k++) {
        const run_record_shard *a = k < was->nshards ? &was->shards[k] : NULL;
        const run_record_shard *b = k < now->nshards ? &now->shards[k] : NULL;
        if (!b)
            return errbuf_set(err, EINVAL, "%s: the data set changed: shard %s (shard %zu of %zu) is missing from "
                              "data.path %s (%s records it): %s", who, a->name, k + 1, was->nshards, now->data_path,
                              path, fix);
        if (!a)
            return errbuf_set(err, EINVAL, "%s: the data set changed: shard %s is new (the job started with %zu "
                              "shards, %s): %s", who, b->path, was->nshards, path, fix);
        if (strcmp(a->name, b->name)) {
            const char *slash = strrchr(b->path, '/');
            return errbuf_set(err, EINVAL, "%s: the data set changed: shard %zu is %s, the job started with %.*s%s "
                              "(%s): %s", who, k + 1, b->path, slash ? (int)(slash - b->path + 1) : 0, b->path,
                              a->name, path, fix);
        }
        if (a->bytes != b->bytes || strcmp(a->header_digest, b->header_digest))
            return errbuf_set(err, EINVAL, "%s: the data set changed: shard %s is %llu bytes with header digest %s, "
                              "the job started with %llu bytes, digest %s (%s): %s", who, b->path,
                              (unsigned long long)b->bytes, b->header_digest, (unsigned long long)a->bytes,
                              a->header_digest, path, fix);
    }
    return 0;
}

int run_record_data_check(const job_plan *p, const dataset *ds, uint64_t *cut, uint64_t *longest, errbuf *err)
{
    const char *dpath = p->cfg.data.path;
    const uint64_t n = dataset_count(ds), T = (uint64_t)p->cfg.data.max_batch_tokens;
    *cut = *longest = 0;
    if (n == 0) return errbuf_set(err, EINVAL, "data.path %s: no samples in its %zu shard(s)", dpath, dataset_nshards(ds));
    int rc = dataset_check_vocab(ds, (uint32_t)p->vocab, err);
    if (rc) return errbuf_wrap(err, rc, "data.path (the target %s has %d ids)", p->cfg.target.model, p->vocab);
    uint64_t trainable = 0, need = UINT64_MAX; /* the fewest tokens that would make one sample trainable */
    for (uint64_t i = 0; i < n; i++) {
        const uint32_t *tok;
        const uint8_t *mask;
        uint64_t len;
        dataset_sample(ds, i, &tok, &mask, &len);
        *cut += len > T;
        if (len > *longest) *longest = len;
        uint64_t keep = len < T ? len : T;
        if (anchors_any(mask, (int64_t)keep)) {
            trainable++;
        } else if (keep < len) {
            for (uint64_t a = 0; a + 1 < len; a++)
                if (anchors_candidate(mask, (int64_t)a, (int64_t)len)) {
                    if (a + 2 < need) need = a + 2;
                    break;
                }
        }
    }
    if (trainable == 0) {
        if (need == UINT64_MAX)
            return errbuf_set(err, EINVAL, "data.path %s: no sample of the %llu has two trained tokens in a row: "
                              "there is nothing to train on", dpath, (unsigned long long)n);
        return errbuf_set(err, EINVAL, "data.path %s: no sample of the %llu has a trained token within its first "
                          "data.max_batch_tokens = %llu tokens (a batch keeps only those): every batch would train "
                          "nothing; data.max_batch_tokens = %llu makes at least one sample trainable", dpath,
                          (unsigned long long)n, (unsigned long long)T, (unsigned long long)need);
    }
    return 0;
}

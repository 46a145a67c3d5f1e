#include "summary.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "run_record.h"

typedef struct step_line {
    double loss, acceptance, accuracy;
    long long tokens, batches, step;
} step_line;

long long run_summary_resume_step(const job_config *cfg)
{
    char path[4096];
    job_config_path(cfg, "ckpt/latest/trainer_state.json", path, sizeof path);
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    long long step = o && json_is_integer(json_object_get(o, "step")) ? json_integer_value(json_object_get(o, "step")) : 0;
    json_decref(o);
    return step;
}

/* The evaluation worker's tau by decoding over the run (eval.jsonl), beside the simulated figure. */
static void eval_summary(const job_config *cfg, FILE *out)
{
    char path[4200];
    job_config_path(cfg, "eval.jsonl", path, sizeof path);
    FILE *f = cfg->eval.prompts[0] ? fopen(path, "r") : NULL;
    if (!f) return;
    char *line = NULL, text[1024];
    size_t cap = 0, o = 0;
    int n = 0, prompts = 0;
    while (getline(&line, &cap, f) > 0) {
        json_t *j = json_loads(line, 0, NULL);
        if (json_is_integer(json_object_get(j, "step")) && o < sizeof text) {
            o += (size_t)snprintf(text + o, sizeof text - o, "%s%.3f (step %lld)", n++ ? ", " : "",
                                  json_number_value(json_object_get(j, "tau")),
                                  (long long)json_integer_value(json_object_get(j, "step")));
            prompts = (int)json_integer_value(json_object_get(j, "prompts"));
        }
        json_decref(j);
    }
    free(line);
    fclose(f);
    if (n) fprintf(out, "dflash: acceptance length by decoding %d held-out prompts (%s): %s\n", prompts, path, text);
}

int run_summary_print(const job_config *cfg, double seconds, long long first_step, FILE *out, errbuf *err)
{
    char path[4096];
    job_config_path(cfg, "ledger.jsonl", path, sizeof path);
    FILE *f = fopen(path, "r");
    if (!f) return errbuf_set(err, errno, "%s: %s", path, strerror(errno));
    step_line *steps = NULL;
    size_t n = 0, cap = 0;
    char *line = NULL;
    size_t lcap = 0;
    int lineno = 0, rc = 0;
    while (getline(&line, &lcap, f) > 0) {
        lineno++;
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        json_t *b = o ? json_object_get(o, "batches") : NULL;
        if (!o || !json_is_array(b)) {
            rc = errbuf_set(err, EINVAL, "%s:%d: not a ledger line", path, lineno);
            json_decref(o);
            break;
        }
        if (json_object_get(o, "skipped")) { /* not applied (NaN guard): not part of the figures */
            json_decref(o);
            continue;
        }
        if (n == cap) steps = xrealloc(steps, sizeof *steps * (cap = cap ? 2 * cap : 256));
        steps[n++] = (step_line){.loss = json_number_value(json_object_get(o, "loss")),
                                 .acceptance = json_number_value(json_object_get(o, "acceptance")),
                                 .accuracy = json_number_value(json_object_get(o, "slot_accuracy")),
                                 .tokens = json_integer_value(json_object_get(o, "tokens")),
                                 .batches = (long long)json_array_size(b),
                                 .step = json_integer_value(json_object_get(o, "step"))};
        json_decref(o);
    }
    free(line);
    fclose(f);
    if (rc == 0 && n == 0) rc = errbuf_set(err, EINVAL, "%s: no committed step", path);
    if (rc) {
        free(steps);
        return rc;
    }
    size_t w = n / 20 > 5 ? n / 20 : 5;
    if (w > n) w = n;
    double a0 = 0, a1 = 0, l0 = 0, l1 = 0, c0 = 0, c1 = 0;
    long long tokens = 0, batches = 0, run_tokens = 0, run_steps = 0;
    for (size_t i = 0; i < n; i++) {
        tokens += steps[i].tokens;
        batches += steps[i].batches;
        if (steps[i].step >= first_step) { /* this run's work: a resumed run did not train the steps before */
            run_tokens += steps[i].tokens;
            run_steps++;
        }
    }
    for (size_t i = 0; i < w; i++) {
        a0 += steps[i].acceptance / (double)w;
        l0 += steps[i].loss / (double)w;
        c0 += steps[i].accuracy / (double)w;
        a1 += steps[n - w + i].acceptance / (double)w;
        l1 += steps[n - w + i].loss / (double)w;
        c1 += steps[n - w + i].accuracy / (double)w;
    }
    fprintf(out, "dflash: %zu steps, %lld batches in the ledger (%s), %lld tokens", n, batches, path, tokens);
    if (seconds > 0 && first_step > 0)
        fprintf(out, "; this run (resumed at step %lld): %lld steps, %lld tokens in %.1f s (%.0f tokens/s)", first_step,
                run_steps, run_tokens, seconds, (double)run_tokens / seconds);
    else if (seconds > 0)
        fprintf(out, " in %.1f s (%.0f tokens/s)", seconds, (double)tokens / seconds);
    fprintf(out, "\ndflash: simulated acceptance length: untrained %.3f (first %zu steps) -> trained %.3f (last %zu "
                 "steps)\ndflash: loss %.3f -> %.3f, per-slot accuracy %.3f -> %.3f\n",
            a0, w, a1, w, l0, l1, c0, c1);
    eval_summary(cfg, out);
    job_config_path(cfg, "ckpt/latest", path, sizeof path);
    const long long last = steps[n - 1].step + 1, ckpt = run_summary_resume_step(cfg);
    if (ckpt <= 0)
        fprintf(out, "dflash: WARNING: no checkpoint was written (see the log): a new start repeats the %lld steps\n",
                last);
    else if (ckpt < last)
        fprintf(out, "dflash: WARNING: the checkpoint of step %lld could not be written (see the log): %s is step %lld, "
                     "and --resume repeats steps %lld..%lld\n", last, path, ckpt, ckpt, last - 1);
    run_record rec;
    errbuf e1 = {{0}};
    job_config_path(cfg, "ckpt/run.json", path, sizeof path);
    if (run_record_read(&rec, path, &e1) == 0) {
        char said[1024];
        step_plan_describe(&rec.plan, said, sizeof said);
        if (said[0]) fprintf(out, "dflash: resharded at %s (%s)\n", said, path);
        run_record_free(&rec);
    }
    job_config_path(cfg, "ckpt/latest", path, sizeof path);
    if (ckpt > 0) {
        fprintf(out, "dflash: drafter checkpoint: %s (z-lab layout: model.safetensors + config.json)\n", path);
        char root[4096];
        job_config_path(cfg, "ckpt", root, sizeof root);
        const checkpoint_retention all = {0}; /* keeps everything: only counts */
        checkpoint_disk disk;
        errbuf e2 = {{0}};
        if (checkpoint_prune(root, &all, (uint64_t)ckpt, &disk, &e2) == 0) {
            fprintf(out, "dflash: checkpoints: %d in %s take %.1f MiB", disk.kept, root,
                    (double)disk.bytes / (1024.0 * 1024.0));
            if (cfg->train.keep_checkpoints > 0)
                fprintf(out, " (train.keep_checkpoints = %d, keep_every = %d: older ones removed)\n",
                        cfg->train.keep_checkpoints, cfg->train.keep_every);
            else
                fprintf(out, " (all kept: train.keep_checkpoints = N keeps the newest N)\n");
        }
    }
    free(steps);
    return 0;
}

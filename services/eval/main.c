/* dflash-eval: the evaluation worker (eval.prompts set). Every eval.every committed steps and at the last step it
 * decodes the held-out prompts with the target and the drafter of that step's checkpoint (read under the
 * checkpoint readers' shared lock: a whole committed step, never a half-applied one), through the loop `dflash
 * eval` runs (common/decode/spec_eval), and appends one line to <run_dir>/eval.jsonl: {"step", "tau", "histogram",
 * "per_slot", "prompts", "seconds", "speedup", ...}, fsynced, then publishes the result in the job state for
 * dflashd (metrics.jsonl, TensorBoard, status, /metrics). No training step waits for it: it only reads the
 * checkpoints. A restarted instance reads eval.jsonl (a torn last line is cut) and goes on after the last step in
 * it, so each step is evaluated once however often it dies. The CUDA build (dflash-eval-cuda) decodes on GPU 0
 * beside target-0 and drafter-0. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "checkpoint.h"
#include "drafter_infer.h"
#include "log.h"
#include "prompt_file.h"
#include "spec_eval.h"
#include "target_decode.h"
#include "target_family.h"
#include "target_model.h"
#include "worker.h"
#ifdef DFLASH_CUDA
#include "drafter_infer_cuda.h"
#include "spec_decode_cuda.h"
#include "spec_eval_cuda.h"
#include "target_decode_cuda.h"
#include "target_model_cuda.h"
#endif

#define MAX_EOS 16

typedef struct evaluator {
    worker_ctx w;
    const job_config *c;
    char root[PATH_MAX], path[PATH_MAX]; /* ckpt/, eval.jsonl */
    int fd;                               /* eval.jsonl, appended */
    prompt_set ps;
    int32_t eos[MAX_EOS];
    int neos, need;
    hf_config tcfg;                       /* the target's config */
    target_model *tm;                     /* cpu */
    target_cache *cache;
#ifdef DFLASH_CUDA
    target_cuda *tg;
    target_cuda_cache *cache_g;
#endif
    uint64_t done;                        /* the last step evaluated + 1 */
    uint64_t step;                        /* the step being evaluated */
    double last_status;
    char status[160];                     /* the last result, for STATUS= */
    const char *hold;                     /* DFLASH_FAULT_EVAL_HOLD */
} evaluator;

/* Test-only fault hook: while the file named by DFLASH_FAULT_EVAL_HOLD exists, the evaluation of the step written in
 * it (any step when it is empty) waits after its first prompt (alive: it ticks), having written "<step> <pid>" into
 * <file>.step, so that a test kills the worker mid-decode without racing it (tests/system/eval_worker.sh). */
static void fault_hold(evaluator *e)
{
    FILE *f;
    unsigned long long at;
    if (!e->hold || !(f = fopen(e->hold, "r"))) return;
    int any = fscanf(f, "%llu", &at) != 1;
    fclose(f);
    if (!any && at != e->step) return;
    char p[PATH_MAX + 8], tmp[PATH_MAX + 16];
    snprintf(p, sizeof p, "%s.step", e->hold);
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    if ((f = fopen(tmp, "w"))) {
        fprintf(f, "%llu %d\n", (unsigned long long)e->step, (int)getpid());
        fclose(f);
        rename(tmp, p);
    }
    log_warn("fault hook DFLASH_FAULT_EVAL_HOLD=%s: the evaluation of step %llu holds", e->hold,
             (unsigned long long)e->step);
    while (access(e->hold, F_OK) == 0 && !worker_restart_requested(&e->w)) {
        worker_tick(&e->w);
        uint32_t seen = atomic_load(&e->w.js.h->gen);
        job_state_wait(&e->w.js, seen, 100);
    }
}

/* eval.jsonl at start: every line a JSON object with an integer "step", in increasing order; a torn last line (no
 * newline: the previous instance died writing it) is cut. The last line's result is published again (its instance
 * may have died before it did). */
static int ledger_recover(evaluator *e, errbuf *err)
{
    e->fd = open(e->path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (e->fd < 0) return errbuf_set(err, errno, "%s: %s", e->path, strerror(errno));
    struct stat sb;
    if (fstat(e->fd, &sb) != 0) return errbuf_set(err, errno, "%s: %s", e->path, strerror(errno));
    size_t n = (size_t)sb.st_size;
    char *buf = xmalloc(n + 1);
    if (pread(e->fd, buf, n, 0) != (ssize_t)n) {
        free(buf);
        return errbuf_set(err, EIO, "%s: read error", e->path);
    }
    buf[n] = '\0';
    size_t keep = n;
    while (keep > 0 && buf[keep - 1] != '\n') keep--;
    if (keep < n) {
        log_warn("%s: cutting a torn last line (%zu bytes; its evaluation is done again)", e->path, n - keep);
        if (ftruncate(e->fd, (off_t)keep) != 0 || fsync(e->fd) != 0) {
            free(buf);
            return errbuf_set(err, errno, "%s: %s", e->path, strerror(errno));
        }
    }
    int rc = 0, lineno = 0;
    json_t *last = NULL;
    for (char *p = buf, *nl; p < buf + keep; p = nl + 1) {
        nl = memchr(p, '\n', (size_t)(buf + keep - p));
        lineno++;
        json_error_t je;
        json_t *o = json_loadb(p, (size_t)(nl - p), 0, &je);
        json_t *st = json_object_get(o, "step");
        if (!json_is_integer(st) || (uint64_t)json_integer_value(st) + 1 <= e->done) {
            rc = errbuf_set(err, EINVAL, "%s:%d: %s", e->path, lineno,
                            !o ? je.text : !json_is_integer(st) ? "no integer \"step\"" : "a step not after the one before");
            json_decref(o);
            break;
        }
        e->done = (uint64_t)json_integer_value(st) + 1;
        json_decref(last);
        last = o;
    }
    free(buf);
    if (!rc && last && atomic_load(&e->w.js.h->eval.done) < e->done) {
        job_eval r = {.step = e->done - 1};
        json_t *slots = json_object_get(last, "per_slot");
        r.tau = json_number_value(json_object_get(last, "tau"));
        r.speedup = json_number_value(json_object_get(last, "speedup"));
        r.seconds = json_number_value(json_object_get(last, "seconds"));
        r.prompts = (uint32_t)json_integer_value(json_object_get(last, "prompts"));
        r.block_size = (uint32_t)json_array_size(slots) + 1;
        for (size_t k = 0; k < json_array_size(slots) && k + 1 < DFLASH_MAX_BLOCK; k++)
            r.per_slot[k + 1] = json_number_value(json_array_get(slots, k));
        job_eval_publish(&e->w.js, &r);
    }
    json_decref(last);
    return rc;
}

/* The target, the prompts and the decoding cache, once. */
static int setup(evaluator *e, errbuf *err)
{
    const job_config *c = e->c;
    const char *dir = c->target.model;
    int rc;
    if (c->job.backend == JOB_BACKEND_CUDA) {
#ifdef DFLASH_CUDA
        if ((rc = hf_config_load(&e->tcfg, dir, err)) ||
            (rc = target_family_require(&e->tcfg, TARGET_BACKEND_CUDA, TARGET_CAN_DECODE, "the evaluation worker",
                                        NULL, err)))
            return rc;
#else
        return errbuf_set(err, EINVAL, "job.backend = cuda: this is the CPU build of dflash-eval (run "
                          "dflash-eval-cuda)");
#endif
    } else {
        if ((rc = target_model_load(&e->tm, dir, -1, err))) return rc;
        e->tcfg = *target_model_config(e->tm);
    }
    const hf_config *tc = &e->tcfg;
    if ((rc = hf_eos_tokens(dir, tc->vocab_size, e->eos, MAX_EOS, &e->neos, err)) ||
        (rc = prompt_file_read(&e->ps, c->eval.prompts, tc->vocab_size, c->eval.limit, err)) ||
        (rc = spec_eval_check_fit(&e->ps, c->eval.prompts, 0, c->eval.max_new_tokens,
                                  tc->max_position > 0 ? tc->max_position : LONG_MAX,
                                  "the target's max_position_embeddings", &e->need, err)))
        return rc;
#ifdef DFLASH_CUDA
    if (c->job.backend == JOB_BACKEND_CUDA) { /* its own copy of the target beside target-0's, on GPU 0 */
        if ((rc = target_cuda_load(&e->tg, dir, -1, e->need, 1, NULL, err)) ||
            (rc = target_cuda_cache_create(&e->cache_g, e->tg, 1, e->need, e->need, err)))
            return rc;
        log_info("GPU memory: target %.1f MiB, KV cache %.1f MiB for %d positions (plus the drafter of each step)",
                 (double)target_cuda_device_bytes(e->tg) / (1 << 20),
                 (double)target_cuda_cache_bytes(e->cache_g) / (1 << 20), e->need);
        return 0;
    }
#endif
    return target_cache_create(&e->cache, e->tm, 1, e->need, err);
}

static int on_prompt(void *ctx, int done, int n, errbuf *err)
{
    evaluator *e = ctx;
    worker_tick(&e->w);
    if (done == 1) fault_hold(e);
    if (worker_restart_requested(&e->w))
        return errbuf_set(err, ECANCELED, "restart requested by dflashd during the evaluation of step %llu",
                          (unsigned long long)e->step);
    if (now_seconds() - e->last_status >= 1.0 || done == n) {
        sd_notifyf(0, "STATUS=%s%sdecoding step %llu: %d/%d prompts", e->status, e->status[0] ? "  " : "",
                   (unsigned long long)e->step, done, n);
        e->last_status = now_seconds();
    }
    return 0;
}

/* Decode the prompts with the drafter of checkpoint `step` (held under the readers' lock while it loads). */
static int evaluate(evaluator *e, uint64_t step, spec_eval_stats *st, errbuf *err)
{
    char dir[PATH_MAX + 32];
    checkpoint_dir(e->root, step, dir, sizeof dir);
    int hold = -1, rc = checkpoint_hold_step(e->root, step, &hold, err);
    if (rc == -ENOENT) return 1; /* removed between the check and the lock: step_ready says so next time */
    if (rc) return rc;
    e->step = step;
    spec_opts so = {.max_new = e->c->eval.max_new_tokens, .eos = e->eos, .neos = e->neos};
    drafter_infer *d = NULL;
#ifdef DFLASH_CUDA
    drafter_infer_cuda *dg = NULL;
    spec_cuda *sg = NULL;
    if (e->tg) {
        rc = drafter_infer_cuda_load(&dg, dir, e->c->target.model, &e->tcfg, 0, 0, e->need, err);
        close(hold);
        if (!rc) rc = spec_cuda_create(&sg, e->tg, e->cache_g, dg, e->need, err);
        if (!rc) {
            const hf_config *dc = drafter_infer_cuda_config(dg);
            so.reserved = hf_reserved_token(&e->tcfg, dc);
            rc = spec_eval_run(st, &spec_eval_cuda_ops, sg, dc->block_size, &e->ps, e->c->eval.prompts, &so,
                               on_prompt, e, err);
        }
        spec_cuda_destroy(&sg);
        drafter_infer_cuda_destroy(&dg);
        return rc;
    }
#endif
    rc = drafter_infer_load(&d, dir, e->tm, err);
    close(hold);
    if (rc) return rc;
    const hf_config *dc = drafter_infer_config(d);
    so.reserved = hf_reserved_token(&e->tcfg, dc);
    spec_eval_cpu cpu = {.cache = e->cache, .tm = e->tm, .d = d};
    rc = spec_eval_run(st, &spec_eval_cpu_ops, &cpu, dc->block_size, &e->ps, e->c->eval.prompts, &so, on_prompt, e,
                       err);
    drafter_infer_destroy(&d);
    return rc;
}

/* The line of step's evaluation, fsynced, then published in the job state. */
static int record(evaluator *e, uint64_t step, const spec_eval_stats *st, double seconds, errbuf *err)
{
    json_t *hist = json_array(), *slots = json_array();
    for (int a = 1; a <= st->B; a++) json_array_append_new(hist, json_integer(st->hist[a]));
    job_eval r = {.step = step, .prompts = (uint32_t)st->nprompts, .block_size = (uint32_t)st->B,
                  .tau = spec_eval_tau(st), .speedup = spec_eval_speedup(st), .seconds = seconds};
    for (int k = 1; k < st->B; k++) {
        r.per_slot[k] = spec_eval_slot(st, k);
        json_array_append_new(slots, json_real(r.per_slot[k]));
    }
    json_t *o = json_pack("{s:I, s:f, s:o, s:o, s:i, s:f, s:f, s:I, s:I, s:I}", "step", (json_int_t)step, "tau",
                          r.tau, "histogram", hist, "per_slot", slots, "prompts", st->nprompts, "seconds", seconds,
                          "speedup", r.speedup, "blocks", (json_int_t)st->blocks, "new_tokens",
                          (json_int_t)st->spec_tokens, "outputs_differ", (json_int_t)st->mismatched);
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    size_t n = strlen(text);
    text[n] = '\n'; /* json_dumps' NUL becomes the newline: one write() of the whole line */
    const off_t at = lseek(e->fd, 0, SEEK_END);
    ssize_t w = write(e->fd, text, n + 1);
    free(text);
    if (w != (ssize_t)(n + 1) || fsync(e->fd) != 0) {
        int errnum = errno ? errno : ENOSPC;
        if (ftruncate(e->fd, at) != 0) log_warn("%s: cannot cut the partial line: %s", e->path, strerror(errno));
        return errbuf_set(err, errnum, "%s: %s", e->path, strerror(errnum));
    }
    job_eval_publish(&e->w.js, &r);
    e->done = step + 1;
    snprintf(e->status, sizeof e->status, "τ %.2f at step %llu (decoded, %d prompts)", r.tau,
             (unsigned long long)step, st->nprompts);
    /* X_DFLASH_NOTE: `dflash run` prints it as a line of its own (a terminal's progress line may be cut short) */
    sd_notifyf(0, "STATUS=%s\nX_DFLASH_NOTE=%s, speedup %.2fx", e->status, e->status, r.speedup);
    log_info("%s, speedup %.2fx over target-only greedy, %.1f s%s", e->status, r.speedup, seconds,
             st->mismatched ? " (WARNING: outputs differ from greedy decoding)" : "");
    return 0;
}

/* The next step to evaluate is ready: its checkpoint is there (1), will never be (-1: go past it; pruned before it
 * could be read, or the job finished without it: a drain while the disk was full), or not yet (0). */
static int step_ready(evaluator *e, uint64_t step)
{
    if (atomic_load(&e->w.js.h->committed_step) < step) return 0;
    if (checkpoint_exists(e->root, step)) return 1;
    if (worker_job_finished(&e->w)) return -1; /* every checkpoint of the job is written before it is finished */
    checkpoint_state cs;
    errbuf err = {{0}};
    if (checkpoint_read_state(e->root, NULL, &cs, &err) == 0 && cs.step > step) return -1; /* retention took it */
    return 0;
}

int main(int argc, char **argv)
{
    static evaluator e;
    int done;
    int rc = worker_start(&e.w, JOB_ROLE_EVAL, argc, argv,
                          "Evaluates the drafter by decoding held-out prompts (eval.prompts) every eval.every steps.",
                          &done);
    if (rc || done) return rc;
    e.c = &e.w.plan.cfg;
    e.fd = -1;
    /* on the CPU it shares the cores with the training workers: they go first */
    errno = 0;
    if (e.c->job.backend == JOB_BACKEND_CPU && nice(10) == -1 && errno) log_warn("nice: %s", strerror(errno));
    e.hold = getenv("DFLASH_FAULT_EVAL_HOLD");
    errbuf err = {{0}};
    job_config_path(e.c, "ckpt", e.root, sizeof e.root);
    job_config_path(e.c, "eval.jsonl", e.path, sizeof e.path);
    if ((rc = setup(&e, &err)) || (rc = ledger_recover(&e, &err))) {
        log_error("%s", err.msg);
        return 1;
    }
    log_info("%d prompts of %s, at most %d new tokens each; evaluating from step %llu", e.ps.n, e.c->eval.prompts,
             e.c->eval.max_new_tokens,
             (unsigned long long)job_eval_next(e.c, e.done, job_state_last_step(&e.w.js)));
    worker_ready(&e.w, "waiting for a checkpoint");
    int code = 0;
    for (;;) {
        worker_tick(&e.w);
        if (worker_restart_requested(&e.w)) {
            log_info("restart requested by dflashd");
            code = JOB_EXIT_RESTART;
            break;
        }
        worker_hold_while_paused(&e.w);
        uint64_t next = job_eval_next(e.c, e.done, job_state_last_step(&e.w.js));
        if (next == UINT64_MAX) {
            if (worker_job_finished(&e.w)) break;
            uint32_t seen = atomic_load(&e.w.js.h->gen);
            job_state_wait(&e.w.js, seen, 200);
            continue;
        }
        int ready = step_ready(&e, next);
        if (ready < 0) {
            log_warn("no checkpoint of step %llu to evaluate (removed by train.keep_checkpoints before it was read, "
                     "or never written): going on with the next", (unsigned long long)next);
            e.done = next + 1;
            continue;
        }
        if (!ready) {
            uint32_t seen = atomic_load(&e.w.js.h->gen);
            job_state_wait(&e.w.js, seen, 200);
            continue;
        }
        spec_eval_stats st = {0};
        double t0 = now_seconds();
        e.last_status = 0;
        rc = evaluate(&e, next, &st, &err);
        if (!rc) rc = record(&e, next, &st, now_seconds() - t0, &err);
        spec_eval_stats_free(&st);
        if (rc == 1) continue;
        if (rc == -ECANCELED) {
            log_info("%s: it is evaluated again after the restart", err.msg);
            code = JOB_EXIT_RESTART;
            break;
        }
        if (rc) { /* an unreadable checkpoint, a full disk: the evaluation is optional, training and the job go on */
            log_error("evaluation of step %llu failed (skipped; a restarted worker tries it again): %s",
                      (unsigned long long)next, err.msg);
            e.done = next + 1;
        }
    }
    if (!code) atomic_store(&e.w.js.h->eval.ended, 1); /* dflashd ends the job once this process is gone */
    if (!code) log_info("job finished: evaluated up to step %llu", (unsigned long long)(e.done ? e.done - 1 : 0));
    prompt_set_free(&e.ps);
    target_cache_destroy(&e.cache);
    target_model_destroy(&e.tm);
#ifdef DFLASH_CUDA
    target_cuda_cache_destroy(&e.cache_g);
    target_cuda_destroy(&e.tg);
#endif
    if (e.fd >= 0) close(e.fd);
    worker_stop(&e.w);
    return code;
}

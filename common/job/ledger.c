#include "ledger.h"

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "step_metrics.h"
#include "tfevents.h"

struct ledger {
    char path[4096];
    int fd, metrics_fd;
    int block_size;
    uint32_t ndrafters;
    char notice[512];    /* what ledger_open cut that the operator should hear of ("": nothing) */
    int failing;         /* errno of the failing write (reported in the job state's ledger_block), 0: none */
    tfevents *tb;        /* metrics.tensorboard: the metrics lines' scalars as TensorBoard events, else NULL */
    int tb_failing;
    char eval_path[4200]; /* <run_dir>/eval.jsonl, the evaluation worker's lines */
};

/* Fault injection for tests/system/disk_full.sh (which may run as root, where a read-only folder does not stop
 * writes): while the file named by DFLASH_FAULT_LEDGER_ENOSPC exists, a ledger line cannot be written (ENOSPC). */
static int fault_enospc(void)
{
    const char *f = getenv("DFLASH_FAULT_LEDGER_ENOSPC");
    return f && *f && access(f, F_OK) == 0;
}

/* A line could not be written (errno e): cut what part of it reached the file, and say so once in the job state
 * (write_block: dflashd reports it; the drafters hold once the record ring is full), and in the log. */
static int ledger_write_failed(ledger *l, job_state *js, off_t at, uint64_t k, int e)
{
    if (ftruncate(l->fd, at) != 0 || lseek(l->fd, at, SEEK_SET) != at)
        log_error("%s: cannot cut a partly written line back to %lld bytes: %s", l->path, (long long)at,
                  strerror(errno));
    job_write_block *b = &js->h->ledger_block;
    atomic_fetch_add(&b->attempts, 1);
    if (l->failing != e) {
        log_error("%s: cannot write the line of step %llu: %s", l->path, (unsigned long long)k, strerror(e));
        snprintf(b->msg, sizeof b->msg, "%.400s: %s", l->path, strerror(e));
        atomic_store(&b->step, k);
        atomic_store(&b->attempts, 1);
        atomic_store_explicit(&b->err, (uint32_t)e, memory_order_release);
        l->failing = e;
    }
    return -e;
}

/* Every whole line must be the line of step i at line i+1 (a JSON object with "step": i): the committed history
 * from its start. 0, or -EINVAL naming the first line that is not (the file is not touched). */
static int ledger_check_lines(const char *path, const char *buf, size_t n, uint64_t *lines, size_t *whole,
                              errbuf *err)
{
    uint64_t i = 0;
    size_t pos = 0;
    for (const char *nl; pos < n && (nl = memchr(buf + pos, '\n', n - pos)); pos = (size_t)(nl - buf) + 1, i++) {
        json_error_t je;
        json_t *o = json_loadb(buf + pos, (size_t)(nl - buf) - pos, 0, &je);
        json_t *st = o ? json_object_get(o, "step") : NULL;
        const int good = st && json_is_integer(st) && json_integer_value(st) == (json_int_t)i;
        char what[256];
        if (!o) snprintf(what, sizeof what, "not a ledger line (%s)", je.text);
        else if (!st || !json_is_integer(st)) snprintf(what, sizeof what, "a line without a \"step\"");
        else snprintf(what, sizeof what, "the line of step %lld where step %llu belongs",
                      (long long)json_integer_value(st), (unsigned long long)i);
        json_decref(o);
        if (!good)
            return errbuf_set(err, EINVAL, "%s:%llu: %s: the ledger is not the job's committed history from step 0 (a "
                              "line missing, changed or out of order); it is left as it is: restore it, or start "
                              "over with --fresh", path, (unsigned long long)i + 1, what);
    }
    *lines = i;
    *whole = pos;
    return 0;
}

int ledger_open(ledger **out, const char *path, job_state *js, uint32_t ndrafters, errbuf *err)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return errbuf_set(err, errno, "%s: %s", path, strerror(errno));
    struct stat sb;
    fstat(fd, &sb);
    char *buf = xmalloc((size_t)sb.st_size + 1);
    ssize_t n = pread(fd, buf, (size_t)sb.st_size, 0);
    if (n < 0) n = 0;
    uint64_t lines = 0;
    size_t whole = 0;
    int rc = ledger_check_lines(path, buf, (size_t)n, &lines, &whole, err);
    free(buf);
    if (rc) {
        close(fd);
        return rc;
    }
    /* keep the lines of steps 0, 1, ... up to the committed step: a resume redoes the steps after its checkpoint;
     * a torn last line (a write interrupted by a crash) is the one thing cut that was never a line */
    char notice[512] = "";
    if ((off_t)whole != n)
        snprintf(notice, sizeof notice, "%s: cut a torn last line (%lld bytes without a newline after line %llu: a "
                 "write interrupted by a crash)", path, (long long)(n - (ssize_t)whole), (unsigned long long)lines);
    uint64_t committed = atomic_load(&js->h->committed_step);
    uint64_t kept = lines < committed ? lines : committed;
    off_t keep_bytes = (off_t)whole;
    if (kept < lines) { /* the end of line `kept` */
        buf = xmalloc((size_t)sb.st_size + 1);
        n = pread(fd, buf, (size_t)sb.st_size, 0);
        const char *p = buf;
        for (uint64_t i = 0; i < kept; i++) p = memchr(p, '\n', (size_t)(buf + n - p)) + 1;
        keep_bytes = p - buf;
        free(buf);
    }
    if (keep_bytes != sb.st_size) {
        if (ftruncate(fd, keep_bytes) != 0) {
            int e = errno;
            close(fd);
            return errbuf_set(err, e, "%s: cannot truncate: %s", path, strerror(e));
        }
        fsync(fd);
        if (notice[0]) log_warn("%s", notice);
        if (kept < lines)
            log_info("%s: kept %llu lines (steps already committed), cut the %llu after them (steps to train again)",
                     path, (unsigned long long)kept, (unsigned long long)(lines - kept));
    }
    if (kept < atomic_load(&js->h->ledger_frontier))
        log_warn("%s: %llu lines but the job state says %llu were written: the ledger has a gap", path,
                 (unsigned long long)kept, (unsigned long long)atomic_load(&js->h->ledger_frontier));
    else
        atomic_store(&js->h->ledger_frontier, kept);
    lseek(fd, 0, SEEK_END);
    ledger *l = xcalloc(1, sizeof *l);
    snprintf(l->path, sizeof l->path, "%s", path);
    l->fd = fd;
    char mpath[4200];
    const char *slash = strrchr(path, '/');
    snprintf(mpath, sizeof mpath, "%.*smetrics.jsonl", slash ? (int)(slash - path + 1) : 0, path);
    /* metrics are a log, not a ledger: appended, never rewritten (a resumed run's redone steps appear again) */
    l->metrics_fd = open(mpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (l->metrics_fd < 0) log_warn("%s: %s: no metrics log", mpath, strerror(errno));
    snprintf(l->eval_path, sizeof l->eval_path, "%.*seval.jsonl", slash ? (int)(slash - path + 1) : 0, path);
    l->ndrafters = ndrafters;
    snprintf(l->notice, sizeof l->notice, "%s", notice);
    *out = l;
    return 0;
}

/* A JSON number, or null for a non-finite one (a step the NaN guard skipped). */
static const char *num(char *buf, size_t n, double x)
{
    if (!isfinite(x)) return "null";
    snprintf(buf, n, "%.6f", x);
    return buf;
}

/* The first step of a segment that changed the number of drafters or targets (a resume onto other workers) says so:
 * `, "resharded": {"drafters": [2, 3]}` (the numbers before and after; only those that changed). Length written. */
static int reshard_note(const step_plan *p, uint64_t k, char *out, size_t n)
{
    for (uint32_t i = 1; i < p->n; i++) {
        const step_plan_segment *a = &p->seg[i - 1], *b = &p->seg[i];
        if (b->from_step != k) continue;
        int m = snprintf(out, n, ", \"resharded\": {");
        if (a->drafters != b->drafters)
            m += snprintf(out + m, n - (size_t)m, "\"drafters\": [%u, %u]", a->drafters, b->drafters);
        if (a->targets != b->targets)
            m += snprintf(out + m, n - (size_t)m, "%s\"targets\": [%u, %u]", a->drafters != b->drafters ? ", " : "",
                          a->targets, b->targets);
        return m + snprintf(out + m, n - (size_t)m, "}");
    }
    return 0;
}

int ledger_append_committed(ledger *l, job_state *js)
{
    job_state_header *h = js->h;
    int written = 0;
    for (;;) {
        uint64_t k = atomic_load(&h->ledger_frontier);
        if (k >= atomic_load(&h->committed_step)) break;
        const job_rank_record *rec = h->records[k % JOB_RECORD_RING];
        step_summary sm;
        step_metrics_sum(&sm, rec, l->ndrafters, k);
        if (sm.nranks != l->ndrafters) {
            log_error("ledger: step %llu committed with %u of %u drafter records", (unsigned long long)k, sm.nranks,
                      l->ndrafters);
            return -EPROTO;
        }
        char line[8192], nl[32], ng[32];
        int n = snprintf(line, sizeof line, "{\"step\": %llu, \"batches\": [", (unsigned long long)k);
        for (uint32_t r = 0; r < l->ndrafters; r++)
            n += snprintf(line + n, sizeof line - (size_t)n, "%s%llu", r ? ", " : "",
                          (unsigned long long)rec[r].batch_id);
        n += snprintf(line + n, sizeof line - (size_t)n,
                      "], \"tokens\": %llu, \"loss\": %s, \"slot_accuracy\": %.6f, \"acceptance\": %.6f, "
                      "\"grad_norm\": %s",
                      (unsigned long long)sm.tokens, num(nl, sizeof nl, sm.loss), sm.slot_accuracy, sm.acceptance,
                      num(ng, sizeof ng, sm.grad_norm));
        if (sm.skipped)
            n += snprintf(line + n, sizeof line - (size_t)n, ", \"skipped\": \"%s\"", step_skip_reason(sm.skipped));
        n += reshard_note(&h->plan, k, line + n, sizeof line - (size_t)n);
        n += snprintf(line + n, sizeof line - (size_t)n, "}\n");
        const off_t at = lseek(l->fd, 0, SEEK_CUR);
        if (fault_enospc()) return ledger_write_failed(l, js, at, k, ENOSPC);
        errno = 0;
        ssize_t w = write(l->fd, line, (size_t)n);
        if (w != n || fsync(l->fd) != 0) /* a short write without an errno is a full disk */
            return ledger_write_failed(l, js, at, k, errno ? errno : ENOSPC);
        if (l->failing) {
            log_info("%s: the line of step %llu is written: the ledger goes on", l->path, (unsigned long long)k);
            atomic_store(&h->ledger_block.err, 0);
            l->failing = 0;
        }
        if (l->metrics_fd >= 0) {
            int m = snprintf(line, sizeof line, "{\"step\": %llu, \"loss\": %s, \"slot_accuracy\": [",
                             (unsigned long long)k, num(nl, sizeof nl, sm.loss));
            for (int s = 1; s < l->block_size && s < DFLASH_MAX_BLOCK; s++)
                m += snprintf(line + m, sizeof line - (size_t)m, "%s%.4f", s > 1 ? ", " : "",
                              step_metrics_slot_accuracy(&sm, s));
            m += snprintf(line + m, sizeof line - (size_t)m,
                          "], \"acceptance\": %.6f, \"grad_norm\": %s, \"lr\": %.6g, \"tokens\": %llu}\n",
                          sm.acceptance, num(ng, sizeof ng, sm.grad_norm), sm.lr, (unsigned long long)sm.tokens);
            if (write(l->metrics_fd, line, (size_t)m) != m) log_warn("metrics.jsonl: write failed");
        }
        errbuf te = {{0}};
        if (l->tb && tfevents_write_step(l->tb, k, &sm, l->block_size, &te) && !l->tb_failing++)
            log_warn("tensorboard: %s (steps not written until it can)", te.msg);
        atomic_store(&h->ledger_frontier, k + 1);
        job_state_wake(js);
        written++;
    }
    return written;
}

/* One evaluation line of eval.jsonl into metrics.jsonl and TensorBoard. */
static void eval_report(ledger *l, json_t *o, uint64_t step)
{
    json_t *slots = json_object_get(o, "per_slot");
    double tau = json_number_value(json_object_get(o, "tau")), speedup = json_number_value(json_object_get(o, "speedup"));
    if (l->metrics_fd >= 0) {
        char line[2048];
        int m = snprintf(line, sizeof line, "{\"step\": %llu, \"decoded_tau\": %.6f, \"decoded_slot_acceptance\": [",
                         (unsigned long long)step, tau);
        for (size_t k = 0; k < json_array_size(slots) && k < DFLASH_MAX_BLOCK; k++)
            m += snprintf(line + m, sizeof line - (size_t)m, "%s%.4f", k ? ", " : "",
                          json_number_value(json_array_get(slots, k)));
        m += snprintf(line + m, sizeof line - (size_t)m,
                      "], \"decoded_speedup\": %.4f, \"decoded_prompts\": %lld, \"eval_seconds\": %.3f}\n", speedup,
                      (long long)json_integer_value(json_object_get(o, "prompts")),
                      json_number_value(json_object_get(o, "seconds")));
        if (write(l->metrics_fd, line, (size_t)m) != m) log_warn("metrics.jsonl: write failed");
    }
    const char *tags[] = {"decoded_tau", "decoded_speedup"};
    const double vals[] = {tau, speedup};
    errbuf te = {{0}};
    if (l->tb && tfevents_write_scalars(l->tb, (int64_t)step, tags, vals, 2, &te) && !l->tb_failing++)
        log_warn("tensorboard: %s", te.msg);
}

int ledger_append_eval(ledger *l, job_state *js)
{
    uint64_t done = atomic_load(&js->h->eval.done), reported = atomic_load(&js->h->eval.reported);
    if (done <= reported) return 0;
    FILE *f = fopen(l->eval_path, "r"); /* its lines are whole once done says so (written, fsynced, then published) */
    if (!f) return 0;
    char *line = NULL;
    size_t cap = 0;
    int n = 0;
    while (getline(&line, &cap, f) > 0) {
        json_t *o = json_loads(line, 0, NULL), *st = json_object_get(o, "step");
        if (json_is_integer(st) && (uint64_t)json_integer_value(st) + 1 > reported &&
            (uint64_t)json_integer_value(st) < done) {
            reported = (uint64_t)json_integer_value(st) + 1;
            eval_report(l, o, reported - 1);
            n++;
        }
        json_decref(o);
    }
    free(line);
    fclose(f);
    atomic_store(&js->h->eval.reported, reported);
    return n;
}

const char *ledger_notice(const ledger *l) { return l->notice; }

void ledger_set_block_size(ledger *l, int block_size) { l->block_size = block_size; }

int ledger_tensorboard_open(ledger *l, const char *dir, errbuf *err) { return tfevents_open(&l->tb, dir, err); }

void ledger_destroy(ledger **lp)
{
    ledger *l = *lp;
    if (!l) return;
    if (l->metrics_fd >= 0) close(l->metrics_fd);
    tfevents_destroy(&l->tb);
    close(l->fd);
    free(l);
    *lp = NULL;
}

#include "ledger.h"

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "step_metrics.h"

struct ledger {
    char path[4096];
    int fd, metrics_fd;
    int block_size;
    uint32_t ndrafters;
    int failing;         /* errno of the failing write (reported in the job state's ledger_block), 0: none */
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

int ledger_open(ledger **out, const char *path, job_state *js, uint32_t ndrafters, errbuf *err)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return errbuf_set(err, errno, "%s: %s", path, strerror(errno));
    struct stat sb;
    fstat(fd, &sb);
    char *buf = xmalloc((size_t)sb.st_size + 1);
    ssize_t n = pread(fd, buf, (size_t)sb.st_size, 0);
    if (n < 0) n = 0;
    /* keep whole lines of steps 0, 1, ... up to the committed step */
    uint64_t committed = atomic_load(&js->h->committed_step), kept = 0;
    off_t keep_bytes = 0;
    for (ssize_t pos = 0; pos < n && kept < committed;) {
        char *nl = memchr(buf + pos, '\n', (size_t)(n - pos));
        if (!nl) break; /* torn last line */
        unsigned long long step;
        if (sscanf(buf + pos, "{\"step\": %llu", &step) != 1 || step != kept) break;
        kept++;
        pos = nl - buf + 1;
        keep_bytes = pos;
    }
    free(buf);
    if (keep_bytes != sb.st_size) {
        if (ftruncate(fd, keep_bytes) != 0) {
            int e = errno;
            close(fd);
            return errbuf_set(err, e, "%s: cannot truncate: %s", path, strerror(e));
        }
        fsync(fd);
        log_info("%s: kept %llu lines (steps already committed), cut %lld bytes", path, (unsigned long long)kept,
                 (long long)(sb.st_size - keep_bytes));
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
    l->ndrafters = ndrafters;
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
        atomic_store(&h->ledger_frontier, k + 1);
        job_state_wake(js);
        written++;
    }
    return written;
}

void ledger_set_block_size(ledger *l, int block_size) { l->block_size = block_size; }

void ledger_destroy(ledger **lp)
{
    ledger *l = *lp;
    if (!l) return;
    if (l->metrics_fd >= 0) close(l->metrics_fd);
    close(l->fd);
    free(l);
    *lp = NULL;
}

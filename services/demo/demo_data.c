#include <cblas.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "demo.h"
#include "rng.h"
#include "target_model.h"

#define DEMO_PROMPT_STREAM 0x70726f6d7074ull /* "prompt" */
#define PROGRESS_SECONDS 1.0

void demo_data_defaults(demo_data_opts *o)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    *o = (demo_data_opts){.samples = 256, .prompt_min = 8, .prompt_max = 24, .answer_len = 48, .batch = 32,
                          .threads = ncpu < 1 ? 1 : ncpu > 16 ? 16 : (int)ncpu, .progress = 1, .seed = 0};
}

/* One batch being decoded: nb sequences, sequence s in seq[s*cap .. s*cap+len[s]). */
typedef struct decode_batch {
    int nb, cap;
    int32_t *seq, *len, *plen;
    int32_t *ids, *pos, *cu; /* packed forward input */
    float *logits;           /* (T, V) */
    size_t logits_cap;
} decode_batch;

/* Prompt of sample i: a pure function of (seed, i), whatever the batching. Ids avoid V-1 (the reserved id). */
static void make_prompt(const demo_data_opts *o, int vocab, int64_t i, int32_t *out, int32_t *len)
{
    rng r;
    rng_seed(&r, o->seed, (uint64_t)i, DEMO_PROMPT_STREAM, 0);
    int n = o->prompt_min + (int)rng_below(&r, (uint64_t)(o->prompt_max - o->prompt_min + 1));
    for (int t = 0; t < n; t++) out[t] = (int32_t)rng_below(&r, (uint64_t)(vocab - 1));
    *len = n;
}

/* Greedy choice over [0, V-1): the last id stays reserved (the drafter's mask token); ties go to the lower id. */
static int32_t argmax_row(const float *row, int vocab)
{
    int32_t best = 0;
    for (int v = 1; v < vocab - 1; v++)
        if (row[v] > row[best]) best = v;
    return best;
}

/* Append one greedy token to every sequence of the batch (one full re-forward of the packed batch). */
static int decode_step(target_model *m, decode_batch *d, int vocab, errbuf *err)
{
    int T = 0;
    d->cu[0] = 0;
    for (int s = 0; s < d->nb; s++) {
        for (int t = 0; t < d->len[s]; t++) {
            d->ids[T + t] = d->seq[(size_t)s * (size_t)d->cap + (size_t)t];
            d->pos[T + t] = t;
        }
        T += d->len[s];
        d->cu[s + 1] = T;
    }
    size_t need = (size_t)T * (size_t)vocab;
    if (need > d->logits_cap) {
        free(d->logits);
        d->logits = xmalloc(need * sizeof *d->logits);
        d->logits_cap = need;
    }
    target_batch b = {.ntok = T, .nseq = d->nb, .input_ids = d->ids, .positions = d->pos, .cu_seqlens = d->cu};
    int rc = target_model_forward(m, &b, NULL, 0, NULL, NULL, d->logits, err);
    if (rc) return rc;
    for (int s = 0; s < d->nb; s++) {
        const float *row = d->logits + (size_t)(d->cu[s + 1] - 1) * (size_t)vocab;
        d->seq[(size_t)s * (size_t)d->cap + (size_t)d->len[s]] = argmax_row(row, vocab);
        d->len[s]++;
    }
    return 0;
}

/* One JSON line: {"input_ids": [...], "loss_mask": [...]} with the prompt masked. */
static int write_line(FILE *f, const int32_t *seq, int len, int plen)
{
    if (fputs("{\"input_ids\": [", f) < 0) return -1;
    for (int t = 0; t < len; t++)
        if (fprintf(f, t ? ", %d" : "%d", seq[t]) < 0) return -1;
    if (fputs("], \"loss_mask\": [", f) < 0) return -1;
    for (int t = 0; t < len; t++)
        if (fputs(t == 0 ? (t < plen ? "0" : "1") : (t < plen ? ", 0" : ", 1"), f) < 0) return -1;
    return fputs("]}\n", f) < 0 ? -1 : 0;
}

static int check_opts(const demo_data_opts *o, errbuf *err)
{
    if (!o->target_dir || !*o->target_dir) return errbuf_set(err, EINVAL, "missing --target DIR");
    if (!o->out_path || !*o->out_path) return errbuf_set(err, EINVAL, "missing -o OUT.jsonl");
    if (o->samples < 1) return errbuf_set(err, EINVAL, "--samples %d: must be at least 1", o->samples);
    if (o->prompt_min < 1 || o->prompt_max < o->prompt_min)
        return errbuf_set(err, EINVAL, "--prompt-len %d:%d: need 1 <= MIN <= MAX", o->prompt_min, o->prompt_max);
    if (o->answer_len < 1) return errbuf_set(err, EINVAL, "--answer-len %d: must be at least 1", o->answer_len);
    if (o->batch < 1) return errbuf_set(err, EINVAL, "--batch %d: must be at least 1", o->batch);
    if (o->threads < 1) return errbuf_set(err, EINVAL, "--threads %d: must be at least 1", o->threads);
    if ((int64_t)o->prompt_max + o->answer_len > 1 << 20)
        return errbuf_set(err, EINVAL, "--prompt-len/--answer-len: samples of %d tokens are too long",
                          o->prompt_max + o->answer_len);
    return 0;
}

/* The shared state of one make-data run. Samples are decoded in batches claimed by worker threads (one target
 * model each); results land at their sample index, so the output does not depend on threads or batching (a
 * sequence's logits do not depend on its batch neighbours: packed attention is per sequence). */
typedef struct data_job {
    const demo_data_opts *o;
    int vocab, cap, batch, nbatches;
    int32_t *seqs, *plen;          /* (samples, cap), (samples) */
    atomic_int next_batch, failed;
    atomic_llong done;             /* samples finished */
    pthread_mutex_t lock;          /* guards err, last_print and stderr lines */
    errbuf err;
    double last_print;
} data_job;

typedef struct data_worker {
    data_job *job;
    target_model *m;
    pthread_t thread;
    int started;
} data_worker;

static void job_progress(data_job *j, int force)
{
    if (!j->o->progress) return;
    pthread_mutex_lock(&j->lock);
    double now = now_seconds();
    if (force || now - j->last_print >= PROGRESS_SECONDS) {
        fprintf(stderr, "make-data: %lld/%d samples\n", (long long)atomic_load(&j->done), j->o->samples);
        j->last_print = now;
    }
    pthread_mutex_unlock(&j->lock);
}

static void job_fail(data_job *j, const errbuf *e)
{
    pthread_mutex_lock(&j->lock);
    if (!atomic_exchange(&j->failed, 1)) j->err = *e;
    pthread_mutex_unlock(&j->lock);
}

static void *worker_main(void *arg)
{
    data_worker *w = arg;
    data_job *j = w->job;
    const demo_data_opts *o = j->o;
    decode_batch d = {.cap = j->cap};
    d.seq = xmalloc(sizeof *d.seq * (size_t)j->batch * (size_t)d.cap);
    d.len = xmalloc(sizeof *d.len * (size_t)j->batch);
    d.plen = xmalloc(sizeof *d.plen * (size_t)j->batch);
    d.ids = xmalloc(sizeof *d.ids * (size_t)j->batch * (size_t)d.cap);
    d.pos = xmalloc(sizeof *d.pos * (size_t)j->batch * (size_t)d.cap);
    d.cu = xmalloc(sizeof *d.cu * (size_t)(j->batch + 1));
    errbuf err = {{0}};
    for (;;) {
        int bi = atomic_fetch_add(&j->next_batch, 1);
        if (bi >= j->nbatches || atomic_load(&j->failed)) break;
        int64_t b0 = (int64_t)bi * j->batch;
        d.nb = (int)(o->samples - b0 < j->batch ? o->samples - b0 : j->batch);
        for (int s = 0; s < d.nb; s++) {
            make_prompt(o, j->vocab, b0 + s, d.seq + (size_t)s * (size_t)d.cap, &d.plen[s]);
            d.len[s] = d.plen[s];
        }
        int rc = 0;
        for (int step = 0; step < o->answer_len && !rc; step++) {
            rc = decode_step(w->m, &d, j->vocab, &err);
            job_progress(j, 0);
        }
        if (rc) {
            errbuf_wrap(&err, rc, "%s: greedy decoding of samples %lld..%lld", o->target_dir, (long long)b0,
                        (long long)(b0 + d.nb - 1));
            job_fail(j, &err);
            break;
        }
        for (int s = 0; s < d.nb; s++) {
            DF_ASSERT(d.len[s] == d.plen[s] + o->answer_len);
            memcpy(j->seqs + (size_t)(b0 + s) * (size_t)j->cap, d.seq + (size_t)s * (size_t)d.cap,
                   sizeof *d.seq * (size_t)d.len[s]);
            j->plen[b0 + s] = d.plen[s];
        }
        atomic_fetch_add(&j->done, d.nb);
    }
    free(d.seq);
    free(d.len);
    free(d.plen);
    free(d.ids);
    free(d.pos);
    free(d.cu);
    free(d.logits);
    return NULL;
}

/* Write every sample in order to f and fill the answer statistics. */
static int job_write(const data_job *j, FILE *f, demo_data_stats *st)
{
    const demo_data_opts *o = j->o;
    /* seen[v] == stamp: v already counted in the current answer; used[v]: v seen in any answer */
    int *seen = xcalloc((size_t)j->vocab * 2, sizeof *seen), *used = seen + j->vocab, stamp = 0, rc = 0;
    double distinct_sum = 0;
    for (int64_t i = 0; i < o->samples && !rc; i++) {
        const int32_t *seq = j->seqs + (size_t)i * (size_t)j->cap;
        int plen = j->plen[i], len = plen + o->answer_len, distinct = 0;
        rc = write_line(f, seq, len, plen);
        stamp++;
        for (int t = plen; t < len; t++) {
            if (seen[seq[t]] != stamp) seen[seq[t]] = stamp, distinct++;
            if (!used[seq[t]]) used[seq[t]] = 1, st->vocab_used++;
        }
        distinct_sum += (double)distinct / (double)o->answer_len;
        st->repeated_answers += distinct == 1;
        st->samples++;
        st->tokens += len;
        st->answer_tokens += o->answer_len;
    }
    st->distinct_ratio = distinct_sum / (double)o->samples;
    free(seen);
    return rc;
}

int demo_data_write(const demo_data_opts *o, demo_data_stats *st, errbuf *err)
{
    int rc = check_opts(o, err);
    if (rc) return rc;
    memset(st, 0, sizeof *st);
    data_job j = {.o = o, .lock = PTHREAD_MUTEX_INITIALIZER, .last_print = now_seconds()};
    data_worker *w = NULL;
    FILE *f = NULL;
    char *tmp = NULL;
    int nw = 0;
    target_model *m0 = NULL;
    if ((rc = target_model_load(&m0, o->target_dir, -1, err))) return rc;
    j.vocab = target_model_config(m0)->vocab_size;
    if (j.vocab < 2) {
        rc = errbuf_set(err, EINVAL, "%s: vocab_size %d is too small for random prompts", o->target_dir, j.vocab);
        target_model_destroy(&m0);
        return rc;
    }
    /* Smaller batches when there would be fewer batches than threads (the output is the same). */
    j.batch = o->batch;
    if ((int64_t)j.batch * o->threads > o->samples) j.batch = (o->samples + o->threads - 1) / o->threads;
    j.nbatches = (int)((o->samples + j.batch - 1) / j.batch);
    j.cap = o->prompt_max + o->answer_len;
    j.seqs = xmalloc(sizeof *j.seqs * (size_t)o->samples * (size_t)j.cap);
    j.plen = xmalloc(sizeof *j.plen * (size_t)o->samples);
    nw = o->threads < j.nbatches ? o->threads : j.nbatches;
    w = xcalloc((size_t)nw, sizeof *w);
    w[0].m = m0;
    for (int i = 1; i < nw; i++)
        if ((rc = target_model_load(&w[i].m, o->target_dir, -1, err))) goto done;
    /* Parallelism comes from the workers; BLAS threads on top would only contend for the same cores. */
    if (nw > 1) openblas_set_num_threads(1);
    for (int i = 0; i < nw; i++) {
        w[i].job = &j;
        if (i > 0) {
            if ((rc = -pthread_create(&w[i].thread, NULL, worker_main, &w[i]))) {
                errbuf_set(err, -rc, "cannot start worker thread %d: %s", i, strerror(-rc));
                atomic_store(&j.failed, 1);
                break;
            }
            w[i].started = 1;
        }
    }
    if (!rc) worker_main(&w[0]);
    for (int i = 1; i < nw; i++)
        if (w[i].started) pthread_join(w[i].thread, NULL);
    if (rc) goto done;
    if (atomic_load(&j.failed)) {
        *err = j.err;
        rc = -EINVAL;
        goto done;
    }
    job_progress(&j, 1);

    size_t tlen = strlen(o->out_path) + 8;
    tmp = xmalloc(tlen);
    snprintf(tmp, tlen, "%s.tmp", o->out_path);
    if (!(f = fopen(tmp, "w"))) {
        rc = errbuf_set(err, errno, "%s: cannot create: %s", tmp, strerror(errno));
        goto done;
    }
    int bad = job_write(&j, f, st) || fflush(f) || fsync(fileno(f));
    int saved = errno;
    if (fclose(f)) bad = 1, saved = errno;
    if (bad) {
        rc = errbuf_set(err, saved ? saved : EIO, "%s: write failed: %s", tmp, strerror(saved ? saved : EIO));
        unlink(tmp);
        goto done;
    }
    if (rename(tmp, o->out_path)) {
        rc = errbuf_set(err, errno, "%s: cannot rename to %s: %s", tmp, o->out_path, strerror(errno));
        unlink(tmp);
    }
done:
    for (int i = 0; i < nw; i++) target_model_destroy(&w[i].m);
    free(w);
    free(tmp);
    free(j.seqs);
    free(j.plen);
    pthread_mutex_destroy(&j.lock);
    return rc;
}

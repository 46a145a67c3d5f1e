/* generate: `dflash generate` (see generate.h). The prompt file is read and checked whole before any decoding, so
 * a bad line costs nothing. CPU workers claim prompts in file order and decode each alone in their own cache (the
 * GPU backend: one thread, generate_cuda.c); the main thread writes finished lines strictly in file order (a
 * finished line waits for those before it), so the output does not depend on --threads and a crash leaves a prefix
 * of it. */
#include "generate.h"

#include <cblas.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "generate_impl.h"
#include "job_identity.h"
#include "json_util.h"
#include "nonfinite.h"
#include "prompt_file.h"
#include "rng.h"
#include "target_decode.h"
#include "target_family.h"
#include "target_model.h"
#include "util.h"
#include "weights_check.h"

#define PROG "dflash generate"
#define PROGRESS_SECONDS 1.0
#define SYNC_SECONDS 1.0
#define MAX_IDS 256

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " --target DIR --prompts FILE -o OUT.jsonl [options]\n"
            "\n"
            "Answers every prompt of FILE with the target's own continuation, greedy by default (temperature 0;\n"
            "--temperature samples), and writes\n"
            "OUT.jsonl for dflash-prepare: one line per prompt, in FILE's order,\n"
            "  {\"input_ids\": prompt + answer, \"loss_mask\": 0 on the prompt, 1 on the answer,\n"
            "   \"prompt_line\": its line in FILE, \"stop\": \"eos\" | \"max_new_tokens\" | \"max_len\"\n"
            "   \"decoding\": {the target, its digest, the backend, max_new_tokens, max_len, eos, suppress}\n"
            "   [, \"sampling\": {\"temperature\": T, \"top_p\": P, \"seed\": S} when sampled]}\n"
            "An answer ends after an EOS token (kept, trained) or --max-new-tokens tokens. FILE is JSONL as\n"
            "dflash-prepare reads it: a line's prompt is the leading run of its tokens with loss_mask 0 (labels\n"
            "-100); a line with input_ids only is all prompt; blank lines are ignored. Lines without input_ids\n"
            "(conversations as text) are refused: FILE must be tokenized.\n"
            "Resumable: when OUT exists, the prompts it already answers are skipped (their prompt must match\n"
            "FILE's) and a partial last line left by a crash is dropped and redone. Lines are appended with one\n"
            "write each and synced to disk at most once a second. The output does not depend on --threads.\n"
            "A rerun on an OUT decoded with other settings that change the text (the target's files, --backend,\n"
            "--max-new-tokens, --max-len, --eos, --suppress, the sampling) is refused, naming both.\n"
            "\n"
            "  --target DIR           target checkpoint folder (qwen3, llama, Qwen3.5; config.json + safetensors)\n"
            "  --prompts FILE         prompt JSONL\n"
            "  -o, --output OUT       output JSONL (appended to when it exists)\n"
            "  --max-new-tokens N     answer tokens per prompt at most (default 256)\n"
            "  --max-len N            prompt + answer tokens at most (default: the target's\n"
            "                         max_position_embeddings); a prompt of N tokens or more is an error\n"
            "  --limit N              only the first N prompts of FILE\n"
            "  --threads N            decoding threads, one KV cache each (default: CPUs, at most 16; cpu)\n"
            "  --backend cpu|cuda     where the target runs (default cpu). cuda (the dflash-cuda build): bf16 on\n"
            "                         GPU 0, continuous batching: up to --batch answers decoded together, one\n"
            "                         forward a step; tokens may differ from cpu's (fp32) where logits nearly tie\n"
            "  --batch N              cuda: sequences in the KV cache at once (default 64)\n"
            "  --eos ID               an end-of-sequence token id (repeatable; default: eos_token_id of the\n"
            "                         target's generation_config.json, else of its config.json)\n"
            "  --suppress ID          a token id never generated (repeatable; 'none': no id). Default: the\n"
            "                         drafter's mask token of a job's default drafter.mask_token_id (the\n"
            "                         target's last id), the id dflash eval's greedy choice skips too\n"
            "  --temperature T        sample at temperature T > 0 instead of the greedy choice (cpu backend)\n"
            "  --top-p P              with --temperature: sample among the most likely tokens of total\n"
            "                         probability P (0 < P <= 1, default 1: all of them)\n"
            "  --seed S               with --temperature: the draws (default 0); the token at answer position\n"
            "                         i of FILE's line L is drawn from the stream (S, L, i), so the output does\n"
            "                         not depend on --threads and a resumed run redoes the same draws; a rerun\n"
            "                         on an OUT made with other settings is refused\n"
            "  -q, --quiet            no progress lines\n"
            "  -h, --help             this text\n"
            "\n"
            "Progress (prompts done/total, tokens/s) goes to stderr at most once a second; the summary to stdout.\n"
            "A NaN or an infinity in the target's logits is an error naming the first weight that is not finite.\n"
            "Exit status: 0 done, 1 error (bad input names FILE:LINE), 2 usage error.\n");
}

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, PROG ": ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(try '" PROG " --help')\n");
    return 2;
}

static int parse_int(const char *flag, const char *s, long long lo, long long hi, long long *out)
{
    char *end = NULL;
    errno = 0;
    long long v = (*s == '-' || (*s >= '0' && *s <= '9')) ? strtoll(s, &end, 10) : 0;
    if (!end || *end || errno || v < lo || v > hi) {
        fprintf(stderr, PROG ": %s: '%s' is not an integer in [%lld, %lld]\n(try '" PROG " --help')\n", flag, s, lo,
                hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* ---- the output's lines ---- */

/* The ids of input_ids into *ids (n entries), checked against vocab; the message names the field and index. */
/* A number in [lo, hi] (lo itself excluded unless lo_ok) for flag, else a usage error naming it. */
static int parse_real(const char *flag, const char *v, double lo, double hi, int lo_ok, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !(x >= lo && x <= hi) || (!lo_ok && x == lo)) {
        fprintf(stderr, PROG ": %s: '%s' is not a number in %s%g, %g]\n(try '" PROG " --help')\n", flag, v,
                lo_ok ? "[" : "(", lo, hi);
        return 2;
    }
    *out = x;
    return 0;
}

static int read_ids(const json_t *arr, int vocab, int32_t **ids, int *n, char *why, size_t whylen)
{
    if (!json_is_array(arr)) {
        snprintf(why, whylen, "input_ids is %s, not an array of token ids", json_type_name(arr));
        return -1;
    }
    size_t len = json_array_size(arr);
    if (len > (size_t)INT32_MAX / 2) {
        snprintf(why, whylen, "input_ids has %zu entries: too long", len);
        return -1;
    }
    int32_t *out = xmalloc((len ? len : 1) * sizeof *out);
    for (size_t i = 0; i < len; i++) {
        const json_t *v = json_array_get(arr, i);
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (!json_is_integer(v) || id < 0 || id >= vocab) {
            if (json_is_integer(v))
                snprintf(why, whylen, "input_ids[%zu] = %" JSON_INTEGER_FORMAT " is outside the vocabulary (%d)", i,
                         id, vocab);
            else
                snprintf(why, whylen, "input_ids[%zu] is %s, not a token id", i, json_type_name(v));
            free(out);
            return -1;
        }
        out[i] = (int32_t)id;
    }
    *ids = out;
    *n = (int)len;
    return 0;
}

/* ---- the output: what a previous run finished ---- */

/* Scan out (open as fd): mark done[i] for the prompts it answers (checking each line's prompt against s), drop a
 * partial last line. 0, or -1 after printing the error. */
/* The decoding settings an output line records (temperature 0: greedy, the other two unused). */
typedef struct sampling {
    double temperature, top_p;
    long long seed;
} sampling;

/* x as the shortest of %.15g / %.17g that reads back as x (so "0.7" stays 0.7 in the output). */
static void fmt_real(char *buf, size_t n, double x)
{
    snprintf(buf, n, "%.15g", x);
    if (strtod(buf, NULL) != x) snprintf(buf, n, "%.17g", x);
}

/* For messages: "greedily" or "with temperature T, top_p P, seed S". */
static void sampling_describe(char *buf, size_t n, const sampling *d)
{
    char t[32], p[32];
    fmt_real(t, sizeof t, d->temperature);
    fmt_real(p, sizeof p, d->top_p);
    if (d->temperature == 0.0) snprintf(buf, n, "greedily");
    else snprintf(buf, n, "with temperature %s, top_p %s, seed %lld", t, p, d->seed);
}

/* Whether two settings decode differently (greedy ignores top_p and seed). */
static int sampling_differs(const sampling *a, const sampling *b)
{
    return a->temperature != b->temperature ||
           (a->temperature != 0.0 && (a->top_p != b->top_p || a->seed != b->seed));
}

/* The settings recorded by a line of OUT: no "sampling" member is greedy. 0, or -1 with why set. */
static int sampling_read(const json_t *root, sampling *d, const char **why)
{
    const json_t *sm = json_object_get(root, "sampling");
    *d = (sampling){.top_p = 1.0};
    if (!sm) return 0;
    const json_t *t = json_object_get(sm, "temperature"), *p = json_object_get(sm, "top_p");
    const json_t *sd = json_object_get(sm, "seed");
    if (!json_is_number(t) || !json_is_number(p) || !json_is_integer(sd)) {
        *why = "its \"sampling\" needs numbers temperature, top_p and an integer seed";
        return -1;
    }
    d->temperature = json_number_value(t), d->top_p = json_number_value(p), d->seed = json_integer_value(sd);
    return 0;
}

/* The settings besides the sampling that change an answer's text, recorded by every output line ("decoding"). */
typedef struct decoding {
    char target[1024];      /* --target as given (for messages) */
    char digest[40];        /* "<config>-<weights>" (job_identity_target): what is compared */
    char backend[8];        /* cpu | cuda */
    long long max_new, max_len;
    int32_t eos[MAX_IDS], suppress[MAX_IDS]; /* ascending, once each */
    int neos, nsuppress;
} decoding;

static int id_cmp(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* ids[0..n) ascending and once each; returns the new count. */
static int ids_normalize(int32_t *ids, int n)
{
    qsort(ids, (size_t)n, sizeof *ids, id_cmp);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (k == 0 || ids[i] != ids[k - 1]) ids[k++] = ids[i];
    return k;
}

static void ids_describe(char *buf, size_t n, const char *flag, const int32_t *ids, int k)
{
    size_t o = (size_t)snprintf(buf, n, "%s", flag);
    if (k == 0 && o < n) snprintf(buf + o, n - o, " none");
    for (int i = 0; i < k && o < n; i++) o += (size_t)snprintf(buf + o, n - o, " %d", ids[i]);
}

/* The ids of member key of o into ids (ascending, once each). 0, or -1 when it is not a list of ids. */
static int ids_read(const json_t *o, const char *key, int32_t *ids, int *k)
{
    const json_t *a = json_object_get(o, key);
    if (!json_is_array(a) || json_array_size(a) > MAX_IDS) return -1;
    *k = 0;
    for (size_t i = 0; i < json_array_size(a); i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) return -1;
        ids[(*k)++] = (int32_t)json_integer_value(v);
    }
    *k = ids_normalize(ids, *k);
    return 0;
}

/* The "decoding" record of a line. 0, or -1 with why set. */
static int decoding_read(const json_t *root, decoding *d, const char **why)
{
    const json_t *o = json_object_get(root, "decoding");
    const json_t *t = json_object_get(o, "target"), *dg = json_object_get(o, "target_digest");
    const json_t *be = json_object_get(o, "backend"), *mn = json_object_get(o, "max_new_tokens");
    const json_t *ml = json_object_get(o, "max_len");
    memset(d, 0, sizeof *d);
    if (!o) {
        *why = "it records no \"decoding\" settings (written by an older dflash generate)";
        return -1;
    }
    if (!json_is_string(t) || !json_is_string(dg) || !json_is_string(be) || !json_is_integer(mn) ||
        !json_is_integer(ml) || ids_read(o, "eos", d->eos, &d->neos) || ids_read(o, "suppress", d->suppress, &d->nsuppress)) {
        *why = "its \"decoding\" needs strings target, target_digest, backend, integers max_new_tokens, max_len and "
               "lists of ids eos, suppress";
        return -1;
    }
    snprintf(d->target, sizeof d->target, "%s", json_string_value(t));
    snprintf(d->digest, sizeof d->digest, "%s", json_string_value(dg));
    snprintf(d->backend, sizeof d->backend, "%s", json_string_value(be));
    d->max_new = json_integer_value(mn), d->max_len = json_integer_value(ml);
    return 0;
}

/* When a line decoded with settings had differs from this run's: both sides of the first difference into h and r
 * (as the flags that give them), and 1. */
static int decoding_differs(const decoding *had, const decoding *run, char *h, char *r, size_t n)
{
    if (strcmp(had->digest, run->digest)) {
        snprintf(h, n, "--target %.400s (digest %s)", had->target, had->digest);
        snprintf(r, n, "--target %.400s (digest %s)", run->target, run->digest);
    } else if (strcmp(had->backend, run->backend)) {
        snprintf(h, n, "--backend %s", had->backend);
        snprintf(r, n, "--backend %s", run->backend);
    } else if (had->max_new != run->max_new) {
        snprintf(h, n, "--max-new-tokens %lld", had->max_new);
        snprintf(r, n, "--max-new-tokens %lld", run->max_new);
    } else if (had->max_len != run->max_len) {
        snprintf(h, n, "--max-len %lld", had->max_len);
        snprintf(r, n, "--max-len %lld", run->max_len);
    } else if (had->neos != run->neos || memcmp(had->eos, run->eos, sizeof *had->eos * (size_t)had->neos)) {
        ids_describe(h, n, "--eos", had->eos, had->neos);
        ids_describe(r, n, "--eos", run->eos, run->neos);
    } else if (had->nsuppress != run->nsuppress ||
               memcmp(had->suppress, run->suppress, sizeof *had->suppress * (size_t)had->nsuppress)) {
        ids_describe(h, n, "--suppress", had->suppress, had->nsuppress);
        ids_describe(r, n, "--suppress", run->suppress, run->nsuppress);
    } else {
        return 0;
    }
    return 1;
}

static int output_resume(const char *out, int fd, const prompt_set *s, uint8_t *done, int64_t *ndone, int vocab,
                         const sampling *run, const decoding *dec)
{
    *ndone = 0;
    int rfd = dup(fd);
    FILE *f = rfd >= 0 ? fdopen(rfd, "r") : NULL;
    if (!f) {
        fprintf(stderr, PROG ": error: cannot read %s: %s\n", out, strerror(errno));
        if (rfd >= 0) close(rfd);
        return -1;
    }
    rewind(f);
    char *line = NULL, why[256];
    size_t cap = 0;
    ssize_t len;
    int64_t lineno = 0, good_end = 0, pos = 0;
    int rc = 0, partial = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        pos += len;
        int complete = len > 0 && line[len - 1] == '\n';
        json_error_t jerr;
        json_t *root = complete ? json_loadb(line, (size_t)len, 0, &jerr) : NULL;
        const json_t *pl = root ? json_object_get(root, "prompt_line") : NULL;
        if (!root || !json_is_integer(pl)) {
            json_decref(root);
            int c = fgetc(f);
            if (c == EOF) { /* the last line: a crash cut it short */
                partial = 1;
                break;
            }
            fprintf(stderr, PROG ": error: %s:%" PRId64 ": not a line of " PROG " (%s): use another -o\n", out,
                    lineno, root ? "no prompt_line" : complete ? "invalid JSON" : "no newline");
            rc = -1;
            break;
        }
        /* the prompt it answers: binary search by line (s is in line order) */
        int64_t want = json_integer_value(pl), lo = 0, hi = s->n - 1, at = -1;
        while (lo <= hi) {
            int64_t mid = lo + (hi - lo) / 2;
            if (s->v[mid].lineno == want) { at = mid; break; }
            if (s->v[mid].lineno < want) lo = mid + 1; else hi = mid - 1;
        }
        int32_t *ids = NULL;
        int n = 0;
        const char *bad = NULL;
        sampling had;
        decoding *dhad = xmalloc(sizeof *dhad);
        char mismatch[1200], hs[520], rs[520];
        if (at < 0) bad = "its prompt_line is not a prompt of this prompt file (or beyond --limit)";
        else if (done[at]) bad = "a second answer to the same prompt";
        else if (read_ids(json_object_get(root, "input_ids"), vocab, &ids, &n, why, sizeof why)) bad = why;
        else if (n <= s->v[at].plen || memcmp(ids, s->v[at].ids, sizeof *ids * (size_t)s->v[at].plen))
            bad = "its prompt differs from that line of the prompt file";
        else if (!sampling_read(root, &had, &bad) && sampling_differs(&had, run)) {
            char h[96], r[96];
            sampling_describe(h, sizeof h, &had);
            sampling_describe(r, sizeof r, run);
            snprintf(mismatch, sizeof mismatch, "decoded %s, this run %s (rerun with its settings)", h, r);
            bad = mismatch;
        } else if (!bad && !decoding_read(root, dhad, &bad) && decoding_differs(dhad, dec, hs, rs, sizeof hs)) {
            snprintf(mismatch, sizeof mismatch, "decoded with %s, this run with %s (rerun with its settings)", hs, rs);
            bad = mismatch;
        }
        free(dhad);
        if (bad) {
            fprintf(stderr, PROG ": error: %s:%" PRId64 ": prompt_line %" PRId64 ": %s: use another -o\n", out, lineno,
                    want, bad);
            rc = -1;
        } else {
            done[at] = 1;
            (*ndone)++;
            good_end = pos;
        }
        free(ids);
        json_decref(root);
        if (rc) break;
    }
    free(line);
    fclose(f);
    if (!rc && partial) {
        fprintf(stderr, PROG ": %s: dropping a partial last line (line %" PRId64 ") left by an interrupted run\n",
                out, lineno);
        if (ftruncate(fd, (off_t)good_end) != 0) {
            fprintf(stderr, PROG ": error: %s: cannot truncate: %s\n", out, strerror(errno));
            rc = -1;
        }
    }
    return rc;
}

/* ---- decoding ---- */

int gen_job_is_eos(const gen_job *j, int32_t id)
{
    for (int i = 0; i < j->neos; i++)
        if (j->eos[i] == id) return 1;
    return 0;
}

int gen_result_begin(const gen_job *j, const prompt_line *p, result *r)
{
    int room = j->max_len - p->plen, limit = j->max_new < room ? j->max_new : room;
    DF_ASSERT(limit >= 1); /* generate_main refuses a prompt that leaves no room */
    r->gen = xmalloc(sizeof *r->gen * (size_t)limit);
    r->n = 0;
    r->stop = limit < j->max_new ? "max_len" : "max_new_tokens";
    return limit;
}

void gen_job_publish(gen_job *j, int64_t i)
{
    pthread_mutex_lock(&j->lock);
    atomic_store(&j->res[i].ready, 1);
    pthread_cond_broadcast(&j->done_cond);
    pthread_mutex_unlock(&j->lock);
}

void gen_job_fail(gen_job *j, const errbuf *err)
{
    pthread_mutex_lock(&j->lock);
    if (!atomic_exchange(&j->failed, 1)) j->err = *err;
    pthread_cond_broadcast(&j->done_cond);
    pthread_mutex_unlock(&j->lock);
}

/* The token at answer position i of prompt p: greedy, or drawn from the stream (seed, p's line, i). */
static int32_t pick_token(const gen_job *j, const float *logits, const prompt_line *p, int i,
                          target_sample_item *scratch)
{
    if (j->temperature == 0.0) return target_logits_argmax(logits, j->vocab, j->suppress, j->nsuppress);
    rng r;
    rng_seed(&r, j->seed, (uint64_t)p->lineno, (uint64_t)i, 0);
    return target_logits_sample(logits, j->vocab, j->suppress, j->nsuppress, j->temperature, j->top_p,
                                rng_uniform(&r), scratch);
}

/* A forward's logits row: an error when it holds a NaN or an infinity, naming the first weight of the target that is
 * not finite (poisoned weights would otherwise decode to token 0 after token 0). */
static int logits_check(const gen_job *j, const float *logits, int pos, errbuf *err)
{
    int64_t at = nonfinite_groups_cpu(NULL, logits, j->vocab, 1, 1, j->vocab);
    if (at < 0) return 0;
    char why[400];
    weights_explain_nonfinite(j->target_dir, why, sizeof why);
    return errbuf_set(err, ERANGE, "the target's logits at answer position %d are not finite (%s at id %lld): %s",
                      pos, isnan(logits[at]) ? "nan" : "inf", (long long)at, why);
}

/* The answer of prompt p into r. */
static int decode_one(gen_job *j, target_cache *c, float *logits, target_sample_item *scratch, const prompt_line *p,
                      result *r, errbuf *err)
{
    int limit = gen_result_begin(j, p, r);
    int rc = target_cache_crop(c, 0, 0, err);
    if (!rc) rc = target_cache_forward_last(c, 0, p->ids, p->plen, NULL, 0, NULL, logits, err);
    while (!rc && !(rc = logits_check(j, logits, r->n, err))) {
        int32_t t = pick_token(j, logits, p, r->n, scratch);
        if (t < 0) {
            rc = errbuf_set(err, EINVAL, "every token id is suppressed (--suppress)");
            break;
        }
        r->gen[r->n++] = t;
        atomic_fetch_add(&j->tokens, 1);
        if (gen_job_is_eos(j, t)) {
            r->stop = "eos";
            break;
        }
        if (r->n == limit) break;
        rc = target_cache_forward(c, 0, &t, 1, NULL, 0, NULL, logits, err);
    }
    if (rc) errbuf_wrap(err, rc, "prompt of line %" PRId64 " (%d tokens)", (int64_t)p->lineno, p->plen);
    return rc;
}

static void *worker_main(void *arg)
{
    gen_job *j = arg;
    target_cache *c = NULL;
    errbuf err = {{0}};
    float *logits = xmalloc(sizeof *logits * (size_t)j->vocab);
    target_sample_item *scratch = j->temperature > 0.0 ? xmalloc(sizeof *scratch * (size_t)j->vocab) : NULL;
    int rc = target_cache_create(&c, j->m, 1, j->cache_len, &err);
    for (;;) {
        if (rc || atomic_load(&j->failed)) break;
        int64_t i = atomic_fetch_add(&j->next, 1);
        if (i >= j->ntodo) break;
        rc = decode_one(j, c, logits, scratch, &j->prompts->v[j->todo[i]], &j->res[i], &err);
        if (!rc) gen_job_publish(j, i);
    }
    if (rc) gen_job_fail(j, &err);
    target_cache_destroy(&c);
    free(logits);
    free(scratch);
    return NULL;
}

/* ---- writing ---- */

typedef struct strbuf {
    char *s;
    size_t n, cap;
} strbuf;

static void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(strbuf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        DF_ASSERT(k >= 0);
        if ((size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        b->cap = 2 * (b->cap + (size_t)k + 64);
        b->s = xrealloc(b->s, b->cap);
    }
}

/* One output line into b (cleared first). */
static void format_line(strbuf *b, const prompt_line *p, const result *r, const sampling *d, const decoding *dec)
{
    b->n = 0;
    sb_printf(b, "{\"input_ids\": [");
    for (int t = 0; t < p->plen; t++) sb_printf(b, t ? ", %d" : "%d", p->ids[t]);
    for (int t = 0; t < r->n; t++) sb_printf(b, ", %d", r->gen[t]);
    sb_printf(b, "], \"loss_mask\": [");
    for (int t = 0; t < p->plen + r->n; t++) sb_printf(b, t ? ", %d" : "%d", t >= p->plen);
    sb_printf(b, "], \"prompt_line\": %" PRId64 ", \"stop\": \"%s\"", (int64_t)p->lineno, r->stop);
    char *target = json_dumps(json_string(dec->target), JSON_ENCODE_ANY);
    sb_printf(b, ", \"decoding\": {\"target\": %s, \"target_digest\": \"%s\", \"backend\": \"%s\", \"max_new_tokens\": %lld, "
              "\"max_len\": %lld, \"eos\": [", target ? target : "\"\"", dec->digest, dec->backend, dec->max_new,
              dec->max_len);
    free(target);
    for (int i = 0; i < dec->neos; i++) sb_printf(b, i ? ", %d" : "%d", dec->eos[i]);
    sb_printf(b, "], \"suppress\": [");
    for (int i = 0; i < dec->nsuppress; i++) sb_printf(b, i ? ", %d" : "%d", dec->suppress[i]);
    sb_printf(b, "]}");
    if (d->temperature != 0.0) {
        char t[32], tp[32];
        fmt_real(t, sizeof t, d->temperature);
        fmt_real(tp, sizeof tp, d->top_p);
        sb_printf(b, ", \"sampling\": {\"temperature\": %s, \"top_p\": %s, \"seed\": %lld}", t, tp, d->seed);
    }
    sb_printf(b, "}\n");
}

/* Append b with one write(): a crash leaves the line whole or a partial tail that the next run drops. */
static int write_line(int fd, const strbuf *b)
{
    size_t off = 0;
    while (off < b->n) {
        ssize_t w = write(fd, b->s + off, b->n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        off += (size_t)w;
    }
    return 0;
}

/* ---- the command ---- */

typedef struct gen_opts {
    const char *target, *prompts, *out;
    long long max_new, max_len, limit, threads, batch, seed;
    double temperature, top_p;
    int32_t eos[MAX_IDS], suppress[MAX_IDS];
    int neos, nsuppress, eos_given, suppress_none, quiet, cuda;
} gen_opts;

static int parse_opts(int argc, char **argv, gen_opts *o)
{
    enum { O_TARGET = 256, O_PROMPTS, O_MAX_NEW, O_MAX_LEN, O_LIMIT, O_THREADS, O_EOS, O_SUPPRESS, O_BACKEND,
           O_BATCH, O_TEMPERATURE, O_TOP_P, O_SEED };
    static const struct option longopts[] = {
        {"target", required_argument, NULL, O_TARGET},       {"prompts", required_argument, NULL, O_PROMPTS},
        {"output", required_argument, NULL, 'o'},            {"max-new-tokens", required_argument, NULL, O_MAX_NEW},
        {"max-len", required_argument, NULL, O_MAX_LEN},     {"limit", required_argument, NULL, O_LIMIT},
        {"threads", required_argument, NULL, O_THREADS},     {"eos", required_argument, NULL, O_EOS},
        {"suppress", required_argument, NULL, O_SUPPRESS},   {"quiet", no_argument, NULL, 'q'},
        {"backend", required_argument, NULL, O_BACKEND},     {"batch", required_argument, NULL, O_BATCH},
        {"temperature", required_argument, NULL, O_TEMPERATURE}, {"top-p", required_argument, NULL, O_TOP_P},
        {"seed", required_argument, NULL, O_SEED},           {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    *o = (gen_opts){.max_new = 256, .threads = ncpu < 1 ? 1 : ncpu > 16 ? 16 : ncpu, .batch = 64, .top_p = 1.0};
    int top_p_given = 0, seed_given = 0;
    long long v;
    int opt;
    opterr = 0;
    optind = 1;
    while ((opt = getopt_long(argc, argv, ":o:qh", longopts, NULL)) != -1) {
        switch (opt) {
        case O_TARGET: o->target = optarg; break;
        case O_PROMPTS: o->prompts = optarg; break;
        case 'o': o->out = optarg; break;
        case O_MAX_NEW: if (parse_int("--max-new-tokens", optarg, 1, 1 << 24, &o->max_new)) return 2; break;
        case O_MAX_LEN: if (parse_int("--max-len", optarg, 2, 1 << 26, &o->max_len)) return 2; break;
        case O_LIMIT: if (parse_int("--limit", optarg, 1, INT64_MAX, &o->limit)) return 2; break;
        case O_THREADS: if (parse_int("--threads", optarg, 1, 1024, &o->threads)) return 2; break;
        case O_BATCH: if (parse_int("--batch", optarg, 1, 4096, &o->batch)) return 2; break;
        case O_TEMPERATURE:
            if (parse_real("--temperature", optarg, 0.0, 100.0, 1, &o->temperature)) return 2;
            break;
        case O_TOP_P:
            if (parse_real("--top-p", optarg, 0.0, 1.0, 0, &o->top_p)) return 2;
            top_p_given = 1;
            break;
        case O_SEED: if (parse_int("--seed", optarg, 0, INT64_MAX, &o->seed)) return 2; seed_given = 1; break;
        case O_BACKEND:
            if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda"))
                return usage_error("--backend: '%s' is not cpu or cuda", optarg);
            o->cuda = !strcmp(optarg, "cuda");
            break;
        case O_SUPPRESS:
            if (!strcmp(optarg, "none")) {
                o->suppress_none = 1;
                break;
            }
            /* fall through */
        case O_EOS:
            if (parse_int(opt == O_EOS ? "--eos" : "--suppress", optarg, 0, INT32_MAX, &v)) return 2;
            if ((opt == O_EOS ? o->neos : o->nsuppress) == MAX_IDS) return usage_error("too many ids (%s)", optarg);
            if (opt == O_EOS) o->eos[o->neos++] = (int32_t)v, o->eos_given = 1;
            else o->suppress[o->nsuppress++] = (int32_t)v;
            break;
        case 'q': o->quiet = 1; break;
        case 'h': usage(stdout); return 0;
        case ':': return usage_error("option %s needs a value", argv[optind - 1]);
        default: return usage_error("unknown option %s", argv[optind - 1]);
        }
    }
    if (optind < argc) return usage_error("unexpected argument \"%s\"", argv[optind]);
    if (!o->target) return usage_error("%s", "missing --target DIR");
    if (!o->prompts) return usage_error("%s", "missing --prompts FILE");
    if (!o->out) return usage_error("%s", "missing -o OUT.jsonl");
    if (o->suppress_none && o->nsuppress) return usage_error("%s", "--suppress none and --suppress ID exclude each other");
    if (o->temperature == 0.0 && (top_p_given || seed_given))
        return usage_error("%s needs --temperature > 0 (without it, decoding is greedy)",
                           top_p_given ? "--top-p" : "--seed");
#ifndef DFLASH_CUDA
    if (o->cuda) {
        fprintf(stderr, PROG ": error: --backend cuda: this build of dflash has no CUDA backend; run dflash-cuda "
                "(built beside dflash when nvcc is found)\n");
        return 1;
    }
#endif
    if (o->cuda && o->temperature > 0.0) {
        fprintf(stderr, PROG ": error: --temperature: sampling runs on the cpu backend only (--backend cuda decodes "
                "greedily)\n");
        return 1;
    }
    return -1;
}

static void progress(const gen_job *j, int64_t written, int64_t total, int64_t skipped, double t0, int force,
                     double *last)
{
    double now = now_seconds();
    if (!force && now - *last < PROGRESS_SECONDS) return;
    *last = now;
    long long tok = atomic_load(&j->tokens);
    double dt = now - t0;
    fprintf(stderr, PROG ": %" PRId64 "/%" PRId64 " prompts done, %lld tokens generated, %.1f tokens/s\n",
            skipped + written, total, tok, dt > 0 ? (double)tok / dt : 0.0);
}

int generate_main(int argc, char **argv)
{
    gen_opts o;
    int urc = parse_opts(argc, argv, &o);
    if (urc >= 0) return urc;
    errbuf err = {{0}};
    target_model *m = NULL;
    prompt_set ps = {0};
    uint8_t *done = NULL;
    int64_t *todo = NULL, ndone = 0, ntodo = 0;
    gen_job j = {0};
    pthread_t *th = NULL;
    int nth = 0, fd = -1, rc = 1;
    strbuf line = {0};
    decoding *dec = NULL;

    hf_config cfg;
    /* what the target's family cannot do on the chosen backend is refused here, before anything is loaded */
    if (hf_config_load(&cfg, o.target, &err) != 0 ||
        target_family_require(&cfg, o.cuda ? TARGET_BACKEND_CUDA : TARGET_BACKEND_CPU, TARGET_CAN_DECODE,
                              "decoding with a KV cache", NULL, &err) != 0) {
        fprintf(stderr, PROG ": error: %s\n", err.msg);
        return 1;
    }
    if (!o.nsuppress && !o.suppress_none) o.suppress[o.nsuppress++] = hf_reserved_token(&cfg, NULL);
    for (int i = 0; i < o.nsuppress; i++)
        if (o.suppress[i] >= cfg.vocab_size) {
            fprintf(stderr, PROG ": error: --suppress %d is outside the target's vocabulary (%d)\n", o.suppress[i],
                    cfg.vocab_size);
            return 1;
        }
    if (!o.eos_given) {
        if (hf_eos_tokens(o.target, cfg.vocab_size, o.eos, MAX_IDS, &o.neos, &err)) {
            fprintf(stderr, PROG ": error: %s\n", err.msg);
            return 1;
        }
        if (o.neos == 0)
            fprintf(stderr, PROG ": note: %s names no eos_token_id (and no --eos): every answer runs to its length "
                    "limit\n", o.target);
    }
    long long max_len = o.max_len ? o.max_len : cfg.max_position > 0 ? cfg.max_position : (1 << 26);
    if (prompt_file_read(&ps, o.prompts, cfg.vocab_size, o.limit > INT32_MAX ? INT32_MAX : (int)o.limit, &err)) {
        fprintf(stderr, PROG ": error: %s\n", err.msg);
        goto done;
    }
    int longest = 0;
    for (int i = 0; i < ps.n; i++)
        if (ps.v[i].plen > longest) longest = ps.v[i].plen;
    for (int64_t i = 0; i < ps.n; i++)
        if (ps.v[i].plen >= max_len) {
            fprintf(stderr, PROG ": error: %s:%" PRId64 ": prompt of %d tokens leaves no room in the cache of %lld "
                    "positions (%s)\n", o.prompts, (int64_t)ps.v[i].lineno, ps.v[i].plen, max_len,
                    o.max_len ? "--max-len" : "the target's max_position_embeddings; see --max-len");
            goto done;
        }
    done = xcalloc((size_t)ps.n, 1);
    /* O_APPEND: every line lands at the end whatever was dropped; the lock keeps a second run off the same file. */
    fd = open(o.out, O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, PROG ": error: cannot open %s for appending: %s\n", o.out, strerror(errno));
        goto done;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        fprintf(stderr, PROG ": error: %s: %s\n", o.out,
                errno == EWOULDBLOCK ? "another dflash generate is writing it" : strerror(errno));
        goto done;
    }
    const sampling run = {.temperature = o.temperature, .top_p = o.top_p, .seed = o.seed};
    dec = xcalloc(1, sizeof *dec);
    snprintf(dec->target, sizeof dec->target, "%s", o.target);
    snprintf(dec->backend, sizeof dec->backend, "%s", o.cuda ? "cuda" : "cpu");
    dec->max_new = o.max_new, dec->max_len = max_len;
    memcpy(dec->eos, o.eos, sizeof o.eos), memcpy(dec->suppress, o.suppress, sizeof o.suppress);
    dec->neos = ids_normalize(dec->eos, o.neos), dec->nsuppress = ids_normalize(dec->suppress, o.nsuppress);
    {
        char cd[17], wd[17];
        if (job_identity_target(o.target, cd, wd, &err)) {
            fprintf(stderr, PROG ": error: %s\n", err.msg);
            goto done;
        }
        snprintf(dec->digest, sizeof dec->digest, "%s-%s", cd, wd);
    }
    if (output_resume(o.out, fd, &ps, done, &ndone, cfg.vocab_size, &run, dec)) goto done;
    todo = xmalloc(sizeof *todo * (size_t)ps.n);
    for (int64_t i = 0; i < ps.n; i++)
        if (!done[i]) todo[ntodo++] = i;
    if (ndone) fprintf(stderr, PROG ": %s already answers %" PRId64 " of the %" PRId64 " prompts: skipping them\n",
                       o.out, ndone, (int64_t)ps.n);
    double t0 = now_seconds(), last_print = t0, last_sync = t0;
    int64_t written = 0;
    if (ntodo > 0) {
        if (!o.cuda && target_model_load(&m, o.target, -1, &err) != 0) {
            fprintf(stderr, PROG ": error: %s\n", err.msg);
            goto done;
        }
        j = (gen_job){.m = m, .target_dir = o.target, .prompts = &ps, .todo = todo, .ntodo = ntodo,
                      .max_new = (int)o.max_new, .longest = longest,
                      .batch = (int)(o.batch < ntodo ? o.batch : ntodo),
                      .max_len = (int)(max_len < INT32_MAX ? max_len : INT32_MAX), .vocab = cfg.vocab_size,
                      .eos = o.eos, .neos = o.neos, .suppress = o.suppress, .nsuppress = o.nsuppress,
                      .temperature = o.temperature, .top_p = o.top_p, .seed = (uint64_t)o.seed};
        long long cl = (long long)longest + o.max_new;
        j.cache_len = (int)(cl < j.max_len ? cl : j.max_len);
        j.res = xcalloc((size_t)ntodo, sizeof *j.res);
        pthread_mutex_init(&j.lock, NULL);
        pthread_cond_init(&j.done_cond, NULL);
        /* One BLAS thread per worker: parallelism comes from the prompts, and the arithmetic (so the tokens) stays
         * the same whatever --threads is. */
        openblas_set_num_threads(1);
        void *(*decoder)(void *) = worker_main;
        nth = (int)(o.threads < ntodo ? o.threads : ntodo);
#ifdef DFLASH_CUDA
        if (o.cuda) decoder = generate_cuda_worker, nth = 1; /* one thread drives the GPU's batch */
#endif
        th = xcalloc((size_t)nth, sizeof *th);
        for (int i = 0; i < nth; i++) {
            int e = pthread_create(&th[i], NULL, decoder, &j);
            if (e) {
                fprintf(stderr, PROG ": error: cannot start decoding thread %d: %s\n", i, strerror(e));
                pthread_mutex_lock(&j.lock);
                atomic_store(&j.failed, 1);
                pthread_mutex_unlock(&j.lock);
                nth = i;
                break;
            }
        }
        /* The writer: lines in file order as they finish. */
        int bad = nth == 0;
        while (!bad && written < ntodo) {
            pthread_mutex_lock(&j.lock);
            while (!atomic_load(&j.res[written].ready) && !atomic_load(&j.failed)) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_sec += 1;
                pthread_cond_timedwait(&j.done_cond, &j.lock, &ts);
                if (!o.quiet) progress(&j, written, ps.n, ndone, t0, 0, &last_print);
            }
            int ready = atomic_load(&j.res[written].ready);
            pthread_mutex_unlock(&j.lock);
            if (!ready) break; /* a worker failed */
            result *r = &j.res[written];
            format_line(&line, &ps.v[todo[written]], r, &run, dec);
            if (write_line(fd, &line) != 0) {
                fprintf(stderr, PROG ": error: writing %s: %s\n", o.out, strerror(errno ? errno : EIO));
                bad = 1;
                break;
            }
            XFREE(r->gen);
            written++;
            double now = now_seconds();
            if (now - last_sync >= SYNC_SECONDS) {
                if (fdatasync(fd) != 0) {
                    fprintf(stderr, PROG ": error: syncing %s: %s\n", o.out, strerror(errno));
                    bad = 1;
                    break;
                }
                last_sync = now;
            }
            if (!o.quiet) progress(&j, written, ps.n, ndone, t0, 0, &last_print);
        }
        if (bad) {
            pthread_mutex_lock(&j.lock);
            atomic_store(&j.failed, 1);
            pthread_mutex_unlock(&j.lock);
        }
        for (int i = 0; i < nth; i++) pthread_join(th[i], NULL);
        if (atomic_load(&j.failed) && !bad) fprintf(stderr, PROG ": error: %s\n", j.err.msg);
        if (bad || atomic_load(&j.failed)) goto done;
    }
    if (fdatasync(fd) != 0 || close(fd) != 0) {
        fd = -1;
        fprintf(stderr, PROG ": error: syncing %s: %s\n", o.out, strerror(errno));
        goto done;
    }
    fd = -1;
    if (!o.quiet && ntodo > 0) progress(&j, written, ps.n, ndone, t0, 1, &last_print);
    double dt = now_seconds() - t0;
    long long tok = atomic_load(&j.tokens);
    char where[64];
    if (o.cuda) snprintf(where, sizeof where, "on the GPU, batch %d", j.batch ? j.batch : (int)o.batch);
    else snprintf(where, sizeof where, "on %d thread%s", nth, nth == 1 ? "" : "s");
    printf("generated %" PRId64 " answers (%lld tokens, %.1f tokens/s %s); %" PRId64 " already in %s; %" PRId64
           " prompts in all\n", written, tok, dt > 0 ? (double)tok / dt : 0.0, where, ndone, o.out, (int64_t)ps.n);
    rc = 0;
done:
    if (fd >= 0) close(fd);
    if (j.res) {
        for (int64_t i = 0; i < ntodo; i++) free(j.res[i].gen);
        free(j.res);
        pthread_mutex_destroy(&j.lock);
        pthread_cond_destroy(&j.done_cond);
    }
    free(th);
    free(dec);
    free(line.s);
    free(todo);
    free(done);
    prompt_set_free(&ps);
    target_model_destroy(&m);
    return rc;
}

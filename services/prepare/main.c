/* dflash-prepare: turns tokenized JSONL (input_ids + loss_mask or labels per line), or with --chat conversations
 * (messages or ShareGPT conversations, tokenized with the target's tokenizer and chat template), into token shards
 * (common/formats/SHARD_FORMAT.md), and inspects/validates existing shards (--inspect). Bad lines are skipped and
 * reported as "<file>:<line>: skipped: <reason>" (or are fatal with --strict). Exit status: 0 done, 1 I/O error,
 * bad data under --strict or nothing prepared, 2 usage error. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chat_template.h"
#include "shard.h"
#include "hf_config.h"
#include "job_config.h"
#include "tokenizer.h"
#include "util.h"

#define PROG "dflash-prepare"
#define SKIP_PRINT_CAP 20
#define PROGRESS_LINES 100000
#define PROGRESS_SECONDS 1.0

enum skip_reason {
    SKIP_JSON,
    SKIP_NOT_OBJECT,
    SKIP_NO_INPUT_IDS,
    SKIP_BAD_INPUT_IDS,
    SKIP_ID_RANGE,
    SKIP_EMPTY,
    SKIP_NO_MASK,
    SKIP_LEN_MISMATCH,
    SKIP_BAD_MASK,
    SKIP_NO_TRAINED,
    SKIP_TOO_LONG,
    SKIP_NO_MESSAGES,
    SKIP_BAD_MESSAGE,
    SKIP_UNKNOWN_ROLE,
    SKIP_EMPTY_CONV,
    SKIP_NO_ASSISTANT,
    SKIP_TEMPLATE,
    SKIP_COUNT
};

/* Short names: the summary's categories and the start of every per-line message. */
static const char *const skip_reason_name[SKIP_COUNT] = {
    [SKIP_JSON] = "invalid JSON",
    [SKIP_NOT_OBJECT] = "not a JSON object",
    [SKIP_NO_INPUT_IDS] = "missing input_ids",
    [SKIP_BAD_INPUT_IDS] = "input_ids not an array of integers",
    [SKIP_ID_RANGE] = "token id out of range",
    [SKIP_EMPTY] = "empty input_ids",
    [SKIP_NO_MASK] = "neither loss_mask nor labels",
    [SKIP_LEN_MISMATCH] = "length mismatch",
    [SKIP_BAD_MASK] = "bad loss_mask/labels value",
    [SKIP_NO_TRAINED] = "no trained token",
    [SKIP_TOO_LONG] = "longer than --max-len",
    [SKIP_NO_MESSAGES] = "neither messages nor conversations",
    [SKIP_BAD_MESSAGE] = "bad message",
    [SKIP_UNKNOWN_ROLE] = "unknown role",
    [SKIP_EMPTY_CONV] = "empty conversation",
    [SKIP_NO_ASSISTANT] = "no assistant turn",
    [SKIP_TEMPLATE] = "chat template error",
};

struct prepare_opts {
    uint64_t max_tokens_per_shard; /* a shard is closed before a sample would take it past this (unless empty) */
    uint64_t max_len;              /* 0: no limit */
    uint64_t vocab;                /* 0: no check */
    char vocab_from[160];          /* where vocab came from, for messages: "--vocab", or the job's target */
    bool strict, force, inspect;
    bool chat, truncate;            /* --chat: conversations in; --truncate: cut at --max-len instead of skipping */
    const char *tokenizer_dir;      /* --tokenizer (tokenizer.json, tokenizer_config.json) */
    const char *template_file;      /* --template FILE.jinja, else the model folder's chat template */
    const char **template_args;     /* --template-arg key=value (Jinja variables), n_template_args of them */
    int n_template_args;
    uint64_t threads;               /* --threads: --chat tokenizes on this many threads (default: online CPUs) */
    const char *outdir;
    const char *job_config;         /* -c JOB.ini: its data.max_batch_tokens is checked against the samples */
    uint64_t batch_tokens;          /* that value (0: no -c) */
};

/* The one state of a prepare run. */
struct prepare {
    struct prepare_opts opt;
    shard_writer *w;
    char **written; /* shards published by this run (removed again on a fatal error) */
    size_t nwritten;
    uint64_t samples, tokens, trained, lines;
    uint64_t longest, over_batch; /* the longest sample; samples longer than opt.batch_tokens */
    uint64_t skipped[SKIP_COUNT];
    uint32_t *tok; /* the current line's sample */
    uint8_t *mask;
    size_t cap;
    char detail[256]; /* why the current line was skipped */
    /* --chat */
    tokenizer *tk;
    chat_template *tpl;
    struct chat_worker *workers;
};

/* One --chat tokenizing thread: its own buffers (the tokenizer is shared, read-only), and its share of a batch. */
struct chat_worker {
    const tokenizer *tk;
    const chat_template *tpl;
    const struct prepare_opts *opt;
    tok_buf tb;
    chat_text ct;
    uint32_t *tok;
    uint8_t *mask;
    size_t cap;
    char detail[256];
    uint64_t truncated;
    struct chat_batch *batch;
    size_t first, count;                   /* lines [first, first + count) of the batch */
    uint32_t *out_tok; uint8_t *out_mask;  /* the tokens of its good lines, in line order */
    size_t out_n, out_cap;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [options] -o OUTDIR INPUT.jsonl...\n"
            "       " PROG " --chat (--tokenizer MODEL_DIR | -c JOB.ini) [options] -o OUTDIR CONVERSATIONS.jsonl...\n"
            "       " PROG " --inspect [--vocab V] [--tokenizer MODEL_DIR] SHARD_OR_DIR...\n"
            "\n"
            "Converts tokenized JSONL into dflash token shards OUTDIR/shard-00000.shard, ... (each written\n"
            "atomically). Each line is a JSON object with \"input_ids\" (non-negative integers) and either\n"
            "\"loss_mask\" (0/1 or booleans, same length) or \"labels\" (same length; -100 = not trained, any other\n"
            "value = trained); loss_mask wins when both are present. Blank lines are ignored. Other bad lines\n"
            "are skipped and reported on stderr as FILE:LINE: skipped: REASON. INPUT \"-\" reads stdin.\n"
            "\n"
            "  -o, --output DIR            output folder (created if missing)\n"
            "  --max-tokens-per-shard N    start a new shard before one would exceed N tokens (default 33554432)\n"
            "  --max-len L                 skip samples longer than L tokens (default: no limit)\n"
            "  --vocab V                   skip samples with a token id >= V (with --inspect: check it)\n"
            "  --strict                    the first bad line is a fatal error (exit 1)\n"
            "  --force                     remove *.shard files already in OUTDIR instead of refusing\n"
            "  --chat                      lines are conversations: {\"messages\": [{\"role\", \"content\"}...],\n"
            "                              \"tools\": [...]} (messages as the template takes them: reasoning_content,\n"
            "                              tool_calls...) or ShareGPT {\"conversations\": [{\"from\": human|gpt|system,\n"
            "                              \"value\"}...]}; rendered with the model's own Jinja chat template, trained on\n"
            "                              what each assistant turn generates: reasoning when rendered, content, tool\n"
            "                              calls, end-of-turn token\n"
            "  --tokenizer DIR             (--chat) the model folder holding tokenizer.json and tokenizer_config.json\n"
            "  -c, --config JOB.ini        the job config: samples longer than its data.max_batch_tokens (which\n"
            "                              training cuts to that) are counted in the summary and warned about;\n"
            "                              with --chat and no --tokenizer, its target.model folder is the tokenizer;\n"
            "                              without --vocab, samples with an id outside target.model's vocabulary\n"
            "                              are skipped (the job would refuse them)\n"
            "  --template FILE.jinja       (--chat) this Jinja chat template instead of the model folder's\n"
            "                              (chat_template.jinja, else tokenizer_config.json \"chat_template\")\n"
            "                              or harmony: gpt-oss's format, which dflash ships and chooses by itself\n"
            "                              for a gpt-oss tokenizer (whose folder has no template)\n"
            "  --template-arg KEY=VALUE    (--chat) a variable for the template, as apply_chat_template(KEY=VALUE):\n"
            "                              e.g. enable_thinking=true; VALUE is JSON when it parses, else a string;\n"
            "                              repeatable\n"
            "  --threads N                 (--chat) tokenizing threads (default: the online CPUs)\n"
            "  --truncate                  cut samples longer than --max-len instead of skipping them\n"
            "  --inspect                   validate the given shards or shard folders and print their counts;\n"
            "                              with --tokenizer DIR also the first sample as text, trained spans in [[ ]]\n"
            "  -h, --help                  this text\n"
            "\n"
            "The summary goes to stdout; progress, skipped lines and errors go to stderr.\n"
            "Exit status: 0 done, 1 I/O error / bad line under --strict / nothing prepared, 2 usage error.\n");
}

/* Parse a decimal option value in [lo, hi]; prints a usage error and returns -1 otherwise. */
static int parse_u64(const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = (*s >= '0' && *s <= '9') ? strtoull(s, &end, 10) : 0;
    if (!end || *end || errno || v < lo || v > hi) {
        fprintf(stderr, PROG ": %s: '%s' is not an integer in [%" PRIu64 ", %" PRIu64 "]\n", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* ---- one JSONL line -> one sample ---- */

/* Room for a sample of n tokens in the buffers *tok / *mask of capacity *cap (doubling from 4096). */
static void sample_reserve(uint32_t **tok, uint8_t **mask, size_t *cap, size_t n)
{
    if (n <= *cap) return;
    size_t c = *cap ? *cap : 4096;
    while (c < n) c *= 2;
    *tok = xrealloc(*tok, c * sizeof **tok);
    *mask = xrealloc(*mask, c);
    *cap = c;
}

static void prepare_reserve(struct prepare *p, size_t n) { sample_reserve(&p->tok, &p->mask, &p->cap, n); }

#define SKIP(reason, ...) (snprintf(p->detail, sizeof p->detail, __VA_ARGS__), (int)(reason))

/* Fill p->tok/p->mask from one line; returns the sample length, or -1 - reason with p->detail set. */
static int64_t prepare_parse_line(struct prepare *p, const char *line, size_t len)
{
    json_error_t jerr;
    json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    int64_t ret;
    if (!root) return -1 - SKIP(SKIP_JSON, "invalid JSON: %s (column %d)", jerr.text, jerr.column);
    json_t *ids = json_object_get(root, "input_ids");
    json_t *lm = json_object_get(root, "loss_mask");
    json_t *labels = json_object_get(root, "labels");
    json_t *m = lm ? lm : labels;
    const char *mname = lm ? "loss_mask" : "labels";
    if (!json_is_object(root)) { ret = -1 - SKIP(SKIP_NOT_OBJECT, "not a JSON object"); goto done; }
    if (!ids) { ret = -1 - SKIP(SKIP_NO_INPUT_IDS, "missing input_ids"); goto done; }
    if (!json_is_array(ids)) {
        ret = -1 - SKIP(SKIP_BAD_INPUT_IDS, "input_ids not an array of integers: input_ids is not an array");
        goto done;
    }
    size_t n = json_array_size(ids);
    if (n == 0) { ret = -1 - SKIP(SKIP_EMPTY, "empty input_ids"); goto done; }
    if (!m) { ret = -1 - SKIP(SKIP_NO_MASK, "neither loss_mask nor labels"); goto done; }
    if (!json_is_array(m)) {
        ret = -1 - SKIP(SKIP_BAD_MASK, "bad loss_mask/labels value: %s is not an array", mname);
        goto done;
    }
    if (json_array_size(m) != n) {
        ret = -1 - SKIP(SKIP_LEN_MISMATCH, "length mismatch: input_ids has %zu entries, %s has %zu", n, mname,
                        json_array_size(m));
        goto done;
    }
    if (p->opt.max_len && n > p->opt.max_len) {
        ret = -1 - SKIP(SKIP_TOO_LONG, "longer than --max-len: %zu tokens > %" PRIu64, n, p->opt.max_len);
        goto done;
    }
    prepare_reserve(p, n);
    uint64_t id_limit = p->opt.vocab ? p->opt.vocab : (uint64_t)UINT32_MAX + 1;
    size_t trained = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(ids, i);
        if (!json_is_integer(v)) {
            ret = -1 - SKIP(SKIP_BAD_INPUT_IDS, "input_ids not an array of integers: input_ids[%zu] is not an integer", i);
            goto done;
        }
        json_int_t id = json_integer_value(v);
        if (id < 0 || (uint64_t)id >= id_limit) {
            ret = -1 - SKIP(SKIP_ID_RANGE, "token id out of range: input_ids[%zu] = %" JSON_INTEGER_FORMAT "%s%s", i,
                            id, id < 0 ? " is negative" : p->opt.vocab ? " >= " : " does not fit in u32",
                            id >= 0 && p->opt.vocab ? p->opt.vocab_from : "");
            goto done;
        }
        p->tok[i] = (uint32_t)id;
        json_t *mv = json_array_get(m, i);
        int bit;
        if (json_is_boolean(mv)) {
            bit = json_is_true(mv);
        } else if (!json_is_integer(mv)) {
            ret = -1 - SKIP(SKIP_BAD_MASK, "bad loss_mask/labels value: %s[%zu] is not an integer", mname, i);
            goto done;
        } else if (lm) {
            json_int_t b = json_integer_value(mv);
            if (b != 0 && b != 1) {
                ret = -1 - SKIP(SKIP_BAD_MASK, "bad loss_mask/labels value: loss_mask[%zu] = %" JSON_INTEGER_FORMAT
                                " (must be 0 or 1)", i, b);
                goto done;
            }
            bit = (int)b;
        } else {
            bit = json_integer_value(mv) != -100;
        }
        p->mask[i] = (uint8_t)bit;
        trained += (size_t)bit;
    }
    if (trained == 0) { ret = -1 - SKIP(SKIP_NO_TRAINED, "no trained token (%s excludes all %zu)", mname, n); goto done; }
    ret = (int64_t)n;
done:
    json_decref(root);
    return ret;
}

/* ---- --chat: one conversation -> one sample ---- */

static const char *sharegpt_role(const char *from)
{
    if (!strcmp(from, "human") || !strcmp(from, "user")) return "user";
    if (!strcmp(from, "gpt") || !strcmp(from, "assistant")) return "assistant";
    if (!strcmp(from, "system")) return "system";
    if (!strcmp(from, "tool") || !strcmp(from, "function_call") || !strcmp(from, "observation")) return "tool";
    return NULL;
}

/* Roles a conversation may hold (the template decides how each renders; another name is most likely a typo). */
static bool chat_role_known(const char *r)
{
    static const char *const roles[] = {"system", "user", "assistant", "tool", "ipython", "developer", NULL};
    for (int i = 0; roles[i]; i++) if (!strcmp(r, roles[i])) return true;
    return false;
}

/* A copy of v with every string in it normalized by the tokenizer (NFC): encode's offsets are exact on
 * normalized text, and the spans are found in the rendering of these. */
static json_t *chat_normalized(const tokenizer *tk, json_t *v)
{
    size_t i, nl;
    const char *k;
    json_t *x, *r;
    switch (json_typeof(v)) {
    case JSON_STRING: {
        const unsigned char *u = (const unsigned char *)json_string_value(v);
        size_t n = json_string_length(v), k = 0;
        while (k < n && u[k] < 0x80) k++;
        if (k == n) return json_incref(v); /* ASCII: normalization leaves it as is */
        char *s = tokenizer_normalize(tk, json_string_value(v), n, &nl);
        if (!s) return json_incref(v);
        r = json_stringn_nocheck(s, nl);
        free(s);
        return r;
    }
    case JSON_ARRAY:
        r = json_array();
        json_array_foreach(v, i, x) json_array_append_new(r, chat_normalized(tk, x));
        return r;
    case JSON_OBJECT:
        r = json_object();
        json_object_foreach(v, k, x) json_object_set_new(r, k, chat_normalized(tk, x));
        return r;
    default:
        return json_incref(v);
    }
}

/* Fill p->tok/p->mask from one conversation line; returns the sample length, or -1 - reason with p->detail set. */
static int64_t prepare_parse_chat(struct chat_worker *p, const char *line, size_t len)
{
    json_error_t jerr;
    json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return -1 - SKIP(SKIP_JSON, "invalid JSON: %s (column %d)", jerr.text, jerr.column);
    int64_t ret;
    json_t *msgs = json_array(), *tools = NULL;
    size_t n = 0;
    if (!json_is_object(root)) { ret = -1 - SKIP(SKIP_NOT_OBJECT, "not a JSON object"); goto done; }
    json_t *arr = json_object_get(root, "messages");
    bool sharegpt = false;
    if (!arr && (arr = json_object_get(root, "conversations"))) sharegpt = true;
    if (!json_is_array(arr)) {
        ret = -1 - SKIP(SKIP_NO_MESSAGES, "neither messages nor conversations is an array");
        goto done;
    }
    n = json_array_size(arr);
    if (n == 0) { ret = -1 - SKIP(SKIP_EMPTY_CONV, "empty conversation"); goto done; }
    const char *rk = sharegpt ? "from" : "role", *ck = sharegpt ? "value" : "content";
    const char *arrname = sharegpt ? "conversations" : "messages";
    bool assistant = false;
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(arr, i);
        const char *role = json_string_value(json_object_get(m, rk));
        json_t *cv = json_object_get(m, ck);
        /* a message's content is a string; a messages-format one may also be null or a list of parts */
        if (!role || (sharegpt ? !json_is_string(cv) : cv && !json_is_string(cv) && !json_is_null(cv) && !json_is_array(cv))) {
            ret = -1 - SKIP(SKIP_BAD_MESSAGE, "bad message: %s[%zu] needs string \"%s\" and \"%s\"", arrname, i, rk, ck);
            goto done;
        }
        const char *r = sharegpt ? sharegpt_role(role) : role;
        if (!r || !chat_role_known(r)) {
            ret = -1 - SKIP(SKIP_UNKNOWN_ROLE, "unknown role: %s[%zu] %s \"%.40s\"", arrname, i, rk, role);
            goto done;
        }
        assistant |= !strcmp(r, "assistant");
        if (sharegpt) json_array_append_new(msgs, json_pack("{ssso}", "role", r, "content", chat_normalized(p->tk, cv)));
        else json_array_append_new(msgs, chat_normalized(p->tk, m));
    }
    if (!assistant) { ret = -1 - SKIP(SKIP_NO_ASSISTANT, "no assistant turn in %zu messages", n); goto done; }
    json_t *tv = json_object_get(root, "tools");
    if (tv && !json_is_null(tv)) {
        if (!json_is_array(tv)) { ret = -1 - SKIP(SKIP_BAD_MESSAGE, "bad message: \"tools\" is not an array"); goto done; }
        tools = chat_normalized(p->tk, tv);
    }
    errbuf err;
    if (chat_template_render(p->tpl, msgs, tools, &p->ct, &err) != 0) {
        ret = -1 - SKIP(SKIP_TEMPLATE, "chat template error: %.200s", err.msg);
        goto done;
    }
    tok_buf_clear(&p->tb);
    if (tokenizer_encode(p->tk, &p->tb, p->ct.text, p->ct.len) != 0) {
        ret = -1 - SKIP(SKIP_BAD_MESSAGE, "bad message: content is not valid UTF-8");
        goto done;
    }
    size_t nt = p->tb.n;
    if (p->opt->max_len && nt > p->opt->max_len) {
        if (!p->opt->truncate) {
            ret = -1 - SKIP(SKIP_TOO_LONG, "longer than --max-len: %zu tokens > %" PRIu64, nt, p->opt->max_len);
            goto done;
        }
        p->truncated++;
    }
    sample_reserve(&p->tok, &p->mask, &p->cap, nt);
    chat_text_mask(&p->ct, p->tb.start, p->tb.end, nt, p->mask);
    if (p->opt->max_len && nt > p->opt->max_len) nt = p->opt->max_len;
    size_t trained = 0;
    for (size_t i = 0; i < nt; i++) { p->tok[i] = (uint32_t)p->tb.ids[i]; trained += p->mask[i]; }
    if (p->opt->vocab)
        for (size_t i = 0; i < nt; i++)
            if (p->tok[i] >= p->opt->vocab) {
                ret = -1 - SKIP(SKIP_ID_RANGE, "token id out of range: token %zu = %u >= %s", i, p->tok[i],
                                      p->opt->vocab_from);
                goto done;
            }
    if (!trained) {
        ret = -1 - SKIP(SKIP_NO_TRAINED, "no trained token (assistant content empty or cut by --truncate)");
        goto done;
    }
    ret = (int64_t)nt;
done:
    json_decref(msgs);
    json_decref(tools);
    json_decref(root);
    return ret;
}

/* ---- shards ---- */

static int prepare_shard_finish(struct prepare *p, errbuf *err)
{
    if (!p->w) return 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/shard-%05zu.shard", p->opt.outdir, p->nwritten);
    int ret = shard_writer_close(&p->w, err);
    if (ret != 0) return ret;
    p->written = xrealloc(p->written, (p->nwritten + 1) * sizeof *p->written);
    p->written[p->nwritten++] = xstrdup(path);
    return 0;
}

static int prepare_add(struct prepare *p, size_t n, errbuf *err)
{
    int ret;
    if (p->w && shard_writer_ntokens(p->w) > 0 && shard_writer_ntokens(p->w) + n > p->opt.max_tokens_per_shard)
        if ((ret = prepare_shard_finish(p, err)) != 0) return ret;
    if (!p->w) {
        char path[4096];
        snprintf(path, sizeof path, "%s/shard-%05zu.shard", p->opt.outdir, p->nwritten);
        if ((ret = shard_writer_open(&p->w, path, err)) != 0) return ret;
    }
    if ((ret = shard_writer_add(p->w, p->tok, p->mask, n, err)) != 0) return ret;
    p->samples++;
    p->tokens += n;
    if (n > p->longest) p->longest = n;
    if (p->opt.batch_tokens && n > p->opt.batch_tokens) p->over_batch++;
    for (size_t i = 0; i < n; i++) p->trained += p->mask[i];
    return 0;
}

/* Remove what this run published, so that a failed run leaves no partial dataset behind. */
static void prepare_remove_written(struct prepare *p)
{
    shard_writer_discard(&p->w);
    for (size_t i = 0; i < p->nwritten; i++) unlink(p->written[i]);
    if (p->nwritten) fprintf(stderr, PROG ": removed the %zu shard(s) this run had written\n", p->nwritten);
}

/* Create outdir if needed; refuse (or with --force clear) *.shard files already there. */
static int prepare_outdir(const struct prepare_opts *o)
{
    if (mkdir(o->outdir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, PROG ": error: cannot create output folder %s: %s\n", o->outdir, strerror(errno));
        return -1;
    }
    DIR *d = opendir(o->outdir);
    if (!d) {
        fprintf(stderr, PROG ": error: cannot open output folder %s: %s\n", o->outdir, strerror(errno));
        return -1;
    }
    size_t found = 0;
    int ret = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (e->d_name[0] == '.' || n <= 6 || strcmp(e->d_name + n - 6, ".shard") != 0) continue;
        found++;
        if (!o->force) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", o->outdir, e->d_name);
        if (unlink(path) != 0) {
            fprintf(stderr, PROG ": error: cannot remove %s: %s\n", path, strerror(errno));
            ret = -1;
        }
    }
    closedir(d);
    if (found && !o->force) {
        fprintf(stderr, PROG ": error: %s already holds %zu *.shard file(s); remove them or pass --force\n",
                o->outdir, found);
        return -1;
    }
    return ret;
}

/* ---- input files ---- */

struct input {
    const char *name;
    FILE *f;
    uint64_t size; /* 0 when unknown (pipe) */
};

static void prepare_report_skip(struct prepare *p, const char *file, uint64_t line, int reason)
{
    uint64_t k = ++p->skipped[reason];
    if (k <= SKIP_PRINT_CAP)
        fprintf(stderr, "%s:%" PRIu64 ": skipped: %s\n", file, line, p->detail);
    if (k == SKIP_PRINT_CAP)
        fprintf(stderr, PROG ": further lines skipped for \"%s\" are counted in the summary, not shown\n",
                skip_reason_name[reason]);
}

/* ---- --chat: batches of lines tokenized by the workers in parallel, added in line order ---- */

#define CHAT_BATCH_LINES 4096
#define CHAT_BATCH_BYTES (32u << 20)

struct chat_batch {
    char *text; size_t text_len, text_cap;
    size_t *off, *len; uint64_t *lineno; int64_t *ret; size_t *tok_off; char (*detail)[256];
    size_t n;
};

static void *chat_worker_main(void *arg)
{
    struct chat_worker *w = arg;
    struct chat_batch *b = w->batch;
    w->out_n = 0;
    for (size_t i = w->first; i < w->first + w->count; i++) {
        int64_t n = prepare_parse_chat(w, b->text + b->off[i], b->len[i]);
        b->ret[i] = n;
        if (n < 0) { memcpy(b->detail[i], w->detail, sizeof w->detail); continue; }
        if (w->out_n + (size_t)n > w->out_cap) {
            w->out_cap = (w->out_n + (size_t)n) * 2;
            w->out_tok = xrealloc(w->out_tok, w->out_cap * sizeof *w->out_tok);
            w->out_mask = xrealloc(w->out_mask, w->out_cap);
        }
        b->tok_off[i] = w->out_n;
        memcpy(w->out_tok + w->out_n, w->tok, (size_t)n * sizeof *w->tok);
        memcpy(w->out_mask + w->out_n, w->mask, (size_t)n);
        w->out_n += (size_t)n;
    }
    return NULL;
}

/* Tokenize the batch on the workers, then report or add its lines in order; 0 or -1 after a fatal error. */
static int chat_batch_run(struct prepare *p, struct chat_batch *b, const char *name)
{
    size_t T = p->opt.threads;
    pthread_t *th = xcalloc(T, sizeof *th);
    for (size_t t = 0; t < T; t++) {
        struct chat_worker *w = &p->workers[t];
        w->batch = b; w->first = b->n * t / T; w->count = b->n * (t + 1) / T - w->first;
        if (t > 0 && pthread_create(&th[t], NULL, chat_worker_main, w) != 0) DF_ASSERT(!"pthread_create");
    }
    chat_worker_main(&p->workers[0]);
    for (size_t t = 1; t < T; t++) pthread_join(th[t], NULL);
    free(th);
    errbuf err = {{0}};
    for (size_t t = 0; t < T; t++) {
        struct chat_worker *w = &p->workers[t];
        for (size_t i = w->first; i < w->first + w->count; i++) {
            if (b->ret[i] < 0) {
                memcpy(p->detail, b->detail[i], sizeof p->detail);
                if (p->opt.strict) {
                    fprintf(stderr, PROG ": error: %s:%" PRIu64 ": %s (--strict)\n", name, b->lineno[i], p->detail);
                    return -1;
                }
                prepare_report_skip(p, name, b->lineno[i], (int)(-1 - b->ret[i]));
                continue;
            }
            size_t n = (size_t)b->ret[i];
            prepare_reserve(p, n);
            memcpy(p->tok, w->out_tok + b->tok_off[i], n * sizeof *p->tok);
            memcpy(p->mask, w->out_mask + b->tok_off[i], n);
            if (prepare_add(p, n, &err) != 0) { fprintf(stderr, PROG ": error: %s\n", err.msg); return -1; }
        }
    }
    b->n = 0; b->text_len = 0;
    return 0;
}

static int prepare_file_chat(struct prepare *p, struct input *in, double *last_progress)
{
    struct chat_batch b = {0};
    b.off = xmalloc(CHAT_BATCH_LINES * sizeof *b.off); b.len = xmalloc(CHAT_BATCH_LINES * sizeof *b.len);
    b.lineno = xmalloc(CHAT_BATCH_LINES * sizeof *b.lineno); b.ret = xmalloc(CHAT_BATCH_LINES * sizeof *b.ret);
    b.tok_off = xmalloc(CHAT_BATCH_LINES * sizeof *b.tok_off); b.detail = xmalloc(CHAT_BATCH_LINES * sizeof *b.detail);
    char *line = NULL;
    size_t cap = 0;
    uint64_t lineno = 0, bytes = 0;
    ssize_t len;
    int ret = 0;
    errno = 0;
    while (ret == 0) {
        len = getline(&line, &cap, in->f);
        if (len >= 0) {
            lineno++;
            p->lines++;
            bytes += (uint64_t)len;
            while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
            size_t start = strspn(line, " \t");
            if ((size_t)len > start) {
                if (b.text_len + (size_t)len > b.text_cap) {
                    b.text_cap = (b.text_len + (size_t)len) * 2;
                    b.text = xrealloc(b.text, b.text_cap);
                }
                memcpy(b.text + b.text_len, line, (size_t)len);
                b.off[b.n] = b.text_len; b.len[b.n] = (size_t)len; b.lineno[b.n] = lineno; b.n++;
                b.text_len += (size_t)len;
            }
        }
        if (b.n && (len < 0 || b.n == CHAT_BATCH_LINES || b.text_len >= CHAT_BATCH_BYTES)) {
            if (chat_batch_run(p, &b, in->name) != 0) { ret = -1; break; }
            double t = now_seconds();
            if (t - *last_progress >= PROGRESS_SECONDS) {
                char pct[32] = "";
                if (in->size) snprintf(pct, sizeof pct, " (%.0f%%)", 100.0 * (double)bytes / (double)in->size);
                fprintf(stderr, PROG ": %s: %" PRIu64 " lines%s; %" PRIu64 " samples, %" PRIu64 " tokens so far\n",
                        in->name, lineno, pct, p->samples, p->tokens);
                *last_progress = t;
            }
        }
        if (len < 0) break;
        errno = 0;
    }
    if (ret == 0 && ferror(in->f)) {
        fprintf(stderr, PROG ": error: reading %s: %s\n", in->name, strerror(errno ? errno : EIO));
        ret = -1;
    }
    free(line);
    free(b.text); free(b.off); free(b.len); free(b.lineno); free(b.ret); free(b.tok_off); free(b.detail);
    return ret;
}

/* Returns 0, or -1 after printing a fatal error (I/O or a bad line under --strict). */
static int prepare_file(struct prepare *p, struct input *in, double *last_progress, uint64_t *lines_at_progress)
{
    if (p->opt.chat) return prepare_file_chat(p, in, last_progress);
    char *line = NULL;
    size_t cap = 0;
    uint64_t lineno = 0, bytes = 0;
    ssize_t len;
    int ret = 0;
    errbuf err = {{0}};
    errno = 0;
    while ((len = getline(&line, &cap, in->f)) >= 0) {
        lineno++;
        p->lines++;
        bytes += (uint64_t)len;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
        size_t start = strspn(line, " \t");
        if ((size_t)len <= start) continue; /* blank line */
        int64_t n = prepare_parse_line(p, line, (size_t)len);
        if (n < 0) {
            int reason = (int)(-1 - n);
            if (p->opt.strict) {
                fprintf(stderr, PROG ": error: %s:%" PRIu64 ": %s (--strict)\n", in->name, lineno, p->detail);
                ret = -1;
                break;
            }
            prepare_report_skip(p, in->name, lineno, reason);
        } else if (prepare_add(p, (size_t)n, &err) != 0) {
            fprintf(stderr, PROG ": error: %s\n", err.msg);
            ret = -1;
            break;
        }
        if (p->lines - *lines_at_progress >= PROGRESS_LINES) {
            double t = now_seconds();
            if (t - *last_progress >= PROGRESS_SECONDS) {
                char pct[32] = "";
                if (in->size) snprintf(pct, sizeof pct, " (%.0f%%)", 100.0 * (double)bytes / (double)in->size);
                fprintf(stderr, PROG ": %s: %" PRIu64 " lines%s; %" PRIu64 " samples, %" PRIu64 " tokens so far\n",
                        in->name, lineno, pct, p->samples, p->tokens);
                *last_progress = t;
                *lines_at_progress = p->lines;
            }
        }
        errno = 0;
    }
    if (ret == 0 && ferror(in->f)) {
        fprintf(stderr, PROG ": error: reading %s: %s\n", in->name, strerror(errno ? errno : EIO));
        ret = -1;
    }
    free(line);
    return ret;
}

static void prepare_print_summary(const struct prepare *p)
{
    uint64_t skipped = 0;
    for (int r = 0; r < SKIP_COUNT; r++) skipped += p->skipped[r];
    printf("prepared %" PRIu64 " samples (%" PRIu64 " tokens, %" PRIu64 " trained) into %zu shard%s; skipped %" PRIu64
           " line%s", p->samples, p->tokens, p->trained, p->nwritten, p->nwritten == 1 ? "" : "s", skipped,
           skipped == 1 ? "" : "s");
    const char *sep = ": ";
    for (int r = 0; r < SKIP_COUNT; r++) {
        if (!p->skipped[r]) continue;
        printf("%s%" PRIu64 " %s", sep, p->skipped[r], skip_reason_name[r]);
        sep = ", ";
    }
    printf("\n");
    if (p->opt.chat) {
        uint64_t cut = 0;
        for (uint64_t t = 0; t < p->opt.threads; t++) cut += p->workers[t].truncated;
        printf("trained share %.1f%% of tokens", p->tokens ? 100.0 * (double)p->trained / (double)p->tokens : 0.0);
        if (cut) printf("; %" PRIu64 " sample%s cut at --max-len", cut, cut == 1 ? "" : "s");
        printf("\n");
    }
    /* a packed batch holds at most data.max_batch_tokens tokens: a longer sample is trained on its beginning only */
    if (p->samples) printf("longest sample %" PRIu64 " tokens", p->longest);
    if (p->samples && p->opt.batch_tokens && p->over_batch)
        printf("; %" PRIu64 " sample%s longer than data.max_batch_tokens = %" PRIu64 " (%s): training sees only the "
               "first %" PRIu64 " tokens of each", p->over_batch, p->over_batch == 1 ? "" : "s", p->opt.batch_tokens,
               p->opt.job_config, p->opt.batch_tokens);
    else if (p->samples && p->opt.batch_tokens)
        printf("; every sample fits data.max_batch_tokens = %" PRIu64 " (%s)", p->opt.batch_tokens, p->opt.job_config);
    else if (p->samples)
        printf(" (a job trains at most data.max_batch_tokens of a sample: -c JOB.ini checks them)");
    if (p->samples) printf("\n");
    if (p->over_batch)
        fprintf(stderr, PROG ": warning: %" PRIu64 " sample%s longer than data.max_batch_tokens = %" PRIu64
                " of %s will be cut to their first %" PRIu64 " tokens in training (raise it, or split them)\n",
                p->over_batch, p->over_batch == 1 ? "" : "s", p->opt.batch_tokens, p->opt.job_config,
                p->opt.batch_tokens);
    fflush(stdout);
}

static int prepare_run(const struct prepare_opts *opt, char **inputs, int ninputs)
{
    struct input *in = xcalloc((size_t)ninputs, sizeof *in);
    struct prepare p = {.opt = *opt};
    int status = 1;
    /* Open every input first, so that a typo fails before anything is written. */
    for (int i = 0; i < ninputs; i++) {
        in[i].name = inputs[i];
        if (strcmp(inputs[i], "-") == 0) {
            in[i].name = "<stdin>";
            in[i].f = stdin;
            continue;
        }
        in[i].f = fopen(inputs[i], "r");
        struct stat st = {0};
        if (!in[i].f) {
            fprintf(stderr, PROG ": error: cannot open input %s: %s\n", inputs[i], strerror(errno));
            goto out;
        }
        if (fstat(fileno(in[i].f), &st) != 0) {
            fprintf(stderr, PROG ": error: cannot stat input %s: %s\n", inputs[i], strerror(errno));
            goto out;
        }
        if (S_ISDIR(st.st_mode)) {
            fprintf(stderr, PROG ": error: input %s is a folder, not a JSONL file\n", inputs[i]);
            goto out;
        }
        if (S_ISREG(st.st_mode)) in[i].size = (uint64_t)st.st_size;
    }
    if (opt->chat) {
        errbuf terr;
        if (tokenizer_load(&p.tk, opt->tokenizer_dir, &terr) != 0) {
            fprintf(stderr, PROG ": error: %s\n", terr.msg);
            goto out;
        }
        if (chat_template_load(&p.tpl, opt->tokenizer_dir, opt->template_file, &terr) != 0) {
            fprintf(stderr, PROG ": error: %s\n", terr.msg);
            goto out;
        }
        for (int i = 0; i < opt->n_template_args; i++)
            if (chat_template_set_arg(p.tpl, opt->template_args[i], &terr) != 0) {
                fprintf(stderr, PROG ": error: --template-arg: %s\n", terr.msg);
                goto out;
            }
        fprintf(stderr, PROG ": chat template %s (end of turn %s)\n", chat_template_source(p.tpl),
                chat_template_eot(p.tpl));
        p.workers = xcalloc(opt->threads, sizeof *p.workers);
        for (uint64_t t = 0; t < opt->threads; t++)
            p.workers[t] = (struct chat_worker){.tk = p.tk, .tpl = p.tpl, .opt = &p.opt};
    }
    if (prepare_outdir(opt) != 0) goto out;
    double t_start = now_seconds();
    uint64_t in_bytes = 0;
    for (int i = 0; i < ninputs; i++) in_bytes += in[i].size;
    double last_progress = now_seconds();
    uint64_t lines_at_progress = 0;
    errbuf err = {{0}};
    for (int i = 0; i < ninputs; i++) {
        if (prepare_file(&p, &in[i], &last_progress, &lines_at_progress) != 0) {
            prepare_remove_written(&p);
            goto out;
        }
    }
    if (prepare_shard_finish(&p, &err) != 0) {
        fprintf(stderr, PROG ": error: %s\n", err.msg);
        prepare_remove_written(&p);
        goto out;
    }
    prepare_print_summary(&p);
    if (opt->chat) {
        double dt = now_seconds() - t_start;
        fprintf(stderr, PROG ": %.1f s, %.1f MB/s, %.0f tokens/s\n", dt, dt > 0 ? (double)in_bytes / 1e6 / dt : 0.0,
                dt > 0 ? (double)p.tokens / dt : 0.0);
    }
    if (p.samples == 0) {
        fprintf(stderr, PROG ": error: no valid samples in the input; nothing was written\n");
        goto out;
    }
    status = 0;
out:
    for (int i = 0; i < ninputs; i++)
        if (in[i].f && in[i].f != stdin) fclose(in[i].f);
    free(in);
    shard_writer_discard(&p.w);
    for (size_t i = 0; i < p.nwritten; i++) free(p.written[i]);
    free(p.written);
    free(p.tok);
    free(p.mask);
    for (uint64_t t = 0; p.workers && t < opt->threads; t++) {
        struct chat_worker *w = &p.workers[t];
        tok_buf_free(&w->tb); chat_text_free(&w->ct);
        free(w->tok); free(w->mask); free(w->out_tok); free(w->out_mask);
    }
    free(p.workers);
    tokenizer_destroy(&p.tk);
    chat_template_destroy(&p.tpl);
    return status;
}

/* ---- --inspect ---- */

/* One shard's counts on stdout, ending in "valid", or in "rejected" when a token id is not below vocab (0: not
 * checked; the caller's dataset_check_vocab names the sample on stderr). 0 valid, 1 rejected. */
static int inspect_shard(const shard *s, uint64_t vocab, uint32_t *max_id_out)
{
    uint64_t n = shard_count(s), min_len = UINT64_MAX, max_len = 0;
    uint32_t max_id = 0;
    for (uint64_t i = 0; i < n; i++) {
        const uint32_t *tok;
        uint64_t len;
        shard_sample(s, i, &tok, NULL, &len);
        if (len < min_len) min_len = len;
        if (len > max_len) max_len = len;
        for (uint64_t j = 0; j < len; j++) max_id = tok[j] > max_id ? tok[j] : max_id;
    }
    printf("%s: %" PRIu64 " samples, %" PRIu64 " tokens, %" PRIu64 " trained", shard_path(s), n, shard_ntokens(s),
           shard_ntrained(s));
    if (n)
        printf(", length min %" PRIu64 " mean %.1f max %" PRIu64 ", max token id %u", min_len,
               (double)shard_ntokens(s) / (double)n, max_len, max_id);
    if (max_id > *max_id_out) *max_id_out = max_id;
    if (n && vocab && max_id >= vocab) {
        printf(", rejected: token id %u >= --vocab %" PRIu64 "\n", max_id, vocab);
        return 1;
    }
    printf(", valid\n");
    return 0;
}

/* The first sample decoded back to text, trained spans between [[ and ]]: what the drafter will learn. */
static void inspect_show_sample(const shard *s, const tokenizer *tk)
{
    const uint32_t *tok;
    const uint8_t *mask;
    uint64_t len;
    shard_sample(s, 0, &tok, &mask, &len);
    printf("%s: sample 0 decoded, trained spans in [[ ]]:\n", shard_path(s));
    int32_t *ids = xmalloc((len ? len : 1) * sizeof *ids);
    for (uint64_t j = 0; j < len;) {
        uint64_t k = j;
        while (k < len && mask[k] == mask[j]) { ids[k - j] = (int32_t)tok[k]; k++; }
        size_t n;
        char *text = tokenizer_decode(tk, ids, (size_t)(k - j), &n);
        printf("%s%s%s", mask[j] ? "[[" : "", text, mask[j] ? "]]" : "");
        free(text);
        j = k;
    }
    printf("\n");
    free(ids);
}

static int inspect_run(const struct prepare_opts *opt, char **paths, int npaths)
{
    int status = 0;
    tokenizer *tk = NULL;
    bool shown = false;
    if (opt->tokenizer_dir) {
        errbuf terr;
        if (tokenizer_load(&tk, opt->tokenizer_dir, &terr) != 0) {
            fprintf(stderr, PROG ": error: %s\n", terr.msg);
            return 1;
        }
    }
    size_t nshards = 0;
    uint64_t samples = 0, tokens = 0, trained = 0;
    uint32_t max_id = 0;
    for (int i = 0; i < npaths; i++) {
        dataset *ds = NULL;
        errbuf err = {{0}};
        if (dataset_open(&ds, paths[i], &err) != 0) {
            fprintf(stderr, PROG ": error: %s\n", err.msg);
            status = 1;
            continue;
        }
        for (size_t k = 0; k < dataset_nshards(ds); k++) {
            const shard *s = dataset_shard(ds, k);
            if (inspect_shard(s, opt->vocab, &max_id)) status = 1;
            fflush(stdout);
            if (tk && !shown && shard_count(s)) { inspect_show_sample(s, tk); shown = true; }
            nshards++;
            samples += shard_count(s);
            tokens += shard_ntokens(s);
            trained += shard_ntrained(s);
        }
        if (opt->vocab && opt->vocab <= UINT32_MAX && dataset_check_vocab(ds, (uint32_t)opt->vocab, &err) != 0) {
            fprintf(stderr, PROG ": error: %s\n", err.msg);
            status = 1;
        }
        dataset_close(&ds);
    }
    if (nshards > 1)
        printf("total: %zu shards, %" PRIu64 " samples, %" PRIu64 " tokens, %" PRIu64 " trained, max token id %u\n",
               nshards, samples, tokens, trained, max_id);
    tokenizer_destroy(&tk);
    return status;
}

int main(int argc, char **argv)
{
    enum { OPT_MAX_TOKENS = 256, OPT_MAX_LEN, OPT_VOCAB, OPT_STRICT, OPT_FORCE, OPT_INSPECT, OPT_CHAT, OPT_TOKENIZER,
           OPT_TEMPLATE, OPT_TEMPLATE_ARG, OPT_TRUNCATE, OPT_THREADS, OPT_CONFIG };
    static const struct option longopts[] = {
        {"output", required_argument, NULL, 'o'},
        {"max-tokens-per-shard", required_argument, NULL, OPT_MAX_TOKENS},
        {"max-len", required_argument, NULL, OPT_MAX_LEN},
        {"vocab", required_argument, NULL, OPT_VOCAB},
        {"strict", no_argument, NULL, OPT_STRICT},
        {"force", no_argument, NULL, OPT_FORCE},
        {"inspect", no_argument, NULL, OPT_INSPECT},
        {"chat", no_argument, NULL, OPT_CHAT},
        {"tokenizer", required_argument, NULL, OPT_TOKENIZER},
        {"template", required_argument, NULL, OPT_TEMPLATE},
        {"template-arg", required_argument, NULL, OPT_TEMPLATE_ARG},
        {"truncate", no_argument, NULL, OPT_TRUNCATE},
        {"threads", required_argument, NULL, OPT_THREADS},
        {"config", required_argument, NULL, OPT_CONFIG},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct prepare_opts opt = {.max_tokens_per_shard = 1ull << 25};
    const char *job_config_path_arg = NULL;
    static job_config jc;
    int c;
    while ((c = getopt_long(argc, argv, "o:c:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'o': opt.outdir = optarg; break;
        case OPT_MAX_TOKENS:
            if (parse_u64("--max-tokens-per-shard", optarg, 1, 1ull << 40, &opt.max_tokens_per_shard)) return 2;
            break;
        case OPT_MAX_LEN:
            if (parse_u64("--max-len", optarg, 1, 1ull << 40, &opt.max_len)) return 2;
            break;
        case OPT_VOCAB:
            if (parse_u64("--vocab", optarg, 1, (uint64_t)UINT32_MAX + 1, &opt.vocab)) return 2;
            snprintf(opt.vocab_from, sizeof opt.vocab_from, "--vocab %" PRIu64, opt.vocab);
            break;
        case OPT_STRICT: opt.strict = true; break;
        case OPT_FORCE: opt.force = true; break;
        case OPT_INSPECT: opt.inspect = true; break;
        case OPT_CHAT: opt.chat = true; break;
        case OPT_TOKENIZER: opt.tokenizer_dir = optarg; break;
        case OPT_TEMPLATE: opt.template_file = optarg; break;
        case OPT_TEMPLATE_ARG:
            opt.template_args = xrealloc(opt.template_args, (size_t)(opt.n_template_args + 1) * sizeof *opt.template_args);
            opt.template_args[opt.n_template_args++] = optarg;
            break;
        case OPT_TRUNCATE: opt.truncate = true; break;
        case OPT_THREADS:
            if (parse_u64("--threads", optarg, 1, 256, &opt.threads)) return 2;
            break;
        case 'c':
        case OPT_CONFIG: job_config_path_arg = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    int nargs = argc - optind;
    if (opt.inspect) {
        if (nargs == 0) {
            fprintf(stderr, PROG ": --inspect needs at least one shard file or folder\n");
            return 2;
        }
        return inspect_run(&opt, argv + optind, nargs);
    }
    if (!opt.outdir || !*opt.outdir) {
        fprintf(stderr, PROG ": missing -o OUTDIR (see --help)\n");
        return 2;
    }
    if (nargs == 0) {
        fprintf(stderr, PROG ": no input files (see --help)\n");
        return 2;
    }
    if (job_config_path_arg) { /* the job's batch budget, and with --chat its target folder */
        errbuf jerr = {{0}};
        if (job_config_load(&jc, job_config_path_arg, NULL, 0, &jerr) != 0) {
            fprintf(stderr, PROG ": %s\n", jerr.msg);
            return 2;
        }
        opt.job_config = job_config_path_arg;
        opt.batch_tokens = (uint64_t)jc.data.max_batch_tokens;
        char target_cfg[sizeof jc.target.model + 16];
        snprintf(target_cfg, sizeof target_cfg, "%s/config.json", jc.target.model);
        if (!opt.vocab && jc.target.model[0] && access(target_cfg, F_OK) != 0) /* a tokenizer-only folder */
            fprintf(stderr, PROG ": note: %s: target.model has no config.json (%s): token ids are not checked against "
                            "the target's vocabulary (give --vocab V)\n", job_config_path_arg, target_cfg);
        else if (!opt.vocab && jc.target.model[0]) { /* the ids the job's target has: a larger one fails the job */
            hf_config hc;
            if (hf_config_load(&hc, jc.target.model, &jerr) != 0) {
                fprintf(stderr, PROG ": %s: target.model: %s\n", job_config_path_arg, jerr.msg);
                return 1;
            }
            opt.vocab = (uint64_t)hc.vocab_size;
            snprintf(opt.vocab_from, sizeof opt.vocab_from, "the %d ids of target.model %.100s", hc.vocab_size,
                     jc.target.model);
        }
    }
    if (opt.chat && !opt.tokenizer_dir && job_config_path_arg) { /* the job's target folder */
        if (!jc.target.model[0]) {
            fprintf(stderr, PROG ": %s: target.model is not set (give --tokenizer DIR)\n", job_config_path_arg);
            return 2;
        }
        opt.tokenizer_dir = jc.target.model;
    }
    if (opt.chat && !opt.tokenizer_dir) {
        fprintf(stderr, PROG ": --chat needs --tokenizer DIR (the model folder with tokenizer.json) or -c JOB.ini "
                        "(its target.model)\n");
        return 2;
    }
    if (!opt.chat && (opt.tokenizer_dir || opt.template_file || opt.n_template_args)) {
        fprintf(stderr, PROG ": --tokenizer, --template and --template-arg go with --chat\n");
        return 2;
    }
    if (!opt.threads) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        opt.threads = c > 0 ? (uint64_t)(c < 256 ? c : 256) : 1;
    }
    if (opt.truncate && !opt.max_len) {
        fprintf(stderr, PROG ": --truncate needs --max-len\n");
        return 2;
    }
    return prepare_run(&opt, argv + optind, nargs);
}

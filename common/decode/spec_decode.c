#include "spec_decode.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void spec_result_free(spec_result *r)
{
    XFREE(r->tokens);
    XFREE(r->accepted);
    r->ntokens = r->nblocks = 0;
}

/* The target's greedy choice (target_decode's rule), never the reserved id. */
static int32_t spec_greedy(const float *row, int vocab, int32_t reserved)
{
    return target_logits_argmax(row, vocab, &reserved, reserved >= 0 ? 1 : 0);
}

static int is_eos(const spec_opts *o, int32_t t)
{
    for (int i = 0; i < o->neos; i++)
        if (o->eos[i] == t) return 1;
    return 0;
}

int spec_block_commit(const spec_opts *o, const int32_t *seq, int start, int acc, int total, int *stopped)
{
    int produced = acc + 1 < total - start - 1 ? acc + 1 : total - start - 1;
    for (int i = 1; i <= produced; i++)
        if (is_eos(o, seq[start + i])) {
            produced = i;
            *stopped = 1;
            break;
        }
    return produced;
}

static void result_init(spec_result *r, int max_new, int max_blocks)
{
    memset(r, 0, sizeof *r);
    r->tokens = xmalloc(sizeof(int32_t) * (size_t)(max_new > 0 ? max_new : 1));
    r->accepted = xmalloc(sizeof(int) * (size_t)(max_blocks > 0 ? max_blocks : 1));
}

int spec_run(const spec_engine_ops *ops, void *e, int B, int capacity, const int32_t *prompt, int plen,
             const spec_opts *o, spec_result *r, errbuf *err)
{
    DF_ASSERT(plen >= 1 && o->max_new >= 1 && B >= 0 && B <= DFLASH_MAX_BLOCK);
    const int total = plen + o->max_new;
    result_init(r, o->max_new, B ? o->max_new : 0);
    if (total > capacity)
        return errbuf_set(err, ENOSPC, "%d prompt tokens + %d new tokens exceed the cache (%d positions)", plen,
                          o->max_new, capacity);
    int32_t *seq = xmalloc(sizeof(int32_t) * (size_t)(total + 1)), block[DFLASH_MAX_BLOCK], draft[DFLASH_MAX_BLOCK];
    int32_t next[DFLASH_MAX_BLOCK];
    memcpy(seq, prompt, sizeof(int32_t) * (size_t)plen);
    double t0 = now_seconds();
    int rc = ops->prefill(e, prompt, plen, B > 0, &seq[plen], err);
    if (rc) goto done;
    double t1 = now_seconds();
    r->prefill_s = t1 - t0;
    int start = plen, stopped = is_eos(o, seq[plen]);
    if (!B) { /* target only: one token a step */
        while (start + 1 < total && !stopped) {
            if ((rc = ops->verify(e, &seq[start], 1, 0, &seq[start + 1], err))) goto done;
            stopped = is_eos(o, seq[++start]);
        }
    }
    while (B && start + 1 < total && !stopped) {
        int vs = total - start < B ? total - start : B; /* verify no position past the end */
        if ((rc = ops->draft(e, start, seq[start], draft, err))) goto done;
        block[0] = seq[start];
        for (int k = 1; k < vs; k++) block[k] = draft[k];
        if ((rc = ops->verify(e, block, vs, 1, next, err))) goto done;
        int acc = 0;
        while (acc + 1 < vs && block[acc + 1] == next[acc]) acc++;
        for (int k = 1; k <= acc; k++) seq[start + k] = block[k];
        seq[start + acc + 1] = next[acc]; /* the bonus token */
        int produced = spec_block_commit(o, seq, start, acc, total, &stopped);
        /* the committed block positions start..start+produced-1 hold correct tokens: their taps are context */
        if ((rc = ops->commit(e, start, produced, err))) goto done;
        start += produced;
        r->accepted[r->nblocks++] = produced;
    }
    r->decode_s = now_seconds() - t1;
    r->ntokens = (start + 1 < total ? start + 1 : total) - plen;
    memcpy(r->tokens, seq + plen, sizeof(int32_t) * (size_t)r->ntokens);
done:
    free(seq);
    return rc;
}

/* ---- the CPU engine: target_decode and drafter_infer, taps and logits on the host ---- */

typedef struct cpu_engine {
    target_cache *c;
    drafter_infer *d;              /* NULL: target only */
    int V, K, KH;
    const int *taps;
    int32_t reserved;
    float *ctx, *baux, *logits;    /* (capacity, KH) committed taps; (B, KH) the verified block's; (B, V) */
} cpu_engine;

static int cpu_prefill(void *ep, const int32_t *prompt, int plen, int with_taps, int32_t *first, errbuf *err)
{
    cpu_engine *e = ep;
    int rc = target_cache_crop(e->c, 0, 0, err);
    /* the last position's logits only: a long prompt's (plen, V) would not fit */
    if (!rc)
        rc = target_cache_forward_last(e->c, 0, prompt, plen, with_taps ? e->taps : NULL, with_taps ? e->K : 0,
                                       with_taps ? e->ctx : NULL, e->logits, err);
    if (!rc) *first = spec_greedy(e->logits, e->V, e->reserved);
    return rc;
}

static int cpu_draft(void *ep, int start, int32_t token, int32_t *draft, errbuf *err)
{
    (void)err;
    cpu_engine *e = ep;
    drafter_infer_block(e->d, e->ctx, start, token, NULL, draft);
    return 0;
}

static int cpu_verify(void *ep, const int32_t *block, int n, int with_taps, int32_t *next, errbuf *err)
{
    cpu_engine *e = ep;
    int rc = target_cache_forward(e->c, 0, block, n, with_taps ? e->taps : NULL, with_taps ? e->K : 0,
                                  with_taps ? e->baux : NULL, e->logits, err);
    for (int i = 0; !rc && i < n; i++) next[i] = spec_greedy(e->logits + (size_t)i * e->V, e->V, e->reserved);
    return rc;
}

static int cpu_commit(void *ep, int start, int n, errbuf *err)
{
    cpu_engine *e = ep;
    memcpy(e->ctx + (size_t)start * e->KH, e->baux, sizeof(float) * (size_t)n * e->KH);
    return target_cache_crop(e->c, 0, start + n, err);
}

static const spec_engine_ops cpu_ops = {cpu_prefill, cpu_draft, cpu_verify, cpu_commit};

int spec_decode(target_cache *c, drafter_infer *d, const int32_t *prompt, int plen, const spec_opts *o,
                spec_result *r, errbuf *err)
{
    const hf_config *dc = drafter_infer_config(d);
    const int B = dc->block_size, cap = target_cache_capacity(c), total = plen + o->max_new;
    cpu_engine e = {.c = c, .d = d, .V = dc->vocab_size, .K = dc->num_taps, .KH = dc->num_taps * dc->hidden_size,
                    .taps = dc->taps, .reserved = o->reserved};
    e.ctx = xmalloc(sizeof(float) * (size_t)(total < cap ? total : cap) * (size_t)e.KH);
    e.baux = xmalloc(sizeof(float) * (size_t)B * (size_t)e.KH);
    e.logits = xmalloc(sizeof(float) * (size_t)B * (size_t)e.V);
    int rc = spec_run(&cpu_ops, &e, B, cap, prompt, plen, o, r, err);
    free(e.ctx), free(e.baux), free(e.logits);
    return rc;
}

int spec_target_greedy(target_cache *c, const target_model *tm, const int32_t *prompt, int plen, const spec_opts *o,
                       spec_result *r, errbuf *err)
{
    cpu_engine e = {.c = c, .V = target_model_config(tm)->vocab_size, .reserved = o->reserved};
    e.logits = xmalloc(sizeof(float) * (size_t)e.V);
    int rc = spec_run(&cpu_ops, &e, 0, target_cache_capacity(c), prompt, plen, o, r, err);
    free(e.logits);
    return rc;
}

int spec_walk(target_model *tm, drafter_infer *d, const int32_t *text, int plen, int len, const spec_opts *o,
              spec_result *r, errbuf *err)
{
    const hf_config *dc = drafter_infer_config(d);
    const int B = dc->block_size, V = dc->vocab_size, KH = dc->num_taps * dc->hidden_size;
    const int max_new = o->max_new < len - plen ? o->max_new : len - plen;
    DF_ASSERT(plen >= 1);
    if (max_new < 1) return errbuf_set(err, EINVAL, "no continuation after the %d prompt tokens to walk", plen);
    const int total = plen + max_new;
    result_init(r, max_new, max_new);
    float *aux = xmalloc(sizeof(float) * (size_t)total * (size_t)KH);
    float *logits = xmalloc(sizeof(float) * (size_t)total * (size_t)V);
    int32_t *pos = xmalloc(sizeof(int32_t) * (size_t)total), cu[2] = {0, total}, draft[DFLASH_MAX_BLOCK];
    for (int t = 0; t < total; t++) pos[t] = t;
    target_batch b = {.ntok = total, .nseq = 1, .input_ids = text, .positions = pos, .cu_seqlens = cu};
    double t0 = now_seconds();
    int rc = target_model_forward(tm, &b, dc->taps, dc->num_taps, aux, NULL, logits, err);
    if (rc) goto done;
    r->prefill_s = now_seconds() - t0;
    /* the text must be what decoding commits: the target's greedy tokens, up to the end or the first EOS */
    for (int t = plen; t < total; t++) {
        int32_t g = spec_greedy(logits + (size_t)(t - 1) * V, V, o->reserved);
        if (text[t] != g) {
            rc = errbuf_set(err, EINVAL, "token %d (position %d) is %d, but the target's greedy choice is %d: the "
                            "walk needs the target's own greedy continuation", t - plen, t, text[t], g);
            goto done;
        }
        if (is_eos(o, text[t])) break;
    }
    t0 = now_seconds();
    int start = plen, stopped = is_eos(o, text[plen]);
    while (start + 1 < total && !stopped) {
        int vs = total - start < B ? total - start : B;
        drafter_infer_block(d, aux, start, text[start], NULL, draft);
        int acc = 0;
        while (acc + 1 < vs && draft[acc + 1] == text[start + acc + 1]) acc++;
        int produced = spec_block_commit(o, text, start, acc, total, &stopped);
        start += produced;
        r->accepted[r->nblocks++] = produced;
    }
    r->decode_s = now_seconds() - t0;
    r->ntokens = (start + 1 < total ? start + 1 : total) - plen;
    memcpy(r->tokens, text + plen, sizeof(int32_t) * (size_t)r->ntokens);
done:
    free(aux);
    free(logits);
    free(pos);
    return rc;
}

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

/* The prompt into the cache: taps of every position into aux (may be NULL), the last position's logits (V) into
 * logits. Two forwards so that only one logits row exists (a long prompt's (plen, V) logits would not fit). */
static int prefill(target_cache *c, const int32_t *prompt, int plen, const int *taps, int ntaps, int KH, float *aux,
                   float *logits, errbuf *err)
{
    int rc = plen > 1 ? target_cache_forward(c, 0, prompt, plen - 1, taps, ntaps, aux, NULL, err) : 0;
    if (rc) return rc;
    return target_cache_forward(c, 0, prompt + plen - 1, 1, taps, ntaps, aux ? aux + (size_t)(plen - 1) * KH : NULL,
                                logits, err);
}

static void result_init(spec_result *r, int max_new, int max_blocks)
{
    memset(r, 0, sizeof *r);
    r->tokens = xmalloc(sizeof(int32_t) * (size_t)(max_new > 0 ? max_new : 1));
    r->accepted = xmalloc(sizeof(int) * (size_t)(max_blocks > 0 ? max_blocks : 1));
}

int spec_decode(target_cache *c, drafter_infer *d, const int32_t *prompt, int plen, const spec_opts *o,
                spec_result *r, errbuf *err)
{
    const hf_config *dc = drafter_infer_config(d);
    const int B = dc->block_size, V = dc->vocab_size, K = dc->num_taps, KH = K * dc->hidden_size;
    const int total = plen + o->max_new;
    DF_ASSERT(plen >= 1 && o->max_new >= 1);
    result_init(r, o->max_new, o->max_new);
    int rc = target_cache_crop(c, 0, 0, err);
    if (rc) return rc;
    if (total > target_cache_capacity(c))
        return errbuf_set(err, ENOSPC, "%d prompt tokens + %d new tokens exceed the cache (%d positions)", plen,
                          o->max_new, target_cache_capacity(c));
    int32_t *seq = xmalloc(sizeof(int32_t) * (size_t)(total + 1)), block[DFLASH_MAX_BLOCK], draft[DFLASH_MAX_BLOCK];
    float *ctx = xmalloc(sizeof(float) * (size_t)total * (size_t)KH);          /* taps of committed positions */
    float *baux = xmalloc(sizeof(float) * (size_t)B * (size_t)KH);
    float *logits = xmalloc(sizeof(float) * (size_t)B * (size_t)V);
    memcpy(seq, prompt, sizeof(int32_t) * (size_t)plen);

    double t0 = now_seconds();
    if ((rc = prefill(c, prompt, plen, dc->taps, K, KH, ctx, logits, err))) goto done;
    seq[plen] = spec_greedy(logits, V, o->reserved);
    double t1 = now_seconds();
    r->prefill_s = t1 - t0;
    int start = plen, stopped = is_eos(o, seq[plen]);
    while (start + 1 < total && !stopped) {
        int vs = total - start < B ? total - start : B; /* verify no position past the end */
        drafter_infer_block(d, ctx, start, seq[start], NULL, draft);
        block[0] = seq[start];
        for (int k = 1; k < vs; k++) block[k] = draft[k];
        if ((rc = target_cache_forward(c, 0, block, vs, dc->taps, K, baux, logits, err))) goto done;
        int acc = 0;
        while (acc + 1 < vs && block[acc + 1] == spec_greedy(logits + (size_t)acc * V, V, o->reserved)) acc++;
        for (int k = 1; k <= acc; k++) seq[start + k] = block[k];
        seq[start + acc + 1] = spec_greedy(logits + (size_t)acc * V, V, o->reserved); /* the bonus token */
        int produced = spec_block_commit(o, seq, start, acc, total, &stopped);
        /* the committed block positions start..start+produced-1 hold correct tokens: their taps are context */
        memcpy(ctx + (size_t)start * KH, baux, sizeof(float) * (size_t)produced * KH);
        start += produced;
        if ((rc = target_cache_crop(c, 0, start, err))) goto done;
        r->accepted[r->nblocks++] = produced;
    }
    r->decode_s = now_seconds() - t1;
    r->ntokens = (start + 1 < total ? start + 1 : total) - plen;
    memcpy(r->tokens, seq + plen, sizeof(int32_t) * (size_t)r->ntokens);
done:
    free(seq);
    free(ctx);
    free(baux);
    free(logits);
    return rc;
}

int spec_target_greedy(target_cache *c, const target_model *tm, const int32_t *prompt, int plen, const spec_opts *o,
                       spec_result *r, errbuf *err)
{
    const int V = target_model_config(tm)->vocab_size;
    DF_ASSERT(plen >= 1 && o->max_new >= 1);
    result_init(r, o->max_new, 0);
    int rc = target_cache_crop(c, 0, 0, err);
    if (rc) return rc;
    if (plen + o->max_new > target_cache_capacity(c))
        return errbuf_set(err, ENOSPC, "%d prompt tokens + %d new tokens exceed the cache (%d positions)", plen,
                          o->max_new, target_cache_capacity(c));
    float *logits = xmalloc(sizeof(float) * (size_t)V);
    double t0 = now_seconds();
    if ((rc = prefill(c, prompt, plen, NULL, 0, 0, NULL, logits, err))) goto done;
    r->tokens[r->ntokens++] = spec_greedy(logits, V, o->reserved);
    double t1 = now_seconds();
    r->prefill_s = t1 - t0;
    while (r->ntokens < o->max_new && !is_eos(o, r->tokens[r->ntokens - 1])) {
        if ((rc = target_cache_forward(c, 0, &r->tokens[r->ntokens - 1], 1, NULL, 0, NULL, logits, err))) goto done;
        r->tokens[r->ntokens] = spec_greedy(logits, V, o->reserved);
        r->ntokens++;
    }
    r->decode_s = now_seconds() - t1;
done:
    free(logits);
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

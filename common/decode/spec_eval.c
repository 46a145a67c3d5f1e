#include "spec_eval.h"

#include <errno.h>
#include <string.h>

static int cpu_decode(void *e, const prompt_line *pl, const spec_opts *o, spec_result *r, errbuf *err)
{
    spec_eval_cpu *c = e;
    return spec_decode(c->cache, c->d, pl->ids, pl->plen, o, r, err);
}

static int cpu_greedy(void *e, const prompt_line *pl, const spec_opts *o, spec_result *r, errbuf *err)
{
    spec_eval_cpu *c = e;
    return spec_target_greedy(c->cache, c->tm, pl->ids, pl->plen, o, r, err);
}

static int cpu_walk(void *e, const prompt_line *pl, const spec_opts *o, spec_result *r, errbuf *err)
{
    spec_eval_cpu *c = e;
    return spec_walk(c->tm, c->d, pl->ids, pl->plen, pl->len, o, r, err);
}

const spec_eval_ops spec_eval_cpu_ops = {.decode = cpu_decode, .greedy = cpu_greedy};
const spec_eval_ops spec_eval_walk_ops = {.decode = cpu_walk, .greedy = NULL};

int spec_eval_check_fit(const prompt_set *ps, const char *path, int walk, int max_new, long limit,
                        const char *limit_src, int *need, errbuf *err)
{
    *need = 0;
    for (int i = 0; i < ps->n; i++) {
        const prompt_line *pl = &ps->v[i];
        if (walk && pl->len == pl->plen)
            return errbuf_set(err, EINVAL, "%s:%d: --walk: the line is all prompt (no loss_mask 1 continuation to walk)",
                              path, pl->lineno);
        long n = walk ? pl->len : (long)pl->plen + max_new;
        if (walk && n > pl->plen + max_new) n = pl->plen + max_new;
        if (n > limit)
            return errbuf_set(err, EINVAL, "%s:%d: input_ids: a prompt of %d tokens + %ld new tokens needs %ld "
                              "positions; the cache holds %ld (%s)", path, pl->lineno, pl->plen, n - pl->plen, n,
                              limit, limit_src);
        if (n > *need) *need = (int)n;
    }
    return 0;
}

static void stats_add(spec_eval_stats *st, const prompt_line *pl, const spec_result *r)
{
    json_t *acc = json_array();
    double sum = 0;
    for (int i = 0; i < r->nblocks; i++) {
        int a = r->accepted[i];
        DF_ASSERT(a >= 1 && a <= st->B);
        sum += a;
        st->hist[a]++;
        for (int k = 1; k < a; k++) st->slot_ok[k]++;
        json_array_append_new(acc, json_integer(a));
    }
    st->blocks += r->nblocks;
    if (r->nblocks > 0) {
        st->tau_sum += sum / r->nblocks;
        st->counted++;
    }
    st->nprompts++;
    st->spec_tokens += r->ntokens;
    st->spec_s += r->decode_s;
    st->spec_prefill_s += r->prefill_s;
    json_array_append_new(st->per_prompt, json_pack("{s:i, s:i, s:i, s:o}", "line", pl->lineno, "prompt_tokens",
                                                    pl->plen, "new_tokens", r->ntokens, "accepted", acc));
}

int spec_eval_run(spec_eval_stats *st, const spec_eval_ops *ops, void *e, int B, const prompt_set *ps,
                  const char *path, const spec_opts *so, spec_eval_progress progress, void *ctx, errbuf *err)
{
    memset(st, 0, sizeof *st);
    DF_ASSERT(B >= 2 && B <= DFLASH_MAX_BLOCK);
    st->B = B;
    st->has_base = ops->greedy != NULL;
    st->per_prompt = json_array();
    for (int i = 0; i < ps->n; i++) {
        const prompt_line *pl = &ps->v[i];
        spec_result r = {0}, base = {0};
        int rc = ops->decode(e, pl, so, &r, err);
        if (!rc && ops->greedy) rc = ops->greedy(e, pl, so, &base, err);
        if (rc) {
            spec_result_free(&r);
            spec_result_free(&base);
            return errbuf_wrap(err, rc, "%s:%d", path, pl->lineno);
        }
        stats_add(st, pl, &r);
        if (ops->greedy) {
            st->base_tokens += base.ntokens;
            st->base_s += base.decode_s;
            st->base_prefill_s += base.prefill_s;
            if (base.ntokens != r.ntokens || memcmp(base.tokens, r.tokens, sizeof(int32_t) * (size_t)r.ntokens))
                st->mismatched++;
        }
        spec_result_free(&r);
        spec_result_free(&base);
        if (progress && (rc = progress(ctx, i + 1, ps->n, err))) return rc;
    }
    return 0;
}

void spec_eval_stats_free(spec_eval_stats *st)
{
    json_decref(st->per_prompt);
    st->per_prompt = NULL;
}

double spec_eval_tau(const spec_eval_stats *st) { return st->counted ? st->tau_sum / st->counted : 0; }

double spec_eval_speedup(const spec_eval_stats *st)
{
    double spec_tps = st->spec_s > 0 ? st->spec_tokens / st->spec_s : 0;
    double base_tps = st->base_s > 0 ? st->base_tokens / st->base_s : 0;
    return base_tps > 0 ? spec_tps / base_tps : 0;
}

double spec_eval_slot(const spec_eval_stats *st, int k) { return st->blocks ? (double)st->slot_ok[k] / st->blocks : 0; }

json_t *spec_eval_json(const spec_eval_stats *st)
{
    json_t *hist = json_array(), *slots = json_array();
    for (int a = 1; a <= st->B; a++) json_array_append_new(hist, json_integer(st->hist[a]));
    for (int k = 1; k < st->B; k++) json_array_append_new(slots, json_real(spec_eval_slot(st, k)));
    json_t *o = json_pack("{s:f, s:i, s:i, s:i, s:I, s:o, s:o, s:I}", "tau", spec_eval_tau(st), "prompts",
                          st->nprompts, "prompts_with_blocks", st->counted, "block_size", st->B, "blocks",
                          (json_int_t)st->blocks, "histogram", hist, "slot_acceptance", slots, "new_tokens",
                          (json_int_t)st->spec_tokens);
    if (st->has_base) {
        json_object_set_new(o, "speedup", json_real(spec_eval_speedup(st)));
        json_object_set_new(o, "tokens_per_s", json_real(st->spec_s > 0 ? st->spec_tokens / st->spec_s : 0));
        json_object_set_new(o, "target_only_tokens_per_s", json_real(st->base_s > 0 ? st->base_tokens / st->base_s : 0));
        json_object_set_new(o, "outputs_differ", json_integer(st->mismatched));
    }
    return o;
}

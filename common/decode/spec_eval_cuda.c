#include "spec_eval_cuda.h"

static int cuda_decode(void *e, const prompt_line *pl, const spec_opts *o, spec_result *r, errbuf *err)
{
    return spec_decode_cuda(e, pl->ids, pl->plen, o, r, err);
}

static int cuda_greedy(void *e, const prompt_line *pl, const spec_opts *o, spec_result *r, errbuf *err)
{
    return spec_target_greedy_cuda(e, pl->ids, pl->plen, o, r, err);
}

const spec_eval_ops spec_eval_cuda_ops = {.decode = cuda_decode, .greedy = cuda_greedy};

/* spec_decode: DFlash speculative decoding of one prompt at temperature 0, the reference loop of the DFlash authors
 * (z-lab dflash_generate): the target's prefill gives the first token; then per block, [last committed token,
 * MASK x (B-1)] is drafted on the taps of every committed position before it, the target verifies the block in one
 * forward against its KV cache, the longest prefix of draft slots 1..B-1 equal to the target's own next tokens is
 * accepted, accepted+1 tokens are committed (the target's bonus token last) and the cache is cropped to them. Near
 * the end the verified block is cut to the positions left, and what a block commits to max_new tokens (or up to
 * EOS). Also: target-only greedy decoding of the same prompt, and the walk: the same accepted lengths computed
 * without decoding on text that is the target's own greedy continuation (one target forward over the text). The
 * target's greedy choice (target_logits_argmax) never picks the drafter's mask token (a reserved id: DFlash adds it
 * to the vocabulary; dflash-demo's data follow the same rule); ties go to the lower id. Errors: 0 / -errno with an
 * errbuf. */
#ifndef DFLASH_SPEC_DECODE_H
#define DFLASH_SPEC_DECODE_H

#include <stdint.h>

#include "drafter_infer.h"
#include "target_decode.h"
#include "target_model.h"
#include "util.h"

typedef struct spec_opts {
    int max_new;            /* new tokens at most (>= 1) */
    const int32_t *eos;     /* stop tokens (may be NULL) */
    int neos;
    int32_t reserved;       /* id the target's greedy choice skips (the drafter's mask token); -1: none */
} spec_opts;

typedef struct spec_result {
    int32_t *tokens;        /* the new tokens (xmalloc'd) */
    int ntokens;
    int *accepted;          /* per block: tokens it committed (accepted draft slots + 1), xmalloc'd */
    int nblocks;
    double prefill_s, decode_s; /* wall clock of the prefill and of the rest */
} spec_result;

void spec_result_free(spec_result *r);
/* The blocks' bookkeeping shared by decoding and the walk: how many tokens a block commits, given its accepted draft slots acc, the committed text so far (seq, the accepted slots and the
 * bonus already written at start+1..) and the end (total positions); *stopped = 1 when one of them is an EOS. */
int spec_block_commit(const spec_opts *o, const int32_t *seq, int start, int acc, int total, int *stopped);

/* What the decoding loop needs of a backend (the CPU one below, spec_decode_cuda.h's on the GPU): a target with a
 * KV cache (sequence 0) and, for speculative decoding, a drafter. Greedy choices never pick opts.reserved. */
typedef struct spec_engine_ops {
    /* Empty the cache, run prompt[0..plen): the taps of its positions become context rows [0, plen) when with_taps;
     * *first = the target's greedy choice after it. */
    int (*prefill)(void *e, const int32_t *prompt, int plen, int with_taps, int32_t *first, errbuf *err);
    /* The drafter's block at position start (slot 0 = token, conditioned on context rows [0, start)): draft[0..B). */
    int (*draft)(void *e, int start, int32_t token, int32_t *draft, errbuf *err);
    /* The target runs block[0..n) after the cache; next[i] = its greedy choice after block[0..i]. with_taps: the
     * rows' taps are kept for commit. */
    int (*verify)(void *e, const int32_t *block, int n, int with_taps, int32_t *next, errbuf *err);
    /* The first n rows of the last verified block, at positions start.., are committed: their taps become context
     * rows, and the cache keeps start + n positions. */
    int (*commit)(void *e, int start, int n, errbuf *err);
} spec_engine_ops;

/* The loop itself on an engine: speculative decoding with block size B (the DFlash authors' reference loop, see
 * above), or target-only greedy decoding (B = 0: nblocks = 0). capacity: the positions the cache holds (prompt +
 * answer must fit). */
int spec_run(const spec_engine_ops *ops, void *e, int B, int capacity, const int32_t *prompt, int plen,
             const spec_opts *o, spec_result *r, errbuf *err);

/* Speculative decoding of prompt[0..plen) with sequence 0 of cache c (emptied first; its capacity must hold
 * plen + max_new positions). */
int spec_decode(target_cache *c, drafter_infer *d, const int32_t *prompt, int plen, const spec_opts *o,
                spec_result *r, errbuf *err);
/* Target-only greedy decoding of the same with the cache of target tm (nblocks = 0). */
int spec_target_greedy(target_cache *c, const target_model *tm, const int32_t *prompt, int plen, const spec_opts *o,
                       spec_result *r, errbuf *err);
/* The walk over text[0..len), whose first plen tokens are the prompt and the rest the target's greedy
 * continuation (checked: an error names the first position where the text is not the target's greedy choice).
 * Generates min(max_new, len - plen) tokens' worth of blocks; r->tokens is that part of the text. */
int spec_walk(target_model *tm, drafter_infer *d, const int32_t *text, int plen, int len, const spec_opts *o,
              spec_result *r, errbuf *err);

#endif

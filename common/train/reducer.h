/* reducer: the seam between the step protocol (step.c) and where the training state lives and how gradients meet.
 * A reducer owns the fp32 master weights and AdamW moments, double-buffered by step parity (state k in buffer
 * k % 2), and this rank's gradient buffer, all in the memory of the model backend it serves (host or GPU): the
 * backend reads weights(k) in place and writes its gradients into grads(), so a rank keeps no second copy. Every call is
 * deterministic and may be redone after a crash with the same result: reduce and apply read only what nobody
 * writes during step k, and apply writes only the state of step k+1. A call's effect is complete in the state when
 * it returns (an asynchronous implementation waits for its stream): the protocol then publishes it, and a rank
 * killed after that must not leave it half done.
 *   shm (reduce_shm.c): one shared host state for all ranks (a memfd deposited with dflashd); rank r reduces and
 *       applies the parameter range [numel*r/D, numel*(r+1)/D) in rank order; the CPU backend's reducer.
 * Implementations: reduce_shm.c. Errors: 0 / -errno with an errbuf naming the state. */
#ifndef DFLASH_REDUCER_H
#define DFLASH_REDUCER_H

#include <stdint.h>

#include "adamw.h"
#include "optim.h"
#include "util.h"

typedef struct reducer reducer;

typedef struct reducer_ops {
    /* The weights of step k (read only) in the backend's memory and compute format: fp32 for the CPU backend, a
     * bf16 copy made by apply for the CUDA backend (laid out like the fp32 state, drafter_layout offsets). */
    const void *(*weights)(reducer *r, uint64_t step);
    /* This rank's gradient buffer for step k (numel floats in the backend's memory), as it is: the backend's
     * forward_backward writes every element (drafter.h), so nothing zeroes it first. */
    float *(*grads)(reducer *r, uint64_t step);
    /* Phase 2, after every rank's gradients are in: this rank's share of Σ_ranks grads / weight_sum (rank order)
     * and of its squared norm. */
    void (*reduce)(reducer *r, uint64_t step, double weight_sum);
    /* Phase 3, after every share is reduced (same weight_sum): the global norm (returned); then, when apply != 0
     * and the norm is finite, clip + AdamW of this rank's share from state k into state k+1; otherwise state k+1 =
     * state k on the share (the step is skipped, *applied = 0). */
    double (*apply)(reducer *r, uint64_t step, double weight_sum, const adamw_params *ap, float clip, int apply,
                    int *applied);
    /* Host views or copies of state k for a checkpoint (valid until the next call). */
    int (*export_state)(reducer *r, uint64_t step, optim_state *host, errbuf *err);
    void (*destroy)(reducer *r);
} reducer_ops;

struct reducer {
    const reducer_ops *ops;
};

/* Destroy and null the pointer. */
static inline void reducer_destroy(reducer **r)
{
    if (*r) (*r)->ops->destroy(*r);
    *r = NULL;
}

#endif

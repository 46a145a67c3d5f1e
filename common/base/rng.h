/* rng: a small deterministic generator (splitmix64 seeding xoshiro256**), so that every random choice of a run
 * (anchors, initial weights, data order) is a pure function of the seed and a stream key. Not thread-safe per
 * instance; create one per use. */
#ifndef DFLASH_RNG_H
#define DFLASH_RNG_H

#include <stdint.h>

typedef struct rng {
    uint64_t s[4];
} rng;

/* Seed from a seed and up to three stream keys (e.g. epoch, batch id, sequence): distinct keys, distinct streams. */
void rng_seed(rng *r, uint64_t seed, uint64_t k1, uint64_t k2, uint64_t k3);
uint64_t rng_next(rng *r);
/* Uniform integer in [0, n) without modulo bias (n > 0). */
uint64_t rng_below(rng *r, uint64_t n);
/* Uniform double in [0, 1). */
double rng_uniform(rng *r);
/* Standard normal (Box-Muller). */
double rng_normal(rng *r);

#endif

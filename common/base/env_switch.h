/* env_switch: the environment switches that select a kernel variant for A/B measurements (DFLASH_ATTENTION=mma_sync,
 * DFLASH_GEMV_SPLIT=1, DFLASH_GATEUP_FUSED=0, ...; bench/README.md lists them): whether variable `name` equals
 * `value`, read once into *cache (a static of the caller's, -1 before the first read). Host code, C and CUDA C++. */
#ifndef DFLASH_ENV_SWITCH_H
#define DFLASH_ENV_SWITCH_H

#include <stdlib.h>
#include <string.h>

static inline int env_switch(int *cache, const char *name, const char *value)
{
    if (*cache < 0) {
        const char *e = getenv(name);
        *cache = e && !strcmp(e, value);
    }
    return *cache;
}

#endif

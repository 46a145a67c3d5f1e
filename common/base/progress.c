#include "progress.h"

#include <stdatomic.h>

static _Atomic uint64_t progress_counter;

void progress_bump(void) { atomic_fetch_add_explicit(&progress_counter, 1, memory_order_relaxed); }

uint64_t progress_count(void) { return atomic_load_explicit(&progress_counter, memory_order_relaxed); }

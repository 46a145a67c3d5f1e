/* progress: one process-wide counter that computations bump as they go (a CPU kernel call, an attention row, a
 * tensor read or written), so that a worker's liveness thread (common/job/worker.c) can tell a long step that is
 * progressing from a main thread that is stuck: it feeds the watchdog and the heartbeat only while the counter
 * moves. Lock-free, callable from any thread; bumping costs one relaxed atomic add. */
#ifndef DFLASH_PROGRESS_H
#define DFLASH_PROGRESS_H

#include <stdint.h>

/* Work advanced. */
void progress_bump(void);
/* How often progress_bump was called in this process (it only grows). */
uint64_t progress_count(void);

#endif

/* ctl_client: a worker's control-plane connection to dflashd, a ZeroMQ DEALER with the stable identity of the
 * worker ("target-1"). It registers the worker's epoch, sends a heartbeat every control.heartbeat_sec (at once when
 * the worker's activity changes) and reads dflashd's heartbeats and refusals. Everything is non-blocking and driven
 * from the worker's main thread by ctl_client_tick; losing dflashd is normal (it restarts) and only logged. */
#ifndef DFLASH_CTL_CLIENT_H
#define DFLASH_CTL_CLIENT_H

#include <stdint.h>

#include "job_config.h"
#include "job_state.h"
#include "util.h"

typedef struct ctl_client ctl_client;

/* Connect to the job's control endpoint as role-index and queue the registration of this epoch. The routing id is
 * "<role>-<index>/<hex token>" with the token the keeper gave this instance (ctl_worker_id_split): a peer without it
 * cannot take the worker's connection over. */
int ctl_client_new(ctl_client **out, const job_config *cfg, enum job_role role, int index, uint64_t epoch,
                   const uint8_t token[JOB_CTL_TOKEN_BYTES], const char *gpu, errbuf *err);
/* Send a heartbeat when one is due, read what dflashd sent. Cheap; call it often. */
void ctl_client_tick(ctl_client *c);
/* Tell dflashd whether the worker holds in a pause (sent at once). */
void ctl_client_set_held(ctl_client *c, int held);
/* Whether dflashd refused this instance as stale (a newer instance of the worker registered). */
int ctl_client_refused(const ctl_client *c);
void ctl_client_destroy(ctl_client **c);

#endif

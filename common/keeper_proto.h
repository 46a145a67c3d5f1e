/* keeper_proto: how a worker registers with dflashd (the keeper) over its unix socket (SOCK_SEQPACKET), and
 * receives its epoch and the pool fds it needs (SCM_RIGHTS). One request, one reply, then the worker closes the
 * connection; everything after that goes through shared memory. The worker side retries until the keeper answers
 * (a keeper restarting is normal). Errors: -errno with an errbuf naming the socket or the keeper's reason. */
#ifndef DFLASH_KEEPER_PROTO_H
#define DFLASH_KEEPER_PROTO_H

#include <stdint.h>

#include "job_state.h"
#include "util.h"

#define KEEPER_MAGIC 0x4b505231u /* "KPR1" */

typedef struct keeper_request {
    uint32_t magic;
    uint32_t role;        /* enum job_role */
    int32_t index;
    int32_t pid;
    char run_id[JOB_RUN_ID_MAX];
} keeper_request;

typedef struct keeper_reply {
    uint32_t magic;
    int32_t status;       /* 0 or -errno */
    uint64_t epoch;
    uint32_t npools;      /* fds attached: pool data fds, pool i at position i (targets: just their own) */
    char msg[256];        /* the reason when status != 0 */
} keeper_reply;

/* Worker side: register (role, index) and get the epoch and up to max_fds pool fds. Retries connecting until
 * deadline_sec passes. */
int keeper_register(const char *socket_path, enum job_role role, int index, keeper_reply *reply, int *fds,
                    int max_fds, double deadline_sec, errbuf *err);

#endif

/* keeper_proto: how a worker registers with dflashd (the keeper) over its unix socket (SOCK_SEQPACKET), and
 * receives its epoch and the fds it needs (SCM_RIGHTS); and how a worker deposits memory it made (fd + GPU UUID): a
 * cuda target the VMM allocations of its pool and of its device weights, a drafter its training state. One request, one reply, then the worker closes the connection;
 * everything after that goes through shared memory. The worker side retries until the keeper answers (a keeper
 * restarting is normal) and while it answers -EAGAIN (GPU pools not deposited yet). Errors: -errno with an errbuf
 * naming the socket or the keeper's reason. */
#ifndef DFLASH_KEEPER_PROTO_H
#define DFLASH_KEEPER_PROTO_H

#include <stdint.h>

#include "job_state.h"
#include "util.h"

#define KEEPER_MAGIC 0x4b505231u         /* "KPR1": registration request, and every reply */
#define KEEPER_DEPOSIT_MAGIC 0x4b504431u /* "KPD1": pool deposit request */
/* fds in one reply at most: a drafter gets every target's pool and one training state (a target: its pool and its
 * weights) (keeper_proto.c checks it
 * against what one message can carry, FDPASS_MAX_FDS) */
#define KEEPER_MAX_FDS (JOB_MAX_TARGETS + 1)

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
    uint32_t ntrain;      /* drafters: 1 when a training state fd follows the pool fds, else 0 */
    uint32_t nweights;    /* targets: 1 when the fd of their deposited device weights follows the pool fd, else 0 */
    int32_t train_index;  /* whose training state it is (the drafter's own, or drafter 0's shared one) */
    uint8_t ctl_token[JOB_CTL_TOKEN_BYTES]; /* this registration's secret for the control socket (job_state.h) */
    char msg[256];        /* the reason when status != 0 */
} keeper_reply;

/* What a deposit holds. */
enum keeper_deposit_kind {
    KEEPER_DEPOSIT_POOL = 0,        /* a cuda target's pool memory (index = target index) */
    KEEPER_DEPOSIT_TRAIN_STATE = 1, /* a drafter reducer's training state (index = drafter index) */
    KEEPER_DEPOSIT_WEIGHTS = 2,     /* a cuda target's device weights (index = target index); unlike the others, a
                                     * later deposit replaces the earlier one (weights reloaded into a new allocation
                                     * when the checkpoint or the layout changed: target_cuda_load_kept) */
};

/* Memory a worker made and dflashd keeps (fd store), sent with its fd: accepted only from the registered instance
 * (pid + epoch) of the worker `index` of the kind's role, once but for the weights (a restarted worker gets the fd
 * back at registration instead). device_uuid is all zero for host memory (a memfd). */
typedef struct keeper_deposit {
    uint32_t magic;       /* KEEPER_DEPOSIT_MAGIC */
    int32_t index;        /* target index = pool index, or drafter index */
    int32_t pid;
    uint32_t kind;        /* enum keeper_deposit_kind */
    uint64_t epoch;       /* the depositor's epoch from its registration */
    uint64_t bytes;       /* size of the VMM allocation (>= nslots * slot_bytes) */
    uint8_t device_uuid[16];
    char run_id[JOB_RUN_ID_MAX];
} keeper_deposit;

/* Worker side: register (role, index) and get the epoch and up to max_fds pool fds. Retries connecting, and
 * retries while the keeper answers -EAGAIN, until deadline_sec passes. */
int keeper_register(const char *socket_path, enum job_role role, int index, keeper_reply *reply, int *fds,
                    int max_fds, double deadline_sec, errbuf *err);
/* Deposit memory of this kind (fd stays the caller's) after registering with `epoch`; uuid NULL for host memory.
 * Retries connecting until deadline_sec passes; a refusal is returned at once. */
int keeper_deposit_memory(const char *socket_path, enum keeper_deposit_kind kind, int index, uint64_t epoch, int fd,
                   const uint8_t uuid[16], uint64_t bytes, double deadline_sec, errbuf *err);

#endif

/* control: dflashd's side of the control plane, a ZeroMQ ROUTER (ipc://<run_dir>/ctl by default, the folder made
 * mode 0750; tcp:// only with a CURVE secret key) serving workers (register, heartbeats both ways) and dflashctl
 * (status, pause, resume, drain, restart, rolling restart, config). It reads and sets the job state through the
 * view the keeper gives it; whether a worker is alive is the keeper's (the worker table's heartbeat, main.c), the
 * control heartbeats only say that its connection works and whether it holds. It never blocks: the keeper polls
 * control_fd and calls control_process every loop. Single-threaded; errors -errno with an errbuf. */
#ifndef DFLASH_CONTROL_H
#define DFLASH_CONTROL_H

#include "job_plan.h"
#include "job_state.h"
#include "slot_pool.h"
#include "token_ring.h"
#include "util.h"

/* What the keeper lends the control module (all owned by the keeper, alive until control_destroy). */
typedef struct control_view {
    job_state *js;
    const job_plan *plan;
    struct token_ring *ring;
    struct slot_pool *const *pools;      /* npools, pool i of target i */
    int npools;
} control_view;

typedef struct control control;

/* Bind the control socket of the job. */
int control_new(control **out, const control_view *view, errbuf *err);
/* A descriptor to poll for POLLIN (ZMQ_FD: edge-like; control_process drains it). */
int control_fd(const control *c);
/* Serve every pending message; heartbeats, the rolling restart, stalls, drain notices. Never blocks. */
void control_process(control *c);
/* Close the socket (replies already queued get up to a second to leave). */
void control_destroy(control **c);

/* The status reply dflashctl status gets, packed (a StatusReply protobuf, malloc'd; *len its size): what /metrics
 * renders, so both show the same figures. */
uint8_t *control_status_pack(control *c, size_t *len);

#endif

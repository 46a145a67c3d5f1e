/* conn: dflashctl's connection to dflashd, a ZeroMQ DEALER ("dflashctl-<pid>") with request/reply matched by
 * request id and bounded waits. One per process, single-threaded. Errors: -ETIMEDOUT when dflashd does not answer
 * in time (the caller reports it unreachable), -errno otherwise, with an errbuf naming the endpoint. */
#ifndef DFLASHCTL_CONN_H
#define DFLASHCTL_CONN_H

#include "ctl_proto.h"

typedef struct conn conn;

/* Connect to endpoint; cfg (may be NULL) supplies the CURVE keys of a tcp endpoint, server_key_file overrides;
 * client_key_file (may be NULL) is this client's secret key, for a dflashd that admits listed clients only. */
int conn_open(conn **out, const char *endpoint, const job_config *cfg, const char *server_key_file,
              const char *client_key_file, errbuf *err);
/* Send req (its request id is assigned here) and wait up to timeout seconds for the reply with that id. */
int conn_request(conn *c, Dflash__Envelope *req, double timeout, Dflash__Envelope **reply, errbuf *err);
/* Wait up to timeout seconds for a further message with request id `id` (e.g. a drain's completion). */
int conn_wait(conn *c, uint64_t id, double timeout, Dflash__Envelope **reply, errbuf *err);
/* 1 when the endpoint is an ipc:// socket whose file is gone (dflashd removes it when it stops cleanly: the job
 * ended or was stopped; a killed dflashd leaves it for its successor), else 0. */
int conn_socket_gone(const char *endpoint);
void conn_close(conn **c);

#endif

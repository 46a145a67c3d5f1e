/* ctl_proto: the control plane's wire code shared by dflashd, the workers and dflashctl. One message = one
 * protobuf-c Envelope (proto/dflash.proto) in one ZeroMQ frame, behind a ROUTER's routing-id frame. Decoding checks
 * the size limit, the protobuf and the protocol version; frame helpers never block (ZMQ_DONTWAIT). Also the
 * endpoint and CURVE set-up every peer derives from the job config. No global state; errors are -errno with an
 * errbuf naming the peer, file or field. */
#ifndef DFLASH_CTL_PROTO_H
#define DFLASH_CTL_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "dflash.pb-c.h"
#include "job_config.h"
#include "job_state.h"
#include "util.h"

#define CTL_PROTOCOL_VERSION 1
#define CTL_MSG_MAX (256 * 1024)  /* bytes of one encoded envelope; larger frames are refused */
#define CTL_ID_MAX 255            /* bytes of a routing id (ZeroMQ's limit) */

/* One received message: the routing id (ROUTER side) and the payload when it was exactly one frame. */
typedef struct ctl_msg {
    uint8_t id[CTL_ID_MAX];
    size_t idlen;
    uint8_t *data;               /* malloc'd copy of the single payload frame (NULL otherwise) */
    size_t len;                  /* bytes of the payload (of the first frame when there were several) */
    int nframes;                 /* payload frames */
    char user[32];               /* ZAP user id of the sender's connection ("" without authentication) */
} ctl_msg;

/* An envelope with version and request id set and no body. */
void ctl_envelope_init(Dflash__Envelope *e, uint64_t request_id);
/* Decode one payload. 0: *out holds the envelope (ctl_envelope_destroy). -EMSGSIZE (too large), -EBADMSG (not an
 * Envelope), -EPROTO (unknown version; *out is still set so the caller can echo its request id). */
int ctl_envelope_decode(Dflash__Envelope **out, const void *buf, size_t n, errbuf *err);
void ctl_envelope_destroy(Dflash__Envelope **e);
/* Encode into a malloc'd buffer; -EMSGSIZE when it would exceed CTL_MSG_MAX. */
int ctl_envelope_encode(const Dflash__Envelope *e, uint8_t **buf, size_t *n, errbuf *err);
/* Send an envelope as one frame, preceded by the routing id frame when id != NULL. Never blocks: -EAGAIN when the
 * peer's queue is full, -EHOSTUNREACH when a ROUTER_MANDATORY peer is gone. */
int ctl_send(void *sock, const void *id, size_t idlen, const Dflash__Envelope *e, errbuf *err);
/* Receive one message without blocking: 1 one message in *m (ctl_msg_clear it), 0 none pending, -errno. */
int ctl_recv(void *sock, int router, ctl_msg *m);
void ctl_msg_clear(ctl_msg *m);
/* A routing id as text for messages: printable as is, otherwise hex ("0x0080000001"). */
void ctl_id_format(const void *id, size_t idlen, char *out, size_t n);

/* "prefetch" | "target" | "drafter" | "eval" -> role (JOB_ROLE_NONE when unknown). */
enum job_role ctl_role_parse(const char *s);
/* "target-1" -> (JOB_ROLE_TARGET, 1); "prefetch" alone means prefetch-0. 0 or -EINVAL. */
int ctl_worker_name_parse(const char *s, size_t n, enum job_role *role, int *index);
/* A routing id that claims a worker's name: "target-1" or "target-1/<hex token>" -> (role, index), and the token
 * in *token when it is one of JOB_CTL_TOKEN_BYTES bytes in hex (*has_token). 0, or -EINVAL when the id names no
 * worker (a dflashctl, a probe). */
int ctl_worker_id_split(const void *id, size_t n, enum job_role *role, int *index,
                        uint8_t token[JOB_CTL_TOKEN_BYTES], int *has_token);
/* The control endpoint of a job: control.endpoint, or ipc://<run_dir>/ctl. */
void ctl_endpoint(const job_config *cfg, char *out, size_t n);
/* Read a 40-character Z85 CURVE key from a file into key[41]; errors name the file. */
int ctl_key_read(const char *path, const char *field, char key[41], errbuf *err);
/* Client side of CURVE for a tcp:// endpoint. The server's public key comes from control.curve_public_key_file, or
 * is derived from control.curve_secret_key_file; the client's own key pair is client_key_file's (a secret key
 * file, public part derived) when given, else dflashd's own pair when the secret is readable (so that workers pass
 * an allow-list), else an ephemeral pair. No-op for ipc://. */
int ctl_curve_client(void *sock, const job_config *cfg, const char *endpoint, const char *client_key_file,
                     errbuf *err);
/* Same with the server's public key given as a file (dflashctl --server-key); client_key_file as above (NULL:
 * ephemeral). server_key_file NULL: no CURVE. */
int ctl_curve_client_key(void *sock, const char *server_key_file, const char *client_key_file, errbuf *err);
/* Read an allow-list of CURVE public keys: one 40-character Z85 key per line; blank lines and lines starting with
 * '#' are skipped. Decoded keys go to keys[0..*n) (at most max). Errors name the file and line. */
int ctl_keys_load(const char *path, const char *field, uint8_t (*keys)[32], int max, int *n, errbuf *err);
/* A new CURVE key pair written as <dir>/<name>.key (secret, mode 0600) and <dir>/<name>.pub (public, 0644), each 40
 * Z85 characters and a newline, each written to a temporary file, fsync'd and linked into place: an existing key
 * file is never replaced (EEXIST names it) and a failure leaves neither file behind. name: letters, digits, '-',
 * '_' and '.', not starting with '.'. */
int ctl_keygen(const char *dir, const char *name, errbuf *err);

#endif

/* fdpass: pass file descriptors (pool data fds, shm fds) between processes over an AF_UNIX socket (SOCK_SEQPACKET
 * or SOCK_STREAM) with SCM_RIGHTS, together with a small payload. Received fds are close-on-exec and owned by the
 * caller; fds beyond what the caller asked for are closed. Blocking calls, retried on EINTR; errors are -errno. */
#ifndef DFLASH_FDPASS_H
#define DFLASH_FDPASS_H

#include <stddef.h>
#include <sys/types.h>

/* fds in one message: the kernel's own limit (SCM_MAX_FD); a protocol that passes more says so where it is defined
 * (keeper_proto.h: KEEPER_MAX_FDS) */
#define FDPASS_MAX_FDS 253

/* Send nfds (0..FDPASS_MAX_FDS) fds and len (>= 1) payload bytes in one message. Returns bytes sent or -errno. */
ssize_t fdpass_send(int sock, const int *fds, int nfds, const void *buf, size_t len);
/* Receive one message: up to max_fds fds into fds (count in *nfds), payload into buf (cap bytes). Returns payload
 * bytes (0: peer closed) or -errno (-EMSGSIZE when a seqpacket payload was truncated; its fds are closed). */
ssize_t fdpass_recv(int sock, int *fds, int max_fds, int *nfds, void *buf, size_t cap);

#endif

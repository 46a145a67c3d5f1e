/* zap: dflashd's ZeroMQ authentication handler (ZAP, RFC 27) for a tcp:// control endpoint with CURVE: only the
 * client public keys of an allow-list (control.curve_client_keys_file), plus dflashd's own public key (used by
 * peers that can read the secret: the workers), may finish the handshake. It runs on its own thread with its own
 * REP socket at inproc://zeromq.zap.01 of the control socket's ZeroMQ context, so handshakes never wait on
 * dflashd's main loop. It must start before the control socket binds. Refusals are logged (rate-limited) with
 * the peer's address and key. */
#ifndef DFLASHD_ZAP_H
#define DFLASHD_ZAP_H

#include "util.h"

#define ZAP_MAX_KEYS 256 /* keys an allow-list may hold */

typedef struct zap_handler zap_handler;

/* Load keys_file (errors name file:line) and start the handler in ctx; server_secret is dflashd's secret key
 * (40 Z85 characters), whose public key is always admitted. */
int zap_start(zap_handler **out, void *ctx, const char *keys_file, const char server_secret[41], errbuf *err);
/* Stop the thread and close its socket (before the context is terminated). NULL-safe. */
void zap_stop(zap_handler **z);

#endif

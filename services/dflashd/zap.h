/* zap: dflashd's ZeroMQ authentication handler (ZAP, RFC 27) for a tcp:// control endpoint with CURVE: only the
 * client public keys of the allow-lists may finish the handshake: control.curve_client_keys_file (user id
 * ZAP_USER_ADMIN, every command), control.curve_readonly_keys_file (ZAP_USER_READONLY: the control plane serves
 * such connections status and config only), and dflashd's own public key (admin: used by peers that can read the
 * secret, the workers). It runs on its own thread with its own
 * REP socket at inproc://zeromq.zap.01 of the control socket's ZeroMQ context, so handshakes never wait on
 * dflashd's main loop. It must start before the control socket binds. Refusals are logged (rate-limited) with
 * the peer's address and key. */
#ifndef DFLASHD_ZAP_H
#define DFLASHD_ZAP_H

#include "util.h"

#define ZAP_MAX_KEYS 256 /* keys the allow-lists may hold together */
#define ZAP_USER_ADMIN "admin"
#define ZAP_USER_READONLY "readonly"

typedef struct zap_handler zap_handler;

/* Load the lists (either may be NULL or empty, not both; errors name file:line) and start the handler in ctx;
 * server_secret is dflashd's secret key (40 Z85 characters), whose public key is always admitted as admin. A key in
 * both lists is admin. */
int zap_new(zap_handler **out, void *ctx, const char *admin_keys_file, const char *readonly_keys_file,
              const char server_secret[41], errbuf *err);
/* Stop the thread and close its socket (before the context is terminated). NULL-safe. */
void zap_destroy(zap_handler **z);

#endif

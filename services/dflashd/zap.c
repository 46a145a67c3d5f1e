#include "zap.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "ctl_proto.h"
#include "log.h"

#define ZAP_FRAMES_MAX 8 /* a request has 7 frames for CURVE (version .. credentials) */

struct zap_handler {
    void *sock; /* REP, used by the thread only */
    pthread_t thread;
    _Atomic int stop;
    int nkeys, nadmin; /* keys[0, nadmin): admin (the list, then dflashd's own); the rest read-only */
    uint8_t keys[ZAP_MAX_KEYS + 1][32];
    char files[2 * CONFIG_STRING_MAX + 8];
    unsigned long refused;
};

/* The user id a key is admitted as, or NULL. */
static const char *key_user(const zap_handler *z, const uint8_t *key, size_t len)
{
    if (len != 32) return NULL;
    for (int i = 0; i < z->nkeys; i++)
        if (!memcmp(z->keys[i], key, 32)) return i < z->nadmin ? ZAP_USER_ADMIN : ZAP_USER_READONLY;
    return NULL;
}

static void send_frame(void *sock, const void *data, size_t len, int more)
{
    zmq_send(sock, data, len, more ? ZMQ_SNDMORE : 0);
}

/* One request: read its frames (at most ZAP_FRAMES_MAX kept, the rest drained), answer 200 or 400. */
static void zap_serve(zap_handler *z)
{
    zmq_msg_t f[ZAP_FRAMES_MAX];
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, z->sock, 0) < 0) {
            zmq_msg_close(&m);
            break;
        }
        more = zmq_msg_more(&m);
        if (n < ZAP_FRAMES_MAX) f[n++] = m;
        else zmq_msg_close(&m);
    }
    if (n >= 2) { /* a REP socket must answer what it received */
        const char *mech = n >= 6 ? (const char *)zmq_msg_data(&f[5]) : "";
        size_t mech_len = n >= 6 ? zmq_msg_size(&f[5]) : 0;
        int curve = mech_len == 5 && !memcmp(mech, "CURVE", 5);
        const char *user = curve && n >= 7 ? key_user(z, zmq_msg_data(&f[6]), zmq_msg_size(&f[6])) : NULL;
        int ok = user != NULL;
        if (!ok && z->refused++ < 20) {
            char key[41] = "?", addr[64] = "?";
            if (n >= 7 && zmq_msg_size(&f[6]) == 32) zmq_z85_encode(key, zmq_msg_data(&f[6]), 32);
            if (n >= 4) snprintf(addr, sizeof addr, "%.*s", (int)zmq_msg_size(&f[3]), (const char *)zmq_msg_data(&f[3]));
            log_warn("control: refused a %.*s client from %s: key %s is not in %s%s", (int)(mech_len < 16 ? mech_len : 16),
                     mech, addr, key, z->files, z->refused == 20 ? " (further refusals are not logged)" : "");
        }
        send_frame(z->sock, "1.0", 3, 1);
        send_frame(z->sock, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), 1);
        send_frame(z->sock, ok ? "200" : "400", 3, 1);
        const char *text = ok ? "OK" : "client key not allowed";
        send_frame(z->sock, text, strlen(text), 1);
        send_frame(z->sock, ok ? user : "", ok ? strlen(user) : 0, 1);
        send_frame(z->sock, "", 0, 0);
    }
    for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
}

static void *zap_main(void *arg)
{
    zap_handler *z = arg;
    while (!atomic_load(&z->stop)) {
        zmq_pollitem_t it = {.socket = z->sock, .events = ZMQ_POLLIN};
        int r = zmq_poll(&it, 1, 200);
        if (r < 0 && errno == ETERM) break;
        if (r > 0) zap_serve(z);
    }
    zmq_close(z->sock);
    z->sock = NULL;
    return NULL;
}

int zap_new(zap_handler **out, void *ctx, const char *admin_keys_file, const char *readonly_keys_file,
              const char server_secret[41], errbuf *err)
{
    zap_handler *z = xcalloc(1, sizeof *z);
    int rc = 0, nadmin_listed = 0, nreadonly = 0;
    const int have_admin = admin_keys_file && admin_keys_file[0], have_ro = readonly_keys_file && readonly_keys_file[0];
    snprintf(z->files, sizeof z->files, "%s%s%s", have_admin ? admin_keys_file : "", have_admin && have_ro ? " or " : "",
             have_ro ? readonly_keys_file : "");
    if (have_admin &&
        (rc = ctl_keys_load(admin_keys_file, "control.curve_client_keys_file", z->keys, ZAP_MAX_KEYS, &nadmin_listed, err)))
        goto fail;
    char pub[41];
    if (zmq_curve_public(pub, server_secret) != 0 || !zmq_z85_decode(z->keys[nadmin_listed], pub)) {
        rc = errbuf_set(err, EINVAL, "control: cannot derive dflashd's public key");
        goto fail;
    }
    z->nadmin = z->nkeys = nadmin_listed + 1;
    if (have_ro && (rc = ctl_keys_load(readonly_keys_file, "control.curve_readonly_keys_file", z->keys + z->nkeys,
                                       ZAP_MAX_KEYS - nadmin_listed, &nreadonly, err)))
        goto fail;
    z->nkeys += nreadonly;
    int zero = 0;
    if (!(z->sock = zmq_socket(ctx, ZMQ_REP)) || zmq_setsockopt(z->sock, ZMQ_LINGER, &zero, sizeof zero) ||
        zmq_bind(z->sock, "inproc://zeromq.zap.01") != 0) {
        rc = errbuf_set(err, errno, "control: ZAP handler socket: %s", zmq_strerror(errno));
        goto fail;
    }
    if ((rc = pthread_create(&z->thread, NULL, zap_main, z)) != 0) {
        rc = errbuf_set(err, rc, "control: ZAP handler thread: %s", strerror(rc));
        goto fail;
    }
    log_info("control: CURVE clients limited to %d key(s)%s%s, %d read-only key(s)%s%s, and dflashd's own",
             nadmin_listed, have_admin ? " of " : "", have_admin ? admin_keys_file : "", nreadonly,
             have_ro ? " of " : "", have_ro ? readonly_keys_file : "");
    *out = z;
    return 0;
fail:
    if (z->sock) zmq_close(z->sock);
    free(z);
    return rc;
}

void zap_destroy(zap_handler **pz)
{
    zap_handler *z = *pz;
    if (!z) return;
    atomic_store(&z->stop, 1);
    pthread_join(z->thread, NULL);
    free(z);
    *pz = NULL;
}

#include "ctl_proto.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

void ctl_envelope_init(Dflash__Envelope *e, uint64_t request_id)
{
    dflash__envelope__init(e);
    e->version = CTL_PROTOCOL_VERSION;
    e->request_id = request_id;
}

int ctl_envelope_decode(Dflash__Envelope **out, const void *buf, size_t n, errbuf *err)
{
    *out = NULL;
    if (n > CTL_MSG_MAX)
        return errbuf_set(err, EMSGSIZE, "message of %zu bytes exceeds the limit of %d", n, CTL_MSG_MAX);
    /* protobuf decodes an empty frame as an all-default Envelope (version 0): say what it is */
    if (n == 0) return errbuf_set(err, EBADMSG, "an empty frame: one dflash.Envelope expected");
    Dflash__Envelope *e = dflash__envelope__unpack(NULL, n, buf);
    if (!e) return errbuf_set(err, EBADMSG, "%zu bytes that are not a dflash.Envelope", n);
    *out = e;
    if (e->version != CTL_PROTOCOL_VERSION)
        return errbuf_set(err, EPROTO, "protocol version %u, this side speaks %d", e->version, CTL_PROTOCOL_VERSION);
    return 0;
}

void ctl_envelope_destroy(Dflash__Envelope **e)
{
    if (*e) dflash__envelope__free_unpacked(*e, NULL);
    *e = NULL;
}

int ctl_envelope_encode(const Dflash__Envelope *e, uint8_t **buf, size_t *n, errbuf *err)
{
    size_t len = dflash__envelope__get_packed_size(e);
    if (len > CTL_MSG_MAX)
        return errbuf_set(err, EMSGSIZE, "message of %zu bytes exceeds the limit of %d", len, CTL_MSG_MAX);
    *buf = xmalloc(len ? len : 1);
    *n = dflash__envelope__pack(e, *buf);
    DF_ASSERT(*n == len);
    return 0;
}

int ctl_send(void *sock, const void *id, size_t idlen, const Dflash__Envelope *e, errbuf *err)
{
    uint8_t *buf;
    size_t n;
    int rc = ctl_envelope_encode(e, &buf, &n, err);
    if (rc) return rc;
    if (id && zmq_send(sock, id, idlen, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
        rc = -errno;
    } else if (zmq_send(sock, buf, n, ZMQ_DONTWAIT) < 0) {
        rc = -errno; /* after a routing frame was accepted, ZeroMQ sends the message atomically or not at all */
    }
    free(buf);
    if (rc) {
        char who[2 * CTL_ID_MAX + 8];
        ctl_id_format(id, id ? idlen : 0, who, sizeof who);
        errbuf_set(err, -rc, "send to %s: %s", id ? who : "dflashd", zmq_strerror(-rc));
    }
    return rc;
}

void ctl_msg_clear(ctl_msg *m)
{
    free(m->data);
    memset(m, 0, sizeof *m);
}

int ctl_recv(void *sock, int router, ctl_msg *m)
{
    memset(m, 0, sizeof *m);
    zmq_msg_t part;
    int first = 1, more = 1;
    while (more) {
        zmq_msg_init(&part);
        int r = zmq_msg_recv(&part, sock, first ? ZMQ_DONTWAIT : 0); /* later parts are already here */
        if (r < 0) {
            int e = errno;
            zmq_msg_close(&part);
            if (first && e == EAGAIN) return 0;
            ctl_msg_clear(m);
            return -e;
        }
        more = zmq_msg_more(&part);
        size_t sz = zmq_msg_size(&part);
        if (first && router) {
            m->idlen = sz < CTL_ID_MAX ? sz : CTL_ID_MAX;
            memcpy(m->id, zmq_msg_data(&part), m->idlen);
        } else {
            if (m->nframes++ == 0) {
                const char *user = zmq_msg_gets(&part, "User-Id");
                if (user) snprintf(m->user, sizeof m->user, "%s", user);
                m->len = sz;
                m->data = xmalloc(sz ? sz : 1);
                memcpy(m->data, zmq_msg_data(&part), sz);
            }
        }
        first = 0;
        zmq_msg_close(&part);
    }
    if (m->nframes != 1) {
        free(m->data);
        m->data = NULL;
    }
    return 1;
}

void ctl_id_format(const void *id, size_t idlen, char *out, size_t n)
{
    const uint8_t *p = id;
    int printable = idlen > 0;
    for (size_t i = 0; i < idlen && printable; i++) printable = isprint(p[i]) && p[i] != '%';
    if (printable) {
        snprintf(out, n, "%.*s", (int)idlen, (const char *)p);
        return;
    }
    size_t o = (size_t)snprintf(out, n, "0x");
    for (size_t i = 0; i < idlen && o + 3 < n; i++) o += (size_t)snprintf(out + o, n - o, "%02x", p[i]);
    if (idlen == 0) snprintf(out, n, "(anonymous)");
}

enum job_role ctl_role_parse(const char *s)
{
    for (int i = 0; i < JOB_NROLES; i++)
        if (!strcmp(s, job_role_name(job_roles[i]))) return job_roles[i];
    return JOB_ROLE_NONE;
}

int ctl_worker_name_parse(const char *s, size_t n, enum job_role *role, int *index)
{
    char buf[32];
    if (n == 0 || n >= sizeof buf) return -EINVAL;
    memcpy(buf, s, n);
    buf[n] = '\0';
    if (strlen(buf) != n) return -EINVAL;
    char *dash = strrchr(buf, '-');
    long v = 0;
    if (dash) {
        char *end;
        *dash = '\0';
        if (!isdigit((unsigned char)dash[1])) return -EINVAL;
        v = strtol(dash + 1, &end, 10);
        if (*end || v < 0 || v > 63) return -EINVAL;
    }
    enum job_role r = ctl_role_parse(buf);
    if (r == JOB_ROLE_NONE || (!dash && r != JOB_ROLE_PREFETCH) || (r == JOB_ROLE_PREFETCH && v != 0)) return -EINVAL;
    *role = r;
    *index = (int)v;
    return 0;
}

int ctl_worker_id_split(const void *id, size_t n, enum job_role *role, int *index,
                        uint8_t token[JOB_CTL_TOKEN_BYTES], int *has_token)
{
    const char *s = id, *slash = memchr(s, '/', n);
    size_t name_len = slash ? (size_t)(slash - s) : n;
    *has_token = 0;
    if (ctl_worker_name_parse(s, name_len, role, index)) return -EINVAL;
    if (!slash) return 0;
    const char *hex = slash + 1;
    if (n - name_len - 1 != 2 * JOB_CTL_TOKEN_BYTES) return 0;
    for (int i = 0; i < JOB_CTL_TOKEN_BYTES; i++) {
        unsigned v = 0;
        for (int j = 0; j < 2; j++) {
            char ch = hex[2 * i + j];
            int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
            if (d < 0) return 0;
            v = v * 16 + (unsigned)d;
        }
        token[i] = (uint8_t)v;
    }
    *has_token = 1;
    return 0;
}

void ctl_endpoint(const job_config *cfg, char *out, size_t n)
{
    if (cfg->control.endpoint[0]) snprintf(out, n, "%s", cfg->control.endpoint);
    else snprintf(out, n, "ipc://%s/ctl", cfg->job.run_dir);
}

int ctl_key_read(const char *path, const char *field, char key[41], errbuf *err)
{
    FILE *f = fopen(path, "r");
    if (!f) return errbuf_set(err, errno, "%s: %s (%s)", path, strerror(errno), field);
    char buf[128] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    while (n > 0 && isspace((unsigned char)buf[n - 1])) buf[--n] = '\0';
    uint8_t raw[32];
    if (n != 40 || !zmq_z85_decode(raw, buf))
        return errbuf_set(err, EINVAL, "%s: not a CURVE key of 40 Z85 characters (%s)", path, field);
    memcpy(key, buf, 41);
    return 0;
}

/* The CURVE options of a client socket: the server's public key, and the client's pair (client_secret NULL: an
 * ephemeral pair). */
static int curve_client_setup(void *sock, const char server_public[41], const char *client_secret, errbuf *err)
{
    char pub[41], sec[41];
    if (!zmq_has("curve")) return errbuf_set(err, ENOTSUP, "this libzmq has no CURVE support");
    if (client_secret) {
        memcpy(sec, client_secret, 41);
        if (zmq_curve_public(pub, sec) != 0) return errbuf_set(err, EINVAL, "cannot derive the client's public key");
    } else if (zmq_curve_keypair(pub, sec) != 0) {
        return errbuf_set(err, errno, "zmq_curve_keypair: %s", zmq_strerror(errno));
    }
    int rc = 0;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, server_public, 40) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, pub, 40) != 0 || zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, sec, 40) != 0)
        rc = errbuf_set(err, errno, "CURVE options: %s", zmq_strerror(errno));
    memset(sec, 0, sizeof sec);
    return rc;
}

/* The client's secret key from client_key_file into sec[41]; 1 when read, 0 when no file is given. */
static int client_secret_read(const char *client_key_file, char sec[41], errbuf *err)
{
    if (!client_key_file || !client_key_file[0]) return 0;
    int rc = ctl_key_read(client_key_file, "--client-key", sec, err);
    return rc ? rc : 1;
}

int ctl_curve_client_key(void *sock, const char *server_key_file, const char *client_key_file, errbuf *err)
{
    if (!server_key_file || !server_key_file[0]) return 0;
    char key[41], sec[41];
    int rc = ctl_key_read(server_key_file, "--server-key", key, err);
    if (rc) return rc;
    int have = client_secret_read(client_key_file, sec, err);
    if (have < 0) return have;
    rc = curve_client_setup(sock, key, have ? sec : NULL, err);
    memset(sec, 0, sizeof sec);
    return rc;
}

int ctl_curve_client(void *sock, const job_config *cfg, const char *endpoint, const char *client_key_file,
                     errbuf *err)
{
    if (strncmp(endpoint, "ipc://", 6) == 0 || strncmp(endpoint, "inproc://", 9) == 0) return 0;
    char key[41], sec[41];
    int rc = 0, have = client_secret_read(client_key_file, sec, err);
    if (have < 0) return have;
    if (cfg->control.curve_public_key_file[0]) {
        rc = ctl_key_read(cfg->control.curve_public_key_file, "control.curve_public_key_file", key, err);
    } else if (cfg->control.curve_secret_key_file[0]) {
        char server_sec[41];
        rc = ctl_key_read(cfg->control.curve_secret_key_file, "control.curve_secret_key_file", server_sec, err);
        if (rc == 0 && zmq_curve_public(key, server_sec) != 0)
            rc = errbuf_set(err, EINVAL, "%s: cannot derive the public key", cfg->control.curve_secret_key_file);
        if (rc == 0 && !have) memcpy(sec, server_sec, 41), have = 1; /* dflashd's own pair: always allowed */
        memset(server_sec, 0, sizeof server_sec);
    } else {
        return errbuf_set(err, EPERM, "control.endpoint %s: tcp needs control.curve_public_key_file (or the secret)",
                          endpoint);
    }
    if (!rc) rc = curve_client_setup(sock, key, have ? sec : NULL, err);
    memset(sec, 0, sizeof sec);
    return rc;
}

int ctl_keys_load(const char *path, const char *field, uint8_t (*keys)[32], int max, int *n, errbuf *err)
{
    *n = 0;
    FILE *f = fopen(path, "r");
    if (!f) return errbuf_set(err, errno, "%s: %s (%s)", path, strerror(errno), field);
    char line[256];
    int lineno = 0, rc = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        lineno++;
        size_t len = strlen(line);
        if (len == sizeof line - 1 && line[len - 1] != '\n') {
            rc = errbuf_set(err, EINVAL, "%s:%d: line too long for a key (%s)", path, lineno, field);
            break;
        }
        char *p = line;
        while (isspace((unsigned char)*p)) p++;
        len = strlen(p);
        while (len > 0 && isspace((unsigned char)p[len - 1])) p[--len] = '\0';
        if (len == 0 || p[0] == '#') continue;
        if (*n == max) rc = errbuf_set(err, E2BIG, "%s:%d: more than %d keys (%s)", path, lineno, max, field);
        else if (len != 40 || !zmq_z85_decode(keys[*n], p))
            rc = errbuf_set(err, EINVAL, "%s:%d: not a CURVE public key of 40 Z85 characters (%s)", path, lineno,
                            field);
        else (*n)++;
    }
    if (!rc && ferror(f)) rc = errbuf_set(err, EIO, "%s: read error (%s)", path, field);
    fclose(f);
    return rc;
}

/* Write key + newline to a fresh temporary file in dir with the given mode, fsync it, then link it to path (fails
 * with EEXIST rather than replacing). The temporary name is removed either way. */
static int keyfile_write(const char *dir, const char *path, const char key[41], mode_t mode, errbuf *err)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/.dflash-key-XXXXXX", dir);
    int fd = mkstemp(tmp);
    if (fd < 0) return errbuf_set(err, errno, "%s: cannot create a file there: %s", dir, strerror(errno));
    char line[42];
    memcpy(line, key, 40);
    line[40] = '\n';
    int rc = 0;
    if (fchmod(fd, mode) != 0 || write(fd, line, 41) != 41 || fsync(fd) != 0)
        rc = errbuf_set(err, errno ? errno : EIO, "%s: %s", tmp, strerror(errno ? errno : EIO));
    if (close(fd) != 0 && !rc) rc = errbuf_set(err, errno, "%s: %s", tmp, strerror(errno));
    if (!rc && link(tmp, path) != 0)
        rc = errbuf_set(err, errno, "%s: %s%s", path, strerror(errno),
                        errno == EEXIST ? " (a key is never replaced: remove it first, or choose another folder)" : "");
    unlink(tmp);
    return rc;
}

int ctl_keygen(const char *dir, const char *name, errbuf *err)
{
    if (!name[0] || name[0] == '.' || strlen(name) > 64)
        return errbuf_set(err, EINVAL, "key name \"%.80s\": 1 to 64 characters, not starting with '.'", name);
    for (const char *q = name; *q; q++)
        if (!isalnum((unsigned char)*q) && !strchr("-_.", *q))
            return errbuf_set(err, EINVAL, "key name \"%.80s\": letters, digits, '-', '_' and '.' only", name);
    if (!zmq_has("curve")) return errbuf_set(err, ENOTSUP, "this libzmq has no CURVE support");
    char pub[41], sec[41], pub_path[PATH_MAX], sec_path[PATH_MAX];
    if (zmq_curve_keypair(pub, sec) != 0) return errbuf_set(err, errno, "zmq_curve_keypair: %s", zmq_strerror(errno));
    snprintf(sec_path, sizeof sec_path, "%s/%s.key", dir, name);
    snprintf(pub_path, sizeof pub_path, "%s/%s.pub", dir, name);
    struct stat st;
    if (stat(dir, &st) != 0) return errbuf_set(err, errno, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return errbuf_set(err, ENOTDIR, "%s: not a folder", dir);
    int rc = keyfile_write(dir, sec_path, sec, 0600, err);
    if (!rc && (rc = keyfile_write(dir, pub_path, pub, 0644, err))) unlink(sec_path);
    if (!rc) fsync_parent(sec_path);
    memset(sec, 0, sizeof sec);
    return rc;
}

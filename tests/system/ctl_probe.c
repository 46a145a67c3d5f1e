/* ctl_probe: sends one kind of bad (or good) input to dflashd's control socket and reports what came back.
 * usage: ctl_probe ENDPOINT CASE [EPOCH]
 *   empty           (a zero-length frame)                              -> expects ERROR_CODE_MALFORMED naming it
 *   garbage | multiframe | truncated | version | unknown | reply-type  -> expects an Error reply of the right code
 *   oversized                                                          -> expects no reply (connection closed)
 *   stale EPOCH     (as "target-0", registers with a stale epoch)      -> expects ERROR_CODE_STALE_EPOCH
 *   impostor        (as "drafter-0", heartbeat with a made-up epoch)   -> expects an Error
 *   status                                                             -> expects a StatusReply
 *   flood N         (N garbage frames as fast as they go)              -> expects an Error reply to the last
 *   pose NAME SEC   (as NAME, e.g. "target-0": a status request every 0.5 s for SEC seconds, holding the
 *                   connection)                                        -> expects ERROR_CODE_UNKNOWN_WORKER each time
 * Prints "error <CODE>: <message>", "reply <body>" or "no reply"; exits 0 when the expected outcome happened. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "ctl_proto.h"

static void *sock_new(void *ctx, const char *endpoint, const char *identity)
{
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    if (identity) zmq_setsockopt(s, ZMQ_ROUTING_ID, identity, strlen(identity));
    if (zmq_connect(s, endpoint) != 0) {
        fprintf(stderr, "ctl_probe: %s: %s\n", endpoint, zmq_strerror(errno));
        exit(2);
    }
    return s;
}

static void send_env(void *s, Dflash__Envelope *e, size_t cut)
{
    size_t n = dflash__envelope__get_packed_size(e);
    uint8_t *buf = malloc(n);
    dflash__envelope__pack(e, buf);
    zmq_send(s, buf, n - cut, 0);
    free(buf);
}

/* The outcome: the error code (>= 0), -1 for another reply, -2 for none. */
static int await(void *s, double sec)
{
    zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, (long)(sec * 1000)) <= 0) {
        printf("no reply\n");
        return -2;
    }
    ctl_msg m;
    if (ctl_recv(s, 0, &m) != 1 || m.nframes != 1) {
        printf("malformed reply\n");
        exit(1);
    }
    Dflash__Envelope *e = NULL;
    errbuf err = {{0}};
    if (ctl_envelope_decode(&e, m.data, m.len, &err)) {
        printf("undecodable reply: %s\n", err.msg);
        exit(1);
    }
    ctl_msg_clear(&m);
    int out = -1;
    if (e->body_case == DFLASH__ENVELOPE__BODY_ERROR) {
        const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(&dflash__error_code__descriptor, e->error->code);
        printf("error %s: %s\n", v ? v->name : "?", e->error->message);
        out = e->error->code;
    } else {
        printf("reply (body %d)\n", (int)e->body_case);
    }
    ctl_envelope_destroy(&e);
    return out;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: ctl_probe ENDPOINT CASE [EPOCH]\n");
        return 2;
    }
    const char *ep = argv[1], *kind = argv[2];
    void *ctx = zmq_ctx_new();
    Dflash__Envelope e;
    ctl_envelope_init(&e, 4242);
    int want = -1, got;
    if (!strcmp(kind, "garbage")) {
        void *s = sock_new(ctx, ep, NULL);
        const char junk[] = "\xff\xff\xff\xff\x0f garbage that is no protobuf \x01\x02";
        zmq_send(s, junk, sizeof junk, 0);
        want = DFLASH__ERROR_CODE__ERROR_CODE_MALFORMED;
        got = await(s, 3);
    } else if (!strcmp(kind, "empty")) {
        void *s = sock_new(ctx, ep, NULL);
        zmq_send(s, "", 0, 0);
        want = DFLASH__ERROR_CODE__ERROR_CODE_MALFORMED;
        got = await(s, 3);
    } else if (!strcmp(kind, "multiframe")) {
        void *s = sock_new(ctx, ep, NULL);
        zmq_send(s, "one", 3, ZMQ_SNDMORE);
        zmq_send(s, "two", 3, 0);
        want = DFLASH__ERROR_CODE__ERROR_CODE_MALFORMED;
        got = await(s, 3);
    } else if (!strcmp(kind, "truncated")) {
        void *s = sock_new(ctx, ep, NULL);
        Dflash__Restart r = DFLASH__RESTART__INIT;
        r.worker = "target-1-and-a-long-enough-name";
        e.body_case = DFLASH__ENVELOPE__BODY_RESTART;
        e.restart = &r;
        send_env(s, &e, 5);
        want = DFLASH__ERROR_CODE__ERROR_CODE_MALFORMED;
        got = await(s, 3);
    } else if (!strcmp(kind, "version")) {
        void *s = sock_new(ctx, ep, NULL);
        Dflash__StatusRequest r = DFLASH__STATUS_REQUEST__INIT;
        e.version = 99;
        e.body_case = DFLASH__ENVELOPE__BODY_STATUS_REQUEST;
        e.status_request = &r;
        send_env(s, &e, 0);
        want = DFLASH__ERROR_CODE__ERROR_CODE_VERSION;
        got = await(s, 3);
    } else if (!strcmp(kind, "unknown") || !strcmp(kind, "reply-type")) {
        void *s = sock_new(ctx, ep, NULL);
        Dflash__Ack a = DFLASH__ACK__INIT;
        if (!strcmp(kind, "reply-type")) {
            e.body_case = DFLASH__ENVELOPE__BODY_ACK;
            e.ack = &a;
            send_env(s, &e, 0);
        } else { /* a valid envelope whose body is field 99, unknown to this protocol */
            uint8_t buf[64];
            size_t n = dflash__envelope__pack(&e, buf);
            buf[n++] = 0x9a; /* tag of field 99, length-delimited: varint (99 << 3) | 2 */
            buf[n++] = 0x06;
            buf[n++] = 0;
            zmq_send(s, buf, n, 0);
        }
        want = DFLASH__ERROR_CODE__ERROR_CODE_UNKNOWN_COMMAND;
        got = await(s, 3);
    } else if (!strcmp(kind, "oversized")) {
        void *s = sock_new(ctx, ep, NULL);
        size_t n = 4u * CTL_MSG_MAX;
        char *big = calloc(1, n);
        zmq_send(s, big, n, 0);
        free(big);
        want = -2;
        got = await(s, 2);
    } else if (!strcmp(kind, "stale") && argc == 4) {
        void *s = sock_new(ctx, ep, "target-0");
        Dflash__RegisterWorker r = DFLASH__REGISTER_WORKER__INIT;
        r.role = "target";
        r.index = 0;
        r.epoch = strtoull(argv[3], NULL, 10);
        r.pid = (int32_t)getpid();
        r.gpu = "none";
        e.body_case = DFLASH__ENVELOPE__BODY_REGISTER_WORKER;
        e.register_worker = &r;
        send_env(s, &e, 0);
        want = DFLASH__ERROR_CODE__ERROR_CODE_STALE_EPOCH;
        got = await(s, 3);
    } else if (!strcmp(kind, "impostor")) {
        void *s = sock_new(ctx, ep, "drafter-0");
        Dflash__Heartbeat h = DFLASH__HEARTBEAT__INIT;
        h.epoch = 1000000;
        e.body_case = DFLASH__ENVELOPE__BODY_HEARTBEAT;
        e.heartbeat = &h;
        send_env(s, &e, 0);
        want = DFLASH__ERROR_CODE__ERROR_CODE_UNKNOWN_WORKER;
        got = await(s, 3);
    } else if (!strcmp(kind, "pose") && argc == 5) {
        void *s = sock_new(ctx, ep, argv[3]);
        Dflash__StatusRequest r = DFLASH__STATUS_REQUEST__INIT;
        e.body_case = DFLASH__ENVELOPE__BODY_STATUS_REQUEST;
        e.status_request = &r;
        want = DFLASH__ERROR_CODE__ERROR_CODE_UNKNOWN_WORKER;
        got = want;
        for (double t = 0, sec = atof(argv[4]); t < sec && got == want; t += 0.5) {
            send_env(s, &e, 0);
            got = await(s, 3);
            usleep(500000);
        }
    } else if (!strcmp(kind, "flood") && argc == 4) {
        void *s = sock_new(ctx, ep, NULL);
        int hwm = 0;
        zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
        const char junk[] = "\xff\xff\xff\xff\x0f flood";
        for (long i = 0, n = atol(argv[3]); i < n; i++) zmq_send(s, junk, sizeof junk, 0);
        want = DFLASH__ERROR_CODE__ERROR_CODE_MALFORMED;
        got = await(s, 5);
    } else if (!strcmp(kind, "status")) {
        void *s = sock_new(ctx, ep, NULL);
        Dflash__StatusRequest r = DFLASH__STATUS_REQUEST__INIT;
        e.body_case = DFLASH__ENVELOPE__BODY_STATUS_REQUEST;
        e.status_request = &r;
        send_env(s, &e, 0);
        want = -1;
        got = await(s, 3);
    } else {
        fprintf(stderr, "ctl_probe: unknown case %s\n", kind);
        return 2;
    }
    return got == want ? 0 : 1;
}

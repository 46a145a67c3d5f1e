/* libFuzzer target: the input is one control-plane frame as dflashd receives it. ctl_envelope_decode must accept
 * it or refuse it with an error that says why, never crash or leak; an accepted envelope has a known body and
 * re-encodes. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    Dflash__Envelope *e = NULL;
    errbuf err = {{0}};
    int rc = ctl_envelope_decode(&e, data, size, &err);
    if (rc != 0) {
        if (rc != -EMSGSIZE && rc != -EBADMSG && rc != -EPROTO) abort();
        if (!err.msg[0] || !memchr(err.msg, '\0', sizeof err.msg)) abort(); /* every refusal says why */
        if ((rc == -EPROTO) != (e != NULL)) abort();
        ctl_envelope_destroy(&e);
        return 0;
    }
    /* what dflashd reads of an accepted envelope: a known body case, readable strings; and it re-encodes (protobuf-c
     * 1.4 re-encodes some unknown fields wrongly, so the bytes are not compared: nothing re-sends what it received) */
    if (e->body_case != DFLASH__ENVELOPE__BODY__NOT_SET &&
        (e->body_case < DFLASH__ENVELOPE__BODY_REGISTER_WORKER || e->body_case > DFLASH__ENVELOPE__BODY_ERROR))
        abort();
    if (e->body_case == DFLASH__ENVELOPE__BODY_RESTART && strlen(e->restart->worker) > size) abort();
    if (e->body_case == DFLASH__ENVELOPE__BODY_REGISTER_WORKER && strlen(e->register_worker->role) > size) abort();
    uint8_t *a = NULL;
    size_t na;
    int er = ctl_envelope_encode(e, &a, &na, &err);
    if (er != 0 && er != -EMSGSIZE) abort();
    free(a);
    ctl_envelope_destroy(&e);
    return 0;
}

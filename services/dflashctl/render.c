#include "render.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void fmt_duration(double sec, char *out, size_t n)
{
    long s = (long)sec;
    if (s >= 86400) snprintf(out, n, "%ldd%02ldh", s / 86400, s % 86400 / 3600);
    else snprintf(out, n, "%02ld:%02ld:%02ld", s / 3600, s % 3600 / 60, s % 60);
}

static const char *job_state_text(const Dflash__StatusReply *s, char *buf, size_t n)
{
    if (s->finished) return s->stop_step && s->stop_step < s->total_steps ? "drained" : "finished";
    if (s->stop_step) {
        snprintf(buf, n, "draining to step %llu", (unsigned long long)s->stop_step);
        return buf;
    }
    if (s->paused) return s->held ? "paused (held)" : "pausing";
    if (s->stalled_sec <= 0 && s->waiting_on && s->waiting_on[0]) return "holding";
    return "running";
}

static void ring_line(FILE *f, const Dflash__RingStatus *r)
{
    if (!r) return;
    fprintf(f, "%-11s %4u slots: %3u free %3u filling %3u ready %3u leased\n", r->name, r->slots, r->free, r->filling,
            r->ready, r->leased);
}

void render_status(FILE *f, const Dflash__StatusReply *s)
{
    char st[64];
    fprintf(f, "job %s  run %s  dflashd pid %d  %s\n", s->job, s->run_id, s->keeper_pid,
            job_state_text(s, st, sizeof st));
    fprintf(f, "step %llu/%llu  ledger %llu  loss %.4f  acceptance %.3f  slot accuracy %.3f  next batch %llu  "
            "skipped %llu\n",
            (unsigned long long)s->step, (unsigned long long)s->total_steps, (unsigned long long)s->ledger_steps,
            s->loss, s->acceptance, s->slot_accuracy, (unsigned long long)s->next_batch,
            (unsigned long long)s->skipped_steps);
    if (s->eval) /* beside the simulated figure above: tau by decoding held-out prompts (the evaluation worker) */
        fprintf(f, "τ %.2f at step %llu (decoded, %u prompts)  speedup %.2fx over target-only greedy\n", s->eval->tau,
                (unsigned long long)s->eval->step, s->eval->prompts, s->eval->speedup);
    if (s->resharded && s->resharded[0]) fprintf(f, "resharded at %s\n", s->resharded);
    if (s->stalled_sec > 0)
        fprintf(f, "STALLED: no step committed for %.0f s: %s\n", s->stalled_sec, s->waiting_on);
    else if (s->waiting_on && s->waiting_on[0])
        fprintf(f, "HOLDING: %s\n", s->waiting_on);
    ring_line(f, s->token_ring);
    for (size_t i = 0; i < s->n_pools; i++) ring_line(f, s->pools[i]);
    fprintf(f, "%-12s %-8s %-8s %8s %-10s %6s %9s %8s %9s %10s %9s\n", "WORKER", "ROLE", "GPU", "PID", "STATE", "EPOCH",
            "UPTIME", "RESTARTS", "BATCHES", "TOK/S", "HEARTBEAT");
    for (size_t i = 0; i < s->n_workers; i++) {
        const Dflash__WorkerStatus *w = s->workers[i];
        char up[32], hb[32], pid[16];
        fmt_duration(w->uptime_sec, up, sizeof up);
        if (w->heartbeat_age_sec >= 0) snprintf(hb, sizeof hb, "%.1fs ago", w->heartbeat_age_sec);
        else snprintf(hb, sizeof hb, "-");
        if (w->pid) snprintf(pid, sizeof pid, "%d", w->pid);
        else snprintf(pid, sizeof pid, "-");
        fprintf(f, "%-12s %-8s %-8s %8s %-10s %6llu %9s %8llu %9llu %10.1f %9s\n", w->name, w->role, w->gpu, pid,
                w->state, (unsigned long long)w->epoch, w->pid ? up : "-", (unsigned long long)w->restarts,
                (unsigned long long)w->batches, w->tokens_per_sec, hb);
    }
    const Dflash__RollingStatus *r = s->rolling;
    if (r && r->active)
        fprintf(f, "restart of %s: %d of %d done, now %s-%d\n", r->role, r->done, r->total, r->role, r->current);
    else if (r && r->error && r->error[0])
        fprintf(f, "last restart of %s failed: %s\n", r->role, r->error);
}

static json_t *field_json(const ProtobufCFieldDescriptor *fd, const void *p)
{
    switch (fd->type) {
    case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
        return json_integer(*(const int32_t *)p);
    case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32: return json_integer(*(const uint32_t *)p);
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
        return json_integer(*(const int64_t *)p);
    case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: return json_integer((json_int_t)*(const uint64_t *)p);
    case PROTOBUF_C_TYPE_FLOAT: return json_real(*(const float *)p);
    case PROTOBUF_C_TYPE_DOUBLE: return json_real(*(const double *)p);
    case PROTOBUF_C_TYPE_BOOL: return json_boolean(*(const protobuf_c_boolean *)p);
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(fd->descriptor, *(const int *)p);
        return v ? json_string(v->name) : json_integer(*(const int *)p);
    }
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)p;
        return json_string(s ? s : "");
    }
    case PROTOBUF_C_TYPE_BYTES: return json_integer((json_int_t)((const ProtobufCBinaryData *)p)->len);
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *m = *(const ProtobufCMessage *const *)p;
        json_t *o = json_object();
        if (!m) return json_null();
        for (unsigned i = 0; i < m->descriptor->n_fields; i++) {
            const ProtobufCFieldDescriptor *f = &m->descriptor->fields[i];
            const char *base = (const char *)m;
            if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
                if (*(const uint32_t *)(base + f->quantifier_offset) != f->id) continue;
            }
            if (f->label == PROTOBUF_C_LABEL_REPEATED) {
                size_t n = *(const size_t *)(base + f->quantifier_offset);
                const char *arr = *(char *const *)(base + f->offset);
                size_t sz = f->type == PROTOBUF_C_TYPE_MESSAGE || f->type == PROTOBUF_C_TYPE_STRING ? sizeof(void *)
                            : f->type == PROTOBUF_C_TYPE_DOUBLE || f->type == PROTOBUF_C_TYPE_INT64 ||
                                      f->type == PROTOBUF_C_TYPE_UINT64 || f->type == PROTOBUF_C_TYPE_SINT64 ||
                                      f->type == PROTOBUF_C_TYPE_FIXED64 || f->type == PROTOBUF_C_TYPE_SFIXED64
                                ? 8
                            : f->type == PROTOBUF_C_TYPE_BYTES ? sizeof(ProtobufCBinaryData)
                                                               : 4;
                json_t *a = json_array();
                for (size_t j = 0; j < n; j++) json_array_append_new(a, field_json(f, arr + j * sz));
                json_object_set_new(o, f->name, a);
            } else {
                json_object_set_new(o, f->name, field_json(f, base + f->offset));
            }
        }
        return o;
    }
    }
    return json_null();
}

void render_json(FILE *f, const ProtobufCMessage *m)
{
    ProtobufCFieldDescriptor fd = {.type = PROTOBUF_C_TYPE_MESSAGE};
    json_t *o = field_json(&fd, &m);
    char *text = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(10));
    fprintf(f, "%s\n", text ? text : "null");
    free(text);
    json_decref(o);
}

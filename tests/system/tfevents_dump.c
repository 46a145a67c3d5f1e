/* tfevents_dump FILE: read a TensorBoard event file with dflash's own reader, checking the TFRecord framing and both
 * masked CRC32Cs of every record, and print one JSON line per event: {"step": k, "wall_time": t, "file_version":
 * "..."} or {"step": k, "wall_time": t, "values": {"tag": v, ...}} (non-finite values as "NaN", "inf", "-inf").
 * Exit 1 naming the record that is torn, corrupt or not an Event. For tests/system/metrics.sh. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensorboard.pb-c.h"
#include "tfevents.h"

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: tfevents_dump FILE\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        fprintf(stderr, "%s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    size_t cap = 1 << 16, n = 0, r;
    uint8_t *buf = malloc(cap);
    while ((r = fread(buf + n, 1, cap - n, f)) > 0)
        if ((n += r) == cap) buf = realloc(buf, cap *= 2);
    fclose(f);
    size_t pos = 0, records = 0;
    const uint8_t *data;
    size_t len;
    errbuf err = {{0}};
    int rc;
    while ((rc = tfevents_record_next(buf, n, &pos, &data, &len, &err)) == 0) {
        Tensorboard__Event *ev = tensorboard__event__unpack(NULL, len, data);
        if (!ev) {
            fprintf(stderr, "%s: record %zu: not an Event protobuf\n", argv[1], records);
            return 1;
        }
        printf("{\"step\": %lld, \"wall_time\": %.6f", (long long)ev->step, ev->wall_time);
        if (ev->what_case == TENSORBOARD__EVENT__WHAT_FILE_VERSION) printf(", \"file_version\": \"%s\"", ev->file_version);
        if (ev->what_case == TENSORBOARD__EVENT__WHAT_SUMMARY) {
            printf(", \"values\": {");
            for (size_t i = 0; i < ev->summary->n_value; i++) {
                const Tensorboard__SummaryValue *v = ev->summary->value[i];
                if (v->value_case != TENSORBOARD__SUMMARY_VALUE__VALUE_SIMPLE_VALUE) {
                    fprintf(stderr, "%s: record %zu: value %s is not a simple_value\n", argv[1], records, v->tag);
                    return 1;
                }
                float x = v->simple_value;
                printf("%s\"%s\": ", i ? ", " : "", v->tag);
                if (isnan(x)) printf("\"NaN\"");
                else if (isinf(x)) printf(x > 0 ? "\"inf\"" : "\"-inf\"");
                else printf("%.9g", (double)x);
            }
            printf("}");
        }
        printf("}\n");
        tensorboard__event__free_unpacked(ev, NULL);
        records++;
    }
    if (rc < 0) {
        fprintf(stderr, "%s: %s\n", argv[1], err.msg);
        return 1;
    }
    free(buf);
    return 0;
}

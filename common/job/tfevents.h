/* tfevents: a TensorBoard event file, <dir>/events.out.tfevents.<unix time>.<host>, written as TensorFlow writes
 * it: TFRecord framing (uint64 length, masked CRC32C of the length, the data, masked CRC32C of the data) around
 * Event protobufs (proto/tensorboard.proto), the first saying "brain.Event:2", then one per committed step with
 * the scalars of its metrics.jsonl line. dflashd's ledger writes it beside metrics.jsonl (metrics.tensorboard).
 * The reading half (record framing, CRCs) serves tests and tools. Single-threaded; errors 0 / -errno + errbuf. */
#ifndef DFLASH_TFEVENTS_H
#define DFLASH_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "step_metrics.h"
#include "util.h"

typedef struct tfevents tfevents;

/* Make dir (mode 0755, its parent must exist) and a new event file in it, and write the file-version event. */
int tfevents_open(tfevents **out, const char *dir, errbuf *err);
/* Append one event at `step` holding the scalars tags[i] = values[i] (stored as float, as TensorBoard does). */
int tfevents_write_scalars(tfevents *t, int64_t step, const char *const *tags, const double *values, int n,
                           errbuf *err);
/* Append the scalars of step k as metrics.jsonl has them: loss, slot_accuracy/<i> for slots 1..block_size-1,
 * acceptance, grad_norm, lr, tokens (a skipped step's non-finite loss or norm is written as it is: NaN or inf). */
int tfevents_write_step(tfevents *t, uint64_t k, const step_summary *s, int block_size, errbuf *err);
/* The event file's path. */
const char *tfevents_path(const tfevents *t);
void tfevents_destroy(tfevents **t);

/* CRC32C (Castagnoli) of n bytes, and TFRecord's mask of a CRC (rotate right by 15, add 0xa282ead8). */
uint32_t tfevents_crc32c(const void *p, size_t n);
uint32_t tfevents_crc_mask(uint32_t crc);
/* The record at buf[*pos..n): its data and length; *pos moves past it. 0, 1 at the end of buf, or -EBADMSG with
 * the record's offset and what is wrong (torn, a length or data CRC that does not match). */
int tfevents_record_next(const uint8_t *buf, size_t n, size_t *pos, const uint8_t **data, size_t *len, errbuf *err);

#endif

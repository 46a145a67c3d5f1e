/* shard: token shards, the training-data files (format in common/formats/SHARD_FORMAT.md): a 64-byte header, then
 * offsets u64[nsamples+1], token ids u32[ntokens], loss_mask u8[ntokens], zero padding to 8 bytes; little-endian,
 * XXH64 (seed 0) of everything after the header stored in the header. A shard is read by mmap and fully validated
 * on open; a dataset is one shard or every *.shard of a folder. Readers own their mappings; sample pointers stay
 * valid until close; reading is thread-safe, open/close are not. Writers buffer in memory and publish atomically
 * (tmp + fsync + rename). Errors return -errno and fill an errbuf naming the file and what is wrong. */
#ifndef DFLASH_SHARD_H
#define DFLASH_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

#define SHARD_MAGIC "DFSHARD" /* 8 bytes with the terminating NUL */
#define SHARD_VERSION 1u
#define SHARD_HEADER_BYTES 64u
/* Byte offsets of the header fields (all little-endian). */
#define SHARD_OFF_VERSION 8
#define SHARD_OFF_HEADER_BYTES 12
#define SHARD_OFF_NSAMPLES 16
#define SHARD_OFF_NTOKENS 24
#define SHARD_OFF_CHECKSUM 32

typedef struct shard shard;
typedef struct shard_writer shard_writer;
typedef struct dataset dataset;

/* XXH64 with seed 0: the shard checksum (exposed for tests and tools). */
uint64_t shard_hash(const void *data, size_t n);

/* Map and validate one shard file (magic, version, size, checksum, offsets, mask values). */
int shard_open(shard **out, const char *path, errbuf *err);
/* Unmap and free; nulls the pointer; NULL allowed. */
void shard_close(shard **s);
/* Path the shard was opened from. */
const char *shard_path(const shard *s);
/* Number of samples. */
uint64_t shard_count(const shard *s);
/* Number of tokens over all samples. */
uint64_t shard_ntokens(const shard *s);
/* Number of tokens with loss_mask 1. */
uint64_t shard_ntrained(const shard *s);
/* Sample i (< shard_count): pointers into the mapping and its length (asserts on a bad index). */
void shard_sample(const shard *s, uint64_t i, const uint32_t **tokens, const uint8_t **mask, uint64_t *len);

/* Bytes of the shard file, and a digest (XXH64) of its 64-byte header, which holds the counts and the checksum of
 * everything after it: together with the name, the shard's identity (run_record). */
uint64_t shard_file_bytes(const shard *s);
uint64_t shard_header_digest(const shard *s);
/* 0 while the file at the shard's path is the one opened (same inode, size and modification time); -ENOENT or
 * -ESTALE naming the shard and how it changed (gone, replaced, truncated or resized, overwritten in place). */
int shard_check_unchanged(const shard *s, errbuf *err);
/* Start a shard to be published at path; nothing appears at path until shard_writer_close succeeds. */
int shard_writer_open(shard_writer **out, const char *path, errbuf *err);
/* Append one sample of n tokens; mask NULL means every token is trained; mask values must be 0 or 1. */
int shard_writer_add(shard_writer *w, const uint32_t *tokens, const uint8_t *mask, size_t n, errbuf *err);
/* Samples and tokens added so far. */
uint64_t shard_writer_count(const shard_writer *w);
uint64_t shard_writer_ntokens(const shard_writer *w);
/* Write tmp file, fsync, rename to the final path, fsync the folder; always frees *w and nulls it. */
int shard_writer_close(shard_writer **w, errbuf *err);
/* Drop an unfinished shard (nothing is published); nulls the pointer; NULL allowed. */
void shard_writer_discard(shard_writer **w);

/* Open a dataset: one shard file, or every *.shard in a folder in name order (digit runs compare by value). */
int dataset_open(dataset **out, const char *path, errbuf *err);
/* Close every shard; nulls the pointer; NULL allowed. */
void dataset_close(dataset **ds);
/* Total samples over all shards. */
uint64_t dataset_count(const dataset *ds);
/* Total tokens over all shards. */
uint64_t dataset_ntokens(const dataset *ds);
/* Number of shards, and shard i of them. */
size_t dataset_nshards(const dataset *ds);
const shard *dataset_shard(const dataset *ds, size_t i);
/* Sample by global index (shards concatenated in order); -ERANGE when index >= dataset_count. */
int dataset_sample(const dataset *ds, uint64_t index, const uint32_t **tokens, const uint8_t **mask,
                   uint64_t *len);
/* shard_check_unchanged for every shard of the dataset: the first that changed. */
int dataset_check_unchanged(const dataset *ds, errbuf *err);
/* The path of the shard whose mapping holds addr, or NULL (async-signal-safe: a SIGBUS handler names the shard). */
const char *dataset_shard_at(const dataset *ds, const void *addr);
/* Fail on the first token id >= vocab, naming the shard, the sample and the token. */
int dataset_check_vocab(const dataset *ds, uint32_t vocab, errbuf *err);

#endif

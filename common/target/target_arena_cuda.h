/* target_arena_cuda: the device memory of a CUDA target as one VMM allocation that outlives its process (exported as
 * a POSIX fd, kept by dflashd, re-imported by a restarted dflash-target-cuda). Buffers are handed out in order,
 * 256-byte aligned, after a header that says what the allocation holds; the same sequence of sizes gives the same
 * offsets in every process. A measuring arena (target_arena_measure) hands out NULL and only counts. Only
 * common/target includes it (target_model_cuda.c, target_base_cuda.c). */
#ifndef DFLASH_TARGET_ARENA_CUDA_H
#define DFLASH_TARGET_ARENA_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"
#include "vmm_pool_cuda.h"

#define TARGET_ARENA_HEADER 4096
#define TARGET_ARENA_MAGIC 0x31415754u /* "TWA1" */

/* What an arena holds, at its start: magic is TARGET_ARENA_MAGIC only once the weights behind it are complete. */
typedef struct target_arena_header {
    uint32_t magic;
    uint32_t reserved;
    uint64_t bytes;           /* the allocation's size */
    uint64_t layout_digest;   /* target_arena_layout of the model that filled it */
    char identity[1536];      /* the checkpoint it was loaded from (the caller's words: target_cuda_keep) */
    char layout[512];         /* family, layers, dtype, workspace shape, buffers: in words, for the log */
} target_arena_header;

typedef struct target_arena target_arena;

target_arena *target_arena_measure(void);
/* Import the allocation fd (bytes) on device, or (fd < 0) create one of bytes. */
int target_arena_map(target_arena **out, int device, int fd, size_t bytes, errbuf *err);
/* The next buffer of bytes (NULL when measuring); a mapped arena too small for its layout is a bug (asserted). */
void *target_arena_take(target_arena *a, size_t bytes);
/* Bytes the layout needs (header included); the mapped size (0 when measuring); the layout digest; buffers. */
size_t target_arena_bytes(const target_arena *a);
size_t target_arena_size(const target_arena *a);
uint64_t target_arena_layout(const target_arena *a);
size_t target_arena_buffers(const target_arena *a);
/* Whether p lies in a mapped arena of this process (target_cuda_free leaves those alone). */
int target_arena_owns(const void *p);
/* A new fd of the allocation (the caller's) and its size. */
int target_arena_export(const target_arena *a, int *fd, size_t *bytes, errbuf *err);
/* The header, read back; written after the device has finished every write before it (NULL: cleared). */
void target_arena_header_read(const target_arena *a, target_arena_header *h);
void target_arena_header_write(target_arena *a, const target_arena_header *h);
/* Unmap and release this process's reference (the memory lives while dflashd holds its fd). */
void target_arena_destroy(target_arena **a);

#endif

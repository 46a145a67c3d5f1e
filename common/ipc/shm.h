/* shm: named POSIX shared-memory segments and memfds for the data plane. A segment starts with a 64-byte common
 * header (magic, version, kind, total bytes) written by its creator and checked on every open, so a wrong or stale
 * segment is refused with a message naming it. The creator (dflashd) owns and unlinks segments; other processes
 * open, map and close them. A struct shm_segment is process-local; errors are 0 / -errno with an errbuf message. */
#ifndef DFLASH_SHM_H
#define DFLASH_SHM_H

#include "util.h"

#include <stddef.h>
#include <stdint.h>

#define SHM_MAGIC UINT64_C(0x314d48534853464c) /* "LFSHSHM1" little-endian */
#define SHM_VERSION 4 /* bump on any change of a segment's layout (2: job_state_header.restart_op; 3: the training
                        * state left the job state for the reducer; 4: job_state_header.target_weights) */
#define SHM_HEADER_BYTES 64
#define SHM_NAME_MAX 255

enum shm_kind {
    SHM_KIND_TOKEN_RING = 1,
    SHM_KIND_SLOT_POOL = 2,
    SHM_KIND_OTHER = 100, /* first value free for other modules */
};

/* The first SHM_HEADER_BYTES of every segment. magic is stored last (release) so an opener never sees half a header. */
struct shm_header {
    _Atomic uint64_t magic;
    uint32_t version;
    uint32_t kind;
    uint64_t total_bytes;
    uint64_t reserved[5];
};

struct shm_segment {
    char name[SHM_NAME_MAX + 1];
    void *base;         /* the mapping; base points at the struct shm_header */
    size_t bytes;       /* total mapped bytes, header included */
};

/* Create a new segment (fails with -EEXIST if the name exists), size it to `bytes` (header included, zero filled),
 * map it and write the header. On failure nothing is left behind. */
int shm_segment_create(struct shm_segment *seg, const char *name, uint32_t kind, size_t bytes, errbuf *err);
/* Open and map an existing segment; checks magic, version, kind and that the size matches the header. */
int shm_segment_open(struct shm_segment *seg, const char *name, uint32_t kind, errbuf *err);
/* Unmap (does not unlink); safe on a zeroed or already closed segment. */
void shm_segment_close(struct shm_segment *seg);
/* Remove the name (mappings stay valid until closed); -ENOENT when it does not exist. */
int shm_segment_unlink(const char *name, errbuf *err);
/* The caller's area after the common header. */
void *shm_segment_body(const struct shm_segment *seg);

/* Create an anonymous memory file of `bytes` bytes (close-on-exec); returns the fd or -errno. */
int shm_memfd_create(const char *name, size_t bytes, errbuf *err);
/* Map a whole shared fd read-write. *bytes: in, the size expected (0 = any); out, the size from fstat.
 * Returns NULL (message in err) on failure. */
void *shm_map_fd(int fd, size_t *bytes, errbuf *err);

#endif

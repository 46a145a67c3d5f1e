/* util: the error idioms every module uses, and allocation wrappers.
 * - DF_ASSERT: an invariant; stays on in release builds, prints the expression and file:line, aborts.
 * - errbuf: recoverable failures return 0 / -errno and write a one-line message naming the file, field or value
 *   into a caller-provided buffer (errbuf_set); constructors unwind through one `goto fail`.
 * - xmalloc/xcalloc: abort with a message on out-of-memory (a worker that cannot allocate restarts). */
#ifndef DFLASH_UTIL_H
#define DFLASH_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* The largest drafter block size anything in dflash supports (per-slot metrics arrays are this long). */
#define DFLASH_MAX_BLOCK 64

#define DF_ASSERT(cond) \
    do { if (!(cond)) df_assert_fail(#cond, __FILE__, __LINE__); } while (0)
_Noreturn void df_assert_fail(const char *expr, const char *file, int line);

/* A caller-owned buffer for one error message. */
typedef struct errbuf {
    char msg[512];
} errbuf;
/* Write a message into err (NULL allowed) and return -errnum (pass a positive errno value, e.g. EINVAL). */
int errbuf_set(errbuf *err, int errnum, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Prefix the existing message with context ("loading X: <old>"); returns ret unchanged. */
int errbuf_wrap(errbuf *err, int ret, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

void *xmalloc(size_t n);
void *xcalloc(size_t count, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
/* Free and null the pointer (czmq-style x_destroy(&x)). */
#define XFREE(p) do { free(p); (p) = NULL; } while (0)

/* fsync the folder holding path, so that a rename into it survives a crash; 0 or -errno. */
int fsync_parent(const char *path);

/* Monotonic clock in seconds. */
double now_seconds(void);

/* bf16/f16 <-> f32 conversions (round-to-nearest-even on the way down). */
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);
float f16_to_f32(uint16_t h);

#endif

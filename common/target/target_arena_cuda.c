/* target_arena_cuda: one VMM allocation (common/ipc/vmm_pool_cuda.h) that every device buffer of a CUDA target is
 * carved from, in the order the generic code and the family allocate them (target_cuda_alloc), so that a restarted
 * process that re-imports the allocation finds each weight at the same offset. Its first TARGET_ARENA_HEADER bytes
 * say what it holds (target_arena_header): written after a load has completed, cleared before one starts, so that an
 * interrupted load is never taken for weights. A measuring arena hands out no memory (NULL) and only counts: the
 * size and the layout digest of a model before its allocation exists. */
#include "target_arena_cuda.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_check.h"

#define ARENA_ALIGN 256 /* what cudaMalloc guarantees, and the kernels' vector loads need */
#define MAX_ARENAS 16

struct target_arena {
    vmm_alloc *va;      /* NULL: measuring */
    size_t used;        /* bytes handed out, from TARGET_ARENA_HEADER on */
    uint64_t layout;    /* FNV-1a over the sizes handed out, in order */
    size_t nbufs;
};

/* The live arenas' address ranges: target_cuda_free is given a pointer only, and must not cudaFree a part of one. */
static struct { uintptr_t lo, hi; } live[MAX_ARENAS];
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;

static void live_set(uintptr_t lo, uintptr_t hi, int add)
{
    pthread_mutex_lock(&live_lock);
    for (int i = 0; i < MAX_ARENAS; i++) {
        if (add ? live[i].lo == 0 : live[i].lo == lo) {
            live[i].lo = add ? lo : 0;
            live[i].hi = add ? hi : 0;
            add = -1;
            break;
        }
    }
    pthread_mutex_unlock(&live_lock);
    DF_ASSERT(add != 1 && "more than MAX_ARENAS target arenas in one process");
}

static target_arena *arena_new(void)
{
    target_arena *a = xcalloc(1, sizeof *a);
    a->layout = 0xcbf29ce484222325ull;
    return a;
}

target_arena *target_arena_measure(void) { return arena_new(); }

int target_arena_map(target_arena **out, int device, int fd, size_t bytes, errbuf *err)
{
    target_arena *a = arena_new();
    int rc = fd >= 0 ? vmm_alloc_attach(device, fd, bytes, &a->va, err) : vmm_alloc_create(device, bytes, &a->va, err);
    if (rc) {
        free(a);
        return errbuf_wrap(err, rc, "target weights arena (%zu bytes)", bytes);
    }
    live_set((uintptr_t)a->va->ptr, (uintptr_t)a->va->ptr + a->va->size, 1);
    *out = a;
    return 0;
}

void *target_arena_take(target_arena *a, size_t bytes)
{
    uint64_t n = bytes;
    for (int i = 0; i < 8; i++) a->layout = (a->layout ^ ((n >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    a->nbufs++;
    size_t off = TARGET_ARENA_HEADER + a->used;
    a->used += (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    if (!a->va) return NULL;
    DF_ASSERT(TARGET_ARENA_HEADER + a->used <= a->va->size && "a target arena smaller than its measured layout");
    return (char *)(uintptr_t)a->va->ptr + off;
}

size_t target_arena_bytes(const target_arena *a) { return TARGET_ARENA_HEADER + a->used; }
size_t target_arena_size(const target_arena *a) { return a->va ? a->va->size : 0; }
uint64_t target_arena_layout(const target_arena *a) { return a->layout; }
size_t target_arena_buffers(const target_arena *a) { return a->nbufs; }

int target_arena_owns(const void *p)
{
    uintptr_t u = (uintptr_t)p;
    int own = 0;
    pthread_mutex_lock(&live_lock);
    for (int i = 0; i < MAX_ARENAS && !own; i++) own = live[i].lo && u >= live[i].lo && u < live[i].hi;
    pthread_mutex_unlock(&live_lock);
    return own;
}

int target_arena_export(const target_arena *a, int *fd, size_t *bytes, errbuf *err)
{
    *bytes = a->va->size;
    return vmm_alloc_export_fd(a->va, fd, err);
}

void target_arena_header_read(const target_arena *a, target_arena_header *h)
{
    CHECK_CUDA(cudaMemcpy(h, (const void *)(uintptr_t)a->va->ptr, sizeof *h, cudaMemcpyDeviceToHost));
    h->identity[sizeof h->identity - 1] = h->layout[sizeof h->layout - 1] = '\0';
}

void target_arena_header_write(target_arena *a, const target_arena_header *h)
{
    _Static_assert(sizeof(target_arena_header) <= TARGET_ARENA_HEADER, "the header fits its reserved bytes");
    target_arena_header z;
    if (!h) { /* cleared: whatever follows is being rewritten */
        memset(&z, 0, sizeof z);
        h = &z;
    }
    CHECK_CUDA(cudaDeviceSynchronize()); /* a header describes completed writes only */
    CHECK_CUDA(cudaMemcpy((void *)(uintptr_t)a->va->ptr, h, sizeof *h, cudaMemcpyHostToDevice));
}

void target_arena_destroy(target_arena **ap)
{
    target_arena *a = *ap;
    if (!a) return;
    if (a->va) {
        live_set((uintptr_t)a->va->ptr, 0, 0);
        vmm_alloc_destroy(&a->va);
    }
    free(a);
    *ap = NULL;
}

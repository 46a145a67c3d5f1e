/* vmm_pool_cuda: GPU memory for hidden-state pools as CUDA VMM allocations that can be exported as POSIX file
 * descriptors (cuMemExportToShareableHandle), held by a process that never touches CUDA (dflashd), and imported
 * again by any process, including a restarted exporter (docs/design.md §2: a legacy cudaIpcMemHandle dies with its
 * exporter, a VMM fd does not). GPUs are named by UUID, never by ordinal. Driver API; errors: 0 / -errno with an
 * errbuf naming the device and the failing call. One vmm_alloc per mapping (vmm_alloc_create / vmm_alloc_attach ->
 * vmm_alloc_destroy); not thread-safe per object. */
#ifndef DFLASH_VMM_POOL_CUDA_H
#define DFLASH_VMM_POOL_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

typedef struct vmm_alloc {
    unsigned long long ptr;        /* CUdeviceptr of the mapping */
    size_t size;                   /* mapped bytes (a multiple of the allocation granularity) */
    unsigned long long handle;     /* CUmemGenericAllocationHandle */
    int device;                    /* ordinal in this process */
} vmm_alloc;

/* Allocate `bytes` (rounded up to the granularity) on `device`, exportable as a POSIX fd, mapped read-write. */
int vmm_alloc_create(int device, size_t bytes, vmm_alloc **out, errbuf *err);
/* Map an exported allocation of `bytes` from fd on `device` (the fd stays the caller's). */
int vmm_alloc_attach(int device, int fd, size_t bytes, vmm_alloc **out, errbuf *err);
/* Unmap, release this process's reference (the memory lives while any fd or mapping holds it), free, null *a. */
void vmm_alloc_destroy(vmm_alloc **a);
/* A new fd for the allocation (the caller owns it; pass it with fdpass). */
int vmm_alloc_export_fd(const vmm_alloc *a, int *fd, errbuf *err);
/* The 16-byte UUID of a device ordinal, and the ordinal of a UUID (-ENODEV when no visible GPU has it). */
int vmm_device_uuid(int device, uint8_t uuid[16], errbuf *err);
int vmm_device_by_uuid(const uint8_t uuid[16], int *device, errbuf *err);

#endif

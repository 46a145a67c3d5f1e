#include "vmm_pool_cuda.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The driver functions this file calls, resolved at the first use through the runtime
 * (cudaGetDriverEntryPointByVersion) instead of linked: a binary of the CUDA backend that never makes a VMM
 * allocation (dflash-cuda refusing a target at start, on a machine without a GPU driver) starts without
 * libcuda.so.1, and one that does names the missing driver in its error instead of failing to load. */
#define DRIVER_FUNCS(X)                                                                                             \
    X(cuGetErrorName) X(cuGetErrorString) X(cuInit) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetUuid)          \
    X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent) X(cuMemGetAllocationGranularity) X(cuMemCreate) X(cuMemRelease) \
    X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess)                         \
    X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle)

static struct {
#define DRIVER_FIELD(f) __typeof__(&f) f##_p;
    DRIVER_FUNCS(DRIVER_FIELD)
#undef DRIVER_FIELD
    int ok;
    char why[192];
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void drv_resolve(void)
{
    drv.ok = 1;
#define DRIVER_RESOLVE(f)                                                                                           \
    if (drv.ok) {                                                                                                   \
        void *p_ = NULL;                                                                                            \
        enum cudaDriverEntryPointQueryResult q_ = cudaDriverEntryPointSymbolNotFound;                                  \
        cudaError_t e_ = cudaGetDriverEntryPointByVersion(#f, &p_, CUDART_VERSION, cudaEnableDefault, &q_);         \
        if (e_ != cudaSuccess || q_ != cudaDriverEntryPointSuccess || !p_) {                                        \
            drv.ok = 0;                                                                                             \
            snprintf(drv.why, sizeof drv.why, "the CUDA driver gives no %s (%s)", #f,                               \
                     e_ != cudaSuccess ? cudaGetErrorString(e_) : "not found in this driver version");              \
        } else {                                                                                                    \
            drv.f##_p = (__typeof__(drv.f##_p))p_;                                                                  \
        }                                                                                                           \
    }
    DRIVER_FUNCS(DRIVER_RESOLVE)
#undef DRIVER_RESOLVE
}

static int drv_ready(void)
{
    pthread_once(&drv_once, drv_resolve);
    return drv.ok;
}
#define DRV(f) (drv.f##_p)

static int cu_fail(errbuf *err, CUresult r, const char *call, int device)
{
    const char *name = NULL, *text = NULL;
    DRV(cuGetErrorName)(r, &name);
    DRV(cuGetErrorString)(r, &text);
    return errbuf_set(err, r == CUDA_ERROR_OUT_OF_MEMORY ? ENOMEM : EIO, "GPU %d: %s: %s (%s)", device, call,
                      name ? name : "?", text ? text : "?");
}

#define CU_TRY(call, dev)                                                   \
    do {                                                                    \
        if (!drv_ready()) { rc = errbuf_set(err, ENODEV, "GPU %d: %s", (dev), drv.why); goto fail; } \
        CUresult r_ = (call);                                               \
        if (r_ != CUDA_SUCCESS) { rc = cu_fail(err, r_, #call, (dev)); goto fail; } \
    } while (0)

static int context_for(int device, CUdevice *dev, errbuf *err)
{
    int rc = 0;
    CU_TRY(DRV(cuInit)(0), device);
    CU_TRY(DRV(cuDeviceGet)(dev, device), device);
    CUcontext ctx;
    CU_TRY(DRV(cuDevicePrimaryCtxRetain)(&ctx, *dev), device);
    CU_TRY(DRV(cuCtxSetCurrent)(ctx), device);
    return 0;
fail:
    return rc;
}

static void prop_for(CUmemAllocationProp *prop, CUdevice dev)
{
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = (int)dev;
    prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

/* Reserve an address range, map the handle there and allow this device to read and write it. */
static int map_handle(vmm_alloc *a, CUdevice dev, CUmemGenericAllocationHandle h, errbuf *err)
{
    int rc = 0;
    CUdeviceptr ptr = 0;
    CU_TRY(DRV(cuMemAddressReserve)(&ptr, a->size, 0, 0, 0), a->device);
    CU_TRY(DRV(cuMemMap)(ptr, a->size, 0, h, 0), a->device);
    CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = (int)dev},
                           .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CU_TRY(DRV(cuMemSetAccess)(ptr, a->size, &acc, 1), a->device);
    a->ptr = ptr;
    a->handle = h;
    return 0;
fail:
    if (ptr) {
        DRV(cuMemUnmap)(ptr, a->size);
        DRV(cuMemAddressFree)(ptr, a->size);
    }
    return rc;
}

/* Map handle h into a new handle a: *out = a, or a and h released on failure. */
static int adopt(vmm_alloc *a, CUdevice dev, CUmemGenericAllocationHandle h, vmm_alloc **out, errbuf *err)
{
    int rc = map_handle(a, dev, h, err);
    if (rc) {
        DRV(cuMemRelease)(h);
        free(a);
        return rc;
    }
    *out = a;
    return 0;
}

int vmm_alloc_create(int device, size_t bytes, vmm_alloc **out, errbuf *err)
{
    *out = NULL;
    vmm_alloc *a = xcalloc(1, sizeof *a);
    a->device = device;
    CUdevice dev;
    CUmemGenericAllocationHandle h;
    int rc = context_for(device, &dev, err);
    if (rc) goto fail;
    CUmemAllocationProp prop;
    prop_for(&prop, dev);
    size_t gran = 0;
    CU_TRY(DRV(cuMemGetAllocationGranularity)(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), device);
    a->size = (bytes + gran - 1) / gran * gran;
    CU_TRY(DRV(cuMemCreate)(&h, a->size, &prop, 0), device);
    return adopt(a, dev, h, out, err);
fail:
    free(a);
    return rc;
}

int vmm_alloc_export_fd(const vmm_alloc *a, int *fd, errbuf *err)
{
    int rc = 0;
    CU_TRY(DRV(cuMemExportToShareableHandle)(fd, a->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), a->device);
    return 0;
fail:
    return rc;
}

int vmm_alloc_attach(int device, int fd, size_t bytes, vmm_alloc **out, errbuf *err)
{
    *out = NULL;
    vmm_alloc *a = xcalloc(1, sizeof *a);
    a->device = device;
    a->size = bytes;
    CUdevice dev;
    CUmemGenericAllocationHandle h;
    int rc = context_for(device, &dev, err);
    if (rc) goto fail;
    CU_TRY(DRV(cuMemImportFromShareableHandle)(&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), device);
    return adopt(a, dev, h, out, err);
fail:
    free(a);
    return rc;
}

void vmm_alloc_destroy(vmm_alloc **a)
{
    if (!*a) return;
    if ((*a)->ptr) {
        DRV(cuMemUnmap)((CUdeviceptr)(*a)->ptr, (*a)->size);
        DRV(cuMemAddressFree)((CUdeviceptr)(*a)->ptr, (*a)->size);
        DRV(cuMemRelease)((CUmemGenericAllocationHandle)(*a)->handle);
    }
    XFREE(*a);
}

int vmm_device_uuid(int device, uint8_t uuid[16], errbuf *err)
{
    int rc = 0;
    CUdevice dev;
    CUuuid u;
    CU_TRY(DRV(cuInit)(0), device);
    CU_TRY(DRV(cuDeviceGet)(&dev, device), device);
    CU_TRY(DRV(cuDeviceGetUuid)(&u, dev), device);
    memcpy(uuid, u.bytes, 16);
    return 0;
fail:
    return rc;
}

int vmm_device_by_uuid(const uint8_t uuid[16], int *device, errbuf *err)
{
    int rc = 0, n = 0;
    CU_TRY(DRV(cuInit)(0), -1);
    CU_TRY(DRV(cuDeviceGetCount)(&n), -1);
    for (int i = 0; i < n; i++) {
        uint8_t u[16];
        if ((rc = vmm_device_uuid(i, u, err))) return rc;
        if (!memcmp(u, uuid, 16)) {
            *device = i;
            return 0;
        }
    }
    return errbuf_set(err, ENODEV, "no visible GPU has UUID %02x%02x%02x%02x-...", uuid[0], uuid[1], uuid[2],
                      uuid[3]);
fail:
    return rc;
}

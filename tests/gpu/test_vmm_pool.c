/* GPU machine test of the hidden-state pool memory: a VMM allocation exported as a POSIX fd and held by a process
 * that never touches CUDA (the dflashd role) survives the SIGKILL of its exporter, and a new process imports it and
 * reads it intact; a restarted exporter re-imports its own pool and keeps writing; GPUs are found by UUID. */
#include <cuda_runtime_api.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fdpass.h"
#include "vmm_pool_cuda.h"

#define BYTES (64u << 20)
static int failed;

static void report(const char *name, int ok, const char *why)
{
    printf("%s %s%s%s\n", ok ? "ok" : "FAIL", name, ok ? "" : ": ", ok ? "" : why);
    failed |= !ok;
}

/* Fill (or check) the whole allocation with a pattern derived from `seed` through the runtime API. */
static int pattern(const vmm_alloc *a, unsigned seed, int check)
{
    size_t n = a->size / 4;
    unsigned *h = malloc(a->size);
    int ok = 1;
    if (check) {
        ok = cudaMemcpy(h, (void *)(uintptr_t)a->ptr, a->size, cudaMemcpyDeviceToHost) == cudaSuccess;
        for (size_t i = 0; ok && i < n; i++) ok = h[i] == seed * 2654435761u + (unsigned)i;
    } else {
        for (size_t i = 0; i < n; i++) h[i] = seed * 2654435761u + (unsigned)i;
        ok = cudaMemcpy((void *)(uintptr_t)a->ptr, h, a->size, cudaMemcpyHostToDevice) == cudaSuccess &&
             cudaDeviceSynchronize() == cudaSuccess;
    }
    free(h);
    return ok;
}

int main(void)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) return 1;
    /* 1. exporter: allocate, fill, export, send the fd to us (the keeper), then wait to be killed */
    pid_t exporter = fork();
    if (exporter == 0) {
        errbuf err = {{0}};
        vmm_alloc *a = NULL;
        int fd;
        if (vmm_alloc_create(0, BYTES, &a, &err) || !pattern(a, 7, 0) || vmm_alloc_export_fd(a, &fd, &err)) {
            fprintf(stderr, "exporter: %s\n", err.msg);
            _exit(1);
        }
        size_t size = a->size;
        fdpass_send(sv[1], &fd, 1, &size, sizeof size);
        pause();
        _exit(0);
    }
    int fd = -1, nfds = 0;
    size_t size = 0;
    fdpass_recv(sv[0], &fd, 1, &nfds, &size, sizeof size);
    report("vmm_export_fd_received", nfds == 1 && fd >= 0 && size >= BYTES, "no fd from the exporter");
    kill(exporter, SIGKILL);
    waitpid(exporter, NULL, 0);
    /* 2. after the exporter's death, a new process imports the fd held by us and finds the data intact; it then
     *    writes a new pattern, like a restarted target re-importing its own pool */
    for (int round = 0; round < 2; round++) {
        pid_t importer = fork();
        if (importer == 0) {
            errbuf err = {{0}};
            vmm_alloc *a = NULL;
            if (vmm_alloc_attach(0, fd, size, &a, &err)) {
                fprintf(stderr, "importer: %s\n", err.msg);
                _exit(2);
            }
            if (!pattern(a, 7 + (unsigned)round, 1)) _exit(3);
            if (!pattern(a, 8 + (unsigned)round, 0)) _exit(4);
            vmm_alloc_destroy(&a);
            if (a) _exit(5);
            _exit(0);
        }
        int st = 0;
        waitpid(importer, &st, 0);
        char name[64];
        snprintf(name, sizeof name, "vmm_survives_exporter_kill_round_%d", round);
        report(name, WIFEXITED(st) && WEXITSTATUS(st) == 0, "import failed or data differs");
    }
    /* 3. UUIDs: the ordinal found by UUID is the one the UUID came from */
    pid_t u = fork();
    if (u == 0) {
        errbuf err = {{0}};
        uint8_t uuid[16];
        int dev = -1;
        _exit(vmm_device_uuid(0, uuid, &err) || vmm_device_by_uuid(uuid, &dev, &err) || dev != 0);
    }
    int st = 0;
    waitpid(u, &st, 0);
    report("vmm_device_by_uuid", WIFEXITED(st) && WEXITSTATUS(st) == 0, "UUID lookup failed");
    close(fd);
    return failed;
}

/* The CUDA side of the kernel case table (tests/kernel_cases.h), on the GPU machine: every row whose op has a CUDA
 * check runs it (the kernels/<name>.cu launcher on device copies against the CPU reference; its lines "ok ..." /
 * "FAIL ..."), then runs it again on the same inputs with its lines hidden: every device download of the second run
 * must be bitwise identical to the first run's ("ok <row>: twice bitwise-identical ..."). Then the timings (printed,
 * not compared). Exit status 0 only when every line passed.
 *   test_kernel_cases_gpu [--no-timings] [SUBSTRING...]   only the rows whose name contains one of the SUBSTRINGs
 *                                                         (the timings only when no SUBSTRING is given) */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "tests/kernel_cases.h"

int main(int argc, char **argv)
{
    const char *filters[64];
    int nfilters = 0, timings = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: test_kernel_cases_gpu [--no-timings] [SUBSTRING...]\nRuns the CUDA check of every row of the "
                   "kernel case table (tests/kernel_cases.c) whose name contains one of the SUBSTRINGs (all rows when "
                   "none is given), twice (the second run's device downloads must be bitwise identical to the "
                   "first's), then the timings (when no SUBSTRING is given).\n");
            return 0;
        }
        if (!strcmp(argv[i], "--no-timings")) timings = 0;
        else if (nfilters < 64) filters[nfilters++] = argv[i];
    }
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("FAIL test_kernel_cases_gpu: no CUDA device (%s)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 1;
    }
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaStreamCreate(&stream));
    int total_fail = 0, rows = 0;
    for (int i = 0; i < kernel_ncases; i++) {
        const kc_case *c = &kernel_cases[i];
        if (!c->op->cuda || c->only == KC_CPU_ONLY) continue;
        char name[1024];
        kc_case_name(c, name, sizeof name);
        int match = nfilters == 0;
        for (int f = 0; f < nfilters; f++) match |= strstr(name, filters[f]) != NULL;
        if (!match) continue;
        rows++;
        printf("== %s%s%s\n", name, c->why ? ": " : "", c->why ? c->why : "");
        fflush(stdout);
        /* run 0: reported, its downloads kept */
        failures = 0;
        rng_state = kc_case_seed(c);
        kc_record_begin(0);
        c->op->cuda(c);
        CHECK_CUDA(cudaDeviceSynchronize());
        total_fail += failures;
        /* run 1: the same inputs, lines hidden, downloads compared */
        fflush(stdout);
        int saved = dup(1), devnull = open("/dev/null", O_WRONLY);
        if (saved < 0 || devnull < 0 || dup2(devnull, 1) < 0) {
            perror("hiding the second run's lines");
            return 1;
        }
        rng_state = kc_case_seed(c);
        kc_record_begin(1);
        c->op->cuda(c);
        CHECK_CUDA(cudaDeviceSynchronize());
        fflush(stdout);
        dup2(saved, 1);
        close(saved), close(devnull);
        int n = 0;
        size_t bytes = 0, diff = kc_record_end(&n, &bytes);
        int ok = diff == 0 && n > 0;
        printf("%s %s: twice bitwise-identical (%d device downloads, %zu bytes; %zu differ)%s\n", ok ? "ok" : "FAIL",
               name, n, bytes, diff, n ? "" : " (the check downloaded nothing)");
        fflush(stdout);
        total_fail += !ok;
    }
    if (rows == 0) {
        printf("FAIL test_kernel_cases_gpu: no row matches the %d substring(s) given\n", nfilters);
        return 1;
    }
    if (timings && nfilters == 0)
        for (int i = 0; i < kernel_ntimings; i++) {
            printf("== timing %s\n", kernel_timings[i].name);
            fflush(stdout);
            failures = 0;
            kernel_timings[i].fn();
            total_fail += failures;
        }
    CHECK_CUDA(cudaStreamDestroy(stream));
    printf("test_kernel_cases_gpu: %d rows, %d failed line(s)\n", rows, total_fail);
    return total_fail ? 1 : 0;
}

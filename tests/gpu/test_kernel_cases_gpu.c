/* The CUDA side of the kernel case table (tests/kernel_cases.h), on the GPU machine: every row whose op has a CUDA
 * check runs it (the kernels/<name>.cu launcher on device copies against the CPU reference; its lines "ok ..." /
 * "FAIL ..."), then runs it again on the same inputs with its lines hidden: every device download of the second run
 * must be bitwise identical to the first run's ("ok <row>: twice bitwise-identical ..."). Then the timings (printed,
 * not compared). The rows run in a child process (the parent never touches the GPU): a row whose check dies (a CUDA
 * error exits, a fault kills) fails alone ("FAIL <row>: the check died ..."), and a fresh child, with a fresh CUDA
 * context, goes on with the next row. A row (or a timing) that has not ended after --row-timeout seconds (default
 * 240) hangs: the parent kills the child ("FAIL <row>: the check died (hung: no end after S s, killed) ..."; its lines
 * so far are kept: the child's output is line-buffered) and goes on the same way. A row whose kernel does not run on
 * this device (kc_skip) says so once ("skip <row>: <why>") and counts as skipped, neither passed nor failed. Exit
 * status 0 only when every line passed.
 *   test_kernel_cases_gpu [--no-timings] [--timing NAME] [--timings-only] [--list] [--row-timeout S] [SUBSTRING...]
 *                         only the rows whose name contains one of the SUBSTRINGs (the timings only when none is
 *                         given, or the timings whose name contains NAME); --timings-only: no row, the timings (those
 *                         of --timing NAME, none matching fails); --list: print those rows, touch no GPU */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "tests/kernel_cases.h"

/* What the child tells the parent, one record each: a row started, a row (or a timing) ended with so many failed
 * lines, the child is done. */
typedef struct msg {
    char kind; /* 'S' row started (value: its index in rows[]), 'T' timing started (value: its index), 'R' ended
                * (value: failed lines), 'K' the row was skipped, 'E' all done */
    int value;
} msg;

static void say(int fd, char kind, int value)
{
    msg m = {kind, value};
    if (write(fd, &m, sizeof m) != (ssize_t)sizeof m) {
        perror("test_kernel_cases_gpu: the pipe to the parent");
        _exit(2);
    }
}

/* One row, twice (once when its check skips it: *skipped set); returns its failed lines. */
static int run_row(const kc_case *c, const char *name, int *skipped)
{
    printf("== %s%s%s\n", name, c->why ? ": " : "", c->why ? c->why : "");
    fflush(stdout);
    /* run 0: reported, its downloads kept */
    failures = 0;
    rng_state = kc_case_seed(c);
    kc_record_begin(0);
    c->op->cuda(c);
    CHECK_CUDA(cudaDeviceSynchronize());
    int failed = failures;
    *skipped = 0;
    if (kc_skipped()) {
        int n = 0;
        size_t bytes = 0;
        kc_record_end(&n, &bytes);
        printf("skip %s: %s\n", name, kc_skipped());
        fflush(stdout);
        *skipped = 1;
        return failed;
    }
    /* run 1: the same inputs, lines hidden, downloads compared */
    fflush(stdout);
    int saved = dup(1), devnull = open("/dev/null", O_WRONLY);
    if (saved < 0 || devnull < 0 || dup2(devnull, 1) < 0) {
        perror("hiding the second run's lines");
        exit(1);
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
    printf("%s %s: twice bitwise-identical (%d device downloads, %zu bytes; %zu differ)%s\n", ok ? "ok" : "FAIL", name,
           n, bytes, diff, n ? "" : " (the check downloaded nothing)");
    fflush(stdout);
    return failed + !ok;
}

/* Whether timing i runs: every one without --timing NAME, else those whose name contains NAME. */
static int timing_selected(int i, const char *timing)
{
    return !timing || strstr(kernel_timings[i].name, timing) != NULL;
}

/* The child's device and stream, made before its first row or timing (a child the fault hook stops first needs none);
 * without a device the child exits kNoDevice and the parent stops there */
enum { kNoDevice = 3 };
static int child_device_ready = 0;
static void child_device(void)
{
    if (child_device_ready) return;
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("FAIL test_kernel_cases_gpu: no CUDA device (%s)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        fflush(stdout);
        _exit(kNoDevice);
    }
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaStreamCreate(&stream));
    child_device_ready = 1;
}

/* Test-only fault hook: with DFLASH_KC_FAULT_HANG=<substring>, the child hangs for real (it blocks, makes no progress)
 * at the first row whose name contains it, once it has told the parent the row started: the parent's watchdog must
 * kill it and go on (tests/system/kernel_cases_gpu_args.sh, without a GPU). */
static void fault_hang(const char *name)
{
    const char *h = getenv("DFLASH_KC_FAULT_HANG");
    if (!h || !*h || !strstr(name, h)) return;
    printf("fault hook DFLASH_KC_FAULT_HANG=%s: the row %s hangs\n", h, name);
    for (;;) pause();
}

/* The child: rows[from..nrows) then, when asked, the timings; tells the parent each row it starts. */
static void child(int fd, const int *rows, int nrows, int from, int timings, const char *timing)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* a hung child's lines so far reach the log before it is killed */
    for (int i = from; i < nrows; i++) {
        const kc_case *c = &kernel_cases[rows[i]];
        char name[1024];
        kc_case_name(c, name, sizeof name);
        say(fd, 'S', i);
        fault_hang(name);
        child_device();
        int skipped = 0, failed = run_row(c, name, &skipped);
        if (skipped) say(fd, 'K', 0);
        say(fd, 'R', failed);
    }
    say(fd, 'S', nrows); /* past the rows: a death now is the timings' */
    if (timings) child_device();
    if (timings)
        for (int i = 0; i < kernel_ntimings; i++) {
            if (!timing_selected(i, timing)) continue;
            printf("== timing %s\n", kernel_timings[i].name);
            fflush(stdout);
            say(fd, 'T', i);
            failures = 0;
            kernel_timings[i].fn();
            fflush(stdout);
            say(fd, 'R', failures);
        }
    if (child_device_ready) CHECK_CUDA(cudaStreamDestroy(stream));
    fflush(stdout);
    say(fd, 'E', 0);
    _exit(0);
}

int main(int argc, char **argv)
{
    const char *filters[64];
    int nfilters = 0, timings = 1, list = 0, timings_only = 0, row_timeout = 240;
    const char *timing = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: test_kernel_cases_gpu [--no-timings] [--timing NAME] [--timings-only] [--list] [--row-timeout S] "
                   "[SUBSTRING...]\n"
                   "Runs the CUDA check of every row of the kernel case table (tests/kernel_cases.c) whose name contains "
                   "one of the SUBSTRINGs (all rows when none is given), twice (the second run's device downloads must "
                   "be bitwise identical to the first's), then the timings (when no SUBSTRING is given; --timing NAME: "
                   "only those whose name contains NAME, with or without SUBSTRINGs). --timings-only runs no row, only "
                   "the timings (with --timing NAME, those; a NAME no timing has fails). A row whose check dies fails "
                   "alone; a row or timing that has not ended after --row-timeout S seconds (default 240) hangs: it is "
                   "killed and fails alone. A row whose kernel does not run on this device is skipped, saying so. "
                   "--list prints the rows "
                   "that would run (and why each is there), or with --timings-only the timings, without touching the "
                   "GPU.\n");
            return 0;
        }
        if (!strcmp(argv[i], "--no-timings")) timings = 0;
        else if (!strcmp(argv[i], "--timing") && i + 1 < argc) timing = argv[++i];
        else if (!strcmp(argv[i], "--timings-only")) timings_only = 1;
        else if (!strcmp(argv[i], "--list")) list = 1;
        else if (!strcmp(argv[i], "--row-timeout")) {
            char *end = NULL;
            const long v = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
            if (i + 1 >= argc || !end || *end || end == argv[i + 1] || v < 1 || v > 86400) {
                fprintf(stderr, "test_kernel_cases_gpu: --row-timeout wants seconds, 1 to 86400 (got %s)\n",
                        i + 1 < argc ? argv[i + 1] : "nothing");
                return 2;
            }
            row_timeout = (int)v, i++;
        }
        else if (argv[i][0] == '-') {
            fprintf(stderr, "test_kernel_cases_gpu: unknown option %s (--help lists them)\n", argv[i]);
            return 2;
        } else if (nfilters < 64) filters[nfilters++] = argv[i];
        else {
            fprintf(stderr, "test_kernel_cases_gpu: more than 64 substrings (at %s)\n", argv[i]);
            return 2;
        }
    }
    if (timings_only) {
        if (nfilters || !timings) {
            fprintf(stderr, "test_kernel_cases_gpu: --timings-only takes no row SUBSTRING nor --no-timings\n");
            return 2;
        }
        int ntimed = 0;
        for (int i = 0; i < kernel_ntimings; i++)
            if (timing_selected(i, timing)) {
                if (list) printf("%s\n", kernel_timings[i].name);
                ntimed++;
            }
        if (ntimed == 0) {
            printf("FAIL test_kernel_cases_gpu: no timing's name contains \"%s\"\n", timing ? timing : "");
            return 1;
        }
        if (list) {
            printf("test_kernel_cases_gpu: %d timings\n", ntimed);
            return 0;
        }
    }
    int *rows = malloc(sizeof(int) * (size_t)kernel_ncases), nrows = 0;
    if (!rows) return 1;
    for (int i = 0; i < kernel_ncases && !timings_only; i++) {
        const kc_case *c = &kernel_cases[i];
        if (!c->op->cuda || c->only == KC_CPU_ONLY) continue;
        char name[1024];
        kc_case_name(c, name, sizeof name);
        int match = nfilters == 0;
        for (int f = 0; f < nfilters; f++) match |= strstr(name, filters[f]) != NULL;
        if (match) rows[nrows++] = i;
    }
    if (nrows == 0 && !timings_only) {
        printf("FAIL test_kernel_cases_gpu: no row matches the %d substring(s) given\n", nfilters);
        return 1;
    }
    if (list) {
        for (int i = 0; i < nrows; i++) {
            const kc_case *c = &kernel_cases[rows[i]];
            char name[1024];
            printf("%s%s%s\n", kc_case_name(c, name, sizeof name), c->why ? ": " : "", c->why ? c->why : "");
        }
        printf("test_kernel_cases_gpu: %d rows\n", nrows);
        free(rows);
        return 0;
    }
    if (nfilters && !timing) timings = 0;
    int total_fail = 0, from = 0, died = 0, nskipped = 0;
    for (;;) {
        int p[2];
        if (pipe(p) < 0) {
            perror("pipe");
            return 1;
        }
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid == 0) {
            close(p[0]);
            child(p[1], rows, nrows, from, timings, timing);
        }
        close(p[1]);
        msg m;
        int last = -1, done = 0, hung = 0, timing_at = -1;
        for (;;) { /* each message within row_timeout of the last: a row or timing that takes longer hangs */
            struct pollfd pf = {p[0], POLLIN, 0};
            const int r = poll(&pf, 1, row_timeout * 1000);
            if (r < 0 && errno == EINTR) continue;
            if (r == 0) {
                kill(pid, SIGKILL);
                hung = 1;
                break;
            }
            if (r < 0 || read(p[0], &m, sizeof m) != (ssize_t)sizeof m) break;
            if (m.kind == 'S') last = m.value;
            else if (m.kind == 'T') timing_at = m.value;
            else if (m.kind == 'R') total_fail += m.value;
            else if (m.kind == 'K') nskipped++;
            else if (m.kind == 'E') done = 1;
        }
        close(p[0]);
        int st = 0;
        waitpid(pid, &st, 0);
        if (done && WIFEXITED(st) && WEXITSTATUS(st) == 0) break;
        char why[96];
        if (hung) snprintf(why, sizeof why, "hung: no end after %d s, killed", row_timeout);
        else if (WIFSIGNALED(st)) snprintf(why, sizeof why, "killed by signal %d", WTERMSIG(st));
        else snprintf(why, sizeof why, "exit status %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        total_fail++, died++;
        if (last < 0 || (!hung && WIFEXITED(st) && WEXITSTATUS(st) == kNoDevice)) { /* no device: nothing to go on with */
            printf("FAIL test_kernel_cases_gpu: the GPU process died before its first row (%s)\n", why);
            break;
        }
        if (last >= nrows) {
            printf("FAIL test_kernel_cases_gpu: the timings died (%s)%s%s\n", why, timing_at >= 0 ? " in " : "",
                   timing_at >= 0 ? kernel_timings[timing_at].name : "");
            break;
        }
        char name[1024];
        kc_case_name(&kernel_cases[rows[last]], name, sizeof name);
        printf("FAIL %s: the check died (%s); the rows after it go on in a fresh process\n", name, why);
        from = last + 1; /* past the last row: the fresh process runs the timings only */
        if (from >= nrows && !timings) break;
    }
    printf("test_kernel_cases_gpu: %d rows (%d skipped on this device), %d failed line(s)%s\n", nrows, nskipped,
           total_fail, died ? " (counting the checks that died)" : "");
    free(rows);
    return total_fail ? 1 : 0;
}

/* The CPU side of the kernel case table (tests/kernel_cases.h): every row whose op has a CPU check, the kernels/<name>.c
 * reference against its naive double reference or finite differences, each row in a forked child (a crash fails
 * that row only). Prints "ok <row>" / "FAIL <row>" (the failed expectations on stderr above it).
 *   test_kernel_cases [SUBSTRING...]   only the rows whose name contains one of the SUBSTRINGs */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/kernel_cases.h"

extern int test_failed_here;

int main(int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: test_kernel_cases [SUBSTRING...]\nRuns the CPU check of every row of the kernel case table "
               "(tests/kernel_cases.c) whose name contains one of the SUBSTRINGs (all rows when none is given).\n");
        return 0;
    }
    int failed = 0, ran = 0;
    for (int i = 0; i < kernel_ncases; i++) {
        const kc_case *c = &kernel_cases[i];
        if (!c->op->cpu || c->only == KC_CUDA_ONLY) continue;
        char name[1024];
        kc_case_name(c, name, sizeof name);
        int match = argc < 2;
        for (int f = 1; f < argc; f++) match |= strstr(name, argv[f]) != NULL;
        if (!match) continue;
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid == 0) {
            rng_state = kc_case_seed(c);
            test_failed_here = 0;
            c->op->cpu(c);
            fflush(stdout);
            _exit(test_failed_here ? 1 : 0);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        ran++;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
            printf("ok %s\n", name);
        } else {
            failed++;
            if (WIFSIGNALED(st)) printf("FAIL %s: killed by signal %d\n", name, WTERMSIG(st));
            else printf("FAIL %s\n", name);
        }
    }
    if (ran == 0) {
        printf("FAIL test_kernel_cases: no row matches the %d substring(s) given\n", argc - 1);
        return 1;
    }
    return failed ? 1 : 0;
}

/* test: a minimal harness for unit tests. TEST(name) registers a case; main() (from TEST_MAIN) runs them all in
 * order, each in a forked child so a crash fails one case only, and prints "ok <name>" or "FAIL <name>: why".
 * tests/run.sh counts those lines. EXPECT* record a failure and continue; REQUIRE* end the case. */
#ifndef DFLASH_TEST_H
#define DFLASH_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef void (*test_fn)(void);
struct test_case { const char *name; test_fn fn; };
extern struct test_case test_cases[256];
extern int test_count;
extern int test_failed_here;

#define TEST(name)                                                                  \
    static void test_##name(void);                                                  \
    __attribute__((constructor)) static void test_register_##name(void)             \
    { test_cases[test_count++] = (struct test_case){#name, test_##name}; }          \
    static void test_##name(void)

#define EXPECT(cond)                                                                \
    do { if (!(cond)) { fprintf(stderr, "  %s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
                        test_failed_here = 1; } } while (0)
#define REQUIRE(cond)                                                               \
    do { if (!(cond)) { fprintf(stderr, "  %s:%d: required %s\n", __FILE__, __LINE__, #cond); \
                        exit(1); } } while (0)
#define EXPECT_NEAR(a, b, tol)                                                      \
    do { double a_ = (a), b_ = (b);                                                 \
         if (!(fabs(a_ - b_) <= (tol))) { fprintf(stderr, "  %s:%d: %s=%g vs %s=%g (tol %g)\n", __FILE__, \
              __LINE__, #a, a_, #b, b_, (double)(tol)); test_failed_here = 1; } } while (0)
/* The golden cases' folder: $DFLASH_GOLDENS, else the repository's tests/goldens; test_golden(rel) is rel inside it
 * (four results may be held at once). */
static inline const char *test_goldens(void)
{
    const char *g = getenv("DFLASH_GOLDENS");
    return g && *g ? g : "tests/goldens";
}
static inline const char *test_golden(const char *rel)
{
    static char path[4][512];
    static int k;
    char *p = path[k++ % 4];
    snprintf(p, sizeof path[0], "%s/%s", test_goldens(), rel);
    return p;
}

/* Expect a string to contain a substring (for error messages that must name a file or field). */
#define EXPECT_CONTAINS(hay, needle)                                                \
    do { const char *h_ = (hay), *n_ = (needle);                                    \
         if (!h_ || !strstr(h_, n_)) { fprintf(stderr, "  %s:%d: \"%s\" does not contain \"%s\"\n", \
              __FILE__, __LINE__, h_ ? h_ : "(null)", n_); test_failed_here = 1; } } while (0)

#define TEST_MAIN                                                                   \
    struct test_case test_cases[256];                                               \
    int test_count;                                                                 \
    int test_failed_here;                                                           \
    int main(int argc, char **argv)                                                 \
    {                                                                               \
        int failed = 0;                                                             \
        for (int i = 0; i < test_count; i++) {                                      \
            if (argc > 1 && !strstr(test_cases[i].name, argv[1])) continue;         \
            fflush(stdout);                                                         \
            pid_t pid = fork();                                                     \
            if (pid == 0) { test_cases[i].fn(); exit(test_failed_here ? 1 : 0); }   \
            int st = 0;                                                             \
            waitpid(pid, &st, 0);                                                   \
            if (WIFEXITED(st) && WEXITSTATUS(st) == 0) printf("ok %s\n", test_cases[i].name); \
            else { failed++; if (WIFSIGNALED(st)) printf("FAIL %s: killed by signal %d\n", \
                       test_cases[i].name, WTERMSIG(st)); else printf("FAIL %s\n", test_cases[i].name); } \
        }                                                                           \
        return failed ? 1 : 0;                                                      \
    }

/* A fresh temporary directory for one test (removed by the caller with test_rmtree). */
static inline char *test_tmpdir(void)
{
    static char path[256];
    snprintf(path, sizeof path, "/tmp/dflash-test-XXXXXX");
    if (!mkdtemp(path)) { perror("mkdtemp"); exit(1); }
    return path;
}

static inline void test_write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n) { perror(path); exit(1); }
    fclose(f);
}

#endif

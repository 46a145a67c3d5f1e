/* keeper_probe: speaks keeper_proto to a real dflashd of a job.backend = cuda job, as target-0 would, to check how
 * dflashd keeps a target's device weights (tests/system/keep_weights.sh): nothing is passed before a deposit; a
 * deposit is passed back to the next registration after the pool fd; a deposit naming no GPU or coming from an
 * earlier instance is refused; a later deposit replaces the earlier one. dflashd touches no GPU, so a memfd with a
 * pattern stands in for the VMM allocation. Prints ok/FAIL lines; exit 1 on a failure.
 * usage: keeper_probe -c JOB.ini */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "job_plan.h"
#include "keeper_proto.h"

static int failed;

static void check(int cond, const char *name, const char *why)
{
    if (cond) printf("ok %s\n", name);
    else printf("FAIL %s: %s\n", name, why), failed = 1;
}

/* A memfd of 4096 bytes filled with b. */
static int pattern_fd(unsigned char b)
{
    int fd = memfd_create("keeper-probe", MFD_CLOEXEC);
    unsigned char buf[4096];
    memset(buf, b, sizeof buf);
    if (fd < 0 || write(fd, buf, sizeof buf) != (ssize_t)sizeof buf) return -1;
    return fd;
}

static int first_byte(int fd)
{
    unsigned char b = 0;
    return pread(fd, &b, 1, 2000) == 1 ? b : -1;
}

/* Register as target-0: the epoch, and the weights fd passed (-1: none) after npools pool fds. */
static int reg(const job_plan *p, keeper_reply *rp, int *weights_fd, errbuf *err)
{
    int fds[KEEPER_MAX_FDS];
    int rc = keeper_register(p->keeper_socket, JOB_ROLE_TARGET, 0, rp, fds, KEEPER_MAX_FDS, 30.0, err);
    if (rc) return rc;
    *weights_fd = rp->nweights ? fds[rp->npools] : -1;
    for (uint32_t i = 0; i < rp->npools; i++) close(fds[i]);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3 || strcmp(argv[1], "-c")) {
        fprintf(stderr, "usage: keeper_probe -c JOB.ini\n");
        return 2;
    }
    job_plan p;
    errbuf err = {{0}};
    if (job_plan_load(&p, argv[2], NULL, 0, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 2;
    }
    const uint8_t gpu[16] = {0xab, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, none[16] = {0};
    keeper_reply rp;
    int wfd = -1, rc;
    char why[600];

    rc = reg(&p, &rp, &wfd, &err);
    check(!rc && wfd < 0, "keep_first_registration_gets_no_weights", rc ? err.msg : "a weights fd was passed");
    uint64_t epoch1 = rp.epoch;

    int a = pattern_fd('A');
    rc = keeper_deposit_memory(p.keeper_socket, KEEPER_DEPOSIT_WEIGHTS, 0, epoch1, a, gpu, 4096, 10.0, &err);
    check(!rc, "keep_deposit_accepted", err.msg);
    rc = keeper_deposit_memory(p.keeper_socket, KEEPER_DEPOSIT_WEIGHTS, 0, epoch1, a, none, 4096, 10.0, &err);
    snprintf(why, sizeof why, "rc %d: %s", rc, err.msg);
    check(rc == -EINVAL && strstr(err.msg, "no GPU named"), "keep_deposit_without_gpu_refused", why);

    rc = reg(&p, &rp, &wfd, &err); /* the next instance */
    snprintf(why, sizeof why, "rc %d, weights fd %d, byte %d", rc, wfd, wfd >= 0 ? first_byte(wfd) : -1);
    check(!rc && wfd >= 0 && first_byte(wfd) == 'A', "keep_next_instance_gets_the_weights", why);
    if (wfd >= 0) close(wfd);
    uint64_t epoch2 = rp.epoch;

    int b = pattern_fd('B');
    rc = keeper_deposit_memory(p.keeper_socket, KEEPER_DEPOSIT_WEIGHTS, 0, epoch1, b, gpu, 4096, 10.0, &err);
    snprintf(why, sizeof why, "rc %d: %s", rc, err.msg);
    check(rc == -ESTALE, "keep_deposit_of_an_earlier_instance_refused", why);
    rc = keeper_deposit_memory(p.keeper_socket, KEEPER_DEPOSIT_WEIGHTS, 0, epoch2, b, gpu, 4096, 10.0, &err);
    check(!rc, "keep_second_deposit_accepted", err.msg);

    rc = reg(&p, &rp, &wfd, &err);
    snprintf(why, sizeof why, "rc %d, weights fd %d, byte %d", rc, wfd, wfd >= 0 ? first_byte(wfd) : -1);
    check(!rc && wfd >= 0 && first_byte(wfd) == 'B', "keep_later_deposit_replaces", why);
    if (wfd >= 0) close(wfd);
    close(a), close(b);
    return failed;
}

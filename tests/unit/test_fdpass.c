/* fdpass: fds and a payload across processes over SOCK_SEQPACKET and SOCK_STREAM; excess and truncated fds are
 * closed, never leaked; errors are -errno. */
#include "fdpass.h"
#include "keeper_proto.h"
#include "tests/test.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>

static int open_fd_count(void)
{
    DIR *d = opendir("/proc/self/fd");
    REQUIRE(d);
    int n = 0;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

/* Three distinct files: a temp file, /dev/null, a memfd. */
static void open_three(int fds[3])
{
    char path[] = "/tmp/dflash-fdpass-XXXXXX";
    fds[0] = mkstemp(path);
    REQUIRE(fds[0] >= 0);
    unlink(path);
    fds[1] = open("/dev/null", O_RDONLY);
    fds[2] = memfd_create("fdpass-test", 0);
    REQUIRE(fds[1] >= 0 && fds[2] >= 0);
}

static int same_file(int a, int b)
{
    struct stat sa, sb;
    if (fstat(a, &sa) || fstat(b, &sb)) return 0;
    return sa.st_ino == sb.st_ino && sa.st_dev == sb.st_dev;
}

/* A child sends three fds with a payload; the parent receives them and checks they are the same files. */
static void roundtrip(int type)
{
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, type, 0, sv) == 0);
    int fds[3];
    open_three(fds);
    const char payload[] = "pool target-3 epoch 42";
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        ssize_t n = fdpass_send(sv[1], fds, 3, payload, sizeof payload);
        _exit(n == (ssize_t)sizeof payload ? 0 : 1);
    }
    close(sv[1]);
    int got[FDPASS_MAX_FDS], ngot = -1;
    char buf[128] = { 0 };
    ssize_t n = fdpass_recv(sv[0], got, FDPASS_MAX_FDS, &ngot, buf, sizeof buf);
    EXPECT(n == (ssize_t)sizeof payload);
    EXPECT(memcmp(buf, payload, sizeof payload) == 0);
    REQUIRE(ngot == 3);
    for (int k = 0; k < 3; k++) {
        EXPECT(same_file(got[k], fds[k]));
        EXPECT(got[k] != fds[k]);
        EXPECT(fcntl(got[k], F_GETFD) & FD_CLOEXEC);
    }
    EXPECT(!same_file(got[0], fds[1]));
    /* Writes through the received memfd are seen through the original. */
    REQUIRE(write(got[2], "abc", 3) == 3);
    char back[4] = { 0 };
    EXPECT(pread(fds[2], back, 3, 0) == 3 && strcmp(back, "abc") == 0);
    int st;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* The peer is gone: end of stream. */
    EXPECT(fdpass_recv(sv[0], got, FDPASS_MAX_FDS, &ngot, buf, sizeof buf) == 0);
    EXPECT(ngot == 0);
    for (int k = 0; k < 3; k++) { close(got[k]); close(fds[k]); }
    close(sv[0]);
}

TEST(three_fds_seqpacket) { roundtrip(SOCK_SEQPACKET); }
TEST(three_fds_stream) { roundtrip(SOCK_STREAM); }

TEST(excess_fds_are_closed)
{
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) == 0);
    int fds[3];
    open_three(fds);
    int before = open_fd_count();
    EXPECT(fdpass_send(sv[1], fds, 3, "x", 1) == 1);
    int got[1] = { -1 }, ngot = -1;
    char buf[8];
    EXPECT(fdpass_recv(sv[0], got, 1, &ngot, buf, sizeof buf) == 1);
    EXPECT(ngot == 1 && same_file(got[0], fds[0]));
    close(got[0]);
    EXPECT(open_fd_count() == before);
    /* No fds asked for at all. */
    EXPECT(fdpass_send(sv[1], fds, 2, "y", 1) == 1);
    EXPECT(fdpass_recv(sv[0], got, 0, &ngot, buf, sizeof buf) == 1);
    EXPECT(ngot == 0 && buf[0] == 'y');
    EXPECT(open_fd_count() == before);
    for (int k = 0; k < 3; k++) close(fds[k]);
    close(sv[0]);
    close(sv[1]);
}

TEST(truncated_message_closes_fds)
{
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) == 0);
    int fds[3];
    open_three(fds);
    int before = open_fd_count();
    EXPECT(fdpass_send(sv[1], fds, 3, "0123456789", 10) == 10);
    int got[4], ngot = -1;
    char buf[4];
    EXPECT(fdpass_recv(sv[0], got, 4, &ngot, buf, sizeof buf) == -EMSGSIZE);
    EXPECT(ngot == 0);
    EXPECT(open_fd_count() == before);
    for (int k = 0; k < 3; k++) close(fds[k]);
    close(sv[0]);
    close(sv[1]);
}

TEST(errors_are_negative_errno)
{
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) == 0);
    int fd = 0, ngot;
    char buf[4];
    EXPECT(fdpass_send(sv[1], &fd, 1, buf, 0) == -EINVAL);
    EXPECT(fdpass_send(sv[1], &fd, FDPASS_MAX_FDS + 1, "a", 1) == -EINVAL);
    EXPECT(fdpass_recv(sv[0], &fd, 1, &ngot, buf, 0) == -EINVAL);
    close(sv[0]);
    EXPECT(fdpass_send(sv[1], NULL, 0, "a", 1) == -EPIPE);
    close(sv[1]);
    EXPECT(fdpass_send(sv[1], NULL, 0, "a", 1) == -EBADF);
    EXPECT(fdpass_recv(sv[1], &fd, 1, &ngot, buf, sizeof buf) == -EBADF);
}

/* The most a keeper reply carries (a drafter of a job with JOB_MAX_TARGETS targets: every pool and its training
 * state) goes in one message; one more than FDPASS_MAX_FDS is refused, never half sent. */
TEST(a_full_keeper_reply_fits_one_message)
{
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) == 0);
    int fds[KEEPER_MAX_FDS], got[KEEPER_MAX_FDS], ngot = -1;
    for (int k = 0; k < KEEPER_MAX_FDS; k++) REQUIRE((fds[k] = memfd_create("fdpass-many", MFD_CLOEXEC)) >= 0);
    EXPECT(fdpass_send(sv[1], fds, KEEPER_MAX_FDS, "r", 1) == 1);
    char buf[4];
    EXPECT(fdpass_recv(sv[0], got, KEEPER_MAX_FDS, &ngot, buf, sizeof buf) == 1);
    REQUIRE(ngot == KEEPER_MAX_FDS);
    for (int k = 0; k < KEEPER_MAX_FDS; k++) {
        EXPECT(same_file(got[k], fds[k]));
        close(got[k]);
        close(fds[k]);
    }
    close(sv[0]);
    close(sv[1]);
}

TEST_MAIN

/* slot_pool: a pool created in one process and attached in others through a memfd passed with fdpass; publish and
 * lease by batch id or predicate; reclaim after SIGKILL while FILLING and while LEASED; data that outlives both the
 * writer and the creator; concurrent producers and consumers moving every batch exactly once. */
#include "fdpass.h"
#include "shm.h"
#include "slot_pool.h"
#include "tests/test.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/socket.h>

/* A per-run segment name; up to 8 names can be live at once (rotating static buffers). */
static const char *pool_name(const char *what)
{
    static char names[8][128];
    static int next;
    char *name = names[next++ % 8];
    snprintf(name, 128, "/dflash-test-%d-pool-%s", (int)getpid(), what);
    return name;
}

/* Payload of a batch: bytes_used floats, a function of the batch id. */
static uint64_t payload_bytes(uint64_t id) { return 4096 + (id % 5) * 1000 * sizeof(float); }

static void payload_write(void *data, uint64_t id)
{
    float *f = data;
    for (uint64_t k = 0; k < payload_bytes(id) / sizeof(float); k++) f[k] = (float)(id * 1000003 % 9973) + k;
}

static int payload_ok(const void *data, uint64_t id)
{
    const float *f = data;
    for (uint64_t k = 0; k < payload_bytes(id) / sizeof(float); k++)
        if (f[k] != (float)(id * 1000003 % 9973) + k) return 0;
    return 1;
}

/* Claim, write and publish batch id; 0 on success. */
static int produce(struct slot_pool *p, uint64_t id, uint16_t owner, uint64_t epoch, int timeout_ms)
{
    int i = slot_pool_claim(p, owner, epoch, timeout_ms);
    if (i < 0) return i;
    struct slot_pool_desc *d = slot_pool_desc(p, i);
    payload_write(slot_pool_data(p, i), id);
    d->batch_id = id;
    d->ntok = (uint32_t)(id % 100) + 1;
    d->nseq = 1;
    d->bytes_used = payload_bytes(id);
    return slot_pool_publish(p, i, owner, epoch);
}

static int odd_id(uint64_t id, void *ctx) { return (int)(id & 1); }

/* Send the pool's data fd and its name to a peer. */
static void send_pool(int sock, struct slot_pool *p, const char *name)
{
    int fd = slot_pool_data_fd(p);
    REQUIRE(fdpass_send(sock, &fd, 1, name, strlen(name) + 1) == (ssize_t)strlen(name) + 1);
}

/* Receive a pool's fd and name and attach to it. */
static struct slot_pool *recv_pool(int sock)
{
    int fd = -1, nfd = 0;
    char name[256];
    ssize_t n = fdpass_recv(sock, &fd, 1, &nfd, name, sizeof name);
    if (n <= 0 || nfd != 1) return NULL;
    struct slot_pool *p = NULL;
    errbuf err;
    if (slot_pool_attach(name, fd, &p, &err)) fprintf(stderr, "%s\n", err.msg);
    close(fd);
    return p;
}

static void reap(pid_t pid, int killed)
{
    int st = 0;
    if (killed) REQUIRE(kill(pid, SIGKILL) == 0);
    REQUIRE(waitpid(pid, &st, 0) == pid);
    if (killed) EXPECT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    else EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

TEST(create_attach_validate)
{
    const char *name = pool_name("validate");
    struct slot_pool *p = NULL, *q = NULL;
    errbuf err = { "" };
    REQUIRE(slot_pool_create(name, 3, 5000, &p, &err) == 0);
    EXPECT(slot_pool_nslots(p) == 3);
    EXPECT(slot_pool_slot_bytes(p) == 8192);
    EXPECT(slot_pool_create(name, 3, 5000, &q, &err) == -EEXIST);
    EXPECT_CONTAINS(err.msg, name);
    REQUIRE(slot_pool_attach(name, slot_pool_data_fd(p), &q, &err) == 0);
    /* Two mappings of the same memory. */
    memcpy(slot_pool_data(p, 2), "hidden", 7);
    EXPECT(memcmp(slot_pool_data(q, 2), "hidden", 7) == 0);
    EXPECT(slot_pool_data_fd(q) != slot_pool_data_fd(p));
    slot_pool_destroy(&q);
    EXPECT(q == NULL);
    /* A data fd of the wrong size is refused, naming the pool. */
    int wrong = shm_memfd_create("wrong", 4096, &err);
    REQUIRE(wrong >= 0);
    EXPECT(slot_pool_attach(name, wrong, &q, &err) < 0);
    EXPECT_CONTAINS(err.msg, name);
    close(wrong);
    EXPECT(slot_pool_attach(pool_name("missing"), slot_pool_data_fd(p), &q, &err) == -ENOENT);
    EXPECT_CONTAINS(err.msg, "missing");
    EXPECT(slot_pool_create(pool_name("zero"), 0, 4096, &q, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "nslots 0");
    /* bytes_used beyond the slot cannot be published. */
    int i = slot_pool_claim(p, 1, 1, 0);
    REQUIRE(i >= 0);
    EXPECT(slot_pool_desc(p, i)->producer_epoch == 1);
    slot_pool_desc(p, i)->bytes_used = slot_pool_slot_bytes(p) + 1;
    EXPECT(slot_pool_publish(p, i, 1, 1) == -EINVAL);
    EXPECT(slot_pool_abandon(p, i, 1, 1) == 0);
    slot_pool_destroy(&p);
    EXPECT(slot_pool_unlink(name, &err) == 0);
}

TEST(child_attaches_via_fdpass_and_publishes)
{
    const char *name = pool_name("pass");
    struct slot_pool *p = NULL;
    errbuf err;
    REQUIRE(slot_pool_create(name, 4, 64 * 1024, &p, &err) == 0);
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) == 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        struct slot_pool *cp = recv_pool(sv[1]);
        if (!cp) _exit(1);
        for (uint64_t id = 10; id < 14; id++)
            if (produce(cp, id, 7, 70, 0)) _exit(2);
        _exit(0);
    }
    close(sv[1]);
    send_pool(sv[0], p, name);
    reap(pid, 0);
    uint64_t ids[8];
    int n = slot_pool_find_ready(p, ids, 8);
    EXPECT(n == 4);
    uint64_t sum = 0;
    for (int k = 0; k < n && k < 8; k++) sum += ids[k];
    EXPECT(sum == 10 + 11 + 12 + 13);
    EXPECT(slot_pool_find_ready(p, ids, 1) == 4);

    int i = slot_pool_lease_batch(p, 12, 9, 90, 0);
    REQUIRE(i >= 0);
    struct slot_pool_desc *d = slot_pool_desc(p, i);
    EXPECT(d->batch_id == 12 && d->ntok == 13 && d->producer_epoch == 70 && d->bytes_used == payload_bytes(12));
    EXPECT(payload_ok(slot_pool_data(p, i), 12));
    EXPECT(slot_pool_lease_batch(p, 12, 9, 90, 0) == -ETIMEDOUT);
    EXPECT(slot_pool_lease_batch(p, 99, 9, 90, 10) == -ETIMEDOUT);
    EXPECT(slot_pool_release(p, i, 9, 90) == 0);

    /* Predicate lease: the lowest ready id that is odd. */
    i = slot_pool_lease(p, odd_id, NULL, 9, 90, 0);
    REQUIRE(i >= 0);
    EXPECT(slot_pool_desc(p, i)->batch_id == 11);
    EXPECT(payload_ok(slot_pool_data(p, i), 11));
    EXPECT(slot_pool_release(p, i, 9, 90) == 0);
    i = slot_pool_lease(p, NULL, NULL, 9, 90, 0);
    REQUIRE(i >= 0);
    EXPECT(slot_pool_desc(p, i)->batch_id == 10);
    EXPECT(slot_pool_release(p, i, 9, 90) == 0);
    int nf, nfi, nr, nl;
    slot_pool_stats(p, &nf, &nfi, &nr, &nl);
    EXPECT(nf == 3 && nfi == 0 && nr == 1 && nl == 0);
    close(sv[0]);
    slot_pool_destroy(&p);
    slot_pool_unlink(name, NULL);
}

/* A child attaches, then claims (lease = 0) or leases batch `id` (lease = 1), scribbles when filling, reports the
 * slot on a pipe and waits to be killed. */
static pid_t hold(struct slot_pool *p, const char *name, int lease, uint64_t id, uint16_t owner, uint64_t epoch,
                  int *slot)
{
    int sv[2], pp[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) == 0 && pipe(pp) == 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        close(pp[0]);
        struct slot_pool *cp = recv_pool(sv[1]);
        if (!cp) _exit(1);
        int i = lease ? slot_pool_lease_batch(cp, id, owner, epoch, -1) : slot_pool_claim(cp, owner, epoch, -1);
        if (!lease && i >= 0) {
            memset(slot_pool_data(cp, i), 0xAB, 4096);
            slot_pool_desc(cp, i)->batch_id = 555;
        }
        if (write(pp[1], &i, sizeof i) != sizeof i) _exit(2);
        for (;;) pause();
    }
    close(sv[1]);
    close(pp[1]);
    send_pool(sv[0], p, name);
    REQUIRE(read(pp[0], slot, sizeof *slot) == sizeof *slot);
    REQUIRE(*slot >= 0);
    close(sv[0]);
    close(pp[0]);
    return pid;
}

TEST(sigkill_while_filling_and_leased_is_reclaimed)
{
    const char *name = pool_name("kill");
    struct slot_pool *p = NULL;
    errbuf err;
    REQUIRE(slot_pool_create(name, 4, 32 * 1024, &p, &err) == 0);
    REQUIRE(produce(p, 40, 1, 1, 0) == 0);
    REQUIRE(produce(p, 41, 1, 1, 0) == 0);
    int fslot = -1, lslot = -1;
    pid_t a = hold(p, name, 0, 0, 5, 500, &fslot);
    pid_t b = hold(p, name, 1, 41, 6, 600, &lslot);
    reap(a, 1);
    reap(b, 1);
    EXPECT(slot_pool_slot_word(p, fslot) == slot_word_make(SLOT_STATE_FILLING, 5, 500));
    EXPECT(slot_pool_slot_word(p, lslot) == slot_word_make(SLOT_STATE_LEASED, 6, 600));
    EXPECT(slot_pool_desc(p, fslot)->producer_epoch == 500);

    int freed = -1, returned = -1;
    EXPECT(slot_pool_reclaim(p, 600, &freed, &returned) == 1);
    EXPECT(freed == 0 && returned == 1);
    EXPECT(slot_word_state(slot_pool_slot_word(p, fslot)) == SLOT_STATE_FILLING);
    EXPECT(slot_pool_reclaim(p, 500, &freed, &returned) == 1);
    EXPECT(freed == 1 && returned == 0);
    EXPECT(slot_word_state(slot_pool_slot_word(p, fslot)) == SLOT_STATE_FREE);
    EXPECT(slot_pool_release(p, lslot, 6, 600) == -ESTALE);
    EXPECT(slot_pool_publish(p, fslot, 5, 500) == -ESTALE);

    /* The half-written batch 555 is not listed; 41 is back, intact, in the same slot. */
    uint64_t ids[4];
    int n = slot_pool_find_ready(p, ids, 4);
    EXPECT(n == 2);
    for (int k = 0; k < n && k < 4; k++) EXPECT(ids[k] == 40 || ids[k] == 41);
    int i = slot_pool_lease_batch(p, 41, 8, 800, 0);
    EXPECT(i == lslot);
    REQUIRE(i >= 0);
    EXPECT(payload_ok(slot_pool_data(p, i), 41));
    EXPECT(slot_pool_release(p, i, 8, 800) == 0);
    slot_pool_destroy(&p);
    slot_pool_unlink(name, NULL);
}

/* dflashd's situation: the process that created the pool and wrote it dies; the holder of the fd maps it intact. */
TEST(data_survives_creator_sigkill)
{
    const char *name = pool_name("creator");
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) == 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        struct slot_pool *cp = NULL;
        errbuf err;
        if (slot_pool_create(name, 2, 64 * 1024, &cp, &err)) _exit(1);
        if (produce(cp, 77, 3, 30, 0)) _exit(2);
        int fd = slot_pool_data_fd(cp);
        if (fdpass_send(sv[1], &fd, 1, name, strlen(name) + 1) < 0) _exit(3);
        for (;;) pause();
    }
    close(sv[1]);
    int fd = -1, nfd = 0;
    char got_name[256];
    REQUIRE(fdpass_recv(sv[0], &fd, 1, &nfd, got_name, sizeof got_name) > 0 && nfd == 1);
    EXPECT(strcmp(got_name, name) == 0);
    reap(pid, 1);
    struct slot_pool *p = NULL;
    errbuf err;
    REQUIRE(slot_pool_attach(name, fd, &p, &err) == 0);
    close(fd);
    int i = slot_pool_lease_batch(p, 77, 4, 40, 0);
    REQUIRE(i >= 0);
    EXPECT(payload_ok(slot_pool_data(p, i), 77));
    EXPECT(slot_pool_desc(p, i)->bytes_used == payload_bytes(77));
    EXPECT(slot_pool_release(p, i, 4, 40) == 0);
    slot_pool_destroy(&p);
    slot_pool_unlink(name, NULL);
    close(sv[0]);
}

enum { CC_BATCHES = 600, CC_PRODUCERS = 2, CC_CONSUMERS = 2 };
struct cc_results {
    _Atomic uint64_t next_id;
    _Atomic int received[CC_BATCHES];
    _Atomic int consumed;
    _Atomic int bad;
};

TEST(concurrent_producers_consumers_exactly_once)
{
    const char *name = pool_name("mpmc");
    struct slot_pool *p = NULL;
    errbuf err;
    REQUIRE(slot_pool_create(name, 3, 32 * 1024, &p, &err) == 0);
    struct cc_results *res = mmap(NULL, sizeof *res, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(res != MAP_FAILED);
    pid_t pids[CC_PRODUCERS + CC_CONSUMERS];
    for (int k = 0; k < CC_PRODUCERS + CC_CONSUMERS; k++) {
        int sv[2];
        REQUIRE(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) == 0);
        pids[k] = fork();
        REQUIRE(pids[k] >= 0);
        if (pids[k] == 0) {
            close(sv[0]);
            struct slot_pool *cp = recv_pool(sv[1]);
            if (!cp) _exit(1);
            uint16_t owner = (uint16_t)(k + 1);
            uint64_t epoch = (uint64_t)k + 1;
            if (k < CC_PRODUCERS) {
                for (;;) {
                    uint64_t id = atomic_fetch_add(&res->next_id, 1);
                    if (id >= CC_BATCHES) break;
                    int rc;
                    while ((rc = produce(cp, id, owner, epoch, 100)) == -ETIMEDOUT) {}
                    if (rc) _exit(2);
                }
            } else {
                while (atomic_load(&res->consumed) < CC_BATCHES) {
                    int i = slot_pool_lease(cp, NULL, NULL, owner, epoch, 100);
                    if (i == -ETIMEDOUT) continue;
                    if (i < 0) _exit(3);
                    uint64_t id = slot_pool_desc(cp, i)->batch_id;
                    if (id >= CC_BATCHES || !payload_ok(slot_pool_data(cp, i), id)) atomic_fetch_add(&res->bad, 1);
                    else atomic_fetch_add(&res->received[id], 1);
                    if (slot_pool_release(cp, i, owner, epoch)) _exit(4);
                    atomic_fetch_add(&res->consumed, 1);
                }
            }
            _exit(0);
        }
        close(sv[1]);
        send_pool(sv[0], p, name);
        close(sv[0]);
    }
    for (int k = 0; k < CC_PRODUCERS + CC_CONSUMERS; k++) reap(pids[k], 0);
    int wrong = 0;
    for (int id = 0; id < CC_BATCHES; id++) wrong += atomic_load(&res->received[id]) != 1;
    EXPECT(wrong == 0);
    EXPECT(atomic_load(&res->bad) == 0);
    int nf;
    slot_pool_stats(p, &nf, NULL, NULL, NULL);
    EXPECT(nf == 3);
    munmap(res, sizeof *res);
    slot_pool_destroy(&p);
    slot_pool_unlink(name, NULL);
}

/* A reader checks a leased slot against its own buffers (max tokens, max seqs, where cu_seqlens sit) before reading:
 * a descriptor or token part that does not fit is an error naming the pool, the slot and the field. */
TEST(reader_check_names_pool_slot_and_field)
{
    const char *name = pool_name("rcheck");
    struct slot_pool *p = NULL;
    errbuf err = { "" };
    REQUIRE(slot_pool_create(name, 2, 8192, &p, &err) == 0);
    const struct slot_pool_shape shape = { .max_tokens = 16, .max_seqs = 4, .cu_seqlens = 1024 };
    int i = slot_pool_claim(p, 1, 1, 0);
    REQUIRE(i >= 0);
    struct slot_pool_desc *d = slot_pool_desc(p, i);
    int32_t *cu = (int32_t *)((char *)slot_pool_data(p, i) + shape.cu_seqlens);
    cu[0] = 0, cu[1] = 4, cu[2] = 10;
    d->batch_id = 31, d->ntok = 10, d->nseq = 2, d->bytes_used = 4096;
    REQUIRE(slot_pool_publish(p, i, 1, 1) == 0);
    REQUIRE(slot_pool_lease_batch(p, 31, 2, 2, 0) == i);
    EXPECT(slot_pool_slot_check(p, i, &shape, &err) == 0);
    char slot[32];
    snprintf(slot, sizeof slot, "slot %d", i);
    d->ntok = 17;
    EXPECT(slot_pool_slot_check(p, i, &shape, &err) == -EPROTO);
    EXPECT_CONTAINS(err.msg, name);
    EXPECT_CONTAINS(err.msg, slot);
    EXPECT_CONTAINS(err.msg, "batch 31");
    EXPECT_CONTAINS(err.msg, "ntok 17");
    d->ntok = 10, d->nseq = 5;
    EXPECT(slot_pool_slot_check(p, i, &shape, &err) == -EPROTO);
    EXPECT_CONTAINS(err.msg, "nseq 5");
    d->nseq = 2, cu[2] = 9;
    EXPECT(slot_pool_slot_check(p, i, &shape, &err) == -EPROTO);
    EXPECT_CONTAINS(err.msg, "cu_seqlens[2]");
    cu[2] = 10, d->bytes_used = 8193;
    EXPECT(slot_pool_slot_check(p, i, &shape, &err) == -EPROTO);
    EXPECT_CONTAINS(err.msg, "bytes_used");
    d->bytes_used = 4096;
    /* the reader's own shape must fit the slot: cu_seqlens beyond its end is refused, not read */
    const struct slot_pool_shape outside = { .max_tokens = 16, .max_seqs = 4, .cu_seqlens = 8192 - 8 };
    EXPECT(slot_pool_slot_check(p, i, &outside, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "cu_seqlens");
    EXPECT(slot_pool_slot_check(p, i, &shape, &err) == 0);
    EXPECT(slot_pool_release(p, i, 2, 2) == 0);
    slot_pool_destroy(&p);
    slot_pool_unlink(name, NULL);
}

TEST_MAIN

/* token_ring: real processes on a real shm ring: open validation, 3 producers x 3 consumers moving 2000 batches
 * exactly once, reclaim after SIGKILL while FILLING and while LEASED, and a full ring blocking its producer. */
#include "shm.h"
#include "slot_state.h"
#include "token_ring.h"
#include "tests/test.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>

/* A per-run segment name; up to 8 names can be live at once (rotating static buffers). */
static const char *ring_name(const char *what)
{
    static char names[8][128];
    static int next;
    char *name = names[next++ % 8];
    snprintf(name, 128, "/dflash-test-%d-%s", (int)getpid(), what);
    return name;
}

/* Deterministic batch contents as a function of the id. */
static void batch_fill(struct token_batch *b, uint64_t id, uint32_t max_seqs)
{
    uint32_t nseq = 1 + (uint32_t)(id % max_seqs);
    uint32_t ntok = nseq * (3 + (uint32_t)(id % 7));
    b->meta->batch_id = id;
    b->meta->nseq = nseq;
    b->meta->ntok = ntok;
    for (uint32_t s = 0; s <= nseq; s++) b->cu_seqlens[s] = (int32_t)(s * (ntok / nseq));
    for (uint32_t t = 0; t < ntok; t++) {
        b->input_ids[t] = (int32_t)(id * 7919 + t * 31);
        b->loss_mask[t] = (uint8_t)((id + t) & 1);
    }
    for (uint32_t s = 0; s < nseq; s++) b->sample_ids[s] = id * 1000 + s;
}

static int batch_ok(const struct token_batch *b, uint64_t id, uint32_t max_seqs)
{
    uint32_t nseq = 1 + (uint32_t)(id % max_seqs);
    uint32_t ntok = nseq * (3 + (uint32_t)(id % 7));
    if (b->meta->batch_id != id || b->meta->nseq != nseq || b->meta->ntok != ntok) return 0;
    for (uint32_t s = 0; s <= nseq; s++)
        if (b->cu_seqlens[s] != (int32_t)(s * (ntok / nseq))) return 0;
    for (uint32_t t = 0; t < ntok; t++)
        if (b->input_ids[t] != (int32_t)(id * 7919 + t * 31) || b->loss_mask[t] != (uint8_t)((id + t) & 1)) return 0;
    for (uint32_t s = 0; s < nseq; s++)
        if (b->sample_ids[s] != id * 1000 + s) return 0;
    return 1;
}

static void publish_batch(struct token_ring *r, uint64_t id, uint16_t owner, uint64_t epoch)
{
    int i = token_ring_claim(r, owner, epoch, 0);
    REQUIRE(i >= 0);
    struct token_batch b = token_ring_batch(r, i);
    batch_fill(&b, id, token_ring_geometry_get(r).max_seqs);
    REQUIRE(token_ring_publish(r, i, owner, epoch) == 0);
}

static void wait_ok(pid_t pid)
{
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

TEST(create_open_validate)
{
    const char *name = ring_name("validate");
    struct token_ring_geometry g = { 4, 256, 8 };
    struct token_ring *r = NULL, *r2 = NULL;
    errbuf err = { "" };
    REQUIRE(token_ring_create(name, &g, &r, &err) == 0);
    EXPECT(token_ring_create(name, &g, &r2, &err) == -EEXIST);
    EXPECT_CONTAINS(err.msg, name);
    REQUIRE(token_ring_open(name, &g, &r2, &err) == 0);
    struct token_ring_geometry got = token_ring_geometry_get(r2);
    EXPECT(got.nslots == 4 && got.max_tokens == 256 && got.max_seqs == 8);
    token_ring_destroy(&r2);
    EXPECT(r2 == NULL);

    struct token_ring_geometry other = { 4, 512, 8 };
    EXPECT(token_ring_open(name, &other, &r2, &err) == -EPROTO);
    EXPECT_CONTAINS(err.msg, name);
    EXPECT_CONTAINS(err.msg, "max_tokens=512");

    struct token_ring_geometry bad = { 0, 256, 8 };
    EXPECT(token_ring_create(ring_name("bad"), &bad, &r2, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "nslots 0");

    /* A kind mismatch, a corrupted magic and a wrong size are each refused with the segment's name. */
    struct shm_segment seg;
    EXPECT(shm_segment_open(&seg, name, SHM_KIND_SLOT_POOL, &err) == -EPROTO);
    EXPECT_CONTAINS(err.msg, name);
    EXPECT_CONTAINS(err.msg, "kind");
    int fd = shm_open(name, O_RDWR, 0);
    REQUIRE(fd >= 0);
    struct stat st;
    REQUIRE(fstat(fd, &st) == 0);
    REQUIRE(ftruncate(fd, st.st_size + 4096) == 0);
    EXPECT(token_ring_open(name, NULL, &r2, &err) == -EPROTO);
    EXPECT_CONTAINS(err.msg, name);
    REQUIRE(ftruncate(fd, st.st_size) == 0);
    uint64_t junk = 0x1234;
    REQUIRE(pwrite(fd, &junk, sizeof junk, 0) == sizeof junk);
    close(fd);
    EXPECT(token_ring_open(name, NULL, &r2, &err) == -EPROTO);
    EXPECT_CONTAINS(err.msg, name);
    EXPECT_CONTAINS(err.msg, "magic");

    token_ring_destroy(&r);
    EXPECT(token_ring_unlink(name, &err) == 0);
    EXPECT(token_ring_open(name, NULL, &r2, &err) == -ENOENT);
    EXPECT_CONTAINS(err.msg, name);
    EXPECT(shm_segment_open(&seg, "no-slash", SHM_KIND_TOKEN_RING, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "no-slash");
}

TEST(publish_checks_batch)
{
    const char *name = ring_name("check");
    struct token_ring_geometry g = { 2, 64, 4 };
    struct token_ring *r = NULL;
    errbuf err;
    REQUIRE(token_ring_create(name, &g, &r, &err) == 0);
    int i = token_ring_claim(r, 1, 1, 0);
    REQUIRE(i >= 0);
    struct token_batch b = token_ring_batch(r, i);
    batch_fill(&b, 3, g.max_seqs);
    b.meta->ntok = 65;
    EXPECT(token_ring_publish(r, i, 1, 1) == -EINVAL);
    batch_fill(&b, 3, g.max_seqs);
    b.cu_seqlens[b.meta->nseq] += 1;
    EXPECT(token_ring_publish(r, i, 1, 1) == -EINVAL);
    EXPECT(slot_word_state(token_ring_slot_word(r, i)) == SLOT_STATE_FILLING);
    batch_fill(&b, 3, g.max_seqs);
    EXPECT(token_ring_publish(r, i, 1, 2) == -ESTALE);
    EXPECT(token_ring_publish(r, i, 1, 1) == 0);
    int nf, nfi, nr, nl;
    token_ring_stats(r, &nf, &nfi, &nr, &nl);
    EXPECT(nf == 1 && nfi == 0 && nr == 1 && nl == 0);
    EXPECT(token_ring_lease(r, 2, 2, 0) == i);
    EXPECT(token_ring_lease(r, 2, 2, 0) == -ETIMEDOUT);
    EXPECT(token_ring_unlease(r, i, 2, 2) == 0);
    EXPECT(token_ring_lease(r, 2, 3, 0) == i);
    EXPECT(token_ring_release(r, i, 2, 2) == -ESTALE);
    EXPECT(token_ring_release(r, i, 2, 3) == 0);
    token_ring_stats(r, &nf, &nfi, &nr, &nl);
    EXPECT(nf == 2 && nfi == 0 && nr == 0 && nl == 0);
    token_ring_destroy(&r);
    token_ring_unlink(name, NULL);
}

enum { MP_BATCHES = 2000, MP_PRODUCERS = 3, MP_CONSUMERS = 3 };
struct mp_results {
    _Atomic int received[MP_BATCHES];
    _Atomic int bad_content;
    _Atomic int consumed;
    _Atomic int out_of_range;
};

static int mp_producer(const char *name, uint16_t owner, uint64_t epoch)
{
    struct token_ring *r = NULL;
    errbuf err;
    if (token_ring_open(name, NULL, &r, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    uint32_t max_seqs = token_ring_geometry_get(r).max_seqs;
    for (;;) {
        int i = token_ring_claim(r, owner, epoch, 200);
        if (i == -ETIMEDOUT) continue; /* a real producer would heartbeat here */
        if (i < 0) return 2;
        uint64_t id;
        do id = token_ring_next_id_peek(r);
        while (id < MP_BATCHES && token_ring_next_id_advance(r, id) != 0);
        if (id >= MP_BATCHES) {
            if (token_ring_abandon(r, i, owner, epoch)) return 3;
            break;
        }
        struct token_batch b = token_ring_batch(r, i);
        batch_fill(&b, id, max_seqs);
        if (token_ring_publish(r, i, owner, epoch)) return 4;
    }
    token_ring_destroy(&r);
    return 0;
}

static int mp_consumer(const char *name, uint16_t owner, uint64_t epoch, struct mp_results *res)
{
    struct token_ring *r = NULL;
    errbuf err;
    if (token_ring_open(name, NULL, &r, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    uint32_t max_seqs = token_ring_geometry_get(r).max_seqs;
    while (atomic_load(&res->consumed) < MP_BATCHES) {
        int i = token_ring_lease(r, owner, epoch, 100);
        if (i == -ETIMEDOUT) continue;
        if (i < 0) return 2;
        struct token_batch b = token_ring_batch(r, i);
        uint64_t id = b.meta->batch_id;
        if (id >= MP_BATCHES) {
            atomic_fetch_add(&res->out_of_range, 1);
        } else {
            if (!batch_ok(&b, id, max_seqs)) atomic_fetch_add(&res->bad_content, 1);
            atomic_fetch_add(&res->received[id], 1);
        }
        if (token_ring_release(r, i, owner, epoch)) return 3;
        atomic_fetch_add(&res->consumed, 1);
    }
    token_ring_destroy(&r);
    return 0;
}

TEST(three_producers_three_consumers_exactly_once)
{
    const char *name = ring_name("mpmc");
    struct token_ring_geometry g = { 4, 512, 8 };
    struct token_ring *r = NULL;
    errbuf err;
    REQUIRE(token_ring_create(name, &g, &r, &err) == 0);
    struct mp_results *res = mmap(NULL, sizeof *res, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(res != MAP_FAILED);
    pid_t pids[MP_PRODUCERS + MP_CONSUMERS];
    for (int k = 0; k < MP_PRODUCERS + MP_CONSUMERS; k++) {
        pids[k] = fork();
        REQUIRE(pids[k] >= 0);
        if (pids[k] == 0) {
            int rc = k < MP_PRODUCERS ? mp_producer(name, (uint16_t)(k + 1), (uint64_t)k + 1)
                                      : mp_consumer(name, (uint16_t)(k + 1), (uint64_t)k + 100, res);
            _exit(rc);
        }
    }
    for (int k = 0; k < MP_PRODUCERS + MP_CONSUMERS; k++) wait_ok(pids[k]);
    int missing = 0, dup = 0;
    for (int id = 0; id < MP_BATCHES; id++) {
        int n = atomic_load(&res->received[id]);
        missing += n == 0;
        dup += n > 1;
    }
    EXPECT(missing == 0);
    EXPECT(dup == 0);
    EXPECT(atomic_load(&res->bad_content) == 0);
    EXPECT(atomic_load(&res->out_of_range) == 0);
    EXPECT(atomic_load(&res->consumed) == MP_BATCHES);
    EXPECT(token_ring_next_id_peek(r) == MP_BATCHES);
    int nf, nfi, nr, nl;
    token_ring_stats(r, &nf, &nfi, &nr, &nl);
    EXPECT(nf == 4 && nfi == 0 && nr == 0 && nl == 0);
    munmap(res, sizeof *res);
    token_ring_destroy(&r);
    token_ring_unlink(name, NULL);
}

/* Fork a child that opens the ring, runs act() (claim or lease), reports the slot index on a pipe and waits to be
 * killed. Returns the child's pid; *slot gets the index it holds. */
static pid_t hold_and_wait(const char *name, int lease, uint16_t owner, uint64_t epoch, int *slot)
{
    int p[2];
    REQUIRE(pipe(p) == 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        struct token_ring *r = NULL;
        errbuf err;
        if (token_ring_open(name, NULL, &r, &err)) _exit(1);
        int i = lease ? token_ring_lease(r, owner, epoch, -1) : token_ring_claim(r, owner, epoch, -1);
        if (!lease && i >= 0) { /* a half-written batch that must never be seen */
            struct token_batch b = token_ring_batch(r, i);
            b.meta->batch_id = 999;
        }
        if (write(p[1], &i, sizeof i) != sizeof i) _exit(2);
        for (;;) pause();
    }
    close(p[1]);
    REQUIRE(read(p[0], slot, sizeof *slot) == sizeof *slot);
    close(p[0]);
    REQUIRE(*slot >= 0);
    return pid;
}

static void kill_and_reap(pid_t pid)
{
    int st = 0;
    REQUIRE(kill(pid, SIGKILL) == 0);
    REQUIRE(waitpid(pid, &st, 0) == pid);
    EXPECT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
}

TEST(sigkill_while_filling_and_leased_is_reclaimed)
{
    const char *name = ring_name("kill");
    struct token_ring_geometry g = { 4, 128, 4 };
    struct token_ring *r = NULL;
    errbuf err;
    REQUIRE(token_ring_create(name, &g, &r, &err) == 0);
    publish_batch(r, 5, 1, 1);
    publish_batch(r, 6, 1, 1);

    int filling_slot = -1, leased_slot = -1;
    pid_t a = hold_and_wait(name, 0, 21, 21, &filling_slot);
    pid_t b = hold_and_wait(name, 1, 22, 22, &leased_slot);
    /* The consumer took the lowest id. */
    EXPECT(token_ring_batch(r, leased_slot).meta->batch_id == 5);
    publish_batch(r, 7, 1, 1); /* newer batch ready while 5 is out */
    kill_and_reap(a);
    kill_and_reap(b);
    EXPECT(token_ring_slot_word(r, filling_slot) == slot_word_make(SLOT_STATE_FILLING, 21, 21));
    EXPECT(token_ring_slot_word(r, leased_slot) == slot_word_make(SLOT_STATE_LEASED, 22, 22));

    int freed = -1, returned = -1;
    EXPECT(token_ring_reclaim(r, 21, &freed, &returned) == 1);
    EXPECT(freed == 1 && returned == 0);
    EXPECT(slot_word_state(token_ring_slot_word(r, filling_slot)) == SLOT_STATE_FREE);
    EXPECT(slot_word_state(token_ring_slot_word(r, leased_slot)) == SLOT_STATE_LEASED);
    EXPECT(token_ring_reclaim(r, 22, &freed, &returned) == 1);
    EXPECT(freed == 0 && returned == 1);
    EXPECT(slot_word_state(token_ring_slot_word(r, leased_slot)) == SLOT_STATE_READY);
    EXPECT(token_ring_reclaim(r, 22, &freed, &returned) == 0);
    /* The dead consumer's stale epoch can no longer release. */
    EXPECT(token_ring_release(r, leased_slot, 22, 22) == -ESTALE);

    /* Re-lease: the original batch 5 comes first and is intact, then 6 and 7; the half-written 999 never shows. */
    uint64_t expect_ids[3] = { 5, 6, 7 };
    for (int k = 0; k < 3; k++) {
        int i = token_ring_lease(r, 30, 30, 0);
        REQUIRE(i >= 0);
        struct token_batch bb = token_ring_batch(r, i);
        EXPECT(bb.meta->batch_id == expect_ids[k]);
        EXPECT(batch_ok(&bb, expect_ids[k], g.max_seqs));
        if (k == 0) EXPECT(i == leased_slot);
        EXPECT(token_ring_release(r, i, 30, 30) == 0);
    }
    EXPECT(token_ring_lease(r, 30, 30, 0) == -ETIMEDOUT);
    token_ring_destroy(&r);
    token_ring_unlink(name, NULL);
}

TEST(full_ring_blocks_producer)
{
    const char *name = ring_name("full");
    struct token_ring_geometry g = { 2, 64, 2 };
    struct token_ring *r = NULL;
    errbuf err;
    REQUIRE(token_ring_create(name, &g, &r, &err) == 0);
    publish_batch(r, 1, 1, 1);
    publish_batch(r, 2, 1, 1);
    EXPECT(token_ring_claim(r, 1, 1, 0) == -ETIMEDOUT);
    EXPECT(token_ring_claim(r, 1, 1, 30) == -ETIMEDOUT);

    /* A child producer blocks on the full ring; it tells the parent over a pipe after its first -ETIMEDOUT, and only
     * then does the parent free a slot, so the child must have been blocked and must then proceed. */
    int p[2];
    REQUIRE(pipe(p) == 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        struct token_ring *cr = NULL;
        if (token_ring_open(name, NULL, &cr, &err)) _exit(1);
        int timeouts = 0, i;
        while ((i = token_ring_claim(cr, 2, 2, 20)) == -ETIMEDOUT)
            if (timeouts++ == 0 && write(p[1], "t", 1) != 1) _exit(2);
        if (i < 0) _exit(3);
        struct token_batch b = token_ring_batch(cr, i);
        batch_fill(&b, 99, g.max_seqs);
        _exit(token_ring_publish(cr, i, 2, 2) == 0 ? 0 : 4);
    }
    close(p[1]);
    char c;
    REQUIRE(read(p[0], &c, 1) == 1);
    close(p[0]);
    int nf, nfi, nr, nl;
    token_ring_stats(r, &nf, &nfi, &nr, &nl);
    EXPECT(nf == 0 && nfi == 0 && nr == 2);
    int i = token_ring_lease(r, 3, 3, 0);
    REQUIRE(i >= 0);
    EXPECT(token_ring_batch(r, i).meta->batch_id == 1);
    EXPECT(token_ring_release(r, i, 3, 3) == 0);
    wait_ok(pid);
    token_ring_stats(r, &nf, &nfi, &nr, &nl);
    EXPECT(nf == 0 && nr == 2);
    i = token_ring_lease(r, 3, 3, 0);
    EXPECT(i >= 0 && token_ring_batch(r, i).meta->batch_id == 2);
    i = token_ring_lease(r, 3, 3, 0);
    EXPECT(i >= 0 && token_ring_batch(r, i).meta->batch_id == 99);
    token_ring_destroy(&r);
    token_ring_unlink(name, NULL);
}

/* A reader checks a leased batch against the ring's geometry before reading it: a batch written past the checks of
 * publish (a rogue or stale writer) is an error naming the ring, the slot and the field, never a read past the end. */
TEST(reader_check_names_ring_slot_and_field)
{
    const char *name = ring_name("rcheck");
    struct token_ring_geometry g = { 2, 64, 4 };
    struct token_ring *r = NULL;
    errbuf err = { "" };
    REQUIRE(token_ring_create(name, &g, &r, &err) == 0);
    publish_batch(r, 3, 1, 1);
    int i = token_ring_lease(r, 2, 2, 0);
    REQUIRE(i >= 0);
    EXPECT(token_ring_slot_check(r, i, &err) == 0);
    struct token_batch b = token_ring_batch(r, i);
    b.meta->ntok = 65;
    EXPECT(token_ring_slot_check(r, i, &err) == -EPROTO);
    EXPECT_CONTAINS(err.msg, name);
    char slot[32];
    snprintf(slot, sizeof slot, "slot %d", i);
    EXPECT_CONTAINS(err.msg, slot);
    EXPECT_CONTAINS(err.msg, "ntok 65");
    batch_fill(&b, 3, g.max_seqs);
    b.meta->nseq = 5;
    EXPECT(token_ring_slot_check(r, i, &err) == -EPROTO);
    EXPECT_CONTAINS(err.msg, "nseq 5");
    batch_fill(&b, 3, g.max_seqs);
    b.cu_seqlens[1] = -1;
    EXPECT(token_ring_slot_check(r, i, &err) == -EPROTO);
    EXPECT_CONTAINS(err.msg, "cu_seqlens");
    batch_fill(&b, 3, g.max_seqs);
    EXPECT(token_ring_slot_check(r, i, &err) == 0);
    EXPECT(token_ring_release(r, i, 2, 2) == 0);
    token_ring_destroy(&r);
    token_ring_unlink(name, NULL);
}

TEST_MAIN

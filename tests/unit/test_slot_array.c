/* slot_array: the slot mechanism under the token ring and the pools, on a layout of its own (state words and batch
 * ids in separate arrays at different strides, in a shared anonymous mapping): claim / publish / lease lowest id, by
 * id and by predicate / release / unlease, the batch id re-checked after the lease CAS (a slot consumed and refilled
 * between the scan and the CAS is given back), reclaim of a SIGKILLed holder's slots waking a blocked consumer,
 * stats, and the shape check naming the segment, slot and field. */
#include "slot_array.h"
#include "tests/test.h"

#include <errno.h>
#include <signal.h>
#include <sys/mman.h>

enum { NSLOTS = 4 };

/* The shared part: a state word per 64-byte line, the batch ids packed apart, and the generation word. */
struct shared {
    struct {
        uint64_t other;
        slot_word state;
        char pad[48];
    } line[NSLOTS];
    uint64_t ids[NSLOTS];
    _Atomic uint32_t gen;
};

static struct shared *shared_new(struct slot_array *a, uint32_t nslots)
{
    struct shared *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(s != MAP_FAILED);
    *a = slot_array_view("test array", nslots, &s->line[0].state, sizeof s->line[0], &s->ids[0], sizeof s->ids[0],
                         &s->gen);
    return s;
}

/* Claim a slot, set its batch id, publish it; returns the slot. */
static int put(struct slot_array *a, struct shared *s, uint64_t id, uint16_t owner, uint64_t epoch)
{
    int i = slot_array_claim(a, owner, epoch, 0);
    REQUIRE(i >= 0);
    s->ids[i] = id;
    REQUIRE(slot_array_publish(a, i, owner, epoch) == 0);
    return i;
}

static int even_id(uint64_t id, void *ctx) { return id % 2 == 0; }

TEST(cycle_lowest_id_by_id_and_predicate)
{
    struct slot_array a;
    struct shared *s = shared_new(&a, NSLOTS);
    int s9 = put(&a, s, 9, 1, 1), s4 = put(&a, s, 4, 1, 1), s7 = put(&a, s, 7, 1, 1);
    EXPECT(slot_array_batch_id(&a, s9) == 9);
    int nf, nfi, nr, nl;
    slot_array_stats(&a, &nf, &nfi, &nr, &nl);
    EXPECT(nf == 1 && nfi == 0 && nr == 3 && nl == 0);
    uint64_t ids[2];
    EXPECT(slot_array_find_ready(&a, ids, 2) == 3);

    EXPECT(slot_array_lease(&a, NULL, 2, 20, 0) == s4); /* the lowest id */
    EXPECT(slot_array_word(&a, s4) == slot_word_make(SLOT_STATE_LEASED, 2, 20));
    struct slot_array_want nine = { .by_id = 1, .batch_id = 9 }, none = { .by_id = 1, .batch_id = 4 };
    EXPECT(slot_array_lease(&a, &none, 2, 20, 0) == -ETIMEDOUT); /* 4 is out */
    EXPECT(slot_array_lease(&a, &nine, 2, 20, 0) == s9);
    EXPECT(slot_array_unlease(&a, s9, 2, 20) == 0);
    struct slot_array_want even = { .pred = even_id };
    EXPECT(slot_array_lease(&a, &even, 2, 20, 0) == -ETIMEDOUT);
    EXPECT(slot_array_release(&a, s4, 2, 21) == -ESTALE); /* not our epoch */
    EXPECT(slot_array_release(&a, s4, 2, 20) == 0);
    EXPECT(slot_array_lease(&a, NULL, 2, 20, 0) == s7);
    EXPECT(slot_array_release(&a, s7, 2, 20) == 0);
    EXPECT(slot_array_lease(&a, NULL, 2, 20, 0) == s9);
    EXPECT(slot_array_release(&a, s9, 2, 20) == 0);
    slot_array_stats(&a, &nf, &nfi, &nr, &nl);
    EXPECT(nf == NSLOTS && nr == 0);

    /* a full array: claim times out; abandon gives a slot back */
    int held[NSLOTS];
    for (int k = 0; k < NSLOTS; k++) held[k] = slot_array_claim(&a, 3, 30, 0);
    for (int k = 0; k < NSLOTS; k++) EXPECT(held[k] >= 0);
    EXPECT(slot_array_claim(&a, 3, 30, 20) == -ETIMEDOUT);
    EXPECT(slot_array_abandon(&a, held[2], 3, 30) == 0);
    EXPECT(slot_array_claim(&a, 3, 30, 0) == held[2]);
    munmap(s, sizeof *s);
}

/* The race the re-check is for, made deterministic: while the consumer scans (in its predicate, after it has read
 * the ids), another consumer takes the chosen slot and a producer refills it with a higher id. The consumer's lease
 * CAS still succeeds (the slot is READY again), so only the re-read of the id catches it: the slot must be given
 * back and the truly lowest batch leased instead. */
struct race {
    struct slot_array *a;
    struct shared *s;
    int slot;      /* the slot to refill */
    uint64_t refill_id;
    uint64_t only;  /* nonzero: the consumer wants this batch id alone */
    int done;
};

static int refill_during_scan(uint64_t id, void *ctx)
{
    struct race *r = ctx;
    if (!r->done && id == r->s->ids[r->slot]) {
        r->done = 1;
        REQUIRE(slot_array_lease(r->a, NULL, 8, 80, 0) == r->slot); /* the other consumer takes it... */
        REQUIRE(slot_array_release(r->a, r->slot, 8, 80) == 0);
        REQUIRE(slot_array_claim(r->a, 9, 90, 0) == r->slot);       /* ...and a producer refills it */
        r->s->ids[r->slot] = r->refill_id;
        REQUIRE(slot_array_publish(r->a, r->slot, 9, 90) == 0);
    }
    return !r->only || id == r->only;
}

TEST(batch_id_rechecked_after_lease)
{
    struct slot_array a;
    struct shared *s = shared_new(&a, 2);
    int s5 = put(&a, s, 5, 1, 1), s7 = put(&a, s, 7, 1, 1);
    struct race r = { .a = &a, .s = s, .slot = s5, .refill_id = 11 };
    struct slot_array_want want = { .pred = refill_during_scan, .ctx = &r };
    int i = slot_array_lease(&a, &want, 2, 20, 0);
    EXPECT(r.done);
    EXPECT(i == s7);                                  /* the lowest id once the dust settled, not the refilled slot */
    EXPECT(slot_array_batch_id(&a, i) == 7);
    EXPECT(slot_word_state(slot_array_word(&a, s5)) == SLOT_STATE_READY); /* given back, not kept */
    EXPECT(slot_array_batch_id(&a, s5) == 11);
    EXPECT(slot_array_release(&a, i, 2, 20) == 0);

    /* A consumer that wants batch 11 alone: the slot holding it is refilled with 12 between the scan and the CAS;
     * the lease must not come back with batch 12 in hand. */
    struct race r2 = { .a = &a, .s = s, .slot = s5, .refill_id = 12, .only = 11 };
    struct slot_array_want only11 = { .pred = refill_during_scan, .ctx = &r2 };
    EXPECT(slot_array_lease(&a, &only11, 2, 20, 0) == -ETIMEDOUT);
    EXPECT(r2.done);
    EXPECT(slot_word_state(slot_array_word(&a, s5)) == SLOT_STATE_READY && slot_array_batch_id(&a, s5) == 12);
    munmap(s, sizeof *s);
}

static void reap_killed(pid_t pid)
{
    int st = 0;
    REQUIRE(kill(pid, SIGKILL) == 0);
    REQUIRE(waitpid(pid, &st, 0) == pid);
    EXPECT(WIFSIGNALED(st));
}

/* A child holds a slot (claim or lease) and waits to be killed; returns its pid once it holds it. */
static pid_t hold(struct slot_array *a, int lease, uint16_t owner, uint64_t epoch)
{
    int p[2];
    REQUIRE(pipe(p) == 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        int i = lease ? slot_array_lease(a, NULL, owner, epoch, -1) : slot_array_claim(a, owner, epoch, -1);
        if (write(p[1], &i, sizeof i) != sizeof i) _exit(2);
        for (;;) pause();
    }
    int i = -1;
    REQUIRE(read(p[0], &i, sizeof i) == sizeof i);
    REQUIRE(i >= 0);
    close(p[0]);
    close(p[1]);
    return pid;
}

TEST(reclaim_dead_owner_wakes_a_waiting_consumer)
{
    struct slot_array a;
    struct shared *s = shared_new(&a, 2);
    put(&a, s, 3, 1, 1);
    pid_t leaser = hold(&a, 1, 5, 50);  /* leases batch 3 */
    pid_t filler = hold(&a, 0, 6, 60);  /* claims the other slot */
    reap_killed(leaser);
    reap_killed(filler);
    int nf, nfi, nr, nl;
    slot_array_stats(&a, &nf, &nfi, &nr, &nl);
    EXPECT(nf == 0 && nfi == 1 && nr == 0 && nl == 1);

    /* a consumer blocks on the empty array; the reclaim of the dead leaser's epoch must wake it with batch 3 */
    int p[2];
    REQUIRE(pipe(p) == 0);
    pid_t waiter = fork();
    REQUIRE(waiter >= 0);
    if (waiter == 0) {
        if (write(p[1], "w", 1) != 1) _exit(2);
        int i = slot_array_lease(&a, NULL, 7, 70, 5000);
        _exit(i >= 0 && slot_array_batch_id(&a, i) == 3 ? 0 : 1);
    }
    char c;
    REQUIRE(read(p[0], &c, 1) == 1);
    usleep(20000);
    int freed = -1, returned = -1;
    EXPECT(slot_array_reclaim(&a, 999, &freed, &returned) == 0 && freed == 0 && returned == 0);
    EXPECT(slot_array_reclaim(&a, 50, &freed, &returned) == 1 && freed == 0 && returned == 1);
    int st = 0;
    REQUIRE(waitpid(waiter, &st, 0) == waiter);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    EXPECT(slot_array_reclaim(&a, 60, &freed, &returned) == 1 && freed == 1 && returned == 0);
    EXPECT(slot_array_publish(&a, 1, 6, 60) == -ESTALE && slot_array_publish(&a, 0, 6, 60) == -ESTALE);
    slot_array_stats(&a, &nf, &nfi, &nr, &nl);
    EXPECT(nf == 1 && nfi == 0 && nr == 0 && nl == 1); /* the waiter's lease stays: its owner died without release */
    munmap(s, sizeof *s);
}

TEST(shape_check_names_segment_slot_and_field)
{
    struct slot_array a;
    struct shared *s = shared_new(&a, NSLOTS);
    s->ids[2] = 42;
    int32_t cu[4] = { 0, 3, 5, 9 };
    struct slot_shape sh = { .ntok = 9, .nseq = 3, .cu_seqlens = cu };
    errbuf err = { "" };
    EXPECT(slot_array_check_shape(&a, 2, &sh, 16, 4, &err) == 0);
    EXPECT(slot_array_check_shape(&a, 2, &sh, 8, 4, &err) == -EPROTO);
    EXPECT_CONTAINS(err.msg, "test array");
    EXPECT_CONTAINS(err.msg, "slot 2");
    EXPECT_CONTAINS(err.msg, "batch 42");
    EXPECT_CONTAINS(err.msg, "ntok 9");
    EXPECT(slot_array_check_shape(&a, 2, &sh, 16, 2, &err) == -EPROTO);
    EXPECT_CONTAINS(err.msg, "nseq 3");
    cu[0] = 1;
    EXPECT(slot_array_check_shape(&a, 2, &sh, 16, 4, &err) == -EPROTO);
    EXPECT_CONTAINS(err.msg, "cu_seqlens[0]");
    cu[0] = 0, cu[2] = 2;
    EXPECT(slot_array_check_shape(&a, 2, &sh, 16, 4, &err) == -EPROTO);
    EXPECT_CONTAINS(err.msg, "cu_seqlens[2]");
    cu[2] = 5, cu[3] = 8;
    EXPECT(slot_array_check_shape(&a, 2, &sh, 16, 4, &err) == -EPROTO);
    EXPECT_CONTAINS(err.msg, "cu_seqlens[3]");
    EXPECT_CONTAINS(err.msg, "ntok 9");
    /* GPU data: no cu_seqlens to read, the descriptor alone is checked */
    sh.cu_seqlens = NULL;
    EXPECT(slot_array_check_shape(&a, 2, &sh, 16, 4, &err) == 0);
    sh.ntok = 17;
    EXPECT(slot_array_check_shape(&a, 2, &sh, 16, 4, NULL) == -EPROTO);
    munmap(s, sizeof *s);
}

TEST_MAIN

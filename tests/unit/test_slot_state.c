/* slot_state: every legal and illegal transition, stale epochs, reclaim by epoch, and a cross-process CAS race. */
#include "slot_state.h"
#include "tests/test.h"

#include <errno.h>
#include <sys/mman.h>

#define W(st, o, e) slot_word_make(SLOT_STATE_##st, (o), (e))

TEST(word_pack_roundtrip)
{
    uint64_t w = slot_word_make(SLOT_STATE_LEASED, 0xBEEF, SLOT_EPOCH_MAX);
    EXPECT(slot_word_state(w) == SLOT_STATE_LEASED);
    EXPECT(slot_word_owner(w) == 0xBEEF);
    EXPECT(slot_word_epoch(w) == SLOT_EPOCH_MAX);
    w = slot_word_make(SLOT_STATE_FILLING, 7, 123456789);
    EXPECT(slot_word_state(w) == SLOT_STATE_FILLING && slot_word_owner(w) == 7 && slot_word_epoch(w) == 123456789);
    EXPECT(slot_word_make(SLOT_STATE_FREE, 0, 0) == 0);
    EXPECT(strcmp(slot_state_name(SLOT_STATE_READY), "READY") == 0);
}

TEST(legal_cycle)
{
    slot_word w = 0;
    EXPECT(slot_claim(&w, 3, 10) == 0);
    EXPECT(w == W(FILLING, 3, 10));
    EXPECT(slot_publish(&w, 3, 10) == 0);
    EXPECT(slot_word_state(w) == SLOT_STATE_READY);
    EXPECT(slot_lease(&w, 5, 20) == 0);
    EXPECT(w == W(LEASED, 5, 20));
    EXPECT(slot_unlease(&w, 5, 20) == 0);
    EXPECT(slot_word_state(w) == SLOT_STATE_READY);
    EXPECT(slot_lease(&w, 6, 21) == 0);
    EXPECT(slot_release(&w, 6, 21) == 0);
    EXPECT(w == W(FREE, 0, 0));
    EXPECT(slot_claim(&w, 3, 10) == 0);
    EXPECT(slot_abandon(&w, 3, 10) == 0);
    EXPECT(w == 0);
}

TEST(illegal_from_each_state)
{
    slot_word w = 0; /* FREE */
    EXPECT(slot_publish(&w, 1, 1) == -ESTALE);
    EXPECT(slot_lease(&w, 1, 1) == -EBUSY);
    EXPECT(slot_release(&w, 1, 1) == -ESTALE);
    EXPECT(slot_abandon(&w, 1, 1) == -ESTALE);
    EXPECT(slot_unlease(&w, 1, 1) == -ESTALE);
    EXPECT(w == 0);

    w = W(FILLING, 1, 1);
    EXPECT(slot_claim(&w, 2, 2) == -EBUSY);
    EXPECT(slot_lease(&w, 2, 2) == -EBUSY);
    EXPECT(slot_release(&w, 1, 1) == -ESTALE);
    EXPECT(slot_unlease(&w, 1, 1) == -ESTALE);
    EXPECT(w == W(FILLING, 1, 1));

    w = W(READY, 0, 0);
    EXPECT(slot_claim(&w, 1, 1) == -EBUSY);
    EXPECT(slot_publish(&w, 0, 0) == -ESTALE);
    EXPECT(slot_release(&w, 0, 0) == -ESTALE);
    EXPECT(slot_abandon(&w, 0, 0) == -ESTALE);
    EXPECT(slot_unlease(&w, 0, 0) == -ESTALE);
    EXPECT(w == W(READY, 0, 0));

    w = W(LEASED, 4, 4);
    EXPECT(slot_claim(&w, 4, 4) == -EBUSY);
    EXPECT(slot_publish(&w, 4, 4) == -ESTALE);
    EXPECT(slot_lease(&w, 4, 4) == -EBUSY);
    EXPECT(slot_abandon(&w, 4, 4) == -ESTALE);
    EXPECT(w == W(LEASED, 4, 4));
}

TEST(stale_epoch_or_owner_cannot_commit)
{
    slot_word w = W(FILLING, 2, 100);
    EXPECT(slot_publish(&w, 2, 99) == -ESTALE);  /* the same worker's previous life */
    EXPECT(slot_publish(&w, 3, 100) == -ESTALE); /* another owner */
    EXPECT(slot_abandon(&w, 2, 101) == -ESTALE);
    EXPECT(w == W(FILLING, 2, 100));
    w = W(LEASED, 2, 100);
    EXPECT(slot_release(&w, 2, 99) == -ESTALE);
    EXPECT(slot_release(&w, 1, 100) == -ESTALE);
    EXPECT(slot_unlease(&w, 2, 101) == -ESTALE);
    EXPECT(w == W(LEASED, 2, 100));
    /* After a reclaim, the old epoch's late release fails and the slot stays with its new holder. */
    EXPECT(slot_reclaim_word(&w, 100) == SLOT_RECLAIM_RETURNED);
    EXPECT(slot_lease(&w, 2, 200) == 0);
    EXPECT(slot_release(&w, 2, 100) == -ESTALE);
    EXPECT(w == W(LEASED, 2, 200));
}

TEST(reclaim_only_given_epoch)
{
    slot_word w[8] = {
        W(FREE, 0, 0), W(FILLING, 1, 7), W(READY, 0, 0), W(LEASED, 2, 7),
        W(FILLING, 1, 8), W(LEASED, 3, 8), W(LEASED, 4, 7), W(FILLING, 7, 6),
    };
    int freed = -1, returned = -1;
    EXPECT(slot_reclaim_epoch(w, 8, 7, &freed, &returned) == 3);
    EXPECT(freed == 1 && returned == 2);
    EXPECT(w[0] == 0);
    EXPECT(w[1] == 0);
    EXPECT(w[2] == W(READY, 0, 0));
    EXPECT(w[3] == W(READY, 0, 0));
    EXPECT(w[4] == W(FILLING, 1, 8));
    EXPECT(w[5] == W(LEASED, 3, 8));
    EXPECT(w[6] == W(READY, 0, 0));
    EXPECT(w[7] == W(FILLING, 7, 6));
    EXPECT(slot_reclaim_epoch(w, 8, 7, &freed, &returned) == 0);
    EXPECT(freed == 0 && returned == 0);
}

/* 8 processes race for the same FREE word many times; exactly one claim wins each round. */
TEST(cross_process_claim_race)
{
    enum { NPROC = 8, ROUNDS = 2000 };
    struct shared { slot_word w[ROUNDS]; _Atomic int wins[ROUNDS]; } *sh;
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(sh != MAP_FAILED);
    pid_t pids[NPROC];
    for (int p = 0; p < NPROC; p++) {
        pids[p] = fork();
        REQUIRE(pids[p] >= 0);
        if (pids[p] == 0) {
            for (int r = 0; r < ROUNDS; r++)
                if (slot_claim(&sh->w[r], (uint16_t)p, (uint64_t)p + 1) == 0) atomic_fetch_add(&sh->wins[r], 1);
            _exit(0);
        }
    }
    for (int p = 0; p < NPROC; p++) {
        int st;
        REQUIRE(waitpid(pids[p], &st, 0) == pids[p] && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    int bad = 0;
    for (int r = 0; r < ROUNDS; r++) {
        bad += atomic_load(&sh->wins[r]) != 1;
        bad += slot_word_state(sh->w[r]) != SLOT_STATE_FILLING;
    }
    EXPECT(bad == 0);
    munmap(sh, sizeof *sh);
}

TEST_MAIN

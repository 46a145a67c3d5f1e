/* The evaluation worker's rules in common/job: which steps it evaluates (job_eval_next, the one rule dflash-eval
 * and dflashd count by), the config check of eval.every against train.checkpoint_every, and the job state's
 * result (job_eval_publish / job_eval_read). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "job_config.h"
#include "job_state.h"
#include "tests/test.h"

static job_config cfg_with(int every, int checkpoint_every, const char *prompts)
{
    job_config c;
    config_defaults(job_config_table, &c);
    c.eval.every = every;
    c.train.checkpoint_every = checkpoint_every;
    snprintf(c.eval.prompts, sizeof c.eval.prompts, "%s", prompts);
    return c;
}

TEST(next_step_every_n_and_the_last)
{
    job_config c = cfg_with(10, 10, "p.jsonl");
    EXPECT(job_eval_next(&c, 0, 30) == 10);  /* step 0 (untrained) is not evaluated */
    EXPECT(job_eval_next(&c, 10, 30) == 10); /* done = the last evaluated step + 1: 9 evaluated, 10 next */
    EXPECT(job_eval_next(&c, 11, 30) == 20);
    EXPECT(job_eval_next(&c, 21, 30) == 30);
    EXPECT(job_eval_next(&c, 31, 30) == UINT64_MAX);
    EXPECT(job_eval_next(&c, 21, 25) == 25); /* the last step (a drain, steps not a multiple) */
    EXPECT(job_eval_next(&c, 26, 25) == UINT64_MAX);
    c = cfg_with(0, 20, "p.jsonl"); /* 0: every checkpoint */
    EXPECT(job_eval_next(&c, 0, 50) == 20);
    EXPECT(job_eval_next(&c, 41, 50) == 50);
    c = cfg_with(0, 0, "p.jsonl"); /* checkpoints only at the end: the last step only */
    EXPECT(job_eval_next(&c, 0, 50) == 50);
    c = cfg_with(10, 10, ""); /* off */
    EXPECT(job_eval_next(&c, 0, 50) == UINT64_MAX);
}

TEST(every_must_be_a_checkpoint)
{
    char *dir = test_tmpdir(), path[4096];
    snprintf(path, sizeof path, "%s/job.ini", dir);
    const char *ini = "[train]\ncheckpoint_every = 10\n[eval]\nprompts = p.jsonl\nevery = 15\n";
    test_write_file(path, ini, strlen(ini));
    job_config c;
    errbuf err = {{0}};
    EXPECT(job_config_load(&c, path, NULL, 0, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "eval.every = 15 is not a multiple of train.checkpoint_every = 10");
    const char *ok[] = {"eval.every=20"};
    EXPECT(job_config_load(&c, path, ok, 1, &err) == 0);
    const char *off[] = {"eval.prompts="}; /* no evaluation: eval.every is not checked */
    EXPECT(job_config_load(&c, path, off, 1, &err) == 0);
    unlink(path);
    rmdir(dir);
}

TEST(result_published_and_read)
{
    char name[64];
    snprintf(name, sizeof name, "/dflash-test-eval-%d", (int)getpid());
    job_state js;
    errbuf err = {{0}};
    REQUIRE(job_state_create(&js, name, "r", 1, 10, 30, &err) == 0);
    job_eval r = {0};
    EXPECT(job_eval_read(&js, &r) == -EAGAIN); /* none yet */
    job_eval w = {.step = 20, .prompts = 64, .block_size = 4, .tau = 2.31, .speedup = 1.5, .seconds = 3};
    w.per_slot[1] = 0.5, w.per_slot[3] = 0.125;
    job_eval_publish(&js, &w);
    REQUIRE(job_eval_read(&js, &r) == 0);
    EXPECT(r.step == 20 && r.prompts == 64 && r.block_size == 4 && r.tau == 2.31 && r.per_slot[3] == 0.125);
    EXPECT(atomic_load(&r.done) == 21 && atomic_load(&js.h->eval.done) == 21);
    atomic_fetch_add(&js.h->eval.seq, 1); /* a writer killed in the middle: readers see nothing consistent... */
    EXPECT(job_eval_read(&js, &r) == -EAGAIN);
    w.step = 30;
    job_eval_publish(&js, &w); /* ...until the next writer publishes whole */
    REQUIRE(job_eval_read(&js, &r) == 0);
    EXPECT(r.step == 30 && atomic_load(&r.done) == 31);
    job_state_close(&js);
    shm_segment_unlink(name, NULL);
}

TEST_MAIN

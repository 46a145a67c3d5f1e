/* What a job checks at start and at --resume (issue 19, items 2, 4, 7, 8, 15): the step-plan settings and the data
 * set's identity (run_record), a shard changing under its mapping (every way), the anchor rule a trainable sample
 * needs, settings wrong together, the form of a --set. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

#include "anchors.h"
#include "config.h"
#include "job_config.h"
#include "run_record.h"
#include "shard.h"
#include "tests/test.h"

static void record_fill(run_record *r)
{
    memset(r, 0, sizeof *r);
    for (int i = 0; run_record_plan_keys[i]; i++) {
        snprintf(r->values[i], sizeof r->values[i], "%d", 10 + i);
        r->nkeys = i + 1;
    }
    r->nshards = 2;
    r->shards = xcalloc(2, sizeof *r->shards);
    for (int k = 0; k < 2; k++) {
        snprintf(r->shards[k].name, sizeof r->shards[k].name, "shard-%05d.shard", k);
        snprintf(r->shards[k].path, sizeof r->shards[k].path, "/d/shard-%05d.shard", k);
        r->shards[k].bytes = 1000 + (uint64_t)k;
        snprintf(r->shards[k].header_digest, sizeof r->shards[k].header_digest, "%016x", 77 + k);
    }
    snprintf(r->data_path, sizeof r->data_path, "/d");
    step_plan_init(&r->plan, 2, 2);
}

TEST(every_step_plan_setting_changed_is_refused_naming_it_and_both_values)
{
    const char *must[] = {"job.seed", "data.max_batch_tokens", "data.max_batch_seqs", "drafter.block_size",
                          "drafter.max_anchors", "drafter.mask_token_id", NULL};
    int n = 0;
    for (; run_record_plan_keys[n]; n++) {}
    EXPECT(n == 6);
    for (int i = 0; must[i]; i++) {
        int found = 0;
        for (int k = 0; run_record_plan_keys[k]; k++) found |= !strcmp(must[i], run_record_plan_keys[k]);
        EXPECT(found);
    }
    run_record was, now;
    record_fill(&was);
    record_fill(&now);
    errbuf err = {{0}};
    EXPECT(run_record_check_settings(&was, &now, "run.json", &err) == 0);
    for (int i = 0; i < n; i++) {
        record_fill(&now);
        snprintf(now.values[i], sizeof now.values[i], "999");
        memset(&err, 0, sizeof err);
        EXPECT(run_record_check_settings(&was, &now, "run.json", &err) == -EINVAL);
        char want[256];
        snprintf(want, sizeof want, "%s = 999, but the run was started with %s = %d (run.json)",
                 run_record_plan_keys[i], run_record_plan_keys[i], 10 + i);
        EXPECT_CONTAINS(err.msg, want);
        EXPECT_CONTAINS(err.msg, "Safe to change on a resume: workers.drafters and workers.targets");
        run_record_free(&now);
    }
    run_record_free(&was);
}

TEST(a_changed_data_set_is_refused_naming_the_shard)
{
    run_record was, now;
    record_fill(&was);
    errbuf err = {{0}};
    struct { const char *what, *want; } cases[] = {
        {"bytes", "shard /d/shard-00001.shard is 5 bytes"},
        {"digest", "shard /d/shard-00000.shard is 1000 bytes with header digest 00000000000000ff"},
        {"name", "shard 2 is /d/other.shard, the job started with /d/shard-00001.shard"},
        {"missing", "shard shard-00001.shard (shard 2 of 2) is missing from data.path /d"},
        {"added", "shard /d/new.shard is new (the job started with 2 shards"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        record_fill(&now);
        if (!strcmp(cases[c].what, "bytes")) now.shards[1].bytes = 5;
        if (!strcmp(cases[c].what, "digest")) snprintf(now.shards[0].header_digest, 17, "%016x", 255);
        if (!strcmp(cases[c].what, "name")) {
            snprintf(now.shards[1].name, sizeof now.shards[1].name, "other.shard");
            snprintf(now.shards[1].path, sizeof now.shards[1].path, "/d/other.shard");
        }
        if (!strcmp(cases[c].what, "missing")) now.nshards = 1;
        if (!strcmp(cases[c].what, "added")) {
            now.shards = xrealloc(now.shards, 3 * sizeof *now.shards);
            now.shards[2] = now.shards[1];
            snprintf(now.shards[2].name, sizeof now.shards[2].name, "new.shard");
            snprintf(now.shards[2].path, sizeof now.shards[2].path, "/d/new.shard");
            now.nshards = 3;
        }
        memset(&err, 0, sizeof err);
        EXPECT(run_record_check_data(&was, &now, "run.json", "--resume", &err) == -EINVAL);
        EXPECT_CONTAINS(err.msg, "--resume: the data set changed: ");
        EXPECT_CONTAINS(err.msg, cases[c].want);
        run_record_free(&now);
    }
    record_fill(&now);
    snprintf(now.shards[0].path, sizeof now.shards[0].path, "/moved/shard-00000.shard"); /* moved: the same data */
    EXPECT(run_record_check_data(&was, &now, "run.json", "--resume", &err) == 0);
    run_record_free(&now);
    run_record_free(&was);
}

TEST(a_record_reads_back_as_written)
{
    char dir[] = "/tmp/dflash-run-record-XXXXXX", path[256];
    REQUIRE(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/run.json", dir);
    run_record was, back;
    errbuf err = {{0}};
    EXPECT(run_record_read(&back, path, &err) == -ENOENT);
    record_fill(&was);
    REQUIRE(run_record_write(&was, path, &err) == 0);
    REQUIRE(run_record_read(&back, path, &err) == 0);
    EXPECT(run_record_check_settings(&was, &back, path, &err) == 0);
    EXPECT(run_record_check_data(&was, &back, path, "--resume", &err) == 0);
    EXPECT(back.nshards == 2 && back.shards[1].bytes == 1001);
    run_record_free(&was);
    run_record_free(&back);
    unlink(path);
    rmdir(dir);
}

/* The plan across resumes 2 -> 3 -> 1 drafters (and 2 -> 1 targets): batch ids contiguous, each once; a resume from
 * an earlier checkpoint cuts the segments after it; a checkpoint whose frontier the plan does not give is refused. */
TEST(a_resume_onto_other_worker_counts_continues_the_batches)
{
    run_record r0, r1, r2, r3;
    record_fill(&r0);
    step_plan_init(&r0.plan, 2, 2);
    errbuf err = {{0}};
    record_fill(&r1);
    step_plan_init(&r1.plan, 3, 2);
    EXPECT(run_record_resume(&r0, &r1, 10, 20, "run.json", &err) == 1);   /* step 10: 20 batches committed */
    EXPECT(r1.plan.n == 2 && r1.plan.seg[1].from_step == 10 && r1.plan.seg[1].first_batch == 20);
    EXPECT(step_plan_batch(&r1.plan, 9, 1) == 19 && step_plan_batch(&r1.plan, 10, 0) == 20 &&
           step_plan_batch(&r1.plan, 12, 2) == 28);
    record_fill(&r2);
    step_plan_init(&r2.plan, 1, 1);
    EXPECT(run_record_resume(&r1, &r2, 20, 50, "run.json", &err) == 1);   /* 20 + 10 x 3 */
    EXPECT(r2.plan.n == 3 && step_plan_first_batch(&r2.plan, 25) == 55 && step_plan_drafters(&r2.plan, 25) == 1);
    /* every batch once, in step order, across the three segments */
    uint64_t next = 0;
    int once = 1;
    for (uint64_t k = 0; k < 40; k++)
        for (uint32_t r = 0; r < step_plan_drafters(&r2.plan, k); r++) {
            once &= step_plan_batch(&r2.plan, k, r) == next && step_plan_step_of(&r2.plan, next) == k;
            next++;
        }
    EXPECT(once && next == 20 + 30 + 20);
    EXPECT(step_plan_steps_covering(&r2.plan, 51) == 21 && step_plan_steps_covering(&r2.plan, 50) == 20);
    /* the same counts again: no new segment; a resume from step 15 (inside the 3-drafter segment) cuts the rest */
    record_fill(&r3);
    step_plan_init(&r3.plan, 1, 1);
    EXPECT(run_record_resume(&r2, &r3, 30, 60, "run.json", &err) == 0 && r3.plan.n == 3);
    run_record_free(&r3);
    record_fill(&r3);
    step_plan_init(&r3.plan, 3, 2);
    EXPECT(run_record_resume(&r2, &r3, 15, 35, "run.json", &err) == 0 && r3.plan.n == 2);
    /* a frontier the plan does not give: not this run's checkpoint */
    EXPECT(run_record_resume(&r2, &r3, 15, 36, "run.json", &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "the checkpoint of step 15 has 36 batches committed, but run.json's plan puts 35");
    /* written and read back; a record without a plan (older) reads as one segment of its settings */
    char dir[] = "/tmp/dflash-run-plan-XXXXXX", path[256];
    REQUIRE(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/run.json", dir);
    run_record back;
    REQUIRE(run_record_write(&r2, path, &err) == 0);
    REQUIRE(run_record_read(&back, path, &err) == 0);
    EXPECT(back.plan.n == 3 && !memcmp(back.plan.seg, r2.plan.seg, 3 * sizeof back.plan.seg[0]));
    run_record_free(&back);
    FILE *f = fopen(path, "w");
    fputs("{\"settings\": {\"workers.drafters\": \"4\", \"workers.targets\": \"2\"}, \"shards\": []}", f);
    fclose(f);
    REQUIRE(run_record_read(&back, path, &err) == 0);
    EXPECT(back.plan.n == 1 && back.plan.seg[0].drafters == 4 && back.plan.seg[0].targets == 2);
    run_record_free(&back);
    f = fopen(path, "w");
    fputs("{\"settings\": {}, \"plan\": [{\"from_step\": 0, \"first_batch\": 0, \"drafters\": 2, \"targets\": 1}, "
          "{\"from_step\": 5, \"first_batch\": 9, \"drafters\": 1, \"targets\": 1}], \"shards\": []}", f);
    fclose(f);
    EXPECT(run_record_read(&back, path, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "plan[1] (from_step 5, first_batch 9, 1 drafters, 1 targets) does not continue");
    unlink(path);
    rmdir(dir);
    run_record_free(&r0); run_record_free(&r1); run_record_free(&r2); run_record_free(&r3);
}

static void write_shard(const char *path, uint32_t first)
{
    shard_writer *w;
    errbuf err = {{0}};
    REQUIRE(shard_writer_open(&w, path, &err) == 0);
    uint32_t tok[64];
    uint8_t mask[64];
    for (int i = 0; i < 64; i++) { tok[i] = first + (uint32_t)i; mask[i] = i > 8; }
    REQUIRE(shard_writer_add(w, tok, mask, 64, &err) == 0);
    REQUIRE(shard_writer_close(&w, &err) == 0);
}

TEST(a_shard_changed_under_its_mapping_is_named_every_way)
{
    char dir[] = "/tmp/dflash-shard-change-XXXXXX", path[256], other[256];
    REQUIRE(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/a.shard", dir);
    snprintf(other, sizeof other, "%s/b.tmp", dir);
    const char *ways[] = {"replaced", "overwritten", "truncated", "removed"};
    const char *want[] = {"was replaced by another file", "was overwritten in place", "was truncated or resized",
                          "is gone since it was opened"};
    for (int k = 0; k < 4; k++) {
        write_shard(path, 1);
        /* an mtime well in the past, so that a write now surely moves it */
        struct timespec past[2] = {{1000000000, 0}, {1000000000, 0}};
        REQUIRE(utimensat(AT_FDCWD, path, past, 0) == 0);
        shard *s;
        errbuf err = {{0}};
        REQUIRE(shard_open(&s, path, &err) == 0);
        EXPECT(shard_check_unchanged(s, &err) == 0);
        EXPECT(shard_file_bytes(s) > 64);
        if (k == 0) {
            write_shard(other, 2);
            REQUIRE(rename(other, path) == 0);
        } else if (k == 1) {
            int fd = open(path, O_WRONLY);
            REQUIRE(fd >= 0);
            REQUIRE(pwrite(fd, "\x5a", 1, 100) == 1);
            close(fd);
        } else if (k == 2) {
            REQUIRE(truncate(path, 80) == 0);
        } else {
            REQUIRE(unlink(path) == 0);
        }
        memset(&err, 0, sizeof err);
        EXPECT(shard_check_unchanged(s, &err) != 0);
        EXPECT_CONTAINS(err.msg, path);
        EXPECT_CONTAINS(err.msg, want[k]);
        if (test_failed_here) fprintf(stderr, "  (the shard %s)\n", ways[k]);
        shard_close(&s);
        unlink(path);
    }
    rmdir(dir);
}

TEST(the_dataset_names_a_folder_s_shards_without_a_double_slash)
{
    char dir[] = "/tmp/dflash-shard-slash-XXXXXX", path[256], arg[256];
    REQUIRE(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/a.shard", dir);
    write_shard(path, 1);
    snprintf(arg, sizeof arg, "%s//", dir);
    dataset *ds;
    errbuf err = {{0}};
    REQUIRE(dataset_open(&ds, arg, &err) == 0);
    EXPECT(!strcmp(shard_path(dataset_shard(ds, 0)), path));
    dataset_close(&ds);
    unlink(path);
    rmdir(dir);
}

TEST(a_sample_is_trainable_only_with_two_trained_tokens_in_a_row_within_the_batch)
{
    const uint8_t m[] = {0, 0, 1, 0, 1, 1, 1};
    EXPECT(!anchors_any(m, 0));
    EXPECT(!anchors_any(m, 4)); /* a trained token alone has no anchor */
    EXPECT(!anchors_any(m, 5));
    EXPECT(anchors_any(m, 6));
    EXPECT(anchors_any(m, 7));
}

static int load_with(const char *text, const char *const *ov, int nov, errbuf *err)
{
    char path[] = "/tmp/dflash-cfg-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
    job_config c;
    int rc = job_config_load(&c, path, ov, nov, err);
    unlink(path);
    return rc;
}

TEST(min_lr_above_lr_is_refused_naming_both)
{
    errbuf err = {{0}};
    EXPECT(load_with("[train]\nlr = 1e-3\nmin_lr = 1e-4\n", NULL, 0, &err) == 0);
    EXPECT(load_with("[train]\nlr = 1e-3\nmin_lr = 1e-3\n", NULL, 0, &err) == 0);
    EXPECT(load_with("[train]\nlr = 1e-3\nmin_lr = 1e-2\n", NULL, 0, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "train.min_lr = 0.01 is above train.lr = 0.001");
    const char *ov[] = {"train.min_lr=0.5"};
    memset(&err, 0, sizeof err);
    EXPECT(load_with("[train]\nlr = 1e-3\n", ov, 1, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "--set train.min_lr=0.5: train.min_lr = 0.5 is above train.lr = 0.001");
}

TEST(a_set_without_equals_is_not_well_formed)
{
    EXPECT(config_arg_well_formed("train.lr=1"));
    EXPECT(config_arg_well_formed("train.lr="));
    EXPECT(!config_arg_well_formed("x"));
    EXPECT(!config_arg_well_formed("=1"));
    EXPECT(!config_arg_well_formed(""));
}

TEST_MAIN

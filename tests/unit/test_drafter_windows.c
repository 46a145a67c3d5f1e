/* Drafter sliding-window layers in a job: drafter.layer_types / drafter.sliding_window read and checked when the
 * job config loads (errors name the setting, its source and the value), carried into the job's drafter config,
 * exported in the config.json z-lab's model.py reads, refused when they disagree with drafter.init's checkpoint. */
#include <errno.h>
#include <jansson.h>

#include "hf_config.h"
#include "job_config.h"
#include "job_plan.h"
#include "tests/test.h"

/* A job file on the tiny golden target with these [drafter] lines; returns its path (static buffer). */
static const char *job_file(const char *dir, const char *drafter_lines)
{
    static char path[700];
    snprintf(path, sizeof path, "%s/job.ini", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fprintf(f, "[job]\nrun_dir = %s/run\n[data]\npath = %s/none.shard\n[target]\nmodel = %s\n[drafter]\n%s\n", dir,
            dir, test_golden("tiny/target"), drafter_lines);
    fclose(f);
    return path;
}

static int load_cfg(const char *dir, const char *lines, const char *const *ov, int nov, job_config *c, errbuf *err)
{
    memset(err, 0, sizeof *err);
    return job_config_load(c, job_file(dir, lines), ov, nov, err);
}

TEST(job_config_reads_and_checks_layer_types)
{
    char *dir = test_tmpdir();
    job_config c;
    errbuf err;
    REQUIRE(load_cfg(dir, "layers = 3\nlayer_types = sliding_attention, full_attention,sliding\nsliding_window = 64",
                     NULL, 0, &c, &err) == 0);
    EXPECT(c.drafter.nlayer_types == 3 && c.drafter.sliding_window == 64);
    EXPECT(c.drafter.sliding[0] == 1 && c.drafter.sliding[1] == 0 && c.drafter.sliding[2] == 1);
    REQUIRE(load_cfg(dir, "layers = 2", NULL, 0, &c, &err) == 0); /* the default: no window anywhere */
    EXPECT(c.drafter.nlayer_types == 0 && c.drafter.sliding_window == 0);

    EXPECT(load_cfg(dir, "layers = 3\nlayer_types = full,sliding\nsliding_window = 8", NULL, 0, &c, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "drafter.layer_types has 2 entries, drafter.layers = 3: one per layer");
    EXPECT_CONTAINS(err.msg, "job.ini");
    EXPECT(load_cfg(dir, "layers = 2\nlayer_types = full,local\nsliding_window = 8", NULL, 0, &c, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "drafter.layer_types: entry 2 is \"local\" (expected full_attention or sliding_attention)");
    EXPECT(load_cfg(dir, "layers = 2\nlayer_types = full,sliding", NULL, 0, &c, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "names 1 sliding_attention layer and drafter.sliding_window = 0");
    EXPECT(load_cfg(dir, "layers = 2\nsliding_window = 8", NULL, 0, &c, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "drafter.sliding_window = 8 but drafter.layer_types names no sliding_attention layer");
    /* a --set that makes it wrong is named as the source */
    const char *ov[] = {"drafter.layers=4"};
    EXPECT(load_cfg(dir, "layers = 2\nlayer_types = full,sliding\nsliding_window = 8", ov, 1, &c, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "--set drafter.layers=4: drafter.layer_types has 2 entries, drafter.layers = 4");
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    EXPECT(system(cmd) == 0);
}

TEST(job_drafter_carries_and_exports_the_windows)
{
    char *dir = test_tmpdir();
    job_plan p;
    errbuf err = {{0}};
    int rc = job_plan_load(&p, job_file(dir, "layers = 3\nlayer_types = sliding,full,sliding\nsliding_window = 5\n"
                                             "num_taps = 3"), NULL, 0, &err);
    if (rc) fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(rc == 0);
    EXPECT(p.drafter.num_layers == 3 && p.drafter.sliding_window == 5);
    EXPECT(hf_layer_window(&p.drafter, 0) == 5 && hf_layer_window(&p.drafter, 1) == 0 &&
           hf_layer_window(&p.drafter, 2) == 5);

    /* the checkpoint's config.json: what z-lab's model.py needs to apply the window as dflash trained it */
    char cfgpath[700];
    snprintf(cfgpath, sizeof cfgpath, "%s/config.json", dir);
    REQUIRE(hf_config_write_dflash(&p.drafter, cfgpath, &err) == 0);
    json_error_t je;
    json_t *j = json_load_file(cfgpath, 0, &je);
    REQUIRE(j);
    json_t *lt = json_object_get(j, "layer_types");
    REQUIRE(json_array_size(lt) == 3);
    EXPECT(!strcmp(json_string_value(json_array_get(lt, 0)), "sliding_attention"));
    EXPECT(!strcmp(json_string_value(json_array_get(lt, 1)), "full_attention"));
    EXPECT(json_integer_value(json_object_get(j, "sliding_window")) == 5);
    EXPECT(json_is_true(json_object_get(j, "use_sliding_window")) && json_is_false(json_object_get(j, "is_causal")));
    json_decref(j);
    hf_config back; /* what dflash eval / generate read (drafter_model_load) */
    REQUIRE(hf_config_load(&back, cfgpath, &err) == 0);
    EXPECT(back.sliding_window == 5 && !memcmp(back.layer_sliding, p.drafter.layer_sliding, sizeof back.layer_sliding));

    /* drafter.init: the checkpoint's windows, unless the job names others */
    char lines[900];
    snprintf(lines, sizeof lines, "init = %s", dir);
    REQUIRE(job_plan_load(&p, job_file(dir, lines), NULL, 0, &err) == 0);
    EXPECT(p.drafter.sliding_window == 5 && p.drafter.layer_sliding[2] == 1);
    snprintf(lines, sizeof lines, "init = %s\nlayer_types = sliding,full,full\nsliding_window = 5", dir);
    EXPECT(job_plan_load(&p, job_file(dir, lines), NULL, 0, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "disagree with drafter.init");
    EXPECT_CONTAINS(err.msg, "layer_types sliding,full,sliding, sliding_window 5");
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    EXPECT(system(cmd) == 0);
}

TEST_MAIN

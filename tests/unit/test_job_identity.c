/* job_identity_checkpoint: the words a kept target's weights are checked against (target_cuda_keep). The same folder
 * gives the same words; a changed config, a weights file rewritten where the sampled digest does not look, or one
 * more file gives other words; a folder that is not there is named. */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "job_identity.h"
#include "tests/test.h"

#define BIG (4u << 20) /* larger than the digest's samples cover (16 x 64 KiB spread + head + tail) */

static void checkpoint(const char *dir, char fill)
{
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir);
    test_write_file(p, "{\"hidden_size\": 8}\n", 19);
    char *w = malloc(BIG);
    REQUIRE(w);
    memset(w, fill, BIG);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    test_write_file(p, w, BIG);
    free(w);
}

static void remove_checkpoint(const char *dir)
{
    const char *names[] = {"config.json", "model.safetensors", "model-00002.safetensors"};
    char p[512];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
}

static void identity(const char *dir, char *out, size_t n)
{
    errbuf err = {{0}};
    int rc = job_identity_checkpoint(dir, out, n, &err);
    if (rc) fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(rc == 0);
}

TEST(same_folder_same_identity)
{
    char *dir = test_tmpdir(), a[1280], b[1280];
    checkpoint(dir, 1);
    identity(dir, a, sizeof a);
    identity(dir, b, sizeof b);
    EXPECT(!strcmp(a, b));
    EXPECT_CONTAINS(a, dir);
    EXPECT_CONTAINS(a, "1 safetensors files of 4194304 bytes");
    remove_checkpoint(dir);
}

TEST(changed_config_changes_identity)
{
    char *dir = test_tmpdir(), a[1280], b[1280], p[512];
    checkpoint(dir, 1);
    identity(dir, a, sizeof a);
    snprintf(p, sizeof p, "%s/config.json", dir);
    test_write_file(p, "{\"hidden_size\": 9}\n", 19);
    identity(dir, b, sizeof b);
    EXPECT(strcmp(a, b) != 0);
    remove_checkpoint(dir);
}

/* one byte changed in place between the samples, same size: the sampled digest (job_identity_target) stays, the
 * file's modification time does not */
TEST(weights_rewritten_between_samples_change_identity)
{
    char *dir = test_tmpdir(), a[1280], b[1280], p[512], c0[17], w0[17], c1[17], w1[17];
    errbuf err = {{0}};
    checkpoint(dir, 1);
    identity(dir, a, sizeof a);
    REQUIRE(job_identity_target(dir, c0, w0, &err) == 0);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    struct stat st0;
    REQUIRE(stat(p, &st0) == 0);
    usleep(20000); /* a later modification time than the first write, also on coarse clocks */
    FILE *f = fopen(p, "r+b");
    REQUIRE(f);
    REQUIRE(fseek(f, 70000, SEEK_SET) == 0); /* after the head sample, before the first spread sample */
    REQUIRE(fputc(2, f) == 2);
    fclose(f);
    REQUIRE(job_identity_target(dir, c1, w1, &err) == 0);
    EXPECT(!strcmp(w0, w1)); /* what the sampled digest alone would miss */
    identity(dir, b, sizeof b);
    EXPECT(strcmp(a, b) != 0);
    remove_checkpoint(dir);
}

TEST(another_file_changes_identity)
{
    char *dir = test_tmpdir(), a[1280], b[1280], p[512];
    checkpoint(dir, 1);
    identity(dir, a, sizeof a);
    snprintf(p, sizeof p, "%s/model-00002.safetensors", dir);
    test_write_file(p, "x", 1);
    identity(dir, b, sizeof b);
    EXPECT(strcmp(a, b) != 0);
    EXPECT_CONTAINS(b, "2 safetensors files");
    remove_checkpoint(dir);
}

TEST(missing_folder_is_named)
{
    char out[1280];
    errbuf err = {{0}};
    EXPECT(job_identity_checkpoint("/nonexistent/dflash-ckpt", out, sizeof out, &err) < 0);
    EXPECT_CONTAINS(err.msg, "/nonexistent/dflash-ckpt");
}

TEST_MAIN

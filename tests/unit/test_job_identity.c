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

/* job_identity_check on the drafter's attention windows: the same parameter count with other windows is refused
 * naming both; an identity written before windows were recorded (read back with none) is not compared on them. */
TEST(other_drafter_windows_are_another_drafter)
{
    char *dir = test_tmpdir(), path[512];
    snprintf(path, sizeof path, "%s/identity.json", dir);
    job_identity was = {.layers = 2, .hidden = 8, .vocab = 16, .ntaps = 1, .taps = {1}, .drafter_parameters = 100};
    snprintf(was.target, sizeof was.target, "t");
    snprintf(was.config_digest, sizeof was.config_digest, "0123456789abcdef");
    snprintf(was.weights_digest, sizeof was.weights_digest, "0123456789abcdef");
    snprintf(was.drafter_windows, sizeof was.drafter_windows, "full");
    job_identity now = was, back;
    snprintf(now.drafter_windows, sizeof now.drafter_windows, "layer_types full,sliding, sliding_window 8");
    errbuf err = {{0}};
    REQUIRE(job_identity_write(&was, path, &err) == 0);
    REQUIRE(job_identity_read(&back, path, &err) == 0);
    EXPECT(!strcmp(back.drafter_windows, "full"));
    EXPECT(job_identity_check(&back, &was, path, &err) == 0);
    EXPECT(job_identity_check(&back, &now, path, &err) != 0);
    EXPECT_CONTAINS(err.msg, "mismatch of the drafter shape");
    EXPECT_CONTAINS(err.msg, "a drafter of 100 parameters, attention full;");
    EXPECT_CONTAINS(err.msg, "attention layer_types full,sliding, sliding_window 8");
    back.drafter_windows[0] = 0; /* as read from an identity.json without "drafter_windows" */
    EXPECT(job_identity_check(&back, &now, path, &err) == 0);
    unlink(path);
    rmdir(dir);
}

TEST_MAIN

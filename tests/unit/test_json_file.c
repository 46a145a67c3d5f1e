/* Every reader of a JSON file says where a parse error is (path:line) and, for a file it cannot read, only the path
 * and the reason: jansson gives line -1 there, which was printed as "tokenizer.json:-1: unable to open ...". */
#include <errno.h>
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chat_template.h"
#include "hf_config.h"
#include "job_identity.h"
#include "json_util.h"
#include "safetensors.h"
#include "tests/test.h"
#include "tokenizer.h"

static const char BAD[] = "{\n  \"model\":\n"; /* ends inside an object: the error is on line 3 */

/* the message names want and gives no position jansson does not have */
#define EXPECT_MSG(msg, want)                                                       \
    do { EXPECT_CONTAINS(msg, want); EXPECT(!strstr(msg, ":-1")); EXPECT(!strstr(msg, "unable to open")); } while (0)

static void path_in(char *out, size_t n, const char *dir, const char *name) { snprintf(out, n, "%s/%s", dir, name); }

TEST(json_file_load_says_line_or_reason)
{
    char *dir = test_tmpdir(), p[512], want[600];
    json_t *j = (json_t *)1;
    errbuf err = {{0}};
    path_in(p, sizeof p, dir, "missing.json");
    EXPECT(json_file_load(&j, p, 0, &err) == -ENOENT && !j);
    snprintf(want, sizeof want, "%s: No such file or directory", p);
    EXPECT(strcmp(err.msg, want) == 0);
    EXPECT(json_file_load(&j, dir, 0, &err) == -EISDIR);
    snprintf(want, sizeof want, "%s: Is a directory", dir);
    EXPECT(strcmp(err.msg, want) == 0);
    path_in(p, sizeof p, dir, "bad.json");
    test_write_file(p, BAD, strlen(BAD));
    EXPECT(json_file_load(&j, p, 0, &err) == -EINVAL);
    snprintf(want, sizeof want, "%s:3: invalid JSON: ", p);
    EXPECT_MSG(err.msg, want);
    test_write_file(p, "{}\n [1]", 7);
    EXPECT(json_file_load(&j, p, 0, &err) == -EINVAL);
    snprintf(want, sizeof want, "%s:2:2: invalid JSON: end of file expected", p);
    EXPECT_MSG(err.msg, want);
    test_write_file(p, "{\"a\": 1}", 8);
    EXPECT(json_file_load(&j, p, 0, &err) == 0 && json_integer_value(json_object_get(j, "a")) == 1);
    json_decref(j);
    unlink(p);
    rmdir(dir);
}

TEST(tokenizer_load_missing_or_bad)
{
    char *dir = test_tmpdir(), p[512], want[600];
    tokenizer *t;
    errbuf err = {{0}};
    path_in(p, sizeof p, dir, "tokenizer.json");
    EXPECT(tokenizer_load(&t, dir, &err) == -ENOENT);
    snprintf(want, sizeof want, "%s: No such file or directory", p);
    EXPECT_MSG(err.msg, want);
    test_write_file(p, BAD, strlen(BAD));
    EXPECT(tokenizer_load(&t, dir, &err) == -EINVAL);
    snprintf(want, sizeof want, "%s:3: invalid JSON", p);
    EXPECT_MSG(err.msg, want);
    unlink(p);
    rmdir(dir);
}

TEST(chat_template_detect_missing_or_bad)
{
    char *dir = test_tmpdir(), p[512], want[600];
    enum chat_template_kind k;
    errbuf err = {{0}};
    path_in(p, sizeof p, dir, "tokenizer_config.json");
    EXPECT(chat_template_detect(p, &k, &err) == -ENOENT);
    snprintf(want, sizeof want, "%s: No such file or directory", p);
    EXPECT_MSG(err.msg, want);
    test_write_file(p, BAD, strlen(BAD));
    EXPECT(chat_template_detect(p, &k, &err) == -EINVAL);
    snprintf(want, sizeof want, "%s:3: invalid JSON", p);
    EXPECT_MSG(err.msg, want);
    unlink(p);
    rmdir(dir);
}

TEST(hf_eos_tokens_unreadable_or_bad)
{
    char *dir = test_tmpdir(), p[512], want[600];
    int32_t eos[4];
    int n;
    errbuf err = {{0}};
    path_in(p, sizeof p, dir, "generation_config.json");
    EXPECT(mkdir(p, 0755) == 0); /* exists, so it is read, but cannot be */
    EXPECT(hf_eos_tokens(dir, 100, eos, 4, &n, &err) == -EISDIR);
    snprintf(want, sizeof want, "%s: Is a directory", p);
    EXPECT_MSG(err.msg, want);
    rmdir(p);
    test_write_file(p, BAD, strlen(BAD));
    EXPECT(hf_eos_tokens(dir, 100, eos, 4, &n, &err) == -EINVAL);
    snprintf(want, sizeof want, "%s:3: invalid JSON", p);
    EXPECT_MSG(err.msg, want);
    unlink(p);
    rmdir(dir);
}

TEST(safetensors_index_unreadable_or_bad)
{
    char *dir = test_tmpdir(), p[512], want[600];
    st_file *f;
    errbuf err = {{0}};
    path_in(p, sizeof p, dir, "model.safetensors.index.json");
    EXPECT(mkdir(p, 0755) == 0);
    EXPECT(st_open(&f, dir, &err) == -EISDIR);
    snprintf(want, sizeof want, "%s: Is a directory", p);
    EXPECT_MSG(err.msg, want);
    rmdir(p);
    test_write_file(p, BAD, strlen(BAD));
    EXPECT(st_open(&f, dir, &err) == -EINVAL);
    snprintf(want, sizeof want, "%s:3: invalid JSON", p);
    EXPECT_MSG(err.msg, want);
    unlink(p);
    rmdir(dir);
}

TEST(job_identity_read_unreadable_or_bad)
{
    char *dir = test_tmpdir(), p[512], want[600];
    job_identity id;
    errbuf err = {{0}};
    path_in(p, sizeof p, dir, "identity.json");
    EXPECT(job_identity_read(&id, p, &err) == -ENOENT);
    EXPECT(mkdir(p, 0755) == 0);
    EXPECT(job_identity_read(&id, p, &err) == -EISDIR);
    snprintf(want, sizeof want, "%s: Is a directory", p);
    EXPECT_MSG(err.msg, want);
    rmdir(p);
    test_write_file(p, BAD, strlen(BAD));
    EXPECT(job_identity_read(&id, p, &err) == -EINVAL);
    snprintf(want, sizeof want, "%s:3: invalid JSON", p);
    EXPECT_MSG(err.msg, want);
    unlink(p);
    rmdir(dir);
}

TEST_MAIN

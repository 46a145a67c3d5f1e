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

/* One reader of a JSON file: path is its file inside dir (each reader finds it from dir or takes it whole). */
static int read_tokenizer(const char *dir, const char *path, errbuf *err)
{
    tokenizer *t = NULL;
    (void)path;
    int rc = tokenizer_load(&t, dir, err);
    tokenizer_destroy(&t);
    return rc;
}
static int read_chat_template(const char *dir, const char *path, errbuf *err)
{
    chat_template *t = NULL;
    (void)path;
    int rc = chat_template_load(&t, dir, NULL, err);
    chat_template_destroy(&t);
    return rc;
}
static int read_eos(const char *dir, const char *path, errbuf *err)
{
    int32_t eos[4];
    int n;
    (void)path;
    return hf_eos_tokens(dir, 100, eos, 4, &n, err);
}
static int read_st_index(const char *dir, const char *path, errbuf *err)
{
    st_file *f = NULL;
    (void)path;
    int rc = st_open(&f, dir, err);
    st_close(&f);
    return rc;
}
static int read_identity(const char *dir, const char *path, errbuf *err)
{
    job_identity id;
    (void)dir;
    return job_identity_read(&id, path, err);
}

static const struct reader {
    const char *name, *file;
    int (*read)(const char *dir, const char *path, errbuf *err);
    int missing_is_error; /* else a missing file is skipped or looked for elsewhere */
} readers[] = {
    {"tokenizer_load", "tokenizer.json", read_tokenizer, 1},
    {"chat_template_load", "tokenizer_config.json", read_chat_template, 0}, /* chat_template.jinja may stand in */
    {"hf_eos_tokens", "generation_config.json", read_eos, 0},
    {"st_open of an index", "model.safetensors.index.json", read_st_index, 0},
    {"job_identity_read", "identity.json", read_identity, 1},
};

/* each reader: a missing file (where that is an error), a directory in the file's place, a file that is not JSON */
TEST(every_reader_says_line_or_reason)
{
    for (size_t r = 0; r < sizeof readers / sizeof readers[0]; r++) {
        const struct reader *rd = &readers[r];
        char *dir = test_tmpdir(), p[512], want[600];
        errbuf err = {{0}};
        int rc;
        path_in(p, sizeof p, dir, rd->file);
        if (rd->missing_is_error) {
            rc = rd->read(dir, p, &err);
            snprintf(want, sizeof want, "%s: No such file or directory", p);
            if (rc != -ENOENT) fprintf(stderr, "  %s, missing: %d\n", rd->name, rc);
            EXPECT(rc == -ENOENT);
            EXPECT_MSG(err.msg, want);
        }
        REQUIRE(mkdir(p, 0755) == 0);
        rc = rd->read(dir, p, &err);
        snprintf(want, sizeof want, "%s: Is a directory", p);
        if (rc != -EISDIR) fprintf(stderr, "  %s, a directory: %d\n", rd->name, rc);
        EXPECT(rc == -EISDIR);
        EXPECT_MSG(err.msg, want);
        rmdir(p);
        test_write_file(p, BAD, strlen(BAD));
        rc = rd->read(dir, p, &err);
        snprintf(want, sizeof want, "%s:3: invalid JSON", p);
        if (rc != -EINVAL) fprintf(stderr, "  %s, bad JSON: %d\n", rd->name, rc);
        EXPECT(rc == -EINVAL);
        EXPECT_MSG(err.msg, want);
        unlink(p);
        rmdir(dir);
    }
}

TEST_MAIN

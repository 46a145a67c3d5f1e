/* Token shards: XXH64 vectors, writer/reader round trips, datasets over several shards, and one test per kind of
 * corruption, each checking that the error names the file and what is wrong. */
#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>

#include "shard.h"
#include "tests/test.h"

static void rmtree(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

/* Deterministic sample i: length len_of(i) (some empty), tokens and mask derived from i and position. */
static size_t len_of(size_t i) { return (i % 7 == 3) ? 0 : 1 + (i * 37) % 300; }
static uint32_t tok_of(size_t i, size_t j) { return (uint32_t)((i * 2654435761u + j * 40503u) % 151936u); }
static uint8_t mask_of(size_t i, size_t j) { return (uint8_t)(((i + j) % 3) != 0); }

static void write_samples(const char *path, size_t first, size_t count)
{
    shard_writer *w = NULL;
    errbuf err = {{0}};
    REQUIRE(shard_writer_open(&w, path, &err) == 0);
    uint32_t tok[400];
    uint8_t mask[400];
    for (size_t i = first; i < first + count; i++) {
        size_t n = len_of(i);
        for (size_t j = 0; j < n; j++) { tok[j] = tok_of(i, j); mask[j] = mask_of(i, j); }
        REQUIRE(shard_writer_add(w, tok, mask, n, &err) == 0);
    }
    int rc = shard_writer_close(&w, &err);
    if (rc) fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(rc == 0);
    REQUIRE(w == NULL);
}

static int check_sample(const uint32_t *tok, const uint8_t *mask, uint64_t len, size_t i)
{
    if (len != len_of(i)) return 0;
    for (size_t j = 0; j < len; j++)
        if (tok[j] != tok_of(i, j) || mask[j] != mask_of(i, j)) return 0;
    return 1;
}

static uint8_t *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    REQUIRE(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = xmalloc(*n);
    REQUIRE(fread(buf, 1, *n, f) == *n);
    fclose(f);
    return buf;
}

/* Rewrite the header checksum so that only the deliberate change remains. */
static void fix_checksum(uint8_t *buf, size_t n)
{
    uint64_t h = shard_hash(buf + SHARD_HEADER_BYTES, n - SHARD_HEADER_BYTES);
    memcpy(buf + SHARD_OFF_CHECKSUM, &h, 8);
}

/* Open path, expect failure whose message contains the path, `what` and `also` (NULL: nothing more). */
static void expect_open_error2(const char *path, const char *what, const char *also)
{
    shard *s = NULL;
    errbuf err = {{0}};
    int rc = shard_open(&s, path, &err);
    EXPECT(rc < 0);
    EXPECT(s == NULL);
    EXPECT_CONTAINS(err.msg, path);
    EXPECT_CONTAINS(err.msg, what);
    if (also) EXPECT_CONTAINS(err.msg, also);
    shard_close(&s);
}

static void expect_open_error(const char *path, const char *what) { expect_open_error2(path, what, NULL); }

/* A small good shard in a fresh folder; returns its bytes. */
static uint8_t *good_shard(char *path, size_t pathsz, const char *dir, size_t *n)
{
    snprintf(path, pathsz, "%s/x.shard", dir);
    write_samples(path, 0, 20);
    return read_file(path, n);
}

TEST(hash_matches_xxh64_reference)
{
    uint8_t buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = (uint8_t)(i * 131 + 7);
    /* Values from the reference libxxhash 0.8 XXH64(buf, n, 0). */
    struct { size_t n; uint64_t h; } v[] = {
        {0, 0xef46db3751d8e999ull},   {1, 0xa96c7f0ce858bbb7ull},   {3, 0xbed43740ee6332bbull},
        {4, 0xfa212ae44b3bb23dull},   {7, 0x2744460dd675d2c0ull},   {8, 0x994b676b71ce94ddull},
        {31, 0x6711d55e306b5d8full},  {32, 0x07f7b8e3bc5d6e25ull},  {33, 0x09f85eeb4e1cbe9full},
        {100, 0x9ddada11d3dc2d8full}, {999, 0x209a7fcd40c009f2ull}, {1000, 0x0bf0bdbcc82eb373ull},
    };
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) EXPECT(shard_hash(buf, v[k].n) == v[k].h);
}

TEST(shard_roundtrip_many_samples)
{
    char *dir = test_tmpdir(), path[300];
    snprintf(path, sizeof path, "%s/a.shard", dir);
    write_samples(path, 0, 2000);
    shard *s = NULL;
    errbuf err = {{0}};
    REQUIRE(shard_open(&s, path, &err) == 0);
    EXPECT(strcmp(shard_path(s), path) == 0);
    REQUIRE(shard_count(s) == 2000);
    uint64_t ntok = 0, ntrained = 0;
    for (size_t i = 0; i < 2000; i++) {
        const uint32_t *tok; const uint8_t *mask; uint64_t len;
        shard_sample(s, i, &tok, &mask, &len);
        EXPECT(check_sample(tok, mask, len, i));
        ntok += len;
        for (uint64_t j = 0; j < len; j++) ntrained += mask[j];
    }
    EXPECT(shard_ntokens(s) == ntok);
    EXPECT(shard_ntrained(s) == ntrained);
    shard_close(&s);
    EXPECT(s == NULL);
    rmtree(dir);
}

TEST(shard_empty_and_null_mask)
{
    char *dir = test_tmpdir(), path[300];
    errbuf err = {{0}};
    shard *s = NULL;
    snprintf(path, sizeof path, "%s/empty.shard", dir);
    write_samples(path, 0, 0);
    REQUIRE(shard_open(&s, path, &err) == 0);
    EXPECT(shard_count(s) == 0 && shard_ntokens(s) == 0 && shard_ntrained(s) == 0);
    shard_close(&s);

    snprintf(path, sizeof path, "%s/nomask.shard", dir);
    shard_writer *w = NULL;
    uint32_t tok[3] = {5, 6, 7};
    REQUIRE(shard_writer_open(&w, path, &err) == 0);
    REQUIRE(shard_writer_add(w, tok, NULL, 3, &err) == 0);
    REQUIRE(shard_writer_add(w, NULL, NULL, 0, &err) == 0);
    EXPECT(shard_writer_count(w) == 2 && shard_writer_ntokens(w) == 3);
    REQUIRE(shard_writer_close(&w, &err) == 0);
    REQUIRE(shard_open(&s, path, &err) == 0);
    const uint32_t *t; const uint8_t *m; uint64_t len;
    shard_sample(s, 0, &t, &m, &len);
    EXPECT(len == 3 && t[2] == 7 && m[0] == 1 && m[1] == 1 && m[2] == 1);
    shard_sample(s, 1, &t, &m, &len);
    EXPECT(len == 0);
    EXPECT(shard_ntrained(s) == 3);
    shard_close(&s);
    rmtree(dir);
}

TEST(writer_is_atomic_and_rejects_bad_mask)
{
    char *dir = test_tmpdir(), path[300];
    errbuf err = {{0}};
    struct stat st;
    snprintf(path, sizeof path, "%s/w.shard", dir);
    shard_writer *w = NULL;
    REQUIRE(shard_writer_open(&w, path, &err) == 0);
    uint32_t tok[2] = {1, 2};
    uint8_t bad[2] = {1, 2};
    EXPECT(shard_writer_add(w, tok, bad, 2, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, path);
    EXPECT_CONTAINS(err.msg, "loss_mask is 2");
    EXPECT(shard_writer_count(w) == 0);
    REQUIRE(shard_writer_add(w, tok, NULL, 2, &err) == 0);
    EXPECT(stat(path, &st) != 0); /* nothing published before close */
    shard_writer_discard(&w);
    EXPECT(w == NULL);
    EXPECT(stat(path, &st) != 0);

    /* Close into a missing folder fails, names the file, leaves nothing. */
    char missing[300];
    snprintf(missing, sizeof missing, "%s/nope/w.shard", dir);
    REQUIRE(shard_writer_open(&w, missing, &err) == 0);
    EXPECT(shard_writer_close(&w, &err) < 0);
    EXPECT(w == NULL);
    EXPECT_CONTAINS(err.msg, missing);

    /* Only the published shard is left in the folder: no tmp files. */
    REQUIRE(shard_writer_open(&w, path, &err) == 0);
    REQUIRE(shard_writer_add(w, tok, NULL, 2, &err) == 0);
    REQUIRE(shard_writer_close(&w, &err) == 0);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "test \"$(ls -A '%s')\" = w.shard", dir);
    EXPECT(system(cmd) == 0);
    rmtree(dir);
}

TEST(dataset_across_shards)
{
    char *dir = test_tmpdir(), path[300];
    errbuf err = {{0}};
    /* Written out of order, one empty, a digit run wider than the others; stray files must be ignored. */
    snprintf(path, sizeof path, "%s/shard-10.shard", dir);
    write_samples(path, 350, 50);
    snprintf(path, sizeof path, "%s/shard-2.shard", dir);
    write_samples(path, 300, 50);
    snprintf(path, sizeof path, "%s/shard-1.shard", dir);
    write_samples(path, 0, 0);
    snprintf(path, sizeof path, "%s/shard-0.shard", dir);
    write_samples(path, 0, 300);
    snprintf(path, sizeof path, "%s/notes.txt", dir);
    test_write_file(path, "x", 1);
    snprintf(path, sizeof path, "%s/shard-3.shard.123.tmp", dir);
    test_write_file(path, "junk", 4);

    dataset *ds = NULL;
    REQUIRE(dataset_open(&ds, dir, &err) == 0);
    EXPECT(dataset_nshards(ds) == 4);
    EXPECT_CONTAINS(shard_path(dataset_shard(ds, 3)), "shard-10.shard");
    REQUIRE(dataset_count(ds) == 400);
    uint64_t ntok = 0;
    for (uint64_t i = 0; i < 400; i++) {
        const uint32_t *tok; const uint8_t *mask; uint64_t len;
        REQUIRE(dataset_sample(ds, i, &tok, &mask, &len) == 0);
        EXPECT(check_sample(tok, mask, len, i));
        ntok += len;
    }
    EXPECT(dataset_ntokens(ds) == ntok);
    const uint32_t *tok; const uint8_t *mask; uint64_t len;
    EXPECT(dataset_sample(ds, 400, &tok, &mask, &len) == -ERANGE);
    EXPECT(dataset_check_vocab(ds, 151936, &err) == 0);
    dataset_close(&ds);
    EXPECT(ds == NULL);

    /* One file opens as a dataset of one shard. */
    snprintf(path, sizeof path, "%s/shard-2.shard", dir);
    REQUIRE(dataset_open(&ds, path, &err) == 0);
    EXPECT(dataset_nshards(ds) == 1 && dataset_count(ds) == 50);
    REQUIRE(dataset_sample(ds, 49, &tok, &mask, &len) == 0);
    EXPECT(check_sample(tok, mask, len, 349));
    dataset_close(&ds);
    rmtree(dir);
}

TEST(dataset_empty_shards_only)
{
    char *dir = test_tmpdir(), path[300];
    errbuf err = {{0}};
    snprintf(path, sizeof path, "%s/a.shard", dir);
    write_samples(path, 0, 0);
    dataset *ds = NULL;
    REQUIRE(dataset_open(&ds, dir, &err) == 0);
    EXPECT(dataset_count(ds) == 0 && dataset_ntokens(ds) == 0);
    const uint32_t *tok; const uint8_t *mask; uint64_t len;
    EXPECT(dataset_sample(ds, 0, &tok, &mask, &len) == -ERANGE);
    EXPECT(dataset_check_vocab(ds, 1, &err) == 0);
    dataset_close(&ds);
    rmtree(dir);
}

TEST(dataset_errors_name_the_path)
{
    char *dir = test_tmpdir(), path[300];
    errbuf err = {{0}};
    dataset *ds = NULL;
    EXPECT(dataset_open(&ds, dir, &err) == -ENOENT); /* folder without shards */
    EXPECT_CONTAINS(err.msg, dir);
    EXPECT_CONTAINS(err.msg, "no *.shard files");
    snprintf(path, sizeof path, "%s/missing.shard", dir);
    EXPECT(dataset_open(&ds, path, &err) == -ENOENT);
    EXPECT_CONTAINS(err.msg, path);
    EXPECT(ds == NULL);

    /* A bad shard among good ones fails the whole dataset and names the bad one. */
    snprintf(path, sizeof path, "%s/a.shard", dir);
    write_samples(path, 0, 10);
    snprintf(path, sizeof path, "%s/b.shard", dir);
    test_write_file(path, "DFSHARD", 8);
    EXPECT(dataset_open(&ds, dir, &err) < 0);
    EXPECT_CONTAINS(err.msg, path);
    EXPECT_CONTAINS(err.msg, "truncated");
    EXPECT(ds == NULL);
    rmtree(dir);
}

TEST(dataset_check_vocab_names_shard_and_sample)
{
    char *dir = test_tmpdir(), path[300];
    errbuf err = {{0}};
    uint32_t small[3] = {1, 2, 999}, bad[3] = {3, 1000, 4};
    shard_writer *w = NULL;
    snprintf(path, sizeof path, "%s/s0.shard", dir);
    REQUIRE(shard_writer_open(&w, path, &err) == 0);
    REQUIRE(shard_writer_add(w, small, NULL, 3, &err) == 0);
    REQUIRE(shard_writer_add(w, small, NULL, 2, &err) == 0);
    REQUIRE(shard_writer_close(&w, &err) == 0);
    snprintf(path, sizeof path, "%s/s1.shard", dir);
    REQUIRE(shard_writer_open(&w, path, &err) == 0);
    REQUIRE(shard_writer_add(w, small, NULL, 1, &err) == 0);
    REQUIRE(shard_writer_add(w, bad, NULL, 3, &err) == 0);
    REQUIRE(shard_writer_close(&w, &err) == 0);
    dataset *ds = NULL;
    REQUIRE(dataset_open(&ds, dir, &err) == 0);
    EXPECT(dataset_check_vocab(ds, 1001, &err) == 0);
    EXPECT(dataset_check_vocab(ds, 1000, &err) == -ERANGE);
    EXPECT_CONTAINS(err.msg, path);
    EXPECT_CONTAINS(err.msg, "sample 1 (dataset sample 3), token 1: id 1000 >= vocab 1000");
    EXPECT(dataset_check_vocab(ds, 999, &err) == -ERANGE); /* now s0 breaks first */
    EXPECT_CONTAINS(err.msg, "s0.shard: sample 0 (dataset sample 0), token 2: id 999 >= vocab 999");
    dataset_close(&ds);
    rmtree(dir);
}

TEST(corrupt_token_byte_fails_checksum)
{
    char *dir = test_tmpdir(), path[300];
    size_t n;
    uint8_t *buf = good_shard(path, sizeof path, dir, &n);
    size_t tok_at = SHARD_HEADER_BYTES + 8 * 21 + 17; /* inside the token ids */
    buf[tok_at] ^= 0x40;
    test_write_file(path, buf, n);
    expect_open_error(path, "checksum mismatch");
    buf[tok_at] ^= 0x40;
    buf[n - 1] ^= 1; /* last byte: mask or padding */
    test_write_file(path, buf, n);
    expect_open_error(path, "checksum mismatch");
    free(buf);
    rmtree(dir);
}

TEST(truncated_at_several_lengths)
{
    char *dir = test_tmpdir(), path[300];
    size_t n;
    uint8_t *buf = good_shard(path, sizeof path, dir, &n);
    size_t cuts[] = {0, 5, 8, 40, 63, 64, 64 + 4, 64 + 8 * 10, 64 + 8 * 21, 64 + 8 * 21 + 3, n - 8, n - 1};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
        char want[96];
        if (cuts[k] >= SHARD_HEADER_BYTES)
            snprintf(want, sizeof want, "truncated: header says %zu bytes, file has %zu", n, cuts[k]);
        else
            snprintf(want, sizeof want, "truncated: a shard header is 64 bytes, file has %zu", cuts[k]);
        test_write_file(path, buf, cuts[k]);
        expect_open_error(path, want);
    }
    free(buf);
    rmtree(dir);
}

TEST(trailing_bytes_rejected)
{
    char *dir = test_tmpdir(), path[300];
    size_t n;
    uint8_t *buf = good_shard(path, sizeof path, dir, &n);
    buf = xrealloc(buf, n + 8);
    memset(buf + n, 0, 8);
    test_write_file(path, buf, n + 8);
    expect_open_error(path, "trailing data");
    free(buf);
    rmtree(dir);
}

TEST(bad_magic_and_version)
{
    char *dir = test_tmpdir(), path[300];
    size_t n;
    uint8_t *buf = good_shard(path, sizeof path, dir, &n);
    buf[0] = 'X';
    test_write_file(path, buf, n);
    expect_open_error(path, "bad magic");
    test_write_file(path, "{\"input_ids\"", 12); /* short, and not a shard at all */
    expect_open_error(path, "bad magic");
    buf[0] = 'D';
    uint32_t v = 7;
    memcpy(buf + SHARD_OFF_VERSION, &v, 4);
    test_write_file(path, buf, n);
    expect_open_error(path, "unsupported shard version 7");
    v = SHARD_VERSION;
    memcpy(buf + SHARD_OFF_VERSION, &v, 4);
    uint32_t hb = 60;
    memcpy(buf + SHARD_OFF_HEADER_BYTES, &hb, 4);
    test_write_file(path, buf, n);
    expect_open_error(path, "bad header_bytes 60");
    free(buf);
    rmtree(dir);
}

TEST(bad_offsets_with_valid_checksum)
{
    char *dir = test_tmpdir(), path[300];
    size_t n;
    uint8_t *buf = good_shard(path, sizeof path, dir, &n);
    uint8_t *orig = xmalloc(n);
    memcpy(orig, buf, n);
    uint64_t *off = (uint64_t *)(buf + SHARD_HEADER_BYTES), ntok;
    memcpy(&ntok, buf + SHARD_OFF_NTOKENS, 8);

    off[5] = off[4] > 0 ? off[4] - 1 : 0;
    off[6] = off[7] + 1; /* sample 6 now ends before it starts */
    fix_checksum(buf, n);
    test_write_file(path, buf, n);
    expect_open_error(path, "offsets not monotonic");

    memcpy(buf, orig, n);
    off[20] = ntok - 1; /* last offset short of ntokens */
    fix_checksum(buf, n);
    test_write_file(path, buf, n);
    expect_open_error(path, "header says ntokens");

    memcpy(buf, orig, n);
    off[19] = ntok + 5; /* past ntokens */
    fix_checksum(buf, n);
    test_write_file(path, buf, n);
    expect_open_error(path, "past ntokens");

    memcpy(buf, orig, n);
    off[0] = 1;
    fix_checksum(buf, n);
    test_write_file(path, buf, n);
    expect_open_error(path, "offsets[0] is 1");

    memcpy(buf, orig, n);
    buf[SHARD_HEADER_BYTES + 8 * 21 + 4 * ntok + 2] = 5; /* sample 0 has 1 token: sample 1, token 1 */
    fix_checksum(buf, n);
    test_write_file(path, buf, n);
    expect_open_error(path, "sample 1, token 1: loss_mask is 5");
    free(orig);
    free(buf);
    rmtree(dir);
}

TEST(not_a_file)
{
    char *dir = test_tmpdir();
    expect_open_error(dir, "not a regular file");
    char path[300];
    snprintf(path, sizeof path, "%s/none.shard", dir);
    expect_open_error(path, "cannot open");
    rmtree(dir);
}

TEST_MAIN

/* safetensors: every malformed-header case names the file and the tensor; sharded checkpoints; golden files;
 * exact BF16/F16 conversion; the atomic writer round-trips. */
#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>

#include "safetensors.h"
#include "tests/test.h"

/* Write a safetensors file from a header text and a data region; returns the path (static buffer per call site
 * is not needed: callers copy). */
static void write_raw(const char *path, const char *header, const void *data, size_t n)
{
    size_t hl = strlen(header);
    unsigned char *buf = malloc(8 + hl + n + 1);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    if (n) memcpy(buf + 8 + hl, data, n);
    test_write_file(path, buf, 8 + hl + n);
    free(buf);
}

static char *path_in(const char *dir, const char *name)
{
    static char p[8][512];
    static int k;
    char *s = p[k++ % 8];
    snprintf(s, 512, "%s/%s", dir, name);
    return s;
}

static void rmtree(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "rm -rf %s failed\n", dir);
}

/* Expect st_open of a raw file with this header (and n data bytes) to fail with all the needles in the message. */
static void expect_bad(const char *header, size_t n, const char *needle1, const char *needle2)
{
    char *dir = test_tmpdir();
    char *p = path_in(dir, "bad.safetensors");
    unsigned char zeros[256] = {0};
    REQUIRE(n <= sizeof zeros);
    write_raw(p, header, zeros, n);
    st_file *f = NULL;
    errbuf err = {{0}};
    int ret = st_open(&f, p, &err);
    EXPECT(ret < 0);
    EXPECT(f == NULL);
    EXPECT_CONTAINS(err.msg, p);
    if (needle1) EXPECT_CONTAINS(err.msg, needle1);
    if (needle2) EXPECT_CONTAINS(err.msg, needle2);
    st_close(&f);
    rmtree(dir);
}

TEST(short_file)
{
    char *dir = test_tmpdir();
    char *p = path_in(dir, "short.safetensors");
    test_write_file(p, "\x10\0\0", 3);
    st_file *f = NULL;
    errbuf err = {{0}};
    EXPECT(st_open(&f, p, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, p);
    EXPECT_CONTAINS(err.msg, "shorter than the 8-byte header length");
    rmtree(dir);
}

TEST(header_length_past_end)
{
    char *dir = test_tmpdir();
    char *p = path_in(dir, "trunc.safetensors");
    unsigned char buf[16] = {0xff, 0x00, 0, 0, 0, 0, 0, 0, '{', '}'};
    test_write_file(p, buf, 10);
    st_file *f = NULL;
    errbuf err = {{0}};
    EXPECT(st_open(&f, p, &err) < 0);
    EXPECT_CONTAINS(err.msg, p);
    EXPECT_CONTAINS(err.msg, "header length 255 runs past the end");
    /* a huge length must not overflow */
    memset(buf, 0xff, 8);
    test_write_file(p, buf, 10);
    EXPECT(st_open(&f, p, &err) < 0);
    EXPECT_CONTAINS(err.msg, "runs past the end");
    rmtree(dir);
}

TEST(invalid_json)
{
    expect_bad("{\"w\": {\"dtype\": \"F32\",", 0, "not valid JSON", NULL);
    expect_bad("[1, 2]", 0, "must be a JSON object", NULL);
    expect_bad("{\"w\": 1, \"w\": 2}", 0, "not valid JSON", "duplicate");
}

TEST(unknown_dtype)
{
    expect_bad("{\"w\": {\"dtype\": \"F8_E9M9\", \"shape\": [2], \"data_offsets\": [0, 2]}}", 2, "tensor w",
               "unknown dtype \"F8_E9M9\"");
    expect_bad("{\"w\": {\"dtype\": 4, \"shape\": [2], \"data_offsets\": [0, 8]}}", 8, "tensor w",
               "dtype: expected string, got integer");
}

TEST(shape_does_not_match_offsets)
{
    expect_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 20]}}", 24, "tensor w",
               "shape [2, 3] of F32 needs 24 bytes but data_offsets span 20");
    /* a product that overflows 64 bits */
    expect_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 2], \"data_offsets\": [0, 8]}}", 8,
               "tensor w", "more than 2^64");
}

TEST(offsets_out_of_range)
{
    expect_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 12, "tensor w",
               "out of range");
    expect_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}", 12, "tensor w",
               "negative");
    expect_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", 12, "tensor w",
               "data_offsets: expected an array of 2 integers");
    expect_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4.0]}}", 12, "tensor w",
               "data_offsets[1]: expected integer, got real");
}

TEST(begin_after_end)
{
    expect_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}}", 12, "tensor w",
               "begin 8 > end 4");
}

TEST(overlapping_tensors)
{
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
               " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
               12, "tensor b", "overlap tensor a");
    /* touching is fine, and so is an empty tensor inside another's range */
    char *dir = test_tmpdir();
    char *p = path_in(dir, "ok.safetensors");
    float d[3] = {1, 2, 3};
    write_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                 " \"e\": {\"dtype\": \"F32\", \"shape\": [0, 5], \"data_offsets\": [4, 4]},"
                 " \"b\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [8, 12]}}", d, sizeof d);
    st_file *f = NULL;
    errbuf err = {{0}};
    REQUIRE(st_open(&f, p, &err) == 0);
    EXPECT(st_count(f) == 3);
    EXPECT(strcmp(st_at(f, 0)->name, "a") == 0); /* file order = data order */
    EXPECT(st_find(f, "b")->ndim == 0);
    float v = 0;
    EXPECT(st_read_f32(f, "b", &v, 0, NULL, &err) == 0);
    EXPECT(v == 3.0f);
    st_close(&f);
    EXPECT(f == NULL);
    rmtree(dir);
}

TEST(bad_shape_entries)
{
    expect_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [2, \"3\"], \"data_offsets\": [0, 24]}}", 24, "tensor w",
               "shape[1]: expected integer, got string");
    expect_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [2.5], \"data_offsets\": [0, 8]}}", 8, "tensor w",
               "shape[0]: expected integer, got real");
    expect_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [-2, -3], \"data_offsets\": [0, 24]}}", 24, "tensor w",
               "shape[0] = -2 is negative");
    expect_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": 6, \"data_offsets\": [0, 24]}}", 24, "tensor w",
               "shape: expected array, got integer");
    expect_bad("{\"w\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 1]}}", 1,
               "tensor w", "9 dimensions");
}

TEST(missing_fields)
{
    expect_bad("{\"w\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "tensor w", "missing field dtype");
    expect_bad("{\"w\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4, "tensor w", "missing field shape");
    expect_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4, "tensor w", "missing field data_offsets");
    expect_bad("{\"w\": [1]}", 4, "tensor w", "expected an object, got array");
    expect_bad("{\"__metadata__\": {\"k\": 1}}", 0, "__metadata__.k", "expected string");
}

TEST(bf16_f16_conversion_exact)
{
    char *dir = test_tmpdir();
    char *p = path_in(dir, "half.safetensors");
    /* bf16: 1.0, -2.0, 0.15625, smallest subnormal; f16: 1.0, -2.0, 65504, smallest subnormal 2^-24 */
    uint16_t d[8] = {0x3f80, 0xc000, 0x3e20, 0x0001, 0x3c00, 0xc000, 0x7bff, 0x0001};
    write_raw(p, "{\"b\": {\"dtype\": \"BF16\", \"shape\": [2, 2], \"data_offsets\": [0, 8]},"
                 " \"h\": {\"dtype\": \"F16\", \"shape\": [4], \"data_offsets\": [8, 16]}}", d, sizeof d);
    st_file *f = NULL;
    errbuf err = {{0}};
    REQUIRE(st_open(&f, p, &err) == 0);
    float b[4], h[4];
    EXPECT(st_read_f32(f, "b", b, 2, (int64_t[]){2, 2}, &err) == 0);
    EXPECT(b[0] == 1.0f && b[1] == -2.0f && b[2] == 0.15625f && b[3] == ldexpf(1.0f, -133));
    float *hp = NULL;
    size_t n = 0;
    EXPECT(st_load_f32(f, "h", &hp, -1, NULL, &n, &err) == 0);
    REQUIRE(hp && n == 4);
    memcpy(h, hp, sizeof h);
    free(hp);
    EXPECT(h[0] == 1.0f && h[1] == -2.0f && h[2] == 65504.0f && h[3] == ldexpf(1.0f, -24));
    EXPECT(st_find(f, "b")->dtype == ST_BF16 && st_find(f, "h")->dtype == ST_F16);
    EXPECT(st_dtype_size(ST_BF16) == 2 && strcmp(st_dtype_name(ST_F16), "F16") == 0);
    st_close(&f);
    rmtree(dir);
}

TEST(read_errors_name_file_and_tensor)
{
    char *dir = test_tmpdir();
    char *p = path_in(dir, "m.safetensors");
    int32_t d[6] = {1, 2, 3, 4, 5, 6};
    int64_t big[2] = {7, (int64_t)1 << 40};
    unsigned char data[40];
    memcpy(data, d, 24);
    memcpy(data + 24, big, 16);
    write_raw(p, "{\"w\": {\"dtype\": \"I32\", \"shape\": [2, 3], \"data_offsets\": [0, 24]},"
                 " \"x\": {\"dtype\": \"I64\", \"shape\": [2], \"data_offsets\": [24, 40]}}", data, sizeof data);
    st_file *f = NULL;
    errbuf err = {{0}};
    REQUIRE(st_open(&f, p, &err) == 0);
    EXPECT(strcmp(st_path(f), p) == 0);
    float out[6];
    EXPECT(st_read_f32(f, "nope", out, 1, (int64_t[]){6}, &err) == -ENOENT);
    char want[700];
    snprintf(want, sizeof want, "%s: tensor nope not found", p);
    EXPECT(strcmp(err.msg, want) == 0);
    EXPECT(st_read_f32(f, "w", out, 2, (int64_t[]){2, 3}, &err) < 0);
    EXPECT_CONTAINS(err.msg, "tensor w: dtype I32 is not a float type");
    int32_t *iv = NULL;
    size_t n = 0;
    EXPECT(st_load_i32(f, "w", &iv, &n, &err) == 0);
    EXPECT(n == 6 && iv && iv[5] == 6);
    free(iv);
    EXPECT(st_load_i32(f, "x", &iv, &n, &err) == -ERANGE);
    EXPECT(iv == NULL);
    EXPECT_CONTAINS(err.msg, p);
    EXPECT_CONTAINS(err.msg, "tensor x: element 1 = 1099511627776 does not fit in int32");
    EXPECT(st_metadata(f, "format") == NULL);
    st_close(&f);

    /* the shape message, word for word */
    float fd[6] = {0};
    write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 24]}}", fd, sizeof fd);
    REQUIRE(st_open(&f, p, &err) == 0);
    EXPECT(st_read_f32(f, "w", out, 2, (int64_t[]){3, 2}, &err) == -EINVAL);
    snprintf(want, sizeof want, "%s: tensor w: shape [2, 3] does not match expected [3, 2]", p);
    EXPECT(strcmp(err.msg, want) == 0);
    float *lp = NULL;
    EXPECT(st_load_f32(f, "w", &lp, 1, (int64_t[]){6}, NULL, &err) == -EINVAL);
    EXPECT(lp == NULL);
    EXPECT_CONTAINS(err.msg, "shape [2, 3] does not match expected [6]");
    st_close(&f);
    rmtree(dir);
}

static void check_golden_target(const char *sub, enum st_dtype dt)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s/target/model.safetensors", test_goldens(), sub);
    st_file *f = NULL;
    errbuf err = {{0}};
    int ret = st_open(&f, p, &err);
    if (ret) fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(ret == 0);
    EXPECT(st_count(f) > 8 * 11);
    const st_tensor *t = st_find(f, "model.embed_tokens.weight");
    REQUIRE(t);
    EXPECT(t->dtype == dt && t->ndim == 2 && t->shape[0] == 512 && t->shape[1] == 64);
    EXPECT(t->nbytes == 512 * 64 * st_dtype_size(dt));
    EXPECT(strcmp(t->file, p) == 0);
    EXPECT(strcmp(st_metadata(f, "format"), "pt") == 0);
    float *w = NULL;
    size_t n = 0;
    EXPECT(st_load_f32(f, "model.layers.7.self_attn.k_proj.weight", &w, 2, (int64_t[]){32, 64}, &n, &err) == 0);
    REQUIRE(w);
    EXPECT(n == 32 * 64);
    int finite = 1, nonzero = 0;
    for (size_t i = 0; i < n; i++) {
        finite &= isfinite(w[i]) != 0;
        nonzero += w[i] != 0;
    }
    EXPECT(finite && nonzero > 0);
    free(w);
    float norm[16];
    EXPECT(st_read_f32(f, "model.layers.0.self_attn.q_norm.weight", norm, 1, (int64_t[]){16}, &err) == 0);
    EXPECT(isfinite(norm[0]));
    /* every tensor readable; tensors in file order */
    for (int i = 0; i < st_count(f); i++) {
        EXPECT(st_at(f, i)->dtype == dt);
        if (i) EXPECT((const char *)st_at(f, i)->data >= (const char *)st_at(f, i - 1)->data +
                      st_at(f, i - 1)->nbytes);
    }
    st_close(&f);
}

TEST(golden_f32_target)
{
    check_golden_target("tiny", ST_F32);
}

TEST(golden_bf16_target)
{
    check_golden_target("tiny-bf16", ST_BF16);
    /* the directory form finds model.safetensors */
    char p[600];
    snprintf(p, sizeof p, "%s/tiny-bf16/drafter", test_goldens());
    st_file *f = NULL;
    errbuf err = {{0}};
    REQUIRE(st_open(&f, p, &err) == 0);
    EXPECT(st_find(f, "fc.weight") && st_find(f, "fc.weight")->shape[1] == 320);
    st_close(&f);
}

TEST(golden_case_metadata_and_i32)
{
    char p[600];
    snprintf(p, sizeof p, "%s/tiny/case.safetensors", test_goldens());
    st_file *f = NULL;
    errbuf err = {{0}};
    REQUIRE(st_open(&f, p, &err) == 0);
    const char *js = st_metadata(f, "json");
    REQUIRE(js);
    EXPECT(js[0] == '{');
    EXPECT_CONTAINS(js, "\"mask_token_id\": 500");
    int32_t *cu = NULL;
    size_t n = 0;
    EXPECT(st_load_i32(f, "cu_seqlens", &cu, &n, &err) == 0);
    REQUIRE(cu);
    EXPECT(n == 4 && cu[0] == 0 && cu[3] == 121);
    for (size_t i = 1; i < n; i++) EXPECT(cu[i] > cu[i - 1]);
    free(cu);
    EXPECT(st_find(f, "input_ids")->dtype == ST_I32);
    float loss;
    EXPECT(st_read_f32(f, "drafter.loss", &loss, 1, (int64_t[]){1}, &err) == 0);
    EXPECT(isfinite(loss) && loss > 0);
    st_close(&f);
}

TEST(sharded_index)
{
    char *dir = test_tmpdir();
    float a[2] = {1, 2}, b[3] = {3, 4, 5};
    write_raw(path_in(dir, "model-00001-of-00002.safetensors"),
              "{\"__metadata__\": {\"format\": \"pt\"}, \"a\": {\"dtype\": \"F32\", \"shape\": [2], "
              "\"data_offsets\": [0, 8]}}", a, sizeof a);
    write_raw(path_in(dir, "model-00002-of-00002.safetensors"),
              "{\"b\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 12]},"
              " \"c\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [12, 12]}}", b, sizeof b);
    const char *idx = "{\"metadata\": {\"total_size\": 20}, \"weight_map\": {\"b\": \"model-00002-of-00002.safetensors\","
                      " \"a\": \"model-00001-of-00002.safetensors\", \"c\": \"model-00002-of-00002.safetensors\"}}";
    test_write_file(path_in(dir, "model.safetensors.index.json"), idx, strlen(idx));
    st_file *f = NULL;
    errbuf err = {{0}};
    /* the directory opens the index */
    int ret = st_open(&f, dir, &err);
    if (ret) fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(ret == 0);
    EXPECT(st_count(f) == 3);
    EXPECT(strcmp(st_at(f, 0)->name, "b") == 0); /* shards in index order */
    EXPECT_CONTAINS(st_find(f, "a")->file, "model-00001-of-00002.safetensors");
    EXPECT_CONTAINS(st_find(f, "b")->file, "model-00002-of-00002.safetensors");
    float v[3];
    EXPECT(st_read_f32(f, "b", v, 1, (int64_t[]){3}, &err) == 0);
    EXPECT(v[2] == 5.0f);
    EXPECT(st_read_f32(f, "a", v, 1, (int64_t[]){2}, &err) == 0);
    EXPECT(v[1] == 2.0f);
    EXPECT(st_read_f32(f, "a", v, 1, (int64_t[]){3}, &err) < 0);
    EXPECT_CONTAINS(err.msg, "model-00001-of-00002.safetensors: tensor a: shape [2] does not match expected [3]");
    st_close(&f);

    /* the index file itself */
    REQUIRE(st_open(&f, path_in(dir, "model.safetensors.index.json"), &err) == 0);
    EXPECT(st_count(f) == 3);
    st_close(&f);

    /* a tensor the index names but the shard lacks */
    idx = "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", \"z\": \"model-00002-of-00002.safetensors\"}}";
    test_write_file(path_in(dir, "model.safetensors.index.json"), idx, strlen(idx));
    EXPECT(st_open(&f, dir, &err) == -ENOENT);
    EXPECT(f == NULL);
    EXPECT_CONTAINS(err.msg, "model-00002-of-00002.safetensors: tensor z named by");
    EXPECT_CONTAINS(err.msg, "model.safetensors.index.json not found");

    /* a tensor in the wrong shard */
    idx = "{\"weight_map\": {\"a\": \"model-00002-of-00002.safetensors\", \"b\": \"model-00001-of-00002.safetensors\"}}";
    test_write_file(path_in(dir, "model.safetensors.index.json"), idx, strlen(idx));
    EXPECT(st_open(&f, dir, &err) < 0);
    EXPECT_CONTAINS(err.msg, "tensor a is in");

    /* a missing shard: the message names the index and the shard */
    idx = "{\"weight_map\": {\"a\": \"model-00003-of-00002.safetensors\"}}";
    test_write_file(path_in(dir, "model.safetensors.index.json"), idx, strlen(idx));
    EXPECT(st_open(&f, dir, &err) == -ENOENT);
    EXPECT_CONTAINS(err.msg, "model.safetensors.index.json");
    EXPECT_CONTAINS(err.msg, "model-00003-of-00002.safetensors: cannot open");

    /* the same tensor in two shards */
    write_raw(path_in(dir, "model-00002-of-00002.safetensors"),
              "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", a, sizeof a);
    idx = "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", \"x\": \"model-00002-of-00002.safetensors\"}}";
    test_write_file(path_in(dir, "model.safetensors.index.json"), idx, strlen(idx));
    EXPECT(st_open(&f, dir, &err) < 0);
    EXPECT_CONTAINS(err.msg, "tensor a is also in");

    /* index without weight_map */
    idx = "{\"metadata\": {}}";
    test_write_file(path_in(dir, "model.safetensors.index.json"), idx, strlen(idx));
    EXPECT(st_open(&f, dir, &err) < 0);
    EXPECT_CONTAINS(err.msg, "missing field weight_map");
    rmtree(dir);
}

TEST(directory_without_model)
{
    char *dir = test_tmpdir();
    st_file *f = NULL;
    errbuf err = {{0}};
    EXPECT(st_open(&f, dir, &err) == -ENOENT);
    EXPECT_CONTAINS(err.msg, dir);
    EXPECT_CONTAINS(err.msg, "no model.safetensors.index.json or model.safetensors");
    EXPECT(st_open(&f, path_in(dir, "absent.safetensors"), &err) == -ENOENT);
    EXPECT_CONTAINS(err.msg, "absent.safetensors");
    rmtree(dir);
}

TEST(write_round_trip)
{
    char *dir = test_tmpdir();
    char *p = path_in(dir, "out.safetensors");
    float w[6] = {1.0f, -2.5f, 3.14159f, 1e-3f, 65536.0f, -0.0f};
    float s[1] = {0.333333f};
    int32_t ids[5] = {0, 7, -3, 500, 2147483647};
    st_write_tensor ts[3] = {
        {.name = "zeta.weight", .dtype = ST_BF16, .ndim = 2, .shape = {2, 3}, .data = w},
        {.name = "alpha", .dtype = ST_F32, .ndim = 0, .data = s},
        {.name = "ids", .dtype = ST_I32, .ndim = 1, .shape = {5}, .data = ids},
    };
    errbuf err = {{0}};
    int ret = st_write(p, ts, 3, "{\"json\": \"{\\\"a\\\": 1}\", \"format\": \"pt\"}", &err);
    if (ret) fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(ret == 0);
    struct stat sb;
    EXPECT(stat(path_in(dir, "out.safetensors.tmp"), &sb) < 0);
    /* header length is a multiple of 8 and the header is padded with spaces */
    FILE *fp = fopen(p, "rb");
    REQUIRE(fp);
    unsigned char hb[8];
    REQUIRE(fread(hb, 1, 8, fp) == 8);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | hb[i];
    EXPECT(hl % 8 == 0);
    fclose(fp);

    st_file *f = NULL;
    REQUIRE(st_open(&f, p, &err) == 0);
    EXPECT(st_count(f) == 3);
    EXPECT(strcmp(st_at(f, 0)->name, "alpha") == 0 && strcmp(st_at(f, 1)->name, "ids") == 0);
    EXPECT(strcmp(st_metadata(f, "json"), "{\"a\": 1}") == 0);
    EXPECT(strcmp(st_metadata(f, "format"), "pt") == 0);
    float r[6];
    EXPECT(st_read_f32(f, "zeta.weight", r, 2, (int64_t[]){2, 3}, &err) == 0);
    for (int i = 0; i < 6; i++) EXPECT(r[i] == bf16_to_f32(f32_to_bf16(w[i])));
    EXPECT(r[0] == 1.0f && r[1] == -2.5f && r[4] == 65536.0f);
    float a;
    EXPECT(st_read_f32(f, "alpha", &a, 0, NULL, &err) == 0);
    EXPECT(a == s[0]);
    int32_t *iv = NULL;
    size_t n = 0;
    EXPECT(st_load_i32(f, "ids", &iv, &n, &err) == 0);
    REQUIRE(iv && n == 5);
    EXPECT(memcmp(iv, ids, sizeof ids) == 0);
    free(iv);
    st_close(&f);

    /* overwrite replaces atomically; bad inputs are refused with the tensor named */
    st_write_tensor dup[2] = {ts[1], ts[1]};
    EXPECT(st_write(p, dup, 2, NULL, &err) < 0);
    EXPECT_CONTAINS(err.msg, "tensor alpha given twice");
    st_write_tensor bad = {.name = "h", .dtype = ST_F16, .ndim = 1, .shape = {1}, .data = s};
    EXPECT(st_write(p, &bad, 1, NULL, &err) < 0);
    EXPECT_CONTAINS(err.msg, "tensor h: cannot write dtype F16");
    EXPECT(st_write(p, ts, 1, "{\"k\": 1}", &err) < 0);
    EXPECT_CONTAINS(err.msg, "metadata");
    REQUIRE(st_open(&f, p, &err) == 0); /* the earlier file is intact */
    EXPECT(st_count(f) == 3);
    st_close(&f);
    EXPECT(st_write(path_in(dir, "no/such/dir/x.safetensors"), ts, 1, NULL, &err) < 0);
    EXPECT_CONTAINS(err.msg, "no/such/dir/x.safetensors.tmp");
    rmtree(dir);
}

TEST_MAIN

/* Unit tests of the byte-level BPE tokenizer (a tiny tokenizer.json written here); the chat templates are
 * tested by test_jinja. The real Qwen3 and Llama-3 tokenizers are checked by the goldens (tests/golden/dflash_tok_golden.c). */
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>

#include "tests/test.h"
#include "tokenizer.h"

/* GPT-2's bytes_to_unicode: the code point that stands for byte b in tokenizer.json. */
static int byte_cp(int b)
{
    int n = 0;
    for (int x = 0; x < 256; x++) {
        bool printable = (x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff);
        if (x == b) return printable ? x : 256 + n;
        if (!printable) n++;
    }
    return -1;
}

static void put_cp(char **p, int cp)
{
    if (cp < 0x80) *(*p)++ = (char)cp;
    else { *(*p)++ = (char)(0xc0 | (cp >> 6)); *(*p)++ = (char)(0x80 | (cp & 0x3f)); }
}

/* bytes 0..255 are ids 0..255; "ab" 256, "abc" 257, "aa" 258; added "<s>" 300; NFC normalizer; optional ignore_merges. */
static tokenizer *tiny(bool ignore_merges)
{
    json_t *vocab = json_object();
    char key[8];
    for (int b = 0; b < 256; b++) { char *p = key; put_cp(&p, byte_cp(b)); *p = 0; json_object_set_new(vocab, key, json_integer(b)); }
    json_object_set_new(vocab, "ab", json_integer(256));
    json_object_set_new(vocab, "abc", json_integer(257));
    json_object_set_new(vocab, "aa", json_integer(258));
    json_t *root = json_pack("{s:{s:s}, s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b}]}, s:{s:s, s:b, s:o, s:[[s,s],[s,s],[s,s]]},"
                             " s:[{s:i, s:s, s:b, s:b, s:b, s:b, s:b}]}",
                             "normalizer", "type", "NFC",
                             "pre_tokenizer", "type", "Sequence", "pretokenizers",
                             "type", "Split", "pattern", "Regex", "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+|\\s+",
                             "behavior", "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0, "use_regex", 0,
                             "model", "type", "BPE", "ignore_merges", ignore_merges, "vocab", vocab, "merges",
                             "a", "b", "ab", "c", "a", "a",
                             "added_tokens", "id", 300, "content", "<s>", "special", 1, "normalized", 0, "lstrip", 0,
                             "rstrip", 0, "single_word", 0);
    REQUIRE(root);
    char *dir = test_tmpdir(), path[300];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    REQUIRE(json_dump_file(root, path, 0) == 0);
    json_decref(root);
    tokenizer *t;
    errbuf err;
    int rc = tokenizer_load(&t, dir, &err);
    if (rc) fprintf(stderr, "  %s\n", err.msg);
    unlink(path);
    rmdir(dir);
    REQUIRE(rc == 0);
    return t;
}

static int encode(const tokenizer *t, tok_buf *b, const char *s)
{
    tok_buf_clear(b);
    return tokenizer_encode(t, b, s, strlen(s));
}

TEST(bpe_merges_by_rank)
{
    tokenizer *t = tiny(false);
    tok_buf b = {0};
    REQUIRE(encode(t, &b, "abc") == 0);
    EXPECT(b.n == 1 && b.ids[0] == 257);
    REQUIRE(encode(t, &b, "aaa") == 0); /* leftmost pair first: aa + a */
    EXPECT(b.n == 2 && b.ids[0] == 258 && b.ids[1] == 'a');
    REQUIRE(encode(t, &b, "aab") == 0); /* ab (rank 0) before aa (rank 2) */
    EXPECT(b.n == 2 && b.ids[0] == 'a' && b.ids[1] == 256);
    REQUIRE(encode(t, &b, "abc abc") == 0); /* pre-tokens "abc", " abc"; the second from the cache */
    EXPECT(b.n == 3 && b.ids[0] == 257 && b.ids[1] == ' ' && b.ids[2] == 257);
    EXPECT(b.start[2] == 4 && b.end[2] == 7);
    tok_buf_free(&b);
    tokenizer_destroy(&t);
    EXPECT(t == NULL);
}

TEST(bpe_long_word_is_fast)
{
    tokenizer *t = tiny(false);
    tok_buf b = {0};
    size_t n = 1 << 20;
    char *s = malloc(n + 1);
    memset(s, 'a', n); s[n] = 0;
    double t0 = now_seconds();
    REQUIRE(encode(t, &b, s) == 0);
    EXPECT(b.n == n / 2);
    EXPECT(now_seconds() - t0 < 2.0);
    free(s);
    tok_buf_free(&b);
    tokenizer_destroy(&t);
}

TEST(added_tokens_and_decode)
{
    tokenizer *t = tiny(false);
    tok_buf b = {0};
    REQUIRE(encode(t, &b, "x<s>ab<s>") == 0);
    EXPECT(b.n == 4 && b.ids[0] == 'x' && b.ids[1] == 300 && b.ids[2] == 256 && b.ids[3] == 300);
    EXPECT(b.start[1] == 1 && b.end[1] == 4);
    EXPECT(tokenizer_token_id(t, "<s>") == 300 && tokenizer_token_id(t, "abc") == 257 && tokenizer_token_id(t, "zz") == -1);
    size_t n;
    char *d = tokenizer_decode(t, b.ids, b.n, &n);
    EXPECT(n == 9 && strcmp(d, "x<s>ab<s>") == 0);
    free(d);
    /* NFC: e + combining acute encodes as the precomposed é */
    REQUIRE(encode(t, &b, "e\xcc\x81") == 0);
    EXPECT(b.n == 2 && b.ids[0] == 0xc3 && b.ids[1] == 0xa9);
    EXPECT(encode(t, &b, "bad \xff utf8") == -EILSEQ);
    EXPECT(tokenizer_vocab_size(t) == 301);
    tok_buf_free(&b);
    tokenizer_destroy(&t);
}

TEST(ignore_merges_takes_whole_word)
{
    tokenizer *t = tiny(true);
    tok_buf b = {0};
    REQUIRE(encode(t, &b, "aa") == 0);
    EXPECT(b.n == 1 && b.ids[0] == 258);
    tok_buf_free(&b);
    tokenizer_destroy(&t);
}

TEST(load_errors_name_the_file)
{
    char *dir = test_tmpdir(), path[300];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    const char *json = "{\"model\": {\"type\": \"Unigram\"}}";
    test_write_file(path, json, strlen(json));
    tokenizer *t;
    errbuf err;
    EXPECT(tokenizer_load(&t, dir, &err) < 0);
    EXPECT_CONTAINS(err.msg, path);
    EXPECT_CONTAINS(err.msg, "BPE");
    unlink(path);
    rmdir(dir);
}

TEST_MAIN

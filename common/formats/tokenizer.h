/* tokenizer: a byte-level BPE tokenizer read from a Hugging Face tokenizer.json (Qwen2/3, Llama-3, gpt-oss's o200k
 * and alike): added tokens matched in the raw text (leftmost-longest), the NFC normalizer (utf8proc), the Split
 * pre-tokenizer regex (PCRE2, Unicode properties), the byte-level mapping and the merges by rank (a heap over a
 * linked list of symbols). A tokenizer is read-only once loaded and may be shared by threads; each thread encodes
 * into its own tok_buf, which also holds that thread's cache of pre-token results. Errors: 0 / -errno with a
 * message in an errbuf. */
#ifndef DFLASH_TOKENIZER_H
#define DFLASH_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

typedef struct tokenizer tokenizer;

/* Per-thread output and scratch: ids[n] with the byte range [start, end) of each token in the text given to
 * tokenizer_encode (exact where normalization left the text unchanged; else the whole normalized segment). */
typedef struct tok_buf {
    int32_t *ids;
    uint32_t *start, *end;
    size_t n, cap;
    struct tok_scratch *scratch; /* cache, BPE work arrays, regex match data (made on first use) */
} tok_buf;

/* Load DIR/tokenizer.json (or the file itself when path names a file); 0 or -errno. */
int tokenizer_load(tokenizer **out, const char *path, errbuf *err);
void tokenizer_destroy(tokenizer **t);
/* Vocabulary size: one past the largest id (added tokens included). */
uint32_t tokenizer_vocab_size(const tokenizer *t);
/* The id of a token written as its text (an added token such as "<|im_end|>", or a vocab entry); -1 if none. */
int32_t tokenizer_token_id(const tokenizer *t, const char *text);

/* Append the ids of text[0..len) (valid UTF-8) to buf (Hugging Face encode with add_special_tokens=False);
 * 0, or -EILSEQ for invalid UTF-8. */
int tokenizer_encode(const tokenizer *t, tok_buf *buf, const char *text, size_t len);
/* The tokenizer's normalizer applied to s[0..n): a malloc'd NUL-terminated copy (length in *len), or NULL when it
 * leaves s unchanged. Normalize texts before locating spans in them: encode's offsets are exact on normalized text. */
char *tokenizer_normalize(const tokenizer *t, const char *s, size_t n, size_t *len);
/* ids -> the bytes they stand for (added tokens as their text), NUL-terminated, malloc'd; *len without the NUL. */
char *tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, size_t *len);
/* Empty the output (keeps the cache). */
static inline void tok_buf_clear(tok_buf *b) { b->n = 0; }
void tok_buf_free(tok_buf *b);

#endif

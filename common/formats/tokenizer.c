/* tokenizer: byte-level BPE from tokenizer.json (see tokenizer.h). Token strings are kept as raw bytes: the
 * byte-level alphabet of the file (GPT-2's bytes_to_unicode) is undone once at load, so BPE runs on bytes. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include "json_util.h"

#define CACHE_SLOTS 65536    /* per thread; cleared when half full */
#define CACHE_MAX_WORD 128   /* longer pre-tokens are not cached */

struct bytes_ref { uint32_t off, len; };

/* Open-addressing map: byte string -> id (strings in the tokenizer's arena). */
struct str_map { uint32_t *slot; uint32_t mask; }; /* slot holds id+1, 0 = empty */

struct merge_entry { uint64_t key; uint32_t rank; int32_t id; };

struct added { uint32_t off, len; int32_t id; };

struct tokenizer {
    char *arena; size_t arena_len, arena_cap;
    struct bytes_ref *tok;      /* id -> bytes; len UINT32_MAX = no such id */
    uint32_t n_ids, tok_cap;
    struct str_map vocab;       /* model vocab only */
    int32_t byte_id[256];
    struct merge_entry *merges; uint32_t merge_mask;
    struct added *added; size_t n_added;   /* sorted by length, longest first */
    uint8_t added_first[256];
    bool nfc, ignore_merges;
    pcre2_code *re;
    bool re_jit;
};

struct cache_slot { uint64_t hash; uint32_t off, len, ids_off, n_ids; };

struct tok_scratch {
    pcre2_match_data *md;
    struct cache_slot *slot; size_t used;
    char *keys; size_t keys_len, keys_cap;
    int32_t *cids; size_t cids_len, cids_cap;
    /* BPE work arrays */
    int32_t *sid; int32_t *prev, *next; uint32_t *sstart; size_t wcap;
    struct heap_item *heap; size_t hcap;
};

struct heap_item { uint32_t rank; int32_t pos; int32_t id; };

static uint64_t hash_bytes(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) { h ^= s[i]; h *= 1099511628211ull; }
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return x;
}

static uint32_t arena_add(struct tokenizer *t, const void *p, size_t n)
{
    if (t->arena_len + n > t->arena_cap) {
        t->arena_cap = (t->arena_cap + n) * 2;
        t->arena = xrealloc(t->arena, t->arena_cap);
    }
    memcpy(t->arena + t->arena_len, p, n);
    t->arena_len += n;
    return (uint32_t)(t->arena_len - n);
}

static int32_t vocab_find(const struct tokenizer *t, const char *s, size_t n)
{
    for (uint32_t i = (uint32_t)hash_bytes(s, n) & t->vocab.mask;; i = (i + 1) & t->vocab.mask) {
        uint32_t v = t->vocab.slot[i];
        if (!v) return -1;
        const struct bytes_ref *r = &t->tok[v - 1];
        if (r->len == n && memcmp(t->arena + r->off, s, n) == 0) return (int32_t)(v - 1);
    }
}

static void vocab_insert(struct tokenizer *t, int32_t id)
{
    const struct bytes_ref *r = &t->tok[id];
    for (uint32_t i = (uint32_t)hash_bytes(t->arena + r->off, r->len) & t->vocab.mask;; i = (i + 1) & t->vocab.mask) {
        if (!t->vocab.slot[i]) { t->vocab.slot[i] = (uint32_t)id + 1; return; }
    }
}

static const struct merge_entry *merge_find(const struct tokenizer *t, int32_t a, int32_t b)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (uint32_t i = (uint32_t)hash_u64(key) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        const struct merge_entry *e = &t->merges[i];
        if (e->id < 0) return NULL;
        if (e->key == key) return e;
    }
}

/* GPT-2's bytes_to_unicode, inverted: code point -> byte, -1 if the point is not in the alphabet. */
static int byte_of_cp[324];
static void byte_table_init(void)
{
    for (int i = 0; i < 324; i++) byte_of_cp[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        if (printable) byte_of_cp[b] = b;
        else byte_of_cp[256 + n++] = b;
    }
}

/* Byte-level string (UTF-8 of alphabet code points) -> raw bytes in out; length, or -1 if not in the alphabet. */
static long unbyte(const char *s, size_t n, char *out)
{
    long k = 0;
    utf8proc_ssize_t i = 0;
    while ((size_t)i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t m = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)n - i, &cp);
        if (m <= 0 || cp < 0 || cp >= 324 || byte_of_cp[cp] < 0) return -1;
        out[k++] = (char)byte_of_cp[cp];
        i += m;
    }
    return k;
}

static int cmp_added(const void *a, const void *b)
{
    const struct added *x = a, *y = b;
    return x->len != y->len ? (x->len < y->len ? 1 : -1) : (x->id > y->id) - (x->id < y->id);
}

static void set_token(struct tokenizer *t, int32_t id, const char *bytes, size_t n)
{
    if ((uint32_t)id >= t->n_ids) {
        uint32_t nn = (uint32_t)id + 1;
        if (nn > t->tok_cap) { /* geometric: ids mostly arrive in increasing order */
            t->tok_cap = nn < 1024 ? 2048 : nn * 2;
            t->tok = xrealloc(t->tok, t->tok_cap * sizeof *t->tok);
        }
        for (uint32_t i = t->n_ids; i < nn; i++) t->tok[i] = (struct bytes_ref){0, UINT32_MAX};
        t->n_ids = nn;
    }
    t->tok[id] = (struct bytes_ref){arena_add(t, bytes, n), (uint32_t)n};
}

int tokenizer_load(tokenizer **out, const char *path, errbuf *err)
{
    static int table_ready;
    if (!table_ready) { byte_table_init(); table_ready = 1; }
    *out = NULL;
    char file[4096];
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(file, sizeof file, "%s/tokenizer.json", path);
    else snprintf(file, sizeof file, "%s", path);
    json_t *root;
    int rc = json_file_load(&root, file, 0, err);
    if (rc) return rc;
    struct tokenizer *t = xcalloc(1, sizeof *t);
    int ret = -EINVAL;
    char *buf = NULL;
    json_t *model = json_object_get(root, "model");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (!model || !mtype || strcmp(mtype, "BPE") != 0) {
        errbuf_set(err, EINVAL, "%s: model.type is not \"BPE\"", file); goto fail;
    }
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab) || !json_is_array(merges)) {
        errbuf_set(err, EINVAL, "%s: model.vocab must be an object and model.merges an array", file); goto fail;
    }
    /* normalizer: null or NFC (a Sequence of one NFC too) */
    json_t *norm = json_object_get(root, "normalizer");
    if (norm && !json_is_null(norm)) {
        const char *nt = json_string_value(json_object_get(norm, "type"));
        if (nt && strcmp(nt, "Sequence") == 0 && json_array_size(json_object_get(norm, "normalizers")) == 1) {
            norm = json_array_get(json_object_get(norm, "normalizers"), 0);
            nt = json_string_value(json_object_get(norm, "type"));
        }
        if (!nt || strcmp(nt, "NFC") != 0) {
            errbuf_set(err, ENOTSUP, "%s: normalizer %s not supported (only NFC)", file, nt ? nt : "?"); goto fail;
        }
        t->nfc = true;
    }
    /* pre-tokenizer: Sequence[Split(Regex, Isolated), ByteLevel(use_regex false)] */
    json_t *pre = json_object_get(root, "pre_tokenizer");
    const char *regex = NULL;
    if (pre && json_is_array(json_object_get(pre, "pretokenizers"))) {
        size_t i; json_t *p;
        json_array_foreach(json_object_get(pre, "pretokenizers"), i, p) {
            const char *pt = json_string_value(json_object_get(p, "type"));
            if (pt && strcmp(pt, "Split") == 0) {
                regex = json_string_value(json_object_get(json_object_get(p, "pattern"), "Regex"));
                const char *beh = json_string_value(json_object_get(p, "behavior"));
                if (!beh || strcmp(beh, "Isolated") != 0 || json_is_true(json_object_get(p, "invert"))) {
                    errbuf_set(err, ENOTSUP, "%s: Split pre-tokenizer behavior must be Isolated", file); goto fail;
                }
            } else if (pt && strcmp(pt, "ByteLevel") == 0) {
                if (json_is_true(json_object_get(p, "add_prefix_space")) || json_is_true(json_object_get(p, "use_regex"))) {
                    errbuf_set(err, ENOTSUP, "%s: ByteLevel with add_prefix_space/use_regex not supported", file);
                    goto fail;
                }
            } else {
                errbuf_set(err, ENOTSUP, "%s: pre-tokenizer %s not supported", file, pt ? pt : "?"); goto fail;
            }
        }
    }
    if (!regex) { errbuf_set(err, ENOTSUP, "%s: no Split regex pre-tokenizer", file); goto fail; }
    int ec; PCRE2_SIZE eo;
    t->re = pcre2_compile((PCRE2_SPTR)regex, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!t->re) {
        PCRE2_UCHAR m[256]; pcre2_get_error_message(ec, m, sizeof m);
        errbuf_set(err, EINVAL, "%s: pre-tokenizer regex at %zu: %s", file, (size_t)eo, (char *)m); goto fail;
    }
    t->re_jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;

    /* vocab */
    size_t nv = json_object_size(vocab);
    buf = xmalloc(1 << 16);
    const char *key; json_t *val;
    json_object_foreach(vocab, key, val) {
        json_int_t id = json_integer_value(val);
        size_t kl = strlen(key);
        if (!json_is_integer(val) || id < 0 || id >= (1 << 28) || kl >= (1 << 16)) {
            errbuf_set(err, EINVAL, "%s: model.vocab[\"%.40s\"]: bad id", file, key); goto fail;
        }
        long n = unbyte(key, kl, buf);
        if (n < 0) continue; /* not a byte-level token: unreachable by encoding */
        set_token(t, (int32_t)id, buf, (size_t)n);
    }
    uint32_t vcap = 1; while (vcap < 2 * nv + 2) vcap <<= 1;
    t->vocab.slot = xcalloc(vcap, sizeof *t->vocab.slot); t->vocab.mask = vcap - 1;
    for (uint32_t id = 0; id < t->n_ids; id++) if (t->tok[id].len != UINT32_MAX) vocab_insert(t, (int32_t)id);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = vocab_find(t, &c, 1);
        if (t->byte_id[b] < 0) { errbuf_set(err, EINVAL, "%s: vocab lacks byte 0x%02x", file, b); goto fail; }
    }
    /* merges: "a b" strings or ["a", "b"] pairs, rank = index */
    size_t nm = json_array_size(merges);
    uint32_t mcap = 1; while (mcap < 2 * nm + 2) mcap <<= 1;
    t->merges = xmalloc(mcap * sizeof *t->merges); t->merge_mask = mcap - 1;
    for (uint32_t i = 0; i < mcap; i++) t->merges[i].id = -1;
    for (size_t r = 0; r < nm; r++) {
        json_t *m = json_array_get(merges, r);
        const char *a, *b; size_t al, bl;
        if (json_is_string(m)) {
            a = json_string_value(m);
            const char *sp = strchr(a, ' ');
            if (!sp) { errbuf_set(err, EINVAL, "%s: model.merges[%zu] has no space", file, r); goto fail; }
            al = (size_t)(sp - a); b = sp + 1; bl = strlen(b);
        } else if (json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0)); al = strlen(a);
            b = json_string_value(json_array_get(m, 1)); bl = strlen(b);
        } else { errbuf_set(err, EINVAL, "%s: model.merges[%zu] is not a pair", file, r); goto fail; }
        if (al + bl >= (1 << 15)) continue;
        long la = unbyte(a, al, buf), lb = la < 0 ? -1 : unbyte(b, bl, buf + la);
        if (la < 0 || lb < 0) continue;
        int32_t ia = vocab_find(t, buf, (size_t)la), ib = vocab_find(t, buf + la, (size_t)lb);
        int32_t ic = vocab_find(t, buf, (size_t)(la + lb));
        if (ia < 0 || ib < 0 || ic < 0) continue; /* HF refuses such files; a merge that cannot apply is harmless */
        uint64_t k = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
        for (uint32_t i = (uint32_t)hash_u64(k) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
            if (t->merges[i].id < 0) { t->merges[i] = (struct merge_entry){k, (uint32_t)r, ic}; break; }
            if (t->merges[i].key == k) break; /* first rank wins */
        }
    }
    /* added tokens, matched on the raw text */
    json_t *added = json_object_get(root, "added_tokens");
    t->added = xcalloc(json_array_size(added) + 1, sizeof *t->added);
    size_t i; json_t *a;
    json_array_foreach(added, i, a) {
        const char *c = json_string_value(json_object_get(a, "content"));
        json_int_t id = json_integer_value(json_object_get(a, "id"));
        if (!c || !*c || id < 0 || id >= (1 << 28)) { errbuf_set(err, EINVAL, "%s: added_tokens[%zu] bad", file, i); goto fail; }
        if (json_is_true(json_object_get(a, "lstrip")) || json_is_true(json_object_get(a, "rstrip")) ||
            json_is_true(json_object_get(a, "single_word")) || json_is_true(json_object_get(a, "normalized"))) {
            errbuf_set(err, ENOTSUP, "%s: added token %s: lstrip/rstrip/single_word/normalized not supported", file, c);
            goto fail;
        }
        set_token(t, (int32_t)id, c, strlen(c));
        t->added[t->n_added++] = (struct added){t->tok[id].off, t->tok[id].len, (int32_t)id};
        t->added_first[(unsigned char)c[0]] = 1;
    }
    qsort(t->added, t->n_added, sizeof *t->added, cmp_added);
    free(buf);
    json_decref(root);
    *out = t;
    return 0;
fail:
    ret = -EINVAL;
    free(buf);
    json_decref(root);
    tokenizer_destroy(&t);
    return ret;
}

void tokenizer_destroy(tokenizer **tp)
{
    struct tokenizer *t = *tp;
    if (!t) return;
    free(t->arena); free(t->tok); free(t->vocab.slot); free(t->merges); free(t->added);
    if (t->re) pcre2_code_free(t->re);
    free(t);
    *tp = NULL;
}

uint32_t tokenizer_vocab_size(const tokenizer *t) { return t->n_ids; }

int32_t tokenizer_token_id(const tokenizer *t, const char *text)
{
    size_t n = strlen(text);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && memcmp(t->arena + t->added[i].off, text, n) == 0) return t->added[i].id;
    return vocab_find(t, text, n);
}

/* ---- output ---- */

static void buf_push(tok_buf *b, int32_t id, uint32_t s, uint32_t e)
{
    if (b->n == b->cap) {
        b->cap = b->cap ? b->cap * 2 : 256;
        b->ids = xrealloc(b->ids, b->cap * sizeof *b->ids);
        b->start = xrealloc(b->start, b->cap * sizeof *b->start);
        b->end = xrealloc(b->end, b->cap * sizeof *b->end);
    }
    b->ids[b->n] = id; b->start[b->n] = s; b->end[b->n] = e; b->n++;
}

void tok_buf_free(tok_buf *b)
{
    free(b->ids); free(b->start); free(b->end);
    struct tok_scratch *s = b->scratch;
    if (s) {
        if (s->md) pcre2_match_data_free(s->md);
        free(s->slot); free(s->keys); free(s->cids);
        free(s->sid); free(s->prev); free(s->next); free(s->sstart); free(s->heap);
        free(s);
    }
    memset(b, 0, sizeof *b);
}

/* ---- BPE on one pre-token ---- */

static bool heap_less(const struct heap_item *a, const struct heap_item *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(struct tok_scratch *s, size_t *n, struct heap_item it)
{
    if (*n == s->hcap) { s->hcap = s->hcap ? s->hcap * 2 : 256; s->heap = xrealloc(s->heap, s->hcap * sizeof *s->heap); }
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&it, &s->heap[p])) break;
        s->heap[i] = s->heap[p]; i = p;
    }
    s->heap[i] = it;
}

static struct heap_item heap_pop(struct tok_scratch *s, size_t *n)
{
    struct heap_item top = s->heap[0], last = s->heap[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&s->heap[c + 1], &s->heap[c])) c++;
        if (!heap_less(&s->heap[c], &last)) break;
        s->heap[i] = s->heap[c]; i = c;
    }
    if (*n) s->heap[i] = last;
    return top;
}

static void try_pair(const struct tokenizer *t, struct tok_scratch *s, size_t *hn, int32_t pos)
{
    int32_t nx = s->next[pos];
    if (nx < 0) return;
    const struct merge_entry *m = merge_find(t, s->sid[pos], s->sid[nx]);
    if (m) heap_push(s, hn, (struct heap_item){m->rank, pos, m->id});
}

/* Emit the ids of word w[0..n) (at text offset base) into buf. */
static void bpe_word(const struct tokenizer *t, struct tok_scratch *s, tok_buf *buf, const char *w, size_t n, uint32_t base)
{
    if (t->ignore_merges) {
        int32_t id = vocab_find(t, w, n);
        if (id >= 0) { buf_push(buf, id, base, base + (uint32_t)n); return; }
    }
    if (n > s->wcap) {
        s->wcap = n * 2;
        s->sid = xrealloc(s->sid, s->wcap * sizeof *s->sid);
        s->prev = xrealloc(s->prev, s->wcap * sizeof *s->prev);
        s->next = xrealloc(s->next, s->wcap * sizeof *s->next);
        s->sstart = xrealloc(s->sstart, s->wcap * sizeof *s->sstart);
    }
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        s->sid[i] = t->byte_id[(unsigned char)w[i]];
        s->prev[i] = (int32_t)i - 1;
        s->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) try_pair(t, s, &hn, (int32_t)i);
    while (hn) {
        struct heap_item it = heap_pop(s, &hn);
        int32_t p = it.pos;
        if (s->sid[p] < 0 || s->next[p] < 0) continue;
        const struct merge_entry *m = merge_find(t, s->sid[p], s->sid[s->next[p]]);
        if (!m || m->id != it.id) continue; /* stale */
        int32_t nx = s->next[p];
        s->sid[p] = m->id;
        s->sid[nx] = -1;
        s->next[p] = s->next[nx];
        if (s->next[p] >= 0) s->prev[s->next[p]] = p;
        if (s->prev[p] >= 0) try_pair(t, s, &hn, s->prev[p]);
        try_pair(t, s, &hn, p);
    }
    for (int32_t i = 0; i >= 0; i = s->next[i]) {
        uint32_t e = s->next[i] >= 0 ? (uint32_t)s->next[i] : (uint32_t)n;
        buf_push(buf, s->sid[i], base + (uint32_t)i, base + e);
    }
}

static void cache_clear(struct tok_scratch *s)
{
    memset(s->slot, 0, CACHE_SLOTS * sizeof *s->slot);
    s->used = 0; s->keys_len = 0; s->cids_len = 0;
}

/* BPE through the per-thread cache (ids cached with offsets relative to the word). */
static void encode_word(const struct tokenizer *t, struct tok_scratch *s, tok_buf *buf, const char *w, size_t n, uint32_t base)
{
    if (n > CACHE_MAX_WORD) { bpe_word(t, s, buf, w, n, base); return; }
    uint64_t h = hash_bytes(w, n) | 1;
    size_t i = (size_t)h & (CACHE_SLOTS - 1);
    for (;; i = (i + 1) & (CACHE_SLOTS - 1)) {
        struct cache_slot *c = &s->slot[i];
        if (!c->hash) break;
        if (c->hash == h && c->len == n && memcmp(s->keys + c->off, w, n) == 0) {
            uint32_t pos = base;
            for (uint32_t k = 0; k < c->n_ids; k++) {
                int32_t id = s->cids[c->ids_off + k];
                uint32_t l = t->tok[id].len;
                buf_push(buf, id, pos, pos + l);
                pos += l;
            }
            return;
        }
    }
    size_t before = buf->n;
    bpe_word(t, s, buf, w, n, base);
    if (s->used * 2 >= CACHE_SLOTS) { cache_clear(s); i = (size_t)h & (CACHE_SLOTS - 1); }
    size_t k = buf->n - before;
    if (s->keys_len + n > s->keys_cap) { s->keys_cap = (s->keys_cap + n) * 2; s->keys = xrealloc(s->keys, s->keys_cap); }
    if (s->cids_len + k > s->cids_cap) { s->cids_cap = (s->cids_cap + k) * 2; s->cids = xrealloc(s->cids, s->cids_cap * sizeof *s->cids); }
    while (s->slot[i].hash) i = (i + 1) & (CACHE_SLOTS - 1);
    s->slot[i] = (struct cache_slot){h, (uint32_t)s->keys_len, (uint32_t)n, (uint32_t)s->cids_len, (uint32_t)k};
    memcpy(s->keys + s->keys_len, w, n); s->keys_len += n;
    memcpy(s->cids + s->cids_len, buf->ids + before, k * sizeof *s->cids); s->cids_len += k;
    s->used++;
}

/* One segment between added tokens: normalize, split by the regex, BPE each piece. */
static void encode_segment(const struct tokenizer *t, struct tok_scratch *s, tok_buf *buf, const char *text, size_t len, uint32_t base)
{
    if (!len) return;
    const char *seg = text;
    size_t slen = len;
    utf8proc_uint8_t *nfc = NULL;
    bool exact = true;
    if (t->nfc) {
        bool ascii = true;
        for (size_t i = 0; i < len && ascii; i++) ascii = (unsigned char)text[i] < 0x80;
        if (!ascii) {
            utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &nfc,
                                              UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (r >= 0) {
                seg = (const char *)nfc; slen = (size_t)r;
                exact = slen == len && memcmp(seg, text, len) == 0;
            }
        }
    }
    size_t first = buf->n;
    PCRE2_SIZE off = 0;
    while (off < slen) {
        int rc = t->re_jit ? pcre2_jit_match(t->re, (PCRE2_SPTR)seg, slen, off, 0, s->md, NULL) : PCRE2_ERROR_JIT_BADOPTION;
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) /* no JIT, or its stack ran out: the interpreter */
            rc = pcre2_match(t->re, (PCRE2_SPTR)seg, slen, off, PCRE2_NO_UTF_CHECK, s->md, NULL);
        PCRE2_SIZE ms = slen, me = slen;
        if (rc > 0) { PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md); ms = ov[0]; me = ov[1]; }
        if (ms > off) encode_word(t, s, buf, seg + off, ms - off, base + (uint32_t)off); /* an unmatched gap */
        if (me > ms) encode_word(t, s, buf, seg + ms, me - ms, base + (uint32_t)ms);
        if (me == ms) { /* empty match: step one code point */
            if (me >= slen) break;
            size_t step = 1;
            while (ms + step < slen && ((unsigned char)seg[ms + step] & 0xc0) == 0x80) step++;
            encode_word(t, s, buf, seg + ms, step, base + (uint32_t)ms);
            me = ms + step;
        }
        off = me;
    }
    if (!exact)
        for (size_t i = first; i < buf->n; i++) { buf->start[i] = base; buf->end[i] = base + (uint32_t)len; }
    free(nfc);
}

int tokenizer_encode(const tokenizer *t, tok_buf *buf, const char *text, size_t len)
{
    if (len >= UINT32_MAX) return -E2BIG;
    if (!buf->scratch) {
        buf->scratch = xcalloc(1, sizeof *buf->scratch);
        buf->scratch->md = pcre2_match_data_create_from_pattern(t->re, NULL);
        buf->scratch->slot = xcalloc(CACHE_SLOTS, sizeof *buf->scratch->slot);
    }
    /* validate once so that the matcher need not check the UTF-8 on every call */
    for (size_t i = 0; i < len;) {
        unsigned char c = (unsigned char)text[i];
        if (c < 0x80) { i++; continue; }
        utf8proc_int32_t cp;
        utf8proc_ssize_t m = utf8proc_iterate((const utf8proc_uint8_t *)text + i, (utf8proc_ssize_t)(len - i), &cp);
        if (m <= 0) return -EILSEQ;
        i += (size_t)m;
    }
    size_t seg = 0;
    for (size_t p = 0; p < len; p++) {
        if (!t->added_first[(unsigned char)text[p]]) continue;
        for (size_t k = 0; k < t->n_added; k++) {
            const struct added *a = &t->added[k];
            if (a->len <= len - p && memcmp(t->arena + a->off, text + p, a->len) == 0) {
                encode_segment(t, buf->scratch, buf, text + seg, p - seg, (uint32_t)seg);
                buf_push(buf, a->id, (uint32_t)p, (uint32_t)(p + a->len));
                p += a->len - 1;
                seg = p + 1;
                break;
            }
        }
    }
    encode_segment(t, buf->scratch, buf, text + seg, len - seg, (uint32_t)seg);
    return 0;
}

char *tokenizer_normalize(const tokenizer *t, const char *s, size_t n, size_t *len)
{
    if (!t->nfc) return NULL;
    size_t i = 0;
    while (i < n && (unsigned char)s[i] < 0x80) i++;
    if (i == n) return NULL;
    utf8proc_uint8_t *out = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &out, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r < 0) return NULL;
    if ((size_t)r == n && !memcmp(out, s, n)) { free(out); return NULL; }
    *len = (size_t)r;
    return (char *)out;
}

char *tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, size_t *len)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && (uint32_t)ids[i] < t->n_ids && t->tok[ids[i]].len != UINT32_MAX) total += t->tok[ids[i]].len;
    char *out = xmalloc(total + 1), *p = out;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= t->n_ids || t->tok[ids[i]].len == UINT32_MAX) continue;
        memcpy(p, t->arena + t->tok[ids[i]].off, t->tok[ids[i]].len);
        p += t->tok[ids[i]].len;
    }
    *p = 0;
    if (len) *len = total;
    return out;
}

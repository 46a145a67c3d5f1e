/* dflash_tok_golden: checks one tokenizer/chat-template golden file (tests/goldens/README.md) against the C
 * tokenizer and templates. usage: dflash_tok_golden CASE.json [TOKENIZERS_DIR]; the tokenizer is
 * TOKENIZERS_DIR/<"tokenizer" field>/ (default build/tokenizers). Prints "ok <name>" or "FAIL <name>: why" per text
 * and per chat, then "golden <file>: N compared, N failed". Exit 0 all matched, 1 a mismatch, 77 no tokenizer files. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat_template.h"
#include "json_util.h"
#include "tokenizer.h"

static int compare_ids(const json_t *want, const tok_buf *b, char *why, size_t n)
{
    size_t wn = json_array_size(want);
    for (size_t i = 0; i < wn && i < b->n; i++) {
        json_int_t w = json_integer_value(json_array_get(want, i));
        if (w != b->ids[i]) { snprintf(why, n, "id %zu: got %d, want %lld", i, b->ids[i], (long long)w); return 1; }
    }
    if (wn != b->n) { snprintf(why, n, "got %zu ids, want %zu", b->n, wn); return 1; }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) { fprintf(stderr, "usage: %s CASE.json [TOKENIZERS_DIR]\n", argv[0]); return 2; }
    const char *dir = argc > 2 ? argv[2] : "build/tokenizers";
    json_t *root;
    errbuf jerr;
    if (json_file_load(&root, argv[1], 0, &jerr)) { fprintf(stderr, "%s\n", jerr.msg); return 2; }
    const char *name = json_string_value(json_object_get(root, "tokenizer"));
    if (!name) { fprintf(stderr, "%s: no \"tokenizer\" field\n", argv[1]); return 2; }
    char path[4096], family[64];
    snprintf(path, sizeof path, "%s/%s/tokenizer.json", dir, name);
    if (access(path, R_OK) != 0) { printf("no tokenizer files at %s (make tokenizers fetches them)\n", path); return 77; }
    snprintf(family, sizeof family, "%s", name);
    family[strcspn(family, "-")] = 0;
    enum chat_template_kind kind;
    int have_tpl = chat_template_parse(family, &kind) == 0;
    errbuf err;
    tokenizer *t;
    if (tokenizer_load(&t, path, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    tok_buf b = {0};
    int compared = 0, failed = 0;
    char why[640];
    size_t i; json_t *c;
    json_array_foreach(json_object_get(root, "texts"), i, c) {
        const char *text = json_string_value(json_object_get(c, "text"));
        size_t len = json_string_length(json_object_get(c, "text"));
        tok_buf_clear(&b);
        int bad = tokenizer_encode(t, &b, text, len) ? (snprintf(why, sizeof why, "encode failed"), 1)
                                                     : compare_ids(json_object_get(c, "ids"), &b, why, sizeof why);
        if (!bad) { /* decoding gives the normalized text back */
            size_t dl, nl = 0;
            char *d = tokenizer_decode(t, b.ids, b.n, &dl), *norm = tokenizer_normalize(t, text, len, &nl);
            if (!norm) nl = len;
            if (dl != nl || memcmp(d, norm ? norm : text, dl)) { snprintf(why, sizeof why, "decode differs"); bad = 1; }
            free(d); free(norm);
        }
        compared++; failed += bad;
        if (bad) printf("FAIL text-%zu: %s (text %.60s)\n", i, why, text); else printf("ok text-%zu\n", i);
    }
    chat_text ct = {0};
    json_array_foreach(json_object_get(root, "chats"), i, c) {
        compared++;
        if (!have_tpl) { printf("FAIL chat-%zu: no chat template for %s\n", i, name); failed++; continue; }
        json_t *msgs = json_object_get(c, "messages");
        size_t n = json_array_size(msgs);
        struct chat_msg *m = calloc(n ? n : 1, sizeof *m);
        for (size_t k = 0; k < n; k++) {
            m[k].role = json_string_value(json_object_get(json_array_get(msgs, k), "role"));
            m[k].content = json_string_value(json_object_get(json_array_get(msgs, k), "content"));
        }
        int bad = 0;
        const char *want_text = json_string_value(json_object_get(c, "text"));
        if (chat_template_render(kind, m, n, &ct, &err)) { snprintf(why, sizeof why, "render: %s", err.msg); bad = 1; }
        else if (!want_text || strcmp(ct.text, want_text)) {
            size_t k = 0;
            while (want_text && ct.text[k] && ct.text[k] == want_text[k]) k++;
            snprintf(why, sizeof why, "text differs at byte %zu: got \"%.30s\"", k, ct.text + k); bad = 1;
        } else {
            tok_buf_clear(&b);
            if (tokenizer_encode(t, &b, ct.text, ct.len)) { snprintf(why, sizeof why, "encode failed"); bad = 1; }
            else bad = compare_ids(json_object_get(c, "ids"), &b, why, sizeof why);
            if (!bad) {
                uint8_t *mask = malloc(b.n + 1);
                chat_text_mask(&ct, b.start, b.end, b.n, mask);
                json_t *wm = json_object_get(c, "loss_mask");
                for (size_t k = 0; k < b.n && !bad; k++)
                    if (json_integer_value(json_array_get(wm, k)) != mask[k]) {
                        snprintf(why, sizeof why, "loss_mask %zu: got %d", k, mask[k]); bad = 1;
                    }
                free(mask);
            }
        }
        free(m);
        failed += bad;
        if (bad) printf("FAIL chat-%zu: %s\n", i, why); else printf("ok chat-%zu\n", i);
    }
    chat_text_free(&ct);
    const char *base = strrchr(argv[1], '/');
    printf("golden %s: %d compared, %d failed\n", base ? base + 1 : argv[1], compared, failed);
    tok_buf_free(&b);
    tokenizer_destroy(&t);
    json_decref(root);
    return failed ? 1 : 0;
}

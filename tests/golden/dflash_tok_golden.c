/* dflash_tok_golden: checks one tokenizer/chat-template golden file (tests/goldens/README.md) against the C
 * tokenizer and the model's Jinja chat template (chat_template.h). usage: dflash_tok_golden CASE.json
 * [TOKENIZERS_DIR]; the model folder is TOKENIZERS_DIR/<"tokenizer" field>/ (default build/tokenizers). Per text:
 * ids and decoding; per chat (rendered with its "args", or enable_thinking=false when it has none, as the
 * tokenizer goldens were made): the text, the trained spans, the ids and the loss mask. Where the C tokenizer
 * cannot read the folder's tokenizer.json (not a byte-level BPE) the chats' text and spans are still compared and
 * a last line says the ids were not. Prints "ok <name>" or "FAIL <name>: why" per text and per chat, then
 * "golden <file>: N compared, N failed". Exit 0 all matched, 1 a mismatch, 77 no tokenizer files. */
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

/* The template of dir with the chat's args (each key=JSON value); NULL with why set. */
static chat_template *template_for(const char *dir, const json_t *args, char *why, size_t n)
{
    chat_template *ct;
    errbuf err;
    if (chat_template_load(&ct, dir, NULL, &err)) { snprintf(why, n, "%s", err.msg); return NULL; }
    const char *k; json_t *v;
    json_object_foreach((json_t *)args, k, v) {
        char *val = json_dumps(v, JSON_ENCODE_ANY), kv[512];
        snprintf(kv, sizeof kv, "%s=%s", k, val);
        free(val);
        if (chat_template_set_arg(ct, kv, &err)) { snprintf(why, n, "%s", err.msg); chat_template_destroy(&ct); return NULL; }
    }
    return ct;
}

static int check_chat(const char *dir, const tokenizer *t, tok_buf *b, const json_t *c, const char *want_eot,
                      char *why, size_t wn)
{
    json_t *args = json_object_get(c, "args"), *dflt = NULL;
    if (!args) args = dflt = json_pack("{sb}", "enable_thinking", 0);
    chat_template *tpl = template_for(dir, args, why, wn);
    json_decref(dflt);
    if (!tpl) return 1;
    int bad = 0;
    chat_text ct = {0};
    errbuf err;
    const char *want_text = json_string_value(json_object_get(c, "text"));
    json_t *want_spans = json_object_get(c, "spans");
    if (want_eot && strcmp(want_eot, chat_template_eot(tpl))) {
        snprintf(why, wn, "end-of-turn marker %s, want %s", chat_template_eot(tpl), want_eot); bad = 1;
    } else if (chat_template_render(tpl, json_object_get(c, "messages"), json_object_get(c, "tools"), &ct, &err)) {
        snprintf(why, wn, "render: %s", err.msg); bad = 1;
    } else if (!want_text || strcmp(ct.text, want_text)) {
        size_t k = 0;
        while (want_text && ct.text[k] && ct.text[k] == want_text[k]) k++;
        snprintf(why, wn, "text differs at byte %zu: got \"%.30s\"", k, ct.text + k); bad = 1;
    } else if (want_spans && json_array_size(want_spans) != ct.n_spans) {
        snprintf(why, wn, "%zu spans, want %zu", ct.n_spans, json_array_size(want_spans)); bad = 1;
    } else {
        for (size_t k = 0; want_spans && k < ct.n_spans && !bad; k++) {
            json_int_t s = json_integer_value(json_array_get(json_array_get(want_spans, k), 0));
            json_int_t e = json_integer_value(json_array_get(json_array_get(want_spans, k), 1));
            if ((size_t)s != ct.spans[k].start || (size_t)e != ct.spans[k].end) {
                snprintf(why, wn, "span %zu: got [%zu, %zu), want [%lld, %lld)", k, ct.spans[k].start, ct.spans[k].end,
                         (long long)s, (long long)e);
                bad = 1;
            }
        }
        if (!bad && t) {
            tok_buf_clear(b);
            if (tokenizer_encode(t, b, ct.text, ct.len)) { snprintf(why, wn, "encode failed"); bad = 1; }
            else bad = compare_ids(json_object_get(c, "ids"), b, why, wn);
            if (!bad) {
                uint8_t *mask = malloc(b->n + 1);
                chat_text_mask(&ct, b->start, b->end, b->n, mask);
                json_t *wm = json_object_get(c, "loss_mask");
                for (size_t k = 0; k < b->n && !bad; k++)
                    if (json_integer_value(json_array_get(wm, k)) != mask[k]) {
                        snprintf(why, wn, "loss_mask %zu: got %d", k, mask[k]); bad = 1;
                    }
                free(mask);
            }
        }
    }
    chat_text_free(&ct);
    chat_template_destroy(&tpl);
    return bad;
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
    char path[4200], model[4096];
    snprintf(model, sizeof model, "%s/%s", dir, name);
    snprintf(path, sizeof path, "%s/tokenizer.json", model);
    if (access(path, R_OK) != 0) { printf("no tokenizer files at %s (make tokenizers fetches them)\n", path); return 77; }
    errbuf err;
    tokenizer *t = NULL;
    char no_ids[600] = "";
    if (tokenizer_load(&t, path, &err)) {
        if (json_array_size(json_object_get(root, "texts"))) { fprintf(stderr, "%s\n", err.msg); return 1; }
        snprintf(no_ids, sizeof no_ids, "%s", err.msg);
    }
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
    const char *want_eot = json_string_value(json_object_get(root, "eot"));
    json_array_foreach(json_object_get(root, "chats"), i, c) {
        int bad = check_chat(model, t, &b, c, want_eot, why, sizeof why);
        compared++; failed += bad;
        if (bad) printf("FAIL chat-%zu: %s\n", i, why); else printf("ok chat-%zu\n", i);
    }
    if (*no_ids) printf("chats' text and spans compared, not their ids: %s\n", no_ids);
    const char *base = strrchr(argv[1], '/');
    printf("golden %s: %d compared, %d failed\n", base ? base + 1 : argv[1], compared, failed);
    tok_buf_free(&b);
    tokenizer_destroy(&t);
    json_decref(root);
    return failed ? 1 : 0;
}

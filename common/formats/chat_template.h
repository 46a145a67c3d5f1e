/* chat_template: a conversation -> the text a model family's reference chat template renders (Qwen3 with thinking
 * off, Llama-3), with the byte spans the loss mask trains: each assistant message's content and its end-of-turn
 * token. Templates are written as code here (no Jinja), one function per family. No state; the caller owns the
 * output (chat_text_free). Errors: 0 / -EINVAL with a message naming the message index and role. */
#ifndef DFLASH_CHAT_TEMPLATE_H
#define DFLASH_CHAT_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

enum chat_template_kind { CHAT_TEMPLATE_QWEN3, CHAT_TEMPLATE_LLAMA3 };

struct chat_msg {
    const char *role;    /* system, user, assistant (qwen3 also: tool) */
    const char *content; /* UTF-8, NUL-terminated */
};

struct chat_span { size_t start, end; }; /* [start, end) bytes of chat_text.text */

typedef struct chat_text {
    char *text; size_t len, cap;
    struct chat_span *spans; size_t n_spans, spans_cap;
} chat_text;

/* "qwen3" / "llama3" -> kind; 0 or -EINVAL. */
int chat_template_parse(const char *name, enum chat_template_kind *out);
/* The kind named by a model's tokenizer_config.json chat_template (or its name); 0 or -ENOENT if not recognised. */
int chat_template_detect(const char *tokenizer_config_path, enum chat_template_kind *out, errbuf *err);
/* Render msgs[0..n) into out (cleared first); 0 or -EINVAL (unknown role, empty conversation). */
int chat_template_render(enum chat_template_kind kind, const struct chat_msg *msgs, size_t n, chat_text *out,
                         errbuf *err);
void chat_text_free(chat_text *t);
/* mask[i] = 1 where token i's byte range [start[i], end[i]) is non-empty and inside one of t's spans, else 0. */
void chat_text_mask(const chat_text *t, const uint32_t *start, const uint32_t *end, size_t n, uint8_t *mask);

#endif

/* chat_template: a conversation -> the text the model's own chat template renders (Jinja2, through jinja.h, as
 * transformers' apply_chat_template(messages, tools=, add_generation_prompt=False, **args) does), with the byte
 * spans the loss mask trains. The template comes from the model folder: chat_template.jinja, else
 * tokenizer_config.json "chat_template" (a string, or a list of named templates: "default", and "tool_use" when
 * a conversation has tools), with the special tokens of tokenizer_config.json (bos_token, eos_token, ...).
 *
 * The spans, whatever the template: an assistant message i's span is what the model generates for it. It starts
 * where the rendering leaves the prompt the model is served with before that message, i.e. at the longest common
 * prefix of the rendering and render(messages[:i], add_generation_prompt=True) (all of that prompt when the
 * rendering continues it: after Qwen3's empty think block with thinking off, before its think block with thinking
 * on), and ends after the template's end-of-turn marker, the first one from there. The marker is found once by
 * rendering a probe conversation: the special token (<...>) that follows the assistant content. So the span holds
 * the reasoning when rendered, the content, tool calls, and the end-of-turn token; one extra rendering per
 * assistant message. tests/goldens/make_template_goldens.py computes the same spans with Hugging Face.
 * A template that marks the assistant's tokens with {% generation %} blocks (as Hugging Face's
 * return_assistant_tokens_mask reads them) gives the spans itself: one per block, no prefix renderings.
 *
 * A template dflash ships is chosen by the tokenizer's special tokens, before the folder's template: harmony
 * (common/formats/harmony.jinja) for gpt-oss's (<|channel|>); --template harmony names it, --template FILE wins.
 *
 * A loaded template is read-only (chat_template_set_arg before sharing it): render from any number of threads.
 * Errors: 0 / -errno with a message naming the file, the template line or the message index. */
#ifndef DFLASH_CHAT_TEMPLATE_H
#define DFLASH_CHAT_TEMPLATE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

typedef struct chat_template chat_template;

struct chat_span { size_t start, end; }; /* [start, end) bytes of chat_text.text */

typedef struct chat_text {
    char *text; size_t len;
    struct chat_span *spans; size_t n_spans, spans_cap;
} chat_text;

/* The template of model folder dir, or of template_file (a .jinja file) when given; 0 or -errno. */
int chat_template_load(chat_template **out, const char *dir, const char *template_file, errbuf *err);
void chat_template_destroy(chat_template **t);
/* Where the template came from (for messages). */
const char *chat_template_source(const chat_template *t);
/* Pass "key=value" to every rendering as a Jinja variable (value: JSON when it parses, else a string), as
 * apply_chat_template(**kwargs) does; then the end-of-turn marker is found again. 0 or -EINVAL. */
int chat_template_set_arg(chat_template *t, const char *key_value, errbuf *err);
/* The end-of-turn marker the spans end at (e.g. "<|im_end|>"). */
const char *chat_template_eot(const chat_template *t);
/* Render messages (a JSON array of message objects) with tools (NULL or a JSON array) into out (cleared first),
 * with one span per assistant message; 0 or -EINVAL (a template error, "message I: ..." for a span). */
int chat_template_render(const chat_template *t, const json_t *messages, const json_t *tools, chat_text *out,
                         errbuf *err);
/* The prompt the model is served with for its next assistant turn after messages (a JSON array, may be empty):
 * the rendering with add_generation_prompt=True, malloc'd in *out (length in *len); 0 or -EINVAL. */
int chat_template_render_prompt(const chat_template *t, const json_t *messages, const json_t *tools, char **out,
                                size_t *len, errbuf *err);
void chat_text_free(chat_text *t);
/* mask[i] = 1 where token i's byte range [start[i], end[i]) is non-empty and inside one of t's spans, else 0. */
void chat_text_mask(const chat_text *t, const uint32_t *start, const uint32_t *end, size_t n, uint8_t *mask);

#endif

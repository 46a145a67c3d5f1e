/* jinja: a Jinja2 interpreter for the chat templates Hugging Face models ship (tokenizer_config.json "chat_template",
 * chat_template.jinja), rendering as transformers' apply_chat_template does: trim_blocks and lstrip_blocks on, one
 * trailing newline of the source dropped, loopcontrols, HF's tojson (ensure_ascii=False), raise_exception and
 * strftime_now. Data are jansson values (Python semantics: str/int/float/bool/None/list/dict, dicts in insertion
 * order); undefined is its own value, printed as "" and an error once an attribute of it is taken, as in Jinja.
 * Supported: {{ }}, {% if/elif/else, for (else, if-filter, loop.*), set (incl. tuples, ns.attr, set blocks),
 * macro, break/continue, raw, generation %}, {# #}, whitespace control {%- -%} {%+, the operators, tests, filters
 * and str/dict methods chat templates use. Not supported (a parse error): include, import, extends, block, call.
 * A parsed template is read-only: render it from any number of threads at once. Errors: 0 / -EINVAL with
 * "NAME:LINE: message" in the errbuf, LINE the template's line (raise_exception's message as is after it). */
#ifndef DFLASH_JINJA_H
#define DFLASH_JINJA_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "util.h"

typedef struct jinja_template jinja_template;

struct jinja_opts {
    bool trim_blocks, lstrip_blocks; /* Jinja's environment options (apply_chat_template sets both) */
};
/* The options apply_chat_template renders with. */
extern const struct jinja_opts jinja_hf_opts;

/* Parse src[0..len) (name: what errors call it, e.g. "DIR/tokenizer_config.json chat_template"); 0 or -EINVAL. */
int jinja_parse(jinja_template **out, const char *src, size_t len, const char *name, const struct jinja_opts *opts,
                errbuf *err);
void jinja_destroy(jinja_template **t);
/* Render with the variables of vars (a JSON object, not modified); *out is malloc'd and NUL-terminated (length in
 * *len), NULL on error; 0 or -EINVAL. */
int jinja_render(const jinja_template *t, const json_t *vars, char **out, size_t *len, errbuf *err);
/* jinja_render, and where the {% generation %} blocks (HF's mark of the assistant's tokens) put their output:
 * *spans (malloc'd, NULL when none) holds start, end byte offsets of *out per block, *n_spans blocks; blocks run
 * inside a set block or a macro call are not counted (their output is a value, not the rendering's). */
int jinja_render_spans(const jinja_template *t, const json_t *vars, char **out, size_t *len, size_t **spans,
                       size_t *n_spans, errbuf *err);
/* Whether the template has {% generation %} blocks. */
bool jinja_has_generation(const jinja_template *t);

#endif

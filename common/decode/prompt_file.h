/* prompt_file: reads the prompts of a JSONL file in the format dflash-prepare reads: one JSON object per line with
 * "input_ids" and optionally "loss_mask" (0/1 or booleans) or "labels" (-100 = not trained). A line's prompt is its
 * leading run of untrained tokens (loss_mask 0 / labels -100); a line with input_ids only is all prompt; what
 * follows the prompt is kept as the line's continuation. Blank lines are skipped. Errors name the file, the line
 * and the field. Not thread-safe per object. */
#ifndef DFLASH_PROMPT_FILE_H
#define DFLASH_PROMPT_FILE_H

#include <stdint.h>

#include "util.h"

typedef struct prompt_line {
    int lineno;           /* 1-based line of the file */
    int32_t *ids;         /* (len) prompt then continuation */
    int len, plen;        /* whole line, prompt */
} prompt_line;

typedef struct prompt_set {
    prompt_line *v;
    int n;
} prompt_set;

/* Read at most limit lines (limit <= 0: all) whose ids must lie in [0, vocab). An empty file (no line) is an error. */
int prompt_file_read(prompt_set *out, const char *path, int vocab, int limit, errbuf *err);
void prompt_set_free(prompt_set *s);

#endif

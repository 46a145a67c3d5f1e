/* json_util: small jansson helpers shared by the JSON readers (hf_config, safetensors headers and indexes, the
 * tokenizer, job identities). No state; errors return -errno with the message in an errbuf. */
#ifndef DFLASH_JSON_UTIL_H
#define DFLASH_JSON_UTIL_H

#include <jansson.h>

#include "util.h"

/* The JSON type of v as error messages name it: object, array, string, integer, real, boolean or null. */
const char *json_type_name(const json_t *v);

/* Parse the JSON file at path into *out (the caller json_decrefs it). A parse error is "path:line[:column]: invalid
 * JSON: ..." (-EINVAL); a file that cannot be read is "path: <strerror>" (-errno), never a position: jansson says
 * line -1 there. */
int json_file_load(json_t **out, const char *path, size_t flags, errbuf *err);
/* Write o to path atomically (path.tmp, then rename): 0, or -errno with "path: reason" in err. o is not consumed. */
int json_file_save(const json_t *o, const char *path, size_t flags, errbuf *err);

#endif

/* json_util: small jansson helpers shared by the JSON readers (hf_config, safetensors headers and indexes).
 * No allocation, no state. */
#ifndef DFLASH_JSON_UTIL_H
#define DFLASH_JSON_UTIL_H

#include <jansson.h>

/* The JSON type of v as error messages name it: object, array, string, integer, real, boolean or null. */
const char *json_type_name(const json_t *v);

#endif

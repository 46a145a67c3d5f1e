/* config: one declarative table per service (redis-style) drives the INI file parser (inih), command-line
 * overrides (`--set section.key=value`), `config get`, the dump and the help text. Values are written into a
 * caller-owned struct at each field's offset. Tables are static and read-only; an object is not locked (callers
 * that change it at run time serialise access). Errors return -errno and fill an errbuf naming the file:line (or
 * the override's source) and the section.key. */
#ifndef DFLASH_CONFIG_H
#define DFLASH_CONFIG_H

#include <stddef.h>
#include <stdio.h>

#include "util.h"

#define CONFIG_STRING_MAX 256 /* char[CONFIG_STRING_MAX] including the NUL */
#define CONFIG_LIST_MAX 64

enum config_type { CONFIG_INT, CONFIG_DOUBLE, CONFIG_BOOL, CONFIG_STRING, CONFIG_INT_LIST, CONFIG_ENUM };

/* Storage of a CONFIG_INT_LIST field; written as "1, 2, 3" (brackets optional) in a file. */
typedef struct config_int_list {
    int n;
    int v[CONFIG_LIST_MAX];
} config_int_list;

/* One field. Storage at `offset`: int (INT, BOOL, ENUM), double, char[CONFIG_STRING_MAX], config_int_list.
 * Bounds [min, max] apply when min < max (to each element of a list; ignored for BOOL, STRING and ENUM).
 * An ENUM's value is the index of its name in `choices` (NULL-terminated), e.g. {"cpu", "cuda", NULL}.
 * default_value is parsed like a file value (NULL: 0 / empty). A table ends with an all-zero entry. */
typedef struct config_field {
    const char *section, *name;
    enum config_type type;
    size_t offset;
    double min, max;
    const char *default_value;
    int runtime_changeable;
    const char *help;
    const char *const *choices; /* ENUM only: the accepted names, NULL-terminated */
} config_field;

/* Apply every default (an invalid default in a table is a programming error: DF_ASSERT). */
void config_defaults(const config_field *table, void *obj);
/* Read an INI file over obj: unknown section/key, a key given twice, bad or out-of-range values are errors
 * "<file>:<line>: <section>.<key>: ...". Values not in the file keep what obj held. */
int config_load_file(const config_field *table, void *obj, const char *path, errbuf *err);
/* Same, from a string; `name` stands in for the file name in messages. */
int config_load_string(const config_field *table, void *obj, const char *text, const char *name, errbuf *err);
/* Set one value by "section.key" (command-line override, runtime change); errors "<source>: <section.key>: ...". */
int config_set(const config_field *table, void *obj, const char *key, const char *value, const char *source,
               errbuf *err);
/* 1 when arg has the form of a --set override, "section.key=value" (a non-empty key, then '='): a command
 * line without it is a usage error (exit 2), a well-formed one naming an unknown key or a bad value is not. */
int config_arg_well_formed(const char *arg);
/* Parse "section.key=value" (the argument of --set) and config_set it. */
int config_set_arg(const config_field *table, void *obj, const char *arg, const char *source, errbuf *err);
/* Format the value of "section.key" into buf[n]; -ENOENT for an unknown key, -ERANGE if it did not fit. */
int config_get(const config_field *table, const void *obj, const char *key, char *buf, size_t n);
/* The field for "section.key", or NULL (callers check runtime_changeable before a runtime change). */
const config_field *config_find(const config_field *table, const char *key);
/* Print every field as INI (re-reads to the same values). */
void config_dump(const config_field *table, const void *obj, FILE *out);
/* Print each field: section.name, type, bounds, default, runtime-changeable, help. */
void config_help(const config_field *table, FILE *out);

#endif

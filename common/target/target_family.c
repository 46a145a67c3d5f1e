/* target_family: the rows of target_families.def, the one lookup, and the checks and names built from them. */
#include "target_family.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define TARGET_FAMILY(id) extern const target_family target_##id##_family;
#include "target_families.def"
#undef TARGET_FAMILY

static const target_family *const families[] = {
#define TARGET_FAMILY(id) &target_##id##_family,
#include "target_families.def"
#undef TARGET_FAMILY
};
#define NFAMILIES (sizeof families / sizeof families[0])

const target_family *target_family_of(const hf_config *c)
{
    for (size_t i = 0; i < NFAMILIES; i++)
        if (families[i]->takes(c)) return families[i];
    return NULL;
}

const char *target_backend_name(enum target_backend be) { return be == TARGET_BACKEND_CUDA ? "cuda" : "cpu"; }

/* "a and b and c": the abouts of the families that can do `can` on be (or the names of what f can do on be). */
static void join_families(char *out, size_t cap, enum target_backend be, unsigned can)
{
    size_t at = 0;
    out[0] = '\0';
    for (size_t i = 0; i < NFAMILIES; i++) {
        if ((families[i]->can[be] & can) != can) continue;
        int n = snprintf(out + at, cap - at, "%s%s", at ? " and " : "", families[i]->about);
        if (n < 0 || (size_t)n >= cap - at) break;
        at += (size_t)n;
    }
    if (!at) snprintf(out, cap, "no target family");
}

static void join_can(char *out, size_t cap, unsigned can)
{
    static const char *const names[] = {"the packed forward", "decoding with a KV cache"};
    size_t at = 0;
    out[0] = '\0';
    for (int b = 0; b < 2; b++) {
        if (!(can & (1u << b))) continue;
        int n = snprintf(out + at, cap - at, "%s%s", at ? " and " : "", names[b]);
        if (n < 0 || (size_t)n >= cap - at) break;
        at += (size_t)n;
    }
    if (!at) snprintf(out, cap, "nothing");
}

int target_family_require(const hf_config *c, enum target_backend be, unsigned can, const char *what,
                          const target_family **out, errbuf *err)
{
    const target_family *f = target_family_of(c);
    if (out) *out = NULL;
    char list[512];
    if (!f) {
        join_families(list, sizeof list, be, can);
        const int cpu = be == TARGET_BACKEND_CPU;
        return errbuf_set(err, ENOTSUP, "%s%s%s%s supports %s; this target is %s", what, cpu ? "" : " on the ",
                          cpu ? "" : target_backend_name(be), cpu ? "" : " backend", list, c->model_type);
    }
    if ((f->can[be] & can) != can && !f->can[be])
        return errbuf_set(err, ENOTSUP, "%s on the %s backend: this target (%s) is of the target family %s, %s, "
                          "which the %s backend does not run yet", what, target_backend_name(be), c->model_type,
                          f->name, f->about, target_backend_name(be));
    if ((f->can[be] & can) != can) {
        join_can(list, sizeof list, f->can[be]);
        return errbuf_set(err, ENOTSUP, "%s on the %s backend: this target (%s) is of the target family %s, %s, "
                          "which has only %s there", what, target_backend_name(be), c->model_type, f->name,
                          f->about, list);
    }
    if (out) *out = f;
    return 0;
}

int target_tables_find(const hf_config *c, const st_file *st, target_tables *t, errbuf *err)
{
    const target_family *f;
    int rc = target_family_require(c, TARGET_BACKEND_CPU, 0, "the frozen tables", &f, err);
    if (rc) return rc;
    const char *prefix = f->prefix(st);
    snprintf(t->embed, sizeof t->embed, "%sembed_tokens.weight", prefix);
    snprintf(t->norm, sizeof t->norm, "%snorm.weight", prefix);
    t->tied = c->tie_embeddings;
    snprintf(t->lm_head, sizeof t->lm_head, "%s", t->tied ? t->embed : "lm_head.weight");
    t->norm_add = f->norm_add;
    return 0;
}

/* moe_all_experts: a MoE checkpoint whose every token is routed to every expert: a temporary folder holding the
 * source's config.json with num_experts_per_tok = the expert count and a link to its weights. The GPU runs bf16
 * activations and the CPU fp32: a top-k pick whose two candidates nearly tie can go either way, and a flip moves
 * that token's row far from the reference; with every expert picked nothing can flip, while the router (softmax,
 * norm_topk_prob), the grouping by expert, the expert GEMMs and the combine still do all their work. Include once. */
#ifndef DFLASH_MOE_ALL_EXPERTS_H
#define DFLASH_MOE_ALL_EXPERTS_H

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* dst (a mkdtemp template, PATH_MAX) <- the variant of checkpoint folder src; 0 or -1 (said on stdout). */
static int moe_all_experts_make(const char *src, char *dst)
{
    char path[PATH_MAX + 32], real[PATH_MAX];
    json_error_t jerr;
    snprintf(path, sizeof path, "%s/config.json", src);
    json_t *c = json_load_file(path, 0, &jerr);
    const char *ek = c && json_object_get(c, "num_experts") ? "num_experts" : "num_local_experts";
    json_t *e = c ? json_object_get(c, ek) : NULL;
    if (!json_is_integer(e) || !mkdtemp(dst)) {
        printf("FAIL moe_all_experts %s: %s\n", src, c ? "no expert count, or mkdtemp failed" : jerr.text);
        json_decref(c);
        return -1;
    }
    json_object_set_new(c, "num_experts_per_tok", json_integer(json_integer_value(e)));
    snprintf(path, sizeof path, "%s/config.json", dst);
    int rc = json_dump_file(c, path, JSON_INDENT(2));
    json_decref(c);
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    if (rc || !realpath(path, real)) return printf("FAIL moe_all_experts %s: cannot write the variant\n", src), -1;
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    if (symlink(real, path)) return printf("FAIL moe_all_experts %s: symlink: %s\n", src, strerror(errno)), -1;
    return 0;
}

static void moe_all_experts_remove(const char *dst)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.json", dst);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    unlink(path);
    rmdir(dst);
}

#endif

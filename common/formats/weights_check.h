/* weights_check: which weight of a checkpoint (a .safetensors file, an index or a folder: st_open) is not finite,
 * found by reading every float tensor once. Run only after a forward gave a NaN or an infinity (kernels/nonfinite.h:
 * the cheap check on the outputs), to name the tensor and layer that caused it. Stateless, thread-safe. */
#ifndef DFLASH_WEIGHTS_CHECK_H
#define DFLASH_WEIGHTS_CHECK_H

#include <stddef.h>

/* Always fills out: "weight model.layers.0.self_attn.q_proj.weight (layer 0) holds nan at [3, 5] (in FILE)", or that
 * every weight of path is finite (then the activations overflow), or why path could not be read. Returns 1 when a
 * non-finite weight was found, 0 otherwise. */
int weights_explain_nonfinite(const char *path, char *out, size_t n);

#endif

/* libFuzzer target: the input is a config.json text; hf_config_parse must accept or reject it with an error and
 * never crash, and an accepted config must be internally consistent. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hf_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text) abort();
    memcpy(text, data, size);
    text[size] = '\0';
    hf_config cfg;
    errbuf err;
    if (hf_config_parse(&cfg, text, "fuzz.json", &err) == 0) {
        if (cfg.hidden_size <= 0 || cfg.num_heads <= 0 || cfg.num_kv_heads <= 0 || cfg.head_dim <= 0) abort();
        if (cfg.num_heads % cfg.num_kv_heads != 0) abort();
        if (cfg.is_dflash && (cfg.num_taps < 1 || cfg.num_taps > HF_MAX_TAPS)) abort();
        for (int i = 0; cfg.is_dflash && i < cfg.num_taps; i++)
            if (cfg.taps[i] < 0 || cfg.taps[i] >= cfg.num_target_layers) abort();
    } else if (!memchr(err.msg, '\0', sizeof err.msg) || strncmp(err.msg, "fuzz.json", 9) != 0) {
        abort(); /* every error names the input */
    }
    free(text);
    return 0;
}

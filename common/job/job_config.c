#include "job_config.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "job_state.h"
#include "slot_pool.h"

#define F(sec, field, type, lo, hi, def, rt, help) \
    {#sec, #field, type, offsetof(job_config, sec.field), lo, hi, def, rt, help, NULL}
#define E(sec, field, choices, def, rt, help) \
    {#sec, #field, CONFIG_ENUM, offsetof(job_config, sec.field), 0, 0, def, rt, help, choices}

const char *const job_backend_names[] = {"cpu", "cuda", NULL};
_Static_assert(sizeof(enum job_backend) == sizeof(int), "a CONFIG_ENUM field is stored as an int");

const config_field job_config_table[] = {
    F(job, name, CONFIG_STRING, 0, 0, "dflash", 0,
      "job name; with run_dir it names the shared-memory segments (/dev/shm/dflash-<name>-<run_dir hash>-*)"),
    F(job, run_dir, CONFIG_STRING, 0, 0, "run", 0,
      "folder for logs, ledger, checkpoints and sockets; one live job each (a second dflashd is refused)"),
    F(job, seed, CONFIG_INT, 0, 2147483647, "1234", 0, "seed of data order, anchors and initial weights"),
    E(job, backend, job_backend_names, "cpu", 0,
      "compute backend: cpu (the reference) or cuda (the CUDA builds of the GPU workers)"),
    F(data, path, CONFIG_STRING, 0, 0, NULL, 0, "token shard file or folder of *.shard (dflash-prepare output)"),
    F(data, max_batch_tokens, CONFIG_INT, 2, 1 << 24, "512", 0, "token budget of one packed batch"),
    F(data, max_batch_seqs, CONFIG_INT, 1, 65536, "16", 0, "most sequences in one packed batch"),
    F(target, model, CONFIG_STRING, 0, 0, NULL, 0, "target model: Hugging Face checkpoint folder"),
    F(target, keep_weights, CONFIG_BOOL, 0, 0, "true", 0,
      "cuda: the target's device weights outlive its process (kept by dflashd): a restarted target re-imports them"),
    F(drafter, init, CONFIG_STRING, 0, 0, NULL, 0, "drafter checkpoint to start from (empty: fresh from the seed)"),
    F(drafter, layers, CONFIG_INT, 1, 64, "1", 0, "drafter layers (fresh drafter)"),
    F(drafter, block_size, CONFIG_INT, 2, 64, "16", 0, "block size B"),
    F(drafter, mask_token_id, CONFIG_INT, -1, 1 << 30, "-1", 0, "mask token id (-1: the last vocabulary id)"),
    F(drafter, num_taps, CONFIG_INT, 1, 64, "5", 0, "number of tapped target layers when taps is empty"),
    F(drafter, taps, CONFIG_INT_LIST, 0, 1024, NULL, 0, "tapped target layers (0-based); empty: the spec's rule"),
    F(drafter, max_anchors, CONFIG_INT, 1, 1 << 20, "512", 0, "most anchors per sequence"),
    F(drafter, gamma, CONFIG_DOUBLE, 0, 1e6, "0", 0, "loss decay gamma (0: 7 for B=16, 5 for 10, 4 for 8)"),
    F(drafter, layer_types, CONFIG_STRING, 0, 0, NULL, 0,
      "per drafter layer, comma-separated: full_attention or sliding_attention (short: full, sliding); as z-lab's "
      "config.json layer_types. Empty: every layer full"),
    F(drafter, sliding_window, CONFIG_INT, 0, 1 << 30, "0", 0,
      "the sliding_attention layers see keys less than this many positions from the query (0: no sliding layer)"),
    F(train, steps, CONFIG_INT, 1, 1 << 30, "100", 0, "optimizer steps of the whole run"),
    F(train, warmup_steps, CONFIG_INT, 0, 1 << 30, "4", 0, "linear warm-up steps"),
    F(train, checkpoint_every, CONFIG_INT, 0, 1 << 30, "50", 0, "steps between checkpoints (0: only at the end)"),
    F(train, keep_checkpoints, CONFIG_INT, 0, 1 << 30, "0", 0,
      "after each checkpoint, keep only the newest this many (0: keep all; never removes latest or one being read)"),
    F(train, keep_every, CONFIG_INT, 0, 1 << 30, "0", 0,
      "keep every checkpoint whose step is a multiple of this, whatever keep_checkpoints says (0: none)"),
    F(train, checkpoint_retry_sec, CONFIG_DOUBLE, 0.1, 3600, "10", 0,
      "a checkpoint that cannot be written (disk full, read-only, forbidden): the job holds, retrying this often"),
    F(train, max_skipped_in_a_row, CONFIG_INT, 0, JOB_RECORD_RING - 1, "20", 0,
      "this many steps in a row not applied (loss or gradient norm not finite) end the job with the reason (0: never)"),
    F(train, lr, CONFIG_DOUBLE, 0, 10, "6e-4", 0, "peak learning rate"),
    F(train, min_lr, CONFIG_DOUBLE, 0, 10, "0", 0, "learning rate at the end of the cosine decay"),
    F(train, beta1, CONFIG_DOUBLE, 0, 1, "0.9", 0, "AdamW beta1"),
    F(train, beta2, CONFIG_DOUBLE, 0, 1, "0.95", 0, "AdamW beta2"),
    F(train, eps, CONFIG_DOUBLE, 0, 1, "1e-8", 0, "AdamW epsilon"),
    F(train, weight_decay, CONFIG_DOUBLE, 0, 1, "0", 0, "decoupled weight decay (matrices only)"),
    F(train, clip, CONFIG_DOUBLE, 0, 1e9, "1.0", 0, "global L2 gradient clip (0: off)"),
    F(workers, targets, CONFIG_INT, 1, JOB_MAX_TARGETS, "2", 0,
      "target workers (at most JOB_MAX_TARGETS: a drafter gets every target's pool fd at its registration)"),
    F(workers, drafters, CONFIG_INT, 1, JOB_MAX_DRAFTERS, "2", 0, "drafter workers (data-parallel)"),
    F(workers, watchdog_sec, CONFIG_DOUBLE, 0, 3600, "10", 0, "watchdog interval of each worker (0: off)"),
    F(workers, heartbeat_timeout_sec, CONFIG_DOUBLE, 0.1, 3600, "10", 0,
      "a worker silent this long is treated as dead (its slots reclaimed)"),
    F(workers, stall_warn_sec, CONFIG_DOUBLE, 1, 86400, "300", 0,
      "no step committed for this long while running: dflashd, dflash run and dflashctl status say so and why"),
    F(ring, token_slots, CONFIG_INT, 1, 4096, "8", 0, "slots of the token ring"),
    F(ring, pool_slots, CONFIG_INT, 1, SLOT_POOL_MAX_SLOTS, "4", 0, "hidden-state slots per target worker"),
    F(control, endpoint, CONFIG_STRING, 0, 0, NULL, 0,
      "dflashd's control socket (ZeroMQ): empty for ipc://<run_dir>/ctl; tcp:// needs curve_secret_key_file"),
    F(control, curve_secret_key_file, CONFIG_STRING, 0, 0, NULL, 0,
      "file holding dflashd's CURVE secret key (40 Z85 characters); clients derive the public key when readable"),
    F(control, curve_public_key_file, CONFIG_STRING, 0, 0, NULL, 0,
      "file holding dflashd's CURVE public key (40 Z85 characters), for clients that cannot read the secret"),
    F(control, curve_client_keys_file, CONFIG_STRING, 0, 0, NULL, 0,
      "tcp only: file of the CURVE public keys (Z85, one per line, # comments) allowed to connect; empty (and no "
      "curve_readonly_keys_file): any client that knows dflashd's public key. Peers that can read the secret key "
      "are always allowed"),
    F(control, curve_readonly_keys_file, CONFIG_STRING, 0, 0, NULL, 0,
      "tcp only: file of CURVE public keys (same format) admitted for status and config only (monitoring); with "
      "it, unlisted keys are refused as with curve_client_keys_file"),
    F(control, heartbeat_sec, CONFIG_DOUBLE, 0.05, 60, "1", 0,
      "control-plane heartbeat interval (a worker silent for workers.heartbeat_timeout_sec is killed)"),
    F(control, metrics_listen, CONFIG_STRING, 0, 0, NULL, 0,
      "Prometheus /metrics on this loopback address:port (e.g. 127.0.0.1:9464), served by dflashd; empty: off"),
    F(metrics, tensorboard, CONFIG_BOOL, 0, 0, "false", 0,
      "also write the metrics.jsonl scalars as a TensorBoard event file under <run_dir>/tensorboard/"),
    F(eval, prompts, CONFIG_STRING, 0, 0, NULL, 0,
      "held-out prompts (JSONL as dflash eval reads them): the evaluation worker dflash-eval decodes them with "
      "the drafter of every eval.every-th step and the last one and reports tau (<run_dir>/eval.jsonl); empty: off"),
    F(eval, every, CONFIG_INT, 0, 1 << 30, "0", 0,
      "evaluate every this many steps: a multiple of train.checkpoint_every (it reads the checkpoints); 0: each "
      "checkpoint"),
    F(eval, limit, CONFIG_INT, 0, 1 << 20, "64", 0, "the first this many prompts of eval.prompts (0: all)"),
    F(eval, max_new_tokens, CONFIG_INT, 1, 1 << 20, "128", 0, "new tokens per prompt at most (also stops at EOS)"),
    {0},
};

/* Where two settings wrong together came from: the last --set that gave one of them, else the file. */
static void source_of(char *out, size_t n, const char *path, const char *const *overrides, int noverrides,
                      const char *a, const char *b)
{
    snprintf(out, n, "%s", path);
    for (int i = 0; i < noverrides; i++) {
        const char *eq = strchr(overrides[i], '=');
        size_t kl = eq ? (size_t)(eq - overrides[i]) : strlen(overrides[i]);
        if ((kl == strlen(a) && !strncmp(overrides[i], a, kl)) || (kl == strlen(b) && !strncmp(overrides[i], b, kl)))
            snprintf(out, n, "--set %.*s", CONFIG_STRING_MAX, overrides[i]);
    }
}

/* drafter.layer_types into drafter.sliding / nlayer_types, checked against drafter.layers (a fresh drafter: with
 * drafter.init job_plan compares them with the checkpoint's) and drafter.sliding_window. */
static int read_layer_types(job_config *cfg, const char *path, const char *const *overrides, int noverrides,
                            errbuf *err)
{
    char from[CONFIG_STRING_MAX + 16], list[CONFIG_STRING_MAX];
    int n = 0, nsliding = 0;
    snprintf(list, sizeof list, "%s", cfg->drafter.layer_types);
    source_of(from, sizeof from, path, overrides, noverrides, "drafter.layer_types", "drafter.sliding_window");
    for (char *save = NULL, *tok = strtok_r(list, ", \t", &save); tok; tok = strtok_r(NULL, ", \t", &save), n++) {
        int sliding = !strcmp(tok, "sliding_attention") || !strcmp(tok, "sliding");
        if (!sliding && strcmp(tok, "full_attention") && strcmp(tok, "full"))
            return errbuf_set(err, EINVAL, "%s: drafter.layer_types: entry %d is \"%s\" (expected full_attention or "
                              "sliding_attention)", from, n + 1, tok);
        if (n == (int)sizeof cfg->drafter.sliding)
            return errbuf_set(err, EINVAL, "%s: drafter.layer_types: more than %d entries", from,
                              (int)sizeof cfg->drafter.sliding);
        cfg->drafter.sliding[n] = (unsigned char)sliding;
        nsliding += sliding;
    }
    cfg->drafter.nlayer_types = n;
    if (n > 0 && !cfg->drafter.init[0] && n != cfg->drafter.layers) {
        source_of(from, sizeof from, path, overrides, noverrides, "drafter.layer_types", "drafter.layers");
        return errbuf_set(err, EINVAL, "%s: drafter.layer_types has %d entries, drafter.layers = %d: one per layer",
                          from, n, cfg->drafter.layers);
    }
    if (nsliding && cfg->drafter.sliding_window == 0)
        return errbuf_set(err, EINVAL, "%s: drafter.layer_types names %d sliding_attention layer%s and "
                          "drafter.sliding_window = 0: set the window (positions)", from, nsliding,
                          nsliding > 1 ? "s" : "");
    if (!nsliding && cfg->drafter.sliding_window > 0)
        return errbuf_set(err, EINVAL, "%s: drafter.sliding_window = %d but drafter.layer_types names no "
                          "sliding_attention layer: the window would apply to none", from,
                          cfg->drafter.sliding_window);
    return 0;
}

int job_config_load(job_config *cfg, const char *path, const char *const *overrides, int noverrides, errbuf *err)
{
    config_defaults(job_config_table, cfg);
    int rc = config_load_file(job_config_table, cfg, path, err);
    for (int i = 0; rc == 0 && i < noverrides; i++)
        rc = config_set_arg(job_config_table, cfg, overrides[i], "--set", err);
    /* what the table's per-field bounds cannot say: settings that are valid alone and wrong together; the message
     * names where the values came from: the --set that gave one of them, else the file (drafter.taps against the
     * target's layers, and repeated taps: job_plan) */
    char from[CONFIG_STRING_MAX + 16];
    if (rc == 0 && cfg->workers.heartbeat_timeout_sec < 2 * cfg->control.heartbeat_sec) {
        source_of(from, sizeof from, path, overrides, noverrides, "workers.heartbeat_timeout_sec",
                  "control.heartbeat_sec");
        rc = errbuf_set(err, EINVAL, "%s: workers.heartbeat_timeout_sec = %g is below twice control.heartbeat_sec = "
                        "%g: workers would be killed between two heartbeats", from,
                        cfg->workers.heartbeat_timeout_sec, cfg->control.heartbeat_sec);
    }
    if (rc == 0) rc = read_layer_types(cfg, path, overrides, noverrides, err);
    if (rc == 0 && cfg->train.min_lr > cfg->train.lr) {
        source_of(from, sizeof from, path, overrides, noverrides, "train.min_lr", "train.lr");
        rc = errbuf_set(err, EINVAL, "%s: train.min_lr = %g is above train.lr = %g: the cosine decay would raise the "
                        "learning rate (min_lr is where it ends, at most lr)", from, cfg->train.min_lr, cfg->train.lr);
    }
    if (rc == 0 && cfg->eval.prompts[0] && cfg->eval.every &&
        (cfg->train.checkpoint_every == 0 || cfg->eval.every % cfg->train.checkpoint_every)) {
        source_of(from, sizeof from, path, overrides, noverrides, "eval.every", "train.checkpoint_every");
        rc = errbuf_set(err, EINVAL, "%s: eval.every = %d is not a multiple of train.checkpoint_every = %d: the "
                        "evaluation worker decodes with the checkpoints' drafters (0: each checkpoint)", from,
                        cfg->eval.every, cfg->train.checkpoint_every);
    }
    return rc;
}

uint64_t job_eval_next(const job_config *cfg, uint64_t done, uint64_t last)
{
    uint64_t every = (uint64_t)(cfg->eval.every ? cfg->eval.every : cfg->train.checkpoint_every);
    if (!cfg->eval.prompts[0] || done > last || last == 0) return UINT64_MAX;
    uint64_t from = done ? done : 1, next = every ? (from + every - 1) / every * every : last; /* step 0: untrained */
    return next < last ? next : last;
}

void job_config_path(const job_config *cfg, const char *leaf, char *out, size_t n)
{
    snprintf(out, n, "%s/%s", cfg->job.run_dir, leaf);
}

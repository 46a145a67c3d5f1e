/* dflash-demo: makes the embedded default's tiny model and data. `make-target` writes a Qwen3 target in Hugging
 * Face layout (random, or constructed so that its greedy text repeats with a period); `make-data` answers random
 * prompts with that target's greedy continuation and writes JSONL for dflash-prepare. Exit status: 0 done, 1 failure (the message names the file), 2 usage error. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "demo.h"
#include "log.h"
#include "util.h"

#define PROG "dflash-demo"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " make-target OUTDIR [options]\n"
            "       " PROG " make-data --target DIR -o OUT.jsonl [options]\n"
            "\n"
            "Makes the tiny model and data of the embedded default: a Qwen3 target in Hugging Face layout (random,\n"
            "or constructed so that its greedy continuation repeats with a period a drafter can learn),\n"
            "and a self-distilled data set (random prompts answered by that target's own greedy continuation) as\n"
            "JSONL for dflash-prepare. Both are deterministic from --seed.\n"
            "Run '" PROG " COMMAND --help' for a command's options.\n"
            "Exit status: 0 done, 1 failure, 2 usage error.\n");
}

static void usage_target(FILE *f)
{
    fprintf(f,
            "usage: " PROG " make-target OUTDIR [options]\n"
            "\n"
            "Writes OUTDIR/config.json (Qwen3ForCausalLM, as transformers writes it) and OUTDIR/model.safetensors\n"
            "(tensor names as in transformers). OUTDIR is created when missing; files are replaced atomically.\n"
            "  --kind random: random weights: embeddings and lm_head N(0, 1), projections N(0, 2.25/fan_in), norm\n"
            "      weights 1; greedy text without structure a drafter could generalise.\n"
            "  --kind repeat: constructed weights whose greedy continuation repeats the token --period positions\n"
            "      back (from any prompt of at least --period tokens): layer 0 has one positional attention head\n"
            "      per kv head that copies the token code from period-1 positions back, every other projection is\n"
            "      zero, lm_head reads the copied code. Each id has a distinct +-1 code drawn from --seed. A rule a\n"
            "      drafter learns (attend --period positions back), so its acceptance rises as it trains; needs\n"
            "      min(kv_heads x head_dim, (hidden-1)/2) >= log2(vocab)+2.\n"
            "\n"
            "  --kind random|repeat  the weights (default random)\n"
            "  --period N          repeat: the period of the continuation (default 8)\n"
            "  --seed N            weight seed (default 0)\n"
            "  --hidden N          hidden_size (default 64)\n"
            "  --layers N          num_hidden_layers (default 8)\n"
            "  --heads N           num_attention_heads (default 4)\n"
            "  --kv-heads N        num_key_value_heads, divides --heads (default 2)\n"
            "  --head-dim N        head_dim, even (default 16)\n"
            "  --intermediate N    intermediate_size (default 160)\n"
            "  --vocab N           vocab_size (default 512)\n"
            "  --dtype f32|bf16    stored dtype (default f32)\n"
            "  -h, --help          this text\n");
}

static void usage_data(FILE *f)
{
    fprintf(f,
            "usage: " PROG " make-data --target DIR -o OUT.jsonl [options]\n"
            "\n"
            "Draws random prompts (ids uniform in [0, vocab-1): the last id stays reserved for the drafter's mask\n"
            "token), answers each by greedy decoding with the target (argmax over [0, vocab-1)), and writes one\n"
            "line per sample: {\"input_ids\": prompt+answer, \"loss_mask\": 0 on the prompt, 1 on the answer}.\n"
            "The file is replaced atomically. Prompts depend only on (--seed, sample index); the output does not\n"
            "depend on --batch or --threads.\n"
            "\n"
            "  --target DIR        target checkpoint folder (config.json + model.safetensors)\n"
            "  -o, --output FILE   output JSONL\n"
            "  --samples N         number of samples (default 256)\n"
            "  --prompt-len A:B    prompt length drawn uniformly in [A, B] (default 8:24; 'N' means N:N)\n"
            "  --answer-len N      answer tokens per sample (default 48)\n"
            "  --seed N            prompt seed (default 0)\n"
            "  --batch N           samples decoded together in one packed forward (default 32)\n"
            "  --threads N         worker threads, one target copy each (default: CPUs, at most 16)\n"
            "  -q, --quiet         no progress lines\n"
            "  -h, --help          this text\n"
            "\n"
            "Progress goes to stderr (at most once a second); the summary goes to stdout.\n");
}

/* Parse a decimal integer in [lo, hi]; prints a usage error naming the flag and returns -1 otherwise. */
static int parse_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    long long v = (*s == '-' || (*s >= '0' && *s <= '9')) ? strtoll(s, &end, 10) : 0;
    if (!end || *end || errno || v < lo || v > hi) {
        fprintf(stderr, PROG ": %s: '%s' is not an integer in [%" PRId64 ", %" PRId64 "]\n", flag, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_int(const char *flag, const char *s, int lo, int hi, int *out)
{
    int64_t v;
    if (parse_i64(flag, s, lo, hi, &v)) return -1;
    *out = (int)v;
    return 0;
}

static int parse_seed(const char *s, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = (*s >= '0' && *s <= '9') ? strtoull(s, &end, 10) : 0;
    if (!end || *end || errno) {
        fprintf(stderr, PROG ": --seed: '%s' is not a non-negative integer\n", s);
        return -1;
    }
    *out = v;
    return 0;
}

static int cmd_make_target(int argc, char **argv)
{
    enum { O_SEED = 256, O_HIDDEN, O_LAYERS, O_HEADS, O_KV, O_HD, O_INTER, O_VOCAB, O_DTYPE, O_KIND, O_PERIOD };
    static const struct option longopts[] = {
        {"seed", required_argument, NULL, O_SEED},       {"hidden", required_argument, NULL, O_HIDDEN},
        {"layers", required_argument, NULL, O_LAYERS},   {"heads", required_argument, NULL, O_HEADS},
        {"kv-heads", required_argument, NULL, O_KV},     {"head-dim", required_argument, NULL, O_HD},
        {"intermediate", required_argument, NULL, O_INTER}, {"vocab", required_argument, NULL, O_VOCAB},
        {"dtype", required_argument, NULL, O_DTYPE},     {"kind", required_argument, NULL, O_KIND},
        {"period", required_argument, NULL, O_PERIOD},   {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    demo_target_opts o;
    demo_target_defaults(&o);
    int c, bad = 0;
    while (!bad && (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case O_SEED: bad = parse_seed(optarg, &o.seed); break;
        case O_HIDDEN: bad = parse_int("--hidden", optarg, 1, 65536, &o.hidden); break;
        case O_LAYERS: bad = parse_int("--layers", optarg, 1, 1024, &o.layers); break;
        case O_HEADS: bad = parse_int("--heads", optarg, 1, 1024, &o.heads); break;
        case O_KV: bad = parse_int("--kv-heads", optarg, 1, 1024, &o.kv_heads); break;
        case O_HD: bad = parse_int("--head-dim", optarg, 2, 4096, &o.head_dim); break;
        case O_INTER: bad = parse_int("--intermediate", optarg, 1, 1 << 20, &o.intermediate); break;
        case O_VOCAB: bad = parse_int("--vocab", optarg, 2, 1 << 24, &o.vocab); break;
        case O_DTYPE:
            if (!strcmp(optarg, "f32")) o.dtype = ST_F32;
            else if (!strcmp(optarg, "bf16")) o.dtype = ST_BF16;
            else {
                fprintf(stderr, PROG ": --dtype: '%s' is not f32 or bf16\n", optarg);
                bad = 1;
            }
            break;
        case O_KIND: {
            int k = demo_target_kind_parse(optarg);
            if (k < 0) {
                fprintf(stderr, PROG ": --kind: '%s' is not random or repeat\n", optarg);
                bad = 1;
            } else {
                o.kind = (enum demo_target_kind)k;
            }
            break;
        }
        case O_PERIOD: bad = parse_int("--period", optarg, 1, 1024, &o.period); break;
        case 'h': usage_target(stdout); return 0;
        default: usage_target(stderr); return 2;
        }
    }
    if (bad) return 2;
    if (argc - optind != 1) {
        fprintf(stderr, PROG " make-target: expected exactly one OUTDIR (see --help)\n");
        return 2;
    }
    errbuf err = {{0}};
    if (demo_target_check(&o, &err)) {
        fprintf(stderr, PROG " make-target: %s\n", err.msg);
        return 2;
    }
    const char *outdir = argv[optind];
    double t0 = now_seconds();
    if (demo_target_write(outdir, &o, &err)) {
        fprintf(stderr, PROG " make-target: %s\n", err.msg);
        return 1;
    }
    printf("wrote %s/config.json and %s/model.safetensors (qwen3 %s", outdir, outdir, demo_target_kind_name(o.kind));
    if (o.kind == DEMO_TARGET_REPEAT) printf(" (greedy continuation repeats the token %d back)", o.period);
    printf(": hidden %d, %d layers, %d heads / %d kv, head_dim "
           "%d, intermediate %d, vocab %d, %s, seed %" PRIu64 ") in %.2fs\n",
           o.hidden, o.layers, o.heads, o.kv_heads, o.head_dim, o.intermediate, o.vocab,
           o.dtype == ST_BF16 ? "bf16" : "f32", o.seed, now_seconds() - t0);
    return 0;
}

static int parse_range(const char *s, int *lo, int *hi)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%s", s);
    char *colon = strchr(buf, ':');
    if (colon) *colon = 0;
    if (parse_int("--prompt-len", buf, 1, 1 << 20, lo)) return -1;
    if (parse_int("--prompt-len", colon ? colon + 1 : buf, 1, 1 << 20, hi)) return -1;
    if (*hi < *lo) {
        fprintf(stderr, PROG ": --prompt-len: '%s': MIN must not exceed MAX\n", s);
        return -1;
    }
    return 0;
}

static int cmd_make_data(int argc, char **argv)
{
    enum { O_TARGET = 256, O_SAMPLES, O_PLEN, O_ALEN, O_SEED, O_BATCH, O_THREADS };
    static const struct option longopts[] = {
        {"target", required_argument, NULL, O_TARGET},   {"output", required_argument, NULL, 'o'},
        {"samples", required_argument, NULL, O_SAMPLES}, {"prompt-len", required_argument, NULL, O_PLEN},
        {"answer-len", required_argument, NULL, O_ALEN}, {"seed", required_argument, NULL, O_SEED},
        {"batch", required_argument, NULL, O_BATCH},     {"threads", required_argument, NULL, O_THREADS},
        {"quiet", no_argument, NULL, 'q'},               {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    demo_data_opts o;
    demo_data_defaults(&o);
    int c, bad = 0;
    while (!bad && (c = getopt_long(argc, argv, "o:qh", longopts, NULL)) != -1) {
        switch (c) {
        case O_TARGET: o.target_dir = optarg; break;
        case 'o': o.out_path = optarg; break;
        case O_SAMPLES: bad = parse_int("--samples", optarg, 1, 1 << 30, &o.samples); break;
        case O_PLEN: bad = parse_range(optarg, &o.prompt_min, &o.prompt_max); break;
        case O_ALEN: bad = parse_int("--answer-len", optarg, 1, 1 << 20, &o.answer_len); break;
        case O_SEED: bad = parse_seed(optarg, &o.seed); break;
        case O_BATCH: bad = parse_int("--batch", optarg, 1, 1 << 16, &o.batch); break;
        case O_THREADS: bad = parse_int("--threads", optarg, 1, 256, &o.threads); break;
        case 'q': o.progress = 0; break;
        case 'h': usage_data(stdout); return 0;
        default: usage_data(stderr); return 2;
        }
    }
    if (bad) return 2;
    if (optind != argc) {
        fprintf(stderr, PROG " make-data: unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }
    if (!o.target_dir || !o.out_path) {
        fprintf(stderr, PROG " make-data: missing %s (see --help)\n", !o.target_dir ? "--target DIR" : "-o OUT.jsonl");
        return 2;
    }
    errbuf err = {{0}};
    demo_data_stats st;
    double t0 = now_seconds();
    if (demo_data_write(&o, &st, &err)) {
        fprintf(stderr, PROG " make-data: %s\n", err.msg);
        return 1;
    }
    printf("wrote %s: %" PRId64 " samples, %" PRId64 " tokens (%" PRId64 " answer tokens); distinct-answer-token "
           "ratio %.3f, %d distinct answer ids, %d one-token answers; %.2fs\n",
           o.out_path, st.samples, st.tokens, st.answer_tokens, st.distinct_ratio, st.vocab_used,
           st.repeated_answers, now_seconds() - t0);
    return 0;
}

int main(int argc, char **argv)
{
    log_init("demo", LOG_LEVEL_INFO);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "make-target")) return cmd_make_target(argc - 1, argv + 1);
    if (!strcmp(cmd, "make-data")) return cmd_make_data(argc - 1, argv + 1);
    fprintf(stderr, PROG ": unknown command '%s' (make-target, make-data; see --help)\n", cmd);
    return 2;
}

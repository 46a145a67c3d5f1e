/* dflash: the embedded default. `dflash run -c FILE` supervises one job without systemd: it starts dflashd, waits
 * for its READY=1, starts the configured workers and restarts whichever dies, speaking systemd's notify protocol
 * (services/dflash/supervisor.h). Exit status: 0 when dflashd finished the job, 1 on a config or startup error,
 * 2 on a usage error, 128+sig when stopped by a signal. */
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "eval.h"
#include "generate.h"
#include "job_config.h"
#include "log.h"
#include "summary.h"
#include "supervisor.h"
#include "util.h"

#define PROG "dflash"

static void usage_main(FILE *f)
{
    fprintf(f,
            "usage: " PROG " run -c FILE [--resume | --fresh] [--set section.key=value]... [--bin-dir DIR]\n"
            "       " PROG " run --help | --help-config\n"
            "       " PROG " eval --target DIR --drafter DIR --prompts FILE [--limit N] [--max-new-tokens N] [--json]\n"
            "       " PROG " eval --help\n"
            "       " PROG " generate --target DIR --prompts FILE -o OUT.jsonl [--max-new-tokens N] [--limit N]\n"
            "                [--threads N] [--eos ID]... [--backend cpu|cuda] [--batch N]\n"
            "       " PROG " generate --help\n"
            "       " PROG " plot RUN_DIR [-o FILE.png|FILE.svg]\n"
            "       " PROG " --help\n"
            "\n"
            "commands:\n"
            "  run    start dflashd and the workers of the job config FILE and keep them running\n"
            "         (restarting whichever dies) until dflashd finishes the job\n"
            "  eval   acceptance length tau of a drafter checkpoint by speculative decoding with the target\n"
            "  generate  the target's own greedy answers to a prompt file, as JSONL for dflash-prepare\n"
            "  plot   a PNG or SVG of a job's loss, per-slot accuracy and tau (simulated and decoded) over steps\n");
}

static void usage_run(FILE *f)
{
    fprintf(f,
            "usage: " PROG " run -c FILE [--resume | --fresh] [--set section.key=value]... [--bin-dir DIR]\n"
            "\n"
            "Starts dflashd, waits for it to be ready, then dflash-prefetch, workers.targets dflash-target and\n"
            "workers.drafters dflash-drafter processes; restarts a child that dies (backoff 100 ms .. 5 s) and stops\n"
            "everything when dflashd exits 0. Logs go to <run_dir>/logs/<name>.log, the children's state to\n"
            "<run_dir>/supervisor.state. dflashd must send READY=1 within 120 s (env DFLASH_READY_TIMEOUT=seconds).\n"
            "\n"
            "options:\n"
            "  -c, --config FILE   job config (INI); passed to every child\n"
            "  --resume            pass --resume to dflashd (continue from the last checkpoint)\n"
            "  --fresh             start over in a run_dir that holds a previous run (ledger, checkpoints):\n"
            "                      that run moves to <run_dir>/previous-<time>/; without --resume or --fresh\n"
            "                      such a run_dir is refused\n"
            "  --set KEY=VALUE     override a config value (section.key=value); passed to every child\n"
            "  --bin-dir DIR       folder of the dflash binaries (default: $DFLASH_BIN_DIR, else this program's)\n"
            "  --help-config       list every config setting\n"
            "  -h, --help          this help\n"
            "\n"
            "exit status: 0 the job finished or was drained; 1 it could not start, or was given up (a worker failing\n"
            "every start: a job that was running is checkpointed at its committed step first, for --resume);\n"
            "2 usage error; 128+N stopped by signal N (130 Ctrl-C, 143 SIGTERM)\n");
}

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, PROG " run: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(try '" PROG " run --help')\n");
    return 2;
}

/* The folder of /proc/self/exe into out[n]; 0 or -1. */
static int self_dir(char *out, size_t n)
{
    ssize_t r = readlink("/proc/self/exe", out, n - 1);
    if (r <= 0) return -1;
    out[r] = '\0';
    char *slash = strrchr(out, '/');
    if (!slash) return -1;
    *slash = '\0';
    if (out[0] == '\0') snprintf(out, n, "/");
    return 0;
}

/* `dflash plot ...` is dflash-plot beside this binary (its own program: only it links Cairo, so the supervisor and
 * the CUDA build start on a GPU node without Cairo's libraries). argv[0] is "plot". */
static int cmd_plot(char **argv)
{
    char path[4200];
    if (self_dir(path, sizeof path - 16) != 0) {
        fprintf(stderr, PROG " plot: cannot find my own folder (/proc/self/exe) to run dflash-plot from\n");
        return 1;
    }
    strcat(path, "/dflash-plot");
    execv(path, argv);
    fprintf(stderr, PROG " plot: cannot run %s: %s\n", path, strerror(errno));
    return 1;
}

static int cmd_run(int argc, char **argv)
{
    enum { OPT_RESUME = 256, OPT_FRESH, OPT_SET, OPT_BIN_DIR, OPT_HELP_CONFIG };
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},   {"resume", no_argument, NULL, OPT_RESUME},
        {"fresh", no_argument, NULL, OPT_FRESH},
        {"set", required_argument, NULL, OPT_SET},  {"bin-dir", required_argument, NULL, OPT_BIN_DIR},
        {"help", no_argument, NULL, 'h'},           {"help-config", no_argument, NULL, OPT_HELP_CONFIG},
        {NULL, 0, NULL, 0},
    };
    const char *config = NULL, *bin_dir = NULL;
    const char **overrides = xcalloc((size_t)argc + 1, sizeof *overrides);
    int noverrides = 0, resume = 0, fresh = 0, opt;
    opterr = 0;
    optind = 1;
    while ((opt = getopt_long(argc, argv, ":c:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'c': config = optarg; break;
        case OPT_RESUME: resume = 1; break;
        case OPT_FRESH: fresh = 1; break;
        case OPT_SET:
            if (!config_arg_well_formed(optarg)) {
                free(overrides);
                return usage_error("--set \"%s\": expected section.key=value", optarg);
            }
            overrides[noverrides++] = optarg;
            break;
        case OPT_BIN_DIR: bin_dir = optarg; break;
        case 'h': usage_run(stdout); free(overrides); return 0;
        case OPT_HELP_CONFIG: config_help(job_config_table, stdout); free(overrides); return 0;
        case ':': free(overrides); return usage_error("option %s needs a value", argv[optind - 1]);
        default: free(overrides); return usage_error("unknown option %s", argv[optind - 1]);
        }
    }
    if (optind < argc) {
        int rc = usage_error("unexpected argument \"%s\"", argv[optind]);
        free(overrides);
        return rc;
    }
    if (resume && fresh) {
        free(overrides);
        return usage_error("%s", "--resume and --fresh exclude each other");
    }
    if (!config) {
        free(overrides);
        return usage_error("%s", "missing -c FILE (the job config)");
    }
    log_init("run", LOG_LEVEL_INFO);
    job_config cfg;
    errbuf err = {{0}};
    if (job_config_load(&cfg, config, overrides, noverrides, &err) != 0) {
        fprintf(stderr, PROG " run: %s\n", err.msg);
        free(overrides);
        return 1;
    }
    char config_abs[PATH_MAX], self[PATH_MAX];
    if (!realpath(config, config_abs)) {
        fprintf(stderr, PROG " run: %s: cannot resolve the path\n", config);
        free(overrides);
        return 1;
    }
    if (!bin_dir) bin_dir = getenv("DFLASH_BIN_DIR");
    if (!bin_dir || !bin_dir[0]) {
        if (self_dir(self, sizeof self) != 0) {
            fprintf(stderr, PROG " run: cannot find my own folder (/proc/self/exe): use --bin-dir\n");
            free(overrides);
            return 1;
        }
        bin_dir = self;
    }
    supervisor_opts o = {.cfg = &cfg, .config_path = config_abs, .bin_dir = bin_dir,
                         .overrides = overrides, .noverrides = noverrides, .resume = resume, .fresh = fresh};
    double t0 = now_seconds();
    long long first_step = resume ? run_summary_resume_step(&cfg) : 0;
    int code = supervisor_run(&o, &err);
    if (code == 1 && err.msg[0]) fprintf(stderr, PROG " run: %s\n", err.msg);
    if (code == 0 && run_summary_print(&cfg, now_seconds() - t0, first_step, stderr, &err) != 0)
        fprintf(stderr, PROG " run: %s\n", err.msg);
    free(overrides);
    return code;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage_main(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage_main(stdout);
        return 0;
    }
    if (strcmp(argv[1], "run") == 0) return cmd_run(argc - 1, argv + 1);
    if (strcmp(argv[1], "eval") == 0) return cmd_eval(argc - 1, argv + 1);
    if (strcmp(argv[1], "generate") == 0) return generate_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "plot") == 0) return cmd_plot(argv + 1);
    fprintf(stderr, PROG ": unknown command \"%s\"\n", argv[1]);
    usage_main(stderr);
    return 2;
}

/* dflashctl: the command-line client of a dflash job's control plane (dflashd's ROUTER socket). Commands come from
 * one table (name, arguments, options, help). Exit status: 0 done, 1 refused by dflashd or the operation failed,
 * 2 usage error or dflashd unreachable. The endpoint comes from the job config (-c: control.endpoint or
 * ipc://<run_dir>/ctl) or --endpoint. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "conn.h"
#include "ctl_proto.h"
#include "job_config.h"
#include "render.h"

#define PROG "dflashctl"
#define OPT_JSON 1u
#define OPT_WATCH 2u
#define OPT_LOCAL 4u /* runs here, without dflashd: no -c/--endpoint */
#define OPT_NAME 8u  /* takes --name */

typedef struct ctl_ctx {
    conn *c;
    const char *key_name; /* keygen --name */
    char endpoint[CONFIG_STRING_MAX + 16];
    double timeout, wait;
    int json, watch;
} ctl_ctx;

typedef struct command {
    const char *name, *args;
    int nargs;
    unsigned opts;
    int (*run)(ctl_ctx *x, char **args);
    const char *help;
} command;

static void nap(double sec)
{
    struct timespec ts = {(time_t)sec, (long)((sec - (double)(time_t)sec) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Send a request with this body; 0 with *reply, 1 refused (printed), 2 unreachable (printed unless quiet). */
static int request_q(ctl_ctx *x, Dflash__Envelope *e, Dflash__Envelope **reply, int quiet)
{
    errbuf err = {{0}};
    *reply = NULL;
    int rc = conn_request(x->c, e, x->timeout, reply, &err);
    if (rc) {
        if (!quiet)
            fprintf(stderr, PROG ": %s%s\n", err.msg, rc == -ETIMEDOUT ? " (is the job running? is this its config?)" : "");
        return 2;
    }
    if ((*reply)->body_case == DFLASH__ENVELOPE__BODY_ERROR) {
        fprintf(stderr, PROG ": refused: %s\n", (*reply)->error->message);
        ctl_envelope_destroy(reply);
        return 1;
    }
    return 0;
}

static int request(ctl_ctx *x, Dflash__Envelope *e, Dflash__Envelope **reply) { return request_q(x, e, reply, 0); }

static int expect(Dflash__Envelope **r, Dflash__Envelope__BodyCase want)
{
    if ((*r)->body_case == want) return 0;
    fprintf(stderr, PROG ": unexpected reply (body %d) from dflashd\n", (int)(*r)->body_case);
    ctl_envelope_destroy(r);
    return 1;
}

static int fetch_status_q(ctl_ctx *x, Dflash__Envelope **r, int quiet)
{
    Dflash__Envelope e;
    Dflash__StatusRequest sr = DFLASH__STATUS_REQUEST__INIT;
    ctl_envelope_init(&e, 0);
    e.body_case = DFLASH__ENVELOPE__BODY_STATUS_REQUEST;
    e.status_request = &sr;
    int rc = request_q(x, &e, r, quiet);
    return rc ? rc : expect(r, DFLASH__ENVELOPE__BODY_STATUS_REPLY);
}

static int fetch_status(ctl_ctx *x, Dflash__Envelope **r) { return fetch_status_q(x, r, 0); }

static int cmd_status(ctl_ctx *x, char **args)
{
    for (;;) {
        Dflash__Envelope *r;
        int rc = fetch_status(x, &r);
        if (!x->watch) {
            if (rc) return rc;
        } else if (isatty(STDOUT_FILENO) && !x->json) {
            fputs("\033[H\033[2J", stdout);
        }
        if (!rc) {
            if (x->json) render_json(stdout, &r->status_reply->base);
            else render_status(stdout, r->status_reply);
            ctl_envelope_destroy(&r);
        }
        if (!x->watch) return 0;
        fflush(stdout);
        nap(1.0);
    }
}

static int simple(ctl_ctx *x, Dflash__Envelope__BodyCase body, void *msg, Dflash__Envelope **r)
{
    Dflash__Envelope e;
    ctl_envelope_init(&e, 0);
    e.body_case = body;
    e.pause = msg; /* every body is a pointer in the same union */
    int rc = request(x, &e, r);
    return rc ? rc : expect(r, DFLASH__ENVELOPE__BODY_ACK);
}

static int cmd_pause(ctl_ctx *x, char **args)
{
    Dflash__Pause p = DFLASH__PAUSE__INIT;
    Dflash__Envelope *r;
    int rc = simple(x, DFLASH__ENVELOPE__BODY_PAUSE, &p, &r);
    if (rc) return rc;
    int done = r->ack->done;
    ctl_envelope_destroy(&r);
    double deadline = now_seconds() + x->wait;
    while (!done) { /* the step in flight finishes, then every drafter holds */
        if (now_seconds() > deadline) {
            fprintf(stderr, PROG ": paused, but the drafters did not all hold within %.0f s\n", x->wait);
            return 1;
        }
        nap(0.2);
        if ((rc = fetch_status(x, &r))) return rc;
        done = r->status_reply->held;
        if (!r->status_reply->paused) {
            fprintf(stderr, PROG ": the job was resumed meanwhile\n");
            ctl_envelope_destroy(&r);
            return 1;
        }
        ctl_envelope_destroy(&r);
    }
    if ((rc = fetch_status(x, &r))) return rc;
    printf("paused at step %llu\n", (unsigned long long)r->status_reply->step);
    ctl_envelope_destroy(&r);
    return 0;
}

static int cmd_resume(ctl_ctx *x, char **args)
{
    Dflash__Resume p = DFLASH__RESUME__INIT;
    Dflash__Envelope *r;
    int rc = simple(x, DFLASH__ENVELOPE__BODY_RESUME, &p, &r);
    if (rc) return rc;
    /* dflashd says whether the job was paused ("resumed") or not ("not paused: nothing to resume") */
    if (r->ack->message && r->ack->message[0] && strcmp(r->ack->message, "resumed") != 0)
        printf("%s (step %llu)\n", r->ack->message, (unsigned long long)r->ack->step);
    else
        printf("resumed at step %llu\n", (unsigned long long)r->ack->step);
    ctl_envelope_destroy(&r);
    return 0;
}

static int cmd_drain(ctl_ctx *x, char **args)
{
    uint64_t shown = 0;
    double deadline = now_seconds() + x->wait;
    for (;;) { /* (re)send the drain (idempotent) and wait for its completion notice */
        Dflash__Drain d = DFLASH__DRAIN__INIT;
        Dflash__Envelope *r;
        int rc = simple(x, DFLASH__ENVELOPE__BODY_DRAIN, &d, &r);
        if (rc) return rc;
        uint64_t id = r->request_id;
        for (;;) {
            if (r->ack->done) {
                printf("%s\n", r->ack->message);
                ctl_envelope_destroy(&r);
                return 0;
            }
            if (r->ack->stop_step != shown) {
                shown = r->ack->stop_step;
                printf("draining: training up to step %llu (now at %llu), then checkpoint and stop\n",
                       (unsigned long long)shown, (unsigned long long)r->ack->step);
                fflush(stdout);
            }
            ctl_envelope_destroy(&r);
            errbuf err = {{0}};
            if (conn_wait(x->c, id, 2.0, &r, &err)) break;
            if (expect(&r, DFLASH__ENVELOPE__BODY_ACK)) return 1;
        }
        if (now_seconds() > deadline) {
            fprintf(stderr, PROG ": the drain did not complete within %.0f s\n", x->wait);
            return 1;
        }
    }
}

/* Follow the restart operation that request `id` started until it completes. The operation lives in the job state,
 * so a dflashd that restarts meanwhile carries it on: while dflashd does not answer, keep asking until --wait. */
#define SOCKET_GONE_SEC 5.0 /* a restarted dflashd binds its socket again well within this */
static int wait_restart(ctl_ctx *x, uint64_t id, const char *what)
{
    int shown = 0, silent = 0;
    double deadline = now_seconds() + x->wait, gone_since = 0;
    for (;;) {
        nap(0.25);
        /* a socket gone for a while: dflashd stopped cleanly (the job ended or was stopped), not a crash that its
         * supervisor repairs in a second or two; waiting out --wait would only hide that */
        if (!conn_socket_gone(x->endpoint)) gone_since = 0;
        else if (!gone_since) gone_since = now_seconds();
        else if (now_seconds() - gone_since >= SOCKET_GONE_SEC) {
            fprintf(stderr, PROG ": dflashd at %s has stopped (its socket is gone): the job ended or was stopped "
                            "before the restart of %s completed\n", x->endpoint, what);
            return 2;
        }
        Dflash__Envelope *r;
        int rc = gone_since ? 2 : fetch_status_q(x, &r, 1); /* no socket: nobody to ask */
        if (rc == 2) {
            if (!silent) fprintf(stderr, PROG ": dflashd at %s is not answering; still following the restart of %s\n",
                                 x->endpoint, what);
            silent = 1;
            if (now_seconds() > deadline) {
                fprintf(stderr, PROG ": dflashd at %s did not answer again within --wait %.0f s\n", x->endpoint, x->wait);
                return 2;
            }
            continue;
        }
        if (rc) return rc;
        if (silent) fprintf(stderr, PROG ": dflashd answers again\n");
        silent = 0;
        const Dflash__RollingStatus *op = r->status_reply->rolling;
        if (!op || op->id != id) {
            fprintf(stderr, PROG ": dflashd no longer knows the restart of %s (was the job state lost?)\n", what);
            ctl_envelope_destroy(&r);
            return 1;
        }
        for (; shown < op->done; shown++)
            printf("%s-%d restarted, ready and healthy (%d/%d)\n", op->role, op->current - op->done + shown, shown + 1,
                   op->total);
        fflush(stdout);
        if (!op->active) {
            int failed = op->error[0] != 0;
            if (failed) fprintf(stderr, PROG ": restart of %s failed: %s\n", what, op->error);
            else printf("restart of %s complete at step %llu\n", what, (unsigned long long)r->status_reply->step);
            ctl_envelope_destroy(&r);
            return failed;
        }
        ctl_envelope_destroy(&r);
        if (now_seconds() > deadline) {
            fprintf(stderr, PROG ": restart of %s still running after %.0f s\n", what, x->wait);
            return 1;
        }
    }
}

/* Send a restart or rolling-restart body, then follow it until it completes. */
static int restart_and_wait(ctl_ctx *x, Dflash__Envelope__BodyCase body, void *msg, const char *what)
{
    Dflash__Envelope *r;
    int rc = simple(x, body, msg, &r);
    if (rc) return rc;
    uint64_t id = r->request_id;
    ctl_envelope_destroy(&r);
    return wait_restart(x, id, what);
}

static int cmd_restart(ctl_ctx *x, char **args)
{
    Dflash__Restart m = DFLASH__RESTART__INIT;
    m.worker = args[0];
    return restart_and_wait(x, DFLASH__ENVELOPE__BODY_RESTART, &m, args[0]);
}

static int cmd_rolling(ctl_ctx *x, char **args)
{
    Dflash__RollingRestart m = DFLASH__ROLLING_RESTART__INIT;
    m.role = args[0];
    return restart_and_wait(x, DFLASH__ENVELOPE__BODY_ROLLING_RESTART, &m, args[0]);
}

static int cmd_config(ctl_ctx *x, char **args)
{
    Dflash__Envelope e;
    Dflash__ConfigRequest cr = DFLASH__CONFIG_REQUEST__INIT;
    ctl_envelope_init(&e, 0);
    e.body_case = DFLASH__ENVELOPE__BODY_CONFIG_REQUEST;
    e.config_request = &cr;
    Dflash__Envelope *r;
    int rc = request(x, &e, &r);
    if (rc || (rc = expect(&r, DFLASH__ENVELOPE__BODY_CONFIG_REPLY))) return rc;
    fputs(r->config_reply->text, stdout);
    ctl_envelope_destroy(&r);
    return 0;
}

static int cmd_keygen(ctl_ctx *x, char **args)
{
    (void)x;
    errbuf err = {{0}};
    const char *dir = args[0], *name = x->key_name ? x->key_name : "dflashd";
    if (ctl_keygen(dir, name, &err)) {
        fprintf(stderr, PROG " keygen: %s\n", err.msg);
        return 1;
    }
    printf("wrote %s/%s.key (secret, 0600) and %s/%s.pub (public)\n", dir, name, dir, name);
    if (!strcmp(name, "dflashd"))
        printf("job config, for a tcp:// control endpoint:\n"
               "[control]\n"
               "endpoint = tcp://HOST:PORT\n"
               "# dflashd, and workers that may read it (comments on their own lines: INI has no inline #)\n"
               "curve_secret_key_file = %s/dflashd.key\n"
               "# peers that only get the public key\n"
               "curve_public_key_file = %s/dflashd.pub\n"
               "clients elsewhere: " PROG " --endpoint tcp://HOST:PORT --server-key %s/dflashd.pub status\n",
               dir, dir, dir);
    else
        printf("a client key: add the line of %s/%s.pub to control.curve_client_keys_file, then\n"
               "  " PROG " --endpoint tcp://HOST:PORT --server-key DFLASHD.pub --client-key %s/%s.key status\n",
               dir, name, dir, name);
    return 0;
}

static const command commands[] = {
    {"status", "", 0, OPT_JSON | OPT_WATCH, cmd_status,
     "every worker (role, GPU, pid, state, epoch, uptime, restarts, batches, tokens/s),\n"
     "ring and pool occupancy, step, loss and acceptance; why the job stalls or holds;\n"
     "--json: one JSON object; --watch: refresh every second"},
    {"pause", "", 0, 0, cmd_pause, "finish the step in flight, then hold every worker; returns once they hold"},
    {"resume", "", 0, 0, cmd_resume, "continue after a pause"},
    {"drain", "", 0, 0, cmd_drain,
     "finish every batch already issued, checkpoint, stop the job cleanly; returns when done"},
    {"restart", "WORKER", 1, 0, cmd_restart,
     "restart one worker (prefetch-0, target-N, drafter-N) after the unit in hand;\n"
     "returns when the new instance is ready and healthy"},
    {"rolling-restart", "ROLE", 1, 0, cmd_rolling,
     "restart every worker of a role (prefetch, target, drafter, eval) one at a time, each\n"
     "ready and healthy before the next; training continues throughout"},
    {"config", "", 0, 0, cmd_config, "print the job config dflashd runs with (INI)"},
    {"keygen", "DIR", 1, OPT_LOCAL | OPT_NAME, cmd_keygen,
     "write a new CURVE key pair: DIR/NAME.key (secret, mode 0600) and DIR/NAME.pub\n"
     "(public), NAME from --name (default dflashd: the server's pair for a tcp://\n"
     "endpoint; any other name: a client's pair, whose .pub line goes into\n"
     "control.curve_client_keys_file). Never replaces an existing key; needs no running job"},
    {NULL, NULL, 0, 0, NULL, NULL},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: " PROG " [-c CONFIG | --endpoint EP] [options] COMMAND [ARGS]\n\ncommands:\n");
    for (const command *c = commands; c->name; c++) {
        char head[64];
        snprintf(head, sizeof head, "%s %s", c->name, c->args);
        /* the whole description, its further lines under its first */
        const char *line = c->help;
        for (int first = 1; *line; first = 0) {
            const char *nl = strchr(line, '\n');
            int len = nl ? (int)(nl - line) : (int)strlen(line);
            fprintf(f, "  %-24s %.*s\n", first ? head : "", len, line);
            line += len + (nl != NULL);
        }
    }
    fprintf(f, "\noptions:\n"
               "  -c, --config FILE     the job config: dflashd's endpoint is control.endpoint or ipc://<run_dir>/ctl\n"
               "  --endpoint EP         dflashd's control endpoint (ipc://PATH, or tcp://HOST:PORT with --server-key)\n"
               "  --server-key FILE     dflashd's CURVE public key (tcp endpoints)\n"
               "  --client-key FILE     this client's CURVE secret key, for a dflashd that admits listed clients only\n"
               "                        (control.curve_client_keys_file); default: an ephemeral key\n"
               "  --name NAME           keygen: the key pair's file name (default dflashd)\n"
               "  --timeout SEC         how long dflashd may take to answer (default 5)\n"
               "  --wait SEC            how long to wait for pause, drain and restarts to complete (default 900); a\n"
               "                        restart's follower stops sooner when dflashd stops for good (its socket gone)\n"
               "  --json, --watch       status output (see `" PROG " status --help`)\n"
               "  -h, --help            this text; `" PROG " COMMAND --help` for one command\n"
               "\nexit status: 0 done, 1 refused or failed, 2 usage error or dflashd unreachable\n");
}

static void usage_command(FILE *f, const command *c)
{
    fprintf(f, "usage: " PROG "%s %s%s%s%s%s%s\n\n%s\n", c->opts & OPT_LOCAL ? "" : " [-c CONFIG | --endpoint EP]",
            c->name, c->opts & OPT_NAME ? " [--name NAME]" : "", c->args[0] ? " " : "", c->args,
            c->opts & OPT_JSON ? " [--json]" : "", c->opts & OPT_WATCH ? " [--watch]" : "", c->help);
}

static int bad_usage(const char *fmt, const char *arg)
{
    fprintf(stderr, PROG ": ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(try '" PROG " --help')\n");
    return 2;
}

static int parse_seconds(const char *opt, const char *v, double *out)
{
    char *end;
    double d = strtod(v, &end);
    if (*end || !(d > 0) || d > 1e7) {
        fprintf(stderr, PROG ": %s %s: expected seconds > 0\n", opt, v);
        return -1;
    }
    *out = d;
    return 0;
}

int main(int argc, char **argv)
{
    ctl_ctx x = {.timeout = 5.0, .wait = 900.0};
    const char *config = NULL, *endpoint = NULL, *server_key = NULL, *client_key = NULL;
    char *pos[8];
    int npos = 0, help = 0;
    signal(SIGPIPE, SIG_IGN);
    for (int i = 1; i < argc; i++) {
        char *a = argv[i], *val = NULL, *eq = NULL;
        if (a[0] != '-' || !a[1]) {
            if (npos == 8) return bad_usage("too many arguments (%s)", a);
            pos[npos++] = a;
            continue;
        }
        if (!strncmp(a, "--", 2) && (eq = strchr(a, '='))) *eq = '\0', val = eq + 1;
        int takes = !strcmp(a, "-c") || !strcmp(a, "--config") || !strcmp(a, "--endpoint") ||
                    !strcmp(a, "--server-key") || !strcmp(a, "--client-key") || !strcmp(a, "--timeout") ||
                    !strcmp(a, "--wait") || !strcmp(a, "--name");
        if (takes && !val) {
            if (i + 1 >= argc) return bad_usage("option %s needs a value", a);
            val = argv[++i];
        } else if (!takes && val) {
            return bad_usage("option %s takes no value", a);
        }
        if (!strcmp(a, "-c") || !strcmp(a, "--config")) config = val;
        else if (!strcmp(a, "--endpoint")) endpoint = val;
        else if (!strcmp(a, "--server-key")) server_key = val;
        else if (!strcmp(a, "--client-key")) client_key = val;
        else if (!strcmp(a, "--name")) x.key_name = val;
        else if (!strcmp(a, "--timeout")) { if (parse_seconds(a, val, &x.timeout)) return 2; }
        else if (!strcmp(a, "--wait")) { if (parse_seconds(a, val, &x.wait)) return 2; }
        else if (!strcmp(a, "--json")) x.json = 1;
        else if (!strcmp(a, "--watch")) x.watch = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) help = 1;
        else return bad_usage("unknown option %s", a);
    }
    if (npos == 0) {
        if (help) { usage(stdout); return 0; }
        return bad_usage("%s", "no command given");
    }
    const command *cmd = commands;
    while (cmd->name && strcmp(cmd->name, pos[0])) cmd++;
    if (!cmd->name) return bad_usage("unknown command \"%s\"", pos[0]);
    if (help) { usage_command(stdout, cmd); return 0; }
    if (npos - 1 != cmd->nargs) {
        fprintf(stderr, PROG " %s: expected %s%s\n", cmd->name, cmd->nargs ? cmd->args : "no arguments",
                npos - 1 > cmd->nargs ? " (too many arguments)" : "");
        usage_command(stderr, cmd);
        return 2;
    }
    if ((x.json && !(cmd->opts & OPT_JSON)) || (x.watch && !(cmd->opts & OPT_WATCH)))
        return bad_usage("--json and --watch apply to status only (%s)", cmd->name);
    if (x.key_name && !(cmd->opts & OPT_NAME)) return bad_usage("--name applies to keygen only (%s)", cmd->name);
    if (cmd->opts & OPT_LOCAL) {
        if (config || endpoint || server_key || client_key)
            return bad_usage("%s needs no job (-c, --endpoint, --server-key, --client-key)", cmd->name);
        return cmd->run(&x, pos + 1);
    }
    if (!config && !endpoint) return bad_usage("%s", "say which job: -c CONFIG or --endpoint EP");
    errbuf err = {{0}};
    static job_config cfg;
    if (config) {
        if (job_config_load(&cfg, config, NULL, 0, &err)) {
            fprintf(stderr, PROG ": %s\n", err.msg);
            return 2;
        }
        ctl_endpoint(&cfg, x.endpoint, sizeof x.endpoint);
    }
    if (endpoint) snprintf(x.endpoint, sizeof x.endpoint, "%s", endpoint);
    if (conn_open(&x.c, x.endpoint, config ? &cfg : NULL, server_key, client_key, &err)) {
        fprintf(stderr, PROG ": %s\n", err.msg);
        return 2;
    }
    int rc = cmd->run(&x, pos + 1);
    conn_close(&x.c);
    return rc;
}

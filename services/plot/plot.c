#include "plot.h"

#include <cairo-svg.h>
#include <cairo.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "json_util.h"
#include "util.h"

#define PROG "dflash plot"

/* The figure: three panels over one step axis, a legend right of each. Pixels (PNG) or points (SVG). */
enum { FIG_W = 1000, FIG_H = 1000, MARGIN_L = 80, MARGIN_R = 170, MARGIN_T = 72, MARGIN_B = 50, PANEL_GAP = 44 };
/* At most this many points per drawn series: longer ones are averaged over runs of consecutive steps. */
#define PLOT_MAX_POINTS 2000

typedef struct series {
    char name[32];
    double rgb[3];
    int markers; /* also a dot at each point */
    int n, cap;
    double *x, *y;
} series;

/* What the figure shows, read from the run folder. */
typedef struct plot_data {
    series loss, sim_tau, dec_tau;
    series *slot; /* per-slot accuracy, slots 1..nslots */
    int nslots;
    int metric_lines, eval_lines;
} plot_data;

static void series_init(series *s, const char *name, double r, double g, double b, int markers)
{
    *s = (series){.rgb = {r, g, b}, .markers = markers};
    snprintf(s->name, sizeof s->name, "%s", name);
}

static void series_add(series *s, double x, double y)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->x = xrealloc(s->x, (size_t)s->cap * sizeof *s->x);
        s->y = xrealloc(s->y, (size_t)s->cap * sizeof *s->y);
    }
    s->x[s->n] = x, s->y[s->n] = y, s->n++;
}

static void series_free(series *s)
{
    free(s->x);
    free(s->y);
    s->x = s->y = NULL;
    s->n = s->cap = 0;
}

/* ---- reading ---- */

typedef int (*line_fn)(plot_data *d, json_t *o, const char *path, int line, errbuf *err);

/* The integer "step" of a line (>= 0). */
static int line_step(json_t *o, const char *path, int line, double *step, errbuf *err)
{
    json_t *v = json_object_get(o, "step");
    if (!v) return errbuf_set(err, EINVAL, "%s:%d: no \"step\"", path, line);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return errbuf_set(err, EINVAL, "%s:%d: \"step\" is %s, want an integer >= 0", path, line,
                          json_is_integer(v) ? "negative" : json_type_name(v));
    *step = (double)json_integer_value(v);
    return 0;
}

/* A number field: 1 and *x when it is there, 0 when it is absent or null (a step without it), else an error. */
static int line_number(json_t *o, const char *key, const char *path, int line, double *x, errbuf *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v))
        return errbuf_set(err, EINVAL, "%s:%d: \"%s\" is %s, want a number", path, line, key, json_type_name(v));
    *x = json_number_value(v);
    return isfinite(*x) ? 1 : 0;
}

/* A metrics.jsonl line: {"step", "loss", "slot_accuracy": [slot 1, ...], "acceptance", ...}; other keys ignored. */
static int metrics_line(plot_data *d, json_t *o, const char *path, int line, errbuf *err)
{
    double step, x;
    /* dflashd's copy of an evaluation ({"step", "decoded_tau", ...}: no training figures) is not a step: the decoded
     * tau is drawn from eval.jsonl */
    if (json_object_get(o, "decoded_tau")) return 0;
    int rc = line_step(o, path, line, &step, err);
    if (rc) return rc;
    if ((rc = line_number(o, "loss", path, line, &x, err)) < 0) return rc;
    if (rc) series_add(&d->loss, step, x);
    if ((rc = line_number(o, "acceptance", path, line, &x, err)) < 0) return rc;
    if (rc) series_add(&d->sim_tau, step, x);
    json_t *acc = json_object_get(o, "slot_accuracy");
    if (acc && !json_is_array(acc))
        return errbuf_set(err, EINVAL, "%s:%d: \"slot_accuracy\" is %s, want an array of numbers", path, line,
                          json_type_name(acc));
    if (acc) {
        int n = (int)json_array_size(acc);
        if (!d->slot) {
            if (n < 1 || n > 1024)
                return errbuf_set(err, EINVAL, "%s:%d: \"slot_accuracy\" has %d entries, want 1..1024", path, line, n);
            d->nslots = n;
            d->slot = xcalloc((size_t)n, sizeof *d->slot);
            for (int k = 0; k < n; k++) {
                /* slot 1 dark blue .. the last slot yellow (viridis's ends and middle) */
                double t = n > 1 ? (double)k / (n - 1) : 0, r, g, b;
                if (t < 0.5) r = 0.267 + (0.128 - 0.267) * 2 * t, g = 0.005 + (0.567 - 0.005) * 2 * t,
                             b = 0.329 + (0.551 - 0.329) * 2 * t;
                else r = 0.128 + (0.993 - 0.128) * (2 * t - 1), g = 0.567 + (0.906 - 0.567) * (2 * t - 1),
                     b = 0.551 + (0.144 - 0.551) * (2 * t - 1);
                char name[32];
                snprintf(name, sizeof name, "slot %d", k + 1);
                series_init(&d->slot[k], name, r, g, b, 0);
            }
        } else if (n != d->nslots) {
            return errbuf_set(err, EINVAL, "%s:%d: \"slot_accuracy\" has %d entries, the lines before have %d", path,
                              line, n, d->nslots);
        }
        for (int k = 0; k < n; k++) {
            json_t *v = json_array_get(acc, (size_t)k);
            if (!json_is_number(v))
                return errbuf_set(err, EINVAL, "%s:%d: \"slot_accuracy\"[%d] is %s, want a number", path, line, k,
                                  json_type_name(v));
            series_add(&d->slot[k], step, json_number_value(v));
        }
    }
    d->metric_lines++;
    return 0;
}

/* An eval.jsonl line (the evaluation worker's): {"step", "tau", ...}. */
static int eval_line(plot_data *d, json_t *o, const char *path, int line, errbuf *err)
{
    double step, tau;
    int rc = line_step(o, path, line, &step, err);
    if (rc) return rc;
    if ((rc = line_number(o, "tau", path, line, &tau, err)) < 0) return rc;
    if (!rc) return errbuf_set(err, EINVAL, "%s:%d: no finite \"tau\"", path, line);
    series_add(&d->dec_tau, step, tau);
    d->eval_lines++;
    return 0;
}

/* Every line of a JSON-lines file through fn. Blank lines are skipped, and so is a last line without a newline
 * that does not parse (a writer is still writing it). Absent file: 1 when optional, else an error. */
static int read_jsonl(plot_data *d, const char *path, int optional, line_fn fn, errbuf *err)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        if (optional && errno == ENOENT) return 1;
        return errbuf_set(err, errno, "%s: %s", path, strerror(errno));
    }
    char *buf = NULL;
    size_t cap = 0;
    ssize_t len;
    int line = 0, rc = 0;
    while (!rc && (len = getline(&buf, &cap, f)) >= 0) {
        line++;
        int whole = len > 0 && buf[len - 1] == '\n';
        size_t i = 0;
        while (buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\r' || buf[i] == '\n') i++;
        if (!buf[i]) continue;
        json_error_t je;
        json_t *o = json_loads(buf, JSON_DECODE_ANY, &je);
        if (!o) {
            if (!whole) break; /* torn last line */
            rc = errbuf_set(err, EINVAL, "%s:%d:%d: invalid JSON: %s", path, line, je.column, je.text);
        } else if (!json_is_object(o)) {
            rc = errbuf_set(err, EINVAL, "%s:%d: %s, want a JSON object", path, line, json_type_name(o));
        } else {
            rc = fn(d, o, path, line, err);
        }
        json_decref(o);
    }
    if (!rc && ferror(f)) rc = errbuf_set(err, EIO, "%s: read error", path);
    free(buf);
    fclose(f);
    return rc;
}

/* ---- drawing ---- */

typedef struct axis {
    double lo, hi;
    int log; /* log10 scale */
} axis;

typedef struct panel {
    const char *title, *ylabel;
    series **s;
    int ns;
    axis y;
    double x0, y0, w, h; /* plot area */
} panel;

static double axis_frac(const axis *a, double v)
{
    if (a->log) return (log10(v) - log10(a->lo)) / (log10(a->hi) - log10(a->lo));
    return (v - a->lo) / (a->hi - a->lo);
}

/* A round tick spacing near range/n (1, 2 or 5 times a power of ten). */
static double nice_step(double range, int n)
{
    double raw = range / n, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

static void text_at(cairo_t *cr, double x, double y, const char *s, double align_x, double align_y)
{
    cairo_text_extents_t e;
    cairo_text_extents(cr, s, &e);
    cairo_move_to(cr, x - e.x_bearing - align_x * e.width, y - e.y_bearing - align_y * e.height);
    cairo_show_text(cr, s);
}

static void fmt_tick(char *out, size_t n, double v, double step)
{
    if (fabs(v) < step * 1e-6) v = 0;
    int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    if (fabs(v) >= 1e5 || (v != 0 && fabs(v) < 1e-3)) snprintf(out, n, "%.0e", v);
    else snprintf(out, n, "%.*f", dec, v);
}

/* The run of points of s from i to i+k-1 averaged (k = 1: the point itself). */
static void series_point(const series *s, int i, int k, double *x, double *y)
{
    double sx = 0, sy = 0;
    int m = 0;
    for (int j = i; j < i + k && j < s->n; j++) sx += s->x[j], sy += s->y[j], m++;
    *x = sx / m, *y = sy / m;
}

static void draw_panel(cairo_t *cr, const panel *p, const axis *xa, double xstep)
{
    /* grid and ticks */
    cairo_set_line_width(cr, 1);
    cairo_set_font_size(cr, 12);
    char lab[64];
    for (double t = ceil(xa->lo / xstep) * xstep; t <= xa->hi + xstep * 1e-9; t += xstep) {
        double px = p->x0 + axis_frac(xa, t) * p->w;
        cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
        cairo_move_to(cr, px, p->y0);
        cairo_line_to(cr, px, p->y0 + p->h);
        cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
        fmt_tick(lab, sizeof lab, t, xstep);
        text_at(cr, px, p->y0 + p->h + 6, lab, 0.5, 0);
    }
    if (p->y.log) {
        double d0 = floor(log10(p->y.lo)), d1 = ceil(log10(p->y.hi)), every = ceil((d1 - d0) / 8); /* <= 9 lines */
        for (double dcd = d0; dcd <= d1; dcd += every) {
            double v = pow(10, dcd);
            if (v < p->y.lo * 0.999 || v > p->y.hi * 1.001) continue;
            double py = p->y0 + p->h - axis_frac(&p->y, v) * p->h;
            cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
            cairo_move_to(cr, p->x0, py);
            cairo_line_to(cr, p->x0 + p->w, py);
            cairo_stroke(cr);
            cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
            snprintf(lab, sizeof lab, dcd >= 0 && dcd < 4 ? "%.0f" : "1e%.0f", dcd >= 0 && dcd < 4 ? v : dcd);
            if (dcd < 0 && dcd > -4) snprintf(lab, sizeof lab, "%.*f", (int)-dcd, v);
            text_at(cr, p->x0 - 6, py, lab, 1, 0.5);
        }
    } else {
        double ystep = nice_step(p->y.hi - p->y.lo, 5);
        for (double t = ceil(p->y.lo / ystep) * ystep; t <= p->y.hi + ystep * 1e-9; t += ystep) {
            double py = p->y0 + p->h - axis_frac(&p->y, t) * p->h;
            cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
            cairo_move_to(cr, p->x0, py);
            cairo_line_to(cr, p->x0 + p->w, py);
            cairo_stroke(cr);
            cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
            fmt_tick(lab, sizeof lab, t, ystep);
            text_at(cr, p->x0 - 6, py, lab, 1, 0.5);
        }
    }
    /* frame, title, y label */
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    cairo_rectangle(cr, p->x0, p->y0, p->w, p->h);
    cairo_stroke(cr);
    cairo_set_font_size(cr, 14);
    text_at(cr, p->x0, p->y0 - 8, p->title, 0, 1);
    cairo_save(cr);
    cairo_set_font_size(cr, 12);
    cairo_translate(cr, p->x0 - 58, p->y0 + p->h / 2);
    cairo_rotate(cr, -M_PI / 2);
    text_at(cr, 0, 0, p->ylabel, 0.5, 0.5);
    cairo_restore(cr);

    /* series: one stroked polyline each (a dot per point where asked), clipped to the plot area */
    for (int i = 0; i < p->ns; i++) {
        const series *s = p->s[i];
        if (!s->n) continue;
        int k = (s->n + PLOT_MAX_POINTS - 1) / PLOT_MAX_POINTS;
        cairo_save(cr);
        cairo_rectangle(cr, p->x0, p->y0, p->w, p->h);
        cairo_clip(cr);
        cairo_set_source_rgb(cr, s->rgb[0], s->rgb[1], s->rgb[2]);
        cairo_set_line_width(cr, 1.6);
        cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
        for (int j = 0; j < s->n; j += k) {
            double x, y;
            series_point(s, j, k, &x, &y);
            if (p->y.log && y <= 0) y = p->y.lo;
            double px = p->x0 + axis_frac(xa, x) * p->w, py = p->y0 + p->h - axis_frac(&p->y, y) * p->h;
            if (j == 0) cairo_move_to(cr, px, py);
            else cairo_line_to(cr, px, py);
        }
        cairo_stroke(cr);
        if (s->markers) {
            for (int j = 0; j < s->n; j += k) {
                double x, y;
                series_point(s, j, k, &x, &y);
                double px = p->x0 + axis_frac(xa, x) * p->w, py = p->y0 + p->h - axis_frac(&p->y, y) * p->h;
                cairo_new_sub_path(cr);
                cairo_arc(cr, px, py, 3.5, 0, 2 * M_PI);
            }
            cairo_fill(cr);
        }
        cairo_restore(cr);
    }
    /* legend */
    cairo_set_font_size(cr, 12);
    double ly = p->y0 + 8;
    for (int i = 0; i < p->ns; i++) {
        const series *s = p->s[i];
        double lx = p->x0 + p->w + 16;
        cairo_set_source_rgb(cr, s->rgb[0], s->rgb[1], s->rgb[2]);
        cairo_set_line_width(cr, 2.5);
        cairo_move_to(cr, lx, ly + 6);
        cairo_line_to(cr, lx + 22, ly + 6);
        cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
        char name[64];
        snprintf(name, sizeof name, "%s%s", s->name, s->n ? "" : " (none)");
        text_at(cr, lx + 28, ly + 6, name, 0, 0.5);
        ly += 18;
    }
}

/* The y axis of a panel's series: [lo, hi] over their points, padded; log when asked and the range spans more than
 * a factor of 20 with every point positive. fixed_lo / fixed_hi (NAN: none) bound it. */
static axis y_axis(series **s, int ns, int want_log, double fixed_lo, double min_hi)
{
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < ns; i++)
        for (int j = 0; j < s[i]->n; j++) lo = fmin(lo, s[i]->y[j]), hi = fmax(hi, s[i]->y[j]);
    if (!(lo <= hi)) lo = 0, hi = 1;
    axis a = {.lo = lo, .hi = hi};
    if (want_log && lo > 0 && hi / lo > 20) {
        a.log = 1;
        a.lo = pow(10, floor(log10(lo))), a.hi = pow(10, ceil(log10(hi)));
        return a;
    }
    if (!isnan(fixed_lo)) a.lo = fmin(fixed_lo, lo);
    else a.lo = lo > 0 && lo < hi * 0.5 ? 0 : lo;
    if (a.hi < min_hi) a.hi = min_hi;
    double pad = (a.hi - a.lo) * 0.05;
    if (pad <= 0) pad = fabs(a.hi) > 0 ? fabs(a.hi) * 0.1 : 1;
    a.hi += pad;
    if (isnan(fixed_lo)) a.lo -= a.lo > 0 ? pad : 0;
    return a;
}

static void draw_figure(cairo_t *cr, const plot_data *d, const char *run_dir)
{
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);

    axis xa = {.lo = INFINITY, .hi = -INFINITY};
    const series *all[] = {&d->loss, &d->sim_tau, &d->dec_tau};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        for (int j = 0; j < all[i]->n; j++) xa.lo = fmin(xa.lo, all[i]->x[j]), xa.hi = fmax(xa.hi, all[i]->x[j]);
    if (!(xa.lo < xa.hi)) xa.lo = isfinite(xa.lo) ? xa.lo - 1 : 0, xa.hi = xa.lo + 2;
    double xstep = nice_step(xa.hi - xa.lo, 8);
    if (xstep < 1) xstep = 1;

    series *loss[] = {(series *)&d->loss};
    series **slots = xcalloc((size_t)(d->nslots ? d->nslots : 1), sizeof *slots);
    for (int k = 0; k < d->nslots; k++) slots[k] = &d->slot[k];
    series *tau[] = {(series *)&d->sim_tau, (series *)&d->dec_tau};
    panel p[3] = {
        {.title = "loss (weighted cross-entropy of the drafted slots)", .ylabel = "loss", .s = loss, .ns = 1},
        {.title = "accuracy per slot (top-1 = label)", .ylabel = "accuracy", .s = slots, .ns = d->nslots},
        {.title = "acceptance length \u03c4", .ylabel = "\u03c4 (tokens per block)", .s = tau, .ns = 2},
    };
    p[0].y = y_axis(p[0].s, p[0].ns, 1, NAN, 0);
    p[1].y = (axis){.lo = 0, .hi = 1.02};
    p[2].y = y_axis(p[2].s, p[2].ns, 0, 1.0, 2.0);
    double ph = (FIG_H - MARGIN_T - MARGIN_B - 2 * PANEL_GAP) / 3.0;
    for (int i = 0; i < 3; i++) {
        p[i].x0 = MARGIN_L, p[i].w = FIG_W - MARGIN_L - MARGIN_R;
        p[i].y0 = MARGIN_T + i * (ph + PANEL_GAP), p[i].h = ph - 18; /* 18: tick labels under each */
        draw_panel(cr, &p[i], &xa, xstep);
    }
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    cairo_set_font_size(cr, 16);
    char title[512];
    snprintf(title, sizeof title, "%.300s: %d steps%s", run_dir, d->metric_lines,
             d->eval_lines ? "" : " (no eval.jsonl: \u03c4 simulated only)");
    text_at(cr, MARGIN_L, 16, title, 0, 0);
    cairo_set_font_size(cr, 12);
    text_at(cr, MARGIN_L + (FIG_W - MARGIN_L - MARGIN_R) / 2.0, FIG_H - 18, "step", 0.5, 0);
    free(slots);
}

/* Draw into out (.png or .svg, written to out.tmp and renamed). */
static int plot_write(const plot_data *d, const char *run_dir, const char *out, int svg, errbuf *err)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    cairo_surface_t *surf = svg ? cairo_svg_surface_create(tmp, FIG_W, FIG_H)
                                : cairo_image_surface_create(CAIRO_FORMAT_RGB24, FIG_W, FIG_H);
    cairo_status_t st = cairo_surface_status(surf);
    if (st != CAIRO_STATUS_SUCCESS) {
        cairo_surface_destroy(surf);
        unlink(tmp);
        return errbuf_set(err, EIO, "%s: cannot create the %s surface: %s", tmp, svg ? "SVG" : "image",
                          cairo_status_to_string(st));
    }
    cairo_t *cr = cairo_create(surf);
    draw_figure(cr, d, run_dir);
    st = cairo_status(cr);
    cairo_destroy(cr);
    if (st == CAIRO_STATUS_SUCCESS && !svg) st = cairo_surface_write_to_png(surf, tmp);
    cairo_surface_finish(surf);
    if (st == CAIRO_STATUS_SUCCESS) st = cairo_surface_status(surf);
    cairo_surface_destroy(surf);
    if (st != CAIRO_STATUS_SUCCESS) {
        unlink(tmp);
        return errbuf_set(err, EIO, "%s: cannot write: %s", tmp, cairo_status_to_string(st));
    }
    if (rename(tmp, out)) {
        int e = errno;
        unlink(tmp);
        return errbuf_set(err, e, "%s: cannot rename to %s: %s", tmp, out, strerror(e));
    }
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " RUN_DIR [-o FILE.png|FILE.svg]\n"
            "\n"
            "Draws a job's training over steps, with Cairo, as PNG or SVG (by the output's extension):\n"
            "  loss                  from RUN_DIR/metrics.jsonl (log scale when it falls by more than 20x)\n"
            "  accuracy per slot     from metrics.jsonl (slot k: the k-th drafted token equals the label)\n"
            "  acceptance length     simulated (metrics.jsonl \"acceptance\") and, when RUN_DIR/eval.jsonl exists,\n"
            "                        decoded by the evaluation worker (its \"tau\" per evaluated step, dots)\n"
            "A running job's files can be read: a last line still being written is left out. Series longer than\n"
            "%d points are drawn as means over runs of consecutive steps.\n"
            "\n"
            "  -o, --output FILE   the figure (.png or .svg; default RUN_DIR/plot.png); replaced atomically\n"
            "  -h, --help          this text\n"
            "\n"
            "Exit status: 0 written, 1 bad or missing input (the message names the file and line), 2 usage error.\n",
            PLOT_MAX_POINTS);
}

static int has_suffix(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n > m && !strcasecmp(s + n - m, suf);
}

int cmd_plot(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"output", required_argument, NULL, 'o'}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    const char *out = NULL;
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":o:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 'h': usage(stdout); return 0;
        case ':': fprintf(stderr, PROG ": %s needs a value (see --help)\n", argv[optind - 1]); return 2;
        default: fprintf(stderr, PROG ": unknown option %s (see --help)\n", argv[optind - 1]); return 2;
        }
    }
    if (argc - optind != 1) {
        fprintf(stderr, PROG ": expected one RUN_DIR (see --help)\n");
        return 2;
    }
    const char *run_dir = argv[optind];
    char metrics[4096], evalp[4096], def_out[4096];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run_dir);
    snprintf(evalp, sizeof evalp, "%s/eval.jsonl", run_dir);
    snprintf(def_out, sizeof def_out, "%s/plot.png", run_dir);
    if (!out) out = def_out;
    int svg = has_suffix(out, ".svg");
    if (!svg && !has_suffix(out, ".png")) {
        fprintf(stderr, PROG ": -o %s: the name must end in .png or .svg\n", out);
        return 2;
    }

    plot_data d = {0};
    series_init(&d.loss, "loss", 0.122, 0.467, 0.706, 0);
    series_init(&d.sim_tau, "simulated", 0.173, 0.627, 0.173, 0);
    series_init(&d.dec_tau, "decoded", 0.839, 0.153, 0.157, 1);
    errbuf err = {{0}};
    int rc = read_jsonl(&d, metrics, 0, metrics_line, &err);
    if (!rc && !d.metric_lines) rc = errbuf_set(&err, ENODATA, "%s: no steps yet", metrics);
    if (!rc && (rc = read_jsonl(&d, evalp, 1, eval_line, &err)) > 0) rc = 0;
    if (!rc) rc = plot_write(&d, run_dir, out, svg, &err);
    if (rc) fprintf(stderr, PROG ": %s\n", err.msg);
    else
        printf("wrote %s: %d steps, %d slots, %d decoded evaluations%s\n", out, d.metric_lines, d.nslots,
               d.eval_lines, d.eval_lines ? "" : " (no eval.jsonl)");
    series_free(&d.loss);
    series_free(&d.sim_tau);
    series_free(&d.dec_tau);
    for (int k = 0; k < d.nslots; k++) series_free(&d.slot[k]);
    free(d.slot);
    return rc ? 1 : 0;
}

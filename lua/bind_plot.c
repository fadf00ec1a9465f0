/*
 * bind_plot.c - gm.plot: line and point plots and confusion matrices as PNG files, for the
 * runner's loss curves, metric-vs-field plots and confusion matrices (lua/report.lua) and for
 * scripts.
 *
 *   gm.plot{file=, title=, xlabel=, ylabel=, logx=, kind="lines"|"points"|"band", xticks={..},
 *           xticklabels={..}, series={{label=, x={..}, y={..}, err={..}, color=}, ..}}
 *                                    -> {file=, width=, height=, ink=} (PNG 1024x640)
 *   gm.plot{file=, title=, kind="confusion", labels={name, ..}, matrix={{count, ..}, ..},
 *           xlabel="predicted label", ylabel="true label", colorbar=true}
 *                                    -> {file=, width=, height=, ink=} (square PNG, see below)
 *
 * The file must end in .png and lie inside the results folder (lua/write_rule.h). A NaN in a
 * series breaks its line; on a log axis non-positive x are left out; `color` picks one of 10
 * colors x 4 dash styles; legends that do not fit end in a "... N more" line.
 *
 * kind = "confusion" draws a K x K heatmap as scikit-learn's ConfusionMatrixDisplay does: row i
 * is the true label labels[i], column j the predicted one, matrix[i][j] the count (a whole
 * number >= 0). A cell is shaded by its share of its row (white to dark blue), so that rare and
 * common classes read alike; a row without examples is grey (its share is undefined). Counts
 * are written in the cells up to K = 40; class names longer than 28 characters end in "…";
 * column names turn vertical when they do not fit their column. The PNG is square: cells of
 * 26 px up to K = 40 (10 px beyond) plus margins sized to the longest name, at least 1024 px
 * (3 short names: 1024x1024) and at most 4096 px (then cells shrink and, below 9 px names,
 * every n-th class is named); K <= 1000.
 *
 * PLplot draws (pngcairo device, Debian package plplot-driver-cairo, loaded at run time). It
 * prints to stdout/stderr and calls exit() on fatal errors, so every PLplot call runs with fds 1
 * and 2 pointed at /dev/null and with an exit handler that longjmps back here; the device is
 * looked up first (an absent pngcairo driver would make PLplot prompt on stdin). The written
 * PNG is decoded again with libpng, so a returned plot is a complete, valid image.
 *
 * Ownership: the spec's arrays live in userdata on the Lua stack for the duration of the call;
 * the PLplot stream is ended before returning, also after a fatal PLplot error. Errors: Lua
 * errors naming gm.plot and the offending field; the file is removed when drawing fails.
 */
#define _GNU_SOURCE
#include "bind_util.h"
#include "gm_lua.h"
#include "write_rule.h"

#include <errno.h>
#include <fcntl.h>
#include <lauxlib.h>
#include <math.h>
#include <plplot.h>
#include <png.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PLOT_W 1024
#define PLOT_H 640
#define PLOT_MAX_SERIES 256
#define LEGEND_MAX_COLS 2

/* Tableau 10 (matplotlib's default cycle): distinct for color-blind readers too. */
static const unsigned char PALETTE[10][3] = {
    {31, 119, 180}, {255, 127, 14},  {44, 160, 44},   {214, 39, 40},  {148, 103, 189},
    {140, 86, 75},  {227, 119, 194}, {127, 127, 127}, {188, 189, 34}, {23, 190, 207}};
#define COL_BG 0
#define COL_FG 1
#define COL_GRID 2
#define COL_FIRST 3 // palette colors follow (10)
#define COL_EMPTY 13 // confusion: the cells of a row without examples
#define COL_ZERO 14  // confusion: the "0" of an empty cell, fainter than the counts
#define COL_BAND 15  // the translucent fill of a band (set per series)

/* ColorBrewer's 9-class Blues (matplotlib's "Blues"), a confusion cell's share 0 to 1. */
static const unsigned char BLUES[9][3] = {{247, 251, 255}, {222, 235, 247}, {198, 219, 239},
                                          {158, 202, 225}, {107, 174, 214}, {66, 146, 198},
                                          {33, 113, 181},  {8, 81, 156},    {8, 48, 107}};
#define CONF_MAX_K 1000    // classes; the matrix is K^2 doubles and the PNG at most 4096 px
#define CONF_MAX_COUNTS 40 // up to this K the counts are written in the cells

typedef struct plot_series {
    const char *label; // NULL: not in the legend
    int n;
    double *x, *y, *err; // (n); err may be NULL
    int color;
} plot_series;

typedef struct plot_spec {
    const char *file, *title, *xlabel, *ylabel;
    bool logx, points, band; // band: lines with y ± err filled, translucent
    int n_series;
    plot_series *s;
    int n_ticks;
    double *ticks;
    const char **tick_labels;
} plot_spec;

typedef struct confusion_spec {
    const char *file, *title, *xlabel, *ylabel;
    int K;
    const char **labels; // (K), borrowed from the Lua table
    double *m;           // (K, K) counts, row = true label, column = predicted
    bool colorbar;
} confusion_spec;

static jmp_buf *plot_jmp;
static char plot_msg[512];

/* PLplot's exit handler: PLplot would call exit() after it returns, so it never does. */
static int plot_exit(const char *msg) {
    snprintf(plot_msg, sizeof plot_msg, "%s", msg ? msg : "PLplot failed");
    longjmp(*plot_jmp, 1);
    return 0;
}

static void plot_abort(const char *msg) {
    if (!plot_msg[0]) snprintf(plot_msg, sizeof plot_msg, "%s", msg ? msg : "PLplot error");
}

/* fds 1 and 2 to /dev/null (PLplot prints there) and back. */
typedef struct quiet {
    int saved[2];
} quiet;

static void quiet_on(quiet *q) {
    fflush(stdout);
    fflush(stderr);
    int dn = open("/dev/null", O_WRONLY | O_CLOEXEC);
    for (int i = 0; i < 2; i++) {
        q->saved[i] = dup(i + 1);
        if (dn >= 0) dup2(dn, i + 1);
    }
    if (dn >= 0) close(dn);
}

static void quiet_off(quiet *q) {
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < 2; i++)
        if (q->saved[i] >= 0) {
            dup2(q->saved[i], i + 1);
            close(q->saved[i]);
        }
}

static bool have_device(const char *name) {
    const char **menu = NULL, **devs = NULL;
    PLINT n = 64;
    menu = calloc((size_t)n, sizeof *menu);
    devs = calloc((size_t)n, sizeof *devs);
    bool found = false;
    if (menu && devs) {
        plgDevs(&menu, &devs, &n);
        for (PLINT i = 0; i < n && !found; i++) found = devs[i] && strcmp(devs[i], name) == 0;
    }
    free(menu);
    free(devs);
    return found;
}

static double tx(const plot_spec *p, double x) { return p->logx ? log10(x) : x; }

/* Draws a line, point or band plot (a plot_spec); returns false with plot_msg set on failure.
 * Runs under quiet + setjmp. */
static bool draw_lines(const void *spec) {
    const plot_spec *p = spec;
    // data range (finite values; log axis: positive x only)
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int i = 0; i < p->n_series; i++)
        for (int k = 0; k < p->s[i].n; k++) {
            double x = p->s[i].x[k], y = p->s[i].y[k], e = p->s[i].err ? p->s[i].err[k] : 0;
            if (!isfinite(x) || !isfinite(y) || (p->logx && x <= 0)) continue;
            if (!isfinite(e)) e = 0;
            x = tx(p, x);
            x0 = fmin(x0, x), x1 = fmax(x1, x);
            y0 = fmin(y0, y - fabs(e)), y1 = fmax(y1, y + fabs(e));
        }
    for (int i = 0; i < p->n_ticks; i++)
        if (isfinite(p->ticks[i]) && !(p->logx && p->ticks[i] <= 0)) {
            x0 = fmin(x0, tx(p, p->ticks[i]));
            x1 = fmax(x1, tx(p, p->ticks[i]));
        }
    if (!(x0 <= x1) || !(y0 <= y1)) {
        snprintf(plot_msg, sizeof plot_msg, "no finite data points to plot");
        return false;
    }
    // margins: 5% of the range (a flat series gets +-0.5 or 5% of its value)
    double dx = x1 - x0, dy = y1 - y0;
    if (dx == 0) dx = fabs(x0) > 0 ? fabs(x0) * 0.1 : 1;
    if (dy == 0) dy = fabs(y0) > 0 ? fabs(y0) * 0.1 : 1;
    double wx0 = x0 - 0.05 * dx, wx1 = x1 + 0.05 * dx, wy0 = y0 - 0.06 * dy, wy1 = y1 + 0.06 * dy;
    if (p->n_ticks > 0 && x1 - x0 > 0) wx0 = x0 - 0.08 * dx, wx1 = x1 + 0.08 * dx;

    // The legend sits right of the plot: up to `rows_fit` entries per column (the page height
    // below the plot's top), up to LEGEND_MAX_COLS columns; entries beyond that are summed up
    // in a last "... N more" line. Its width (the longest label plus the line sample) comes
    // off the plot. legend_ts is pllegend's text_scale, relative to the *default* character
    // height (pllegend sets it itself).
    int n_legend = 0;
    for (int i = 0; i < p->n_series; i++) n_legend += p->s[i].label != NULL;
    double legend_ts = n_legend > 16 ? 0.75 : 0.9, legend_frac = 0;
    double spacing = n_legend > 18 ? 1.25 : 1.6;
    int ncol = 1, shown = n_legend;
    const double vy1 = 0.89;
    pladv(0);
    if (n_legend) {
        PLFLT def_ht, ht, sx0, sx1, sy0, sy1;
        plgchr(&def_ht, &ht);
        plgspa(&sx0, &sx1, &sy0, &sy1);
        double page = sx1 - sx0, fixed = 0.07 * page; // sample line, gaps, frame
        // measured with pngcairo: an entry takes text_spacing x 1.1 default heights, whatever
        // text_scale is
        int rows_fit = (int)((vy1 - 0.02) * (sy1 - sy0) / (spacing * 1.12 * def_ht));
        if (rows_fit < 1) rows_fit = 1;
        ncol = (n_legend + rows_fit - 1) / rows_fit;
        if (ncol > LEGEND_MAX_COLS) ncol = LEGEND_MAX_COLS;
        if (n_legend > ncol * rows_fit) shown = ncol * rows_fit - 1; // + the "more" line
        size_t longest = 0; // in characters (UTF-8 code points)
        for (int i = 0; i < p->n_series; i++) {
            size_t n = 0;
            for (const char *c = p->s[i].label; c && *c; c++)
                n += ((unsigned char)*c & 0xC0) != 0x80;
            if (p->s[i].label && n > longest) longest = n;
        }
        if (longest < 12) longest = 12; // room for the "... N more" line
        // PLplot 5.15 exports no text-length query. Measured with pngcairo and DejaVu Sans:
        // 0.68 x text_scale x the default height per character (lower case, digits, '=', ',')
        double per_char = 0.70 * def_ht;
        double text_mm = per_char * legend_ts * (double)longest;
        if (ncol > 1) fixed = 0.11 * page; // pllegend spaces its columns more generously
        double max_frac = 0.42 + 0.08 * (ncol - 1);
        if (ncol * (text_mm + fixed) / page > max_frac) { // a smaller font, not a tiny plot
            legend_ts = fmax(0.55, (max_frac * page / ncol - fixed) / (per_char * (double)longest));
            text_mm = per_char * legend_ts * (double)longest;
        }
        legend_frac = fmin(0.7, ncol * (text_mm + fixed) / page);
    }
    double vx0 = 0.10, vx1 = n_legend ? 0.985 - legend_frac - 0.02 : 0.97, vy0 = 0.13;
    plschr(0, 1.1);
    plvpor(vx0, vx1, vy0, vy1);
    plwind(wx0, wx1, wy0, wy1);
    // grid, then the frame and the axes
    plcol0(COL_GRID);
    plwidth(1);
    plbox(p->n_ticks ? "" : (p->logx ? "gl" : "g"), 0, 0, "g", 0, 0);
    plcol0(COL_FG);
    plwidth(1.5);
    if (p->n_ticks) {
        plbox("bc", 0, 0, "bcnstv", 0, 0);
        for (int i = 0; i < p->n_ticks; i++) {
            double t = p->ticks[i];
            if (!isfinite(t) || (p->logx && t <= 0)) continue;
            double x = tx(p, t);
            pljoin(x, wy0, x, wy0 + 0.015 * (wy1 - wy0));
            char def[32];
            snprintf(def, sizeof def, "%g", t);
            const char *lab = p->tick_labels && p->tick_labels[i] ? p->tick_labels[i] : def;
            plmtex("b", 1.6, (x - wx0) / (wx1 - wx0), 0.5, lab);
        }
    } else {
        plbox(p->logx ? "bcnstl" : "bcnst", 0, 0, "bcnstv", 0, 0);
    }
    plmtex("b", 3.2, 0.5, 0.5, p->xlabel ? p->xlabel : "");
    plmtex("l", 5.0, 0.5, 0.5, p->ylabel ? p->ylabel : "");

    static const char *const symbols[4] = {"●", "■", "▲", "◆"};
    PLINT opt[PLOT_MAX_SERIES], tcol[PLOT_MAX_SERIES], lcol[PLOT_MAX_SERIES], lsty[PLOT_MAX_SERIES],
        scol[PLOT_MAX_SERIES], snum[PLOT_MAX_SERIES];
    PLFLT lwid[PLOT_MAX_SERIES], sscl[PLOT_MAX_SERIES];
    const char *text[PLOT_MAX_SERIES], *sym[PLOT_MAX_SERIES];
    int nl = 0;
    for (int i = 0; i < p->n_series; i++) {
        const plot_series *s = &p->s[i];
        int c = s->color >= 0 ? s->color : i;
        PLINT col = COL_FIRST + c % 10, style = 1 + (c / 10) % 4; // 10 colors x 4 dash styles
        if (p->band && s->err) {
            // each run of finite points: the polygon y + err forward, y - err back, at 20%
            // opacity of the series' color (pngcairo draws alpha), under the line
            PLINT r, g, b;
            plgcol0(col, &r, &g, &b);
            plscol0a(COL_BAND, r, g, b, 0.2);
            plcol0(COL_BAND);
            for (int k = 0; k < s->n;) {
                while (k < s->n && !(isfinite(s->x[k]) && isfinite(s->y[k]) && isfinite(s->err[k]) &&
                                     !(p->logx && s->x[k] <= 0)))
                    k++;
                int a = k;
                while (k < s->n && isfinite(s->x[k]) && isfinite(s->y[k]) && isfinite(s->err[k]) &&
                       !(p->logx && s->x[k] <= 0))
                    k++;
                int m = k - a;
                PLFLT *xs = m >= 2 ? malloc(4 * (size_t)m * sizeof *xs) : NULL;
                if (xs) {
                    PLFLT *ys = xs + 2 * m;
                    for (int j = 0; j < m; j++) {
                        xs[j] = tx(p, s->x[a + j]), ys[j] = s->y[a + j] + s->err[a + j];
                        xs[2 * m - 1 - j] = xs[j], ys[2 * m - 1 - j] = s->y[a + j] - s->err[a + j];
                    }
                    plfill(2 * m, xs, ys);
                    free(xs);
                }
            }
        }
        plcol0(col);
        pllsty(style);
        plwidth(p->points ? 1.5 : 2.0);
        // lines: each run of finite points (a NaN breaks the line)
        for (int k = 0; k < s->n;) {
            while (k < s->n &&
                   (!isfinite(s->x[k]) || !isfinite(s->y[k]) || (p->logx && s->x[k] <= 0)))
                k++;
            int a = k;
            while (k < s->n && isfinite(s->x[k]) && isfinite(s->y[k]) && !(p->logx && s->x[k] <= 0))
                k++;
            PLFLT *xs = k - a >= 2 ? malloc(2 * (size_t)(k - a) * sizeof *xs) : NULL;
            if (xs) {
                PLFLT *ys = xs + (k - a);
                for (int j = a; j < k; j++) xs[j - a] = tx(p, s->x[j]), ys[j - a] = s->y[j];
                plline(k - a, xs, ys);
                free(xs);
            }
        }
        pllsty(1);
        if (p->points) {
            for (int k = 0; k < s->n; k++) {
                if (!isfinite(s->x[k]) || !isfinite(s->y[k]) || (p->logx && s->x[k] <= 0)) continue;
                PLFLT x = tx(p, s->x[k]), y = s->y[k];
                if (s->err && isfinite(s->err[k]) && s->err[k] > 0) {
                    PLFLT lo = y - s->err[k], hi = y + s->err[k];
                    plerry(1, &x, &lo, &hi);
                }
                plstring(1, &x, &y, symbols[c % 4]);
            }
        }
        if (s->label && nl < shown) {
            opt[nl] = PL_LEGEND_LINE | (p->points ? PL_LEGEND_SYMBOL : 0);
            text[nl] = s->label;
            tcol[nl] = COL_FG;
            lcol[nl] = col;
            lsty[nl] = style;
            lwid[nl] = 2.0;
            scol[nl] = col;
            snum[nl] = 1;
            sscl[nl] = 1.0;
            sym[nl] = symbols[c % 4];
            nl++;
        }
    }
    char more[48];
    if (shown < n_legend) { // the entries that did not fit, as one text-only line
        snprintf(more, sizeof more, "... %d more", n_legend - shown);
        opt[nl] = PL_LEGEND_NONE;
        text[nl] = more;
        tcol[nl] = COL_FG;
        lcol[nl] = scol[nl] = COL_FG;
        lsty[nl] = snum[nl] = 1;
        lwid[nl] = sscl[nl] = 1.0;
        sym[nl] = "";
        nl++;
    }
    if (nl > 0) {
        PLFLT lw, lh;
        int nrow = (nl + ncol - 1) / ncol;
        // top right corner of the page, level with the top of the plot area
        pllegend(&lw, &lh, PL_LEGEND_BACKGROUND | PL_LEGEND_BOUNDING_BOX,
                 PL_POSITION_SUBPAGE | PL_POSITION_INSIDE | PL_POSITION_TOP | PL_POSITION_RIGHT,
                 0.015, 1.0 - vy1, 0.04 * legend_ts / 0.9, COL_BG, COL_FG, 1, nrow, ncol, nl, opt,
                 0.6, legend_ts, spacing, 0.0, tcol, text, NULL, NULL, NULL, NULL, lcol, lsty, lwid,
                 scol, sscl, snum, sym);
    }
    // the title, centered on the page
    plvpor(0.0, 1.0, 0.0, vy1);
    plschr(0, 1.3);
    plcol0(COL_FG);
    plmtex("t", 1.3, 0.5, 0.5, p->title ? p->title : "");
    return true;
}

/* ---- confusion matrices ------------------------------------------------------------------------ */

/* PLplot has no text-length query (5.15). Measured with pngcairo and DejaVu Sans, a character is
 * about 0.70 of the character height wide (lower case); class names mix in capitals, digits and
 * '_' ("class_number_101" measured 0.78), so a little more is reserved. */
#define CHAR_W 0.80
/* PLplot's default character height is 1/50 of the page's width: the confusion plot's text
 * keeps the size it has on a 1024 px page (CONF_BASE px), whatever the page. */
#define CONF_BASE (PLOT_W / 50.0)
#define CONF_MIN_TICK 9.0   // px: smaller class names are not drawn (every step-th one instead)
#define CONF_MAX_CHARS 28   // Oxford Pets' longest breed name has 26
#define CONF_MAX_SIDE 4096  // px

static size_t utf8_len(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* s shortened to at most max_chars code points (the last one then "…") with PLplot's escape
 * character '#' doubled (a class name such as "C#" would otherwise start a text escape), into
 * out (cap bytes). */
static void tick_text(const char *s, size_t max_chars, char *out, size_t cap) {
    size_t n = utf8_len(s), keep = n <= max_chars ? n : (max_chars > 1 ? max_chars - 1 : 1), k = 0, o = 0;
    for (const char *c = s; *c && o + 8 < cap; c++) {
        if (((unsigned char)*c & 0xC0) != 0x80 && k++ == keep) break; // a code point's first byte
        if (*c == '#') out[o++] = '#';
        out[o++] = *c;
    }
    if (keep < n && o + 4 < cap) memcpy(out + o, "\xE2\x80\xA6", 3), o += 3; // U+2026 …
    out[o] = '\0';
}

/* Where everything of a confusion plot goes, in pixels (y up from the bottom of the page). */
typedef struct conf_layout {
    int side;                            // the square page
    double tick, count, title;           // character heights: class names, counts, title
    double left, right, top, bottom;     // margins
    double s, cell, x0, y0;              // the matrix: side, cell, lower left corner
    double lab_w;                        // the longest (shortened) class name, as drawn
    size_t max_chars;                    // class names longer than this end in "…"
    int step;                            // every step-th class is named (1 up to hundreds)
    bool vertical;                       // column names read bottom to top
} conf_layout;

/* The page: cells of 26 px while counts are written in them (K <= 40), else 10 px; the matrix at
 * least 620 px; margins for the class names (at most CONF_MAX_CHARS characters), the axis
 * labels, the title and the colour bar; square, 1024..4096 px. With more classes than 4096 px
 * hold, cells shrink and only every step-th class is named (names at least 9 px high). */
static void conf_layout_make(const confusion_spec *c, conf_layout *o) {
    const int K = c->K;
    const double B = CONF_BASE, axis = 1.1 * B;
    size_t longest = 1;
    for (int i = 0; i < K; i++) {
        size_t n = utf8_len(c->labels[i]);
        if (n > longest) longest = n;
    }
    o->max_chars = CONF_MAX_CHARS;
    if (longest > o->max_chars) longest = o->max_chars;
    o->cell = K <= CONF_MAX_COUNTS ? 26 : 10;
    o->top = 4.2 * B;
    o->right = c->colorbar ? 11.0 * B : 1.5 * B;
    o->side = 0;
    for (int pass = 0; pass < 2; pass++) {
        // names at most 85% of the base height and 80% of a cell (or of step cells)
        o->step = 1;
        o->tick = fmin(0.85 * B, 0.8 * o->cell);
        if (o->tick < CONF_MIN_TICK) {
            o->step = (int)ceil(CONF_MIN_TICK / o->tick);
            o->tick = fmin(0.85 * B, 0.8 * o->cell * o->step);
        }
        o->lab_w = CHAR_W * o->tick * (double)longest;
        o->vertical = o->lab_w > 0.95 * o->cell * o->step;
        o->left = 0.8 * B + 2.5 * axis + o->lab_w + 0.6 * o->tick;
        o->bottom = 0.8 * B + 2.0 * axis + (o->vertical ? o->lab_w : 1.3 * o->tick) + 0.6 * o->tick;
        if (pass == 0) {
            double m = fmax(o->cell * K, 620);
            double side = fmax(o->left + m + o->right, o->top + m + o->bottom);
            o->side = side < PLOT_W ? PLOT_W : side > CONF_MAX_SIDE ? CONF_MAX_SIDE : (int)ceil(side);
        }
        o->s = fmin(o->side - o->left - o->right, o->side - o->top - o->bottom);
        o->cell = o->s / K; // the cell as it came out: the second pass sizes the names to it
    }
    // centred in the room left of the colour bar and below the title
    o->x0 = o->left + 0.5 * (o->side - o->left - o->right - o->s);
    o->y0 = o->bottom + 0.5 * (o->side - o->top - o->bottom - o->s);
    size_t tl = utf8_len(c->title);
    o->title = fmin(1.3 * B, 0.96 * o->side / (CHAR_W * (double)(tl ? tl : 1)));
    o->count = 0;
    if (K <= CONF_MAX_COUNTS) {
        // the counts as large as the widest fits its cell
        double maxcount = 0;
        for (size_t i = 0; i < (size_t)K * K; i++) maxcount = fmax(maxcount, c->m[i]);
        char num[32];
        int digits = snprintf(num, sizeof num, "%.0f", maxcount);
        o->count = fmin(B, fmin(0.42 * o->cell, 0.8 * o->cell / (CHAR_W * digits)));
    }
}

/* Draws a confusion_spec; returns false with plot_msg set on failure. Runs under quiet + setjmp.
 * The layout is in pixels; PLplot wants mm (its page is the PNG at 72 dpi) and normalized
 * viewport coordinates. */
static bool draw_confusion(const void *spec) {
    const confusion_spec *c = spec;
    const int K = c->K;
    conf_layout o;
    conf_layout_make(c, &o);
    pladv(0);
    PLFLT sx0, sx1, sy0, sy1;
    plgspa(&sx0, &sx1, &sy0, &sy1);
    const double mm = (sx1 - sx0) / o.side, side = o.side; // mm per pixel
    if (o.s < 40) {
        snprintf(plot_msg, sizeof plot_msg, "%d classes leave no room for the matrix", K);
        return false;
    }
    plvpor(o.x0 / side, (o.x0 + o.s) / side, o.y0 / side, (o.y0 + o.s) / side);
    plwind(0, K, 0, K);

    PLFLT r[9], g[9], b[9], pos[9];
    for (int k = 0; k < 9; k++)
        pos[k] = k / 8.0, r[k] = BLUES[k][0] / 255.0, g[k] = BLUES[k][1] / 255.0, b[k] = BLUES[k][2] / 255.0;
    plscmap1n(256);
    plscmap1l(1, 9, pos, r, g, b, NULL);
    plscol0(COL_EMPTY, 200, 200, 200);
    plscol0(COL_ZERO, 150, 150, 150);
    // The whole square in the share-0 color, then only the nonzero cells (at most the number of
    // examples) and the rows without examples: K^2 fills would be slow for hundreds of classes.
    PLFLT xs[4], ys[4];
    plcol1(0.0);
    xs[0] = 0, xs[1] = K, xs[2] = K, xs[3] = 0, ys[0] = 0, ys[1] = 0, ys[2] = K, ys[3] = K;
    plfill(4, xs, ys);
    for (int i = 0; i < K; i++) {
        double total = 0;
        for (int j = 0; j < K; j++) total += c->m[(size_t)i * K + j];
        double yt = K - i, yb = K - i - 1; // row 1 at the top, as a table reads
        if (total <= 0) {                    // no examples: no share, not a share of 0
            plcol0(COL_EMPTY);
            xs[0] = 0, xs[1] = K, xs[2] = K, xs[3] = 0, ys[0] = yb, ys[1] = yb, ys[2] = yt, ys[3] = yt;
            plfill(4, xs, ys);
            continue;
        }
        for (int j = 0; j < K; j++) {
            double v = c->m[(size_t)i * K + j];
            if (v <= 0) continue;
            plcol1(v / total);
            xs[0] = j, xs[1] = j + 1, xs[2] = j + 1, xs[3] = j, ys[0] = yb, ys[1] = yb, ys[2] = yt, ys[3] = yt;
            plfill(4, xs, ys);
        }
    }
    if (o.count > 0) {
        // white on the dark half of the scale, zeros fainter than the counts
        char num[32];
        plschr(o.count * mm, 1.0);
        for (int i = 0; i < K; i++) {
            double total = 0;
            for (int j = 0; j < K; j++) total += c->m[(size_t)i * K + j];
            for (int j = 0; j < K; j++) {
                double v = c->m[(size_t)i * K + j];
                plcol0(v <= 0 ? COL_ZERO : v / total > 0.5 ? COL_BG : COL_FG);
                snprintf(num, sizeof num, "%.0f", v);
                plptex(j + 0.5, K - i - 0.5, 1, 0, 0.5, num); // centred on the point, both ways
            }
        }
    }
    plcol0(COL_FG);
    plwidth(1.5);
    plbox("bc", 0, 0, "bc", 0, 0);
    // class names on the ticks (plmtex's displacement is in character heights)
    plschr(o.tick * mm, 1.0);
    char lab[512];
    for (int i = 0; i < K; i += o.step) {
        double at = (i + 0.5) / K;
        tick_text(c->labels[i], o.max_chars, lab, sizeof lab);
        plmtex("lv", 0.6, 1.0 - at, 1.0, lab);
        if (o.vertical)
            plmtex("bv", 0.6, at, 1.0, lab);
        else
            plmtex("b", 1.3, at, 0.5, lab);
    }
    const double axis = 1.1 * CONF_BASE;
    plschr(axis * mm, 1.0);
    plmtex("l", (o.lab_w + 0.6 * o.tick) / axis + 1.5, 0.5, 0.5, c->ylabel);
    plmtex("b", ((o.vertical ? o.lab_w : 1.3 * o.tick) + 0.6 * o.tick) / axis + 1.8, 0.5, 0.5, c->xlabel);
    if (c->colorbar) {
        // the scale: a bar right of the matrix, the share of the true label's examples in %
        double bx0 = o.x0 + o.s + 1.6 * CONF_BASE;
        plvpor(bx0 / side, (bx0 + 1.2 * CONF_BASE) / side, o.y0 / side, (o.y0 + o.s) / side);
        plwind(0, 1, 0, 100);
        // 100 strips of the cell colors (cmap1), not plgradient: PLplot 5.15's cairo driver never
        // destroys the pattern plgradient makes (a leak LeakSanitizer reports in every plot)
        for (int i = 0; i < 100; i++) {
            xs[0] = 0, xs[1] = 1, xs[2] = 1, xs[3] = 0, ys[0] = i, ys[1] = i, ys[2] = i + 1, ys[3] = i + 1;
            plcol1((i + 0.5) / 100.0);
            plfill(4, xs, ys);
        }
        plcol0(COL_FG);
        plwidth(1.0);
        plschr(0.8 * CONF_BASE * mm, 1.0);
        plbox("bc", 0, 0, "bcmtv", 25, 1);
        plmtex("r", 4.4, 0.5, 0.5, "share of the row (%)");
    }
    plvpor(0.0, 1.0, 0.0, 1.0 - o.top / side);
    plschr(o.title * mm, 1.0);
    plcol0(COL_FG);
    plmtex("t", 1.3 * CONF_BASE / o.title, 0.5, 0.5, c->title);
    return true;
}

/* Decodes the PNG at path completely with libpng; the size and the fraction of pixels that are
 * not background white. */
static bool png_check(const char *path, int *w, int *h, double *ink, char *why, size_t cap) {
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&img, path)) {
        snprintf(why, cap, "libpng cannot read it: %s", img.message);
        return false;
    }
    img.format = PNG_FORMAT_RGB;
    unsigned char *buf = malloc(PNG_IMAGE_SIZE(img));
    if (!buf) {
        png_image_free(&img);
        snprintf(why, cap, "out of memory");
        return false;
    }
    if (!png_image_finish_read(&img, NULL, buf, 0, NULL)) {
        snprintf(why, cap, "libpng cannot decode it: %s", img.message);
        free(buf);
        return false;
    }
    size_t n = (size_t)img.width * img.height, dark = 0;
    for (size_t i = 0; i < n; i++)
        dark += buf[3 * i] < 250 || buf[3 * i + 1] < 250 || buf[3 * i + 2] < 250;
    free(buf);
    *w = (int)img.width;
    *h = (int)img.height;
    *ink = n ? (double)dark / (double)n : 0;
    return true;
}

/* Reads a list of numbers at field `key` of the table at idx into a userdata (pushed). */
static double *num_list(lua_State *L, int idx, const char *key, int *n, bool required,
                        const char *ctx) {
    lua_getfield(L, idx, key);
    if (lua_isnil(L, -1)) {
        if (required) luaL_error(L, "gm.plot: %s needs '%s' (a list of numbers)", ctx, key);
        *n = -1;
        return NULL; // the nil stays on the stack
    }
    if (!lua_istable(L, -1)) luaL_error(L, "gm.plot: %s: '%s' must be a list of numbers", ctx, key);
    int len = (int)lua_rawlen(L, -1);
    double *v = lua_newuserdatauv(L, (size_t)(len ? len : 1) * sizeof *v, 0);
    for (int i = 1; i <= len; i++) {
        lua_rawgeti(L, -2, i);
        if (lua_type(L, -1) != LUA_TNUMBER)
            luaL_error(L, "gm.plot: %s: %s[%d] must be a number", ctx, key, i);
        v[i - 1] = (double)lua_tonumber(L, -1);
        lua_pop(L, 1);
    }
    lua_remove(L, -2); // the list table; the userdata stays (anchors v)
    *n = len;
    return v;
}

/* Draws into <file>.tmp with draw(spec) on a w x h page, checks the PNG with libpng, renames it
 * onto file and pushes {file=, width=, height=, ink=}; raises (file removed) on failure. */
static int render_png(lua_State *L, const char *file, int width, int height, bool (*draw)(const void *),
                      const void *spec) {
    // drawn into <file>.tmp, checked, then renamed: a failed or killed plot leaves the previous
    // PNG in place (as gm_write_file_atomic does for tables and results files)
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", file) >= (int)sizeof tmp)
        return luaL_error(L, "gm.plot: file name too long: %s", file);
    // PLplot asks on stdin for another name when it cannot open the file: find out first
    FILE *probe = fopen(tmp, "wb");
    if (!probe) return luaL_error(L, "gm.plot: cannot create %s: %s", tmp, strerror(errno));
    fclose(probe);
    plot_msg[0] = '\0';
    quiet q;
    quiet_on(&q);
    if (!have_device("pngcairo")) {
        quiet_off(&q);
        unlink(tmp);
        return luaL_error(L, "gm.plot: PLplot has no pngcairo device (install the Debian package "
                             "plplot-driver-cairo)");
    }
    jmp_buf jb;
    jmp_buf *prev = plot_jmp;
    plot_jmp = &jb;
    PLINT old_strm = 0, strm = 0;
    volatile bool begun = false, ok = false;
    plgstrm(&old_strm);
    if (setjmp(jb) == 0) {
        plsexit(plot_exit);
        plsabort(plot_abort);
        plmkstrm(&strm);
        begun = true;
        plsdev("pngcairo");
        plsfnam(tmp);
        plspage(0, 0, width, height, 0, 0);
        plscmap0n(16);
        plscol0(COL_BG, 255, 255, 255);
        plscol0(COL_FG, 0, 0, 0);
        plscol0(COL_GRID, 225, 225, 225);
        for (int i = 0; i < 10; i++)
            plscol0(COL_FIRST + i, PALETTE[i][0], PALETTE[i][1], PALETTE[i][2]);
        plinit();
        ok = draw(spec);
        plend1();
        begun = false;
    } else if (begun) {
        // a fatal PLplot error inside the stream: end it as well as it can be ended
        plend1();
    }
    plsstrm(old_strm);
    plsexit(NULL);
    plsabort(NULL);
    plot_jmp = prev;
    quiet_off(&q);
    if (!ok) {
        unlink(tmp);
        return luaL_error(L, "gm.plot: %s: %s", file, plot_msg[0] ? plot_msg : "PLplot failed");
    }
    int w = 0, h = 0;
    double ink = 0;
    char why[256];
    if (!png_check(tmp, &w, &h, &ink, why, sizeof why)) {
        unlink(tmp);
        return luaL_error(L, "gm.plot: %s was written but is not a valid PNG: %s (the previous file, if any, "
                          "is untouched)", file, why);
    }
    if (rename(tmp, file) != 0) {
        int e = errno;
        unlink(tmp);
        return luaL_error(L, "gm.plot: cannot rename %s onto %s: %s", tmp, file, strerror(e));
    }
    lua_createtable(L, 0, 4);
    lua_pushstring(L, file);
    lua_setfield(L, -2, "file");
    lua_pushinteger(L, w);
    lua_setfield(L, -2, "width");
    lua_pushinteger(L, h);
    lua_setfield(L, -2, "height");
    lua_pushnumber(L, ink);
    lua_setfield(L, -2, "ink");
    return 1;
}


/* gm.plot{kind = "confusion", ...} (the header): reads and checks labels and matrix, then draws. */
static int plot_confusion(lua_State *L, const char *file) {
    static const char *const other[] = {"series", "logx", "xticks", "xticklabels", NULL};
    for (int i = 0; other[i]; i++) {
        lua_getfield(L, 1, other[i]);
        if (!lua_isnil(L, -1))
            return luaL_error(L, "gm.plot: '%s' is not an option of kind 'confusion' (it takes labels, matrix, "
                              "title, xlabel, ylabel, colorbar)", other[i]);
        lua_pop(L, 1);
    }
    confusion_spec c = {0};
    c.file = file;
    c.title = gm_bind_opt_str(L, 1, "title", "confusion matrix");
    c.xlabel = gm_bind_opt_str(L, 1, "xlabel", "predicted label");
    c.ylabel = gm_bind_opt_str(L, 1, "ylabel", "true label");
    c.colorbar = gm_bind_opt_bool(L, 1, "colorbar", true);
    lua_getfield(L, 1, "labels");
    if (!lua_istable(L, -1))
        return luaL_error(L, "gm.plot: kind 'confusion' needs 'labels', the list of the class names");
    int labels = lua_gettop(L);
    c.K = (int)lua_rawlen(L, labels);
    if (c.K < 1) return luaL_error(L, "gm.plot: 'labels' is empty: a confusion matrix needs at least one class");
    if (c.K > CONF_MAX_K)
        return luaL_error(L, "gm.plot: 'labels' has %d classes; a confusion matrix is drawn for at most %d", c.K,
                          CONF_MAX_K);
    c.labels = lua_newuserdatauv(L, (size_t)c.K * sizeof *c.labels, 0);
    for (int i = 1; i <= c.K; i++) {
        lua_rawgeti(L, labels, i);
        if (lua_type(L, -1) != LUA_TSTRING)
            return luaL_error(L, "gm.plot: labels[%d] must be a string (a class name), got %s", i,
                              luaL_typename(L, -1));
        c.labels[i - 1] = lua_tostring(L, -1); // anchored by the labels table, which stays on the stack
        lua_pop(L, 1);
    }
    lua_getfield(L, 1, "matrix");
    if (!lua_istable(L, -1))
        return luaL_error(L, "gm.plot: kind 'confusion' needs 'matrix', a list of %d rows of %d counts (row: true "
                          "label, column: predicted)", c.K, c.K);
    int mat = lua_gettop(L);
    int rows = (int)lua_rawlen(L, mat);
    if (rows != c.K)
        return luaL_error(L, "gm.plot: 'matrix' has %d rows but 'labels' names %d classes (the matrix must be K x K, "
                          "one row per true label)", rows, c.K);
    c.m = lua_newuserdatauv(L, (size_t)c.K * (size_t)c.K * sizeof *c.m, 0);
    for (int i = 1; i <= c.K; i++) {
        lua_rawgeti(L, mat, i);
        if (!lua_istable(L, -1))
            return luaL_error(L, "gm.plot: matrix[%d] must be a list of %d counts (one per predicted label), got %s",
                              i, c.K, luaL_typename(L, -1));
        if ((int)lua_rawlen(L, -1) != c.K)
            return luaL_error(L, "gm.plot: matrix[%d] has %d counts but 'labels' names %d classes (the matrix must be "
                              "K x K)", i, (int)lua_rawlen(L, -1), c.K);
        for (int j = 1; j <= c.K; j++) {
            lua_rawgeti(L, -1, j);
            double v = lua_type(L, -1) == LUA_TNUMBER ? (double)lua_tonumber(L, -1) : -1;
            if (lua_type(L, -1) != LUA_TNUMBER || !isfinite(v) || v < 0 || v != floor(v) || v > 9007199254740992.0)
                return luaL_error(L, "gm.plot: matrix[%d][%d] must be a whole number >= 0 (a count of examples), "
                                  "got %s", i, j, luaL_tolstring(L, -1, NULL));
            c.m[(size_t)(i - 1) * c.K + (j - 1)] = v;
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
    }
    gm_bind_check_write_path(L, file, "gm.plot");
    conf_layout o;
    conf_layout_make(&c, &o);
    return render_png(L, file, o.side, o.side, draw_confusion, &c);
}

static int l_plot(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    static const char *const keys[] = {"file",   "title",  "xlabel",      "ylabel", "logx",     "kind",
                                       "series", "xticks", "xticklabels", "labels", "matrix", "colorbar",
                                       NULL};
    gm_bind_check_opts(L, 1, "gm.plot", keys);
    const char *file = gm_bind_opt_str(L, 1, "file", NULL);
    if (!file) return luaL_error(L, "gm.plot: 'file' (a .png path) is required");
    size_t fl = strlen(file);
    if (fl < 5 || strcmp(file + fl - 4, ".png") != 0)
        return luaL_error(L, "gm.plot: file '%s' must end in .png", file);
    const char *kind = gm_bind_opt_str(L, 1, "kind", "lines");
    if (strcmp(kind, "confusion") == 0) return plot_confusion(L, file);
    if (strcmp(kind, "lines") != 0 && strcmp(kind, "points") != 0 && strcmp(kind, "band") != 0)
        return luaL_error(L, "gm.plot: kind '%s' (allowed: lines, points, band, confusion)", kind);
    static const char *const other[] = {"labels", "matrix", "colorbar", NULL};
    for (int i = 0; other[i]; i++) {
        lua_getfield(L, 1, other[i]);
        if (!lua_isnil(L, -1))
            return luaL_error(L, "gm.plot: '%s' belongs to kind 'confusion', not '%s'", other[i], kind);
        lua_pop(L, 1);
    }
    plot_spec p = {0};
    p.file = file;
    p.title = gm_bind_opt_str(L, 1, "title", "");
    p.xlabel = gm_bind_opt_str(L, 1, "xlabel", "");
    p.ylabel = gm_bind_opt_str(L, 1, "ylabel", "");
    p.logx = gm_bind_opt_bool(L, 1, "logx", false);
    p.points = strcmp(kind, "points") == 0;
    p.band = strcmp(kind, "band") == 0;
    p.ticks = num_list(L, 1, "xticks", &p.n_ticks, false, "xticks");
    if (p.n_ticks < 0) p.n_ticks = 0;
    lua_getfield(L, 1, "xticklabels");
    if (!lua_isnil(L, -1)) {
        if (!lua_istable(L, -1) || (int)lua_rawlen(L, -1) != p.n_ticks)
            return luaL_error(L,
                              "gm.plot: 'xticklabels' must be a list of %d strings (one per xtick)",
                              p.n_ticks);
        p.tick_labels =
            lua_newuserdatauv(L, (size_t)(p.n_ticks ? p.n_ticks : 1) * sizeof *p.tick_labels, 0);
        for (int i = 1; i <= p.n_ticks; i++) {
            lua_rawgeti(L, -2, i);
            if (lua_type(L, -1) != LUA_TSTRING)
                return luaL_error(L, "gm.plot: xticklabels[%d] must be a string", i);
            p.tick_labels[i - 1] = lua_tostring(L, -1);
            lua_pop(L, 1);
        }
    }
    lua_getfield(L, 1, "series");
    if (!lua_istable(L, -1))
        return luaL_error(L, "gm.plot: 'series' must be a list of {label=, x=, y=, err=}");
    int series = lua_gettop(L);
    p.n_series = (int)lua_rawlen(L, series);
    if (p.n_series < 1 || p.n_series > PLOT_MAX_SERIES)
        return luaL_error(L, "gm.plot: 1..%d series, got %d", PLOT_MAX_SERIES, p.n_series);
    p.s = lua_newuserdatauv(L, (size_t)p.n_series * sizeof *p.s, 0);
    static const char *const skeys[] = {"label", "x", "y", "err", "color", NULL};
    for (int i = 0; i < p.n_series; i++) {
        luaL_checkstack(L, 8, "gm.plot: too many series");
        lua_rawgeti(L, series, i + 1);
        int st = lua_gettop(L);
        if (!lua_istable(L, st)) return luaL_error(L, "gm.plot: series[%d] must be a table", i + 1);
        gm_bind_check_opts(L, st, "gm.plot series", skeys);
        char ctx[32];
        snprintf(ctx, sizeof ctx, "series[%d]", i + 1);
        plot_series *s = &p.s[i];
        s->label = gm_bind_opt_str(L, st, "label", NULL);
        s->color = (int)gm_bind_opt_int(L, st, "color", i);
        if (s->color < 0) return luaL_error(L, "gm.plot: %s: color must be >= 0", ctx);
        int nx, ny, ne;
        s->x = num_list(L, st, "x", &nx, true, ctx);
        s->y = num_list(L, st, "y", &ny, true, ctx);
        s->err = num_list(L, st, "err", &ne, false, ctx);
        if (nx != ny || (ne >= 0 && ne != ny))
            return luaL_error(L,
                              "gm.plot: %s: x, y (and err) must have the same length (%d, %d, %d)",
                              ctx, nx, ny, ne);
        s->n = nx;
        // series[i] and its x/y/err arrays stay on the stack (anchored) until the plot is done
    }
    gm_bind_check_write_path(L, p.file, "gm.plot");
    return render_png(L, p.file, PLOT_W, PLOT_H, draw_lines, &p);
}

/* ---- registration ----------------------------------------------------------------------------- */

void gm_lua_open_plot(lua_State *L) {
    static const luaL_Reg fns[] = {{"plot", l_plot}, {NULL, NULL}};
    gm_bind_add_functions(L, fns);
}

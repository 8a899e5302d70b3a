/* SPDX-License-Identifier: MIT */
/*
 * tools/bench/ — the benchmarks: `flashattn bench` and `bench-decode`, the in-run peak probe, the
 * naive attention baseline and the SVG chart.
 *
 * svg.c — the two-panel line chart of `flashattn bench` (see svg.h), written by hand: a frame and
 * grid per panel, log2 ticks on x (powers of two), log ticks on y (time: decades, plus 2 and 5
 * when a panel spans few decades; memory: powers of 4, 1 MiB, 4 MiB, ..., 1 GiB), polylines with
 * markers, a legend and notes.
 */
#define _POSIX_C_SOURCE 200809L

#include "svg.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define W 1120.0
#define PANEL_W 440.0
#define PANEL_H 340.0
#define LEFT 90.0
#define GAP 110.0
#define TOP 84.0

static const char *palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
#define NPAL (int)(sizeof palette / sizeof palette[0])

static void text_escaped(FILE *f, const char *s) {
    for (; s && *s; s++) {
        if (*s == '&')
            fputs("&amp;", f);
        else if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else
            fputc(*s, f);
    }
}

static int valid(double v) {
    return isfinite(v) && v > 0.0;
}

static void fmt_x(char *buf, size_t n, double x) {
    if (x >= 1024.0 && fmod(x, 1024.0) == 0.0)
        snprintf(buf, n, "%.0fk", x / 1024.0);
    else
        snprintf(buf, n, "%.0f", x);
}

/* A tick value as text: unit 0 = seconds, 1 = MiB. */
static void fmt_y(char *buf, size_t n, double v, int unit) {
    if (unit == 0) {
        if (v >= 1.0)
            snprintf(buf, n, "%g s", v);
        else if (v >= 1e-3)
            snprintf(buf, n, "%g ms", v * 1e3);
        else
            snprintf(buf, n, "%g us", v * 1e6);
    } else {
        if (v >= 1024.0 * 0.999)
            snprintf(buf, n, "%.4g GiB", v / 1024.0);
        else if (v >= 0.999)
            snprintf(buf, n, "%.4g MiB", v);
        else
            snprintf(buf, n, "%.4g KiB", v * 1024.0);
    }
}

#define L4 0.60205999132796239 /* log10(4) */

typedef struct axis {
    double lo, hi; /* in log units */
} axis;

static double map(const axis *a, double logv, double p0, double p1) {
    return p0 + (logv - a->lo) / (a->hi - a->lo) * (p1 - p0);
}

int svg_write_chart(FILE *f, const svg_chart *c, const svg_series *s, int ns) {
    axis ax = {INFINITY, -INFINITY}, ay[2] = {{INFINITY, -INFINITY}, {INFINITY, -INFINITY}};
    double H, legend_top, y;
    int i, j, p, nnotes = 0, legend_cols = 4, legend_rows;
    char buf[64];

    for (i = 0; i < ns; i++)
        for (j = 0; j < s[i].n; j++) {
            int any = 0;
            for (p = 0; p < 2; p++)
                if (valid(s[i].y[p][j])) {
                    double l = log10(s[i].y[p][j]);
                    ay[p].lo = l < ay[p].lo ? l : ay[p].lo;
                    ay[p].hi = l > ay[p].hi ? l : ay[p].hi;
                    any = 1;
                }
            if (any && s[i].x[j] > 0) {
                double l = log2(s[i].x[j]);
                ax.lo = l < ax.lo ? l : ax.lo;
                ax.hi = l > ax.hi ? l : ax.hi;
            }
        }
    if (!isfinite(ax.lo)) {
        ax.lo = 9;
        ax.hi = 14;
    }
    ax.lo = floor(ax.lo + 1e-9);
    ax.hi = ceil(ax.hi - 1e-9);
    if (ax.hi - ax.lo < 1) {
        ax.lo -= 0.5;
        ax.hi += 0.5;
    }
    for (p = 0; p < 2; p++) {
        if (!isfinite(ay[p].lo)) {
            ay[p].lo = 0;
            ay[p].hi = 1;
        }
        if (c->y_unit[p] == 1) { /* bytes: snap to powers of 4 (1 MiB, 4 MiB, ..., 1 GiB) */
            double lo4 = floor(ay[p].lo / L4 + 1e-9), hi4 = ceil(ay[p].hi / L4 - 1e-9);
            if (hi4 <= lo4)
                hi4 = lo4 + 1;
            ay[p].lo = lo4 * L4;
            ay[p].hi = hi4 * L4;
        } else { /* seconds: snap to decades */
            ay[p].lo = floor(ay[p].lo + 1e-9);
            ay[p].hi = ceil(ay[p].hi - 1e-9);
            if (ay[p].hi - ay[p].lo < 1)
                ay[p].hi = ay[p].lo + 1;
        }
    }
    while (nnotes < 8 && c->notes[nnotes])
        nnotes++;
    legend_rows = (ns + legend_cols - 1) / legend_cols;
    legend_top = TOP + PANEL_H + 62.0;
    H = legend_top + 20.0 * legend_rows + 18.0 * nnotes + 24.0;

    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "viewBox=\"0 0 %.0f %.0f\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" "
            "font-size=\"12\">\n",
            W, H, W, H);
    fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", W, H);
    fprintf(f, "<text x=\"%.0f\" y=\"28\" font-size=\"17\" font-weight=\"bold\" "
               "text-anchor=\"middle\">",
            W / 2);
    text_escaped(f, c->title);
    fprintf(f, "</text>\n");
    if (c->subtitle) {
        fprintf(f, "<text x=\"%.0f\" y=\"50\" font-size=\"12\" fill=\"#444\" "
                   "text-anchor=\"middle\">",
                W / 2);
        text_escaped(f, c->subtitle);
        fprintf(f, "</text>\n");
    }

    for (p = 0; p < 2; p++) {
        const double x0 = LEFT + p * (PANEL_W + GAP), x1 = x0 + PANEL_W;
        const double y0 = TOP + PANEL_H, y1 = TOP; /* y0 = bottom */
        const int few = ay[p].hi - ay[p].lo <= 2.0;
        double e, l;
        fprintf(f, "<g>\n<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                   "fill=\"#fcfcfc\" stroke=\"#333\"/>\n",
                x0, y1, PANEL_W, PANEL_H);
        /* y grid and ticks: decades (+ 2 and 5 when few) for time, powers of 4 (+ 2x) for bytes */
        {
            const int bytes = c->y_unit[p] == 1;
            const double step = bytes ? L4 : 1.0;
            for (e = ay[p].lo; e <= ay[p].hi + 1e-9; e += step) {
                static const double sub10[] = {1, 2, 5}, sub4[] = {1, 2};
                const double *sub = bytes ? sub4 : sub10;
                const int nsub = bytes ? 2 : 3;
                int k;
                for (k = 0; k < nsub; k++) {
                    double v = pow(10.0, e) * sub[k], py;
                    l = log10(v);
                    if (l > ay[p].hi + 1e-9)
                        break;
                    py = map(&ay[p], l, y0, y1);
                    fprintf(f,
                            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>\n",
                            x0, py, x1, py, k == 0 ? "#d0d0d0" : "#ececec");
                    if (k == 0 || (few && !bytes)) {
                        fmt_y(buf, sizeof buf, v, c->y_unit[p]);
                        fprintf(f,
                                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" "
                                "fill=\"%s\">%s</text>\n",
                                x0 - 6, py + 4, k == 0 ? "#222" : "#777", buf);
                    }
                }
            }
        }
        /* x grid and ticks: powers of two */
        for (l = ceil(ax.lo); l <= ax.hi + 1e-9; l += 1.0) {
            double px = map(&ax, l, x0, x1);
            fmt_x(buf, sizeof buf, pow(2.0, l));
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e0e0e0\"/>\n",
                    px, y0, px, y1);
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", px,
                    y0 + 17, buf);
        }
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", (x0 + x1) / 2, y0 + 36);
        text_escaped(f, c->x_label);
        fprintf(f, "</text>\n");
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-weight=\"bold\">",
                (x0 + x1) / 2, y1 - 8);
        text_escaped(f, c->y_label[p]);
        fprintf(f, "</text>\n");
        /* series */
        for (i = 0; i < ns; i++) {
            const char *col = palette[s[i].color % NPAL];
            int open = 0;
            for (j = 0; j < s[i].n; j++) {
                double v = s[i].y[p][j];
                if (!valid(v) || !(s[i].x[j] > 0)) {
                    if (open)
                        fprintf(f, "\"/>\n");
                    open = 0;
                    continue;
                }
                if (!open)
                    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s "
                               "points=\"",
                            col, s[i].dashed ? " stroke-dasharray=\"7 4\"" : "");
                fprintf(f, "%s%.1f,%.1f", open ? " " : "", map(&ax, log2(s[i].x[j]), x0, x1),
                        map(&ay[p], log10(v), y0, y1));
                open = 1;
            }
            if (open)
                fprintf(f, "\"/>\n");
            for (j = 0; j < s[i].n; j++) {
                double v = s[i].y[p][j];
                if (!valid(v) || !(s[i].x[j] > 0))
                    continue;
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\" stroke=\"%s\" "
                           "stroke-width=\"1.5\"/>\n",
                        map(&ax, log2(s[i].x[j]), x0, x1), map(&ay[p], log10(v), y0, y1),
                        s[i].dashed ? "white" : col, col);
            }
        }
        fprintf(f, "</g>\n");
    }

    /* legend */
    for (i = 0; i < ns; i++) {
        const double colw = (W - 2 * LEFT) / legend_cols;
        const double lx = LEFT + (i % legend_cols) * colw, ly = legend_top + 20.0 * (i / legend_cols);
        const char *col = palette[s[i].color % NPAL];
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                   "stroke-width=\"2\"%s/>\n",
                lx, ly - 4, lx + 34, ly - 4, col, s[i].dashed ? " stroke-dasharray=\"7 4\"" : "");
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\" stroke=\"%s\" "
                   "stroke-width=\"1.5\"/>\n",
                lx + 17, ly - 4, s[i].dashed ? "white" : col, col);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">", lx + 42, ly);
        text_escaped(f, s[i].label);
        fprintf(f, "</text>\n");
    }
    y = legend_top + 20.0 * legend_rows + 8.0;
    for (i = 0; i < nnotes; i++, y += 18.0) {
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#444\">", LEFT, y);
        text_escaped(f, c->notes[i]);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "</svg>\n");
    return ferror(f) ? -1 : 0;
}

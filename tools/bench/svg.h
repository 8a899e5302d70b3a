/* SPDX-License-Identifier: MIT */
/*
 * tools/bench/ — the benchmarks: `flashattn bench` and `bench-decode`, the in-run peak probe, the
 * naive attention baseline and the SVG chart.
 *
 * svg.h — a small, dependency-free SVG line chart for `flashattn bench`: two panels side by side
 * (time and peak memory) against sequence length, x on a log2 axis, y on log10 axes, one line per
 * series with point markers, and a legend. Missing points (NaN or <= 0) break a line.
 */
#ifndef FA_TOOLS_SVG_H
#define FA_TOOLS_SVG_H

#include <stdio.h>

typedef struct svg_series {
    const char *label; /* legend text */
    int color;         /* palette index: series sharing a configuration share a color */
    int dashed;        /* 1 = dashed line and hollow markers (the naive baseline) */
    int n;
    const double *x;     /* sequence lengths, increasing */
    const double *y[2];  /* panel 0 and panel 1 values; NaN or <= 0 = missing */
} svg_series;

typedef struct svg_chart {
    const char *title;
    const char *subtitle;     /* may be NULL */
    const char *x_label;      /* e.g. "sequence length (Sq = Sk)" */
    const char *y_label[2];   /* e.g. "time per call (s, median)", "peak memory (MiB)" */
    int y_unit[2];            /* 0 = seconds, 1 = MiB: tick labels like "10 ms" or "1 GiB" */
    const char *notes[8];     /* extra lines under the legend; NULL-terminated */
} svg_chart;

/* Writes the chart to f. Returns 0, or -1 on a write error. */
int svg_write_chart(FILE *f, const svg_chart *c, const svg_series *s, int ns);

#endif /* FA_TOOLS_SVG_H */

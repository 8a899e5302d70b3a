/* SPDX-License-Identifier: MIT */
/*
 * dropout.c — fa_dropout_mask: the keep/drop mask that the forward and backward draw from
 * philox.h, written out so tests and users can build references.
 */
#include "internal.h"
#include "philox.h"
#include "plugin.h"
#include "problem.h"
#include "validate.h"

fa_status fa_dropout_mask(const fa_params *params, const fa_tensor *mask) {
    fa__clear_error();
    fa__problem p = {.D = 1};
    fa__span span;
    fa_status st = fa__resolve_params(params, &p);
    if (st == FA_OK) st = fa__check_view(mask, "mask", 4, "(B, H, Sq, Sk)", 1, &span);
    if (st != FA_OK) return st;
    if (mask->dtype != FA_DTYPE_U8)
        return fa__error(FA_ERR_DTYPE, "mask: dtype is %s; expected u8",
                         fa__dtype_name(mask->dtype));
    const int64_t B = mask->shape[0], H = mask->shape[1], Sq = mask->shape[2], Sk = mask->shape[3];
    const int64_t *st4 = mask->stride;
    if (mask->device == FA_DEVICE_CUDA) {
        const fa__plugin_api *api;
        if ((st = fa__plugin_device("mask", mask->device_index, &api))) return st;
        p.B = B;
        p.H = H;
        p.Sq = Sq;
        p.Sk = Sk;
        p.out = (fa__view){.data = mask->data, .dtype = FA_DTYPE_U8, .sb = st4[0], .sh = st4[1],
                           .ss = st4[2], .sd = st4[3]};
        char msg[512] = "";
        return fa__plugin_status(api->dropout_mask(&p, mask->device_index,
                                                   fa__params_stream(params), msg, sizeof msg),
                                 msg);
    }
    uint8_t *out = mask->data;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Sq; i++) {
                uint8_t *row = out + b * st4[0] + h * st4[1] + i * st4[2]; // row: [Sk]
                for (int64_t j = 0; j < Sk; j += 4) {
                    const fa__philox4 w = fa__dropout_words(p.dropout_seed, p.dropout_offset,
                                                            (uint32_t)(b * H + h), (uint32_t)i,
                                                            (uint32_t)(j >> 2));
                    for (int lane = 0; lane < 4 && j + lane < Sk; lane++)
                        row[(j + lane) * st4[3]] = w.v[lane] >= p.dropout_threshold;
                }
            }
    return FA_OK;
}

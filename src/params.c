/* SPDX-License-Identifier: MIT */
/*
 * params.c — fa_params_init: the defaults every entry point starts from (validate.c resolves a
 * NULL params into them; callers fill a struct with it before setting fields).
 */
#include "internal.h"

void fa_params_init(fa_params *params) {
    if (!params) return;
    *params = (fa_params){
        .struct_size = sizeof *params,
        .softmax_scale = 0.0f,
        .window_left = -1,
        .window_right = -1,
    };
}

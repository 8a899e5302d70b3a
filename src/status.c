/* SPDX-License-Identifier: MIT */
/*
 * status.c — status codes to names and text (from the one FA_STATUS_MAP list) and the
 * per-thread last-error message.
 */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_message[1024];

const char *fa_status_name(fa_status status) {
    switch (status) {
#define FA_STATUS_NAME_(name, value, text)                                                         \
    case FA_##name:                                                                                \
        return "FA_" #name;
        FA_STATUS_MAP(FA_STATUS_NAME_)
#undef FA_STATUS_NAME_
    }
    return "FA_ERR_UNKNOWN";
}

const char *fa_strerror(fa_status status) {
    switch (status) {
#define FA_STATUS_TEXT_(name, value, text)                                                         \
    case FA_##name:                                                                                \
        return text;
        FA_STATUS_MAP(FA_STATUS_TEXT_)
#undef FA_STATUS_TEXT_
    }
    return "unknown status code";
}

const char *fa_last_error_message(void) { return last_message; }

void fa__clear_error(void) { last_message[0] = '\0'; }

fa_status fa__error(fa_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_message, sizeof last_message, fmt, ap);
    va_end(ap);
    return status;
}

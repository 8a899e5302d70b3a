/* SPDX-License-Identifier: MIT */
/*
 * plugin.h — the core's side of the CUDA plug-in: loading it (once, on first use) and turning
 * its answers into fa_status plus the last-error message.
 */
#ifndef FA_PLUGIN_H
#define FA_PLUGIN_H

#include "internal.h"
#include "plugin_abi.h"

#include <stddef.h>

/* The loaded plug-in's table when CUDA device `index` can be used: the plug-in loads, the driver
 * works and index < the device count. Otherwise FA_ERR_DEVICE with a message saying where the
 * plug-in was looked for and why it failed, prefixed "<who>: is on CUDA device <index>, but "
 * when who is not NULL. */
fa_status fa__plugin_device(const char *who, int32_t index, const fa__plugin_api **api);

/* Records a plug-in function's message when status is an error; returns status. */
fa_status fa__plugin_status(int status, const char *msg);

/* A host copy of CUDA tensor t (checked by fa__check_view; `name` for messages): every element
 * from the first to the last the view reaches, at the offsets of t's strides, so host code
 * indexes it as it would t->data. Complete on return (the copy is ordered on stream and waited
 * for). *host: freed by the caller with free(). */
fa_status fa__plugin_download(const fa__plugin_api *api, const fa_tensor *t, const char *name,
                              void *stream, void **host);

/* "cuda: plug-in <path> (<build>), N devices" or "cuda: plug-in not loaded (<why>)", for
 * fa_build_info; loads the plug-in if that has not been tried yet. */
const char *fa__plugin_summary(char *buf, size_t cap);

#endif /* FA_PLUGIN_H */

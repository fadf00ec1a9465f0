/*
 * gm_status.c - status names, error message helpers and the assertion hook.
 */
#include "gm_status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *gm_status_name(gm_status s) {
    switch (s) {
    case GM_OK: return "ok";
    case GM_ERR_IO: return "io";
    case GM_ERR_FORMAT: return "format";
    case GM_ERR_UNSUPPORTED: return "unsupported";
    case GM_ERR_INVALID: return "invalid";
    case GM_ERR_NOMEM: return "out-of-memory";
    case GM_ERR_DEVICE: return "device";
    case GM_ERR_NONFINITE: return "non-finite";
    case GM_ERR_INTERRUPTED: return "interrupted";
    case GM_ERR_LIMIT: return "limit";
    case GM_ERR_NOT_FOUND: return "not-found";
    case GM_ERR_RUNTIME: return "runtime";
    }
    return "unknown";
}

gm_status gm_error_set(gm_error *err, gm_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

void gm_error_prefix(gm_error *err, const char *fmt, ...) {
    if (!err) return;
    char prefix[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* shift the old message right by the prefix (truncating its end if it no longer fits) */
    size_t pl = strlen(prefix), cap = sizeof err->msg;
    if (pl + 2 >= cap) pl = cap - 3;
    size_t ol = strnlen(err->msg, cap - 1);
    if (pl + 2 + ol >= cap) ol = cap - 1 - pl - 2;
    memmove(err->msg + pl + 2, err->msg, ol);
    memcpy(err->msg, prefix, pl);
    err->msg[pl] = ':';
    err->msg[pl + 1] = ' ';
    err->msg[pl + 2 + ol] = '\0';
}

void gm_error_clear(gm_error *err) {
    if (!err) return;
    err->code = GM_OK;
    err->msg[0] = '\0';
}

static void default_abort(const char *file, int line, const char *expr) {
    fprintf(stderr, "gemmarun: internal error at %s:%d: assertion '%s' failed\n"
                    "  hint: this is a bug in gemmarun, please report it with the command you ran\n",
            file, line, expr);
    abort();
}

static gm_abort_fn abort_hook = default_abort;

gm_abort_fn gm_set_abort_hook(gm_abort_fn fn) {
    gm_abort_fn old = abort_hook;
    abort_hook = fn ? fn : default_abort;
    return old;
}

void gm_assert_fail(const char *file, int line, const char *expr) {
    abort_hook(file, line, expr);
}

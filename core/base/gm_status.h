/*
 * gm_status.h - status codes, error messages and assertions for all of gemmarun.
 *
 * Three tiers of failure (style guide §4.4):
 *   - Bugs (violated preconditions inside the core): GM_ASSERT prints file:line and calls the
 *     abort hook (default abort()). Tests may install a hook that records instead.
 *   - Runtime failures (a missing file, a malformed GGUF, a bad config value): the function
 *     returns a negative gm_status and writes a human message into the caller's gm_error.
 *     The message names the file/object, says what was wrong and, where useful, ends with a
 *     "hint:" telling the user what to do.
 *   - Script-facing errors: only lua/ turns a gm_status into a Lua error.
 *
 * Ownership: gm_error is a plain caller-owned struct; nothing here allocates.
 * Errors: gm_error_set never fails; a NULL gm_error pointer is allowed (message dropped).
 * No exit() anywhere outside main().
 */
#ifndef GM_STATUS_H
#define GM_STATUS_H

#include <stdarg.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gm_status {
    GM_OK = 0,
    GM_ERR_IO = -1,          /* file missing, unreadable, write failed */
    GM_ERR_FORMAT = -2,      /* malformed or truncated file */
    GM_ERR_UNSUPPORTED = -3, /* well-formed but not supported (unknown quant type, arch) */
    GM_ERR_INVALID = -4,     /* bad argument, bad config value, shape mismatch */
    GM_ERR_NOMEM = -5,       /* allocation failed */
    GM_ERR_DEVICE = -6,      /* CUDA or other device error */
    GM_ERR_NONFINITE = -7,   /* NaN/Inf in a loss or gradient */
    GM_ERR_INTERRUPTED = -8, /* the user pressed Ctrl-C */
    GM_ERR_LIMIT = -9,       /* a planned size exceeds a configured limit */
    GM_ERR_NOT_FOUND = -10,  /* a key, tensor or file that must exist does not */
    GM_ERR_RUNTIME = -11,    /* a script raised an error while running (not a usage error) */
} gm_status;

/* Message buffer filled by failing functions. `code` repeats the returned status. */
typedef struct gm_error {
    gm_status code;
    char msg[1536];
} gm_error;

/* Short stable name of a status ("io", "format", ...). Never NULL. */
const char *gm_status_name(gm_status s);

/* Records `code` and a printf-style message in `err` (if not NULL) and returns `code`,
 * so callers write `return gm_error_set(err, GM_ERR_FORMAT, "%s: ...", path);`. */
gm_status gm_error_set(gm_error *err, gm_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepends "prefix: " to an existing message (used to add context such as a file name). */
void gm_error_prefix(gm_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Clears an error to GM_OK / empty message. */
void gm_error_clear(gm_error *err);

/* ---- assertions (bugs only) ---- */
typedef void (*gm_abort_fn)(const char *file, int line, const char *expr);

/* Installs a replacement for the default abort (prints and calls abort()). Returns the old one. */
gm_abort_fn gm_set_abort_hook(gm_abort_fn fn);

void gm_assert_fail(const char *file, int line, const char *expr);

#define GM_ASSERT(cond)                                                                      \
    do {                                                                                     \
        if (!(cond)) gm_assert_fail(__FILE__, __LINE__, #cond);                              \
    } while (0)

/* Propagate a failing status: `GM_TRY(f(...));` */
#define GM_TRY(expr)                                                                         \
    do {                                                                                     \
        gm_status gm_try_s_ = (expr);                                                        \
        if (gm_try_s_ != GM_OK) return gm_try_s_;                                            \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif /* GM_STATUS_H */

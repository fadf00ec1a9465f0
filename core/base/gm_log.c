/*
 * gm_log.c - default stderr sink and level filter.
 */
#include "gm_log.h"

#include <stdarg.h>
#include <stdio.h>

static void default_sink(gm_log_level level, const char *msg, void *user) {
    (void)user;
    static const char *names[] = {"debug", "info", "warning", "error"};
    fprintf(stderr, "gemmarun: %s: %s\n", names[level], msg);
}

static gm_log_sink sink = default_sink;
static void *sink_user;
static gm_log_level min_level = GM_LOG_INFO;

void gm_log_set_sink(gm_log_sink s, void *user) {
    sink = s ? s : default_sink;
    sink_user = user;
}

void gm_log_set_level(gm_log_level l) { min_level = l; }

void gm_log(gm_log_level level, const char *fmt, ...) {
    if (level < min_level) return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    sink(level, buf, sink_user);
}

/*
 * gm_log.h - leveled logging through a replaceable sink.
 *
 * Default sink writes to stderr as "gemmarun: <level>: message". The command-line program may
 * install its own sink (e.g. to keep a TTY progress line intact).
 *
 * Ownership: messages are formatted into a stack buffer; nothing is retained.
 */
#ifndef GM_LOG_H
#define GM_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gm_log_level { GM_LOG_DEBUG = 0, GM_LOG_INFO, GM_LOG_WARN, GM_LOG_ERROR } gm_log_level;

typedef void (*gm_log_sink)(gm_log_level level, const char *msg, void *user);

void gm_log_set_sink(gm_log_sink sink, void *user);
void gm_log_set_level(gm_log_level min_level);
void gm_log(gm_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define GM_INFO(...) gm_log(GM_LOG_INFO, __VA_ARGS__)
#define GM_WARN(...) gm_log(GM_LOG_WARN, __VA_ARGS__)
#define GM_DEBUG(...) gm_log(GM_LOG_DEBUG, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif /* GM_LOG_H */

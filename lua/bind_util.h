/*
 * bind_util.h - helpers shared by the Lua bindings (internal to lua/): option tables with strict
 * key checking, raising core errors, and the model userdata type.
 *
 * Every binding checks all its arguments first (these helpers raise Lua errors naming the
 * function, the option and the allowed values), calls the core, releases what it acquired on
 * failure and only then raises (style guide §4.8).
 */
#ifndef GM_BIND_UTIL_H
#define GM_BIND_UTIL_H

#include "gm_decoder.h"
#include "gm_model.h"
#include "gm_status.h"

#include <lauxlib.h>
#include <lua.h>
#include <stdbool.h>
#include <stdint.h>

#define GM_MODEL_MT "gm.Model"

/* The gm.Model userdata: a loaded model and, once generation was used, an inference state. */
typedef struct lmodel {
    gm_model *m;
    gm_infer *st;             /* generation state, planned for st_ctx positions and adapter ad */
    int64_t st_ctx;
    int n_threads;
    struct gm_backend *be;    /* the backend generation and training run on: CPU (created with st) or,
                                 for device "cuda", the CUDA backend opened by load_model */
    char device[16];          /* "cpu", "cuda", "cuda:N" (gm_backend_open) */
    struct gm_adapter *ad;    /* the adapter of the last generate{adapter = ...}, or NULL */
    char ad_key[1300];        /* its "path|trial" */
    struct gm_mm_hard *hard;  /* Gemma 3n's hard multimodal tokens' tables, loaded at the first
                                 m:logits that needs them (gm_mm_hard_load: ~1 s for E2B), or NULL */
} lmodel;

/* The open model at stack index idx (raises if it is not a model or was closed). */
lmodel *gm_bind_check_model(lua_State *L, int idx);

/* The open trainer (gm.Trainer userdata, lua/bind_train.c) at stack index idx; raises if it is
 * not a trainer or was closed. Borrowed: valid while the userdata is alive and open. */
struct gm_trainer *gm_bind_check_trainer(lua_State *L, int idx);

struct gm_train_opts;
/* Reads the option table at idx into o: the schema's options (core/train/gm_train_opts.def, its
 * defaults for the missing ones), seed, steps (the schedule's length; warmup is resolved against
 * it) and threads (def_threads when absent). `fn` prefixes messages ("trainer", "plan"). Raises
 * on an unknown key (with a "did you mean"), a wrong type or a value out of range, with the
 * schema's message. lua/bind_train.c. */
void gm_bind_read_train_opts(lua_State *L, int idx, const char *fn, struct gm_train_opts *o, int def_threads);

/* Raises a Lua error carrying the core's message. Never returns. */
int gm_bind_raise(lua_State *L, const gm_error *err);

/* Raises a usage error (bad input in the file, exit code 2, like a sandbox refusal in gm_lua.c):
 * the object {usage = true, msg = "file:line: <formatted>"}, the position being the Lua code
 * that called the binding. printf-style like lua_pushfstring (%s %d %f %p %c %U %%). Never
 * returns. */
int gm_bind_usage_error(lua_State *L, const char *fmt, ...);

/* Raises unless every key of the option table at idx is in `allowed` (NULL-terminated). */
void gm_bind_check_opts(lua_State *L, int idx, const char *fn, const char *const *allowed);

/* Typed option lookups with defaults; a present value of the wrong type raises. */
/* Pushes a table of the config's fields under their Hugging Face names (arch, name, vocab_size,
 * hidden_size, num_hidden_layers, ..., rms_norm_eps, n_params): model:config() and
 * gm.model_config() (bind_model.c). */
struct gm_config;
void gm_bind_push_config(lua_State *L, const struct gm_config *c);

lua_Integer gm_bind_opt_int(lua_State *L, int idx, const char *key, lua_Integer def);
lua_Number gm_bind_opt_num(lua_State *L, int idx, const char *key, lua_Number def);
bool gm_bind_opt_bool(lua_State *L, int idx, const char *key, bool def);
/* String option; returns def when absent. The pointer is valid while the table is on the stack. */
const char *gm_bind_opt_str(lua_State *L, int idx, const char *key, const char *def);

/* Adds the functions of `fns` (NULL-terminated) to the global table `gm`, which
 * gm_lua_open_model creates (called first by gm_lua_new). */
void gm_bind_add_functions(lua_State *L, const luaL_Reg *fns);

#endif /* GM_BIND_UTIL_H */

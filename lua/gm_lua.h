/*
 * gm_lua.h - the embedded Lua 5.4 interpreter that runs experiment files.
 *
 * gm_lua_new creates a state whose global environment is an allow-list: base functions
 * (without dofile/loadfile; `load` accepts text chunks only), string, table, math, utf8, and an
 * `os` reduced to clock/time/date/getenv. io, package/require, os.execute, io.popen, file
 * writes and binary chunks are absent unless allow_os is set (`--allow-os`). On top come the
 * gemmarun bindings (lua/bind_*.c) and the embedded prelude (lua/prelude.lua), which defines
 * env(), experiment{} and friends.
 *
 * Two environments: the prelude, the runner and the report (and chunks run with
 * gm_lua_run_string) use the state's global table; experiment files (gm_lua_run_file,
 * gm_lua_run_experiment) run in a fresh table of their own made by the prelude (M.file_env):
 * the API, the allowed base functions and copies of the library tables, so that nothing a file
 * assigns reaches the code that validates and runs it.
 *
 * Ownership: the caller owns the lua_State and closes it with gm_lua_close. Userdata created by
 * the bindings (loaded models) are released by their __gc/__close when the state closes.
 * Errors: gm_lua_run_* return GM_ERR_INVALID with the Lua error message and traceback in err
 * (file:line: message), never longjmp out to C callers, never exit(). An error raised while an
 * experiment file's top level runs (gm_lua_run_file, gm_lua_run_experiment) is the user's to
 * fix: GM_ERR_INVALID with one line naming file:line (the traceback only when opts.verbose),
 * as are the limits: more than max_instructions at the top level, or a Lua heap above
 * max_memory (that one anywhere, GM_ERR_INVALID inside the file and GM_ERR_NOMEM elsewhere).
 */
#ifndef GM_LUA_H
#define GM_LUA_H

#include "gm_status.h"

#include <lua.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gm_lua_opts {
    bool allow_os;   /* open the full io and os libraries */
    int n_threads;   /* threads for kernels started from Lua (models, generation) */
    bool verbose;    /* errors in an experiment file come with their Lua traceback */
    /* Limits on experiment code (0: the default). An experiment file is code: these end an
     * endless loop or an endless allocation with a clear error instead of a hang or swapping. */
    long long max_instructions; /* Lua VM instructions the file's top level may run
                                   (GM_LUA_MAX_INSTRUCTIONS); < 0: unlimited */
    long long max_memory;       /* bytes the whole Lua heap may hold (GM_LUA_MAX_MEMORY); < 0:
                                   unlimited */
} gm_lua_opts;

#define GM_LUA_MAX_INSTRUCTIONS 250000000LL /* ~1-2 s of Lua on one core */
#define GM_LUA_MAX_MEMORY (1LL << 30)        /* 1 GiB */

/* Creates a sandboxed state with the bindings and the prelude loaded. */
gm_status gm_lua_new(const gm_lua_opts *opts, lua_State **out, gm_error *err);
void gm_lua_close(lua_State *L);

/* Runs an experiment file in its own environment (above); `args` (may be NULL) becomes its
 * global table `arg` (arg[0] = path, then 1-based). The file's return values are left on the
 * stack (nresults = LUA_MULTRET). */
gm_status gm_lua_run_file(lua_State *L, const char *path, const char *const *args, int nargs,
                          gm_error *err);

/* Runs experiment source held in memory as gm_lua_run_file runs a file (no `arg`); `name`
 * appears in messages ("@experiments/quickstart.lua"). */
gm_status gm_lua_run_experiment(lua_State *L, const char *src, size_t len, const char *name,
                                gm_error *err);

/* Runs a chunk of trusted Lua source held in memory in the global table (the prelude, the
 * `gemmarun table` driver, tests); `name` appears in messages ("=quickstart"). */
gm_status gm_lua_run_string(lua_State *L, const char *src, size_t len, const char *name,
                            gm_error *err);

/* Calls the function below nargs arguments on the stack (protected, with tracebacks and the
 * usage/runtime distinction of the other run functions); leaves nres results. */
gm_status gm_lua_call(lua_State *L, int nargs, int nres, gm_error *err);

/* Registers the bindings of lua/bind_model.c into table `gm` (called by gm_lua_new). */
void gm_lua_open_model(lua_State *L);
/* Registers lua/bind_train.c (data sets, trainers); needs gm_lua_open_model first. */
void gm_lua_open_train(lua_State *L);
/* Registers lua/bind_run.c (data files, hashing, plans, progress, Ctrl-C). */
void gm_lua_open_run(lua_State *L);
/* Registers lua/bind_proc.c (gm.file_lock, gm.file_unlock, gm.file_locked). */
void gm_lua_open_proc(lua_State *L);
/* spawn({program, arg, ...}) -> exit_code, stdout, stderr (lua/bind_proc.c): runs a program and
 * waits for it. Not registered in gm (experiment files must not run programs): lua/main.c hands it
 * to `gemmarun submit` alone. */
int gm_lua_spawn(lua_State *L);
/* Registers lua/bind_json.c (gm.json_encode, gm.json_decode, gm.null); needs gm_lua_open_model
 * first. */
void gm_lua_open_json(lua_State *L);
/* Marks the run as interrupted (called from main's SIGINT handler; async-signal-safe). */
void gm_lua_set_interrupted(void);
/* The flag itself (nonzero after Ctrl-C): long operations (generation) poll it. */
extern volatile int gm_lua_interrupted;

/* Registers lua/bind_dist.c (gm.dist_info, dist_any, dist_same, dist_bcast, dist_barrier). */
void gm_lua_open_dist(lua_State *L);
/* The data-parallel world (core/dist/gm_dist.h) the runner and its trainers use: main's, borrowed
 * (must outlive every Lua state); NULL (the default): one process. */
struct gm_dist;
void gm_lua_set_dist(struct gm_dist *d);
struct gm_dist *gm_lua_dist(void);

/* Registers lua/bind_results.c (results files, gm.write_text); called by gm_lua_new. */
void gm_lua_open_results(lua_State *L);
/* Registers lua/bind_plot.c (gm.plot); called by gm_lua_new. */
void gm_lua_open_plot(lua_State *L);
/* Registers lua/bind_stats.c (gm.t95, gm.bootstrap_mean, gm.paired_bootstrap); gm_lua_new. */
void gm_lua_open_stats(lua_State *L);
/* The results folder (lua/write_rule.c): the only place gm.results, gm.results_merge,
 * gm.write_text, gm.plot and trainer:save write to (a relative root is taken from the working
 * folder when a path is checked). Default "results". Paths with a ".." component are always
 * refused. */
void gm_lua_set_results_root(lua_State *L, const char *root);

/* Lets model:save_adapter write `path` (and nothing else outside the results folder): the OUT
 * of `gemmarun export`, which the user named on the command line. Kept in the registry, out of
 * reach of Lua code. */
void gm_lua_allow_export_path(lua_State *L, const char *path);

/* The embedded sources (generated by lua/embed.cmake): every Lua module of lua/ by name, and the
 * default experiment. */
typedef struct gm_embedded {
    const char *name;
    const unsigned char *data;
    unsigned long len;
} gm_embedded;
extern const gm_embedded gm_embedded_modules[];
extern const unsigned char *const gm_embedded_quickstart;
extern const unsigned long gm_embedded_quickstart_len;

/* The embedded module `name` (NULL if there is none). */
const gm_embedded *gm_lua_module(const char *name);

#ifdef __cplusplus
}
#endif
#endif /* GM_LUA_H */

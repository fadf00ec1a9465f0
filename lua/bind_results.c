/*
 * bind_results.c - Lua bindings for trial results files, text output and plots: the only way an
 * experiment file (or the runner, lua/prelude.lua) writes to the disk.
 *
 *   gm.results(path)                 -> results (opens or creates results/<exp>/trial-<id>.h5)
 *     r:set{experiment=, trial_id=, trial_index=, n_trials=, status=, reason=, config_json=,
 *           report_json=, swept_json=, started_at=, finished_at=, wall_seconds=}
 *           (*_json: JSON text, stored as given, or a Lua table, encoded with sorted keys)
 *     r:set_config{field = string|number|boolean, ...}   (nested tables: "a.b" keys; lists: JSON
 *           text); also stores config_json unless r:set gave one
 *     r:append{name = number, ...}   one logged row (series missing from it get NaN)
 *     r:set_eval(phase, {accuracy=, loss=, n_examples=, labels={..}, per_class={..},
 *           confusion={{..},..}, <other name> = number, ...})   (replaces the phase)
 *     r:set_memory{planned={[kind]=bytes}, measured={[kind]=bytes}, measured_peak_rss=bytes}
 *     r:set_data{n_train=, n_test=, n_rejected=, n_truncated=, rejections={{example=, reason=}}}
 *     r:put_adapter(trainer)         the trainer's LoRA weights under /adapter/<PEFT key>
 *     r:truncate(rows), r:rows(), r:resumed(), r:path(), r:save(), r:close()
 *   gm.results_read(path)            -> trial table | nil, "no such file"
 *   gm.results_read_all(path)        -> {trial, ...} from a folder, a trial file or a merged file
 *   gm.results_list(dir)             -> {path, ...} (trial-*.h5, sorted; {} if dir is missing)
 *   gm.results_merge(dir, out [, {adapters = false}])
 *   gm.write_text(path, text)        written atomically (tmp + rename)
 *   gm.plot{file=, title=, xlabel=, ylabel=, logx=, kind="lines"|"points", xticks={..},
 *           xticklabels={..}, series={{label=, x={..}, y={..}, err={..}, color=}, ..}}
 *                                    -> {file=, width=, height=} (PNG 1024x640, PLplot pngcairo)
 *
 * Path rule (the sandbox's only write permission): every path written here must lie inside the
 * results folder, set by gm_lua_set_results_root (default "results" under the working folder
 * at the time of the check). A path with a ".." component is refused outright; a relative path
 * is taken from the working folder; the comparison is lexical (a symlink inside the results
 * folder is followed like any other path). Missing folders between the results folder and the
 * file are created. Reading is not restricted (experiment files read their data anyway).
 *
 * Plots: PLplot prints to stdout/stderr and calls exit() on fatal errors, so every PLplot call
 * runs with fds 1 and 2 pointed at /dev/null and with an exit handler that longjmps back here;
 * the device is looked up first (an absent pngcairo driver would make PLplot prompt on stdin).
 * The written PNG is decoded again with libpng, so a returned plot is a complete, valid image.
 *
 * JSON: tables given for JSON attributes are encoded by lua/bind_json.h with empty tables as []
 * (the fields that may be empty hold lists). Read back, a JSON attribute that holds null
 * (swept_json of an experiment without a sweep) is a missing field (nil); nulls inside a value
 * are gm.null.
 */
#define _GNU_SOURCE
#include "bind_json.h"
#include "bind_util.h"
#include "gm_lua.h"

#include "gm_alloc.h"
#include "gm_results.h"
#include "gm_train.h"

#include <errno.h>
#include <fcntl.h>
#include <lauxlib.h>
#include <limits.h>
#include <math.h>
#include <plplot.h>
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define RESULTS_MT "gm.Results"
#define ROOT_KEY "gm.results_root"

typedef struct lresults {
    gm_results *r;
    bool config_json_given; // r:set{config_json=} was used: set_config leaves it alone
} lresults;

/* ---- the path rule ---------------------------------------------------------------------- */

/* Lexically normalized absolute path (collapses "//" and "/./", drops a trailing '/') into a
 * Lua string on the stack. Assumes no ".." component (checked before). */
static const char *push_abs(lua_State *L, const char *path) {
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    if (path[0] != '/') {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd))
            luaL_error(L, "cannot read the working folder: %s", strerror(errno));
        luaL_addstring(&b, cwd);
    }
    const char *p = path;
    while (*p) {
        while (*p == '/') p++;
        const char *q = p;
        while (*q && *q != '/') q++;
        size_t n = (size_t)(q - p);
        if (n > 0 && !(n == 1 && p[0] == '.')) {
            luaL_addchar(&b, '/');
            luaL_addlstring(&b, p, n);
        }
        p = q;
    }
    luaL_pushresult(&b);
    if (lua_rawlen(L, -1) == 0) {
        lua_pop(L, 1);
        lua_pushliteral(L, "/");
    }
    return lua_tostring(L, -1);
}

static bool has_dotdot(const char *path) {
    for (const char *p = path; *p;) {
        const char *q = p;
        while (*q && *q != '/') q++;
        if (q - p == 2 && p[0] == '.' && p[1] == '.') return true;
        p = *q ? q + 1 : q;
    }
    return false;
}

void gm_lua_set_results_root(lua_State *L, const char *root) {
    lua_pushstring(L, root && root[0] ? root : "results");
    lua_setfield(L, LUA_REGISTRYINDEX, ROOT_KEY);
}

/* The absolute results folder (pushed). */
static const char *push_root(lua_State *L) {
    lua_getfield(L, LUA_REGISTRYINDEX, ROOT_KEY);
    const char *root = lua_isstring(L, -1) ? lua_tostring(L, -1) : "results";
    if (has_dotdot(root)) luaL_error(L, "the results folder '%s' must not contain '..'", root);
    const char *abs = push_abs(L, root);
    lua_remove(L, -2);
    return abs;
}

/* mkdir of every missing folder from the results folder (included) down to the file's folder;
 * nothing above the results folder is created. */
static void make_parents(lua_State *L, const char *abs_file, const char *abs_root, const char *fn) {
    size_t rl = strlen(abs_root), n = strlen(abs_file);
    char buf[PATH_MAX];
    if (n >= sizeof buf) luaL_error(L, "%s: path too long", fn);
    memcpy(buf, abs_file, n + 1);
    for (size_t i = rl; i < n; i++) {
        if (buf[i] != '/' || i == 0) continue;
        buf[i] = '\0';
        int rc = mkdir(buf, 0755), e = errno;
        buf[i] = '/';
        if (rc != 0 && e != EEXIST)
            luaL_error(L, "%s: cannot create the folders of %s: %s", fn, abs_file, strerror(e));
    }
}

/* Raises unless `path` may be written (see the rule above); creates its missing folders. Also
 * used for trainer checkpoints (bind_train.c) through gm_bind_check_write_path. */
static void check_write_path(lua_State *L, const char *path, const char *fn) {
    if (!path[0]) luaL_error(L, "%s: empty path", fn);
    /* refusals are bad input in the file (exit 2), like the sandbox's */
    if (has_dotdot(path))
        gm_bind_usage_error(L,
                            "%s: path '%s' contains a '..' component; results are written only inside "
                            "the results folder",
                            fn, path);
    int top = lua_gettop(L);
    const char *root = push_root(L);
    const char *abs = push_abs(L, path);
    size_t rl = strlen(root);
    bool inside = root[1] == '\0' ? abs[1] != '\0'
                                  : strncmp(abs, root, rl) == 0 && abs[rl] == '/' && abs[rl + 1];
    if (!inside)
        gm_bind_usage_error(L,
                            "%s: %s is outside the results folder %s (experiment files may write only "
                            "there; see results/README.md)",
                            fn, path, root);
    make_parents(L, abs, root, fn);
    lua_settop(L, top);
}

/* ---- JSON attributes ----------------------------------------------------------------------- */

/* Pushes the JSON text of the value at idx for the attribute `what`: a string is taken as JSON
 * text already, a table is encoded (empty tables as lists). */
static const char *push_json_text(lua_State *L, int idx, const char *what) {
    if (lua_type(L, idx) == LUA_TSTRING) {
        lua_pushvalue(L, idx);
        return lua_tostring(L, -1);
    }
    gm_json_enc how = {what, true};
    return gm_json_push_encoded(L, idx, &how);
}

/* Pushes the decoded JSON attribute `name` of `as`: nil when it is absent, not text, not JSON,
 * or JSON null (an attribute holding null has no value). */
static void push_json_attr(lua_State *L, const gm_results_attrs *as, const char *name) {
    const gm_results_attr *a = gm_results_find(as, name);
    if (!a || a->kind != GM_RV_STR || !gm_json_push_decoded(L, a->s, strlen(a->s), NULL)) {
        lua_pushnil(L);
    } else if (gm_json_is_null(L, -1)) {
        lua_pop(L, 1);
        lua_pushnil(L);
    }
}

/* ---- the results userdata ---------------------------------------------------------------- */

static lresults *check_res(lua_State *L, int i) {
    lresults *r = luaL_checkudata(L, i, RESULTS_MT);
    if (!r->r) luaL_error(L, "this results file was closed");
    return r;
}

/* Raises with the core's message (nothing to release: the handle stays valid). */
static void raise_if(lua_State *L, gm_status s, const gm_error *err) {
    if (s != GM_OK) gm_bind_raise(L, err);
}

static int l_results(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    check_write_path(L, path, "gm.results");
    lresults *u = lua_newuserdatauv(L, sizeof *u, 0);
    memset(u, 0, sizeof *u);
    luaL_setmetatable(L, RESULTS_MT);
    gm_error err = {0};
    raise_if(L, gm_results_open(path, &u->r, &err), &err);
    return 1;
}

static const char *const SET_KEYS[] = {"experiment", "trial_id",   "trial_index", "n_trials",
                                       "status",     "reason",     "config_json", "report_json",
                                       "swept_json", "started_at", "finished_at", "wall_seconds",
                                       NULL};

static int l_set(lua_State *L) {
    lresults *u = check_res(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    gm_bind_check_opts(L, 2, "results:set", SET_KEYS);
    // check every value first, then write
    for (int i = 0; SET_KEYS[i]; i++) {
        const char *k = SET_KEYS[i];
        lua_getfield(L, 2, k);
        int t = lua_type(L, -1);
        bool is_json = strstr(k, "_json") != NULL;
        bool is_int = strcmp(k, "trial_index") == 0 || strcmp(k, "n_trials") == 0;
        bool ok = t == LUA_TNIL ||
                  (is_json                          ? (t == LUA_TSTRING || t == LUA_TTABLE)
                   : is_int                         ? lua_isinteger(L, -1)
                   : strcmp(k, "wall_seconds") == 0 ? t == LUA_TNUMBER
                   : strcmp(k, "trial_id") == 0     ? (t == LUA_TSTRING || lua_isinteger(L, -1))
                                                    : t == LUA_TSTRING);
        if (!ok)
            luaL_error(L, "results:set: '%s' must be %s, got %s", k,
                       is_json                          ? "JSON text or a table"
                       : is_int                         ? "an integer"
                       : strcmp(k, "wall_seconds") == 0 ? "a number"
                                                        : "a string",
                       luaL_typename(L, -1));
        lua_pop(L, 1);
    }
    gm_error err = {0};
    // status (with reason) first: it sets finished_at, which an explicit finished_at overrides
    const char *status = gm_bind_opt_str(L, 2, "status", NULL);
    const char *reason = gm_bind_opt_str(L, 2, "reason", NULL);
    if (status)
        raise_if(L, gm_results_set_status(u->r, status, reason, &err), &err);
    else if (reason)
        raise_if(L, gm_results_set_str(u->r, "reason", reason, &err), &err);
    for (int i = 0; SET_KEYS[i]; i++) {
        const char *k = SET_KEYS[i];
        if (strcmp(k, "status") == 0 || strcmp(k, "reason") == 0) continue;
        lua_getfield(L, 2, k);
        gm_status s = GM_OK;
        if (lua_isnil(L, -1)) {
        } else if (strstr(k, "_json")) {
            const char *text = push_json_text(L, -1, k);
            s = gm_results_set_str(u->r, k, text, &err);
            lua_pop(L, 1);
            if (strcmp(k, "config_json") == 0) u->config_json_given = true;
        } else if (lua_isinteger(L, -1) && strcmp(k, "trial_id") != 0) {
            s = gm_results_set_i64(u->r, k, (int64_t)lua_tointeger(L, -1), &err);
        } else if (lua_type(L, -1) == LUA_TNUMBER) {
            s = gm_results_set_f64(u->r, k, (double)lua_tonumber(L, -1), &err);
        } else {
            s = gm_results_set_str(u->r, k, lua_tostring(L, -1), &err);
        }
        lua_pop(L, 1);
        raise_if(L, s, &err);
    }
    return 0;
}

/* Flattens the table at idx into `out` (a Lua table at out): nested string-keyed tables become
 * dotted keys, lists become JSON text. */
static void flatten(lua_State *L, int idx, const char *prefix, int out, int depth) {
    idx = lua_absindex(L, idx);
    if (depth > 8) luaL_error(L, "results:set_config: nesting too deep");
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        if (lua_type(L, -2) != LUA_TSTRING)
            luaL_error(L, "results:set_config: keys must be strings (got a %s key)",
                       luaL_typename(L, -2));
        const char *k = lua_tostring(L, -2);
        lua_pushfstring(L, "%s%s%s", prefix, prefix[0] ? "." : "", k);
        const char *full = lua_tostring(L, -1);
        int t = lua_type(L, -2);
        if (t == LUA_TTABLE) {
            lua_Integer n = (lua_Integer)lua_rawlen(L, -2);
            lua_pushnil(L);
            bool empty = lua_next(L, -3) == 0; // an empty table is stored as a list too
            if (!empty) lua_pop(L, 2);         // the pair lua_next pushed
            if (n > 0 || empty) {
                push_json_text(L, -2, full);
                lua_setfield(L, out, full);
            } else {
                flatten(L, -2, full, out, depth + 1);
            }
        } else if (t == LUA_TSTRING || t == LUA_TNUMBER || t == LUA_TBOOLEAN) {
            lua_pushvalue(L, -2);
            lua_setfield(L, out, full);
        } else {
            luaL_error(L,
                       "results:set_config: field '%s' is a %s (string, number, boolean or "
                       "table)",
                       full, luaL_typename(L, -2));
        }
        lua_pop(L, 2);
    }
}

static int l_set_config(lua_State *L) {
    lresults *u = check_res(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_newtable(L);
    int flat = lua_gettop(L);
    flatten(L, 2, "", flat, 0);
    gm_error err = {0};
    lua_pushnil(L);
    while (lua_next(L, flat)) {
        const char *k = lua_tostring(L, -2);
        gm_status s;
        if (lua_type(L, -1) == LUA_TBOOLEAN)
            s = gm_results_config_bool(u->r, k, lua_toboolean(L, -1), &err);
        else if (lua_isinteger(L, -1))
            s = gm_results_config_i64(u->r, k, (int64_t)lua_tointeger(L, -1), &err);
        else if (lua_type(L, -1) == LUA_TNUMBER)
            s = gm_results_config_f64(u->r, k, (double)lua_tonumber(L, -1), &err);
        else
            s = gm_results_config_str(u->r, k, lua_tostring(L, -1), &err);
        lua_pop(L, 1);
        raise_if(L, s, &err);
    }
    if (!u->config_json_given) {
        const char *text = push_json_text(L, 2, "config_json");
        raise_if(L, gm_results_set_str(u->r, "config_json", text, &err), &err);
    }
    return 0;
}

static int l_append(lua_State *L) {
    lresults *u = check_res(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    int n = 0;
    lua_pushnil(L);
    while (lua_next(L, 2)) {
        if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TNUMBER)
            luaL_error(L, "results:append: expected {name = number, ...}, got %s = %s",
                       lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : luaL_typename(L, -2),
                       luaL_typename(L, -1));
        n++;
        lua_pop(L, 1);
    }
    const char **names = lua_newuserdatauv(L, (size_t)(n ? n : 1) * sizeof *names, 0);
    double *values = lua_newuserdatauv(L, (size_t)(n ? n : 1) * sizeof *values, 0);
    int i = 0;
    lua_pushnil(L);
    while (lua_next(L, 2)) {
        names[i] = lua_tostring(L, -2);
        values[i] = (double)lua_tonumber(L, -1);
        i++;
        lua_pop(L, 1);
    }
    gm_error err = {0};
    raise_if(L, gm_results_append_row(u->r, names, values, n, &err), &err);
    return 0;
}

/* Reads the list at field `key` of table idx into a new userdata array of doubles (pushed);
 * returns its length (-1 when absent). */
static lua_Integer opt_num_list(lua_State *L, int idx, const char *key, double **out,
                                const char *fn) {
    lua_getfield(L, idx, key);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        *out = NULL;
        lua_pushnil(L); // keep the stack shape: one slot per list
        return -1;
    }
    if (!lua_istable(L, -1)) luaL_error(L, "%s: '%s' must be a list of numbers", fn, key);
    lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
    double *v = lua_newuserdatauv(L, (size_t)(n ? n : 1) * sizeof *v, 0);
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, -2, i);
        if (lua_type(L, -1) != LUA_TNUMBER)
            luaL_error(L, "%s: %s[%d] must be a number", fn, key, (int)i);
        v[i - 1] = (double)lua_tonumber(L, -1);
        lua_pop(L, 1);
    }
    lua_remove(L, -2);
    *out = v;
    return n;
}

static int l_set_eval(lua_State *L) {
    lresults *u = check_res(L, 1);
    const char *phase = luaL_checkstring(L, 2);
    luaL_checktype(L, 3, LUA_TTABLE);
    // known keys below; any other key must be a number and becomes one more f64 attribute
    static const char *const known_keys[] = {"accuracy",  "loss",      "n_examples", "labels",
                                             "per_class", "confusion", NULL};
    lua_pushnil(L);
    while (lua_next(L, 3)) {
        bool known = false;
        for (int i = 0; lua_type(L, -2) == LUA_TSTRING && known_keys[i]; i++)
            known = known || strcmp(lua_tostring(L, -2), known_keys[i]) == 0;
        if (!known && (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TNUMBER))
            luaL_error(L,
                       "results:set_eval: '%s' must be a number (known keys: accuracy, loss, "
                       "n_examples, labels, per_class, confusion; others are stored as numbers)",
                       lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : luaL_typename(L, -2));
        lua_pop(L, 1);
    }
    gm_results_eval e = {.accuracy = gm_bind_opt_num(L, 3, "accuracy", NAN),
                         .loss = gm_bind_opt_num(L, 3, "loss", NAN),
                         .n_examples = gm_bind_opt_int(L, 3, "n_examples", -1)};
    lua_Integer K = -1;
    // labels
    lua_getfield(L, 3, "labels");
    const char **labels = NULL;
    if (!lua_isnil(L, -1)) {
        if (!lua_istable(L, -1))
            luaL_error(L, "results:set_eval: 'labels' must be a list of strings");
        K = (lua_Integer)lua_rawlen(L, -1);
        labels = lua_newuserdatauv(L, (size_t)(K ? K : 1) * sizeof *labels, 0);
        for (lua_Integer i = 1; i <= K; i++) {
            lua_rawgeti(L, -2, i);
            if (lua_type(L, -1) != LUA_TSTRING)
                luaL_error(L, "results:set_eval: labels[%d] must be a string", (int)i);
            labels[i - 1] = lua_tostring(L, -1); // alive: held by the labels table
            lua_pop(L, 1);
        }
    } else {
        lua_pushnil(L);
    }
    double *per_class = NULL;
    lua_Integer np = opt_num_list(L, 3, "per_class", &per_class, "results:set_eval");
    if (np >= 0) {
        if (K >= 0 && np != K)
            luaL_error(L, "results:set_eval: %d labels but %d per_class values", (int)K, (int)np);
        K = np;
    }
    // confusion: K lists of K integers
    int64_t *conf = NULL;
    lua_getfield(L, 3, "confusion");
    if (!lua_isnil(L, -1)) {
        if (!lua_istable(L, -1))
            luaL_error(L, "results:set_eval: 'confusion' must be a K x K list of lists");
        lua_Integer rows = (lua_Integer)lua_rawlen(L, -1);
        if (K >= 0 && rows != K)
            luaL_error(L, "results:set_eval: confusion has %d rows, expected %d", (int)rows,
                       (int)K);
        K = rows;
        conf = lua_newuserdatauv(L, (size_t)(K ? K * K : 1) * sizeof *conf, 0);
        for (lua_Integer i = 1; i <= K; i++) {
            lua_rawgeti(L, -2, i);
            if (!lua_istable(L, -1) || (lua_Integer)lua_rawlen(L, -1) != K)
                luaL_error(L, "results:set_eval: confusion row %d must be a list of %d counts",
                           (int)i, (int)K);
            for (lua_Integer j = 1; j <= K; j++) {
                lua_rawgeti(L, -1, j);
                if (!lua_isinteger(L, -1))
                    luaL_error(L, "results:set_eval: confusion[%d][%d] must be an integer", (int)i,
                               (int)j);
                conf[(i - 1) * K + (j - 1)] = (int64_t)lua_tointeger(L, -1);
                lua_pop(L, 1);
            }
            lua_pop(L, 1);
        }
    } else {
        lua_pushnil(L);
    }
    if (K > INT32_MAX) luaL_error(L, "results:set_eval: too many classes");
    e.n_classes = K > 0 ? (int)K : 0;
    e.labels = labels;
    e.per_class = per_class;
    e.confusion = conf;
    gm_error err = {0};
    raise_if(L, gm_results_set_eval(u->r, phase, &e, &err), &err);
    lua_pushnil(L);
    while (lua_next(L, 3)) {
        bool known = false;
        for (int i = 0; known_keys[i]; i++)
            known = known || strcmp(lua_tostring(L, -2), known_keys[i]) == 0;
        gm_status s = known ? GM_OK
                            : gm_results_set_eval_f64(u->r, phase, lua_tostring(L, -2),
                                                      (double)lua_tonumber(L, -1), &err);
        lua_pop(L, 1);
        raise_if(L, s, &err);
    }
    return 0;
}

/* "base weights" -> "<prefix>base_weights" (pushed). */
static const char *push_mem_name(lua_State *L, const char *prefix, const char *kind) {
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    luaL_addstring(&b, prefix);
    for (const char *p = kind; *p; p++) luaL_addchar(&b, *p == ' ' || *p == '-' ? '_' : *p);
    luaL_pushresult(&b);
    return lua_tostring(L, -1);
}

static int l_set_memory(lua_State *L) {
    lresults *u = check_res(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    // collect name -> bytes into a flat table, checking everything before writing
    lua_newtable(L);
    int flat = lua_gettop(L);
    lua_pushnil(L);
    while (lua_next(L, 2)) {
        if (lua_type(L, -2) != LUA_TSTRING)
            luaL_error(L, "results:set_memory: keys must be strings");
        const char *k = lua_tostring(L, -2);
        bool group = strcmp(k, "planned") == 0 || strcmp(k, "measured") == 0;
        if (group) {
            if (!lua_istable(L, -1))
                luaL_error(L, "results:set_memory: '%s' must be {kind = bytes}", k);
            lua_pushnil(L);
            while (lua_next(L, -2)) {
                if (lua_type(L, -2) != LUA_TSTRING || !lua_isinteger(L, -1))
                    luaL_error(L, "results:set_memory: '%s' must be {kind = bytes (integer)}", k);
                char prefix[16];
                snprintf(prefix, sizeof prefix, "%s_", k);
                push_mem_name(L, prefix, lua_tostring(L, -2));
                lua_pushvalue(L, -2);
                lua_settable(L, flat);
                lua_pop(L, 1);
            }
        } else if (strncmp(k, "planned_", 8) == 0 || strncmp(k, "measured_", 9) == 0) {
            if (!lua_isinteger(L, -1))
                luaL_error(L, "results:set_memory: '%s' must be an integer (bytes)", k);
            lua_pushvalue(L, -2);
            lua_pushvalue(L, -2);
            lua_settable(L, flat);
        } else {
            luaL_error(L,
                       "results:set_memory: unknown key '%s' (allowed: planned, measured, "
                       "measured_peak_rss, planned_<kind>, measured_<kind>)",
                       k);
        }
        lua_pop(L, 1);
    }
    gm_error err = {0};
    lua_pushnil(L);
    while (lua_next(L, flat)) {
        gm_status s =
            gm_results_set_memory(u->r, lua_tostring(L, -2), (int64_t)lua_tointeger(L, -1), &err);
        lua_pop(L, 1);
        raise_if(L, s, &err);
    }
    return 0;
}

static int l_set_data(lua_State *L) {
    lresults *u = check_res(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    static const char *const keys[] = {"n_train",     "n_test",     "n_rejected",
                                       "n_truncated", "rejections", NULL};
    gm_bind_check_opts(L, 2, "results:set_data", keys);
    gm_results_data d = {.n_train = gm_bind_opt_int(L, 2, "n_train", 0),
                         .n_test = gm_bind_opt_int(L, 2, "n_test", 0),
                         .n_truncated = gm_bind_opt_int(L, 2, "n_truncated", 0)};
    lua_getfield(L, 2, "rejections");
    lua_Integer nrej = 0;
    if (!lua_isnil(L, -1)) {
        if (!lua_istable(L, -1))
            luaL_error(L, "results:set_data: 'rejections' must be a list of {example=, reason=}");
        nrej = (lua_Integer)lua_rawlen(L, -1);
        // only the first GM_RESULTS_MAX_REJECTIONS are stored: encode no more than that
        lua_createtable(
            L, (int)(nrej < GM_RESULTS_MAX_REJECTIONS ? nrej : GM_RESULTS_MAX_REJECTIONS), 0);
        for (lua_Integer i = 1; i <= nrej && i <= GM_RESULTS_MAX_REJECTIONS; i++) {
            lua_rawgeti(L, -2, i);
            lua_rawseti(L, -2, i);
        }
        d.rejections_json = push_json_text(L, -1, "rejections");
    }
    d.n_rejected = gm_bind_opt_int(L, 2, "n_rejected", nrej);
    gm_error err = {0};
    raise_if(L, gm_results_set_data(u->r, &d, &err), &err);
    return 0;
}

static int l_put_adapter(lua_State *L) {
    lresults *u = check_res(L, 1);
    gm_trainer *tr = gm_bind_check_trainer(L, 2);
    int n = 0;
    gm_lora_adapter *ad = gm_trainer_adapters(tr, &n);
    int64_t rank = gm_trainer_opts(tr)->lora.rank;
    gm_error err = {0};
    for (int i = 0; i < n; i++) {
        int64_t sa[2] = {rank, ad[i].in}, sb[2] = {ad[i].out, rank};
        raise_if(L, gm_results_put_tensor(u->r, ad[i].name_A, ad[i].A, 2, sa, &err), &err);
        raise_if(L, gm_results_put_tensor(u->r, ad[i].name_B, ad[i].B, 2, sb, &err), &err);
    }
    lua_pushinteger(L, 2 * n);
    return 1;
}

static int l_truncate(lua_State *L) {
    lresults *u = check_res(L, 1);
    lua_Integer rows = luaL_checkinteger(L, 2);
    gm_error err = {0};
    raise_if(L, gm_results_truncate(u->r, (int64_t)rows, &err), &err);
    return 0;
}

static int l_rows(lua_State *L) {
    lua_pushinteger(L, (lua_Integer)gm_results_rows(check_res(L, 1)->r));
    return 1;
}

static int l_resumed(lua_State *L) {
    lua_pushboolean(L, gm_results_resumed(check_res(L, 1)->r));
    return 1;
}

static int l_rpath(lua_State *L) {
    lua_pushstring(L, gm_results_path(check_res(L, 1)->r));
    return 1;
}

static int l_save(lua_State *L) {
    lresults *u = check_res(L, 1);
    gm_error err = {0};
    raise_if(L, gm_results_save(u->r, &err), &err);
    return 0;
}

static int l_rclose(lua_State *L) {
    lresults *u = luaL_checkudata(L, 1, RESULTS_MT);
    gm_results_free(u->r); // unsaved changes are dropped: saving is explicit
    u->r = NULL;
    return 0;
}

static int l_rtostring(lua_State *L) {
    lresults *u = luaL_checkudata(L, 1, RESULTS_MT);
    if (u->r)
        lua_pushfstring(L, "gm.Results(%s, %d rows)", gm_results_path(u->r),
                        (int)gm_results_rows(u->r));
    else
        lua_pushliteral(L, "gm.Results(closed)");
    return 1;
}

/* ---- reading ------------------------------------------------------------------------------ */

static void push_attr(lua_State *L, const gm_results_attr *a) {
    if (a->kind == GM_RV_STR)
        lua_pushstring(L, a->s);
    else if (a->kind == GM_RV_I64)
        lua_pushinteger(L, (lua_Integer)a->i);
    else
        lua_pushnumber(L, a->f);
}

static void push_attrs(lua_State *L, const gm_results_attrs *as) {
    lua_createtable(L, 0, as->n);
    for (int i = 0; i < as->n; i++) {
        push_attr(L, &as->a[i]);
        lua_setfield(L, -2, as->a[i].name);
    }
}

/* Pushes one trial as a Lua table (layout in the header comment of lua/report.lua). */
static void push_trial(lua_State *L, const gm_results_trial *t) {
    luaL_checkstack(L, 16, "results");
    push_attrs(L, &t->root);
    int tt = lua_gettop(L);
    lua_pushstring(L, t->source);
    lua_setfield(L, tt, "path");
    push_json_attr(L, &t->root, "report_json");
    lua_setfield(L, tt, "report");
    push_json_attr(L, &t->root, "swept_json");
    lua_setfield(L, tt, "swept");
    // config; a field stored as 0/1 that config_json holds as a boolean comes back a boolean
    push_json_attr(L, &t->root, "config_json");
    int cj = lua_gettop(L);
    push_attrs(L, &t->config);
    for (int i = 0; i < t->config.n && lua_istable(L, cj); i++) {
        const gm_results_attr *c = &t->config.a[i];
        lua_getfield(L, cj, c->name);
        bool is_bool = lua_isboolean(L, -1);
        lua_pop(L, 1);
        if (c->kind == GM_RV_I64 && is_bool) {
            lua_pushboolean(L, c->i != 0);
            lua_setfield(L, -2, c->name);
        }
    }
    lua_remove(L, cj);
    lua_setfield(L, tt, "config");
    lua_createtable(L, 0, t->n_metrics);
    for (int i = 0; i < t->n_metrics; i++) {
        lua_createtable(L, (int)t->metrics[i].n, 0);
        for (int64_t k = 0; k < t->metrics[i].n; k++) {
            lua_pushnumber(L, t->metrics[i].v[k]);
            lua_rawseti(L, -2, (lua_Integer)k + 1);
        }
        lua_setfield(L, -2, t->metrics[i].name);
    }
    lua_setfield(L, tt, "metrics");
    lua_createtable(L, 0, t->n_evals);
    for (int i = 0; i < t->n_evals; i++) {
        const gm_results_eval_read *e = &t->evals[i];
        int K = e->n_classes;
        push_attrs(L, &e->attrs);
        lua_pushinteger(L, K);
        lua_setfield(L, -2, "n_classes");
        if (e->labels) {
            lua_createtable(L, K, 0);
            for (int k = 0; k < K; k++) {
                lua_pushstring(L, e->labels[k]);
                lua_rawseti(L, -2, k + 1);
            }
            lua_setfield(L, -2, "labels");
        }
        if (e->per_class) {
            lua_createtable(L, K, 0);
            for (int k = 0; k < K; k++) {
                lua_pushnumber(L, e->per_class[k]);
                lua_rawseti(L, -2, k + 1);
            }
            lua_setfield(L, -2, "per_class");
        }
        if (e->confusion) {
            lua_createtable(L, K, 0);
            for (int r = 0; r < K; r++) {
                lua_createtable(L, K, 0);
                for (int c = 0; c < K; c++) {
                    lua_pushinteger(L,
                                    (lua_Integer)e->confusion[(size_t)r * (size_t)K + (size_t)c]);
                    lua_rawseti(L, -2, c + 1);
                }
                lua_rawseti(L, -2, r + 1);
            }
            lua_setfield(L, -2, "confusion");
        }
        lua_setfield(L, -2, e->phase);
    }
    lua_setfield(L, tt, "eval");
    push_attrs(L, &t->memory);
    lua_setfield(L, tt, "memory");
    push_attrs(L, &t->data);
    push_json_attr(L, &t->data, "rejections_json");
    lua_setfield(L, -2, "rejections");
    lua_setfield(L, tt, "data");
    lua_createtable(L, t->n_adapter, 0);
    for (int i = 0; i < t->n_adapter; i++) {
        lua_createtable(L, 0, 2);
        lua_pushstring(L, t->adapter[i].name);
        lua_setfield(L, -2, "name");
        lua_createtable(L, t->adapter[i].ndim, 0);
        for (int d = 0; d < t->adapter[i].ndim; d++) {
            lua_pushinteger(L, (lua_Integer)t->adapter[i].shape[d]);
            lua_rawseti(L, -2, d + 1);
        }
        lua_setfield(L, -2, "shape");
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, tt, "adapter");
}

/* Reads `path` (trial or merged file) and appends its trials to the list at `list`; returns the
 * new count. Raises on error (after freeing). */
static lua_Integer append_trials(lua_State *L, const char *path, int list, lua_Integer count) {
    gm_results_trial *t = NULL;
    int n = 0;
    gm_error err = {0};
    if (gm_results_read(path, &t, &n, &err) != GM_OK) gm_bind_raise(L, &err);
    for (int i = 0; i < n; i++) {
        if (!lua_checkstack(L, 24)) {
            gm_results_trials_free(t, n);
            luaL_error(L, "out of Lua stack reading %s", path);
        }
        push_trial(L, &t[i]);
        lua_rawseti(L, list, ++count);
    }
    gm_results_trials_free(t, n);
    return count;
}

static int l_results_read(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    struct stat st;
    if (stat(path, &st) != 0 && errno == ENOENT) {
        lua_pushnil(L);
        lua_pushfstring(L, "%s: no such file", path);
        return 2;
    }
    lua_newtable(L);
    int list = lua_gettop(L);
    lua_Integer n = append_trials(L, path, list, 0);
    if (n != 1)
        return luaL_error(L,
                          "gm.results_read: %s holds %d trials (a merged file: use "
                          "gm.results_read_all)",
                          path, (int)n);
    lua_rawgeti(L, list, 1);
    return 1;
}

static int l_results_list(lua_State *L) {
    const char *dir = luaL_checkstring(L, 1);
    char **paths = NULL;
    int n = 0;
    gm_error err = {0};
    struct stat st;
    lua_newtable(L);
    if (stat(dir, &st) != 0 && errno == ENOENT) return 1;
    if (gm_results_list(dir, &paths, &n, &err) != GM_OK) return gm_bind_raise(L, &err);
    for (int i = 0; i < n; i++) {
        lua_pushstring(L, paths[i]);
        lua_rawseti(L, -2, i + 1);
    }
    gm_results_list_free(paths, n);
    return 1;
}

static int l_results_read_all(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    struct stat st;
    if (stat(path, &st) != 0)
        return luaL_error(L, "%s: %s", path,
                          errno == ENOENT ? "no such file or folder" : strerror(errno));
    lua_newtable(L);
    int list = lua_gettop(L);
    if (!S_ISDIR(st.st_mode)) {
        append_trials(L, path, list, 0);
        return 1;
    }
    char **paths = NULL;
    int n = 0;
    gm_error err = {0};
    if (gm_results_list(path, &paths, &n, &err) != GM_OK) return gm_bind_raise(L, &err);
    // copy the names into Lua first: a raise while reading must not leak the C list
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_pushstring(L, paths[i]);
        lua_rawseti(L, -2, i + 1);
    }
    gm_results_list_free(paths, n);
    int names = lua_gettop(L);
    lua_Integer count = 0;
    for (int i = 1; i <= n; i++) {
        lua_rawgeti(L, names, i);
        count = append_trials(L, lua_tostring(L, -1), list, count);
        lua_pop(L, 1);
    }
    lua_settop(L, list);
    return 1;
}

static int l_results_merge(lua_State *L) {
    const char *dir = luaL_checkstring(L, 1);
    const char *out = luaL_checkstring(L, 2);
    static const char *const keys[] = {"adapters", NULL};
    gm_bind_check_opts(L, 3, "gm.results_merge", keys);
    bool adapters = gm_bind_opt_bool(L, 3, "adapters", false);
    check_write_path(L, out, "gm.results_merge");
    gm_error err = {0};
    if (gm_results_merge(dir, out, adapters, &err) != GM_OK) return gm_bind_raise(L, &err);
    return 0;
}

/* ---- text files ----------------------------------------------------------------------------- */

static int l_write_text(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    size_t n;
    const char *text = luaL_checklstring(L, 2, &n);
    check_write_path(L, path, "gm.write_text");
    // tmp + rename: a reader never sees half a table
    lua_pushfstring(L, "%s.tmp", path);
    const char *tmp = lua_tostring(L, -1);
    FILE *f = fopen(tmp, "wb");
    if (!f) return luaL_error(L, "gm.write_text: cannot create %s: %s", tmp, strerror(errno));
    size_t w = fwrite(text, 1, n, f);
    int e = w == n ? 0 : errno;
    if (fclose(f) != 0 && !e) e = errno;
    if (e || w != n) {
        unlink(tmp);
        return luaL_error(L, "gm.write_text: cannot write %s: %s", path, strerror(e ? e : EIO));
    }
    if (rename(tmp, path) != 0) {
        e = errno;
        unlink(tmp);
        return luaL_error(L, "gm.write_text: cannot rename %s onto %s: %s", tmp, path, strerror(e));
    }
    return 0;
}

/* ---- plots ------------------------------------------------------------------------------------
 */

#define PLOT_W 1024
#define PLOT_H 640
#define PLOT_MAX_SERIES 256
#define LEGEND_MAX_COLS 2

/* Tableau 10 (matplotlib's default cycle): distinct for color-blind readers too. */
static const unsigned char PALETTE[10][3] = {
    {31, 119, 180}, {255, 127, 14},  {44, 160, 44},   {214, 39, 40},  {148, 103, 189},
    {140, 86, 75},  {227, 119, 194}, {127, 127, 127}, {188, 189, 34}, {23, 190, 207}};
#define COL_BG 0
#define COL_FG 1
#define COL_GRID 2
#define COL_FIRST 3 // palette colors follow

typedef struct plot_series {
    const char *label; // NULL: not in the legend
    int n;
    double *x, *y, *err; // (n); err may be NULL
    int color;
} plot_series;

typedef struct plot_spec {
    const char *file, *title, *xlabel, *ylabel;
    bool logx, points;
    int n_series;
    plot_series *s;
    int n_ticks;
    double *ticks;
    const char **tick_labels;
} plot_spec;

static jmp_buf *plot_jmp;
static char plot_msg[512];

/* PLplot's exit handler: PLplot would call exit() after it returns, so it never does. */
static int plot_exit(const char *msg) {
    snprintf(plot_msg, sizeof plot_msg, "%s", msg ? msg : "PLplot failed");
    longjmp(*plot_jmp, 1);
    return 0;
}

static void plot_abort(const char *msg) {
    if (!plot_msg[0]) snprintf(plot_msg, sizeof plot_msg, "%s", msg ? msg : "PLplot error");
}

/* fds 1 and 2 to /dev/null (PLplot prints there) and back. */
typedef struct quiet {
    int saved[2];
} quiet;

static void quiet_on(quiet *q) {
    fflush(stdout);
    fflush(stderr);
    int dn = open("/dev/null", O_WRONLY | O_CLOEXEC);
    for (int i = 0; i < 2; i++) {
        q->saved[i] = dup(i + 1);
        if (dn >= 0) dup2(dn, i + 1);
    }
    if (dn >= 0) close(dn);
}

static void quiet_off(quiet *q) {
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < 2; i++)
        if (q->saved[i] >= 0) {
            dup2(q->saved[i], i + 1);
            close(q->saved[i]);
        }
}

static bool have_device(const char *name) {
    const char **menu = NULL, **devs = NULL;
    PLINT n = 64;
    menu = calloc((size_t)n, sizeof *menu);
    devs = calloc((size_t)n, sizeof *devs);
    bool found = false;
    if (menu && devs) {
        plgDevs(&menu, &devs, &n);
        for (PLINT i = 0; i < n && !found; i++) found = devs[i] && strcmp(devs[i], name) == 0;
    }
    free(menu);
    free(devs);
    return found;
}

static double tx(const plot_spec *p, double x) { return p->logx ? log10(x) : x; }

/* Draws the plot; returns false with plot_msg set on failure. Runs under quiet + setjmp. */
static bool draw(const plot_spec *p) {
    // data range (finite values; log axis: positive x only)
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int i = 0; i < p->n_series; i++)
        for (int k = 0; k < p->s[i].n; k++) {
            double x = p->s[i].x[k], y = p->s[i].y[k], e = p->s[i].err ? p->s[i].err[k] : 0;
            if (!isfinite(x) || !isfinite(y) || (p->logx && x <= 0)) continue;
            if (!isfinite(e)) e = 0;
            x = tx(p, x);
            x0 = fmin(x0, x), x1 = fmax(x1, x);
            y0 = fmin(y0, y - fabs(e)), y1 = fmax(y1, y + fabs(e));
        }
    for (int i = 0; i < p->n_ticks; i++)
        if (isfinite(p->ticks[i]) && !(p->logx && p->ticks[i] <= 0)) {
            x0 = fmin(x0, tx(p, p->ticks[i]));
            x1 = fmax(x1, tx(p, p->ticks[i]));
        }
    if (!(x0 <= x1) || !(y0 <= y1)) {
        snprintf(plot_msg, sizeof plot_msg, "no finite data points to plot");
        return false;
    }
    // margins: 5% of the range (a flat series gets +-0.5 or 5% of its value)
    double dx = x1 - x0, dy = y1 - y0;
    if (dx == 0) dx = fabs(x0) > 0 ? fabs(x0) * 0.1 : 1;
    if (dy == 0) dy = fabs(y0) > 0 ? fabs(y0) * 0.1 : 1;
    double wx0 = x0 - 0.05 * dx, wx1 = x1 + 0.05 * dx, wy0 = y0 - 0.06 * dy, wy1 = y1 + 0.06 * dy;
    if (p->n_ticks > 0 && x1 - x0 > 0) wx0 = x0 - 0.08 * dx, wx1 = x1 + 0.08 * dx;

    // The legend sits right of the plot: up to `rows_fit` entries per column (the page height
    // below the plot's top), up to LEGEND_MAX_COLS columns; entries beyond that are summed up
    // in a last "... N more" line. Its width (the longest label plus the line sample) comes
    // off the plot. legend_ts is pllegend's text_scale, relative to the *default* character
    // height (pllegend sets it itself).
    int n_legend = 0;
    for (int i = 0; i < p->n_series; i++) n_legend += p->s[i].label != NULL;
    double legend_ts = n_legend > 16 ? 0.75 : 0.9, legend_frac = 0;
    double spacing = n_legend > 18 ? 1.25 : 1.6;
    int ncol = 1, shown = n_legend;
    const double vy1 = 0.89;
    pladv(0);
    if (n_legend) {
        PLFLT def_ht, ht, sx0, sx1, sy0, sy1;
        plgchr(&def_ht, &ht);
        plgspa(&sx0, &sx1, &sy0, &sy1);
        double page = sx1 - sx0, fixed = 0.07 * page; // sample line, gaps, frame
        // measured with pngcairo: an entry takes text_spacing x 1.1 default heights, whatever
        // text_scale is
        int rows_fit = (int)((vy1 - 0.02) * (sy1 - sy0) / (spacing * 1.12 * def_ht));
        if (rows_fit < 1) rows_fit = 1;
        ncol = (n_legend + rows_fit - 1) / rows_fit;
        if (ncol > LEGEND_MAX_COLS) ncol = LEGEND_MAX_COLS;
        if (n_legend > ncol * rows_fit) shown = ncol * rows_fit - 1; // + the "more" line
        size_t longest = 0; // in characters (UTF-8 code points)
        for (int i = 0; i < p->n_series; i++) {
            size_t n = 0;
            for (const char *c = p->s[i].label; c && *c; c++)
                n += ((unsigned char)*c & 0xC0) != 0x80;
            if (p->s[i].label && n > longest) longest = n;
        }
        if (longest < 12) longest = 12; // room for the "... N more" line
        // PLplot 5.15 exports no text-length query. Measured with pngcairo and DejaVu Sans:
        // 0.68 x text_scale x the default height per character (lower case, digits, '=', ',')
        double per_char = 0.70 * def_ht;
        double text_mm = per_char * legend_ts * (double)longest;
        if (ncol > 1) fixed = 0.11 * page; // pllegend spaces its columns more generously
        double max_frac = 0.42 + 0.08 * (ncol - 1);
        if (ncol * (text_mm + fixed) / page > max_frac) { // a smaller font, not a tiny plot
            legend_ts = fmax(0.55, (max_frac * page / ncol - fixed) / (per_char * (double)longest));
            text_mm = per_char * legend_ts * (double)longest;
        }
        legend_frac = fmin(0.7, ncol * (text_mm + fixed) / page);
    }
    double vx0 = 0.10, vx1 = n_legend ? 0.985 - legend_frac - 0.02 : 0.97, vy0 = 0.13;
    plschr(0, 1.1);
    plvpor(vx0, vx1, vy0, vy1);
    plwind(wx0, wx1, wy0, wy1);
    // grid, then the frame and the axes
    plcol0(COL_GRID);
    plwidth(1);
    plbox(p->n_ticks ? "" : (p->logx ? "gl" : "g"), 0, 0, "g", 0, 0);
    plcol0(COL_FG);
    plwidth(1.5);
    if (p->n_ticks) {
        plbox("bc", 0, 0, "bcnstv", 0, 0);
        for (int i = 0; i < p->n_ticks; i++) {
            double t = p->ticks[i];
            if (!isfinite(t) || (p->logx && t <= 0)) continue;
            double x = tx(p, t);
            pljoin(x, wy0, x, wy0 + 0.015 * (wy1 - wy0));
            char def[32];
            snprintf(def, sizeof def, "%g", t);
            const char *lab = p->tick_labels && p->tick_labels[i] ? p->tick_labels[i] : def;
            plmtex("b", 1.6, (x - wx0) / (wx1 - wx0), 0.5, lab);
        }
    } else {
        plbox(p->logx ? "bcnstl" : "bcnst", 0, 0, "bcnstv", 0, 0);
    }
    plmtex("b", 3.2, 0.5, 0.5, p->xlabel ? p->xlabel : "");
    plmtex("l", 5.0, 0.5, 0.5, p->ylabel ? p->ylabel : "");

    static const char *const symbols[4] = {"●", "■", "▲", "◆"};
    PLINT opt[PLOT_MAX_SERIES], tcol[PLOT_MAX_SERIES], lcol[PLOT_MAX_SERIES], lsty[PLOT_MAX_SERIES],
        scol[PLOT_MAX_SERIES], snum[PLOT_MAX_SERIES];
    PLFLT lwid[PLOT_MAX_SERIES], sscl[PLOT_MAX_SERIES];
    const char *text[PLOT_MAX_SERIES], *sym[PLOT_MAX_SERIES];
    int nl = 0;
    for (int i = 0; i < p->n_series; i++) {
        const plot_series *s = &p->s[i];
        int c = s->color >= 0 ? s->color : i;
        PLINT col = COL_FIRST + c % 10, style = 1 + (c / 10) % 4; // 10 colors x 4 dash styles
        plcol0(col);
        pllsty(style);
        plwidth(p->points ? 1.5 : 2.0);
        // lines: each run of finite points (a NaN breaks the line)
        for (int k = 0; k < s->n;) {
            while (k < s->n &&
                   (!isfinite(s->x[k]) || !isfinite(s->y[k]) || (p->logx && s->x[k] <= 0)))
                k++;
            int a = k;
            while (k < s->n && isfinite(s->x[k]) && isfinite(s->y[k]) && !(p->logx && s->x[k] <= 0))
                k++;
            PLFLT *xs = k - a >= 2 ? malloc(2 * (size_t)(k - a) * sizeof *xs) : NULL;
            if (xs) {
                PLFLT *ys = xs + (k - a);
                for (int j = a; j < k; j++) xs[j - a] = tx(p, s->x[j]), ys[j - a] = s->y[j];
                plline(k - a, xs, ys);
                free(xs);
            }
        }
        pllsty(1);
        if (p->points) {
            for (int k = 0; k < s->n; k++) {
                if (!isfinite(s->x[k]) || !isfinite(s->y[k]) || (p->logx && s->x[k] <= 0)) continue;
                PLFLT x = tx(p, s->x[k]), y = s->y[k];
                if (s->err && isfinite(s->err[k]) && s->err[k] > 0) {
                    PLFLT lo = y - s->err[k], hi = y + s->err[k];
                    plerry(1, &x, &lo, &hi);
                }
                plstring(1, &x, &y, symbols[c % 4]);
            }
        }
        if (s->label && nl < shown) {
            opt[nl] = PL_LEGEND_LINE | (p->points ? PL_LEGEND_SYMBOL : 0);
            text[nl] = s->label;
            tcol[nl] = COL_FG;
            lcol[nl] = col;
            lsty[nl] = style;
            lwid[nl] = 2.0;
            scol[nl] = col;
            snum[nl] = 1;
            sscl[nl] = 1.0;
            sym[nl] = symbols[c % 4];
            nl++;
        }
    }
    char more[48];
    if (shown < n_legend) { // the entries that did not fit, as one text-only line
        snprintf(more, sizeof more, "... %d more", n_legend - shown);
        opt[nl] = PL_LEGEND_NONE;
        text[nl] = more;
        tcol[nl] = COL_FG;
        lcol[nl] = scol[nl] = COL_FG;
        lsty[nl] = snum[nl] = 1;
        lwid[nl] = sscl[nl] = 1.0;
        sym[nl] = "";
        nl++;
    }
    if (nl > 0) {
        PLFLT lw, lh;
        int nrow = (nl + ncol - 1) / ncol;
        // top right corner of the page, level with the top of the plot area
        pllegend(&lw, &lh, PL_LEGEND_BACKGROUND | PL_LEGEND_BOUNDING_BOX,
                 PL_POSITION_SUBPAGE | PL_POSITION_INSIDE | PL_POSITION_TOP | PL_POSITION_RIGHT,
                 0.015, 1.0 - vy1, 0.04 * legend_ts / 0.9, COL_BG, COL_FG, 1, nrow, ncol, nl, opt,
                 0.6, legend_ts, spacing, 0.0, tcol, text, NULL, NULL, NULL, NULL, lcol, lsty, lwid,
                 scol, sscl, snum, sym);
    }
    // the title, centered on the page
    plvpor(0.0, 1.0, 0.0, vy1);
    plschr(0, 1.3);
    plcol0(COL_FG);
    plmtex("t", 1.3, 0.5, 0.5, p->title ? p->title : "");
    return true;
}

/* Decodes the PNG at path completely with libpng; the size and the fraction of pixels that are
 * not background white. */
static bool png_check(const char *path, int *w, int *h, double *ink, char *why, size_t cap) {
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&img, path)) {
        snprintf(why, cap, "libpng cannot read it: %s", img.message);
        return false;
    }
    img.format = PNG_FORMAT_RGB;
    unsigned char *buf = malloc(PNG_IMAGE_SIZE(img));
    if (!buf) {
        png_image_free(&img);
        snprintf(why, cap, "out of memory");
        return false;
    }
    if (!png_image_finish_read(&img, NULL, buf, 0, NULL)) {
        snprintf(why, cap, "libpng cannot decode it: %s", img.message);
        free(buf);
        return false;
    }
    size_t n = (size_t)img.width * img.height, dark = 0;
    for (size_t i = 0; i < n; i++)
        dark += buf[3 * i] < 250 || buf[3 * i + 1] < 250 || buf[3 * i + 2] < 250;
    free(buf);
    *w = (int)img.width;
    *h = (int)img.height;
    *ink = n ? (double)dark / (double)n : 0;
    return true;
}

/* Reads a list of numbers at field `key` of the table at idx into a userdata (pushed). */
static double *num_list(lua_State *L, int idx, const char *key, int *n, bool required,
                        const char *ctx) {
    lua_getfield(L, idx, key);
    if (lua_isnil(L, -1)) {
        if (required) luaL_error(L, "gm.plot: %s needs '%s' (a list of numbers)", ctx, key);
        *n = -1;
        return NULL; // the nil stays on the stack
    }
    if (!lua_istable(L, -1)) luaL_error(L, "gm.plot: %s: '%s' must be a list of numbers", ctx, key);
    int len = (int)lua_rawlen(L, -1);
    double *v = lua_newuserdatauv(L, (size_t)(len ? len : 1) * sizeof *v, 0);
    for (int i = 1; i <= len; i++) {
        lua_rawgeti(L, -2, i);
        if (lua_type(L, -1) != LUA_TNUMBER)
            luaL_error(L, "gm.plot: %s: %s[%d] must be a number", ctx, key, i);
        v[i - 1] = (double)lua_tonumber(L, -1);
        lua_pop(L, 1);
    }
    lua_remove(L, -2); // the list table; the userdata stays (anchors v)
    *n = len;
    return v;
}

static int l_plot(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    static const char *const keys[] = {"file", "title",  "xlabel", "ylabel",      "logx",
                                       "kind", "series", "xticks", "xticklabels", NULL};
    gm_bind_check_opts(L, 1, "gm.plot", keys);
    plot_spec p = {0};
    p.file = gm_bind_opt_str(L, 1, "file", NULL);
    if (!p.file) return luaL_error(L, "gm.plot: 'file' (a .png path) is required");
    size_t fl = strlen(p.file);
    if (fl < 5 || strcmp(p.file + fl - 4, ".png") != 0)
        return luaL_error(L, "gm.plot: file '%s' must end in .png", p.file);
    p.title = gm_bind_opt_str(L, 1, "title", "");
    p.xlabel = gm_bind_opt_str(L, 1, "xlabel", "");
    p.ylabel = gm_bind_opt_str(L, 1, "ylabel", "");
    p.logx = gm_bind_opt_bool(L, 1, "logx", false);
    const char *kind = gm_bind_opt_str(L, 1, "kind", "lines");
    if (strcmp(kind, "lines") != 0 && strcmp(kind, "points") != 0)
        return luaL_error(L, "gm.plot: kind '%s' (allowed: lines, points)", kind);
    p.points = strcmp(kind, "points") == 0;
    p.ticks = num_list(L, 1, "xticks", &p.n_ticks, false, "xticks");
    if (p.n_ticks < 0) p.n_ticks = 0;
    lua_getfield(L, 1, "xticklabels");
    if (!lua_isnil(L, -1)) {
        if (!lua_istable(L, -1) || (int)lua_rawlen(L, -1) != p.n_ticks)
            return luaL_error(L,
                              "gm.plot: 'xticklabels' must be a list of %d strings (one per xtick)",
                              p.n_ticks);
        p.tick_labels =
            lua_newuserdatauv(L, (size_t)(p.n_ticks ? p.n_ticks : 1) * sizeof *p.tick_labels, 0);
        for (int i = 1; i <= p.n_ticks; i++) {
            lua_rawgeti(L, -2, i);
            if (lua_type(L, -1) != LUA_TSTRING)
                return luaL_error(L, "gm.plot: xticklabels[%d] must be a string", i);
            p.tick_labels[i - 1] = lua_tostring(L, -1);
            lua_pop(L, 1);
        }
    }
    lua_getfield(L, 1, "series");
    if (!lua_istable(L, -1))
        return luaL_error(L, "gm.plot: 'series' must be a list of {label=, x=, y=, err=}");
    int series = lua_gettop(L);
    p.n_series = (int)lua_rawlen(L, series);
    if (p.n_series < 1 || p.n_series > PLOT_MAX_SERIES)
        return luaL_error(L, "gm.plot: 1..%d series, got %d", PLOT_MAX_SERIES, p.n_series);
    p.s = lua_newuserdatauv(L, (size_t)p.n_series * sizeof *p.s, 0);
    static const char *const skeys[] = {"label", "x", "y", "err", "color", NULL};
    for (int i = 0; i < p.n_series; i++) {
        luaL_checkstack(L, 8, "gm.plot: too many series");
        lua_rawgeti(L, series, i + 1);
        int st = lua_gettop(L);
        if (!lua_istable(L, st)) return luaL_error(L, "gm.plot: series[%d] must be a table", i + 1);
        gm_bind_check_opts(L, st, "gm.plot series", skeys);
        char ctx[32];
        snprintf(ctx, sizeof ctx, "series[%d]", i + 1);
        plot_series *s = &p.s[i];
        s->label = gm_bind_opt_str(L, st, "label", NULL);
        s->color = (int)gm_bind_opt_int(L, st, "color", i);
        if (s->color < 0) return luaL_error(L, "gm.plot: %s: color must be >= 0", ctx);
        int nx, ny, ne;
        s->x = num_list(L, st, "x", &nx, true, ctx);
        s->y = num_list(L, st, "y", &ny, true, ctx);
        s->err = num_list(L, st, "err", &ne, false, ctx);
        if (nx != ny || (ne >= 0 && ne != ny))
            return luaL_error(L,
                              "gm.plot: %s: x, y (and err) must have the same length (%d, %d, %d)",
                              ctx, nx, ny, ne);
        s->n = nx;
        // series[i] and its x/y/err arrays stay on the stack (anchored) until the plot is done
    }
    check_write_path(L, p.file, "gm.plot");

    // PLplot asks on stdin for another name when it cannot open the file: find out first
    FILE *probe = fopen(p.file, "wb");
    if (!probe) return luaL_error(L, "gm.plot: cannot create %s: %s", p.file, strerror(errno));
    fclose(probe);
    plot_msg[0] = '\0';
    quiet q;
    quiet_on(&q);
    if (!have_device("pngcairo")) {
        quiet_off(&q);
        unlink(p.file);
        return luaL_error(L, "gm.plot: PLplot has no pngcairo device (install the Debian package "
                             "plplot-driver-cairo)");
    }
    jmp_buf jb;
    jmp_buf *prev = plot_jmp;
    plot_jmp = &jb;
    PLINT old_strm = 0, strm = 0;
    volatile bool begun = false, ok = false;
    plgstrm(&old_strm);
    if (setjmp(jb) == 0) {
        plsexit(plot_exit);
        plsabort(plot_abort);
        plmkstrm(&strm);
        begun = true;
        plsdev("pngcairo");
        plsfnam(p.file);
        plspage(0, 0, PLOT_W, PLOT_H, 0, 0);
        plscmap0n(16);
        plscol0(COL_BG, 255, 255, 255);
        plscol0(COL_FG, 0, 0, 0);
        plscol0(COL_GRID, 225, 225, 225);
        for (int i = 0; i < 10; i++)
            plscol0(COL_FIRST + i, PALETTE[i][0], PALETTE[i][1], PALETTE[i][2]);
        plinit();
        ok = draw(&p);
        plend1();
        begun = false;
    } else if (begun) {
        // a fatal PLplot error inside the stream: end it as well as it can be ended
        plend1();
    }
    plsstrm(old_strm);
    plsexit(NULL);
    plsabort(NULL);
    plot_jmp = prev;
    quiet_off(&q);
    if (!ok) {
        unlink(p.file);
        return luaL_error(L, "gm.plot: %s: %s", p.file, plot_msg[0] ? plot_msg : "PLplot failed");
    }
    int w = 0, h = 0;
    double ink = 0;
    char why[256];
    if (!png_check(p.file, &w, &h, &ink, why, sizeof why))
        return luaL_error(L, "gm.plot: %s was written but is not a valid PNG: %s", p.file, why);
    lua_createtable(L, 0, 4);
    lua_pushstring(L, p.file);
    lua_setfield(L, -2, "file");
    lua_pushinteger(L, w);
    lua_setfield(L, -2, "width");
    lua_pushinteger(L, h);
    lua_setfield(L, -2, "height");
    lua_pushnumber(L, ink);
    lua_setfield(L, -2, "ink");
    return 1;
}

/* ---- registration ---------------------------------------------------------------------------- */

void gm_lua_open_results(lua_State *L) {
    static const luaL_Reg methods[] = {{"set", l_set},
                                       {"set_config", l_set_config},
                                       {"append", l_append},
                                       {"set_eval", l_set_eval},
                                       {"set_memory", l_set_memory},
                                       {"set_data", l_set_data},
                                       {"put_adapter", l_put_adapter},
                                       {"truncate", l_truncate},
                                       {"rows", l_rows},
                                       {"resumed", l_resumed},
                                       {"path", l_rpath},
                                       {"save", l_save},
                                       {"close", l_rclose},
                                       {NULL, NULL}};
    luaL_newmetatable(L, RESULTS_MT);
    lua_newtable(L);
    luaL_setfuncs(L, methods, 0);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_rclose);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, l_rclose);
    lua_setfield(L, -2, "__close");
    lua_pushcfunction(L, l_rtostring);
    lua_setfield(L, -2, "__tostring");
    lua_pop(L, 1);
    static const luaL_Reg fns[] = {{"results", l_results},
                                   {"results_read", l_results_read},
                                   {"results_read_all", l_results_read_all},
                                   {"results_list", l_results_list},
                                   {"results_merge", l_results_merge},
                                   {"write_text", l_write_text},
                                   {"plot", l_plot},
                                   {NULL, NULL}};
    gm_bind_add_functions(L, fns);
    lua_getfield(L, LUA_REGISTRYINDEX, ROOT_KEY);
    bool unset = lua_isnil(L, -1);
    lua_pop(L, 1);
    if (unset) gm_lua_set_results_root(L, "results");
}

void gm_bind_check_write_path(lua_State *L, const char *path, const char *fn) { check_write_path(L, path, fn); }

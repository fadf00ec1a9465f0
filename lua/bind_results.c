/*
 * bind_results.c - Lua bindings for trial results files and the text tables written next to
 * them: with gm.plot (lua/bind_plot.c) and trainer:save (lua/bind_train.c), the only way an
 * experiment file (or the runner, lua/runner.lua) writes to the disk.
 *
 *   gm.results(path)                 -> results (opens or creates results/<exp>/trial-<id>.h5)
 *     r:set{experiment=, trial_id=, trial_index=, n_trials=, status=, reason=, config_json=,
 *           report_json=, swept_json=, started_at=, finished_at=, wall_seconds=}
 *           (*_json: JSON text, stored as given, or a Lua table, encoded with sorted keys)
 *     r:set_config{field = string|number|boolean, ...}   (nested tables: "a.b" keys; lists: JSON
 *           text); also stores config_json unless r:set gave one
 *     r:append{name = number, ...}   one logged row (series missing from it get NaN)
 *     r:set_eval(phase, {accuracy=, loss=, n_examples=, labels={..}, per_class={..},
 *           confusion={{..},..}, example_index={..}, predictions={..}, references={..},
 *           <other name> = number, ...})   (replaces the phase; the per-example lists hold
 *           integers as stored: 0-based test-set positions and class indices)
 *     r:set_memory{planned={[kind]=bytes}, measured={[kind]=bytes}, measured_peak_rss=bytes}
 *     r:set_data{n_train=, n_test=, n_rejected=, n_truncated=, rejections={{example=, reason=}}}
 *     r:set_provenance{name = string, ...}   /provenance attributes (lua/runner.lua: what produced it)
 *     r:put_adapter(trainer)         the trainer's trained tensors (LoRA, a trained projector) under /adapter/<PEFT key>
 *     r:truncate(rows), r:rows(), r:resumed(), r:path(), r:save(), r:close()
 *   gm.results_read(path)            -> trial table | nil, "no such file"
 *   gm.results_read_all(path)        -> {trial, ...} from a folder, a trial file or a merged file
 *   gm.results_list(dir)             -> {path, ...} (trial-*.h5, sorted; {} if dir is missing)
 *   gm.results_merge(dir, out [, {adapters = false}])
 *   gm.write_text(path, text)        written atomically (gm_write_file_atomic)
 *   gm.results_compare(a, b [, {skip = {name, ..}}]) -> {compared=, differ=, values=, max_abs=,
 *                                    worst=}: two trial files' numbers (gm_results_compare)
 *
 * Every path written here must lie inside the results folder (the rule is lua/write_rule.h).
 * Tables given for JSON attributes are encoded by lua/bind_json.h with empty tables as [] (the
 * fields that may be empty hold lists). Read back, a JSON attribute that holds null (swept_json
 * of an experiment without a sweep) is a missing field (nil); nulls inside a value are gm.null.
 *
 * Ownership: a results userdata owns its file's in-memory image until r:close or the GC
 * (unsaved changes are dropped: saving is explicit). Errors: Lua errors with the core's
 * message; a refused path is a usage error (exit code 2).
 */
#define _GNU_SOURCE
#include "bind_json.h"
#include "bind_util.h"
#include "gm_lua.h"
#include "write_rule.h"

#include "gm_alloc.h"
#include "gm_file.h"
#include "gm_results.h"
#include "gm_train.h"

#include <errno.h>
#include <lauxlib.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define RESULTS_MT "gm.Results"

typedef struct lresults {
    gm_results *r;
    bool config_json_given; // r:set{config_json=} was used: set_config leaves it alone
} lresults;

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
    gm_bind_check_write_path(L, path, "gm.results");
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

/* Reads the list at field `key` of table idx into a new userdata array (pushed): doubles, or
 * int64_t when `integers` (each element must then be a Lua integer); returns its length (-1
 * when absent, with nil pushed: one stack slot per list either way). */
static lua_Integer opt_list(lua_State *L, int idx, const char *key, bool integers, void **out,
                            const char *fn) {
    lua_getfield(L, idx, key);
    if (lua_isnil(L, -1)) {
        *out = NULL;
        return -1; // the nil stays: one slot per list
    }
    const char *what = integers ? "integer" : "number";
    if (!lua_istable(L, -1)) luaL_error(L, "%s: '%s' must be a list of %ss", fn, key, what);
    lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
    void *v = lua_newuserdatauv(L, (size_t)(n ? n : 1) * 8, 0); // double and int64_t: 8 bytes
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, -2, i);
        if (integers ? !lua_isinteger(L, -1) : lua_type(L, -1) != LUA_TNUMBER)
            luaL_error(L, "%s: %s[%d] must be a%s %s", fn, key, (int)i, integers ? "n" : "", what);
        if (integers) ((int64_t *)v)[i - 1] = (int64_t)lua_tointeger(L, -1);
        else ((double *)v)[i - 1] = (double)lua_tonumber(L, -1);
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
    static const char *const known_keys[] = {
        "accuracy",      "loss",        "n_examples", "labels", "per_class", "confusion",
        "example_index", "predictions", "references", "example_word_errors", "example_words",
        "example_phone_errors", "example_phones", NULL};
    lua_pushnil(L);
    while (lua_next(L, 3)) {
        bool known = false;
        for (int i = 0; lua_type(L, -2) == LUA_TSTRING && known_keys[i]; i++)
            known = known || strcmp(lua_tostring(L, -2), known_keys[i]) == 0;
        if (!known && (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TNUMBER))
            luaL_error(L,
                       "results:set_eval: '%s' must be a number (known keys: accuracy, loss, "
                       "n_examples, labels, per_class, confusion, example_index, predictions, "
                       "references, example_word_errors, example_words, example_phone_errors, example_phones; "
                       "others are stored as numbers)",
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
    lua_Integer np = opt_list(L, 3, "per_class", false, (void **)&per_class, "results:set_eval");
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
    // per-example lists: one length
    int64_t *ex[GM_RESULTS_EX_LISTS] = {NULL};
    const char *const *ex_names = gm_results_ex_names;
    lua_Integer n_ex = -1;
    for (int i = 0; i < GM_RESULTS_EX_LISTS; i++) {
        lua_Integer n = opt_list(L, 3, ex_names[i], true, (void **)&ex[i], "results:set_eval");
        if (n >= 0 && n_ex >= 0 && n != n_ex)
            luaL_error(L, "results:set_eval: %s has %d entries, %s %d", ex_names[i], (int)n,
                       ex_names[0], (int)n_ex);
        if (n >= 0) n_ex = n;
    }
    if (n_ex >= 0 && !ex[0])
        luaL_error(L, "results:set_eval: per-example lists need example_index");
    e.n_per_example = n_ex > 0 ? n_ex : 0;
    e.example_index = ex[0];
    e.predictions = ex[1];
    e.references = ex[2];
    e.word_errors = ex[3], e.words = ex[4], e.phone_errors = ex[5], e.phones = ex[6];
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

/* r:set_provenance{name = string, ...}: every value a string (numbers are converted). */
static int l_set_provenance(lua_State *L) {
    lresults *u = check_res(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_pushnil(L);
    while (lua_next(L, 2)) { // check everything before writing anything
        if (lua_type(L, -2) != LUA_TSTRING || (lua_type(L, -1) != LUA_TSTRING && lua_type(L, -1) != LUA_TNUMBER))
            luaL_error(L, "results:set_provenance: expected {name = string, ...}");
        lua_pop(L, 1);
    }
    gm_error err = {0};
    lua_pushnil(L);
    while (lua_next(L, 2)) {
        lua_pushvalue(L, -1);
        gm_status s = gm_results_set_provenance(u->r, lua_tostring(L, -3), lua_tostring(L, -1), &err);
        lua_pop(L, 2);
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
    const gm_train_param *p = gm_trainer_params(tr, &n);
    gm_error err = {0};
    for (int i = 0; i < n; i++) /* LoRA A / B of every adapter, and the projector when trained */
        raise_if(L, gm_results_put_tensor(u->r, p[i].name, p[i].p, p[i].ndim, p[i].shape, &err), &err);
    lua_pushinteger(L, n);
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
        const int64_t *vals[GM_RESULTS_EX_LISTS];
        gm_results_eval_read_values(e, vals);
        for (int k = 0; k < GM_RESULTS_EX_LISTS; k++) {
            const int64_t *v = vals[k];
            if (!v) continue;
            lua_createtable(L, (int)e->n_per_example, 0);
            for (int64_t j = 0; j < e->n_per_example; j++) {
                lua_pushinteger(L, (lua_Integer)v[j]);
                lua_rawseti(L, -2, (lua_Integer)j + 1);
            }
            lua_setfield(L, -2, gm_results_ex_names[k]);
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
    push_attrs(L, &t->provenance);
    lua_setfield(L, tt, "provenance");
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
    gm_bind_check_write_path(L, out, "gm.results_merge");
    gm_error err = {0};
    if (gm_results_merge(dir, out, adapters, &err) != GM_OK) return gm_bind_raise(L, &err);
    return 0;
}

/* ---- text files ----------------------------------------------------------------------------- */

static int l_write_text(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    size_t n;
    const char *text = luaL_checklstring(L, 2, &n);
    gm_bind_check_write_path(L, path, "gm.write_text");
    // tmp + fsync + rename: a reader never sees half a table, a crash leaves the old one
    gm_error err = {0};
    if (gm_write_file_atomic(path, text, n, &err) != GM_OK) return luaL_error(L, "gm.write_text: %s", err.msg);
    return 0;
}

/* gm.results_compare(a, b [, {skip = {name, ...}}]) -> {compared, differ, values, max_abs, worst} */
static int l_results_compare(lua_State *L) {
    const char *a = luaL_checkstring(L, 1), *b = luaL_checkstring(L, 2);
    static const char *const allowed[] = {"skip", NULL};
    gm_bind_check_opts(L, 3, "gm.results_compare", allowed);
    const char *skip[33] = {NULL};
    if (lua_istable(L, 3)) {
        lua_getfield(L, 3, "skip");
        int n = lua_istable(L, -1) ? (int)lua_rawlen(L, -1) : 0;
        if (n > 32) luaL_error(L, "gm.results_compare: at most 32 names to skip");
        for (int i = 0; i < n; i++) {
            lua_rawgeti(L, -1, i + 1);
            skip[i] = lua_tostring(L, -1); // alive: held by the skip table
            if (!skip[i]) luaL_error(L, "gm.results_compare: skip[%d] must be a string", i + 1);
            lua_pop(L, 1);
        }
    }
    gm_results_diff d;
    gm_error err = {0};
    raise_if(L, gm_results_compare(a, b, skip, &d, &err), &err);
    lua_createtable(L, 0, 5);
    lua_pushinteger(L, (lua_Integer)d.n_compared);
    lua_setfield(L, -2, "compared");
    lua_pushinteger(L, (lua_Integer)d.n_differ);
    lua_setfield(L, -2, "differ");
    lua_pushinteger(L, (lua_Integer)d.n_values);
    lua_setfield(L, -2, "values");
    lua_pushnumber(L, d.max_abs);
    lua_setfield(L, -2, "max_abs");
    lua_pushstring(L, d.worst);
    lua_setfield(L, -2, "worst");
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
                                       {"set_provenance", l_set_provenance},
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
                                   {"results_compare", l_results_compare},
                                   {"write_text", l_write_text},
                                   {NULL, NULL}};
    gm_bind_add_functions(L, fns);
}

/*
 * gm_lua.c - sandboxed Lua state, error handling with tracebacks, the embedded prelude, and
 * running experiment files in their own environment.
 *
 * The sandbox is an allow-list [Redis scripting]: we open only the libraries we want with
 * luaL_requiref and then delete the dangerous members, instead of opening everything and hoping
 * to remove enough. What an experiment file sees of that state is decided by the prelude
 * (M.file_env, lua/prelude.lua): this file only installs the table it makes as the _ENV of each
 * file's main chunk.
 */
#include "gm_lua.h"

#include <lauxlib.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- limits on experiment code ----------------------------------------------------------------
 * An experiment file is code: an endless loop at its top level or an endless allocation must end
 * with an error that names the place, not hang or swap. Two budgets, both in the allocator's
 * user data (one per state, freed after lua_close):
 *   - memory: the state's allocator counts the bytes the Lua heap holds and refuses to grow
 *     past max_memory; Lua then runs an emergency collection and, if that is not enough,
 *     raises a memory error (Lua 5.4 manual §4.3, lua_Alloc);
 *   - instructions: while an experiment file's top level runs, a count hook (lua_sethook,
 *     LUA_MASKCOUNT, as lua.c's Ctrl-C handler) adds up VM instructions and raises a usage
 *     error past max_instructions. The hook also remembers the file:line it last saw, so a
 *     memory error (whose message handler Lua does not call) can name the place too. */
#define HOOK_EVERY 1000 /* instructions between two calls of the count hook */

typedef struct lua_limits {
    long long max_instructions, max_memory; /* < 0: unlimited */
    long long instructions;                 /* counted in the current top-level run */
    size_t used;                            /* bytes held by the Lua heap */
    bool mem_refused;                       /* the allocator refused a request (reset per call) */
    bool in_file;                           /* an experiment file's top level is running */
    bool verbose;                           /* tracebacks for errors in experiment files */
    char where[300];                        /* the experiment file's file:line last seen */
} lua_limits;

static lua_limits *limits_of(lua_State *L) {
    void *ud = NULL;
    lua_getallocf(L, &ud);
    return ud;
}

/* lua_Alloc with a budget: ptr == NULL means a new block (osize is then the object's type). */
static void *limited_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
    lua_limits *lim = ud;
    size_t old = ptr ? osize : 0;
    if (nsize == 0) {
        free(ptr);
        lim->used = lim->used > old ? lim->used - old : 0;
        return NULL;
    }
    if (nsize > old && lim->max_memory >= 0 && lim->used + (nsize - old) > (size_t)lim->max_memory) {
        lim->mem_refused = true;
        return NULL;
    }
    void *p = realloc(ptr, nsize);
    if (p) lim->used = lim->used - old + nsize;
    return p;
}

/* "file:line" of the innermost frame that belongs to a file loaded from disk ("@..." chunks; the
 * prelude, runner and report are "=lua/..."), or "" if none. */
static void user_where(lua_State *L, char *out, size_t cap) {
    lua_Debug d;
    out[0] = '\0';
    for (int lv = 0; lua_getstack(L, lv, &d); lv++) {
        if (!lua_getinfo(L, "Sl", &d)) continue;
        if (d.source && d.source[0] == '@' && d.currentline > 0) {
            snprintf(out, cap, "%s:%d", d.short_src, d.currentline);
            return;
        }
    }
}

static void raise_usage(lua_State *L, const char *msg) {
    lua_createtable(L, 0, 2);
    lua_pushboolean(L, 1);
    lua_setfield(L, -2, "usage");
    lua_pushstring(L, msg);
    lua_setfield(L, -2, "msg");
    lua_error(L);
}

static void count_hook(lua_State *L, lua_Debug *ar) {
    (void)ar;
    lua_limits *lim = limits_of(L);
    lim->instructions += HOOK_EVERY;
    user_where(L, lim->where, sizeof lim->where);
    if (lim->max_instructions >= 0 && lim->instructions > lim->max_instructions) {
        char msg[600];
        snprintf(msg, sizeof msg,
                 "%s%sthe experiment file ran more than %lld million Lua instructions at its top level "
                 "(an endless loop?); if it really needs more, raise the budget with --max-lua-instructions N",
                 lim->where, lim->where[0] ? ": " : "", lim->max_instructions / 1000000);
        raise_usage(L, msg);
    }
}

/* Message handler: append a traceback to the error message. Usage errors raised by the prelude
 * (tables {usage = true, msg = "file:line: ..."}) need no traceback: they are the user's to fix
 * and name the place already; they come back prefixed "usage:". */
static int traceback(lua_State *L) {
    if (lua_istable(L, 1)) {
        lua_getfield(L, 1, "usage");
        bool usage = lua_toboolean(L, -1);
        lua_pop(L, 1);
        if (usage) {
            lua_getfield(L, 1, "msg");
            lua_pushfstring(L, "usage:%s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "invalid experiment");
            return 1;
        }
    }
    const char *msg = lua_tostring(L, 1);
    if (!msg) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
        msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    luaL_traceback(L, L, msg, 1);
    return 1;
}

static void open_lib(lua_State *L, const char *name, lua_CFunction fn) {
    luaL_requiref(L, name, fn, 1);
    lua_pop(L, 1);
}

static void remove_field(lua_State *L, const char *table, const char *field) {
    lua_getglobal(L, table);
    if (lua_istable(L, -1)) {
        lua_pushnil(L);
        lua_setfield(L, -2, field);
    }
    lua_pop(L, 1);
}

/* A sandbox refusal is bad input, like a typo (exit code 2): raised as a usage error object
 * ({usage = true, msg = "file:line: ..."}), which the traceback handler passes through as is. */
static int denied(lua_State *L) {
    luaL_where(L, 1);
    lua_createtable(L, 0, 2);
    lua_pushboolean(L, 1);
    lua_setfield(L, -2, "usage");
    lua_pushfstring(L, "%s%s is not allowed in experiment files (run gemmarun with --allow-os to permit it)",
                    lua_tostring(L, -2), lua_tostring(L, lua_upvalueindex(1)));
    lua_setfield(L, -2, "msg");
    return lua_error(L);
}

static void deny_global(lua_State *L, const char *name) {
    lua_pushstring(L, name);
    lua_pushcclosure(L, denied, 1);
    lua_setglobal(L, name);
}

static void deny(lua_State *L, const char *table, const char *field, const char *label) {
    lua_getglobal(L, table);
    if (lua_istable(L, -1)) {
        lua_pushstring(L, label);
        lua_pushcclosure(L, denied, 1);
        lua_setfield(L, -2, field);
    }
    lua_pop(L, 1);
}

const gm_embedded *gm_lua_module(const char *name) {
    for (const gm_embedded *m = gm_embedded_modules; m->name; m++)
        if (strcmp(m->name, name) == 0) return m;
    return NULL;
}

/* gm_module(name): loads an embedded lua/<name>.lua once and returns its value (cached in the
 * registry), the sandbox's replacement for require. */
static int l_module(lua_State *L) {
    const char *name = luaL_checkstring(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, "gm.modules");
    lua_getfield(L, -1, name);
    if (!lua_isnil(L, -1)) return 1;
    lua_pop(L, 1);
    const gm_embedded *m = gm_lua_module(name);
    if (!m || strcmp(name, "prelude") == 0) return luaL_error(L, "no embedded module '%s'", name);
    char chunk[96];
    snprintf(chunk, sizeof chunk, "=lua/%s.lua", name);
    if (luaL_loadbufferx(L, (const char *)m->data, m->len, chunk, "t") != LUA_OK) return lua_error(L);
    lua_call(L, 0, 1);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        lua_pushboolean(L, 1);
    }
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, name);
    return 1;
}

#define FILE_ENV_KEY "gm.file_env" /* registry: the prelude's M.file_env */

/* Message handler for an experiment file's top level: the user's errors are one line (the message
 * names file:line already; a usage error object passes as "usage:" + message), the traceback only
 * with --verbose; every error there counts as the user's (exit code 2). */
static int file_traceback(lua_State *L) {
    if (lua_istable(L, 1)) return traceback(L); /* a usage error object: "usage:" + its message */
    const char *msg = lua_tostring(L, 1);
    if (!msg) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) msg = lua_tostring(L, -1);
        else msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    if (limits_of(L)->verbose) {
        luaL_traceback(L, L, msg, 1);
        msg = lua_tostring(L, -1);
    }
    lua_pushfstring(L, "usage:%s", msg);
    return 1;
}

static gm_status pcall_tb(lua_State *L, int nargs, int nres, const char *what, gm_error *err) {
    lua_limits *lim = limits_of(L);
    int base = lua_gettop(L) - nargs;
    lua_pushcfunction(L, lim->in_file ? file_traceback : traceback);
    lua_insert(L, base);
    lim->mem_refused = false;
    int rc = lua_pcall(L, nargs, nres, base);
    lua_remove(L, base);
    if (rc != LUA_OK) {
        if (rc == LUA_ERRMEM) { /* Lua does not call the message handler for memory errors */
            gm_status code = lim->in_file ? GM_ERR_INVALID : GM_ERR_NOMEM;
            if (lim->mem_refused)
                gm_error_set(err, code,
                             "%s%sthe Lua heap reached its limit of %lld MiB (an endless allocation?); if the "
                             "experiment really needs more, raise it with --max-lua-memory SIZE",
                             lim->where, lim->where[0] ? ": " : "", lim->max_memory >> 20);
            else gm_error_set(err, code, "%s%sout of memory in Lua", lim->where, lim->where[0] ? ": " : "");
            lua_pop(L, 1);
            return code;
        }
        /* the traceback handler turned a usage error object ({usage = true, msg = ...}, raised
         * by the prelude's validation) into "usage:" + message */
        const char *msg = lua_tostring(L, -1) ? lua_tostring(L, -1) : "(no message)";
        gm_status code = GM_ERR_RUNTIME;
        if (strncmp(msg, "usage:", 6) == 0) {
            code = GM_ERR_INVALID;
            msg += 6;
        }
        gm_error_set(err, code, "%s", msg);
        lua_pop(L, 1);
        (void)what;
        return code;
    }
    return GM_OK;
}

gm_status gm_lua_new(const gm_lua_opts *opts, lua_State **out, gm_error *err) {
    *out = NULL;
    lua_limits *lim = calloc(1, sizeof *lim);
    lua_State *L = lim ? luaL_newstate() : NULL;
    if (!L) {
        free(lim);
        return gm_error_set(err, GM_ERR_NOMEM, "cannot create the Lua state");
    }
    /* luaL_newstate's allocator is realloc/free too, so the blocks it made are ours to resize */
    lim->max_instructions = opts && opts->max_instructions ? opts->max_instructions : GM_LUA_MAX_INSTRUCTIONS;
    lim->max_memory = opts && opts->max_memory ? opts->max_memory : GM_LUA_MAX_MEMORY;
    lim->verbose = opts && opts->verbose;
    lim->used = (size_t)lua_gc(L, LUA_GCCOUNT) * 1024u + (size_t)lua_gc(L, LUA_GCCOUNTB);
    lua_setallocf(L, limited_alloc, lim);
    open_lib(L, LUA_GNAME, luaopen_base);
    open_lib(L, LUA_STRLIBNAME, luaopen_string);
    open_lib(L, LUA_TABLIBNAME, luaopen_table);
    open_lib(L, LUA_MATHLIBNAME, luaopen_math);
    open_lib(L, LUA_UTF8LIBNAME, luaopen_utf8);
    open_lib(L, LUA_OSLIBNAME, luaopen_os);
    open_lib(L, LUA_DBLIBNAME, luaopen_debug); /* the prelude keeps debug.getinfo, then removes it */
    if (opts && opts->allow_os) {
        open_lib(L, LUA_IOLIBNAME, luaopen_io);
        open_lib(L, LUA_LOADLIBNAME, luaopen_package);
    } else {
        /* base: no file loading; load() takes text only */
        deny_global(L, "dofile");
        deny_global(L, "loadfile");
        deny_global(L, "require");
        /* load() is wrapped by the prelude to accept text chunks only */
        /* os: keep clock/time/date/getenv/difftime; deny the rest with a clear message */
        deny(L, "os", "execute", "os.execute");
        deny(L, "os", "exit", "os.exit");
        deny(L, "os", "remove", "os.remove");
        deny(L, "os", "rename", "os.rename");
        deny(L, "os", "tmpname", "os.tmpname");
        remove_field(L, "os", "setlocale");
        /* io is absent; give a clear message if a file tries it */
        lua_newtable(L);
        static const char *io_fns[] = {"open", "popen", "write", "read", "lines", "output", "input", "tmpfile", NULL};
        for (int i = 0; io_fns[i]; i++) {
            char label[32];
            snprintf(label, sizeof label, "io.%s", io_fns[i]);
            lua_pushstring(L, label);
            lua_pushcclosure(L, denied, 1);
            lua_setfield(L, -2, io_fns[i]);
        }
        lua_setglobal(L, "io");
    }
    lua_pushinteger(L, opts && opts->n_threads > 0 ? opts->n_threads : 2);
    lua_setglobal(L, "GM_THREADS");
    lua_pushboolean(L, opts && opts->allow_os);
    lua_setglobal(L, "GM_ALLOW_OS");
    gm_lua_open_model(L);
    gm_lua_open_json(L);
    gm_lua_open_train(L);
    gm_lua_open_results(L);
    gm_lua_open_plot(L);
    gm_lua_open_stats(L);
    gm_lua_open_run(L);
    gm_lua_open_proc(L);
    gm_lua_open_dist(L);
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, "gm.modules");
    lua_pushcfunction(L, l_module);
    lua_setglobal(L, "gm_module");
    const gm_embedded *prelude = gm_lua_module("prelude");
    gm_status s = gm_lua_run_string(L, (const char *)prelude->data, prelude->len, "=lua/prelude.lua", err);
    if (s == GM_OK) {
        lua_getglobal(L, "GM_PRELUDE");
        if (lua_istable(L, -1)) lua_getfield(L, -1, "file_env");
        if (!lua_isfunction(L, -1)) s = gm_error_set(err, GM_ERR_RUNTIME, "it defines no GM_PRELUDE.file_env");
        else lua_setfield(L, LUA_REGISTRYINDEX, FILE_ENV_KEY);
    }
    if (s != GM_OK) {
        gm_error_prefix(err, "internal error in the embedded prelude");
        gm_lua_close(L);
        return s;
    }
    lua_settop(L, 0);
    *out = L;
    return GM_OK;
}

void gm_lua_close(lua_State *L) {
    if (!L) return;
    lua_limits *lim = limits_of(L);
    lua_close(L);
    free(lim);
}

/* Runs the chunk below the value on top (the file's `arg` table, or nil) in a fresh
 * environment from the prelude's file_env(arg), leaving its results. */
static gm_status run_in_file_env(lua_State *L, const char *name, gm_error *err) {
    lua_getfield(L, LUA_REGISTRYINDEX, FILE_ENV_KEY);
    lua_insert(L, -2);
    gm_status s = pcall_tb(L, 1, 1, name, err);
    if (s != GM_OK) {
        lua_pop(L, 1); /* the chunk */
        gm_error_prefix(err, "internal error making the experiment file's environment");
        return s;
    }
    /* a main chunk has exactly one upvalue, _ENV */
    if (!lua_setupvalue(L, -2, 1)) lua_pop(L, 1);
    lua_limits *lim = limits_of(L);
    bool outer = !lim->in_file; /* a file run from a file (load) counts in the outer budget */
    if (outer) {
        lim->in_file = true;
        lim->instructions = 0;
        lim->where[0] = '\0';
        lua_sethook(L, count_hook, LUA_MASKCOUNT, HOOK_EVERY);
    }
    s = pcall_tb(L, 0, LUA_MULTRET, name, err);
    if (outer) {
        lua_sethook(L, NULL, 0, 0);
        lim->in_file = false;
    }
    return s;
}

gm_status gm_lua_run_file(lua_State *L, const char *path, const char *const *args, int nargs, gm_error *err) {
    int rc = luaL_loadfilex(L, path, "t");
    if (rc != LUA_OK) { /* a missing file or a syntax error: bad usage, nothing ran */
        gm_error_set(err, rc == LUA_ERRFILE ? GM_ERR_IO : GM_ERR_INVALID, "%s", lua_tostring(L, -1));
        lua_pop(L, 1);
        return err ? err->code : GM_ERR_INVALID;
    }
    lua_createtable(L, nargs, 1);
    lua_pushstring(L, path);
    lua_rawseti(L, -2, 0);
    for (int i = 0; i < nargs; i++) {
        lua_pushstring(L, args[i]);
        lua_rawseti(L, -2, i + 1);
    }
    return run_in_file_env(L, path, err);
}

gm_status gm_lua_run_experiment(lua_State *L, const char *src, size_t len, const char *name, gm_error *err) {
    int rc = luaL_loadbufferx(L, src, len, name, "t");
    if (rc != LUA_OK) {
        gm_error_set(err, GM_ERR_INVALID, "%s", lua_tostring(L, -1));
        lua_pop(L, 1);
        return GM_ERR_INVALID;
    }
    lua_pushnil(L); /* no arg */
    return run_in_file_env(L, name, err);
}

gm_status gm_lua_run_string(lua_State *L, const char *src, size_t len, const char *name, gm_error *err) {
    int rc = luaL_loadbufferx(L, src, len, name, "t");
    if (rc != LUA_OK) {
        gm_error_set(err, GM_ERR_INVALID, "%s", lua_tostring(L, -1));
        lua_pop(L, 1);
        return GM_ERR_INVALID;
    }
    return pcall_tb(L, 0, LUA_MULTRET, name, err);
}

gm_status gm_lua_call(lua_State *L, int nargs, int nres, gm_error *err) { return pcall_tb(L, nargs, nres, "call", err); }

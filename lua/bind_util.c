/*
 * bind_util.c - shared helpers of the Lua bindings; see bind_util.h.
 */
#include "bind_util.h"

#include <lauxlib.h>
#include <stdarg.h>
#include <string.h>

/* Raises a Lua error with the core's message (the caller released what it held). */
int gm_bind_raise(lua_State *L, const gm_error *err) { return luaL_error(L, "%s", err->msg); }

int gm_bind_usage_error(lua_State *L, const char *fmt, ...) {
    luaL_where(L, 1);
    va_list ap;
    va_start(ap, fmt);
    lua_pushvfstring(L, fmt, ap);
    va_end(ap);
    lua_concat(L, 2);
    lua_createtable(L, 0, 2);
    lua_pushboolean(L, 1);
    lua_setfield(L, -2, "usage");
    lua_insert(L, -2);
    lua_setfield(L, -2, "msg");
    return lua_error(L);
}

void gm_bind_add_functions(lua_State *L, const luaL_Reg *fns) {
    lua_getglobal(L, "gm");
    luaL_setfuncs(L, fns, 0);
    lua_pop(L, 1);
}

/* Checks that every key of the options table at idx is one of `allowed`. */
void gm_bind_check_opts(lua_State *L, int idx, const char *fn, const char *const *allowed) {
    if (lua_isnoneornil(L, idx)) return;
    luaL_checktype(L, idx, LUA_TTABLE);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
        bool ok = false;
        for (int i = 0; k && allowed[i]; i++) ok = ok || strcmp(k, allowed[i]) == 0;
        if (!ok) {
            luaL_Buffer b;
            luaL_buffinit(L, &b);
            for (int i = 0; allowed[i]; i++) {
                if (i) luaL_addstring(&b, ", ");
                luaL_addstring(&b, allowed[i]);
            }
            luaL_pushresult(&b);
            if (k) luaL_error(L, "%s: unknown option '%s' (allowed: %s)", fn, k, lua_tostring(L, -1));
            luaL_error(L, "%s: option keys must be names, got a %s key (allowed: %s)", fn, luaL_typename(L, -2),
                       lua_tostring(L, -1));
        }
    }
}

lua_Integer gm_bind_opt_int(lua_State *L, int idx, const char *key, lua_Integer def) {
    if (lua_isnoneornil(L, idx)) return def;
    lua_getfield(L, idx, key);
    lua_Integer v = def;
    if (!lua_isnil(L, -1)) {
        int exact = 0;
        lua_Integer i = lua_tointegerx(L, -1, &exact); /* 2.0 is accepted as 2, 2.5 is not */
        if (!exact || lua_type(L, -1) != LUA_TNUMBER) luaL_error(L, "option '%s' must be an integer", key);
        v = i;
    }
    lua_pop(L, 1);
    return v;
}

lua_Number gm_bind_opt_num(lua_State *L, int idx, const char *key, lua_Number def) {
    if (lua_isnoneornil(L, idx)) return def;
    lua_getfield(L, idx, key);
    lua_Number v = def;
    if (!lua_isnil(L, -1)) {
        if (!lua_isnumber(L, -1)) luaL_error(L, "option '%s' must be a number", key);
        v = lua_tonumber(L, -1);
    }
    lua_pop(L, 1);
    return v;
}

bool gm_bind_opt_bool(lua_State *L, int idx, const char *key, bool def) {
    if (lua_isnoneornil(L, idx)) return def;
    lua_getfield(L, idx, key);
    bool v = def;
    if (!lua_isnil(L, -1)) {
        if (!lua_isboolean(L, -1)) luaL_error(L, "option '%s' must be true or false", key);
        v = lua_toboolean(L, -1);
    }
    lua_pop(L, 1);
    return v;
}

const char *gm_bind_opt_str(lua_State *L, int idx, const char *key, const char *def) {
    if (lua_isnoneornil(L, idx)) return def;
    lua_getfield(L, idx, key);
    const char *v = def;
    if (!lua_isnil(L, -1)) {
        if (lua_type(L, -1) != LUA_TSTRING) luaL_error(L, "option '%s' must be a string", key);
        v = lua_tostring(L, -1);
    }
    lua_pop(L, 1); /* the string stays alive: it is still referenced by the table */
    return v;
}

/*
 * bind_json.c - the JSON <-> Lua codec (rules in bind_json.h) and its bindings:
 *
 *   gm.json_encode(value) -> text     canonical: sorted keys, %.17g floats (trial ids hash it)
 *   gm.json_decode(text) -> value     null -> gm.null; raises "invalid JSON near byte N"
 *   gm.null                           the JSON null sentinel (an empty table, compared by identity)
 *
 * The encoder writes into a growable userdata kept at a fixed stack slot rather than a
 * luaL_Buffer: a luaL_Buffer may only be used with the stack balanced around each call, and the
 * encoder pushes table entries between its writes (the earlier encoder broke that rule and
 * crashed on any text over the buffer's first 1 KiB). The userdata also means a raise in the
 * middle leaks nothing.
 */
#include "bind_json.h"
#include "bind_util.h"
#include "gm_lua.h"

#include <cjson/cJSON.h>
#include <lauxlib.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NULL_KEY "gm.null"   /* registry: the sentinel table */
#define MAX_DEPTH 64

bool gm_json_is_null(lua_State *L, int idx) {
    idx = lua_absindex(L, idx);
    if (!lua_istable(L, idx)) return false;
    lua_getfield(L, LUA_REGISTRYINDEX, NULL_KEY);
    bool is_null = lua_rawequal(L, -1, idx);
    lua_pop(L, 1);
    return is_null;
}

/* ---- encoding ---------------------------------------------------------------------------- */

typedef struct jout {
    lua_State *L;
    const gm_json_enc *how;
    int slot; /* stack slot of the userdata holding p */
    char *p;
    size_t n, cap;
} jout;

static void grow(jout *o, size_t more) {
    size_t cap = o->cap ? o->cap : 256;
    while (cap - o->n < more) {
        if (cap > SIZE_MAX / 2) luaL_error(o->L, "%s: out of memory", o->how->what);
        cap *= 2;
    }
    char *p = lua_newuserdatauv(o->L, cap, 0);
    if (o->n) memcpy(p, o->p, o->n);
    lua_replace(o->L, o->slot); /* the old block is garbage now */
    o->p = p;
    o->cap = cap;
}

static void put(jout *o, const char *s, size_t n) {
    if (o->cap - o->n < n) grow(o, n);
    memcpy(o->p + o->n, s, n);
    o->n += n;
}

static void put_str(jout *o, const char *s) { put(o, s, strlen(s)); }

static void put_quoted(jout *o, const char *s, size_t n) {
    put(o, "\"", 1);
    size_t run = 0; /* bytes that need no escape, written in one go */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c != '"' && c != '\\' && c >= 0x20) continue;
        put(o, s + run, i - run);
        char esc[8];
        if (c == '"' || c == '\\') snprintf(esc, sizeof esc, "\\%c", c);
        else snprintf(esc, sizeof esc, "\\u%04x", c);
        put_str(o, esc);
        run = i + 1;
    }
    put(o, s + run, n - run);
    put(o, "\"", 1);
}

typedef struct jkey {
    const char *s;
    size_t n;
} jkey;

/* Bytewise order, as strcmp for keys without NUL bytes (the order trial ids were made with). */
static int cmp_key(const void *a, const void *b) {
    const jkey *x = a, *y = b;
    int c = memcmp(x->s, y->s, x->n < y->n ? x->n : y->n);
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

static void encode(jout *o, int idx, int depth);

static void encode_table(jout *o, int idx, int depth) {
    lua_State *L = o->L;
    if (gm_json_is_null(L, idx)) {
        put_str(o, "null");
        return;
    }
    if (depth >= MAX_DEPTH) luaL_error(L, "%s: nesting too deep for JSON", o->how->what);
    luaL_checkstack(L, 6, "JSON encoding");
    lua_Integer n = (lua_Integer)lua_rawlen(L, idx), count = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        count++;
        lua_pop(L, 1);
    }
    if (count == n && (n > 0 || o->how->empty_is_array)) {
        put(o, "[", 1);
        for (lua_Integer i = 1; i <= n; i++) {
            if (i > 1) put(o, ",", 1);
            lua_rawgeti(L, idx, i);
            encode(o, lua_gettop(L), depth + 1);
            lua_pop(L, 1);
        }
        put(o, "]", 1);
        return;
    }
    /* an object: keys sorted, each a string (pointers stay valid: the keys are in the table) */
    jkey *keys = lua_newuserdatauv(L, (size_t)(count ? count : 1) * sizeof *keys, 0);
    int anchor = lua_gettop(L);
    lua_Integer k = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TSTRING)
            luaL_error(L, "%s: JSON object keys must be strings, got a %s key", o->how->what,
                       luaL_typename(L, -1));
        keys[k].s = lua_tolstring(L, -1, &keys[k].n);
        k++;
    }
    qsort(keys, (size_t)count, sizeof *keys, cmp_key);
    put(o, "{", 1);
    for (lua_Integer i = 0; i < count; i++) {
        if (i > 0) put(o, ",", 1);
        put_quoted(o, keys[i].s, keys[i].n);
        put(o, ":", 1);
        lua_pushlstring(L, keys[i].s, keys[i].n);
        lua_rawget(L, idx);
        encode(o, lua_gettop(L), depth + 1);
        lua_pop(L, 1);
    }
    put(o, "}", 1);
    lua_remove(L, anchor);
}

static void encode(jout *o, int idx, int depth) {
    lua_State *L = o->L;
    char num[64];
    switch (lua_type(L, idx)) {
    case LUA_TNIL: put_str(o, "null"); return;
    case LUA_TBOOLEAN: put_str(o, lua_toboolean(L, idx) ? "true" : "false"); return;
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx)) {
            snprintf(num, sizeof num, LUA_INTEGER_FMT, (LUAI_UACINT)lua_tointeger(L, idx));
        } else {
            double v = (double)lua_tonumber(L, idx);
            if (!isfinite(v)) snprintf(num, sizeof num, "null");
            else snprintf(num, sizeof num, "%.17g", v);
        }
        put_str(o, num);
        return;
    case LUA_TSTRING: {
        size_t n;
        const char *s = lua_tolstring(L, idx, &n);
        put_quoted(o, s, n);
        return;
    }
    case LUA_TTABLE: encode_table(o, idx, depth); return;
    default:
        luaL_error(L, "%s: a %s cannot be stored as JSON", o->how->what, luaL_typename(L, idx));
    }
}

const char *gm_json_push_encoded(lua_State *L, int idx, const gm_json_enc *how) {
    idx = lua_absindex(L, idx);
    jout o = {L, how, 0, NULL, 0, 0};
    lua_pushnil(L); /* the slot of the output block */
    o.slot = lua_gettop(L);
    encode(&o, idx, 0);
    lua_pushlstring(L, o.p ? o.p : "", o.n);
    lua_remove(L, o.slot);
    return lua_tostring(L, -1);
}

/* ---- decoding ---------------------------------------------------------------------------- */

static void push_value(lua_State *L, const cJSON *j) {
    luaL_checkstack(L, 4, "JSON too deep");
    if (cJSON_IsObject(j)) {
        lua_newtable(L);
        for (const cJSON *e = j->child; e; e = e->next) {
            push_value(L, e);
            lua_setfield(L, -2, e->string);
        }
    } else if (cJSON_IsArray(j)) {
        lua_newtable(L);
        lua_Integer i = 0;
        for (const cJSON *e = j->child; e; e = e->next) {
            push_value(L, e);
            lua_rawseti(L, -2, ++i);
        }
    } else if (cJSON_IsString(j)) {
        lua_pushstring(L, j->valuestring);
    } else if (cJSON_IsNumber(j)) {
        double v = j->valuedouble;
        /* [-2^63, 2^63): the doubles that convert to int64 exactly (the cast is defined) */
        if (v == floor(v) && v >= -0x1p63 && v < 0x1p63)
            lua_pushinteger(L, (lua_Integer)v);
        else
            lua_pushnumber(L, v);
    } else if (cJSON_IsBool(j)) {
        lua_pushboolean(L, cJSON_IsTrue(j));
    } else {
        lua_getfield(L, LUA_REGISTRYINDEX, NULL_KEY);
    }
}

/* lua_CFunction: pushes the cJSON tree given as a light userdata (run protected, see below). */
static int push_tree(lua_State *L) {
    push_value(L, lua_touserdata(L, 1));
    return 1;
}

bool gm_json_push_decoded(lua_State *L, const char *text, size_t len, long *err_at) {
    /* the tree is C memory: convert it in a protected call, free it, and only then pass on an
     * error (out of memory, nesting beyond the Lua stack), so that a raise leaks nothing */
    lua_pushcfunction(L, push_tree);
    const char *end = NULL;
    cJSON *j = text ? cJSON_ParseWithLengthOpts(text, len, &end, 0) : NULL;
    if (!j) {
        lua_pop(L, 1);
        if (err_at) *err_at = text && end ? (long)(end - text) : -1;
        return false;
    }
    lua_pushlightuserdata(L, j);
    int rc = lua_pcall(L, 1, 1, 0);
    cJSON_Delete(j);
    if (rc != LUA_OK) lua_error(L);
    return true;
}

/* ---- bindings ---------------------------------------------------------------------------- */

static int l_json_decode(lua_State *L) {
    size_t len;
    const char *text = luaL_checklstring(L, 1, &len);
    long at = -1;
    if (!gm_json_push_decoded(L, text, len, &at)) return luaL_error(L, "invalid JSON near byte %d", (int)at);
    return 1;
}

static int l_json_encode(lua_State *L) {
    luaL_checkany(L, 1);
    static const gm_json_enc how = {"json_encode", false};
    gm_json_push_encoded(L, 1, &how);
    return 1;
}

void gm_lua_open_json(lua_State *L) {
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, NULL_KEY);
    static const luaL_Reg fns[] = {{"json_decode", l_json_decode}, {"json_encode", l_json_encode}, {NULL, NULL}};
    gm_bind_add_functions(L, fns);
    lua_getglobal(L, "gm");
    lua_getfield(L, LUA_REGISTRYINDEX, NULL_KEY);
    lua_setfield(L, -2, "null");
    lua_pop(L, 1);
}

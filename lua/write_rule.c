/*
 * write_rule.c - where Lua code may write: the results rule and the runner's rule (see
 * write_rule.h). Kept apart from the bindings that write so that the sandbox's one write
 * permission can be read, and changed, in one place.
 */
#define _GNU_SOURCE
#include "write_rule.h"
#include "bind_util.h"
#include "gm_lua.h"

#include <errno.h>
#include <lauxlib.h>
#include <limits.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ROOT_KEY "gm.results_root" /* registry: the results folder as given */

/* ---- the results rule ---------------------------------------------------------------------- */

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

void gm_bind_check_write_path(lua_State *L, const char *path, const char *fn) {
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

/* ---- the export rule ----------------------------------------------------------------------- */

#define EXPORT_KEY "gm.export_path" /* registry: the absolute OUT of `gemmarun export` */

void gm_lua_allow_export_path(lua_State *L, const char *path) {
    lua_pushstring(L, path);
    lua_setfield(L, LUA_REGISTRYINDEX, EXPORT_KEY);
}

void gm_bind_check_export_path(lua_State *L, const char *path, const char *fn) {
    int top = lua_gettop(L);
    lua_getfield(L, LUA_REGISTRYINDEX, EXPORT_KEY);
    const char *allowed = lua_tostring(L, -1);
    /* the OUT the user typed, exactly as typed ("../out" included): the runner passes it on */
    bool ok = allowed && path[0] && strcmp(path, allowed) == 0;
    lua_settop(L, top);
    if (!ok) gm_bind_check_write_path(L, path, fn);
}

/* ---- the runner's rule ----------------------------------------------------------------------- */

const char *gm_bind_check_runner_path(lua_State *L, int idx) {
    const char *p = luaL_checkstring(L, idx);
    if (p[0] == '/' || strstr(p, "..") || strncmp(p, "results", 7) != 0)
        luaL_error(L, "%s: results paths must be relative, under results/, without '..'", p);
    return p;
}

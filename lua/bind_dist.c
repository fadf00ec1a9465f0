/*
 * bind_dist.c - the data-parallel world seen from Lua (core/dist/gm_dist.h): what the runner
 * needs to run one trial on world_size processes.
 *
 *   gm.dist_info()          -> {rank = r, world_size = n, transport = "mpi" | "none"}
 *   gm.dist_any(flag)       -> true when flag is true on any rank (Ctrl-C on one stops all)
 *   gm.dist_same(n)         -> min, max of the integer n over the ranks (checks that every
 *                              rank resumed from the same step)
 *   gm.dist_bcast(x)        -> rank 0's number x on every rank (a decision taken on rank 0)
 *   gm.dist_barrier()       -> waits for every rank (before rank 0 writes what others read)
 * With one process (no launcher) each is immediate: dist_any(f) = f, dist_same(n) = n, n.
 *
 * The world is main's (gm_lua_set_dist, gm_lua.h), process-wide like MPI itself; a trainer made
 * by model:trainer{} joins it (lua/bind_train.c). A failed collective raises its message.
 */
#include "bind_util.h"
#include "gm_dist.h"
#include "gm_lua.h"

#include <lauxlib.h>

static gm_dist *world; /* borrowed from main; NULL: one process */

void gm_lua_set_dist(gm_dist *d) { world = d; }
gm_dist *gm_lua_dist(void) { return world; }

static int l_dist_info(lua_State *L) {
    lua_createtable(L, 0, 3);
    lua_pushinteger(L, gm_dist_rank(world));
    lua_setfield(L, -2, "rank");
    lua_pushinteger(L, gm_dist_world_size(world));
    lua_setfield(L, -2, "world_size");
    lua_pushstring(L, gm_dist_transport(world));
    lua_setfield(L, -2, "transport");
    return 1;
}

static int l_dist_any(lua_State *L) {
    int64_t v = lua_toboolean(L, 1) ? 1 : 0;
    gm_error err = {0};
    if (gm_dist_allreduce_i64(world, &v, 1, GM_DIST_MAX, &err) != GM_OK) return gm_bind_raise(L, &err);
    lua_pushboolean(L, v != 0);
    return 1;
}

static int l_dist_same(lua_State *L) {
    int64_t lo = (int64_t)luaL_checkinteger(L, 1), hi = lo;
    gm_error err = {0};
    if (gm_dist_allreduce_i64(world, &lo, 1, GM_DIST_MIN, &err) != GM_OK ||
        gm_dist_allreduce_i64(world, &hi, 1, GM_DIST_MAX, &err) != GM_OK)
        return gm_bind_raise(L, &err);
    lua_pushinteger(L, (lua_Integer)lo);
    lua_pushinteger(L, (lua_Integer)hi);
    return 2;
}

static int l_dist_bcast(lua_State *L) {
    double x = luaL_optnumber(L, 1, 0);
    gm_error err = {0};
    if (gm_dist_bcast(world, &x, sizeof x, 0, &err) != GM_OK) return gm_bind_raise(L, &err);
    lua_pushnumber(L, x);
    return 1;
}

static int l_dist_barrier(lua_State *L) {
    gm_error err = {0};
    if (gm_dist_barrier(world, &err) != GM_OK) return gm_bind_raise(L, &err);
    return 0;
}

void gm_lua_open_dist(lua_State *L) {
    static const luaL_Reg fns[] = {{"dist_info", l_dist_info}, {"dist_any", l_dist_any}, {"dist_same", l_dist_same},
                                   {"dist_bcast", l_dist_bcast}, {"dist_barrier", l_dist_barrier}, {NULL, NULL}};
    lua_getglobal(L, "gm");
    luaL_setfuncs(L, fns, 0);
    lua_pop(L, 1);
}

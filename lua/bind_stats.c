/*
 * bind_stats.c - the statistics of core/stats/gm_stats.h for lua/report.lua and scripts.
 *
 *   gm.t95(df)                                   -> t_{0.975, df} (nil for df < 1)
 *   gm.bootstrap_mean(x, {resamples=, seed=, weights=}) -> lo, hi: the percentile 95% interval of
 *       mean(x), or with weights w of sum(x) / sum(w) (a corpus-level rate: errors over words)
 *   gm.paired_bootstrap(a, b, {resamples=, seed=, weights=}) -> p: two-sided p-value of
 *       mean(a - b) = 0, or with weights of sum(a) / sum(w) = sum(b) / sum(w)
 *
 * x, a, b are lists of numbers (a and b of one length, paired by position); resamples defaults
 * to GM_STATS_RESAMPLES (10,000), seed to 0. Ownership: the arrays are copied into userdata for
 * the call. Errors: Lua errors naming the function and the argument (an empty list, a value
 * that is not a finite number, lists of different lengths).
 */
#include "bind_util.h"
#include "gm_lua.h"

#include "gm_stats.h"

#include <lauxlib.h>
#include <math.h>

/* The list at idx as a double array in userdata pushed on the stack; returns its length. */
static int64_t push_numbers(lua_State *L, int idx, const char *fn, const char *what, double **out) {
    luaL_checktype(L, idx, LUA_TTABLE);
    lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
    if (n < 1) luaL_error(L, "%s: %s is empty", fn, what);
    double *v = lua_newuserdatauv(L, (size_t)n * sizeof *v, 0);
    for (lua_Integer i = 1; i <= n; i++) {
        if (lua_rawgeti(L, idx, i) != LUA_TNUMBER)
            luaL_error(L, "%s: %s[%d] must be a number", fn, what, (int)i);
        v[i - 1] = (double)lua_tonumber(L, -1);
        if (!isfinite(v[i - 1])) luaL_error(L, "%s: %s[%d] is not finite", fn, what, (int)i);
        lua_pop(L, 1);
    }
    *out = v;
    return (int64_t)n;
}

static void read_opts(lua_State *L, int idx, const char *fn, int64_t *resamples, uint64_t *seed) {
    static const char *const allowed[] = {"resamples", "seed", "weights", NULL};
    gm_bind_check_opts(L, idx, fn, allowed);
    *resamples = GM_STATS_RESAMPLES;
    *seed = 0;
    if (lua_istable(L, idx)) {
        *resamples = gm_bind_opt_int(L, idx, "resamples", GM_STATS_RESAMPLES);
        *seed = (uint64_t)gm_bind_opt_int(L, idx, "seed", 0);
    }
    if (*resamples < 1 || *resamples > 100000000)
        luaL_error(L, "%s: resamples must be in [1, 1e8]", fn);
}

/* The options' weights = {...} (n numbers, pushed as userdata like the data), or NULL. */
static double *opt_weights(lua_State *L, int idx, const char *fn, int64_t n) {
    if (!lua_istable(L, idx)) return NULL;
    double *w = NULL;
    if (lua_getfield(L, idx, "weights") == LUA_TNIL) {
        lua_pop(L, 1);
        return NULL;
    }
    int at = lua_gettop(L);
    int64_t nw = push_numbers(L, at, fn, "weights", &w);
    if (nw != n) luaL_error(L, "%s: weights has %d values, the data %d (they pair by position)", fn, (int)nw, (int)n);
    lua_remove(L, at); /* the userdata stays on the stack, anchoring w */
    return w;
}

static int l_t95(lua_State *L) {
    lua_Integer df = luaL_checkinteger(L, 1);
    if (df < 1) return 0;
    lua_pushnumber(L, gm_stats_t95((int64_t)df));
    return 1;
}

static int l_bootstrap_mean(lua_State *L) {
    double *x;
    int64_t resamples;
    uint64_t seed;
    read_opts(L, 2, "gm.bootstrap_mean", &resamples, &seed);
    int64_t n = push_numbers(L, 1, "gm.bootstrap_mean", "x", &x);
    double *w = opt_weights(L, 2, "gm.bootstrap_mean", n);
    double lo, hi;
    gm_error err = {0};
    if (gm_stats_bootstrap_ratio(x, w, n, resamples, seed, &lo, &hi, &err) != GM_OK)
        return gm_bind_raise(L, &err);
    lua_pushnumber(L, lo);
    lua_pushnumber(L, hi);
    return 2;
}

static int l_paired_bootstrap(lua_State *L) {
    double *a, *b;
    int64_t resamples;
    uint64_t seed;
    read_opts(L, 3, "gm.paired_bootstrap", &resamples, &seed);
    int64_t na = push_numbers(L, 1, "gm.paired_bootstrap", "a", &a);
    int64_t nb = push_numbers(L, 2, "gm.paired_bootstrap", "b", &b);
    if (na != nb)
        luaL_error(L, "gm.paired_bootstrap: a has %d values, b %d (they pair by position)",
                   (int)na, (int)nb);
    double *w = opt_weights(L, 3, "gm.paired_bootstrap", na);
    double p;
    gm_error err = {0};
    if (gm_stats_paired_bootstrap_ratio(a, b, w, na, resamples, seed, &p, &err) != GM_OK)
        return gm_bind_raise(L, &err);
    lua_pushnumber(L, p);
    return 1;
}

void gm_lua_open_stats(lua_State *L) {
    static const luaL_Reg fns[] = {{"t95", l_t95},
                                   {"bootstrap_mean", l_bootstrap_mean},
                                   {"paired_bootstrap", l_paired_bootstrap},
                                   {NULL, NULL}};
    gm_bind_add_functions(L, fns);
}

/*
 * fuzz_experiment.c - libFuzzer target for experiment files: the input runs as an experiment
 * file (gm_lua_run_experiment: the sandbox, the instruction and memory limits of lua/gm_lua.c),
 * and what it returns goes through the prelude's checks as `gemmarun FILE` would
 * (lua/prelude.lua: apply_overrides, validate, expand with a trial cap), in a fresh Lua state
 * per input, with a small instruction budget and heap so that every input ends quickly.
 *
 * Invariants: an input either runs or fails with a message (GM_ERR_INVALID / GM_ERR_NOMEM, never
 * an empty one); validation and expansion either succeed or fail with a message; nothing
 * crashes, hangs or writes outside a scratch results folder. Without clang the same function is
 * driven over the seed corpus by fuzz_replay.c.
 */
#include "gm_lua.h"

#include <lauxlib.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char CHECK[] =
    "function GM_FUZZ_CHECK(e)\n"
    "  if type(e) ~= 'table' or rawget(e, '_kind') ~= 'experiment' then return 0 end\n"
    "  local P = GM_PRELUDE\n"
    "  P.apply_overrides(e, {})\n"
    "  P.validate(e)\n"
    "  local trials = P.expand(e, 1000)\n"
    "  return #trials\n"
    "end\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gm_lua_opts o = {0};
    o.n_threads = 1;
    o.max_instructions = 2000000; /* ~10 ms of Lua */
    o.max_memory = 64LL << 20;
    gm_error err = {0};
    lua_State *L = NULL;
    if (gm_lua_new(&o, &L, &err) != GM_OK) {
        fprintf(stderr, "fuzz_experiment: %s\n", err.msg);
        abort();
    }
    gm_lua_set_results_root(L, "/tmp/gm_fuzz_experiment_results");
    if (gm_lua_run_string(L, CHECK, sizeof CHECK - 1, "=fuzz_experiment", &err) != GM_OK) abort();
    int base = lua_gettop(L);
    gm_status s = gm_lua_run_experiment(L, (const char *)data, size, "@fuzz.lua", &err);
    if (s != GM_OK) {
        if (err.msg[0] == '\0') __builtin_trap(); /* failures leave a message */
    } else if (lua_gettop(L) > base) {
        lua_getglobal(L, "GM_FUZZ_CHECK");
        lua_pushvalue(L, base + 1);
        memset(&err, 0, sizeof err);
        if (gm_lua_call(L, 1, 1, &err) != GM_OK && err.msg[0] == '\0') __builtin_trap();
    }
    gm_lua_close(L);
    return 0;
}

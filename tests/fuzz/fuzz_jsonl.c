/*
 * fuzz_jsonl.c - libFuzzer target for JSONL chat data (data.jsonl{...}): the runner's reading of
 * the file (lua/runner.lua R.parse_chat_jsonl: one JSON object per line through gm.json_decode,
 * lua/bind_json.c, and the conversation checks), then every conversation it accepts through
 * dataset:add_chat (lua/bind_train.c: Gemma's chat template, core/text/gm_chat.c, and the tiny
 * model's BPE tokenizer, core/text/gm_tokenizer.c, into core/data/gm_data.c) - the same code
 * path as a real run, in one sandboxed Lua state.
 *
 * Invariants (a violated one is a Lua error, turned into a trap): a file that cannot be read is
 * an error naming fuzz.jsonl:LINE; a conversation refused names its line and a reason; add_chat
 * either accepts or gives a non-empty reason. Without clang the same function is driven over the
 * seed corpus by fuzz_replay.c.
 */
#include "gm_lua.h"

#include <lauxlib.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char HARNESS[] =
    "local m = gm.load_model(GM_FUZZ_MODEL)\n"
    "local R = gm_module('runner')\n"
    "function GM_FUZZ_JSONL(text)\n"
    "  local bad = {}\n"
    "  local ok, items = pcall(R.parse_chat_jsonl, text, 'fuzz.jsonl', bad)\n"
    "  if not ok then\n"
    "    assert(type(items) == 'string' and items:find('^fuzz%.jsonl:%d+: '), 'an error without file:line: ' .. tostring(items))\n"
    "    return 0\n"
    "  end\n"
    "  for _, b in ipairs(bad) do\n"
    "    assert(b.example:find('^fuzz%.jsonl:%d+$') and type(b.reason) == 'string' and #b.reason > 0, 'a refusal without line or reason')\n"
    "  end\n"
    "  local ds <close> = gm.dataset(m)\n"
    "  local n = 0\n"
    "  for _, msgs in ipairs(items) do\n"
    "    local okc, r, why = pcall(ds.add_chat, ds, msgs, { max_length = 64 })\n"
    "    if not okc then assert(type(r) == 'string' and #r > 0, 'add_chat raised without a message')\n"
    "    elseif not r then assert(type(why) == 'string' and #why > 0, 'add_chat refused without a reason')\n"
    "    else n = n + 1 end\n"
    "  end\n"
    "  return n\n"
    "end\n";

static lua_State *L;

static void setup(void) {
    gm_lua_opts o = {0};
    o.n_threads = 1;
    gm_error err = {0};
    if (gm_lua_new(&o, &L, &err) != GM_OK) {
        fprintf(stderr, "fuzz_jsonl: %s\n", err.msg);
        abort();
    }
    lua_pushstring(L, GM_SOURCE_DIR "/tests/ref/tiny_gemma3_chat");
    lua_setglobal(L, "GM_FUZZ_MODEL");
    if (gm_lua_run_string(L, HARNESS, sizeof HARNESS - 1, "=fuzz_jsonl", &err) != GM_OK) {
        fprintf(stderr, "fuzz_jsonl: %s\n", err.msg);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!L) setup();
    int top = lua_gettop(L);
    lua_getglobal(L, "GM_FUZZ_JSONL");
    lua_pushlstring(L, (const char *)data, size);
    gm_error err = {0};
    if (gm_lua_call(L, 1, 1, &err) != GM_OK) {
        fprintf(stderr, "fuzz_jsonl: invariant broken: %s\n", err.msg);
        __builtin_trap();
    }
    lua_settop(L, top);
    lua_gc(L, LUA_GCSTEP, 0);
    return 0;
}

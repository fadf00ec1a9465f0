/*
 * bind_json.h - the one JSON <-> Lua codec of the Lua side (internal to lua/): gm.json_encode,
 * gm.json_decode, gm.null, and the JSON attributes of results files (lua/bind_results.c).
 *
 * Encoding is canonical: object keys sorted bytewise, no spaces, integers exactly (%lld), floats
 * with 17 significant digits (%.17g, which round-trips), strings with only '"', '\' and control
 * characters escaped (\u00XX). Trial ids are the sha256 of this text (lua/prelude.lua), and the
 * stored trial files are named by them: any change to the text of an existing config changes
 * the ids of existing results (tests/e2e/json.sh pins it). A table whose keys are exactly 1..n
 * is an array, any other table an object (string keys only); the empty table is {} unless the
 * caller says the value is a list. nil and gm.null encode as null, and so do NaN and infinities,
 * which JSON cannot hold.
 *
 * Decoding (cJSON): objects become tables, arrays lists, and JSON null becomes the sentinel
 * gm.null, at any depth. The sentinel, not nil, because a nil cannot hold a place in a Lua list:
 * [a, null, b] decoded with nil would leave a hole, # and ipairs would disagree, and a chat
 * conversation with a null message would be checked on its first message only (lua/runner.lua
 * rejects it by position). Numbers that are integral and within the int64 range come back as Lua
 * integers (JSON does not tell 2 from 2.0; cJSON has the value as a double, so integers beyond
 * 2^53 are the nearest double's), all others as floats.
 *
 * Ownership: nothing to free; results are values on the Lua stack. Errors: the encoder raises a
 * Lua error naming the value (`what`); the decoder returns false instead of raising, so each
 * caller decides what text that is not JSON means.
 */
#ifndef GM_BIND_JSON_H
#define GM_BIND_JSON_H

#include <lua.h>
#include <stdbool.h>
#include <stddef.h>

/* How to encode: `what` names the value in error messages ("json_encode", "config_json", ...);
 * empty_is_array makes the empty table [] (the results fields that hold lists: rejections,
 * swept fields, list-valued config fields) instead of {} (gm.json_encode, trial ids). */
typedef struct gm_json_enc {
    const char *what;
    bool empty_is_array;
} gm_json_enc;

/* Pushes the JSON text of the Lua value at idx and returns it (valid while it stays on the
 * stack). Raises "<what>: ..." for a value JSON cannot hold (a function, userdata, a table with
 * a key that is not a string and is no list, nesting deeper than 64) or out of memory. */
const char *gm_json_push_encoded(lua_State *L, int idx, const gm_json_enc *how);

/* Decodes `len` bytes of JSON text and pushes the value; returns true. When the text is not
 * JSON, pushes nothing, returns false and, when err_at is not NULL, sets it to the byte offset
 * where parsing stopped (-1 when unknown). */
bool gm_json_push_decoded(lua_State *L, const char *text, size_t len, long *err_at);

/* True when the value at idx is the JSON null sentinel (gm.null). */
bool gm_json_is_null(lua_State *L, int idx);

#endif /* GM_BIND_JSON_H */

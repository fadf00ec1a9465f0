#!/usr/bin/env bash
# The one JSON <-> Lua codec (lua/bind_json.h): gm.json_encode, gm.json_decode and the JSON
# attributes of results files.
#   - the canonical text of a representative config is pinned byte for byte, and so are the
#     trial ids of the embedded default experiment: trial ids are the sha256 of this text and
#     name the stored trial files, so a change here would orphan every existing result;
#   - decoding: null is gm.null everywhere (a list keeps its length and positions), integral
#     numbers within int64 come back as integers, others as floats; errors name the byte;
#   - results files: tables are stored as JSON with empty tables as lists; a JSON attribute
#     holding null reads back as a missing field.
set -u
source "$(dirname "$0")/lib.bash"
GM=$(cd "$(dirname "$GM")" && pwd)/$(basename "$GM")
SRC=$(pwd)
cd "$TMP"

# script NAME WANT_EXIT PATTERN LUA_SOURCE: runs the source as a Lua script
script() {
  printf '%s\n' "$4" > case.lua
  expect_run "$1" "$2" "$3" -- "$GM" case.lua
}

# ---- encoding: the canonical text is pinned -------------------------------------------------
# quickstart's first trial: its identity (experiment, resolved config, task) as the prelude
# hashes it; the text and the id were taken from gemmarun before the codec was unified
cat > pin.lua <<'EOF'
local identity = {
  experiment = "quickstart",
  config = { alpha = 16, batch = 4, beta1 = 0.9, beta2 = 0.999, checkpoint_every = 10, checkpointing = false,
    dropout = 0.0, epochs = 1, eps = 1e-8, grad_accum = 1, lr = 3e-4, max_grad_norm = 1.0, max_length = 112,
    model = "gemma3-270m", quant = "stored", rank = 8, rslora = false, schedule = "constant", seed = 1,
    targets = "all-linear", warmup = 0, weight_decay = 0.0 },
  task = { kind = "classify",
    prompt = "Which topic is this quote about? Answer with one word: computers, food, love, science or sports.",
    data = { _kind = "fortunes", max_chars = 250, test = 16, train = 24,
      topics = { "computers", "food", "love", "science", "sports" } } },
}
local text = gm.json_encode(identity)
print(text)
print(gm.sha256(text):sub(1, 12))
EOF
cat > pin.want <<'EOF'
{"config":{"alpha":16,"batch":4,"beta1":0.90000000000000002,"beta2":0.999,"checkpoint_every":10,"checkpointing":false,"dropout":0,"epochs":1,"eps":1e-08,"grad_accum":1,"lr":0.00029999999999999997,"max_grad_norm":1,"max_length":112,"model":"gemma3-270m","quant":"stored","rank":8,"rslora":false,"schedule":"constant","seed":1,"targets":"all-linear","warmup":0,"weight_decay":0},"experiment":"quickstart","task":{"data":{"_kind":"fortunes","max_chars":250,"test":16,"topics":["computers","food","love","science","sports"],"train":24},"kind":"classify","prompt":"Which topic is this quote about? Answer with one word: computers, food, love, science or sports."}}
f31a49acdfb0
EOF
same() { "$GM" "$1" > got.txt 2>&1; diff -u "$2" got.txt && echo same; }
expect_run "a representative config encodes to the pinned text and id" 0 "^same$" -- same pin.lua pin.want

# the ids of the embedded default experiment (results/quickstart/trial-<id>.h5 of every earlier run)
if real_model > /dev/null; then
  env -u GEMMA_MODEL "$GM" --dry-run > dry.txt 2>&1
  got=$(sed -n 's/^  trial  \([0-9]\)  \([0-9a-f]*\)  \(.*\)  plan .*/\1 \2 \3/p' dry.txt)
  want="1 f31a49acdfb0 lr=0.0003 quant=stored seed=1
2 a4bac4d66340 lr=0.0003 quant=stored seed=2
3 7daae39dba16 lr=0.0003 quant=nf4 seed=1
4 dc20d8f30f8f lr=0.0003 quant=nf4 seed=2
5 ca17818a8a54 lr=0.001 quant=stored seed=1
6 b067ce0b659c lr=0.001 quant=stored seed=2
7 e6bb7a1b2f78 lr=0.001 quant=nf4 seed=1
8 b19abce13c96 lr=0.001 quant=nf4 seed=2"
  [ "$got" = "$want" ] && { pass=$((pass + 1)); echo "ok    the default experiment keeps its 8 trial ids"; } \
    || { fail=$((fail + 1)); echo "FAIL  trial ids of the default experiment changed:"; head -20 dry.txt | sed 's/^/      /'; }
else
  fail=$((fail + 1)); echo "FAIL  trial ids of the default experiment: the real model is not in the cache"
fi

script "encode: keys sorted bytewise, no spaces, integers exact, empty table {}" 0 \
  '^\{"B":\[1,2\.5,"x"\],"a":\{\},"b":true,"big":9007199254740993,"s":"q\\"\\\\\\u000a"\}$' \
  'print(gm.json_encode({b = true, a = {}, B = {1, 2.5, "x"}, big = 9007199254740993, s = "q\"\\\n"}))'
script "encode: nil, gm.null, NaN and infinities are null" 0 '^null null \[null,null,null\]$' \
  'print(gm.json_encode(nil) .. " " .. gm.json_encode(gm.null) .. " " .. gm.json_encode({0/0, math.huge, -math.huge}))'
script "encode: a function is refused" 2 "json_encode: a function cannot be stored as JSON" \
  'gm.json_encode({f = print})'
script "encode: mixed keys are refused" 2 "json_encode: JSON object keys must be strings, got a number key" \
  'gm.json_encode({1, 2, x = 3})'
script "encode: nesting deeper than 64 is refused" 2 "json_encode: nesting too deep for JSON" \
  'local t = {}; for i = 1, 70 do t = {t} end; gm.json_encode(t)'
# the encoder used to crash (a misused luaL_Buffer) on any text over 1 KiB inside a table
script "encode: large nested tables round-trip" 0 "^ok 300 [0-9]+$" '
local l = {}
for i = 1, 300 do l[i] = {a = i, b = string.rep("y", 40) .. i, c = {1.5, 2, 3}} end
local text = gm.json_encode(l)
local back = gm.json_decode(text)
for i = 1, 300 do assert(back[i].a == i and back[i].b == l[i].b and back[i].c[1] == 1.5) end
assert(gm.json_encode(back) == text)
print(string.format("ok %d %d", #back, #text))'
script "encode: a long prompt in an experiment's identity" 0 "^ok$" '
local prompt = string.rep("Which fruit? ", 400)
local text = gm.json_encode({task = {prompt = prompt}, config = {lr = 1e-3}})
assert(text == "{\"config\":{\"lr\":0.001},\"task\":{\"prompt\":\"" .. prompt .. "\"}}", text:sub(1, 60))
print("ok")'

# ---- decoding ---------------------------------------------------------------------------------
script "decode: null is gm.null at the top, in lists (positions kept) and in objects" 0 '^ok$' '
assert(gm.json_decode("null") == gm.null)
local l = gm.json_decode("[1, null, 3]")
assert(#l == 3 and l[2] == gm.null and l[3] == 3)
local o = gm.json_decode("{\"a\": null, \"b\": 1}")
assert(o.a == gm.null and o.b == 1)
print("ok")'
script "decode: integral numbers within int64 are integers, others floats" 0 '^integer integer integer float float float integer$' '
local function t(s) return math.type(gm.json_decode(s)) end
print(table.concat({t("2"), t("2.0"), t("-9007199254740993"), t("2.5"), t("1e300"), t("1e19"), t("-9.2e18")}, " "))'
script "decode: text that is not JSON names the byte" 2 "invalid JSON near byte 4" 'gm.json_decode("[1, 2")'

# ---- results files ----------------------------------------------------------------------------
script "results: tables stored as canonical JSON, empty tables as lists, null fields read as nil" 0 '^ok$' '
local r = gm.results("results/j/trial-a.h5")
r:set{experiment = "j", trial_id = "a", status = "completed", swept_json = gm.json_encode(gm.null),
      report_json = {rows = {"lr"}, cols = {}, metric = "accuracy"}}
r:set_config{lr = 1e-4, layers = {}}
r:set_data{n_train = 1, n_test = 1, rejections = {}}
r:save(); r:close()
local t = gm.results_read("results/j/trial-a.h5")
assert(t.swept == nil, "swept")
assert(t.swept_json == "null", t.swept_json)
assert(t.report_json == "{\"cols\":[],\"metric\":\"accuracy\",\"rows\":[\"lr\"]}", t.report_json)
assert(t.config_json == "{\"layers\":[],\"lr\":0.0001}", t.config_json)
assert(t.config.layers == "[]", t.config.layers)
assert(t.data.rejections_json == "[]" and #t.data.rejections == 0, t.data.rejections_json)
assert(t.report.rows[1] == "lr" and #t.report.cols == 0, "report")
print("ok")'

finish

-- tests/lua/model_api.lua: the first Lua API on the real model (run by tests/e2e/generate_real.sh).
local m <close> = gm.load_model("gemma3-270m")
local cfg = m:config()
assert(cfg.hidden_size == 640 and cfg.num_hidden_layers == 18 and cfg.vocab_size == 262144, "config")

-- formats.md §2.5 vectors
local ids = m:tokenize("Hello world")
assert(#ids == 3 and ids[1] == 2 and ids[2] == 9259 and ids[3] == 1902, "tokenize Hello world")
local chat = m:tokenize("<start_of_turn>user\nHi<end_of_turn>\n", { special = true })
assert(table.concat(chat, " ") == "2 105 2364 107 10979 106 107", "special tokens: " .. table.concat(chat, " "))
assert(m:detokenize({ 9259, 1902 }) == "Hello world", "detokenize")
assert(m:detokenize(m:tokenize("naïve café 🙂", { bos = false })) == "naïve café 🙂", "round trip")

local text, info = m:generate("The capital of France is", { max_tokens = 8 })
assert(text:find("^ the capital of the country of France"), "greedy text: " .. text)
assert(info.prompt_tokens == 6 and info.new_tokens == 8, "generate info")
assert(info.dot == "int8", "decoding takes llama.cpp's int8 dots by default: " .. tostring(info.dot))
-- the f32 dots: transformers' greedy text (tests/ref/gemma3_270m_ref.h5 /p0), on the state kept from the call above
local text32, info32 = m:generate("The capital of France is", { max_tokens = 16, dot = "f32" })
assert(text32:find("^ the capital of the country of France%. It is the largest city in France"), "f32 greedy text: " .. text32)
assert(info32.dot == "f32", "dot = f32: " .. tostring(info32.dot))
local okd, errd = pcall(m.generate, m, "x", { dot = "bf16" })
assert(not okd and tostring(errd):find('dot must be "int8" or "f32"'), "bad dot: " .. tostring(errd))

local ok, err = pcall(m.tokenize, m, {})
assert(not ok and tostring(err):find("string expected"), "type check: " .. tostring(err))
m:close()
local ok2, err2 = pcall(m.config, m)
assert(not ok2 and tostring(err2):find("closed"), "use after close")
print("lua api ok")

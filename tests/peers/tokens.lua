-- Writes gemmarun's token ids of some texts for the peers' tokenizer comparison
-- (tests/peers/peft_check.py tokenizer --cases): a JSON list of {"text": ..., "ids": [...]}, each
-- encoded with BOS and special tokens parsed, as Hugging Face's tokenizer(text) does.
-- Environment: MODEL, TEXTS (a JSON file: a list of strings), OUT (under results/).
local m <close> = gm.load_model((assert(os.getenv("MODEL"), "set MODEL")))
local texts = gm.json_decode(gm.read_text((assert(os.getenv("TEXTS"), "set TEXTS"))))
local cases = {}
for i, t in ipairs(texts) do cases[i] = { text = t, ids = m:tokenize(t, { bos = true, special = true }) } end
gm.write_text((assert(os.getenv("OUT"), "set OUT")), gm.json_encode(cases) .. "\n")
print(string.format("wrote the ids of %d texts to %s", #cases, os.getenv("OUT")))

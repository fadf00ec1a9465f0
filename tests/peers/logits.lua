-- Writes gemmarun's logits for the peers' comparisons (tests/peers/peft_check.py and
-- llama_check.py, --ours): one number per line (%.9g: f32 exactly), position-major.
-- Environment: MODEL, IDS ("2,5,7") or TEXT (tokenized with BOS and special tokens; the ids go
-- to OUT.ids, comma-separated), OUT, and optionally ADAPTER (anything gm_adapter_load reads),
-- TRIAL, LAST=1 (only the logits after the last token), GREEDY=N (also OUT.greedy: the N token ids
-- a greedy continuation of IDS takes, one per line, each the argmax of a full forward), PIXELS (a
-- file of preprocessed pixel values, one number per line, for the image-token runs of IDS: a
-- multimodal model's images, m:logits' pixels), AUDIO (comma-separated audio files for the runs of
-- audio soft tokens of IDS: Gemma 3n's clips, m:logits' audio).
local m <close> = gm.load_model((assert(os.getenv("MODEL"), "set MODEL")))
local ids = {}
local text = os.getenv("TEXT")
if text and text ~= "" then
  -- a text (with BOS; special tokens such as <start_of_turn> parsed): its ids go to OUT.ids
  ids = m:tokenize(text, { bos = true, special = true })
else
  for x in (assert(os.getenv("IDS"), "set IDS or TEXT")):gmatch("%d+") do ids[#ids + 1] = math.tointeger(tonumber(x)) end
end
local adapter = os.getenv("ADAPTER")
if adapter == "" then adapter = nil end
local trial = os.getenv("TRIAL")
if trial == "" then trial = nil end
local out = (assert(os.getenv("OUT"), "set OUT"))
local pixels
local pix_file = os.getenv("PIXELS")
if pix_file and pix_file ~= "" then
  pixels = {}
  for x in gm.read_text(pix_file):gmatch("%S+") do pixels[#pixels + 1] = tonumber(x) end
end
local audio
local aud = os.getenv("AUDIO")
if aud and aud ~= "" then
  audio = {}
  for f in aud:gmatch("[^,]+") do audio[#audio + 1] = f end
end
local l = m:logits(ids, { adapter = adapter, trial = trial, all = os.getenv("LAST") ~= "1", pixels = pixels, audio = audio })
local lines = {}
for i = 1, #l do lines[i] = string.format("%.9g", l[i]) end
gm.write_text(out, table.concat(lines, "\n") .. "\n")
print(string.format("wrote %d logits to %s", #l, out))
if text and text ~= "" then
  local t = {}
  for i, v in ipairs(ids) do t[i] = tostring(v) end
  gm.write_text(out .. ".ids", table.concat(t, ",") .. "\n")
end
local n = math.tointeger(tonumber(os.getenv("GREEDY") or "0")) or 0
if n > 0 then
  local seq, new = { table.unpack(ids) }, {}
  for _ = 1, n do
    local last = m:logits(seq, { adapter = adapter, trial = trial })
    local best = 1
    for v = 2, #last do if last[v] > last[best] then best = v end end
    seq[#seq + 1], new[#new + 1] = best - 1, tostring(best - 1)
  end
  gm.write_text(out .. ".greedy", table.concat(new, "\n") .. "\n")
  print(string.format("wrote %d greedy tokens to %s.greedy", n, out))
end

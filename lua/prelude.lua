-- prelude.lua: embedded in gemmarun and run before every experiment file.
--
-- Policy lives here, mechanism in C (style guide §4.8). This file defines what an experiment
-- file sees: experiment{}, grid{}, random{}, the distributions for random search, the tasks
-- classify{} and sft{}, the data sources data.*, table{} (the report spec), env(). Every
-- constructor records the file and line it was called from, so validation errors name them:
--   experiments/x.lua:12: train.rnak: unknown key (allowed: alpha, batch, ...)
-- Validation of a whole experiment (unknown keys, wrong types, impossible values) and the sweep
-- expansion into trials also live here; lua/runner.lua runs the trials.
--
-- Two environments: this file, the runner and the report run in the state's global table; an
-- experiment file runs in a table of its own, made by M.file_env (end of this file), which
-- holds the API above, the allowed standard functions and copies of the library tables. So a
-- file that assigns `type = nil` or `string.format = nil` changes its own globals and copies,
-- never the code that validates and runs it.

-- The sandbox: keep what we need from `debug`, then remove it (a file's load() takes text
-- chunks only: M.file_env).
local getinfo = debug.getinfo
if not GM_ALLOW_OS then debug = nil end

local M = {} -- exported to the runner as the global GM_PRELUDE (gm_module refuses "prelude")
local API = {} -- what an experiment file sees besides the standard library (M.file_env)

--------------------------------------------------------------------------------------------------
-- errors

local usage_mt = { __tostring = function(e) return e.msg end }

--- Raises a usage error: the file is wrong, nothing ran (exit code 2).
local function usage(where, fmt, ...)
  local msg = string.format(fmt, ...)
  if where then msg = where .. ": " .. msg end
  error(setmetatable({ usage = true, msg = msg }, usage_mt), 0)
end
M.usage = usage

--- Line of the first `word{` or `word(` in the experiment file (GM_EXPERIMENT_FILE, set by the
--- command line), for constructors called in tail position (`return experiment{...}` leaves no
--- caller frame to ask).
local function find_line(word)
  local file = GM_EXPERIMENT_FILE
  if not file then return nil end
  local ok, text = pcall(gm.read_text, file)
  if not ok then return nil end
  local n = 0
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    if line:find("%f[%w_]" .. word .. "%s*[{(]") and not line:match("^%s*%-%-") then return file .. ":" .. n end
  end
  return file
end

--- "file:line" of the code that called the constructor calling this.
local function caller_where(word)
  for level = 3, 8 do
    local info = getinfo(level, "Slt")
    if not info then break end
    if info.source:sub(1, 1) == "@" and info.short_src ~= "lua/prelude.lua" then
      return info.short_src .. ":" .. (info.currentline or 0)
    end
    if info.istailcall then break end
  end
  return (word and find_line(word)) or GM_EXPERIMENT_FILE or "experiment"
end

--------------------------------------------------------------------------------------------------
-- env

--- env(name, default): the value of an environment variable, or `default` when unset or empty.
function API.env(name, default)
  if type(name) ~= "string" then usage(caller_where(), "env(name, default): name must be a string, got %s", type(name)) end
  local v = os.getenv(name)
  if v == nil or v == "" then return default end
  return v
end

--- load_model(path_or_name [, opts]): shorthand for gm.load_model.
function API.load_model(...) return gm.load_model(...) end

--------------------------------------------------------------------------------------------------
-- schema

-- Training fields: type, range and default, from the one schema of the training options
-- (core/train/gm_train_opts.def, through gm.train_schema()): the C defaults, `gemmarun plan` and
-- docs/experiments.md read the same table. PEFT / TRL vocabulary.
local TRAIN = {}
for _, f in ipairs(gm.train_schema()) do TRAIN[f.name] = f end
M.TRAIN = TRAIN

local EXPERIMENT_KEYS = { "name", "model", "model_adapter", "task", "train", "sweep", "seeds", "memory_limit", "fit",
  "report", "threads", "device", "description", "results", "validation" }
-- the adapter's shape: with model_adapter these come from the adapter (a run may restate them);
-- vision_targets and modules_to_save are the image path it trained (the tower's adapters, the
-- projector), audio_targets the audio encoder's adapters
local ADAPTER_SHAPE = { "rank", "alpha", "rslora", "targets", "layers", "vision_targets", "modules_to_save", "audio_targets" }
M.ADAPTER_SHAPE = ADAPTER_SHAPE

local function sorted_keys(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = tostring(k) end
  table.sort(ks)
  return ks
end
M.sorted_keys = sorted_keys

--- Edit distance between two short strings, counting a swap of two neighbours as one edit
--- (optimal string alignment: "rnak" is one edit from "rank").
local function edit_distance(a, b)
  local d = {}
  for i = 0, #a do d[i] = { [0] = i } end
  for j = 0, #b do d[0][j] = j end
  for i = 1, #a do
    for j = 1, #b do
      local cost = a:byte(i) == b:byte(j) and 0 or 1
      d[i][j] = math.min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost)
      if i > 1 and j > 1 and a:byte(i) == b:byte(j - 1) and a:byte(i - 1) == b:byte(j) then
        d[i][j] = math.min(d[i][j], d[i - 2][j - 2] + 1)
      end
    end
  end
  return d[#a][#b]
end

--- " (did you mean 'rank'?)" when one allowed name is close to `name` (a typo), else "".
local function did_you_mean(name, allowed)
  local best, bd = nil, math.huge
  for _, a in ipairs(allowed) do
    local d = edit_distance(tostring(name):lower(), a:lower())
    if d < bd then best, bd = a, d end
  end
  if best and bd <= math.max(1, math.min(3, #tostring(name) // 3)) then return string.format(" (did you mean '%s'?)", best) end
  return ""
end
M.did_you_mean = did_you_mean

--- "file:line" of the first line of the experiment file that assigns `key` (`key =`), so that an
--- error about a key inside a table points at the key, not at the constructor; else `where`.
local function key_where(where, key)
  local file = GM_EXPERIMENT_FILE
  if not file or type(key) ~= "string" or not where or where:sub(1, #file) ~= file then return where end
  local ok, text = pcall(gm.read_text, file)
  if not ok then return where end
  local n = 0
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    local code = line:gsub("%-%-.*$", "")
    if code:find("%f[%w_]" .. key:gsub("%p", "%%%0") .. "%s*=[^=]") then return file .. ":" .. n end
  end
  return where
end

local function list_str(t) return table.concat(t, ", ") end

local function is_list(t)
  if type(t) ~= "table" then return false end
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  return n == #t
end

-- a list where one value is wanted (--set lr=1e-4,2e-4): say how to sweep instead
local LIST_HINT = " (one value; to try several, sweep it with grid{...} in the file)"

--- A value as the user wrote it, for messages: lists as {a, b}, never "table: 0x...".
local function show(v)
  if type(v) ~= "table" then return tostring(v) end
  local parts = {}
  for i, x in ipairs(v) do parts[i] = show(x) end
  return "{" .. table.concat(parts, ", ") .. "}"
end

--- Checks one training field's value; returns the normalized value or raises.
local function check_train_value(where, key, v)
  local f = TRAIN[key]
  if not f then
    usage(key_where(where, key), "train.%s: unknown key%s (allowed: %s)", key, did_you_mean(key, sorted_keys(TRAIN)),
      list_str(sorted_keys(TRAIN)))
  end
  -- the schema's own check, as m:trainer{} and `gemmarun plan` make it (core/train/gm_train_opts.def):
  -- kinds, ranges, PEFT's target_modules rules, layer lists; the value comes back normalized
  -- (integral numbers of integer options as integers, a targets list joined)
  local ok, res = gm.train_option_check(key, v)
  if not ok then
    local msg = res
    if type(v) == "table" then msg = msg:gsub("^([%w_]+) = a table", "%1 = " .. show(v):gsub("%%", "%%%%")) end
    usage(where, "train.%s%s", msg, (type(v) == "table" and f.kind ~= "targets" and f.kind ~= "layers") and LIST_HINT or "")
  end
  return res
end
M.check_train_value = check_train_value

--------------------------------------------------------------------------------------------------
-- constructors

local function tagged(kind, spec, word)
  if type(spec) ~= "table" then usage(caller_where(word), "%s{...} expects a table", kind) end
  local t = {}
  for k, v in pairs(spec) do t[k] = v end
  t._kind = kind
  t._where = caller_where(word)
  return t
end

local function check_keys(t, allowed, what)
  for k in pairs(t) do
    if type(k) ~= "string" then usage(t._where, "%s: keys must be names, got %s", what, tostring(k)) end
    if k:sub(1, 1) ~= "_" then
      local ok = false
      for _, a in ipairs(allowed) do ok = ok or a == k end
      if not ok then usage(key_where(t._where, k), "%s: unknown key '%s'%s (allowed: %s)", what, k, did_you_mean(k, allowed), list_str(allowed)) end
    end
  end
end

--- experiment{ name=, model=, task=, train={...}, sweep=grid{...}|random{...}, seeds={...},
---             memory_limit="48GiB", fit=false, report=table{...}, threads=2 }
function API.experiment(spec)
  local e = tagged("experiment", spec, "experiment")
  check_keys(e, EXPERIMENT_KEYS, "experiment")
  GM_EXPERIMENT_BUILT = true -- main.c: an experiment built but not returned is an error
  return e
end

--- grid{ field = {v1, v2, ...}, ... }: every combination (the first key varies slowest).
function API.grid(spec) return tagged("grid", spec) end

--- with_vision_tower{ text = "gemma3-270m", hidden_size = 128, num_hidden_layers = 2,
--- num_attention_heads = 4, intermediate_size = 512, image_size = 32, patch_size = 4,
--- mm_tokens_per_image = 16, seed = 0, dtype = "f32" }: as experiment.model, the text model with a
--- new, randomly initialized SigLIP vision tower and projector of that shape (Hugging Face's
--- vision_config names), written once into the cache as a Hugging Face Gemma3ForConditionalGeneration
--- folder (core/store/gm_merged.h gm_model_save_with_tower). Nothing of it is pretrained: train the
--- projector (train.modules_to_save = "multi_modal_projector") and the tower's linears
--- (train.vision_targets).
local TOWER_KEYS = { "text", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "image_size",
  "patch_size", "mm_tokens_per_image", "seed", "dtype" }
function API.with_vision_tower(spec)
  local t = tagged("with_vision_tower", spec)
  check_keys(t, TOWER_KEYS, "with_vision_tower")
  if type(t.text) ~= "string" or t.text == "" then
    usage(t._where, "with_vision_tower: text must be a text model's path or name (e.g. \"gemma3-270m\")")
  end
  return t
end

--- random{ n = trials, seed = s, field = {choices} | uniform(a, b) | log_uniform(a, b) | int(a, b) }
function API.random(spec) return tagged("random", spec) end
function API.uniform(a, b) return { _dist = "uniform", a = a, b = b } end
function API.log_uniform(a, b) return { _dist = "log_uniform", a = a, b = b } end
function API.int_uniform(a, b) return { _dist = "int_uniform", a = a, b = b } end

--- classify{ data = <data set>, prompt = "instruction", labels = {...} (default: the data's) }
function API.classify(spec)
  local t = tagged("classify", spec)
  check_keys(t, { "data", "prompt", "labels", "max_eval", "template" }, "classify")
  return t
end

--- sft{ data = <chat data set> }: supervised fine-tuning on the assistant turns.
function API.sft(spec)
  local t = tagged("sft", spec)
  check_keys(t, { "data", "max_eval" }, "sft")
  return t
end

--- transcribe{ data = data.speech{...}, prompt = "instruction", max_eval = n, max_new_tokens = 64 }:
--- speech to text. Each example is one recording and its transcript (and, when the data set gives
--- a pronouncing dictionary, the transcript's phones on a second line): the model learns to answer
--- the prompt about the clip with them. Evaluated by the loss and by generation: the greedy
--- answer to each test prompt (at most max_new_tokens tokens) against the reference, as the word
--- error rate (word_error_rate, the transcript's first line) and the phone error rate
--- (phone_error_rate, the second), each a corpus-level edit distance over the reference's length.
--- Needs a model with an audio encoder (Gemma 3n).
function API.transcribe(spec)
  local t = tagged("transcribe", spec)
  check_keys(t, { "data", "prompt", "max_eval", "max_new_tokens" }, "transcribe")
  return t
end

local data = {}
API.data = data

--- data.speech{ path = "folder", transcripts = "file", phones = "dict", test = 5, train = n, test_max = n,
---              exclude = {...} }: recordings and what they say. Every audio file below `path`
--- (WAV, FLAC, Ogg, MP3, in path order; sub-folders too) whose name, relative to `path` without its
--- extension, has a line in `transcripts` - "name: text" (Asterisk's core-sounds-en.txt) or
--- "name<TAB>text" / "name text" (Kaldi's text files), gzip-compressed or not - and a beside-it
--- "<name>.txt" otherwise. A transcript in [brackets] (a tone, a description) is not speech: left
--- out, named. `phones`: a CMU pronouncing dictionary (cmudict-en-us.dict of Debian's
--- pocketsphinx-en-us), each word's first pronunciation; a transcript with a word it lacks is
--- left out, named. Every `test`-th recording (default 5) is a test example; `train` / `test_max`
--- keep only the first so many of each; `exclude` leaves out sub-folders by name.
function data.speech(spec)
  local t = tagged("speech", spec)
  check_keys(t, { "path", "transcripts", "phones", "test", "train", "test_max", "exclude" }, "data.speech")
  return t
end

--- data.fortunes{ topics = {...}, train = 40, test = 20, max_chars = 300 }: Debian's fortunes,
--- label = topic file; for each topic the first `train` entries (file order) train, the next
--- `test` test (a fixed, documented split).
function data.fortunes(spec)
  local t = tagged("fortunes", spec or {})
  check_keys(t, { "topics", "train", "test", "max_chars", "dir" }, "data.fortunes")
  return t
end

--- data.folder{ root = "path", test = 5, labels = {...}, exclude = {...} }: root/<label>/**/<file>.txt;
--- the folder name is the label, and a file anywhere below it counts for it; root/train/<label>/...
--- and root/test/<label>/... when those exist, else every `test`-th file of each label is a test
--- example; `labels` and `exclude` as data.image_folder's.
function data.folder(spec)
  local t = tagged("folder", spec)
  check_keys(t, { "root", "test", "max_chars", "labels", "exclude" }, "data.folder")
  return t
end

--- data.image_folder{ root = "path", test = 5, labels = {...}, exclude = {...} }:
--- root/<label>/**/<image>.png|.jpg, the folder directly below the root is the label and an image
--- anywhere below it counts for it (root/mammals/dogs/dog.png is a "mammals" image), as
--- torchvision's ImageFolder reads; root/train/<label>/... and root/test/<label>/... when those
--- exist, else every `test`-th image of each label (default 5: 20%), in path order, is a test
--- image. `labels` keeps only those label folders, in that order (the others are left out, named);
--- `exclude` names folders below a label that are not read (e.g. { "cartoon" }). Needs a model
--- with a vision tower.
function data.image_folder(spec)
  local t = tagged("image_folder", spec)
  check_keys(t, { "root", "test", "labels", "exclude" }, "data.image_folder")
  return t
end

--- data.image_grid{ path = "sheet.png", cell = 20 | {w, h}, labels = {...}, split = 5, train = n, test = n }:
--- one image cut into cells of `cell` pixels (a sprite sheet: OpenCV's digits.png); the rows of
--- cells are shared evenly and in order among the labels (the first #rows / #labels rows are
--- labels[1]'s, ...); within a label's cells, row by row, every `split`-th (default 5: 20%) is a
--- test example, the rest train; `train` / `test` keep only the first so many of each label's.
--- Each example is one cell, an image reference "sheet.png#xywh=X,Y,W,H". Needs a model with a
--- vision tower.
function data.image_grid(spec)
  local t = tagged("image_grid", spec)
  check_keys(t, { "path", "cell", "labels", "split", "train", "test" }, "data.image_grid")
  return t
end

--- data.jsonl{ train = "path.jsonl", test = "path.jsonl" }: one {"messages": [...]} per line
--- (Hugging Face chat format: role system/user/assistant, content; a content may be a list of
--- parts {"type": "text", "text": ...} and {"type": "image", "path": ...}, paths relative to the
--- JSONL file).
function data.jsonl(spec)
  local t = tagged("jsonl", spec)
  check_keys(t, { "train", "test", "path", "test_fraction" }, "data.jsonl")
  return t
end

--- data.oxford_pets{ root = "data/oxford-iiit-pet" }: Oxford-IIIT Pet in its official layout
--- (images/<Breed>_<n>.jpg; annotations/trainval.txt trains, annotations/test.txt tests; the class
--- id of each line is the label, checked against the image's name). Needs a model with a vision
--- tower (experiments/pets_sweep.lua).
function data.oxford_pets(spec)
  local t = tagged("oxford_pets", spec or {})
  check_keys(t, { "root" }, "data.oxford_pets")
  -- the class names are part of the data set's definition, known before any file is read
  t.classes = {
    "Abyssinian", "american_bulldog", "american_pit_bull_terrier", "basset_hound", "beagle", "Bengal",
    "Birman", "Bombay", "boxer", "British_Shorthair", "chihuahua", "Egyptian_Mau", "english_cocker_spaniel",
    "english_setter", "german_shorthaired", "great_pyrenees", "havanese", "japanese_chin", "keeshond",
    "leonberger", "Maine_Coon", "miniature_pinscher", "newfoundland", "Persian", "pomeranian", "pug",
    "Ragdoll", "Russian_Blue", "saint_bernard", "samoyed", "scottish_terrier", "shiba_inu",
    "Siamese", "Sphynx", "staffordshire_bull_terrier", "wheaten_terrier", "yorkshire_terrier" }
  return t
end

-- table{ rows = {...}, cols = {...}, metric = "accuracy" }: the report spec. A file's `table`
-- stays Lua's table library (table.concat etc. keep working; M.file_env gives each file a copy
-- with this metatable); calling it makes a report spec.
local REPORT_MT = { __call = function(_, spec)
  local t = tagged("report", spec)
  check_keys(t, { "rows", "cols", "metric", "phase", "digits" }, "table")
  return t
end }

--------------------------------------------------------------------------------------------------
-- --set overrides

--- Parses a --set value: number, boolean, comma list, or string.
local function parse_value(s)
  if s == "true" then return true elseif s == "false" then return false end
  local n = tonumber(s)
  if n then return math.tointeger(n) or n end
  if s:find(",") then
    local t = {}
    for part in s:gmatch("[^,]+") do t[#t + 1] = parse_value(part) end
    return t
  end
  return s
end

--- Applies "key=value" overrides: top-level keys (model, seeds, name, memory_limit, threads,
--- fit) or training fields, bare ("lr=1e-4") or dotted ("train.lr=1e-4"). A swept field given
--- with --set replaces its sweep axis by the single value.
function M.apply_overrides(e, sets)
  for _, kv in ipairs(sets or {}) do
    local k, v = kv:match("^([%w_%.]+)=(.*)$")
    if not k then usage(nil, "--set %s: expected key=value", kv) end
    local key = k:gsub("^train%.", "")
    local val = parse_value(v)
    -- a switch takes the words `gemmarun plan` takes: on/off, yes/no, 1/0 (and true/false)
    local words = { on = true, off = false, yes = true, no = false, ["1"] = true, ["0"] = false }
    if (key == "fit" or (TRAIN[key] and TRAIN[key].kind == "boolean")) and words[v] ~= nil then val = words[v] end
    e._overrides = e._overrides or {}
    e._overrides[key] = "--set " .. kv
    local top = ({ model = 1, model_adapter = 1, seeds = 1, name = 1, memory_limit = 1, threads = 1, device = 1, fit = 1,
      description = 1 })[k]
    if top then
      if k == "seeds" and type(val) ~= "table" then val = { val } end
      e[k] = val
    elseif TRAIN[key] then
      -- one layer is a list of one, as `seeds=1` is (`layers=0,3` is the list)
      if key == "layers" and math.type(val) == "integer" then val = { val } end
      e.train = e.train or {}
      e.train[key] = val
      if e.sweep then e.sweep[key] = nil end
    else
      local allowed = sorted_keys(TRAIN)
      for _, t in ipairs({ "model", "model_adapter", "seeds", "name", "memory_limit", "threads", "device", "fit" }) do allowed[#allowed + 1] = t end
      usage(nil, "--set %s: unknown key '%s'%s (allowed: model, model_adapter, seeds, name, memory_limit, threads, device, fit, or a training field: %s)",
        kv, k, did_you_mean(key, allowed), list_str(sorted_keys(TRAIN)))
    end
  end
end

--------------------------------------------------------------------------------------------------
-- validation and sweep expansion

--- "48GiB", "512MB", 1e9 -> bytes.
local function parse_bytes(where, v)
  local bytes
  if type(v) == "number" then
    bytes = v
  elseif type(v) == "string" then
    local num, unit = v:match("^%s*([%d%.eE+]+)%s*(%a*)%s*$")
    local mult = ({ [""] = 1, B = 1, KB = 1e3, MB = 1e6, GB = 1e9, TB = 1e12, KiB = 1024, MiB = 2 ^ 20, GiB = 2 ^ 30, TiB = 2 ^ 40 })[unit or ""]
    if not num or not tonumber(num) or not mult then
      usage(where, "memory_limit = \"%s\": expected a number with a unit B, KB, MB, GB, TB, KiB, MiB, GiB or TiB", v)
    end
    bytes = tonumber(num) * mult
  else
    usage(where, "memory_limit must be a size such as \"48GiB\"")
  end
  -- the planner's range (lua/main.c plan): at least a byte, at most 2^60 bytes (1 EiB)
  if not (bytes >= 1 and bytes <= 2 ^ 60) then
    usage(where, "memory_limit = %s: must be between 1 B and 2^60 B (1 EiB)", tostring(v))
  end
  return math.floor(bytes)
end
M.parse_bytes = parse_bytes

local function validate_data(d, where)
  if type(d) ~= "table" or not d._kind then
    usage(where, "task.data must be a data set (data.fortunes{...}, data.folder{...}, data.image_folder{...}, data.image_grid{...}, data.jsonl{...}, data.oxford_pets{...})")
  end
  if d._kind == "fortunes" then
    if not is_list(d.topics) or #d.topics < 2 then usage(d._where, "data.fortunes: topics must list at least 2 topic files") end
    for _, n in ipairs({ "train", "test", "max_chars" }) do
      if d[n] ~= nil and (math.type(d[n]) ~= "integer" or d[n] < 1) then usage(d._where, "data.fortunes: %s must be a positive integer", n) end
    end
  elseif d._kind == "folder" or d._kind == "image_folder" then
    if type(d.root) ~= "string" then usage(d._where, "data.%s: root must be a folder path", d._kind) end
    if d.test ~= nil and (math.type(d.test) ~= "integer" or d.test < 2) then
      usage(d._where, "data.%s: test must be an integer >= 2 (every test-th example of a label is a test example)", d._kind)
    end
    -- labels and exclude are folder names: one path component each
    for _, key in ipairs({ "labels", "exclude" }) do
      local v = d[key]
      if v ~= nil then
        local what = key == "labels" and "the label folders directly below the root to read, e.g. { \"birds\", \"fish\" }"
          or "the names of folders below a label folder not to read, e.g. { \"cartoon\" }"
        if not is_list(v) or #v < 1 then usage(d._where, "data.%s: %s must be a non-empty list of folder names (%s)", d._kind, key, what) end
        local seen = {}
        for i, n in ipairs(v) do
          if type(n) ~= "string" or n == "" or n == "." or n == ".." or n:find("/", 1, true) then
            usage(d._where, "data.%s: %s[%d] = %s: must be a folder name (no '/'; %s)", d._kind, key, i,
              type(n) == "string" and string.format("%q", n) or tostring(n), what)
          end
          if seen[n] then usage(d._where, "data.%s: %s lists '%s' twice (%s[%d] and %s[%d])", d._kind, key, n, key, seen[n], key, i) end
          seen[n] = i
        end
      end
    end
    if d.labels and #d.labels < 2 then
      usage(d._where, "data.%s: labels lists one folder; a classifier needs at least 2 labels", d._kind)
    end
  elseif d._kind == "image_grid" then
    if type(d.path) ~= "string" or d.path == "" then usage(d._where, "data.image_grid: path must be an image file (PNG or JPEG)") end
    local c = d.cell
    local function side(v) return math.type(v) == "integer" and v >= 1 end
    if not (side(c) or (is_list(c) and #c == 2 and side(c[1]) and side(c[2]))) then
      usage(d._where, "data.image_grid: cell must be the cells' side in pixels (an integer >= 1, e.g. 20) or {width, height}; got %s",
        type(c) == "table" and "a table that is not {width, height}" or tostring(c))
    end
    if not is_list(d.labels) or #d.labels < 2 then usage(d._where, "data.image_grid: labels must list at least 2 labels, in the order of the sheet's rows") end
    local seen = {}
    for i, l in ipairs(d.labels) do
      if type(l) ~= "string" or l == "" then usage(d._where, "data.image_grid: labels[%d] must be a non-empty string", i) end
      if seen[l] then usage(d._where, "data.image_grid: label '%s' is listed twice (labels[%d] and labels[%d])", l, seen[l], i) end
      seen[l] = i
    end
    if d.split ~= nil and (math.type(d.split) ~= "integer" or d.split < 2) then
      usage(d._where, "data.image_grid: split must be an integer >= 2 (every split-th cell of a label is a test example)")
    end
    for _, n in ipairs({ "train", "test" }) do
      if d[n] ~= nil and (math.type(d[n]) ~= "integer" or d[n] < 1) then
        usage(d._where, "data.image_grid: %s must be a positive integer (the most %s cells kept per label)", n, n == "train" and "training" or "test")
      end
    end
  elseif d._kind == "jsonl" then
    if type(d.train or d.path) ~= "string" then usage(d._where, "data.jsonl: train (or path) must be a .jsonl file path") end
  elseif d._kind == "speech" then
    if type(d.path) ~= "string" or d.path == "" then usage(d._where, "data.speech: path must be a folder of recordings") end
    for _, k in ipairs({ "transcripts", "phones" }) do
      if d[k] ~= nil and (type(d[k]) ~= "string" or d[k] == "") then usage(d._where, "data.speech: %s must be a file path", k) end
    end
    if d.test ~= nil and (math.type(d.test) ~= "integer" or d.test < 2) then
      usage(d._where, "data.speech: test must be an integer >= 2 (every test-th recording is a test example)")
    end
    for _, n in ipairs({ "train", "test_max" }) do
      if d[n] ~= nil and (math.type(d[n]) ~= "integer" or d[n] < 1) then
        usage(d._where, "data.speech: %s must be a positive integer (the most %s examples kept)", n, n == "train" and "training" or "test")
      end
    end
    if d.exclude ~= nil and not is_list(d.exclude) then usage(d._where, "data.speech: exclude must be a list of folder names") end
  end
end

--- Validates an experiment table; returns it normalized (defaults filled). Raises usage errors.
function M.validate(e)
  if type(e) ~= "table" or e._kind ~= "experiment" then
    usage(nil, "the experiment file must return experiment{...}")
  end
  local w = e._where
  local function from0(k) return (e._overrides and e._overrides[k]) or w end
  if type(e.name) ~= "string" or not e.name:match("^[%w_%-]+$") then
    usage(from0("name"), "experiment.name = %s: must be a name of letters, digits, _ and - (it names the results files)", tostring(e.name))
  end
  local composed = type(e.model) == "table" and e.model._kind == "with_vision_tower"
  if not composed and (type(e.model) ~= "string" or e.model == "") then
    usage(from0("model"), "experiment.model must be a model path or name (e.g. \"gemma3-270m\") or with_vision_tower{...}")
  end
  if e.model_adapter ~= nil and (type(e.model_adapter) ~= "string" or e.model_adapter == "") then
    usage(from0("model_adapter"), "experiment.model_adapter must be the path of an adapter to start from (a PEFT adapter folder, a "
      .. "results folder of one trial, a trial file or a checkpoint)")
  end
  if type(e.task) ~= "table" or (e.task._kind ~= "classify" and e.task._kind ~= "sft" and e.task._kind ~= "transcribe") then
    usage(w, "experiment.task must be classify{...}, sft{...} or transcribe{...}")
  end
  validate_data(e.task.data, e.task._where)
  local dk = e.task.data._kind
  if e.task._kind == "classify" and (dk == "jsonl" or dk == "speech") then
    usage(e.task._where, "classify{} needs labelled examples (data.fortunes{...}, data.folder{...}); data.%s holds %s: use it with %s",
      dk, dk == "jsonl" and "chat conversations" or "recordings and transcripts", dk == "jsonl" and "sft{}" or "transcribe{}")
  elseif e.task._kind == "sft" and dk ~= "jsonl" then
    usage(e.task._where, "sft{} trains on chat conversations (data.jsonl{...}); data.%s holds %s", dk,
      dk == "speech" and "recordings and transcripts: use it with transcribe{}" or "labelled examples: use it with classify{}")
  elseif e.task._kind == "transcribe" and dk ~= "speech" then
    usage(e.task._where, "transcribe{} trains on recordings and their transcripts (data.speech{...}), not data.%s", dk)
  end
  if e.task._kind == "transcribe" then
    if type(e.task.prompt) ~= "string" or e.task.prompt == "" then usage(e.task._where, "transcribe.prompt must be a non-empty string") end
    local m = e.task.max_new_tokens
    if m ~= nil and (math.type(m) ~= "integer" or m < 1 or m > 4096) then
      usage(e.task._where, "transcribe.max_new_tokens must be an integer in 1..4096 (the longest answer generated per test example)")
    end
  end
  if e.task._kind == "classify" then
    if type(e.task.prompt) ~= "string" or e.task.prompt == "" then usage(e.task._where, "classify.prompt must be a non-empty string") end
    if e.task.labels ~= nil and (not is_list(e.task.labels) or #e.task.labels < 2) then
      usage(e.task._where, "classify.labels must list at least 2 labels")
    end
  end
  e.train = e.train or {}
  if type(e.train) ~= "table" then usage(w, "experiment.train must be a table of training settings") end
  local train = {}
  local function from(k) return (e._overrides and e._overrides[k]) or w end
  M.where_of = from
  for k, v in pairs(e.train) do train[k] = check_train_value(key_where(from(k), k), k, v) end
  -- the fields the file (or --set) states, as opposed to defaults: with model_adapter, the
  -- adapter's shape fills the others (runner.resolve_model_adapter)
  e._stated = {}
  for k in pairs(train) do e._stated[k] = true end
  for k, f in pairs(TRAIN) do
    if train[k] == nil and f.default ~= nil then train[k] = f.default end
  end
  e.train = train
  e.seeds = e.seeds or { 1 }
  if not is_list(e.seeds) or #e.seeds < 1 then usage(from("seeds"), "experiment.seeds must be a list of integers, e.g. {1, 2, 3}") end
  local seen_seed = {}
  for _, s in ipairs(e.seeds) do
    if math.type(s) ~= "integer" or s < 0 then usage(from("seeds"), "experiment.seeds: %s is not a non-negative integer", tostring(s)) end
    if seen_seed[s] then usage(from("seeds"), "experiment.seeds: %d is listed twice (two runs of one seed are one trial)", s) end
    seen_seed[s] = true
  end
  if e.memory_limit ~= nil then e.memory_limit_bytes = parse_bytes(from("memory_limit"), e.memory_limit) end
  if e.fit ~= nil and type(e.fit) ~= "boolean" then usage(from("fit"), "experiment.fit must be true or false") end
  if e.fit and not e.memory_limit then
    usage(from("fit"), "experiment.fit = true needs a memory_limit to fit into (e.g. memory_limit = \"8GiB\")")
  end
  if e.threads ~= nil and (math.type(e.threads) ~= "integer" or e.threads < 1 or e.threads > 256) then usage(from("threads"), "experiment.threads must be an integer in 1..256") end
  -- where the trials run (core/backend/gm_backend.h: gm_backend_open); the GPU itself is opened
  -- when the model loads, so a machine without one stops before any trial
  if e.device ~= nil and (type(e.device) ~= "string" or not gm.device_ok(e.device)) then
    usage(from("device"), "experiment.device = %s: must be \"cpu\", \"cuda\" or \"cuda:N\" (GPU N)",
      type(e.device) == "string" and string.format("%q", e.device) or tostring(e.device))
  end
  -- the runner writes only under results/ (lua/write_rule.c, gm_bind_check_runner_path)
  if e.results ~= nil and (type(e.results) ~= "string" or not (e.results == "results" or e.results:match("^results/"))
      or e.results:find("..", 1, true)) then
    usage(from("results"), "experiment.results = %s: must be results or a folder under it (e.g. \"results/ablations\"), "
      .. "relative to the working folder, without '..': gemmarun writes only there", type(e.results) == "string"
      and string.format("%q", e.results) or tostring(e.results))
  end
  if e.sweep ~= nil then
    local s = e.sweep
    if type(s) ~= "table" or (s._kind ~= "grid" and s._kind ~= "random") then usage(w, "experiment.sweep must be grid{...} or random{...}") end
    for k, vals in pairs(s) do
      if k:sub(1, 1) ~= "_" and not (s._kind == "random" and (k == "n" or k == "seed")) then
        if k ~= "model" and not TRAIN[k] then
          local sweepable = sorted_keys(TRAIN)
          table.insert(sweepable, 1, "model")
          usage(key_where(s._where, k), "%s: unknown key '%s'%s (sweepable: %s)", s._kind, k, did_you_mean(k, sweepable), list_str(sweepable))
        end
        if s._kind == "grid" or not (type(vals) == "table" and vals._dist) then
          if not is_list(vals) or #vals < 1 then usage(s._where, "%s.%s must be a non-empty list of values", s._kind, k) end
          for _, v in ipairs(vals) do
            if k ~= "model" then check_train_value(s._where, k, v) end
          end
        else
          if type(vals.a) ~= "number" or type(vals.b) ~= "number" or vals.b < vals.a or (vals._dist == "log_uniform" and vals.a <= 0) then
            usage(s._where, "random.%s: %s(a, b) needs numbers a <= b%s", k, vals._dist, vals._dist == "log_uniform" and " with a > 0" or "")
          end
        end
      end
    end
    if s._kind == "random" and (math.type(s.n) ~= "integer" or s.n < 1) then usage(s._where, "random.n must be the number of trials (a positive integer)") end
    if e.model_adapter ~= nil then
      for _, k in ipairs(ADAPTER_SHAPE) do
        if s[k] ~= nil then
          usage(key_where(s._where, k), "%s.%s: the adapter's %s is fixed by model_adapter (%s); it cannot be swept", s._kind, k, k, e.model_adapter)
        end
      end
      if s.model ~= nil then
        usage(key_where(s._where, "model"), "%s.model: model_adapter (%s) belongs to one base model; it cannot be swept", s._kind, e.model_adapter)
      end
    end
  end
  if e.report ~= nil then
    local r = e.report
    if r._kind ~= "report" then usage(w, "experiment.report must be table{rows = {...}, cols = {...}, metric = ...}") end
    local fields = sorted_keys(TRAIN)
    table.insert(fields, 1, "seed")
    table.insert(fields, 1, "model")
    local is_field = {}
    for _, f in ipairs(fields) do is_field[f] = true end
    for _, part in ipairs({ "rows", "cols" }) do
      if r[part] ~= nil and not is_list(r[part]) then usage(r._where, "table.%s must be a list of field names", part) end
      for _, f in ipairs(r[part] or {}) do
        if not is_field[f] then
          usage(key_where(r._where, part), "table.%s: '%s' is not a field%s (fields: %s)", part, tostring(f), did_you_mean(f, fields), list_str(fields))
        end
      end
    end
    -- what the trials record: the evaluation's attributes, then the training series
    local metrics = e.task._kind == "classify" and { "accuracy", "loss", "lr", "grad_norm", "tokens_per_s" }
      or e.task._kind == "transcribe" and { "word_error_rate", "phone_error_rate", "loss", "perplexity", "lr", "grad_norm", "tokens_per_s" }
      or { "loss", "perplexity", "lr", "grad_norm", "tokens_per_s" }
    if r.metric ~= nil then
      local ok = false
      for _, m in ipairs(metrics) do ok = ok or m == r.metric end
      if not ok then
        usage(key_where(r._where, "metric"), "table.metric = %s: %s{} trials record %s%s", tostring(r.metric), e.task._kind,
          list_str(metrics), did_you_mean(tostring(r.metric), metrics))
      end
    end
    if r.phase ~= nil and r.phase ~= "baseline" and r.phase ~= "final" then
      usage(key_where(r._where, "phase"), "table.phase = %s: allowed values are baseline, final", tostring(r.phase))
    end
  end
  if e.validation ~= nil then M.validate_validation(e) end
  return e
end

-- validation = {split = 0.1 | data = <data spec>, eval_steps = 10, select = "last" | "best",
--               metric = "accuracy" (classify) | "loss" (sft), patience = N (early stopping)}
local VALIDATION_KEYS = { "split", "data", "eval_steps", "select", "metric", "patience" }

--- Checks experiment.validation and fills its defaults (eval_steps 10, select "last", the task's
--- metric). A usage error names the field and what it must be.
function M.validate_validation(e)
  local v, w = e.validation, (e._overrides and e._overrides.validation) or e._where
  if type(v) ~= "table" then usage(w, "experiment.validation must be a table {split = 0.1, eval_steps = 10, select = \"best\"}") end
  for k in pairs(v) do
    local known = false
    for _, name in ipairs(VALIDATION_KEYS) do known = known or k == name end
    if not known and not (type(k) == "string" and k:sub(1, 1) == "_") then
      usage(w, "validation: unknown key '%s'%s (allowed: %s)", tostring(k), did_you_mean(tostring(k), VALIDATION_KEYS), list_str(VALIDATION_KEYS))
    end
  end
  if (v.split == nil) == (v.data == nil) then
    usage(w, "validation needs either split (a fraction of the training data, e.g. 0.1) or data (a data set of its own)")
  end
  if v.split ~= nil and type(v.split) ~= "number" then
    usage(w, "validation.split = %s (a %s): must be a number, a fraction of the training data in (0, 0.5]", tostring(v.split), type(v.split))
  end
  if v.split ~= nil and not (v.split > 0 and v.split <= 0.5) then
    usage(w, "validation.split = %s: must be a fraction of the training data in (0, 0.5]", tostring(v.split))
  end
  if v.data ~= nil then
    if type(v.data) ~= "table" or not v.data._kind then
      usage(w, "validation.data must be a data set (data.folder{...}, data.jsonl{...}, data.fortunes{...})")
    end
    validate_data(v.data, v.data._where or w)
    local jsonl = v.data._kind == "jsonl"
    if e.task._kind == "transcribe" and v.data._kind ~= "speech" then
      usage(v.data._where or w, "validation.data: transcribe{} validates on recordings (data.speech{...}), not data.%s", v.data._kind)
    elseif e.task._kind == "transcribe" then
      -- (checked: a speech data set)
    elseif e.task._kind == "classify" and jsonl then
      usage(v.data._where or w, "validation.data: classify{} validates on labelled examples (data.folder{...}, data.fortunes{...}), not data.jsonl")
    elseif e.task._kind == "sft" and not jsonl then
      usage(v.data._where or w, "validation.data: sft{} validates on chat conversations (data.jsonl{...}), not data.%s", v.data._kind)
    end
  end
  v.eval_steps = v.eval_steps or 10
  if math.type(v.eval_steps) ~= "integer" or v.eval_steps < 1 then
    usage(w, "validation.eval_steps = %s: must be a positive integer (evaluate every N optimizer steps)", tostring(v.eval_steps))
  end
  v.select = v.select or "last"
  if v.select ~= "last" and v.select ~= "best" then
    usage(w, "validation.select = %s: allowed values are last (the adapter after the last step), best (the one with the best validation metric)", tostring(v.select))
  end
  local metric = e.task._kind == "classify" and "accuracy" or "loss"
  v.metric = v.metric or metric
  if v.metric ~= metric then
    usage(w, "validation.metric = %s: %s{} trials are validated on %s", tostring(v.metric), e.task._kind, metric)
  end
  if v.patience ~= nil and (math.type(v.patience) ~= "integer" or v.patience < 1) then
    usage(w, "validation.patience = %s: must be a positive integer (evaluations without improvement before stopping)", tostring(v.patience))
  end
end

--- The sweep points: a list of {field = value} tables (one empty table without a sweep).
function M.sweep_points(e)
  local s = e.sweep
  if not s then return { {} } end
  local keys = {}
  for k in pairs(s) do
    if k:sub(1, 1) ~= "_" and not (s._kind == "random" and (k == "n" or k == "seed")) then keys[#keys + 1] = k end
  end
  table.sort(keys)
  if s._kind == "grid" then
    -- keys in the order written are not available from a Lua table; use sorted order
    local points = { {} }
    for _, k in ipairs(keys) do
      local nxt = {}
      for _, p in ipairs(points) do
        for _, v in ipairs(s[k]) do
          local q = {}
          for a, b in pairs(p) do q[a] = b end
          q[k] = v
          nxt[#nxt + 1] = q
        end
      end
      points = nxt
    end
    return points
  end
  -- random search: seeded, independent of anything else
  local rng_state = (s.seed or 0) * 2654435761 + 12345
  local function rnd()
    rng_state = (rng_state * 6364136223846793005 + 1442695040888963407) & 0x7fffffffffffffff
    return (rng_state >> 11) / (2 ^ 52)
  end
  local points = {}
  for i = 1, s.n do
    local p = {}
    for _, k in ipairs(keys) do
      local d = s[k]
      local u = rnd()
      if type(d) == "table" and d._dist == "uniform" then p[k] = d.a + u * (d.b - d.a)
      elseif type(d) == "table" and d._dist == "log_uniform" then p[k] = math.exp(math.log(d.a) + u * (math.log(d.b) - math.log(d.a)))
      elseif type(d) == "table" and d._dist == "int_uniform" then p[k] = math.floor(d.a + u * (d.b - d.a + 1))
      else p[k] = d[math.floor(u * #d) + 1] end
      if k ~= "model" then p[k] = check_train_value(s._where, k, p[k]) end
    end
    points[i] = p
  end
  return points
end

--- The canonical identity of a task (what the data and prompt are), for trial ids.
local function task_identity(t)
  local id = {}
  for k, v in pairs(t) do
    if k:sub(1, 1) ~= "_" then
      if type(v) == "table" and v._kind then
        local d = {}
        for a, b in pairs(v) do if a:sub(1, 1) ~= "_" or a == "_kind" then d[a] = b end end
        id[k] = d
      else id[k] = v end
    end
  end
  id.kind = t._kind
  return id
end
M.task_identity = task_identity

--- Expands a validated experiment into trials: {index, id, config (flat), point (swept values)}.
--- The trial id is a hash of the resolved configuration, the task and the seed, so a rerun
--- recognizes finished trials even if the sweep order changes.
M.MAX_TRIALS = 10000 -- default cap on trials per experiment (--max-trials N raises it)

--- How many trials e expands to, without expanding it (a grid's product, a random search's n,
--- times the seeds), as a float so that a huge product cannot overflow.
function M.count_trials(e)
  local s, n = e.sweep, 1.0
  if s and s._kind == "grid" then
    for k, v in pairs(s) do
      if k:sub(1, 1) ~= "_" then n = n * #v end
    end
  elseif s then
    n = s.n
  end
  return n * #e.seeds
end

--- Training options added after trial ids were first given, with their defaults (issue 10: what of
--- the image path trains, pan & scan, the GPU's GEMM precision; issue 15: the audio encoder's LoRA).
local LATER_OPTIONS = { vision_targets = "none", modules_to_save = "none", pan_and_scan = false, compute = "auto",
  audio_targets = "none" }
M.LATER_OPTIONS = LATER_OPTIONS

function M.expand(e, max_trials)
  max_trials = max_trials or M.MAX_TRIALS
  local count = M.count_trials(e)
  if count > max_trials then
    local s, parts = e.sweep, {}
    if s and s._kind == "grid" then
      local keys = {}
      for k in pairs(s) do if k:sub(1, 1) ~= "_" then keys[#keys + 1] = k end end
      table.sort(keys)
      for _, k in ipairs(keys) do parts[#parts + 1] = string.format("%s %d", k, #s[k]) end
    elseif s then
      parts[#parts + 1] = string.format("random n = %d", s.n)
    end
    parts[#parts + 1] = string.format("seeds %d", #e.seeds)
    usage((s and s._where) or e._where, "the experiment expands to %.0f trials (%s), more than the limit of %d; "
      .. "sweep fewer values, or raise the limit with --max-trials N", count, table.concat(parts, " x "), max_trials)
  end
  local trials = {}
  local swept = {}
  if e.sweep then
    for k in pairs(e.sweep) do
      if k:sub(1, 1) ~= "_" and not (e.sweep._kind == "random" and (k == "n" or k == "seed")) then swept[#swept + 1] = k end
    end
    table.sort(swept)
  end
  local seen, duplicates = {}, 0 -- trial id -> index; random points drawn twice
  for _, p in ipairs(M.sweep_points(e)) do
    for _, seed in ipairs(e.seeds) do
      local cfg = { model = e.model, seed = seed, model_adapter = e.model_adapter }
      for k, v in pairs(e.train) do cfg[k] = v end
      for k, v in pairs(p) do cfg[k] = v end
      -- (validation only when given, and the options added since ids were first given only when
      -- not at their defaults: the ids of experiments without them stay as they were)
      local id_cfg = {}
      for k, v in pairs(cfg) do if LATER_OPTIONS[k] ~= v then id_cfg[k] = v end end
      local identity = gm.json_encode({ experiment = e.name, config = id_cfg, task = task_identity(e.task),
        validation = e.validation and task_identity(e.validation) or nil })
      local id = gm.sha256(identity):sub(1, 12)
      local twin = seen[id]
      if twin and (not e.sweep or e.sweep._kind == "grid") then
        -- one trial file per id: a value listed twice would train one trial twice and count it
        -- twice in nothing (the second finds the first's file done)
        local what = {}
        for _, k in ipairs(swept) do what[#what + 1] = k .. "=" .. tostring(p[k]) end
        what[#what + 1] = "seed=" .. tostring(seed)
        usage((e.sweep and e.sweep._where) or e._where, "trials %d and %d are the same trial (%s): a value is listed twice in "
          .. "the sweep; list each once", twin, #trials + 1, table.concat(what, " "))
      end
      if twin then
        -- a random search drew a point it had drawn before: it runs once
        duplicates = duplicates + 1
      else
        seen[id] = #trials + 1
        trials[#trials + 1] = { index = #trials + 1, id = id, config = cfg, point = p, seed = seed }
      end
    end
  end
  trials.duplicates = duplicates
  return trials, swept
end

--------------------------------------------------------------------------------------------------
-- the experiment file's environment

-- What a file sees of the standard library: the base functions (dofile, loadfile and require
-- are the sandbox's refusals unless --allow-os, lua/gm_lua.c), and copies of the libraries.
local BASE = { "assert", "collectgarbage", "dofile", "error", "getmetatable", "ipairs", "loadfile", "next",
  "pairs", "pcall", "print", "rawequal", "rawget", "rawlen", "rawset", "require", "select", "setmetatable",
  "tonumber", "tostring", "type", "warn", "xpcall", "_VERSION" }
local LIBRARIES = { "string", "table", "math", "utf8", "os", "io", "coroutine", "debug", "package", "gm" }
-- captured now, before any file runs: the values a file's environment is made of
local base, libraries = {}, {}
for _, name in ipairs(BASE) do base[name] = _G[name] end
for _, name in ipairs(LIBRARIES) do libraries[name] = _G[name] end
local raw_load, raw_loadfile, allow_os = load, loadfile, GM_ALLOW_OS

local function copy(t)
  local c = {}
  for k, v in next, t do c[k] = v end
  return c
end

--- A fresh table of globals for one experiment file (lua/gm_lua.c sets it as the file's _ENV):
--- the API (experiment, grid, random, uniform, log_uniform, int_uniform, classify, sft, data,
--- table{}, env, load_model), the allowed base functions, `arg` (the command-line arguments,
--- when given), and copies of string, table, math, utf8, os, io, gm (and, with --allow-os,
--- debug and package), so that what the file assigns or deletes, there or in a library, stays
--- in the file. (The file can still reach the real string library through getmetatable(""):
--- editing that is sabotage on purpose, and grants nothing the sandbox refuses.)
--- load() takes text chunks only (unless --allow-os) and gives the chunk the file's globals
--- unless it is given an environment; with --allow-os, loadfile and dofile do the same (a
--- module loaded with require runs in the common global table: use what it returns).
function M.file_env(args)
  local fe = {}
  for name, f in pairs(base) do fe[name] = f end
  for name, lib in pairs(libraries) do fe[name] = copy(lib) end
  for name, v in pairs(API) do fe[name] = v end
  fe.data = copy(data)
  setmetatable(fe.table, REPORT_MT)
  -- an environment is passed on only when given: an explicit nil would leave the chunk
  -- without globals
  fe.load = function(chunk, name, mode, ...)
    if not allow_os then mode = "t" end
    if select("#", ...) == 0 then return raw_load(chunk, name, mode, fe) end
    return raw_load(chunk, name, mode, ...)
  end
  if allow_os then
    fe.loadfile = function(path, mode, ...)
      if select("#", ...) == 0 then return raw_loadfile(path, mode, fe) end
      return raw_loadfile(path, mode, ...)
    end
    fe.dofile = function(path) return assert(raw_loadfile(path, "bt", fe))() end
  end
  fe.arg = args
  fe._G = fe
  return fe
end

GM_PRELUDE = M

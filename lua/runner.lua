-- runner.lua: runs a validated experiment - every trial not already complete - and renders the
-- tables. Loaded by lua/main.c (gm_module("runner").run(experiment, cli)) after the experiment
-- file returned its experiment{...}.
--
-- Per trial (DESIGN.md §4): plan memory (refuse before loading if over memory_limit, or fit),
-- load the model (reused across trials), tokenize every example up front (rejections counted with
-- reasons), baseline evaluation, training (resumable checkpoints every checkpoint_every steps and
-- on Ctrl-C), final evaluation, results file. A failing trial is recorded as failed with its
-- reason and the sweep goes on. Exit code: 0 all trials done, 1 some failed or interrupted.
--
-- Data parallel (docs/scaling.md): under mpirun / srun every rank runs this same code on the same
-- data; each optimizer step's examples are split by rank (rank r: micro-batches r*A+1 .. r*A+A of
-- the step's world_size*A) and the trainer all-reduces the gradients (gm_trainer_set_dist). Only
-- rank 0 writes (results files, checkpoints, tables), prints and evaluates; the others keep no
-- results file (NO_RESULTS) and wait. Every rank reads a checkpoint to resume from.

local P = GM_PRELUDE
local R = {}

local function fmt_bytes(b)
  if b >= 2 ^ 30 then return string.format("%.2f GiB", b / 2 ^ 30) end
  return string.format("%.1f MiB", b / 2 ^ 20)
end
R.fmt_bytes = fmt_bytes

local function fmt_time(s)
  if s ~= s or s == math.huge or s < 0 then return "?" end
  s = math.floor(s + 0.5)
  if s >= 3600 then return string.format("%dh%02dm", s // 3600, (s % 3600) // 60) end
  if s >= 60 then return string.format("%dm%02ds", s // 60, s % 60) end
  return string.format("%ds", s)
end

-- this process's place in the data-parallel world (gm.dist_info, lua/bind_dist.c); rank 0 is the
-- only one that writes and prints
local DIST = gm.dist_info()
local ROOT = DIST.rank == 0
R.dist = DIST

local function say(fmt, ...) if ROOT then print(string.format(fmt, ...)) end end
local function progress(line, final) if ROOT then gm.progress(line, final) end end

-- What a rank other than 0 holds instead of a results file: every method does nothing (rows()
-- is 0), so the runner's bookkeeping runs unchanged and nothing is written.
local NO_RESULTS = setmetatable({}, { __index = function() return function() return 0 end end })

--- An error's text without the position of the runner's own code ("lua/runner.lua:97: "), which
--- tells the user nothing.
local function clean_msg(err)
  local m = type(err) == "table" and tostring(err.msg or err) or tostring(err)
  return (m:gsub("^lua/[%w_]+%.lua:%d+: ", ""))
end

--------------------------------------------------------------------------------------------------
-- data

--- The examples of a labelled folder (data.folder, data.image_folder) into items: root/<label>/...
--- (or root/train/<label> and root/test/<label>), the folder directly below the root is the label
--- and an example anywhere below it counts for it (root/mammals/dogs/dog.png is a 'mammals'
--- example), as torchvision's ImageFolder reads; item(path) makes a file's example (nil: not one).
--- d.labels keeps only those label folders, in its order; folders named in d.exclude are not read
--- at any depth below a label. Files and folders are read in name order, so without train/ and
--- test/, every `test`-th example of each label (default 5: 20%) in path order is a test example:
--- a fixed split, stratified by label. A label folder without an example is an error (`what` it
--- needs): a label the model could never see. A folder met again through a symbolic link (a loop,
--- or a folder linked from two places) is read once, the link listed.
--- The most frequent label among items.test (the first of equals, in label order), as the clause
--- "the most frequent, L, is N of the M test examples (P%)": what always answering it scores.
local function test_majority(items)
  local n_test, top = {}, 1
  for li = 1, #items.labels do n_test[li] = 0 end
  for _, it in ipairs(items.test) do n_test[it.label] = n_test[it.label] + 1 end
  for li = 1, #items.labels do if n_test[li] > n_test[top] then top = li end end
  return string.format("the most frequent, %s, is %d of the %d test examples (%.1f%%)", items.labels[top], n_test[top],
    #items.test, 100 * n_test[top] / #items.test)
end

local function labelled_folder(d, items, what, item)
  local count, folder_of, index = {}, {}, {} -- examples per label, a folder of it (for the message)
  local in_train = {} -- labels with a training example (split layout)
  local wanted, excluded = {}, {}
  for _, n in ipairs(d.labels or {}) do wanted[n] = true end
  for _, n in ipairs(d.exclude or {}) do excluded[n] = true end
  local left_out, n_excluded, excluded_seen = {}, 0, {} -- label folders not in d.labels; folders d.exclude left out
  local read = {} -- real path of every folder read -> its path as met
  items.skipped = items.skipped or {}
  local function label_index(lab, dir)
    local li = index[lab]
    if not li then
      items.labels[#items.labels + 1] = lab
      li = #items.labels
      index[lab] = li
      count[li], folder_of[li] = 0, dir
    end
    return li
  end
  -- every example below dir, depth first in name order, into `into` as label li
  local function walk(dir, li, into, seen)
    for _, f in ipairs(gm.list_dir(dir)) do
      local path = dir .. "/" .. f
      if gm.is_dir(path) then
        local real = gm.real_path(path)
        if excluded[f] then
          n_excluded = n_excluded + 1
          excluded_seen[f] = true
        elseif read[real] then
          items.skipped[#items.skipped + 1] = { path = path, reason = "a link to a folder already read (" .. read[real] .. ")" }
        else
          read[real] = path
          walk(path, li, into, seen)
        end
      else
        -- what is not an example is listed, never silently dropped
        local it = item(path)
        if it then
          it.label = li
          into[#into + 1] = it
          count[li] = count[li] + 1
          if seen then seen[li] = true end
        else
          items.skipped[#items.skipped + 1] = { path = path, reason = "not a " .. what }
        end
      end
    end
  end
  local function read_split(root, into, seen)
    if d.labels then
      -- the listed labels in their order; a missing folder is an error below (no examples)
      for _, lab in ipairs(d.labels) do
        local dir = root .. "/" .. lab
        local li = label_index(lab, dir)
        if gm.is_dir(dir) and not read[gm.real_path(dir)] then
          read[gm.real_path(dir)] = dir
          walk(dir, li, into, seen)
        end
      end
    end
    for _, lab in ipairs(gm.list_dir(root)) do
      local dir = root .. "/" .. lab
      if gm.is_dir(dir) then
        if not d.labels then
          local real = gm.real_path(dir)
          if read[real] then
            items.skipped[#items.skipped + 1] = { path = dir, reason = "a link to a folder already read (" .. read[real] .. ")" }
          else
            read[real] = dir
            walk(dir, label_index(lab, dir), into, seen)
          end
        elseif not wanted[lab] and not left_out[lab] then
          left_out[#left_out + 1], left_out[lab] = lab, true
        end
      end
    end
  end
  if not gm.is_dir(d.root) then P.usage(d._where, "data.%s: %s is not a folder", d._kind, d.root) end
  local has_train, has_test = gm.is_dir(d.root .. "/train"), gm.is_dir(d.root .. "/test")
  if has_train ~= has_test then
    P.usage(d._where, "data.%s: %s has %s/ but no %s/: give both splits as folders, or neither (labels directly below the root)",
      d._kind, d.root, has_train and "train" or "test", has_train and "test" or "train")
  end
  local every = d.test or 5
  if has_train and has_test then
    read_split(d.root .. "/train", items.train, in_train)
    read_split(d.root .. "/test", items.test)
    for li, lab in ipairs(items.labels) do
      if not in_train[li] and count[li] > 0 then
        P.usage(d._where, "data.%s: label '%s' has test examples but no training example (%s/train/%s is missing or empty): "
          .. "the model could never learn it; add training examples or remove %s/test/%s", d._kind, lab, d.root, lab, d.root, lab)
      end
    end
  else
    local all = {}
    read_split(d.root, all)
    local seen = {}
    for _, it in ipairs(all) do
      seen[it.label] = (seen[it.label] or 0) + 1
      if seen[it.label] % every == 0 then items.test[#items.test + 1] = it else items.train[#items.train + 1] = it end
    end
  end
  for li, lab in ipairs(items.labels) do
    if count[li] == 0 then
      if not gm.is_dir(folder_of[li]) then
        local parent, there = folder_of[li]:match("^(.*)/[^/]*$"), {}
        for _, n in ipairs(gm.list_dir(parent)) do
          if gm.is_dir(parent .. "/" .. n) then there[#there + 1] = n end
        end
        P.usage(d._where, "data.%s: labels lists '%s', but %s is not a folder (the folders there: %s)", d._kind, lab,
          folder_of[li], #there > 0 and table.concat(there, ", ") or "none")
      end
      P.usage(d._where, "data.%s: %s (label '%s') has no %s%s; add examples or remove the folder", d._kind, folder_of[li], lab,
        what, n_excluded > 0 and " outside the excluded folders" or "")
    end
  end
  -- how the folder was read: each label's train/test examples, the most frequent label's share of
  -- the test examples (what always answering it scores), and what was left out
  local n_train, n_test = {}, {}
  for li = 1, #items.labels do n_train[li], n_test[li] = 0, 0 end
  for _, it in ipairs(items.train) do n_train[it.label] = n_train[it.label] + 1 end
  for _, it in ipairs(items.test) do n_test[it.label] = n_test[it.label] + 1 end
  local per = {}
  for li, lab in ipairs(items.labels) do per[li] = string.format("%s %d/%d", lab, n_train[li], n_test[li]) end
  local notes = {}
  if #left_out > 0 then notes[#notes + 1] = "label folders not in labels: " .. table.concat(left_out, ", ") end
  if n_excluded > 0 then
    local names = {}
    for _, n in ipairs(d.exclude) do if excluded_seen[n] then names[#names + 1] = n end end
    notes[#notes + 1] = string.format("%d folder%s named %s (exclude)", n_excluded, n_excluded == 1 and "" or "s",
      table.concat(names, " or "))
  end
  local nth = (every % 100 // 10 ~= 1 and ({ "st", "nd", "rd" })[every % 10]) or "th"
  say("data.%s: %s: examples per label (train/test, %s): %s%s%s", d._kind, d.root,
    has_train and "from train/ and test/" or string.format("every %d%s of a label's is a test example", every, nth),
    table.concat(per, ", "),
    #items.test > 0 and ("; " .. test_majority(items)) or "",
    #notes > 0 and ("; left out: " .. table.concat(notes, "; ")) or "")
end

--- Raw items of a classification data set: {train = {{text, label}...}, test = ..., labels = {...}}.
local function load_classify_items(d)
  local items = { train = {}, test = {}, labels = {} }
  if d._kind == "fortunes" then
    local n_train, n_test = d.train or 40, d.test or 20
    for li, topic in ipairs(d.topics) do
      items.labels[li] = topic
      local f = gm.fortunes(topic, { max_chars = d.max_chars or 300, dir = d.dir })
      if #f < n_train + n_test then
        P.usage(d._where, "data.fortunes: topic '%s' has %d entries of at most %d characters; %d train + %d test requested",
          topic, #f, d.max_chars or 300, n_train, n_test)
      end
      for i = 1, n_train do items.train[#items.train + 1] = { text = f[i], label = li } end
      for i = n_train + 1, n_train + n_test do items.test[#items.test + 1] = { text = f[i], label = li } end
    end
  elseif d._kind == "folder" then
    labelled_folder(d, items, "text file of at most " .. (d.max_chars or 4000) .. " characters", function(path)
      local text = gm.read_text(path)
      if #text <= (d.max_chars or 4000) then return { text = text } end
    end)
  elseif d._kind == "image_folder" then
    local IMAGE_EXT = { png = true, jpg = true, jpeg = true }
    labelled_folder(d, items, ".png or .jpg image", function(path)
      local ext = path:match("%.(%w+)$")
      if ext and IMAGE_EXT[ext:lower()] then return { images = { path }, where = path } end
    end)
  elseif d._kind == "image_grid" then
    -- a sprite sheet cut into cells, each cell one example: an image reference to its rectangle
    -- (core/image's "#xywh=X,Y,W,H"), so no file is written and the sheet's sha256 with each
    -- rectangle is the data's identity; rows and columns are counted from 0, as pixels are
    local path = d.path
    if not gm.file_exists(path) then
      if path == "/usr/share/doc/opencv-doc/examples/data/digits.png" then
        P.usage(d._where, "data.image_grid: %s does not exist: it comes with Debian's opencv-doc package (apt-get install opencv-doc; ./setup.sh installs it)", path)
      end
      P.usage(d._where, "data.image_grid: %s does not exist (path names the sheet: a PNG or JPEG file)", path)
    end
    local ok, sha_or_err, W, H = pcall(gm.image_check, path)
    if not ok then P.usage(d._where, "data.image_grid: %s", clean_msg(sha_or_err)) end
    local cw, ch = d.cell, d.cell
    if type(d.cell) == "table" then cw, ch = d.cell[1], d.cell[2] end
    local K = #d.labels
    if W % cw ~= 0 or H % ch ~= 0 then
      P.usage(d._where, "data.image_grid: %s is %d x %d pixels, which cells of %d x %d do not tile (%s)", path, W, H, cw, ch,
        W % cw ~= 0 and string.format("%d columns of %d leave %d pixels", W // cw, cw, W % cw)
          or string.format("%d rows of %d leave %d pixels", H // ch, ch, H % ch))
    end
    local cols, rows = W // cw, H // ch
    if rows % K ~= 0 then
      P.usage(d._where, "data.image_grid: %s is %d x %d pixels: %d rows of %d-pixel cells, which %d labels cannot share evenly "
        .. "(each label takes the same number of consecutive rows)", path, W, H, rows, ch, K)
    end
    local per, every = rows // K, d.split or 5
    items.labels = {}
    local counts = {} -- "label train/test" per label, said once: how the sheet was cut
    for k, lab in ipairs(d.labels) do
      items.labels[k] = lab
      local n, n_train, n_test, row_min, row_max = 0, 0, 0, math.huge, -1
      for r = (k - 1) * per, k * per - 1 do
        for c = 0, cols - 1 do
          n = n + 1
          local is_test = n % every == 0
          local into, cap, have = items.train, d.train, n_train
          if is_test then into, cap, have = items.test, d.test, n_test end
          if not cap or have < cap then
            into[#into + 1] = { images = { string.format("%s#xywh=%d,%d,%d,%d", path, c * cw, r * ch, cw, ch) }, label = k,
              where = string.format("%s cell (row %d, col %d)", path, r, c) }
            if is_test then n_test = n_test + 1 else n_train = n_train + 1 end
            row_min, row_max = math.min(row_min, r), math.max(row_max, r)
          end
        end
      end
      counts[k] = string.format("%s rows %d-%d %d/%d", lab, row_min, row_max, n_train, n_test)
    end
    say("data.image_grid: %s is %d x %d pixels: %d rows x %d columns of %d x %d cells, %d rows per label; "
      .. "per label (rows of its cells used, train/test): %s", path, W, H, rows, cols, cw, ch, per, table.concat(counts, ", "))
  elseif d._kind == "oxford_pets" then
    -- the official layout (https://www.robots.ox.ac.uk/~vgg/data/pets/): images/<Breed_name>_<n>.jpg,
    -- annotations/trainval.txt and annotations/test.txt with lines "<image> <class id 1..37>
    -- <species> <breed id>"; the label is the class id, whose name the image's own name carries
    local root = d.root or "data/oxford-iiit-pet"
    if not gm.is_dir(root) then
      P.usage(d._where, "data.oxford_pets: %s is not a folder; download https://www.robots.ox.ac.uk/~vgg/data/pets/ " ..
        "(images.tar.gz, annotations.tar.gz) and unpack both into it (or set PETS_ROOT)", root)
    end
    items.labels = d.classes
    local K = #d.classes
    local seen = {} -- image -> the line that listed it: an image listed twice, or in both splits, is an error
    local function read(name, into)
      local path = root .. "/annotations/" .. name
      local ok, text = pcall(gm.read_text, path)
      if not ok then
        P.usage(d._where, "data.oxford_pets: %s: %s (annotations.tar.gz unpacks annotations/trainval.txt and annotations/test.txt)",
          path, clean_msg(text))
      end
      local n = 0
      for line in (text .. "\n"):gmatch("([^\n]*)\n") do
        n = n + 1
        if line:match("%S") and not line:match("^%s*#") then
          local img, id = line:match("^%s*(%S+)%s+(%S+)")
          local cid = math.tointeger(tonumber(id or ""))
          if not img or not cid then
            P.usage(d._where, "data.oxford_pets: %s:%d: expected \"<image> <class id> <species> <breed id>\", got %q", path, n, line)
          end
          if cid < 1 or cid > K then
            P.usage(d._where, "data.oxford_pets: %s:%d: class id %d is outside 1..%d (image %s)", path, n, cid, K, img)
          end
          local breed = img:match("^(.*)_%d+$")
          if breed ~= d.classes[cid] then
            P.usage(d._where, "data.oxford_pets: %s:%d: image %s has class id %d (%s), but its name says %s", path, n, img,
              cid, d.classes[cid], breed or "no breed")
          end
          if seen[img] then
            P.usage(d._where, "data.oxford_pets: %s:%d: image %s is listed again (first at %s)%s", path, n, img, seen[img],
              seen[img]:find(name, 1, true) and "" or ": an image in both splits would be tested on what it trained on")
          end
          seen[img] = path .. ":" .. n
          local file = root .. "/images/" .. img .. ".jpg"
          into[#into + 1] = { images = { file }, label = cid, where = path .. ":" .. n }
        end
      end
    end
    read("trainval.txt", items.train)
    read("test.txt", items.test)
  else
    P.usage(d._where, "data set %s cannot be used for classify{}", d._kind)
  end
  return items
end

--- A message's content as Gemma's chat template writes it, and its images and audio clips: a string
--- stays as it is; a list of Hugging Face content parts ({"type": "text", "text": ...}, {"type":
--- "image", "path": ...}, {"type": "audio", "path": ...}) becomes the trimmed texts with
--- "<start_of_image>" where each image goes and "<start_of_audio>" where each clip goes (each
--- expanded to its block of soft tokens when tokenized), the files' paths resolved against `base`
--- (the JSONL file's folder). Returns text | nil, why.
-- The media parts a content list may hold: the text marking each one's place (expanded to its
-- block of soft tokens when tokenized) and what its file is.
local MEDIA_PARTS = {
  image = { marker = "<start_of_image>", file = "an image file" },
  audio = { marker = "<start_of_audio>", file = "an audio file, WAV, FLAC, Ogg or MP3" },
}

local function flatten_content(content, base, images, audio)
  if type(content) == "string" then return content end
  if type(content) ~= "table" then return nil, "content must be a string or a list of parts" end
  local text = {}
  for j, part in ipairs(content) do
    if type(part) ~= "table" then return nil, string.format("content part %d must be an object", j) end
    if part.type == "text" then
      if type(part.text) ~= "string" then return nil, string.format("content part %d: a text part needs a string \"text\"", j) end
      text[#text + 1] = (part.text:gsub("^%s+", ""):gsub("%s+$", ""))
    elseif MEDIA_PARTS[part.type] then
      local kind = MEDIA_PARTS[part.type]
      local p = part.path or part[part.type] or part.url
      if type(p) ~= "string" or p == "" then
        return nil, string.format("content part %d: an %s part needs \"path\": %s (relative to the JSONL file)", j, part.type, kind.file)
      end
      if p:match("^%a[%w+.-]*://") then
        return nil, string.format("content part %d: %s %s is a URL; gemmarun reads local files only (download it and give its path)", j, part.type, p)
      end
      local into = part.type == "image" and images or audio
      into[#into + 1] = p:sub(1, 1) == "/" and p or (base .. "/" .. p)
      text[#text + 1] = kind.marker
    else
      return nil, string.format("content part %d: type '%s' (allowed: text, image, audio)", j, tostring(part.type))
    end
  end
  return table.concat(text)
end

--- Raw conversations of a chat data set (JSONL, Hugging Face format).
--- What keeps a chat conversation from training, or nil: messages must be a non-empty list of
--- {role = system|user|assistant|model, content = string} ending with the model's turn.
local CHAT_ROLES = { system = true, user = true, assistant = true, model = true }
local function chat_problem(msgs)
  if #msgs == 0 then return "no messages" end
  for i, m in ipairs(msgs) do
    if type(m) ~= "table" or type(m.role) ~= "string" or type(m.content) ~= "string" then
      return string.format("message %d needs string fields role and content", i)
    end
    if not CHAT_ROLES[m.role] then
      return string.format("message %d: role '%s' (allowed: system, user, assistant, model)", i, m.role)
    end
  end
  local last = msgs[#msgs].role
  if last ~= "assistant" and last ~= "model" then return "the conversation does not end with an assistant turn (nothing to learn)" end
  return nil
end

--- Parses the text of a JSONL chat file (one {"messages": [...]} per line; blank lines skipped):
--- returns the conversations, and appends to `bad` those the chat template cannot render
--- ({example = "path:line", reason}). A line that is not such an object is an error naming
--- path:line. (Fuzzed by tests/fuzz/fuzz_jsonl.c.)
function R.parse_chat_jsonl(text, path, bad)
  local out = {}
  local n = 0
  local base = path:match("^(.*)/[^/]*$") or "."
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    if line:match("%S") then
      local ok, obj = pcall(gm.json_decode, line)
      if not ok or type(obj) ~= "table" or type(obj.messages) ~= "table" then
        error(string.format("%s:%d: expected a JSON object with \"messages\": [{\"role\": ..., \"content\": ...}, ...]", path, n), 0)
      end
      -- content parts (images, audio) become the template's text and the conversation's lists
      local images, audio, why = {}, {}, nil
      for i, m in ipairs(obj.messages) do
        if type(m) == "table" and type(m.content) == "table" then
          local ni, na = #images, #audio
          local t, w = flatten_content(m.content, base, images, audio)
          if not t then why = string.format("message %d: %s", i, w); break end
          -- the model is given images and audio, it does not produce them
          if (#images > ni or #audio > na) and (m.role == "assistant" or m.role == "model") then
            why = string.format("message %d: an %s turn holds %s; images and audio are read in user and system turns only",
              i, m.role, #audio > na and "an audio part" or "an image part")
            break
          end
          m.content = t
        end
      end
      if #images > 0 then obj.messages.images = images end
      if #audio > 0 then obj.messages.audio = audio end
      if #images > 0 and #audio > 0 then why = why or "it has both images and audio; gemmarun reads one or the other per example" end
      obj.messages.where = path .. ":" .. n
      -- a conversation the chat template cannot render is rejected (counted, with its line)
      why = why or chat_problem(obj.messages)
      if why then
        bad[#bad + 1] = { example = path .. ":" .. n, reason = why }
      else
        out[#out + 1] = obj.messages
      end
    end
  end
  return out
end

local function load_chat_items(d)
  local bad = {}
  local function read(path) return R.parse_chat_jsonl(gm.read_text(path), path, bad) end
  local items = { train = read(d.train or d.path) }
  if d.test then
    items.test = read(d.test)
  else
    local all = items.train
    items.train, items.test = {}, {}
    local every = math.max(2, math.floor(1 / (d.test_fraction or 0.1) + 0.5))
    for i, m in ipairs(all) do
      if i % every == 0 then items.test[#items.test + 1] = m else items.train[#items.train + 1] = m end
    end
  end
  items.rejected_read = bad
  return items
end

--- A transcript's words for the error rates and the dictionary: lower case, letters, digits and
--- apostrophes (every other character a space), as jiwer's common normalization.
local function words_of(text)
  local w = {}
  for word in text:lower():gsub("[^%w']", " "):gmatch("%S+") do w[#w + 1] = word end
  return w
end

local DIGITS = { ["0"] = "zero", ["1"] = "one", ["2"] = "two", ["3"] = "three", ["4"] = "four", ["5"] = "five", ["6"] = "six",
  ["7"] = "seven", ["8"] = "eight", ["9"] = "nine" }

local AUDIO_EXT = { wav = true, flac = true, ogg = true, oga = true, opus = true, mp3 = true, aiff = true, aif = true, w64 = true }

--- Recordings and transcripts (data.speech): items.train / items.test are chat examples (the task's
--- prompt after the clip; the transcript, and its phones on a second line when the data set gives
--- a dictionary, as the answer), each with .audio = {file}, .where, .ref_words and .ref_phones (the
--- reference the error rates compare with). Transcripts: a file of "name: text", "name<TAB>text"
--- or "name text" lines (gzip or not), else "<name>.txt" beside the clip.
local function load_speech_items(d, task)
  local root = d.path:gsub("/+$", "")
  if not gm.is_dir(root) then error(string.format("data.speech: %s is not a folder", root), 0) end
  local lines, dup = {}, {}
  if d.transcripts then
    local n = 0
    for line in (gm.read_text(d.transcripts):gsub("^\239\187\191", "") .. "\n"):gmatch("([^\n]*)\n") do
      n = n + 1
      line = line:gsub("\r$", "")
      if not line:match("^%s*[;#]") and line:match("%S") then
        -- Asterisk's "name: text" (a name without spaces), else Kaldi's "name text"
        local name, text = line:match("^([^%s:;]+):%s*(.-)%s*$")
        if not name then name, text = line:match("^(%S+)%s*(.-)%s*$") end
        if name then
          if lines[name] then dup[name] = string.format("%s:%d", d.transcripts, n) else lines[name] = text end
        end
      end
    end
  end
  local exclude = {}
  for _, x in ipairs(d.exclude or {}) do exclude[x] = true end
  local files = {}
  local seen = {} -- folders by their real path: a link back up (a loop) is read once
  local function walk(dir, rel)
    local real = gm.real_path(dir)
    if seen[real] then return end
    seen[real] = true
    for _, name in ipairs(gm.list_dir(dir)) do
      local path, r = dir .. "/" .. name, rel == "" and name or (rel .. "/" .. name)
      if gm.is_dir(path) then
        if not exclude[name] then walk(path, r) end
      else
        local stem, ext = r:match("^(.*)%.([%w]+)$")
        if stem and AUDIO_EXT[ext:lower()] then files[#files + 1] = { path = path, name = stem } end
      end
    end
  end
  walk(root, "")
  table.sort(files, function(a, b) return a.name < b.name end)
  for _, f in ipairs(files) do
    f.text = lines[f.name]
    if not f.text and gm.file_exists((f.path:gsub("%.[%w]+$", ".txt"))) then
      f.text = gm.read_text((f.path:gsub("%.[%w]+$", ".txt"))):gsub("%s+$", "")
    end
  end
  local dict
  if d.phones then
    -- only the transcripts' words are kept (a whole CMU dictionary, 134,723 entries, would stay in
    -- the process for every trial: tens of MiB of Lua strings)
    local want = {}
    for _, f in ipairs(files) do
      for _, w in ipairs(words_of(f.text or "")) do
        want[w] = true
        if DIGITS[w] then want[DIGITS[w]] = true end
      end
    end
    dict = {}
    local n = 0
    for line in gm.read_text(d.phones):gsub("^\239\187\191", ""):gmatch("[^\n]+") do
      n = n + 1
      local word = line:match("^(%S+)")
      local lw = word and word:lower()
      if lw and want[lw] and not dict[lw] then
        local ph = line:match("^%S+%s+(.-)%s*$") or ""
        -- a CMU dictionary's pronunciation: ARPAbet phones (letters, a stress digit), nothing else
        if not ph:match("^%u+%d?[%u%d ]*$") then
          error(string.format("data.speech: %s:%d: '%s' is not a pronunciation of the CMU dictionary (ARPAbet phones such as "
            .. "\"HH AH L OW\"); phones must be a CMU pronouncing dictionary (cmudict-en-us.dict)", d.phones, n, ph), 0)
        end
        dict[lw] = ph
      end
    end
  end
  local bad, all = {}, {}
  for _, f in ipairs(files) do
    local text = f.text
    local why
    if not text then why = "no transcript (no line for " .. f.name .. (d.transcripts and (" in " .. d.transcripts) or "") .. ", no .txt beside it)"
    elseif text == "" then why = "its transcript is empty"
    elseif text:match("^%s*%[.*%]%s*$") then why = "its transcript " .. text .. " is not speech" end
    local words = not why and words_of(text) or {}
    if not why and #words == 0 then why = "its transcript has no words" end
    local phones
    if not why and dict then
      local ph = {}
      for _, w in ipairs(words) do
        -- a digit as it is spoken ("press 1"), for its phones only: the reference words stay as written
        local p = dict[w] or (DIGITS[w] and dict[DIGITS[w]])
        if not p then why = string.format("'%s' is not in the pronouncing dictionary %s", w, d.phones); break end
        ph[#ph + 1] = p
      end
      phones = table.concat(ph, " ")
    end
    if why then
      bad[#bad + 1] = { example = f.path, reason = why }
    else
      local answer = text .. (phones and ("\n" .. phones) or "")
      local m = { { role = "user", content = "<start_of_audio>" .. task.prompt }, { role = "assistant", content = answer } }
      m.audio, m.where, m.ref_words, m.ref_phones = { f.path }, f.path, table.concat(words, " "), phones
      all[#all + 1] = m
    end
  end
  if #files == 0 then error(string.format("data.speech: no audio file (%s) below %s", "WAV, FLAC, Ogg, MP3", root), 0) end
  local items = { train = {}, test = {}, rejected_read = bad }
  local every = d.test or 5
  for i, m in ipairs(all) do
    if i % every == 0 then
      if not d.test_max or #items.test < d.test_max then items.test[#items.test + 1] = m end
    elseif not d.train or #items.train < d.train then
      items.train[#items.train + 1] = m
    end
  end
  collectgarbage("collect") -- the transcripts' and the dictionary's text, before any trial's peak
  local nd = 0
  for _ in pairs(dup) do nd = nd + 1 end
  if nd > 0 then
    local name, at = next(dup)
    say("warning: %d name%s twice in %s (the first line is used; e.g. %s again at %s)", nd, nd == 1 and " is" or "s are",
      d.transcripts, name, at)
  end
  say("data.speech: %d recordings with transcripts below %s%s; 1 in %d is a test example: %d train, %d test before the "
    .. "clips are decoded", #all, root, #bad > 0 and string.format(" (%d more left out, listed below)", #bad) or "", every,
    #items.train, #items.test)
  return items
end

--- The validation examples (experiment.validation): with `split`, every k-th training example
--- (k = round(1/split); the same examples for every trial and seed, each label in proportion,
--- as data.jsonl's test_fraction), taken out of the training set; with `data`, every example of
--- that data set (its training and test parts), labels matched by name to the task's. Sets
--- items.val (a usage error when it would be empty or leave no training example).
local function validation_items(e, items)
  local v = e.validation
  if v.split then
    local every = math.max(2, math.floor(1 / v.split + 0.5))
    local all = items.train
    items.train, items.val = {}, {}
    for i, it in ipairs(all) do
      if i % every == 0 then items.val[#items.val + 1] = it else items.train[#items.train + 1] = it end
    end
  else
    local ok, vi = pcall(e.task._kind == "classify" and load_classify_items
      or e.task._kind == "transcribe" and function(x) return load_speech_items(x, e.task) end or load_chat_items, v.data)
    if not ok then
      if type(vi) == "table" and vi.usage then error(vi, 0) end
      P.usage(v.data._where or e._where, "validation.data: %s", clean_msg(vi))
    end
    items.val = {}
    local pos = {}
    for i, lab in ipairs(items.labels or {}) do pos[lab] = i end
    for _, split in ipairs({ vi.train, vi.test or {} }) do
      for _, it in ipairs(split) do
        if e.task._kind == "classify" then
          local name = vi.labels[it.label]
          if not pos[name] then
            P.usage(v.data._where or e._where, "validation.data has label '%s', which the task's data does not have (%s)", name,
              table.concat(items.labels, ", "))
          end
          it.label = pos[name]
        end
        items.val[#items.val + 1] = it
      end
    end
  end
  if #items.val == 0 then P.usage(e._where, "validation: no validation example (split %s of %d)", tostring(v.split), #items.train) end
  if #items.train == 0 then P.usage(e._where, "validation.split leaves no training example") end
end

--- Tokenizes the items into data sets for one model, max_length and pan & scan (all up front).
local function build_datasets(model, task, items, max_length, pan_and_scan)
  local train, test = gm.dataset(model), gm.dataset(model)
  local refs = {}
  local val = items.val and gm.dataset(model) or nil
  local rejected = {}
  local kept_audio = { frames = 0, frames4 = 0 }
  -- per split, the prompt tokens of the shortest prompt that did not fit (for the hint)
  local shortest_rejected = { [train] = math.huge, [test] = math.huge }
  if val then shortest_rejected[val] = math.huge end
  local function add(ds, msgs, label, where, images, audio)
    local sha, crops, asha, sizes = nil, nil, nil, nil
    if images then
      sha, crops, sizes = {}, pan_and_scan and {} or nil, {}
      for i, p in ipairs(images) do
        sha[i] = items.image_sha[p]
        if crops then crops[i] = items.image_crops[p] end
        sizes[i] = items.image_size[p]
      end
      if #sizes ~= #images then sizes = nil end
    end
    local asamples
    if audio then
      asha, asamples = {}, {}
      for i, p in ipairs(audio) do asha[i], asamples[i] = items.audio_sha[p], items.audio_samples[p] end
      if #asamples ~= #audio then asamples = nil end
    end
    local okc, ok, why = pcall(ds.add_chat, ds, msgs, { max_length = max_length, label = label and (label - 1) or nil,
      images = images, image_sha = sha, crops = crops, image_sizes = sizes, audio = audio, audio_sha = asha,
      audio_samples = asamples })
    if not okc then ok, why = false, clean_msg(ok):gsub("\n.*", "") end
    -- the clips of the examples kept: what the trainer's audio path is sized for (a clip whose
    -- example max_length rejects is never encoded)
    if ok and audio then
      for _, p in ipairs(audio) do
        kept_audio.frames = math.max(kept_audio.frames, items.audio_frames[p] or 0)
        kept_audio.frames4 = math.max(kept_audio.frames4, items.audio_frames4 and items.audio_frames4[p] or 0)
      end
    end
    -- transcription: each example's reference, in the data set's order (rejections leave gaps)
    if ok and msgs.ref_words then
      refs[ds] = refs[ds] or {}
      refs[ds][#refs[ds] + 1] = { words = msgs.ref_words, phones = msgs.ref_phones, where = where }
    end
    if not ok then
      local n = tonumber(why:match("the prompt takes (%d+) tokens"))
      if n and n < shortest_rejected[ds] then shortest_rejected[ds] = n end
      if #rejected < 50 then rejected[#rejected + 1] = { example = where, reason = (why:gsub("^example %d+: ", "")) } end
    end
  end
  if task._kind == "classify" then
    -- a text item: the prompt, then the text; an image item: the image, then the prompt (Hugging
    -- Face's [{"type": "image"}, {"type": "text", "text": prompt}])
    local function user(it)
      if it.images then return "<start_of_image>" .. task.prompt end
      return task.prompt .. "\n\n" .. it.text
    end
    for i, it in ipairs(items.train) do
      add(train, { { role = "user", content = user(it) }, { role = "assistant", content = items.labels[it.label] } }, it.label, it.where or ("train " .. i), it.images)
    end
    for i, it in ipairs(items.test) do
      add(test, { { role = "user", content = user(it) }, { role = "assistant", content = items.labels[it.label] } }, it.label, it.where or ("test " .. i), it.images)
    end
    for i, it in ipairs(items.val or {}) do
      add(val, { { role = "user", content = user(it) }, { role = "assistant", content = items.labels[it.label] } }, it.label, it.where or ("validation " .. i), it.images)
    end
  else
    for i, m in ipairs(items.train) do add(train, m, nil, m.where or ("train " .. i), m.images, m.audio) end
    for i, m in ipairs(items.test) do add(test, m, nil, m.where or ("test " .. i), m.images, m.audio) end
    for i, m in ipairs(items.val or {}) do add(val, m, nil, m.where or ("validation " .. i), m.images, m.audio) end
  end
  return train, test, rejected, shortest_rejected[train], shortest_rejected[test], val, refs, kept_audio
end

--- The tokenized data sets of a (model, max_length, pan & scan), built once and cached in ctx.data.
function R.datasets(ctx, e, cfg)
  local key = cfg.model .. "|" .. cfg.max_length .. (cfg.pan_and_scan and "|pan_and_scan" or "")
  if not ctx.data[key] then
    local train, test, rejected, shortest_train, shortest_test, val, refs, kept_audio = build_datasets(ctx.model, e.task,
      ctx.items, cfg.max_length, cfg.pan_and_scan)
    ctx.data[key] = { train = train, test = test, rejected = rejected, shortest_train = shortest_train,
      shortest_test = shortest_test, val = val, test_refs = refs[test], val_refs = val and refs[val] }
    -- Gemma 3n's per-layer table is read by rows: what the data's ids touch becomes resident, not
    -- the whole table (the plan and the trainer take it as option ple_resident)
    ctx.items.ple_resident = ctx.items.ple_resident or {}
    ctx.items.ple_resident[cfg.model .. "|" .. cfg.max_length] = ctx.model:ple_resident({ train, test, val })
    -- the longest clip the kept examples hold (the trainer's audio path; the dry run plans the data's longest)
    ctx.items.audio_kept = ctx.items.audio_kept or {}
    ctx.items.audio_kept[cfg.model .. "|" .. cfg.max_length] = kept_audio
  end
  return ctx.data[key]
end

--------------------------------------------------------------------------------------------------
-- evaluation

local function indices(n, limit)
  local t = {}
  for i = 1, math.min(n, limit or n) do t[i] = i end
  return t
end

--- Classification by label scoring: the first token of each label at the response position
--- (one forward per example) when those tokens differ, else the log-likelihood of each whole
--- label. Returns {accuracy, per_class, confusion, n_examples, labels, example_index,
--- predictions, references} (the last three per example, 0-based).
local EVAL_CHUNK = 8 -- test examples per call between two looks at Ctrl-C

local function eval_classify(model, tr, test, labels, limit)
  local K = #labels
  local first, distinct = {}, true
  for k, lab in ipairs(labels) do
    first[k] = model:tokenize(lab, { bos = false })[1]
    for j = 1, k - 1 do if first[j] == first[k] then distinct = false end end
  end
  local idx = indices(test:size(), limit)
  local predicted = {}
  if distinct then
    -- in chunks, so that Ctrl-C is answered within a few examples, not after the whole test set
    for s = 1, #idx, EVAL_CHUNK do
      if gm.interrupted() then error({ interrupted = true }, 0) end
      local chunk = {}
      for i = s, math.min(#idx, s + EVAL_CHUNK - 1) do chunk[#chunk + 1] = idx[i] end
      for _, p in ipairs(tr:choose(test, chunk, first)) do predicted[#predicted + 1] = p end
    end
  else
    -- the log-probability of each whole label (and its end of turn) after the prompt: K scored
    -- sequences per example, the example's images in each
    local cands = {}
    for k, lab in ipairs(labels) do cands[k] = model:tokenize(lab .. "<end_of_turn>\n", { bos = false, special = true }) end
    for s = 1, #idx, EVAL_CHUNK do
      if gm.interrupted() then error({ interrupted = true }, 0) end
      local chunk = {}
      for i = s, math.min(#idx, s + EVAL_CHUNK - 1) do chunk[#chunk + 1] = idx[i] end
      for _, p in ipairs(tr:score_labels(test, chunk, cands)) do predicted[#predicted + 1] = p end
    end
  end
  local confusion, per_class, correct = {}, {}, 0
  for a = 1, K do
    confusion[a] = {}
    for b = 1, K do confusion[a][b] = 0 end
  end
  local counts = {}
  -- per example, 0-based as stored (results/README.md): what tables' intervals and paired
  -- significance tests resample
  local example_index, predictions, references = {}, {}, {}
  for i, e in ipairs(idx) do
    local truth = test:example(e).label + 1
    local pred = predicted[i]
    example_index[i], predictions[i], references[i] = e - 1, pred - 1, truth - 1
    confusion[truth][pred] = confusion[truth][pred] + 1
    counts[truth] = (counts[truth] or 0) + 1
    if truth == pred then correct = correct + 1 end
  end
  -- a class without test examples has no accuracy (NaN), not 0
  for k = 1, K do per_class[k] = (counts[k] or 0) > 0 and confusion[k][k] / counts[k] or 0 / 0 end
  return { accuracy = correct / #idx, per_class = per_class, confusion = confusion, n_examples = #idx, labels = labels,
           example_index = example_index, predictions = predictions, references = references }
end

local function eval_sft(tr, test, limit, batch)
  local idx = indices(test:size(), limit)
  local sum, tokens = 0, 0
  for s = 1, #idx, batch do
    if gm.interrupted() then error({ interrupted = true }, 0) end
    local chunk = {}
    for i = s, math.min(#idx, s + batch - 1) do chunk[#chunk + 1] = idx[i] end
    local loss, n = tr:eval(test, chunk)
    sum, tokens = sum + loss * n, tokens + n
  end
  return { loss = sum / tokens, perplexity = math.exp(sum / tokens), n_examples = #idx }
end

--- Word-level edit distance of two lists (Levenshtein: substitutions, insertions, deletions).
local function edit_distance(a, b)
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur = { [0] = i }
    for j = 1, #b do
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i] == b[j] and 0 or 1))
    end
    prev = cur
  end
  return prev[#b]
end

local function split_ws(s)
  local t = {}
  for x in (s or ""):gmatch("%S+") do t[#t + 1] = x end
  return t
end

--- Transcription: the loss, and each test prompt's greedy answer (trainer:generate, up to
--- max_new_tokens, ending at <end_of_turn>) against its reference: word error rate (the answer's
--- first line against the transcript's words, normalized as words_of) and, when the references
--- have phones, phone error rate (its second line against theirs), each the summed edit distances
--- over the summed reference lengths (corpus level); with the totals word_errors, words,
--- phone_errors, phones, and per example (example_index, example_word_errors, example_words,
--- example_phone_errors, example_phones: the report's intervals and tests resample them).
local function eval_transcribe(model, tr, test, refs, limit, batch, max_new)
  local r = eval_sft(tr, test, limit, batch)
  local idx = indices(test:size(), limit)
  local stop = {}
  for _, t in ipairs({ "<end_of_turn>", "<eos>" }) do
    local ids = model:tokenize(t, { bos = false, special = true })
    if #ids == 1 then stop[#stop + 1] = ids[1] end
  end
  local we, wn, pe, pn = 0, 0, 0, 0
  local ex_index, ex_we, ex_wn, ex_pe, ex_pn = {}, {}, {}, {}, {}
  local has_phones = refs and refs[1] and refs[1].phones ~= nil
  for s0 = 1, #idx, EVAL_CHUNK do
    if gm.interrupted() then error({ interrupted = true }, 0) end
    local chunk = {}
    for i = s0, math.min(#idx, s0 + EVAL_CHUNK - 1) do chunk[#chunk + 1] = idx[i] end
    local ok, outs = pcall(tr.generate, tr, test, chunk, { max_tokens = max_new, stop = stop })
    if not ok then
      if gm.interrupted() then error({ interrupted = true }, 0) end
      error(outs, 0)
    end
    for k, i in ipairs(chunk) do
      local text = model:detokenize(outs[k], { skip_unknown = true })
      local first, second = text:match("^([^\n]*)\n?([^\n]*)")
      local ref = refs[i]
      local hw, rw = words_of(first or ""), split_ws(ref.words)
      local e1 = edit_distance(hw, rw)
      we, wn = we + e1, wn + #rw
      local n = #ex_index + 1
      ex_index[n], ex_we[n], ex_wn[n] = i - 1, e1, #rw
      if has_phones then
        local hp, rp = split_ws((second or ""):upper()), split_ws(ref.phones)
        local e2 = edit_distance(hp, rp)
        pe, pn = pe + e2, pn + #rp
        ex_pe[n], ex_pn[n] = e2, #rp
      end
    end
  end
  r.word_error_rate, r.word_errors, r.words = wn > 0 and we / wn or 0 / 0, we, wn
  if has_phones then r.phone_error_rate, r.phone_errors, r.phones = pn > 0 and pe / pn or 0 / 0, pe, pn end
  if #ex_index > 0 then
    r.example_index, r.example_word_errors, r.example_words = ex_index, ex_we, ex_wn
    if has_phones then r.example_phone_errors, r.example_phones = ex_pe, ex_pn end
  end
  return r
end

--------------------------------------------------------------------------------------------------
-- one trial

--- The most images one example puts through the tower: its images, and with pan & scan their
--- crops (check_images counts both).
local function images_per_example(items, cfg)
  if not items then return 0 end
  return (cfg.pan_and_scan and items.max_views or items.max_images) or 0
end

--- Each model's architecture ("gemma3", "gemma3n", "gemma4"), as preflight reads its config: the
--- feature extractor its audio goes through.
local MODEL_ARCH = {}

--- The feature frames a trial's micro-batch of clips is planned for: its model's extractor's, of the
--- longest clip its data sets kept (after max_length's rejections), else the data's longest.
local function audio_frames_of(items, cfg)
  if not items then return 0 end
  local g4 = MODEL_ARCH[cfg.model] == "gemma4"
  local kept = items.audio_kept and items.audio_kept[cfg.model .. "|" .. cfg.max_length]
  if kept and (g4 and kept.frames4 or kept.frames) > 0 then return g4 and kept.frames4 or kept.frames end
  return (g4 and items.max_audio_frames4 or items.max_audio_frames) or 0
end

--- Training options of a trial for the trainer / planner.
local function trainer_opts(cfg, total_steps, threads, items)
  local warmup = cfg.warmup < 1 and math.floor(cfg.warmup * total_steps + 0.5) or math.tointeger(cfg.warmup)
  return {
    max_images = images_per_example(items, cfg) * cfg.batch, pan_and_scan = cfg.pan_and_scan, compute = cfg.compute,
    max_audio = (items and items.max_audio or 0) * cfg.batch,
    max_audio_frames = audio_frames_of(items, cfg),
    ple_resident = items and items.ple_resident and items.ple_resident[cfg.model .. "|" .. cfg.max_length] or 0,
    rank = cfg.rank, alpha = cfg.alpha, dropout = cfg.dropout, rslora = cfg.rslora, targets = cfg.targets,
    layers = cfg.layers, seed = cfg.seed, quant = cfg.quant, batch = cfg.batch, max_length = cfg.max_length,
    grad_accum = cfg.grad_accum, lr = cfg.lr, weight_decay = cfg.weight_decay, beta1 = cfg.beta1, beta2 = cfg.beta2,
    eps = cfg.eps, max_grad_norm = cfg.max_grad_norm, schedule = cfg.schedule, warmup = warmup,
    steps = total_steps, checkpointing = cfg.checkpointing, threads = threads,
    vision_targets = cfg.vision_targets, modules_to_save = cfg.modules_to_save, audio_targets = cfg.audio_targets,
  }
end

--- Deterministic permutation of 1..n for (seed, epoch) (Lua 5.4's seeded xoshiro256**).
local function permutation(n, seed, epoch)
  math.randomseed(seed * 1000003 + epoch)
  local p = {}
  for i = 1, n do p[i] = i end
  for i = n, 2, -1 do
    local j = math.random(i)
    p[i], p[j] = p[j], p[i]
  end
  return p
end

-- What a runner process holds beyond a trainer's plan: the results files open in memory (and the
-- HDF5 library state that comes with them before any checkpoint), the tokenized data sets, the
-- Lua state, the evaluation's extra BLAS buffers. Fitted on a tiny-model trial (30.3 MiB measured,
-- 25.7 planned without it), checked on the 270M quickstart (docs/memory.md); refitted 2026-12-02
-- when the build gained libjpeg and libexif (the image path): the e2e_experiments trial measured
-- 31.6-33.2 MiB over 5 runs and a CI run, against 25.7 MiB planned without it; 7 MiB since
-- 2026-12-03, when the build linked Open MPI (data parallel; its libraries are mapped in every
-- process): the e2e_experiments trial measured 33.4-34.0 MiB against 32.2 planned with 6 MiB.
local RUNNER_STATE_BYTES = 7 * 2 ^ 20

-- Open MPI's own state in each rank of a data-parallel run (its libraries, the shared-memory
-- transport's segments): 10.3-10.8 MiB measured at world_size 2 (the tiny-model trial of
-- e2e_data_parallel: 42.6-43.1 MiB peak on rank 0 against 32.3 MiB for the same trial in one
-- process, 2026-12-03); more peers map more segments, hence the margin.
local MPI_STATE_BYTES = 16 * 2 ^ 20

-- Reading audio keeps state resident that no buffer of ours holds: libsndfile's and its codecs'
-- pages, libsamplerate's sinc coefficient tables (SRC_SINC_BEST_QUALITY: 1.3 MB of static data),
-- FFTW's plan and twiddles, the extractor's filter bank (0.5 MiB). Measured 2026-12-05 with the
-- tiny Gemma 3n: `generate` peaks at 17 MiB without a clip, 22 MiB with a 16 kHz clip and 24 MiB
-- with an 8 kHz one (resampled) - the clip's encoder buffers are under 1 MiB of that; the
-- pronunciation.lua trial measured 3-5 MiB over its plan without this item (frozen encoder, LoRA
-- on it, with checkpointing), its sft trials on chat JSONL 2-4 MiB.
local AUDIO_LIBS_BYTES = 4 * 2 ^ 20

--- A trial's plan: the trainer's (gm.plan) plus the runner's own state, as item "runner" (and
--- MPI's, as item "mpi", in a data-parallel run).
local function trial_plan(model, opts, items, device)
  -- (with images the planner also checks that max_length leaves room for text beside them: what a
  -- built-in size's dry run, which tokenizes nothing, has to go on)
  local per_example = images_per_example(items, opts)
  local plan = gm.plan(model, opts, { images = per_example > 0 and per_example or nil, device = device })
  plan.runner = math.tointeger(RUNNER_STATE_BYTES)
  plan.total = plan.total + plan.runner
  if DIST.world_size > 1 then
    plan.mpi = math.tointeger(MPI_STATE_BYTES)
    plan.total = plan.total + plan.mpi
  end
  -- images: a batch's preprocessed pixels (grad_accum x max_images x image_floats f32, what the
  -- trainer's binding collates into), and decoding the largest file: its RGB (w h 3 bytes), a copy
  -- for an EXIF rotation, the resize's intermediate (longest side x S x 3) and its S x S output in
  -- u8 and f32 (core/image; interlaced 16-bit PNGs need up to 8 bytes per pixel more); with pan &
  -- scan also a crop's copy (at most the image) and each crop's S x S f32
  if (opts.max_images or 0) > 0 and items and items.max_image_pixels then
    local ok, c = pcall(gm.model_config, model)
    local S = ok and c.vision and c.vision.image_size or 896
    local per = ok and c.vision and c.vision.image_floats or 3 * S * S
    local batch = (opts.grad_accum or 1) * opts.max_images * per * 4
    -- (Gemma 4: its resized image holds at most per / 3 pixels, whatever its aspect)
    local px = per // 3
    local decode = 6 * items.max_image_pixels + 3 * items.max_image_side * S + 3 * px + 12 * px
    if opts.pan_and_scan and (items.max_crops or 0) > 0 then
      decode = decode + 3 * items.max_image_pixels + 12 * S * S * items.max_crops
    end
    plan.images = math.tointeger(batch + decode)
    plan.total = plan.total + plan.images
  end
  -- audio: a batch's features (grad_accum x max_audio x frames x 128 f32 and the frame mask, what
  -- the trainer's binding collates into), and while one micro-batch is read: its clips decoded at
  -- 16 kHz (f32), the extractor's output before it is copied over, and the decoder's and
  -- resampler's chunk buffers (64 Ki frames: a stereo chunk in, its mono, the converter's out);
  -- and the audio libraries' own resident state (AUDIO_LIBS_BYTES)
  if (opts.max_audio or 0) > 0 and items and items.audio_samples then
    -- the clips of the worst micro-batch: the data's max_audio longest, decoded at once
    local lens = {}
    for _, n in pairs(items.audio_samples) do lens[#lens + 1] = n end
    table.sort(lens, function(a, b) return a > b end)
    local longest = 0
    for i = 1, math.min(#lens, opts.max_audio) do longest = longest + lens[i] end
    local cells = opts.max_audio * opts.max_audio_frames
    local batch = (opts.grad_accum or 1) * cells * (128 * 4 + 1)
    local decode = longest * 4 + cells * (128 * 4 + 1) + 3 * 65536 * 2 * 4
    plan.audio = math.tointeger(batch + decode + AUDIO_LIBS_BYTES)
    plan.total = plan.total + plan.audio
  end
  return plan
end

--- Applies memory_limit (and fit) to a trial's options: returns the options (changed by fit) and
--- a note of what fit chose, or raises with the plan and what would make it fit. The trial is
--- refused here, before its weights are loaded.
local function fit_memory(e, trial, opts, items)
  local plan = trial_plan(trial.config.model, opts, items, e.device)
  trial.plan = plan
  -- on a GPU, memory_limit is the GPU's; fit does not shrink GPU plans yet
  if plan.gpu then
    if not e.memory_limit_bytes or plan.gpu.total <= e.memory_limit_bytes then return opts, nil end
    error(string.format("the plan needs %s on %s (arenas %s, CUDA context %s), over memory_limit %s; lower max_length or "
      .. "batch, use checkpointing = true%s, or raise memory_limit", fmt_bytes(plan.gpu.total), e.device, fmt_bytes(plan.gpu.arenas),
      fmt_bytes(plan.gpu.context), fmt_bytes(e.memory_limit_bytes), trial.config.quant ~= "nf4" and " or quant = \"nf4\"" or ""), 0)
  end
  if not e.memory_limit_bytes or plan.total <= e.memory_limit_bytes then return opts, nil end
  if e.fit then
    local fitted, _, chosen = gm.plan_fit(trial.config.model, opts,
      math.max(1, e.memory_limit_bytes - RUNNER_STATE_BYTES - (plan.images or 0) - (plan.audio or 0)))
    trial.plan = trial_plan(trial.config.model, fitted, items, e.device)
    return fitted, chosen
  end
  local ways = {}
  if not e.fit then ways[#ways + 1] = "set fit = true to let the planner turn on checkpointing and trade batch for gradient accumulation" end
  ways[#ways + 1] = "lower max_length" .. (trial.config.batch > 1 and " or batch" or "")
  if trial.config.quant ~= "nf4" then ways[#ways + 1] = "use quant = \"nf4\"" end
  if trial.config.rank > 8 then ways[#ways + 1] = "lower rank" end
  ways[#ways + 1] = "raise memory_limit"
  error(string.format("the plan needs %s, over memory_limit %s (%s); %s",
    fmt_bytes(plan.total), fmt_bytes(e.memory_limit_bytes), R.plan_summary(plan), table.concat(ways, ", or ")), 0)
end

function R.plan_summary(plan)
  local parts = {}
  for _, k in ipairs({ "base weights", "adapters", "gradients", "optimizer state", "saved activations", "largest transient", "workspace", "vision tower", "audio tower", "runtime", "runner", "mpi", "images", "audio" }) do
    if plan[k] and plan[k] > 0 then parts[#parts + 1] = k .. " " .. fmt_bytes(plan[k]) end
  end
  return table.concat(parts, ", ")
end

--- Loads `model` into ctx unless it is the one loaded (closing the other; its tokenized data
--- sets go with it).
local function use_model(ctx, e, model)
  if ctx.model_name == model then return end
  if ctx.model then ctx.model:close() end
  ctx.model, ctx.model_name, ctx.data = nil, nil, {}
  -- a dry run only tokenizes: it plans for a GPU without opening one
  ctx.model = gm.load_model(model, { threads = e.threads or GM_THREADS, device = not ctx.no_device and e.device or nil })
  ctx.model_name = model
  ctx.data = {}
end

--- The loaded model's file hashes (gm_model_sha256: it reads every byte), once per model and run.
local function model_sha(ctx, model)
  ctx.model_sha = ctx.model_sha or {}
  local ms = ctx.model_sha[model]
  if not ms then
    local hex, files = ctx.model:sha256()
    ms = { hex = hex, files = files }
    ctx.model_sha[model] = ms
  end
  return ms
end

--- experiment.model_adapter: every trial starts from that adapter (a PEFT folder, a trial, a
--- checkpoint). Its LoRA shape - rank, alpha, rslora, targets, layers, and the image path it
--- trained: vision_targets, modules_to_save - becomes the trials' where the file does not state
--- it; a stated rank / alpha / rslora / modules_to_save must be the adapter's (a usage error names
--- both and the fix); stated targets / layers / vision_targets must select exactly its modules
--- (checked here, and again when the trainer starts from it: gm_adapter_to_trainer). An adapter
--- that trained the image path needs data with images. The model is loaded (mapped) to read it.
local function resolve_model_adapter(ctx, e, trials)
  if not e.model_adapter then return end
  use_model(ctx, e, e.model)
  local ok, info = pcall(ctx.model.adapter_info, ctx.model, e.model_adapter)
  if not ok then
    local msg = clean_msg(info)
    -- (an experiment's --trial picks its own trial: the adapter's trial is named by its file)
    if msg:find("--trial", 1, true) then msg = msg .. "\n  hint: for model_adapter, name the trial's file: " .. e.model_adapter .. "/trial-<id>.h5" end
    P.usage(P.where_of("model_adapter"), "model_adapter = %s: %s", e.model_adapter, msg)
  end
  ctx.adapter_info = info
  -- its identity (provenance; a rerun or reproduction from a changed file is named): the sha256
  -- of the file, or of a PEFT folder's two files
  local src = info.source
  if gm.is_dir(src) then
    local parts = {}
    for _, f in ipairs({ "adapter_config.json", "adapter_model.safetensors" }) do
      parts[#parts + 1] = f .. " " .. gm.sha256(gm.read_text(src .. "/" .. f))
    end
    ctx.adapter_sha = gm.sha256(table.concat(parts, "\n"))
  else
    ctx.adapter_sha = gm.sha256(gm.read_text(src))
  end
  -- a trial's adapter names the model files it was trained on: say so when they are not these
  -- (the same model in another format is fine; a sibling of the same shape is not)
  if info.trial_id ~= "" then
    local okr, stored = pcall(gm.results_read, src)
    local was = okr and type(stored) == "table" and stored.provenance and stored.provenance.model_sha256
    if was then
      local hex = model_sha(ctx, e.model).hex
      if was ~= hex then
        say("note: model_adapter %s was trained on %s (sha256 %s...), not on these model files (%s, sha256 %s...): its "
          .. "shapes fit; make sure it is the same model", e.model_adapter, tostring(stored.provenance.model_path), was:sub(1, 12),
          e.model, hex:sub(1, 12))
      end
    end
  end
  local want = { rank = info.rank, alpha = info.alpha, rslora = info.rslora, targets = info.targets, layers = info.layers,
    vision_targets = info.vision_targets, modules_to_save = info.modules_to_save, audio_targets = info.audio_targets }
  -- stated targets / layers must select exactly its modules (checked here, so the dry run says so
  -- and nothing is created)
  local st = e._stated or {}
  if st.targets or st.layers then
    local targets = st.targets and e.train.targets or info.targets
    local layers = st.layers and e.train.layers or info.layers
    local okm, mods = pcall(ctx.model.lora_modules, ctx.model, targets, layers)
    local key = st.targets and "targets" or "layers"
    if not okm then P.usage(P.where_of(key), "train.%s: %s", key, clean_msg(mods)) end
    local have, sel = {}, {}
    for _, n in ipairs(info.module_names) do have[n] = true end
    for _, n in ipairs(mods) do sel[n] = true end
    for _, n in ipairs(info.module_names) do
      if not sel[n] then
        P.usage(P.where_of(key), "model_adapter %s has an adapter on %s, which train.targets / train.layers do not select: "
          .. "remove them (the adapter decides) or select its %d modules", e.model_adapter, n, #info.module_names)
      end
    end
    for _, n in ipairs(mods) do
      if not have[n] then
        P.usage(P.where_of(key), "train.targets / train.layers select %s, which model_adapter %s has no adapter for: remove "
          .. "them (the adapter decides) or select its %d modules", n, e.model_adapter, #info.module_names)
      end
    end
  end
  -- stated vision_targets / audio_targets must select exactly its tower's / encoder's adapters
  -- ("none": that it has none)
  for _, part in ipairs({ { key = "vision_targets", names = "vision_module_names", opt = { vision = true } },
    { key = "audio_targets", names = "audio_module_names", opt = { audio = true } } }) do
    local key = part.key
    if st[key] then
      local vt = e.train[key]
      local mods = {}
      if vt ~= "none" then
        local okm, got = pcall(ctx.model.lora_modules, ctx.model, vt, nil, part.opt)
        if not okm then P.usage(P.where_of(key), "train.%s: %s", key, clean_msg(got)) end
        mods = got
      end
      local have, sel = {}, {}
      for _, n in ipairs(info[part.names]) do have[n] = true end
      for _, n in ipairs(mods) do sel[n] = true end
      local fix = string.format(": remove train.%s (the adapter decides it) or set %s", key, info[key])
      for _, n in ipairs(info[part.names]) do
        if not sel[n] then
          P.usage(P.where_of(key), "model_adapter %s has an adapter on %s, which train.%s = %s does not select%s",
            e.model_adapter, n, key, vt, fix)
        end
      end
      for _, n in ipairs(mods) do
        if not have[n] then
          P.usage(P.where_of(key), "train.%s = %s selects %s, which model_adapter %s has no adapter for%s", key, vt, n,
            e.model_adapter, fix)
        end
      end
    end
  end
  for _, k in ipairs(P.ADAPTER_SHAPE) do
    local stated = e._stated and e._stated[k]
    for _, t in ipairs(trials) do
      if not stated then
        t.config[k] = want[k]
      elseif (k == "rank" or k == "alpha" or k == "rslora" or k == "modules_to_save") and t.config[k] ~= want[k] then
        local function show(v) return math.type(v) == "float" and string.format("%.9g", v) or tostring(v) end
        P.usage(P.where_of(k), "train.%s = %s, but model_adapter %s has %s = %s: remove train.%s (the adapter decides it) or set %s",
          k, show(t.config[k]), e.model_adapter, k, show(want[k]), k, show(want[k]))
      end
    end
  end
  -- the image path it trained trains on (preflight checked the stated options; these came from
  -- the adapter)
  if (info.vision_targets ~= "none" or info.modules_to_save ~= "none") and ((ctx.items or {}).max_images or 0) == 0 then
    P.usage(P.where_of("model_adapter"), "model_adapter %s trained the image path (vision_targets = %s, modules_to_save = %s), "
      .. "which continues training only on data with images; this data has none", e.model_adapter, info.vision_targets,
      info.modules_to_save)
  end
  if info.audio_targets ~= "none" and ((ctx.items or {}).max_audio or 0) == 0 then
    P.usage(P.where_of("model_adapter"), "model_adapter %s trained the audio encoder (audio_targets = %s), which continues "
      .. "training only on data with audio; this data has none\n  hint: train on data with audio clips, or start from "
      .. "the base model (without model_adapter)", e.model_adapter, info.audio_targets)
  end
end

--- Runs a write (a checkpoint, a results file); a failure - disk full, quota, a read-only or
--- vanished folder - is the machine's, not the trial's: it is raised as {io = true, msg} so that
--- the sweep stops instead of failing every later trial the same way (R.run).
local function guarded_write(fn, ...)
  if not ROOT then return end
  local ok, err = pcall(fn, ...)
  if not ok then error({ io = true, msg = clean_msg(err) }, 0) end
end

--- The tokenized data's identity (gm_dataset_sha256 of each split, and of both), once per set.
local function data_sha(d)
  if not d.sha then
    local tr, te = d.train:sha256(), d.test:sha256()
    local va = d.val and d.val:sha256()
    -- (without a validation set, the hash is what it was before validation sets existed)
    d.sha = { train = tr, test = te, val = va, both = gm.sha256(tr .. "\n" .. te .. "\n" .. (va and (va .. "\n") or "")) }
  end
  return d.sha
end

--- What produced a trial (results /provenance): the model files' and the tokenized data's
--- sha256, the build and the machine, the command line. Hashes are computed once per model and
--- data set in a run (ctx caches them).
local function provenance(ctx, e, cfg, d)
  local ms = model_sha(ctx, cfg.model)
  data_sha(d)
  ctx.build = ctx.build or gm.build_info()
  local p = {
    model_path = cfg.model, model_sha256 = ms.hex, model_files = ms.files,
    data_sha256 = d.sha.both, data_train_sha256 = d.sha.train, data_test_sha256 = d.sha.test,
    data_validation_sha256 = d.sha.val,
    threads = tostring(e.threads or GM_THREADS), device = e.device or "cpu",
    compute_dtype = gm.compute_dtype(cfg.compute or "auto", e.device or "cpu"),
    -- data parallel: processes the trial ran on (all-reducing the gradients) and how
    world_size = tostring(DIST.world_size), dist_transport = DIST.transport,
    command_line = GM_COMMAND_LINE or "", set_overrides_json = gm.json_encode(ctx.cli_set or {}),
    experiment_file = GM_EXPERIMENT_FILE or "experiments/quickstart.lua",
    experiment_source = ctx.source,
    model_adapter = ctx.adapter_info and ctx.adapter_info.source or nil,
    model_adapter_trial_id = ctx.adapter_info and ctx.adapter_info.trial_id ~= "" and ctx.adapter_info.trial_id or nil,
    model_adapter_sha256 = ctx.adapter_sha,
  }
  for k, v in pairs(ctx.build) do p[k == "version" and "gemmarun_version" or k] = v end
  return p
end

--- A trial resumed from its checkpoint must continue on what it started on: the model files and
--- the tokenized data of the stored provenance (raises naming what changed).
local function check_resume_identity(prior, p, ckpt)
  local was = prior and prior.provenance or {}
  -- a step is world_size x grad_accum micro-batches: another world size would change the step
  -- the checkpoint's data position counts in
  local ws_was = was.world_size or (was.model_sha256 and "1")
  if ws_was and ws_was ~= p.world_size then
    error(string.format("this trial started on %s process%s (world_size) and is resumed on %s: a step's micro-batches "
      .. "would change; resume it with %s process%s, or delete %s to start it over", ws_was, ws_was == "1" and "" or "es",
      p.world_size, ws_was, ws_was == "1" and "" or "es", ckpt), 0)
  end
  for _, f in ipairs({ { "model_sha256", "the model files" }, { "data_sha256", "the data (as tokenized)" },
    { "model_adapter_sha256", "the adapter it started from (model_adapter)" } }) do
    local old, new = was[f[1]], p[f[1]]
    if old and old ~= new then
      error(string.format("%s changed since this trial started (sha256 %s... then, %s... now): its checkpoint "
        .. "belongs to the old ones; restore them, or delete %s to start this trial over", f[2], old:sub(1, 12),
        new:sub(1, 12), ckpt), 0)
    end
  end
end

local function run_trial(ctx, e, trial, n_trials)
  local cfg = trial.config
  local threads = e.threads or GM_THREADS
  local t_start = gm.clock()
  local res = ctx.res
  -- data (tokenized up front, cached per model and max_length)
  local d = R.datasets(ctx, e, cfg)
  local prov = provenance(ctx, e, cfg, d)
  if ctx.check_identity then ctx.check_identity(prov, d) end -- `gemmarun reproduce`: before any work
  local st_tr, st_te = d.train:stats(), d.test:stats()
  local rejections, read_bad = {}, ctx.items.rejected_read or {}
  for _, r in ipairs(read_bad) do rejections[#rejections + 1] = { example = r.example, reason = r.reason } end
  for _, r in ipairs(d.rejected) do rejections[#rejections + 1] = r end
  res:set_data({ n_train = st_tr.n, n_test = st_te.n, n_rejected = st_tr.rejected + st_te.rejected + #read_bad,
    n_truncated = st_tr.truncated + st_te.truncated, rejections = rejections })
  if st_tr.rejected + st_te.rejected > 0 then
    say("  %d examples rejected (first: %s: %s)", st_tr.rejected + st_te.rejected, d.rejected[1].example, d.rejected[1].reason)
  end
  if st_tr.n == 0 then error("no training example is left after tokenization", 0) end
  -- data parallel: a step is world_size x grad_accum micro-batches, rank r's share per_rank of them
  local per_rank = cfg.batch * cfg.grad_accum
  local per_step = per_rank * DIST.world_size
  local steps_per_epoch = math.max(1, (st_tr.n + per_step - 1) // per_step)
  local total = steps_per_epoch * cfg.epochs
  if cfg.max_steps then total = math.min(total, cfg.max_steps) end
  local opts, fit_note = fit_memory(e, trial, trainer_opts(cfg, total, threads, ctx.items), ctx.items)
  if fit_note then say("  fit: %s (plan %s)", fit_note, fmt_bytes(trial.plan.total)) end
  local mem = {}
  for k, v in pairs(trial.plan) do
    if math.type(v) == "integer" then mem["planned_" .. k:gsub(" ", "_")] = v end
  end
  for k, v in pairs(trial.plan.gpu or {}) do mem["planned_gpu_" .. k] = v end
  -- the trial's peak is its own: no weight pages a previous trial paged in (docs/memory.md)
  ctx.model:release_weight_pages()
  gm.reset_peak_rss()
  local tr <close> = ctx.model:trainer(opts)
  -- baseline evaluation (the adapters start at B = 0: the base model; with model_adapter, that
  -- adapter: the baseline is its evaluation)
  local limit = e.task.max_eval
  local function evaluate(phase)
    if not ROOT then return {} end -- rank 0 evaluates; the others wait at the next collective
    local r
    if e.task._kind == "classify" then r = eval_classify(ctx.model, tr, d.test, ctx.items.labels, limit)
    elseif e.task._kind == "transcribe" then
      r = eval_transcribe(ctx.model, tr, d.test, d.test_refs, limit, opts.batch, e.task.max_new_tokens or 64)
    else r = eval_sft(tr, d.test, limit, opts.batch) end
    res:set_eval(phase, r)
    return r
  end
  local ckpt = ctx.dir .. "/trial-" .. trial.id .. ".ckpt.h5"
  local epoch, pos, step = 0, 0, 0
  if gm.file_exists(ckpt) then
    check_resume_identity(ctx.prior, prov, ckpt)
    local okl, at = pcall(tr.load, tr, ckpt)
    if not okl then
      -- a damaged checkpoint (a truncated file, a full disk at the save) would block the trial
      -- at every rerun: say which file and how to start over
      error(string.format("%s\n  hint: the checkpoint cannot be read; delete %s to run this trial from its start",
        clean_msg(at), ckpt), 0)
    end
    epoch, pos, step = at.epoch, at.pos, at.step
    trial.resumed_from = step
    -- metric rows logged after the checkpoint belong to steps that will run again
    if res:rows() > step then res:truncate(step) end
    say("  resuming from step %d (epoch %d, example %d)", step, epoch + 1, pos)
  else
    res:truncate(0) -- a fresh start: drop rows of an earlier attempt that left no checkpoint
    if cfg.model_adapter then
      local ok, err = pcall(tr.load_adapter, tr, ctx.model, cfg.model_adapter)
      if not ok then P.usage(P.where_of("model_adapter"), "model_adapter = %s: %s", cfg.model_adapter, clean_msg(err)) end
      say("  starting from the adapter %s%s", ctx.adapter_info and ctx.adapter_info.source or cfg.model_adapter,
        ctx.adapter_info and ctx.adapter_info.trial_id ~= "" and (" (trial " .. ctx.adapter_info.trial_id .. ")") or "")
    end
    -- the baseline depends only on the base model as trained on (model, quant, max_length):
    -- trials that share them (other seeds, learning rates, ranks) reuse one evaluation
    local bkey = cfg.model .. "|" .. cfg.quant .. "|" .. cfg.max_length .. "|" .. (cfg.model_adapter or "")
    local b = ctx.baselines[bkey]
    if b then res:set_eval("baseline", b) else b = evaluate("baseline"); ctx.baselines[bkey] = ROOT and b or nil end
    if ROOT then say("  baseline %s", b.accuracy and string.format("accuracy %.1f%%", 100 * b.accuracy) or string.format("loss %.4f", b.loss)) end
  end
  if DIST.world_size > 1 then
    -- every rank resumed from the same step (a results folder on a disk the ranks share), and
    -- read the checkpoint before rank 0 writes anything
    local lo, hi = gm.dist_same(step)
    if lo ~= hi then
      error(string.format("the ranks resume from different steps (%d to %d): %s must be on a file system every rank "
        .. "sees", lo, hi, ckpt), 0)
    end
  end
  res:set_provenance(prov)
  res:set({ status = "running" })
  guarded_write(res.save, res)
  -- training
  -- validation (experiment.validation): every eval_steps steps, the metric on the validation
  -- set, logged as the series val_<metric> (NaN on the other rows); the best so far is kept
  -- (select = "best": its adapter in a checkpoint of its own), and with `patience`, training
  -- stops after that many evaluations without improvement
  local val = e.validation
  local val_name = val and ("val_" .. val.metric)
  local best_path = ctx.dir .. "/trial-" .. trial.id .. ".best.ckpt.h5"
  local best_v, best_step, bad, stopped_at = nil, nil, 0, nil
  local function better(a, b) return b == nil or (val.metric == "loss" and a < b) or (val.metric ~= "loss" and a > b) end
  local function note_validation(v, at)
    if better(v, best_v) then best_v, best_step, bad = v, at, 0 else bad = bad + 1 end
  end
  if val and step > 0 and ctx.prior and ctx.prior.metrics then
    -- resumed: the evaluations logged up to the checkpoint's step decide what is best so far
    local vs, ss = ctx.prior.metrics[val_name] or {}, ctx.prior.metrics.step or {}
    for i = 1, math.min(#vs, step) do
      if vs[i] == vs[i] then note_validation(vs[i], ss[i] or i) end
    end
  end
  local function validate_root()
    if e.task._kind == "classify" then return eval_classify(ctx.model, tr, d.val, ctx.items.labels, nil).accuracy end
    return eval_sft(tr, d.val, nil, opts.batch).loss
  end
  local function validate_now()
    -- rank 0 evaluates, the others take its value (early stopping must stop every rank alike)
    if DIST.world_size > 1 then return gm.dist_bcast(ROOT and validate_root() or 0) end
    return validate_root()
  end
  local t0, tokens, last_loss = gm.clock(), 0, 0 / 0
  -- resumed at (or near) the end: the last step's loss as the trial file logged it (a resume at
  -- the last step runs none here)
  local logged = ctx.prior and ctx.prior.metrics and ctx.prior.metrics.loss
  if step > 0 and type(logged) == "table" and type(logged[step]) == "number" then last_loss = logged[step] end
  ctx.last_elapsed = 0
  local order = permutation(st_tr.n, cfg.seed, epoch)
  while step < total do
    if pos >= st_tr.n then
      epoch, pos = epoch + 1, 0
      order = permutation(st_tr.n, cfg.seed, epoch)
    end
    local idx = {}
    for i = 1, per_step do
      if pos + i > st_tr.n then break end
      idx[i] = order[pos + i]
    end
    pos = pos + #idx
    local mine = idx
    if DIST.world_size > 1 then
      mine = table.move(idx, DIST.rank * per_rank + 1, math.min(#idx, (DIST.rank + 1) * per_rank), 1, {})
    end
    local st = tr:step(d.train, mine)
    step = st.step
    last_loss = st.loss
    local step_tokens = 0
    for _, i in ipairs(idx) do step_tokens = step_tokens + d.train:example(i).tokens end
    tokens = tokens + step_tokens
    local elapsed = gm.clock() - t0
    local row = { step = step, loss = st.loss, lr = st.lr, grad_norm = st.grad_norm, supervised_tokens = st.tokens,
      tokens_per_s = step_tokens / math.max(1e-9, elapsed - (ctx.last_elapsed or 0)), elapsed_s = elapsed, rss_mib = gm.peak_rss() / 2 ^ 20,
      -- a mixture of experts: how evenly the router spread the step's tokens (nil otherwise: no column)
      router_max_load = st.router_max_load, router_load_cv = st.router_load_cv }
    if val then
      row[val_name] = 0 / 0
      if step % val.eval_steps == 0 or step == total then
        local v = validate_now()
        row[val_name] = v
        local improved = better(v, best_v)
        note_validation(v, step)
        if improved and val.select == "best" then
          guarded_write(tr.save, tr, best_path, { epoch = epoch, pos = pos, loss = st.loss, config = gm.json_encode(cfg) })
        end
        if val.patience and bad >= val.patience and step < total then stopped_at = step end
      end
    end
    res:append(row)
    ctx.last_elapsed = elapsed
    local eta = (total - step) * elapsed / math.max(1, step - (trial.resumed_from or 0))
    -- the display must never fail a trial: format in a protected call
    local okp, line = pcall(string.format, "trial %d/%d  step %d/%d  loss %.4f  %.0f tok/s  ETA %s  mem %s", trial.index,
      n_trials, step, total, st.loss, tokens / math.max(1e-9, elapsed), fmt_time(eta), fmt_bytes(gm.peak_rss()))
    progress(okp and line or string.format("trial %d/%d  step %d/%d", trial.index, n_trials, step, total))
    -- Ctrl-C on any rank stops every rank at the same step
    local interrupted = gm.dist_any(gm.interrupted())
    if interrupted or step % (cfg.checkpoint_every or 25) == 0 or step == total or stopped_at then
      guarded_write(tr.save, tr, ckpt, { epoch = epoch, pos = pos, loss = st.loss, config = gm.json_encode(cfg) })
      guarded_write(res.save, res)
      if interrupted then
        progress(string.format("trial %d/%d  interrupted at step %d: checkpoint saved", trial.index, n_trials, step), true)
        res:set({ status = "interrupted" })
        guarded_write(res.save, res)
        error({ interrupted = true }, 0)
      end
    end
    if stopped_at then break end
  end
  progress(string.format("trial %d/%d  %d step%s, final loss %.4f, %s", trial.index, n_trials, step, step == 1 and "" or "s", last_loss, fmt_time(gm.clock() - t0)), true)
  if stopped_at then
    say("  early stopping at step %d of %d: no better %s %s in %d evaluation%s (best %.6g at step %d)", stopped_at, total,
      val_name, val.metric == "loss" and "(lower)" or "(higher)", val.patience, val.patience == 1 and "" or "s", best_v, best_step)
  end
  if ROOT and val and val.select == "best" and best_step and best_step ~= step then
    -- the final evaluation and the stored adapter are those of the best validation step
    tr:load(best_path)
    say("  selected the adapter of step %d (%s %.6g)", best_step, val_name, best_v)
  end
  local f = evaluate("final")
  if val and ROOT then
    -- which adapter the final evaluation is of, and what it scored on the validation set
    local extra = { selected_step = (val.select == "best" and best_step) or step, ["best_" .. val_name] = best_v,
      best_step = best_step, stopped_at_step = stopped_at or step }
    for k, v in pairs(extra) do f[k] = v end
    res:set_eval("final", f)
  end
  if ROOT then
    say("  final %s", f.accuracy and string.format("accuracy %.1f%%", 100 * f.accuracy)
      or f.word_error_rate and string.format("loss %.4f, word error rate %.1f%%%s", f.loss, 100 * f.word_error_rate,
        f.phone_error_rate and string.format(", phone error rate %.1f%%", 100 * f.phone_error_rate) or "")
      or string.format("loss %.4f", f.loss))
  end
  mem.measured_peak_rss = gm.peak_rss()
  if trial.plan.gpu then
    -- the allocator's high-water mark (the plan's arenas) and what the GPU has in use (arenas,
    -- context and whatever else: the plan's total)
    local dm = gm.device_memory(e.device)
    mem.measured_gpu_peak_arenas, mem.measured_gpu_used = dm.peak, dm.used
  end
  res:set_memory(mem)
  res:put_adapter(tr)
  res:set({ status = "completed", wall_seconds = gm.clock() - t_start })
  guarded_write(res.save, res)
  if ROOT then
    gm.remove_checkpoint(ckpt)
    if val then gm.remove_checkpoint(best_path) end
  end
end

--------------------------------------------------------------------------------------------------
-- the sweep

--- The trial's config as stored: the training fields plus what the task is (task kind, prompt,
--- labels, template, max_eval) and the data spec as JSON, so that tables never pool trials of
--- different prompts or data (report.lua splits rows by any field that differs).
local function with_task(cfg, task, validation)
  local out = {}
  for k, v in pairs(cfg) do out[k] = v end
  out.task = task._kind
  if task.prompt then out.prompt = task.prompt end
  if task.labels then out.labels = table.concat(task.labels, ",") end
  if type(task.template) == "string" then out.template = task.template end
  if task.max_eval then out.max_eval = task.max_eval end
  out.data = gm.json_encode(P.task_identity(task).data or {}) -- the same identity the trial id hashes
  if validation then out.validation = gm.json_encode(P.task_identity(validation)) end
  return out
end

local function describe_point(trial, swept)
  local parts = {}
  for _, k in ipairs(swept) do parts[#parts + 1] = k .. "=" .. tostring(trial.config[k]) end
  parts[#parts + 1] = "seed=" .. trial.seed
  return table.concat(parts, " ")
end

--- Where a top-level field came from, for error messages: --set, the sweep, or the file.
local function field_where(e, k)
  if e._overrides and e._overrides[k] then return e._overrides[k] end
  if e.sweep and e.sweep[k] ~= nil then return e.sweep._where end
  return e._where
end

--- What can be checked before any weights are loaded, for the dry run and the real run alike:
--- every model's config is readable and holds max_length, the data sources read and give a
--- usable data set. Raises usage errors (exit 2). Returns the raw items and the configs by model.
--- Decodes every image file of the items once (gm.image_checker: a corrupt, truncated, empty,
--- absurdly large or unknown-format file is found here, before any training; a region
--- "#xywh=X,Y,W,H" outside its file too), records each reference's sha256 (items.image_sha, the
--- data's identity: a region's includes its rectangle) and the most images one example has
--- (items.max_images). An example with an unusable image leaves its split and is listed in
--- items.rejected_read with the reference and the reason. The checker decodes and hashes a sheet
--- once for all its cells (5,000 cells of OpenCV's digits.png: docs/experiments.md, "Images").
local function check_images(items, splits)
  items.image_sha = items.image_sha or {}
  items.image_crops = items.image_crops or {}
  items.image_size = items.image_size or {}
  items.max_images = items.max_images or 0
  items.max_views, items.max_crops = items.max_views or 0, items.max_crops or 0
  local bad = items.rejected_read or {}
  items.rejected_read = bad
  local checker <close> = gm.image_checker()
  for _, name in ipairs(splits) do
    local kept = {}
    for i, it in ipairs(items[name] or {}) do
      local why
      if it.images and #it.images > gm.MAX_IMAGES_PER_EXAMPLE then
        why = string.format("%d images; an example holds at most %d", #it.images, gm.MAX_IMAGES_PER_EXAMPLE)
      end
      for _, p in ipairs(why and {} or it.images or {}) do
        if not items.image_sha[p] then
          local ok, sha, w, h, crops, rw, rh = pcall(checker.check, checker, p)
          if not ok then why = clean_msg(sha); break end
          items.image_sha[p], items.image_crops[p] = sha, crops
          items.image_size[p] = { rw, rh }
          items.max_crops = math.max(items.max_crops, crops)
          items.max_image_pixels = math.max(items.max_image_pixels or 0, w * h)
          items.max_image_side = math.max(items.max_image_side or 0, w, h)
        end
      end
      if why then
        bad[#bad + 1] = { example = it.where or string.format("%s %d", name, i), reason = why,
          label = it.label and items.labels and items.labels[it.label] or nil }
      else
        kept[#kept + 1] = it
        if it.images and #it.images > items.max_images then items.max_images = #it.images end
        -- with pan & scan each image's crops go through the tower too
        local views = 0
        for _, p in ipairs(it.images or {}) do views = views + 1 + items.image_crops[p] end
        if views > items.max_views then items.max_views = views end
      end
    end
    items[name] = kept
  end
end

--- Decodes every audio clip of the items once (gm.audio_check: an unreadable, empty, truncated,
--- lying-header, absurdly long or too short file is found here, before any training), records
--- each file's sha256 (items.audio_sha, the data's identity) and feature frames
--- (items.audio_frames), the most clips one example has (items.max_audio), the longest clip's
--- frames and samples (items.max_audio_frames, items.max_audio_samples). An example with an
--- unusable clip leaves its split and is listed in items.rejected_read with the file and why.
local function check_audio(items, splits, min_samples)
  items.audio_sha, items.audio_frames, items.audio_samples = items.audio_sha or {}, items.audio_frames or {}, items.audio_samples or {}
  items.max_audio = items.max_audio or 0
  items.max_audio_frames, items.max_audio_samples = items.max_audio_frames or 0, items.max_audio_samples or 0
  local bad = items.rejected_read or {}
  items.rejected_read = bad
  local failed = {}
  for _, name in ipairs(splits) do
    local kept = {}
    for i, it in ipairs(items[name] or {}) do
      local why
      if it.audio and #it.audio > gm.MAX_IMAGES_PER_EXAMPLE then
        why = string.format("%d audio clips; an example holds at most %d", #it.audio, gm.MAX_IMAGES_PER_EXAMPLE)
      end
      for _, p in ipairs(why and {} or it.audio or {}) do
        if failed[p] then why = failed[p]; break end
        if not items.audio_sha[p] then
          local ok, sha, frames, samples, frames4 = pcall(gm.audio_check, p, nil, min_samples)
          if not ok then why = clean_msg(sha); failed[p] = why; break end
          items.audio_sha[p], items.audio_frames[p], items.audio_samples[p] = sha, frames, samples
          items.audio_frames4 = items.audio_frames4 or {}
          items.audio_frames4[p] = frames4
          items.max_audio_frames = math.max(items.max_audio_frames, frames)
          items.max_audio_frames4 = math.max(items.max_audio_frames4 or 0, frames4) -- Gemma 4's extractor
          items.max_audio_samples = math.max(items.max_audio_samples, samples)
          if samples > 480000 then
            items.audio_cut = (items.audio_cut or 0) + 1
            if items.audio_cut <= 3 then
              say("warning: %s is %.1f s long; the feature extractor keeps its first 30 s (split it to use the rest)", p,
                samples / 16000)
            end
          end
        end
      end
      if why then
        bad[#bad + 1] = { example = it.where or string.format("%s %d", name, i), reason = why,
          label = it.label and items.labels and items.labels[it.label] or nil }
      else
        kept[#kept + 1] = it
        if it.audio and #it.audio > items.max_audio then items.max_audio = #it.audio end
      end
    end
    items[name] = kept
  end
end

local function preflight(e, selected, dry_run, no_device)
  local cfgs, targets_ok = {}, {}
  -- the device: a dry run (and a Slurm submission) plans for a GPU it need not have; a run
  -- needs it before any trial
  if e.device and e.device ~= "cpu" and not dry_run and not no_device then
    local ok, why = gm.device_available(e.device)
    if not ok then P.usage(field_where(e, "device"), "experiment.device: %s", why) end
  end
  -- compute = "bf16" where the device has no bf16 GEMMs: refused before any trial
  for _, t in ipairs(selected) do
    if t.config.compute == "bf16" and gm.compute_dtype("bf16", e.device or "cpu") ~= "bf16" then
      P.usage((e.sweep and e.sweep.compute) and e.sweep._where or P.where_of("compute"),
        "train.compute = \"bf16\": device %s computes in f32 only (bf16 GEMMs run on a GPU: device = \"cuda\", " ..
        "or on a CPU with AVX512-BF16 / AMX through oneDNN - libdnnl.so.2, not turned off by GEMMARUN_ONEDNN=0 " ..
        "or capped by DNNL_MAX_CPU_ISA; `gemmarun --version` says what this one has)\n" ..
        "  hint: use compute = \"auto\" (bf16 where native and faster) or \"f32\"",
        e.device or "cpu")
    end
  end
  for _, t in ipairs(selected) do
    local m = t.config.model
    if not cfgs[m] then
      local ok, c = pcall(gm.model_config, m)
      if not ok then P.usage(field_where(e, "model"), "model %s: %s", m, clean_msg(c)) end
      MODEL_ARCH[m] = c.arch
      -- a built-in size plans (the dry run) but has no weights to train
      if c.preset then
        local what = string.format("model %s is a built-in size (%s): gemmarun plans it from its config, but training needs " ..
          "its weights: a .gguf file or a Hugging Face folder (config.json + model.safetensors)", m, c.name or m)
        if dry_run then say("note: %s", what) else P.usage(field_where(e, "model"), "%s", what) end
      end
      cfgs[m] = c
    end
    local c = cfgs[m]
    for _, l in ipairs(t.config.layers or {}) do
      if c.num_hidden_layers and l >= c.num_hidden_layers then
        P.usage(P.where_of("layers"), "train.layers: %d is not a layer of %s (it has %d: 0..%d)", l, m,
          c.num_hidden_layers, c.num_hidden_layers - 1)
      end
    end
    -- the LoRA targets against this model's module names (a regular expression may select none)
    local tkey = m .. "\0" .. tostring(t.config.targets) .. "\0" .. gm.json_encode(t.config.layers or gm.null)
    if not targets_ok[tkey] then
      local ok, msg = pcall(gm.lora_count, m, { targets = t.config.targets, layers = t.config.layers, rank = t.config.rank })
      if not ok then P.usage(P.where_of("targets"), "train.%s", clean_msg(msg)) end
      targets_ok[tkey] = true
    end
    if c.max_position_embeddings and c.max_position_embeddings > 0 and t.config.max_length > c.max_position_embeddings then
      P.usage(P.where_of("max_length"), "train.max_length = %d: %s (%s) has %d positions; use at most %d",
        t.config.max_length, m, c.name or "model", c.max_position_embeddings, c.max_position_embeddings)
    end
    -- what the trainer would refuse on this model, before any trial runs (after the checks
    -- above, whose messages are the runner's own): KV sharing with checkpointing, ...
    if not c.preset then
      local ok, msg = pcall(gm.train_check, m, trainer_opts(t.config, 1, 1, {}))
      if not ok then P.usage(P.where_of("checkpointing"), "train: %s", clean_msg(msg)) end
    end
  end
  local d = e.task.data
  local ok, items = pcall(e.task._kind == "classify" and load_classify_items
    or e.task._kind == "transcribe" and function(x) return load_speech_items(x, e.task) end or load_chat_items, d)
  if not ok then
    if type(items) == "table" and items.usage then error(items, 0) end
    P.usage(d._where or e.task._where, "%s", clean_msg(items))
  end
  check_images(items, { "train", "test" })
  -- Gemma 4's extractor gives a frame to clips from 161 samples, Gemma 3n's from 513: the shorter
  -- floor only when every model of the experiment is a Gemma 4
  local all4 = #selected > 0
  for _, t in ipairs(selected) do all4 = all4 and MODEL_ARCH[t.config.model] == "gemma4" end
  check_audio(items, { "train", "test" }, all4 and gm.AUDIO4_MIN_SAMPLES or nil)
  -- audio needs a model with an audio encoder (known from its config, before any weights load)
  if (items.max_audio or 0) > 0 then
    for _, t in ipairs(selected) do
      local c = cfgs[t.config.model]
      if c and not c.audio then
        local first
        for _, it in ipairs(items.train) do if it.audio then first = it; break end end
        P.usage(field_where(e, "model"), "the data has audio (first: %s), but model %s %s",
          first and ((first.where and first.where ~= first.audio[1]) and (first.where .. ", ") or "") .. first.audio[1] or "?",
          t.config.model, "has no audio encoder; use a checkpoint with one: Gemma 3n (gemma-3n-E2B-it, gemma-3n-E4B-it) or "
            .. "Gemma 4 E2B / E4B (gemma-4-E2B-it, gemma-4-E4B-it)")
      end
    end
  end
  -- an encoder learns only from its training examples' media: which splits have them
  local function train_has(key)
    for _, it in ipairs(items.train or {}) do
      if type(it[key]) == "table" and #it[key] > 0 then return true end
    end
    return false
  end
  local train_images, train_audio = train_has("images"), train_has("audio")
  -- what of the image path trains needs images, and a tower whose modules the targets select
  local vis_ok = {}
  for _, t in ipairs(selected) do
    local c = t.config
    local vt, ms = c.vision_targets or "none", c.modules_to_save or "none"
    if vt ~= "none" or ms ~= "none" then
      local key = ms ~= "none" and vt == "none" and "modules_to_save" or "vision_targets"
      if (items.max_images or 0) == 0 then
        P.usage(P.where_of(key), "train.%s is set, but the data has no images: the vision tower and projector only learn "
          .. "from images (leave vision_targets and modules_to_save out for text-only data)", key)
      end
      if not train_images then
        P.usage(P.where_of(key), "train.%s is set, but only the test data has images: the vision tower and projector only "
          .. "learn from training images\n  hint: put images in the training data, or leave %s out", key, key)
      end
      if not (cfgs[c.model] and cfgs[c.model].vision) then
        P.usage(P.where_of(key), "train.%s: %s has no vision tower to train", key, c.model)
      end
      if ms ~= "none" and cfgs[c.model] and cfgs[c.model].arch == "gemma4" then
        P.usage(P.where_of("modules_to_save"), "train.modules_to_save = %s: training the image projector fully is Gemma 3's "
          .. "(multi_modal_projector); Gemma 4's (embed_vision) is not trained in gemmarun yet\n"
          .. "  hint: leave modules_to_save out; vision_targets adapts Gemma 4's tower (q_proj.linear, ...)", ms)
      end
      local vkey = c.model .. "\0" .. vt
      if vt ~= "none" and not vis_ok[vkey] then
        local ok, msg = pcall(gm.lora_count, c.model, { vision_targets = vt, rank = c.rank })
        if not ok then P.usage(P.where_of("vision_targets"), "train.%s", clean_msg(msg)) end
        vis_ok[vkey] = true
      end
    end
  end
  -- the audio encoder trains only from audio, on a model that has one, on modules it has
  local aud_ok = {}
  for _, t in ipairs(selected) do
    local c = t.config
    local at = c.audio_targets or "none"
    if at ~= "none" then
      -- the model first: one without an audio encoder has nothing to train, whatever the data
      local akey = c.model .. "\0" .. at
      if not aud_ok[akey] then
        local ok, msg = pcall(gm.lora_count, c.model, { audio_targets = at, rank = c.rank })
        if not ok then P.usage(P.where_of("audio_targets"), "train.%s", clean_msg(msg)) end
        aud_ok[akey] = true
      end
      if (items.max_audio or 0) == 0 then
        P.usage(P.where_of("audio_targets"), "train.audio_targets is set, but the data has no audio: the audio encoder only "
          .. "learns from audio (leave audio_targets out for data without audio)")
      end
      if not train_audio then
        P.usage(P.where_of("audio_targets"), "train.audio_targets is set, but only the test data has audio: the audio "
          .. "encoder only learns from training clips\n  hint: put clips in the training data, or leave audio_targets out")
      end
    end
  end
  if e.task._kind == "classify" and e.task.labels then
    -- the task's labels, in its order: every data label must be one of them (matched by name),
    -- and every one of them must have data
    local pos, used = {}, {}
    for i, lab in ipairs(e.task.labels) do pos[lab] = i end
    for _, split in ipairs({ items.train, items.test }) do
      for _, it in ipairs(split) do
        local name = items.labels[it.label]
        local k = pos[name]
        if not k then
          P.usage(e.task._where, "classify.labels: the data has label '%s', which is not among the labels given (%s)", name,
            table.concat(e.task.labels, ", "))
        end
        it.label, used[k] = k, true
      end
    end
    for i, lab in ipairs(e.task.labels) do
      if not used[i] then
        -- say why when its examples were there but their images could not be used
        local why = ""
        for _, r in ipairs(items.rejected_read or {}) do
          if r.label == lab then why = string.format(" (its examples' images could not be used: %s: %s)", r.example, (r.reason:gsub("\n.*", ""))); break end
        end
        P.usage(e.task._where, "classify.labels: '%s' has no example in the data%s", lab, why)
      end
    end
    items.labels = e.task.labels
  end
  if items.rejected_read and #items.rejected_read > 0 then
    local n = #items.rejected_read
    say("warning: %d example%s rejected while reading:", n, n == 1 and "" or "s")
    for i = 1, math.min(n, 10) do
      local r = items.rejected_read[i]
      -- the reason often starts with the file's own name: said once
      local reason = r.reason:gsub("\n.*", "")
      if reason:sub(1, #r.example + 2) == r.example .. ": " then reason = reason:sub(#r.example + 3) end
      say("  %s: %s", r.example, reason)
    end
    if n > 10 then
      say("  ... and %d more (%s)", n - 10, dry_run and "a run lists the first 100 in each trial file's data/rejections_json"
        or "the first 100 are listed in each trial file's data/rejections_json, with their count in data/n_rejected")
    end
    -- the share the data source printed was counted before these: again, on what is left
    if e.task._kind == "classify" and #items.test > 0 and items.labels then say("  what is left: %s", test_majority(items)) end
  end
  if items.skipped and #items.skipped > 0 then
    local n = #items.skipped
    say("warning: %d entr%s of the label folders not read:", n, n == 1 and "y" or "ies")
    for i = 1, math.min(n, 5) do say("  %s: %s", items.skipped[i].path, items.skipped[i].reason) end
    if n > 5 then
      -- the rest by kind (a stamp collection's sounds and texts: "1426 .ogg, 154 .txt, ...")
      local by, kinds = {}, {}
      for i = 6, n do
        local k = items.skipped[i].path:match("(%.[%w_]+)$") or "without an extension"
        if not by[k] then by[k], kinds[#kinds + 1] = 0, k end
        by[k] = by[k] + 1
      end
      table.sort(kinds, function(a, b) return by[a] > by[b] or (by[a] == by[b] and a < b) end)
      for i, k in ipairs(kinds) do kinds[i] = by[k] .. " " .. k end
      say("  ... and %d more (%s)", n - 5, table.concat(kinds, ", "))
    end
  end
  if e.task._kind == "classify" and #items.labels < 2 then
    P.usage(d._where or e.task._where, "classify{} needs at least 2 labels; the data set has %d (%s)", #items.labels,
      #items.labels > 0 and table.concat(items.labels, ", ") or "none")
  end
  if #items.train == 0 then P.usage(d._where or e.task._where, "the data set has no training examples") end
  if #items.test == 0 then P.usage(d._where or e.task._where, "the data set has no test examples (nothing to evaluate)") end
  if e.validation then
    validation_items(e, items)
    check_images(items, { "val" })
    check_audio(items, { "val" })
  end
  return items, cfgs
end

--- Tokenizes every example for each (model, max_length) of the selected trials (built-in sizes,
--- which have no vocabulary, are skipped) and raises a usage error when max_length leaves a
--- split empty; warns when it rejects more than half of the training examples. Loads each model
--- (memory-mapped: its pages are read only as the tokenizer touches them).
local function check_lengths(ctx, e, selected, items)
  local seen = {}
  for _, t in ipairs(selected) do
    local m, ml = t.config.model, t.config.max_length
    local per = images_per_example(items, t.config)
    local key = m .. "|" .. ml .. (t.config.pan_and_scan and "|pan_and_scan" or "")
    -- pan & scan is Gemma 3's processor's (Gemma 4 resizes each image whole, its aspect kept)
    local mc = ctx.cfgs[m]
    if t.config.pan_and_scan and mc and mc.arch ~= "gemma3" and (items.max_images or 0) > 0 then
      P.usage((e.sweep and e.sweep.pan_and_scan) and e.sweep._where or P.where_of("pan_and_scan"),
        "train.pan_and_scan = true: pan & scan crops are Gemma 3's image processor's; model %s (%s) resizes each image whole\n"
        .. "  hint: leave pan_and_scan out", m, mc.arch)
    end
    if not seen[key] and ctx.cfgs[m] and ctx.cfgs[m].preset and per > 0 then
      -- a built-in size has no tokenizer to count the prompts with, but its images' soft tokens
      -- (with pan & scan, its crops' too) alone must leave room for text: the planner's check
      -- (gm_plan_max_images)
      seen[key] = true
      local ok, err = pcall(gm.plan, m, { max_length = ml }, { images = per })
      if not ok and clean_msg(err):find("leaves no room for text", 1, true) then
        P.usage((e.sweep and e.sweep.max_length) and e.sweep._where or P.where_of("max_length"), "train.%s", clean_msg(err))
      end
    end
    if not seen[key] and not (ctx.cfgs[m] and ctx.cfgs[m].preset) then
      seen[key] = true
      use_model(ctx, e, m)
      if (items.max_images or 0) > 0 and not ctx.model:config().vision then
        local first
        for _, split in ipairs({ items.train, items.test, items.val or {} }) do
          for _, it in ipairs(split) do
            if it.images then first = first or it; break end
          end
        end
        local mc = ctx.model:config()
        P.usage(e.task.data._where or e.task._where, "the data has images (first: %s%s), but model %s: %s%s",
          first and first.where and first.where ~= first.images[1] and (first.where .. ", ") or "", first and first.images[1] or "?", m,
          mc.no_images or "it has no vision tower",
          mc.arch == "gemma3" and "; use a multimodal Gemma 3 checkpoint (Gemma3ForConditionalGeneration: gemma-3-4b or larger)" or "")
      end
      local okd, d = pcall(R.datasets, ctx, e, t.config)
      if not okd then
        if type(d) == "table" and d.usage then error(d, 0) end
        P.usage(field_where(e, "model"), "model %s: %s", m, clean_msg(d))
      end
      local where = (e.sweep and e.sweep.max_length) and e.sweep._where or P.where_of("max_length")
      -- the hint must make both splits non-empty: the larger of their shortest rejected prompts
      local need = 0
      if d.train:size() == 0 and d.shortest_train < math.huge then need = math.max(need, d.shortest_train + 2) end
      if d.test:size() == 0 and d.shortest_test < math.huge then need = math.max(need, d.shortest_test + 2) end
      local function raise(split, shortest, n_all)
        if shortest < math.huge then
          P.usage(where, "train.max_length = %d leaves no room for any %s response: the shortest %s prompt takes %d tokens; " ..
            "raise max_length to at least %d", ml, split, split, shortest, need)
        end
        P.usage(where, "train.max_length = %d leaves no %s example (all %d were rejected: %s)", ml, split, n_all,
          d.rejected[1] and d.rejected[1].reason or "see above")
      end
      if d.train:size() == 0 then raise("training", d.shortest_train, #items.train) end
      if d.test:size() == 0 then raise("test", d.shortest_test, #items.test) end
      for _, sp in ipairs({ { "training", d.train:size(), #items.train, d.shortest_train },
                            { "test", d.test:size(), #items.test, d.shortest_test } }) do
        if sp[2] < sp[3] / 2 then
          local r1 = d.rejected[1]
          say("warning: train.max_length = %d keeps %d of %d %s examples (first rejected: %s)%s", ml, sp[2],
            sp[3], sp[1], r1 and (r1.example .. ": " .. r1.reason) or "see above",
            sp[4] < math.huge and string.format("; %d would keep the shortest rejected one", sp[4] + 2) or "")
        end
      end
      -- classify scores each label by its first token when those differ, else each whole label
      -- (one scored sequence per label and example: slower, said once)
      if e.task._kind == "classify" and not ctx.said_whole_labels then
        local first = {}
        for _, lab in ipairs(items.labels) do
          local tok = ctx.model:tokenize(lab, { bos = false })[1]
          if first[tok] then
            say("note: labels '%s' and '%s' start with the same token: evaluation scores each whole label (%d scored " ..
              "sequences per test example instead of one)", first[tok], lab, #items.labels)
            ctx.said_whole_labels = true
            break
          end
          first[tok] = lab
        end
      end
    end
  end
end

--- experiment.model = with_vision_tower{...}: the composed model's folder in the cache (written the
--- first time: the text model's weights converted, the new tower drawn), which then stands for the
--- model everywhere (trials' config.model, provenance, reproduce).
local function resolve_composed_model(e)
  local m = e.model
  if type(m) ~= "table" then return end
  local spec = {}
  for k, v in pairs(m) do if k ~= "text" and k:sub(1, 1) ~= "_" then spec[k] = v end end
  local ok, path, written = pcall(gm.with_vision_tower, m.text, spec)
  if not ok then
    local msg = clean_msg(path)
    P.usage(m._where, "%s%s", msg:find("^with_vision_tower:") and "" or "with_vision_tower: ", msg)
  end
  say("model: %s with a new vision tower (%d layer%s of width %d, %d x %d images in %d-pixel patches, %d token%s per image, "
    .. "seed %d): %s%s", m.text, m.num_hidden_layers, m.num_hidden_layers == 1 and "" or "s", m.hidden_size, m.image_size,
    m.image_size, m.patch_size, m.mm_tokens_per_image, m.mm_tokens_per_image == 1 and "" or "s", m.seed or 0, path,
    written and " (written now)" or "")
  e.model = path
end

--- The trial `which` names among `trials` (P.expand's): an index in the sweep (digits, fewer than
--- 12) or a trial id (12 hex digits) or the start of one only one trial has, any case. Usage
--- errors (exit 2) say what the experiment has.
function R.pick_trial(trials, which)
  local w = tostring(which):lower()
  if w:match("^%d+$") and #w < 12 then
    local i = tonumber(w)
    if i < 1 or i > #trials then P.usage(nil, "--trial %s: the experiment has trials 1..%d", w, #trials) end
    return trials[i]
  end
  local pick = {}
  for _, t in ipairs(trials) do if t.id:sub(1, #w) == w then pick[#pick + 1] = t end end
  if #pick == 1 then return pick[1] end
  if #pick == 0 then
    P.usage(nil, "--trial %s: no trial of this experiment has that id (its %d trials: %s%s); a trial's id is the hash "
      .. "of its configuration, so it changes when the file, a --set or an environment variable the file reads (env()) "
      .. "changes what the trial trains", which, #trials,
      table.concat((function() local l = {} for i = 1, math.min(#trials, 8) do l[i] = trials[i].index .. " " .. trials[i].id end return l end)(), ", "),
      #trials > 8 and ", ..." or "")
  end
  P.usage(nil, "--trial %s: %d trials have an id starting so: give more of it", which, #pick)
end

--- What a run and a submission check before any trial: the file's overrides and validation,
--- the composed model, the sweep, the models, data and max_length (tokenizing every example),
--- model_adapter. Returns ctx (data, items, ...), the trials, the selected ones and the swept
--- fields. Raises usage errors (exit 2) for what is wrong in the file.
function R.prepare(e, cli)
  P.apply_overrides(e, cli.set)
  P.validate(e)
  resolve_composed_model(e)
  local trials, swept = P.expand(e, cli.max_trials)
  local selected = trials
  if cli.trial then selected = { R.pick_trial(trials, cli.trial) } end
  if cli.select then selected = { cli.select(trials) } end
  say("experiment %s: %d trial%s (%s), model %s", e.name, #trials, #trials == 1 and "" or "s",
    (#swept > 0 and ("sweep over " .. table.concat(swept, ", ") .. " x ") or "") .. #e.seeds .. (#e.seeds == 1 and " seed" or " seeds"),
    e.model)
  if (trials.duplicates or 0) > 0 then
    say("note: the random search drew some points more than once: each distinct trial runs once (%d trials, not %d)",
      #trials, #trials + trials.duplicates)
  end
  -- everything that can fail for the whole sweep is checked before the first trial (and by the
  -- dry run): models, max_length, data
  local items, cfgs = preflight(e, selected, cli.dry_run, cli.no_device)
  -- tokenize every example up front for each (model, max_length) of the selected trials: a
  -- max_length that leaves no room for any response is an error in the file, before any trial
  -- (the dry run too: it maps the model for its vocabulary but reads no weights)
  local ctx = { data = {}, baselines = {}, items = items, cfgs = cfgs, no_device = cli.dry_run or cli.no_device }
  check_lengths(ctx, e, selected, items)
  resolve_model_adapter(ctx, e, trials)
  return ctx, trials, selected, swept
end

--- Closes what R.prepare opened for a dry run or a submission (the model, the tokenized data),
--- saying how many examples max_length rejects.
function R.close_prepared(ctx, items)
  if ctx.model then ctx.model:close() end
  for key, ds in pairs(ctx.data) do
    local n = ds.train:stats().rejected + ds.test:stats().rejected
    if n > 0 then
      say("note: max_length %s rejects %d example%s while tokenizing (first: %s: %s)", (key:match("|(%d+)$") or key:match("|(%d+)|pan_and_scan$") or "?") .. (key:find("|pan_and_scan", 1, true) and " (pan & scan)" or ""), n,
        n == 1 and "" or "s", ds.rejected[1].example, (ds.rejected[1].reason:gsub("\n.*", "")))
    end
    ds.train:close(); ds.test:close(); if ds.val then ds.val:close() end
  end
  say("data: %d training and %d test examples%s", #items.train, #items.test,
    items.labels and (", labels " .. table.concat(items.labels, ", ")) or "")
end

--- A trial's memory as the runner will meet it: {total (bytes, after fit), plan, fit (what fit
--- chose, or nil), over (true: it would be refused), why (the fit's or the planner's error)}.
function R.plan_trial(e, t, items, threads)
  local opts = trainer_opts(t.config, 1, threads, items)
  local ok, plan = pcall(trial_plan, t.config.model, opts, items, e.device)
  if not ok then return { why = clean_msg(plan) } end
  local r = { plan = plan, total = plan.total }
  -- on a GPU, memory_limit is the GPU's (its arenas, cuBLAS workspace, the context); r.total
  -- stays the host's (what a Slurm job asks --mem for)
  if plan.gpu then
    if e.memory_limit_bytes and plan.gpu.total > e.memory_limit_bytes then
      r.over, r.why = true, e.fit and "fit does not shrink GPU plans yet: lower batch / max_length, or checkpointing = true" or nil
    end
    return r
  end
  if e.memory_limit_bytes and plan.total > e.memory_limit_bytes then
    local fok, total, chosen = false, nil, nil
    if e.fit then
      local _
      fok, _, total, chosen = pcall(gm.plan_fit, t.config.model, opts, math.max(1, e.memory_limit_bytes - RUNNER_STATE_BYTES))
    end
    if fok then
      r.total, r.fit = total + RUNNER_STATE_BYTES, chosen
    else
      r.over, r.why = true, e.fit and clean_msg(total) or nil
    end
  end
  return r
end

--- The file a process locks while it works on trial `id` of results folder `dir`: hidden, so
--- that what lists or globs the folder's trial-* files sees only trial files and checkpoints.
function R.lock_path(dir, id) return dir .. "/.trial-" .. id .. ".lock" end

--- The runner's one-line description of a trial (index, id, swept values, seed).
function R.describe_trial(t, swept) return describe_point(t, swept) end

local function run_all(e, cli)
  local ctx, trials, selected, swept = R.prepare(e, cli)
  local items = ctx.items
  local dir = cli.dir and cli.dir(e) or ((e.results or "results") .. "/" .. e.name)
  if cli.dry_run then
    R.close_prepared(ctx, items)
    local over = 0
    for _, t in ipairs(selected) do
      local r = R.plan_trial(e, t, items, e.threads or GM_THREADS)
      local line
      if r.plan then
        line = string.format("  trial %2d  %s  %s  plan %s (%s)", t.index, t.id, describe_point(t, swept), fmt_bytes(r.plan.total), R.plan_summary(r.plan))
        if r.plan.gpu then
          line = line .. string.format("; on %s: GPU %s (arenas %s, CUDA context %s, estimate), host %s", e.device,
            fmt_bytes(r.plan.gpu.total), fmt_bytes(r.plan.gpu.arenas), fmt_bytes(r.plan.gpu.context), fmt_bytes(r.plan.gpu.host))
        end
        if r.fit then
          line = line .. string.format("  over memory_limit; fit: %s (plan %s)", r.fit, fmt_bytes(r.total))
        elseif r.over then
          over = over + 1
          line = line .. "  OVER memory_limit" .. (e.fit and (": cannot fit: " .. r.why) or
            (r.plan.gpu and " (the trial will be refused; lower batch / max_length, or checkpointing = true)"
              or " (the trial will be refused; fit = true may help)"))
        end
      else
        line = string.format("  trial %2d  %s  %s  plan unavailable: %s", t.index, t.id, describe_point(t, swept), r.why)
      end
      say("%s", line)
    end
    if over > 0 then say("%d trial%s would be refused: over memory_limit", over, over == 1 and "" or "s") end
    return 0
  end
  ctx.dir = dir
  ctx.check_identity = cli.check_identity
  -- the experiment's text, stored in every trial's provenance (what `gemmarun reproduce` reruns)
  ctx.source = GM_EXPERIMENT_SOURCE or (GM_EXPERIMENT_FILE and gm.file_exists(GM_EXPERIMENT_FILE)
    and gm.read_text(GM_EXPERIMENT_FILE)) or ""
  if ROOT then gm.make_results_dir(dir) end
  if cli.fresh and ROOT then -- `gemmarun reproduce`: its scratch trial starts over
    for _, t in ipairs(selected) do gm.remove_reproduction(dir .. "/trial-" .. t.id .. ".h5") end
  end
  local failed, interrupted, stopped = 0, false, nil
  ctx.cli_set = cli.set
  local report = e.report and { rows = e.report.rows, cols = e.report.cols, metric = e.report.metric, phase = e.report.phase, digits = e.report.digits }
    or { rows = swept, cols = {}, metric = e.task._kind == "classify" and "accuracy"
      or e.task._kind == "transcribe" and "word_error_rate" or "loss" }
  local busy = 0
  for _, t in ipairs(selected) do
    local path = dir .. "/trial-" .. t.id .. ".h5"
    -- one process per trial: another one on it (a second run of this experiment, an array task
    -- submitted again while the first runs) keeps it (lua/bind_proc.c)
    local lock = R.lock_path(dir, t.id)
    -- (a `submit` that looks at the lock holds it for a moment: 2 s to let go; data parallel: rank
    -- 0 holds it for the world and tells the others)
    local mine, holder = true, nil
    if ROOT then mine, holder = gm.file_lock(lock, 2) end
    if DIST.world_size > 1 then mine = gm.dist_bcast(mine and 1 or 0) == 1 end
    local prior = mine and gm.file_exists(path) and gm.results_read(path) or nil
    if not mine then
      busy = busy + 1
      say("trial %d/%d  %s  %s: running in another process (pid %s): left to it", t.index, #trials, t.id,
        describe_point(t, swept), holder)
    elseif prior and prior.status == "completed" then
      -- kept as it is; but say so when it was trained on other data than the data set is now
      local d = ctx.data[t.config.model .. "|" .. t.config.max_length]
      local was = prior.provenance and prior.provenance.data_sha256
      local other = d and was and was ~= data_sha(d).both
      local ad_was = prior.provenance and prior.provenance.model_adapter_sha256
      local other_ad = ctx.adapter_sha and ad_was and ad_was ~= ctx.adapter_sha
      say("trial %d/%d  %s  %s: done (kept%s%s)", t.index, #trials, t.id, describe_point(t, swept), other and
        string.format("; trained on other data than the data set now: sha256 %s... then, %s... now; delete %s to run "
          .. "it again", was:sub(1, 12), data_sha(d).both:sub(1, 12), path) or "", other_ad and
        string.format("; started from another adapter than %s is now: sha256 %s... then, %s... now; delete %s to run it "
          .. "again", e.model_adapter, ad_was:sub(1, 12), ctx.adapter_sha:sub(1, 12), path) or "")
    else
      say("trial %d/%d  %s  %s", t.index, #trials, t.id, describe_point(t, swept))
      use_model(ctx, e, t.config.model)
      ctx.res = ROOT and gm.results(path) or NO_RESULTS
      ctx.res:set({ experiment = e.name, trial_id = t.id, trial_index = t.index, n_trials = #trials, status = "running",
        reason = "", config_json = gm.json_encode(t.config), report_json = gm.json_encode(report), swept_json = gm.json_encode(#swept > 0 and swept or gm.null) })
      ctx.res:set_config(with_task(t.config, e.task, e.validation))
      ctx.prior = prior
      local ok, err = pcall(run_trial, ctx, e, t, #trials)
      if not ok and type(err) == "table" and err.usage then -- refused before any work: nothing recorded
        ctx.res:close()
        if ctx.model then ctx.model:close() end
        error(err, 0)
      end
      if not ok and DIST.world_size > 1 and not (type(err) == "table" and err.interrupted and not err.io) then
        -- data parallel: only Ctrl-C (gm.dist_any) and a failed step (gm_trainer_step) reach
        -- every rank at the same point; any other failure (a write or an evaluation on rank 0,
        -- an error on one rank) leaves the others in a collective this rank will not join.
        -- Rank 0 records it, then every rank stops (main: MPI_Abort) instead of waiting forever.
        local reason = type(err) == "table" and (err.msg or "interrupted") or clean_msg(err)
        progress(string.format("trial %d/%d  FAILED: %s", t.index, #trials, reason), true)
        ctx.res:set({ status = type(err) == "table" and "interrupted" or "failed", reason = reason })
        pcall(ctx.res.save, ctx.res)
        ctx.res:close()
        if ctx.model then ctx.model:close() end
        return 1, string.format("trial %d/%d failed: %s", t.index, #trials, reason)
      end
      if not ok then
        if type(err) == "table" and (err.interrupted or err.io) then
          interrupted = true
          if err.io then
            stopped = err.msg
            progress(string.format("trial %d/%d  STOPPED: cannot write: %s", t.index, #trials, err.msg), true)
          end
          -- (the disk may still be full: the trial is resumable whether or not this lands)
          ctx.res:set({ status = "interrupted", reason = err.io and ("cannot write: " .. err.msg) or "" })
          pcall(ctx.res.save, ctx.res)
          ctx.res:close()
          break
        end
        failed = failed + 1
        local reason = clean_msg(err)
        progress(string.format("trial %d/%d  FAILED: %s", t.index, #trials, reason), true)
        ctx.res:set({ status = "failed", reason = reason })
        local sok, serr = pcall(ctx.res.save, ctx.res)
        if not sok then
          stopped, interrupted = clean_msg(serr), true
          say("cannot record the failure: %s", stopped)
          ctx.res:close()
          break
        end
      end
      ctx.res:close()
      ctx.res = nil
    end
    if mine and ROOT then gm.file_unlock(lock) end
  end
  if ctx.model then ctx.model:close() end
  for _, ds in pairs(ctx.data) do ds.train:close(); ds.test:close(); if ds.val then ds.val:close() end end
  if stopped then
    say("stopped: a checkpoint or results file could not be written (above). Finished trials are kept; free space (or "
      .. "fix the folder) and run the same command again: the interrupted trial resumes from its last checkpoint")
    return 1
  end
  if interrupted then
    -- (a Slurm array task's user resubmits; the task's own command is not theirs to type)
    local again = os.getenv("SLURM_ARRAY_JOB_ID") and "you submit the experiment again (gemmarun submit ... --slurm)"
      or "you run the same command again"
    say("interrupted: finished trials are kept and the current one resumes from its checkpoint when %s", again)
    return 1
  end
  if busy > 0 then
    say("%d trial%s ran in another process: run the same command once %s done to see %s here", busy, busy == 1 and "" or "s",
      busy == 1 and "it is" or "they are", busy == 1 and "it" or "them")
  end
  if cli.no_render or not ROOT then return (failed > 0 or busy > 0) and 1 or 0 end
  local rok, rerr = pcall(R.render, dir, e.results or "results", e.name)
  if not rok then
    say("the trials are done and kept, but the tables could not be written: %s (run `gemmarun table %s` once it "
      .. "can be)", clean_msg(rerr), dir)
    return 1
  end
  return (failed > 0 or busy > 0) and 1 or 0
end

--- Runs render() (it writes results_root/name.md, .tex, .csv, plots and the page) holding
--- results_root/.name.tables.lock: two renders of one experiment at once - a local run's end and
--- a tables job, two array tasks' runs - take turns instead of racing on the same files.
function R.render_locked(results_root, name, render)
  local lock = results_root .. "/." .. name .. ".tables.lock"
  local ok, holder = gm.file_lock(lock, 600)
  if not ok then error(string.format("another process (pid %s) has been writing these tables for 10 minutes: %s", holder, lock), 0) end
  local rok, out = pcall(render)
  gm.file_unlock(lock)
  if not rok then error(out, 0) end
  return out
end

--- Runs (or resumes) the trials and renders the tables; returns the exit code, and a message when
--- the other ranks of a data-parallel run must be stopped (main: MPI_Abort) because this one
--- failed where they could not see it. Otherwise every rank leaves together, after rank 0's last
--- write.
function R.run(e, cli)
  local rc, abort = run_all(e, cli)
  if DIST.world_size > 1 and not abort then gm.dist_barrier() end
  return rc, abort
end

--- Merges the trial files, prints the table and writes .md/.tex/.csv and plots (the same path
--- as `gemmarun table results/<name>`).
function R.render(dir, results_root, name)
  local out = R.render_locked(results_root, name, function() return gm_module("report").cli(gm.results_read_all(dir), dir, results_root, name, true) end)
  print("\n" .. out.text)
  for _, w in ipairs(out.warnings) do say("warning: %s", w) end
  say("written: %s", table.concat(out.written, ", "))
end

--------------------------------------------------------------------------------------------------
-- `gemmarun reproduce RESULTS [--trial ID]`

--- The trial to reproduce: `results` is a results folder or a trial file, `which` its index in
--- the sweep (a number of 1-3 digits) or its id (or a prefix of it only one trial has); nil when
--- there is one trial. Returns the trial file's path, the stored experiment text and its file
--- name; a usage error (exit 2) names what is wrong and what to give instead.
--- The trials of a results folder or trial file, as gm.results_read_all reads them (each with
--- .path), by index; raises a usage error for a checkpoint, a merged file or a missing path.
local function read_trials(results)
  local paths
  if gm.is_dir(results) then
    paths = gm.results_list(results)
    if #paths == 0 then P.usage(nil, "%s: no trial files (trial-*.h5) in this folder", results) end
  elseif results:match("%.ckpt%.h5$") then
    P.usage(nil, "%s is a checkpoint, not a trial file: give the trial file (trial-<id>.h5) or its results folder", results)
  elseif gm.file_exists(results) then
    paths = { results }
  else
    P.usage(nil, "%s: no such file or folder", results)
  end
  local found = {}
  for _, p in ipairs(paths) do
    local ok, all = pcall(gm.results_read_all, p)
    if not ok then P.usage(nil, "%s", clean_msg(all)) end
    -- a merged file holds copies of trial files without their adapters: compare against the
    -- trial file itself
    if #all ~= 1 or tostring(all[1].source or ""):find("#", 1, true) then
      P.usage(nil, "%s is a merged results file: give its results folder (results/NAME/) or one trial file", p)
    end
    all[1].path = p
    found[#found + 1] = all[1]
  end
  table.sort(found, function(a, b) return (tonumber(a.trial_index) or 0) < (tonumber(b.trial_index) or 0) end)
  return found
end

local function trial_listing(found)
  local t = {}
  for _, x in ipairs(found) do t[#t + 1] = string.format("%s (%s, %s)", tostring(x.trial_index), x.trial_id, x.status) end
  return table.concat(t, ", ")
end

--- The trial `which` (an index of 1-3 digits, or an id or the start of one, any case) among
--- `found`; the only one when `which` is nil. Usage errors list the trials.
local function pick_trial(found, which, results)
  local pick = {}
  if which == nil then
    if #found > 1 then P.usage(nil, "%s holds %d trials: give --trial INDEX or ID (%s)", results, #found, trial_listing(found)) end
    pick = found
  else
    local w = tostring(which):lower()
    for _, x in ipairs(found) do
      local by_index = w:match("^%d%d?%d?$") and tonumber(w) == tonumber(x.trial_index)
      local by_id = not w:match("^%d%d?%d?$") and tostring(x.trial_id):lower():sub(1, #w) == w
      if by_index or by_id then pick[#pick + 1] = x end
    end
    if #pick ~= 1 then
      local why = #pick == 0 and "no such trial"
        or w:match("^%d%d?%d?$") and ("more than one trial has index " .. w .. " (trials of other runs of the experiment: "
          .. "give the id)")
        or "more than one trial has an id starting so"
      P.usage(nil, "--trial %s: %s in %s (trials: %s)", which, why, results, trial_listing(found))
    end
  end
  return pick[1]
end

function R.find_trial(results, which)
  local t = pick_trial(read_trials(results), which, results)
  if t.status ~= "completed" then
    P.usage(nil, "%s: trial %s is %s: only a completed trial can be reproduced (run its experiment to finish it)",
      t.path, tostring(t.trial_index), tostring(t.status))
  end
  local prov = t.provenance or {}
  if not prov.experiment_source or prov.experiment_source == "" then
    P.usage(nil, "%s: this trial file does not hold its experiment's text (written by %s, before `reproduce` existed): "
      .. "run its experiment file again with --trial %s instead", t.path, tostring(t.created_by), tostring(t.trial_index))
  end
  return t.path, prov.experiment_source, prov.experiment_file or "experiment.lua"
end

-- series that measure the machine, not the training: never compared
local MACHINE_SERIES = { "elapsed_s", "tokens_per_s", "rss_mib" }
-- what shapes the numbers: named when a reproduction is not bit-identical
local BUILD_FIELDS = { "gemmarun_version", "git_commit", "compiler", "blas", "hdf5", "lua", "cpu", "threads", "device",
  "compute_dtype" }

--- Reruns the stored trial at `opts.path` from `e` (its experiment, evaluated from the stored
--- text) with the stored --set overrides (then opts.set), on the stored thread count unless
--- opts.threads, into <results>/<name>/reproduce/. The model files' and the tokenized data's
--- sha256 are checked against the stored ones before any training (a usage error naming what
--- differs, nothing run). Prints whether the result is bit-identical or how far it moved;
--- returns 0 when bit-identical, 1 when not (or the trial failed).
--- `gemmarun export RESULTS [--trial ID | --best] [--format peft|gguf|merged] [--dtype T] [--base MODEL] OUT`:
--- writes a completed trial's adapter for other tools (a PEFT folder or a llama.cpp GGUF file), or
--- the base with it merged in (a Hugging Face folder, or a GGUF file when OUT ends in .gguf). opts:
--- results, out, trial, best, format, dtype, base, threads. The trial: --trial's, the report's best (report.best_trial) with --best, else the
--- only one. The base model: the trial's own (its config.model) unless --base names another copy
--- of it; the adapter's shapes are checked against it. Returns the exit code (usage errors raise).
function R.export(opts)
  local found = read_trials(opts.results)
  local t
  if opts.best then
    if opts.trial then P.usage(nil, "give --best or --trial, not both (--best picks the trial by the report's metric)") end
    local spec
    for _, x in ipairs(found) do
      if type(x.report) == "table" and next(x.report) ~= nil then spec = x.report; break end
    end
    local report = gm_module("report")
    local why
    t, why = report.best_trial(found, spec or report.default_spec(found))
    if not t then P.usage(nil, "%s: --best: %s", opts.results, why) end
    say("%s", why)
  else
    t = pick_trial(found, opts.trial, opts.results)
  end
  if t.status ~= "completed" then
    local ckpt = t.path:gsub("%.h5$", ".ckpt.h5")
    P.usage(nil, "%s: trial %s is %s and has no final adapter (a trial stores it when it completes)%s", t.path,
      tostring(t.trial_index), tostring(t.status), gm.file_exists(ckpt) and ("; its checkpoint " .. ckpt .. " holds the "
      .. "latest one: run the experiment again to finish the trial, or read it in Lua with m:save_adapter(OUT, {adapter = "
      .. "CHECKPOINT})") or "")
  end
  -- an OUT that holds trial files would hide them behind the export (a PEFT folder is read first)
  if gm.is_dir(opts.out) and #gm.results_list(opts.out) > 0 then
    P.usage(nil, "%s holds trial files: export into a folder of its own", opts.out)
  end
  local fmt = opts.format or "peft"
  if fmt ~= "peft" and fmt ~= "gguf" and fmt ~= "merged" then
    P.usage(nil, "--format %s: unknown format (known: peft, a PEFT adapter folder; gguf, a llama.cpp adapter file; merged, "
      .. "the model with the adapter merged in)", tostring(fmt))
  end
  if fmt == "gguf" and not opts.out:lower():match("%.gguf$") then
    P.usage(nil, "--format gguf writes one file: give OUT as a .gguf file name (got %s)", opts.out)
  end
  local gguf_out = fmt == "merged" and opts.out:lower():match("%.gguf$") ~= nil
  local dtypes = fmt ~= "merged" and {} or gguf_out and { f16 = 1, f32 = 1, bf16 = 1, q8_0 = 1 } or { bf16 = 1, f32 = 1 }
  if opts.dtype and fmt ~= "merged" then
    P.usage(nil, "--dtype is for --format merged (an adapter is written in f32, as PEFT and llama.cpp's converter write it)")
  elseif opts.dtype and not dtypes[opts.dtype] then
    P.usage(nil, "--dtype %s: a merged %s takes %s%s", opts.dtype, gguf_out and "GGUF" or "Hugging Face folder",
      gguf_out and "f16 (the default), f32, bf16 or q8_0" or "bf16 (the default) or f32",
      (not gguf_out and opts.dtype == "f16") and " (Gemma's activations overflow in float16: transformers, which computes in "
        .. "the config's dtype, would give NaN logits)" or "")
  end
  if opts.base == "" then P.usage(nil, "--base: give a model path or name") end
  local model = opts.base or (t.config or {}).model
  if type(model) ~= "string" or model == "" then
    P.usage(nil, "%s: the trial does not name its base model: give it with --base MODEL", t.path)
  end
  local ok, m = pcall(gm.load_model, model, { threads = opts.threads })
  if not ok and opts.base then
    P.usage(nil, "--base %s cannot be loaded: %s", model, clean_msg(m))
  elseif not ok then
    P.usage(nil, "trial %s was trained on %s, which cannot be loaded from here: %s\n  hint: give the base model with --base MODEL",
      tostring(t.trial_index), model, clean_msg(m))
  end
  local base = gm.hub_id(t.config.model) or t.config.model
  if fmt == "merged" then
    local t0 = gm.clock()
    local ok2, info = pcall(m.save_merged, m, opts.out, { adapter = t.path, format = gguf_out and "gguf" or "hf", dtype = opts.dtype })
    m:close()
    if not ok2 then P.usage(nil, "%s", clean_msg(info)) end
    say("merged trial %s (%s) of %s with its base %s (kept as it is): %d of %d weights carry the adapter%s%s; %s, %s in %s",
      tostring(t.trial_index), tostring(t.trial_id), opts.results, model, info.merged, info.tensors,
      info.tower_merged > 0 and string.format(" (%d of the vision tower's)", info.tower_merged) or "",
      info.projector and ", the projector is the trained one" or "", info.dtype, fmt_bytes(info.bytes), fmt_time(gm.clock() - t0))
    if gguf_out then
      say("  written: %s (metadata and tokenizer from the base)", opts.out)
      say("  with llama.cpp: llama-cli -m %s", opts.out)
    else
      say("  written: %s/model.safetensors, config.json, generation_config.json; tokenizer: %s", opts.out, info.tokenizer)
      say("  in Python: %s.from_pretrained(\"%s\")%s", info.multimodal and "Gemma3ForConditionalGeneration" or "AutoModelForCausalLM",
        opts.out, info.multimodal and " (the whole multimodal model: the vision tower and projector are in it)" or "")
    end
    return 0
  end
  local ok2, info = pcall(m.save_adapter, m, opts.out, { adapter = t.path, base_model = base, format = fmt })
  local okc, mcfg = pcall(m.config, m)
  local g4 = okc and mcfg.arch == "gemma4"
  m:close()
  if not ok2 then P.usage(nil, "%s", clean_msg(info)) end
  local what = string.format("exported trial %s (%s) of %s: %d LoRA modules%s%s%s, rank %d, alpha %g%s", tostring(t.trial_index),
    tostring(t.trial_id), opts.results, info.modules + info.vision_modules + info.audio_modules,
    info.vision_modules > 0 and string.format(" (%d on the vision tower)", info.vision_modules) or "",
    info.audio_modules > 0 and string.format(" (%d on the audio encoder)", info.audio_modules) or "",
    info.projector and " and the trained projector (modules_to_save)" or "", info.rank, info.alpha,
    info.rslora and " (rsLoRA)" or "")
  if fmt == "gguf" then
    say("%s, as a llama.cpp LoRA adapter: %s", what, opts.out)
    say("  with llama.cpp: llama-cli -m BASE.gguf --lora %s  (BASE: the GGUF of %s)", opts.out, base)
  else
    say("%s, as a PEFT adapter: %s/adapter_config.json, %s/adapter_model.safetensors", what, opts.out, opts.out)
    say("  in Python: PeftModel.from_pretrained(%s.from_pretrained(\"%s\"), \"%s\")",
      info.audio_modules > 0 and (g4 and "Gemma4ForConditionalGeneration" or "Gemma3nForConditionalGeneration")
        or (info.vision_modules > 0 or info.projector) and (g4 and "Gemma4ForConditionalGeneration" or "Gemma3ForConditionalGeneration")
        or "AutoModelForCausalLM", base, opts.out)
  end
  return 0
end

function R.reproduce(e, opts)
  local stored = gm.results_read(opts.path)
  local prov = stored.provenance or {}
  local sets = {}
  local ok_json, prior_sets = pcall(gm.json_decode, prov.set_overrides_json or "[]")
  for _, x in ipairs(ok_json and type(prior_sets) == "table" and prior_sets or {}) do sets[#sets + 1] = x end
  for _, x in ipairs(opts.set or {}) do sets[#sets + 1] = x end
  if not opts.threads and e.threads == nil and tonumber(prov.threads) then GM_THREADS = math.tointeger(tonumber(prov.threads)) end
  say("reproducing trial %s (%s) of %s from %s", tostring(stored.trial_index), stored.trial_id, opts.path,
    prov.experiment_file or "its stored experiment")
  local function select(trials)
    for _, t in ipairs(trials) do if t.id == stored.trial_id then return t end end
    -- not there: the experiment evaluates to other configs now (it reads the environment, or
    -- --set differs); name the fields that moved in the trial at the same position
    local same = trials[tonumber(stored.trial_index) or 0]
    local moved = {}
    if same then
      local want = stored.config or {}
      for k, v in pairs(same.config) do
        if want[k] ~= nil and gm.json_encode(want[k]) ~= gm.json_encode(v) then
          moved[#moved + 1] = string.format("%s = %s (stored %s)", k, gm.json_encode(v), gm.json_encode(want[k]))
        end
      end
      table.sort(moved)
    end
    P.usage(nil, "%s: the stored experiment no longer gives trial %s%s; set the environment (env()) and --set as when "
      .. "it ran", opts.path, stored.trial_id, #moved > 0 and (": now " .. table.concat(moved, ", ")) or "")
  end
  local function check_identity(p, d)
    local diffs = {}
    if prov.model_sha256 and p.model_sha256 ~= prov.model_sha256 then
      diffs[#diffs + 1] = string.format("the model files (%s): sha256 %s... stored, %s... now", p.model_path,
        prov.model_sha256:sub(1, 12), p.model_sha256:sub(1, 12))
    end
    if (prov.model_adapter_sha256 or p.model_adapter_sha256) and p.model_adapter_sha256 ~= prov.model_adapter_sha256 then
      diffs[#diffs + 1] = string.format("the adapter it started from (%s): sha256 %s... stored, %s... now", tostring(p.model_adapter),
        tostring(prov.model_adapter_sha256 or "none"):sub(1, 12), tostring(p.model_adapter_sha256 or "none"):sub(1, 12))
    end
    for _, split in ipairs({ "train", "test", "validation" }) do
      local k = "data_" .. split .. "_sha256"
      if (prov[k] or p[k]) and p[k] ~= prov[k] then
        local ds = ({ train = d.train, test = d.test, validation = d.val })[split]
        local n_was = stored.data and stored.data["n_" .. split]
        diffs[#diffs + 1] = string.format("the %s data (as tokenized): sha256 %s... stored, %s... now (%s examples stored, %s now)",
          split == "train" and "training" or split, tostring(prov[k] or "none"):sub(1, 12), tostring(p[k] or "none"):sub(1, 12),
          tostring(n_was or "?"), ds and tostring(ds:stats().n) or "none")
      end
    end
    if #diffs == 0 and prov.data_sha256 and p.data_sha256 ~= prov.data_sha256 then
      diffs[#diffs + 1] = string.format("the data (as tokenized): sha256 %s... stored, %s... now", prov.data_sha256:sub(1, 12),
        p.data_sha256:sub(1, 12))
    end
    if #diffs > 0 then
      P.usage(nil, "%s: cannot reproduce: %s differ%s from what the trial ran on; nothing was run (restore them, or run "
        .. "the experiment again to get a new trial)", opts.path, table.concat(diffs, "; "), #diffs == 1 and "s" or "")
    end
  end
  local rc = R.run(e, {
    set = sets, select = select, check_identity = check_identity, fresh = true, no_render = true,
    dir = function(ex) return (ex.results or "results") .. "/" .. ex.name .. "/reproduce" end,
  })
  local new = (e.results or "results") .. "/" .. e.name .. "/reproduce/trial-" .. stored.trial_id .. ".h5"
  if rc ~= 0 or not gm.file_exists(new) then
    say("the reproduction did not complete (above): nothing to compare")
    return 1
  end
  local again = gm.results_read(new)
  local diff = gm.results_compare(opts.path, new, { skip = MACHINE_SERIES })
  if diff.compared == 0 then
    say("nothing to compare: %s holds no series, evaluation or adapter", opts.path)
    return 1
  end
  -- the final evaluation's metric as text (accuracy, else loss), and its name
  local metric_name = (stored.eval and stored.eval.final or {}).accuracy and "accuracy" or "loss"
  local function final_of(t)
    local f = t.eval and t.eval.final or {}
    local v = f[metric_name]
    if not v then return "?" end
    return metric_name == "accuracy" and string.format("%.4f%%", 100 * v) or string.format("%.6f", v)
  end
  local steps = stored.metrics and stored.metrics.step and #stored.metrics.step or 0
  if diff.differ == 0 then
    say("bit-identical: every logged series (%d steps), every evaluation (%s) and the adapter: %d datasets, %d values, "
      .. "no difference (%s)", steps, metric_name .. " " .. final_of(again), diff.compared, diff.values, new)
    return 0
  end
  local changed = {}
  local was, now = stored.provenance or {}, again.provenance or {}
  for _, k in ipairs(BUILD_FIELDS) do
    if was[k] ~= now[k] then changed[#changed + 1] = string.format("%s %s then, %s now", k, tostring(was[k]), tostring(now[k])) end
  end
  say("NOT bit-identical: %d of %d datasets differ, the largest |difference| %.3g in %s; final %s %s then, %s now; %s (%s)",
    diff.differ, diff.compared, diff.max_abs, diff.worst, metric_name, final_of(stored), final_of(again),
    #changed > 0 and ("what differs from when it ran: " .. table.concat(changed, "; "))
      or "the same build, threads and device: this is a determinism bug, please report it", new)
  return 1
end

return R

-- report.lua: paper-style tables and plots from trial results (embedded; gm_module("report")).
-- Over 1,500 lines on purpose: the tables, the plots and the page share one model of the cells
-- (in_order, settings, collect_cells), which splitting the file would have to export.
--
--   local report = gm_module("report")
--   local tables = report.render(trials, spec)   -- {text=, md=, tex=, csv=}
--   report.write(dir, name, tables)              -- <dir>/<name>.md, .tex, .csv (gm.write_text)
--   report.plots(trials, spec, dir, name)        -- <name>_loss.png, <name>_<metric>_vs_<col>.png,
--                                                   <name>_validation.png (with validation)
--   report.confusion_plots(trials, dir, name, best) -- <name>_confusion_<trial>_<phase>.png per
--                                                   trial and phase with a confusion matrix
--   report.html_page(trials, tables, plots, name, note) -- the self-contained one-page report
--   report.cli(trials, path, dir, name, is_dir)  -- what `gemmarun table PATH` runs (also
--                                                   writes <dir>/<name>.html)
--
-- `trials` is a list of tables as gm.results_read returns them: root attributes at the top
-- (trial_id, trial_index, status, reason, experiment, ...), plus config = {field = value},
-- eval = {[phase] = {accuracy=, loss=, n_examples=, labels=, per_class=, confusion=}},
-- metrics = {[name] = {v1, v2, ...}}, memory, data, report (decoded report_json), swept.
--
-- spec (the experiment's `report`, stored in every trial file as report_json):
--   rows        list of config fields, one table row per combination of their values
--   cols        list of config fields, one table column per combination (may be empty)
--   metric      "accuracy" (default) or any eval attribute ("loss", ...); when the phase has no
--               such attribute, the last finite value of the metric series of that name
--   phase       eval phase of the cells (default "final")
--   digits      decimals shown (default: 1 for percentages, else 3 significant digits)
--   percent     show x100 with "%" (default: true for metrics named *accuracy*)
--   better      "max" | "min": which cell is best (default "min" for *loss*, *perplexity*,
--               *error*, else "max")
--   baseline    false: no baseline row (default true when the phase "baseline" was evaluated)
--   baseline_by fields the model before fine-tuning depends on (default: those of quant,
--               max_length, model, prompt, task that are row or column fields): one baseline row
--               per combination of their row values, baseline cells per column only when a
--               column field is among them (else the same value in every column)
--   title       first line of the text/markdown table (default: experiment, metric, seeds)
--   kind, name  ignored (tags a runner may add)
--
-- Cells: mean ± sample standard deviation (n - 1) over the completed trials that share the row
-- and column values, i.e. over seeds; a single trial shows its value alone; "n/a" when no
-- completed trial has the combination; " (n=k)" when a cell has another number of trials than
-- most cells (the title gives that number).
-- Failed, running and interrupted trials are excluded from every mean and listed under the
-- table with their reasons. The best cell (highest mean, lowest for losses; ties on the shown
-- digits all count) is marked: **bold** in Markdown, \textbf in LaTeX, a trailing * in text,
-- best = 1 in CSV. CSV is long-form: one line per cell (kind, row fields, column fields,
-- metric, phase, mean, std, n, best, ci_low, ci_high, ci_method, p_vs_baseline, p_vs_best),
-- values in the table's units, full precision.
--
-- Uncertainty (see "uncertainty" below): a 95% interval [lo, hi] after the mean ± std (Student t
-- over >= 3 seeds, else a bootstrap over the test examples when the trials stored per-example
-- results), and paired significance marks: "†" differs from its baseline, "≈" does not differ
-- from the best (paired bootstrap, α = 0.05); the caption says which method each used.
--
-- Memory: when the trials recorded it (group `memory`: planned_total, measured_peak_rss), a
-- second grid with the same rows and columns gives each cell's planned peak and measured peak in
-- MiB and their difference (largest over the cell's completed trials); in LaTeX as comments, in
-- CSV as kind = "memory" lines (metric planned_peak_mib / measured_peak_mib, phase "train").

local report = {}

-- ---- values and keys ------------------------------------------------------------------------

local PCT = "%"

--- Short text of a config value: integers plainly, small/large floats as 5e-5, others %g.
local function fmt_val(v)
  if type(v) == "boolean" then return tostring(v) end
  if type(v) ~= "number" then return tostring(v) end
  if math.type(v) == "integer" then return tostring(v) end
  if v ~= v then return "nan" end
  if v == math.floor(v) and math.abs(v) < 1e15 then return string.format("%d", math.floor(v)) end
  local a = math.abs(v)
  if a < 1e-3 or a >= 1e6 then
    local m, e = string.format("%.3e", v):match("^(.-)e(.*)$")
    m = m:gsub("0+$", ""):gsub("%.$", "")
    return m .. "e" .. tostring(math.tointeger(tonumber(e)))
  end
  return string.format("%g", v)
end
report.fmt_val = fmt_val

--- Orders distinct values: numbers ascending, then booleans, then strings in first-seen order.
local function order_values(vals, seen)
  table.sort(vals, function(a, b)
    local ta, tb = type(a), type(b)
    if ta ~= tb then
      local rank = {number = 1, boolean = 2, string = 3}
      return (rank[ta] or 4) < (rank[tb] or 4)
    end
    if ta == "number" then return a < b end
    if ta == "boolean" then return (not a) and b end
    return seen[a] < seen[b]
  end)
  return vals
end

--- The trial's values of `fields` ("n/a" where its config lacks one).
local function values_of(t, fields)
  local vals = {}
  for i, f in ipairs(fields) do
    local v = t.config and t.config[f]
    if v == nil then v = "n/a" end
    vals[i] = v
  end
  return vals
end

--- Distinct value combinations of `fields` over trials, in table order; each is a list of
--- values. Returns combos and a key function (values -> string id).
local function combos(trials, fields)
  local function key_of(vals)
    local parts = {}
    for i = 1, #fields do parts[i] = type(vals[i]) .. ":" .. tostring(vals[i]) end
    return table.concat(parts, "\1")
  end
  -- distinct values per field, ordered
  local per = {}
  for i, f in ipairs(fields) do
    local list, seen, n = {}, {}, 0
    for _, t in ipairs(trials) do
      local v = t.config and t.config[f]
      if v == nil then v = "n/a" end
      if seen[v] == nil then n = n + 1; seen[v] = n; list[#list + 1] = v end
    end
    per[i] = order_values(list, seen)
  end
  -- combinations that occur, in the lexicographic order of the per-field orders
  local present = {}
  for _, t in ipairs(trials) do
    local vals = values_of(t, fields)
    present[key_of(vals)] = vals
  end
  local pos = {}
  for i = 1, #fields do
    pos[i] = {}
    for j, v in ipairs(per[i]) do pos[i][type(v) .. ":" .. tostring(v)] = j end
  end
  local out = {}
  for _, vals in pairs(present) do out[#out + 1] = vals end
  table.sort(out, function(a, b)
    for i = 1, #fields do
      local pa, pb = pos[i][type(a[i]) .. ":" .. tostring(a[i])], pos[i][type(b[i]) .. ":" .. tostring(b[i])]
      if pa ~= pb then return pa < pb end
    end
    return false
  end)
  if #fields == 0 then out = {{}} end
  return out, key_of
end

local function describe(fields, vals)
  local parts = {}
  for i, f in ipairs(fields) do parts[#parts + 1] = f .. "=" .. fmt_val(vals[i]) end
  return table.concat(parts, ", ")
end

-- ---- statistics -------------------------------------------------------------------------------

local function stats(xs)
  local n = #xs
  if n == 0 then return {n = 0} end
  local s = 0
  for _, x in ipairs(xs) do s = s + x end
  local mean = s / n
  local std
  if n > 1 then
    local q = 0
    for _, x in ipairs(xs) do q = q + (x - mean) ^ 2 end
    std = math.sqrt(q / (n - 1))
  end
  return {n = n, mean = mean, std = std}
end

--- The metric of a trial in a phase (eval attribute, else the last finite series value).
local function metric_of(t, metric, phase)
  local e = t.eval and t.eval[phase]
  local v = e and e[metric]
  if type(v) == "number" and v == v then return v end
  if phase == "final" and t.metrics and t.metrics[metric] then
    local s = t.metrics[metric]
    for i = #s, 1, -1 do
      if s[i] == s[i] then return s[i] end
    end
  end
  return nil
end

-- ---- the spec -----------------------------------------------------------------------------------

local SPEC_KEYS = {rows = "table", cols = "table", metric = "string", phase = "string",
                   digits = "number", percent = "boolean", better = "string", baseline = "boolean",
                   baseline_by = "table", title = "string", kind = "string", name = "string"}
local BASE_FIELDS = {quant = true, max_length = true, model = true, prompt = true, task = true, data = true,
                     labels = true, template = true, max_eval = true}

local function check_spec(spec)
  if type(spec) ~= "table" then error("report: spec must be a table {rows=, cols=, metric=}", 3) end
  for k, v in pairs(spec) do
    local want = SPEC_KEYS[k]
    if not want then
      local names = {}
      for name in pairs(SPEC_KEYS) do names[#names + 1] = name end
      table.sort(names)
      error(string.format("report: unknown spec key '%s' (allowed: %s)", tostring(k),
                          table.concat(names, ", ")), 3)
    end
    if type(v) ~= want and not (k == "digits" and v == "auto") then
      error(string.format("report: spec.%s must be a %s, got %s", k, want, type(v)), 3)
    end
  end
  if spec.better and spec.better ~= "max" and spec.better ~= "min" then
    error("report: spec.better must be 'max' or 'min'", 3)
  end
end

--- A default spec from the trials' swept fields: the last swept field (not seed) as columns,
--- the others as rows; accuracy if evaluated, else loss.
function report.default_spec(trials)
  local swept = {}
  for _, t in ipairs(trials) do
    if type(t.swept) == "table" and #t.swept > 0 then swept = t.swept; break end
  end
  local fields = {}
  for _, f in ipairs(swept) do if f ~= "seed" then fields[#fields + 1] = f end end
  local cols = {}
  if #fields > 0 then cols = {table.remove(fields)} end
  local metric = "loss"
  for _, t in ipairs(trials) do
    if t.eval and t.eval.final and t.eval.final.accuracy then metric = "accuracy"; break end
    if t.eval and t.eval.final and t.eval.final.word_error_rate then metric = "word_error_rate"; break end
  end
  return {rows = fields, cols = cols, metric = metric}
end

-- ---- rendering ----------------------------------------------------------------------------------

local function width(s) return utf8.len(s) or #s end

local function pad(s, w, right)
  local n = w - width(s)
  if n <= 0 then return s end
  return right and (string.rep(" ", n) .. s) or (s .. string.rep(" ", n))
end

local function md_escape(s) return (s:gsub("|", "\\|")) end

local TEX_SPECIAL = {["\\"] = "\\textbackslash{}", ["%"] = "\\%", ["&"] = "\\&", ["#"] = "\\#",
                     ["$"] = "\\$", ["_"] = "\\_", ["{"] = "\\{", ["}"] = "\\}",
                     ["~"] = "\\textasciitilde{}", ["^"] = "\\textasciicircum{}"}

local function tex_escape(s)
  s = s:gsub("[\\%%&#%$_{}~%^]", TEX_SPECIAL)
  return (s:gsub("±", "$\\pm$"):gsub("†", "$^{\\dagger}$"):gsub("≈", "$^{\\approx}$"))
end

local function csv_field(s)
  s = tostring(s)
  if s:find('[,"\n]') then return '"' .. s:gsub('"', '""') .. '"' end
  return s
end

local function csv_num(x)
  if x == nil then return "" end
  return string.format("%.6g", x)
end

--- The trials in sweep order (trial_index), so that string values keep the order the user
--- listed them in; a folder lists its files by name, which is another order.
--- The trials in trial order. Each is a shallow copy whose config also holds the identity of
--- what it ran on, from its provenance (model_sha256, data_sha256: the first 12 hex digits), so
--- that trials of another model file or other data are never pooled with these as seeds: they
--- differ in a field, and varying_fields splits them into rows of their own, with the note.
local IDENTITY = {"model_sha256", "data_sha256"}
local function in_order(trials)
  local out = {}
  for i, t in ipairs(trials) do
    local c = {}
    for k, v in pairs(t) do c[k] = v end
    if type(t.provenance) == "table" then
      local cfg = {}
      for k, v in pairs(t.config or {}) do cfg[k] = v end
      for _, f in ipairs(IDENTITY) do
        if type(t.provenance[f]) == "string" then cfg[f] = t.provenance[f]:sub(1, 12) end
      end
      c.config = cfg
    end
    out[i] = c
  end
  table.sort(out, function(a, b)
    local ia, ib = tonumber(a.trial_index) or 0, tonumber(b.trial_index) or 0
    if ia ~= ib then return ia < ib end
    return tostring(a.trial_id) < tostring(b.trial_id)
  end)
  return out
end

--- Config fields (other than seed and the given rows/cols) whose values differ among the trials,
--- sorted: a field edited between two runs of one experiment, or swept but not named in the
--- report. Pooling such trials in one cell would present different settings as seeds.
local function varying_fields(trials, rows, cols)
  local skip = {seed = true}
  for _, f in ipairs(rows) do skip[f] = true end
  for _, f in ipairs(cols) do skip[f] = true end
  local keys = {}
  for _, t in ipairs(trials) do
    for k in pairs(t.config or {}) do if not skip[k] then keys[k] = true end end
  end
  local out = {}
  for k in pairs(keys) do
    local seen, n = {}, 0
    for _, t in ipairs(trials) do
      local v = t.config and t.config[k]
      local id = v == nil and "nil" or (type(v) .. ":" .. tostring(v))
      if not seen[id] then seen[id] = true; n = n + 1 end
    end
    if n > 1 then out[#out + 1] = k end
  end
  table.sort(out)
  return out
end

-- report.render builds a table model `m` in named steps, then writes it four ways. Each step
-- reads fields of `m` that earlier steps set and returns new ones; render() stores them in `m`.

local BASE_LABEL = "baseline (no fine-tuning)"
-- trials that started from an adapter (experiment.model_adapter): their baseline is that adapter
local BASE_LABEL_ADAPTER = "baseline (model_adapter)"

--- The baseline rows' label for these trials.
local function base_label(trials)
  for _, t in ipairs(trials or {}) do
    if type(t.config) == "table" and t.config.model_adapter then return BASE_LABEL_ADAPTER end
  end
  return BASE_LABEL
end
local MEM_TITLE = "Peak memory (MiB): planned / measured (measured vs planned), largest over the cell's trials"
local MIB = 1048576

--- Settings: takes the ordered trials and the spec; returns m with the row fields (those of the
--- spec plus the fields the trials differ in that it does not name), cols, split_note, metric,
--- phase, better, percent, scale, label and all_fields (rows then cols).
local function settings(trials, spec)
  -- a trial stored before an option existed ran at its default: say so, rather than split rows
  -- between "n/a" and the default (prelude's LATER_OPTIONS)
  local later = GM_PRELUDE and GM_PRELUDE.LATER_OPTIONS or {}
  for _, t in ipairs(trials) do
    if type(t.config) == "table" then
      for k, v in pairs(later) do if t.config[k] == nil then t.config[k] = v end end
    end
  end
  local m = {trials = trials}
  m.rows = {}
  for _, f in ipairs(spec.rows or {}) do m.rows[#m.rows + 1] = f end
  m.cols = spec.cols or {}
  -- trials that differ in a field the report does not show get rows of their own
  local split = varying_fields(trials, m.rows, m.cols)
  for _, f in ipairs(split) do m.rows[#m.rows + 1] = f end
  m.split_note = #split > 0 and ("Rows also split by " .. table.concat(split, ", ") ..
    ": the trials differ in " .. (#split > 1 and "these fields" or "this field") ..
    ", which the report's rows and columns do not name (never pooled as seeds)") or nil
  -- a spec without a metric: the trials' own (accuracy for classifiers, loss for sft, ...)
  m.metric = spec.metric or report.default_spec(trials).metric
  m.phase = spec.phase or "final"
  local lower = m.metric:find("loss") or m.metric:find("perplexity") or m.metric:find("error")
  m.better = spec.better or (lower and "min" or "max")
  m.percent = spec.percent
  if m.percent == nil then m.percent = m.metric:find("accuracy") ~= nil or m.metric:find("error_rate") ~= nil end
  m.scale = m.percent and 100 or 1
  m.label = m.metric .. (m.percent and " (" .. PCT .. ")" or "")
  m.all_fields = {}
  for _, f in ipairs(m.rows) do m.all_fields[#m.all_fields + 1] = f end
  for _, f in ipairs(m.cols) do m.all_fields[#m.all_fields + 1] = f end
  return m
end

--- Cells: takes m's trials and fields; returns the completed trials (done) and the others
--- (excluded), the row and column combinations with their key functions (over every trial, so
--- that a combination whose trials all failed still gets its row, with n/a), cells[i][j] (the
--- stats of the metric over the completed trials of row i, column j) and all_stats (the
--- non-empty cells, row by row).
local function collect_cells(m)
  local done, excluded = {}, {}
  for _, t in ipairs(m.trials) do
    if t.status == "completed" then done[#done + 1] = t else excluded[#excluded + 1] = t end
  end
  local row_combos, row_key = combos(m.trials, m.rows)
  local col_combos, col_key = combos(m.trials, m.cols)
  local buckets, members = {}, {}
  for _, t in ipairs(done) do
    local v = metric_of(t, m.metric, m.phase)
    if v then
      local k = row_key(values_of(t, m.rows)) .. "\2" .. col_key(values_of(t, m.cols))
      buckets[k], members[k] = buckets[k] or {}, members[k] or {}
      table.insert(buckets[k], v * m.scale)
      table.insert(members[k], t)
    end
  end
  local cells, all_stats = {}, {}
  for i, rv in ipairs(row_combos) do
    cells[i] = {}
    for j, cv in ipairs(col_combos) do
      local k = row_key(rv) .. "\2" .. col_key(cv)
      local s = stats(buckets[k] or {})
      s.trials = members[k] or {}
      cells[i][j] = s
      if s.n > 0 then all_stats[#all_stats + 1] = s end
    end
  end
  return done, excluded, row_combos, row_key, col_combos, col_key, cells, all_stats
end

--- Baseline rows: takes m (after collect_cells) and the spec; returns the list of baseline rows
--- {fields, vals, cells = {stats per column}}, one per combination of the row fields the model
--- before fine-tuning depends on (spec.baseline_by, else BASE_FIELDS); empty when the spec
--- turns the baseline off or no completed trial has a baseline value.
local function baseline_rows(m, spec)
  local base_rows = {}
  local want_base = spec.baseline
  if want_base == nil then
    want_base = false
    for _, t in ipairs(m.done) do
      if metric_of(t, m.metric, "baseline") then want_base = true; break end
    end
  end
  if not want_base then return base_rows end
  local by = spec.baseline_by
  if not by then
    by = {}
    for _, f in ipairs(m.all_fields) do if BASE_FIELDS[f] then by[#by + 1] = f end end
  end
  local is_by = {}
  for _, f in ipairs(by) do is_by[f] = true end
  local brow_fields, bcol_fields = {}, {}
  for _, f in ipairs(m.rows) do if is_by[f] then brow_fields[#brow_fields + 1] = f end end
  for _, f in ipairs(m.cols) do if is_by[f] then bcol_fields[#bcol_fields + 1] = f end end
  local bcombos, bkey = combos(m.done, brow_fields)
  local _, bckey = combos(m.done, bcol_fields)
  for _, bv in ipairs(bcombos) do
    local br = {fields = brow_fields, vals = bv, cells = {}}
    for j, cv in ipairs(m.col_combos) do
      -- the column's values of the baseline fields among the column fields
      local cvals = {}
      for ci, f in ipairs(m.cols) do
        if is_by[f] then cvals[#cvals + 1] = cv[ci] end
      end
      local xs, ts = {}, {}
      for _, t in ipairs(m.done) do
        if bkey(values_of(t, brow_fields)) == bkey(bv) and bckey(values_of(t, bcol_fields)) == bckey(cvals) then
          local v = metric_of(t, m.metric, "baseline")
          if v then xs[#xs + 1], ts[#ts + 1] = v * m.scale, t end
        end
      end
      br.cells[j] = stats(xs)
      br.cells[j].trials, br.cells[j].base = ts, true
    end
    base_rows[#base_rows + 1] = br
  end
  return base_rows
end

--- Number format: takes m (percent, all_stats) and the spec; returns num(x), the cell number
--- as text with the spec's digits (default: 1 for percentages, else 3 significant digits of
--- the largest mean).
local function number_format(m, spec)
  local digits = spec.digits
  if digits == nil or digits == "auto" then
    if m.percent then
      digits = 1
    else
      local mx = 0
      for _, s in ipairs(m.all_stats) do mx = math.max(mx, math.abs(s.mean)) end
      digits = mx > 0 and math.max(0, math.min(4, 2 - math.floor(math.log(mx, 10)))) or 3
    end
  end
  digits = math.tointeger(digits) or math.floor(digits)
  local numfmt = "%." .. digits .. "f"
  return function(x) return string.format(numfmt, x) end
end

--- Typical count: takes all_stats; returns the most common number of trials per cell (seeds;
--- the larger on a tie, 0 without cells). Cells with fewer say so.
local function typical_count(all_stats)
  local count = {}
  for _, s in ipairs(all_stats) do count[s.n] = (count[s.n] or 0) + 1 end
  local mode_n, best_count = 0, -1
  for n, c in pairs(count) do
    if c > best_count or (c == best_count and n > mode_n) then mode_n, best_count = n, c end
  end
  return mode_n
end

--- The best: takes m (all_stats, better, num); returns the best mean on the shown digits (nil
--- without cells) and is_best(stats) (ties on the shown digits all count).
local function choose_best(m)
  local best_val
  for _, s in ipairs(m.all_stats) do
    local r = tonumber(m.num(s.mean))
    if best_val == nil or (m.better == "max" and r > best_val) or (m.better == "min" and r < best_val) then
      best_val = r
    end
  end
  local function is_best(s) return s.n > 0 and tonumber(m.num(s.mean)) == best_val end
  return best_val, is_best
end

-- ---- uncertainty -----------------------------------------------------------------------------
-- Each cell gets a 95% interval and each fine-tuned cell two paired tests (issue 14, part 2):
--   interval   fine-tuned cells with >= 3 trials: Student t over them (mean ± t95(n-1) s/√n,
--              the spread of seeds; cut to [0, 100%] for accuracies); otherwise, when the trials stored their per-example
--              results: the percentile bootstrap over the test examples of the cell's
--              accuracy (each example scored by the fraction of the cell's trials that got it
--              right), the test set's own sampling; baseline rows always the latter (the model
--              before fine-tuning does not depend on the seed)
--   tests      paired bootstrap over the same test examples (core/stats/gm_stats.h), two-sided,
--              α = 0.05: the cell against its own trials' baseline evaluation (mark †: differs)
--              and against the best cell (mark ≈: does not differ from the best)
-- Per-example results exist for accuracy (predictions and references, runner.lua's
-- eval_classify) and for the word and phone error rates (each example's edit count and
-- reference length, eval_transcribe: a rate is a ratio of sums, resampled as one, Koehn 2004);
-- other metrics get the t interval only, and no tests.
local ALPHA = 0.05
-- metric -> the per-example lists that score it: {errors, reference lengths} for a rate; true:
-- a classifier's predictions and references
local PER_EXAMPLE = {accuracy = true, word_error_rate = {"example_word_errors", "example_words"},
  phone_error_rate = {"example_phone_errors", "example_phones"}}

--- Per-example scores of `trials` in `phase` for `metric`: a[i] = fraction of the trials right on
--- example i (accuracy) or their mean edit count on it (an error rate, with w[i] its reference
--- length: the rate is sum(a) / sum(w)), and the examples' identity (their test-set positions as
--- one string); nil when a trial did not store the lists or the trials scored different examples.
local function example_scores(trials, phase, bad, metric)
  local lists = PER_EXAMPLE[metric or "accuracy"]
  local key, sum, w
  for _, t in ipairs(trials) do
    local e = t.eval and t.eval[phase]
    if not (e and e.example_index and #e.example_index > 0) then return nil end
    local num, den
    if lists == true then
      if not (e.predictions and e.references) then return nil end
    else
      num, den = e[lists[1]], e[lists[2]]
      if not (num and den) then return nil end
    end
    -- lists that contradict the stored value, or score an example twice, are not used (a
    -- hand-written or damaged file): `bad` collects the trial for the note under the table
    local right, errs, words, seen, dup = 0, 0, 0, {}, false
    for i = 1, #e.example_index do
      if lists == true then right = right + (e.predictions[i] == e.references[i] and 1 or 0)
      else errs, words = errs + num[i], words + den[i] end
      dup = dup or seen[e.example_index[i]] ~= nil
      seen[e.example_index[i]] = true
    end
    local stored = e[metric or "accuracy"]
    local value = lists == true and right / #e.example_index or (words > 0 and errs / words or nil)
    if dup or not value or (type(stored) == "number" and math.abs(value - stored) > 1e-9) then
      if bad then bad[tostring(t.trial_id or t.trial_index)] = true end
      return nil
    end
    local k = table.concat(e.example_index, ",")
    if key and k ~= key then return nil end
    key, sum = k, sum or {}
    for i = 1, #e.example_index do
      if lists == true then
        sum[i] = (sum[i] or 0) + (e.predictions[i] == e.references[i] and 1 or 0)
      else
        -- the same references (the same example's length) in every trial; a resampled rate
        -- needs every length > 0
        if den[i] <= 0 or (w and w[i] ~= den[i]) then return nil end
        sum[i] = (sum[i] or 0) + num[i]
      end
    end
    if lists ~= true and not w then
      w = {}
      for i = 1, #den do w[i] = den[i] end
    end
  end
  if not sum then return nil end
  for i = 1, #sum do sum[i] = sum[i] / #trials end
  return sum, key, w
end

--- Uncertainty: takes m (cells, base_rows, is_best); sets on every cell's stats ci = {lo, hi,
--- method = "t" | "bootstrap"} and on fine-tuned cells p_base / p_best (nil where untested);
--- returns the methods used ({t = true, bootstrap = true}), whether any test ran, and the
--- number of test examples the scores have (nil when cells differ).
local function uncertainty(m)
  local used, tested, n_ex, n_ex_mixed = {}, false, nil, false
  local per_example = PER_EXAMPLE[m.metric]
  m.bad_lists = {}
  -- a cell's scores are needed for its interval and for each test it takes part in: once each
  local cache = {}
  local function scores(s, phase)
    if not per_example or s.n == 0 then return nil end
    local c = cache[s]
    if not c then
      local a, key, w = example_scores(s.trials, phase, m.bad_lists, m.metric)
      if a then
        if n_ex and n_ex ~= #a then n_ex_mixed = true end
        n_ex = n_ex or #a
      end
      c = {a, key, w}
      cache[s] = c
    end
    return c[1], c[2], c[3]
  end
  local function interval(s, phase)
    if s.n == 0 then return end
    if not s.base and s.n >= 3 then
      local h = gm.t95(s.n - 1) * s.std / math.sqrt(s.n)
      s.ci = {lo = s.mean - h, hi = s.mean + h, method = "t"}
      -- an accuracy lies in [0, 1]: the t interval is cut to it (a wide interval of 3 seeds
      -- near 0 would otherwise reach below it)
      if m.metric:find("accuracy") then s.ci.lo, s.ci.hi = math.max(0, s.ci.lo), math.min(m.scale, s.ci.hi) end
    else
      local a, _, w = scores(s, phase)
      if not a then return end
      local lo, hi = gm.bootstrap_mean(a, w and { weights = w } or nil)
      s.ci = {lo = lo * m.scale, hi = hi * m.scale, method = "bootstrap"}
    end
    used[s.ci.method] = true
  end
  for _, br in ipairs(m.base_rows) do
    for _, s in ipairs(br.cells) do interval(s, "baseline") end
  end
  local best
  for i = 1, #m.row_combos do
    for j = 1, #m.col_combos do
      local s = m.cells[i][j]
      interval(s, m.phase)
      if not best and m.is_best(s) then best = s end
    end
  end
  local best_a, best_key
  if best then best_a, best_key = scores(best, m.phase) end
  for i = 1, #m.row_combos do
    for j = 1, #m.col_combos do
      local s = m.cells[i][j]
      local a, key, w = scores(s, m.phase)
      if a then
        -- the same references on both sides of a test (the same lengths): a rate's weights
        local wo = w and { weights = w } or nil
        local b, bkey = example_scores(s.trials, "baseline", m.bad_lists, m.metric)
        if b and bkey == key then s.p_base = gm.paired_bootstrap(a, b, wo); tested = true end
        if best_a and s ~= best and best_key == key then s.p_best = gm.paired_bootstrap(a, best_a, wo); tested = true end
      end
    end
  end
  return used, tested, (not n_ex_mixed) and n_ex or nil
end

--- The marks after a fine-tuned cell: "*" best, "≈" not significantly different from the best,
--- "†" significantly different from its baseline.
local function marks(m, s)
  if not s or s.n == 0 then return "" end
  local t = ""
  if m.is_best(s) then t = "*" elseif s.p_best and s.p_best >= ALPHA then t = "≈" end
  if s.p_base and s.p_base < ALPHA then t = t .. "†" end
  return t
end

--- Caption lines for the intervals and tests actually shown.
local function uncertainty_notes(m)
  local out = {}
  local ex = m.n_test and ("the " .. m.n_test .. " test examples") or "the test examples"
  local ways = {}
  if m.ci_used.t then ways[#ways + 1] = "Student t over the seeds (fine-tuned cells with 3 or more)" end
  if m.ci_used.bootstrap then
    local scored = type(PER_EXAMPLE[m.metric]) == "table"
      and "the rate resampled as a ratio of sums: each example's edit count, averaged over the cell's seeds, over its reference length"
      or "each example scored by the fraction of the cell's seeds right on it"
    ways[#ways + 1] = "percentile bootstrap over " .. ex .. " (" .. (m.ci_used.t and "the other cells; " or "") ..
      "10,000 resamples, " .. scored .. ")"
  end
  if #ways > 0 then out[#out + 1] = "[a, b]: 95% interval, " .. table.concat(ways, "; ") end
  if m.tested then
    out[#out + 1] = "† differs from its baseline, ≈ does not differ from the best: paired bootstrap over " ..
      ex .. ", two-sided, α = " .. ALPHA
  end
  local bad = {}
  for id in pairs(m.bad_lists or {}) do bad[#bad + 1] = id end
  table.sort(bad)
  if #bad > 0 then
    out[#out + 1] = "per-example results not used (they disagree with the stored " .. (type(PER_EXAMPLE[m.metric]) == "table" and m.metric or "accuracy") ..
      " or list an example twice) in trial" ..
      (#bad > 1 and "s " or " ") .. table.concat(bad, ", ") .. ": no bootstrap interval or test where they take part"
  end
  return out
end

--- Cell text: takes m (num, mode_n) and a cell's stats; returns "mean ± std [lo, hi]" (the
--- interval when there is one), with " (n=k)" when the cell has another number of trials
--- than most (a baseline cell: fewer), or "n/a".
local function cell_text(m, s)
  if s.n == 0 then return "n/a" end
  local t = m.num(s.mean)
  if s.std then t = t .. " ± " .. m.num(s.std) end
  if s.ci then t = t .. " [" .. m.num(s.ci.lo) .. ", " .. m.num(s.ci.hi) .. "]" end
  -- baseline cells pool every trial's evaluation of the same base model: only fewer is news
  if s.n < m.mode_n or (s.n > m.mode_n and not s.base) then t = t .. " (n=" .. s.n .. ")" end
  return t
end

--- Row labels: takes m and a row combination; returns the row's label cells.
local function row_labels(m, rv)
  if #m.rows == 0 then return {"fine-tuned"} end
  local out = {}
  for i = 1, #m.rows do out[i] = fmt_val(rv[i]) end
  return out
end

--- The title: takes m and the spec; returns the title line (spec.title, else experiment,
--- metric, phase and what the cells pool) and `shown` (set of the row and column fields).
local function title_of(m, spec)
  local experiment = (m.trials[1] and m.trials[1].experiment) or "results"
  -- "seeds" when the cells pool nothing but seeds (every swept field is a row or column field)
  local pooled = "seeds"
  local shown = {}
  for _, f in ipairs(m.all_fields) do shown[f] = true end
  for _, t in ipairs(m.trials) do
    for _, f in ipairs(type(t.swept) == "table" and t.swept or {}) do
      if f ~= "seed" and not shown[f] then pooled = "trials" end
    end
  end
  local seeds = m.mode_n == 0 and "no completed trial" or m.mode_n == 1 and ("single " .. pooled:sub(1, -2))
    or ("mean ± std over " .. m.mode_n .. " " .. pooled)
  if m.mode_n > 0 and next(m.ci_used) then seeds = seeds .. " [95% interval]" end
  return spec.title or string.format("%s: %s, %s eval, %s", experiment, m.label, m.phase, seeds), shown
end

--- Footnotes: takes m (excluded, all_fields, shown); returns the heading of the excluded
--- trials (nil when there are none) and one line per excluded trial with its reason.
local function excluded_notes(m)
  local notes = {}
  for _, t in ipairs(m.excluded) do
    local what = t.status == "failed" and "failed" or ("not finished (" .. tostring(t.status) .. ")")
    local cfg = describe(m.all_fields, values_of(t, m.all_fields))
    local seed = t.config and t.config.seed
    if seed ~= nil and not m.shown.seed then cfg = cfg .. (cfg ~= "" and ", " or "") .. "seed=" .. fmt_val(seed) end
    local why = (t.reason and t.reason ~= "") and (": " .. t.reason:gsub("%s+", " ")) or ""
    notes[#notes + 1] = string.format("%s: trial %s (%s)%s", what, tostring(t.trial_id or t.trial_index), cfg, why)
  end
  local n = #m.excluded
  return n > 0 and ("Excluded from the means (" .. n .. " trial" .. (n > 1 and "s" or "") .. ")") or nil, notes
end

--- Memory cells: takes m (after collect_cells); returns mem_cells[i][j] = {n, planned,
--- measured} (the plan's total and the measured peak, largest over the cell's completed
--- trials; issue 5.3) and whether any trial recorded memory.
local function memory_cells(m)
  local mem_cells, any_mem = {}, false
  for i, rv in ipairs(m.row_combos) do
    mem_cells[i] = {}
    for j, cv in ipairs(m.col_combos) do
      local k = m.row_key(rv) .. "\2" .. m.col_key(cv)
      local c = {}
      for _, t in ipairs(m.done) do
        local mm = t.memory
        if type(mm) == "table" and m.row_key(values_of(t, m.rows)) .. "\2" .. m.col_key(values_of(t, m.cols)) == k then
          c.n = (c.n or 0) + 1
          if type(mm.planned_total) == "number" then c.planned = math.max(c.planned or 0, mm.planned_total) end
          if type(mm.measured_peak_rss) == "number" and mm.measured_peak_rss > 0 then
            c.measured = math.max(c.measured or 0, mm.measured_peak_rss)
          end
        end
      end
      if c.planned or c.measured then any_mem = true end
      mem_cells[i][j] = c
    end
  end
  return mem_cells, any_mem
end

--- Memory cell text: takes a memory cell; returns "planned / measured (+d%)" in MiB, or "n/a".
local function mem_text(c)
  if not (c.planned or c.measured) then return "n/a" end
  local p = c.planned and string.format("%.0f", c.planned / MIB) or "?"
  local q = c.measured and string.format("%.0f", c.measured / MIB) or "?"
  local d = (c.planned and c.measured and c.planned > 0)
    and string.format(" (%+.1f%%)", 100 * (c.measured - c.planned) / c.planned) or ""
  return p .. " / " .. q .. d
end

--- The grid: takes m (after the steps above); returns the table's cells as strings (grid[1] the
--- header, then the baseline rows, then the rows), kinds[g] ("head" | "base" | "row"), the
--- number of label columns nh and of data columns nc, and the memory grid's header (the
--- metric table's, with "peak memory" where that names the metric).
local function build_grid(m)
  local head = {}
  for _, f in ipairs(#m.rows > 0 and m.rows or {"model"}) do head[#head + 1] = f end
  local grid, kinds = {{}}, {"head"}
  for _, h in ipairs(head) do grid[1][#grid[1] + 1] = h end
  for _, cv in ipairs(m.col_combos) do grid[1][#grid[1] + 1] = #m.cols > 0 and describe(m.cols, cv) or m.label end
  for _, br in ipairs(m.base_rows) do
    local d = describe(br.fields, br.vals)
    local bl = base_label(m.trials)
    local r = {d ~= "" and (bl .. ", " .. d) or bl}
    for _ = 2, #head do r[#r + 1] = "" end
    for j = 1, #m.col_combos do r[#r + 1] = cell_text(m, br.cells[j]) end
    grid[#grid + 1] = r
    kinds[#grid] = "base"
  end
  for i, rv in ipairs(m.row_combos) do
    local r = row_labels(m, rv)
    for j = 1, #m.col_combos do r[#r + 1] = cell_text(m, m.cells[i][j]) end
    grid[#grid + 1] = r
    kinds[#grid] = "row"
  end
  local nh, nc = #head, #m.col_combos
  local mem_head = {}
  for c, h in ipairs(grid[1]) do mem_head[c] = h end
  if #m.cols == 0 then mem_head[nh + 1] = "peak memory" end
  return grid, kinds, nh, nc, mem_head
end

--- The stats of the cell at grid row g, data column c (nil outside the fine-tuned rows).
local function grid_cell(m, g, c)
  if m.kinds[g] ~= "row" then return nil end
  return m.cells[g - 1 - #m.base_rows][c - m.nh]
end

--- The text table: takes m; returns the plain-text table: aligned columns, a * after the
--- best cell, the notes, and the memory grid when any trial recorded memory.
local function text_table(m)
  local grid, kinds, nh, nc = m.grid, m.kinds, m.nh, m.nc
  -- text: baseline labels may be wider than the first column; they span the row-key columns
  local w = {}
  for c = 1, nh + nc do w[c] = 0 end
  for g, r in ipairs(grid) do
    for c = 1, nh + nc do
      if not (kinds[g] == "base" and c <= nh) then w[c] = math.max(w[c], width(r[c])) end
    end
  end
  -- data columns get room for the marks (a space and "*", "≈", "†", "*†" or "≈†")
  local mark_w = 1
  for g = 2, #grid do
    for c = nh + 1, nh + nc do mark_w = math.max(mark_w, width(marks(m, grid_cell(m, g, c)))) end
  end
  local span = 0
  for c = 1, nh do span = span + w[c] + (c > 1 and 2 or 0) end
  for g, r in ipairs(grid) do
    if kinds[g] == "base" and width(r[1]) > span then
      w[nh] = w[nh] + width(r[1]) - span
      span = width(r[1])
    end
  end
  local lines = {m.title}
  local function text_row(g, r)
    local parts = {}
    if kinds[g] == "base" then
      parts[1] = pad(r[1], span)
    else
      for c = 1, nh do parts[#parts + 1] = pad(r[c], w[c]) end
    end
    for c = nh + 1, nh + nc do
      local cell = grid_cell(m, g, c)
      parts[#parts + 1] = pad(r[c], w[c], true) .. " " .. pad(marks(m, cell), mark_w)
    end
    return (table.concat(parts, "  "):gsub("%s+$", ""))
  end
  lines[#lines + 1] = text_row(1, grid[1])
  local rule = {}
  for c = 1, nh do rule[#rule + 1] = string.rep("-", w[c]) end
  for c = nh + 1, nh + nc do rule[#rule + 1] = string.rep("-", w[c] + 1 + mark_w) end
  lines[#lines + 1] = table.concat(rule, "  ")
  for g = 2, #grid do
    lines[#lines + 1] = text_row(g, grid[g])
    if kinds[g] == "base" and kinds[g + 1] == "row" then lines[#lines + 1] = table.concat(rule, "  ") end
  end
  if m.best_val then lines[#lines + 1] = "* best " .. (m.better == "max" and "(highest)" or "(lowest)") .. " mean" end
  for _, n in ipairs(m.unc_notes) do lines[#lines + 1] = n end
  if m.split_note then lines[#lines + 1] = m.split_note end
  if m.note_head then
    lines[#lines + 1] = m.note_head .. ":"
    for _, n in ipairs(m.notes) do lines[#lines + 1] = "  " .. n end
  end
  if m.any_mem then
    -- the same rows and columns as the metric table
    local mg = {m.mem_head}
    for i, rv in ipairs(m.row_combos) do
      local r = row_labels(m, rv)
      for j = 1, #m.col_combos do r[#r + 1] = mem_text(m.mem_cells[i][j]) end
      mg[#mg + 1] = r
    end
    local mw = {}
    for c = 1, nh + nc do
      mw[c] = 0
      for _, r in ipairs(mg) do mw[c] = math.max(mw[c], width(r[c])) end
    end
    lines[#lines + 1] = ""
    lines[#lines + 1] = MEM_TITLE
    for g, r in ipairs(mg) do
      local parts = {}
      for c = 1, nh + nc do parts[c] = pad(r[c], mw[c], c > nh) end
      lines[#lines + 1] = (table.concat(parts, "  "):gsub("%s+$", ""))
      if g == 1 then
        local rl = {}
        for c = 1, nh + nc do rl[c] = string.rep("-", mw[c]) end
        lines[#lines + 1] = table.concat(rl, "  ")
      end
    end
  end
  return table.concat(lines, "\n") .. "\n"
end

--- The Markdown table: takes m; returns the title in bold, the table (best cell in bold), the
--- notes as a list, and the memory grid as a second table.
local function markdown_table(m)
  local grid, nh, nc = m.grid, m.nh, m.nc
  local md = {"**" .. md_escape(m.title) .. "**", ""}
  local hdr, align = {}, {}
  for c = 1, nh + nc do
    hdr[c] = md_escape(grid[1][c])
    align[c] = c <= nh and ":--" or "--:"
  end
  md[#md + 1] = "| " .. table.concat(hdr, " | ") .. " |"
  md[#md + 1] = "|" .. table.concat(align, "|") .. "|"
  for g = 2, #grid do
    local r = {}
    for c = 1, nh + nc do
      local s = md_escape(grid[g][c])
      local cell = c > nh and grid_cell(m, g, c)
      if cell and m.is_best(cell) then s = "**" .. s .. "**" end
      local mk = cell and marks(m, cell):gsub("%*", "") or ""
      if mk ~= "" then s = s .. " " .. mk end
      r[c] = s
    end
    md[#md + 1] = ("| " .. table.concat(r, " | ") .. " |"):gsub("  +", " ")
  end
  md[#md + 1] = ""
  if m.best_val then md[#md + 1] = "Bold: best " .. (m.better == "max" and "(highest)" or "(lowest)") .. " mean." end
  for _, n in ipairs(m.unc_notes) do md[#md + 1] = ""; md[#md + 1] = md_escape(n) .. "." end
  if m.split_note then md[#md + 1] = ""; md[#md + 1] = md_escape(m.split_note) .. "." end
  if m.note_head then
    md[#md + 1] = ""
    md[#md + 1] = md_escape(m.note_head) .. ":"
    md[#md + 1] = ""
    for _, n in ipairs(m.notes) do md[#md + 1] = "- " .. md_escape(n) end
  end
  if m.any_mem then
    md[#md + 1] = ""
    md[#md + 1] = md_escape(MEM_TITLE) .. ":"
    md[#md + 1] = ""
    local mh = {}
    for c = 1, nh + nc do mh[c] = md_escape(m.mem_head[c]) end
    md[#md + 1] = "| " .. table.concat(mh, " | ") .. " |"
    md[#md + 1] = "|" .. table.concat(align, "|") .. "|"
    for i, rv in ipairs(m.row_combos) do
      local r = row_labels(m, rv)
      for c = 1, #r do r[c] = md_escape(r[c]) end
      for j = 1, #m.col_combos do r[#r + 1] = mem_text(m.mem_cells[i][j]) end
      md[#md + 1] = "| " .. table.concat(r, " | ") .. " |"
    end
  end
  return table.concat(md, "\n") .. "\n"
end

--- The LaTeX table: takes m; returns a booktabs tabular (best cell in \textbf), the notes and
--- the memory grid as comments.
local function latex_table(m)
  local grid, kinds, nh, nc = m.grid, m.kinds, m.nh, m.nc
  local tex = {"% " .. m.title:gsub("\n", " "), "% generated by gemmarun; needs \\usepackage{booktabs}"}
  tex[#tex + 1] = "\\begin{tabular}{" .. string.rep("l", nh) .. string.rep("r", nc) .. "}"
  tex[#tex + 1] = "\\toprule"
  local th = {}
  for c = 1, nh + nc do th[c] = tex_escape(grid[1][c]) end
  tex[#tex + 1] = table.concat(th, " & ") .. " \\\\"
  tex[#tex + 1] = "\\midrule"
  for g = 2, #grid do
    local r = {}
    if kinds[g] == "base" then
      r[1] = nh > 1 and ("\\multicolumn{" .. nh .. "}{l}{" .. tex_escape(grid[g][1]) .. "}") or tex_escape(grid[g][1])
    else
      for c = 1, nh do r[#r + 1] = tex_escape(grid[g][c]) end
    end
    for c = nh + 1, nh + nc do
      local s = tex_escape(grid[g][c])
      local cell = grid_cell(m, g, c)
      if cell and m.is_best(cell) then s = "\\textbf{" .. s .. "}" end
      local mk = cell and marks(m, cell):gsub("%*", "") or ""
      if mk ~= "" then s = s .. tex_escape(mk) end
      r[#r + 1] = s
    end
    tex[#tex + 1] = table.concat(r, " & ") .. " \\\\"
    if kinds[g] == "base" and kinds[g + 1] == "row" then tex[#tex + 1] = "\\midrule" end
  end
  tex[#tex + 1] = "\\bottomrule"
  tex[#tex + 1] = "\\end{tabular}"
  for _, n in ipairs(m.unc_notes) do tex[#tex + 1] = "% " .. n end
  if m.split_note then tex[#tex + 1] = "% " .. m.split_note end
  if m.note_head then
    tex[#tex + 1] = "% " .. m.note_head .. ":"
    for _, n in ipairs(m.notes) do tex[#tex + 1] = "%   " .. n:gsub("\n", " ") end
  end
  if m.any_mem then
    tex[#tex + 1] = "% " .. MEM_TITLE .. ":"
    for i, rv in ipairs(m.row_combos) do
      for j, cv in ipairs(m.col_combos) do
        local v = {}
        for _, x in ipairs(rv) do v[#v + 1] = x end
        for _, x in ipairs(cv) do v[#v + 1] = x end
        local d = describe(m.all_fields, v)
        tex[#tex + 1] = "%   " .. (d ~= "" and d or "all") .. ": " .. mem_text(m.mem_cells[i][j])
      end
    end
  end
  return table.concat(tex, "\n") .. "\n"
end

--- The CSV: takes m; returns the long form, one line per cell (kind, row fields, column
--- fields, metric, phase, mean, std, n, best) at full precision: the baseline cells, the
--- fine-tuned cells, then the memory lines.
local function csv_table(m)
  local rows, cols = m.rows, m.cols
  local metric_name = m.metric .. (m.percent and "_percent" or "")
  local ch = {"kind"}
  for _, f in ipairs(rows) do ch[#ch + 1] = f end
  for _, f in ipairs(cols) do ch[#ch + 1] = f end
  for _, f in ipairs({"metric", "phase", "mean", "std", "n", "best", "ci_low", "ci_high", "ci_method",
                      "p_vs_baseline", "p_vs_best"}) do ch[#ch + 1] = f end
  for i = 1, #ch do ch[i] = csv_field(ch[i]) end
  local csv = {table.concat(ch, ",")}
  local function csv_line(kind, rvals, cv, s, ph, best)
    local r = {kind}
    for _, v in ipairs(rvals) do r[#r + 1] = csv_field(v == "" and "" or fmt_val(v)) end
    for i = 1, #cols do r[#r + 1] = csv_field(fmt_val(cv[i])) end
    r[#r + 1] = csv_field(metric_name)
    r[#r + 1] = csv_field(ph)
    r[#r + 1] = csv_num(s.mean)
    r[#r + 1] = csv_num(s.std)
    r[#r + 1] = tostring(s.n)
    r[#r + 1] = best and "1" or "0"
    r[#r + 1] = csv_num(s.ci and s.ci.lo)
    r[#r + 1] = csv_num(s.ci and s.ci.hi)
    r[#r + 1] = s.ci and s.ci.method or ""
    r[#r + 1] = csv_num(s.p_base)
    r[#r + 1] = csv_num(s.p_best)
    csv[#csv + 1] = table.concat(r, ",")
  end
  for _, br in ipairs(m.base_rows) do
    local rvals = {}
    for i, f in ipairs(rows) do
      rvals[i] = ""
      for k, bf in ipairs(br.fields) do if bf == f then rvals[i] = br.vals[k] end end
    end
    for j, cv in ipairs(m.col_combos) do csv_line("baseline", rvals, cv, br.cells[j], "baseline", false) end
  end
  for i, rv in ipairs(m.row_combos) do
    for j, cv in ipairs(m.col_combos) do csv_line("fine-tuned", rv, cv, m.cells[i][j], m.phase, m.is_best(m.cells[i][j])) end
  end
  if m.any_mem then
    -- memory lines: metric planned_peak_mib / measured_peak_mib, phase "train", the largest
    -- over the cell's n completed trials (std empty: a maximum, not a mean)
    for i, rv in ipairs(m.row_combos) do
      for j, cv in ipairs(m.col_combos) do
        local c = m.mem_cells[i][j]
        for _, pm in ipairs({{"planned_peak_mib", c.planned}, {"measured_peak_mib", c.measured}}) do
          if pm[2] then
            local r = {"memory"}
            for _, v in ipairs(rv) do r[#r + 1] = csv_field(fmt_val(v)) end
            for k = 1, #cols do r[#r + 1] = csv_field(fmt_val(cv[k])) end
            r[#r + 1] = pm[1]
            r[#r + 1] = "train"
            r[#r + 1] = csv_num(pm[2] / MIB)
            r[#r + 1] = ""
            r[#r + 1] = tostring(c.n or 0)
            r[#r + 1] = "0,,,,,"
            csv[#csv + 1] = table.concat(r, ",")
          end
        end
      end
    end
  end
  return table.concat(csv, "\n") .. "\n"
end

-- ---- the HTML report ------------------------------------------------------------------------------

local function html_escape(s)
  return (tostring(s):gsub("[&<>\"]", {["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;"}))
end
report.html_escape = html_escape

--- The HTML table: takes m; returns the metric table (each data cell carries its numbers at the
--- CSV's precision in data-* attributes: data-mean, data-std, data-n, data-ci-low, data-ci-high,
--- data-p-baseline, data-p-best; class "best" on the best), the notes, and the memory grid.
local function html_table(m)
  local grid, kinds, nh, nc = m.grid, m.kinds, m.nh, m.nc
  local h = {'<table class="metric">', "<caption>" .. html_escape(m.title) .. "</caption>", "<thead><tr>"}
  for c = 1, nh + nc do h[#h + 1] = "<th>" .. html_escape(grid[1][c]) .. "</th>" end
  h[#h + 1] = "</tr></thead><tbody>"
  for g = 2, #grid do
    local kind = kinds[g]
    h[#h + 1] = '<tr class="' .. kind .. '">'
    if kind == "base" then
      h[#h + 1] = '<th colspan="' .. nh .. '">' .. html_escape(grid[g][1]) .. "</th>"
    else
      for c = 1, nh do h[#h + 1] = "<th>" .. html_escape(grid[g][c]) .. "</th>" end
    end
    for c = nh + 1, nh + nc do
      local s = kind == "base" and m.base_rows[g - 1].cells[c - nh] or grid_cell(m, g, c)
      local attrs = {}
      if s and s.n > 0 then
        attrs[#attrs + 1] = 'data-mean="' .. csv_num(s.mean) .. '"'
        if s.std then attrs[#attrs + 1] = 'data-std="' .. csv_num(s.std) .. '"' end
        attrs[#attrs + 1] = 'data-n="' .. s.n .. '"'
        if s.ci then
          attrs[#attrs + 1] = 'data-ci-low="' .. csv_num(s.ci.lo) .. '" data-ci-high="' .. csv_num(s.ci.hi) .. '"'
        end
        if s.p_base then attrs[#attrs + 1] = 'data-p-baseline="' .. csv_num(s.p_base) .. '"' end
        if s.p_best then attrs[#attrs + 1] = 'data-p-best="' .. csv_num(s.p_best) .. '"' end
      end
      local best = kind == "row" and s and m.is_best(s)
      local mk = kind == "row" and marks(m, s):gsub("%*", "") or ""
      h[#h + 1] = "<td" .. (best and ' class="best"' or "") .. (#attrs > 0 and (" " .. table.concat(attrs, " ")) or "") .. ">" ..
        html_escape(grid[g][c]) .. (mk ~= "" and (' <span class="mark">' .. html_escape(mk) .. "</span>") or "") .. "</td>"
    end
    h[#h + 1] = "</tr>"
  end
  h[#h + 1] = "</tbody></table>"
  local notes = {}
  if m.best_val then notes[#notes + 1] = "Bold: best " .. (m.better == "max" and "(highest)" or "(lowest)") .. " mean." end
  for _, n in ipairs(m.unc_notes) do notes[#notes + 1] = n .. "." end
  if m.split_note then notes[#notes + 1] = m.split_note .. "." end
  for _, n in ipairs(notes) do h[#h + 1] = '<p class="note">' .. html_escape(n) .. "</p>" end
  if m.note_head then
    h[#h + 1] = '<p class="note">' .. html_escape(m.note_head) .. ":</p><ul>"
    for _, n in ipairs(m.notes) do h[#h + 1] = "<li>" .. html_escape(n) .. "</li>" end
    h[#h + 1] = "</ul>"
  end
  if m.any_mem then
    h[#h + 1] = '<table class="memory"><caption>' .. html_escape(MEM_TITLE) .. "</caption><thead><tr>"
    for c = 1, nh + nc do h[#h + 1] = "<th>" .. html_escape(m.mem_head[c]) .. "</th>" end
    h[#h + 1] = "</tr></thead><tbody>"
    for i, rv in ipairs(m.row_combos) do
      h[#h + 1] = "<tr>"
      for _, l in ipairs(row_labels(m, rv)) do h[#h + 1] = "<th>" .. html_escape(l) .. "</th>" end
      for j = 1, #m.col_combos do h[#h + 1] = "<td>" .. html_escape(mem_text(m.mem_cells[i][j])) .. "</td>" end
      h[#h + 1] = "</tr>"
    end
    h[#h + 1] = "</tbody></table>"
  end
  return table.concat(h, "\n")
end

--- The tables of `trials` under `spec`: {text=, md=, tex=, csv=, html=} (the header comment says
--- what they hold; html is the table fragment report.html_page puts in the page).
function report.render(trials, spec)
  check_spec(spec)
  local m = settings(in_order(trials), spec)
  m.done, m.excluded, m.row_combos, m.row_key, m.col_combos, m.col_key, m.cells, m.all_stats = collect_cells(m)
  m.base_rows = baseline_rows(m, spec)
  m.num = number_format(m, spec)
  m.mode_n = typical_count(m.all_stats)
  m.best_val, m.is_best = choose_best(m)
  m.ci_used, m.tested, m.n_test = uncertainty(m)
  m.unc_notes = uncertainty_notes(m)
  m.title, m.shown = title_of(m, spec)
  m.note_head, m.notes = excluded_notes(m)
  m.mem_cells, m.any_mem = memory_cells(m)
  m.grid, m.kinds, m.nh, m.nc, m.mem_head = build_grid(m)
  return {text = text_table(m), md = markdown_table(m), tex = latex_table(m), csv = csv_table(m), html = html_table(m)}
end

--- Writes <dir>/<name>.md, .tex and .csv; returns the paths.
function report.write(dir, name, tables)
  local out = {}
  for _, ext in ipairs({"md", "tex", "csv"}) do
    local path = dir .. "/" .. name .. "." .. ext
    gm.write_text(path, tables[ext])
    out[#out + 1] = path
  end
  return out
end

-- ---- plots ----------------------------------------------------------------------------------------

local function safe_name(s) return (tostring(s):gsub("[^%w%-_.]", "_")) end

--- Writes <name>_loss.png (loss vs step, one line per trial, one color per table cell) and,
--- when the spec has columns, <name>_<metric>_vs_<col>.png (metric vs the first column field,
--- one series per combination of the other fields, mean ± std over seeds; the baseline as its
--- own series). Returns the list of files written.
function report.plots(trials, spec, dir, name)
  check_spec(spec)
  trials = in_order(trials)
  local rows, cols = spec.rows or {}, spec.cols or {}
  local metric, phase = spec.metric or report.default_spec(trials).metric, spec.phase or "final"
  local percent = spec.percent
  if percent == nil then percent = metric:find("accuracy") ~= nil end
  local scale = percent and 100 or 1
  local label = metric .. (percent and " (%)" or "")
  local fields = {}
  for _, f in ipairs(rows) do fields[#fields + 1] = f end
  for _, f in ipairs(cols) do fields[#fields + 1] = f end
  local files = {}

  -- loss curves
  local cell_combos, cell_key = combos(trials, fields)
  local color_of = {}
  for i, c in ipairs(cell_combos) do color_of[cell_key(c)] = i - 1 end
  local series, labelled = {}, {}
  for _, t in ipairs(trials) do
    local loss = t.metrics and t.metrics.loss
    if loss and #loss > 0 then
      local step = t.metrics.step
      local x = {}
      for i = 1, #loss do x[i] = (step and step[i] == step[i] and step[i]) or i end
      local vals = values_of(t, fields)
      local k = cell_key(vals)
      local s = {x = x, y = loss, color = color_of[k] or 0}
      if not labelled[k] then
        labelled[k] = true
        local d = describe(fields, vals)
        s.label = d ~= "" and d or "trial"
      end
      if t.status == "failed" then -- same color, dashed
        s.label = describe(fields, vals) .. " (failed)"
        s.color = s.color + 10
      end
      series[#series + 1] = s
    end
  end
  if #series > 0 then
    local file = dir .. "/" .. name .. "_loss.png"
    gm.plot{file = file, title = (trials[1].experiment or name) .. ": training loss (one line per trial)",
            xlabel = "step", ylabel = "loss", kind = "lines", series = series}
    files[#files + 1] = file
  end

  -- validation curves (experiment.validation): the val_<metric> series vs step, one line per
  -- table cell, mean over its seeds at each evaluated step in a band of ± std
  local val_name
  for _, t in ipairs(trials) do
    for k in pairs(t.metrics or {}) do if k:match("^val_") then val_name = k end end
    if val_name then break end
  end
  if val_name then
    local vseries = {}
    for ci, c in ipairs(cell_combos) do
      local at = {} -- step -> values over the cell's trials
      for _, t in ipairs(trials) do
        local vs, st = t.metrics and t.metrics[val_name], t.metrics and t.metrics.step
        if vs and t.status ~= "failed" and cell_key(values_of(t, fields)) == cell_key(c) then
          for i = 1, #vs do
            if vs[i] == vs[i] then
              local x = (st and st[i] == st[i] and st[i]) or i
              at[x] = at[x] or {}
              table.insert(at[x], vs[i] * (val_name:find("accuracy") and 100 or 1))
            end
          end
        end
      end
      local xs = {}
      for x in pairs(at) do xs[#xs + 1] = x end
      table.sort(xs)
      if #xs > 0 then
        local y, err = {}, {}
        for i, x in ipairs(xs) do
          local st = stats(at[x])
          y[i], err[i] = st.mean, st.std or 0
        end
        local d = describe(fields, c)
        vseries[#vseries + 1] = {label = d ~= "" and d or "trial", x = xs, y = y, err = err, color = ci - 1}
      end
    end
    if #vseries > 0 then
      local file = dir .. "/" .. name .. "_validation.png"
      local vlabel = val_name .. (val_name:find("accuracy") and " (%)" or "")
      gm.plot{file = file, title = (trials[1].experiment or name) .. ": " .. vlabel .. " vs step (mean over seeds, band ± std)",
              xlabel = "step", ylabel = vlabel, kind = "band", series = vseries}
      files[#files + 1] = file
    end
  end

  -- metric vs the first column field
  if #cols > 0 then
    local xf = cols[1]
    local others = {}
    for _, f in ipairs(fields) do if f ~= xf then others[#others + 1] = f end end
    local done = {}
    for _, t in ipairs(trials) do if t.status == "completed" then done[#done + 1] = t end end
    local xvals = combos(done, {xf})
    local numeric, positive = true, true
    for _, v in ipairs(xvals) do
      if type(v[1]) ~= "number" then numeric = false elseif v[1] <= 0 then positive = false end
    end
    local xs, ticks, ticklabels = {}, {}, {}
    for i, v in ipairs(xvals) do
      xs[fmt_val(v[1])] = numeric and v[1] or i
      ticks[i] = numeric and v[1] or i
      ticklabels[i] = fmt_val(v[1])
    end
    local logx = false
    if numeric and positive and #xvals > 1 and ticks[#ticks] / ticks[1] > 3 then logx = true end
    local groups, gkey = combos(done, others)
    local pseries = {}
    for gi, g in ipairs(groups) do
      local x, y, err = {}, {}, {}
      for _, v in ipairs(xvals) do
        local sample = {}
        for _, t in ipairs(done) do
          if t.config[xf] == v[1] and gkey(values_of(t, others)) == gkey(g) then
            local m = metric_of(t, metric, phase)
            if m then sample[#sample + 1] = m * scale end
          end
        end
        local s = stats(sample)
        if s.n > 0 then
          x[#x + 1] = xs[fmt_val(v[1])]
          y[#y + 1] = s.mean
          err[#err + 1] = s.std or 0
        end
      end
      if #x > 0 then
        local d = describe(others, g)
        pseries[#pseries + 1] = {label = d ~= "" and d or label, x = x, y = y, err = err, color = gi - 1}
      end
    end
    -- the baseline: one series per combination of the fields it depends on (baseline_by)
    if spec.baseline ~= false then
      local by = spec.baseline_by
      local is_by = {}
      if by then for _, f in ipairs(by) do is_by[f] = true end else is_by = BASE_FIELDS end
      local bfields = {}
      for _, f in ipairs(others) do if is_by[f] then bfields[#bfields + 1] = f end end
      local bgroups, bkey = combos(done, bfields)
      for bi, bg in ipairs(bgroups) do
        local bx, byv, be = {}, {}, {}
        for _, v in ipairs(xvals) do
          local sample = {}
          for _, t in ipairs(done) do
            if t.config[xf] == v[1] and bkey(values_of(t, bfields)) == bkey(bg) then
              local m = metric_of(t, metric, "baseline")
              if m then sample[#sample + 1] = m * scale end
            end
          end
          local s = stats(sample)
          if s.n > 0 then
            bx[#bx + 1], byv[#byv + 1], be[#be + 1] = xs[fmt_val(v[1])], s.mean, s.std or 0
          end
        end
        if #bx > 0 then
          local d = describe(bfields, bg)
          pseries[#pseries + 1] = {label = base_label(done) .. (d ~= "" and ", " .. d or ""),
                                   x = bx, y = byv, err = be, color = 7 + 10 * (bi - 1)}
        end
      end
    end
    if #pseries > 0 then
      local file = dir .. "/" .. name .. "_" .. safe_name(metric) .. "_vs_" .. safe_name(xf) .. ".png"
      gm.plot{file = file, title = string.format("%s: %s vs %s (mean ± std over seeds)",
                                                 trials[1].experiment or name, label, xf),
              xlabel = xf, ylabel = label, kind = "points", logx = logx, xticks = ticks,
              xticklabels = ticklabels, series = pseries}
      files[#files + 1] = file
    end
  end
  return files
end

--- Writes <dir>/<name>_confusion_<trial>_<phase>.png for every trial and eval phase that has a
--- confusion matrix (classify{}; gm.plot kind "confusion"): <trial> is the trial's index, or
--- index-id when trials of several runs of the experiment share it. Each plot is drawn on its
--- own: one that fails is a warning and the others are still drawn. Returns the files written
--- (trial order, baseline before final), the warnings, and the files of `best` (a trial, or nil:
--- none).
function report.confusion_plots(trials, dir, name, best)
  trials = in_order(trials)
  local uses = {}
  for _, t in ipairs(trials) do uses[tostring(t.trial_index)] = (uses[tostring(t.trial_index)] or 0) + 1 end
  local files, warnings, best_files = {}, {}, {}
  for _, t in ipairs(trials) do
    local phases = {}
    for ph, ev in pairs(t.eval or {}) do
      if type(ev) == "table" and type(ev.confusion) == "table" and type(ev.labels) == "table" then
        phases[#phases + 1] = ph
      end
    end
    local rank = {baseline = 1, final = 2}
    table.sort(phases, function(a, b)
      if (rank[a] or 3) ~= (rank[b] or 3) then return (rank[a] or 3) < (rank[b] or 3) end
      return a < b
    end)
    local id = tostring(t.trial_index)
    if uses[id] > 1 then id = id .. "-" .. tostring(t.trial_id) end
    local fields = {}
    for _, f in ipairs(type(t.swept) == "table" and t.swept or {}) do fields[#fields + 1] = f end
    if t.config and t.config.seed ~= nil then fields[#fields + 1] = "seed" end
    local d = describe(fields, values_of(t, fields))
    for _, ph in ipairs(phases) do
      local ev = t.eval[ph]
      local file = dir .. "/" .. name .. "_confusion_" .. safe_name(id) .. "_" .. safe_name(ph) .. ".png"
      local title = string.format("%s, trial %s%s: %s%s", t.experiment or name, id, d ~= "" and (" (" .. d .. ")") or "",
        ph, type(ev.accuracy) == "number" and string.format(", accuracy %.1f%% of %d", 100 * ev.accuracy,
          math.tointeger(ev.n_examples) or 0) or "")
      if t.status ~= "completed" then title = title .. " [" .. tostring(t.status) .. "]" end
      local ok, err = pcall(gm.plot, {file = file, kind = "confusion", title = title, labels = ev.labels,
                                      matrix = ev.confusion})
      if ok then
        files[#files + 1] = file
        if best and t.trial_id == best.trial_id then best_files[#best_files + 1] = file end
      else
        warnings[#warnings + 1] = string.format("confusion matrix of trial %s (%s) not drawn: %s", id, ph,
          type(err) == "table" and tostring(err.msg) or tostring(err))
      end
    end
  end
  return files, warnings, best_files
end

-- ---- the one-page report (results/<name>.html) ------------------------------------------------------

-- provenance fields shown, in this order (results/README.md lists them)
local PROVENANCE_SHOWN = {"model_path", "model_sha256", "model_files", "data_sha256", "data_train_sha256",
  "data_test_sha256", "gemmarun_version", "git_commit", "compiler", "blas", "hdf5", "lua", "cjson", "libc", "cpu",
  "threads", "device", "compute_dtype", "command_line", "set_overrides_json", "experiment_file"}

local PAGE_STYLE = [[
body { font-family: "DejaVu Sans", Arial, sans-serif; margin: 24px; color: #111; max-width: 1200px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 12px 0; font-size: 14px; }
caption { text-align: left; font-weight: bold; padding: 4px 0; white-space: nowrap; }
th, td { border-bottom: 1px solid #ddd; padding: 4px 10px; }
th { text-align: left; font-weight: normal; } thead th { font-weight: bold; border-bottom: 2px solid #444; }
td { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.best { font-weight: bold; } tr.base { color: #555; } .mark { color: #a33; }
p.note { font-size: 13px; color: #333; margin: 4px 0; }
table.provenance td { text-align: left; white-space: normal; font-family: monospace; font-size: 12px; }
img { max-width: 100%; border: 1px solid #ddd; margin: 8px 0; }
pre { background: #f6f6f6; padding: 12px; font-size: 12px; overflow-x: auto; }
]]

--- The page: takes the trials, the rendered tables (report.render), the plot files written and
--- the report's name; returns one self-contained HTML document (no external file, script or
--- font: the plots are inlined as data: URIs) with the tables, the plots, the provenance (each
--- field's distinct values over the trials, with how many trials have each) and the
--- experiment file's text; `note` (optional) is a line under the plots.
function report.html_page(trials, tables, plot_files, name, note)
  local experiment = (trials[1] and trials[1].experiment) or name
  local h = {"<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>" .. html_escape(experiment) .. " — gemmarun report</title>",
             "<style>" .. PAGE_STYLE .. "</style></head><body>",
             "<h1>" .. html_escape(experiment) .. "</h1>",
             '<p class="note">' .. #trials .. " trial" .. (#trials == 1 and "" or "s") ..
               "; tables also in " .. html_escape(name) .. ".md, .tex and .csv (same numbers, full precision in the CSV)</p>",
             "<h2>Results</h2>", tables.html}
  if #plot_files > 0 or note then
    h[#h + 1] = "<h2>Plots</h2>"
    for _, f in ipairs(plot_files) do
      local ok, png = pcall(gm.read_text, f)
      if ok then
        h[#h + 1] = '<figure><img alt="' .. html_escape(f:match("[^/]*$")) .. '" src="data:image/png;base64,' ..
          gm.base64(png) .. '"><figcaption class="note">' .. html_escape(f:match("[^/]*$")) .. "</figcaption></figure>"
      end
    end
    if note then h[#h + 1] = '<p class="note">' .. html_escape(note) .. "</p>" end
  end
  h[#h + 1] = '<h2>Provenance</h2><table class="provenance"><thead><tr><th>field</th><th>value (trials)</th></tr></thead><tbody>'
  local shown = 0
  for _, f in ipairs(PROVENANCE_SHOWN) do
    local count, order = {}, {}
    for _, t in ipairs(trials) do
      local v = type(t.provenance) == "table" and t.provenance[f]
      if v and v ~= "" then
        if not count[v] then order[#order + 1] = v end
        count[v] = (count[v] or 0) + 1
      end
    end
    if #order > 0 then
      local vals = {}
      for _, v in ipairs(order) do
        vals[#vals + 1] = html_escape(v) .. (#order > 1 and (" (" .. count[v] .. ")") or "")
      end
      h[#h + 1] = "<tr><th>" .. f .. "</th><td>" .. table.concat(vals, "<br>") .. "</td></tr>"
      shown = shown + 1
    end
  end
  if shown == 0 then h[#h + 1] = '<tr><td colspan="2">none recorded (trial files written before provenance)</td></tr>' end
  h[#h + 1] = "</tbody></table>"
  -- the experiment file's text; each version when the trials were run from edited files
  local sources, order = {}, {}
  for _, t in ipairs(trials) do
    local p = type(t.provenance) == "table" and t.provenance or {}
    if p.experiment_source and p.experiment_source ~= "" then
      local src = sources[p.experiment_source]
      if not src then
        src = {file = p.experiment_file, trials = {}}
        sources[p.experiment_source] = src
        order[#order + 1] = p.experiment_source
      end
      src.trials[#src.trials + 1] = tostring(t.trial_index or t.trial_id)
    end
  end
  for _, text in ipairs(order) do
    local src = sources[text]
    h[#h + 1] = "<h2>Experiment file" .. (src.file and (": " .. html_escape(src.file)) or "") ..
      (#order > 1 and (" (trials " .. html_escape(table.concat(src.trials, ", ")) .. ")") or "") .. "</h2>"
    h[#h + 1] = '<pre class="experiment">' .. html_escape(text) .. "</pre>"
  end
  h[#h + 1] = "</body></html>"
  return table.concat(h, "\n") .. "\n"
end

-- ---- the `gemmarun table` command ----------------------------------------------------------------

--- `gemmarun table`: renders `trials` (read from `path`, a folder of trial files or a merged
--- file) with the report spec stored in them (else report.default_spec), writes
--- <dir>/<name>.md/.tex/.csv, the plots and the confusion matrices, and for a folder the merged
--- <dir>/<name>.h5. Returns {text = the text table, written = {path, ...}, warnings = {message,
--- ...}}; plot failures are warnings (the tables matter more), anything else raises.
--- The trial `gemmarun export --best` takes: the best cell of the report's table (spec's metric,
--- phase and direction, on the shown digits; of several, the first in the table's order), and in
--- it the trial with the best value of the metric (ties: the lowest index). Returns the trial and
--- a sentence saying which and why; nil and the reason when no completed trial has the metric.
function report.best_trial(trials, spec)
  local m = settings(trials, spec)
  local _, _, row_combos, _, col_combos, _, cells, all_stats = collect_cells(m)
  m.all_stats = all_stats
  if #all_stats == 0 then
    return nil, string.format("no completed trial has a value of %s (%s evaluation)", m.metric, m.phase)
  end
  m.num = number_format(m, spec)
  local _, is_best = choose_best(m)
  for i, rv in ipairs(row_combos) do
    for j, cv in ipairs(col_combos) do
      local s = cells[i][j]
      if s.n > 0 and is_best(s) then
        local pick, pv
        for _, t in ipairs(s.trials) do
          local v = metric_of(t, m.metric, m.phase) * m.scale
          local better = pv == nil or (m.better == "max" and v > pv) or (m.better == "min" and v < pv)
            or (v == pv and (tonumber(t.trial_index) or 0) < (tonumber(pick.trial_index) or 0))
          if better then pick, pv = t, v end
        end
        local where = {}
        local d = describe(m.rows, rv)
        if d ~= "" then where[#where + 1] = d end
        d = describe(m.cols, cv)
        if d ~= "" then where[#where + 1] = d end
        local why = string.format("best cell by %s (%s evaluation, %s is better): %s, mean %s over %d trial%s; its best "
          .. "trial: %s (%s), %s %s", m.metric, m.phase, m.better == "max" and "higher" or "lower",
          #where > 0 and table.concat(where, ", ") or "all trials", m.num(s.mean), s.n, s.n == 1 and "" or "s",
          tostring(pick.trial_index), tostring(pick.trial_id), m.metric, m.num(pv))
        return pick, why
      end
    end
  end
end

function report.cli(trials, path, dir, name, is_dir)
  if #trials == 0 then error(path .. ": no trial files (trial-*.h5) found", 0) end
  local spec
  for _, t in ipairs(trials) do
    if type(t.report) == "table" and next(t.report) ~= nil then spec = t.report; break end
  end
  spec = spec or report.default_spec(trials)
  local tables = report.render(trials, spec)
  -- transcription: the phone error rate's table below the word error rate's, when recorded
  if spec.metric == "word_error_rate" then
    for _, t in ipairs(trials) do
      if t.eval and t.eval.final and t.eval.final.phone_error_rate then
        local s2 = {}
        for k, v in pairs(spec) do s2[k] = v end
        s2.metric = "phone_error_rate"
        local t2 = report.render(trials, s2)
        for _, k in ipairs({"text", "md", "tex", "csv", "html"}) do tables[k] = tables[k] .. "\n" .. t2[k] end
        break
      end
    end
  end
  local written, warnings = report.write(dir, name, tables), {}
  local ok, files = pcall(report.plots, trials, spec, dir, name)
  if ok then
    for _, f in ipairs(files) do written[#written + 1] = f end
  else
    warnings[#warnings + 1] = "plots not written: " .. tostring(files)
  end
  local page_plots, note = ok and files or {}, nil
  -- Confusion matrices: every trial's as a file, the best trial's on the page (a sweep of 96
  -- trials would make a page of tens of MB); named one by one in `written` up to 4, else as a
  -- pattern (a sweep would fill the terminal with file names).
  local bok, best = pcall(report.best_trial, trials, spec)
  local cok, conf, cwarn, best_conf = pcall(report.confusion_plots, trials, dir, name, bok and best or nil)
  if cok then
    for _, w in ipairs(cwarn) do warnings[#warnings + 1] = w end
    if #conf <= 4 then
      for _, f in ipairs(conf) do written[#written + 1] = f end
    else
      written[#written + 1] = string.format("%s/%s_confusion_*.png (%d confusion matrices)", dir, name, #conf)
    end
    for _, f in ipairs(best_conf) do page_plots[#page_plots + 1] = f end
    if #conf > #best_conf then
      note = string.format("Confusion matrices: %s; every trial's in %s_confusion_*.png (%d files).",
        #best_conf > 0 and ("those of trial " .. tostring(best.trial_index) .. ", the best, above") or "none shown here",
        name, #conf)
    end
  else
    warnings[#warnings + 1] = "confusion matrices not drawn: " .. tostring(conf)
  end
  local page = dir .. "/" .. name .. ".html"
  gm.write_text(page, report.html_page(in_order(trials), tables, page_plots, name, note))
  written[#written + 1] = page
  if is_dir then
    local merged = dir .. "/" .. name .. ".h5"
    gm.results_merge(path, merged)
    written[#written + 1] = merged
  end
  return {text = tables.text, written = written, warnings = warnings}
end

return report

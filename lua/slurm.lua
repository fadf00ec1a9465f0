-- slurm.lua: `gemmarun submit EXPERIMENT.lua --slurm ...` - a sweep's pending trials as a Slurm job
-- array, and a job after it that renders the tables. Loaded by lua/main.c (gm_module("slurm")).
--
-- We write no scheduler: this checks and plans what a dry run checks and plans (runner.prepare,
-- runner.plan_trial), writes three files into the results folder's slurm/ and hands them to sbatch:
--
--   trials.sbatch   one array script for every trial: array index -> trial id (the index is the
--                   trial's place in the sweep when it was written; the task runs the id, so it
--                   runs that trial even if the file's sweep order changes before it starts), then
--                   `gemmarun EXPERIMENT.lua --trial ID --no-tables`: each task writes only its own
--                   trial file (and checkpoint); a second process on the same trial is kept out by
--                   the runner's trial lock
--   tables.sbatch   `gemmarun table RESULTS`, after every array task ended (afterany)
--   submit.sh       the sbatch commands: the array script once per memory class (--array=the
--                   indices of those trials, --mem=their plan + 10%, so Slurm itself refuses a trial
--                   no node can hold), then the tables job depending on them. --print prints it
--                   instead of running it (sites that submit by hand)
--
-- Finished trials are not submitted again; an interrupted or failed one is, and resumes from its
-- checkpoint (runner.lua). Slurm ends a task with SIGTERM (scancel, and --signal 120 s before a time
-- limit): gemmarun saves a checkpoint at the end of the step it is in and exits.
-- Exit code: 0 submitted (or nothing left to submit), 1 sbatch failed, 2 bad usage or input.

local P = GM_PRELUDE
local R = gm_module("runner")
local S = {}

local function say(fmt, ...) print(string.format(fmt, ...)) end

-- The memory a task asks for: its plan (runner.plan_trial: the trainer's plan, the runner's state,
-- images) plus 10% - twice the 5% the tests allow between a plan and a run's peak
-- (TOL_PLAN_PEAK_REL, docs/memory.md) - rounded up to 64 MiB, so that trials with nearly equal
-- plans share one array.
S.MEM_HEADROOM = 1.10
S.MEM_QUANTUM = 64 * 2 ^ 20
-- `gemmarun table` on a results folder: the merged tables and plots (a peak of 33 MiB measured for
-- the 4-trial fixture of tests/e2e/slurm.sh, /usr/bin/time -v; 512 MiB leaves room for large sweeps).
S.TABLES_MEM_MIB = 512
-- The signal Slurm sends before a time limit ends the task, and how long before (sbatch --signal):
-- time to finish the step and save a checkpoint; the task resumes from it when submitted again.
S.SIGNAL = "B:TERM@120"

--- A word for the shell, single-quoted unless it is plain (POSIX sh: ' cannot be escaped inside
--- '...', so it closes, adds \', and reopens).
function S.quote(w)
  w = tostring(w)
  if w:match("^[%w%.%-_/=:,@%%+]+$") then return w end
  return "'" .. w:gsub("'", "'\\''") .. "'"
end

--- Sorted indices as Slurm's --array list: ranges a-b, and singles, comma separated.
function S.array_spec(idx)
  table.sort(idx)
  local parts, i = {}, 1
  while i <= #idx do
    local j = i
    while j < #idx and idx[j + 1] == idx[j] + 1 do j = j + 1 end
    parts[#parts + 1] = j > i and (idx[i] .. "-" .. idx[j]) or tostring(idx[i])
    i = j + 1
  end
  return table.concat(parts, ",")
end

--- A path inside sbatch's --output, where % starts a pattern (%j, %a, ...) and \ turns patterns
--- off (sbatch(1), "filename pattern"): a literal % is %%.
function S.pattern_safe(path) return (path:gsub("%%", "%%%%")) end

-- Options after `--` that would break what submit builds: the arrays' indices, the tables job's
-- dependency on them, where the logs go, where the tasks run; sbatch's short forms included.
S.OWN_OPTIONS = { ["--array"] = "the array indices are the pending trials'", ["-a"] = "--array",
  ["--dependency"] = "the tables job depends on the arrays (afterany)", ["-d"] = "--dependency",
  ["--output"] = "each task logs to results/NAME/slurm/", ["-o"] = "--output", ["--error"] = "each task logs to results/NAME/slurm/",
  ["-e"] = "--error", ["--chdir"] = "the tasks run in the folder submit ran in", ["-D"] = "--chdir",
  ["--wrap"] = "the scripts are gemmarun's", ["--parsable"] = "submit reads the job ids itself" }

--- Refuses sbatch options (after `--`) that S.OWN_OPTIONS names, with why.
function S.check_sbatch_args(args)
  for _, a in ipairs(args) do
    local opt = a:match("^(%-%-[%w-]+)=") or a:match("^(%-%-[%w-]+)$") or a:match("^(%-%a)")
    local why = opt and S.OWN_OPTIONS[opt]
    if why then
      if S.OWN_OPTIONS[why] then opt, why = why, S.OWN_OPTIONS[why] end
      P.usage(nil, "sbatch option %s after --: gemmarun submit sets %s itself (%s); leave it out%s", a, opt, why,
        opt == "--array" and " (--max-parallel caps the running tasks)" or "")
    end
  end
end

local function mib(bytes) return math.tointeger(math.ceil(bytes / 2 ^ 20)) end

--- The request for a plan of `bytes`: plan x 1.10, up to a multiple of 64 MiB, in MiB.
function S.mem_request(bytes)
  return mib(math.ceil(bytes * S.MEM_HEADROOM / S.MEM_QUANTUM) * S.MEM_QUANTUM)
end

--- The array script: SBATCH options, the index -> id table, the command. `o`: {name, dir (absolute
--- results folder), cwd, exe, file, cpus, gpus, partition, sets, allow_os, trials = {{index, id}}}.
function S.array_script(o)
  local L = {
    "#!/bin/bash",
    string.format("# The trials of experiment %s as a Slurm job array, written by `gemmarun submit` (%s).", o.name, o.when),
    "# submit.sh submits it once per memory class with --array (the trials' indices) and --mem (their plan).",
    "#SBATCH --job-name=" .. S.quote("gemmarun-" .. o.name),
    "#SBATCH --chdir=" .. S.quote(o.cwd),
    "#SBATCH --output=" .. S.quote(S.pattern_safe(o.dir) .. "/slurm/trial-%a.job-%A.out"),
    "#SBATCH --open-mode=append",
    "#SBATCH --ntasks=1",
    "#SBATCH --cpus-per-task=" .. o.cpus,
    "#SBATCH --signal=" .. S.SIGNAL,
  }
  if o.gpus > 0 then L[#L + 1] = "#SBATCH --gres=gpu:" .. o.gpus end
  if o.partition then L[#L + 1] = "#SBATCH --partition=" .. S.quote(o.partition) end
  L[#L + 1] = "set -eu"
  L[#L + 1] = "# array index (the trial's place in the sweep when this was written) -> trial id (what runs)"
  L[#L + 1] = 'case "$SLURM_ARRAY_TASK_ID" in'
  for _, t in ipairs(o.trials) do L[#L + 1] = string.format("  %d) trial=%s ;;", t.index, t.id) end
  L[#L + 1] = '  *) echo "gemmarun submit: array index $SLURM_ARRAY_TASK_ID is not a trial of this script" >&2; exit 2 ;;'
  L[#L + 1] = "esac"
  local cmd = { S.quote(o.exe), S.quote(o.file), "--trial", '"$trial"', "--no-tables", "--threads", '"${SLURM_CPUS_PER_TASK:-' .. o.cpus .. '}"' }
  for _, kv in ipairs(o.sets) do cmd[#cmd + 1] = "--set " .. S.quote(kv) end
  if o.allow_os then cmd[#cmd + 1] = "--allow-os" end
  L[#L + 1] = 'echo "gemmarun: trial $trial (array index $SLURM_ARRAY_TASK_ID, job ${SLURM_ARRAY_JOB_ID:-?}) on $(hostname)"'
  L[#L + 1] = "exec " .. table.concat(cmd, " ")
  return table.concat(L, "\n") .. "\n"
end

--- The tables job's script.
function S.tables_script(o)
  local L = {
    "#!/bin/bash",
    string.format("# The tables of experiment %s, after its array tasks ended; written by `gemmarun submit` (%s).", o.name, o.when),
    "#SBATCH --job-name=" .. S.quote("gemmarun-" .. o.name .. "-tables"),
    "#SBATCH --chdir=" .. S.quote(o.cwd),
    "#SBATCH --output=" .. S.quote(S.pattern_safe(o.dir) .. "/slurm/tables.job-%j.out"),
    "#SBATCH --ntasks=1",
    "#SBATCH --cpus-per-task=1",
    "#SBATCH --mem=" .. S.TABLES_MEM_MIB .. "M",
  }
  if o.partition then L[#L + 1] = "#SBATCH --partition=" .. S.quote(o.partition) end
  L[#L + 1] = "exec " .. S.quote(o.exe) .. " table " .. S.quote(o.dir)
  return table.concat(L, "\n") .. "\n"
end

--- Caps the running tasks at max_parallel across the arrays (Slurm's %K throttles one array):
--- with more memory classes than K, neighbouring classes merge (the larger request for both) until
--- there are K; then K is shared out in proportion to the classes' sizes, at least one each, never
--- more than a class has (largest remainders). Sets c.throttle; the sum is at most K.
function S.share_parallel(classes, k)
  while #classes > k do -- merge the neighbours whose smaller request would grow least
    local best, cost = 1, math.huge
    for i = 1, #classes - 1 do
      local c = (classes[i + 1].mem - classes[i].mem) * #classes[i].indices
      if c < cost then best, cost = i, c end
    end
    local a, b = classes[best], table.remove(classes, best + 1)
    for _, x in ipairs(b.indices) do a.indices[#a.indices + 1] = x end
    a.mem, a.plan = b.mem, math.max(a.plan, b.plan)
  end
  local n = 0
  for _, c in ipairs(classes) do n = n + #c.indices end
  local left, rest = k, {}
  for i, c in ipairs(classes) do
    local exact = k * #c.indices / n
    c.throttle = math.min(#c.indices, math.max(1, math.floor(exact)))
    left = left - c.throttle
    rest[#rest + 1] = { i = i, frac = exact - math.floor(exact) }
  end
  table.sort(rest, function(a, b) return a.frac > b.frac end)
  for _, r in ipairs(rest) do
    local c = classes[r.i]
    if left > 0 and c.throttle < #c.indices then c.throttle, left = c.throttle + 1, left - 1 end
  end
end

--- The submission as steps: {argv, var, label} - sbatch for each memory class (throttled with %N
--- when max_parallel is given: S.share_parallel), then the tables job after all of them. `$aN` in
--- an argv stands for the job id step aN returned.
function S.steps(o, classes)
  local steps, vars = {}, {}
  for i, c in ipairs(classes) do
    local var = "a" .. i
    local argv = { "sbatch", "--parsable", "--array=" .. S.array_spec(c.indices) .. (c.throttle and ("%" .. c.throttle) or ""),
      "--mem=" .. c.mem .. "M" }
    for _, a in ipairs(o.sbatch_args) do argv[#argv + 1] = a end
    argv[#argv + 1] = o.dir .. "/slurm/trials.sbatch"
    steps[#steps + 1] = { argv = argv, var = var, label = string.format("trial%s %s (plan up to %s; %d MiB each)",
      #c.indices == 1 and "" or "s", table.concat(c.indices, ", "), R.fmt_bytes(c.plan), c.mem) }
    vars[#vars + 1] = var
  end
  local dep = {}
  for _, v in ipairs(vars) do dep[#dep + 1] = "$" .. v end
  local argv = { "sbatch", "--parsable", "--dependency=afterany:" .. table.concat(dep, ":") }
  for _, a in ipairs(o.sbatch_args) do argv[#argv + 1] = a end
  argv[#argv + 1] = o.dir .. "/slurm/tables.sbatch"
  steps[#steps + 1] = { argv = argv, var = "tables", label = "the tables, after every task above ended" }
  return steps
end

--- submit.sh: the steps as a POSIX shell script.
function S.submit_script(o, steps)
  local L = { "#!/bin/sh", string.format("# %s", o.command), string.format("# written %s: %s", o.when, o.summary), "set -e",
    "cd " .. S.quote(o.cwd) }
  for _, st in ipairs(steps) do
    local words = {}
    for _, a in ipairs(st.argv) do
      words[#words + 1] = a:find("$a", 1, true) and ('"' .. a .. '"') or S.quote(a)
    end
    L[#L + 1] = "# " .. st.label
    -- (no pipe: set -e stops at a failed sbatch; --parsable prints ID or ID;CLUSTER)
    L[#L + 1] = string.format("%s=$(%s)", st.var, table.concat(words, " "))
    L[#L + 1] = string.format("%s=${%s%%%%;*}", st.var, st.var)
    L[#L + 1] = string.format('echo "%s: job $%s"', st.var == "tables" and "tables" or ("array " .. st.var), st.var)
  end
  return table.concat(L, "\n") .. "\n"
end

--- Runs the steps with spawn, each $aN replaced by its job id. Returns {var = id}, or nil, the
--- failed step and sbatch's message.
local function run_steps(spawn, steps)
  local ids = {}
  for _, st in ipairs(steps) do
    if gm.interrupted() then return nil, st, "interrupted (Ctrl-C or SIGTERM) before it", 130, ids end
    local argv = {}
    for i, a in ipairs(st.argv) do argv[i] = (a:gsub("%$(a%d+)", function(v) return ids[v] end)) end
    local rc, out, err = spawn(argv)
    local id = rc == 0 and out:match("^%s*(%d+)")
    if not id then return nil, st, ((err ~= "" and err or out):gsub("%s+$", "")), rc, ids end
    ids[st.var] = id
  end
  return ids
end

--- This experiment's jobs still in the queue (pending or running), from this folder: squeue's
--- "ID STATE" lines, or nil and why when squeue cannot tell.
local function queued(spawn, name, cwd)
  local ok, rc, out, err = pcall(spawn, { "squeue", "--noheader", "--me", "--name=" .. "gemmarun-" .. name .. ",gemmarun-"
    .. name .. "-tables", "--format=%i|%T|%Z" })
  if not ok then return nil, tostring(rc) end
  if rc ~= 0 then return nil, (err ~= "" and err or out):gsub("%s+$", "") end
  local jobs = {}
  for line in out:gmatch("[^\n]+") do
    local id, state, dir = line:match("^%s*([^|]+)|([^|]*)|(.*)$")
    if id and dir == cwd then jobs[#jobs + 1] = id .. " " .. state:lower() end
  end
  return jobs
end

function S.submit(e, cli)
  -- (--print checks as a dry run does: a built-in size without weights is a note, not an error -
  -- the script may be meant for a cluster that has them)
  -- (the submitting host need not have the trials' GPU: no_device)
  local ctx, trials, _, swept = R.prepare(e, { set = cli.set, max_trials = cli.max_trials, dry_run = cli.print, no_device = true })
  local items = ctx.items
  R.close_prepared(ctx, items)
  S.check_sbatch_args(cli.sbatch_args or {})
  -- tasks of an earlier submission still queued would run their trials a second time (the trial
  -- lock keeps them apart, but they take slots, and the tables job may render too early)
  if not cli.print then
    local jobs, why = queued(cli.spawn, e.name, cli.cwd)
    if not jobs then
      say("cannot list the queue (squeue: %s): nothing submitted", why)
      return 1
    end
    if #jobs > 0 then
      say("jobs of this experiment, submitted from this folder, are still in the queue: %s%s. Submit again once they "
        .. "end (squeue --me --name=gemmarun-%s), or scancel them first; finished trials are kept either way. Nothing "
        .. "submitted", table.concat(jobs, ", ", 1, math.min(#jobs, 8)), #jobs > 8 and (" and " .. (#jobs - 8) .. " more") or "", e.name)
      return 1
    end
  end
  local rel = (e.results or "results") .. "/" .. e.name
  local dir = rel:sub(1, 1) == "/" and rel or (cli.cwd .. "/" .. rel)
  gm.make_results_dir(rel)
  gm.make_results_dir(rel .. "/slurm")
  local cpus = cli.cpus_per_trial or cli.threads or e.threads or GM_THREADS or 2
  -- pending: not completed, and not running now in another process (its trial lock)
  local pending, done, running, over = {}, 0, {}, {}
  for _, t in ipairs(trials) do
    local path = rel .. "/trial-" .. t.id .. ".h5"
    local prior = gm.file_exists(path) and gm.results_read(path) or nil
    local lock = R.lock_path(rel, t.id)
    local busy, holder = gm.file_locked(lock)
    local free = not busy
    if prior and prior.status == "completed" then
      done = done + 1
    elseif not free then
      running[#running + 1] = string.format("%d (pid %s)", t.index, holder)
    else
      local r = R.plan_trial(e, t, items, cpus)
      local how = prior and (" (" .. prior.status .. (gm.file_exists(rel .. "/trial-" .. t.id .. ".ckpt.h5") and ": resumes from its checkpoint" or "")
        .. (prior.status == "failed" and prior.reason and prior.reason ~= "" and (": " .. prior.reason .. "; it runs again") or "") .. ")") or ""
      if not r.plan then P.usage(nil, "trial %d (%s): no memory plan: %s", t.index, R.describe_trial(t, swept), r.why) end
      if r.over then
        over[#over + 1] = string.format("trial %d (%s): plan %s", t.index, R.describe_trial(t, swept), R.fmt_bytes(r.plan.total))
      end
      pending[#pending + 1] = { t = t, total = r.total, mem = S.mem_request(r.total), how = how, fit = r.fit }
    end
  end
  if #over > 0 then
    P.usage(nil, "%d trial%s would be refused over memory_limit %s (nothing submitted): %s; set fit = true, lower max_length "
      .. "or batch, use quant = \"nf4\", or raise memory_limit", #over, #over == 1 and "" or "s", R.fmt_bytes(e.memory_limit_bytes),
      table.concat(over, "; "))
  end
  if #running > 0 then
    say("running now in another process, not submitted again: trial%s %s", #running == 1 and "" or "s", table.concat(running, ", "))
  end
  if #pending == 0 then
    say("nothing to submit: %d of %d trials are done%s; the tables: gemmarun table %s", done, #trials,
      #running > 0 and (", " .. #running .. " running") or "", rel)
    return 0
  end
  -- one array per memory request
  local by_mem, classes = {}, {}
  for _, p in ipairs(pending) do
    local c = by_mem[p.mem]
    if not c then
      c = { mem = p.mem, indices = {}, plan = 0 }
      by_mem[p.mem] = c
      classes[#classes + 1] = c
    end
    c.indices[#c.indices + 1] = p.t.index
    c.plan = math.max(c.plan, p.total)
  end
  table.sort(classes, function(a, b) return a.mem < b.mem end)
  if cli.max_parallel then S.share_parallel(classes, cli.max_parallel) end
  local o = {
    -- a trial on a GPU (device = "cuda") asks for one unless --gpus-per-trial says otherwise
    name = e.name, dir = dir, cwd = cli.cwd, exe = cli.exe, file = cli.file, cpus = cpus,
    gpus = (cli.gpus_per_trial or 0) > 0 and cli.gpus_per_trial or ((e.device or "cpu") ~= "cpu" and 1 or 0),
    partition = cli.partition, sets = cli.set or {}, allow_os = cli.allow_os, max_parallel = cli.max_parallel,
    sbatch_args = cli.sbatch_args or {}, when = os.date("!%Y-%m-%d %H:%M UTC"), command = GM_COMMAND_LINE or "gemmarun submit",
    trials = {},
  }
  for _, p in ipairs(pending) do o.trials[#o.trials + 1] = { index = p.t.index, id = p.t.id } end
  table.sort(o.trials, function(a, b) return a.index < b.index end)
  o.summary = string.format("%d of %d trials pending (%d done%s)", #pending, #trials, done,
    #running > 0 and (", " .. #running .. " running") or "")
  local steps = S.steps(o, classes)
  for name, text in pairs({ ["trials.sbatch"] = S.array_script(o), ["tables.sbatch"] = S.tables_script(o),
                            ["submit.sh"] = S.submit_script(o, steps) }) do
    gm.write_text(rel .. "/slurm/" .. name, text)
  end
  for _, p in ipairs(pending) do
    say("  trial %2d  %s  %s  plan %s -> --mem=%dM%s%s", p.t.index, p.t.id, R.describe_trial(p.t, swept), R.fmt_bytes(p.total),
      p.mem, p.fit and ("; fit: " .. p.fit) or "", p.how)
  end
  say("%s; %d array%s (one per memory request), %d CPU%s per trial%s%s", o.summary, #classes, #classes == 1 and "" or "s", cpus, cpus == 1 and "" or "s",
    o.gpus > 0 and string.format(", %d GPU%s", o.gpus, o.gpus == 1 and "" or "s") or "",
    o.max_parallel and string.format(", at most %d at once%s", o.max_parallel, #classes > 1 and (" (" .. (function()
      local t = {}
      for _, c in ipairs(classes) do t[#t + 1] = tostring(c.throttle) end
      return table.concat(t, " + ") .. " by array)" end)()) or "") or "")
  say("written: %s/slurm/trials.sbatch, tables.sbatch, submit.sh", rel)
  if cli.print then
    print("")
    print((S.submit_script(o, steps):gsub("\n$", "")))
    say("\n(not submitted: --print; `sh %s/slurm/submit.sh` submits them)", rel)
    return 0
  end
  local ids, st, msg, rc, got = run_steps(cli.spawn, steps)
  if not ids then
    local sent = {}
    for k, v in pairs(got) do sent[#sent + 1] = k .. " = job " .. v end
    table.sort(sent)
    local hint = ""
    if msg:find("node configuration is not available", 1, true) or msg:find("Memory specification", 1, true) then
      hint = "\n  hint: a node of the partition must hold the memory asked for (the trial's plan + 10%, above); lower "
        .. "max_length or batch, use quant = \"nf4\", or choose a partition with larger nodes (--partition)"
    end
    if rc == 130 then say("%s %s", msg, st.label) else say("sbatch failed (exit %d) for %s: %s%s", rc, st.label, msg, hint) end
    say("%s", #sent > 0 and ("submitted before it: " .. table.concat(sent, ", ") .. "; scancel them, or let them run and "
      .. "submit again later: finished trials are kept") or "nothing was submitted")
    return 1
  end
  local arrays = {}
  for i = 1, #classes do arrays[#arrays + 1] = ids["a" .. i] end
  say("submitted: array job%s %s, tables job %s after %s", #arrays == 1 and "" or "s", table.concat(arrays, ", "), ids.tables,
    #arrays == 1 and "it" or "them")
  say("watch: squeue -j %s,%s; logs: %s/slurm/; when it ends: %s.md (and .tex, .csv, plots)", table.concat(arrays, ","),
    ids.tables, rel, (e.results or "results") .. "/" .. e.name)
  return 0
end

return S

#!/usr/bin/env bash
# The experiment-file interpreter is sandboxed: no os.execute, io.popen, file writes, require or
# binary chunks unless --allow-os; errors in a file are one line naming file:line (exit 2), the
# traceback only with --verbose; limits on experiment code: an endless loop, an endless
# allocation (with the collector stopped) and a sweep of a million trials each end within
# seconds with a clear error and bounded memory.
set -u
source "$(dirname "$0")/lib.bash"

lua_case() { # NAME WANT_EXIT PATTERN LUA_SOURCE [extra gemmarun args]
  local name=$1 want=$2 pat=$3 src=$4
  shift 4
  printf '%s\n' "$src" > "$TMP/case.lua"
  expect_run "$name" "$want" "$pat" -- "$GM" "$TMP/case.lua" "$@"
}

lua_case "os.execute refused (exit 2: bad file)" 2 "case.lua:1: os.execute is not allowed.*--allow-os" 'os.execute("touch /tmp/gm_pwned")'
lua_case "io.open refused" 2 "io.open is not allowed" 'io.open("/tmp/gm_pwned", "w")'
lua_case "io.popen refused" 2 "io.popen is not allowed" 'io.popen("ls")'
lua_case "os.remove refused" 2 "os.remove is not allowed" 'os.remove("/etc/passwd")'
lua_case "require refused" 2 "case.lua:1: require is not allowed" 'require("socket")'
lua_case "dofile refused" 2 "case.lua:1: dofile is not allowed" 'dofile("/etc/passwd")'
lua_case "loadfile refused" 2 "loadfile is not allowed" 'loadfile("/etc/passwd")'
lua_case "binary chunk refused" 0 "attempt to load a binary chunk" 'local f, e = load(string.dump(function() return 1 end)); assert(f == nil); print(e)'
lua_case "syntax error names file:line (exit 2: bad file)" 2 "case.lua:2:" $'local x = 1\nlocal = 2'
lua_case "runtime error: one line naming file:line (exit 2)" 2 "^gemmarun: error: [^ ]*case.lua:2: attempt to index a nil value \(local 'cfg'\)$" $'local cfg = nil\nlocal lr = cfg.lr'
lua_case "error(): one line" 2 "^gemmarun: error: [^ ]*case.lua:1: boom$" 'error("boom")'
lua_case "--verbose adds the traceback" 2 "case.lua:1: boom.stack traceback:.*case.lua:1: in main chunk" 'error("boom")' --verbose
lua_case "env() default" 0 "^fallback$" 'print(env("GEMMARUN_SURELY_UNSET_VAR", "fallback"))'
lua_case "allowed with --allow-os" 0 "^opened$" 'local f = io.open("/dev/null", "r"); print(f and "opened")' --allow-os
lua_case "load_model bad path" 2 "no_such_model.*no such file" 'gm.load_model("/tmp/no_such_model")'
lua_case "generate unknown option" 2 "unknown option 'max_tokenz'" 'local m = gm.load_model("tests/ref/tiny_gemma3"); m:generate("x", {max_tokenz = 3})'
lua_case "gm.plan: an unknown option lists every allowed one, max_images too" 2 "plan: unknown option 'rnak' \(did you mean 'rank'\?\) \(allowed: .*, seed, steps, threads, max_images, max_audio, max_audio_frames, ple_resident\)" 'gm.plan("tests/ref/tiny_gemma3", {rnak = 4})'
lua_case "gm.plan: max_images is read" 0 "^ok$" 'local a = gm.plan("tests/ref/tiny_gemma3_vision_chat", {max_length = 96}).total; local b = gm.plan("tests/ref/tiny_gemma3_vision_chat", {max_length = 96, max_images = 2}).total; print(b > a and "ok" or ("same: " .. a .. " " .. b))'
lua_case "generate: NaN temperature refused" 2 "temperature must be a finite number" 'local m = gm.load_model("tests/ref/tiny_gemma3"); m:generate("x", {temperature = 0/0})'

# ---- limits on experiment code: each ends with one line, exit 2, within seconds and bounded memory
# limited NAME EXIT PATTERN MAX_SECONDS MAX_KIB LUA_SOURCE [args]: also checks the wall time and
# the peak resident memory
limited() {
  local name=$1 want=$2 pat=$3 secs=$4 kib=$5 src=$6
  shift 6
  printf '%s\n' "$src" > "$TMP/case.lua"
  local out rc t0 t1 peak
  t0=$(date +%s.%N)
  out=$(/usr/bin/time -f "peak %M" "$GM" "$TMP/case.lua" "$@" 2>&1) && rc=0 || rc=$?
  t1=$(date +%s.%N)
  peak=$(printf '%s\n' "$out" | sed -n 's/^peak \([0-9]*\)$/\1/p')
  out=$(printf '%s\n' "$out" | grep -v "^peak " | grep -v "^Command exited with non-zero status")
  if [ "$rc" = "$want" ] && printf '%s' "$out" | grep -Eq -- "$pat" && [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] \
     && awk -v a="$t0" -v b="$t1" -v s="$secs" 'BEGIN { exit !(b - a <= s) }' && [ -n "$peak" ] \
     && { [ -n "${GM_SANITIZE:-}" ] || [ "$peak" -le "$kib" ]; }; then  # ASan's shadow memory is not ours
    pass=$((pass + 1)); echo "ok    $name ($(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s, peak $((peak / 1024)) MiB)"
  else
    fail=$((fail + 1)); echo "FAIL  $name: exit $rc, peak ${peak:-?} KiB (at most $kib), output:"; printf '%s\n' "$out" | head -5 | sed 's/^/      /'
  fi
}
limited "an endless loop at the top level (default budget)" 2 "^gemmarun: error: [^ ]*case.lua:3: the experiment file ran more than 250 million Lua instructions at its top level \(an endless loop\?\).*--max-lua-instructions" 60 200000 $'local x = 0\nwhile true do\n  x = x + 1\nend'
limited "an endless loop inside pcall is still stopped" 2 "case.lua:1: the experiment file ran more than 10 million Lua instructions" 60 200000 'while true do pcall(function() end) end' --max-lua-instructions 10000000
limited "collectgarbage(\"stop\") then endless allocation" 2 "^gemmarun: error: [^ ]*case.lua:5: the Lua heap reached its limit of 64 MiB \(an endless allocation\?\).*--max-lua-memory" 60 300000 $'collectgarbage("stop")\nlocal t, i = {}, 0\nwhile true do\n  i = i + 1\n  t[i] = string.rep("x", 1000) .. i\nend' --max-lua-memory 64MiB
limited "one huge string" 2 "case.lua:1: (not enough memory|resulting string too large|the Lua heap reached its limit)" 60 300000 'local s = string.rep("x", 1 << 33)' --max-lua-memory 64MiB
mkdir -p "$TMP/data/a" "$TMP/data/b" && echo "one" > "$TMP/data/a/1.txt" && echo "two" > "$TMP/data/b/1.txt"
million=$(printf '%s\n' \
  'local l = {}' \
  'for i = 1, 100 do l[i] = i * 1e-5 end' \
  'return experiment {' \
  '  name = "million",' \
  "  model = \"$(pwd)/tests/ref/tiny_gemma3_chat\"," \
  "  task = classify { data = data.folder { root = \"$TMP/data\" }, prompt = \"Which?\" }," \
  '  train = { epochs = 1, batch = 2, lr = 1e-2, rank = 4 },' \
  '  sweep = grid { lr = l, rank = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, alpha = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10},' \
  '                 dropout = {0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9} },' \
  '  seeds = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10},' \
  '}')
limited "a sweep of a million trials" 2 "^gemmarun: error: [^ ]*case.lua:8: the experiment expands to 1000000 trials \(alpha 10 x dropout 10 x lr 100 x rank 10 x seeds 10\), more than the limit of 10000.*--max-trials N" 30 200000 "$million" --dry-run
limited "--max-trials lower than the sweep" 2 "expands to 1000000 trials .* more than the limit of 50;" 30 200000 "$million" --dry-run --max-trials 50
limited "--max-trials raised: the memory limit still holds (exit 1: hit in the runner, after the file ran)" 1 "the Lua heap reached its limit of 64 MiB" 60 300000 "$million" --dry-run --max-trials 10000000 --max-lua-memory 64MiB
expect_run "bad --max-lua-memory" 2 "bad value for --max-lua-memory: lots" -- "$GM" "$TMP/case.lua" --max-lua-memory lots

expect_run "missing experiment file" 2 "cannot open" -- "$GM" /tmp/definitely_missing.lua
[ ! -e /tmp/gm_pwned ] && { pass=$((pass + 1)); echo "ok    nothing was written"; } || { fail=$((fail + 1)); echo "FAIL  /tmp/gm_pwned exists"; }

finish

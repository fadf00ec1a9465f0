#!/usr/bin/env bash
# The experiment-file interpreter is sandboxed: no os.execute, io.popen, file writes, require or
# binary chunks unless --allow-os; errors name the file and line.
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
lua_case "runtime error names file:line" 1 "case.lua:1: boom" 'error("boom")'
lua_case "env() default" 0 "^fallback$" 'print(env("GEMMARUN_SURELY_UNSET_VAR", "fallback"))'
lua_case "allowed with --allow-os" 0 "^opened$" 'local f = io.open("/dev/null", "r"); print(f and "opened")' --allow-os
lua_case "load_model bad path" 1 "no_such_model.*no such file" 'gm.load_model("/tmp/no_such_model")'
lua_case "generate unknown option" 1 "unknown option 'max_tokenz'" 'local m = gm.load_model("tests/ref/tiny_gemma3"); m:generate("x", {max_tokenz = 3})'
lua_case "generate: NaN temperature refused" 1 "temperature must be a finite number" 'local m = gm.load_model("tests/ref/tiny_gemma3"); m:generate("x", {temperature = 0/0})'
expect_run "missing experiment file" 2 "cannot open" -- "$GM" /tmp/definitely_missing.lua
[ ! -e /tmp/gm_pwned ] && { pass=$((pass + 1)); echo "ok    nothing was written"; } || { fail=$((fail + 1)); echo "FAIL  /tmp/gm_pwned exists"; }

finish

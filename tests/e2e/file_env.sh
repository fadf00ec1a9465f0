#!/usr/bin/env bash
# An experiment file runs in an environment of its own (lua/prelude.lua, M.file_env): a file
# that replaces a global (type, tostring, pairs, setmetatable, error, ...) or a library
# function (string.format, table.concat, ...) at its top level changes only its own copies.
# Its validation messages stay exactly those of the same file without the replacement, and a
# valid file runs exactly as it would (never a traceback from lua/prelude.lua or
# lua/runner.lua). On the tiny random Gemma 3 with a tokenizer and a labelled folder.
set -u
source "$(dirname "$0")/lib.bash"
GM=$(cd "$(dirname "$GM")" && pwd)/$(basename "$GM")
SRC=$(pwd)
cd "$TMP"
tiny_fixture "$SRC" 1
sed 's/rank = 4,/rnak = 4,/' tiny.lua > typo.lua
sed 's/lr = 1e-2, rank/lr = "fast", rank/' tiny.lua > type.lua

# make_case FIRST_LINE FILE OUT: OUT is FIRST_LINE, then FILE
make_case() { { printf '%s\n' "$1"; cat "$2"; } > "$3"; }
# run_case DIR FILE [ARGS]: runs FILE in DIR; its output and exit code go to DIR/FILE.out
run_case() { (cd "$1" && "$GM" "$2" "${@:3}" > "$2.out" 2>&1; echo "exit $?" >> "$2.out"); }
same() { diff -u "$1" "$2" && echo same; }

# The references (ref/): the files with a first line that replaces nothing. The cases (rep/):
# the same names, with a replacement as the first line, so that file and line in the
# messages match.
mkdir -p ref rep
ln -s ../data ref/data
ln -s ../data rep/data
# three_cases DIR FIRST_LINE: the valid file (dry run), the typo and the wrong type, each with
# FIRST_LINE as line 1, run in DIR
three_cases() {
  make_case "$2" tiny.lua "$1/g_ok.lua"
  make_case "$2" typo.lua "$1/g_typo.lua"
  make_case "$2" type.lua "$1/g_type.lua"
  run_case "$1" g_ok.lua --dry-run
  run_case "$1" g_typo.lua
  run_case "$1" g_type.lua
}
three_cases ref "-- nothing replaced"
expect_run "reference: the valid file's dry run" 0 "4 trials \(sweep over lr x 2 seeds\).*trial  4 .* plan [0-9.]+ MiB.*exit 0" -- cat ref/g_ok.lua.out
# the allowed keys are the training options' schema (gemmarun options), sorted
allowed=$("$GM" options | awk '/^  [a-z_0-9]+ /{print $1}' | LC_ALL=C sort | paste -sd, - | sed 's/,/, /g')
printf '%s\n' "gemmarun: error: g_typo.lua:6: train.rnak: unknown key (did you mean 'rank'?) (allowed: $allowed)" "exit 2" > want_typo.out
printf '%s\n' "gemmarun: error: g_type.lua:6: train.lr = \"fast\" (a string): must be a number >= 0" "exit 2" > want_type.out
expect_run "reference: a key typo's message" 0 "^same$" -- same want_typo.out ref/g_typo.lua.out
expect_run "reference: a wrong type's message" 0 "^same$" -- same want_type.out ref/g_type.lua.out

# replaced LINE: with LINE first, the valid file's dry run and both bad files' messages are
# the references', byte for byte
replaced() {
  three_cases rep "$1"
  expect_run "$1: the valid file runs (dry run)" 0 "^same$" -- same ref/g_ok.lua.out rep/g_ok.lua.out
  expect_run "$1: the key typo's message" 0 "^same$" -- same ref/g_typo.lua.out rep/g_typo.lua.out
  expect_run "$1: the wrong type's message" 0 "^same$" -- same ref/g_type.lua.out rep/g_type.lua.out
}
replaced 'type = nil'
replaced 'tostring = function() return "x" end'
replaced 'pairs = nil'
replaced 'string.format = nil'
replaced 'table.concat = nil'
replaced 'setmetatable = nil'
replaced 'error = print'
replaced 'ipairs = nil; next = nil; select = nil'
replaced 'math.floor = nil; math.type = nil; os.getenv = nil'
replaced 'gm.read_text = nil; gm.json_encode = nil; gm.sha256 = nil'

# ---- a full run with all of them: trial 1 trains, evaluates and renders the tables -------------
ALL='type = nil; tostring = function() return "x" end; pairs = nil; string.format = nil; table.concat = nil; setmetatable = nil; error = print'
make_case "$ALL" tiny.lua rep/g_ok.lua
run_case ref g_ok.lua --trial 1
run_case rep g_ok.lua --trial 1
expect_run "all replaced: trial 1 runs and the tables are written" 0 "written: results/tiny.md, results/tiny.tex, results/tiny.csv.*exit 0$" -- cat rep/g_ok.lua.out
expect_run "all replaced: no traceback" 0 "^clean$" -- bash -c "grep -q 'traceback\|lua/prelude.lua\|lua/runner.lua\|lua/report.lua' rep/g_ok.lua.out && echo found || echo clean"
# the same numbers as without the replacements (the memory lines measure the process: left out)
expect_run "all replaced: the same table as without them" 0 "^same$" -- bash -c "diff <(grep -v '^memory,' ref/results/tiny.csv) <(grep -v '^memory,' rep/results/tiny.csv) && echo same"

# ---- what the file's globals are -------------------------------------------------------------
lua_case() { # NAME WANT_EXIT PATTERN LUA_SOURCE [extra gemmarun args]
  local name=$1 want=$2 pat=$3 src=$4
  shift 4
  printf '%s\n' "$src" > case.lua
  expect_run "$name" "$want" "$pat" -- "$GM" case.lua "$@"
}
lua_case "load() of a text chunk keeps the file's globals" 0 "^42 true 42 5$" \
  'x = 41; local f = load("x = x + 1; return x, experiment ~= nil"); local a, b = f(); print(string.format("%s %s %s %s", a, b, x, load("return y", "c", "t", {y = 5})()))'
lua_case "_G is the file's own table; the runner's globals are not in it" 0 "^true true nil nil nil nil$" \
  'print(string.format("%s %s %s %s %s %s", _G == _ENV, _G.experiment == experiment, GM_PRELUDE, gm_module, GM_THREADS, GM_EXPERIMENT_BUILT))'
lua_case "table{} makes a report spec, table.* is the table library" 0 "^report a,b$" \
  'print(table{rows = {"lr"}}._kind .. " " .. table.concat({"a", "b"}, ","))'
lua_case "a file's assignments to a library stay in its copy" 0 "^nil function$" \
  'string.upper = nil; print(string.format("%s %s", string.upper, type(("x").upper)))'
printf 'helper_value = 7\n' > helper.lua
lua_case "with --allow-os, dofile'd code defines the file's globals" 0 "^7$" 'dofile("helper.lua"); print(helper_value)' --allow-os
lua_case "with --allow-os, replaced globals still leave validation alone" 2 \
  "^gemmarun: error: case.lua:1: experiment\{...\} expects a table$" 'type = nil; return experiment(5)' --allow-os

finish

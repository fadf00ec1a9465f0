# Shared helpers for the end-to-end tests (sourced). Each test prints one line per check and a
# closing "N passed, N failed" line; exit status 1 if anything failed.
GM=${1:?usage: test.sh path/to/gemmarun}
pass=0
fail=0
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# expect_run NAME WANT_EXIT PATTERN -- command...: runs the command, checks its exit status and
# that its combined output matches the extended regex PATTERN.
expect_run() {
  local name=$1 want=$2 pat=$3
  shift 4
  local out rc
  out=$("$@" 2>&1) && rc=0 || rc=$?
  if [ "$rc" = "$want" ] && printf '%s' "$out" | grep -Eq -- "$pat"; then
    pass=$((pass + 1))
    echo "ok    $name"
  else
    fail=$((fail + 1))
    echo "FAIL  $name: exit $rc (want $want), output did not match /$pat/:"
    printf '%s\n' "$out" | head -20 | sed 's/^/      /'
  fi
}

finish() {
  echo "$pass passed, $fail failed"
  [ "$fail" = 0 ]
}

real_model() {
  local p
  p=$("$GM" fetch gemma3-270m 2>/dev/null) || {
    echo "the real model is not in the cache: run \`$GM fetch gemma3-270m\`" >&2
    return 1
  }
  echo "$p"
}

#!/usr/bin/env bash
# The real Gemma 3 270M end to end through the command line and through Lua.
set -u
source "$(dirname "$0")/lib.bash"
MODEL=$(real_model) || { echo "0 passed, 1 failed"; exit 1; }

# Greedy text of the reference (transformers, tests/ref/gemma3_270m_ref.h5 /p0 greedy_text): the
# f32 dots compute transformers' numbers, and the report says which dots decoded
expect_run "generate --dot f32: transformers' greedy text" 0 "The capital of France is the capital of the country of France\. It is the largest city in France.*\(2 threads, f32 dots\)" \
  -- "$GM" generate gemma3-270m "The capital of France is" --max-tokens 16 --dot f32
# the default: llama.cpp's int8 dots (GM_GENERATE_DOT_DEFAULT, kernels.h): other numbers, the same
# first ten greedy words (the AVX2 and baseline int8 twins agree bit for bit, test_kernels; where the
# margin is thin the 11th word moves: " capital of the country of" replaces " largest city in France"
# on an AVX-512 Xeon, 2026-12-05, and on an AMD EPYC, 2026-12-06), and it says how fast
expect_run "generate (int8 dots, the default): the same first ten greedy words" 0 "The capital of France is the capital of the country of France\. It is the .*new tokens at [0-9.]+ tokens/s \(2 threads, int8 dots\)" \
  -- "$GM" generate gemma3-270m "The capital of France is" --max-tokens 16
expect_run "generate --int8-dot: the default's int8 dots, by their older name" 0 "new tokens at [0-9.]+ tokens/s \(2 threads, int8 dots\)" \
  -- "$GM" generate gemma3-270m "The capital of France is" --max-tokens 2 --int8-dot
# a model stored in f32 has no blocks for the int8 dots: it decodes in f32 whatever was asked, and says so
expect_run "generate on an f32 model: f32 dots, as the report says" 0 "new tokens at [0-9.]+ tokens/s \(2 threads, f32 dots\)" \
  -- "$GM" generate "$(pwd)/tests/ref/tiny_gemma3_chat" "hi" --max-tokens 2 --dot int8
# sampled generation: the text (stdout) and the report (stderr) apart; the text is the prompt and
# a continuation of the requested 12 tokens, the same for the same seed (with 2 threads or 1),
# another for another seed; the report counts the 12 tokens and nothing else is said
sample() { # SEED THREADS: sets out, err, rc
  rc=0
  out=$("$GM" generate gemma3-270m "Hello" --max-tokens 12 --temperature 1 --top-k 64 --top-p 0.95 --seed "$1" \
        --threads "$2" 2> "$TMP/err") || rc=$?
  err=$(cat "$TMP/err")
}
sample 7 2; a=$out; a_err=$err; a_rc=$rc
sample 7 1; b=$out; b_rc=$rc
sample 8 2; c=$out; c_rc=$rc
ntok=$(printf '%s' "$a_err" | sed -n 's/.* prompt tokens at .*, \([0-9]*\) new tokens at .*/\1/p')
[ "$a_rc$b_rc$c_rc" = 000 ] && [ "${a#Hello}" != "$a" ] && [ ${#a} -gt 12 ] && [ "$ntok" = 12 ] \
  && [ "$(printf '%s\n' "$a_err" | grep -vc "^gemmarun: .* prompt tokens at .* new tokens at ")" = 0 ] \
  && { pass=$((pass + 1)); echo "ok    sampled: 'Hello' and 12 new tokens ('${a#Hello}'), one report line on stderr"; } \
  || { fail=$((fail + 1)); echo "FAIL  sampled generation: exit $a_rc/$b_rc/$c_rc, text '$a', stderr '$a_err'"; }
[ -n "$a" ] && [ "$a" = "$b" ] && { pass=$((pass + 1)); echo "ok    same seed, different thread count: same text"; } \
  || { fail=$((fail + 1)); echo "FAIL  sampled text depends on the thread count: '$a' vs '$b'"; }
[ -n "$c" ] && [ "$a" != "$c" ] && { pass=$((pass + 1)); echo "ok    another seed, another text ('${c#Hello}')"; } \
  || { fail=$((fail + 1)); echo "FAIL  seeds 7 and 8 give the same text '$a'"; }
expect_run "inspect" 0 "q8_0\[262144, 640\]" -- "$GM" inspect gemma3-270m
expect_run "lua API" 0 "lua api ok" -- "$GM" tests/lua/model_api.lua
expect_run "quickstart: dry run lists the 8 trials" 0 "experiment quickstart: 8 trials \(sweep over lr, quant x 2 seeds\).*trial  8 .*lr=0.001 quant=nf4 seed=2  plan" -- "$GM" experiments/quickstart.lua --dry-run
# one quickstart trial (trial 3: NF4 base, lr 3e-4, seed 1; all 30 steps, ~2 min) on the real model and
# the real fortunes, in a scratch folder
SRC=$(pwd)
expect_run "quickstart: one real trial end to end" 0 "baseline accuracy [0-9.]+%.*final accuracy [0-9.]+%.*quickstart: accuracy \(%\).*written: results/quickstart.md" -- bash -c "cd '$TMP' && '$GM' '$SRC/experiments/quickstart.lua' --trial 3"

# that trial reproduced from its stored experiment text: the same build, threads and device, so
# every series, evaluation and adapter tensor must come out bit for bit (~2 min more)
expect_run "quickstart: the real trial reproduces bit for bit" 0 "reproducing trial 3 .*bit-identical: every logged series \(30 steps\), every evaluation \(accuracy [0-9.]+%\) and the adapter: [0-9]+ datasets, [0-9]+ values, no difference" -- bash -c "cd '$TMP' && '$GM' reproduce results/quickstart --trial 3"
# generation with that trial's adapter: the fine-tuned model answers the quickstart question with
# one of the five topic words for a quote of each topic; the base model does not (it continues the
# prompt) - the same question in the chat template the trial trained on
Q="Which topic is this quote about? Answer with one word: computers, food, love, science or sports."
topics="computers food love science sports"
n_topic=0; n_base=0
for topic in $topics; do
  quote=$(awk -v RS='\n%\n' 'NR==30{print; exit}' "/usr/share/games/fortunes/$topic" | head -c 250)
  ans=$(cd "$TMP" && "$GM" generate gemma3-270m --adapter results/quickstart --trial 3 --chat "$Q

$quote" --max-tokens 3 2>/dev/null | head -1)
  base=$("$GM" generate gemma3-270m --chat "$Q

$quote" --max-tokens 3 2>/dev/null | head -1)
  echo "      $topic quote: fine-tuned '$ans', base '$base'"
  for t in $topics; do [ "$ans" = "$t" ] && n_topic=$((n_topic + 1)); [ "$base" = "$t" ] && n_base=$((n_base + 1)); done
done
[ "$n_topic" = 5 ] && [ "$n_base" = 0 ] && { pass=$((pass + 1)); echo "ok    generate --adapter: the fine-tuned model answers with a topic word (5 of 5), the base model does not"; } \
  || { fail=$((fail + 1)); echo "FAIL  generate --adapter: $n_topic of 5 fine-tuned answers are topic words, $n_base of 5 base answers"; }
# the same through the Lua API: m:generate{adapter = ..., trial = ...} answers as the command line does
quote=$(awk -v RS='\n%\n' 'NR==30{print; exit}' /usr/share/games/fortunes/food | head -c 250)
cli=$(cd "$TMP" && "$GM" generate gemma3-270m --adapter results/quickstart --trial 3 --chat "$Q

$quote" --max-tokens 3 2>/dev/null | head -1)
printf 'local m <close> = gm.load_model("gemma3-270m")\nlocal q = os.getenv("Q") .. "\\n\\n" .. os.getenv("QUOTE")\nlocal a = m:generate(q, { chat = true, max_tokens = 3, adapter = "results/quickstart", trial = 3 })\nlocal b = m:generate(q, { chat = true, max_tokens = 3 })\nprint("tuned=" .. (a:match("[^\\n]*")) .. " base=" .. (b:match("[^\\n]*")))\n' > "$TMP/gen.lua"
lua=$(cd "$TMP" && Q="$Q" QUOTE="$quote" "$GM" gen.lua 2>&1)
[ "$lua" = "tuned=$cli base=Which topic is" ] && { pass=$((pass + 1)); echo "ok    m:generate{adapter = ...} answers '$cli' as the command line does; without it the model continues the prompt"; } \
  || { fail=$((fail + 1)); echo "FAIL  Lua generate with the quickstart adapter: '$lua' (command line: '$cli')"; }

# that trial's adapter exported as a PEFT adapter folder, loaded by real PEFT on transformers' own
# float32 dequantization of the same GGUF: the logits after a 9-token prompt match ours (issue 13)
expect_run "export the real trial's adapter for PEFT" 0 "exported trial 3 .*126 LoRA modules, rank 8, alpha 16.*google/gemma-3-270m" \
  -- bash -c "cd '$TMP' && '$GM' export results/quickstart --trial 3 peft3"
peers_python
if [ -z "$PEERS" ]; then
  skip_unless_ci "PEFT round trip of the real adapter: no Python with torch, transformers and peft (tests/peers/setup.sh)"
else
  IDS=2,818,5279,529,7001,563,1401,506,3707
  (cd "$TMP" && MODEL=gemma3-270m IDS=$IDS OUT=results/real_peft3.txt ADAPTER=peft3 LAST=1 "$GM" "$SRC/tests/peers/logits.lua" >/dev/null)
  expect_run "PEFT on the real 270M with the exported adapter: the same logits within $(tol TOL_ADAPTER_PEER_REAL_ABS)" 0 \
    "ok +logits with the adapter.*over 262144 logits.*ok +the adapter moves.*ok +same next token" \
    -- "$PEERS" "$SRC/tests/peers/peft_check.py" compare --base "$MODEL" --adapter "$TMP/peft3" --ids $IDS \
       --ours "$TMP/results/real_peft3.txt" --tol "$(tol TOL_ADAPTER_PEER_REAL_ABS)" --last
fi
# ... and as the start of a new experiment (model_adapter): the quickstart's trial 3 again (NF4,
# lr 3e-4, seed 1) from that folder, one step: its baseline evaluation is trial 3's final one,
# prediction for prediction (issue 13)
expect_run "model_adapter on the real 270M: the quickstart from the exported adapter, one step" 0 \
  "starting from the adapter peft3.*baseline accuracy [0-9.]+%.*written: results/cont.md" \
  -- bash -c "cd '$TMP' && '$GM' '$SRC/experiments/quickstart.lua' --trial 3 --set name=cont --set model_adapter=peft3 --set max_steps=1"
expect_run "... whose baseline is trial 3's final evaluation, prediction for prediction" 0 \
  "baseline = trial 3's final on 80 examples \(which differs from the base model's\)" \
  -- bash -c "cd '$TMP' && SRC=results/quickstart SRC_INDEX=3 CONT=results/cont CONT_INDEX=3 '$GM' '$SRC/tests/e2e/start_check.lua'"
# ... and as a llama.cpp LoRA adapter, applied by llama.cpp itself to the same GGUF (llama-cpp-python
# built from source in the peers venv): logits within llama.cpp's own distance from us, the
# adapter's effect alike, the same greedy continuation
expect_run "export the real trial's adapter for llama.cpp" 0 "exported trial 3 .*126 LoRA modules, rank 8, alpha 16, as a llama.cpp LoRA adapter: lora3.gguf" \
  -- bash -c "cd '$TMP' && '$GM' export results/quickstart --trial 3 --format gguf lora3.gguf"
# the quickstart's question about a food quote in the chat template the trial trained on: the
# fine-tuned model answers "food" (ids from our tokenizer, in results/chat_lora3.txt.ids)
TEXT="<start_of_turn>user
$Q

$quote<end_of_turn>
<start_of_turn>model
"
(cd "$TMP" && MODEL=gemma3-270m TEXT="$TEXT" OUT=results/chat_lora3.txt ADAPTER=results/quickstart TRIAL=3 LAST=1 GREEDY=3 \
   "$GM" "$SRC/tests/peers/logits.lua" >/dev/null && MODEL=gemma3-270m IDS="$(cat results/chat_lora3.txt.ids)" \
   OUT=results/chat_base.txt LAST=1 "$GM" "$SRC/tests/peers/logits.lua" >/dev/null)
CHAT_IDS=$(cat "$TMP/results/chat_lora3.txt.ids")
LLAMA=1
if [ -z "$PEERS" ] || ! "$PEERS" -c "import llama_cpp" 2>/dev/null; then LLAMA=; fi
if [ -z "$LLAMA" ]; then
  skip_unless_ci "llama.cpp round trip of the real adapter: no Python with llama_cpp (tests/peers/setup.sh)"
else
  expect_run "llama.cpp applies the exported GGUF adapter: logits, the adapter's effect and 3 greedy tokens as ours" 0 \
    "ok +logits with the adapter.*ok +the adapter's effect.*ok +the adapter moves.*ok +greedy continuation" \
    -- "$PEERS" "$SRC/tests/peers/llama_check.py" compare --model "$MODEL" --lora "$TMP/lora3.gguf" \
       --ids "$CHAT_IDS" --ours "$TMP/results/chat_lora3.txt" --ours-base "$TMP/results/chat_base.txt" \
       --greedy "$TMP/results/chat_lora3.txt.greedy" --tol "$(tol TOL_ADAPTER_LLAMA_REAL_ABS)" \
       --min-corr "$(tol TOL_ADAPTER_LLAMA_EFFECT_CORR_MIN)" --tol-slope "$(tol TOL_ADAPTER_LLAMA_SLOPE_ABS)"
fi

# ---- the trial merged into the model (issue 13) ------------------------------------------------
# As a Hugging Face folder: transformers loads it with the logits of gemmarun with the adapter
# attached, and AutoTokenizer reads the tokenizer.json built from the GGUF vocabulary with our ids
# and the chat template; as GGUF (f16, the default, and Q8_0): llama.cpp runs it with our logits
# and greedy tokens, and our Q8_0 is llama.cpp's own quantization byte for byte; gemmarun reads
# the merged files too.
expect_run "export the real trial merged, as a Hugging Face folder (f32)" 0 \
  "merged trial 3 .*126 of 236 weights carry the adapter; f32, 1022.7 MiB.*tokenizer: built from the GGUF vocabulary" \
  -- bash -c "cd '$TMP' && '$GM' export results/quickstart --trial 3 --format merged --dtype f32 m3"
for dt in f16 q8_0 f32; do
  expect_run "... as a GGUF file, $dt" 0 "merged trial 3 .*126 of 236 weights carry the adapter; $dt.*written: m3_$dt.gguf" \
    -- bash -c "cd '$TMP' && '$GM' export results/quickstart --trial 3 --format merged --dtype $dt m3_$dt.gguf"
done
TOLM=$(tol TOL_MERGED_PEER_REAL_ABS)
(cd "$TMP" && MODEL=m3_f32.gguf IDS="$CHAT_IDS" OUT=results/chat_m3.txt LAST=1 "$GM" "$SRC/tests/peers/logits.lua" >/dev/null)
expect_run "gemmarun reads its merged GGUF: the logits of the adapter attached within $TOLM" 0 "^ok " -- python3 -c "
a = [float(x) for x in open('$TMP/results/chat_lora3.txt')]; b = [float(x) for x in open('$TMP/results/chat_m3.txt')]
d = max(abs(x - y) for x, y in zip(a, b))
print(('ok ' if len(a) == len(b) == 262144 and d <= $TOLM else 'FAIL ') + f'{d:.3g} over {len(b)} logits')"
if [ -z "$PEERS" ]; then
  skip_unless_ci "the merged folder in transformers: no Python with torch and transformers (tests/peers/setup.sh)"
else
  expect_run "transformers loads the merged folder: logits within $TOLM of gemmarun with the adapter" 0 \
    "ok +config.json says float32 and all 236 tensors are F32.*ok +merged model in transformers.*over 262144 logits.*ok +the adapter moves.*ok +same next token" \
    -- "$PEERS" "$SRC/tests/peers/peft_check.py" merged --model "$TMP/m3" --ids "$CHAT_IDS" --ours "$TMP/results/chat_lora3.txt" \
       --ours-base "$TMP/results/chat_base.txt" --tol "$TOLM" --last
  cat > "$TMP/texts.json" <<'EOF'
["What is a good breakfast?", "Hello, world!", "  two leading spaces and   three inside", "naïve café 🙂 Ünïcödé — ok",
 "Line 1\n\nLine 2\tTabbed\n", "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", "<h1>Title</h1> <b>bold</b>",
 "数学はたのしい。", "x = [i**2 for i in range(10)]  # squares", "                                         forty spaces"]
EOF
  (cd "$TMP" && MODEL=gemma3-270m TEXTS=texts.json OUT=results/cases.json "$GM" "$SRC/tests/peers/tokens.lua" >/dev/null)
  expect_run "AutoTokenizer reads the exported tokenizer: our ids on 10 texts, decoded back, and the chat template's ids" 0 \
    "ok +the exported tokenizer \(GemmaTokenizer\) gives gemmarun's ids on all 10 texts.*ok +it decodes.*ok +the folder's chat template" \
    -- "$PEERS" "$SRC/tests/peers/peft_check.py" tokenizer --model "$TMP/m3" --cases "$TMP/results/cases.json" \
       --chat "$Q

$quote" --chat-ids "$TMP/results/chat_lora3.txt.ids"
fi
rm -rf "$TMP/m3"
if [ -n "$LLAMA" ]; then
  expect_run "llama.cpp runs the merged f16 GGUF: logits within $(tol TOL_MERGED_LLAMA_F16_ABS) of ours with the adapter, the same 3 greedy tokens" 0 \
    "ok +the file carries Gemma's chat template.*ok +merged model in llama.cpp.*ok +the adapter moves.*ok +greedy continuation" \
    -- "$PEERS" "$SRC/tests/peers/llama_check.py" merged --model "$TMP/m3_f16.gguf" --ids "$CHAT_IDS" --ours "$TMP/results/chat_lora3.txt" \
       --ours-base "$TMP/results/chat_base.txt" --greedy "$TMP/results/chat_lora3.txt.greedy" --tol "$(tol TOL_MERGED_LLAMA_F16_ABS)"
  expect_run "... and the Q8_0 GGUF within $(tol TOL_MERGED_LLAMA_Q8_0_ABS)" 0 \
    "ok +merged model in llama.cpp.*ok +the adapter moves.*ok +greedy continuation" \
    -- "$PEERS" "$SRC/tests/peers/llama_check.py" merged --model "$TMP/m3_q8_0.gguf" --ids "$CHAT_IDS" --ours "$TMP/results/chat_lora3.txt" \
       --ours-base "$TMP/results/chat_base.txt" --greedy "$TMP/results/chat_lora3.txt.greedy" --tol "$(tol TOL_MERGED_LLAMA_Q8_0_ABS)"
  expect_run "our Q8_0 GGUF is llama.cpp's own quantization of the f32 one, byte for byte" 0 \
    "ok +all 236 tensors equal llama.cpp's own quantization byte for byte \(127 in Q8_0" \
    -- "$PEERS" "$SRC/tests/peers/llama_check.py" quantize --f32 "$TMP/m3_f32.gguf" --ours "$TMP/m3_q8_0.gguf"
fi
rm -f "$TMP"/m3_*.gguf

finish

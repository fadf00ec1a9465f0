#!/usr/bin/env bash
# Bad input through the command line: every case gives one clear message and the documented
# exit code (2 = bad usage or bad input), never a crash.
set -u
source "$(dirname "$0")/lib.bash"
MODEL=$(real_model) || { echo "0 passed, 1 failed"; exit 1; }

expect_run "unknown command" 2 "unknown command 'frobnicate'" -- "$GM" frobnicate
expect_run "help" 0 "usage:" -- "$GM" --help
# OpenMP threads spin 3000 iterations, then sleep, unless the user chose (kernels/kernels.h,
# gm_kernels_startup: libgomp's 300000 made a step 3.8x slower beside one busy process, no spin at
# all halved decoding's speed); libgomp prints what it read at start-up (the spin count is what tells)
expect_run "OpenMP waits spin briefly by default" 0 "GOMP_SPINCOUNT = '3000'" -- env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT OMP_DISPLAY_ENV=verbose "$GM" --version
expect_run "OMP_WAIT_POLICY set by the user is kept" 0 "OMP_WAIT_POLICY = 'ACTIVE'" -- env -u GOMP_SPINCOUNT OMP_WAIT_POLICY=active OMP_DISPLAY_ENV=true "$GM" --version
expect_run "GOMP_SPINCOUNT set by the user is kept" 0 "GOMP_SPINCOUNT = '1234'" -- env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=1234 OMP_DISPLAY_ENV=verbose "$GM" --version
# OpenBLAS on its AVX2 / AVX-512 kernels where the CPU has them (kernels.h, gm_kernels_startup: Debian's
# OpenBLAS 0.3.21 took a 2023 Xeon for a "Prescott" and ran sgemm 4x slower); the user's choice kept
old_cores='Prescott|Core2|Penryn|Dunnington|Nehalem|Sandybridge|Atom|Katmai|Coppermine|Northwood|Banias|Opteron|Barcelona|Bobcat|Bulldozer|Piledriver|Steamroller|Excavator|Unknown'
if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
  expect_run "OpenBLAS runs an AVX2 or newer core on this AVX2 CPU" 0 "BLAS: OpenBLAS .*(Haswell|SkylakeX|Cooperlake|SapphireRapids|Zen)" -- env -u OPENBLAS_CORETYPE "$GM" --version
  if env -u OPENBLAS_CORETYPE "$GM" --version | grep -Eqw "$old_cores"; then
    fail=$((fail + 1)); echo "FAIL  OpenBLAS fell back to a pre-AVX2 core: $(env -u OPENBLAS_CORETYPE "$GM" --version | grep BLAS)"
  else
    pass=$((pass + 1)); echo "ok    OpenBLAS's core is not a pre-AVX2 fallback"
  fi
else
  expect_run "OpenBLAS's own core choice on a CPU without AVX2" 0 "BLAS: OpenBLAS" -- env -u OPENBLAS_CORETYPE "$GM" --version
fi
expect_run "OPENBLAS_CORETYPE set by the user is kept" 0 "BLAS: OpenBLAS .* Prescott " -- env OPENBLAS_CORETYPE=Prescott "$GM" --version
expect_run "inspect: missing file" 2 "/no/such/model.gguf: no such file" -- "$GM" inspect /no/such/model.gguf
expect_run "inspect: missing config key" 2 "config.json: missing key 'head_dim'" -- "$GM" inspect tests/ref/bad/missing_key
expect_run "inspect: weights do not match config" 2 "tensor 'model.layers.0.mlp.gate_proj.weight' has shape \[128, 64\], but the config implies \[100, 64\]" -- "$GM" inspect tests/ref/bad/shape_mismatch
expect_run "fetch: unknown name" 2 "unknown model name 'gemma9' \(known: gemma3-270m\)" -- "$GM" fetch gemma9
expect_run "generate: no tokenizer" 2 "has no tokenizer" -- "$GM" generate tests/ref/tiny_gemma3 "hello"
expect_run "generate: bad option value" 2 "bad value for --max-tokens" -- "$GM" generate "$MODEL" "x" --max-tokens -3

# Damaged copies of the real GGUF.
head -c 3000000 "$MODEL" > "$TMP/truncated.gguf"
expect_run "truncated GGUF" 2 "truncated.gguf.*(truncated|past the end)" -- "$GM" inspect "$TMP/truncated.gguf"
{ printf 'GGUX'; tail -c +5 "$MODEL" | head -c 100000; } > "$TMP/badmagic.gguf"
expect_run "wrong magic" 2 "badmagic.gguf.*magic" -- "$GM" inspect "$TMP/badmagic.gguf"
cp tests/ref/tiny_gemma3/config.json "$TMP/config.json"
head -c 5000 tests/ref/tiny_gemma3/model.safetensors > "$TMP/model.safetensors"
expect_run "truncated safetensors" 2 "model.safetensors.*(truncated|past the end|beyond|end of the file|bytes)" -- "$GM" inspect "$TMP"
printf 'not a model' > "$TMP/junk.gguf"
expect_run "junk file" 2 "junk.gguf" -- "$GM" inspect "$TMP/junk.gguf"

expect_run "generate: --max-tokens overflow" 2 "bad value for --max-tokens" -- "$GM" generate "$MODEL" "x" --max-tokens 9223372036854775807
expect_run "generate: past the context" 2 "exceed the model's context of 32768 positions" -- "$GM" generate "$MODEL" "x" --max-tokens 40000
expect_run "generate: infinite temperature" 2 "bad value for --temperature" -- "$GM" generate "$MODEL" "x" --temperature inf
expect_run "generate: unknown dots" 2 "bad value for --dot: bf16 \(int8 or f32\)" -- "$GM" generate "$MODEL" "x" --dot bf16
expect_run "inspect: a pipe is not a model" 2 "not a regular file \(a pipe\)" -- bash -c "mkfifo '$TMP/fifo' && timeout 10 '$GM' inspect '$TMP/fifo'"
expect_run "inspect: config.json is a folder" 2 "config.json: not a regular file \(a folder\)" -- bash -c "mkdir -p '$TMP/cj/config.json' && '$GM' inspect '$TMP/cj'"
printf '{"model_type": "llama", "hidden_size": 64}' > "$TMP/llama.json"
mkdir -p "$TMP/llama" && cp "$TMP/llama.json" "$TMP/llama/config.json"
expect_run "inspect: not a Gemma 3 config" 2 "model_type 'llama' is not supported" -- "$GM" inspect "$TMP/llama"

# plan: values beyond the allowed ranges are refused with the range, never wrapped into a small
# plan (a batch of 2^52 used to plan as 456 MiB and "fit" 1 GiB)
expect_run "plan: batch overflow" 2 "bad value for batch: 4503599627370496 \(expected an integer 1\.\.65536\)" -- "$GM" plan gemma3-270m batch=4503599627370496 memory_limit=1GiB
expect_run "plan: grad_accum out of range" 2 "bad value for grad_accum: 65537 \(expected an integer 1\.\.65536\)" -- "$GM" plan gemma3-270m grad_accum=65537
expect_run "plan: max_length out of range" 2 "bad value for max_length: 1048577 \(expected an integer 8\.\.1048576\)" -- "$GM" plan gemma3-270m max_length=1048577
expect_run "plan: memory_limit out of range" 2 "bad value for memory_limit: 1e30 \(expected a size from 1 byte to 2\^60 bytes" -- "$GM" plan gemma3-270m memory_limit=1e30
expect_run "plan: largest batch still plans" 0 "batch 65536 x accumulation 65536" -- "$GM" plan gemma3-270m batch=65536 grad_accum=65536 max_length=32768
expect_run "plan: small memory_limit in its unit" 1 "memory_limit 1\.00 KiB: does NOT fit" -- "$GM" plan gemma3-270m memory_limit=1KiB
expect_run "plan: image inputs on a text model" 2 "error: Gemma 3 270m takes no image inputs" -- "$GM" plan gemma3-270m images=1
expect_run "plan: images with pan_and_scan=true are planned as their worst case, 5 views each" 0 \
  "images per example: 1 with pan & scan: planned as 5 views, the worst case.*vision tower .*\(5 images per micro-batch" -- \
  "$GM" plan gemma3-4b quant=nf4 rank=16 max_length=2048 batch=1 images=1 pan_and_scan=true
expect_run "plan: image inputs on the 1B (text only): no tower" 2 "error: gemma3-1b takes no image inputs: it has no vision tower" -- \
  "$GM" plan gemma3-1b images=1
expect_run "plan: images that leave no room for text in max_length" 2 \
  "max_length = 512 leaves no room for text beside 2 images \(256 soft tokens \+ 2 markers each = 516 positions" -- \
  "$GM" plan gemma3-4b images=2 max_length=512
# a multimodal size plans images from its name: the tower's share is a line of its own (weights,
# activations for the micro-batch's images, pixel staging); without images there is no such line
expect_run "plan: gemma3-4b with an image itemizes the vision tower" 0 \
  "4\.30B parameters.*images per example: 1.*  vision tower +[0-9.]+ MiB +\(4 images per micro-batch: weights bf16 807\.1 MiB \(memory-mapped\), activations [0-9.]+ MiB, pixel staging 36\.9 MiB\).*total" -- \
  "$GM" plan gemma3-4b images=1 batch=4 max_length=512 rank=64 alpha=64 quant=nf4
expect_run "plan: gemma3-27b with an image" 0 "vision tower +[0-9.]+ MiB +\(2 images per micro-batch" -- \
  "$GM" plan gemma3-27b images=1 batch=2 max_length=512 quant=nf4
expect_run "plan: gemma3-4b text only has no tower line" 0 "4\.30B parameters.*total.*no tower line" -- bash -c \
  "out=\$('$GM' plan gemma3-4b batch=4 max_length=512 quant=nf4 2>&1); rc=\$?; echo \"\$out\"; printf '%s\n' \"\$out\" | grep -q 'vision tower' || echo 'no tower line'; exit \$rc"
# the core's reason follows on its own indented line, with no whitespace-only line before it
expect_run "plan: bad quant, no blank line" 2 "bad value for quant: nf5 \(expected stored, gguf, f32, bf16, nf4, int8\).no blank line" -- bash -c \
  "out=\$('$GM' plan gemma3-270m quant=nf5 2>&1); rc=\$?; echo \"\$out\"; printf '%s\n' \"\$out\" | grep -q '^[[:space:]]*\$' || echo 'no blank line'; exit \$rc"
expect_run "plan: fit without memory_limit" 2 "fit requires memory_limit" -- "$GM" plan gemma3-270m fit=true
expect_run "plan: fit=yes like checkpointing=yes" 0 "activation checkpointing on" -- "$GM" plan gemma3-270m fit=yes checkpointing=yes memory_limit=8GiB
expect_run "plan: fit=maybe" 2 "bad value for fit: maybe \(expected on/off, true/false, yes/no or 1/0\)" -- "$GM" plan gemma3-270m fit=maybe memory_limit=8GiB
expect_run "plan: checkpointing=maybe" 2 "bad value for checkpointing: maybe \(expected on/off, true/false, yes/no or 1/0\)" -- "$GM" plan gemma3-270m checkpointing=maybe

# the training options' one schema: docs/experiments.md holds exactly what `gemmarun options --markdown` prints
opts_md=$("$GM" options --markdown)
grep -qF -- "$opts_md" docs/experiments.md && [ "$(printf '%s\n' "$opts_md" | wc -l)" -gt 20 ] \
  && { pass=$((pass + 1)); echo "ok    docs/experiments.md's training table is gemmarun options --markdown"; } \
  || { fail=$((fail + 1)); echo "FAIL  docs/experiments.md's training table differs from gemmarun options --markdown"; }
expect_run "plan: the schema's defaults (rank 8, alpha 8, batch 8, max_length 1024)" 0 "LoRA rank 8 alpha 8 on all-linear .*batch 8 x accumulation 1, max_length 1024" -- "$GM" plan gemma3-270m
expect_run "plan: a regex for targets" 0 "on .\*self_attn.* \(0\.4M trainable\)" -- "$GM" plan gemma3-270m 'targets=.*self_attn\.(q|v)_proj'
expect_run "plan: a bad regex" 2 "targets '\(q_proj': not a valid regular expression" -- "$GM" plan gemma3-270m 'targets=(q_proj'
expect_run "plan: an unknown module" 2 "unknown target module 'qproj' \(allowed: all-linear, q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, or a regular expression\)" -- "$GM" plan gemma3-270m targets=qproj
expect_run "options: an unknown argument" 2 "usage: gemmarun options \[--markdown\]" -- "$GM" options --html

# Devices (core/backend/gm_backend.c: gm_backend_open). CUDA_VISIBLE_DEVICES= hides every GPU, so
# the "no GPU" path is taken on any machine; in a CUDA build it proves the CUDA module loads (all
# its references into the program resolve: dlopen RTLD_NOW) and reports the runtime's own reason.
expect_run "generate: unknown device" 2 "bad value for --device: tpu \(cpu, cuda or cuda:N\)" -- "$GM" generate "$MODEL" "x" --device tpu
if [ -f "$(dirname "$GM")/libgemmarun_cuda.so" ]; then
  NO_GPU='device "cuda": no GPU found: .*hint: run on a machine with an NVIDIA GPU'
else
  NO_GPU='device "cuda": this gemmarun was built without CUDA'
fi
expect_run "generate: device cuda without a GPU" 2 "$NO_GPU" -- env CUDA_VISIBLE_DEVICES= "$GM" generate "$MODEL" "x" --device cuda
expect_run "generate: a missing CUDA module" 2 'the CUDA module /no/such/module.so is missing|built without CUDA' -- env GEMMARUN_CUDA_MODULE=/no/such/module.so "$GM" generate "$MODEL" "x" --device cuda:1
expect_run "plan: device=cuda splits the plan (no GPU needed)" 0 "on the GPU \(device cuda\):.*CUDA context +512\.0 MiB.*memory_limit 1\.00 GiB \(the GPU's\): fits" -- "$GM" plan gemma3-270m device=cuda memory_limit=1GiB max_length=128 batch=1
expect_run "plan: device=cuda with fit" 2 "fit with device=cuda is not supported yet" -- "$GM" plan gemma3-270m device=cuda memory_limit=1GiB fit=true
expect_run "plan: unknown device" 2 "bad value for device: tpu \(expected cpu, cuda or cuda:N\)" -- "$GM" plan gemma3-270m device=tpu
# an experiment stops before its first trial, its finished results kept
GM_ABS=$(cd "$(dirname "$GM")" && pwd)/$(basename "$GM")
mkdir -p "$TMP/dev/results/quickstart" && echo kept > "$TMP/dev/results/quickstart/finished.txt"
expect_run "experiment: --device cuda without a GPU" 2 "experiment.device: $NO_GPU" -- env CUDA_VISIBLE_DEVICES= bash -c "cd '$TMP/dev' && '$GM_ABS' --device cuda"
if [ "$(ls "$TMP/dev/results/quickstart")" = finished.txt ] && [ "$(cat "$TMP/dev/results/quickstart/finished.txt")" = kept ]; then
  pass=$((pass + 1)); echo "ok    experiment: results kept after the device error"
else
  fail=$((fail + 1)); echo "FAIL  experiment: results changed after the device error: $(ls "$TMP/dev/results/quickstart")"
fi
expect_run "experiment: a dry run plans for a GPU without one" 0 "trial  1 .* on cuda: GPU [0-9.]+ GiB \(arenas [0-9.]+ MiB, CUDA context 512\.0 MiB, estimate\), host" -- env CUDA_VISIBLE_DEVICES= bash -c "cd '$TMP/dev' && '$GM_ABS' --dry-run --device cuda"
expect_run "experiment: unknown device" 2 'experiment.device = "gpu": must be "cpu", "cuda" or "cuda:N"' -- bash -c "cd '$TMP/dev' && '$GM_ABS' --set device=gpu"
expect_run "experiment: --device with a bad value" 2 "bad value for --device: cuda:x" -- bash -c "cd '$TMP/dev' && '$GM_ABS' --device cuda:x"
# compute = "bf16" needs bf16 GEMMs (a GPU, or a CPU with AVX512-BF16 / AMX): on a CPU without them
# refused before any trial, in the dry run too (DNNL_MAX_CPU_ISA caps what oneDNN may use: a CPU
# without bf16 on any machine); where the CPU has them, planned; on cuda the dry run plans it
expect_run "experiment: compute = bf16 on a CPU without bf16: refused, naming the field" 2 \
  'set compute=bf16: train.compute = "bf16": device cpu computes in f32 only.*hint: use compute = "auto"' -- \
  env DNNL_MAX_CPU_ISA=AVX512_CORE_VNNI bash -c "cd '$TMP/dev' && '$GM_ABS' --set compute=bf16 --dry-run"
if "$GM" --version | grep -q "bf16 GEMMs on this CPU: native"; then
  expect_run "experiment: compute = bf16 on a CPU with AVX512-BF16: planned" 0 "trial  1 .* plan [0-9.]+ MiB" -- \
    bash -c "cd '$TMP/dev' && '$GM_ABS' --set compute=bf16 --dry-run"
else
  expect_run "experiment: compute = bf16 on this CPU (no AVX512-BF16): refused" 2 'device cpu computes in f32 only' -- \
    bash -c "cd '$TMP/dev' && '$GM_ABS' --set compute=bf16 --dry-run"
fi
expect_run "experiment: compute = bf16 on cuda: planned" 0 "trial  1 .* on cuda: GPU" -- \
  env CUDA_VISIBLE_DEVICES= bash -c "cd '$TMP/dev' && '$GM_ABS' --set compute=bf16 --dry-run --device cuda"
expect_run "experiment: compute = fp8: not a value" 2 'compute.*auto, bf16, f32' -- bash -c "cd '$TMP/dev' && '$GM_ABS' --set compute=fp8 --dry-run"

finish

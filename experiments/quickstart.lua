-- experiments/quickstart.lua - the embedded default (what `gemmarun` runs with no arguments).
--
-- Loads the real Gemma 3 270M (fetched by `gemmarun fetch gemma3-270m`) and continues a few
-- prompts greedily. The LoRA sweep on real data replaces this once training lands.
local model_name = env("GEMMA_MODEL", "gemma3-270m")
local m <close> = gm.load_model(model_name)
local cfg = m:config()
print(string.format("model: %s, %d layers, hidden %d, %.0fM parameters",
  cfg.name, cfg.num_hidden_layers, cfg.hidden_size, cfg.n_params / 1e6))

local prompts = {
  "The capital of France is",
  "def fibonacci(n):",
  "Once upon a time, in a small village,",
}
for _, p in ipairs(prompts) do
  local text, info = m:generate(p, { max_tokens = 32 })
  print(string.format("\n>>> %s%s", p, text))
  print(string.format("    (%d prompt tokens, %d new tokens, %.1f tokens/s decoding)",
    info.prompt_tokens, info.new_tokens, info.decode_tokens_per_s))
end

local base = { epochs = tonumber(env("EPOCHS", "1")), quant = "nf4", targets = {"q_proj", "v_proj"} }
return experiment {
  name = "chat",
  model = "model.gguf",
  task = sft { data = data.jsonl { train = "train.jsonl", test_fraction = 0.2 } },
  train = base,
  sweep = grid { max_length = {128, 256}, alpha = {8, 16}, dropout = {0, 0.05} },
  seeds = {7},
  memory_limit = "2 GiB", fit = true,
  report = table { rows = {"max_length"}, metric = "loss" },
}

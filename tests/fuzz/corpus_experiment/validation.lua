return experiment {
  name = "val",
  model = "tests/ref/tiny_gemma3_chat",
  task = sft { data = data.jsonl { train = "chat.jsonl", test_fraction = 0.2 } },
  train = { epochs = 2, batch = 2, lr = 1e-2, rank = 4, max_length = 64 },
  validation = { split = 0.25, eval_steps = 4, select = "best", patience = 2, data = data.jsonl { train = "v.jsonl" } },
  seeds = { 1, 2 },
}

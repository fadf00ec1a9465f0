return experiment {
  name = "tiny",
  model = "tests/ref/tiny_gemma3_chat",
  task = classify { data = data.folder { root = "data" }, prompt = "Which fruit?" },
  train = { epochs = 3, batch = 2, lr = 1e-2, rank = 4, alpha = 8, max_length = 64, checkpoint_every = 5 },
  sweep = grid { lr = {1e-2, 3e-3}, rank = {4, 8} },
  seeds = {1, 2},
  report = table { rows = {"lr"}, cols = {"rank"}, metric = "accuracy" },
}

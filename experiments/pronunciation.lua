-- experiments/pronunciation.lua - the first story's task (../shared/seeds: LoRA on Gemma 3n with
-- text and audio for pronunciation coaching), on real recorded speech: listen to a clip, write
-- what was said, then its expected phones.
--
-- Data: Debian's asterisk-core-sounds-en-wav (568 prompts read by one speaker, 8 kHz WAV, in
-- /usr/share/asterisk/sounds/en_US_f_Allison) with their transcripts from asterisk-core-sounds-en
-- (core-sounds-en.txt.gz), and the CMU pronouncing dictionary of pocketsphinx-en-us for the
-- phones (`./setup.sh` installs all three). Recordings that are tones or whose words the
-- dictionary lacks are left out, by name; every 5th of the rest is a test example.
--
-- Evaluation: the loss, and each test clip's greedy answer against its reference: word error rate
-- (its first line) and phone error rate (its second), corpus level.
--
-- Run it from the repository's folder (the default model's path is relative to it; or set
-- GEMMA3N_MODEL). The default model is the tiny random Gemma 3n of tests/ref (an audio encoder and decoder with
-- every part of the architecture, random weights: the pipeline end to end in a minute, not a
-- transcriber). With a real checkpoint:
--   gemmarun experiments/pronunciation.lua --set model=/path/to/gemma-3n-E2B-it --set max_length=512
-- (a Gemma3nForConditionalGeneration folder: config.json, model.safetensors, tokenizer.json).
-- PRON_TRAIN / PRON_TEST choose how many examples (default 48 and 12; 0: all).
local function count(name, default)
  local n = math.tointeger(tonumber(env(name, tostring(default))))
  return (n and n > 0) and n or nil
end

return experiment {
  name = "pronunciation",
  description = "Gemma 3n, LoRA: transcribe a recording, then give its phones (Asterisk prompts, CMU dictionary)",
  model = env("GEMMA3N_MODEL", "tests/ref/tiny_gemma3n_audio"),
  task = transcribe {
    data = data.speech {
      path = "/usr/share/asterisk/sounds/en_US_f_Allison",
      transcripts = "/usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz",
      phones = "/usr/share/pocketsphinx/model/en-us/cmudict-en-us.dict",
      train = count("PRON_TRAIN", 48), test_max = count("PRON_TEST", 12),
    },
    prompt = "Transcribe this recording. Then, on a second line, give its phones (CMU ARPAbet).",
    max_new_tokens = 48,
  },
  train = { epochs = 2, batch = 2, lr = 1e-3, rank = 8, alpha = 16, max_length = 320, schedule = "constant" },
  sweep = grid { lr = { 1e-3, 1e-2 } },
  seeds = { 1 },
  report = table { rows = { "lr" }, metric = "word_error_rate" },
}

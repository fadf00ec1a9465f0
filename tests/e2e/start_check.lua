-- A trial that started from an adapter (experiment.model_adapter) against the trial that adapter
-- came from (tests/e2e/adapters_peft.sh, generate_real.sh, images.sh): its LoRA shape (the image
-- path's too: vision_targets, modules_to_save), whether its baseline
-- evaluation is the source trial's final one prediction for prediction (and whether that differs
-- from the base model's, so the comparison could fail), whether its first loss is below the
-- source's first (same seed: the same first batch), and its provenance.
-- Environment: SRC (results folder), SRC_INDEX, CONT (results folder), CONT_INDEX (trial indices).
local function trial(dir, index)
  for _, p in ipairs(gm.results_list(dir)) do
    local t = gm.results_read(p)
    if t.trial_index == index then return t end
  end
  error(string.format("%s has no trial %d", dir, index), 0)
end
local src = trial((assert(os.getenv("SRC"), "set SRC")), math.tointeger(tonumber(os.getenv("SRC_INDEX"))))
local cont = trial((assert(os.getenv("CONT"), "set CONT")), math.tointeger(tonumber(os.getenv("CONT_INDEX"))))
local same, moved = true, false
for i, p in ipairs(src.eval.final.predictions) do
  same = same and cont.eval.baseline.predictions[i] == p
  moved = moved or src.eval.baseline.predictions[i] ~= p
end
local c = cont.config
print(string.format("shape rank=%d alpha=%g rslora=%s targets=%s", c.rank, c.alpha, tostring(c.rslora), c.targets))
print(string.format("image path vision_targets=%s modules_to_save=%s", tostring(c.vision_targets), tostring(c.modules_to_save)))
print(string.format("baseline %s trial %d's final on %d examples (%s from the base model's); accuracy %.4f vs %.4f",
  same and "=" or "~=", src.trial_index, #src.eval.final.predictions, moved and "which differs" or "NOT different",
  cont.eval.baseline.accuracy, src.eval.final.accuracy))
print(string.format("first loss %s: %.4f from the adapter, %.4f from scratch", cont.metrics.loss[1] < src.metrics.loss[1] and "lower"
  or "NOT lower", cont.metrics.loss[1], src.metrics.loss[1]))
print("provenance model_adapter=" .. tostring(cont.provenance.model_adapter))

-- prelude.lua: embedded in gemmarun and run before every experiment file.
--
-- Policy lives here, mechanism in C (style guide §4.8): this file defines the helpers an
-- experiment file sees (env, ...) on top of the C bindings in table `gm`. The experiment runner
-- (sweeps, validation, the run loop) grows from here.

-- load() accepts text chunks only: binary chunks can crash the VM (sandbox).
if not GM_ALLOW_OS then
  local raw_load = load
  load = function(chunk, name, mode, env)
    return raw_load(chunk, name, "t", env)
  end
end

--- env(name, default): the value of an environment variable, or `default` when unset or empty.
function env(name, default)
  if type(name) ~= "string" then
    error("env(name, default): name must be a string, got " .. type(name), 2)
  end
  local v = os.getenv(name)
  if v == nil or v == "" then return default end
  return v
end

--- load_model(path_or_name [, opts]): shorthand for gm.load_model.
function load_model(...)
  return gm.load_model(...)
end

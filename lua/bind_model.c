/*
 * bind_model.c - Lua bindings for models: load, tokenize, detokenize, generate, config.
 *
 * A gm.Model userdata holds a handle (gm_model *) and, once generation is used, an inference
 * state sized for the largest context asked so far. __gc and __close free both; a closed model
 * raises a clean Lua error when used. Every binding checks all its arguments first, calls the
 * core, releases what it acquired on failure and only then raises (style guide §4.8).
 *
 * Lua API (table `gm`):
 *   gm.load_model(path_or_name [, {threads = n, device = "cpu"}]) -> model; device "cuda" / "cuda:N"
 *        opens the GPU at once (core/backend/gm_backend.h: gm_backend_open), so a machine without
 *        one is an error here, before any work
 *   gm.device_ok(name)                                 -> true | false, why: a device name gm_backend_open takes
 *   gm.compute_dtype(compute, device)                  -> "bf16" | "f32": what the base GEMMs run in
 *   gm.device_available(name)                          -> true | false, why: its GPU is there (nothing opened)
 *   gm.device_memory(name)                             -> {peak, used, total}: a GPU's memory (bytes)
 *   gm.hub_id(name)                                    -> Hugging Face repository of a fetched model, or nil
 *   gm.with_vision_tower(text, {hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
 *        image_size, patch_size, mm_tokens_per_image, seed = 0, dtype = "f32"}) -> path, written: the
 *        text model with a new vision tower, as a Hugging Face folder in the cache (written once)
 *   model:tokenize(text [, {bos = true, special = false}]) -> {ids...}
 *   model:detokenize(ids [, {special = false, skip_unknown = false}]) -> string
 *   model:generate(prompt [, opts])                   -> text, {prompt_tokens, new_tokens,
 *        prefill_tokens_per_s, decode_tokens_per_s, dot ("int8" | "f32": what decoding took)}
 *        opts: max_tokens (64), temperature (0 = greedy), top_k (0), top_p (1), seed (0),
 *              chat (false: wrap the prompt in Gemma's chat template), stop_at_eos (true),
 *              adapter (a results folder, trial file, merged results file, checkpoint or PEFT folder:
 *              core/store/gm_adapter.h), trial (the trial's index or id within it),
 *              dot ("int8": llama.cpp's int8 dots on quantized weights, the default; "f32": the f32
 *              numbers; GM_GENERATE_DOT_DEFAULT, gm_decoder.h)
 *   model:logits(ids_or_text [, {adapter =, trial =, all = false, pixels =}]) -> floats: the logits
 *        after the last token (vocab_size), or after every token (all = true, T * vocab_size,
 *        position-major); pixels: preprocessed images for the ids' runs of image tokens
 *   model:save_adapter(out, {adapter =, trial =, format = "peft", base_model =}) -> info: the
 *        adapter written as a PEFT adapter folder (adapter_config.json + adapter_model.safetensors)
 *        or, format = "gguf", a llama.cpp LoRA adapter file
 *   model:save_merged(out, {adapter =, trial =, format = "hf", dtype =}) -> info: the model with the
 *        adapter merged in, as a Hugging Face folder (dtype bf16 default, or f32; a multimodal base
 *        whole, its tower's adapters and trained projector included) or, format = "gguf", a GGUF
 *        file (dtype f16 default, or f32, bf16, q8_0)
 *   model:adapter_info(path, {trial =}) -> {rank, alpha, rslora, dropout, modules, targets, layers,
 *        module_names, vision_targets, modules_to_save, vision_module_names, source, trial_id}: an
 *        adapter's LoRA shape, with targets / layers (and its image path: vision_targets,
 *        modules_to_save) as train.* selects it
 *   model:lora_modules(targets [, layers [, {vision = true}]]) -> the module names train.targets /
 *        train.layers (vision: train.vision_targets, on the tower) select
 *   model:config()                                     -> table of the config fields
 *   model:sha256()                                     -> hex, "file=<12 hex> ..." (gm_model_sha256)
 *   model:close()
 */
#include "gm_data.h" /* gm_mm_image_floats */
#include "gm_lua.h"
#include "bind_util.h"
#include "write_rule.h"

#include "gm_adapter.h"
#include "gm_alloc.h"
#include "gm_audio_encoder.h"
#include "gm_backend.h"
#include "gm_chat.h"
#include "gm_decoder.h"
#include "gm_fetch.h"
#include "gm_generate.h"
#include "gm_train.h"
#include "gm_merged.h"
#include "gm_mm_embed.h"
#include "gm_model.h"
#include "gm_tokenizer.h"
#include "gm_vision.h"

#include <lauxlib.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>


lmodel *gm_bind_check_model(lua_State *L, int idx) {
    lmodel *lm = luaL_checkudata(L, idx, GM_MODEL_MT);
    if (!lm->m) luaL_error(L, "this model was closed");
    return lm;
}

/* true, or false and err's message (the two device checks below) */
static int push_ok_or_why(lua_State *L, gm_status s, const gm_error *err) {
    lua_pushboolean(L, s == GM_OK);
    if (s == GM_OK) return 1;
    lua_pushstring(L, err->msg);
    return 2;
}

/* gm.device_ok(name) -> true, or false and the reason: "cpu", "cuda", "cuda:N"
 * (gm_backend_parse_device; nothing is opened). */
static int l_device_ok(lua_State *L) {
    gm_error err = {0};
    return push_ok_or_why(L, gm_backend_parse_device(luaL_checkstring(L, 1), NULL, &err), &err);
}

/* gm.compute_dtype(compute, device) -> "bf16" | "f32" (gm_compute_effective): what the base
 * weights' GEMMs of a trial with option `compute` run in on `device`. */
static int l_compute_dtype(lua_State *L) {
    gm_compute c = GM_COMPUTE_AUTO;
    const char *name = luaL_checkstring(L, 1);
    if (!gm_compute_from_name(name, &c)) return luaL_error(L, "compute_dtype: unknown compute '%s' (auto, bf16, f32)", name);
    lua_pushstring(L, gm_compute_effective(c, luaL_optstring(L, 2, "cpu")));
    return 1;
}

/* gm.device_available(name) -> true, or false and why: gm_backend_probe (the CUDA module loaded,
 * its GPUs counted; no context created). */
static int l_device_available(lua_State *L) {
    gm_error err = {0};
    return push_ok_or_why(L, gm_backend_probe(luaL_checkstring(L, 1), &err), &err);
}

/* gm.device_memory(name) -> {peak, used, total}: gm_backend_device_memory (bytes). */
static int l_device_memory(lua_State *L) {
    gm_error err = {0};
    size_t peak, used, total;
    if (gm_backend_device_memory(luaL_checkstring(L, 1), &peak, &used, &total, &err) != GM_OK) return gm_bind_raise(L, &err);
    lua_createtable(L, 0, 3);
    lua_pushinteger(L, (lua_Integer)peak);
    lua_setfield(L, -2, "peak");
    lua_pushinteger(L, (lua_Integer)used);
    lua_setfield(L, -2, "used");
    lua_pushinteger(L, (lua_Integer)total);
    lua_setfield(L, -2, "total");
    return 1;
}

static int l_load_model(lua_State *L) {
    const char *arg = luaL_checkstring(L, 1);
    static const char *const allowed[] = {"threads", "device", NULL};
    gm_bind_check_opts(L, 2, "load_model", allowed);
    lua_getglobal(L, "GM_THREADS");
    int def_threads = (int)luaL_optinteger(L, -1, 2);
    lua_pop(L, 1);
    int threads = (int)gm_bind_opt_int(L, 2, "threads", def_threads);
    char device[16] = "cpu";
    if (lua_istable(L, 2) && lua_getfield(L, 2, "device") != LUA_TNIL) {
        const char *d = luaL_checkstring(L, -1);
        if (strlen(d) >= sizeof device) return luaL_error(L, "load_model: unknown device \"%s\"", d);
        snprintf(device, sizeof device, "%s", d);
    }
    if (lua_istable(L, 2)) lua_pop(L, 1);
    gm_error err = {0};
    if (gm_backend_parse_device(device, NULL, &err) != GM_OK) return gm_bind_raise(L, &err);
    char path[1200];
    if (gm_resolve_model(arg, path, sizeof path, &err) != GM_OK) return gm_bind_raise(L, &err);
    lmodel *lm = lua_newuserdatauv(L, sizeof *lm, 0);
    memset(lm, 0, sizeof *lm);
    luaL_setmetatable(L, GM_MODEL_MT);
    if (gm_model_load(path, NULL, &lm->m, &err) != GM_OK) return gm_bind_raise(L, &err);
    lm->n_threads = threads > 0 ? threads : 2;
    snprintf(lm->device, sizeof lm->device, "%s", device);
    /* a GPU is opened now: its absence is an error before any trial starts */
    if (strcmp(device, "cpu") != 0 && gm_backend_open(device, lm->n_threads, &lm->be, &err) != GM_OK)
        return gm_bind_raise(L, &err);
    return 1;
}

/* gm.with_vision_tower(text, spec) -> path, written: text model `text` (a path or fetched name)
 * with a new SigLIP tower and projector of spec's shape (Hugging Face's vision_config names, plus
 * mm_tokens_per_image, seed, dtype "f32" | "bf16"), written once by gm_model_save_with_tower into
 * <cache>/models/<text file stem>-vision-<12 hex>, the hex the sha256 of the text model's files'
 * sha256 and the spec: the same text model and spec always name the same folder, whose existence
 * means it is whole (it is renamed into place). `written`: false when it was there already. */
static int l_with_vision_tower(lua_State *L) {
    const char *text = luaL_checkstring(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    static const char *const allowed[] = {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                                          "image_size", "patch_size", "mm_tokens_per_image", "seed", "dtype", NULL};
    gm_bind_check_opts(L, 2, "with_vision_tower", allowed);
    gm_vision_config v = {0};
    static const char *const need[] = {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                                       "image_size", "patch_size", "mm_tokens_per_image"};
    int64_t *dst[] = {&v.hidden_size, &v.n_layers, &v.n_heads, &v.intermediate_size, &v.image_size, &v.patch_size, &v.tokens};
    for (int i = 0; i < 7; i++) {
        if (lua_getfield(L, 2, need[i]) == LUA_TNIL)
            return luaL_error(L, "with_vision_tower: %s is missing (the tower's fields: hidden_size, num_hidden_layers, "
                              "num_attention_heads, intermediate_size, image_size, patch_size, mm_tokens_per_image)", need[i]);
        lua_pop(L, 1);
        *dst[i] = gm_bind_opt_int(L, 2, need[i], 0);
        if (*dst[i] <= 0 || *dst[i] > (1 << 20))
            return luaL_error(L, "with_vision_tower: %s must be an integer from 1 to 1048576 (got %I)", need[i], (lua_Integer)*dst[i]);
    }
    const lua_Integer seed = gm_bind_opt_int(L, 2, "seed", 0);
    const char *dtname = gm_bind_opt_str(L, 2, "dtype", "f32");
    gm_dtype dt;
    if (!gm_dtype_from_name(dtname, &dt) || (dt != GM_F32 && dt != GM_BF16))
        return luaL_error(L, "with_vision_tower: dtype must be \"f32\" or \"bf16\", not \"%s\"", dtname);
    gm_error err = {0};
    char path[1200];
    if (gm_resolve_model(text, path, sizeof path, &err) != GM_OK) return gm_bind_raise(L, &err);
    gm_model *m = NULL;
    if (gm_model_load(path, NULL, &m, &err) != GM_OK) return gm_bind_raise(L, &err);
    char hex[65], line[1400];
    gm_status s = gm_model_sha256(m, hex, NULL, 0, &err);
    int n = snprintf(line, sizeof line, "gemmarun with_vision_tower 2\n%s\n%lld %lld %lld %lld %lld %lld %lld %lld %s\n", hex,
                     (long long)v.hidden_size, (long long)v.n_layers, (long long)v.n_heads, (long long)v.intermediate_size,
                     (long long)v.image_size, (long long)v.patch_size, (long long)v.tokens, (long long)seed, gm_dtype_name(dt));
    unsigned char md[32];
    unsigned int mdlen = 0;
    if (s == GM_OK && EVP_Digest(line, (size_t)n, md, &mdlen, EVP_sha256(), NULL) != 1)
        s = gm_error_set(&err, GM_ERR_IO, "sha256 failed");
    char dir[1024], out[2400], stem[256];
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    snprintf(stem, sizeof stem, "%.200s", base);
    char *dot = strrchr(stem, '.');
    if (dot && dot != stem) *dot = '\0';
    gm_cache_dir(dir, sizeof dir);
    snprintf(out, sizeof out, "%s/models", dir);
    (void)mkdir(dir, 0755), (void)mkdir(out, 0755); /* as gemmarun fetch makes them */
    snprintf(out, sizeof out, "%s/models/%s-vision-", dir, stem);
    for (int i = 0; i < 6; i++) snprintf(out + strlen(out), 3, "%02x", md[i]);
    struct stat sb;
    bool written = false;
    if (s == GM_OK && stat(out, &sb) != 0) {
        gm_merged_info info;
        s = gm_model_save_with_tower(m, &v, (uint64_t)seed, dt, out, &info, &err);
        written = s == GM_OK;
    }
    gm_model_free(m);
    if (s != GM_OK) return gm_bind_raise(L, &err);
    lua_pushstring(L, out);
    lua_pushboolean(L, written);
    return 2;
}

static const gm_tokenizer *need_tok(lua_State *L, lmodel *lm) {
    if (!lm->m->tok) luaL_error(L, "%s has no tokenizer", lm->m->path);
    return lm->m->tok;
}

/* Encodes text into a gm_malloc'd id array; raises on failure. */
static int32_t *encode(lua_State *L, lmodel *lm, const char *text, size_t len, bool bos, bool special,
                       int64_t *n) {
    const gm_tokenizer *tok = need_tok(L, lm);
    int64_t cap = (int64_t)len + 8;
    int32_t *ids = gm_malloc((size_t)cap * sizeof(int32_t));
    if (!ids) luaL_error(L, "out of memory");
    gm_error err = {0};
    if (gm_tokenizer_encode(tok, text, len, bos, special, ids, cap, n, &err) != GM_OK) {
        gm_free(ids);
        gm_bind_raise(L, &err);
    }
    return ids;
}

static int l_tokenize(lua_State *L) {
    lmodel *lm = gm_bind_check_model(L, 1);
    size_t len;
    const char *text = luaL_checklstring(L, 2, &len);
    static const char *const allowed[] = {"bos", "special", NULL};
    gm_bind_check_opts(L, 3, "tokenize", allowed);
    bool bos = gm_bind_opt_bool(L, 3, "bos", true), special = gm_bind_opt_bool(L, 3, "special", false);
    int64_t n = 0;
    int32_t *ids = encode(L, lm, text, len, bos, special, &n);
    lua_createtable(L, (int)n, 0);
    for (int64_t i = 0; i < n; i++) {
        lua_pushinteger(L, ids[i]);
        lua_rawseti(L, -2, i + 1);
    }
    gm_free(ids);
    return 1;
}

static int l_detokenize(lua_State *L) {
    lmodel *lm = gm_bind_check_model(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    static const char *const allowed[] = {"special", "skip_unknown", NULL};
    gm_bind_check_opts(L, 3, "detokenize", allowed);
    bool special = gm_bind_opt_bool(L, 3, "special", false);
    /* skip_unknown: ids the tokenizer has no text for (a model's rows past its tokenizer's
     * vocabulary, which generation may pick) are left out instead of refused */
    bool skip = gm_bind_opt_bool(L, 3, "skip_unknown", false);
    const gm_tokenizer *tok = need_tok(L, lm);
    lua_Integer n = luaL_len(L, 2);
    int64_t V = gm_tokenizer_vocab_size(tok);
    int32_t *ids = gm_malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    if (!ids) return luaL_error(L, "out of memory");
    lua_Integer k = 0;
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, 2, i);
        if (!lua_isinteger(L, -1)) {
            gm_free(ids);
            return luaL_error(L, "detokenize: ids[%d] is not an integer", (int)i);
        }
        lua_Integer id = lua_tointeger(L, -1);
        lua_pop(L, 1);
        if (id < 0 || id >= V) {
            if (skip) continue;
            gm_free(ids);
            return luaL_error(L, "detokenize: ids[%d] = %d is outside the vocabulary", (int)i, (int)id);
        }
        ids[k++] = (int32_t)id;
    }
    n = k;
    char *text = NULL;
    gm_error err = {0};
    gm_status s = gm_tokenizer_decode(tok, ids, n, special, &text, &err);
    gm_free(ids);
    if (s != GM_OK) return gm_bind_raise(L, &err);
    lua_pushstring(L, text);
    gm_free(text);
    return 1;
}

/* Pushes Gemma's chat template (tok's format) around one user turn (gemma_architecture.md §2.5,
 * §4.7); BOS is added by the encoder. */
static void push_chat_prompt(lua_State *L, const gm_tokenizer *tok, const char *prompt) {
    gm_chat_msg msg = {"user", prompt};
    char *text = NULL;
    gm_error err = {0};
    if (gm_chat_render(gm_chat_format_of(tok), &msg, 1, true, &text, NULL, &err) != GM_OK) gm_bind_raise(L, &err);
    lua_pushstring(L, text);
    gm_free(text);
}

/* opts.trial of a method taking adapter = ... : an index (number) or an id (string), copied into
 * buf; NULL when absent. Raises when it is of another type or given without an adapter. */
static const char *opt_trial(lua_State *L, int idx, const char *fn, const char *adapter, char *buf, size_t cap) {
    const char *trial = NULL;
    if (lua_istable(L, idx)) {
        lua_getfield(L, idx, "trial");
        if (lua_isinteger(L, -1) || (lua_type(L, -1) == LUA_TNUMBER && lua_tonumber(L, -1) == (lua_Number)(long long)lua_tonumber(L, -1))) {
            snprintf(buf, cap, "%lld", (long long)lua_tonumber(L, -1)); /* 2.0 is trial 2 */
            trial = buf;
        } else if (lua_type(L, -1) == LUA_TSTRING) {
            snprintf(buf, cap, "%s", lua_tostring(L, -1));
            trial = buf;
        } else if (!lua_isnil(L, -1)) {
            luaL_error(L, "%s: trial must be a trial index or id", fn);
        }
        lua_pop(L, 1);
    }
    if (trial && !adapter) luaL_error(L, "%s: trial picks a trial of an adapter's results; give adapter too", fn);
    return trial;
}

/* Makes lm->ad the adapter (adapter, trial) (adapter NULL: none), loaded onto lm's backend
 * (created on first use). Another adapter than the current one frees the generation state,
 * which points at the old one. */
static gm_status use_adapter(lmodel *lm, const char *adapter, const char *trial, gm_error *err) {
    char key[sizeof lm->ad_key];
    snprintf(key, sizeof key, "%s|%s", adapter ? adapter : "", trial ? trial : "");
    GM_TRY(lm->be ? GM_OK : gm_backend_open(lm->device, lm->n_threads, &lm->be, err));
    if (strcmp(key, lm->ad_key) == 0 && (lm->ad || !adapter)) return GM_OK;
    gm_infer_free(lm->st);
    lm->st = NULL;
    gm_adapter_free(lm->ad);
    lm->ad = NULL;
    lm->ad_key[0] = '\0';
    if (adapter) GM_TRY(gm_adapter_load(lm->m, lm->be, adapter, trial, &lm->ad, err));
    snprintf(lm->ad_key, sizeof lm->ad_key, "%s", key);
    return GM_OK;
}

/* Token ids from argument idx: a table of integers in [0, vocab) or a text (tokenized with BOS).
 * gm_malloc'd; raises on bad input. */
static int32_t *ids_arg(lua_State *L, lmodel *lm, int idx, const char *fn, int64_t *n) {
    if (lua_type(L, idx) == LUA_TSTRING) {
        size_t len;
        const char *text = lua_tolstring(L, idx, &len);
        return encode(L, lm, text, len, true, false, n);
    }
    luaL_checktype(L, idx, LUA_TTABLE);
    lua_Integer k = luaL_len(L, idx);
    if (k < 1 || k > (1 << 20)) luaL_error(L, "%s: give 1 to %d token ids (got %I)", fn, 1 << 20, k);
    int32_t *ids = gm_malloc((size_t)k * sizeof *ids);
    if (!ids) luaL_error(L, "out of memory");
    for (lua_Integer i = 1; i <= k; i++) {
        lua_geti(L, idx, i);
        int isnum = 0;
        lua_Integer v = lua_tointegerx(L, -1, &isnum);
        lua_pop(L, 1);
        if (!isnum || v < 0 || v >= lm->m->cfg.vocab_size) {
            gm_free(ids);
            luaL_error(L, "%s: token %I is not an id in [0, %I)", fn, i, (lua_Integer)lm->m->cfg.vocab_size);
        }
        ids[i - 1] = (int32_t)v;
    }
    *n = k;
    return ids;
}

/* model:logits(ids_or_text [, {adapter =, trial =, all = false, pixels =, audio =}]) -> table of floats: the
 * logits (vocab_size) after the last token, or with all = true those after every token,
 * position-major (T * vocab_size: entry t * V + v + 1). A fresh forward from position 0 (no cache
 * reused). pixels: a multimodal model's images, preprocessed (n * 3 * S * S floats, image-major,
 * as Gemma 3's image processor gives pixel_values), one per run of image tokens in the ids; they go
 * through the image path (with the adapter's trained tower and projector, if it has them), their
 * soft tokens replace the runs, and each run sees its whole image. audio: Gemma 3n's clips, a list
 * of audio files, one per run of audio soft tokens in the ids (audio_soft_tokens_per_image each),
 * through the audio encoder (with the adapter's audio-encoder LoRA, if it has one:
 * gm_audio_encode_files). On Gemma 3n the ids' hard multimodal tokens (<end_of_audio>, ...) take
 * their embedders' rows, as transformers does. */
static int l_logits(lua_State *L) {
    lmodel *lm = gm_bind_check_model(L, 1);
    static const char *const allowed[] = {"adapter", "trial", "all", "pixels", "audio", NULL};
    gm_bind_check_opts(L, 3, "logits", allowed);
    const char *adapter = gm_bind_opt_str(L, 3, "adapter", NULL);
    char trial_buf[64];
    const char *trial = opt_trial(L, 3, "logits", adapter, trial_buf, sizeof trial_buf);
    bool all = gm_bind_opt_bool(L, 3, "all", false);
    int64_t T = 0;
    int32_t *ids = ids_arg(L, lm, 2, "logits", &T);
    const gm_config *c = &lm->m->cfg;
    /* the images: counted from the ids, their pixels from the table */
    float *pixels = NULL, *soft = NULL;
    int64_t *rows = NULL, n_images = 0, n_soft = 0;
    int32_t *kv_end = NULL;
    if (!lua_isnoneornil(L, 3) && lua_getfield(L, 3, "pixels") != LUA_TNIL) {
        if (!lm->m->vision) {
            gm_free(ids);
            return luaL_error(L, "logits: pixels given, but %s has no vision tower", lm->m->path);
        }
        int64_t S = c->vision.image_size, per = 3 * S * S;
        kv_end = gm_malloc((size_t)T * sizeof *kv_end);
        rows = gm_malloc((size_t)T * sizeof *rows);
        if (!kv_end || !rows) {
            gm_free(ids), gm_free(kv_end), gm_free(rows);
            return luaL_error(L, "out of memory");
        }
        n_images = gm_mm_kv_end(ids, 1, T, c->vision.image_token_id, 0, kv_end);
        for (int64_t t = 0; t < T; t++)
            if (ids[t] == c->vision.image_token_id) rows[n_soft++] = t;
        lua_Integer k = lua_istable(L, -1) ? luaL_len(L, -1) : -1;
        const char *bad = n_images < 1 ? "the ids hold no image token" : n_soft != n_images * c->vision.tokens ? "an image's "
                          "run of image tokens is not mm_tokens_per_image long" : k != n_images * per ? "pixels is not a table "
                          "of images x 3 x image_size x image_size numbers" : NULL;
        pixels = bad ? NULL : gm_malloc((size_t)(n_images * per) * sizeof *pixels);
        for (lua_Integer i = 1; pixels && i <= k; i++) {
            lua_geti(L, -1, i);
            pixels[i - 1] = (float)lua_tonumber(L, -1);
            lua_pop(L, 1);
        }
        if (!pixels) {
            gm_free(ids), gm_free(kv_end), gm_free(rows);
            if (bad)
                return luaL_error(L, "logits: %s (%I images in the ids, %I numbers given, %I per image)", bad,
                                  (lua_Integer)n_images, k, (lua_Integer)per);
            return luaL_error(L, "out of memory");
        }
    }
    if (!lua_isnoneornil(L, 3)) lua_pop(L, 1);
    /* the clips: one file per run of audio soft tokens */
    const char *clips[16];
    int n_clips = 0;
    if (!lua_isnoneornil(L, 3) && lua_getfield(L, 3, "audio") != LUA_TNIL) {
        bool has = gm_model_no_audio(lm->m) == NULL;
        lua_Integer k = lua_istable(L, -1) ? luaL_len(L, -1) : -1;
        for (lua_Integer i = 1; has && i <= k && i <= 16; i++) {
            lua_geti(L, -1, i);
            clips[n_clips++] = lua_tostring(L, -1); /* kept alive by the options table */
            lua_pop(L, 1);
        }
        int64_t n_tok = 0;
        for (int64_t t = 0; t < T; t++) n_tok += has && ids[t] == c->audio.audio_token_id;
        const char *bad = !has ? "the model has no audio encoder" : k < 1 || k > 16 ? "audio is not a list of 1 to 16 files"
                          : c->arch != GM_ARCH_GEMMA4 && n_tok != n_clips * c->audio.soft_tokens
                              ? "the ids' audio soft tokens are not one run of audio_soft_tokens_per_image per clip"
                              : NULL; /* Gemma 4's runs: each clip's own count, checked once encoded */
        for (int i = 0; !bad && i < n_clips; i++)
            if (!clips[i]) bad = "an entry of audio is not a file name";
        if (bad) {
            gm_free(ids), gm_free(kv_end), gm_free(rows), gm_free(pixels);
            return luaL_error(L, "logits: %s (%I audio soft tokens in the ids, %I files given)", bad, (lua_Integer)n_tok, k);
        }
        lua_pop(L, 1);
    } else if (!lua_isnoneornil(L, 3)) {
        lua_pop(L, 1);
    }
    gm_error err = {0};
    gm_infer *st = NULL;
    gm_vision *v = NULL;
    const float **hptr = NULL;
    int64_t *hrows = NULL, n_hard = 0;
    gm_status s = gm_generate_check(c, T, 1, &err);
    if (s == GM_OK) s = use_adapter(lm, adapter, trial, &err);
    if (s == GM_OK && c->arch == GM_ARCH_GEMMA3N) { /* the hard multimodal tokens' rows (tables kept) */
        if (!lm->hard) {
            lm->hard = gm_calloc(1, sizeof *lm->hard);
            s = lm->hard ? gm_mm_hard_load(lm->m, lm->hard, &err) : gm_error_set(&err, GM_ERR_NOMEM, "out of memory");
            if (s != GM_OK) gm_free(lm->hard), lm->hard = NULL;
        }
        hptr = gm_malloc((size_t)T * sizeof *hptr), hrows = gm_malloc((size_t)T * sizeof *hrows);
        if (s == GM_OK && (!hptr || !hrows)) s = gm_error_set(&err, GM_ERR_NOMEM, "out of memory");
        if (s == GM_OK) n_hard = gm_mm_hard_place(lm->hard, ids, T, hptr, hrows, T);
    }
    if (s == GM_OK && n_clips > 0) {
#ifdef GM_HAVE_AUDIO
        int64_t C = c->hidden_size, tokens[16] = {0}, total = 0;
        soft = gm_malloc((size_t)(n_clips * c->audio.soft_tokens * C) * sizeof *soft);
        rows = gm_malloc((size_t)T * sizeof *rows);
        s = soft && rows ? gm_audio_encode_files(lm->m, lm->hard, clips, n_clips, lm->n_threads, lm->be,
                                                 lm->ad ? &lm->ad->audio_lora : NULL, soft, tokens, NULL, &err)
                         : gm_error_set(&err, GM_ERR_NOMEM, "out of memory");
        for (int64_t t = 0; s == GM_OK && t < T; t++)
            if (ids[t] == c->audio.audio_token_id) rows[n_soft++] = t;
        for (int i = 0; s == GM_OK && i < n_clips; i++) total += tokens[i];
        if (s == GM_OK && total != n_soft) /* Gemma 4: each clip's own count */
            s = gm_error_set(&err, GM_ERR_INVALID, "logits: the ids hold %lld audio soft tokens, the %d clip%s give %lld (%s: "
                             "%lld)", (long long)n_soft, (int)n_clips, n_clips == 1 ? "" : "s", (long long)total, clips[0],
                             (long long)tokens[0]);
#else
        s = gm_error_set(&err, GM_ERR_UNSUPPORTED, "logits: audio given, but this gemmarun was built without audio");
#endif
    }
    if (s == GM_OK && pixels) {
        soft = gm_malloc((size_t)(n_soft * c->hidden_size) * sizeof *soft);
        s = soft ? gm_vision_new_adapted(lm->m, n_images, lm->n_threads, lm->be, lm->ad ? &lm->ad->vision : NULL, &v, &err)
                 : gm_error_set(&err, GM_ERR_NOMEM, "out of memory");
        if (s == GM_OK) s = gm_vision_encode(v, pixels, n_images, soft, NULL, &err);
        gm_vision_free(v);
    }
    gm_infer_opts io = {.batch = 1, .ctx = T, .max_tokens = T, .logit_rows = all ? T : 1, .n_threads = lm->n_threads,
                        .adapter = lm->ad && lm->ad->lora.n > 0 ? &lm->ad->lora : NULL, .backend = lm->be};
    if (s == GM_OK) s = gm_infer_new(lm->m, &io, &st, &err);
    gm_graph_input in = {.B = 1, .T = T, .ids = ids, .embeds = soft, .embed_rows = rows, .n_embeds = n_soft,
                         .kv_end = pixels ? kv_end : NULL, .ptr_embeds = hptr, .ptr_rows = hrows, .n_ptr_embeds = n_hard};
    bool inputs = pixels || n_clips > 0 || n_hard > 0;
    if (s == GM_OK) s = inputs ? gm_decoder_forward_input(st, &in, all, &err) : gm_decoder_forward(st, ids, T, all, &err);
    gm_free(ids), gm_free(pixels), gm_free(soft), gm_free(rows), gm_free(kv_end), gm_free(hptr), gm_free(hrows);
    if (s != GM_OK) {
        gm_infer_free(st);
        return gm_bind_raise(L, &err);
    }
    int64_t n = st->n_logit_rows * c->vocab_size;
    lua_createtable(L, (int)n, 0);
    for (int64_t i = 0; i < n; i++) {
        lua_pushnumber(L, st->logits[i]);
        lua_rawseti(L, -2, i + 1);
    }
    gm_infer_free(st);
    return 1;
}

/* model:save_adapter(out, {adapter =, trial =, format = "peft", base_model =}) -> {modules =,
 * vision_modules =, audio_modules =, projector =, rank =, alpha =, rslora =, source =, trial_id =} (modules: the
 * text decoder's; vision_modules: the tower's; audio_modules: Gemma 3n's audio encoder's; projector: trained fully): the adapter (as `adapter`/`trial` name it,
 * gm_adapter.h) written as a PEFT adapter folder `out` (gm_adapter_save_peft; base_model goes into
 * adapter_config.json's base_model_name_or_path, default the model's path) or, with format = "gguf",
 * as a llama.cpp LoRA adapter file `out` (gm_adapter_save_gguf). */
static int l_save_adapter(lua_State *L) {
    lmodel *lm = gm_bind_check_model(L, 1);
    const char *dir = luaL_checkstring(L, 2);
    static const char *const allowed[] = {"adapter", "trial", "base_model", "format", NULL};
    gm_bind_check_opts(L, 3, "save_adapter", allowed);
    const char *format = gm_bind_opt_str(L, 3, "format", "peft");
    if (strcmp(format, "peft") != 0 && strcmp(format, "gguf") != 0)
        return luaL_error(L, "save_adapter: format must be \"peft\" (a folder) or \"gguf\" (a llama.cpp adapter file), not \"%s\"", format);
    const char *adapter = gm_bind_opt_str(L, 3, "adapter", NULL);
    if (!adapter) return luaL_error(L, "save_adapter: give adapter = (a results folder, trial file, checkpoint or PEFT folder)");
    char trial_buf[64];
    const char *trial = opt_trial(L, 3, "save_adapter", adapter, trial_buf, sizeof trial_buf);
    const char *base = gm_bind_opt_str(L, 3, "base_model", lm->m->path);
    gm_bind_check_export_path(L, dir, "save_adapter");
    gm_error err = {0};
    gm_status s = use_adapter(lm, adapter, trial, &err);
    if (s == GM_OK)
        s = format[0] == 'g' ? gm_adapter_save_gguf(lm->ad, lm->be, lm->m, dir, &err)
                             : gm_adapter_save_peft(lm->ad, lm->be, lm->m, dir, base, &err);
    if (s != GM_OK) return gm_bind_raise(L, &err);
    const gm_lora *lo = &lm->ad->lora;
    lua_createtable(L, 0, 8);
    lua_pushinteger(L, lo->n);
    lua_setfield(L, -2, "modules");
    lua_pushinteger(L, lm->ad->vision_lora.n);
    lua_setfield(L, -2, "vision_modules");
    lua_pushinteger(L, lm->ad->audio_lora.n);
    lua_setfield(L, -2, "audio_modules");
    lua_pushboolean(L, lm->ad->has_proj);
    lua_setfield(L, -2, "projector");
    lua_pushinteger(L, lo->cfg.rank);
    lua_setfield(L, -2, "rank");
    lua_pushnumber(L, lo->cfg.alpha);
    lua_setfield(L, -2, "alpha");
    lua_pushboolean(L, lo->cfg.rslora);
    lua_setfield(L, -2, "rslora");
    lua_pushstring(L, lm->ad->source);
    lua_setfield(L, -2, "source");
    lua_pushstring(L, lm->ad->trial_id);
    lua_setfield(L, -2, "trial_id");
    return 1;
}


/* model:save_merged(out, {adapter =, trial =, format = "hf", dtype =}) -> {tensors =, merged =,
 * tower_merged =, multimodal =, projector =, bytes =, tokenizer =, dtype =}: the model with the
 * adapter (as `adapter`/`trial` name it; none: the base alone, converted) merged into its weights,
 * a trained image path included (tower_merged: the tower's linears merged; projector: the trained
 * projector written), as a Hugging Face folder `out` (format "hf", dtype bf16 (default) / f32;
 * multimodal: a multimodal base's tower and projector are in it) or, format "gguf", a GGUF file
 * `out` (dtype f32 / f16 (default) / bf16 / q8_0; from a GGUF base; the text decoder only, so an
 * image-path adapter is refused). gm_model_save_merged (core/store/gm_merged.h). */
static int l_save_merged(lua_State *L) {
    lmodel *lm = gm_bind_check_model(L, 1);
    const char *out = luaL_checkstring(L, 2);
    static const char *const allowed[] = {"adapter", "trial", "format", "dtype", NULL};
    gm_bind_check_opts(L, 3, "save_merged", allowed);
    const char *format = gm_bind_opt_str(L, 3, "format", "hf");
    bool gguf = strcmp(format, "gguf") == 0;
    if (!gguf && strcmp(format, "hf") != 0)
        return luaL_error(L, "save_merged: format must be \"hf\" (a Hugging Face folder) or \"gguf\" (a GGUF file), not \"%s\"", format);
    const char *dtname = gm_bind_opt_str(L, 3, "dtype", gguf ? "f16" : "bf16");
    gm_dtype dt;
    /* (f16 for a folder gets its own message from gm_model_save_merged: why not) */
    if (!gm_dtype_from_name(dtname, &dt) || !(dt == GM_F32 || dt == GM_F16 || dt == GM_BF16 || (gguf && dt == GM_Q8_0)))
        return luaL_error(L, "save_merged: dtype \"%s\" is not one a %s takes (%s)", dtname, gguf ? "GGUF" : "Hugging Face folder",
                          gguf ? "f16, f32, bf16, q8_0" : "bf16, f32");
    const char *adapter = gm_bind_opt_str(L, 3, "adapter", NULL);
    char trial_buf[64];
    const char *trial = opt_trial(L, 3, "save_merged", adapter, trial_buf, sizeof trial_buf);
    gm_bind_check_export_path(L, out, "save_merged");
    gm_error err = {0};
    gm_status s = adapter ? use_adapter(lm, adapter, trial, &err) : GM_OK;
    /* the audio encoder's adapters are not merged (its weights are written as they are): refused
     * rather than silently dropped */
    if (s == GM_OK && adapter && lm->ad->audio_lora.n > 0)
        s = gm_error_set(&err, GM_ERR_UNSUPPORTED, "%s trained the audio encoder (LoRA on %d of its modules), which a merged "
                         "export does not merge yet\n  hint: export it with --format peft (PeftModel applies it to the "
                         "base %sForConditionalGeneration)", lm->ad->source, lm->ad->audio_lora.n,
                         lm->m->cfg.arch == GM_ARCH_GEMMA4 ? "Gemma4" : "Gemma3n");
    gm_merged_info info;
    if (s == GM_OK) {
        s = gm_model_save_merged(lm->m, adapter ? &lm->ad->lora : NULL, adapter ? &lm->ad->vision : NULL, lm->be,
                                 gguf ? GM_MERGED_GGUF : GM_MERGED_HF, dt, out, &info, &err);
        /* (the core's refusal of an image path in a GGUF names no file: this one) */
        if (s == GM_ERR_UNSUPPORTED && adapter && (lm->ad->vision_lora.n > 0 || lm->ad->has_proj))
            gm_error_prefix(&err, "%s", lm->ad->source);
    }
    if (s != GM_OK) return gm_bind_raise(L, &err);
    lua_createtable(L, 0, 8);
    lua_pushinteger(L, info.n_tensors);
    lua_setfield(L, -2, "tensors");
    lua_pushinteger(L, info.n_merged);
    lua_setfield(L, -2, "merged");
    lua_pushinteger(L, info.n_tower_merged);
    lua_setfield(L, -2, "tower_merged");
    lua_pushboolean(L, info.multimodal);
    lua_setfield(L, -2, "multimodal");
    lua_pushboolean(L, info.projector);
    lua_setfield(L, -2, "projector");
    lua_pushinteger(L, (lua_Integer)info.bytes);
    lua_setfield(L, -2, "bytes");
    lua_pushstring(L, info.tokenizer);
    lua_setfield(L, -2, "tokenizer");
    lua_pushstring(L, gm_dtype_name(dt));
    lua_setfield(L, -2, "dtype");
    return 1;
}

/* model:adapter_info(path, {trial =}) -> {rank =, alpha =, rslora =, dropout =, modules = n,
 * targets =, layers = {...} or nil, module_names =, vision_targets =, modules_to_save =,
 * vision_module_names =, source =, trial_id =}: the LoRA shape of an adapter (anything
 * gm_adapter_load reads) on this model, with `targets` / `layers` as train.targets / train.layers
 * write them to select exactly its modules (gm_adapter_targets; layers nil: every layer), and the
 * image path it trained as train.vision_targets (gm_adapter_vision_targets; "none": no tower
 * adapters) and train.modules_to_save ("multi_modal_projector" or "none") select it; the audio
 * encoder's adapters as train.audio_targets selects them (gm_adapter_audio_targets), with
 * audio_module_names. */
static int l_adapter_info(lua_State *L) {
    lmodel *lm = gm_bind_check_model(L, 1);
    const char *path = luaL_checkstring(L, 2);
    static const char *const allowed[] = {"trial", NULL};
    gm_bind_check_opts(L, 3, "adapter_info", allowed);
    char trial_buf[64];
    const char *trial = opt_trial(L, 3, "adapter_info", path, trial_buf, sizeof trial_buf);
    gm_error err = {0};
    gm_status s = use_adapter(lm, path, trial, &err);
    bool list = false, layers[GM_MAX_LAYERS];
    int n_layers = 0;
    char *targets = NULL;
    if (s == GM_OK) s = gm_adapter_targets(&lm->ad->lora, lm->m, &list, &targets, layers, &n_layers, &err);
    if (s != GM_OK) return gm_bind_raise(L, &err);
    const gm_lora *lo = &lm->ad->lora;
    lua_createtable(L, 0, 12);
    lua_pushinteger(L, lo->cfg.rank);
    lua_setfield(L, -2, "rank");
    lua_pushnumber(L, gm_f32_shortest(lo->cfg.alpha));
    lua_setfield(L, -2, "alpha");
    lua_pushboolean(L, lo->cfg.rslora);
    lua_setfield(L, -2, "rslora");
    lua_pushnumber(L, gm_f32_shortest(lo->cfg.dropout));
    lua_setfield(L, -2, "dropout");
    lua_pushinteger(L, lo->n);
    lua_setfield(L, -2, "modules");
    lua_pushstring(L, targets);
    lua_setfield(L, -2, "targets");
    gm_free(targets);
    if (list && n_layers < lm->m->cfg.n_layers) {
        lua_createtable(L, n_layers, 0);
        int k = 0;
        for (int l = 0; l < lm->m->cfg.n_layers; l++)
            if (layers[l]) lua_pushinteger(L, l), lua_rawseti(L, -2, ++k);
        lua_setfield(L, -2, "layers");
    }
    lua_createtable(L, lo->n, 0);
    for (int i = 0; i < lo->n; i++) lua_pushstring(L, lo->ad[i].module), lua_rawseti(L, -2, i + 1);
    lua_setfield(L, -2, "module_names");
    /* the image path it trained, as train.vision_targets / modules_to_save select it */
    char *vt = NULL;
    if (gm_adapter_vision_targets(lm->ad, lm->m, &vt, &err) != GM_OK) {
        lua_pop(L, 1);
        return gm_bind_raise(L, &err);
    }
    lua_pushstring(L, vt);
    gm_free(vt);
    lua_setfield(L, -2, "vision_targets");
    lua_pushstring(L, lm->ad->has_proj ? "multi_modal_projector" : "none");
    lua_setfield(L, -2, "modules_to_save");
    const gm_lora *vl = &lm->ad->vision_lora;
    lua_createtable(L, vl->n, 0);
    for (int i = 0; i < vl->n; i++) lua_pushstring(L, vl->ad[i].module), lua_rawseti(L, -2, i + 1);
    lua_setfield(L, -2, "vision_module_names");
    char *at = NULL;
    if (gm_adapter_audio_targets(lm->ad, lm->m, &at, &err) != GM_OK) {
        lua_pop(L, 1);
        return gm_bind_raise(L, &err);
    }
    lua_pushstring(L, at);
    gm_free(at);
    lua_setfield(L, -2, "audio_targets");
    const gm_lora *al = &lm->ad->audio_lora;
    lua_createtable(L, al->n, 0);
    for (int i = 0; i < al->n; i++) lua_pushstring(L, al->ad[i].module), lua_rawseti(L, -2, i + 1);
    lua_setfield(L, -2, "audio_module_names");
    lua_pushstring(L, lm->ad->source);
    lua_setfield(L, -2, "source");
    lua_pushstring(L, lm->ad->trial_id);
    lua_setfield(L, -2, "trial_id");
    return 1;
}

/* model:lora_modules(targets [, layers [, {vision = true}]]) -> {"model.layers.0.self_attn.q_proj",
 * ...}: the modules train.targets / train.layers select on this model (gm_lora_describe; layers: a
 * list of layer indices, nil for all); with vision = true those train.vision_targets selects on its
 * tower ("model.vision_tower.encoder.layers.0.self_attn.q_proj", ...; every layer, as the trainer's
 * tower adapters); with audio = true those train.audio_targets selects on Gemma 3n's audio encoder
 * ("model.audio_tower.conformer.0.attention.attn.q_proj", ...; every block). Raises naming a target
 * that matches nothing or a bad expression, or a model without that tower. */
static int l_lora_modules(lua_State *L) {
    lmodel *lm = gm_bind_check_model(L, 1);
    const char *targets = luaL_checkstring(L, 2);
    static const char *const allowed[] = {"vision", "audio", NULL};
    gm_bind_check_opts(L, 4, "lora_modules", allowed);
    const bool vision = gm_bind_opt_bool(L, 4, "vision", false), audio = gm_bind_opt_bool(L, 4, "audio", false);
    if (vision && !lm->m->vision) return luaL_error(L, "lora_modules: %s has no vision tower", lm->m->path);
    gm_config acfg;
    gm_error aerr = {0};
    if (audio && gm_config_audio_tower(&lm->m->cfg, &acfg, &aerr) != GM_OK)
        return luaL_error(L, "lora_modules: %s has no audio encoder", lm->m->path);
    gm_lora_config lc = gm_lora_config_default();
    if (strlen(targets) >= sizeof lc.targets) return luaL_error(L, "lora_modules: targets longer than %d characters", (int)sizeof lc.targets - 1);
    snprintf(lc.targets, sizeof lc.targets, "%s", targets);
    if (lua_istable(L, 3)) {
        for (int i = 0; i < GM_MAX_LAYERS; i++) lc.layers[i] = false;
        for (lua_Integer k = 1, n = luaL_len(L, 3); k <= n; k++) {
            lua_rawgeti(L, 3, k);
            lua_Integer l = lua_tointeger(L, -1);
            lua_pop(L, 1);
            if (l >= 0 && l < GM_MAX_LAYERS) lc.layers[l] = true;
        }
    }
    gm_lora lo;
    memset(&lo, 0, sizeof lo);
    gm_error err = {0};
    if (vision || audio) for (int i = 0; i < GM_MAX_LAYERS; i++) lc.layers[i] = true;
    const gm_model *part = vision ? lm->m->vision : lm->m;
    gm_status ls = audio ? gm_lora_describe(&lo, &lc, gm_arch_get(acfg.arch), &acfg, GM_AUDIO_TOWER_PREFIX, &err)
                         : gm_lora_describe(&lo, &lc, part->arch, &part->cfg,
                                            vision ? GM_VISION_TOWER_PREFIX : lm->m->peft_prefix, &err);
    if (ls != GM_OK) {
        gm_lora_free(&lo);
        return gm_bind_raise(L, &err);
    }
    lua_createtable(L, lo.n, 0);
    for (int i = 0; i < lo.n; i++) lua_pushstring(L, lo.ad[i].module), lua_rawseti(L, -2, i + 1);
    gm_lora_free(&lo);
    return 1;
}

static int l_generate(lua_State *L) {
    lmodel *lm = gm_bind_check_model(L, 1);
    size_t prompt_len;
    const char *prompt = luaL_checklstring(L, 2, &prompt_len);
    static const char *const allowed[] = {"max_tokens", "temperature", "top_k", "top_p", "seed", "chat",
                                          "stop_at_eos", "adapter", "trial", "dot", NULL};
    gm_bind_check_opts(L, 3, "generate", allowed);
    lua_Integer max_tokens = gm_bind_opt_int(L, 3, "max_tokens", 64);
    lua_Number temp = gm_bind_opt_num(L, 3, "temperature", 0.0);
    lua_Integer top_k = gm_bind_opt_int(L, 3, "top_k", 0);
    lua_Number top_p = gm_bind_opt_num(L, 3, "top_p", 1.0);
    lua_Integer seed = gm_bind_opt_int(L, 3, "seed", 0);
    bool chat = gm_bind_opt_bool(L, 3, "chat", false), stop_eos = gm_bind_opt_bool(L, 3, "stop_at_eos", true);
    const char *adapter = gm_bind_opt_str(L, 3, "adapter", NULL);
    const char *dot = gm_bind_opt_str(L, 3, "dot", GM_GENERATE_DOT_DEFAULT);
    bool int8_dot = false;
    char trial_buf[64];
    const char *trial = opt_trial(L, 3, "generate", adapter, trial_buf, sizeof trial_buf);
    if (max_tokens < 1 || max_tokens > (1 << 24))
        return luaL_error(L, "generate: max_tokens must be in 1..%d (got %I)", 1 << 24, max_tokens);
    if (!gm_dot_from_name(dot, &int8_dot)) return luaL_error(L, "generate: dot must be \"int8\" or \"f32\" (got \"%s\")", dot);
    if (!(temp >= 0) || !isfinite(temp)) return luaL_error(L, "generate: temperature must be a finite number >= 0");
    if (!(top_p > 0 && top_p <= 1)) return luaL_error(L, "generate: top_p must be in (0, 1]");
    if (top_k < 0) return luaL_error(L, "generate: top_k must be >= 0 (0 = off)");
    if (chat) {
        push_chat_prompt(L, lm->m->tok, prompt);
        prompt = lua_tolstring(L, -1, &prompt_len);
    }
    int64_t n_prompt = 0;
    int32_t *ids = encode(L, lm, prompt, prompt_len, true, chat, &n_prompt);
    gm_error err = {0};
    if (gm_generate_check(&lm->m->cfg, n_prompt, max_tokens, &err) != GM_OK) {
        gm_free(ids);
        return gm_bind_raise(L, &err);
    }
    int64_t ctx = n_prompt + max_tokens;
    /* the state is kept between calls; a longer context or another adapter makes a new one (the
     * adapter loaded onto the same backend) */
    gm_status us = use_adapter(lm, adapter, trial, &err);
    if (us != GM_OK) {
        gm_free(ids);
        return gm_bind_raise(L, &err);
    }
    if (!lm->st || lm->st_ctx < ctx) {
        gm_infer_free(lm->st);
        lm->st = NULL;
        gm_status s = GM_OK;
        gm_infer_opts io = {.batch = 1, .ctx = ctx, .max_tokens = n_prompt < 512 ? n_prompt : 512,
                            .n_threads = lm->n_threads, .adapter = lm->ad && lm->ad->lora.n > 0 ? &lm->ad->lora : NULL,
                            .backend = lm->be};
        if (io.max_tokens < 1) io.max_tokens = 1;
        if (s == GM_OK) s = gm_infer_new(lm->m, &io, &lm->st, &err);
        if (s != GM_OK) {
            gm_free(ids);
            return gm_bind_raise(L, &err);
        }
        lm->st_ctx = ctx;
    }
    gm_special_ids sp = gm_tokenizer_special(lm->m->tok);
    int32_t stops[2];
    int n_stop = 0;
    if (stop_eos) {
        if (sp.eos >= 0) stops[n_stop++] = sp.eos;
        if (sp.end_of_turn >= 0) stops[n_stop++] = sp.end_of_turn;
    }
    gm_sample_opts so = {.max_new_tokens = max_tokens, .temperature = (float)temp, .top_k = (int)top_k,
                         .top_p = (float)top_p, .seed = (uint64_t)seed, .stop_ids = stops, .n_stop = n_stop,
                         .interrupt = &gm_lua_interrupted};
    int32_t *out = gm_malloc((size_t)max_tokens * sizeof(int32_t));
    if (!out) {
        gm_free(ids);
        return luaL_error(L, "out of memory");
    }
    int64_t n_out = 0;
    gm_generate_stats stats = {0};
    gm_infer_set_int8_dot(lm->st, int8_dot); /* the state is kept between calls; the dots are this call's */
    gm_status s = gm_generate(lm->st, ids, n_prompt, &so, NULL, NULL, out, &n_out, &stats, &err);
    gm_free(ids);
    if (s != GM_OK) {
        gm_free(out);
        return gm_bind_raise(L, &err);
    }
    /* drop a final stop token from the text */
    int64_t n_text = n_out;
    if (n_text > 0 && n_stop > 0 && (out[n_text - 1] == stops[0] || (n_stop > 1 && out[n_text - 1] == stops[1])))
        n_text--;
    char *text = NULL;
    s = gm_tokenizer_decode(lm->m->tok, out, n_text, false, &text, &err);
    gm_free(out);
    if (s != GM_OK) return gm_bind_raise(L, &err);
    lua_pushstring(L, text);
    gm_free(text);
    lua_createtable(L, 0, 5);
    lua_pushinteger(L, stats.n_prompt);
    lua_setfield(L, -2, "prompt_tokens");
    lua_pushinteger(L, stats.n_generated);
    lua_setfield(L, -2, "new_tokens");
    lua_pushnumber(L, stats.prefill_seconds > 0 ? (double)stats.n_prompt / stats.prefill_seconds : 0);
    lua_setfield(L, -2, "prefill_tokens_per_s");
    double dec_tokens = (double)(stats.n_generated > 1 ? stats.n_generated - 1 : 0);
    lua_pushnumber(L, stats.decode_seconds > 0 ? dec_tokens / stats.decode_seconds : 0);
    lua_setfield(L, -2, "decode_tokens_per_s");
    lua_pushstring(L, gm_infer_int8_dots(lm->st) ? "int8" : "f32"); /* what decoding took (an f32 model: f32) */
    lua_setfield(L, -2, "dot");
    return 2;
}

void gm_bind_push_config(lua_State *L, const gm_config *c) {
    lua_createtable(L, 0, 16);
#define SETI(k, v) (lua_pushinteger(L, (lua_Integer)(v)), lua_setfield(L, -2, k))
#define SETN(k, v) (lua_pushnumber(L, (lua_Number)(v)), lua_setfield(L, -2, k))
    lua_pushstring(L, gm_arch_name(c->arch));
    lua_setfield(L, -2, "arch");
    lua_pushstring(L, c->name);
    lua_setfield(L, -2, "name");
    SETI("vocab_size", c->vocab_size);
    SETI("hidden_size", c->hidden_size);
    SETI("num_hidden_layers", c->n_layers);
    SETI("num_attention_heads", c->n_heads);
    SETI("num_key_value_heads", c->n_kv_heads);
    SETI("head_dim", c->head_dim);
    SETI("intermediate_size", c->intermediate_size);
    SETI("sliding_window", c->sliding_window);
    SETI("max_position_embeddings", c->max_position_embeddings);
    SETN("rms_norm_eps", c->rms_norm_eps);
    SETN("query_pre_attn_scalar", c->query_pre_attn_scalar);
    SETI("n_params", gm_config_n_params(c));
    if (c->vision.hidden_size > 0) { /* the vision tower (Hugging Face's vision_config) */
        lua_createtable(L, 0, 8);
        SETI("image_size", c->vision.image_size);
        SETI("patch_size", c->vision.patch_size);
        SETI("hidden_size", c->vision.hidden_size);
        SETI("num_hidden_layers", c->vision.n_layers);
        SETI("mm_tokens_per_image", c->vision.tokens);
        SETI("image_floats", gm_mm_image_floats(c)); /* the most floats one preprocessed image takes */
        SETI("image_token_id", c->vision.image_token_id);
        SETI("n_params", c->vision.params);
        lua_setfield(L, -2, "vision");
    }
    if (gm_config_has_audio(c)) { /* the audio encoder (audio_config): Gemma 3n's, Gemma 4's */
        lua_createtable(L, 0, 6);
        SETI("hidden_size", c->audio.hidden_size);
        SETI("conf_num_hidden_layers", c->audio.n_layers);
        SETI("audio_soft_tokens_per_image", c->audio.soft_tokens); /* Gemma 4: the most one clip takes (750) */
        SETI("audio_token_id", c->audio.audio_token_id);
        SETI("n_params", c->audio.params);
        lua_setfield(L, -2, "audio");
    }
#undef SETI
#undef SETN
}

/* model:config(): the config's fields; `vision` only when the model can read images (a loaded
 * SigLIP tower: Gemma 3n's and Gemma 4's configs name towers gemmarun does not have), else
 * `no_images`, why; `no_audio`, why the model reads no audio (absent when it does). */
static int l_config(lua_State *L) {
    lmodel *lm = gm_bind_check_model(L, 1);
    gm_bind_push_config(L, &lm->m->cfg);
    const char *why = gm_model_no_images(lm->m);
    if (why) {
        lua_pushnil(L);
        lua_setfield(L, -2, "vision");
        lua_pushstring(L, why);
        lua_setfield(L, -2, "no_images");
    }
    if ((why = gm_model_no_audio(lm->m)) != NULL) {
        lua_pushstring(L, why);
        lua_setfield(L, -2, "no_audio");
    }
    return 1;
}

/* model:sha256() -> hex, files: the identity of the model's files (gm_model_sha256). */
static int l_sha256(lua_State *L) {
    lmodel *lm = gm_bind_check_model(L, 1);
    char hex[65], files[1024];
    gm_error err = {0};
    if (gm_model_sha256(lm->m, hex, files, sizeof files, &err) != GM_OK) return gm_bind_raise(L, &err);
    lua_pushstring(L, hex);
    lua_pushstring(L, files);
    return 2;
}

/* model:release_weight_pages(): drops the resident pages of the mapped linear weights (they fault
 * back in when read). The runner calls it before each trial, so that a trial on a re-encoded base
 * does not carry the stored base a previous trial paged in, and its peak is its own. */
static int l_release_weight_pages(lua_State *L) {
    lmodel *lm = gm_bind_check_model(L, 1);
    gm_model_release_linear_pages(lm->m);
    return 0;
}

static int l_close(lua_State *L) {
    lmodel *lm = luaL_checkudata(L, 1, GM_MODEL_MT);
    if (lm->hard) gm_mm_hard_free(lm->hard);
    gm_free(lm->hard);
    lm->hard = NULL;
    gm_infer_free(lm->st);
    gm_adapter_free(lm->ad);
    gm_backend_free(lm->be);
    gm_model_free(lm->m);
    lm->st = NULL;
    lm->ad = NULL;
    lm->be = NULL;
    lm->m = NULL;
    return 0;
}

static int l_tostring(lua_State *L) {
    lmodel *lm = luaL_checkudata(L, 1, GM_MODEL_MT);
    if (!lm->m) lua_pushliteral(L, "gm.Model (closed)");
    else lua_pushfstring(L, "gm.Model (%s, %s)", lm->m->cfg.name, lm->m->path);
    return 1;
}

/* gm.hub_id(name) -> "google/gemma-3-270m" for a model name gemmarun fetches, else nil. */
static int l_hub_id(lua_State *L) {
    const char *id = gm_fetch_hub_id(luaL_checkstring(L, 1));
    if (id) lua_pushstring(L, id);
    else lua_pushnil(L);
    return 1;
}

void gm_lua_open_model(lua_State *L) {
    static const luaL_Reg methods[] = {{"tokenize", l_tokenize}, {"detokenize", l_detokenize},
                                       {"generate", l_generate}, {"logits", l_logits},
                                       {"save_adapter", l_save_adapter}, {"save_merged", l_save_merged}, {"adapter_info", l_adapter_info}, {"lora_modules", l_lora_modules}, {"config", l_config}, {"sha256", l_sha256},
                                       {"release_weight_pages", l_release_weight_pages},
                                       {"close", l_close}, {NULL, NULL}};
    luaL_newmetatable(L, GM_MODEL_MT);
    luaL_newlib(L, methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_close);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, l_close);
    lua_setfield(L, -2, "__close");
    lua_pushcfunction(L, l_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pop(L, 1);
    static const luaL_Reg fns[] = {{"load_model", l_load_model}, {"device_ok", l_device_ok}, {"compute_dtype", l_compute_dtype}, {"device_available", l_device_available}, {"device_memory", l_device_memory}, {"hub_id", l_hub_id}, {"with_vision_tower", l_with_vision_tower}, {NULL, NULL}};
    luaL_newlib(L, fns);
    lua_setglobal(L, "gm");
}

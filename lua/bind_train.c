/*
 * bind_train.c - Lua bindings for data sets and LoRA/QLoRA training.
 *
 *   gm.dataset(model)                      -> dataset (tokenizes with the model's tokenizer)
 *   dataset:add_chat(messages [, {max_length = 256, label = n, images = {path, ...}, image_sha = {hex, ...}}])
 *                                           -> true | false, reason   (messages: {{role=, content=}, ...};
 *                                              content holds one "<start_of_image>" per image)
 *       ... audio = {path, ...}, audio_sha = {hex, ...} (Gemma 3n: content holds one
 *                                              "<start_of_audio>" per clip; not with images)
 *   dataset:max_images(), dataset:max_audio() -> the most images / audio clips one example has
 *   gm.audio_check(path [, max_seconds])    -> sha256 hex, feature frames, samples at 16 kHz (decoded
 *                                              completely; raises naming the file when it cannot be used)
 *   gm.image_check(ref)                     -> sha256 hex, width, height (decoded completely; raises
 *                                              naming the file when it cannot be used; ref: a file or
 *                                              a region "PATH#xywh=X,Y,W,H"; width, height: the file's)
 *   gm.image_checker()                      -> checker: checker:check(ref) is gm.image_check(ref),
 *                                              each distinct file decoded and hashed once (close it
 *                                              after one validation pass)
 *   dataset:size(), dataset:stats()         -> {n, rejected, truncated}
 *   dataset:sha256()                        -> hex of the tokenized examples (gm_dataset_sha256)
 *   dataset:example(i)                      -> {tokens = n, response_start = k, label = n}
 *   gm.fortunes(topic [, {max_chars = 400, dir = "/usr/share/games/fortunes"}]) -> {text, ...}
 *   model:trainer(opts)                    -> trainer   (opts: the schema's options, gm_train_opts.def,
 *                                              plus seed, steps, threads, max_images: images per
 *                                              micro-batch, max_audio / max_audio_frames: clips per
 *                                              micro-batch and the longest clip's frames, from the data)
 *   trainer:step(dataset, {i, ...})        -> {loss, tokens, grad_norm, lr, step [, router_max_load,
 *                                              router_load_cv (a mixture of experts: gm_step_stats)]}
 *       the indices (1-based) are split into micro-batches of opts.batch (gradient accumulation);
 *       under data parallelism (gm.dist_info().world_size > 1, lua/bind_dist.c) the trainer
 *       joins the world when made, each rank passes its share of the step (possibly none) and
 *       loss, tokens and grad_norm are the whole step's (gm_trainer_set_dist)
 *   trainer:eval(dataset, {i, ...})        -> mean loss, supervised tokens
 *   trainer:generate(dataset, {i, ...} [, {max_tokens, stop}]) -> each example's greedy continuation (ids)
 *   trainer:score_labels(dataset, {i, ...}, {{tok, ...}, ...}) -> best label per example, scores
 *                                              (log-probability of each whole candidate response)
 *   trainer:save(path [, {epoch, pos, loss, config}]), trainer:load(path) -> {step, epoch, pos}
 *   trainer:memory()                       -> {[kind] = bytes, total = bytes}
 *   gm.peak_rss(), gm.clock()               -> bytes, seconds (monotonic)
 *   gm.lora_targets_check(targets)          -> true, nil, text | false, message (PEFT target_modules rules)
 *   gm.train_schema()                       -> the training options' schema (gm_train_opts.def)
 *   gm.train_option_check(name, value)      -> true, value | false, message (the schema's check)
 *
 * Userdata keep their model alive through a user value; __gc/__close free the core objects.
 */
#define _POSIX_C_SOURCE 200809L
#include "bind_util.h"

#include "gm_adapter.h"
#include "gm_lua.h"
#include "write_rule.h"

#include "gm_alloc.h"
#include "gm_audio.h"
#include "gm_audio_encoder.h" /* gm_audio_tokens */
#include "gm_data.h"
#include "gm_dist.h"
#include "gm_image.h"
#include "gm_train.h"

#include <lauxlib.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define DATASET_MT "gm.Dataset"
#define TRAINER_MT "gm.Trainer"
#define CHECKER_MT "gm.ImageChecker"

typedef struct ldataset {
    gm_dataset ds;
    const gm_tokenizer *tok;
    const gm_model *m;
    bool open;
} ldataset;

typedef struct ltrainer {
    gm_trainer *tr;
    float *pixels;          /* (grad_accum * max_images * image_floats) the micro-batches' images */
    int64_t *hw;            /* (grad_accum * max_images, 2) their sizes (Gemma 4: each its own) */
    int64_t max_images, S;  /* per micro-batch; the tower's image side */
    int64_t image_floats;   /* the most floats one image takes (gm_mm_image_floats) */
    int32_t *ids, *targets; /* (grad_accum * batch * max_length) collation buffers */
    gm_batch *micro;        /* (grad_accum) */
    int64_t *idx;           /* (grad_accum * batch) */
    int64_t *scan;          /* indices of the last choose/score call (their own length) */
    int32_t pad_id;
    float *audio;           /* (grad_accum * max_audio, max_audio_frames, 128) the micro-batches' features */
    uint8_t *audio_valid;   /* (grad_accum * max_audio, max_audio_frames) */
    int64_t max_audio, max_audio_frames;
    struct gm_audio_fe *fe; /* the feature extractor (audio runs) */
} ltrainer;

static ldataset *check_ds(lua_State *L, int i) {
    ldataset *d = luaL_checkudata(L, i, DATASET_MT);
    if (!d->open) luaL_error(L, "this dataset was closed");
    return d;
}

static ltrainer *check_tr(lua_State *L, int i) {
    ltrainer *t = luaL_checkudata(L, i, TRAINER_MT);
    if (!t->tr) luaL_error(L, "this trainer was closed");
    return t;
}

gm_trainer *gm_bind_check_trainer(lua_State *L, int idx) { return check_tr(L, idx)->tr; }

/* ---- data sets ---- */

static int l_dataset(lua_State *L) {
    lmodel *lm = gm_bind_check_model(L, 1);
    if (!lm->m->tok) return luaL_error(L, "%s has no tokenizer", lm->m->path);
    ldataset *d = lua_newuserdatauv(L, sizeof *d, 1);
    memset(d, 0, sizeof *d);
    gm_dataset_init(&d->ds);
    d->tok = lm->m->tok;
    d->m = lm->m;
    d->open = true;
    luaL_setmetatable(L, DATASET_MT);
    lua_pushvalue(L, 1);
    lua_setiuservalue(L, -2, 1); /* keep the model (and its tokenizer) alive */
    return 1;
}

static int l_ds_add_chat(lua_State *L) {
    ldataset *d = check_ds(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    static const char *const allowed[] = {"max_length", "label", "images", "image_sha", "crops", "image_sizes", "audio",
                                          "audio_sha", "audio_samples", NULL};
    gm_bind_check_opts(L, 3, "add_chat", allowed);
    lua_Integer max_length = gm_bind_opt_int(L, 3, "max_length", 256);
    lua_Integer label = gm_bind_opt_int(L, 3, "label", -1);
    const char *images[GM_MAX_IMAGES_PER_EXAMPLE], *shas[GM_MAX_IMAGES_PER_EXAMPLE];
    int64_t crops[GM_MAX_IMAGES_PER_EXAMPLE], sizes[2 * GM_MAX_IMAGES_PER_EXAMPLE], tokens[GM_MAX_IMAGES_PER_EXAMPLE];
    bool pan_and_scan = false, have_sizes = false;
    lua_Integer n_images = 0;
    if (lua_istable(L, 3)) {
        lua_getfield(L, 3, "images");
        lua_getfield(L, 3, "image_sha");
        if (!lua_isnil(L, -2)) {
            luaL_checktype(L, -2, LUA_TTABLE);
            n_images = luaL_len(L, -2);
            if (n_images > GM_MAX_IMAGES_PER_EXAMPLE)
                return luaL_error(L, "add_chat: at most %d images per example, got %d", GM_MAX_IMAGES_PER_EXAMPLE, (int)n_images);
            for (lua_Integer i = 1; i <= n_images; i++) {
                lua_rawgeti(L, -2, i);
                images[i - 1] = lua_tostring(L, -1);
                lua_pop(L, 1);
                shas[i - 1] = NULL;
                if (lua_istable(L, -1)) {
                    lua_rawgeti(L, -1, i);
                    shas[i - 1] = lua_tostring(L, -1);
                    lua_pop(L, 1);
                }
                if (!images[i - 1]) return luaL_error(L, "add_chat: images[%d] must be a file path", (int)i);
            }
        }
        lua_pop(L, 2); /* the lists stay referenced by the options table */
        /* crops: per image its pan & scan crop count (gm.image_check's fourth result) */
        lua_getfield(L, 3, "crops");
        if (!lua_isnil(L, -1)) {
            luaL_checktype(L, -1, LUA_TTABLE);
            if (luaL_len(L, -1) != n_images)
                return luaL_error(L, "add_chat: crops lists %d counts for %d images", (int)luaL_len(L, -1), (int)n_images);
            for (lua_Integer i = 1; i <= n_images; i++) {
                lua_rawgeti(L, -1, i);
                int isnum = 0;
                crops[i - 1] = (int64_t)lua_tointegerx(L, -1, &isnum);
                lua_pop(L, 1);
                if (!isnum) return luaL_error(L, "add_chat: crops[%d] must be an integer", (int)i);
            }
            pan_and_scan = true;
        }
        lua_pop(L, 1);
        /* image_sizes: per image {w, h} of what it references (gm.image_check's fifth and sixth
         * results): Gemma 4's soft tokens per image follow from them */
        lua_getfield(L, 3, "image_sizes");
        if (!lua_isnil(L, -1)) {
            luaL_checktype(L, -1, LUA_TTABLE);
            if (luaL_len(L, -1) != n_images)
                return luaL_error(L, "add_chat: image_sizes lists %d sizes for %d images", (int)luaL_len(L, -1), (int)n_images);
            for (lua_Integer i = 1; i <= n_images; i++) {
                lua_rawgeti(L, -1, i);
                luaL_checktype(L, -1, LUA_TTABLE);
                for (int k = 0; k < 2; k++) {
                    lua_rawgeti(L, -1, k + 1);
                    sizes[2 * (i - 1) + k] = (int64_t)lua_tointeger(L, -1);
                    lua_pop(L, 1);
                }
                lua_pop(L, 1);
            }
            have_sizes = true;
        }
        lua_pop(L, 1);
    }
    /* audio clips: their files and sha256, as images', and their lengths (Gemma 4's soft tokens) */
    const char *audio[GM_MAX_IMAGES_PER_EXAMPLE], *audio_sha[GM_MAX_IMAGES_PER_EXAMPLE];
    int64_t audio_samples[GM_MAX_IMAGES_PER_EXAMPLE];
    lua_Integer n_audio = 0;
    bool have_samples = false;
    if (lua_istable(L, 3)) {
        lua_getfield(L, 3, "audio_samples");
        if (!lua_isnil(L, -1)) {
            luaL_checktype(L, -1, LUA_TTABLE);
            for (lua_Integer i = 1; i <= luaL_len(L, -1) && i <= GM_MAX_IMAGES_PER_EXAMPLE; i++) {
                lua_rawgeti(L, -1, i);
                audio_samples[i - 1] = (int64_t)luaL_checkinteger(L, -1);
                lua_pop(L, 1);
            }
            have_samples = true;
        }
        lua_pop(L, 1);
        lua_getfield(L, 3, "audio");
        lua_getfield(L, 3, "audio_sha");
        if (!lua_isnil(L, -2)) {
            luaL_checktype(L, -2, LUA_TTABLE);
            n_audio = luaL_len(L, -2);
            if (n_audio > GM_MAX_IMAGES_PER_EXAMPLE)
                return luaL_error(L, "add_chat: at most %d audio clips per example, got %d", GM_MAX_IMAGES_PER_EXAMPLE, (int)n_audio);
            for (lua_Integer i = 1; i <= n_audio; i++) {
                lua_rawgeti(L, -2, i);
                audio[i - 1] = lua_tostring(L, -1);
                lua_pop(L, 1);
                audio_sha[i - 1] = NULL;
                if (lua_istable(L, -1)) {
                    lua_rawgeti(L, -1, i);
                    audio_sha[i - 1] = lua_tostring(L, -1);
                    lua_pop(L, 1);
                }
                if (!audio[i - 1]) return luaL_error(L, "add_chat: audio[%d] must be a file path", (int)i);
            }
        }
        lua_pop(L, 2);
    }
    if (n_audio > 0 && n_images > 0) {
        lua_pushboolean(L, 0);
        lua_pushstring(L, "it has both images and audio; gemmarun reads one or the other per example (Gemma 3n's images "
                          "are not read)");
        return 2;
    }
    if (n_audio > 0 && gm_model_no_audio(d->m)) {
        lua_pushboolean(L, 0);
        lua_pushfstring(L, "it has an audio clip (%s), but %s: %s", audio[0], d->m->path, gm_model_no_audio(d->m));
        return 2;
    }
    if (n_images > 0 && gm_model_no_images(d->m)) {
        lua_pushboolean(L, 0);
        lua_pushfstring(L, "it has an image (%s), but %s: %s", images[0], d->m->path, gm_model_no_images(d->m));
        return 2;
    }
    if (max_length < 2) return luaL_error(L, "add_chat: max_length must be >= 2 (got %d)", (int)max_length);
    lua_Integer n = luaL_len(L, 2);
    if (n < 1 || n > 256) return luaL_error(L, "add_chat: expected 1..256 messages, got %d", (int)n);
    gm_chat_msg msgs[256];
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, 2, i);
        if (!lua_istable(L, -1)) return luaL_error(L, "add_chat: message %d must be a table {role=, content=}", (int)i);
        lua_getfield(L, -1, "role");
        lua_getfield(L, -2, "content");
        if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING)
            return luaL_error(L, "add_chat: message %d needs string fields role and content", (int)i);
        msgs[i - 1].role = lua_tostring(L, -2);
        msgs[i - 1].content = lua_tostring(L, -1);
        lua_pop(L, 3); /* strings stay referenced by the message tables */
    }
    gm_error err = {0};
    gm_mm_spec mm = gm_mm_spec_image(&d->m->cfg);
    gm_mm_spec as = gm_mm_spec_audio(&d->m->cfg);
    /* Gemma 4: each image's soft tokens, from the size it is read at (given, or found here) */
    bool per_image = n_images > 0 && d->m->vision && mm.image.max_patches > 0;
    for (lua_Integer i = 0; per_image && i < n_images; i++) {
        int64_t w = have_sizes ? sizes[2 * i] : 0, h = have_sizes ? sizes[2 * i + 1] : 0;
        gm_status sz = GM_OK;
        if (!have_sizes) {
            char sha[65], path[GM_IMAGE_PATH_MAX];
            gm_image_rect r;
            bool has_rect = false;
            sz = gm_image_check(NULL, images[i], sha, &w, &h, &err);
            if (sz == GM_OK) sz = gm_image_ref_parse(images[i], path, sizeof path, &r, &has_rect, &err);
            if (sz == GM_OK && has_rect) w = r.w, h = r.h;
        }
        if (sz == GM_OK) sz = gm_mm_image_tokens(&d->m->cfg, w, h, &tokens[i], &err);
        if (sz != GM_OK) {
            if (sz != GM_ERR_INVALID) return gm_bind_raise(L, &err);
            d->ds.n_rejected++; /* counted with the examples the data set refuses */
            lua_pushboolean(L, 0);
            lua_pushfstring(L, "image %d (%s): %s", (int)i + 1, images[i], err.msg);
            return 2;
        }
    }
    /* Gemma 4: each clip's soft tokens, from its length (given: gm.audio_check's samples, or found here) */
    bool per_clip = n_audio > 0 && d->m->cfg.arch == GM_ARCH_GEMMA4;
    for (lua_Integer i = 0; per_clip && i < n_audio; i++) {
        if (!have_samples) {
#ifdef GM_HAVE_AUDIO
            char sha[65];
            int64_t frames = 0;
            gm_audio_limits lim = {0, GM_AUDIO4_MIN_SAMPLES};
            if (gm_audio_check(audio[i], &lim, &audio_samples[i], &frames, sha, &err) != GM_OK) {
                d->ds.n_rejected++;
                lua_pushboolean(L, 0);
                lua_pushfstring(L, "audio clip %d (%s): %s", (int)i + 1, audio[i], err.msg);
                return 2;
            }
#else
            return luaL_error(L, "add_chat: audio on Gemma 4 needs gemmarun built with audio");
#endif
        }
        tokens[i] = gm_audio_tokens(&d->m->cfg, audio_samples[i]);
    }
    gm_status s = n_audio > 0 ? gm_dataset_add_chat_audio(&d->ds, d->tok, msgs, n, max_length, (int32_t)label, &as, audio,
                                                          audio_sha, n_audio, per_clip ? tokens : NULL, &err)
                              : gm_dataset_add_chat_images(&d->ds, d->tok, msgs, n, max_length, (int32_t)label,
                                                           d->m->vision ? &mm : NULL, images, shas, n_images,
                                                           pan_and_scan ? crops : NULL, per_image ? tokens : NULL, &err);
    if (s == GM_OK) {
        lua_pushboolean(L, 1);
        return 1;
    }
    if (s != GM_ERR_INVALID) return gm_bind_raise(L, &err);
    lua_pushboolean(L, 0);
    lua_pushstring(L, err.msg);
    return 2;
}

static int l_ds_max_images(lua_State *L) {
    lua_pushinteger(L, gm_dataset_max_images(&check_ds(L, 1)->ds));
    return 1;
}

static int l_ds_max_audio(lua_State *L) {
    lua_pushinteger(L, gm_dataset_max_audio(&check_ds(L, 1)->ds));
    return 1;
}

/* gm.audio_check(path [, max_seconds [, min_samples]]) -> sha256 hex, frames, samples, frames4
 * (gm_audio_check; frames: Gemma 3n's extractor's, frames4: Gemma 4's, of the clip as the extractor
 * cuts it; min_samples: gm_audio_limits', Gemma 3n's 513 by default, 161 for Gemma 4 only). */
static int l_audio_check(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
#ifdef GM_HAVE_AUDIO
    gm_audio_limits lim = {luaL_optnumber(L, 2, 0), (int64_t)luaL_optinteger(L, 3, 0)};
    char sha[65];
    int64_t samples = 0, frames = 0;
    gm_error err = {0};
    if (gm_audio_check(path, &lim, &samples, &frames, sha, &err) != GM_OK) return gm_bind_raise(L, &err);
    int64_t frames4 = 0;
    gm_audio_frames_kind(GM_AUDIO_FE_GEMMA4, samples, NULL, &frames4);
    lua_pushstring(L, sha);
    lua_pushinteger(L, frames);
    lua_pushinteger(L, samples);
    lua_pushinteger(L, frames4);
    return 4;
#else
    return luaL_error(L, "%s: this gemmarun was built without audio (cmake -DGM_AUDIO=OFF)", path);
#endif
}

/* gm_image_check's results and the reference's pan & scan crop count (Gemma 3's processor's
 * parameters, on the region's size for a region), or raise naming the reference. */
static int image_check(lua_State *L, gm_image_check_cache *cache, const char *ref) {
    char sha[65], path[GM_IMAGE_PATH_MAX];
    int64_t w = 0, h = 0;
    gm_error err = {0};
    if (gm_image_check(cache, ref, sha, &w, &h, &err) != GM_OK) return gm_bind_raise(L, &err);
    gm_image_rect r;
    bool has_rect = false;
    if (gm_image_ref_parse(ref, path, sizeof path, &r, &has_rect, &err) != GM_OK) return gm_bind_raise(L, &err);
    gm_image_opts o = gm_image_opts_gemma3(GM_IMAGE_GEMMA3_SIZE);
    gm_image_rect crops[GM_IMAGE_MAX_CROPS];
    lua_pushstring(L, sha);
    lua_pushinteger(L, w);
    lua_pushinteger(L, h);
    lua_pushinteger(L, gm_image_pan_and_scan_crops(has_rect ? r.w : w, has_rect ? r.h : h, &o, crops, GM_IMAGE_MAX_CROPS));
    lua_pushinteger(L, has_rect ? r.w : w); /* the size the reference is read at (a region's own) */
    lua_pushinteger(L, has_rect ? r.h : h);
    return 6;
}

/* gm.image_check(ref) -> sha256 hex, the file's width, height, and the pan & scan crops Gemma 3's
 * processor would cut from the referenced image; raises naming the file. */
static int l_image_check(lua_State *L) { return image_check(L, NULL, luaL_checkstring(L, 1)); }

typedef struct lchecker {
    gm_image_check_cache *cache;
} lchecker;

/* gm.image_checker() -> a checker with one cache for a validation pass. */
static int l_image_checker(lua_State *L) {
    lchecker *c = lua_newuserdatauv(L, sizeof *c, 0);
    c->cache = NULL;
    luaL_setmetatable(L, CHECKER_MT);
    if (!(c->cache = gm_image_check_cache_new())) return luaL_error(L, "out of memory for an image check cache");
    return 1;
}

static int l_checker_check(lua_State *L) {
    lchecker *c = luaL_checkudata(L, 1, CHECKER_MT);
    const char *ref = luaL_checkstring(L, 2);
    if (!c->cache) return luaL_error(L, "this image checker was closed");
    return image_check(L, c->cache, ref);
}

static int l_checker_close(lua_State *L) {
    lchecker *c = luaL_checkudata(L, 1, CHECKER_MT);
    gm_image_check_cache_free(c->cache);
    c->cache = NULL;
    return 0;
}

static int l_ds_size(lua_State *L) {
    lua_pushinteger(L, check_ds(L, 1)->ds.n);
    return 1;
}

static int l_ds_stats(lua_State *L) {
    ldataset *d = check_ds(L, 1);
    lua_createtable(L, 0, 3);
    lua_pushinteger(L, d->ds.n);
    lua_setfield(L, -2, "n");
    lua_pushinteger(L, d->ds.n_rejected);
    lua_setfield(L, -2, "rejected");
    lua_pushinteger(L, d->ds.n_truncated);
    lua_setfield(L, -2, "truncated");
    return 1;
}

static int l_ds_example(lua_State *L) {
    ldataset *d = check_ds(L, 1);
    lua_Integer i = luaL_checkinteger(L, 2);
    if (i < 1 || i > d->ds.n) return luaL_error(L, "example %d: index outside 1..%d", (int)i, (int)d->ds.n);
    const gm_example *e = &d->ds.ex[i - 1];
    lua_createtable(L, 0, 3);
    lua_pushinteger(L, e->n);
    lua_setfield(L, -2, "tokens");
    lua_pushinteger(L, e->response_start);
    lua_setfield(L, -2, "response_start");
    lua_pushinteger(L, e->label);
    lua_setfield(L, -2, "label");
    return 1;
}

static int l_ds_sha256(lua_State *L) {
    ldataset *d = check_ds(L, 1);
    char hex[65];
    gm_error err = {0};
    if (gm_dataset_sha256(&d->ds, hex, &err) != GM_OK) return gm_bind_raise(L, &err);
    lua_pushstring(L, hex);
    return 1;
}

static int l_ds_close(lua_State *L) {
    ldataset *d = luaL_checkudata(L, 1, DATASET_MT);
    if (d->open) gm_dataset_free(&d->ds);
    d->open = false;
    return 0;
}

typedef struct text_sink {
    lua_State *L;
    lua_Integer n;
} text_sink;

static void push_text(const char *text, size_t len, void *user) {
    text_sink *s = user;
    lua_pushlstring(s->L, text, len);
    lua_rawseti(s->L, -2, ++s->n);
}

static int l_fortunes(lua_State *L) {
    const char *topic = luaL_checkstring(L, 1);
    static const char *const allowed[] = {"max_chars", "dir", NULL};
    gm_bind_check_opts(L, 2, "fortunes", allowed);
    lua_Integer max_chars = gm_bind_opt_int(L, 2, "max_chars", 400);
    const char *dir = gm_bind_opt_str(L, 2, "dir", GM_FORTUNES_DIR);
    if (strchr(topic, '/') || strcmp(topic, "..") == 0) return luaL_error(L, "fortunes: '%s' is not a topic name", topic);
    lua_newtable(L);
    text_sink s = {L, 0};
    gm_error err = {0};
    if (gm_fortunes_read(dir, topic, (size_t)max_chars, push_text, &s, NULL, &err) != GM_OK) return gm_bind_raise(L, &err);
    return 1;
}

/* ---- trainer ---- */

/* Keys a trainer's option table takes beyond the schema's (core/train/gm_train_opts.def): the
 * runner's derived values - the seed, the total steps the schedule decays over, the threads. */
/* The options besides the schema's: read by gm_bind_read_train_opts, listed by unknown_option. */
static const char *const EXTRA_KEYS[] = {"seed", "steps", "threads", "max_images", "max_audio", "max_audio_frames",
                                         "ple_resident"};
#define N_EXTRA ((int)(sizeof EXTRA_KEYS / sizeof EXTRA_KEYS[0]))

/* Raises "<fn>: unknown option 'x' (did you mean ...?) (allowed: ...)" listing the schema's names
 * and the extras. */
static bool is_extra_key(const char *k) {
    for (int i = 0; i < N_EXTRA; i++)
        if (!strcmp(k, EXTRA_KEYS[i])) return true;
    return false;
}

static void unknown_option(lua_State *L, const char *fn, const char *key) {
    int n;
    const gm_opt_spec *sp = gm_train_opt_specs(&n);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int i = 0; i < n; i++) {
        if (i) luaL_addstring(&b, ", ");
        luaL_addstring(&b, sp[i].name);
    }
    for (int i = 0; i < N_EXTRA; i++) {
        luaL_addstring(&b, ", ");
        luaL_addstring(&b, EXTRA_KEYS[i]);
    }
    luaL_pushresult(&b);
    const gm_opt_spec *near = gm_train_opt_closest(key);
    luaL_error(L, "%s: unknown option '%s'%s%s%s (allowed: %s)", fn, key, near ? " (did you mean '" : "", near ? near->name : "",
               near ? "'?)" : "", lua_tostring(L, -1));
}

/* The targets text of the Lua value at idx: a string as it is, or a list of plain module names
 * joined with commas (PEFT: list entries are names, never patterns). NULL with a message in msg
 * when the value is neither. */
static const char *targets_text(lua_State *L, int idx, const char *name, char *buf, size_t cap, char *msg, size_t msgcap) {
    idx = lua_absindex(L, idx);
    if (lua_type(L, idx) == LUA_TSTRING) return lua_tostring(L, idx);
    if (lua_type(L, idx) != LUA_TTABLE) {
        snprintf(msg, msgcap, "%s must be \"all-linear\", a list of module names or a regular expression (a string)", name);
        return NULL;
    }
    size_t k = 0;
    buf[0] = '\0';
    lua_Integer n = luaL_len(L, idx);
    if (n == 0) {
        snprintf(msg, msgcap, "%s is an empty list", name);
        return NULL;
    }
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, idx, i);
        const char *e = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
        bool bad = !e || !*e || gm_lora_targets_is_regex(e) || strpbrk(e, ", \t");
        if (bad) {
            if (e && gm_lora_targets_is_regex(e))
                snprintf(msg, msgcap, "%s[%d] = '%s': a list holds module names; give a regular expression as one string", name,
                         (int)i, e);
            else snprintf(msg, msgcap, "%s[%d] is not a module name", name, (int)i);
            lua_pop(L, 1);
            return NULL;
        }
        int w = snprintf(buf + k, cap - k, "%s%s", i > 1 ? "," : "", e);
        lua_pop(L, 1);
        if (w < 0 || (size_t)w >= cap - k) {
            snprintf(msg, msgcap, "%s: longer than %d characters", name, (int)cap - 1);
            return NULL;
        }
        k += (size_t)w;
    }
    return buf;
}

/* Sets one schema option from the Lua value on top of the stack; raises on a wrong type or value. */
/* "8", "\"8\" (a string)", "{...} (a table)": a Lua value as the messages show it. */
static void show_value(lua_State *L, int idx, char *buf, size_t cap) {
    switch (lua_type(L, idx)) {
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx)) snprintf(buf, cap, "%lld", (long long)lua_tointeger(L, idx));
        else snprintf(buf, cap, "%.14g", lua_tonumber(L, idx));
        break;
    case LUA_TSTRING: snprintf(buf, cap, "\"%.60s\" (a string)", lua_tostring(L, idx)); break;
    case LUA_TBOOLEAN: snprintf(buf, cap, "%s", lua_toboolean(L, idx) ? "true" : "false"); break;
    default: snprintf(buf, cap, "a %s", luaL_typename(L, idx)); break;
    }
}

/* Checks the Lua value at idx against schema row sp and stores it into o; false with the
 * schema's message ("rank = 0: must be an integer 1..4096") in msg otherwise. The one check every
 * Lua entry point uses: m:trainer{}, gm.plan and experiment files (gm.train_option_check). */
static bool option_from_lua(lua_State *L, int idx, gm_train_opts *o, const gm_opt_spec *sp, char *msg, size_t cap) {
    idx = lua_absindex(L, idx);
    gm_opt_value v = {0, NULL, NULL};
    bool layers[GM_MAX_LAYERS];
    char joined[GM_LORA_TARGETS_MAX], shown[96], range[160];
    int t = lua_type(L, idx);
    gm_opt_describe_range(sp, range, sizeof range);
    show_value(L, idx, shown, sizeof shown);
    switch (sp->kind) {
    case GM_OPT_INT:
    case GM_OPT_NUM:
        if (t != LUA_TNUMBER) return snprintf(msg, cap, "%s = %s: must be %s", sp->name, shown, range), false;
        v.num = lua_tonumber(L, idx);
        if (!isfinite(v.num)) return snprintf(msg, cap, "%s = %s: must be a finite number", sp->name, shown), false;
        break;
    case GM_OPT_BOOL:
        if (t != LUA_TBOOLEAN) return snprintf(msg, cap, "%s = %s: must be true or false", sp->name, shown), false;
        v.num = lua_toboolean(L, idx);
        break;
    case GM_OPT_ENUM:
        if (t != LUA_TSTRING) return snprintf(msg, cap, "%s = %s: allowed values are %s", sp->name, shown, range), false;
        v.text = lua_tostring(L, idx);
        break;
    case GM_OPT_TARGETS: {
        char m2[300];
        v.text = targets_text(L, idx, sp->name, joined, sizeof joined, m2, sizeof m2);
        if (!v.text) return snprintf(msg, cap, "%s", m2), false;
        gm_error err = {0};
        if (gm_train_opt_targets_check(sp, v.text, &err) != GM_OK) return snprintf(msg, cap, "%s", err.msg), false;
        break;
    }
    case GM_OPT_LAYERS: {
        if (t != LUA_TTABLE) return snprintf(msg, cap, "layers must be a list of layer indices (0-based)"), false;
        for (int i = 0; i < GM_MAX_LAYERS; i++) layers[i] = false;
        lua_Integer n = luaL_len(L, idx);
        if (n == 0)
            return snprintf(msg, cap, "layers is empty: list at least one layer (0-based), or leave it out for every layer"), false;
        for (lua_Integer i = 1; i <= n; i++) {
            lua_rawgeti(L, idx, i);
            show_value(L, -1, shown, sizeof shown);
            lua_Integer l = lua_isinteger(L, -1) ? lua_tointeger(L, -1) : -1;
            lua_pop(L, 1);
            if (l < 0 || l >= GM_MAX_LAYERS) return snprintf(msg, cap, "layers: %s is not a layer index", shown), false;
            if (layers[l]) return snprintf(msg, cap, "layers: %lld is listed twice", (long long)l), false;
            layers[l] = true;
        }
        v.layers = layers;
        break;
    }
    }
    gm_error err = {0};
    if (gm_train_opt_set(o, sp, v, &err) != GM_OK) return snprintf(msg, cap, "%s", err.msg), false;
    return true;
}

static void set_from_lua(lua_State *L, const char *fn, gm_train_opts *o, const gm_opt_spec *sp) {
    char msg[1600];
    if (!option_from_lua(L, -1, o, sp, msg, sizeof msg)) luaL_error(L, "%s: %s", fn, msg);
}

/* gm.train_option_check(name, value) -> true, value | false, message: one training option checked
 * by the schema (as m:trainer{} checks it), the value normalized (integral numbers of integer
 * options as integers, a targets list joined). For lua/prelude.lua's validation. */
static int l_train_option_check(lua_State *L) {
    const char *name = luaL_checkstring(L, 1);
    luaL_checkany(L, 2);
    const gm_opt_spec *sp = gm_train_opt_find(name);
    if (!sp) return luaL_error(L, "train_option_check: '%s' is not a training option", name);
    gm_train_opts o = gm_train_opts_default();
    char msg[1600];
    if (!option_from_lua(L, 2, &o, sp, msg, sizeof msg)) {
        lua_pushboolean(L, 0);
        lua_pushstring(L, msg);
        return 2;
    }
    lua_pushboolean(L, 1);
    if (sp->kind == GM_OPT_INT) lua_pushinteger(L, (lua_Integer)lua_tonumber(L, 2));
    else if (sp->kind == GM_OPT_TARGETS)
        lua_pushstring(L, strcmp(sp->name, "vision_targets") == 0  ? o.vision_targets
                          : strcmp(sp->name, "audio_targets") == 0 ? o.audio_targets
                                                                   : o.lora.targets);
    else lua_pushvalue(L, 2);
    return 2;
}

/* Reads the option table at idx into o: the schema's options (core/train/gm_train_opts.def, its
 * defaults for the missing ones), the seed, the total steps (the schedule's length; warmup is
 * resolved against it) and the threads (def_threads when absent). Also used by gm.plan
 * (bind_run.c). Raises on an unknown key, a wrong type or a value out of range. */
void gm_bind_read_train_opts(lua_State *L, int idx, const char *fn, gm_train_opts *o, int def_threads) {
    *o = gm_train_opts_default();
    o->n_threads = def_threads;
    if (lua_isnoneornil(L, idx)) return;
    luaL_checktype(L, idx, LUA_TTABLE);
    idx = lua_absindex(L, idx);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
        if (!k) luaL_error(L, "%s: option keys must be names, got a %s key", fn, luaL_typename(L, -2));
        const gm_opt_spec *sp = gm_train_opt_find(k);
        if (sp) {
            set_from_lua(L, fn, o, sp);
        } else if (is_extra_key(k)) {
            bool zero_ok = !strcmp(k, "seed") || !strcmp(k, "max_images") || !strcmp(k, "max_audio") ||
                           !strcmp(k, "max_audio_frames") || !strcmp(k, "ple_resident");
            if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < (zero_ok ? 0 : 1))
                luaL_error(L, "%s: option '%s' must be %s", fn, k, zero_ok ? "an integer >= 0" : "a positive integer");
            lua_Integer v = lua_tointeger(L, -1);
            if (!strcmp(k, "max_images")) o->max_images = v;
            else if (!strcmp(k, "max_audio")) o->max_audio = v;
            else if (!strcmp(k, "max_audio_frames")) o->max_audio_frames = v;
            else if (!strcmp(k, "ple_resident")) o->ple_resident = v;
            else if (!strcmp(k, "seed")) o->lora.seed = (uint64_t)v;
            else if (!strcmp(k, "steps")) o->total_steps = v;
            else o->n_threads = v > 256 ? 256 : (int)v;
        } else {
            unknown_option(L, fn, k);
        }
        lua_pop(L, 1);
    }
    gm_train_opts_resolve(o);
}

/* gm.train_schema() -> list of {name, kind, default, min, max, gt, lt, values = {...}, doc, source}:
 * the training options' schema, for lua/prelude.lua's validation and defaults. */
static int l_train_schema(lua_State *L) {
    int n;
    const gm_opt_spec *sp = gm_train_opt_specs(&n);
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        const gm_opt_spec *s = &sp[i];
        lua_createtable(L, 0, 10);
        lua_pushstring(L, s->name);
        lua_setfield(L, -2, "name");
        lua_pushstring(L, gm_opt_kind_name(s->kind));
        lua_setfield(L, -2, "kind");
        switch (s->kind) { /* the default as the prelude stores it; none for max_steps and layers */
        case GM_OPT_INT:
            if (!isnan(s->def)) lua_pushinteger(L, (lua_Integer)s->def), lua_setfield(L, -2, "default");
            break;
        case GM_OPT_NUM: lua_pushnumber(L, s->def), lua_setfield(L, -2, "default"); break;
        case GM_OPT_BOOL: lua_pushboolean(L, s->def != 0), lua_setfield(L, -2, "default"); break;
        case GM_OPT_ENUM:
        case GM_OPT_TARGETS: lua_pushstring(L, s->def_text), lua_setfield(L, -2, "default"); break;
        case GM_OPT_LAYERS: break;
        }
#define BOUND(key, val)                                                                      \
    if (!isnan(val)) {                                                                       \
        if (s->kind == GM_OPT_INT) lua_pushinteger(L, (lua_Integer)(val));                   \
        else lua_pushnumber(L, (val));                                                       \
        lua_setfield(L, -2, key);                                                            \
    }
        BOUND("min", s->min);
        BOUND("max", s->max);
        BOUND("gt", s->gt);
        BOUND("lt", s->lt);
#undef BOUND
        if (s->values) {
            lua_newtable(L);
            int k = 0;
            for (const char *p = s->values; *p;) {
                const char *e = strchr(p, ',');
                size_t len = e ? (size_t)(e - p) : strlen(p);
                lua_pushlstring(L, p, len);
                lua_rawseti(L, -2, ++k);
                p = e ? e + 1 : p + len;
            }
            lua_setfield(L, -2, "values");
        }
        lua_pushstring(L, s->doc);
        lua_setfield(L, -2, "doc");
        lua_pushstring(L, s->source);
        lua_setfield(L, -2, "source");
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

static int l_trainer(lua_State *L) {
    lmodel *lm = gm_bind_check_model(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    gm_train_opts o;
    gm_bind_read_train_opts(L, 2, "trainer", &o, lm->n_threads);
    ltrainer *t = lua_newuserdatauv(L, sizeof *t, 1);
    memset(t, 0, sizeof *t);
    luaL_setmetatable(L, TRAINER_MT);
    lua_pushvalue(L, 1);
    lua_setiuservalue(L, -2, 1);
    gm_error err = {0};
    /* on the model's GPU when it was loaded for one (the trainer borrows the backend; the model,
     * held as this trainer's user value, outlives it) */
    gm_status s = lm->be && lm->be->device == GM_DEVICE_CUDA ? gm_trainer_new_on(lm->m, &o, lm->be, &t->tr, &err)
                                                               : gm_trainer_new(lm->m, &o, &t->tr, &err);
    if (s != GM_OK) return gm_bind_raise(L, &err);
    if (gm_trainer_set_dist(t->tr, gm_lua_dist(), &err) != GM_OK) return gm_bind_raise(L, &err);
    int64_t rows = o.grad_accum * o.batch;
    t->ids = gm_malloc((size_t)(rows * o.max_length) * sizeof(int32_t));
    t->targets = gm_malloc((size_t)(rows * o.max_length) * sizeof(int32_t));
    t->micro = gm_malloc((size_t)o.grad_accum * sizeof(gm_batch));
    t->idx = gm_malloc((size_t)rows * sizeof(int64_t));
    if (!t->ids || !t->targets || !t->micro || !t->idx) return luaL_error(L, "out of memory");
    t->pad_id = lm->m->cfg.pad_id;
    if (o.max_images > 0) {
        t->max_images = o.max_images;
        t->S = lm->m->cfg.vision.image_size;
        t->image_floats = gm_mm_image_floats(&lm->m->cfg);
        t->pixels = gm_malloc((size_t)(o.grad_accum * o.max_images * t->image_floats) * sizeof(float));
        t->hw = gm_malloc((size_t)(o.grad_accum * o.max_images * 2) * sizeof(int64_t));
        if (!t->pixels || !t->hw) return luaL_error(L, "out of memory (%lld images' pixels)", (long long)(o.grad_accum * o.max_images));
    }
    if (o.max_audio > 0) {
#ifdef GM_HAVE_AUDIO
        t->max_audio = o.max_audio, t->max_audio_frames = o.max_audio_frames;
        size_t cells = (size_t)(o.grad_accum * o.max_audio * o.max_audio_frames);
        t->audio = gm_malloc(cells * GM_AUDIO_MELS * sizeof(float));
        t->audio_valid = gm_malloc(cells);
        if (!t->audio || !t->audio_valid) return luaL_error(L, "out of memory (%lld clips' features)", (long long)(o.grad_accum * o.max_audio));
        gm_audio_fe_kind kind = lm->m->cfg.arch == GM_ARCH_GEMMA4 ? GM_AUDIO_FE_GEMMA4 : GM_AUDIO_FE_GEMMA3N;
        if (gm_audio_fe_new_kind(kind, &t->fe, &err) != GM_OK) return gm_bind_raise(L, &err);
#else
        return luaL_error(L, "trainer: the data has audio, but this gemmarun was built without audio (cmake -DGM_AUDIO=OFF)");
#endif
    }
    return 1;
}

/* The audio clips of a micro-batch into feature slot `slot`, set on *b. */
static void batch_audio(lua_State *L, ltrainer *t, ldataset *d, const int64_t *idx, int64_t B, int slot, gm_batch *b) {
    if (t->max_audio == 0) return;
    size_t cells = (size_t)(t->max_audio * t->max_audio_frames) * (size_t)slot;
    int64_t n = 0, T = 0;
    gm_error err = {0};
    if (gm_batch_audio(&d->ds, idx, B, t->fe, 0, t->max_audio, t->max_audio_frames, t->audio + cells * GM_AUDIO_MELS,
                       t->audio_valid + cells, &n, &T, &err) != GM_OK)
        gm_bind_raise(L, &err);
    b->audio_features = t->audio + cells * GM_AUDIO_MELS, b->audio_valid = t->audio_valid + cells;
    b->n_audio = n, b->audio_frames = T;
}

/* The images of a micro-batch (examples idx[0..B)) into pixel slot `slot`, set on *b. */
static void batch_images(lua_State *L, ltrainer *t, ldataset *d, const int64_t *idx, int64_t B, int slot, gm_batch *b) {
    if (t->max_images == 0) return;
    float *px = t->pixels + (size_t)slot * (size_t)(t->max_images * t->image_floats);
    int64_t *hw = t->hw + (size_t)slot * (size_t)(t->max_images * 2);
    int64_t n = 0;
    gm_error err = {0};
    if (gm_batch_images(&d->ds, idx, B, t->S, t->max_images, px, hw, &n, &err) != GM_OK) gm_bind_raise(L, &err);
    b->pixels = px;
    b->image_hw = d->ds.image_opts.max_patches > 0 ? hw : NULL;
    b->n_images = n;
}

/* Splits the 1-based index list at stack idx into micro-batches of `batch` examples. */
static int collate(lua_State *L, ltrainer *t, ldataset *d, int idx_arg) {
    const gm_train_opts *o = gm_trainer_opts(t->tr);
    luaL_checktype(L, idx_arg, LUA_TTABLE);
    lua_Integer n = luaL_len(L, idx_arg);
    /* data parallel: a rank may have no share of a short last step */
    lua_Integer least = gm_dist_world_size(gm_lua_dist()) > 1 ? 0 : 1;
    if (n < least || n > o->batch * o->grad_accum)
        luaL_error(L, "a step takes 1..%d examples (batch %d x grad_accum %d), got %d", (int)(o->batch * o->grad_accum),
                   (int)o->batch, (int)o->grad_accum, (int)n);
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, idx_arg, i);
        lua_Integer e = lua_tointeger(L, -1);
        lua_pop(L, 1);
        if (e < 1 || e > d->ds.n) luaL_error(L, "example index %d is outside 1..%d", (int)e, (int)d->ds.n);
        t->idx[i - 1] = e - 1;
    }
    int n_micro = 0;
    for (lua_Integer s = 0; s < n; s += o->batch) {
        int64_t B = n - s < o->batch ? n - s : o->batch;
        int32_t *ids = t->ids + (size_t)(s * o->max_length), *tg = t->targets + (size_t)(s * o->max_length);
        int64_t T = gm_batch_collate(&d->ds, t->idx + s, B, t->pad_id, ids, tg);
        t->micro[n_micro] = (gm_batch){.B = B, .T = T, .ids = ids, .targets = tg, .example_index = t->idx + s};
        batch_images(L, t, d, t->idx + s, B, n_micro, &t->micro[n_micro]);
        batch_audio(L, t, d, t->idx + s, B, n_micro, &t->micro[n_micro]);
        n_micro++;
    }
    return n_micro;
}

static int l_tr_step(lua_State *L) {
    ltrainer *t = check_tr(L, 1);
    ldataset *d = check_ds(L, 2);
    int n_micro = collate(L, t, d, 3);
    gm_step_stats st;
    gm_error err = {0};
    if (gm_trainer_step(t->tr, t->micro, n_micro, &st, &err) != GM_OK) return gm_bind_raise(L, &err);
    lua_createtable(L, 0, 5);
    lua_pushnumber(L, st.loss);
    lua_setfield(L, -2, "loss");
    lua_pushinteger(L, st.n_tokens);
    lua_setfield(L, -2, "tokens");
    lua_pushnumber(L, st.grad_norm);
    lua_setfield(L, -2, "grad_norm");
    lua_pushnumber(L, st.lr);
    lua_setfield(L, -2, "lr");
    lua_pushinteger(L, st.step);
    lua_setfield(L, -2, "step");
    if (gm_trainer_config(t->tr)->n_experts > 0) { /* a mixture of experts: the router's load this step */
        lua_pushnumber(L, st.router_max_load);
        lua_setfield(L, -2, "router_max_load");
        lua_pushnumber(L, st.router_load_cv);
        lua_setfield(L, -2, "router_load_cv");
    }
    return 1;
}

static int l_tr_eval(lua_State *L) {
    ltrainer *t = check_tr(L, 1);
    ldataset *d = check_ds(L, 2);
    int n_micro = collate(L, t, d, 3);
    double sum = 0;
    int64_t tokens = 0;
    gm_error err = {0};
    for (int i = 0; i < n_micro; i++) {
        double s;
        int64_t n;
        if (gm_trainer_eval(t->tr, &t->micro[i], &s, &n, &err) != GM_OK) return gm_bind_raise(L, &err);
        sum += s;
        tokens += n;
    }
    lua_pushnumber(L, sum / (double)tokens);
    lua_pushinteger(L, tokens);
    return 2;
}

/* Reads a list of 1-based example indices at stack idx into t->idx (0-based); returns n. */
static int64_t read_indices(lua_State *L, ltrainer *t, ldataset *d, int idx, int64_t cap) {
    luaL_checktype(L, idx, LUA_TTABLE);
    lua_Integer n = luaL_len(L, idx);
    (void)cap;
    int64_t *out = gm_malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (!out) luaL_error(L, "out of memory");
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, idx, i);
        lua_Integer e = lua_tointeger(L, -1);
        lua_pop(L, 1);
        if (e < 1 || e > d->ds.n) {
            gm_free(out);
            luaL_error(L, "example index %d is outside 1..%d", (int)e, (int)d->ds.n);
        }
        out[i - 1] = e - 1;
    }
    gm_free(t->scan);
    t->scan = out;
    return n;
}

/* model:ple_resident({dataset, ...}) -> bytes of the model's per-layer embedding table (Gemma 3n)
 * the data sets' ids make resident (gm_dataset_table_resident), or 0 when it has none: what the
 * runner passes the planner and the trainer as option ple_resident. */
static int l_ple_resident(lua_State *L) {
    lmodel *lm = gm_bind_check_model(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    const gm_model *m = lm->m;
    const gm_tensor *t = NULL;
    for (int gi = 0; m->arch && gi < m->arch->n_globals && !t; gi++)
        if (m->arch->globals[gi].rows == GM_DIM_PV && m->global[gi].data) t = &m->global[gi];
    if (!t || t->ndim != 2) {
        lua_pushinteger(L, 0);
        return 1;
    }
    const gm_dataset *ds[8];
    int n = 0;
    for (lua_Integer i = 1; i <= luaL_len(L, 2) && n < 8; i++) {
        lua_rawgeti(L, 2, i);
        ldataset *d = luaL_testudata(L, -1, DATASET_MT);
        if (d && d->open) ds[n++] = &d->ds;
        lua_pop(L, 1);
    }
    lua_pushinteger(L, (lua_Integer)gm_dataset_table_resident(ds, n, t->shape[0], gm_dtype_row_bytes(t->dtype, t->shape[1])));
    return 1;
}

/* trainer:generate(dataset, {i, ...} [, {max_tokens = 64, stop = {id, ...}}]) -> {{id, ...}, ...}: each
 * example's greedy continuation of its prompt (its ids before the response: the chat up to and
 * including "<start_of_turn>model\n", its images and audio clips) with the trainer's current
 * adapters, forward only, no dropout: the whole sequence runs again for each new token
 * (gm_trainer_logits at each sequence's last position; its images and clips encoded once,
 * gm_batch.same_media), o.batch examples at a time, within the
 * trainer's plan (max_length bounds prompt + new tokens). A continuation ends at a stop id (not
 * included), after max_tokens, or at max_length. What the runner's transcription evaluation reads
 * (word and phone error rates). */
static int l_tr_generate(lua_State *L) {
    ltrainer *t = check_tr(L, 1);
    ldataset *d = check_ds(L, 2);
    int64_t n = read_indices(L, t, d, 3, 0);
    static const char *const allowed[] = {"max_tokens", "stop", NULL};
    gm_bind_check_opts(L, 4, "generate", allowed);
    lua_Integer max_new = gm_bind_opt_int(L, 4, "max_tokens", 64);
    if (max_new < 1 || max_new > (1 << 20)) return luaL_error(L, "generate: max_tokens must be in 1..%d", 1 << 20);
    int32_t stops[16];
    int n_stop = 0;
    if (lua_istable(L, 4) && lua_getfield(L, 4, "stop") == LUA_TTABLE) {
        for (lua_Integer i = 1; i <= luaL_len(L, -1) && n_stop < 16; i++) {
            lua_rawgeti(L, -1, i);
            stops[n_stop++] = (int32_t)lua_tointeger(L, -1);
            lua_pop(L, 1);
        }
    }
    if (lua_istable(L, 4)) lua_pop(L, 1);
    const gm_train_opts *o = gm_trainer_opts(t->tr);
    int64_t V = d->m->cfg.vocab_size, chunk = o->batch, ML = o->max_length;
    float *logits = gm_malloc((size_t)(chunk * V) * sizeof(float));
    int32_t *seq = gm_malloc((size_t)(chunk * ML) * sizeof(int32_t));
    int64_t *len = gm_malloc((size_t)chunk * sizeof(int64_t)), *start = gm_malloc((size_t)chunk * sizeof(int64_t));
    int64_t *rows = gm_malloc((size_t)chunk * sizeof(int64_t));
    bool *done = gm_malloc((size_t)chunk * sizeof(bool));
    if (!logits || !seq || !len || !start || !rows || !done) {
        gm_free(logits), gm_free(seq), gm_free(len), gm_free(start), gm_free(rows), gm_free(done);
        return luaL_error(L, "generate: out of memory");
    }
    lua_createtable(L, (int)n, 0);
    gm_error err = {0};
    gm_status st = GM_OK;
    for (int64_t s0 = 0; s0 < n && st == GM_OK; s0 += chunk) {
        int64_t B = n - s0 < chunk ? n - s0 : chunk;
        for (int64_t b = 0; b < B; b++) {
            const gm_example *e = &d->ds.ex[t->scan[s0 + b]];
            int64_t p = e->response_start < ML ? e->response_start : ML;
            memcpy(seq + b * ML, e->ids, (size_t)p * sizeof(int32_t));
            start[b] = len[b] = p, done[b] = p >= ML;
        }
        /* the batch's media once: every pass of this chunk reads the same clips and images */
        gm_batch bt = {.B = B, .example_index = t->scan + s0};
        batch_images(L, t, d, t->scan + s0, B, 0, &bt);
        batch_audio(L, t, d, t->scan + s0, B, 0, &bt);
        for (int64_t k = 0; k < max_new && st == GM_OK; k++) {
            int64_t T = 1;
            bool any = false;
            for (int64_t b = 0; b < B; b++) T = len[b] > T ? len[b] : T, any |= !done[b];
            if (!any) break;
            for (int64_t b = 0; b < B; b++) {
                for (int64_t i = 0; i < T; i++) {
                    t->ids[b * T + i] = i < len[b] ? seq[b * ML + i] : t->pad_id;
                    t->targets[b * T + i] = -1;
                }
                rows[b] = b * T + len[b] - 1;
            }
            bt.T = T, bt.ids = t->ids, bt.targets = t->targets;
            bt.same_media = k > 0; /* the encoders ran on this chunk's media in its first pass */
            if (gm_lua_interrupted) st = gm_error_set(&err, GM_ERR_INTERRUPTED, "interrupted during generation");
            if (st == GM_OK) st = gm_trainer_logits(t->tr, &bt, rows, B, logits, &err);
            for (int64_t b = 0; st == GM_OK && b < B; b++) {
                if (done[b]) continue;
                const float *r = logits + b * V;
                int64_t best = 0;
                for (int64_t v = 1; v < V; v++) best = r[v] > r[best] ? v : best;
                bool stop = false;
                for (int i = 0; i < n_stop; i++) stop |= stops[i] == best;
                if (stop) {
                    done[b] = true;
                    continue;
                }
                seq[b * ML + len[b]++] = (int32_t)best;
                done[b] = len[b] >= ML;
            }
        }
        for (int64_t b = 0; st == GM_OK && b < B; b++) {
            lua_createtable(L, (int)(len[b] - start[b]), 0);
            for (int64_t i = start[b]; i < len[b]; i++) {
                lua_pushinteger(L, seq[b * ML + i]);
                lua_rawseti(L, -2, i - start[b] + 1);
            }
            lua_rawseti(L, -2, s0 + b + 1);
        }
    }
    gm_free(logits), gm_free(seq), gm_free(len), gm_free(start), gm_free(rows), gm_free(done);
    if (st == GM_ERR_INTERRUPTED) return luaL_error(L, "interrupted");
    if (st != GM_OK) return gm_bind_raise(L, &err);
    return 1;
}

static int l_tr_choose(lua_State *L) {
    ltrainer *t = check_tr(L, 1);
    ldataset *d = check_ds(L, 2);
    luaL_checktype(L, 4, LUA_TTABLE);
    int64_t n = read_indices(L, t, d, 3, 0);
    lua_Integer K = luaL_len(L, 4);
    if (K < 1 || K > 256) return luaL_error(L, "choose: 1..256 candidate tokens expected, got %d", (int)K);
    int32_t cand[256];
    for (lua_Integer k = 1; k <= K; k++) {
        lua_rawgeti(L, 4, k);
        cand[k - 1] = (int32_t)lua_tointeger(L, -1);
        lua_pop(L, 1);
    }
    const gm_train_opts *o = gm_trainer_opts(t->tr);
    float logits[256 * 64];
    int64_t pos[64];
    int64_t chunk = o->batch < 64 ? o->batch : 64;
    lua_createtable(L, (int)n, 0); /* choices */
    lua_createtable(L, (int)n, 0); /* logits */
    gm_error err = {0};
    for (int64_t s = 0; s < n; s += chunk) {
        int64_t B = n - s < chunk ? n - s : chunk;
        int64_t T = gm_batch_collate(&d->ds, t->scan + s, B, t->pad_id, t->ids, t->targets);
        for (int64_t b = 0; b < B; b++) pos[b] = d->ds.ex[t->scan[s + b]].response_start - 1;
        gm_batch bt = {.B = B, .T = T, .ids = t->ids, .targets = t->targets, .example_index = t->scan + s};
        batch_images(L, t, d, t->scan + s, B, 0, &bt);
        batch_audio(L, t, d, t->scan + s, B, 0, &bt);
        if (gm_trainer_choice_logits(t->tr, &bt, pos, cand, K, logits, &err) != GM_OK) return gm_bind_raise(L, &err);
        for (int64_t b = 0; b < B; b++) {
            int64_t best = 0;
            lua_createtable(L, (int)K, 0);
            for (int64_t k = 0; k < K; k++) {
                if (logits[b * K + k] > logits[b * K + best]) best = k;
                lua_pushnumber(L, logits[b * K + k]);
                lua_rawseti(L, -2, k + 1);
            }
            lua_rawseti(L, -2, s + b + 1);
            lua_pushinteger(L, best + 1);
            lua_rawseti(L, -3, s + b + 1);
        }
    }
    return 2;
}

static int l_tr_score(lua_State *L) {
    ltrainer *t = check_tr(L, 1);
    ldataset *d = check_ds(L, 2);
    int64_t n = read_indices(L, t, d, 3, 0);
    const gm_train_opts *o = gm_trainer_opts(t->tr);
    double lp[64];
    int64_t chunk = o->batch < 64 ? o->batch : 64;
    lua_createtable(L, (int)n, 0);
    gm_error err = {0};
    for (int64_t s = 0; s < n; s += chunk) {
        int64_t B = n - s < chunk ? n - s : chunk;
        int64_t T = gm_batch_collate(&d->ds, t->scan + s, B, t->pad_id, t->ids, t->targets);
        gm_batch bt = {.B = B, .T = T, .ids = t->ids, .targets = t->targets, .example_index = t->scan + s};
        batch_images(L, t, d, t->scan + s, B, 0, &bt);
        batch_audio(L, t, d, t->scan + s, B, 0, &bt);
        if (gm_trainer_score(t->tr, &bt, lp, &err) != GM_OK) return gm_bind_raise(L, &err);
        for (int64_t b = 0; b < B; b++) {
            lua_pushnumber(L, lp[b]);
            lua_rawseti(L, -2, s + b + 1);
        }
    }
    return 1;
}

/* trainer:score_labels(dataset, {i, ...}, {{tok, ...}, ...}) -> {best label index, ...}, {{score, ...}, ...}:
 * for each example (1-based index), the log-probability of every candidate response (a token
 * list: the label and its end of turn) after the example's prompt (ids up to response_start), the
 * example's images in place; the best is the highest (first on ties). Label scoring when the
 * labels' first tokens do not tell them apart. Sequences are scored `batch` at a time. */
static int l_tr_score_labels(lua_State *L) {
    ltrainer *t = check_tr(L, 1);
    ldataset *d = check_ds(L, 2);
    int64_t n = read_indices(L, t, d, 3, 0);
    luaL_checktype(L, 4, LUA_TTABLE);
    lua_Integer K = luaL_len(L, 4);
    if (K < 1 || K > 4096) return luaL_error(L, "score_labels: 1..4096 candidates expected, got %d", (int)K);
    const gm_train_opts *o = gm_trainer_opts(t->tr);
    int32_t **cand = gm_calloc((size_t)K, sizeof *cand);
    int64_t *clen = gm_calloc((size_t)K, sizeof *clen);
    int64_t *rep = gm_malloc((size_t)o->batch * sizeof *rep);
    double *lp = gm_malloc((size_t)o->batch * sizeof *lp);
    bool ok = cand && clen && rep && lp;
    for (lua_Integer k = 1; ok && k <= K; k++) {
        lua_rawgeti(L, 4, k);
        if (!lua_istable(L, -1)) ok = false;
        lua_Integer m = ok ? luaL_len(L, -1) : 0;
        if (ok && (m < 1 || m > o->max_length)) ok = false;
        cand[k - 1] = ok ? gm_malloc((size_t)m * sizeof(int32_t)) : NULL;
        clen[k - 1] = m;
        for (lua_Integer j = 1; ok && cand[k - 1] && j <= m; j++) {
            lua_rawgeti(L, -1, j);
            cand[k - 1][j - 1] = (int32_t)lua_tointeger(L, -1);
            lua_pop(L, 1);
        }
        ok = ok && cand[k - 1];
        lua_pop(L, 1);
    }
    gm_error err = {0};
    gm_status st = GM_OK;
    if (!ok) st = gm_error_set(&err, GM_ERR_INVALID, "score_labels: each candidate must be a list of 1..%lld token ids",
                               (long long)o->max_length);
    lua_createtable(L, (int)n, 0); /* best */
    lua_createtable(L, (int)n, 0); /* scores */
    for (int64_t i = 0; st == GM_OK && i < n; i++) {
        const gm_example *e = &d->ds.ex[t->scan[i]];
        int64_t rs = e->response_start;
        lua_createtable(L, (int)K, 0);
        int64_t best = 0;
        double best_lp = -INFINITY;
        for (int64_t k0 = 0; st == GM_OK && k0 < K; k0 += o->batch) {
            int64_t B = K - k0 < o->batch ? K - k0 : o->batch, T = 1;
            for (int64_t b = 0; b < B; b++) T = rs + clen[k0 + b] > T ? rs + clen[k0 + b] : T;
            if (T > o->max_length) {
                st = gm_error_set(&err, GM_ERR_INVALID, "example %lld: its prompt (%lld tokens) and a label (%lld) exceed "
                                  "max_length = %lld", (long long)t->scan[i], (long long)rs, (long long)clen[k0], (long long)o->max_length);
                break;
            }
            for (int64_t b = 0; b < B; b++) {
                int32_t *ids = t->ids + b * T, *tg = t->targets + b * T;
                const int32_t *c = cand[k0 + b];
                int64_t len = rs + clen[k0 + b];
                for (int64_t p = 0; p < T; p++) {
                    ids[p] = p < rs ? e->ids[p] : p < len ? c[p - rs] : t->pad_id;
                    int64_t nx = p + 1;
                    tg[p] = nx >= rs && nx < len ? c[nx - rs] : -1;
                }
                rep[b] = t->scan[i];
            }
            gm_batch bt = {.B = B, .T = T, .ids = t->ids, .targets = t->targets, .example_index = rep};
            batch_images(L, t, d, rep, B, 0, &bt);
            batch_audio(L, t, d, rep, B, 0, &bt);
            st = gm_trainer_score(t->tr, &bt, lp, &err);
            for (int64_t b = 0; st == GM_OK && b < B; b++) {
                lua_pushnumber(L, lp[b]);
                lua_rawseti(L, -2, k0 + b + 1);
                if (lp[b] > best_lp) best_lp = lp[b], best = k0 + b;
            }
        }
        lua_rawseti(L, -2, i + 1);
        lua_pushinteger(L, best + 1);
        lua_rawseti(L, -3, i + 1);
    }
    for (lua_Integer k = 0; cand && k < K; k++) gm_free(cand[k]);
    gm_free(cand), gm_free(clen), gm_free(rep), gm_free(lp);
    if (st != GM_OK) return gm_bind_raise(L, &err);
    return 2;
}

static int l_tr_save(lua_State *L) {
    ltrainer *t = check_tr(L, 1);
    const char *path = luaL_checkstring(L, 2);
    static const char *const allowed[] = {"epoch", "pos", "loss", "config", NULL};
    gm_bind_check_opts(L, 3, "save", allowed);
    gm_bind_check_write_path(L, path, "trainer:save");
    gm_error err = {0};
    if (gm_trainer_save(t->tr, path, gm_bind_opt_int(L, 3, "epoch", 0), gm_bind_opt_int(L, 3, "pos", 0),
                        gm_bind_opt_num(L, 3, "loss", 0), gm_bind_opt_str(L, 3, "config", "{}"), &err) != GM_OK)
        return gm_bind_raise(L, &err);
    return 0;
}

static int l_tr_load(lua_State *L) {
    ltrainer *t = check_tr(L, 1);
    const char *path = luaL_checkstring(L, 2);
    int64_t epoch = 0, pos = 0;
    gm_error err = {0};
    if (gm_trainer_load(t->tr, path, &epoch, &pos, &err) != GM_OK) return gm_bind_raise(L, &err);
    lua_createtable(L, 0, 3);
    lua_pushinteger(L, gm_trainer_step_count(t->tr));
    lua_setfield(L, -2, "step");
    lua_pushinteger(L, epoch);
    lua_setfield(L, -2, "epoch");
    lua_pushinteger(L, pos);
    lua_setfield(L, -2, "pos");
    return 1;
}

/* trainer:load_adapter(model, path [, {trial =}]): starts the trainer's adapters from the
 * adapter at `path` (anything gm_adapter_load reads: a PEFT folder, a trial, a checkpoint) on
 * `model` (the trainer's own): gm_adapter_to_trainer, which names any difference of shape. */
static int l_tr_load_adapter(lua_State *L) {
    ltrainer *t = check_tr(L, 1);
    lmodel *lm = gm_bind_check_model(L, 2);
    const char *path = luaL_checkstring(L, 3);
    static const char *const allowed[] = {"trial", NULL};
    gm_bind_check_opts(L, 4, "load_adapter", allowed);
    const char *trial = gm_bind_opt_str(L, 4, "trial", NULL);
    gm_error err = {0};
    gm_adapter *a = NULL;
    gm_backend *be = gm_trainer_backend(t->tr);
    gm_status s = gm_adapter_load(lm->m, be, path, trial, &a, &err);
    if (s == GM_OK) s = gm_adapter_to_trainer(a, be, t->tr, &err);
    gm_adapter_free(a);
    if (s != GM_OK) return gm_bind_raise(L, &err);
    return 0;
}

static int l_tr_memory(lua_State *L) {
    ltrainer *t = check_tr(L, 1);
    const gm_arena *a = gm_trainer_arena(t->tr);
    lua_createtable(L, 0, GM_MEM_KIND_COUNT + 1);
    for (int k = 0; k < GM_MEM_KIND_COUNT; k++) {
        lua_pushinteger(L, (lua_Integer)a->by_kind[k]);
        lua_setfield(L, -2, gm_mem_kind_name((gm_mem_kind)k));
    }
    lua_pushinteger(L, (lua_Integer)a->capacity);
    lua_setfield(L, -2, "total");
    return 1;
}

static int l_tr_close(lua_State *L) {
    ltrainer *t = luaL_checkudata(L, 1, TRAINER_MT);
    gm_trainer_free(t->tr);
    gm_free(t->ids), gm_free(t->targets), gm_free(t->micro), gm_free(t->idx), gm_free(t->scan), gm_free(t->pixels), gm_free(t->hw);
    gm_free(t->audio), gm_free(t->audio_valid);
#ifdef GM_HAVE_AUDIO
    gm_audio_fe_free(t->fe);
#endif
    memset(t, 0, sizeof *t);
    return 0;
}

/* gm.lora_targets_check(targets) -> true, nil, text | false, message: targets (a string, or a list
 * of module names) checked against the Gemma 3 module names (core/train/gm_lora.h
 * gm_lora_targets_check) before any model loads; text is the targets as one string. */
static int l_lora_targets_check(lua_State *L) {
    char buf[GM_LORA_TARGETS_MAX], msg[300];
    const char *t = targets_text(L, 1, "targets", buf, sizeof buf, msg, sizeof msg);
    gm_error err = {0};
    if (!t) {
        lua_pushboolean(L, 0);
        lua_pushstring(L, msg);
        return 2;
    }
    if (strlen(t) >= GM_LORA_TARGETS_MAX) {
        lua_pushboolean(L, 0);
        lua_pushfstring(L, "targets: longer than %d characters", GM_LORA_TARGETS_MAX - 1);
        return 2;
    }
    if (gm_lora_targets_check(t, gm_arch_get(GM_ARCH_GEMMA3), NULL, &err) == GM_OK) {
        lua_pushboolean(L, 1);
        lua_pushnil(L);
        lua_pushstring(L, t);
        return 3;
    }
    lua_pushboolean(L, 0);
    lua_pushstring(L, err.msg);
    return 2;
}

static int l_peak_rss(lua_State *L) {
    lua_pushinteger(L, (lua_Integer)gm_process_peak_rss());
    return 1;
}

static int l_clock(lua_State *L) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    lua_pushnumber(L, (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec);
    return 1;
}

static void new_class(lua_State *L, const char *name, const luaL_Reg *methods, lua_CFunction close) {
    luaL_newmetatable(L, name);
    lua_newtable(L); /* (luaL_newlib needs an array, not a pointer) */
    luaL_setfuncs(L, methods, 0);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, close);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, close);
    lua_setfield(L, -2, "__close");
    lua_pop(L, 1);
}

void gm_lua_open_train(lua_State *L) {
    static const luaL_Reg ds_methods[] = {{"add_chat", l_ds_add_chat}, {"size", l_ds_size}, {"stats", l_ds_stats},
                                          {"max_images", l_ds_max_images}, {"max_audio", l_ds_max_audio},
                                          {"sha256", l_ds_sha256},
                                          {"example", l_ds_example}, {"close", l_ds_close}, {NULL, NULL}};
    static const luaL_Reg tr_methods[] = {{"step", l_tr_step}, {"eval", l_tr_eval}, {"save", l_tr_save}, {"load_adapter", l_tr_load_adapter},
                                          {"load", l_tr_load}, {"memory", l_tr_memory}, {"choose", l_tr_choose},
                                          {"score", l_tr_score}, {"score_labels", l_tr_score_labels}, {"generate", l_tr_generate},
                                          {"close", l_tr_close},
                                          {NULL, NULL}};
    new_class(L, DATASET_MT, ds_methods, l_ds_close);
    new_class(L, TRAINER_MT, tr_methods, l_tr_close);
    static const luaL_Reg checker_methods[] = {{"check", l_checker_check}, {"close", l_checker_close}, {NULL, NULL}};
    new_class(L, CHECKER_MT, checker_methods, l_checker_close);
    /* model:trainer(...) */
    luaL_getmetatable(L, GM_MODEL_MT);
    lua_getfield(L, -1, "__index");
    lua_pushcfunction(L, l_trainer);
    lua_setfield(L, -2, "trainer");
    lua_pushcfunction(L, l_ple_resident);
    lua_setfield(L, -2, "ple_resident");
    lua_pop(L, 2);
    lua_getglobal(L, "gm");
    lua_pushcfunction(L, l_dataset);
    lua_setfield(L, -2, "dataset");
    lua_pushcfunction(L, l_fortunes);
    lua_setfield(L, -2, "fortunes");
    lua_pushcfunction(L, l_image_check);
    lua_setfield(L, -2, "image_check");
    lua_pushcfunction(L, l_image_checker);
    lua_setfield(L, -2, "image_checker");
    lua_pushcfunction(L, l_audio_check);
    lua_setfield(L, -2, "audio_check");
    lua_pushcfunction(L, l_peak_rss);
    lua_setfield(L, -2, "peak_rss");
    lua_pushcfunction(L, l_lora_targets_check);
    lua_setfield(L, -2, "lora_targets_check");
    lua_pushcfunction(L, l_train_schema);
    lua_setfield(L, -2, "train_schema");
    lua_pushcfunction(L, l_train_option_check);
    lua_setfield(L, -2, "train_option_check");
    lua_pushcfunction(L, l_clock);
    lua_setfield(L, -2, "clock");
    lua_pushinteger(L, GM_MAX_IMAGES_PER_EXAMPLE);
    lua_setfield(L, -2, "MAX_IMAGES_PER_EXAMPLE");
    lua_pushinteger(L, GM_AUDIO4_MIN_SAMPLES); /* the shortest clip Gemma 4's extractor gives a frame */
    lua_setfield(L, -2, "AUDIO4_MIN_SAMPLES");
    lua_pop(L, 1);
}

/*
 * gm_config.c - model configuration from GGUF metadata, config.json and built-in presets.
 */
#include "gm_config.h"

#include "gm_alloc.h"
#include "gm_gguf.h"
#include "gm_mmap.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *gm_arch_name(gm_arch a) {
    switch (a) {
    case GM_ARCH_GEMMA3: return "gemma3";
    case GM_ARCH_GEMMA3N: return "gemma3n";
    case GM_ARCH_GEMMA4: return "gemma4";
    case GM_ARCH_SIGLIP: return "siglip";
    case GM_ARCH_GEMMA3N_AUDIO: return "gemma3n_audio";
    case GM_ARCH_GEMMA4_VISION: return "gemma4_vision";
    case GM_ARCH_GEMMA4_AUDIO: return "gemma4_audio";
    default: return "?";
    }
}

void gm_config_gemma3_layers(gm_config *cfg, int sliding_pattern, float theta_local,
                             float theta_global, float global_pos_scale) {
    for (int64_t i = 0; i < cfg->n_layers && i < GM_MAX_LAYERS; i++) {
        bool full = sliding_pattern > 0 && (i + 1) % sliding_pattern == 0;
        cfg->layer_type[i] = full ? GM_LAYER_FULL : GM_LAYER_SLIDING;
        cfg->rope_theta[i] = full ? theta_global : theta_local;
        cfg->rope_pos_scale[i] = full ? global_pos_scale : 1.0f;
        cfg->ffn_dim[i] = cfg->intermediate_size;
        cfg->kv_source[i] = (int32_t)i;
    }
}

gm_status gm_config_kv_sharing(gm_config *cfg, int64_t n_shared, const char *label, gm_error *err) {
    if (n_shared < 0 || n_shared >= cfg->n_layers)
        return gm_error_set(err, GM_ERR_INVALID, "%s: num_kv_shared_layers = %lld must be in 0..%lld (fewer than the layers)",
                            label, (long long)n_shared, (long long)(cfg->n_layers - 1));
    int64_t first_shared = cfg->n_layers - n_shared;
    for (int64_t i = 0; i < cfg->n_layers; i++) {
        cfg->kv_source[i] = (int32_t)i;
        if (i < first_shared) continue;
        int64_t src = -1; /* the last non-shared layer of the same type (§3.5, §4.4) */
        for (int64_t j = first_shared - 1; j >= 0 && src < 0; j--)
            if (cfg->layer_type[j] == cfg->layer_type[i]) src = j;
        if (src < 0)
            return gm_error_set(err, GM_ERR_INVALID, "%s: layer %lld shares keys and values (num_kv_shared_layers = %lld) but no "
                                "earlier layer is %s attention", label, (long long)i, (long long)n_shared,
                                cfg->layer_type[i] == GM_LAYER_FULL ? "full" : "sliding");
        cfg->kv_source[i] = (int32_t)src;
    }
    return GM_OK;
}

gm_status gm_config_validate(const gm_config *c, const char *src, gm_error *err) {
#define NEED(cond, ...)                                                                      \
    if (!(cond)) return gm_error_set(err, GM_ERR_INVALID, __VA_ARGS__)
    NEED(c->n_layers > 0 && c->n_layers <= GM_MAX_LAYERS,
         "%s: num_hidden_layers = %lld is outside 1..%d", src, (long long)c->n_layers, GM_MAX_LAYERS);
    NEED(c->vocab_size > 0, "%s: vocab_size = %lld must be positive", src, (long long)c->vocab_size);
    NEED(c->hidden_size > 0, "%s: hidden_size = %lld must be positive", src, (long long)c->hidden_size);
    NEED(c->n_heads > 0 && c->n_kv_heads > 0, "%s: num_attention_heads = %lld and num_key_value_heads = %lld must be positive",
         src, (long long)c->n_heads, (long long)c->n_kv_heads);
    NEED(c->n_heads % c->n_kv_heads == 0,
         "%s: num_attention_heads = %lld is not a multiple of num_key_value_heads = %lld", src,
         (long long)c->n_heads, (long long)c->n_kv_heads);
    NEED(c->head_dim > 0 && c->head_dim % 2 == 0 && c->head_dim <= 1024,
         "%s: head_dim = %lld must be even and in 2..1024", src, (long long)c->head_dim);
    NEED(c->head_dim_full == 0 || (c->head_dim_full % 2 == 0 && c->head_dim_full <= 1024),
         "%s: the full layers' head_dim = %lld must be even and in 2..1024", src, (long long)c->head_dim_full);
    NEED(c->intermediate_size > 0, "%s: intermediate_size = %lld must be positive", src,
         (long long)c->intermediate_size);
    NEED(c->sliding_window > 0, "%s: sliding_window = %lld must be positive", src, (long long)c->sliding_window);
    NEED(c->rms_norm_eps > 0, "%s: rms_norm_eps = %g must be positive", src, (double)c->rms_norm_eps);
    NEED(c->query_pre_attn_scalar > 0, "%s: query_pre_attn_scalar = %g must be positive", src,
         (double)c->query_pre_attn_scalar);
    for (int64_t i = 0; i < c->n_layers; i++) {
        NEED(c->rope_theta[i] > 0, "%s: layer %lld: rope theta %g must be positive", src, (long long)i,
             (double)c->rope_theta[i]);
        NEED(c->kv_source[i] >= 0 && c->kv_source[i] <= i,
             "%s: layer %lld: kv_source %d must be an earlier or the same layer", src, (long long)i,
             c->kv_source[i]);
        NEED(c->ffn_dim[i] > 0, "%s: layer %lld: ffn width must be positive", src, (long long)i);
    }
#undef NEED
    return GM_OK;
}

static void defaults_gemma3(gm_config *c) {
    memset(c, 0, sizeof *c);
    c->arch = GM_ARCH_GEMMA3;
    c->rms_norm_eps = 1e-6f;
    c->query_pre_attn_scalar = 256;
    c->sliding_window = 512;
    c->max_position_embeddings = 32768;
    c->tie_word_embeddings = true;
    c->bos_id = 2;
    c->eos_id = 1;
    c->pad_id = 0;
}

/* ---- GGUF ----------------------------------------------------------------------------------- */

gm_status gm_config_from_gguf(const gm_gguf *g, gm_config *cfg, gm_error *err) {
    const char *path = gm_gguf_path(g);
    gm_strref arch;
    if (!gm_gguf_get_str(g, "general.architecture", &arch))
        return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: missing key 'general.architecture'", path);
    if (!(arch.len == 6 && memcmp(arch.p, "gemma3", 6) == 0))
        return gm_error_set(err, GM_ERR_UNSUPPORTED,
                            "%s: architecture '%.*s' is not supported\n"
                            "  hint: gemmarun reads Gemma 3 text GGUF files (general.architecture = gemma3)",
                            path, (int)(arch.len > 64 ? 64 : arch.len), arch.p);
    defaults_gemma3(cfg);
    gm_strref name;
    if (gm_gguf_get_str(g, "general.name", &name))
        snprintf(cfg->name, sizeof cfg->name, "%.*s", (int)(name.len > 63 ? 63 : name.len), name.p);
    else
        snprintf(cfg->name, sizeof cfg->name, "gemma3");

    struct { const char *key; int64_t *dst; } ints[] = {
        {"gemma3.embedding_length", &cfg->hidden_size},
        {"gemma3.block_count", &cfg->n_layers},
        {"gemma3.feed_forward_length", &cfg->intermediate_size},
        {"gemma3.attention.head_count", &cfg->n_heads},
        {"gemma3.attention.head_count_kv", &cfg->n_kv_heads},
        {"gemma3.attention.key_length", &cfg->head_dim},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (!gm_gguf_get_int(g, ints[i].key, ints[i].dst))
            return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: missing key '%s'", path, ints[i].key);
    int64_t v;
    if (gm_gguf_get_int(g, "gemma3.attention.value_length", &v) && v != cfg->head_dim)
        return gm_error_set(err, GM_ERR_UNSUPPORTED,
                            "%s: value_length %lld != key_length %lld is not a Gemma 3 layout", path,
                            (long long)v, (long long)cfg->head_dim);
    if (gm_gguf_get_int(g, "gemma3.attention.sliding_window", &v)) cfg->sliding_window = v;
    if (gm_gguf_get_int(g, "gemma3.context_length", &v)) cfg->max_position_embeddings = v;
    double d;
    if (gm_gguf_get_float(g, "gemma3.attention.layer_norm_rms_epsilon", &d)) cfg->rms_norm_eps = (float)d;
    double theta_global = 1e6;
    if (gm_gguf_get_float(g, "gemma3.rope.freq_base", &d)) theta_global = d;
    double scale = 1.0;
    gm_strref st;
    if (gm_gguf_get_str(g, "gemma3.rope.scaling.type", &st) && st.len == 6 &&
        memcmp(st.p, "linear", 6) == 0 && gm_gguf_get_float(g, "gemma3.rope.scaling.factor", &d) && d > 0)
        scale = 1.0 / d;
    if (gm_gguf_get_float(g, "gemma3.final_logit_softcapping", &d)) cfg->final_logit_softcap = (float)d;
    if (gm_gguf_get_float(g, "gemma3.attn_logit_softcapping", &d)) cfg->attn_logit_softcap = (float)d;
    if (gm_gguf_get_int(g, "tokenizer.ggml.bos_token_id", &v)) cfg->bos_id = (int32_t)v;
    if (gm_gguf_get_int(g, "tokenizer.ggml.eos_token_id", &v)) cfg->eos_id = (int32_t)v;
    if (gm_gguf_get_int(g, "tokenizer.ggml.padding_token_id", &v)) cfg->pad_id = (int32_t)v;

    /* The vocabulary size is the embedding's row count. */
    const gm_gguf_tensor *emb = gm_gguf_find_tensor(g, "token_embd.weight");
    if (!emb)
        return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: missing tensor 'token_embd.weight'", path);
    cfg->vocab_size = emb->shape[0];

    /* Not stored in GGUF; llama.cpp hard-codes these for Gemma 3 (formats.md §1.9): the 27B
     * model (62 layers) scales queries by 1/sqrt(hidden/heads), the others by 1/sqrt(head_dim). */
    cfg->query_pre_attn_scalar = cfg->n_layers == 62 ? (float)cfg->hidden_size / (float)cfg->n_heads
                                                     : (float)cfg->head_dim;
    cfg->norm_convention = GM_NORM_DIRECT;
    if (cfg->n_layers > GM_MAX_LAYERS)
        return gm_error_set(err, GM_ERR_INVALID, "%s: %lld layers (at most %d supported)", path,
                            (long long)cfg->n_layers, GM_MAX_LAYERS);
    gm_config_gemma3_layers(cfg, 6, 10000.0f, (float)theta_global, (float)scale);
    return gm_config_validate(cfg, path, err);
}

/* ---- config.json ---------------------------------------------------------------------------- */

static const cJSON *jget(const cJSON *o, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    return (it && !cJSON_IsNull(it)) ? it : NULL;
}

static gm_status jint(const cJSON *o, const char *key, int64_t *dst, bool required,
                      const char *label, gm_error *err) {
    const cJSON *it = jget(o, key);
    if (!it) {
        if (!required) return GM_OK;
        return gm_error_set(err, GM_ERR_NOT_FOUND,
                            "%s: missing key '%s'\n  hint: a Gemma 3 config.json needs hidden_size, "
                            "num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, "
                            "intermediate_size and vocab_size",
                            label, key);
    }
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || fabs(it->valuedouble) > 1e15)
        return gm_error_set(err, GM_ERR_FORMAT, "%s: key '%s' must be an integer (got %g)", label, key,
                            cJSON_IsNumber(it) ? it->valuedouble : 0.0);
    *dst = (int64_t)it->valuedouble;
    return GM_OK;
}

static gm_status jfloat(const cJSON *o, const char *key, float *dst, const char *label, gm_error *err) {
    const cJSON *it = jget(o, key);
    if (!it) return GM_OK;
    if (!cJSON_IsNumber(it))
        return gm_error_set(err, GM_ERR_FORMAT, "%s: key '%s' must be a number", label, key);
    *dst = (float)it->valuedouble;
    return GM_OK;
}

/* Reads {"rope_type": "default"|"linear", "factor": f, "rope_theta": t} (either the new
 * per-layer-type rope_parameters entries or the old rope_scaling object). */
/* One rope_parameters entry: its base, linear factor (as a position scale) and, for Gemma 4's
 * "proportional" type, the fraction of frequency pairs that rotate (into *partial when not NULL;
 * the type is refused where partial is NULL). */
static gm_status parse_rope(const cJSON *o, float *theta, float *pos_scale, float *partial, const char *label,
                            const char *where, gm_error *err) {
    if (!o) return GM_OK;
    if (!cJSON_IsObject(o))
        return gm_error_set(err, GM_ERR_FORMAT, "%s: '%s' must be an object", label, where);
    if (theta) GM_TRY(jfloat(o, "rope_theta", theta, label, err));
    const cJSON *type = jget(o, "rope_type");
    if (!type) type = jget(o, "type");
    if (type && cJSON_IsString(type)) {
        if (strcmp(type->valuestring, "linear") == 0) {
            float f = 1.0f;
            GM_TRY(jfloat(o, "factor", &f, label, err));
            if (!(f > 0))
                return gm_error_set(err, GM_ERR_INVALID, "%s: %s.factor must be positive", label, where);
            *pos_scale = 1.0f / f;
        } else if (strcmp(type->valuestring, "proportional") == 0 && partial) {
            float f = 1.0f, pr = 1.0f;
            GM_TRY(jfloat(o, "factor", &f, label, err));
            GM_TRY(jfloat(o, "partial_rotary_factor", &pr, label, err));
            if (!(f > 0) || !(pr > 0 && pr <= 1))
                return gm_error_set(err, GM_ERR_INVALID, "%s: %s: factor must be positive and partial_rotary_factor in (0, 1]",
                                    label, where);
            *pos_scale = 1.0f / f;
            *partial = pr;
        } else if (strcmp(type->valuestring, "default") != 0) {
            return gm_error_set(err, GM_ERR_UNSUPPORTED,
                                "%s: %s.rope_type '%s' is not supported (default and linear are%s)",
                                label, where, type->valuestring, partial ? ", and proportional" : "");
        }
    }
    return GM_OK;
}

/* Parameters of a SigLIP tower without its pooling head (vision_use_head = False) and of the
 * Gemma 3 projector into d_text, as the checkpoint stores them (gemma_architecture.md §2.1-2.2):
 * the patch convolution 3 p^2 -> C with its bias, the position table (patches x C), per layer q, k,
 * v, out (C x C + bias each), two LayerNorms (weight + bias), fc1 C -> F and fc2 F -> C with
 * biases; post_layernorm (weight + bias); the projector's RMSNorm (C) and its C x d_text matrix.
 * For the So400m tower of Gemma 3 (C 1152, F 4304, 27 layers, 4096 patches of 14 x 14) the tower
 * alone is 416,866,032, the count transformers reports for Gemma3Model.vision_tower
 * (docs/memory.md, "Parameter counts"). 0 when the config leaves a needed size unknown. */
static int64_t siglip_params(const gm_vision_config *v, int64_t d_text) {
    int64_t C = v->hidden_size, F = v->intermediate_size, p = v->patch_size;
    if (C <= 0 || F <= 0 || p <= 0 || v->patches <= 0 || v->n_layers <= 0 || d_text <= 0) return 0;
    /* a config.json may say anything: the same sum in double first, so that no int64 term below
     * can wrap (every term is positive, hence at most the total) */
    double dC = (double)C, dF = (double)F;
    double bound = 3.0 * (double)p * (double)p * dC + (double)v->patches * dC +
                   (double)v->n_layers * (4 * dC * dC + 2 * dC * dF + 9 * dC + dF) + 4 * dC + dC * (double)d_text;
    if (!(bound < 0x1p62)) return 0;
    int64_t layer = 4 * (C * C + C) + 2 * 2 * C + (C * F + F) + (F * C + C);
    int64_t tower = (3 * p * p * C + C) + v->patches * C + v->n_layers * layer + 2 * C;
    return tower + C + C * d_text;
}

/* The vision tower of a multimodal config (Gemma3Config: vision_config = SiglipVisionConfig,
 * mm_tokens_per_image): its shape, for planning and for the tower to come. Absent: no tower. */
static gm_status vision_from_json(const cJSON *root, const char *label, gm_vision_config *v, gm_error *err) {
    memset(v, 0, sizeof *v);
    const cJSON *vc = jget(root, "vision_config");
    if (!vc || !cJSON_IsObject(vc)) return GM_OK;
    char where[300];
    snprintf(where, sizeof where, "%s (vision_config)", label);
    GM_TRY(jint(vc, "hidden_size", &v->hidden_size, true, where, err));
    GM_TRY(jint(vc, "num_hidden_layers", &v->n_layers, true, where, err));
    GM_TRY(jint(vc, "intermediate_size", &v->intermediate_size, false, where, err));
    GM_TRY(jint(vc, "num_attention_heads", &v->n_heads, false, where, err));
    GM_TRY(jint(vc, "image_size", &v->image_size, false, where, err));
    GM_TRY(jint(vc, "patch_size", &v->patch_size, false, where, err));
    GM_TRY(jint(root, "mm_tokens_per_image", &v->tokens, false, label, err));
    v->layer_norm_eps = 1e-6f; /* SiglipVisionConfig's default */
    GM_TRY(jfloat(vc, "layer_norm_eps", &v->layer_norm_eps, where, err));
    const cJSON *nc = jget(vc, "num_channels");
    if (nc && (!cJSON_IsNumber(nc) || nc->valuedouble != 3))
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: num_channels must be 3 (RGB images)", where);
    const cJSON *act = jget(vc, "hidden_act");
    if (act && (!cJSON_IsString(act) || (strcmp(act->valuestring, "gelu_pytorch_tanh") != 0 &&
                                         strcmp(act->valuestring, "gelu_new") != 0)))
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: hidden_act must be gelu_pytorch_tanh (the tanh GELU of SigLIP)",
                            where);
    /* Gemma3Config's defaults (HF-G3C): 255999, 256000, 262144 */
    int64_t id = 262144;
    GM_TRY(jint(root, "image_token_index", &id, false, label, err));
    v->image_token_id = (int32_t)id;
    id = 255999;
    GM_TRY(jint(root, "boi_token_index", &id, false, label, err));
    v->boi_id = (int32_t)id;
    id = 256000;
    GM_TRY(jint(root, "eoi_token_index", &id, false, label, err));
    v->eoi_id = (int32_t)id;
    if (v->image_size > 0 && v->patch_size > 0) v->patches = (v->image_size / v->patch_size) * (v->image_size / v->patch_size);
    return GM_OK;
}

/* An encoder tower's layers: all full attention, no RoPE, its own keys and values, one MLP width. */
static void encoder_layers(gm_config *t) {
    for (int64_t i = 0; i < t->n_layers; i++) {
        t->layer_type[i] = GM_LAYER_FULL;
        t->rope_theta[i] = 1.0f;
        t->rope_pos_scale[i] = 1.0f;
        t->ffn_dim[i] = t->intermediate_size;
        t->kv_source[i] = (int32_t)i;
    }
}

/* Gemma 4's tower (gm_config_vision_tower): Gemma4VisionConfig's widths, full attention over the
 * image's patches, the 2-D position table's two axes as "vocabulary" rows (2 x
 * position_embedding_size), RMSNorm on the stored weight, every layer's RoPE base the tower's. */
static gm_status gemma4_vision_tower(const gm_config *mm, gm_config *t, gm_error *err) {
    const gm_vision_config *v = &mm->vision;
    if (v->n_heads <= 0 || v->n_kv_heads <= 0 || v->n_heads % v->n_kv_heads != 0 || v->head_dim < 4 || v->head_dim % 4 != 0 ||
        v->patch_size <= 0 || v->pool <= 0 || v->image_size % (v->patch_size * v->pool) != 0 || v->tokens <= 0 ||
        v->pos_table <= 0 || v->intermediate_size <= 0)
        return gm_error_set(err, GM_ERR_INVALID,
                            "%s: vision_config is incomplete or inconsistent (heads %lld, kv heads %lld, head_dim %lld, patch_size "
                            "%lld, pooling_kernel_size %lld, image side %lld, intermediate_size %lld)", mm->name,
                            (long long)v->n_heads, (long long)v->n_kv_heads, (long long)v->head_dim, (long long)v->patch_size,
                            (long long)v->pool, (long long)v->image_size, (long long)v->intermediate_size);
    int64_t side = v->image_size / v->patch_size;
    if (side > v->pos_table)
        return gm_error_set(err, GM_ERR_INVALID, "%s: vision_config position_embedding_size = %lld: an image of %lld x %lld "
                            "patches (max_soft_tokens %lld) needs a row per column and per row of patches\n  hint: a smaller "
                            "max_soft_tokens", mm->name, (long long)v->pos_table, (long long)side, (long long)side,
                            (long long)v->max_soft_tokens);
    t->arch = GM_ARCH_GEMMA4_VISION;
    snprintf(t->name, sizeof t->name, "gemma4_vision");
    t->vocab_size = 2 * v->pos_table;
    t->hidden_size = v->hidden_size;
    t->n_layers = v->n_layers;
    t->n_heads = v->n_heads;
    t->n_kv_heads = v->n_kv_heads;
    t->head_dim = v->head_dim;
    t->intermediate_size = v->intermediate_size;
    t->max_position_embeddings = side * side;
    t->rms_norm_eps = v->layer_norm_eps;
    t->query_pre_attn_scalar = 1.0f; /* Gemma4VisionAttention.scaling = 1 */
    t->tie_word_embeddings = true;
    t->norm_convention = GM_NORM_DIRECT; /* Gemma4RMSNorm multiplies by the stored weight */
    t->vision = *v;
    t->vision.out_hidden_size = mm->hidden_size;
    encoder_layers(t);
    for (int64_t i = 0; i < t->n_layers; i++) t->rope_theta[i] = v->rope_theta;
    return GM_OK;
}

gm_status gm_config_vision_tower(const gm_config *mm, gm_config *t, gm_error *err) {
    if (mm->arch == GM_ARCH_GEMMA4) {
        memset(t, 0, sizeof *t);
        if (mm->vision.hidden_size <= 0 || mm->vision.n_layers <= 0)
            return gm_error_set(err, GM_ERR_INVALID, "%s: the model has no vision tower (no vision_config)", mm->name);
        return gemma4_vision_tower(mm, t, err);
    }
    const gm_vision_config *v = &mm->vision;
    memset(t, 0, sizeof *t);
    if (v->hidden_size <= 0 || v->n_layers <= 0)
        return gm_error_set(err, GM_ERR_INVALID, "%s: the model has no vision tower (no vision_config)", mm->name);
    /* the commonest misfits, each named by its field */
    if (v->n_layers > GM_MAX_LAYERS)
        return gm_error_set(err, GM_ERR_INVALID, "%s: vision_config num_hidden_layers = %lld: at most %d", mm->name,
                            (long long)v->n_layers, GM_MAX_LAYERS);
    if (v->n_heads > 0 && v->hidden_size % v->n_heads != 0)
        return gm_error_set(err, GM_ERR_INVALID, "%s: vision_config num_attention_heads = %lld does not divide hidden_size = %lld",
                            mm->name, (long long)v->n_heads, (long long)v->hidden_size);
    if (v->patch_size > 0 && v->image_size > 0 && v->image_size % v->patch_size != 0)
        return gm_error_set(err, GM_ERR_INVALID, "%s: vision_config patch_size = %lld does not divide image_size = %lld", mm->name,
                            (long long)v->patch_size, (long long)v->image_size);
    if (v->n_layers > GM_MAX_LAYERS || v->n_heads <= 0 || v->hidden_size % v->n_heads != 0 || v->intermediate_size <= 0 ||
        v->patch_size <= 0 || v->image_size <= 0 || v->image_size % v->patch_size != 0 || v->tokens <= 0)
        return gm_error_set(err, GM_ERR_INVALID,
                            "%s: vision_config is incomplete or inconsistent (layers %lld, heads %lld, hidden_size %lld, "
                            "intermediate_size %lld, image_size %lld, patch_size %lld, mm_tokens_per_image %lld)",
                            mm->name, (long long)v->n_layers, (long long)v->n_heads, (long long)v->hidden_size,
                            (long long)v->intermediate_size, (long long)v->image_size, (long long)v->patch_size,
                            (long long)v->tokens);
    int64_t side = v->image_size / v->patch_size, tside = (int64_t)llround(sqrt((double)v->tokens));
    if (tside * tside != v->tokens || side % tside != 0)
        return gm_error_set(err, GM_ERR_INVALID,
                            "%s: mm_tokens_per_image = %lld must be a square whose side divides the %lld x %lld patch grid",
                            mm->name, (long long)v->tokens, (long long)side, (long long)side);
    t->arch = GM_ARCH_SIGLIP;
    snprintf(t->name, sizeof t->name, "siglip");
    t->vocab_size = side * side;
    t->hidden_size = v->hidden_size;
    t->n_layers = v->n_layers;
    t->n_heads = t->n_kv_heads = v->n_heads;
    t->head_dim = v->hidden_size / v->n_heads;
    t->intermediate_size = v->intermediate_size;
    t->max_position_embeddings = side * side;
    t->rms_norm_eps = v->layer_norm_eps;
    t->query_pre_attn_scalar = (float)t->head_dim; /* SigLIP's scale head_dim^-0.5 */
    t->tie_word_embeddings = true;                 /* no head: the spec's slot 2 is the embedding */
    t->norm_convention = mm->norm_convention;      /* the projector's RMSNorm (1 + w in HF files) */
    t->vision = *v;
    t->vision.out_hidden_size = mm->hidden_size;
    encoder_layers(t);
    return GM_OK;
}

gm_status gm_config_audio_tower(const gm_config *mm, gm_config *t, gm_error *err) {
    const gm_audio_config *a = &mm->audio;
    memset(t, 0, sizeof *t);
    if (a->hidden_size <= 0 || a->n_layers <= 0)
        return gm_error_set(err, GM_ERR_INVALID, "%s: the model has no audio encoder (no audio_config)", mm->name);
    if (a->n_layers > GM_MAX_LAYERS || a->n_heads <= 0 || a->hidden_size % a->n_heads != 0 ||
        a->hidden_size / a->n_heads < 2)
        return gm_error_set(err, GM_ERR_INVALID, "%s: audio_config: conf_num_hidden_layers = %lld (at most %d), "
                            "conf_num_attention_heads = %lld must divide hidden_size = %lld into heads of 2 or more",
                            mm->name, (long long)a->n_layers, GM_MAX_LAYERS, (long long)a->n_heads,
                            (long long)a->hidden_size);
    t->arch = mm->arch == GM_ARCH_GEMMA4 ? GM_ARCH_GEMMA4_AUDIO : GM_ARCH_GEMMA3N_AUDIO;
    snprintf(t->name, sizeof t->name, "%s", mm->arch == GM_ARCH_GEMMA4 ? "gemma4_audio" : "gemma3n_audio");
    t->vocab_size = 1;
    t->hidden_size = a->hidden_size;
    t->n_layers = a->n_layers;
    t->n_heads = t->n_kv_heads = a->n_heads;
    t->head_dim = a->hidden_size / a->n_heads;
    t->intermediate_size = 4 * a->hidden_size;
    t->max_position_embeddings = 1;
    t->rms_norm_eps = a->rms_eps;
    t->query_pre_attn_scalar = (float)t->head_dim;
    t->tie_word_embeddings = true;
    t->norm_convention = GM_NORM_DIRECT; /* Gemma3nRMSNorm scales by w itself */
    t->audio = *a;
    encoder_layers(t);
    return GM_OK;
}

/* Gemma 3n's text fields beyond Gemma 3's (gemma_architecture.md §3; transformers'
 * Gemma3nTextConfig): per-layer embeddings, AltUp, LAuReL, activation sparsity, KV sharing
 * (after layer_types: it follows them). */
static gm_status gemma3n_text_json(const cJSON *root, const char *label, gm_config *cfg, gm_error *err) {
    cfg->ple_dim = 256, cfg->ple_vocab = 262144, cfg->altup_inputs = 4, cfg->laurel_rank = 64;
    GM_TRY(jint(root, "hidden_size_per_layer_input", &cfg->ple_dim, false, label, err));
    GM_TRY(jint(root, "vocab_size_per_layer_input", &cfg->ple_vocab, false, label, err));
    GM_TRY(jint(root, "altup_num_inputs", &cfg->altup_inputs, false, label, err));
    GM_TRY(jint(root, "laurel_rank", &cfg->laurel_rank, false, label, err));
    int64_t active = 0;
    GM_TRY(jint(root, "altup_active_idx", &active, false, label, err));
    const cJSON *cs = jget(root, "altup_correct_scale"), *act = jget(root, "hidden_activation");
    if (active != 0 || (cs && !cJSON_IsTrue(cs)) || (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "gelu_pytorch_tanh") != 0)))
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: %s differs from every published Gemma 3n (altup_active_idx 0, "
                            "altup_correct_scale true, hidden_activation gelu_pytorch_tanh): not supported", label,
                            active != 0 ? "altup_active_idx" : (cs && !cJSON_IsTrue(cs)) ? "altup_correct_scale" : "hidden_activation");
    if (cfg->ple_dim < 1 || cfg->ple_vocab < 1 || cfg->altup_inputs < 2 || cfg->altup_inputs > 8 || cfg->laurel_rank < 1)
        return gm_error_set(err, GM_ERR_INVALID, "%s: hidden_size_per_layer_input %lld, vocab_size_per_layer_input %lld, "
                            "altup_num_inputs %lld (2..8), laurel_rank %lld: each must be positive", label, (long long)cfg->ple_dim,
                            (long long)cfg->ple_vocab, (long long)cfg->altup_inputs, (long long)cfg->laurel_rank);
    /* activation_sparsity_pattern: one value per layer; absent: 0.95 on the first 10 layers of a
     * model of more than 10 (Gemma3nTextConfig.__post_init__) */
    const cJSON *sp = jget(root, "activation_sparsity_pattern");
    if (sp && (!cJSON_IsArray(sp) || cJSON_GetArraySize(sp) != cfg->n_layers))
        return gm_error_set(err, GM_ERR_FORMAT, "%s: 'activation_sparsity_pattern' must be a list of %lld numbers, one per layer",
                            label, (long long)cfg->n_layers);
    for (int64_t i = 0; i < cfg->n_layers; i++) {
        const cJSON *e = sp ? cJSON_GetArrayItem(sp, (int)i) : NULL;
        double v = e ? (cJSON_IsNumber(e) ? e->valuedouble : -1.0) : (cfg->n_layers > 10 && i < 10 ? 0.95 : 0.0);
        if (!(v >= 0.0 && v < 1.0))
            return gm_error_set(err, GM_ERR_INVALID, "%s: activation_sparsity_pattern[%lld] must be a number in [0, 1)", label,
                                (long long)i);
        cfg->act_sparsity[i] = (float)v;
    }
    int64_t shared = 15;
    GM_TRY(jint(root, "num_kv_shared_layers", &shared, false, label, err));
    return gm_config_kv_sharing(cfg, shared, label, err);
}

/* Gemma 4's own text fields (Gemma4TextConfig, gemma_architecture.md §4.1-4.4): per-layer
 * embeddings (hidden_size_per_layer_input, 0 / null: none), the full layers' head width and kv heads
 * (per_layer_config as transformers writes it, or global_head_dim / num_global_key_value_heads as
 * the converter's configs say), keys as values on full layers (attention_k_eq_v), KV sharing and the
 * double-wide MLP of the shared layers. Runs after the layer types and FFN widths are known. */
static gm_status gemma4_text_json(const cJSON *root, const char *label, gm_config *cfg, gm_error *err) {
    const cJSON *act = jget(root, "hidden_activation"), *moe = jget(root, "enable_moe_block");
    const cJSON *bidi = jget(root, "use_bidirectional_attention");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "gelu_pytorch_tanh") != 0))
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: hidden_activation must be gelu_pytorch_tanh (every published Gemma 4)",
                            label);
    if (moe && cJSON_IsTrue(moe)) { /* 26B-A4B's experts beside every MLP (§4.4) */
        GM_TRY(jint(root, "num_experts", &cfg->n_experts, true, label, err));
        GM_TRY(jint(root, "top_k_experts", &cfg->experts_top_k, true, label, err));
        GM_TRY(jint(root, "moe_intermediate_size", &cfg->expert_ffn, true, label, err));
        if (cfg->n_experts < 1 || cfg->n_experts > 4096 || cfg->experts_top_k < 1 || cfg->experts_top_k > cfg->n_experts ||
            cfg->expert_ffn < 1)
            return gm_error_set(err, GM_ERR_INVALID, "%s: num_experts %lld (1..4096), top_k_experts %lld (1..num_experts), "
                                "moe_intermediate_size %lld (positive)", label, (long long)cfg->n_experts,
                                (long long)cfg->experts_top_k, (long long)cfg->expert_ffn);
    }
    if (bidi && cJSON_IsString(bidi) && strcmp(bidi->valuestring, "all") == 0)
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: use_bidirectional_attention 'all' (an encoder-style Gemma 4) is not "
                            "supported: gemmarun runs the causal decoder", label);
    cfg->image_mask = bidi && cJSON_IsString(bidi) && strcmp(bidi->valuestring, "vision") == 0 ? GM_IMAGE_MASK_SLIDING
                                                                                              : GM_IMAGE_MASK_NONE;
    /* null (transformers: falsy, no per-layer inputs) is not "absent" (the default 256) */
    const cJSON *ple = cJSON_GetObjectItemCaseSensitive(root, "hidden_size_per_layer_input");
    cfg->ple_dim = 256, cfg->ple_vocab = 262144, cfg->altup_inputs = 1;
    if (ple && cJSON_IsNull(ple)) cfg->ple_dim = 0;
    else GM_TRY(jint(root, "hidden_size_per_layer_input", &cfg->ple_dim, false, label, err));
    GM_TRY(jint(root, "vocab_size_per_layer_input", &cfg->ple_vocab, false, label, err));
    if (cfg->ple_dim < 0 || (cfg->ple_dim > 0 && cfg->ple_vocab < 1))
        return gm_error_set(err, GM_ERR_INVALID, "%s: hidden_size_per_layer_input %lld, vocab_size_per_layer_input %lld: "
                            "the width may be 0 (no per-layer embeddings), neither negative", label, (long long)cfg->ple_dim,
                            (long long)cfg->ple_vocab);
    if (cfg->ple_dim == 0) cfg->ple_vocab = 0;
    const cJSON *kv = jget(root, "attention_k_eq_v");
    cfg->k_eq_v_full = kv && cJSON_IsTrue(kv);
    /* the full layers' geometry: per_layer_config {"<layer>": {"head_dim": .., "num_key_value_heads": ..}}
     * on exactly the full layers, one geometry for all of them (every published size) */
    const cJSON *plc = jget(root, "per_layer_config");
    int64_t hd = 512, kvh = 0;
    if (plc && !cJSON_IsObject(plc) && !cJSON_IsNull(plc))
        return gm_error_set(err, GM_ERR_FORMAT, "%s: 'per_layer_config' must be an object of layer numbers (as transformers "
                            "writes it: {\"5\": {\"head_dim\": 512}})", label);
    if (plc && cJSON_IsObject(plc)) {
        /* keys are layer numbers, as transformers writes them ("5", or "05" in a model of 10+ layers) */
        const cJSON *at[GM_MAX_LAYERS] = {0};
        for (const cJSON *e = plc->child; e; e = e->next) {
            char *end = NULL;
            long i = strtol(e->string, &end, 10);
            if (!e->string[0] || *end || i < 0 || i >= cfg->n_layers)
                return gm_error_set(err, GM_ERR_FORMAT, "%s: per_layer_config key '%s' is not a layer number (0..%lld)", label,
                                    e->string, (long long)(cfg->n_layers - 1));
            at[i] = e;
        }
        hd = 0, kvh = 0;
        for (int64_t i = 0; i < cfg->n_layers; i++) {
            const cJSON *e = at[i];
            bool full = cfg->layer_type[i] == GM_LAYER_FULL;
            if (!e && !full) continue;
            if (!e || !full || !cJSON_IsObject(e))
                return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: per_layer_config %s layer %lld, a %s layer: gemmarun reads "
                                    "overrides on exactly the full-attention layers of layer_types (the last layer is full "
                                    "whatever layer_types says, as transformers forces it)", label,
                                    e ? "overrides" : "leaves out", (long long)i, full ? "full" : "sliding");
            int64_t h = cfg->head_dim, k = 0;
            for (const cJSON *f = e->child; f; f = f->next) {
                if (strcmp(f->string, "head_dim") != 0 && strcmp(f->string, "num_key_value_heads") != 0)
                    return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: per_layer_config[%lld].%s: gemmarun reads head_dim and "
                                        "num_key_value_heads there", label, (long long)i, f->string);
            }
            GM_TRY(jint(e, "head_dim", &h, false, label, err));
            GM_TRY(jint(e, "num_key_value_heads", &k, false, label, err));
            if (h < 2 || h % 2 != 0 || h > 1024 || (jget(e, "num_key_value_heads") && k < 1))
                return gm_error_set(err, GM_ERR_INVALID, "%s: per_layer_config[%lld]: head_dim %lld must be even in 2..1024 "
                                    "and num_key_value_heads %lld positive", label, (long long)i, (long long)h, (long long)k);
            if ((hd && h != hd) || (kvh && k != kvh))
                return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: per_layer_config gives full layers different geometries "
                                    "(layer %lld: head_dim %lld, num_key_value_heads %lld): gemmarun needs one", label,
                                    (long long)i, (long long)h, (long long)k);
            hd = h, kvh = k;
        }
    } else {
        GM_TRY(jint(root, "global_head_dim", &hd, false, label, err));
        if (cfg->k_eq_v_full) GM_TRY(jint(root, "num_global_key_value_heads", &kvh, false, label, err));
    }
    cfg->head_dim_full = hd > 0 ? hd : cfg->head_dim;
    cfg->n_kv_heads_full = kvh > 0 ? kvh : cfg->n_kv_heads;
    if (cfg->head_dim_full < 2 || cfg->head_dim_full % 2 != 0 || cfg->n_kv_heads_full < 1 || cfg->n_heads % cfg->n_kv_heads_full != 0)
        return gm_error_set(err, GM_ERR_INVALID, "%s: full layers' head_dim %lld must be even and their num_key_value_heads "
                            "%lld divide num_attention_heads %lld", label, (long long)cfg->head_dim_full,
                            (long long)cfg->n_kv_heads_full, (long long)cfg->n_heads);
    int64_t shared = 0;
    GM_TRY(jint(root, "num_kv_shared_layers", &shared, false, label, err));
    GM_TRY(gm_config_kv_sharing(cfg, shared, label, err));
    const cJSON *wide = jget(root, "use_double_wide_mlp");
    if (wide && cJSON_IsTrue(wide))
        for (int64_t i = 0; i < cfg->n_layers; i++)
            if (cfg->kv_source[i] != i) cfg->ffn_dim[i] = 2 * cfg->ffn_dim[i]; /* intermediate_size stays the config's */
    return GM_OK;
}

/* intermediate_size: one width for all layers, or (Gemma 3n) a list with one per layer; F is then
 * the widest. */
static gm_status ffn_widths(const cJSON *root, const char *label, gm_config *cfg, gm_error *err) {
    const cJSON *is = jget(root, "intermediate_size");
    if (!is || !cJSON_IsArray(is)) {
        GM_TRY(jint(root, "intermediate_size", &cfg->intermediate_size, true, label, err));
        for (int64_t i = 0; i < cfg->n_layers; i++) cfg->ffn_dim[i] = cfg->intermediate_size;
        return GM_OK;
    }
    if (cJSON_GetArraySize(is) != cfg->n_layers)
        return gm_error_set(err, GM_ERR_FORMAT, "%s: 'intermediate_size' lists %d widths for %lld layers", label,
                            cJSON_GetArraySize(is), (long long)cfg->n_layers);
    cfg->intermediate_size = 0;
    for (int64_t i = 0; i < cfg->n_layers; i++) {
        const cJSON *e = cJSON_GetArrayItem(is, (int)i);
        if (!cJSON_IsNumber(e) || e->valuedouble < 1 || e->valuedouble != floor(e->valuedouble) || e->valuedouble > 1e9)
            return gm_error_set(err, GM_ERR_FORMAT, "%s: intermediate_size[%lld] must be a positive integer", label, (long long)i);
        cfg->ffn_dim[i] = (int64_t)e->valuedouble;
        if (cfg->ffn_dim[i] > cfg->intermediate_size) cfg->intermediate_size = cfg->ffn_dim[i];
    }
    return GM_OK;
}

static gm_status gemma3n_towers_json(const cJSON *root, const char *label, gm_config *cfg, gm_error *err);
static gm_status gemma4_towers_json(const cJSON *root, const char *label, gm_config *cfg, gm_error *err);
static gm_status tower_int(const cJSON *ac, const char *key, int64_t lo, int64_t hi, int64_t *dst, const char *label,
                           gm_error *err);
static gm_status conv_channels(const cJSON *ac, const char *key, int64_t dst[2], const char *label, const char *model,
                               gm_error *err);

static gm_status config_from_text_json(const cJSON *root, const char *label, gm_config *cfg,
                                       gm_error *err) {
    defaults_gemma3(cfg);
    const cJSON *mt = jget(root, "model_type");
    bool g3n = false, g4 = false;
    if (mt && cJSON_IsString(mt)) {
        const char *m = mt->valuestring;
        g3n = strcmp(m, "gemma3n_text") == 0 || strcmp(m, "gemma3n") == 0;
        g4 = strcmp(m, "gemma4_text") == 0 || strcmp(m, "gemma4") == 0;
        if (strcmp(m, "gemma3_text") != 0 && strcmp(m, "gemma3") != 0 && !g3n && !g4)
            return gm_error_set(err, GM_ERR_UNSUPPORTED,
                                "%s: model_type '%s' is not supported (gemmarun reads Gemma 3, 3n and 4 text decoders: "
                                "model_type gemma3_text / gemma3n_text / gemma4_text, or gemma3 / gemma3n / gemma4 with a "
                                "text_config)",
                                label, m);
        snprintf(cfg->name, sizeof cfg->name, "%s", m);
    } else {
        snprintf(cfg->name, sizeof cfg->name, "gemma3_text");
    }
    if (g3n || g4) { /* §3.2, §4.2: weights used directly as norm scales, attention scaling 1, logits capped at 30 */
        cfg->arch = g4 ? GM_ARCH_GEMMA4 : GM_ARCH_GEMMA3N;
        cfg->query_pre_attn_scalar = 1.0f;
        cfg->final_logit_softcap = g4 ? 0.0f : 30.0f; /* Gemma4TextConfig: None unless stated (every published: 30) */
    }
    GM_TRY(jint(root, "vocab_size", &cfg->vocab_size, true, label, err));
    GM_TRY(jint(root, "hidden_size", &cfg->hidden_size, true, label, err));
    GM_TRY(jint(root, "num_hidden_layers", &cfg->n_layers, true, label, err));
    GM_TRY(jint(root, "num_attention_heads", &cfg->n_heads, true, label, err));
    GM_TRY(jint(root, "num_key_value_heads", &cfg->n_kv_heads, true, label, err));
    GM_TRY(jint(root, "head_dim", &cfg->head_dim, true, label, err));
    if (cfg->n_layers <= 0 || cfg->n_layers > GM_MAX_LAYERS)
        return gm_error_set(err, GM_ERR_INVALID, "%s: num_hidden_layers = %lld is outside 1..%d",
                            label, (long long)cfg->n_layers, GM_MAX_LAYERS);
    GM_TRY(jint(root, "sliding_window", &cfg->sliding_window, false, label, err));
    GM_TRY(jint(root, "max_position_embeddings", &cfg->max_position_embeddings, false, label, err));
    GM_TRY(jfloat(root, "rms_norm_eps", &cfg->rms_norm_eps, label, err));
    if (!g3n && !g4) GM_TRY(jfloat(root, "query_pre_attn_scalar", &cfg->query_pre_attn_scalar, label, err));
    GM_TRY(jfloat(root, "final_logit_softcapping", &cfg->final_logit_softcap, label, err));
    GM_TRY(jfloat(root, "attn_logit_softcapping", &cfg->attn_logit_softcap, label, err));
    const cJSON *tie = jget(root, "tie_word_embeddings");
    if (tie) cfg->tie_word_embeddings = cJSON_IsTrue(tie);
    int64_t id;
    id = cfg->bos_id;
    GM_TRY(jint(root, "bos_token_id", &id, false, label, err));
    cfg->bos_id = (int32_t)id;
    id = cfg->pad_id;
    GM_TRY(jint(root, "pad_token_id", &id, false, label, err));
    cfg->pad_id = (int32_t)id;
    const cJSON *eos = jget(root, "eos_token_id");
    if (eos && cJSON_IsArray(eos) && cJSON_GetArraySize(eos) > 0) eos = cJSON_GetArrayItem(eos, 0);
    if (eos && cJSON_IsNumber(eos)) cfg->eos_id = (int32_t)eos->valueint;
    cfg->norm_convention = g3n || g4 ? GM_NORM_DIRECT : GM_NORM_ONE_PLUS_W;

    /* Old field names: rope_theta (global), rope_local_base_freq, rope_scaling (global only),
     * sliding_window_pattern. New: layer_types + rope_parameters per layer type. Both are read;
     * the new ones win where present (gemma_architecture.md §0 caveat). */
    float theta_global = 1e6f, theta_local = 1e4f, scale_global = 1.0f, scale_local = 1.0f;
    /* Gemma 4 without rope_parameters: Gemma4TextConfig's defaults (proportional 0.25 on full layers) */
    float partial_global = g4 ? 0.25f : 0.0f, partial_local = 0.0f;
    GM_TRY(jfloat(root, "rope_theta", &theta_global, label, err));
    GM_TRY(jfloat(root, "rope_local_base_freq", &theta_local, label, err));
    GM_TRY(parse_rope(jget(root, "rope_scaling"), NULL, &scale_global, NULL, label, "rope_scaling", err));
    const cJSON *rp = jget(root, "rope_parameters");
    if (rp) {
        const cJSON *full = jget(rp, "full_attention"), *slide = jget(rp, "sliding_attention");
        if (full || slide) {
            GM_TRY(parse_rope(full, &theta_global, &scale_global, g4 ? &partial_global : NULL, label,
                              "rope_parameters.full_attention", err));
            GM_TRY(parse_rope(slide, &theta_local, &scale_local, g4 ? &partial_local : NULL, label,
                              "rope_parameters.sliding_attention", err));
        } else {
            GM_TRY(parse_rope(rp, &theta_global, &scale_global, NULL, label, "rope_parameters", err));
        }
    }
    int64_t pattern = g3n ? 5 : 6; /* Gemma 3n: full iff (i + 1) % 5 == 0 (Gemma3nTextConfig) */
    GM_TRY(jint(root, "sliding_window_pattern", &pattern, false, label, err));
    gm_config_gemma3_layers(cfg, (int)pattern, theta_local, theta_global, scale_global);
    /* Gemma 4: the last layer is full attention whatever the pattern or layer_types say
     * (Gemma4TextConfig.__post_init__ forces it, with a warning) - applied after both below */
    GM_TRY(ffn_widths(root, label, cfg, err)); /* after: it sets every layer's width */
    const cJSON *lt = jget(root, "layer_types");
    if (lt) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != cfg->n_layers)
            return gm_error_set(err, GM_ERR_FORMAT,
                                "%s: 'layer_types' must be a list of %lld entries", label,
                                (long long)cfg->n_layers);
        for (int64_t i = 0; i < cfg->n_layers; i++) {
            const cJSON *e = cJSON_GetArrayItem(lt, (int)i);
            if (!cJSON_IsString(e))
                return gm_error_set(err, GM_ERR_FORMAT, "%s: layer_types[%lld] must be a string", label, (long long)i);
            if (strcmp(e->valuestring, "full_attention") == 0) cfg->layer_type[i] = GM_LAYER_FULL;
            else if (strcmp(e->valuestring, "sliding_attention") == 0) cfg->layer_type[i] = GM_LAYER_SLIDING;
            else
                return gm_error_set(err, GM_ERR_UNSUPPORTED,
                                    "%s: layer_types[%lld] = '%s' (allowed: sliding_attention, full_attention)",
                                    label, (long long)i, e->valuestring);
        }
    }
    if (g4) cfg->layer_type[cfg->n_layers - 1] = GM_LAYER_FULL;
    for (int64_t i = 0; i < cfg->n_layers; i++) {
        bool full = cfg->layer_type[i] == GM_LAYER_FULL;
        cfg->rope_theta[i] = full ? theta_global : theta_local;
        cfg->rope_pos_scale[i] = full ? scale_global : scale_local;
        cfg->rope_partial[i] = full ? partial_global : partial_local;
    }
    if (g3n) GM_TRY(gemma3n_text_json(root, label, cfg, err));
    if (g4) GM_TRY(gemma4_text_json(root, label, cfg, err));
    return gm_config_validate(cfg, label, err);
}

gm_status gm_config_from_json(const char *json, const char *label, gm_config *cfg, gm_error *err) {
    cJSON *root = cJSON_Parse(json);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        long off = at ? (long)(at - json) : -1;
        return gm_error_set(err, GM_ERR_FORMAT, "%s: not valid JSON (near byte %ld)", label, off);
    }
    gm_status s;
    if (!cJSON_IsObject(root)) {
        s = gm_error_set(err, GM_ERR_FORMAT, "%s: top level must be a JSON object", label);
    } else {
        const cJSON *text = jget(root, "text_config");
        s = config_from_text_json(text ? text : root, label, cfg, err);
        if (s == GM_OK && text && cfg->arch == GM_ARCH_GEMMA4) {
            s = gemma4_towers_json(root, label, cfg, err);
        } else if (s == GM_OK && text && cfg->arch == GM_ARCH_GEMMA3N) {
            s = gemma3n_towers_json(root, label, cfg, err);
        } else if (s == GM_OK && text) {
            s = vision_from_json(root, label, &cfg->vision, err);
        if (s == GM_OK) cfg->vision.out_hidden_size = cfg->vision.hidden_size > 0 ? cfg->hidden_size : 0;
            /* the tower and projector are in the checkpoint: its parameter count includes them */
            if (s == GM_OK && cfg->vision.hidden_size > 0) cfg->vision.params = siglip_params(&cfg->vision, cfg->hidden_size);
        }
    }
    cJSON_Delete(root);
    return s;
}

/* Gemma 4's image-token budget from the processor's files in config.json's folder dir
 * (max_soft_tokens of preprocessor_config.json, or of processor_config.json's image_processor): the
 * image grid gemmarun resizes to (gm_config_gemma4_image_budget); 280 without either. */
static gm_status read_image_budget(const char *dir, gm_config *cfg, gm_error *err) {
    static const char *const files[] = {"preprocessor_config.json", "processor_config.json"};
    for (int i = 0; i < 2; i++) {
        char path[1100];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        if (access(path, F_OK) != 0) continue;
        char *text = NULL;
        GM_TRY(gm_read_file(path, &text, NULL, err));
        cJSON *j = cJSON_Parse(text);
        gm_free(text);
        if (!j) return gm_error_set(err, GM_ERR_FORMAT, "%s: not valid JSON", path);
        const cJSON *ip = cJSON_GetObjectItemCaseSensitive(j, "image_processor");
        const cJSON *o = cJSON_IsObject(ip) ? ip : j;
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, "max_soft_tokens");
        gm_status s = GM_OK;
        /* the processor's patch and pooling must be the tower's */
        struct { const char *key; int64_t want; } same[] = {{"patch_size", cfg->vision.patch_size},
                                                           {"pooling_kernel_size", cfg->vision.pool}};
        for (size_t k = 0; k < 2 && s == GM_OK; k++) {
            const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, same[k].key);
            if (x && (!cJSON_IsNumber(x) || x->valuedouble != (double)same[k].want))
                s = gm_error_set(err, GM_ERR_INVALID, "%s: %s = %g, but config.json's vision_config says %lld: the processor and "
                                 "the model belong together", path, same[k].key, cJSON_IsNumber(x) ? x->valuedouble : 0.0,
                                 (long long)same[k].want);
        }
        if (s == GM_OK && b && (!cJSON_IsNumber(b) || b->valuedouble != floor(b->valuedouble)))
            s = gm_error_set(err, GM_ERR_FORMAT, "%s: max_soft_tokens must be an integer (70, 140, 280, 560 or 1120)", path);
        else if (s == GM_OK && b && (s = gm_config_gemma4_image_budget(cfg, (int64_t)b->valuedouble, err)) != GM_OK)
            gm_error_prefix(err, "%s", path);
        cJSON_Delete(j);
        if (s != GM_OK || b) return s;
    }
    return GM_OK;
}

gm_status gm_config_from_json_file(const char *path, gm_config *cfg, gm_error *err) {
    char *buf = NULL;
    GM_TRY(gm_read_file(path, &buf, NULL, err));
    gm_status s = gm_config_from_json(buf, path, cfg, err);
    gm_free(buf);
    if (s == GM_OK && cfg->arch == GM_ARCH_GEMMA4 && cfg->vision.hidden_size > 0) {
        char dir[1024];
        const char *slash = strrchr(path, '/');
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
        s = read_image_budget(dir, cfg, err);
    }
    return s;
}

/* ---- presets ---------------------------------------------------------------------------------
 *
 * Gemma 3 sizes: gemma_architecture.md §1.1. Gemma 3n (§3.1) and Gemma 4 (§4.1) sizes, with their
 * per-layer arrays (layer types, FFN widths, KV-sharing sources, RoPE bases) and the sizes of the
 * vision / audio towers, for planning. Published parameter totals these reproduce, with sources:
 * docs/memory.md ("The seeds' cases", parameter counts). */

typedef struct preset {
    const char *name;
    int64_t C, L, H, KVH, D, F, W, V, maxpos;
    float qscalar, global_scale;
    bool siglip; /* multimodal (Gemma3ForConditionalGeneration): the SigLIP tower below */
} preset;

static const preset presets[] = {
    {"gemma3-270m", 640, 18, 4, 1, 256, 2048, 512, 262144, 32768, 256, 1.0f, false},
    {"gemma3-1b", 1152, 26, 4, 1, 256, 6912, 512, 262144, 32768, 256, 1.0f, false},
    {"gemma3-4b", 2560, 34, 8, 4, 256, 10240, 1024, 262208, 131072, 256, 0.125f, true},
    {"gemma3-12b", 3840, 48, 16, 8, 256, 15360, 1024, 262208, 131072, 256, 0.125f, true},
    {"gemma3-27b", 5376, 62, 32, 16, 128, 21504, 1024, 262208, 131072, 168, 0.125f, true},
};

/* The vision tower of the multimodal Gemma 3 sizes (4b, 12b, 27b share it): SigLIP So400m as
 * transformers' converter configures it (convert_gemma3_weights.py _VISION_CONFIG, the hub's
 * google/gemma-3-{4b,12b,27b}-it config.json: hidden 1152, 27 layers, 16 heads of 72, MLP 4304,
 * image 896, patch 14, gelu_pytorch_tanh, LayerNorm eps 1e-6, no pooling head) with Gemma3Config's
 * mm_tokens_per_image 256 (4 x 4 average pooling of the 64 x 64 patch grid) and token ids
 * (image_token_index 262144, boi 255999, eoi 256000): gemma_architecture.md §2.1-2.4. The
 * projector maps 1152 into the text width. */
static void gemma3_siglip(gm_config *c) {
    gm_vision_config *v = &c->vision;
    memset(v, 0, sizeof *v);
    v->hidden_size = 1152;
    v->n_layers = 27;
    v->n_heads = 16;
    v->intermediate_size = 4304;
    v->image_size = 896;
    v->patch_size = 14;
    v->patches = (896 / 14) * (896 / 14);
    v->tokens = 256;
    v->layer_norm_eps = 1e-6f;
    v->out_hidden_size = c->hidden_size;
    v->image_token_id = 262144;
    v->boi_id = 255999;
    v->eoi_id = 256000;
    v->params = siglip_params(v, c->hidden_size);
}

/* Gemma 3n / Gemma 4 text decoders (§3.1, §4.1). kv_shared: the last kv_shared layers reuse the
 * K/V of an earlier layer (§3.5, §4.4); wide_shared_ffn: FFN width of those layers (Gemma 4 E2B's
 * "double-wide" MLP, 0 = same as F). */
typedef struct preset_ext {
    const char *name;
    gm_arch arch;
    int64_t C, L, H, KVH, KVH_full, D, D_full, F, wide_shared_ffn, W, V, maxpos;
    int pattern;                /* layer i is full iff (i+1) % pattern == 0 */
    int64_t kv_shared;
    int64_t ple_dim, altup, laurel;
    bool k_eq_v;
    int64_t experts, top_k, expert_ffn;
    int tower;                  /* which vision / audio towers (below) */
} preset_ext;

enum { TOWERS_3N = 1, TOWERS_4_SMALL, TOWERS_4_LARGE };

static const preset_ext presets_ext[] = {
    /* name             arch             C     L   H  KVH KVHf  D    Df   F      wide   W     V       maxpos  pat shared ple altup laurel k=v   E    k  Fe   towers */
    {"gemma3n-e2b", GM_ARCH_GEMMA3N, 2048, 30, 8, 2, 2, 256, 256, 8192, 0, 512, 262400, 32768, 5, 10, 256, 4, 64, false, 0, 0, 0, TOWERS_3N},
    {"gemma3n-e4b", GM_ARCH_GEMMA3N, 2048, 35, 8, 2, 2, 256, 256, 16384, 0, 512, 262400, 32768, 5, 15, 256, 4, 64, false, 0, 0, 0, TOWERS_3N},
    {"gemma4-e2b", GM_ARCH_GEMMA4, 1536, 35, 8, 1, 1, 256, 512, 6144, 12288, 512, 262144, 131072, 5, 20, 256, 1, 0, false, 0, 0, 0, TOWERS_4_SMALL},
    {"gemma4-e4b", GM_ARCH_GEMMA4, 2560, 42, 8, 2, 2, 256, 512, 10240, 0, 512, 262144, 131072, 6, 18, 256, 1, 0, false, 0, 0, 0, TOWERS_4_SMALL},
    {"gemma4-31b", GM_ARCH_GEMMA4, 5376, 60, 32, 16, 4, 256, 512, 21504, 0, 1024, 262144, 262144, 6, 0, 0, 1, 0, true, 0, 0, 0, TOWERS_4_LARGE},
    {"gemma4-26b-a4b", GM_ARCH_GEMMA4, 2816, 30, 16, 8, 2, 256, 512, 2112, 0, 1024, 262144, 262144, 6, 0, 0, 1, 0, true, 128, 8, 704, TOWERS_4_LARGE},
};

/* Gemma 4 vision encoder (§4.5): `layers` Gemma-style blocks of width dv (4 dv^2 attention, GeGLU
 * MLP 3 dv fv, four sandwich norms, q/k norms of head width hd), the 16x16x3 = 768 -> dv patch
 * projection, the factorized position table [2, 10240, dv], the 31B/26B standardization (2 dv),
 * clipped linears on E2B/E4B (4 scalars per linear), and the LM embedder Linear(dv -> d_text).
 * For 27 x 1152 this gives 569,550,384 without the embedder - the count a published extraction of
 * the 31B tower reports (docs/memory.md). */
static int64_t gemma4_vision_params(int64_t dv, int64_t layers, int64_t fv, int64_t hd, bool standardize,
                                    bool clipped, int64_t d_text) {
    int64_t per = 4 * dv * dv + 3 * dv * fv + 4 * dv + 2 * hd + (clipped ? 7 * 4 : 0);
    return layers * per + 768 * dv + 2 * 10240 * dv + (standardize ? 2 * dv : 0) + dv * d_text;
}

/* USM-style conformer (§3.9 for Gemma 3n, §4.6 for Gemma 4), hidden da, `layers` blocks: two
 * half-step FFNs (da -> 4 da -> da, pre/post norms) = 16 da^2 + 4 da; attention q, k, v, post and
 * the relative-position projection = 5 da^2, its norms and per-dim scale (head width hd); LightConv
 * (da -> 2 da GLU, depthwise k=5, norm, da -> da) = 3 da^2 + 7 da; the block-final norm. Plus the
 * sub-sampling convolutions (1 -> 128 -> 32 channels, 3x3) with their norms and the 1024 -> da
 * projection. Gemma 4's FFN width is not in our notes: 4 da as in Gemma 3n (an assumption). */
static int64_t conformer_params(int64_t da, int64_t layers, int64_t hd) {
    int64_t per = 24 * da * da + 14 * da + hd;
    return layers * per + (1 * 128 * 9 + 128) + (128 * 32 * 9 + 32) + 1024 * da;
}

/* Gemma 4's towers as the planner counts them (§4.5-4.6), for the presets and for config.json:
 * the vision tower of width dv (layers, MLP width fv, head width hd, standardization, clipped
 * linears), 256 soft tokens per image (a square photo at budget 280), 48 x 48 patches; the audio
 * conformer of width da (layers, output_proj width out, 8 heads). */
static void gemma4_vision(gm_config *c, int64_t dv, int64_t layers, int64_t fv, int64_t hd, bool standardize, bool clipped) {
    gm_vision_config *v = &c->vision;
    v->params = gemma4_vision_params(dv, layers, fv, hd, standardize, clipped, c->hidden_size);
    v->hidden_size = dv;
    v->n_layers = layers;
    v->intermediate_size = fv;
    /* Gemma4VisionConfig's and Gemma4Config's other defaults (transformers 5.24) */
    v->head_dim = hd, v->n_heads = v->n_kv_heads = dv / hd;
    v->patch_size = 16, v->pool = 3, v->pos_table = 10240;
    v->layer_norm_eps = 1e-6f, v->rope_theta = 100.0f;
    v->standardize = standardize, v->clipped = clipped;
    v->out_hidden_size = c->hidden_size;
    v->image_token_id = 258880, v->boi_id = 255999, v->eoi_id = 258882;
    gm_error e = {0};
    (void)gm_config_gemma4_image_budget(c, 280, &e); /* 280 is supported and the patch is set: cannot fail */
}

gm_status gm_config_gemma4_image_budget(gm_config *cfg, int64_t max_soft_tokens, gm_error *err) {
    gm_vision_config *v = &cfg->vision;
    static const int64_t supported[] = {70, 140, 280, 560, 1120}; /* _SUPPORTED_SOFT_TOKENS */
    bool ok = false;
    for (size_t i = 0; i < sizeof supported / sizeof supported[0]; i++) ok |= max_soft_tokens == supported[i];
    if (!ok)
        return gm_error_set(err, GM_ERR_INVALID, "max_soft_tokens = %lld: Gemma 4's image processor takes 70, 140, 280, "
                            "560 or 1120 soft tokens per image", (long long)max_soft_tokens);
    int64_t k = v->pool > 0 ? v->pool : 3, p = v->patch_size, mult = k * p;
    if (p <= 0) return gm_error_set(err, GM_ERR_INVALID, "%s: the vision tower has no patch_size", cfg->name);
    /* get_aspect_ratio_preserving_size with height = width: factor * side = sqrt(max_patches p^2) */
    double ideal = sqrt((double)(max_soft_tokens * k * k) * (double)(p * p));
    int64_t side = (int64_t)floor(ideal / (double)mult) * mult;
    if (side < mult) side = mult;
    v->max_soft_tokens = max_soft_tokens;
    v->image_size = side;
    v->patches = (side / p) * (side / p);
    v->tokens = (side / mult) * (side / mult);
    return GM_OK;
}

/* Gemma4AudioConfig's defaults (transformers 5.24 configuration_gemma4.py) at width da, with
 * Gemma4Config's token ids and Gemma4Processor's cap of 750 soft tokens per clip
 * (audio_seq_length: 30 s at 40 ms a token). */
static void gemma4_audio(gm_config *c, int64_t da, int64_t layers, int64_t out) {
    gm_audio_config *a = &c->audio;
    memset(a, 0, sizeof *a);
    /* the conformer, output_proj Linear(da -> out, bias), LM embedder out -> D (§4.6) */
    a->params = conformer_params(da, layers, da / 8) + 11 * 4 * layers + da * out + out + out * c->hidden_size;
    a->tokens_per_s = 25.0; /* 40 ms per token, no reduction (§4.6) */
    a->hidden_size = da;
    a->n_layers = layers;
    a->frames_per_s = 25.0;
    a->n_mels = 128; /* Gemma4AudioFeatureExtractor's feature_size */
    a->n_heads = 8, a->chunk = 12, a->context_left = 13, a->context_right = 0;
    a->logit_cap = 50.0f, a->conv_kernel = 5, a->reduction = 1, a->residual_weight = 0.5f;
    a->clip = 1e10f, a->rms_eps = 1e-6f, a->group_norm_eps = 1e-6f; /* the sub-sampling's LayerNorms take rms_norm_eps */
    a->sscp_channels[0] = 128, a->sscp_channels[1] = 32;
    for (int i = 0; i < 2; i++) /* Gemma4AudioSubSampleConvProjectionLayer: Conv2d 3 x 3, stride 2, padding 1 */
        a->sscp_kernel[i][0] = a->sscp_kernel[i][1] = 3, a->sscp_stride[i][0] = a->sscp_stride[i][1] = 2;
    a->soft_tokens = 750;
    a->audio_token_id = 258881, a->boa_id = 256000, a->eoa_id = 258883;
    a->out_dims = out;
    a->clipped = true;
}

static void set_towers(gm_config *c, int tower) {
    int64_t D = c->hidden_size;
    switch (tower) {
    case TOWERS_3N:
        /* MobileNet-V5-300M (§3.10): its exact count is not derivable from our notes (block
         * internals live in timm); 300 M is the published size in its name. Plus the vision
         * embedder (§3.8): 128 hard-token rows x 2048, two norms, Linear(2048 -> 2048). */
        c->vision.params = 300000000 + 128 * 2048 + 2 * 2048 + 2048 * D;
        c->vision.tokens = 256;      /* 16 x 16 pooled grid per 768 x 768 image (§3.10) */
        c->vision.hidden_size = 2048;
        c->vision.n_layers = 84;       /* blocks, HF-G3nW cumulative counts 3/8/45/84 */
        c->vision.patches = 48 * 48; /* the stage-2 grid its attention blocks run over */
        /* Gemma3nConfig's token ids (HF-G3nC): image 262145 between 255999 and 262144; gemmarun
         * reads no Gemma 3n image, but every check of a batch for image tokens uses this id (left
         * at 0 it was the pad id: padded batches "held images") */
        c->vision.image_token_id = 262145;
        c->vision.boi_id = 255999;
        c->vision.eoi_id = 262144;
        c->vision.hard_offset = 262144; /* Gemma3nVisionConfig: vocab_offset, vocab_size, rms_norm_eps */
        c->vision.hard_vocab = 128;
        c->vision.layer_norm_eps = 1e-6f;
        /* audio: 12 x 1536 conformer (§3.9) + embedder (§3.8: 128 x 1536 rows, two norms,
         * Linear(1536 -> 2048)) */
        c->audio.params = conformer_params(1536, 12, 192) + 128 * 1536 + 2 * 1536 + 1536 * D;
        c->audio.tokens_per_s = 6.25; /* 160 ms per token (§3.9) */
        c->audio.hidden_size = 1536;
        c->audio.n_layers = 12;
        c->audio.frames_per_s = 25.0; /* conformer frames: 10 ms hop x 2 x 2 before the 4x reduction */
        /* the rest of Gemma3nAudioConfig's and Gemma3nConfig's defaults (HF-G3nC) */
        c->audio.n_mels = 128;
        c->audio.n_heads = 8;
        c->audio.chunk = 12;
        c->audio.context_left = 13;
        c->audio.context_right = 0;
        c->audio.logit_cap = 50.0f;
        c->audio.conv_kernel = 5;
        c->audio.reduction = 4;
        c->audio.residual_weight = 0.5f;
        c->audio.clip = 1e10f;
        c->audio.rms_eps = 1e-6f;
        c->audio.group_norm_eps = 1e-3f;
        c->audio.sscp_channels[0] = 128, c->audio.sscp_channels[1] = 32;
        for (int i = 0; i < 2; i++)
            c->audio.sscp_kernel[i][0] = c->audio.sscp_kernel[i][1] = 3, c->audio.sscp_stride[i][0] = c->audio.sscp_stride[i][1] = 2;
        c->audio.vocab_size = 128;
        c->audio.vocab_offset = 262144 + 128;
        c->audio.soft_tokens = 188;
        c->audio.audio_token_id = 262273;
        c->audio.boa_id = 256000;
        c->audio.eoa_id = 262272;
        break;
    case TOWERS_4_SMALL:
        gemma4_vision(c, 768, 16, 3072, 64, false, true);
        gemma4_audio(c, 1024, 12, 1536);
        break;
    case TOWERS_4_LARGE:
        gemma4_vision(c, 1152, 27, 4304, 72, true, false);
        break;
    default: break;
    }
}

/* Gemma4ForConditionalGeneration's towers: vision_config's width, layers, MLP width and head
 * width (Gemma4VisionConfig's defaults: the E-models' 16 x 768 tower), its standardization and
 * clipped linears, the parameter count of §4.5, 256 soft tokens per image (a square photo at the
 * default budget of 280), the image token ids (Gemma4Config's defaults); audio_config's conformer
 * (Gemma4AudioConfig's keys, each checked and named) and the audio token ids. */
static gm_status gemma4_towers_json(const cJSON *root, const char *label, gm_config *cfg, gm_error *err) {
    const cJSON *vc = jget(root, "vision_config"), *ac = jget(root, "audio_config");
    char where[160];
    if (vc && cJSON_IsObject(vc)) {
        /* Gemma4VisionConfig's defaults (transformers 5.24) where a key is absent */
        int64_t dv = 768, layers = 16, fv = 3072, hd = 64, heads = 12, kvh = -1, patch = 16, pool = 3, table = 10240;
        int64_t id = 258880, boi = 255999, eoi = 258882;
        float eps = 1e-6f, theta = 100.0f;
        snprintf(where, sizeof where, "%s (vision_config)", label);
        GM_TRY(jint(vc, "hidden_size", &dv, false, where, err));
        GM_TRY(jint(vc, "num_hidden_layers", &layers, false, where, err));
        GM_TRY(jint(vc, "intermediate_size", &fv, false, where, err));
        GM_TRY(jint(vc, "head_dim", &hd, false, where, err));
        GM_TRY(jint(vc, "num_attention_heads", &heads, false, where, err));
        GM_TRY(jint(vc, "num_key_value_heads", &kvh, false, where, err));
        GM_TRY(jint(vc, "patch_size", &patch, false, where, err));
        GM_TRY(jint(vc, "pooling_kernel_size", &pool, false, where, err));
        GM_TRY(jint(vc, "position_embedding_size", &table, false, where, err));
        GM_TRY(jfloat(vc, "rms_norm_eps", &eps, where, err));
        const cJSON *rp = jget(vc, "rope_parameters");
        if (rp && cJSON_IsObject(rp)) GM_TRY(jfloat(rp, "rope_theta", &theta, where, err));
        if (kvh < 0) kvh = heads;
        /* each field in its range, named */
        struct { const char *key; int64_t v, lo, hi; } rng[] = {
            {"hidden_size", dv, 1, 65536},         {"num_hidden_layers", layers, 1, GM_MAX_LAYERS},
            {"intermediate_size", fv, 1, 1 << 20}, {"head_dim", hd, 4, 4096},
            {"num_attention_heads", heads, 1, 1024}, {"num_key_value_heads", kvh, 1, 1024},
            {"patch_size", patch, 1, 1024},        {"pooling_kernel_size", pool, 1, 64},
            {"position_embedding_size", table, 1, 1 << 24},
        };
        for (size_t i = 0; i < sizeof rng / sizeof rng[0]; i++)
            if (rng[i].v < rng[i].lo || rng[i].v > rng[i].hi)
                return gm_error_set(err, GM_ERR_INVALID, "%s: %s = %lld: must be in %lld..%lld", where, rng[i].key,
                                    (long long)rng[i].v, (long long)rng[i].lo, (long long)rng[i].hi);
        if (hd % 4 != 0)
            return gm_error_set(err, GM_ERR_INVALID, "%s: head_dim = %lld: must be a multiple of 4 (the 2-D RoPE rotates its "
                                "halves by column and row, each in pairs)", where, (long long)hd);
        if (heads % kvh != 0)
            return gm_error_set(err, GM_ERR_INVALID, "%s: num_key_value_heads = %lld does not divide num_attention_heads = %lld",
                                where, (long long)kvh, (long long)heads);
        if (!(eps > 0) || !(theta > 0))
            return gm_error_set(err, GM_ERR_INVALID, "%s: rms_norm_eps = %g and rope_theta = %g must be positive", where,
                                (double)eps, (double)theta);
        const cJSON *vact = jget(vc, "hidden_activation");
        if (vact && (!cJSON_IsString(vact) || strcmp(vact->valuestring, "gelu_pytorch_tanh") != 0))
            return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: hidden_activation must be gelu_pytorch_tanh (Gemma4VisionConfig's, "
                                "every published Gemma 4)", where);
        const cJSON *st = jget(vc, "standardize"), *cl = jget(vc, "use_clipped_linears");
        gm_vision_config *v = &cfg->vision;
        gemma4_vision(cfg, dv, layers, fv, hd, st && cJSON_IsTrue(st), cl && cJSON_IsTrue(cl));
        v->intermediate_size = fv;
        v->patch_size = patch;
        v->n_heads = heads, v->n_kv_heads = kvh, v->head_dim = hd;
        v->pool = pool, v->pos_table = table;
        v->layer_norm_eps = eps, v->rope_theta = theta;
        v->standardize = st && cJSON_IsTrue(st), v->clipped = cl && cJSON_IsTrue(cl);
        v->out_hidden_size = cfg->hidden_size;
        GM_TRY(jint(root, "image_token_id", &id, false, label, err));
        GM_TRY(jint(root, "boi_token_id", &boi, false, label, err));
        GM_TRY(jint(root, "eoi_token_id", &eoi, false, label, err));
        v->image_token_id = (int32_t)id, v->boi_id = (int32_t)boi, v->eoi_id = (int32_t)eoi;
        GM_TRY(gm_config_gemma4_image_budget(cfg, 280, err));
    }
    if (ac && cJSON_IsObject(ac)) {
        int64_t da = 1024, layers = 12, out = 1536;
        snprintf(where, sizeof where, "%s (audio_config)", label);
        GM_TRY(jint(ac, "hidden_size", &da, false, where, err));
        GM_TRY(jint(ac, "num_hidden_layers", &layers, false, where, err));
        GM_TRY(jint(ac, "output_proj_dims", &out, false, where, err));
        if (da < 8 || da > 65536 || layers < 1 || layers > GM_MAX_LAYERS || out < 1 || out > 65536)
            return gm_error_set(err, GM_ERR_INVALID, "%s: hidden_size %lld, num_hidden_layers %lld, output_proj_dims %lld: "
                                "out of range", where, (long long)da, (long long)layers, (long long)out);
        gemma4_audio(cfg, da, layers, out);
        gm_audio_config *a = &cfg->audio;
        GM_TRY(tower_int(ac, "num_attention_heads", 1, 1024, &a->n_heads, where, err));
        GM_TRY(tower_int(ac, "attention_chunk_size", 1, 4096, &a->chunk, where, err));
        GM_TRY(tower_int(ac, "attention_context_left", 2, 4096, &a->context_left, where, err)); /* the frame itself and more */
        GM_TRY(tower_int(ac, "attention_context_right", 0, 4096, &a->context_right, where, err));
        GM_TRY(tower_int(ac, "conv_kernel_size", 1, 1024, &a->conv_kernel, where, err));
        GM_TRY(jfloat(ac, "attention_logit_cap", &a->logit_cap, where, err));
        GM_TRY(jfloat(ac, "residual_weight", &a->residual_weight, where, err));
        GM_TRY(jfloat(ac, "gradient_clipping", &a->clip, where, err));
        GM_TRY(jfloat(ac, "rms_norm_eps", &a->rms_eps, where, err));
        a->group_norm_eps = a->rms_eps;
        const cJSON *cl = jget(ac, "use_clipped_linears"), *act = jget(ac, "hidden_act");
        GM_TRY(conv_channels(ac, "subsampling_conv_channels", a->sscp_channels, where, "Gemma 4", err));
        /* input_proj_linear takes (channels[0] / 4) x channels[1] inputs: the 128 mel bins quartered by
         * the two stride-2 convolutions only when channels[0] is 128 too */
        if (a->sscp_channels[0] / 4 != a->n_mels / 4)
            return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: subsampling_conv_channels[0] = %lld: Gemma4AudioSubSample"
                                "ConvProjection sizes its projection by it as if it were the %lld mel bins; only %lld works",
                                where, (long long)a->sscp_channels[0], (long long)a->n_mels, (long long)a->n_mels);
        if (cl) a->clipped = cJSON_IsTrue(cl);
        if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu") != 0))
            return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: hidden_act must be silu (Gemma4AudioConfig's, every published "
                                "Gemma 4)", where);
        if (!(a->logit_cap > 0) || !(a->clip > 0) || !(a->rms_eps > 0) || da % a->n_heads != 0 || da / a->n_heads < 2)
            return gm_error_set(err, GM_ERR_FORMAT, "%s: attention_logit_cap, gradient_clipping and rms_norm_eps must be "
                                "positive, num_attention_heads must divide hidden_size into heads of 2 or more", where);
        int64_t tok = a->audio_token_id, boa = a->boa_id, eoa = a->eoa_id;
        GM_TRY(tower_int(root, "audio_token_id", 0, INT32_MAX, &tok, label, err));
        GM_TRY(tower_int(root, "boa_token_id", 0, INT32_MAX, &boa, label, err));
        GM_TRY(tower_int(root, "eoa_token_index", 0, INT32_MAX, &eoa, label, err));
        a->audio_token_id = (int32_t)tok, a->boa_id = (int32_t)boa, a->eoa_id = (int32_t)eoa;
    }
    return GM_OK;
}

/* An integer of a tower's config (or the top level) in lo..hi, or GM_ERR_FORMAT naming it. */
static gm_status tower_int(const cJSON *ac, const char *key, int64_t lo, int64_t hi, int64_t *dst, const char *label,
                           gm_error *err) {
    int64_t v = *dst;
    GM_TRY(jint(ac, key, &v, false, label, err));
    if (v < lo || v > hi)
        return gm_error_set(err, GM_ERR_FORMAT, "%s: %s = %lld is outside %lld..%lld", label, key, (long long)v,
                            (long long)lo, (long long)hi);
    *dst = v;
    return GM_OK;
}

/* The audio sub-sampling's two channel counts (audio_config[key]: two integers in 1..65536), when
 * stated; GM_ERR_FORMAT names the key (label: where, model: whose default [128, 32]). */
static gm_status conv_channels(const cJSON *ac, const char *key, int64_t dst[2], const char *label, const char *model,
                               gm_error *err) {
    const cJSON *ch = jget(ac, key);
    if (!ch) return GM_OK;
    bool ok = cJSON_IsArray(ch) && cJSON_GetArraySize(ch) == 2;
    int64_t v[2] = {0, 0};
    for (int i = 0; ok && i < 2; i++) {
        const cJSON *x = cJSON_GetArrayItem(ch, i);
        ok = cJSON_IsNumber(x) && x->valuedouble >= 1 && x->valuedouble <= 65536 && x->valuedouble == floor(x->valuedouble);
        if (ok) v[i] = (int64_t)x->valuedouble;
    }
    if (!ok)
        return gm_error_set(err, GM_ERR_FORMAT, "%s: %s must be two integers in 1..65536 (%s: [128, 32])", label, key, model);
    dst[0] = v[0], dst[1] = v[1];
    return GM_OK;
}

/* A pair of 2-integer lists ([[a, b], [c, d]]) of audio_config, each in 1..64. */
static gm_status audio_pairs(const cJSON *ac, const char *key, int64_t dst[2][2], const char *label, gm_error *err) {
    const cJSON *it = jget(ac, key);
    if (!it) return GM_OK;
    bool ok = cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2;
    for (int i = 0; ok && i < 2; i++) {
        const cJSON *p = cJSON_GetArrayItem(it, i);
        ok = cJSON_IsArray(p) && cJSON_GetArraySize(p) == 2;
        for (int j = 0; ok && j < 2; j++) {
            const cJSON *x = cJSON_GetArrayItem(p, j);
            ok = cJSON_IsNumber(x) && x->valuedouble >= 1 && x->valuedouble <= 64 && x->valuedouble == floor(x->valuedouble);
            if (ok) dst[i][j] = (int64_t)x->valuedouble;
        }
    }
    if (!ok)
        return gm_error_set(err, GM_ERR_FORMAT, "%s: audio_config.%s must be two [time, frequency] pairs of integers in 1..64 "
                            "(Gemma 3n: [[3, 3], [3, 3]])", label, key);
    return GM_OK;
}

/* A Gemma3nForConditionalGeneration config.json's towers: the published sizes (set_towers) for
 * planning, the audio encoder's shape and token ids from audio_config and the top level when
 * stated (checked for range: GM_ERR_FORMAT names the key); a tower whose config is absent is left
 * out. */
static gm_status gemma3n_towers_json(const cJSON *root, const char *label, gm_config *cfg, gm_error *err) {
    set_towers(cfg, TOWERS_3N);
    const char *keys[3] = {"image_token_id", "boi_token_id", "eoi_token_id"};
    int32_t *dst[3] = {&cfg->vision.image_token_id, &cfg->vision.boi_id, &cfg->vision.eoi_id};
    for (int i = 0; i < 3; i++) {
        const cJSON *t = jget(root, keys[i]);
        if (t && cJSON_IsNumber(t) && t->valuedouble >= 0 && t->valuedouble < 2147483647.0) *dst[i] = (int32_t)t->valuedouble;
    }
    const cJSON *ac = jget(root, "audio_config");
    if (!ac) {
        memset(&cfg->audio, 0, sizeof cfg->audio);
    } else {
        gm_audio_config *a = &cfg->audio;
        char awhere[300];
        snprintf(awhere, sizeof awhere, "%s (audio_config)", label);
        GM_TRY(tower_int(ac, "hidden_size", 1, 65536, &a->hidden_size, awhere, err));
        GM_TRY(tower_int(ac, "conf_num_hidden_layers", 1, 1024, &a->n_layers, awhere, err));
        GM_TRY(tower_int(ac, "input_feat_size", 1, 4096, &a->n_mels, awhere, err));
        GM_TRY(tower_int(ac, "conf_num_attention_heads", 1, 1024, &a->n_heads, awhere, err));
        GM_TRY(tower_int(ac, "conf_attention_chunk_size", 1, 4096, &a->chunk, awhere, err));
        GM_TRY(tower_int(ac, "conf_attention_context_left", 0, 4096, &a->context_left, awhere, err));
        GM_TRY(tower_int(ac, "conf_attention_context_right", 0, 4096, &a->context_right, awhere, err));
        GM_TRY(tower_int(ac, "conf_conv_kernel_size", 1, 1024, &a->conv_kernel, awhere, err));
        GM_TRY(tower_int(ac, "conf_reduction_factor", 1, 1024, &a->reduction, awhere, err));
        GM_TRY(tower_int(ac, "vocab_size", 1, 1 << 20, &a->vocab_size, awhere, err));
        GM_TRY(tower_int(ac, "vocab_offset", 0, INT32_MAX, &a->vocab_offset, awhere, err));
        GM_TRY(jfloat(ac, "conf_attention_logit_cap", &a->logit_cap, awhere, err));
        GM_TRY(jfloat(ac, "conf_residual_weight", &a->residual_weight, awhere, err));
        GM_TRY(jfloat(ac, "gradient_clipping", &a->clip, awhere, err));
        GM_TRY(jfloat(ac, "rms_norm_eps", &a->rms_eps, awhere, err));
        GM_TRY(jfloat(ac, "sscp_conv_group_norm_eps", &a->group_norm_eps, awhere, err));
        GM_TRY(audio_pairs(ac, "sscp_conv_kernel_size", a->sscp_kernel, label, err));
        GM_TRY(audio_pairs(ac, "sscp_conv_stride_size", a->sscp_stride, label, err));
        GM_TRY(conv_channels(ac, "sscp_conv_channel_size", a->sscp_channels, awhere, "Gemma 3n", err));
        if (!(a->logit_cap > 0) || !(a->clip > 0) || !(a->rms_eps > 0) || !(a->group_norm_eps > 0))
            return gm_error_set(err, GM_ERR_FORMAT, "%s: audio_config's conf_attention_logit_cap, gradient_clipping, "
                                "rms_norm_eps and sscp_conv_group_norm_eps must be positive", label);
        int64_t soft = a->soft_tokens, tok = a->audio_token_id, boa = a->boa_id, eoa = a->eoa_id;
        GM_TRY(tower_int(root, "audio_soft_tokens_per_image", 1, 65536, &soft, label, err));
        GM_TRY(tower_int(root, "audio_token_id", 0, INT32_MAX, &tok, label, err));
        GM_TRY(tower_int(root, "boa_token_id", 0, INT32_MAX, &boa, label, err));
        GM_TRY(tower_int(root, "eoa_token_id", 0, INT32_MAX, &eoa, label, err));
        a->soft_tokens = soft, a->audio_token_id = (int32_t)tok, a->boa_id = (int32_t)boa, a->eoa_id = (int32_t)eoa;
        int64_t da = a->hidden_size, D = cfg->hidden_size;
        a->params = conformer_params(da, a->n_layers, 192) + 128 * da + 2 * da + da * D;
    }
    const cJSON *vc = jget(root, "vision_config");
    if (!vc) {
        memset(&cfg->vision, 0, sizeof cfg->vision);
    } else {
        gm_vision_config *v = &cfg->vision;
        char where[300];
        snprintf(where, sizeof where, "%s (vision_config)", label);
        GM_TRY(tower_int(vc, "hidden_size", 1, 65536, &v->hidden_size, where, err));
        GM_TRY(tower_int(vc, "vocab_size", 1, 1 << 20, &v->hard_vocab, where, err));
        GM_TRY(tower_int(vc, "vocab_offset", 0, INT32_MAX, &v->hard_offset, where, err));
        GM_TRY(jfloat(vc, "rms_norm_eps", &v->layer_norm_eps, where, err));
    }
    return GM_OK;
}

static void preset_ext_fill(const preset_ext *p, gm_config *c) {
    defaults_gemma3(c);
    c->arch = p->arch;
    snprintf(c->name, sizeof c->name, "%s", p->name);
    c->hidden_size = p->C;
    c->n_layers = p->L;
    c->n_heads = p->H;
    c->n_kv_heads = p->KVH;
    c->head_dim = p->D;
    c->intermediate_size = p->F;
    c->sliding_window = p->W;
    c->vocab_size = p->V;
    c->max_position_embeddings = p->maxpos;
    c->query_pre_attn_scalar = 1.0f; /* attention scaling 1.0: no 1/sqrt(d) (§3.2, §4.2) */
    c->final_logit_softcap = 30.0f;
    c->norm_convention = GM_NORM_DIRECT; /* RMSNorm multiplies by the stored weight (§3.2, §4.2) */
    c->ple_dim = p->ple_dim;
    c->ple_vocab = p->ple_dim ? 262144 : 0;
    c->altup_inputs = p->altup;
    c->laurel_rank = p->laurel;
    c->head_dim_full = p->D_full;
    c->n_kv_heads_full = p->KVH_full;
    c->k_eq_v_full = p->k_eq_v;
    c->n_experts = p->experts;
    c->experts_top_k = p->top_k;
    c->expert_ffn = p->expert_ffn;
    int64_t first_shared = p->L - p->kv_shared;
    for (int64_t i = 0; i < p->L; i++) {
        bool full = (i + 1) % p->pattern == 0;
        c->layer_type[i] = full ? GM_LAYER_FULL : GM_LAYER_SLIDING;
        /* local 10k; global 1M (Gemma 4's "proportional" RoPE on 1/4 of the pairs, §4.3, is a
         * frequency mask, not a position scale) */
        c->rope_theta[i] = full ? 1e6f : 1e4f;
        c->rope_pos_scale[i] = 1.0f;
        c->rope_partial[i] = full && p->arch == GM_ARCH_GEMMA4 ? 0.25f : 0.0f;
        c->ffn_dim[i] = (i >= first_shared && p->wide_shared_ffn) ? p->wide_shared_ffn : p->F;
        /* Gemma 3n: gaussian top-k at 0.95 on the first 10 layers (§3.1) */
        c->act_sparsity[i] = p->arch == GM_ARCH_GEMMA3N && i < 10 ? 0.95f : 0.0f;
    }
    gm_error ignored = {0}; /* the table's sharing is valid by construction (test_config) */
    (void)gm_config_kv_sharing(c, p->kv_shared, p->name, &ignored);
    set_towers(c, p->tower);
}

gm_status gm_config_preset(const char *name, gm_config *cfg, gm_error *err) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        const preset *p = &presets[i];
        if (strcmp(p->name, name) != 0) continue;
        defaults_gemma3(cfg);
        snprintf(cfg->name, sizeof cfg->name, "%s", p->name);
        cfg->hidden_size = p->C;
        cfg->n_layers = p->L;
        cfg->n_heads = p->H;
        cfg->n_kv_heads = p->KVH;
        cfg->head_dim = p->D;
        cfg->intermediate_size = p->F;
        cfg->sliding_window = p->W;
        cfg->vocab_size = p->V;
        cfg->max_position_embeddings = p->maxpos;
        cfg->query_pre_attn_scalar = p->qscalar;
        cfg->norm_convention = GM_NORM_ONE_PLUS_W;
        gm_config_gemma3_layers(cfg, 6, 1e4f, 1e6f, p->global_scale);
        if (p->siglip) gemma3_siglip(cfg);
        return GM_OK;
    }
    for (size_t i = 0; i < sizeof presets_ext / sizeof presets_ext[0]; i++) {
        if (strcmp(presets_ext[i].name, name) != 0) continue;
        preset_ext_fill(&presets_ext[i], cfg);
        return GM_OK;
    }
    char known[512] = "";
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        strncat(known, i ? ", " : "", sizeof known - strlen(known) - 1);
        strncat(known, presets[i].name, sizeof known - strlen(known) - 1);
    }
    for (size_t i = 0; i < sizeof presets_ext / sizeof presets_ext[0]; i++) {
        strncat(known, ", ", sizeof known - strlen(known) - 1);
        strncat(known, presets_ext[i].name, sizeof known - strlen(known) - 1);
    }
    return gm_error_set(err, GM_ERR_NOT_FOUND, "unknown model name '%s' (known: %s)", name, known);
}

int64_t gm_config_rope_pairs(const gm_config *c, int64_t l) {
    int64_t D = (c->layer_type[l] == GM_LAYER_FULL && c->head_dim_full > 0) ? c->head_dim_full : c->head_dim;
    if (!(c->rope_partial[l] > 0.0f)) return D / 2;
    int64_t n = (int64_t)floor((double)c->rope_partial[l] * (double)D / 2.0);
    return n < D / 2 ? n : D / 2;
}

/* Per-layer attention geometry: Gemma 4 full layers have their own head width and KV heads
 * (§4.1-4.2); 0 in those fields means "as the sliding layers". */
static int64_t layer_head_dim(const gm_config *c, int64_t l) {
    return (c->layer_type[l] == GM_LAYER_FULL && c->head_dim_full > 0) ? c->head_dim_full : c->head_dim;
}
static int64_t layer_kv_heads(const gm_config *c, int64_t l) {
    return (c->layer_type[l] == GM_LAYER_FULL && c->n_kv_heads_full > 0) ? c->n_kv_heads_full : c->n_kv_heads;
}

/* Parameters as the checkpoint stores them. Gemma 3: embedding (counted once: tied head), per layer
 * q/k/v/o, q/k norms, four block norms, gate/up/down; final norm. Gemma 3n / 4 add (§3.3-3.6,
 * §4.2-4.4): the per-layer-embedding table (ple_vocab x L*ple_dim) and its projection
 * (L*ple_dim x C + norm), per layer the PLE gate/projection/norm; AltUp's 3+3 stream projections
 * and per layer its router (norm + altup x C), prediction (altup -> altup^2) and correction
 * (altup -> altup) coefficients and output scale; LAuReL's two rank-r linears and norm; Gemma 4's
 * layer scalar; MoE experts (3 C x expert_ffn each), router (n_experts x C, scale C, per-expert
 * scale) and its three extra norms; the towers (vision_params, audio_params). KV-shared layers:
 * Gemma 3n checkpoints keep their (unused) k/v projections (§3.5), Gemma 4 has none (§4.4); k_eq_v
 * full layers have no v_proj (§4.2). */
int64_t gm_config_n_params(const gm_config *c) {
    int64_t C = c->hidden_size, L = c->n_layers;
    int64_t n = c->vocab_size * C + C; /* embedding + final norm */
    for (int64_t l = 0; l < L; l++) {
        int64_t hd = layer_head_dim(c, l), q = c->n_heads * hd, kv = layer_kv_heads(c, l) * hd;
        bool shared = c->kv_source[l] != l;
        bool has_k = !(shared && c->arch == GM_ARCH_GEMMA4);
        bool has_v = has_k && !(c->k_eq_v_full && c->layer_type[l] == GM_LAYER_FULL);
        n += C * q + q * C + hd + 4 * C;            /* q, o, q_norm, four block norms */
        if (has_k) n += C * kv + hd;                 /* k, k_norm */
        if (has_v) n += C * kv;                      /* v (v_norm has no weight) */
        n += 3 * C * c->ffn_dim[l];                  /* gate, up, down (MoE: the dense branch) */
        if (c->n_experts > 0)
            n += c->n_experts * 3 * C * c->expert_ffn + c->n_experts * C + C + c->n_experts + 3 * C;
        if (c->laurel_rank > 0) n += 2 * c->laurel_rank * C + C;
        if (c->altup_inputs > 1) {
            int64_t a = c->altup_inputs;
            n += C + a * C + a * a * a + a * a + C;
        }
        if (c->ple_dim > 0) n += 2 * c->ple_dim * C + C;
        if (c->arch == GM_ARCH_GEMMA4) n += 1;      /* layer_scalar */
    }
    if (c->ple_dim > 0) n += c->ple_vocab * L * c->ple_dim + L * c->ple_dim * C + c->ple_dim;
    if (c->altup_inputs > 1) n += 2 * (c->altup_inputs - 1) * C * C;
    if (!c->tie_word_embeddings) n += c->vocab_size * C;
    return n + c->vision.params + c->audio.params;
}

/* The first layer of type t, or -1. */
static int first_layer(const gm_config *c, gm_layer_type t) {
    for (int64_t i = 0; i < c->n_layers; i++)
        if (c->layer_type[i] == t) return (int)i;
    return -1;
}

static void add_rope(cJSON *o, float theta, float pos_scale) {
    bool linear = pos_scale != 1.0f;
    cJSON_AddStringToObject(o, "rope_type", linear ? "linear" : "default");
    if (linear) cJSON_AddNumberToObject(o, "factor", gm_f32_shortest(1.0f / pos_scale));
    cJSON_AddNumberToObject(o, "rope_theta", gm_f32_shortest(theta));
}

gm_status gm_config_to_json(const gm_config *c, const char *dtype, char **out, gm_error *err) {
    *out = NULL;
    if (c->arch != GM_ARCH_GEMMA3)
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "writing a config.json for %s models is not implemented yet (Gemma 3 is)",
                            gm_arch_name(c->arch));
    int full = first_layer(c, GM_LAYER_FULL), slide = first_layer(c, GM_LAYER_SLIDING);
    const gm_vision_config *v = &c->vision;
    const bool mm = v->hidden_size > 0;
    cJSON *j = cJSON_CreateObject(), *a, *root = j;
    if (!j) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    if (mm) {
        /* Gemma3Config (transformers' configuration_gemma3.py): the decoder as text_config, the
         * tower as vision_config (SiglipVisionConfig without its pooling head) */
        a = cJSON_AddArrayToObject(root, "architectures");
        cJSON_AddItemToArray(a, cJSON_CreateString("Gemma3ForConditionalGeneration"));
        cJSON_AddNumberToObject(root, "boi_token_index", v->boi_id);
        cJSON_AddStringToObject(root, "dtype", dtype);
        cJSON_AddNumberToObject(root, "eoi_token_index", v->eoi_id);
        cJSON_AddNumberToObject(root, "image_token_index", v->image_token_id);
        cJSON_AddNumberToObject(root, "initializer_range", 0.02);
        cJSON_AddNumberToObject(root, "mm_tokens_per_image", (double)v->tokens);
        cJSON_AddStringToObject(root, "model_type", "gemma3");
        cJSON_AddBoolToObject(root, "tie_word_embeddings", c->tie_word_embeddings);
        cJSON *vc = cJSON_AddObjectToObject(root, "vision_config");
        cJSON_AddNumberToObject(vc, "attention_dropout", 0);
        cJSON_AddStringToObject(vc, "hidden_act", "gelu_pytorch_tanh");
        cJSON_AddNumberToObject(vc, "hidden_size", (double)v->hidden_size);
        cJSON_AddNumberToObject(vc, "image_size", (double)v->image_size);
        cJSON_AddNumberToObject(vc, "intermediate_size", (double)v->intermediate_size);
        cJSON_AddNumberToObject(vc, "layer_norm_eps", gm_f32_shortest(v->layer_norm_eps));
        cJSON_AddStringToObject(vc, "model_type", "siglip_vision_model");
        cJSON_AddNumberToObject(vc, "num_attention_heads", (double)v->n_heads);
        cJSON_AddNumberToObject(vc, "num_channels", 3);
        cJSON_AddNumberToObject(vc, "num_hidden_layers", (double)v->n_layers);
        cJSON_AddNumberToObject(vc, "patch_size", (double)v->patch_size);
        cJSON_AddBoolToObject(vc, "vision_use_head", false);
        j = cJSON_AddObjectToObject(root, "text_config");
    } else {
        a = cJSON_AddArrayToObject(j, "architectures");
        cJSON_AddItemToArray(a, cJSON_CreateString("Gemma3ForCausalLM"));
    }
    cJSON_AddBoolToObject(j, "attention_bias", false);
    cJSON_AddNumberToObject(j, "attention_dropout", 0);
    if (c->attn_logit_softcap > 0) cJSON_AddNumberToObject(j, "attn_logit_softcapping", gm_f32_shortest(c->attn_logit_softcap));
    else cJSON_AddNullToObject(j, "attn_logit_softcapping");
    if (c->bos_id >= 0) cJSON_AddNumberToObject(j, "bos_token_id", c->bos_id);
    cJSON_AddStringToObject(j, "dtype", dtype);
    if (c->eos_id >= 0) cJSON_AddNumberToObject(j, "eos_token_id", c->eos_id);
    if (c->final_logit_softcap > 0) cJSON_AddNumberToObject(j, "final_logit_softcapping", gm_f32_shortest(c->final_logit_softcap));
    else cJSON_AddNullToObject(j, "final_logit_softcapping");
    cJSON_AddNumberToObject(j, "head_dim", (double)c->head_dim);
    cJSON_AddStringToObject(j, "hidden_activation", "gelu_pytorch_tanh");
    cJSON_AddNumberToObject(j, "hidden_size", (double)c->hidden_size);
    cJSON_AddNumberToObject(j, "initializer_range", 0.02);
    cJSON_AddNumberToObject(j, "intermediate_size", (double)c->intermediate_size);
    a = cJSON_AddArrayToObject(j, "layer_types");
    for (int64_t i = 0; i < c->n_layers; i++)
        cJSON_AddItemToArray(a, cJSON_CreateString(c->layer_type[i] == GM_LAYER_FULL ? "full_attention" : "sliding_attention"));
    cJSON_AddNumberToObject(j, "max_position_embeddings", (double)c->max_position_embeddings);
    cJSON_AddStringToObject(j, "model_type", "gemma3_text");
    cJSON_AddNumberToObject(j, "num_attention_heads", (double)c->n_heads);
    cJSON_AddNumberToObject(j, "num_hidden_layers", (double)c->n_layers);
    cJSON_AddNumberToObject(j, "num_key_value_heads", (double)c->n_kv_heads);
    if (c->pad_id >= 0) cJSON_AddNumberToObject(j, "pad_token_id", c->pad_id);
    cJSON_AddNumberToObject(j, "query_pre_attn_scalar", gm_f32_shortest(c->query_pre_attn_scalar));
    cJSON_AddNumberToObject(j, "rms_norm_eps", gm_f32_shortest(c->rms_norm_eps));
    /* transformers >= 5 reads rope_parameters; older versions rope_theta, rope_local_base_freq and
     * rope_scaling, which 5 folds into the same dict (configuration_gemma3.py
     * convert_rope_params_to_dict): both are written and agree */
    cJSON *rp = cJSON_AddObjectToObject(j, "rope_parameters");
    if (full >= 0) add_rope(cJSON_AddObjectToObject(rp, "full_attention"), c->rope_theta[full], c->rope_pos_scale[full]);
    if (slide >= 0) add_rope(cJSON_AddObjectToObject(rp, "sliding_attention"), c->rope_theta[slide], c->rope_pos_scale[slide]);
    if (slide >= 0) cJSON_AddNumberToObject(j, "rope_local_base_freq", gm_f32_shortest(c->rope_theta[slide]));
    if (full >= 0 && c->rope_pos_scale[full] != 1.0f) {
        cJSON *rs = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddNumberToObject(rs, "factor", gm_f32_shortest(1.0f / c->rope_pos_scale[full]));
        cJSON_AddStringToObject(rs, "rope_type", "linear");
    } else {
        cJSON_AddNullToObject(j, "rope_scaling");
    }
    if (full >= 0) cJSON_AddNumberToObject(j, "rope_theta", gm_f32_shortest(c->rope_theta[full]));
    cJSON_AddNumberToObject(j, "sliding_window", (double)c->sliding_window);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tie_word_embeddings);
    cJSON_AddBoolToObject(j, "use_bidirectional_attention", false);
    cJSON_AddBoolToObject(j, "use_cache", true);
    cJSON_AddNumberToObject(j, "vocab_size", (double)c->vocab_size);
    *out = cJSON_Print(root);
    cJSON_Delete(root);
    return *out ? GM_OK : gm_error_set(err, GM_ERR_NOMEM, "out of memory");
}

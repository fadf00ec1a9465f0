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
#include <string.h>

const char *gm_arch_name(gm_arch a) {
    switch (a) {
    case GM_ARCH_GEMMA3: return "gemma3";
    case GM_ARCH_GEMMA3N: return "gemma3n";
    case GM_ARCH_GEMMA4: return "gemma4";
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
static gm_status parse_rope(const cJSON *o, float *theta, float *pos_scale, const char *label,
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
        } else if (strcmp(type->valuestring, "default") != 0) {
            return gm_error_set(err, GM_ERR_UNSUPPORTED,
                                "%s: %s.rope_type '%s' is not supported (default and linear are)",
                                label, where, type->valuestring);
        }
    }
    return GM_OK;
}

static gm_status config_from_text_json(const cJSON *root, const char *label, gm_config *cfg,
                                       gm_error *err) {
    defaults_gemma3(cfg);
    const cJSON *mt = jget(root, "model_type");
    if (mt && cJSON_IsString(mt)) {
        const char *m = mt->valuestring;
        if (strcmp(m, "gemma3_text") != 0 && strcmp(m, "gemma3") != 0)
            return gm_error_set(err, GM_ERR_UNSUPPORTED,
                                "%s: model_type '%s' is not supported (gemmarun runs Gemma 3 text decoders: "
                                "model_type gemma3_text, or gemma3 with a text_config)",
                                label, m);
        snprintf(cfg->name, sizeof cfg->name, "%s", m);
    } else {
        snprintf(cfg->name, sizeof cfg->name, "gemma3_text");
    }
    GM_TRY(jint(root, "vocab_size", &cfg->vocab_size, true, label, err));
    GM_TRY(jint(root, "hidden_size", &cfg->hidden_size, true, label, err));
    GM_TRY(jint(root, "num_hidden_layers", &cfg->n_layers, true, label, err));
    GM_TRY(jint(root, "num_attention_heads", &cfg->n_heads, true, label, err));
    GM_TRY(jint(root, "num_key_value_heads", &cfg->n_kv_heads, true, label, err));
    GM_TRY(jint(root, "head_dim", &cfg->head_dim, true, label, err));
    GM_TRY(jint(root, "intermediate_size", &cfg->intermediate_size, true, label, err));
    GM_TRY(jint(root, "sliding_window", &cfg->sliding_window, false, label, err));
    GM_TRY(jint(root, "max_position_embeddings", &cfg->max_position_embeddings, false, label, err));
    GM_TRY(jfloat(root, "rms_norm_eps", &cfg->rms_norm_eps, label, err));
    GM_TRY(jfloat(root, "query_pre_attn_scalar", &cfg->query_pre_attn_scalar, label, err));
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
    cfg->norm_convention = GM_NORM_ONE_PLUS_W;
    if (cfg->n_layers <= 0 || cfg->n_layers > GM_MAX_LAYERS)
        return gm_error_set(err, GM_ERR_INVALID, "%s: num_hidden_layers = %lld is outside 1..%d",
                            label, (long long)cfg->n_layers, GM_MAX_LAYERS);

    /* Old field names: rope_theta (global), rope_local_base_freq, rope_scaling (global only),
     * sliding_window_pattern. New: layer_types + rope_parameters per layer type. Both are read;
     * the new ones win where present (gemma_architecture.md §0 caveat). */
    float theta_global = 1e6f, theta_local = 1e4f, scale_global = 1.0f, scale_local = 1.0f;
    GM_TRY(jfloat(root, "rope_theta", &theta_global, label, err));
    GM_TRY(jfloat(root, "rope_local_base_freq", &theta_local, label, err));
    GM_TRY(parse_rope(jget(root, "rope_scaling"), NULL, &scale_global, label, "rope_scaling", err));
    const cJSON *rp = jget(root, "rope_parameters");
    if (rp) {
        const cJSON *full = jget(rp, "full_attention"), *slide = jget(rp, "sliding_attention");
        if (full || slide) {
            GM_TRY(parse_rope(full, &theta_global, &scale_global, label, "rope_parameters.full_attention", err));
            GM_TRY(parse_rope(slide, &theta_local, &scale_local, label, "rope_parameters.sliding_attention", err));
        } else {
            GM_TRY(parse_rope(rp, &theta_global, &scale_global, label, "rope_parameters", err));
        }
    }
    int64_t pattern = 6;
    GM_TRY(jint(root, "sliding_window_pattern", &pattern, false, label, err));
    gm_config_gemma3_layers(cfg, (int)pattern, theta_local, theta_global, scale_global);
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
    for (int64_t i = 0; i < cfg->n_layers; i++) {
        bool full = cfg->layer_type[i] == GM_LAYER_FULL;
        cfg->rope_theta[i] = full ? theta_global : theta_local;
        cfg->rope_pos_scale[i] = full ? scale_global : scale_local;
    }
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
    }
    cJSON_Delete(root);
    return s;
}

gm_status gm_config_from_json_file(const char *path, gm_config *cfg, gm_error *err) {
    char *buf = NULL;
    GM_TRY(gm_read_file(path, &buf, NULL, err));
    gm_status s = gm_config_from_json(buf, path, cfg, err);
    gm_free(buf);
    return s;
}

/* ---- presets (gemma_architecture.md §1.1) ---------------------------------------------------- */

typedef struct preset {
    const char *name;
    int64_t C, L, H, KVH, D, F, W, V, maxpos;
    float qscalar, global_scale;
} preset;

static const preset presets[] = {
    {"gemma3-270m", 640, 18, 4, 1, 256, 2048, 512, 262144, 32768, 256, 1.0f},
    {"gemma3-1b", 1152, 26, 4, 1, 256, 6912, 512, 262144, 32768, 256, 1.0f},
    {"gemma3-4b", 2560, 34, 8, 4, 256, 10240, 1024, 262208, 131072, 256, 0.125f},
    {"gemma3-12b", 3840, 48, 16, 8, 256, 15360, 1024, 262208, 131072, 256, 0.125f},
    {"gemma3-27b", 5376, 62, 32, 16, 128, 21504, 1024, 262208, 131072, 168, 0.125f},
};

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
        return GM_OK;
    }
    char known[512] = "";
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        strncat(known, i ? ", " : "", sizeof known - strlen(known) - 1);
        strncat(known, presets[i].name, sizeof known - strlen(known) - 1);
    }
    return gm_error_set(err, GM_ERR_NOT_FOUND, "unknown model name '%s' (known: %s)", name, known);
}

int64_t gm_config_n_params(const gm_config *c) {
    int64_t n = c->vocab_size * c->hidden_size + c->hidden_size; /* embedding + final norm */
    for (int64_t l = 0; l < c->n_layers; l++) {
        int64_t q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
        n += c->hidden_size * (q + 2 * kv) + q * c->hidden_size; /* q, k, v, o */
        n += 2 * c->head_dim + 4 * c->hidden_size;              /* q/k norms, 4 block norms */
        n += 3 * c->hidden_size * c->ffn_dim[l];                 /* gate, up, down */
    }
    if (!c->tie_word_embeddings) n += c->vocab_size * c->hidden_size;
    return n;
}

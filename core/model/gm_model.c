/*
 * gm_model.c - loading a Gemma 3 text decoder from GGUF or Hugging Face safetensors.
 *
 * One table (weight_slots) lists every per-layer weight once: its field, its GGUF name, its
 * Hugging Face name and its expected shape. Both loaders walk the same table, so the two formats
 * cannot drift apart.
 */
#include "gm_model.h"

#include "gm_alloc.h"
#include "gm_gguf.h"
#include "gm_log.h"
#include "gm_mmap.h" // gm_mmap_release
#include "gm_safetensors.h"
#include "gm_tokenizer.h"
#include "kernels.h"

#include <math.h>

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *gm_linear_name(gm_linear w) {
    static const char *n[GM_LIN_COUNT] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                          "gate_proj", "up_proj", "down_proj"};
    return (unsigned)w < GM_LIN_COUNT ? n[w] : "?";
}

const gm_tensor *gm_layer_linear(const gm_layer_weights *lw, gm_linear w) {
    switch (w) {
    case GM_LIN_Q: return &lw->q;
    case GM_LIN_K: return &lw->k;
    case GM_LIN_V: return &lw->v;
    case GM_LIN_O: return &lw->o;
    case GM_LIN_GATE: return &lw->gate;
    case GM_LIN_UP: return &lw->up;
    case GM_LIN_DOWN: return &lw->down;
    default: return NULL;
    }
}

/* Shape of a weight in units of the config: each dim is one of these. */
typedef enum dimsym { DIM_C, DIM_QW, DIM_KVW, DIM_F, DIM_D, DIM_NONE } dimsym;

typedef struct weight_slot {
    size_t field;          /* offsetof in gm_layer_weights */
    const char *gguf;      /* GGUF name after "blk.N." */
    const char *hf;        /* Hugging Face name after "layers.N." */
    bool is_norm;
    dimsym rows, cols;     /* cols = DIM_NONE for 1-D norms */
} weight_slot;

static const weight_slot weight_slots[] = {
    {offsetof(gm_layer_weights, attn_norm), "attn_norm.weight", "input_layernorm.weight", true, DIM_C, DIM_NONE},
    {offsetof(gm_layer_weights, q), "attn_q.weight", "self_attn.q_proj.weight", false, DIM_QW, DIM_C},
    {offsetof(gm_layer_weights, k), "attn_k.weight", "self_attn.k_proj.weight", false, DIM_KVW, DIM_C},
    {offsetof(gm_layer_weights, v), "attn_v.weight", "self_attn.v_proj.weight", false, DIM_KVW, DIM_C},
    {offsetof(gm_layer_weights, o), "attn_output.weight", "self_attn.o_proj.weight", false, DIM_C, DIM_QW},
    {offsetof(gm_layer_weights, q_norm), "attn_q_norm.weight", "self_attn.q_norm.weight", true, DIM_D, DIM_NONE},
    {offsetof(gm_layer_weights, k_norm), "attn_k_norm.weight", "self_attn.k_norm.weight", true, DIM_D, DIM_NONE},
    {offsetof(gm_layer_weights, post_attn_norm), "post_attention_norm.weight", "post_attention_layernorm.weight", true, DIM_C, DIM_NONE},
    {offsetof(gm_layer_weights, ffn_norm), "ffn_norm.weight", "pre_feedforward_layernorm.weight", true, DIM_C, DIM_NONE},
    {offsetof(gm_layer_weights, gate), "ffn_gate.weight", "mlp.gate_proj.weight", false, DIM_F, DIM_C},
    {offsetof(gm_layer_weights, up), "ffn_up.weight", "mlp.up_proj.weight", false, DIM_F, DIM_C},
    {offsetof(gm_layer_weights, down), "ffn_down.weight", "mlp.down_proj.weight", false, DIM_C, DIM_F},
    {offsetof(gm_layer_weights, post_ffw_norm), "post_ffw_norm.weight", "post_feedforward_layernorm.weight", true, DIM_C, DIM_NONE},
};
#define N_SLOTS (sizeof weight_slots / sizeof weight_slots[0])

static int64_t dim_value(const gm_config *c, int64_t layer, dimsym s) {
    switch (s) {
    case DIM_C: return c->hidden_size;
    case DIM_QW: return c->n_heads * c->head_dim;
    case DIM_KVW: return c->n_kv_heads * c->head_dim;
    case DIM_F: return c->ffn_dim[layer];
    case DIM_D: return c->head_dim;
    default: return 0;
    }
}

/* A raw tensor found in a file, before it becomes a view. */
typedef struct raw_tensor {
    gm_dtype dtype;
    int ndim;
    int64_t shape[8];
    const void *data;
} raw_tensor;

/* Looks a tensor up by its file name in whichever container the model has. */
static bool find_raw(const gm_model *m, const char *name, raw_tensor *out) {
    if (m->gguf) {
        const gm_gguf_tensor *t = gm_gguf_find_tensor(m->gguf, name);
        if (!t) return false;
        out->dtype = t->dtype;
        out->ndim = t->ndim;
        for (int i = 0; i < t->ndim; i++) out->shape[i] = t->shape[i];
        out->data = t->data;
        return true;
    }
    const gm_st_tensor *t = gm_safetensors_find(m->st, name);
    if (!t) return false;
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    for (int i = 0; i < t->ndim && i < 8; i++) out->shape[i] = t->shape[i];
    out->data = t->data;
    return true;
}

static void shape_str(const int64_t *sh, int nd, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "[");
    for (int i = 0; i < nd && n > 0 && (size_t)n < cap; i++)
        n += snprintf(buf + n, cap - (size_t)n, i ? ", %lld" : "%lld", (long long)sh[i]);
    if (n > 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, "]");
}

/* Builds the view of one weight, checking its shape against the config. Norms are converted
 * into `norm_dst` (f32, effective scale) when it is not NULL (second arena pass). */
static gm_status bind_weight(gm_model *m, const char *file_name, const char *hf_name, bool is_norm,
                             int64_t rows, int64_t cols, gm_tensor *dst, float *norm_dst,
                             gm_error *err) {
    raw_tensor r;
    if (!find_raw(m, file_name, &r))
        return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: missing tensor '%s'", m->path, file_name);
    int want_nd = cols ? 2 : 1;
    int64_t want[2] = {rows, cols};
    bool ok = r.ndim == want_nd;
    for (int i = 0; ok && i < want_nd; i++) ok = r.shape[i] == want[i];
    if (!ok) {
        char got_s[96], want_s[96];
        shape_str(r.shape, r.ndim, got_s, sizeof got_s);
        shape_str(want, want_nd, want_s, sizeof want_s);
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: tensor '%s' has shape %s, but the config implies %s\n"
                            "  hint: the weights and the config (hidden_size, heads, head_dim, "
                            "intermediate_size) do not belong together",
                            m->path, file_name, got_s, want_s);
    }
    if (is_norm) {
        if (!gm_dtype_get(r.dtype)->is_float)
            return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: norm weight '%s' has dtype %s (a float type is expected)",
                                m->path, file_name, gm_dtype_name(r.dtype));
        *dst = gm_tensor_1d(GM_F32, rows, norm_dst);
        if (norm_dst) {
            gm_dequant_row(r.dtype, r.data, norm_dst, rows);
            /* Convert to f32 first, then add 1 (adding 1 in bf16 loses precision, §6 pitfall 3). */
            if (m->cfg.norm_convention == GM_NORM_ONE_PLUS_W)
                for (int64_t i = 0; i < rows; i++) norm_dst[i] += 1.0f;
        }
    } else {
        if (r.dtype != GM_F32 && r.dtype != GM_F16 && r.dtype != GM_BF16 && !gm_dtype_get(r.dtype)->is_quantized)
            return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: weight '%s' has dtype %s, which cannot be used as a matrix",
                                m->path, file_name, gm_dtype_name(r.dtype));
        *dst = gm_tensor_2d(r.dtype, rows, cols, (void *)r.data);
        m->mapped_bytes += gm_tensor_nbytes(dst);
    }
    gm_tensor_set_name(dst, hf_name);
    return GM_OK;
}

/* Walks every weight; pass 1 (arena measuring) sizes the norm arena, pass 2 fills it. */
static gm_status bind_all(gm_model *m, const char *hf_prefix, gm_error *err) {
    const gm_config *c = &m->cfg;
    char fname[256], hname[256];
    m->mapped_bytes = 0;
    bool gguf = m->gguf != NULL;

    /* embedding */
    snprintf(fname, sizeof fname, gguf ? "token_embd.weight" : "%sembed_tokens.weight", hf_prefix);
    GM_TRY(bind_weight(m, fname, "model.embed_tokens.weight", false, c->vocab_size, c->hidden_size,
                       &m->embed, NULL, err));
    float *buf = gm_arena_alloc(&m->arena, (size_t)c->hidden_size * sizeof(float), GM_MEM_WEIGHTS);
    snprintf(fname, sizeof fname, gguf ? "output_norm.weight" : "%snorm.weight", hf_prefix);
    GM_TRY(bind_weight(m, fname, "model.norm.weight", true, c->hidden_size, 0, &m->final_norm, buf, err));
    if (c->tie_word_embeddings) {
        m->lm_head = m->embed;
    } else {
        const char *lm = gguf ? "output.weight" : "lm_head.weight";
        GM_TRY(bind_weight(m, lm, "lm_head.weight", false, c->vocab_size, c->hidden_size, &m->lm_head, NULL, err));
    }
    for (int64_t l = 0; l < c->n_layers; l++) {
        for (size_t s = 0; s < N_SLOTS; s++) {
            const weight_slot *ws = &weight_slots[s];
            if (gguf) snprintf(fname, sizeof fname, "blk.%lld.%s", (long long)l, ws->gguf);
            else snprintf(fname, sizeof fname, "%slayers.%lld.%s", hf_prefix, (long long)l, ws->hf);
            snprintf(hname, sizeof hname, "model.layers.%lld.%s", (long long)l, ws->hf);
            int64_t rows = dim_value(c, l, ws->rows), cols = ws->is_norm ? 0 : dim_value(c, l, ws->cols);
            float *nb = NULL;
            if (ws->is_norm) nb = gm_arena_alloc(&m->arena, (size_t)rows * sizeof(float), GM_MEM_WEIGHTS);
            gm_tensor *dst = (gm_tensor *)((char *)&m->layers[l] + ws->field);
            GM_TRY(bind_weight(m, fname, hname, ws->is_norm, rows, cols, dst, nb, err));
        }
    }
    return GM_OK;
}

gm_wview gm_wview_of(const gm_tensor *t) {
    gm_wview w;
    memset(&w, 0, sizeof w);
    w.type = t->dtype;
    w.data = t->data;
    w.rows = t->ndim == 2 ? t->shape[0] : 1;
    w.cols = t->shape[t->ndim - 1];
    w.row_bytes = gm_dtype_row_bytes(t->dtype, t->ndim == 2 ? t->stride[0] : w.cols);
    return w;
}

static void build_views(gm_model *m) {
    gm_weights_view *v = m->views;
    v->embed = gm_wview_of(&m->embed);
    v->lm_head = gm_wview_of(&m->lm_head);
    for (int64_t l = 0; l < m->cfg.n_layers; l++)
        for (int w = 0; w < GM_LIN_COUNT; w++) v->lin[l][w] = gm_wview_of(gm_layer_linear(&m->layers[l], (gm_linear)w));
}

static bool is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool file_exists(const char *p) { return access(p, R_OK) == 0; }

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* A folder, a .safetensors file or a .json index is a Hugging Face checkpoint; any other file is
 * read as GGUF, so that a damaged GGUF gets the GGUF reader's precise message (bad magic,
 * truncation) rather than "no config.json". */
static bool is_hf_checkpoint(const char *p) {
    return is_dir(p) || ends_with(p, ".safetensors") || ends_with(p, ".json");
}

static void dirname_of(const char *path, char *out, size_t cap) {
    snprintf(out, cap, "%s", path);
    char *slash = strrchr(out, '/');
    if (slash) *slash = '\0';
    else snprintf(out, cap, ".");
}

static gm_status load_hf(gm_model *m, const char *path, const gm_model_opts *o, gm_error *err) {
    char dir[1024], cfgpath[1100];
    if (is_dir(path)) snprintf(dir, sizeof dir, "%s", path);
    else dirname_of(path, dir, sizeof dir);
    /* given config.json itself: the checkpoint is its folder */
    if (ends_with(path, "/config.json") || strcmp(path, "config.json") == 0) path = dir;
    snprintf(cfgpath, sizeof cfgpath, "%s/config.json", dir);
    if (access(cfgpath, F_OK) == 0 && access(cfgpath, R_OK) != 0)
        return gm_error_set(err, GM_ERR_IO, "%s: cannot read: %s", cfgpath, strerror(errno));
    if (!file_exists(cfgpath))
        return gm_error_set(err, GM_ERR_NOT_FOUND,
                            "%s: no config.json in %s\n  hint: a Hugging Face checkpoint folder holds "
                            "config.json beside model.safetensors",
                            path, dir);
    GM_TRY(gm_config_from_json_file(cfgpath, &m->cfg, err));
    GM_TRY(gm_safetensors_open(path, &m->st, err));
    m->format = GM_FORMAT_SAFETENSORS;
    /* Gemma3ForCausalLM uses "model."; multimodal checkpoints "language_model.model." (legacy)
     * or "model.language_model." (transformers >= 4.52), gemma_architecture.md §5.2. */
    static const char *prefixes[] = {"model.", "language_model.model.", "model.language_model."};
    const char *prefix = NULL;
    char probe[256];
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        snprintf(probe, sizeof probe, "%sembed_tokens.weight", prefixes[i]);
        if (gm_safetensors_find(m->st, probe)) {
            prefix = prefixes[i];
            break;
        }
    }
    if (!prefix)
        return gm_error_set(err, GM_ERR_NOT_FOUND,
                            "%s: no embedding tensor (looked for model.embed_tokens.weight and the "
                            "multimodal prefixes)",
                            path);
    gm_arena_init(&m->arena, "norm weights", GM_DEVICE_CPU);
    GM_TRY(bind_all(m, prefix, err));
    GM_TRY(gm_arena_commit(&m->arena, err));
    GM_TRY(bind_all(m, prefix, err));
    if (o->load_tokenizer) {
        char tj[1100], tc[1100];
        snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
        snprintf(tc, sizeof tc, "%s/tokenizer_config.json", dir);
        if (file_exists(tj)) GM_TRY(gm_tokenizer_from_hf_json(tj, file_exists(tc) ? tc : NULL, &m->tok, err));
    }
    return GM_OK;
}

static gm_status load_gguf(gm_model *m, const char *path, const gm_model_opts *o, gm_error *err) {
    GM_TRY(gm_gguf_open(path, &m->gguf, err));
    m->format = GM_FORMAT_GGUF;
    GM_TRY(gm_config_from_gguf(m->gguf, &m->cfg, err));
    /* every blk.N tensor must belong to a layer the metadata declares */
    for (int64_t i = 0; i < gm_gguf_n_tensors(m->gguf); i++) {
        const gm_gguf_tensor *t = gm_gguf_tensor_at(m->gguf, i);
        long long layer;
        if (sscanf(t->cname, "blk.%lld.", &layer) == 1 && (layer < 0 || layer >= m->cfg.n_layers))
            return gm_error_set(err, GM_ERR_FORMAT,
                                "%s: tensor '%s' belongs to layer %lld, but gemma3.block_count says the model has %lld layers",
                                path, t->cname, layer, (long long)m->cfg.n_layers);
    }
    gm_arena_init(&m->arena, "norm weights", GM_DEVICE_CPU);
    GM_TRY(bind_all(m, "", err));
    GM_TRY(gm_arena_commit(&m->arena, err));
    GM_TRY(bind_all(m, "", err));
    if (o->load_tokenizer) GM_TRY(gm_tokenizer_from_gguf(m->gguf, &m->tok, err));
    return GM_OK;
}

gm_status gm_model_load(const char *path, const gm_model_opts *opts, gm_model **out, gm_error *err) {
    *out = NULL;
    gm_model_opts o = {.load_tokenizer = true};
    if (opts) o = *opts;
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT)
            return gm_error_set(err, GM_ERR_IO,
                                "%s: no such file or folder\n  hint: give a .gguf file or a Hugging Face "
                                "checkpoint folder; `gemmarun fetch gemma3-270m` downloads the default model",
                                path);
        return gm_error_set(err, GM_ERR_IO, "%s: %s", path,
                            errno == ELOOP ? "too many levels of symbolic links (a link loop?)" : strerror(errno));
    }
    if (access(path, R_OK) != 0) return gm_error_set(err, GM_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
    gm_model *m = gm_calloc(1, sizeof *m);
    if (!m) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    snprintf(m->path, sizeof m->path, "%s", path);
    m->layers = gm_calloc(GM_MAX_LAYERS, sizeof *m->layers);
    m->views = gm_calloc(1, sizeof *m->views);
    if (!m->layers || !m->views) {
        gm_free(m->layers);
        gm_free(m->views);
        gm_free(m);
        return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    }
    gm_status s = is_hf_checkpoint(path) ? load_hf(m, path, &o, err) : load_gguf(m, path, &o, err);
    if (s != GM_OK) {
        gm_model_free(m);
        return s;
    }
    build_views(m);
    *out = m;
    return GM_OK;
}

void gm_model_free(gm_model *m) {
    if (!m) return;
    gm_tokenizer_free(m->tok);
    if (m->gguf) gm_gguf_free(m->gguf);
    if (m->st) gm_safetensors_free(m->st);
    gm_arena_free(&m->arena);
    gm_free(m->layers);
    gm_free(m->views);
    gm_free(m);
}

void gm_model_for_each_tensor(const gm_model *m, gm_model_tensor_fn fn, void *user) {
    fn(&m->embed, user);
    if (!m->cfg.tie_word_embeddings) fn(&m->lm_head, user);
    fn(&m->final_norm, user);
    for (int64_t l = 0; l < m->cfg.n_layers; l++)
        for (size_t s = 0; s < N_SLOTS; s++)
            fn((const gm_tensor *)((const char *)&m->layers[l] + weight_slots[s].field), user);
}

void gm_model_release_linear_pages(const gm_model *m) {
    for (int64_t l = 0; l < m->cfg.n_layers; l++)
        for (int w = 0; w < GM_LIN_COUNT; w++) {
            const gm_tensor *t = gm_layer_linear(&m->layers[l], (gm_linear)w);
            gm_mmap_release(t->data, gm_tensor_nbytes(t));
        }
}

float gm_model_embed_scale(const gm_model *m) { return sqrtf((float)m->cfg.hidden_size); }

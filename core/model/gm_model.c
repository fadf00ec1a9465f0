/*
 * gm_model.c - loading a Gemma text decoder from GGUF or Hugging Face safetensors.
 *
 * The architecture's spec (core/arch/gm_arch.h) lists every weight once: its GGUF name, its
 * Hugging Face name, its shape in config dimensions and whether the layer has it. Both loaders
 * walk that table, so the two formats - and the trainer, the quantizer and the planner, which
 * read the same table - cannot drift apart.
 */
#include "gm_model.h"

#include "gm_alloc.h"
#include "gm_fetch.h" // gm_sha256_file
#include "gm_gguf.h"
#include "gm_log.h"
#include "gm_mmap.h" // gm_mmap_release
#include "gm_safetensors.h"
#include "gm_tokenizer.h"

#include "kernels.h"

#include <math.h>
#include <openssl/evp.h>

#include <stdlib.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* Builds the view of one weight, checking its shape against the config. Norms and vectors are
 * converted into `f32_dst` (f32; a norm as its effective scale), and a transposed linear is
 * copied into it as (rows, cols), when it is not NULL (second arena pass). A convolution stored
 * with more dimensions (SigLIP's patch embedding [C, 3, p, p]) is viewed as (rows, the rest), a stack
 * of matrices [E, out, in] as (E out, in). */
static gm_status bind_weight(gm_model *m, const char *file_name, const char *hf_name, gm_wkind kind, bool transposed,
                             int64_t rows, int64_t cols, gm_tensor *dst, float *f32_dst, gm_error *err) {
    raw_tensor r;
    if (!find_raw(m, file_name, &r))
        return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: missing tensor '%s'", m->path, file_name);
    int want_nd = cols ? 2 : 1;
    int64_t want[2] = {transposed ? cols : rows, transposed ? rows : cols};
    bool ok = r.ndim == want_nd;
    for (int i = 0; ok && i < want_nd; i++) ok = r.shape[i] == want[i];
    if (!ok && want_nd == 2 && r.ndim > 2 && r.shape[0] == want[0]) { /* a convolution's kernel */
        int64_t inner = 1;
        for (int i = 1; i < r.ndim; i++) inner *= r.shape[i];
        ok = inner == want[1];
    }
    if (!ok && want_nd == 2 && r.ndim == 3 && r.shape[0] * r.shape[1] == want[0] && r.shape[2] == want[1])
        ok = true; /* a stack of matrices [E, out, in] (Gemma 4's experts, its vision position table) as (E out, in) */
    if (!ok && want_nd == 1 && want[0] == 1 && r.ndim == 0) ok = true; /* a 0-d buffer (Gemma 4's clip bounds) */
    if (!ok) {
        char got_s[96], want_s[96];
        shape_str(r.shape, r.ndim, got_s, sizeof got_s);
        shape_str(want, want_nd, want_s, sizeof want_s);
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: tensor '%s' has shape %s, but the config implies %s\n"
                            "  hint: the weights and the config (hidden_size, heads, head_dim, "
                            "intermediate_size%s) do not belong together",
                            m->path, file_name, got_s, want_s,
                            m->cfg.arch == GM_ARCH_GEMMA4 ? "; Gemma 4: per_layer_config or global_head_dim (full layers' "
                                                            "head_dim, default 512), hidden_size_per_layer_input, "
                                                            "num_experts, moe_intermediate_size" : "");
    }
    if (kind == GM_W_NORM || kind == GM_W_VEC || transposed) {
        if (!gm_dtype_get(r.dtype)->is_float)
            return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: weight '%s' has dtype %s (a float type is expected)",
                                m->path, file_name, gm_dtype_name(r.dtype));
        *dst = transposed ? gm_tensor_2d(GM_F32, rows, cols, f32_dst) : gm_tensor_1d(GM_F32, rows, f32_dst);
        if (f32_dst && transposed) {
            /* stored (cols, rows): read row by row, scatter into columns */
            int64_t n = cols, k = rows;
            size_t rb = gm_dtype_row_bytes(r.dtype, k);
            float *tmp = gm_malloc((size_t)k * sizeof(float));
            if (!tmp) return gm_error_set(err, GM_ERR_NOMEM, "out of memory transposing '%s'", file_name);
            for (int64_t i = 0; i < n; i++) {
                gm_dequant_row(r.dtype, (const uint8_t *)r.data + (size_t)i * rb, tmp, k);
                for (int64_t j = 0; j < k; j++) f32_dst[j * n + i] = tmp[j];
            }
            gm_free(tmp);
        } else if (f32_dst) {
            gm_dequant_row(r.dtype, r.data, f32_dst, rows);
            /* Convert to f32 first, then add 1 (adding 1 in bf16 loses precision, §6 pitfall 3). */
            if (kind == GM_W_NORM && m->cfg.norm_convention == GM_NORM_ONE_PLUS_W)
                for (int64_t i = 0; i < rows; i++) f32_dst[i] += 1.0f;
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

/* The GGUF / Hugging Face file name and our canonical name of a weight (layer < 0: model-level). */
static void weight_names(const gm_model *m, const gm_weight_spec *w, int64_t layer, const char *hf_prefix, char *fname,
                         size_t fcap, char *hname, size_t hcap) {
    bool gguf = m->gguf != NULL;
    if (layer >= 0) {
        if (gguf) snprintf(fname, fcap, "blk.%lld.%s", (long long)layer, w->gguf);
        else snprintf(fname, fcap, "%s%s%lld.%s", hf_prefix, m->arch->layers_prefix, (long long)layer, w->hf);
        snprintf(hname, hcap, "%s%s%lld.%s", m->prefix, m->arch->layers_prefix, (long long)layer, w->hf);
    } else {
        if (gguf) snprintf(fname, fcap, "%s", w->gguf);
        else snprintf(fname, fcap, "%s%s", w->top_level ? m->root : hf_prefix, w->hf);
        snprintf(hname, hcap, "%s%s", w->top_level ? m->root : m->prefix, w->hf);
    }
}

/* Binds one weight of the spec; norms get an f32 buffer from the norm arena (measuring: sized only). */
static gm_status bind_spec(gm_model *m, const gm_weight_spec *w, int64_t layer, const char *hf_prefix, gm_tensor *dst,
                           gm_error *err) {
    const gm_config *c = &m->cfg;
    char fname[256], hname[256];
    weight_names(m, w, layer, hf_prefix, fname, sizeof fname, hname, sizeof hname);
    int64_t rows = gm_dim_value(c, layer, w->rows, 0), cols = w->cols == GM_DIM_NONE ? 0 : gm_dim_value(c, layer, w->cols, 0);
    bool copy = w->kind == GM_W_NORM || w->kind == GM_W_VEC || w->transposed;
    float *nb = copy ? gm_arena_alloc(&m->arena, (size_t)(rows * (cols ? cols : 1)) * sizeof(float), GM_MEM_WEIGHTS) : NULL;
    return bind_weight(m, fname, hname, w->kind, w->transposed, rows, cols, dst, nb, err);
}

/* Walks every weight of the spec; pass 1 (arena measuring) sizes the norm arena, pass 2 fills it. */
static gm_status bind_all(gm_model *m, const char *hf_prefix, gm_error *err) {
    const gm_config *c = &m->cfg;
    const gm_arch_def *ar = m->arch;
    m->mapped_bytes = 0;
    for (int gi = 0; gi < ar->n_globals; gi++) {
        const gm_weight_spec *w = &ar->globals[gi];
        memset(&m->global[gi], 0, sizeof m->global[gi]);
        if (gi == GM_GLOBAL_LM_HEAD && c->tie_word_embeddings) continue;
        if (!gm_weight_present(w, c, -1)) continue;
        GM_TRY(bind_spec(m, w, -1, hf_prefix, &m->global[gi], err));
    }
    if (c->tie_word_embeddings) m->global[GM_GLOBAL_LM_HEAD] = m->global[GM_GLOBAL_EMBED];
    for (int64_t l = 0; l < c->n_layers; l++)
        for (int s = 0; s < ar->n_layer; s++) {
            gm_tensor *dst = &m->layer[l * ar->n_layer + s];
            memset(dst, 0, sizeof *dst);
            if (!gm_weight_present(&ar->layer[s], c, l)) continue; /* e.g. k/v of a KV-shared layer: never read */
            GM_TRY(bind_spec(m, &ar->layer[s], l, hf_prefix, dst, err));
        }
    return GM_OK;
}

gm_status gm_model_weight_f32(const gm_model *m, const gm_weight_spec *w, int64_t layer, gm_norm_convention conv,
                             float *dst, gm_error *err) {
    const gm_config *c = &m->cfg;
    char fname[256], hname[256];
    weight_names(m, w, layer, m->prefix, fname, sizeof fname, hname, sizeof hname);
    raw_tensor r;
    if (!find_raw(m, fname, &r)) return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: missing tensor '%s'", m->path, fname);
    int64_t rows = gm_dim_value(c, layer, w->rows, 0), cols = w->cols == GM_DIM_NONE ? rows : gm_dim_value(c, layer, w->cols, 0);
    if (w->cols == GM_DIM_NONE) rows = 1;
    /* the loader checked the shape; a block dtype's rows are whole blocks (cols % block == 0) */
    size_t row_bytes = gm_dtype_row_bytes(r.dtype, cols);
    for (int64_t i = 0; i < rows; i++) gm_dequant_row(r.dtype, (const uint8_t *)r.data + (size_t)i * row_bytes, dst + i * cols, cols);
    if (w->kind == GM_W_NORM && conv != c->norm_convention) {
        /* Hugging Face stores w (scale 1 + w), GGUF 1 + w (gemma_architecture.md §5.3): in f32,
         * as llama.cpp's convert_hf_to_gguf.py adds the 1 */
        float d = conv == GM_NORM_DIRECT ? 1.0f : -1.0f;
        for (int64_t i = 0; i < cols; i++) dst[i] += d;
    }
    return GM_OK;
}

gm_wview gm_wview_of(const gm_tensor *t) {
    gm_wview w;
    memset(&w, 0, sizeof w);
    if (t->ndim < 1) return w; /* a weight the layer does not have (a KV-shared layer's k / v): no view */
    w.type = t->dtype;
    w.data = t->data;
    w.rows = t->ndim == 2 ? t->shape[0] : 1;
    w.cols = t->shape[t->ndim - 1];
    w.row_bytes = gm_dtype_row_bytes(t->dtype, t->ndim == 2 ? t->stride[0] : w.cols);
    return w;
}

/* The architecture's definition and the per-layer weight table, once the config is known. */
static gm_status setup_arch(gm_model *m, gm_error *err) {
    m->arch = gm_arch_get(m->cfg.arch);
    if (!m->arch)
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: %s models cannot be loaded by gemmarun yet (it can plan them: "
                            "`gemmarun plan`)", m->path, gm_arch_name(m->cfg.arch));
    if (m->arch->altup && m->cfg.altup_inputs != 4)
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: altup_num_inputs = %lld: gemmarun reads the 4 AltUp streams of every "
                            "published Gemma 3n", m->path, (long long)m->cfg.altup_inputs);
    m->layer = gm_calloc((size_t)(m->cfg.n_layers * m->arch->n_layer), sizeof *m->layer);
    if (!m->layer) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    return GM_OK;
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

/* A tensor of the decoder's spec that the file holds but the config leaves unused (an
 * enable_moe_block, attention_k_eq_v or hidden_size_per_layer_input that contradicts the weights)
 * means the config and the weights do not belong together: refused, naming the tensor, rather than
 * running another model than the file's. KV-shared layers' own key / value weights are the
 * exception transformers makes too (_keys_to_ignore_on_load_unexpected): present in published
 * files, never read. Names the spec does not know are left alone. */
static gm_status check_unused(const gm_model *m, const char *prefix, gm_error *err) {
    const gm_arch_def *ar = m->arch;
    const gm_config *c = &m->cfg;
    size_t np = strlen(prefix), nl = strlen(ar->layers_prefix);
    for (int64_t i = 0; i < gm_safetensors_n_tensors(m->st); i++) {
        const char *name = gm_safetensors_tensor_at(m->st, i)->name;
        if (strncmp(name, prefix, np) != 0) continue;
        const char *rest = name + np;
        const gm_weight_spec *w = NULL;
        int64_t layer = -1;
        if (strncmp(rest, ar->layers_prefix, nl) == 0) {
            char *end = NULL;
            long l = strtol(rest + nl, &end, 10);
            if (end == rest + nl || *end != '.' || l < 0 || l >= c->n_layers) continue;
            int slot = gm_arch_slot(ar, end + 1);
            if (slot < 0) continue;
            w = &ar->layer[slot], layer = l;
            if ((w->when == GM_WHEN_OWN_KV || w->when == GM_WHEN_OWN_V) && c->kv_source[l] != l) continue;
        } else {
            for (int gi = 0; gi < ar->n_globals && !w; gi++)
                if (!ar->globals[gi].top_level && strcmp(ar->globals[gi].hf, rest) == 0) w = &ar->globals[gi];
            if (!w) continue;
        }
        if (gm_weight_present(w, c, layer)) continue;
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: tensor '%s' is in the checkpoint, but its config.json leaves it unused\n"
                            "  hint: the config and the weights do not belong together (check what it says of the "
                            "model's parts: enable_moe_block, attention_k_eq_v, hidden_size_per_layer_input, "
                            "num_kv_shared_layers, layer_types)",
                            m->path, name);
    }
    return GM_OK;
}

/* The text decoder's module prefix in a Hugging Face checkpoint: Gemma3ForCausalLM uses
 * "model."; multimodal checkpoints "language_model.model." (legacy) or "model.language_model."
 * (transformers >= 4.52), gemma_architecture.md §5.2. NULL when no embedding tensor is found. */
static const char *find_prefix(const gm_safetensors *st) {
    static const char *prefixes[] = {"model.", "language_model.model.", "model.language_model."};
    char probe[256];
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        snprintf(probe, sizeof probe, "%sembed_tokens.weight", prefixes[i]);
        if (gm_safetensors_find(st, probe)) return prefixes[i];
    }
    return NULL;
}

/* gm_model.peft_prefix from the checkpoint's text prefix: a multimodal layout's decoder sits at
 * model.language_model. in transformers' module tree, whichever way its files name it. */
static const char *peft_prefix_of(const char *prefix) {
    return strcmp(prefix, "model.") == 0 ? "model." : GM_PEFT_PREFIX_MULTIMODAL;
}

gm_status gm_model_prefix(const char *path, char *out, size_t cap, gm_error *err) {
    snprintf(out, cap, "model."); /* GGUF files hold a text-only model */
    if (!is_hf_checkpoint(path)) return GM_OK;
    char dir[1024];
    if (is_dir(path)) snprintf(dir, sizeof dir, "%s", path);
    else dirname_of(path, dir, sizeof dir);
    if (ends_with(path, "/config.json") || strcmp(path, "config.json") == 0) path = dir;
    gm_safetensors *st = NULL;
    GM_TRY(gm_safetensors_open(path, &st, err)); /* the header only: no weight is read */
    const char *p = find_prefix(st);
    gm_safetensors_free(st);
    if (!p) return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: no embedding tensor (looked for model.embed_tokens.weight and the "
                                "multimodal prefixes)", path);
    snprintf(out, cap, "%s", peft_prefix_of(p));
    return GM_OK;
}

gm_status gm_model_stored_dtypes(const char *path, gm_dtype *linear, gm_dtype *embed, gm_error *err) {
    if (!is_hf_checkpoint(path)) return gm_error_set(err, GM_ERR_INVALID, "%s: not a Hugging Face checkpoint", path);
    char dir[1024];
    if (ends_with(path, "/config.json") || strcmp(path, "config.json") == 0) {
        dirname_of(path, dir, sizeof dir);
        path = dir;
    }
    gm_safetensors *st = NULL;
    GM_TRY(gm_safetensors_open(path, &st, err)); /* the header only: no weight is read */
    const char *p = find_prefix(st);
    char name[256];
    const gm_st_tensor *t = NULL;
    if (p) {
        snprintf(name, sizeof name, "%slayers.0.mlp.up_proj.weight", p);
        if ((t = gm_safetensors_find(st, name))) *linear = t->dtype;
        snprintf(name, sizeof name, "%sembed_tokens.weight", p);
        if ((t = gm_safetensors_find(st, name))) *embed = t->dtype;
    }
    gm_safetensors_free(st);
    return GM_OK;
}

/* Gemma 4's clipped linears (Gemma4ClippableLinear): each pair of bounds (the spec's *_min slot,
 * then its *_max) a number with min <= max - a NaN would clamp nothing, silently. */
static gm_status check_clip_bounds(const gm_model *v, gm_error *err) {
    const gm_arch_def *ar = v->arch;
    for (int64_t l = 0; l < v->cfg.n_layers; l++)
        for (int s = 0; s + 1 < ar->n_layer; s++) {
            const gm_weight_spec *w = &ar->layer[s];
            if (w->when != GM_WHEN_CLIPPED || !strstr(w->hf, "_min") || !gm_weight_present(w, &v->cfg, l)) continue;
            float lo = *(const float *)v->layer[l * ar->n_layer + s].data, hi = *(const float *)v->layer[l * ar->n_layer + s + 1].data;
            if (isnan(lo) || isnan(hi) || lo > hi)
                return gm_error_set(err, GM_ERR_FORMAT, "%s: %s%s%lld.%s = %g and its %s = %g: a clamp needs bounds with min <= "
                                    "max", v->path, v->prefix, ar->layers_prefix, (long long)l, w->hf, (double)lo,
                                    ar->layer[s + 1].hf, (double)hi);
        }
    return GM_OK;
}

/* The tower of a multimodal checkpoint (gm_model.vision): its weights are named below the tower's
 * prefix, the projector's below the multimodal model's root. The root is what the text decoder's
 * prefix says ("language_model.model." in the hub's layout: root ""; "model.language_model.": root
 * "model."); the tower is "vision_tower.vision_model." (the hub's files, gemma_architecture.md
 * §5.2) or "vision_tower." (transformers 5's save_pretrained), whichever holds its patch embedding;
 * with neither, the checkpoint's tower was stripped and the model loads as a text model. */
static gm_status load_vision(gm_model *m, const char *text_prefix, gm_error *err) {
    gm_model *v = gm_calloc(1, sizeof *v);
    if (!v) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    m->vision = v;
    v->borrows_files = true;
    v->st = m->st;
    v->format = m->format;
    snprintf(v->path, sizeof v->path, "%s", m->path);
    GM_TRY(gm_config_vision_tower(&m->cfg, &v->cfg, err));
    const char *root = strcmp(text_prefix, "model.language_model.") == 0 ? "model." : "";
    snprintf(v->root, sizeof v->root, "%s", root);
    bool g4 = m->cfg.arch == GM_ARCH_GEMMA4;
    /* Gemma 4 (Gemma4ForConditionalGeneration): "model.vision_tower." beside model.embed_vision */
    static const char *towers[] = {"vision_tower.vision_model.", "vision_tower."};
    const char *probe_name = g4 ? "patch_embedder.input_proj.weight" : "embeddings.patch_embedding.weight";
    for (int i = g4 ? 1 : 0; i < 2 && !v->prefix[0]; i++) {
        char probe[256];
        snprintf(probe, sizeof probe, "%s%s%s", root, towers[i], probe_name);
        if (gm_safetensors_find(m->st, probe)) snprintf(v->prefix, sizeof v->prefix, "%s%s", root, towers[i]);
    }
    if (!v->prefix[0]) {
        /* a multimodal checkpoint with its tower stripped: a text model (images are refused later,
         * naming the model) */
        GM_INFO("%s: config.json has a vision_config but the files hold no vision tower (no "
                    "%svision_tower[.vision_model].%s): loaded as a text model", m->path, root, probe_name);
        m->vision = NULL;
        gm_model_free(v);
        return GM_OK;
    }
    GM_TRY(setup_arch(v, err));
    gm_arena_init(&v->arena, "vision tower vectors", GM_DEVICE_CPU);
    GM_TRY(bind_all(v, v->prefix, err));
    GM_TRY(gm_arena_commit(&v->arena, err));
    GM_TRY(bind_all(v, v->prefix, err));
    return check_clip_bounds(v, err);
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
    const char *prefix = find_prefix(m->st);
    if (!prefix)
        return gm_error_set(err, GM_ERR_NOT_FOUND,
                            "%s: no embedding tensor (looked for model.embed_tokens.weight and the "
                            "multimodal prefixes)",
                            path);
    /* PEFT names modules by their path in the checkpoint's model: the text decoder's prefix */
    snprintf(m->prefix, sizeof m->prefix, "%s", prefix);
    snprintf(m->peft_prefix, sizeof m->peft_prefix, "%s", peft_prefix_of(prefix));
    GM_TRY(setup_arch(m, err));
    gm_arena_init(&m->arena, "norm weights", GM_DEVICE_CPU);
    GM_TRY(bind_all(m, prefix, err));
    GM_TRY(check_unused(m, prefix, err));
    GM_TRY(gm_arena_commit(&m->arena, err));
    GM_TRY(bind_all(m, prefix, err));
    /* Gemma 3's SigLIP tower; Gemma 3n's (MobileNet-V5) is not in gemmarun: its text decoder
     * loads alone, and images on it are refused where they are planned (gm_plan_max_images) */
    if (m->cfg.vision.hidden_size > 0 && (m->cfg.arch == GM_ARCH_GEMMA3 || m->cfg.arch == GM_ARCH_GEMMA4)) {
        GM_TRY(load_vision(m, prefix, err));
    }
    if (o->load_tokenizer) {
        char tj[1100], tc[1100];
        snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
        snprintf(tc, sizeof tc, "%s/tokenizer_config.json", dir);
        if (file_exists(tj)) GM_TRY(gm_tokenizer_from_hf_json(tj, file_exists(tc) ? tc : NULL, &m->tok, err));
    }
    return GM_OK;
}

gm_status gm_model_sha256(const gm_model *m, char hex[65], char *files, size_t cap, gm_error *err) {
    if (files && cap) files[0] = '\0';
    if (m->format == GM_FORMAT_GGUF) {
        GM_TRY(gm_sha256_file(m->path, hex, err));
        if (files && cap) {
            const char *base = strrchr(m->path, '/');
            snprintf(files, cap, "%s=%.12s", base ? base + 1 : m->path, hex);
        }
        return GM_OK;
    }
    // the files load_hf read, in its order
    char dir[1024];
    if (is_dir(m->path)) snprintf(dir, sizeof dir, "%s", m->path);
    else dirname_of(m->path, dir, sizeof dir);
    const int n_sh = gm_safetensors_n_shards(m->st);
    int n = 0;
    char (*paths)[1100] = gm_malloc((size_t)(n_sh + 4) * sizeof *paths);
    char *lines = gm_malloc((size_t)(n_sh + 4) * 1200);
    if (!paths || !lines) {
        gm_free(paths);
        gm_free(lines);
        return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory hashing the model's files", m->path);
    }
    snprintf(paths[n++], sizeof paths[0], "%s/config.json", dir);
    if (ends_with(m->path, ".index.json")) snprintf(paths[n++], sizeof paths[0], "%s", m->path);
    for (int i = 0; i < n_sh; i++) snprintf(paths[n++], sizeof paths[0], "%s", gm_safetensors_shard_path(m->st, i));
    if (m->tok) {
        snprintf(paths[n], sizeof paths[0], "%s/tokenizer.json", dir);
        if (file_exists(paths[n])) n++;
        snprintf(paths[n], sizeof paths[0], "%s/tokenizer_config.json", dir);
        if (file_exists(paths[n])) n++;
    }
    gm_status s = GM_OK;
    size_t len = 0, flen = 0;
    lines[0] = '\0';
    for (int i = 0; i < n && s == GM_OK; i++) {
        char h[65];
        if ((s = gm_sha256_file(paths[i], h, err)) != GM_OK) break;
        const char *base = strrchr(paths[i], '/');
        base = base ? base + 1 : paths[i];
        len += (size_t)snprintf(lines + len, 1200, "%s %s\n", base, h);
        if (files && cap > flen + 1)
            flen += (size_t)snprintf(files + flen, cap - flen, "%s%s=%.12s", i ? " " : "", base, h);
        if (files && flen >= cap) flen = cap - 1;
    }
    if (s == GM_OK) {
        unsigned char md[EVP_MAX_MD_SIZE];
        unsigned int mdlen = 0;
        if (EVP_Digest(lines, len, md, &mdlen, EVP_sha256(), NULL) != 1)
            s = gm_error_set(err, GM_ERR_IO, "sha256 failed");
        for (unsigned i = 0; s == GM_OK && i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
    }
    gm_free(paths);
    gm_free(lines);
    return s;
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
    snprintf(m->prefix, sizeof m->prefix, "model."); /* a text-only Gemma3ForCausalLM's layout */
    snprintf(m->peft_prefix, sizeof m->peft_prefix, "%s", peft_prefix_of(m->prefix));
    GM_TRY(setup_arch(m, err));
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
    gm_status s = is_hf_checkpoint(path) ? load_hf(m, path, &o, err) : load_gguf(m, path, &o, err);
    if (s != GM_OK) {
        gm_model_free(m);
        return s;
    }
    *out = m;
    return GM_OK;
}

const char *gm_model_no_images(const gm_model *m) {
    if (m->vision) return NULL;
    if (m->cfg.arch == GM_ARCH_GEMMA3N)
        return "Gemma 3n's vision encoder (MobileNet-V5) is not in gemmarun yet: its text decoder runs, its images are not read";
    if (m->cfg.arch == GM_ARCH_GEMMA4 && m->cfg.vision.hidden_size > 0)
        return "its files hold no vision tower (no model.vision_tower.*: a text-only export of a Gemma 4)";
    return gm_config_has_audio(&m->cfg) ? "it has no vision tower (its config has an audio tower only)"
                                        : "it has no vision tower (a text-only model cannot read images)";
}

const char *gm_model_no_audio(const gm_model *m) {
    if (m->cfg.arch == GM_ARCH_GEMMA3N && m->cfg.audio.hidden_size > 0) return NULL;
    if (m->cfg.arch == GM_ARCH_GEMMA4 && gm_config_has_audio(&m->cfg))
        return m->st && gm_safetensors_find(m->st, "model.audio_tower.output_proj.weight")
                   ? NULL
                   : "its files hold no audio tower (no model.audio_tower.*: a text-only export of a Gemma 4)";
    return "it has no audio encoder (audio needs a checkpoint with one: Gemma 3n, e.g. gemma-3n-E2B-it, or Gemma 4 "
           "E2B / E4B, e.g. gemma-4-E2B-it)";
}

void gm_model_free(gm_model *m) {
    if (!m) return;
    gm_model_free(m->vision);
    gm_tokenizer_free(m->tok);
    if (m->gguf && !m->borrows_files) gm_gguf_free(m->gguf);
    if (m->st && !m->borrows_files) gm_safetensors_free(m->st);
    gm_arena_free(&m->arena);
    gm_free(m->layer);
    gm_free(m);
}

void gm_model_for_each_tensor(const gm_model *m, gm_model_tensor_fn fn, void *user) {
    fn(&m->global[GM_GLOBAL_EMBED], user);
    if (!m->cfg.tie_word_embeddings) fn(&m->global[GM_GLOBAL_LM_HEAD], user);
    fn(&m->global[GM_GLOBAL_FINAL_NORM], user);
    for (int gi = GM_GLOBAL_LM_HEAD + 1; gi < m->arch->n_globals; gi++)
        if (m->global[gi].data) fn(&m->global[gi], user);
    for (int64_t l = 0; l < m->cfg.n_layers; l++)
        for (int s = 0; s < m->arch->n_layer; s++)
            if (gm_model_weight(m, l, s)->data) fn(gm_model_weight(m, l, s), user);
}

void gm_model_release_linear_pages(const gm_model *m) {
    for (int64_t l = 0; l < m->cfg.n_layers; l++)
        for (int s = 0; s < m->arch->n_layer; s++) {
            const gm_tensor *t = gm_model_weight(m, l, s);
            if (m->arch->layer[s].kind == GM_W_LINEAR && t->data) gm_mmap_release(t->data, gm_tensor_nbytes(t));
        }
}

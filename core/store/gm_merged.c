/*
 * gm_merged.c - writing a base model with its adapter merged in (see gm_merged.h).
 */
#include "gm_merged.h"

#include "gm_alloc.h"
#include "gm_chat.h"
#include "gm_file.h"
#include "gm_gguf.h"
#include "gm_mmap.h"
#include "gm_quant.h"
#include "gm_rng.h"
#include "gm_safetensors.h"
#include "gm_tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Every file a merged Hugging Face folder may hold: what save_hf writes or copies. A folder to
 * write into may hold only these (an earlier export), so nothing else - a PEFT adapter that
 * transformers would apply on top, trial files, a base model - is mixed in or replaced. */
static const char *const HF_FILES[] = {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                                       "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                                       "added_tokens.json", "chat_template.jinja"};
#define N_HF_FILES (sizeof HF_FILES / sizeof HF_FILES[0])
/* ... and what an interrupted write of them leaves (gm_write_file_atomic's NAME.tmp): a stale
 * OUT.partial may hold these too, and is cleared */
static const char *const HF_FILES_PARTIAL[] = {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                                               "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                                               "added_tokens.json", "chat_template.jinja", "model.safetensors.tmp",
                                               "config.json.tmp", "generation_config.json.tmp", "tokenizer.json.tmp",
                                               "tokenizer_config.json.tmp", "special_tokens_map.json.tmp",
                                               "tokenizer.model.tmp", "added_tokens.json.tmp", "chat_template.jinja.tmp"};

/* llama.cpp's general.file_type values (llama.h, enum llama_ftype) */
enum { FTYPE_ALL_F32 = 0, FTYPE_MOSTLY_F16 = 1, FTYPE_MOSTLY_Q8_0 = 7, FTYPE_MOSTLY_BF16 = 32 };

/* One output tensor: its name, dtype, shape and bytes (owned). */
typedef struct out_tensor {
    char name[256];
    gm_dtype dtype;
    int ndim;
    int64_t shape[4];
    void *data;
} out_tensor;

typedef struct out_list {
    out_tensor *t;
    int n, cap;
    size_t bytes;
} out_list;

static void out_free(out_list *o) {
    for (int i = 0; i < o->n; i++) gm_free(o->t[i].data);
    gm_free(o->t);
}

/* W (out, in) += scaling * B (out, r) A (r, in): the product in f32 per row, then scaled and
 * added, as PEFT's merge (get_delta_weight: transpose(B @ A) * scaling, then W + delta). */
static void merge_lora(float *W, int64_t out, int64_t in, const float *A, const float *B, int64_t r, float scaling, float *row) {
    for (int64_t o = 0; o < out; o++) {
        memset(row, 0, (size_t)in * sizeof *row);
        for (int64_t k = 0; k < r; k++) {
            const float b = B[o * r + k], *a = A + k * in;
            for (int64_t i = 0; i < in; i++) row[i] += b * a[i];
        }
        float *w = W + o * in;
        for (int64_t i = 0; i < in; i++) w[i] += row[i] * scaling;
    }
}

/* x (n floats) encoded as dtype into a new buffer; *bytes its size. */
static void *encode(const float *x, int64_t rows, int64_t cols, gm_dtype dt, size_t *bytes) {
    *bytes = (size_t)rows * gm_dtype_row_bytes(dt, cols);
    uint8_t *b = gm_malloc(*bytes ? *bytes : 1);
    if (!b) return NULL;
    const int64_t n = rows * cols;
    switch (dt) {
    case GM_F32: memcpy(b, x, (size_t)n * sizeof(float)); break;
    case GM_F16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)b)[i] = gm_f32_to_f16(x[i]);
        break;
    case GM_BF16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)b)[i] = gm_f32_to_bf16(x[i]);
        break;
    case GM_Q8_0:
        for (int64_t r = 0; r < rows; r++) gm_q8_0_quantize_row(x + r * cols, cols, b + (size_t)r * gm_dtype_row_bytes(dt, cols));
        break;
    default: gm_free(b); return NULL;
    }
    return b;
}

/* Where a Hugging Face folder's weights are named: the decoder's module prefix ("model." for
 * Gemma3ForCausalLM, "language_model.model." in a multimodal checkpoint) and the root of its
 * top-level weights ("" and "language_model."). */
typedef struct hf_names {
    const char *prefix, *root;
} hf_names;
static const hf_names TEXT_NAMES = {"model.", ""};
/* a multimodal folder: the hub's layout (gm_model_save_with_tower's; the tower's beside it,
 * add_tower), which transformers reads as Gemma3ForConditionalGeneration */
static const hf_names MM_NAMES = {"language_model.model.", "language_model."};

static void *encode(const float *x, int64_t rows, int64_t cols, gm_dtype dt, size_t *bytes);

/* Appends tensor `name` of shape (ndim dims) to the list: x, rows x cols floats (cols 0: rows
 * values), encoded as dt. */
static gm_status out_add(out_list *o, const char *name, gm_dtype dt, int ndim, const int64_t *shape, const float *x,
                         int64_t rows, int64_t cols, gm_error *err) {
    if (o->n == o->cap) {
        int cap = o->cap * 2 + 64;
        out_tensor *nt = gm_realloc(o->t, (size_t)cap * sizeof *nt);
        if (!nt) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
        o->t = nt, o->cap = cap;
    }
    out_tensor *t = &o->t[o->n];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dt;
    t->ndim = ndim;
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    size_t bytes;
    t->data = encode(x, cols ? rows : 1, cols ? cols : rows, dt, &bytes);
    if (!t->data) return gm_error_set(err, GM_ERR_NOMEM, "out of memory encoding %s", name);
    o->n++, o->bytes += bytes;
    return GM_OK;
}

/* W (rows, cols) += lo's scaling * B A of adapter ad (its A, B downloaded from backend be). */
static gm_status merge_adapter(const gm_lora *lo, const gm_lora_adapter *ad, gm_backend *be, float *W, int64_t rows, int64_t cols,
                               gm_error *err) {
    const int64_t r = lo->cfg.rank;
    float *A = gm_malloc((size_t)(r * ad->in) * sizeof *A), *B = gm_malloc((size_t)(ad->out * r) * sizeof *B),
          *row = gm_malloc((size_t)ad->in * sizeof *row);
    gm_status s = GM_OK;
    if (!A || !B || !row) s = gm_error_set(err, GM_ERR_NOMEM, "out of memory merging %s", ad->module);
    if (s == GM_OK) {
        gm_backend_download(be, A, ad->A, (size_t)(r * ad->in) * sizeof *A);
        gm_backend_download(be, B, ad->B, (size_t)(ad->out * r) * sizeof *B);
        s = gm_backend_status(be, err);
    }
    if (s == GM_OK) merge_lora(W, rows, cols, A, B, r, lo->scaling, row);
    gm_free(A), gm_free(B), gm_free(row);
    return s;
}

/* Reads, merges and encodes one weight of the spec (layer < 0: model-level) into the list. */
static gm_status add_weight(const gm_model *m, const gm_lora *lo, gm_backend *be, gm_merged_format fmt, gm_dtype dtype,
                            const hf_names *hn, const gm_weight_spec *w, int64_t layer, int slot, out_list *o, int *n_merged,
                            gm_error *err) {
    const gm_config *c = &m->cfg;
    int64_t rows = gm_dim_value(c, layer, w->rows, 0), cols = w->cols == GM_DIM_NONE ? 0 : gm_dim_value(c, layer, w->cols, 0);
    const int64_t n = cols ? rows * cols : rows;
    float *x = gm_malloc((size_t)n * sizeof *x);
    if (!x) return gm_error_set(err, GM_ERR_NOMEM, "out of memory for %lld values of a weight", (long long)n);
    gm_status s = gm_model_weight_f32(m, w, layer, fmt == GM_MERGED_HF ? GM_NORM_ONE_PLUS_W : GM_NORM_DIRECT, x, err);
    int ai = s == GM_OK && lo && layer >= 0 && w->kind == GM_W_LINEAR ? lo->index[layer * lo->n_slots + slot] : -1;
    if (ai >= 0) {
        const gm_lora_adapter *ad = &lo->ad[ai];
        if (ad->out != rows || ad->in != cols)
            s = gm_error_set(err, GM_ERR_INVALID, "%s: the adapter is (%lld, %lld), the weight (%lld, %lld)", ad->module,
                             (long long)ad->out, (long long)ad->in, (long long)rows, (long long)cols);
        if (s == GM_OK) s = merge_adapter(lo, ad, be, x, rows, cols, err);
        if (s == GM_OK) (*n_merged)++;
    }
    /* GGUF keeps 1-D weights in f32 and falls back to f16 where a row is not whole Q8_0 blocks */
    gm_dtype dt = dtype;
    if (fmt == GM_MERGED_GGUF && !cols) dt = GM_F32;
    if (dt == GM_Q8_0 && cols % 32 != 0) dt = GM_F16;
    if (s == GM_OK) {
        char name[256];
        if (fmt == GM_MERGED_GGUF) {
            if (layer >= 0) snprintf(name, sizeof name, "blk.%lld.%s", (long long)layer, w->gguf);
            else snprintf(name, sizeof name, "%s", w->gguf);
        } else {
            /* the decoder under hn's prefix whatever the base's layout */
            if (layer >= 0) snprintf(name, sizeof name, "%slayers.%lld.%s", hn->prefix, (long long)layer, w->hf);
            else snprintf(name, sizeof name, "%s%s", w->top_level ? hn->root : hn->prefix, w->hf);
        }
        const int64_t shape[2] = {rows, cols};
        s = out_add(o, name, dt, cols ? 2 : 1, shape, x, rows, cols, err);
    }
    gm_free(x);
    return s;
}

/* Every weight of the spec, model-level first, then layer by layer (the loader's order). */
static gm_status collect(const gm_model *m, const gm_lora *lo, gm_backend *be, gm_merged_format fmt, gm_dtype dtype,
                         const hf_names *hn, out_list *o, int *n_merged, gm_error *err) {
    const gm_config *c = &m->cfg;
    const gm_arch_def *ar = m->arch;
    for (int gi = 0; gi < ar->n_globals; gi++) {
        if (gi == GM_GLOBAL_LM_HEAD && c->tie_word_embeddings) continue;
        if (!gm_weight_present(&ar->globals[gi], c, -1)) continue;
        GM_TRY(add_weight(m, lo, be, fmt, dtype, hn, &ar->globals[gi], -1, -1, o, n_merged, err));
    }
    for (int64_t l = 0; l < c->n_layers; l++)
        for (int sl = 0; sl < ar->n_layer; sl++)
            if (gm_weight_present(&ar->layer[sl], c, l)) GM_TRY(add_weight(m, lo, be, fmt, dtype, hn, &ar->layer[sl], l, sl, o, n_merged, err));
    return GM_OK;
}

static gm_status write_text(const char *dir, const char *name, const char *text, gm_error *err) {
    char path[4352];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
        return gm_error_set(err, GM_ERR_INVALID, "%s: path too long", dir);
    return gm_write_file_atomic(path, text, strlen(text), err);
}

/* The folder a Hugging Face checkpoint's files are in (its path, or the file's folder). */
static void source_dir(const gm_model *m, char *dir, size_t cap) {
    struct stat sb;
    snprintf(dir, cap, "%s", m->path);
    if (stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode)) return;
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, cap, ".");
}

/* Copies the base folder's tokenizer files that exist; *n_copied how many. */
static gm_status copy_tokenizer(const gm_model *m, const char *dir, int *n_copied, gm_error *err) {
    static const char *const files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                        "tokenizer.model", "added_tokens.json", "chat_template.jinja"};
    char src[4352], from[4096];
    source_dir(m, from, sizeof from);
    *n_copied = 0;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(src, sizeof src, "%s/%s", from, files[i]);
        struct stat sb;
        if (stat(src, &sb) != 0) continue;
        char *buf;
        size_t len;
        GM_TRY(gm_read_file(src, &buf, &len, err));
        char dst[4352];
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        gm_status s = gm_write_file_atomic(dst, buf, len, err);
        gm_free(buf);
        GM_TRY(s);
        (*n_copied)++;
    }
    return GM_OK;
}

/* Whether the folder's tokenizer files carry a chat template (chat_template.jinja, or the
 * "chat_template" of tokenizer_config.json). */
static bool has_chat_template(const char *dir) {
    char path[4352];
    struct stat sb;
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    if (stat(path, &sb) == 0) return true;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    char *buf;
    size_t len;
    gm_error e = {0};
    if (gm_read_file(path, &buf, &len, &e) != GM_OK) return false;
    cJSON *j = cJSON_ParseWithLength(buf, len);
    gm_free(buf);
    bool has = j && cJSON_GetObjectItemCaseSensitive(j, "chat_template") != NULL;
    cJSON_Delete(j);
    return has;
}

static const char *torch_dtype(gm_dtype dt) {
    return dt == GM_BF16 ? "bfloat16" : dt == GM_F16 ? "float16" : "float32";
}

/* Writes the folder's files: the weights in o, config.json of `cfg`, generation_config.json, the
 * tokenizer. */
static gm_status save_hf(const gm_model *m, const gm_config *cfg, const out_list *o, gm_dtype dtype, const char *dir,
                         gm_merged_info *info, gm_error *err) {
    gm_st_write_tensor *wt = gm_calloc((size_t)o->n, sizeof *wt);
    if (!wt) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < o->n; i++) {
        const out_tensor *t = &o->t[i];
        wt[i] = (gm_st_write_tensor){t->name, t->dtype, t->ndim, {t->shape[0], t->shape[1], t->shape[2], t->shape[3]}, t->data};
    }
    char path[4352];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    static const char *const meta[] = {"format", "pt"};
    gm_status s = gm_safetensors_write(path, wt, o->n, meta, 1, err);
    gm_free(wt);
    GM_TRY(s);
    char *json;
    GM_TRY(gm_config_to_json(cfg, torch_dtype(dtype), &json, err));
    s = write_text(dir, "config.json", json, err);
    cJSON_free(json);
    GM_TRY(s);
    /* generation_config.json: a chat model stops at <end_of_turn> as well as <eos> */
    cJSON *g = cJSON_CreateObject();
    if (!g) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    if (m->cfg.bos_id >= 0) cJSON_AddNumberToObject(g, "bos_token_id", m->cfg.bos_id);
    cJSON *eos = cJSON_AddArrayToObject(g, "eos_token_id");
    if (m->cfg.eos_id >= 0) cJSON_AddItemToArray(eos, cJSON_CreateNumber(m->cfg.eos_id));
    int32_t eot = m->tok ? gm_tokenizer_special(m->tok).end_of_turn : -1;
    if (eot >= 0 && eot != m->cfg.eos_id) cJSON_AddItemToArray(eos, cJSON_CreateNumber(eot));
    if (m->cfg.pad_id >= 0) cJSON_AddNumberToObject(g, "pad_token_id", m->cfg.pad_id);
    json = cJSON_Print(g);
    cJSON_Delete(g);
    if (!json) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    s = write_text(dir, "generation_config.json", json, err);
    cJSON_free(json);
    GM_TRY(s);
    info->tokenizer = "none";
    if (m->format == GM_FORMAT_SAFETENSORS) {
        int n = 0;
        GM_TRY(copy_tokenizer(m, dir, &n, err));
        if (n) info->tokenizer = "copied";
        if (n && !has_chat_template(dir)) {
            /* no template of its own: the one gemmarun trained and generates with (its tokenizer's format) */
            bool g4 = gm_chat_format_of(m->tok) == GM_CHAT_GEMMA4;
            GM_TRY(write_text(dir, "chat_template.jinja", g4 ? gm_chat_gemma4_jinja : gm_chat_gemma3_jinja, err));
            info->tokenizer = g4 ? "copied (with gemmarun's Gemma 4 chat template)" : "copied (with Gemma 3's chat template)";
        }
    } else if (m->tok) {
        gm_strref tmpl;
        char *ct = NULL;
        if (m->gguf && gm_gguf_get_str(m->gguf, "tokenizer.chat_template", &tmpl)) {
            ct = gm_malloc(tmpl.len + 1);
            if (!ct) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
            memcpy(ct, tmpl.p, tmpl.len);
            ct[tmpl.len] = '\0';
        }
        /* a pretrained GGUF (the 270M) carries no template: Gemma 3's own, the one gemmarun renders */
        s = gm_tokenizer_save_hf(m->tok, dir, ct ? ct : gm_chat_gemma3_jinja, err);
        gm_free(ct);
        GM_TRY(s);
        info->tokenizer = "built from the GGUF vocabulary";
    }
    return GM_OK;
}

static gm_status save_gguf(const gm_model *m, const out_list *o, gm_dtype dtype, const char *path, gm_merged_info *info,
                           gm_error *err) {
    gm_gguf_writer *w = gm_gguf_writer_new();
    if (!w) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    uint32_t ftype = dtype == GM_F16 ? FTYPE_MOSTLY_F16 : dtype == GM_BF16 ? FTYPE_MOSTLY_BF16 : dtype == GM_Q8_0 ? FTYPE_MOSTLY_Q8_0
                                                                                                         : FTYPE_ALL_F32;
    bool have_ftype = false;
    for (int64_t i = 0; i < gm_gguf_n_kv(m->gguf); i++) {
        const gm_gguf_kv *kv = gm_gguf_kv_at(m->gguf, i);
        if (kv->key.len == 17 && memcmp(kv->key.p, "general.file_type", 17) == 0) {
            gm_gguf_set_u32(w, "general.file_type", ftype), have_ftype = true;
            continue;
        }
        gm_gguf_copy_kv(w, kv);
    }
    if (!have_ftype) gm_gguf_set_u32(w, "general.file_type", ftype);
    /* a pretrained GGUF (the 270M) carries no template: Gemma 3's, as the folder gets it */
    if (!gm_gguf_find_kv(m->gguf, "tokenizer.chat_template")) gm_gguf_set_str(w, "tokenizer.chat_template", gm_chat_gemma3_jinja);
    for (int i = 0; i < o->n; i++) gm_gguf_add_tensor(w, o->t[i].name, o->t[i].dtype, o->t[i].ndim, o->t[i].shape, o->t[i].data);
    gm_status s = gm_gguf_write(w, path, err);
    gm_gguf_writer_free(w);
    info->tokenizer = "in the GGUF metadata";
    return s;
}

/* Whether a and b are the same file or folder. */
static bool same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* GM_OK when folder `dir` is absent, or holds only files of a merged folder (HF_FILES). */
static gm_status check_folder(const char *dir, gm_error *err) {
    char other[256];
    GM_TRY(gm_folder_foreign(dir, HF_FILES, (int)N_HF_FILES, other, sizeof other, err));
    if (other[0])
        return gm_error_set(err, GM_ERR_INVALID, "%s holds %s, which is not a file of a merged model: export into a new or "
                            "empty folder (what is there is kept)", dir, other);
    return GM_OK;
}

/* Removes folder `dir` and the merged-model files in it (and their .tmp leftovers); quiet. */
static void remove_folder(const char *dir) {
    char path[4352];
    for (size_t i = 0; i < N_HF_FILES; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, HF_FILES[i]);
        unlink(path);
        snprintf(path, sizeof path, "%s/%s.tmp", dir, HF_FILES[i]);
        unlink(path);
    }
    rmdir(dir);
}

/* The checks before writing a Hugging Face folder at `out` from base m in `dtype`. */
static gm_status check_hf_out(const gm_model *m, gm_dtype dtype, const char *out, gm_error *err) {
    struct stat sb;
    char base_dir[4096];
    source_dir(m, base_dir, sizeof base_dir);
    if (dtype == GM_F16)
        return gm_error_set(err, GM_ERR_INVALID, "f16: Gemma's activations overflow in float16, so transformers (which "
                "computes in the config's dtype) gives NaN logits: use bf16 (the default) or f32");
    if (dtype != GM_F32 && dtype != GM_BF16)
        return gm_error_set(err, GM_ERR_INVALID, "a Hugging Face folder takes dtype bf16 or f32, not %s", gm_dtype_name(dtype));
    if (stat(out, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return gm_error_set(err, GM_ERR_INVALID, "%s exists and is not a folder: give a folder to write the merged model into", out);
    if (same_file(out, base_dir))
        return gm_error_set(err, GM_ERR_INVALID, "%s is the base model's folder: give another folder (the base is kept)", out);
    GM_TRY(check_folder(out, err));
    return GM_OK;
}

/* OUT.partial made empty (a stale one cleared), for a folder written and then renamed into place
 * (finish_hf_out): an interrupted or failed write never leaves a half-written model at OUT. */
static gm_status start_hf_out(const char *out, char *part, size_t cap, gm_error *err) {
    if ((size_t)snprintf(part, cap, "%s.partial", out) >= cap || strlen(out) + 5 >= 4096)
        return gm_error_set(err, GM_ERR_INVALID, "%s: path too long", out);
    char other[256];
    GM_TRY(gm_folder_foreign(part, HF_FILES_PARTIAL, (int)(sizeof HF_FILES_PARTIAL / sizeof HF_FILES_PARTIAL[0]), other,
                             sizeof other, err));
    if (other[0])
        return gm_error_set(err, GM_ERR_INVALID, "%s holds %s, which an interrupted write would not leave: move or delete that "
                            "folder (it is where the model is written before it is renamed to %s)", part, other, out);
    remove_folder(part);
    if (mkdir(part, 0755) != 0) return gm_error_set(err, GM_ERR_IO, "%s: cannot create the folder: %s", part, strerror(errno));
    return GM_OK;
}

/* s == GM_OK: OUT (an earlier export, checked) aside, the new folder `part` in its place, then the
 * old one gone; else `part` removed. Returns the status. */
static gm_status finish_hf_out(gm_status s, const char *out, const char *part, gm_error *err) {
    if (s != GM_OK) {
        remove_folder(part);
        return s;
    }
    char old[4200];
    snprintf(old, sizeof old, "%s.old", out);
    struct stat sb;
    bool had = stat(out, &sb) == 0;
    remove_folder(old);
    if (had && rename(out, old) != 0)
        return gm_error_set(err, GM_ERR_IO, "%s: cannot replace it: %s (the new model is in %s)", out, strerror(errno), part);
    if (rename(part, out) != 0) return gm_error_set(err, GM_ERR_IO, "%s: cannot rename %s to it: %s", out, part, strerror(errno));
    if (had) remove_folder(old);
    return GM_OK;
}

/* ---- the vision tower: a base's with its adapter merged, or drawn new ------------------------ */

/* A standard normal draw (Box-Muller on two uniforms; 1 - u keeps the log finite). */
static float normal_draw(gm_rng *r) {
    double u1 = 1.0 - (double)gm_rng_uniform(r), u2 = (double)gm_rng_uniform(r);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* FNV-1a of a name: each weight's random stream is keyed by its name, so its values do not
 * depend on the order the weights are written in. */
static uint64_t name_stream(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* Where a tower's weights come from: drawn (gm_model_save_with_tower: tower NULL, from `seed`),
 * or read from a multimodal base's tower as stored with an adapter's trained image path merged in
 * (gm_model_save_merged: ad may be NULL or hold neither part; its buffers on backend be). */
typedef struct tower_src {
    const gm_model *tower;
    uint64_t seed;
    const gm_vision_adapter *ad;
    gm_backend *be;
} tower_src;

/* One weight of a new tower, initialized as transformers initializes a
 * Gemma3ForConditionalGeneration made from its config (PreTrainedModel._init_weights with
 * initializer_range 0.02, then Gemma3PreTrainedModel._init_weights): linears, the patch
 * convolution and the position embedding N(0, 0.02^2); biases 0; LayerNorm weights 1; the
 * projector's RMSNorm w 0 (scale 1 + w = 1) - except the projector's weight, which transformers
 * zeroes and we draw N(0, 0.02^2) like the other linears. A zero projector gives zero soft tokens,
 * and the decoder's first RMSNorm of a zero row has a gradient of 1/sqrt(eps) = 1000 per unit:
 * the first step's gradient norm was 4e7 (digits_vision.lua with 16 tokens per image), such a
 * step stays in AdamW's second moment for hundreds of steps, and the projector hardly moved: with
 * 50 digits per class, 126 steps, test accuracy stayed at chance (10.0%) where the drawn projector
 * gives 29% (README, "Images: real handwritten digits"). x: n floats. */
static void draw_tower_weight(const gm_weight_spec *w, uint64_t seed, const char *name, float *x, int64_t n) {
    size_t len = strlen(w->hf);
    bool bias = len >= 5 && strcmp(w->hf + len - 5, ".bias") == 0;
    if (w->kind == GM_W_LINEAR || w->kind == GM_W_EMBED) {
        gm_rng r = gm_rng_seed(seed, name_stream(name));
        for (int64_t i = 0; i < n; i++) x[i] = 0.02f * normal_draw(&r);
    } else {
        const float v = w->kind == GM_W_VEC && !bias ? 1.0f : 0.0f; /* LayerNorm weight 1; biases, RMSNorm w, projector 0 */
        for (int64_t i = 0; i < n; i++) x[i] = v;
    }
}

/* One weight of a base's tower, x (n floats) as Hugging Face stores it (norms as w), with the
 * adapter's part of it: the projector's weight (C, C_text, the checkpoint's layout) and its norm's
 * w replaced by the trained ones (PEFT's modules_to_save: the module's copy replaces it), a linear
 * of layer `layer` in `slot` with LoRA merged as add_weight merges the decoder's. *merged, *proj
 * count what the adapter changed. */
static gm_status read_tower_weight(const tower_src *src, const gm_config *tc, const gm_weight_spec *w, int64_t layer, int slot,
                                   float *x, int64_t n, int *merged, bool *proj, gm_error *err) {
    const gm_vision_adapter *ad = src->ad;
    const float *trained = NULL;
    if (ad && layer < 0 && slot == GM_SIGLIP_MM_PROJ) trained = ad->proj_w;
    if (ad && layer < 0 && slot == GM_SIGLIP_MM_NORM) trained = ad->proj_norm_w;
    if (trained) {
        gm_backend_download(src->be, x, trained, (size_t)n * sizeof *x);
        *proj = true;
        return gm_backend_status(src->be, err);
    }
    GM_TRY(gm_model_weight_f32(src->tower, w, layer, GM_NORM_ONE_PLUS_W, x, err));
    const gm_lora *vl = ad ? ad->tower : NULL;
    const gm_lora_adapter *a = layer >= 0 && w->kind == GM_W_LINEAR ? gm_lora_at(vl, layer, slot) : NULL;
    if (!a) return GM_OK;
    const int64_t rows = gm_dim_value(tc, layer, w->rows, 0), cols = gm_dim_value(tc, layer, w->cols, 0);
    if (a->out != rows || a->in != cols)
        return gm_error_set(err, GM_ERR_INVALID, "%s: the adapter is (%lld, %lld), the weight (%lld, %lld)", a->module,
                            (long long)a->out, (long long)a->in, (long long)rows, (long long)cols);
    gm_status s = merge_adapter(vl, a, src->be, x, rows, cols, err);
    if (s == GM_OK) (*merged)++;
    return s;
}

/* One weight of the tower (slot: its index in the spec's globals when layer < 0, else in the
 * layer's), from src, encoded as dtype under `name`; the patch convolution as Conv2d's
 * (C, 3, p, p), the projector as stored (C, C_text). */
static gm_status add_tower_weight(const gm_config *tc, const gm_weight_spec *w, int64_t layer, int slot, const tower_src *src,
                                  gm_dtype dtype, const char *name, out_list *o, int *merged, bool *proj, gm_error *err) {
    int64_t rows = gm_dim_value(tc, layer, w->rows, 0), cols = w->cols == GM_DIM_NONE ? 0 : gm_dim_value(tc, layer, w->cols, 0);
    const int64_t n = cols ? rows * cols : rows;
    float *x = gm_malloc((size_t)n * sizeof *x);
    if (!x) return gm_error_set(err, GM_ERR_NOMEM, "out of memory for %s", name);
    gm_status s = GM_OK;
    if (src->tower) s = read_tower_weight(src, tc, w, layer, slot, x, n, merged, proj, err);
    else draw_tower_weight(w, src->seed, name, x, n);
    const bool is_patch = layer < 0 && slot == GM_SIGLIP_PATCH;
    const int64_t p = tc->vision.patch_size;
    const int64_t conv[4] = {rows, 3, p, p}, trans[2] = {cols, rows}, plain[2] = {rows, cols};
    if (s == GM_OK)
        s = is_patch       ? out_add(o, name, dtype, 4, conv, x, rows, cols, err)  /* Conv2d's (C, 3, p, p) */
            : w->transposed ? out_add(o, name, dtype, 2, trans, x, rows, cols, err) /* the projector, (C, C_text) */
                            : out_add(o, name, dtype, cols ? 2 : 1, plain, x, rows, cols, err);
    gm_free(x);
    return s;
}

/* Every weight of the tower of config tc (gm_config_vision_tower) and the projector, from src, in
 * the hub's layout: "vision_tower.vision_model." + the tower's names, the projector's at the root
 * ("multi_modal_projector."). *merged: the tower's linears that carry an adapter; *proj: whether
 * the projector was replaced by a trained one. */
static gm_status add_tower(const gm_config *tc, const tower_src *src, gm_dtype dtype, out_list *o, int *merged, bool *proj,
                           gm_error *err) {
    static const char TOWER[] = "vision_tower.vision_model.";
    const gm_arch_def *ar = gm_arch_get(GM_ARCH_SIGLIP);
    char name[256];
    for (int gi = 0; gi < ar->n_globals; gi++) {
        const gm_weight_spec *w = &ar->globals[gi];
        if (gi == GM_GLOBAL_LM_HEAD || !gm_weight_present(w, tc, -1)) continue; /* the tied slot: the position embedding */
        snprintf(name, sizeof name, "%s%s", w->top_level ? "" : TOWER, w->hf);
        GM_TRY(add_tower_weight(tc, w, -1, gi, src, dtype, name, o, merged, proj, err));
    }
    for (int64_t l = 0; l < tc->n_layers; l++)
        for (int sl = 0; sl < ar->n_layer; sl++) {
            snprintf(name, sizeof name, "%s%s%lld.%s", TOWER, ar->layers_prefix, (long long)l, ar->layer[sl].hf);
            GM_TRY(add_tower_weight(tc, &ar->layer[sl], l, sl, src, dtype, name, o, merged, proj, err));
        }
    return GM_OK;
}

gm_status gm_model_save_merged(const gm_model *m, const gm_lora *lo, const gm_vision_adapter *vision, gm_backend *be,
                               gm_merged_format format, gm_dtype dtype, const char *out, gm_merged_info *info, gm_error *err) {
    gm_merged_info dummy;
    if (!info) info = &dummy;
    memset(info, 0, sizeof *info);
    struct stat sb;
    const bool image_path = vision && (vision->tower || vision->proj_w);
    if (image_path && !m->vision)
        return gm_error_set(err, GM_ERR_INVALID, "%s has no vision tower: an adapter that trained the image path does not fit it",
                            m->path);
    if (format == GM_MERGED_HF) {
        GM_TRY(check_hf_out(m, dtype, out, err));
    } else {
        if (image_path)
            return gm_error_set(err, GM_ERR_UNSUPPORTED,
                                "the adapter trained the image path (LoRA on the vision tower, the projector): a merged GGUF "
                                "holds the text decoder only, and llama.cpp keeps the tower and projector in a separate mmproj "
                                "file, which gemmarun does not write\n  hint: export --format merged into a folder (a Hugging "
                                "Face Gemma3ForConditionalGeneration, the tower's adapters merged and the trained projector in "
                                "it), or --format peft");
        if (dtype != GM_F32 && dtype != GM_BF16 && dtype != GM_F16 && dtype != GM_Q8_0)
            return gm_error_set(err, GM_ERR_INVALID, "a merged GGUF takes dtype f32, f16, bf16 or q8_0, not %s", gm_dtype_name(dtype));
        if (stat(out, &sb) == 0 && S_ISDIR(sb.st_mode))
            return gm_error_set(err, GM_ERR_INVALID, "%s is a folder: give a .gguf file name for the merged model", out);
        if (same_file(out, m->path))
            return gm_error_set(err, GM_ERR_INVALID, "%s is the base model: give another file name (the base is kept)", out);
        if ((m->format != GM_FORMAT_GGUF || !m->gguf) && m->cfg.arch == GM_ARCH_GEMMA3)
            return gm_error_set(err, GM_ERR_UNSUPPORTED,
                                "%s: a merged GGUF is written from a GGUF base (its tokenizer and metadata are copied); this "
                                "base is a Hugging Face checkpoint\n  hint: export --format merged into a folder, then convert "
                                "that folder with llama.cpp's convert_hf_to_gguf.py",
                                m->path);
    }
    if (m->cfg.arch != GM_ARCH_GEMMA3)
        return gm_error_set(err, GM_ERR_UNSUPPORTED,
                            "merging into %s models is not implemented yet\n  hint: export --format peft (the default) and "
                            "merge in Python: PeftModel.from_pretrained(base, OUT).merge_and_unload().save_pretrained(...)",
                            gm_arch_name(m->cfg.arch));
    /* a multimodal base keeps its tower (the whole Gemma3ForConditionalGeneration); one whose
     * files hold no tower (stripped: gm_model_load reads it as a text model) is written as the
     * text model it is, its config without the vision_config */
    const bool mm = format == GM_MERGED_HF && m->vision;
    gm_config cfg = m->cfg;
    if (!mm) memset(&cfg.vision, 0, sizeof cfg.vision);
    char part[4200];
    if (format == GM_MERGED_HF) GM_TRY(start_hf_out(out, part, sizeof part, err));
    out_list o = {0};
    gm_status s = collect(m, lo, be, format, dtype, mm ? &MM_NAMES : &TEXT_NAMES, &o, &info->n_merged, err);
    if (s == GM_OK && mm) {
        const tower_src src = {.tower = m->vision, .ad = vision, .be = be};
        s = add_tower(&m->vision->cfg, &src, dtype, &o, &info->n_tower_merged, &info->projector, err);
        info->n_merged += info->n_tower_merged;
        info->multimodal = true;
    }
    if (s == GM_OK) s = format == GM_MERGED_HF ? save_hf(m, &cfg, &o, dtype, part, info, err) : save_gguf(m, &o, dtype, out, info, err);
    info->n_tensors = o.n;
    info->bytes = o.bytes;
    out_free(&o);
    if (format == GM_MERGED_HF) s = finish_hf_out(s, out, part, err);
    return s;
}

/* ---- a text model with a new vision tower -------------------------------------------------- */

/* The id of special token `text` in m's vocabulary, else `fallback`. */
static int32_t special_id(const gm_model *m, const char *text, int32_t fallback) {
    int32_t id = m->tok ? gm_tokenizer_find(m->tok, text, strlen(text)) : -1;
    return id >= 0 ? id : fallback;
}

gm_status gm_model_save_with_tower(const gm_model *m, const gm_vision_config *vision, uint64_t seed, gm_dtype dtype,
                                   const char *out, gm_merged_info *info, gm_error *err) {
    gm_merged_info dummy;
    if (!info) info = &dummy;
    memset(info, 0, sizeof *info);
    if (m->cfg.arch != GM_ARCH_GEMMA3)
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: a vision tower is attached to Gemma 3 text models; this is %s", m->path,
                            gm_arch_name(m->cfg.arch));
    if (m->vision || m->cfg.vision.hidden_size > 0)
        return gm_error_set(err, GM_ERR_INVALID, "%s already has a vision tower: use it as it is", m->path);
    if (!m->tok)
        return gm_error_set(err, GM_ERR_INVALID, "%s: the text model has no tokenizer (its <start_of_image> is needed)", m->path);
    GM_TRY(check_hf_out(m, dtype, out, err));
    /* the multimodal config: the decoder's, with the tower; the image markers are the vocabulary's
     * own <start_of_image> / <end_of_image> (Gemma 3's 255999 / 256000, in every Gemma 3 tokenizer);
     * the soft token's id may lie outside the vocabulary (the 270M has 262,144 entries, the id is
     * 262144): its rows are never embedded, as transformers replaces them before embedding */
    gm_config mm = m->cfg, tc;
    mm.vision = *vision;
    gm_vision_config *v = &mm.vision;
    if (v->layer_norm_eps <= 0) v->layer_norm_eps = 1e-6f;
    v->boi_id = special_id(m, "<start_of_image>", -1);
    v->eoi_id = special_id(m, "<end_of_image>", -1);
    v->image_token_id = special_id(m, "<image_soft_token>", 262144);
    if (v->boi_id < 0 || v->eoi_id < 0)
        return gm_error_set(err, GM_ERR_INVALID, "%s: the vocabulary has no <start_of_image> / <end_of_image> token", m->path);
    if (v->patch_size > 0 && v->image_size > 0) v->patches = (v->image_size / v->patch_size) * (v->image_size / v->patch_size);
    v->out_hidden_size = mm.hidden_size;
    GM_TRY(gm_config_vision_tower(&mm, &tc, err));
    v->params = 0; /* a planning figure, counted again when the folder is read */
    char part[4200];
    GM_TRY(start_hf_out(out, part, sizeof part, err));
    out_list o = {0};
    gm_status s = collect(m, NULL, NULL, GM_MERGED_HF, dtype, &MM_NAMES, &o, &info->n_merged, err);
    const tower_src src = {.seed = seed};
    bool proj = false;
    if (s == GM_OK) s = add_tower(&tc, &src, dtype, &o, &info->n_merged, &proj, err);
    if (s == GM_OK) s = save_hf(m, &mm, &o, dtype, part, info, err);
    info->n_tensors = o.n;
    info->bytes = o.bytes;
    out_free(&o);
    return finish_hf_out(s, out, part, err);
}

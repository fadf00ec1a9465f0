/*
 * gm_weights.c - a model's weights on a backend, in the run's format, by walking the
 * architecture's spec (see gm_weights.h).
 *
 * Per weight, one of three things happens (the same in the measuring and the committed pass):
 *   - alias: the format leaves it as stored and the backend is host-visible: the view is the
 *     model's (no arena bytes; alias_bytes counts what becomes resident from the file);
 *   - re-encode: a linear whose format differs from its stored dtype: gm_quant_reserve sizes it,
 *     gm_quant_encode fills it - directly in the arena on a host-visible backend, else in a host
 *     staging block that is then uploaded;
 *   - upload: on a backend the host cannot address, every other weight is reserved with its
 *     stored size and copied in.
 */
#include "gm_weights.h"

#include "gm_alloc.h"
#include "gm_mmap.h"  /* gm_mmap_release */
#include "gm_model.h"

#include <string.h>

gm_status gm_weights_init(gm_weights *w, const gm_config *cfg, gm_quant q, gm_error *err) {
    memset(w, 0, sizeof *w);
    w->arch = gm_arch_get(cfg->arch);
    if (!w->arch)
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s models have no forward in gemmarun yet (presets and memory plans only)",
                            gm_arch_name(cfg->arch));
    if ((unsigned)q >= GM_QUANT_COUNT)
        return gm_error_set(err, GM_ERR_INVALID, "invalid base weight format %d; allowed: stored, f32, bf16, nf4, int8", (int)q);
    w->cfg = cfg;
    w->quant = q;
    w->n_layers = cfg->n_layers;
    w->n_slots = w->arch->n_layer;
    w->layer = gm_calloc((size_t)(w->n_layers * w->n_slots), sizeof *w->layer);
    if (!w->layer) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    return GM_OK;
}

void gm_weights_free(gm_weights *w) {
    if (!w) return;
    gm_free(w->layer);
    w->layer = NULL;
}

/* The buffers of a view and their sizes: data, and for NF4 / int8 their statistics. */
static int view_parts(const gm_wview *v, const void *part[3], size_t bytes[3]) {
    int n = 0;
    if (v->type == GM_NF4) {
        gm_nf4_sizes s = gm_nf4_sizes_of(v->rows * v->cols);
        part[n] = v->data, bytes[n++] = s.packed_bytes;
        part[n] = v->absmax_code, bytes[n++] = (size_t)s.n_blocks;
        part[n] = v->absmax2, bytes[n++] = (size_t)s.n_groups * 4;
        return n;
    }
    part[n] = v->data, bytes[n++] = (size_t)v->rows * v->row_bytes;
    if (v->type == GM_I8) part[n] = v->row_scale, bytes[n++] = (size_t)v->rows * 4;
    return n;
}

/* Reserves a copy of src's storage (same type and shape) on arena a; committed: uploads it. */
static void upload_copy(const gm_wview *src, gm_wview *dst, gm_backend *be, gm_arena *a) {
    const void *part[3];
    size_t bytes[3];
    int n = view_parts(src, part, bytes);
    *dst = *src;
    void *to[3] = {NULL, NULL, NULL};
    for (int i = 0; i < n; i++) to[i] = gm_arena_alloc(a, bytes[i], GM_MEM_WEIGHTS);
    dst->data = to[0];
    if (src->type == GM_NF4) dst->absmax_code = to[1], dst->absmax2 = to[2];
    if (src->type == GM_I8) dst->row_scale = to[1];
    if (a->committed && src->data)
        for (int i = 0; i < n; i++) gm_backend_upload(be, to[i], part[i], bytes[i]);
}

/* Re-encodes one linear into format q on arena a (see the file comment). */
static gm_status reencode(const gm_wview *src, gm_wview *dst, gm_quant q, bool host, gm_backend *be, gm_arena *a,
                          gm_quant_work *work, bool release, gm_error *err) {
    if (host || !a->committed) {
        gm_quant_reserve(q, src->rows, src->cols, a, dst);
        if (a->committed && src->data) gm_quant_encode(src, dst, work);
    } else {
        /* encode into a host block laid out like the arena's, then upload it part by part */
        gm_arena stage;
        gm_wview hv;
        gm_arena_init(&stage, "weight staging", GM_DEVICE_CPU);
        gm_quant_reserve(q, src->rows, src->cols, &stage, &hv);
        GM_TRY(gm_arena_commit(&stage, err));
        gm_quant_reserve(q, src->rows, src->cols, &stage, &hv);
        gm_quant_encode(src, &hv, work);
        upload_copy(&hv, dst, be, a);
        gm_arena_free(&stage);
    }
    if (release && a->committed && src->data) gm_mmap_release(src->data, (size_t)src->rows * src->row_bytes);
    return GM_OK;
}

/* The planned view of a weight when there is no model: its stored type and shape, no data. */
static gm_wview planned_view(const gm_weight_spec *s, const gm_config *c, int64_t l, gm_dtype stored, gm_dtype stored_embed) {
    gm_wview v;
    memset(&v, 0, sizeof v);
    int64_t rows = gm_dim_value(c, l, s->rows, 0), cols = s->cols == GM_DIM_NONE ? rows : gm_dim_value(c, l, s->cols, 0);
    v.type = s->kind == GM_W_NORM || s->kind == GM_W_VEC || s->transposed ? GM_F32 : s->kind == GM_W_EMBED ? stored_embed : stored;
    v.rows = s->cols == GM_DIM_NONE ? 1 : rows;
    v.cols = cols;
    /* a planned type need not tile the row (a GGUF's dominant block type stands for the mix the
     * file really uses): whole blocks, rounded up */
    const gm_dtype_info *d = gm_dtype_get(v.type);
    v.row_bytes = (size_t)((cols + d->block_size - 1) / d->block_size) * d->type_size;
    return v;
}

static size_t view_bytes(const gm_wview *v) {
    const void *part[3];
    size_t bytes[3], t = 0;
    int n = view_parts(v, part, bytes);
    for (int i = 0; i < n; i++) t += bytes[i];
    return t;
}

/* A stack of expert matrices that stays as stored: under NF4, when one expert's matrix does not
 * start its statistics groups afresh (gm_arch.h: gm_weight_spec.stacked). */
static bool stack_kept(const gm_weights *w, const gm_weight_spec *s, const gm_wview *v) {
    if (!s->stacked || w->quant != GM_QUANT_NF4 || w->cfg->n_experts < 1) return false;
    return ((v->rows / w->cfg->n_experts) * v->cols) % GM_NF4_ROWS_ALIGN != 0;
}

/* Places one weight (alias, re-encode or upload). */
static gm_status place(gm_weights *w, const gm_weight_spec *s, const gm_wview *src, gm_wview *dst, bool host,
                       gm_backend *be, gm_arena *a, gm_quant_work *work, bool from_model, gm_error *err) {
    if (s->kind == GM_W_LINEAR && !stack_kept(w, s, src) && !gm_quant_is_alias(w->quant, src->type)) {
        size_t used = a->used;
        GM_TRY(reencode(src, dst, w->quant, host, be, a, work, from_model, err));
        w->kind_bytes[s->kind] += a->used - used;
        return GM_OK;
    }
    size_t bytes = view_bytes(src);
    /* a table read by rows only becomes resident where the run's ids read it */
    if (host && s->rows == GM_DIM_PV && w->row_table_resident > 0 && w->row_table_resident < bytes) bytes = w->row_table_resident;
    w->kind_bytes[s->kind] += bytes;
    if (host) {
        *dst = *src;
        w->alias_bytes += bytes;
        return GM_OK;
    }
    upload_copy(src, dst, be, a);
    return GM_OK;
}

gm_status gm_weights_layout(gm_weights *w, const gm_model *m, gm_dtype stored, gm_dtype stored_embed, gm_backend *be,
                            gm_arena *a, int n_threads, gm_error *err) {
    const gm_arch_def *ar = w->arch;
    const gm_config *c = w->cfg;
    bool host = !be || be->host_visible;
    w->alias_bytes = 0;
    memset(w->kind_bytes, 0, sizeof w->kind_bytes);
    /* transient host buffers for re-encoding, sized for the largest matrix, before the arena is
     * touched */
    gm_quant_work work;
    gm_quant_work_init(&work, w->quant, n_threads);
    bool encode = a->committed && m && w->quant != GM_QUANT_STORED;
    if (encode) {
        for (int64_t l = 0; l < c->n_layers; l++)
            for (int s = 0; s < ar->n_layer; s++) {
                const gm_tensor *t = gm_model_weight(m, l, s);
                gm_wview v = gm_wview_of(t);
                if (ar->layer[s].kind == GM_W_LINEAR && t->data && !stack_kept(w, &ar->layer[s], &v) &&
                    !gm_quant_is_alias(w->quant, t->dtype))
                    gm_quant_work_size(&work, t->shape[0], t->shape[1]);
            }
        GM_TRY(gm_quant_work_alloc(&work, err));
    }
    gm_status st = GM_OK;
    for (int gi = 0; gi < ar->n_globals && st == GM_OK; gi++) {
        const gm_weight_spec *s = &ar->globals[gi];
        if (gi == GM_GLOBAL_LM_HEAD && c->tie_word_embeddings) continue; /* below */
        if (!gm_weight_present(s, c, -1)) {
            memset(&w->global[gi], 0, sizeof w->global[gi]);
            continue;
        }
        gm_wview src = m ? gm_wview_of(&m->global[gi]) : planned_view(s, c, -1, stored, stored_embed);
        st = place(w, s, &src, &w->global[gi], host, be, a, &work, m != NULL, err);
    }
    if (c->tie_word_embeddings) w->global[GM_GLOBAL_LM_HEAD] = w->global[GM_GLOBAL_EMBED];
    for (int64_t l = 0; l < c->n_layers && st == GM_OK; l++)
        for (int s = 0; s < ar->n_layer && st == GM_OK; s++) {
            const gm_weight_spec *sp = &ar->layer[s];
            gm_wview *dst = &w->layer[l * w->n_slots + s];
            if (!gm_weight_present(sp, c, l)) {
                memset(dst, 0, sizeof *dst);
                continue;
            }
            gm_wview src = m ? gm_wview_of(gm_model_weight(m, l, s)) : planned_view(sp, c, l, stored, stored_embed);
            st = place(w, sp, &src, dst, host, be, a, &work, m != NULL, err);
        }
    if (encode) gm_quant_work_free(&work);
    return st;
}

/* The largest of what each linear weight but the LM head needs (the model-level ones, e.g. Gemma
 * 3n's projections, and every layer's): `bf16` ? bf16 staging elements for M rows
 * (gm_k_matmul_bf16_staging_elems) : matmul scratch floats with n threads. */
static size_t max_over_linears(const gm_weights *w, bool bf16, int64_t n) {
    size_t s = 0, t;
    for (int64_t l = -1; l < w->n_layers; l++)
        for (int k = 0; k < (l < 0 ? w->arch->n_globals : w->n_slots); k++) {
            const gm_wview *v = l < 0 ? &w->global[k] : gm_weights_at(w, l, k);
            gm_wkind kind = l < 0 ? w->arch->globals[k].kind : w->arch->layer[k].kind;
            if ((l < 0 && k == GM_GLOBAL_LM_HEAD) || kind != GM_W_LINEAR || v->rows == 0) continue;
            t = bf16 ? gm_k_matmul_bf16_staging_elems(v->type, v->rows, v->cols, n)
                     : gm_k_matmul_scratch_floats(v->type, v->rows, v->cols, (int)n);
            if (t > s) s = t;
        }
    return s;
}

size_t gm_weights_bf16_staging_elems(const gm_weights *w, int64_t M, int64_t lm_vocab, int64_t lm_m) {
    const gm_config *c = w->cfg;
    const gm_wview *E = &w->global[GM_GLOBAL_LM_HEAD];
    int64_t vc = lm_vocab < c->vocab_size ? lm_vocab : c->vocab_size;
    size_t s = lm_m > 0 && E->rows > 0 ? gm_k_matmul_bf16_staging_elems(E->type, vc, c->hidden_size, lm_m) : 0;
    size_t t = max_over_linears(w, true, M);
    return t > s ? t : s;
}

size_t gm_weights_scratch_floats(const gm_weights *w, int64_t lm_rows, int n_threads) {
    const gm_config *c = w->cfg;
    const gm_wview *E = &w->global[GM_GLOBAL_LM_HEAD];
    int64_t rows = lm_rows < c->vocab_size ? lm_rows : c->vocab_size;
    size_t s = gm_k_matmul_scratch_floats(E->type, rows, c->hidden_size, n_threads);
    size_t t = max_over_linears(w, false, n_threads);
    return t > s ? t : s;
}

/*
 * gm_mm_embed.c - Gemma 3n's hard multimodal tokens (gm_mm_embed.h).
 */
#include "gm_mm_embed.h"

#include "gm_alloc.h"
#include "gm_dtype.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

gm_status gm_mm_tensor(const gm_model *m, const char *module, const char *name, int nd, const int64_t *shape,
                       const gm_st_tensor **out, gm_error *err) {
    char full[256];
    const gm_st_tensor *t = NULL;
    const char *roots[2] = {"model.", ""};
    for (int i = 0; i < 2 && !t; i++) {
        snprintf(full, sizeof full, "%s%s%s", roots[i], module, name);
        t = m->st ? gm_safetensors_find(m->st, full) : NULL;
    }
    if (!t)
        return gm_error_set(err, GM_ERR_NOT_FOUND, "%s: tensor 'model.%s%s' is missing\n  hint: Gemma 3n's audio and "
                            "multimodal tokens need a complete Gemma3nForConditionalGeneration checkpoint", m->path, module, name);
    if (t->dtype != GM_F32 && t->dtype != GM_BF16 && t->dtype != GM_F16)
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: tensor '%s' is %s; towers are read in f32, bf16 or f16", m->path,
                            full, gm_dtype_name(t->dtype));
    bool ok = t->ndim == nd;
    for (int i = 0; ok && i < nd; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char want[96] = "", got[96] = "";
        for (int i = 0; i < nd; i++) snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? ", " : "", (long long)shape[i]);
        for (int i = 0; i < t->ndim; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        return gm_error_set(err, GM_ERR_FORMAT, "%s: tensor '%s' has shape (%s); the config needs (%s)", m->path, full, got,
                            want);
    }
    *out = t;
    return GM_OK;
}

/* x (n) /= sqrt(mean(x^2) + eps), times w when given (Gemma3nRMSNorm, statistics in double). */
static void rms(float *x, int64_t n, const float *w, float eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    double r = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(x[i] * r) * (w ? w[i] : 1.0f);
}

/* One embedder's table: module "embed_vision." / "embed_audio." of width D. */
static gm_status table_of(const gm_model *m, const char *module, int64_t V, int64_t D, float eps, float *out,
                          gm_error *err) {
    int64_t C = m->cfg.hidden_size, sE[2] = {V, D}, sN[1] = {D}, sP[2] = {C, D};
    const gm_st_tensor *te, *tn, *tp;
    GM_TRY(gm_mm_tensor(m, module, "embedding.weight", 2, sE, &te, err));
    GM_TRY(gm_mm_tensor(m, module, "hard_embedding_norm.weight", 1, sN, &tn, err));
    GM_TRY(gm_mm_tensor(m, module, "embedding_projection.weight", 2, sP, &tp, err));
    float *e = gm_malloc((size_t)(V * D + D + C * D) * sizeof(float));
    if (!e) return gm_error_set(err, GM_ERR_NOMEM, "out of memory (the %s table)", module);
    float *nw = e + V * D, *p = nw + D;
    gm_dequant_row(te->dtype, te->data, e, V * D);
    gm_dequant_row(tn->dtype, tn->data, nw, D);
    gm_dequant_row(tp->dtype, tp->data, p, C * D);
    for (int64_t v = 0; v < V; v++) {
        float *row = e + v * D, *o = out + v * C;
        rms(row, D, nw, eps);
        for (int64_t c = 0; c < C; c++) {
            double a = 0;
            for (int64_t d = 0; d < D; d++) a += (double)row[d] * p[c * D + d];
            o[c] = (float)a;
        }
        rms(o, C, NULL, eps);
    }
    gm_free(e);
    return GM_OK;
}

gm_status gm_mm_hard_load(const gm_model *m, gm_mm_hard *out, gm_error *err) {
    memset(out, 0, sizeof *out);
    const gm_config *c = &m->cfg;
    out->C = c->hidden_size;
    if (c->arch != GM_ARCH_GEMMA3N) return GM_OK;
    struct {
        const char *module;
        int64_t offset, V, D;
        float eps;
        int32_t soft;
    } want[2] = {{"embed_vision.", c->vision.hard_offset, c->vision.hard_vocab, c->vision.hidden_size,
                  c->vision.layer_norm_eps, c->vision.image_token_id},
                 {"embed_audio.", c->audio.vocab_offset, c->audio.vocab_size, c->audio.hidden_size, c->audio.rms_eps,
                  c->audio.audio_token_id}};
    gm_mm_hard h = {.C = out->C};
    for (int i = 0; i < 2; i++) {
        /* a range no token id reaches (ids past the text vocabulary: a config whose towers are
         * another model's, e.g. tests/ref/tiny_gemma3n_mm's defaults beside a 512-token text model)
         * has nothing to embed */
        if (want[i].V <= 0 || want[i].D <= 0 || want[i].offset >= c->vocab_size) continue;
        float *t = gm_malloc((size_t)(want[i].V * h.C) * sizeof(float));
        if (!t) {
            gm_mm_hard_free(&h);
            return gm_error_set(err, GM_ERR_NOMEM, "out of memory (hard multimodal tokens)");
        }
        gm_status s = table_of(m, want[i].module, want[i].V, want[i].D, want[i].eps, t, err);
        if (s != GM_OK) {
            gm_free(t);
            gm_mm_hard_free(&h);
            return s;
        }
        h.r[h.n++] = (gm_mm_hard_range){want[i].offset, want[i].V, want[i].soft, t};
    }
    *out = h;
    return GM_OK;
}

void gm_mm_hard_free(gm_mm_hard *h) {
    if (!h) return;
    for (int i = 0; i < h->n; i++) gm_free(h->r[i].table);
    memset(h, 0, sizeof *h);
}

const float *gm_mm_hard_row(const gm_mm_hard *h, int32_t id) {
    for (int i = 0; i < h->n; i++)
        if (id >= h->r[i].offset && id < h->r[i].offset + h->r[i].V) return h->r[i].table + (id - h->r[i].offset) * h->C;
    return NULL;
}

int64_t gm_mm_hard_place(const gm_mm_hard *h, const int32_t *ids, int64_t N, const float **ptrs, int64_t *rows, int64_t cap) {
    int64_t n = 0;
    for (int64_t i = 0; i < N && n < cap; i++) {
        const float *r = gm_mm_hard_row(h, ids[i]);
        bool soft = false;
        for (int j = 0; j < h->n; j++) soft |= ids[i] == h->r[j].soft_id;
        if (!r || soft) continue;
        ptrs[n] = r;
        rows[n++] = i;
    }
    return n;
}

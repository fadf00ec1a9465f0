/*
 * gm_audio_encoder.c - Gemma 3n's audio encoder and embedder, forward (formulas in
 * gm_audio_encoder.h; transformers' modeling_gemma3n.py, gemma_architecture.md §3.8-3.9).
 *
 * Layout (one arena on the backend, one host staging arena), all sizes from the config, so a plan
 * (m == NULL) is the same walk: the weights (linears aliased in place on a host-visible backend,
 * reserved and uploaded otherwise; the blocks' into the graph's views), the adapters, the graph,
 * the activations around it for max_clips x max_frames frames; then, on the filling pass, the
 * derived tables (q scales, projected relative positions, the padding token's embedding).
 */
#include "gm_audio_encoder.h"

#include "gm_audio.h" /* gm_audio_frames, the extractor constants */

#include "gm_alloc.h"
#include "gm_arch.h"
#include "conformer.h"
#include "gm_dtype.h"
#include "gm_mm_embed.h"
#include "gm_model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The feature extractor's frame count (gm_audio.h): here, in a file built without audio in's
 * libraries, because the planner needs it wherever gemmarun is built. */
void gm_audio_frames(int64_t max_len, int64_t *padded_len, int64_t *T) {
    int64_t L = max_len < 0 ? 0 : max_len > GM_AUDIO_MAX_SAMPLES ? GM_AUDIO_MAX_SAMPLES : max_len;
    /* _pad: rounded up only when not already a multiple (0 stays 0) */
    if (L % GM_AUDIO_PAD_MULTIPLE != 0) L = (L / GM_AUDIO_PAD_MULTIPLE + 1) * GM_AUDIO_PAD_MULTIPLE;
    if (padded_len) *padded_len = L;
    /* _unfold: frames of frame_length + 1 = 513 samples every 160 */
    if (T) *T = L >= GM_AUDIO_FRAME + 1 ? (L - (GM_AUDIO_FRAME + 1)) / GM_AUDIO_HOP + 1 : 0;
}

void gm_audio_encoder_frames(const gm_audio_config *c, int64_t T, int64_t *T2, int64_t *T3) {
    int64_t t = T;
    for (int i = 0; i < 2; i++) t = t > 0 ? (t - 1) / c->sscp_stride[i][0] + 1 : 0;
    if (T2) *T2 = t;
    if (T3) *T3 = c->reduction > 0 ? (t + c->reduction - 1) / c->reduction : t;
}

int64_t gm_audio_tokens(const gm_config *c, int64_t samples) {
    if (c->arch != GM_ARCH_GEMMA4) return c->audio.soft_tokens;
    int64_t s = samples < GM_AUDIO_MAX_SAMPLES ? samples : GM_AUDIO_MAX_SAMPLES;
    int64_t n = s >= GM_AUDIO4_FRAME + 1 - GM_AUDIO4_LEFT_PAD ? (s - (GM_AUDIO4_FRAME + 1 - GM_AUDIO4_LEFT_PAD)) / GM_AUDIO4_HOP + 1 : 0;
    int64_t t = ((n + 1) / 2 + 1) / 2;
    return t < c->audio.soft_tokens ? t : c->audio.soft_tokens;
}

static gm_status dims_of(const gm_config *mc, gm_audio_encoder_dims *d, gm_error *err) {
    const gm_audio_config *c = &mc->audio;
    if (c->hidden_size <= 0 || c->n_layers <= 0 || c->n_mels <= 0)
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "the model has no audio encoder (its config.json has no audio_config)\n"
                            "  hint: audio needs a Gemma 3n or Gemma 4 E checkpoint of ...ForConditionalGeneration (e.g. "
                            "gemma-3n-E2B-it, gemma-4-E2B-it)");
    memset(d, 0, sizeof *d);
    d->M = c->n_mels;
    d->C0 = c->sscp_channels[0], d->C1 = c->sscp_channels[1];
    int64_t f = d->M;
    for (int i = 0; i < 2; i++) {
        f = (f + 2 - c->sscp_kernel[i][1]) / c->sscp_stride[i][1] + 1; /* frequency padded by 1 on each side */
        if (f < 1)
            return gm_error_set(err, GM_ERR_UNSUPPORTED, "audio_config: %lld mel bins leave no frequency bin after "
                                "sub-sampling convolution %d", (long long)d->M, i);
        if (i == 0) d->F1 = f;
        else d->F2 = f;
    }
    d->D = c->hidden_size, d->H = c->n_heads;
    if (d->H <= 0 || d->D % d->H != 0 || d->D % 2 != 0)
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "audio_config: hidden_size %lld is not an even multiple of "
                            "conf_num_attention_heads %lld", (long long)d->D, (long long)d->H);
    d->Dh = d->D / d->H, d->FF = 4 * d->D;
    d->W = c->chunk, d->K = c->conv_kernel;
    gm_conformer_window(c, mc->arch == GM_ARCH_GEMMA4, &d->L, &d->R);
    if (d->L + d->R + 1 > GM_K_AUDIO_SPAN_MAX)
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "audio_config: an attention context of %lld frames back and %lld "
                            "ahead is wider than gemmarun's %d", (long long)d->L, (long long)d->R, GM_K_AUDIO_SPAN_MAX);
    d->red = c->reduction;
    d->C_text = mc->hidden_size;
    d->soft_tokens = c->soft_tokens;
    d->V = c->vocab_size;
    d->Dout = c->out_dims > 0 ? c->out_dims : d->D;
    return GM_OK;
}

/* ---- layout ---------------------------------------------------------------------------------- */

typedef struct lay {
    gm_audio_encoder *e;
    gm_arena *a;
    bool fill;           /* the committed pass of a loaded model: read the weights */
    float *stage;        /* host staging for conversions (fill) */
    gm_error *err;
} lay;

static float *alloc_f(lay *l, int64_t n, gm_mem_kind kind) {
    return gm_arena_alloc(l->a, (size_t)(n > 0 ? n : 1) * sizeof(float), kind);
}

/* An f32 weight of n elements: reserved, and on the fill pass read (converted) and uploaded. */
static gm_status vec(lay *l, const char *module, const char *name, int nd, const int64_t *shape, float **dst) {
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    *dst = alloc_f(l, n, GM_MEM_WEIGHTS);
    if (!l->fill) return GM_OK;
    const gm_st_tensor *t;
    GM_TRY(gm_mm_tensor(l->e->m, module, name, nd, shape, &t, l->err));
    gm_dequant_row(t->dtype, t->data, l->stage, n);
    gm_backend_upload(l->e->be, *dst, l->stage, (size_t)n * sizeof(float));
    return GM_OK;
}

/* A linear (rows x cols) as stored: aliased in place on a host-visible backend, else reserved
 * (at the stored dtype; a plan: bf16, as the hub's files) and uploaded. */
static gm_status linear(lay *l, const char *module, const char *name, int64_t rows, int64_t cols, gm_wview *w) {
    gm_audio_encoder *e = l->e;
    const gm_st_tensor *t = NULL;
    int64_t shape[2] = {rows, cols};
    gm_dtype dt = e->stored;
    if (e->m) {
        GM_TRY(gm_mm_tensor(e->m, module, name, 2, shape, &t, l->err));
        dt = t->dtype;
    }
    size_t rb = gm_dtype_row_bytes(dt, cols);
    /* read in place on a host-visible backend (a plan without one assumes so, as gm_weights does):
     * resident pages of the mapping, counted in alias_bytes, not in the arena */
    bool alias = e->be ? e->be->host_visible : true;
    void *p = alias ? NULL : gm_arena_alloc(l->a, rb * (size_t)rows, GM_MEM_WEIGHTS);
    if (alias && l->a->base == NULL) e->alias_bytes += rb * (size_t)rows; /* counted once: on the measuring pass */
    memset(w, 0, sizeof *w);
    w->type = dt, w->row_bytes = rb, w->rows = rows, w->cols = cols;
    if (alias && t) w->data = t->data;
    else if (p) {
        w->data = p;
        if (l->fill) gm_backend_upload(e->be, p, t->data, rb * (size_t)rows);
    }
    return GM_OK;
}

/* The graph's view of block i's slot s. */
static gm_wview *slot(gm_audio_encoder *e, int64_t i, int s) { return &e->w.layer[i * e->w.n_slots + s]; }

/* Block i's weights, walking its architecture's spec (core/arch/gemma3n_audio.c, gemma4_audio.c):
 * linears as stored, the rest as f32 (1, n) views; the relative-position projection kept aside
 * (pos_proj[i]) with the table derived from it in its slot. */
static gm_status block_layout(lay *l, int64_t i) {
    gm_audio_encoder *e = l->e;
    const gm_audio_encoder_dims *d = &e->d;
    const gm_arch_def *ar = e->w.arch;
    char mod[64];
    snprintf(mod, sizeof mod, "audio_tower.%s%lld.", ar->layers_prefix, (long long)i);
    for (int s = 0; s < ar->n_layer; s++) {
        const gm_weight_spec *w = &ar->layer[s];
        if (!gm_weight_present(w, &e->tcfg, i)) continue;
        if (s == CF_W_POS) {
            GM_TRY(linear(l, mod, w->hf, d->D, d->D, &e->pos_proj[i]));
            int64_t span = d->L + d->R + 1;
            *slot(e, i, s) = gm_wview_f32(alloc_f(l, span * d->D, GM_MEM_WEIGHTS), span, d->D);
        } else if (w->kind == GM_W_LINEAR) {
            GM_TRY(linear(l, mod, w->hf, gm_dim_value(&e->tcfg, i, w->rows, 0), gm_dim_value(&e->tcfg, i, w->cols, 0),
                          slot(e, i, s)));
        } else {
            /* the depthwise kernel (C, 1, K), the per-dim scale (Dh), a clamp bound (a 0-d scalar), a norm (D) */
            int64_t shape[3] = {d->D, 1, d->K}, n = d->D * d->K;
            int nd = 3;
            if (s == CF_W_QSCALE) shape[0] = n = d->Dh, nd = 1;
            else if (s >= CF_W_CLIP0) n = 1, nd = 0;
            else if (s != CF_W_L_CONV) n = d->D, nd = 1;
            float *p;
            GM_TRY(vec(l, mod, w->hf, nd, shape, &p));
            *slot(e, i, s) = gm_wview_f32(p, 1, n);
        }
    }
    return GM_OK;
}

/* The fill pass's derived tables of block i: the q scale (from per_dim_scale, in place) and the
 * relative-position table (timing signal x pos_proj^T). */
static void block_derive(lay *l, int64_t i) {
    gm_audio_encoder *e = l->e;
    const gm_audio_encoder_dims *d = &e->d;
    float *qsc = (float *)slot(e, i, CF_W_QSCALE)->data;
    float *pos = (float *)slot(e, i, CF_W_POS)->data;
    /* q_scale: Dh^-0.5 / softplus(0) (Gemma3nAudioAttention.q_scale; Gemma4AudioAttention's
     * Dh^-0.5 / log(2) is the same number), f32, x softplus(per_dim_scale) */
    float qs = (float)(pow((double)d->Dh, -0.5) * (double)(1.0f / log1pf(1.0f)));
    float *s = l->stage;
    gm_backend_download(e->be, s, qsc, (size_t)d->Dh * sizeof(float));
    for (int64_t j = 0; j < d->Dh; j++) s[j] = qs * (s[j] > 20.0f ? s[j] : log1pf(expf(s[j])));
    gm_backend_upload(e->be, qsc, s, (size_t)d->Dh * sizeof(float));
    /* timing signal [sin(p inv_i), cos(p inv_i)], inv_i = exp(-i log(1e4) / max(D/2 - 1, 1)) in
     * f32, of the position each row f of the table stands for (the key f - L frames from the
     * query, kernels.h audio_attention_fwd; L, R: gm_conformer_window):
     *  Gemma 3n (Gemma3nAudioRelativePositionEmbedding): L - f, the positions L, L-1, .., -R;
     *  Gemma 4 (Gemma4AudioRelPositionalEncoding): its table has the positions P, .., 0,
     *    P = (chunk + context_left - 1 + context_right) / 2, and Gemma4AudioAttention._rel_shift
     *    (appendix B of Transformer-XL) gives the key at s its row s - t + context_left - 1
     *    = f + 1 (its window is one frame narrower than its context: gm_conformer_window), zero
     *    padding past the table: position P - 1 - f while f + 1 <= P. The real checkpoints have
     *    chunk 12, context_left 13, context_right 0: P = 12 and the key d frames back gets position
     *    d, as on Gemma 3n; other shapes get what transformers computes for them. */
    int64_t nt = d->D / 2, span = d->L + d->R + 1;
    int64_t P = e->g4 ? (e->cfg.chunk + e->cfg.context_left - 1 + e->cfg.context_right) / 2 - 1 : d->L;
    float inc = (float)(log(1.0e4) / (double)(nt - 1 > 1 ? nt - 1 : 1));
    for (int64_t f = 0; f < span; f++) {
        float p = (float)(P - f);
        bool zero = e->g4 && f > P; /* Gemma 4: past its table */
        for (int64_t j = 0; j < nt; j++) {
            float st = p * expf((float)j * -inc);
            s[f * d->D + j] = zero ? 0.0f : sinf(st);
            s[f * d->D + nt + j] = zero ? 0.0f : cosf(st);
        }
    }
    gm_backend_upload(e->be, e->x_in, s, (size_t)(span * d->D) * sizeof(float));
    gm_kctx ctx = gm_backend_kctx(e->be, e->scratch, e->scratch_floats);
    e->be->k->matmul_fwd(&ctx, pos, e->x_in, &e->pos_proj[i], span, 0.0f);
}

gm_status gm_audio_encoder_layout(gm_audio_encoder *e, gm_arena *a, gm_arena *host, gm_error *err) {
    const gm_audio_encoder_dims *d = &e->d;
    const gm_audio_config *c = &e->cfg;
    lay l = {e, a, a->base != NULL && e->m != NULL, NULL, err};
    int64_t Bmax = e->max_clips, T = e->max_frames, T1 = (T - 1) / c->sscp_stride[0][0] + 1, T2, T3;
    gm_audio_encoder_frames(c, T, &T2, &T3);
    int64_t N2 = Bmax * T2, N3 = Bmax * T3, span = d->L + d->R + 1;
    /* host staging: masks, row indices, and the conversion buffer (the largest f32 weight or table
     * converted on the host) */
    int64_t stage = d->D;
    int64_t conv1 = d->C1 * d->C0 * c->sscp_kernel[1][0] * c->sscp_kernel[1][1];
    if (conv1 > stage) stage = conv1;
    if (span * d->D > stage) stage = span * d->D;
    l.stage = gm_arena_alloc(host, (size_t)stage * sizeof(float), GM_MEM_WORKSPACE);
    e->h_valid2 = gm_arena_alloc(host, (size_t)N2, GM_MEM_WORKSPACE);
    e->h_valid3 = gm_arena_alloc(host, (size_t)N3, GM_MEM_WORKSPACE);
    e->h_rows = gm_arena_alloc(host, (size_t)N3 * sizeof(int32_t), GM_MEM_WORKSPACE);
    if (e->g4) e->h_valid1 = gm_arena_alloc(host, (size_t)(Bmax * T1), GM_MEM_WORKSPACE);
    /* weights: the sub-sampling, the blocks (into the graph's views), what follows them */
    for (int i = 0; i < 2; i++) {
        char mod[80];
        if (e->g4) snprintf(mod, sizeof mod, "audio_tower.subsample_conv_projection.layer%d.", i);
        else snprintf(mod, sizeof mod, "audio_tower.subsample_conv_projection.conv_%d.", i);
        int64_t ci = i == 0 ? 1 : d->C0, co = i == 0 ? d->C0 : d->C1;
        int64_t ws[4] = {co, ci, c->sscp_kernel[i][0], c->sscp_kernel[i][1]}, gs[1] = {co};
        GM_TRY(vec(&l, mod, "conv.weight", 4, ws, &e->conv_w[i]));
        GM_TRY(vec(&l, mod, "norm.weight", 1, gs, &e->gn_w[i]));
    }
    GM_TRY(linear(&l, "audio_tower.subsample_conv_projection.", "input_proj_linear.weight", d->D, d->F2 * d->C1,
                  &e->input_proj));
    for (int64_t i = 0; i < c->n_layers; i++) GM_TRY(block_layout(&l, i));
    int64_t vD[1] = {d->D}, vO[1] = {d->Dout};
    if (e->g4) {
        GM_TRY(linear(&l, "audio_tower.", "output_proj.weight", d->Dout, d->D, &e->out_proj));
        GM_TRY(vec(&l, "audio_tower.", "output_proj.bias", 1, vO, &e->out_bias));
        e->zeros = alloc_f(&l, d->C0 > d->C1 ? d->C0 : d->C1, GM_MEM_WEIGHTS);
        e->relu_b = alloc_f(&l, 2, GM_MEM_WEIGHTS);
    } else {
        GM_TRY(vec(&l, "embed_audio.", "soft_embedding_norm.weight", 1, vD, &e->soft_norm));
        e->pad = alloc_f(&l, d->C_text, GM_MEM_WEIGHTS);
    }
    GM_TRY(linear(&l, "embed_audio.", "embedding_projection.weight", d->C_text, d->Dout, &e->proj));
    /* the adapters and the blocks' graph */
    if (e->train_tower) gm_lora_layout(&e->lora, a, true);
    gm_graph_layout(&e->g, a, host);
    /* activations around the blocks; Gemma 4's rows after the blocks are the valid frames (at most
     * N2), its soft tokens packed */
    int64_t xin = Bmax * T * d->M, NR = e->g4 ? N2 : N3;
    if (span * d->D > xin) xin = span * d->D;
    e->x_in = alloc_f(&l, xin, GM_MEM_ACTIVATIONS);
    e->c0 = alloc_f(&l, Bmax * T1 * d->F1 * d->C0, GM_MEM_ACTIVATIONS);
    e->c1 = alloc_f(&l, N2 * d->F2 * d->C1, GM_MEM_ACTIVATIONS);
    e->red = alloc_f(&l, NR * d->D, GM_MEM_ACTIVATIONS);
    e->red_n = alloc_f(&l, NR * d->Dout, GM_MEM_ACTIVATIONS);
    e->proj_out = e->g4 ? NULL : alloc_f(&l, N3 * d->C_text, GM_MEM_ACTIVATIONS);
    e->soft = alloc_f(&l, e->g4 ? N2 * d->C_text : Bmax * d->soft_tokens * d->C_text, GM_MEM_ACTIVATIONS);
    e->valid2 = gm_arena_alloc(a, (size_t)N2, GM_MEM_ACTIVATIONS);
    e->valid3 = gm_arena_alloc(a, (size_t)N3, GM_MEM_ACTIVATIONS);
    e->rows = gm_arena_alloc(a, (size_t)N3 * sizeof(int32_t), GM_MEM_ACTIVATIONS);
    if (e->g4) {
        e->outp = alloc_f(&l, N2 * d->Dout, GM_MEM_ACTIVATIONS);
        e->valid0 = gm_arena_alloc(a, (size_t)(Bmax * T), GM_MEM_ACTIVATIONS);
        e->valid1 = gm_arena_alloc(a, (size_t)(Bmax * T1), GM_MEM_ACTIVATIONS);
    }
    e->scratch = alloc_f(&l, (int64_t)e->scratch_floats, GM_MEM_WORKSPACE);
    if (e->train_tower) {
        e->rstd_red = alloc_f(&l, NR, GM_MEM_ACTIVATIONS);
        e->rstd_out = e->g4 ? NULL : alloc_f(&l, N3, GM_MEM_ACTIVATIONS);
        e->dsoft = alloc_f(&l, e->g4 ? N2 * d->C_text : Bmax * d->soft_tokens * d->C_text, GM_MEM_WORKSPACE);
        e->dout = alloc_f(&l, NR * (e->g4 ? d->Dout : d->C_text), GM_MEM_WORKSPACE);
        e->dred = alloc_f(&l, NR * d->D, GM_MEM_WORKSPACE);
        if (e->g4) e->doutp = alloc_f(&l, N2 * d->Dout, GM_MEM_WORKSPACE);
    }
    e->g.row_valid = e->valid2;
    if (l.fill) {
        for (int64_t i = 0; i < c->n_layers; i++) block_derive(&l, i);
        if (e->g4) {
            static const float relu[2] = {0.0f, INFINITY};
            gm_kctx ctx = gm_backend_kctx(e->be, e->scratch, e->scratch_floats);
            e->be->k->fill(&ctx, e->zeros, d->C0 > d->C1 ? d->C0 : d->C1, 0.0f);
            gm_backend_upload(e->be, e->relu_b, relu, sizeof relu);
        } else {
            gm_backend_upload(e->be, e->pad, gm_mm_hard_row(e->hard, (int32_t)(c->vocab_offset + e->pad_id)),
                              (size_t)d->C_text * sizeof(float));
        }
    }
    return GM_OK;
}

/* ---- new / free ------------------------------------------------------------------------------ */

/* The sub-sampling's, the embedder's and the relative-position tables' matmul workspace (the
 * blocks' is the graph's). */
static size_t scratch_of(const gm_audio_encoder *e, int n_threads) {
    const gm_audio_encoder_dims *d = &e->d;
    gm_dtype dt = e->stored;
    if (e->m) {
        const gm_st_tensor *t = NULL;
        gm_error ignore;
        int64_t shape[2] = {d->D, d->F2 * d->C1};
        if (gm_mm_tensor(e->m, "audio_tower.subsample_conv_projection.", "input_proj_linear.weight", 2, shape, &t,
                         &ignore) == GM_OK)
            dt = t->dtype;
    }
    size_t s = 0, x;
    int64_t mats[4][2] = {{d->D, d->D}, {d->D, d->F2 * d->C1}, {d->C_text, d->Dout}, {d->Dout, d->D}};
    for (int i = 0; i < 4; i++)
        if ((x = gm_k_matmul_scratch_floats(dt, mats[i][0], mats[i][1], n_threads)) > s) s = x;
    return s;
}

/* gm_audio_encoder_init_train, or (ad != NULL, lora NULL) an inference encoder running a trained
 * adapter's LoRA on the conformer. */
static gm_status init_any(gm_audio_encoder *e, const gm_config *mm, const gm_model *m, const gm_mm_hard *hard,
                          int64_t max_clips, int64_t max_frames, const gm_lora_config *lora, const gm_lora *ad,
                          bool checkpointing, int n_threads, gm_backend *be, gm_error *err) {
    if (max_clips < 1 || max_frames < 1 || max_clips > (1 << 20) || max_frames > (1 << 24))
        return gm_error_set(err, GM_ERR_INVALID, "audio encoder: %lld clips of %lld frames: both must be positive",
                            (long long)max_clips, (long long)max_frames);
    GM_TRY(dims_of(mm, &e->d, err));
    GM_TRY(gm_config_audio_tower(mm, &e->tcfg, err));
    e->m = m, e->hard = hard, e->cfg = mm->audio, e->max_clips = max_clips, e->max_frames = max_frames, e->be = be;
    e->stored = GM_BF16;
    e->g4 = mm->arch == GM_ARCH_GEMMA4;
    if (e->g4 && max_clips > GM_AUDIO_MAX_CLIPS)
        return gm_error_set(err, GM_ERR_INVALID, "audio encoder: %lld clips at once; at most %d", (long long)max_clips,
                            GM_AUDIO_MAX_CLIPS);
    int64_t pad = mm->vocab_size - 1 - e->cfg.vocab_offset;
    if (e->g4) {
        pad = 0; /* Gemma 4 pads no clip: a clip has as many tokens as valid frames */
    } else if (pad < 0 || pad >= e->d.V)
        return gm_error_set(err, GM_ERR_FORMAT, "%s: the audio padding token (text vocab_size - 1 = %lld) is not an audio "
                            "token (ids %lld..%lld)", m ? m->path : mm->name, (long long)(mm->vocab_size - 1),
                            (long long)e->cfg.vocab_offset, (long long)(e->cfg.vocab_offset + e->d.V - 1));
    e->pad_id = pad;
    if (m && !e->g4 && (!hard || !gm_mm_hard_row(hard, (int32_t)(e->cfg.vocab_offset + pad))))
        return gm_error_set(err, GM_ERR_INVALID, "audio encoder: the hard-token tables given hold no audio ids");
    e->pos_proj = gm_calloc((size_t)e->cfg.n_layers, sizeof *e->pos_proj);
    if (!e->pos_proj) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    int nt = be ? be->n_threads : (n_threads > 0 ? n_threads : 2);
    e->scratch_floats = scratch_of(e, nt);
    GM_TRY(gm_weights_init(&e->w, &e->tcfg, GM_QUANT_STORED, err));
    e->train_tower = lora != NULL;
    if (e->train_tower) {
        /* the tower's own streams: its A initialization and dropout masks differ from the text
         * adapters' of the same layer and slot */
        gm_lora_config lc = *lora;
        lc.seed ^= 0x61756469u; /* "audi" */
        for (int l = 0; l < GM_MAX_LAYERS; l++) lc.layers[l] = true;
        gm_status s = gm_lora_describe(&e->lora, &lc, e->w.arch, &e->tcfg, GM_AUDIO_TOWER_PREFIX, err);
        if (s != GM_OK) {
            gm_error_prefix(err, "audio_targets");
            return s;
        }
    }
    if (ad && ad->n > 0 && (ad->n_layers != e->tcfg.n_layers || ad->n_slots != e->w.n_slots))
        return gm_error_set(err, GM_ERR_INVALID, "the adapter's audio-encoder LoRA is for %lld blocks; this encoder has %lld",
                            (long long)ad->n_layers, (long long)e->tcfg.n_layers);
    const gm_lora *lo = e->train_tower ? &e->lora : ad && ad->n > 0 ? ad : NULL;
    int64_t T2;
    gm_audio_encoder_frames(&e->cfg, max_frames, &T2, NULL);
    gm_graph_opts go = {.mode = e->train_tower ? GM_GRAPH_TRAIN : GM_GRAPH_INFER, .batch = max_clips,
                        .max_tokens = T2 > 0 ? T2 : 1, .ctx = T2 > 0 ? T2 : 1, .checkpointing = e->train_tower && checkpointing,
                        .lm_rows = 1, .rank = lo ? lo->cfg.rank : 0, .n_threads = nt};
    return gm_graph_init(&e->g, &e->tcfg, &e->w, lo, be, &go, err);
}

gm_status gm_audio_encoder_init_train(gm_audio_encoder *e, const gm_config *mm, const gm_model *m, const gm_mm_hard *hard,
                                      int64_t max_clips, int64_t max_frames, const gm_lora_config *lora,
                                      bool checkpointing, int n_threads, gm_backend *be, gm_error *err) {
    memset(e, 0, sizeof *e);
    gm_status s = init_any(e, mm, m, hard, max_clips, max_frames, lora, NULL, checkpointing, n_threads, be, err);
    if (s != GM_OK) gm_audio_encoder_release(e); /* what it described before failing */
    return s;
}

gm_status gm_audio_encoder_init(gm_audio_encoder *e, const gm_config *mm, const gm_model *m, const gm_mm_hard *hard,
                                int64_t max_clips, int64_t max_frames, int n_threads, gm_backend *be, gm_error *err) {
    return gm_audio_encoder_init_train(e, mm, m, hard, max_clips, max_frames, NULL, false, n_threads, be, err);
}

void gm_audio_encoder_release(gm_audio_encoder *e) {
    if (!e) return;
    gm_graph_free(&e->g);
    gm_lora_free(&e->lora);
    gm_weights_free(&e->w);
    gm_free(e->pos_proj);
    e->pos_proj = NULL;
}

gm_status gm_audio_encoder_init_params(gm_audio_encoder *e, gm_error *err) {
    return e->train_tower ? gm_lora_init_train(&e->lora, e->be, err) : gm_backend_status(e->be, err);
}

gm_status gm_audio_encoder_new(const gm_model *m, const gm_mm_hard *hard, int64_t max_clips, int64_t max_frames,
                               int n_threads, gm_backend *be, gm_audio_encoder **out, gm_error *err) {
    return gm_audio_encoder_new_adapted(m, hard, max_clips, max_frames, n_threads, be, NULL, out, err);
}

gm_status gm_audio_encoder_new_adapted(const gm_model *m, const gm_mm_hard *hard, int64_t max_clips, int64_t max_frames,
                                       int n_threads, gm_backend *be, const gm_lora *ad, gm_audio_encoder **out,
                                       gm_error *err) {
    *out = NULL;
    if (ad && ad->n > 0 && !be)
        return gm_error_set(err, GM_ERR_INVALID, "an adapted audio encoder runs on the adapter's backend: give it");
    gm_audio_encoder *e = gm_calloc(1, sizeof *e);
    if (!e) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    if (n_threads <= 0) n_threads = 2;
    gm_backend *owned = NULL;
    gm_status s = GM_OK;
    if (!be) s = gm_backend_cpu_new(n_threads, &owned, err), be = owned;
    if (s == GM_OK) s = init_any(e, &m->cfg, m, hard, max_clips, max_frames, NULL, ad, false, n_threads, be, err);
    e->owned_be = owned;
    if (s == GM_OK) {
        gm_backend_arena(be, &e->arena, "audio encoder");
        gm_arena_init(&e->host, "audio encoder host", GM_DEVICE_CPU);
        s = gm_audio_encoder_layout(e, &e->arena, &e->host, err);
    }
    if (s == GM_OK) s = gm_arena_commit(&e->arena, err);
    if (s == GM_OK) s = gm_arena_commit(&e->host, err);
    if (s == GM_OK) s = gm_audio_encoder_layout(e, &e->arena, &e->host, err); /* pass 2: hand out, read the weights */
    if (s == GM_OK) s = gm_backend_status(be, err);
    if (s != GM_OK) {
        gm_audio_encoder_free(e);
        return s;
    }
    *out = e;
    return GM_OK;
}

void gm_audio_encoder_free(gm_audio_encoder *e) {
    if (!e) return;
    gm_arena_free(&e->arena);
    gm_arena_free(&e->host);
    gm_audio_encoder_release(e);
    gm_backend_free(e->owned_be);
    gm_free(e);
}

/* ---- forward --------------------------------------------------------------------------------- */

static void trace_out(gm_audio_trace_fn trace, void *user, const char *stage, const float *x, int64_t rows, int64_t cols) {
    if (trace) trace(user, stage, x, rows, cols);
}

/* The sub-sampling's output c1 (rows frames) through input_proj into X[0], then the blocks, each
 * stage traced. */
static void run_blocks(gm_audio_encoder *e, const gm_kctx *ctx, int64_t rows, gm_audio_trace_fn trace, void *user) {
    gm_graph *g = &e->g;
    e->be->k->matmul_fwd(ctx, g->X[0], e->c1, &e->input_proj, rows, 0.0f);
    trace_out(trace, user, "sscp", g->X[0], rows, e->d.D);
    for (int64_t i = 0; i < e->cfg.n_layers; i++) {
        g->arch->layer_fwd(g, i);
        char name[32];
        snprintf(name, sizeof name, "block_%lld", (long long)i);
        trace_out(trace, user, name, g->X[i + 1], rows, e->d.D);
    }
}

/* Gemma 4's encoder (Gemma4AudioModel, Gemma4MultimodalEmbedder "embed_audio"; modeling_gemma4.py):
 *   sub-sampling, twice: x * valid (the frames' mask, every 2nd frame's after the first), Conv2d
 *     3 x 3 stride 2 padding 1 (channels last), LayerNorm over channels (weight, no bias,
 *     rms_norm_eps), ReLU; then (B, T2, F2 C1) . input_proj^T;
 *   the blocks (conformer.h) on the frames, frame t2 valid when feature frame 4 t2 is;
 *   the valid frames (a prefix of each clip's), in order: output_proj (bias), RMSNorm without
 *     weight, embedding_projection: the soft tokens, clip after clip (Gemma4Model.forward keeps
 *     audio_features[audio_mask], one per <|audio|> token of the prompt). */
static gm_status run_g4(gm_audio_encoder *e, const float *features, const uint8_t *valid, int64_t B, int64_t T,
                        gm_audio_trace_fn trace, void *user, gm_error *err) {
    const gm_audio_encoder_dims *d = &e->d;
    const gm_audio_config *c = &e->cfg;
    int64_t T1 = (T - 1) / 2 + 1, T2, n = 0;
    gm_audio_encoder_frames(c, T, &T2, NULL);
    e->soft_off[0] = 0;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < T1; t++) e->h_valid1[b * T1 + t] = valid[b * T + 2 * t] ? 1 : 0;
        for (int64_t t = 0; t < T2; t++) {
            e->h_valid2[b * T2 + t] = valid[b * T + 4 * t] ? 1 : 0;
            if (e->h_valid2[b * T2 + t]) e->h_rows[n++] = (int32_t)(b * T2 + t);
        }
        e->soft_off[b + 1] = n;
        if (n - e->soft_off[b] > d->soft_tokens)
            return gm_error_set(err, GM_ERR_INVALID, "audio encoder: clip %lld gives %lld soft tokens, more than Gemma 4's "
                                "%lld (30 s)\n  hint: cut the clip", (long long)(b + 1), (long long)(n - e->soft_off[b]),
                                (long long)d->soft_tokens);
    }
    e->B = B, e->T2 = T2, e->T3 = T2, e->n_soft = n;
    e->n_encoded += B;
    gm_backend *be = e->be;
    const gm_kernel_table *k = be->k;
    gm_kctx ctx = gm_backend_kctx(be, e->scratch, e->scratch_floats);
    GM_TRY(gm_graph_begin_encoder(&e->g, B, T2, err));
    gm_backend_upload(be, e->x_in, features, (size_t)(B * T * d->M) * sizeof(float));
    gm_backend_upload(be, e->valid0, valid, (size_t)(B * T));
    gm_backend_upload(be, e->valid1, e->h_valid1, (size_t)(B * T1));
    gm_backend_upload(be, e->valid2, e->h_valid2, (size_t)(B * T2));
    gm_backend_upload(be, e->rows, e->h_rows, (size_t)n * sizeof(int32_t));
    /* sub-sampling (Gemma4AudioSubSampleConvProjection), channels last: the flattening to
     * (T2, F2 C1) is the buffer as it is (its permute(0, 2, 3, 1)) */
    const uint8_t *vin[2] = {e->valid0, e->valid1};
    float *in[2] = {e->x_in, e->c0}, *out[2] = {e->c0, e->c1};
    int64_t Ts[2] = {T, T1}, Fs[2] = {d->M, d->F1}, Ci[2] = {1, d->C0}, Co[2] = {d->C0, d->C1}, Fo[2] = {d->F1, d->F2};
    for (int i = 0; i < 2; i++) {
        k->mask_rows_fwd(&ctx, in[i], vin[i], NULL, B * Ts[i], Fs[i] * Ci[i]);
        k->conv2d_fwd(&ctx, out[i], in[i], e->conv_w[i], B, Ts[i], Fs[i], Ci[i], Co[i], 3, 3, 2, 2, 1, 1);
        int64_t rows = B * ((Ts[i] - 1) / 2 + 1) * Fo[i];
        k->layernorm_fwd(&ctx, out[i], NULL, NULL, out[i], e->gn_w[i], e->zeros, rows, Co[i], c->group_norm_eps);
        k->clip_fwd(&ctx, out[i], out[i], rows * Co[i], e->relu_b, e->relu_b + 1);
    }
    gm_graph *g = &e->g;
    run_blocks(e, &ctx, B * T2, trace, user);
    if (n == 0) return gm_backend_status(be, err);
    k->gather_rows(&ctx, e->red, g->X[c->n_layers], e->rows, n, d->D);
    k->matmul_fwd(&ctx, e->outp, e->red, &e->out_proj, n, 0.0f);
    k->bias_fwd(&ctx, e->outp, e->out_bias, n, d->Dout);
    trace_out(trace, user, "encoder", e->outp, n, d->Dout);
    k->rmsnorm_fwd(&ctx, e->red_n, e->rstd_red, e->outp, NULL, n, d->Dout, c->rms_eps);
    k->matmul_fwd(&ctx, e->soft, e->red_n, &e->proj, n, 0.0f);
    return gm_backend_status(be, err);
}

gm_status gm_audio_encoder_run(gm_audio_encoder *e, const float *features, const uint8_t *valid, int64_t B, int64_t T,
                               gm_audio_trace_fn trace, void *user, gm_error *err) {
    const gm_audio_encoder_dims *d = &e->d;
    const gm_audio_config *c = &e->cfg;
    if (B < 1 || B > e->max_clips || T < 1 || T > e->max_frames)
        return gm_error_set(err, GM_ERR_INVALID, "audio encoder: a batch of %lld clips of %lld frames; planned for up to "
                            "%lld clips of %lld frames", (long long)B, (long long)T, (long long)e->max_clips,
                            (long long)e->max_frames);
    if (e->g4) return run_g4(e, features, valid, B, T, trace, user, err);
    int64_t T1 = (T - 1) / c->sscp_stride[0][0] + 1, T2, T3;
    gm_audio_encoder_frames(c, T, &T2, &T3);
    if (T3 > d->soft_tokens)
        return gm_error_set(err, GM_ERR_INVALID, "audio encoder: %lld feature frames give %lld soft tokens, more than the "
                            "%lld positions a clip has in the prompt (audio_soft_tokens_per_image)\n  hint: cut the clip "
                            "(the feature extractor keeps 30 s)", (long long)T, (long long)T3, (long long)d->soft_tokens);
    e->B = B, e->T2 = T2, e->T3 = T3, e->n_soft = B * d->soft_tokens;
    e->n_encoded += B;
    gm_backend *be = e->be;
    const gm_kernel_table *k = be->k;
    gm_kctx ctx = gm_backend_kctx(be, e->scratch, e->scratch_floats);
    /* validity after the sub-sampling: frame t2 is frame t2 x (time strides)'s, clamped */
    int64_t stride = c->sscp_stride[0][0] * c->sscp_stride[1][0];
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T2; t++) {
            int64_t src = t * stride < T - 1 ? t * stride : T - 1;
            e->h_valid2[b * T2 + t] = valid[b * T + src] ? 1 : 0;
        }
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T3; t++) {
            e->h_rows[b * T3 + t] = (int32_t)(b * T2 + t * d->red);
            e->h_valid3[b * T3 + t] = e->h_valid2[b * T2 + t * d->red];
        }
    GM_TRY(gm_graph_begin_encoder(&e->g, B, T2, err));
    gm_backend_upload(be, e->x_in, features, (size_t)(B * T * d->M) * sizeof(float));
    gm_backend_upload(be, e->valid2, e->h_valid2, (size_t)(B * T2));
    gm_backend_upload(be, e->valid3, e->h_valid3, (size_t)(B * T3));
    gm_backend_upload(be, e->rows, e->h_rows, (size_t)(B * T3) * sizeof(int32_t));
    /* sub-sampling (Gemma3nAudioSubSampleConvProjection): channels last throughout, so the
     * flattening to (T2, F2 C1) is the buffer as it is */
    k->conv2d_fwd(&ctx, e->c0, e->x_in, e->conv_w[0], B, T, d->M, 1, d->C0, c->sscp_kernel[0][0], c->sscp_kernel[0][1],
                  c->sscp_stride[0][0], c->sscp_stride[0][1], 0, 1);
    k->cumulative_group_norm_fwd(&ctx, e->c0, e->c0, e->gn_w[0], B, T1, d->F1 * d->C0, d->C0, c->group_norm_eps, 1);
    k->conv2d_fwd(&ctx, e->c1, e->c0, e->conv_w[1], B, T1, d->F1, d->C0, d->C1, c->sscp_kernel[1][0],
                  c->sscp_kernel[1][1], c->sscp_stride[1][0], c->sscp_stride[1][1], 0, 1);
    k->cumulative_group_norm_fwd(&ctx, e->c1, e->c1, e->gn_w[1], B, T2, d->F2 * d->C1, d->C1, c->group_norm_eps, 1);
    gm_graph *g = &e->g;
    run_blocks(e, &ctx, B * T2, trace, user);
    /* reduction, padding frames zeroed (Gemma3nAudioEncoder.forward) */
    k->gather_rows(&ctx, e->red, g->X[c->n_layers], e->rows, B * T3, d->D);
    k->mask_rows_fwd(&ctx, e->red, e->valid3, NULL, B * T3, d->D);
    trace_out(trace, user, "encoder", e->red, B * T3, d->D);
    /* the embedder's soft path, written into each clip's first T3 of soft_tokens rows; padding
     * frames and the rest take the padding token's hard embedding (Gemma3nModel.forward) */
    k->rmsnorm_fwd(&ctx, e->red_n, e->rstd_red, e->red, e->soft_norm, B * T3, d->D, c->rms_eps);
    k->matmul_fwd(&ctx, e->proj_out, e->red_n, &e->proj, B * T3, 0.0f);
    const float *pad = e->pad;
    for (int64_t b = 0; b < B; b++) {
        float *o = e->soft + b * d->soft_tokens * d->C_text;
        k->rmsnorm_fwd(&ctx, o, e->rstd_out ? e->rstd_out + b * T3 : NULL, e->proj_out + b * T3 * d->C_text, NULL, T3,
                       d->C_text, c->rms_eps);
        k->mask_rows_fwd(&ctx, o, e->valid3 + b * T3, pad, T3, d->C_text);
        for (int64_t t = T3; t < d->soft_tokens; t++) gm_backend_copy(be, o + t * d->C_text, pad, (size_t)d->C_text * sizeof(float));
    }
    return gm_backend_status(be, err);
}

/* ---- backward -------------------------------------------------------------------------------- */

void gm_audio_encoder_backward(gm_audio_encoder *e) {
    if (!e->train_tower) return;
    const gm_audio_encoder_dims *d = &e->d;
    gm_graph *g = &e->g;
    const gm_kernel_table *k = e->be->k;
    gm_kctx ctx = gm_backend_kctx(e->be, e->scratch, e->scratch_floats);
    if (e->g4) { /* run_g4 backward from the packed dsoft (n_soft, C_text) */
        int64_t n = e->n_soft;
        k->fill(&ctx, g->g, g->N * d->D, 0.0f);
        if (n > 0) {
            k->matmul_bwd_input(&ctx, e->dout, e->dsoft, &e->proj, n, 0.0f);
            k->rmsnorm_bwd(&ctx, e->doutp, NULL, e->dout, e->outp, NULL, e->rstd_red, n, d->Dout, 0.0f);
            k->matmul_bwd_input(&ctx, e->dred, e->doutp, &e->out_proj, n, 0.0f);
            k->scatter_rows(&ctx, g->g, e->dred, e->rows, n, d->D);
        }
        gm_graph_backward(g);
        return;
    }
    int64_t B = e->B, T3 = e->T3, N3 = B * T3, Ct = d->C_text;
    /* the embedder: rows T3.. and padding frames hold the padding token's constant embedding */
    for (int64_t b = 0; b < B; b++)
        gm_backend_copy(e->be, e->dout + b * T3 * Ct, e->dsoft + b * d->soft_tokens * Ct, (size_t)(T3 * Ct) * sizeof(float));
    k->mask_rows_fwd(&ctx, e->dout, e->valid3, NULL, N3, Ct);
    /* soft = RMSNorm(proj_out) without weight (dL/dproj_out into the caller's dsoft, consumed) */
    k->rmsnorm_bwd(&ctx, e->dsoft, NULL, e->dout, e->proj_out, NULL, e->rstd_out, N3, Ct, 0.0f);
    k->matmul_bwd_input(&ctx, e->dred, e->dsoft, &e->proj, N3, 0.0f);
    /* red_n = RMSNorm_soft(red), through the graph's gradient buffer as scratch */
    k->rmsnorm_bwd(&ctx, g->g, NULL, e->dred, e->red, e->soft_norm, e->rstd_red, N3, d->D, 0.0f);
    k->mask_rows_fwd(&ctx, g->g, e->valid3, NULL, N3, d->D);
    k->scale_fwd(&ctx, e->dred, g->g, N3 * d->D, 1.0f);
    /* the reduction kept every red-th frame: the others' gradient is zero */
    k->fill(&ctx, g->g, g->N * d->D, 0.0f);
    k->scatter_rows(&ctx, g->g, e->dred, e->rows, N3, d->D);
    gm_graph_backward(g);
}

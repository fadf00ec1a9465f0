/*
 * gm_vision.c - pixels to soft tokens through the SigLIP tower (see gm_vision.h).
 */
#include "gm_vision.h"

#include "gm_alloc.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The one layout: the tower's weights, the encoder graph, the patch and head buffers, and what
 * trains (the tower's adapters, the projector's copies, the head's backward workspace). */
gm_status gm_vision_layout(gm_vision *v, gm_arena *a, gm_arena *host, gm_error *err) {
    GM_TRY(gm_weights_layout(&v->w, v->tower, v->stored, v->stored, v->be, a, v->g.o.n_threads, err));
    if (v->train_tower) gm_lora_layout(&v->lora, a, true);
    gm_graph_layout(&v->g, a, host);
    int64_t N = v->max_images * v->P_max, R = v->max_images * v->tokens_max, pd = 3 * v->patch_size * v->patch_size;
#define F32(ar, n, kind) (float *)gm_arena_alloc(ar, (size_t)(n) * sizeof(float), kind)
    v->patches = F32(a, N * pd, GM_MEM_ACTIVATIONS);
    if (!v->g4) { /* SigLIP's post-layernorm; Gemma 4 pools X[L] itself */
        v->head.post = F32(a, N * v->C, GM_MEM_ACTIVATIONS);
        v->head.mean = F32(a, N, GM_MEM_ACTIVATIONS);
        v->head.rstd = F32(a, N, GM_MEM_ACTIVATIONS);
    } else {
        int64_t kk = v->tcfg.vision.pool * v->tcfg.vision.pool;
        v->host_xy = (int32_t *)gm_arena_alloc(host, (size_t)(2 * N) * sizeof(int32_t), GM_MEM_ACTIVATIONS);
        v->host_pool_src = (int32_t *)gm_arena_alloc(host, (size_t)(R * kk) * sizeof(int32_t), GM_MEM_ACTIVATIONS);
        v->host_lens = (int64_t *)gm_arena_alloc(host, (size_t)v->max_images * sizeof(int64_t), GM_MEM_ACTIVATIONS);
        v->head.pool_src = (int32_t *)gm_arena_alloc(a, (size_t)(R * kk) * sizeof(int32_t), GM_MEM_ACTIVATIONS);
        if (v->tcfg.vision.standardize) v->head.std_nbias = F32(a, v->C, GM_MEM_ACTIVATIONS);
    }
    v->head.pooled = F32(a, R * v->C, GM_MEM_ACTIVATIONS);
    v->head.normed = F32(a, R * v->C, GM_MEM_ACTIVATIONS);
    v->head.rstd_mm = F32(a, R, GM_MEM_ACTIVATIONS);
    v->head.out = F32(a, R * v->C_text, GM_MEM_ACTIVATIONS);
    v->host_patches = F32(host, N * pd, GM_MEM_ACTIVATIONS);
    if (v->train_tower || v->train_proj) {
        v->dsoft = v->head.dout = F32(a, R * v->C_text, GM_MEM_WORKSPACE);
        v->head.dnormed = F32(a, R * v->C, GM_MEM_WORKSPACE);
        v->head.dpooled = F32(a, R * v->C, GM_MEM_WORKSPACE);
    }
    if (v->train_tower && !v->g4) v->head.dpost = F32(a, N * v->C, GM_MEM_WORKSPACE);
    if (v->train_proj) {
        for (int i = 0; i < GM_VISION_PROJ_PARAMS; i++) {
            gm_vision_param *q = &v->proj[i];
            q->p = F32(a, q->n, GM_MEM_ADAPTERS), q->d = F32(a, q->n, GM_MEM_GRADS);
            q->m = F32(a, q->n, GM_MEM_OPTIMIZER), q->v = F32(a, q->n, GM_MEM_OPTIMIZER);
        }
        v->head.proj = v->proj[0].p, v->head.dproj = v->proj[0].d;
        v->head.dnorm = v->proj[1].d;
    } else if (v->ad.proj_w) { /* an adapter's projector: its weight as it is, the norm's scale here */
        v->head.proj = v->ad.proj_w;
    }
    if (v->train_proj || v->ad.proj_w) v->head.norm_scale = v->norm_scale = F32(a, v->C, GM_MEM_ADAPTERS);
#undef F32
    return GM_OK;
}

gm_status gm_vision_init(gm_vision *v, const gm_config *mm, const gm_model *tower, int64_t max_images, int n_threads,
                         gm_backend *be, gm_error *err) {
    return gm_vision_init_train(v, mm, tower, max_images, NULL, false, n_threads, be, err);
}

static gm_status init_train(gm_vision *v, const gm_config *mm, const gm_model *tower, int64_t max_images,
                            const gm_vision_train *t, const gm_vision_adapter *ad, bool checkpointing, int n_threads,
                            gm_backend *be, gm_error *err);

/* gm_vision_init_train, or with a trained image path `ad` for inference (t NULL then). */
static gm_status init_any(gm_vision *v, const gm_config *mm, const gm_model *tower, int64_t max_images,
                          const gm_vision_train *t, const gm_vision_adapter *ad, bool checkpointing, int n_threads,
                          gm_backend *be, gm_error *err) {
    memset(v, 0, sizeof *v);
    gm_status s = init_train(v, mm, tower, max_images, t, ad, checkpointing, n_threads, be, err);
    if (s != GM_OK) gm_vision_release(v); /* what it described before failing */
    return s;
}

gm_status gm_vision_init_train(gm_vision *v, const gm_config *mm, const gm_model *tower, int64_t max_images,
                               const gm_vision_train *t, bool checkpointing, int n_threads, gm_backend *be, gm_error *err) {
    return init_any(v, mm, tower, max_images, t, NULL, checkpointing, n_threads, be, err);
}

static gm_status init_train(gm_vision *v, const gm_config *mm, const gm_model *tower, int64_t max_images,
                            const gm_vision_train *t, const gm_vision_adapter *ad, bool checkpointing, int n_threads,
                            gm_backend *be, gm_error *err) {
    if (max_images < 1 || max_images > GM_VISION_MAX_IMAGES)
        return gm_error_set(err, GM_ERR_INVALID, "%lld images per call of the image path: 1..%d (a micro-batch's images: "
                            "batch x images per example)", (long long)max_images, GM_VISION_MAX_IMAGES);
    GM_TRY(gm_config_vision_tower(mm, &v->tcfg, err));
    const gm_config *tc = &v->tcfg;
    if (ad) {
        if (!ad->proj_w != !ad->proj_norm_w)
            return gm_error_set(err, GM_ERR_INVALID, "an adapter's projector needs both its weight and its norm");
        if (ad->tower && ad->tower->n > 0 && ad->tower->n_layers != tc->n_layers)
            return gm_error_set(err, GM_ERR_INVALID, "the adapter's tower LoRA is for %lld layers; this tower has %lld",
                                (long long)ad->tower->n_layers, (long long)tc->n_layers);
        v->ad = *ad;
        if (v->ad.tower && v->ad.tower->n == 0) v->ad.tower = NULL;
    }
    v->g4 = tc->arch == GM_ARCH_GEMMA4_VISION;
    if (v->g4 && ((t && t->projector) || (ad && ad->proj_w)))
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: a trained image projector (modules_to_save) is Gemma 3's; Gemma 4's "
                            "(embed_vision) is not trained in gemmarun yet\n  hint: adapt the tower with vision_targets, or "
                            "leave the projector frozen", mm->name);
    v->tower = tower;
    v->be = be;
    v->max_images = max_images;
    v->image_size = tc->vision.image_size;
    v->patch_size = tc->vision.patch_size;
    v->side = v->image_size / v->patch_size;
    v->P = v->side * v->side;
    v->tokens = tc->vision.tokens;
    v->g4 = tc->arch == GM_ARCH_GEMMA4_VISION;
    /* Gemma 4: any grid within the budget (aspect kept: up to max_soft_tokens k^2 patches) */
    v->P_max = v->g4 ? tc->vision.max_soft_tokens * tc->vision.pool * tc->vision.pool : v->P;
    v->tokens_max = v->g4 ? tc->vision.max_soft_tokens : v->tokens;
    v->C = tc->hidden_size;
    v->C_text = tc->vision.out_hidden_size;
    /* Hugging Face checkpoints of Gemma 3 store the tower in bf16 (google/gemma-3-4b-it: 8.6 GB of
     * safetensors for its 4.3 B parameters); a model's own views replace this when one is given */
    v->stored = GM_BF16;
    GM_TRY(gm_weights_init(&v->w, tc, GM_QUANT_STORED, err));
    v->train_tower = t && t->lora;
    v->train_proj = t && t->projector;
    if (v->train_tower) {
        /* the tower's own streams: its A initialization and dropout masks differ from the text
         * adapters' of the same layer and slot */
        gm_lora_config lc = *t->lora;
        lc.seed ^= 0x76697369u; /* "visi" */
        for (int l = 0; l < GM_MAX_LAYERS; l++) lc.layers[l] = true;
        gm_status s = gm_lora_describe(&v->lora, &lc, v->w.arch, tc, GM_VISION_TOWER_PREFIX, err);
        if (s != GM_OK) {
            gm_error_prefix(err, "vision_targets");
            return s;
        }
    }
    if (v->train_proj) {
        static const char *const names[GM_VISION_PROJ_PARAMS] = {"mm_input_projection_weight", "mm_soft_emb_norm.weight"};
        for (int i = 0; i < GM_VISION_PROJ_PARAMS; i++) {
            gm_vision_param *q = &v->proj[i];
            snprintf(q->name, sizeof q->name, "%s%s", GM_VISION_PROJECTOR_PREFIX, names[i]);
            q->ndim = i == 0 ? 2 : 1;
            q->shape[0] = v->C, q->shape[1] = i == 0 ? v->C_text : 0;
            q->n = i == 0 ? v->C * v->C_text : v->C;
            q->decay = i == 0;
        }
    }
    /* the tower's adapters: trained here, or an adapter's in inference (as the decoder's) */
    const gm_lora *lo = v->train_tower ? &v->lora : v->ad.tower;
    gm_graph_opts go = {.mode = v->train_tower ? GM_GRAPH_TRAIN : GM_GRAPH_INFER, .batch = max_images,
                        .max_tokens = v->P_max, .ctx = v->P_max, .checkpointing = v->train_tower && checkpointing, .lm_rows = 1,
                        .rank = lo ? lo->cfg.rank : 0, .n_threads = n_threads > 0 ? n_threads : 2};
    return gm_graph_init(&v->g, tc, &v->w, lo, be, &go, err);
}

void gm_vision_release(gm_vision *v) {
    gm_graph_free(&v->g);
    gm_lora_free(&v->lora);
    gm_weights_free(&v->w);
}

gm_status gm_vision_init_params(gm_vision *v, gm_error *err) {
    gm_status s = v->train_tower ? gm_lora_init_train(&v->lora, v->be, err) : GM_OK;
    size_t cap = (size_t)(v->C * v->C_text);
    float *h = s == GM_OK ? gm_malloc(cap * sizeof(float)) : NULL, *t = s == GM_OK ? gm_malloc(cap * sizeof(float)) : NULL;
    if (s == GM_OK && (!h || !t)) s = gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    if (s == GM_OK && v->train_proj) {
        /* the weights hold the projection transposed (C_text, C) and the norm as its scale 1 + w */
        int64_t C = v->C, Ct = v->C_text;
        gm_backend_download(v->be, t, v->w.global[GM_SIGLIP_MM_PROJ].data, (size_t)(C * Ct) * sizeof(float));
        for (int64_t o = 0; o < Ct; o++)
            for (int64_t c = 0; c < C; c++) h[c * Ct + o] = t[o * C + c];
        gm_backend_upload(v->be, v->proj[0].p, h, (size_t)(C * Ct) * sizeof(float));
        gm_backend_download(v->be, t, v->w.global[GM_SIGLIP_MM_NORM].data, (size_t)C * sizeof(float));
        gm_backend_upload(v->be, v->norm_scale, t, (size_t)C * sizeof(float));
        for (int64_t c = 0; c < C; c++) h[c] = t[c] - 1.0f;
        gm_backend_upload(v->be, v->proj[1].p, h, (size_t)C * sizeof(float));
        for (int i = 0; i < GM_VISION_PROJ_PARAMS; i++) {
            gm_vision_param *q = &v->proj[i];
            gm_backend_memset(v->be, q->d, 0, (size_t)q->n * sizeof(float));
            gm_backend_memset(v->be, q->m, 0, (size_t)q->n * sizeof(float));
            gm_backend_memset(v->be, q->v, 0, (size_t)q->n * sizeof(float));
        }
    }
    gm_free(h);
    gm_free(t);
    return s == GM_OK ? gm_backend_status(v->be, err) : s;
}

void gm_vision_backward(gm_vision *v) {
    gm_graph *g = &v->g;
    if (v->g4) {
        if (!v->train_tower) return;
        gm_gemma4_vision_head_bwd(g, &v->head);
        gm_graph_backward(g);
        return;
    }
    gm_siglip_head_bwd(g, &v->head, v->train_tower);
    if (!v->train_tower) return;
    gm_graph_backward(g);
}

/* norm_scale = 1 + w: what the projector's RMSNorm multiplies by. */
static void set_norm_scale(gm_vision *v, const float *w) {
    v->g.k->fill(&v->g.kc, v->norm_scale, v->C, 1.0f);
    v->g.k->add_fwd(&v->g.kc, v->norm_scale, w, v->C);
}

void gm_vision_params_updated(gm_vision *v) {
    if (v->train_proj) set_norm_scale(v, v->proj[1].p);
}

gm_status gm_vision_new(const gm_model *m, int64_t max_images, int n_threads, gm_backend *be, gm_vision **out,
                        gm_error *err) {
    return gm_vision_new_adapted(m, max_images, n_threads, be, NULL, out, err);
}

gm_status gm_vision_new_adapted(const gm_model *m, int64_t max_images, int n_threads, gm_backend *be,
                                const gm_vision_adapter *ad, gm_vision **out, gm_error *err) {
    *out = NULL;
    if (ad && (ad->tower || ad->proj_w) && !be)
        return gm_error_set(err, GM_ERR_INVALID, "an adapted image path runs on the backend holding the adapter: give it");
    if (!m->vision)
        return gm_error_set(err, GM_ERR_INVALID, "%s: the model has no vision tower (a text-only checkpoint cannot read "
                            "images)\n  hint: use a multimodal checkpoint (Gemma3ForConditionalGeneration, e.g. gemma-3-4b)",
                            m->path);
    gm_vision *v = gm_calloc(1, sizeof *v);
    if (!v) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    if (n_threads <= 0) n_threads = 2;
    gm_status s = GM_OK;
    gm_backend *owned = NULL;
    if (!be) s = gm_backend_cpu_new(n_threads, &owned, err), be = owned;
    if (s == GM_OK) s = init_any(v, &m->cfg, m->vision, max_images, NULL, ad, false, n_threads, be, err);
    v->owned_be = owned;
    if (s == GM_OK) {
        gm_backend_arena(v->be, &v->arena, "vision tower");
        gm_arena_init(&v->host, "vision tower host", GM_DEVICE_CPU);
        s = gm_vision_layout(v, &v->arena, &v->host, err);
    }
    if (s == GM_OK) s = gm_arena_commit(&v->arena, err);
    if (s == GM_OK) s = gm_arena_commit(&v->host, err);
    if (s == GM_OK) s = gm_vision_layout(v, &v->arena, &v->host, err); /* pass 2: hand out, upload the weights */
    if (s == GM_OK && v->ad.proj_norm_w) set_norm_scale(v, v->ad.proj_norm_w);
    if (s == GM_OK) s = gm_backend_status(v->be, err);
    if (s != GM_OK) {
        gm_vision_free(v);
        return s;
    }
    *out = v;
    return GM_OK;
}

void gm_vision_free(gm_vision *v) {
    if (!v) return;
    gm_arena_free(&v->arena);
    gm_arena_free(&v->host);
    gm_vision_release(v);
    gm_backend_free(v->owned_be);
    gm_free(v);
}

/* Patches of one image in the conv's order: patch t = (py, px) row-major, values (c, y, x). */
static void patchify(const float *img, int64_t S, int64_t p, float *out) {
    int64_t side = S / p, pd = 3 * p * p;
    for (int64_t py = 0; py < side; py++)
        for (int64_t px = 0; px < side; px++) {
            float *o = out + (py * side + px) * pd;
            for (int64_t c = 0; c < 3; c++)
                for (int64_t y = 0; y < p; y++)
                    memcpy(o + (c * p + y) * p, img + (c * S + py * p + y) * S + px * p, (size_t)p * sizeof(float));
        }
}

/* Gemma 4's order of an image img (3, h, w): patch t = (py, px) row-major over its gh x gw grid,
 * values (y, x, c) (the processor's convert_image_to_patches). */
static void patchify_yxc(const float *img, int64_t h, int64_t w, int64_t p, float *out) {
    int64_t gh = h / p, gw = w / p, pd = 3 * p * p;
    for (int64_t py = 0; py < gh; py++)
        for (int64_t px = 0; px < gw; px++) {
            float *o = out + (py * gw + px) * pd;
            for (int64_t y = 0; y < p; y++)
                for (int64_t x = 0; x < p; x++)
                    for (int64_t c = 0; c < 3; c++) o[(y * p + x) * 3 + c] = img[(c * h + py * p + y) * w + px * p + x];
        }
}

/* Gemma 4: n images imgs[i] (3, hw[2i], hw[2i+1]) pixels, sides multiples of k p, through the tower
 * as one batch padded to the largest grid (each image's keys end at its own patches: kv_end), then
 * pooled cell by cell into its soft tokens, packed in order at head.out (v->n_soft rows). */
static gm_status run_g4(gm_vision *v, const float *const *imgs, const int64_t *hw, int64_t n, gm_error *err) {
    const gm_vision_config *vc = &v->tcfg.vision;
    int64_t p = v->patch_size, k = vc->pool, kk = k * k, pd = 3 * p * p, T = 0, R = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t h = hw[2 * i], w = hw[2 * i + 1], P = (h / p) * (w / p);
        if (h < k * p || w < k * p || h % (k * p) || w % (k * p) || P > v->P_max || h / p > vc->pos_table || w / p > vc->pos_table)
            return gm_error_set(err, GM_ERR_INVALID, "image %lld of %lld x %lld pixels: Gemma 4's tower takes sides that are "
                                "multiples of %lld px (pooling %lld x patch %lld), at most %lld patches (max_soft_tokens "
                                "%lld) and %lld a side (its position table)", (long long)i, (long long)w, (long long)h,
                                (long long)(k * p), (long long)k, (long long)p, (long long)v->P_max,
                                (long long)vc->max_soft_tokens, (long long)vc->pos_table);
        v->host_lens[i] = P;
        T = P > T ? P : T;
    }
    int64_t N = n * T;
    memset(v->host_patches, 0, (size_t)(N * pd) * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        int64_t h = hw[2 * i], w = hw[2 * i + 1], gw = w / p, P = v->host_lens[i];
        patchify_yxc(imgs[i], h, w, p, v->host_patches + i * T * pd);
        /* each patch's grid column and row (the processor's image_position_ids), columns first; the
         * padding's (0, 0): masked as keys, never pooled */
        for (int64_t t = 0; t < T; t++) {
            v->host_xy[i * T + t] = (int32_t)(t < P ? t % gw : 0);
            v->host_xy[N + i * T + t] = (int32_t)(t < P ? t / gw : 0);
        }
        /* soft token (cy, cx) of the (gh / k) x (gw / k) cells, row-major: its k x k patches in
         * patch order (Gemma4VisionPooler._avg_pool_by_positions) */
        int64_t cw = gw / k, cells = P / kk;
        for (int64_t r = 0; r < cells; r++)
            for (int64_t j = 0; j < kk; j++)
                v->host_pool_src[(R + r) * kk + j] =
                    (int32_t)(i * T + ((r / cw) * k + j / k) * gw + (r % cw) * k + j % k);
        v->soft_off[i] = R;
        R += cells;
    }
    v->soft_off[n] = R;
    v->n_soft = R;
    v->head.rows = R;
    gm_backend_upload(v->be, v->patches, v->host_patches, (size_t)(N * pd) * sizeof(float));
    gm_backend_upload(v->be, v->head.pool_src, v->host_pool_src, (size_t)(R * kk) * sizeof(int32_t));
    GM_TRY(gm_graph_begin_encoder_lens(&v->g, n, T, v->host_lens, err));
    v->n_encoded += n;
    if (v->head.std_nbias)
        v->g.k->scale_fwd(&v->g.kc, v->head.std_nbias, (const float *)v->w.global[GM_G4V_STD_BIAS].data, v->C, -1.0f);
    gm_gemma4_vision_embed(&v->g, v->patches, v->host_xy);
    gm_graph_forward(&v->g);
    gm_gemma4_vision_head(&v->g, &v->head);
    return gm_backend_status(v->be, err);
}

gm_status gm_vision_run_images(gm_vision *v, const float *const *imgs, const int64_t *hw, int64_t n, gm_error *err) {
    if (!v->g4) return gm_error_set(err, GM_ERR_INVALID, "images of their own sizes are Gemma 4's; this tower takes %lld x %lld",
                                    (long long)v->image_size, (long long)v->image_size);
    if (n < 1 || n > v->max_images || n > GM_VISION_MAX_IMAGES)
        return gm_error_set(err, GM_ERR_INVALID, "%lld images in one call; this image path was planned for 1..%lld",
                            (long long)n, (long long)v->max_images);
    return run_g4(v, imgs, hw, n, err);
}

gm_status gm_vision_run_grids(gm_vision *v, const float *pixels, const int64_t *hw, int64_t n, gm_error *err) {
    if (!v->g4) return gm_error_set(err, GM_ERR_INVALID, "images of their own sizes are Gemma 4's; this tower takes %lld x %lld",
                                    (long long)v->image_size, (long long)v->image_size);
    if (n < 1 || n > v->max_images)
        return gm_error_set(err, GM_ERR_INVALID, "%lld images in one call; this image path was planned for 1..%lld",
                            (long long)n, (long long)v->max_images);
    const float *imgs[GM_VISION_MAX_IMAGES];
    if (n > GM_VISION_MAX_IMAGES)
        return gm_error_set(err, GM_ERR_INVALID, "%lld images in one call: at most %d", (long long)n, GM_VISION_MAX_IMAGES);
    for (int64_t i = 0, off = 0; i < n; off += 3 * hw[2 * i] * hw[2 * i + 1], i++) imgs[i] = pixels + off;
    return run_g4(v, imgs, hw, n, err);
}

gm_status gm_vision_encode_grids(gm_vision *v, const float *pixels, const int64_t *hw, int64_t n, float *out, gm_error *err) {
    GM_TRY(gm_vision_run_grids(v, pixels, hw, n, err));
    gm_backend_download(v->be, out, v->head.out, (size_t)(v->n_soft * v->C_text) * sizeof(float));
    return gm_backend_status(v->be, err);
}

gm_status gm_vision_run(gm_vision *v, const float *pixels, int64_t n, gm_error *err) {
    return gm_vision_run_some(v, pixels, NULL, n, err);
}

gm_status gm_vision_run_some(gm_vision *v, const float *pixels, const int64_t *which, int64_t n, gm_error *err) {
    if (n < 1 || n > v->max_images)
        return gm_error_set(err, GM_ERR_INVALID, "%lld images in one call; this image path was planned for 1..%lld",
                            (long long)n, (long long)v->max_images);
    int64_t S = v->image_size, pd = 3 * v->patch_size * v->patch_size, N = n * v->P;
    if (v->g4) { /* the square grid: every image S x S */
        const float *imgs[GM_VISION_MAX_IMAGES];
        int64_t hw[2 * GM_VISION_MAX_IMAGES];
        if (n > GM_VISION_MAX_IMAGES)
            return gm_error_set(err, GM_ERR_INVALID, "%lld images in one call: at most %d", (long long)n, GM_VISION_MAX_IMAGES);
        for (int64_t i = 0; i < n; i++) imgs[i] = pixels + (which ? which[i] : i) * 3 * S * S, hw[2 * i] = hw[2 * i + 1] = S;
        return run_g4(v, imgs, hw, n, err);
    }
    for (int64_t i = 0; i < n; i++)
        patchify(pixels + (which ? which[i] : i) * 3 * S * S, S, v->patch_size, v->host_patches + i * v->P * pd);
    for (int64_t i = 0; i <= n; i++) v->soft_off[i] = i * v->tokens;
    v->n_soft = n * v->tokens;
    gm_backend_upload(v->be, v->patches, v->host_patches, (size_t)(N * pd) * sizeof(float));
    GM_TRY(gm_graph_begin_encoder(&v->g, n, v->P, err));
    v->n_encoded += n;
    gm_siglip_embed(&v->g, v->patches);
    gm_graph_forward(&v->g);
    gm_siglip_head(&v->g, &v->head);
    return gm_backend_status(v->be, err);
}

gm_status gm_vision_encode(gm_vision *v, const float *pixels, int64_t n, float *out, float *hidden, gm_error *err) {
    GM_TRY(gm_vision_run(v, pixels, n, err));
    gm_backend_download(v->be, out, v->head.out, (size_t)(n * v->tokens * v->C_text) * sizeof(float));
    if (hidden)
        gm_backend_download(v->be, hidden, v->g4 ? v->g.X[v->tcfg.n_layers] : v->head.post,
                            (size_t)(n * v->P * v->C) * sizeof(float));
    return gm_backend_status(v->be, err);
}

int64_t gm_mm_kv_end(const int32_t *ids, int64_t B, int64_t T, int32_t image_token_id, int64_t pos0, int32_t *kv_end) {
    int64_t images = 0;
    for (int64_t b = 0; b < B; b++) {
        const int32_t *r = ids + b * T;
        int32_t *e = kv_end + b * T;
        for (int64_t t = 0; t < T;) {
            if (r[t] != image_token_id) {
                e[t] = (int32_t)(pos0 + t + 1);
                t++;
                continue;
            }
            int64_t end = t;
            while (end < T && r[end] == image_token_id) end++;
            for (int64_t j = t; j < end; j++) e[j] = (int32_t)(pos0 + end);
            images++;
            t = end;
        }
    }
    return images;
}

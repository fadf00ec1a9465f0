/*
 * test_plan_arch.c - the Gemma 3n / Gemma 4 presets and the memory estimator (core/plan/gm_plan_arch.c).
 *
 * Checks: (1) the presets' shapes (layer pattern, KV-sharing sources, double-wide FFN, the
 * multimodal Gemma 3 sizes' SigLIP tower) and their parameter totals against published figures
 * (docs/memory.md lists the sources); (2) the estimator run on Gemma 3 configs reproduces the
 * trainer's own plan item by item, with images too (that is what validates its accounting); (3)
 * a Gemma 3 plan with images from a size name: the tower's share is an item of its own and
 * everything else is the text-only plan; (4) monotonicity: longer sequences, larger batches, images
 * and no checkpointing cost more; nf4 weighs less than bf16; (5) LoRA counts on KV-shared and
 * k_eq_v layers.
 *
 * `test_plan_arch --table` prints the plans of docs/memory.md "The seeds' cases" instead.
 */
#include "gm_plan_arch.h"
#include "gm_quant.h"
#include "test_util.h"

#include <cjson/cJSON.h>

#include <string.h>

static gm_config preset(const char *name) {
    gm_config c;
    gm_error err;
    memset(&c, 0, sizeof c);
    CHECK_OK(gm_config_preset(name, &c, &err), &err);
    return c;
}

static gm_train_opts opts(int rank, int64_t T, int64_t B, bool ckpt, gm_quant q) {
    gm_train_opts o = gm_train_opts_default();
    o.lora.rank = rank;
    o.lora.alpha = (float)rank;
    o.max_length = T;
    o.batch = B;
    o.checkpointing = ckpt;
    o.quant = q;
    return o;
}

static double rel(double a, double b) { return fabs(a - b) / fabs(b); }

static int64_t text_params(const gm_config *c) { return gm_config_n_params(c) - c->vision.params - c->audio.params; }

/* ---- presets ------------------------------------------------------------------------------- */

static void test_presets(void) {
    const char *names[] = {"gemma3n-e2b", "gemma3n-e4b", "gemma4-e2b", "gemma4-e4b", "gemma4-31b", "gemma4-26b-a4b"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        gm_config c = preset(names[i]);
        gm_error err;
        CHECK_OK(gm_config_validate(&c, names[i], &err), &err);
        CHECK(c.arch == (i < 2 ? GM_ARCH_GEMMA3N : GM_ARCH_GEMMA4), "%s arch", names[i]);
        CHECK(c.norm_convention == GM_NORM_DIRECT && c.final_logit_softcap == 30.0f, "%s norms/softcap", names[i]);
        /* the last layer of every Gemma 4 is full attention (§4.1) */
        if (c.arch == GM_ARCH_GEMMA4) CHECK(c.layer_type[c.n_layers - 1] == GM_LAYER_FULL, "%s last layer", names[i]);
    }
    gm_config c;
    gm_error err;
    CHECK(gm_config_preset("gemma5-1b", &c, &err) == GM_ERR_NOT_FOUND && strstr(err.msg, "gemma4-26b-a4b") &&
              strstr(err.msg, "gemma3-270m") && strstr(err.msg, "gemma3n-e2b"),
          "unknown name lists the known ones: %s", err.msg);

    /* Gemma 3n E2B (§3.1, §3.5): full iff (i+1) % 5 == 0; layers 20..29 share; sources 18 / 19 */
    c = preset("gemma3n-e2b");
    CHECK(c.layer_type[4] == GM_LAYER_FULL && c.layer_type[3] == GM_LAYER_SLIDING, "3n pattern");
    CHECK(c.kv_source[19] == 19 && c.kv_source[20] == 18 && c.kv_source[24] == 19 && c.kv_source[29] == 19,
          "3n kv sources: %d %d %d", c.kv_source[20], c.kv_source[24], c.kv_source[29]);
    /* Gemma 4 E2B (§4.1, §4.4): 35 layers, 4+1 pattern, last 20 share (first = 15, sources 13 / 14)
     * and run the double-wide 12288 FFN */
    c = preset("gemma4-e2b");
    CHECK(c.kv_source[15] == 13 && c.kv_source[19] == 14 && c.kv_source[14] == 14, "g4 e2b sources %d %d",
          c.kv_source[15], c.kv_source[19]);
    CHECK(c.ffn_dim[14] == 6144 && c.ffn_dim[15] == 12288 && c.ffn_dim[34] == 12288, "g4 e2b double-wide");
    c = preset("gemma4-e4b");
    CHECK(c.kv_source[24] == 22 && c.kv_source[29] == 23 && c.ffn_dim[41] == 10240, "g4 e4b sources/ffn");
    c = preset("gemma4-31b");
    CHECK(c.k_eq_v_full && c.n_kv_heads_full == 4 && c.head_dim_full == 512 && c.kv_source[59] == 59, "31b attention");
}

/* Published totals (sources in docs/memory.md, "Parameter counts"); tolerances: test_util.h. */
static void test_param_totals(void) {
    gm_config c = preset("gemma3n-e2b");
    CHECK(rel((double)gm_config_n_params(&c), 5.44e9) <= TOL_PARAMS_PUBLISHED_REL, "3n E2B %lld vs 5.44B",
          (long long)gm_config_n_params(&c));
    /* "effective memory load of just under 2 billion (1.91B)": the text decoder without the
     * per-layer-embedding table and the main embedding */
    double eff = (double)(text_params(&c) - c.ple_vocab * c.n_layers * c.ple_dim - c.vocab_size * c.hidden_size);
    CHECK(rel(eff, 1.91e9) <= TOL_PARAMS_ROUGH_REL, "3n E2B effective %.4g vs 1.91B", eff);
    c = preset("gemma3n-e4b");
    CHECK(rel((double)gm_config_n_params(&c), 7.85e9) <= TOL_PARAMS_PUBLISHED_REL, "3n E4B %lld vs 7.85B",
          (long long)gm_config_n_params(&c));

    /* Gemma 4 E models: "2.3B effective (5.1B with embeddings)", "4.5B effective (8B ...)": the
     * totals include both towers; effective = text decoder without the PLE table */
    c = preset("gemma4-e2b");
    CHECK(rel((double)gm_config_n_params(&c), 5.1e9) <= TOL_PARAMS_PUBLISHED_REL, "g4 E2B %lld vs 5.1B",
          (long long)gm_config_n_params(&c));
    eff = (double)(text_params(&c) - c.ple_vocab * c.n_layers * c.ple_dim);
    CHECK(rel(eff, 2.3e9) <= TOL_PARAMS_PUBLISHED_REL * 2, "g4 E2B effective %.4g vs 2.3B", eff);
    c = preset("gemma4-e4b");
    CHECK(rel((double)gm_config_n_params(&c), 8.0e9) <= TOL_PARAMS_ROUGH_REL, "g4 E4B %lld vs 8B",
          (long long)gm_config_n_params(&c));
    eff = (double)(text_params(&c) - c.ple_vocab * c.n_layers * c.ple_dim);
    CHECK(rel(eff, 4.5e9) <= TOL_PARAMS_ROUGH_REL, "g4 E4B effective %.4g vs 4.5B", eff);

    /* 31B: 30.7B for the text model; its vision tower alone 569,550,384 (a published extraction
     * of the 31B's tower; ours adds the LM embedder 1152 x 5376) */
    c = preset("gemma4-31b");
    CHECK(rel((double)text_params(&c), 30.7e9) <= TOL_PARAMS_PUBLISHED_REL, "31B text %lld vs 30.7B",
          (long long)text_params(&c));
    CHECK(c.vision.params - 1152 * c.hidden_size == 569550384, "31B vision tower %lld",
          (long long)(c.vision.params - 1152 * c.hidden_size));
    /* 26B-A4B: "25.2B total, 3.8B active" (text model, ~550M vision encoder apart) */
    c = preset("gemma4-26b-a4b");
    CHECK(rel((double)text_params(&c), 25.2e9) <= TOL_PARAMS_PUBLISHED_REL, "26B text %lld vs 25.2B",
          (long long)text_params(&c));
    double inactive = (double)c.n_layers * (double)(c.n_experts - c.experts_top_k) * 3.0 * (double)(c.hidden_size * c.expert_ffn);
    CHECK(rel((double)text_params(&c) - inactive, 3.8e9) <= TOL_PARAMS_ROUGH_REL, "26B active %.4g vs 3.8B",
          (double)text_params(&c) - inactive);
    CHECK(c.vision.params - 1152 * c.hidden_size == 569550384, "26B vision tower (as the 31B's) %lld",
          (long long)(c.vision.params - 1152 * c.hidden_size));

    /* Gemma 3 presets unchanged: 270M = 268,098,176 (embedding 167.8M + 100.3M in the blocks) */
    c = preset("gemma3-270m");
    CHECK(gm_config_n_params(&c) == 268098176, "270m %lld", (long long)gm_config_n_params(&c));

    /* The multimodal Gemma 3 sizes with their SigLIP tower and projector: the Hub's safetensors
     * metadata of google/gemma-3-{4b,12b,27b}-it (4,300,079,472 / 12,187,325,040 /
     * 27,432,406,640), exactly, and the model cards' rounded 4.3B / 12.2B / 27.4B within the
     * published-figure tolerance; the tower alone (without the projector) is the 416,866,032 that
     * transformers reports for Gemma3Model.vision_tower (docs/memory.md, "Parameter counts") */
    static const struct { const char *name; int64_t exact; double rounded; } mm[] = {
        {"gemma3-4b", 4300079472LL, 4.3e9}, {"gemma3-12b", 12187325040LL, 12.2e9}, {"gemma3-27b", 27432406640LL, 27.4e9}};
    for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++) {
        c = preset(mm[i].name);
        int64_t n = gm_config_n_params(&c);
        CHECK(n == mm[i].exact, "%s: %lld parameters, the checkpoint has %lld", mm[i].name, (long long)n,
              (long long)mm[i].exact);
        CHECK(rel((double)n, mm[i].rounded) <= TOL_PARAMS_PUBLISHED_REL, "%s: %lld vs %.1fB", mm[i].name, (long long)n,
              mm[i].rounded / 1e9);
        int64_t projector = 1152 + 1152 * c.hidden_size; /* mm_soft_emb_norm + mm_input_projection_weight */
        CHECK(c.vision.params - projector == 416866032, "%s: vision tower %lld", mm[i].name,
              (long long)(c.vision.params - projector));
    }
    /* the two text-only sizes stay without a tower (1B: 999,885,952 on the Hub) */
    c = preset("gemma3-1b");
    CHECK(gm_config_n_params(&c) == 999885952 && c.vision.params == 0 && c.vision.hidden_size == 0, "1b %lld, no tower",
          (long long)gm_config_n_params(&c));
}

/* The multimodal Gemma 3 sizes' tower, field by field: SigLIP So400m as transformers' converter
 * configures it (_VISION_CONFIG) and Gemma3Config's token ids (gemma_architecture.md §2.1-2.4),
 * and gm_config_vision_tower accepts it (the config the tower's graph runs on). */
static void test_gemma3_towers(void) {
    const char *names[] = {"gemma3-4b", "gemma3-12b", "gemma3-27b"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        gm_config c = preset(names[i]), t;
        const gm_vision_config *v = &c.vision;
        CHECK(v->hidden_size == 1152 && v->n_layers == 27 && v->n_heads == 16 && v->intermediate_size == 4304 &&
                  v->image_size == 896 && v->patch_size == 14 && v->patches == 4096 && v->tokens == 256 &&
                  v->layer_norm_eps == 1e-6f && v->out_hidden_size == c.hidden_size,
              "%s: SigLIP shape", names[i]);
        CHECK(v->image_token_id == 262144 && v->boi_id == 255999 && v->eoi_id == 256000, "%s: image token ids", names[i]);
        gm_error err;
        CHECK_OK(gm_config_vision_tower(&c, &t, &err), &err);
        CHECK(t.head_dim == 72 && t.vocab_size == 4096 && t.n_layers == 27, "%s: tower config (head_dim %lld)", names[i],
              (long long)t.head_dim);
    }
    const char *text_only[] = {"gemma3-270m", "gemma3-1b"};
    for (size_t i = 0; i < 2; i++) {
        gm_config c = preset(text_only[i]);
        CHECK(c.vision.hidden_size == 0 && c.vision.tokens == 0 && c.vision.params == 0, "%s: text only", text_only[i]);
    }
}

/* ---- Gemma 3 through the estimator vs the trainer ---------------------------------------- */

static void compare_with_trainer_in(const char *name, gm_train_opts o, gm_dtype stored, gm_dtype stored_embed,
                                    const gm_plan_inputs *in) {
    gm_config c = preset(name);
    gm_plan est, exact;
    gm_error err;
    CHECK_OK(gm_plan_estimate(&c, &o, stored, stored_embed, in, &est, &err), &err);
    CHECK_OK(gm_plan_training(&c, &o, stored, stored_embed, in, &exact, &err), &err);
    CHECK(!est.exact && exact.exact, "exact flags");
    for (int k = 0; k < GM_MEM_KIND_COUNT; k++) {
        double a = (double)est.by_kind[k], b = (double)exact.by_kind[k];
        CHECK(b == 0 ? a == 0 : rel(a, b) <= TOL_PLAN_VS_TRAINER_REL, "%s T=%lld B=%lld ckpt=%d %s r=%d %s: %.0f vs %.0f",
              name, (long long)o.max_length, (long long)o.batch, o.checkpointing, gm_quant_name(o.quant), o.lora.rank,
              gm_mem_kind_name((gm_mem_kind)k), a, b);
    }
    /* the vision tower's item (a run with images): weights, activations, pixel staging */
    const size_t ev[] = {est.vision.weights, est.vision.activations, est.vision.staging, est.vision.total};
    const size_t xv[] = {exact.vision.weights, exact.vision.activations, exact.vision.staging, exact.vision.total};
    for (int i = 0; i < 4; i++)
        CHECK(xv[i] == 0 ? ev[i] == 0 : rel((double)ev[i], (double)xv[i]) <= TOL_PLAN_VS_TRAINER_REL,
              "%s images %lld: vision tower part %d: %zu vs %zu", name, in ? (long long)in->images : 0LL, i, ev[i], xv[i]);
    CHECK(rel((double)est.total, (double)exact.total) <= TOL_PLAN_VS_TRAINER_REL, "%s total %zu vs %zu", name,
          est.total, exact.total);
    CHECK(est.n_trainable == exact.n_trainable, "%s trainable %lld vs %lld", name, (long long)est.n_trainable,
          (long long)exact.n_trainable);
}

static void compare_with_trainer(const char *name, gm_train_opts o, gm_dtype stored, gm_dtype stored_embed) {
    compare_with_trainer_in(name, o, stored, stored_embed, NULL);
}

static void test_gemma3_vs_trainer(void) {
    compare_with_trainer("gemma3-270m", opts(8, 256, 1, false, GM_QUANT_STORED), GM_Q4_K, GM_Q8_0);
    compare_with_trainer("gemma3-270m", opts(16, 1024, 2, true, GM_QUANT_NF4), GM_Q4_K, GM_Q8_0);
    compare_with_trainer("gemma3-1b", opts(16, 512, 1, false, GM_QUANT_NF4), GM_BF16, GM_BF16);
    compare_with_trainer("gemma3-1b", opts(8, 2048, 1, true, GM_QUANT_BF16), GM_BF16, GM_BF16);
    compare_with_trainer("gemma3-4b", opts(64, 512, 4, false, GM_QUANT_INT8), GM_BF16, GM_BF16);
    gm_train_opts o = opts(4, 300, 3, true, GM_QUANT_F32);
    snprintf(o.lora.targets, sizeof o.lora.targets, "q_proj,v_proj");
    o.n_threads = 4;
    compare_with_trainer("gemma3-12b", o, GM_BF16, GM_BF16);
    o = opts(16, 1024, 1, false, GM_QUANT_NF4);
    /* every other layer of the 62 (an explicit list names only layers the model has) */
    for (int l = 0; l < GM_MAX_LAYERS; l++) o.lora.layers[l] = l < 62 && l % 2 == 0;
    compare_with_trainer("gemma3-27b", o, GM_BF16, GM_BF16);
    /* the multimodal sizes with one image per example at the pets settings (experiments/
     * pets_sweep.lua: batch 4, max_length 512, rank 64, nf4 and bf16), and two images at 1024 */
    gm_plan_inputs one = {1, 0.0}, two = {2, 0.0};
    const char *mm[] = {"gemma3-4b", "gemma3-12b", "gemma3-27b"};
    for (int i = 0; i < 3; i++) {
        compare_with_trainer_in(mm[i], opts(64, 512, 4, false, GM_QUANT_NF4), GM_BF16, GM_BF16, &one);
        compare_with_trainer_in(mm[i], opts(64, 512, 4, true, GM_QUANT_BF16), GM_BF16, GM_BF16, &one);
    }
    compare_with_trainer_in("gemma3-4b", opts(16, 1024, 2, false, GM_QUANT_NF4), GM_BF16, GM_BF16, &two);
}

/* ---- Gemma 3 with images, planned from a size name ---------------------------------------- */

static void test_gemma3_images(void) {
    gm_error err;
    gm_plan text, img;
    gm_plan_inputs one = {1, 0.0};
    const char *mm[] = {"gemma3-4b", "gemma3-12b", "gemma3-27b"};
    for (int i = 0; i < 3; i++) {
        gm_config c = preset(mm[i]);
        gm_train_opts o = opts(64, 512, 4, false, GM_QUANT_NF4);
        o.n_threads = 8;
        CHECK_OK(gm_plan_training(&c, &o, GM_BF16, GM_BF16, NULL, &text, &err), &err);
        CHECK_OK(gm_plan_training(&c, &o, GM_BF16, GM_BF16, &one, &img, &err), &err);
        /* text only: the trainer allocates no tower, so the plan has none */
        CHECK(text.vision.total == 0 && text.vision.max_images == 0, "%s: a text-only plan has no tower", mm[i]);
        const gm_plan_tower *v = &img.vision;
        CHECK(img.exact && v->max_images == 4, "%s: tower sized for 1 image x batch 4 (%lld)", mm[i], (long long)v->max_images);
        /* its weights: the hub's bf16 matrices (read in place) plus what the loader keeps in f32 -
         * every LayerNorm / bias vector (9 C + F per layer, 2 C post-LN, C patch bias), the
         * projector's norm (C) and its transposed C x D matrix */
        int64_t C = c.vision.hidden_size, F = c.vision.intermediate_size;
        int64_t f32 = c.vision.n_layers * (9 * C + F) + 4 * C + C * c.hidden_size;
        CHECK(v->weights == (size_t)(2 * (c.vision.params - f32) + 4 * f32), "%s: tower weights %zu vs %lld", mm[i],
              v->weights, (long long)(2 * (c.vision.params - f32) + 4 * f32));
        /* pixel staging: 4 images of 4096 patches x 3 x 14 x 14 f32 (= 3 x 896 x 896), and the
         * tower graph's few int32 per patch (ids, positions, attention ends) */
        size_t pixels = (size_t)4 * 3 * 896 * 896 * sizeof(float);
        CHECK(v->staging >= pixels && v->staging <= pixels + (size_t)4 * 4096 * 16, "%s: pixel staging %zu", mm[i],
              v->staging);
        CHECK(v->activations > ((size_t)1 << 30) && v->trained == 0 && v->total == v->weights + v->activations + v->staging,
              "%s: tower activations %zu", mm[i], v->activations);
        /* everything else is the text-only plan: the tower's share is taken out of the items; the
         * trainer's only other image buffers are four rows of int32 image indices and the two
         * lists of a batch's distinct images (4 int64 each, one arena line apiece) (workspace) */
        size_t img_extra = 4 * (size_t)(4 * 512) * sizeof(int32_t) + 2 * (size_t)GM_ARENA_ALIGN;
        for (int k = 0; k < GM_MEM_KIND_COUNT; k++) {
            size_t extra = k == GM_MEM_WORKSPACE ? img_extra : 0;
            CHECK(img.by_kind[k] == text.by_kind[k] + extra, "%s %s: %zu with an image, %zu without", mm[i],
                  gm_mem_kind_name((gm_mem_kind)k), img.by_kind[k], text.by_kind[k]);
        }
        CHECK(img.total == text.total + v->total + img_extra, "%s: total", mm[i]);
        char buf[4096];
        gm_plan_format(&img, buf, sizeof buf);
        CHECK(strstr(buf, "vision tower") && strstr(buf, "4 images per micro-batch") && strstr(buf, "pixel staging"),
              "%s: the table itemizes the tower:\n%s", mm[i], buf);
        gm_plan_format(&text, buf, sizeof buf);
        CHECK(!strstr(buf, "vision tower"), "%s: no tower line without images", mm[i]);
    }
    /* fit trades batch for accumulation: the tower is sized for the smaller micro-batch too */
    gm_config c = preset("gemma3-4b");
    gm_train_opts o = opts(64, 512, 4, false, GM_QUANT_NF4);
    gm_plan p;
    char chosen[256];
    size_t limit = (size_t)21 << 29; /* 10.5 GiB: batch 4 with checkpointing needs 11.6 GiB, batch 2 10.0 */
    CHECK_OK(gm_plan_fit(&c, &o, GM_BF16, GM_BF16, &one, limit, &p, chosen, sizeof chosen, &err), &err);
    CHECK(o.batch == 2 && o.grad_accum == 2 && p.vision.max_images == 2 && p.total <= limit, "fit: batch %lld, tower for %lld",
          (long long)o.batch, (long long)p.vision.max_images);
    /* the runner passes max_images (images per example x batch) in the options: fit shrinks it */
    o = opts(64, 512, 4, false, GM_QUANT_NF4);
    o.max_images = 4;
    CHECK_OK(gm_plan_fit(&c, &o, GM_BF16, GM_BF16, NULL, limit, &p, chosen, sizeof chosen, &err), &err);
    CHECK(o.batch == 2 && o.max_images == 2 && p.vision.max_images == 2, "fit with max_images: batch %lld, %lld images",
          (long long)o.batch, (long long)o.max_images);
    /* the runner's way (max_images in the options, no inputs) plans the same tower */
    o = opts(64, 512, 4, false, GM_QUANT_NF4);
    o.max_images = 4;
    CHECK_OK(gm_plan_training(&c, &o, GM_BF16, GM_BF16, NULL, &p, &err), &err);
    CHECK(p.vision.max_images == 4 && p.vision.total > 0, "max_images in the options");
    /* refused: a text-only size, and images that leave no room for text in max_length */
    gm_config t = preset("gemma3-1b");
    o = opts(16, 512, 1, false, GM_QUANT_NF4);
    CHECK(gm_plan_training(&t, &o, GM_BF16, GM_BF16, &one, &p, &err) == GM_ERR_UNSUPPORTED &&
              strstr(err.msg, "no vision tower"), "1b with an image: %s", err.msg);
    gm_plan_inputs two = {2, 0.0};
    CHECK(gm_plan_training(&c, &o, GM_BF16, GM_BF16, &two, &p, &err) == GM_ERR_INVALID &&
              strstr(err.msg, "516 positions"), "two images in 512: %s", err.msg);
}

/* ---- monotonicity and scaling ------------------------------------------------------------- */

static gm_plan plan_of(const char *name, gm_train_opts o, const gm_plan_inputs *in) {
    gm_config c = preset(name);
    gm_plan p;
    gm_error err;
    memset(&p, 0, sizeof p);
    CHECK_OK(gm_plan_estimate(&c, &o, GM_BF16, GM_BF16, in, &p, &err), &err);
    return p;
}

static void test_monotonic(const char *name) {
    gm_plan a = plan_of(name, opts(16, 1024, 1, false, GM_QUANT_BF16), NULL);
    gm_plan b = plan_of(name, opts(16, 2048, 1, false, GM_QUANT_BF16), NULL);
    CHECK(b.by_kind[GM_MEM_ACTIVATIONS] > a.by_kind[GM_MEM_ACTIVATIONS] && b.total > a.total, "%s: longer costs more",
          name);
    gm_plan ck = plan_of(name, opts(16, 1024, 1, true, GM_QUANT_BF16), NULL);
    CHECK(ck.by_kind[GM_MEM_ACTIVATIONS] < a.by_kind[GM_MEM_ACTIVATIONS] / 4, "%s: checkpointing saves (%zu vs %zu)",
          name, ck.by_kind[GM_MEM_ACTIVATIONS], a.by_kind[GM_MEM_ACTIVATIONS]);
    gm_plan q = plan_of(name, opts(16, 1024, 1, false, GM_QUANT_NF4), NULL);
    CHECK(q.by_kind[GM_MEM_WEIGHTS] < a.by_kind[GM_MEM_WEIGHTS] * 3 / 4, "%s: nf4 base %zu < bf16 %zu", name,
          q.by_kind[GM_MEM_WEIGHTS], a.by_kind[GM_MEM_WEIGHTS]);
    CHECK(q.by_kind[GM_MEM_ACTIVATIONS] == a.by_kind[GM_MEM_ACTIVATIONS], "%s: quant leaves activations", name);
    gm_plan b2 = plan_of(name, opts(16, 1024, 2, false, GM_QUANT_BF16), NULL);
    CHECK(rel((double)b2.by_kind[GM_MEM_ACTIVATIONS], 2.0 * (double)a.by_kind[GM_MEM_ACTIVATIONS]) <= TOL_PLAN_BATCH_SCALING_REL,
          "%s: batch 2 activations %zu vs 2 x %zu", name, b2.by_kind[GM_MEM_ACTIVATIONS], a.by_kind[GM_MEM_ACTIVATIONS]);
    CHECK(b2.by_kind[GM_MEM_ADAPTERS] == a.by_kind[GM_MEM_ADAPTERS], "%s: batch leaves adapters", name);
    /* an image takes vision_tokens + 2 positions and runs the tower: on top of max_length for
     * Gemma 3n, inside it for Gemma 4 (as its data sets place them: gm_plan_max_images) */
    gm_config c = preset(name);
    gm_plan_inputs img = {1, 0.0};
    gm_plan im = plan_of(name, opts(16, 1024, 1, false, GM_QUANT_BF16), &img);
    bool g3n = c.arch == GM_ARCH_GEMMA3N;
    CHECK(gm_plan_sequence_length(&c, 1024, &img) == 1024 + (g3n ? c.vision.tokens + 2 : 0), "%s: image positions", name);
    CHECK((g3n ? im.by_kind[GM_MEM_ACTIVATIONS] > a.by_kind[GM_MEM_ACTIVATIONS]
               : im.by_kind[GM_MEM_ACTIVATIONS] == a.by_kind[GM_MEM_ACTIVATIONS]) &&
              im.by_kind[GM_MEM_TRANSIENT] > a.by_kind[GM_MEM_TRANSIENT],
          "%s: an image costs %stower buffers", name, g3n ? "activations and " : "");
    CHECK(a.note[0] && a.base_detail[0] && strstr(a.base_detail, "linear bf16"), "%s: detail '%s'", name, a.base_detail);
    CHECK(a.runtime > 0 && a.total > a.runtime, "%s: runtime", name);
}

static void test_inputs_and_errors(void) {
    gm_config c = preset("gemma3n-e2b");
    /* audio: Gemma 3n always 188 tokens per clip (<= 30 s) + 2 markers; Gemma 4 25 per second */
    gm_plan_inputs au = {0, 45.0};
    CHECK(gm_plan_sequence_length(&c, 512, &au) == 512 + 2 * 188 + 4, "3n audio positions %lld",
          (long long)gm_plan_sequence_length(&c, 512, &au));
    gm_config g4 = preset("gemma4-e2b");
    CHECK(gm_plan_sequence_length(&g4, 512, &au) == 512 + 1125 + 4, "g4 audio positions");
    gm_plan p;
    gm_error err;
    gm_train_opts o = opts(16, 32768, 1, false, GM_QUANT_NF4);
    gm_plan_inputs img = {1, 0.0};
    CHECK(gm_plan_estimate(&c, &o, GM_BF16, GM_BF16, &img, &p, &err) == GM_ERR_INVALID &&
              strstr(err.msg, "max_position_embeddings"),
          "over the context: %s", err.msg);
    o = opts(16, 512, 0, false, GM_QUANT_NF4);
    CHECK(gm_plan_estimate(&c, &o, GM_BF16, GM_BF16, NULL, &p, &err) == GM_ERR_INVALID, "batch 0");
    /* gm_plan_training: Gemma 3n's text decoder and audio encoder exactly (the trainer's own
     * layout: gemmarun trains them), the estimator where its vision tower would run and for
     * Gemma 4 */
    o = opts(16, 512, 1, false, GM_QUANT_NF4);
    gm_plan q;
    CHECK_OK(gm_plan_training(&c, &o, GM_BF16, GM_BF16, NULL, &q, &err), &err);
    CHECK(q.exact && q.audio.total == 0, "gm_plan_training: Gemma 3n text -> the trainer's layout");
    gm_plan t = q;
    CHECK_OK(gm_plan_training(&c, &o, GM_BF16, GM_BF16, &au, &q, &err), &err);
    /* 45 s: two clips, the longest 30 s (2997 feature frames); the encoder's matrices read in place
     * (12 blocks of 24 D^2 at bf16, D = 1536: 1.3 GiB), nothing of it trained */
    CHECK(q.exact && q.audio.max_images == 2 && q.audio.frames == 2997 && q.audio.trained == 0 &&
              q.audio.weights > ((size_t)1 << 30) && q.audio.weights < ((size_t)3 << 29) && q.total > t.total + q.audio.total,
          "gm_plan_training: Gemma 3n with 45 s of audio -> exact, 2 clips of %lld frames, encoder %.2f GiB (weights %.2f)",
          (long long)q.audio.frames, (double)q.audio.total / 1073741824.0, (double)q.audio.weights / 1073741824.0);
    gm_train_opts shortl = opts(16, 380, 1, false, GM_QUANT_NF4);
    CHECK(gm_plan_training(&c, &shortl, GM_BF16, GM_BF16, &au, &q, &err) == GM_ERR_INVALID &&
              strstr(err.msg, "leaves no room for text beside 2 audio clips"),
          "max_length 380 with 2 clips of 190 positions: %s", err.msg);
    /* Gemma 4 trains: the trainer's layout, with images its vision tower as an item (its matrices
     * read in place, the forward's buffers for the micro-batch's images); with audio its audio tower
     * likewise */
    CHECK_OK(gm_plan_training(&g4, &o, GM_BF16, GM_BF16, NULL, &q, &err), &err);
    CHECK(q.exact, "gm_plan_training: Gemma 4 text -> the trainer's layout");
    gm_plan text4 = q;
    gm_plan_inputs img4 = {.images = 1};
    CHECK_OK(gm_plan_training(&g4, &o, GM_BF16, GM_BF16, &img4, &q, &err), &err);
    CHECK(q.exact && q.vision.total > 0 && q.vision.max_images == 1 && q.total > text4.total + q.vision.total / 2,
          "gm_plan_training: Gemma 4 with an image -> exact, the tower %.2f GiB", (double)q.vision.total / 1073741824.0);
    /* 45 s: two clips, the longest 30 s (2999 of Gemma 4's feature frames, 750 soft tokens); the
     * tower's matrices read in place (12 blocks of 24 D^2 + its sub-sampling and output_proj at bf16,
     * D = 1024: 0.57 GiB) */
    gm_train_opts o4 = opts(16, 2048, 1, false, GM_QUANT_NF4);
    CHECK_OK(gm_plan_training(&g4, &o4, GM_BF16, GM_BF16, &au, &q, &err), &err);
    CHECK(q.exact && q.audio.max_images == 2 && q.audio.frames == 2999 && q.audio.trained == 0 &&
              q.audio.weights > ((size_t)1 << 29) && q.audio.weights < ((size_t)5 << 27),
          "gm_plan_training: Gemma 4 with 45 s of audio -> exact, 2 clips of %lld frames, tower %.2f GiB (weights %.2f)",
          (long long)q.audio.frames, (double)q.audio.total / 1073741824.0, (double)q.audio.weights / 1073741824.0);
    o4 = opts(16, 1504, 1, false, GM_QUANT_NF4);
    CHECK(gm_plan_training(&g4, &o4, GM_BF16, GM_BF16, &au, &q, &err) == GM_ERR_INVALID &&
              strstr(err.msg, "leaves no room for text beside 2 audio clips (750 soft tokens + 2 markers each = 1504"),
          "max_length 1504 with 2 clips of 752 positions on Gemma 4: %s", err.msg);
    /* Gemma 4's images have their own grids: a square photo's 256 soft tokens do not bound a
     * max_length (a thin image may take one), only the least any image takes does */
    gm_train_opts short4 = opts(16, 200, 1, false, GM_QUANT_NF4);
    CHECK_OK(gm_plan_training(&g4, &short4, GM_BF16, GM_BF16, &img4, &q, &err), &err);
    short4 = opts(16, 3, 1, false, GM_QUANT_NF4);
    CHECK(gm_plan_training(&g4, &short4, GM_BF16, GM_BF16, &img4, &q, &err) == GM_ERR_INVALID &&
              strstr(err.msg, "leaves no room for text beside 1 image (at least 1 soft token + 2 markers"),
          "max_length 3 with an image: %s", err.msg);
}

/* Options too large to count in size_t are refused (GM_ERR_INVALID), never wrapped into a small
 * plan: batch x max_length was multiplied unchecked (a batch of 2^52 planned as 456 MiB). */
static void test_overflow_refused(void) {
    gm_config g3 = preset("gemma3-270m"), g3n = preset("gemma3n-e2b");
    gm_plan p;
    gm_error err;
    const int64_t huge[] = {(int64_t)1 << 33, (int64_t)1 << 36, (int64_t)1 << 52, INT64_MAX};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        gm_train_opts o = opts(16, 1024, huge[i], false, GM_QUANT_NF4);
        CHECK(gm_plan_training(&g3, &o, GM_BF16, GM_BF16, NULL, &p, &err) == GM_ERR_INVALID &&
                  strstr(err.msg, "too large to plan"),
              "Gemma 3 batch %lld: %s", (long long)huge[i], err.msg);
        CHECK(gm_plan_estimate(&g3n, &o, GM_BF16, GM_BF16, NULL, &p, &err) == GM_ERR_INVALID,
              "Gemma 3n batch %lld: %s", (long long)huge[i], err.msg);
    }
    /* the largest batch the command line takes still plans, and grows with the batch */
    gm_train_opts o = opts(16, 32768, 65536, false, GM_QUANT_NF4);
    gm_plan q;
    CHECK_OK(gm_plan_training(&g3, &o, GM_BF16, GM_BF16, NULL, &q, &err), &err);
    o.batch = 32768;
    CHECK_OK(gm_plan_training(&g3, &o, GM_BF16, GM_BF16, NULL, &p, &err), &err);
    CHECK(q.total > p.total && q.total > ((size_t)1 << 50), "batch 65536 > batch 32768");
    /* gradient accumulation (fit doubles it), Gemma 3 max_length past its positions, inputs */
    o = opts(16, 512, 1, false, GM_QUANT_NF4);
    o.grad_accum = INT64_MAX;
    o.batch = 4;
    CHECK(gm_plan_training(&g3, &o, GM_BF16, GM_BF16, NULL, &p, &err) == GM_ERR_INVALID, "grad_accum");
    o = opts(16, g3.max_position_embeddings + 1, 1, false, GM_QUANT_NF4);
    CHECK(gm_plan_training(&g3, &o, GM_BF16, GM_BF16, NULL, &p, &err) == GM_ERR_INVALID &&
              strstr(err.msg, "max_position_embeddings"), "max_length: %s", err.msg);
    o = opts(16, 512, 1, false, GM_QUANT_NF4);
    gm_plan_inputs img = {INT64_MAX, 0.0}, au = {0, 1e300};
    CHECK(gm_plan_estimate(&g3n, &o, GM_BF16, GM_BF16, &img, &p, &err) == GM_ERR_INVALID, "images: %s", err.msg);
    CHECK(gm_plan_estimate(&g3n, &o, GM_BF16, GM_BF16, &au, &p, &err) == GM_ERR_INVALID, "audio: %s", err.msg);
}

/* LoRA parameter counts, by hand (rank 16, all-linear):
 * Gemma 3n E2B, C 2048, q 8x256 = 2048, kv 2x256 = 512, F 8192. Layers 0..19:
 *   16 x [(2048+2048) q + (2048+512) k + (2048+512) v + (2048+2048) o + 3 x (2048+8192)] = 704,512;
 * layers 20..29 (KV-shared, no k/v): 16 x [4096 + 4096 + 30720] = 622,592.
 *   20 x 704,512 + 10 x 622,592 = 20,316,160.
 * Gemma 4 31B, rank 64, C 5376: sliding (50): q 5376+8192, k/v 5376+4096 each, o 8192+5376,
 * MLP 3 x (5376+21504) = 80,640 -> 64 x 126,720 = 8,110,080; full (10): q 5376+16384, k 5376+2048,
 * no v, o 16384+5376, MLP 80,640 -> 64 x 131,584 = 8,421,376. 50 x 8,110,080 + 10 x 8,421,376 = 489,717,760. */
static void test_lora_counts(void) {
    gm_plan p = plan_of("gemma3n-e2b", opts(16, 256, 1, false, GM_QUANT_NF4), NULL);
    CHECK(p.n_trainable == 20316160, "3n E2B trainable %lld", (long long)p.n_trainable);
    p = plan_of("gemma4-31b", opts(64, 256, 1, false, GM_QUANT_NF4), NULL);
    CHECK(p.n_trainable == 489717760, "31B trainable %lld", (long long)p.n_trainable);
    /* f32 parameter + gradient + 2 AdamW moments: 16 bytes per trainable parameter */
    size_t state = p.by_kind[GM_MEM_ADAPTERS] + p.by_kind[GM_MEM_GRADS] + p.by_kind[GM_MEM_OPTIMIZER];
    CHECK(rel((double)state, 16.0 * 489717760.0) <= TOL_PLAN_VS_TRAINER_REL, "31B LoRA state %zu", state);
}

/* ---- the seeds' table (docs/memory.md) ------------------------------------------------------ */

static double gib(size_t b) { return (double)b / 1073741824.0; }

static void table_row(const char *name, const char *base, gm_quant q, gm_dtype stored, int rank, int64_t T, int64_t B,
                      bool ckpt, const gm_plan_inputs *in, const char *inputs) {
    gm_config c = preset(name);
    gm_train_opts o = opts(rank, T, B, ckpt, q);
    o.n_threads = 8;
    gm_plan p;
    gm_error err;
    /* Gemma 3n and 4: the trainer's own layout (max_length counts every position, the media's
     * too); Gemma 4 with audio: the estimate (max_length of text, the clips' positions added) */
    if (gm_plan_training(&c, &o, stored, stored, in, &p, &err) != GM_OK) {
        printf("| %s | error: %s |\n", name, err.msg);
        return;
    }
    printf("| %s | %s | %d | %s | %lld (%lld) | %lld | %s | %.1f | %.2f | %.1f | %.1f | %.1f |\n", name, base, rank, inputs,
           (long long)T, (long long)(p.exact ? T : gm_plan_sequence_length(&c, T, in)), (long long)B, ckpt ? "on" : "off",
           gib(p.by_kind[GM_MEM_WEIGHTS] + p.audio.weights),
           gib(p.by_kind[GM_MEM_ADAPTERS] + p.by_kind[GM_MEM_GRADS] + p.by_kind[GM_MEM_OPTIMIZER]),
           gib(p.by_kind[GM_MEM_ACTIVATIONS] + p.audio.activations + p.audio.staging),
           gib(p.by_kind[GM_MEM_TRANSIENT] + p.by_kind[GM_MEM_WORKSPACE] + p.runtime), gib(p.total));
}

static void print_table(void) {
    printf("| model | base | rank | inputs / example | max_length (T) | batch | ckpt | base weights | LoRA+grad+AdamW | "
           "activations | transient+workspace+runtime | total GiB |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    gm_plan_inputs audio = {0, 30.0};
    const char *g3n[] = {"gemma3n-e2b", "gemma3n-e4b"};
    for (int m = 0; m < 2; m++)
        for (int qi = 0; qi < 2; qi++)
            for (int64_t T = 1024; T <= 2048; T *= 2)
                for (int ck = 0; ck < 2; ck++)
                    table_row(g3n[m], qi ? "nf4" : "bf16", qi ? GM_QUANT_NF4 : GM_QUANT_BF16, GM_BF16, 16, T, 1, ck, &audio,
                              "30 s audio");
    /* what the seed's script loads: from_pretrained without torch_dtype upcasts every weight to f32 */
    for (int m = 0; m < 2; m++)
        for (int64_t T = 1024; T <= 2048; T *= 2)
            table_row(g3n[m], "all f32", GM_QUANT_STORED, GM_F32, 16, T, 1, false, &audio, "30 s audio");
    gm_plan_inputs image = {1, 0.0};
    for (int64_t B = 1; B <= 4; B *= 4)
        for (int ck = 0; ck < 2; ck++) table_row("gemma4-31b", "nf4", GM_QUANT_NF4, GM_BF16, 64, 514, B, ck, &image, "1 image");
    /* Gemma 4's text decoders at the story's LoRA (rank 64, all linear): the trainer's own layout */
    const char *g4[] = {"gemma4-e2b", "gemma4-e4b"};
    for (int m = 0; m < 2; m++)
        for (int qi = 0; qi < 2; qi++)
            for (int ck = 0; ck < 2; ck++)
                table_row(g4[m], qi ? "nf4" : "bf16", qi ? GM_QUANT_NF4 : GM_QUANT_BF16, GM_BF16, 64, 1024, 1, ck, NULL, "text");
    const char *big[] = {"gemma4-31b", "gemma4-26b-a4b"};
    for (int m = 0; m < 2; m++)
        for (int ck = 0; ck < 2; ck++) table_row(big[m], "nf4", GM_QUANT_NF4, GM_BF16, 64, 514, 1, ck, NULL, "text");
    printf("\nnotes:\n");
    gm_config c = preset("gemma4-31b");
    gm_train_opts o = opts(64, 514, 1, false, GM_QUANT_NF4);
    o.n_threads = 8;
    gm_plan p;
    gm_error err;
    if (gm_plan_training(&c, &o, GM_BF16, GM_BF16, &image, &p, &err) == GM_OK) {
        char buf[2048];
        gm_plan_format(&p, buf, sizeof buf);
        printf("gemma4-31b nf4 r64 T=514 (256 text + an image's 258) B=1:\n%s  %s\n", buf, p.base_detail);
    }
    c = preset("gemma3n-e2b");
    o = opts(16, 2048, 1, false, GM_QUANT_BF16);
    o.n_threads = 8;
    if (gm_plan_training(&c, &o, GM_BF16, GM_BF16, &audio, &p, &err) == GM_OK) {
        char buf[2048];
        gm_plan_format(&p, buf, sizeof buf);
        printf("gemma3n-e2b bf16 r16 T=2048 with 30 s of audio B=1:\n%s", buf);
    }
}

/* gm_config_to_json (the config.json of a merged export) reads back as the same config: every
 * Gemma 3 size, the 4B+ linear RoPE scaling of full layers included. */
static void test_config_json(void) {
    static const char *const names[] = {"gemma3-270m", "gemma3-1b", "gemma3-4b", "gemma3-27b"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        gm_config a, b;
        gm_error err = {0};
        char *json = NULL;
        CHECK_OK(gm_config_preset(names[i], &a, &err), &err);
        CHECK_OK(gm_config_to_json(&a, "bfloat16", &json, &err), &err);
        if (!json) continue;
        CHECK_OK(gm_config_from_json(json, names[i], &b, &err), &err);
        bool same = a.vocab_size == b.vocab_size && a.hidden_size == b.hidden_size && a.n_layers == b.n_layers &&
                    a.n_heads == b.n_heads && a.n_kv_heads == b.n_kv_heads && a.head_dim == b.head_dim &&
                    a.intermediate_size == b.intermediate_size && a.sliding_window == b.sliding_window &&
                    a.max_position_embeddings == b.max_position_embeddings && a.rms_norm_eps == b.rms_norm_eps &&
                    a.query_pre_attn_scalar == b.query_pre_attn_scalar && a.final_logit_softcap == b.final_logit_softcap &&
                    a.tie_word_embeddings == b.tie_word_embeddings;
        int bad_layers = 0;
        for (int64_t l = 0; l < a.n_layers; l++)
            bad_layers += a.layer_type[l] != b.layer_type[l] || a.rope_theta[l] != b.rope_theta[l] ||
                          a.rope_pos_scale[l] != b.rope_pos_scale[l] || a.ffn_dim[l] != b.ffn_dim[l];
        CHECK(same && bad_layers == 0, "%s: config.json reads back differently (%d layers differ)", names[i], bad_layers);
        cJSON_free(json);
    }
    gm_config n;
    gm_error err = {0};
    char *json = NULL;
    CHECK_OK(gm_config_preset("gemma4-e4b", &n, &err), &err);
    CHECK(gm_config_to_json(&n, "bfloat16", &json, &err) == GM_ERR_UNSUPPORTED && !json, "Gemma 4 config.json refused");
}

/* Gemma 3n config.json files (transformers 5.24, tests/ref/make_gemma3n_ref.py): the tiny
 * Gemma3nForCausalLM - every per-layer array as Gemma3nTextConfig derives it - and the defaults of
 * Gemma3nForConditionalGeneration (E4B with its audio and vision configs) against the gemma3n-e4b
 * preset; the variations gemmarun refuses. */
static void test_gemma3n_config_json(void) {
    gm_config c, p;
    gm_error err = {0};
    CHECK_OK(gm_config_from_json_file(gm_test_path("tests/ref/tiny_gemma3n/config.json"), &c, &err), &err);
    static const int32_t src[6] = {0, 1, 2, 3, 3, 2}; /* the last 2 share: layer 3 (sliding), 2 (full) */
    int bad = 0;
    for (int l = 0; l < 6; l++)
        bad += c.kv_source[l] != src[l] || c.act_sparsity[l] != (l < 2 ? 0.95f : 0.0f) || c.ffn_dim[l] != 128 ||
               c.rope_theta[l] != (l == 2 || l == 5 ? 1e6f : 1e4f);
    CHECK(c.arch == GM_ARCH_GEMMA3N && bad == 0 && c.ple_dim == 16 && c.ple_vocab == 400 && c.altup_inputs == 4 &&
              c.laurel_rank == 8 && c.norm_convention == GM_NORM_DIRECT && c.final_logit_softcap == 30.0f &&
              c.query_pre_attn_scalar == 1.0f && c.sliding_window == 4 && c.vision.params == 0 && c.audio.params == 0,
          "tiny Gemma 3n config.json: arch %d, %d layers differ, ple %lld x %lld, altup %lld, laurel %lld", (int)c.arch, bad,
          (long long)c.ple_vocab, (long long)c.ple_dim, (long long)c.altup_inputs, (long long)c.laurel_rank);
    CHECK_OK(gm_config_from_json_file(gm_test_path("tests/ref/gemma3n_e4b_config.json"), &c, &err), &err);
    CHECK_OK(gm_config_preset("gemma3n-e4b", &p, &err), &err);
    bad = 0;
    for (int l = 0; l < p.n_layers; l++)
        bad += c.kv_source[l] != p.kv_source[l] || c.act_sparsity[l] != p.act_sparsity[l] || c.ffn_dim[l] != p.ffn_dim[l] ||
               c.layer_type[l] != p.layer_type[l] || c.rope_theta[l] != p.rope_theta[l];
    CHECK(c.arch == p.arch && c.n_layers == p.n_layers && c.hidden_size == p.hidden_size && c.vocab_size == p.vocab_size &&
              c.ple_vocab == p.ple_vocab && c.ple_dim == p.ple_dim && bad == 0 &&
              gm_config_n_params(&c) == gm_config_n_params(&p) && c.audio.params == p.audio.params &&
              c.vision.params == p.vision.params,
          "transformers' Gemma3nConfig() (E4B) reads as the gemma3n-e4b preset: %d layers differ, %lld vs %lld parameters", bad,
          (long long)gm_config_n_params(&c), (long long)gm_config_n_params(&p));
    printf("Gemma3nConfig() defaults read as gemma3n-e4b: %lld parameters, audio tower %lld\n", (long long)gm_config_n_params(&c),
           (long long)c.audio.params);
    /* refused variations, each naming its key */
    static const struct {
        const char *json, *want;
    } bad_cases[] = {
        {"{\"model_type\": \"gemma3n_text\", \"vocab_size\": 512, \"hidden_size\": 64, \"num_hidden_layers\": 6, "
         "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, \"intermediate_size\": 128, "
         "\"altup_active_idx\": 1}", "altup_active_idx"},
        {"{\"model_type\": \"gemma3n_text\", \"vocab_size\": 512, \"hidden_size\": 64, \"num_hidden_layers\": 6, "
         "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, \"intermediate_size\": [128, 128]}",
         "lists 2 widths for 6 layers"},
        {"{\"model_type\": \"gemma3n_text\", \"vocab_size\": 512, \"hidden_size\": 64, \"num_hidden_layers\": 6, "
         "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, \"intermediate_size\": 128, "
         "\"layer_types\": [\"sliding_attention\", \"sliding_attention\", \"sliding_attention\", \"sliding_attention\", "
         "\"full_attention\", \"full_attention\"], \"num_kv_shared_layers\": 2}", "no earlier layer is full attention"},
        {"{\"model_type\": \"gemma3n_text\", \"vocab_size\": 512, \"hidden_size\": 64, \"num_hidden_layers\": 6, "
         "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, \"intermediate_size\": 128, "
         "\"num_kv_shared_layers\": 2, \"activation_sparsity_pattern\": [0.95, 1.5, 0, 0, 0, 0]}",
         "activation_sparsity_pattern[1]"},
    };
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++)
        CHECK(gm_config_from_json(bad_cases[i].json, "case", &c, &err) != GM_OK && strstr(err.msg, bad_cases[i].want),
              "bad Gemma 3n config %zu: %s (want '%s')", i, err.msg, bad_cases[i].want);
}

/* Gemma 4 config.json files (transformers 5.24, tests/ref/make_gemma4_ref.py): the tiny decoders'
 * per-layer arrays as Gemma4TextConfig derives them (full layers' head width and kv heads from
 * per_layer_config, proportional RoPE, KV sharing, double-wide MLPs), the E2B / E4B text decoders at
 * their real sizes against the gemma4-e2b / gemma4-e4b presets, and the variations gemmarun
 * refuses. */
static void test_gemma4_config_json(void) {
    gm_config c, p;
    gm_error err = {0};
    CHECK_OK(gm_config_from_json_file(gm_test_path("tests/ref/tiny_gemma4/config.json"), &c, &err), &err);
    static const int32_t src[6] = {0, 1, 2, 3, 3, 2};
    int bad = 0;
    for (int l = 0; l < 6; l++) {
        bool full = l == 2 || l == 5;
        bad += c.kv_source[l] != src[l] || c.ffn_dim[l] != (l >= 4 ? 192 : 96) || c.rope_theta[l] != (full ? 1e6f : 1e4f) ||
               gm_config_rope_pairs(&c, l) != (full ? 4 : 8) || c.layer_type[l] != (full ? GM_LAYER_FULL : GM_LAYER_SLIDING);
    }
    CHECK(c.arch == GM_ARCH_GEMMA4 && bad == 0 && c.ple_dim == 16 && c.ple_vocab == 512 && c.altup_inputs == 1 &&
              c.head_dim == 16 && c.head_dim_full == 32 && c.n_kv_heads_full == 2 && !c.k_eq_v_full &&
              c.norm_convention == GM_NORM_DIRECT && c.final_logit_softcap == 30.0f && c.query_pre_attn_scalar == 1.0f &&
              c.intermediate_size == 96,
          "tiny Gemma 4 config.json: arch %d, %d layers differ, head_dim %lld / %lld, kv heads %lld, ple %lld", (int)c.arch, bad,
          (long long)c.head_dim, (long long)c.head_dim_full, (long long)c.n_kv_heads_full, (long long)c.ple_dim);
    CHECK_OK(gm_config_from_json_file(gm_test_path("tests/ref/tiny_gemma4_kv/config.json"), &c, &err), &err);
    bad = 0;
    for (int l = 0; l < 6; l++) bad += c.kv_source[l] != l || c.ffn_dim[l] != 96;
    CHECK(c.arch == GM_ARCH_GEMMA4 && bad == 0 && c.ple_dim == 0 && c.ple_vocab == 0 && c.k_eq_v_full &&
              c.n_kv_heads_full == 1 && c.n_kv_heads == 2 && c.head_dim_full == 32,
          "tiny Gemma 4 k_eq_v config.json: %d layers differ, ple %lld, k_eq_v %d, kv heads %lld / %lld", bad,
          (long long)c.ple_dim, (int)c.k_eq_v_full, (long long)c.n_kv_heads, (long long)c.n_kv_heads_full);
    static const char *const real[2][2] = {{"tests/ref/gemma4_e2b_config.json", "gemma4-e2b"},
                                           {"tests/ref/gemma4_e4b_config.json", "gemma4-e4b"}};
    for (int i = 0; i < 2; i++) {
        CHECK_OK(gm_config_from_json_file(gm_test_path(real[i][0]), &c, &err), &err);
        CHECK_OK(gm_config_preset(real[i][1], &p, &err), &err);
        bad = 0;
        for (int l = 0; l < p.n_layers; l++)
            bad += c.kv_source[l] != p.kv_source[l] || c.ffn_dim[l] != p.ffn_dim[l] || c.layer_type[l] != p.layer_type[l] ||
                   c.rope_theta[l] != p.rope_theta[l] || gm_config_rope_pairs(&c, l) != gm_config_rope_pairs(&p, l);
        /* the presets count the towers too: the text decoder's parameters are compared */
        gm_config pt = p;
        memset(&pt.vision, 0, sizeof pt.vision);
        memset(&pt.audio, 0, sizeof pt.audio);
        CHECK(c.arch == p.arch && c.n_layers == p.n_layers && c.hidden_size == p.hidden_size && c.vocab_size == p.vocab_size &&
                  c.ple_vocab == p.ple_vocab && c.ple_dim == p.ple_dim && c.head_dim_full == p.head_dim_full &&
                  c.n_kv_heads_full == p.n_kv_heads_full && bad == 0 && gm_config_n_params(&c) == gm_config_n_params(&pt),
              "transformers' %s text config reads as the %s preset: %d layers differ, %lld vs %lld parameters", real[i][1],
              real[i][1], bad, (long long)gm_config_n_params(&c), (long long)gm_config_n_params(&pt));
        printf("%s text decoder (transformers' config.json): %lld parameters\n", real[i][1], (long long)gm_config_n_params(&c));
    }
    /* refused variations, each naming its key */
#define G4 "{\"model_type\": \"gemma4_text\", \"vocab_size\": 512, \"hidden_size\": 64, \"num_hidden_layers\": 6, " \
           "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, \"intermediate_size\": 96, "
    static const struct {
        const char *json, *want;
    } bad_cases[] = {
        {G4 "\"enable_moe_block\": true}", "num_experts"},
        {G4 "\"use_bidirectional_attention\": \"all\"}", "use_bidirectional_attention 'all'"},
        {G4 "\"hidden_activation\": \"silu\"}", "hidden_activation"},
        {G4 "\"per_layer_config\": {\"1\": {\"head_dim\": 32}, \"5\": {\"head_dim\": 32}}}", "overrides layer 1, a sliding layer"},
        {G4 "\"per_layer_config\": {\"5\": {\"head_dim\": 32, \"sliding_window\": 8}}}", "per_layer_config[5].sliding_window"},
        {G4 "\"per_layer_config\": {\"x5\": {\"head_dim\": 32}}}", "key 'x5' is not a layer number"},
        {G4 "\"rope_parameters\": {\"full_attention\": {\"rope_type\": \"yarn\"}}}", "rope_type 'yarn'"},
    };
#undef G4
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++)
        CHECK(gm_config_from_json(bad_cases[i].json, "case", &c, &err) != GM_OK && strstr(err.msg, bad_cases[i].want),
              "bad Gemma 4 config %zu: %s (want '%s')", i, err.msg, bad_cases[i].want);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--table") == 0) {
        print_table();
        return 0;
    }
    test_presets();
    test_param_totals();
    test_gemma3_towers();
    test_gemma3_vs_trainer();
    test_gemma3_images();
    test_monotonic("gemma3n-e2b");
    test_monotonic("gemma4-e4b");
    test_monotonic("gemma4-31b");
    test_monotonic("gemma4-26b-a4b");
    test_inputs_and_errors();
    test_overflow_refused();
    test_lora_counts();
    test_config_json();
    test_gemma3n_config_json();
    test_gemma4_config_json();
    return gm_test_finish();
}

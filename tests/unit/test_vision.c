/*
 * test_vision.c - multimodal Gemma 3 against transformers (tests/ref/make_vision_ref.py): the tiny
 * Gemma3ForConditionalGeneration in its three checkpoint key layouts; the SigLIP tower's output and
 * the projector's soft tokens for two images; the logits of three sequences (one image, two
 * images, text only) through the decoder with the images' soft tokens placed and seen whole
 * (kv_end), by prefill with a KV cache; and that dropping the bidirectional image mask moves the
 * logits as much as the fixture says, so the mask is what the match depends on.
 */
#include "test_util.h"

#include "gm_adapter.h"
#include "gm_alloc.h"
#include "gm_data.h"
#include "gm_decoder.h"
#include "gm_mmap.h"
#include "gm_generate.h"
#include "gm_image.h"
#include "gm_merged.h"
#include "gm_model.h"
#include "gm_train.h"
#include "gm_vision.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#define REF "tests/ref/tiny_vision_ref.h5"

static void check_tower(const gm_model *m, const char *label) {
    size_t n = 0;
    int64_t dims[4];
    int nd = 0;
    float *pix = gm_test_h5_read(gm_test_path(REF), "/vision/pixel_values", 0, &n, dims, &nd);
    float *hid = gm_test_h5_read(gm_test_path(REF), "/vision/last_hidden_state", 0, &n, NULL, NULL);
    float *feat = gm_test_h5_read(gm_test_path(REF), "/vision/image_features", 0, &n, NULL, NULL);
    if (!pix || !hid || !feat) return;
    gm_error err = {0};
    gm_vision *v = NULL;
    CHECK(gm_vision_new(m, 2, 2, NULL, &v, &err) == GM_OK, "%s: gm_vision_new: %s", label, err.msg);
    if (v) {
        CHECK(v->P == 16 && v->tokens == 4 && v->C == 32 && v->C_text == 64, "%s: tower sizes P %lld tokens %lld C %lld/%lld",
              label, (long long)v->P, (long long)v->tokens, (long long)v->C, (long long)v->C_text);
        float *out = gm_malloc(2 * 4 * 64 * 4), *h = gm_malloc(2 * 16 * 32 * 4);
        CHECK(gm_vision_encode(v, pix, 2, out, h, &err) == GM_OK, "%s: encode: %s", label, err.msg);
        char what[128];
        snprintf(what, sizeof what, "%s: tower last_hidden_state vs transformers", label);
        printf("%s: max |diff| %.2e\n", what, gm_check_close(what, h, hid, 2 * 16 * 32, TOL_VISION_TOWER_TINY_ABS, 0));
        snprintf(what, sizeof what, "%s: soft tokens (projector) vs transformers", label);
        printf("%s: max |diff| %.2e\n", what, gm_check_close(what, out, feat, 2 * 4 * 64, TOL_VISION_TOWER_TINY_ABS, 0));
        /* more images than planned: a clear error, nothing run */
        CHECK(gm_vision_encode(v, pix, 3, out, NULL, &err) == GM_ERR_INVALID && gm_test_contains(err.msg, "planned for 1..2"),
              "%s: 3 images on a 2-image plan: %s", label, err.msg);
        gm_free(out), gm_free(h);
    }
    gm_vision_free(v);
    gm_free(pix), gm_free(hid), gm_free(feat);
}

/* The three reference sequences through the decoder, one at a time (B = 1), with the soft tokens
 * of their images; bidirectional: kv_end from gm_mm_kv_end, else causal. Returns the logits
 * (3, T, V) (gm_malloc'd). */
static float *mm_logits_with(const gm_model *m, bool bidirectional, const gm_lora *lo, const gm_vision_adapter *va,
                             gm_backend *be);
static float *mm_logits(const gm_model *m, bool bidirectional) { return mm_logits_with(m, bidirectional, NULL, NULL, NULL); }

/* The same with language-model adapters lo and a trained image path va (either may be NULL), on
 * backend be (the adapters' one; NULL: a CPU backend of the model's own). */
static float *mm_logits_with(const gm_model *m, bool bidirectional, const gm_lora *lo, const gm_vision_adapter *va,
                             gm_backend *be) {
    size_t n = 0;
    int64_t dims[4];
    int nd = 0;
    int32_t *ids = gm_test_h5_read(gm_test_path(REF), "/mm/input_ids", 1, &n, dims, &nd);
    float *pix = gm_test_h5_read(gm_test_path(REF), "/mm/pixel_values", 0, &n, NULL, NULL);
    if (!ids || !pix) return NULL;
    int64_t B = dims[0], T = dims[1], V = m->cfg.vocab_size, C = m->cfg.hidden_size;
    gm_error err = {0};
    gm_vision *v = NULL;
    gm_infer *st = NULL;
    gm_infer_opts io = {.batch = 1, .max_tokens = T, .ctx = T, .logit_rows = T, .n_threads = 2, .adapter = lo, .backend = be};
    CHECK(gm_vision_new_adapted(m, 3, 2, be, va, &v, &err) == GM_OK, "gm_vision_new: %s", err.msg);
    CHECK(gm_infer_new(m, &io, &st, &err) == GM_OK, "gm_infer_new: %s", err.msg);
    float *out = gm_malloc((size_t)(B * T * V) * 4), *soft = gm_malloc(3 * 4 * 64 * 4);
    if (!v || !st) goto done;
    CHECK(gm_vision_encode(v, pix, 3, soft, NULL, &err) == GM_OK, "encode: %s", err.msg);
    int64_t next_image = 0;
    for (int64_t b = 0; b < B; b++) {
        const int32_t *row = ids + b * T;
        int64_t rows[16], n_soft = 0;
        for (int64_t t = 0; t < T; t++)
            if (row[t] == m->cfg.vision.image_token_id) rows[n_soft++] = t;
        int32_t kv_end[64];
        int64_t images = gm_mm_kv_end(row, 1, T, m->cfg.vision.image_token_id, 0, kv_end);
        CHECK(n_soft == images * 4, "sequence %lld: %lld image tokens for %lld images", (long long)b, (long long)n_soft,
              (long long)images);
        gm_graph_input in = {.B = 1, .T = T, .ids = row, .embeds = soft + next_image * 4 * C, .embed_rows = rows,
                             .n_embeds = n_soft, .kv_end = bidirectional ? kv_end : NULL};
        next_image += images;
        gm_infer_reset(st);
        CHECK(gm_decoder_forward_input(st, &in, true, &err) == GM_OK, "forward: %s", err.msg);
        memcpy(out + b * T * V, st->logits, (size_t)(T * V) * 4);
    }
done:
    gm_infer_free(st);
    gm_vision_free(v);
    gm_free(ids), gm_free(pix), gm_free(soft);
    return out;
}

/* Generation with images (gm_generate_images): the first sequence's prompt with its image, greedy:
 * the first new token is the argmax of transformers' logits at the prompt's last position, and the
 * state's logits there are those logits. */
static void check_generate(const gm_model *m) {
    size_t n = 0;
    int64_t dims[4];
    int nd = 0;
    int32_t *ids = gm_test_h5_read(gm_test_path(REF), "/mm/input_ids", 1, &n, dims, &nd);
    float *pix = gm_test_h5_read(gm_test_path(REF), "/mm/pixel_values", 0, &n, NULL, NULL);
    float *ref = gm_test_h5_read(gm_test_path(REF), "/mm/logits", 0, &n, NULL, NULL);
    if (!ids || !pix || !ref) return;
    int64_t T = dims[1], V = m->cfg.vocab_size;
    gm_error err = {0};
    gm_vision *v = NULL;
    gm_infer *st = NULL;
    float soft[4 * 64];
    int64_t rows[4], n_soft = 0;
    for (int64_t t = 0; t < T; t++)
        if (ids[t] == m->cfg.vision.image_token_id) rows[n_soft++] = t;
    gm_infer_opts io = {.batch = 1, .max_tokens = T, .ctx = T + 1, .n_threads = 2};
    CHECK(gm_vision_new(m, 1, 2, NULL, &v, &err) == GM_OK && gm_vision_encode(v, pix, 1, soft, NULL, &err) == GM_OK, "%s",
          err.msg);
    CHECK(gm_infer_new(m, &io, &st, &err) == GM_OK, "%s", err.msg);
    if (v && st && n_soft == 4) {
        gm_sample_opts so = {.max_new_tokens = 1};
        int32_t out[1];
        int64_t n_out = 0;
        CHECK(gm_generate_images(st, ids, T, soft, rows, n_soft, m->cfg.vision.image_token_id, &so, NULL, NULL, out, &n_out,
                                 NULL, &err) == GM_OK, "generate with an image: %s", err.msg);
        const float *last = ref + (T - 1) * V;
        int64_t best = 0;
        for (int64_t k = 1; k < V; k++)
            if (last[k] > last[best]) best = k;
        CHECK(n_out == 1 && out[0] == best, "greedy token %d, transformers' argmax %lld", n_out ? out[0] : -1, (long long)best);
        gm_check_close("generation's prefill logits (one image) vs transformers", st->logits, last, (size_t)V,
                       TOL_VISION_LOGITS_TINY_ABS, 0);
    }
    gm_infer_free(st);
    gm_vision_free(v);
    gm_free(ids), gm_free(pix), gm_free(ref);
}

static void check_mm(const gm_model *m) {
    size_t n = 0;
    float *ref = gm_test_h5_read(gm_test_path(REF), "/mm/logits", 0, &n, NULL, NULL);
    double causal_diff = 0;
    if (!ref || !gm_test_h5_attr_double(gm_test_path(REF), "/mm", "max_abs_logit_diff_causal_only", &causal_diff)) {
        CHECK(false, "fixture /mm incomplete");
        return;
    }
    float *got = mm_logits(m, true);
    if (got)
        printf("multimodal logits vs transformers: max |diff| %.2e\n",
               gm_check_close("multimodal logits (1 image, 2 images, text only) vs transformers", got, ref, n,
                              TOL_VISION_LOGITS_TINY_ABS, 0));
    /* the same without the image mask: as far from the reference as transformers' own causal run */
    float *causal = mm_logits(m, false);
    if (causal) {
        double d = 0;
        for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)causal[i] - ref[i]));
        CHECK_NEAR(d, causal_diff, TOL_VISION_LOGITS_TINY_ABS, "causal-only logits: max diff to the reference");
        printf("causal-only logits: %.4f from the reference (transformers' causal run: %.4f)\n", d, causal_diff);
    }
    gm_free(got), gm_free(causal), gm_free(ref);
}

/* "layers.3.self_attn.q_proj" of an adapter's PEFT name (the fixture's key), into buf. */
static const char *short_name(const char *peft_name, char *buf, size_t cap) {
    const char *p = strstr(peft_name, "layers.");
    snprintf(buf, cap, "%s", p ? p : peft_name);
    char *e = strstr(buf, ".lora_");
    if (e) *e = '\0';
    return buf;
}

/* The /mm batch with the /lora labels as trainer targets (position t predicts t + 1, image tokens
 * never) and the reference loss at `loss_key`: what both LoRA checks train on. */
typedef struct lora_batch {
    int32_t *ids, *labels, *tg;
    float *pix;
    double *loss_ref;
    int64_t B, T, n_sup;
} lora_batch;

static bool lora_batch_load(const char *loss_key, lora_batch *lb) {
    size_t n = 0;
    int64_t dims[4];
    int nd = 0;
    memset(lb, 0, sizeof *lb);
    lb->ids = gm_test_h5_read(gm_test_path(REF), "/mm/input_ids", 1, &n, dims, &nd);
    lb->labels = gm_test_h5_read(gm_test_path(REF), "/lora/labels", 1, &n, NULL, NULL);
    lb->pix = gm_test_h5_read(gm_test_path(REF), "/mm/pixel_values", 0, &n, NULL, NULL);
    lb->loss_ref = gm_test_h5_read(gm_test_path(REF), loss_key, 2, &n, NULL, NULL);
    if (!lb->ids || !lb->labels || !lb->pix || !lb->loss_ref) return false;
    lb->B = dims[0], lb->T = dims[1];
    lb->tg = gm_malloc((size_t)(lb->B * lb->T) * 4);
    for (int64_t b = 0; b < lb->B; b++)
        for (int64_t t = 0; t < lb->T; t++) {
            int32_t next = t + 1 < lb->T ? lb->labels[b * lb->T + t + 1] : -100;
            lb->tg[b * lb->T + t] = next >= 0 ? next : -1;
            lb->n_sup += next >= 0;
        }
    return true;
}

/* The fixture's LoRA (r 4, alpha 8) for the whole batch with its 3 images, 2 threads. */
static gm_train_opts lora_batch_opts(const lora_batch *lb) {
    gm_train_opts o = gm_train_opts_default();
    o.lora.rank = 4;
    o.lora.alpha = 8;
    o.batch = lb->B;
    o.max_length = lb->T;
    o.max_images = 3;
    o.n_threads = 2;
    return o;
}

static void lora_batch_free(lora_batch *lb) {
    gm_free(lb->ids), gm_free(lb->labels), gm_free(lb->tg), gm_free(lb->pix), gm_free(lb->loss_ref);
}

/* The fixture's key of a trained tensor: "layers.3.self_attn.q_proj.A" (language model),
 * "vision.layers.0.mlp.fc1.B" (tower), "projector.mm_input_projection_weight" (projector). */
static const char *vt_key(const char *peft_name, char *buf, size_t cap) {
    const char *proj = strstr(peft_name, "multi_modal_projector.");
    if (proj) {
        snprintf(buf, cap, "projector.%s", proj + strlen("multi_modal_projector."));
        return buf;
    }
    char sn[120];
    short_name(peft_name, sn, sizeof sn);
    snprintf(buf, cap, "%s%s.%s", strstr(peft_name, "vision_tower") ? "vision." : "", sn,
             strstr(peft_name, ".lora_A.") ? "A" : "B");
    return buf;
}

/* Mean cross-entropy of logits (B*T, V) at the targets tg (B*T, -1: none). */
static double mm_loss(const float *logits, const int32_t *tg, int64_t BT, int64_t V) {
    double sum = 0;
    int64_t n = 0;
    for (int64_t r = 0; r < BT; r++) {
        if (tg[r] < 0) continue;
        const float *x = logits + r * V;
        double mx = x[0], z = 0;
        for (int64_t k = 1; k < V; k++) mx = fmax(mx, x[k]);
        for (int64_t k = 0; k < V; k++) z += exp((double)x[k] - mx);
        sum += mx + log(z) - x[tg[r]];
        n++;
    }
    return n ? sum / (double)n : 0;
}

/* A trained image path read back (gm_adapter_load of trainer tr's checkpoint): generation's
 * forward - the soft tokens of gm_vision_new_adapted through the decoder with the text adapters -
 * gives the trainer's loss on the batch within TOL_GEN_VS_TRAIN_ABS; the same without the
 * adapter's image path (the tower's LoRA, the projector) misses it by far more; on the strict
 * backend the same logits bit for bit. A new trainer
 * started from it (model_adapter) holds every trained tensor as tr does, bit for bit; one that
 * does not train the image path refuses it. */
static void check_adapter_readback(const gm_model *m, gm_trainer *tr, const gm_train_opts *o, const gm_batch *bt,
                                   const lora_batch *lb, const char *dir) {
    gm_error err = {0};
    char path[600];
    snprintf(path, sizeof path, "%s/readback.h5", dir);
    CHECK_OK(gm_trainer_save(tr, path, 0, 0, 0, "{}", &err), &err);
    double loss_sum = 0;
    gm_trainer_zero_grad(tr);
    CHECK_OK(gm_trainer_forward_backward(tr, bt, (float)(1.0 / (double)lb->n_sup), &loss_sum, &err), &err);
    double want = loss_sum / (double)lb->n_sup;
    gm_backend *be = gm_trainer_backend(tr);
    gm_adapter *a = NULL;
    CHECK(gm_adapter_load(m, be, path, NULL, &a, &err) == GM_OK, "gm_adapter_load of a checkpoint with the image path: %s",
          err.msg);
    if (!a) return;
    CHECK(a->vision_lora.n == 2 * 6 && a->has_proj && a->vision.tower == &a->vision_lora && a->vision.proj_w &&
              a->vision.proj_norm_w && a->lora.n == 6 * 3,
          "read back: %d text modules, %d tower modules, projector %d", a->lora.n, a->vision_lora.n, a->has_proj);
    CHECK(a->vision_lora.cfg.rank == 4 && a->vision_lora.scaling == a->lora.scaling,
          "the tower's rank %d and scaling %g are the text adapters' (%g)", a->vision_lora.cfg.rank,
          (double)a->vision_lora.scaling, (double)a->lora.scaling);
    int64_t BT = lb->B * lb->T, V = m->cfg.vocab_size;
    float *got = mm_logits_with(m, true, &a->lora, &a->vision, be);
    float *text_only = mm_logits_with(m, true, &a->lora, NULL, be);
    if (got && text_only) {
        double l = mm_loss(got, lb->tg, BT, V), l0 = mm_loss(text_only, lb->tg, BT, V);
        CHECK(fabs(l - want) <= TOL_GEN_VS_TRAIN_ABS, "loss through the read-back adapter %.9g vs the trainer's %.9g", l, want);
        CHECK(fabs(l0 - want) > 100 * TOL_GEN_VS_TRAIN_ABS, "without its image path the loss %.9g is far from the trainer's %.9g",
              l0, want);
        printf("adapter read back with its image path: loss %.7f vs the trainer's %.7f (without the image path: %.7f)\n", l, want,
               l0);
    }
    /* the same on the strict backend (memory the host cannot touch, as a GPU's): the adapter's
     * buffers and the adapted image path reach the kernels only as device memory */
    gm_backend *strict = NULL;
    gm_adapter *as = NULL;
    CHECK_OK(gm_backend_strict_new(2, &strict, &err), &err);
    if (strict) CHECK_OK(gm_adapter_load(m, strict, path, NULL, &as, &err), &err);
    float *got_strict = as ? mm_logits_with(m, true, &as->lora, &as->vision, strict) : NULL;
    CHECK(got && got_strict && memcmp(got, got_strict, (size_t)(BT * V) * sizeof(float)) == 0,
          "the read-back adapter's logits with images on the strict backend equal the CPU's bit for bit");
    gm_free(got_strict);
    gm_adapter_free(as);
    gm_backend_free(strict);
    gm_free(got), gm_free(text_only);
    gm_trainer *t3 = NULL;
    CHECK_OK(gm_trainer_new(m, o, &t3, &err), &err);
    if (t3) {
        CHECK_OK(gm_adapter_to_trainer(a, be, t3, &err), &err);
        int np = 0, n3 = 0, differ = 0;
        const gm_train_param *pp = gm_trainer_params(tr, &np), *p3 = gm_trainer_params(t3, &n3);
        for (int i = 0; i < np && n3 == np; i++) differ += memcmp(p3[i].p, pp[i].p, (size_t)pp[i].n * sizeof(float)) != 0;
        CHECK(n3 == np && differ == 0, "a trainer started from the read-back adapter: %d of %d trained tensors differ", differ, np);
        /* and its loss: the projector's norm scale follows its weight */
        double l3 = 0;
        gm_trainer_zero_grad(t3);
        CHECK_OK(gm_trainer_forward_backward(t3, bt, (float)(1.0 / (double)lb->n_sup), &l3, &err), &err);
        CHECK(l3 / (double)lb->n_sup == want, "its loss %.9g, the trainer's %.9g", l3 / (double)lb->n_sup, want);
    }
    gm_trainer_free(t3), t3 = NULL;
    gm_train_opts text_opts = *o;
    snprintf(text_opts.vision_targets, sizeof text_opts.vision_targets, "none");
    text_opts.train_projector = false;
    CHECK_OK(gm_trainer_new(m, &text_opts, &t3, &err), &err);
    if (t3)
        CHECK(gm_adapter_to_trainer(a, be, t3, &err) == GM_ERR_INVALID && gm_test_contains(err.msg, "trained the image path") &&
                  gm_test_contains(err.msg, "vision_targets / modules_to_save"),
              "a run without the image path from that adapter: %s", err.msg);
    gm_trainer_free(t3);
    /* a text-only model has no image path for it */
    gm_model *text = NULL;
    gm_adapter *b = NULL;
    if (gm_model_load(gm_test_path("tests/ref/tiny_gemma3"), NULL, &text, &err) == GM_OK)
        CHECK(gm_adapter_load(text, be, path, NULL, &b, &err) == GM_ERR_INVALID && gm_test_contains(err.msg, "image path") &&
                  gm_test_contains(err.msg, "no vision tower") && gm_test_contains(err.msg, "readback.h5"),
              "an image-path adapter on a text-only model: %s", err.msg);
    gm_adapter_free(b);
    gm_model_free(text);
    gm_adapter_free(a);
}

/* LoRA on the language model and on the vision tower's linears, the projector trained fully
 * (modules_to_save), with images: the loss, every gradient and the PEFT key of every trained
 * tensor against PEFT (/lora_vt); then a few steps train, and a checkpoint carries the tower's
 * adapters and the projector across. */
static void check_lora_vision(const gm_model *m) {
    size_t n = 0;
    lora_batch lb;
    char *peft_keys = gm_test_h5_attr_string(gm_test_path(REF), "/lora_vt", "peft_keys");
    CHECK(peft_keys != NULL, "/lora_vt has its peft_keys attribute");
    if (!lora_batch_load("/lora_vt/loss", &lb) || !peft_keys) {
        lora_batch_free(&lb), gm_free(peft_keys);
        return;
    }
    int64_t B = lb.B, T = lb.T, n_sup = lb.n_sup;
    const double *loss_ref = lb.loss_ref;
    gm_train_opts o = lora_batch_opts(&lb);
    snprintf(o.lora.targets, sizeof o.lora.targets, "q_proj,v_proj,down_proj");
    snprintf(o.vision_targets, sizeof o.vision_targets, "q_proj,k_proj,v_proj,out_proj,fc1,fc2");
    o.train_projector = true;
    gm_error err = {0};
    gm_trainer *tr = NULL;
    CHECK(gm_trainer_new(m, &o, &tr, &err) == GM_OK, "trainer with the tower and projector: %s", err.msg);
    if (tr) {
        int np = 0;
        const gm_train_param *pp = gm_trainer_params(tr, &np);
        /* 6 layers x 3 text modules + 2 tower layers x 6 modules, A and B each, + 2 projector tensors */
        CHECK(np == 2 * (6 * 3 + 2 * 6) + 2, "%d trained tensors (60 LoRA + 2 projector)", np);
        CHECK(gm_trainer_trains_vision(tr), "the trainer says the image path learns");
        char key[400], name[256];
        int unnamed = 0;
        for (int i = 0; i < np; i++) {
            /* the same PEFT keys as get_peft_model_state_dict on transformers' module tree */
            const char *hit = strstr(peft_keys, pp[i].name);
            size_t ln = strlen(pp[i].name);
            if (!hit || (hit != peft_keys && hit[-1] != '\n') || (hit[ln] != '\n' && hit[ln] != '\0')) {
                if (unnamed++ < 3) CHECK(false, "%s is not one of PEFT's keys", pp[i].name);
            }
            snprintf(name, sizeof name, "%s", pp[i].name);
            if (strstr(name, "multi_modal_projector")) continue; /* starts from the model's own weights */
            snprintf(key, sizeof key, "/lora_vt/%s", vt_key(name, key + 200, 200));
            float *v = gm_test_h5_read(gm_test_path(REF), key, 0, &n, NULL, NULL);
            CHECK(v && (int64_t)n == pp[i].n, "%s: %zu values for %lld", key, n, (long long)pp[i].n);
            if (v && (int64_t)n == pp[i].n) gm_backend_upload(gm_trainer_backend(tr), pp[i].p, v, n * sizeof(float));
            gm_free(v);
        }
        CHECK(unnamed == 0, "%d trained tensors named unlike PEFT", unnamed);
        gm_batch bt = {.B = B, .T = T, .ids = lb.ids, .targets = lb.tg, .pixels = lb.pix, .n_images = 3};
        double loss_sum = 0;
        gm_trainer_zero_grad(tr);
        CHECK(gm_trainer_forward_backward(tr, &bt, (float)(1.0 / (double)n_sup), &loss_sum, &err) == GM_OK, "step: %s",
              err.msg);
        double loss = loss_sum / (double)n_sup;
        CHECK(fabs(loss - loss_ref[0]) <= TOL_PEFT_LOSS_REL * fabs(loss_ref[0]), "loss %.9g vs PEFT %.9g", loss, loss_ref[0]);
        printf("LoRA on the tower + trained projector: loss %.7f vs PEFT %.7f\n", loss, loss_ref[0]);
        double worst[3] = {0, 0, 0}; /* language model, tower, projector */
        int seen[3] = {0, 0, 0};
        for (int i = 0; i < np; i++) {
            snprintf(name, sizeof name, "%s", pp[i].name);
            int part = strstr(name, "multi_modal_projector") ? 2 : strstr(name, "vision_tower") ? 1 : 0;
            snprintf(key, sizeof key, "/lora_vt/%s_grad", vt_key(name, key + 200, 200));
            float *want = gm_test_h5_read(gm_test_path(REF), key, 0, &n, NULL, NULL);
            if (!want || (int64_t)n != pp[i].n) {
                CHECK(false, "%s: missing or %zu values for %lld", key, n, (long long)pp[i].n);
                gm_free(want);
                continue;
            }
            worst[part] = fmax(worst[part], gm_test_rel_err(pp[i].d, want, n));
            seen[part]++;
            gm_free(want);
        }
        static const char *const part_name[3] = {"language-model LoRA", "tower LoRA", "projector"};
        for (int k = 0; k < 3; k++) {
            CHECK(seen[k] > 0 && worst[k] <= TOL_PEFT_GRAD_REL, "%s gradients: %d tensors, worst relative error %.3g",
                  part_name[k], seen[k], worst[k]);
            printf("%s gradients vs PEFT: %d tensors, worst relative error %.2e\n", part_name[k], seen[k], worst[k]);
        }
        /* optimizer steps move the tower's adapters and the projector, and the loss falls */
        double first = 0, last = 0;
        for (int s = 0; s < 4; s++) {
            gm_step_stats st;
            CHECK(gm_trainer_step(tr, &bt, 1, &st, &err) == GM_OK, "step %d: %s", s, err.msg);
            if (s == 0) first = st.loss;
            last = st.loss;
        }
        CHECK(last < first, "4 steps with lr 2e-4: loss %.6f -> %.6f falls", first, last);
        /* a checkpoint round trip restores every trained tensor, the projector's included */
        char dir[512], path[600];
        if (gm_test_make_tmpdir("vision_ckpt", dir, sizeof dir)) {
            snprintf(path, sizeof path, "%s/c.h5", dir);
            CHECK_OK(gm_trainer_save(tr, path, 0, 0, last, "{}", &err), &err);
            gm_trainer *t2 = NULL;
            CHECK_OK(gm_trainer_new(m, &o, &t2, &err), &err);
            if (t2) {
                CHECK_OK(gm_trainer_load(t2, path, NULL, NULL, &err), &err);
                int n2 = 0;
                const gm_train_param *p2 = gm_trainer_params(t2, &n2);
                int differ = 0;
                for (int i = 0; i < np && n2 == np; i++)
                    differ += memcmp(p2[i].p, pp[i].p, (size_t)pp[i].n * sizeof(float)) != 0 ||
                              memcmp(p2[i].v, pp[i].v, (size_t)pp[i].n * sizeof(float)) != 0;
                CHECK(n2 == np && differ == 0, "checkpoint round trip: %d of %d tensors differ", differ, np);
                gm_step_stats s1, s2;
                CHECK_OK(gm_trainer_step(tr, &bt, 1, &s1, &err), &err);
                CHECK_OK(gm_trainer_step(t2, &bt, 1, &s2, &err), &err);
                CHECK(s1.loss == s2.loss, "the step after resuming: loss %.9g vs %.9g uninterrupted", s2.loss, s1.loss);
            }
            gm_trainer_free(t2);
            check_adapter_readback(m, tr, &o, &bt, &lb, dir);
            gm_test_remove_tmpdir(dir);
        }
    }
    gm_trainer_free(tr);
    /* the tower's targets are checked against the tower's modules, and need images */
    o.max_images = 3;
    snprintf(o.vision_targets, sizeof o.vision_targets, "gate_proj");
    CHECK(gm_trainer_new(m, &o, &tr, &err) == GM_ERR_INVALID && gm_test_contains(err.msg, "vision_targets") &&
              gm_test_contains(err.msg, "fc1"),
          "a text module as a tower target: %s", err.msg);
    gm_trainer_free(tr), tr = NULL;
    snprintf(o.vision_targets, sizeof o.vision_targets, "fc1");
    o.max_images = 0;
    CHECK(gm_trainer_new(m, &o, &tr, &err) == GM_ERR_INVALID && gm_test_contains(err.msg, "no images"),
          "tower targets on text-only data: %s", err.msg);
    gm_trainer_free(tr);
    lora_batch_free(&lb), gm_free(peft_keys);
}

/* LoRA on the language model with images in the batch (tower and projector frozen): loss and
 * every adapter gradient against PEFT on the same adapters (/lora). */
/* The image path on a backend whose memory the host cannot touch (the strict backend, as a GPU's):
 * LoRA on the language model and the tower, the projector trained, with images - three steps
 * equal the CPU backend's bit for bit (losses and every trained tensor), and no kernel gets a
 * host pointer (the strict backend aborts on one): what a CUDA run of the same needs of the
 * model code, checked without a GPU. */
static void check_vision_strict(const gm_model *m) {
    lora_batch lb;
    if (!lora_batch_load("/lora_vt/loss", &lb)) {
        lora_batch_free(&lb);
        return;
    }
    gm_train_opts o = lora_batch_opts(&lb);
    snprintf(o.lora.targets, sizeof o.lora.targets, "q_proj,v_proj,down_proj");
    snprintf(o.vision_targets, sizeof o.vision_targets, "q_proj,k_proj,v_proj,out_proj,fc1,fc2");
    o.train_projector = true;
    gm_batch bt = {.B = lb.B, .T = lb.T, .ids = lb.ids, .targets = lb.tg, .pixels = lb.pix, .n_images = 3};
    gm_error err = {0};
    gm_backend *be[2] = {NULL, NULL};
    gm_trainer *tr[2] = {NULL, NULL};
    CHECK_OK(gm_backend_cpu_new(2, &be[0], &err), &err);
    CHECK_OK(gm_backend_strict_new(2, &be[1], &err), &err);
    double loss[2][3] = {{0}};
    for (int k = 0; k < 2 && be[k]; k++) {
        CHECK_OK(gm_trainer_new_on(m, &o, be[k], &tr[k], &err), &err);
        for (int s = 0; s < 3 && tr[k]; s++) {
            gm_step_stats st;
            CHECK_OK(gm_trainer_step(tr[k], &bt, 1, &st, &err), &err);
            loss[k][s] = st.loss;
        }
    }
    if (tr[0] && tr[1]) {
        CHECK(memcmp(loss[0], loss[1], sizeof loss[0]) == 0, "strict backend with images: losses %.9g %.9g %.9g vs the CPU's "
              "%.9g %.9g %.9g", loss[1][0], loss[1][1], loss[1][2], loss[0][0], loss[0][1], loss[0][2]);
        int n0 = 0, n1 = 0, differ = 0;
        const gm_train_param *p0 = gm_trainer_params(tr[0], &n0), *p1 = gm_trainer_params(tr[1], &n1);
        for (int i = 0; i < n0 && n0 == n1; i++) {
            float *got = gm_malloc((size_t)p1[i].n * sizeof(float));
            gm_backend_download(be[1], got, p1[i].p, (size_t)p1[i].n * sizeof(float));
            differ += memcmp(got, p0[i].p, (size_t)p0[i].n * sizeof(float)) != 0;
            gm_free(got);
        }
        CHECK(n0 == n1 && n0 > 0 && differ == 0, "strict backend with images: %d of %d trained tensors differ from the CPU's",
              differ, n0);
        printf("image path on the strict backend: 3 steps, losses and %d trained tensors equal the CPU's bit for bit\n", n0);
    }
    gm_trainer_free(tr[0]), gm_trainer_free(tr[1]);
    gm_backend_free(be[0]), gm_backend_free(be[1]);
    lora_batch_free(&lb);
}

static void check_lora(const gm_model *m) {
    size_t n = 0;
    lora_batch lb;
    if (!lora_batch_load("/lora/loss", &lb)) {
        lora_batch_free(&lb);
        return;
    }
    int64_t B = lb.B, T = lb.T, n_sup = lb.n_sup;
    const int32_t *ids = lb.ids, *tg = lb.tg;
    const float *pix = lb.pix;
    const double *loss_ref = lb.loss_ref;
    gm_train_opts o = lora_batch_opts(&lb);
    gm_error err = {0};
    gm_trainer *tr = NULL;
    CHECK(gm_trainer_new(m, &o, &tr, &err) == GM_OK, "trainer with images: %s", err.msg);
    if (tr) {
        int na = 0;
        gm_lora_adapter *ad = gm_trainer_adapters(tr, &na);
        CHECK(na == 6 * 7, "%d adapters (language model only: 6 layers x 7 linears)", na);
        char key[256], sn[200];
        for (int i = 0; i < na; i++) {
            short_name(ad[i].name_A, sn, sizeof sn);
            snprintf(key, sizeof key, "/lora/%s.A", sn);
            float *a = gm_test_h5_read(gm_test_path(REF), key, 0, &n, NULL, NULL);
            snprintf(key, sizeof key, "/lora/%s.B", sn);
            float *bb = gm_test_h5_read(gm_test_path(REF), key, 0, &n, NULL, NULL);
            if (a) gm_trainer_write_adapter(tr, i, 'A', a);
            if (bb) gm_trainer_write_adapter(tr, i, 'B', bb);
            gm_free(a), gm_free(bb);
        }
        gm_batch bt = {.B = B, .T = T, .ids = ids, .targets = tg, .pixels = pix, .n_images = 3};
        double loss_sum = 0;
        gm_trainer_zero_grad(tr);
        CHECK(gm_trainer_forward_backward(tr, &bt, (float)(1.0 / (double)n_sup), &loss_sum, &err) == GM_OK, "step: %s",
              err.msg);
        double loss = loss_sum / (double)n_sup;
        CHECK(fabs(loss - loss_ref[0]) <= TOL_PEFT_LOSS_REL * fabs(loss_ref[0]), "loss %.9g vs PEFT %.9g", loss, loss_ref[0]);
        printf("LoRA with images: loss %.7f vs PEFT %.7f\n", loss, loss_ref[0]);
        double worst = 0;
        for (int i = 0; i < na; i++)
            for (int ab = 0; ab < 2; ab++) {
                short_name(ad[i].name_A, sn, sizeof sn);
                snprintf(key, sizeof key, "/lora/%s.%s_grad", sn, ab ? "B" : "A");
                float *want = gm_test_h5_read(gm_test_path(REF), key, 0, &n, NULL, NULL);
                if (!want) continue;
                const float *got = ab ? ad[i].dB : ad[i].dA;
                worst = fmax(worst, gm_test_rel_err(got, want, n));
                gm_free(want);
            }
        CHECK(worst <= TOL_PEFT_GRAD_REL, "LoRA gradients with images: worst relative error %.3g", worst);
        printf("LoRA gradients with images vs PEFT: worst relative error %.2e\n", worst);
        /* label scoring repeats one example's image per candidate: three copies of the first
         * sequence score as the sequence alone, through one tower pass */
        {
            int64_t S = m->cfg.vision.image_size, px = 3 * S * S;
            int32_t *ids3 = gm_malloc((size_t)(3 * T) * 4), *tg3 = gm_malloc((size_t)(3 * T) * 4);
            float *pix3 = gm_malloc((size_t)(3 * px) * 4);
            for (int c = 0; c < 3; c++) {
                memcpy(ids3 + c * T, ids, (size_t)T * 4), memcpy(tg3 + c * T, tg, (size_t)T * 4);
                memcpy(pix3 + c * px, pix, (size_t)px * 4);
            }
            gm_batch one = {.B = 1, .T = T, .ids = ids, .targets = tg, .pixels = pix, .n_images = 1};
            gm_batch three = {.B = 3, .T = T, .ids = ids3, .targets = tg3, .pixels = pix3, .n_images = 3};
            double lp1[1], lp3[3];
            CHECK_OK(gm_trainer_score(tr, &one, lp1, &err), &err);
            int64_t before = gm_trainer_images_encoded(tr);
            CHECK_OK(gm_trainer_score(tr, &three, lp3, &err), &err);
            long long passes = (long long)(gm_trainer_images_encoded(tr) - before);
            CHECK(passes == 1, "3 copies of an image: %lld tower passes (want 1)", passes);
            double d = 0;
            for (int c = 0; c < 3; c++) d = fmax(d, fabs(lp3[c] - lp1[0]));
            CHECK(d <= TOL_VISION_SCORE_BATCH_ABS, "3 copies score as one: max |diff| %.3g (log-prob %.6f)", d, lp1[0]);
            printf("3 copies of an image in one scoring batch: %lld tower pass(es), max log-prob diff %.3g to the sequence alone\n",
                   passes, d);
            gm_free(ids3), gm_free(tg3), gm_free(pix3);
        }
        /* a batch whose image count does not match its image tokens is refused, naming both */
        gm_batch bad = bt;
        bad.n_images = 2;
        CHECK(gm_trainer_forward_backward(tr, &bad, 1.0f, &loss_sum, &err) == GM_ERR_INVALID &&
                  gm_test_contains(err.msg, "12 image tokens but 2 images"),
              "image count mismatch: %s", err.msg);
    }
    gm_trainer_free(tr);
    /* images on a text-only model: refused before anything is allocated */
    gm_model *text = NULL;
    if (gm_model_load(gm_test_path("tests/ref/tiny_gemma3"), NULL, &text, &err) == GM_OK) {
        o.max_length = T;
        CHECK(gm_trainer_new(text, &o, &tr, &err) == GM_ERR_INVALID && gm_test_contains(err.msg, "no vision tower"),
              "images on a text-only model: %s", err.msg);
        gm_model_free(text);
    }
    lora_batch_free(&lb);
}

/* Examples with images (gm_dataset_add_chat_images) on the tiny multimodal model's tokenizer:
 * each <start_of_image> becomes "\n\n" boi, 4 soft tokens, eoi "\n\n" as transformers' processor
 * writes it; placeholders and images must agree in number; max_length never cuts into an image. */
static void check_data(void) {
    gm_error err = {0};
    gm_model *m = NULL;
    if (gm_model_load(gm_test_path("tests/ref/tiny_gemma3_vision_chat"), NULL, &m, &err) != GM_OK) {
        CHECK(false, "load tiny_gemma3_vision_chat: %s", err.msg);
        return;
    }
    const gm_vision_config *v = &m->cfg.vision;
    gm_mm_spec mm = {.boi_id = v->boi_id, .eoi_id = v->eoi_id, .image_token_id = v->image_token_id, .tokens = v->tokens};
    gm_chat_msg msgs[2] = {{"user", "<start_of_image>What is it?"}, {"assistant", "A cat"}};
    const char *imgs[2] = {"a.jpg", "b.jpg"}, *sha[2] = {"00", "11"};
    gm_dataset ds;
    gm_dataset_init(&ds);
    CHECK(gm_dataset_add_chat_images(&ds, m->tok, msgs, 2, 64, -1, &mm, imgs, sha, 1, NULL, NULL, &err) == GM_OK, "add: %s", err.msg);
    if (ds.n == 1) {
        const gm_example *e = &ds.ex[0];
        /* transformers' processor: the template's text with "<start_of_image>" replaced by
         * "\n\n<start_of_image>" + 4 x "<image_soft_token>" + "<end_of_image>\n\n", tokenized */
        static const char want_text[] = "<start_of_turn>user\n\n\n<start_of_image><end_of_image>\n\nWhat is it?<end_of_turn>\n"
                                        "<start_of_turn>model\nA cat<end_of_turn>\n";
        int32_t *w = NULL;
        int64_t nw = 0, b = -1;
        CHECK(gm_tokenizer_encode_alloc(m->tok, want_text, sizeof want_text - 1, true, true, &w, &nw, &err) == GM_OK, "%s", err.msg);
        for (int64_t i = 0; i < nw; i++)
            if (w[i] == v->boi_id) b = i;
        bool ok = b > 0 && e->n == nw + 4;
        for (int64_t i = 0; ok && i < e->n; i++) {
            int32_t want = i <= b ? w[i] : i <= b + 4 ? v->image_token_id : w[i - 4];
            ok = e->ids[i] == want;
        }
        CHECK(ok, "the image expands as transformers' processor writes it (%lld tokens, expected %lld)", (long long)e->n,
              (long long)(nw + 4));
        gm_free(w);
        CHECK(e->n_images == 1 && strcmp(e->images[0], "a.jpg") == 0 && gm_dataset_max_images(&ds) == 1, "the example's images");
        /* a max_length that cuts between boi and eoi: refused, naming the image and the span */
        int64_t cut = b + 3; /* between the image's boi and eoi */
        CHECK(gm_dataset_add_chat_images(&ds, m->tok, msgs, 2, cut, -1, &mm, imgs, sha, 1, NULL, NULL, &err) == GM_ERR_INVALID &&
                  gm_test_contains(err.msg, "cuts into image 1 (a.jpg)"),
              "max_length inside the image: %s", err.msg);
        /* at the image's end exactly (eoi is the last kept token): also a cut (no response left
         * anyway); the data set still holds one example */
        CHECK(ds.n == 1, "refused examples are not added (%lld)", (long long)ds.n);
    }
    /* a typed <image_soft_token> (no image to fill it): refused */
    gm_chat_msg typed[2] = {{"user", "plain <image_soft_token> text"}, {"assistant", "ok"}};
    CHECK(gm_dataset_add_chat_images(&ds, m->tok, typed, 2, 64, -1, &mm, NULL, NULL, 0, NULL, NULL, &err) == GM_ERR_INVALID &&
              gm_test_contains(err.msg, "<image_soft_token> tokens (id 511), which only images may fill"),
          "a typed soft token: %s", err.msg);
    CHECK(gm_dataset_add_chat_images(&ds, m->tok, msgs, 2, 64, -1, &mm, imgs, sha, 2, NULL, NULL, &err) == GM_ERR_INVALID &&
              gm_test_contains(err.msg, "1 image placeholders (<start_of_image>) but 2 images"),
          "placeholders vs images: %s", err.msg);
    gm_dataset_free(&ds);
    gm_model_free(m);
}

/* Pan & scan in the prompt and the pixels (tests/ref/pas_ref.json, tests/ref/make_pas_ref.py:
 * transformers' Gemma3Processor with do_pan_and_scan): per case, the crop counts gm_image_check's
 * size gives, the example's ids equal the processor's input_ids, and gm_batch_images gives each
 * image followed by its crops, bit for bit what gm_image_preprocess_file with pan & scan gives
 * (whose pixels test_image checks against the processor's). */
static void check_pan_and_scan(void) {
    gm_error err = {0};
    gm_model *m = NULL;
    char *buf = NULL;
    size_t len = 0;
    if (gm_model_load(gm_test_path("tests/ref/tiny_gemma3_vision_chat"), NULL, &m, &err) != GM_OK ||
        gm_read_file(gm_test_path("tests/ref/pas_ref.json"), &buf, &len, &err) != GM_OK) {
        CHECK(false, "pan & scan fixture: %s", err.msg);
        gm_model_free(m);
        return;
    }
    cJSON *j = cJSON_ParseWithLength(buf, len);
    gm_free(buf);
    const gm_vision_config *v = &m->cfg.vision;
    gm_mm_spec mm = {.boi_id = v->boi_id, .eoi_id = v->eoi_id, .image_token_id = v->image_token_id, .tokens = v->tokens};
    const int64_t S = v->image_size;
    const cJSON *cases = cJSON_GetObjectItem(j, "cases"), *c;
    int n_cases = 0, with_crops = 0;
    cJSON_ArrayForEach(c, cases) {
        const cJSON *jimgs = cJSON_GetObjectItem(c, "images"), *jids = cJSON_GetObjectItem(c, "input_ids");
        const cJSON *jcrops = cJSON_GetObjectItem(c, "num_crops");
        int64_t n_img = cJSON_GetArraySize(jimgs), views = 0;
        char paths[4][512];
        const char *imgs[4], *sha[4];
        char shas[4][65];
        int64_t crops[4];
        for (int64_t i = 0; i < n_img && i < 4; i++) {
            snprintf(paths[i], sizeof paths[i], "%s", gm_test_path("tests/ref/images"));
            snprintf(paths[i] + strlen(paths[i]), sizeof paths[i] - strlen(paths[i]), "/%s",
                     cJSON_GetArrayItem(jimgs, (int)i)->valuestring);
            imgs[i] = paths[i], sha[i] = shas[i];
            int64_t w = 0, h = 0;
            CHECK_OK(gm_image_check(NULL, paths[i], shas[i], &w, &h, &err), &err);
            gm_image_opts o = gm_image_opts_gemma3(S);
            gm_image_rect r[GM_IMAGE_MAX_CROPS];
            crops[i] = gm_image_pan_and_scan_crops(w, h, &o, r, GM_IMAGE_MAX_CROPS);
            CHECK(crops[i] == cJSON_GetArrayItem(jcrops, (int)i)->valueint, "%s: %lld crops, the processor %d", paths[i],
                  (long long)crops[i], cJSON_GetArrayItem(jcrops, (int)i)->valueint);
            views += 1 + crops[i], with_crops += crops[i] > 0;
        }
        /* the processor's text is the chat template's: user turn, then model turn */
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        const char *u0 = strstr(text, "user\n") + 5, *u1 = strstr(u0, "<end_of_turn>");
        const char *a0 = strstr(u1, "model\n") + 6, *a1 = strstr(a0, "<end_of_turn>");
        char user[256], model[256];
        snprintf(user, sizeof user, "%.*s", (int)(u1 - u0), u0);
        snprintf(model, sizeof model, "%.*s", (int)(a1 - a0), a0);
        gm_chat_msg msgs[2] = {{"user", user}, {"assistant", model}};
        gm_dataset ds;
        gm_dataset_init(&ds);
        CHECK_OK(gm_dataset_add_chat_images(&ds, m->tok, msgs, 2, 512, -1, &mm, imgs, sha, n_img, crops, NULL, &err), &err);
        if (ds.n != 1) {
            gm_dataset_free(&ds);
            continue;
        }
        const gm_example *e = &ds.ex[0];
        int64_t nw = cJSON_GetArraySize(jids), first_diff = -1;
        for (int64_t t = 0; t < nw && t < e->n && first_diff < 0; t++)
            if (e->ids[t] != cJSON_GetArrayItem(jids, (int)t)->valueint) first_diff = t;
        CHECK(e->n == nw && first_diff < 0, "%s...: %lld ids, the processor %lld; first difference at %lld", imgs[0], (long long)e->n,
              (long long)nw, (long long)first_diff);
        CHECK(gm_example_views(e) == views && views == cJSON_GetObjectItem(c, "n_pixel_values")->valueint &&
                  gm_dataset_max_images(&ds) == views,
              "%lld views, the processor's pixel_values %d", (long long)gm_example_views(e),
              cJSON_GetObjectItem(c, "n_pixel_values")->valueint);
        /* the pixels: images and crops in the processor's order */
        float *px = gm_malloc((size_t)(views * 3 * S * S) * sizeof(float));
        int64_t idx0 = 0, got = 0;
        CHECK_OK(gm_batch_images(&ds, &idx0, 1, S, views, px, NULL, &got, &err), &err);
        gm_image_opts o = gm_image_opts_gemma3(S);
        o.pan_and_scan = true;
        int64_t at = 0, bad = 0;
        for (int64_t i = 0; px && got == views && i < n_img; i++) {
            gm_image_pixels want = {0};
            CHECK_OK(gm_image_preprocess_file(imgs[i], NULL, &o, &want, &err), &err);
            bad += want.n != 1 + crops[i] || memcmp(px + at * 3 * S * S, want.data, (size_t)(want.n * 3 * S * S) * sizeof(float)) != 0;
            at += want.n;
            gm_image_pixels_free(&want);
        }
        CHECK(got == views && bad == 0, "gm_batch_images: %lld images (want %lld), %lld differ from the preprocessed crops",
              (long long)got, (long long)views, (long long)bad);
        /* one slot short: refused, not overrun */
        CHECK(views < 2 || gm_batch_images(&ds, &idx0, 1, S, views - 1, px, NULL, &got, &err) == GM_ERR_INVALID,
              "fewer slots than images and crops");
        /* max_length inside the last crop's tokens: refused, naming the image and its crops */
        if (crops[n_img - 1] > 0) {
            int64_t last_boi = -1;
            for (int64_t t = 0; t < e->n; t++)
                if (e->ids[t] == v->boi_id) last_boi = t;
            CHECK(gm_dataset_add_chat_images(&ds, m->tok, msgs, 2, last_boi + 2, -1, &mm, imgs, sha, n_img, crops, NULL, &err) ==
                          GM_ERR_INVALID &&
                      gm_test_contains(err.msg, "with its pan & scan crops"),
                  "max_length inside a crop: %s", err.msg);
        }
        gm_free(px);
        gm_dataset_free(&ds);
        n_cases++;
    }
    CHECK(n_cases == 2 && with_crops == 2, "pan & scan fixture: %d cases, %d images with crops", n_cases, with_crops);
    printf("pan & scan: %d cases from transformers' processor, ids and pixels equal\n", n_cases);
    cJSON_Delete(j);
    gm_model_free(m);
}

/* Copies file `from` to `to`; false on failure. */
static bool copy_file(const char *from, const char *to) {
    FILE *f = fopen(from, "rb"), *g = f ? fopen(to, "wb") : NULL;
    bool ok = f && g;
    char buf[65536];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, f)) > 0) ok = fwrite(buf, 1, n, g) == n;
    if (f) fclose(f);
    if (g && fclose(g) != 0) ok = false;
    return ok;
}

/* Whether two files hold the same bytes. */
static bool same_bytes(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    gm_error err = {0};
    bool same = gm_read_file(a, &x, &nx, &err) == GM_OK && gm_read_file(b, &y, &ny, &err) == GM_OK && nx == ny &&
                memcmp(x, y, nx) == 0;
    gm_free(x), gm_free(y);
    return same;
}

/* gm_model_save_with_tower (core/store/gm_merged.h) on the tiny text model with a tokenizer that
 * has the image markers: the folder loads as a multimodal model of the asked shape, its decoder
 * gives the text model's logits bit for bit, its tower runs an image, its weights are drawn as
 * documented (std 0.02, zero biases and RMSNorm w, unit LayerNorm weights), the same seed gives the
 * same bytes and another seed others; misfit shapes, a model with a tower and a vocabulary without
 * <start_of_image> are refused before anything is written. */
static void check_with_tower(void) {
    char tmp[512], src[700], path[800];
    if (!gm_test_make_tmpdir("with_tower", tmp, sizeof tmp)) return;
    snprintf(src, sizeof src, "%s/text", tmp);
    mkdir(src, 0755);
    snprintf(path, sizeof path, "%s/config.json", src);
    bool ok = copy_file(gm_test_path("tests/ref/tiny_gemma3_chat/config.json"), path);
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    ok = ok && copy_file(gm_test_path("tests/ref/tiny_gemma3_chat/model.safetensors"), path);
    snprintf(path, sizeof path, "%s/tokenizer.json", src); /* the same 512 ids, with the image markers */
    ok = ok && copy_file(gm_test_path("tests/ref/tiny_gemma3_vision_chat/tokenizer.json"), path);
    CHECK(ok, "copy the tiny text model");
    gm_error err = {0};
    gm_model *text = NULL, *mm = NULL, *plain = NULL;
    CHECK(gm_model_load(src, NULL, &text, &err) == GM_OK, "load the text model: %s", err.msg);
    if (!text) goto done;
    gm_vision_config v = {.hidden_size = 32, .n_layers = 1, .n_heads = 4, .intermediate_size = 48, .image_size = 28,
                          .patch_size = 14, .tokens = 4};
    char out[800], out2[800], out3[800];
    snprintf(out, sizeof out, "%s/mm", tmp);
    snprintf(out2, sizeof out2, "%s/mm2", tmp);
    snprintf(out3, sizeof out3, "%s/mm3", tmp);
    CHECK(gm_model_save_with_tower(text, &v, 7, GM_F32, out, NULL, &err) == GM_OK, "with a tower: %s", err.msg);
    CHECK(gm_model_save_with_tower(text, &v, 7, GM_F32, out2, NULL, &err) == GM_OK, "again: %s", err.msg);
    CHECK(gm_model_save_with_tower(text, &v, 8, GM_F32, out3, NULL, &err) == GM_OK, "another seed: %s", err.msg);
    char a[900], b[900];
    snprintf(a, sizeof a, "%s/model.safetensors", out);
    snprintf(b, sizeof b, "%s/model.safetensors", out2);
    CHECK(same_bytes(a, b), "the same seed gives the same bytes");
    snprintf(b, sizeof b, "%s/model.safetensors", out3);
    CHECK(!same_bytes(a, b), "another seed gives other weights");
    CHECK(gm_model_load(out, NULL, &mm, &err) == GM_OK, "load the multimodal folder: %s", err.msg);
    if (mm) {
        const gm_vision_config *c = &mm->cfg.vision;
        CHECK(mm->vision && c->hidden_size == 32 && c->n_layers == 1 && c->n_heads == 4 && c->intermediate_size == 48 &&
                  c->image_size == 28 && c->patch_size == 14 && c->tokens == 4 && c->out_hidden_size == 64,
              "the tower's shape read back from config.json");
        CHECK(c->boi_id == 509 && c->eoi_id == 510 && c->image_token_id == 511, "the image markers are the vocabulary's (%d %d %d)",
              c->boi_id, c->eoi_id, c->image_token_id);
        CHECK(strcmp(mm->prefix, "language_model.model.") == 0, "the hub's layout (%s)", mm->prefix);
        /* the decoder is the text model's, bit for bit */
        static const int32_t ids[] = {2, 17, 300, 41, 5, 99};
        float l1[6 * 512], l2[6 * 512];
        gm_test_cached_logits(text, NULL, NULL, ids, 6, l1);
        gm_test_cached_logits(mm, NULL, NULL, ids, 6, l2);
        CHECK(memcmp(l1, l2, sizeof l1) == 0, "the decoder's logits are the text model's bit for bit");
        /* the draw: std 0.02 where drawn, constants elsewhere */
        const gm_model *t = mm->vision;
        const gm_tensor *pe = &t->global[GM_SIGLIP_PATCH], *pr = &t->global[GM_SIGLIP_MM_PROJ], *nb = &t->global[GM_SIGLIP_MM_NORM];
        double s2 = 0, s1 = 0;
        int64_t n = gm_tensor_numel(pe);
        for (int64_t i = 0; i < n; i++) s1 += ((const float *)pe->data)[i], s2 += (double)((const float *)pe->data)[i] * ((const float *)pe->data)[i];
        double sd = sqrt(s2 / (double)n - (s1 / (double)n) * (s1 / (double)n));
        CHECK(fabs(sd - 0.02) < 0.002, "the patch embedding is drawn with std 0.02 (%.4f over %lld values)", sd, (long long)n);
        float pmax = 0;
        for (int64_t i = 0; i < gm_tensor_numel(pr); i++) pmax = fmaxf(pmax, fabsf(((const float *)pr->data)[i]));
        CHECK(pmax > 0.02f && pmax < 0.2f, "the projector is drawn, not zero (max |w| %.3f)", pmax);
        bool unit = true;
        for (int64_t i = 0; i < gm_tensor_numel(nb); i++) unit = unit && ((const float *)nb->data)[i] == 1.0f;
        CHECK(unit, "the projector's RMSNorm scale 1 + w is 1");
        /* the tower runs an image */
        gm_vision *vis = NULL;
        CHECK(gm_vision_new(mm, 1, 2, NULL, &vis, &err) == GM_OK, "gm_vision_new: %s", err.msg);
        if (vis) {
            float px[3 * 28 * 28], so[4 * 64];
            uint64_t st = 5;
            for (int i = 0; i < 3 * 28 * 28; i++) px[i] = gm_test_rand(&st);
            CHECK(gm_vision_encode(vis, px, 1, so, NULL, &err) == GM_OK, "encode: %s", err.msg);
            bool finite = true, nonzero = false;
            for (int i = 0; i < 4 * 64; i++) finite = finite && isfinite(so[i]), nonzero = nonzero || so[i] != 0;
            CHECK(finite && nonzero, "an image's soft tokens are finite and not zero");
        }
        gm_vision_free(vis);
        /* a model that already has a tower */
        CHECK(gm_model_save_with_tower(mm, &v, 7, GM_F32, out3, NULL, &err) == GM_ERR_INVALID &&
                  gm_test_contains(err.msg, "already has a vision tower"),
              "a model with a tower: %s", err.msg);
    }
    /* misfit shapes: named, nothing written */
    char bad[800];
    snprintf(bad, sizeof bad, "%s/bad", tmp);
    gm_vision_config w = v;
    w.tokens = 3;
    CHECK(gm_model_save_with_tower(text, &w, 7, GM_F32, bad, NULL, &err) == GM_ERR_INVALID &&
              gm_test_contains(err.msg, "mm_tokens_per_image = 3 must be a square") && !gm_test_file_exists(bad),
          "3 tokens per image: %s", err.msg);
    w = v, w.n_heads = 5;
    CHECK(gm_model_save_with_tower(text, &w, 7, GM_F32, bad, NULL, &err) == GM_ERR_INVALID &&
              gm_test_contains(err.msg, "num_attention_heads = 5 does not divide hidden_size = 32") && !gm_test_file_exists(bad),
          "5 heads of a width 32: %s", err.msg);
    CHECK(gm_model_save_with_tower(text, &v, 7, GM_F16, bad, NULL, &err) == GM_ERR_INVALID && !gm_test_file_exists(bad),
          "f16: %s", err.msg);
    /* a vocabulary without <start_of_image> */
    CHECK(gm_model_load(gm_test_path("tests/ref/tiny_gemma3_chat"), NULL, &plain, &err) == GM_OK, "load: %s", err.msg);
    if (plain)
        CHECK(gm_model_save_with_tower(plain, &v, 7, GM_F32, bad, NULL, &err) == GM_ERR_INVALID &&
                  gm_test_contains(err.msg, "no <start_of_image>") && !gm_test_file_exists(bad),
              "no image markers: %s", err.msg);
done:
    gm_model_free(plain);
    gm_model_free(mm);
    gm_model_free(text);
    gm_test_remove_tmpdir(tmp);
}

int main(void) {
    /* the three key layouts (make_vision_ref.py): hub, converters', transformers 5's save */
    const char *dirs[3] = {"tests/ref/tiny_gemma3_vision", "tests/ref/tiny_gemma3_vision_newkeys",
                           "tests/ref/tiny_gemma3_vision_t5"};
    const char *want_prefix[3] = {"language_model.model.", "model.language_model.", "language_model.model."};
    const char *want_tower[3] = {"vision_tower.vision_model.", "model.vision_tower.vision_model.", "vision_tower."};
    for (int i = 0; i < 3; i++) {
        gm_error err = {0};
        gm_model *m = NULL;
        CHECK(gm_model_load(gm_test_path(dirs[i]), NULL, &m, &err) == GM_OK, "load %s: %s", dirs[i], err.msg);
        if (!m) continue;
        CHECK(strcmp(m->prefix, want_prefix[i]) == 0, "%s: text prefix '%s'", dirs[i], m->prefix);
        CHECK(m->vision != NULL, "%s: no vision tower loaded", dirs[i]);
        if (m->vision) {
            CHECK(strcmp(m->vision->prefix, want_tower[i]) == 0, "%s: tower prefix '%s'", dirs[i], m->vision->prefix);
            CHECK(m->cfg.vision.image_token_id == 511 && m->cfg.vision.boi_id == 509 && m->cfg.vision.eoi_id == 510,
                  "%s: image token ids %d %d %d", dirs[i], m->cfg.vision.image_token_id, m->cfg.vision.boi_id,
                  m->cfg.vision.eoi_id);
            check_tower(m, dirs[i]);
            if (i == 0) check_mm(m), check_lora(m), check_lora_vision(m), check_vision_strict(m), check_generate(m);
        }
        gm_model_free(m);
    }
    check_data();
    check_pan_and_scan();
    check_with_tower();
    /* a text-only checkpoint has no image path: a clear error */
    gm_error err = {0};
    gm_model *m = NULL;
    gm_vision *v = NULL;
    if (gm_model_load(gm_test_path("tests/ref/tiny_gemma3"), NULL, &m, &err) == GM_OK) {
        CHECK(m->vision == NULL, "tiny_gemma3 is text only");
        CHECK(gm_vision_new(m, 1, 2, NULL, &v, &err) == GM_ERR_INVALID && gm_test_contains(err.msg, "no vision tower"),
              "text-only model: %s", err.msg);
    }
    gm_model_free(m);
    return gm_test_finish();
}

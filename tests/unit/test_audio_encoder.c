/*
 * test_audio_encoder.c - Gemma 3n's audio encoder and embedder (core/audio/gm_audio_encoder.h)
 * against transformers 5.24 on real speech: the tiny random Gemma3nForConditionalGeneration of
 * tests/ref/tiny_gemma3n_audio (make_gemma3n_audio_ref.py) fed the log-mel features of Debian's
 * hello-world.wav and vm-goodbye.wav as one padded batch; the sub-sampling output, each conformer
 * block's output, the encoder's output and mask, and the soft tokens as Gemma3nModel puts them
 * into the prompt (padding frames and extra positions: the padding token's embedding) compared,
 * every frame (the padded clip's padding frames too, some of whose queries see no key); each clip
 * alone gives its rows of the batch;
 * the errors (a model without an audio tower, a batch over the plan, a clip giving too many soft
 * tokens).
 */
#include "test_util.h"

#include "gm_alloc.h"
#include "gm_audio_encoder.h"
#include "gm_backend.h"
#include "gm_decoder.h"
#include "gm_generate.h"
#include "gm_mm_embed.h"
#include "gm_model.h"
#include "gm_train.h"

#include <math.h>
#include <string.h>

static char REF[1024];

typedef struct stage_cmp {
    int n_seen;
    int B;                 /* clips in the run (1: clip `clip` of the fixture alone) */
    int clip;
    int64_t T_ref;         /* frames per clip in the reference's stage (its batch) */
} stage_cmp;

static float *read_f(const char *ds, int64_t *dims, int *nd) {
    size_t n = 0;
    return gm_test_h5_read(REF, ds, 0, &n, dims, nd);
}

/* Compares a traced stage with the reference dataset of the same name (rows of the clip(s) run). */
static void on_stage(void *user, const char *stage, const float *x, int64_t rows, int64_t cols) {
    stage_cmp *s = user;
    int64_t dims[4];
    int nd = 0;
    float *want = read_f(stage, dims, &nd);
    CHECK(want && nd == 3 && dims[2] == cols, "reference %s readable, width %lld", stage, (long long)cols);
    if (!want || nd != 3) return;
    int64_t per = rows / s->B;
    CHECK(s->B == 2 ? per == dims[1] : per <= dims[1], "%s: %lld frames per clip (reference %lld)", stage, (long long)per,
          (long long)dims[1]);
    char what[96];
    snprintf(what, sizeof what, "%s (%s)", stage, s->B == 2 ? "batch of 2" : s->clip == 0 ? "clip 0 alone" : "clip 1 alone");
    const float *ref = s->B == 2 ? want : want + s->clip * dims[1] * cols;
    size_t n = (size_t)(per * cols) * (size_t)s->B;
    double worst = gm_check_close(what, x, ref, n, TOL_AUDIO_ENCODER_ABS, 0.0), big = 0;
    for (size_t i = 0; i < n; i++) big = fabs(ref[i]) > big ? fabs(ref[i]) : big;
    printf("%-26s max |diff| %.3g (values up to %.3g)\n", what, worst, big);
    s->n_seen++;
    gm_free(want);
}

/* The logits of the fixture's two prompts, each with its clip's soft tokens (from the encoder run
 * just made: e->soft) at its audio soft token positions and the hard multimodal tokens' embeddings
 * at theirs, from one batch through the decoder (all positions). NULL on failure (counted). */
static float *audio_logits(const gm_model *m, const gm_mm_hard *hard, const gm_audio_encoder *e, const int32_t *ids,
                           int64_t B, int64_t T) {
    gm_error err;
    int64_t N = B * T, C = m->cfg.hidden_size, V = m->cfg.vocab_size;
    float *emb = gm_malloc((size_t)(N * C) * sizeof(float)), *soft = gm_malloc((size_t)(B * e->d.soft_tokens * C) * 4);
    int64_t *rows = gm_malloc((size_t)N * sizeof(int64_t)), *hrows = gm_malloc((size_t)N * sizeof(int64_t));
    const float **hptr = gm_malloc((size_t)N * sizeof(float *));
    gm_backend_download(e->be, soft, e->soft, (size_t)(B * e->d.soft_tokens * C) * sizeof(float));
    int64_t n_hard = gm_mm_hard_place(hard, ids, N, hptr, hrows, N), n = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t j = 0;
        for (int64_t t = 0; t < T; t++)
            if (ids[b * T + t] == m->cfg.audio.audio_token_id && j < e->d.soft_tokens) {
                memcpy(emb + n * C, soft + (b * e->d.soft_tokens + j++) * C, (size_t)C * sizeof(float));
                rows[n++] = b * T + t;
            }
    }
    CHECK(n == B * e->d.soft_tokens && n_hard == 7, "placed %lld soft tokens (%lld) and %lld hard ones (7)", (long long)n,
          (long long)(B * e->d.soft_tokens), (long long)n_hard);
    gm_infer *st = NULL;
    gm_infer_opts io = {.batch = B, .max_tokens = T, .ctx = T, .logit_rows = N, .n_threads = 2};
    float *out = NULL;
    if (gm_infer_new(m, &io, &st, &err) == GM_OK) {
        gm_graph_input in = {.B = B, .T = T, .ids = ids, .embeds = emb, .embed_rows = rows, .n_embeds = n,
                             .ptr_embeds = hptr, .ptr_rows = hrows, .n_ptr_embeds = n_hard};
        gm_status s = gm_decoder_forward_input(st, &in, true, &err);
        CHECK(s == GM_OK, "forward with audio: %s", s == GM_OK ? "" : err.msg);
        if (s == GM_OK) {
            out = gm_malloc((size_t)(N * V) * sizeof(float));
            memcpy(out, st->logits, (size_t)(N * V) * sizeof(float));
        }
        gm_infer_free(st);
    } else {
        CHECK(0, "decoder: %s", err.msg);
    }
    gm_free(emb), gm_free(soft), gm_free(rows), gm_free(hrows), gm_free(hptr);
    return out;
}

/* The trainer's audio path (gm_batch.audio_*): the fixture's two prompts with their clips, every
 * position after the <end_of_audio> supervised, through gm_trainer_eval: the summed loss equals the
 * one computed from transformers' logits (the encoder, the soft and hard tokens, the decoder as
 * training runs them); then a few steps on that batch lower it. */
static void check_trainer(const gm_model *m, const float *feat, const uint8_t *valid, int64_t n_clips, int64_t frames) {
    size_t n = 0;
    int64_t idd[2];
    int32_t *ids = gm_test_h5_read(REF, "ids", 1, &n, idd, NULL);
    float *ref = read_f("logits", NULL, NULL);
    if (!ids || !ref) return;
    int64_t B = idd[0], T = idd[1], V = m->cfg.vocab_size;
    int32_t *tg = gm_malloc((size_t)(B * T) * sizeof(int32_t));
    double want = 0;
    int64_t n_want = 0;
    for (int64_t b = 0; b < B; b++) {
        bool after = false;
        for (int64_t t = 0; t < T; t++) {
            int64_t i = b * T + t;
            after |= ids[i] == m->cfg.audio.eoa_id;
            tg[i] = after && t + 1 < T ? ids[i + 1] : -1;
            if (tg[i] >= 0) {
                want += gm_test_lse(ref + i * V, V) - ref[i * V + tg[i]];
                n_want++;
            }
        }
    }
    gm_train_opts o = gm_train_opts_default();
    o.batch = B, o.max_length = T, o.lora.rank = 4, o.lora.alpha = 8, o.lr = 1e-2, o.total_steps = 10;
    o.max_audio = n_clips, o.max_audio_frames = frames, o.n_threads = 2;
    gm_train_opts_resolve(&o);
    gm_trainer *tr = NULL;
    gm_error err;
    gm_status st = gm_trainer_new(m, &o, &tr, &err);
    CHECK(st == GM_OK, "trainer with audio: %s", st == GM_OK ? "" : err.msg);
    if (st == GM_OK) {
        gm_batch bt = {.B = B, .T = T, .ids = ids, .targets = tg, .audio_features = feat, .audio_valid = valid,
                       .n_audio = n_clips, .audio_frames = frames};
        double loss = 0;
        int64_t nt = 0;
        st = gm_trainer_eval(tr, &bt, &loss, &nt, &err);
        CHECK(st == GM_OK && nt == n_want, "eval with audio: %s (%lld tokens, %lld expected)", st == GM_OK ? "" : err.msg,
              (long long)nt, (long long)n_want);
        printf("trainer loss with audio %.9g, from transformers' logits %.9g (relative %.3g)\n", loss, want,
               fabs(loss - want) / want);
        CHECK_NEAR(loss, want, TOL_AUDIO_LOSS_REL * want, "the trainer's loss with audio against transformers' logits");
        double first = loss / (double)nt, last = first;
        for (int k = 0; k < 5 && st == GM_OK; k++) {
            gm_step_stats ss;
            st = gm_trainer_step(tr, &bt, 1, &ss, &err);
            last = ss.loss;
        }
        CHECK(st == GM_OK && last < first, "5 steps with audio: loss %.4f -> %.4f (%s)", first, last,
              st == GM_OK ? "" : err.msg);
        /* generation's passes (gm_batch.same_media): the clips are encoded once, the logits the
         * same bits as encoding them again; after a training step they are encoded again */
        {
            int64_t rows[2] = {T - 1, 2 * T - 1}, V2 = 2 * V;
            float *l1 = gm_malloc((size_t)V2 * 4), *l2 = gm_malloc((size_t)V2 * 4), *l3 = gm_malloc((size_t)V2 * 4);
            gm_batch g = bt;
            CHECK_OK(gm_trainer_logits(tr, &g, rows, 2, l1, &err), &err);
            int64_t n0 = gm_trainer_clips_encoded(tr);
            g.same_media = true;
            CHECK_OK(gm_trainer_logits(tr, &g, rows, 2, l2, &err), &err);
            int64_t n1 = gm_trainer_clips_encoded(tr);
            gm_step_stats ss;
            CHECK_OK(gm_trainer_step(tr, &bt, 1, &ss, &err), &err);
            int64_t n2 = gm_trainer_clips_encoded(tr);
            CHECK_OK(gm_trainer_logits(tr, &g, rows, 2, l3, &err), &err);
            CHECK(n1 == n0 && gm_trainer_clips_encoded(tr) == n2 + 2 && memcmp(l1, l2, (size_t)V2 * 4) == 0,
                  "same_media: clips encoded %lld -> %lld (none), logits %s; after a step %lld -> %lld (2)", (long long)n0,
                  (long long)n1, memcmp(l1, l2, (size_t)V2 * 4) == 0 ? "the same" : "differ", (long long)n2,
                  (long long)gm_trainer_clips_encoded(tr));
            gm_free(l1), gm_free(l2), gm_free(l3);
        }
        /* a batch whose clip count disagrees with its audio tokens is refused */
        gm_batch bad = bt;
        bad.n_audio = 1;
        gm_error e2;
        CHECK(gm_trainer_eval(tr, &bad, &loss, &nt, &e2) == GM_ERR_INVALID && gm_test_contains(e2.msg, "376 audio tokens but 1 clips"),
              "clip count checked: %s", e2.msg);
        gm_trainer_free(tr);
    }
    /* a text-only Gemma 3n model refuses audio data by name */
    gm_model *t = NULL;
    gm_model_opts mo = {.load_tokenizer = false};
    if (gm_model_load(gm_test_path("tests/ref/tiny_gemma3n"), &mo, &t, &err) == GM_OK) {
        o.max_length = 100; /* within its 128 positions */
        CHECK(gm_trainer_new(t, &o, &tr, &err) == GM_ERR_INVALID && gm_test_contains(err.msg, "no audio encoder"),
              "audio on tiny_gemma3n: %s", err.msg);
        gm_model_free(t);
    }
    gm_free(tg), gm_free(ids), gm_free(ref);
}

/* LoRA through the audio encoder (tests/ref/make_gemma3n_audio_ref.py, /lora): adapters on the
 * conformer's linears (audio_targets) and on the decoder's attention at PEFT's drawn A and B; the
 * loss of the fixture's two prompts with their clips and all 80 adapter gradients (40 in the
 * encoder) against PEFT's, f32 and float64: the backward through the decoder, the Gemma 3n front
 * (AltUp's stream projections and the per-layer inputs read the soft tokens too), the embedder and
 * every conformer block (clamps, norms, the light convolution, the chunked attention); the same
 * with activation checkpointing in both graphs. */
static void check_lora(const gm_model *m, const float *feat, const uint8_t *valid, int64_t n_clips, int64_t frames,
                       bool checkpointing) {
    size_t n = 0;
    int64_t idd[2];
    int32_t *ids = gm_test_h5_read(REF, "ids", 1, &n, idd, NULL);
    int32_t *lab = gm_test_h5_read(REF, "lora/labels", 1, &n, NULL, NULL);
    if (!ids || !lab) {
        CHECK(0, "the fixture has /lora (rerun make_gemma3n_audio_ref.py)");
        gm_free(ids), gm_free(lab);
        return;
    }
    int64_t B = idd[0], T = idd[1], n_sup = 0;
    int32_t *tg = gm_malloc((size_t)(B * T) * sizeof(int32_t));
    for (int64_t i = 0; i < B * T; i++) {
        int32_t l = i % T + 1 < T ? lab[i + 1] : -100; /* transformers shifts the labels */
        tg[i] = l == -100 ? -1 : l;
        n_sup += tg[i] >= 0;
    }
    gm_train_opts o = gm_train_opts_default();
    o.batch = B, o.max_length = T, o.lora.rank = 4, o.lora.alpha = 8, o.n_threads = 2, o.checkpointing = checkpointing;
    o.max_audio = n_clips, o.max_audio_frames = frames;
    snprintf(o.lora.targets, sizeof o.lora.targets, "q_proj,k_proj,v_proj,o_proj");
    snprintf(o.audio_targets, sizeof o.audio_targets, "ffw_layer_1,ffw_layer_2,q_proj,k_proj,v_proj,post,linear_start,linear_end");
    gm_train_opts_resolve(&o);
    gm_trainer *tr = NULL;
    gm_error err;
    gm_status st = gm_trainer_new(m, &o, &tr, &err);
    CHECK(st == GM_OK, "trainer with audio adapters: %s", st == GM_OK ? "" : err.msg);
    if (st == GM_OK) {
        int np = 0, n_audio = 0, found = 0;
        const gm_train_param *p = gm_trainer_params(tr, &np);
        for (int i = 0; i < np; i++) {
            char ds[256];
            size_t cnt = 0;
            snprintf(ds, sizeof ds, "lora/weights/%s", p[i].name);
            float *w = gm_test_h5_read(REF, ds, 0, &cnt, NULL, NULL);
            CHECK(w && cnt == (size_t)p[i].n, "%s: %zu values in the fixture, %lld trained", ds, cnt, (long long)p[i].n);
            if (w && cnt == (size_t)p[i].n) memcpy(p[i].p, w, cnt * sizeof(float)), found++;
            n_audio += strstr(p[i].name, ".audio_tower.") != NULL;
            gm_free(w);
        }
        CHECK(np == 80 && n_audio == 40 && found == np, "%d trained tensors (80), %d in the audio encoder (40), %d in the fixture",
              np, n_audio, found);
        gm_trainer_zero_grad(tr);
        gm_batch bt = {.B = B, .T = T, .ids = ids, .targets = tg, .audio_features = feat, .audio_valid = valid,
                       .n_audio = n_clips, .audio_frames = frames};
        double loss_sum = 0;
        st = gm_trainer_forward_backward(tr, &bt, (float)(1.0 / (double)n_sup), &loss_sum, &err);
        CHECK(st == GM_OK, "forward / backward with audio adapters: %s", st == GM_OK ? "" : err.msg);
        float *lw = read_f("lora/loss", NULL, NULL);
        double got = loss_sum / (double)n_sup, want = lw ? lw[0] : NAN;
        CHECK_NEAR(got, want, TOL_AUDIO_LOSS_REL * want, "the loss with audio adapters against PEFT's");
        const char *groups[2] = {"lora/grads", "lora/grads64"};
        for (int gi = 0; gi < 2; gi++) {
            double worst = 0, worst_audio = 0;
            const char *wname = "";
            int cmp = 0;
            for (int i = 0; i < np; i++) {
                char ds[256];
                size_t cnt = 0;
                snprintf(ds, sizeof ds, "%s/%s", groups[gi], p[i].name);
                int64_t dims[2];
                int nd = 0;
                double *want64 = NULL;
                float *want32 = NULL;
                if (gi == 1) want64 = gm_test_h5_read(REF, ds, 2, &cnt, dims, &nd);
                else want32 = gm_test_h5_read(REF, ds, 0, &cnt, dims, &nd);
                if ((!want32 && !want64) || cnt != (size_t)p[i].n) {
                    CHECK(0, "%s: missing or %zu values (%lld)", ds, cnt, (long long)p[i].n);
                    gm_free(want32), gm_free(want64);
                    continue;
                }
                double mx = 1e-30, e = 0;
                for (size_t j = 0; j < cnt; j++) {
                    double w = want64 ? want64[j] : want32[j], dj = fabs((double)p[i].d[j] - w);
                    mx = fmax(mx, fabs(w));
                    e = isfinite(dj) ? fmax(e, dj) : INFINITY; /* a NaN on either side fails */
                }
                double rel = e / mx;
                if (rel > worst) worst = rel, wname = p[i].name;
                if (strstr(p[i].name, ".audio_tower.") && rel > worst_audio) worst_audio = rel;
                cmp++;
                gm_free(want32), gm_free(want64);
            }
            CHECK(cmp == np && worst <= TOL_AUDIO_GRAD_REL, "%s%s: %d of %d compared, worst relative error %.3g at %s",
                  groups[gi], checkpointing ? " (checkpointing)" : "", cmp, np, worst, wname);
            printf("audio LoRA%s vs PEFT %s: loss %.9g (%.9g), worst rel. grad error %.2e (encoder's %.2e)\n",
                   checkpointing ? " (checkpointing)" : "", gi ? "float64" : "f32", got, want, worst, worst_audio);
        }
        gm_free(lw);
        gm_trainer_free(tr);
    }
    gm_free(tg), gm_free(ids), gm_free(lab);
}

/* Generation with a clip (gm_generate_media, what `generate --audio` runs): the fixture's first
 * prompt, its clip's soft tokens and its hard tokens placed, greedy: the state's logits at the last
 * prompt position equal transformers' there, and the first new token is their argmax. */
static void check_generate(const gm_model *m, const gm_mm_hard *hard, const gm_audio_encoder *e, const int32_t *ids,
                           int64_t T, const float *ref) {
    int64_t C = m->cfg.hidden_size, V = m->cfg.vocab_size, S = e->d.soft_tokens;
    float *soft = gm_malloc((size_t)(S * C) * sizeof(float));
    int64_t *rows = gm_malloc((size_t)S * sizeof(int64_t)), n = 0;
    gm_backend_download(e->be, soft, e->soft, (size_t)(S * C) * sizeof(float)); /* clip 0's */
    for (int64_t t = 0; t < T; t++)
        if (ids[t] == m->cfg.audio.audio_token_id && n < S) rows[n++] = t;
    gm_infer *st = NULL;
    gm_error err;
    gm_infer_opts io = {.batch = 1, .max_tokens = T, .ctx = T + 4, .n_threads = 2};
    if (gm_infer_new(m, &io, &st, &err) != GM_OK) {
        CHECK(0, "decoder: %s", err.msg);
    } else {
        gm_prompt_media pm = {soft, rows, n, -1, hard};
        gm_sample_opts so = {.max_new_tokens = 1};
        int32_t out[1];
        int64_t n_out = 0;
        gm_status s = gm_generate_media(st, ids, T, &pm, &so, NULL, NULL, out, &n_out, NULL, &err);
        CHECK(s == GM_OK && n_out == 1, "generate with a clip: %s", s == GM_OK ? "" : err.msg);
        int64_t best = 0;
        for (int64_t v = 1; v < V; v++) best = ref[(T - 1) * V + v] > ref[(T - 1) * V + best] ? v : best;
        if (s == GM_OK) {
            CHECK(out[0] == best, "first new token %d, transformers' argmax %lld", out[0], (long long)best);
            printf("generate with a clip: last prompt position's logits max |diff| %.3g\n",
                   gm_check_close("generate: logits at the last prompt position", st->logits, ref + (T - 1) * V, (size_t)V,
                                  TOL_TINY_LOGITS_ABS, 0.0));
        }
        gm_infer_free(st);
    }
    gm_free(soft), gm_free(rows);
}

int main(void) {
    snprintf(REF, sizeof REF, "%s", gm_test_path("tests/ref/tiny_gemma3n_audio_ref.h5"));
    gm_error err;
    gm_model *m = NULL;
    gm_model_opts mo = {.load_tokenizer = false};
    gm_status st = gm_model_load(gm_test_path("tests/ref/tiny_gemma3n_audio"), &mo, &m, &err);
    CHECK(st == GM_OK, "load tiny_gemma3n_audio: %s", err.msg);
    if (st != GM_OK) return gm_test_finish();
    CHECK(m->cfg.audio.hidden_size == 32 && m->cfg.audio.n_layers == 2 && m->cfg.audio.chunk == 6 &&
              m->cfg.audio.context_left == 7 && m->cfg.audio.context_right == 2 && m->cfg.audio.soft_tokens == 188 &&
              m->cfg.audio.audio_token_id == 471 && m->cfg.audio.clip == 4.0f,
          "audio_config read: width %lld, %lld blocks, chunk %lld, context %lld/%lld, %lld soft tokens, id %d",
          (long long)m->cfg.audio.hidden_size, (long long)m->cfg.audio.n_layers, (long long)m->cfg.audio.chunk,
          (long long)m->cfg.audio.context_left, (long long)m->cfg.audio.context_right,
          (long long)m->cfg.audio.soft_tokens, m->cfg.audio.audio_token_id);

    gm_mm_hard hard;
    st = gm_mm_hard_load(m, &hard, &err);
    CHECK(st == GM_OK && hard.n == 2, "hard-token tables: %s", st == GM_OK ? "" : err.msg);
    int64_t fd[4];
    int fnd = 0;
    size_t n = 0;
    float *feat = read_f("features", fd, &fnd);
    uint8_t *valid = gm_test_h5_read(REF, "features_mask", 1, &n, NULL, NULL);
    int32_t *valid_i = (int32_t *)valid; /* gm_test_h5_read gives ints as int32 */
    int64_t B = fd[0], T = fd[1], M = fd[2];
    uint8_t *v8 = gm_malloc((size_t)(B * T));
    for (int64_t i = 0; i < B * T; i++) v8[i] = valid_i[i] ? 1 : 0;
    int64_t T2, T3;
    gm_audio_encoder_frames(&m->cfg.audio, T, &T2, &T3);
    CHECK(T2 == 35 && T3 == 9, "138 frames -> %lld sub-sampled, %lld soft tokens (35, 9)", (long long)T2, (long long)T3);

    /* the batch of the two clips */
    gm_audio_encoder *e = NULL;
    st = gm_audio_encoder_new(m, &hard, 2, T, 2, NULL, &e, &err);
    CHECK(st == GM_OK, "encoder: %s", err.msg);
    if (st == GM_OK) {
        stage_cmp sc = {0, 2, 0, T};
        st = gm_audio_encoder_run(e, feat, v8, B, T, on_stage, &sc, &err);
        CHECK(st == GM_OK, "run: %s", err.msg);
        CHECK(sc.n_seen == 4, "stages compared: %d (sscp, 2 blocks, encoder)", sc.n_seen);
        int64_t md[2];
        int32_t *mask = gm_test_h5_read(REF, "encoder_mask", 1, &n, md, NULL);
        int bad = 0;
        for (int64_t i = 0; i < B * T3; i++) bad += (mask[i] != 0) != (e->h_valid3[i] == 0);
        CHECK(bad == 0, "encoder mask: %d of %lld frames differ", bad, (long long)(B * T3));
        gm_free(mask);
        int64_t sd[3];
        int snd = 0;
        float *soft = read_f("soft", sd, &snd);
        int64_t ns = B * e->d.soft_tokens * e->d.C_text;
        float *got = gm_malloc((size_t)ns * sizeof(float));
        gm_backend_download(e->be, got, e->soft, (size_t)ns * sizeof(float));
        CHECK(snd == 3 && sd[1] == e->d.soft_tokens && sd[2] == e->d.C_text, "soft tokens' shape");
        printf("soft tokens: max |diff| %.3g\n",
               gm_check_close("soft tokens (batch of 2, 188 positions per clip)", got, soft, (size_t)ns, TOL_AUDIO_ENCODER_ABS, 0.0));
        gm_free(soft), gm_free(got);

        /* the whole model: two prompts with a clip each (and hard multimodal ids among the text)
         * against Gemma3nForConditionalGeneration's logits */
        int64_t idd[2];
        int32_t *ids = gm_test_h5_read(REF, "ids", 1, &n, idd, NULL);
        float *ref = read_f("logits", NULL, NULL);
        float *lg = ids ? audio_logits(m, &hard, e, ids, idd[0], idd[1]) : NULL;
        if (lg && ref) {
            printf("logits with audio: max |diff| %.3g\n",
                   gm_check_close("logits with audio (2 prompts)", lg, ref, (size_t)(idd[0] * idd[1] * m->cfg.vocab_size),
                                  TOL_TINY_LOGITS_ABS, 0.0));
            check_generate(m, &hard, e, ids, idd[1], ref);
        }
        gm_free(lg), gm_free(ref), gm_free(ids);

        /* a batch larger than planned, and more frames than the clip's positions allow */
        gm_error e2;
        CHECK(gm_audio_encoder_run(e, feat, v8, 3, T, NULL, NULL, &e2) == GM_ERR_INVALID &&
                  gm_test_contains(e2.msg, "planned for up to 2 clips"),
              "3 clips refused: %s", e2.msg);
        gm_audio_encoder_free(e);
    }

    check_trainer(m, feat, v8, B, T);
    check_lora(m, feat, v8, B, T, false);
    check_lora(m, feat, v8, B, T, true);

    /* each clip alone, at the batch's length (its padding frames as in the batch: the sub-sampling
     * convolutions look 2 frames ahead, so a clip's last frames depend on what pads it), gives its
     * rows of the batch: nothing of one clip reaches the other */
    for (int c = 0; c < 2; c++) {
        st = gm_audio_encoder_new(m, &hard, 1, T, 2, NULL, &e, &err);
        CHECK(st == GM_OK, "encoder: %s", err.msg);
        if (st != GM_OK) break;
        stage_cmp sc = {0, 1, c, T};
        /* alone at the batch's length (padded as in the batch): every stage equals its rows */
        st = gm_audio_encoder_run(e, feat + c * T * M, v8 + c * T, 1, T, on_stage, &sc, &err);
        CHECK(st == GM_OK && sc.n_seen == 4, "clip %d alone: %s", c, st == GM_OK ? "" : err.msg);
        gm_audio_encoder_free(e);
    }

    /* too many frames for the 188 positions (the extractor's 30 s never are: 2997 frames, 188 soft
     * tokens): 3024 frames -> 1512 -> 756 sub-sampled -> 189 soft tokens */
    {
        int64_t Tlong = 3024;
        float *f = gm_calloc((size_t)(Tlong * M), sizeof(float));
        uint8_t *vl = gm_malloc((size_t)Tlong);
        memset(vl, 1, (size_t)Tlong);
        st = gm_audio_encoder_new(m, &hard, 1, Tlong, 2, NULL, &e, &err);
        CHECK(st == GM_OK, "encoder for %lld frames: %s", (long long)Tlong, err.msg);
        if (st == GM_OK) {
            gm_error e2;
            CHECK(gm_audio_encoder_run(e, f, vl, 1, Tlong, NULL, NULL, &e2) == GM_ERR_INVALID &&
                      gm_test_contains(e2.msg, "189 soft tokens") && gm_test_contains(e2.msg, "audio_soft_tokens_per_image"),
                  "a clip of 189 tokens for 188 positions refused: %s", e2.msg);
            gm_audio_encoder_free(e);
        }
        gm_free(f), gm_free(vl);
    }
    gm_mm_hard_free(&hard);
    gm_model_free(m);

    /* a model without an audio tower */
    st = gm_model_load(gm_test_path("tests/ref/tiny_gemma3n"), &mo, &m, &err);
    CHECK(st == GM_OK, "load tiny_gemma3n: %s", err.msg);
    if (st == GM_OK) {
        CHECK(gm_audio_encoder_new(m, &hard, 1, 100, 2, NULL, &e, &err) == GM_ERR_UNSUPPORTED &&
                  gm_test_contains(err.msg, "no audio encoder") && gm_test_contains(err.msg, "hint:"),
              "text-only Gemma 3n: %s", err.msg);
        gm_model_free(m);
    }
    gm_free(feat), gm_free(valid), gm_free(v8);
    return gm_test_finish();
}

/*
 * test_quant_model.c - gm_weights_layout on the real Gemma 3 270M (GGUF Q4_K_M): every linear of
 * all 18 layers re-encoded to NF4, bf16 and int8 on 2 threads, timed (printed, not asserted),
 * checked:
 *   - arena bytes == the plan from the config alone, every view has the right type and shape;
 *   - NF4 of a multi-panel matrix == gm_nf4_quantize of the whole flattened matrix (the path that
 *     is bit-exact with bitsandbytes, test_quant.c), i.e. streaming by panels changes nothing;
 *   - bf16 == round-to-nearest-even of the dequantized GGUF weight, exactly;
 *   - per-element error bounds (test_util.h) on sampled matrices, and a matmul through the NF4 view.
 */
#include "test_util.h"

#include "gm_alloc.h"
#include "gm_model.h"
#include "gm_quant.h"
#include "gm_weights.h"
#include "kernels.h"

#include <omp.h>
#include <string.h>

#define THREADS 2

static bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* Dequantizes a whole view (N, K) into a gm_malloc'd buffer. */
static float *rows_of(const gm_wview *v) {
    float *w = gm_malloc((size_t)(v->rows * v->cols) * 4);
#pragma omp parallel for num_threads(THREADS)
    for (int64_t r = 0; r < v->rows; r++) gm_dequant_wrow(v, r, w + r * v->cols);
    return w;
}

/* Worst |w - w'| / bound over a matrix, for the format of `enc`. absmax: first-level absmax of the
 * original (NF4 only). */
static double worst_ratio(gm_quant q, const float *w, const float *wq, const gm_wview *enc, const float *absmax) {
    int64_t N = enc->rows, K = enc->cols;
    double worst = 0;
    for (int64_t e = 0; e < N * K; e++) {
        double b = q == GM_QUANT_BF16   ? TOL_QUANT_BF16_REL * fabs(w[e])
                   : q == GM_QUANT_INT8 ? TOL_QUANT_INT8_STEPS * enc->row_scale[e / K]
                                        : TOL_QUANT_NF4_CODE * absmax[e / 64] + TOL_QUANT_NF4_ABSMAX2 * enc->absmax2[e / 16384];
        double d = fabs((double)w[e] - wq[e]);
        double r = b > 0 ? d / b : (d == 0 ? 0 : 1e9);
        if (r > worst) worst = r;
    }
    return worst;
}

int main(void) {
    const char *path = gm_test_real_model();
    CHECK(path != NULL, "the real model is required for this test");
    if (!path) return gm_test_finish();
    gm_error err = {0};
    gm_model *m = NULL;
    gm_model_opts mo = {.load_tokenizer = false};
    CHECK_OK(gm_model_load(path, &mo, &m, &err), &err);
    if (!m) return gm_test_finish();
    const gm_config *cfg = &m->cfg;
    CHECK(cfg->n_layers == 18, "Gemma 3 270M has 18 layers (got %lld)", (long long)cfg->n_layers);

    /* what the file stores */
    const gm_arch_def *ar = m->arch;
    int count[GM_DTYPE_COUNT] = {0};
    int64_t n_elems = 0;
    for (int64_t l = 0; l < cfg->n_layers; l++)
        for (int w = 0; w < ar->n_layer; w++) {
            if (ar->layer[w].kind != GM_W_LINEAR) continue;
            const gm_tensor *t = gm_model_weight(m, l, w);
            count[t->dtype]++;
            n_elems += t->shape[0] * t->shape[1];
        }
    printf("linears: %lld x 7, %.1f M weights, stored as", (long long)cfg->n_layers, (double)n_elems / 1e6);
    gm_dtype dominant = GM_F32;
    for (int t = 0; t < GM_DTYPE_COUNT; t++)
        if (count[t]) {
            printf(" %s x%d", gm_dtype_name((gm_dtype)t), count[t]);
            if (count[t] > count[dominant]) dominant = (gm_dtype)t;
        }
    printf("\n");

    /* sampled matrices (layer, linear), every stored type; layer 0 gate is 82 NF4 panels of 25 rows */
    const struct { int layer; const char *name; } samples[] = {
        {0, "mlp.gate_proj.weight"}, {0, "self_attn.q_proj.weight"}, {5, "self_attn.v_proj.weight"},
        {17, "mlp.down_proj.weight"}, {11, "self_attn.o_proj.weight"}};
    const gm_quant formats[] = {GM_QUANT_NF4, GM_QUANT_BF16, GM_QUANT_INT8};
    for (size_t fi = 0; fi < sizeof formats / sizeof formats[0]; fi++) {
        gm_quant q = formats[fi];
        gm_arena a, pa;
        gm_weights v, plan;
        CHECK_OK(gm_weights_init(&v, cfg, q, &err), &err);
        gm_arena_init(&a, "base-weights", GM_DEVICE_CPU);
        CHECK_OK(gm_weights_layout(&v, m, dominant, GM_Q8_0, NULL, &a, THREADS, &err), &err);
        CHECK_OK(gm_weights_init(&plan, cfg, q, &err), &err);
        gm_arena_init(&pa, "plan", GM_DEVICE_CPU);
        CHECK_OK(gm_weights_layout(&plan, NULL, dominant, GM_Q8_0, NULL, &pa, THREADS, &err), &err);
        CHECK(a.by_kind[GM_MEM_WEIGHTS] == pa.used, "%s: measured %zu bytes, planned from the config %zu", gm_quant_name(q),
              a.by_kind[GM_MEM_WEIGHTS], pa.used);
        gm_weights_free(&plan);
        CHECK_OK(gm_arena_commit(&a, &err), &err);
        if (!a.committed) continue;
        double t0 = omp_get_wtime();
        CHECK_OK(gm_weights_layout(&v, m, dominant, GM_Q8_0, NULL, &a, THREADS, &err), &err);
        double dt = omp_get_wtime() - t0;
        printf("%-5s: all %lld layers re-encoded in %.2f s on %d threads (%.1f MiB, %.0f M weights/s)\n",
               gm_quant_name(q), (long long)cfg->n_layers, dt, THREADS, (double)a.used / 1048576.0,
               (double)n_elems / 1e6 / dt);

        bool shapes = true;
        gm_dtype want_t = q == GM_QUANT_NF4 ? GM_NF4 : q == GM_QUANT_BF16 ? GM_BF16 : GM_I8;
        for (int64_t l = 0; l < cfg->n_layers; l++)
            for (int w = 0; w < ar->n_layer; w++) {
                if (ar->layer[w].kind != GM_W_LINEAR) continue;
                const gm_tensor *s = gm_model_weight(m, l, w);
                const gm_wview *d = gm_weights_at(&v, l, w);
                shapes = shapes && d->type == want_t && d->rows == s->shape[0] && d->cols == s->shape[1] && d->data;
            }
        CHECK(shapes, "%s: every linear view has the format and the source's shape", gm_quant_name(q));
        gm_wview emb = gm_wview_of(&m->global[GM_GLOBAL_EMBED]);
        CHECK(memcmp(&v.global[GM_GLOBAL_EMBED], &emb, sizeof emb) == 0, "%s: embedding left as stored", gm_quant_name(q));

        for (size_t si = 0; si < sizeof samples / sizeof samples[0]; si++) {
            int l = samples[si].layer, wi = gm_arch_slot(ar, samples[si].name);
            const gm_wview srcv = gm_wview_of(gm_model_weight(m, l, wi)), *src = &srcv, *enc = gm_weights_at(&v, l, wi);
            const char *lname = samples[si].name;
            int64_t N = src->rows, K = src->cols, n = N * K;
            float *w = rows_of(src), *wq = rows_of(enc);
            float *absmax = NULL;
            if (q == GM_QUANT_NF4) {
                gm_nf4_sizes sz = gm_nf4_sizes_of(n);
                uint8_t *pk = gm_malloc(sz.packed_bytes), *cd = gm_malloc((size_t)sz.n_blocks);
                float *a2 = gm_malloc((size_t)sz.n_groups * 4), off = 0;
                absmax = gm_malloc((size_t)sz.n_blocks * 4);
                gm_nf4_quantize(w, n, pk, cd, a2, &off, absmax, THREADS);
                CHECK(memcmp(pk, enc->data, sz.packed_bytes) == 0 && memcmp(cd, enc->absmax_code, (size_t)sz.n_blocks) == 0 &&
                          memcmp(a2, enc->absmax2, (size_t)sz.n_groups * 4) == 0 && same_bits(off, enc->absmax_offset),
                      "nf4 layer %d %s: panel-streamed layout differs from whole-matrix gm_nf4_quantize", l,
                      lname);
                gm_free(pk), gm_free(cd), gm_free(a2);
            }
            if (q == GM_QUANT_BF16) {
                int64_t bad = -1;
                for (int64_t e = 0; e < n && bad < 0; e++)
                    if (!same_bits(wq[e], gm_round_bf16(w[e]))) bad = e;
                CHECK(bad < 0, "bf16 layer %d %s: element %lld %.9g is not bf16(%.9g)", l, lname,
                      (long long)bad, bad < 0 ? 0.0 : (double)wq[bad], bad < 0 ? 0.0 : (double)w[bad]);
            }
            double worst = worst_ratio(q, w, wq, enc, absmax);
            CHECK(worst <= 1.0, "%s layer %d %s: error reaches %.3f of its bound", gm_quant_name(q), l,
                  lname, worst);
            /* relative RMS error, for information */
            double se = 0, sw = 0;
            for (int64_t e = 0; e < n; e++) {
                double d = (double)w[e] - wq[e];
                se += d * d, sw += (double)w[e] * w[e];
            }
            printf("  %-5s layer %2d %-9s (%5lld x %5lld, stored %-4s): relative RMS error %.4f, worst %.3f of bound\n",
                   gm_quant_name(q), l, lname, (long long)N, (long long)K,
                   gm_dtype_name(src->type), sqrt(se / sw), worst);

            /* a matmul through the encoded view, M = 4 (row-by-row path) */
            if (si == 0) {
                const int64_t M = 4;
                uint64_t st = 7;
                float *x = gm_malloc((size_t)(M * K) * 4), *y = gm_malloc((size_t)(M * N) * 4);
                for (int64_t i = 0; i < M * K; i++) x[i] = gm_test_rand(&st);
                size_t sf = gm_k_matmul_scratch_floats(enc->type, N, K, THREADS);
                float *scratch = gm_malloc(sf * 4);
                gm_kctx ctx = {.n_threads = THREADS, .scratch = scratch, .scratch_floats = sf};
                gm_k_matmul_fwd_cpu(&ctx, y, x, enc, M, 0.0f);
                double worst_mm = 0;
                for (int64_t mi = 0; mi < M; mi++)
                    for (int64_t r = 0; r < N; r++) {
                        double ref = 0, bound = 0, mag = 0;
                        for (int64_t k = 0; k < K; k++) {
                            int64_t e = r * K + k;
                            double xv = x[mi * K + k];
                            double b = q == GM_QUANT_BF16   ? TOL_QUANT_BF16_REL * fabs(w[e])
                                       : q == GM_QUANT_INT8 ? TOL_QUANT_INT8_STEPS * enc->row_scale[r]
                                                            : TOL_QUANT_NF4_CODE * absmax[e / 64] +
                                                                  TOL_QUANT_NF4_ABSMAX2 * enc->absmax2[e / 16384];
                            ref += xv * w[e];
                            bound += fabs(xv) * b;
                            mag += fabs(xv) * (fabs(w[e]) + b);
                        }
                        bound += TOL_KERNEL_F32_REL * mag + 1e-7;
                        double rr = fabs(y[mi * N + r] - ref) / bound;
                        if (rr > worst_mm) worst_mm = rr;
                    }
                CHECK(worst_mm <= 1.0, "%s: matmul through the view reaches %.3f of its bound", gm_quant_name(q), worst_mm);
                printf("  %-5s matmul (4 x %lld) . (%lld x %lld)^T: worst %.3f of bound\n", gm_quant_name(q), (long long)K,
                       (long long)N, (long long)K, worst_mm);
                gm_free(x), gm_free(y), gm_free(scratch);
            }
            gm_free(w), gm_free(wq), gm_free(absmax);
        }
        gm_arena_free(&a);
        gm_arena_free(&pa);
        gm_weights_free(&v);
    }
    gm_model_free(m);
    return gm_test_finish();
}

/*
 * test_gguf_model.c - the GGUF reader on the real Gemma 3 270M Q4_K_M file: header, gemma3
 * hyper-parameters, tokenizer arrays, tensor types and shapes (formats.md §1.8-1.9), and
 * dequantized rows compared with gguf-py's output stored in tests/ref/real_dequant_rows.h5
 * (written by tests/ref/make_dequant_ref.py).
 *
 * The model must be in the cache: a missing model is a failure, not a skip (label "model").
 */
#include "test_util.h"

#include "gm_alloc.h"
#include "gm_gguf.h"
#include "kernels.h"

#include <hdf5.h>
#include <stdlib.h>
#include <string.h>

static bool str_is(gm_strref s, const char *want) {
    return s.len == strlen(want) && memcmp(s.p, want, s.len) == 0;
}

static void check_int(const gm_gguf *g, const char *key, int64_t want) {
    int64_t v = -1;
    CHECK(gm_gguf_get_int(g, key, &v) && v == want, "%s = %lld, want %lld", key, (long long)v,
          (long long)want);
}

static void check_float(const gm_gguf *g, const char *key, double want, double rel) {
    double v = -1;
    CHECK(gm_gguf_get_float(g, key, &v) && fabs(v - want) <= rel * fabs(want),
          "%s = %.9g, want %.9g", key, v, want);
}

static void check_tensor(const gm_gguf *g, const char *name, gm_dtype dt, int64_t d0, int64_t d1) {
    const gm_gguf_tensor *t = gm_gguf_find_tensor(g, name);
    CHECK(t != NULL, "tensor %s present", name);
    if (!t) return;
    CHECK(t->dtype == dt, "%s is %s, want %s", name, gm_dtype_name(t->dtype), gm_dtype_name(dt));
    CHECK(t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1,
          "%s shape {%lld, %lld}, want {%lld, %lld}", name, (long long)t->shape[0],
          (long long)t->shape[1], (long long)d0, (long long)d1);
    CHECK(t->nbytes == gm_dtype_row_bytes(dt, d1) * (size_t)d0, "%s nbytes %zu", name, t->nbytes);
}

static void test_metadata(const gm_gguf *g) {
    CHECK(gm_gguf_version(g) == 3, "version %u", gm_gguf_version(g));
    CHECK(gm_gguf_n_tensors(g) == 236, "%lld tensors", (long long)gm_gguf_n_tensors(g));
    CHECK(gm_gguf_alignment(g) == 32, "alignment %u", gm_gguf_alignment(g));
    CHECK(gm_gguf_data_offset(g) % 32 == 0, "data offset aligned");
    gm_strref arch = {0};
    CHECK(gm_gguf_get_str(g, "general.architecture", &arch) && str_is(arch, "gemma3"), "gemma3");
    check_int(g, "gemma3.embedding_length", 640);
    check_int(g, "gemma3.block_count", 18);
    check_int(g, "gemma3.attention.head_count", 4);
    check_int(g, "gemma3.attention.head_count_kv", 1);
    check_int(g, "gemma3.attention.key_length", 256);
    check_int(g, "gemma3.attention.value_length", 256);
    check_int(g, "gemma3.feed_forward_length", 2048);
    check_int(g, "gemma3.attention.sliding_window", 512);
    check_int(g, "gemma3.context_length", 32768);
    check_int(g, "general.file_type", 15); // MOSTLY_Q4_K_M
    check_int(g, "general.quantization_version", 2);
    check_int(g, "tokenizer.ggml.bos_token_id", 2);
    check_int(g, "tokenizer.ggml.eos_token_id", 1);
    /* stored as f32: compare at f32 precision */
    check_float(g, "gemma3.rope.freq_base", 1e6, 1e-7);
    check_float(g, "gemma3.attention.layer_norm_rms_epsilon", 1e-6, 1e-7);
    bool add_bos = false;
    CHECK(gm_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos) && add_bos,
          "add_bos_token");

    const gm_strref *tok = NULL;
    uint64_t n = 0;
    CHECK(gm_gguf_get_str_array(g, "tokenizer.ggml.tokens", &tok, &n) && n == 262144,
          "262144 tokens (got %llu)", (unsigned long long)n);
    if (tok && n == 262144) {
        CHECK(str_is(tok[0], "<pad>"), "tokens[0]");
        CHECK(str_is(tok[105], "<start_of_turn>"), "tokens[105] = '%.*s'", (int)tok[105].len,
              tok[105].p);
        CHECK(str_is(tok[238], "<0x00>"), "tokens[238] = '%.*s'", (int)tok[238].len, tok[238].p);
        CHECK(str_is(tok[262143], "<unused6241>"), "last token");
    }
    gm_gguf_vtype et;
    const void *data;
    CHECK(gm_gguf_get_array(g, "tokenizer.ggml.scores", &et, &data, &n) && et == GM_GGUF_FLOAT32 &&
              n == 262144,
          "scores");
    CHECK(gm_gguf_get_array(g, "tokenizer.ggml.token_type", &et, &data, &n) &&
              et == GM_GGUF_INT32 && n == 262144,
          "token types");
}

static void test_tensors(const gm_gguf *g) {
    check_tensor(g, "token_embd.weight", GM_Q8_0, 262144, 640);
    check_tensor(g, "blk.0.ffn_down.weight", GM_Q6_K, 640, 2048);
    check_tensor(g, "blk.0.attn_q.weight", GM_Q5_0, 1024, 640);
    check_tensor(g, "blk.0.attn_output.weight", GM_Q4_K, 640, 1024);
    check_tensor(g, "blk.0.attn_k.weight", GM_Q5_0, 256, 640);
    const gm_gguf_tensor *norm = gm_gguf_find_tensor(g, "output_norm.weight");
    CHECK(norm && norm->dtype == GM_F32 && norm->ndim == 1 && norm->shape[0] == 640, "output_norm");
    CHECK(gm_gguf_find_tensor(g, "output.weight") == NULL, "tied embeddings: no output.weight");

    /* formats.md §1.8: Q6_K ffn_down / Q8_0 attn_v on use_more_bits layers, else Q4_K / Q5_0. */
    const int more_bits[18] = {1, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 1, 1, 1};
    int wrong = 0;
    for (int l = 0; l < 18; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_down.weight", l);
        const gm_gguf_tensor *t = gm_gguf_find_tensor(g, name);
        if (!t || t->dtype != (more_bits[l] ? GM_Q6_K : GM_Q4_K)) wrong++;
        snprintf(name, sizeof name, "blk.%d.attn_v.weight", l);
        t = gm_gguf_find_tensor(g, name);
        if (!t || t->dtype != (more_bits[l] ? GM_Q8_0 : GM_Q5_0)) wrong++;
    }
    CHECK(wrong == 0, "%d layer tensors differ from the Q4_K_M type rules", wrong);

    /* Tensors lie in the file, in order, without overlaps. */
    const uint8_t *base = gm_gguf_tensor_at(g, 0)->data;
    size_t end = 0;
    int bad = 0;
    for (int64_t i = 0; i < gm_gguf_n_tensors(g); i++) {
        const gm_gguf_tensor *t = gm_gguf_tensor_at(g, i);
        if ((const uint8_t *)t->data - base != (ptrdiff_t)t->offset || t->offset < end) bad++;
        end = t->offset + t->nbytes;
    }
    CHECK(bad == 0, "%d tensors out of order or overlapping", bad);
    CHECK(gm_gguf_data_offset(g) + end <= gm_gguf_file_size(g), "data ends inside the file");
}

/* Row values from the HDF5 reference for one group; returns false on any HDF5 failure. */
static bool read_group(hid_t f, const char *name, int64_t **rows, int64_t *n_rows, float **vals,
                       int64_t *cols, int *ggml_type) {
    bool ok = false;
    hid_t g = H5Gopen2(f, name, H5P_DEFAULT), dr = -1, dv = -1, sr = -1, sv = -1, at = -1;
    if (g < 0) goto out;
    dr = H5Dopen2(g, "rows", H5P_DEFAULT);
    dv = H5Dopen2(g, "values", H5P_DEFAULT);
    at = H5Aopen(g, "ggml_type", H5P_DEFAULT);
    if (dr < 0 || dv < 0 || at < 0) goto out;
    sr = H5Dget_space(dr);
    sv = H5Dget_space(dv);
    hsize_t dims_r[1], dims_v[2];
    if (H5Sget_simple_extent_ndims(sr) != 1 || H5Sget_simple_extent_ndims(sv) != 2) goto out;
    H5Sget_simple_extent_dims(sr, dims_r, NULL);
    H5Sget_simple_extent_dims(sv, dims_v, NULL);
    if (dims_v[0] != dims_r[0]) goto out;
    *n_rows = (int64_t)dims_r[0];
    *cols = (int64_t)dims_v[1];
    *rows = malloc(dims_r[0] * sizeof(int64_t));
    *vals = malloc(dims_v[0] * dims_v[1] * sizeof(float));
    if (H5Dread(dr, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, *rows) < 0) goto out;
    if (H5Dread(dv, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, *vals) < 0) goto out;
    if (H5Aread(at, H5T_NATIVE_INT, ggml_type) < 0) goto out;
    ok = true;
out:
    if (at >= 0) H5Aclose(at);
    if (sr >= 0) H5Sclose(sr);
    if (sv >= 0) H5Sclose(sv);
    if (dr >= 0) H5Dclose(dr);
    if (dv >= 0) H5Dclose(dv);
    if (g >= 0) H5Gclose(g);
    return ok;
}

static void test_dequant_rows(const gm_gguf *g) {
    const char *ref = gm_test_path("tests/ref/real_dequant_rows.h5");
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(ref, H5F_ACC_RDONLY, H5P_DEFAULT);
    CHECK(f >= 0, "open %s (regenerate with tests/ref/make_dequant_ref.py)", ref);
    if (f < 0) return;
    H5G_info_t info;
    H5Gget_info(f, &info);
    CHECK(info.nlinks >= 8, "reference has %llu tensors", (unsigned long long)info.nlinks);
    int n_rows_total = 0, exact = 0;
    for (hsize_t i = 0; i < info.nlinks; i++) {
        char name[128];
        H5Lget_name_by_idx(f, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT);
        int64_t *rows = NULL, n_rows = 0, cols = 0;
        float *vals = NULL;
        int gtype = -1;
        bool ok = read_group(f, name, &rows, &n_rows, &vals, &cols, &gtype);
        CHECK(ok, "read reference group %s", name);
        const gm_gguf_tensor *t = gm_gguf_find_tensor(g, name);
        CHECK(t != NULL, "tensor %s in the model", name);
        if (ok && t) {
            CHECK((int)t->ggml_type == gtype, "%s: ggml type %u, reference %d", name, t->ggml_type,
                  gtype);
            int64_t tcols = t->shape[t->ndim - 1];
            CHECK(tcols == cols, "%s: %lld columns, reference %lld", name, (long long)tcols,
                  (long long)cols);
            size_t row_bytes = gm_dtype_row_bytes(t->dtype, tcols);
            float *y = malloc((size_t)cols * sizeof(float));
            for (int64_t r = 0; r < n_rows && tcols == cols; r++) {
                gm_dequant_row(t->dtype, (const uint8_t *)t->data + (size_t)rows[r] * row_bytes, y,
                               cols);
                char what[192];
                snprintf(what, sizeof what, "%s row %lld (%s)", name, (long long)rows[r],
                         gm_dtype_name(t->dtype));
                gm_check_close(what, y, vals + r * cols, (size_t)cols, TOL_DEQUANT_ABS, 0.0);
                if (memcmp(y, vals + r * cols, (size_t)cols * sizeof(float)) == 0) exact++;
                n_rows_total++;
            }
            free(y);
        }
        free(rows);
        free(vals);
    }
    H5Fclose(f);
    printf("dequantized %d reference rows, %d bit-exact\n", n_rows_total, exact);
    CHECK(n_rows_total >= 15, "compared %d rows", n_rows_total);
}

int main(void) {
    const char *path = gm_test_real_model();
    CHECK(path != NULL, "the real model must be in the cache (this test fails rather than skips)");
    if (!path) return gm_test_finish();
    gm_alloc_stats before = gm_alloc_get_stats();
    gm_error err = {0};
    gm_gguf *g = NULL;
    CHECK_OK(gm_gguf_open(path, &g, &err), &err);
    if (g) {
        CHECK(strcmp(gm_gguf_path(g), path) == 0, "path");
        test_metadata(g);
        test_tensors(g);
        test_dequant_rows(g);
        gm_gguf_free(g);
    }
    gm_alloc_stats after = gm_alloc_get_stats();
    CHECK(after.bytes_live == before.bytes_live, "no leaks");
    return gm_test_finish();
}

/*
 * test_adapter.c - adapters by module name, in both Gemma 3 checkpoint layouts, and adapters read
 * back from disk (core/train/gm_lora.c, core/store/gm_adapter.c), on the tiny Gemma 3:
 *   - the tiny model rewritten as Gemma3ForConditionalGeneration checkpoints (the same tensors under
 *     "model.language_model." - transformers >= 4.52 - and under the older "language_model.model.",
 *     with a vision_config) loads with the same logits, and its adapters get PEFT's keys, which
 *     follow transformers' module tree, not the files' layout: "base_model.model.model.language_
 *     model.layers.0.self_attn.q_proj.lora_A.weight" for both (PEFT 0.21 on transformers 5.24
 *     names them so: tests/ref/tiny_vision_ref.h5 /lora_vt peft_keys, checked in test_vision);
 *   - target_modules as PEFT matches them: "all-linear", a list of suffixes, a dotted suffix, a
 *     regular expression (full match); unknown names, bad and empty-matching expressions refused;
 *   - a checkpoint's adapter loaded with gm_adapter_load equals the trainer's, and generation with
 *     it equals generation with the trainer's own adapters, bit for bit - also on the
 *     conditional-generation layout of the same weights (modules matched on "layers.N.<module>");
 *   - a checkpoint without the LoRA alpha, a folder without trial files: clear errors.
 */
#define _GNU_SOURCE
#include "gm_adapter.h"
#include "gm_alloc.h"
#include "gm_checkpoint.h"
#include "gm_decoder.h"
#include "gm_lora.h"
#include "gm_model.h"
#include "gm_train.h"
#include "test_util.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = gm_malloc((size_t)len + 1);
    *n = fread(buf, 1, (size_t)len, f);
    buf[*n] = '\0';
    fclose(f);
    return buf;
}

static void write_all(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    fwrite(data, 1, n, f);
    fclose(f);
}

/* Writes <tmpdir>/<name>/ as a Gemma3ForConditionalGeneration checkpoint holding the tiny model's
 * tensors under `prefix` (instead of "model."): the safetensors header's keys renamed, the data
 * section unchanged (offsets are relative to it). */
static void write_multimodal(const char *name, const char *prefix, char *out_dir, size_t cap) {
    snprintf(out_dir, cap, "%s/%s", tmpdir, name);
    mkdir(out_dir, 0755);
    size_t n = 0, cn = 0;
    char *st = read_all(gm_test_path("tests/ref/tiny_gemma3/model.safetensors"), &n);
    char *cfg = read_all(gm_test_path("tests/ref/tiny_gemma3/config.json"), &cn);
    if (!st || !cfg) {
        CHECK(false, "tiny model files missing");
        return;
    }
    uint64_t hlen;
    memcpy(&hlen, st, 8);
    /* rename keys: every "model. that starts a key */
    size_t cap_h = (size_t)hlen * 2 + 64, k = 0;
    char *h = gm_malloc(cap_h);
    const char *src = st + 8, *end = st + 8 + hlen;
    while (src < end) {
        if (strncmp(src, "\"model.", 7) == 0) {
            k += (size_t)sprintf(h + k, "\"%s", prefix);
            src += 7;
        } else {
            h[k++] = *src++;
        }
    }
    while (k % 8) h[k++] = ' '; /* safetensors pads the header with spaces */
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    FILE *f = fopen(path, "wb");
    uint64_t nh = k;
    fwrite(&nh, 8, 1, f);
    fwrite(h, 1, k, f);
    fwrite(st + 8 + hlen, 1, n - 8 - hlen, f);
    fclose(f);
    /* the wrapper config: the text config nested, a vision tower beside it */
    char *wrap = gm_malloc(cn + 512);
    int w = sprintf(wrap, "{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"model_type\": \"gemma3\", "
                          "\"mm_tokens_per_image\": 256, \"vision_config\": {\"hidden_size\": 1152, \"num_hidden_layers\": 27, "
                          "\"intermediate_size\": 4304, \"num_attention_heads\": 16, \"image_size\": 896, \"patch_size\": 14}, "
                          "\"text_config\": %s}", cfg);
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    write_all(path, wrap, (size_t)w);
    gm_free(st), gm_free(cfg), gm_free(h), gm_free(wrap);
}

/* Last-position logits of ids[0..T) (V floats) with an optional adapter. */
static void logits_of(const gm_model *m, gm_backend *be, const gm_lora *lora, const int32_t *ids, int64_t T, float *out) {
    gm_error err = {0};
    gm_infer *st = NULL;
    gm_infer_opts io = {.batch = 1, .ctx = T, .max_tokens = T, .n_threads = 2, .adapter = lora, .backend = be};
    CHECK_OK(gm_infer_new(m, &io, &st, &err), &err);
    if (!st) return;
    CHECK_OK(gm_decoder_forward(st, ids, T, false, &err), &err);
    memcpy(out, st->logits, (size_t)m->cfg.vocab_size * sizeof(float));
    gm_infer_free(st);
}

static int count_targets(const gm_model *m, const char *targets, gm_status *s_out, char *msg, size_t cap) {
    gm_lora_config lc = gm_lora_config_default();
    snprintf(lc.targets, sizeof lc.targets, "%s", targets);
    gm_lora lo;
    gm_error err = {0};
    gm_status s = gm_lora_describe(&lo, &lc, m->arch, &m->cfg, m->prefix, &err);
    if (s_out) *s_out = s;
    if (msg) snprintf(msg, cap, "%s", err.msg);
    int n = s == GM_OK ? lo.n : -1;
    gm_lora_free(&lo);
    return n;
}

static const int32_t IDS[12] = {2, 17, 45, 99, 3, 120, 7, 7, 64, 200, 31, 5};

static void test_layouts_and_targets(const gm_model *causal) {
    gm_error err = {0};
    int64_t V = causal->cfg.vocab_size, L = causal->cfg.n_layers;
    float *want = gm_malloc((size_t)V * 4), *got = gm_malloc((size_t)V * 4);
    logits_of(causal, NULL, NULL, IDS, 12, want);
    struct {
        const char *name, *prefix, *peft_q0;
    } layouts[] = {
        {"causal", "model.", "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"},
        {"cond_new", "model.language_model.", "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight"},
        {"cond_legacy", "language_model.model.", "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight"},
    };
    for (int i = 0; i < 3; i++) {
        gm_model *m = (gm_model *)causal;
        char dir[400];
        if (i > 0) {
            write_multimodal(layouts[i].name, layouts[i].prefix, dir, sizeof dir);
            m = NULL;
            CHECK_OK(gm_model_load(dir, NULL, &m, &err), &err);
            if (!m) continue;
            CHECK(m->cfg.vision.hidden_size == 1152 && m->cfg.vision.n_layers == 27 && m->cfg.vision.tokens == 256 &&
                      m->cfg.vision.patches == 4096,
                  "%s: the nested vision_config is read (hidden %lld, layers %lld, tokens %lld, patches %lld)", layouts[i].name,
                  (long long)m->cfg.vision.hidden_size, (long long)m->cfg.vision.n_layers, (long long)m->cfg.vision.tokens,
                  (long long)m->cfg.vision.patches);
            logits_of(m, NULL, NULL, IDS, 12, got);
            CHECK(memcmp(want, got, (size_t)V * 4) == 0, "%s: the same tensors give the same logits", layouts[i].name);
        }
        CHECK(strcmp(m->prefix, layouts[i].prefix) == 0, "%s: module prefix '%s'", layouts[i].name, m->prefix);
        gm_lora_config lc = gm_lora_config_default();
        gm_lora lo;
        CHECK_OK(gm_lora_describe(&lo, &lc, m->arch, &m->cfg, m->peft_prefix, &err), &err);
        CHECK(lo.n == 7 * L && strcmp(lo.ad[0].name_A, layouts[i].peft_q0) == 0, "%s: %d adapters, first key %s", layouts[i].name,
              lo.n, lo.n ? lo.ad[0].name_A : "");
        gm_lora_free(&lo);
        if (i > 0) gm_model_free(m);
    }
    /* PEFT's target_modules rules */
    gm_status s;
    char msg[1600];
    CHECK(count_targets(causal, "all-linear", NULL, NULL, 0) == 7 * L, "all-linear");
    CHECK(count_targets(causal, "q_proj,v_proj", NULL, NULL, 0) == 2 * L, "a list of names");
    CHECK(count_targets(causal, "q_proj v_proj  o_proj", NULL, NULL, 0) == 3 * L, "a space-separated list");
    CHECK(count_targets(causal, "self_attn.o_proj", NULL, NULL, 0) == L, "a dotted suffix");
    CHECK(count_targets(causal, ".*layers\\.[0-2]\\.mlp\\..*", NULL, NULL, 0) == 9, "a regular expression (full match)");
    /* a regex is matched against the whole module name, as PEFT's re.fullmatch: a bare alternation
     * of short names matches nothing (PEFT would adapt nothing and fail too) */
    CHECK(count_targets(causal, ".*(q_proj|k_proj)", NULL, NULL, 0) == 2 * L, "an alternation");
    CHECK(count_targets(causal, "q_proj|k_proj", &s, msg, sizeof msg) < 0 && gm_test_contains(msg, "select no module"),
          "a regex is matched whole: %s", msg);
    CHECK(count_targets(causal, ".*\\.q_proj", NULL, NULL, 0) == L, "regex on the full name");
    CHECK(count_targets(causal, "qproj", &s, msg, sizeof msg) < 0 && s == GM_ERR_INVALID && gm_test_contains(msg, "'qproj'") &&
              gm_test_contains(msg, "gate_proj"),
          "unknown name: %s", msg);
    CHECK(count_targets(causal, "(q_proj", &s, msg, sizeof msg) < 0 && s == GM_ERR_INVALID && gm_test_contains(msg, "regular expression"),
          "bad regex: %s", msg);
    CHECK(count_targets(causal, ".*\\.lm_head", &s, msg, sizeof msg) < 0 && s == GM_ERR_INVALID && gm_test_contains(msg, "select no module"),
          "regex matching nothing: %s", msg);
    /* patterns glibc's regcomp would expand without bound (fuzz_experiment found the first: 1.3 GB):
     * a quantifier on a quantifier, as Python refuses; nested repetitions past 4,096 copies */
    CHECK(count_targets(causal, "all-++++++++++++++++++++++++++++++++linear", &s, msg, sizeof msg) < 0 &&
              s == GM_ERR_INVALID && gm_test_contains(msg, "multiple repeat at position 5"),
          "a quantifier on a quantifier: %s", msg);
    CHECK(count_targets(causal, "((((((((((((((.*q_proj)+)+)+)+)+)+)+)+)+)+)+)+)+)", &s, msg, sizeof msg) < 0 &&
              s == GM_ERR_INVALID && gm_test_contains(msg, "more than 4096 copies"),
          "nested repetitions: %s", msg);
    CHECK(count_targets(causal, "((x{100}){100})", &s, msg, sizeof msg) < 0 && gm_test_contains(msg, "more than 4096 copies"),
          "nested counted repetitions: %s", msg);
    CHECK(count_targets(causal, ".*\\.(q|v)_proj+?", NULL, NULL, 0) == 2 * L, "a lazy quantifier is Python syntax");
    CHECK(count_targets(causal, "(.*)+\\.(q_proj){1,2}", NULL, NULL, 0) == L, "a bounded nesting is fine");
    gm_free(want), gm_free(got);
}

static void test_adapter_files(const gm_model *m) {
    gm_error err = {0};
    int64_t V = m->cfg.vocab_size;
    gm_backend *be = NULL;
    CHECK_OK(gm_backend_cpu_new(2, &be, &err), &err);
    gm_train_opts o = gm_train_opts_default();
    o.lora.rank = 4;
    o.lora.alpha = 12;
    o.lora.rslora = true;
    snprintf(o.lora.targets, sizeof o.lora.targets, "q_proj,v_proj,down_proj");
    o.batch = 1;
    o.max_length = 12;
    o.lr = 1e-2f;
    gm_trainer *tr = NULL;
    CHECK_OK(gm_trainer_new_on(m, &o, be, &tr, &err), &err);
    if (!tr) return;
    int32_t tg[12];
    for (int i = 0; i < 12; i++) tg[i] = i >= 4 && i < 11 ? IDS[i + 1] : -1;
    gm_batch b = {.B = 1, .T = 12, .ids = IDS, .targets = tg, .example_index = NULL};
    for (int s = 0; s < 3; s++) CHECK_OK(gm_trainer_step(tr, &b, 1, NULL, &err), &err);
    char ck[512], ck_bare[512];
    snprintf(ck, sizeof ck, "%s/ck.h5", tmpdir);
    snprintf(ck_bare, sizeof ck_bare, "%s/ck_bare.h5", tmpdir);
    CHECK_OK(gm_trainer_save(tr, ck, 0, 3, 0.0, "{\"alpha\": 12, \"rslora\": true, \"rank\": 4}", &err), &err);
    /* a checkpoint whose stored configuration is missing or stale: the trainer's own lora_alpha /
     * lora_rslora attributes decide the scaling */
    CHECK_OK(gm_trainer_save(tr, ck_bare, 0, 3, 0.0, "{\"alpha\": 99, \"rslora\": false}", &err), &err);
    float *want = gm_malloc((size_t)V * 4), *got = gm_malloc((size_t)V * 4), *base = gm_malloc((size_t)V * 4);
    logits_of(m, be, gm_trainer_lora(tr), IDS, 12, want);
    logits_of(m, be, NULL, IDS, 12, base);
    gm_adapter *a = NULL;
    CHECK_OK(gm_adapter_load(m, be, ck, NULL, &a, &err), &err);
    if (a) {
        const gm_lora *lo = gm_trainer_lora(tr);
        bool same = a->lora.n == lo->n && a->lora.cfg.rank == 4 && a->lora.scaling == lo->scaling && a->step == 3;
        for (int i = 0; same && i < lo->n; i++)
            same = strcmp(a->lora.ad[i].name_A, lo->ad[i].name_A) == 0 &&
                   memcmp(a->lora.ad[i].A, lo->ad[i].A, (size_t)(4 * lo->ad[i].in) * 4) == 0 &&
                   memcmp(a->lora.ad[i].B, lo->ad[i].B, (size_t)(lo->ad[i].out * 4) * 4) == 0;
        CHECK(same, "the checkpoint's adapter equals the trainer's (modules, rank, rsLoRA scaling, values)");
        logits_of(m, be, &a->lora, IDS, 12, got);
        CHECK(memcmp(want, got, (size_t)V * 4) == 0, "generation with the loaded adapter == with the trainer's");
        CHECK(memcmp(base, got, (size_t)V * 4) != 0, "the adapter changes the logits");
        gm_adapter_free(a);
    }
    /* the same adapter on the conditional-generation layout of the same weights */
    char dir[400];
    write_multimodal("cond_adapter", "model.language_model.", dir, sizeof dir);
    gm_model *mm = NULL;
    CHECK_OK(gm_model_load(dir, NULL, &mm, &err), &err);
    if (mm) {
        a = NULL;
        CHECK_OK(gm_adapter_load(mm, be, ck, NULL, &a, &err), &err);
        if (a) {
            CHECK(strncmp(a->lora.ad[0].name_A, "base_model.model.model.language_model.layers.0.", 47) == 0,
                  "keys follow the model's layout: %s", a->lora.ad[0].name_A);
            logits_of(mm, be, &a->lora, IDS, 12, got);
            CHECK(memcmp(want, got, (size_t)V * 4) == 0, "an adapter trained on one layout applies to the other");
            gm_adapter_free(a);
        }
        gm_model_free(mm);
    }
    a = NULL;
    CHECK_OK(gm_adapter_load(m, be, ck_bare, NULL, &a, &err), &err);
    CHECK(a && a->lora.cfg.alpha == 12 && a->lora.cfg.rslora && a->lora.scaling == gm_trainer_lora(tr)->scaling,
          "the checkpoint's own alpha (12, rsLoRA) wins over a stale config (99)");
    gm_adapter_free(a);
    /* errors: a file that gives no alpha at all (written without the trainer's attributes) */
    char ck_old[512];
    snprintf(ck_old, sizeof ck_old, "%s/ck_old.h5", tmpdir);
    {
        const gm_lora_adapter *ad0 = &gm_trainer_lora(tr)->ad[0];
        gm_ckpt_tensor t[2] = {{ad0->name_A, ad0->A, NULL, NULL, 2, {4, ad0->in, 0, 0}},
                               {ad0->name_B, ad0->B, NULL, NULL, 2, {ad0->out, 4, 0, 0}}};
        gm_ckpt c = {.step = 1, .config_json = "{}", .n_tensors = 2, .tensors = t};
        CHECK_OK(gm_ckpt_save(ck_old, &c, &err), &err);
    }
    a = NULL;
    CHECK(gm_adapter_load(m, be, ck_old, NULL, &a, &err) == GM_ERR_FORMAT && gm_test_contains(err.msg, "alpha") && !a,
          "a checkpoint that gives no alpha: %s", err.msg);
    CHECK(gm_adapter_load(m, be, ck, "1", &a, &err) == GM_ERR_INVALID && gm_test_contains(err.msg, "is a checkpoint"),
          "--trial with a checkpoint: %s", err.msg);
    CHECK(gm_adapter_load(m, be, tmpdir, NULL, &a, &err) == GM_ERR_NOT_FOUND && gm_test_contains(err.msg, "no trial files"),
          "a folder without trial files: %s", err.msg);
    CHECK(gm_adapter_load(m, be, gm_test_path("tests/ref/tiny_gemma3_ref.h5"), NULL, &a, &err) != GM_OK &&
              gm_test_contains(err.msg, "not a gemmarun results or checkpoint file"),
          "another HDF5 file: %s", err.msg);
    gm_free(want), gm_free(got), gm_free(base);
    gm_trainer_free(tr);
    gm_backend_free(be);
}

int main(void) {
    if (!gm_test_make_tmpdir("adapter", tmpdir, sizeof tmpdir)) return gm_test_finish();
    gm_error err = {0};
    gm_model *m = NULL;
    CHECK_OK(gm_model_load(gm_test_path("tests/ref/tiny_gemma3"), NULL, &m, &err), &err);
    if (m) {
        test_layouts_and_targets(m);
        test_adapter_files(m);
        gm_model_free(m);
    }
    gm_test_remove_tmpdir(tmpdir);
    return gm_test_finish();
}

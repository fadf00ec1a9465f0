/*
 * gm_plan.c - training memory plans: exact for Gemma 3 (the trainer's own layout), estimated
 * for Gemma 3n / Gemma 4 (core/plan/gm_plan_arch.c). See gm_plan.h.
 */
#include "gm_plan.h"

#include "gm_plan_arch.h"

#include "gm_backend.h" /* GM_CUBLAS_WORKSPACE_BYTES */

#include "gm_fetch.h"
#include "gm_gguf.h"
#include "gm_lora.h"
#include "gm_model.h"
#include "gm_quant.h"
#include "gm_vision.h" /* the tower's own layout (gm_plan_vision) */
#include "gm_audio.h" /* gm_audio_frames */
#include "gm_audio_encoder.h" /* the audio encoder's own layout (gm_plan_audio) */

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* Resident memory of a gemmarun training process beyond its arenas and mapped weights: code,
 * shared libraries (OpenBLAS, HDF5, Lua, PLplot, ...), the Lua state and what OpenBLAS touches of
 * its per-thread buffers. Fitted on measurements (docs/memory.md, "Runtime"): 12.5 MiB before
 * any model is loaded, 14.5 MiB for a whole tiny training run; a property of the build. */
#define RUNTIME_BASE_BYTES ((size_t)14848 << 10)
/* ... and with the CPU's bf16 GEMMs (compute, kernels/cpu/gemm_bf16.c) what oneDNN adds: loaded
 * (dlopen: its relocated pages), and once its matmul runs, the code it touches, its JIT-generated
 * kernels, primitive cache and scratchpads. Fitted (docs/memory.md, "Runtime"). */
#define GM_PLAN_DNNL_LOAD_BYTES ((size_t)5376 << 10)
#define GM_PLAN_DNNL_GEMM_BYTES ((size_t)2560 << 10)
/* Per vocabulary entry: the tokenizer's copy of the token text, its hash-table slot, score and
 * type, and the GGUF reader's string index and file pages (fitted: a 262,144-entry vocabulary
 * adds ~18 MiB to a training run of the 270M model). */
#define TOKENIZER_BYTES_PER_TOKEN 72


bool gm_config_probe_is_preset(const char *arg) {
    gm_config tmp;
    /* a built-in size name, unless it is also a fetched model (then the file is the truth) */
    return !gm_fetch_is_cached(arg) && gm_config_preset(arg, &tmp, NULL) == GM_OK;
}

gm_status gm_config_probe(const char *arg, gm_config *cfg, gm_dtype *stored, gm_dtype *stored_embed, gm_error *err) {
    *stored = *stored_embed = GM_BF16;
    if (gm_config_probe_is_preset(arg)) return gm_config_preset(arg, cfg, err);
    char path[1200];
    GM_TRY(gm_resolve_model(arg, path, sizeof path, err));
    struct stat st;
    if (stat(path, &st) != 0)
        return gm_error_set(err, GM_ERR_IO,
                            "%s: no such file, folder or model name (`gemmarun fetch` downloads gemma3-270m; "
                            "built-in sizes to plan with: gemma3-1b, gemma3-4b, gemma3-12b, gemma3-27b, gemma3n-e2b, "
                            "gemma3n-e4b, gemma4-e2b, gemma4-e4b, gemma4-31b, gemma4-26b-a4b)", path);
    size_t n = strlen(path);
    if (S_ISDIR(st.st_mode) || (n > 5 && strcmp(path + n - 5, ".json") == 0)) {
        char cp[1300];
        if (S_ISDIR(st.st_mode)) snprintf(cp, sizeof cp, "%s/config.json", path);
        else snprintf(cp, sizeof cp, "%s", path);
        GM_TRY(gm_config_from_json_file(cp, cfg, err));
        /* the weights' dtypes from the safetensors header beside it (a config.json alone: bf16) */
        gm_error e2 = {0};
        (void)gm_model_stored_dtypes(cp, stored, stored_embed, &e2);
        return GM_OK;
    }
    gm_gguf *g = NULL;
    GM_TRY(gm_gguf_open(path, &g, err));
    gm_status s = gm_config_from_gguf(g, cfg, err);
    /* the dominant stored type of the linear weights (the FFN's), and the embedding's */
    const gm_gguf_tensor *t = gm_gguf_find_tensor(g, "blk.0.ffn_up.weight");
    if (t) *stored = t->dtype;
    t = gm_gguf_find_tensor(g, "token_embd.weight");
    if (t) *stored_embed = t->dtype;
    gm_gguf_free(g);
    return s;
}

/* What a checkpoint save adds beyond the two images (gm_plan.h): HDF5's library state, free lists
 * and metadata cache once a file has been written, and its per-dataset buffers. Fitted on the
 * memory table (docs/memory.md): 5.7 MiB on the tiny model (22 K trainable parameters), 10.8 MiB
 * on the 270M one at rank 16 (3.8 M): 5.5 MiB plus 1.5 bytes per trainable parameter. */
#define CHECKPOINT_BASE_BYTES ((size_t)5632 << 10)
#define CHECKPOINT_EXTRA_PER_PARAM_X2 3 /* 1.5 bytes, in halves */

size_t gm_plan_checkpoint_bytes(int64_t n_trainable) {
    return CHECKPOINT_BASE_BYTES + 2u * 3u * 4u * (size_t)n_trainable +
           (size_t)n_trainable * CHECKPOINT_EXTRA_PER_PARAM_X2 / 2u;
}

size_t gm_plan_runtime_bytes(const gm_config *cfg) {
    return RUNTIME_BASE_BYTES + (size_t)cfg->vocab_size * TOKENIZER_BYTES_PER_TOKEN;
}

/* Whether a model name already says "Gemma" (any case). */
static bool names_gemma(const char *name) {
    for (const char *p = name; *p; p++) {
        static const char w[] = "gemma";
        size_t i = 0;
        while (w[i] && p[i] && (p[i] | 0x20) == w[i]) i++;
        if (!w[i]) return true;
    }
    return false;
}

gm_status gm_plan_max_images(const gm_config *cfg, const gm_train_opts *o, const gm_plan_inputs *in, int64_t *out,
                             gm_error *err) {
    *out = o->max_images;
    int64_t images = in ? in->images : 0;
    if (images <= 0 && o->max_images <= 0) return GM_OK;
    /* cfg->name is the preset's or the file's own ("gemma3-4b", or general.name), usually naming
     * the family already; a bare one ("gemma3_text" from config.json) gets it added */
    if (cfg->vision.hidden_size <= 0 || cfg->vision.tokens <= 0)
        return gm_error_set(err, GM_ERR_UNSUPPORTED,
                            "%s%s takes no image inputs: it has no vision tower\n  hint: the multimodal Gemma 3 sizes "
                            "are gemma3-4b, gemma3-12b and gemma3-27b (or a Gemma3ForConditionalGeneration checkpoint)",
                            names_gemma(cfg->name) ? "" : "Gemma 3 model ", cfg->name);
    if (images > 0) {
        /* gm_plan_check_size bounds images by the model's positions, so this cannot wrap. Gemma 4's
         * images each have their own grid: only what any image takes is certain (one soft token:
         * a refusal here is never wrong; the data set checks each example's own) */
        bool own = cfg->arch == GM_ARCH_GEMMA4;
        int64_t per = own ? 1 : cfg->vision.tokens, positions = images * (per + 2);
        if (positions >= o->max_length)
            return gm_error_set(err, GM_ERR_INVALID,
                                "max_length = %lld leaves no room for text beside %lld image%s (%s%lld soft token%s + 2 "
                                "markers each = %lld positions, counted in max_length)\n  hint: raise max_length above %lld",
                                (long long)o->max_length, (long long)images, images == 1 ? "" : "s", own ? "at least " : "",
                                (long long)per, per == 1 ? "" : "s", (long long)positions, (long long)positions);
        if (images * o->batch > *out) *out = images * o->batch;
    }
    return GM_OK;
}

gm_status gm_plan_vision(const gm_config *cfg, const gm_train_opts *o, int64_t max_images, int n_threads, gm_dtype stored,
                         gm_plan_tower *out, gm_error *err) {
    memset(out, 0, sizeof *out);
    gm_vision v;
    gm_arena a, h;
    gm_arena_init(&a, "vision tower plan", GM_DEVICE_CPU);
    gm_arena_init(&h, "vision tower plan host", GM_DEVICE_CPU);
    /* gm_vision_init clears v first, so releasing after a failed init frees what it made */
    gm_lora_config vl;
    gm_vision_train vt = gm_train_vision_selection(o, &vl);
    gm_status s = gm_vision_init_train(&v, cfg, NULL, max_images, &vt, o->checkpointing, n_threads, NULL, err);
    if (s == GM_OK) {
        v.stored = stored;
        s = gm_vision_layout(&v, &a, &h, err);
    }
    if (s == GM_OK) {
        out->max_images = max_images;
        out->stored = stored;
        for (int k = 0; k < GM_MEM_KIND_COUNT; k++) out->by_kind[k] = a.by_kind[k] + h.by_kind[k];
        /* read in place on a host-visible backend (the plan's): the model's memory-mapped pages
         * and its f32 vectors, which a text-only run never touches */
        out->weights = v.w.alias_bytes + a.by_kind[GM_MEM_WEIGHTS];
        out->trained = a.by_kind[GM_MEM_ADAPTERS] + a.by_kind[GM_MEM_GRADS] + a.by_kind[GM_MEM_OPTIMIZER];
        out->activations = a.used - a.by_kind[GM_MEM_WEIGHTS] - out->trained;
        out->staging = h.used;
        out->total = out->weights + out->trained + out->activations + out->staging;
    }
    gm_vision_release(&v);
    gm_arena_free(&a);
    gm_arena_free(&h);
    return s;
}

gm_status gm_plan_max_audio(const gm_config *cfg, const gm_train_opts *o, const gm_plan_inputs *in, int64_t *clips,
                            int64_t *frames, gm_error *err) {
    *clips = o->max_audio, *frames = o->max_audio_frames;
    double seconds = in ? in->audio_seconds : 0;
    if (seconds <= 0 && o->max_audio <= 0) return GM_OK;
    if (cfg->arch == GM_ARCH_GEMMA3)
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s%s takes no audio inputs (Gemma 3 has no audio tower)",
                            names_gemma(cfg->name) ? "" : "Gemma 3 model ", cfg->name);
    if (!gm_config_has_audio(cfg) || cfg->audio.soft_tokens <= 0)
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s takes no audio inputs: its config has no audio tower\n"
                            "  hint: plan a config with one (gemma3n-e2b, gemma3n-e4b, gemma4-e2b, gemma4-e4b)", cfg->name);
    if (seconds > 0) {
        /* the extractor keeps 30 s of a clip: longer audio is several clips (gm_plan_check_size
         * bounds the seconds by the model's positions); Gemma 4's clip takes a token per 40 ms */
        int64_t n = (int64_t)ceil(seconds / 30.0), T = 0;
        double longest = seconds < 30.0 ? seconds : 30.0;
        int64_t samples = (int64_t)ceil(longest * GM_AUDIO_RATE), tokens = gm_audio_tokens(cfg, samples);
        gm_audio_frames_kind(cfg->arch == GM_ARCH_GEMMA4 ? GM_AUDIO_FE_GEMMA4 : GM_AUDIO_FE_GEMMA3N, samples, NULL, &T);
        int64_t positions = n * (tokens + 2);
        if (tokens < 1)
            return gm_error_set(err, GM_ERR_INVALID, "audio_seconds = %g is shorter than the feature extractor's first frame "
                                "(10 ms on Gemma 4): a clip that short takes no soft token", seconds);
        if (positions >= o->max_length)
            return gm_error_set(err, GM_ERR_INVALID,
                                "max_length = %lld leaves no room for text beside %lld audio clip%s (%lld soft tokens + 2 "
                                "markers each = %lld positions, counted in max_length)\n  hint: raise max_length above %lld",
                                (long long)o->max_length, (long long)n, n == 1 ? "" : "s", (long long)tokens,
                                (long long)positions, (long long)positions);
        if (n * o->batch > *clips) *clips = n * o->batch;
        if (T > *frames) *frames = T;
    }
    if (*frames < 1)
        return gm_error_set(err, GM_ERR_INVALID, "audio_seconds = %g is shorter than the feature extractor's first frame "
                            "(32 ms on Gemma 3n, 20 ms on Gemma 4)", seconds);
    return GM_OK;
}

gm_status gm_plan_audio(const gm_config *cfg, int64_t max_clips, int64_t frames, const gm_train_opts *o, gm_dtype stored,
                        gm_plan_tower *out, gm_error *err) {
    memset(out, 0, sizeof *out);
    gm_audio_encoder e;
    gm_arena a, h;
    gm_arena_init(&a, "audio encoder plan", GM_DEVICE_CPU);
    gm_arena_init(&h, "audio encoder plan host", GM_DEVICE_CPU);
    gm_lora_config al;
    const gm_lora_config *alp = gm_train_audio_selection(o, &al);
    gm_status s = gm_audio_encoder_init_train(&e, cfg, NULL, NULL, max_clips, frames, alp, o->checkpointing, o->n_threads,
                                              NULL, err);
    if (s == GM_OK) {
        e.stored = stored;
        s = gm_audio_encoder_layout(&e, &a, &h, err);
    }
    if (s == GM_OK) {
        out->max_images = max_clips, out->frames = frames, out->stored = stored;
        for (int k = 0; k < GM_MEM_KIND_COUNT; k++) out->by_kind[k] = a.by_kind[k] + h.by_kind[k];
        /* the matrices read in place on a host-visible backend (the plan's), its f32 vectors and
         * derived tables in the arena */
        out->weights = e.alias_bytes + a.by_kind[GM_MEM_WEIGHTS];
        out->trained = a.by_kind[GM_MEM_ADAPTERS] + a.by_kind[GM_MEM_GRADS] + a.by_kind[GM_MEM_OPTIMIZER];
        out->activations = a.used - a.by_kind[GM_MEM_WEIGHTS] - out->trained;
        out->staging = h.used;
        out->total = out->weights + out->trained + out->activations + out->staging;
    }
    gm_audio_encoder_release(&e);
    gm_arena_free(&a);
    gm_arena_free(&h);
    return s;
}

gm_status gm_plan_training(const gm_config *cfg, const gm_train_opts *o, gm_dtype stored, gm_dtype stored_embed,
                           const gm_plan_inputs *inputs, gm_plan *out, gm_error *err) {
    memset(out, 0, sizeof *out);
    /* exact where gemmarun trains the model: Gemma 3, Gemma 3n's text decoder with its audio
     * encoder (its MobileNet-V5 vision tower is not in gemmarun: with images the plan is the
     * estimate), Gemma 4's text decoders, 26B-A4B's experts included, with its vision tower or its
     * audio tower */
    bool images = (inputs && inputs->images > 0) || o->max_images > 0;
    bool exact = cfg->arch == GM_ARCH_GEMMA3 || (cfg->arch == GM_ARCH_GEMMA3N && !images) || cfg->arch == GM_ARCH_GEMMA4;
    if (!exact) return gm_plan_estimate(cfg, o, stored, stored_embed, inputs, out, err);
    GM_TRY(gm_lora_config_validate(&o->lora, cfg, err));
    /* before the trainer's layout multiplies batch x max_length into byte counts */
    GM_TRY(gm_plan_check_size(cfg, o, inputs, err));
    /* images: the trainer reserves the tower for the images of one micro-batch */
    gm_train_opts ov = *o;
    GM_TRY(gm_plan_max_images(cfg, o, inputs, &ov.max_images, err));
    GM_TRY(gm_plan_max_audio(cfg, o, inputs, &ov.max_audio, &ov.max_audio_frames, err));
    /* the trainer's own layout, on measuring arenas: adapters, gradients, optimizer state,
     * activations, transients, workspace, and the re-encoded base weights when not aliased */
    gm_train_plan_info tp;
    GM_TRY(gm_train_plan(cfg, &ov, stored, stored_embed, &tp, err));
    memcpy(out->by_kind, tp.by_kind, sizeof tp.by_kind);
    /* base weights read in place from the file (memory-mapped pages become resident): the
     * embedding / LM head and norms always, the linear weights when trained on as stored */
    out->by_kind[GM_MEM_WEIGHTS] += tp.alias_bytes - tp.audio_alias_bytes; /* the encoder's: its own item below */
    bool alias = gm_quant_is_alias(o->quant, stored);
    snprintf(out->base_detail, sizeof out->base_detail, "linear %s %.1f MiB%s; embedding %s %.1f MiB (memory-mapped)",
             alias ? gm_dtype_name(stored) : gm_quant_name(o->quant), (double)tp.weight_bytes[GM_W_LINEAR] / 1048576.0,
             alias ? " (memory-mapped)" : "", gm_dtype_name(stored_embed), (double)tp.weight_bytes[GM_W_EMBED] / 1048576.0);
    out->n_params = gm_config_n_params(cfg);
    out->n_trainable = tp.n_trainable;
    out->by_kind[GM_MEM_TRANSIENT] += gm_plan_checkpoint_bytes(out->n_trainable);
    /* the tower's share as an item of its own: the same layout the trainer ran (so its arena part
     * comes out of the items exactly), plus its weights read in place, which the trainer's
     * arenas do not hold */
    if (ov.max_images > 0) {
        GM_TRY(gm_plan_vision(cfg, &ov, ov.max_images, ov.n_threads, stored, &out->vision, err));
        for (int k = 0; k < GM_MEM_KIND_COUNT; k++) {
            GM_ASSERT(out->by_kind[k] >= out->vision.by_kind[k]);
            out->by_kind[k] -= out->vision.by_kind[k];
        }
    }
    if (ov.max_audio > 0) { /* the audio encoder likewise (with audio_targets, its adapters and records too) */
        GM_TRY(gm_plan_audio(cfg, ov.max_audio, ov.max_audio_frames, &ov, stored, &out->audio, err));
        for (int k = 0; k < GM_MEM_KIND_COUNT; k++) {
            GM_ASSERT(out->by_kind[k] >= out->audio.by_kind[k]);
            out->by_kind[k] -= out->audio.by_kind[k];
        }
    }
    out->runtime = gm_plan_runtime_bytes(cfg) + (tp.cpu_bf16 ? GM_PLAN_DNNL_LOAD_BYTES : 0) +
                   (tp.cpu_bf16_gemms ? GM_PLAN_DNNL_GEMM_BYTES : 0);
    out->host_only = out->runtime + tp.host_bytes + gm_plan_checkpoint_bytes(out->n_trainable) + out->vision.staging +
                     out->audio.staging;
    out->total = out->runtime + out->vision.total + out->audio.total;
    for (int k = 0; k < GM_MEM_KIND_COUNT; k++) out->total += out->by_kind[k];
    out->exact = true;
    return GM_OK;
}

/* The CUDA context's own device memory (module images, the driver's per-context state, local
 * memory for the resident threads): not cudaMalloc'd, seen only by cudaMemGetInfo. An estimate
 * (a CUDA 12/13 context with lazy module loading, CUDA_MODULE_LOADING=LAZY being the default since
 * 12.2, is commonly reported at a few hundred MiB on Hopper) to be replaced by the value the GPU
 * script measures (tests/device/run.sh: cudaMemGetInfo before and after the backend starts). */
#define GM_PLAN_CUDA_CONTEXT_BYTES ((size_t)512 << 20)

void gm_plan_on_device(gm_plan *p, gm_device device) {
    p->device = device;
    if (device != GM_DEVICE_CUDA) {
        p->device_arenas = p->cuda_context = p->device_total = p->host_total = 0;
        return;
    }
    size_t host = p->host_only ? p->host_only : p->runtime;
    p->host_total = host;
    p->device_arenas = p->total - host + GM_CUDA_LIBRARY_BYTES;
    p->cuda_context = GM_PLAN_CUDA_CONTEXT_BYTES;
    p->device_total = p->device_arenas + p->cuda_context;
    if (p->exact) {
        p->exact = false;
        snprintf(p->note, sizeof p->note, "on CUDA: the trainer's layout with the base weights uploaded, cuBLAS's workspace "
                 "%zu MiB and the bf16 staging buffer %zu MiB, the CUDA context estimated at %zu MiB; not yet compared with a "
                 "GPU's allocator peak and cudaMemGetInfo (tests/device/run.sh does)", GM_CUBLAS_WORKSPACE_BYTES >> 20,
                 GM_CUDA_BF16_STAGING_BYTES >> 20, GM_PLAN_CUDA_CONTEXT_BYTES >> 20);
    }
}

void gm_plan_format(const gm_plan *p, char *buf, size_t cap) {
    size_t n = 0;
#define PUT(...)                                                                             \
    do {                                                                                     \
        int w = snprintf(buf + n, n < cap ? cap - n : 0, __VA_ARGS__);                       \
        if (w > 0) n += (size_t)w;                                                           \
    } while (0)
    for (int k = 0; k < GM_MEM_KIND_COUNT; k++) {
        if (k == GM_MEM_KV_CACHE && p->by_kind[k] == 0) continue;
        PUT("  %-18s %10.1f MiB", gm_mem_kind_name((gm_mem_kind)k), (double)p->by_kind[k] / 1048576.0);
        if (k == GM_MEM_WEIGHTS && p->base_detail[0]) PUT("   (%s)", p->base_detail);
        PUT("\n");
    }
    if (p->vision.total > 0) {
        const gm_plan_tower *v = &p->vision;
        char tr[96] = "";
        if (v->trained > 0)
            snprintf(tr, sizeof tr, ", trained with gradients and optimizer state %.1f MiB", (double)v->trained / 1048576.0);
        PUT("  %-18s %10.1f MiB   (%lld image%s per micro-batch: weights %s %.1f MiB (memory-mapped)%s, activations %.1f MiB, "
            "pixel staging %.1f MiB)\n",
            "vision tower", (double)v->total / 1048576.0, (long long)v->max_images, v->max_images == 1 ? "" : "s",
            gm_dtype_name(v->stored), (double)v->weights / 1048576.0, tr, (double)v->activations / 1048576.0,
            (double)v->staging / 1048576.0);
    }
    if (p->audio.total > 0) {
        const gm_plan_tower *a = &p->audio;
        char tr[96] = ", frozen";
        if (a->trained > 0)
            snprintf(tr, sizeof tr, ", LoRA with gradients and optimizer state %.1f MiB", (double)a->trained / 1048576.0);
        PUT("  %-18s %10.1f MiB   (%lld clip%s of up to %lld feature frames per micro-batch: weights %s %.1f MiB (memory-mapped), "
            "activations %.1f MiB%s)\n",
            "audio tower", (double)a->total / 1048576.0, (long long)a->max_images, a->max_images == 1 ? "" : "s",
            (long long)a->frames, gm_dtype_name(a->stored), (double)a->weights / 1048576.0, (double)(a->activations + a->staging) / 1048576.0,
            tr);
    }
    PUT("  %-18s %10.1f MiB   (code, libraries, tokenizer, BLAS buffers)\n", "runtime", (double)p->runtime / 1048576.0);
    PUT("  %-18s %10.1f MiB   (%.2f GiB)%s\n", "total", (double)p->total / 1048576.0, (double)p->total / 1073741824.0,
        p->exact ? "" : "   estimate");
    if (p->device == GM_DEVICE_CUDA) {
        PUT("on the GPU (device cuda):\n");
        PUT("  %-18s %10.1f MiB   (the items above less host memory, base weights uploaded, cuBLAS workspace %.0f MiB, "
            "bf16 staging %.0f MiB)\n", "arenas", (double)p->device_arenas / 1048576.0,
            (double)GM_CUBLAS_WORKSPACE_BYTES / 1048576.0, (double)GM_CUDA_BF16_STAGING_BYTES / 1048576.0);
        PUT("  %-18s %10.1f MiB   (estimate)\n", "CUDA context", (double)p->cuda_context / 1048576.0);
        PUT("  %-18s %10.1f MiB   (%.2f GiB)\n", "device total", (double)p->device_total / 1048576.0,
            (double)p->device_total / 1073741824.0);
        PUT("  %-18s %10.1f MiB   (runtime, host staging, checkpoint saves)\n", "host", (double)p->host_total / 1048576.0);
    }
#undef PUT
    if (n >= cap && cap) buf[cap - 1] = '\0';
}

gm_status gm_plan_fit(const gm_config *cfg, gm_train_opts *o, gm_dtype stored, gm_dtype stored_embed,
                      const gm_plan_inputs *inputs, size_t limit, gm_plan *p, char *chosen, size_t cap, gm_error *err) {
    chosen[0] = '\0';
    GM_TRY(gm_plan_training(cfg, o, stored, stored_embed, inputs, p, err));
    if (p->total <= limit) return GM_OK;
    gm_train_opts f = *o;
    size_t first = p->total;
    if (!f.checkpointing) f.checkpointing = true;
    GM_TRY(gm_plan_training(cfg, &f, stored, stored_embed, inputs, p, err));
    /* max_images is per micro-batch (images per example x batch): it shrinks with the batch */
    int64_t per_example = f.max_images > 0 && f.max_images % f.batch == 0 ? f.max_images / f.batch : 0;
    while (p->total > limit && f.batch > 1) {
        f.batch /= 2;
        f.grad_accum *= 2;
        if (per_example > 0) f.max_images = per_example * f.batch;
        GM_TRY(gm_plan_training(cfg, &f, stored, stored_embed, inputs, p, err));
    }
    if (p->total > limit) {
        /* a small limit in its own unit, not as 0.00 GiB */
        char lim[32];
        if (limit >= ((size_t)1 << 30)) snprintf(lim, sizeof lim, "%.2f GiB", (double)limit / 1073741824.0);
        else if (limit >= ((size_t)1 << 20)) snprintf(lim, sizeof lim, "%.2f MiB", (double)limit / 1048576.0);
        else if (limit >= 1024) snprintf(lim, sizeof lim, "%.2f KiB", (double)limit / 1024.0);
        else snprintf(lim, sizeof lim, "%zu B", limit);
        return gm_error_set(err, GM_ERR_LIMIT,
                            "the plan needs %.2f GiB, over the memory limit of %s, and still %.2f GiB with activation "
                            "checkpointing and batch 1\n  hint: lower max_length or rank%s, or raise the limit",
                            (double)first / 1073741824.0, lim, (double)p->total / 1073741824.0,
                            o->quant == GM_QUANT_NF4 ? "" : ", or use quant = nf4");
    }
    size_t n = 0;
    if (f.checkpointing && !o->checkpointing) n += (size_t)snprintf(chosen, cap, "activation checkpointing on");
    if (f.batch != o->batch && n < cap)
        snprintf(chosen + n, cap - n, "%sbatch %lld x gradient accumulation %lld (was %lld x %lld)", n ? ", " : "",
                 (long long)f.batch, (long long)f.grad_accum, (long long)o->batch, (long long)o->grad_accum);
    *o = f;
    return GM_OK;
}

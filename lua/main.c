/*
 * main.c - the `gemmarun` command line.
 *
 *   gemmarun                          run the embedded default experiment (experiments/quickstart.lua)
 *   gemmarun FILE.lua [--allow-os]    run an experiment file
 *   gemmarun submit FILE.lua --slurm  its pending trials as a Slurm job array (lua/slurm.lua)
 *   gemmarun inspect MODEL            config, tensors (dtype, shape, bytes), memory
 *   gemmarun generate MODEL [--adapter RESULTS_OR_CHECKPOINT [--trial ID]] "prompt"
 *                                     [--max-tokens N] [--temperature T] [--top-k K] [--top-p P]
 *                                     [--seed S] [--chat] [--threads N]
 *   gemmarun fetch NAME               fetch an embedded default (e.g. gemma3-270m) into the cache
 *   gemmarun table RESULTS            re-render the tables and plots of results/<exp>/ or
 *                                     results/<exp>.h5 (lua/report.lua)
 *   gemmarun reproduce RESULTS ...    rerun a stored trial and compare (lua/runner.lua)
 *   gemmarun export RESULTS [--trial ID | --best] [--format peft|gguf|merged] [--dtype T] [--base MODEL] OUT
 *                                     a trial's adapter, or the model with it merged, for other tools
 *                                     (runner.export)
 *
 * MODEL is a .gguf file, a Hugging Face checkpoint folder, or a name known to `fetch`.
 * Exit codes (DESIGN.md §2): 0 success, 1 a run failed, 2 bad usage or bad input file.
 * This is the only place in gemmarun that decides the process exit code.
 */
#define _GNU_SOURCE
#include "gm_alloc.h"
#include "gm_chat.h"
#include "gm_data.h"
#include "gm_decoder.h"
#include "gm_dist.h"
#include "gm_fetch.h"
#include "gm_adapter.h"
#include "gm_backend.h"
#include "gm_generate.h"
#include "gm_gguf.h"
#include "gm_image.h"
#include "gm_audio.h"
#include "gm_audio_encoder.h"
#include "gm_mm_embed.h"
#include "gm_lua.h"
#include "gm_lora.h"
#include "gm_model.h"
#include "kernels.h"
#include "gm_plan.h"
#include "gm_quant.h"
#include "gm_tokenizer.h"
#include "gm_vision.h"

#include <malloc.h> // mallopt

#include <errno.h>
#include <float.h>
#include <lauxlib.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


static volatile int interrupted;
static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
    signal(SIGINT, SIG_DFL); /* a second Ctrl-C stops at once */
}

static void usage(FILE *f) {
    fprintf(f,
            "usage:\n"
            "  gemmarun [--dry-run] [--trial N] [--set key=value ...] [--threads N]\n"
            "                                     run the embedded default experiment (experiments/quickstart.lua)\n"
            "  gemmarun EXPERIMENT.lua [--dry-run] [--trial N|ID] [--set key=value ...] [--allow-os] [--threads N]\n"
            "                    [--device cpu|cuda|cuda:N]   (--device D: the same as --set device=D)\n"
            "                    [--no-tables] [--verbose] [--max-trials N] [--max-lua-instructions N] [--max-lua-memory SIZE]\n"
            "                    (--trial: the trial's index in the sweep or its id; --no-tables: leave the\n"
            "                    tables to `gemmarun table`; limits on experiment code: 10000 trials, 250000000\n"
            "                    instructions at the file's top level, 1GiB of Lua heap; --verbose: Lua tracebacks)\n"
            "  gemmarun submit EXPERIMENT.lua --slurm [--partition P] [--cpus-per-trial N] [--gpus-per-trial N]\n"
            "                    [--max-parallel K] [--print] [--set key=value ...] [-- SBATCH OPTIONS]\n"
            "                                     the pending trials as a Slurm job array (memory per trial from\n"
            "                                     its plan) and a job that renders the tables after them\n"
            "                                     (scripts in results/EXP/slurm/; --print: print, do not submit)\n"
            "  gemmarun inspect MODEL\n"
            "  gemmarun generate MODEL [--adapter RESULTS_OR_CHECKPOINT [--trial ID]] \"prompt\"\n"
            "                    [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S] [--chat]\n"
            "                    [--image FILE ...] [--pan-and-scan] [--audio FILE ...] [--threads N]\n"
            "                    [--device cpu|cuda|cuda:N] [--dot int8|f32]\n"
            "                    (--adapter: results/EXP/, a trial file, a\n"
            "                    merged results file, a checkpoint or a PEFT adapter folder; --trial: the trial's\n"
            "                    index or id; --image: a PNG / JPEG before the prompt, multimodal models;\n"
            "                    FILE#xywh=X,Y,W,H: a region of it, in pixels; --pan-and-scan: each image also\n"
            "                    as its crops, as Gemma 3's processor's do_pan_and_scan; --audio: a WAV / FLAC /\n"
            "                    Ogg / MP3 clip before the prompt, Gemma 3n / Gemma 4 E (its first 30 s); --dot: what\n"
            "                    decoding multiplies in on the CPU: int8 (the default, llama.cpp's int8 dots on Q8_0 / Q5_0 /\n"
            "                    Q4_K / Q6_K weights) or f32 (slower: the f32 numbers transformers computes); a model\n"
            "                    stored in f32 / bf16 decodes in f32 either way, as the report line says; --int8-dot:\n"
            "                    --dot int8)\n"
            "  gemmarun plan MODEL [key=value ...] the memory plan of a training run (loads no weights)\n"
            "  gemmarun options [--markdown]       the training options: defaults, ranges, meaning\n"
            "  gemmarun fetch NAME                (known: gemma3-270m)\n"
            "  gemmarun table RESULTS             tables (.md .tex .csv) and plots of results/EXP/\n"
            "                                     (trial files) or results/EXP.h5 (merged)\n"
            "  gemmarun reproduce RESULTS [--trial ID] [--threads N] [--set key=value ...] [--allow-os]\n"
            "                                     reruns a stored trial from its stored experiment (model\n"
            "                                     and data hashes checked first) into RESULTS/reproduce/;\n"
            "                                     exit 0 when bit-identical, 1 when it moved\n"
            "  gemmarun export RESULTS [--trial ID | --best] [--format peft|gguf|merged] [--dtype T] [--base MODEL] OUT\n"
            "                                     a trial's adapter as a PEFT adapter folder OUT/ or a llama.cpp\n"
            "                                     LoRA file OUT.gguf; merged: the model with it merged in, as a\n"
            "                                     Hugging Face folder OUT/ or a GGUF OUT.gguf (--best: the best\n"
            "                                     trial by the report's metric)\n"
            "MODEL is a .gguf file, a Hugging Face checkpoint folder, or a name known to fetch.\n");
}

static int fail(const gm_error *err, int code) {
    fprintf(stderr, "gemmarun: error: %s\n", err->msg);
    return code;
}

/* Exit code for a failed core call: bad input/usage is 2, everything else 1. */
static int code_for(gm_status s) {
    switch (s) {
    case GM_ERR_FORMAT:
    case GM_ERR_INVALID:
    case GM_ERR_NOT_FOUND:
    case GM_ERR_UNSUPPORTED:
    case GM_ERR_IO: return 2;
    default: return 1;
    }
}

static bool parse_long(const char *s, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno == ERANGE) return false;
    *out = v;
    return true;
}

/* A finite number (no inf/nan). */
static bool parse_double(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno == ERANGE || !isfinite(v)) return false;
    *out = v;
    return true;
}

/* ---- inspect ---- */

typedef struct inspect_acc {
    size_t bytes[GM_DTYPE_COUNT];
    int64_t count[GM_DTYPE_COUNT];
    int64_t params;
    bool verbose;
} inspect_acc;

static void inspect_tensor(const gm_tensor *t, void *user) {
    inspect_acc *a = user;
    char d[64];
    size_t nb = gm_tensor_nbytes(t);
    a->bytes[t->dtype] += nb;
    a->count[t->dtype]++;
    a->params += gm_tensor_numel(t);
    if (a->verbose) printf("  %-52s %-22s %12zu\n", t->name, gm_tensor_describe(t, d, sizeof d), nb);
}

static int cmd_inspect(int argc, char **argv) {
    if (argc < 1) {
        usage(stderr);
        return 2;
    }
    gm_error err = {0};
    char path[1200];
    if (gm_resolve_model(argv[0], path, sizeof path, &err) != GM_OK) return fail(&err, 2);
    gm_model *m = NULL;
    gm_status s = gm_model_load(path, NULL, &m, &err);
    if (s != GM_OK) return fail(&err, code_for(s));
    const gm_config *c = &m->cfg;
    printf("model        %s\n", m->path);
    printf("format       %s\n", m->format == GM_FORMAT_GGUF ? "GGUF" : "safetensors");
    printf("arch         %s (%s)\n", gm_arch_name(c->arch), c->name);
    printf("vocab_size %lld, hidden_size %lld, layers %lld, heads %lld, kv heads %lld, head_dim %lld,\n"
           "intermediate_size %lld, sliding_window %lld, max_position_embeddings %lld,\n"
           "rms_norm_eps %g, query_pre_attn_scalar %g, tied embeddings %s\n",
           (long long)c->vocab_size, (long long)c->hidden_size, (long long)c->n_layers, (long long)c->n_heads,
           (long long)c->n_kv_heads, (long long)c->head_dim, (long long)c->intermediate_size,
           (long long)c->sliding_window, (long long)c->max_position_embeddings, (double)c->rms_norm_eps,
           (double)c->query_pre_attn_scalar, c->tie_word_embeddings ? "yes" : "no");
    printf("layers       ");
    for (int64_t l = 0; l < c->n_layers; l++)
        printf("%s", c->layer_type[l] == GM_LAYER_FULL ? "F" : "s");
    printf("  (s = sliding, RoPE %g; F = full, RoPE %g)\n", (double)c->rope_theta[0],
           (double)c->rope_theta[c->n_layers >= 6 ? 5 : 0]);
    if (m->tok) printf("tokenizer    %lld tokens\n", (long long)gm_tokenizer_vocab_size(m->tok));
    if (m->vision) {
        const gm_vision_config *v = &m->vision->cfg.vision;
        printf("vision tower %s: %lld layers, width %lld, %lld heads, MLP %lld; images %lld x %lld in %lld-pixel patches "
               "(%lld), %lld soft tokens each (image token %d, between %d and %d); weights below '%s'\n",
               gm_arch_name(m->vision->cfg.arch), (long long)v->n_layers, (long long)v->hidden_size, (long long)v->n_heads,
               (long long)v->intermediate_size, (long long)v->image_size, (long long)v->image_size, (long long)v->patch_size,
               (long long)v->patches,
               (long long)v->tokens, v->image_token_id, v->boi_id, v->eoi_id, m->vision->prefix);
    }
    inspect_acc acc;
    memset(&acc, 0, sizeof acc);
    acc.verbose = true;
    printf("tensors (names as in Hugging Face checkpoints):\n");
    gm_model_for_each_tensor(m, inspect_tensor, &acc);
    if (m->vision) gm_model_for_each_tensor(m->vision, inspect_tensor, &acc);
    printf("weights by dtype:\n");
    size_t total = 0;
    for (int t = 0; t < GM_DTYPE_COUNT; t++) {
        if (!acc.count[t]) continue;
        printf("  %-6s %4lld tensors %10.1f MiB\n", gm_dtype_name((gm_dtype)t), (long long)acc.count[t],
               (double)acc.bytes[t] / 1048576.0);
        total += acc.bytes[t];
    }
    printf("  total  %lld parameters, %.1f MiB (%.1f MiB memory-mapped, not copied)\n", (long long)acc.params,
           (double)total / 1048576.0, (double)m->mapped_bytes / 1048576.0);
    size_t by_kind[GM_MEM_KIND_COUNT];
    gm_infer_opts io = {.batch = 1, .ctx = 2048, .max_tokens = 512, .n_threads = 2};
    size_t plan = gm_infer_plan_bytes(c, &io, GM_Q8_0, by_kind);
    printf("inference plan (batch 1, context 2048, prefill chunk 512): %.1f MiB\n", (double)plan / 1048576.0);
    for (int k = 0; k < GM_MEM_KIND_COUNT; k++)
        if (by_kind[k]) printf("  %-18s %10.1f MiB\n", gm_mem_kind_name((gm_mem_kind)k), (double)by_kind[k] / 1048576.0);
    gm_model_free(m);
    return 0;
}

/* ---- generate ---- */

typedef struct stream_ctx {
    const gm_tokenizer *tok;
    const int32_t *stops;
    int n_stop;
} stream_ctx;

static bool stream_token(int32_t tok, void *user) {
    stream_ctx *sc = user;
    for (int i = 0; i < sc->n_stop; i++)
        if (tok == sc->stops[i]) return true; /* not printed; gm_generate stops on it */
    char piece[256];
    size_t n = gm_tokenizer_decode_piece(sc->tok, tok, false, piece, sizeof piece);
    fwrite(piece, 1, n < sizeof piece ? n : sizeof piece - 1, stdout);
    fflush(stdout);
    return true; /* Ctrl-C is handled by gm_generate through opts.interrupt */
}

static int cmd_generate(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *model_arg = NULL, *prompt = NULL, *adapter = NULL, *trial = NULL, *device = "cpu";
    long long max_tokens = 64, top_k = 0, seed = 0, threads = 2;
    double temperature = 0, top_p = 1;
    bool chat = false, options_done = false, int8_dot = false, pan_and_scan = false;
    gm_dot_from_name(GM_GENERATE_DOT_DEFAULT, &int8_dot);
    const char *images[16], *audio[16];
    int n_images = 0, n_audio = 0;
    char opt_buf[64];
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        if (!options_done && strcmp(a, "--") == 0) { /* the rest is positional (a prompt may start with '-') */
            options_done = true;
            continue;
        }
        if (options_done || a[0] != '-' || a[1] == '\0') { /* MODEL, then the prompt, wherever they stand */
            if (!model_arg) {
                model_arg = a;
            } else if (!prompt) {
                prompt = a;
            } else {
                fprintf(stderr, "gemmarun generate: too many arguments: MODEL '%s', prompt '%s', and '%s'; quote the prompt as "
                        "one argument\n", model_arg, prompt, a);
                return 2;
            }
            continue;
        }
        const char *eq = strchr(a, '=');
        bool inline_value = false; /* --option=value: the value is in this argument */
        if (eq && strncmp(a, "--", 2) == 0 && (size_t)(eq - a) < sizeof opt_buf) {
            snprintf(opt_buf, sizeof opt_buf, "%.*s", (int)(eq - a), a);
            a = opt_buf, v = eq + 1, inline_value = true;
        }
        if ((strcmp(a, "--adapter") == 0 || strcmp(a, "--trial") == 0) && v && !*v) {
            fprintf(stderr, "gemmarun generate: %s needs a value\n", a);
            return 2;
        }
        int step = inline_value ? 0 : 1; /* arguments a value option consumes beyond its name */
        if (strcmp(a, "--max-tokens") == 0 && v) ok = parse_long(v, &max_tokens) && max_tokens > 0 && max_tokens <= (1 << 24), i += step;
        else if (strcmp(a, "--temperature") == 0 && v) ok = parse_double(v, &temperature) && temperature >= 0, i += step;
        else if (strcmp(a, "--top-k") == 0 && v) ok = parse_long(v, &top_k) && top_k >= 0, i += step;
        else if (strcmp(a, "--top-p") == 0 && v) ok = parse_double(v, &top_p) && top_p > 0 && top_p <= 1, i += step;
        else if (strcmp(a, "--seed") == 0 && v) ok = parse_long(v, &seed), i += step;
        else if (strcmp(a, "--threads") == 0 && v) ok = parse_long(v, &threads) && threads > 0 && threads <= 256, i += step;
        else if (strcmp(a, "--device") == 0 && v) ok = gm_backend_parse_device(v, NULL, NULL) == GM_OK, device = v, i += step;
        else if (strcmp(a, "--chat") == 0 && !inline_value) chat = true;
        else if (strcmp(a, "--int8-dot") == 0 && !inline_value) int8_dot = true;
        else if (strcmp(a, "--dot") == 0 && v) ok = gm_dot_from_name(v, &int8_dot), i += step;
        else if (strcmp(a, "--pan-and-scan") == 0 && !inline_value) pan_and_scan = true;
        else if (strcmp(a, "--adapter") == 0 && v) adapter = v, i += step;
        else if (strcmp(a, "--trial") == 0 && v) trial = v, i += step;
        else if (strcmp(a, "--image") == 0 && v && *v) {
            if (n_images == 16) {
                fprintf(stderr, "gemmarun generate: at most 16 --image files\n");
                return 2;
            }
            images[n_images++] = v, i += step;
        } else if (strcmp(a, "--audio") == 0 && v && *v) {
            if (n_audio == 16) {
                fprintf(stderr, "gemmarun generate: at most 16 --audio files\n");
                return 2;
            }
            audio[n_audio++] = v, i += step;
        }
        else {
            fprintf(stderr, "gemmarun generate: unknown option or missing value: %s\n", argv[i]);
            usage(stderr);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "gemmarun generate: bad value for %s: %s%s\n", a, v,
                    strcmp(a, "--device") == 0 ? " (cpu, cuda or cuda:N)" : strcmp(a, "--dot") == 0 ? " (int8 or f32)" : "");
            return 2;
        }
    }
    if (!model_arg || !prompt) {
        fprintf(stderr, "gemmarun generate: %s\n", model_arg ? "no prompt given" : "no MODEL given");
        usage(stderr);
        return 2;
    }
    if (trial && !adapter) {
        fprintf(stderr, "gemmarun generate: --trial picks a trial of --adapter RESULTS; give --adapter too\n");
        return 2;
    }
    if (n_audio > 0 && n_images > 0) {
        fprintf(stderr, "gemmarun generate: give --image or --audio, not both (gemmarun reads one medium per prompt)\n");
        return 2;
    }
    if (pan_and_scan && n_images == 0) {
        fprintf(stderr, "gemmarun generate: --pan-and-scan crops the --image files; there is none\n");
        return 2;
    }
    if (temperature == 0 && (top_k > 0 || top_p < 1))
        fprintf(stderr, "gemmarun generate: note: --top-k / --top-p apply to sampling; with temperature 0 (the default) "
                        "decoding is greedy: add --temperature T (e.g. 0.8) to sample\n");
    gm_error err = {0};
    char path[1200];
    if (gm_resolve_model(model_arg, path, sizeof path, &err) != GM_OK) return fail(&err, 2);
    gm_model *m = NULL;
    gm_status s = gm_model_load(path, NULL, &m, &err);
    if (s != GM_OK) return fail(&err, code_for(s));
    if (!m->tok) {
        fprintf(stderr, "gemmarun: error: %s has no tokenizer (tokenizer.json)\n", path);
        gm_model_free(m);
        return 2;
    }
    if (pan_and_scan && m->cfg.arch != GM_ARCH_GEMMA3 && !gm_model_no_images(m)) {
        fprintf(stderr, "gemmarun: error: --pan-and-scan: %s: pan & scan crops are Gemma 3's processor's; this model's resizes "
                        "each image whole\n  hint: leave --pan-and-scan out\n", path);
        gm_model_free(m);
        return 2;
    }
    if (n_images > 0 && gm_model_no_images(m)) {
        fprintf(stderr, "gemmarun: error: --image %s: %s: %s\n%s", images[0], path, gm_model_no_images(m),
                m->cfg.arch == GM_ARCH_GEMMA3 ? "  hint: use a multimodal Gemma 3 checkpoint (Gemma3ForConditionalGeneration, "
                                                "e.g. gemma-3-4b)\n" : "");
        gm_model_free(m);
        return 2;
    }
    if (n_audio > 0 && gm_model_no_audio(m)) {
        fprintf(stderr, "gemmarun: error: --audio %s: %s: %s\n", audio[0], path, gm_model_no_audio(m));
        gm_model_free(m);
        return 2;
    }
    /* the device first: a missing GPU is an error before any work (the image tower runs on it too) */
    gm_backend *be = NULL;
    s = gm_backend_open(device, (int)threads, &be, &err);
    if (s != GM_OK) {
        gm_model_free(m);
        return fail(&err, 2);
    }
    /* images go before the prompt, one "<start_of_image>" each, as Hugging Face's chat template
     * writes [{"type": "image"}, ..., {"type": "text"}] */
    char *user = gm_malloc(strlen(prompt) + 16 * (size_t)(n_images + n_audio) + 1);
    if (!user) {
        gm_backend_free(be);
        gm_model_free(m);
        return fail(&(gm_error){GM_ERR_NOMEM, "out of memory"}, 1);
    }
    user[0] = '\0';
    for (int i = 0; i < n_images; i++) strcat(user, "<start_of_image>");
    for (int i = 0; i < n_audio; i++) strcat(user, "<start_of_audio>");
    strcat(user, prompt);
    char *text = NULL;
    if (chat) { /* Gemma's chat template around one user turn (gemma_architecture.md §2.5) */
        gm_chat_msg msg = {"user", user};
        s = gm_chat_render(gm_chat_format_of(m->tok), &msg, 1, true, &text, NULL, &err);
        if (s != GM_OK) {
            gm_free(user);
            gm_backend_free(be);
            gm_model_free(m);
            return fail(&err, 2);
        }
    }
    const char *in = text ? text : user;
    size_t len = strlen(in);
    int32_t *ids = NULL;
    int64_t n_prompt = 0;
    float *soft = NULL;
    int64_t *soft_rows = NULL, n_soft = 0;
    gm_mm_hard hard = {0};
    gm_status s_ad = GM_OK;
    gm_adapter *ad = NULL;
    if (adapter) { /* first: a trained image path runs the images below */
        s_ad = gm_adapter_load(m, be, adapter, trial, &ad, &err);
        if (s_ad == GM_OK)
            fprintf(stderr, "gemmarun: adapter %s%s%s: %d modules%s%s%s, rank %d, alpha %g%s\n", ad->source,
                    ad->trial_id[0] ? ", trial " : "", ad->trial_id, ad->lora.n + ad->vision_lora.n + ad->audio_lora.n,
                    ad->vision_lora.n ? " (vision tower's included)" : "", ad->audio_lora.n ? " (audio encoder's included)" : "",
                    ad->has_proj ? ", trained projector" : "",
                    ad->lora.cfg.rank ? ad->lora.cfg.rank : ad->vision_lora.n ? ad->vision_lora.cfg.rank : ad->audio_lora.cfg.rank,
                    (double)ad->lora.cfg.alpha, ad->lora.cfg.rslora ? " (rsLoRA)" : "");
    }
    s = s_ad;
    if (s == GM_OK && n_images > 0) { /* expanded as the processor does; the images through the tower */
        const gm_vision_config *vc = &m->cfg.vision;
        gm_mm_spec mm = gm_mm_spec_image(&m->cfg);
        int64_t S = vc->image_size, C = m->cfg.hidden_size;
        /* the images first (with pan & scan their crop counts shape the prompt), each followed by
         * its crops: (views, 3, S, S); Gemma 4's each at its own size, packed */
        gm_image_opts io = mm.image;
        io.pan_and_scan = pan_and_scan;
        int64_t crops[16] = {0}, views = 0, tokens[16] = {0}, hw[2 * (1 + GM_IMAGE_MAX_CROPS) * 16], off = 0;
        bool aspect = io.max_patches > 0;
        int64_t per = aspect ? gm_mm_image_floats(&m->cfg) : 3 * S * S;
        float *pixels = gm_malloc((size_t)(n_images * (1 + GM_IMAGE_MAX_CROPS) * per) * sizeof(float));
        if (!pixels) s = gm_error_set(&err, GM_ERR_NOMEM, "out of memory for %d images", n_images);
        for (int i = 0; s == GM_OK && i < n_images; i++) {
            gm_image_pixels px = {0};
            s = gm_image_preprocess_file(images[i], NULL, &io, &px, &err);
            if (s == GM_OK && aspect && (px.h / vc->patch_size > vc->pos_table || px.w / vc->patch_size > vc->pos_table))
                s = gm_error_set(&err, GM_ERR_INVALID, "--image %s resizes to %lld x %lld pixels, %lld x %lld patches: more than "
                                 "the %lld rows of each axis of the model's position table (vision_config "
                                 "position_embedding_size)\n  hint: crop it nearer to square", images[i], (long long)px.w,
                                 (long long)px.h, (long long)(px.w / vc->patch_size), (long long)(px.h / vc->patch_size),
                                 (long long)vc->pos_table);
            if (s == GM_OK) {
                memcpy(pixels + off, px.data, (size_t)(px.n * 3 * px.h * px.w) * sizeof(float));
                for (int64_t v = 0; v < px.n; v++) hw[2 * (views + v)] = px.h, hw[2 * (views + v) + 1] = px.w;
                int64_t cell = vc->patch_size * vc->pool;
                tokens[i] = aspect ? (px.h / cell) * (px.w / cell) : vc->tokens;
                crops[i] = px.n_crops, views += px.n, off += px.n * 3 * px.h * px.w;
            }
            gm_image_pixels_free(&px);
        }
        int64_t n_tok = 0;
        for (int i = 0; i < n_images; i++) n_tok += tokens[i] * (1 + crops[i]);
        if (s == GM_OK)
            s = gm_mm_encode_text(m->tok, in, &mm, n_images, pan_and_scan ? crops : NULL, aspect ? tokens : NULL, 0, &ids,
                                  &n_prompt, &err);
        if (s == GM_OK && n_prompt >= m->cfg.max_position_embeddings) /* the images' share named (text cannot fix it) */
            s = gm_error_set(&err, GM_ERR_INVALID, "the prompt takes %lld positions, %lld of them its %d image%s' soft tokens "
                             "and markers (max_soft_tokens %lld%s): over the model's context of %lld positions\n  hint: fewer "
                             "images, or a smaller max_soft_tokens in the checkpoint's preprocessor_config.json",
                             (long long)n_prompt, (long long)(n_tok + 2 * views), n_images, n_images == 1 ? "" : "s",
                             (long long)vc->max_soft_tokens, aspect ? ", each image's grid its own" : "",
                             (long long)m->cfg.max_position_embeddings);
        gm_vision *vis = NULL;
        if (s == GM_OK) s = gm_vision_new_adapted(m, views, (int)threads, be, ad ? &ad->vision : NULL, &vis, &err);
        soft = s == GM_OK ? gm_malloc((size_t)(n_tok * C) * sizeof(float)) : NULL;
        soft_rows = s == GM_OK ? gm_malloc((size_t)n_tok * sizeof(int64_t)) : NULL;
        if (s == GM_OK && (!soft || !soft_rows)) s = gm_error_set(&err, GM_ERR_NOMEM, "out of memory");
        if (s == GM_OK) s = aspect ? gm_vision_encode_grids(vis, pixels, hw, views, soft, &err)
                                   : gm_vision_encode(vis, pixels, views, soft, NULL, &err);
        for (int64_t t = 0; s == GM_OK && t < n_prompt; t++)
            if (ids[t] == vc->image_token_id) soft_rows[n_soft++] = t;
        gm_vision_free(vis);
        gm_free(pixels);
    } else if (s == GM_OK && n_audio > 0) { /* each clip through the audio encoder, expanded as Gemma3nProcessor does */
#ifdef GM_HAVE_AUDIO
        gm_mm_spec as = gm_mm_spec_audio(&m->cfg);
        int64_t C = m->cfg.hidden_size, soft_tok = m->cfg.audio.soft_tokens, samples[16] = {0}, tokens[16] = {0};
        if (m->cfg.arch != GM_ARCH_GEMMA4) s = gm_mm_hard_load(m, &hard, &err); /* Gemma 3n's <end_of_audio>, ... */
        soft = s == GM_OK ? gm_malloc((size_t)(n_audio * soft_tok * C) * sizeof(float)) : NULL;
        soft_rows = s == GM_OK ? gm_malloc((size_t)(n_audio * soft_tok) * sizeof(int64_t)) : NULL;
        if (s == GM_OK && (!soft || !soft_rows)) s = gm_error_set(&err, GM_ERR_NOMEM, "out of memory");
        if (s == GM_OK)
            s = gm_audio_encode_files(m, &hard, audio, n_audio, (int)threads, be,
                                      ad ? &ad->audio_lora : NULL, soft, tokens, samples, &err);
        for (int i = 0; s == GM_OK && i < n_audio; i++)
            if (samples[i] > GM_AUDIO_MAX_SAMPLES)
                fprintf(stderr, "gemmarun: warning: --audio %s is %.1f s long; the feature extractor keeps its first "
                        "30 s (split it to use the rest)\n", audio[i], (double)samples[i] / GM_AUDIO_RATE);
        if (s == GM_OK) s = gm_mm_encode_text(m->tok, in, &as, n_audio, NULL, tokens, 0, &ids, &n_prompt, &err);
        for (int64_t t = 0; s == GM_OK && t < n_prompt; t++)
            if (ids[t] == m->cfg.audio.audio_token_id) soft_rows[n_soft++] = t;
#else
        s = gm_error_set(&err, GM_ERR_UNSUPPORTED, "--audio: this gemmarun was built without audio (cmake -DGM_AUDIO=OFF)");
#endif
    } else if (s == GM_OK) {
        ids = gm_malloc((len + 8) * sizeof(int32_t));
        s = ids ? gm_tokenizer_encode(m->tok, in, len, true, chat, ids, (int64_t)len + 8, &n_prompt, &err)
                : gm_error_set(&err, GM_ERR_NOMEM, "out of memory");
    }
    int rc = 0;
    gm_infer *st = NULL;
    int32_t *out = NULL;
    if (s == GM_OK) s = gm_generate_check(&m->cfg, n_prompt, max_tokens, &err);
    if (s == GM_OK) {
        /* prefill in chunks of 256 tokens: Ctrl-C is honoured between chunks */
        gm_infer_opts io = {.batch = 1, .ctx = n_prompt + max_tokens,
                            .max_tokens = n_images + n_audio > 0 || n_prompt < 256 ? n_prompt : 256, /* media: one call */
                            .n_threads = (int)threads, .adapter = ad && ad->lora.n > 0 ? &ad->lora : NULL, .backend = be,
                            .int8_dot = int8_dot};
        s = gm_infer_new(m, &io, &st, &err);
    }
    if (s == GM_OK) {
        gm_special_ids sp = gm_tokenizer_special(m->tok);
        int32_t stops[2];
        int n_stop = 0;
        if (sp.eos >= 0) stops[n_stop++] = sp.eos;
        if (sp.end_of_turn >= 0) stops[n_stop++] = sp.end_of_turn;
        gm_sample_opts so = {.max_new_tokens = max_tokens, .temperature = (float)temperature, .top_k = (int)top_k,
                             .top_p = (float)top_p, .seed = (uint64_t)seed, .stop_ids = stops, .n_stop = n_stop,
                             .interrupt = &interrupted};
        stream_ctx sc = {m->tok, stops, n_stop};
        out = gm_malloc((size_t)max_tokens * sizeof(int32_t));
        int64_t n_out = 0;
        gm_generate_stats stats = {0};
        signal(SIGINT, on_sigint);
        if (!chat) fputs(prompt, stdout);
        if (n_images > 0) {
            s = gm_generate_images(st, ids, n_prompt, soft, soft_rows, n_soft, m->cfg.vision.image_token_id, &so, stream_token,
                                   &sc, out, &n_out, &stats, &err);
        } else if (n_audio > 0) { /* Gemma 3n: every token causal, its hard multimodal tokens from their embedders */
            gm_prompt_media pm = {soft, soft_rows, n_soft, -1, &hard};
            s = gm_generate_media(st, ids, n_prompt, &pm, &so, stream_token, &sc, out, &n_out, &stats, &err);
        } else {
            s = gm_generate(st, ids, n_prompt, &so, stream_token, &sc, out, &n_out, &stats, &err);
        }
        signal(SIGINT, SIG_DFL);
        printf("\n");
        fflush(stdout);
        if (s == GM_OK) {
            double dec = stats.n_generated > 1 ? (double)(stats.n_generated - 1) / stats.decode_seconds : 0;
            fprintf(stderr,
                    "gemmarun: %lld prompt tokens at %.1f tokens/s, %lld new tokens at %.1f tokens/s (%d thread%s, %s dots), "
                    "peak memory %.0f MiB\n",
                    (long long)stats.n_prompt, (double)stats.n_prompt / stats.prefill_seconds,
                    (long long)stats.n_generated, dec, (int)threads, threads == 1 ? "" : "s",
                    gm_infer_int8_dots(st) ? "int8" : "f32",
                    (double)gm_process_peak_rss() / 1048576.0);
        }
    }
    if (s == GM_ERR_INTERRUPTED) {
        fprintf(stderr, "gemmarun: %s\n", err.msg);
        rc = 130; /* the shell's convention for SIGINT */
    } else if (s != GM_OK) {
        rc = fail(&err, code_for(s));
    }
    gm_free(out);
    gm_free(ids);
    gm_free(text);
    gm_free(user);
    gm_free(soft);
    gm_free(soft_rows);
    gm_mm_hard_free(&hard);
    gm_infer_free(st);
    gm_adapter_free(ad);
    gm_backend_free(be);
    gm_model_free(m);
    return rc;
}

/* ---- plan ---- */

/* Upper bounds of plan's settings: far beyond any real run, yet small enough that no product of
 * them wraps (the planner checks its byte counts too: gm_plan_check_size). */
#define PLAN_MAX_IMAGES 65536            /* images per example */
#define PLAN_MAX_AUDIO_S 86400.0         /* audio_seconds per example: a day */
#define PLAN_MAX_LIMIT 1152921504606846976.0 /* memory_limit: 2^60 bytes (1 EiB) */
#define BOOL_VALUES "on/off, true/false, yes/no or 1/0"

/* Every on/off setting (checkpointing, fit) takes the same words, BOOL_VALUES, named in its error. */
static bool parse_bool(const char *v, bool *out) {
    if (!strcmp(v, "true") || !strcmp(v, "on") || !strcmp(v, "1") || !strcmp(v, "yes")) *out = true;
    else if (!strcmp(v, "false") || !strcmp(v, "off") || !strcmp(v, "0") || !strcmp(v, "no")) *out = false;
    else return false;
    return true;
}

/* "48GiB", "512MB", "1e9" -> bytes */
static bool parse_size(const char *v, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || errno == ERANGE || !isfinite(x) || x <= 0) return false;
    static const struct { const char *u; double m; } units[] = {
        {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
        {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcmp(end, units[i].u) == 0) {
            *out = x * units[i].m;
            return true;
        }
    return false;
}

/* "48.00 GiB", "1.00 KiB", "512 B": a size in the largest binary unit it fills, so that small
 * limits do not read as 0.00 GiB. */
static const char *fmt_size(double bytes, char *buf, size_t cap) {
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    while (u < 6 && bytes >= 1024.0) bytes /= 1024.0, u++;
    if (u == 0) snprintf(buf, cap, "%.0f B", bytes);
    else snprintf(buf, cap, "%.2f %s", bytes, unit[u]);
    return buf;
}

/* The training options with their defaults and ranges, from the schema (gm_train_opts.def):
 * `gemmarun options` (text) and `--markdown` (the table of docs/experiments.md). */
static void print_options(FILE *f, bool markdown) {
    int n;
    const gm_opt_spec *sp = gm_train_opt_specs(&n);
    if (markdown) fprintf(f, "| field | default | allowed | meaning | default from |\n|---|---|---|---|---|\n");
    for (int i = 0; i < n; i++) {
        char range[160];
        gm_opt_describe_range(&sp[i], range, sizeof range);
        const char *def = sp[i].def_text[0] ? sp[i].def_text : "none";
        if (markdown) fprintf(f, "| `%s` | %s | %s | %s | %s |\n", sp[i].name, def, range, sp[i].doc, sp[i].source);
        else fprintf(f, "  %-16s %-12s %s; %s\n", sp[i].name, def, range, sp[i].doc);
    }
}

static int cmd_options(int argc, char **argv) {
    bool md = argc > 0 && strcmp(argv[0], "--markdown") == 0;
    if (argc > (md ? 1 : 0)) {
        fprintf(stderr, "usage: gemmarun options [--markdown]\n");
        return 2;
    }
    if (!md) printf("training options (experiment files' train = {...}, --set key=value, gemmarun plan key=value):\n");
    print_options(stdout, md);
    return 0;
}

static int cmd_plan(int argc, char **argv) {
    if (argc < 1) {
        fprintf(stderr, "usage: gemmarun plan MODEL [key=value ...]; the keys, their defaults and ranges:\n");
        print_options(stderr, false);
        fprintf(stderr, "  and, for the plan only:\n"
                        "  images=0 (0..65536)  audio_seconds=0 (0..86400)  threads=2 (1..256)\n"
                        "  memory_limit=none (e.g. 48GiB; at most 2^60 bytes = 1048576TiB)  fit=false (needs memory_limit)\n"
                        "  device=cpu (cpu, cuda or cuda:N: the GPU's share, its arenas, cuBLAS workspace and context)\n"
                        "  on/off settings take on/off, true/false, yes/no or 1/0\n"
                        "MODEL: a .gguf file, a Hugging Face folder or config.json, or a size name (gemma3-270m, gemma3-1b,\n"
                        "gemma3-4b, gemma3-12b, gemma3-27b, gemma3n-e2b, gemma3n-e4b, gemma4-e2b, gemma4-e4b, gemma4-31b,\n"
                        "gemma4-26b-a4b)\n");
        return 2;
    }
    gm_train_opts o = gm_train_opts_default();
    gm_plan_inputs in = {0, 0};
    double limit = 0;
    bool fit = false;
    gm_error err = {0};
    int device_index = -1; /* the device=... setting: -1 cpu, else a GPU */
    for (int i = 1; i < argc; i++) {
        char key[64];
        const char *eq = strchr(argv[i], '=');
        if (!eq || (size_t)(eq - argv[i]) >= sizeof key) {
            fprintf(stderr, "gemmarun plan: expected key=value, got '%s'\n", argv[i]);
            return 2;
        }
        snprintf(key, sizeof key, "%.*s", (int)(eq - argv[i]), argv[i]);
        const char *v = eq + 1;
        long long n = 0;
        double d = 0;
        bool ok = true, b = false;
        const char *want = NULL; /* the allowed values, for the error */
        const gm_opt_spec *sp = gm_train_opt_find(key);
        if (sp) {
            if (gm_train_opt_parse(&o, sp, v, &err) != GM_OK) {
                char range[160];
                if (sp->kind == GM_OPT_TARGETS || sp->kind == GM_OPT_LAYERS) /* the schema's message says more */
                    fprintf(stderr, "gemmarun plan: bad value: %s\n", err.msg);
                else
                    fprintf(stderr, "gemmarun plan: bad value for %s: %.80s%s (expected %s)\n", key, v, strlen(v) > 80 ? "..." : "",
                            sp->kind == GM_OPT_BOOL ? BOOL_VALUES : gm_opt_describe_range(sp, range, sizeof range));
                return 2;
            }
            continue;
        }
        if (!strcmp(key, "threads")) ok = parse_long(v, &n) && n > 0 && n <= 256, o.n_threads = (int)n, want = "an integer 1..256";
        else if (!strcmp(key, "images")) ok = parse_long(v, &n) && n >= 0 && n <= PLAN_MAX_IMAGES, in.images = n, want = "an integer 0..65536";
        else if (!strcmp(key, "audio_seconds")) ok = parse_double(v, &d) && d >= 0 && d <= PLAN_MAX_AUDIO_S, in.audio_seconds = d, want = "seconds 0..86400";
        else if (!strcmp(key, "memory_limit"))
            ok = parse_size(v, &limit) && limit >= 1 && limit <= PLAN_MAX_LIMIT,
            want = "a size from 1 byte to 2^60 bytes (1048576TiB), such as 48GiB or 512MB";
        else if (!strcmp(key, "fit")) ok = parse_bool(v, &b), fit = b, want = BOOL_VALUES;
        else if (!strcmp(key, "device")) ok = gm_backend_parse_device(v, &device_index, NULL) == GM_OK, want = "cpu, cuda or cuda:N";
        else {
            int nk;
            const gm_opt_spec *all = gm_train_opt_specs(&nk), *near = gm_train_opt_closest(key);
            fprintf(stderr, "gemmarun plan: unknown setting '%s'", key);
            if (near) fprintf(stderr, " (did you mean '%s'?)", near->name);
            fprintf(stderr, " (allowed: ");
            for (int k = 0; k < nk; k++) fprintf(stderr, "%s, ", all[k].name);
            fprintf(stderr, "threads, images, audio_seconds, memory_limit, fit, device)\n");
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "gemmarun plan: bad value for %s: %s%s%s%s\n", key, v, want ? " (expected " : "",
                    want ? want : "", want ? ")" : "");
            if (err.msg[0]) fprintf(stderr, "  %s\n", err.msg);
            return 2;
        }
    }
    /* as an experiment file: fit has nothing to fit into without a limit (not silently ignored) */
    if (fit && limit <= 0) {
        fprintf(stderr, "gemmarun plan: fit requires memory_limit (e.g. memory_limit=8GiB) to fit into\n");
        return 2;
    }
    if (fit && device_index >= 0) {
        fprintf(stderr, "gemmarun plan: fit with device=cuda is not supported yet (fit shrinks the host plan); give "
                        "memory_limit alone to compare the GPU's total with it\n");
        return 2;
    }
    /* pan & scan: an image far from square is also seen as up to GM_IMAGE_PAS_MAX_NUM_CROPS crops,
     * each its own block of soft tokens through the tower; without the images themselves (a run's
     * dry run counts each one's crops) the plan is the worst case */
    bool pas_worst = o.pan_and_scan && in.images > 0;
    if (pas_worst) in.images *= 1 + GM_IMAGE_PAS_MAX_NUM_CROPS;
    gm_config cfg;
    gm_dtype stored, stored_embed;
    if (gm_config_probe(argv[0], &cfg, &stored, &stored_embed, &err) != GM_OK) return fail(&err, 2);
    if (o.max_length > cfg.max_position_embeddings) {
        fprintf(stderr, "gemmarun plan: max_length %lld exceeds the model's %lld positions\n", (long long)o.max_length,
                (long long)cfg.max_position_embeddings);
        return 2;
    }
    gm_plan p;
    char chosen[256] = "";
    gm_status s = (limit > 0 && fit) ? gm_plan_fit(&cfg, &o, stored, stored_embed, &in, (size_t)limit, &p, chosen, sizeof chosen, &err)
                                     : gm_plan_training(&cfg, &o, stored, stored_embed, &in, &p, &err);
    if (s != GM_OK) return fail(&err, s == GM_ERR_LIMIT ? 1 : 2);
    gm_plan_on_device(&p, device_index >= 0 ? GM_DEVICE_CUDA : GM_DEVICE_CPU);
    printf("memory plan: %s (%s, %.2fB parameters)\n", argv[0], cfg.name, (double)p.n_params / 1e9);
    char trainable[32]; /* 3.8M, or the exact count below 100,000 */
    if (p.n_trainable >= 100000) snprintf(trainable, sizeof trainable, "%.1fM", (double)p.n_trainable / 1e6);
    else snprintf(trainable, sizeof trainable, "%lld", (long long)p.n_trainable);
    printf("LoRA rank %d alpha %g on %s (%s trainable), base %s, batch %lld x accumulation %lld, max_length %lld,\n"
           "activation checkpointing %s, %d thread%s\n",
           o.lora.rank, (double)o.lora.alpha, o.lora.targets, trainable, gm_quant_name(o.quant), (long long)o.batch,
           (long long)o.grad_accum, (long long)o.max_length, o.checkpointing ? "on" : "off", o.n_threads,
           o.n_threads == 1 ? "" : "s");
    if (pas_worst)
        printf("images per example: %lld with pan & scan: planned as %lld views, the worst case (every image with %d "
               "crops; an experiment's dry run counts its images' own)\n",
               (long long)(in.images / (1 + GM_IMAGE_PAS_MAX_NUM_CROPS)), (long long)in.images, GM_IMAGE_PAS_MAX_NUM_CROPS);
    else if (in.images)
        printf("images per example: %lld\n", (long long)in.images);
    if (in.images && (strcmp(o.vision_targets, "none") != 0 || o.train_projector))
        printf("vision tower: LoRA on %s%s\n", o.vision_targets, o.train_projector ? ", the projector trained (modules_to_save)" : "");
    if (in.audio_seconds > 0)
        printf("audio per example: %.1f s%s%s\n", in.audio_seconds, strcmp(o.audio_targets, "none") != 0 ? "; audio encoder: LoRA on " : "",
               strcmp(o.audio_targets, "none") != 0 ? o.audio_targets : "");
    char table[4096];
    gm_plan_format(&p, table, sizeof table);
    fputs(table, stdout);
    if (!p.exact && p.note[0]) printf("note: %s\n", p.note);
    if (chosen[0]) printf("fit: %s\n", chosen);
    if (limit > 0) {
        char lim[32];
        /* on a GPU the limit is the GPU's memory */
        size_t need = p.device == GM_DEVICE_CUDA ? p.device_total : p.total;
        printf("memory_limit %s%s: %s\n", fmt_size(limit, lim, sizeof lim), p.device == GM_DEVICE_CUDA ? " (the GPU's)" : "",
               need <= (size_t)limit ? "fits" : "does NOT fit");
        if (need > (size_t)limit) {
            if (p.device == GM_DEVICE_CUDA)
                printf("  hint: checkpointing=on, a smaller batch with more grad_accum, or lower max_length / rank%s\n",
                       o.quant == GM_QUANT_NF4 ? "" : ", or quant=nf4");
            else
                printf("  hint: add fit=true (checkpointing, smaller batch with more accumulation), or lower max_length / rank%s\n",
                       o.quant == GM_QUANT_NF4 ? "" : ", or quant=nf4");
            return 1;
        }
    }
    return 0;
}

/* ---- fetch ---- */

static int cmd_fetch(int argc, char **argv) {
    if (argc < 1) {
        fprintf(stderr, "usage: gemmarun fetch NAME (known:");
        for (const char *const *n = gm_fetch_names(); *n; n++) fprintf(stderr, " %s", *n);
        fprintf(stderr, ")\n");
        return 2;
    }
    if (argc > 1) {
        fprintf(stderr, "gemmarun fetch: one name expected, got also '%s'\n", argv[1]);
        return 2;
    }
    gm_error err = {0};
    char path[1200];
    gm_status s = gm_fetch(argv[0], true, path, sizeof path, &err);
    if (s != GM_OK) return fail(&err, s == GM_ERR_NOT_FOUND ? 2 : 1);
    printf("%s\n", path);
    return 0;
}

/* ---- table ---- */

/* The first line of a Lua error (the message without its traceback). */
static void print_first_line(const char *prefix, const char *msg) {
    // drop the "<chunk>:<line>: " position of the tiny driver chunk: it means nothing to a user
    static const char chunk[] = "gemmarun table:";
    if (strncmp(msg, chunk, sizeof chunk - 1) == 0) {
        const char *p = msg + sizeof chunk - 1;
        while (*p >= '0' && *p <= '9') p++;
        if (p[0] == ':' && p[1] == ' ') msg = p + 2;
    }
    const char *nl = strchr(msg, '\n');
    fprintf(stderr, "%s%.*s\n", prefix, nl ? (int)(nl - msg) : (int)strlen(msg), msg);
}

/* gemmarun table RESULTS: RESULTS is results/<exp>/ (trial files) or results/<exp>.h5 (merged).
 * The outputs go next to it: <dir>/<exp>.md/.tex/.csv, the plots, and for a folder the merged
 * <dir>/<exp>.h5; that folder is the Lua state's results root (the only place it may write).
 * Exit: 0 done, 2 missing/unreadable/corrupt RESULTS, 1 a failure while writing. */
static int cmd_table(int argc, char **argv) {
    if (argc != 1) {
        fprintf(stderr, "usage: gemmarun table RESULTS   (results/EXPERIMENT/ or results/EXPERIMENT.h5)\n");
        return 2;
    }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", argv[0]);
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') path[--n] = '\0';
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "gemmarun table: %s: no such file or folder\n", path);
        return 2;
    }
    bool is_dir = S_ISDIR(st.st_mode);
    // <dir>/<name>: the folder holding RESULTS and its name without .h5
    char dir[PATH_MAX], name[256];
    const char *slash = strrchr(path, '/');
    if (slash) snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    else snprintf(dir, sizeof dir, ".");
    const char *base = slash ? slash + 1 : path;
    size_t bl = strlen(base);
    if (!is_dir && bl > 3 && strcmp(base + bl - 3, ".h5") == 0) bl -= 3;
    if (bl == 0 || strcmp(base, ".") == 0) {
        fprintf(stderr, "gemmarun table: %s: name the results folder itself (results/EXPERIMENT/)\n", path);
        return 2;
    }
    snprintf(name, sizeof name, "%.*s", (int)bl, base);

    gm_lua_opts lo = {.allow_os = false, .n_threads = 1};
    gm_error err = {0};
    lua_State *L = NULL;
    if (gm_lua_new(&lo, &L, &err) != GM_OK) return fail(&err, 1);
    gm_lua_set_results_root(L, dir);
    lua_createtable(L, 0, 4);
    lua_pushstring(L, path);
    lua_setfield(L, -2, "path");
    lua_pushstring(L, dir);
    lua_setfield(L, -2, "dir");
    lua_pushstring(L, name);
    lua_setfield(L, -2, "name");
    lua_pushboolean(L, is_dir);
    lua_setfield(L, -2, "is_dir");
    lua_setglobal(L, "GM_TABLE");
    // 1. read (a failure here is bad input: exit 2)
    static const char read_src[] = "GM_TABLE.trials = gm.results_read_all(GM_TABLE.path)";
    if (gm_lua_run_string(L, read_src, sizeof read_src - 1, "=gemmarun table", &err) != GM_OK) {
        print_first_line("gemmarun table: ", err.msg);
        gm_lua_close(L);
        return 2;
    }
    lua_settop(L, 0);
    // 2. render, write, plot, merge
    static const char run_src[] =
        "local t = GM_TABLE\n"
        "return gm_module('runner').render_locked(t.dir, t.name, function()\n"
        "  return gm_module('report').cli(t.trials, t.path, t.dir, t.name, t.is_dir) end)";
    int rc = 0;
    if (gm_lua_run_string(L, run_src, sizeof run_src - 1, "=gemmarun table", &err) != GM_OK) {
        print_first_line("gemmarun table: error: ", err.msg);
        rc = strstr(err.msg, "no trial files") ? 2 : 1;
    } else if (lua_istable(L, -1)) {
        int res = lua_gettop(L);
        lua_getfield(L, res, "text");
        fputs(lua_tostring(L, -1) ? lua_tostring(L, -1) : "", stdout);
        lua_getfield(L, res, "warnings");
        for (lua_Integer i = 1; lua_istable(L, -1) && i <= (lua_Integer)lua_rawlen(L, -1); i++) {
            lua_rawgeti(L, -1, i);
            fprintf(stderr, "gemmarun table: warning: %s\n", lua_tostring(L, -1));
            lua_pop(L, 1);
        }
        lua_getfield(L, res, "written");
        printf("wrote");
        for (lua_Integer i = 1; lua_istable(L, -1) && i <= (lua_Integer)lua_rawlen(L, -1); i++) {
            lua_rawgeti(L, -1, i);
            printf("%s %s", i > 1 ? "," : "", lua_tostring(L, -1));
            lua_pop(L, 1);
        }
        printf("\n");
    }
    gm_lua_close(L);
    return rc;
}

/* ---- experiment files ---- */

static void on_sigint_run(int sig) {
    (void)sig;
    gm_lua_set_interrupted();
    signal(SIGINT, SIG_DFL); /* a second Ctrl-C stops at once */
}

/* The command line as typed (arguments with spaces or quotes single-quoted), for the provenance
 * of results files: GM_COMMAND_LINE in Lua (lua/runner.lua). Cut at its size. */
static char command_line[4096];
extern const char gm_git_commit[]; /* lua/build_info.cmake */

static void record_command_line(int argc, char **argv) {
    size_t n = 0;
    for (int i = 0; i < argc && n + 4 < sizeof command_line; i++) {
        const char *a = argv[i];
        bool quote = a[0] == '\0' || strpbrk(a, " \t\n'\"$`\\*?;&|<>()") != NULL;
        int w = snprintf(command_line + n, sizeof command_line - n, "%s%s%s%s", i ? " " : "", quote ? "'" : "", a,
                         quote ? "'" : "");
        if (w < 0) break;
        n += (size_t)w;
    }
    if (n >= sizeof command_line) command_line[sizeof command_line - 1] = '\0';
}

/* Pushes the function `name` of the embedded runner (lua/runner.lua). */
static void push_runner_fn(lua_State *L, const char *name) {
    lua_getglobal(L, "gm_module");
    lua_pushstring(L, "runner");
    lua_call(L, 1, 1);
    lua_getfield(L, -1, name);
    lua_remove(L, -2);
}

/* Sets field "set" of the table on top to the list of the --set values. */
static void set_overrides(lua_State *L, const char *const *sets, int nsets) {
    lua_createtable(L, nsets, 0);
    for (int i = 0; i < nsets; i++) {
        lua_pushstring(L, sets[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "set");
}

/* Runs an experiment file (or the embedded default when file is NULL). If the file returns an
 * experiment{...}, the runner (lua/runner.lua) runs its trials with the command-line options; with
 * submit set (`gemmarun submit FILE.lua --slurm ...`), lua/slurm.lua plans the pending trials and
 * submits them as a Slurm job array instead of running them. */
static int run_lua(const char *file, int argc, char **argv, bool submit) {
    gm_lua_opts lo = {.allow_os = false, .n_threads = 2};
    const char *sets[128], *trial = NULL, *partition = NULL, *sbatch_args[64];
    int nsets = 0, nsbatch = 0;
    long long max_trials = 0, gpus = 0, cpus = 0, max_parallel = 0;
    bool dry = false, no_tables = false, slurm = false, print = false, threads_given = false;
    const char *who = submit ? "gemmarun submit" : "gemmarun";
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (submit && strcmp(a, "--") == 0) { /* the rest goes to sbatch as it is */
            for (i++; i < argc; i++) {
                if (nsbatch == 64) {
                    fprintf(stderr, "%s: more than 64 sbatch options after --\n", who);
                    return 2;
                }
                sbatch_args[nsbatch++] = argv[i];
            }
            break;
        }
        if (strcmp(a, "--allow-os") == 0) lo.allow_os = true;
        else if (!submit && strcmp(a, "--dry-run") == 0) dry = true;
        else if (!submit && strcmp(a, "--no-tables") == 0) no_tables = true;
        else if (submit && strcmp(a, "--slurm") == 0) slurm = true;
        else if (submit && strcmp(a, "--print") == 0) print = true;
        else if (strcmp(a, "--verbose") == 0) lo.verbose = true;
        else if (submit && strcmp(a, "--partition") == 0 && i + 1 < argc && argv[i + 1][0]) partition = argv[++i];
        else if ((strcmp(a, "--max-trials") == 0 || strcmp(a, "--max-lua-instructions") == 0 ||
                  (submit && (strcmp(a, "--gpus-per-trial") == 0 || strcmp(a, "--cpus-per-trial") == 0 ||
                              strcmp(a, "--max-parallel") == 0))) && i + 1 < argc) {
            long long n = 0;
            bool zero_ok = strcmp(a, "--gpus-per-trial") == 0;
            if (!parse_long(argv[++i], &n) || n < (zero_ok ? 0 : 1) || n > 1000000000) {
                fprintf(stderr, "%s: bad value for %s: %s (expected a %s integer)\n", who, a, argv[i],
                        zero_ok ? "non-negative" : "positive");
                return 2;
            }
            if (strcmp(a, "--max-trials") == 0) max_trials = n;
            else if (strcmp(a, "--gpus-per-trial") == 0) gpus = n;
            else if (strcmp(a, "--cpus-per-trial") == 0) cpus = n;
            else if (strcmp(a, "--max-parallel") == 0) max_parallel = n;
            else lo.max_instructions = n;
        } else if (strcmp(a, "--max-lua-memory") == 0 && i + 1 < argc) {
            double b = 0;
            if (!parse_size(argv[++i], &b) || b < 1048576.0 || b > 1152921504606846976.0) {
                fprintf(stderr, "%s: bad value for --max-lua-memory: %s (expected a size from 1MiB, e.g. 4GiB)\n",
                        who, argv[i]);
                return 2;
            }
            lo.max_memory = (long long)b;
        } else if (!submit && strcmp(a, "--trial") == 0 && i + 1 < argc) {
            /* an index in the sweep (1..N) or a trial id (12 hex digits, or the start of one): the
             * runner tells which (runner.pick_trial) */
            trial = argv[++i];
            if (!*trial) {
                fprintf(stderr, "%s: bad value for --trial: '' (give the trial's index or id)\n", who);
                return 2;
            }
        } else if (strcmp(a, "--device") == 0 && i + 1 < argc) {
            /* the same as --set device=D (recorded with the trial's overrides, forwarded by submit) */
            static char dev_set[128][48];
            const char *v = argv[++i];
            if (gm_backend_parse_device(v, NULL, NULL) != GM_OK) {
                fprintf(stderr, "%s: bad value for --device: %s (cpu, cuda or cuda:N)\n", who, v);
                return 2;
            }
            if (nsets < 128) {
                snprintf(dev_set[nsets], sizeof dev_set[nsets], "device=%s", v);
                sets[nsets] = dev_set[nsets];
                nsets++;
            }
        } else if ((strcmp(a, "--threads") == 0 || strcmp(a, "--set") == 0) && i + 1 < argc) {
            const char *v = argv[++i];
            long long n = 0;
            if (strcmp(a, "--set") == 0) {
                if (nsets < 128) sets[nsets++] = v;
            } else if (!parse_long(v, &n) || n < 1 || n > 256) {
                fprintf(stderr, "%s: bad value for %s: %s\n", who, a, v);
                return 2;
            } else {
                lo.n_threads = (int)n;
                threads_given = true;
            }
        } else {
            fprintf(stderr, "%s: unknown option or missing value: %s%s\n", who, a,
                    submit ? " (options for sbatch itself go after --, e.g. -- --account=A --time=2:00:00)" : "");
            usage(stderr);
            return 2;
        }
    }
    if (submit && !slurm) {
        fprintf(stderr, "gemmarun submit: say which scheduler: --slurm (the only one supported), e.g.\n"
                        "  gemmarun submit %s --slurm --max-parallel 8\n", file);
        return 2;
    }
    gm_error err = {0};
    /* data parallel: under mpirun / srun with more than one process this process is one rank of
     * the trial's world (core/dist/gm_dist.h); otherwise a world of one, and MPI is not touched */
    gm_dist *dist = NULL;
    if (gm_dist_new(&dist, &err) != GM_OK) return fail(&err, 1);
    gm_lua_set_dist(dist);
    lua_State *L = NULL;
    if (gm_lua_new(&lo, &L, &err) != GM_OK) {
        int rc = fail(&err, 1);
        gm_lua_set_dist(NULL);
        if (gm_dist_world_size(dist) > 1) gm_dist_abort(dist, rc, "could not start (above); stopping every rank");
        gm_dist_free(dist);
        return rc;
    }
    /* Ctrl-C, and the SIGTERM a scheduler sends (scancel, a time limit's --signal): the trial
     * saves a checkpoint at the end of its step and the run stops (runner.lua) */
    signal(SIGINT, on_sigint_run);
    signal(SIGTERM, on_sigint_run);
    gm_status s;
    int base = lua_gettop(L);
    lua_pushstring(L, command_line);
    lua_setglobal(L, "GM_COMMAND_LINE");
    if (file) {
        lua_pushstring(L, file);
        lua_setglobal(L, "GM_EXPERIMENT_FILE");
        s = gm_lua_run_file(L, file, NULL, 0, &err);
    } else {
        lua_pushlstring(L, (const char *)gm_embedded_quickstart, gm_embedded_quickstart_len);
        lua_setglobal(L, "GM_EXPERIMENT_SOURCE");
        s = gm_lua_run_experiment(L, (const char *)gm_embedded_quickstart, gm_embedded_quickstart_len,
                                  "@experiments/quickstart.lua", &err);
    }
    int rc = 0;
    bool synced = false; /* the runner returned normally: every rank passed its closing barrier */
    char why[600] = "";  /* else, what failed where the other ranks could not see it */
    if (s != GM_OK) {
        rc = fail(&err, (s == GM_ERR_IO || s == GM_ERR_INVALID) ? 2 : 1);
    } else if (lua_gettop(L) > base && lua_istable(L, base + 1)) {
        lua_getfield(L, base + 1, "_kind");
        bool is_exp = lua_isstring(L, -1) && strcmp(lua_tostring(L, -1), "experiment") == 0;
        lua_pop(L, 1);
        if (is_exp && submit) {
            /* slurm.submit(experiment, {set, slurm options, spawn, ...}) -> exit code */
            lua_settop(L, base + 1);
            lua_getglobal(L, "gm_module");
            lua_pushstring(L, "slurm");
            lua_call(L, 1, 1);
            lua_getfield(L, -1, "submit");
            lua_remove(L, -2);
            lua_pushvalue(L, base + 1);
            lua_createtable(L, 0, 16);
            set_overrides(L, sets, nsets);
            if (max_trials > 0) {
                lua_pushinteger(L, max_trials);
                lua_setfield(L, -2, "max_trials");
            }
            if (partition) {
                lua_pushstring(L, partition);
                lua_setfield(L, -2, "partition");
            }
            lua_pushinteger(L, gpus);
            lua_setfield(L, -2, "gpus_per_trial");
            if (cpus > 0) {
                lua_pushinteger(L, cpus);
                lua_setfield(L, -2, "cpus_per_trial");
            }
            if (max_parallel > 0) {
                lua_pushinteger(L, max_parallel);
                lua_setfield(L, -2, "max_parallel");
            }
            if (threads_given) {
                lua_pushinteger(L, lo.n_threads);
                lua_setfield(L, -2, "threads");
            }
            lua_pushboolean(L, print);
            lua_setfield(L, -2, "print");
            lua_pushboolean(L, lo.allow_os);
            lua_setfield(L, -2, "allow_os");
            lua_createtable(L, nsbatch, 0);
            for (int i = 0; i < nsbatch; i++) {
                lua_pushstring(L, sbatch_args[i]);
                lua_rawseti(L, -2, i + 1);
            }
            lua_setfield(L, -2, "sbatch_args");
            /* the paths the jobs run with: this program and the file, absolute (the jobs may
             * start in another folder); running sbatch is given to this call only, never to
             * experiment files (lua/bind_proc.c) */
            char exe[PATH_MAX], abs_file[PATH_MAX], cwd[PATH_MAX];
            ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
            exe[n > 0 ? n : 0] = '\0';
            lua_pushstring(L, exe);
            lua_setfield(L, -2, "exe");
            lua_pushstring(L, realpath(file, abs_file) ? abs_file : file);
            lua_setfield(L, -2, "file");
            lua_pushstring(L, getcwd(cwd, sizeof cwd) ? cwd : ".");
            lua_setfield(L, -2, "cwd");
            lua_pushcfunction(L, gm_lua_spawn);
            lua_setfield(L, -2, "spawn");
            s = gm_lua_call(L, 2, 1, &err);
            if (s != GM_OK) rc = fail(&err, s == GM_ERR_INVALID ? 2 : 1);
            else rc = (int)lua_tointeger(L, -1);
        } else if (is_exp) {
            /* runner.run(experiment, {dry_run, trial, set}) -> exit code, stop the other ranks */
            lua_settop(L, base + 1);
            push_runner_fn(L, "run");
            lua_pushvalue(L, base + 1);
            lua_createtable(L, 0, 4);
            lua_pushboolean(L, dry);
            lua_setfield(L, -2, "dry_run");
            lua_pushboolean(L, no_tables);
            lua_setfield(L, -2, "no_render");
            if (trial) {
                lua_pushstring(L, trial);
                lua_setfield(L, -2, "trial");
            }
            set_overrides(L, sets, nsets);
            if (max_trials > 0) {
                lua_pushinteger(L, max_trials);
                lua_setfield(L, -2, "max_trials");
            }
            s = gm_lua_call(L, 2, 2, &err);
            if (s != GM_OK) {
                rc = fail(&err, s == GM_ERR_INVALID ? 2 : 1);
            } else {
                rc = (int)lua_tointeger(L, -2);
                synced = !lua_isstring(L, -1);
                if (!synced) snprintf(why, sizeof why, "%s", lua_tostring(L, -1));
            }
        } else {
            fprintf(stderr, "gemmarun: %s returns a table that is not an experiment: an experiment file ends with "
                            "`return experiment{...}`\n", file ? file : "experiments/quickstart.lua");
            rc = 2;
        }
    } else {
        /* not an experiment: a plain Lua script (the API of docs/experiments.md) is fine, but a
         * file that builds experiment{...} and forgets to return it, or returns something else,
         * is a mistake that would otherwise end silently with nothing run */
        const char *name = file ? file : "experiments/quickstart.lua";
        lua_getglobal(L, "GM_EXPERIMENT_BUILT");
        bool built = lua_toboolean(L, -1);
        lua_pop(L, 1);
        int t = lua_gettop(L) > base ? lua_type(L, base + 1) : LUA_TNIL;
        if (t != LUA_TNIL) {
            fprintf(stderr, "gemmarun: %s returns a %s, not an experiment: an experiment file ends with "
                            "`return experiment{...}`\n", name, t == LUA_TTABLE ? "table" : lua_typename(L, t));
            rc = 2;
        } else if (built) {
            fprintf(stderr, "gemmarun: %s builds experiment{...} but does not return it: write "
                            "`return experiment{...}`\n", name);
            rc = 2;
        } else if (submit || dry || trial || nsets || no_tables) {
            fprintf(stderr, "gemmarun: %s: %s need%s an experiment file that returns experiment{...}; this one "
                            "returns nothing (it ran as a Lua script)\n", name,
                    submit ? "submit" : "--dry-run, --trial, --set and --no-tables", submit ? "s" : "");
            rc = 2;
        }
    }
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    gm_lua_close(L);
    gm_lua_set_dist(NULL);
    if (rc != 0 && !synced && gm_dist_world_size(dist) > 1) {
        /* this rank stopped outside the runner's course (an error escaped it, or it failed
         * where the others could not see it): they may be waiting in a collective it will never
         * join: stop them all (MPI_Abort) rather than leave them blocked; the exit code is this
         * rank's */
        char msg[800];
        snprintf(msg, sizeof msg, "%s%sended with exit code %d; stopping every rank of the run (MPI_Abort)", why,
                 why[0] ? "; " : "", rc);
        gm_dist_abort(dist, rc, msg);
    }
    gm_dist_free(dist);
    return rc;
}

/* `gemmarun reproduce RESULTS [--trial ID] [--threads N] [--set k=v ...] [--allow-os]`: finds the
 * stored trial (runner.find_trial), evaluates its stored experiment text in the sandbox as an
 * experiment file, and lets runner.reproduce rerun and compare it. */
static int cmd_reproduce(int argc, char **argv) {
    gm_lua_opts lo = {.allow_os = false, .n_threads = 2};
    const char *results = NULL, *trial = NULL, *sets[128];
    int nsets = 0;
    long long threads = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--allow-os") == 0) lo.allow_os = true;
        else if (strcmp(a, "--verbose") == 0) lo.verbose = true;
        else if (strcmp(a, "--trial") == 0 && i + 1 < argc) trial = argv[++i];
        else if (strcmp(a, "--set") == 0 && i + 1 < argc) {
            if (nsets < 128) sets[nsets++] = argv[++i];
        } else if (strcmp(a, "--threads") == 0 && i + 1 < argc) {
            if (!parse_long(argv[++i], &threads) || threads < 1 || threads > 256) {
                fprintf(stderr, "gemmarun reproduce: bad value for --threads: %s\n", argv[i]);
                return 2;
            }
            lo.n_threads = (int)threads;
        } else if (a[0] != '-' && !results) results = a;
        else {
            fprintf(stderr, "gemmarun reproduce: unknown option or missing value: %s\n"
                            "usage: gemmarun reproduce RESULTS [--trial ID] [--threads N] [--set key=value ...]\n", a);
            return 2;
        }
    }
    if (!results) {
        fprintf(stderr, "usage: gemmarun reproduce RESULTS [--trial ID] [--threads N] [--set key=value ...]\n"
                        "  RESULTS: a results folder (results/EXPERIMENT/) or one trial file\n");
        return 2;
    }
    gm_error err = {0};
    lua_State *L = NULL;
    if (gm_lua_new(&lo, &L, &err) != GM_OK) return fail(&err, 1);
    signal(SIGINT, on_sigint_run);
    lua_pushstring(L, command_line);
    lua_setglobal(L, "GM_COMMAND_LINE");
    int rc = 0;
    // 1. the stored trial and its experiment's text
    push_runner_fn(L, "find_trial");
    lua_pushstring(L, results);
    if (trial) lua_pushstring(L, trial);
    else lua_pushnil(L);
    gm_status s = gm_lua_call(L, 2, 3, &err);
    if (s != GM_OK) {
        rc = fail(&err, s == GM_ERR_INVALID ? 2 : 1);
        goto done;
    }
    char path[PATH_MAX], name[PATH_MAX + 1];
    snprintf(path, sizeof path, "%s", lua_tostring(L, -3));
    snprintf(name, sizeof name, "@%s", lua_tostring(L, -1));
    lua_setglobal(L, "GM_EXPERIMENT_FILE");
    lua_pushvalue(L, -1);
    lua_setglobal(L, "GM_EXPERIMENT_SOURCE");
    size_t len = 0;
    const char *src = lua_tolstring(L, -1, &len);
    // 2. the experiment, evaluated as when it ran (sandbox, limits)
    int base = lua_gettop(L);
    s = gm_lua_run_experiment(L, src, len, name, &err);
    if (s != GM_OK) {
        rc = fail(&err, (s == GM_ERR_IO || s == GM_ERR_INVALID) ? 2 : 1);
        goto done;
    }
    if (lua_gettop(L) <= base || !lua_istable(L, base + 1)) {
        fprintf(stderr, "gemmarun reproduce: %s: the stored experiment text does not return an experiment\n", path);
        rc = 2;
        goto done;
    }
    // 3. rerun and compare: runner.reproduce(experiment, {path, set, threads}) -> exit code
    lua_settop(L, base + 1);
    push_runner_fn(L, "reproduce");
    lua_pushvalue(L, base + 1);
    lua_createtable(L, 0, 3);
    lua_pushstring(L, path);
    lua_setfield(L, -2, "path");
    set_overrides(L, sets, nsets);
    if (threads > 0) {
        lua_pushinteger(L, threads);
        lua_setfield(L, -2, "threads");
    }
    s = gm_lua_call(L, 2, 1, &err);
    if (s != GM_OK) rc = fail(&err, s == GM_ERR_INVALID ? 2 : 1);
    else rc = (int)lua_tointeger(L, -1);
done:
    signal(SIGINT, SIG_DFL);
    gm_lua_close(L);
    return rc;
}

#define EXPORT_USAGE "usage: gemmarun export RESULTS [--trial ID | --best] [--format peft|gguf|merged] [--dtype T] [--base MODEL]\n" \
                     "                       [--threads N] OUT\n" \
                     "  RESULTS: a results folder (results/EXPERIMENT/) or one trial file; --best: the report's best trial\n" \
                     "  OUT: --format peft (the default): a PEFT adapter folder; --format gguf: a llama.cpp LoRA adapter,\n" \
                     "       OUT.gguf; --format merged: the base with the adapter merged in, as a Hugging Face folder\n" \
                     "       (--dtype bf16 (default), f32) or, OUT.gguf, a GGUF file (--dtype f16 (default), f32, bf16, q8_0)\n"

/* `gemmarun export RESULTS [--trial ID | --best] [--format peft|gguf|merged] [--dtype T] [--base MODEL] [--threads N] OUT`:
 * runner.export writes the trial's adapter (a PEFT adapter folder or a llama.cpp GGUF file) or the
 * base with it merged in (a Hugging Face folder or a GGUF file). */
static int cmd_export(int argc, char **argv) {
    gm_lua_opts lo = {.allow_os = false, .n_threads = 2};
    const char *results = NULL, *out = NULL, *trial = NULL, *format = NULL, *base = NULL, *dtype = NULL;
    bool best = false;
    long long threads = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--best") == 0) best = true;
        else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(EXPORT_USAGE, stdout);
            return 0;
        } else if (strcmp(a, "--verbose") == 0) lo.verbose = true;
        else if (strcmp(a, "--trial") == 0 && i + 1 < argc) trial = argv[++i];
        else if (strcmp(a, "--format") == 0 && i + 1 < argc) format = argv[++i];
        else if (strcmp(a, "--base") == 0 && i + 1 < argc) base = argv[++i];
        else if (strcmp(a, "--dtype") == 0 && i + 1 < argc) dtype = argv[++i];
        else if (strcmp(a, "--threads") == 0 && i + 1 < argc) {
            if (!parse_long(argv[++i], &threads) || threads < 1 || threads > 256) {
                fprintf(stderr, "gemmarun export: bad value for --threads: %s\n", argv[i]);
                return 2;
            }
            lo.n_threads = (int)threads;
        } else if (a[0] != '-' && !results) results = a;
        else if (a[0] != '-' && !out) out = a;
        else {
            fprintf(stderr, "gemmarun export: unknown option, extra argument or missing value: %s\n" EXPORT_USAGE, a);
            return 2;
        }
    }
    if (!results || !out) {
        fprintf(stderr, "gemmarun export: %s\n" EXPORT_USAGE, !results ? "give the results to export from" : "give the folder to write (OUT)");
        return 2;
    }
    /* OUT/ as a shell completes a folder name: the folder OUT (its OUT.partial is made beside it) */
    char out_buf[4096];
    size_t out_len = strlen(out);
    if (out_len >= sizeof out_buf) {
        fprintf(stderr, "gemmarun export: OUT is longer than %zu bytes\n", sizeof out_buf - 1);
        return 2;
    }
    memcpy(out_buf, out, out_len + 1);
    while (out_len > 1 && out_buf[out_len - 1] == '/') out_buf[--out_len] = '\0';
    out = out_buf;
    gm_error err = {0};
    lua_State *L = NULL;
    if (gm_lua_new(&lo, &L, &err) != GM_OK) return fail(&err, 1);
    gm_lua_allow_export_path(L, out); /* the one path outside results/ the export may write */
    push_runner_fn(L, "export");
    lua_createtable(L, 0, 7);
    const char *keys[] = {"results", "out", "trial", "format", "base", "dtype"}, *vals[] = {results, out, trial, format, base, dtype};
    for (int k = 0; k < 6; k++) {
        if (!vals[k]) continue;
        lua_pushstring(L, vals[k]);
        lua_setfield(L, -2, keys[k]);
    }
    lua_pushboolean(L, best);
    lua_setfield(L, -2, "best");
    if (threads > 0) {
        lua_pushinteger(L, threads);
        lua_setfield(L, -2, "threads");
    }
    gm_status s = gm_lua_call(L, 1, 1, &err);
    int rc = s != GM_OK ? fail(&err, s == GM_ERR_INVALID ? 2 : 1) : (int)lua_tointeger(L, -1);
    gm_lua_close(L);
    return rc;
}

int main(int argc, char **argv) {
    gm_kernels_startup(argv); /* OpenMP waits spin briefly then sleep, OpenBLAS on its AVX kernels: kernels/kernels.h */
    record_command_line(argc, argv);
    /* Large buffers (arenas, checkpoint and results images) get their own mappings and go back
     * to the system when freed. Left alone, glibc raises its mmap threshold after the first such
     * free and serves the next ones from the heap, which then keeps them: each checkpoint save
     * could add its size to the peak, off the memory plan (docs/memory.md). A fixed threshold
     * also turns that adjustment off. 64 KiB, not more: an audio batch's decoding (our buffers,
     * libsndfile's and libsamplerate's converter, 64 KiB to 1 MiB each) left the heap 1.5 MiB
     * larger after every step at a 1 MiB threshold (measured with mallinfo2 on the tiny Gemma 3n
     * audio trial: the heap's free bytes grew by each batch's decoding; at 64 KiB it stays flat). */
    mallopt(M_MMAP_THRESHOLD, 1 << 16);
    if (argc < 2) return run_lua(NULL, 0, NULL, false);
    const char *cmd = argv[1];
    /* `gemmarun --dry-run`, `gemmarun --trial 2`, ...: the embedded default with options */
    if (cmd[0] == '-' && cmd[1] == '-' && strcmp(cmd, "--help") != 0 && strcmp(cmd, "--version") != 0)
        return run_lua(NULL, argc - 1, argv + 1, false);
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("gemmarun %s (git %s)\nBLAS: %s\nbf16 GEMMs on this CPU: %s; compute = \"auto\" trains in %s\n", GM_VERSION,
               gm_git_commit, gm_blas_info(), gm_k_cpu_bf16_native() ? "native (oneDNN)" : "no",
               gm_compute_effective(GM_COMPUTE_AUTO, "cpu"));
        return 0;
    }
    if (strcmp(cmd, "inspect") == 0) return cmd_inspect(argc - 2, argv + 2);
    if (strcmp(cmd, "generate") == 0) return cmd_generate(argc - 2, argv + 2);
    if (strcmp(cmd, "fetch") == 0) return cmd_fetch(argc - 2, argv + 2);
    if (strcmp(cmd, "plan") == 0) return cmd_plan(argc - 2, argv + 2);
    if (strcmp(cmd, "options") == 0) return cmd_options(argc - 2, argv + 2);
    if (strcmp(cmd, "table") == 0) return cmd_table(argc - 2, argv + 2);
    if (strcmp(cmd, "reproduce") == 0) return cmd_reproduce(argc - 2, argv + 2);
    if (strcmp(cmd, "export") == 0) return cmd_export(argc - 2, argv + 2);
    if (strcmp(cmd, "submit") == 0) {
        size_t k = argc > 2 ? strlen(argv[2]) : 0;
        if (k < 5 || strcmp(argv[2] + k - 4, ".lua") != 0) {
            fprintf(stderr, "usage: gemmarun submit EXPERIMENT.lua --slurm [--partition P] [--cpus-per-trial N]\n"
                            "         [--gpus-per-trial N] [--max-parallel K] [--print] [--set key=value ...] [-- SBATCH OPTIONS]\n");
            return 2;
        }
        return run_lua(argv[2], argc - 3, argv + 3, true);
    }
    size_t n = strlen(cmd);
    if (n > 4 && strcmp(cmd + n - 4, ".lua") == 0) return run_lua(cmd, argc - 2, argv + 2, false);
    fprintf(stderr, "gemmarun: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}

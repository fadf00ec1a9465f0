/*
 * gm_data.c - chat examples, collation, and the fortunes reader.
 */
#include "gm_data.h"

#include "gm_alloc.h"
#include "gm_fetch.h" /* gm_sha256_file */
#include "gm_audio.h"
#include "gm_config.h"
#include "gm_image.h"
#include "gm_mmap.h"

#include <ctype.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>

void gm_dataset_init(gm_dataset *ds) { memset(ds, 0, sizeof *ds); }

static void free_images(gm_example *e) {
    for (int64_t i = 0; i < e->n_images; i++) {
        if (e->images) gm_free(e->images[i]);
        if (e->image_sha) gm_free(e->image_sha[i]);
    }
    gm_free(e->images);
    gm_free(e->image_sha);
    gm_free(e->crops);
    gm_free(e->image_tokens);
    for (int64_t i = 0; i < e->n_audio; i++) {
        if (e->audio) gm_free(e->audio[i]);
        if (e->audio_sha) gm_free(e->audio_sha[i]);
    }
    gm_free(e->audio);
    gm_free(e->audio_sha);
}

gm_mm_spec gm_mm_spec_image(const gm_config *c) {
    const gm_vision_config *v = &c->vision;
    gm_mm_spec s = {.boi_id = v->boi_id, .eoi_id = v->eoi_id, .image_token_id = v->image_token_id, .tokens = v->tokens,
                    .image = gm_mm_image_opts(c)};
    if (c->arch == GM_ARCH_GEMMA4) { /* Gemma4Processor: boi + n x image_token + eoi, nothing around */
        s.boi_text = "<|image>", s.close_text = "<image|>", s.soft_text = "<|image|>";
        s.bare = true;
    }
    return s;
}

gm_image_opts gm_mm_image_opts(const gm_config *c) {
    const gm_vision_config *v = &c->vision;
    gm_image_opts o = gm_image_opts_gemma3(v->image_size);
    if (c->arch == GM_ARCH_GEMMA4) { /* Gemma4ImageProcessor: rescale only; 2 (x - 0.5) is ours (see gm_vision.h) */
        o.filter = GM_IMAGE_BICUBIC;
        o.max_patches = v->max_soft_tokens * v->pool * v->pool, o.patch = v->patch_size, o.pool = v->pool;
    }
    return o;
}

int64_t gm_mm_image_floats(const gm_config *c) {
    const gm_vision_config *v = &c->vision;
    if (c->arch == GM_ARCH_GEMMA4) return 3 * v->max_soft_tokens * v->pool * v->pool * v->patch_size * v->patch_size;
    return 3 * v->image_size * v->image_size;
}

gm_status gm_mm_image_tokens(const gm_config *c, int64_t w, int64_t h, int64_t *tokens, gm_error *err) {
    const gm_vision_config *v = &c->vision;
    if (c->arch != GM_ARCH_GEMMA4) {
        *tokens = v->tokens;
        return GM_OK;
    }
    int64_t tw = 0, th = 0;
    GM_TRY(gm_image_aspect_size(w, h, v->patch_size, v->max_soft_tokens * v->pool * v->pool, v->pool, &tw, &th, err));
    if (tw / v->patch_size > v->pos_table || th / v->patch_size > v->pos_table)
        return gm_error_set(err, GM_ERR_INVALID, "a %lld x %lld image resizes to %lld x %lld patches, more than the %lld rows "
                            "of each axis of the model's position table (vision_config position_embedding_size)\n  hint: crop "
                            "it nearer to square", (long long)w, (long long)h, (long long)(tw / v->patch_size),
                            (long long)(th / v->patch_size), (long long)v->pos_table);
    *tokens = (tw / (v->patch_size * v->pool)) * (th / (v->patch_size * v->pool));
    return GM_OK;
}

gm_mm_spec gm_mm_spec_audio(const gm_config *c) {
    gm_mm_spec s = {.boi_id = c->audio.boa_id, .eoi_id = c->audio.eoa_id, .image_token_id = c->audio.audio_token_id,
                    .tokens = c->audio.soft_tokens, .open_text = "<start_of_audio>", .close_text = "<end_of_audio>",
                    .soft_text = "<audio_soft_token>", .what = "audio clip"};
    if (c->arch == GM_ARCH_GEMMA4) { /* Gemma4Processor.replace_audio_token: boa + n x audio_token + eoa, bare;
                                        n is each clip's own (the caller's tokens) */
        s.boi_text = "<|audio>", s.close_text = "<audio|>", s.soft_text = "<|audio|>";
        s.bare = true;
    }
    return s;
}

/* The spec's texts, image defaults filled in. */
static const char *open_of(const gm_mm_spec *m) { return m->open_text ? m->open_text : "<start_of_image>"; }
static const char *close_of(const gm_mm_spec *m) { return m->close_text ? m->close_text : "<end_of_image>"; }
static const char *soft_of(const gm_mm_spec *m) { return m->soft_text ? m->soft_text : "<image_soft_token>"; }
static const char *what_of(const gm_mm_spec *m) { return m->what ? m->what : "image"; }

int64_t gm_example_views(const gm_example *e) {
    int64_t n = e->n_images;
    for (int64_t i = 0; e->crops && i < e->n_images; i++) n += e->crops[i];
    return n;
}

void gm_dataset_free(gm_dataset *ds) {
    if (!ds) return;
    for (int64_t i = 0; i < ds->n; i++) gm_free(ds->ex[i].ids), gm_free(ds->ex[i].turns), free_images(&ds->ex[i]);
    gm_free(ds->ex);
    memset(ds, 0, sizeof *ds);
}

/* The conversation's ids with each image expanded (see gm_dataset_add_chat_images). */
/* Soft tokens of soft-token run `view` (0-based) of an example: its image's (tokens), or the spec's. */
static int64_t image_of_view(int64_t view, const int64_t *crops, int64_t n_images);
static int64_t view_tokens(const gm_mm_spec *mm, const int64_t *tokens, const int64_t *crops, int64_t n_images, int64_t view) {
    return tokens ? tokens[image_of_view(view, crops, n_images)] : mm->tokens;
}

gm_status gm_mm_encode_text(const gm_tokenizer *tok, const char *text, const gm_mm_spec *mm, int64_t n_images,
                            const int64_t *crops, const int64_t *tokens, int64_t ex_index, int32_t **ids_out, int64_t *n_out,
                            gm_error *err) {
    size_t len = strlen(text);
    /* "<start_of_image>" -> "\n\n<start_of_image><end_of_image>\n\n"; the soft tokens are put
     * between the two as ids below (special tokens split the text, so the tokens around them are
     * what Hugging Face's processor gets from its expanded string). An image with pan & scan
     * crops: Gemma3Processor.replace_image_token's sentence around its block and its crops'.
     * Audio (Gemma3nProcessor): "\n\n<start_of_audio><end_of_audio>\n\n" the same way. */
    const char *open = open_of(mm), *close = close_of(mm), *what = what_of(mm);
    const char *boi = mm->boi_text ? mm->boi_text : open;
    char rep[96];
    snprintf(rep, sizeof rep, mm->bare ? "%s%s" : "\n\n%s%s\n\n", boi, close);
    size_t rep_len = strlen(rep), open_len = strlen(open);
    static const char pas_head[] = "Here is the original image ";
    static const char pas_mid[] = " and here are some crops to help you see better ";
    int64_t k = 0, views = n_images;
    for (const char *p = strstr(text, open); p; p = strstr(p + 1, open)) k++;
    if (k != n_images)
        return gm_error_set(err, GM_ERR_INVALID, "example %lld: %lld %s placeholders (%s) but %lld %ss", (long long)ex_index,
                            (long long)k, what, open, (long long)n_images, what);
    for (int64_t i = 0; crops && i < n_images; i++) {
        if (crops[i] < 0 || crops[i] > GM_IMAGE_MAX_CROPS)
            return gm_error_set(err, GM_ERR_INVALID, "example %lld: image %lld has %lld pan & scan crops (0..%d)",
                                (long long)ex_index, (long long)(i + 1), (long long)crops[i], GM_IMAGE_MAX_CROPS);
        views += crops[i];
    }
    size_t cap = len + (size_t)k * (rep_len + sizeof pas_head + sizeof pas_mid) + (size_t)(views - k) * (rep_len + 1) + 1;
    char *x = gm_malloc(cap);
    if (!x) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    size_t o = 0;
#define PUT(str, n) (memcpy(x + o, (str), (n)), o += (n))
    for (int64_t i = 0;; i++) {
        const char *q = strstr(text, open);
        size_t l = q ? (size_t)(q - text) : strlen(text);
        memcpy(x + o, text, l), o += l;
        if (!q) break;
        int64_t c = crops ? crops[i] : 0;
        if (c > 0) PUT(pas_head, sizeof pas_head - 1);
        PUT(rep, rep_len);
        if (c > 0) PUT(pas_mid, sizeof pas_mid - 1);
        for (int64_t j = 0; j < c; j++) {
            if (j > 0) x[o++] = ' ';
            PUT(rep, rep_len);
        }
        text = q + open_len;
    }
#undef PUT
    x[o] = '\0';
    int32_t *ids = NULL;
    int64_t n = 0;
    gm_status s = gm_tokenizer_encode_alloc(tok, x, o, true, true, &ids, &n, err);
    gm_free(x);
    GM_TRY(s);
    int64_t nb = 0, ne = 0, ni = 0;
    for (int64_t i = 0; i < n; i++) nb += ids[i] == mm->boi_id, ne += ids[i] == mm->eoi_id, ni += ids[i] == mm->image_token_id;
    if (ni > 0) { /* only the media fill soft tokens: a typed one would take their place */
        gm_free(ids);
        return gm_error_set(err, GM_ERR_INVALID, "example %lld: its text holds %lld %s tokens (id %d), which only %ss may "
                            "fill\n  hint: remove them from the text; an %s is an {\"type\": \"%s\"} part", (long long)ex_index,
                            (long long)ni, soft_of(mm), mm->image_token_id, what, what, mm->open_text ? "audio" : "image");
    }
    if (nb != views || ne != views) {
        gm_free(ids);
        return gm_error_set(err, GM_ERR_INVALID,
                            "example %lld: the tokenizer does not turn %s / %s into the model's ids %d / %d (found %lld / %lld "
                            "of %lld)\n  hint: the tokenizer and config.json belong to different models",
                            (long long)ex_index, mm->boi_text ? mm->boi_text : open, close, mm->boi_id, mm->eoi_id, (long long)nb, (long long)ne,
                            (long long)views);
    }
    int64_t soft = 0;
    for (int64_t v = 0; v < views; v++) soft += view_tokens(mm, tokens, crops, n_images, v);
    int32_t *out = gm_malloc((size_t)(n + soft) * sizeof *out);
    if (!out) {
        gm_free(ids);
        return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    }
    int64_t m = 0;
    for (int64_t i = 0, v = 0; i < n; i++) {
        out[m++] = ids[i];
        if (ids[i] == mm->boi_id)
            for (int64_t t = 0, nt = view_tokens(mm, tokens, crops, n_images, v++); t < nt; t++) out[m++] = mm->image_token_id;
    }
    gm_free(ids);
    *ids_out = out;
    *n_out = m;
    return GM_OK;
}

static gm_status encode_mm(const gm_tokenizer *tok, const gm_chat_msg *msgs, int64_t n_msgs, const gm_mm_spec *mm,
                           int64_t n_images, const int64_t *crops, const int64_t *tokens, int64_t ex_index, int32_t **ids_out,
                           int64_t *n_out, gm_error *err) {
    char *text = NULL;
    GM_TRY(gm_chat_render(gm_chat_format_of(tok), msgs, n_msgs, false, &text, NULL, err));
    gm_status s = gm_mm_encode_text(tok, text, mm, n_images, crops, tokens, ex_index, ids_out, n_out, err);
    gm_free(text);
    return s;
}

/* Adds an example (ids owned from here on); images / image_sha copied. */
static gm_status add_example(gm_dataset *ds, int32_t *ids, int64_t n, int64_t max_length, int32_t label,
                             const gm_tokenizer *tok, const gm_mm_spec *mm, const char *const *images,
                             const char *const *image_sha, int64_t n_images, const int64_t *crops, const int64_t *tokens,
                             bool audio, gm_error *err);

/* A conversation with media (images or audio clips, as mm says): encoded, then added. */
static gm_status add_chat_media(gm_dataset *ds, const gm_tokenizer *tok, const gm_chat_msg *msgs, int64_t n_msgs,
                                int64_t max_length, int32_t label, const gm_mm_spec *mm, const char *const *files,
                                const char *const *sha, int64_t n_files, const int64_t *crops, const int64_t *tokens,
                                bool audio, gm_error *err) {
    int32_t *ids = NULL;
    int64_t n = 0;
    gm_status s = encode_mm(tok, msgs, n_msgs, mm, n_files, crops, tokens, ds->n + ds->n_rejected, &ids, &n, err);
    if (s != GM_OK) {
        ds->n_rejected++;
        return s;
    }
    return add_example(ds, ids, n, max_length, label, tok, mm, files, sha, n_files, crops, tokens, audio, err);
}

gm_status gm_dataset_add_chat_images(gm_dataset *ds, const gm_tokenizer *tok, const gm_chat_msg *msgs, int64_t n_msgs,
                                     int64_t max_length, int32_t label, const gm_mm_spec *mm, const char *const *images,
                                     const char *const *image_sha, int64_t n_images, const int64_t *crops,
                                     const int64_t *tokens, gm_error *err) {
    if (!mm) return gm_dataset_add_chat(ds, tok, msgs, n_msgs, max_length, label, err);
    if (crops && mm->bare)
        for (int64_t i = 0; i < n_images; i++)
            if (crops[i] > 0)
                return gm_error_set(err, GM_ERR_INVALID, "pan & scan crops are Gemma 3's processor's; Gemma 4 resizes each "
                                    "image whole\n  hint: turn pan_and_scan off");
    ds->image_opts = mm->image;
    return add_chat_media(ds, tok, msgs, n_msgs, max_length, label, mm, images, image_sha, n_images, crops, tokens, false, err);
}

gm_status gm_dataset_add_chat_audio(gm_dataset *ds, const gm_tokenizer *tok, const gm_chat_msg *msgs, int64_t n_msgs,
                                    int64_t max_length, int32_t label, const gm_mm_spec *mm, const char *const *audio,
                                    const char *const *audio_sha, int64_t n_audio, const int64_t *tokens, gm_error *err) {
    return add_chat_media(ds, tok, msgs, n_msgs, max_length, label, mm, audio, audio_sha, n_audio, NULL, tokens, true, err);
}

int64_t gm_dataset_max_audio(const gm_dataset *ds) {
    int64_t m = 0;
    for (int64_t i = 0; i < ds->n; i++) m = ds->ex[i].n_audio > m ? ds->ex[i].n_audio : m;
    return m;
}

gm_status gm_dataset_add_chat(gm_dataset *ds, const gm_tokenizer *tok, const gm_chat_msg *msgs, int64_t n_msgs,
                              int64_t max_length, int32_t label, gm_error *err) {
    int32_t *ids = NULL;
    int64_t n = 0;
    gm_status s = gm_chat_encode(tok, msgs, n_msgs, false, &ids, &n, err);
    if (s != GM_OK) {
        ds->n_rejected++;
        return s;
    }
    return add_example(ds, ids, n, max_length, label, tok, NULL, NULL, NULL, 0, NULL, NULL, false, err);
}

/* The image (0-based) whose image or crop is soft-token run `view` (0-based) of an example. */
static int64_t image_of_view(int64_t view, const int64_t *crops, int64_t n_images) {
    for (int64_t i = 0; i < n_images; i++) {
        int64_t runs = 1 + (crops ? crops[i] : 0);
        if (view < runs) return i;
        view -= runs;
    }
    return n_images - 1;
}

static gm_status add_example(gm_dataset *ds, int32_t *ids, int64_t n, int64_t max_length, int32_t label,
                             const gm_tokenizer *tok, const gm_mm_spec *mm, const char *const *images,
                             const char *const *image_sha, int64_t n_images, const int64_t *crops, const int64_t *tokens,
                             bool audio, gm_error *err) {
    gm_status s;
    int64_t start = 0;
    s = gm_chat_response_start(tok, ids, n, &start, err);
    if (s != GM_OK) {
        gm_free(ids);
        ds->n_rejected++;
        return s;
    }
    if (start >= n) {
        gm_free(ids);
        ds->n_rejected++;
        return gm_error_set(err, GM_ERR_INVALID, "example %lld: the model turn is empty", (long long)ds->n + ds->n_rejected - 1);
    }
    /* never cut into an image: the cut must not fall between an image's <start_of_image> and its
     * <end_of_image> (checked before the prompt's length: it names the image) */
    for (int64_t i = 0, k = 0; mm && n > max_length && i < n; i++) {
        if (ids[i] != mm->boi_id) continue;
        k++;
        int64_t end = i + view_tokens(mm, tokens, crops, n_images, k - 1) + 1; /* its <end_of_image> */
        if (i < max_length && end >= max_length) {
            gm_free(ids);
            ds->n_rejected++;
            int64_t img = image_of_view(k - 1, crops, n_images);
            return gm_error_set(err, GM_ERR_INVALID,
                                "example %lld: max_length = %lld cuts into %s %lld (%s%s), whose tokens span positions "
                                "%lld..%lld (its prompt: %lld tokens)\n  hint: raise max_length to at least %lld, or shorten the text",
                                (long long)(ds->n + ds->n_rejected - 1), (long long)max_length, what_of(mm), (long long)(img + 1), images[img],
                                crops && crops[img] > 0 ? ", with its pan & scan crops" : "", (long long)i, (long long)end,
                                (long long)start, (long long)((end > start ? end : start) + 2)); /* the media and a response */
        }
    }
    if (start >= max_length) {
        gm_free(ids);
        ds->n_rejected++;
        return gm_error_set(err, GM_ERR_INVALID,
                            "example %lld: the prompt takes %lld tokens, so max_length = %lld leaves no room for the response",
                            (long long)(ds->n + ds->n_rejected - 1), (long long)start, (long long)max_length);
    }
    if (n > max_length) {
        n = max_length;
        ds->n_truncated++;
    }
    if (ds->n == ds->cap) {
        int64_t cap = ds->cap ? 2 * ds->cap : 64;
        gm_example *ex = gm_realloc(ds->ex, (size_t)cap * sizeof *ex);
        if (!ex) {
            gm_free(ids);
            return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
        }
        ds->ex = ex;
        ds->cap = cap;
    }
    gm_example e = {.ids = ids, .n = n, .response_start = start, .label = label};
    s = gm_chat_earlier_model_turns(tok, ids, n, &e.turns, &e.n_turns, err);
    if (s != GM_OK) {
        gm_free(ids);
        return s;
    }
    if (n_images > 0) {
        /* audio clips are kept as images are, in their own lists */
        char ***files = audio ? &e.audio : &e.images, ***shas = audio ? &e.audio_sha : &e.image_sha;
        *files = gm_calloc((size_t)n_images, sizeof **files);
        *shas = gm_calloc((size_t)n_images, sizeof **shas);
        e.crops = crops ? gm_malloc((size_t)n_images * sizeof *e.crops) : NULL;
        e.image_tokens = tokens ? gm_malloc((size_t)n_images * sizeof *e.image_tokens) : NULL;
        bool ok = *files && *shas && (!crops || e.crops) && (!tokens || e.image_tokens);
        *(audio ? &e.n_audio : &e.n_images) = ok ? n_images : 0;
        if (ok && crops) memcpy(e.crops, crops, (size_t)n_images * sizeof *e.crops);
        if (ok && tokens) memcpy(e.image_tokens, tokens, (size_t)n_images * sizeof *e.image_tokens);
        for (int64_t i = 0; ok && i < n_images; i++) {
            (*files)[i] = gm_strdup(images[i]);
            (*shas)[i] = gm_strdup(image_sha && image_sha[i] ? image_sha[i] : "");
            ok = (*files)[i] && (*shas)[i];
        }
        if (!ok) {
            free_images(&e);
            gm_free(ids), gm_free(e.turns);
            return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
        }
    }
    ds->ex[ds->n++] = e;
    return GM_OK;
}

gm_status gm_batch_audio(const gm_dataset *ds, const int64_t *idx, int64_t B, const gm_audio_fe *fe, double max_seconds,
                         int64_t max_clips, int64_t max_frames, float *features, uint8_t *valid, int64_t *n_clips,
                         int64_t *frames, gm_error *err) {
    *n_clips = 0, *frames = 0;
    int64_t n = 0;
    for (int64_t b = 0; b < B; b++) n += ds->ex[idx[b]].n_audio;
    if (n == 0) return GM_OK;
#ifndef GM_HAVE_AUDIO
    (void)fe, (void)max_seconds, (void)max_clips, (void)max_frames, (void)features, (void)valid;
    return gm_error_set(err, GM_ERR_UNSUPPORTED, "this gemmarun was built without audio (cmake -DGM_AUDIO=OFF)");
#else
    if (n > max_clips)
        return gm_error_set(err, GM_ERR_INVALID, "a batch holds %lld audio clips, more than %lld (the plan's limit)", (long long)n,
                            (long long)max_clips);
    gm_audio *clips = gm_calloc((size_t)n, sizeof *clips);
    const float **ptr = gm_calloc((size_t)n, sizeof *ptr);
    int64_t *lens = gm_calloc((size_t)n, sizeof *lens);
    const char **names = gm_calloc((size_t)n, sizeof *names);
    gm_status s = clips && ptr && lens && names ? GM_OK : gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    gm_audio_limits lim = {max_seconds, 0};
    int64_t k = 0;
    for (int64_t b = 0; b < B && s == GM_OK; b++) {
        const gm_example *e = &ds->ex[idx[b]];
        for (int64_t i = 0; i < e->n_audio && s == GM_OK; i++, k++) {
            names[k] = e->audio[i];
            int64_t same = -1; /* a clip repeated in the batch (label scoring) is decoded once */
            for (int64_t j = 0; j < k && same < 0; j++)
                if (strcmp(names[j], names[k]) == 0) same = j;
            if (same < 0) s = gm_audio_load(names[k], &lim, &clips[k], err);
            ptr[k] = same < 0 ? clips[k].samples : ptr[same];
            lens[k] = same < 0 ? clips[k].n : lens[same];
        }
    }
    gm_audio_features f = {0};
    if (s == GM_OK) s = gm_audio_features_compute(fe, ptr, lens, n, &f, err);
    if (s == GM_OK && (f.T < 1 || f.T > max_frames))
        s = gm_error_set(err, GM_ERR_INVALID, "the batch's audio gives %lld feature frames; the plan holds %lld (a file changed "
                         "since the data set was built? its first clip: %s)", (long long)f.T, (long long)max_frames, names[0]);
    if (s == GM_OK) {
        memcpy(features, f.data, (size_t)(n * f.T * f.n_mels) * sizeof(float));
        memcpy(valid, f.mask, (size_t)(n * f.T));
        *n_clips = n, *frames = f.T;
    }
    gm_audio_features_free(&f);
    for (int64_t j = 0; clips && j < n; j++) gm_audio_free(&clips[j]);
    gm_free(clips), gm_free(ptr), gm_free(lens), gm_free(names);
    return s;
#endif
}

size_t gm_dataset_table_resident(const gm_dataset *const *ds, int n, int64_t rows, size_t row_bytes) {
    const size_t BLOCK = 64 << 10;
    if (rows < 1 || row_bytes == 0) return 0;
    size_t n_blocks = ((size_t)rows * row_bytes + BLOCK - 1) / BLOCK;
    uint8_t *used = gm_calloc(n_blocks, 1);
    if (!used) return 0;
    size_t count = 0;
    for (int d = 0; d < n; d++)
        for (int64_t i = 0; ds[d] && i < ds[d]->n; i++) {
            const gm_example *e = &ds[d]->ex[i];
            for (int64_t t = -1; t < e->n; t++) {
                int64_t id = t < 0 ? 0 : e->ids[t]; /* row 0: ids past the table, soft tokens */
                if (id < 0 || id >= rows) id = 0;
                size_t b0 = (size_t)id * row_bytes / BLOCK, b1 = ((size_t)id * row_bytes + row_bytes - 1) / BLOCK;
                for (size_t b = b0; b <= b1; b++)
                    if (!used[b]) used[b] = 1, count++;
            }
        }
    gm_free(used);
    size_t total = (size_t)rows * row_bytes, bytes = count * BLOCK;
    return bytes < total ? bytes : total;
}

int64_t gm_dataset_max_images(const gm_dataset *ds) {
    int64_t m = 0;
    for (int64_t i = 0; i < ds->n; i++) m = gm_example_views(&ds->ex[i]) > m ? gm_example_views(&ds->ex[i]) : m;
    return m;
}

gm_status gm_batch_images(const gm_dataset *ds, const int64_t *idx, int64_t B, int64_t S, int64_t max_images,
                          float *pixels, int64_t *hw, int64_t *n_images, gm_error *err) {
    *n_images = 0;
    gm_image_opts o = ds->image_opts, o_pas;
    bool aspect = o.max_patches > 0;
    if (!aspect) {
        gm_image_filter f = o.filter;
        o = gm_image_opts_gemma3(S);
        o.filter = f;
    } else if (!hw) {
        return gm_error_set(err, GM_ERR_INVALID, "images of their own sizes (Gemma 4) need the sizes' buffer");
    }
    o_pas = o;
    o_pas.pan_and_scan = true;
    /* where each view starts in pixels (views are packed: each its own size) */
    int64_t *off = gm_malloc((size_t)(max_images + 1) * sizeof *off);
    if (!off) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    off[0] = 0;
    /* the last decoded file: the cells of one sheet in a batch decode it once (measured on
     * OpenCV's 2000 x 1000 digits.png: docs/experiments.md, "Images") */
    char held[GM_IMAGE_PATH_MAX] = "", path[GM_IMAGE_PATH_MAX];
    gm_image file = {0};
    gm_status s = GM_OK;
    for (int64_t b = 0; b < B && s == GM_OK; b++) {
        const gm_example *e = &ds->ex[idx[b]];
        for (int64_t i = 0; i < e->n_images && s == GM_OK; i++) {
            int64_t crops = e->crops ? e->crops[i] : 0, views = 1 + crops, k0 = *n_images;
            if (k0 + views > max_images) {
                s = gm_error_set(err, GM_ERR_INVALID, "a batch holds more than %lld images (the plan's limit)", (long long)max_images);
                break;
            }
            float *dst = pixels + off[k0];
            /* a reference already preprocessed for this batch (label scoring repeats one example's
             * images once per candidate): copied with its crops, not decoded again */
            int64_t same = -1, k = 0;
            for (int64_t b2 = 0; b2 <= b && same < 0; b2++) {
                const gm_example *e2 = &ds->ex[idx[b2]];
                for (int64_t i2 = 0; i2 < e2->n_images && same < 0 && !(b2 == b && i2 == i); i2++) {
                    int64_t c2 = e2->crops ? e2->crops[i2] : 0;
                    if (c2 == crops && strcmp(e2->images[i2], e->images[i]) == 0) same = k;
                    k += 1 + c2;
                }
            }
            if (same >= 0) {
                memcpy(dst, pixels + off[same], (size_t)(off[same + views] - off[same]) * sizeof(float));
                for (int64_t v = 0; v < views; v++) {
                    off[k0 + v + 1] = off[k0 + v] + (off[same + v + 1] - off[same + v]);
                    if (hw) hw[2 * (k0 + v)] = hw[2 * (same + v)], hw[2 * (k0 + v) + 1] = hw[2 * (same + v) + 1];
                }
                *n_images += views;
                continue;
            }
            const char *ref = e->images[i];
            gm_image_rect r;
            bool has_rect = false;
            s = gm_image_ref_parse(ref, path, sizeof path, &r, &has_rect, err);
            if (s == GM_OK && strcmp(path, held) != 0) {
                gm_image_free(&file); /* one decoded file at a time: the plan counts one */
                held[0] = '\0';
                s = gm_image_load(path, NULL, &file, err);
                if (s == GM_OK) snprintf(held, sizeof held, "%s", path);
            }
            gm_image cell = {0};
            if (s == GM_OK && has_rect) s = gm_image_ref_check(ref, r, file.w, file.h, err);
            if (s == GM_OK && has_rect) s = gm_image_crop(&file, r, &cell, err);
            gm_image_pixels px = {0};
            if (s == GM_OK) {
                s = gm_image_preprocess(has_rect ? &cell : &file, crops > 0 ? &o_pas : &o, &px, err);
                if (s != GM_OK) gm_error_prefix(err, "%s", ref);
            }
            if (s == GM_OK && px.n_crops != crops) /* its tokens were made for another crop count */
                s = gm_error_set(err, GM_ERR_INVALID, "%s: pan & scan now gives %lld crops, its tokens were made for %lld "
                                 "(the file changed since the data set was built?)", ref, (long long)px.n_crops, (long long)crops);
            if (s == GM_OK && aspect && e->image_tokens) { /* its tokens were made for its grid */
                int64_t cell_px = o.patch * o.pool, tok = (px.h / cell_px) * (px.w / cell_px);
                if (tok != e->image_tokens[i])
                    s = gm_error_set(err, GM_ERR_INVALID, "%s: it now resizes to %lld x %lld pixels, %lld soft tokens; its tokens "
                                     "were made for %lld (the file changed since the data set was built?)", ref,
                                     (long long)px.w, (long long)px.h, (long long)tok, (long long)e->image_tokens[i]);
            }
            if (s == GM_OK) {
                size_t per = (size_t)(3 * px.h * px.w);
                memcpy(dst, px.data, (size_t)views * per * sizeof(float));
                for (int64_t v = 0; v < views; v++) {
                    off[k0 + v + 1] = off[k0 + v] + (int64_t)per;
                    if (hw) hw[2 * (k0 + v)] = px.h, hw[2 * (k0 + v) + 1] = px.w;
                }
                *n_images += views;
            }
            gm_image_pixels_free(&px);
            gm_image_free(&cell);
        }
    }
    gm_image_free(&file);
    gm_free(off);
    return s;
}

/* ---- checking image references (gm_image_check) ----------------------------------------------- */

/* One file of a validation pass: its decoded size and the sha256 state after its bytes, or the
 * error it gave. */
typedef struct check_entry {
    char *path;
    int64_t w, h;
    EVP_MD_CTX *md;   /* NULL when the file failed */
    gm_status s;
    char *msg;        /* the failure's message (s != GM_OK) */
    struct check_entry *next;
} check_entry;

/* A fixed number of hash chains: a data set's distinct files (thousands) keep them short; the
 * table never grows, so it needs no rehashing. */
#define CHECK_BUCKETS 1024

struct gm_image_check_cache {
    check_entry *bucket[CHECK_BUCKETS];
};

gm_image_check_cache *gm_image_check_cache_new(void) { return gm_calloc(1, sizeof(gm_image_check_cache)); }

static void check_entry_free(check_entry *e) {
    gm_free(e->path);
    gm_free(e->msg);
    EVP_MD_CTX_free(e->md);
    gm_free(e);
}

void gm_image_check_cache_free(gm_image_check_cache *c) {
    if (!c) return;
    for (int i = 0; i < CHECK_BUCKETS; i++)
        for (check_entry *e = c->bucket[i], *next; e; e = next) next = e->next, check_entry_free(e);
    gm_free(c);
}

static size_t check_hash(const char *path) { /* FNV-1a */
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) h = (h ^ *p) * 1099511628211ull;
    return (size_t)(h % CHECK_BUCKETS);
}

/* Decodes the file (for its size and to find a corrupt one) and hashes its bytes into e. */
static gm_status check_file(const char *path, check_entry *e, gm_error *err) {
    gm_image img = {0};
    GM_TRY(gm_image_load(path, NULL, &img, err));
    e->w = img.w, e->h = img.h;
    gm_image_free(&img);
    e->md = EVP_MD_CTX_new();
    if (!e->md || EVP_DigestInit_ex(e->md, EVP_sha256(), NULL) != 1)
        return gm_error_set(err, GM_ERR_IO, "sha256: OpenSSL initialisation failed");
    return gm_digest_file(path, e->md, err);
}

gm_status gm_image_check(gm_image_check_cache *cache, const char *ref, char sha_hex[65], int64_t *w, int64_t *h,
                         gm_error *err) {
    char path[GM_IMAGE_PATH_MAX];
    gm_image_rect r;
    bool has_rect = false;
    GM_TRY(gm_image_ref_parse(ref, path, sizeof path, &r, &has_rect, err));
    check_entry *e = NULL;
    size_t slot = check_hash(path);
    for (e = cache ? cache->bucket[slot] : NULL; e && strcmp(e->path, path) != 0; e = e->next) {}
    bool owned = false; /* e is this call's alone (no cache) */
    if (!e) {
        e = gm_calloc(1, sizeof *e);
        if (e) e->path = gm_strdup(path);
        if (!e || !e->path) {
            if (e) gm_free(e);
            return gm_error_set(err, GM_ERR_NOMEM, "out of memory checking image %s", path);
        }
        e->s = check_file(path, e, err);
        /* a failure is kept too (with its message): a broken sheet is not decoded once per cell */
        bool keep = cache != NULL;
        if (keep && e->s != GM_OK) keep = (e->msg = gm_strdup(err ? err->msg : "cannot be used")) != NULL;
        if (keep) {
            e->next = cache->bucket[slot];
            cache->bucket[slot] = e;
        } else {
            owned = true;
        }
        if (e->s != GM_OK) {
            gm_status s = e->s;
            if (owned) check_entry_free(e);
            return s;
        }
    } else if (e->s != GM_OK) {
        return gm_error_set(err, e->s, "%s", e->msg);
    }
    gm_status s = has_rect ? gm_image_ref_check(ref, r, e->w, e->h, err) : GM_OK;
    /* sha256(file bytes || normalized fragment), from the state after the bytes */
    EVP_MD_CTX *md = s == GM_OK ? EVP_MD_CTX_new() : NULL;
    if (s == GM_OK && (!md || EVP_MD_CTX_copy_ex(md, e->md) != 1)) s = gm_error_set(err, GM_ERR_NOMEM, "out of memory hashing %s", ref);
    if (s == GM_OK && has_rect) {
        char frag[96];
        gm_image_ref_fragment(r, frag, sizeof frag);
        EVP_DigestUpdate(md, frag, strlen(frag));
    }
    unsigned char dig[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (s == GM_OK && EVP_DigestFinal_ex(md, dig, &n) != 1) s = gm_error_set(err, GM_ERR_IO, "sha256 of %s failed", ref);
    if (s == GM_OK) {
        for (unsigned k = 0; k < 32; k++) snprintf(sha_hex + 2 * k, 3, "%02x", dig[k]);
        *w = e->w, *h = e->h;
    }
    EVP_MD_CTX_free(md);
    if (owned) check_entry_free(e);
    return s;
}

gm_status gm_dataset_sha256(const gm_dataset *ds, char hex[65], gm_error *err) {
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(ctx);
        return gm_error_set(err, GM_ERR_IO, "sha256: OpenSSL initialisation failed");
    }
    // (x86-64 and every host we build for are little-endian: the fields are hashed as stored)
    for (int64_t i = 0; i < ds->n; i++) {
        const gm_example *e = &ds->ex[i];
        EVP_DigestUpdate(ctx, &e->n, sizeof e->n);
        EVP_DigestUpdate(ctx, &e->response_start, sizeof e->response_start);
        EVP_DigestUpdate(ctx, &e->label, sizeof e->label);
        EVP_DigestUpdate(ctx, e->ids, (size_t)e->n * sizeof *e->ids);
        for (int64_t k = 0; k < e->n_images; k++) EVP_DigestUpdate(ctx, e->image_sha[k], strlen(e->image_sha[k]));
        for (int64_t k = 0; k < e->n_audio; k++) EVP_DigestUpdate(ctx, e->audio_sha[k], strlen(e->audio_sha[k]));
        /* (only multi-turn examples have them: one-turn data sets hash as before) */
        if (e->n_turns > 0) EVP_DigestUpdate(ctx, e->turns, (size_t)e->n_turns * sizeof *e->turns);
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    int ok = EVP_DigestFinal_ex(ctx, md, &mdlen);
    EVP_MD_CTX_free(ctx);
    if (ok != 1) return gm_error_set(err, GM_ERR_IO, "sha256 failed");
    for (unsigned k = 0; k < 32; k++) snprintf(hex + 2 * k, 3, "%02x", md[k]);
    return GM_OK;
}

int64_t gm_batch_collate(const gm_dataset *ds, const int64_t *idx, int64_t B, int32_t pad_id, int32_t *ids,
                         int32_t *targets) {
    int64_t T = 1;
    for (int64_t b = 0; b < B; b++) T = ds->ex[idx[b]].n > T ? ds->ex[idx[b]].n : T;
    for (int64_t b = 0; b < B; b++) {
        const gm_example *e = &ds->ex[idx[b]];
        for (int64_t t = 0; t < T; t++) {
            ids[b * T + t] = t < e->n ? e->ids[t] : pad_id;
            /* position t predicts ids[t+1]; supervised when that token is in a model turn: the last
             * (the response) or an earlier one of a multi-turn chat */
            bool sup = t + 1 < e->n && t + 1 >= e->response_start;
            for (int64_t k = 0; !sup && t + 1 < e->n && k < e->n_turns; k++)
                sup = t + 1 >= e->turns[k][0] && t + 1 < e->turns[k][1];
            targets[b * T + t] = sup ? e->ids[t + 1] : -1;
        }
    }
    return T;
}

gm_status gm_fortunes_read(const char *dir, const char *topic, size_t max_chars, gm_text_fn fn, void *user,
                           int64_t *n_read, gm_error *err) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, topic);
    char *buf = NULL;
    size_t len = 0;
    gm_status s = gm_read_file(path, &buf, &len, err);
    if (s != GM_OK) {
        gm_error_prefix(err, "fortunes topic '%s'", topic);
        if (s == GM_ERR_IO) {
            size_t l = strlen(err->msg);
            snprintf(err->msg + l, sizeof err->msg - l, "\n  hint: install Debian's fortunes package (apt-get install fortunes)");
        }
        return s;
    }
    int64_t count = 0;
    const char *p = buf, *end = buf + len, *entry = buf;
    while (p <= end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol) eol = end;
        bool sep = (eol - p == 1 && p[0] == '%') || p == end;
        if (sep) {
            const char *a = entry, *b = p;
            while (a < b && isspace((unsigned char)*a)) a++;
            while (b > a && isspace((unsigned char)b[-1])) b--;
            if (b > a && (size_t)(b - a) <= max_chars) {
                fn(a, (size_t)(b - a), user);
                count++;
            }
            entry = eol + 1;
        }
        if (eol == end) break;
        p = eol + 1;
    }
    gm_free(buf);
    if (n_read) *n_read = count;
    return GM_OK;
}

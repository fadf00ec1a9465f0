/*
 * gm_audio_clips.c - audio files to prompt soft tokens: decoding, features, the encoder (see
 * gm_audio_encode_files in gm_audio_encoder.h). Built with audio in's libraries only.
 */
#include "gm_audio.h"
#include "gm_audio_encoder.h"

#include "gm_alloc.h"
#include "gm_mm_embed.h"
#include "gm_model.h"

#include <string.h>

#define MAX_CLIPS 16

gm_status gm_audio_encode_files(const gm_model *m, const gm_mm_hard *hard, const char *const *paths, int n,
                                int n_threads, gm_backend *be, const gm_lora *ad, float *soft, int64_t *tokens,
                                int64_t *samples, gm_error *err) {
    if (n < 1 || n > MAX_CLIPS)
        return gm_error_set(err, GM_ERR_INVALID, "%d audio clips: 1 to %d per prompt", n, MAX_CLIPS);
    gm_audio clips[MAX_CLIPS];
    memset(clips, 0, sizeof clips);
    const float *ptr[MAX_CLIPS];
    int64_t lens[MAX_CLIPS];
    gm_audio_fe *fe = NULL;
    gm_audio_features f = {0};
    gm_audio_encoder *enc = NULL;
    gm_status s = GM_OK;
    bool g4 = m->cfg.arch == GM_ARCH_GEMMA4;
    for (int i = 0; s == GM_OK && i < n; i++) {
        s = gm_audio_load(paths[i], NULL, &clips[i], err);
        ptr[i] = clips[i].samples, lens[i] = clips[i].n;
        if (s == GM_OK && samples) samples[i] = clips[i].n;
        /* Gemma 4: a clip under its extractor's first frame would take no soft token (each clip its
         * own count, checked per clip; Gemma 3n's fill 188 positions whatever their length) */
        if (s == GM_OK && g4 && clips[i].n < GM_AUDIO4_MIN_SAMPLES)
            s = gm_error_set(err, GM_ERR_INVALID, "%s: %lld samples at 16 kHz (%.1f ms) is shorter than the feature extractor's "
                             "first frame (%d samples): it would take no soft token\n  hint: leave the clip out, or pad it "
                             "with silence", paths[i], (long long)clips[i].n, 1000.0 * (double)clips[i].n / GM_AUDIO_RATE,
                             GM_AUDIO4_MIN_SAMPLES);
    }
    if (s == GM_OK)
        s = gm_audio_fe_new_kind(m->cfg.arch == GM_ARCH_GEMMA4 ? GM_AUDIO_FE_GEMMA4 : GM_AUDIO_FE_GEMMA3N, &fe, err);
    if (s == GM_OK) s = gm_audio_features_compute(fe, ptr, lens, n, &f, err);
    if (s == GM_OK && f.T < 1)
        s = gm_error_set(err, GM_ERR_INVALID, "%s: shorter than the feature extractor's first frame (513 samples at 16 kHz: 32 ms)", paths[0]);
    if (s == GM_OK) s = gm_audio_encoder_new_adapted(m, hard, n, f.T, n_threads, be, ad, &enc, err);
    if (s == GM_OK) s = gm_audio_encoder_run(enc, f.data, f.mask, n, f.T, NULL, NULL, err);
    if (s == GM_OK)
        gm_backend_download(enc->be, soft, enc->soft, (size_t)(enc->n_soft * enc->d.C_text) * sizeof(float));
    for (int i = 0; s == GM_OK && tokens && i < n; i++)
        tokens[i] = enc->g4 ? enc->soft_off[i + 1] - enc->soft_off[i] : enc->d.soft_tokens;
    if (s == GM_OK) s = gm_backend_status(enc->be, err);
    gm_audio_encoder_free(enc);
    gm_audio_features_free(&f);
    gm_audio_fe_free(fe);
    for (int i = 0; i < n; i++) gm_audio_free(&clips[i]);
    return s;
}

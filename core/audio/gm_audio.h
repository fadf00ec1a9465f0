/*
 * gm_audio.h - audio in: a WAV, FLAC, Ogg Vorbis/Opus (or any file libsndfile reads) decoded to
 * mono 16 kHz f32, then the log-mel features of Gemma 3n's audio encoder exactly as Hugging Face's
 * Gemma3nAudioFeatureExtractor computes them, or of Gemma 4's as Gemma4AudioFeatureExtractor does
 * (gm_audio_fe_new_kind; tests/ref/gemma4_audio_fe_ref.h5).
 *
 * The reference is the Python path a transformers user takes (transformers 5.24, numpy 2.4):
 * `soundfile.read(path, dtype="float32")` (libsndfile: integer PCM divided by 2^(bits-1)), the mean
 * of the channels, `samplerate.resample(mono, 16000 / sr, "sinc_best")` (libsamplerate's
 * SRC_SINC_BEST_QUALITY; none at 16 kHz), then `Gemma3nAudioFeatureExtractor()(clips)` with its
 * defaults: padding "longest" to a multiple of 128 samples, truncation at 480,000 samples (30 s),
 * 32 ms frames every 10 ms, HTK pre-emphasis 0.97, a periodic Hann window, a 1024-point FFT's
 * magnitudes, 128 HTK mel filters 125-7600 Hz, log(max(mel, 1e-5)), and the frame mask
 * (tests/unit/test_audio.c against tests/ref/audio_ref.h5; docs/architecture.md, "Audio in"). The
 * decoded samples are bit-identical to the reference's; the features within one f32 ulp of
 * transformers' with numpy's baseline loops (with its AVX2/FMA loops transformers' own output moves
 * by up to 4e-3 in bins ~60 dB under their frame's peak: tests/unit/test_util.h, TOL_AUDIO_*).
 *
 * Ownership: a gm_audio owns its `samples` and a gm_audio_features its `data` and `mask`
 * (gm_malloc); their _free functions release them and zero the struct. Functions that fill one
 * write it only on success (untouched on failure). A gm_audio_fe (the extractor: window, filter
 * bank, FFTW plan) is made by gm_audio_fe_new and released by gm_audio_fe_free.
 * Threads: everything is reentrant, and one gm_audio_fe may serve several threads at once (its
 * plan is only executed, on each call's own buffers). FFTW's planner is not thread-safe: the plan
 * is made and destroyed under one mutex of this module (nothing else in gemmarun calls FFTW).
 * Errors: functions returning gm_status write a message into `err` that names the file (or the
 * `name` given for a buffer in memory), says what was wrong and ends with a "hint:" line:
 * GM_ERR_IO (missing or unreadable file, a folder), GM_ERR_FORMAT (empty file, no samples,
 * truncated or corrupt data: a header that promises more samples than the file holds is this),
 * GM_ERR_UNSUPPORTED (not an audio file libsndfile reads - the message says what it looks like - or
 * a sample rate outside GM_AUDIO_MIN_RATE..GM_AUDIO_MAX_RATE), GM_ERR_LIMIT (longer than the
 * limit: checked on the header's length before allocating, and again while reading, which is done
 * in bounded chunks, so a header that lies cannot make it read or allocate without bound),
 * GM_ERR_INVALID (bad arguments), GM_ERR_NOMEM. A failure leaks nothing of ours (libsndfile 1.2.0
 * itself loses 5.8 KB refusing an Ogg file whose Vorbis headers are cut: tests/sanitizers/lsan.supp).
 */
#ifndef GM_AUDIO_H
#define GM_AUDIO_H

#include "gm_status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The rate everything is converted to, the rate of Gemma 3n's feature extractor (Hz). */
#define GM_AUDIO_RATE 16000

/* The default longest file, in seconds of audio: 10 minutes. The extractor keeps the first 30 s;
 * a longer clip is read whole (it may be cut later) but a file claiming hours is refused before
 * anything the size of its samples is allocated. 10 minutes at 16 kHz is 38 MB of f32. */
#define GM_AUDIO_MAX_SECONDS 600.0

/* Source sample rates accepted (Hz). libsamplerate converts by at most a factor of 256 either way
 * (SRC_MAX_RATIO), so 16 kHz can come from 62.5 Hz .. 4.096 MHz; we take telephone rates and up
 * (8 kHz, even older 4 kHz and 6 kHz material) to 768 kHz, the highest rate in common use.
 * Outside: GM_ERR_UNSUPPORTED. */
#define GM_AUDIO_MIN_RATE 1000
#define GM_AUDIO_MAX_RATE 768000

/* The largest limit taken (seconds; about 116 days): a larger max_seconds is read as this. */
#define GM_AUDIO_LIMIT_MAX_SECONDS 1e7

/* What a decoder may read. */
typedef struct gm_audio_limits {
    double max_seconds; /* longer than this is GM_ERR_LIMIT; <= 0 means GM_AUDIO_MAX_SECONDS */
    int64_t min_samples; /* gm_audio_check: shorter is GM_ERR_FORMAT; <= 0 means GM_AUDIO_MIN_SAMPLES */
} gm_audio_limits;

/* Mono audio at GM_AUDIO_RATE. Owns `samples` (n floats, gm_malloc'd; NULL when n = 0). */
typedef struct gm_audio {
    int64_t n;          /* samples at GM_AUDIO_RATE */
    float *samples;     /* (n,) in [-1, 1] for integer sources */
    int32_t src_rate;   /* the file's sample rate (Hz) */
    int32_t src_channels;
    int64_t src_frames; /* frames read from the file (per channel, at src_rate) */
} gm_audio;

/* ---- decoding ---------------------------------------------------------------------------------- */

/* Reads the audio file at `path` into *out, as mono 16 kHz f32: libsndfile decodes it (any format
 * it reads: WAV/RIFF, W64, RF64, AIFF, FLAC, Ogg Vorbis and Opus, MP3 on Debian 12's build, ...,
 * told apart by their bytes, never by the file name) to f32 frames (integer PCM / 2^(bits-1), as
 * soundfile.read(dtype="float32") gives them), the channels of each frame are averaged in f32
 * (numpy's pairwise f32 sum, then / channels: x.mean(axis=1) bit for bit), and libsamplerate's
 * SRC_SINC_BEST_QUALITY converts the rate by 16000 / src_rate (nothing at 16 kHz). The file is read
 * in chunks of at most 64 Ki samples and the converter is fed chunk by chunk; this gives the same
 * samples, bit for bit, as samplerate.resample's single src_simple call (test_audio, fixtures).
 * Why the best sinc converter: it is what samplerate.resample does by default (the reference), and
 * a band-limited converter keeps what is above the new Nyquist out of the features (a 44.1 kHz
 * recording's 8-22 kHz band would fold onto speech). Its cost is paid once per clip when the data is
 * read: 1.5 s for 30 s of 44.1 kHz audio, 0.36 s for 30 s at 8 kHz, on one core of the 2-core dev
 * box (SRC_SINC_MEDIUM_QUALITY is 4x faster but lands up to 0.013 away from the reference's
 * samples on the real 8 kHz speech clips, 0.21 on a 44.1 kHz chirp near 8 kHz).
 * limits may be NULL (defaults).
 * Errors (see the header): GM_ERR_IO, GM_ERR_FORMAT for an empty file, one with no frames, a
 * header promising more frames than the file holds (truncated, or a lying header: the message
 * gives both counts), decoding errors (libsndfile's message) and a sample that is NaN or infinite
 * (float files; the message gives its time); GM_ERR_UNSUPPORTED;
 * GM_ERR_LIMIT naming the duration; GM_ERR_NOMEM. *out is untouched on failure. */
gm_status gm_audio_load(const char *path, const gm_audio_limits *limits, gm_audio *out, gm_error *err);

/* gm_audio_load of n bytes in memory (borrowed, read only, through libsndfile's virtual I/O);
 * `name` stands for the file in messages. */
gm_status gm_audio_decode(const void *data, size_t n, const char *name, const gm_audio_limits *limits, gm_audio *out,
                          gm_error *err);

/* What a data set needs to know of a clip before training (the runner's validation): the file
 * decoded completely (gm_audio_load: every error a batch could meet later is met here), its
 * length at 16 kHz (*samples), the feature frames the extractor gives it alone (*frames,
 * gm_audio_frames: 30 s at most) and the file's sha256 (hex, 64 digits and a NUL), part of the data
 * set's identity. limits may be NULL. Errors: gm_audio_load's, and GM_ERR_FORMAT for a clip under
 * limits->min_samples at 16 kHz (default GM_AUDIO_MIN_SAMPLES: Gemma 3n's extractor gives it no
 * frame; GM_AUDIO4_MIN_SAMPLES for Gemma 4's, under which it takes no soft token), naming the file. */
gm_status gm_audio_check(const char *path, const gm_audio_limits *limits, int64_t *samples, int64_t *frames,
                         char sha[65], gm_error *err);

/* Releases a->samples and zeroes *a. NULL and an already freed gm_audio are no-ops. */
void gm_audio_free(gm_audio *a);

/* What the first n bytes look like when libsndfile refuses them, for messages: "an empty file",
 * "a PNG image", "a JPEG image", "a ZIP archive", "a PDF document", "an MP4/M4A file (AAC audio is
 * not read by libsndfile)", "text", ... or NULL when unrecognised. Needs at most 12 bytes. */
const char *gm_audio_sniff(const void *head, size_t n);

/* ---- features: Gemma3nAudioFeatureExtractor and Gemma4AudioFeatureExtractor ---------------------- */

/* The extractor's defaults (transformers' Gemma3nAudioFeatureExtractor.__init__ and __call__; the
 * values gemma_architecture.md §3.9 lists for Gemma 3n). */
#define GM_AUDIO_FRAME 512        /* frame_length: 32 ms at 16 kHz */
#define GM_AUDIO_HOP 160          /* hop_length: 10 ms */
#define GM_AUDIO_FFT 1024         /* 2^ceil(log2(512)) x 2 ("fft_overdrive") */
#define GM_AUDIO_MELS 128         /* feature_size */
#define GM_AUDIO_MAX_SAMPLES 480000 /* __call__'s max_length (30 s), with truncation=True */
#define GM_AUDIO_PAD_MULTIPLE 128 /* __call__'s pad_to_multiple_of */

/* Gemma4AudioFeatureExtractor's defaults (transformers 5.24, models/gemma4/feature_extraction_gemma4.py;
 * padding, truncation and pad_to_multiple_of are 3n's: GM_AUDIO_MAX_SAMPLES, GM_AUDIO_PAD_MULTIPLE). */
#define GM_AUDIO4_FRAME 320    /* frame_length: 20 ms at 16 kHz */
#define GM_AUDIO4_HOP 160      /* hop_length: 10 ms */
#define GM_AUDIO4_FFT 512      /* 2^ceil(log2(320)), no overdrive */
#define GM_AUDIO4_LEFT_PAD 160 /* frame_length // 2 zeros before the clip ("semicausal" padding) */
/* The shortest clips that give a frame: Gemma 3n's 513 samples (a 32 ms window and the next
 * sample); Gemma 4's 161 (its first 321-sample window, 160 of them its left padding: one valid
 * frame, one soft token). */
#define GM_AUDIO_MIN_SAMPLES (GM_AUDIO_FRAME + 1)
#define GM_AUDIO4_MIN_SAMPLES (GM_AUDIO4_FRAME + 1 - GM_AUDIO4_LEFT_PAD)

/* Which transformers extractor a gm_audio_fe reproduces (each with its defaults). */
typedef enum gm_audio_fe_kind {
    GM_AUDIO_FE_GEMMA3N = 0, /* Gemma3nAudioFeatureExtractor: Gemma 3n's audio encoder */
    GM_AUDIO_FE_GEMMA4 = 1,  /* Gemma4AudioFeatureExtractor: Gemma 4's audio encoder */
} gm_audio_fe_kind;

/* The extractor: its kind, window, mel filter bank (double), FFTW plan. Immutable after
 * gm_audio_fe_new / gm_audio_fe_new_kind; see the header for threads. */
typedef struct gm_audio_fe gm_audio_fe;

/* The log-mel features of a batch of B clips: data (B, T, 128) f32, mask (B, T), the extractor's
 * input_features and input_features_mask. Gemma 3n: mask[b][t] = 1 when frame t of clip b starts
 * inside the clip (the padded sample mask taken every 160 samples, cut to T). Gemma 4: mask[b][t] =
 * 1 when sample 160 t + 160 of the clip is inside it (the left-padded sample mask at the frame's
 * last unfolded sample, frame_end_indices), and data[b][t] is 0 (-0 for negative values, as numpy's
 * features * mask gives) where the mask is 0. Owns `data` and `mask` (gm_malloc'd; NULL when
 * B * T = 0). */
typedef struct gm_audio_features {
    int64_t B, T;
    int64_t n_mels;       /* 128 */
    int64_t padded_len;   /* the samples every clip was padded (or cut) to; a multiple of 128 */
    float *data;          /* (B, T, n_mels) */
    uint8_t *mask;        /* (B, T), 0 or 1 */
} gm_audio_features;

/* Makes the extractor of `kind` (window, filter bank, an FFTW_ESTIMATE double r2c plan of the
 * kind's FFT length - 1024 points for 3n, 512 for Gemma 4 - made under this module's planner
 * mutex). *out receives it. GM_ERR_INVALID (an unknown kind), GM_ERR_NOMEM (also when FFTW cannot
 * plan). */
gm_status gm_audio_fe_new_kind(gm_audio_fe_kind kind, gm_audio_fe **out, gm_error *err);

/* gm_audio_fe_new_kind(GM_AUDIO_FE_GEMMA3N, out, err): Gemma 3n's extractor. */
gm_status gm_audio_fe_new(gm_audio_fe **out, gm_error *err);

/* The kind the extractor was made for. */
gm_audio_fe_kind gm_audio_fe_get_kind(const gm_audio_fe *fe);

/* Releases the extractor (its plan destroyed under the planner mutex). NULL is a no-op. */
void gm_audio_fe_free(gm_audio_fe *fe);

/* The extractor's window (borrowed, valid until gm_audio_fe_free), a periodic Hann window as numpy
 * computes it. 3n: GM_AUDIO_FRAME floats, w[n] = 0.5 (1 - cos(2 pi n / 512)) in f32. Gemma 4:
 * GM_AUDIO4_FRAME floats, transformers.audio_utils.window_function(320) = np.hanning(321)[:-1]
 * (0.5 + 0.5 cos(pi (2n - 320) / 320) in f64) rounded to f32. */
const float *gm_audio_fe_window(const gm_audio_fe *fe);

/* The padded length and frame count the extractor gives a batch whose longest clip has max_len
 * samples: L = min(max_len, 480000) rounded up to a multiple of 128; T = (L - 513) / 160 + 1 frames
 * when L >= 513, else 0 (a clip under 513 samples has no frame: the extractor returns (0, 128)).
 * The memory planner's formula: 30 s gives L = 480000, T = 2997. */
void gm_audio_frames(int64_t max_len, int64_t *padded_len, int64_t *T);

/* gm_audio_frames for either kind: the same padded length L (truncation, padding to a multiple of
 * 128); Gemma 3n's T as gm_audio_frames; Gemma 4's T = (L + 160 - 321) / 160 + 1 frames when
 * L + 160 >= 321, else 0 (its clip is left-padded by 160 zeros, then unfolded into frames of 321
 * samples every 160). 30 s gives L = 480000 and T = 2999 for Gemma 4; a clip of 1 .. 128 samples
 * (L = 128) has no Gemma 4 frame. */
static inline void gm_audio_frames_kind(gm_audio_fe_kind kind, int64_t max_len, int64_t *padded_len, int64_t *T) {
    int64_t L = 0, T3 = 0;
    gm_audio_frames(max_len, &L, &T3);
    if (padded_len) *padded_len = L;
    if (T) {
        const int64_t U = GM_AUDIO4_FRAME + 1, Lp = L + GM_AUDIO4_LEFT_PAD;
        *T = kind == GM_AUDIO_FE_GEMMA4 ? (Lp >= U ? (Lp - U) / GM_AUDIO4_HOP + 1 : 0) : T3;
    }
}

/* The extractor of fe's kind on B clips (clips[b] has lens[b] f32 samples at 16 kHz, borrowed):
 * every clip cut to 480,000 samples, all padded with zeros to the longest rounded up to a multiple
 * of 128 (gm_audio_frames_kind; out->padded_len is that length, without Gemma 4's left padding),
 * then the kind's frames and features (out->T frames of 128 log-mels each, natural log of mel
 * energies of FFT magnitudes - not powers - of samples in [-1, 1]), and the mask as in
 * gm_audio_features.
 * GM_AUDIO_FE_GEMMA3N: Gemma3nAudioFeatureExtractor()(clips), per frame t of 513 samples starting
 * at 160 t:
 *   HTK pre-emphasis: y[0] = x[0] * f32(1 - 0.97), y[n] = x[n] - f32(0.97) * x[n-1], n < 512
 *   (the 513th sample unused), in f32 as numpy does;
 *   y[n] * window[n] (f32), zero-padded to 1024, real FFT (FFTW in double, each component then
 *   rounded to f32: numpy's rfft of f32 data), |X[k]| (hypotf), k <= 512;
 *   mel[m] = sum_k |X[k]| fb[k][m] in double (the filter bank of create_fb_matrix: triangles on
 *   the HTK mel scale 2595 log10(1 + f / 700) between 125 and 7600 Hz, no area normalization);
 *   out = f32(log(max(mel, 1e-5))).
 * GM_AUDIO_FE_GEMMA4: Gemma4AudioFeatureExtractor()(clips) (its __call__ and
 * _extract_spectrogram), per clip: 160 zeros prepended (the mask too), then per frame t of 321
 * samples starting at 160 t of that (the clip's samples 160 t - 160 .. 160 t + 160):
 *   no pre-emphasis: the first 320 samples, times window[n] (f32; the 321st sample unused),
 *   zero-padded to 512, real FFT (FFTW in double rounded to f32, as numpy's rfft of f32 data),
 *   |X[k]| (hypotf), k <= 256;
 *   mel[m] = sum_k |X[k]| fb[k][m] in double (audio_utils.mel_filter_bank(257, 128, 0, 8000, 16000,
 *   norm=None, mel_scale="htk"): HTK mel triangles over bins at k * 31.25 Hz, no normalization);
 *   out = f32(log(mel + 1e-3)), then times the frame's mask (0 where it is 0).
 * B >= 1, lens[b] >= 0 (a clip may be empty: it is all
 * padding). Errors: GM_ERR_INVALID (B < 1, a negative length, B above 2^20), GM_ERR_NOMEM. *out is
 * untouched on failure. */
gm_status gm_audio_features_compute(const gm_audio_fe *fe, const float *const *clips, const int64_t *lens, int64_t B,
                                    gm_audio_features *out, gm_error *err);

/* gm_audio_load, then gm_audio_features_compute of that one clip (B = 1), by fe's kind. */
gm_status gm_audio_features_file(const gm_audio_fe *fe, const char *path, const gm_audio_limits *limits,
                                 gm_audio_features *out, gm_error *err);

/* Releases f->data and f->mask and zeroes *f. NULL is a no-op. */
void gm_audio_features_free(gm_audio_features *f);

#ifdef __cplusplus
}
#endif
#endif /* GM_AUDIO_H */

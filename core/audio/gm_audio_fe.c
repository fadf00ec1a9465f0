/*
 * gm_audio_fe.c - the log-mel features of transformers' Gemma3nAudioFeatureExtractor
 * (models/gemma3n/feature_extraction_gemma3n.py, transformers 5.24) and Gemma4AudioFeatureExtractor
 * (models/gemma4/feature_extraction_gemma4.py), FFT by FFTW.
 *
 * How: the extractor object holds what depends on nothing but its kind's defaults (SPECS below) -
 * the window, the mel filter bank, one FFTW plan - and gm_audio_features_compute runs the
 * extractor's _extract_spectrogram frame by frame on each clip of the batch, reading the padded
 * samples where they are (a frame before a clip's start, Gemma 4's left padding, or past its end
 * reads zeros) instead of building the padded batch. The two kinds share every step: batching
 * (_truncate, padding "longest" to a multiple of 128), the unfold into frame_length + 1 samples,
 * window, FFT, magnitudes, HTK mel triangles, log; they differ in frame and FFT lengths, Gemma 4's
 * 160 zeros before the clip, 3n's pre-emphasis (Gemma 4: none), the filters' span (125-7600 Hz vs
 * 0-8000 Hz) and bin frequencies, the window's formula, the floor (3n: log(max(mel, 1e-5)); Gemma 4:
 * log(mel + 1e-3)), which sample the mask reads (3n: the frame's first; Gemma 4: its 321st) and
 * Gemma 4's zeroing of masked frames.
 *
 * Arithmetic, step by step as numpy 2.4 does it (NEP 50: a Python float times an f32 array is an
 * f32 operation, the float rounded to f32 first):
 *   window   3n f32: 0.5f * (1 - cosf(f32(2 pi) * n / 512)); numpy's own f32 cos and glibc's cosf
 *            may differ in the last bit (test_audio compares the window with numpy's); Gemma 4:
 *            np.hanning(321)[:-1] in f64 (0.5 + 0.5 cos(pi n / 320)), .astype(np.float32);
 *   frames   f32 pre-emphasis (3n) and window products, as written in gm_audio.h (the waveform is
 *            f32 and stays so through np.pad and the unfold);
 *   FFT      numpy 2.4's rfft of an f32 array runs pocketfft's f64 loop and rounds the result to
 *            complex64 (np.fft.rfft(x32) == np.fft.rfft(x32.astype(f64)).astype(complex64), bit for
 *            bit on the fixtures' frames); ours is FFTW's f64 r2c, each component then rounded to
 *            f32: the same transform, f64 roundings apart (see TOL_AUDIO_LOGMEL_ABS);
 *   |X|      np.abs of complex64 is hypotf;
 *   mel      f32 magnitudes times the f64 filter bank: np.matmul promotes to f64;
 *   log      3n: np.log(np.maximum(mel, 1e-5)) in f64, then .astype(np.float32); Gemma 4:
 *            np.log(mel + np.array(1e-3, f64)) in f64, .astype(np.float32), then times the bool
 *            mask (f32: a masked frame's values become +-0).
 * The file is compiled with -ffp-contract=off (CMakeLists.txt): a fused multiply-add would change
 * the f32 roundings above on machines that have one.
 *
 * Why not FFTW's f32 plan: an f32 FFT's error is about 1e-7 of the frame's largest bin in every
 * bin, so a bin 1e-6 below the frame's peak (the band above 4 kHz of an 8 kHz phone recording
 * converted to 16 kHz) is off by 10%: measured 0.05 in the log-mels of hello-world.wav against the
 * extractor, whose f64 transform keeps every bin to 1e-7 of itself (5.4e-7 in the log-mels against
 * an all-f64 pipeline). The f64 plan costs ~10 us per frame more; 30 s is 2997 frames.
 *
 * FFTW's planner is not thread-safe (FFTW manual §5.4 "Thread safety": only fftw_execute and the
 * new-array execute functions are), so plans are made and destroyed under plan_mutex. The plan is
 * FFTW_ESTIMATE (no timing runs: the same plan, hence the same bits, on every run of a machine) and
 * FFTW_UNALIGNED, so that each call may execute it on its own gm_malloc'd buffers whatever their
 * alignment (fftw_execute_dft_r2c) and one extractor serves any number of threads.
 */
#include "gm_audio.h"

#include "gm_alloc.h"

#include <fftw3.h> /* the double-precision library, libfftw3 (fftw3.pc) */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#define MAX_FRAME GM_AUDIO_FRAME         /* the longest frame of any kind (3n's 512) */
#define MAX_NBINS (GM_AUDIO_FFT / 2 + 1) /* the most rfft bins of any kind (3n's 513) */

/* What tells the kinds apart: each extractor's __init__ defaults (and the steps of its
 * _extract_spectrogram that differ). Everything else is one code path. */
typedef struct fe_spec {
    const char *name;
    int frame, hop, fft; /* frame_length, hop_length, fft_length */
    int left_pad;        /* zeros before the clip (Gemma 4's semicausal padding), samples */
    int mask_at;         /* the frame's sample, in the left-padded clip, that the mask reads */
    double preemph;      /* HTK pre-emphasis coefficient; 0: none (frames_to_process[..., :-1]) */
    double fmin, fmax;   /* the mel filters' span, Hz */
    double mel_floor;
    bool floor_add;      /* log(mel + floor) (Gemma 4) instead of log(max(mel, floor)) (3n) */
    bool zero_masked;    /* features * mask[..., None] (Gemma 4's __call__) */
} fe_spec;

static const fe_spec SPECS[] = {
    [GM_AUDIO_FE_GEMMA3N] = {"Gemma3nAudioFeatureExtractor", GM_AUDIO_FRAME, GM_AUDIO_HOP, GM_AUDIO_FFT, 0, 0, 0.97, 125.0, 7600.0,
                             1e-5, false, false},
    [GM_AUDIO_FE_GEMMA4] = {"Gemma4AudioFeatureExtractor", GM_AUDIO4_FRAME, GM_AUDIO4_HOP, GM_AUDIO4_FFT, GM_AUDIO4_LEFT_PAD,
                            GM_AUDIO4_FRAME, 0.0, 0.0, 8000.0, 1e-3, true, true},
};

static pthread_mutex_t plan_mutex = PTHREAD_MUTEX_INITIALIZER;

struct gm_audio_fe {
    gm_audio_fe_kind kind;
    const fe_spec *s;
    int nbins;                          /* fft / 2 + 1 */
    float window[MAX_FRAME];            /* the first s->frame values */
    double fb[MAX_NBINS][GM_AUDIO_MELS]; /* the filter bank (bins, mels); the first nbins rows */
    int lo[GM_AUDIO_MELS], hi[GM_AUDIO_MELS]; /* the bins [lo, hi) where filter m is not zero */
    fftw_plan plan;                     /* s->fft-point r2c, double */
};

/* The triangular HTK mel filters, which both extractors build the same way (3n: create_fb_matrix of
 * feature_extraction_gemma3n.py; Gemma 4: audio_utils.mel_filter_bank(norm=None, mel_scale="htk")
 * and its _create_triangular_filter_bank), in their order of operations:
 *   all_freqs[k] 3n: f32(k) * f32(16000 / 1024) (exact: k * 15.625);
 *                4:  np.linspace(0, 16000 // 2, 257) = f64(k) * 31.25 + 0 (exact)
 *   m_min, m_max = 2595 log10(1 + f / 700) of fmin and fmax             (f64; Gemma 4's m_min is 0)
 *   m_pts = np.linspace(m_min, m_max, 130): i * step + m_min, the last = m_max
 *   f_pts = 700 (10^(m_pts / 2595) - 1); f_diff = f_pts[1:] - f_pts[:-1]
 *   fb[k][m] = max(0, min(-(f_pts[m] - f[k]) / f_diff[m], (f_pts[m+2] - f[k]) / f_diff[m+1])) */
static void make_filter_bank(gm_audio_fe *fe) {
    enum { NP = GM_AUDIO_MELS + 2 };
    const fe_spec *s = fe->s;
    double m_min = 2595.0 * log10(1.0 + s->fmin / 700.0), m_max = 2595.0 * log10(1.0 + s->fmax / 700.0);
    double step = (m_max - m_min) / (NP - 1), f_pts[NP], f_diff[NP - 1];
    for (int i = 0; i < NP; i++) {
        double m = i == NP - 1 ? m_max : (double)i * step + m_min;
        f_pts[i] = 700.0 * (pow(10.0, m / 2595.0) - 1.0);
    }
    for (int i = 0; i < NP - 1; i++) f_diff[i] = f_pts[i + 1] - f_pts[i];
    for (int m = 0; m < GM_AUDIO_MELS; m++) fe->lo[m] = fe->nbins, fe->hi[m] = 0;
    for (int k = 0; k < fe->nbins; k++) {
        double f = fe->kind == GM_AUDIO_FE_GEMMA3N ? (double)((float)k * (float)((double)GM_AUDIO_RATE / s->fft))
                                                   : (double)k * ((double)(GM_AUDIO_RATE / 2) / (fe->nbins - 1)) + 0.0;
        for (int m = 0; m < GM_AUDIO_MELS; m++) {
            double down = (-1.0 * (f_pts[m] - f)) / f_diff[m], up = (f_pts[m + 2] - f) / f_diff[m + 1];
            double v = fmax(0.0, fmin(down, up));
            fe->fb[k][m] = v;
            if (v != 0.0) {
                if (k < fe->lo[m]) fe->lo[m] = k;
                fe->hi[m] = k + 1;
            }
        }
    }
}

/* The periodic Hann window of each kind, as numpy computes it:
 *   3n: hann_arange f32; 2 * np.pi * n is (2 pi rounded to f32) * n in f32; / 512 is exact;
 *       0.5 * (1 - cos(.)) in f32 (libm's cosf: numpy's baseline loop);
 *   4:  window_function(320) = np.hanning(321)[:-1], then .astype(np.float32): np.hanning is
 *       0.5 + 0.5 cos(pi n / 320) in f64 with n = -320, -318, ..., 320 (arange(1 - M, M, 2), M = 321
 *       as a float), the value rounded to f32 once. */
static void make_window(gm_audio_fe *fe) {
    const int N = fe->s->frame;
    if (fe->kind == GM_AUDIO_FE_GEMMA3N) {
        const float two_pi = (float)(2.0 * M_PI);
        for (int n = 0; n < N; n++) fe->window[n] = 0.5f * (1.0f - cosf(two_pi * (float)n / (float)N));
    } else {
        for (int i = 0; i < N; i++) {
            double n = (double)(2 * i - N);
            fe->window[i] = (float)(0.5 + 0.5 * cos(M_PI * n / (double)N));
        }
    }
}

gm_status gm_audio_fe_new_kind(gm_audio_fe_kind kind, gm_audio_fe **out, gm_error *err) {
    GM_ASSERT(out);
    if (kind != GM_AUDIO_FE_GEMMA3N && kind != GM_AUDIO_FE_GEMMA4)
        return gm_error_set(err, GM_ERR_INVALID, "audio feature extractor: unknown kind %d\nhint: GM_AUDIO_FE_GEMMA3N or GM_AUDIO_FE_GEMMA4",
                            (int)kind);
    const fe_spec *s = &SPECS[kind];
    int nbins = s->fft / 2 + 1;
    gm_audio_fe *fe = gm_calloc(1, sizeof *fe);
    double *in = gm_malloc((size_t)s->fft * sizeof(double));
    fftw_complex *spec = gm_malloc((size_t)nbins * sizeof(fftw_complex));
    if (!fe || !in || !spec) {
        gm_free(fe), gm_free(in), gm_free(spec);
        return gm_error_set(err, GM_ERR_NOMEM, "audio feature extractor: out of memory\nhint: free memory");
    }
    fe->kind = kind, fe->s = s, fe->nbins = nbins;
    make_window(fe);
    make_filter_bank(fe);
    /* FFTW_ESTIMATE never writes the arrays it plans on; they only give the plan its strides */
    pthread_mutex_lock(&plan_mutex);
    fe->plan = fftw_plan_dft_r2c_1d(s->fft, in, spec, FFTW_ESTIMATE | FFTW_UNALIGNED);
    pthread_mutex_unlock(&plan_mutex);
    gm_free(in), gm_free(spec);
    if (!fe->plan) {
        gm_free(fe);
        return gm_error_set(err, GM_ERR_NOMEM, "audio feature extractor: FFTW could not make a %d-point plan\nhint: free memory", s->fft);
    }
    *out = fe;
    return GM_OK;
}

gm_status gm_audio_fe_new(gm_audio_fe **out, gm_error *err) { return gm_audio_fe_new_kind(GM_AUDIO_FE_GEMMA3N, out, err); }

void gm_audio_fe_free(gm_audio_fe *fe) {
    if (!fe) return;
    pthread_mutex_lock(&plan_mutex);
    fftw_destroy_plan(fe->plan);
    pthread_mutex_unlock(&plan_mutex);
    gm_free(fe);
}

const float *gm_audio_fe_window(const gm_audio_fe *fe) { return fe->window; }

gm_audio_fe_kind gm_audio_fe_get_kind(const gm_audio_fe *fe) { return fe->kind; }

/* One frame: the frame + 1 samples x[0..frame] (zeros outside the clip, already in x) -> 128
 * log-mels. buf (fft doubles) and spec (nbins complex doubles) are the caller's scratch. */
static void frame_logmel(const gm_audio_fe *fe, const float *x, double *buf, fftw_complex *spec, float *out) {
    const fe_spec *s = fe->s;
    if (s->preemph > 0) {
        /* HTK pre-emphasis: frames_to_process[..., :1] * (1 - p), then [1:-1] - p * [:-2]; the
         * window product in f32; the FFT's input holds those f32 values exactly */
        const float c0 = (float)(1.0 - s->preemph), c1 = (float)s->preemph;
        buf[0] = (double)((x[0] * c0) * fe->window[0]);
        for (int n = 1; n < s->frame; n++) {
            float y = x[n] - c1 * x[n - 1];
            buf[n] = (double)(y * fe->window[n]);
        }
    } else {
        /* frames_to_process[..., :-1] * window, f32 */
        for (int n = 0; n < s->frame; n++) buf[n] = (double)(x[n] * fe->window[n]);
    }
    memset(buf + s->frame, 0, (size_t)(s->fft - s->frame) * sizeof(double)); /* rfft(n=fft) pads */
    fftw_execute_dft_r2c(fe->plan, buf, spec);
    /* complex64 of the f64 result, then np.abs: hypotf of the rounded components */
    float mag[MAX_NBINS];
    for (int k = 0; k < fe->nbins; k++) mag[k] = hypotf((float)spec[k][0], (float)spec[k][1]);
    for (int m = 0; m < GM_AUDIO_MELS; m++) {
        double sum = 0.0;
        for (int k = fe->lo[m]; k < fe->hi[m]; k++) sum += (double)mag[k] * fe->fb[k][m];
        out[m] = (float)log(s->floor_add ? sum + s->mel_floor : sum > s->mel_floor ? sum : s->mel_floor);
    }
}

gm_status gm_audio_features_compute(const gm_audio_fe *fe, const float *const *clips, const int64_t *lens, int64_t B,
                                    gm_audio_features *out, gm_error *err) {
    GM_ASSERT(fe && out && (B <= 0 || (clips && lens)));
    const fe_spec *s = fe->s;
    if (B < 1 || B > (1 << 20))
        return gm_error_set(err, GM_ERR_INVALID, "audio features: a batch of %lld clips (1 .. %d)", (long long)B, 1 << 20);
    int64_t longest = 0;
    for (int64_t b = 0; b < B; b++) {
        if (lens[b] < 0 || (lens[b] > 0 && !clips[b]))
            return gm_error_set(err, GM_ERR_INVALID, "audio features: clip %lld has %lld samples%s", (long long)b, (long long)lens[b],
                                lens[b] < 0 ? "" : " and no data");
        if (lens[b] > longest) longest = lens[b];
    }
    int64_t L, T;
    /* _truncate to 480,000, padding "longest" to a multiple of 128, then the kind's frames */
    gm_audio_frames_kind(fe->kind, longest, &L, &T);
    gm_audio_features f = {.B = B, .T = T, .n_mels = GM_AUDIO_MELS, .padded_len = L};
    const int64_t U = s->frame + 1; /* the unfold's frame: frame_length + 1 samples */
    double *buf = NULL;
    float *x = NULL;
    fftw_complex *spec = NULL;
    if (T > 0) {
        f.data = gm_malloc((size_t)(B * T * GM_AUDIO_MELS) * sizeof(float));
        f.mask = gm_malloc((size_t)(B * T));
        buf = gm_malloc((size_t)s->fft * sizeof(double));
        x = gm_malloc((size_t)U * sizeof(float));
        spec = gm_malloc((size_t)fe->nbins * sizeof(fftw_complex));
        if (!f.data || !f.mask || !buf || !x || !spec) {
            gm_free(f.data), gm_free(f.mask), gm_free(buf), gm_free(x), gm_free(spec);
            return gm_error_set(err, GM_ERR_NOMEM, "audio features: out of memory for %lld x %lld x %d features\nhint: free memory",
                                (long long)B, (long long)T, GM_AUDIO_MELS);
        }
    }
    for (int64_t b = 0; b < B; b++) {
        /* the clip as _truncate left it (T's frames all end before sample 480,000 anyway) */
        int64_t n = lens[b] < GM_AUDIO_MAX_SAMPLES ? lens[b] : GM_AUDIO_MAX_SAMPLES;
        for (int64_t t = 0; t < T; t++) {
            /* the left-padded, right-padded clip's samples [t hop, t hop + U), in the clip's own
             * coordinates [start, start + U): zeros before 0 (the left padding) and from n on */
            int64_t start = t * s->hop - s->left_pad;
            int64_t lo = start < 0 ? -start : 0, hi = n - start < U ? n - start : U;
            if (hi < lo) hi = lo;
            memset(x, 0, (size_t)lo * sizeof(float));
            if (hi > lo) memcpy(x + lo, clips[b] + start + lo, (size_t)(hi - lo) * sizeof(float));
            memset(x + hi, 0, (size_t)(U - hi) * sizeof(float));
            float *o = f.data + (b * T + t) * GM_AUDIO_MELS;
            frame_logmel(fe, x, buf, spec, o);
            /* the padded attention mask at the frame's sample mask_at (3n: attention_mask[::160]:
             * its first; Gemma 4: frame_end_indices, its 321st) */
            uint8_t valid = start + s->mask_at < n;
            f.mask[b * T + t] = valid;
            if (s->zero_masked)
                for (int m = 0; m < GM_AUDIO_MELS; m++) o[m] *= (float)valid; /* f32 times bool: -0 for negatives */
        }
    }
    gm_free(buf), gm_free(x), gm_free(spec);
    *out = f;
    return GM_OK;
}

gm_status gm_audio_features_file(const gm_audio_fe *fe, const char *path, const gm_audio_limits *limits,
                                 gm_audio_features *out, gm_error *err) {
    gm_audio a = {0};
    GM_TRY(gm_audio_load(path, limits, &a, err));
    const float *clip = a.samples;
    gm_status s = gm_audio_features_compute(fe, &clip, &a.n, 1, out, err);
    gm_audio_free(&a);
    return s;
}

void gm_audio_features_free(gm_audio_features *f) {
    if (!f) return;
    gm_free(f->data), gm_free(f->mask);
    *f = (gm_audio_features){0};
}

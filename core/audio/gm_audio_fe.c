/*
 * gm_audio_fe.c - the log-mel features of transformers' Gemma3nAudioFeatureExtractor
 * (models/gemma3n/feature_extraction_gemma3n.py, transformers 5.24), FFT by FFTW.
 *
 * How: the extractor object holds what depends on nothing but the defaults - the window, the mel
 * filter bank, one FFTW plan - and gm_audio_features_compute runs the extractor's
 * _extract_spectrogram frame by frame on each clip of the batch, reading the padded samples where
 * they are (a frame past a clip's end reads zeros) instead of building the padded batch.
 *
 * Arithmetic, step by step as numpy 2.4 does it (NEP 50: a Python float times an f32 array is an
 * f32 operation, the float rounded to f32 first):
 *   window   f32: 0.5f * (1 - cosf(f32(2 pi) * n / 512)); numpy's own f32 cos and glibc's cosf may
 *            differ in the last bit (test_audio compares the window with numpy's);
 *   frames   f32 pre-emphasis and window products, as written in gm_audio.h;
 *   FFT      numpy 2.4's rfft of an f32 array runs pocketfft's f64 loop and rounds the result to
 *            complex64 (np.fft.rfft(x32) == np.fft.rfft(x32.astype(f64)).astype(complex64), bit for
 *            bit on the fixtures' frames); ours is FFTW's f64 r2c, each component then rounded to
 *            f32: the same transform, f64 roundings apart (see TOL_AUDIO_LOGMEL_ABS);
 *   |X|      np.abs of complex64 is hypotf;
 *   mel      f32 magnitudes times the f64 filter bank: np.matmul promotes to f64;
 *   log      np.log(np.maximum(mel, 1e-5)) in f64, then .astype(np.float32).
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
#include <string.h>

#define NBINS (GM_AUDIO_FFT / 2 + 1) /* 513 rfft bins */

/* The extractor's defaults that only this file uses (Gemma3nAudioFeatureExtractor.__init__). */
#define MEL_FMIN 125.0
#define MEL_FMAX 7600.0
#define PREEMPHASIS 0.97
#define MEL_FLOOR 1e-5

static pthread_mutex_t plan_mutex = PTHREAD_MUTEX_INITIALIZER;

struct gm_audio_fe {
    float window[GM_AUDIO_FRAME];
    double fb[NBINS][GM_AUDIO_MELS]; /* create_fb_matrix(513, 125, 7600, 128, 16000, 1024), (bins, mels) */
    int lo[GM_AUDIO_MELS], hi[GM_AUDIO_MELS]; /* the bins [lo, hi) where filter m is not zero */
    fftw_plan plan; /* 1024-point r2c, double */
};

/* create_fb_matrix of feature_extraction_gemma3n.py, in its order of operations:
 *   all_freqs[k] = f32(k) * f32(16000 / 1024)                        (exact: k * 15.625)
 *   m_min, m_max = 2595 log10(1 + f / 700) of 125 and 7600 Hz         (Python floats)
 *   m_pts = np.linspace(m_min, m_max, 130): i * step + m_min, the last = m_max
 *   f_pts = 700 (10^(m_pts / 2595) - 1); f_diff = f_pts[1:] - f_pts[:-1]
 *   fb[k][m] = max(0, min(-(f_pts[m] - f[k]) / f_diff[m], (f_pts[m+2] - f[k]) / f_diff[m+1])) */
static void make_filter_bank(gm_audio_fe *fe) {
    enum { NP = GM_AUDIO_MELS + 2 };
    double m_min = 2595.0 * log10(1.0 + MEL_FMIN / 700.0), m_max = 2595.0 * log10(1.0 + MEL_FMAX / 700.0);
    double step = (m_max - m_min) / (NP - 1), f_pts[NP], f_diff[NP - 1];
    for (int i = 0; i < NP; i++) {
        double m = i == NP - 1 ? m_max : (double)i * step + m_min;
        f_pts[i] = 700.0 * (pow(10.0, m / 2595.0) - 1.0);
    }
    for (int i = 0; i < NP - 1; i++) f_diff[i] = f_pts[i + 1] - f_pts[i];
    for (int m = 0; m < GM_AUDIO_MELS; m++) fe->lo[m] = NBINS, fe->hi[m] = 0;
    for (int k = 0; k < NBINS; k++) {
        double f = (double)((float)k * (float)((double)GM_AUDIO_RATE / GM_AUDIO_FFT));
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

gm_status gm_audio_fe_new(gm_audio_fe **out, gm_error *err) {
    GM_ASSERT(out);
    gm_audio_fe *fe = gm_calloc(1, sizeof *fe);
    double *in = gm_malloc(GM_AUDIO_FFT * sizeof(double));
    fftw_complex *spec = gm_malloc(NBINS * sizeof(fftw_complex));
    if (!fe || !in || !spec) {
        gm_free(fe), gm_free(in), gm_free(spec);
        return gm_error_set(err, GM_ERR_NOMEM, "audio feature extractor: out of memory\nhint: free memory");
    }
    /* hann_arange f32; 2 * np.pi * n is (2 pi rounded to f32) * n in f32; / 512 is exact */
    const float two_pi = (float)(2.0 * M_PI);
    for (int n = 0; n < GM_AUDIO_FRAME; n++) {
        float a = two_pi * (float)n / (float)GM_AUDIO_FRAME;
        fe->window[n] = 0.5f * (1.0f - cosf(a));
    }
    make_filter_bank(fe);
    /* FFTW_ESTIMATE never writes the arrays it plans on; they only give the plan its strides */
    pthread_mutex_lock(&plan_mutex);
    fe->plan = fftw_plan_dft_r2c_1d(GM_AUDIO_FFT, in, spec, FFTW_ESTIMATE | FFTW_UNALIGNED);
    pthread_mutex_unlock(&plan_mutex);
    gm_free(in), gm_free(spec);
    if (!fe->plan) {
        gm_free(fe);
        return gm_error_set(err, GM_ERR_NOMEM, "audio feature extractor: FFTW could not make a %d-point plan\nhint: free memory",
                            GM_AUDIO_FFT);
    }
    *out = fe;
    return GM_OK;
}

void gm_audio_fe_free(gm_audio_fe *fe) {
    if (!fe) return;
    pthread_mutex_lock(&plan_mutex);
    fftw_destroy_plan(fe->plan);
    pthread_mutex_unlock(&plan_mutex);
    gm_free(fe);
}

const float *gm_audio_fe_window(const gm_audio_fe *fe) { return fe->window; }

/* One frame: the 513 samples x[0..512] (zeros past the clip, already in x) -> 128 log-mels.
 * buf (1024 doubles) and spec (513 complex doubles) are the caller's scratch. */
static void frame_logmel(const gm_audio_fe *fe, const float *x, double *buf, fftw_complex *spec, float *out) {
    const float c0 = (float)(1.0 - PREEMPHASIS), c1 = (float)PREEMPHASIS;
    /* HTK pre-emphasis: frames_to_process[..., :1] * (1 - 0.97), then [1:-1] - 0.97 * [:-2]; the
     * window product in f32; the FFT's input holds those f32 values exactly */
    buf[0] = (double)((x[0] * c0) * fe->window[0]);
    for (int n = 1; n < GM_AUDIO_FRAME; n++) {
        float y = x[n] - c1 * x[n - 1];
        buf[n] = (double)(y * fe->window[n]);
    }
    memset(buf + GM_AUDIO_FRAME, 0, (GM_AUDIO_FFT - GM_AUDIO_FRAME) * sizeof(double)); /* rfft(n=1024) pads */
    fftw_execute_dft_r2c(fe->plan, buf, spec);
    /* complex64 of the f64 result, then np.abs: hypotf of the rounded components */
    float mag[NBINS];
    for (int k = 0; k < NBINS; k++) mag[k] = hypotf((float)spec[k][0], (float)spec[k][1]);
    for (int m = 0; m < GM_AUDIO_MELS; m++) {
        double s = 0.0;
        for (int k = fe->lo[m]; k < fe->hi[m]; k++) s += (double)mag[k] * fe->fb[k][m];
        out[m] = (float)log(s > MEL_FLOOR ? s : MEL_FLOOR);
    }
}

gm_status gm_audio_features_compute(const gm_audio_fe *fe, const float *const *clips, const int64_t *lens, int64_t B,
                                    gm_audio_features *out, gm_error *err) {
    GM_ASSERT(fe && out && (B <= 0 || (clips && lens)));
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
    gm_audio_frames(longest, &L, &T); /* _truncate to 480,000, padding "longest" to a multiple of 128 */
    gm_audio_features f = {.B = B, .T = T, .n_mels = GM_AUDIO_MELS, .padded_len = L};
    double *buf = NULL;
    float *x = NULL;
    fftw_complex *spec = NULL;
    if (T > 0) {
        f.data = gm_malloc((size_t)(B * T * GM_AUDIO_MELS) * sizeof(float));
        f.mask = gm_malloc((size_t)(B * T));
        buf = gm_malloc(GM_AUDIO_FFT * sizeof(double));
        x = gm_malloc((GM_AUDIO_FRAME + 1) * sizeof(float));
        spec = gm_malloc(NBINS * sizeof(fftw_complex));
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
            int64_t start = t * GM_AUDIO_HOP;
            /* the padded clip's samples [start, start + 513): the clip, then zeros */
            int64_t have = n - start < 0 ? 0 : n - start > GM_AUDIO_FRAME + 1 ? GM_AUDIO_FRAME + 1 : n - start;
            if (have > 0) memcpy(x, clips[b] + start, (size_t)have * sizeof(float));
            memset(x + have, 0, (size_t)(GM_AUDIO_FRAME + 1 - have) * sizeof(float));
            frame_logmel(fe, x, buf, spec, f.data + (b * T + t) * GM_AUDIO_MELS);
            /* attention_mask[::160][:T]: the frame's first sample is the clip's */
            f.mask[b * T + t] = start < n;
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

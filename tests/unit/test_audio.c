/*
 * test_audio.c - core/audio against soundfile + samplerate + transformers 5.24's
 * Gemma3nAudioFeatureExtractor: a real recording (Debian's asterisk-core-sounds-en-wav, 8 kHz
 * 16-bit WAV) decoded and converted to 16 kHz; a generated stereo 44.1 kHz clip as WAV, FLAC and Ogg
 * Vorbis averaged and converted; the extractor's window, log-mel features and frame mask on the real
 * clips alone and as a padded batch, and on generated clips around the frame, padding and 30 s
 * boundaries (truncation); every bad file's error (written here: empty, not audio, truncated WAV and
 * FLAC, a WAV header claiming 2^31 frames, a file over the limit by its header and one over it only
 * by its content, ...) names the file and the reason, leaves the output untouched and leaks nothing;
 * the limit checked before allocating; allocation failures at every point; one extractor used by four
 * threads at once.
 *
 * Reference: tests/ref/audio_ref.h5 and tests/ref/audio/, written by tests/ref/make_audio_ref.py
 * (tests/ref/README.md). Without the Debian package the real-clip checks cannot run: the test then
 * skips, except under CI, where it fails (setup.sh installs the package).
 */
#include "test_util.h"

#include "gm_alloc.h"
#include "gm_audio.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <sndfile.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ALLISON "/usr/share/asterisk/sounds/en_US_f_Allison"

static char REF[1024];
static char REF4[1024]; /* tests/ref/gemma4_audio_fe_ref.h5 */
static char TMP[256];
static bool allison_missing;

/* ---- helpers ---------------------------------------------------------------------------------- */

static const char *ref_audio(const char *name) {
    static char buf[2048];
    snprintf(buf, sizeof buf, "%.1500s/tests/ref/audio/%.300s", GM_SOURCE_DIR, name);
    return buf;
}

static const char *tmp_path(const char *name) {
    static char buf[2][512];
    static int k;
    k ^= 1;
    snprintf(buf[k], sizeof buf[k], "%s/%s", TMP, name);
    return buf[k];
}

static int64_t attr_i(const char *obj, const char *name) {
    double v = -1;
    bool ok = gm_test_h5_attr_double(REF, obj, name, &v);
    CHECK(ok, "%s: no attribute %s on %s", REF, name, obj);
    return (int64_t)v;
}

static int64_t attr_i4(const char *obj, const char *name) {
    double v = -1;
    bool ok = gm_test_h5_attr_double(REF4, obj, name, &v);
    CHECK(ok, "%s: no attribute %s on %s", REF4, name, obj);
    return (int64_t)v;
}

/* The fixture's sample generator (make_audio_ref.py lcg_clip): exact in f32 on both sides. */
static float *lcg_clip(int64_t n, uint32_t seed) {
    float *x = gm_malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    uint32_t s = seed;
    for (int64_t k = 0; k < n; k++) {
        x[k] = (float)(((int64_t)(s >> 16) - 32768) / 65536.0);
        s = 1664525u * s + 1013904223u;
    }
    return x;
}

static void sha256_hex_file(const char *path, char hex[65]) {
    FILE *f = fopen(path, "rb");
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    EVP_DigestInit_ex(c, EVP_sha256(), NULL);
    unsigned char buf[8192], md[32];
    size_t n;
    while (f && (n = fread(buf, 1, sizeof buf, f)) > 0) EVP_DigestUpdate(c, buf, n);
    if (f) fclose(f);
    unsigned len = 0;
    EVP_DigestFinal_ex(c, md, &len);
    EVP_MD_CTX_free(c);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

/* Max |a - b| over n floats (also counts bit-identical elements into *same when not NULL). */
static double max_diff(const float *a, const float *b, size_t n, size_t *same) {
    double w = 0;
    size_t eq = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > w || d != d) w = d != d ? INFINITY : d;
        eq += memcmp(a + i, b + i, 4) == 0;
    }
    if (same) *same = eq;
    return w;
}

/* A canonical 44-byte WAV header: PCM, `bits` per sample, the given RIFF and data sizes. */
static void wav_header(uint8_t h[44], int ch, int rate, int bits, uint32_t riff, uint32_t data) {
    uint32_t v;
    uint16_t s;
    memcpy(h, "RIFF", 4), memcpy(h + 4, &riff, 4), memcpy(h + 8, "WAVEfmt ", 8);
    v = 16, memcpy(h + 16, &v, 4);
    s = 1, memcpy(h + 20, &s, 2);
    s = (uint16_t)ch, memcpy(h + 22, &s, 2);
    v = (uint32_t)rate, memcpy(h + 24, &v, 4);
    v = (uint32_t)((uint64_t)rate * (uint64_t)(ch * bits / 8)), memcpy(h + 28, &v, 4); /* bytes/s: wraps for absurd rates */
    s = (uint16_t)(ch * bits / 8), memcpy(h + 32, &s, 2);
    s = (uint16_t)bits, memcpy(h + 34, &s, 2);
    memcpy(h + 36, "data", 4), memcpy(h + 40, &data, 4);
}

/* Writes a WAV: the header with the given sizes, then `payload` bytes of a sawtooth. */
static void write_wav(const char *path, int ch, int rate, int bits, uint32_t riff, uint32_t data, size_t payload) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    uint8_t h[44];
    wav_header(h, ch, rate, bits, riff, data);
    fwrite(h, 1, 44, f);
    for (size_t i = 0; i < payload; i++) fputc((int)((i * 37) & 0xff), f);
    fclose(f);
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    if (n) fwrite(p, 1, n, f);
    fclose(f);
}

/* A FLAC file of `frames` mono 16-bit frames at `rate` (libsndfile writes it); returns its size. */
static long write_flac(const char *path, int rate, int64_t frames) {
    SF_INFO info = {.samplerate = rate, .channels = 1, .format = SF_FORMAT_FLAC | SF_FORMAT_PCM_16};
    SNDFILE *sf = sf_open(path, SFM_WRITE, &info);
    CHECK(sf != NULL, "libsndfile cannot write %s: %s", path, sf_strerror(NULL));
    if (!sf) return 0;
    float *x = lcg_clip(frames, 99);
    sf_writef_float(sf, x, frames);
    sf_close(sf);
    gm_free(x);
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : 0;
}

/* ---- decoding -------------------------------------------------------------------------------------- */

/* The real recordings: decode + convert to 16 kHz vs soundfile + samplerate.resample. */
static void test_real_clips(void) {
    static const char *clips[] = {"hello-world.wav", "vm-goodbye.wav"};
    for (int i = 0; i < 2; i++) {
        char path[512], grp[256], ds[300];
        snprintf(path, sizeof path, "%s/%s", ALLISON, clips[i]);
        snprintf(grp, sizeof grp, "/clips/%s", clips[i]);
        if (!gm_test_file_exists(path)) {
            printf("skip  %s: not installed (Debian package asterisk-core-sounds-en-wav; setup.sh installs it)\n", path);
            allison_missing = true;
            continue;
        }
        char want[65] = "", *sha = gm_test_h5_attr_string(REF, grp, "sha256");
        sha256_hex_file(path, want);
        CHECK(sha && strcmp(sha, want) == 0, "%s: sha256 %s, the fixture was made from %s", path, want, sha ? sha : "?");
        gm_free(sha);
        gm_error err = {0};
        gm_audio a = {0};
        CHECK_OK(gm_audio_load(path, NULL, &a, &err), &err);
        snprintf(ds, sizeof ds, "%s/samples16k", grp);
        size_t n = 0;
        float *ref = gm_test_h5_read(REF, ds, 0, &n, NULL, NULL);
        CHECK(a.src_rate == attr_i(grp, "src_rate") && a.src_frames == attr_i(grp, "src_frames") &&
                  a.src_channels == attr_i(grp, "src_channels"),
              "%s: %d Hz, %lld frames, %d channels", clips[i], a.src_rate, (long long)a.src_frames, a.src_channels);
        CHECK(ref && a.n == (int64_t)n, "%s: %lld samples at 16 kHz, samplerate.resample gave %zu", clips[i], (long long)a.n, n);
        if (ref && a.n == (int64_t)n) {
            size_t same = 0;
            double d = max_diff(a.samples, ref, n, &same);
            printf("%s: %lld samples at 16 kHz, max |ours - samplerate| %.3g (%zu of %zu bit-identical)\n", clips[i], (long long)a.n, d,
                   same, n);
            gm_check_close(clips[i], a.samples, ref, n, TOL_AUDIO_DECODE_ABS, 0);
        }
        gm_free(ref);
        gm_audio_free(&a);
    }
}

/* The generated stereo 44.1 kHz clip in three containers: averaged to mono, converted to 16 kHz. */
static void test_stereo(void) {
    static const char *files[] = {"stereo44k.wav", "stereo44k.flac", "stereo44k.ogg"};
    float *wav = NULL;
    int64_t wav_n = 0;
    for (int i = 0; i < 3; i++) {
        char grp[256], ds[300];
        snprintf(grp, sizeof grp, "/stereo/%s", files[i]);
        snprintf(ds, sizeof ds, "%s/samples16k", grp);
        gm_error err = {0};
        gm_audio a = {0};
        CHECK_OK(gm_audio_load(ref_audio(files[i]), NULL, &a, &err), &err);
        size_t n = 0;
        float *ref = gm_test_h5_read(REF, ds, 0, &n, NULL, NULL);
        CHECK(a.src_rate == 44100 && a.src_channels == 2 && a.src_frames == attr_i(grp, "src_frames"), "%s: %d Hz, %d channels, %lld frames",
              files[i], a.src_rate, a.src_channels, (long long)a.src_frames);
        CHECK(ref && a.n == (int64_t)n, "%s: %lld samples at 16 kHz, the reference %zu", files[i], (long long)a.n, n);
        if (ref && a.n == (int64_t)n) {
            size_t same = 0;
            double d = max_diff(a.samples, ref, n, &same);
            printf("%s: %lld samples at 16 kHz, max |ours - soundfile/samplerate| %.3g (%zu of %zu bit-identical)\n", files[i],
                   (long long)a.n, d, same, n);
            gm_check_close(files[i], a.samples, ref, n, TOL_AUDIO_DECODE_ABS, 0);
        }
        /* FLAC is lossless: the same samples as the WAV */
        if (i == 0) wav = a.samples, wav_n = a.n, a.samples = NULL;
        if (i == 1) CHECK(wav && a.n == wav_n && memcmp(a.samples, wav, (size_t)a.n * 4) == 0, "FLAC and WAV decode differently");
        /* the same bytes from memory decode the same */
        if (i == 2) {
            FILE *f = fopen(ref_audio(files[i]), "rb");
            uint8_t *buf = gm_malloc(1 << 20);
            size_t nb = f && buf ? fread(buf, 1, 1 << 20, f) : 0;
            if (f) fclose(f);
            gm_audio m = {0};
            CHECK_OK(gm_audio_decode(buf, nb, "stereo44k.ogg (memory)", NULL, &m, &err), &err);
            CHECK(m.n == a.n && m.samples && memcmp(m.samples, a.samples, (size_t)a.n * 4) == 0, "ogg from memory differs from the file");
            gm_audio_free(&m);
            gm_free(buf);
        }
        gm_free(ref);
        gm_audio_free(&a);
    }
    gm_free(wav);
}

/* Every bad file: the status, the file named, the reason, *out untouched, nothing leaked. */
static void expect_error(const char *path, const gm_audio_limits *lim, gm_status want, const char *why) {
    uint64_t live = gm_alloc_get_stats().bytes_live;
    gm_audio a = {.n = -7};
    gm_error err = {0};
    gm_status s = gm_audio_load(path, lim, &a, &err);
    CHECK(s == want && gm_test_contains(err.msg, path) && gm_test_contains(err.msg, why) && gm_test_contains(err.msg, "hint:"),
          "%s: %s (want %s with \"%s\"): %s", path, gm_status_name(s), gm_status_name(want), why, err.msg);
    CHECK(a.n == -7 && a.samples == NULL, "%s: the output was written on failure", path);
    gm_audio_free(&a);
    CHECK(gm_alloc_get_stats().bytes_live == live, "%s: leaked %lld bytes", path, (long long)(gm_alloc_get_stats().bytes_live - live));
    const char *first = strchr(err.msg, '\n');
    printf("  %s -> %s: %.*s\n", strrchr(path, '/') + 1, gm_status_name(s), first ? (int)(first - err.msg) : (int)strlen(err.msg),
           err.msg + (strncmp(err.msg, path, strlen(path)) == 0 ? strlen(path) + 2 : 0));
}

static void test_bad_files(void) {
    printf("bad files:\n");
    /* empty, not audio, a folder, a missing file */
    write_bytes(tmp_path("empty.wav"), "", 0);
    expect_error(tmp_path("empty.wav"), NULL, GM_ERR_FORMAT, "empty file (0 bytes)");
    const char *text = "id,label\n1,cat\n2,dog\n";
    write_bytes(tmp_path("notes.wav"), text, strlen(text));
    expect_error(tmp_path("notes.wav"), NULL, GM_ERR_UNSUPPORTED, "not an audio file: this looks like text");
    write_bytes(tmp_path("picture.flac"), "\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16);
    expect_error(tmp_path("picture.flac"), NULL, GM_ERR_UNSUPPORTED, "this looks like a PNG image");
    uint8_t junk[64];
    for (int i = 0; i < 64; i++) junk[i] = (uint8_t)(i * 151 + 7);
    write_bytes(tmp_path("junk.ogg"), junk, sizeof junk);
    expect_error(tmp_path("junk.ogg"), NULL, GM_ERR_UNSUPPORTED, "not an audio format libsndfile reads");
    expect_error(TMP, NULL, GM_ERR_IO, "is a folder");
    expect_error(tmp_path("missing.wav"), NULL, GM_ERR_IO, "cannot open");
    /* truncated WAV: the data chunk promises 2,000 bytes, the file holds 1,000 */
    write_wav(tmp_path("truncated.wav"), 1, 8000, 16, 36 + 2000, 2000, 1000);
    expect_error(tmp_path("truncated.wav"), NULL, GM_ERR_FORMAT, "the header promises 2000 bytes of samples (0.1 s), the file holds 1000");
    /* a header claiming 2^31 frames (8-bit mono: one byte a frame) over 1,000 bytes */
    write_wav(tmp_path("lying_2g.wav"), 1, 8000, 8, 0xFFFFFFF0u, 0x80000000u, 1000);
    expect_error(tmp_path("lying_2g.wav"), NULL, GM_ERR_FORMAT, "the header promises 2147483648 bytes of samples (74.6 hours)");
    /* a data size of 0xFFFFFFFF ("unknown": the writer could not seek back) is read to the end */
    {
        write_wav(tmp_path("unknown_size.wav"), 1, 8000, 16, 0xFFFFFFFFu, 0xFFFFFFFFu, 2000);
        gm_audio a = {0};
        gm_error err = {0};
        CHECK_OK(gm_audio_load(tmp_path("unknown_size.wav"), NULL, &a, &err), &err);
        CHECK(a.src_frames == 1000 && a.n == 2000, "unknown_size.wav: %lld frames, %lld samples at 16 kHz", (long long)a.src_frames,
              (long long)a.n);
        gm_audio_free(&a);
    }
    /* header only: a data chunk of 0 bytes */
    write_wav(tmp_path("no_samples.wav"), 1, 8000, 16, 36, 0, 0);
    expect_error(tmp_path("no_samples.wav"), NULL, GM_ERR_FORMAT, "no audio in the file (0 frames)");
    /* a sample rate no converter takes (2 GHz) and one too low */
    write_wav(tmp_path("rate_2ghz.wav"), 1, 2000000000, 16, 36 + 200, 200, 200);
    expect_error(tmp_path("rate_2ghz.wav"), NULL, GM_ERR_UNSUPPORTED, "sample rate 2000000000 Hz, outside 1000..768000 Hz");
    write_wav(tmp_path("rate_100.wav"), 1, 100, 16, 36 + 200, 200, 200);
    expect_error(tmp_path("rate_100.wav"), NULL, GM_ERR_UNSUPPORTED, "sample rate 100 Hz");
    /* longer than the default 10 minutes, by its (honest) header: 11 minutes at 16 kHz, a sparse
     * file (21 MB that take no disk): refused before anything the size of the samples is allocated */
    {
        const char *p = tmp_path("eleven_minutes.wav");
        uint32_t bytes = 11 * 60 * 16000 * 2;
        write_wav(p, 1, 16000, 16, 36 + bytes, bytes, 0);
        CHECK(truncate(p, 44 + (off_t)bytes) == 0, "cannot extend %s", p);
        gm_alloc_reset_counters();
        uint64_t live = gm_alloc_get_stats().bytes_live;
        expect_error(p, NULL, GM_ERR_LIMIT, "11.0 min of audio (10560000 frames at 16000 Hz), longer than the limit of 10.0 min");
        uint64_t peak = gm_alloc_get_stats().bytes_peak;
        CHECK(peak - live < 65536, "the 11-minute file allocated %llu bytes before its refusal", (unsigned long long)(peak - live));
        /* the same file within a raised limit reads whole */
        gm_audio a = {0};
        gm_error err = {0};
        gm_audio_limits lim = {.max_seconds = 700};
        CHECK_OK(gm_audio_load(p, &lim, &a, &err), &err);
        CHECK(a.n == 11 * 60 * 16000 && a.src_frames == a.n, "11 minutes at 16 kHz gave %lld samples", (long long)a.n);
        gm_audio_free(&a);
    }
    /* over a lower limit by its header (2 s, limit 1 s) */
    gm_audio_limits one_s = {.max_seconds = 1};
    write_wav(tmp_path("two_seconds.wav"), 1, 8000, 16, 36 + 32000, 32000, 32000);
    expect_error(tmp_path("two_seconds.wav"), &one_s, GM_ERR_LIMIT, "2.0 s of audio (16000 frames at 8000 Hz), longer than the limit of 1.0 s");
    /* over it only by its content: a FLAC whose STREAMINFO gives no length (total samples 0) */
    {
        const char *p = tmp_path("no_length.flac");
        long sz = write_flac(p, 8000, 16000);
        FILE *f = fopen(p, "r+b");
        uint8_t si[26];
        bool ok = f && sz > 42 && fread(si, 1, sizeof si, f) == sizeof si && memcmp(si, "fLaC", 4) == 0;
        CHECK(ok, "%s: not a FLAC", p);
        if (ok) {
            /* STREAMINFO's data starts at byte 8 ("fLaC", a block header); its 36-bit total sample
             * count is the low 4 bits of its byte 13, then bytes 14..17 */
            si[8 + 13] &= 0xF0, memset(si + 8 + 14, 0, 4);
            fseek(f, 0, SEEK_SET), fwrite(si, 1, sizeof si, f);
        }
        if (f) fclose(f);
        expect_error(p, &one_s, GM_ERR_LIMIT, "longer than the limit of 1.0 s (stopped reading after 1.0 s; the header gives no length)");
        /* a truncated FLAC: half the file */
        long full = write_flac(tmp_path("whole.flac"), 8000, 16000);
        FILE *a = fopen(tmp_path("whole.flac"), "rb");
        uint8_t *buf = gm_malloc((size_t)full);
        size_t got = a && buf ? fread(buf, 1, (size_t)full, a) : 0;
        if (a) fclose(a);
        write_bytes(tmp_path("truncated.flac"), buf, got / 2);
        expect_error(tmp_path("truncated.flac"), NULL, GM_ERR_FORMAT, "frames");
        gm_free(buf);
    }
    /* a float WAV holding a NaN (written by libsndfile) */
    {
        SF_INFO info = {.samplerate = 16000, .channels = 2, .format = SF_FORMAT_WAV | SF_FORMAT_FLOAT};
        SNDFILE *sf = sf_open(tmp_path("nan.wav"), SFM_WRITE, &info);
        CHECK(sf != NULL, "libsndfile cannot write nan.wav: %s", sf_strerror(NULL));
        if (sf) {
            float x[2 * 3200] = {0};
            x[2 * 1600 + 1] = NAN; /* frame 1600, right channel: 0.1 s */
            sf_writef_float(sf, x, 3200);
            sf_close(sf);
        }
        expect_error(tmp_path("nan.wav"), NULL, GM_ERR_FORMAT, "frame 1600 (at 0.100 s) is not a finite number (NaN or infinity)");
    }
    /* a truncated Ogg Vorbis: libsndfile finds no end */
    {
        FILE *f = fopen(ref_audio("stereo44k.ogg"), "rb");
        uint8_t *buf = gm_malloc(1 << 20);
        size_t got = f && buf ? fread(buf, 1, 1 << 20, f) : 0;
        if (f) fclose(f);
        write_bytes(tmp_path("truncated.ogg"), buf, got / 2);
        expect_error(tmp_path("truncated.ogg"), NULL, GM_ERR_FORMAT, "truncated: the Ogg stream ends before its end-of-stream page");
        /* cut inside the Vorbis headers: libsndfile 1.2.0 refuses it but leaks libvorbis's info
         * block (5.8 KB a file; tests/sanitizers/lsan.supp) */
        write_bytes(tmp_path("ogg_headers_cut.ogg"), buf, 2000);
        expect_error(tmp_path("ogg_headers_cut.ogg"), NULL, GM_ERR_FORMAT, "malformed audio file");
        /* from memory: named by the name given */
        gm_audio m = {0};
        gm_error err = {0};
        gm_status s = gm_audio_decode(buf, got / 2, "clip 17 of train.jsonl", NULL, &m, &err);
        CHECK(s == GM_ERR_FORMAT && gm_test_contains(err.msg, "clip 17 of train.jsonl") && m.samples == NULL, "memory: %s", err.msg);
        s = gm_audio_decode(buf, 0, "nothing", NULL, &m, &err);
        CHECK(s == GM_ERR_FORMAT && gm_test_contains(err.msg, "nothing: empty file"), "memory, 0 bytes: %s", err.msg);
        gm_free(buf);
    }
}

/* Allocation failures at every point of a load with conversion and of the features: GM_ERR_NOMEM
 * with a message, nothing leaked. */
static void test_alloc_failures(gm_audio_fe *fe) {
    int runs = 0, nomem = 0;
    for (uint64_t k = 1; k < 200; k++) {
        uint64_t live = gm_alloc_get_stats().bytes_live;
        gm_alloc_fail_after(k);
        gm_audio_features f = {0};
        gm_error err = {0};
        gm_status s = gm_audio_features_file(fe, ref_audio("stereo44k.flac"), NULL, &f, &err);
        bool pending = gm_alloc_fail_pending();
        gm_alloc_fail_after(0);
        runs++, nomem += s == GM_ERR_NOMEM;
        CHECK(s == GM_OK || (s == GM_ERR_NOMEM && gm_test_contains(err.msg, "out of memory")), "allocation %llu failing: %s: %s",
              (unsigned long long)k, gm_status_name(s), err.msg);
        gm_audio_features_free(&f);
        CHECK(gm_alloc_get_stats().bytes_live == live, "allocation %llu failing: leak", (unsigned long long)k);
        if (pending) break;
    }
    CHECK(nomem > 0 && runs < 199, "%d runs, %d out-of-memory", runs, nomem);
    gm_audio_fe *fe2 = NULL;
    gm_error err = {0};
    gm_alloc_fail_after(1);
    CHECK(gm_audio_fe_new(&fe2, &err) == GM_ERR_NOMEM && fe2 == NULL, "gm_audio_fe_new without memory");
    gm_alloc_fail_after(0);
}

/* ---- features ---------------------------------------------------------------------------------- */

static void test_window(gm_audio_fe *fe) {
    size_t n = 0;
    float *ref = gm_test_h5_read(REF, "/window", 0, &n, NULL, NULL);
    CHECK(ref && n == GM_AUDIO_FRAME, "/window: %zu values", n);
    if (!ref) return;
    size_t same = 0;
    double d = max_diff(gm_audio_fe_window(fe), ref, n, &same);
    printf("window: max |ours - numpy| %.3g (%zu of %zu bit-identical)\n", d, same, n);
    gm_check_close("periodic Hann window", gm_audio_fe_window(fe), ref, n, TOL_AUDIO_WINDOW_ABS, 0);
    gm_free(ref);
}

/* The real clips' features, from the fixture's own 16 kHz samples (so that only the extractor is
 * compared): the two as a batch (padding "longest"), and each alone. */
static void test_features_real(gm_audio_fe *fe) {
    size_t n0 = 0, n1 = 0, nf = 0, nm = 0, nl = 0;
    float *c0 = gm_test_h5_read(REF, "/clips/hello-world.wav/samples16k", 0, &n0, NULL, NULL);
    float *c1 = gm_test_h5_read(REF, "/clips/vm-goodbye.wav/samples16k", 0, &n1, NULL, NULL);
    int64_t dims[4] = {0};
    int nd = 0;
    float *feat = gm_test_h5_read(REF, "/batch/features", 0, &nf, dims, &nd);
    int32_t *mask = gm_test_h5_read(REF, "/batch/mask", 1, &nm, NULL, NULL);
    int32_t *lens = gm_test_h5_read(REF, "/batch/lens", 1, &nl, NULL, NULL);
    if (!c0 || !c1 || !feat || !mask || !lens || nd != 3) goto done;
    const float *clips[2] = {c0, c1};
    int64_t len[2] = {(int64_t)n0, (int64_t)n1};
    CHECK(lens[0] == len[0] && lens[1] == len[1], "clip lengths %lld %lld vs %d %d", (long long)len[0], (long long)len[1], lens[0], lens[1]);
    gm_audio_features f = {0};
    gm_error err = {0};
    CHECK_OK(gm_audio_features_compute(fe, clips, len, 2, &f, &err), &err);
    CHECK(f.B == 2 && f.T == dims[1] && f.n_mels == 128 && dims[2] == 128, "batch features (%lld, %lld, %lld), transformers (%lld, %lld, %lld)",
          (long long)f.B, (long long)f.T, (long long)f.n_mels, (long long)dims[0], (long long)dims[1], (long long)dims[2]);
    if (f.T == dims[1]) {
        size_t same = 0, N = (size_t)(2 * f.T * 128);
        double d = max_diff(f.data, feat, N, &same);
        printf("real clips as a batch: features (2, %lld, 128), max |ours - transformers| %.3g (%zu of %zu bit-identical)\n",
               (long long)f.T, d, same, N);
        gm_check_close("real clips' log-mel features", f.data, feat, N, TOL_AUDIO_LOGMEL_ABS, 0);
        size_t bad = 0, valid[2] = {0, 0};
        for (int64_t i = 0; i < 2 * f.T; i++) bad += f.mask[i] != mask[i], valid[i / f.T] += f.mask[i];
        CHECK(bad == 0, "batch mask: %zu of %lld frames differ from input_features_mask", bad, (long long)(2 * f.T));
        printf("real clips as a batch: padded to %lld samples, valid frames %zu and %zu of %lld\n", (long long)f.padded_len, valid[0],
               valid[1], (long long)f.T);
        double spread = 0;
        if (gm_test_h5_attr_double(REF, "/batch", "max_abs_diff_default_dispatch", &spread))
            printf("(transformers itself with numpy's SIMD loops instead of its baseline ones: %.3g from its own features)\n", spread);
    }
    /* each alone: its own padding, fewer frames for the shorter one; the frames equal its batch row's */
    for (int b = 0; b < 2; b++) {
        const char *name = b ? "vm-goodbye.wav" : "hello-world.wav";
        char grp[128], ds[160];
        snprintf(grp, sizeof grp, "/clips/%s", name);
        snprintf(ds, sizeof ds, "%s/mask", grp);
        gm_audio_features one = {0};
        CHECK_OK(gm_audio_features_compute(fe, clips + b, len + b, 1, &one, &err), &err);
        int64_t T = attr_i(grp, "T");
        size_t nm1 = 0;
        int32_t *m1 = gm_test_h5_read(REF, ds, 1, &nm1, NULL, NULL);
        CHECK(one.T == T && (int64_t)nm1 == T, "%s alone: %lld frames, transformers %lld", name, (long long)one.T, (long long)T);
        bool mask_ok = m1 && one.T == T, rows_ok = one.T == T && f.data && one.T <= f.T;
        for (int64_t t = 0; mask_ok && t < T; t++) mask_ok = one.mask[t] == m1[t];
        if (rows_ok) rows_ok = memcmp(one.data, f.data + b * f.T * 128, (size_t)(T * 128) * 4) == 0;
        CHECK(mask_ok, "%s alone: mask differs", name);
        CHECK(rows_ok, "%s alone: its frames differ from its batch row's", name);
        gm_free(m1);
        gm_audio_features_free(&one);
    }
    gm_audio_features_free(&f);
done:
    CHECK(c0 && c1 && feat && mask && lens && nd == 3, "%s: /clips or /batch missing", REF);
    gm_free(c0), gm_free(c1), gm_free(feat), gm_free(mask), gm_free(lens);
}

/* Generated clips around the frame (513), the padding step (128) and the maximum (480,000):
 * T, mask and (where stored) features; the 481,000-sample clip's first and last frames; a batch of
 * that clip and a 1,000-sample one. */
static void test_features_synth(gm_audio_fe *fe) {
    size_t nl = 0, ns = 0, nt = 0;
    int32_t *lens = gm_test_h5_read(REF, "/synth/lens", 1, &nl, NULL, NULL);
    int32_t *seeds = gm_test_h5_read(REF, "/synth/seeds", 1, &ns, NULL, NULL);
    int32_t *Ts = gm_test_h5_read(REF, "/synth/T", 1, &nt, NULL, NULL);
    CHECK(lens && seeds && Ts && nl == ns && nl == nt && nl > 0, "%s: /synth missing", REF);
    double worst = 0;
    float *long_clip = NULL, *short_clip = NULL;
    for (size_t i = 0; lens && seeds && Ts && i < nl; i++) {
        float *x = lcg_clip(lens[i], (uint32_t)seeds[i]);
        const float *cx = x;
        int64_t len = lens[i];
        gm_audio_features f = {0};
        gm_error err = {0};
        CHECK_OK(gm_audio_features_compute(fe, &cx, &len, 1, &f, &err), &err);
        int64_t L = 0, T = 0;
        gm_audio_frames(len, &L, &T);
        CHECK(f.T == Ts[i] && T == Ts[i] && f.padded_len == L, "%d samples: %lld frames (gm_audio_frames %lld), transformers %d", lens[i],
              (long long)f.T, (long long)T, Ts[i]);
        char ds[96];
        snprintf(ds, sizeof ds, "/synth/single_%zu/mask", i);
        size_t nm = 0;
        int32_t *m = gm_test_h5_read(REF, ds, 1, &nm, NULL, NULL);
        bool ok = m && (int64_t)nm == f.T;
        for (int64_t t = 0; ok && t < f.T; t++) ok = f.mask[t] == m[t];
        CHECK(ok, "%d samples: mask differs from input_features_mask", lens[i]);
        gm_free(m);
        snprintf(ds, sizeof ds, "/synth/single_%zu/features", i);
        if (f.T > 0 && gm_test_h5_exists(REF, ds)) {
            size_t nf = 0;
            float *r = gm_test_h5_read(REF, ds, 0, &nf, NULL, NULL);
            if (r && nf == (size_t)(f.T * 128)) {
                worst = fmax(worst, max_diff(f.data, r, nf, NULL));
                gm_check_close(ds, f.data, r, nf, TOL_AUDIO_LOGMEL_ABS, 0);
            } else {
                CHECK(0, "%s: %zu values for %lld frames", ds, nf, (long long)f.T);
            }
            gm_free(r);
        }
        if (lens[i] == 481000) {
            size_t nh = 0, ntl = 0;
            float *head = gm_test_h5_read(REF, "/synth/long_head", 0, &nh, NULL, NULL);
            float *tail = gm_test_h5_read(REF, "/synth/long_tail", 0, &ntl, NULL, NULL);
            if (head && tail && nh == 8 * 128 && ntl == 4 * 128 && f.T >= 8) {
                worst = fmax(worst, max_diff(f.data, head, nh, NULL));
                worst = fmax(worst, max_diff(f.data + (f.T - 4) * 128, tail, ntl, NULL));
                gm_check_close("481,000 samples: first 8 frames", f.data, head, nh, TOL_AUDIO_LOGMEL_ABS, 0);
                gm_check_close("481,000 samples: last 4 frames", f.data + (f.T - 4) * 128, tail, ntl, TOL_AUDIO_LOGMEL_ABS, 0);
            } else {
                CHECK(0, "/synth/long_head or long_tail missing or the clip has %lld frames", (long long)f.T);
            }
            gm_free(head), gm_free(tail);
            long_clip = x, x = NULL;
        }
        if (lens[i] == 1000) short_clip = x, x = NULL;
        gm_audio_features_free(&f);
        gm_free(x);
    }
    printf("generated clips (%zu lengths, 1 .. 481,000 samples): T and masks as transformers', features max |diff| %.3g\n", nl, worst);
    /* the batch: 481,000 samples (cut to 480,000), 1,000, and 960 = 6 x 160 (its frame 6 starts
     * exactly at its end: not valid) */
    float *edge_clip = lcg_clip(960, 2000);
    if (long_clip && short_clip) {
        const float *clips[3] = {long_clip, short_clip, edge_clip};
        int64_t len[3] = {481000, 1000, 960};
        gm_audio_features f = {0};
        gm_error err = {0};
        CHECK_OK(gm_audio_features_compute(fe, clips, len, 3, &f, &err), &err);
        int64_t T = attr_i("/synth", "batch_T");
        size_t nm = 0, nh = 0;
        int32_t *m = gm_test_h5_read(REF, "/synth/batch_mask", 1, &nm, NULL, NULL);
        float *head = gm_test_h5_read(REF, "/synth/batch_head", 0, &nh, NULL, NULL);
        CHECK(f.T == T && f.padded_len == GM_AUDIO_MAX_SAMPLES && T == 2997, "batch: %lld frames, padded to %lld; transformers %lld",
              (long long)f.T, (long long)f.padded_len, (long long)T);
        bool ok = m && (int64_t)nm == 3 * f.T;
        size_t valid[3] = {0, 0, 0};
        for (int64_t t = 0; ok && t < 3 * f.T; t++) ok = f.mask[t] == m[t], valid[t / f.T] += f.mask[t];
        CHECK(ok, "batch mask differs from input_features_mask");
        CHECK(valid[0] == 2997 && valid[1] == 7 && valid[2] == 6, "valid frames %zu, %zu, %zu: 480,000 samples start 2997 frames, "
              "1,000 samples frames 0..6, 960 samples frames 0..5", valid[0], valid[1], valid[2]);
        static const char *what[3] = {"batch: 481,000-sample clip, first 8 frames", "batch: 1,000-sample clip, first 8 frames",
                                      "batch: 960-sample clip, first 8 frames"};
        if (head && nh == 3 * 8 * 128 && f.T >= 8) {
            for (int b = 0; b < 3; b++) {
                worst = fmax(worst, max_diff(f.data + b * f.T * 128, head + b * 8 * 128, 8 * 128, NULL));
                gm_check_close(what[b], f.data + b * f.T * 128, head + b * 8 * 128, 8 * 128, TOL_AUDIO_LOGMEL_ABS, 0);
            }
        } else {
            CHECK(0, "/synth/batch_head missing");
        }
        gm_free(m), gm_free(head);
        gm_audio_features_free(&f);
    }
    gm_free(long_clip), gm_free(short_clip), gm_free(edge_clip), gm_free(lens), gm_free(seeds), gm_free(Ts);
}

/* ---- features: Gemma4AudioFeatureExtractor ----------------------------------------------------- */

static void sha256_hex_mem(const void *p, size_t n, char hex[65]) {
    unsigned char md[32];
    unsigned len = 0;
    EVP_Digest(p, n, md, &len, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

/* n mask values against the fixture's (u8 read as int32) */
static bool mask_equal(const uint8_t *a, const int32_t *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (a[i] != b[i]) return false;
    return a || n == 0;
}

/* Gemma 4's extractor (GM_AUDIO_FE_GEMMA4) against tests/ref/gemma4_audio_fe_ref.h5
 * (make_gemma4_audio_fe_ref.py): its window; the real clips' features (from audio_ref.h5's 16 kHz
 * samples) as a batch and alone; generated clips around the left padding, the 321-sample unfold,
 * the mask's boundary and truncation, alone and as a batch (the short rows' masked frames zeros);
 * file to features. Features within TOL_AUDIO4_LOGMEL_ABS; frame counts and masks exact. */
static void test_features_gemma4(void) {
    snprintf(REF4, sizeof REF4, "%s", gm_test_path("tests/ref/gemma4_audio_fe_ref.h5"));
    if (!gm_test_file_exists(REF4)) {
        CHECK(0, "missing %s (tests/ref/make_gemma4_audio_fe_ref.py)", REF4);
        return;
    }
    gm_audio_fe *fe = NULL;
    gm_error err = {0};
    CHECK(gm_audio_fe_new_kind((gm_audio_fe_kind)7, &fe, &err) == GM_ERR_INVALID && fe == NULL, "unknown kind accepted");
    CHECK_OK(gm_audio_fe_new_kind(GM_AUDIO_FE_GEMMA4, &fe, &err), &err);
    if (!fe) return;
    CHECK(gm_audio_fe_get_kind(fe) == GM_AUDIO_FE_GEMMA4, "kind");
    double worst = 0;
    /* the window: np.hanning(321)[:-1] as f32 */
    size_t nw = 0, same = 0;
    float *win = gm_test_h5_read(REF4, "/window", 0, &nw, NULL, NULL);
    CHECK(win && nw == GM_AUDIO4_FRAME, "gemma4 /window: %zu values", nw);
    if (win && nw == GM_AUDIO4_FRAME) {
        double d = max_diff(gm_audio_fe_window(fe), win, nw, &same);
        printf("gemma4 window: max |ours - numpy| %.3g (%zu of %zu bit-identical)\n", d, same, nw);
        gm_check_close("gemma4 periodic Hann window", gm_audio_fe_window(fe), win, nw, TOL_AUDIO_WINDOW_ABS, 0);
    }
    gm_free(win);

    /* the real clips: the same 16 kHz samples the fixture fed (sha256 of their bytes) */
    size_t n0 = 0, n1 = 0, nf = 0, nm = 0;
    float *c0 = gm_test_h5_read(REF, "/clips/hello-world.wav/samples16k", 0, &n0, NULL, NULL);
    float *c1 = gm_test_h5_read(REF, "/clips/vm-goodbye.wav/samples16k", 0, &n1, NULL, NULL);
    int64_t dims[4] = {0};
    int nd = 0;
    float *feat = gm_test_h5_read(REF4, "/batch/features", 0, &nf, dims, &nd);
    int32_t *mask = gm_test_h5_read(REF4, "/batch/mask", 1, &nm, NULL, NULL);
    CHECK(c0 && c1 && feat && mask && nd == 3, "%s: /batch missing (or %s: /clips)", REF4, REF);
    if (c0 && c1 && feat && mask && nd == 3) {
        const float *clips[2] = {c0, c1};
        int64_t len[2] = {(int64_t)n0, (int64_t)n1};
        static const char *names[2] = {"hello-world.wav", "vm-goodbye.wav"};
        for (int b = 0; b < 2; b++) {
            char grp[128], hex[65];
            snprintf(grp, sizeof grp, "/clips/%s", names[b]);
            char *want = gm_test_h5_attr_string(REF4, grp, "sha256_samples");
            sha256_hex_mem(clips[b], (size_t)len[b] * 4, hex);
            CHECK(want && strcmp(want, hex) == 0, "%s: the 16 kHz samples differ from those the Gemma 4 fixture was made from", names[b]);
            gm_free(want);
        }
        gm_audio_features f = {0};
        CHECK_OK(gm_audio_features_compute(fe, clips, len, 2, &f, &err), &err);
        int64_t L = 0, T = 0;
        gm_audio_frames_kind(GM_AUDIO_FE_GEMMA4, n0 > n1 ? (int64_t)n0 : (int64_t)n1, &L, &T);
        CHECK(f.B == 2 && f.T == dims[1] && T == f.T && f.padded_len == L && dims[2] == 128,
              "gemma4 batch features (%lld, %lld, 128), gm_audio_frames_kind %lld, transformers (%lld, %lld, %lld)", (long long)f.B,
              (long long)f.T, (long long)T, (long long)dims[0], (long long)dims[1], (long long)dims[2]);
        if (f.T == dims[1] && f.data) {
            size_t N = (size_t)(2 * f.T * 128);
            double d = max_diff(f.data, feat, N, &same);
            worst = fmax(worst, d);
            printf("gemma4, real clips as a batch: features (2, %lld, 128), max |ours - transformers| %.3g (%zu of %zu bit-identical)\n",
                   (long long)f.T, d, same, N);
            gm_check_close("gemma4 real clips' log-mel features", f.data, feat, N, TOL_AUDIO4_LOGMEL_ABS, 0);
            CHECK(mask_equal(f.mask, mask, 2 * f.T), "gemma4 batch mask differs from input_features_mask");
            double spread = 0;
            if (gm_test_h5_attr_double(REF4, "/batch", "max_abs_diff_default_dispatch", &spread))
                printf("(transformers itself with numpy's SIMD loops instead of its baseline ones: %.3g from its own features)\n", spread);
        }
        for (int b = 0; b < 2; b++) {
            char grp[128], ds[160];
            snprintf(grp, sizeof grp, "/clips/%s", names[b]);
            snprintf(ds, sizeof ds, "%s/mask", grp);
            gm_audio_features one = {0};
            CHECK_OK(gm_audio_features_compute(fe, clips + b, len + b, 1, &one, &err), &err);
            int64_t Tw = attr_i4(grp, "T");
            size_t nm1 = 0;
            int32_t *m1 = gm_test_h5_read(REF4, ds, 1, &nm1, NULL, NULL);
            CHECK(one.T == Tw && (int64_t)nm1 == Tw, "gemma4 %s alone: %lld frames, transformers %lld", names[b], (long long)one.T,
                  (long long)Tw);
            CHECK(m1 && one.T == Tw && mask_equal(one.mask, m1, Tw), "gemma4 %s alone: mask differs", names[b]);
            CHECK(one.T == Tw && f.data && one.T <= f.T && memcmp(one.data, f.data + b * f.T * 128, (size_t)(Tw * 128) * 4) == 0,
                  "gemma4 %s alone: its frames differ from its batch row's", names[b]);
            gm_free(m1);
            gm_audio_features_free(&one);
        }
        gm_audio_features_free(&f);
    }
    gm_free(c0), gm_free(c1), gm_free(feat), gm_free(mask);

    /* generated clips alone */
    size_t nl = 0, ns = 0, nt = 0;
    int32_t *lens = gm_test_h5_read(REF4, "/synth/lens", 1, &nl, NULL, NULL);
    int32_t *seeds = gm_test_h5_read(REF4, "/synth/seeds", 1, &ns, NULL, NULL);
    int32_t *Ts = gm_test_h5_read(REF4, "/synth/T", 1, &nt, NULL, NULL);
    CHECK(lens && seeds && Ts && nl == ns && nl == nt && nl > 0, "%s: /synth missing", REF4);
    float *long_clip = NULL, *short_clip = NULL;
    for (size_t i = 0; lens && seeds && Ts && i < nl; i++) {
        float *x = lcg_clip(lens[i], (uint32_t)seeds[i]);
        const float *cx = x;
        int64_t len = lens[i];
        gm_audio_features f = {0};
        CHECK_OK(gm_audio_features_compute(fe, &cx, &len, 1, &f, &err), &err);
        int64_t L = 0, T = 0;
        gm_audio_frames_kind(GM_AUDIO_FE_GEMMA4, len, &L, &T);
        CHECK(f.T == Ts[i] && T == Ts[i] && f.padded_len == L, "gemma4, %d samples: %lld frames (gm_audio_frames_kind %lld), transformers %d",
              lens[i], (long long)f.T, (long long)T, Ts[i]);
        char ds[96];
        snprintf(ds, sizeof ds, "/synth/single_%zu/mask", i);
        size_t nm1 = 0;
        int32_t *m = gm_test_h5_read(REF4, ds, 1, &nm1, NULL, NULL);
        CHECK(m && (int64_t)nm1 == f.T && mask_equal(f.mask, m, f.T), "gemma4, %d samples: mask differs from input_features_mask", lens[i]);
        gm_free(m);
        snprintf(ds, sizeof ds, "/synth/single_%zu/features", i);
        if (f.T > 0 && gm_test_h5_exists(REF4, ds)) {
            size_t nf1 = 0;
            float *r = gm_test_h5_read(REF4, ds, 0, &nf1, NULL, NULL);
            CHECK(r && nf1 == (size_t)(f.T * 128), "%s: %zu values for %lld frames", ds, nf1, (long long)f.T);
            if (r && nf1 == (size_t)(f.T * 128)) {
                worst = fmax(worst, max_diff(f.data, r, nf1, NULL));
                gm_check_close(ds, f.data, r, nf1, TOL_AUDIO4_LOGMEL_ABS, 0);
            }
            gm_free(r);
        }
        if (lens[i] == 481000) {
            size_t nh = 0, ntl = 0;
            float *head = gm_test_h5_read(REF4, "/synth/long_head", 0, &nh, NULL, NULL);
            float *tail = gm_test_h5_read(REF4, "/synth/long_tail", 0, &ntl, NULL, NULL);
            CHECK(head && tail && nh == 8 * 128 && ntl == 4 * 128 && f.T >= 8, "gemma4 /synth/long_head or long_tail");
            if (head && tail && nh == 8 * 128 && ntl == 4 * 128 && f.T >= 8) {
                worst = fmax(worst, fmax(max_diff(f.data, head, nh, NULL), max_diff(f.data + (f.T - 4) * 128, tail, ntl, NULL)));
                gm_check_close("gemma4, 481,000 samples: first 8 frames", f.data, head, nh, TOL_AUDIO4_LOGMEL_ABS, 0);
                gm_check_close("gemma4, 481,000 samples: last 4 frames", f.data + (f.T - 4) * 128, tail, ntl, TOL_AUDIO4_LOGMEL_ABS, 0);
            }
            gm_free(head), gm_free(tail);
            long_clip = x, x = NULL;
        }
        if (lens[i] == 1000) short_clip = x, x = NULL;
        gm_audio_features_free(&f);
        gm_free(x);
    }
    /* the batch: 481,000 samples (cut to 480,000), 1,000 and 960: the short rows' last valid frames
     * (t = 5 and 4: sample 160 t + 160 inside the clip) and their masked frames (zeros) */
    float *edge_clip = lcg_clip(960, 2000);
    if (long_clip && short_clip) {
        const float *clips[3] = {long_clip, short_clip, edge_clip};
        int64_t len[3] = {481000, 1000, 960};
        gm_audio_features f = {0};
        CHECK_OK(gm_audio_features_compute(fe, clips, len, 3, &f, &err), &err);
        int64_t T = attr_i4("/synth", "batch_T");
        size_t nm1 = 0, nh = 0, ntl = 0;
        int32_t *m = gm_test_h5_read(REF4, "/synth/batch_mask", 1, &nm1, NULL, NULL);
        float *head = gm_test_h5_read(REF4, "/synth/batch_head", 0, &nh, NULL, NULL);
        float *tail = gm_test_h5_read(REF4, "/synth/batch_tail", 0, &ntl, NULL, NULL);
        CHECK(f.T == T && f.padded_len == GM_AUDIO_MAX_SAMPLES && T == 2999, "gemma4 batch: %lld frames, padded to %lld; transformers %lld",
              (long long)f.T, (long long)f.padded_len, (long long)T);
        size_t valid[3] = {0, 0, 0};
        for (int64_t t = 0; f.mask && t < 3 * f.T; t++) valid[t / f.T] += f.mask[t];
        CHECK(m && (int64_t)nm1 == 3 * f.T && mask_equal(f.mask, m, 3 * f.T), "gemma4 batch mask differs from input_features_mask");
        CHECK(valid[0] == 2999 && valid[1] == 6 && valid[2] == 5, "gemma4 valid frames %zu, %zu, %zu (want 2999, 6, 5)", valid[0], valid[1],
              valid[2]);
        CHECK(head && tail && nh == 3 * 8 * 128 && ntl == 3 * 4 * 128 && f.T >= 8, "gemma4 /synth/batch_head or batch_tail missing");
        if (head && tail && nh == 3 * 8 * 128 && ntl == 3 * 4 * 128 && f.T >= 8) {
            for (int b = 0; b < 3; b++) {
                char what[96];
                snprintf(what, sizeof what, "gemma4 batch: clip of %lld samples, first 8 frames", (long long)len[b]);
                worst = fmax(worst, max_diff(f.data + b * f.T * 128, head + b * 8 * 128, 8 * 128, NULL));
                gm_check_close(what, f.data + b * f.T * 128, head + b * 8 * 128, 8 * 128, TOL_AUDIO4_LOGMEL_ABS, 0);
                snprintf(what, sizeof what, "gemma4 batch: clip of %lld samples, last 4 frames", (long long)len[b]);
                const float *o = f.data + (b * f.T + f.T - 4) * 128;
                worst = fmax(worst, max_diff(o, tail + b * 4 * 128, 4 * 128, NULL));
                gm_check_close(what, o, tail + b * 4 * 128, 4 * 128, TOL_AUDIO4_LOGMEL_ABS, 0);
                if (b > 0) CHECK(memcmp(o, tail + b * 4 * 128, 4 * 128 * 4) == 0, "gemma4 batch: masked frames of clip %d not numpy's zeros", b);
            }
        }
        gm_free(m), gm_free(head), gm_free(tail);
        gm_audio_features_free(&f);
    }
    printf("gemma4, generated clips (%zu lengths, 1 .. 481,000 samples) and batches: T and masks as transformers', features max |diff| "
           "%.3g (all, real clips included)\n", nl, worst);
    gm_free(long_clip), gm_free(short_clip), gm_free(edge_clip), gm_free(lens), gm_free(seeds), gm_free(Ts);

    /* file to features, by the extractor's kind */
    const char *path = ALLISON "/hello-world.wav";
    if (gm_test_file_exists(path)) {
        gm_audio_features f = {0};
        CHECK_OK(gm_audio_features_file(fe, path, NULL, &f, &err), &err);
        size_t nf1 = 0;
        int64_t d2[4] = {0};
        int nd2 = 0;
        float *ref = gm_test_h5_read(REF4, "/batch/features", 0, &nf1, d2, &nd2);
        int64_t T = attr_i4("/clips/hello-world.wav", "T");
        CHECK(ref && f.data && f.T == T && T <= d2[1], "gemma4 hello-world.wav, file to features: %lld frames, transformers %lld", (long long)f.T,
              (long long)T);
        if (ref && f.data && f.T == T && T <= d2[1])
            gm_check_close("gemma4 hello-world.wav: file to features", f.data, ref, (size_t)(T * 128), TOL_AUDIO4_LOGMEL_ABS, 0);
        gm_free(ref);
        gm_audio_features_free(&f);
    }
    /* an empty clip, and no memory for the extractor */
    {
        const float *none = NULL;
        int64_t len = 0;
        gm_audio_features f = {0};
        CHECK_OK(gm_audio_features_compute(fe, &none, &len, 1, &f, &err), &err);
        CHECK(f.T == 0 && f.data == NULL && f.mask == NULL, "gemma4, empty clip: T %lld", (long long)f.T);
        gm_audio_fe *fe2 = NULL;
        gm_alloc_fail_after(1);
        CHECK(gm_audio_fe_new_kind(GM_AUDIO_FE_GEMMA4, &fe2, &err) == GM_ERR_NOMEM && fe2 == NULL, "gemma4 extractor without memory");
        gm_alloc_fail_after(0);
    }
    gm_audio_fe_free(fe);
}

/* The whole path on the real clip: file -> 16 kHz -> features, equal to the fixture's features
 * within the same bound (the conversion adds nothing when it is bit-identical). */
static void test_file_to_features(gm_audio_fe *fe) {
    const char *path = ALLISON "/hello-world.wav";
    if (!gm_test_file_exists(path)) return;
    gm_audio_features f = {0};
    gm_error err = {0};
    CHECK_OK(gm_audio_features_file(fe, path, NULL, &f, &err), &err);
    size_t nf = 0;
    int64_t dims[4] = {0};
    int nd = 0;
    float *feat = gm_test_h5_read(REF, "/batch/features", 0, &nf, dims, &nd);
    if (feat && f.data && nd == 3 && f.T == dims[1]) {
        double d = gm_check_close("hello-world.wav: file to features", f.data, feat, (size_t)(f.T * 128), TOL_AUDIO_LOGMEL_ABS, 0);
        printf("hello-world.wav, file to features: (%lld, 128), max |ours - transformers| %.3g\n", (long long)f.T, d);
    } else {
        CHECK(0, "hello-world.wav: %lld frames, the batch reference %lld", (long long)f.T, (long long)dims[1]);
    }
    gm_free(feat);
    gm_audio_features_free(&f);
}

/* One extractor, four threads at once (each its own clip), and extractors made and freed on four
 * threads at once (FFTW's planner behind this module's mutex): every result equals the
 * single-threaded one bit for bit. */
typedef struct thread_job {
    gm_audio_fe *fe;
    const float *clip;
    int64_t len;
    float *want; /* (T, 128) */
    int64_t T;
    int bad;
} thread_job;

static void *thread_main(void *p) {
    thread_job *j = p;
    for (int rep = 0; rep < 8; rep++) {
        gm_audio_fe *own = NULL;
        gm_error err = {0};
        if (gm_audio_fe_new(&own, &err) != GM_OK) {
            j->bad++;
            continue;
        }
        for (int k = 0; k < 2; k++) {
            gm_audio_features f = {0};
            if (gm_audio_features_compute(k ? own : j->fe, &j->clip, &j->len, 1, &f, &err) != GM_OK || f.T != j->T ||
                memcmp(f.data, j->want, (size_t)(j->T * 128) * 4) != 0)
                j->bad++;
            gm_audio_features_free(&f);
        }
        gm_audio_fe_free(own);
    }
    return NULL;
}

static void test_threads(gm_audio_fe *fe) {
    enum { NT = 4 };
    thread_job jobs[NT];
    pthread_t th[NT];
    float *clips[NT];
    for (int i = 0; i < NT; i++) {
        int64_t len = 16000 + 3000 * i;
        clips[i] = lcg_clip(len, (uint32_t)(77 + i));
        gm_audio_features f = {0};
        gm_error err = {0};
        const float *c = clips[i];
        CHECK_OK(gm_audio_features_compute(fe, &c, &len, 1, &f, &err), &err);
        jobs[i] = (thread_job){fe, clips[i], len, f.data, f.T, 0};
        gm_free(f.mask);
    }
    for (int i = 0; i < NT; i++) pthread_create(&th[i], NULL, thread_main, &jobs[i]);
    for (int i = 0; i < NT; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < NT; i++) {
        CHECK(jobs[i].bad == 0, "thread %d: %d of 16 results differ from the single-threaded one", i, jobs[i].bad);
        gm_free(jobs[i].want), gm_free(clips[i]);
    }
}

static void test_api_errors(gm_audio_fe *fe) {
    gm_audio_features f = {0};
    gm_error err = {0};
    const float *none = NULL;
    int64_t len = -1;
    CHECK(gm_audio_features_compute(fe, &none, &len, 1, &f, &err) == GM_ERR_INVALID && f.data == NULL, "negative length: %s", err.msg);
    CHECK(gm_audio_features_compute(fe, &none, &len, 0, &f, &err) == GM_ERR_INVALID, "empty batch accepted");
    len = 0; /* an empty clip is all padding: no frame */
    CHECK_OK(gm_audio_features_compute(fe, &none, &len, 1, &f, &err), &err);
    CHECK(f.B == 1 && f.T == 0 && f.data == NULL && f.mask == NULL, "empty clip: T %lld", (long long)f.T);
    gm_audio_features_free(&f);
    gm_audio_features_free(NULL);
    gm_audio_free(NULL);
    gm_audio_fe_free(NULL);
    CHECK(gm_audio_sniff("", 0) && strcmp(gm_audio_sniff("", 0), "an empty file") == 0, "sniff of nothing");
    CHECK(gm_audio_sniff("\x00\x01\x02\x03", 4) == NULL, "binary junk sniffed as something");
    int64_t L = 0, T = 0;
    gm_audio_frames(GM_AUDIO_MAX_SAMPLES, &L, &T);
    CHECK(L == 480000 && T == 2997, "30 s: padded %lld, %lld frames (gemma_architecture.md §3.9: 2997)", (long long)L, (long long)T);
}

int main(void) {
    snprintf(REF, sizeof REF, "%s", gm_test_path("tests/ref/audio_ref.h5"));
    if (!gm_test_file_exists(REF)) {
        CHECK(0, "missing %s (tests/ref/make_audio_ref.py)", REF);
        return gm_test_finish();
    }
    if (!gm_test_make_tmpdir("audio", TMP, sizeof TMP)) return gm_test_finish();
    double t0 = gm_test_now_s();
    gm_audio_fe *fe = NULL;
    gm_error err = {0};
    CHECK_OK(gm_audio_fe_new(&fe, &err), &err);
    if (fe) {
        test_real_clips();
        test_stereo();
        test_window(fe);
        test_features_real(fe);
        test_features_synth(fe);
        test_file_to_features(fe);
        test_features_gemma4();
        test_bad_files();
        test_alloc_failures(fe);
        test_threads(fe);
        test_api_errors(fe);
        gm_audio_fe_free(fe);
    }
    gm_test_remove_tmpdir(TMP);
    printf("test_audio: %.1f s\n", gm_test_now_s() - t0);
    if (allison_missing && gm_test_failed == 0) {
        printf("%d checks passed before the skip\n", gm_test_passed);
        return gm_test_skip_unless_ci("the real recordings are missing: apt-get install asterisk-core-sounds-en-wav (setup.sh does)");
    }
    return gm_test_finish();
}

/*
 * gm_audio.c - audio files decoded by libsndfile, averaged to mono, converted to 16 kHz by
 * libsamplerate (SRC_SINC_BEST_QUALITY), as soundfile + samplerate give them to a transformers user.
 *
 * How: the file is opened (a descriptor of ours, or libsndfile's virtual I/O over a buffer); its
 * header's rate and length are checked against the limits before anything the size of its samples
 * is allocated; then it is read in chunks of at most 64 Ki samples, each chunk averaged to mono and
 * pushed through one SRC_STATE, and the 16 kHz output appended to a buffer that grows by doubling up
 * to the limit's size. The streamed conversion gives the same samples, bit for bit, as the single
 * src_simple call of samplerate.resample: same count, same values on every fixture (test_audio),
 * and, measured while writing this, on random input of 1 .. 100,000 samples at the ratios 2,
 * 16000/44100, 16000/48000 and 16000/22050 fed in chunks of 4096.
 *
 * What the header may say and what it must not do. libsndfile computes a WAV's frame count from its
 * `data` chunk, cut to what the file holds: a truncated WAV, or one whose header claims 2^31 frames,
 * reads as the shorter file it is, and the only trace is a "data : A (should be B)" line in the
 * file's log (SFC_GET_LOG_INFO). We read that line and refuse the file with both numbers: a clip cut
 * short would train on a partial utterance with its full transcript. A `data` size of 0xFFFFFFFF,
 * what a writer that cannot seek back to the header leaves there, means "unknown": such a file is
 * read to its end, bounded by the limit. Formats whose decoder finds the damage (FLAC: lost sync,
 * CRC mismatch) leave an error on the handle (sf_error) and read fewer frames than announced; both
 * are errors. An Ogg file cut short logs "File ended unexpectedly" (libsndfile 1.2.0 then reads no
 * frame of it): an error too. A FLAC without a length (STREAMINFO total 0) announces SF_COUNT_MAX
 * frames: only the read loop's count limits it, which never reads more than one frame past the
 * limit. The header's length is never used to size a buffer beyond the limit.
 *
 * libsndfile and threads: a failed sf_open reports its reason through a process-wide variable
 * (sf_error(NULL)), so the open and the reading of that reason happen under a mutex; everything after
 * works on the handle alone. libsndfile and libsamplerate allocate with their own malloc (bounded:
 * one open file, one converter with its fixed filter); our buffers come from gm_malloc.
 *
 * Rejected: reading the whole file into memory first (a second copy for nothing, and sized by the
 * header); converting each channel and then averaging (the reference averages first; the two differ
 * in rounding and cost `channels` converters); libsamplerate's src_simple on the whole clip (needs
 * the whole mono clip in memory at the source rate: 10 minutes at 768 kHz is 1.8 GB).
 */
#include "gm_audio.h"
#include "gm_fetch.h" /* gm_sha256_file */

#include "gm_alloc.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <samplerate.h>
#include <sndfile.h>

/* Samples (frames x channels) read from libsndfile per call: 256 KiB of f32, whatever the channel
 * count (libsndfile allows up to 1024 channels). */
#define CHUNK_SAMPLES 65536

/* Output frames produced per src_process call at most (the output buffer grows in steps of this). */
#define OUT_STEP 65536

/* A `data` chunk size that means "unknown, read to the end" (writers that cannot seek back). */
#define WAV_SIZE_UNKNOWN 0xFFFFFFFFull

#define HINT_CORRUPT "hint: the file is damaged or incomplete; export or download it again"

static pthread_mutex_t open_mutex = PTHREAD_MUTEX_INITIALIZER;

/* ---- sniffing ------------------------------------------------------------------------------------ */

const char *gm_audio_sniff(const void *head, size_t n) {
    const uint8_t *b = head;
    if (n == 0) return "an empty file";
    if (n >= 8 && memcmp(b, "\x89PNG\r\n\x1a\n", 8) == 0) return "a PNG image";
    if (n >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return "a JPEG image";
    if (n >= 6 && (memcmp(b, "GIF87a", 6) == 0 || memcmp(b, "GIF89a", 6) == 0)) return "a GIF image";
    if (n >= 12 && memcmp(b, "RIFF", 4) == 0 && memcmp(b + 8, "WEBP", 4) == 0) return "a WebP image";
    if (n >= 12 && memcmp(b, "RIFF", 4) == 0 && memcmp(b + 8, "AVI ", 4) == 0) return "an AVI video";
    if (n >= 4 && memcmp(b, "%PDF", 4) == 0) return "a PDF document";
    if (n >= 4 && memcmp(b, "PK\3\4", 4) == 0) return "a ZIP archive";
    if (n >= 3 && memcmp(b, "\x1f\x8b\x08", 3) == 0) return "a gzip archive";
    if (n >= 8 && memcmp(b + 4, "ftyp", 4) == 0) return "an MP4/M4A file (AAC audio is not read by libsndfile)";
    if (n >= 4 && memcmp(b, "\x1a\x45\xdf\xa3", 4) == 0) return "a Matroska/WebM file";
    if (n >= 4 && memcmp(b, "\x89HDF", 4) == 0) return "an HDF5 file";
    /* printable ASCII / UTF-8 text: no control bytes but tab, CR, LF */
    bool text = true;
    for (size_t i = 0; i < n && text; i++) text = b[i] >= 0x20 || b[i] == '\t' || b[i] == '\n' || b[i] == '\r';
    if (text) return "text";
    return NULL;
}

/* ---- libsndfile virtual I/O over a buffer ---------------------------------------------------------- */

typedef struct membuf {
    const uint8_t *p;
    sf_count_t n, pos;
} membuf;

static sf_count_t vio_len(void *u) { return ((membuf *)u)->n; }
static sf_count_t vio_seek(sf_count_t off, int whence, void *u) {
    membuf *m = u;
    sf_count_t base = whence == SEEK_SET ? 0 : whence == SEEK_CUR ? m->pos : m->n;
    sf_count_t to = base + off;
    if (to < 0 || to > m->n) return -1;
    return m->pos = to;
}
static sf_count_t vio_read(void *ptr, sf_count_t count, void *u) {
    membuf *m = u;
    sf_count_t k = count < m->n - m->pos ? count : m->n - m->pos;
    if (k <= 0) return 0;
    memcpy(ptr, m->p + m->pos, (size_t)k);
    m->pos += k;
    return k;
}
static sf_count_t vio_write(const void *ptr, sf_count_t count, void *u) { return 0; }
static sf_count_t vio_tell(void *u) { return ((membuf *)u)->pos; }

/* ---- messages ---------------------------------------------------------------------------------- */

/* A duration in words: "12.3 s", "4.5 min", "74.6 hours". */
static void fmt_duration(double s, char *buf, size_t cap) {
    if (s < 120) snprintf(buf, cap, "%.1f s", s);
    else if (s < 7200) snprintf(buf, cap, "%.1f min", s / 60);
    else snprintf(buf, cap, "%.1f hours", s / 3600);
}

/* The error of a failed sf_open: libsndfile's code and text (read under open_mutex by the caller),
 * with what the bytes look like when libsndfile did not recognise them. */
static gm_status open_error(const char *name, int code, const char *why, const uint8_t *head, size_t nhead, gm_error *err) {
    const char *kind = gm_audio_sniff(head, nhead);
    switch (code) {
    case SF_ERR_UNRECOGNISED_FORMAT:
        if (kind)
            return gm_error_set(err, GM_ERR_UNSUPPORTED,
                                "%s: not an audio file: this looks like %s\n"
                                "hint: give a WAV, FLAC, Ogg Vorbis/Opus or MP3 file (libsndfile reads these); convert others "
                                "first, e.g. ffmpeg -i in.m4a out.flac",
                                name, kind);
        return gm_error_set(err, GM_ERR_UNSUPPORTED,
                            "%s: not an audio format libsndfile reads (it starts with the bytes %02x %02x %02x %02x)\n"
                            "hint: give a WAV, FLAC, Ogg Vorbis/Opus or MP3 file; convert others first, e.g. ffmpeg -i in.m4a out.flac",
                            name, nhead > 0 ? head[0] : 0, nhead > 1 ? head[1] : 0, nhead > 2 ? head[2] : 0, nhead > 3 ? head[3] : 0);
    case SF_ERR_UNSUPPORTED_ENCODING:
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: an audio file in an encoding libsndfile does not decode: %s\n"
                            "hint: convert it to 16-bit PCM WAV or FLAC, e.g. ffmpeg -i in out.flac", name, why);
    case SF_ERR_SYSTEM:
        return gm_error_set(err, GM_ERR_IO, "%s: cannot read: %s\nhint: check the file and its permissions", name, why);
    default:
        return gm_error_set(err, GM_ERR_FORMAT, "%s: malformed audio file: %s\n%s", name, why, HINT_CORRUPT);
    }
}

/* The first "<tag> : A (should be B)" line of libsndfile's log with tag `data` (WAV, W64, RF64) or
 * `SSND` (AIFF), with A > B: the chunk promises more bytes than the file holds. */
static bool log_truncated(const char *log, unsigned long long *claimed, unsigned long long *held) {
    for (const char *l = log; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, "data", 4) != 0 && strncmp(l, "SSND", 4) != 0) continue;
        unsigned long long a = 0, b = 0;
        if (sscanf(l + 4, " : %llu (should be %llu)", &a, &b) == 2 && a > b && a != WAV_SIZE_UNKNOWN) {
            *claimed = a, *held = b;
            return true;
        }
    }
    return false;
}

/* ---- decoding ------------------------------------------------------------------------------------ */

/* numpy's f32 sum of n values (np.add.reduce's pairwise_sum, numpy/_core/src/umath/
 * loops_utils.h.src): in order below 8 values; up to 128, eight running sums combined as
 * ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)) and the rest added in order; above, the two
 * halves (the first a multiple of 8 long) summed so and added. x.mean(axis=1) of a frame is this sum
 * divided by the channel count in f32: the same bits for any channel count (checked against numpy
 * for 2..300 channels while writing this). */
static float pairwise_sum(const float *a, int64_t n) {
    if (n < 8) {
        float r = 0.0f;
        for (int64_t i = 0; i < n; i++) r += a[i];
        return r;
    }
    if (n <= 128) {
        float r[8];
        for (int j = 0; j < 8; j++) r[j] = a[j];
        int64_t i = 8;
        for (; i < n - n % 8; i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        float res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    int64_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

/* What decode_sf owns; released by dec_release on every path. */
typedef struct dec {
    float *in;       /* (CHUNK_SAMPLES) interleaved frames from libsndfile */
    float *mono;     /* (CHUNK_SAMPLES / channels) */
    float *out;      /* (cap) 16 kHz */
    int64_t n, cap, max_out;
    SRC_STATE *src;
} dec;

static void dec_release(dec *d) {
    gm_free(d->in), gm_free(d->mono), gm_free(d->out);
    if (d->src) src_delete(d->src);
    *d = (dec){0};
}

/* Room for at least `need` more output samples (grows by doubling, at most to max_out + OUT_STEP). */
static bool out_reserve(dec *d, int64_t need) {
    if (d->cap - d->n >= need) return true;
    int64_t cap = d->cap > 0 ? d->cap : OUT_STEP;
    while (cap - d->n < need) cap *= 2;
    if (cap > d->max_out + OUT_STEP) cap = d->max_out + OUT_STEP;
    if (cap - d->n < need) return false;
    float *p = gm_realloc(d->out, (size_t)cap * sizeof(float));
    if (!p) return false;
    d->out = p, d->cap = cap;
    return true;
}

/* Pushes k mono samples (k = 0 with eof: the converter's tail) through the converter into d->out.
 * Returns 0, a libsamplerate error code (> 0), CONVERT_NOMEM or CONVERT_STALLED. */
enum { CONVERT_NOMEM = -1, CONVERT_STALLED = -2 };
static int convert(dec *d, const float *mono, int64_t k, bool eof, double ratio) {
    int64_t used = 0;
    for (;;) {
        if (!out_reserve(d, OUT_STEP)) return CONVERT_NOMEM;
        SRC_DATA sd = {0};
        sd.data_in = mono + used;
        sd.input_frames = (long)(k - used);
        sd.data_out = d->out + d->n;
        sd.output_frames = OUT_STEP;
        sd.end_of_input = eof;
        sd.src_ratio = ratio;
        int e = src_process(d->src, &sd);
        if (e) return e;
        used += sd.input_frames_used;
        d->n += sd.output_frames_gen;
        /* done when the input is consumed and, at the end, the converter has nothing left */
        if (used == k && (!eof || sd.output_frames_gen == 0)) return 0;
        /* with room for OUT_STEP outputs the converter always moves; if not, say so rather than
         * drop samples */
        if (sd.input_frames_used == 0 && sd.output_frames_gen == 0) return CONVERT_STALLED;
    }
}

/* Reads an open file into *out (see gm_audio_load). `sf` stays open (the caller closes it). */
static gm_status decode_sf(SNDFILE *sf, const SF_INFO *info, const char *name, const gm_audio_limits *limits, gm_audio *out,
                           gm_error *err) {
    double max_s = limits && limits->max_seconds > 0 ? limits->max_seconds : GM_AUDIO_MAX_SECONDS;
    if (max_s > GM_AUDIO_LIMIT_MAX_SECONDS) max_s = GM_AUDIO_LIMIT_MAX_SECONDS; /* sizes stay far inside int64 */
    int rate = info->samplerate, ch = info->channels;
    char dur[64], lim[64];
    fmt_duration(max_s, lim, sizeof lim);
    if (rate < GM_AUDIO_MIN_RATE || rate > GM_AUDIO_MAX_RATE)
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "%s: sample rate %d Hz, outside %d..%d Hz\n"
                            "hint: if the rate is right, resample the file first (e.g. sox in.wav -r 16000 out.wav); "
                            "if not, the header is damaged", name, rate, GM_AUDIO_MIN_RATE, GM_AUDIO_MAX_RATE);
    if (ch < 1 || ch > CHUNK_SAMPLES)
        return gm_error_set(err, GM_ERR_FORMAT, "%s: %d channels\n%s", name, ch, HINT_CORRUPT);
    /* the header's own story first: a chunk promising more than the file holds */
    char log[4096] = "";
    sf_command(sf, SFC_GET_LOG_INFO, log, sizeof log);
    unsigned long long claimed = 0, held = 0;
    if (log_truncated(log, &claimed, &held)) {
        double frames_claimed = info->frames > 0 && held > 0 ? (double)claimed * (double)info->frames / (double)held : 0;
        fmt_duration(frames_claimed / rate, dur, sizeof dur);
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: truncated or corrupt: the header promises %llu bytes of samples (%s), the file holds %llu "
                            "(%lld frames, %.2f s)\n%s",
                            name, claimed, frames_claimed > 0 ? dur : "its length unknown", held, (long long)info->frames,
                            (double)info->frames / rate, HINT_CORRUPT);
    }
    /* an Ogg stream without its last page: libsndfile then reads nothing at all (1.2.0) */
    if (strstr(log, "File ended unexpectedly"))
        return gm_error_set(err, GM_ERR_FORMAT, "%s: truncated: the Ogg stream ends before its end-of-stream page\n%s", name,
                            HINT_CORRUPT);
    bool known = info->frames >= 0 && info->frames != SF_COUNT_MAX;
    double max_frames = floor(max_s * rate); /* frames allowed */
    if (known && (double)info->frames > max_frames) {
        fmt_duration((double)info->frames / rate, dur, sizeof dur);
        return gm_error_set(err, GM_ERR_LIMIT,
                            "%s: %s of audio (%lld frames at %d Hz), longer than the limit of %s\n"
                            "hint: cut it into clips of at most 30 s (Gemma 3n's feature extractor keeps the first 30 s of a "
                            "clip), or raise gm_audio_limits.max_seconds",
                            name, dur, (long long)info->frames, rate, lim);
    }
    if (known && info->frames == 0)
        return gm_error_set(err, GM_ERR_FORMAT, "%s: no audio in the file (0 frames)\nhint: the recording is empty; make it again", name);

    double ratio = (double)GM_AUDIO_RATE / rate;
    dec d = {0};
    /* the largest output the limit allows, plus the converter's rounding */
    d.max_out = (int64_t)ceil(max_frames * ratio) + 16;
    int64_t chunk = CHUNK_SAMPLES / ch;
    d.in = gm_malloc((size_t)(chunk * ch) * sizeof(float));
    d.mono = gm_malloc((size_t)chunk * sizeof(float));
    int64_t first = known ? (int64_t)ceil((double)info->frames * ratio) + 16 : OUT_STEP;
    if (first > d.max_out) first = d.max_out;
    if (first < OUT_STEP) first = OUT_STEP;
    d.out = d.in && d.mono ? gm_malloc((size_t)first * sizeof(float)) : NULL;
    d.cap = d.out ? first : 0;
    int se = 0;
    if (rate != GM_AUDIO_RATE && d.out) d.src = src_new(SRC_SINC_BEST_QUALITY, 1, &se);
    if (!d.out || (rate != GM_AUDIO_RATE && !d.src)) {
        dec_release(&d);
        return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory decoding the audio\nhint: free memory", name);
    }

    /* read, average, convert, chunk by chunk */
    int64_t total = 0;
    gm_status s = GM_OK;
    for (;;) {
        /* never more than one frame past the limit: that frame is the proof */
        double room = max_frames + 1 - (double)total;
        sf_count_t k = sf_readf_float(sf, d.in, room < (double)chunk ? (sf_count_t)room : chunk);
        if (k < 0) k = 0;
        total += k;
        if ((double)total > max_frames) {
            fmt_duration((double)total / rate, dur, sizeof dur);
            s = gm_error_set(err, GM_ERR_LIMIT,
                             "%s: longer than the limit of %s (stopped reading after %s; the header %s)\n"
                             "hint: cut it into clips of at most 30 s, or raise gm_audio_limits.max_seconds",
                             name, lim, dur, known ? "gave a shorter length: it is wrong" : "gives no length");
            break;
        }
        sf_count_t bad = -1;
        for (sf_count_t f = 0; f < k; f++) {
            d.mono[f] = ch == 1 ? d.in[f] : pairwise_sum(d.in + f * ch, ch) / (float)ch;
            if (bad < 0 && !isfinite(d.mono[f])) bad = f;
        }
        /* a float file can hold NaN or infinity; the features (and a loss) would turn NaN */
        if (bad >= 0) {
            s = gm_error_set(err, GM_ERR_FORMAT, "%s: frame %lld (at %.3f s) is not a finite number (NaN or infinity)\n%s", name,
                             (long long)(total - k + bad), (double)(total - k + bad) / rate, HINT_CORRUPT);
            break;
        }
        bool eof = k == 0;
        if (d.src) {
            int e = convert(&d, d.mono, k, eof, ratio);
            if (e) {
                s = e == CONVERT_NOMEM ? gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory converting the audio to 16 kHz\nhint: free memory", name)
                    : e == CONVERT_STALLED ? gm_error_set(err, GM_ERR_RUNTIME, "%s: libsamplerate stopped converting at %lld frames (a bug: "
                                                          "please report it with the file)", name, (long long)total)
                                           : gm_error_set(err, GM_ERR_FORMAT, "%s: libsamplerate: %s\n%s", name, src_strerror(e), HINT_CORRUPT);
                break;
            }
        } else if (k > 0) {
            if (!out_reserve(&d, k)) {
                s = gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory decoding the audio\nhint: free memory", name);
                break;
            }
            memcpy(d.out + d.n, d.mono, (size_t)k * sizeof(float));
            d.n += k;
        }
        if (eof) break;
    }
    /* what the decoder found on the way, and the length against the header's */
    if (s == GM_OK && sf_error(sf) != SF_ERR_NO_ERROR)
        s = gm_error_set(err, GM_ERR_FORMAT, "%s: corrupt audio data after %lld of %lld frames: %s\n%s", name, (long long)total,
                         (long long)info->frames, sf_strerror(sf), HINT_CORRUPT);
    if (s == GM_OK && known && total < info->frames)
        s = gm_error_set(err, GM_ERR_FORMAT, "%s: truncated: the header announces %lld frames (%.2f s), the file holds %lld (%.2f s)\n%s",
                         name, (long long)info->frames, (double)info->frames / rate, (long long)total, (double)total / rate,
                         HINT_CORRUPT);
    if (s == GM_OK && total == 0)
        s = gm_error_set(err, GM_ERR_FORMAT, "%s: no audio in the file (0 frames)\nhint: the recording is empty; make it again", name);
    if (s != GM_OK) {
        dec_release(&d);
        return s;
    }
    /* give back the unused tail (never fails to keep the data: a failed shrink keeps the block) */
    if (d.n > 0 && d.n < d.cap) {
        float *p = gm_realloc(d.out, (size_t)d.n * sizeof(float));
        if (p) d.out = p;
    }
    *out = (gm_audio){.n = d.n, .samples = d.n > 0 ? d.out : NULL, .src_rate = rate, .src_channels = ch, .src_frames = total};
    if (d.n == 0) gm_free(d.out);
    d.out = NULL;
    dec_release(&d);
    return GM_OK;
}

gm_status gm_audio_load(const char *path, const gm_audio_limits *limits, gm_audio *out, gm_error *err) {
    GM_ASSERT(path && out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return gm_error_set(err, GM_ERR_IO, "%s: cannot open: %s\nhint: check the path and the file's permissions", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
        close(fd);
        return gm_error_set(err, GM_ERR_IO, "%s: is a folder, not an audio file\nhint: give the path of a WAV, FLAC or Ogg file", path);
    }
    if (S_ISREG(st.st_mode) && st.st_size == 0) {
        close(fd);
        return gm_error_set(err, GM_ERR_FORMAT, "%s: empty file (0 bytes)\nhint: the file was not written completely; make or get it again", path);
    }
    uint8_t head[16];
    ssize_t nh = pread(fd, head, sizeof head, 0);
    SF_INFO info = {0};
    pthread_mutex_lock(&open_mutex);
    SNDFILE *sf = sf_open_fd(fd, SFM_READ, &info, SF_FALSE);
    int code = sf ? 0 : sf_error(NULL);
    char why[256];
    snprintf(why, sizeof why, "%s", sf ? "" : sf_strerror(NULL));
    pthread_mutex_unlock(&open_mutex);
    if (!sf) {
        close(fd);
        return open_error(path, code, why, head, nh > 0 ? (size_t)nh : 0, err);
    }
    gm_status s = decode_sf(sf, &info, path, limits, out, err);
    sf_close(sf);
    close(fd);
    return s;
}

gm_status gm_audio_decode(const void *data, size_t n, const char *name, const gm_audio_limits *limits, gm_audio *out,
                          gm_error *err) {
    GM_ASSERT(out && (data || n == 0));
    if (!name) name = "(audio in memory)";
    if (n == 0)
        return gm_error_set(err, GM_ERR_FORMAT, "%s: empty file (0 bytes)\nhint: the file was not written completely; make or get it again", name);
    membuf m = {data, (sf_count_t)n, 0};
    SF_VIRTUAL_IO vio = {vio_len, vio_seek, vio_read, vio_write, vio_tell};
    SF_INFO info = {0};
    pthread_mutex_lock(&open_mutex);
    SNDFILE *sf = sf_open_virtual(&vio, SFM_READ, &info, &m);
    int code = sf ? 0 : sf_error(NULL);
    char why[256];
    snprintf(why, sizeof why, "%s", sf ? "" : sf_strerror(NULL));
    pthread_mutex_unlock(&open_mutex);
    if (!sf) return open_error(name, code, why, data, n < 16 ? n : 16, err);
    gm_status s = decode_sf(sf, &info, name, limits, out, err);
    sf_close(sf);
    return s;
}

void gm_audio_free(gm_audio *a) {
    if (!a) return;
    gm_free(a->samples);
    *a = (gm_audio){0};
}

gm_status gm_audio_check(const char *path, const gm_audio_limits *limits, int64_t *samples, int64_t *frames,
                         char sha[65], gm_error *err) {
    gm_audio a = {0};
    GM_TRY(gm_audio_load(path, limits, &a, err));
    int64_t n = a.n, T = 0, min = limits && limits->min_samples > 0 ? limits->min_samples : GM_AUDIO_MIN_SAMPLES;
    gm_audio_free(&a);
    gm_audio_frames(n, NULL, &T);
    if (n < min)
        return gm_error_set(err, GM_ERR_FORMAT, "%s: %lld samples at 16 kHz (%.1f ms) is shorter than the feature extractor's "
                            "first frame (%lld samples: %s)\n  hint: leave the clip out, or pad it with silence",
                            path, (long long)n, 1000.0 * (double)n / GM_AUDIO_RATE, (long long)min,
                            min == GM_AUDIO_MIN_SAMPLES ? "a 32 ms window and the next sample" : "Gemma 4's, after its 10 ms of padding");
    GM_TRY(gm_sha256_file(path, sha, err));
    *samples = n, *frames = T;
    return GM_OK;
}

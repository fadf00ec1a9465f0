/*
 * gm_mmap.c - POSIX mmap wrapper.
 */
#define _DEFAULT_SOURCE /* madvise(MADV_DONTNEED); implies _POSIX_C_SOURCE 200809L */
#include "gm_mmap.h"

#include <zlib.h>

#include "gm_alloc.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* stat before open: opening a FIFO for reading would block forever. */
static gm_status check_regular(const char *path, gm_error *err) {
    struct stat st;
    if (stat(path, &st) != 0)
        return gm_error_set(err, GM_ERR_IO, "%s: cannot open: %s", path,
                            errno == ELOOP ? "too many levels of symbolic links (a link loop?)" : strerror(errno));
    if (!S_ISREG(st.st_mode))
        return gm_error_set(err, GM_ERR_IO, "%s: not a regular file (%s)", path,
                            S_ISDIR(st.st_mode) ? "a folder" : S_ISFIFO(st.st_mode) ? "a pipe" : "a device or socket");
    return GM_OK;
}

gm_status gm_mmap_open(const char *path, gm_mapped_file *out, gm_error *err) {
    memset(out, 0, sizeof *out);
    GM_TRY(check_regular(path, err));
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0)
        return gm_error_set(err, GM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return gm_error_set(err, GM_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return gm_error_set(err, GM_ERR_IO, "%s: not a regular file", path);
    }
    out->size = (size_t)st.st_size;
    if (out->size > 0) {
        void *p = mmap(NULL, out->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return gm_error_set(err, GM_ERR_IO, "%s: cannot map: %s", path, strerror(e));
        }
        out->data = p;
    }
    close(fd);
    out->path = gm_strdup(path);
    if (!out->path) {
        gm_mmap_close(out);
        return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", path);
    }
    return GM_OK;
}

void gm_mmap_close(gm_mapped_file *f) {
    if (!f) return;
    if (f->data) munmap((void *)f->data, f->size);
    gm_free(f->path);
    memset(f, 0, sizeof *f);
}

gm_status gm_read_file(const char *path, char **out, size_t *len, gm_error *err) {
    *out = NULL;
    GM_TRY(check_regular(path, err));
    FILE *fp = fopen(path, "rb");
    if (!fp) return gm_error_set(err, GM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fseek(fp, 0, SEEK_END) != 0) {
        fclose(fp);
        return gm_error_set(err, GM_ERR_IO, "%s: cannot seek", path);
    }
    long n = ftell(fp);
    if (n < 0) {
        fclose(fp);
        return gm_error_set(err, GM_ERR_IO, "%s: cannot tell size", path);
    }
    rewind(fp);
    char *buf = gm_malloc((size_t)n + 1);
    if (!buf) {
        fclose(fp);
        return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory (%ld bytes)", path, n);
    }
    size_t got = fread(buf, 1, (size_t)n, fp);
    fclose(fp);
    if (got != (size_t)n) {
        gm_free(buf);
        return gm_error_set(err, GM_ERR_IO, "%s: short read", path);
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = (size_t)n;
    return GM_OK;
}

void gm_mmap_release(const void *p, size_t n) {
    long page = sysconf(_SC_PAGESIZE);
    if (!p || n == 0 || page <= 0) return;
    uintptr_t a = (uintptr_t)p, b = a + n;
    uintptr_t a0 = (a + (uintptr_t)page - 1) & ~((uintptr_t)page - 1), b0 = b & ~((uintptr_t)page - 1);
    if (b0 > a0) madvise((void *)a0, b0 - a0, MADV_DONTNEED);
}

gm_status gm_read_text_file(const char *path, char **out, size_t *len, gm_error *err) {
    char *raw = NULL;
    size_t n = 0;
    GM_TRY(gm_read_file(path, &raw, &n, err));
    if (n < 2 || (unsigned char)raw[0] != 0x1f || (unsigned char)raw[1] != 0x8b) {
        *out = raw, *len = n;
        return GM_OK;
    }
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 15 + 32) != Z_OK) { /* 32: a gzip header */
        gm_free(raw);
        return gm_error_set(err, GM_ERR_NOMEM, "%s: zlib could not start", path);
    }
    size_t cap = n * 4 + 4096, used = 0;
    char *buf = gm_malloc(cap + 1);
    int rc = buf ? Z_OK : Z_MEM_ERROR;
    z.next_in = (Bytef *)raw;
    z.avail_in = (uInt)n;
    while (rc == Z_OK) {
        if (used == cap) {
            if (cap >= GM_GUNZIP_MAX) break;
            size_t nc = cap * 2 > GM_GUNZIP_MAX ? GM_GUNZIP_MAX : cap * 2;
            char *nb = gm_realloc(buf, nc + 1);
            if (!nb) {
                rc = Z_MEM_ERROR;
                break;
            }
            buf = nb, cap = nc;
        }
        z.next_out = (Bytef *)buf + used;
        z.avail_out = (uInt)(cap - used);
        rc = inflate(&z, Z_NO_FLUSH);
        used = cap - z.avail_out;
    }
    const char *why = z.msg ? z.msg : "truncated stream";
    inflateEnd(&z);
    gm_free(raw);
    gm_status s = GM_OK;
    if (rc == Z_MEM_ERROR) s = gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory inflating it", path);
    else if (rc == Z_OK) s = gm_error_set(err, GM_ERR_LIMIT, "%s: inflates to more than %zu MiB", path, GM_GUNZIP_MAX >> 20);
    else if (rc != Z_STREAM_END) s = gm_error_set(err, GM_ERR_FORMAT, "%s: damaged gzip data (%s)", path, why);
    if (s != GM_OK) {
        gm_free(buf);
        return s;
    }
    buf[used] = '\0';
    *out = buf, *len = used;
    return GM_OK;
}

/*
 * gm_file.c - whole-file writes: a plain one and the crash-safe tmp + fsync + rename one.
 */
#include "gm_file.h"

#include "gm_alloc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

gm_status gm_write_file_parts(const char *path, const gm_file_part *parts, int n_parts, bool durable, gm_error *err) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return gm_error_set(err, GM_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    gm_status s = GM_OK;
    size_t total = 0, done = 0;
    for (int i = 0; i < n_parts; i++) total += parts[i].n;
    for (int i = 0; s == GM_OK && i < n_parts; i++) {
        const unsigned char *p = parts[i].data;
        for (size_t k = 0; k < parts[i].n;) {
            ssize_t w = write(fd, p + k, parts[i].n - k);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) { // 0 from a regular file means no progress is possible: never spin on it
                s = gm_error_set(err, GM_ERR_IO, "%s: write failed after %zu of %zu bytes: %s", path, done, total,
                                 w < 0 ? strerror(errno) : "no progress");
                break;
            }
            k += (size_t)w;
            done += (size_t)w;
        }
    }
    if (s == GM_OK && durable && fsync(fd) != 0)
        s = gm_error_set(err, GM_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
    // close releases the descriptor even when it fails; NFS reports deferred write errors here
    if (close(fd) != 0 && s == GM_OK)
        s = gm_error_set(err, GM_ERR_IO, "%s: close failed: %s", path, strerror(errno));
    return s;
}

gm_status gm_write_file(const char *path, const void *data, size_t n, bool durable, gm_error *err) {
    gm_file_part part = {data, n};
    return gm_write_file_parts(path, &part, 1, durable, err);
}

/* open(2)s the folder `p` and fsync(2)s it; EINVAL (a file system that cannot sync folders) is
 * not an error. */
static gm_status sync_folder(const char *p, gm_error *err) {
    int fd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return gm_error_set(err, GM_ERR_IO, "%s: cannot open to fsync: %s", p, strerror(errno));
    int rc = fsync(fd), e = errno;
    close(fd);
    if (rc != 0 && e != EINVAL) return gm_error_set(err, GM_ERR_IO, "%s: fsync failed: %s", p, strerror(e));
    return GM_OK;
}

gm_status gm_write_file_atomic(const char *path, const void *data, size_t n, gm_error *err) {
    gm_file_part part = {data, n};
    return gm_write_file_atomic_parts(path, &part, 1, err);
}

gm_status gm_write_file_atomic_parts(const char *path, const gm_file_part *parts, int n_parts, gm_error *err) {
    size_t len = strlen(path);
    const char *slash = strrchr(path, '/');
    char *tmp = gm_malloc(len + 5);
    char *folder = !slash ? gm_strdup(".") : slash == path ? gm_strdup("/") : gm_strndup(path, (size_t)(slash - path));
    gm_status s = GM_OK;
    if (!tmp || !folder) {
        s = gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory", path);
        goto cleanup;
    }
    memcpy(tmp, path, len);
    memcpy(tmp + len, ".tmp", 5);
    // 1. the bytes into <path>.tmp, durable before they can replace anything
    if ((s = gm_write_file_parts(tmp, parts, n_parts, true, err)) != GM_OK) {
        unlink(tmp); // never leave a partial file behind (it may be absent: ignore errors)
        gm_error_prefix(err, "%s not replaced (the previous file there, if any, is untouched)", path);
        goto cleanup;
    }
    // 2. the atomic switch
    if (rename(tmp, path) != 0) {
        s = gm_error_set(err, GM_ERR_IO, "%s: cannot rename %s onto it: %s (the previous file there, if any, "
                         "is untouched)", path, tmp, strerror(errno));
        unlink(tmp);
        goto cleanup;
    }
    // 3. the new folder entry durable too
    if ((s = sync_folder(folder, err)) != GM_OK)
        gm_error_prefix(err, "%s was replaced, but the new file may not survive a power cut", path);
cleanup:
    gm_free(tmp);
    gm_free(folder);
    return s;
}

gm_status gm_folder_foreign(const char *dir, const char *const *allowed, int n, char *found, size_t cap, gm_error *err) {
    if (cap) found[0] = '\0';
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? GM_OK : gm_error_set(err, GM_ERR_IO, "%s: cannot read the folder: %s", dir, strerror(errno));
    for (struct dirent *e; (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        bool ours = false;
        for (int i = 0; i < n && !ours; i++) ours = strcmp(e->d_name, allowed[i]) == 0;
        if (!ours) {
            snprintf(found, cap, "%s", e->d_name);
            break;
        }
    }
    closedir(d);
    return GM_OK;
}

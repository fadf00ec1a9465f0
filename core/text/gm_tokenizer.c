/*
 * gm_tokenizer.c - Gemma's BPE tokenizer: tables, added-token tries, the merge loop, the GGUF
 * and tokenizer.json loaders, and decoding (contract in gm_tokenizer.h, prose in
 * docs/tokenizer.md).
 *
 * Encoding is three passes over the text, as Hugging Face's tokenizers does it:
 *   1. split the raw text at added tokens stored un-normalized (all GGUF CONTROL / UNKNOWN /
 *      USER_DEFINED tokens; tokenizer.json added_tokens with normalized=false), taking at each
 *      position the longest match and scanning left to right (Aho-Corasick "leftmost longest");
 *   2. normalize each remaining fragment (" " -> U+2581, optional "▁" prefix) and split it at
 *      added tokens stored normalized (tokenizer.json only);
 *   3. run BPE on each piece: one symbol per UTF-8 character (characters missing from the
 *      vocabulary become byte tokens <0xXX>), then repeatedly merge the best adjacent pair.
 *      The candidate pairs live in a binary min-heap keyed (p1, p2, left index); stale entries
 *      are skipped when popped (the left symbol changed, or its right neighbour did).
 * Pair priority: tokenizer.json -> (merge rank, 0); GGUF -> (id of the merged token, -chars of
 * the left part). The GGUF rule is what transformers derives for Gemma GGUFs (merges sorted by
 * the merged token's position in the file, longer left part first). This code matched that
 * tokenizer on 35,218 strings during development (all 15,218 fortunes of Debian's fortune
 * files and 20,000 random strings, a third with specials as text); the committed check is
 * tests/ref/tokenizer_ref.json (313 strings, tests/unit/test_tokenizer_model.c).
 * llama.cpp's "highest score first" gives the same order on Gemma's normal tokens because the
 * scores fall strictly with the id, but Gemma's added tokens all score -1000: ranked by score,
 * the space runs "▁▁".."▁"x31 (ids 138-167) would merge far too late. llama.cpp sidesteps that
 * by splitting space runs out before merging, longest first, which gives different ids from
 * Hugging Face for runs of 32 or more spaces (docs/tokenizer.md); we follow Hugging Face.
 *
 * Memory: encode allocates per call (reentrant) a few tens of bytes per byte of its longest
 * text fragment (symbols, the growing heap, the normalized copy), reused across fragments and
 * freed before it returns.
 *
 * Tables are small open-addressing hash tables written here: text -> id (FNV-1a, linear
 * probing, the 32-bit hash kept beside the id so most probes never touch the text), and
 * uint64 -> int32 (merge pair -> rank, trie edge (node, byte) -> child).
 */
#include "gm_tokenizer.h"

#include "gm_alloc.h" /* gm_malloc, gm_calloc, gm_realloc, gm_free */
#include "gm_file.h"  /* gm_write_file_atomic */
#include "gm_gguf.h"  /* gm_gguf_get_* for gm_tokenizer_from_gguf */
#include "gm_log.h"   /* GM_WARN */
#include "gm_mmap.h"  /* gm_read_file */

#include <cjson/cJSON.h>

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's visible space. */
#define META "\xE2\x96\x81"
#define META_LEN 3

/* Per-token flags. */
enum {
    F_SPECIAL = 1,   /* matched in text only when parse_special (CONTROL / UNKNOWN / special) */
    F_ADDED_RAW = 2, /* split out of the raw text (pass 1) */
    F_ADDED_NORM = 4, /* split out of the normalized text (pass 2) */
    F_LSTRIP = 8,    /* swallows whitespace on its left */
    F_RSTRIP = 16,   /* swallows whitespace on its right */
};

typedef enum merge_mode { MERGE_VOCAB_ORDER, MERGE_RANKED } merge_mode;

/* ---- hashing ------------------------------------------------------------------------------ */

static uint32_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a 64 offset basis */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return (uint32_t)(h ^ (h >> 32));
}

static uint64_t mix64(uint64_t x) { /* splitmix64 finalizer: spreads sequential keys */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* uint64 -> int32 map; keys must not be UINT64_MAX (the empty marker). */
typedef struct u64map {
    uint64_t *keys;
    int32_t *vals;
    size_t mask, count;
} u64map;

static gm_status u64map_init(u64map *m, size_t expected) {
    size_t cap = pow2_at_least(expected * 2 + 1);
    m->keys = gm_malloc(cap * sizeof *m->keys);
    m->vals = gm_malloc(cap * sizeof *m->vals);
    if (!m->keys || !m->vals) {
        gm_free(m->keys);
        gm_free(m->vals);
        memset(m, 0, sizeof *m);
        return GM_ERR_NOMEM;
    }
    memset(m->keys, 0xff, cap * sizeof *m->keys);
    m->mask = cap - 1;
    m->count = 0;
    return GM_OK;
}

static void u64map_free(u64map *m) {
    gm_free(m->keys);
    gm_free(m->vals);
    memset(m, 0, sizeof *m);
}

static int32_t u64map_get(const u64map *m, uint64_t key) {
    if (!m->keys) return -1;
    for (size_t i = mix64(key) & m->mask;; i = (i + 1) & m->mask) {
        if (m->keys[i] == key) return m->vals[i];
        if (m->keys[i] == UINT64_MAX) return -1;
    }
}

/* Inserts or overwrites. Grows at load 1/2. */
static gm_status u64map_put(u64map *m, uint64_t key, int32_t val) {
    if ((m->count + 1) * 2 > m->mask + 1) {
        u64map bigger;
        if (u64map_init(&bigger, (m->mask + 1)) != GM_OK) return GM_ERR_NOMEM;
        for (size_t i = 0; i <= m->mask; i++)
            if (m->keys[i] != UINT64_MAX) u64map_put(&bigger, m->keys[i], m->vals[i]);
        u64map_free(m);
        *m = bigger;
    }
    size_t i = mix64(key) & m->mask;
    while (m->keys[i] != UINT64_MAX && m->keys[i] != key) i = (i + 1) & m->mask;
    if (m->keys[i] == UINT64_MAX) m->count++;
    m->keys[i] = key;
    m->vals[i] = val;
    return GM_OK;
}

/* ---- added-token trie ----------------------------------------------------------------------
 * Node 0 is the root; edges (node << 8 | byte) -> child live in a u64map; tok[node] is the
 * token ending there or -1. `first` marks bytes that start some token, to skip most positions
 * with one bit test. */
typedef struct trie {
    int32_t *tok;
    int64_t n_nodes, cap;
    u64map edges;
    uint8_t first[32];
} trie;

static gm_status trie_init(trie *t) {
    memset(t, 0, sizeof *t);
    t->cap = 64;
    t->tok = gm_malloc((size_t)t->cap * sizeof *t->tok);
    if (!t->tok) return GM_ERR_NOMEM;
    t->tok[0] = -1;
    t->n_nodes = 1;
    return u64map_init(&t->edges, 64);
}

static void trie_free(trie *t) {
    gm_free(t->tok);
    u64map_free(&t->edges);
    memset(t, 0, sizeof *t);
}

static gm_status trie_add(trie *t, const char *s, size_t n, int32_t id) {
    if (n == 0) return GM_OK; /* an empty token can never be matched */
    int64_t node = 0;
    for (size_t k = 0; k < n; k++) {
        uint64_t key = ((uint64_t)node << 8) | (unsigned char)s[k];
        int32_t child = u64map_get(&t->edges, key);
        if (child < 0) {
            if (t->n_nodes == t->cap) {
                int32_t *nt = gm_realloc(t->tok, (size_t)t->cap * 2 * sizeof *nt);
                if (!nt) return GM_ERR_NOMEM;
                t->tok = nt;
                t->cap *= 2;
            }
            child = (int32_t)t->n_nodes++;
            t->tok[child] = -1;
            GM_TRY(u64map_put(&t->edges, key, child));
        }
        node = child;
    }
    t->first[(unsigned char)s[0] >> 3] |= (uint8_t)(1u << ((unsigned char)s[0] & 7));
    t->tok[node] = id;
    return GM_OK;
}

/* ---- the tokenizer ------------------------------------------------------------------------ */

struct gm_tokenizer {
    int64_t n;         /* number of ids */
    char *text;        /* all token texts, concatenated */
    size_t *off;       /* (n + 1) offsets into text */
    uint8_t *type;     /* gm_token_type per id */
    uint8_t *flag;     /* F_* per id */
    /* text -> id, open addressing: slot_id -1 = empty */
    int32_t *slot_id;
    uint32_t *slot_hash;
    size_t slot_mask;
    /* tokenizer.json merges: (left id << 32 | right id) -> rank; merge_new[rank] = merged id */
    u64map merges;
    int32_t *merge_new;
    trie raw, norm;    /* pass-1 and pass-2 added tokens */
    int32_t byte_id[256]; /* <0xXX> ids, -1 when absent */
    gm_special_ids special;
    merge_mode mode;
    bool add_bos, add_space_prefix, replace_space;
    bool byte_fallback, fuse_unk, ignore_merges;
};

static inline const char *tok_str(const gm_tokenizer *t, int32_t id, size_t *len) {
    *len = t->off[id + 1] - t->off[id];
    return t->text + t->off[id];
}

int32_t gm_tokenizer_find(const gm_tokenizer *t, const char *s, size_t n) {
    if (!t || (!s && n)) return -1;
    uint32_t h = hash_bytes(s, n);
    for (size_t i = h & t->slot_mask;; i = (i + 1) & t->slot_mask) {
        int32_t id = t->slot_id[i];
        if (id < 0) return -1;
        if (t->slot_hash[i] == h) {
            size_t len;
            const char *p = tok_str(t, id, &len);
            if (len == n && memcmp(p, s, n) == 0) return id;
        }
    }
}

/* Inserts id under its text unless `keep_first` and the text is already present; otherwise a
 * later duplicate replaces the earlier one (Python dict / llama.cpp map semantics). */
static void slot_put(gm_tokenizer *t, int32_t id, bool keep_first) {
    size_t n;
    const char *s = tok_str(t, id, &n);
    uint32_t h = hash_bytes(s, n);
    size_t i = h & t->slot_mask;
    for (;; i = (i + 1) & t->slot_mask) {
        int32_t cur = t->slot_id[i];
        if (cur < 0) break;
        if (t->slot_hash[i] == h) {
            size_t len;
            const char *p = tok_str(t, cur, &len);
            if (len == n && memcmp(p, s, n) == 0) {
                if (keep_first) return;
                break;
            }
        }
    }
    t->slot_id[i] = id;
    t->slot_hash[i] = h;
}

void gm_tokenizer_free(gm_tokenizer *t) {
    if (!t) return;
    gm_free(t->text);
    gm_free(t->off);
    gm_free(t->type);
    gm_free(t->flag);
    gm_free(t->slot_id);
    gm_free(t->slot_hash);
    u64map_free(&t->merges);
    gm_free(t->merge_new);
    trie_free(&t->raw);
    trie_free(&t->norm);
    gm_free(t);
}

/* Gemma GGUFs store the space-run tokens ("  ", "   ", ...) with ASCII spaces; transformers
 * respells a token that contains a space and is otherwise whitespace as "▁" x its length so it
 * matches the normalized text. Returns the number of characters, or 0 if not such a token. */
static size_t space_run_chars(const char *s, size_t n) {
    bool has_space = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == ' ') has_space = true;
        else if (!(c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f')) return 0;
    }
    return has_space ? n : 0;
}

/* Allocates t with n ids and copies the texts (respelling space runs when asked). texts[i] may
 * be NULL for an id without text (lens[i] must then be 0). */
static gm_status tok_alloc(int64_t n, const char *const *texts, const uint64_t *lens, bool respell,
                           gm_tokenizer **out, gm_error *err, const char *label) {
    *out = NULL;
    if (n <= 0 || n > INT32_MAX - 1)
        return gm_error_set(err, GM_ERR_FORMAT, "%s: vocabulary size %lld is out of range", label,
                            (long long)n);
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (lens[i] > (1u << 20) || (lens[i] && !texts[i]))
            return gm_error_set(err, GM_ERR_FORMAT, "%s: token %lld has an invalid text (length %llu)",
                                label, (long long)i, (unsigned long long)lens[i]);
        size_t sr = respell ? space_run_chars(texts[i], (size_t)lens[i]) : 0;
        total += sr ? sr * META_LEN : (size_t)lens[i];
    }
    gm_tokenizer *t = gm_calloc(1, sizeof *t);
    if (!t) return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory for the tokenizer", label);
    size_t cap = pow2_at_least((size_t)n * 2);
    t->n = n;
    t->text = gm_malloc(total + 1);
    t->off = gm_malloc(((size_t)n + 1) * sizeof *t->off);
    t->type = gm_calloc((size_t)n, 1);
    t->flag = gm_calloc((size_t)n, 1);
    t->slot_id = gm_malloc(cap * sizeof *t->slot_id);
    t->slot_hash = gm_malloc(cap * sizeof *t->slot_hash);
    if (!t->text || !t->off || !t->type || !t->flag || !t->slot_id || !t->slot_hash ||
        trie_init(&t->raw) != GM_OK || trie_init(&t->norm) != GM_OK) {
        gm_tokenizer_free(t);
        return gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory for %lld tokens", label,
                            (long long)n);
    }
    memset(t->slot_id, 0xff, cap * sizeof *t->slot_id);
    t->slot_mask = cap - 1;
    size_t o = 0;
    for (int64_t i = 0; i < n; i++) {
        t->off[i] = o;
        size_t sr = respell ? space_run_chars(texts[i], (size_t)lens[i]) : 0;
        if (sr) {
            for (size_t k = 0; k < sr; k++, o += META_LEN) memcpy(t->text + o, META, META_LEN);
        } else if (lens[i]) {
            memcpy(t->text + o, texts[i], (size_t)lens[i]);
            o += (size_t)lens[i];
        }
    }
    t->off[n] = o;
    t->text[o] = '\0';
    t->special = (gm_special_ids){-1, -1, -1, -1, -1, -1};
    *out = t;
    return GM_OK;
}

/* Byte ids, turn markers and tries; called once the texts, types, flags and normalizer
 * settings are final. F_ADDED_NORM contents are normalized before they enter their trie,
 * because tokenizers matches them against normalized text. */
static gm_status tok_finish(gm_tokenizer *t, gm_error *err, const char *label) {
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_id[b] = gm_tokenizer_find(t, name, 6);
    }
    t->special.start_of_turn = gm_tokenizer_find(t, "<start_of_turn>", 15);
    t->special.end_of_turn = gm_tokenizer_find(t, "<end_of_turn>", 13);
    if (t->special.start_of_turn < 0) t->special.start_of_turn = gm_tokenizer_find(t, "<|turn>", 7); /* Gemma 4 */
    if (t->special.end_of_turn < 0) t->special.end_of_turn = gm_tokenizer_find(t, "<turn|>", 7);
    char *buf = NULL;
    size_t buf_cap = 0;
    gm_status st = GM_OK;
    for (int64_t i = 0; i < t->n && st == GM_OK; i++) {
        size_t len;
        const char *s = tok_str(t, (int32_t)i, &len);
        if (t->flag[i] & F_ADDED_RAW) st = trie_add(&t->raw, s, len, (int32_t)i);
        if (st == GM_OK && (t->flag[i] & F_ADDED_NORM)) {
            /* normalize the content: optional "▁" prefix, then " " -> "▁" */
            size_t need = len * META_LEN + META_LEN + 1, o = 0;
            if (need > buf_cap) {
                char *nb = gm_realloc(buf, need);
                if (!nb) {
                    st = GM_ERR_NOMEM;
                    break;
                }
                buf = nb;
                buf_cap = need;
            }
            if (t->add_space_prefix && len) memcpy(buf + o, META, META_LEN), o += META_LEN;
            for (size_t k = 0; k < len; k++) {
                if (s[k] == ' ' && t->replace_space) memcpy(buf + o, META, META_LEN), o += META_LEN;
                else buf[o++] = s[k];
            }
            st = trie_add(&t->norm, buf, o, (int32_t)i);
        }
    }
    gm_free(buf);
    if (st != GM_OK)
        return gm_error_set(err, st, "%s: out of memory building the added-token table", label);
    return GM_OK;
}

/* ---- UTF-8 -------------------------------------------------------------------------------- */

/* Length of the valid UTF-8 character at s (n bytes available), or 0 if it is not one
 * (stray continuation byte, overlong form, surrogate, > U+10FFFF, truncated). */
static int utf8_char_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int need;
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c < 0xC2) return 0;
    else if (c < 0xE0) need = 2;
    else if (c < 0xF0) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c < 0xF5) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 0;
    if (n < (size_t)need) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int k = 2; k < need; k++)
        if ((s[k] & 0xC0) != 0x80) return 0;
    return need;
}

static bool utf8_valid(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int l = utf8_char_len(s + i, n - i);
        if (!l) return false;
        i += (size_t)l;
    }
    return true;
}

/* ---- encoding ----------------------------------------------------------------------------- */

typedef struct sym {
    int32_t off, len;   /* bytes of the normalized text; len 0 = merged away */
    int32_t id;
    int32_t prev, next; /* neighbours, -1 at the ends */
    int32_t nch;        /* characters; 0 = byte-fallback or <unk> symbol (never merged by text) */
} sym;

typedef struct cand {
    int32_t p1, p2;     /* priority, smaller first */
    int32_t pos;        /* left symbol index: ties go to the leftmost pair */
    int32_t idl, idr, idm; /* the pair as it was when pushed, and the merged id */
} cand;

typedef struct scratch {
    char *norm;
    size_t norm_cap;
    sym *syms;
    cand *heap;
    size_t sym_cap, heap_cap, heap_n;
    bool nomem; /* a heap allocation failed */
} scratch;

typedef struct writer {
    int32_t *ids;
    int64_t cap, n;
} writer;

static inline void emit(writer *w, int32_t id) {
    if (w->n < w->cap) w->ids[w->n] = id;
    w->n++;
}

static inline bool cand_less(const cand *a, const cand *b) {
    if (a->p1 != b->p1) return a->p1 < b->p1;
    if (a->p2 != b->p2) return a->p2 < b->p2;
    return a->pos < b->pos;
}

static void heap_push(scratch *s, cand c) {
    if (s->heap_n == s->heap_cap) { /* grows on demand: most texts need far less than 3n */
        size_t cap = s->heap_cap * 2 + 64;
        cand *nh = gm_realloc(s->heap, cap * sizeof *nh);
        if (!nh) {
            s->nomem = true; /* bpe() reports it; dropping a candidate here is harmless */
            return;
        }
        s->heap = nh;
        s->heap_cap = cap;
    }
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &s->heap[p])) break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = c;
}

static cand heap_pop(scratch *s) {
    cand top = s->heap[0], last = s->heap[--s->heap_n];
    size_t i = 0, n = s->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const cand *best = &last;
        if (l < n && cand_less(&s->heap[l], best)) m = l, best = &s->heap[l];
        if (r < n && cand_less(&s->heap[r], best)) m = r;
        if (m == i) break;
        s->heap[i] = s->heap[m];
        i = m;
    }
    if (n) s->heap[i] = last;
    return top;
}

/* Pushes the pair (i, next(i)) if it can merge. */
static void try_pair(const gm_tokenizer *t, scratch *s, int32_t i) {
    if (i < 0) return;
    const sym *a = &s->syms[i];
    if (a->next < 0) return;
    const sym *b = &s->syms[a->next];
    cand c = {.pos = i, .idl = a->id, .idr = b->id};
    if (t->mode == MERGE_RANKED) {
        int32_t r = u64map_get(&t->merges, ((uint64_t)(uint32_t)a->id << 32) | (uint32_t)b->id);
        if (r < 0) return;
        c.p1 = r;
        c.p2 = 0;
        c.idm = t->merge_new[r];
    } else {
        if (a->nch == 0 || b->nch == 0) return;
        /* the two symbols are adjacent in the normalized text, so their concatenation is a
         * contiguous slice: no copy needed */
        int32_t m = gm_tokenizer_find(t, s->norm + a->off, (size_t)a->len + (size_t)b->len);
        if (m < 0) return;
        c.p1 = m;
        c.p2 = -a->nch;
        c.idm = m;
    }
    heap_push(s, c);
}

static gm_status ensure_sym_cap(scratch *s, size_t nbytes) {
    if (nbytes <= s->sym_cap) return GM_OK;
    size_t cap = s->sym_cap ? s->sym_cap : 64;
    while (cap < nbytes) cap *= 2;
    sym *ns = gm_realloc(s->syms, cap * sizeof *ns);
    if (!ns) return GM_ERR_NOMEM;
    s->syms = ns;
    s->sym_cap = cap;
    return GM_OK;
}

/* BPE over s->norm[off0, off0 + len). */
static gm_status bpe(const gm_tokenizer *t, scratch *s, size_t off0, size_t len, writer *w,
                     gm_error *err) {
    if (len == 0) return GM_OK;
    const char *text = s->norm;
    if (t->ignore_merges) { /* tokenizers: a word that is a token is taken whole */
        int32_t id = gm_tokenizer_find(t, text + off0, len);
        if (id >= 0) {
            emit(w, id);
            return GM_OK;
        }
    }
    if (ensure_sym_cap(s, len) != GM_OK)
        return gm_error_set(err, GM_ERR_NOMEM, "tokenizer: out of memory for %zu bytes of text", len);
    int32_t n = 0, last_unk = -1;
    size_t end = off0 + len;
    for (size_t p = off0; p < end;) {
        int cl = utf8_char_len((const unsigned char *)text + p, end - p);
        int32_t id = cl ? gm_tokenizer_find(t, text + p, (size_t)cl) : -1;
        if (!cl) cl = 1; /* an invalid byte stands alone and falls back to its byte token */
        if (id >= 0) {
            s->syms[n] = (sym){(int32_t)p, cl, id, n - 1, n + 1, 1};
            n++;
            last_unk = -1;
        } else {
            bool bytes_ok = t->byte_fallback;
            for (int k = 0; k < cl && bytes_ok; k++)
                bytes_ok = t->byte_id[(unsigned char)text[p + (size_t)k]] >= 0;
            if (bytes_ok) {
                for (int k = 0; k < cl; k++) {
                    int32_t bid = t->byte_id[(unsigned char)text[p + (size_t)k]];
                    s->syms[n] = (sym){(int32_t)(p + (size_t)k), 1, bid, n - 1, n + 1, 0};
                    n++;
                }
                last_unk = -1;
            } else if (t->special.unk >= 0) {
                if (t->fuse_unk && last_unk >= 0) {
                    s->syms[last_unk].len += cl; /* consecutive unknowns become one <unk> */
                } else {
                    last_unk = n;
                    s->syms[n] = (sym){(int32_t)p, cl, t->special.unk, n - 1, n + 1, 0};
                    n++;
                }
            } else {
                return gm_error_set(err, GM_ERR_INVALID,
                                    "tokenizer: a character at byte %zu is not in the vocabulary "
                                    "and the tokenizer has neither byte fallback nor <unk>",
                                    p);
            }
        }
        p += (size_t)cl;
    }
    s->syms[n - 1].next = -1;
    s->heap_n = 0;
    for (int32_t i = 0; i + 1 < n; i++) try_pair(t, s, i);
    while (s->heap_n) {
        cand c = heap_pop(s);
        sym *a = &s->syms[c.pos];
        if (a->len == 0 || a->id != c.idl || a->next < 0) continue; /* stale */
        sym *b = &s->syms[a->next];
        if (b->id != c.idr) continue; /* the right neighbour merged on its right meanwhile */
        a->id = c.idm;
        a->len += b->len;
        a->nch += b->nch;
        a->next = b->next;
        if (b->next >= 0) s->syms[b->next].prev = c.pos;
        b->len = 0;
        try_pair(t, s, a->prev);
        try_pair(t, s, c.pos);
    }
    if (s->nomem)
        return gm_error_set(err, GM_ERR_NOMEM, "tokenizer: out of memory for %zu bytes of text", len);
    for (int32_t i = 0; i >= 0; i = s->syms[i].next) emit(w, s->syms[i].id);
    return GM_OK;
}

/* Leftmost-longest: the longest allowed added token starting at s[0]; -1 if none. */
static int32_t trie_match(const gm_tokenizer *t, const trie *tr, const char *s, size_t n,
                          bool parse_special, size_t *mlen) {
    unsigned char c0 = (unsigned char)s[0];
    if (!(tr->first[c0 >> 3] & (1u << (c0 & 7)))) return -1;
    int32_t node = 0, best = -1;
    for (size_t k = 0; k < n; k++) {
        node = u64map_get(&tr->edges, ((uint64_t)node << 8) | (unsigned char)s[k]);
        if (node < 0) break;
        int32_t id = tr->tok[node];
        if (id >= 0 && (parse_special || !(t->flag[id] & F_SPECIAL))) {
            best = id;
            *mlen = k + 1;
        }
    }
    return best;
}

static inline bool is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Pass 2 + 3 on one raw fragment. */
static gm_status encode_fragment(const gm_tokenizer *t, scratch *s, const char *raw, size_t rlen,
                                 bool parse_special, writer *w, gm_error *err) {
    size_t need = rlen * META_LEN + META_LEN + 1;
    if (need > s->norm_cap) {
        char *nb = gm_realloc(s->norm, need);
        if (!nb) return gm_error_set(err, GM_ERR_NOMEM, "tokenizer: out of memory");
        s->norm = nb;
        s->norm_cap = need;
    }
    size_t o = 0;
    /* a fragment is either the first or follows an added token: that is where SentencePiece's
     * dummy prefix (llama.cpp add_space_prefix, tokenizers Prepend) goes */
    if (t->add_space_prefix) memcpy(s->norm, META, META_LEN), o = META_LEN;
    for (size_t i = 0; i < rlen; i++) {
        if (raw[i] == ' ' && t->replace_space) memcpy(s->norm + o, META, META_LEN), o += META_LEN;
        else s->norm[o++] = raw[i];
    }
    if (o > INT32_MAX)
        return gm_error_set(err, GM_ERR_INVALID, "tokenizer: text fragment of %zu bytes is too long", o);
    if (t->norm.n_nodes <= 1) return bpe(t, s, 0, o, w, err);
    size_t frag = 0, pos = 0;
    while (pos < o) {
        size_t ml = 0;
        int32_t id = trie_match(t, &t->norm, s->norm + pos, o - pos, parse_special, &ml);
        if (id < 0) {
            pos++;
            continue;
        }
        size_t ms = pos, me = pos + ml;
        if (t->flag[id] & F_LSTRIP)
            while (ms > frag && is_ws(s->norm[ms - 1])) ms--;
        if (t->flag[id] & F_RSTRIP)
            while (me < o && is_ws(s->norm[me])) me++;
        GM_TRY(bpe(t, s, frag, ms - frag, w, err));
        emit(w, id);
        pos = frag = me;
    }
    return bpe(t, s, frag, o - frag, w, err);
}

gm_status gm_tokenizer_encode(const gm_tokenizer *t, const char *text, size_t len, bool add_bos,
                              bool parse_special, int32_t *ids, int64_t cap, int64_t *n_out,
                              gm_error *err) {
    if (n_out) *n_out = 0;
    if (!t || (!text && len) || (!ids && cap > 0) || cap < 0)
        return gm_error_set(err, GM_ERR_INVALID, "gm_tokenizer_encode: invalid arguments");
    if (len > (size_t)INT32_MAX / META_LEN - 2)
        return gm_error_set(err, GM_ERR_INVALID, "tokenizer: text of %zu bytes is too long", len);
    writer w = {ids, cap, 0};
    scratch s = {0};
    gm_status st = GM_OK;
    if (add_bos && t->special.bos >= 0) emit(&w, t->special.bos);
    size_t frag = 0, pos = 0;
    while (pos < len && st == GM_OK) {
        size_t ml = 0;
        int32_t id = t->raw.n_nodes > 1
                         ? trie_match(t, &t->raw, text + pos, len - pos, parse_special, &ml)
                         : -1;
        if (id < 0) {
            pos++;
            continue;
        }
        size_t ms = pos, me = pos + ml;
        if (t->flag[id] & F_LSTRIP)
            while (ms > frag && is_ws(text[ms - 1])) ms--;
        if (t->flag[id] & F_RSTRIP)
            while (me < len && is_ws(text[me])) me++;
        if (ms > frag) st = encode_fragment(t, &s, text + frag, ms - frag, parse_special, &w, err);
        emit(&w, id);
        pos = frag = me;
    }
    if (st == GM_OK && len > frag)
        st = encode_fragment(t, &s, text + frag, len - frag, parse_special, &w, err);
    gm_free(s.norm);
    gm_free(s.syms);
    gm_free(s.heap);
    if (st != GM_OK) return st;
    if (n_out) *n_out = w.n;
    if (w.n > cap)
        return gm_error_set(err, GM_ERR_LIMIT,
                            "tokenizer: the text needs %lld ids but the buffer holds %lld",
                            (long long)w.n, (long long)cap);
    return GM_OK;
}

gm_status gm_tokenizer_encode_alloc(const gm_tokenizer *t, const char *text, size_t len,
                                    bool add_bos, bool parse_special, int32_t **ids,
                                    int64_t *n_out, gm_error *err) {
    *ids = NULL;
    if (n_out) *n_out = 0;
    /* every token covers at least one byte, plus BOS: len + 1 is always enough */
    int64_t cap = (int64_t)len + 1;
    int32_t *buf = gm_malloc((size_t)cap * sizeof *buf);
    if (!buf) return gm_error_set(err, GM_ERR_NOMEM, "tokenizer: out of memory for %lld ids", (long long)cap);
    int64_t n = 0;
    gm_status st = gm_tokenizer_encode(t, text, len, add_bos, parse_special, buf, cap, &n, err);
    if (st != GM_OK) {
        gm_free(buf);
        return st;
    }
    *ids = buf;
    if (n_out) *n_out = n;
    return GM_OK;
}

/* ---- decoding ----------------------------------------------------------------------------- */

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* The byte of a <0xXX> token, or -1. */
static int byte_of(const gm_tokenizer *t, int32_t id) {
    size_t len;
    const char *s = tok_str(t, id, &len);
    if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int h = hexval(s[3]), l = hexval(s[4]);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
}

size_t gm_tokenizer_decode_piece(const gm_tokenizer *t, int32_t id, bool render_special, char *buf,
                                 size_t cap) {
    size_t need = 0;
    if (cap) buf[0] = '\0';
    if (!t || id < 0 || id >= t->n) return 0;
    size_t len;
    const char *s = tok_str(t, id, &len);
    switch ((gm_token_type)t->type[id]) {
    case GM_TOKEN_BYTE: {
        int b = byte_of(t, id);
        if (b >= 0) {
            if (cap > 1) buf[0] = (char)b, buf[1] = '\0';
            return 1;
        }
        break; /* a BYTE-typed token that is not <0xXX>: print its text */
    }
    case GM_TOKEN_NORMAL:
    case GM_TOKEN_USER_DEFINED: break;
    default:
        if (!render_special) return 0;
        if (cap) {
            size_t k = len < cap - 1 ? len : cap - 1;
            memcpy(buf, s, k);
            buf[k] = '\0';
        }
        return len;
    }
    for (size_t i = 0; i < len;) {
        bool meta = i + META_LEN <= len && memcmp(s + i, META, META_LEN) == 0;
        if (need + 1 < cap) buf[need] = meta ? ' ' : s[i];
        need++;
        i += meta ? META_LEN : 1;
    }
    if (cap) buf[need < cap ? need : cap - 1] = '\0';
    return need;
}

typedef struct strbuf {
    char *p;
    size_t n, cap;
} strbuf;

static bool sb_add(strbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *np = gm_realloc(b->p, cap);
        if (!np) return false;
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return true;
}

gm_status gm_tokenizer_decode(const gm_tokenizer *t, const int32_t *ids, int64_t n,
                              bool render_special, char **out, gm_error *err) {
    *out = NULL;
    if (!t || (!ids && n) || n < 0)
        return gm_error_set(err, GM_ERR_INVALID, "gm_tokenizer_decode: invalid arguments");
    strbuf b = {0};
    bool ok = sb_add(&b, "", 0);
    char piece[256];
    for (int64_t i = 0; i < n && ok;) {
        if (ids[i] < 0 || ids[i] >= t->n) {
            gm_free(b.p);
            return gm_error_set(err, GM_ERR_INVALID,
                                "tokenizer: id %d at position %lld is outside the vocabulary (0..%lld)",
                                ids[i], (long long)i, (long long)t->n - 1);
        }
        if (t->type[ids[i]] == GM_TOKEN_BYTE && byte_of(t, ids[i]) >= 0) {
            /* a run of byte tokens: valid UTF-8 as a whole, or U+FFFD per byte (ByteFallback) */
            size_t start = b.n;
            int64_t j = i;
            for (; j < n && ids[j] >= 0 && ids[j] < t->n && t->type[ids[j]] == GM_TOKEN_BYTE &&
                   byte_of(t, ids[j]) >= 0;
                 j++) {
                char c = (char)byte_of(t, ids[j]);
                ok = ok && sb_add(&b, &c, 1);
            }
            if (ok && !utf8_valid((const unsigned char *)b.p + start, b.n - start)) {
                b.n = start;
                for (int64_t k = i; k < j && ok; k++) ok = sb_add(&b, "\xEF\xBF\xBD", 3);
            }
            i = j;
            continue;
        }
        size_t need = gm_tokenizer_decode_piece(t, ids[i], render_special, piece, sizeof piece);
        if (need < sizeof piece) {
            ok = sb_add(&b, piece, need);
        } else { /* a long piece: decode into the buffer directly */
            char *tmp = gm_malloc(need + 1);
            ok = tmp != NULL;
            if (ok) {
                gm_tokenizer_decode_piece(t, ids[i], render_special, tmp, need + 1);
                ok = sb_add(&b, tmp, need);
            }
            gm_free(tmp);
        }
        i++;
    }
    if (!ok) {
        gm_free(b.p);
        return gm_error_set(err, GM_ERR_NOMEM, "tokenizer: out of memory decoding %lld ids", (long long)n);
    }
    /* SentencePiece's dummy prefix comes back as a leading space: drop it */
    if (t->add_space_prefix && b.n && b.p[0] == ' ') memmove(b.p, b.p + 1, b.n--);
    *out = b.p;
    return GM_OK;
}

/* ---- queries ------------------------------------------------------------------------------ */

int64_t gm_tokenizer_vocab_size(const gm_tokenizer *t) { return t ? t->n : 0; }
bool gm_tokenizer_add_bos(const gm_tokenizer *t) { return t && t->add_bos && t->special.bos >= 0; }
gm_special_ids gm_tokenizer_special(const gm_tokenizer *t) {
    return t ? t->special : (gm_special_ids){-1, -1, -1, -1, -1, -1};
}

const char *gm_tokenizer_token_text(const gm_tokenizer *t, int32_t id, size_t *len) {
    if (!t || id < 0 || id >= t->n) {
        if (len) *len = 0;
        return NULL;
    }
    size_t l;
    const char *s = tok_str(t, id, &l);
    if (len) *len = l;
    return s;
}

gm_token_type gm_tokenizer_token_type(const gm_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n) return GM_TOKEN_UNDEFINED;
    return (gm_token_type)t->type[id];
}

/* ---- from a GGUF vocabulary --------------------------------------------------------------- */

/* Shared by gm_tokenizer_from_vocab and gm_tokenizer_from_gguf; `label` prefixes messages. */
static gm_status build_from_vocab(const char *label, int64_t n, const char *const *tokens,
                                  const uint64_t *lens, const float *scores, const int32_t *types,
                                  gm_special_ids special, bool add_bos, bool add_space_prefix,
                                  gm_tokenizer **out, gm_error *err) {
    *out = NULL;
    if (!tokens || !lens || !scores || !types)
        return gm_error_set(err, GM_ERR_INVALID, "%s: tokens, lengths, scores and types are all required", label);
    for (int64_t i = 0; i < n; i++)
        if (types[i] < GM_TOKEN_UNDEFINED || types[i] > GM_TOKEN_BYTE)
            return gm_error_set(err, GM_ERR_FORMAT,
                                "%s: token_type[%lld] = %d is not a token type (0..6)", label,
                                (long long)i, types[i]);
    const int32_t sp[4] = {special.bos, special.eos, special.unk, special.pad};
    static const char *const sp_name[4] = {"bos", "eos", "unknown", "padding"};
    for (int k = 0; k < 4; k++)
        if (sp[k] < -1 || sp[k] >= n)
            return gm_error_set(err, GM_ERR_FORMAT, "%s: %s_token_id %d is outside the vocabulary (0..%lld)",
                                label, sp_name[k], sp[k], (long long)n - 1);
    gm_tokenizer *t;
    GM_TRY(tok_alloc(n, tokens, lens, true, &t, err, label));
    t->mode = MERGE_VOCAB_ORDER;
    t->add_bos = add_bos;
    t->add_space_prefix = add_space_prefix;
    t->replace_space = true;
    t->byte_fallback = true;
    t->special.bos = special.bos;
    t->special.eos = special.eos;
    t->special.unk = special.unk;
    t->special.pad = special.pad;
    bool scores_fall = true;
    float last = 0;
    bool have_last = false;
    for (int64_t i = 0; i < n; i++) {
        t->type[i] = (uint8_t)types[i];
        slot_put(t, (int32_t)i, false);
        bool respelled = space_run_chars(tokens[i], (size_t)lens[i]) != 0;
        if (types[i] == GM_TOKEN_CONTROL || types[i] == GM_TOKEN_UNKNOWN)
            t->flag[i] = F_ADDED_RAW | F_SPECIAL;
        else if (types[i] == GM_TOKEN_USER_DEFINED && !respelled)
            t->flag[i] = F_ADDED_RAW; /* respelled space runs merge like normal tokens instead */
        if (types[i] == GM_TOKEN_NORMAL) {
            if (have_last && !(scores[i] < last)) scores_fall = false;
            last = scores[i];
            have_last = true;
        }
    }
    if (!scores_fall)
        GM_WARN("%s: the scores of normal tokens do not fall with the id; merging follows the "
                "vocabulary order (Hugging Face's rule for Gemma), which may differ from "
                "llama.cpp's score order for this vocabulary",
                label);
    gm_status st = tok_finish(t, err, label);
    if (st != GM_OK) {
        gm_tokenizer_free(t);
        return st;
    }
    *out = t;
    return GM_OK;
}

gm_status gm_tokenizer_from_vocab(int64_t n, const char *const *tokens, const uint64_t *lens,
                                  const float *scores, const int32_t *types,
                                  gm_special_ids special, bool add_bos, bool add_space_prefix,
                                  gm_tokenizer **out, gm_error *err) {
    return build_from_vocab("vocabulary", n, tokens, lens, scores, types, special, add_bos,
                            add_space_prefix, out, err);
}

/* "missing key" or "key has type X" for a key that failed a typed getter. */
static gm_status gguf_key_error(const gm_gguf *g, const char *key, const char *expected,
                                gm_error *err) {
    const gm_gguf_kv *kv = gm_gguf_find_kv(g, key);
    if (!kv)
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: missing key %s (%s)\n  hint: the GGUF has no usable tokenizer; "
                            "convert the model with llama.cpp's convert_hf_to_gguf.py",
                            gm_gguf_path(g), key, expected);
    if (kv->type == GM_GGUF_ARRAY)
        return gm_error_set(err, GM_ERR_FORMAT, "%s: key %s is an array of %s, expected %s",
                            gm_gguf_path(g), key, gm_gguf_vtype_name(kv->arr_type), expected);
    return gm_error_set(err, GM_ERR_FORMAT, "%s: key %s has type %s, expected %s", gm_gguf_path(g),
                        key, gm_gguf_vtype_name(kv->type), expected);
}

/* Reads an optional token id key into *id (-1 when absent); required keys must exist. */
static gm_status gguf_token_id(const gm_gguf *g, const char *key, bool required, uint64_t n,
                               int32_t *id, gm_error *err) {
    *id = -1;
    int64_t v;
    if (!gm_gguf_get_int(g, key, &v)) {
        if (!required && !gm_gguf_find_kv(g, key)) return GM_OK;
        return gguf_key_error(g, key, "an integer token id", err);
    }
    if (v < 0 || (uint64_t)v >= n)
        return gm_error_set(err, GM_ERR_FORMAT, "%s: %s = %lld is outside the vocabulary (0..%llu)",
                            gm_gguf_path(g), key, (long long)v, (unsigned long long)n - 1);
    *id = (int32_t)v;
    return GM_OK;
}

gm_status gm_tokenizer_from_gguf(const struct gm_gguf *g, gm_tokenizer **out, gm_error *err) {
    *out = NULL;
    if (!g) return gm_error_set(err, GM_ERR_INVALID, "gm_tokenizer_from_gguf: no GGUF");
    const char *path = gm_gguf_path(g);
    gm_strref model;
    if (!gm_gguf_get_str(g, "tokenizer.ggml.model", &model))
        return gguf_key_error(g, "tokenizer.ggml.model", "a string", err);
    if (model.len != 5 || memcmp(model.p, "llama", 5) != 0)
        return gm_error_set(err, GM_ERR_UNSUPPORTED,
                            "%s: tokenizer.ggml.model is \"%.*s\"; only \"llama\" (SentencePiece, "
                            "as in Gemma 1-3) is supported",
                            path, (int)(model.len > 64 ? 64 : model.len), model.p);
    const gm_strref *toks;
    uint64_t n;
    if (!gm_gguf_get_str_array(g, "tokenizer.ggml.tokens", &toks, &n))
        return gguf_key_error(g, "tokenizer.ggml.tokens", "an array of strings", err);
    if (n == 0 || n > INT32_MAX - 1)
        return gm_error_set(err, GM_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries",
                            path, (unsigned long long)n);
    gm_gguf_vtype et;
    const void *sdata, *tdata;
    uint64_t ns, nt;
    if (!gm_gguf_get_array(g, "tokenizer.ggml.scores", &et, &sdata, &ns) || et != GM_GGUF_FLOAT32)
        return gguf_key_error(g, "tokenizer.ggml.scores", "an array of float32", err);
    if (ns != n)
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: tokenizer.ggml.scores has %llu entries but tokenizer.ggml.tokens has %llu",
                            path, (unsigned long long)ns, (unsigned long long)n);
    if (!gm_gguf_get_array(g, "tokenizer.ggml.token_type", &et, &tdata, &nt) || et != GM_GGUF_INT32)
        return gguf_key_error(g, "tokenizer.ggml.token_type", "an array of int32", err);
    if (nt != n)
        return gm_error_set(err, GM_ERR_FORMAT,
                            "%s: tokenizer.ggml.token_type has %llu entries but tokenizer.ggml.tokens has %llu",
                            path, (unsigned long long)nt, (unsigned long long)n);
    gm_special_ids sp = {-1, -1, -1, -1, -1, -1};
    GM_TRY(gguf_token_id(g, "tokenizer.ggml.bos_token_id", true, n, &sp.bos, err));
    GM_TRY(gguf_token_id(g, "tokenizer.ggml.eos_token_id", true, n, &sp.eos, err));
    GM_TRY(gguf_token_id(g, "tokenizer.ggml.unknown_token_id", false, n, &sp.unk, err));
    GM_TRY(gguf_token_id(g, "tokenizer.ggml.padding_token_id", false, n, &sp.pad, err));
    /* llama.cpp adds BOS to a SentencePiece vocabulary unless told otherwise */
    bool add_bos = true, add_space_prefix;
    if (!gm_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos)) {
        if (gm_gguf_find_kv(g, "tokenizer.ggml.add_bos_token"))
            return gguf_key_error(g, "tokenizer.ggml.add_bos_token", "a bool", err);
        add_bos = true;
    }
    /* absent: llama.cpp's SentencePiece default is a dummy prefix, but Gemma never has one */
    gm_strref arch = {0};
    bool gemma = gm_gguf_get_str(g, "general.architecture", &arch) && arch.len >= 5 &&
                 memcmp(arch.p, "gemma", 5) == 0;
    if (!gm_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &add_space_prefix)) {
        if (gm_gguf_find_kv(g, "tokenizer.ggml.add_space_prefix"))
            return gguf_key_error(g, "tokenizer.ggml.add_space_prefix", "a bool", err);
        add_space_prefix = !gemma;
    }
    /* The mapped arrays need not be aligned: copy them out. */
    const char **tp = gm_malloc(n * sizeof *tp);
    uint64_t *lens = gm_malloc(n * sizeof *lens);
    float *scores = gm_malloc(n * sizeof *scores);
    int32_t *types = gm_malloc(n * sizeof *types);
    gm_status st;
    if (!tp || !lens || !scores || !types) {
        st = gm_error_set(err, GM_ERR_NOMEM, "%s: out of memory reading the vocabulary", path);
        goto done;
    }
    memcpy(scores, sdata, n * sizeof *scores);
    memcpy(types, tdata, n * sizeof *types);
    for (uint64_t i = 0; i < n; i++) {
        tp[i] = toks[i].p;
        lens[i] = toks[i].len;
        if (types[i] < GM_TOKEN_UNDEFINED || types[i] > GM_TOKEN_BYTE) {
            st = gm_error_set(err, GM_ERR_FORMAT,
                              "%s: tokenizer.ggml.token_type[%llu] = %d is not a token type (0..6)",
                              path, (unsigned long long)i, types[i]);
            goto done;
        }
    }
    st = build_from_vocab(path, (int64_t)n, tp, lens, scores, types, sp, add_bos, add_space_prefix,
                          out, err);
done:
    gm_free(tp);
    gm_free(lens);
    gm_free(scores);
    gm_free(types);
    return st;
}

/* ---- from a Hugging Face tokenizer.json --------------------------------------------------- */

/* Returns the string of obj[key] when it is a string, NULL otherwise. */
static const char *json_str(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* obj[key] as a bool: true/false; absent or null gives `def`; anything else is an error (-1). */
static int json_bool(const cJSON *obj, const char *key, bool def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return def;
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    return -1;
}

/* A token name in tokenizer_config.json: "text" or {"content": "text"}. */
static const char *json_token_name(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) return json_str(v, "content");
    return NULL;
}

/* Normalizer forms we implement; sets replace_space / prepend. */
static gm_status parse_normalizer(const char *path, const cJSON *nz, bool *replace_space,
                                  bool *prepend, gm_error *err) {
    *replace_space = *prepend = false;
    if (!nz || cJSON_IsNull(nz)) return GM_OK;
    const cJSON *list = nz;
    const char *type = json_str(nz, "type");
    bool seq = type && strcmp(type, "Sequence") == 0;
    if (seq) list = cJSON_GetObjectItemCaseSensitive(nz, "normalizers");
    int n = seq ? cJSON_GetArraySize(list) : 1;
    if (seq && !cJSON_IsArray(list))
        return gm_error_set(err, GM_ERR_FORMAT, "%s: normalizer Sequence without a normalizers array", path);
    for (int i = 0; i < n; i++) {
        const cJSON *it = seq ? cJSON_GetArrayItem(list, i) : nz;
        const char *ty = json_str(it, "type");
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(it, "pattern");
        const char *content = json_str(it, "content");
        if (ty && strcmp(ty, "Replace") == 0 && !*replace_space && json_str(pat, "String") &&
            strcmp(json_str(pat, "String"), " ") == 0 && content && strcmp(content, META) == 0) {
            *replace_space = true;
            continue;
        }
        const char *pre = json_str(it, "prepend");
        if (ty && strcmp(ty, "Prepend") == 0 && i == 0 && pre && strcmp(pre, META) == 0) {
            *prepend = true;
            continue;
        }
        return gm_error_set(err, GM_ERR_UNSUPPORTED,
                            "%s: normalizer %s%s is not supported (only Replace(\" \" -> \"▁\"), "
                            "optionally after Prepend(\"▁\"), as in Gemma and Llama 2)",
                            path, ty ? ty : "(no type)", seq ? " inside a Sequence" : "");
    }
    if (*prepend && !*replace_space)
        return gm_error_set(err, GM_ERR_UNSUPPORTED,
                            "%s: a Prepend normalizer without Replace(\" \" -> \"▁\") is not supported", path);
    return GM_OK;
}

static gm_status parse_pre_tokenizer(const char *path, const cJSON *pt, bool replace_space,
                                     gm_error *err) {
    if (!pt || cJSON_IsNull(pt)) return GM_OK;
    const char *ty = json_str(pt, "type");
    const char *s = json_str(cJSON_GetObjectItemCaseSensitive(pt, "pattern"), "String");
    const char *beh = json_str(pt, "behavior");
    /* Gemma splits at " " after the normalizer has replaced every " ": a no-op */
    if (ty && strcmp(ty, "Split") == 0 && s && strcmp(s, " ") == 0 && replace_space && beh &&
        strcmp(beh, "MergedWithPrevious") == 0 && json_bool(pt, "invert", false) == 0)
        return GM_OK;
    return gm_error_set(err, GM_ERR_UNSUPPORTED,
                        "%s: pre_tokenizer %s is not supported (only none, or Gemma's "
                        "Split(\" \", MergedWithPrevious) after Replace(\" \" -> \"▁\"))",
                        path, ty ? ty : "(no type)");
}

/* post_processor: returns the text of the special token placed before the sequence (BOS), or
 * NULL for none. */
static gm_status parse_post_processor(const char *path, const cJSON *pp, const char **bos,
                                      gm_error *err) {
    *bos = NULL;
    if (!pp || cJSON_IsNull(pp)) return GM_OK;
    const char *ty = json_str(pp, "type");
    if (!ty || strcmp(ty, "TemplateProcessing") != 0)
        return gm_error_set(err, GM_ERR_UNSUPPORTED,
                            "%s: post_processor %s is not supported (only TemplateProcessing)",
                            path, ty ? ty : "(no type)");
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
    bool seen_seq = false;
    const cJSON *it;
    cJSON_ArrayForEach(it, single) {
        const cJSON *stok = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
        if (cJSON_GetObjectItemCaseSensitive(it, "Sequence")) {
            seen_seq = true;
        } else if (stok && !seen_seq && !*bos) {
            const char *id = json_str(stok, "id");
            const cJSON *sts = cJSON_GetObjectItemCaseSensitive(pp, "special_tokens");
            const cJSON *ent = cJSON_GetObjectItemCaseSensitive(sts, id ? id : "");
            const cJSON *toks = cJSON_GetObjectItemCaseSensitive(ent, "tokens");
            /* the token text; the id is looked up in the vocabulary later */
            *bos = cJSON_GetArraySize(toks) == 1 && cJSON_IsString(cJSON_GetArrayItem(toks, 0))
                       ? cJSON_GetArrayItem(toks, 0)->valuestring
                       : id;
        } else {
            return gm_error_set(err, GM_ERR_UNSUPPORTED,
                                "%s: post_processor template adds special tokens other than one "
                                "BOS before the text (e.g. an EOS); not supported",
                                path);
        }
    }
    return GM_OK;
}

/* Everything parsed from a tokenizer.json that tok_alloc needs. */
typedef struct hf_vocab {
    int64_t n;
    const char **texts;
    uint64_t *lens;
    uint8_t *types, *flags;
    int32_t *merge_l, *merge_r; /* by rank */
    int64_t n_merges;
} hf_vocab;

static void hf_vocab_free(hf_vocab *v) {
    gm_free(v->texts);
    gm_free(v->lens);
    gm_free(v->types);
    gm_free(v->flags);
    gm_free(v->merge_l);
    gm_free(v->merge_r);
}

static bool is_byte_token(const char *s, size_t n) {
    return n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' && hexval(s[3]) >= 0 &&
           hexval(s[4]) >= 0 && !(s[3] >= 'a' && s[3] <= 'f') && !(s[4] >= 'a' && s[4] <= 'f');
}

static gm_status hf_load(const char *path, const char *config_path, cJSON *root, cJSON *cfg,
                         gm_tokenizer **out, gm_error *err) {
    hf_vocab v = {0};
    gm_tokenizer *t = NULL;
    gm_status st = GM_OK;
#define FAIL(code, ...)                                                                          \
    do {                                                                                         \
        st = gm_error_set(err, code, __VA_ARGS__);                                               \
        goto fail;                                                                               \
    } while (0)
    if (!cJSON_IsObject(root)) FAIL(GM_ERR_FORMAT, "%s: the top level is not a JSON object", path);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) FAIL(GM_ERR_FORMAT, "%s: no \"model\" object", path);
    const char *mtype = json_str(model, "type");
    if (!mtype) FAIL(GM_ERR_FORMAT, "%s: model.type is missing", path);
    if (strcmp(mtype, "BPE") != 0)
        FAIL(GM_ERR_UNSUPPORTED,
             "%s: model.type \"%s\" is not supported; only \"BPE\" (Gemma's SentencePiece-BPE) is",
             path, mtype);
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(vocab)) FAIL(GM_ERR_FORMAT, "%s: model.vocab is missing or not an object", path);
    if (merges && !cJSON_IsArray(merges) && !cJSON_IsNull(merges))
        FAIL(GM_ERR_FORMAT, "%s: model.merges is not an array", path);
    if (added && !cJSON_IsArray(added) && !cJSON_IsNull(added))
        FAIL(GM_ERR_FORMAT, "%s: added_tokens is not an array", path);
    const char *cont = json_str(model, "continuing_subword_prefix");
    const char *eow = json_str(model, "end_of_word_suffix");
    if ((cont && *cont) || (eow && *eow))
        FAIL(GM_ERR_UNSUPPORTED, "%s: model.continuing_subword_prefix / end_of_word_suffix are not supported", path);
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0))
        FAIL(GM_ERR_UNSUPPORTED, "%s: model.dropout makes encoding random; not supported", path);
    int bf = json_bool(model, "byte_fallback", false), fu = json_bool(model, "fuse_unk", false);
    int im = json_bool(model, "ignore_merges", false);
    if (bf < 0 || fu < 0 || im < 0)
        FAIL(GM_ERR_FORMAT, "%s: model.byte_fallback / fuse_unk / ignore_merges must be booleans", path);

    /* ids: the largest of the vocabulary and the added tokens */
    int64_t n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= INT32_MAX - 1 ||
            it->valuedouble != (double)(int64_t)it->valuedouble)
            FAIL(GM_ERR_FORMAT, "%s: model.vocab[\"%.64s\"] is not a valid id", path, it->string);
        if ((int64_t)it->valuedouble + 1 > n) n = (int64_t)it->valuedouble + 1;
    }
    int ai = 0;
    cJSON_ArrayForEach(it, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= INT32_MAX - 1 ||
            !json_str(it, "content"))
            FAIL(GM_ERR_FORMAT, "%s: added_tokens[%d] needs an integer id >= 0 and a content string", path, ai);
        if ((int64_t)id->valuedouble + 1 > n) n = (int64_t)id->valuedouble + 1;
        ai++;
    }
    if (n == 0) FAIL(GM_ERR_FORMAT, "%s: model.vocab is empty", path);
    // ids index dense tables: a file naming id 2,000,000,000 among a few tokens would make them
    // 16 GB (found by fuzz_tokenizer). Real vocabularies are dense 0..V-1, added tokens within or
    // just past them: allow gaps up to the count itself.
    int64_t n_entries = (int64_t)cJSON_GetArraySize(vocab) + ai;
    if (n > 2 * n_entries + 1024)
        FAIL(GM_ERR_FORMAT, "%s: token ids go up to %lld but the file defines only %lld tokens (model.vocab and "
             "added_tokens): ids must be dense, 0..%lld", path, (long long)(n - 1), (long long)n_entries,
             (long long)(n_entries - 1));
    v.n = n;
    v.texts = gm_calloc((size_t)n, sizeof *v.texts);
    v.lens = gm_calloc((size_t)n, sizeof *v.lens);
    v.types = gm_calloc((size_t)n, 1);
    v.flags = gm_calloc((size_t)n, 1);
    if (!v.texts || !v.lens || !v.types || !v.flags)
        FAIL(GM_ERR_NOMEM, "%s: out of memory for %lld tokens", path, (long long)n);
    cJSON_ArrayForEach(it, vocab) {
        int64_t id = (int64_t)it->valuedouble;
        if (v.texts[id])
            FAIL(GM_ERR_FORMAT, "%s: model.vocab gives id %lld to both \"%.64s\" and \"%.64s\"", path,
                 (long long)id, v.texts[id], it->string);
        v.texts[id] = it->string;
        v.lens[id] = strlen(it->string);
        v.types[id] = (uint8_t)(bf && is_byte_token(it->string, v.lens[id]) ? GM_TOKEN_BYTE
                                                                             : GM_TOKEN_NORMAL);
    }
    ai = 0;
    cJSON_ArrayForEach(it, added) {
        int64_t id = (int64_t)cJSON_GetObjectItemCaseSensitive(it, "id")->valuedouble;
        const char *content = json_str(it, "content");
        if (v.texts[id] && strcmp(v.texts[id], content) != 0)
            FAIL(GM_ERR_FORMAT, "%s: added_tokens[%d] \"%.64s\" has id %lld, which model.vocab gives to \"%.64s\"",
                 path, ai, content, (long long)id, v.texts[id]);
        int special = json_bool(it, "special", false), normalized = json_bool(it, "normalized", true);
        int lstrip = json_bool(it, "lstrip", false), rstrip = json_bool(it, "rstrip", false);
        int single = json_bool(it, "single_word", false);
        if (special < 0 || normalized < 0 || lstrip < 0 || rstrip < 0 || single < 0)
            FAIL(GM_ERR_FORMAT, "%s: added_tokens[%d] has a flag that is not a boolean", path, ai);
        if (single)
            FAIL(GM_ERR_UNSUPPORTED, "%s: added_tokens[%d] \"%.64s\" has single_word true; not supported",
                 path, ai, content);
        v.texts[id] = content;
        v.lens[id] = strlen(content);
        v.types[id] = (uint8_t)(special ? GM_TOKEN_CONTROL : GM_TOKEN_USER_DEFINED);
        v.flags[id] = (uint8_t)((normalized ? F_ADDED_NORM : F_ADDED_RAW) | (special ? F_SPECIAL : 0) |
                                (lstrip ? F_LSTRIP : 0) | (rstrip ? F_RSTRIP : 0));
        ai++;
    }
    bool replace_space, prepend;
    st = parse_normalizer(path, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), &replace_space,
                          &prepend, err);
    if (st != GM_OK) goto fail;
    st = parse_pre_tokenizer(path, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"),
                             replace_space, err);
    if (st != GM_OK) goto fail;
    const char *bos_text = NULL;
    st = parse_post_processor(path, cJSON_GetObjectItemCaseSensitive(root, "post_processor"),
                              &bos_text, err);
    if (st != GM_OK) goto fail;

    st = tok_alloc(n, v.texts, v.lens, false, &t, err, path);
    if (st != GM_OK) goto fail;
    t->mode = MERGE_RANKED;
    t->replace_space = replace_space;
    t->add_space_prefix = prepend;
    t->byte_fallback = bf;
    t->fuse_unk = fu;
    t->ignore_merges = im;
    memcpy(t->type, v.types, (size_t)n);
    memcpy(t->flag, v.flags, (size_t)n);
    /* the model's vocabulary first; an added token whose text is also a vocabulary entry keeps
     * the vocabulary's id */
    for (int64_t i = 0; i < n; i++)
        if (v.texts[i] && !(v.flags[i] & (F_ADDED_RAW | F_ADDED_NORM))) slot_put(t, (int32_t)i, true);
    for (int64_t i = 0; i < n; i++)
        if (v.texts[i] && (v.flags[i] & (F_ADDED_RAW | F_ADDED_NORM))) slot_put(t, (int32_t)i, true);

    /* merges -> (left, right) -> rank */
    int64_t nm = cJSON_GetArraySize(merges);
    if (u64map_init(&t->merges, (size_t)nm) != GM_OK ||
        !(t->merge_new = gm_malloc(((size_t)nm + 1) * sizeof *t->merge_new)))
        FAIL(GM_ERR_NOMEM, "%s: out of memory for %lld merges", path, (long long)nm);
    int64_t rank = 0;
    char *joined = NULL;
    size_t joined_cap = 0;
    cJSON_ArrayForEach(it, merges) {
        const char *a = NULL, *b = NULL;
        size_t la = 0, lb = 0;
        if (cJSON_IsString(it)) { /* "a b": tokens never contain a space after normalization */
            const char *sp = strchr(it->valuestring, ' ');
            if (sp && !strchr(sp + 1, ' ')) {
                a = it->valuestring;
                la = (size_t)(sp - a);
                b = sp + 1;
                lb = strlen(b);
            }
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 0)) && cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            a = cJSON_GetArrayItem(it, 0)->valuestring;
            b = cJSON_GetArrayItem(it, 1)->valuestring;
            la = strlen(a);
            lb = strlen(b);
        }
        if (!a) {
            gm_free(joined);
            FAIL(GM_ERR_FORMAT, "%s: model.merges[%lld] is neither \"left right\" nor [\"left\", \"right\"]",
                 path, (long long)rank);
        }
        int32_t ia = gm_tokenizer_find(t, a, la), ib = gm_tokenizer_find(t, b, lb);
        if (la + lb + 1 > joined_cap) {
            joined_cap = 2 * (la + lb + 1);
            char *nj = gm_realloc(joined, joined_cap);
            if (!nj) {
                gm_free(joined);
                FAIL(GM_ERR_NOMEM, "%s: out of memory", path);
            }
            joined = nj;
        }
        memcpy(joined, a, la);
        memcpy(joined + la, b, lb);
        int32_t im_ = (ia >= 0 && ib >= 0) ? gm_tokenizer_find(t, joined, la + lb) : -1;
        if (ia < 0 || ib < 0 || im_ < 0) {
            const char *what = ia < 0 ? a : ib < 0 ? b : joined;
            int wl = (int)(ia < 0 ? la : ib < 0 ? lb : la + lb);
            st = gm_error_set(err, GM_ERR_FORMAT,
                              "%s: model.merges[%lld] (\"%.*s\" + \"%.*s\") names \"%.*s\", which is "
                              "not in model.vocab",
                              path, (long long)rank, (int)(la > 64 ? 64 : la), a,
                              (int)(lb > 64 ? 64 : lb), b, wl > 64 ? 64 : wl, what);
            gm_free(joined);
            goto fail;
        }
        /* tokenizers keeps the last rank of a duplicated pair; so do we */
        if (u64map_put(&t->merges, ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib, (int32_t)rank) != GM_OK) {
            gm_free(joined);
            FAIL(GM_ERR_NOMEM, "%s: out of memory for merges", path);
        }
        t->merge_new[rank] = im_;
        rank++;
    }
    gm_free(joined);

    /* special ids */
    const char *unk = json_str(model, "unk_token");
    if (unk) {
        t->special.unk = gm_tokenizer_find(t, unk, strlen(unk));
        if (t->special.unk < 0)
            FAIL(GM_ERR_FORMAT, "%s: model.unk_token \"%.64s\" is not in the vocabulary", path, unk);
        if (t->type[t->special.unk] == GM_TOKEN_NORMAL) t->type[t->special.unk] = GM_TOKEN_UNKNOWN;
    }
    const char *cbos = cfg ? json_token_name(cfg, "bos_token") : NULL;
    const char *ceos = cfg ? json_token_name(cfg, "eos_token") : NULL;
    const char *cpad = cfg ? json_token_name(cfg, "pad_token") : NULL;
    const char *names[3] = {bos_text ? bos_text : cbos ? cbos : "<bos>", ceos ? ceos : "<eos>",
                            cpad ? cpad : "<pad>"};
    int32_t *slots[3] = {&t->special.bos, &t->special.eos, &t->special.pad};
    for (int k = 0; k < 3; k++) {
        *slots[k] = gm_tokenizer_find(t, names[k], strlen(names[k]));
        bool named = (k == 0 && (bos_text || cbos)) || (k == 1 && ceos) || (k == 2 && cpad);
        if (*slots[k] < 0 && named)
            FAIL(GM_ERR_FORMAT, "%s: special token \"%.64s\" is not in the vocabulary", 
                 k == 0 && bos_text ? path : config_path, names[k]);
    }
    t->add_bos = bos_text != NULL;
    if (cfg) {
        int ab = json_bool(cfg, "add_bos_token", t->add_bos);
        if (ab < 0) FAIL(GM_ERR_FORMAT, "%s: add_bos_token is not a boolean", config_path);
        t->add_bos = ab;
    }
    st = tok_finish(t, err, path);
    if (st != GM_OK) goto fail;
    hf_vocab_free(&v);
    *out = t;
    return GM_OK;
fail:
#undef FAIL
    hf_vocab_free(&v);
    gm_tokenizer_free(t);
    return st;
}

/* A parsed JSON file whose nodes live in their own mapping when one could be reserved.
 *
 * Why: a tokenizer.json is millions of small cJSON nodes (Gemma 3's 262,144-token one: ~190 MiB
 * of them). Made with malloc, they fill the C library's heap below the vocabulary built from
 * them; once freed, glibc keeps that heap's pages, and the run's small allocations then wander
 * over them until all ~190 MiB are resident again - memory the plan cannot count (measured:
 * the image path's peak 7% over its plan on the 270M). Bump-allocated in a mapping of their
 * own, the nodes go back to the system in one munmap. The mapping is reserved, not committed
 * (MAP_NORESERVE): only the pages the nodes touch count. A text of n bytes makes at most
 * n/2 + 1 nodes (a value and its separator take 2 bytes or more) of sizeof(cJSON) = 64 bytes,
 * and strings of at most 16 bytes each after rounding per 2 bytes of text (its quotes), or their
 * own length + 1: at most 40 n + 64 bytes in all, so JSON_REGION_PER_BYTE * n + 1 MiB suffices
 * (Gemma 3's 14 MB tokenizer.json takes 13 n). */
#define JSON_REGION_PER_BYTE 64
typedef struct json_doc {
    cJSON *root;
    char *region; /* NULL: root was made with malloc (cJSON_Delete frees it) */
    size_t size, used;
} json_doc;

/* cJSON's hooks are global: the region is the current parse's, set only around that call
 * (gemmarun parses JSON on one thread). */
static json_doc *g_region_doc;

static void *region_alloc(size_t n) {
    json_doc *d = g_region_doc;
    n = (n + 15u) & ~(size_t)15u;
    if (n > d->size - d->used) return NULL; /* cJSON turns this into a parse failure */
    void *p = d->region + d->used;
    d->used += n;
    return p;
}

static void region_free(void *p) { (void)p; /* the whole region is unmapped at once */ }

static void json_doc_free(json_doc *d) {
    if (d->region) munmap(d->region, d->size);
    else cJSON_Delete(d->root);
    memset(d, 0, sizeof *d);
}

/* Parses a JSON file; the message names the file and the byte offset of the error. */
static gm_status read_json(const char *path, json_doc *out, gm_error *err) {
    memset(out, 0, sizeof *out);
    char *buf;
    size_t len;
    GM_TRY(gm_read_file(path, &buf, &len, err));
    json_doc d = {0};
    if (len <= (SIZE_MAX - ((size_t)1 << 20)) / JSON_REGION_PER_BYTE) {
        d.size = len * JSON_REGION_PER_BYTE + ((size_t)1 << 20);
        void *m = mmap(NULL, d.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        d.region = m == MAP_FAILED ? NULL : m; /* refused (strict overcommit): plain malloc */
    }
    if (d.region) {
        cJSON_Hooks hooks = {region_alloc, region_free};
        g_region_doc = &d;
        cJSON_InitHooks(&hooks);
    }
    const char *end = NULL;
    d.root = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    if (d.region) {
        cJSON_InitHooks(NULL);
        g_region_doc = NULL;
    }
    if (!d.root) {
        long at = end ? (long)(end - buf) : -1;
        bool full = d.region && d.size - d.used < 4096;
        gm_free(buf);
        json_doc_free(&d);
        return gm_error_set(err, GM_ERR_FORMAT, "%s: not valid JSON (error near byte %ld)%s", path, at,
                            full ? " - or its tree outgrew the space reserved for it" : "");
    }
    gm_free(buf);
    *out = d;
    return GM_OK;
}

gm_status gm_tokenizer_from_hf_json(const char *tokenizer_json_path,
                                    const char *tokenizer_config_path, gm_tokenizer **out,
                                    gm_error *err) {
    *out = NULL;
    if (!tokenizer_json_path)
        return gm_error_set(err, GM_ERR_INVALID, "gm_tokenizer_from_hf_json: no path");
    json_doc root, cfg = {0};
    GM_TRY(read_json(tokenizer_json_path, &root, err));
    if (tokenizer_config_path) {
        gm_status st = read_json(tokenizer_config_path, &cfg, err);
        if (st != GM_OK) {
            json_doc_free(&root);
            return st;
        }
    }
    gm_status st = hf_load(tokenizer_json_path, tokenizer_config_path, root.root, cfg.root, out, err);
    json_doc_free(&root);
    json_doc_free(&cfg);
    return st;
}

/* ---- writing a Hugging Face tokenizer.json ------------------------------------------------- */

/* A NUL-terminated copy of token id's text in buf (grown as needed); NULL when out of memory or
 * the text holds a NUL byte (JSON strings through cJSON cannot). */
static const char *tok_cstr(const gm_tokenizer *t, int32_t id, char **buf, size_t *cap) {
    size_t n;
    const char *p = tok_str(t, id, &n);
    if (memchr(p, '\0', n)) return NULL;
    if (n + 1 > *cap) {
        char *nb = gm_realloc(*buf, n + 64);
        if (!nb) return NULL;
        *buf = nb, *cap = n + 64;
    }
    memcpy(*buf, p, n);
    (*buf)[n] = '\0';
    return *buf;
}

static cJSON *str_pattern(const char *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "String", s);
    return o;
}

/* The tokenizer.json object (see the header). */
static gm_status hf_json_of(const gm_tokenizer *t, cJSON **out, gm_error *err) {
    char *b1 = NULL, *b2 = NULL;
    size_t c1 = 0, c2 = 0;
    cJSON *root = cJSON_CreateObject();
    gm_status s = root ? GM_OK : gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    const char *unk = t->special.unk >= 0 ? tok_cstr(t, t->special.unk, &b1, &c1) : NULL;
    if (s == GM_OK) {
        cJSON_AddStringToObject(root, "version", "1.0");
        cJSON_AddNullToObject(root, "truncation");
        cJSON_AddNullToObject(root, "padding");
        /* added tokens as transformers' GGUF builder makes them (integrations/gguf/
         * gguf_tokenizer_mapping.py add_gguf_special_tokens + GemmaTokenizer's unk/pad/bos/eos):
         * CONTROL and UNKNOWN special, USER_DEFINED plain; all matched on the raw text */
        cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
        for (int32_t id = 0; s == GM_OK && id < t->n; id++) {
            gm_token_type ty = (gm_token_type)t->type[id];
            if (ty != GM_TOKEN_CONTROL && ty != GM_TOKEN_UNKNOWN && ty != GM_TOKEN_USER_DEFINED) continue;
            const char *txt = tok_cstr(t, id, &b2, &c2);
            if (!txt) {
                s = gm_error_set(err, GM_ERR_UNSUPPORTED, "token %d holds a NUL byte: it cannot be written to tokenizer.json", id);
                break;
            }
            cJSON *a = cJSON_CreateObject();
            cJSON_AddNumberToObject(a, "id", id);
            cJSON_AddStringToObject(a, "content", txt);
            cJSON_AddBoolToObject(a, "single_word", false);
            cJSON_AddBoolToObject(a, "lstrip", false);
            cJSON_AddBoolToObject(a, "rstrip", false);
            cJSON_AddBoolToObject(a, "normalized", false);
            cJSON_AddBoolToObject(a, "special", ty != GM_TOKEN_USER_DEFINED);
            cJSON_AddItemToArray(added, a);
        }
    }
    if (s == GM_OK) {
        /* Gemma's pipeline (transformers' GemmaTokenizer): spaces become U+2581, no dummy prefix */
        cJSON *nz = cJSON_AddObjectToObject(root, "normalizer");
        cJSON_AddStringToObject(nz, "type", "Replace");
        cJSON_AddItemToObject(nz, "pattern", str_pattern(" "));
        cJSON_AddStringToObject(nz, "content", META);
        cJSON *pt = cJSON_AddObjectToObject(root, "pre_tokenizer");
        cJSON_AddStringToObject(pt, "type", "Split");
        cJSON_AddItemToObject(pt, "pattern", str_pattern(" "));
        cJSON_AddStringToObject(pt, "behavior", "MergedWithPrevious");
        cJSON_AddBoolToObject(pt, "invert", false);
        const char *bos = t->add_bos && t->special.bos >= 0 ? tok_cstr(t, t->special.bos, &b2, &c2) : NULL;
        if (bos) { /* BOS before every sequence, as Gemma's own tokenizer.json */
            cJSON *pp = cJSON_AddObjectToObject(root, "post_processor");
            cJSON_AddStringToObject(pp, "type", "TemplateProcessing");
            const char *seqs[2] = {"A", "B"};
            const char *which[2] = {"single", "pair"};
            for (int k = 0; k < 2; k++) {
                cJSON *arr = cJSON_AddArrayToObject(pp, which[k]);
                for (int q = 0; q <= k; q++) {
                    cJSON *st = cJSON_CreateObject(), *sp = cJSON_AddObjectToObject(st, "SpecialToken");
                    cJSON_AddStringToObject(sp, "id", bos);
                    cJSON_AddNumberToObject(sp, "type_id", q);
                    cJSON_AddItemToArray(arr, st);
                    cJSON *sq = cJSON_CreateObject(), *so = cJSON_AddObjectToObject(sq, "Sequence");
                    cJSON_AddStringToObject(so, "id", seqs[q]);
                    cJSON_AddNumberToObject(so, "type_id", q);
                    cJSON_AddItemToArray(arr, sq);
                }
            }
            cJSON *sts = cJSON_AddObjectToObject(pp, "special_tokens"), *e = cJSON_AddObjectToObject(sts, bos);
            cJSON_AddStringToObject(e, "id", bos);
            cJSON *ids = cJSON_AddArrayToObject(e, "ids");
            cJSON_AddItemToArray(ids, cJSON_CreateNumber(t->special.bos));
            cJSON *tk = cJSON_AddArrayToObject(e, "tokens");
            cJSON_AddItemToArray(tk, cJSON_CreateString(bos));
        } else {
            cJSON_AddNullToObject(root, "post_processor");
        }
        cJSON *dec = cJSON_AddObjectToObject(root, "decoder");
        cJSON_AddStringToObject(dec, "type", "Sequence");
        cJSON *ds = cJSON_AddArrayToObject(dec, "decoders"), *d;
        d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "type", "Replace");
        cJSON_AddItemToObject(d, "pattern", str_pattern(META));
        cJSON_AddStringToObject(d, "content", " ");
        cJSON_AddItemToArray(ds, d);
        d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "type", "ByteFallback");
        cJSON_AddItemToArray(ds, d);
        d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "type", "Fuse");
        cJSON_AddItemToArray(ds, d);

        cJSON *model = cJSON_AddObjectToObject(root, "model");
        cJSON_AddStringToObject(model, "type", "BPE");
        cJSON_AddNullToObject(model, "dropout");
        if (unk) cJSON_AddStringToObject(model, "unk_token", unk);
        else cJSON_AddNullToObject(model, "unk_token");
        cJSON_AddNullToObject(model, "continuing_subword_prefix");
        cJSON_AddNullToObject(model, "end_of_word_suffix");
        cJSON_AddBoolToObject(model, "fuse_unk", true);
        cJSON_AddBoolToObject(model, "byte_fallback", true);
        cJSON_AddBoolToObject(model, "ignore_merges", false);
        cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
        for (int32_t id = 0; s == GM_OK && id < t->n; id++) {
            const char *txt = tok_cstr(t, id, &b2, &c2);
            if (!txt) s = gm_error_set(err, GM_ERR_UNSUPPORTED, "token %d holds a NUL byte: it cannot be written to tokenizer.json", id);
            else cJSON_AddItemToObject(vocab, txt, cJSON_CreateNumber(id));
        }
        /* The merges that give exactly the vocabulary-order priority (see the header): every split
         * of a token into two vocabulary entries, by the merged token's id, then the longer left
         * part first - transformers' generate_merges (tokenization_utils_base.py) with Gemma's
         * positions as scores, which is how it builds a Gemma GGUF's tokenizer. */
        cJSON *merges = cJSON_AddArrayToObject(model, "merges");
        for (int32_t id = 0; s == GM_OK && id < t->n; id++) {
            size_t n;
            const char *p = tok_str(t, id, &n);
            if (n < 2 || gm_tokenizer_find(t, p, n) != id) continue; /* a later duplicate's text */
            for (size_t b = n - 1; b > 0; b--) {
                if (((unsigned char)p[b] & 0xC0) == 0x80) continue; /* inside a character */
                int32_t l = gm_tokenizer_find(t, p, b), r = gm_tokenizer_find(t, p + b, n - b);
                if (l < 0 || r < 0) continue;
                const char *ls = tok_cstr(t, l, &b1, &c1), *rs = tok_cstr(t, r, &b2, &c2);
                if (!ls || !rs) continue; /* NUL: refused above already */
                cJSON *pair = cJSON_CreateArray();
                cJSON_AddItemToArray(pair, cJSON_CreateString(ls));
                cJSON_AddItemToArray(pair, cJSON_CreateString(rs));
                cJSON_AddItemToArray(merges, pair);
            }
        }
    }
    gm_free(b1), gm_free(b2);
    if (s != GM_OK) {
        cJSON_Delete(root);
        return s;
    }
    *out = root;
    return GM_OK;
}

gm_status gm_tokenizer_save_hf(const gm_tokenizer *t, const char *dir, const char *chat_template, gm_error *err) {
    if (t->mode != MERGE_VOCAB_ORDER)
        return gm_error_set(err, GM_ERR_UNSUPPORTED, "this tokenizer came from a tokenizer.json: copy that file instead");
    cJSON *root = NULL;
    GM_TRY(hf_json_of(t, &root, err));
    char path[4200];
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    gm_status s = text ? GM_OK : gm_error_set(err, GM_ERR_NOMEM, "out of memory writing tokenizer.json");
    if (s == GM_OK) {
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        s = gm_write_file_atomic(path, text, strlen(text), err);
    }
    cJSON_free(text);
    if (s != GM_OK) return s;
    /* tokenizer_config.json: what AutoTokenizer needs beside it (GemmaTokenizer's names) */
    cJSON *c = cJSON_CreateObject();
    if (!c) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    char *b = NULL;
    size_t cap = 0;
    cJSON_AddBoolToObject(c, "add_bos_token", t->add_bos);
    cJSON_AddBoolToObject(c, "add_eos_token", false);
    const struct { const char *key; int32_t id; } names[] = {{"bos_token", t->special.bos}, {"eos_token", t->special.eos},
                                                             {"pad_token", t->special.pad}, {"unk_token", t->special.unk}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *txt = names[i].id >= 0 ? tok_cstr(t, names[i].id, &b, &cap) : NULL;
        if (txt) cJSON_AddStringToObject(c, names[i].key, txt);
    }
    gm_free(b);
    if (chat_template) cJSON_AddStringToObject(c, "chat_template", chat_template);
    cJSON_AddBoolToObject(c, "clean_up_tokenization_spaces", false);
    cJSON_AddStringToObject(c, "padding_side", "left");
    cJSON_AddBoolToObject(c, "spaces_between_special_tokens", false);
    cJSON_AddStringToObject(c, "tokenizer_class", "GemmaTokenizer");
    text = cJSON_Print(c);
    cJSON_Delete(c);
    s = text ? GM_OK : gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    if (s == GM_OK) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        s = gm_write_file_atomic(path, text, strlen(text), err);
    }
    cJSON_free(text);
    return s;
}

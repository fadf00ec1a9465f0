/*
 * gm_lora.c - LoRA adapters: module names from the architecture's spec, PEFT-style target
 * matching, shapes, PEFT keys, scaling, buffers and initialization. See gm_lora.h.
 */
#include "gm_lora.h"

#include "gm_alloc.h"
#include "gm_rng.h"

#include <ctype.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

gm_lora_config gm_lora_config_default(void) {
    gm_lora_config c;
    memset(&c, 0, sizeof c);
    c.rank = 8;
    c.alpha = 8.0f;
    snprintf(c.targets, sizeof c.targets, "all-linear");
    for (int i = 0; i < GM_MAX_LAYERS; i++) c.layers[i] = true;
    return c;
}

gm_status gm_lora_config_validate(const gm_lora_config *lc, const gm_config *mc, gm_error *err) {
    if (lc->rank < 1 || lc->rank > 4096)
        return gm_error_set(err, GM_ERR_INVALID, "rank = %d: must be an integer in 1..4096", lc->rank);
    if (!(lc->alpha > 0) || !isfinite(lc->alpha))
        return gm_error_set(err, GM_ERR_INVALID, "alpha = %g: must be a positive number", (double)lc->alpha);
    if (!(lc->dropout >= 0 && lc->dropout < 1))
        return gm_error_set(err, GM_ERR_INVALID, "dropout = %g: must be in [0, 1)", (double)lc->dropout);
    if (!lc->targets[0])
        return gm_error_set(err, GM_ERR_INVALID, "no target modules given (use \"all-linear\" or a list such as \"q_proj,v_proj\")");
    /* an explicit layer list (the default selects every slot) must name layers the model has */
    bool all = true;
    for (int l = 0; l < GM_MAX_LAYERS; l++) all = all && lc->layers[l];
    for (int l = (int)mc->n_layers; !all && l < GM_MAX_LAYERS; l++)
        if (lc->layers[l])
            return gm_error_set(err, GM_ERR_INVALID, "layers: %d is not a layer of this model (it has %lld: 0..%lld)", l,
                                (long long)mc->n_layers, (long long)mc->n_layers - 1);
    bool any = false;
    for (int64_t l = 0; l < mc->n_layers; l++) any = any || lc->layers[l];
    if (!any) return gm_error_set(err, GM_ERR_INVALID, "no layer selected for LoRA (the model has %lld layers)",
                                  (long long)mc->n_layers);
    return GM_OK;
}

float gm_lora_scaling(const gm_lora_config *lc) {
    return lc->rslora ? lc->alpha / sqrtf((float)lc->rank) : lc->alpha / (float)lc->rank;
}

/* ---- target matching ---------------------------------------------------------------------- */

/* A target string is a regular expression when it uses regex syntax beyond a name's
 * characters ('.' alone is a name separator: "self_attn.q_proj" is a suffix, as in PEFT lists). */
static bool is_regex(const char *t) { return strpbrk(t, "^$*+?()[]{}|\\") != NULL; }

/* Calls fn on each entry of a name list ("a,b c"); stops when fn returns true. */
static bool any_entry(const char *list, bool (*fn)(const char *e, size_t n, const void *u), const void *u) {
    const char *p = list;
    while (*p) {
        while (*p == ',' || isspace((unsigned char)*p)) p++;
        if (!*p) break;
        const char *e = p;
        while (*e && *e != ',' && !isspace((unsigned char)*e)) e++;
        if (fn(p, (size_t)(e - p), u)) return true;
        p = e;
    }
    return false;
}

/* PEFT: key == target or key.endswith("." + target) */
static bool suffix_match(const char *e, size_t n, const void *u) {
    const char *module = u;
    size_t m = strlen(module);
    if (m == n) return strncmp(module, e, n) == 0;
    return m > n && module[m - n - 1] == '.' && strncmp(module + m - n, e, n) == 0;
}

/* Python's shorthands in POSIX extended syntax (PEFT users write re.fullmatch patterns): \\d \\w \\s
 * and their negations as bracket classes, (?: as a plain group. False when the result does not
 * fit. */
static bool translate_python(const char *in, char *out, size_t cap) {
    size_t k = 0;
    for (const char *p = in; *p; p++) {
        const char *rep = NULL;
        if (p[0] == '\\' && p[1]) {
            switch (p[1]) {
            case 'd': rep = "[0-9]"; break;
            case 'D': rep = "[^0-9]"; break;
            case 'w': rep = "[A-Za-z0-9_]"; break;
            case 'W': rep = "[^A-Za-z0-9_]"; break;
            case 's': rep = "[[:space:]]"; break;
            case 'S': rep = "[^[:space:]]"; break;
            default: break;
            }
        } else if (p[0] == '(' && p[1] == '?' && p[2] == ':') {
            rep = "(";
        }
        if (rep) {
            size_t n = strlen(rep);
            if (k + n >= cap) return false;
            memcpy(out + k, rep, n), k += n;
            p += p[0] == '(' ? 2 : 1;
            continue;
        }
        if (k + 1 >= cap) return false;
        out[k++] = *p;
        if (p[0] == '\\' && p[1]) { /* an escaped character stays escaped */
            if (k + 1 >= cap) return false;
            out[k++] = *++p;
        }
    }
    out[k] = '\0';
    return true;
}

/* The copies glibc's regcomp makes of what a quantifier at p applies to: it expands x+ as xx* and
 * x{m,n} as m..n copies, recursively, so nested repetitions multiply (found by fuzz_experiment:
 * "l-+++...+" took 1.3 GB inside regcomp). 0 when p is not a quantifier; *len = its length. */
static long repeat_copies(const char *p, size_t *len) {
    *len = 1;
    if (*p == '*' || *p == '?') return 1;
    if (*p == '+') return 2;
    if (*p != '{' || !isdigit((unsigned char)p[1])) return 0;
    char *e;
    long lo = strtol(p + 1, &e, 10), hi = lo;
    if (*e == ',') hi = isdigit((unsigned char)e[1]) ? strtol(e + 1, &e, 10) : lo + 1, e += *e == ',';
    if (*e != '}') return 0;
    *len = (size_t)(e + 1 - p);
    return hi > lo ? hi : lo > 0 ? lo : 1;
}

/* Refuses what Python's re refuses and glibc would expand without bound: a quantifier on a
 * quantifier ("multiple repeat"; one lazy '?' after a quantifier is Python syntax and allowed),
 * and nested repetitions whose copies multiply past 4,096. False with the reason in why. */
#define REGEX_MAX_COPIES 4096
static bool regex_bounded(const char *pat, char *why, size_t cap) {
    size_t n = strlen(pat);
    long stack[64];
    int depth = 0;
    long copies = 1;
    int after_quant = 0; /* 1: a quantifier just ended; 2: and a lazy '?' after it */
    for (size_t i = 0; i < n; i++) {
        char c = pat[i];
        size_t ql;
        long q = repeat_copies(pat + i, &ql);
        if (q) {
            if (after_quant == 2 || (after_quant == 1 && !(c == '?' && ql == 1))) {
                snprintf(why, cap, "multiple repeat at position %zu (a quantifier on a quantifier, which Python's re "
                         "refuses too)", i);
                return false;
            }
            if (q > REGEX_MAX_COPIES || copies * q > REGEX_MAX_COPIES) {
                snprintf(why, cap, "nested repetitions expand to more than %d copies at position %zu", REGEX_MAX_COPIES, i);
                return false;
            }
            after_quant = after_quant == 1 ? 2 : 1;
            i += ql - 1;
            continue;
        }
        after_quant = 0;
        if (c == '\\' && i + 1 < n) {
            i++;
        } else if (c == '[') { // a bracket expression: ']' first is literal, [:class:] inside
            size_t j = i + 1 + (pat[i + 1] == '^');
            if (pat[j] == ']') j++;
            while (j < n && pat[j] != ']') j += (pat[j] == '[' && pat[j + 1] == ':') ? 2 : 1;
            i = j < n ? j : n;
        } else if (c == '(') {
            // find the matching ')' and the quantifier after it: the group's copies multiply inside
            int d = 0;
            size_t j = i;
            for (; j < n; j++) {
                if (pat[j] == '\\') { j++; continue; }
                if (pat[j] == '(') d++;
                else if (pat[j] == ')' && --d == 0) break;
            }
            size_t gl;
            long gq = j < n ? repeat_copies(pat + j + 1, &gl) : 0;
            if (depth == (int)(sizeof stack / sizeof stack[0])) {
                snprintf(why, cap, "groups nested more than %d deep", depth);
                return false;
            }
            stack[depth++] = copies;
            if (gq > REGEX_MAX_COPIES || copies * (gq ? gq : 1) > REGEX_MAX_COPIES) {
                snprintf(why, cap, "nested repetitions expand to more than %d copies at position %zu", REGEX_MAX_COPIES, i);
                return false;
            }
            copies *= gq ? gq : 1;
        } else if (c == ')' && depth > 0) {
            copies = stack[--depth];
            after_quant = 0;
        }
    }
    return true;
}

/* re.fullmatch(pattern, s): compiled as it stands (not wrapped in ^( )$, which an unbalanced
 * pattern could escape), then the leftmost-longest match must cover the whole string - with
 * POSIX leftmost-longest matching, that is exactly "some match spans the string". */
static bool regex_full_match(const char *pattern, const char *s, bool *bad) {
    char ere[GM_LORA_TARGETS_MAX * 4], why[160];
    regex_t re;
    if (!regex_bounded(pattern, why, sizeof why) || !translate_python(pattern, ere, sizeof ere) ||
        regcomp(&re, ere, REG_EXTENDED) != 0) {
        if (bad) *bad = true;
        return false;
    }
    regmatch_t mt;
    bool ok = regexec(&re, s, 1, &mt, 0) == 0 && mt.rm_so == 0 && (size_t)mt.rm_eo == strlen(s);
    regfree(&re);
    return ok;
}

bool gm_lora_target_matches(const char *targets, const char *module) {
    if (strcmp(targets, "all-linear") == 0) return true;
    if (is_regex(targets)) return regex_full_match(targets, module, NULL);
    return any_entry(targets, suffix_match, module);
}

bool gm_lora_targets_is_regex(const char *targets) { return strcmp(targets, "all-linear") != 0 && is_regex(targets); }

/* ---- description -------------------------------------------------------------------------- */

/* The distinct short names of the targetable modules ("q_proj, k_proj, ..."), for messages. */
/* The short module name of weight name hf: its last component before ".weight" (two when it is
 * ".linear": Gemma 4's towers' inner linear, "q_proj.linear"), [*start, *end). */
static void short_name(const char *hf, const char **start, const char **end) {
    const char *dot = strrchr(hf, '.'), *s = hf;
    for (const char *p = hf; p < dot; p++)
        if (*p == '.' && strncmp(p + 1, "linear.", 7) != 0) s = p + 1;
    *start = s, *end = dot;
}

static void module_names(const gm_arch_def *arch, char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = '\0';
    for (int s = 0; s < arch->n_layer && k < cap; s++) {
        if (arch->layer[s].lora_id < 0) continue;
        const char *start, *dot;
        short_name(arch->layer[s].hf, &start, &dot);
        /* once each (the audio blocks have two ffw_layer_1) */
        bool seen = false;
        for (int t = 0; t < s && !seen; t++) {
            const char *s2, *d2;
            short_name(arch->layer[t].hf, &s2, &d2);
            seen = arch->layer[t].lora_id >= 0 && d2 - s2 == dot - start && strncmp(s2, start, (size_t)(dot - start)) == 0;
        }
        if (seen) continue;
        int w = snprintf(buf + k, cap - k, "%s%.*s", k ? ", " : "", (int)(dot - start), start);
        if (w > 0) k += (size_t)w;
    }
}

const char *gm_lora_layer_word(const gm_arch_def *a) {
    const char *p = a->layers_prefix ? a->layers_prefix : "layers.";
    size_t n = strlen(p);
    const char *w = p;
    for (size_t i = 0; i + 1 < n; i++)
        if (p[i] == '.') w = p + i + 1;
    return w;
}

/* Entry of a name list that matches no module: its text into `bad` (returns true to stop). */
typedef struct unmatched_ctx {
    const gm_arch_def *arch;
    const char *prefix;
    char *bad;
    size_t cap;
} unmatched_ctx;

static bool entry_matches_none(const char *e, size_t n, const void *u) {
    const unmatched_ctx *c = u;
    char module[160];
    for (int s = 0; s < c->arch->n_layer; s++) {
        const gm_weight_spec *w = &c->arch->layer[s];
        if (w->lora_id < 0) continue;
        /* any layer gives the same suffixes: check layer 0's name */
        snprintf(module, sizeof module, "%s%s0.%.*s", c->prefix, gm_lora_layer_word(c->arch), (int)(strlen(w->hf) - strlen(".weight")),
                 w->hf);
        if (suffix_match(e, n, module)) return false;
    }
    snprintf(c->bad, c->cap, "%.*s", (int)n, e);
    return true;
}

/* Which modules get an adapter: those lc's targets and layers select, or (only != NULL) those
 * named in the list (matched on "<layer word>N.<module>"). */
static bool wanted(const gm_lora_config *lc, const char *word, const char *module, int64_t l, const char *const *only,
                   int n_only) {
    if (!only) return lc->layers[l] && gm_lora_target_matches(lc->targets, module);
    const char *tail = strstr(module, word);
    for (int i = 0; i < n_only; i++) {
        const char *t = strstr(only[i], word);
        if (t && tail && strcmp(t, tail) == 0) return true;
    }
    return false;
}

static gm_status describe(gm_lora *lo, const gm_lora_config *lc, const gm_arch_def *arch, const gm_config *mc,
                          const char *prefix, const char *const *only, int n_only, const char *names, gm_error *err) {
    lo->cfg = *lc;
    lo->scaling = gm_lora_scaling(lc);
    lo->n_layers = mc->n_layers;
    lo->n_slots = arch->n_layer;
    lo->in_max = 1;
    lo->index = gm_malloc((size_t)(lo->n_layers * lo->n_slots) * sizeof(int));
    lo->ad = gm_calloc((size_t)(lo->n_layers * lo->n_slots), sizeof *lo->ad);
    if (!lo->index || !lo->ad) {
        gm_lora_free(lo);
        return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    }
    for (int64_t l = 0; l < mc->n_layers; l++) {
        for (int s = 0; s < arch->n_layer; s++) {
            const gm_weight_spec *w = &arch->layer[s];
            lo->index[l * lo->n_slots + s] = -1;
            if (w->lora_id < 0 || w->kind != GM_W_LINEAR || !gm_weight_present(w, mc, l)) continue;
            char module[128];
            snprintf(module, sizeof module, "%s%s%lld.%.*s", prefix, gm_lora_layer_word(arch), (long long)l,
                     (int)(strlen(w->hf) - strlen(".weight")), w->hf);
            if (!wanted(lc, gm_lora_layer_word(arch), module, l, only, n_only)) continue;
            gm_lora_adapter *ad = &lo->ad[lo->n];
            snprintf(ad->module, sizeof ad->module, "%s", module);
            ad->layer = (int)l;
            ad->slot = s;
            ad->lora_id = w->lora_id;
            ad->out = gm_dim_value(mc, l, w->rows, lc->rank);
            ad->in = gm_dim_value(mc, l, w->cols, lc->rank);
            snprintf(ad->name_A, sizeof ad->name_A, "base_model.model.%s.lora_A.weight", module);
            snprintf(ad->name_B, sizeof ad->name_B, "base_model.model.%s.lora_B.weight", module);
            if (ad->in > lo->in_max) lo->in_max = ad->in;
            lo->n_params += (int64_t)lc->rank * (ad->in + ad->out);
            lo->slot_used[s] = true;
            lo->index[l * lo->n_slots + s] = lo->n++;
        }
    }
    if (lo->n == 0) {
        /* modules the targets name that KV-shared layers do not have: say why they are absent */
        char why[256] = "";
        for (int64_t l = 0; l < mc->n_layers && !why[0]; l++)
            for (int s = 0; s < arch->n_layer && !why[0]; s++) {
                const gm_weight_spec *w = &arch->layer[s];
                if (w->lora_id < 0 || w->kind != GM_W_LINEAR || gm_weight_present(w, mc, l) || mc->kv_source[l] == l) continue;
                char module[128];
                snprintf(module, sizeof module, "%s%s%lld.%.*s", prefix, gm_lora_layer_word(arch), (long long)l,
                         (int)(strlen(w->hf) - strlen(".weight")), w->hf);
                if (wanted(lc, gm_lora_layer_word(arch), module, l, only, n_only))
                    snprintf(why, sizeof why, "; layer %lld reads layer %d's keys and values (KV sharing): it has no k_proj "
                             "or v_proj", (long long)l, mc->kv_source[l]);
            }
        gm_lora_free(lo);
        const char *eg = "self_attn.q_proj.weight";
        for (int s = 0; s < arch->n_layer; s++)
            if (arch->layer[s].lora_id >= 0) {
                eg = arch->layer[s].hf;
                break;
            }
        return gm_error_set(err, GM_ERR_INVALID, "targets '%s' select no module of this model (modules: %s; e.g. %s%s0.%.*s)%s",
                            lc->targets, names, prefix, gm_lora_layer_word(arch), (int)(strlen(eg) - strlen(".weight")), eg, why);
    }
    return GM_OK;
}


int gm_lora_module_slot(const gm_arch_def *arch, const char *module, int64_t *layer) {
    const char *word = gm_lora_layer_word(arch), *t = strstr(module, word);
    long long l = -1;
    int off = 0;
    *layer = -1;
    if (!t || sscanf(t + strlen(word), "%lld.%n", &l, &off) != 1 || off <= 0 || l < 0) return -1;
    *layer = (int64_t)l;
    char hf[200];
    snprintf(hf, sizeof hf, "%s.weight", t + strlen(word) + off);
    return gm_arch_slot(arch, hf);
}

const char *gm_lora_absent_why(const gm_arch_def *arch, const gm_config *mc, int slot, int64_t layer, char *buf, size_t cap) {
    if (slot < 0 || slot >= arch->n_layer || layer < 0 || layer >= mc->n_layers) return NULL;
    const gm_weight_spec *w = &arch->layer[slot];
    if (gm_weight_present(w, mc, layer)) return NULL;
    int n = (int)strcspn(w->hf, ".") + 1; /* "self_attn.k_proj.weight": the module after the block's name */
    const char *mod = w->hf + (strchr(w->hf, '.') ? n : 0);
    int ml = (int)(strstr(mod, ".weight") ? strstr(mod, ".weight") - mod : (ptrdiff_t)strlen(mod));
    if ((w->when == GM_WHEN_OWN_KV || w->when == GM_WHEN_OWN_V) && mc->kv_source[layer] != layer)
        snprintf(buf, cap, "layer %lld of this model reads layer %d's keys and values (KV sharing: num_kv_shared_layers) and "
                 "has no %.*s", (long long)layer, mc->kv_source[layer], ml, mod);
    else if (w->when == GM_WHEN_OWN_V)
        snprintf(buf, cap, "layer %lld of this model is a full-attention layer whose values are its keys "
                 "(attention_k_eq_v) and has no %.*s", (long long)layer, ml, mod);
    else
        snprintf(buf, cap, "layer %lld of this model has no %.*s", (long long)layer, ml, mod);
    return buf;
}

gm_status gm_lora_describe_modules(gm_lora *lo, const gm_lora_config *lc, const gm_arch_def *arch, const gm_config *mc,
                                   const char *prefix, const char *const *modules, int n_modules, gm_error *err) {
    memset(lo, 0, sizeof *lo);
    if (!prefix) prefix = "model.";
    char names[256];
    module_names(arch, names, sizeof names);
    gm_lora_config all = *lc;
    for (int l = 0; l < GM_MAX_LAYERS; l++) all.layers[l] = true;
    snprintf(all.targets, sizeof all.targets, "all-linear");
    GM_TRY(gm_lora_config_validate(&all, mc, err));
    /* every listed module must be one this model has */
    for (int i = 0; i < n_modules; i++) {
        int64_t layer = -1;
        int slot = gm_lora_module_slot(arch, modules[i], &layer);
        bool ok = layer >= 0 && layer < mc->n_layers;
        char why[256];
        if (ok && slot >= 0 && arch->layer[slot].lora_id >= 0 && gm_lora_absent_why(arch, mc, slot, layer, why, sizeof why))
            return gm_error_set(err, GM_ERR_INVALID, "adapter module '%s': %s (an adapter for another base model?)", modules[i],
                                why);
        if (!ok || slot < 0 || arch->layer[slot].lora_id < 0 || !gm_weight_present(&arch->layer[slot], mc, layer))
            return gm_error_set(err, GM_ERR_INVALID,
                                "adapter module '%s' is not a LoRA-targetable module of this model (%lld layers; modules: %s)",
                                modules[i], (long long)mc->n_layers, names);
    }
    return describe(lo, &all, arch, mc, prefix, modules, n_modules, names, err);
}

gm_status gm_lora_targets_check(const char *targets, const gm_arch_def *arch, const char *prefix, gm_error *err) {
    if (!prefix) prefix = "model.";
    if (!targets[0])
        return gm_error_set(err, GM_ERR_INVALID, "no target modules given (use \"all-linear\" or a list such as \"q_proj,v_proj\")");
    if (strcmp(targets, "all-linear") == 0) return GM_OK;
    char names[256];
    module_names(arch, names, sizeof names);
    if (is_regex(targets)) {
        char why[160];
        if (!regex_bounded(targets, why, sizeof why))
            return gm_error_set(err, GM_ERR_INVALID, "targets '%s': not accepted as a regular expression: %s", targets,
                                why);
        bool bad = false;
        regex_full_match(targets, "", &bad);
        if (bad)
            return gm_error_set(err, GM_ERR_INVALID,
                                "targets '%s': not a valid regular expression (POSIX extended syntax; Python's \\d \\w \\s "
                                "and (?:...) are accepted)", targets);
        return GM_OK;
    }
    if (strstr(targets, "all-linear"))
        return gm_error_set(err, GM_ERR_INVALID, "targets '%s': all-linear stands alone (it already means every linear module)",
                            targets);
    char bad[128] = "";
    unmatched_ctx uc = {arch, prefix, bad, sizeof bad};
    if (any_entry(targets, entry_matches_none, &uc)) {
        char inner[160];
        snprintf(inner, sizeof inner, "%s.linear", bad);
        char bad2[128] = "";
        unmatched_ctx uc2 = {arch, prefix, bad2, sizeof bad2};
        if ((arch->id == GM_ARCH_GEMMA4_VISION || arch->id == GM_ARCH_GEMMA4_AUDIO) && !strstr(bad, ".linear") &&
            !entry_matches_none(inner, strlen(inner), &uc2))
            return gm_error_set(err, GM_ERR_INVALID, "target module '%s': Gemma 4's %s tower wraps each linear in a "
                                "Gemma4ClippableLinear that clamps its input and output; an adapter on '%s' itself would "
                                "bypass the clamps\n  hint: target '%s.linear' (the inner weight, inside the clamps, as PEFT "
                                "names it); allowed: all-linear, %s, or a regular expression", bad,
                                arch->id == GM_ARCH_GEMMA4_AUDIO ? "audio" : "vision", bad, bad, names);
        return gm_error_set(err, GM_ERR_INVALID, "unknown target module '%s' (allowed: all-linear, %s, or a regular expression)",
                            bad, names);
    }
    return GM_OK;
}

gm_status gm_lora_describe(gm_lora *lo, const gm_lora_config *lc, const gm_arch_def *arch, const gm_config *mc,
                           const char *prefix, gm_error *err) {
    memset(lo, 0, sizeof *lo);
    if (!prefix) prefix = "model.";
    GM_TRY(gm_lora_config_validate(lc, mc, err));
    GM_TRY(gm_lora_targets_check(lc->targets, arch, prefix, err));
    char names[256];
    module_names(arch, names, sizeof names);
    return describe(lo, lc, arch, mc, prefix, NULL, 0, names, err);
}

void gm_lora_free(gm_lora *lo) {
    if (!lo) return;
    gm_free(lo->index);
    gm_free(lo->ad);
    lo->index = NULL;
    lo->ad = NULL;
    lo->n = 0;
}

void gm_lora_layout(gm_lora *lo, gm_arena *a, bool train) {
    int64_t r = lo->cfg.rank;
#define F32(n, kind) (float *)gm_arena_alloc(a, (size_t)(n) * sizeof(float), kind)
    for (int i = 0; i < lo->n; i++) {
        gm_lora_adapter *ad = &lo->ad[i];
        int64_t na = r * ad->in, nb = ad->out * r;
        ad->A = F32(na, GM_MEM_ADAPTERS), ad->B = F32(nb, GM_MEM_ADAPTERS);
        if (!train) continue;
        ad->dA = F32(na, GM_MEM_GRADS), ad->dB = F32(nb, GM_MEM_GRADS);
        ad->mA = F32(na, GM_MEM_OPTIMIZER), ad->vA = F32(na, GM_MEM_OPTIMIZER);
        ad->mB = F32(nb, GM_MEM_OPTIMIZER), ad->vB = F32(nb, GM_MEM_OPTIMIZER);
    }
#undef F32
}

void gm_lora_init_A(const gm_lora_config *lc, const gm_lora_adapter *ad, float *A_host) {
    /* kaiming_uniform_(a = sqrt(5)) on A (rank x in): bound = gain * sqrt(3 / fan_in) with
     * gain = sqrt(2 / (1 + a^2)) = sqrt(1/3), i.e. 1 / sqrt(in) (formats.md §5.4). */
    float bound = 1.0f / sqrtf((float)ad->in);
    uint64_t key = gm_rng_seed(lc->seed, (uint64_t)ad->layer * 16u + (uint64_t)ad->lora_id).key;
    int64_t n = (int64_t)lc->rank * ad->in;
    for (int64_t i = 0; i < n; i++) A_host[i] = (2.0f * gm_rng_uniform_at(key, (uint64_t)i) - 1.0f) * bound;
}

gm_status gm_lora_init_train(const gm_lora *lo, gm_backend *be, gm_error *err) {
    int64_t r = lo->cfg.rank;
    float *stage = gm_malloc((size_t)(r * lo->in_max > 0 ? r * lo->in_max : 1) * sizeof(float));
    if (!stage) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < lo->n; i++) {
        const gm_lora_adapter *ad = &lo->ad[i];
        size_t na = (size_t)(r * ad->in) * sizeof(float), nb = (size_t)(ad->out * r) * sizeof(float);
        gm_lora_init_A(&lo->cfg, ad, stage);
        gm_backend_upload(be, ad->A, stage, na);
        gm_backend_memset(be, ad->B, 0, nb);
        float *zero[6] = {ad->dA, ad->mA, ad->vA, ad->dB, ad->mB, ad->vB};
        for (int q = 0; q < 6; q++) gm_backend_memset(be, zero[q], 0, q < 3 ? na : nb);
    }
    gm_free(stage);
    return gm_backend_status(be, err);
}

/*
 * gm_lora.c - LoRA adapter description: targets, shapes, PEFT names, scaling, init.
 */
#include "gm_lora.h"

#include "gm_rng.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

gm_lora_config gm_lora_config_default(void) {
    gm_lora_config c;
    memset(&c, 0, sizeof c);
    c.rank = 8;
    c.alpha = 8.0f;
    c.targets = (1u << GM_LIN_COUNT) - 1u;
    for (int i = 0; i < GM_MAX_LAYERS; i++) c.layers[i] = true;
    return c;
}

gm_status gm_lora_parse_targets(const char *spec, uint32_t *targets, gm_error *err) {
    *targets = 0;
    if (strcmp(spec, "all-linear") == 0) {
        *targets = (1u << GM_LIN_COUNT) - 1u;
        return GM_OK;
    }
    const char *p = spec;
    while (*p) {
        while (*p == ',' || isspace((unsigned char)*p)) p++;
        if (!*p) break;
        const char *e = p;
        while (*e && *e != ',' && !isspace((unsigned char)*e)) e++;
        int found = -1;
        for (int w = 0; w < GM_LIN_COUNT; w++)
            if (strlen(gm_linear_name((gm_linear)w)) == (size_t)(e - p) && strncmp(gm_linear_name((gm_linear)w), p, (size_t)(e - p)) == 0)
                found = w;
        if (found < 0)
            return gm_error_set(err, GM_ERR_INVALID,
                                "unknown target module '%.*s' (allowed: all-linear, q_proj, k_proj, v_proj, o_proj, "
                                "gate_proj, up_proj, down_proj)",
                                (int)(e - p), p);
        *targets |= 1u << found;
        p = e;
    }
    if (!*targets)
        return gm_error_set(err, GM_ERR_INVALID, "no target modules given (use \"all-linear\" or a list such as \"q_proj,v_proj\")");
    return GM_OK;
}

gm_status gm_lora_config_validate(const gm_lora_config *lc, const gm_config *mc, gm_error *err) {
    if (lc->rank < 1 || lc->rank > 4096)
        return gm_error_set(err, GM_ERR_INVALID, "rank = %d: must be an integer in 1..4096", lc->rank);
    if (!(lc->alpha > 0) || !isfinite(lc->alpha))
        return gm_error_set(err, GM_ERR_INVALID, "alpha = %g: must be a positive number", (double)lc->alpha);
    if (!(lc->dropout >= 0 && lc->dropout < 1))
        return gm_error_set(err, GM_ERR_INVALID, "dropout = %g: must be in [0, 1)", (double)lc->dropout);
    if (!lc->targets || lc->targets >= (1u << GM_LIN_COUNT))
        return gm_error_set(err, GM_ERR_INVALID, "no valid target modules");
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

void gm_lora_linear_shape(const gm_config *mc, int layer, gm_linear which, int64_t *in, int64_t *out) {
    int64_t C = mc->hidden_size, Q = mc->n_heads * mc->head_dim, KV = mc->n_kv_heads * mc->head_dim,
            F = mc->ffn_dim[layer];
    switch (which) {
    case GM_LIN_Q: *in = C, *out = Q; break;
    case GM_LIN_K:
    case GM_LIN_V: *in = C, *out = KV; break;
    case GM_LIN_O: *in = Q, *out = C; break;
    case GM_LIN_GATE:
    case GM_LIN_UP: *in = C, *out = F; break;
    case GM_LIN_DOWN: *in = F, *out = C; break;
    default: *in = *out = 0;
    }
}

void gm_lora_peft_name(int layer, gm_linear which, char ab, char *buf, size_t cap) {
    const char *block = which <= GM_LIN_O ? "self_attn" : "mlp";
    snprintf(buf, cap, "base_model.model.model.layers.%d.%s.%s.lora_%c.weight", layer, block,
             gm_linear_name(which), ab);
}

int64_t gm_lora_count(const gm_lora_config *lc, const gm_config *mc, int64_t *n_params) {
    int64_t n = 0, p = 0;
    for (int64_t l = 0; l < mc->n_layers; l++) {
        if (!lc->layers[l]) continue;
        for (int w = 0; w < GM_LIN_COUNT; w++) {
            if (!(lc->targets & (1u << w))) continue;
            int64_t in, out;
            gm_lora_linear_shape(mc, (int)l, (gm_linear)w, &in, &out);
            n++;
            p += (int64_t)lc->rank * (in + out);
        }
    }
    if (n_params) *n_params = p;
    return n;
}

void gm_lora_init_adapter(const gm_lora_config *lc, gm_lora_adapter *ad) {
    /* kaiming_uniform_(a = sqrt(5)) on A (rank x in): bound = gain * sqrt(3 / fan_in) with
     * gain = sqrt(2 / (1 + a^2)) = sqrt(1/3), i.e. 1 / sqrt(in) (formats.md §5.4). */
    float bound = 1.0f / sqrtf((float)ad->in);
    uint64_t key = gm_rng_seed(lc->seed, (uint64_t)ad->layer * 16u + (uint64_t)ad->which).key;
    int64_t n = (int64_t)lc->rank * ad->in;
    for (int64_t i = 0; i < n; i++) ad->A[i] = (2.0f * gm_rng_uniform_at(key, (uint64_t)i) - 1.0f) * bound;
    memset(ad->B, 0, (size_t)(ad->out * lc->rank) * sizeof(float));
}

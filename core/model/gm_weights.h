/*
 * gm_weights.h - a model's weights as one backend computes on them.
 *
 * A gm_model (gm_model.h) holds the weights where the file put them: memory-mapped, in their
 * stored dtype, norms converted to f32 on the host. A gm_weights is the set of kernel weight
 * views (kernels.h gm_wview) one backend multiplies by, built by walking the architecture's spec
 * (core/arch/gm_arch.h):
 *   - linears in the format the run asks for (gm_quant: as stored, f32, bf16, int8, NF4), re-
 *     encoded on the host (core/quant) when it differs from the stored one;
 *   - norms, embedding and LM head as the model has them;
 *   - on a backend whose memory the host may use in place (CPU), everything the format leaves
 *     unchanged aliases the model (no copy) and only re-encoded linears take arena bytes; on
 *     any other backend (strict, CUDA) every weight is uploaded into the arena - the explicit
 *     upload step.
 * gm_weights_layout follows the two-pass arena protocol (gm_arena.h): on a measuring arena it
 * reserves, on the committed one it fills. Without a model (m == NULL) it plans from the config
 * and the stored dtypes alone - the same walk, so the plan is the allocation.
 *
 * Ownership: the views borrow the arena (re-encoded and uploaded weights) and the model
 * (aliased ones): valid until either is freed. The layer array is owned (gm_weights_free).
 * Errors: GM_ERR_NOMEM (host staging for re-encoding or upload), GM_ERR_INVALID (bad format).
 */
#ifndef GM_WEIGHTS_H
#define GM_WEIGHTS_H

#include "gm_arch.h"
#include "gm_arena.h"
#include "gm_backend.h"
#include "gm_config.h"
#include "gm_quant.h"
#include "gm_status.h"
#include "kernels.h"

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

struct gm_model;

typedef struct gm_weights {
    const gm_arch_def *arch;
    const gm_config *cfg;        /* borrowed (the model's, or the planner's) */
    gm_quant quant;              /* format of the linears */
    int64_t n_layers;
    int n_slots;                 /* arch->n_layer */
    gm_wview global[GM_MAX_GLOBALS]; /* GM_GLOBAL_EMBED (V, C), GM_GLOBAL_FINAL_NORM (1, C) f32,
                                        GM_GLOBAL_LM_HEAD (V, C) (== embed when tied) */
    gm_wview *layer;             /* [n_layers * n_slots]; absent weights have rows == 0 */
    size_t alias_bytes;          /* bytes the views read in place from the model (memory-mapped
                                    weights, the model's f32 norms): resident, not in the arena */
    size_t kind_bytes[GM_W_KIND_COUNT]; /* resident bytes by gm_wkind (linear, norm, embedding, vector), aliased
                                    or in the arena */
    size_t row_table_resident;   /* a table read only by rows (Gemma 3n's per-layer embeddings: no
                                    LM head reads it whole), aliased: the bytes of it the run's token
                                    ids touch (gm_dataset_table_resident), counted instead of the
                                    whole table; 0: the whole table (set before gm_weights_layout) */
} gm_weights;

/* The view of layer l's weight in `slot` (arch->layer[slot]). Norms are f32 (1, width) views. */
static inline const gm_wview *gm_weights_at(const gm_weights *w, int64_t l, int slot) {
    return &w->layer[l * w->n_slots + slot];
}

/* Sets up an empty set for this architecture and config (allocates the layer array).
 * GM_ERR_UNSUPPORTED when the architecture has no definition. */
gm_status gm_weights_init(gm_weights *w, const gm_config *cfg, gm_quant q, gm_error *err);
void gm_weights_free(gm_weights *w);

/* One pass of the two-pass protocol on arena `a` (measuring or committed, on backend `be`):
 * m != NULL: the model's weights in format q (re-encoded on the host with n_threads threads,
 * then uploaded unless `be` is host-visible). m == NULL: a plan from the config with linears
 * stored as `stored` and the embedding as `stored_embed` (be may be NULL: a host-visible
 * backend is assumed). After a committed pass with a model, every view points at backend memory
 * (or, host-visible, at the model's own). */
gm_status gm_weights_layout(gm_weights *w, const struct gm_model *m, gm_dtype stored, gm_dtype stored_embed,
                            gm_backend *be, gm_arena *a, int n_threads, gm_error *err);

/* Workspace (floats) the matmul kernels need for every matrix of w (kernels.h
 * gm_k_matmul_scratch_floats), the LM head read in row chunks of `lm_rows`. */
size_t gm_weights_scratch_floats(const gm_weights *w, int64_t lm_rows, int n_threads);
/* bf16 staging (elements) for the CPU's bf16 GEMMs on these weights (gm_k_matmul_bf16_staging_elems):
 * every linear with M rows, the LM head as lm_vocab rows of the embedding with lm_m rows (0: none). */
size_t gm_weights_bf16_staging_elems(const gm_weights *w, int64_t M, int64_t lm_vocab, int64_t lm_m);

#ifdef __cplusplus
}
#endif
#endif /* GM_WEIGHTS_H */

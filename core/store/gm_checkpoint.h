/*
 * gm_checkpoint.h - training checkpoints in HDF5, written crash-safe.
 *
 * A checkpoint holds everything a resumed run needs to produce the same losses as a run that
 * never stopped: the adapter weights, the AdamW moments, the optimizer step, the RNG state
 * (seed + counter of the counter-based RNG, core/base/gm_rng.h) and the data position (epoch and
 * index into the epoch's shuffled order), plus the resolved configuration as JSON text.
 *
 * File layout (default HDF5 library version bounds, so no "file is open for write" flag can
 * linger after a crash; formats.md §7.2):
 *   /                      attributes: format = "gemmarun-checkpoint", version = 1, step, epoch,
 *                          data_pos, rng_seed, rng_counter (u64), loss (f64), config_json (vlen
 *                          UTF-8 string), created_by ("gemmarun x.y.z")
 *   /adapter/<name>        f32 datasets, C order, name = the PEFT key
 *                          ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight")
 *   /optimizer/m/<name>    f32, same shapes (AdamW first moment)
 *   /optimizer/v/<name>    f32 (second moment)
 * Writing: the file is built in memory (HDF5 core driver), its image written to <path>.tmp in
 * the same folder with write(2), fsync(file), rename() onto <path>, fsync(folder) (formats.md
 * §7.3; gm_h5_save_atomic). A crash at any point leaves either the previous checkpoint or the
 * new one under <path>, never a torn file; at most a stray <path>.tmp, which the next save
 * overwrites. HDF5 itself never writes to the disk here, because HDF5 1.10.8 crashes the
 * process at exit after a failed write of its own (disk full; gm_h5.h). Peak memory during a
 * save: about twice the checkpoint size.
 *
 * Ownership: the caller owns every buffer; save reads them, load fills them (shapes must be set
 * by the caller and must match the file exactly).
 * Errors: GM_ERR_IO (file missing or unreadable; cannot create/rename/fsync; disk full),
 * GM_ERR_FORMAT (not HDF5, not a gemmarun checkpoint, wrong version, a root attribute missing,
 * a tensor missing, not f32, or of another shape: named with both shapes), GM_ERR_INVALID (the
 * caller's tensor list: a name empty, "." or containing '/', listed twice, rank > 4, no data
 * buffer), GM_ERR_NOMEM. Every message names the file (and the tensor where one is involved).
 * HDF5's own error printing is silenced; its error-stack text is folded into gm_error.
 * Implemented in gm_checkpoint.c on top of gm_h5.h; the layout is documented for Python users in
 * docs/checkpoints.md (checklist: change both together, and bump `version` on any change a
 * reader would notice).
 */
#ifndef GM_CHECKPOINT_H
#define GM_CHECKPOINT_H

#include "gm_status.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One named f32 tensor. In gm_ckpt_save `data` is read; in gm_ckpt_load it is written. */
typedef struct gm_ckpt_tensor {
    const char *name;   /* PEFT key, e.g. "...q_proj.lora_A.weight" */
    float *data;
    float *m, *v;       /* AdamW moments of the same shape; may be NULL (not saved/loaded) */
    int ndim;
    int64_t shape[4];
} gm_ckpt_tensor;

typedef struct gm_ckpt {
    int64_t step;          /* optimizer steps completed */
    int64_t epoch;         /* current epoch (0-based) */
    int64_t data_pos;      /* next example index within the epoch's order */
    uint64_t rng_seed;
    uint64_t rng_counter;
    double loss;           /* loss of the last completed step (for display) */
    const char *config_json; /* save: written as an attribute; load: ignored (see read_config) */
    double lora_alpha;     /* save: the adapters' LoRA alpha, written as attribute lora_alpha when
                              > 0 (with lora_rslora), so that the file alone gives their scaling */
    bool lora_rslora;
    int n_tensors;
    gm_ckpt_tensor *tensors;
} gm_ckpt;

/* Writes `c` to `path` crash-safe (see above). A NULL config_json is stored as "{}". On
 * failure the file previously at `path`, if any, is untouched and <path>.tmp is removed; the
 * one failure after the switch (fsync of the folder) says so in its message. Saves to the same
 * path must not run concurrently (they share <path>.tmp). */
gm_status gm_ckpt_save(const char *path, const gm_ckpt *c, gm_error *err);

/* Reads a checkpoint: fills the scalar fields and every tensor listed in c->tensors (names and
 * shapes given by the caller; each must exist in the file with exactly that shape; m and v are
 * read where the caller gives buffers, so a subset or weights only may be loaded). Every
 * tensor is checked before any is read: a format error leaves `c` and its buffers untouched
 * (an I/O error in the middle of reading may leave buffers partly filled; the scalars are set
 * only on success). */
gm_status gm_ckpt_load(const char *path, gm_ckpt *c, gm_error *err);

/* Reads the config_json attribute into a gm_malloc'd string (*out; NULL on failure), after the
 * same format/version checks as gm_ckpt_load. */
gm_status gm_ckpt_read_config(const char *path, char **out, gm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* GM_CHECKPOINT_H */

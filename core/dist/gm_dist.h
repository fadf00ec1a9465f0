/*
 * gm_dist.h - data-parallel training of one trial across processes: the process group and its
 * collectives (all-reduce, broadcast, barrier), MPI between processes, NCCL between GPUs.
 *
 * A gm_dist is the world of one run: world_size processes, this one is `rank` (0-based; rank 0
 * is the root, the only one that writes files and prints). gm_dist_new reads the world from the
 * environment a launcher sets (mpirun: OMPI_COMM_WORLD_SIZE / _RANK, PMIx: PMIX_RANK with
 * OMPI_COMM_WORLD_SIZE, srun: SLURM_NTASKS / SLURM_PROCID) and initializes MPI only when it
 * says world_size > 1; otherwise the world is this process alone, every collective is a no-op
 * and MPI is never touched (a plain run does not need mpirun). The trainer uses it through
 * gm_trainer_set_dist (core/train/gm_train.h): each optimizer step all-reduces the supervised
 * token count, the loss sum and the adapters' gradients (sum), so world_size processes with
 * gradient_accumulation_steps A equal one process with A x world_size.
 *
 * Host buffers go through MPI (MPI_Allreduce / MPI_Bcast on MPI_COMM_WORLD). Device buffers
 * (the CUDA backend) go through NCCL once gm_dist_nccl_attach (kernels/cuda/dist_nccl.cu, CUDA
 * builds with NCCL only) has bound a communicator to the backend's stream; without it a device
 * all-reduce is GM_ERR_UNSUPPORTED.
 *
 * Ownership: gm_dist_new returns an owned world, freed by gm_dist_free (which finalizes MPI if
 * it initialized it; _free(NULL) is a no-op). One world per process (MPI can be initialized
 * once): create it in main, before any thread; pass it borrowed to the trainer. Collectives
 * are blocking, called by every rank in the same order, from one thread.
 * Errors: gm_status with the detail in *err: GM_ERR_INVALID for an environment that
 * contradicts itself (rank outside 0..world_size-1, a world the MPI library disagrees with),
 * GM_ERR_UNSUPPORTED for world_size > 1 in a build without MPI or a device all-reduce without
 * NCCL, GM_ERR_DEVICE for a failed MPI or NCCL call (with the library's message). A failed
 * collective leaves the world unusable: the caller reports it and ends the process with
 * gm_dist_abort (main only), which stops every rank instead of leaving them blocked forever.
 */
#ifndef GM_DIST_H
#define GM_DIST_H

#include "gm_status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gm_dist gm_dist;
struct gm_backend; /* gm_backend.h */

typedef enum gm_dist_op { GM_DIST_SUM = 0, GM_DIST_MIN, GM_DIST_MAX, GM_DIST_OP_COUNT } gm_dist_op;

/* ---- create / destroy --------------------------------------------------------------------- */

/* The world this process belongs to, from the launcher's environment (above). MPI is initialized
 * here only for world_size > 1. */
gm_status gm_dist_new(gm_dist **out, gm_error *err);
/* Finalizes MPI when gm_dist_new initialized it (every rank must call it, after its last
 * collective). NULL: no-op. */
void gm_dist_free(gm_dist *d);
/* Ends every rank of the world: prints `msg` (one line, to stderr, prefixed with the rank) and
 * calls MPI_Abort with `code`. For main only (the one place that decides the exit code); for a
 * single-process world it only prints and returns. */
void gm_dist_abort(gm_dist *d, int code, const char *msg);

/* ---- query -------------------------------------------------------------------------------- */

int gm_dist_world_size(const gm_dist *d); /* 1 for NULL */
int gm_dist_rank(const gm_dist *d);       /* 0 for NULL */
/* Rank within this node (OMPI_COMM_WORLD_LOCAL_RANK / SLURM_LOCALID; 0 if unknown): which GPU. */
int gm_dist_local_rank(const gm_dist *d);
/* "mpi" when MPI runs the collectives, "none" for a single-process world. */
const char *gm_dist_transport(const gm_dist *d);
/* Whether this build has MPI compiled in. */
bool gm_dist_have_mpi(void);

/* ---- collectives (every rank, same order; no-ops for world_size 1) ----------------------- */

/* In place, elementwise over ranks: buf (n) f32 host memory. SUM is not associative in floats:
 * the result may differ in the last bits from a sequential sum, but is the same on every rank
 * (Open MPI reduces each element once and distributes it). */
gm_status gm_dist_allreduce_f32(gm_dist *d, float *buf, size_t n, gm_dist_op op, gm_error *err);
/* The same for f64 and int64 host buffers (loss sums, token counts, flags). */
gm_status gm_dist_allreduce_f64(gm_dist *d, double *buf, size_t n, gm_dist_op op, gm_error *err);
gm_status gm_dist_allreduce_i64(gm_dist *d, int64_t *buf, size_t n, gm_dist_op op, gm_error *err);
/* Sum in place over ranks of buf (n) f32 in `be`'s memory: MPI on a host-visible backend, NCCL
 * on the backend's stream when attached (GM_ERR_UNSUPPORTED otherwise). Returns after the
 * result is in buf. */
gm_status gm_dist_allreduce_backend(gm_dist *d, struct gm_backend *be, float *buf, size_t n, gm_error *err);
/* Several buffers in one call (bufs[i] of n[i] floats, backend memory): grouped into one NCCL
 * call on a device, or packed through `stage` (sum of n floats, host; NULL for a single buffer)
 * into one MPI call on the host. */
gm_status gm_dist_allreduce_many(gm_dist *d, struct gm_backend *be, float *const *bufs, const size_t *n, int count,
                                 float *stage, gm_error *err);
/* Copies `bytes` bytes of root's buf to every rank's buf. */
gm_status gm_dist_bcast(gm_dist *d, void *buf, size_t bytes, int root, gm_error *err);
/* Waits until every rank reached it. */
gm_status gm_dist_barrier(gm_dist *d, gm_error *err);

/* ---- device collectives (NCCL) ------------------------------------------------------------ */

/* What gm_dist_nccl_attach installs: a sum all-reduce of device floats on a stream. */
typedef struct gm_dist_device_ops {
    gm_status (*allreduce_sum)(void *ctx, float *const *bufs, const size_t *n, int count, gm_error *err);
    void (*free)(void *ctx);
    void *ctx;
    const struct gm_backend *be; /* the backend whose stream and memory it serves */
} gm_dist_device_ops;
/* Installs (replacing and freeing any previous) device ops; gm_dist_free frees them. For the NCCL
 * twin; ops->be borrowed. */
void gm_dist_set_device_ops(gm_dist *d, const gm_dist_device_ops *ops);
/* Binds an NCCL communicator over the world to backend `be` (CUDA, borrowed; must outlive d):
 * rank 0 makes the unique id, gm_dist_bcast shares it. Defined by kernels/cuda/dist_nccl.cu in
 * CUDA builds with NCCL; GM_ERR_DEVICE with NCCL's message on failure. */
gm_status gm_dist_nccl_attach(gm_dist *d, struct gm_backend *be, gm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* GM_DIST_H */

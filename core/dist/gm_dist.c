/*
 * gm_dist.c - the process group of a data-parallel run over MPI (see gm_dist.h).
 *
 * Why MPI and not our own sockets: launchers (mpirun, srun) already start the processes, give
 * them ranks and wire them up, and Open MPI's all-reduce picks the algorithm for the message
 * size and network; DESIGN.md §8 rules out home-made collectives. Why MPI is initialized only
 * when the environment says world_size > 1: MPI_Init in a plain run would start the PMIx
 * machinery for nothing (and fail on machines whose MPI wants a launcher), and a plain run must
 * behave as it did before this module existed.
 *
 * Errors: MPI_COMM_WORLD is set to MPI_ERRORS_RETURN so that a failed call comes back as a code
 * (MPI_Error_string's text in the message) instead of Open MPI's default abort.
 */
#include "gm_dist.h"

#include "gm_alloc.h"
#include "gm_backend.h" // gm_backend: host_visible, copies

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef GM_HAVE_MPI
#include <mpi.h>
#endif

struct gm_dist {
    int world_size, rank, local_rank;
    bool mpi;                /* this process initialized MPI (world_size > 1) */
    gm_dist_device_ops dev;  /* NCCL, when attached */
};

/* ---- the environment ---------------------------------------------------------------------- */

/* A non-negative integer from environment variable `name`, or -1 when absent or not a number. */
static long env_int(const char *name) {
    const char *v = getenv(name);
    if (!v || !*v) return -1;
    char *end;
    long n = strtol(v, &end, 10);
    return (*end || n < 0) ? -1 : n;
}

/* The world the launcher announced: Open MPI's mpirun (also under PMIx), MPICH/PMI-2 (srun
 * --mpi=pmi2 too), then srun's own variables. SLURM_STEP_NUM_TASKS, not SLURM_NTASKS: a batch
 * script asking for 4 tasks has SLURM_NTASKS=4 but is itself one process until it calls srun. */
static void env_world(int *size, int *rank, int *local, const char **from) {
    static const char *const vars[][4] = {
        {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "mpirun (OMPI_COMM_WORLD_SIZE)"},
        {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "PMIx (PMIX_RANK)"},
        {"PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID", "PMI (PMI_SIZE)"},
        {"SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_LOCALID", "srun (SLURM_STEP_NUM_TASKS)"},
    };
    *size = 1, *rank = 0, *local = 0, *from = "no launcher";
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        long s = env_int(vars[i][0]), r = env_int(vars[i][1]);
        if (s < 1 || r < 0) continue;
        long l = env_int(vars[i][2]);
        *size = (int)s, *rank = (int)r, *local = l < 0 ? 0 : (int)l, *from = vars[i][3];
        return;
    }
}

bool gm_dist_have_mpi(void) {
#ifdef GM_HAVE_MPI
    return true;
#else
    return false;
#endif
}

#ifdef GM_HAVE_MPI
static gm_status mpi_fail(gm_error *err, int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return gm_error_set(err, GM_ERR_DEVICE, "%s failed: %s", what, msg);
}
#endif

/* ---- create / destroy --------------------------------------------------------------------- */

gm_status gm_dist_new(gm_dist **out, gm_error *err) {
    *out = NULL;
    int size, rank, local;
    const char *from;
    env_world(&size, &rank, &local, &from);
    if (rank >= size)
        return gm_error_set(err, GM_ERR_INVALID, "%s says rank %d of a world of %d processes", from, rank, size);
#ifndef GM_HAVE_MPI
    if (size > 1)
        return gm_error_set(err, GM_ERR_UNSUPPORTED,
                            "%s says %d processes, but this gemmarun was built without MPI\n"
                            "HINT: install libopenmpi-dev (setup.sh does) and rebuild, or run one process",
                            from, size);
#endif
    gm_dist *d = gm_calloc(1, sizeof *d);
    if (!d) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    d->world_size = 1, d->rank = 0, d->local_rank = local;
#ifdef GM_HAVE_MPI
    if (size > 1) {
        int provided = 0;
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) {
            gm_free(d);
            return gm_error_set(err, GM_ERR_DEVICE, "MPI_Init_thread failed (code %d) in a world of %d from %s", rc, size, from);
        }
        d->mpi = true;
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        MPI_Comm_size(MPI_COMM_WORLD, &d->world_size);
        MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
        if (d->world_size != size) {
            gm_status s = gm_error_set(err, GM_ERR_INVALID,
                                       "%s says %d processes, but MPI started a world of %d\n"
                                       "HINT: under Slurm, start gemmarun with srun --mpi=pmix (or mpirun) so that "
                                       "MPI sees the other tasks",
                                       from, size, d->world_size);
            gm_dist_free(d);
            return s;
        }
    }
#endif
    *out = d;
    return GM_OK;
}

void gm_dist_free(gm_dist *d) {
    if (!d) return;
    if (d->dev.free) d->dev.free(d->dev.ctx);
#ifdef GM_HAVE_MPI
    if (d->mpi) MPI_Finalize();
#endif
    gm_free(d);
}

void gm_dist_abort(gm_dist *d, int code, const char *msg) {
    fprintf(stderr, "gemmarun: rank %d of %d: %s\n", gm_dist_rank(d), gm_dist_world_size(d), msg);
    fflush(stderr);
#ifdef GM_HAVE_MPI
    if (d && d->mpi) MPI_Abort(MPI_COMM_WORLD, code);
#endif
}

/* ---- query -------------------------------------------------------------------------------- */

int gm_dist_world_size(const gm_dist *d) { return d ? d->world_size : 1; }
int gm_dist_rank(const gm_dist *d) { return d ? d->rank : 0; }
int gm_dist_local_rank(const gm_dist *d) { return d ? d->local_rank : 0; }
const char *gm_dist_transport(const gm_dist *d) { return d && d->mpi ? "mpi" : "none"; }

void gm_dist_set_device_ops(gm_dist *d, const gm_dist_device_ops *ops) {
    if (d->dev.free) d->dev.free(d->dev.ctx);
    d->dev = ops ? *ops : (gm_dist_device_ops){0};
}

/* ---- collectives -------------------------------------------------------------------------- */

#ifdef GM_HAVE_MPI
static const MPI_Op OPS[GM_DIST_OP_COUNT] = {MPI_SUM, MPI_MIN, MPI_MAX};

/* MPI counts are int: larger buffers go in chunks of 2^30 elements. */
static gm_status allreduce(gm_dist *d, void *buf, size_t n, size_t elem, MPI_Datatype t, gm_dist_op op, gm_error *err) {
    for (size_t off = 0; off < n;) {
        size_t c = n - off < ((size_t)1 << 30) ? n - off : ((size_t)1 << 30);
        int rc = MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * elem, (int)c, t, OPS[op], MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "MPI_Allreduce");
        off += c;
    }
    return GM_OK;
}
#endif

gm_status gm_dist_allreduce_f32(gm_dist *d, float *buf, size_t n, gm_dist_op op, gm_error *err) {
#ifdef GM_HAVE_MPI
    if (d && d->mpi) return allreduce(d, buf, n, sizeof *buf, MPI_FLOAT, op, err);
#endif
    return GM_OK;
}

gm_status gm_dist_allreduce_f64(gm_dist *d, double *buf, size_t n, gm_dist_op op, gm_error *err) {
#ifdef GM_HAVE_MPI
    if (d && d->mpi) return allreduce(d, buf, n, sizeof *buf, MPI_DOUBLE, op, err);
#endif
    return GM_OK;
}

gm_status gm_dist_allreduce_i64(gm_dist *d, int64_t *buf, size_t n, gm_dist_op op, gm_error *err) {
#ifdef GM_HAVE_MPI
    if (d && d->mpi) return allreduce(d, buf, n, sizeof *buf, MPI_INT64_T, op, err);
#endif
    return GM_OK;
}

gm_status gm_dist_allreduce_backend(gm_dist *d, gm_backend *be, float *buf, size_t n, gm_error *err) {
    float *const bufs[1] = {buf};
    return gm_dist_allreduce_many(d, be, bufs, &n, 1, NULL, err);
}

gm_status gm_dist_allreduce_many(gm_dist *d, gm_backend *be, float *const *bufs, const size_t *n, int count,
                                 float *stage, gm_error *err) {
    if (!d || (d->world_size == 1 && !d->dev.allreduce_sum)) return GM_OK;
    if (d->dev.allreduce_sum && d->dev.be == be) return d->dev.allreduce_sum(d->dev.ctx, bufs, n, count, err);
    if (!be->host_visible && !stage)
        return gm_error_set(err, GM_ERR_UNSUPPORTED,
                            "an all-reduce of %s backend memory needs NCCL (gm_dist_nccl_attach) or a host stage",
                            be->name);
    if (!stage) { /* host memory in place, one call per buffer */
        for (int i = 0; i < count; i++) GM_TRY(gm_dist_allreduce_f32(d, bufs[i], n[i], GM_DIST_SUM, err));
        return GM_OK;
    }
    /* one message: pack, reduce, unpack (Open MPI's large-message algorithms pay off only then) */
    size_t off = 0;
    for (int i = 0; i < count; i++) {
        if (be->host_visible) memcpy(stage + off, bufs[i], n[i] * sizeof(float));
        else gm_backend_download(be, stage + off, bufs[i], n[i] * sizeof(float));
        off += n[i];
    }
    GM_TRY(gm_backend_status(be, err));
    GM_TRY(gm_dist_allreduce_f32(d, stage, off, GM_DIST_SUM, err));
    off = 0;
    for (int i = 0; i < count; i++) {
        if (be->host_visible) memcpy(bufs[i], stage + off, n[i] * sizeof(float));
        else gm_backend_upload(be, bufs[i], stage + off, n[i] * sizeof(float));
        off += n[i];
    }
    return gm_backend_status(be, err);
}

gm_status gm_dist_bcast(gm_dist *d, void *buf, size_t bytes, int root, gm_error *err) {
#ifdef GM_HAVE_MPI
    if (d && d->mpi) {
        for (size_t off = 0; off < bytes;) {
            size_t c = bytes - off < ((size_t)1 << 30) ? bytes - off : ((size_t)1 << 30);
            int rc = MPI_Bcast((char *)buf + off, (int)c, MPI_BYTE, root, MPI_COMM_WORLD);
            if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "MPI_Bcast");
            off += c;
        }
    }
#endif
    return GM_OK;
}

gm_status gm_dist_barrier(gm_dist *d, gm_error *err) {
#ifdef GM_HAVE_MPI
    if (d && d->mpi) {
        int rc = MPI_Barrier(MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "MPI_Barrier");
    }
#endif
    return GM_OK;
}

#if !defined(GM_HAVE_NCCL)
gm_status gm_dist_nccl_attach(gm_dist *d, gm_backend *be, gm_error *err) {
    return gm_error_set(err, GM_ERR_UNSUPPORTED, "this build has no NCCL (data-parallel training on GPUs needs it)");
}
#endif

/*
 * dist_nccl.cu - the NCCL twin of core/dist/gm_dist.c: sum all-reduces of device buffers over
 * the data-parallel world, on the CUDA backend's stream (gm_dist_nccl_attach, gm_dist.h).
 *
 * MPI still starts the world and gives the ranks (gm_dist_new); NCCL only moves the gradients,
 * GPU to GPU (NVLink, PCIe, InfiniBand), without staging them through host memory. Rank 0 makes
 * the communicator's unique id and gm_dist_bcast (MPI) hands it to the others; a world of one
 * process gets a one-rank communicator (what the GPU test checks). The buffers of one call are
 * one ncclGroupStart/End group, which NCCL fuses. Compiled only when CMake found NCCL
 * (GM_HAVE_NCCL); gm_dist.c has the stub that says so otherwise.
 *
 * Errors: a failed NCCL call is GM_ERR_DEVICE with ncclGetErrorString's text; the all-reduce
 * synchronizes the stream, so a failure surfaces in the step that caused it.
 */
#ifdef GM_HAVE_NCCL
#include "common.cuh"

#include <nccl.h>

extern "C" {
#include "gm_alloc.h"
#include "gm_backend.h"
#include "gm_dist.h"
}

typedef struct nccl_ctx {
    ncclComm_t comm;
    cudaStream_t stream;
} nccl_ctx;

static gm_status nccl_fail(gm_error *err, ncclResult_t r, const char *what) {
    return gm_error_set(err, GM_ERR_DEVICE, "%s failed: %s", what, ncclGetErrorString(r));
}

static gm_status nccl_allreduce_sum(void *ctx, float *const *bufs, const size_t *n, int count, gm_error *err) {
    nccl_ctx *c = (nccl_ctx *)ctx;
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; r == ncclSuccess && i < count; i++)
        if (n[i] > 0) r = ncclAllReduce(bufs[i], bufs[i], n[i], ncclFloat32, ncclSum, c->comm, c->stream);
    ncclResult_t r2 = ncclGroupEnd();
    if (r != ncclSuccess) return nccl_fail(err, r, "ncclAllReduce");
    if (r2 != ncclSuccess) return nccl_fail(err, r2, "ncclGroupEnd");
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) return gm_error_set(err, GM_ERR_DEVICE, "all-reduce: %s", cudaGetErrorString(e));
    return GM_OK;
}

static void nccl_free(void *ctx) {
    nccl_ctx *c = (nccl_ctx *)ctx;
    if (c && c->comm) ncclCommDestroy(c->comm);
    gm_free(c);
}

extern "C" gm_status gm_dist_nccl_attach(gm_dist *d, gm_backend *be, gm_error *err) {
    if (!be || be->device != GM_DEVICE_CUDA)
        return gm_error_set(err, GM_ERR_INVALID, "NCCL serves the CUDA backend, not %s", be ? be->name : "none");
    ncclUniqueId id;
    if (gm_dist_rank(d) == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) return nccl_fail(err, r, "ncclGetUniqueId");
    }
    GM_TRY(gm_dist_bcast(d, &id, sizeof id, 0, err));
    nccl_ctx *c = (nccl_ctx *)gm_calloc(1, sizeof *c);
    if (!c) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    c->stream = (cudaStream_t)be->stream;
    ncclResult_t r = ncclCommInitRank(&c->comm, gm_dist_world_size(d), id, gm_dist_rank(d));
    if (r != ncclSuccess) {
        gm_free(c);
        return nccl_fail(err, r, "ncclCommInitRank");
    }
    gm_dist_device_ops ops = {nccl_allreduce_sum, nccl_free, c, be};
    gm_dist_set_device_ops(d, &ops);
    return GM_OK;
}
#endif /* GM_HAVE_NCCL */

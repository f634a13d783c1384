/* strata: the GPU as `strata info`, the tests and the tools probe it:
 * whether one is there, its facts, and whether cuBLASLt loads. The cuda
 * device's ops behind these are the backend's own
 * (src/backend/kernels/cuda/cuda_ops.h); a program computes on a GPU
 * through the device and compute seams (strata/device.h,
 * strata/compute.h). Built only with nvcc (ST_HAVE_CUDA). */
#ifndef STRATA_CUDA_H
#define STRATA_CUDA_H

#include "strata/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Load cuBLASLt (libcublasLt.so.<major> with dlopen, once; a cuda context
 * does it first): its static initialisers cost about 0.45 s, so programs
 * that never make a context never load it. *soname (may be NULL) gets the
 * library's name. Returns 0, or -ENOENT when the library or one of its
 * functions is not found (the detail says which). No GPU is needed. */
int st_cuda_blas_load(const char **soname);
/* 1 when a usable GPU is present, else 0 (never fails). */
int st_cuda_available(void);
/* What `strata info` shows of a GPU. */
struct st_cuda_info {
	int count;                 /* GPUs the runtime sees */
	int runtime_version;       /* 13000 for 13.0 */
	int driver_version;        /* the newest CUDA the driver takes; 0 without one */
	char name[256];
	int cc_major, cc_minor;    /* compute capability */
	int sm_count;
	uint64_t total_bytes, free_bytes;
	char busid[32];            /* "0000:65:00.0" */
	int numa_node;             /* hwloc OS index near the GPU, or -1 */
};
/* Fill *out for GPU `ordinal` (versions and count even without a GPU). It
 * makes `ordinal` the calling thread's current device, whose primary
 * context it creates: free_bytes is what is free with that context made.
 * Returns 0; -ENODEV when there is no such GPU (the runtime's reason in
 * st_error_last(), "no CUDA-capable device is detected"); another -errno
 * (st_cuda_err()) when the GPU is there but a query fails, e.g. one in
 * exclusive-process mode that another process holds. */
int st_cuda_info(int ordinal, struct st_cuda_info *out);

#ifdef __cplusplus
}
#endif

#endif

/* The compute seam's insides, shared by src/backend/compute/compute.c and the
 * backends; not a public header. */
#ifndef STRATA_COMPUTE_INTERNAL_H
#define STRATA_COMPUTE_INTERNAL_H

#include "strata/compute.h"

/* Op records the queued cpu compute holds in flight: a ring allocated at
 * create; a caller that finds it full waits for the oldest to finish (as a
 * full CUDA launch queue blocks), so no op allocates. */
#define ST_COMPUTE_CPU_RING_OPS 256

/* The cpu backend's one dispatch (src/backend/compute/compute_cpu.c): run op
 * on the calling thread with the cpu kernels. op must be supported. */
void st_cpu_op_run(const struct st_op *op);
/* What st_cpu_op_run() takes: every op at its reference dtypes,
 * matmul_fwd with bf16 inp and weight, adamw with a bf16 W, and every fp32
 * / bf16 mix that kernels_bf16.h widens. */
bool st_cpu_op_supports(enum st_op_kind kind, const enum st_dtype *dtypes);

/* The cpu kernels on a new queue of the cpu device d. 0, or -ENOMEM or
 * what st_queue_create() returns. */
int st_compute_cpu_queued_create(struct st_device *d, struct st_compute **out);

#ifdef ST_HAVE_CUDA
/* The cuda compute on GPU `ordinal` (src/backend/compute/compute_cuda.c). */
int st_compute_cuda_create(int ordinal, struct st_compute **out);
/* Its supports_shape hook's rule, for tests without a GPU: whether the
 * cuda compute runs op (dtypes it supports) at op's shapes; when not, why
 * (why_bytes > 0) gets the reason. */
bool st_compute_cuda_supports_shape(const struct st_op *op, char *why, size_t why_bytes);
#endif

#endif

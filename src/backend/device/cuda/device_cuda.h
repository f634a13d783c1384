/* strata: what the cuda device (device_cuda.cu) gives the cuda ops
 * (src/backend/kernels/cuda) and nothing else sees: CUDA statuses as
 * -errno, and the CUDA event behind an event of the device. Only for
 * inclusion from .cu files (C++ linkage). */
#ifndef STRATA_DEVICE_CUDA_H
#define STRATA_DEVICE_CUDA_H

#include <cuda_runtime.h>

struct st_event;

/* A CUDA status as -errno (-ENOMEM, -ENODEV, -EINVAL, else -EIO), with
 * "cuda: <what>: <message> (<name>)" kept in st_error_last() and the
 * non-sticky error state cleared. Defined in device_cuda.cu; every .cu file
 * of the cuda device and its ops maps its errors through it. */
int st_cuda_err(cudaError_t e, const char *what);

/* Return st_cuda_err() from the calling function when call fails. */
#define CU_CHECK(call, what)                              \
	do {                                              \
		cudaError_t e_ = (call);                  \
		if (e_ != cudaSuccess)                    \
			return st_cuda_err(e_, what);     \
	} while (0)

/* A call whose failure changes nothing for the caller (teardown, an
 * optional fact): its status dropped, and the error it may have left in
 * the thread's last-error state cleared, so that the next launch check
 * (cudaGetLastError()) does not report it as that launch's failure. */
#define CU_IGNORE(call)                                   \
	do {                                              \
		if ((call) != cudaSuccess)                \
			cudaGetLastError();         \
	} while (0)

/* The CUDA event behind e, an event of the cuda device (strata/device.h),
 * for the cuda context's record and wait (st_cuda_ctx_record(),
 * st_cuda_ctx_wait()). Borrowed: valid until the event is destroyed. */
cudaEvent_t st_cuda_event_of(struct st_event *e);

#endif

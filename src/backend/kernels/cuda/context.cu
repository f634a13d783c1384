/* strata: the cuda context (cuda_ops.h): a stream, cuBLASLt's handle
 * and workspace (matmul.cu makes them), scratch for the two-pass
 * reductions (ops.cu) and the timers' anchor; the GPU's facts for `strata
 * info`; device memory for tests and tools; timers on the stream; the
 * order between the stream and the cuda device's queues. Every
 * CUDA status is checked and turned into -errno; the native message is
 * kept in st_error_last().
 *
 * No relocatable device code: the static library is linked into C
 * programs by the C linker. */
#include <cuda_runtime.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "cuda_ops.h"
#include "strata/device.h"
}
#include "context.cuh"

/* For the other op files (cuda_internal.h): C++ linkage, not public. */
cudaStream_t st_cuda_ctx_stream(struct st_cuda_ctx *ctx)
{
	return ctx->stream;
}

/* For the other op files (cuda_internal.h): ctx_enter. */
int st_cuda_ctx_enter(struct st_cuda_ctx *ctx)
{
	return ctx_enter(ctx);
}

/* ---- public: context and memory ------------------------------------------------ */

extern "C" {

int st_cuda_available(void)
{
	int count = 0;

	if (cudaGetDeviceCount(&count) != cudaSuccess) {
		cudaGetLastError();
		return 0;
	}
	return count > 0;
}

int st_cuda_info(int ordinal, struct st_cuda_info *out)
{
	struct cudaDeviceProp prop;
	size_t free_bytes = 0, total_bytes = 0;
	cudaError_t e;

	memset(out, 0, sizeof(*out));
	out->numa_node = -1;
	if (cudaRuntimeGetVersion(&out->runtime_version) != cudaSuccess) {
		cudaGetLastError();
		out->runtime_version = 0;
	}
	if (cudaDriverGetVersion(&out->driver_version) != cudaSuccess) {
		cudaGetLastError();
		out->driver_version = 0;
	}
	e = cudaGetDeviceCount(&out->count);
	if (e != cudaSuccess) {
		cudaGetLastError();
		out->count = 0;
		return st_error_set(-ENODEV, "cuda: no usable GPU: %s (%s)",
				    cudaGetErrorString(e), cudaGetErrorName(e));
	}
	if (ordinal < 0 || ordinal >= out->count)
		return st_error_set(-ENODEV, "cuda: no GPU %d (%d present)", ordinal, out->count);
	e = cudaGetDeviceProperties(&prop, ordinal);
	if (e != cudaSuccess)
		return st_cuda_err(e, "cudaGetDeviceProperties");
	snprintf(out->name, sizeof(out->name), "%s", prop.name);
	out->cc_major = prop.major;
	out->cc_minor = prop.minor;
	out->sm_count = prop.multiProcessorCount;
	out->total_bytes = prop.totalGlobalMem;
	CU_CHECK(cudaSetDevice(ordinal), "cudaSetDevice");
	CU_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
	out->free_bytes = free_bytes;
	if (cudaDeviceGetPCIBusId(out->busid, sizeof(out->busid), ordinal) == cudaSuccess)
		out->numa_node = st_hwloc_numa_of_pci(out->busid);
	else
		cudaGetLastError();
	return 0;
}

int st_cuda_ctx_create(int ordinal, struct st_cuda_ctx **out)
{
	struct st_cuda_ctx *ctx;
	int count = 0, rc = 0;
	cudaError_t e;

	*out = NULL;
	e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess) { /* no driver, no device: no usable GPU */
		cudaGetLastError();
		return st_error_set(-ENODEV, "cuda: no usable GPU: %s (%s)",
				    cudaGetErrorString(e), cudaGetErrorName(e));
	}
	if (ordinal < 0 || ordinal >= count)
		return st_error_set(-ENODEV, "cuda: no GPU %d (%d present)", ordinal, count);
	ctx = (struct st_cuda_ctx *)calloc(1, sizeof(*ctx));
	if (!ctx)
		return st_error_set(-ENOMEM, "cuda: context");
	ctx->ordinal = ordinal;
	e = cudaSetDevice(ordinal);
	if (e != cudaSuccess) {
		rc = st_cuda_err(e, "cudaSetDevice");
		goto fail;
	}
	e = cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking);
	if (e != cudaSuccess) {
		ctx->stream = NULL;
		rc = st_cuda_err(e, "cudaStreamCreate");
		goto fail;
	}
	rc = st_cuda_lt_open(ctx);
	if (rc < 0)
		goto fail;
	e = cudaEventCreate(&ctx->anchor);
	if (e != cudaSuccess) {
		ctx->anchor = NULL;
		rc = st_cuda_err(e, "cudaEventCreate(anchor)");
		goto fail;
	}
	e = cudaEventRecord(ctx->anchor, ctx->stream);
	if (e == cudaSuccess)
		e = cudaEventSynchronize(ctx->anchor);
	if (e != cudaSuccess) {
		rc = st_cuda_err(e, "cudaEventRecord(anchor)");
		goto fail;
	}
	ctx->anchor_ns = st_now_ns();
	*out = ctx;
	return 0;
fail:
	st_cuda_ctx_destroy(ctx);
	return rc;
}

void st_cuda_ctx_destroy(struct st_cuda_ctx *ctx)
{
	if (!ctx)
		return;
	CU_IGNORE(cudaSetDevice(ctx->ordinal));
	if (ctx->stream)
		CU_IGNORE(cudaStreamSynchronize(ctx->stream));
	if (ctx->scratch)
		CU_IGNORE(cudaFree(ctx->scratch));
	st_cuda_lt_close(ctx);
	if (ctx->anchor)
		CU_IGNORE(cudaEventDestroy(ctx->anchor));
	if (ctx->stream)
		CU_IGNORE(cudaStreamDestroy(ctx->stream));
	free(ctx);
}

void st_cuda_ctx_gelu_counts(struct st_cuda_ctx *ctx, uint64_t *fused, uint64_t *unfused)
{
	*fused = ctx->gelu_fused;
	*unfused = ctx->gelu_unfused;
}

/* ---- timers ------------------------------------------------------------------ */

struct st_cuda_timer {
	cudaEvent_t ev[2]; /* start, stop: timing events */
};

int st_cuda_timer_create(struct st_cuda_ctx *ctx, struct st_cuda_timer **out)
{
	struct st_cuda_timer *t;
	cudaError_t e;
	int rc = ctx_enter(ctx); /* an event belongs to the current device */

	*out = NULL;
	if (rc)
		return rc;
	t = (struct st_cuda_timer *)calloc(1, sizeof(*t));
	if (!t)
		return st_error_set(-ENOMEM, "cuda: timer");
	e = cudaEventCreate(&t->ev[0]);
	if (e == cudaSuccess) {
		e = cudaEventCreate(&t->ev[1]);
		if (e != cudaSuccess)
			CU_IGNORE(cudaEventDestroy(t->ev[0]));
	}
	if (e != cudaSuccess) {
		free(t);
		return st_cuda_err(e, "cudaEventCreate(timer)");
	}
	*out = t;
	return 0;
}

void st_cuda_timer_destroy(struct st_cuda_timer *t)
{
	if (!t)
		return;
	CU_IGNORE(cudaEventDestroy(t->ev[0]));
	CU_IGNORE(cudaEventDestroy(t->ev[1]));
	free(t);
}

int st_cuda_timer_mark(struct st_cuda_ctx *ctx, struct st_cuda_timer *t, int stop)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	CU_CHECK(cudaEventRecord(t->ev[stop ? 1 : 0], ctx->stream), "cudaEventRecord(timer)");
	return 0;
}

int st_cuda_timer_read(struct st_cuda_ctx *ctx, struct st_cuda_timer *t, uint64_t *t0_ns,
		       uint64_t *t1_ns)
{
	float from_anchor_ms = 0, span_ms = 0;
	cudaError_t e = cudaEventQuery(t->ev[1]);

	if (e == cudaErrorNotReady) {
		cudaGetLastError(); /* not an error: leave nothing for the next check */
		return 0;
	}
	if (e != cudaSuccess)
		return st_cuda_err(e, "cudaEventQuery(timer)");
	/* the span from its own pair (microsecond-exact); where it starts from
	 * the anchor, which st_cuda_sync() moves now and then, so a span may
	 * start before it (a negative offset) */
	CU_CHECK(cudaEventElapsedTime(&span_ms, t->ev[0], t->ev[1]), "cudaEventElapsedTime");
	CU_CHECK(cudaEventElapsedTime(&from_anchor_ms, ctx->anchor, t->ev[0]),
		 "cudaEventElapsedTime(anchor)");
	*t0_ns = (uint64_t)((int64_t)ctx->anchor_ns + (int64_t)((double)from_anchor_ms * 1e6));
	*t1_ns = *t0_ns + (uint64_t)((double)(span_ms > 0 ? span_ms : 0) * 1e6);
	return 1;
}

int st_cuda_sync(struct st_cuda_ctx *ctx)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	CU_CHECK(cudaStreamSynchronize(ctx->stream), "cudaStreamSynchronize");
	/* The timers' anchor again, now and then, while the stream is idle: an
	 * offset from it is a float of milliseconds, microsecond-exact only
	 * for a minute or so. */
	if (st_now_ns() - ctx->anchor_ns > 30ull * 1000 * 1000 * 1000) {
		CU_CHECK(cudaEventRecord(ctx->anchor, ctx->stream), "cudaEventRecord(anchor)");
		CU_CHECK(cudaEventSynchronize(ctx->anchor), "cudaEventSynchronize(anchor)");
		ctx->anchor_ns = st_now_ns();
	}
	return 0;
}

int st_cuda_alloc(void **ptr, size_t bytes)
{
	*ptr = NULL;
	if (bytes == 0)
		return 0;
	CU_CHECK(cudaMalloc(ptr, bytes), "cudaMalloc");
	return 0;
}

void st_cuda_free(void *ptr)
{
	if (ptr && cudaFree(ptr) != cudaSuccess)
		cudaGetLastError();
}

/* The copies and memset run on the legacy stream, which does not order
 * against the contexts' non-blocking streams: wait for the whole device
 * before and after, so these helpers never race queued ops. */
int st_cuda_h2d(void *dst, const void *src, size_t bytes)
{
	if (bytes == 0)
		return 0;
	CU_CHECK(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
	CU_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy(h2d)");
	CU_CHECK(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
	return 0;
}

int st_cuda_d2h(void *dst, const void *src, size_t bytes)
{
	if (bytes == 0)
		return 0;
	CU_CHECK(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
	CU_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy(d2h)");
	return 0;
}

int st_cuda_memset(void *ptr, int value, size_t bytes)
{
	if (bytes == 0)
		return 0;
	CU_CHECK(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
	CU_CHECK(cudaMemset(ptr, value, bytes), "cudaMemset");
	CU_CHECK(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
	return 0;
}

int st_cuda_memset_async(struct st_cuda_ctx *ctx, void *ptr, int value, size_t bytes)
{
	int rc = ctx_enter(ctx);
	if (rc || bytes == 0)
		return rc;
	CU_CHECK(cudaMemsetAsync(ptr, value, bytes, ctx->stream), "cudaMemsetAsync");
	return 0;
}

int st_cuda_memcpy_async(struct st_cuda_ctx *ctx, void *dst, const void *src, size_t bytes)
{
	int rc = ctx_enter(ctx);
	if (rc || bytes == 0)
		return rc;
	CU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ctx->stream),
		 "cudaMemcpyAsync");
	return 0;
}

} /* extern "C" */

/* ---- order with the cuda device's queues (the events of strata/device.h) ---- */

extern "C" int st_cuda_ctx_record(struct st_cuda_ctx *ctx, struct st_event *e)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	CU_CHECK(cudaEventRecord(st_cuda_event_of(e), st_cuda_ctx_stream(ctx)), "cudaEventRecord(compute)");
	return 0;
}

extern "C" int st_cuda_ctx_wait(struct st_cuda_ctx *ctx, struct st_event *e)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	CU_CHECK(cudaStreamWaitEvent(st_cuda_ctx_stream(ctx), st_cuda_event_of(e), 0),
		 "cudaStreamWaitEvent(compute)");
	return 0;
}

/* The cuda device: one cudaMalloc'd arena up to the budget, CUDA streams as
 * queues, CUDA events as events. Every CUDA status is checked and turned
 * into -errno at this boundary; the native message is kept as the last
 * error (st_error_last). Without a GPU or driver, open returns -ENODEV. */
#include <cuda_runtime.h>

#include "device_cuda.h"

#include <errno.h>
#include <stdlib.h>

extern "C" {
#include "strata/device.h"
}

struct st_queue {
	cudaStream_t stream;
};

struct st_event {
	cudaEvent_t ev;
};

struct cuda_priv {
	int ordinal;
	void *arena;
	size_t arena_bytes;
	int numa_node;
};

int st_cuda_err(cudaError_t e, const char *what)
{
	int err;

	switch (e) {
	case cudaErrorMemoryAllocation: err = -ENOMEM; break;
	case cudaErrorNoDevice:
	case cudaErrorInsufficientDriver:
	case cudaErrorInvalidDevice: err = -ENODEV; break;
	case cudaErrorInvalidValue:
	case cudaErrorInvalidConfiguration: err = -EINVAL; break;
	default: err = -EIO; break;
	}
	cudaGetLastError(); /* clear the non-sticky error state */
	return st_error_set(err, "cuda: %s: %s (%s)", what, cudaGetErrorString(e),
			    cudaGetErrorName(e));
}

/* Every entry point that makes or queues on something of the device
 * starts here: streams, events, launches and the arena belong to the
 * calling thread's current device, which another device (or a library)
 * may have changed. */
static int dev_enter(struct st_device *d)
{
	CU_CHECK(cudaSetDevice(((struct cuda_priv *)st_device_priv(d))->ordinal), "cudaSetDevice");
	return 0;
}

static int cuda_open(struct st_device *d, struct st_device_config *cfg)
{
	struct cuda_priv *p = (struct cuda_priv *)st_device_priv(d);
	int count = 0;
	size_t free_bytes = 0, total_bytes = 0;
	char busid[32];

	cudaError_t e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess) { /* no driver, an old driver, no device */
		cudaGetLastError();
		return st_error_set(-ENODEV, "cuda: no usable GPU: %s (%s)", cudaGetErrorString(e),
				    cudaGetErrorName(e));
	}
	if (cfg->ordinal < 0 || cfg->ordinal >= count)
		return st_error_set(-ENODEV, "cuda: no GPU %d (%d present)",
				    cfg->ordinal, count);
	p->ordinal = cfg->ordinal;
	CU_CHECK(cudaSetDevice(p->ordinal), "cudaSetDevice");
	CU_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
	if (cfg->mem_bytes == 0) /* default: most of what is free */
		cfg->mem_bytes = (uint64_t)(free_bytes / 10 * 9);
	cfg->mem_bytes = st_align_up(cfg->mem_bytes, ST_PAGE_BYTES);
	if (cfg->mem_bytes > free_bytes)
		return st_error_set(-ENOMEM,
				    "cuda: budget %llu bytes exceeds the %llu free on GPU %d",
				    (unsigned long long)cfg->mem_bytes,
				    (unsigned long long)free_bytes, p->ordinal);
	CU_CHECK(cudaMalloc(&p->arena, cfg->mem_bytes), "cudaMalloc(arena)");
	p->arena_bytes = cfg->mem_bytes;
	p->numa_node = -1;
	if (cudaDeviceGetPCIBusId(busid, sizeof(busid), p->ordinal) == cudaSuccess)
		p->numa_node = st_hwloc_numa_of_pci(busid);
	else /* no NUMA hint: not an error, and nothing left for the next check */
		cudaGetLastError();
	return 0;
}

static void cuda_close(struct st_device *d)
{
	struct cuda_priv *p = (struct cuda_priv *)st_device_priv(d);

	if (p->arena) {
		CU_IGNORE(cudaSetDevice(p->ordinal)); /* its queues and arena, not another's */
		CU_IGNORE(cudaDeviceSynchronize());
		CU_IGNORE(cudaFree(p->arena));
	}
}

static void *cuda_arena_base(struct st_device *d)
{
	return ((struct cuda_priv *)st_device_priv(d))->arena;
}

static int cuda_queue_create(struct st_device *d, struct st_queue **out)
{
	int rc = dev_enter(d); /* a stream belongs to the current device */
	if (rc)
		return rc;
	struct st_queue *q = (struct st_queue *)calloc(1, sizeof(*q));

	if (!q)
		return -ENOMEM;
	cudaError_t e = cudaStreamCreateWithFlags(&q->stream, cudaStreamNonBlocking);
	if (e != cudaSuccess) {
		free(q);
		return st_cuda_err(e, "cudaStreamCreate");
	}
	*out = q;
	return 0;
}

static void cuda_queue_destroy(struct st_device *d, struct st_queue *q)
{
	CU_IGNORE(cudaSetDevice(((struct cuda_priv *)st_device_priv(d))->ordinal));
	CU_IGNORE(cudaStreamSynchronize(q->stream));
	CU_IGNORE(cudaStreamDestroy(q->stream));
	free(q);
}

static int cuda_event_create(struct st_device *d, struct st_event **out)
{
	int rc = dev_enter(d); /* an event belongs to the current device */
	if (rc)
		return rc;
	struct st_event *ev = (struct st_event *)calloc(1, sizeof(*ev));

	if (!ev)
		return -ENOMEM;
	cudaError_t e = cudaEventCreateWithFlags(&ev->ev, cudaEventDisableTiming);
	if (e != cudaSuccess) {
		free(ev);
		return st_cuda_err(e, "cudaEventCreate");
	}
	*out = ev;
	return 0;
}

static void cuda_event_destroy(struct st_device *d, struct st_event *e)
{
	ST_UNUSED(d);
	CU_IGNORE(cudaEventDestroy(e->ev));
	free(e);
}

static int cuda_memcpy_async(struct st_device *d, struct st_queue *q, void *dst,
			     const void *src, size_t bytes, enum st_copy_dir dir)
{
	static const cudaMemcpyKind kinds[] = { cudaMemcpyHostToDevice,
						cudaMemcpyDeviceToHost,
						cudaMemcpyDeviceToDevice };
	int rc = dev_enter(d);
	if (rc)
		return rc;
	CU_CHECK(cudaMemcpyAsync(dst, src, bytes, kinds[dir], q->stream),
		 "cudaMemcpyAsync");
	return 0;
}

struct host_fn_box {
	st_host_fn fn;
	void *arg;
};

static void CUDART_CB cuda_host_trampoline(void *p)
{
	struct host_fn_box *b = (struct host_fn_box *)p;

	b->fn(b->arg);
	free(b);
}

static int cuda_host_fn(struct st_device *d, struct st_queue *q, st_host_fn fn,
			void *arg)
{
	int rc = dev_enter(d);
	if (rc)
		return rc;
	struct host_fn_box *b = (struct host_fn_box *)malloc(sizeof(*b));

	if (!b)
		return -ENOMEM;
	b->fn = fn;
	b->arg = arg;
	cudaError_t e = cudaLaunchHostFunc(q->stream, cuda_host_trampoline, b);
	if (e != cudaSuccess) {
		free(b);
		return st_cuda_err(e, "cudaLaunchHostFunc");
	}
	return 0;
}

static int cuda_event_record(struct st_device *d, struct st_event *e,
			     struct st_queue *q)
{
	int rc = dev_enter(d);
	if (rc)
		return rc;
	CU_CHECK(cudaEventRecord(e->ev, q->stream), "cudaEventRecord");
	return 0;
}

static int cuda_event_query(struct st_device *d, struct st_event *e)
{
	ST_UNUSED(d);
	cudaError_t r = cudaEventQuery(e->ev);

	if (r == cudaSuccess)
		return 1;
	if (r == cudaErrorNotReady) {
		cudaGetLastError();
		return 0;
	}
	return st_cuda_err(r, "cudaEventQuery");
}

static int cuda_event_sync(struct st_device *d, struct st_event *e)
{
	ST_UNUSED(d);
	CU_CHECK(cudaEventSynchronize(e->ev), "cudaEventSynchronize");
	return 0;
}

static int cuda_queue_wait(struct st_device *d, struct st_queue *q,
			   struct st_event *e)
{
	int rc = dev_enter(d);
	if (rc)
		return rc;
	CU_CHECK(cudaStreamWaitEvent(q->stream, e->ev, 0), "cudaStreamWaitEvent");
	return 0;
}

static int cuda_queue_sync(struct st_device *d, struct st_queue *q)
{
	ST_UNUSED(d);
	CU_CHECK(cudaStreamSynchronize(q->stream), "cudaStreamSynchronize");
	return 0;
}

static int cuda_pin_host(struct st_device *d, void *ptr, size_t bytes)
{
	int rc = dev_enter(d); /* the runtime's context for the registration */
	if (rc)
		return rc;
	CU_CHECK(cudaHostRegister(ptr, bytes, cudaHostRegisterPortable),
		 "cudaHostRegister");
	return 0;
}

static void cuda_unpin_host(struct st_device *d, void *ptr)
{
	ST_UNUSED(d);
	CU_IGNORE(cudaHostUnregister(ptr));
}

static int cuda_numa_node(struct st_device *d)
{
	return ((struct cuda_priv *)st_device_priv(d))->numa_node;
}

static struct st_device_ops cuda_ops_init(void)
{
	struct st_device_ops o = {};

	o.name = "cuda";
	o.caps = ST_DEVICE_CAP_HOST_PINNED;
	o.priv_bytes = sizeof(struct cuda_priv);
	o.open = cuda_open;
	o.close = cuda_close;
	o.arena_base = cuda_arena_base;
	o.queue_create = cuda_queue_create;
	o.queue_destroy = cuda_queue_destroy;
	o.event_create = cuda_event_create;
	o.event_destroy = cuda_event_destroy;
	o.memcpy_async = cuda_memcpy_async;
	o.host_fn = cuda_host_fn;
	o.event_record = cuda_event_record;
	o.event_query = cuda_event_query;
	o.event_sync = cuda_event_sync;
	o.queue_wait = cuda_queue_wait;
	o.queue_sync = cuda_queue_sync;
	o.pin_host = cuda_pin_host;
	o.unpin_host = cuda_unpin_host;
	o.numa_node = cuda_numa_node;
	return o;
}

/* C++ has no designated initialisers for out-of-order fields before C++20;
 * build the table once with a helper instead. */
extern "C" const struct st_device_ops st_device_cuda_ops = cuda_ops_init();

/* ---- the event behind an event, for the cuda context's record and wait
 * (src/backend/kernels/cuda/context.cu) ---------------------------------------- */

cudaEvent_t st_cuda_event_of(struct st_event *e)
{
	return e->ev;
}

/* ---- the stream behind a queue, for the nccl comm backend (src/comm/nccl.c:
 * its collectives go on the comm's own queue) --------------------------------- */

extern "C" cudaStream_t st_cuda_queue_stream(struct st_queue *q)
{
	return q->stream;
}

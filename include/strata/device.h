/* strata: the compute device seam.
 *
 * A device owns a budgeted memory arena ("vram"), asynchronous queues and
 * events, as a CUDA GPU does. Two devices exist:
 *   cpu   - vram is a separate host arena; every queue is a worker thread
 *           that runs copies and host functions in submission order; events
 *           are sequence numbers on a queue. It behaves like a GPU stream so
 *           the scheduler's asynchrony is exercised on machines with no GPU.
 *   cpu-strict - the cpu device with a GPU's address space: its arena is
 *           handed out at tagged addresses that fault when the host
 *           touches them; only its copies and the queued cpu compute
 *           translate them (docs/gpu.md, "Strict mode"). Not unified.
 *   cuda  - cudaMalloc'd arena, CUDA streams and events (built when nvcc is
 *           found; opening it without a GPU returns -ENODEV).
 *
 * Lifetimes: queues and events belong to their creator and are destroyed
 * before their device; an event must not be used after the queue it was
 * recorded on is destroyed (the cpu device's events point at their queue).
 *
 * The core never calls d->ops->hook directly: it calls the st_device_*()
 * wrappers below, which assert arguments and keep the stats.
 * All functions return 0 or -errno; details go to st_error_last(). */
#ifndef STRATA_DEVICE_H
#define STRATA_DEVICE_H

#include "strata/common.h"

#include <stdbool.h>

struct st_device;
struct st_queue;
struct st_event;

enum st_copy_dir {
	ST_COPY_H2D, /* host buffer -> device arena */
	ST_COPY_D2H, /* device arena -> host buffer */
	ST_COPY_D2D,
};

#define ST_DEVICE_CAP_HOST_PINNED (1u << 0) /* pin_host/unpin_host do real work */
#define ST_DEVICE_CAP_UNIFIED (1u << 1)     /* device pointers are host-dereferenceable */

struct st_device_config {
	uint64_t mem_bytes; /* arena budget; 0 = device default (cpu: 256 MiB) */
	int ordinal;        /* which GPU; ignored by cpu */
};

typedef void (*st_host_fn)(void *arg);

struct st_device_ops {
	const char *name; /* Required. "cpu", "cuda". */
	unsigned caps;    /* ST_DEVICE_CAP_* */
	size_t priv_bytes; /* Size of the private state the core allocates. */

	/* Required. Reserve the arena of cfg->mem_bytes (and write back the
	 * size chosen when it was 0). -ENODEV when the
	 * hardware is absent, -ENOMEM when the arena cannot be taken. */
	int (*open)(struct st_device *d, struct st_device_config *cfg);
	/* Required. Drain all queues and release everything. */
	void (*close)(struct st_device *d);
	/* Required. Base address of the arena (device pointer) and its size. */
	void *(*arena_base)(struct st_device *d);

	/* Required. Queues and events (streams and events in CUDA). */
	int (*queue_create)(struct st_device *d, struct st_queue **out);
	void (*queue_destroy)(struct st_device *d, struct st_queue *q);
	int (*event_create)(struct st_device *d, struct st_event **out);
	void (*event_destroy)(struct st_device *d, struct st_event *e);
	/* Required. Enqueue an asynchronous copy of bytes. */
	int (*memcpy_async)(struct st_device *d, struct st_queue *q, void *dst,
			    const void *src, size_t bytes, enum st_copy_dir dir);
	/* Required. Enqueue a host function that runs in queue order. */
	int (*host_fn)(struct st_device *d, struct st_queue *q, st_host_fn fn,
		       void *arg);
	/* Required. Mark the event at the current end of queue q. */
	int (*event_record)(struct st_device *d, struct st_event *e,
			    struct st_queue *q);
	/* Required. 1 when done, 0 when pending, -errno when the work failed. */
	int (*event_query)(struct st_device *d, struct st_event *e);
	/* Required. Block until the event is done; 0 or -errno. */
	int (*event_sync)(struct st_device *d, struct st_event *e);
	/* Required. Work queued on q after this waits for e. */
	int (*queue_wait)(struct st_device *d, struct st_queue *q,
			  struct st_event *e);
	/* Required. Block until everything queued on q has run. */
	int (*queue_sync)(struct st_device *d, struct st_queue *q);

	/* Optional. Page-lock host memory for fast async copies
	 * (cudaHostRegister). Absent: host memory is used as it is. */
	int (*pin_host)(struct st_device *d, void *p, size_t bytes);
	void (*unpin_host)(struct st_device *d, void *p);
	/* Optional. hwloc OS index of the NUMA node nearest the device, or -1. */
	int (*numa_node)(struct st_device *d);
};

struct st_device_stats {
	uint64_t arena_bytes;
	uint64_t h2d_bytes, d2h_bytes, d2d_bytes;
	uint64_t copies;
};

/* Devices built into this binary, by name. NULL when unknown or not built. */
const struct st_device_ops *st_device_find(const char *name);
/* Names of built devices, comma-separated ("cpu,cpu-strict,cuda"). */
const char *st_device_list(void);
/* Whether the device called name computes on the host's CPUs: cpu and
 * cpu-strict, and NULL (the default device, cpu). The planner's
 * host_compute. */
bool st_device_on_host(const char *name);

/* What a probe of the GPU found (--device auto, --gpu-mem auto). */
struct st_device_probe {
	bool usable;          /* a GPU the cuda device would open is there and answers */
	uint64_t free_bytes;  /* its free memory, a context made (usable only) */
	uint64_t total_bytes;
	char what[256];       /* its name, or why there is none */
};
typedef void (*st_device_probe_fn)(int ordinal, struct st_device_probe *out);
/* The device --device auto names: "cuda" when cuda_built and probe finds
 * GPU ordinal usable, else "cpu" (probe is not called when !cuda_built).
 * *p gets what the probe found (usable false without one); why[n] the
 * reason ("GPU 0, NVIDIA H100, 79.1 GiB free of 79.6 GiB", "no usable GPU:
 * ...", "built without CUDA ..."). Static. */
const char *st_device_choose(bool cuda_built, st_device_probe_fn probe, int ordinal,
			     struct st_device_probe *p, char *why, size_t n);

/* Open a device of the given ops. *out is owned by the caller and goes back
 * with st_device_destroy(). Returns 0, -ENODEV, -ENOMEM or -EINVAL. */
int st_device_create(const struct st_device_ops *ops,
		     const struct st_device_config *cfg, struct st_device **out);
void st_device_destroy(struct st_device *d);

const char *st_device_name(const struct st_device *d);
/* The GPU the device was opened on (its config's ordinal; 0 for cpu). */
int st_device_ordinal(const struct st_device *d);
void *st_device_priv(struct st_device *d);
/* Arena of the device: base pointer (device address) and size in bytes. */
void *st_device_arena(struct st_device *d, uint64_t *bytes);
bool st_device_unified(const struct st_device *d);
void st_device_get_stats(const struct st_device *d, struct st_device_stats *s);

int st_queue_create(struct st_device *d, struct st_queue **out);
void st_queue_destroy(struct st_device *d, struct st_queue *q);
int st_event_create(struct st_device *d, struct st_event **out);
void st_event_destroy(struct st_device *d, struct st_event *e);

int st_device_memcpy_async(struct st_device *d, struct st_queue *q, void *dst,
			   const void *src, size_t bytes, enum st_copy_dir dir);
int st_device_host_fn(struct st_device *d, struct st_queue *q, st_host_fn fn,
		      void *arg);
int st_event_record(struct st_device *d, struct st_event *e, struct st_queue *q);
int st_event_query(struct st_device *d, struct st_event *e);
int st_event_sync(struct st_device *d, struct st_event *e);
int st_queue_wait(struct st_device *d, struct st_queue *q, struct st_event *e);
int st_queue_sync(struct st_device *d, struct st_queue *q);

/* Pin host memory through the device when it can (no-op returning 0 when
 * the device has no pin hook). */
int st_device_pin_host(struct st_device *d, void *p, size_t bytes);
void st_device_unpin_host(struct st_device *d, void *p);
/* Whether pin_host does real work (CUDA's page-locking). */
bool st_device_can_pin(const struct st_device *d);
/* NUMA node nearest the device, or -1 when unknown. */
int st_device_numa_node(struct st_device *d);

/* hwloc (src/backend/device/numa.c): the NUMA nodes of this machine, those a
 * cgroup or cpuset keeps from this process included (1 when hwloc cannot
 * tell), the node nearest the PCI device "dddd:bb:dd.f" and the node
 * of the CPUs this thread may run on (each -1 when unknown or, for the
 * CPUs, when they span several nodes). OS indices. */
int st_hwloc_numa_count(void);
int st_hwloc_numa_of_pci(const char *busid);
int st_hwloc_numa_of_self(void);

extern const struct st_device_ops st_device_cpu_ops;
extern const struct st_device_ops st_device_cpu_strict_ops;
#ifdef ST_HAVE_CUDA
extern const struct st_device_ops st_device_cuda_ops;
#endif

#endif

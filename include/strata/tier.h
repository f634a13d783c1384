/* strata: the storage tier seam (vram, host, nvme, and the fault wrapper).
 *
 * A tier is a byte store with a hard budget, carved into extents, with an
 * asynchronous I/O protocol in three steps, as in liburing:
 *   prep  - fill a struct st_tier_io (read or write, extent, offset, buffer)
 *   submit- st_tier_submit() queues a batch; it never blocks on I/O
 *   reap  - st_tier_reap() returns completions, each with bytes done or -errno
 * A request is complete only when its whole length moved: the core resubmits
 * the rest of a short transfer itself, so a completion's res is either the
 * full length or a negative errno, never a partial count.
 *
 * Tiers know bytes and extents, nothing about units or states. Each is a
 * static const struct st_tier_ops (fio engine / SQLite VFS style); the core
 * allocates its private state (priv_bytes) and calls hooks only through the
 * wrappers here, which assert, count stats, trace and inject faults.
 * All functions return 0 (or a count) or -errno; the detail of a failure
 * (file, offset, errno) is in st_error_last() and st_tier_error(). */
#ifndef STRATA_TIER_H
#define STRATA_TIER_H

#include "strata/common.h"

#include <stdbool.h>

struct st_tier;
struct st_device;
struct st_event;

enum st_tier_kind { ST_TIER_VRAM, ST_TIER_HOST, ST_TIER_NVME, ST_TIER_WRAP };

enum st_io_op { ST_IO_READ, ST_IO_WRITE };

/* A range of a tier's address space, from st_tier_alloc(). */
struct st_extent {
	uint64_t off_bytes; /* offset in the tier's address space */
	uint64_t len_bytes; /* multiple of the tier's align_bytes */
};

/* One asynchronous request. READ moves extent -> buf, WRITE buf -> extent.
 * buf, ext_off_bytes and len_bytes must be multiples of st_tier_align()
 * (O_DIRECT). The struct is copied at submit; buf is borrowed until the
 * request's completion is reaped. */
struct st_tier_io {
	enum st_io_op op;
	struct st_extent ext;
	uint64_t ext_off_bytes; /* offset inside the extent */
	uint64_t len_bytes;
	void *buf;              /* host memory */
	void *user;             /* returned in the completion */
	/* vram tier only (NULL elsewhere, else -EINVAL): the copy starts
	 * once this event of the tier's device is done -- recorded on another
	 * queue, e.g. the compute's, which keeps running meanwhile (CUDA:
	 * cudaStreamWaitEvent on the copy stream). The event is read at
	 * submit; recording it again later does not affect this request. */
	struct st_event *after;
	/* vram tier only (not through a wrapper: -EINVAL): recorded on the
	 * copy's queue right after the copy, so another queue (the compute's)
	 * can wait for the bytes without the host reaping the completion. */
	struct st_event *done;
};

struct st_tier_cqe {
	void *user;
	int64_t res; /* len_bytes, or -errno */
};

/* Fault injection (tests) lives in one place: the "fault" tier, which
 * wraps a real one (as SQLite's test VFS wraps a file). The engine wraps
 * its nvme tier in it when st_engine_config.nvme_fault asks for anything;
 * strata train reaches it through --test-fault (docs/reliability.md). */
enum st_fault_kind {
	ST_FAULT_NONE,
	ST_FAULT_EIO,    /* the Nth I/O completes with -EIO and moves nothing */
	ST_FAULT_SHORT,  /* the Nth I/O moves only its first half at first */
	ST_FAULT_ENOSPC, /* the Nth alloc or write fails with -ENOSPC */
	ST_FAULT_DELAY,  /* the Nth I/O completes no sooner than delay_ns */
	ST_FAULT_LATE,   /* the Nth I/O, when a read, reaches the inner tier
			    only delay_ns after its submission: its bytes
			    land late (the buffer keeps what it held until
			    then); writes go as they come */
	ST_FAULT_WRITE_LAST, /* the Nth I/O, when a write, waits before the
				inner tier until the caller reaps with nothing
				else in flight there: every request submitted
				after it lands first, so a read of its range
				finds the older bytes (a drive may reorder
				its queue); reads go as they come */
};

/* Corruption of what a write leaves on the inner tier (tests of the
 * checksums that must catch it). The write completes for the caller as
 * asked (res = its length, its buffer untouched), but afterwards the inner
 * tier holds other bytes: those a drive that flips a bit, loses or
 * misdirects a write would leave. The "page" is 4 KiB (or the tier's
 * alignment, when larger) of the tier's address space, cut to the write. */
enum st_corrupt_kind {
	ST_CORRUPT_NONE,
	ST_CORRUPT_BIT,        /* bit `bit` of the byte at `at_bytes` flipped */
	ST_CORRUPT_ZERO_BYTE,  /* the byte at `at_bytes` zeroed; when it is 0
				  already, the first non-zero byte after it in
				  the write (none: nothing changes) */
	ST_CORRUPT_PAGE_FF,    /* the page holding `at_bytes` filled with 0xFF */
	ST_CORRUPT_STALE,      /* the write is lost: its whole range keeps the
				  older bytes (the previous version) */
	ST_CORRUPT_OTHER_PAGE, /* the page holding `at_bytes` gets the bytes of
				  the page at `src_off_bytes` (another extent's,
				  as a misdirected write would leave them) */
};

/* One corruption to do, at the Nth write request (counted from 1, writes
 * only, in submit order, from when it was armed: at open for the config's,
 * at st_tier_fault_arm() for a later one). Done once; a write that an
 * injected EIO or ENOSPC fails is not corrupted: the next write is. */
struct st_fault_corrupt {
	enum st_corrupt_kind kind;
	uint64_t nth_write;     /* 1-based; 0 is taken as 1 */
	uint64_t at_bytes;      /* offset inside the write (its last byte when
				   past it) */
	unsigned bit;           /* ST_CORRUPT_BIT: 0..7 */
	uint64_t src_off_bytes; /* ST_CORRUPT_OTHER_PAGE: an offset in the
				   fault tier's address space, rounded down to
				   a page; the page must lie outside the write */
};

struct st_fault_config {
	enum st_fault_kind kind;
	uint64_t nth;      /* 1-based count of operations (alloc + I/O) */
	uint64_t every;    /* 0: once; else also every `every` ops after nth */
	uint64_t delay_ns; /* ST_FAULT_DELAY, ST_FAULT_LATE */
	struct st_fault_corrupt corrupt; /* armed at open (kind NONE: none) */
};

/* What the fault tier corrupted last: which write (its number since the
 * arming), and the range of the tier's address space whose bytes differ
 * from what was written (len_bytes 0: ST_CORRUPT_ZERO_BYTE found only
 * zeros, nothing changed). */
struct st_fault_corrupted {
	enum st_corrupt_kind kind;
	uint64_t nth_write;
	uint64_t off_bytes;
	uint64_t len_bytes;
};

struct st_tier_config {
	uint64_t budget_bytes;   /* hard limit on bytes allocated; required */
	/* nvme */
	const char *dirs;        /* "DIR" or "DIR1,DIR2,..." striped by block */
	uint64_t block_bytes;    /* request split size; 0 = 1 MiB */
	unsigned queue_depth;    /* requests kept in flight; 0 = 32 */
	bool buffered;           /* force buffered I/O (no O_DIRECT) */
	unsigned short_every;    /* test hook: every Nth block completion is
				    treated as half done (0 = off) */
	/* host */
	struct st_device *device; /* optional: pin through it, NUMA near it */
	/* vram */
	/* (uses device's arena; budget_bytes must fit in it) */
	/* fault wrapper */
	struct st_tier *inner;    /* wrapped tier; borrowed */
	struct st_fault_config fault; /* fault tier: what to inject */
};

/* Registered-buffer hint: buffers the caller will use for I/O. The nvme
 * tier registers them with io_uring (fixed buffers); others ignore it. */
struct st_tier_buffer {
	void *base;
	size_t bytes;
};

struct st_tier_stats {
	uint64_t budget_bytes;
	uint64_t used_bytes;
	uint64_t peak_bytes;
	uint64_t extents;
	uint64_t read_bytes, write_bytes;
	uint64_t reads, writes;   /* requests completed */
	uint64_t errors;          /* requests completed with an error */
	uint64_t resubmits;       /* short transfers completed by resubmission */
	uint64_t busy_ns;         /* wall time with at least one request in flight */
};

/* Hook results: a hook may complete a request short (res < len, >= 0); the
 * core resubmits the remainder. */
struct st_tier_ops {
	const char *name;   /* Required. "host", "nvme", "vram", "fault". */
	enum st_tier_kind kind;
	size_t priv_bytes;  /* Required (may be 0): private state, core-allocated */
	/* Required. Acquire backing for cfg->budget_bytes (pinned region,
	 * preallocated files, device arena). Return the alignment transfers
	 * need in *align_bytes (power of two). */
	int (*open)(struct st_tier *t, const struct st_tier_config *cfg,
		    uint64_t *align_bytes);
	/* Required. Release everything; in-flight I/O has been reaped. */
	void (*close)(struct st_tier *t);
	/* Required. Queue n requests; offsets are already absolute in the
	 * tier's address space (extent offset + ext_off). Returns 0 or -errno;
	 * on error none of the n was queued. */
	int (*submit)(struct st_tier *t, const struct st_tier_io *ios, unsigned n);
	/* Required. Return up to max completions; block until at least
	 * min_wait are available (min_wait <= in-flight). Returns count or
	 * -errno. cqe.user is the pointer given in st_tier_io.user (the core
	 * passes its own tracking record there). */
	int (*reap)(struct st_tier *t, struct st_tier_cqe *out, unsigned max,
		    unsigned min_wait);
	/* Optional. Register I/O buffers (fixed buffers). */
	int (*register_buffers)(struct st_tier *t, const struct st_tier_buffer *b,
				unsigned n);
	void (*unregister_buffers)(struct st_tier *t);
	/* Optional. Address of a byte in the tier's own memory: host memory for
	 * host, a device address for vram. */
	void *(*addr)(struct st_tier *t, uint64_t off_bytes);
	/* Optional. Fault wrapper: called by st_tier_alloc() before the core
	 * allocator; non-zero refuses the allocation with that -errno. */
	int (*alloc_check)(struct st_tier *t, uint64_t bytes);
	/* Optional. Make completed writes durable on the medium (fdatasync);
	 * absent: nothing to do. */
	int (*sync)(struct st_tier *t);
	/* Optional. Human-readable description ("3 dirs, O_DIRECT, qd 32"). */
	const char *(*describe)(struct st_tier *t);
	/* Optional. Where the byte at off_bytes of the tier's address space
	 * lives, for messages: "/mnt/a/strata-1-0-0.swap (unlinked) offset
	 * 1048576" into buf (len bytes). Returns 0 or -errno. */
	int (*where)(struct st_tier *t, uint64_t off_bytes, char *buf, size_t len);
};

/* Tiers built into this binary. */
extern const struct st_tier_ops st_tier_host_ops;
extern const struct st_tier_ops st_tier_nvme_ops;
extern const struct st_tier_ops st_tier_vram_ops;
extern const struct st_tier_ops st_tier_fault_ops;

/* Open a tier. Refuses an ops table without its required hooks (-EINVAL).
 * *out goes back with st_tier_destroy(). Returns 0 or -errno (-ENOSPC when
 * the nvme files cannot be preallocated, -ENOMEM when memory cannot be
 * reserved, -ENOENT/-ENOTDIR for a bad directory). */
int st_tier_create(const struct st_tier_ops *ops,
		   const struct st_tier_config *cfg, struct st_tier **out);
/* Waits for in-flight I/O, then releases everything. NULL is a no-op. */
void st_tier_destroy(struct st_tier *t);

const char *st_tier_name(const struct st_tier *t);
uint64_t st_tier_align(const struct st_tier *t);
void *st_tier_priv(struct st_tier *t);
const char *st_tier_describe(struct st_tier *t);
/* Where byte off_bytes of extent ext lives, for messages: st_tier_where()
 * of its tier offset, or "<tier> offset N" where the tier cannot say; into
 * buf, which it returns. */
const char *st_tier_locate(struct st_tier *t, const struct st_extent *ext,
			   uint64_t off_bytes, char *buf, size_t bytes);

/* Allocate len_bytes (rounded up to align) within the budget. -ENOMEM and
 * nothing allocated when the budget (or fragmentation) does not allow it. */
int st_tier_alloc(struct st_tier *t, uint64_t len_bytes, struct st_extent *ext);
void st_tier_free(struct st_tier *t, const struct st_extent *ext);

int st_tier_register_buffers(struct st_tier *t, const struct st_tier_buffer *b,
			     unsigned n);
void st_tier_unregister_buffers(struct st_tier *t);

/* Queue n requests. Returns 0 or -errno. On error the requests of the
 * failing batch of 32 and after are not queued; earlier ones are (see
 * st_tier_inflight()). A batch of 32 or fewer is all or nothing. */
int st_tier_submit(struct st_tier *t, const struct st_tier_io *ios, unsigned n);
/* Reap up to max completions, waiting for at least min_wait (clamped to the
 * number in flight). Returns the count or -errno. */
int st_tier_reap(struct st_tier *t, struct st_tier_cqe *out, unsigned max,
		 unsigned min_wait);
/* Requests submitted and not yet reaped. */
unsigned st_tier_inflight(const struct st_tier *t);

/* Convenience: submit one request and wait for it. Returns 0 or -errno. */
int st_tier_read_sync(struct st_tier *t, const struct st_extent *ext,
		      uint64_t off_bytes, void *buf, uint64_t len_bytes);
int st_tier_write_sync(struct st_tier *t, const struct st_extent *ext,
		       uint64_t off_bytes, const void *buf, uint64_t len_bytes);

/* Flush completed writes to the medium (nvme: fdatasync of every file), so
 * what follows is not slowed by the drive's write-back. 0 or -errno. */
int st_tier_sync(struct st_tier *t);

/* Address of an extent's first byte when the tier is memory (host: a host
 * pointer; vram: a device pointer), else NULL (nvme). */
void *st_tier_addr(struct st_tier *t, const struct st_extent *ext);

void st_tier_get_stats(const struct st_tier *t, struct st_tier_stats *s);
void st_tier_reset_peak(struct st_tier *t);

/* The detail of this tier's last failed request ("nvme: read
 * /mnt/a/strata-0.swap offset 1048576: Input/output error"), or "". */
const char *st_tier_error(const struct st_tier *t);

/* Where the byte at off_bytes of t's address space lives, for messages
 * (the nvme tier: its file and the offset in it; a fault tier: its inner
 * tier's answer). Returns 0 with buf filled, -ENOTSUP when t cannot say. */
int st_tier_where(struct st_tier *t, uint64_t off_bytes, char *buf, size_t len);

/* Arm a corruption on the fault tier t (st_tier_fault_ops), replacing one
 * armed and not yet done; c->kind ST_CORRUPT_NONE disarms. nth_write
 * counts the writes submitted after this call. Not to be called while
 * another thread submits to t. Returns 0; -EINVAL when t is not a fault
 * tier, or for a bad kind, a bit past 7, an ST_CORRUPT_OTHER_PAGE source
 * page outside the tier. */
int st_tier_fault_arm(struct st_tier *t, const struct st_fault_corrupt *c);

/* How many corruptions the fault tier t has done (0, 1, ...), with the
 * last one in *out when there was one (out may be NULL); -EINVAL when t is
 * not a fault tier. A corruption counts once its write is submitted. */
int st_tier_fault_corrupted(const struct st_tier *t, struct st_fault_corrupted *out);

/* Tracing hook: called on submit and completion of every request. */
enum st_trace_phase { ST_TRACE_SUBMIT, ST_TRACE_COMPLETE };
typedef void (*st_tier_trace_fn)(void *ctx, const struct st_tier *t,
				 enum st_trace_phase ph, enum st_io_op op,
				 uint64_t off_bytes, uint64_t len_bytes,
				 int64_t res);
void st_tier_set_trace(struct st_tier *t, st_tier_trace_fn fn, void *ctx);

#endif

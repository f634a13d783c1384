/* The host tier: one pinned region of the budget, on the NUMA node nearest
 * the device, carved by the core's allocator.
 *
 * Pinning: through the device when it can (cudaHostRegister of the
 * hwloc-bound mapping); otherwise mlock, raising RLIMIT_MEMLOCK's soft limit
 * up to the hard one first. When neither works the memory stays pageable and
 * one warning says so: slower copies, same numbers.
 * Reads and writes are memcpy between the region and the caller's buffer,
 * done at submit and reported at reap, so the protocol is the same as for
 * the asynchronous tiers. */
#include "tier_impl.h"
#include "strata/device.h"

#include <errno.h>
#include <hwloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#define HOST_CQ_SLOTS 256u

#define HOST_HUGE_BYTES (2u << 20)

struct host_priv {
	void *map;          /* the mapping (base rounded up to 2 MiB is in it) */
	uint64_t map_bytes; /* the budget in whole huge pages, plus one to align */
	uint64_t used_map_bytes; /* from base: the budget in whole huge pages */
	char *base;
	uint64_t bytes;
	struct st_device *device; /* borrowed; pinned through it when set */
	bool pinned_by_device, locked;
	int numa_node;
	/* completions done at submit, waiting to be reaped: a ring that grows */
	struct st_tier_cqe *cq;
	unsigned cq_cap, cq_head, cq_len;
	char desc[160];
};

static bool host_warned_pageable;

/* Bind [p, p+bytes) to NUMA node `node` (OS index). Best effort. */
static void host_bind_numa(void *p, uint64_t bytes, int node)
{
	hwloc_topology_t topo;
	hwloc_bitmap_t set;

	if (node < 0 || hwloc_topology_init(&topo) < 0)
		return;
	set = hwloc_bitmap_alloc();
	if (set && hwloc_topology_load(topo) == 0) {
		hwloc_bitmap_only(set, (unsigned)node);
		hwloc_set_area_membind(topo, p, bytes, set, HWLOC_MEMBIND_BIND,
				       HWLOC_MEMBIND_BYNODESET);
	}
	hwloc_bitmap_free(set);
	hwloc_topology_destroy(topo);
}

static bool host_mlock(void *p, uint64_t bytes)
{
	struct rlimit rl;

	if (mlock(p, bytes) == 0)
		return true;
	if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_MEMLOCK, &rl) == 0 && mlock(p, bytes) == 0)
			return true;
	}
	return false;
}

static int host_open(struct st_tier *t, const struct st_tier_config *cfg,
		     uint64_t *align_bytes)
{
	struct host_priv *h = st_tier_priv(t);
	void *p;

	h->bytes = cfg->budget_bytes;
	h->device = cfg->device;
	/* Huge pages: a transfer from 2 MiB pages is a handful of segments,
	 * not hundreds. On this project's virtio disk 1 MiB O_DIRECT reads at
	 * depth ran 2.7x faster from them (docs/nvme-bench.md); DMA to a GPU
	 * likes them too. Map 2 MiB more to align the start, then ask for the
	 * budget in whole huge pages, so its last part (or a budget under 2 MiB)
	 * is not left on 4 KiB pages. NUMA binding, locking and pinning cover
	 * the same whole pages: one that covered less would split the mapping
	 * there, and a huge page needs all of its 2 MiB in one mapping. */
	h->used_map_bytes = st_align_up(h->bytes, (uint64_t)HOST_HUGE_BYTES);
	h->map_bytes = h->used_map_bytes + HOST_HUGE_BYTES;
	p = mmap(NULL, h->map_bytes, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return st_error_set(-ENOMEM, "host tier: cannot map %llu bytes",
				    (unsigned long long)h->bytes);
	h->map = p;
	p = (void *)st_align_up((uintptr_t)p, HOST_HUGE_BYTES);
	madvise(p, h->used_map_bytes, MADV_HUGEPAGE); /* advice: fine if refused */
	h->base = p;
	h->numa_node = h->device ? st_device_numa_node(h->device) : -1;
	if (h->numa_node < 0)
		h->numa_node = st_hwloc_numa_of_self();
	host_bind_numa(p, h->used_map_bytes, h->numa_node);

	if (h->device && st_device_can_pin(h->device) &&
	    st_device_pin_host(h->device, p, h->used_map_bytes) == 0) {
		h->pinned_by_device = true;
	} else if (host_mlock(p, h->used_map_bytes)) {
		h->locked = true;
	} else if (!host_warned_pageable) {
		host_warned_pageable = true;
		st_warn("host tier: cannot lock %llu bytes in memory (RLIMIT_MEMLOCK); "
			"using pageable memory, copies will be slower",
			(unsigned long long)h->bytes);
	}
	h->cq_cap = HOST_CQ_SLOTS;
	h->cq = malloc(h->cq_cap * sizeof(*h->cq));
	if (!h->cq) {
		munmap(h->map, h->map_bytes);
		return -ENOMEM;
	}
	*align_bytes = 64; /* cache line: any buffer a caller has will do */
	return 0;
}

static void host_close(struct st_tier *t)
{
	struct host_priv *h = st_tier_priv(t);

	if (h->pinned_by_device)
		st_device_unpin_host(h->device, h->base);
	if (h->locked)
		munlock(h->base, h->used_map_bytes);
	munmap(h->map, h->map_bytes);
	free(h->cq);
}

/* Grow the completion ring so n more fit; 0 or -ENOMEM. */
static int host_cq_reserve(struct host_priv *h, unsigned n)
{
	unsigned ncap = h->cq_cap;
	struct st_tier_cqe *q;

	while (ncap - h->cq_len < n)
		ncap *= 2;
	if (ncap == h->cq_cap)
		return 0;
	q = malloc(ncap * sizeof(*q));
	if (!q)
		return -ENOMEM;
	for (unsigned i = 0; i < h->cq_len; i++)
		q[i] = h->cq[(h->cq_head + i) % h->cq_cap];
	free(h->cq);
	h->cq = q;
	h->cq_cap = ncap;
	h->cq_head = 0;
	return 0;
}

static int host_submit(struct st_tier *t, const struct st_tier_io *ios, unsigned n)
{
	struct host_priv *h = st_tier_priv(t);
	int ret = host_cq_reserve(h, n); /* first, so a failure queues nothing */

	if (ret < 0)
		return ret;
	for (unsigned i = 0; i < n; i++) {
		const struct st_tier_io *io = &ios[i];
		char *p = h->base + io->ext_off_bytes;

		if (io->op == ST_IO_READ)
			memcpy(io->buf, p, io->len_bytes);
		else
			memcpy(p, io->buf, io->len_bytes);
		h->cq[(h->cq_head + h->cq_len) % h->cq_cap] =
			(struct st_tier_cqe){ io->user, (int64_t)io->len_bytes };
		h->cq_len++;
	}
	return 0;
}

static int host_reap(struct st_tier *t, struct st_tier_cqe *out, unsigned max,
		     unsigned min_wait)
{
	struct host_priv *h = st_tier_priv(t);
	unsigned n = 0;

	ST_UNUSED(min_wait); /* everything submitted is already complete */
	while (n < max && h->cq_len) {
		out[n++] = h->cq[h->cq_head];
		h->cq_head = (h->cq_head + 1) % h->cq_cap;
		h->cq_len--;
	}
	return (int)n;
}

static void *host_addr(struct st_tier *t, uint64_t off_bytes)
{
	struct host_priv *h = st_tier_priv(t);

	return h->base + off_bytes;
}

static const char *host_describe(struct st_tier *t)
{
	struct host_priv *h = st_tier_priv(t);
	char b[32];

	snprintf(h->desc, sizeof(h->desc), "host, %s, %s, NUMA node %d",
		 st_format_bytes(h->bytes, b, sizeof(b)),
		 h->pinned_by_device ? "pinned by the device" :
		 h->locked ? "mlocked" : "pageable", h->numa_node);
	return h->desc;
}

const struct st_tier_ops st_tier_host_ops = {
	.name = "host",
	.kind = ST_TIER_HOST,
	.priv_bytes = sizeof(struct host_priv),
	.open = host_open,
	.close = host_close,
	.submit = host_submit,
	.reap = host_reap,
	.addr = host_addr,
	.describe = host_describe,
	/* register_buffers, alloc_check: optional, absent */
};

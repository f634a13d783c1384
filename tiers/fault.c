/* The fault tier: wraps a real tier and, at the Nth operation (allocs and
 * I/O requests, counted from 1), injects EIO, a short transfer, ENOSPC or a
 * delay. Tests build every failure path of the engine on it.
 *
 * It takes one extent of its budget from the inner tier at open and maps its
 * own address space onto it. A short transfer forwards only the first half
 * and reports that count, so the core must resubmit the rest. */
#include "tier_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct fault_held {        /* a completion held back (EIO now, or delayed) */
	void *user;
	int64_t res;
	uint64_t due_ns;
};

struct fault_priv {
	struct st_tier *inner; /* borrowed */
	struct st_extent ext;  /* our whole space inside inner */
	struct st_fault_config f;
	uint64_t ops;          /* operations seen */
	void *delay_user;      /* the delayed request, while in inner */
	uint64_t delay_due_ns;
	struct fault_held *held;
	unsigned nheld, cap;
	unsigned inner_inflight;
};

static bool fault_hit(struct fault_priv *p)
{
	uint64_t n = ++p->ops;

	if (p->f.kind == ST_FAULT_NONE || n < p->f.nth)
		return false;
	if (n == p->f.nth)
		return true;
	return p->f.every && (n - p->f.nth) % p->f.every == 0;
}

static int fault_open(struct st_tier *t, const struct st_tier_config *cfg,
		      uint64_t *align_bytes)
{
	struct fault_priv *p = st_tier_priv(t);
	int ret;

	if (!cfg->inner)
		return st_error_set(-EINVAL, "fault tier: no inner tier");
	p->inner = cfg->inner;
	p->f = cfg->fault;
	ret = st_tier_alloc(p->inner, cfg->budget_bytes, &p->ext);
	if (ret < 0)
		return ret;
	*align_bytes = st_tier_align(p->inner);
	return 0;
}

static void fault_close(struct st_tier *t)
{
	struct fault_priv *p = st_tier_priv(t);

	while (st_tier_inflight(p->inner)) {
		struct st_tier_cqe c[8];

		if (st_tier_reap(p->inner, c, 8, 1) < 0)
			break;
	}
	st_tier_free(p->inner, &p->ext);
	free(p->held);
}

static int fault_alloc_check(struct st_tier *t, uint64_t bytes)
{
	struct fault_priv *p = st_tier_priv(t);

	ST_UNUSED(bytes);
	if (fault_hit(p) && p->f.kind == ST_FAULT_ENOSPC)
		return st_tier_set_error(t, -ENOSPC, "fault: injected ENOSPC at alloc #%llu",
					 (unsigned long long)p->ops);
	return 0;
}

static int fault_hold(struct fault_priv *p, void *user, int64_t res, uint64_t due_ns)
{
	if (p->nheld == p->cap) {
		unsigned cap = p->cap ? 2 * p->cap : 16;
		struct fault_held *h = realloc(p->held, cap * sizeof(*h));

		if (!h)
			return -ENOMEM;
		p->held = h;
		p->cap = cap;
	}
	p->held[p->nheld++] = (struct fault_held){ user, res, due_ns };
	return 0;
}

static int fault_submit(struct st_tier *t, const struct st_tier_io *ios, unsigned n)
{
	struct fault_priv *p = st_tier_priv(t);

	for (unsigned i = 0; i < n; i++) {
		struct st_tier_io io = ios[i];
		uint64_t off = io.ext_off_bytes;
		int ret;

		io.ext = p->ext;
		if (fault_hit(p)) {
			const char *what = io.op == ST_IO_READ ? "read" : "write";

			switch (p->f.kind) {
			case ST_FAULT_EIO:
				st_tier_set_error(t, -EIO, "fault: injected EIO on %s at offset %llu",
						  what, (unsigned long long)off);
				ret = fault_hold(p, io.user, -EIO, 0);
				if (ret < 0)
					return ret;
				continue;
			case ST_FAULT_ENOSPC:
				if (io.op != ST_IO_WRITE)
					break;
				st_tier_set_error(t, -ENOSPC,
						  "fault: injected ENOSPC on write at offset %llu",
						  (unsigned long long)off);
				ret = fault_hold(p, io.user, -ENOSPC, 0);
				if (ret < 0)
					return ret;
				continue;
			case ST_FAULT_SHORT: {
				uint64_t half = (io.len_bytes / 2) & ~(st_tier_align(t) - 1);

				if (half)
					io.len_bytes = half;
				break;
			}
			case ST_FAULT_DELAY:
				/* One delayed request at a time is all the tests need. */
				if (!p->delay_user) {
					p->delay_user = io.user;
					p->delay_due_ns = st_now_ns() + p->f.delay_ns;
				}
				break;
			case ST_FAULT_NONE:
				break;
			}
		}
		ret = st_tier_submit(p->inner, &io, 1);
		if (ret < 0)
			return ret;
		p->inner_inflight++;
	}
	return 0;
}

static int fault_reap(struct st_tier *t, struct st_tier_cqe *out, unsigned max,
		      unsigned min_wait)
{
	struct fault_priv *p = st_tier_priv(t);
	unsigned got = 0;

	for (;;) {
		uint64_t now = st_now_ns(), next_due = 0;
		unsigned kept = 0;

		for (unsigned i = 0; i < p->nheld; i++) {
			if (got < max && p->held[i].due_ns <= now) {
				out[got++] = (struct st_tier_cqe){ p->held[i].user, p->held[i].res };
			} else {
				if (!next_due || p->held[i].due_ns < next_due)
					next_due = p->held[i].due_ns;
				p->held[kept++] = p->held[i];
			}
		}
		p->nheld = kept;
		if (got < max && p->inner_inflight) {
			struct st_tier_cqe c[16];
			unsigned want = ST_MIN(max - got, 16u);
			bool block = got < min_wait && !p->nheld;
			int n = st_tier_reap(p->inner, c, want, block ? 1 : 0);

			if (n < 0)
				return n;
			for (int i = 0; i < n; i++) {
				p->inner_inflight--;
				if (c[i].user == p->delay_user && p->delay_user) {
					p->delay_user = NULL;
					if (fault_hold(p, c[i].user, c[i].res, p->delay_due_ns) < 0)
						return -ENOMEM;
					if (!next_due || p->delay_due_ns < next_due)
						next_due = p->delay_due_ns;
					continue;
				}
				out[got++] = c[i];
			}
		}
		if (got >= min_wait || got == max || (!p->inner_inflight && !p->nheld))
			return (int)got;
		if (p->nheld && next_due > st_now_ns()) {
			uint64_t ns = ST_MIN(next_due - st_now_ns(), 1000000ull);
			struct timespec ts = { 0, (long)ns };

			nanosleep(&ts, NULL);
		}
	}
}

static void *fault_addr(struct st_tier *t, uint64_t off_bytes)
{
	struct fault_priv *p = st_tier_priv(t);
	char *base = st_tier_addr(p->inner, &p->ext);

	return base ? base + off_bytes : NULL;
}

const struct st_tier_ops st_tier_fault_ops = {
	.name = "fault",
	.kind = ST_TIER_WRAP,
	.priv_bytes = sizeof(struct fault_priv),
	.open = fault_open,
	.close = fault_close,
	.submit = fault_submit,
	.reap = fault_reap,
	.addr = fault_addr,
	.alloc_check = fault_alloc_check,
};

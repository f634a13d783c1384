/* The tier core: every call into a tier goes through here.
 *
 * It owns what all tiers share, so each tier file only moves bytes:
 *  - the extent allocator and the hard budget (first fit over a sorted free
 *    list, coalescing on free);
 *  - request tracking: each caller request gets a record; a hook may
 *    complete it short and the core resubmits the rest, so callers only
 *    ever see the full length or -errno;
 *  - stats (used, peak, bytes moved, busy time), tracing, arguments checks.
 * Fault injection is a tier of its own (fault.c) that wraps a real one,
 * and lives nowhere else. */
#include "tier_impl.h"

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct st_range {
	uint64_t off, len;
};

struct st_tier_req {
	struct st_tier_io io;     /* the caller's request, absolute offsets */
	uint64_t done_bytes;      /* moved so far (short completions) */
	struct st_tier_req *next; /* free list */
};

struct st_tier {
	const struct st_tier_ops *ops;
	struct st_tier_config cfg;
	uint64_t align_bytes;
	void *priv;

	/* allocator: free ranges sorted by offset */
	struct st_range *free_ranges;
	size_t nfree, cap_free;

	/* request records: grown in chunks up to the high-water mark, then
	 * reused, so a steady step loop allocates nothing */
	struct st_tier_req *req_free;
	void **req_chunks;
	size_t nchunks;
	unsigned inflight;      /* caller requests not yet reaped */
	unsigned hook_inflight; /* hook-level requests (incl. resubmits) */
	uint64_t busy_since_ns;

	struct st_tier_stats stats;
	char err[512];
	char desc[256];

	st_tier_trace_fn trace;
	void *trace_ctx;
};

#define REQ_CHUNK 64

int st_tier_set_error(struct st_tier *t, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(t->err, sizeof(t->err), fmt, ap);
	va_end(ap);
	return st_error_set(err, "%s", t->err);
}

const struct st_tier_ops *st_tier_ops_of(const struct st_tier *t)
{
	return t->ops;
}

int st_tier_where(struct st_tier *t, uint64_t off_bytes, char *buf, size_t len)
{
	assert(t && buf && len);
	if (!t->ops->where || off_bytes >= t->cfg.budget_bytes)
		return -ENOTSUP;
	return t->ops->where(t, off_bytes, buf, len);
}

uint64_t st_tier_budget(const struct st_tier *t)
{
	return t->cfg.budget_bytes;
}

static bool tier_ops_valid(const struct st_tier_ops *o)
{
	return o && o->name && o->open && o->close && o->submit && o->reap;
}

int st_tier_create(const struct st_tier_ops *ops,
		   const struct st_tier_config *cfg, struct st_tier **out)
{
	struct st_tier *t;
	uint64_t align = ST_PAGE_BYTES;
	int ret;

	assert(out && cfg);
	*out = NULL;
	if (!tier_ops_valid(ops))
		return st_error_set(-EINVAL, "tier ops table %s lacks a required hook",
				    ops && ops->name ? ops->name : "(unnamed)");
	if (cfg->budget_bytes == 0)
		return st_error_set(-EINVAL, "%s tier: budget must be more than 0 bytes",
				    ops->name);
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->ops = ops;
	t->cfg = *cfg;
	t->cfg.budget_bytes = st_align_up(cfg->budget_bytes, ST_PAGE_BYTES);
	if (ops->priv_bytes) {
		t->priv = calloc(1, ops->priv_bytes);
		if (!t->priv) {
			free(t);
			return -ENOMEM;
		}
	}
	ret = ops->open(t, &t->cfg, &align);
	if (ret < 0) {
		free(t->priv);
		free(t);
		return ret;
	}
	assert(st_is_pow2(align));
	t->align_bytes = align;
	t->free_ranges = malloc(sizeof(*t->free_ranges) * 16);
	if (!t->free_ranges) {
		ops->close(t);
		free(t->priv);
		free(t);
		return -ENOMEM;
	}
	t->cap_free = 16;
	t->free_ranges[0] = (struct st_range){ 0, t->cfg.budget_bytes };
	t->nfree = 1;
	t->stats.budget_bytes = t->cfg.budget_bytes;
	*out = t;
	return 0;
}

void st_tier_destroy(struct st_tier *t)
{
	if (!t)
		return;
	while (t->inflight) {
		struct st_tier_cqe cqe[16];

		if (st_tier_reap(t, cqe, ST_ARRAY_LEN(cqe), 1) < 0)
			break;
	}
	t->ops->close(t);
	for (size_t i = 0; i < t->nchunks; i++)
		free(t->req_chunks[i]);
	free(t->req_chunks);
	free(t->free_ranges);
	free(t->priv);
	free(t);
}

const char *st_tier_name(const struct st_tier *t)
{
	return t->ops->name;
}

uint64_t st_tier_align(const struct st_tier *t)
{
	return t->align_bytes;
}

void *st_tier_priv(struct st_tier *t)
{
	return t->priv;
}

const char *st_tier_describe(struct st_tier *t)
{
	char b[32];

	if (t->ops->describe)
		return t->ops->describe(t);
	snprintf(t->desc, sizeof(t->desc), "%s, %s", t->ops->name,
		 st_format_bytes(t->cfg.budget_bytes, b, sizeof(b)));
	return t->desc;
}

const char *st_tier_locate(struct st_tier *t, const struct st_extent *ext,
			   uint64_t off_bytes, char *buf, size_t bytes)
{
	uint64_t pos = ext->off_bytes + off_bytes;

	if (st_tier_where(t, pos, buf, bytes) < 0)
		snprintf(buf, bytes, "%s offset %llu", t->ops->name, (unsigned long long)pos);
	return buf;
}

const char *st_tier_error(const struct st_tier *t)
{
	return t->err;
}

/* --- allocator ------------------------------------------------------------ */

int st_tier_alloc(struct st_tier *t, uint64_t len_bytes, struct st_extent *ext)
{
	uint64_t len;
	int ret;

	assert(t && ext);
	if (len_bytes == 0)
		return st_error_set(-EINVAL, "%s tier: zero-length extent", t->ops->name);
	len = st_align_up(len_bytes, t->align_bytes);
	if (t->ops->alloc_check) {
		ret = t->ops->alloc_check(t, len);
		if (ret < 0)
			return ret;
	}
	if (len > t->cfg.budget_bytes - t->stats.used_bytes) {
		char a[32], b[32];

		return st_error_set(-ENOMEM, "%s tier: %s more would exceed its budget of %s",
				    t->ops->name, st_format_bytes(len, a, sizeof(a)),
				    st_format_bytes(t->cfg.budget_bytes, b, sizeof(b)));
	}
	for (size_t i = 0; i < t->nfree; i++) {
		struct st_range *r = &t->free_ranges[i];

		if (r->len < len)
			continue;
		ext->off_bytes = r->off;
		ext->len_bytes = len;
		r->off += len;
		r->len -= len;
		if (r->len == 0) {
			memmove(r, r + 1, (t->nfree - i - 1) * sizeof(*r));
			t->nfree--;
		}
		t->stats.used_bytes += len;
		t->stats.extents++;
		if (t->stats.used_bytes > t->stats.peak_bytes)
			t->stats.peak_bytes = t->stats.used_bytes;
		return 0;
	}
	return st_error_set(-ENOMEM, "%s tier: no free range of %llu bytes (fragmented)",
			    t->ops->name, (unsigned long long)len);
}

void st_tier_free(struct st_tier *t, const struct st_extent *ext)
{
	size_t i = 0;
	struct st_range *r;

	assert(t && ext && ext->len_bytes);
	assert(ext->off_bytes + ext->len_bytes <= t->cfg.budget_bytes);
	while (i < t->nfree && t->free_ranges[i].off < ext->off_bytes)
		i++;
	/* A double free would overlap a neighbouring free range. */
	assert(i == t->nfree || ext->off_bytes + ext->len_bytes <= t->free_ranges[i].off);
	assert(i == 0 || t->free_ranges[i - 1].off + t->free_ranges[i - 1].len <=
				 ext->off_bytes);
	if (t->nfree == t->cap_free) {
		struct st_range *n = realloc(t->free_ranges,
					     2 * t->cap_free * sizeof(*n));

		assert(n); /* freeing must not fail; the list is tiny */
		t->free_ranges = n;
		t->cap_free *= 2;
	}
	r = t->free_ranges;
	memmove(r + i + 1, r + i, (t->nfree - i) * sizeof(*r));
	r[i] = (struct st_range){ ext->off_bytes, ext->len_bytes };
	t->nfree++;
	/* coalesce with the next, then the previous */
	if (i + 1 < t->nfree && r[i].off + r[i].len == r[i + 1].off) {
		r[i].len += r[i + 1].len;
		memmove(r + i + 1, r + i + 2, (t->nfree - i - 2) * sizeof(*r));
		t->nfree--;
	}
	if (i > 0 && r[i - 1].off + r[i - 1].len == r[i].off) {
		r[i - 1].len += r[i].len;
		memmove(r + i, r + i + 1, (t->nfree - i - 1) * sizeof(*r));
		t->nfree--;
	}
	t->stats.used_bytes -= ext->len_bytes;
	t->stats.extents--;
}

/* --- requests ------------------------------------------------------------- */

static struct st_tier_req *req_get(struct st_tier *t)
{
	struct st_tier_req *r;

	if (!t->req_free) {
		struct st_tier_req *chunk = calloc(REQ_CHUNK, sizeof(*chunk));
		void **chunks = realloc(t->req_chunks, (t->nchunks + 1) * sizeof(void *));

		if (!chunk || !chunks) {
			free(chunk);
			if (chunks)
				t->req_chunks = chunks;
			return NULL;
		}
		t->req_chunks = chunks;
		t->req_chunks[t->nchunks++] = chunk;
		for (int i = 0; i < REQ_CHUNK; i++) {
			chunk[i].next = t->req_free;
			t->req_free = &chunk[i];
		}
	}
	r = t->req_free;
	t->req_free = r->next;
	return r;
}

static void req_put(struct st_tier *t, struct st_tier_req *r)
{
	r->next = t->req_free;
	t->req_free = r;
}

static void busy_enter(struct st_tier *t)
{
	if (t->hook_inflight++ == 0)
		t->busy_since_ns = st_now_ns();
}

static void busy_leave(struct st_tier *t)
{
	assert(t->hook_inflight > 0);
	if (--t->hook_inflight == 0)
		t->stats.busy_ns += st_now_ns() - t->busy_since_ns;
}

static int check_io(struct st_tier *t, const struct st_tier_io *io)
{
	uint64_t a = t->align_bytes;

	if (io->op != ST_IO_READ && io->op != ST_IO_WRITE)
		return st_error_set(-EINVAL, "%s tier: bad I/O op", t->ops->name);
	if (!io->buf || io->len_bytes == 0)
		return st_error_set(-EINVAL, "%s tier: empty I/O", t->ops->name);
	if (io->ext_off_bytes + io->len_bytes > io->ext.len_bytes ||
	    io->ext.off_bytes + io->ext.len_bytes > t->cfg.budget_bytes)
		return st_error_set(-EINVAL, "%s tier: I/O of %llu bytes at %llu runs past its extent",
				    t->ops->name, (unsigned long long)io->len_bytes,
				    (unsigned long long)io->ext_off_bytes);
	if ((io->ext_off_bytes | io->len_bytes | (uintptr_t)io->buf) & (a - 1))
		return st_error_set(-EINVAL, "%s tier: I/O not aligned to %llu bytes",
				    t->ops->name, (unsigned long long)a);
	if (io->after && t->ops->kind != ST_TIER_VRAM && t->ops->kind != ST_TIER_WRAP)
		return st_error_set(-EINVAL, "%s tier: only vram copies can wait for a device event",
				    t->ops->name);
	/* not through a wrapper: a short completion would mark only a part */
	if (io->done && t->ops->kind != ST_TIER_VRAM)
		return st_error_set(-EINVAL, "%s tier: only vram copies can record a device event",
				    t->ops->name);
	return 0;
}

static void trace(struct st_tier *t, enum st_trace_phase ph,
		  const struct st_tier_io *io, int64_t res)
{
	if (t->trace)
		t->trace(t->trace_ctx, t, ph, io->op, io->ext.off_bytes + io->ext_off_bytes,
			 io->len_bytes, res);
}

int st_tier_submit(struct st_tier *t, const struct st_tier_io *ios, unsigned n)
{
	struct st_tier_io batch[32];
	struct st_tier_req *reqs[32];
	unsigned done = 0;
	int ret;

	assert(t && (ios || n == 0));
	for (unsigned i = 0; i < n; i++) {
		ret = check_io(t, &ios[i]);
		if (ret < 0)
			return ret;
	}
	/* Hooks see absolute offsets and our record as user; done in batches
	 * so a large submit needs no allocation. */
	while (done < n) {
		unsigned k = ST_MIN(n - done, (unsigned)ST_ARRAY_LEN(batch));

		for (unsigned i = 0; i < k; i++) {
			const struct st_tier_io *io = &ios[done + i];

			reqs[i] = req_get(t);
			if (!reqs[i]) {
				while (i--)
					req_put(t, reqs[i]);
				return done ? st_error_set(-ENOMEM, "%s tier: out of memory after %u of %u requests queued",
							   t->ops->name, done, n)
					    : -ENOMEM;
			}
			reqs[i]->io = *io;
			reqs[i]->done_bytes = 0;
			batch[i] = *io;
			batch[i].ext_off_bytes = io->ext.off_bytes + io->ext_off_bytes;
			batch[i].ext.off_bytes = 0;
			batch[i].ext.len_bytes = t->cfg.budget_bytes;
			batch[i].user = reqs[i];
		}
		ret = t->ops->submit(t, batch, k);
		if (ret < 0) {
			for (unsigned i = 0; i < k; i++)
				req_put(t, reqs[i]);
			return ret;
		}
		for (unsigned i = 0; i < k; i++) {
			busy_enter(t);
			t->inflight++;
			trace(t, ST_TRACE_SUBMIT, &ios[done + i], 0);
		}
		done += k;
	}
	return 0;
}

/* Resubmit what a short completion left. Returns 0 or -errno. */
static int resubmit_rest(struct st_tier *t, struct st_tier_req *r)
{
	struct st_tier_io io = r->io;

	io.ext_off_bytes = r->io.ext.off_bytes + r->io.ext_off_bytes + r->done_bytes;
	io.ext.off_bytes = 0;
	io.ext.len_bytes = t->cfg.budget_bytes;
	io.len_bytes = r->io.len_bytes - r->done_bytes;
	io.buf = (char *)r->io.buf + r->done_bytes;
	io.user = r;
	io.after = NULL; /* the first part already waited */
	io.done = NULL;  /* never set here: only the vram tier takes it, and is never short */
	t->stats.resubmits++;
	return t->ops->submit(t, &io, 1);
}

int st_tier_reap(struct st_tier *t, struct st_tier_cqe *out, unsigned max,
		 unsigned min_wait)
{
	struct st_tier_cqe hook[32];
	unsigned got = 0;

	assert(t && (out || max == 0));
	if (min_wait > t->inflight)
		min_wait = t->inflight;
	if (min_wait > max)
		min_wait = max;
	do {
		unsigned want = ST_MIN(max - got, (unsigned)ST_ARRAY_LEN(hook));
		int n;

		if (want == 0 || t->hook_inflight == 0)
			break;
		n = t->ops->reap(t, hook, want, got < min_wait ? 1 : 0);
		if (n < 0)
			return got ? (int)got : n;
		for (int i = 0; i < n; i++) {
			struct st_tier_req *r = hook[i].user;
			int64_t res = hook[i].res;

			busy_leave(t);
			if (res >= 0) {
				uint64_t left = r->io.len_bytes - r->done_bytes;

				if ((uint64_t)res > left)
					res = left;
				if (res == 0) {
					res = st_tier_set_error(t, -EIO,
						"%s: %s at offset %llu made no progress",
						t->ops->name, r->io.op == ST_IO_READ ? "read" : "write",
						(unsigned long long)(r->io.ext.off_bytes +
								     r->io.ext_off_bytes + r->done_bytes));
				} else if ((uint64_t)res < left) {
					int ret;

					r->done_bytes += (uint64_t)res;
					ret = resubmit_rest(t, r);
					if (ret == 0) {
						busy_enter(t);
						continue;
					}
					res = ret;
				} else {
					r->done_bytes += (uint64_t)res;
					res = (int64_t)r->io.len_bytes;
				}
			}
			if (res >= 0) {
				if (r->io.op == ST_IO_READ) {
					t->stats.read_bytes += r->io.len_bytes;
					t->stats.reads++;
				} else {
					t->stats.write_bytes += r->io.len_bytes;
					t->stats.writes++;
				}
			} else {
				t->stats.errors++;
			}
			trace(t, ST_TRACE_COMPLETE, &r->io, res);
			out[got].user = r->io.user;
			out[got].res = res;
			got++;
			t->inflight--;
			req_put(t, r);
		}
	} while (got < min_wait);
	return (int)got;
}

unsigned st_tier_inflight(const struct st_tier *t)
{
	return t->inflight;
}

static int io_sync(struct st_tier *t, enum st_io_op op, const struct st_extent *ext,
		   uint64_t off_bytes, void *buf, uint64_t len_bytes)
{
	struct st_tier_io io = { .op = op, .ext = *ext, .ext_off_bytes = off_bytes,
				 .len_bytes = len_bytes, .buf = buf, .user = &io };
	struct st_tier_cqe cqe;
	int ret, n;

	assert(t->inflight == 0); /* the sync helpers own the tier meanwhile */
	ret = st_tier_submit(t, &io, 1);
	if (ret < 0)
		return ret;
	n = st_tier_reap(t, &cqe, 1, 1);
	if (n < 0)
		return n;
	assert(n == 1 && cqe.user == &io);
	return cqe.res < 0 ? (int)cqe.res : 0;
}

int st_tier_read_sync(struct st_tier *t, const struct st_extent *ext,
		      uint64_t off_bytes, void *buf, uint64_t len_bytes)
{
	return io_sync(t, ST_IO_READ, ext, off_bytes, buf, len_bytes);
}

int st_tier_write_sync(struct st_tier *t, const struct st_extent *ext,
		       uint64_t off_bytes, const void *buf, uint64_t len_bytes)
{
	return io_sync(t, ST_IO_WRITE, ext, off_bytes, (void *)buf, len_bytes);
}

int st_tier_register_buffers(struct st_tier *t, const struct st_tier_buffer *b,
			     unsigned n)
{
	assert(t && (b || n == 0));
	if (!t->ops->register_buffers)
		return 0;
	assert(t->inflight == 0);
	return t->ops->register_buffers(t, b, n);
}

void st_tier_unregister_buffers(struct st_tier *t)
{
	if (t && t->ops->unregister_buffers) {
		assert(t->inflight == 0);
		t->ops->unregister_buffers(t);
	}
}

int st_tier_sync(struct st_tier *t)
{
	assert(t);
	return t->ops->sync ? t->ops->sync(t) : 0;
}

void *st_tier_addr(struct st_tier *t, const struct st_extent *ext)
{
	if (!t->ops->addr)
		return NULL;
	return t->ops->addr(t, ext->off_bytes);
}

void st_tier_get_stats(const struct st_tier *t, struct st_tier_stats *s)
{
	*s = t->stats;
	if (t->hook_inflight)
		s->busy_ns += st_now_ns() - t->busy_since_ns;
}

void st_tier_reset_peak(struct st_tier *t)
{
	t->stats.peak_bytes = t->stats.used_bytes;
}

void st_tier_set_trace(struct st_tier *t, st_tier_trace_fn fn, void *ctx)
{
	t->trace = fn;
	t->trace_ctx = ctx;
}

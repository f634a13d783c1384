/* The fault tier: wraps a real tier and, at the Nth operation (allocs and
 * I/O requests, counted from 1), injects EIO, a short transfer, ENOSPC or a
 * delay; and, at the Nth write, corrupts what the write leaves on the inner
 * tier (a flipped bit, a zeroed byte, a page of 0xFF, a lost write, a page
 * of another extent), or hands the Nth I/O to the inner tier late (LATE,
 * a read after a time; WRITE_LAST, a write once nothing else is in flight
 * and the caller waits).
 * Tests build every failure path of the engine on it;
 * it is the one place strata injects faults (docs/reliability.md).
 *
 * It takes one extent of its budget from the inner tier at open and maps its
 * own address space onto it. A short transfer forwards only the first half
 * and reports that count, so the core must resubmit the rest. A corrupted
 * write goes to the inner tier in up to three pieces: the bytes before the
 * corrupted page and after it from the caller's buffer, the page from a
 * bounce page of our own (changed, or read first from the source page);
 * the caller sees one completion once all pieces are done. */
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

/* The one corrupted write in flight: its pieces on the inner tier carry
 * &tag_write or &tag_read (the source page's read, OTHER_PAGE), and the
 * caller's completion goes out when the last piece is done. */
struct fault_job {
	bool active;
	void *user;             /* the caller's request */
	int64_t len_bytes;      /* its completion */
	int64_t err;            /* the first piece's failure, or 0 */
	unsigned pending;       /* pieces on the inner tier */
	struct st_tier_io page; /* OTHER_PAGE: the page's write, after the read */
	char tag_read, tag_write;
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
	/* corruption */
	struct st_fault_corrupt cor; /* armed (kind NONE: none) */
	uint64_t writes;             /* writes seen since it was armed */
	struct st_fault_corrupted last;
	unsigned ncorrupted;
	uint64_t page_bytes;
	char *page;                  /* bounce page, page_bytes, aligned */
	struct fault_job job;
	/* LATE: requests held before the inner tier, each until its due time */
	struct st_tier_io *late;
	uint64_t *late_due_ns;
	unsigned nlate, late_cap;
};

/* Hold io (offsets in inner's space) until due_ns before it goes to the
 * inner tier. 0 or -ENOMEM. */
static int late_hold(struct fault_priv *p, const struct st_tier_io *io, uint64_t due_ns)
{
	if (p->nlate == p->late_cap) {
		unsigned cap = p->late_cap ? 2 * p->late_cap : 16;
		struct st_tier_io *l = realloc(p->late, cap * sizeof(*l));
		uint64_t *d;

		if (!l)
			return -ENOMEM;
		p->late = l;
		d = realloc(p->late_due_ns, cap * sizeof(*d));
		if (!d)
			return -ENOMEM;
		p->late_due_ns = d;
		p->late_cap = cap;
	}
	p->late[p->nlate] = *io;
	p->late_due_ns[p->nlate++] = due_ns;
	return 0;
}

/* Hand the held requests that are due to the inner tier, in order. Sets
 * *next_due_ns to the earliest of the rest (kept as it is when none).
 * 0 or -errno. */
static int late_submit(struct fault_priv *p, uint64_t *next_due_ns)
{
	uint64_t now = st_now_ns();
	unsigned kept = 0;

	for (unsigned i = 0; i < p->nlate; i++) {
		if (p->late_due_ns[i] <= now) {
			int ret = st_tier_submit(p->inner, &p->late[i], 1);

			if (ret < 0) { /* keep it and the rest held */
				memmove(p->late + kept, p->late + i, (p->nlate - i) * sizeof(*p->late));
				memmove(p->late_due_ns + kept, p->late_due_ns + i,
					(p->nlate - i) * sizeof(*p->late_due_ns));
				p->nlate = kept + (p->nlate - i);
				return ret;
			}
			p->inner_inflight++;
			continue;
		}
		if (!*next_due_ns || p->late_due_ns[i] < *next_due_ns)
			*next_due_ns = p->late_due_ns[i];
		p->late[kept] = p->late[i];
		p->late_due_ns[kept++] = p->late_due_ns[i];
	}
	p->nlate = kept;
	return 0;
}

/* WRITE_LAST: the caller waits with nothing else on the inner tier, so
 * the held writes go to it now, in their order. 0 or -errno. */
static int write_last_release(struct fault_priv *p)
{
	uint64_t next_due = 0;

	for (unsigned i = 0; i < p->nlate; i++)
		if (p->late_due_ns[i] == UINT64_MAX)
			p->late_due_ns[i] = 0;
	return late_submit(p, &next_due);
}

static bool fault_hit(struct fault_priv *p)
{
	uint64_t n = ++p->ops;

	if (p->f.kind == ST_FAULT_NONE || n < p->f.nth)
		return false;
	if (n == p->f.nth)
		return true;
	return p->f.every && (n - p->f.nth) % p->f.every == 0;
}

static int fault_check_corrupt(const struct fault_priv *p, const struct st_fault_corrupt *c,
			       uint64_t budget_bytes)
{
	if (c->kind < ST_CORRUPT_NONE || c->kind > ST_CORRUPT_OTHER_PAGE)
		return st_error_set(-EINVAL, "fault tier: corruption kind %d unknown", (int)c->kind);
	if (c->kind == ST_CORRUPT_BIT && c->bit > 7)
		return st_error_set(-EINVAL, "fault tier: bit %u of a byte (0 to 7)", c->bit);
	if (c->kind == ST_CORRUPT_OTHER_PAGE &&
	    c->src_off_bytes / p->page_bytes * p->page_bytes + p->page_bytes > budget_bytes)
		return st_error_set(-EINVAL, "fault tier: source page at %llu is outside the tier",
				    (unsigned long long)c->src_off_bytes);
	return 0;
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
	p->page_bytes = ST_MAX((uint64_t)ST_PAGE_BYTES, st_tier_align(p->inner));
	ret = fault_check_corrupt(p, &p->f.corrupt, cfg->budget_bytes);
	if (ret < 0)
		return ret;
	p->cor = p->f.corrupt;
	if (posix_memalign((void **)&p->page, p->page_bytes, p->page_bytes))
		return -ENOMEM;
	ret = st_tier_alloc(p->inner, cfg->budget_bytes, &p->ext);
	if (ret < 0) {
		free(p->page);
		return ret;
	}
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
	free(p->late);
	free(p->late_due_ns);
	free(p->held);
	free(p->page);
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

/* Whether this write (absolute offset off in our space) is the one armed
 * for corruption; counts it. */
static bool corrupt_due(struct fault_priv *p)
{
	if (p->cor.kind == ST_CORRUPT_NONE || p->job.active)
		return false;
	return ++p->writes >= ST_MAX(p->cor.nth_write, (uint64_t)1);
}

/* Submit the write io (offsets already in inner's space; off its offset in
 * ours) with the corruption armed. Returns 0 or -errno (nothing queued). */
static int corrupt_submit(struct st_tier *t, struct fault_priv *p, const struct st_tier_io *io,
			  uint64_t off)
{
	const struct st_fault_corrupt cor = p->cor, *c = &cor;
	const uint8_t *src = io->buf;
	uint64_t len = io->len_bytes, at = ST_MIN(c->at_bytes, len - 1);
	uint64_t ps, pe; /* the page's bytes in the write: [ps, pe) of it */
	struct st_tier_io piece[3];
	unsigned n = 0;
	int ret;

	ST_UNUSED(t);
	if (c->kind == ST_CORRUPT_ZERO_BYTE)
		while (at + 1 < len && src[at] == 0)
			at++;
	ps = (off + at) / p->page_bytes * p->page_bytes;
	ps = ps > off ? ps - off : 0;
	pe = ST_MIN((off + at) / p->page_bytes * p->page_bytes + p->page_bytes - off, len);
	p->last = (struct st_fault_corrupted){ c->kind, p->writes, off + ps, pe - ps };
	p->ncorrupted++;
	p->cor.kind = ST_CORRUPT_NONE; /* done once */
	if (c->kind == ST_CORRUPT_STALE) {
		/* lost: acknowledged, never written */
		p->last.off_bytes = off;
		p->last.len_bytes = len;
		return fault_hold(p, io->user, (int64_t)len, 0);
	}
	memcpy(p->page, src + ps, pe - ps);
	switch (c->kind) {
	case ST_CORRUPT_BIT:
		p->page[at - ps] ^= (char)(1u << c->bit);
		p->last.off_bytes = off + at;
		p->last.len_bytes = 1;
		break;
	case ST_CORRUPT_ZERO_BYTE:
		p->last.off_bytes = off + at;
		p->last.len_bytes = src[at] != 0;
		p->page[at - ps] = 0;
		break;
	case ST_CORRUPT_PAGE_FF:
		memset(p->page, 0xff, pe - ps);
		break;
	default:
		break;
	}
	p->job = (struct fault_job){ .active = true, .user = io->user,
				     .len_bytes = (int64_t)len };
	if (ps > 0) {
		piece[n] = *io;
		piece[n].len_bytes = ps;
		piece[n++].user = &p->job.tag_write;
	}
	if (pe < len) {
		piece[n] = *io;
		piece[n].ext_off_bytes += pe;
		piece[n].buf = (char *)io->buf + pe;
		piece[n].len_bytes = len - pe;
		piece[n++].user = &p->job.tag_write;
	}
	p->job.page = *io;
	p->job.page.ext_off_bytes += ps;
	p->job.page.buf = p->page;
	p->job.page.len_bytes = pe - ps;
	p->job.page.user = &p->job.tag_write;
	if (c->kind == ST_CORRUPT_OTHER_PAGE) {
		/* the source page first; its write follows in fault_reap */
		piece[n] = (struct st_tier_io){
			.op = ST_IO_READ, .ext = p->ext,
			.ext_off_bytes = c->src_off_bytes / p->page_bytes * p->page_bytes,
			.len_bytes = pe - ps, .buf = p->page, .user = &p->job.tag_read };
		n++;
	} else {
		piece[n++] = p->job.page;
	}
	ret = st_tier_submit(p->inner, piece, n);
	if (ret < 0) {
		p->job.active = false;
		return ret;
	}
	p->job.pending = n;
	p->inner_inflight += n;
	return 0;
}

/* A completion of one of the corrupted write's pieces: into *out the
 * caller's, once they are all done. Returns 1 when *out is set, 0 when
 * not, -errno when the page's write could not be queued. */
static int job_piece_done(struct fault_priv *p, const struct st_tier_cqe *c,
			  struct st_tier_cqe *out)
{
	struct fault_job *j = &p->job;

	j->pending--;
	if (c->res < 0 && !j->err)
		j->err = c->res;
	if (c->user == &j->tag_read && c->res >= 0) {
		int ret = st_tier_submit(p->inner, &j->page, 1);

		if (ret < 0)
			return ret;
		j->pending++;
		p->inner_inflight++;
	}
	if (j->pending)
		return 0;
	j->active = false;
	*out = (struct st_tier_cqe){ j->user, j->err ? j->err : j->len_bytes };
	return 1;
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
			char where[320];

			switch (p->f.kind) {
			case ST_FAULT_EIO:
				/* named as the inner tier names a real failure
				 * (its file and offset), when it can */
				if (st_tier_where(p->inner, p->ext.off_bytes + off, where,
						  sizeof(where)) == 0)
					st_tier_set_error(t, -EIO, "fault: injected EIO on %s %s: %s",
							  what, where, strerror(EIO));
				else
					st_tier_set_error(t, -EIO, "fault: injected EIO on %s at "
							  "offset %llu: %s", what,
							  (unsigned long long)off, strerror(EIO));
				if (io.op == ST_IO_WRITE && corrupt_due(p))
					p->writes--; /* the next write is corrupted */
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
				if (corrupt_due(p))
					p->writes--;
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
			case ST_FAULT_LATE:
				if (io.op != ST_IO_READ)
					break;
				ret = late_hold(p, &io, st_now_ns() + p->f.delay_ns);
				if (ret < 0)
					return ret;
				continue;
			case ST_FAULT_WRITE_LAST:
				if (io.op != ST_IO_WRITE)
					break;
				ret = late_hold(p, &io, UINT64_MAX);
				if (ret < 0)
					return ret;
				continue;
			case ST_FAULT_NONE:
				break;
			}
		}
		if (io.op == ST_IO_WRITE && io.user != p->delay_user && corrupt_due(p)) {
			ret = corrupt_submit(t, p, &io, off);
			if (ret < 0)
				return ret;
			continue;
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
		int lret = p->nlate ? late_submit(p, &next_due) : 0;

		if (lret < 0)
			return lret;

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
			bool block = got < min_wait && !p->nheld && !p->nlate;
			int n = st_tier_reap(p->inner, c, want, block ? 1 : 0);

			if (n < 0)
				return n;
			for (int i = 0; i < n; i++) {
				p->inner_inflight--;
				if (c[i].user == &p->job.tag_read || c[i].user == &p->job.tag_write) {
					int r = job_piece_done(p, &c[i], &out[got]);

					if (r < 0)
						return r;
					got += (unsigned)r;
					continue;
				}
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
		/* WRITE_LAST's writes go once the caller would wait on
		 * nothing but them */
		if (p->f.kind == ST_FAULT_WRITE_LAST && p->nlate && !p->inner_inflight &&
		    got < ST_MAX(min_wait, 1u) && got < max) {
			int r = write_last_release(p);

			if (r < 0)
				return r;
			continue;
		}
		if (got >= min_wait || got == max ||
		    (!p->inner_inflight && !p->nheld && !p->nlate))
			return (int)got;
		if ((p->nheld || p->nlate) && next_due > st_now_ns()) {
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

static int fault_register_buffers(struct st_tier *t, const struct st_tier_buffer *b,
				  unsigned n)
{
	struct fault_priv *p = st_tier_priv(t);

	return st_tier_register_buffers(p->inner, b, n);
}

static void fault_unregister_buffers(struct st_tier *t)
{
	struct fault_priv *p = st_tier_priv(t);

	st_tier_unregister_buffers(p->inner);
}

static int fault_sync(struct st_tier *t)
{
	struct fault_priv *p = st_tier_priv(t);

	return st_tier_sync(p->inner);
}

static const char *fault_describe(struct st_tier *t)
{
	struct fault_priv *p = st_tier_priv(t);

	return st_tier_describe(p->inner);
}

static int fault_where(struct st_tier *t, uint64_t off_bytes, char *buf, size_t len)
{
	struct fault_priv *p = st_tier_priv(t);

	return st_tier_where(p->inner, p->ext.off_bytes + off_bytes, buf, len);
}

int st_tier_fault_arm(struct st_tier *t, const struct st_fault_corrupt *c)
{
	struct fault_priv *p;
	int ret;

	if (!t || st_tier_ops_of(t) != &st_tier_fault_ops)
		return st_error_set(-EINVAL, "st_tier_fault_arm: not a fault tier");
	p = st_tier_priv(t);
	ret = fault_check_corrupt(p, c, p->ext.len_bytes);
	if (ret < 0)
		return ret;
	p->cor = *c;
	p->writes = 0;
	return 0;
}

int st_tier_fault_corrupted(const struct st_tier *t, struct st_fault_corrupted *out)
{
	struct fault_priv *p;

	if (!t || st_tier_ops_of(t) != &st_tier_fault_ops)
		return st_error_set(-EINVAL, "st_tier_fault_corrupted: not a fault tier");
	p = st_tier_priv((struct st_tier *)t);
	if (p->ncorrupted && out)
		*out = p->last;
	return (int)p->ncorrupted;
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
	.register_buffers = fault_register_buffers,
	.unregister_buffers = fault_unregister_buffers,
	.sync = fault_sync,
	.describe = fault_describe,
	.where = fault_where,
};

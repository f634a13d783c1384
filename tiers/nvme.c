/* The nvme tier: swap files on one or more directories, read and written
 * with io_uring.
 *
 * Layout: the tier's address space is cut into blocks of block_bytes; block
 * b lives in file b % ndirs at offset (b / ndirs) * block_bytes, so several
 * drives add up without RAID (round-robin striping by block).
 * Files: created O_EXCL, mode 0600, O_DIRECT, preallocated with fallocate
 * (no space is reported at open, not halfway through training), then
 * unlinked at once: a crash leaves nothing behind. A filesystem that refuses
 * O_DIRECT (tmpfs on older kernels) falls back to buffered I/O, with a
 * warning.
 * I/O: a request is split into block pieces; up to queue_depth pieces are in
 * flight, refilled as they complete. Fixed files always; fixed buffers when
 * the piece's buffer lies in a registered region. A short piece is
 * resubmitted for the rest; a failed one reports file, offset and errno. */
#include "tier_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#define NVME_MAX_DIRS 16
#define NVME_DEFAULT_BLOCK_BYTES (1u << 20)
#define NVME_DEFAULT_QD 32u
#define NVME_MAX_BUFFERS 64

struct nvme_req {                 /* one caller request, split in pieces */
	void *user;
	enum st_io_op op;
	uint64_t off_bytes, len_bytes; /* absolute in the tier */
	char *buf;
	uint64_t issued_bytes;         /* pieces cut so far */
	unsigned outstanding;          /* pieces in flight */
	int err;                       /* first error, or 0 */
	struct nvme_req *next;         /* pending list or free list */
};

struct nvme_slot {                /* one piece in flight */
	struct nvme_req *req;
	int file;
	uint64_t foff_bytes;
	char *buf;
	uint32_t len_bytes, done_bytes;
	int buf_index;                 /* registered buffer, or -1 */
};

struct nvme_priv {
	struct io_uring ring;
	bool ring_ok;
	int fds[NVME_MAX_DIRS];
	char *paths[NVME_MAX_DIRS];    /* for messages; the files are unlinked */
	unsigned nfiles;
	uint64_t file_bytes;
	uint32_t block_bytes;
	unsigned qd;
	bool direct;
	unsigned short_every, cqe_count;

	struct nvme_slot *slots;
	unsigned *free_slots, nfree_slots;
	struct nvme_req *pending_head, *pending_tail; /* not fully issued */
	struct nvme_req *req_free;
	unsigned nreqs;                /* requests submitted, not yet reaped */
	struct st_tier_cqe *done;      /* ring of finished requests; sized at */
	unsigned done_head, done_len, done_cap; /* submit so a push never fails */

	struct iovec bufs[NVME_MAX_BUFFERS];
	unsigned nbufs;
	char desc[256];
};

static unsigned nvme_file_counter;

static void nvme_close_files(struct nvme_priv *p)
{
	for (unsigned i = 0; i < p->nfiles; i++) {
		if (p->fds[i] >= 0)
			close(p->fds[i]);
		free(p->paths[i]);
	}
	p->nfiles = 0;
}

/* Create, preallocate and unlink one swap file in dir. */
static int nvme_open_file(struct st_tier *t, struct nvme_priv *p, const char *dir,
			  unsigned i)
{
	char path[4096];
	struct stat st;
	struct statvfs vfs;
	int fd, flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, ret;

	if (stat(dir, &st) < 0)
		return st_tier_set_error(t, -errno, "nvme: directory %s: %s", dir,
					 strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return st_tier_set_error(t, -ENOTDIR, "nvme: %s is not a directory", dir);
	snprintf(path, sizeof(path), "%s/strata-%d-%u-%u.swap", dir, (int)getpid(),
		 __atomic_fetch_add(&nvme_file_counter, 1, __ATOMIC_RELAXED), i);
	p->paths[i] = strdup(path);
	p->fds[i] = -1;
	p->nfiles = i + 1;
	if (!p->paths[i])
		return -ENOMEM;
	/* A file with no name first (O_TMPFILE): a kill at any instant leaves
	 * nothing behind. Filesystems without it get a named file, unlinked
	 * at once below (a kill between the two leaves the name). */
	fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC | (p->direct ? O_DIRECT : 0), 0600);
	if (fd >= 0) {
		p->fds[i] = fd;
		goto reserve;
	}
	/* no O_TMPFILE here, or not with O_DIRECT: the named file finds out */
	fd = open(path, flags | (p->direct ? O_DIRECT : 0), 0600);
	if (fd < 0 && errno == EINVAL && p->direct) {
		/* This filesystem refuses O_DIRECT: fall back for every file. */
		unlink(path);
		p->direct = false;
		st_warn("nvme: %s does not support O_DIRECT; using buffered I/O "
			"(page cache in the way, numbers will not reflect the drive)", dir);
		fd = open(path, flags, 0600);
	}
	if (fd < 0)
		return st_tier_set_error(t, -errno, "nvme: create %s: %s", path,
					 strerror(errno));
	p->fds[i] = fd;
	/* Unlink first: whatever happens next, nothing is left behind. */
	unlink(path);
reserve:
	/* Refuse a budget the filesystem cannot hold before asking for it:
	 * fallocate takes free blocks until it runs out, so a reservation that
	 * fails still fills the disk for a moment, and whatever else writes
	 * there then (another job, its logs) gets ENOSPC. */
	if (fstatvfs(fd, &vfs) == 0 &&
	    (uint64_t)vfs.f_bavail * vfs.f_frsize < p->file_bytes) {
		char b[32], f[32];

		return st_tier_set_error(t, -ENOSPC, "nvme: cannot reserve %s in %s: %s (%s free)",
					 st_format_bytes(p->file_bytes, b, sizeof(b)), dir,
					 strerror(ENOSPC),
					 st_format_bytes((uint64_t)vfs.f_bavail * vfs.f_frsize,
							 f, sizeof(f)));
	}
	ret = fallocate(fd, 0, 0, (off_t)p->file_bytes);
	if (ret < 0 && (errno == EOPNOTSUPP || errno == ENOSYS))
		ret = posix_fallocate(fd, 0, (off_t)p->file_bytes) ? -1 : 0;
	if (ret < 0) {
		char b[32];
		int e = errno;

		return st_tier_set_error(t, -e, "nvme: cannot reserve %s in %s: %s",
					 st_format_bytes(p->file_bytes, b, sizeof(b)), dir,
					 strerror(e));
	}
	return 0;
}

static int nvme_open(struct st_tier *t, const struct st_tier_config *cfg,
		     uint64_t *align_bytes)
{
	struct nvme_priv *p = st_tier_priv(t);
	char *dirs, *save = NULL, *tok;
	uint64_t blocks;
	unsigned ndirs = 0;
	int ret;

	if (!cfg->dirs || !*cfg->dirs)
		return st_error_set(-EINVAL, "nvme: no directory given");
	p->block_bytes = cfg->block_bytes ? (uint32_t)cfg->block_bytes
					  : NVME_DEFAULT_BLOCK_BYTES;
	if (cfg->block_bytes > (1u << 30) || !st_is_pow2(p->block_bytes) ||
	    p->block_bytes < ST_PAGE_BYTES)
		return st_error_set(-EINVAL,
				    "nvme: block size %llu must be a power of two from 4K to 1G",
				    (unsigned long long)cfg->block_bytes);
	p->qd = cfg->queue_depth ? cfg->queue_depth : NVME_DEFAULT_QD;
	if (p->qd > 4096)
		return st_error_set(-EINVAL, "nvme: queue depth %u is above 4096", p->qd);
	p->direct = !cfg->buffered;
	p->short_every = cfg->short_every;

	dirs = strdup(cfg->dirs);
	if (!dirs)
		return -ENOMEM;
	for (tok = strtok_r(dirs, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
		ndirs++;
	if (ndirs == 0 || ndirs > NVME_MAX_DIRS) {
		free(dirs);
		return st_error_set(-EINVAL, "nvme: %u directories given (1 to %d)", ndirs,
				    NVME_MAX_DIRS);
	}
	blocks = (cfg->budget_bytes + p->block_bytes - 1) / p->block_bytes;
	p->file_bytes = (blocks + ndirs - 1) / ndirs * p->block_bytes;
	strcpy(dirs, cfg->dirs);
	ndirs = 0;
	ret = 0;
	for (tok = strtok_r(dirs, ",", &save); tok && ret == 0;
	     tok = strtok_r(NULL, ",", &save))
		ret = nvme_open_file(t, p, tok, ndirs++);
	free(dirs);
	if (ret < 0)
		goto fail;

	ret = io_uring_queue_init(p->qd * 2, &p->ring, 0);
	if (ret < 0) {
		st_tier_set_error(t, ret, "nvme: io_uring_queue_init: %s", strerror(-ret));
		goto fail;
	}
	p->ring_ok = true;
	ret = io_uring_register_files(&p->ring, p->fds, p->nfiles);
	if (ret < 0) {
		st_tier_set_error(t, ret, "nvme: io_uring_register_files: %s", strerror(-ret));
		goto fail;
	}
	p->slots = calloc(p->qd, sizeof(*p->slots));
	p->free_slots = malloc(p->qd * sizeof(*p->free_slots));
	p->done_cap = 64;
	p->done = malloc(p->done_cap * sizeof(*p->done));
	if (!p->slots || !p->free_slots || !p->done) {
		ret = -ENOMEM;
		goto fail;
	}
	for (unsigned i = 0; i < p->qd; i++)
		p->free_slots[i] = p->qd - 1 - i;
	p->nfree_slots = p->qd;
	*align_bytes = p->direct ? ST_PAGE_BYTES : 64;
	return 0;
fail:
	if (p->ring_ok)
		io_uring_queue_exit(&p->ring);
	p->ring_ok = false;
	nvme_close_files(p);
	free(p->slots);
	free(p->free_slots);
	free(p->done);
	return ret;
}

static void nvme_close(struct st_tier *t)
{
	struct nvme_priv *p = st_tier_priv(t);

	while (p->req_free) {
		struct nvme_req *r = p->req_free;

		p->req_free = r->next;
		free(r);
	}
	if (p->ring_ok)
		io_uring_queue_exit(&p->ring);
	nvme_close_files(p);
	free(p->slots);
	free(p->free_slots);
	free(p->done);
}

/* Registered buffer containing [buf, buf+len), or -1. */
static int nvme_find_buffer(const struct nvme_priv *p, const char *buf, uint32_t len)
{
	for (unsigned i = 0; i < p->nbufs; i++) {
		const char *b = p->bufs[i].iov_base;

		if (buf >= b && buf + len <= b + p->bufs[i].iov_len)
			return (int)i;
	}
	return -1;
}

static void nvme_prep_slot(struct nvme_priv *p, unsigned idx)
{
	struct nvme_slot *s = &p->slots[idx];
	struct io_uring_sqe *sqe = io_uring_get_sqe(&p->ring);
	char *buf = s->buf + s->done_bytes;
	uint32_t len = s->len_bytes - s->done_bytes;
	uint64_t off = s->foff_bytes + s->done_bytes;

	/* The ring has 2*qd entries and at most qd slots: never full. */
	if (s->req->op == ST_IO_READ) {
		if (s->buf_index >= 0)
			io_uring_prep_read_fixed(sqe, s->file, buf, len, off, s->buf_index);
		else
			io_uring_prep_read(sqe, s->file, buf, len, off);
	} else {
		if (s->buf_index >= 0)
			io_uring_prep_write_fixed(sqe, s->file, buf, len, off, s->buf_index);
		else
			io_uring_prep_write(sqe, s->file, buf, len, off);
	}
	sqe->flags |= IOSQE_FIXED_FILE;
	io_uring_sqe_set_data64(sqe, idx);
}

/* Cut pieces from pending requests into free slots. Returns SQEs prepared. */
static unsigned nvme_fill(struct nvme_priv *p)
{
	unsigned prepped = 0;

	while (p->nfree_slots && p->pending_head) {
		struct nvme_req *r = p->pending_head;
		uint64_t pos = r->off_bytes + r->issued_bytes;
		uint64_t blk = pos / p->block_bytes, within = pos % p->block_bytes;
		uint64_t piece = ST_MIN(p->block_bytes - within, r->len_bytes - r->issued_bytes);
		unsigned idx = p->free_slots[--p->nfree_slots];
		struct nvme_slot *s = &p->slots[idx];

		s->req = r;
		s->file = (int)(blk % p->nfiles);
		s->foff_bytes = (blk / p->nfiles) * p->block_bytes + within;
		s->buf = r->buf + r->issued_bytes;
		s->len_bytes = (uint32_t)piece;
		s->done_bytes = 0;
		s->buf_index = nvme_find_buffer(p, s->buf, s->len_bytes);
		r->issued_bytes += piece;
		r->outstanding++;
		if (r->issued_bytes == r->len_bytes) {
			p->pending_head = r->next;
			if (!p->pending_head)
				p->pending_tail = NULL;
		}
		nvme_prep_slot(p, idx);
		prepped++;
	}
	return prepped;
}

static int nvme_submit_ring(struct st_tier *t, struct nvme_priv *p)
{
	int ret;

	do
		ret = io_uring_submit(&p->ring);
	while (ret == -EINTR || ret == -EAGAIN);
	if (ret < 0)
		return st_tier_set_error(t, ret, "nvme: io_uring_submit: %s", strerror(-ret));
	return 0;
}

/* Room in the done ring for every request in flight plus n more. */
static int nvme_done_reserve(struct nvme_priv *p, unsigned n)
{
	unsigned cap = p->done_cap;
	struct st_tier_cqe *d;

	while (cap < p->nreqs + n)
		cap *= 2;
	if (cap == p->done_cap)
		return 0;
	d = malloc(cap * sizeof(*d));
	if (!d)
		return -ENOMEM;
	for (unsigned i = 0; i < p->done_len; i++)
		d[i] = p->done[(p->done_head + i) % p->done_cap];
	free(p->done);
	p->done = d;
	p->done_cap = cap;
	p->done_head = 0;
	return 0;
}

static int nvme_submit(struct st_tier *t, const struct st_tier_io *ios, unsigned n)
{
	struct nvme_priv *p = st_tier_priv(t);
	struct nvme_req *first = NULL, *last = NULL;

	/* Records for all n first, so a failure queues nothing. */
	if (nvme_done_reserve(p, n) < 0)
		return -ENOMEM;
	for (unsigned i = 0; i < n; i++) {
		struct nvme_req *r = p->req_free;

		if (r)
			p->req_free = r->next;
		else
			r = malloc(sizeof(*r));
		if (!r) {
			while (first) {
				r = first->next;
				first->next = p->req_free;
				p->req_free = first;
				first = r;
			}
			return -ENOMEM;
		}
		*r = (struct nvme_req){ .user = ios[i].user, .op = ios[i].op,
					.off_bytes = ios[i].ext_off_bytes,
					.len_bytes = ios[i].len_bytes, .buf = ios[i].buf };
		if (last)
			last->next = r;
		else
			first = r;
		last = r;
	}
	if (!first)
		return 0;
	p->nreqs += n;
	if (p->pending_tail)
		p->pending_tail->next = first;
	else
		p->pending_head = first;
	p->pending_tail = last;
	if (nvme_fill(p))
		return nvme_submit_ring(t, p);
	return 0;
}

static void nvme_slot_finish(struct nvme_priv *p, unsigned idx)
{
	struct nvme_slot *s = &p->slots[idx];
	struct nvme_req *r = s->req;

	p->free_slots[p->nfree_slots++] = idx;
	r->outstanding--;
	if (r->outstanding == 0 && r->issued_bytes == r->len_bytes) {
		p->done[(p->done_head + p->done_len++) % p->done_cap] =
			(struct st_tier_cqe){ r->user, r->err ? r->err : (int64_t)r->len_bytes };
		r->next = p->req_free;
		p->req_free = r;
	}
}

/* Handle one CQE. Returns the number of SQEs it prepared (resubmits). */
static unsigned nvme_complete(struct st_tier *t, struct nvme_priv *p,
			      struct io_uring_cqe *cqe)
{
	unsigned idx = (unsigned)io_uring_cqe_get_data64(cqe);
	struct nvme_slot *s = &p->slots[idx];
	int res = cqe->res;
	uint32_t left = s->len_bytes - s->done_bytes;

	p->cqe_count++;
	if (res > 0 && (uint32_t)res == left && p->short_every &&
	    p->cqe_count % p->short_every == 0 && left >= 2 * st_tier_align(t)) {
		/* Test hook: pretend the kernel moved only the first half. */
		res = (int)((left / 2) & ~(uint32_t)(st_tier_align(t) - 1));
	}
	if (res == -EINTR || res == -EAGAIN) {
		nvme_prep_slot(p, idx);
		return 1;
	}
	if (res > 0 && (uint32_t)res < left) {
		s->done_bytes += (uint32_t)res;
		nvme_prep_slot(p, idx);
		return 1;
	}
	if (res == 0 && left) {
		res = -EIO; /* no progress: end of file where there must be data */
	}
	if (res < 0) {
		uint64_t off = s->foff_bytes + s->done_bytes;

		/* The request's first failure is the one worth reading. */
		if (!s->req->err) {
			s->req->err = res;
			st_tier_set_error(t, res, "nvme: %s %s (unlinked) offset %llu: %s",
					  s->req->op == ST_IO_READ ? "read" : "write",
					  p->paths[s->file], (unsigned long long)off,
					  strerror(-res));
		}
	} else {
		s->done_bytes = s->len_bytes;
	}
	nvme_slot_finish(p, idx);
	return 0;
}

static int nvme_reap(struct st_tier *t, struct st_tier_cqe *out, unsigned max,
		     unsigned min_wait)
{
	struct nvme_priv *p = st_tier_priv(t);
	unsigned got = 0;
	int ret;

	for (;;) {
		struct io_uring_cqe *cqe;
		unsigned head, seen = 0, prepped = 0;

		io_uring_for_each_cqe(&p->ring, head, cqe) {
			prepped += nvme_complete(t, p, cqe);
			seen++;
		}
		io_uring_cq_advance(&p->ring, seen);
		prepped += nvme_fill(p);
		if (prepped) {
			ret = nvme_submit_ring(t, p);
			if (ret < 0)
				return ret;
		}
		while (got < max && p->done_len) {
			out[got++] = p->done[p->done_head];
			p->done_head = (p->done_head + 1) % p->done_cap;
			p->done_len--;
			p->nreqs--;
		}
		if (got >= min_wait || got == max)
			return (int)got;
		if (p->nfree_slots == p->qd && !p->pending_head && !p->done_len)
			return (int)got; /* nothing in flight at all */
		ret = io_uring_wait_cqe(&p->ring, &cqe);
		if (ret < 0 && ret != -EINTR)
			return st_tier_set_error(t, ret, "nvme: io_uring_wait_cqe: %s",
						 strerror(-ret));
	}
}

static int nvme_register_buffers(struct st_tier *t, const struct st_tier_buffer *b,
				 unsigned n)
{
	/* io_uring takes at most 1 GiB per registered buffer: larger ones go
	 * in 1 GiB pieces (a transfer across two pieces is not fixed I/O). */
	const size_t piece = 1ul << 30;
	struct nvme_priv *p = st_tier_priv(t);
	unsigned k = 0;
	int ret;

	if (p->nbufs)
		io_uring_unregister_buffers(&p->ring);
	p->nbufs = 0;
	for (unsigned i = 0; i < n; i++)
		for (size_t off = 0; off < b[i].bytes; off += piece) {
			if (k == NVME_MAX_BUFFERS)
				return st_error_set(-EINVAL,
						    "nvme: more than %d GiB of I/O buffers to register",
						    NVME_MAX_BUFFERS);
			p->bufs[k++] = (struct iovec){ (char *)b[i].base + off,
						       ST_MIN(piece, b[i].bytes - off) };
		}
	ret = io_uring_register_buffers(&p->ring, p->bufs, k);
	if (ret < 0) {
		/* Not fatal: plain reads and writes still work. */
		st_warn("nvme: cannot register %u I/O buffers (%s); using unregistered I/O",
			k, strerror(-ret));
		return 0;
	}
	p->nbufs = k;
	return 0;
}

static void nvme_unregister_buffers(struct st_tier *t)
{
	struct nvme_priv *p = st_tier_priv(t);

	if (p->nbufs)
		io_uring_unregister_buffers(&p->ring);
	p->nbufs = 0;
}

static int nvme_sync(struct st_tier *t)
{
	struct nvme_priv *p = st_tier_priv(t);

	for (unsigned i = 0; i < p->nfiles; i++)
		if (fdatasync(p->fds[i]) < 0)
			return st_tier_set_error(t, -errno, "nvme: fdatasync %s: %s", p->paths[i],
						 strerror(errno));
	return 0;
}

static const char *nvme_describe(struct st_tier *t)
{
	struct nvme_priv *p = st_tier_priv(t);
	char b[32], bs[32];

	snprintf(p->desc, sizeof(p->desc), "nvme, %s in %u file%s, %s, block %s, qd %u%s",
		 st_format_bytes(p->file_bytes * p->nfiles, b, sizeof(b)), p->nfiles,
		 p->nfiles == 1 ? "" : "s", p->direct ? "O_DIRECT" : "buffered",
		 st_format_bytes(p->block_bytes, bs, sizeof(bs)), p->qd,
		 p->nbufs ? ", fixed buffers" : "");
	return p->desc;
}

/* The file and the offset in it of a byte of the tier, as nvme_fill cuts
 * requests into blocks (block b in file b mod n at (b div n) x block). */
static int nvme_where(struct st_tier *t, uint64_t off_bytes, char *buf, size_t len)
{
	struct nvme_priv *p = st_tier_priv(t);
	uint64_t blk = off_bytes / p->block_bytes, within = off_bytes % p->block_bytes;

	snprintf(buf, len, "%s (unlinked) offset %llu", p->paths[blk % p->nfiles],
		 (unsigned long long)((blk / p->nfiles) * p->block_bytes + within));
	return 0;
}

const struct st_tier_ops st_tier_nvme_ops = {
	.name = "nvme",
	.kind = ST_TIER_NVME,
	.priv_bytes = sizeof(struct nvme_priv),
	.open = nvme_open,
	.close = nvme_close,
	.submit = nvme_submit,
	.reap = nvme_reap,
	.register_buffers = nvme_register_buffers,
	.unregister_buffers = nvme_unregister_buffers,
	.sync = nvme_sync,
	.describe = nvme_describe,
	.where = nvme_where,
};

/* The vram tier: extents of the device's arena, moved with the device's
 * asynchronous copies (cudaMemcpyAsync on the cuda device, the copy thread
 * on the cpu device). Writes go on the h2d queue, reads on the d2h queue,
 * each followed by an event; reap polls the events. A request's `after`
 * event becomes a wait on its queue, ahead of the copy; its `done` event is
 * recorded right after the copy. */
#include "tier_impl.h"
#include "strata/device.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

struct vram_op {
	void *user;
	int64_t res;     /* len_bytes, or -errno when the copy could not queue */
	struct st_event *ev;
};

struct vram_priv {
	struct st_device *dev;  /* borrowed */
	char *arena;            /* device address of the tier's byte 0 */
	struct st_queue *h2d, *d2h;
	struct vram_op *ops;    /* in flight, in submission order */
	unsigned nops, cap;
	struct st_event **ev_free;
	unsigned nev_free, nev;
	char desc[128];
};

static int vram_open(struct st_tier *t, const struct st_tier_config *cfg,
		     uint64_t *align_bytes)
{
	struct vram_priv *v = st_tier_priv(t);
	uint64_t arena_bytes;
	int ret;

	if (!cfg->device)
		return st_error_set(-EINVAL, "vram tier: no device given");
	v->dev = cfg->device;
	v->arena = st_device_arena(v->dev, &arena_bytes);
	if (cfg->budget_bytes > arena_bytes)
		return st_error_set(-ENOMEM,
				    "vram tier: budget of %llu bytes exceeds the %s device's arena of %llu",
				    (unsigned long long)cfg->budget_bytes, st_device_name(v->dev),
				    (unsigned long long)arena_bytes);
	ret = st_queue_create(v->dev, &v->h2d);
	if (ret == 0)
		ret = st_queue_create(v->dev, &v->d2h);
	if (ret < 0) {
		st_queue_destroy(v->dev, v->h2d);
		return ret;
	}
	*align_bytes = 256; /* cudaMalloc alignment; enough for every kernel */
	return 0;
}

static void vram_close(struct st_tier *t)
{
	struct vram_priv *v = st_tier_priv(t);

	st_queue_destroy(v->dev, v->h2d);
	st_queue_destroy(v->dev, v->d2h);
	for (unsigned i = 0; i < v->nev_free; i++)
		st_event_destroy(v->dev, v->ev_free[i]);
	free(v->ev_free);
	free(v->ops);
}

static int vram_reserve(struct vram_priv *v, unsigned n)
{
	unsigned cap = v->cap ? v->cap : 32;

	while (cap < v->nops + n)
		cap *= 2;
	if (cap != v->cap) {
		struct vram_op *o = realloc(v->ops, cap * sizeof(*o));
		struct st_event **e = realloc(v->ev_free, cap * sizeof(*e));

		if (o)
			v->ops = o;
		if (e)
			v->ev_free = e;
		if (!o || !e)
			return -ENOMEM;
		v->cap = cap;
	}
	/* Enough events for everything that can be in flight. */
	while (v->nev_free < n) {
		int ret = st_event_create(v->dev, &v->ev_free[v->nev_free]);

		if (ret < 0)
			return ret;
		v->nev_free++;
		v->nev++;
	}
	return 0;
}

static int vram_submit(struct st_tier *t, const struct st_tier_io *ios, unsigned n)
{
	struct vram_priv *v = st_tier_priv(t);
	int ret = vram_reserve(v, n);

	if (ret < 0)
		return ret;
	for (unsigned i = 0; i < n; i++) {
		const struct st_tier_io *io = &ios[i];
		char *dptr = v->arena + io->ext_off_bytes;
		struct st_queue *q = io->op == ST_IO_WRITE ? v->h2d : v->d2h;
		struct vram_op *op = &v->ops[v->nops];

		ret = io->after ? st_queue_wait(v->dev, q, io->after) : 0;
		if (ret == 0 && io->op == ST_IO_WRITE)
			ret = st_device_memcpy_async(v->dev, q, dptr, io->buf, io->len_bytes,
						     ST_COPY_H2D);
		else if (ret == 0)
			ret = st_device_memcpy_async(v->dev, q, io->buf, dptr, io->len_bytes,
						     ST_COPY_D2H);
		op->ev = v->ev_free[--v->nev_free];
		if (ret == 0 && io->done)
			ret = st_event_record(v->dev, io->done, q);
		if (ret == 0)
			ret = st_event_record(v->dev, op->ev, q);
		if (ret < 0) {
			/* Earlier ones are queued on the device: report this one
			 * as failed through reap rather than unwind. */
			st_tier_set_error(t, ret, "vram: copy of %llu bytes at %llu: %s",
					  (unsigned long long)io->len_bytes,
					  (unsigned long long)io->ext_off_bytes, st_error_last());
		}
		op->user = io->user;
		op->res = ret < 0 ? ret : (int64_t)io->len_bytes;
		v->nops++;
	}
	return 0;
}

static int vram_reap(struct st_tier *t, struct st_tier_cqe *out, unsigned max,
		     unsigned min_wait)
{
	struct vram_priv *v = st_tier_priv(t);
	unsigned got = 0;

	while (got < max && v->nops) {
		unsigned i = 0, kept = 0;

		for (i = 0; i < v->nops; i++) {
			struct vram_op *op = &v->ops[i];
			int q = got >= max ? 0 : op->res < 0 ? 1 : st_event_query(v->dev, op->ev);

			if (q != 0) {
				out[got].user = op->user;
				out[got].res = q < 0 ? q : op->res;
				got++;
				v->ev_free[v->nev_free++] = op->ev;
			} else {
				v->ops[kept++] = *op;
			}
		}
		v->nops = kept;
		if (got >= min_wait || !v->nops)
			break;
		/* Block on the oldest; the others are likely done by then. */
		st_event_sync(v->dev, v->ops[0].ev);
	}
	return (int)got;
}

/* Device address (not a host one, unless the device is unified). */
static void *vram_addr(struct st_tier *t, uint64_t off_bytes)
{
	struct vram_priv *v = st_tier_priv(t);

	return v->arena + off_bytes;
}

static const char *vram_describe(struct st_tier *t)
{
	struct vram_priv *v = st_tier_priv(t);
	char b[32];

	snprintf(v->desc, sizeof(v->desc), "vram on the %s device, %s",
		 st_device_name(v->dev), st_format_bytes(st_tier_budget(t), b, sizeof(b)));
	return v->desc;
}

const struct st_tier_ops st_tier_vram_ops = {
	.name = "vram",
	.kind = ST_TIER_VRAM,
	.priv_bytes = sizeof(struct vram_priv),
	.open = vram_open,
	.close = vram_close,
	.submit = vram_submit,
	.reap = vram_reap,
	.addr = vram_addr,
	.describe = vram_describe,
};

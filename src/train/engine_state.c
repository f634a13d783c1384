/* State access between steps (tests, checkpoints, --init) and the stats. */
#include "engine_internal.h"
#include "strata/kernels.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The bytes a synchronous read (rw 0) or write (1) of a shard in home h
 * moved on its link, counted with the step's (only st_eng_w_from_p()
 * runs inside a step; between steps the next step's count starts over). */
static void sync_bytes(struct st_engine *e, enum st_home h, int rw, uint64_t len)
{
	if (h != ST_HOME_HOST)
		e->lanes.busy[h == ST_HOME_NVME ? (rw ? ST_LANE_NVME_WRITE : ST_LANE_NVME_READ)
						: (rw ? ST_LANE_H2D : ST_LANE_D2H)].bytes += len;
}

/* Shard (u, s) into buf; from nvme, checked against its sums. */
static int shard_read(struct st_engine *e, int u, enum st_state s, void *buf)
{
	struct shard *x = shard(e, u, s);
	int ret;

	if (x->home == ST_HOME_HOST) {
		memcpy(buf, haddr(e, &x->ext), x->ext.len_bytes);
		return 0;
	}
	sync_bytes(e, x->home, 0, x->ext.len_bytes);
	ret = st_tier_read_sync(e->tier[x->home], &x->ext, 0, buf, x->ext.len_bytes);
	if (ret == 0 && x->home == ST_HOME_NVME)
		ret = st_eng_sums_check(e, u, s, 0, buf, x->ext.len_bytes);
	return ret;
}

/* len bytes of buf into shard (u, s) at off; to nvme, summed. */
static int shard_write_at(struct st_engine *e, int u, enum st_state s, uint64_t off,
			  const void *buf, uint64_t len)
{
	struct shard *x = shard(e, u, s);

	if (x->home == ST_HOME_HOST) {
		memcpy((char *)haddr(e, &x->ext) + off, buf, len);
		return 0;
	}
	if (x->home == ST_HOME_NVME)
		st_eng_sums_put(e, u, s, off, buf, len);
	sync_bytes(e, x->home, 1, len);
	return st_tier_write_sync(e->tier[x->home], &x->ext, off, buf, len);
}

/* buf into shard (u, s); to nvme, summed. */
static int shard_write(struct st_engine *e, int u, enum st_state s, const void *buf)
{
	return shard_write_at(e, u, s, 0, buf, shard(e, u, s)->ext.len_bytes);
}

int st_engine_shard(const struct st_engine *e, int u, enum st_state s, enum st_home *home,
		    struct st_extent *ext)
{
	if (u < 0 || u >= e->n_units || (unsigned)s >= ST_STATE_COUNT)
		return -EINVAL;
	*home = e->shards[u * ST_STATE_COUNT + s].home;
	*ext = e->shards[u * ST_STATE_COUNT + s].ext;
	return 0;
}

/* Bytes of one element of state s. */
static size_t elem_bytes(const struct st_engine *e, enum st_state s)
{
	return st_eng_eb(e, s);
}

static bool mv_compact(const struct st_engine *e, enum st_state s)
{
	return (s == ST_STATE_M || s == ST_STATE_V) && e->mv_state != ST_OPTIM_STATE_F32;
}

/* Compact M or V of unit u (its shard's bytes, from unit offset 0: world
 * 1) to and from fp32, by the sweep's AdamW calls (st_eng_mv_segments()),
 * so q8's blocks and scales are the ones the sweep uses. The padding
 * between tensors is 0 in fp32 and code 0 compact. A conversion of the
 * decoded values encodes back to the same codes (tests/optim, "round
 * trip"): a checkpoint stores M and V in fp32 and a resume re-encodes. */
struct mv_conv {
	struct st_engine *e;
	int u;
	enum st_state s;
	void *codes;
	float *f32;
	bool to_f32;
};

static int mv_conv_seg(void *arg, uint64_t a, uint64_t b, bool decay)
{
	struct mv_conv *c = arg;
	struct st_adam_bufs bufs = { 0 };
	uint64_t n = b - a;
	/* the other moment's side of st_optim_state_load/store: scratch */
	float *tmp = calloc(n, sizeof(float)), *scl = calloc(n / ST_Q8_BLOCK + 1, sizeof(float));
	void *other = calloc(n, (size_t)c->e->mv_elem_bytes);
	int ret = 0;

	ST_UNUSED(decay);
	if (!tmp || !scl || !other) {
		ret = -ENOMEM;
		goto out;
	}
	st_eng_mv_bufs(c->e, c->u, a, 0, c->codes, c->codes, &bufs);
	if (c->s == ST_STATE_M) {
		bufs.vc = other;
		bufs.v_scale = scl;
	} else {
		bufs.mc = other;
		bufs.m_scale = scl;
	}
	if (c->to_f32)
		st_optim_state_load(&bufs, n, c->s == ST_STATE_M ? c->f32 + a : tmp,
				    c->s == ST_STATE_M ? tmp : c->f32 + a);
	else
		st_optim_state_store(&bufs, n, c->s == ST_STATE_M ? c->f32 + a : tmp,
				     c->s == ST_STATE_M ? tmp : c->f32 + a);
out:
	free(tmp);
	free(scl);
	free(other);
	return ret;
}

static int mv_convert(struct st_engine *e, int u, enum st_state s, void *codes, float *f32,
		      bool to_f32)
{
	struct mv_conv c = { .e = e, .u = u, .s = s, .codes = codes, .f32 = f32,
			     .to_f32 = to_f32 };

	if (to_f32)
		memset(f32, 0, e->unit_elems[u] * sizeof(float));
	else
		memset(codes, 0, e->padded_elems[u] * (size_t)e->mv_elem_bytes);
	return st_eng_mv_segments(e, u, 0, e->unit_elems[u], mv_conv_seg, &c);
}

/* At world > 1 a sharded state is read from every rank: each puts its
 * slice in its place and the slices are gathered (collective: every rank
 * reads the same states in the same order). */
int st_engine_read_state(struct st_engine *e, int u, enum st_state s, float *dst)
{
	char *tmp = NULL;
	size_t eb = elem_bytes(e, s), lo;
	int ret;

	if (u < 0 || u >= e->n_units)
		return -EINVAL;
	if (e->cfg.forward_only && s != ST_STATE_W)
		return st_error_set(-EINVAL, "engine: the forward alone holds W only");
	lo = sh_lo(e, u, s) * eb;
	st_eng_drain(e);
	if (e->err) /* a store that landed failed: the state read is not it */
		return st_error_set(e->err, "%s", e->errmsg);
	if (posix_memalign((void **)&tmp, ST_PAGE_BYTES,
			   st_align_up(e->padded_elems[u] * eb, ST_PAGE_BYTES)))
		return -ENOMEM;
	ret = shard_read(e, u, s, tmp + lo);
	if (ret == 0 && st_plan_sharded(&e->plan, s)) {
		ret = st_eng_zero_gather_host(e, tmp, e->slice_elems[u],
					      eb == 2 ? ST_COMM_BF16 : ST_COMM_F32);
	}
	if (ret == 0 && mv_compact(e, s))
		ret = mv_convert(e, u, s, tmp, dst, true);
	else if (ret == 0) {
		if (s == ST_STATE_W && e->w_elem_bytes == 2)
			st_cpu_bf16_to_f32(dst, (const uint16_t *)(const void *)tmp,
					   e->unit_elems[u]);
		else
			memcpy(dst, tmp, e->unit_elems[u] * sizeof(float));
	}
	free(tmp);
	return ret;
}

/* This rank's range of unit u's state s (fp32: G, P, M, V), elements
 * [*lo, *lo + *n) of the unit, into buf (at least the padded unit): its
 * slice at world > 1 (cut at the unit's end; sharded or not, the ranks'
 * ranges cover the unit once), the unit at world 1. Reads only this
 * rank's shard: nothing is exchanged. */
int st_eng_read_own(struct st_engine *e, int u, enum st_state s, float *buf, uint64_t *lo,
		    uint64_t *n)
{
	uint64_t first = e->world == 1 ? 0 : (uint64_t)e->rank * e->slice_elems[u];
	uint64_t count = first >= e->unit_elems[u] ? 0
			 : ST_MIN(e->world == 1 ? e->unit_elems[u] : e->slice_elems[u],
				  e->unit_elems[u] - first);
	int ret;

	assert(s != ST_STATE_W);
	st_eng_drain(e);
	if (e->err)
		return st_error_set(e->err, "%s", e->errmsg);
	if (mv_compact(e, s)) { /* world 1: the unit, decoded to fp32 */
		char *codes = NULL;

		if (posix_memalign((void **)&codes, ST_PAGE_BYTES,
				   st_align_up(e->padded_elems[u] * elem_bytes(e, s), ST_PAGE_BYTES)))
			return -ENOMEM;
		ret = shard_read(e, u, s, codes);
		if (ret == 0)
			ret = mv_convert(e, u, s, codes, buf, true);
		free(codes);
		*lo = first;
		*n = count;
		return ret;
	}
	ret = shard_read(e, u, s, buf);
	if (ret == 0 && !st_plan_sharded(&e->plan, s) && first)
		memmove(buf, buf + first, count * sizeof(float));
	*lo = first;
	*n = count;
	return ret;
}

/* Each rank writes its shard of each state from the whole unit given. */
int st_engine_write_state(struct st_engine *e, int u, const float *p, const float *m,
			  const float *v)
{
	char *buf = NULL;
	uint64_t bytes, pad_bytes;
	int ret;

	if (u < 0 || u >= e->n_units || !p)
		return -EINVAL;
	bytes = e->unit_elems[u] * sizeof(float);
	pad_bytes = e->padded_elems[u] * sizeof(float);
	st_eng_drain(e);
	if (posix_memalign((void **)&buf, ST_PAGE_BYTES, pad_bytes))
		return -ENOMEM;
	memset(buf + bytes, 0, pad_bytes - bytes); /* a padded unit's tail */
	memcpy(buf, p, bytes);
	/* the forward alone holds W only */
	ret = e->cfg.forward_only ? 0
				  : shard_write(e, u, ST_STATE_P, buf + sh_lo(e, u, ST_STATE_P) * 4);
	for (enum st_state s = ST_STATE_M; ret == 0 && !e->cfg.forward_only && s <= ST_STATE_V;
	     s++) {
		const float *src = s == ST_STATE_M ? m : v;

		if (src)
			memcpy(buf, src, bytes);
		else
			memset(buf, 0, bytes);
		if (mv_compact(e, s)) { /* world 1: encoded as the sweep does */
			char *codes = NULL;

			if (posix_memalign((void **)&codes, ST_PAGE_BYTES, pad_bytes)) {
				ret = -ENOMEM;
				break;
			}
			memset(codes, 0, pad_bytes);
			ret = mv_convert(e, u, s, codes, (float *)(void *)buf, false);
			if (ret == 0)
				ret = shard_write(e, u, s, codes);
			free(codes);
			continue;
		}
		ret = shard_write(e, u, s, buf + sh_lo(e, u, s) * 4);
	}
	if (ret == 0) {
		memset(buf, 0, pad_bytes);
		if (e->w_elem_bytes == 2)
			st_cpu_f32_to_bf16((uint16_t *)(void *)buf, p, e->unit_elems[u]);
		else
			memcpy(buf, p, bytes);
		ret = shard_write(e, u, ST_STATE_W,
				  buf + sh_lo(e, u, ST_STATE_W) * (size_t)e->w_elem_bytes);
	}
	free(buf);
	return ret;
}

/* --update in-backward, a skipped step: W is P's rounding, as
 * st_engine_write_state() and AdamW write it. Both shards are the rank's
 * same elements (world 1 and stage 0: the unit, padded at world > 1;
 * stage 3: the rank's slice), or (stages 1-2) W's holds the padded unit
 * and P's the rank's slice of it: only that slice of W is written (the
 * speculation wrote no other). P's padding is zero, and so W's. */
int st_eng_w_from_p(struct st_engine *e, int u)
{
	struct shard *p = shard(e, u, ST_STATE_P), *w = shard(e, u, ST_STATE_W);
	char *pb = NULL, *wb = NULL;
	uint64_t n;
	int ret = -ENOMEM;

	st_eng_drain(e);
	if (posix_memalign((void **)&pb, ST_PAGE_BYTES, p->ext.len_bytes) ||
	    posix_memalign((void **)&wb, ST_PAGE_BYTES, w->ext.len_bytes))
		goto out;
	ret = shard_read(e, u, ST_STATE_P, pb);
	if (ret < 0)
		goto out;
	n = ST_MIN(e->unit_elems[u] - ST_MIN(e->unit_elems[u], sh_lo(e, u, ST_STATE_P)),
		   sh_elems(e, u, ST_STATE_P));
	memset(wb, 0, w->ext.len_bytes);
	if (e->w_elem_bytes == 2)
		st_cpu_f32_to_bf16((uint16_t *)(void *)wb, (const float *)(void *)pb, n);
	else
		memcpy(wb, pb, n * sizeof(float));
	if (sh_elems(e, u, ST_STATE_W) == sh_elems(e, u, ST_STATE_P)) {
		assert(sh_lo(e, u, ST_STATE_W) == sh_lo(e, u, ST_STATE_P));
		ret = shard_write(e, u, ST_STATE_W, wb);
	} else {
		assert(sh_lo(e, u, ST_STATE_W) == 0 && e->zero.w_gather);
		ret = shard_write_at(e, u, ST_STATE_W,
				     sh_lo(e, u, ST_STATE_P) * (uint64_t)e->w_elem_bytes, wb,
				     sh_elems(e, u, ST_STATE_P) * (uint64_t)e->w_elem_bytes);
	}
out:
	free(pb);
	free(wb);
	return ret;
}

void st_engine_get_stats(const struct st_engine *e, struct st_engine_stats *s)
{
	*s = e->last_stats;
	for (int h = 0; h < ST_HOME_COUNT; h++) {
		struct st_tier_stats ts;

		s->has_tier[h] = e->tier[h] != NULL;
		if (!e->tier[h])
			continue;
		st_tier_get_stats(e->tier[h], &ts);
		s->used_bytes[h] = ts.used_bytes;
		s->peak_bytes[h] = ts.peak_bytes;
		s->budget_bytes[h] = h == ST_HOME_VRAM ? e->cfg.gpu_mem_bytes
				   : h == ST_HOME_HOST ? e->cfg.host_mem_bytes
				   : e->cfg.nvme_mem_bytes ? e->cfg.nvme_mem_bytes
							   : e->plan.total_bytes[h];
	}
}

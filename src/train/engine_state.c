/* State access between steps (tests, checkpoints, --init) and the stats. */
#include "engine_internal.h"
#include "strata/kernels.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Shard (u, s) into buf; from nvme, checked against its sums. */
static int shard_read(struct st_engine *e, int u, enum st_state s, void *buf)
{
	struct shard *x = shard(e, u, s);
	int ret;

	if (x->home == ST_HOME_HOST) {
		memcpy(buf, haddr(e, &x->ext), x->ext.len_bytes);
		return 0;
	}
	ret = st_tier_read_sync(e->tier[x->home], &x->ext, 0, buf, x->ext.len_bytes);
	if (ret == 0 && x->home == ST_HOME_NVME)
		ret = st_eng_sums_check(e, u, s, 0, buf, x->ext.len_bytes);
	return ret;
}

/* buf into shard (u, s); to nvme, summed. */
static int shard_write(struct st_engine *e, int u, enum st_state s, const void *buf)
{
	struct shard *x = shard(e, u, s);

	if (x->home == ST_HOME_HOST) {
		memcpy(haddr(e, &x->ext), buf, x->ext.len_bytes);
		return 0;
	}
	if (x->home == ST_HOME_NVME)
		st_eng_sums_put(e, u, s, 0, buf, x->ext.len_bytes);
	return st_tier_write_sync(e->tier[x->home], &x->ext, 0, buf, x->ext.len_bytes);
}

int st_engine_shard(const struct st_engine *e, int u, enum st_state s, enum st_home *home,
		    struct st_extent *ext)
{
	if (u < 0 || u >= e->U || (unsigned)s >= ST_STATE_COUNT)
		return -EINVAL;
	*home = e->sh[u * ST_STATE_COUNT + s].home;
	*ext = e->sh[u * ST_STATE_COUNT + s].ext;
	return 0;
}

int st_engine_read_state(struct st_engine *e, int u, enum st_state s, float *dst)
{
	struct shard *x;
	void *tmp = NULL;
	int ret;

	if (u < 0 || u >= e->U)
		return -EINVAL;
	x = shard(e, u, s);
	st_eng_drain(e);
	if (posix_memalign(&tmp, ST_PAGE_BYTES, x->ext.len_bytes))
		return -ENOMEM;
	ret = shard_read(e, u, s, tmp);
	if (ret == 0) {
		if (s == ST_STATE_W && e->Wb == 2)
			st_cpu_bf16_to_f32(dst, tmp, e->elems[u]);
		else
			memcpy(dst, tmp, e->elems[u] * sizeof(float));
	}
	free(tmp);
	return ret;
}

int st_engine_write_state(struct st_engine *e, int u, const float *p, const float *m,
			  const float *v)
{
	void *buf = NULL;
	uint64_t bytes;
	int ret;

	if (u < 0 || u >= e->U || !p)
		return -EINVAL;
	bytes = e->elems[u] * sizeof(float);
	st_eng_drain(e);
	if (posix_memalign(&buf, ST_PAGE_BYTES, bytes))
		return -ENOMEM;
	memcpy(buf, p, bytes);
	ret = shard_write(e, u, ST_STATE_P, buf);
	for (enum st_state s = ST_STATE_M; ret == 0 && s <= ST_STATE_V; s++) {
		const float *src = s == ST_STATE_M ? m : v;

		if (src)
			memcpy(buf, src, bytes);
		else
			memset(buf, 0, bytes);
		ret = shard_write(e, u, s, buf);
	}
	if (ret == 0) {
		if (e->Wb == 2)
			st_cpu_f32_to_bf16(buf, p, e->elems[u]);
		else
			memcpy(buf, p, bytes);
		ret = shard_write(e, u, ST_STATE_W, buf);
	}
	free(buf);
	return ret;
}

void st_engine_get_stats(const struct st_engine *e, struct st_engine_stats *s)
{
	*s = e->last;
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

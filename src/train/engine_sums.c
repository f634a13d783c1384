/* Checksums of the shards that live on nvme.
 *
 * Drives, filesystems and controllers do return wrong data (a misdirected
 * write, a flipped bit, a firmware bug), and a run keeps its state there
 * for days. So every write of a shard to nvme records the XXH3-64 of its
 * bytes here, in host memory (not beside the data, where a misdirected
 * write would carry its own checksum along), and every read is checked
 * before its bytes are used: a mismatch stops the run with -EIO and one
 * line naming the unit, the state, the file, the offset and both sums.
 *
 * The grain is the update tile (e->update.tile_elems elements): the update sweep reads
 * and writes one tile of a state at a time, and every other transfer moves
 * whole shards or, at world > 1, whole slices of one. A shard is cut into
 * segments -- the unit at world 1, each rank's slice of S_u elements at
 * world > 1 (one in a sharded state, N in an unsharded one: docs/zero.md)
 * -- and each segment into tiles from its start, its last tile shorter.
 * So a rank's tiles, which start at its slice and end with it, are whole
 * chunks whatever S_u is, and a shard of e_u elements at world 1 has
 * ceil(e_u / tile) sums, for each state on nvme.
 *
 * A tile's sum is the XXH3-64 of the XXH3-64s of its 256 KiB blocks (the
 * last may be shorter), so the blocks are hashed by all OpenMP threads at
 * once, each block while it is in the core's cache: hashing is then no
 * longer one thread's pass over every byte moved. */
#include "engine_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <xxhash.h>

#define ST_SUM_BLOCK_BYTES (256u << 10)

/* Blocks in the largest tile: ST_UPDATE_TILE_ELEMS fp32 values. */
#define ST_SUM_MAX_BLOCKS ((uint64_t)ST_UPDATE_TILE_ELEMS * 4 / ST_SUM_BLOCK_BYTES)

/* The sum of len bytes at p (see above); len is at most one tile. */
static uint64_t tile_sum(const void *p, uint64_t len)
{
	uint64_t nb = (len + ST_SUM_BLOCK_BYTES - 1) / ST_SUM_BLOCK_BYTES;
	uint64_t h[ST_SUM_MAX_BLOCKS];

	assert(nb >= 1 && nb <= ST_SUM_MAX_BLOCKS);
#pragma omp parallel for schedule(static) if (nb > 1)
	for (uint64_t b = 0; b < nb; b++)
		h[b] = XXH3_64bits((const char *)p + b * ST_SUM_BLOCK_BYTES,
				   ST_MIN((uint64_t)ST_SUM_BLOCK_BYTES, len - b * ST_SUM_BLOCK_BYTES));
	return XXH3_64bits(h, nb * sizeof(*h));
}

static uint64_t state_bytes(const struct st_engine *e, enum st_state s)
{
	return (uint64_t)st_eng_eb(e, s);
}

/* Elements of a segment of shard (u, s), and the chunks of one. */
static uint64_t seg_elems(const struct st_engine *e, int u, enum st_state s)
{
	return e->world == 1 ? sh_elems(e, u, s) : e->slice_elems[u];
}

static uint64_t seg_chunks(const struct st_engine *e, int u, enum st_state s)
{
	return (seg_elems(e, u, s) + e->update.tile_elems - 1) / e->update.tile_elems;
}

static uint64_t shard_chunks(const struct st_engine *e, int u, enum st_state s)
{
	uint64_t seg = seg_elems(e, u, s);

	return seg ? sh_elems(e, u, s) / seg * seg_chunks(e, u, s) : 0;
}

/* The chunk at element pos of shard (u, s): its index and its length
 * (elements). pos must start a chunk. */
static uint64_t chunk_at(const struct st_engine *e, int u, enum st_state s, uint64_t pos,
			 uint64_t *len)
{
	uint64_t seg = seg_elems(e, u, s), q = pos / seg, r = pos % seg;

	assert(r % e->update.tile_elems == 0);
	*len = ST_MIN(e->update.tile_elems, seg - r);
	return q * seg_chunks(e, u, s) + r / e->update.tile_elems;
}

static void sums_put(struct st_engine *e, uint64_t *v, int u, enum st_state s,
		     uint64_t off_bytes, const void *buf, uint64_t len_bytes);

/* The lanes' hooks on a shard's hops: what goes to nvme is summed as it
 * leaves, what comes back from nvme is checked before anything uses it. */
static void sums_hop_out(struct st_engine *e, const struct hop *h)
{
	if (h->tier != ST_HOME_NVME)
		return;
	if (h->alt) /* into the alternate extent: its own sums (a commit swaps) */
		sums_put(e, e->sums.alt_sums[h->unit * ST_STATE_COUNT + (int)h->state], h->unit,
			 h->state, h->off_bytes, h->buf, h->len_bytes);
	else
		st_eng_sums_put(e, h->unit, h->state, h->off_bytes, h->buf, h->len_bytes);
}

void st_eng_sums_swap(struct st_engine *e, int u, enum st_state s)
{
	int i = u * ST_STATE_COUNT + (int)s;
	uint64_t *t = e->sums.tile_sums[i];

	e->sums.tile_sums[i] = e->sums.alt_sums[i];
	e->sums.alt_sums[i] = t;
}

static int sums_hop_in(struct st_engine *e, const struct hop *h)
{
	if (h->tier != ST_HOME_NVME)
		return 0;
	return st_eng_sums_check(e, h->unit, h->state, h->off_bytes, h->buf, h->len_bytes);
}

int st_eng_sums_init(struct st_engine *e)
{
	e->lanes.hop_out = sums_hop_out;
	e->lanes.hop_in = sums_hop_in;
	e->sums.tile_sums = calloc((size_t)e->n_units * ST_STATE_COUNT, sizeof(*e->sums.tile_sums));
	e->sums.written = calloc((size_t)e->n_units * ST_STATE_COUNT, sizeof(*e->sums.written));
	e->sums.alt_sums = calloc((size_t)e->n_units * ST_STATE_COUNT, sizeof(*e->sums.alt_sums));
	if (!e->sums.tile_sums || !e->sums.written || !e->sums.alt_sums)
		return -ENOMEM;
	if (e->cfg.no_verify_reads)
		return 0;
	for (int u = 0; u < e->n_units; u++)
		for (enum st_state s = 0; s < ST_STATE_COUNT; s++) {
			uint64_t n = shard_chunks(e, u, s);

			if (shard(e, u, s)->home != ST_HOME_NVME)
				continue;
			e->sums.tile_sums[u * ST_STATE_COUNT + s] = calloc(n, sizeof(uint64_t));
			if (!e->sums.tile_sums[u * ST_STATE_COUNT + s])
				return -ENOMEM;
			if (!shard(e, u, s)->alt.len_bytes)
				continue;
			e->sums.alt_sums[u * ST_STATE_COUNT + s] = calloc(n, sizeof(uint64_t));
			if (!e->sums.alt_sums[u * ST_STATE_COUNT + s])
				return -ENOMEM;
		}
	return 0;
}

void st_eng_sums_fini(struct st_engine *e)
{
	for (int i = 0; e->sums.tile_sums && i < e->n_units * ST_STATE_COUNT; i++)
		free(e->sums.tile_sums[i]);
	for (int i = 0; e->sums.alt_sums && i < e->n_units * ST_STATE_COUNT; i++)
		free(e->sums.alt_sums[i]);
	free(e->sums.alt_sums);
	e->sums.alt_sums = NULL;
	free(e->sums.tile_sums);
	free(e->sums.written);
	e->sums.tile_sums = NULL;
	e->sums.written = NULL;
}

/* The sums of shard (u, s), NULL when not kept. A transfer [off, off +
 * len) covers whole chunks (the last may end with the shard). */
static uint64_t *sums_of(struct st_engine *e, int u, enum st_state s, uint64_t off,
			 uint64_t len)
{
	uint64_t eb = state_bytes(e, s), end = sh_elems(e, u, s) * eb;
	uint64_t *v = e->sums.tile_sums ? e->sums.tile_sums[u * ST_STATE_COUNT + s] : NULL;

	if (!v)
		return NULL;
	/* a compact M or V moves in whole pages past its elements */
	assert(off % eb == 0 && off + len <= st_align_up(end, ST_PAGE_BYTES));
	ST_UNUSED(len);
	ST_UNUSED(end);
	return v;
}

/* The sums of a write of shard (u, s)'s bytes into v (the shard's, or its
 * alternate extent's; NULL: none kept). */
static void sums_put(struct st_engine *e, uint64_t *v, int u, enum st_state s,
		     uint64_t off_bytes, const void *buf, uint64_t len_bytes)
{
	uint64_t eb = state_bytes(e, s), pos = off_bytes / eb, n;
	uint64_t end = ST_MIN(pos + len_bytes / eb, sh_elems(e, u, s));

	for (; v && pos < end; pos += n) {
		uint64_t i = chunk_at(e, u, s, pos, &n);

		assert(pos + n <= end || pos + n == sh_elems(e, u, s));
		n = ST_MIN(n, end - pos);
		v[i] = tile_sum((const char *)buf + (pos * eb - off_bytes), n * eb);
	}
}

void st_eng_sums_put(struct st_engine *e, int u, enum st_state s, uint64_t off_bytes,
		     const void *buf, uint64_t len_bytes)
{
	uint64_t *v = sums_of(e, u, s, off_bytes, len_bytes);

	sums_put(e, v, u, s, off_bytes, buf, len_bytes);
	if (v)
		e->sums.written[u * ST_STATE_COUNT + s] = true;
}

int st_eng_sums_check(struct st_engine *e, int u, enum st_state s, uint64_t off_bytes,
		      const void *buf, uint64_t len_bytes)
{
	uint64_t eb = state_bytes(e, s), pos = off_bytes / eb, n;
	uint64_t end = ST_MIN(pos + len_bytes / eb, sh_elems(e, u, s));
	uint64_t *v = sums_of(e, u, s, off_bytes, len_bytes);

	/* a shard never written holds what the tier was made with: nothing
	 * to hold it to (a G read before any backward) */
	if (v && !e->sums.written[u * ST_STATE_COUNT + s])
		return 0;
	for (; v && pos < end; pos += n) {
		uint64_t i = chunk_at(e, u, s, pos, &n), at = pos * eb - off_bytes, got;
		const struct st_unit_layout *l;
		char where[512];

		assert(pos + n <= end || pos + n == sh_elems(e, u, s));
		n = ST_MIN(n, end - pos);
		got = tile_sum((const char *)buf + at, n * eb);
		if (got == v[i])
			continue;
		l = st_model_unit_layout(e->model, u);
		st_tier_locate(e->tier[ST_HOME_NVME], &shard(e, u, s)->ext, pos * eb, where,
			       sizeof(where));
		return st_error_set(-EIO, "nvme: unit %d (%s...) state %s: %s: %llu bytes read "
				    "back have XXH3 %016" PRIx64 ", written %016" PRIx64
				    ": the drive returned other bytes than were written",
				    u, l->n_tensors ? l->tensors[0].name : "?", st_state_name(s),
				    where, (unsigned long long)(n * eb), got, v[i]);
	}
	return 0;
}

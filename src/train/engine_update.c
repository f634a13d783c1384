/* The update sweep: tile by tile in unit order, loading the next tile's G,
 * P, M, V (nvme -> host staging) while AdamW runs on this one; P, M, V go
 * back to nvme and the new W to its home (h2d for vram, nvme write, or in
 * place in host). Two staging sets in turn.
 *
 * A unit whose G, P, M, V live in vram (the optimizer on the device,
 * docs/gpu.md) has no tiles: its update is one ADAMW op per tensor on the
 * compute's queue, in unit order among the tiles, writing W in its vram
 * home; nothing of it crosses a link. Its G was gathered on the device too
 * (st_eng_dev_grad_in) and its sum of squares taken there; the bits are
 * the host placement's (the cpu compute runs the same st_adam_apply, the
 * cuda one a kernel held to it bit for bit). */
#include "engine_internal.h"
#include "strata/trace.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int spec_begin(struct st_engine *e);
static int spec_w_out(struct st_engine *e, int u);

/* Tiles are [t0, t0 + n) elements of unit u (struct utile), t0 and n
 * multiples of the tile (whole pages in bf16 and fp32) except where the
 * unit ends, so staging is bounded by the tile, not by the largest unit
 * (the embedding of a 50k vocabulary). */
static void *upd_ptr(struct st_engine *e, const struct utile *t, enum st_state s)
{
	struct shard *x = shard(e, t->u, s);

	if (t->set[s] == UPD_FINAL_G) {
		assert(s == ST_STATE_G && e->grad.final_u == t->u && t->t0 >= e->grad.final_lo);
		return e->grad.final_g + (t->t0 - e->grad.final_lo);
	}
	if (t->set[s] < 0)
		return (char *)haddr(e, &x->ext) + (t->t0 - sh_lo(e, t->u, s)) * st_eng_eb(e, s);
	return haddr(e, &e->update.sets[t->set[s]].ext[s]);
}

/* Whether state s of unit u goes through the staging: G, P, M, V when on
 * nvme; W when it is not written in place in host nor gathered. */
static bool upd_staged(const struct st_engine *e, int u, enum st_state s)
{
	enum st_home h = e->shards[u * ST_STATE_COUNT + s].home;

	if (s == ST_STATE_W)
		return h != ST_HOME_HOST && !e->zero.w_gather;
	return h == ST_HOME_NVME;
}

/* Whether unit u's new W slice goes to the gather buffer wgather[u & 1]
 * (stages 1-2 at world > 1): in the sweep, and in the speculation where
 * W's home is not the host (speculating, nothing is gathered: the slice
 * goes home alone, spec_w_out(); a host home takes it in place). */
static bool w_to_gather(const struct st_engine *e, int u)
{
	return e->zero.w_gather &&
	       !(e->update.spec_step &&
		 e->shards[u * ST_STATE_COUNT + ST_STATE_W].home == ST_HOME_HOST);
}

/* Whether unit u's new W goes to a vram home by h2d copies that the
 * compute, not the host, waits for (ev_wstore): the forward and backward
 * read W there, on the compute's queue. Not so with W gathered or
 * streamed (the comm queue reads it) nor with ST_HOST_WAITS=1. */
static bool wstore_on_device(const struct st_engine *e, int u)
{
	return !e->host_waits && !e->zero.w_gather && !e->zero.w_stream &&
	       e->shards[u * ST_STATE_COUNT + ST_STATE_W].home == ST_HOME_VRAM;
}

/* The next tile j > i with state s staged, or update.n_tiles. */
static int next_staged(const struct st_engine *e, int i, enum st_state s)
{
	do
		i++;
	while (i < e->update.n_tiles && e->update.tiles[i].set[s] < 0);
	return i;
}

/* Bytes of tile t of state s: a compact M or V in whole pages (the last
 * tile of a unit can end inside one; its shard and the staging buffer,
 * sized for fp32, hold the rest of the page). */
static uint64_t upd_len(const struct st_engine *e, const struct utile *t, enum st_state s)
{
	uint64_t b = t->n * st_eng_eb(e, s);

	return (s == ST_STATE_M || s == ST_STATE_V) && e->mv_elem_bytes != 4
		       ? st_align_up(b, ST_PAGE_BYTES) : b;
}

/* Load state s of tile j into its set's buffer. */
static int load_one(struct st_engine *e, int j, enum st_state s)
{
	const struct utile *t = &e->update.tiles[j];
	struct updset *us = &e->update.sets[t->set[s]];
	void *buf = haddr(e, &us->ext[s]);
	size_t eb = st_eng_eb(e, s);
	struct hop h = st_eng_shard_hop(e, "load", t->u, s, ST_IO_READ,
					(t->t0 - sh_lo(e, t->u, s)) * eb, buf, upd_len(e, t, s));

	assert(us->reads[s] == 0 && us->writes[s] == 0);
	if (e->cfg.poison_staging)
		memset(buf, 0xff, t->n * eb);
	if (e->cfg.trace) {
		char name[48];

		snprintf(name, sizeof(name), "load u%d %s", t->u, st_state_name(s));
		st_trace_instant(e->cfg.trace, e->trace.lane[ST_LANE_NVME_READ], name,
				 st_now_ns());
	}
	us->holder[s] = j;
	return st_eng_chain_start(e, &us->load[s], &h, 1, &us->reads[s], NULL);
}

/* Queue the loads of states [first, V] that may go now, at tile cur of
 * the sweep (the tiles before it are past AdamW): for each state, its
 * next tiles in turn while their buffer's last tile is before cur, once
 * that one's store has landed. With block, the store is waited for when
 * the tile to load is cur or the next one (as the two sets always were);
 * a tile further ahead, or any without block, is only queued when its
 * buffer is already free, so the AdamW of the units in host between (or
 * the backward) runs meanwhile. */
static int upd_issue(struct st_engine *e, int cur, enum st_state first, bool block)
{
	int ret = 0;

	for (enum st_state s = first; s <= ST_STATE_V && ret == 0; s++) {
		for (int j; ret == 0 && (j = e->update.next[s]) < e->update.n_tiles;) {
			struct updset *us = &e->update.sets[e->update.tiles[j].set[s]];

			if (us->holder[s] >= cur)
				break;
			if (us->writes[s] && (!block || j > cur + 1)) {
				ret = st_eng_pump(e, false);
				if (ret == 0 && us->writes[s])
					break;
			}
			if (ret == 0)
				ret = st_eng_wait_until(e, &us->writes[s], "store");
			if (ret == 0)
				ret = load_one(e, j, s);
			e->update.next[s] = next_staged(e, j, s);
		}
	}
	return ret;
}

static int upd_store(struct st_engine *e, const struct utile *t)
{
	uint64_t woff = (t->t0 - sh_lo(e, t->u, ST_STATE_W)) * (uint64_t)e->w_elem_bytes;
	uint64_t wlen = t->n * (uint64_t)e->w_elem_bytes;
	struct hop h;
	int ret;

	for (enum st_state s = ST_STATE_P; s <= ST_STATE_V; s++) {
		struct updset *us;

		if (t->set[s] < 0)
			continue;
		us = &e->update.sets[t->set[s]];
		h = st_eng_shard_hop(e, "store", t->u, s, ST_IO_WRITE,
				     (t->t0 - sh_lo(e, t->u, s)) * st_eng_eb(e, s),
				     haddr(e, &us->ext[s]), upd_len(e, t, s));
		/* speculating: the shard's alternate, committed later */
		if (e->update.spec_step) {
			h.ext = shard(e, t->u, s)->alt;
			h.alt = true;
		}
		ret = st_eng_chain_start(e, &us->store[s], &h, 1, &us->writes[s], NULL);
		if (ret < 0)
			return ret;
	}
	/* W in place in host, or (stages 1-2 at world > 1) gathered whole
	 * (unit_end) */
	if (t->set[ST_STATE_W] < 0)
		return 0;
	/* nvme: a write of the nvme tier; vram: an h2d copy */
	h = st_eng_shard_hop(e, "store", t->u, ST_STATE_W, ST_IO_WRITE, woff,
			     haddr(e, &e->update.sets[t->set[ST_STATE_W]].ext[ST_STATE_W]), wlen);
	if (wstore_on_device(e, t->u))
		h.done = e->update.ev_wstore;
	return st_eng_chain_start(e, &e->update.sets[t->set[ST_STATE_W]].store[ST_STATE_W], &h, 1,
				  &e->update.sets[t->set[ST_STATE_W]].writes[ST_STATE_W], NULL);
}

/* W's padding in the tile zeroed when W goes through staging (the buffer
 * served other tiles), so W's home holds the same bytes whatever the
 * placement. */
static void zero_padding(struct st_engine *e, const struct st_unit_layout *ul,
			 const struct utile *t, char *wout)
{
	uint64_t end = t->t0, t1 = t->t0 + t->n;

	for (int i = 0; i <= ul->n_tensors; i++) {
		uint64_t start = i < ul->n_tensors ? ul->tensors[i].offset_elems : ul->elems;

		start = ST_MIN(ST_MAX(start, t->t0), t1);
		if (start > end)
			memset(wout + (end - t->t0) * (size_t)e->w_elem_bytes, 0,
			       (start - end) * (size_t)e->w_elem_bytes);
		if (i < ul->n_tensors)
			end = ST_MIN(ST_MAX(ul->tensors[i].offset_elems + ul->tensors[i].n_elems,
					    t->t0), t1);
	}
}

int st_eng_mv_segments(struct st_engine *e, int u, uint64_t lo, uint64_t n,
		       int (*fn)(void *arg, uint64_t a, uint64_t b, bool decay), void *arg)
{
	const struct st_unit_layout *ul = st_model_unit_layout(e->model, u);
	uint64_t tile = e->update.tile_elems, hi = lo + n;
	int ret = 0;

	/* the sweep's tiles start at multiples of the tile from the rank's
	 * first element (world 1: the unit's) */
	for (uint64_t t0 = lo; t0 < hi && ret == 0; t0 += tile) {
		uint64_t t1 = ST_MIN(hi, t0 + tile);

		for (int i = 0; i < ul->n_tensors && ret == 0; i++) {
			const struct st_tensor_layout *tl = &ul->tensors[i];
			uint64_t a = ST_MAX(tl->offset_elems, t0);
			uint64_t b = ST_MIN(tl->offset_elems + tl->n_elems, t1);

			if (a < b)
				ret = fn(arg, a, b, tl->decay);
		}
	}
	return ret;
}

void st_eng_mv_bufs(const struct st_engine *e, int u, uint64_t a, uint64_t base, void *mbase,
		    void *vbase, struct st_adam_bufs *bufs)
{
	size_t eb = (size_t)e->mv_elem_bytes;

	bufs->state = e->mv_state;
	if (e->mv_state == ST_OPTIM_STATE_F32) {
		bufs->m = (float *)mbase + (a - base);
		bufs->v = (float *)vbase + (a - base);
		return;
	}
	bufs->mc = (char *)mbase + (a - base) * eb;
	bufs->vc = (char *)vbase + (a - base) * eb;
	if (e->mv_state == ST_OPTIM_STATE_Q8) {
		/* every call starts at a multiple of the tensor alignment */
		assert(a % ST_MODEL_TENSOR_ALIGN_ELEMS == 0);
		bufs->m_scale = e->q8_scale[0][u] + a / ST_MODEL_TENSOR_ALIGN_ELEMS;
		bufs->v_scale = e->q8_scale[1][u] + a / ST_MODEL_TENSOR_ALIGN_ELEMS;
	}
}

struct tile_call {
	struct st_engine *e;
	const struct utile *t;
	const struct st_adam_step *wd, *nowd;
	float *g, *p;
	void *m, *v;
	char *wout;
};

static int adam_seg(void *arg, uint64_t a, uint64_t b, bool decay)
{
	struct tile_call *c = arg;
	struct st_engine *e = c->e;
	size_t o = a - c->t->t0;
	struct st_adam_bufs bufs = {
		.g = c->g + o, .g_dtype = ST_OPTIM_F32, .p = c->p + o,
		.w = c->wout + o * (size_t)e->w_elem_bytes,
		.w_dtype = e->w_elem_bytes == 2 ? ST_OPTIM_BF16 : ST_OPTIM_F32,
	};

	st_eng_mv_bufs(e, c->t->u, a, c->t->t0, c->m, c->v, &bufs);
	return st_adam_apply(decay ? c->wd : c->nowd, &bufs, b - a, ST_ADAM_GRAD_CHECKED, NULL);
}

/* AdamW over one tile: each tensor's part of it, with or without weight
 * decay (st_eng_mv_segments(): the tile is one of the sweep's). */
static int adam_tile(struct st_engine *e, const struct utile *t,
		     const struct st_adam_step *wd, const struct st_adam_step *nowd)
{
	const struct st_unit_layout *ul = st_model_unit_layout(e->model, t->u);
	struct shard *w = shard(e, t->u, ST_STATE_W);
	bool gather = w_to_gather(e, t->u);
	bool in_place = t->set[ST_STATE_W] < 0 && !gather;
	uint64_t wb = (uint64_t)e->w_elem_bytes;
	char *wout = gather ? e->zero.wgather[t->u & 1] + t->t0 * wb
		     : in_place ? (char *)haddr(e, &w->ext) + (t->t0 - sh_lo(e, t->u, ST_STATE_W)) * wb
				: haddr(e, &e->update.sets[t->set[ST_STATE_W]].ext[ST_STATE_W]);
	struct tile_call c = {
		.e = e, .t = t, .wd = wd, .nowd = nowd, .g = upd_ptr(e, t, ST_STATE_G),
		.p = upd_ptr(e, t, ST_STATE_P), .m = upd_ptr(e, t, ST_STATE_M),
		.v = upd_ptr(e, t, ST_STATE_V), .wout = wout,
	};
	uint64_t t0 = st_now_ns();
	int ret;

	st_eng_lane_begin(e, ST_LANE_ADAM);
	if (!in_place)
		zero_padding(e, ul, t, wout);
	/* the tile is whole tiles of the sweep: one segment pass over it */
	assert(e->mv_state != ST_OPTIM_STATE_Q8 ||
	       (t->t0 - sh_lo(e, t->u, ST_STATE_P)) % e->update.tile_elems == 0);
	ret = st_eng_mv_segments(e, t->u, t->t0, t->n, adam_seg, &c);
	st_eng_lane_end(e, ST_LANE_ADAM, t0, 0, "adam");
	return ret;
}

/* The elements [lo, hi) of unit u this rank updates: its slice when P is
 * sharded, else the unit (padded at world > 1: tiles of an unsharded
 * shard then start where a rank's slice does). */
static void upd_range(const struct st_engine *e, int u, uint64_t *lo, uint64_t *hi)
{
	*lo = sh_lo(e, u, ST_STATE_P);
	*hi = e->world == 1 ? e->unit_elems[u] : *lo + sh_elems(e, u, ST_STATE_P);
}

/* The tile at t0 of unit u, up to hi: at world > 1 it stays inside one
 * rank's slice, the nvme checksums' segment (engine_sums.c), also where
 * a rank updates every slice of the padded unit (stage 0). */
static uint64_t tile_len(const struct st_engine *e, int u, uint64_t t0, uint64_t hi)
{
	uint64_t n = ST_MIN(e->update.tile_elems, hi - t0);

	if (e->world > 1)
		n = ST_MIN(n, (t0 / e->slice_elems[u] + 1) * e->slice_elems[u] - t0);
	return n;
}

static bool next_tile(const struct st_engine *e, struct utile *t)
{
	uint64_t lo, hi;

	if (t->u >= 0) {
		upd_range(e, t->u, &lo, &hi);
		if (t->t0 + t->n < hi) {
			t->t0 += t->n;
			t->n = tile_len(e, t->u, t->t0, hi);
			return true;
		}
	}
	do { /* units updated on the device have no tiles */
		if (++t->u >= e->n_units)
			return false;
	} while (opt_on_dev(e, t->u));
	upd_range(e, t->u, &lo, &hi);
	t->t0 = lo;
	t->n = tile_len(e, t->u, t->t0, hi);
	return true;
}

/* Once unit u's last tile's new W is stored (the W stores of both sets
 * landed), its new W is home: the next step's forward of u may run. Its
 * P, M and V may still be going back: the forward does not read them.
 * A W homed in vram is waited for on the compute instead (ev_wstore,
 * recorded after u's last store): the host goes on to the next unit's
 * AdamW while the copy lands, and every later op of the compute (the
 * forward of u, the backward of the last unit) runs after it. */
static int unit_done(struct st_engine *e, int u, const struct st_eng_fused_fwd *fwd)
{
	int ret = 0;

	if (wstore_on_device(e, u)) {
		st_compute_wait(e->cx, e->update.ev_wstore);
	} else {
		ret = st_eng_wait_until(e, &e->update.sets[0].writes[ST_STATE_W], "W store");
		if (ret == 0)
			ret = st_eng_wait_until(e, &e->update.sets[1].writes[ST_STATE_W],
						"W store");
	}
	return ret ? ret : fwd->unit_home(e, u);
}

/* Every load and store of the staging landed. */
static int upd_quiet(struct st_engine *e)
{
	int ret = 0;

	for (int set = 0; set < 2; set++)
		for (enum st_state s = 0; ret == 0 && s < ST_STATE_COUNT; s++) {
			ret = st_eng_wait_until(e, &e->update.sets[set].reads[s], "load");
			if (ret == 0)
				ret = st_eng_wait_until(e, &e->update.sets[set].writes[s], "store");
		}
	return ret;
}

/* No load issued: each state's first staged tile next, every buffer free. */
static void upd_reset(struct st_engine *e)
{
	for (enum st_state s = 0; s < ST_STATE_COUNT; s++) {
		e->update.next[s] = next_staged(e, -1, s);
		e->update.sets[0].holder[s] = e->update.sets[1].holder[s] = -1;
	}
}

/* --- the update inside the backward ----------------------------------------
 * (docs/engine.md). The backward finishes the units from the last to the
 * first, so the speculative sweep takes them in that order: its tiles are
 * the sweep's, units from U-1 down, each unit's tiles in order, the
 * staging sets in turn as the sweep's. Every P, M and V is on nvme: a tile
 * reads them from the shard and stores the new ones to the shard's
 * alternate extent (upd_store), with sums of their own (engine_sums.c);
 * a G on nvme is not loaded back: the unit's tiles run right after its
 * G became final, and read it in the landing or the G staging while it
 * is written (UPD_FINAL_G; the write is for a sweep that redoes the step);
 * W goes to its home as in the sweep (stages 1-2: the rank's slice, not
 * gathered until the commit, spec_w_out()). When the norm is known, the AdamW
 * constants the speculation used (clip factor 1) are compared with the
 * step's: equal, the alternates are committed (swapped with the shards);
 * else nothing of P, M, V changed, and the sweep runs after the backward
 * as without speculation, rewriting every W; a skipped step (a gradient
 * not finite) rewrites the speculated units' W from their P. */
static int spec_setup(struct st_engine *e)
{
	int n = 0, turn[ST_STATE_COUNT] = { 0 };

	e->update.tiles_spec = calloc((size_t)(e->update.n_tiles ? e->update.n_tiles : 1),
				      sizeof(*e->update.tiles_spec));
	if (!e->update.tiles_spec)
		return -ENOMEM;
	for (int u = e->n_units - 1; u >= 0; u--)
		for (int i = 0; i < e->update.n_tiles; i++) {
			struct utile t = e->update.tiles_main[i];

			if (t.u != u)
				continue;
			for (enum st_state s = 0; s < ST_STATE_COUNT; s++)
				t.set[s] = t.set[s] < 0 ? -1 : (signed char)(turn[s]++ & 1);
			/* a G on nvme is read where it became final */
			if (t.set[ST_STATE_G] >= 0)
				t.set[ST_STATE_G] = UPD_FINAL_G;
			e->update.tiles_spec[n++] = t;
		}
	assert(n == e->update.n_tiles);
	return 0;
}

int st_eng_update_setup(struct st_engine *e)
{
	struct utile t = { .u = -1 };
	int n = 0, turn[ST_STATE_COUNT] = { 0 };

	while (next_tile(e, &t))
		n++;
	e->update.tiles = calloc((size_t)(n ? n : 1), sizeof(*e->update.tiles));
	if (!e->update.tiles)
		return -ENOMEM;
	t.u = -1;
	for (int i = 0; next_tile(e, &t); i++) {
		e->update.tiles[i] = t;
		for (enum st_state s = 0; s < ST_STATE_COUNT; s++)
			e->update.tiles[i].set[s] =
				upd_staged(e, t.u, s) ? (signed char)(turn[s]++ & 1) : -1;
	}
	e->update.n_tiles = n;
	e->update.tiles_main = e->update.tiles;
	upd_reset(e);
	return e->update.spec_on ? spec_setup(e) : 0;
}

void st_eng_update_fini(struct st_engine *e)
{
	free(e->update.tiles_main);
	free(e->update.tiles_spec);
	e->update.tiles = e->update.tiles_main = e->update.tiles_spec = NULL;
}

/* Every load landed (each was waited for by its tile, or dropped). */
static int upd_reads_quiet(struct st_engine *e)
{
	int ret = 0;

	for (int set = 0; set < 2; set++)
		for (enum st_state s = 0; ret == 0 && s < ST_STATE_COUNT; s++)
			ret = st_eng_wait_until(e, &e->update.sets[set].reads[s], "load");
	return ret;
}

/* The last sweep's P, M, V stores may still be going back (fused with
 * the next forward, the sweep leaves them in flight): a buffer is loaded
 * once its store has landed, here or in st_eng_update_poll(). */
int st_eng_update_prefetch(struct st_engine *e)
{
	int ret;

	if (e->update.spec_now)
		return spec_begin(e);
	ret = upd_reads_quiet(e);

	upd_reset(e);
	return ret ? ret : upd_issue(e, 0, ST_STATE_P, false);
}

int st_eng_update_poll(struct st_engine *e)
{
	return upd_issue(e, e->update.spec_step ? e->update.spec_next : 0, ST_STATE_P, false);
}

int st_eng_update_drop(struct st_engine *e)
{
	int ret = upd_quiet(e);

	upd_reset(e);
	return ret;
}

/* --- the optimizer on the device ----------------------------------------- */

/* Unit u's AdamW on the compute's queue: each tensor with or without
 * weight decay, W written in its vram home (its padding stays the zeros
 * st_engine_write_state put there, as the host path's staging zeroes it). */
static void dev_adam_unit(struct st_engine *e, int u, const struct st_adam_step *wd,
			  const struct st_adam_step *nowd)
{
	const struct st_unit_layout *ul = st_model_unit_layout(e->model, u);
	float *g = vaddr(e, &shard(e, u, ST_STATE_G)->ext);
	float *p = vaddr(e, &shard(e, u, ST_STATE_P)->ext);
	float *m = vaddr(e, &shard(e, u, ST_STATE_M)->ext);
	float *v = vaddr(e, &shard(e, u, ST_STATE_V)->ext);
	char *w = vaddr(e, &shard(e, u, ST_STATE_W)->ext);

	st_compute_span_begin(e->cx, "adam");
	for (int i = 0; i < ul->n_tensors; i++) {
		const struct st_tensor_layout *tl = &ul->tensors[i];
		uint64_t o = tl->offset_elems;

		st_compute_adamw(e->cx, tl->decay ? wd : nowd, g + o, p + o, m + o, v + o,
				 w + o * (uint64_t)e->w_elem_bytes, e->w_elem_bytes == 2,
				 e->update.dev_adam_bad, tl->n_elems);
	}
	st_compute_span_end(e->cx);
}

/* The device units in [*next, end), in order: queued, and with fwd their
 * next forward (unit_done), as a tiled unit's once its last tile is in. */
static int dev_units(struct st_engine *e, int *next, int end,
		     const struct st_adam_step *wd, const struct st_adam_step *nowd,
		     const struct st_eng_fused_fwd *fwd)
{
	int ret = 0;

	for (; ret == 0 && *next < end; (*next)++) {
		if (!opt_on_dev(e, *next))
			continue;
		dev_adam_unit(e, *next, wd, nowd);
		ret = st_compute_take_error(e->cx);
		if (ret == 0 && fwd)
			ret = unit_done(e, *next, fwd);
	}
	return ret;
}

/* The end of unit u's tiles. Stages 1-2 at world > 1: u's W gather is
 * queued on the comm queue, and it is the unit before whose W is now
 * waited for (its gather ran during u's update) and whose forward runs. */
static int unit_end(struct st_engine *e, int u, bool last,
		    const struct st_eng_fused_fwd *fwd)
{
	int ret = 0;

	if (!e->zero.w_gather)
		return fwd ? unit_done(e, u, fwd) : 0;
	if (e->update.spec_step)
		return spec_w_out(e, u);
	ret = st_eng_zero_wstore(e, u);
	for (int v = u - 1; v <= u && ret == 0; v++) {
		if (v < 0 || (v == u && !last))
			continue;
		ret = st_eng_zero_wdone(e, v);
		if (ret == 0 && fwd)
			ret = unit_done(e, v, fwd);
	}
	return ret;
}

/* The device AdamW's count of elements left unchanged: the host path's
 * -ERANGE when any (st_adam_apply with ST_ADAM_GRAD_CHECKED). Waits for
 * the compute. */
static int dev_adam_check(struct st_engine *e)
{
	uint32_t bad = 0;
	uint64_t t0 = st_now_ns();
	int ret;

	st_compute_to_host(e->cx, &bad, e->update.dev_adam_bad, sizeof(bad));
	st_eng_host_wait(e, "adam check d2h", t0);
	ret = st_compute_take_error(e->cx);
	if (ret == 0 && bad)
		ret = st_error_set(-ERANGE, "adam: %u gradient elements NaN or Inf; left unchanged",
				   bad);
	return ret;
}

/* Tile i of the sweep: its loads (and the next ones' that may go: they
 * overlap its AdamW), the device units before it, its AdamW, its stores;
 * the end of its unit. */
static int sweep_tile(struct st_engine *e, int i, const struct st_adam_step *wd,
		      const struct st_adam_step *nowd, const struct st_eng_fused_fwd *fwd,
		      int *dev_next)
{
	const struct utile *cur = &e->update.tiles[i];
	bool last = i + 1 == e->update.n_tiles;
	int ret = upd_issue(e, i, ST_STATE_G, true);

	for (enum st_state s = ST_STATE_G; s <= ST_STATE_V && ret == 0; s++)
		if (cur->set[s] >= 0) {
			assert(e->update.sets[cur->set[s]].holder[s] == i);
			ret = st_eng_wait_until(e, &e->update.sets[cur->set[s]].reads[s], "load");
		}
	/* the new W goes into a buffer whose last store has landed */
	if (ret == 0 && cur->set[ST_STATE_W] >= 0)
		ret = st_eng_wait_until(e, &e->update.sets[cur->set[ST_STATE_W]].writes[ST_STATE_W],
					"W store");
	/* the device's units before this one, in unit order */
	if (ret == 0)
		ret = dev_units(e, dev_next, cur->u, wd, nowd, fwd);
	if (ret == 0)
		ret = adam_tile(e, cur, wd, nowd);
	/* the W stores no host waited for (ev_wstore) that landed meanwhile:
	 * reaped before the next, so the h2d lane's busy time is each
	 * store's, up to this tile's AdamW */
	if (ret == 0)
		ret = st_eng_pump(e, false);
	if (ret == 0)
		ret = upd_store(e, cur);
	if (ret == 0 && e->zero.w_gather && !e->update.spec_step)
		st_eng_zero_wpoll(e);
	if (ret == 0 && (last || e->update.tiles[i + 1].u != cur->u))
		ret = unit_end(e, cur->u, last, fwd);
	return ret;
}

/* The update sweep, tile by tile in unit order. With fwd, it is fused with
 * the next step's first forward: once unit u's new W is home, fwd(u) runs
 * while the next tiles load and u's P, M, V go back -- the next step's
 * forward of u waits only on update(u) (stages 1-2 at world > 1: on u's
 * W gather too, which overlaps the update of u + 1). The loads of each
 * state run up to two of its staged tiles ahead (upd_issue); the first
 * two's P, M and V were queued in the backward (st_eng_update_prefetch),
 * their G is queued here, now that it is final. */
int st_eng_update_sweep(struct st_engine *e, const struct st_adam_step *wd,
			const struct st_adam_step *nowd, const struct st_eng_fused_fwd *fwd)
{
	int ret = 0, dev_next = 0;

	if (e->update.dev_adam_bad)
		st_compute_zero(e->cx, e->update.dev_adam_bad, sizeof(uint32_t));
	if (fwd)
		ret = fwd->begin(e, fwd);
	for (int i = 0; i < e->update.n_tiles && ret == 0; i++)
		ret = sweep_tile(e, i, wd, nowd, fwd, &dev_next);
	if (ret == 0)
		ret = dev_units(e, &dev_next, e->n_units, wd, nowd, fwd);
	if (ret == 0 && e->update.dev_adam_bad)
		ret = dev_adam_check(e);
	/* fused with the next forward, the last units' P, M, V stores go on
	 * during the next step's backward (every unit's W is home: unit_done
	 * waited for it, on the host or on the compute; the host has only the
	 * compute to wait for now, so it reaps the W stores here); else every
	 * store lands here */
	for (int set = 0; set < 2 && ret == 0 && fwd; set++)
		ret = st_eng_wait_until(e, &e->update.sets[set].writes[ST_STATE_W], "W store");
	if (ret == 0)
		ret = fwd ? upd_reads_quiet(e) : upd_quiet(e);
	upd_reset(e);
	return ret;
}

/* --- the update inside the backward: the step's calls ---------------------- */

/* The speculation starts (st_eng_update_prefetch): update.spec_wd and
 * spec_nowd hold the step's AdamW constants at a clip factor of 1. The
 * last sweep's stores have landed first: a sweep after the backward
 * fused with this step's forward leaves its last tiles' P, M, V going
 * back, and the speculative tiles take the staging sets in another turn
 * than the sweep's, so a tile's load would not wait, by its buffer, for
 * its own store of the last step (the sweep's tiles do). */
static int spec_begin(struct st_engine *e)
{
	int ret = upd_quiet(e);

	e->update.spec_step = true;
	e->update.spec_off = false;
	e->update.spec_next = 0;
	e->update.tiles = e->update.tiles_spec;
	upd_reset(e);
	/* P, M, V of the first tiles: they need no G */
	return ret ? ret : upd_issue(e, 0, ST_STATE_P, false);
}

/* Whether the speculation can still hold: every final G finite, and
 * their sum of squares (at world > 1 this rank's chunks', a part of the
 * norm's). A rank gives up only where the norm will say the step is
 * skipped, on every rank; no rank's speculation queues a collective
 * (stages 1-2 gather W at the commit, spec_gather_w()), so the ranks
 * need not give up together. It does not give up on the clip: no final
 * G is kept for a sweep, so the norm alone decides, on every rank alike,
 * whether the step runs again (engine_step.c, replay). */
static bool spec_holds(struct st_engine *e, int g_final)
{
	double sumsq = 0;

	if (e->grad.nonfinite)
		return false;
	for (int u = g_final; u < e->n_units; u++) {
		const double *part;

		if (e->world == 1) {
			sumsq += e->grad.unit_sumsq[u];
			continue;
		}
		part = e->zero.parts + (size_t)e->rank * e->zero.n_parts + e->zero.part_off[u];
		for (uint64_t k = 0; k < e->slice_elems[u] / ST_PLAN_SLICE_ALIGN; k++)
			sumsq += part[k];
	}
	return isfinite(sumsq);
}

/* The speculative tiles of the units g_final.. whose G is final. */
static int spec_run(struct st_engine *e, int g_final)
{
	int dev_next = 0, ret = 0;

	while (ret == 0 && e->update.spec_next < e->update.n_tiles &&
	       e->update.tiles[e->update.spec_next].u >= g_final) {
		ret = sweep_tile(e, e->update.spec_next, &e->update.spec_wd,
				 &e->update.spec_nowd, NULL, &dev_next);
		e->update.spec_next++;
	}
	return ret;
}

int st_eng_spec_advance(struct st_engine *e, int g_final)
{
	if (!e->update.spec_step || e->update.spec_off)
		return 0;
	if (!spec_holds(e, g_final)) {
		e->update.spec_off = true;
		return 0;
	}
	return spec_run(e, g_final);
}

/* Stages 1-2 at world > 1: the end of speculated unit u. Its rank's
 * slice of the new W goes home alone (no collective: a rank may give up
 * its speculation before the others, and the comm queue's order is the
 * program's; the commit gathers it, spec_gather_w()), out of wgather[u &
 * 1] unless the home is the host (written in place); then the store of
 * unit u + 1 (speculated before u, out of the other buffer) has landed,
 * so unit u - 1's AdamW may write there. */
static int spec_w_out(struct st_engine *e, int u)
{
	int ret;

	if (shard(e, u, ST_STATE_W)->home == ST_HOME_HOST)
		return 0;
	ret = st_eng_zero_wslice(e, u, ST_IO_WRITE);
	return ret ? ret : st_eng_wait_until(e, &e->zero.wgather_busy[(u + 1) & 1], "W store");
}

/* Stages 1-2 at world > 1, a committed speculation: every rank's slice of
 * each unit's new W is home, its own; the sweep's gathers, in its order
 * (unit_end): each slice back into wgather[u & 1] and gathered from
 * there, unit u - 1's waited for once u's is queued. Every rank knows
 * from the norm that the speculation held, so all queue them. */
static int spec_gather_w(struct st_engine *e)
{
	int ret = 0;

	for (int u = 0; ret == 0 && u < e->n_units; u++) {
		ret = st_eng_zero_wslice(e, u, ST_IO_READ);
		if (ret == 0)
			ret = st_eng_zero_wstore(e, u);
		if (ret == 0 && u > 0)
			ret = st_eng_zero_wdone(e, u - 1);
	}
	return ret ? ret : st_eng_zero_wdone(e, e->n_units - 1);
}

/* The speculated units' W again from their P (a skipped step): spec_run()
 * updates whole units from the last one down, so they are the units from
 * the last speculated tile's up. */
static int spec_restore_w(struct st_engine *e)
{
	int ret = 0, low = e->update.spec_next ? e->update.tiles_spec[e->update.spec_next - 1].u
					       : e->n_units;

	for (int u = e->n_units - 1; ret == 0 && u >= low; u--)
		ret = st_eng_w_from_p(e, u);
	return ret;
}

int st_eng_spec_finish(struct st_engine *e, const struct st_adam_step *wd,
		       const struct st_adam_step *nowd, bool skipped, bool *done)
{
	bool same = !skipped && !e->update.spec_off &&
		    memcmp(wd, &e->update.spec_wd, sizeof(*wd)) == 0 &&
		    memcmp(nowd, &e->update.spec_nowd, sizeof(*nowd)) == 0;
	int ret = 0;

	*done = false;
	if (!e->update.spec_step)
		return 0;
	/* the norm decides, not spec_holds()'s sum in another order */
	if (same)
		ret = spec_run(e, 0);
	assert(ret < 0 || !same || e->update.spec_next == e->update.n_tiles);
	if (ret == 0)
		ret = upd_quiet(e);
	for (int b = 0; b < 2 && ret == 0 && e->zero.w_gather; b++)
		ret = st_eng_wait_until(e, &e->zero.wgather_busy[b], "W store");
	e->update.spec_step = false;
	e->update.tiles = e->update.tiles_main;
	upd_reset(e);
	if (ret < 0)
		return ret;
	/* a skipped step, and one to run again, need the old W */
	if (!same)
		return spec_restore_w(e);
	/* the norm says the speculation held: the alternates are the state */
	for (int u = 0; u < e->n_units; u++)
		for (enum st_state s = ST_STATE_P; s <= ST_STATE_V; s++) {
			struct shard *x = shard(e, u, s);
			struct st_extent t = x->ext;

			x->ext = x->alt;
			x->alt = t;
			st_eng_sums_swap(e, u, s);
			e->sums.written[u * ST_STATE_COUNT + s] = true;
		}
	*done = true;
	return e->zero.w_gather ? spec_gather_w(e) : 0;
}

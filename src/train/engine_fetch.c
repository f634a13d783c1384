/* The W fetch pipeline: each unit's W from its home into a vram slot, up to
 * k units ahead of the unit computing, then widened to fp32 on the compute.
 *
 * The sequence is the forward's units 0..U-2, then the backward's U-1..0
 * without the resident units fetched in the forward (their widened W is
 * kept for the micro-batch), per micro-batch. A fetch is a chain: nvme ->
 * host staging -> vram slot, or host -> vram slot; a W whose home is vram
 * needs none. The h2d hop waits on the device for the widen of the slot's
 * previous W (ev_widen) and records ev_h2d, which the widen of this one
 * waits for: the host never waits for the compute here. */
#include "engine_internal.h"

#include <errno.h>

/* The event recorded after the last widen from slot i (a slot used for the
 * first time has one never recorded, which is done). */
static struct st_event *slot_widened(struct st_engine *e, int i)
{
	return e->fetch.ev_widen[2 * i + (e->fetch.slots[i].widens + 1) % 2];
}

/* A free slot for unit u: resident units take the resident slot when there
 * is one, the others never do. -1 when none is free. */
static int free_slot(struct st_engine *e, int u)
{
	bool res_slot = e->fetch.slots[e->fetch.n_slots - 1].resident;

	for (int i = 0; i < e->fetch.n_slots; i++)
		if (e->fetch.slots[i].seq < 0 && e->fetch.slots[i].pending == 0 &&
		    (!res_slot || e->fetch.slots[i].resident == unit_resident(e, u)))
			return i;
	return -1;
}

static int fetch_start(struct st_engine *e, int u, int i)
{
	struct shard *w = shard(e, u, ST_STATE_W);
	struct wslot *s = &e->fetch.slots[i];
	struct hop hops[2];
	int n = 0;
	void *host;

	/* stage 3: a W slice in vram needs no copy, only its gather */
	if (e->zero.w_stream && w->home == ST_HOME_VRAM) {
		s->ready = true;
		s->len_bytes = e->padded_elems[u] * (uint64_t)e->w_elem_bytes;
		return 0;
	}
	host = w->home == ST_HOME_NVME ? haddr(e, &s->stage) : haddr(e, &w->ext);

	if (w->home == ST_HOME_NVME)
		hops[n++] = st_eng_shard_hop(e, "W nvme->host", u, ST_STATE_W, ST_IO_READ, 0, host,
					     w->ext.len_bytes);
	/* stage 3: the rank's slice to its place in the slot, gathered there
	 * (st_eng_zero_gather_to) */
	hops[n] = st_eng_hop("W h2d", ST_HOME_VRAM, ST_IO_WRITE, &s->ext,
			     e->zero.w_stream ? (uint64_t)e->rank * w->ext.len_bytes : 0, host,
			     w->ext.len_bytes);
	hops[n].after = slot_widened(e, i);
	hops[n].done = e->fetch.ev_h2d[i];
	n++;
	s->ready = false;
	s->len_bytes = w->ext.len_bytes;
	return st_eng_chain_start(e, &s->fetch, hops, n, &s->pending, &s->ready);
}

static int issue_fetches(struct st_engine *e)
{
	while (e->fetch.issued < e->fetch.n_seq &&
	       e->fetch.issued - e->fetch.consumed <= e->fetch.depth) {
		int u = e->fetch.seq[e->fetch.issued], slot, ret;

		if (u >= e->fetch.w_ready)
			return 0; /* its new W is still being written */
		if (shard(e, u, ST_STATE_W)->home == ST_HOME_VRAM && !e->zero.w_stream) {
			e->fetch.issued++;
			continue;
		}
		slot = free_slot(e, u);
		if (slot < 0)
			return 0;
		e->fetch.slots[slot].seq = e->fetch.issued;
		ret = fetch_start(e, u, slot);
		if (ret < 0)
			return ret;
		e->fetch.issued++;
	}
	return 0;
}

/* Stage 3: queue the all-gather of every unit of the fetch sequence up to
 * position upto into its slot, in sequence order (every rank calls the
 * comm in the same order), each once its slice's copy into the slot is
 * queued: the comm waits for that copy (ev_h2d), or, for a slice homed in
 * vram (gathered straight from there), for the slot's last widen; the
 * widen of the unit waits for ev_gather. */
static int gather_to(struct st_engine *e, int upto)
{
	while (e->fetch.gathered <= upto) {
		int idx = e->fetch.gathered, u = e->fetch.seq[idx], slot = -1, ret;
		struct shard *w = shard(e, u, ST_STATE_W);
		size_t wb = (size_t)e->w_elem_bytes, S = e->slice_elems[u];
		enum st_comm_dtype dt = e->w_elem_bytes == 2 ? ST_COMM_BF16 : ST_COMM_F32;
		char *dst;

		ret = issue_fetches(e);
		if (ret < 0)
			return ret;
		for (int i = 0; i < e->fetch.n_slots; i++)
			if (e->fetch.slots[i].seq == idx && e->fetch.slots[i].ready)
				slot = i;
		if (slot < 0) {
			ret = st_eng_pump(e, true);
			if (ret < 0)
				return ret;
			continue;
		}
		dst = vaddr(e, &e->fetch.slots[slot].ext);
		st_eng_zero_mark(e, "W gather", false);
		if (w->home == ST_HOME_VRAM) {
			ret = st_comm_wait(e->comm, slot_widened(e, slot));
			if (ret == 0)
				ret = st_comm_allgather(e->comm, vaddr(e, &w->ext), dst, S, dt);
		} else {
			ret = st_comm_wait(e->comm, e->fetch.ev_h2d[slot]);
			if (ret == 0)
				ret = st_comm_allgather(e->comm, dst + (size_t)e->rank * S * wb,
							dst, S, dt);
		}
		st_eng_zero_mark(e, "W gather", true);
		if (ret == 0)
			ret = st_comm_record(e->comm, e->fetch.ev_gather[slot]);
		if (ret < 0)
			return ret;
		e->fetch.gathered++;
	}
	return 0;
}

/* How far the gathers go at position idx: one unit ahead (its gather runs
 * on the comm's queue while idx computes), when the next unit's W may be
 * fetched and it does not need the one slot idx holds. Decided from the
 * program's state only, so every rank makes the same calls. */
static int gather_upto(const struct st_engine *e, int idx)
{
	int nx = idx + 1;
	bool res_slot = e->fetch.slots[e->fetch.n_slots - 1].resident;

	if (nx >= e->fetch.n_seq || e->fetch.seq[nx] >= e->fetch.w_ready)
		return idx;
	if (res_slot && unit_resident(e, e->fetch.seq[idx]) && unit_resident(e, e->fetch.seq[nx]))
		return idx;
	return nx;
}

void st_eng_fetch_restart(struct st_engine *e, int w_ready)
{
	e->fetch.issued = e->fetch.consumed = e->fetch.gathered = 0;
	e->fetch.w_ready = w_ready;
}

void st_eng_fetch_allow(struct st_engine *e, int w_ready)
{
	e->fetch.w_ready = w_ready;
}

/* Wait for the next unit of the sequence to have its W copy queued, then
 * queue the widening of its W into dst, behind that copy on the device
 * (ev_h2d). Its slot is free again once the copy is reaped: the next copy
 * into it waits on the device for the widen (ev_widen). */
int st_eng_acquire_w(struct st_engine *e, int u, void *dst)
{
	struct shard *w = shard(e, u, ST_STATE_W);
	int idx = e->fetch.consumed, ret, slot = -1;
	uint64_t t0 = 0; /* the host waited for the copy to be queued since */
	const void *src;

	if (e->fetch.seq[idx] != u)
		return st_error_set(-EINVAL, "engine: fetch sequence out of order");
	for (;;) {
		ret = issue_fetches(e);
		if (ret < 0)
			return ret;
		if (w->home == ST_HOME_VRAM && !e->zero.w_stream)
			break;
		if (e->zero.w_stream) {
			ret = gather_to(e, gather_upto(e, idx));
			if (ret < 0)
				return ret;
		}
		for (int i = 0; i < e->fetch.n_slots; i++)
			if (e->fetch.slots[i].seq == idx && e->fetch.slots[i].ready)
				slot = i;
		if (slot >= 0)
			break;
		if (!t0)
			t0 = st_now_ns();
		ret = st_eng_pump(e, true);
		if (ret < 0)
			return ret;
	}
	if (t0)
		st_eng_host_wait(e, "W fetch", t0);
	src = slot < 0 ? vaddr(e, &w->ext) : vaddr(e, &e->fetch.slots[slot].ext);
	if (slot >= 0)
		st_compute_wait(e->cx, e->zero.w_stream ? e->fetch.ev_gather[slot]
							: e->fetch.ev_h2d[slot]);
	/* a span of its own: the compute is busy then, not idle (trace-gaps) */
	st_compute_span_begin(e->cx, "widen");
	if (st_model_precision(e->model) == ST_PRECISION_BF16) {
		/* the model reads W as bf16: a copy (or fp32 W rounded), never a widen */
		if (e->w_elem_bytes == 2)
			st_compute_copy(e->cx, dst, src, e->unit_elems[u] * sizeof(uint16_t));
		else
			st_compute_f32_to_bf16(e->cx, dst, src,
					       e->unit_elems[u]);
	} else if (e->w_elem_bytes == 2) {
		st_compute_bf16_to_f32(e->cx, dst, src, e->unit_elems[u]);
	} else {
		st_compute_copy(e->cx, dst, src, e->unit_elems[u] * sizeof(float));
	}
	st_compute_span_end(e->cx);
	if (slot >= 0) {
		st_compute_record(e->cx,
				  e->fetch.ev_widen[2 * slot + e->fetch.slots[slot].widens % 2]);
		e->fetch.slots[slot].widens++;
		e->fetch.slots[slot].seq = -1;
	}
	e->fetch.consumed++;
	return st_compute_take_error(e->cx);
}

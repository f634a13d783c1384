/* Stream and event semantics every device must have, written once and run
 * by tests/device (cpu) and tests/cuda (cuda).
 *
 * The checks never dereference the arena (a cuda arena is device memory):
 * they move bytes with H2D/D2D/D2H copies and compare host buffers. Host
 * buffers are pinned through the device, because a CUDA D2H copy into
 * pageable memory blocks the caller until the stream reaches it, which
 * would deadlock against the "gate" used here to hold a queue still.
 *
 * The gate: a host function that blocks its queue until the test opens it.
 * With it, everything enqueued behind it is provably still pending, so
 * "not done yet" is observed for certain rather than by luck of timing. */
#ifndef TESTS_DEVICE_CHECKS_H
#define TESTS_DEVICE_CHECKS_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "strata/device.h"

/* What the test program hands the checks in *state. */
struct dc_ctx {
	struct st_device *dev;
	/* > 0: the device's queues hold at most this many commands and a
	 * producer blocks when one is full (the cpu device's ring). */
	unsigned ring_slots;
};

static inline uint64_t dc_rand(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline void dc_fill(void *buf, size_t n, uint64_t seed)
{
	uint8_t *b = buf;
	uint64_t s = seed, w = 0;

	for (size_t i = 0; i < n; i++) {
		if (i % 8 == 0)
			w = dc_rand(&s);
		b[i] = (uint8_t)(w >> (8 * (i % 8)));
	}
}

static inline void dc_sleep_ms(unsigned ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/* Page-aligned host buffer, pinned through the device. */
static inline void *dc_host_alloc(struct st_device *d, size_t bytes)
{
	void *p = NULL;

	assert_int_equal(posix_memalign(&p, 4096, st_align_up(bytes, 4096)), 0);
	assert_int_equal(st_device_pin_host(d, p, st_align_up(bytes, 4096)), 0);
	return p;
}

static inline void dc_host_free(struct st_device *d, void *p)
{
	if (!p)
		return;
	st_device_unpin_host(d, p);
	free(p);
}

struct dc_gate {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool entered, open;
};

static inline void dc_gate_init(struct dc_gate *g)
{
	pthread_mutex_init(&g->lock, NULL);
	pthread_cond_init(&g->cond, NULL);
	g->entered = g->open = false;
}

static inline void dc_gate_fini(struct dc_gate *g)
{
	pthread_cond_destroy(&g->cond);
	pthread_mutex_destroy(&g->lock);
}

/* st_host_fn: holds its queue until the gate opens. */
static inline void dc_gate_fn(void *arg)
{
	struct dc_gate *g = arg;

	pthread_mutex_lock(&g->lock);
	g->entered = true;
	pthread_cond_broadcast(&g->cond);
	while (!g->open)
		pthread_cond_wait(&g->cond, &g->lock);
	pthread_mutex_unlock(&g->lock);
}

/* Wait until the queue is inside the gate: everything behind it pends. */
static inline void dc_gate_wait_entered(struct dc_gate *g)
{
	pthread_mutex_lock(&g->lock);
	while (!g->entered)
		pthread_cond_wait(&g->cond, &g->lock);
	pthread_mutex_unlock(&g->lock);
}

static inline void dc_gate_open(struct dc_gate *g)
{
	pthread_mutex_lock(&g->lock);
	g->open = true;
	pthread_cond_broadcast(&g->cond);
	pthread_mutex_unlock(&g->lock);
}

/* st_host_fn: compares two host buffers when it runs, i.e. after the
 * copies queued before it. */
struct dc_cmp {
	const void *a, *b;
	size_t bytes;
	atomic_int ran;   /* times it ran */
	atomic_int equal; /* 1 when the buffers matched at that moment */
};

static inline void dc_cmp_fn(void *arg)
{
	struct dc_cmp *c = arg;

	atomic_store(&c->equal, memcmp(c->a, c->b, c->bytes) == 0);
	atomic_fetch_add(&c->ran, 1);
}

/* st_host_fn: sets a flag. */
static inline void dc_flag_fn(void *arg)
{
	atomic_store((atomic_int *)arg, 1);
}

/* st_host_fn: copies one flag into another when it runs. */
struct dc_flag_copy {
	atomic_int *from, *to;
};

static inline void dc_flag_copy_fn(void *arg)
{
	struct dc_flag_copy *f = arg;

	atomic_store(f->to, atomic_load(f->from));
}

/* H2D, D2D, D2H on one queue run in submission order, including a
 * write-after-read of the same device bytes; a host function queued after
 * them sees them done; stats count exactly what was queued. */
static inline void dc_test_copy_chain(void **state)
{
	struct dc_ctx *c = *state;
	struct st_device *d = c->dev;
	const size_t n = 256 * 1024;
	struct st_device_stats s0, s1;
	struct st_queue *q;
	struct st_event *ev;
	struct dc_gate g;
	struct dc_cmp cmp1 = { 0 }, cmp2 = { 0 };
	uint8_t *src1, *src2, *dst1, *dst2, *sentinel;
	char *arena;
	uint64_t arena_bytes;

	arena = st_device_arena(d, &arena_bytes);
	assert_non_null(arena);
	assert_true(arena_bytes >= 2 * n);
	src1 = dc_host_alloc(d, n);
	src2 = dc_host_alloc(d, n);
	dst1 = dc_host_alloc(d, n);
	dst2 = dc_host_alloc(d, n);
	sentinel = malloc(n);
	assert_non_null(sentinel);
	dc_fill(src1, n, 101);
	dc_fill(src2, n, 202);
	memset(sentinel, 0xA5, n);
	memcpy(dst1, sentinel, n);
	memcpy(dst2, sentinel, n);
	assert_int_equal(st_queue_create(d, &q), 0);
	assert_int_equal(st_event_create(d, &ev), 0);
	dc_gate_init(&g);
	st_device_get_stats(d, &s0);

	cmp1 = (struct dc_cmp){ .a = dst1, .b = src1, .bytes = n };
	cmp2 = (struct dc_cmp){ .a = dst2, .b = src2, .bytes = n };
	assert_int_equal(st_device_host_fn(d, q, dc_gate_fn, &g), 0);
	/* X = src1; Y = X; X = src2 (must not reach Y); dst1 = Y; dst2 = X */
	assert_int_equal(st_device_memcpy_async(d, q, arena, src1, n, ST_COPY_H2D), 0);
	assert_int_equal(st_device_memcpy_async(d, q, arena + n, arena, n, ST_COPY_D2D), 0);
	assert_int_equal(st_device_memcpy_async(d, q, arena, src2, n, ST_COPY_H2D), 0);
	assert_int_equal(st_device_memcpy_async(d, q, dst1, arena + n, n, ST_COPY_D2H), 0);
	assert_int_equal(st_device_host_fn(d, q, dc_cmp_fn, &cmp1), 0);
	assert_int_equal(st_device_memcpy_async(d, q, dst2, arena, n, ST_COPY_D2H), 0);
	assert_int_equal(st_device_host_fn(d, q, dc_cmp_fn, &cmp2), 0);
	/* A zero-byte copy is accepted and counts nowhere. */
	assert_int_equal(st_device_memcpy_async(d, q, dst1, arena, 0, ST_COPY_D2H), 0);
	assert_int_equal(st_event_record(d, ev, q), 0);

	/* Held behind the gate: nothing has moved yet. */
	dc_gate_wait_entered(&g);
	dc_sleep_ms(20);
	assert_int_equal(st_event_query(d, ev), 0);
	assert_int_equal(atomic_load(&cmp1.ran), 0);
	assert_memory_equal(dst1, sentinel, n);
	assert_memory_equal(dst2, sentinel, n);

	dc_gate_open(&g);
	assert_int_equal(st_event_sync(d, ev), 0);
	assert_int_equal(st_event_query(d, ev), 1);
	assert_int_equal(atomic_load(&cmp1.ran), 1);
	assert_int_equal(atomic_load(&cmp2.ran), 1);
	assert_int_equal(atomic_load(&cmp1.equal), 1);
	assert_int_equal(atomic_load(&cmp2.equal), 1);
	assert_memory_equal(dst1, src1, n);
	assert_memory_equal(dst2, src2, n);

	st_device_get_stats(d, &s1);
	assert_true(s1.h2d_bytes - s0.h2d_bytes == 2 * n);
	assert_true(s1.d2d_bytes - s0.d2d_bytes == n);
	assert_true(s1.d2h_bytes - s0.d2h_bytes == 2 * n);
	assert_true(s1.copies - s0.copies == 5);
	assert_true(s1.arena_bytes == arena_bytes);

	st_event_destroy(d, ev);
	st_queue_destroy(d, q);
	dc_gate_fini(&g);
	free(sentinel);
	dc_host_free(d, src1);
	dc_host_free(d, src2);
	dc_host_free(d, dst1);
	dc_host_free(d, dst2);
}

/* An event behind a blocked queue queries 0, then 1 once the queue runs;
 * an event never recorded is done; events can be recorded again. */
static inline void dc_test_event_query(void **state)
{
	struct dc_ctx *c = *state;
	struct st_device *d = c->dev;
	struct st_queue *q;
	struct st_event *ev, *never, *early;
	struct dc_gate g;
	atomic_int after = 0;

	assert_int_equal(st_queue_create(d, &q), 0);
	assert_int_equal(st_event_create(d, &ev), 0);
	assert_int_equal(st_event_create(d, &never), 0);
	assert_int_equal(st_event_create(d, &early), 0);
	dc_gate_init(&g);

	assert_int_equal(st_event_query(d, never), 1);
	assert_int_equal(st_event_sync(d, never), 0);

	/* Recorded on an empty queue: done at once (after a sync at worst). */
	assert_int_equal(st_event_record(d, early, q), 0);
	assert_int_equal(st_event_sync(d, early), 0);
	assert_int_equal(st_event_query(d, early), 1);

	assert_int_equal(st_device_host_fn(d, q, dc_gate_fn, &g), 0);
	assert_int_equal(st_device_host_fn(d, q, dc_flag_fn, &after), 0);
	assert_int_equal(st_event_record(d, ev, q), 0);
	dc_gate_wait_entered(&g);
	for (int i = 0; i < 5; i++) {
		assert_int_equal(st_event_query(d, ev), 0);
		dc_sleep_ms(5);
	}
	/* The event recorded before the gate stays done. */
	assert_int_equal(st_event_query(d, early), 1);
	/* Re-recording the done event behind the gate makes it pending. */
	assert_int_equal(st_event_record(d, early, q), 0);
	assert_int_equal(st_event_query(d, early), 0);
	assert_int_equal(atomic_load(&after), 0);

	dc_gate_open(&g);
	assert_int_equal(st_event_sync(d, ev), 0);
	assert_int_equal(atomic_load(&after), 1);
	assert_int_equal(st_event_query(d, ev), 1);
	assert_int_equal(st_event_sync(d, early), 0);
	assert_int_equal(st_event_query(d, early), 1);
	assert_int_equal(st_event_query(d, never), 1);

	st_event_destroy(d, ev);
	st_event_destroy(d, never);
	st_event_destroy(d, early);
	st_queue_destroy(d, q);
	dc_gate_fini(&g);
}

struct dc_syncer {
	struct st_device *dev;
	struct st_queue *q;  /* queue_sync(q) when set */
	struct st_event *ev; /* else event_sync(ev) */
	atomic_int *marker;  /* set by the last host fn before the sync point */
	atomic_int returned;
	int ret;
	int marker_at_return;
};

static inline void *dc_syncer_main(void *arg)
{
	struct dc_syncer *s = arg;

	s->ret = s->q ? st_queue_sync(s->dev, s->q) : st_event_sync(s->dev, s->ev);
	s->marker_at_return = atomic_load(s->marker);
	atomic_store(&s->returned, 1);
	return NULL;
}

/* event_sync and queue_sync block until the work is done, not merely
 * until it has started. */
static inline void dc_test_sync_blocks(void **state)
{
	struct dc_ctx *c = *state;
	struct st_device *d = c->dev;

	for (int use_queue = 0; use_queue < 2; use_queue++) {
		struct st_queue *q;
		struct st_event *ev;
		struct dc_gate g;
		atomic_int marker = 0;
		struct dc_syncer s = { .dev = d, .marker = &marker };
		pthread_t th;

		assert_int_equal(st_queue_create(d, &q), 0);
		assert_int_equal(st_event_create(d, &ev), 0);
		dc_gate_init(&g);
		assert_int_equal(st_device_host_fn(d, q, dc_gate_fn, &g), 0);
		assert_int_equal(st_device_host_fn(d, q, dc_flag_fn, &marker), 0);
		assert_int_equal(st_event_record(d, ev, q), 0);
		if (use_queue)
			s.q = q;
		else
			s.ev = ev;
		assert_int_equal(pthread_create(&th, NULL, dc_syncer_main, &s), 0);
		dc_gate_wait_entered(&g);
		dc_sleep_ms(50);
		assert_int_equal(atomic_load(&s.returned), 0);
		dc_gate_open(&g);
		assert_int_equal(pthread_join(th, NULL), 0);
		assert_int_equal(s.ret, 0);
		assert_int_equal(s.marker_at_return, 1);
		st_event_destroy(d, ev);
		st_queue_destroy(d, q);
		dc_gate_fini(&g);
	}
}

/* queue_wait: work queued on B after waiting for an event on A runs only
 * after A reached the event, and sees A's copies. */
static inline void dc_test_queue_wait(void **state)
{
	struct dc_ctx *c = *state;
	struct st_device *d = c->dev;
	const size_t n = 128 * 1024;
	struct st_queue *qa, *qb;
	struct st_event *ea, *eb, *never;
	struct dc_gate g;
	struct dc_cmp cmp = { 0 };
	atomic_int a_done = 0, b_saw_a = -1, b_free = 0;
	struct dc_flag_copy saw = { .from = &a_done, .to = &b_saw_a };
	uint8_t *src, *dst;
	char *arena;

	arena = st_device_arena(d, NULL);
	src = dc_host_alloc(d, n);
	dst = dc_host_alloc(d, n);
	dc_fill(src, n, 303);
	memset(dst, 0, n);
	assert_int_equal(st_queue_create(d, &qa), 0);
	assert_int_equal(st_queue_create(d, &qb), 0);
	assert_int_equal(st_event_create(d, &ea), 0);
	assert_int_equal(st_event_create(d, &eb), 0);
	assert_int_equal(st_event_create(d, &never), 0);
	dc_gate_init(&g);

	/* Waiting for an event never recorded does not hold the queue. */
	assert_int_equal(st_queue_wait(d, qb, never), 0);
	assert_int_equal(st_device_host_fn(d, qb, dc_flag_fn, &b_free), 0);
	assert_int_equal(st_queue_sync(d, qb), 0);
	assert_int_equal(atomic_load(&b_free), 1);

	/* A: gate, write X, mark done, event. */
	assert_int_equal(st_device_host_fn(d, qa, dc_gate_fn, &g), 0);
	assert_int_equal(st_device_memcpy_async(d, qa, arena, src, n, ST_COPY_H2D), 0);
	assert_int_equal(st_device_host_fn(d, qa, dc_flag_fn, &a_done), 0);
	assert_int_equal(st_event_record(d, ea, qa), 0);
	/* B: wait for A, read X back, check it and A's mark. */
	cmp = (struct dc_cmp){ .a = dst, .b = src, .bytes = n };
	assert_int_equal(st_queue_wait(d, qb, ea), 0);
	assert_int_equal(st_device_memcpy_async(d, qb, dst, arena, n, ST_COPY_D2H), 0);
	assert_int_equal(st_device_host_fn(d, qb, dc_cmp_fn, &cmp), 0);
	assert_int_equal(st_device_host_fn(d, qb, dc_flag_copy_fn, &saw), 0);
	assert_int_equal(st_event_record(d, eb, qb), 0);

	/* While A is held, B must be held too. */
	dc_gate_wait_entered(&g);
	dc_sleep_ms(50);
	assert_int_equal(st_event_query(d, eb), 0);
	assert_int_equal(atomic_load(&cmp.ran), 0);
	assert_int_equal(atomic_load(&a_done), 0);
	assert_int_equal(atomic_load(&b_saw_a), -1);

	dc_gate_open(&g);
	assert_int_equal(st_queue_sync(d, qb), 0);
	/* B's host function ran after A's mark: B really waited. */
	assert_int_equal(atomic_load(&b_saw_a), 1);
	assert_int_equal(atomic_load(&cmp.ran), 1);
	assert_int_equal(atomic_load(&cmp.equal), 1);
	assert_memory_equal(dst, src, n);
	assert_int_equal(st_event_query(d, eb), 1);
	assert_int_equal(st_event_query(d, ea), 1);

	st_event_destroy(d, ea);
	st_event_destroy(d, eb);
	st_event_destroy(d, never);
	st_queue_destroy(d, qa);
	st_queue_destroy(d, qb);
	dc_gate_fini(&g);
	dc_host_free(d, src);
	dc_host_free(d, dst);
}

/* Host functions run exactly once each, in submission order. */
struct dc_order {
	atomic_uint *next;  /* index the next host fn must have */
	atomic_uint *bad;   /* how many ran out of order */
	unsigned idx;
	/* optional: the copy of this step must be done when it runs */
	const uint8_t *got, *want;
	size_t bytes;
};

static inline void dc_order_fn(void *arg)
{
	struct dc_order *o = arg;

	if (atomic_load(o->next) != o->idx)
		atomic_fetch_add(o->bad, 1);
	if (o->got && memcmp(o->got, o->want, o->bytes) != 0)
		atomic_fetch_add(o->bad, 1);
	atomic_store(o->next, o->idx + 1);
}

struct dc_releaser {
	struct dc_gate *g;
	atomic_uint *enqueued;
	unsigned enqueued_at_open;
	atomic_int opened;
};

static inline void *dc_releaser_main(void *arg)
{
	struct dc_releaser *r = arg;

	dc_gate_wait_entered(r->g);
	dc_sleep_ms(100);
	r->enqueued_at_open = atomic_load(r->enqueued);
	atomic_store(&r->opened, 1);
	dc_gate_open(r->g);
	return NULL;
}

/* Far more commands in flight than a queue holds: copies that reuse the
 * same device bytes (ordering hazards on every step), host functions that
 * check order and data, events along the way. The queue starts held, so
 * with a bounded ring the producer must block until it is released, and
 * must not deadlock. */
static inline void dc_test_many_in_flight(void **state)
{
	enum { STEPS = 2048, CHUNK = 64, SLOTS = 97, NEV = 16 };
	struct dc_ctx *c = *state;
	struct st_device *d = c->dev;
	struct st_queue *q;
	struct st_event *ev[NEV];
	struct dc_gate g;
	struct dc_releaser r = { .g = &g };
	struct dc_order *ord;
	struct st_device_stats s0, s1;
	atomic_uint next = 0, bad = 0, enqueued = 0;
	uint8_t *src, *dst;
	char *arena;
	pthread_t th;
	int opened_before_done;

	arena = st_device_arena(d, NULL);
	src = dc_host_alloc(d, (size_t)STEPS * CHUNK);
	dst = dc_host_alloc(d, (size_t)STEPS * CHUNK);
	ord = calloc(STEPS, sizeof(*ord));
	assert_non_null(ord);
	dc_fill(src, (size_t)STEPS * CHUNK, 404);
	memset(dst, 0, (size_t)STEPS * CHUNK);
	assert_int_equal(st_queue_create(d, &q), 0);
	for (int i = 0; i < NEV; i++)
		assert_int_equal(st_event_create(d, &ev[i]), 0);
	dc_gate_init(&g);
	r.enqueued = &enqueued;
	st_device_get_stats(d, &s0);

	assert_int_equal(st_device_host_fn(d, q, dc_gate_fn, &g), 0);
	assert_int_equal(pthread_create(&th, NULL, dc_releaser_main, &r), 0);
	for (unsigned i = 0; i < STEPS; i++) {
		/* Few device slots, reused: step i overwrites what step
		 * i - SLOTS wrote, so any reordering shows in dst. */
		char *slot = arena + (size_t)(i % SLOTS) * CHUNK;

		ord[i] = (struct dc_order){ .next = &next, .bad = &bad, .idx = i,
					    .got = dst + (size_t)i * CHUNK,
					    .want = src + (size_t)i * CHUNK, .bytes = CHUNK };
		assert_int_equal(st_device_memcpy_async(d, q, slot, src + (size_t)i * CHUNK,
							CHUNK, ST_COPY_H2D), 0);
		atomic_fetch_add(&enqueued, 1);
		assert_int_equal(st_device_memcpy_async(d, q, dst + (size_t)i * CHUNK, slot,
							CHUNK, ST_COPY_D2H), 0);
		atomic_fetch_add(&enqueued, 1);
		assert_int_equal(st_device_host_fn(d, q, dc_order_fn, &ord[i]), 0);
		atomic_fetch_add(&enqueued, 1);
		if (i % (STEPS / NEV) == STEPS / NEV - 1)
			assert_int_equal(st_event_record(d, ev[i / (STEPS / NEV)], q), 0);
	}
	opened_before_done = atomic_load(&r.opened);
	assert_int_equal(st_queue_sync(d, q), 0);
	assert_int_equal(pthread_join(th, NULL), 0);

	assert_int_equal(atomic_load(&bad), 0);
	assert_int_equal(atomic_load(&next), STEPS);
	assert_memory_equal(dst, src, (size_t)STEPS * CHUNK);
	for (int i = 0; i < NEV; i++)
		assert_int_equal(st_event_query(d, ev[i]), 1);
	if (c->ring_slots) {
		/* 3 * STEPS commands cannot fit: the producer waited for the
		 * release, and no more than the ring (less the gate) got in. */
		assert_true(3u * STEPS > c->ring_slots);
		assert_int_equal(opened_before_done, 1);
		assert_true(r.enqueued_at_open <= c->ring_slots - 1);
	}
	st_device_get_stats(d, &s1);
	assert_true(s1.h2d_bytes - s0.h2d_bytes == (uint64_t)STEPS * CHUNK);
	assert_true(s1.d2h_bytes - s0.d2h_bytes == (uint64_t)STEPS * CHUNK);
	assert_true(s1.copies - s0.copies == 2u * STEPS);

	for (int i = 0; i < NEV; i++)
		st_event_destroy(d, ev[i]);
	st_queue_destroy(d, q);
	dc_gate_fini(&g);
	free(ord);
	dc_host_free(d, src);
	dc_host_free(d, dst);
}

/* Two producer threads on one queue each see their own commands in order. */
struct dc_producer {
	struct st_device *dev;
	struct st_queue *q;
	struct dc_order *ord;
	unsigned n;
};

static inline void *dc_producer_main(void *arg)
{
	struct dc_producer *p = arg;

	for (unsigned i = 0; i < p->n; i++)
		if (st_device_host_fn(p->dev, p->q, dc_order_fn, &p->ord[i]) != 0)
			atomic_fetch_add(p->ord[i].bad, 1);
	return NULL;
}

static inline void dc_test_two_producers(void **state)
{
	enum { N = 3000 };
	struct dc_ctx *c = *state;
	struct st_device *d = c->dev;
	struct st_queue *q;
	struct dc_order *ord[2];
	struct dc_producer p[2];
	atomic_uint next[2] = { 0, 0 }, bad = 0;
	pthread_t th[2];

	assert_int_equal(st_queue_create(d, &q), 0);
	for (int k = 0; k < 2; k++) {
		ord[k] = calloc(N, sizeof(*ord[k]));
		assert_non_null(ord[k]);
		for (unsigned i = 0; i < N; i++)
			ord[k][i] = (struct dc_order){ .next = &next[k], .bad = &bad, .idx = i };
		p[k] = (struct dc_producer){ .dev = d, .q = q, .ord = ord[k], .n = N };
	}
	for (int k = 0; k < 2; k++)
		assert_int_equal(pthread_create(&th[k], NULL, dc_producer_main, &p[k]), 0);
	for (int k = 0; k < 2; k++)
		assert_int_equal(pthread_join(th[k], NULL), 0);
	assert_int_equal(st_queue_sync(d, q), 0);
	assert_int_equal(atomic_load(&bad), 0);
	assert_int_equal(atomic_load(&next[0]), N);
	assert_int_equal(atomic_load(&next[1]), N);
	st_queue_destroy(d, q);
	free(ord[0]);
	free(ord[1]);
}

/* Queues are independent: copies on B complete while A is held. */
static inline void dc_test_queues_independent(void **state)
{
	struct dc_ctx *c = *state;
	struct st_device *d = c->dev;
	const size_t n = 64 * 1024;
	struct st_queue *qa, *qb;
	struct st_event *ea, *eb;
	struct dc_gate g;
	uint8_t *src, *dst;
	char *arena;

	arena = st_device_arena(d, NULL);
	src = dc_host_alloc(d, n);
	dst = dc_host_alloc(d, n);
	dc_fill(src, n, 505);
	memset(dst, 0, n);
	assert_int_equal(st_queue_create(d, &qa), 0);
	assert_int_equal(st_queue_create(d, &qb), 0);
	assert_int_equal(st_event_create(d, &ea), 0);
	assert_int_equal(st_event_create(d, &eb), 0);
	dc_gate_init(&g);

	assert_int_equal(st_device_host_fn(d, qa, dc_gate_fn, &g), 0);
	assert_int_equal(st_event_record(d, ea, qa), 0);
	dc_gate_wait_entered(&g);
	assert_int_equal(st_device_memcpy_async(d, qb, arena + n, src, n, ST_COPY_H2D), 0);
	assert_int_equal(st_device_memcpy_async(d, qb, dst, arena + n, n, ST_COPY_D2H), 0);
	assert_int_equal(st_event_record(d, eb, qb), 0);
	assert_int_equal(st_event_sync(d, eb), 0);
	assert_memory_equal(dst, src, n);
	assert_int_equal(st_event_query(d, ea), 0);
	dc_gate_open(&g);
	assert_int_equal(st_event_sync(d, ea), 0);

	st_event_destroy(d, ea);
	st_event_destroy(d, eb);
	st_queue_destroy(d, qa);
	st_queue_destroy(d, qb);
	dc_gate_fini(&g);
	dc_host_free(d, src);
	dc_host_free(d, dst);
}

/* The checks above, for a test program's list (state: struct dc_ctx). */
#define DC_SEMANTICS_TESTS(setup, teardown)                                         \
	cmocka_unit_test_setup_teardown(dc_test_copy_chain, setup, teardown),        \
	cmocka_unit_test_setup_teardown(dc_test_event_query, setup, teardown),       \
	cmocka_unit_test_setup_teardown(dc_test_sync_blocks, setup, teardown),       \
	cmocka_unit_test_setup_teardown(dc_test_queue_wait, setup, teardown),        \
	cmocka_unit_test_setup_teardown(dc_test_queues_independent, setup, teardown),\
	cmocka_unit_test_setup_teardown(dc_test_many_in_flight, setup, teardown),    \
	cmocka_unit_test_setup_teardown(dc_test_two_producers, setup, teardown)

#endif

/* The cpu device: a GPU stand-in so the engine's asynchrony runs anywhere.
 *
 * "vram" is one separate anonymous mapping of the budget, never touched by
 * anyone but copies and kernels. Each queue is a worker thread draining a
 * fixed ring of commands in order (copy, host function, wait-for-event), as
 * a CUDA stream does. An event is (queue, sequence number): it is done when
 * the queue has finished every command up to that number.
 *
 * cpu-strict is the same device with a GPU's address space: its arena is
 * handed out at tagged addresses (device_cpu.h) that fault when the host
 * touches them, and that only its copies and the queued cpu compute
 * translate. A copy whose sides are not what its direction says, and any
 * fault of the process, is reported with a stack. Everything else (the
 * budget, the queues, the events, the bits) is the cpu device's. */
#include "device_cpu.h"

#include <assert.h>
#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define CPU_QUEUE_SLOTS 1024u
#define CPU_DEFAULT_ARENA_BYTES (256ull * ST_MiB)

enum cpu_cmd_kind { CMD_COPY, CMD_FN, CMD_WAIT };

struct cpu_cmd {
	enum cpu_cmd_kind kind;
	void *dst;
	const void *src;
	size_t bytes;
	st_host_fn fn;
	void *arg;
	struct st_queue *wait_q; /* CMD_WAIT: wait until wait_q reaches wait_seq */
	uint64_t wait_seq;
};

struct st_queue {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;       /* signalled on submit and on progress */
	struct cpu_cmd ring[CPU_QUEUE_SLOTS];
	uint64_t submitted;        /* commands ever enqueued */
	uint64_t completed;        /* commands ever finished */
	bool stop;
	struct st_queue *next;     /* in cpu_priv.queues */
};

struct st_event {
	struct st_queue *q; /* NULL: never recorded, counts as done */
	uint64_t seq;
};

struct cpu_priv {
	void *arena;        /* the host's address of the arena */
	size_t arena_bytes;
	bool strict;        /* cpu-strict: the arena is handed out tagged */
	pthread_mutex_t lock;
	struct st_queue *queues; /* live queues, so close can drain them */
};

static uint64_t cpu_queue_completed(struct st_queue *q)
{
	uint64_t c;

	pthread_mutex_lock(&q->lock);
	c = q->completed;
	pthread_mutex_unlock(&q->lock);
	return c;
}

static void cpu_queue_wait_seq(struct st_queue *q, uint64_t seq)
{
	pthread_mutex_lock(&q->lock);
	while (q->completed < seq)
		pthread_cond_wait(&q->cond, &q->lock);
	pthread_mutex_unlock(&q->lock);
}

static void *cpu_queue_main(void *arg)
{
	struct st_queue *q = arg;

	pthread_mutex_lock(&q->lock);
	for (;;) {
		struct cpu_cmd cmd;

		while (q->completed == q->submitted && !q->stop)
			pthread_cond_wait(&q->cond, &q->lock);
		if (q->completed == q->submitted && q->stop)
			break;
		cmd = q->ring[q->completed % CPU_QUEUE_SLOTS];
		pthread_mutex_unlock(&q->lock);

		switch (cmd.kind) {
		case CMD_COPY:
			memmove(cmd.dst, cmd.src, cmd.bytes);
			break;
		case CMD_FN:
			cmd.fn(cmd.arg);
			break;
		case CMD_WAIT:
			cpu_queue_wait_seq(cmd.wait_q, cmd.wait_seq);
			break;
		}

		pthread_mutex_lock(&q->lock);
		q->completed++;
		pthread_cond_broadcast(&q->cond);
	}
	pthread_mutex_unlock(&q->lock);
	return NULL;
}

static int cpu_enqueue(struct st_queue *q, const struct cpu_cmd *cmd)
{
	pthread_mutex_lock(&q->lock);
	/* A full ring blocks the producer, as a full CUDA launch queue does. */
	while (q->submitted - q->completed >= CPU_QUEUE_SLOTS)
		pthread_cond_wait(&q->cond, &q->lock);
	q->ring[q->submitted % CPU_QUEUE_SLOTS] = *cmd;
	q->submitted++;
	pthread_cond_broadcast(&q->cond);
	pthread_mutex_unlock(&q->lock);
	return 0;
}

static int cpu_open(struct st_device *d, struct st_device_config *cfg)
{
	struct cpu_priv *p = st_device_priv(d);

	if (cfg->mem_bytes == 0)
		cfg->mem_bytes = CPU_DEFAULT_ARENA_BYTES;
	cfg->mem_bytes = st_align_up(cfg->mem_bytes, ST_PAGE_BYTES);
	/* MAP_NORESERVE: the budget is a ceiling, pages appear when used. */
	p->arena = mmap(NULL, cfg->mem_bytes, PROT_READ | PROT_WRITE,
			MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p->arena == MAP_FAILED) {
		p->arena = NULL;
		return st_error_set(-ENOMEM, "cpu device: cannot map a %llu-byte arena",
				    (unsigned long long)cfg->mem_bytes);
	}
	p->arena_bytes = cfg->mem_bytes;
	pthread_mutex_init(&p->lock, NULL);
	return 0;
}

/* ---- cpu-strict ----------------------------------------------------------------- */

static void strict_stack(void)
{
	void *frames[64];
	int n = backtrace(frames, 64);

	backtrace_symbols_fd(frames, n, STDERR_FILENO);
}

_Noreturn void st_cpu_strict_fail(const char *fmt, ...)
{
	va_list ap;

	fputs("strata: cpu-strict: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\nstrata: cpu-strict: the stack (addr2line -f -e BINARY +OFFSET names a frame):\n",
	      stderr);
	fflush(stderr);
	strict_stack();
	abort();
}

/* A fault anywhere in the process: a tagged address read or written by the
 * host faults as non-canonical (SIGSEGV, SI_KERNEL, no address). Say so,
 * print the stack of the faulting thread, and die of the signal. Only
 * async-signal-safe calls, and backtrace() (loaded at install). */
static void strict_on_fault(int sig, siginfo_t *si, void *uc)
{
	static const char kernel[] =
		"strata: cpu-strict: a fault at a non-canonical address: the host touched "
		"device memory (a tagged cpu-strict address) outside the device's copies "
		"and ops; the faulting thread's stack (addr2line -f -e BINARY +OFFSET names "
		"a frame):\n";
	static const char other[] =
		"strata: cpu-strict: a fault (not at a device address); the faulting "
		"thread's stack:\n";
	const char *m = si->si_code == SI_KERNEL ? kernel : other;

	(void)uc;
	(void)!write(STDERR_FILENO, m, strlen(m));
	strict_stack();
	signal(sig, SIG_DFL);
	raise(sig);
}

/* At every open (a test harness may have put its own handler in since the
 * last). Under AddressSanitizer its own handler reports the fault with a
 * stack, so this one stays out of its way. */
static void strict_install(void)
{
#if !defined(__SANITIZE_ADDRESS__)
	struct sigaction sa = { .sa_sigaction = strict_on_fault,
				.sa_flags = SA_SIGINFO | SA_NODEFER };
	void *f[1];

	(void)backtrace(f, 1); /* loads libgcc now, not in the handler */
	sigemptyset(&sa.sa_mask);
	sigaction(SIGSEGV, &sa, NULL);
	sigaction(SIGBUS, &sa, NULL);
#endif
}

static int cpu_strict_open(struct st_device *d, struct st_device_config *cfg)
{
	struct cpu_priv *p = st_device_priv(d);
	int ret = cpu_open(d, cfg);

	if (ret < 0)
		return ret;
	if (((uintptr_t)p->arena | ((uintptr_t)p->arena + p->arena_bytes)) &
	    ST_CPU_STRICT_TAG_MASK) {
		munmap(p->arena, p->arena_bytes);
		pthread_mutex_destroy(&p->lock);
		return st_error_set(-ENOMEM, "cpu-strict device: the arena was mapped above "
				    "2^48, where its addresses cannot be tagged");
	}
	p->strict = true;
	strict_install();
	return 0;
}

bool st_device_cpu_strict(const struct st_device *d)
{
	return d && strcmp(st_device_name(d), st_device_cpu_strict_ops.name) == 0;
}

static int cpu_queue_sync(struct st_device *d, struct st_queue *q);

static void cpu_close(struct st_device *d)
{
	struct cpu_priv *p = st_device_priv(d);

	/* Queues belong to their creator and must be destroyed before the
	 * device; still, never let a pending copy write into unmapped memory. */
	for (struct st_queue *q = p->queues; q; q = q->next)
		cpu_queue_sync(d, q);
	munmap(p->arena, p->arena_bytes);
	pthread_mutex_destroy(&p->lock);
}

static void *cpu_arena_base(struct st_device *d)
{
	struct cpu_priv *p = st_device_priv(d);

	return p->strict ? st_cpu_strict_dev(p->arena) : p->arena;
}

static int cpu_queue_create(struct st_device *d, struct st_queue **out)
{
	struct cpu_priv *p = st_device_priv(d);
	struct st_queue *q;
	int ret;

	q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	pthread_mutex_init(&q->lock, NULL);
	pthread_cond_init(&q->cond, NULL);
	ret = pthread_create(&q->thread, NULL, cpu_queue_main, q);
	if (ret) {
		pthread_cond_destroy(&q->cond);
		pthread_mutex_destroy(&q->lock);
		free(q);
		return st_error_set(-ret, "cpu device: cannot start a queue thread");
	}
	pthread_mutex_lock(&p->lock);
	q->next = p->queues;
	p->queues = q;
	pthread_mutex_unlock(&p->lock);
	*out = q;
	return 0;
}

static void cpu_queue_destroy(struct st_device *d, struct st_queue *q)
{
	struct cpu_priv *p = st_device_priv(d);

	pthread_mutex_lock(&p->lock);
	for (struct st_queue **pp = &p->queues; *pp; pp = &(*pp)->next)
		if (*pp == q) {
			*pp = q->next;
			break;
		}
	pthread_mutex_unlock(&p->lock);
	pthread_mutex_lock(&q->lock);
	q->stop = true;
	pthread_cond_broadcast(&q->cond);
	pthread_mutex_unlock(&q->lock);
	pthread_join(q->thread, NULL);
	pthread_cond_destroy(&q->cond);
	pthread_mutex_destroy(&q->lock);
	free(q);
}

static int cpu_event_create(struct st_device *d, struct st_event **out)
{
	ST_UNUSED(d);
	*out = calloc(1, sizeof(**out));
	return *out ? 0 : -ENOMEM;
}

static void cpu_event_destroy(struct st_device *d, struct st_event *e)
{
	ST_UNUSED(d);
	free(e);
}

static int cpu_memcpy_async(struct st_device *d, struct st_queue *q, void *dst,
			    const void *src, size_t bytes, enum st_copy_dir dir)
{
	struct cpu_cmd cmd = { .kind = CMD_COPY, .dst = dst, .src = src,
			       .bytes = bytes };
	struct cpu_priv *p = st_device_priv(d);
	const char *a = p->arena, *end = a + p->arena_bytes;

	if (p->strict) { /* each side must be what dir says, then translated */
		static const char *const names[] = { "h2d", "d2h", "d2d" };
		bool dst_dev = dir != ST_COPY_D2H, src_dev = dir != ST_COPY_H2D;

		if (st_cpu_strict_tagged(dst) != dst_dev || st_cpu_strict_tagged(src) != src_dev)
			st_cpu_strict_fail("a %s copy of %zu bytes from %s %p to %s %p: %s", names[dir],
					   bytes, st_cpu_strict_tagged(src) ? "device" : "host", src,
					   st_cpu_strict_tagged(dst) ? "device" : "host", dst,
					   "a side is not what the direction says");
		cmd.dst = dst = st_cpu_strict_host(dst);
		cmd.src = src = st_cpu_strict_host(src);
	}
	/* Catch the mistakes a real GPU would fault on. */
	if (dir == ST_COPY_H2D || dir == ST_COPY_D2D)
		assert((const char *)dst >= a && (const char *)dst + bytes <= end);
	if (dir == ST_COPY_D2H || dir == ST_COPY_D2D)
		assert((const char *)src >= a && (const char *)src + bytes <= end);
	(void)end;
	return cpu_enqueue(q, &cmd);
}

static int cpu_host_fn(struct st_device *d, struct st_queue *q, st_host_fn fn,
		       void *arg)
{
	struct cpu_cmd cmd = { .kind = CMD_FN, .fn = fn, .arg = arg };

	ST_UNUSED(d);
	return cpu_enqueue(q, &cmd);
}

static int cpu_event_record(struct st_device *d, struct st_event *e,
			    struct st_queue *q)
{
	ST_UNUSED(d);
	pthread_mutex_lock(&q->lock);
	e->q = q;
	e->seq = q->submitted;
	pthread_mutex_unlock(&q->lock);
	return 0;
}

static int cpu_event_query(struct st_device *d, struct st_event *e)
{
	ST_UNUSED(d);
	if (!e->q)
		return 1;
	return cpu_queue_completed(e->q) >= e->seq;
}

static int cpu_event_sync(struct st_device *d, struct st_event *e)
{
	ST_UNUSED(d);
	if (e->q)
		cpu_queue_wait_seq(e->q, e->seq);
	return 0;
}

static int cpu_queue_wait(struct st_device *d, struct st_queue *q,
			  struct st_event *e)
{
	struct cpu_cmd cmd = { .kind = CMD_WAIT, .wait_q = e->q,
			       .wait_seq = e->seq };

	ST_UNUSED(d);
	if (!e->q || e->q == q)
		return 0; /* same queue: already ordered */
	return cpu_enqueue(q, &cmd);
}

static int cpu_queue_sync(struct st_device *d, struct st_queue *q)
{
	uint64_t seq;

	ST_UNUSED(d);
	pthread_mutex_lock(&q->lock);
	seq = q->submitted;
	pthread_mutex_unlock(&q->lock);
	cpu_queue_wait_seq(q, seq);
	return 0;
}

/* The two cpu devices' tables: the same hooks but for open and caps.
 * pin_host, unpin_host, numa_node: optional, absent. */
#define CPU_DEVICE_OPS(dev_name, dev_caps, dev_open)                   \
	{                                                              \
		.name = dev_name, .caps = dev_caps,                    \
		.priv_bytes = sizeof(struct cpu_priv), .open = dev_open, \
		.close = cpu_close, .arena_base = cpu_arena_base,      \
		.queue_create = cpu_queue_create,                      \
		.queue_destroy = cpu_queue_destroy,                    \
		.event_create = cpu_event_create,                      \
		.event_destroy = cpu_event_destroy,                    \
		.memcpy_async = cpu_memcpy_async, .host_fn = cpu_host_fn, \
		.event_record = cpu_event_record,                      \
		.event_query = cpu_event_query,                        \
		.event_sync = cpu_event_sync,                          \
		.queue_wait = cpu_queue_wait, .queue_sync = cpu_queue_sync, \
	}

const struct st_device_ops st_device_cpu_ops =
	CPU_DEVICE_OPS("cpu", ST_DEVICE_CAP_UNIFIED, cpu_open);

/* Not unified: the host cannot read its memory, so the engine and the comms
 * take the paths they take on cuda. */
const struct st_device_ops st_device_cpu_strict_ops =
	CPU_DEVICE_OPS("cpu-strict", 0, cpu_strict_open);

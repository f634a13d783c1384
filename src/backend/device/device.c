/* Device wrappers: the only place that calls a device's hooks. They assert
 * arguments, keep the copy stats, and fill in defaults for optional hooks. */
#include "strata/device.h"

#include <assert.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct st_device {
	const struct st_device_ops *ops;
	struct st_device_config cfg;
	_Atomic uint64_t h2d_bytes, d2h_bytes, d2d_bytes, copies;
	void *priv;
};

static const struct st_device_ops *const st_devices[] = {
	&st_device_cpu_ops,
	&st_device_cpu_strict_ops,
#ifdef ST_HAVE_CUDA
	&st_device_cuda_ops,
#endif
};

const struct st_device_ops *st_device_find(const char *name)
{
	for (size_t i = 0; i < ST_ARRAY_LEN(st_devices); i++)
		if (name && strcmp(st_devices[i]->name, name) == 0)
			return st_devices[i];
	return NULL;
}

const char *st_device_list(void)
{
#ifdef ST_HAVE_CUDA
	return "cpu,cpu-strict,cuda";
#else
	return "cpu,cpu-strict";
#endif
}

bool st_device_on_host(const char *name)
{
	return !name || strcmp(name, "cpu") == 0 || strcmp(name, "cpu-strict") == 0;
}

const char *st_device_choose(bool cuda_built, st_device_probe_fn probe, int ordinal,
			     struct st_device_probe *p, char *why, size_t n)
{
	memset(p, 0, sizeof(*p));
	if (!cuda_built || !probe) {
		snprintf(p->what, sizeof(p->what), "built without CUDA (no nvcc when strata was "
			 "configured)");
		snprintf(why, n, "%s", p->what);
		return "cpu";
	}
	probe(ordinal, p);
	if (!p->usable) {
		snprintf(why, n, "no usable GPU: %s", p->what);
		return "cpu";
	}
	snprintf(why, n, "GPU %d, %s, %.1f GiB free of %.1f GiB", ordinal, p->what,
		 (double)p->free_bytes / (double)ST_GiB, (double)p->total_bytes / (double)ST_GiB);
	return "cuda";
}

static bool device_ops_valid(const struct st_device_ops *o)
{
	return o && o->name && o->open && o->close && o->arena_base &&
	       o->queue_create && o->queue_destroy && o->event_create &&
	       o->event_destroy && o->memcpy_async && o->host_fn &&
	       o->event_record && o->event_query && o->event_sync &&
	       o->queue_wait && o->queue_sync;
}

int st_device_create(const struct st_device_ops *ops,
		     const struct st_device_config *cfg, struct st_device **out)
{
	struct st_device *d;
	int ret;

	assert(out);
	*out = NULL;
	if (!device_ops_valid(ops))
		return st_error_set(-EINVAL, "device ops table lacks a required hook");
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->ops = ops;
	if (cfg)
		d->cfg = *cfg;
	if (ops->priv_bytes) {
		d->priv = calloc(1, ops->priv_bytes);
		if (!d->priv) {
			free(d);
			return -ENOMEM;
		}
	}
	ret = ops->open(d, &d->cfg);
	if (ret < 0) {
		free(d->priv);
		free(d);
		return ret;
	}
	*out = d;
	return 0;
}

void st_device_destroy(struct st_device *d)
{
	if (!d)
		return;
	d->ops->close(d);
	free(d->priv);
	free(d);
}

const char *st_device_name(const struct st_device *d)
{
	return d->ops->name;
}

int st_device_ordinal(const struct st_device *d)
{
	return d->cfg.ordinal;
}

void *st_device_priv(struct st_device *d)
{
	return d->priv;
}

void *st_device_arena(struct st_device *d, uint64_t *bytes)
{
	if (bytes)
		*bytes = d->cfg.mem_bytes;
	return d->ops->arena_base(d);
}

bool st_device_unified(const struct st_device *d)
{
	return d->ops->caps & ST_DEVICE_CAP_UNIFIED;
}

void st_device_get_stats(const struct st_device *d, struct st_device_stats *s)
{
	memset(s, 0, sizeof(*s));
	s->arena_bytes = d->cfg.mem_bytes;
	s->h2d_bytes = d->h2d_bytes;
	s->d2h_bytes = d->d2h_bytes;
	s->d2d_bytes = d->d2d_bytes;
	s->copies = d->copies;
}

int st_queue_create(struct st_device *d, struct st_queue **out)
{
	assert(d && out);
	return d->ops->queue_create(d, out);
}

void st_queue_destroy(struct st_device *d, struct st_queue *q)
{
	if (q)
		d->ops->queue_destroy(d, q);
}

int st_event_create(struct st_device *d, struct st_event **out)
{
	assert(d && out);
	return d->ops->event_create(d, out);
}

void st_event_destroy(struct st_device *d, struct st_event *e)
{
	if (e)
		d->ops->event_destroy(d, e);
}

int st_device_memcpy_async(struct st_device *d, struct st_queue *q, void *dst,
			   const void *src, size_t bytes, enum st_copy_dir dir)
{
	int ret;

	assert(d && q && (bytes == 0 || (dst && src)));
	if (bytes == 0)
		return 0;
	ret = d->ops->memcpy_async(d, q, dst, src, bytes, dir);
	if (ret == 0) {
		d->copies++;
		if (dir == ST_COPY_H2D)
			d->h2d_bytes += bytes;
		else if (dir == ST_COPY_D2H)
			d->d2h_bytes += bytes;
		else
			d->d2d_bytes += bytes;
	}
	return ret;
}

int st_device_host_fn(struct st_device *d, struct st_queue *q, st_host_fn fn,
		      void *arg)
{
	assert(d && q && fn);
	return d->ops->host_fn(d, q, fn, arg);
}

int st_event_record(struct st_device *d, struct st_event *e, struct st_queue *q)
{
	assert(d && e && q);
	return d->ops->event_record(d, e, q);
}

int st_event_query(struct st_device *d, struct st_event *e)
{
	assert(d && e);
	return d->ops->event_query(d, e);
}

int st_event_sync(struct st_device *d, struct st_event *e)
{
	assert(d && e);
	return d->ops->event_sync(d, e);
}

int st_queue_wait(struct st_device *d, struct st_queue *q, struct st_event *e)
{
	assert(d && q && e);
	return d->ops->queue_wait(d, q, e);
}

int st_queue_sync(struct st_device *d, struct st_queue *q)
{
	assert(d && q);
	return d->ops->queue_sync(d, q);
}

int st_device_pin_host(struct st_device *d, void *p, size_t bytes)
{
	assert(d && p);
	if (!d->ops->pin_host)
		return 0;
	return d->ops->pin_host(d, p, bytes);
}

void st_device_unpin_host(struct st_device *d, void *p)
{
	if (d && p && d->ops->unpin_host)
		d->ops->unpin_host(d, p);
}

bool st_device_can_pin(const struct st_device *d)
{
	return d->ops->pin_host && (d->ops->caps & ST_DEVICE_CAP_HOST_PINNED);
}

int st_device_numa_node(struct st_device *d)
{
	if (!d || !d->ops->numa_node)
		return -1;
	return d->ops->numa_node(d);
}

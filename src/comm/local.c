/* The local comm backend: world 1, rank 0, no wire.
 *
 * At world 1 every collective is the identity: reduce_scatter's one slice
 * is the whole buffer and its fold has one term, allgather's one slot is
 * the send, all-to-all's one slot is itself, broadcast's root is this rank.
 * So every hook is the same thing: nothing when in place (the core does not
 * even call it then), else one device-to-device copy on the comm's queue.
 * The copy goes through the device (st_device_memcpy_async, ST_COPY_D2D),
 * so this file is the same for the cpu device (a memmove on the queue's
 * worker thread) and the cuda device (cudaMemcpyAsync on the comm's
 * stream); it never reads a buffer from the host.
 *
 * A new backend starts from this file: copy it, fill the hooks, add its
 * table to st_comms[] in comm.c and its file to src/comm/meson.build
 * (docs/comm.md). */
#include "strata/comm.h"

#include "strata/device.h"

#include <errno.h>

static int local_open(struct st_comm *c, const struct st_comm_config *cfg, int *rank,
		      int *world)
{
	ST_UNUSED(c);
	ST_UNUSED(cfg);
	*rank = 0;
	*world = 1;
	return 0;
}

static void local_close(struct st_comm *c)
{
	ST_UNUSED(c);
}

/* The one move of world 1: recv = send, elems elements. */
static int local_copy(struct st_comm *c, const void *send, void *recv, size_t elems,
		      enum st_comm_dtype dt)
{
	if (send == recv)
		return 0;
	return st_device_memcpy_async(st_comm_device(c), st_comm_queue(c), recv, send,
				      elems * st_comm_dtype_bytes(dt), ST_COPY_D2D);
}

static int local_alltoall(struct st_comm *c, const void *send, void *recv,
			  size_t slice_elems, enum st_comm_dtype dt)
{
	return local_copy(c, send, recv, slice_elems, dt);
}

static int local_allgather(struct st_comm *c, const void *send, void *recv,
			   size_t slice_elems, enum st_comm_dtype dt)
{
	return local_copy(c, send, recv, slice_elems, dt);
}

static int local_broadcast(struct st_comm *c, const void *send, void *recv,
			   size_t count_elems, enum st_comm_dtype dt, int root)
{
	ST_UNUSED(root); /* 0, checked by the core */
	return local_copy(c, send, recv, count_elems, dt);
}

/* The fold of one term is the term: the order promise holds bit for bit. */
static int local_reduce_scatter(struct st_comm *c, const void *send, void *recv,
				size_t slice_elems, enum st_comm_dtype dt)
{
	return local_copy(c, send, recv, slice_elems, dt);
}

static int local_allreduce(struct st_comm *c, const void *send, void *recv,
			   size_t count_elems, enum st_comm_dtype dt)
{
	return local_copy(c, send, recv, count_elems, dt);
}

const struct st_comm_ops st_comm_local_ops = {
	.name = "local",
	.version = ST_COMM_OPS_VERSION,
	.priv_bytes = 0,
	.open = local_open,
	.close = local_close,
	.alltoall = local_alltoall,
	.allgather = local_allgather,
	.broadcast = local_broadcast,
	.reduce_scatter = local_reduce_scatter,
	.allreduce = local_allreduce,
	/* reduce_local: optional, absent (world 1 never sums). */
};

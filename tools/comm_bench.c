/* comm-bench: what strata's order promise costs against MPI's own
 * collectives, on the cpu device, across the ranks of an mpirun.
 *
 *   tests/mpi-run N build/tools/comm-bench [--mib LIST] [--rounds R]
 *
 * For each buffer size (MiB of fp32 per rank, the collective's full
 * buffer), rounds of, interleaved in one process:
 *   reduce_scatter  st_comm_reduce_scatter (all-to-all + the rank-order
 *                   sum on the comm's queue)  vs  MPI_Reduce_scatter_block
 *   allreduce       st_comm_allreduce (allgather + the rank-order sum)
 *                   vs  MPI_Allreduce
 *   allgather       st_comm_allgather (MPI_Allgather on the comm's queue)
 *                   vs  MPI_Allgather from the calling thread
 * each timed from a barrier to the slowest rank's end (MPI_MAX), and
 * prints per op and size the medians and the median of the per-round
 * ratios strata / MPI (1.0: no cost; above: the price of owning the
 * order). Rank 0 prints. The MPI results are not bit-checked (their order
 * is MPI's); strata's are the fold, as tests/comm checks. */
#include "strata/comm.h"
#include "strata/device.h"
#include "bench_stats.h"

#include <errno.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1024ull * 1024ull)
#define MAX_SIZES 8

enum { OP_RS, OP_AR, OP_AG, OPS };
static const char *const op_names[OPS] = { "reduce_scatter", "allreduce", "allgather" };

static void usage(FILE *f)
{
	fprintf(f, "usage: tests/mpi-run N comm-bench [--mib LIST] [--rounds R]\n"
		   "  strata's rank-order collectives (mpi backend, cpu device) against\n"
		   "  MPI's own, interleaved; prints medians and the median per-round ratio.\n"
		   "  --mib LIST   buffer sizes per rank in MiB of fp32, comma-separated (default 1,16)\n"
		   "  --rounds R   rounds per op and size (default 9)\n");
}

/* Seconds for one call of op by strata (which = 0) or MPI (1), the
 * slowest rank's. */
static double run_one(struct st_comm *c, int op, int which, float *send, float *recv,
		      size_t elems, int world, MPI_Comm mc)
{
	size_t slice = elems / (size_t)world;
	double t0, dt, worst;
	int ret = 0;

	MPI_Barrier(mc);
	t0 = MPI_Wtime();
	if (which == 0) {
		if (op == OP_RS)
			ret = st_comm_reduce_scatter(c, send, recv, slice, ST_COMM_F32);
		else if (op == OP_AR)
			ret = st_comm_allreduce(c, send, recv, elems, ST_COMM_F32);
		else
			ret = st_comm_allgather(c, send, recv, slice, ST_COMM_F32);
		if (ret == 0)
			ret = st_comm_sync(c);
	} else {
		if (op == OP_RS)
			ret = MPI_Reduce_scatter_block(send, recv, (int)slice, MPI_FLOAT, MPI_SUM, mc);
		else if (op == OP_AR)
			ret = MPI_Allreduce(send, recv, (int)elems, MPI_FLOAT, MPI_SUM, mc);
		else
			ret = MPI_Allgather(send, (int)slice, MPI_FLOAT, recv, (int)slice, MPI_FLOAT,
					    mc);
		ret = ret == MPI_SUCCESS ? 0 : -EIO;
	}
	dt = MPI_Wtime() - t0;
	if (ret != 0) {
		fprintf(stderr, "comm-bench: %s (%s) failed: %s\n", op_names[op],
			which ? "mpi" : "strata", st_error_last());
		st_comm_abort(c, 1);
	}
	MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, mc);
	return worst;
}

int main(int argc, char **argv)
{
	double mib[MAX_SIZES] = { 1, 16 };
	int n_sizes = 2, rounds = 9, rank, world;
	struct st_device *dev;
	struct st_comm *c;
	struct st_device_config dcfg = { 0 };
	struct st_comm_config cfg = { 0 };
	size_t max_elems = 0;
	char *arena, lib[256];
	MPI_Comm mc;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			return 0;
		} else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
			char *end;

			rounds = (int)strtol(argv[++i], &end, 10);
			if (*end || rounds < 1 || rounds > 1000) {
				fprintf(stderr, "comm-bench: --rounds wants 1..1000, not '%s'\n", argv[i]);
				return 2;
			}
		} else if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc) {
			char *s = argv[++i], *end;

			n_sizes = 0;
			for (;;) {
				double v = strtod(s, &end);

				if (end == s || v <= 0 || v > 1024 || n_sizes == MAX_SIZES ||
				    (*end && *end != ',')) {
					fprintf(stderr,
						"comm-bench: --mib wants up to %d sizes in (0, 1024], comma-separated, not '%s'\n",
						MAX_SIZES, argv[i]);
					return 2;
				}
				mib[n_sizes++] = v;
				if (!*end)
					break;
				s = end + 1;
			}
		} else {
			fprintf(stderr, "comm-bench: unknown argument '%s' (see --help)\n", argv[i]);
			return 2;
		}
	}
	for (int s = 0; s < n_sizes; s++)
		max_elems = ST_MAX(max_elems, (size_t)(mib[s] * MiB) / sizeof(float));
	max_elems = st_align_up(max_elems, 64);
	/* send, recv (world x, for allgather) and the scratch (world x) */
	dcfg.mem_bytes = st_align_up(max_elems * sizeof(float) * 18 + 4 * MiB, ST_PAGE_BYTES);
	if (st_device_create(&st_device_cpu_ops, &dcfg, &dev) != 0) {
		fprintf(stderr, "comm-bench: cpu device: %s\n", st_error_last());
		return 1;
	}
	arena = st_device_arena(dev, NULL);
	/* the scratch takes world x the largest buffer; 8 ranks at most here */
	cfg.scratch = arena;
	cfg.scratch_bytes = max_elems * sizeof(float) * 8;
	if (st_comm_create(&st_comm_mpi_ops, dev, &cfg, &c) != 0) {
		fprintf(stderr, "comm-bench: mpi comm: %s\n", st_error_last());
		return 1;
	}
	rank = st_comm_rank(c);
	world = st_comm_world(c);
	if (world > 8) {
		fprintf(stderr, "comm-bench: at most 8 ranks (the scratch), not %d\n", world);
		st_comm_abort(c, 2);
	}
	MPI_Comm_dup(MPI_COMM_WORLD, &mc);
	st_comm_library(&st_comm_mpi_ops, lib, sizeof(lib));
	if (rank == 0)
		printf("comm-bench: %d ranks, %s, %d rounds, fp32, cpu device\n"
		       "%-15s %9s %12s %12s %14s\n",
		       world, lib, rounds, "op", "MiB/rank", "strata ms", "mpi ms",
		       "strata/mpi");
	{
		float *send = (float *)(arena + cfg.scratch_bytes);
		float *recv = send + max_elems;
		double *ts = malloc(sizeof(double) * (size_t)rounds * 3);

		for (size_t i = 0; i < max_elems; i++)
			send[i] = (float)((i * 2654435761u + (size_t)rank) % 1000) * 1e-3f;
		for (int s = 0; s < n_sizes; s++) {
			size_t elems = (size_t)(mib[s] * MiB) / sizeof(float);

			elems -= elems % (size_t)world;
			for (int op = 0; op < OPS; op++) {
				double *a = ts, *b = ts + rounds, *r = ts + 2 * rounds;

				/* one warm-up of each, then rounds interleaved, the
				 * order alternating */
				run_one(c, op, 0, send, recv, elems, world, mc);
				run_one(c, op, 1, send, recv, elems, world, mc);
				for (int k = 0; k < rounds; k++) {
					int first = k % 2;

					double t1 = run_one(c, op, first, send, recv, elems, world, mc);
					double t2 = run_one(c, op, !first, send, recv, elems, world, mc);

					a[k] = first ? t2 : t1;
					b[k] = first ? t1 : t2;
					r[k] = a[k] / b[k];
				}
				if (rank == 0) {
					double ra = bench_median(r, rounds);

					printf("%-15s %9.2f %12.3f %12.3f %14.2f\n", op_names[op], mib[s],
					       1e3 * bench_median(a, rounds), 1e3 * bench_median(b, rounds), ra);
				}
			}
		}
		free(ts);
	}
	MPI_Comm_free(&mc);
	st_comm_destroy(c);
	st_device_destroy(dev);
	return 0;
}

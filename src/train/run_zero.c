/* A run at world > 1: the start-up agreement on the configuration, where
 * the ranks run (every rank learns every rank's host and node, its comm's
 * local rank: the launcher's MPI_COMM_TYPE_SHARED split, for the "world:"
 * line), that --save is one directory every node sees (docs/zero.md, Many
 * nodes), the stop every rank agrees on, and the metrics' ZeRO fields. */
#include "run_zero.h"
#include "strata/dataset.h"
#include "strata/device.h"

#include <cblas.h>
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int st_run_world(struct st_engine_config *ec)
{
	struct st_comm_launch l;

	st_comm_launch(&l);
	ec->world = l.launcher && l.world > 0 ? l.world : 1;
	ec->rank = l.launcher && l.rank >= 0 ? l.rank : 0;
	return st_comm_auto(ec->device, &ec->comm_ops);
}

/* A failure of the run's start at world > 1: exit 2 when the ranks
 * disagree (only rank 0 says where), 1 on a comm failure. */
static int zero_fail(struct st_run_result *res, int ret, int exit_code, bool quiet)
{
	res->exit_code = exit_code;
	res->quiet = quiet;
	return ret;
}

int st_run_zero_lines(struct st_comm *c, int rank, const char *const *lines, int n,
		      struct st_run_result *res)
{
	struct st_comm_disagreement dis;
	int ret = st_comm_agree(c, lines, n, &dis);

	if (ret < 0)
		return zero_fail(res, st_error_set(ret, "the ranks' agreement on the "
						   "configuration: %s", st_error_last()), 1, false);
	if (ret == 1)
		return zero_fail(res, st_error_set(-EINVAL, "the ranks do not run the same "
						   "configuration: rank %d has %s where rank 0 "
						   "has %s", dis.rank, dis.rank_text,
						   dis.rank0_text), 2, rank != 0);
	return 0;
}

/* One rank's node, as every rank learns it at start. */
struct zero_node {
	int32_t local_rank; /* 0: the node's first rank */
	char host[64];
};

/* The nearest existing directory at or above path (what --save DIR will
 * be made in), into buf: "." or "/" when no part of path exists. */
static void existing_dir(const char *path, char *buf, size_t bytes)
{
	struct stat st;
	char *slash;

	snprintf(buf, bytes, "%s", path);
	while (stat(buf, &st) < 0 || !S_ISDIR(st.st_mode)) {
		slash = strrchr(buf, '/');
		if (!slash) {
			snprintf(buf, bytes, ".");
			return;
		}
		if (slash == buf) {
			buf[1] = 0;
			return;
		}
		*slash = 0;
	}
}

/* --save DIR must be one directory that every node sees: rank 0 commits
 * what every rank pwrite()s into its files. Rank 0 writes a probe file
 * (a random token) where DIR is or will be made, and the first rank of
 * every other node reads it back; a node that does not see it ends the
 * run before step 1 (exit 2 on every rank, one line from rank 0). Rank 0
 * removes the probe before anyone returns. A probe rank 0 cannot write
 * checks nothing: the lock, next, reports that directory's error. */
static int zero_save_probe(struct st_comm *c, int rank, const struct zero_node *nodes,
			   const char *save, struct st_run_result *res)
{
	struct {
		char path[4200];
		char token[128];
	} pr = { 0 };
	struct st_comm_disagreement dis;
	const char *line = "save dir shared";
	char dir[4096], got[128] = "";
	int ret, fd;

	if (rank == 0) {
		struct timespec ts;

		existing_dir(save, dir, sizeof(dir));
		clock_gettime(CLOCK_REALTIME, &ts);
		snprintf(pr.token, sizeof(pr.token), "%s %d %lld.%09ld", nodes[0].host, (int)getpid(),
			 (long long)ts.tv_sec, ts.tv_nsec);
		snprintf(pr.path, sizeof(pr.path), "%s/.strata-node-probe.%d", dir, (int)getpid());
		fd = open(pr.path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		if (fd < 0 || write(fd, pr.token, strlen(pr.token)) != (ssize_t)strlen(pr.token) ||
		    fsync(fd) < 0)
			pr.token[0] = 0;
		if (fd >= 0)
			close(fd);
		if (!pr.token[0])
			unlink(pr.path);
	}
	ret = st_comm_host_broadcast(c, &pr, sizeof(pr), 0);
	if (ret < 0)
		return zero_fail(res, st_error_set(ret, "the ranks' check of --save: %s",
						   st_error_last()), 1, false);
	if (rank != 0 && nodes[rank].local_rank == 0 && pr.token[0]) {
		fd = open(pr.path, O_RDONLY | O_CLOEXEC);
		if (fd >= 0) {
			ssize_t n = read(fd, got, sizeof(got) - 1);

			got[n > 0 ? n : 0] = 0;
			close(fd);
		}
		if (strcmp(got, pr.token) != 0)
			line = "save dir not seen";
	}
	ret = st_comm_agree(c, &line, 1, &dis);
	if (rank == 0 && pr.token[0])
		unlink(pr.path);
	if (ret < 0)
		return zero_fail(res, st_error_set(ret, "the ranks' check of --save: %s",
						   st_error_last()), 1, false);
	if (ret == 1)
		return zero_fail(res, st_error_set(-EINVAL, "--save %s is not one directory shared "
						   "by every node: rank %d on %s does not see the "
						   "file rank 0 on %s wrote in %s (give every node "
						   "the same shared directory: docs/zero.md, Many "
						   "nodes)", save, dis.rank, nodes[dis.rank].host,
						   nodes[0].host, dir), 2, rank != 0);
	return 0;
}

/* Collective on c: fills *wi from every rank's host and local rank; with
 * save on more than one node, checks that every node sees the same DIR. */
static int zero_nodes(struct st_comm *c, int rank, const char *save, struct st_run_nodes *wi,
		      struct st_run_result *res)
{
	int w = st_comm_world(c), ret;
	struct zero_node me = { .local_rank = st_comm_local_rank(c) }, *all;
	size_t at = 0;

	if (gethostname(me.host, sizeof(me.host) - 1) < 0)
		snprintf(me.host, sizeof(me.host), "?");
	if (!(all = calloc((size_t)w, sizeof(*all))))
		return zero_fail(res, st_error_set(-ENOMEM, "the ranks' nodes: out of memory"), 1,
				 false);
	ret = st_comm_host_allgather(c, &me, all, sizeof(me));
	if (ret < 0) {
		free(all);
		return zero_fail(res, st_error_set(ret, "the ranks' nodes: %s", st_error_last()), 1,
				 false);
	}
	wi->nodes = 0;
	wi->hosts[0] = 0;
	for (int q = 0; q < w; q++) {
		int last = q;

		if (all[q].local_rank != 0)
			continue;
		wi->nodes++;
		/* a node's ranks as the launcher placed them: consecutive
		 * (by slot, mpirun's default) or not, the first and last of the
		 * node's ranks say which */
		for (int k = q + 1; k < w; k++)
			if (strcmp(all[k].host, all[q].host) == 0)
				last = k;
		if (at < sizeof(wi->hosts))
			at += (size_t)snprintf(wi->hosts + at, sizeof(wi->hosts) - at,
					       last > q ? "%s%s (ranks %d-%d)" : "%s%s (rank %d)",
					       at ? ", " : "", all[q].host, q, last);
	}
	ret = save && wi->nodes > 1 ? zero_save_probe(c, rank, all, save, res) : 0;
	free(all);
	return ret;
}

/* The lines every rank must have alike, into lines[*n] (malloc'd, NULL
 * where out of memory). */
static void zero_lines(json_object *o, const struct st_dataset *ds, const char *run_line,
		       char **lines, int *n)
{
	char buf[256];

	*n = 0;
	json_object_object_foreach(o, key, val) {
		size_t len;

		if (*n >= 61)
			break;
		len = strlen(key) + strlen(json_object_to_json_string(val)) + 2;
		lines[*n] = malloc(len);
		if (lines[*n])
			snprintf(lines[(*n)++], len, "%s=%s", key, json_object_to_json_string(val));
	}
	snprintf(buf, sizeof(buf), "data tokens=%llu max=%u",
		 (unsigned long long)st_dataset_tokens(ds), st_dataset_max_token(ds));
	lines[(*n)++] = strdup(buf);
	/* what decides which collectives a step runs besides the model: the
	 * saves, the resume, the metrics' gathers */
	lines[(*n)++] = strdup(run_line);
	/* BLAS's kernels decide the forward's and backward's bits: a
	 * DYNAMIC_ARCH OpenBLAS picks them by the CPU (or OPENBLAS_CORETYPE),
	 * so nodes with other CPUs would train apart, silently */
	snprintf(buf, sizeof(buf), "blas=%s", openblas_get_config());
	buf[strcspn(buf, "\n")] = 0;
	lines[(*n)++] = strdup(buf);
}

int st_run_zero_agree(const struct st_engine_config *ec, const char *cfg_json,
		      const struct st_dataset *ds, const char *run_line, const char *save,
		      struct st_run_nodes *wi, struct st_run_result *res)
{
	struct st_device_config dc = { .mem_bytes = 1 << 20 };
	struct st_device *d = NULL;
	struct st_comm *c = NULL;
	json_object *o;
	char *lines[64];
	int n = 0, ret;

	if (ec->world == 1 || !(o = json_tokener_parse(cfg_json)))
		return 0;
	zero_lines(o, ds, run_line, lines, &n);
	json_object_put(o);
	/* host lines: over mpi where built (nccl, the cuda device's, needs a GPU) */
	ret = st_device_create(st_device_find("cpu"), &dc, &d);
	if (ret == 0)
		ret = st_comm_create(st_comm_find("mpi") ? st_comm_find("mpi") : ec->comm_ops, d,
				     NULL, &c);
	if (ret < 0)
		ret = zero_fail(res, st_error_set(ret, "the ranks' agreement on the "
						  "configuration: %s", st_error_last()), 1, false);
	for (int i = 0; ret == 0 && i < n; i++)
		if (!lines[i])
			ret = zero_fail(res, st_error_set(-ENOMEM, "the ranks' agreement on the "
							  "configuration: out of memory"), 1, false);
	if (ret == 0)
		ret = st_run_zero_lines(c, ec->rank, (const char *const *)lines, n, res);
	if (ret == 0)
		ret = zero_nodes(c, ec->rank, save, wi, res);
	st_comm_destroy(c);
	st_device_destroy(d);
	for (int i = 0; i < n; i++)
		free(lines[i]);
	return ret;
}

int st_run_zero_any(struct st_engine *e, bool flag, bool *any)
{
	struct st_comm *c = st_engine_comm(e);
	int w = st_comm_world(c), ret;
	int32_t mine = flag, *all;

	*any = flag;
	if (w == 1)
		return 0;
	if (!(all = calloc((size_t)w, sizeof(*all))))
		return st_error_set(-ENOMEM, "the ranks' stop flags: out of memory");
	ret = st_comm_host_allgather(c, &mine, all, sizeof(mine));
	if (ret < 0) {
		free(all);
		return st_error_set(ret, "the ranks' stop flags: %s", st_error_last());
	}
	*any = false;
	for (int i = 0; i < w; i++)
		*any = *any || all[i];
	free(all);
	return 0;
}

int st_run_zero_peaks(struct st_engine *e, const struct st_engine_stats *es, uint64_t **all)
{
	struct st_comm *c = st_engine_comm(e);
	uint64_t mine[ST_HOME_COUNT];
	int ret;

	if (!*all && !(*all = calloc((size_t)st_comm_world(c) * ST_HOME_COUNT, sizeof(**all))))
		return st_error_set(-ENOMEM, "out of memory");
	for (int h = 0; h < ST_HOME_COUNT; h++)
		mine[h] = es->has_tier[h] ? es->peak_bytes[h] : 0;
	ret = st_comm_host_allgather(c, mine, *all, sizeof(mine));
	if (ret < 0)
		return st_error_set(ret, "the ranks' peaks: %s", st_error_last());
	return 0;
}

void st_run_zero_metrics(FILE *mf, const struct st_comm_stats *a, const struct st_comm_stats *b,
			 const uint64_t *peaks, int world)
{
	fprintf(mf, "},\"comm\":{");
	for (int k = 0, first = 1; k < ST_COMM_KINDS; k++) {
		uint64_t calls = b->kind[k].calls - a->kind[k].calls;

		if (!calls)
			continue;
		fprintf(mf, "%s\"%s\":{\"calls\":%llu,\"bytes\":%llu,\"busy_s\":%.6f}",
			first ? "" : ",", st_comm_kind_name((enum st_comm_kind)k),
			(unsigned long long)calls,
			(unsigned long long)(b->kind[k].bytes - a->kind[k].bytes),
			(double)(b->kind[k].busy_ns - a->kind[k].busy_ns) / 1e9);
		first = 0;
	}
	fprintf(mf, "},\"rank_peak\":[");
	for (int q = 0; peaks && q < world; q++) {
		fprintf(mf, "%s{", q ? "," : "");
		for (int h = 0; h < ST_HOME_COUNT; h++)
			fprintf(mf, "%s\"%s\":%llu", h ? "," : "", st_home_name(h),
				(unsigned long long)peaks[q * ST_HOME_COUNT + h]);
		fprintf(mf, "}");
	}
	fprintf(mf, "]");
}

/* strata train at world > 1: where the ranks run. Every rank learns
 * every rank's host and node (its comm's local rank: the launcher's
 * MPI_COMM_TYPE_SHARED split) for the "world:" line, and the nodes check
 * that --save is one directory they all see (docs/zero.md, Many nodes). */
#include "cli.h"
#include "strata/comm.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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
 * removes the probe before anyone exits. A probe rank 0 cannot write
 * checks nothing: the lock, next, reports that directory's error. */
static void zero_save_probe(struct st_comm *c, int rank, const struct zero_node *nodes,
			    const char *save)
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
	if (st_comm_host_broadcast(c, &pr, sizeof(pr), 0) < 0)
		st_cli_die(1, "the ranks' check of --save: %s", st_error_last());
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
		st_cli_die(1, "the ranks' check of --save: %s", st_error_last());
	if (ret == 1) {
		if (rank == 0)
			fprintf(stderr, "strata: --save %s is not one directory shared by every "
				"node: rank %d on %s does not see the file rank 0 on %s wrote in "
				"%s (give every node the same shared directory: docs/zero.md, "
				"Many nodes)\n", save, dis.rank, nodes[dis.rank].host, nodes[0].host,
				dir);
		fflush(stderr);
		exit(2);
	}
}

void st_cli_zero_nodes(struct st_comm *c, int rank, const char *save, struct st_cli_world *wi)
{
	int w = st_comm_world(c);
	struct zero_node me = { .local_rank = st_comm_local_rank(c) }, *all;
	size_t at = 0;

	if (gethostname(me.host, sizeof(me.host) - 1) < 0)
		snprintf(me.host, sizeof(me.host), "?");
	if (!(all = calloc((size_t)w, sizeof(*all))))
		st_cli_die(1, "the ranks' nodes: out of memory");
	if (st_comm_host_allgather(c, &me, all, sizeof(me)) < 0)
		st_cli_die(1, "the ranks' nodes: %s", st_error_last());
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
	if (save && wi->nodes > 1)
		zero_save_probe(c, rank, all, save);
	free(all);
}

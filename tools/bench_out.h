/* The file a benchmark writes at its end (--json FILE of tools/adam_bench.c,
 * copy_bench.c, nvme_bench.c, offload_bench.c, split_bench.c and
 * train_bench.c): its directory checked before the run, and the file
 * written aside and renamed into place, so a failure (ENOSPC) leaves
 * neither an empty nor a partial file, and says which file and why. */
#ifndef STRATA_TOOLS_BENCH_OUT_H
#define STRATA_TOOLS_BENCH_OUT_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Before the run: exit 2 when PATH's directory does not exist or PATH is a
 * directory, 1 (one line) when that directory cannot be written. */
static inline void bench_out_check(const char *prog, const char *flag, const char *path)
{
	const char *slash = strrchr(path, '/');
	char dir[4096];
	struct stat st;

	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else
		snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : (int)(slash - path), path);
	if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
		fprintf(stderr, "%s: %s %s: its directory %s does not exist\n", prog, flag, path, dir);
		exit(2);
	}
	if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
		fprintf(stderr, "%s: %s %s: is a directory\n", prog, flag, path);
		exit(2);
	}
	if (access(dir, W_OK | X_OK) < 0) {
		fprintf(stderr, "%s: %s: cannot write (%s)\n", prog, path, strerror(errno));
		exit(1);
	}
}

/* TEXT written to PATH through PATH.tmp.PID: 0, or -1 after one line
 * "PROG: PATH: cannot write (why)", with the temporary removed. */
static inline int bench_out_write(const char *prog, const char *path, const char *text)
{
	char tmp[4096];
	FILE *f;
	int e = 0;

	snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
	f = fopen(tmp, "w");
	if (!f) {
		e = errno;
	} else {
		errno = 0;
		if (fputs(text, f) == EOF || fflush(f) != 0)
			e = errno ? errno : EIO;
		if (fclose(f) != 0 && !e)
			e = errno ? errno : EIO;
		if (!e && rename(tmp, path) < 0)
			e = errno;
		if (e)
			unlink(tmp);
	}
	if (!e)
		return 0;
	fprintf(stderr, "%s: %s: cannot write (%s)\n", prog, path, strerror(e));
	return -1;
}

#endif

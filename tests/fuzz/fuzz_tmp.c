/* Temporary files for the path-only readers' harnesses (fuzz_tmp.h). */
#include "fuzz_tmp.h"

#include "strata/common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char st_fuzz_dir[256];
static char st_fuzz_path[512];
static char st_fuzz_made[8][64]; /* names written, removed at exit */
static int st_fuzz_n_made;

static void st_fuzz_cleanup(void)
{
	char p[512];

	for (int i = 0; i < st_fuzz_n_made; i++) {
		snprintf(p, sizeof(p), "%.255s/%.63s", st_fuzz_dir,
			 st_fuzz_made[i]);
		unlink(p);
	}
	rmdir(st_fuzz_dir);
}

const char *st_fuzz_tmp_path(const char *name)
{
	int known = 0;

	if (!st_fuzz_dir[0]) {
		const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm"
				   : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";

		snprintf(st_fuzz_dir, sizeof(st_fuzz_dir),
			 "%s/strata-fuzz-XXXXXX", base);
		if (!mkdtemp(st_fuzz_dir))
			abort();
		atexit(st_fuzz_cleanup);
	}
	for (int i = 0; i < st_fuzz_n_made; i++)
		known |= strcmp(st_fuzz_made[i], name) == 0;
	if (!known) {
		if (st_fuzz_n_made == 8 || strlen(name) >= 64)
			abort();
		strcpy(st_fuzz_made[st_fuzz_n_made++], name);
	}
	snprintf(st_fuzz_path, sizeof(st_fuzz_path), "%.255s/%.63s", st_fuzz_dir,
		 name);
	return st_fuzz_path;
}

const char *st_fuzz_tmp_write(const char *name, const uint8_t *data,
			      size_t size)
{
	const char *path = st_fuzz_tmp_path(name);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	size_t done = 0;

	if (fd < 0)
		abort();
	while (done < size) {
		ssize_t n = write(fd, data + done, size - done);

		if (n <= 0)
			abort();
		done += (size_t)n;
	}
	if (close(fd))
		abort();
	return path;
}

void st_fuzz_check_refusal(int err, const char *path, int also)
{
	const char *msg = st_error_last();
	size_t len = strlen(path);

	if (err != -EINVAL && err != -ENOMEM && (also == 0 || err != also))
		abort();
	if (strncmp(msg, path, len) != 0 || strncmp(msg + len, ": ", 2) != 0 ||
	    strchr(msg, '\n'))
		abort();
}

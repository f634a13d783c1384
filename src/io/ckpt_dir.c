/* Checkpoint directories: the protocol that keeps the last complete
 * checkpoint readable (a temporary directory, fsynced, renamed; the latest
 * link; pruning to --keep; the lock), the listing of step-N directories and
 * what --resume takes. */
#include "strata/ckpt.h"

#include "ckpt_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* malloc'd printf, NULL when out of memory. */
char *st_ckpt_fmt(const char *fmt, ...)
{
	va_list ap;
	char *s;
	int n;

	va_start(ap, fmt);
	n = vasprintf(&s, fmt, ap);
	va_end(ap);
	return n < 0 ? NULL : s;
}

/* ---- directories ------------------------------------------------------------- */

static int ckpt_fsync_path(const char *path, int flags)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | flags), err = 0;

	if (fd < 0 || fsync(fd) < 0) {
		err = -errno;
		st_error_set(err, "%s: fsync: %s", path, strerror(-err));
	}
	if (fd >= 0)
		close(fd);
	return err;
}

/* Remove dirfd/name and, for a directory, everything below it. */
static int ckpt_rm_tree_at(int dirfd, const char *name)
{
	struct dirent *de;
	DIR *dir;
	int fd, err = 0;

	if (unlinkat(dirfd, name, 0) == 0 || errno == ENOENT)
		return 0;
	if (errno != EISDIR && errno != EPERM)
		return -errno;
	fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
		    O_CLOEXEC);
	if (fd < 0)
		return -errno;
	dir = fdopendir(fd);
	if (!dir) {
		err = -errno;
		close(fd);
		return err;
	}
	while ((de = readdir(dir))) {
		int e;

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		e = ckpt_rm_tree_at(fd, de->d_name);
		if (e && !err)
			err = e;
	}
	closedir(dir);
	if (unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT && !err)
		err = -errno;
	return err;
}

static int ckpt_rm_tree(const char *path)
{
	return ckpt_rm_tree_at(AT_FDCWD, path);
}

/* mkdir -p. */
static int ckpt_mkdirs(const char *path)
{
	char *p = strdup(path);
	int err = 0;

	if (!p)
		return st_error_set(-ENOMEM, "out of memory");
	for (char *s = p + 1; !err; s++) {
		bool end = *s == '\0';

		if (*s != '/' && !end)
			continue;
		*s = '\0';
		if (mkdir(p, 0755) < 0 && errno != EEXIST) {
			err = -errno;
			st_error_set(err, "cannot create %s: %s", p,
				     strerror(-err));
		}
		if (end)
			break;
		*s = '/';
	}
	free(p);
	return err;
}

/* The pid of a leftover "<anything>.tmp.<pid>", or 0 when name is not one. */
static long ckpt_tmp_pid(const char *name)
{
	const char *t = strstr(name, ".tmp."), *next;
	char *end;
	long pid;

	if (!t)
		return 0;
	/* The last ".tmp." counts. */
	while ((next = strstr(t + 1, ".tmp.")))
		t = next;
	t += 5;
	if (*t < '1' || *t > '9')
		return 0;
	pid = strtol(t, &end, 10);
	return *end == '\0' && pid > 0 ? pid : 0;
}

/* Remove root's "step-*.tmp.<pid>", "latest.tmp.<pid>" and "best.tmp.<pid>"
 * (--keep-best's link) entries whose
 * writer is gone (or is us: a leftover of an earlier failure). A live
 * writer's are left alone. */
static void ckpt_clean_stale(const char *root)
{
	int fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct dirent *de;
	DIR *dir;

	if (fd < 0)
		return;
	dir = fdopendir(fd);
	if (!dir) {
		close(fd);
		return;
	}
	while ((de = readdir(dir))) {
		long pid = ckpt_tmp_pid(de->d_name);

		/* Only names this module makes: root may be a directory the
		 * user keeps other things in. */
		if (!pid || (strncmp(de->d_name, "step-", 5) != 0 &&
			     strncmp(de->d_name, ST_CKPT_LATEST ".tmp.", 11) != 0 &&
			     strncmp(de->d_name, ST_CKPT_BEST ".tmp.", 9) != 0))
			continue;
		if (pid != (long)getpid() && !(kill((pid_t)pid, 0) < 0 &&
					      errno == ESRCH))
			continue;
		ckpt_rm_tree_at(fd, de->d_name);
	}
	closedir(dir);
}

static void ckpt_dir_free(struct st_ckpt_dir *d)
{
	free(d->root);
	free(d->final);
	free(d->tmp);
	memset(d, 0, sizeof(*d));
}

int st_ckpt_dir_begin(struct st_ckpt_dir *d, const char *root, uint64_t step)
{
	int err;

	memset(d, 0, sizeof(*d));
	d->step = step;
	d->root = strdup(root);
	d->final = st_ckpt_fmt("%s/step-%06llu", root, (unsigned long long)step);
	d->tmp = st_ckpt_fmt("%s.tmp.%ld", d->final ? d->final : "",
			     (long)getpid());
	if (!d->root || !d->final || !d->tmp) {
		ckpt_dir_free(d);
		return st_error_set(-ENOMEM, "out of memory");
	}
	err = ckpt_mkdirs(root);
	if (err) {
		ckpt_dir_free(d);
		return err;
	}
	ckpt_clean_stale(root);
	if (mkdir(d->tmp, 0755) < 0) {
		err = -errno;
		st_error_set(err, "cannot create %s: %s", d->tmp,
			     strerror(-err));
		ckpt_dir_free(d);
		return err;
	}
	return 0;
}

/* The topmost of path and its parents that does not exist (malloc'd), or
 * NULL when path exists. */
static char *ckpt_missing_top(const char *path)
{
	char *p = strdup(path), *top = NULL, *slash;
	size_t n = p ? strlen(p) : 0;
	struct stat st;

	while (n > 1 && p[n - 1] == '/')
		p[--n] = '\0';
	while (p && stat(p, &st) < 0 && errno == ENOENT) {
		free(top);
		top = strdup(p);
		slash = strrchr(p, '/');
		if (!top || !slash || slash == p)
			break;
		*slash = '\0';
	}
	free(p);
	return top;
}

int st_ckpt_lock(const char *root, int *fd, char **made)
{
	int err;

	*fd = -1;
	*made = ckpt_missing_top(root);
	err = ckpt_mkdirs(root);
	if (err)
		return err;
	*fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (*fd < 0) {
		err = -errno;
		return st_error_set(err, "cannot open %s: %s", root, strerror(-err));
	}
	if (flock(*fd, LOCK_EX | LOCK_NB) == 0)
		return 0;
	err = -errno;
	close(*fd);
	*fd = -1;
	if (err == -EWOULDBLOCK)
		return st_error_set(-EBUSY, "%s: another process is saving checkpoints here "
				    "(it holds the directory's lock)", root);
	/* ENOLCK, or a file system whose flock needs a file open for writing */
	st_warn("%s: cannot lock it (%s); make sure no other run saves there", root,
		strerror(-err));
	return 0;
}

void st_ckpt_unlock(int fd)
{
	if (fd >= 0)
		close(fd);
}

void st_ckpt_dir_abort(struct st_ckpt_dir *d)
{
	if (d->tmp)
		ckpt_rm_tree(d->tmp);
	ckpt_dir_free(d);
}

/* fsync every regular file in dir, then dir. */
static int ckpt_fsync_tree(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC), err = 0;
	struct dirent *de;
	DIR *dir;

	if (fd < 0 || !(dir = fdopendir(fd))) {
		err = -errno;
		if (fd >= 0)
			close(fd);
		return st_error_set(err, "%s: %s", path, strerror(-err));
	}
	while (!err && (de = readdir(dir))) {
		int ffd;

		if (de->d_name[0] == '.')
			continue;
		ffd = openat(fd, de->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (ffd < 0 || fsync(ffd) < 0) {
			err = -errno;
			st_error_set(err, "%s/%s: fsync: %s", path, de->d_name,
				     strerror(-err));
		}
		if (ffd >= 0)
			close(ffd);
	}
	if (!err && fsync(fd) < 0) {
		err = -errno;
		st_error_set(err, "%s: fsync: %s", path, strerror(-err));
	}
	closedir(dir);
	return err;
}

/* Move tmp to final; when final exists, swap and remove the old one. */
static int ckpt_publish(const struct st_ckpt_dir *d)
{
	char *old;
	int err;

	if (rename(d->tmp, d->final) == 0)
		return 0;
	/* rename() refuses to replace a non-empty directory. */
	if (errno != ENOTEMPTY && errno != EEXIST)
		goto fail;
	if (renameat2(AT_FDCWD, d->tmp, AT_FDCWD, d->final,
		      RENAME_EXCHANGE) == 0) {
		ckpt_rm_tree(d->tmp); /* the old contents now */
		return 0;
	}
	if (errno != EINVAL && errno != ENOSYS)
		goto fail;
	/* No RENAME_EXCHANGE on this file system: move the old one aside
	 * under a name the next begin cleans up, then move in the new. There
	 * is an instant without d->final; latest still names it. */
	old = st_ckpt_fmt("%s.old.tmp.%ld", d->final, (long)getpid());
	if (!old)
		return st_error_set(-ENOMEM, "out of memory");
	if (rename(d->final, old) < 0 || rename(d->tmp, d->final) < 0) {
		err = -errno;
		free(old);
		return st_error_set(err, "cannot move %s to %s: %s", d->tmp,
				    d->final, strerror(-err));
	}
	ckpt_rm_tree(old);
	free(old);
	return 0;
fail:
	err = -errno;
	return st_error_set(err, "cannot move %s to %s: %s", d->tmp, d->final,
			    strerror(-err));
}

static int ckpt_set_latest(const struct st_ckpt_dir *d)
{
	const char *name = strrchr(d->final, '/') + 1;
	char *link = st_ckpt_fmt("%s/" ST_CKPT_LATEST, d->root);
	char *tmp = st_ckpt_fmt("%s/" ST_CKPT_LATEST ".tmp.%ld", d->root,
				(long)getpid());
	int err = 0;

	if (!link || !tmp) {
		err = st_error_set(-ENOMEM, "out of memory");
		goto out;
	}
	unlink(tmp);
	/* Relative, so the directory can be moved or copied whole. */
	if (symlink(name, tmp) < 0 || rename(tmp, link) < 0) {
		err = -errno;
		st_error_set(err, "cannot point %s at %s: %s", link, name,
			     strerror(-err));
		unlink(tmp);
		goto out;
	}
	err = ckpt_fsync_path(d->root, O_DIRECTORY);
out:
	free(link);
	free(tmp);
	return err;
}

/* The N of "step-N" (digits only), or -1. */
static int64_t ckpt_step_of(const char *name)
{
	char *end;
	unsigned long long v;

	if (strncmp(name, "step-", 5) != 0 || name[5] < '0' || name[5] > '9')
		return -1;
	errno = 0;
	v = strtoull(name + 5, &end, 10);
	if (*end || errno || v > INT64_MAX)
		return -1;
	return (int64_t)v;
}

static int ckpt_cmp_desc(const void *a, const void *b)
{
	int64_t x = ((const struct st_ckpt_step *)a)->step;
	int64_t y = ((const struct st_ckpt_step *)b)->step;

	return x < y ? 1 : x > y ? -1 : 0;
}

void st_ckpt_list_free(struct st_ckpt_step *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(s[i].name);
	free(s);
}

int st_ckpt_list(const char *root, struct st_ckpt_step **out, size_t *out_n)
{
	DIR *dir = opendir(root);
	struct st_ckpt_step *steps = NULL;
	struct dirent *de;
	size_t n = 0, cap = 0;

	if (!dir) {
		int err = -errno;

		return st_error_set(err, "%s: %s", root, strerror(-err));
	}
	while ((de = readdir(dir))) {
		int64_t s = ckpt_step_of(de->d_name);

		if (s < 0 || (de->d_type != DT_DIR && de->d_type != DT_UNKNOWN))
			continue;
		if (n == cap) {
			struct st_ckpt_step *p;

			cap = cap ? 2 * cap : 16;
			p = realloc(steps, cap * sizeof(*p));
			if (!p)
				goto oom;
			steps = p;
		}
		steps[n].step = s;
		steps[n].name = strdup(de->d_name);
		if (!steps[n++].name)
			goto oom;
	}
	closedir(dir);
	if (n)
		qsort(steps, n, sizeof(*steps), ckpt_cmp_desc);
	*out = steps;
	*out_n = n;
	return 0;
oom:
	closedir(dir);
	st_ckpt_list_free(steps, n);
	return st_error_set(-ENOMEM, "out of memory");
}

int st_ckpt_stamp(const char *dir, struct st_ckpt_stamp *s)
{
	struct stat sb;

	if (stat(dir, &sb) < 0) {
		int err = -errno;

		return st_error_set(err, "%s: %s", dir, strerror(-err));
	}
	if (!S_ISDIR(sb.st_mode))
		return st_error_set(-ENOTDIR, "%s: not a directory", dir);
	*s = (struct st_ckpt_stamp){ (uint64_t)sb.st_dev, (uint64_t)sb.st_ino };
	return 0;
}

enum st_ckpt_fate st_ckpt_fate(const char *dir, const struct st_ckpt_stamp *s)
{
	struct stat sb;

	if (stat(dir, &sb) < 0)
		return errno == ENOENT || errno == ENOTDIR ? ST_CKPT_PRUNED : ST_CKPT_THERE;
	if ((uint64_t)sb.st_dev != s->dev || (uint64_t)sb.st_ino != s->ino)
		return ST_CKPT_REPLACED;
	return ST_CKPT_THERE;
}

static int ckpt_prune(const struct st_ckpt_dir *d, unsigned keep)
{
	const char *mine = strrchr(d->final, '/') + 1;
	struct st_ckpt_step *steps;
	size_t n, kept = 0;
	int err = st_ckpt_list(d->root, &steps, &n);

	char *blink = st_ckpt_fmt("%s/" ST_CKPT_BEST, d->root), best[256];
	ssize_t bl = blink ? readlink(blink, best, sizeof(best) - 1) : -1;

	free(blink);
	best[bl > 0 ? bl : 0] = '\0';
	if (err)
		return err;
	for (size_t i = 0; i < n; i++) {
		char *name, *doomed;

		if (steps[i].step > (int64_t)d->step)
			continue;
		/* the best checkpoint (--keep-best) stays, whatever --keep says */
		if (best[0] && strcmp(steps[i].name, best) == 0)
			continue;
		if (strcmp(steps[i].name, mine) == 0 || kept++ < keep - 1)
			continue;
		name = st_ckpt_fmt("%s/%s", d->root, steps[i].name);
		doomed = st_ckpt_fmt("%s.tmp.%ld", name ? name : "",
				     (long)getpid());
		/* Renamed first, so a crash while removing leaves a *.tmp.*
		 * leftover for the next begin, not a half-deleted step-N. */
		if (name && doomed && rename(name, doomed) == 0) {
			int e = ckpt_rm_tree(doomed);

			if (e && !err)
				err = st_error_set(e, "cannot remove %s: %s",
						   doomed, strerror(-e));
		}
		free(name);
		free(doomed);
	}
	st_ckpt_list_free(steps, n);
	if (!err)
		err = ckpt_fsync_path(d->root, O_DIRECTORY);
	return err;
}

int st_ckpt_dir_commit(struct st_ckpt_dir *d, unsigned keep)
{
	int err = ckpt_fsync_tree(d->tmp);

	if (!err)
		err = ckpt_publish(d);
	if (err) {
		st_ckpt_dir_abort(d);
		return err;
	}
	err = ckpt_fsync_path(d->root, O_DIRECTORY);
	if (!err)
		err = ckpt_set_latest(d);
	if (!err && keep)
		err = ckpt_prune(d, keep);
	ckpt_dir_free(d);
	return err;
}

static bool ckpt_exists(const char *dir, const char *name, bool want_dir)
{
	char *p = st_ckpt_fmt("%s/%s", dir, name);
	struct stat sb;
	bool ok = p && stat(p, &sb) == 0 &&
		  (want_dir ? S_ISDIR(sb.st_mode) : S_ISREG(sb.st_mode));

	free(p);
	return ok;
}

int st_ckpt_resolve(const char *path, char **out)
{
	struct st_ckpt_step *steps;
	char target[4096];
	size_t n;
	ssize_t len;
	char *link;
	bool dangling = false;
	int err;

	*out = NULL;
	if (ckpt_exists(path, ST_CKPT_TRAINER_FILE, false)) {
		*out = strdup(path);
		return *out ? 0 : st_error_set(-ENOMEM, "out of memory");
	}
	link = st_ckpt_fmt("%s/" ST_CKPT_LATEST, path);
	if (!link)
		return st_error_set(-ENOMEM, "out of memory");
	len = readlink(link, target, sizeof(target) - 1);
	free(link);
	if (len > 0) {
		struct stat sb;

		target[len] = '\0';
		*out = target[0] == '/' ? strdup(target)
					: st_ckpt_fmt("%s/%s", path, target);
		if (!*out)
			return st_error_set(-ENOMEM, "out of memory");
		if (stat(*out, &sb) == 0)
			return 0;
		if (errno != ENOENT) {
			err = -errno;
			free(*out);
			*out = NULL;
			if (err == -ELOOP)
				return st_error_set(err, "%s/" ST_CKPT_LATEST " -> %s: a "
						    "symlink loop (ELOOP): it must name a "
						    "step-N directory", path, target);
			return st_error_set(err, "%s/" ST_CKPT_LATEST " -> %s: %s", path,
					    target, strerror(-err));
		}
		/* latest names a directory that is gone (a crash while a step
		 * was saved again without RENAME_EXCHANGE): take the newest
		 * one there is, as without latest. */
		dangling = true;
		free(*out);
		*out = NULL;
	}
	/* No latest: a crash between the first rename and the link, or a
	 * directory copied without its symlink. */
	err = st_ckpt_list(path, &steps, &n);
	if (err) {
		if (dangling) /* the error names the directory; say why it was listed */
			st_warn("%s/" ST_CKPT_LATEST " names %s, which is missing", path, target);
		return err;
	}
	for (size_t i = 0; i < n && !*out; i++)
		if (ckpt_exists(path, steps[i].name, true))
			*out = st_ckpt_fmt("%s/%s", path, steps[i].name);
	st_ckpt_list_free(steps, n);
	if (!*out && dangling)
		return st_error_set(-ENOENT, "%s: no checkpoint here ('" ST_CKPT_LATEST "' names "
				    "%s, which is missing, and there is no other step-N "
				    "directory)", path, target);
	if (!*out)
		return st_error_set(-ENOENT, "%s: no checkpoint here (no "
				    "trainer.json, no '" ST_CKPT_LATEST "' link, "
				    "no step-N directory)", path);
	if (dangling)
		st_warn("%s/" ST_CKPT_LATEST " names %s, which is missing: taking the newest "
			"step-N directory, %s", path, target, *out);
	return 0;
}

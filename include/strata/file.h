/* strata: complete reads and writes, and the write-to-temp, fsync, rename
 * protocol every file strata writes goes through (checkpoints, config.json,
 * traces). In src/util so every seam can use it. Errors name the file and
 * carry strerror() in st_error_last(). */
#ifndef STRATA_FILE_H
#define STRATA_FILE_H

#include <stddef.h>
#include <stdint.h>

/* A file being written: the temporary "<path>.tmp.XXXXXX" lives next to path
 * and becomes path only at commit (or publish). fd is -1 once closed. */
struct st_file_atomic {
	int fd;
	char *path;
	char *tmp_path;
};

/* Create a temporary file next to path (mode 0644). On failure f is
 * finished (fd -1, no names). Returns 0 or -errno. */
int st_file_atomic_open(struct st_file_atomic *f, const char *path);

/* Append bytes, completing short writes. Returns 0 or -errno. */
int st_file_atomic_write(struct st_file_atomic *f, const void *buf,
			 size_t bytes);

/* fsync, close, then st_file_atomic_publish(). On failure the temporary is
 * removed. f is finished either way. Returns 0 or -errno. */
int st_file_atomic_commit(struct st_file_atomic *f);

/* As commit, but refuse to replace path when something is there by then
 * (renameat2 RENAME_NOREPLACE: -EEXIST, and the temporary is removed). */
int st_file_atomic_commit_new(struct st_file_atomic *f);

/* Rename from (a finished file or directory) to path unless path exists
 * (RENAME_NOREPLACE: -EEXIST), then fsync path's directory. Returns 0 or
 * -errno; from is left where it was when the rename fails. */
int st_file_rename_new(const char *from, const char *path);

/* The second half of commit, for a writer that wrapped f->fd in a stdio
 * stream: it has flushed, fsynced and fclosed the stream and set f->fd to
 * -1. Rename the temporary over path and fsync the directory. On a failed
 * rename the temporary is removed. f is finished either way. Returns 0 or
 * -errno. */
int st_file_atomic_publish(struct st_file_atomic *f);

/* Close f->fd (unless -1) and remove the temporary. Safe on a finished f. */
void st_file_atomic_abort(struct st_file_atomic *f);

/* Open path read-only and check it is a regular file. Sets *out_fd (the
 * caller closes it) and *out_bytes (its size); on failure *out_fd is -1.
 * Returns 0 or -errno. */
int st_file_open_regular(const char *path, int *out_fd, uint64_t *out_bytes);

/* pread exactly bytes at off, retrying short reads and EINTR. A file that
 * ends first is -EIO with "unexpected end of file". label names the file in
 * errors. Returns 0 or -errno. */
int st_file_pread_full(int fd, void *buf, size_t bytes, uint64_t off,
		       const char *label);

/* Read a whole (small) regular file into a NUL-terminated malloc'd buffer of
 * at most max_bytes. Returns 0 or -errno (-EFBIG when larger). */
int st_file_read_small(const char *path, size_t max_bytes, char **out,
		       size_t *out_bytes);

struct json_object;

/* Read the JSON object in the regular file at path (at most max_bytes),
 * parsed with json-c (nesting up to 64 deep), into *out (the caller puts
 * it). Returns 0, -errno naming the file when it cannot be read, or -EINVAL
 * with one line: larger than max_bytes (at most 2^31 - 1, json-c's int
 * length), "not JSON (line N: the file is
 * empty / ends inside a value / text after the value / json-c's reason)",
 * or "not a JSON object". */
int st_file_read_json(const char *path, size_t max_bytes, struct json_object **out);

#endif

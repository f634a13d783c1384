/* src/io private: complete reads and writes, and the write-to-temp, fsync,
 * rename protocol every file strata writes goes through. */
#ifndef STRATA_IO_FILE_H
#define STRATA_IO_FILE_H

#include <stddef.h>
#include <stdint.h>

/* A file being written: the temporary lives next to path and becomes path
 * only at commit. */
struct st_atomic_file {
	int fd;
	char *path;
	char *tmp_path;
};

/* Create a temporary file next to path (mode 0644). Returns 0 or -errno. */
int st_atomic_file_open(struct st_atomic_file *f, const char *path);

/* Append bytes, completing short writes. Returns 0 or -errno. */
int st_atomic_file_write(struct st_atomic_file *f, const void *buf,
			 size_t bytes);

/* fsync, close, rename over path, fsync the directory. On failure the
 * temporary is removed. f is finished either way. Returns 0 or -errno. */
int st_atomic_file_commit(struct st_atomic_file *f);

/* Close and remove the temporary. Safe on a finished f. */
void st_atomic_file_abort(struct st_atomic_file *f);

/* pread exactly bytes at off, retrying short reads and EINTR. A file that
 * ends first is -EIO with "unexpected end of file". label names the file in
 * errors. Returns 0 or -errno. */
int st_pread_full(int fd, void *buf, size_t bytes, uint64_t off,
		  const char *label);

/* Read a whole (small) file into a NUL-terminated malloc'd buffer of at most
 * max_bytes. Returns 0 or -errno (-EFBIG when larger). */
int st_read_small_file(const char *path, size_t max_bytes, char **out,
		       size_t *out_bytes);

#endif

/* Shared by the io and ckpt tests (tests/ckpt includes it as
 * "../io/io_test_util.h"). Include after <cmocka.h>: helpers assert. */
#ifndef STRATA_IO_TEST_UTIL_H
#define STRATA_IO_TEST_UTIL_H

#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* The whole file at path, malloc'd (one spare byte); *len its size. Fails
 * the test when the file cannot be read. */
static uint8_t *read_all(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf;
	long n;

	assert_non_null(f);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)n + 1);
	assert_non_null(buf);
	assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	*len = (size_t)n;
	return buf;
}

/* A temporary root for a test binary: tmp_root_make("/tmp/st-NAME-XXXXXX")
 * in the group's setup, tmp_root_remove() in its teardown, tmp_fresh_dir()
 * for an empty directory under it. */
static char tmp_root[64];

static inline int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(p);
}

static inline void rm_rf(const char *p)
{
	nftw(p, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

static inline int tmp_root_make(const char *templ)
{
	snprintf(tmp_root, sizeof(tmp_root), "%s", templ);
	return mkdtemp(tmp_root) ? 0 : -1;
}

static inline int tmp_root_remove(void)
{
	rm_rf(tmp_root);
	return 0;
}

/* A fresh empty directory under tmp_root (malloc'd path). */
static inline char *fresh_dir(const char *name)
{
	char *p;

	assert_true(asprintf(&p, "%s/%s", tmp_root, name) > 0);
	rm_rf(p);
	assert_int_equal(mkdir(p, 0755), 0);
	return p;
}

#endif

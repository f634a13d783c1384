/* Shared by the io and ckpt tests (tests/ckpt includes it as
 * "../io/io_test_util.h"). Include after <cmocka.h>: helpers assert. */
#ifndef STRATA_IO_TEST_UTIL_H
#define STRATA_IO_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

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

#endif

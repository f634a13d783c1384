/* A private directory for the harnesses whose readers take only a path:
 * each input is written to one file in it (on /dev/shm when there is one,
 * so a run costs no disk I/O), and the directory goes at exit. */
#ifndef STRATA_FUZZ_TMP_H
#define STRATA_FUZZ_TMP_H

#include <stddef.h>
#include <stdint.h>

/* The path of name in the private directory, which is made on the first
 * call. Borrowed: valid until the next call. Aborts on failure (a harness
 * that cannot write its input has nothing to test). */
const char *st_fuzz_tmp_path(const char *name);

/* Write data[0..size) to st_fuzz_tmp_path(name), replacing it; returns
 * that path. Aborts on failure. */
const char *st_fuzz_tmp_write(const char *name, const uint8_t *data,
			      size_t size);

/* The harness's contract on a refusal: err is -EINVAL, -ENOMEM or also, and
 * the message starts with "<path>: " and holds no newline. Aborts
 * otherwise. */
void st_fuzz_check_refusal(int err, const char *path, int also);

#endif

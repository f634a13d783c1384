/* libFuzzer target for the safetensors reader: any input either opens and
 * then honours every promise of the header (ranges inside the data, sizes
 * matching shapes, reads succeed), or fails with -EINVAL/-ENOMEM and a
 * one-line message. Anything else aborts, and ASan/UBSan watch the rest.
 * Built with -fsanitize=fuzzer under clang; replay.c drives it otherwise. */
#include "strata/safetensors.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct st_safetensors *sf;
	const void *region;
	uint64_t region_bytes, covered = 0;
	int err;

	st_error_clear();
	err = st_safetensors_open_mem(&sf, data, size, "fuzz");
	if (err) {
		const char *msg = st_error_last();

		if ((err != -EINVAL && err != -ENOMEM) || sf ||
		    strncmp(msg, "fuzz: ", 6) != 0 || strchr(msg, '\n'))
			abort();
		return 0;
	}
	if (st_safetensors_data(sf, &region, &region_bytes))
		abort();
	for (size_t i = 0; i < st_safetensors_count(sf); i++) {
		const struct st_sf_info *t = st_safetensors_at(sf, i);
		uint64_t elems = 1;
		void *buf;

		if (!t || st_safetensors_find(sf, t->name) == NULL)
			abort();
		for (int d = 0; d < t->ndim; d++)
			elems *= t->shape[d];
		if (elems != t->elems ||
		    t->size_bytes != elems * st_sf_dtype_size(t->dtype) ||
		    t->offset_bytes + t->size_bytes > region_bytes ||
		    t->offset_bytes != covered)
			abort();
		covered += t->size_bytes;
		buf = malloc(t->size_bytes + 1);
		if (!buf)
			abort();
		/* The name may occur twice only if the file lied; find() then
		 * returns the first, which may have another shape: allowed to
		 * fail with -EINVAL, never to read out of bounds. */
		err = st_safetensors_read(sf, t->name, t->dtype, t->ndim,
					  t->shape, buf);
		if (err == 0 && t->size_bytes &&
		    memcmp(buf, (const uint8_t *)region + t->offset_bytes,
			   t->size_bytes) != 0)
			abort();
		if (err && err != -EINVAL)
			abort();
		free(buf);
	}
	if (covered != region_bytes)
		abort();
	st_safetensors_close(sf);
	return 0;
}

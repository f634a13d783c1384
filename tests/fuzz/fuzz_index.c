/* libFuzzer target for model.safetensors.index.json (st_ckpt_set_open(),
 * src/io/ckpt_shards.c): each input is the index of a directory that holds
 * two fixed shards, model-00001-of-00002.safetensors {x, y} and
 * model-00002-of-00002.safetensors {z}. It either opens, and then every
 * tensor of the set is found in the file that holds it and the counts add
 * up, or it is refused with -EINVAL/-ENOMEM and one line naming the index.
 * Built with -fsanitize=fuzzer under clang; replay.c drives it otherwise. */
#include "strata/ckpt.h"
#include "fuzz_tmp.h"

#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[4096];

static void make_shards(void)
{
	static const float v[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	struct st_sf_tensor a[2] = {
		{ .name = "x", .dtype = ST_SF_F32, .ndim = 1, .shape = { 4 }, .data = v },
		{ .name = "y", .dtype = ST_SF_F32, .ndim = 1, .shape = { 2 }, .data = v + 4 },
	};
	struct st_sf_tensor b = { .name = "z", .dtype = ST_SF_F32, .ndim = 2,
				  .shape = { 2, 4 }, .data = v };
	char *copy = strdup(st_fuzz_tmp_path("model-00001-of-00002.safetensors"));

	if (!copy || st_safetensors_write(copy, a, 2, NULL, 0) ||
	    st_safetensors_write(st_fuzz_tmp_path("model-00002-of-00002.safetensors"), &b, 1,
				 NULL, 0))
		abort();
	snprintf(dir, sizeof(dir), "%s", dirname(copy));
	free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct st_ckpt_set *s = NULL;
	const char *path;
	size_t count = 0;
	int err;

	if (!dir[0])
		make_shards();
	path = st_fuzz_tmp_write("model.safetensors.index.json", data, size);
	st_error_clear();
	err = st_ckpt_set_open(&s, dir, "model");
	if (err) {
		if (s)
			abort();
		st_fuzz_check_refusal(err, path, 0);
		return 0;
	}
	for (size_t i = 0; i < st_ckpt_set_files(s); i++) {
		const struct st_ckpt_reader *r = st_ckpt_set_reader(s, i);
		const struct st_safetensors *sf = st_ckpt_reader_file(r);

		for (size_t k = 0; k < st_safetensors_count(sf); k++) {
			const struct st_ckpt_reader *in = NULL;
			const struct st_sf_info *t = st_safetensors_at(sf, k);
			float buf[8];

			if (st_ckpt_set_lookup(s, t->name, &in) != t || in != r)
				abort();
			if (st_ckpt_reader_pread(r, t, 0, buf, (size_t)t->size_bytes))
				abort();
			count++;
		}
	}
	/* only the two shards exist: a set is them (or one of them) whole */
	if (count != st_ckpt_set_count(s) || count == 0 || count > 3 ||
	    st_ckpt_set_files(s) > 2 || strcmp(st_ckpt_set_index_name(s),
					       "model.safetensors.index.json") != 0)
		abort();
	st_ckpt_set_close(s);
	return 0;
}

/* libFuzzer target for the llm.c token-shard reader (src/io/dataset.c), as
 * `strata train --data x.bin` opens it (uint16 shards, and the uint32 ones
 * of magic 20240801, with strata's extension or without): any input either
 * opens, with a token count (and a trailer) that matches the file and a
 * largest token that is right, and
 * then batches come out of it inside the file; or it is refused with
 * -EINVAL and one line naming the file. The input's first 96 bytes are also
 * given to st_cursor_unpack() and st_loader_seek() (a checkpoint's sampler
 * cursor is read as bytes from trainer.json): a seek is refused or leaves
 * a loader that draws in range. The reader takes a path, so each input is
 * written to a temporary file first (fuzz_tmp.c). */
#include "strata/dataset.h"

#include "fuzz_tmp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define ST_FUZZ_B 2
#define ST_FUZZ_T 5

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* token i of a shard whose tokens are w bytes wide (2, or 4 for the
 * uint32 shards: magic 20240801) */
static uint32_t st_fuzz_tok(const uint8_t *data, uint64_t i, unsigned w)
{
	const uint8_t *p = data + ST_LLMC_HEADER_INTS * 4 + w * i;

	if (w == 4)
		return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
		       (uint32_t)p[3] << 24;
	return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}

static uint64_t st_fuzz_le(const uint8_t *p, int bytes)
{
	uint64_t v = 0;

	for (int k = 0; k < bytes; k++)
		v |= (uint64_t)p[k] << (8 * k);
	return v;
}

/* The file's size as docs/formats.md lays it out for n tokens of w bytes:
 * the header and the tokens, and with strata's extension ("STRA" at int32
 * 3) the mask and the 8-aligned document starts its flags name. */
static uint64_t st_fuzz_size(const uint8_t *data, unsigned w, uint64_t n)
{
	uint64_t s = ST_LLMC_HEADER_INTS * 4 + (uint64_t)w * n, flags;

	if (st_fuzz_le(data + 12, 4) != ST_SHARD_EXT_MAGIC)
		return s;
	flags = st_fuzz_le(data + 16, 4);
	if (flags & ST_SHARD_MASK)
		s += n;
	if (flags & ST_SHARD_DOCS)
		s = (s + 7) / 8 * 8 + 8 * st_fuzz_le(data + 28, 8);
	return s;
}

/* Draw a few batches from every split, contiguous and shuffled, and from a
 * cursor packed and unpacked again; every token must be one of the file's,
 * every target too or -1 (ignored: a shard's loss mask, masked). */
static void st_fuzz_loaders(const struct st_dataset *ds, uint32_t max_token,
			    const uint8_t *data, size_t size)
{
	const int32_t tmin = st_dataset_ext(ds).mask ? -1 : 0;

	int32_t in[ST_FUZZ_B * ST_FUZZ_T], tg[ST_FUZZ_B * ST_FUZZ_T];
	static const enum st_split splits[] = { ST_SPLIT_ALL, ST_SPLIT_TRAIN,
						ST_SPLIT_VAL };

	for (int s = 0; s < 3; s++) {
		for (int shuffle = 0; shuffle < 2; shuffle++) {
			struct st_loader_config cfg = {
				.batch = ST_FUZZ_B, .seq = ST_FUZZ_T,
				.shuffle = shuffle, .seed = size,
				.split = splits[s], .val_fraction = 0.25,
			};
			struct st_loader ld, ld2;
			struct st_cursor c;
			uint8_t packed[ST_CURSOR_BYTES];
			int err = st_loader_init(&ld, ds, &cfg);

			if (err) {
				if (err != -EINVAL)
					abort();
				continue;
			}
			for (int k = 0; k < 3; k++) {
				st_loader_next(&ld, in, tg);
				for (int i = 0; i < ST_FUZZ_B * ST_FUZZ_T; i++)
					if (in[i] < 0 || tg[i] < tmin ||
					    (uint32_t)in[i] > max_token ||
					    (tg[i] >= 0 && (uint32_t)tg[i] > max_token))
						abort();
			}
			st_cursor_pack(&ld.cur, packed);
			if (st_cursor_unpack(&c, packed, sizeof(packed)) ||
			    st_loader_init(&ld2, ds, &cfg) ||
			    st_loader_seek(&ld2, &c))
				abort();
			/* the input's own bytes as a saved cursor */
			if (size >= ST_CURSOR_BYTES &&
			    st_cursor_unpack(&c, data, ST_CURSOR_BYTES) == 0 &&
			    st_loader_seek(&ld2, &c) == 0) {
				st_loader_next(&ld2, in, tg);
				for (int i = 0; i < ST_FUZZ_B * ST_FUZZ_T; i++)
					if ((uint32_t)in[i] > max_token || tg[i] < tmin ||
					    (tg[i] >= 0 && (uint32_t)tg[i] > max_token))
						abort();
			}
		}
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *path = st_fuzz_tmp_write("shard.bin", data, size);
	struct st_dataset *ds = NULL;
	struct st_cursor c;
	uint32_t max_token = 0;
	uint64_t n;
	unsigned w;
	int err;

	/* A cursor that is not one is refused, whatever the dataset. */
	err = st_cursor_unpack(&c, data, size);
	if (err && err != -EINVAL)
		abort();
	st_error_clear();
	err = st_dataset_open(&ds, path, ST_DATASET_AUTO);
	if (err) {
		if (ds)
			abort();
		st_fuzz_check_refusal(err, path, 0);
		return 0;
	}
	n = st_dataset_tokens(ds);
	w = size >= 4 && data[0] == (ST_LLMC32_MAGIC & 0xff) &&
			    data[1] == ((ST_LLMC32_MAGIC >> 8) & 0xff) &&
			    data[2] == ((ST_LLMC32_MAGIC >> 16) & 0xff) &&
			    data[3] == ((uint32_t)ST_LLMC32_MAGIC >> 24) ? 4 : 2;
	if (st_dataset_format(ds) != ST_DATASET_LLMC || n == 0 ||
	    size != st_fuzz_size(data, w, n))
		abort();
	for (uint64_t i = 0; i < n; i++)
		if (st_fuzz_tok(data, i, w) > max_token)
			max_token = st_fuzz_tok(data, i, w);
	if (st_dataset_max_token(ds) != max_token)
		abort();
	st_fuzz_loaders(ds, max_token, data, size);
	st_dataset_close(ds);
	return 0;
}

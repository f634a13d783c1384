/* Token datasets: llm.c shard header checks, the contiguous order
 * (step s starts at token s*B*T), seeded shuffling against an independent
 * implementation of the documented generator, cursor save/resume, splits. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "strata/dataset.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[64];
static char shard[128];

#define N_TOK 10007u /* prime, so windows wrap at odd places */

static uint16_t tok_ref(uint64_t i)
{
	/* Unique per position (i < 65521, 7919 coprime with it): a window's
	 * first token tells where it starts. */
	return (uint16_t)((i * 7919u + 11u) % 65521u);
}

static uint64_t pos_of(uint16_t tok)
{
	for (uint64_t i = 0; i < N_TOK; i++)
		if (tok_ref(i) == tok)
			return i;
	fail_msg("token %u is in no position", tok);
	return 0;
}

static int setup(void **state)
{
	uint16_t *t = malloc(N_TOK * sizeof(*t));

	(void)state;
	strcpy(tmpdir, "/tmp/st_ds_XXXXXX");
	if (!t || !mkdtemp(tmpdir))
		return -1;
	for (uint64_t i = 0; i < N_TOK; i++)
		t[i] = tok_ref(i);
	snprintf(shard, sizeof(shard), "%s/train_000.bin", tmpdir);
	if (st_dataset_write_llmc(shard, t, N_TOK))
		return -1;
	free(t);
	return 0;
}

static int teardown(void **state)
{
	char cmd[128];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
	return system(cmd) == 0 ? 0 : -1;
}

static void write_file(const char *path, const void *p, size_t len)
{
	FILE *f = fopen(path, "wb");

	assert_non_null(f);
	assert_int_equal(fwrite(p, 1, len, f), len);
	fclose(f);
}

/* An llm.c shard built byte by byte, as llm.c's Python writer lays it out. */
static void make_shard(const char *path, int32_t magic, int32_t version,
		       int32_t count, uint32_t n_tok)
{
	size_t len = 1024 + 2 * (size_t)n_tok;
	uint8_t *b = calloc(1, len);
	int32_t h[3] = { magic, version, count };

	assert_non_null(b);
	for (int i = 0; i < 3; i++)
		for (int k = 0; k < 4; k++)
			b[4 * i + k] = (uint8_t)((uint32_t)h[i] >> (8 * k));
	for (uint32_t i = 0; i < n_tok; i++) {
		b[1024 + 2 * i] = (uint8_t)(tok_ref(i) & 0xff);
		b[1024 + 2 * i + 1] = (uint8_t)(tok_ref(i) >> 8);
	}
	write_file(path, b, len);
	free(b);
}

static void test_shard_read(void **state)
{
	struct st_dataset *ds;
	char path[160];
	uint16_t max = 0;

	(void)state;
	assert_int_equal(st_dataset_open(&ds, shard, ST_DATASET_AUTO), 0);
	assert_int_equal(st_dataset_format(ds), ST_DATASET_LLMC);
	assert_int_equal(st_dataset_tokens(ds), N_TOK);
	for (uint64_t i = 0; i < N_TOK; i++)
		max = tok_ref(i) > max ? tok_ref(i) : max;
	assert_int_equal(st_dataset_max_token(ds), max);
	st_dataset_close(ds);

	/* Hand-made shard with the same tokens: same file bytes. */
	snprintf(path, sizeof(path), "%s/hand.shard", tmpdir);
	make_shard(path, 20240520, 1, N_TOK, N_TOK);
	{
		FILE *a = fopen(path, "rb"), *b = fopen(shard, "rb");
		int ca, cb;

		assert_non_null(a);
		assert_non_null(b);
		do {
			ca = fgetc(a);
			cb = fgetc(b);
			assert_int_equal(ca, cb);
		} while (ca != EOF);
		fclose(a);
		fclose(b);
	}
	assert_int_equal(st_dataset_open(&ds, path, ST_DATASET_AUTO), 0);
	assert_int_equal(st_dataset_format(ds), ST_DATASET_LLMC);
	st_dataset_close(ds);
}

static void expect_bad(const char *path, enum st_dataset_format fmt,
		       const char *msg)
{
	struct st_dataset *ds = (void *)1;

	assert_int_equal(st_dataset_open(&ds, path, fmt), -EINVAL);
	assert_null(ds);
	if (!strstr(st_error_last(), msg) ||
	    strncmp(st_error_last(), path, strlen(path)))
		fail_msg("got \"%s\", expected \"%s: ...%s...\"",
			 st_error_last(), path, msg);
}

static void test_shard_header_checks(void **state)
{
	char path[160];

	(void)state;
	snprintf(path, sizeof(path), "%s/bad.bin", tmpdir);
	make_shard(path, 20240521, 1, 100, 100);
	expect_bad(path, ST_DATASET_AUTO, "bad magic 20240521, expected 20240520");
	make_shard(path, 20240520, 2, 100, 100);
	expect_bad(path, ST_DATASET_LLMC, "unsupported llm.c shard version 2");
	make_shard(path, 20240520, 1, 100, 99);
	expect_bad(path, ST_DATASET_LLMC, "header says 100 tokens (200 bytes) "
		   "but the file holds 198 bytes of tokens");
	make_shard(path, 20240520, 1, 99, 100);
	expect_bad(path, ST_DATASET_LLMC, "header says 99 tokens");
	make_shard(path, 20240520, 1, -5, 10);
	expect_bad(path, ST_DATASET_LLMC, "header says -5 tokens");
	write_file(path, "short", 5);
	expect_bad(path, ST_DATASET_AUTO, "shorter than the 1024-byte llm.c");
	write_file(path, "", 0);
	expect_bad(path, ST_DATASET_AUTO, "file is empty");
	/* Forced llm.c on a text file. */
	snprintf(path, sizeof(path), "%s/text.txt", tmpdir);
	{
		char text[2000];

		memset(text, 'a', sizeof(text));
		write_file(path, text, sizeof(text));
	}
	expect_bad(path, ST_DATASET_LLMC, "bad magic");
}

/* llm.c's uint32 shard (magic 20240801, version 7: what it writes for
 * Llama 3's vocabulary), built byte by byte; ids past 65535 come back. */
static void make_shard32(const char *path, int32_t version, int32_t count, uint32_t n_tok)
{
	size_t len = 1024 + 4 * (size_t)n_tok;
	uint8_t *b = calloc(1, len);
	int32_t h[3] = { 20240801, version, count };

	assert_non_null(b);
	for (int i = 0; i < 3; i++)
		for (int k = 0; k < 4; k++)
			b[4 * i + k] = (uint8_t)((uint32_t)h[i] >> (8 * k));
	for (uint32_t i = 0; i < n_tok; i++)
		for (int k = 0; k < 4; k++)
			b[1024 + 4 * i + k] = (uint8_t)(((i * 100003u) % 150000u) >> (8 * k));
	write_file(path, b, len);
	free(b);
}

static void test_shard32(void **state)
{
	struct st_dataset *ds;
	struct st_loader ld;
	struct st_loader_config lc = { .batch = 1, .seq = 99, .split = ST_SPLIT_ALL };
	int32_t in[99], tg[99];
	char path[160];
	uint32_t max = 0;

	(void)state;
	snprintf(path, sizeof(path), "%s/wide.bin", tmpdir);
	make_shard32(path, 7, 1000, 1000);
	assert_int_equal(st_dataset_open(&ds, path, ST_DATASET_AUTO), 0);
	assert_int_equal(st_dataset_format(ds), ST_DATASET_LLMC);
	assert_int_equal(st_dataset_tokens(ds), 1000);
	for (uint32_t i = 0; i < 1000; i++)
		max = ST_MAX(max, (i * 100003u) % 150000u);
	assert_true(max > 65535);
	assert_int_equal(st_dataset_max_token(ds), max);
	assert_int_equal(st_loader_init(&ld, ds, &lc), 0);
	st_loader_next(&ld, in, tg);
	for (uint32_t i = 0; i < 99; i++) {
		assert_int_equal(in[i], (int32_t)((i * 100003u) % 150000u));
		assert_int_equal(tg[i], (int32_t)(((i + 1) * 100003u) % 150000u));
	}
	st_dataset_close(ds);
	make_shard32(path, 1, 1000, 1000);
	expect_bad(path, ST_DATASET_AUTO, "unsupported llm.c shard version 1, expected 7 (uint32");
	make_shard32(path, 7, 1000, 999);
	expect_bad(path, ST_DATASET_AUTO, "header says 1000 tokens (4000 bytes) but the file "
		   "holds 3996 bytes");
	{
		/* an id that an int32 batch cannot hold */
		uint8_t b[1024 + 8] = { 0 };
		const int32_t h[3] = { 20240801, 7, 2 };

		for (int i = 0; i < 3; i++)
			for (int k = 0; k < 4; k++)
				b[4 * i + k] = (uint8_t)((uint32_t)h[i] >> (8 * k));
		b[1024 + 4 + 3] = 0x80;
		write_file(path, b, sizeof(b));
		expect_bad(path, ST_DATASET_AUTO, "token 2147483648 is past 2^31-1");
	}
}

/* strata's extension, checked against the layout docs/formats.md gives,
 * built byte by byte: header [3..8], the mask after the tokens, zero
 * padding to 8, the document starts. */
static void put_le(uint8_t *p, uint64_t v, int bytes)
{
	for (int k = 0; k < bytes; k++)
		p[k] = (uint8_t)(v >> (8 * k));
}

static void test_shard_ext(void **state)
{
	const uint32_t n = 13; /* odd: the mask needs padding */
	uint16_t t[13];
	uint32_t t32[13];
	uint8_t mask[13];
	const uint64_t docs[3] = { 0, 5, 9 };
	const uint64_t hash = 0x0123456789abcdefull;
	struct st_shard_ext ext = { .tokenizer_hash = hash, .mask = mask,
				    .doc_starts = docs, .n_docs = 3 };
	size_t pad = (1024 + 2 * 13 + 13 + 7) / 8 * 8, len = pad + 24;
	uint8_t *want = calloc(1, len), *got = calloc(1, len + 1);
	struct st_dataset *ds;
	struct st_shard_ext e;
	char path[160];
	FILE *f;

	(void)state;
	assert_non_null(want);
	assert_non_null(got);
	for (uint32_t i = 0; i < n; i++) {
		t[i] = tok_ref(i);
		mask[i] = (uint8_t)(i % 3 == 1);
		put_le(want + 1024 + 2 * i, t[i], 2);
		want[1024 + 26 + i] = mask[i];
	}
	put_le(want, 20240520, 4);
	put_le(want + 4, 1, 4);
	put_le(want + 8, n, 4);
	put_le(want + 12, 0x41525453, 4);
	put_le(want + 16, 3, 4);
	put_le(want + 20, hash, 8);
	put_le(want + 28, 3, 8);
	for (int d = 0; d < 3; d++)
		put_le(want + pad + 8 * d, docs[d], 8);
	snprintf(path, sizeof(path), "%s/ext.bin", tmpdir);
	assert_int_equal(st_dataset_write_shard(path, t, 2, n, &ext), 0);
	f = fopen(path, "rb");
	assert_non_null(f);
	assert_int_equal(fread(got, 1, len + 1, f), len);
	fclose(f);
	assert_memory_equal(got, want, len);

	assert_int_equal(st_dataset_open(&ds, path, ST_DATASET_AUTO), 0);
	assert_int_equal(st_dataset_tokens(ds), n);
	e = st_dataset_ext(ds);
	assert_true(e.tokenizer_hash == hash);
	assert_memory_equal(e.mask, mask, n);
	assert_int_equal(e.n_docs, 3);
	assert_memory_equal(e.doc_starts, docs, sizeof(docs));
	st_dataset_close(ds);

	/* the hash alone: no trailer, so a plain llm.c reader's size check holds */
	ext = (struct st_shard_ext){ .tokenizer_hash = hash };
	for (uint32_t i = 0; i < n; i++)
		t32[i] = 70000u + i;
	assert_int_equal(st_dataset_write_shard(path, t32, 4, n, &ext), 0);
	assert_int_equal(st_dataset_open(&ds, path, ST_DATASET_AUTO), 0);
	e = st_dataset_ext(ds);
	assert_true(e.tokenizer_hash == hash && !e.mask && !e.doc_starts);
	assert_int_equal(st_dataset_max_token(ds), 70012);
	st_dataset_close(ds);

	/* refused: a mask byte past 1, documents out of order, a cut file */
	mask[4] = 2;
	ext = (struct st_shard_ext){ .mask = mask };
	assert_int_equal(st_dataset_write_shard(path, t, 2, n, &ext), -EINVAL);
	want[1024 + 26 + 4] = 2;
	write_file(path, want, len);
	expect_bad(path, ST_DATASET_AUTO, "mask byte 4 is 2, not 0 or 1");
	want[1024 + 26 + 4] = 0;
	put_le(want + pad + 16, 5, 8);
	write_file(path, want, len);
	expect_bad(path, ST_DATASET_AUTO, "document 2 starts at token 5");
	put_le(want + pad + 16, 9, 8);
	write_file(path, want, len - 8);
	expect_bad(path, ST_DATASET_AUTO, "a mask, documents");
	put_le(want + 16, 4, 4);
	write_file(path, want, len);
	expect_bad(path, ST_DATASET_AUTO, "unknown shard flags 0x4");
	free(want);
	free(got);
}

static void test_bytes_dataset(void **state)
{
	static const char text[] = "It was the best of times, it was the worst "
				   "of times.";
	const uint32_t B = 2, T = 8, n = sizeof(text) - 1;
	const struct st_loader_config cfg = { .batch = B, .seq = T };
	struct st_dataset *ds;
	struct st_loader ld;
	int32_t in[16], tg[16];
	char path[160];

	(void)state;
	snprintf(path, sizeof(path), "%s/tiny.txt", tmpdir);
	write_file(path, text, n);
	assert_int_equal(st_dataset_open(&ds, path, ST_DATASET_AUTO), 0);
	assert_int_equal(st_dataset_format(ds), ST_DATASET_BYTES);
	assert_int_equal(st_dataset_tokens(ds), n);
	assert_int_equal(st_dataset_max_token(ds), 'w');
	assert_int_equal(st_loader_init(&ld, ds, &cfg), 0);
	for (uint64_t s = 0; s < 10; s++) {
		st_loader_next(&ld, in, tg);
		for (uint32_t i = 0; i < B * T; i++) {
			assert_int_equal(in[i],
				(unsigned char)text[(s * B * T + i) % n]);
			assert_int_equal(tg[i],
				(unsigned char)text[(s * B * T + i + 1) % n]);
		}
	}
	st_dataset_close(ds);
}

/* Shuffle off: row b of step s is tokens (s*B + b)*T + t, modulo n. */
static void test_contiguous_order(void **state)
{
	const uint32_t B = 4, T = 64;
	const struct st_loader_config cfg = { .batch = B, .seq = T, .seed = 9 };
	struct st_dataset *ds;
	struct st_loader ld;
	int32_t *in = malloc(B * T * 4), *tg = malloc(B * T * 4);

	(void)state;
	assert_int_equal(st_dataset_open(&ds, shard, ST_DATASET_AUTO), 0);
	assert_int_equal(st_loader_init(&ld, ds, &cfg), 0);
	/* 100 steps x 256 tokens passes the end of the 10007 twice. */
	for (uint64_t s = 0; s < 100; s++) {
		st_loader_next(&ld, in, tg);
		assert_int_equal(pos_of((uint16_t)in[0]), (s * B * T) % N_TOK);
		for (uint32_t b = 0; b < B; b++)
			for (uint32_t t = 0; t < T; t++) {
				uint64_t p = (s * B + b) * T + t;

				assert_int_equal(in[b * T + t],
						 tok_ref(p % N_TOK));
				assert_int_equal(tg[b * T + t],
						 tok_ref((p + 1) % N_TOK));
			}
	}
	assert_int_equal(ld.cur.step, 100);
	st_dataset_close(ds);
	free(in);
	free(tg);
}

/* The documented generator, written again from its description. */
static uint64_t ref_rng[4];

static void ref_seed(uint64_t seed)
{
	for (int i = 0; i < 4; i++) {
		uint64_t z;

		seed += 0x9e3779b97f4a7c15ull;
		z = seed;
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
		z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
		ref_rng[i] = z ^ (z >> 31);
	}
}

static uint64_t ref_next(void)
{
	uint64_t *s = ref_rng;
	uint64_t x = s[1] * 5;
	uint64_t r = ((x << 7) | (x >> 57)) * 9;
	uint64_t t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = (s[3] << 45) | (s[3] >> 19);
	return r;
}

static uint64_t ref_uniform(uint64_t bound)
{
	uint64_t x;

	do
		x = ref_next();
	while (x < (UINT64_MAX - bound + 1) % bound);
	return x % bound;
}

static void test_shuffle_matches_reference(void **state)
{
	const uint32_t B = 3, T = 32;
	const struct st_loader_config cfg = { .batch = B, .seq = T,
		.shuffle = 1, .seed = 1234 };
	struct st_dataset *ds;
	struct st_loader ld, other;
	int32_t in[96], tg[96], in2[96], tg2[96];
	int differs = 0;

	(void)state;
	assert_int_equal(st_dataset_open(&ds, shard, ST_DATASET_AUTO), 0);
	assert_int_equal(st_loader_init(&ld, ds, &cfg), 0);
	ref_seed(1234);
	for (int s = 0; s < 200; s++) {
		st_loader_next(&ld, in, tg);
		for (uint32_t b = 0; b < B; b++) {
			uint64_t p = ref_uniform(N_TOK - T);

			for (uint32_t t = 0; t < T; t++) {
				assert_int_equal(in[b * T + t], tok_ref(p + t));
				assert_int_equal(tg[b * T + t],
						 tok_ref(p + t + 1));
			}
		}
	}
	/* Another seed gives another sequence. */
	{
		struct st_loader_config c2 = cfg;

		c2.seed = 1235;
		assert_int_equal(st_loader_init(&other, ds, &cfg), 0);
		assert_int_equal(st_loader_init(&ld, ds, &c2), 0);
		st_loader_next(&ld, in, tg);
		st_loader_next(&other, in2, tg2);
		differs = memcmp(in, in2, sizeof(in)) != 0;
		assert_true(differs);
	}
	/* Rewind gives the first batch again. */
	st_loader_rewind(&other);
	st_loader_next(&other, in, tg);
	ref_seed(1234);
	assert_int_equal(in[0], tok_ref(ref_uniform(N_TOK - T)));
	st_dataset_close(ds);
}

static void check_resume(const struct st_dataset *ds, int shuffle)
{
	const uint32_t B = 2, T = 16;
	const struct st_loader_config cfg = { .batch = B, .seq = T,
		.shuffle = shuffle, .seed = 77 };
	struct st_loader a, b;
	struct st_cursor c;
	uint8_t packed[ST_CURSOR_BYTES];
	int32_t ia[20][32], ta[20][32], ib[32], tb[32];

	assert_int_equal(st_loader_init(&a, ds, &cfg), 0);
	for (int s = 0; s < 37; s++)
		st_loader_next(&a, ib, tb);
	st_cursor_pack(&a.cur, packed);
	for (int s = 0; s < 20; s++)
		st_loader_next(&a, ia[s], ta[s]);

	/* A fresh loader (as after a restart) seeks to the saved cursor. */
	assert_int_equal(st_loader_init(&b, ds, &cfg), 0);
	memset(&c, 0xab, sizeof(c));
	assert_int_equal(st_cursor_unpack(&c, packed, sizeof(packed)), 0);
	assert_int_equal(c.step, 37);
	assert_int_equal(st_loader_seek(&b, &c), 0);
	for (int s = 0; s < 20; s++) {
		st_loader_next(&b, ib, tb);
		assert_memory_equal(ib, ia[s], sizeof(ib));
		assert_memory_equal(tb, ta[s], sizeof(tb));
	}
	{
		uint8_t pa[ST_CURSOR_BYTES], pb[ST_CURSOR_BYTES];

		st_cursor_pack(&a.cur, pa);
		st_cursor_pack(&b.cur, pb);
		assert_memory_equal(pa, pb, sizeof(pa));
	}
}

static void test_cursor_resume(void **state)
{
	struct st_dataset *ds;

	(void)state;
	assert_int_equal(st_dataset_open(&ds, shard, ST_DATASET_AUTO), 0);
	check_resume(ds, 0);
	check_resume(ds, 1);
	st_dataset_close(ds);
}

static void test_cursor_refused(void **state)
{
	struct st_loader_config cfg = { .batch = 2, .seq = 16, .seed = 5 };
	struct st_dataset *ds;
	struct st_loader a, b;
	uint8_t packed[ST_CURSOR_BYTES];
	struct st_cursor c;

	(void)state;
	assert_int_equal(st_dataset_open(&ds, shard, ST_DATASET_AUTO), 0);
	assert_int_equal(st_loader_init(&a, ds, &cfg), 0);
	cfg.batch = 4;
	assert_int_equal(st_loader_init(&b, ds, &cfg), 0);
	assert_int_equal(st_loader_seek(&b, &a.cur), -EINVAL);
	assert_non_null(strstr(st_error_last(), "cursor was saved with B=2"));
	cfg.batch = 2;
	cfg.split = ST_SPLIT_TRAIN;
	cfg.val_fraction = 0.1;
	assert_int_equal(st_loader_init(&b, ds, &cfg), 0);
	assert_int_equal(st_loader_seek(&b, &a.cur), -EINVAL);
	assert_non_null(strstr(st_error_last(), "another file or split"));

	st_cursor_pack(&a.cur, packed);
	assert_int_equal(st_cursor_unpack(&c, packed, sizeof(packed) - 1),
			 -EINVAL);
	packed[50] ^= 1;
	assert_int_equal(st_cursor_unpack(&c, packed, sizeof(packed)), -EINVAL);
	assert_non_null(strstr(st_error_last(), "checksum"));
	packed[50] ^= 1;
	packed[0] ^= 1;
	assert_int_equal(st_cursor_unpack(&c, packed, sizeof(packed)), -EINVAL);
	assert_non_null(strstr(st_error_last(), "magic"));
	st_dataset_close(ds);
}

static void test_split(void **state)
{
	const uint32_t B = 4, T = 50;
	struct st_loader_config cfg = { .batch = B, .seq = T, .seed = 3,
		.split = ST_SPLIT_VAL, .val_fraction = 0.1 };
	const uint64_t n_val = (uint64_t)(N_TOK * 0.1), n_train = N_TOK - n_val;
	struct st_dataset *ds;
	struct st_loader val, train;
	int32_t in[200], tg[200];

	(void)state;
	assert_int_equal(st_dataset_open(&ds, shard, ST_DATASET_AUTO), 0);
	assert_int_equal(st_loader_init(&val, ds, &cfg), 0);
	cfg.split = ST_SPLIT_TRAIN;
	assert_int_equal(st_loader_init(&train, ds, &cfg), 0);
	assert_int_equal(val.cur.begin_tok, n_train);
	assert_int_equal(val.cur.end_tok, N_TOK);
	assert_int_equal(train.cur.end_tok, n_train);
	for (uint64_t s = 0; s < 60; s++) {
		st_loader_next(&val, in, tg);
		for (uint32_t i = 0; i < B * T; i++) {
			assert_int_equal(in[i], tok_ref(n_train +
						(s * B * T + i) % n_val));
			assert_true(pos_of((uint16_t)tg[i]) >= n_train);
		}
		st_loader_next(&train, in, tg);
		for (uint32_t i = 0; i < B * T; i++) {
			assert_int_equal(in[i], tok_ref((s * B * T + i) %
							n_train));
			assert_true(pos_of((uint16_t)tg[i]) < n_train);
		}
	}
	/* Shuffled val windows stay in the val range too. */
	cfg.split = ST_SPLIT_VAL;
	cfg.shuffle = 1;
	assert_int_equal(st_loader_init(&val, ds, &cfg), 0);
	for (int s = 0; s < 50; s++) {
		st_loader_next(&val, in, tg);
		for (uint32_t i = 0; i < B * T; i++)
			assert_true(pos_of((uint16_t)in[i]) >= n_train);
	}

	cfg.seq = 2000;
	assert_int_equal(st_loader_init(&val, ds, &cfg), -EINVAL);
	assert_non_null(strstr(st_error_last(), "the val split holds 1000 "
			       "tokens, fewer than T+1 = 2001"));
	cfg.seq = 16;
	cfg.val_fraction = 1.0;
	assert_int_equal(st_loader_init(&val, ds, &cfg), -EINVAL);
	cfg.val_fraction = 0.1;
	cfg.batch = 0;
	assert_int_equal(st_loader_init(&val, ds, &cfg), -EINVAL);
	st_dataset_close(ds);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_shard_read),
		cmocka_unit_test(test_shard_header_checks),
		cmocka_unit_test(test_shard32),
		cmocka_unit_test(test_shard_ext),
		cmocka_unit_test(test_bytes_dataset),
		cmocka_unit_test(test_contiguous_order),
		cmocka_unit_test(test_shuffle_matches_reference),
		cmocka_unit_test(test_cursor_resume),
		cmocka_unit_test(test_cursor_refused),
		cmocka_unit_test(test_split),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}

/* Checkpoint files: streamed safetensors against st_safetensors_write(),
 * ranged reads, trainer.json, verification, directory protocol (keep-K,
 * latest, resolve, stale leftovers), failures, and crashes (SIGKILL at
 * random instants while a child writes checkpoints in a loop). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "strata/ckpt.h"
#include "strata/dataset.h"
#include "strata/file.h"
#include "strata/io.h"
#include "../io/io_test_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

static int setup(void **state)
{
	ST_UNUSED(state);
	return tmp_root_make("/tmp/st-ckpt-XXXXXX");
}

static int teardown(void **state)
{
	ST_UNUSED(state);
	return tmp_root_remove();
}

/* Entries of dir whose name contains ".tmp.". */
static int count_tmp(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;

	while (d && (de = readdir(d)))
		n += strstr(de->d_name, ".tmp.") != NULL;
	if (d)
		closedir(d);
	return n;
}

static int count_steps(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;

	while (d && (de = readdir(d)))
		n += strncmp(de->d_name, "step-", 5) == 0 &&
		     !strstr(de->d_name, ".tmp.");
	if (d)
		closedir(d);
	return n;
}

static uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Byte i of tensor k of a checkpoint with this seed: content is computed,
 * never held whole, as a tiered engine streams it. */
static uint8_t pattern(uint64_t seed, size_t k, uint64_t i)
{
	return (uint8_t)(mix64(seed * 1000003u + k * 7919u + (i >> 3)) >>
			 (8 * (i & 7)));
}

/* ---- streamed safetensors --------------------------------------------------- */

struct mem_src {
	const struct st_sf_tensor *t; /* data pointers */
	const uint64_t *sizes;
	size_t calls;
	size_t next_tensor;
	uint64_t next_off;
	int fail_at_call;            /* 1-based; 0 never */
};

static int mem_fill(void *ctx, size_t k, uint64_t off, void *buf, size_t len)
{
	struct mem_src *s = ctx;

	s->calls++;
	/* File order, each call inside one tensor, aligned buffer. */
	assert_true(((uintptr_t)buf & (ST_PAGE_BYTES - 1)) == 0);
	assert_true(len > 0 && len <= ST_CKPT_CHUNK_BYTES);
	if (off + len < s->sizes[k])
		assert_int_equal(len % ST_PAGE_BYTES, 0);
	assert_true(k > s->next_tensor || (k == s->next_tensor &&
					   off == s->next_off));
	if (k > s->next_tensor)
		assert_int_equal(off, 0);
	assert_true(off + len <= s->sizes[k]);
	s->next_tensor = k;
	s->next_off = off + len;
	if (s->fail_at_call && (int)s->calls == s->fail_at_call)
		return st_error_set(-EIO, "nvme read failed (injected)");
	memcpy(buf, (const uint8_t *)s->t[k].data + off, len);
	return 0;
}

#define N_T 7

static void make_tensors(struct st_sf_tensor *t, struct st_ckpt_tensor *ct,
			 uint64_t *sizes, void **bufs)
{
	/* Mixed dtypes, a scalar, an empty tensor, and one larger than a
	 * chunk with an odd size, so chunking and ends are exercised. */
	static const struct {
		const char *name;
		enum st_sf_dtype dtype;
		int ndim;
		uint64_t shape[3];
	} spec[N_T] = {
		{ "wte.weight", ST_SF_F32, 2, { 50, 24 } },
		{ "h.0.attn.c_attn.weight", ST_SF_F32, 2, { 24, 72 } },
		{ "h.0.attn.c_attn.weight" ST_CKPT_SUFFIX_EXP_AVG, ST_SF_BF16, 1,
		  { 3 } },
		{ "scalar", ST_SF_F64, 0, { 0 } },
		{ "empty", ST_SF_F32, 2, { 0, 5 } },
		{ "big/\"quoted\" \\name", ST_SF_U8, 3,
		  { 3, 1024 * 1024 + 7, 3 } },
		{ "ln_f.bias", ST_SF_I64, 1, { 5 } },
	};

	for (size_t k = 0; k < N_T; k++) {
		uint64_t n = st_sf_dtype_size(spec[k].dtype);

		memset(&t[k], 0, sizeof(t[k]));
		memset(&ct[k], 0, sizeof(ct[k]));
		t[k].name = ct[k].name = spec[k].name;
		t[k].dtype = ct[k].dtype = spec[k].dtype;
		t[k].ndim = ct[k].ndim = spec[k].ndim;
		for (int d = 0; d < spec[k].ndim; d++) {
			t[k].shape[d] = ct[k].shape[d] = spec[k].shape[d];
			n *= spec[k].shape[d];
		}
		sizes[k] = n;
		bufs[k] = malloc(n + 1);
		assert_non_null(bufs[k]);
		for (uint64_t i = 0; i < n; i++)
			((uint8_t *)bufs[k])[i] = pattern(42, k, i);
		t[k].data = bufs[k];
	}
}

static void test_stream_matches_writer(void **state)
{
	struct st_sf_tensor t[N_T];
	struct st_ckpt_tensor ct[N_T];
	struct st_sf_meta meta[] = { { "format", "pt" },
				     { "producer", "strata \"test\"" } };
	uint64_t sizes[N_T], bytes = 0, h = 0, hb, hh;
	void *bufs[N_T];
	char *dir = fresh_dir("stream"), *a, *b;
	uint8_t *fa, *fb;
	size_t la, lb;
	struct mem_src src = { 0 };
	struct st_ckpt_reader *r;
	struct st_safetensors *sf;

	ST_UNUSED(state);
	make_tensors(t, ct, sizes, bufs);
	assert_true(asprintf(&a, "%s/ref.safetensors", dir) > 0);
	assert_true(asprintf(&b, "%s/streamed.safetensors", dir) > 0);
	assert_int_equal(st_safetensors_write(a, t, N_T, meta, 2), 0);
	src.t = t;
	src.sizes = sizes;
	assert_int_equal(st_ckpt_write_safetensors(b, ct, N_T, meta, 2, mem_fill,
						   &src, &bytes, &h), 0);
	/* The 9 MiB tensor took two chunks. */
	assert_true(src.calls >= N_T - 1 + 1);
	fa = read_all(a, &la);
	fb = read_all(b, &lb);
	assert_int_equal(la, lb);
	assert_memory_equal(fa, fb, la);
	/* Size and hash from the writer agree with an independent hash of
	 * the reference file, and with st_ckpt_file_hash(). */
	assert_int_equal(bytes, lb);
	assert_true(h == XXH64(fa, la, 0));
	assert_int_equal(st_ckpt_file_hash(b, &hb, &hh), 0);
	assert_int_equal(hb, lb);
	assert_true(hh == h);
	assert_int_equal(count_tmp(dir), 0);

	/* Read back by ranges of odd sizes, and whole with the io reader. */
	assert_int_equal(st_ckpt_reader_open(&r, b), 0);
	assert_int_equal(st_safetensors_open(&sf, b), 0);
	assert_string_equal(st_safetensors_metadata(st_ckpt_reader_file(r),
						    "producer"),
			    "strata \"test\"");
	for (size_t k = 0; k < N_T; k++) {
		const struct st_sf_info *info;
		uint8_t *got = malloc(sizes[k] + 1);
		uint64_t off = 0, piece = 1 + 1000003 * k % 777777;

		assert_int_equal(st_ckpt_reader_find(r, t[k].name, t[k].dtype,
						     t[k].ndim, t[k].shape,
						     &info), 0);
		assert_int_equal(info->size_bytes, sizes[k]);
		while (off < sizes[k]) {
			size_t len = (size_t)ST_MIN(piece, sizes[k] - off);

			assert_int_equal(st_ckpt_reader_pread(r, info, off,
							      got + off, len), 0);
			off += len;
		}
		if (sizes[k])
			assert_memory_equal(got, bufs[k], sizes[k]);
		memset(got, 0, sizes[k]);
		assert_int_equal(st_safetensors_read(sf, t[k].name, t[k].dtype,
						     t[k].ndim, t[k].shape, got),
				 0);
		if (sizes[k])
			assert_memory_equal(got, bufs[k], sizes[k]);
		/* Past the end. */
		assert_int_equal(st_ckpt_reader_pread(r, info, sizes[k], got,
						      1), -EINVAL);
		free(got);
	}
	{
		const struct st_sf_info *info;
		uint64_t wrong[2] = { 24, 73 };

		assert_int_equal(st_ckpt_reader_find(r, "nope", ST_SF_F32, 0,
						     NULL, &info), -ENOENT);
		assert_int_equal(st_ckpt_reader_find(r, t[1].name, ST_SF_F32, 2,
						     wrong, &info), -EINVAL);
		assert_non_null(strstr(st_error_last(), "[24,72]"));
	}
	st_safetensors_close(sf);
	st_ckpt_reader_close(r);
	st_ckpt_reader_close(NULL);

	/* Empty file: no tensors, no metadata, no fill needed. */
	assert_int_equal(st_safetensors_write(a, NULL, 0, NULL, 0), 0);
	assert_int_equal(st_ckpt_write_safetensors(b, NULL, 0, NULL, 0, NULL,
						   NULL, &bytes, &h), 0);
	free(fa);
	free(fb);
	fa = read_all(a, &la);
	fb = read_all(b, &lb);
	assert_int_equal(la, lb);
	assert_memory_equal(fa, fb, la);
	assert_int_equal(bytes, lb);

	free(fa);
	free(fb);
	for (size_t k = 0; k < N_T; k++)
		free(bufs[k]);
	free(a);
	free(b);
	free(dir);
}

static void test_stream_bad_args_and_failure(void **state)
{
	struct st_sf_tensor t[N_T];
	struct st_ckpt_tensor ct[N_T], dup[2];
	struct st_sf_meta meta[] = { { "k", "a" }, { "k", "b" } };
	uint64_t sizes[N_T];
	void *bufs[N_T];
	char *dir = fresh_dir("bad"), *p;
	struct mem_src src = { 0 };
	uint8_t *before, *after;
	size_t lbefore, lafter;

	ST_UNUSED(state);
	make_tensors(t, ct, sizes, bufs);
	src.t = t;
	src.sizes = sizes;
	assert_true(asprintf(&p, "%s/x.safetensors", dir) > 0);

	dup[0] = ct[0];
	dup[1] = ct[1];
	dup[1].name = ct[0].name;
	assert_int_equal(st_ckpt_write_safetensors(p, dup, 2, NULL, 0, mem_fill,
						   &src, NULL, NULL), -EINVAL);
	assert_non_null(strstr(st_error_last(), "'wte.weight' given twice"));
	assert_int_equal(st_ckpt_write_safetensors(p, ct, 1, meta, 2, mem_fill,
						   &src, NULL, NULL), -EINVAL);
	assert_non_null(strstr(st_error_last(), "'k' given twice"));
	dup[0].name = "__metadata__";
	assert_int_equal(st_ckpt_write_safetensors(p, dup, 1, NULL, 0, mem_fill,
						   &src, NULL, NULL), -EINVAL);
	dup[0] = ct[0];
	dup[0].ndim = ST_SF_MAX_DIMS + 1;
	assert_int_equal(st_ckpt_write_safetensors(p, dup, 1, NULL, 0, mem_fill,
						   &src, NULL, NULL), -EINVAL);
	assert_int_equal(st_ckpt_write_safetensors(p, ct, 1, NULL, 0, NULL,
						   NULL, NULL, NULL), -EINVAL);
	assert_int_equal(access(p, F_OK), -1); /* nothing created */
	assert_int_equal(count_tmp(dir), 0);

	/* A fill that fails midway (in the big tensor's second chunk):
	 * the error and its detail come back, the old file stays, no
	 * temporary is left. */
	assert_int_equal(st_ckpt_write_safetensors(p, ct, 2, NULL, 0, mem_fill,
						   &src, NULL, NULL), 0);
	before = read_all(p, &lbefore);
	memset(&src, 0, sizeof(src));
	src.t = t;
	src.sizes = sizes;
	src.fail_at_call = 6;
	assert_int_equal(st_ckpt_write_safetensors(p, ct, N_T, NULL, 0, mem_fill,
						   &src, NULL, NULL), -EIO);
	assert_int_equal(src.calls, 6);
	assert_non_null(strstr(st_error_last(), "injected"));
	assert_non_null(strstr(st_error_last(), "big/"));
	assert_non_null(strstr(st_error_last(), "x.safetensors"));
	after = read_all(p, &lafter);
	assert_int_equal(lbefore, lafter);
	assert_memory_equal(before, after, lafter);
	assert_int_equal(count_tmp(dir), 0);

	free(before);
	free(after);
	for (size_t k = 0; k < N_T; k++)
		free(bufs[k]);
	free(p);
	free(dir);
}

/* ---- trainer.json ------------------------------------------------------------- */

static void test_trainer_roundtrip(void **state)
{
	struct st_ckpt_trainer tr = { 0 }, back;
	struct st_cursor cur = { .batch = 4, .seq = 64, .shuffle = 1,
				 .seed = 1234, .begin_tok = 10,
				 .end_tok = 100000, .step = 77,
				 .rng = { 1, 2, 0xffffffffffffffffull, 4 } };
	struct st_cursor cur_back;
	const char *cfg = "{\"lr\": 0.0003, \"batch\": 4, \"nested\": "
			  "{\"s\": \"a/b \\\"c\\\"\"}, \"list\": [1, 2]}";
	struct json_object *a, *b;
	char *dir = fresh_dir("trainer"), *p;

	ST_UNUSED(state);
	assert_true(asprintf(&p, "%s/trainer.json", dir) > 0);
	tr.step = 123456789012ull;
	tr.seed = UINT64_MAX;
	st_cursor_pack(&cur, tr.cursor);
	tr.cursor_bytes = ST_CURSOR_BYTES;
	assert_int_equal(st_ckpt_trainer_set_config(&tr, "[1]"), -EINVAL);
	assert_int_equal(st_ckpt_trainer_set_config(&tr, "{\"a\":1} x"),
			 -EINVAL);
	assert_int_equal(st_ckpt_trainer_set_config(&tr, cfg), 0);
	assert_int_equal(st_ckpt_trainer_add(&tr, "model.safetensors", 1000,
					     0x0123456789abcdefull), 0);
	assert_int_equal(st_ckpt_trainer_add(&tr, "optimizer.safetensors",
					     (uint64_t)1 << 40,
					     0xfedcba9876543210ull), 0);
	assert_int_equal(st_ckpt_trainer_add(&tr, "model.safetensors", 1001,
					     0x1111ull), 0); /* update */
	assert_int_equal(st_ckpt_trainer_add(&tr, "../etc/passwd", 1, 1),
			 -EINVAL);
	assert_int_equal(st_ckpt_trainer_add(&tr, "trainer.json", 1, 1),
			 -EINVAL);
	assert_int_equal(st_ckpt_trainer_add(&tr, "", 1, 1), -EINVAL);
	assert_int_equal(tr.n_files, 2);
	assert_int_equal(st_ckpt_trainer_write(p, &tr), 0);

	assert_int_equal(st_ckpt_trainer_read(p, &back), 0);
	assert_int_equal(back.version, ST_CKPT_VERSION);
	assert_true(back.step == tr.step);
	assert_true(back.seed == tr.seed);
	assert_int_equal(back.cursor_bytes, ST_CURSOR_BYTES);
	assert_memory_equal(back.cursor, tr.cursor, ST_CURSOR_BYTES);
	assert_int_equal(st_cursor_unpack(&cur_back, back.cursor,
					  back.cursor_bytes), 0);
	assert_memory_equal(&cur_back.rng, &cur.rng, sizeof(cur.rng));
	assert_int_equal(back.n_files, 2);
	for (size_t i = 0; i < 2; i++) {
		assert_string_equal(back.files[i].name, tr.files[i].name);
		assert_true(back.files[i].bytes == tr.files[i].bytes);
		assert_true(back.files[i].xxh64 == tr.files[i].xxh64);
	}
	assert_non_null(st_ckpt_trainer_find(&back, "optimizer.safetensors"));
	assert_null(st_ckpt_trainer_find(&back, "config.json"));
	a = json_tokener_parse(cfg);
	b = json_tokener_parse(back.config_json);
	assert_true(json_object_equal(a, b));
	json_object_put(a);
	json_object_put(b);
	st_ckpt_trainer_fini(&back);
	assert_null(back.config_json);

	/* No config: written as {}; read back as "{}". */
	free(tr.config_json);
	tr.config_json = NULL;
	assert_int_equal(st_ckpt_trainer_write(p, &tr), 0);
	assert_int_equal(st_ckpt_trainer_read(p, &back), 0);
	assert_string_equal(back.config_json, "{}");
	st_ckpt_trainer_fini(&back);
	st_ckpt_trainer_fini(&tr);

	/* Damaged files are refused, naming the problem. */
	{
		static const char *const bad[][2] = {
			{ "{\"format\":\"strata-checkpoint\",\"version\":99,"
			  "\"step\":1,\"seed\":1,\"cursor\":\"\",\"config\":{},"
			  "\"files\":[]}", "version 99" },
			{ "{\"format\":\"strata-checkpoint\",\"version\":1,"
			  "\"step\":-1,\"seed\":1,\"cursor\":\"\",\"config\":{},"
			  "\"files\":[]}", "step is negative" },
			{ "{\"format\":\"strata-checkpoint\",\"version\":1,"
			  "\"step\":1,\"seed\":1,\"cursor\":\"0g\",\"config\":{},"
			  "\"files\":[]}", "cursor" },
			{ "{\"format\":\"strata-checkpoint\",\"version\":1,"
			  "\"step\":1,\"seed\":1,\"cursor\":\"\",\"config\":{},"
			  "\"files\":[{\"name\":\"../x\",\"bytes\":1,"
			  "\"xxh64\":\"0000000000000000\"}]}", "bad name" },
			{ "{\"format\":\"strata-checkpoint\",\"version\":1,"
			  "\"step\":1,\"seed\":1,\"cursor\":\"\",\"config\":{},"
			  "\"files\":[{\"name\":\"x\",\"bytes\":1,"
			  "\"xxh64\":\"00\"}]}", "16 hex" },
			{ "{\"format\":\"strata-checkpoint\",\"version\":1,"
			  "\"seed\":1,\"cursor\":\"\",\"config\":{},"
			  "\"files\":[]}", "missing \"step\"" },
			{ "{\"format\":\"strata-checkpoint\",\"version\":1,"
			  "\"step\":1,\"seed\":1,\"cursor\":\"\",\"config\":[],"
			  "\"files\":[]}", "\"config\" is array" },
			{ "{\"format\":\"strata-checkpoint\",\"vers", "not a JSON" },
		};

		for (size_t i = 0; i < ST_ARRAY_LEN(bad); i++) {
			FILE *f = fopen(p, "w");

			fputs(bad[i][0], f);
			fclose(f);
			assert_int_equal(st_ckpt_trainer_read(p, &back), -EINVAL);
			assert_non_null(strstr(st_error_last(), bad[i][1]));
			assert_null(back.config_json);
		}
	}
	free(p);
	free(dir);
}

/* ---- checkpoint directories ------------------------------------------------- */

struct gen_src {
	uint64_t seed;
	int fail_at_call;
	int calls;
};

static int gen_fill(void *ctx, size_t k, uint64_t off, void *buf, size_t len)
{
	struct gen_src *g = ctx;
	uint8_t *b = buf;

	if (g->fail_at_call && ++g->calls == g->fail_at_call)
		return st_error_set(-ENOSPC, "disk full (injected)");
	for (size_t i = 0; i < len; i++)
		b[i] = pattern(g->seed, k, off + i);
	return 0;
}

/* Model: 2 tensors; optimizer: their two moments. sizes in bytes. */
#define MODEL_ELEMS 40000
static const struct st_ckpt_tensor model_t[2] = {
	{ "wte.weight", ST_SF_F32, 2, { 100, 300 } },
	{ "h.0.ln_1.weight", ST_SF_F32, 1, { MODEL_ELEMS - 30000 } },
};
static const struct st_ckpt_tensor optim_t[4] = {
	{ "wte.weight" ST_CKPT_SUFFIX_EXP_AVG, ST_SF_F32, 2, { 100, 300 } },
	{ "wte.weight" ST_CKPT_SUFFIX_EXP_AVG_SQ, ST_SF_F32, 2, { 100, 300 } },
	{ "h.0.ln_1.weight" ST_CKPT_SUFFIX_EXP_AVG, ST_SF_F32, 1,
	  { MODEL_ELEMS - 30000 } },
	{ "h.0.ln_1.weight" ST_CKPT_SUFFIX_EXP_AVG_SQ, ST_SF_F32, 1,
	  { MODEL_ELEMS - 30000 } },
};

/* Write the checkpoint of step under root as the tiered engine would.
 * fail_at_call > 0 makes the optimizer's fill fail at that call. Returns
 * 0 or the error (after aborting). */
static int write_ckpt(const char *root, uint64_t step, unsigned keep,
		      int fail_at_call)
{
	struct st_model_config gc = { .dim = 300, .n_layer = 1, .n_head = 3,
				      .vocab = 100, .ctx = 64 };
	struct st_ckpt_trainer tr = { 0 };
	struct st_ckpt_dir d;
	struct gen_src gm = { .seed = step }, go = { .seed = step + 1000000,
						     .fail_at_call = fail_at_call };
	struct st_sf_meta meta = { "format", "pt" };
	uint64_t bytes, h;
	char *p = NULL, cfg[64];
	int err;

	err = st_ckpt_dir_begin(&d, root, step);
	if (err)
		return err;
	tr.step = step;
	tr.seed = 7;
	tr.cursor_bytes = 3;
	tr.cursor[0] = (uint8_t)step;
	snprintf(cfg, sizeof(cfg), "{\"step_written\": %llu}",
		 (unsigned long long)step);
	err = st_ckpt_trainer_set_config(&tr, cfg);
	if (!err && asprintf(&p, "%s/" ST_CKPT_MODEL_FILE, d.tmp) < 0)
		err = -ENOMEM;
	if (!err)
		err = st_ckpt_write_safetensors(p, model_t, 2, &meta, 1, gen_fill,
						&gm, &bytes, &h);
	if (!err)
		err = st_ckpt_trainer_add(&tr, ST_CKPT_MODEL_FILE, bytes, h);
	free(p);
	p = NULL;
	if (!err && asprintf(&p, "%s/" ST_CKPT_OPTIM_FILE, d.tmp) < 0)
		err = -ENOMEM;
	if (!err)
		err = st_ckpt_write_safetensors(p, optim_t, 4, NULL, 0, gen_fill,
						&go, &bytes, &h);
	if (!err)
		err = st_ckpt_trainer_add(&tr, ST_CKPT_OPTIM_FILE, bytes, h);
	free(p);
	p = NULL;
	if (!err && asprintf(&p, "%s/" ST_CKPT_CONFIG_FILE, d.tmp) < 0)
		err = -ENOMEM;
	if (!err)
		err = st_model_config_write(p, &gc);
	if (!err)
		err = st_ckpt_trainer_add_hashed(&tr, d.tmp, ST_CKPT_CONFIG_FILE);
	free(p);
	p = NULL;
	if (!err && asprintf(&p, "%s/" ST_CKPT_TRAINER_FILE, d.tmp) < 0)
		err = -ENOMEM;
	if (!err)
		err = st_ckpt_trainer_write(p, &tr);
	free(p);
	st_ckpt_trainer_fini(&tr);
	if (err) {
		st_ckpt_dir_abort(&d);
		return err;
	}
	return st_ckpt_dir_commit(&d, keep);
}

/* Resolve path, read and verify the checkpoint, and check its contents
 * are those of its step. Returns the step, or -1 when there is none. */
static int64_t check_ckpt(const char *path)
{
	struct st_ckpt_trainer tr;
	struct st_ckpt_reader *r;
	char *dir, *p;
	int64_t step;
	int err = st_ckpt_resolve(path, &dir);

	if (err == -ENOENT)
		return -1;
	assert_int_equal(err, 0);
	assert_true(asprintf(&p, "%s/" ST_CKPT_TRAINER_FILE, dir) > 0);
	err = st_ckpt_trainer_read(p, &tr);
	if (err)
		fail_msg("%s", st_error_last());
	free(p);
	err = st_ckpt_verify(dir, &tr);
	if (err)
		fail_msg("%s", st_error_last());
	assert_int_equal(tr.n_files, 3);
	assert_int_equal(tr.cursor_bytes, 3);
	assert_int_equal(tr.cursor[0], (uint8_t)tr.step);
	/* Spot-check the optimizer's last tensor against its generator. */
	assert_true(asprintf(&p, "%s/" ST_CKPT_OPTIM_FILE, dir) > 0);
	assert_int_equal(st_ckpt_reader_open(&r, p), 0);
	{
		const struct st_sf_info *info;
		uint8_t got[4096];

		assert_int_equal(st_ckpt_reader_find(r, optim_t[3].name,
						     ST_SF_F32, 1,
						     optim_t[3].shape, &info), 0);
		assert_int_equal(st_ckpt_reader_pread(r, info, 1000, got,
						      sizeof(got)), 0);
		for (size_t i = 0; i < sizeof(got); i++)
			assert_int_equal(got[i], pattern(tr.step + 1000000, 3,
							 1000 + i));
	}
	st_ckpt_reader_close(r);
	free(p);
	free(dir);
	step = (int64_t)tr.step;
	st_ckpt_trainer_fini(&tr);
	return step;
}

static char *latest_target(const char *root)
{
	char *link, buf[256];
	ssize_t n;

	assert_true(asprintf(&link, "%s/latest", root) > 0);
	n = readlink(link, buf, sizeof(buf) - 1);
	free(link);
	if (n < 0)
		return NULL;
	buf[n] = '\0';
	return strdup(buf);
}

/* trainer.json checks itself (its step edited), lists what a checkpoint
 * needs and every file there, and agrees with the sampler's cursor. */
static void test_trainer_self_checks(void **state)
{
	char *root = fresh_dir("selfcheck"), *dir, *p, *text;
	struct st_ckpt_trainer tr, back;
	struct st_cursor c = { .batch = 2, .seq = 8, .step = 12 };
	size_t len;
	FILE *f;

	ST_UNUSED(state);
	assert_int_equal(write_ckpt(root, 3, 0, 0), 0);
	assert_int_equal(st_ckpt_resolve(root, &dir), 0);
	assert_true(asprintf(&p, "%s/trainer.json", dir) > 0);
	assert_int_equal(st_ckpt_trainer_read(p, &tr), 0);
	assert_int_equal(tr.version, 2);
	assert_int_equal(st_ckpt_check(dir, &tr), 0);

	/* "step": 3 -> 4 in the text: the checksum no longer matches */
	assert_int_equal(st_file_read_small(p, 1 << 20, &text, &len), 0);
	assert_non_null(strstr(text, "\"step\": 3,"));
	strstr(text, "\"step\": 3,")[8] = '4';
	f = fopen(p, "w");
	assert_non_null(f);
	fwrite(text, 1, len, f);
	fclose(f);
	free(text);
	assert_int_equal(st_ckpt_trainer_read(p, &back), -EINVAL);
	assert_non_null(strstr(st_error_last(), "trainer.json: checksum mismatch"));

	/* an entry dropped: its file is there, unlisted */
	tr.n_files--; /* config.json, the last */
	assert_int_equal(st_ckpt_check(dir, &tr), -EINVAL);
	assert_non_null(strstr(st_error_last(), "lists no config.json"));
	tr.files[1] = tr.files[2]; /* model, config.json: no optimizer */
	tr.n_files = 2;
	assert_int_equal(st_ckpt_check(dir, &tr), -EINVAL);
	assert_non_null(strstr(st_error_last(), "lists no optimizer.safetensors"));
	assert_int_equal(st_ckpt_trainer_add_hashed(&tr, dir, ST_CKPT_OPTIM_FILE), 0);
	assert_int_equal(st_ckpt_check(dir, &tr), 0);
	/* a file there that is not listed */
	free(p);
	assert_true(asprintf(&p, "%s/extra.safetensors", dir) > 0);
	f = fopen(p, "w");
	assert_non_null(f);
	fclose(f);
	assert_int_equal(st_ckpt_check(dir, &tr), -EINVAL);
	assert_non_null(strstr(st_error_last(), "extra.safetensors: not listed"));
	unlink(p);

	/* the cursor against the step, with the config's grad_accum */
	assert_int_equal(st_ckpt_trainer_set_config(&tr, "{\"grad_accum\": 4}"), 0);
	st_cursor_pack(&c, tr.cursor);
	tr.cursor_bytes = ST_CURSOR_BYTES;
	tr.step = 3;
	assert_int_equal(st_ckpt_check(dir, &tr), 0);
	tr.step = 4;
	assert_int_equal(st_ckpt_check(dir, &tr), -EINVAL);
	assert_non_null(strstr(st_error_last(), "step 4, but the sampler's cursor has drawn 12"));

	free(p);
	free(dir);
	st_ckpt_trainer_fini(&tr);
	free(root);
}

static void test_verify_detects_damage(void **state)
{
	char *root = fresh_dir("verify"), *dir, *p;
	struct st_ckpt_trainer tr;
	int fd;
	uint8_t byte;

	ST_UNUSED(state);
	assert_int_equal(write_ckpt(root, 3, 0, 0), 0);
	assert_int_equal(check_ckpt(root), 3);
	assert_int_equal(st_ckpt_resolve(root, &dir), 0);
	assert_true(asprintf(&p, "%s/trainer.json", dir) > 0);
	assert_int_equal(st_ckpt_trainer_read(p, &tr), 0);
	free(p);
	assert_int_equal(st_ckpt_verify(dir, &tr), 0);

	/* Flip one byte in the middle of the optimizer file: same size. */
	assert_true(asprintf(&p, "%s/optimizer.safetensors", dir) > 0);
	fd = open(p, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &byte, 1, 100000), 1);
	byte ^= 0x10;
	assert_int_equal(pwrite(fd, &byte, 1, 100000), 1);
	assert_int_equal(st_ckpt_verify(dir, &tr), -EINVAL);
	assert_non_null(strstr(st_error_last(), "optimizer.safetensors: "
			       "checksum mismatch (file changed or truncated)"));
	byte ^= 0x10;
	assert_int_equal(pwrite(fd, &byte, 1, 100000), 1);
	assert_int_equal(st_ckpt_verify(dir, &tr), 0);

	/* Truncate by one byte. */
	assert_int_equal(ftruncate(fd, (off_t)tr.files[1].bytes - 1), 0);
	close(fd);
	assert_int_equal(st_ckpt_verify(dir, &tr), -EINVAL);
	assert_non_null(strstr(st_error_last(), "optimizer.safetensors"));
	assert_non_null(strstr(st_error_last(), "truncated"));

	/* Missing. */
	unlink(p);
	assert_int_equal(st_ckpt_verify(dir, &tr), -ENOENT);
	assert_non_null(strstr(st_error_last(), "optimizer.safetensors"));

	free(p);
	free(dir);
	st_ckpt_trainer_fini(&tr);
	free(root);
}

static void test_keep_latest_resolve(void **state)
{
	char *root = fresh_dir("keep"), *t, *p, *dir;
	pid_t dead;

	ST_UNUSED(state);
	assert_int_equal(st_ckpt_resolve(root, &dir), -ENOENT);
	assert_non_null(strstr(st_error_last(), "no checkpoint"));
	for (uint64_t s = 1; s <= 5; s++) {
		assert_int_equal(write_ckpt(root, s * 10, 2, 0), 0);
		assert_int_equal(check_ckpt(root), (int64_t)s * 10);
		assert_int_equal(count_steps(root), s < 2 ? (int)s : 2);
		assert_int_equal(count_tmp(root), 0);
	}
	t = latest_target(root);
	assert_string_equal(t, "step-000050");
	free(t);
	assert_true(asprintf(&p, "%s/step-000040", root) > 0);
	assert_int_equal(access(p, F_OK), 0);
	/* A step directory given directly resolves to itself. */
	assert_int_equal(check_ckpt(p), 40);
	free(p);
	assert_true(asprintf(&p, "%s/step-000030", root) > 0);
	assert_int_equal(access(p, F_OK), -1);
	free(p);

	/* The same step again (resumed and saved again): swapped in. */
	assert_int_equal(write_ckpt(root, 50, 2, 0), 0);
	assert_int_equal(check_ckpt(root), 50);
	assert_int_equal(count_steps(root), 2);
	assert_int_equal(count_tmp(root), 0);

	/* A failing write leaves everything as it was. */
	assert_int_equal(write_ckpt(root, 60, 2, 3), -ENOSPC);
	assert_non_null(strstr(st_error_last(), "injected"));
	assert_int_equal(count_tmp(root), 0);
	assert_int_equal(count_steps(root), 2);
	t = latest_target(root);
	assert_string_equal(t, "step-000050");
	free(t);
	assert_int_equal(check_ckpt(root), 50);

	/* Leftovers of a dead writer are removed by the next begin; those
	 * of a live one (our parent) are not. */
	dead = fork();
	assert_true(dead >= 0);
	if (dead == 0)
		_exit(0);
	waitpid(dead, NULL, 0);
	assert_true(asprintf(&p, "%s/step-000060.tmp.%d", root, (int)dead) > 0);
	assert_int_equal(mkdir(p, 0755), 0);
	free(p);
	assert_true(asprintf(&p, "%s/latest.tmp.%d", root, (int)dead) > 0);
	assert_int_equal(symlink("step-000060", p), 0);
	free(p);
	assert_true(asprintf(&p, "%s/step-000061.tmp.%d", root, (int)getppid())
		    > 0);
	assert_int_equal(mkdir(p, 0755), 0);
	assert_int_equal(count_tmp(root), 3);
	/* A larger step from another run is left alone by pruning. */
	assert_true(asprintf(&t, "%s/step-000900", root) > 0);
	assert_int_equal(mkdir(t, 0755), 0);
	assert_int_equal(write_ckpt(root, 70, 2, 0), 0);
	assert_int_equal(count_tmp(root), 1);
	assert_int_equal(access(t, F_OK), 0);
	assert_int_equal(count_steps(root), 3); /* 50, 70, 900 */
	assert_int_equal(check_ckpt(root), 70);
	rmdir(p);
	rmdir(t);
	free(p);
	free(t);

	/* Without latest, the largest step is taken. */
	assert_true(asprintf(&p, "%s/latest", root) > 0);
	unlink(p);
	assert_int_equal(check_ckpt(root), 70);
	/* So it is when latest names a directory that is gone. */
	assert_int_equal(symlink("step-000999", p), 0);
	assert_int_equal(check_ckpt(root), 70);
	unlink(p);
	free(p);

	/* keep 0: keep everything. */
	assert_int_equal(write_ckpt(root, 80, 0, 0), 0);
	assert_int_equal(write_ckpt(root, 90, 0, 0), 0);
	assert_int_equal(count_steps(root), 4);
	free(root);
}

/* A child writes checkpoints in a loop; the parent kills it at a random
 * instant, then checks that what latest names verifies. */
static void test_crash_anywhere(void **state)
{
	char *root = fresh_dir("crash");
	unsigned seed = (unsigned)time(NULL);
	int64_t last = -1;
	int advanced = 0, iters = 20;
	const char *env = getenv("ST_CKPT_CRASH_ITERS");

	ST_UNUSED(state);
	char *cal = fresh_dir("crash-calibrate");
	uint64_t t0_ns, ckpt_us;

	if (env)
		iters = atoi(env);
	/* Time one checkpoint here (fsync costs differ a lot between file
	 * systems and under sanitizers), so kills land anywhere in the first
	 * few checkpoints: in writes, fsyncs, renames, pruning. */
	t0_ns = st_now_ns();
	assert_int_equal(write_ckpt(cal, 1, 2, 0), 0);
	ckpt_us = (st_now_ns() - t0_ns) / 1000 + 1;
	rm_rf(cal);
	free(cal);
	srand(seed);
	for (int it = 0; it < iters; it++) {
		long delay_us = (long)((uint64_t)rand() % (2 * ckpt_us));
		int64_t now;

		/* The calibration ran in this process with a warm cache; on a
		 * busy machine a forked writer can be slower, and every kill may
		 * then land inside the first checkpoint. Give the last kill time
		 * for several checkpoints if none has landed yet, so the run
		 * also covers kills after complete commits. */
		if (it == iters - 1 && advanced == 0)
			delay_us = (long)(20 * ckpt_us) + 200000;
		pid_t pid = fork();

		assert_true(pid >= 0);
		if (pid == 0) {
			int64_t s = last < 0 ? 1 : last + 1;

			for (;; s++)
				if (write_ckpt(root, (uint64_t)s, 2, 0))
					_exit(3);
		}
		usleep((useconds_t)delay_us);
		kill(pid, SIGKILL);
		{
			int status;

			assert_int_equal(waitpid(pid, &status, 0), pid);
			if (!WIFSIGNALED(status))
				fail_msg("writer exited with %d (seed %u): "
					 "it should only die by SIGKILL",
					 WEXITSTATUS(status), seed);
		}
		now = check_ckpt(root);
		if (now < last)
			fail_msg("latest went back from %lld to %lld (seed %u)",
				 (long long)last, (long long)now, seed);
		advanced += now > last;
		last = now;
		/* No bound on step directories here: kills between a
		 * commit's rename and its pruning leave extra ones, which
		 * the next complete commit removes (checked below). */
	}
	/* The next writer cleans up whatever the kills left. */
	assert_int_equal(write_ckpt(root, (uint64_t)(last + 1), 2, 0), 0);
	assert_int_equal(count_tmp(root), 0);
	assert_int_equal(check_ckpt(root), last + 1);
	assert_true(count_steps(root) <= 2);
	if (iters >= 10)
		assert_true(advanced > 0);
	free(root);
}

/* One writer per DIR: st_ckpt_lock() makes DIR (and its parents) when
 * missing, refuses a second holder (another open file description, as
 * another process has) with -EBUSY and a message naming DIR, and the lock
 * goes with its holder: at st_ckpt_unlock(), and when a process holding it
 * dies by SIGKILL. */
static void test_lock_one_writer(void **state)
{
	char *root, *top, *made, buf;
	int fd1, fd2, pipefd[2], status;
	pid_t pid;

	ST_UNUSED(state);
	assert_true(asprintf(&root, "%s/lock/a/b", tmp_root) > 0);
	assert_true(asprintf(&top, "%s/lock", tmp_root) > 0);
	assert_int_equal(st_ckpt_lock(root, &fd1, &made), 0);
	assert_true(fd1 >= 0);
	assert_string_equal(made, top); /* lock, lock/a and lock/a/b were made */
	free(made);
	assert_int_equal(st_ckpt_lock(root, &fd2, &made), -EBUSY);
	assert_int_equal(fd2, -1);
	assert_null(made);
	assert_non_null(strstr(st_error_last(), root));
	assert_non_null(strstr(st_error_last(), "another process"));
	st_ckpt_unlock(fd1);
	assert_int_equal(st_ckpt_lock(root, &fd2, &made), 0);
	assert_null(made);
	st_ckpt_unlock(fd2);

	assert_int_equal(pipe(pipefd), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int fd;
		char *m;

		if (st_ckpt_lock(root, &fd, &m) < 0 || write(pipefd[1], "k", 1) != 1)
			_exit(1);
		for (;;)
			pause();
	}
	close(pipefd[1]);
	assert_int_equal(read(pipefd[0], &buf, 1), 1);
	close(pipefd[0]);
	assert_int_equal(st_ckpt_lock(root, &fd2, &made), -EBUSY);
	kill(pid, SIGKILL);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	assert_int_equal(st_ckpt_lock(root, &fd2, &made), 0);
	st_ckpt_unlock(fd2);
	free(root);
	free(top);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stream_matches_writer),
		cmocka_unit_test(test_stream_bad_args_and_failure),
		cmocka_unit_test(test_trainer_roundtrip),
		cmocka_unit_test(test_verify_detects_damage),
		cmocka_unit_test(test_trainer_self_checks),
		cmocka_unit_test(test_keep_latest_resolve),
		cmocka_unit_test(test_crash_anywhere),
		cmocka_unit_test(test_lock_one_writer),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}

/* safetensors round trip, exact bytes of a small file, read by name, and
 * the writer's all-or-nothing behaviour. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "strata/family.h"
#include "strata/io.h"
#include "io_test_util.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[64];

static int setup(void **state)
{
	(void)state;
	strcpy(tmpdir, "/tmp/st_io_XXXXXX");
	return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
	char cmd[128];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
	return system(cmd) == 0 ? 0 : -1;
}

/* Files in tmpdir whose name contains s. */
static int count_files(const char *s)
{
	DIR *d = opendir(tmpdir);
	struct dirent *e;
	int n = 0;

	assert_non_null(d);
	while ((e = readdir(d)))
		if (strstr(e->d_name, s))
			n++;
	closedir(d);
	return n;
}

static void fill(void *p, size_t bytes, unsigned seed)
{
	uint8_t *b = p;

	for (size_t i = 0; i < bytes; i++)
		b[i] = (uint8_t)((i * 131 + seed * 7 + (i >> 8)) ^ seed);
}

#define NT 8

static void test_round_trip(void **state)
{
	static float a[3 * 4];
	static uint16_t bf[5];
	static int32_t i32[2 * 2 * 2];
	static int64_t i64[3];
	static uint16_t u16[7];
	static uint16_t f16[1];
	static uint8_t u8[3 * 1 * 2 * 1];
	const struct st_sf_tensor t[NT] = {
		{ "h.0.attn.c_attn.weight", ST_SF_F32, 2, { 3, 4 }, a },
		{ "wte.bf16", ST_SF_BF16, 1, { 5 }, bf },
		{ "ids", ST_SF_I32, 3, { 2, 2, 2 }, i32 },
		{ "steps", ST_SF_I64, 1, { 3 }, i64 },
		{ "odd/u16", ST_SF_U16, 1, { 7 }, u16 },
		{ "scalar", ST_SF_F16, 0, { 0 }, f16 },
		{ "empty", ST_SF_U8, 2, { 0, 5 }, NULL },
		{ "bytes", ST_SF_U8, 4, { 3, 1, 2, 1 }, u8 },
	};
	const struct st_sf_meta meta[] = {
		{ "format", "pt" }, { "strata.step", "42" },
	};
	char path[128];
	struct st_safetensors *sf;
	const void *data;
	uint64_t data_bytes, off = 0;
	uint8_t *file, buf[256];
	size_t file_len;
	uint64_t hdr_len = 0;

	(void)state;
	fill(a, sizeof(a), 1);
	fill(bf, sizeof(bf), 2);
	fill(i32, sizeof(i32), 3);
	fill(i64, sizeof(i64), 4);
	fill(u16, sizeof(u16), 5);
	fill(f16, sizeof(f16), 6);
	fill(u8, sizeof(u8), 7);
	snprintf(path, sizeof(path), "%s/model.safetensors", tmpdir);
	assert_int_equal(st_safetensors_write(path, t, NT, meta, 2), 0);
	assert_int_equal(count_files(".tmp."), 0);

	/* Header per spec: length, '{', spaces to a multiple of 8. */
	file = read_all(path, &file_len);
	for (int i = 7; i >= 0; i--)
		hdr_len = hdr_len << 8 | file[i];
	assert_int_equal(hdr_len % 8, 0);
	assert_true(8 + hdr_len <= file_len);
	assert_int_equal(file[8], '{');
	{
		size_t last = 8 + hdr_len - 1;

		while (file[last] == ' ')
			last--;
		assert_int_equal(file[last], '}');
		assert_true(8 + hdr_len - 1 - last < 8);
	}

	assert_int_equal(st_safetensors_open(&sf, path), 0);
	assert_int_equal(st_safetensors_count(sf), NT);
	assert_string_equal(st_safetensors_metadata(sf, "format"), "pt");
	assert_string_equal(st_safetensors_metadata(sf, "strata.step"), "42");
	assert_null(st_safetensors_metadata(sf, "missing"));
	assert_int_equal(st_safetensors_data(sf, &data, &data_bytes), 0);
	assert_int_equal(8 + hdr_len + data_bytes, file_len);

	for (int i = 0; i < NT; i++) {
		const struct st_sf_info *info = st_safetensors_at(sf, (size_t)i);
		uint64_t bytes = st_sf_dtype_size(t[i].dtype);

		for (int d = 0; d < t[i].ndim; d++)
			bytes *= t[i].shape[d];
		/* Data in the order given, contiguous. */
		assert_string_equal(info->name, t[i].name);
		assert_ptr_equal(st_safetensors_find(sf, t[i].name), info);
		assert_int_equal(info->dtype, t[i].dtype);
		assert_int_equal(info->ndim, t[i].ndim);
		for (int d = 0; d < t[i].ndim; d++)
			assert_int_equal(info->shape[d], t[i].shape[d]);
		assert_int_equal(info->offset_bytes, off);
		assert_int_equal(info->size_bytes, bytes);
		off += bytes;

		memset(buf, 0xee, sizeof(buf));
		assert_int_equal(st_safetensors_read(sf, t[i].name, t[i].dtype,
						     t[i].ndim, t[i].shape, buf),
				 0);
		if (bytes)
			assert_memory_equal(buf, t[i].data, bytes);
		assert_int_equal(buf[bytes], 0xee);
		if (bytes)
			assert_memory_equal((const uint8_t *)data +
					    info->offset_bytes, t[i].data,
					    bytes);
		assert_memory_equal(file + 8 + hdr_len + info->offset_bytes,
				    t[i].data, bytes);
	}
	/* After mapping, reads come from the map: same bytes. */
	assert_int_equal(st_safetensors_read(sf, "ids", ST_SF_I32, 3,
					     t[2].shape, buf), 0);
	assert_memory_equal(buf, i32, sizeof(i32));

	assert_int_equal(st_safetensors_read(sf, "nope", ST_SF_F32, 0, NULL,
					     buf), -ENOENT);
	assert_non_null(strstr(st_error_last(), "no tensor 'nope'"));
	{
		const uint64_t wrong[2] = { 4, 3 };

		assert_int_equal(st_safetensors_read(sf, t[0].name, ST_SF_F32,
						     2, wrong, buf), -EINVAL);
		assert_non_null(strstr(st_error_last(),
			"tensor 'h.0.attn.c_attn.weight': is F32 [3,4], "
			"expected F32 [4,3]"));
		assert_int_equal(st_safetensors_read(sf, t[0].name, ST_SF_BF16,
						     2, t[0].shape, buf),
				 -EINVAL);
	}
	st_safetensors_close(sf);

	/* The same bytes through open_mem. */
	assert_int_equal(st_safetensors_open_mem(&sf, file, file_len, "mem"), 0);
	assert_int_equal(st_safetensors_read(sf, "wte.bf16", ST_SF_BF16, 1,
					     t[1].shape, buf), 0);
	assert_memory_equal(buf, bf, sizeof(bf));
	st_safetensors_close(sf);
	free(file);
}

/* The writer's bytes for a small file, spelled out by hand. */
static void test_exact_bytes(void **state)
{
	static const char want_hdr[] =
		"{\"__metadata__\":{\"k\":\"v\"},\"a/b\":{\"dtype\":\"F32\","
		"\"shape\":[2],\"data_offsets\":[0,8]},\"c\":{\"dtype\":\"BF16\","
		"\"shape\":[1,1],\"data_offsets\":[8,10]}}";
	const float a[2] = { 1.0f, -2.0f };
	const uint16_t c[1] = { 0x3f80 };
	const struct st_sf_tensor t[2] = {
		{ "a/b", ST_SF_F32, 1, { 2 }, a },
		{ "c", ST_SF_BF16, 2, { 1, 1 }, c },
	};
	const struct st_sf_meta m = { "k", "v" };
	size_t hdr_len = (strlen(want_hdr) + 7) / 8 * 8, len;
	char path[128];
	uint8_t *file;

	(void)state;
	snprintf(path, sizeof(path), "%s/exact.safetensors", tmpdir);
	assert_int_equal(st_safetensors_write(path, t, 2, &m, 1), 0);
	file = read_all(path, &len);
	assert_int_equal(len, 8 + hdr_len + 10);
	assert_int_equal(file[0], hdr_len);
	for (int i = 1; i < 8; i++)
		assert_int_equal(file[i], 0);
	assert_memory_equal(file + 8, want_hdr, strlen(want_hdr));
	for (size_t i = strlen(want_hdr); i < hdr_len; i++)
		assert_int_equal(file[8 + i], ' ');
	assert_memory_equal(file + 8 + hdr_len, a, 8);
	assert_memory_equal(file + 8 + hdr_len + 8, c, 2);
	free(file);
}

/* A file made by hand (not by our writer) with a header that is not padded
 * and keys in another order than the data. */
static void test_read_foreign(void **state)
{
	static const char hdr[] =
		"{\"z\":{\"data_offsets\":[4,12],\"shape\":[2],\"dtype\":\"I32\"},"
		"\"a\":{\"shape\":[2,2],\"dtype\":\"U8\",\"data_offsets\":[0,4]}}";
	uint8_t file[8 + sizeof(hdr) - 1 + 12];
	int32_t z[2];
	uint8_t a[4];
	struct st_safetensors *sf;
	const uint64_t zs[1] = { 2 }, as[2] = { 2, 2 };

	(void)state;
	memset(file, 0, 8);
	file[0] = (uint8_t)(sizeof(hdr) - 1);
	memcpy(file + 8, hdr, sizeof(hdr) - 1);
	for (int i = 0; i < 12; i++)
		file[8 + sizeof(hdr) - 1 + i] = (uint8_t)(i + 1);
	assert_int_equal(st_safetensors_open_mem(&sf, file, sizeof(file), "h"),
			 0);
	assert_string_equal(st_safetensors_at(sf, 0)->name, "a");
	assert_string_equal(st_safetensors_at(sf, 1)->name, "z");
	assert_int_equal(st_safetensors_read(sf, "z", ST_SF_I32, 1, zs, z), 0);
	assert_int_equal(z[0], 0x08070605);
	assert_int_equal(z[1], 0x0c0b0a09);
	assert_int_equal(st_safetensors_read(sf, "a", ST_SF_U8, 2, as, a), 0);
	assert_int_equal(a[3], 4);
	st_safetensors_close(sf);
}

static void test_writer_errors(void **state)
{
	const float x[1] = { 1 };
	struct st_sf_tensor t[2] = {
		{ "w", ST_SF_F32, 1, { 1 }, x },
		{ "w", ST_SF_F32, 1, { 1 }, x },
	};
	char path[128], sub[128];
	uint8_t *file;
	size_t len;

	(void)state;
	snprintf(path, sizeof(path), "%s/bad.safetensors", tmpdir);
	assert_int_equal(st_safetensors_write(path, t, 2, NULL, 0), -EINVAL);
	assert_non_null(strstr(st_error_last(), "'w' given twice"));
	t[1].name = "__metadata__";
	assert_int_equal(st_safetensors_write(path, t, 2, NULL, 0), -EINVAL);
	t[1].name = "v";
	t[1].dtype = ST_SF_DTYPE_COUNT;
	assert_int_equal(st_safetensors_write(path, t, 2, NULL, 0), -EINVAL);
	assert_int_equal(count_files("bad.safetensors"), 0);

	/* Into a directory that does not exist: nothing created. */
	snprintf(sub, sizeof(sub), "%s/nodir/x.safetensors", tmpdir);
	assert_int_equal(st_safetensors_write(sub, t, 1, NULL, 0), -ENOENT);
	assert_non_null(strstr(st_error_last(), "nodir"));

	/* rename fails (the target is a directory): the temporary is
	 * removed and the directory is untouched. */
	snprintf(sub, sizeof(sub), "%s/isdir", tmpdir);
	assert_int_equal(mkdir(sub, 0755), 0);
	assert_int_equal(st_safetensors_write(sub, t, 1, NULL, 0), -EISDIR);
	assert_non_null(strstr(st_error_last(), "rename"));
	assert_int_equal(count_files(".tmp."), 0);
	rmdir(sub);

	/* Replacing a file leaves the new contents only. */
	snprintf(path, sizeof(path), "%s/replace.safetensors", tmpdir);
	assert_int_equal(st_safetensors_write(path, t, 1, NULL, 0), 0);
	t[0].shape[0] = 0;
	assert_int_equal(st_safetensors_write(path, t, 1, NULL, 0), 0);
	file = read_all(path, &len);
	assert_int_equal(len, 8 + file[0]);
	free(file);
	assert_int_equal(count_files(".tmp."), 0);
}

static void test_gpt2_config(void **state)
{
	const struct st_model_config c = { .n_layer = 12, .dim = 768, .n_head = 12,
					   .vocab = 50257, .ctx = 1024 };
	struct st_model_config r;
	char path[128];
	FILE *f;

	(void)state;
	snprintf(path, sizeof(path), "%s/config.json", tmpdir);
	assert_int_equal(st_model_config_write(path, &c), 0);
	memset(&r, 0, sizeof(r));
	assert_int_equal(st_model_config_read(path, &r), 0);
	assert_true(st_model_config_equal(&r, &c));
	assert_ptr_equal(r.family, st_family_find("gpt2"));

	/* As Hugging Face's gpt2 config.json spells it (n_ctx, extra keys). */
	f = fopen(path, "w");
	assert_non_null(f);
	fputs("{\"activation_function\": \"gelu_new\", \"n_ctx\": 1024,\n"
	      " \"n_embd\": 1600, \"n_head\": 25, \"n_layer\": 48,\n"
	      " \"vocab_size\": 50257, \"task_specific_params\": "
	      "{\"text-generation\": {\"do_sample\": true}}}\n", f);
	fclose(f);
	assert_int_equal(st_model_config_read(path, &r), 0);
	assert_int_equal(r.dim, 1600);
	assert_int_equal(r.n_head, 25);
	assert_int_equal(r.n_layer, 48);
	assert_int_equal(r.ctx, 1024);
	assert_int_equal(r.vocab, 50257);

	f = fopen(path, "w");
	fputs("{\"n_embd\": 100, \"n_head\": 3, \"n_layer\": 1, "
	      "\"vocab_size\": 10, \"n_positions\": 8}", f);
	fclose(f);
	assert_int_equal(st_model_config_read(path, &r), -EINVAL);
	assert_non_null(strstr(st_error_last(), "n_head 3 does not divide"));

	f = fopen(path, "w");
	fputs("{\"n_embd\": 96, \"n_head\": 3, \"vocab_size\": 10, "
	      "\"n_positions\": 8}", f);
	fclose(f);
	assert_int_equal(st_model_config_read(path, &r), -EINVAL);
	assert_non_null(strstr(st_error_last(), "missing \"n_layer\""));

	f = fopen(path, "w");
	fputs("{\"n_embd\": 96, \"n_head\": 3, \"n_layer\": \"2\"", f);
	fclose(f);
	assert_int_equal(st_model_config_read(path, &r), -EINVAL);
	assert_non_null(strstr(st_error_last(), "not JSON (line 1: the file ends inside a value)"));

	{
		struct st_model_config bad = c;

		bad.n_layer = 0;
		assert_int_equal(st_model_config_write(path, &bad), -EINVAL);
		assert_non_null(strstr(st_error_last(), "n_layer is 0"));
	}
	assert_int_equal(st_model_config_read("/nonexistent/config.json", &r),
			 -ENOENT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_exact_bytes),
		cmocka_unit_test(test_read_foreign),
		cmocka_unit_test(test_writer_errors),
		cmocka_unit_test(test_gpt2_config),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}

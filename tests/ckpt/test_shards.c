/* Sharded safetensors (strata/ckpt.h): the split against huggingface_hub's
 * own test case, one file byte for byte as st_ckpt_write_safetensors(),
 * shards that hold the same bytes whether written whole or by parts
 * (st_ckpt_layout_create + pwrite at the planned offsets), the index text,
 * reading a set back, and every refusal of an index that disagrees with its
 * shards. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "strata/ckpt.h"
#include "strata/io.h"
#include "../io/io_test_util.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int setup(void **state)
{
	ST_UNUSED(state);
	return tmp_root_make("/tmp/st-shards-XXXXXX");
}

static int teardown(void **state)
{
	ST_UNUSED(state);
	return tmp_root_remove();
}

static void write_text(const char *dir, const char *name, const char *text)
{
	char *p;
	FILE *f;

	assert_true(asprintf(&p, "%s/%s", dir, name) > 0);
	f = fopen(p, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
	free(p);
}

/* Byte k of tensor i: a pattern that differs between tensors. */
static uint8_t pattern(size_t i, uint64_t k)
{
	return (uint8_t)(i * 37 + k * 11 + (k >> 8));
}

static int fill_pattern(void *ctx, size_t ti, uint64_t off, void *buf, size_t len)
{
	ST_UNUSED(ctx);
	for (size_t k = 0; k < len; k++)
		((uint8_t *)buf)[k] = pattern(ti, off + k);
	return 0;
}

/* huggingface_hub's tests/test_serialization.py: sizes 6, 10, 30, 2, 2 and
 * a maximum of 10 give [layer_1], [layer_3], [layer_2], [layer_4, layer_5]:
 * layer_3 is over the size and is appended as it comes, before the shard
 * layer_2 is in is closed. */
static void test_split_as_hub(void **state)
{
	static const char *names[] = { "layer_1", "layer_2", "layer_3", "layer_4", "layer_5" };
	static const uint64_t sizes[] = { 6, 10, 30, 2, 2 };
	static const size_t want[] = { 0, 2, 1, 3, 3 };
	struct st_ckpt_tensor t[5];
	struct st_ckpt_layout l;

	ST_UNUSED(state);
	for (int i = 0; i < 5; i++)
		t[i] = (struct st_ckpt_tensor){ .name = names[i], .dtype = ST_SF_U8, .ndim = 1,
						.shape = { sizes[i] } };
	assert_int_equal(st_ckpt_layout_init(&l, "model", t, 5, NULL, 0, 10), 0);
	assert_int_equal(l.n_files, 4);
	for (int i = 0; i < 5; i++)
		assert_int_equal(l.file_of[i], want[i]);
	assert_string_equal(l.files[0].name, "model-00001-of-00004.safetensors");
	assert_string_equal(l.files[3].name, "model-00004-of-00004.safetensors");
	assert_string_equal(l.index_name, "model.safetensors.index.json");
	assert_int_equal(l.total_bytes, 50);
	assert_int_equal(l.files[3].n_tensors, 2);
	assert_int_equal(l.files[3].data_bytes, 4);
	/* the offsets: after the header, in file order */
	assert_int_equal(l.offset[3], l.files[3].header_bytes);
	assert_int_equal(l.offset[4], l.files[3].header_bytes + 2);
	st_ckpt_layout_fini(&l);

	/* all of it fits: one file, model.safetensors, no index */
	assert_int_equal(st_ckpt_layout_init(&l, "model", t, 5, NULL, 0, 50), 0);
	assert_int_equal(l.n_files, 1);
	assert_string_equal(l.files[0].name, "model.safetensors");
	assert_string_equal(l.index_name, "");
	st_ckpt_layout_fini(&l);
	/* 0: transformers' 5 GB */
	assert_int_equal(st_ckpt_layout_init(&l, "model", t, 5, NULL, 0, 0), 0);
	assert_int_equal(l.n_files, 1);
	st_ckpt_layout_fini(&l);
	/* a name given twice across shards is refused as in one file */
	t[4].name = "layer_1";
	assert_int_equal(st_ckpt_layout_init(&l, "model", t, 5, NULL, 0, 10), -EINVAL);
	assert_int_equal(st_ckpt_layout_init(&l, "a/b", t, 4, NULL, 0, 10), -EINVAL);
}

static const char *names8[] = { "wte.weight", "h.0.ln_1.weight", "h.0.attn.c_attn.weight",
				 "h.0.mlp.c_fc.weight", "h.1.ln_1.weight", "h.1.attn.c_attn.weight",
				 "ln_f.weight", "\"odd\\name\xc3\xa9\xf0\x9f\x98\x80" };

static void tensors8(struct st_ckpt_tensor *t)
{
	static const uint64_t rows[] = { 300, 1, 64, 64, 1, 64, 1, 3 };
	static const uint64_t cols[] = { 64, 64, 192, 256, 64, 192, 64, 5 };

	for (int i = 0; i < 8; i++)
		t[i] = (struct st_ckpt_tensor){ .name = names8[i], .dtype = ST_SF_F32,
						.ndim = rows[i] == 1 ? 1 : 2,
						.shape = { rows[i] == 1 ? cols[i] : rows[i],
							   cols[i] } };
}

/* One file: the bytes st_ckpt_write_safetensors() writes. */
static void test_one_file_is_the_writer(void **state)
{
	struct st_sf_meta meta[] = { { "format", "pt" }, { "producer", "strata" } };
	struct st_ckpt_tensor t[8];
	struct st_ckpt_layout l;
	struct st_ckpt_trainer tr = { 0 };
	char *dir = fresh_dir("one"), *a, *b;
	uint8_t *x, *y;
	size_t nx, ny;

	ST_UNUSED(state);
	tensors8(t);
	assert_int_equal(st_ckpt_layout_init(&l, "model", t, 8, meta, 2, 0), 0);
	assert_int_equal(st_ckpt_layout_write(dir, &l, t, fill_pattern, NULL, &tr), 0);
	assert_int_equal(tr.n_files, 1);
	assert_string_equal(tr.files[0].name, "model.safetensors");
	assert_true(asprintf(&a, "%s/model.safetensors", dir) > 0);
	assert_true(asprintf(&b, "%s/ref.safetensors", dir) > 0);
	assert_int_equal(st_ckpt_write_safetensors(b, t, 8, meta, 2, fill_pattern, NULL, NULL,
						   NULL), 0);
	x = read_all(a, &nx);
	y = read_all(b, &ny);
	assert_int_equal(nx, ny);
	assert_memory_equal(x, y, nx);
	assert_int_equal(nx, l.files[0].bytes);
	assert_int_equal(tr.files[0].bytes, nx);
	free(x);
	free(y);
	free(a);
	free(b);
	st_ckpt_layout_fini(&l);
	st_ckpt_trainer_fini(&tr);
	free(dir);
}

/* The index as Python's json.dumps(index, indent=2, sort_keys=True) + "\n"
 * writes it, escapes included (spelled out here by hand). */
static const char want_index[] =
	"{\n"
	"  \"metadata\": {\n"
	"    \"total_size\": %llu\n"
	"  },\n"
	"  \"weight_map\": {\n"
	"    \"\\\"odd\\\\name\\u00e9\\ud83d\\ude00\": \"model-%05d-of-%05d.safetensors\",\n"
	"    \"h.0.attn.c_attn.weight\": \"model-%05d-of-%05d.safetensors\",\n";

/* Shards: written whole, and by parts into created files, the same bytes;
 * read back as a set. */
static void test_shards_whole_and_by_parts(void **state)
{
	struct st_sf_meta meta[] = { { "format", "pt" } };
	struct st_ckpt_tensor t[8];
	struct st_ckpt_layout l;
	struct st_ckpt_trainer tr = { 0 };
	struct st_ckpt_set *s;
	char *whole = fresh_dir("whole"), *parts = fresh_dir("parts"), *text, want[1024];
	size_t len;
	uint64_t total = 0;

	ST_UNUSED(state);
	tensors8(t);
	/* 64 KiB: wte (76800 bytes) alone, then the rest in order */
	assert_int_equal(st_ckpt_layout_init(&l, "model", t, 8, meta, 1, 64 * 1024), 0);
	assert_true(l.n_files >= 3);
	for (size_t f = 0; f < l.n_files; f++)
		assert_true(l.files[f].data_bytes <= 64 * 1024 || l.files[f].n_tensors == 1);
	for (size_t i = 0; i < 8; i++)
		total += l.size_bytes[i];
	assert_int_equal(total, l.total_bytes);
	assert_int_equal(st_ckpt_layout_write(whole, &l, t, fill_pattern, NULL, &tr), 0);
	assert_int_equal(tr.n_files, l.n_files + 1);
	assert_string_equal(tr.files[l.n_files].name, "model.safetensors.index.json");

	assert_int_equal(st_ckpt_layout_index_json(&l, t, &text, &len), 0);
	snprintf(want, sizeof(want), want_index, (unsigned long long)l.total_bytes,
		 (int)l.file_of[7] + 1, (int)l.n_files, (int)l.file_of[2] + 1, (int)l.n_files);
	assert_true(len > strlen(want));
	assert_memory_equal(text, want, strlen(want));
	assert_string_equal(text + len - 6, "\n  }\n}\n" + 1);
	free(text);

	/* by parts: create each file, pwrite each tensor in two halves, in
	 * reverse order, as ranks would */
	for (size_t f = 0; f < l.n_files; f++)
		assert_int_equal(st_ckpt_layout_create(parts, &l, f), 0);
	for (size_t i = 8; i-- > 0;) {
		char *p;
		int fd;
		uint64_t n = l.size_bytes[i], h = n / 2;
		uint8_t *buf = malloc(n);

		for (uint64_t k = 0; k < n; k++)
			buf[k] = pattern(i, k);
		assert_true(asprintf(&p, "%s/%s", parts, l.files[l.file_of[i]].name) > 0);
		fd = open(p, O_WRONLY);
		assert_true(fd >= 0);
		assert_int_equal(pwrite(fd, buf + h, n - h, (off_t)(l.offset[i] + h)), (ssize_t)(n - h));
		assert_int_equal(pwrite(fd, buf, h, (off_t)l.offset[i]), (ssize_t)h);
		close(fd);
		free(buf);
		free(p);
	}
	for (size_t f = 0; f < l.n_files; f++) {
		char *a, *b;
		uint8_t *x, *y;
		size_t nx, ny;

		assert_true(asprintf(&a, "%s/%s", whole, l.files[f].name) > 0);
		assert_true(asprintf(&b, "%s/%s", parts, l.files[f].name) > 0);
		x = read_all(a, &nx);
		y = read_all(b, &ny);
		assert_int_equal(nx, ny);
		assert_int_equal(nx, l.files[f].bytes);
		assert_memory_equal(x, y, nx);
		free(x);
		free(y);
		free(a);
		free(b);
	}
	/* a creation over an existing file is refused, and leaves it */
	assert_int_equal(st_ckpt_layout_create(parts, &l, 0), -EEXIST);

	/* read back through the index */
	assert_int_equal(st_ckpt_set_kind(whole, "model"), 2);
	assert_int_equal(st_ckpt_set_open(&s, whole, "model"), 0);
	assert_int_equal(st_ckpt_set_files(s), l.n_files);
	assert_int_equal(st_ckpt_set_count(s), 8);
	assert_int_equal(st_ckpt_set_data_bytes(s), l.total_bytes);
	assert_string_equal(st_ckpt_set_index_name(s), "model.safetensors.index.json");
	for (size_t i = 0; i < 8; i++) {
		const struct st_sf_info *info;
		const struct st_ckpt_reader *r;
		uint8_t *buf = malloc(l.size_bytes[i]);

		assert_int_equal(st_ckpt_set_find(s, names8[i], ST_SF_F32, t[i].ndim, t[i].shape,
						  &info, &r), 0);
		assert_int_equal(st_ckpt_reader_pread(r, info, 0, buf, l.size_bytes[i]), 0);
		for (uint64_t k = 0; k < l.size_bytes[i]; k++)
			assert_int_equal(buf[k], pattern(i, k));
		free(buf);
	}
	assert_null(st_ckpt_set_lookup(s, "nope", NULL));
	{
		const struct st_sf_info *info;

		assert_int_equal(st_ckpt_set_find(s, "nope", ST_SF_F32, 1, t[0].shape, &info, NULL),
				 -ENOENT);
	}
	st_ckpt_set_close(s);
	assert_int_equal(st_ckpt_verify(whole, &tr), 0);
	st_ckpt_layout_fini(&l);
	st_ckpt_trainer_fini(&tr);
	free(whole);
	free(parts);
}

/* A two-shard set to damage: a.safetensors {x, y}, b.safetensors {z}. */
static char *two_shards(const char *name)
{
	struct st_ckpt_tensor t[3] = {
		{ .name = "x", .dtype = ST_SF_F32, .ndim = 1, .shape = { 4 } },
		{ .name = "y", .dtype = ST_SF_F32, .ndim = 1, .shape = { 4 } },
		{ .name = "z", .dtype = ST_SF_F32, .ndim = 1, .shape = { 8 } },
	};
	struct st_ckpt_layout l;
	char *dir = fresh_dir(name);

	assert_int_equal(st_ckpt_layout_init(&l, "model", t, 3, NULL, 0, 32), 0);
	assert_int_equal(l.n_files, 2);
	assert_int_equal(st_ckpt_layout_write(dir, &l, t, fill_pattern, NULL, NULL), 0);
	st_ckpt_layout_fini(&l);
	return dir;
}

static void refused(const char *dir, const char *index, const char *why)
{
	struct st_ckpt_set *s = NULL;

	if (index)
		write_text(dir, "model.safetensors.index.json", index);
	assert_int_equal(st_ckpt_set_open(&s, dir, "model"), -EINVAL);
	assert_null(s);
	if (!strstr(st_error_last(), why))
		fail_msg("\"%s\" does not say \"%s\"", st_error_last(), why);
	assert_null(strchr(st_error_last(), '\n'));
}

#define S1 "\"model-00001-of-00002.safetensors\""
#define S2 "\"model-00002-of-00002.safetensors\""

static void test_index_refusals(void **state)
{
	char *dir = two_shards("bad");
	struct st_ckpt_set *s;

	ST_UNUSED(state);
	assert_int_equal(st_ckpt_set_open(&s, dir, "model"), 0);
	st_ckpt_set_close(s);
	refused(dir, "{\"weight_map\": {\"x\": " S1 ", \"y\": " S1 ", \"z\": "
		"\"model-00003-of-00002.safetensors\"}}",
		"weight_map[\"z\"] names model-00003-of-00002.safetensors, which is missing");
	refused(dir, "{\"weight_map\": {\"x\": " S1 ", \"y\": " S2 ", \"z\": " S2 "}}",
		"weight_map[\"y\"] names model-00002-of-00002.safetensors, but the tensor is in "
		"model-00001-of-00002.safetensors");
	{ /* y in the second shard too */
		struct st_ckpt_tensor yz[2] = {
			{ .name = "y", .dtype = ST_SF_F32, .ndim = 1, .shape = { 4 } },
			{ .name = "z", .dtype = ST_SF_F32, .ndim = 1, .shape = { 8 } },
		};
		char *p2;

		assert_true(asprintf(&p2, "%s/model-00002-of-00002.safetensors", dir) > 0);
		assert_int_equal(st_ckpt_write_safetensors(p2, yz, 2, NULL, 0, fill_pattern, NULL,
							   NULL, NULL), 0);
		refused(dir, "{\"weight_map\": {\"x\": " S1 ", \"y\": " S2 ", \"z\": " S2 "}}",
			"tensor \"y\" is in two shards, model-00001-of-00002.safetensors and "
			"model-00002-of-00002.safetensors");
		refused(dir, "{\"weight_map\": {\"x\": " S1 ", \"y\": " S1 ", \"z\": " S2 "}}",
			"tensor \"y\" is in two shards, model-00002-of-00002.safetensors and "
			"model-00001-of-00002.safetensors");
		assert_int_equal(st_ckpt_write_safetensors(p2, yz + 1, 1, NULL, 0, fill_pattern,
							   NULL, NULL, NULL), 0);
		free(p2);
	}
	refused(dir, "{\"weight_map\": {\"x\": " S1 ", \"z\": " S2 "}}",
		"tensor \"y\" of model-00001-of-00002.safetensors is not in its weight_map");
	refused(dir, "{\"weight_map\": {\"x\": " S1 ", \"y\": " S1 ", \"z\": " S2 ", \"w\": " S2
		"}}", "weight_map[\"w\"] names model-00002-of-00002.safetensors, which has no "
		"tensor \"w\"");
	refused(dir, "{\"weight_map\": {\"x\": \"../model-00001-of-00002.safetensors\"}}",
		"weight_map[\"x\"] is not the name of a file");
	refused(dir, "{\"weight_map\": {\"x\": 3}}", "weight_map[\"x\"] is not the name");
	refused(dir, "{\"weight_map\": []}", "\"weight_map\" is not an object");
	refused(dir, "{\"weight_map\": {}}", "is empty");
	refused(dir, "{\"metadata\": {}}", "no \"weight_map\"");
	refused(dir, "{\"metadata\": 1, \"weight_map\": {\"x\": " S1 "}}",
		"\"metadata\" is not an object");
	refused(dir, "{\"weight_map\": {\"x\": " S1 "}", "not valid JSON");
	refused(dir, "{\"weight_map\": {\"x\": " S1 "}} x", "not valid JSON");
	refused(dir, "[1]", "not a JSON object");
	/* a shard that is not safetensors: its reader's refusal */
	write_text(dir, "model.safetensors.index.json",
		   "{\"weight_map\": {\"x\": " S1 ", \"y\": " S1 ", \"z\": " S2 "}}");
	write_text(dir, "model-00002-of-00002.safetensors", "garbage");
	refused(dir, NULL, "model-00002-of-00002.safetensors");
	/* both forms: which one is meant is not clear */
	write_text(dir, "model.safetensors", "x");
	assert_int_equal(st_ckpt_set_kind(dir, "model"), -EINVAL);
	refused(dir, NULL, "holds both model.safetensors and model.safetensors.index.json");
	free(dir);
	dir = fresh_dir("none");
	assert_int_equal(st_ckpt_set_kind(dir, "model"), 0);
	assert_int_equal(st_ckpt_set_open(&s, dir, "model"), -ENOENT);
	free(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_split_as_hub),
		cmocka_unit_test(test_one_file_is_the_writer),
		cmocka_unit_test(test_shards_whole_and_by_parts),
		cmocka_unit_test(test_index_refusals),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}

/* Malformed safetensors files: each is refused with -EINVAL and one error
 * line that names the file and the problem. The cases are generated here;
 * `test_malformed --write-corpus DIR` also writes them (and a few valid
 * files) as seeds for tests/fuzz. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "strata/safetensors.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct st_case {
	const char *name;
	uint8_t *bytes;
	size_t len;
	const char *expect; /* substring of the error */
};

#define MAX_CASES 64
static struct st_case cases[MAX_CASES];
static size_t n_cases;

/* length prefix (given) + header + data bytes (0x5a) */
static void add_raw(const char *name, uint64_t hdr_len, const char *hdr,
		    size_t hdr_bytes, size_t data_bytes, const char *expect)
{
	struct st_case *c = &cases[n_cases++];
	size_t len = 8 + hdr_bytes + data_bytes;

	assert_true(n_cases <= MAX_CASES);
	c->name = name;
	c->expect = expect;
	c->len = len;
	c->bytes = malloc(len + 1);
	assert_non_null(c->bytes);
	for (int i = 0; i < 8; i++)
		c->bytes[i] = (uint8_t)(hdr_len >> (8 * i));
	memcpy(c->bytes + 8, hdr, hdr_bytes);
	memset(c->bytes + 8 + hdr_bytes, 0x5a, data_bytes);
}

/* A well-formed prefix around hdr (its true length). */
static void add(const char *name, const char *hdr, size_t data_bytes,
		const char *expect)
{
	add_raw(name, strlen(hdr), hdr, strlen(hdr), data_bytes, expect);
}

static void add_bytes(const char *name, const void *p, size_t len,
		      const char *expect)
{
	struct st_case *c = &cases[n_cases++];

	assert_true(n_cases <= MAX_CASES);
	c->name = name;
	c->expect = expect;
	c->len = len;
	c->bytes = malloc(len + 1);
	assert_non_null(c->bytes);
	memcpy(c->bytes, p, len);
}

#define T1(dt, shape, offs) \
	"{\"t\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" offs "}}"

static void build_cases(void)
{
	static const char deep[] = "{\"t\":[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]}";

	n_cases = 0;
	add_bytes("empty", "", 0, "too short for the 8-byte header length");
	add_bytes("short4", "\x10\0\0\0", 4, "too short");
	add_raw("hdrlen_zero", 0, "{}", 2, 0, "header length is 0");
	add_raw("hdrlen_huge", 1ull << 63, "{}", 2, 0, "larger than the");
	add_raw("hdrlen_over_limit", 200000000ull, "{}", 2, 0,
		"larger than the 100000000-byte limit");
	add_raw("hdrlen_past_eof", 1000, "{}  ", 4, 0,
		"header length 1000 runs past the end of the file");
	add("not_json", "hello world", 0, "header is not valid JSON");
	add("json_truncated", "{\"t\":{\"dtype\":", 0,
	    "header is not valid JSON");
	add("json_array", "[1,2]", 0, "header is not a JSON object (it is array)");
	add("json_string", "\"abc\"", 0, "not a JSON object (it is string)");
	add("leading_space", " {}", 0, "does not begin with '{'");
	add("trailing_garbage", "{} x", 0, "bytes after the JSON object");
	add_raw("nul_padding", 4, "{}\0\0", 4, 0, "bytes after the JSON object");
	add("bad_utf8", "{\"t\xff\xfe\":1}", 0, "header is not valid JSON");
	add("too_deep", deep, 0, "header is not valid JSON");
	add("entry_not_object", "{\"t\":5}", 0,
	    "tensor 't': entry is not an object");
	add("missing_dtype", "{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
	    "tensor 't': missing \"dtype\"");
	add("missing_shape", "{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}",
	    4, "tensor 't': missing \"shape\"");
	add("missing_offsets", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4,
	    "tensor 't': missing \"data_offsets\"");
	add("unknown_field", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],"
	    "\"data_offsets\":[0,4],\"x\":1}}", 4, "unknown field \"x\"");
	add("control_char_in_key", "{\"t\\n\":{\"dtype\":\"F32\",\"shape\":[1],"
	    "\"data_offsets\":[0,4],\"d\\u0001ype\":1}}", 4,
	    "tensor 't\\x0a': unknown field \"d\\x01ype\"");
	add("unknown_dtype", T1("F33", "[1]", "[0,4]"), 4,
	    "unknown dtype \"F33\"");
	add("dtype_not_string",
	    "{\"t\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
	    "dtype is not a string");
	add("shape_not_array", T1("F32", "4", "[0,16]"), 16,
	    "shape is not an array");
	add("shape_string", T1("F32", "[\"4\"]", "[0,16]"), 16,
	    "shape[0] is not an integer (it is string)");
	add("shape_float", T1("F32", "[2.5]", "[0,10]"), 10,
	    "shape[0] is not an integer (it is double)");
	add("shape_negative", T1("F32", "[2,-2]", "[0,16]"), 16,
	    "shape[1] is negative (-2)");
	add("offset_negative", T1("F32", "[1]", "[-4,0]"), 4,
	    "data_offsets[0] is negative");
	add("shape_huge_number", T1("F32", "[99999999999999999999]", "[0,4]"),
	    4, "shape[0] is too large");
	add("offset_huge_number", T1("U8", "[1]", "[0,184467440737095516160]"),
	    1, "data_offsets[1] is too large");
	add("shape_overflow", T1("F32", "[4294967296,4294967296]", "[0,0]"), 0,
	    "overflows 64 bits");
	add("shape_overflow_dtype", T1("F64", "[4611686018427387904]", "[0,0]"),
	    0, "overflows 64 bits");
	add("too_many_dims", T1("U8", "[1,1,1,1,1,1,1,1,1]", "[0,1]"), 1,
	    "shape has 9 dimensions");
	add("offsets_one", T1("F32", "[1]", "[0]"), 4,
	    "data_offsets is not an array of two integers");
	add("offsets_reversed", T1("F32", "[0]", "[8,0]"), 8,
	    "data_offsets [8, 0) end before they begin");
	add("size_mismatch", "{\"h.0.attn.c_attn.weight\":{\"dtype\":\"F32\","
	    "\"shape\":[4,8],\"data_offsets\":[0,100]}}", 100,
	    "tensor 'h.0.attn.c_attn.weight': data_offsets [0, 100) do not "
	    "match shape [4,8] x F32 = 128 bytes");
	add("range_past_data", T1("F32", "[8]", "[0,32]"), 16,
	    "data_offsets [0, 32) run past the end of the data (16 bytes");
	add("overlap", "{\"a\":{\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":"
	    "[0,16]},\"b\":{\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":"
	    "[8,24]}}", 24, "tensors 'a' [0, 16) and 'b' [8, 24) overlap");
	add("hole", "{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":"
	    "[0,8]},\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":"
	    "[16,24]}}", 24, "data bytes [8, 16) belong to no tensor");
	add("trailing_data", T1("U8", "[8]", "[0,8]"), 16,
	    "data bytes [8, 16) at the end of the file belong to no tensor");
	add("duplicate_name", "{\"a\":{\"dtype\":\"U8\",\"shape\":[8],"
	    "\"data_offsets\":[0,8]},\"a\":{\"dtype\":\"U8\",\"shape\":[8],"
	    "\"data_offsets\":[8,16]}}", 16, "duplicate tensor name?");
	add("metadata_not_object", "{\"__metadata__\":[1]}", 0,
	    "__metadata__ is not an object");
	add("metadata_not_string", "{\"__metadata__\":{\"step\":5}}", 0,
	    "__metadata__ \"step\" is not a string");
	/* A valid file cut in the middle of its data. */
	add("truncated_data", T1("F32", "[2,2]", "[0,16]"), 10,
	    "run past the end of the data (10 bytes; truncated file?)");
}

static void free_cases(void)
{
	for (size_t i = 0; i < n_cases; i++)
		free(cases[i].bytes);
	n_cases = 0;
}

static void check_error(const struct st_case *c, int err, const char *label)
{
	const char *msg = st_error_last();

	if (err != -EINVAL || !strstr(msg, c->expect) ||
	    strncmp(msg, label, strlen(label)) != 0 || strchr(msg, '\n'))
		fail_msg("case %s: got %d \"%s\", expected -EINVAL with \"%s: "
			 "...%s...\"", c->name, err, msg, label, c->expect);
}

/* Every case from memory: refused, with its own message. */
static void test_malformed_mem(void **state)
{
	(void)state;
	build_cases();
	for (size_t i = 0; i < n_cases; i++) {
		struct st_safetensors *sf = (void *)1;
		int err;

		st_error_clear();
		err = st_safetensors_open_mem(&sf, cases[i].bytes, cases[i].len,
					      cases[i].name);
		assert_null(sf);
		check_error(&cases[i], err, cases[i].name);
	}
	free_cases();
}

/* The same through a real file: the message starts with the path. */
static void test_malformed_file(void **state)
{
	char dir[] = "/tmp/st_malformed_XXXXXX";
	char path[512];

	(void)state;
	assert_non_null(mkdtemp(dir));
	build_cases();
	for (size_t i = 0; i < n_cases; i++) {
		struct st_safetensors *sf = (void *)1;
		FILE *f;
		int err;

		snprintf(path, sizeof(path), "%s/%s.safetensors", dir,
			 cases[i].name);
		f = fopen(path, "wb");
		assert_non_null(f);
		assert_int_equal(fwrite(cases[i].bytes, 1, cases[i].len, f),
				 cases[i].len);
		fclose(f);
		err = st_safetensors_open(&sf, path);
		assert_null(sf);
		check_error(&cases[i], err, path);
		unlink(path);
	}
	free_cases();
	rmdir(dir);
}

/* A file that is fine apart from one field proves the cases above fail for
 * the reason they say, not for a broken prefix. */
static void test_control_valid(void **state)
{
	static const char hdr[] = T1("F32", "[2,2]", "[0,16]") "      ";
	struct st_safetensors *sf = NULL;

	(void)state;
	build_cases();
	free_cases();
	add("valid", hdr, 16, "");
	assert_int_equal(st_safetensors_open_mem(&sf, cases[0].bytes,
						 cases[0].len, "valid"), 0);
	assert_int_equal(st_safetensors_count(sf), 1);
	st_safetensors_close(sf);
	free_cases();
}

static int write_corpus(const char *dir)
{
	static const char *valid[] = {
		T1("F32", "[2,2]", "[0,16]"),
		"{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"BF16\","
		"\"shape\":[3],\"data_offsets\":[0,6]},\"b\":{\"dtype\":\"I64\","
		"\"shape\":[],\"data_offsets\":[6,14]}}  ",
		"{}      ",
	};
	static const size_t valid_data[] = { 16, 14, 0 };
	char path[1024];

	build_cases();
	free_cases();
	for (size_t i = 0; i < ST_ARRAY_LEN(valid); i++)
		add("valid", valid[i], valid_data[i], "");
	for (size_t i = 0; i < n_cases; i++) {
		snprintf(path, sizeof(path), "%s/valid_%zu.safetensors", dir, i);
		FILE *f = fopen(path, "wb");

		if (!f || fwrite(cases[i].bytes, 1, cases[i].len, f) != cases[i].len)
			return 1;
		fclose(f);
	}
	free_cases();
	build_cases();
	for (size_t i = 0; i < n_cases; i++) {
		snprintf(path, sizeof(path), "%s/%s.safetensors", dir,
			 cases[i].name);
		FILE *f = fopen(path, "wb");

		if (!f || fwrite(cases[i].bytes, 1, cases[i].len, f) != cases[i].len)
			return 1;
		fclose(f);
	}
	free_cases();
	return 0;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_malformed_mem),
		cmocka_unit_test(test_malformed_file),
		cmocka_unit_test(test_control_valid),
	};

	if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0)
		return write_corpus(argv[2]);
	return cmocka_run_group_tests(tests, NULL, NULL);
}

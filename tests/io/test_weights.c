/* strata/weights.h: a tiny GPT-2 (2 layers, dim 4, 2 heads, vocab 130, ctx 3)
 * with a distinct value in every element, written here as a Hugging Face
 * directory (F32, then BF16 with "transformer." names), a bare
 * model.safetensors, and an llm.c model file laid out by this test's own
 * loops (header, kinds across layers, (out, in) matrices, padding rows);
 * every tensor read back must be the original, in Hugging Face's layout.
 * Refusals: a missing tensor, a wrong shape, a non-float type, an untied
 * head, an llm.c file of another version or size. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "strata/optim.h" /* st_bf16_from_f32, st_f32_from_bf16 */
#include "strata/weights.h"

#define L 2
#define C 4
#define NH 2
#define V 130
#define T 3
#define VP 256 /* V rounded up to llm.c's multiple: 126 zero rows */

/* The model's tensors in Hugging Face's names and layout. */
struct tensor {
	char name[48];
	int ndim;
	uint64_t shape[2];
	float *data;
};
static struct tensor tensors[32];
static int n_tensors;
static char dir[64];

static void add(const char *name, int ndim, uint64_t r, uint64_t c)
{
	struct tensor *t = &tensors[n_tensors];
	uint64_t n = r * (ndim == 2 ? c : 1);

	snprintf(t->name, sizeof(t->name), "%s", name);
	t->ndim = ndim;
	t->shape[0] = r;
	t->shape[1] = ndim == 2 ? c : 1;
	t->data = malloc(n * sizeof(float));
	assert_non_null(t->data);
	for (uint64_t k = 0; k < n; k++) /* distinct in a tensor, exact in bf16 (8 bits) */
		t->data[k] = (float)((k % 2 ? -1 : 1) * (int)(k % 256 + 1)) *
			     (float)(1 << (n_tensors % 8)) / 64.0f;
	n_tensors++;
}

static struct tensor *find(const char *name)
{
	for (int i = 0; i < n_tensors; i++)
		if (strcmp(tensors[i].name, name) == 0)
			return &tensors[i];
	return NULL;
}

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof(dir), "/tmp/strata-weights-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	add("wte.weight", 2, V, C);
	add("wpe.weight", 2, T, C);
	for (int l = 0; l < L; l++) {
		char n[48];
#define ADD(suffix, ndim, r, c)                                          \
	do {                                                             \
		snprintf(n, sizeof(n), "h.%d.%s", l, suffix);            \
		add(n, ndim, r, c);                                      \
	} while (0)
		ADD("ln_1.weight", 1, C, 1);
		ADD("ln_1.bias", 1, C, 1);
		ADD("attn.c_attn.weight", 2, C, 3 * C);
		ADD("attn.c_attn.bias", 1, 3 * C, 1);
		ADD("attn.c_proj.weight", 2, C, C);
		ADD("attn.c_proj.bias", 1, C, 1);
		ADD("ln_2.weight", 1, C, 1);
		ADD("ln_2.bias", 1, C, 1);
		ADD("mlp.c_fc.weight", 2, C, 4 * C);
		ADD("mlp.c_fc.bias", 1, 4 * C, 1);
		ADD("mlp.c_proj.weight", 2, 4 * C, C);
		ADD("mlp.c_proj.bias", 1, C, 1);
#undef ADD
	}
	add("ln_f.weight", 1, C, 1);
	add("ln_f.bias", 1, C, 1);
	return 0;
}

static int teardown(void **state)
{
	char cmd[128];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	for (int i = 0; i < n_tensors; i++)
		free(tensors[i].data);
	return system(cmd) == 0 ? 0 : -1;
}

static void path_in(char *p, size_t n, const char *sub, const char *name)
{
	snprintf(p, n, "%s/%s%s%s", dir, sub, *name ? "/" : "", name);
}

/* sub/model.safetensors (F32 or BF16, names with prefix) and, when cfg,
 * sub/config.json (plus extra fields). */
static void write_hf(const char *sub, bool bf16, const char *prefix, const char *extra)
{
	struct st_sf_tensor st[32];
	char names[32][96], p[256];
	uint16_t *h[32] = { 0 };
	struct st_model_config gc = { .dim = C, .n_layer = L, .n_head = NH, .vocab = V,
				      .ctx = T };

	path_in(p, sizeof(p), sub, "");
	mkdir(p, 0755);
	for (int i = 0; i < n_tensors; i++) {
		uint64_t n = tensors[i].shape[0] * tensors[i].shape[1];

		snprintf(names[i], sizeof(names[i]), "%.16s%.47s", prefix, tensors[i].name);
		st[i] = (struct st_sf_tensor){ .name = names[i], .dtype = bf16 ? ST_SF_BF16 : ST_SF_F32,
					       .ndim = tensors[i].ndim,
					       .shape = { tensors[i].shape[0], tensors[i].shape[1] },
					       .data = tensors[i].data };
		if (bf16) {
			h[i] = malloc(n * sizeof(uint16_t));
			for (uint64_t k = 0; k < n; k++)
				h[i][k] = st_bf16_from_f32(tensors[i].data[k]);
			st[i].data = h[i];
		}
	}
	path_in(p, sizeof(p), sub, "model.safetensors");
	assert_int_equal(st_safetensors_write(p, st, (size_t)n_tensors, NULL, 0), 0);
	for (int i = 0; i < n_tensors; i++)
		free(h[i]);
	if (!extra)
		return;
	path_in(p, sizeof(p), sub, "config.json");
	assert_int_equal(st_model_config_write(p, &gc), 0);
	if (*extra) { /* rewrite it with a field more */
		FILE *f = fopen(p, "w");

		assert_non_null(f);
		fprintf(f, "{\"n_embd\": %d, \"n_layer\": %d, \"n_head\": %d, \"vocab_size\": %d, "
			   "\"n_positions\": %d, %s}\n", C, L, NH, V, T, extra);
		fclose(f);
	}
}

/* Every tensor through st_weights_read() equals the original. */
static void check_all(struct st_weights *w)
{
	for (int i = 0; i < n_tensors; i++) {
		uint64_t n = tensors[i].shape[0] * tensors[i].shape[1];
		float *got = malloc(n * sizeof(float));

		assert_non_null(got);
		for (uint64_t k = 0; k < n; k++)
			got[k] = -12345.0f;
		assert_int_equal(st_weights_read(w, tensors[i].name, tensors[i].ndim,
						 tensors[i].shape, got), 0);
		assert_memory_equal(got, tensors[i].data, n * sizeof(float));
		free(got);
	}
}

static void test_hf_dir(void **state)
{
	struct st_weights *w;
	struct st_model_config gc;
	char p[256];

	(void)state;
	write_hf("hf", false, "", "");
	write_hf("hf16", true, "transformer.", "");
	for (int k = 0; k < 2; k++) {
		path_in(p, sizeof(p), k ? "hf16" : "hf", "");
		assert_int_equal(st_weights_open(p, &w), 0);
		assert_int_equal(st_weights_config(w, &gc), 0);
		assert_int_equal(gc.n_layer, L);
		assert_int_equal(gc.vocab, V);
		check_all(w);
		st_weights_close(w);
	}
}

static void test_refusals(void **state)
{
	struct st_weights *w;
	struct st_model_config gc;
	uint64_t shape[2] = { C, 3 * C }, wrong[2] = { C, 2 * C };
	float buf[64];
	char p[256];

	(void)state;
	/* a bare file: tensors yes, config no */
	write_hf("bare", false, "", NULL);
	path_in(p, sizeof(p), "bare", "model.safetensors");
	assert_int_equal(st_weights_open(p, &w), 0);
	assert_int_equal(st_weights_config(w, &gc), -ENOENT);
	assert_int_equal(st_weights_check(w, "h.0.attn.c_attn.weight", 2, shape), 0);
	assert_int_equal(st_weights_read(w, "h.0.attn.c_attn.weight", 2, wrong, buf), -EINVAL);
	assert_non_null(strstr(st_error_last(), "wrong shape"));
	assert_int_equal(st_weights_check(w, "h.2.ln_1.weight", 1, shape), -EINVAL);
	assert_non_null(strstr(st_error_last(), "missing"));
	st_weights_close(w);
	/* another model by its config */
	write_hf("untied", false, "", "\"tie_word_embeddings\": false");
	path_in(p, sizeof(p), "untied", "");
	assert_int_equal(st_weights_open(p, &w), -EINVAL);
	assert_non_null(strstr(st_error_last(), "untied"));
	write_hf("relu", false, "", "\"activation_function\": \"relu\"");
	path_in(p, sizeof(p), "relu", "");
	assert_int_equal(st_weights_open(p, &w), -EINVAL);
	write_hf("null", false, "", "\"activation_function\": null");
	path_in(p, sizeof(p), "null", "");
	assert_int_equal(st_weights_open(p, &w), -EINVAL);
	write_hf("tanh", false, "", "\"activation_function\": \"gelu_pytorch_tanh\"");
	path_in(p, sizeof(p), "tanh", "");
	assert_int_equal(st_weights_open(p, &w), 0); /* the same function */
	st_weights_close(w);
	/* a file given by name next to a config.json of something else: the
	 * config is not this model's, so there is none */
	write_hf("other", false, "", "");
	path_in(p, sizeof(p), "other", "config.json");
	{
		FILE *f = fopen(p, "w");

		assert_non_null(f);
		fputs("{\"model_type\": \"bert\"}\n", f);
		fclose(f);
	}
	path_in(p, sizeof(p), "other", "model.safetensors");
	assert_int_equal(st_weights_open(p, &w), 0);
	assert_int_equal(st_weights_config(w, &gc), -ENOENT);
	st_weights_close(w);
	/* a directory with model.safetensors alone */
	path_in(p, sizeof(p), "bare", "");
	assert_int_equal(st_weights_open(p, &w), 0);
	assert_int_equal(st_weights_config(w, &gc), -ENOENT);
	check_all(w);
	st_weights_close(w);
	path_in(p, sizeof(p), "nothere", "");
	assert_int_equal(st_weights_open(p, &w), -ENOENT);
}

/* llm.c's file, laid out here: kinds in order, matrices (out, in), wte
 * padded to VP rows. */
static void write_llmc(const char *name, int version, long cut)
{
	static const char *order[] = { "wte.weight", "wpe.weight", "ln_1.weight", "ln_1.bias",
				       "attn.c_attn.weight", "attn.c_attn.bias",
				       "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",
				       "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
				       "mlp.c_proj.weight", "mlp.c_proj.bias", "ln_f.weight",
				       "ln_f.bias" };
	int32_t h[256] = { 20240326, version, T, V, L, NH, C, VP };
	char p[256], full[80];
	FILE *f;

	path_in(p, sizeof(p), "", name);
	f = fopen(p, "wb");
	assert_non_null(f);
	fwrite(h, sizeof(h), 1, f);
	for (int g = 0; g < 16; g++)
		for (int l = 0; l < (g >= 2 && g < 14 ? L : 1); l++) {
			bool matrix = g == 4 || g == 6 || g == 10 || g == 12; /* Conv1D (in, out) */
			struct tensor *t;
			uint64_t R, K;

			if (g >= 2 && g < 14)
				snprintf(full, sizeof(full), "h.%d.%s", l, order[g]);
			else
				snprintf(full, sizeof(full), "%s", order[g]);
			t = find(full);
			assert_non_null(t);
			R = t->shape[0];
			K = t->shape[1];
			for (uint64_t i = 0; i < (matrix ? K : g == 0 ? VP : R); i++)
				for (uint64_t j = 0; j < (matrix ? R : K); j++) {
					/* llm.c's row i of a matrix is Conv1D's column i;
					 * wte's rows from V on are zero */
					float x = matrix ? t->data[j * K + i]
					       : i < R ? t->data[i * K + j] : 0.0f;

					if (version == 3) {
						fwrite(&x, sizeof(x), 1, f);
					} else {
						uint16_t b = st_bf16_from_f32(x);

						fwrite(&b, sizeof(b), 1, f);
					}
				}
		}
	fclose(f);
	if (cut)
		assert_int_equal(truncate(p, cut), 0);
}

static void test_llmc(void **state)
{
	struct st_weights *w;
	struct st_model_config gc;
	char p[256];

	(void)state;
	for (int k = 0; k < 2; k++) {
		write_llmc(k ? "m5.bin" : "m3.bin", k ? 5 : 3, 0);
		path_in(p, sizeof(p), "", k ? "m5.bin" : "m3.bin");
		assert_int_equal(st_weights_open(p, &w), 0);
		assert_int_equal(st_weights_config(w, &gc), 0);
		assert_int_equal(gc.dim, C);
		assert_int_equal(gc.n_head, NH);
		assert_int_equal(gc.ctx, T);
		check_all(w); /* the values are exact in bf16 */
		st_weights_close(w);
	}
	write_llmc("m4.bin", 4, 0);
	path_in(p, sizeof(p), "", "m4.bin");
	assert_int_equal(st_weights_open(p, &w), -EINVAL);
	assert_non_null(strstr(st_error_last(), "version 4"));
	write_llmc("cut.bin", 3, 2000);
	path_in(p, sizeof(p), "", "cut.bin");
	assert_int_equal(st_weights_open(p, &w), -EINVAL);
	write_llmc("short.bin", 3, 100);
	path_in(p, sizeof(p), "", "short.bin");
	assert_int_equal(st_weights_open(p, &w), -EINVAL);
}

/* A safetensors file whose header is exactly llm.c's magic long starts
 * with the same four bytes: it is read as safetensors. */
static void test_magic_lookalike(void **state)
{
	const char *json = "{\"ln_f.bias\":{\"dtype\":\"F32\",\"shape\":[4],"
			   "\"data_offsets\":[0,16]}}";
	uint64_t len = ST_LLMC_MODEL_MAGIC, shape[1] = { 4 };
	float data[4] = { 1, -2, 3, -4 }, got[4];
	struct st_weights *w;
	char p[256];
	FILE *f;

	(void)state;
	path_in(p, sizeof(p), "", "lookalike.safetensors");
	f = fopen(p, "wb");
	assert_non_null(f);
	fwrite(&len, sizeof(len), 1, f);
	fputs(json, f);
	for (uint64_t i = strlen(json); i < len; i++)
		fputc(' ', f);
	fwrite(data, sizeof(data), 1, f);
	fclose(f);
	assert_int_equal(st_weights_open(p, &w), 0);
	assert_int_equal(st_weights_read(w, "ln_f.bias", 1, shape, got), 0);
	assert_memory_equal(got, data, sizeof(data));
	st_weights_close(w);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hf_dir),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_llmc),
		cmocka_unit_test(test_magic_lookalike),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}

/* The family seam: the registry (find, unknown names, an incomplete table
 * refused, registration), --model's spellings and their refusals, a
 * config.json read and written through the family, the layouts' tie as
 * data (reads_unit, resident), st_model_act_bytes(), st_model_logits(). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "strata/family.h"
#include "strata/kernels.h"
#include "strata/model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the registry ----------------------------------------------------------- */

static void test_registry(void **state)
{
	(void)state;
	const struct st_family_ops *g = st_family_find("gpt2");
	assert_non_null(g);
	assert_string_equal(g->name, "gpt2");
	assert_ptr_equal(st_family_default(), g);
	assert_int_equal(st_family_check(g), 0);
	assert_string_equal(st_family_list(), "gpt2,llama");
	assert_non_null(strstr(st_model_preset_list(),
			       "tiny,gpt2,gpt2-medium,gpt2-large,gpt2-xl,smollm2-135m,"));
	assert_non_null(st_family_find("llama"));
	assert_ptr_equal(st_family_find_hf("qwen2", NULL), st_family_find("llama"));
	assert_ptr_equal(st_family_find_hf(NULL, "LlamaForCausalLM"), st_family_find("llama"));

	st_error_clear();
	assert_null(st_family_find("mamba"));
	assert_non_null(strstr(st_error_last(), "unknown family 'mamba'"));
	assert_null(st_family_find(NULL));

	/* config.json's names */
	assert_ptr_equal(st_family_find_hf("gpt2", NULL), g);
	assert_ptr_equal(st_family_find_hf(NULL, "GPT2LMHeadModel"), g);
	assert_ptr_equal(st_family_find_hf(NULL, NULL), g);
	assert_null(st_family_find_hf("bert", NULL));
	assert_non_null(strstr(st_error_last(), "model_type \"bert\""));
	assert_null(st_family_find_hf(NULL, "BertModel"));
}

/* A table with every hook GPT-2's has, then one taken out at a time. */
static void test_incomplete_table(void **state)
{
	(void)state;
	const struct st_family_ops *g = st_family_find("gpt2");
	struct st_family_ops t = *g;

	t.name = "copy";
	assert_int_equal(st_family_check(&t), 0);
	/* each required hook */
	static const size_t req[] = {
		offsetof(struct st_family_ops, config_parse),
		offsetof(struct st_family_ops, config_check),
		offsetof(struct st_family_ops, config_format),
		offsetof(struct st_family_ops, config_describe),
		offsetof(struct st_family_ops, config_fields),
		offsetof(struct st_family_ops, hf_config_read),
		offsetof(struct st_family_ops, hf_config_write),
		offsetof(struct st_family_ops, layout),
		offsetof(struct st_family_ops, init_unit),
		offsetof(struct st_family_ops, work_bytes),
		offsetof(struct st_family_ops, act_bytes),
		offsetof(struct st_family_ops, fwd),
		offsetof(struct st_family_ops, bwd),
		offsetof(struct st_family_ops, flops_per_token),
	};
	for (size_t i = 0; i < ST_ARRAY_LEN(req); i++) {
		struct st_family_ops b = t;
		void (*none)(void) = NULL;

		memcpy((char *)&b + req[i], &none, sizeof(none));
		st_error_clear();
		assert_int_equal(st_family_check(&b), -EINVAL);
		assert_non_null(strstr(st_error_last(), "required hook"));
		assert_int_equal(st_family_register(&b), -EINVAL);
	}
	/* the optional ones may be absent */
	struct st_family_ops o = t;
	o.presets = NULL;
	o.hf_architectures = NULL;
	o.config_preset = NULL;
	o.hf_config_check = NULL;
	o.batch_check = NULL;
	o.logits = NULL;
	assert_int_equal(st_family_check(&o), 0);
	/* no name, another ABI, no model_type, no title */
	struct st_family_ops b = t;
	b.name = NULL;
	assert_int_equal(st_family_check(&b), -EINVAL);
	assert_int_equal(st_family_check(NULL), -EINVAL);
	b = t;
	b.abi = ST_FAMILY_ABI + 1;
	assert_int_equal(st_family_check(&b), -EINVAL);
	assert_non_null(strstr(st_error_last(), "ABI"));
	b = t;
	b.hf_model_types = NULL;
	assert_int_equal(st_family_check(&b), -EINVAL);
	b = t;
	b.title = NULL;
	assert_int_equal(st_family_check(&b), -EINVAL);
	/* a name --model cannot reach */
	b = t;
	b.name = "a:b";
	assert_int_equal(st_family_check(&b), -EINVAL);
	b.name = "a,b";
	assert_int_equal(st_family_check(&b), -EINVAL);
	b.name = "0123456789012345678901234567890123456789012345678"; /* 49 */
	assert_int_equal(st_family_check(&b), -EINVAL);
	/* a name taken */
	assert_int_equal(st_family_register(g), -EEXIST);
	/* a model_type or a preset another family has: it would be shadowed */
	{
		static const char *const gpt2_type[] = { "other", "gpt2", NULL };
		static struct st_family_ops c;

		c = *g;
		c.name = "shadowed";
		c.hf_model_types = gpt2_type;
		c.presets = NULL;
		assert_int_equal(st_family_register(&c), -EEXIST);
		assert_non_null(strstr(st_error_last(), "'gpt2'"));
		c.hf_model_types = (const char *const[]){ "other", NULL };
		c.presets = "tiny,mine";
		assert_int_equal(st_family_register(&c), -EEXIST);
		assert_non_null(strstr(st_error_last(), "'tiny'"));
	}
}

/* A family registered after the built-in ones is found and parses with
 * its prefix; its models are its own (not GPT-2's by config_equal). */
static const struct st_family_ops *g_copy;

static void test_register(void **state)
{
	(void)state;
	static struct st_family_ops copy;
	static const char *const types[] = { "gpt2-copy", NULL };

	copy = *st_family_find("gpt2");
	copy.name = "copy";
	copy.presets = NULL;
	copy.config_preset = NULL;
	copy.hf_model_types = types;
	copy.hf_architectures = NULL;
	assert_int_equal(st_family_register(&copy), 0);
	g_copy = &copy;
	assert_ptr_equal(st_family_find("copy"), &copy);
	assert_string_equal(st_family_list(), "gpt2,llama,copy");
	assert_ptr_equal(st_family_find_hf("gpt2-copy", NULL), &copy);
	struct st_model_config a, b;
	assert_int_equal(st_model_config_parse("copy:layers=2,dim=32,heads=4,vocab=37,ctx=80", &a), 0);
	assert_ptr_equal(a.family, &copy);
	assert_int_equal(st_model_config_parse("layers=2,dim=32,heads=4,vocab=37,ctx=80", &b), 0);
	assert_ptr_equal(b.family, st_family_find("gpt2"));
	assert_false(st_model_config_equal(&a, &b));
	b.family = &copy;
	assert_true(st_model_config_equal(&a, &b));
	/* no presets of its own */
	assert_int_equal(st_model_config_parse("copy:tiny", &a), -EINVAL);
	struct st_model *m;
	assert_int_equal(st_model_create(&b, &m), 0);
	assert_ptr_equal(st_model_family(m), &copy);
	st_model_destroy(m);
}

/* ---- --model's spellings --------------------------------------------------------- */

static void test_parse(void **state)
{
	(void)state;
	const struct st_family_ops *g = st_family_find("gpt2");
	struct st_model_config c;
	static const struct {
		const char *text;
		int L, C, H, V, T;
	} ok[] = {
		{ "tiny", 4, 128, 4, 256, 256 },
		{ "gpt2", 12, 768, 12, 50257, 1024 },
		{ "gpt2-medium", 24, 1024, 16, 50257, 1024 },
		{ "gpt2-large", 36, 1280, 20, 50257, 1024 },
		{ "gpt2-xl", 48, 1600, 25, 50257, 1024 },
		{ "layers=3,dim=48,heads=6,vocab=100,ctx=64", 3, 48, 6, 100, 64 },
		{ "ctx=64,vocab=100,heads=6,dim=48,layers=3", 3, 48, 6, 100, 64 },
		{ "gpt2:layers=3,dim=48,heads=6,vocab=100,ctx=64", 3, 48, 6, 100, 64 },
		{ "gpt2:tiny", 4, 128, 4, 256, 256 },
		{ "gpt2:gpt2-medium", 24, 1024, 16, 50257, 1024 },
	};
	for (size_t i = 0; i < ST_ARRAY_LEN(ok); i++) {
		memset(&c, 0xff, sizeof(c));
		if (st_model_config_parse(ok[i].text, &c) != 0)
			fail_msg("'%s' refused: %s", ok[i].text, st_error_last());
		assert_ptr_equal(c.family, g);
		assert_int_equal(c.n_layer, ok[i].L);
		assert_int_equal(c.dim, ok[i].C);
		assert_int_equal(c.n_head, ok[i].H);
		assert_int_equal(c.vocab, ok[i].V);
		assert_int_equal(c.ctx, ok[i].T);
		assert_int_equal(c.n_kv_head, 0); /* GPT-2 does not use them */
		assert_int_equal(c.ffn_dim, 0);
		assert_int_equal(st_model_config_check(&c), 0);
	}
	/* refusals, with today's messages */
	static const struct {
		const char *text, *msg;
	} bad[] = {
		{ "", "empty model name" },
		{ "gpt3", "unknown model 'gpt3' (presets: tiny,gpt2,gpt2-medium,gpt2-large,gpt2-xl,"
			  "smollm2-135m," },
		{ "layers=2,dim=48,heads=5,vocab=10,ctx=8", "heads (5) must be >= 1 and divide dim (48)" },
		{ "layers=2,dim=48,heads=4,vocab=10", "lacks key 'ctx'" },
		{ "layers=2,dim=48,heads=4,vocab=10,ctx=8,", "trailing ','" },
		{ "layers=2,dim=48,heads=4,vocab=10,ctx=8,ctx=9", "key 'ctx' given twice" },
		{ "layers=0,dim=48,heads=4,vocab=10,ctx=8", "layers must be in 1..4096, got 0" },
		{ "layers=2,dim=4x8,heads=4,vocab=10,ctx=8", "'dim' needs a positive integer" },
		{ "layers=2,dim=48,heads=4,vocab=10,ctx=8,depth=3", "unknown key 'depth'" },
		{ "layers=2,dim=48,heads=4,vocab=10,ctx", "is not key=value" },
		{ "mamba:layers=2,dim=48,heads=4,vocab=10,ctx=8", "unknown family 'mamba'" },
		{ "llama:layers=2,dim=48,heads=4,vocab=10,ctx=8", "lacks key 'kv-heads'" },
		{ "gpt2:", "names a family, not a model" },
		{ "gpt2:gpt3", "unknown model 'gpt2:gpt3'" },
		{ "gpt2:layers=2,dim=48,heads=5,vocab=10,ctx=8", "must be >= 1 and divide dim" },
		{ ":tiny", "unknown family ''" },
	};
	for (size_t i = 0; i < ST_ARRAY_LEN(bad); i++) {
		struct st_model_config keep = { .n_layer = 77 };

		c = keep;
		st_error_clear();
		if (st_model_config_parse(bad[i].text, &c) != -EINVAL)
			fail_msg("'%s' was accepted", bad[i].text);
		if (!strstr(st_error_last(), bad[i].msg))
			fail_msg("'%s': '%s' lacks '%s'", bad[i].text, st_error_last(), bad[i].msg);
		assert_int_equal(c.n_layer, 77); /* untouched */
	}
	/* fields GPT-2 does not use must stay 0 */
	assert_int_equal(st_model_config_parse("gpt2", &c), 0);
	c.n_kv_head = 4;
	assert_int_equal(st_model_config_check(&c), -EINVAL);
	struct st_model *m;
	assert_int_equal(st_model_create(&c, &m), -EINVAL);
	/* NULL family is GPT-2 */
	struct st_model_config d = { .n_layer = 2, .dim = 32, .n_head = 4, .vocab = 37, .ctx = 80 };
	assert_ptr_equal(st_model_config_family(&d), g);
	assert_int_equal(st_model_create(&d, &m), 0);
	assert_ptr_equal(st_model_config(m)->family, g);
	st_model_destroy(m);
}

static void test_format(void **state)
{
	(void)state;
	struct st_model_config c, r;
	char buf[256];
	struct st_config_field f[ST_MODEL_CONFIG_FIELDS_MAX];

	assert_int_equal(st_model_config_parse("gpt2-medium", &c), 0);
	assert_string_equal(st_model_config_format(&c, buf, sizeof(buf)),
			    "layers=24,dim=1024,heads=16,vocab=50257,ctx=1024");
	assert_int_equal(st_model_config_parse(buf, &r), 0); /* reads back */
	assert_true(st_model_config_equal(&c, &r));
	assert_string_equal(st_model_config_describe(&c, buf, sizeof(buf)),
			    "GPT-2, 24 layers, dim 1024, 16 heads, vocab 50257, ctx 1024");
	assert_int_equal(st_model_config_fields(&c, f), 5);
	static const char *keys[] = { "n_layer", "n_embd", "n_head", "vocab_size", "n_positions" };
	const int64_t vals[] = { 24, 1024, 16, 50257, 1024 };
	for (int i = 0; i < 5; i++) {
		assert_string_equal(f[i].key, keys[i]);
		assert_int_equal(f[i].value, vals[i]);
	}
	r.ctx = 512;
	assert_false(st_model_config_equal(&c, &r));
}

/* ---- config.json through the family ----------------------------------------------- */

static char tmpdir[64];

static void write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static void test_hf_config(void **state)
{
	(void)state;
	const struct st_family_ops *g = st_family_find("gpt2");
	struct st_model_config c, r;
	char path[128];

	snprintf(path, sizeof(path), "%s/config.json", tmpdir);
	assert_int_equal(st_model_config_parse("layers=3,dim=48,heads=6,vocab=100,ctx=64", &c), 0);
	assert_int_equal(st_model_config_write(path, &c), 0);
	memset(&r, 0, sizeof(r));
	assert_int_equal(st_model_config_read(path, &r), 0);
	assert_ptr_equal(r.family, g);
	assert_true(st_model_config_equal(&r, &c));
	assert_int_equal(st_model_config_hf_check(path), 0);
	/* what was written: GPT-2's as transformers spells it */
	{
		FILE *f = fopen(path, "r");
		char text[2048];
		size_t n = fread(text, 1, sizeof(text) - 1, f);

		fclose(f);
		text[n] = '\0';
		assert_non_null(strstr(text, "\"model_type\": \"gpt2\""));
		assert_non_null(strstr(text, "\"GPT2LMHeadModel\""));
		assert_non_null(strstr(text, "\"n_embd\": 48"));
		assert_non_null(strstr(text, "\"n_positions\": 64"));
		assert_non_null(strstr(text, "\"tie_word_embeddings\": true"));
	}
	/* no model_type: by architectures, else GPT-2 (llm.c's tools) */
	write_text(path, "{\"architectures\": [\"GPT2LMHeadModel\"], \"n_embd\": 48, "
			 "\"n_layer\": 3, \"n_head\": 6, \"vocab_size\": 100, \"n_ctx\": 64}");
	assert_int_equal(st_model_config_read(path, &r), 0);
	assert_true(st_model_config_equal(&r, &c));
	write_text(path, "{\"n_embd\": 48, \"n_layer\": 3, \"n_head\": 6, \"vocab_size\": 100, "
			 "\"n_positions\": 64}");
	assert_int_equal(st_model_config_read(path, &r), 0);
	assert_true(st_model_config_equal(&r, &c));
	/* another family's config is refused, naming it */
	write_text(path, "{\"model_type\": \"bert\", \"hidden_size\": 768}");
	assert_int_equal(st_model_config_read(path, &r), -EINVAL);
	assert_non_null(strstr(st_error_last(), "bert"));
	assert_int_equal(st_model_config_hf_check(path), -EINVAL);
	/* a model_type that is not a string is refused, not skipped */
	write_text(path, "{\"model_type\": 5, \"n_embd\": 48, \"n_layer\": 3, \"n_head\": 6, "
			 "\"vocab_size\": 100, \"n_positions\": 64}");
	assert_int_equal(st_model_config_read(path, &r), -EINVAL);
	assert_non_null(strstr(st_error_last(), "\"model_type\" is not a string"));
	/* a GPT-2 of another kind than strata computes */
	write_text(path, "{\"model_type\": \"gpt2\", \"n_embd\": 48, \"n_layer\": 3, \"n_head\": 6, "
			 "\"vocab_size\": 100, \"n_positions\": 64, \"layer_norm_epsilon\": 1e-6}");
	assert_int_equal(st_model_config_read(path, &r), 0); /* the shape is read */
	assert_int_equal(st_model_config_hf_check(path), -EINVAL);
	assert_non_null(strstr(st_error_last(), "layer_norm_epsilon"));
	/* out of range, missing, not JSON: today's messages */
	write_text(path, "{\"n_embd\": 48, \"n_layer\": 3, \"n_head\": 6, \"vocab_size\": 100, "
			 "\"n_positions\": 3000000000}");
	assert_int_equal(st_model_config_read(path, &r), -EINVAL);
	assert_non_null(strstr(st_error_last(), "n_positions is 3000000000"));
	write_text(path, "[1, 2]");
	assert_int_equal(st_model_config_read(path, &r), -EINVAL);
	assert_non_null(strstr(st_error_last(), "not a JSON object"));
	assert_int_equal(st_model_config_hf_check(path), -EINVAL);
	/* the writer refuses what the reader would */
	c.n_head = 0;
	assert_int_equal(st_model_config_write(path, &c), -EINVAL);
	assert_non_null(strstr(st_error_last(), "n_head is 0"));
	unlink(path);
}

/* ---- the tie as data, activation bytes, logits --------------------------------------- */

static void test_layout_tie(void **state)
{
	(void)state;
	struct st_model_config c;
	struct st_model *m;

	assert_int_equal(st_model_config_parse("layers=3,dim=48,heads=6,vocab=100,ctx=64", &c), 0);
	assert_int_equal(st_model_create(&c, &m), 0);
	int U = st_model_unit_count(m);
	assert_int_equal(U, 5);
	for (int u = 0; u < U; u++) {
		const struct st_unit_layout *ul = st_model_unit_layout(m, u);
		/* the head reads the embedding; the embedding stays resident */
		assert_int_equal(ul->reads_unit, u == U - 1 ? 0 : -1);
		assert_int_equal(ul->resident, u == 0);
		assert_int_equal(ul->kind, u == 0 ? ST_UNIT_EMBED
					  : u == U - 1 ? ST_UNIT_HEAD : ST_UNIT_BLOCK);
		/* every unit's output is the next one's input, (B,T,C) fp32 */
		size_t want = u == U - 1 ? 0 : (size_t)2 * 7 * 48 * sizeof(float);
		assert_int_equal(st_model_act_bytes(m, u, 2, 7), want);
	}
	st_model_destroy(m);
}

/* st_model_logits() = ln_f(x) @ wte^T, against the kernels by hand. */
static void test_logits(void **state)
{
	(void)state;
	struct st_model_config c;
	struct st_model *m;

	assert_int_equal(st_model_config_parse("layers=1,dim=32,heads=4,vocab=37,ctx=16", &c), 0);
	assert_int_equal(st_model_create(&c, &m), 0);
	const struct st_unit_layout *e = st_model_unit_layout(m, 0), *h = st_model_unit_layout(m, 2);
	float *pe = calloc(e->elems, sizeof(float)), *ph = calloc(h->elems, sizeof(float));
	float x[32], got[37], want[37], ln[32], mean, rstd;
	assert_int_equal(st_model_init_unit(m, 0, 5, pe), 0);
	assert_int_equal(st_model_init_unit(m, 2, 5, ph), 0);
	for (int i = 0; i < 32; i++) {
		x[i] = (float)sin(i * 0.7);
		ph[h->tensors[0].offset_elems + i] += 0.01f * (float)i; /* gain off 1 */
	}
	size_t wb = st_model_work_bytes(m, 2, 1, 1);
	void *work = malloc(wb);
	assert_int_equal(st_model_logits(m, ph, pe, x, got, work, wb), 0);
	st_cpu_layernorm_fwd(ln, &mean, &rstd, x, ph + h->tensors[0].offset_elems,
			     ph + h->tensors[1].offset_elems, 1, 32);
	st_cpu_sgemm(0, 1, 1, 37, 32, 1.0f, ln, 32, pe + e->tensors[0].offset_elems, 32, 0.0f,
		     want, 37);
	assert_memory_equal(got, want, sizeof(want));
	assert_int_equal(st_model_logits(m, ph, pe, x, got, work, 8), -EINVAL);
	free(work);
	free(pe);
	free(ph);
	st_model_destroy(m);
}

int main(void)
{
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/st-family-XXXXXX");
	if (!mkdtemp(tmpdir))
		return 1;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_registry),
		cmocka_unit_test(test_incomplete_table),
		cmocka_unit_test(test_parse),
		cmocka_unit_test(test_format),
		cmocka_unit_test(test_hf_config),
		cmocka_unit_test(test_layout_tie),
		cmocka_unit_test(test_logits),
		cmocka_unit_test(test_register), /* last: it adds a family */
	};
	int rc = cmocka_run_group_tests(tests, NULL, NULL);
	rmdir(tmpdir);
	(void)g_copy;
	return rc;
}

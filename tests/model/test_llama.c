/* The LLaMA family: presets against the released models' parameter
 * counts, --model's dimensions and config.json through the family, the
 * layouts (Hugging Face names and nn.Linear shapes), the new kernels
 * against float64 references written here (RMSNorm, rotary embeddings as
 * rotate_half, SwiGLU, nn.Linear, grouped-query attention with repeat_kv),
 * finite differences of every tensor of every unit (GQA, biases, llama3
 * and linear rope scaling, tied and untied heads, head_dim != dim/heads),
 * and bitwise determinism at 1, 2, 3 threads. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "strata/compute.h"
#include "strata/family.h"
#include "strata/kernels.h"
#include "strata/model.h"
#include "strata/rope.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model_net.h"

/* ---- presets, dimensions, config.json ------------------------------------------------------ */

/* The released models' parameter counts (their model cards and
 * safetensors indexes), which every shape of a preset enters. */
static void test_presets(void **state)
{
	(void)state;
	static const struct {
		const char *name;
		uint64_t params;
	} want[] = {
		{ "smollm2-135m", 134515008ull },  { "smollm2-360m", 361821120ull },
		{ "smollm2-1.7b", 1711376384ull }, { "tinyllama-1.1b", 1100048384ull },
		{ "llama3.2-1b", 1235814400ull },  { "llama3.2-3b", 3212749824ull },
		{ "llama3.1-8b", 8030261248ull },  { "llama3.1-70b", 70553706496ull },
		{ "qwen2.5-0.5b", 494032768ull },  { "qwen2.5-7b", 7615616512ull },
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		struct st_model_config c, back;
		struct st_model *m;
		char text[512];
		assert_int_equal(st_model_config_parse(want[i].name, &c), 0);
		assert_string_equal(st_model_config_family(&c)->name, "llama");
		assert_int_equal(st_model_create(&c, &m), 0);
		if (st_model_param_count(m) != want[i].params)
			fail_msg("%s: %llu parameters, the released model has %llu", want[i].name,
				 (unsigned long long)st_model_param_count(m),
				 (unsigned long long)want[i].params);
		/* the dimensions text reads back as the same model */
		st_model_config_format(&c, text, sizeof(text));
		char pre[600];
		snprintf(pre, sizeof(pre), "llama:%s", text);
		assert_int_equal(st_model_config_parse(pre, &back), 0);
		assert_true(st_model_config_equal(&c, &back));
		/* and so does its config.json */
		char path[] = "/tmp/strata-llama-cfg-XXXXXX";
		int fd = mkstemp(path);
		assert_true(fd >= 0);
		close(fd);
		assert_int_equal(st_model_config_write(path, &c), 0);
		memset(&back, 0, sizeof(back));
		assert_int_equal(st_model_config_read(path, &back), 0);
		if (!st_model_config_equal(&c, &back))
			fail_msg("%s: config.json does not read back", want[i].name);
		assert_int_equal(st_model_config_hf_check(path), 0);
		unlink(path);
		st_model_destroy(m);
	}
	struct st_model_config c;
	assert_int_equal(st_model_config_parse("llama3.1-8b", &c), 0);
	assert_int_equal(c.rope_type, ST_ROPE_LLAMA3);
	assert_true(c.rope_factor == 8.0 && c.rope_original_ctx == 8192);
	assert_true(c.untied);
	assert_int_equal(st_model_config_parse("qwen2.5-0.5b", &c), 0);
	assert_true(c.qkv_bias && !c.untied && c.norm_eps == 1e-6 && c.rope_theta == 1e6);
}

static void test_dims(void **state)
{
	(void)state;
	struct st_model_config c;
	assert_int_equal(st_model_config_parse("llama:layers=2,dim=48,heads=4,kv-heads=2,ffn=96,"
					       "vocab=50,ctx=32", &c), 0);
	assert_int_equal(c.head_dim, 12);
	assert_true(c.untied && c.qkv_bias == false); /* tied=0 by default, as LlamaConfig */
	assert_true(c.rope_theta == 10000.0 && c.norm_eps == 1e-5);
	assert_int_equal(st_model_config_parse("llama:layers=2,dim=48,heads=4,kv-heads=1,ffn=96,"
					       "vocab=50,ctx=32,head-dim=16,tied=0,bias=0,"
					       "rope-theta=500000,eps=1e-6,"
					       "rope-scaling=llama3:8:1:4:16", &c), 0);
	assert_int_equal(c.head_dim, 16);
	assert_true(c.untied && c.rope_type == ST_ROPE_LLAMA3 && c.rope_original_ctx == 16);
	static const char *bad[] = {
		"llama:layers=2,dim=48,heads=4,ffn=96,vocab=50,ctx=32",            /* no kv-heads */
		"llama:layers=2,dim=48,heads=4,kv-heads=3,ffn=96,vocab=50,ctx=32", /* 4 % 3 */
		"llama:layers=2,dim=48,heads=5,kv-heads=5,ffn=96,vocab=50,ctx=32", /* 48 % 5 */
		"llama:layers=2,dim=48,heads=4,kv-heads=2,ffn=96,vocab=50,ctx=32,tied=2",
		"llama:layers=2,dim=48,heads=4,kv-heads=2,ffn=96,vocab=50,ctx=32,head-dim=7",
		"llama:layers=2,dim=48,heads=4,kv-heads=2,ffn=96,vocab=50,ctx=32,rope-theta=x",
		"llama:layers=2,dim=48,heads=4,kv-heads=2,ffn=96,vocab=50,ctx=32,rope-scaling=yarn:4",
		"llama:layers=2,dim=48,heads=4,kv-heads=2,ffn=96,vocab=50,ctx=32,rope-scaling=llama3:8",
		"llama:layers=2,dim=48,heads=4,kv-heads=2,ffn=96,vocab=50,ctx=32,bias=1,head-dim=16",
		"llama:layers=2,dim=48,heads=4,kv-heads=2,ffn=96,vocab=50,ctx=32,eps=0",
		"llama:layers=2,dim=48,heads=4,kv-heads=2,ffn=0,vocab=50,ctx=32",
		"llama:layers=2,dim=48,heads=4,kv-heads=2,ffn=96,vocab=50,ctx=32,depth=1",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		st_error_clear();
		if (st_model_config_parse(bad[i], &c) != -EINVAL)
			fail_msg("'%s' was accepted", bad[i]);
		assert_true(strlen(st_error_last()) > 0);
	}
}

/* config.json as Hugging Face ships it, and the refusals (one line each,
 * naming the key). */
static void test_hf_config(void **state)
{
	(void)state;
	static const char *const good =
		"{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", "
		"\"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2, "
		"\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 99, "
		"\"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-05, \"rope_theta\": "
		"500000.0, \"rope_scaling\": {\"factor\": 32.0, \"high_freq_factor\": 4.0, "
		"\"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 64, "
		"\"rope_type\": \"llama3\"}, \"tie_word_embeddings\": true, \"hidden_act\": "
		"\"silu\", \"torch_dtype\": \"bfloat16\", \"head_dim\": 16}";
	static const struct {
		const char *from, *to, *says;
	} bad[] = {
		{ "LlamaForCausalLM", "GemmaForCausalLM", "architectures" },
		{ "\"llama3\"", "\"yarn\"", "rope_type" },
		{ "\"silu\"", "\"gelu\"", "hidden_act" },
		{ "\"head_dim\": 16", "\"attention_bias\": true", "attention_bias" },
		{ "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3", "kv-heads" },
		{ "\"hidden_size\": 64", "\"hidden_size\": \"64\"", "hidden_size" },
		{ "\"head_dim\": 16", "\"mlp_bias\": true", "mlp_bias" },
	};
	char path[] = "/tmp/strata-llama-hf-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	close(fd);
	FILE *f = fopen(path, "w");
	fputs(good, f);
	fclose(f);
	struct st_model_config c;
	assert_int_equal(st_model_config_read(path, &c), 0);
	assert_string_equal(st_model_config_family(&c)->name, "llama");
	assert_true(c.n_kv_head == 2 && c.head_dim == 16 && !c.untied && !c.qkv_bias);
	assert_true(c.rope_type == ST_ROPE_LLAMA3 && c.rope_factor == 32.0 &&
		    c.rope_original_ctx == 64);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char text[2048];
		const char *at = strstr(good, bad[i].from);
		assert_non_null(at);
		snprintf(text, sizeof(text), "%.*s%s%s", (int)(at - good), good, bad[i].to,
			 at + strlen(bad[i].from));
		f = fopen(path, "w");
		fputs(text, f);
		fclose(f);
		st_error_clear();
		if (st_model_config_read(path, &c) != -EINVAL)
			fail_msg("%s -> %s was accepted", bad[i].from, bad[i].to);
		if (!strstr(st_error_last(), bad[i].says))
			fail_msg("%s: the refusal '%s' does not name %s", bad[i].to,
				 st_error_last(), bad[i].says);
		assert_null(strchr(st_error_last(), '\n'));
	}
	/* Qwen2: q/k/v biases without saying so, by model_type */
	f = fopen(path, "w");
	fputs("{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", "
	      "\"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2, "
	      "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 99, "
	      "\"max_position_embeddings\": 256, \"rope_scaling\": null, "
	      "\"use_sliding_window\": false}", f);
	fclose(f);
	assert_int_equal(st_model_config_read(path, &c), 0);
	assert_true(c.qkv_bias && c.untied && c.norm_eps == 1e-6 && c.rope_theta == 10000.0);
	unlink(path);
}

static void test_layout(void **state)
{
	(void)state;
	struct st_model_config c;
	struct st_model *m;
	int u, k;
	assert_int_equal(st_model_config_parse("llama3.1-8b", &c), 0);
	assert_int_equal(st_model_create(&c, &m), 0);
	assert_int_equal(st_model_unit_count(m), 34);
	static const struct {
		const char *name;
		int unit;
		int64_t d0, d1;
		bool decay;
	} want[] = {
		{ "model.embed_tokens.weight", 0, 128256, 4096, true },
		{ "model.layers.0.input_layernorm.weight", 1, 4096, 1, false },
		{ "model.layers.0.self_attn.q_proj.weight", 1, 4096, 4096, true },
		{ "model.layers.3.self_attn.k_proj.weight", 4, 1024, 4096, true },
		{ "model.layers.3.self_attn.v_proj.weight", 4, 1024, 4096, true },
		{ "model.layers.31.self_attn.o_proj.weight", 32, 4096, 4096, true },
		{ "model.layers.31.post_attention_layernorm.weight", 32, 4096, 1, false },
		{ "model.layers.7.mlp.gate_proj.weight", 8, 14336, 4096, true },
		{ "model.layers.7.mlp.up_proj.weight", 8, 14336, 4096, true },
		{ "model.layers.7.mlp.down_proj.weight", 8, 4096, 14336, true },
		{ "model.norm.weight", 33, 4096, 1, false },
		{ "lm_head.weight", 33, 128256, 4096, true },
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		if (st_model_find_tensor(m, want[i].name, &u, &k))
			fail_msg("no tensor %s", want[i].name);
		const struct st_tensor_layout *t = &st_model_unit_layout(m, u)->tensors[k];
		assert_int_equal(u, want[i].unit);
		assert_int_equal(t->shape[0], want[i].d0);
		assert_int_equal(t->shape[1], want[i].d1);
		assert_int_equal(t->decay, want[i].decay);
	}
	assert_int_equal(st_model_find_tensor(m, "model.layers.0.self_attn.q_proj.bias", &u, &k),
			 -ENOENT);
	/* untied: the head is a unit of its own, nothing resident */
	assert_int_equal(st_model_unit_layout(m, 33)->reads_unit, -1);
	assert_false(st_model_unit_layout(m, 0)->resident);
	for (u = 0; u < 34; u++) {
		const struct st_unit_layout *ul = st_model_unit_layout(m, u);
		assert_int_equal(ul->elems % 2048, 0);
		for (k = 0; k < ul->n_tensors; k++)
			assert_int_equal(ul->tensors[k].offset_elems % 64, 0);
	}
	st_model_destroy(m);
	/* tied with Qwen2's biases: the head reads the embedding */
	assert_int_equal(st_model_config_parse("qwen2.5-0.5b", &c), 0);
	assert_int_equal(st_model_create(&c, &m), 0);
	assert_int_equal(st_model_find_tensor(m, "model.layers.23.self_attn.k_proj.bias", &u, &k), 0);
	assert_int_equal(st_model_unit_layout(m, u)->tensors[k].shape[0], 128);
	assert_false(st_model_unit_layout(m, u)->tensors[k].decay);
	assert_int_equal(st_model_find_tensor(m, "lm_head.weight", &u, &k), -ENOENT);
	assert_int_equal(st_model_unit_layout(m, 25)->reads_unit, 0);
	assert_true(st_model_unit_layout(m, 0)->resident);
	assert_int_equal(st_model_act_bytes(m, 0, 2, 16), 2 * 16 * 896 * 4);
	st_model_destroy(m);
}

/* ---- kernels against float64 references ---------------------------------------------------- */

static void fill(float *p, size_t n, float scale)
{
	for (size_t i = 0; i < n; i++)
		p[i] = scale * rng_f();
}

static void close_to(const float *got, const double *want, size_t n, double tol,
		     const char *what)
{
	double e = 0, s = 0;
	for (size_t i = 0; i < n; i++) {
		e += (got[i] - want[i]) * (got[i] - want[i]);
		s += want[i] * want[i];
	}
	if (!(sqrt(e) <= tol * sqrt(s) + 1e-12))
		fail_msg("%s: relative L2 error %.3g (tolerance %.1g)", what, sqrt(e / s), tol);
}

static void test_kernels_ref(void **state)
{
	(void)state;
	enum { N = 37, C = 80, OC = 56, n_el = 999 };
	float *x = malloc(N * C * 4), *w = malloc(OC * C * 4), *b = malloc(OC * 4);
	float *y = malloc(N * C * 4), *r = malloc(N * 4), *y2 = malloc(N * OC * 4);
	double *ref = malloc(N * OC * 8 > N * C * 8 ? N * OC * 8 : N * C * 8);
	fill(x, N * C, 2.0f);
	fill(w, OC * C, 1.0f);
	fill(b, OC, 1.0f);
	// RMSNorm
	st_cpu_rmsnorm_fwd(y, r, x, w, 1e-5f, N, C);
	for (int n = 0; n < N; n++) {
		double s = 0;
		for (int c = 0; c < C; c++)
			s += (double)x[n * C + c] * x[n * C + c];
		double rs = 1.0 / sqrt(s / C + 1e-5);
		for (int c = 0; c < C; c++)
			ref[n * C + c] = w[c] * x[n * C + c] * rs;
	}
	close_to(y, ref, N * C, 1e-6, "rmsnorm_fwd");
	// nn.Linear: y = x W^T + b
	st_cpu_linear_fwd(y2, x, w, b, N, C, OC);
	for (int n = 0; n < N; n++)
		for (int o = 0; o < OC; o++) {
			double s = b[o];
			for (int c = 0; c < C; c++)
				s += (double)x[n * C + c] * w[o * C + c];
			ref[n * OC + o] = s;
		}
	close_to(y2, ref, N * OC, 1e-6, "linear_fwd");
	// SwiGLU
	st_cpu_swiglu_fwd(y, x, x + n_el, n_el);
	for (int i = 0; i < n_el; i++) {
		double g = x[i];
		ref[i] = g / (1.0 + exp(-g)) * x[n_el + i];
	}
	close_to(y, ref, n_el, 1e-6, "swiglu_fwd");
	free(x); free(w); free(b); free(y); free(r); free(y2); free(ref);
}

/* Hugging Face's apply_rotary_pos_emb: q * cos + rotate_half(q) * sin, cos
 * and sin of cat(freqs, freqs), rotate_half(x) = cat(-x2, x1). */
static void rope_ref(double *out, const float *in, int B, int T, int NH, int hd, int stride,
		     const struct st_model_config *c)
{
	int half = hd / 2;
	for (int row = 0; row < B * T; row++)
		for (int h = 0; h < NH; h++) {
			const float *x = in + (size_t)row * stride + h * hd;
			double *o = out + (size_t)row * stride + h * hd;
			for (int j = 0; j < hd; j++) {
				int i = j % half;
				/* the frequency, independently in double (HF's formulas) */
				double inv = 1.0 / pow(c->rope_theta, (double)(2 * i) / hd);
				if (c->rope_type == ST_ROPE_LINEAR)
					inv /= c->rope_factor;
				if (c->rope_type == ST_ROPE_LLAMA3) {
					double wl = 2 * M_PI / inv;
					double lo = c->rope_original_ctx / c->rope_low_freq_factor;
					double hi = c->rope_original_ctx / c->rope_high_freq_factor;
					if (wl > lo) {
						inv /= c->rope_factor;
					} else if (wl >= hi) {
						double s = (c->rope_original_ctx / wl -
							    c->rope_low_freq_factor) /
							   (c->rope_high_freq_factor -
							    c->rope_low_freq_factor);
						inv = (1 - s) * inv / c->rope_factor + s * inv;
					}
				}
				double a = (row % T) * inv;
				double rot = j < half ? -(double)x[j + half] : (double)x[j - half];
				o[j] = x[j] * cos(a) + rot * sin(a);
			}
		}
}

static void test_rope_ref(void **state)
{
	(void)state;
	enum { B = 2, T = 300, NH = 3, hd = 16, stride = 60 }; /* 12 floats past the heads */
	struct st_model_config cs[3] = {
		{ .rope_theta = 10000.0 },
		{ .rope_theta = 500000.0, .rope_type = ST_ROPE_LINEAR, .rope_factor = 4.0 },
		{ .rope_theta = 500000.0, .rope_type = ST_ROPE_LLAMA3, .rope_factor = 8.0,
		  .rope_low_freq_factor = 1.0, .rope_high_freq_factor = 4.0,
		  .rope_original_ctx = 64 },
	};
	size_t n = (size_t)B * T * stride;
	float *x = malloc(n * 4), *y = malloc(n * 4), *z = malloc(n * 4);
	double *ref = malloc(n * 8);
	fill(x, n, 1.0f);
	for (int k = 0; k < 3; k++) {
		const struct st_model_config *c = &cs[k];
		memcpy(y, x, n * 4);
		st_cpu_rope_fwd(y, y, B, T, 0, NH, hd, stride, c->rope_type, c->rope_original_ctx,
				(float)c->rope_theta, (float)c->rope_factor,
				(float)c->rope_low_freq_factor, (float)c->rope_high_freq_factor);
		rope_ref(ref, x, B, T, NH, hd, stride, c);
		for (size_t r = 0; r < (size_t)B * T; r++)
			for (int e = NH * hd; e < stride; e++) { /* the rest untouched */
				assert_true(y[r * stride + e] == x[r * stride + e]);
				ref[r * stride + e] = x[r * stride + e];
			}
		/* positions up to 300 x inv 1: fp32 angles are good to ~2e-5 */
		close_to(y, ref, n, 1e-5, k == 0 ? "rope default" : k == 1 ? "rope linear" :
						  "rope llama3");
		/* the backward is the inverse rotation */
		st_cpu_rope_bwd(z, y, B, T, 0, NH, hd, stride, c->rope_type, c->rope_original_ctx,
				(float)c->rope_theta, (float)c->rope_factor,
				(float)c->rope_low_freq_factor, (float)c->rope_high_freq_factor);
		for (size_t i = 0; i < (size_t)B * T; i++)
			for (int e = 0; e < NH * hd; e++)
				assert_true(fabsf(z[i * stride + e] - x[i * stride + e]) < 1e-5f);
	}
	free(x); free(y); free(z); free(ref);
}

/* Causal attention per query head h against key/value head h / (NH/NKV). */
static void test_gqa_ref(void **state)
{
	(void)state;
	enum { B = 2, T = 131, NH = 6, NKV = 2, hd = 8 };
	const int Q = NH * hd, KV = NKV * hd;
	float *q = malloc(B * T * Q * 4), *k = malloc(B * T * KV * 4), *v = malloc(B * T * KV * 4);
	float *o = malloc(B * T * Q * 4), *lse = malloc(B * NH * T * 4);
	double *ref = malloc(B * T * Q * 8), *lref = malloc(B * NH * T * 8), *s = malloc(T * 8);
	fill(q, B * T * Q, 1.5f);
	fill(k, B * T * KV, 1.5f);
	fill(v, B * T * KV, 1.0f);
	st_cpu_gqa_attention_fwd(o, lse, q, k, v, B, T, NH, NKV, hd);
	for (int b = 0; b < B; b++)
		for (int h = 0; h < NH; h++) {
			int kh = h / (NH / NKV);
			for (int i = 0; i < T; i++) {
				double mx = -INFINITY, sum = 0;
				for (int j = 0; j <= i; j++) {
					double d = 0;
					for (int e = 0; e < hd; e++)
						d += (double)q[(b * T + i) * Q + h * hd + e] *
						     k[(b * T + j) * KV + kh * hd + e];
					s[j] = d / sqrt((double)hd);
					mx = fmax(mx, s[j]);
				}
				for (int j = 0; j <= i; j++)
					sum += exp(s[j] - mx);
				lref[(b * NH + h) * T + i] = mx + log(sum);
				for (int e = 0; e < hd; e++) {
					double acc = 0;
					for (int j = 0; j <= i; j++)
						acc += exp(s[j] - mx) / sum *
						       v[(b * T + j) * KV + kh * hd + e];
					ref[(b * T + i) * Q + h * hd + e] = acc;
				}
			}
		}
	close_to(o, ref, B * T * Q, 1e-5, "gqa attention out");
	close_to(lse, lref, B * NH * T, 1e-6, "gqa attention lse");
	/* NKV = NH is plain attention: GPT-2's kernel on [q|k|v] agrees */
	{
		const int C = NH * hd;
		float *qkv = malloc((size_t)B * T * 3 * C * 4), *o2 = malloc((size_t)B * T * C * 4);
		float *l2 = malloc((size_t)B * NH * T * 4), *k2 = malloc((size_t)B * T * C * 4);
		float *v2 = malloc((size_t)B * T * C * 4), *o3 = malloc((size_t)B * T * C * 4);
		double *d = malloc((size_t)B * T * C * 8);
		fill(k2, (size_t)B * T * C, 1.5f);
		fill(v2, (size_t)B * T * C, 1.0f);
		for (int r = 0; r < B * T; r++) {
			memcpy(qkv + (size_t)r * 3 * C, q + (size_t)r * C, C * 4);
			memcpy(qkv + (size_t)r * 3 * C + C, k2 + (size_t)r * C, C * 4);
			memcpy(qkv + (size_t)r * 3 * C + 2 * C, v2 + (size_t)r * C, C * 4);
		}
		st_cpu_attention_fwd(o2, l2, qkv, B, T, C, NH);
		st_cpu_gqa_attention_fwd(o3, lse, q, k2, v2, B, T, NH, NH, hd);
		for (int i = 0; i < B * T * C; i++)
			d[i] = o2[i];
		close_to(o3, d, (size_t)B * T * C, 1e-6, "gqa with NKV = NH vs attention_fwd");
		free(qkv); free(o2); free(l2); free(k2); free(v2); free(o3); free(d);
	}
	free(q); free(k); free(v); free(o); free(lse); free(ref); free(lref); free(s);
}

/* ---- finite differences of every unit ---------------------------------------------------- */

static void randomise(struct net *n)
{
	for (int u = 0; u < n->U; u++) {
		const struct st_unit_layout *ul = st_model_unit_layout(n->m, u);
		for (int k = 0; k < ul->n_tensors; k++) {
			const struct st_tensor_layout *t = &ul->tensors[k];
			float *p = n->p[u] + t->offset_elems;
			for (uint64_t i = 0; i < t->n_elems; i++)
				p[i] = strstr(t->name, "norm") ? 1.0f + 0.3f * rng_f() :
								  0.3f * rng_f();
		}
	}
}

static void unit_gradients(const char *model, int B, int T)
{
	struct st_model_config cfg;
	struct net n;
	assert_int_equal(st_model_config_parse(model, &cfg), 0);
	net_init(&n, &cfg, B, T, 5);
	randomise(&n);
	for (int i = 0; i < n.B * n.T; i++) {
		n.tok[i] = (int32_t)(rng_u64() % cfg.vocab);
		n.tgt[i] = (int32_t)(rng_u64() % cfg.vocab);
	}
	net_fwd(&n);
	net_unit_gradients(&n);
	net_fini(&n);
}

/* GQA (4 heads over 2), Qwen2's biases, llama3 rope scaling, tied, T = 70
 * (two attention blocks). */
static void test_gradients_gqa_bias(void **state)
{
	(void)state;
	unit_gradients("llama:layers=2,dim=32,heads=4,kv-heads=2,ffn=48,vocab=37,ctx=80,"
		       "bias=1,tied=1,rope-theta=500000,rope-scaling=llama3:8:1:4:16", 2, 70);
}

/* One kv head (MQA), heads x head-dim (64) != dim (48), an untied head,
 * linear rope scaling. */
static void test_gradients_untied(void **state)
{
	(void)state;
	unit_gradients("llama:layers=1,dim=48,heads=4,kv-heads=1,head-dim=16,ffn=40,vocab=41,"
		       "ctx=80,tied=0,rope-scaling=linear:4", 2, 67);
}

static void test_determinism(void **state)
{
	(void)state;
	struct st_model_config cfg;
	struct net n;
	assert_int_equal(st_model_config_parse("llama:layers=2,dim=32,heads=4,kv-heads=2,ffn=48,"
					       "vocab=37,ctx=80,bias=1", &cfg), 0);
	net_init(&n, &cfg, 2, 80, 9);
	for (int i = 0; i < n.B * n.T; i++) {
		n.tok[i] = (int32_t)(rng_u64() % cfg.vocab);
		n.tgt[i] = (int32_t)(rng_u64() % cfg.vocab);
	}
	int saved = omp_get_max_threads();
	float loss[3];
	float **g0 = calloc(n.U, sizeof(float *));
	for (int t = 0; t < 3; t++) {
		omp_set_num_threads(t + 1);
		net_fwd(&n);
		loss[t] = net_bwd(&n);
		for (int u = 0; u < n.U; u++) {
			size_t bytes = st_model_unit_layout(n.m, u)->elems * 4;
			if (t == 0) {
				g0[u] = malloc(bytes);
				memcpy(g0[u], n.g[u], bytes);
			} else if (memcmp(g0[u], n.g[u], bytes)) {
				fail_msg("unit %d gradient differs at %d threads", u, t + 1);
			}
		}
		if (t > 0)
			assert_memory_equal(&loss[0], &loss[t], sizeof(float));
	}
	/* loss at init near ln V */
	assert_true(fabs(loss[0] - log(37.0)) < 0.1);
	omp_set_num_threads(saved);
	for (int u = 0; u < n.U; u++)
		free(g0[u]);
	free(g0);
	net_fini(&n);
}

/* A kept forward gives the recompute's bits (model_net.h): GQA with biases
 * (dq, dk, dv alias gate and up), and a shape whose attention gradients
 * need buffers of their own (Q > F). */
static void test_saved_forward(void **state)
{
	(void)state;
	static const char *models[] = {
		"llama:layers=2,dim=32,heads=4,kv-heads=2,ffn=48,vocab=37,ctx=80,bias=1",
		"llama:layers=2,dim=48,heads=4,kv-heads=2,head-dim=16,ffn=40,vocab=41,ctx=80,"
		"tied=0",
	};
	for (unsigned i = 0; i < sizeof(models) / sizeof(models[0]); i++) {
		struct st_model_config cfg;
		struct net n;
		assert_int_equal(st_model_config_parse(models[i], &cfg), 0);
		net_init(&n, &cfg, 2, 70, 13);
		randomise(&n);
		for (int j = 0; j < n.B * n.T; j++) {
			n.tok[j] = (int32_t)(rng_u64() % cfg.vocab);
			n.tgt[j] = (int32_t)(rng_u64() % cfg.vocab);
		}
		net_saved_matches(&n);
		double sum = 0;
		for (int u = 0; u < n.U; u++)
			sum += st_model_unit_flops_per_token(n.m, u, 70);
		assert_true(fabs(sum - st_model_flops_per_token(n.m, 70)) <= 1e-9 * sum);
		net_fini(&n);
	}
}

/* ---- bf16 compute ----------------------------------------------------------------------- */

/* rel L2 of a against b */
static double rel_l2(const float *a, const float *b, size_t n)
{
	double num = 0, den = 0;

	for (size_t i = 0; i < n; i++) {
		num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
		den += (double)b[i] * b[i];
	}
	return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The bf16 path (llama.c at bf16) on the fp32 path's bf16-rounded weights:
 * the loss within 1% and every unit's gradient within 5% (relative L2) of
 * fp32's, and not equal to them (bf16 did run); a kept forward gives the
 * recompute's bits at bf16 too (model_net.h), as do 1 and 3 threads. GQA
 * with q/k/v biases and a tied head; head_dim != dim/heads and an untied
 * head (the attention's gradients in buffers of their own). */
static void test_bf16_near_fp32(void **state)
{
	(void)state;
	static const char *models[] = {
		"llama:layers=2,dim=32,heads=4,kv-heads=2,ffn=48,vocab=37,ctx=80,bias=1",
		"llama:layers=2,dim=48,heads=4,kv-heads=2,head-dim=16,ffn=40,vocab=41,ctx=80,"
		"tied=0,rope-scaling=llama3:8:1:4:16",
	};
	for (unsigned i = 0; i < sizeof(models) / sizeof(models[0]); i++) {
		struct st_model_config cfg;
		struct net n;
		assert_int_equal(st_model_config_parse(models[i], &cfg), 0);
		net_init(&n, &cfg, 2, 40, 21);
		randomise(&n);
		for (int j = 0; j < n.B * n.T; j++) {
			n.tok[j] = (int32_t)(rng_u64() % cfg.vocab);
			n.tgt[j] = (int32_t)(rng_u64() % cfg.vocab);
		}
		float **g32 = calloc(n.U, sizeof(float *)), **g16 = calloc(n.U, sizeof(float *));
		for (int u = 0; u < n.U; u++) {
			size_t e = st_model_unit_layout(n.m, u)->elems;
			for (size_t k = 0; k < e; k++)
				n.p[u][k] = st_cpu_f32_from_bf16(st_cpu_bf16_from_f32(n.p[u][k]));
		}
		float l32 = net_fwd(&n);
		assert_true(net_bwd(&n) == l32);
		for (int u = 0; u < n.U; u++) {
			size_t e = st_model_unit_layout(n.m, u)->elems;
			g32[u] = malloc(e * sizeof(float));
			memcpy(g32[u], n.g[u], e * sizeof(float));
			/* W as the engine gives it at bf16: the unit's bf16 buffer */
			uint16_t *w = malloc(e * sizeof(uint16_t));
			st_cpu_f32_to_bf16(w, n.p[u], e);
			memset(n.p[u], 0, e * sizeof(float));
			memcpy(n.p[u], w, e * sizeof(uint16_t));
			free(w);
		}
		assert_int_equal(st_model_set_precision(n.m, ST_PRECISION_BF16), 0);
		assert_int_equal(st_model_precision_check(n.m), 0);
		float l16 = net_fwd(&n);
		assert_true(net_bwd(&n) == l16);
		print_message("%s: loss fp32 %.7f bf16 %.7f\n", models[i], l32, l16);
		assert_true(fabsf(l16 - l32) <= 0.01f * l32);
		assert_true(l16 != l32);
		for (int u = 0; u < n.U; u++) {
			size_t e = st_model_unit_layout(n.m, u)->elems;
			double r = rel_l2(n.g[u], g32[u], e);
			print_message("  unit %d: gradient rel L2 %.2e\n", u, r);
			assert_true(r < 0.05);
			assert_true(r > 0);
			g16[u] = malloc(e * sizeof(float));
			memcpy(g16[u], n.g[u], e * sizeof(float));
		}
		for (int th = 1; th <= 3; th += 2) {
			int was = omp_get_max_threads();
			omp_set_num_threads(th);
			assert_true(net_fwd(&n) == l16);
			assert_true(net_bwd(&n) == l16);
			omp_set_num_threads(was);
			for (int u = 0; u < n.U; u++)
				assert_memory_equal(n.g[u], g16[u],
						    st_model_unit_layout(n.m, u)->elems * sizeof(float));
		}
		net_saved_matches(&n);
		for (int u = 0; u < n.U; u++) {
			free(g32[u]);
			free(g16[u]);
		}
		free(g32);
		free(g16);
		net_fini(&n);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_presets),
		cmocka_unit_test(test_dims),
		cmocka_unit_test(test_hf_config),
		cmocka_unit_test(test_layout),
		cmocka_unit_test(test_kernels_ref),
		cmocka_unit_test(test_rope_ref),
		cmocka_unit_test(test_gqa_ref),
		cmocka_unit_test(test_gradients_gqa_bias),
		cmocka_unit_test(test_gradients_untied),
		cmocka_unit_test(test_determinism),
		cmocka_unit_test(test_saved_forward),
		cmocka_unit_test(test_bf16_near_fp32),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

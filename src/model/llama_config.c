/* strata: the LLaMA family's config: presets with the shapes of the
 * released models, --model's dimensions, the check, and Hugging Face's
 * config.json (LlamaConfig's and Qwen2Config's fields). */
#include "llama.h"

#include "strata/rope.h"

#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The released models' config.json, field for field: hidden_size,
 * intermediate_size, num_hidden_layers, num_attention_heads,
 * num_key_value_heads, vocab_size, max_position_embeddings, head_dim,
 * tie_word_embeddings, (Qwen2's q/k/v biases), rms_norm_eps, rope_theta,
 * rope_scaling. */
#define LL(L, C, H, K, F, V, T, hd, untie, bias, eps, theta)                              \
	{ .n_layer = L, .dim = C, .n_head = H, .n_kv_head = K, .ffn_dim = F, .vocab = V, \
	  .ctx = T, .head_dim = hd, .untied = untie, .qkv_bias = bias, .norm_eps = eps,   \
	  .rope_theta = theta, .rope_type = ST_ROPE_DEFAULT }
#define LLAMA3(factor) .rope_type = ST_ROPE_LLAMA3, .rope_factor = factor,              \
	.rope_low_freq_factor = 1.0, .rope_high_freq_factor = 4.0, .rope_original_ctx = 8192

static struct {
	const char *name;
	struct st_model_config cfg;
} st_presets[] = {
	{ "smollm2-135m", LL(30, 576, 9, 3, 1536, 49152, 8192, 64, false, false, 1e-5, 100000) },
	{ "smollm2-360m", LL(32, 960, 15, 5, 2560, 49152, 8192, 64, false, false, 1e-5, 100000) },
	{ "smollm2-1.7b", LL(24, 2048, 32, 32, 8192, 49152, 8192, 64, false, false, 1e-5, 130000) },
	{ "tinyllama-1.1b", LL(22, 2048, 32, 4, 5632, 32000, 2048, 64, true, false, 1e-5, 10000) },
	{ "llama3.2-1b", LL(16, 2048, 32, 8, 8192, 128256, 131072, 64, false, false, 1e-5, 500000) },
	{ "llama3.2-3b", LL(28, 3072, 24, 8, 8192, 128256, 131072, 128, false, false, 1e-5, 500000) },
	{ "llama3.1-8b", LL(32, 4096, 32, 8, 14336, 128256, 131072, 128, true, false, 1e-5, 500000) },
	{ "llama3.1-70b", LL(80, 8192, 64, 8, 28672, 128256, 131072, 128, true, false, 1e-5, 500000) },
	{ "qwen2.5-0.5b", LL(24, 896, 14, 2, 4864, 151936, 32768, 64, false, true, 1e-6, 1000000) },
	{ "qwen2.5-7b", LL(28, 3584, 28, 4, 18944, 152064, 32768, 128, true, true, 1e-6, 1000000) },
};

/* The llama3 rope scaling of the Llama 3.1 and 3.2 models. */
static void llama_preset_fixup(struct st_model_config *c, const char *name)
{
	if (strncmp(name, "llama3.2-", 9) == 0) {
		struct st_model_config s = { LLAMA3(32.0) };
		c->rope_type = s.rope_type;
		c->rope_factor = s.rope_factor;
		c->rope_low_freq_factor = s.rope_low_freq_factor;
		c->rope_high_freq_factor = s.rope_high_freq_factor;
		c->rope_original_ctx = s.rope_original_ctx;
	} else if (strncmp(name, "llama3.1-", 9) == 0) {
		struct st_model_config s = { LLAMA3(8.0) };
		c->rope_type = s.rope_type;
		c->rope_factor = s.rope_factor;
		c->rope_low_freq_factor = s.rope_low_freq_factor;
		c->rope_high_freq_factor = s.rope_high_freq_factor;
		c->rope_original_ctx = s.rope_original_ctx;
	}
}

int st_llama_config_preset(const char *name, struct st_model_config *out)
{
	for (size_t i = 0; i < ST_ARRAY_LEN(st_presets); i++) {
		if (strcmp(name, st_presets[i].name) == 0) {
			*out = st_presets[i].cfg;
			llama_preset_fixup(out, name);
			return 0;
		}
	}
	return -ENOENT;
}

/* Limits keep every B*T*F product and tensor offset far from overflow. */
#define ST_MAX_DIM (1 << 16)
#define ST_MAX_FFN (1 << 18)
#define ST_MAX_CTX (1 << 20)
#define ST_MAX_VOCAB (1 << 24)
#define ST_MAX_LAYERS 4096
#define ST_MAX_HEAD_DIM 2048

int st_llama_config_check(const struct st_model_config *c)
{
	if (c->n_layer < 1 || c->n_layer > ST_MAX_LAYERS)
		return st_error_set(-EINVAL, "model: layers must be in 1..%d, got %d",
				    ST_MAX_LAYERS, c->n_layer);
	if (c->dim < 1 || c->dim > ST_MAX_DIM)
		return st_error_set(-EINVAL, "model: dim must be in 1..%d, got %d", ST_MAX_DIM,
				    c->dim);
	if (c->n_head < 1 || c->n_head > c->dim)
		return st_error_set(-EINVAL, "model: heads must be in 1..dim (%d), got %d", c->dim,
				    c->n_head);
	if (c->n_kv_head < 1 || c->n_head % c->n_kv_head)
		return st_error_set(-EINVAL, "model: kv-heads (%d) must be >= 1 and divide heads "
				    "(%d)", c->n_kv_head, c->n_head);
	if (!c->head_dim && c->dim % c->n_head)
		return st_error_set(-EINVAL, "model: heads (%d) must divide dim (%d) when "
				    "head-dim is not given", c->n_head, c->dim);
	int hd = st_llama_head_dim(c);
	if (hd < 2 || hd % 2 || hd > ST_MAX_HEAD_DIM)
		return st_error_set(-EINVAL, "model: head-dim must be even and in 2..%d, got %d",
				    ST_MAX_HEAD_DIM, hd);
	if ((int64_t)c->n_head * hd > ST_MAX_DIM)
		return st_error_set(-EINVAL, "model: heads x head-dim (%lld) must be at most %d",
				    (long long)c->n_head * hd, ST_MAX_DIM);
	if (c->ffn_dim < 1 || c->ffn_dim > ST_MAX_FFN)
		return st_error_set(-EINVAL, "model: ffn must be in 1..%d, got %d", ST_MAX_FFN,
				    c->ffn_dim);
	if (c->vocab < 1 || c->vocab > ST_MAX_VOCAB)
		return st_error_set(-EINVAL, "model: vocab must be in 1..%d, got %d",
				    ST_MAX_VOCAB, c->vocab);
	if (c->ctx < 1 || c->ctx > ST_MAX_CTX)
		return st_error_set(-EINVAL, "model: ctx must be in 1..%d, got %d", ST_MAX_CTX,
				    c->ctx);
	if (!(c->norm_eps > 0.0 && c->norm_eps < 1.0))
		return st_error_set(-EINVAL, "model: eps must be in (0,1), got %g", c->norm_eps);
	if (!(c->rope_theta > 1.0 && c->rope_theta < 1e12))
		return st_error_set(-EINVAL, "model: rope-theta must be in (1,1e12), got %g",
				    c->rope_theta);
	if (c->qkv_bias && hd * c->n_head != c->dim)
		return st_error_set(-EINVAL, "model: q/k/v biases (Qwen2) need heads x head-dim "
				    "(%d) = dim (%d)", hd * c->n_head, c->dim);
	switch (c->rope_type) {
	case ST_ROPE_DEFAULT:
		if (c->rope_factor || c->rope_low_freq_factor || c->rope_high_freq_factor ||
		    c->rope_original_ctx)
			return st_error_set(-EINVAL, "model: rope scaling factors without a "
					    "scaling type");
		break;
	case ST_ROPE_LINEAR:
		if (!(c->rope_factor >= 1.0 && c->rope_factor < 1e6))
			return st_error_set(-EINVAL, "model: the linear rope factor must be in "
					    "[1,1e6), got %g", c->rope_factor);
		if (c->rope_low_freq_factor || c->rope_high_freq_factor || c->rope_original_ctx)
			return st_error_set(-EINVAL, "model: linear rope scaling has a factor "
					    "only");
		break;
	case ST_ROPE_LLAMA3:
		if (!(c->rope_factor >= 1.0 && c->rope_factor < 1e6) ||
		    !(c->rope_low_freq_factor > 0.0) ||
		    !(c->rope_high_freq_factor > c->rope_low_freq_factor) ||
		    c->rope_original_ctx < 1 || c->rope_original_ctx > ST_MAX_CTX)
			return st_error_set(-EINVAL, "model: llama3 rope scaling needs factor >= 1, "
					    "0 < low < high and an original ctx in 1..%d",
					    ST_MAX_CTX);
		break;
	default:
		return st_error_set(-EINVAL, "model: rope type %d unknown", c->rope_type);
	}
	return 0;
}

/* ---- --model's dimensions ------------------------------------------------------ */

enum { K_LAYERS, K_DIM, K_HEADS, K_KV, K_FFN, K_VOCAB, K_CTX, K_REQUIRED,
       K_HEAD_DIM = K_REQUIRED, K_THETA, K_TIED, K_BIAS, K_EPS, K_SCALING, K_COUNT };
static const char *const st_keys[K_COUNT] = {
	"layers", "dim", "heads", "kv-heads", "ffn", "vocab", "ctx",
	"head-dim", "rope-theta", "tied", "bias", "eps", "rope-scaling",
};

static int parse_num(const char *s, size_t len, double *out)
{
	char buf[64], *end;
	if (len == 0 || len >= sizeof(buf))
		return -EINVAL;
	memcpy(buf, s, len);
	buf[len] = '\0';
	if (strspn(buf, "0123456789.eE+-") != len)
		return -EINVAL;
	*out = strtod(buf, &end);
	return *end || !isfinite(*out) ? -EINVAL : 0;
}

/* "linear:F" or "llama3:F:LOW:HIGH:ORIG" */
static int parse_scaling(const char *s, size_t len, struct st_model_config *c)
{
	char buf[128];
	double v[4] = { 0 };
	int n = 0;
	if (len >= sizeof(buf))
		return -EINVAL;
	memcpy(buf, s, len);
	buf[len] = '\0';
	char *save = NULL, *tok = strtok_r(buf, ":", &save);
	if (!tok)
		return -EINVAL;
	int type = !strcmp(tok, "linear") ? ST_ROPE_LINEAR : !strcmp(tok, "llama3") ? ST_ROPE_LLAMA3 : -1;
	if (type < 0)
		return -EINVAL;
	while ((tok = strtok_r(NULL, ":", &save)) != NULL) {
		if (n == 4 || parse_num(tok, strlen(tok), &v[n]))
			return -EINVAL;
		n++;
	}
	if (n != (type == ST_ROPE_LINEAR ? 1 : 4))
		return -EINVAL;
	c->rope_type = type;
	c->rope_factor = v[0];
	if (type == ST_ROPE_LLAMA3) {
		c->rope_low_freq_factor = v[1];
		c->rope_high_freq_factor = v[2];
		if (v[3] != floor(v[3]) || v[3] < 1 || v[3] > ST_MAX_CTX)
			return -EINVAL;
		c->rope_original_ctx = (int)v[3];
	}
	return 0;
}

int st_llama_config_parse(const char *text, struct st_model_config *out)
{
	int vals[K_COUNT] = { 0 }, seen[K_COUNT] = { 0 };
	struct st_model_config c = { .norm_eps = 1e-5, .rope_theta = 10000.0, .untied = true };
	const char *p = text;
	while (*p) {
		const char *comma = strchr(p, ',');
		size_t item_len = comma ? (size_t)(comma - p) : strlen(p);
		const char *eq = memchr(p, '=', item_len);
		if (!eq)
			return st_error_set(-EINVAL, "model: '%.*s' in '%s' is not key=value",
					    (int)item_len, p, text);
		size_t key_len = (size_t)(eq - p), vlen = item_len - key_len - 1;
		const char *val = eq + 1;
		int k = -1;
		for (int i = 0; i < K_COUNT; i++)
			if (strlen(st_keys[i]) == key_len && !strncmp(p, st_keys[i], key_len))
				k = i;
		if (k < 0)
			return st_error_set(-EINVAL,
					    "model: unknown key '%.*s' in '%s' (keys: layers, dim, "
					    "heads, kv-heads, ffn, vocab, ctx; optional head-dim, "
					    "rope-theta, tied, bias, eps, rope-scaling)",
					    (int)key_len, p, text);
		if (seen[k])
			return st_error_set(-EINVAL, "model: key '%s' given twice in '%s'",
					    st_keys[k], text);
		seen[k] = 1;
		int bad = 0;
		double d = 0;
		if (k == K_THETA || k == K_EPS) {
			bad = parse_num(val, vlen, &d);
			if (k == K_THETA)
				c.rope_theta = d;
			else
				c.norm_eps = d;
		} else if (k == K_TIED || k == K_BIAS) {
			bad = vlen != 1 || (val[0] != '0' && val[0] != '1');
			if (!bad && k == K_TIED)
				c.untied = val[0] == '0';
			if (!bad && k == K_BIAS)
				c.qkv_bias = val[0] == '1';
		} else if (k == K_SCALING) {
			if (parse_scaling(val, vlen, &c))
				return st_error_set(-EINVAL, "model: rope-scaling needs linear:FACTOR "
						    "or llama3:FACTOR:LOW:HIGH:ORIGINAL_CTX, got "
						    "'%.*s'", (int)vlen, val);
		} else {
			bad = st_family_parse_posint(val, vlen, &vals[k]) || vals[k] < 1;
		}
		if (bad)
			return st_error_set(-EINVAL, "model: '%s' needs %s, got '%.*s'", st_keys[k],
					    k == K_TIED || k == K_BIAS ? "0 or 1" :
					    k == K_THETA || k == K_EPS ? "a number" :
					    "a positive integer", (int)vlen, val);
		if (!comma)
			break;
		p = comma + 1;
		if (!*p)
			return st_error_set(-EINVAL, "model: trailing ',' in '%s'", text);
	}
	for (int i = 0; i < K_REQUIRED; i++)
		if (!seen[i])
			return st_error_set(-EINVAL, "model: '%s' lacks key '%s' (need layers, dim, "
					    "heads, kv-heads, ffn, vocab, ctx)", text, st_keys[i]);
	c.n_layer = vals[K_LAYERS];
	c.dim = vals[K_DIM];
	c.n_head = vals[K_HEADS];
	c.n_kv_head = vals[K_KV];
	c.ffn_dim = vals[K_FFN];
	c.vocab = vals[K_VOCAB];
	c.ctx = vals[K_CTX];
	c.head_dim = seen[K_HEAD_DIM] ? vals[K_HEAD_DIM] : 0;
	int err = st_llama_config_check(&c);
	if (err)
		return err;
	c.head_dim = st_llama_head_dim(&c);
	*out = c;
	return 0;
}

/* d in its shortest form that reads back exactly (1e-05, 500000.0, not
 * 1.0000000000000001e-05 or 5e+05). */
static void llama_fmt_double(char *buf, size_t bytes, double d)
{
	if (d == floor(d) && fabs(d) < 1e15) {
		snprintf(buf, bytes, "%.1f", d);
		return;
	}
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(buf, bytes, "%.*g", prec, d);
		if (strtod(buf, NULL) == d)
			return;
	}
}

void st_llama_config_format(const struct st_model_config *c, char *buf, size_t bytes)
{
	char th[40], eps[40], f[40], lo[40], hi[40];
	llama_fmt_double(th, sizeof(th), c->rope_theta);
	llama_fmt_double(eps, sizeof(eps), c->norm_eps);
	llama_fmt_double(f, sizeof(f), c->rope_factor);
	llama_fmt_double(lo, sizeof(lo), c->rope_low_freq_factor);
	llama_fmt_double(hi, sizeof(hi), c->rope_high_freq_factor);
	int n = snprintf(buf, bytes,
			 "layers=%d,dim=%d,heads=%d,kv-heads=%d,ffn=%d,vocab=%d,ctx=%d,"
			 "head-dim=%d,rope-theta=%s,tied=%d,bias=%d,eps=%s",
			 c->n_layer, c->dim, c->n_head, c->n_kv_head, c->ffn_dim, c->vocab,
			 c->ctx, st_llama_head_dim(c), th, !c->untied, c->qkv_bias, eps);
	if (n < 0 || (size_t)n >= bytes)
		return;
	if (c->rope_type == ST_ROPE_LINEAR)
		snprintf(buf + n, bytes - (size_t)n, ",rope-scaling=linear:%s", f);
	else if (c->rope_type == ST_ROPE_LLAMA3)
		snprintf(buf + n, bytes - (size_t)n, ",rope-scaling=llama3:%s:%s:%s:%d", f, lo, hi,
			 c->rope_original_ctx);
}

void st_llama_config_describe(const struct st_model_config *c, char *buf, size_t bytes)
{
	char rope[96];
	if (c->rope_type == ST_ROPE_LINEAR)
		snprintf(rope, sizeof(rope), ", linear x%g", c->rope_factor);
	else if (c->rope_type == ST_ROPE_LLAMA3)
		snprintf(rope, sizeof(rope), ", llama3 x%g", c->rope_factor);
	else
		rope[0] = '\0';
	snprintf(buf, bytes,
		 "LLaMA%s, %d layers, dim %d, %d heads (%d kv, head dim %d), ffn %d, vocab %d, "
		 "ctx %d, rope theta %g%s, %s head",
		 c->qkv_bias ? " (q/k/v biases)" : "", c->n_layer, c->dim, c->n_head,
		 c->n_kv_head, st_llama_head_dim(c), c->ffn_dim, c->vocab, c->ctx, c->rope_theta,
		 rope, c->untied ? "untied" : "tied");
}

int st_llama_config_fields(const struct st_model_config *c, struct st_config_field *out)
{
	int n = 0;
	out[n++] = (struct st_config_field){ "num_hidden_layers", c->n_layer };
	out[n++] = (struct st_config_field){ "hidden_size", c->dim };
	out[n++] = (struct st_config_field){ "num_attention_heads", c->n_head };
	out[n++] = (struct st_config_field){ "num_key_value_heads", c->n_kv_head };
	out[n++] = (struct st_config_field){ "head_dim", st_llama_head_dim(c) };
	out[n++] = (struct st_config_field){ "intermediate_size", c->ffn_dim };
	out[n++] = (struct st_config_field){ "vocab_size", c->vocab };
	out[n++] = (struct st_config_field){ "max_position_embeddings", c->ctx };
	out[n++] = (struct st_config_field){ "tie_word_embeddings", !c->untied };
	return n;
}

/* ---- config.json ----------------------------------------------------------- */

static const char *const st_archs[] = { "LlamaForCausalLM", "Qwen2ForCausalLM",
					 "MistralForCausalLM" };

static int get_int(const char *path, struct json_object *root, const char *key,
		   bool required, int64_t def, int64_t max, int *out)
{
	struct json_object *v = NULL;
	int64_t x = def;

	if (json_object_object_get_ex(root, key, &v) && !json_object_is_type(v, json_type_null)) {
		if (!json_object_is_type(v, json_type_int))
			return st_error_set(-EINVAL, "%s: \"%s\" is not an integer", path, key);
		x = json_object_get_int64(v);
	} else if (required) {
		return st_error_set(-EINVAL, "%s: missing \"%s\"", path, key);
	}
	if (x < 1 || x > max)
		return st_error_set(-EINVAL, "%s: %s is %lld, expected 1..%lld", path, key,
				    (long long)x, (long long)max);
	*out = (int)x;
	return 0;
}

static int get_num(const char *path, struct json_object *root, const char *key,
		   double def, double *out)
{
	struct json_object *v = NULL;

	*out = def;
	if (!json_object_object_get_ex(root, key, &v) || json_object_is_type(v, json_type_null))
		return 0;
	if (!json_object_is_type(v, json_type_double) && !json_object_is_type(v, json_type_int))
		return st_error_set(-EINVAL, "%s: \"%s\" is not a number", path, key);
	*out = json_object_get_double(v);
	return 0;
}

static int get_bool(const char *path, struct json_object *root, const char *key,
		    bool def, bool *out)
{
	struct json_object *v = NULL;

	*out = def;
	if (!json_object_object_get_ex(root, key, &v) || json_object_is_type(v, json_type_null))
		return 0;
	if (!json_object_is_type(v, json_type_boolean))
		return st_error_set(-EINVAL, "%s: \"%s\" is not true or false", path, key);
	*out = json_object_get_boolean(v);
	return 0;
}

static int read_scaling(const char *path, struct json_object *root,
			struct st_model_config *c)
{
	struct json_object *rs = NULL, *v = NULL;
	const char *type;

	if (!json_object_object_get_ex(root, "rope_scaling", &rs) ||
	    json_object_is_type(rs, json_type_null))
		return 0;
	if (!json_object_is_type(rs, json_type_object))
		return st_error_set(-EINVAL, "%s: \"rope_scaling\" is not an object", path);
	if (!json_object_object_get_ex(rs, "rope_type", &v) &&
	    !json_object_object_get_ex(rs, "type", &v))
		return st_error_set(-EINVAL, "%s: rope_scaling has no \"rope_type\"", path);
	if (!json_object_is_type(v, json_type_string))
		return st_error_set(-EINVAL, "%s: rope_scaling.rope_type is not a string", path);
	type = json_object_get_string(v);
	if (strcmp(type, "default") == 0)
		return 0;
	c->rope_type = !strcmp(type, "linear") ? ST_ROPE_LINEAR :
		       !strcmp(type, "llama3") ? ST_ROPE_LLAMA3 : -1;
	if (c->rope_type < 0)
		return st_error_set(-EINVAL, "%s: rope_scaling.rope_type \"%s\" is not one strata "
				    "computes (default, linear, llama3)", path, type);
	int err = get_num(path, rs, "factor", 0.0, &c->rope_factor);
	if (!err && c->rope_type == ST_ROPE_LLAMA3) {
		err = get_num(path, rs, "low_freq_factor", 0.0, &c->rope_low_freq_factor);
		if (!err)
			err = get_num(path, rs, "high_freq_factor", 0.0,
				      &c->rope_high_freq_factor);
		if (!err)
			err = get_int(path, rs, "original_max_position_embeddings", true, 0,
				      ST_MAX_CTX, &c->rope_original_ctx);
	}
	return err;
}

/* A Mistral is a LLaMA (the same tensors, names and attention) when its
 * sliding window covers the whole context: sliding_window null, absent, or
 * at least max_position_embeddings (ctx). A shorter window is attention
 * strata does not compute: refused, saying so. */
static int mistral_window(const char *path, struct json_object *root, int ctx)
{
	struct json_object *v = NULL;
	int64_t win;

	if (!json_object_object_get_ex(root, "sliding_window", &v) || !v)
		return 0;
	if (!json_object_is_type(v, json_type_int) || (win = json_object_get_int64(v)) <= 0)
		return st_error_set(-EINVAL, "%s: sliding_window %s: expected null or a positive "
				    "whole number", path, json_object_to_json_string(v));
	if (win >= ctx)
		return 0;
	return st_error_set(-EINVAL, "%s: model_type mistral with sliding_window %lld, shorter "
			    "than max_position_embeddings %d: strata's attention has no sliding "
			    "window (a Mistral whose sliding_window is null, absent or >= the "
			    "context is read as llama; set max_position_embeddings to %lld to "
			    "train it within one window)", path, (long long)win, ctx, (long long)win);
}

int st_llama_hf_config_read(const char *path, struct json_object *root,
			    struct st_model_config *out)
{
	struct st_model_config c = { 0 };
	struct json_object *v = NULL;
	const char *type = "llama";
	bool qwen, attn_bias = false, mlp_bias = false, sliding = false;
	int err = 0;

	if (json_object_object_get_ex(root, "model_type", &v) &&
	    json_object_is_type(v, json_type_string))
		type = json_object_get_string(v);
	if (json_object_object_get_ex(root, "architectures", &v) &&
	    json_object_is_type(v, json_type_array) && json_object_array_length(v) > 0) {
		struct json_object *a = json_object_array_get_idx(v, 0);
		const char *arch = json_object_is_type(a, json_type_string) ?
					   json_object_get_string(a) : "?";
		bool known = false;
		for (size_t i = 0; i < ST_ARRAY_LEN(st_archs); i++)
			known |= strcmp(arch, st_archs[i]) == 0;
		if (!known)
			return st_error_set(-EINVAL, "%s: architectures \"%s\" is not one strata "
					    "trains (LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM)", path,
					    arch);
		if (!json_object_object_get_ex(root, "model_type", NULL))
			type = strcmp(arch, "Qwen2ForCausalLM") == 0	 ? "qwen2"
			       : strcmp(arch, "MistralForCausalLM") == 0 ? "mistral"
									 : "llama";
	}
	qwen = strcmp(type, "qwen2") == 0;
	if (json_object_object_get_ex(root, "hidden_act", &v) &&
	    (!json_object_is_type(v, json_type_string) ||
	     strcmp(json_object_get_string(v), "silu") != 0))
		return st_error_set(-EINVAL, "%s: hidden_act %s; strata's LLaMA uses silu (SwiGLU)",
				    path, json_object_to_json_string(v));
	err = get_int(path, root, "hidden_size", true, 0, ST_MAX_DIM, &c.dim);
	if (!err)
		err = get_int(path, root, "intermediate_size", true, 0, ST_MAX_FFN, &c.ffn_dim);
	if (!err)
		err = get_int(path, root, "num_hidden_layers", true, 0, ST_MAX_LAYERS,
			      &c.n_layer);
	if (!err)
		err = get_int(path, root, "num_attention_heads", true, 0, ST_MAX_DIM, &c.n_head);
	if (!err)
		err = get_int(path, root, "num_key_value_heads", false, c.n_head, ST_MAX_DIM,
			      &c.n_kv_head);
	if (!err)
		err = get_int(path, root, "vocab_size", true, 0, ST_MAX_VOCAB, &c.vocab);
	if (!err)
		err = get_int(path, root, "max_position_embeddings", true, 0, ST_MAX_CTX,
			      &c.ctx);
	if (!err && c.dim % c.n_head == 0)
		err = get_int(path, root, "head_dim", false, c.dim / c.n_head,
			      ST_MAX_HEAD_DIM, &c.head_dim);
	else if (!err)
		err = get_int(path, root, "head_dim", true, 0, ST_MAX_HEAD_DIM, &c.head_dim);
	if (!err)
		err = get_num(path, root, "rms_norm_eps", 1e-6, &c.norm_eps);
	if (!err)
		err = get_num(path, root, "rope_theta", 10000.0, &c.rope_theta);
	if (!err)
		err = get_bool(path, root, "tie_word_embeddings", false, &c.untied);
	c.untied = !c.untied;
	if (!err)
		err = get_bool(path, root, "attention_bias", false, &attn_bias);
	if (!err)
		err = get_bool(path, root, "mlp_bias", false, &mlp_bias);
	if (!err)
		err = get_bool(path, root, "use_sliding_window", false, &sliding);
	if (!err)
		err = read_scaling(path, root, &c);
	if (err)
		return err;
	if (attn_bias && !qwen)
		return st_error_set(-EINVAL, "%s: attention_bias true (an o_proj bias) is not a "
				    "LLaMA strata computes", path);
	if (mlp_bias)
		return st_error_set(-EINVAL, "%s: mlp_bias true is not a LLaMA strata computes",
				    path);
	if (sliding)
		return st_error_set(-EINVAL, "%s: use_sliding_window true is not attention strata "
				    "computes", path);
	if (strcmp(type, "mistral") == 0 && (err = mistral_window(path, root, c.ctx)))
		return err;
	c.qkv_bias = qwen; /* Qwen2's q/k/v projections always have biases */
	if (st_llama_config_check(&c))
		return st_error_set(-EINVAL, "%s: %s", path, st_error_last());
	*out = c;
	return 0;
}

/* Attach val, or drop it and note the failure (out of memory). */
static void hf_add(struct json_object *obj, const char *key, struct json_object *val,
		   bool *oom)
{
	if (*oom || !obj || !val || json_object_object_add(obj, key, val)) {
		json_object_put(val);
		*oom = true;
	}
}

static struct json_object *json_double(double d)
{
	char buf[40];

	llama_fmt_double(buf, sizeof(buf), d);
	return json_object_new_double_s(d, buf);
}

int st_llama_hf_config_write(const char *path, const struct st_model_config *c,
			     struct json_object *root)
{
	const bool qwen = c->qkv_bias;
	struct json_object *arch;
	bool oom = false;

	if (st_llama_config_check(c))
		return st_error_set(-EINVAL, "%s: %s", path, st_error_last());
	/* q/k/v biases without an o_proj bias are Qwen2's model; without them
	 * LlamaForCausalLM */
	arch = json_object_new_array();
	if (!arch || json_object_array_add(arch, json_object_new_string(
						 qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM")))
		oom = true;
	hf_add(root, "architectures", arch, &oom);
	hf_add(root, "model_type", json_object_new_string(qwen ? "qwen2" : "llama"), &oom);
	hf_add(root, "hidden_size", json_object_new_int64(c->dim), &oom);
	hf_add(root, "intermediate_size", json_object_new_int64(c->ffn_dim), &oom);
	hf_add(root, "num_hidden_layers", json_object_new_int64(c->n_layer), &oom);
	hf_add(root, "num_attention_heads", json_object_new_int64(c->n_head), &oom);
	hf_add(root, "num_key_value_heads", json_object_new_int64(c->n_kv_head), &oom);
	if (!qwen)
		hf_add(root, "head_dim", json_object_new_int64(st_llama_head_dim(c)), &oom);
	hf_add(root, "vocab_size", json_object_new_int64(c->vocab), &oom);
	hf_add(root, "max_position_embeddings", json_object_new_int64(c->ctx), &oom);
	hf_add(root, "hidden_act", json_object_new_string("silu"), &oom);
	hf_add(root, "rms_norm_eps", json_double(c->norm_eps), &oom);
	hf_add(root, "rope_theta", json_double(c->rope_theta), &oom);
	if (c->rope_type == ST_ROPE_DEFAULT) {
		/* a NULL value is JSON null */
		if (!oom && json_object_object_add(root, "rope_scaling", NULL))
			oom = true;
	} else {
		struct json_object *rs = json_object_new_object();
		bool l3 = c->rope_type == ST_ROPE_LLAMA3;
		hf_add(rs, "rope_type", json_object_new_string(l3 ? "llama3" : "linear"), &oom);
		hf_add(rs, "factor", json_double(c->rope_factor), &oom);
		if (l3) {
			hf_add(rs, "low_freq_factor",
			       json_double(c->rope_low_freq_factor), &oom);
			hf_add(rs, "high_freq_factor",
			       json_double(c->rope_high_freq_factor), &oom);
			hf_add(rs, "original_max_position_embeddings",
			       json_object_new_int64(c->rope_original_ctx), &oom);
		}
		hf_add(root, "rope_scaling", rs, &oom);
	}
	hf_add(root, "tie_word_embeddings", json_object_new_boolean(!c->untied), &oom);
	if (qwen) {
		hf_add(root, "use_sliding_window", json_object_new_boolean(0), &oom);
	} else {
		hf_add(root, "attention_bias", json_object_new_boolean(0), &oom);
		hf_add(root, "mlp_bias", json_object_new_boolean(0), &oom);
	}
	hf_add(root, "initializer_range", json_double(0.02), &oom);
	return oom ? -ENOMEM : 0;
}

/* Everything strata cannot compute is refused by hf_config_read already. */
int st_llama_hf_config_check(const char *path, struct json_object *root)
{
	struct st_model_config c;

	return st_llama_hf_config_read(path, root, &c);
}

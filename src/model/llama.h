/* strata: the LLaMA family's two halves, internal to src/model: its config
 * code (llama_config.c) and its math (llama.c), joined in st_family_llama. */
#ifndef STRATA_MODEL_LLAMA_H
#define STRATA_MODEL_LLAMA_H

#include "strata/compute.h"
#include "strata/family.h"

extern const struct st_family_ops st_family_llama;

/* Channels per head of a checked config. */
static inline int st_llama_head_dim(const struct st_model_config *c)
{
	return c->head_dim ? c->head_dim : c->dim / c->n_head;
}

/* Slots of a decoder layer's tensors; the biases exist with qkv_bias. */
enum {
	LT_IN_NORM,
	LT_Q_W,
	LT_Q_B,
	LT_K_W,
	LT_K_B,
	LT_V_W,
	LT_V_B,
	LT_O_W,
	LT_POST_NORM,
	LT_GATE_W,
	LT_UP_W,
	LT_DOWN_W,
	LT_COUNT,
};
enum { HT_NORM, HT_LM_HEAD };

/* Shapes of a config. */
struct st_dims {
	int L, C, H, K, hd, F, V, Q, KV; /* Q = H hd, KV = K hd */
};

static inline struct st_dims st_dims_of(const struct st_model_config *c)
{
	struct st_dims d = { .L = c->n_layer, .C = c->dim, .H = c->n_head, .K = c->n_kv_head,
			     .hd = st_llama_head_dim(c), .F = c->ffn_dim, .V = c->vocab };
	d.Q = d.H * d.hd;
	d.KV = d.K * d.hd;
	return d;
}

/* The rotation's parameters of a config. */
static inline struct st_rope_args st_rope_of(const struct st_model_config *c)
{
	return (struct st_rope_args){ .type = c->rope_type,
				      .original_ctx = c->rope_original_ctx,
				      .theta = (float)c->rope_theta,
				      .factor = (float)c->rope_factor,
				      .low_freq_factor = (float)c->rope_low_freq_factor,
				      .high_freq_factor = (float)c->rope_high_freq_factor };
}

int st_llama_config_preset(const char *name, struct st_model_config *out);
int st_llama_config_parse(const char *text, struct st_model_config *out);
int st_llama_config_check(const struct st_model_config *c);
void st_llama_config_format(const struct st_model_config *c, char *buf, size_t bytes);
void st_llama_config_describe(const struct st_model_config *c, char *buf, size_t bytes);
int st_llama_config_fields(const struct st_model_config *c, struct st_config_field *out);
int st_llama_hf_config_read(const char *path, struct json_object *root,
			    struct st_model_config *out);
int st_llama_hf_config_write(const char *path, const struct st_model_config *c,
			     struct json_object *root);
int st_llama_hf_config_check(const char *path, struct json_object *root);

#endif

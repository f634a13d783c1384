/* strata: the LLaMA family's two halves, internal to src/model: its config
 * code (llama_config.c) and its math (llama.c), joined in st_family_llama. */
#ifndef STRATA_MODEL_LLAMA_H
#define STRATA_MODEL_LLAMA_H

#include "strata/family.h"

extern const struct st_family_ops st_family_llama;

/* Channels per head of a checked config. */
static inline int st_llama_head_dim(const struct st_model_config *c)
{
	return c->head_dim ? c->head_dim : c->dim / c->n_head;
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

/* strata: the GPT-2 family's two halves, internal to src/model: its config
 * code (gpt2_config.c) and its math (gpt2.c), joined in st_family_gpt2. */
#ifndef STRATA_MODEL_GPT2_H
#define STRATA_MODEL_GPT2_H

#include "strata/family.h"

extern const struct st_family_ops st_family_gpt2;

int st_gpt2_config_preset(const char *name, struct st_model_config *out);
int st_gpt2_config_parse(const char *text, struct st_model_config *out);
int st_gpt2_config_check(const struct st_model_config *c);
void st_gpt2_config_format(const struct st_model_config *c, char *buf, size_t bytes);
void st_gpt2_config_describe(const struct st_model_config *c, char *buf, size_t bytes);
int st_gpt2_config_fields(const struct st_model_config *c, struct st_config_field *out);
int st_gpt2_hf_config_read(const char *path, struct json_object *root,
			   struct st_model_config *out);
int st_gpt2_hf_config_write(const char *path, const struct st_model_config *c,
			    struct json_object *root);
int st_gpt2_hf_config_check(const char *path, struct json_object *root);

#endif

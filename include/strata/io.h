/* strata: files. safetensors (strata/safetensors.h), token datasets and the
 * batch sampler (strata/dataset.h), and a GPT-2 config.json as Hugging Face
 * writes it next to model.safetensors. Formats: docs/formats.md. */
#ifndef STRATA_IO_H
#define STRATA_IO_H

#include "strata/common.h"
#include "strata/dataset.h"
#include "strata/safetensors.h"

/* The shape of a GPT-2, as the fields of Hugging Face's config.json. */
struct st_gpt2_config {
	int64_t n_embd;      /* C, channels */
	int64_t n_layer;     /* L, transformer blocks */
	int64_t n_head;      /* NH, heads; divides n_embd */
	int64_t vocab_size;  /* V */
	int64_t n_positions; /* maxT, context length */
};

/* Read path's n_embd, n_layer, n_head, vocab_size and n_positions (n_ctx
 * when n_positions is absent); other fields are ignored. Returns 0, -EINVAL
 * when the file is not a JSON object, a field is missing, not an integer,
 * not positive, or n_head does not divide n_embd (the detail names it), or
 * the errno of reading the file. */
int st_gpt2_config_read(const char *path, struct st_gpt2_config *out);

/* Write cfg as a config.json Hugging Face transformers loads as GPT-2
 * (model_type "gpt2", the five fields, n_ctx, and GPT-2's fixed
 * hyper-parameters), atomically. Returns 0, -EINVAL for a config that
 * st_gpt2_config_read() would refuse, or -errno. */
int st_gpt2_config_write(const char *path, const struct st_gpt2_config *cfg);

#endif

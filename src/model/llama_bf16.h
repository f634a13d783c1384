/* strata: LLaMA's bf16 compute path (llama_bf16.c), which llama.c's hooks
 * run when st_model_precision() is ST_PRECISION_BF16; internal to
 * src/model. The hooks' contracts are strata/family.h's. */
#ifndef STRATA_MODEL_LLAMA_BF16_H
#define STRATA_MODEL_LLAMA_BF16_H

#include "strata/family.h"

size_t st_llama_bf16_work_bytes(const struct st_model *m, int u, int B, int T);
size_t st_llama_bf16_saved_bytes(const struct st_model *m, int u, int B, int T,
				 size_t *scratch_bytes);
int st_llama_bf16_fwd_save(const struct st_model *m, int u, const struct st_model_batch *batch,
			   const float *params, const float *other, const float *x, float *y,
			   float *loss, void *saved, size_t saved_bytes, void *work,
			   size_t work_bytes);
int st_llama_bf16_bwd_saved(const struct st_model *m, int u,
			    const struct st_model_batch *batch, const float *params,
			    const float *other, const float *x, const float *dy, float *dx,
			    float *grad, float *other_grad, float *loss, void *saved,
			    size_t saved_bytes, void *work, size_t work_bytes);
int st_llama_bf16_logits(const struct st_model *m, const float *params, const float *other,
			 const float *x, float *logits, void *work, size_t work_bytes);

#endif

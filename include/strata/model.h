/* strata: models as lists of units (GPT-2).
 *
 * A model is a list of units, the grain of streaming:
 *   u = 0          the embedding   (wte.weight, wpe.weight)
 *   u = 1 .. L     block u-1       (h.{i}.ln_1 ... h.{i}.mlp.c_proj)
 *   u = L + 1      the head        (ln_f; its matmul uses wte, tied)
 * Each unit's parameters live in one flat buffer of `elems` values (bf16 or
 * fp32, the caller's choice): tensors sit at offsets that are multiples of
 * 64 elements and `elems` is a multiple of 2048, so the buffer is a whole
 * number of ST_PAGE_BYTES pages in either precision and can move as opaque
 * bytes. Padding is zero. Tensor names and shapes are Hugging Face GPT-2's
 * (Conv1D weights stored (in,out)), with no vocabulary padding.
 *
 * The model knows nothing about tiers: fwd and bwd are handed fp32 pointers
 * (a bf16 W is widened first, e.g. with st_compute_bf16_to_f32, once per
 * use) and a workspace sized by st_model_work_bytes(), all in the memory
 * of the model's compute (strata/compute.h; the cpu by default, set with
 * st_model_set_compute()), and run every op through that compute. Only each unit's input x[u] is kept
 * between the forward and the backward (the activation checkpoint): bwd(u)
 * recomputes the unit's forward from it inside the workspace.
 *
 * The tie: the head reads wte from the embedding unit's flat buffer (passed
 * as `tied`) and adds its share of dwte into the embedding unit's gradient
 * buffer (`tied_grad`), so dwte gathers both uses even when units stream
 * independently.
 *
 * Everything is deterministic: bit-identical results at any OpenMP thread
 * count. Functions return 0 or -errno (details in st_error_last()). */
#ifndef STRATA_MODEL_H
#define STRATA_MODEL_H

#include "strata/common.h"

#include <stdbool.h>

struct st_compute;

/* Architecture. Every field is required and positive; dim % heads == 0. */
struct st_model_config {
	int n_layer; /* L: transformer blocks */
	int n_embd;  /* C: channels */
	int n_head;  /* H: attention heads */
	int vocab;   /* V: vocabulary size (no padding) */
	int ctx;     /* T: maximum sequence length (wpe rows) */
};

/* Fill *out from a preset name ("tiny", "gpt2", "gpt2-medium", "gpt2-large",
 * "gpt2-xl") or from explicit dimensions "layers=L,dim=C,heads=H,vocab=V,
 * ctx=T" (all five keys, any order). Returns 0 or -EINVAL with the reason. */
int st_model_config_parse(const char *text, struct st_model_config *out);

/* Names of the presets, comma-separated, for --help. */
const char *st_model_preset_list(void);

#define ST_MODEL_NAME_BYTES 48
#define ST_MODEL_TENSOR_ALIGN_ELEMS 64u  /* 128 B in bf16, 256 B in fp32 */
#define ST_MODEL_UNIT_ALIGN_ELEMS 2048u  /* 4 KiB in bf16 */
/* Rows of logits materialised at once by the head (memory stays bounded:
 * ST_MODEL_CE_CHUNK_ROWS x V floats, whatever B*T is). */
#define ST_MODEL_CE_CHUNK_ROWS 256

enum st_unit_kind {
	ST_UNIT_EMBED,
	ST_UNIT_BLOCK,
	ST_UNIT_HEAD,
};

struct st_tensor_layout {
	char name[ST_MODEL_NAME_BYTES]; /* "h.3.attn.c_attn.weight" */
	int ndim;                       /* 1 or 2 */
	int64_t shape[2];               /* shape[1] is 1 when ndim is 1 */
	uint64_t offset_elems;          /* into the unit's flat buffer */
	uint64_t n_elems;
	bool decay; /* weight decay applies: matrices and embeddings */
};

struct st_unit_layout {
	enum st_unit_kind kind;
	int block;     /* block index for ST_UNIT_BLOCK, -1 otherwise */
	int n_tensors;
	const struct st_tensor_layout *tensors; /* borrowed from the model */
	uint64_t param_elems; /* parameters in the unit (sum of n_elems) */
	uint64_t elems;       /* flat buffer length, padding included */
	/* -1, or the unit whose W this unit's fwd/bwd also read (passed as
	 * `other`) and into whose gradient its bwd accumulates (`other_grad`):
	 * GPT-2's tied head reads the embedding */
	int reads_unit;
	/* the engine keeps this unit's widened W and its dW on the device from
	 * its forward to the end of its backward in each micro-batch (a unit
	 * that another reads: GPT-2's embedding) */
	bool resident;
};

struct st_model;

/* Build a model (config and layouts; no parameters: those are the caller's
 * buffers). *out goes back with st_model_destroy(). Returns 0, -EINVAL for a
 * bad config, -ENOMEM. */
int st_model_create(const struct st_model_config *cfg, struct st_model **out);
void st_model_destroy(struct st_model *m);

/* Run fwd and bwd through compute c (borrowed; NULL: the cpu, unqueued).
 * Every pointer handed to them must then be c's memory. On a compute that
 * queues (a device's: cuda, or the cpu device's worker), fwd and bwd return
 * with the work queued, except the loss, which is on the host when they
 * return; st_compute_sync(), or an event of the compute that the other
 * queue waits for, before another queue or the host touches the results. */
void st_model_set_compute(struct st_model *m, struct st_compute *c);

const struct st_model_config *st_model_config(const struct st_model *m);
/* L + 2. */
int st_model_unit_count(const struct st_model *m);
/* Layout of unit u (0 <= u < count). Borrowed; lives as long as m. */
const struct st_unit_layout *st_model_unit_layout(const struct st_model *m,
						  int u);
/* Bytes of unit u's output y at (B, T), which is unit u+1's input x and is
 * kept as its activation checkpoint; 0 for the last unit (its output is the
 * loss). */
size_t st_model_act_bytes(const struct st_model *m, int u, int B, int T);
/* All parameters of the model (wte counted once). */
uint64_t st_model_param_count(const struct st_model *m);
/* Find a tensor by its Hugging Face name; returns 0 and sets *unit and
 * *tensor (indexes), or -ENOENT. */
int st_model_find_tensor(const struct st_model *m, const char *name,
			 int *unit, int *tensor);

/* GPT-2 initialisation of unit u into params (fp32, layout.elems values,
 * padding zeroed): normal(0, 0.02), attn.c_proj.weight and mlp.c_proj.weight
 * scaled by 1/sqrt(2L), biases 0, LayerNorm gains 1. A function of
 * (seed, u) alone, computed with integer hashing and IEEE basic operations
 * only, so it is identical on every machine and at any thread count.
 * Returns 0 or -EINVAL. */
int st_model_init_unit(const struct st_model *m, int u, uint64_t seed,
		       float *params);

/* One micro-batch. tokens and targets are (B,T) int32 in [0,V). */
struct st_model_batch {
	int B, T;                /* 1 <= T <= ctx */
	const int32_t *tokens;   /* read by the embedding unit */
	const int32_t *targets;  /* read by the head */
	/* The gradients are those of loss_scale * mean loss: 1 for a plain
	 * step, 1/n for n accumulated micro-batches. 0 is refused (-EINVAL),
	 * so a forgotten field cannot silently zero every gradient. */
	float loss_scale;
	/* Host-readable copies of tokens and targets, for the range check,
	 * when those two are device pointers; NULL: they are readable. */
	const int32_t *host_tokens, *host_targets;
};

/* Workspace bytes that fwd and bwd of unit u need at this B and T. The same
 * workspace can serve every unit in turn; its content is scratch. */
size_t st_model_work_bytes(const struct st_model *m, int u, int B, int T);

/* Forward of unit u. Shapes (fp32):
 *   embedding  x unused (NULL),        y (B,T,C)
 *   block      x (B,T,C),              y (B,T,C)
 *   head       x (B,T,C), y unused,    *loss = mean cross-entropy
 * params is unit u's flat buffer; tied is the embedding unit's flat buffer
 * (head only, NULL otherwise). work has work_bytes >= st_model_work_bytes().
 * x, y, work must not overlap. Returns 0 or -EINVAL (bad shapes, a token or
 * target out of range, workspace too small), or the compute's error. */
int st_model_fwd(const struct st_model *m, int u,
		 const struct st_model_batch *batch, const float *params,
		 const float *tied, const float *x, float *y, float *loss,
		 void *work, size_t work_bytes);

/* Backward of unit u: recomputes the unit's forward from x (its saved
 * input) in work, then
 *   dx (B,T,C) is WRITTEN (not accumulated); NULL for the embedding;
 *   grad (fp32, the unit's layout) is ACCUMULATED (+=);
 *   head: dy unused; dwte is accumulated into tied_grad (the embedding
 *         unit's gradient buffer); *loss gets the mean loss when loss is
 *         not NULL (so the head's forward need not run separately).
 * params/tied as in st_model_fwd. Returns 0, -EINVAL or the compute's
 * error. */
int st_model_bwd(const struct st_model *m, int u,
		 const struct st_model_batch *batch, const float *params,
		 const float *tied, const float *x, const float *dy, float *dx,
		 float *grad, float *tied_grad, float *loss, void *work,
		 size_t work_bytes);

/* Model FLOPs per token of one training step (fwd + bwd, recompute not
 * counted): 6 * N_mm + 6 * L * T * C, where N_mm counts the parameters that
 * take part in a matmul (the blocks' weights and wte as the head; not wpe,
 * biases or norms) and the second term is causal attention (QK^T and AV,
 * half of the T x T scores). */
double st_model_flops_per_token(const struct st_model *m, int T);

#endif

/* strata: a model, the instance the engine, planner and trainer use.
 *
 * A model is a list of units, the grain of streaming, built by its family
 * (strata/family.h: GPT-2 today, in src/model/gpt2.c). GPT-2's units:
 *   u = 0          the embedding   (wte.weight, wpe.weight)
 *   u = 1 .. L     block u-1       (h.{i}.ln_1 ... h.{i}.mlp.c_proj)
 *   u = L + 1      the head        (ln_f; its matmul reads unit 0's wte)
 * Each unit's parameters live in one flat buffer of `elems` values (bf16 or
 * fp32, the caller's choice): tensors sit at offsets that are multiples of
 * 64 elements and `elems` is a multiple of 2048, so the buffer is a whole
 * number of ST_PAGE_BYTES pages in either precision and can move as opaque
 * bytes. Padding is zero. Tensor names and shapes are Hugging Face's (for
 * GPT-2: Conv1D weights stored (in,out)), with no vocabulary padding.
 *
 * The model knows nothing about tiers: fwd and bwd are handed fp32 pointers
 * (a bf16 W is widened first, e.g. with st_compute_bf16_to_f32, once per
 * use) and a workspace sized by st_model_work_bytes(), all in the memory
 * of the model's compute (strata/compute.h; the cpu by default, set with
 * st_model_set_compute()), and run every op through that compute.
 *
 * The contract the engine relies on, for every family:
 *   - every unit's input is the previous unit's output: unit u's y is unit
 *     u+1's x, st_model_act_bytes(m, u, B, T) bytes, and it is kept from
 *     the forward to the backward (the activation checkpoint): bwd(u)
 *     recomputes the unit's forward from it inside the workspace. Unit 0
 *     reads the batch's tokens instead of an x;
 *   - or a unit keeps its forward: st_model_fwd_save() writes the forward
 *     buffers its backward reads into a "saved" buffer of
 *     st_model_saved_bytes() and st_model_bwd_saved() reads them there
 *     instead of recomputing them (it still reads x). The bits are the
 *     same either way;
 *   - the last unit computes the loss (it reads the batch's targets), and
 *     its forward runs inside its bwd: a training step runs its bwd only;
 *   - a unit with reads_unit = k (>= 0) needs unit k's W during its fwd and
 *     its bwd (passed as `other`) and its bwd accumulates into unit k's
 *     gradient (`other_grad`); unit k is marked resident: GPT-2's head reads
 *     the embedding's wte (the tie), so dwte gathers both uses even when
 *     units stream independently.
 *
 * Everything is deterministic: bit-identical results at any OpenMP thread
 * count. Functions return 0 or -errno (details in st_error_last()). */
#ifndef STRATA_MODEL_H
#define STRATA_MODEL_H

#include "strata/common.h"
#include "strata/op.h"

#include <stdbool.h>

struct st_compute;
struct st_family_ops;

/* Architecture: one config type for every family. The family owns it: it
 * parses, checks, reads and writes it (strata/family.h). Fields a family
 * does not use stay 0. Every field GPT-2 uses is required and positive;
 * dim % n_head == 0. */
struct st_model_config {
	/* The family: NULL is the first one, GPT-2 (so a config written as
	 * dims alone stays GPT-2's). Static, borrowed. */
	const struct st_family_ops *family;
	int n_layer;   /* L: transformer blocks */
	int dim;       /* C: channels (GPT-2's n_embd) */
	int n_head;    /* H: attention heads */
	int n_kv_head; /* key/value heads (GQA); 0 where the family has none (GPT-2) */
	int ffn_dim;   /* the MLP's hidden size; 0 where the family fixes it (GPT-2: 4C) */
	int vocab;     /* V: vocabulary size (no padding) */
	int ctx;       /* T: maximum sequence length */
	/* LLaMA's (0 / false in GPT-2, which has none of them): */
	int head_dim;      /* channels per head; 0: dim / n_head */
	bool untied;       /* the head has its own lm_head (tie_word_embeddings false) */
	bool qkv_bias;     /* q/k/v projections have biases (attention_bias, Qwen2) */
	double norm_eps;   /* RMSNorm's epsilon (rms_norm_eps) */
	double rope_theta; /* rotary base */
	int rope_type;     /* enum st_rope_type (strata/rope.h): default, linear, llama3 */
	double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
	int rope_original_ctx; /* llama3's original_max_position_embeddings */
};

/* Fill *out from --model's text: a preset name of a family ("tiny",
 * "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"), or explicit dimensions
 * "layers=L,dim=C,heads=H,vocab=V,ctx=T" (GPT-2's keys, all five, any
 * order), either after an optional family prefix "gpt2:". Without a prefix
 * presets are looked up in every family and dimensions are GPT-2's.
 * Returns 0 or -EINVAL with the reason (*out untouched). */
int st_model_config_parse(const char *text, struct st_model_config *out);

/* Names of every family's presets, comma-separated, for --help. Static. */
const char *st_model_preset_list(void);

/* The family of cfg (cfg->family, or the first family when NULL). */
const struct st_family_ops *st_model_config_family(const struct st_model_config *cfg);

/* Check cfg as its family does. Returns 0 or -EINVAL naming the field. */
int st_model_config_check(const struct st_model_config *cfg);

/* The same model: the same family and every field equal. */
bool st_model_config_equal(const struct st_model_config *a, const struct st_model_config *b);

/* cfg as the dimensions text st_model_config_parse() reads back (without
 * the family prefix; "layers=12,dim=768,heads=12,vocab=50257,ctx=1024"),
 * NUL-terminated, truncated to bytes. Returns buf. */
char *st_model_config_format(const struct st_model_config *cfg, char *buf, size_t bytes);

/* cfg in words for a summary line ("GPT-2, 12 layers, dim 768, 12 heads,
 * vocab 50257, ctx 1024"), as st_model_config_format(). Returns buf. */
char *st_model_config_describe(const struct st_model_config *cfg, char *buf, size_t bytes);

/* One integer field of a Hugging Face config.json that gives the shape. */
struct st_config_field {
	const char *key; /* static: "n_embd" */
	int64_t value;
};
#define ST_MODEL_CONFIG_FIELDS_MAX 16

/* The shape's fields of cfg's config.json, in the family's order (GPT-2:
 * n_layer, n_embd, n_head, vocab_size, n_positions), into out (room for
 * ST_MODEL_CONFIG_FIELDS_MAX). Returns how many. */
int st_model_config_fields(const struct st_model_config *cfg, struct st_config_field *out);

/* Read a Hugging Face config.json: its family by model_type, else by the
 * first of architectures ("GPT2LMHeadModel"), else the first family (a
 * config with neither, as llm.c's tools write it, is GPT-2's); then the
 * family's fields (GPT-2: n_embd, n_layer, n_head, vocab_size, n_positions,
 * n_ctx when n_positions is absent; others ignored). Returns 0, -EINVAL
 * when the file is not a JSON object, names a model_type no family
 * knows, or a field is missing, not an integer, out of range, or n_head
 * does not divide n_embd (the detail names it), or the errno of reading
 * the file. */
int st_model_config_read(const char *path, struct st_model_config *out);

/* Write cfg as a config.json that Hugging Face transformers loads as its
 * family's model (GPT-2: model_type "gpt2", the five fields, n_ctx, and
 * GPT-2's fixed hyper-parameters), atomically. Returns 0, -EINVAL for a
 * config st_model_config_read() would refuse, or -errno. */
int st_model_config_write(const char *path, const struct st_model_config *cfg);

/* Refuse a Hugging Face config.json that describes another model than its
 * family computes (GPT-2: an untied head, another activation, another
 * LayerNorm epsilon). Returns 0, or -EINVAL with the reason (a file that
 * is not a JSON object too). Reads only; st_model_config_read() does not
 * call it (a strata checkpoint's config.json is strata's own). */
int st_model_config_hf_check(const char *path);

#define ST_MODEL_NAME_BYTES 64
#define ST_MODEL_TENSOR_ALIGN_ELEMS 64u  /* 128 B in bf16, 256 B in fp32 */
#define ST_MODEL_UNIT_ALIGN_ELEMS 2048u  /* 4 KiB in bf16 */
/* Rows of logits materialised at once by the head (memory stays bounded:
 * ST_MODEL_CE_CHUNK_ROWS x V floats, whatever B*T is). */
#define ST_MODEL_CE_CHUNK_ROWS 256

enum st_unit_kind {
	ST_UNIT_EMBED, /* reads the batch's tokens; no x */
	ST_UNIT_BLOCK,
	ST_UNIT_HEAD,  /* the last unit: reads the targets, computes the loss */
};

struct st_tensor_layout {
	char name[ST_MODEL_NAME_BYTES]; /* Hugging Face's: "h.3.attn.c_attn.weight" */
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

/* Build a model from cfg: its family (st_model_config_family()) checks the
 * config and lays the units out; no parameters (those are the caller's
 * buffers). *out goes back with st_model_destroy(). Returns 0, -EINVAL for
 * a bad config, -ENOMEM. */
int st_model_create(const struct st_model_config *cfg, struct st_model **out);
void st_model_destroy(struct st_model *m);

/* Run fwd and bwd through compute c (borrowed; NULL: the cpu, unqueued).
 * Every pointer handed to them must then be c's memory. On a compute that
 * queues (a device's: cuda, or the cpu device's worker), fwd and bwd return
 * with the work queued, except the loss, which is on the host when they
 * return; st_compute_sync(), or an event of the compute that the other
 * queue waits for, before another queue or the host touches the results. */
void st_model_set_compute(struct st_model *m, struct st_compute *c);
/* The dtypes of the tensors fwd and bwd pass between ops (strata/op.h's
 * enum st_precision; ST_PRECISION_FP32 at create). The params and other
 * pointers fwd, bwd and logits take (const void *) are the units' flat
 * buffers in that dtype: fp32, or under BF16 the bf16 W as it is stored,
 * never widened. Under BF16 the activations between ops inside a unit
 * are bf16, and x, y, dy, dx (the
 * residual stream between units), grad and the loss stay fp32; the work
 * and saved sizes are those of the precision set. 0, or -ENOTSUP when the
 * family has no bf16 path. */
int st_model_set_precision(struct st_model *m, enum st_precision p);
enum st_precision st_model_precision(const struct st_model *m);
/* Check that the model's compute runs every op, at the dtypes of the
 * model's precision, that fwd, bwd, fwd_save and bwd_saved run: each unit
 * kind's calls at B = T = 1 on a dry compute (st_compute_dry_create()).
 * 0, or -ENOTSUP with one line naming the precision, the compute, the first
 * op it does not run and its dtypes. */
int st_model_precision_check(struct st_model *m);
/* The compute fwd and bwd run through (never NULL). Borrowed. */
struct st_compute *st_model_compute(const struct st_model *m);

/* The model's config (its family set). Borrowed; lives as long as m. */
const struct st_model_config *st_model_config(const struct st_model *m);
/* The model's family. Static. */
const struct st_family_ops *st_model_family(const struct st_model *m);
/* Units: GPT-2's L + 2. */
int st_model_unit_count(const struct st_model *m);
/* Layout of unit u (0 <= u < count). Borrowed; lives as long as m. */
const struct st_unit_layout *st_model_unit_layout(const struct st_model *m,
						  int u);
/* All parameters of the model (a tensor another unit reads counted once). */
uint64_t st_model_param_count(const struct st_model *m);
/* Find a tensor by its Hugging Face name; returns 0 and sets *unit and
 * *tensor (indexes), or -ENOENT. */
int st_model_find_tensor(const struct st_model *m, const char *name,
			 int *unit, int *tensor);

/* The family's initialisation of unit u into params (fp32, layout.elems
 * values, padding zeroed). GPT-2's: normal(0, 0.02), attn.c_proj.weight
 * and mlp.c_proj.weight scaled by 1/sqrt(2L), biases 0, LayerNorm gains 1.
 * A function of (seed, u) alone, computed with integer hashing and IEEE
 * basic operations only, so it is identical on every machine and at any
 * thread count. Returns 0 or -EINVAL. */
int st_model_init_unit(const struct st_model *m, int u, uint64_t seed,
		       float *params);

/* One micro-batch. tokens and targets are (B,T) int32 in [0,V). */
struct st_model_batch {
	int B, T;                /* 1 <= T <= ctx */
	const int32_t *tokens;   /* read by the first unit (ST_UNIT_EMBED) */
	const int32_t *targets;  /* read by the last unit (ST_UNIT_HEAD) */
	/* The gradients are those of loss_scale * mean loss: 1 for a plain
	 * step, 1/n for n accumulated micro-batches. 0 is refused (-EINVAL),
	 * so a forgotten field cannot silently zero every gradient. */
	float loss_scale;
	/* Host-readable copies of tokens and targets, for the range check,
	 * when those two are device pointers; NULL: they are readable. */
	const int32_t *host_tokens, *host_targets;
	/* Where the head leaves its B*T per-token losses (the compute's
	 * memory), for the caller to read when it chooses (the engine: once
	 * a step, with the other device scalars); NULL: the workspace. The
	 * mean loss is still written where the loss argument asks for it. */
	float *losses;
	/* A masked step's count (0: not masked): the number of targets its
	 * loss divides by, over all of the step's micro-batches and ranks.
	 * Then a target may be ST_TARGET_IGNORED (a loss-mask 0): its loss is
	 * 0 and it gives no gradient; the gradients are those of loss_scale *
	 * (sum of the counted targets' losses) / count (the engine passes
	 * loss_scale 1: the step's loss is the mean over its counted
	 * targets, transformers' -100 labels with the total count), and the
	 * loss written is this micro-batch's sum / count. */
	uint64_t count;
	/* Packed documents that do not attend across each other (strata
	 * train --packing isolated): (B,T) int32 in the compute's memory,
	 * seg[b*T + t] the position in row b where the document of position
	 * t starts (0 <= seg <= t); query t attends to keys seg..t only.
	 * Positions keep counting 0..T-1 across documents (GPT-2's wpe,
	 * LLaMA's RoPE). NULL: causal over the whole row. */
	const int32_t *seg;
};

/* The target of a position the loss mask leaves out (transformers' -100). */
#define ST_TARGET_IGNORED (-1)

/* The mean of n per-token losses in host memory (batch.losses, read back),
 * as the head computes the mean loss it writes: summed in double, in order,
 * then rounded to float. */
float st_model_mean_loss(const float *losses, size_t n);

/* Their sum, in order, in double (a masked step's micro-batch: the ignored
 * targets' losses are 0). */
double st_model_sum_losses(const float *losses, size_t n);

/* Workspace bytes that fwd and bwd of unit u need at this B and T. The same
 * workspace can serve every unit in turn; its content is scratch. */
size_t st_model_work_bytes(const struct st_model *m, int u, int B, int T);

/* bytes of unit u's output y, which is unit u+1's input x and is kept as its activation checkpoint; 0 for the last unit (its output is the loss) */
size_t st_model_act_bytes(const struct st_model *m, int u, int B, int T);

/* Forward of unit u. Shapes (fp32; GPT-2's):
 *   embedding  x unused (NULL),        y (B,T,C)
 *   block      x (B,T,C),              y (B,T,C)
 *   head       x (B,T,C), y unused,    *loss = mean cross-entropy
 * params is unit u's flat buffer; other is the flat buffer of the unit
 * layout.reads_unit names (NULL when it is -1). work has work_bytes >=
 * st_model_work_bytes(). x, y, work must not overlap. Returns 0 or -EINVAL
 * (bad shapes, a token or target out of range, workspace too small), or
 * the compute's error. */
int st_model_fwd(const struct st_model *m, int u,
		 const struct st_model_batch *batch, const void *params,
		 const void *other, const float *x, float *y, float *loss,
		 void *work, size_t work_bytes);

/* Backward of unit u: recomputes the unit's forward from x (its saved
 * input) in work, then
 *   dx (the shape of x) is WRITTEN (not accumulated); NULL for unit 0;
 *   grad (fp32, the unit's layout) is ACCUMULATED (+=);
 *   other_grad, the gradient buffer of unit layout.reads_unit (NULL when it
 *         is -1), is ACCUMULATED (GPT-2's head: dwte);
 *   the last unit: dy unused; *loss gets the mean loss when loss is not
 *         NULL (so its forward need not run separately).
 * params/other as in st_model_fwd. Returns 0, -EINVAL or the compute's
 * error. */
int st_model_bwd(const struct st_model *m, int u,
		 const struct st_model_batch *batch, const void *params,
		 const void *other, const float *x, const float *dy, float *dx,
		 float *grad, float *other_grad, float *loss, void *work,
		 size_t work_bytes);

/* Keeping a unit's forward (the backward without its recompute). Bytes of
 * the forward buffers unit u's backward reads, at this B and T: 0 when the
 * unit keeps nothing (its backward recomputes no forward: the embedding,
 * the head, or a family without the hooks). *scratch_bytes (not NULL) gets
 * the workspace fwd and bwd need besides a saved buffer (for a unit that
 * keeps nothing, st_model_work_bytes()). */
size_t st_model_saved_bytes(const struct st_model *m, int u, int B, int T,
			    size_t *scratch_bytes);

/* st_model_fwd(), and with saved (not NULL; saved_bytes >=
 * st_model_saved_bytes()) the unit's forward buffers go there, for
 * st_model_bwd_saved(); work then needs only the scratch bytes. saved NULL,
 * or a unit that keeps nothing: st_model_fwd() (saved unused). */
int st_model_fwd_save(const struct st_model *m, int u, const struct st_model_batch *batch,
		      const void *params, const void *other, const float *x, float *y,
		      float *loss, void *saved, size_t saved_bytes, void *work,
		      size_t work_bytes);

/* st_model_bwd() without the recompute: saved holds what
 * st_model_fwd_save() wrote for this unit with the same batch, params,
 * other and x (nothing in between wrote it); the result is bit for bit
 * st_model_bwd()'s. saved's content is consumed (the backward reuses it as
 * scratch). saved NULL, or a unit that keeps nothing: st_model_bwd(). */
int st_model_bwd_saved(const struct st_model *m, int u, const struct st_model_batch *batch,
		       const void *params, const void *other, const float *x,
		       const float *dy, float *dx, float *grad, float *other_grad,
		       float *loss, void *saved, size_t saved_bytes, void *work,
		       size_t work_bytes);

/* Logits of one position, for generation: x is the last unit's input at
 * that position (one row: st_model_act_bytes(m, U-2, 1, 1) bytes), logits
 * (V) is written. params is the last unit's buffer, other as in
 * st_model_fwd; work as for st_model_work_bytes(m, U-1, 1, 1). Synchronous
 * (the logits are there when it returns). Returns 0, -EINVAL (workspace too
 * small), -ENOTSUP for a family that does not generate, or the compute's
 * error. */
int st_model_logits(const struct st_model *m, const void *params, const void *other,
		    const float *x, float *logits, void *work, size_t work_bytes);

/* Model FLOPs per token of one training step (fwd + bwd, recompute not
 * counted), as the family counts them. GPT-2's: 6 * N_mm + 6 * L * T * C,
 * where N_mm counts the parameters that take part in a matmul (the blocks'
 * weights and wte as the head; not wpe, biases or norms) and the second
 * term is causal attention (QK^T and AV, half of the T x T scores). */
double st_model_flops_per_token(const struct st_model *m, int T);

/* Unit u's share of st_model_flops_per_token() (the shares add up to it):
 * GPT-2's block 6 * 12 C^2 + 6 T C, head 6 V C, embedding 0. A family
 * without the hook: the total spread evenly over its blocks. A unit whose
 * backward recomputes its forward does a third more of its share. */
double st_model_unit_flops_per_token(const struct st_model *m, int u, int T);

/* Decoding with a KV cache, for generation: the prompt runs once through
 * every layer (prefill), each layer's K and V of its positions kept, then
 * each new token runs its one position through every layer, attending over
 * the kept K and V (LLaMA: rotated at the token's absolute position; GQA's
 * kv heads shared) and appending its own. The cache is allocated once at
 * begin: n_layer x max_tokens x kv_dim x 2 floats (kv_dim: GPT-2's dim,
 * LLaMA's n_kv_head x head_dim). The logits agree with st_model_fwd()'s
 * over the whole prefix to rounding (the attention of one row sums in
 * another order). fp32 compute, on the model's compute: the cpu's in host
 * memory (st_model_decode_begin), or any compute in memory of its device
 * that the caller lends (st_model_decode_begin_in). */
struct st_decode;

/* Whether m decodes with a cache: its family has the hooks, and its
 * precision is fp32. */
bool st_model_decodes(const struct st_model *m);

/* Bytes of the cache for max_tokens positions. */
size_t st_model_decode_cache_bytes(const struct st_model_config *cfg, int max_tokens);

/* A decoder of m for up to max_tokens positions (1 .. ctx), in host
 * memory it allocates. Returns 0, -EINVAL (max_tokens out of range),
 * -ENOTSUP (a family without the hooks, bf16 compute, or a compute other
 * than the cpu's), -ENOMEM. */
int st_model_decode_begin(const struct st_model *m, int max_tokens, struct st_decode **out);

/* Bytes a decoder for max_tokens positions and steps of up to max_rows
 * tokens needs in st_model_decode_begin_in(): the cache, then the rows'
 * buffers, the logits and the workspace; 0 where m does not decode. */
size_t st_model_decode_bytes(const struct st_model *m, int max_tokens, int max_rows);
/* A decoder in mem, memory of the model's compute (a device's arena) of
 * at least st_model_decode_bytes(m, max_tokens, max_rows) bytes, which
 * stays the caller's. Steps then take at most max_rows tokens, and params
 * are the compute's pointers. Returns 0, -EINVAL, -ENOTSUP (as begin),
 * -ENOSPC (mem too small) or -ENOMEM. */
int st_model_decode_begin_in(const struct st_model *m, int max_tokens, int max_rows, void *mem,
			     size_t mem_bytes, struct st_decode **out);

/* Run the n tokens (n >= 1: the prompt, then one at a time) at the next
 * n positions and write the last one's logits (V floats). params[u] is
 * unit u's flat buffer (fp32, as st_model_fwd's params) for every unit.
 * Returns 0, -EINVAL (a token out of range, past max_tokens) or the
 * compute's error. */
int st_model_decode_step(struct st_decode *d, const void *const *params, const int32_t *tokens,
			 int n, float *logits);

/* Positions in the cache so far. */
int st_model_decode_pos(const struct st_decode *d);

void st_model_decode_end(struct st_decode *d);

#endif

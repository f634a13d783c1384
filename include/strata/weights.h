/* strata: a model's weights from any source strata reads (`strata train
 * --init`, `eval` and `generate --ckpt`, `export --ckpt`):
 *   - a strata checkpoint: DIR/step-N, or a --save DIR (what --resume DIR
 *     takes), its model.safetensors and config.json checked against its
 *     trainer.json (sizes, XXH64) first (the optimizer state is not read);
 *   - a Hugging Face directory (config.json + model.safetensors, or the
 *     shards model.safetensors.index.json names, or either without
 *     config.json), or a model.safetensors file (with the config.json
 *     beside it when a family reads it: st_model_config_read());
 *   - an llm.c model file (train_gpt2.py's format, version 3 or 5: GPT-2).
 * Tensors come out one at a time, by their Hugging Face name
 * ("h.3.attn.c_attn.weight"; a "transformer." prefix in the file is
 * accepted), as fp32 in Hugging Face's layout (Conv1D matrices (in, out)),
 * whatever the file holds (F32, BF16, F16; llm.c's (out, in)). A Hugging
 * Face config.json that describes another model than its family computes
 * (st_model_config_hf_check(); GPT-2: an untied head, another activation,
 * another LayerNorm epsilon) is refused. With the model known (a
 * config.json), opening checks every tensor of it there, a float type, of
 * its shape, and every other tensor of the files one its family derives
 * (st_family_ops.hf_derived), before anything is read: one line naming
 * the file and the tensor (docs/formats.md, Sharded directories).
 *
 * Functions return 0 or -errno with the detail (naming the file) in
 * st_error_last(): -ENOENT for a missing path, -EINVAL for a file that is
 * malformed, damaged or of another model, other -errno from the system. */
#ifndef STRATA_WEIGHTS_H
#define STRATA_WEIGHTS_H

#include "strata/common.h"
#include "strata/io.h"
#include "strata/model.h"

#include <stdbool.h>
#include <stdint.h>

struct st_weights;
struct st_ckpt_set;

/* Open path (one of the sources above). A strata checkpoint's files that
 * are read are verified (st_ckpt_verify()) first. *out goes back with
 * st_weights_close(). */
int st_weights_open(const char *path, struct st_weights **out);
void st_weights_close(struct st_weights *w);

/* What was opened, for messages: the checkpoint directory --resume would
 * take, the directory, the file. Borrowed. */
const char *st_weights_name(const struct st_weights *w);

/* What it is: "strata checkpoint", "Hugging Face safetensors", "llm.c model
 * file, version 3 (fp32)" or "... version 5 (bf16)". Static. */
const char *st_weights_format(const struct st_weights *w);

/* The safetensors files the weights are read from (one file, or shards
 * and their index: strata/ckpt.h), or NULL for an llm.c model file.
 * Borrowed until close. */
const struct st_ckpt_set *st_weights_set(const struct st_weights *w);

/* The model (its family set): 0 and *out, or -ENOENT for a
 * model.safetensors file with no config.json beside it. */
int st_weights_config(const struct st_weights *w, struct st_model_config *out);

/* Tensor name is there, of a float type, with shape[0..ndim) (ndim 1 or
 * 2): 0, or -EINVAL naming it. Reads nothing. */
int st_weights_check(struct st_weights *w, const char *name, int ndim, const uint64_t *shape);

/* Read tensor name (as st_weights_check()) into out, fp32, Hugging Face
 * layout, the product of shape elements. Every value is checked as it is
 * read: -EINVAL, naming the file, the tensor and the first index, when one
 * is NaN or Inf ("m/model.safetensors: wte.weight[1234] is nan: not finite
 * weights are refused"); out is then partly written. */
int st_weights_read(struct st_weights *w, const char *name, int ndim, const uint64_t *shape,
		    float *out);

/* Unit u's parameters from w into p (fp32, the unit's flat length, padding
 * zeroed): each tensor of the unit's layout by its name at its offset, as
 * st_weights_read() reads it (every tensor there with its exact shape).
 * The engine and the reference trainer both load weights through it.
 * 0, or st_weights_read()'s error. */
int st_weights_read_unit(struct st_weights *w, const struct st_model *m, int u, float *p);

/* ---- llm.c's GPT-2 model file ------------------------------------------------
 * 256 int32 (the machine's byte order): magic, version (3: fp32, 5: bf16),
 * maxT, V, L, NH, C, Vp (V rounded up to a multiple of 128), zeros. Then the
 * parameters with no gaps, each kind below for all layers before the next
 * kind; matrices as (out, in). wte has Vp rows, those past V zero. */
#define ST_LLMC_MODEL_MAGIC 20240326 /* (token files: ST_LLMC_MAGIC) */
#define ST_LLMC_MODEL_F32 3
#define ST_LLMC_MODEL_BF16 5
/* the header: ST_LLMC_HEADER_INTS, as token files' (strata/dataset.h) */
#define ST_LLMC_VOCAB_MULTIPLE 128
#define ST_LLMC_KINDS 16

/* One kind of parameter in llm.c's order: the Hugging Face name's suffix
 * ("ln_1.weight"; "h.<l>." before it when per_layer), whether llm.c keeps
 * it transposed (the four Conv1D matrices), its elements per layer,
 * cc * C * C + c * C (wte and wpe: st_llmc_kind_elems()), and for a
 * matrix its Hugging Face shape's rows in units of C (in * C, cc * C / in). */
struct st_llmc_kind {
	const char *suffix;
	bool per_layer, transpose;
	unsigned cc, c, in;
};
extern const struct st_llmc_kind st_llmc_kinds[ST_LLMC_KINDS];

/* Elements of kind g for one layer of the GPT-2 mc, as the file holds them:
 * the token embedding with vp rows (its rows from V on are padding). */
uint64_t st_llmc_kind_elems(const struct st_model_config *mc, uint64_t vp, int g);

/* The vocabulary V as llm.c pads it (a multiple of ST_LLMC_VOCAB_MULTIPLE). */
uint64_t st_llmc_padded_vocab(uint64_t V);

/* The header of an llm.c file of the model mc, fp32 or bf16 values.
 * Returns 0, or -EINVAL for a model that is not a GPT-2 or whose sizes do
 * not fit llm.c's int32 fields. */
int st_llmc_header_fill(const struct st_model_config *mc, bool bf16,
			int32_t header[ST_LLMC_HEADER_INTS]);

/* The Hugging Face name of kind g's tensor of layer l (l ignored for a kind
 * that is not per layer) into buf. */
void st_llmc_tensor_name(int g, int l, char *buf, size_t bytes);

/* dst (cols x rows) = src (rows x cols) transposed: Conv1D's (in, out) to
 * llm.c's (out, in) and back. */
void st_llmc_transpose(float *dst, const float *src, uint64_t rows, uint64_t cols);

#endif

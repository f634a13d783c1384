/* strata: the cpu device's bf16 ops, the reference semantics of the bf16
 * compute path (docs/model.md, "bf16 compute").
 *
 * Every op of strata/op.h whose reference slots are fp32 runs on the cpu
 * with any of those slots given as bf16: each bf16 operand is widened to
 * fp32 (exact), the op's fp32 kernel runs (fp32 arithmetic and
 * accumulation: a matmul is st_cpu_sgemm(), OpenBLAS sgemm, on the widened
 * tiles; OpenBLAS 0.3.21's OpenMP build exports no cblas_sbgemm), and each
 * bf16 slot the op writes is rounded back to bf16, to nearest even, once.
 * A bf16 slot an op accumulates into (+=) is read widened, accumulated in
 * fp32 and rounded once. So a bf16 op's result is what the fp32 op gives
 * on the bf16 values, rounded where its output is bf16: a GPU kernel that
 * keeps fp32 accumulators and rounds its bf16 outputs once is held to it
 * at bf16 tolerance (about 2^-8 relative per rounding).
 *
 * The widened copies live in a scratch pool that grows to the largest op
 * seen and is kept (one pool for the process, taken under a lock: the cpu
 * bf16 ops of all computes run one at a time). Tensor shapes must be whole
 * (no -1 dimension) for the bf16 slots: they give the bytes to widen.
 * Deterministic at any thread count, as the fp32 kernels are. */
#ifndef STRATA_KERNELS_BF16_H
#define STRATA_KERNELS_BF16_H

#include "strata/op.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Whether op `kind` at these dtypes is one the widening runs: the op has a
 * cpu kernel, is not a byte move, conversion or optimizer op, at least one
 * slot is bf16 where the reference is fp32, and every other slot has its
 * reference dtype. */
bool st_cpu_bf16_supports(enum st_op_kind kind, const enum st_dtype *dtypes);
/* Bitmask of the slots op `kind` writes (outputs and accumulators). */
unsigned st_cpu_op_written(enum st_op_kind kind);
/* Run op (st_cpu_bf16_supports() holds for its dtypes) as said above. */
void st_cpu_op_run_bf16(const struct st_op *op);

/* The bf16 attention references (the cpu compute's ATTENTION_FWD/BWD with
 * bf16 tensors, as named functions): fp32 math on the bf16 inputs.
 * out (B,T,C) bf16 = round(attention(qkv)); lse (B,NH,T) fp32. qkv is
 * (B,T,3C) bf16. */
void st_cpu_attention_fwd_bf16(uint16_t *out, float *lse, const uint16_t *qkv, int B, int T,
			       int C, int NH);
/* dqkv (B,T,3C) bf16 = round(dqkv + the fp32 gradient through attention of
 * the bf16 dout, qkv and out); lse fp32 as the forward gave it. */
void st_cpu_attention_bwd_bf16(uint16_t *dqkv, const uint16_t *dout, const uint16_t *qkv,
			       const uint16_t *out, const float *lse, int B, int T, int C,
			       int NH);

#ifdef __cplusplus
}
#endif

#endif

/* One row per op (and per dtype variant) for the tests that run every op
 * through the compute seam: tests/model/test_compute.c holds the queued
 * cpu compute to the direct one bit for bit; tests/cuda/test_cuda_ops.c
 * holds the cuda compute to the cpu one. Adding an op to strata/op.h
 * means adding its row here (the rows are checked to cover every op).
 *
 * A row gives each tensor slot a role: IN (seeded random inputs, or
 * random ids in [0, idx_range) for IDX), OUT (written by the op: both
 * sides start from the same poison, NaN bytes), ACC (accumulated into:
 * both sides start from the same random values) or NUL (a NULL optional
 * tensor). The harness fills host buffers and the record; the test moves
 * them where its compute wants them. */
#ifndef STRATA_TEST_COMPUTE_CASES_H
#define STRATA_TEST_COMPUTE_CASES_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "strata/kernels.h"
#include "strata/op.h"

enum case_role { NUL = 0, IN, OUT, ACC, IDX, SEG };

struct case_tensor {
	enum case_role role;
	enum st_dtype dtype;
	int64_t elems;
	float scale; /* IN and ACC values are uniform in [-scale, scale) */
};

struct op_case {
	const char *what;
	enum st_op_kind kind;
	struct case_tensor t[ST_OP_MAX_TENSORS];
	int64_t i[ST_OP_MAX_INTS];
	float f[ST_OP_MAX_FLOATS];
	int64_t idx_range;
	double tol; /* cuda vs cpu: relative L2 error (0: bit for bit) */
};

#define F_(role, n, s) { role, ST_DTYPE_F32, (n), (s) }
#define B_(role, n, s) { role, ST_DTYPE_BF16, (n), (s) }
#define U_(role, n) { role, ST_DTYPE_U8, (n), 0 }
#define I_(n) { IDX, ST_DTYPE_I32, (n), 0 }
#define N_ { NUL, ST_DTYPE_F32, 0, 0 }
/* an int32 slot left NULL (the attention's seg) */
#define NI_ { NUL, ST_DTYPE_I32, 0, 0 }
/* the attention's seg: rows of idx_range (T) positions, each a random
 * packing of documents (s(t) = where t's document starts) */
#define S_(n) { SEG, ST_DTYPE_I32, (n), 0 }

/* shapes: N rows, IC/OC channels, B,T,C,NH attention, V vocabulary */
enum { CN = 37, CIC = 96, COC = 136, CB = 2, CT = 37, CC = 96, CNH = 4, CV = 253,
       GM = 33, GN = 47, GK = 29, EN = 1000,
       /* LLaMA's: rope rows of RS floats holding RH heads of RD; GQA heads */
       RH = 3, RD = 16, RS = 56, QH = 4, QKV = 2, QD = 24,
       /* the optimizer's: three chunks of 16384, the last partial */
       AN = 40003 };

static const struct op_case op_cases[] = {
	{ "zero", ST_OP_ZERO, { U_(OUT, 1001) }, { 1001 }, { 0 }, 0, 0 },
	{ "copy", ST_OP_COPY, { U_(OUT, 1001), U_(IN, 1001) }, { 1001 }, { 0 }, 0, 0 },
	{ "bf16_to_f32", ST_OP_BF16_TO_F32, { F_(OUT, EN, 0), B_(IN, EN, 3.0f) }, { EN },
	  { 0 }, 0, 0 },
	{ "gemm nn", ST_OP_GEMM,
	  { F_(IN, GM * GK, 1.0f), F_(IN, GK * GN, 1.0f), F_(ACC, GM * GN, 1.0f) },
	  { 0, 0, GM, GN, GK, GK, GN, GN }, { 0.5f }, 0, 1e-5 },
	{ "gemm tt", ST_OP_GEMM,
	  { F_(IN, GK * GM, 1.0f), F_(IN, GN * GK, 1.0f), F_(ACC, GM * GN, 1.0f) },
	  { 1, 1, GM, GN, GK, GM, GK, GN }, { 1.0f }, 0, 1e-5 },
	{ "matmul_fwd", ST_OP_MATMUL_FWD,
	  { F_(OUT, CN * COC, 0), F_(IN, CN * CIC, 1.0f), F_(IN, CIC * COC, 0.1f),
	    F_(IN, COC, 0.5f) },
	  { CN, CIC, COC }, { 0 }, 0, 1e-5 },
	{ "matmul_fwd no bias", ST_OP_MATMUL_FWD,
	  { F_(OUT, CN * COC, 0), F_(IN, CN * CIC, 1.0f), F_(IN, CIC * COC, 0.1f), N_ },
	  { CN, CIC, COC }, { 0 }, 0, 1e-5 },
	/* the products of bf16 operands are exact in fp32: only the order of
	 * the fp32 sums differs between the cpu loop and cuBLASLt (1e-4:
	 * a margin over fp32 sums, not a measured bound) */
	{ "matmul_fwd bf16", ST_OP_MATMUL_FWD,
	  { F_(OUT, CN * COC, 0), B_(IN, CN * CIC, 1.0f), B_(IN, CIC * COC, 0.1f),
	    F_(IN, COC, 0.5f) },
	  { CN, CIC, COC }, { 0 }, 0, 1e-4 },
	{ "matmul_gelu_fwd", ST_OP_MATMUL_GELU_FWD,
	  { F_(OUT, CN * COC, 0), F_(OUT, CN * COC, 0), F_(IN, CN * CIC, 1.0f),
	    F_(IN, CIC * COC, 0.1f), F_(IN, COC, 0.5f) },
	  { CN, CIC, COC }, { 0 }, 0, 1e-5 },
	{ "matmul_gelu_fwd no pre", ST_OP_MATMUL_GELU_FWD,
	  { F_(OUT, CN * COC, 0), N_, F_(IN, CN * CIC, 1.0f), F_(IN, CIC * COC, 0.1f),
	    F_(IN, COC, 0.5f) },
	  { CN, CIC, COC }, { 0 }, 0, 1e-5 },
	{ "matmul_bwd", ST_OP_MATMUL_BWD,
	  { F_(ACC, CN * CIC, 1.0f), F_(ACC, CIC * COC, 1.0f), F_(ACC, COC, 1.0f),
	    F_(IN, CN * COC, 1.0f), F_(IN, CN * CIC, 1.0f), F_(IN, CIC * COC, 0.1f) },
	  { CN, CIC, COC }, { 0 }, 0, 1e-5 },
	{ "layernorm_fwd", ST_OP_LAYERNORM_FWD,
	  { F_(OUT, CN * CC, 0), F_(OUT, CN, 0), F_(OUT, CN, 0), F_(IN, CN * CC, 2.0f),
	    F_(IN, CC, 1.0f), F_(IN, CC, 1.0f) },
	  { CN, CC }, { 0 }, 0, 1e-5 },
	{ "layernorm_bwd", ST_OP_LAYERNORM_BWD,
	  { F_(ACC, CN * CC, 1.0f), F_(ACC, CC, 1.0f), F_(ACC, CC, 1.0f),
	    F_(IN, CN * CC, 1.0f), F_(IN, CN * CC, 2.0f), F_(IN, CC, 1.0f), F_(IN, CN, 0.5f),
	    F_(IN, CN, 2.0f) },
	  { CN, CC }, { 0 }, 0, 1e-5 },
	{ "gelu_fwd", ST_OP_GELU_FWD, { F_(OUT, EN, 0), F_(IN, EN, 6.0f) }, { EN }, { 0 }, 0,
	  1e-5 },
	{ "gelu_bwd", ST_OP_GELU_BWD, { F_(OUT, EN, 0), F_(IN, EN, 6.0f), F_(IN, EN, 1.0f) },
	  { EN }, { 0 }, 0, 1e-5 },
	{ "residual_fwd", ST_OP_RESIDUAL_FWD,
	  { F_(OUT, EN, 0), F_(IN, EN, 1.0f), F_(IN, EN, 1.0f) }, { EN }, { 0 }, 0, 1e-5 },
	{ "embedding_fwd", ST_OP_EMBEDDING_FWD,
	  { F_(OUT, CB * CT * CC, 0), I_(CB * CT), F_(IN, CV * CC, 1.0f),
	    F_(IN, CT * CC, 1.0f) },
	  { CB, CT, CC }, { 0 }, CV, 1e-5 },
	{ "embedding_bwd", ST_OP_EMBEDDING_BWD,
	  { F_(ACC, CV * CC, 1.0f), F_(ACC, CT * CC, 1.0f), F_(IN, CB * CT * CC, 1.0f),
	    I_(CB * CT) },
	  { CB, CT, CC }, { 0 }, CV, 1e-5 },
	{ "attention_fwd", ST_OP_ATTENTION_FWD,
	  { F_(OUT, CB * CT * CC, 0), F_(OUT, CB * CNH * CT, 0),
	    F_(IN, CB * CT * 3 * CC, 2.0f), NI_ },
	  { CB, CT, CC, CNH }, { 0 }, 0, 1e-5 },
	/* packed documents that do not attend across each other */
	{ "attention_fwd seg", ST_OP_ATTENTION_FWD,
	  { F_(OUT, CB * CT * CC, 0), F_(OUT, CB * CNH * CT, 0),
	    F_(IN, CB * CT * 3 * CC, 2.0f), S_(CB * CT) },
	  { CB, CT, CC, CNH }, { 0 }, CT, 1e-5 },
	/* out and lse need not come from a forward for the two sides to
	 * agree; small qkv keeps the softmax weights near 1 */
	{ "attention_bwd", ST_OP_ATTENTION_BWD,
	  { F_(ACC, CB * CT * 3 * CC, 1.0f), F_(IN, CB * CT * CC, 1.0f),
	    F_(IN, CB * CT * 3 * CC, 0.5f), F_(IN, CB * CT * CC, 1.0f),
	    F_(IN, CB * CNH * CT, 1.0f), NI_ },
	  { CB, CT, CC, CNH }, { 0 }, 0, 1e-5 },
	{ "attention_bwd seg", ST_OP_ATTENTION_BWD,
	  { F_(ACC, CB * CT * 3 * CC, 1.0f), F_(IN, CB * CT * CC, 1.0f),
	    F_(IN, CB * CT * 3 * CC, 0.5f), F_(IN, CB * CT * CC, 1.0f),
	    F_(IN, CB * CNH * CT, 1.0f), S_(CB * CT) },
	  { CB, CT, CC, CNH }, { 0 }, CT, 1e-5 },
	{ "crossentropy_fwd", ST_OP_CROSSENTROPY_FWD,
	  { F_(OUT, CN, 0), F_(IN, CN * CV, 4.0f), I_(CN) }, { CN, CV }, { 0 }, CV, 1e-5 },
	{ "crossentropy_bwd", ST_OP_CROSSENTROPY_BWD,
	  { F_(OUT, CN * CV, 0), F_(OUT, CN, 0), F_(IN, CN * CV, 4.0f), I_(CN) },
	  { CN, CV }, { 0.25f }, CV, 1e-5 },
	{ "linear_fwd", ST_OP_LINEAR_FWD,
	  { F_(OUT, CN * COC, 0), F_(IN, CN * CIC, 1.0f), F_(IN, COC * CIC, 0.1f),
	    F_(IN, COC, 0.5f) },
	  { CN, CIC, COC }, { 0 }, 0, 1e-5 },
	{ "linear_fwd no bias", ST_OP_LINEAR_FWD,
	  { F_(OUT, CN * COC, 0), F_(IN, CN * CIC, 1.0f), F_(IN, COC * CIC, 0.1f), N_ },
	  { CN, CIC, COC }, { 0 }, 0, 1e-5 },
	{ "linear_bwd", ST_OP_LINEAR_BWD,
	  { F_(ACC, CN * CIC, 1.0f), F_(ACC, COC * CIC, 1.0f), F_(ACC, COC, 1.0f),
	    F_(IN, CN * COC, 1.0f), F_(IN, CN * CIC, 1.0f), F_(IN, COC * CIC, 0.1f) },
	  { CN, CIC, COC }, { 0 }, 0, 1e-5 },
	{ "linear_bwd dinp only", ST_OP_LINEAR_BWD,
	  { F_(ACC, CN * CIC, 1.0f), N_, N_, F_(IN, CN * COC, 1.0f), N_,
	    F_(IN, COC * CIC, 0.1f) },
	  { CN, CIC, COC }, { 0 }, 0, 1e-5 },
	{ "rmsnorm_fwd", ST_OP_RMSNORM_FWD,
	  { F_(OUT, CN * CC, 0), F_(OUT, CN, 0), F_(IN, CN * CC, 2.0f), F_(IN, CC, 1.0f) },
	  { CN, CC }, { 1e-5f }, 0, 1e-5 },
	{ "rmsnorm_bwd", ST_OP_RMSNORM_BWD,
	  { F_(ACC, CN * CC, 1.0f), F_(ACC, CC, 1.0f), F_(IN, CN * CC, 1.0f),
	    F_(IN, CN * CC, 2.0f), F_(IN, CC, 1.0f), F_(IN, CN, 2.0f) },
	  { CN, CC }, { 0 }, 0, 1e-5 },
	{ "rope_fwd", ST_OP_ROPE_FWD,
	  { F_(ACC, CB * CT * RS, 1.0f), F_(IN, CB * CT * RS, 1.0f) },
	  { CB, CT, RH, RD, RS, 0, 0 }, { 10000.0f }, 0, 1e-5 },
	{ "rope_fwd llama3", ST_OP_ROPE_FWD,
	  { F_(ACC, CB * CT * RS, 1.0f), F_(IN, CB * CT * RS, 1.0f) },
	  { CB, CT, RH, RD, RS, 2, 16 }, { 500000.0f, 8.0f, 1.0f, 4.0f }, 0, 1e-5 },
	{ "rope_bwd linear", ST_OP_ROPE_BWD,
	  { F_(ACC, CB * CT * RS, 1.0f), F_(IN, CB * CT * RS, 1.0f) },
	  { CB, CT, RH, RD, RS, 1, 0 }, { 10000.0f, 4.0f }, 0, 1e-5 },
	{ "rope_fwd at 211", ST_OP_ROPE_FWD,
	  { F_(ACC, 3 * RS, 1.0f), F_(IN, 3 * RS, 1.0f) },
	  { 1, 3, RH, RD, RS, 2, 16, 211 }, { 500000.0f, 8.0f, 1.0f, 4.0f }, 0, 1e-5 },
	/* the decoder's: 3 rows at 34.. over a cache of CT rows, GQA heads */
	{ "decode_attention", ST_OP_DECODE_ATTENTION,
	  { F_(OUT, 3 * QH * QD, 0), F_(IN, 3 * (QH * QD + 8), 2.0f),
	    F_(IN, CT * QKV * QD, 2.0f), F_(IN, CT * QKV * QD, 1.0f) },
	  { 3, 34, QH, QKV, QD, QH * QD + 8 }, { 0 }, 0, 1e-5 },
	{ "swiglu_fwd", ST_OP_SWIGLU_FWD,
	  { F_(OUT, EN, 0), F_(IN, EN, 6.0f), F_(IN, EN, 2.0f) }, { EN }, { 0 }, 0, 1e-5 },
	{ "swiglu_bwd", ST_OP_SWIGLU_BWD,
	  { F_(OUT, EN, 0), F_(OUT, EN, 0), F_(IN, EN, 1.0f), F_(IN, EN, 6.0f),
	    F_(IN, EN, 2.0f) },
	  { EN }, { 0 }, 0, 1e-5 },
	{ "token_embed_fwd", ST_OP_TOKEN_EMBED_FWD,
	  { F_(OUT, CB * CT * CC, 0), I_(CB * CT), F_(IN, CV * CC, 1.0f) },
	  { CB * CT, CC }, { 0 }, CV, 0 },
	{ "token_embed_bwd", ST_OP_TOKEN_EMBED_BWD,
	  { F_(ACC, CV * CC, 1.0f), F_(IN, CB * CT * CC, 1.0f), I_(CB * CT) },
	  { CB * CT, CC }, { 0 }, CV, 1e-5 },
	{ "gqa_attention_fwd", ST_OP_GQA_ATTENTION_FWD,
	  { F_(OUT, CB * CT * QH * QD, 0), F_(OUT, CB * QH * CT, 0),
	    F_(IN, CB * CT * QH * QD, 2.0f), F_(IN, CB * CT * QKV * QD, 2.0f),
	    F_(IN, CB * CT * QKV * QD, 2.0f), NI_ },
	  { CB, CT, QH, QKV, QD }, { 0 }, 0, 1e-5 },
	{ "gqa_attention_fwd seg", ST_OP_GQA_ATTENTION_FWD,
	  { F_(OUT, CB * CT * QH * QD, 0), F_(OUT, CB * QH * CT, 0),
	    F_(IN, CB * CT * QH * QD, 2.0f), F_(IN, CB * CT * QKV * QD, 2.0f),
	    F_(IN, CB * CT * QKV * QD, 2.0f), S_(CB * CT) },
	  { CB, CT, QH, QKV, QD }, { 0 }, CT, 1e-5 },
	{ "gqa_attention_bwd", ST_OP_GQA_ATTENTION_BWD,
	  { F_(ACC, CB * CT * QH * QD, 1.0f), F_(ACC, CB * CT * QKV * QD, 1.0f),
	    F_(ACC, CB * CT * QKV * QD, 1.0f), F_(IN, CB * CT * QH * QD, 1.0f),
	    F_(IN, CB * CT * QH * QD, 0.5f), F_(IN, CB * CT * QKV * QD, 0.5f),
	    F_(IN, CB * CT * QKV * QD, 0.5f), F_(IN, CB * CT * QH * QD, 1.0f),
	    F_(IN, CB * QH * CT, 1.0f), NI_ },
	  { CB, CT, QH, QKV, QD }, { 0 }, 0, 1e-5 },
	{ "gqa_attention_bwd seg", ST_OP_GQA_ATTENTION_BWD,
	  { F_(ACC, CB * CT * QH * QD, 1.0f), F_(ACC, CB * CT * QKV * QD, 1.0f),
	    F_(ACC, CB * CT * QKV * QD, 1.0f), F_(IN, CB * CT * QH * QD, 1.0f),
	    F_(IN, CB * CT * QH * QD, 0.5f), F_(IN, CB * CT * QKV * QD, 0.5f),
	    F_(IN, CB * CT * QKV * QD, 0.5f), F_(IN, CB * CT * QH * QD, 1.0f),
	    F_(IN, CB * QH * CT, 1.0f), S_(CB * CT) },
	  { CB, CT, QH, QKV, QD }, { 0 }, CT, 1e-5 },
	/* the optimizer on the device: bit for bit the host's (beta2 = 0, so
	 * V' = g*g stays >= 0 from any V; the count slot is added to, by 0) */
	{ "adamw fp32 W", ST_OP_ADAMW,
	  { F_(IN, AN, 1.0f), F_(ACC, AN, 0.5f), F_(ACC, AN, 0.01f), F_(ACC, AN, 1e-4f),
	    F_(OUT, AN, 0), U_(ACC, 4) },
	  { AN }, { 0.8f, 0.9f, 0.1f, 0.0f, 1.0f, 1.0f, 1e-8f, -1e-3f, 0.999f }, 0, 0 },
	{ "adamw bf16 W", ST_OP_ADAMW,
	  { F_(IN, AN, 1.0f), F_(ACC, AN, 0.5f), F_(ACC, AN, 0.01f), F_(ACC, AN, 1e-4f),
	    B_(OUT, AN, 0), U_(ACC, 4) },
	  { AN }, { 1.0f, 0.9f, 0.1f, 0.0f, 1.0f, 1.5f, 1e-8f, -3e-4f, 1.0f }, 0, 0 },
	{ "adamw no W", ST_OP_ADAMW,
	  { F_(IN, AN, 1.0f), F_(ACC, AN, 0.5f), F_(ACC, AN, 0.01f), F_(ACC, AN, 1e-4f), N_,
	    U_(ACC, 4) },
	  { AN }, { 1.0f, 0.9f, 0.1f, 0.0f, 1.0f, 1.0f, 1e-8f, -1e-3f, 0.99f }, 0, 0 },
	/* residual + norm: residual_fwd then the norm, bit for bit on the cpu */
	{ "residual_layernorm_fwd", ST_OP_RESIDUAL_LAYERNORM_FWD,
	  { F_(OUT, CN * CC, 0), F_(OUT, CN * CC, 0), F_(OUT, CN, 0), F_(OUT, CN, 0),
	    F_(IN, CN * CC, 1.0f), F_(IN, CN * CC, 1.0f), F_(IN, CC, 1.0f), F_(IN, CC, 0.5f) },
	  { CN, CC }, { 0 }, 0, 1e-5 },
	{ "residual_rmsnorm_fwd", ST_OP_RESIDUAL_RMSNORM_FWD,
	  { F_(OUT, CN * CC, 0), F_(OUT, CN * CC, 0), F_(OUT, CN, 0), F_(IN, CN * CC, 1.0f),
	    F_(IN, CN * CC, 1.0f), F_(IN, CC, 1.0f) },
	  { CN, CC }, { 1e-5f }, 0, 1e-5 },
	/* scratch is the op's own (not compared): an input here */
	{ "grad_sumsq", ST_OP_GRAD_SUMSQ,
	  { U_(OUT, 16), U_(IN, 16 * ((AN + 16383) / 16384)), F_(IN, AN, 1.0f) },
	  { AN }, { 0 }, 0, 0 },
	/* the bf16 compute path's conversion: round to nearest even, both sides */
	{ "f32_to_bf16", ST_OP_F32_TO_BF16, { B_(OUT, EN, 0), F_(IN, EN, 3.0f) }, { EN },
	  { 0 }, 0, 0 },
	/* the fused head: 16-row chunks on the cpu (three, the last partial);
	 * its scratches are its own (not compared): inputs here. bf16 tol:
	 * dlogits are rounded to bf16 on both sides, from logits summed in
	 * different orders */
	{ "head_crossentropy", ST_OP_HEAD_CROSSENTROPY,
	  { F_(OUT, CN, 0), F_(ACC, CN * CC, 1.0f), F_(ACC, CV * CC, 1.0f), B_(IN, CN * CC, 1.0f),
	    B_(IN, CV * CC, 0.2f), I_(CN), F_(IN, 16 * CV, 1.0f), B_(IN, 16 * CV, 1.0f) },
	  { CN, CC, CV, 16 }, { 0.25f }, CV, 1e-2 },
	{ "head_crossentropy fwd", ST_OP_HEAD_CROSSENTROPY,
	  { F_(OUT, CN, 0), N_, N_, B_(IN, CN * CC, 1.0f), B_(IN, CV * CC, 0.2f), I_(CN),
	    F_(IN, 16 * CV, 1.0f), B_(IN, 16 * CV, 1.0f) },
	  { CN, CC, CV, 16 }, { 0 }, CV, 1e-5 },
};

#define N_OP_CASES (sizeof(op_cases) / sizeof(op_cases[0]))

/* xorshift64*: the same inputs on every machine */
static uint64_t case_rng = 1;

static inline uint32_t case_u32(void)
{
	case_rng ^= case_rng >> 12;
	case_rng ^= case_rng << 25;
	case_rng ^= case_rng >> 27;
	return (uint32_t)((case_rng * 0x2545f4914f6cdd1dull) >> 32);
}

static inline float case_f32(float scale)
{
	return scale * ((float)(case_u32() >> 8) / 8388608.0f - 1.0f);
}

/* n / T rows of T segment starts: documents of 1 to T/2 positions packed
 * in order, so that a row holds several (and a tile's rows start at
 * different places) */
static inline void case_seg(int32_t *seg, int64_t n, int64_t T)
{
	for (int64_t r = 0; r + T <= n; r += T)
		for (int64_t t = 0, s = 0, left = 0; t < T; t++, left--) {
			if (left <= 0) {
				s = t;
				left = 1 + (int64_t)(case_u32() % (uint32_t)(T / 2 > 1 ? T / 2 : 1));
			}
			seg[r + t] = (int32_t)s;
		}
}

static inline size_t case_bytes(const struct case_tensor *t)
{
	return (size_t)t->elems * st_dtype_elem_bytes(t->dtype);
}

/* Host buffers for row c's slots, filled by their role (seeded by the
 * row's index), and the record pointing at them; bufs[k] is NULL for NUL
 * slots. Free with case_free(). */
static inline void case_fill(const struct op_case *c, uint64_t seed, void **bufs, struct st_op *op)
{
	int n = st_op_tensors(c->kind);

	case_rng = seed * 0x9e3779b97f4a7c15ull + 1;
	memset(op, 0, sizeof(*op));
	op->kind = c->kind;
	memcpy(op->i, c->i, sizeof(op->i));
	memcpy(op->f, c->f, sizeof(op->f));
	for (int k = 0; k < ST_OP_MAX_TENSORS; k++)
		bufs[k] = NULL;
	for (int k = 0; k < n; k++) {
		const struct case_tensor *t = &c->t[k];
		size_t bytes = case_bytes(t);
		unsigned char *p;

		op->t[k] = st_tensor_1d(NULL, t->dtype, t->elems);
		if (t->role == NUL)
			continue;
		p = malloc(bytes ? bytes : 1);
		if (!p)
			abort();
		if (t->role == OUT) {
			memset(p, 0xff, bytes);
		} else if (t->role == SEG) {
			case_seg((int32_t *)p, t->elems, c->idx_range);
		} else if (t->role == IDX) {
			for (int64_t e = 0; e < t->elems; e++)
				((int32_t *)p)[e] = (int32_t)(case_u32() % (uint32_t)c->idx_range);
		} else if (t->dtype == ST_DTYPE_U8) {
			for (size_t e = 0; e < bytes; e++)
				p[e] = (unsigned char)case_u32();
		} else if (t->dtype == ST_DTYPE_BF16) {
			for (int64_t e = 0; e < t->elems; e++)
				((uint16_t *)p)[e] = st_cpu_bf16_from_f32(case_f32(t->scale));
		} else {
			for (int64_t e = 0; e < t->elems; e++)
				((float *)p)[e] = case_f32(t->scale);
		}
		bufs[k] = p;
		op->t[k].data = p;
	}
}

static inline void case_free(void **bufs)
{
	for (int k = 0; k < ST_OP_MAX_TENSORS; k++)
		free(bufs[k]);
}

/* Whether slot k of row c is written by the op (and so compared). */
static inline int case_written(const struct op_case *c, int k)
{
	return c->t[k].role == OUT || c->t[k].role == ACC;
}

#endif

/* The bf16 compute path's op rows (docs/model.md, "bf16 compute"): each
 * record the GPT-2 and LLaMA bf16 paths make, at its dtypes, in the format of
 * tests/compute_cases.h (include that first). tests/model/test_compute.c
 * holds the queued cpu compute to the direct one bit for bit on them;
 * tests/cuda/test_cuda_bf16.c holds the cuda compute to the cpu one, bf16
 * outputs at bf16 tolerance (the row's tol, relative L2), fp32 outputs at
 * 1e-4. A row the cuda compute does not support yet is reported there. */
#ifndef STRATA_TEST_COMPUTE_CASES_BF16_H
#define STRATA_TEST_COMPUTE_CASES_BF16_H

#define BF_TOL 8e-3 /* relative L2 of a bf16 output: one rounding is ~2^-9 */

/* The bf16 attention's shapes: head sizes the cuda compute runs (64 and
 * 128, attention_bf16.cu; st_compute_cuda_supports_shape()), not
 * compute_cases.h's 24: HC channels in HNH heads of 64, GQA heads of HQD
 * (128), so both head sizes run. */
enum { HC = 128, HNH = 2, HQD = 128 };

static const struct op_case op_cases_bf16[] = {
	{ "matmul_fwd bbbb", ST_OP_MATMUL_FWD,
	  { B_(OUT, CN * COC, 0), B_(IN, CN * CIC, 1.0f), B_(IN, CIC * COC, 0.1f),
	    B_(IN, COC, 0.5f) },
	  { CN, CIC, COC }, { 0 }, 0, BF_TOL },
	{ "matmul_fwd fbbb", ST_OP_MATMUL_FWD,
	  { F_(OUT, CN * COC, 0), B_(IN, CN * CIC, 1.0f), B_(IN, CIC * COC, 0.1f),
	    B_(IN, COC, 0.5f) },
	  { CN, CIC, COC }, { 0 }, 0, BF_TOL },
	/* the MLP's fc + GELU: cuBLASLt's GELU epilogue on cuda (one rounding
	 * of each output from fp32, as the cpu) */
	{ "matmul_gelu_fwd bbbbb", ST_OP_MATMUL_GELU_FWD,
	  { B_(OUT, CN * COC, 0), B_(OUT, CN * COC, 0), B_(IN, CN * CIC, 1.0f),
	    B_(IN, CIC * COC, 0.1f), B_(IN, COC, 0.5f) },
	  { CN, CIC, COC }, { 0 }, 0, BF_TOL },
	{ "matmul_bwd bffbbb", ST_OP_MATMUL_BWD,
	  { B_(ACC, CN * CIC, 0.5f), F_(ACC, CIC * COC, 1.0f), F_(ACC, COC, 1.0f),
	    B_(IN, CN * COC, 1.0f), B_(IN, CN * CIC, 1.0f), B_(IN, CIC * COC, 0.1f) },
	  { CN, CIC, COC }, { 0 }, 0, BF_TOL },
	{ "gemm bbf nt", ST_OP_GEMM,
	  { B_(IN, GM * GK, 1.0f), B_(IN, GN * GK, 1.0f), F_(ACC, GM * GN, 1.0f) },
	  { 0, 1, GM, GN, GK, GK, GK, GN }, { 0.0f }, 0, BF_TOL },
	{ "gemm bbf nn", ST_OP_GEMM,
	  { B_(IN, GM * GK, 1.0f), B_(IN, GK * GN, 1.0f), F_(ACC, GM * GN, 1.0f) },
	  { 0, 0, GM, GN, GK, GK, GN, GN }, { 1.0f }, 0, BF_TOL },
	{ "gemm bbf tn", ST_OP_GEMM,
	  { B_(IN, GK * GM, 1.0f), B_(IN, GK * GN, 1.0f), F_(ACC, GM * GN, 1.0f) },
	  { 1, 0, GM, GN, GK, GM, GN, GN }, { 1.0f }, 0, BF_TOL },
	/* the head (its GEMMs and cross-entropy in one record where the
	 * compute has it): one chunk of 256 rows, as the model makes it for
	 * fewer rows; the scratches are the op's own (inputs here) */
	{ "head_crossentropy", ST_OP_HEAD_CROSSENTROPY,
	  { F_(OUT, CN, 0), F_(ACC, CN * CC, 1.0f), F_(ACC, CV * CC, 1.0f), B_(IN, CN * CC, 1.0f),
	    B_(IN, CV * CC, 0.2f), I_(CN), F_(IN, 256 * CV, 1.0f), B_(IN, 256 * CV, 1.0f) },
	  { CN, CC, CV, 256 }, { 0.25f }, CV, BF_TOL },
	{ "layernorm_fwd bfffbb", ST_OP_LAYERNORM_FWD,
	  { B_(OUT, CN * CC, 0), F_(OUT, CN, 0), F_(OUT, CN, 0), F_(IN, CN * CC, 2.0f),
	    B_(IN, CC, 1.0f), B_(IN, CC, 1.0f) },
	  { CN, CC }, { 0 }, 0, BF_TOL },
	{ "layernorm_bwd fffbfbff", ST_OP_LAYERNORM_BWD,
	  { F_(ACC, CN * CC, 1.0f), F_(ACC, CC, 1.0f), F_(ACC, CC, 1.0f),
	    B_(IN, CN * CC, 1.0f), F_(IN, CN * CC, 2.0f), B_(IN, CC, 1.0f), F_(IN, CN, 0.5f),
	    F_(IN, CN, 2.0f) },
	  { CN, CC }, { 0 }, 0, BF_TOL },
	{ "layernorm_bwd fffffbff", ST_OP_LAYERNORM_BWD,
	  { F_(ACC, CN * CC, 1.0f), F_(ACC, CC, 1.0f), F_(ACC, CC, 1.0f),
	    F_(IN, CN * CC, 1.0f), F_(IN, CN * CC, 2.0f), B_(IN, CC, 1.0f), F_(IN, CN, 0.5f),
	    F_(IN, CN, 2.0f) },
	  { CN, CC }, { 0 }, 0, BF_TOL },
	{ "gelu_fwd bb", ST_OP_GELU_FWD, { B_(OUT, EN, 0), B_(IN, EN, 6.0f) }, { EN }, { 0 }, 0,
	  BF_TOL },
	{ "gelu_bwd bbb", ST_OP_GELU_BWD, { B_(OUT, EN, 0), B_(IN, EN, 6.0f), B_(IN, EN, 1.0f) },
	  { EN }, { 0 }, 0, BF_TOL },
	{ "embedding_fwd fibb", ST_OP_EMBEDDING_FWD,
	  { F_(OUT, CB * CT * CC, 0), I_(CB * CT), B_(IN, CV * CC, 1.0f), B_(IN, CT * CC, 1.0f) },
	  { CB, CT, CC }, { 0 }, CV, BF_TOL },
	/* the attention of the bf16 path: the cuda side is the flash kernel
	 * on tensor cores (mma.sync) */
	{ "attention_fwd bfb", ST_OP_ATTENTION_FWD,
	  { B_(OUT, CB * CT * HC, 0), F_(OUT, CB * HNH * CT, 0),
	    B_(IN, CB * CT * 3 * HC, 2.0f), NI_ },
	  { CB, CT, HC, HNH }, { 0 }, 0, BF_TOL },
	{ "attention_bwd bbbbf", ST_OP_ATTENTION_BWD,
	  { B_(ACC, CB * CT * 3 * HC, 0.5f), B_(IN, CB * CT * HC, 1.0f),
	    B_(IN, CB * CT * 3 * HC, 0.5f), B_(IN, CB * CT * HC, 1.0f),
	    F_(IN, CB * HNH * CT, 1.0f), NI_ },
	  { CB, CT, HC, HNH }, { 0 }, 0, BF_TOL },
	/* packed documents (--packing isolated): the seg slot */
	{ "attention_fwd bfbi seg", ST_OP_ATTENTION_FWD,
	  { B_(OUT, CB * CT * HC, 0), F_(OUT, CB * HNH * CT, 0),
	    B_(IN, CB * CT * 3 * HC, 2.0f), S_(CB * CT) },
	  { CB, CT, HC, HNH }, { 0 }, CT, BF_TOL },
	{ "attention_bwd bbbbfi seg", ST_OP_ATTENTION_BWD,
	  { B_(ACC, CB * CT * 3 * HC, 0.5f), B_(IN, CB * CT * HC, 1.0f),
	    B_(IN, CB * CT * 3 * HC, 0.5f), B_(IN, CB * CT * HC, 1.0f),
	    F_(IN, CB * HNH * CT, 1.0f), S_(CB * CT) },
	  { CB, CT, HC, HNH }, { 0 }, CT, BF_TOL },
	/* LLaMA's bf16 path (src/model/llama.c at bf16): the norms read the fp32
	 * residual stream and write bf16, their input gradients stay fp32 */
	{ "rmsnorm_fwd bffb", ST_OP_RMSNORM_FWD,
	  { B_(OUT, CN * CC, 0), F_(OUT, CN, 0), F_(IN, CN * CC, 2.0f), B_(IN, CC, 1.0f) },
	  { CN, CC }, { 1e-5f }, 0, BF_TOL },
	{ "rmsnorm_bwd ffbfbf", ST_OP_RMSNORM_BWD,
	  { F_(ACC, CN * CC, 1.0f), F_(ACC, CC, 1.0f), B_(IN, CN * CC, 1.0f),
	    F_(IN, CN * CC, 2.0f), B_(IN, CC, 1.0f), F_(IN, CN, 2.0f) },
	  { CN, CC }, { 0 }, 0, BF_TOL },
	{ "rmsnorm_bwd ffffbf", ST_OP_RMSNORM_BWD,
	  { F_(ACC, CN * CC, 1.0f), F_(ACC, CC, 1.0f), F_(IN, CN * CC, 1.0f),
	    F_(IN, CN * CC, 2.0f), B_(IN, CC, 1.0f), F_(IN, CN, 2.0f) },
	  { CN, CC }, { 0 }, 0, BF_TOL },
	{ "residual_rmsnorm_fwd fbfffb", ST_OP_RESIDUAL_RMSNORM_FWD,
	  { F_(OUT, CN * CC, 0), B_(OUT, CN * CC, 0), F_(OUT, CN, 0), F_(IN, CN * CC, 1.0f),
	    F_(IN, CN * CC, 1.0f), B_(IN, CC, 1.0f) },
	  { CN, CC }, { 1e-5f }, 0, BF_TOL },
	{ "linear_fwd bbbb", ST_OP_LINEAR_FWD,
	  { B_(OUT, CN * COC, 0), B_(IN, CN * CIC, 1.0f), B_(IN, COC * CIC, 0.1f),
	    B_(IN, COC, 0.5f) },
	  { CN, CIC, COC }, { 0 }, 0, BF_TOL },
	{ "linear_fwd fbb no bias", ST_OP_LINEAR_FWD,
	  { F_(OUT, CN * COC, 0), B_(IN, CN * CIC, 1.0f), B_(IN, COC * CIC, 0.1f), N_ },
	  { CN, CIC, COC }, { 0 }, 0, BF_TOL },
	{ "linear_bwd bffbbb", ST_OP_LINEAR_BWD,
	  { B_(ACC, CN * CIC, 0.5f), F_(ACC, COC * CIC, 1.0f), F_(ACC, COC, 1.0f),
	    B_(IN, CN * COC, 1.0f), B_(IN, CN * CIC, 1.0f), B_(IN, COC * CIC, 0.1f) },
	  { CN, CIC, COC }, { 0 }, 0, BF_TOL },
	{ "rope_fwd bb", ST_OP_ROPE_FWD,
	  { B_(ACC, CB * CT * RS, 1.0f), B_(IN, CB * CT * RS, 1.0f) },
	  { CB, CT, RH, RD, RS, 2, 16 }, { 500000.0f, 8.0f, 1.0f, 4.0f }, 0, BF_TOL },
	{ "rope_bwd bb", ST_OP_ROPE_BWD,
	  { B_(ACC, CB * CT * RS, 1.0f), B_(IN, CB * CT * RS, 1.0f) },
	  { CB, CT, RH, RD, RS, 0, 0 }, { 10000.0f }, 0, BF_TOL },
	{ "swiglu_fwd bbb", ST_OP_SWIGLU_FWD,
	  { B_(OUT, EN, 0), B_(IN, EN, 6.0f), B_(IN, EN, 2.0f) }, { EN }, { 0 }, 0, BF_TOL },
	{ "swiglu_bwd bbbbb", ST_OP_SWIGLU_BWD,
	  { B_(OUT, EN, 0), B_(OUT, EN, 0), B_(IN, EN, 1.0f), B_(IN, EN, 6.0f),
	    B_(IN, EN, 2.0f) },
	  { EN }, { 0 }, 0, BF_TOL },
	{ "token_embed_fwd fib", ST_OP_TOKEN_EMBED_FWD,
	  { F_(OUT, CB * CT * CC, 0), I_(CB * CT), B_(IN, CV * CC, 1.0f) },
	  { CB * CT, CC }, { 0 }, CV, BF_TOL },
	{ "gqa_attention_fwd bfbbb", ST_OP_GQA_ATTENTION_FWD,
	  { B_(OUT, CB * CT * QH * HQD, 0), F_(OUT, CB * QH * CT, 0),
	    B_(IN, CB * CT * QH * HQD, 2.0f), B_(IN, CB * CT * QKV * HQD, 2.0f),
	    B_(IN, CB * CT * QKV * HQD, 2.0f), NI_ },
	  { CB, CT, QH, QKV, HQD }, { 0 }, 0, BF_TOL },
	{ "gqa_attention_bwd bbbbbbbbf", ST_OP_GQA_ATTENTION_BWD,
	  { B_(ACC, CB * CT * QH * HQD, 1.0f), B_(ACC, CB * CT * QKV * HQD, 1.0f),
	    B_(ACC, CB * CT * QKV * HQD, 1.0f), B_(IN, CB * CT * QH * HQD, 1.0f),
	    B_(IN, CB * CT * QH * HQD, 0.5f), B_(IN, CB * CT * QKV * HQD, 0.5f),
	    B_(IN, CB * CT * QKV * HQD, 0.5f), B_(IN, CB * CT * QH * HQD, 1.0f),
	    F_(IN, CB * QH * CT, 1.0f), NI_ },
	  { CB, CT, QH, QKV, HQD }, { 0 }, 0, BF_TOL },
	{ "gqa_attention_fwd bfbbbi seg", ST_OP_GQA_ATTENTION_FWD,
	  { B_(OUT, CB * CT * QH * HQD, 0), F_(OUT, CB * QH * CT, 0),
	    B_(IN, CB * CT * QH * HQD, 2.0f), B_(IN, CB * CT * QKV * HQD, 2.0f),
	    B_(IN, CB * CT * QKV * HQD, 2.0f), S_(CB * CT) },
	  { CB, CT, QH, QKV, HQD }, { 0 }, CT, BF_TOL },
	{ "gqa_attention_bwd bbbbbbbbfi seg", ST_OP_GQA_ATTENTION_BWD,
	  { B_(ACC, CB * CT * QH * HQD, 1.0f), B_(ACC, CB * CT * QKV * HQD, 1.0f),
	    B_(ACC, CB * CT * QKV * HQD, 1.0f), B_(IN, CB * CT * QH * HQD, 1.0f),
	    B_(IN, CB * CT * QH * HQD, 0.5f), B_(IN, CB * CT * QKV * HQD, 0.5f),
	    B_(IN, CB * CT * QKV * HQD, 0.5f), B_(IN, CB * CT * QH * HQD, 1.0f),
	    F_(IN, CB * QH * CT, 1.0f), S_(CB * CT) },
	  { CB, CT, QH, QKV, HQD }, { 0 }, CT, BF_TOL },
	{ "f32_to_bf16", ST_OP_F32_TO_BF16, { B_(OUT, EN, 0), F_(IN, EN, 3.0f) }, { EN }, { 0 }, 0,
	  0 },
};

#define N_OP_CASES_BF16 (sizeof(op_cases_bf16) / sizeof(op_cases_bf16[0]))

#endif

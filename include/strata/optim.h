/* strata: fused CPU AdamW over fp32 master weights and moments (src/optim).
 *
 * The optimizer runs on the CPU: P (fp32 master weights), M and V (fp32
 * moments) live in host RAM or stream in from NVMe (with --offload-optim
 * vram the compute's ADAMW op runs this recipe on the device instead, bit
 * for bit, strata/op.h), and one fused pass per
 * shard or tile reads G, P, M, V and writes P, M, V and the working copy W
 * the device reads. It is memory-bound (30 bytes per parameter with fp32 G
 * and bf16 W), so the pass is written to run at memory speed.
 *
 * Determinism contract (docs/optim.md): every path (avx512, avx2, scalar),
 * at any thread count and any tiling, gives bit-identical P, M, V and W for
 * the same inputs. The per-element recipe, with every step rounded to fp32
 * and fma() a single rounding:
 *
 *   g  = G * grad_scale
 *   M' = fma(beta1, M, (1 - beta1) * g)
 *   V' = fma(beta2, V, ((1 - beta2) * g) * g)
 *   d  = fma(sqrt(V'), 1 / sqrt(1 - beta2^t), eps)
 *   P' = fma(-lr / (1 - beta1^t), M' / d, P * (1 - lr * weight_decay))
 *   W  = round_to_nearest_even(P')       (bf16, fp16 or fp32)
 *
 * with IEEE sqrt and division (no approximate reciprocals). The per-step
 * constants are computed once in double from the hyperparameters and
 * rounded to fp32. This assumes the default MXCSR (no FTZ/DAZ).
 */
#ifndef STRATA_OPTIM_H
#define STRATA_OPTIM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Element types the optimizer reads and writes. */
enum st_optim_dtype {
	ST_OPTIM_F32 = 0,
	ST_OPTIM_BF16 = 1,
	ST_OPTIM_F16 = 2,
};

/* Kernel paths. AUTO picks the best one this CPU supports (cpuid, at run
 * time); the binary never executes an instruction the CPU lacks. */
enum st_optim_path {
	ST_OPTIM_PATH_AUTO = 0,
	ST_OPTIM_PATH_SCALAR = 1,
	ST_OPTIM_PATH_AVX2 = 2,   /* AVX2 + FMA + F16C; no AVX-512 instruction */
	ST_OPTIM_PATH_AVX512 = 3, /* AVX-512 F/BW/VL/DQ; VCVTNEPS2BF16 when present */
};

/* AdamW hyperparameters for one step. */
struct st_adam_hparams {
	float lr;
	float beta1;        /* [0, 1) */
	float beta2;        /* [0, 1) */
	float eps;          /* >= 0 */
	float weight_decay; /* decoupled: P *= 1 - lr * weight_decay; >= 0 */
	float grad_scale;   /* multiplies every G element first: 1/loss_scale x clip coefficient */
	uint64_t step;      /* 1-based step number, for bias correction */
};

/* How M and V are stored (--optim-state; docs/optim.md, "Compact state").
 * P is fp32 in every format. The recipe always runs in fp32: the compact
 * formats dequantize M and V, run it, and quantize the new M' and V' back.
 *
 *   F32   M, V fp32 (st_adam_bufs.m, .v): 8 bytes per parameter.
 *   BF16  M, V bf16 (.mc, .vc as uint16_t), round to nearest even: 4 bytes.
 *   Q8    M, V one byte each (.mc, .vc as uint8_t) in blocks of
 *         ST_Q8_BLOCK elements, with one fp32 scale per block and moment
 *         (.m_scale, .v_scale): 2 + 8/ST_Q8_BLOCK bytes. Each code is a
 *         small float relative to its block's scale: a 4-bit exponent (bias
 *         15: 2^-14 .. 2^0 normal, subnormals below) and 3 (M, plus a sign
 *         bit) or 4 (V) mantissa bits, rounded to nearest even.
 *         M: m_scale = max|M'| over the block; code of M' * (1 / m_scale).
 *         V: v_scale = max sqrt(V'); code of sqrt(V') * (1 / v_scale);
 *            V = (r * v_scale) * (r * v_scale), r the decoded code.
 *         Why a float code, not a linear int8 (docs/optim.md): a block's
 *         elements span decades, and a linear code rounds the small ones
 *         to zero.
 * A block is elements [k * ST_Q8_BLOCK, (k + 1) * ST_Q8_BLOCK) of the array
 * the caller's pointers start; the last block of a call may be short. */
enum st_optim_state {
	ST_OPTIM_STATE_F32 = 0,
	ST_OPTIM_STATE_BF16 = 1,
	ST_OPTIM_STATE_Q8 = 2,
};

/* Elements per q8 block: a divisor of the OpenMP chunk (16384) and of every
 * tile the engine cuts, so blocks never straddle a chunk or a tile. */
#define ST_Q8_BLOCK 256u

/* One shard or tile. All pointers are borrowed, any alignment; the arrays
 * hold n_elems elements each and must not overlap (except that nothing is
 * read from W). */
struct st_adam_bufs {
	const void *g;                 /* gradient, read only */
	enum st_optim_dtype g_dtype;   /* ST_OPTIM_F32 or ST_OPTIM_BF16 */
	float *p;                      /* fp32 master weights, updated */
	float *m;                      /* first moment, updated (state F32) */
	float *v;                      /* second moment, updated (state F32) */
	void *w;                       /* working copy, written; NULL: none */
	enum st_optim_dtype w_dtype;   /* ST_OPTIM_BF16, ST_OPTIM_F16 or ST_OPTIM_F32 */
	/* Compact state (zero, the default, is F32 and uses m and v above). */
	enum st_optim_state state;
	void *mc, *vc;                 /* BF16: uint16_t; Q8: int8_t (M), uint8_t (V) codes */
	float *m_scale, *v_scale;      /* Q8: ceil(n_elems / ST_Q8_BLOCK) scales each */
};

/* The per-step constants, derived once by st_adam_prep(); treat as opaque. */
struct st_adam_step {
	float grad_scale;
	float beta1, one_minus_beta1;
	float beta2, one_minus_beta2;
	float rsqrt_bc2;     /* 1 / sqrt(1 - beta2^step) */
	float eps;
	float neg_step_size; /* -lr / (1 - beta1^step) */
	float decay;         /* 1 - lr * weight_decay */
	enum st_optim_path path; /* resolved when prepared; never AUTO */
};

/* Flags for st_adam_apply() and st_adam_update(). */
enum {
	/* The caller has already checked G (st_grad_sumsq() returned 0 for it):
	 * skip the pre-scan of G and do the single fused pass. Elements whose
	 * scaled gradient is still NaN or Inf are left unchanged (P, M, V bit
	 * for bit; W rewritten from P) and counted, and the call returns
	 * -ERANGE; all other elements are updated. */
	ST_ADAM_GRAD_CHECKED = 1u << 0,
};

/* Validate hp and derive the constants of one step into *step, with the
 * process-wide path (st_optim_path_get()). Returns 0, or -EINVAL when a
 * hyperparameter is out of range or not finite, or step is 0. */
int st_adam_prep(struct st_adam_step *step, const struct st_adam_hparams *hp);

/* Apply one prepared step to one tile of n_elems elements. The scheduler
 * may cut a unit into tiles of any size at any element boundary and call
 * this per tile (with separate staging buffers) while the next tile's I/O
 * is in flight: the result is the same bits as one call over the whole
 * unit. Runs on the OpenMP threads of the calling thread (fixed chunks).
 *
 * With the Q8 state, the quantization of a block depends on all its
 * elements: tiles must start on a block boundary (a multiple of
 * ST_Q8_BLOCK elements from the start of the array the blocks are counted
 * in), and only the array's last tile may end inside a block. Cut so, the
 * tiles give the same bits as one call; any other cut gives other bits
 * (st_adam_apply() cannot see the cut; the engine asserts it).
 *
 * Without ST_ADAM_GRAD_CHECKED, G is first scanned (an extra read of G):
 * when any g * grad_scale is NaN or Inf, nothing at all is written and the
 * call returns -ERANGE. With it, see ST_ADAM_GRAD_CHECKED.
 * *nonfinite_elems (may be NULL) gets the number of such elements.
 * Returns 0; -ERANGE as above; -EINVAL for a bad dtype or a NULL array
 * when n_elems > 0. */
int st_adam_apply(const struct st_adam_step *step, const struct st_adam_bufs *bufs,
		  size_t n_elems, unsigned flags, uint64_t *nonfinite_elems);

/* st_adam_prep() then st_adam_apply() over the whole shard. Same returns. */
int st_adam_update(const struct st_adam_hparams *hp, const struct st_adam_bufs *bufs,
		   size_t n_elems, unsigned flags, uint64_t *nonfinite_elems);

/* Sum of squares of G in fp64 (for clipping; not scaled by grad_scale).
 * Deterministic: the value depends only on the elements and n_elems, never
 * on the path or thread count. Elements go to 8 lanes by index mod 8 within
 * fixed chunks of 16384 elements, lanes are added as
 * ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), and chunks are added in index
 * order. (Summing a unit tile by tile gives different bits: sum per unit.)
 * Returns 0, or -ERANGE when G holds a NaN or Inf (then *sumsq is NaN or
 * +Inf, and the step should be skipped); -EINVAL for a bad dtype. */
int st_grad_sumsq(const void *g, enum st_optim_dtype g_dtype, size_t n_elems,
		  double *sumsq);

/* Bytes of M and V together for n elements in a state format (q8: codes
 * and scales). */
static inline uint64_t st_optim_state_bytes(enum st_optim_state st, uint64_t n)
{
	switch (st) {
	case ST_OPTIM_STATE_BF16:
		return 4u * n;
	case ST_OPTIM_STATE_Q8:
		return 2u * n + 8u * ((n + ST_Q8_BLOCK - 1) / ST_Q8_BLOCK);
	default:
		return 8u * n;
	}
}

/* "fp32", "bf16", "q8"; "?" when out of range. */
const char *st_optim_state_name(enum st_optim_state st);

/* Parse one of the names above. Returns 0 or -EINVAL. */
int st_optim_state_parse(const char *name, enum st_optim_state *st);

/* Dequantize n elements of a compact M, V (bufs->state, mc, vc, scales;
 * blocks counted from the pointers) to fp32 m and v (either may be NULL);
 * for F32 a copy. For checkpoints' tests and tools: the exact values the
 * kernel reads. */
void st_optim_state_load(const struct st_adam_bufs *bufs, size_t n, float *m, float *v);

/* Quantize fp32 m and v into bufs' compact M, V: what the kernel writes
 * for these M', V' (for initializing and converting state). */
void st_optim_state_store(const struct st_adam_bufs *bufs, size_t n, const float *m,
			  const float *v);

/* --- paths ---------------------------------------------------------------- */

/* "auto", "scalar", "avx2", "avx512"; "?" when out of range. */
const char *st_optim_path_name(enum st_optim_path path);

/* Parse one of the names above. Returns 0 or -EINVAL. */
int st_optim_path_parse(const char *name, enum st_optim_path *path);

/* 1 when this CPU (and OS) can run path, else 0. AUTO and SCALAR: always. */
int st_optim_path_supported(enum st_optim_path path);

/* Force the process-wide path (for tests and benchmarks; every path gives
 * the same bits, only the speed differs). AUTO restores the CPU's best.
 * The environment variable ST_OPTIM_PATH=auto|scalar|avx2|avx512 sets the
 * initial value (an unsupported or unknown value warns and means auto).
 * Returns 0, -ENOTSUP when the CPU lacks path, -EINVAL when out of range. */
int st_optim_path_set(enum st_optim_path path);

/* The path in use now (never AUTO). */
enum st_optim_path st_optim_path_get(void);

/* --- conversions: the exact rounding every seam must share ----------------- */

static inline uint32_t st_f32_bits(float x)
{
	uint32_t u;

	memcpy(&u, &x, sizeof(u));
	return u;
}

static inline float st_f32_from_bits(uint32_t u)
{
	float x;

	memcpy(&x, &u, sizeof(x));
	return x;
}

/* fp32 -> bf16, round to nearest even, subnormals kept (not flushed),
 * overflow to Inf; NaN stays NaN: sign and top payload kept, quiet bit set
 * (what VCVTNEPS2BF16 does with a NaN). */
static inline uint16_t st_bf16_from_f32(float x)
{
	uint32_t u = st_f32_bits(x);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x0040u);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* bf16 -> fp32, exact. */
static inline float st_f32_from_bf16(uint16_t h)
{
	return st_f32_from_bits((uint32_t)h << 16);
}

/* fp32 -> fp16 (IEEE binary16), round to nearest even, subnormals kept,
 * overflow to Inf; NaN stays NaN (sign and top payload kept, quiet bit
 * set). Bit-identical to VCVTPS2PH with round-to-nearest. */
static inline uint16_t st_f16_from_f32(float x)
{
	uint32_t u = st_f32_bits(x);
	uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
	uint32_t e, mant, shift, q, rem, half;

	if (a > 0x7f800000u)
		return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
	if (a >= 0x38800000u) { /* |x| >= 2^-14: normal fp16 or overflow */
		q = a + 0xfffu + ((a >> 13) & 1u);
		q = (q >> 13) - (112u << 10);
		return (uint16_t)(sign | (q >= 0x7c00u ? 0x7c00u : q));
	}
	if (a < 0x33000000u) /* |x| < 2^-25 (and 2^-25 ties to even 0) */
		return (uint16_t)sign;
	/* fp16 subnormal: result = round(|x| * 2^24), |x| = mant * 2^(e-150) */
	e = a >> 23;
	mant = (a & 0x7fffffu) | 0x800000u;
	shift = 126u - e;
	q = mant >> shift;
	rem = mant & ((1u << shift) - 1u);
	half = 1u << (shift - 1u);
	if (rem > half || (rem == half && (q & 1u)))
		q++;
	return (uint16_t)(sign | q);
}

/* fp16 -> fp32, exact (a NaN comes back quiet with its payload). */
static inline float st_f32_from_f16(uint16_t h)
{
	uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
	uint32_t e = ((uint32_t)h >> 10) & 0x1fu, mant = (uint32_t)h & 0x3ffu;

	if (e == 0x1fu)
		return st_f32_from_bits(sign | 0x7f800000u | (mant ? 0x400000u : 0u) |
					(mant << 13));
	if (e == 0) {
		if (!mant)
			return st_f32_from_bits(sign);
		/* subnormal: normalise */
		e = 113u;
		while (!(mant & 0x400u)) {
			mant <<= 1;
			e--;
		}
		return st_f32_from_bits(sign | (e << 23) | ((mant & 0x3ffu) << 13));
	}
	return st_f32_from_bits(sign | ((e + 112u) << 23) | (mant << 13));
}

#endif

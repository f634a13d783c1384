/* Fused CPU AdamW and the gradient's sum of squares: validation, per-step
 * constants, path choice and the OpenMP split over fixed chunks. The
 * kernels themselves live in adam_{scalar,avx2,avx512}.c. */
#include "optim_internal.h"

#include "strata/common.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* --- kernels and paths ------------------------------------------------------ */

static const struct st_optim_kernel *const st_kernels[] = {
	&st_optim_kernel_scalar,
#if defined(ST_OPTIM_HAVE_X86)
	&st_optim_kernel_avx2,
	&st_optim_kernel_avx512,
	&st_optim_kernel_avx512bf16,
#endif
};

const struct st_optim_kernel *const *st_optim_kernels(size_t *count)
{
	*count = ST_ARRAY_LEN(st_kernels);
	return st_kernels;
}

const struct st_optim_kernel *st_optim_kernel_for(enum st_optim_path path)
{
	const struct st_optim_kernel *best = &st_optim_kernel_scalar;

	/* The last supported kernel of a path is its best variant. */
	for (size_t i = 0; i < ST_ARRAY_LEN(st_kernels); i++)
		if (st_kernels[i]->path == path && st_kernels[i]->supported())
			best = st_kernels[i];
	return best;
}

static const char *const st_path_names[] = {
	[ST_OPTIM_PATH_AUTO] = "auto",
	[ST_OPTIM_PATH_SCALAR] = "scalar",
	[ST_OPTIM_PATH_AVX2] = "avx2",
	[ST_OPTIM_PATH_AVX512] = "avx512",
};

const char *st_optim_path_name(enum st_optim_path path)
{
	if ((unsigned)path >= ST_ARRAY_LEN(st_path_names))
		return "?";
	return st_path_names[path];
}

int st_optim_path_parse(const char *name, enum st_optim_path *path)
{
	for (size_t i = 0; name && i < ST_ARRAY_LEN(st_path_names); i++) {
		if (!strcmp(name, st_path_names[i])) {
			*path = (enum st_optim_path)i;
			return 0;
		}
	}
	return -EINVAL;
}

int st_optim_path_supported(enum st_optim_path path)
{
	switch (path) {
	case ST_OPTIM_PATH_AUTO:
	case ST_OPTIM_PATH_SCALAR:
		return 1;
	case ST_OPTIM_PATH_AVX2:
	case ST_OPTIM_PATH_AVX512:
		for (size_t i = 0; i < ST_ARRAY_LEN(st_kernels); i++)
			if (st_kernels[i]->path == path && st_kernels[i]->supported())
				return 1;
		return 0;
	}
	return 0;
}

static enum st_optim_path path_best(void)
{
	if (st_optim_path_supported(ST_OPTIM_PATH_AVX512))
		return ST_OPTIM_PATH_AVX512;
	if (st_optim_path_supported(ST_OPTIM_PATH_AVX2))
		return ST_OPTIM_PATH_AVX2;
	return ST_OPTIM_PATH_SCALAR;
}

/* 0: not yet resolved; otherwise an enum st_optim_path other than AUTO. */
static _Atomic int st_path_now;

int st_optim_path_set(enum st_optim_path path)
{
	if ((unsigned)path >= ST_ARRAY_LEN(st_path_names))
		return st_error_set(-EINVAL, "optim path %d out of range", (int)path);
	if (!st_optim_path_supported(path))
		return st_error_set(-ENOTSUP, "optim path %s: not supported by this CPU",
				    st_optim_path_name(path));
	atomic_store(&st_path_now, (int)(path == ST_OPTIM_PATH_AUTO ? path_best() : path));
	return 0;
}

enum st_optim_path st_optim_path_get(void)
{
	int now = atomic_load(&st_path_now);
	const char *env;
	enum st_optim_path want = ST_OPTIM_PATH_AUTO;

	if (now)
		return (enum st_optim_path)now;
	env = getenv("ST_OPTIM_PATH");
	if (env && *env) {
		if (st_optim_path_parse(env, &want))
			st_warn("ST_OPTIM_PATH=%s: not one of auto, scalar, avx2, avx512; using auto",
				env);
		else if (!st_optim_path_supported(want))
			st_warn("ST_OPTIM_PATH=%s: not supported by this CPU; using auto", env);
		if (!st_optim_path_supported(want))
			want = ST_OPTIM_PATH_AUTO;
	}
	now = (int)(want == ST_OPTIM_PATH_AUTO ? path_best() : want);
	/* A racing first call resolves to the same value. */
	atomic_store(&st_path_now, now);
	return (enum st_optim_path)now;
}

/* --- AdamW ---------------------------------------------------------------- */

/* x^k by squaring in fp64: the same bits everywhere, whatever libm's pow. */
static double powi(double x, uint64_t k)
{
	double r = 1.0;

	while (k) {
		if (k & 1u)
			r *= x;
		x *= x;
		k >>= 1;
	}
	return r;
}

int st_adam_prep(struct st_adam_step *step, const struct st_adam_hparams *hp)
{
	double bc1, bc2, lr = hp->lr, wd = hp->weight_decay;

	if (!isfinite(hp->lr) || hp->lr < 0.0f)
		return st_error_set(-EINVAL, "adam: lr %g must be finite and >= 0", (double)hp->lr);
	if (!(hp->beta1 >= 0.0f && hp->beta1 < 1.0f) || !(hp->beta2 >= 0.0f && hp->beta2 < 1.0f))
		return st_error_set(-EINVAL, "adam: betas (%g, %g) must be in [0, 1)",
				    (double)hp->beta1, (double)hp->beta2);
	if (!isfinite(hp->eps) || hp->eps < 0.0f)
		return st_error_set(-EINVAL, "adam: eps %g must be finite and >= 0", (double)hp->eps);
	if (!isfinite(hp->weight_decay) || hp->weight_decay < 0.0f)
		return st_error_set(-EINVAL, "adam: weight_decay %g must be finite and >= 0",
				    (double)hp->weight_decay);
	if (!isfinite(hp->grad_scale))
		return st_error_set(-EINVAL, "adam: grad_scale %g must be finite",
				    (double)hp->grad_scale);
	if (hp->step == 0)
		return st_error_set(-EINVAL, "adam: step must be >= 1 (bias correction)");

	bc1 = 1.0 - powi((double)hp->beta1, hp->step);
	bc2 = 1.0 - powi((double)hp->beta2, hp->step);
	/* bc underflows to 0 only for beta == 1, refused above; beta == 0 gives 1. */
	memset(step, 0, sizeof(*step));
	step->grad_scale = hp->grad_scale;
	step->beta1 = hp->beta1;
	step->one_minus_beta1 = (float)(1.0 - (double)hp->beta1);
	step->beta2 = hp->beta2;
	step->one_minus_beta2 = (float)(1.0 - (double)hp->beta2);
	step->rsqrt_bc2 = (float)(1.0 / sqrt(bc2));
	step->eps = hp->eps;
	step->neg_step_size = (float)(-lr / bc1);
	step->decay = (float)(1.0 - lr * wd);
	step->path = st_optim_path_get();
	return 0;
}

static size_t dtype_bytes(enum st_optim_dtype dt)
{
	return dt == ST_OPTIM_F32 ? 4u : 2u;
}

static int gstat_run(const struct st_optim_kernel *k, const void *g,
		     enum st_optim_dtype g_dtype, size_t n_elems, double *sumsq,
		     uint32_t *absmax_bits);

int st_adam_apply(const struct st_adam_step *step, const struct st_adam_bufs *bufs,
		  size_t n_elems, unsigned flags, uint64_t *nonfinite_elems)
{
	const struct st_optim_kernel *k;
	size_t n_chunks, g_bytes, w_bytes;
	unsigned kflags = 0;
	uint64_t bad = 0;

	if (nonfinite_elems)
		*nonfinite_elems = 0;
	if (bufs->g_dtype != ST_OPTIM_F32 && bufs->g_dtype != ST_OPTIM_BF16)
		return st_error_set(-EINVAL, "adam: gradient dtype %d: want f32 or bf16",
				    (int)bufs->g_dtype);
	if (bufs->w && bufs->w_dtype != ST_OPTIM_F32 && bufs->w_dtype != ST_OPTIM_BF16 &&
	    bufs->w_dtype != ST_OPTIM_F16)
		return st_error_set(-EINVAL, "adam: working-copy dtype %d: want f32, bf16 or f16",
				    (int)bufs->w_dtype);
	if ((unsigned)bufs->state > ST_OPTIM_STATE_Q8)
		return st_error_set(-EINVAL, "adam: state format %d: want fp32, bf16 or q8",
				    (int)bufs->state);
	if (n_elems == 0)
		return 0;
	if (!bufs->g || !bufs->p)
		return st_error_set(-EINVAL, "adam: G, P, M and V must be given");
	if (bufs->state == ST_OPTIM_STATE_F32 ? !bufs->m || !bufs->v
	    : !bufs->mc || !bufs->vc ||
	      (bufs->state == ST_OPTIM_STATE_Q8 && (!bufs->m_scale || !bufs->v_scale)))
		return st_error_set(-EINVAL, "adam: M and V (and q8's scales) must be given for %s",
				    st_optim_state_name(bufs->state));

	k = st_optim_kernel_for(step->path);
	if (!(flags & ST_ADAM_GRAD_CHECKED)) {
		double sumsq;
		uint32_t amax;

		/* |g * s| overflows for some element iff it does for max |g|
		 * (rounding is monotonic), so this decides before any write. */
		gstat_run(k, bufs->g, bufs->g_dtype, n_elems, &sumsq, &amax);
		if (amax >= 0x7f800000u ||
		    !isfinite(st_f32_from_bits(amax) * fabsf(step->grad_scale))) {
			uint64_t cnt = 0;

			if (nonfinite_elems) {
				for (size_t i = 0; i < n_elems; i++) {
					float g = bufs->g_dtype == ST_OPTIM_BF16
						? st_f32_from_bf16(((const uint16_t *)bufs->g)[i])
						: ((const float *)bufs->g)[i];
					cnt += !isfinite(g * step->grad_scale);
				}
				*nonfinite_elems = cnt;
			}
			return st_error_set(-ERANGE, "adam: gradient holds NaN or Inf; nothing updated");
		}
	}

	g_bytes = dtype_bytes(bufs->g_dtype);
	w_bytes = bufs->w ? dtype_bytes(bufs->w_dtype) : 0u;
	if ((uint64_t)n_elems * (g_bytes + 4u + w_bytes) +
		    st_optim_state_bytes(bufs->state, n_elems) >= ST_ADAM_STREAM_MIN_BYTES)
		kflags |= ST_OPTIM_KF_STREAM_W;
	n_chunks = (n_elems + ST_ADAM_CHUNK_ELEMS - 1) / ST_ADAM_CHUNK_ELEMS;
#pragma omp parallel for schedule(static) reduction(+ : bad) if (n_chunks > 1)
	for (size_t c = 0; c < n_chunks; c++) {
		size_t off = c * ST_ADAM_CHUNK_ELEMS;
		size_t len = ST_MIN((size_t)ST_ADAM_CHUNK_ELEMS, n_elems - off);
		struct st_adam_bufs b = *bufs;

		b.g = (const char *)bufs->g + off * g_bytes;
		b.p = bufs->p + off;
		if (bufs->state == ST_OPTIM_STATE_F32) {
			b.m = bufs->m + off;
			b.v = bufs->v + off;
		} else {
			/* off is a multiple of ST_Q8_BLOCK: chunks hold whole blocks */
			size_t cb = bufs->state == ST_OPTIM_STATE_BF16 ? 2u : 1u;

			b.mc = (char *)bufs->mc + off * cb;
			b.vc = (char *)bufs->vc + off * cb;
			if (bufs->state == ST_OPTIM_STATE_Q8) {
				b.m_scale = bufs->m_scale + off / ST_Q8_BLOCK;
				b.v_scale = bufs->v_scale + off / ST_Q8_BLOCK;
			}
		}
		b.w = bufs->w ? (char *)bufs->w + off * w_bytes : NULL;
		bad += k->adam(step, &b, len, kflags);
	}
	if (nonfinite_elems)
		*nonfinite_elems = bad;
	if (bad)
		return st_error_set(-ERANGE, "adam: %llu gradient elements NaN or Inf; left unchanged",
				    (unsigned long long)bad);
	return 0;
}

int st_adam_update(const struct st_adam_hparams *hp, const struct st_adam_bufs *bufs,
		   size_t n_elems, unsigned flags, uint64_t *nonfinite_elems)
{
	struct st_adam_step step;
	int err;

	if (nonfinite_elems)
		*nonfinite_elems = 0;
	err = st_adam_prep(&step, hp);
	if (err)
		return err;
	return st_adam_apply(&step, bufs, n_elems, flags, nonfinite_elems);
}

/* --- state formats ---------------------------------------------------------- */

_Static_assert(ST_ADAM_CHUNK_ELEMS % ST_Q8_BLOCK == 0, "chunks hold whole q8 blocks");

static const char *const st_state_names[] = {
	[ST_OPTIM_STATE_F32] = "fp32",
	[ST_OPTIM_STATE_BF16] = "bf16",
	[ST_OPTIM_STATE_Q8] = "q8",
};

const char *st_optim_state_name(enum st_optim_state st)
{
	if ((unsigned)st >= ST_ARRAY_LEN(st_state_names))
		return "?";
	return st_state_names[st];
}

int st_optim_state_parse(const char *name, enum st_optim_state *st)
{
	for (size_t i = 0; name && i < ST_ARRAY_LEN(st_state_names); i++) {
		if (!strcmp(name, st_state_names[i])) {
			*st = (enum st_optim_state)i;
			return 0;
		}
	}
	return -EINVAL;
}

void st_optim_state_load(const struct st_adam_bufs *b, size_t n, float *m, float *v)
{
	for (size_t i = 0; i < n; i++) {
		float mi, vi, sv;

		switch (b->state) {
		case ST_OPTIM_STATE_BF16:
			mi = st_f32_from_bf16(((const uint16_t *)b->mc)[i]);
			vi = st_f32_from_bf16(((const uint16_t *)b->vc)[i]);
			break;
		case ST_OPTIM_STATE_Q8:
			mi = st_q8m_decode(((const uint8_t *)b->mc)[i]) * b->m_scale[i / ST_Q8_BLOCK];
			sv = st_q8v_decode(((const uint8_t *)b->vc)[i]) * b->v_scale[i / ST_Q8_BLOCK];
			vi = sv * sv;
			break;
		default:
			mi = b->m[i];
			vi = b->v[i];
			break;
		}
		if (m)
			m[i] = mi;
		if (v)
			v[i] = vi;
	}
}

void st_optim_state_store(const struct st_adam_bufs *b, size_t n, const float *m,
			  const float *v)
{
	for (size_t k0 = 0; k0 < n; k0 += ST_Q8_BLOCK) {
		size_t len = ST_MIN((size_t)ST_Q8_BLOCK, n - k0);
		uint32_t mmax = 0, smax = 0;
		struct st_q8_scales q;

		for (size_t i = k0; i < k0 + len; i++) {
			switch (b->state) {
			case ST_OPTIM_STATE_BF16:
				((uint16_t *)b->mc)[i] = st_bf16_from_f32(m[i]);
				((uint16_t *)b->vc)[i] = st_bf16_from_f32(v[i]);
				break;
			case ST_OPTIM_STATE_Q8:
				mmax = ST_MAX(mmax, st_f32_bits(m[i]) & 0x7fffffffu);
				smax = ST_MAX(smax, st_f32_bits(sqrtf(v[i])) & 0x7fffffffu);
				break;
			default:
				b->m[i] = m[i];
				b->v[i] = v[i];
				break;
			}
		}
		if (b->state != ST_OPTIM_STATE_Q8)
			continue;
		q = st_q8_block_scales(mmax, smax);
		for (size_t i = k0; i < k0 + len; i++)
			st_q8_pass2(b, i, &q, m[i], sqrtf(v[i]));
		b->m_scale[k0 / ST_Q8_BLOCK] = q.m_scale;
		b->v_scale[k0 / ST_Q8_BLOCK] = q.v_scale;
	}
}

/* --- gradient statistics -------------------------------------------------- */

/* Chunks per parallel region; their partial sums wait on the stack and are
 * then added in chunk order by one thread. */
#define ST_GSTAT_BLOCK_CHUNKS 256u

static int gstat_run(const struct st_optim_kernel *k, const void *g,
		     enum st_optim_dtype g_dtype, size_t n_elems, double *sumsq,
		     uint32_t *absmax_bits)
{
	size_t n_chunks = (n_elems + ST_GSTAT_CHUNK_ELEMS - 1) / ST_GSTAT_CHUNK_ELEMS;
	size_t g_bytes = dtype_bytes(g_dtype);
	double total = 0.0;
	uint32_t amax = 0;

	for (size_t blk = 0; blk < n_chunks; blk += ST_GSTAT_BLOCK_CHUNKS) {
		size_t nb = ST_MIN((size_t)ST_GSTAT_BLOCK_CHUNKS, n_chunks - blk);
		double part[ST_GSTAT_BLOCK_CHUNKS];
		uint32_t part_max[ST_GSTAT_BLOCK_CHUNKS];

#pragma omp parallel for schedule(static) if (nb > 1)
		for (size_t c = 0; c < nb; c++) {
			size_t off = (blk + c) * ST_GSTAT_CHUNK_ELEMS;
			size_t len = ST_MIN((size_t)ST_GSTAT_CHUNK_ELEMS, n_elems - off);
			double l[ST_GSTAT_LANES] = { 0 };
			uint32_t am = 0;

			k->gstat((const char *)g + off * g_bytes, g_dtype, len, l, &am);
			part[c] = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
			part_max[c] = am;
		}
		for (size_t c = 0; c < nb; c++) {
			total += part[c];
			amax = ST_MAX(amax, part_max[c]);
		}
	}
	*sumsq = total;
	*absmax_bits = amax;
	return amax >= 0x7f800000u ? -ERANGE : 0;
}

int st_grad_sumsq(const void *g, enum st_optim_dtype g_dtype, size_t n_elems, double *sumsq)
{
	uint32_t amax;

	*sumsq = 0.0;
	if (g_dtype != ST_OPTIM_F32 && g_dtype != ST_OPTIM_BF16)
		return st_error_set(-EINVAL, "grad sumsq: dtype %d: want f32 or bf16", (int)g_dtype);
	if (n_elems == 0)
		return 0;
	if (!g)
		return st_error_set(-EINVAL, "grad sumsq: G must be given");
	if (gstat_run(st_optim_kernel_for(st_optim_path_get()), g, g_dtype, n_elems, sumsq,
		      &amax))
		return st_error_set(-ERANGE, "grad sumsq: gradient holds NaN or Inf");
	return 0;
}

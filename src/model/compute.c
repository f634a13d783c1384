/* Compute: the sticky-error wrappers, the cpu compute (the cpu kernels as
 * they are) and the choice of compute for a device. */
#include "strata/compute.h"

#include "strata/device.h"
#include "strata/kernels.h"

#include <errno.h>
#include <string.h>

/* ---- the cpu compute -------------------------------------------------------- */

static int cpu_sync(struct st_compute *c)
{
	(void)c;
	return 0;
}

static void cpu_destroy(struct st_compute *c)
{
	(void)c;
}

static int cpu_zero(struct st_compute *c, void *p, size_t bytes)
{
	(void)c;
	memset(p, 0, bytes);
	return 0;
}

/* copy, to_host and from_host: device memory is host memory. */
static int cpu_copy(struct st_compute *c, void *dst, const void *src, size_t bytes)
{
	(void)c;
	memcpy(dst, src, bytes);
	return 0;
}

static int cpu_bf16_to_f32(struct st_compute *c, float *out, const uint16_t *in, size_t n)
{
	(void)c;
	st_cpu_bf16_to_f32(out, in, n);
	return 0;
}

static int cpu_gemm(struct st_compute *c, int ta, int tb, int M, int N, int K,
		    const float *A, int lda, const float *B, int ldb, float beta, float *C,
		    int ldc)
{
	(void)c;
	st_cpu_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
	return 0;
}

static int cpu_matmul_fwd(struct st_compute *c, float *out, const float *inp,
			  const float *weight, const float *bias, int N, int IC, int OC)
{
	(void)c;
	st_cpu_matmul_fwd(out, inp, weight, bias, N, IC, OC);
	return 0;
}

static int cpu_matmul_bwd(struct st_compute *c, float *dinp, float *dweight, float *dbias,
			  const float *dout, const float *inp, const float *weight, int N,
			  int IC, int OC)
{
	(void)c;
	st_cpu_matmul_bwd(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
	return 0;
}

static int cpu_layernorm_fwd(struct st_compute *c, float *out, float *mean, float *rstd,
			     const float *inp, const float *weight, const float *bias, int N,
			     int C)
{
	(void)c;
	st_cpu_layernorm_fwd(out, mean, rstd, inp, weight, bias, N, C);
	return 0;
}

static int cpu_layernorm_bwd(struct st_compute *c, float *dinp, float *dweight,
			     float *dbias, const float *dout, const float *inp,
			     const float *weight, const float *mean, const float *rstd, int N,
			     int C)
{
	(void)c;
	st_cpu_layernorm_bwd(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
	return 0;
}

static int cpu_gelu_fwd(struct st_compute *c, float *out, const float *inp, size_t n)
{
	(void)c;
	st_cpu_gelu_fwd(out, inp, n);
	return 0;
}

static int cpu_gelu_bwd(struct st_compute *c, float *dinp, const float *inp,
			const float *dout, size_t n)
{
	(void)c;
	st_cpu_gelu_bwd(dinp, inp, dout, n);
	return 0;
}

static int cpu_residual_fwd(struct st_compute *c, float *out, const float *a,
			    const float *b, size_t n)
{
	(void)c;
	st_cpu_residual_fwd(out, a, b, n);
	return 0;
}

static int cpu_embedding_fwd(struct st_compute *c, float *out, const int32_t *tokens,
			     const float *wte, const float *wpe, int B, int T, int C)
{
	(void)c;
	st_cpu_embedding_fwd(out, tokens, wte, wpe, B, T, C);
	return 0;
}

static int cpu_embedding_bwd(struct st_compute *c, float *dwte, float *dwpe,
			     const float *dout, const int32_t *tokens, int B, int T, int C)
{
	(void)c;
	st_cpu_embedding_bwd(dwte, dwpe, dout, tokens, B, T, C);
	return 0;
}

static int cpu_attention_fwd(struct st_compute *c, float *out, float *lse,
			     const float *qkv, int B, int T, int C, int NH)
{
	(void)c;
	st_cpu_attention_fwd(out, lse, qkv, B, T, C, NH);
	return 0;
}

static int cpu_attention_bwd(struct st_compute *c, float *dqkv, const float *dout,
			     const float *qkv, const float *out, const float *lse, int B,
			     int T, int C, int NH)
{
	(void)c;
	st_cpu_attention_bwd(dqkv, dout, qkv, out, lse, B, T, C, NH);
	return 0;
}

static int cpu_crossentropy_fwd(struct st_compute *c, float *losses, const float *logits,
				const int32_t *targets, int N, int V)
{
	(void)c;
	st_cpu_crossentropy_fwd(losses, logits, targets, N, V);
	return 0;
}

static int cpu_crossentropy_bwd(struct st_compute *c, float *dlogits, float *losses,
				const float *logits, const int32_t *targets, float dloss,
				int N, int V)
{
	(void)c;
	st_cpu_crossentropy_bwd(dlogits, losses, logits, targets, dloss, N, V);
	return 0;
}

static const struct st_compute_ops cpu_ops = {
	.name = "cpu",
	.sync = cpu_sync,
	.destroy = cpu_destroy,
	.zero = cpu_zero,
	.copy = cpu_copy,
	.to_host = cpu_copy,
	.from_host = cpu_copy,
	.bf16_to_f32 = cpu_bf16_to_f32,
	.gemm = cpu_gemm,
	.matmul_fwd = cpu_matmul_fwd,
	.matmul_bwd = cpu_matmul_bwd,
	.layernorm_fwd = cpu_layernorm_fwd,
	.layernorm_bwd = cpu_layernorm_bwd,
	.gelu_fwd = cpu_gelu_fwd,
	.gelu_bwd = cpu_gelu_bwd,
	.residual_fwd = cpu_residual_fwd,
	.embedding_fwd = cpu_embedding_fwd,
	.embedding_bwd = cpu_embedding_bwd,
	.attention_fwd = cpu_attention_fwd,
	.attention_bwd = cpu_attention_bwd,
	.crossentropy_fwd = cpu_crossentropy_fwd,
	.crossentropy_bwd = cpu_crossentropy_bwd,
};

static struct st_compute cpu_compute = { .ops = &cpu_ops };

struct st_compute *st_compute_cpu(void)
{
	return &cpu_compute;
}

/* ---- instances --------------------------------------------------------------- */

int st_compute_create(struct st_device *d, struct st_compute **out)
{
	const char *name = st_device_name(d);

	*out = NULL;
	if (strcmp(name, "cpu") == 0) {
		*out = &cpu_compute;
		return 0;
	}
#ifdef ST_HAVE_CUDA
	if (strcmp(name, "cuda") == 0)
		return st_compute_cuda_create(st_device_ordinal(d), out);
#endif
	return st_error_set(-ENODEV, "compute: no compute for device '%s'", name);
}

void st_compute_destroy(struct st_compute *c)
{
	if (c && c != &cpu_compute)
		c->ops->destroy(c);
}

const char *st_compute_name(const struct st_compute *c)
{
	return c->ops->name;
}

int st_compute_take_error(struct st_compute *c)
{
	int err = c->err;

	c->err = 0;
	return err;
}

int st_compute_sync(struct st_compute *c)
{
	int ret = c->ops->sync(c);

	if (c->err)
		ret = c->err;
	c->err = 0;
	return ret;
}

/* ---- the ops: skipped while an error is sticky ---------------------------------- */

#define OP(call)                            \
	do {                                \
		if (c->err == 0) {          \
			int r_ = c->ops->call; \
			if (r_)             \
				c->err = r_; \
		}                           \
	} while (0)

void st_compute_zero(struct st_compute *c, void *p, size_t bytes)
{
	OP(zero(c, p, bytes));
}

void st_compute_copy(struct st_compute *c, void *dst, const void *src, size_t bytes)
{
	OP(copy(c, dst, src, bytes));
}

void st_compute_to_host(struct st_compute *c, void *dst, const void *src, size_t bytes)
{
	OP(to_host(c, dst, src, bytes));
}

void st_compute_from_host(struct st_compute *c, void *dst, const void *src, size_t bytes)
{
	OP(from_host(c, dst, src, bytes));
}

void st_compute_bf16_to_f32(struct st_compute *c, float *out, const uint16_t *in, size_t n)
{
	OP(bf16_to_f32(c, out, in, n));
}

void st_compute_gemm(struct st_compute *c, int trans_a, int trans_b, int M, int N, int K,
		     const float *A, int lda, const float *B, int ldb, float beta, float *C,
		     int ldc)
{
	OP(gemm(c, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc));
}

void st_compute_matmul_fwd(struct st_compute *c, float *out, const float *inp,
			   const float *weight, const float *bias, int N, int IC, int OC)
{
	OP(matmul_fwd(c, out, inp, weight, bias, N, IC, OC));
}

void st_compute_matmul_bwd(struct st_compute *c, float *dinp, float *dweight, float *dbias,
			   const float *dout, const float *inp, const float *weight, int N,
			   int IC, int OC)
{
	OP(matmul_bwd(c, dinp, dweight, dbias, dout, inp, weight, N, IC, OC));
}

void st_compute_layernorm_fwd(struct st_compute *c, float *out, float *mean, float *rstd,
			      const float *inp, const float *weight, const float *bias,
			      int N, int C)
{
	OP(layernorm_fwd(c, out, mean, rstd, inp, weight, bias, N, C));
}

void st_compute_layernorm_bwd(struct st_compute *c, float *dinp, float *dweight,
			      float *dbias, const float *dout, const float *inp,
			      const float *weight, const float *mean, const float *rstd,
			      int N, int C)
{
	OP(layernorm_bwd(c, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C));
}

void st_compute_gelu_fwd(struct st_compute *c, float *out, const float *inp, size_t n)
{
	OP(gelu_fwd(c, out, inp, n));
}

void st_compute_gelu_bwd(struct st_compute *c, float *dinp, const float *inp,
			 const float *dout, size_t n)
{
	OP(gelu_bwd(c, dinp, inp, dout, n));
}

void st_compute_residual_fwd(struct st_compute *c, float *out, const float *a,
			     const float *b, size_t n)
{
	OP(residual_fwd(c, out, a, b, n));
}

void st_compute_embedding_fwd(struct st_compute *c, float *out, const int32_t *tokens,
			      const float *wte, const float *wpe, int B, int T, int C)
{
	OP(embedding_fwd(c, out, tokens, wte, wpe, B, T, C));
}

void st_compute_embedding_bwd(struct st_compute *c, float *dwte, float *dwpe,
			      const float *dout, const int32_t *tokens, int B, int T, int C)
{
	OP(embedding_bwd(c, dwte, dwpe, dout, tokens, B, T, C));
}

void st_compute_attention_fwd(struct st_compute *c, float *out, float *lse,
			      const float *qkv, int B, int T, int C, int NH)
{
	OP(attention_fwd(c, out, lse, qkv, B, T, C, NH));
}

void st_compute_attention_bwd(struct st_compute *c, float *dqkv, const float *dout,
			      const float *qkv, const float *out, const float *lse, int B,
			      int T, int C, int NH)
{
	OP(attention_bwd(c, dqkv, dout, qkv, out, lse, B, T, C, NH));
}

void st_compute_crossentropy_fwd(struct st_compute *c, float *losses, const float *logits,
				 const int32_t *targets, int N, int V)
{
	OP(crossentropy_fwd(c, losses, logits, targets, N, V));
}

void st_compute_crossentropy_bwd(struct st_compute *c, float *dlogits, float *losses,
				 const float *logits, const int32_t *targets, float dloss,
				 int N, int V)
{
	OP(crossentropy_bwd(c, dlogits, losses, logits, targets, dloss, N, V));
}

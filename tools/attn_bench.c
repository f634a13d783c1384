/* attn-bench: strata's causal attention kernels on the GPU, the fp32 ones
 * (attention.cu) against the bf16 tensor-core ones (attention_bf16.cu),
 * forward and backward, at GPT-2's and LLaMA's shapes. Each call is timed
 * with timing events on the kernels' stream; the variants alternate call
 * by call (interleaved), and each row is the median of --rounds x --iters
 * calls. tools/attn-sdpa times PyTorch's SDPA at the same shapes;
 * tools/gpu-check's attn_bench and torch_attn steps run both and print
 * their ratios (docs/gpu.md).
 *
 * Model FLOPs: causal forward 2 B NH T^2 hs (two matmuls over half the
 * scores), backward 2.5 times that (FlashAttention-2's count: five
 * matmuls; strata's recomputes S and dP once more in the dQ pass, which is
 * not counted). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_stats.h"
#include "cuda_ops.h"

struct shape {
	const char *name;
	int B, T, NH, NKV, hs; /* NKV == NH: GPT-2's MHA (qkv interleaved) */
};

static const struct shape shapes[] = {
	{ "gpt2", 8, 1024, 12, 12, 64 },
	{ "llama-1b", 4, 1024, 32, 8, 64 },
	{ "llama-hd128", 2, 1024, 32, 8, 128 },
};

enum { V_F32, V_BF16, NV };
enum { P_FWD, P_BWD, NP };

static struct st_cuda_ctx *ctx;

static void die(const char *what, int rc)
{
	fprintf(stderr, "attn-bench: %s: %d: %s\n", what, rc, st_error_last());
	exit(1);
}

static void *dev(size_t bytes, int byte)
{
	void *d = NULL;
	int rc = st_cuda_alloc(&d, bytes);

	if (rc || (rc = st_cuda_memset(d, byte, bytes)))
		die("device memory", rc);
	return d;
}

/* Inputs of small values: bf16 0x3c00 (2^-7), fp32 bytes 0x3c3c3c3c (~0.0115). */
struct bufs {
	void *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv;
};

static struct bufs make(const struct shape *s, int variant)
{
	const size_t e = variant == V_BF16 ? 2 : 4;
	const size_t nq = (size_t)s->B * s->T * s->NH * s->hs;
	const size_t nk = (size_t)s->B * s->T * s->NKV * s->hs;
	const int mha = s->NKV == s->NH;
	struct bufs b = { 0 };

	b.q = dev(e * (mha ? 3 * nq : nq), 0x3c);
	b.k = mha ? NULL : dev(e * nk, 0x3c);
	b.v = mha ? NULL : dev(e * nk, 0x3c);
	b.out = dev(e * nq, 0x3c);
	b.dout = dev(e * nq, 0x3c);
	b.lse = dev(4 * (size_t)s->B * s->NH * s->T, 0);
	b.dq = dev(4 * (mha ? 3 * nq : nq), 0); /* fp32 gradients in both */
	b.dk = mha ? NULL : dev(4 * nk, 0);
	b.dv = mha ? NULL : dev(4 * nk, 0);
	return b;
}

static void drop(struct bufs *b)
{
	void *p[] = { b->q, b->k, b->v, b->out, b->lse, b->dout, b->dq, b->dk, b->dv };
	for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++)
		if (p[i])
			st_cuda_free(p[i]);
}

static int call(const struct shape *s, int variant, int pass, struct bufs *b)
{
	const int C = s->NH * s->hs;

	if (s->NKV == s->NH) {
		if (variant == V_F32)
			return pass == P_FWD ? st_cuda_attention_fwd(ctx, b->out, b->lse, b->q, s->B,
								     s->T, C, s->NH)
					     : st_cuda_attention_bwd(ctx, b->dq, b->dout, b->q,
								     b->out, b->lse, s->B, s->T,
								     C, s->NH);
		return pass == P_FWD ? st_cuda_attention_fwd_bf16(ctx, b->out, b->lse, b->q, s->B,
								  s->T, C, s->NH)
				     : st_cuda_attention_bwd_bf16(ctx, b->dq, 0, b->dout, b->q,
								  b->out, b->lse, s->B, s->T, C,
								  s->NH);
	}
	if (variant == V_F32)
		return pass == P_FWD
			       ? st_cuda_gqa_attention_fwd(ctx, b->out, b->lse, b->q, b->k, b->v,
							   s->B, s->T, s->NH, s->NKV, s->hs)
			       : st_cuda_gqa_attention_bwd(ctx, b->dq, b->dk, b->dv, b->dout, b->q,
							   b->k, b->v, b->out, b->lse, s->B, s->T,
							   s->NH, s->NKV, s->hs);
	return pass == P_FWD ? st_cuda_gqa_attention_fwd_bf16(ctx, b->out, b->lse, b->q, b->k,
							      b->v, s->B, s->T, s->NH, s->NKV,
							      s->hs)
			     : st_cuda_gqa_attention_bwd_bf16(ctx, b->dq, b->dk, b->dv, 0, b->dout,
							      b->q, b->k, b->v, b->out, b->lse,
							      s->B, s->T, s->NH, s->NKV, s->hs);
}

/* Seconds of one call on the GPU (timing events around it). */
static double timed(struct st_cuda_timer *t, const struct shape *s, int variant, int pass,
		    struct bufs *b)
{
	uint64_t t0, t1;
	int rc;

	if ((rc = st_cuda_timer_mark(ctx, t, 0)) || (rc = call(s, variant, pass, b)) ||
	    (rc = st_cuda_timer_mark(ctx, t, 1)) || (rc = st_cuda_sync(ctx)))
		die("a timed call", rc);
	rc = st_cuda_timer_read(ctx, t, &t0, &t1);
	if (rc != 1)
		die("st_cuda_timer_read", rc < 0 ? rc : -EIO);
	return (double)(t1 - t0) * 1e-9;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: attn-bench [--rounds N] [--iters N] [--json FILE]\n"
		   "  strata's fp32 and bf16 (tensor-core) causal attention on the GPU,\n"
		   "  forward and backward, at gpt2 (B=8 T=1024 NH=12 hs=64), llama-1b\n"
		   "  (B=4 T=1024 NH=32 NKV=8 hs=64) and llama-hd128 (B=2 T=1024 NH=32\n"
		   "  NKV=8 hs=128); medians of rounds x iters calls, interleaved\n"
		   "  (default 5 x 4). Exit 77 without a GPU.\n");
}

int main(int argc, char **argv)
{
	int rounds = 5, iters = 4;
	const char *json = NULL;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help")) {
			usage(stdout);
			return 0;
		} else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) {
			rounds = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
			iters = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--json") && i + 1 < argc) {
			json = argv[++i];
		} else {
			fprintf(stderr, "attn-bench: unknown argument %s (see --help)\n", argv[i]);
			return 2;
		}
	}
	if (rounds < 1 || iters < 1 || rounds * iters > 10000) {
		fprintf(stderr, "attn-bench: --rounds and --iters must be >= 1 (product <= 10000)\n");
		return 2;
	}
	if (!st_cuda_available()) {
		printf("no GPU: skipped\n");
		return 77;
	}
	FILE *jf = NULL;
	if (json && !(jf = fopen(json, "w"))) {
		fprintf(stderr, "attn-bench: %s: %s\n", json, strerror(errno));
		return 1;
	}
	int rc = st_cuda_ctx_create(0, &ctx);
	if (rc)
		die("st_cuda_ctx_create", rc);
	struct st_cuda_timer *t;
	if ((rc = st_cuda_timer_create(ctx, &t)))
		die("st_cuda_timer_create", rc);
	const int n = rounds * iters;
	double *v[NV][NP];
	for (int a = 0; a < NV; a++)
		for (int p = 0; p < NP; p++)
			if (!(v[a][p] = malloc(sizeof(double) * (size_t)n)))
				die("malloc", -ENOMEM);
	printf("%-12s %-5s %4s %11s %11s %9s %9s %7s\n", "shape", "pass", "", "fp32 ms",
	       "bf16 ms", "fp32 TF/s", "bf16 TF/s", "speedup");
	if (jf)
		fprintf(jf, "[\n");
	for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
		const struct shape *s = &shapes[si];
		struct bufs b[NV] = { make(s, V_F32), make(s, V_BF16) };
		for (int a = 0; a < NV; a++) /* warm-up: module load, first launch */
			for (int p = 0; p < NP; p++)
				timed(t, s, a, p, &b[a]);
		for (int k = 0; k < n; k++)
			for (int p = 0; p < NP; p++)
				for (int a = 0; a < NV; a++)
					v[a][p][k] = timed(t, s, a, p, &b[a]);
		const double fwd_flops = 2.0 * s->B * s->NH * (double)s->T * s->T * s->hs;
		for (int p = 0; p < NP; p++) {
			const double flops = p == P_FWD ? fwd_flops : 2.5 * fwd_flops;
			const double m32 = bench_median(v[V_F32][p], n);
			const double m16 = bench_median(v[V_BF16][p], n);
			printf("%-12s %-5s %4s %11.3f %11.3f %9.1f %9.1f %7.2f\n", s->name,
			       p == P_FWD ? "fwd" : "bwd", "", m32 * 1e3, m16 * 1e3,
			       flops / m32 * 1e-12, flops / m16 * 1e-12, m32 / m16);
			if (jf)
				fprintf(jf,
					"%s  {\"shape\": \"%s\", \"pass\": \"%s\", \"B\": %d, \"T\": %d, "
					"\"NH\": %d, \"NKV\": %d, \"hs\": %d, \"f32_s\": %.9g, "
					"\"bf16_s\": %.9g, \"flops\": %.6g, \"calls\": %d}",
					si || p ? ",\n" : "", s->name, p == P_FWD ? "fwd" : "bwd", s->B,
					s->T, s->NH, s->NKV, s->hs, m32, m16, flops, n);
		}
		drop(&b[V_F32]);
		drop(&b[V_BF16]);
	}
	if (jf) {
		fprintf(jf, "\n]\n");
		if (fclose(jf)) {
			fprintf(stderr, "attn-bench: %s: %s\n", json, strerror(errno));
			return 1;
		}
	}
	st_cuda_timer_destroy(t);
	st_cuda_ctx_destroy(ctx);
	return 0;
}

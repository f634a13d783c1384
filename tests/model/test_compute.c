/* The compute seam on the cpu: every op row (tests/compute_cases.h) on the
 * direct cpu compute and on the queued one, bit for bit; what supports()
 * answers and what run does with an op it refuses; the queued compute's
 * ring of op records wrapping many times under load (the caller blocks,
 * nothing is lost or reordered); the bf16-operand matmul kernel against an
 * fp64 reference on the same bf16 inputs. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "compute_internal.h"
#include "compute_cases.h"
#include "compute_cases_bf16.h"
#include "strata/compute.h"
#include "strata/device.h"
#include "strata/kernels.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static struct st_device *dev;
static struct st_compute *qc; /* the queued cpu compute on dev */

static int setup(void **state)
{
	struct st_device_config dc = { 0 };

	(void)state;
	if (st_device_create(&st_device_cpu_ops, &dc, &dev) != 0)
		return -1;
	return st_compute_create(dev, &qc);
}

static int teardown(void **state)
{
	(void)state;
	st_compute_destroy(qc);
	st_device_destroy(dev);
	return 0;
}

/* Every op of ST_OP_LIST has at least one row. */
static void test_rows_cover_every_op(void **state)
{
	(void)state;
	for (int k = 0; k < ST_OP_COUNT; k++) {
		size_t r = 0;

		while (r < N_OP_CASES && op_cases[r].kind != (enum st_op_kind)k)
			r++;
		if (r == N_OP_CASES)
			fail_msg("op %s has no row in tests/compute_cases.h", st_op_name(k));
	}
	assert_string_equal(st_op_name(ST_OP_MATMUL_FWD), "matmul_fwd");
	assert_string_equal(st_op_name(ST_OP_COUNT), "?");
	assert_int_equal(st_op_tensors(ST_OP_LAYERNORM_BWD), 8);
	assert_int_equal(st_op_ref_dtype(ST_OP_EMBEDDING_FWD, 1), ST_DTYPE_I32);
	assert_int_equal(st_op_ref_dtype(ST_OP_BF16_TO_F32, 1), ST_DTYPE_BF16);
}

/* Each row on the direct compute and on the queued one from the same
 * inputs: every slot (outputs, and the inputs left alone) bit for bit. */
static void test_direct_vs_queued(void **state)
{
	(void)state;
	for (size_t r = 0; r < N_OP_CASES; r++) {
		const struct op_case *c = &op_cases[r];
		void *a[ST_OP_MAX_TENSORS], *b[ST_OP_MAX_TENSORS];
		struct st_op oa, ob;
		int n = st_op_tensors(c->kind);

		case_fill(c, r + 1, a, &oa);
		case_fill(c, r + 1, b, &ob);
		st_compute_run(st_compute_cpu(), &oa);
		assert_int_equal(st_compute_take_error(st_compute_cpu()), 0);
		st_compute_run(qc, &ob);
		assert_int_equal(st_compute_sync(qc), 0);
		for (int k = 0; k < n; k++) {
			if (!a[k])
				continue;
			if (memcmp(a[k], b[k], case_bytes(&c->t[k])) != 0)
				fail_msg("%s: slot %d differs between the direct and the queued compute",
					 c->what, k);
		}
		/* what the op writes was written (no poison left in outputs) */
		for (int k = 0; k < n; k++)
			if (a[k] && c->t[k].role == OUT && c->t[k].dtype == ST_DTYPE_F32)
				for (int64_t e = 0; e < c->t[k].elems; e++)
					if (!isfinite(((float *)a[k])[e]))
						fail_msg("%s: slot %d element %lld not written", c->what,
							 k, (long long)e);
		case_free(a);
		case_free(b);
	}
}

/* The bf16 path's rows (tests/compute_cases_bf16.h): supported by both cpu
 * computes, and the queued one gives the direct one's bits. */
static void test_bf16_rows_direct_vs_queued(void **state)
{
	(void)state;
	for (size_t r = 0; r < N_OP_CASES_BF16; r++) {
		const struct op_case *c = &op_cases_bf16[r];
		void *a[ST_OP_MAX_TENSORS], *b[ST_OP_MAX_TENSORS];
		struct st_op oa, ob;

		case_fill(c, r + 1, a, &oa);
		case_fill(c, r + 1, b, &ob);
		if (!st_compute_supports_op(st_compute_cpu(), &oa) || !st_compute_supports_op(qc, &ob))
			fail_msg("%s: not supported by the cpu computes", c->what);
		st_compute_run(st_compute_cpu(), &oa);
		assert_int_equal(st_compute_take_error(st_compute_cpu()), 0);
		st_compute_run(qc, &ob);
		assert_int_equal(st_compute_sync(qc), 0);
		for (int k = 0; k < st_op_tensors(c->kind); k++)
			if (a[k] && memcmp(a[k], b[k], case_bytes(&c->t[k])) != 0)
				fail_msg("%s: slot %d differs between the direct and the queued compute",
					 c->what, k);
		case_free(a);
		case_free(b);
	}
}

/* The cpu's bf16 attention (kernels_bf16.c widens the bf16 slots) hands
 * the seg slot through: a bf16 attention_fwd record with a seg is the fp32
 * seg kernel on the widened qkv, its output rounded, bit for bit; and not
 * the causal one. */
static void test_bf16_attention_seg(void **state)
{
	enum { B = 2, T = 70, C = 64, NH = 2 };
	static uint16_t qkv[B * T * 3 * C], out[B * T * C];
	static float wq[B * T * 3 * C], wo[B * T * C], lse[B * NH * T], lse2[B * NH * T];
	static uint16_t want[B * T * C];
	int32_t seg[B * T];
	(void)state;
	case_rng = 99;
	for (size_t i = 0; i < ST_ARRAY_LEN(qkv); i++)
		qkv[i] = st_cpu_bf16_from_f32(case_f32(2.0f));
	case_seg(seg, B * T, T);
	struct st_op op = { .kind = ST_OP_ATTENTION_FWD,
			    .t = { st_tensor_3d(out, ST_DTYPE_BF16, B, T, C),
				   st_tensor_3d(lse, ST_DTYPE_F32, B, NH, T),
				   st_tensor_3d(qkv, ST_DTYPE_BF16, B, T, 3 * C),
				   st_tensor_2d(seg, ST_DTYPE_I32, B, T) },
			    .i = { B, T, C, NH } };
	assert_true(st_compute_supports_op(st_compute_cpu(), &op));
	st_compute_run(st_compute_cpu(), &op);
	assert_int_equal(st_compute_take_error(st_compute_cpu()), 0);
	st_cpu_bf16_to_f32(wq, qkv, ST_ARRAY_LEN(qkv));
	st_cpu_attention_fwd_seg(wo, lse2, wq, B, T, C, NH, seg);
	st_cpu_f32_to_bf16(want, wo, ST_ARRAY_LEN(want));
	assert_memory_equal(out, want, sizeof(out));
	assert_memory_equal(lse, lse2, sizeof(lse));
	st_cpu_attention_fwd(wo, lse2, wq, B, T, C, NH);
	st_cpu_f32_to_bf16(want, wo, ST_ARRAY_LEN(want));
	assert_true(memcmp(out, want, sizeof(out)) != 0);
}

/* The bf16 rows are shapes the cuda compute runs (so tests/cuda/
 * test_cuda_bf16.c runs every one of them on a GPU): its shape rule,
 * st_compute_cuda_supports_shape(), needs no GPU. The bf16 attention at
 * compute_cases.h's head size of 24 is what it refuses. */
static void test_bf16_rows_cuda_shapes(void **state)
{
	(void)state;
#ifdef ST_HAVE_CUDA
	char why[160];

	for (size_t r = 0; r < N_OP_CASES_BF16; r++) {
		const struct op_case *c = &op_cases_bf16[r];
		void *a[ST_OP_MAX_TENSORS];
		struct st_op op;

		case_fill(c, r + 1, a, &op);
		why[0] = '\0';
		if (!st_compute_cuda_supports_shape(&op, why, sizeof(why)))
			fail_msg("%s: a shape the cuda compute does not run: %s", c->what, why);
		case_free(a);
	}
	struct st_op op = { .kind = ST_OP_ATTENTION_FWD,
			    .t = { st_tensor_1d(NULL, ST_DTYPE_BF16, CB * CT * CC),
				   st_tensor_1d(NULL, ST_DTYPE_F32, CB * CNH * CT),
				   st_tensor_1d(NULL, ST_DTYPE_BF16, CB * CT * 3 * CC) },
			    .i = { CB, CT, CC, CNH } };
	assert_false(st_compute_cuda_supports_shape(&op, why, sizeof(why)));
	assert_non_null(strstr(why, "head size 24"));
	op.t[2].dtype = op.t[0].dtype = ST_DTYPE_F32; /* the fp32 attention: any head size */
	assert_true(st_compute_cuda_supports_shape(&op, why, sizeof(why)));
	/* packed documents: both the fp32 and the bf16 kernels take a seg */
	static const int32_t seg[CB * CT];
	op.t[3] = st_tensor_1d(seg, ST_DTYPE_I32, CB * CT);
	assert_true(st_compute_cuda_supports_shape(&op, why, sizeof(why)));
	op.t[2].dtype = op.t[0].dtype = ST_DTYPE_BF16;
	op.i[2] = 4 * 64; /* head size 64 */
	assert_true(st_compute_cuda_supports_shape(&op, why, sizeof(why)));
	struct st_op g = { .kind = ST_OP_GQA_ATTENTION_BWD, .i = { CB, CT, QH, QKV, QD } };
	for (int k = 0; k < 9; k++)
		g.t[k].dtype = k == 8 ? ST_DTYPE_F32 : ST_DTYPE_BF16;
	assert_false(st_compute_cuda_supports_shape(&g, why, sizeof(why)));
	g.i[4] = 64;
	assert_true(st_compute_cuda_supports_shape(&g, why, sizeof(why)));
#else
	skip();
#endif
}

/* The typed conveniences fill the same records as the rows: the model's
 * path and the seam's agree (a spot check on two ops). */
static void test_typed_is_run(void **state)
{
	(void)state;
	enum { N = 9, IC = 17, OC = 24 };
	float inp[N * IC], w[IC * OC], bias[OC], o1[N * OC], o2[N * OC];

	case_rng = 5;
	for (int i = 0; i < N * IC; i++)
		inp[i] = case_f32(1.0f);
	for (int i = 0; i < IC * OC; i++)
		w[i] = case_f32(0.2f);
	for (int i = 0; i < OC; i++)
		bias[i] = case_f32(0.5f);
	st_compute_matmul_gelu_fwd(qc, o1, NULL, inp, w, bias, N, IC, OC);
	assert_int_equal(st_compute_sync(qc), 0);
	st_cpu_matmul_fwd(o2, inp, w, bias, N, IC, OC);
	st_cpu_gelu_fwd(o2, o2, (size_t)N * OC);
	assert_memory_equal(o1, o2, sizeof(o1));
}

/* What supports() answers on both cpu computes, and what run does with an
 * op refused: -ENOTSUP, sticky, nothing written, later ops skipped. */
static void test_supports(void **state)
{
	(void)state;
	struct st_compute *cs[2] = { st_compute_cpu(), qc };

	for (int j = 0; j < 2; j++) {
		struct st_compute *c = cs[j];
		enum st_dtype dt[ST_OP_MAX_TENSORS];

		for (int k = 0; k < ST_OP_COUNT; k++) {
			for (int s = 0; s < st_op_tensors(k); s++)
				dt[s] = st_op_ref_dtype(k, s);
			if (!st_compute_supports(c, k, dt))
				fail_msg("%s: does not run %s at its reference dtypes",
					 st_compute_name(c), st_op_name(k));
		}
		enum st_dtype mm_bf16[] = { ST_DTYPE_F32, ST_DTYPE_BF16, ST_DTYPE_BF16,
					    ST_DTYPE_F32 };
		enum st_dtype mm_mixed[] = { ST_DTYPE_F32, ST_DTYPE_BF16, ST_DTYPE_F32,
					     ST_DTYPE_F32 };
		enum st_dtype mm_out_bf16[] = { ST_DTYPE_BF16, ST_DTYPE_BF16, ST_DTYPE_BF16,
						ST_DTYPE_F32 };
		enum st_dtype gelu_bf16[] = { ST_DTYPE_BF16, ST_DTYPE_BF16 };
		enum st_dtype emb_f32_ids[] = { ST_DTYPE_F32, ST_DTYPE_F32, ST_DTYPE_F32,
						ST_DTYPE_F32 };
		assert_true(st_compute_supports(c, ST_OP_MATMUL_FWD, mm_bf16));
		/* any fp32 / bf16 mix of an op's fp32 slots is widened
		 * (kernels_bf16.h); ids stay int32, bytes stay bytes */
		enum st_dtype gelu_u8[] = { ST_DTYPE_U8, ST_DTYPE_F32 };
		enum st_dtype zero_bf16[] = { ST_DTYPE_BF16 };
		assert_true(st_compute_supports(c, ST_OP_MATMUL_FWD, mm_mixed));
		assert_true(st_compute_supports(c, ST_OP_MATMUL_FWD, mm_out_bf16));
		assert_true(st_compute_supports(c, ST_OP_GELU_FWD, gelu_bf16));
		assert_false(st_compute_supports(c, ST_OP_GELU_FWD, gelu_u8));
		assert_false(st_compute_supports(c, ST_OP_ZERO, zero_bf16));
		assert_false(st_compute_supports(c, ST_OP_EMBEDDING_FWD, emb_f32_ids));

		/* a refused op: sticky -ENOTSUP, nothing written, the next op skipped */
		float out[8], in[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
		memset(out, 0, sizeof(out));
		struct st_op op = { .kind = ST_OP_GELU_FWD,
				    .t = { st_tensor_1d(out, ST_DTYPE_U8, 32),
					   st_tensor_1d(in, ST_DTYPE_F32, 8) },
				    .i = { 8 } };
		assert_false(st_compute_supports_op(c, &op));
		st_compute_run(c, &op);
		assert_non_null(strstr(st_error_last(), "gelu_fwd"));
		st_compute_residual_fwd(c, out, in, in, 8); /* skipped */
		assert_int_equal(st_compute_sync(c), -ENOTSUP);
		for (int i = 0; i < 8; i++)
			assert_true(out[i] == 0.0f);
		st_compute_residual_fwd(c, out, in, in, 8); /* clean again */
		assert_int_equal(st_compute_sync(c), 0);
		assert_true(out[7] == 16.0f);
	}
}

/* The queue is held up behind a slow fill on another queue while more
 * ops than the ring holds are queued: the caller blocks until slots come
 * back (it cannot finish queueing before the fill is done), and every op
 * runs once, in order: the chain x = gelu(x + y), repeated, must equal
 * the same chain on the direct compute, bit for bit. */
struct slow_fill {
	float *dst;
	size_t n;
	float v;
	uint64_t done_ns;
};

static void slow_fill_fn(void *arg)
{
	struct slow_fill *f = arg;
	struct timespec ts = { 0, 60 * 1000 * 1000 };

	nanosleep(&ts, NULL);
	for (size_t i = 0; i < f->n; i++)
		f->dst[i] = f->v;
	f->done_ns = st_now_ns();
}

static void test_ring_wraps(void **state)
{
	(void)state;
	enum { NE = 64, OPS = 3 * ST_COMPUTE_CPU_RING_OPS + 7 };
	static float x[NE], y[NE], xd[NE], yd[NE];
	struct st_queue *q;
	struct st_event *ev;
	struct st_compute_span sp[4];

	for (int i = 0; i < NE; i++) {
		x[i] = xd[i] = (float)i;
		yd[i] = 1.25f; /* what the fill will write into y */
		y[i] = 0.0f;
	}
	for (int o = 0; o < OPS; o++) {
		if (o % 2 == 0)
			st_compute_residual_fwd(st_compute_cpu(), xd, xd, yd, NE);
		else
			st_compute_gelu_fwd(st_compute_cpu(), xd, xd, NE);
	}

	struct slow_fill f = { y, NE, 1.25f, 0 };
	assert_int_equal(st_queue_create(dev, &q), 0);
	assert_int_equal(st_event_create(dev, &ev), 0);
	assert_int_equal(st_device_host_fn(dev, q, slow_fill_fn, &f), 0);
	assert_int_equal(st_event_record(dev, ev, q), 0);
	st_compute_span_begin(qc, "load");
	st_compute_wait(qc, ev);
	for (int o = 0; o < OPS; o++) {
		if (o % 2 == 0)
			st_compute_residual_fwd(qc, x, x, y, NE);
		else
			st_compute_gelu_fwd(qc, x, x, NE);
	}
	uint64_t queued_ns = st_now_ns();
	st_compute_span_end(qc);
	assert_int_equal(st_compute_sync(qc), 0);
	assert_true(f.done_ns > 0);
	assert_true(queued_ns >= f.done_ns); /* the caller waited for slots */
	assert_memory_equal(x, xd, sizeof(x));
	assert_int_equal(st_compute_take_spans(qc, sp, 4), 1);
	assert_string_equal(sp[0].name, "load");
	assert_true(sp[0].t1_ns >= f.done_ns);

	st_event_destroy(dev, ev);
	st_queue_destroy(dev, q);
}

/* from_host_async queues the copy behind what the compute has queued and
 * returns at once (the compute waits for a slow fill on another queue
 * first, so a copy run at the call would return after the fill); the copy
 * lands in queue order, so an op after it reads the copied bytes; an
 * event recorded after it says when the host may reuse the source. The
 * span's queued time is the host's, before the device reached it. */
static void test_from_host_async(void **state)
{
	(void)state;
	enum { NE = 256 };
	static float src[NE], dst[NE], sum[NE], gate[NE];
	struct st_queue *q;
	struct st_event *ev, *done;
	struct st_compute_span sp[2];

	for (int i = 0; i < NE; i++) {
		src[i] = (float)i + 0.5f;
		dst[i] = -1.0f;
		sum[i] = 0.0f;
		gate[i] = 0.0f;
	}
	struct slow_fill f = { gate, NE, 2.0f, 0 };
	assert_int_equal(st_queue_create(dev, &q), 0);
	assert_int_equal(st_event_create(dev, &ev), 0);
	assert_int_equal(st_event_create(dev, &done), 0);
	assert_int_equal(st_device_host_fn(dev, q, slow_fill_fn, &f), 0);
	assert_int_equal(st_event_record(dev, ev, q), 0);
	uint64_t t_begin = st_now_ns();
	st_compute_span_begin(qc, "tokens");
	st_compute_wait(qc, ev);
	st_compute_from_host_async(qc, dst, src, sizeof(src));
	uint64_t t_ret = st_now_ns();
	st_compute_residual_fwd(qc, sum, dst, gate, NE); /* dst + 2 */
	st_compute_span_end(qc);
	st_compute_record(qc, done);
	assert_int_equal(st_compute_take_error(qc), 0);
	assert_int_equal(st_event_sync(dev, done), 0);
	assert_true(f.done_ns > 0);
	assert_true(t_ret < f.done_ns); /* queued, not run at the call */
	assert_memory_equal(dst, src, sizeof(src));
	for (int i = 0; i < NE; i++)
		assert_true(sum[i] == src[i] + 2.0f);
	assert_int_equal(st_compute_sync(qc), 0);
	assert_int_equal(st_compute_take_spans(qc, sp, 2), 1);
	assert_string_equal(sp[0].name, "tokens");
	assert_true(sp[0].tq_ns >= t_begin && sp[0].tq_ns <= t_ret);
	assert_true(sp[0].t0_ns >= sp[0].tq_ns && sp[0].t1_ns >= f.done_ns);

	st_event_destroy(dev, done);
	st_event_destroy(dev, ev);
	st_queue_destroy(dev, q);
}

/* The cpu bf16-operand matmul against fp64 on the same bf16 values: each
 * output within the fp32 summation bound IC * eps * sum |terms| (plus the
 * bias's); the same bits at 1 and 2 threads; the seam gives the kernel's
 * bits. */
static void bf16_case(int N, int IC, int OC, int with_bias)
{
	size_t ni = (size_t)N * IC, nw = (size_t)IC * OC, no = (size_t)N * OC;
	uint16_t *inp = malloc(2 * ni + 2), *w = malloc(2 * nw + 2);
	float *bias = malloc(4 * (size_t)OC), *out = malloc(4 * no), *out1 = malloc(4 * no);
	float *out2 = malloc(4 * no);
	int threads = omp_get_max_threads();

	assert_true(inp && w && bias && out && out1 && out2);
	case_rng = (uint64_t)(N * 131 + IC * 7 + OC);
	for (size_t i = 0; i < ni; i++)
		inp[i] = st_cpu_bf16_from_f32(case_f32(2.0f));
	for (size_t i = 0; i < nw; i++)
		w[i] = st_cpu_bf16_from_f32(case_f32(0.3f));
	for (int i = 0; i < OC; i++)
		bias[i] = case_f32(1.0f);
	st_cpu_matmul_fwd_bf16(out, inp, w, with_bias ? bias : NULL, N, IC, OC);
	for (int n = 0; n < N; n++) {
		for (int j = 0; j < OC; j++) {
			double ref = with_bias ? bias[j] : 0.0, mag = fabs(ref);

			for (int k = 0; k < IC; k++) {
				double t = (double)st_cpu_f32_from_bf16(inp[(size_t)n * IC + k]) *
					   (double)st_cpu_f32_from_bf16(w[(size_t)k * OC + j]);
				ref += t;
				mag += fabs(t);
			}
			double got = out[(size_t)n * OC + j];
			double bound = (IC + 1) * (double)FLT_EPSILON * mag + 1e-30;
			if (fabs(got - ref) > bound)
				fail_msg("bf16 matmul N=%d IC=%d OC=%d (%d,%d): %.9g vs fp64 %.9g",
					 N, IC, OC, n, j, got, ref);
		}
	}
	omp_set_num_threads(1);
	st_cpu_matmul_fwd_bf16(out1, inp, w, with_bias ? bias : NULL, N, IC, OC);
	omp_set_num_threads(2);
	st_cpu_matmul_fwd_bf16(out2, inp, w, with_bias ? bias : NULL, N, IC, OC);
	omp_set_num_threads(threads);
	assert_memory_equal(out1, out, 4 * no);
	assert_memory_equal(out2, out, 4 * no);
	memset(out1, 0xff, 4 * no);
	st_compute_matmul_fwd_bf16(qc, out1, inp, w, with_bias ? bias : NULL, N, IC, OC);
	assert_int_equal(st_compute_sync(qc), 0);
	assert_memory_equal(out1, out, 4 * no);
	free(inp);
	free(w);
	free(bias);
	free(out);
	free(out1);
	free(out2);
}

static void test_bf16_matmul(void **state)
{
	(void)state;
	bf16_case(29, 301, 67, 1);
	bf16_case(29, 301, 67, 0);
	bf16_case(1, 1, 1, 1);
	bf16_case(3, 0, 5, 1); /* no input channels: out = bias */
	bf16_case(64, 768, 96, 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rows_cover_every_op),
		cmocka_unit_test(test_direct_vs_queued),
		cmocka_unit_test(test_bf16_rows_direct_vs_queued),
		cmocka_unit_test(test_bf16_attention_seg),
		cmocka_unit_test(test_bf16_rows_cuda_shapes),
		cmocka_unit_test(test_typed_is_run),
		cmocka_unit_test(test_supports),
		cmocka_unit_test(test_ring_wraps),
		cmocka_unit_test(test_from_host_async),
		cmocka_unit_test(test_bf16_matmul),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}

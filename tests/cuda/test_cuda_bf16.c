/* The cuda bf16 ops on a GPU (exit 77 without one): every row of
 * tests/compute_cases_bf16.h through the cuda compute against the cpu
 * compute's bf16 ops on the same inputs (bf16 outputs to the row's
 * relative L2 tolerance, fp32 outputs to 1e-4), and the GPT-2 and LLaMA
 * bf16 steps' ops on the cuda compute (st_model_precision_check: every op
 * the step runs is one the cuda compute takes, at head sizes 64 and 128;
 * at head size 16, which the bf16 attention does not run, the check
 * refuses). A row cuda does not take is a failure naming it: the bf16
 * step cannot run there. The step's numbers
 * against the cpu device's are tools/gpu-check's bf16 step (strata train
 * on both devices).
 *
 * Its shapes are small already (tests/compute_cases.h's: tens of rows),
 * so ST_TEST_SMALL (tools/gpu-check's sanitize step, under
 * compute-sanitizer) changes nothing here; it is named so that the step
 * treats the three bf16 tests alike. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute_internal.h"
#include "compute_cases.h"
#include "compute_cases_bf16.h"
#include "strata/compute.h"
#include "cuda_ops.h"
#include "strata/model.h"

static int fails;

static double widen(const void *p, enum st_dtype dt, int64_t i)
{
	return dt == ST_DTYPE_BF16 ? (double)st_cpu_f32_from_bf16(((const uint16_t *)p)[i])
				   : (double)((const float *)p)[i];
}

static void compare(const char *what, const void *got, const void *ref, const struct case_tensor *t,
		    double tol)
{
	double num = 0, den = 0;

	for (int64_t i = 0; i < t->elems; i++) {
		double g = widen(got, t->dtype, i), r = widen(ref, t->dtype, i);
		if (!isfinite(g)) {
			printf("FAIL %s: element %lld is %g\n", what, (long long)i, g);
			fails++;
			return;
		}
		num += (g - r) * (g - r);
		den += r * r;
	}
	double rel = den > 0 ? sqrt(num / den) : sqrt(num);
	if (!(rel <= tol)) {
		printf("FAIL %s: relative L2 %.3g > %.3g\n", what, rel, tol);
		fails++;
		return;
	}
	printf("ok   %-44s rel %.2e (tol %.0e)\n", what, rel, tol);
}

int main(void)
{
	struct st_compute *cx = NULL;

	if (!st_cuda_available()) {
		printf("no GPU: skipped\n");
		return 77;
	}
	if (getenv("ST_TEST_SMALL"))
		printf("ST_TEST_SMALL: the rows' shapes are small already\n");
	if (st_compute_cuda_create(0, &cx) < 0) {
		fprintf(stderr, "st_compute_cuda_create: %s\n", st_error_last());
		return 1;
	}
	for (size_t r = 0; r < N_OP_CASES_BF16; r++) {
		const struct op_case *c = &op_cases_bf16[r];
		void *h[ST_OP_MAX_TENSORS], *d[ST_OP_MAX_TENSORS] = { 0 };
		struct st_op oh, od;
		int n = st_op_tensors(c->kind);
		char what[96];

		case_fill(c, r + 1, h, &oh);
		od = oh;
		if (!st_compute_supports_op(cx, &od)) {
			printf("FAIL %s: the cuda compute does not take it\n", c->what);
			fails++;
			case_free(h);
			continue;
		}
		for (int k = 0; k < n; k++) {
			size_t bytes = case_bytes(&c->t[k]);
			if (!h[k])
				continue;
			if (st_cuda_alloc(&d[k], bytes) < 0 || st_cuda_h2d(d[k], h[k], bytes) < 0) {
				fprintf(stderr, "%s: %s\n", c->what, st_error_last());
				return 1;
			}
			od.t[k].data = d[k];
		}
		st_compute_run(cx, &od);
		if (st_compute_sync(cx) < 0) {
			printf("FAIL %s: %s\n", c->what, st_error_last());
			fails++;
		}
		st_compute_run(st_compute_cpu(), &oh);
		(void)st_compute_take_error(st_compute_cpu());
		for (int k = 0; k < n; k++) {
			size_t bytes = case_bytes(&c->t[k]);
			void *got;

			if (!h[k] || !case_written(c, k))
				continue;
			got = malloc(bytes);
			if (!got || st_cuda_d2h(got, d[k], bytes) < 0) {
				fprintf(stderr, "%s: d2h\n", c->what);
				return 1;
			}
			snprintf(what, sizeof(what), "%s slot %d", c->what, k);
			if (c->tol == 0) {
				if (memcmp(got, h[k], bytes) != 0) {
					printf("FAIL %s: not bit for bit\n", what);
					fails++;
				} else {
					printf("ok   %-44s bit for bit\n", what);
				}
			} else {
				compare(what, got, h[k], &c->t[k],
					c->t[k].dtype == ST_DTYPE_BF16 ? c->tol : 1e-4);
			}
			free(got);
		}
		for (int k = 0; k < n; k++)
			st_cuda_free(d[k]);
		case_free(h);
	}
	/* the whole bf16 step's ops, at head sizes the bf16 attention runs;
	 * at 16 the precision check refuses before any step (the attention
	 * kernels would fail in it) */
	static const struct {
		const char *what, *model;
		bool runs;
	} steps[] = {
		{ "GPT-2, head size 64", "layers=2,dim=64,heads=1,vocab=300,ctx=32", true },
		{ "GPT-2, head size 128", "layers=1,dim=256,heads=2,vocab=300,ctx=32", true },
		{ "LLaMA, head size 64",
		  "llama:layers=2,dim=128,heads=2,kv-heads=1,ffn=96,vocab=300,ctx=32,bias=1", true },
		{ "GPT-2, head size 16", "layers=2,dim=64,heads=4,vocab=300,ctx=32", false },
		{ "LLaMA, head size 16",
		  "llama:layers=2,dim=64,heads=4,kv-heads=2,ffn=96,vocab=300,ctx=32", false },
	};
	for (size_t r = 0; r < sizeof(steps) / sizeof(steps[0]); r++) {
		struct st_model_config cfg;
		struct st_model *m = NULL;
		int rc;

		if (st_model_config_parse(steps[r].model, &cfg) < 0 ||
		    st_model_create(&cfg, &m) < 0 ||
		    st_model_set_precision(m, ST_PRECISION_BF16) < 0) {
			fprintf(stderr, "model: %s\n", st_error_last());
			return 1;
		}
		st_model_set_compute(m, cx);
		rc = st_model_precision_check(m);
		if (steps[r].runs && rc < 0) {
			printf("FAIL the %s bf16 step on cuda: %s\n", steps[r].what, st_error_last());
			fails++;
		} else if (!steps[r].runs && (rc != -ENOTSUP || !strstr(st_error_last(), "head size"))) {
			printf("FAIL the %s bf16 step on cuda: not refused by its head size (%d: %s)\n",
			       steps[r].what, rc, rc ? st_error_last() : "");
			fails++;
		} else {
			printf("ok   the %s bf16 step: %s\n", steps[r].what,
			       rc ? st_error_last() : "every op runs on cuda");
		}
		st_model_destroy(m);
	}
	st_compute_destroy(cx);
	printf("%s: %d failure(s)\n", fails ? "FAIL" : "ok", fails);
	return fails ? 1 : 0;
}

/* Every entry point of the cuda ops that queues on a context enters it
 * first (st_cuda_ctx_enter(): the context's GPU made the thread's current
 * device, since a launch, a stream's use and an event's creation go to
 * the current device): the attention ops (fp32 and bf16), the optimizer,
 * the fused head, the context's record, wait and timers. Called with no
 * context and shapes they would run, each must answer -EINVAL before it
 * touches anything: one that skipped the enter would read the missing
 * context (and crash here). Needs the cuda build, no GPU: no CUDA call is
 * made. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <string.h>

#include "cuda_bf16.h"
#include "cuda_ops.h"

/* What the calls point at: never read (each returns first), aligned as
 * the kernels want. */
static _Alignas(64) unsigned char mem[9][4096];

#define F(k) ((float *)(void *)mem[k])
#define H(k) ((uint16_t *)(void *)mem[k])
#define I32(k) ((int32_t *)(void *)mem[k])

static void test_attention_enters(void **state)
{
	(void)state;
	/* B 1, T 4, C 64 in one head of 64; GQA 2 heads over 1 of 64 */
	assert_int_equal(st_cuda_attention_fwd(NULL, F(0), F(1), F(2), 1, 4, 64, 1), -EINVAL);
	assert_int_equal(st_cuda_attention_bwd(NULL, F(0), F(1), F(2), F(3), F(4), 1, 4, 64, 1),
			 -EINVAL);
	assert_int_equal(st_cuda_gqa_attention_fwd(NULL, F(0), F(1), F(2), F(3), F(4), 1, 4, 2, 1,
						   64),
			 -EINVAL);
	assert_int_equal(st_cuda_gqa_attention_bwd(NULL, F(0), F(1), F(2), F(3), F(4), F(5), F(6),
						   F(7), F(8), 1, 4, 2, 1, 64),
			 -EINVAL);
	assert_int_equal(st_cuda_attention_fwd_bf16(NULL, H(0), F(1), H(2), 1, 4, 64, 1), -EINVAL);
	assert_int_equal(st_cuda_attention_bwd_bf16(NULL, F(0), 0, H(1), H(2), H(3), F(4), 1, 4,
						    64, 1),
			 -EINVAL);
	assert_int_equal(st_cuda_gqa_attention_fwd_bf16(NULL, H(0), F(1), H(2), H(3), H(4), 1, 4,
							2, 1, 64),
			 -EINVAL);
	assert_int_equal(st_cuda_gqa_attention_bwd_bf16(NULL, F(0), F(1), F(2), 0, H(3), H(4),
							H(5), H(6), H(7), F(8), 1, 4, 2, 1,
							64),
			 -EINVAL);
}

static void test_optim_and_head_enter(void **state)
{
	static const float consts[9] = { 0 };

	(void)state;
	assert_int_equal(st_cuda_adamw(NULL, consts, F(0), F(1), F(2), F(3), NULL, 0,
				       (uint32_t *)(void *)mem[4], 16),
			 -EINVAL);
	assert_int_equal(st_cuda_grad_sumsq(NULL, mem[0], mem[1], F(2), 16), -EINVAL);
	assert_int_equal(st_cuda_head_ce_bf16(NULL, F(0), NULL, NULL, H(1), H(2), I32(3), F(4),
					      1024, 1.0f, 4, 64, 16),
			 -EINVAL);
}

static void test_context_calls_enter(void **state)
{
	struct st_cuda_timer *t = (struct st_cuda_timer *)(uintptr_t)1;

	(void)state;
	assert_int_equal(st_cuda_ctx_record(NULL, (struct st_event *)(void *)mem[0]), -EINVAL);
	assert_int_equal(st_cuda_ctx_wait(NULL, (struct st_event *)(void *)mem[0]), -EINVAL);
	assert_int_equal(st_cuda_timer_create(NULL, &t), -EINVAL);
	assert_null(t);
	assert_int_equal(st_cuda_timer_mark(NULL, (struct st_cuda_timer *)(void *)mem[0], 0),
			 -EINVAL);
	assert_int_equal(st_cuda_sync(NULL), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_attention_enters),
		cmocka_unit_test(test_optim_and_head_enter),
		cmocka_unit_test(test_context_calls_enter),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

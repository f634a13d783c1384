/* cuBLASLt is loaded on first use, not at start (src/backend/kernels/cuda/matmul.cu):
 * a program linked with the cuda device has no libcublasLt mapped until
 * st_cuda_blas_load(), which then finds the library and every function the
 * ops call. Needs the CUDA toolkit's libraries, not a GPU, so it is not in
 * the 'cuda' suite and runs on every machine that builds the cuda device. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "strata/common.h"
#include "strata/cuda.h"

/* Whether a mapping of this process names lib. */
static int mapped(const char *lib)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[1024];
	int found = 0;

	assert_non_null(f);
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, lib) != NULL;
	fclose(f);
	return found;
}

static void test_loaded_on_first_use(void **state)
{
	const char *soname = NULL;

	(void)state;
	assert_false(mapped("libcublasLt"));
	if (st_cuda_blas_load(&soname) != 0)
		fail_msg("%s", st_error_last());
	assert_non_null(soname);
	assert_non_null(strstr(soname, "libcublasLt.so."));
	assert_true(mapped("libcublasLt"));
	/* once: the second call finds it loaded */
	assert_int_equal(st_cuda_blas_load(NULL), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_loaded_on_first_use),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

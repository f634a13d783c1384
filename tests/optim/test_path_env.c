/* ST_OPTIM_PATH sets the initial path: argv[1] is the path the environment
 * should give ("best" for the CPU's best, when the value is bad or the CPU
 * lacks it). */
#include "strata/optim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
	enum st_optim_path want = ST_OPTIM_PATH_AUTO, got = st_optim_path_get();

	if (argc != 2)
		return 2;
	if (strcmp(argv[1], "best") && st_optim_path_parse(argv[1], &want))
		return 2;
	if (want != ST_OPTIM_PATH_AUTO && !st_optim_path_supported(want)) {
		printf("path %s not supported here: skipped\n", argv[1]);
		return 77;
	}
	if (want == ST_OPTIM_PATH_AUTO) {
		want = st_optim_path_supported(ST_OPTIM_PATH_AVX512) ? ST_OPTIM_PATH_AVX512
		     : st_optim_path_supported(ST_OPTIM_PATH_AVX2)   ? ST_OPTIM_PATH_AVX2
								     : ST_OPTIM_PATH_SCALAR;
	}
	printf("ST_OPTIM_PATH=%s -> %s (want %s)\n", getenv("ST_OPTIM_PATH") ? getenv("ST_OPTIM_PATH") : "",
	       st_optim_path_name(got), st_optim_path_name(want));
	return got == want ? 0 : 1;
}

/* libFuzzer target for the llm.c model-file reader (st_weights_*,
 * src/io/weights.c) on a gpt2_124M.bin-style file, as `train --init`,
 * `eval` and `export` open it: any input either opens as an llm.c file
 * whose size is exactly what its header says, and then every tensor of the
 * GPT-2 it describes reads (or is refused as not finite) and a wrong shape
 * is refused; or it is refused with -EINVAL and one line naming the file.
 * An input without llm.c's magic goes to the safetensors reader, as in
 * strata; only a clean refusal or close is asked of it here (fuzz-safetensors
 * checks that reader). The reader takes a path, so each input is written to
 * a temporary file, alone in its directory (fuzz_tmp.c). */
#include "strata/weights.h"
#include "strata/model.h"

#include "fuzz_tmp.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Kind g's shape in Hugging Face's layout, worked out from the header
 * afresh (not the reader's own llmc_shape()). */
static int st_fuzz_shape(const struct st_model_config *mc, int g,
			 uint64_t shape[2])
{
	const struct st_llmc_kind *k = &st_llmc_kinds[g];
	uint64_t C = (uint64_t)mc->dim;

	if (g == 0 || g == 1) {
		shape[0] = g == 0 ? (uint64_t)mc->vocab : (uint64_t)mc->ctx;
		shape[1] = C;
		return 2;
	}
	if (k->cc) {
		shape[0] = k->in * C;
		shape[1] = k->cc * C / k->in;
		return 2;
	}
	shape[0] = k->c * C;
	shape[1] = 1;
	return 1;
}

static void st_fuzz_tensors(struct st_weights *w, const char *path,
			    size_t size)
{
	struct st_model_config mc;
	uint64_t read_elems = 0;

	if (st_weights_config(w, &mc))
		abort();
	if (mc.vocab <= 0 || mc.ctx <= 0 || mc.dim <= 0 || mc.n_layer <= 0 ||
	    mc.n_head <= 0 || mc.dim % mc.n_head)
		abort();
	for (int g = 0; g < ST_LLMC_KINDS; g++) {
		int layers = st_llmc_kinds[g].per_layer ? mc.n_layer : 1;

		for (int l = 0; l < layers; l++) {
			uint64_t shape[2], bad[2];
			int ndim = st_fuzz_shape(&mc, g, shape);
			uint64_t n = shape[0] * (ndim == 2 ? shape[1] : 1);
			char name[128];
			float *out;
			int err;

			/* every value a tensor holds is in the file */
			read_elems += n;
			if (read_elems * 2 > size)
				abort();
			st_llmc_tensor_name(g, l, name, sizeof(name));
			out = malloc(n * sizeof(float));
			if (!out)
				abort();
			err = st_weights_read(w, name, ndim, shape, out);
			if (err)
				st_fuzz_check_refusal(err, path, 0);
			bad[0] = shape[0] + 1;
			bad[1] = shape[1];
			if (st_weights_check(w, name, ndim, bad) != -EINVAL)
				abort();
			free(out);
		}
	}
	if (st_weights_check(w, "h.-1.ln_1.weight", 1, (uint64_t[]){ 1 }) !=
	    -EINVAL)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *p = st_fuzz_tmp_write("model.bin", data, size);
	struct st_weights *w = NULL;
	char path[512];
	int err;

	snprintf(path, sizeof(path), "%s", p);
	st_error_clear();
	err = st_weights_open(path, &w);
	if (err) {
		if (w)
			abort();
		st_fuzz_check_refusal(err, path, 0);
		return 0;
	}
	if (strncmp(st_weights_format(w), "llm.c", 5) == 0)
		st_fuzz_tensors(w, path, size);
	st_weights_close(w);
	return 0;
}

/* libFuzzer target for the checkpoint's trainer.json reader
 * (st_ckpt_trainer_read(), src/io/ckpt_trainer.c), as `--resume`, `eval
 * --ckpt` and `info --ckpt` read it: any input either reads, with every
 * listed name a plain, unique file name, a cursor within bounds and a
 * config that is a JSON object, and then writes back and reads again to
 * the same fields; or it is refused with -EINVAL (-EFBIG when too large)
 * and one line naming the file. What was read is then verified against
 * the (empty) directory, which must fail cleanly or pass. The reader takes
 * a path, so each input is written to a temporary file (fuzz_tmp.c). */
#include "strata/ckpt.h"

#include "fuzz_tmp.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void st_fuzz_check_read(const struct st_ckpt_trainer *tr)
{
	if (tr->version == 0 || tr->version > ST_CKPT_VERSION ||
	    tr->cursor_bytes > ST_CKPT_CURSOR_MAX_BYTES ||
	    tr->n_files > ST_CKPT_MAX_FILES || !tr->config_json)
		abort();
	for (size_t i = 0; i < tr->n_files; i++) {
		const char *name = tr->files[i].name;
		size_t len = strnlen(name, ST_CKPT_NAME_BYTES);

		if (len == 0 || len == ST_CKPT_NAME_BYTES || strchr(name, '/') ||
		    strcmp(name, ".") == 0 || strcmp(name, "..") == 0 ||
		    strcmp(name, ST_CKPT_TRAINER_FILE) == 0 ||
		    st_ckpt_trainer_find(tr, name) != &tr->files[i])
			abort();
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *p = st_fuzz_tmp_write("trainer.json", data, size);
	struct st_ckpt_trainer tr, back;
	char path[512], dir[512], again[512];
	int err;

	snprintf(path, sizeof(path), "%s", p);
	st_error_clear();
	err = st_ckpt_trainer_read(path, &tr);
	if (err) {
		if (tr.config_json || tr.n_files)
			abort(); /* on failure tr owns nothing */
		st_fuzz_check_refusal(err, path, -EFBIG);
		return 0;
	}
	st_fuzz_check_read(&tr);

	/* What was read saves and reads back the same. */
	snprintf(again, sizeof(again), "%s", st_fuzz_tmp_path("again.json"));
	if (st_ckpt_trainer_write(again, &tr) ||
	    st_ckpt_trainer_read(again, &back))
		abort();
	if (back.version != ST_CKPT_VERSION || back.step != tr.step ||
	    back.seed != tr.seed || back.cursor_bytes != tr.cursor_bytes ||
	    memcmp(back.cursor, tr.cursor, tr.cursor_bytes) != 0 ||
	    strcmp(back.config_json, tr.config_json) != 0 ||
	    back.n_files != tr.n_files)
		abort();
	for (size_t i = 0; i < tr.n_files; i++)
		if (strcmp(back.files[i].name, tr.files[i].name) != 0 ||
		    back.files[i].bytes != tr.files[i].bytes ||
		    back.files[i].xxh64 != tr.files[i].xxh64)
			abort();
	st_ckpt_trainer_fini(&back);

	/* The listed files against the directory: they are not there, or are
	 * the harness's own files with other sizes. */
	snprintf(dir, sizeof(dir), "%s", path);
	*strrchr(dir, '/') = '\0';
	err = st_ckpt_verify(dir, &tr);
	if (err > 0 || (err && strchr(st_error_last(), '\n')))
		abort();
	st_ckpt_trainer_fini(&tr);
	return 0;
}

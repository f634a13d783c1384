/* libFuzzer target for the tokenizer.json reader and the tokenizer it
 * builds (src/tok), as `strata tokenize --tokenizer FILE` opens it. The
 * input up to its first NUL byte is the tokenizer.json (all of it when
 * there is none), what follows is text. Any file either opens, or is
 * refused with -EINVAL (-ENOMEM) and one line naming the file. A tokenizer
 * that opens encodes the text and a few fixed ones (with and without its
 * BOS/EOS), every id below its vocabulary, and decodes them again (with
 * and without specials and the clean-up); an encode may refuse a piece
 * with no token (-EINVAL), nothing else. The reader takes a path, so the
 * file is written to a temporary directory first (fuzz_tmp.c). */
#include "strata/tokenizer.h"

#include "fuzz_tmp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void st_fuzz_encode(struct st_tokenizer *t, const char *text, size_t n)
{
	static const unsigned flags[] = { 0, ST_TOK_ADD_SPECIAL };
	static const unsigned dflags[] = { 0, ST_TOK_SKIP_SPECIAL,
					   ST_TOK_NO_CLEANUP | ST_TOK_SKIP_SPECIAL };

	for (size_t f = 0; f < 2; f++) {
		struct st_tok_ids ids = { 0 };
		int err = st_tokenizer_encode(t, text, n, flags[f], &ids);

		if (err && err != -EINVAL && err != -ENOMEM)
			abort();
		for (size_t i = 0; !err && i < ids.n; i++)
			if (ids.ids[i] >= st_tokenizer_vocab(t))
				abort();
		for (size_t d = 0; !err && d < 3; d++) {
			char *back;
			size_t bytes;

			if (st_tokenizer_decode(t, ids.ids, ids.n, dflags[d], &back, &bytes))
				abort();
			if (strlen(back) > bytes)
				abort();
			free(back);
		}
		st_tok_ids_fini(&ids);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const fixed[] = {
		"", "Hello world, it's 2026!  12345 \xe6\x97\xa5\xe6\x9c\xac\n\n",
		"bad \xff\xc3 utf-8 \xf0\x9f\x98", "<s><|endoftext|> \xe2\x96\x81x",
	};
	const uint8_t *nul = memchr(data, 0, size);
	size_t json_n = nul ? (size_t)(nul - data) : size;
	const char *path = st_fuzz_tmp_write("tokenizer.json", data, json_n);
	struct st_tokenizer *t = (void *)1;
	int err = st_tokenizer_open(path, &t);
	uint32_t one = 0;

	if (err) {
		if (t)
			abort();
		st_fuzz_check_refusal(err, path, 0);
		return 0;
	}
	if (st_tokenizer_vocab(t) == 0)
		abort();
	if (nul)
		st_fuzz_encode(t, (const char *)nul + 1, size - json_n - 1);
	for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
		st_fuzz_encode(t, fixed[i], strlen(fixed[i]));
	/* ids past the vocabulary decode to nothing */
	{
		uint32_t far[2] = { st_tokenizer_vocab(t), UINT32_MAX };
		char *back;
		size_t bytes;

		if (st_tokenizer_decode(t, far, 2, 0, &back, &bytes) || bytes != 0)
			abort();
		free(back);
		(void)one;
	}
	st_tokenizer_close(t);
	return 0;
}

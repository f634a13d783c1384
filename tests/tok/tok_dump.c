/* tok_dump TOKENIZER [--no-special] [--ids OUT] [--decoded OUT] [--same OUT] FILE...
 * One line per FILE in each output:
 *   ids      (stdout by default) its ids (st_tokenizer_encode with the
 *            post-processor's specials unless --no-special), space
 *            separated, as tools/tok-ref encode prints them
 *   decoded  decode(ids) as JSON.stringify writes a string (tools/tok-ref
 *            encode --decoded writes the same)
 *   same     whether decode(encode(text)) == text, without specials or
 *            the clean-up of spaces: "same" or "differs at BYTE"
 * Exit 2 on bad input, 1 on a failure. */
#include "strata/tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *slurp(const char *path, size_t *n)
{
	FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
	size_t cap = 1 << 16, len = 0, got;
	char *buf = malloc(cap);

	if (!f || !buf) {
		fprintf(stderr, "tok_dump: %s: %s\n", path, strerror(errno));
		exit(2);
	}
	while ((got = fread(buf + len, 1, cap - len, f)) > 0) {
		len += got;
		if (len == cap && !(buf = realloc(buf, cap *= 2)))
			exit(1);
	}
	if (f != stdin)
		fclose(f);
	*n = len;
	return buf;
}

/* s as JSON.stringify writes it */
static void put_json(FILE *o, const char *s, size_t n)
{
	putc('"', o);
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];

		switch (c) {
		case '"': fputs("\\\"", o); break;
		case '\\': fputs("\\\\", o); break;
		case '\b': fputs("\\b", o); break;
		case '\f': fputs("\\f", o); break;
		case '\n': fputs("\\n", o); break;
		case '\r': fputs("\\r", o); break;
		case '\t': fputs("\\t", o); break;
		default:
			if (c < 0x20)
				fprintf(o, "\\u%04x", c);
			else
				putc(c, o);
		}
	}
	fputs("\"\n", o);
}

static FILE *out_file(const char *path)
{
	FILE *f = fopen(path, "w");

	if (!f) {
		fprintf(stderr, "tok_dump: %s: %s\n", path, strerror(errno));
		exit(1);
	}
	return f;
}

int main(int argc, char **argv)
{
	struct st_tokenizer *t;
	unsigned flags = ST_TOK_ADD_SPECIAL;
	FILE *ids_out = stdout, *dec_out = NULL, *same_out = NULL;
	int i = 2;

	if (argc < 3) {
		fprintf(stderr, "usage: tok_dump TOKENIZER [--no-special] [--ids OUT] "
			"[--decoded OUT] [--same OUT] FILE...\n");
		return 2;
	}
	if (st_tokenizer_open(argv[1], &t) < 0) {
		fprintf(stderr, "tok_dump: %s\n", st_error_last());
		return 2;
	}
	for (; i < argc && argv[i][0] == '-' && argv[i][1]; i++) {
		if (strcmp(argv[i], "--no-special") == 0)
			flags = 0;
		else if (strcmp(argv[i], "--ids") == 0 && i + 1 < argc)
			ids_out = out_file(argv[++i]);
		else if (strcmp(argv[i], "--decoded") == 0 && i + 1 < argc)
			dec_out = out_file(argv[++i]);
		else if (strcmp(argv[i], "--same") == 0 && i + 1 < argc)
			same_out = out_file(argv[++i]);
		else {
			fprintf(stderr, "tok_dump: unknown option %s\n", argv[i]);
			return 2;
		}
	}
	for (; i < argc; i++) {
		struct st_tok_ids ids = { 0 };
		size_t n, m;
		char *text = slurp(argv[i], &n), *back;

		if (st_tokenizer_encode(t, text, n, flags, &ids) < 0) {
			fprintf(stderr, "tok_dump: %s: %s\n", argv[i], st_error_last());
			return 1;
		}
		for (size_t k = 0; k < ids.n; k++)
			fprintf(ids_out, k ? " %u" : "%u", ids.ids[k]);
		putc('\n', ids_out);
		if (dec_out) {
			if (st_tokenizer_decode(t, ids.ids, ids.n, 0, &back, &m) < 0)
				return 1;
			put_json(dec_out, back, m);
			free(back);
		}
		if (same_out) {
			size_t k = 0;

			ids.n = 0;
			if (st_tokenizer_encode(t, text, n, 0, &ids) < 0 ||
			    st_tokenizer_decode(t, ids.ids, ids.n, ST_TOK_NO_CLEANUP, &back, &m) < 0)
				return 1;
			while (k < n && k < m && text[k] == back[k])
				k++;
			if (k == n && n == m)
				fprintf(same_out, "same\n");
			else
				fprintf(same_out, "differs at %zu\n", k);
			free(back);
		}
		st_tok_ids_fini(&ids);
		free(text);
	}
	if (dec_out)
		fclose(dec_out);
	if (same_out)
		fclose(same_out);
	if (ids_out != stdout)
		fclose(ids_out);
	st_tokenizer_close(t);
	return 0;
}

/* jinja_render TEMPLATE VARS.json: render a Jinja template file with the
 * variables of a JSON object file (strata/jinja.h) to stdout; on an error
 * of the template, "error: DETAIL" on stderr and exit 1 (test_jinja.sh
 * compares both with @huggingface/jinja). With --fuzz it reads the
 * template from stdin and only checks that nothing crashes. */
#include "strata/jinja.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *slurp(FILE *f, size_t *n)
{
	size_t cap = 1 << 16;
	char *p = malloc(cap);

	*n = 0;
	while (p) {
		size_t got = fread(p + *n, 1, cap - *n - 1, f);

		*n += got;
		if (got == 0)
			break;
		if (*n + 1 == cap)
			p = realloc(p, cap *= 2);
	}
	if (p)
		p[*n] = 0;
	return p;
}

int main(int argc, char **argv)
{
	struct st_jinja *t;
	struct json_object *vars = NULL;
	FILE *f;
	char *src, *out;
	size_t n, out_n;
	int ret;

	if (argc != 3) {
		fprintf(stderr, "usage: jinja_render TEMPLATE|- VARS.json\n");
		return 2;
	}
	f = strcmp(argv[1], "-") ? fopen(argv[1], "rb") : stdin;
	if (!f || !(src = slurp(f, &n))) {
		perror(argv[1]);
		return 2;
	}
	if (strcmp(argv[2], "-") && !(vars = json_object_from_file(argv[2]))) {
		fprintf(stderr, "%s: not JSON\n", argv[2]);
		return 2;
	}
	if ((ret = st_jinja_parse(src, n, &t)) < 0) {
		fprintf(stderr, "error: %s\n", st_error_last());
		return 1;
	}
	if ((ret = st_jinja_render(t, vars, &out, &out_n)) < 0) {
		fprintf(stderr, "error: %s\n", st_error_last());
		st_jinja_free(t);
		return 1;
	}
	fwrite(out, 1, out_n, stdout);
	free(out);
	st_jinja_free(t);
	json_object_put(vars);
	free(src);
	return 0;
}

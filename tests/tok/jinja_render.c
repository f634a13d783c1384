/* jinja_render TEMPLATE VARS.json: render a Jinja template file with the
 * variables of a JSON object file (strata/jinja.h) to stdout; on an error
 * of the template, "error: DETAIL" on stderr and exit 1 (test_jinja.sh
 * compares both with @huggingface/jinja).
 * jinja_render --fuzz FILE...: each file cut, spliced and grown at many
 * points ($JINJA_FUZZ_POINTS of them, default 97), plus inputs built to
 * nest, loop and allocate without end, each
 * parsed and rendered: every one must render or be refused (-EINVAL,
 * -E2BIG); a crash or a hang is the failure. */
#include "strata/jinja.h"

#include <errno.h>
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

static const char *const snippets[] = {
	"{%", "%}", "{{", "}}", "{#", "#}", "-", "(", ")", "[", "]", "{", "}", "'", "\"", "|",
	" if ", " else ", " for x in ", " in ", "{% endfor %}", "{% endif %}", "{% else %}",
	"\\", "\xff", "\xe2\x80", "\n", "loop.", "namespace(", "range(99999999)", ":", ",",
	"**", "~", "not ", " is ", "messages", "[::-1]", "{% set x = ", "{% break %}", "0.5",
	"-9999999999999999999999", "|tojson(indent=4)", ".split()", "=", "\0",
};

static int fuzz_one(const char *src, size_t n, struct json_object *vars, size_t *ok)
{
	struct st_jinja *t;
	char *out;
	size_t out_n;
	int ret = st_jinja_parse(src, n, &t);

	if (ret == 0) {
		ret = st_jinja_render(t, vars, &out, &out_n);
		if (ret == 0)
			free(out);
		st_jinja_free(t);
	}
	if (ret == 0)
		(*ok)++;
	else if (ret != -EINVAL && ret != -E2BIG)
		return fprintf(stderr, "unexpected %d: %s\n", ret, st_error_last()), 1;
	return 0;
}

/* src with [p, p + cut) replaced by ins, into buf. */
static size_t splice(char *buf, const char *src, size_t n, size_t p, size_t cut,
		     const char *ins, size_t ins_n)
{
	memcpy(buf, src, p);
	memcpy(buf + p, ins, ins_n);
	memcpy(buf + p + ins_n, src + p + cut, n - p - cut);
	return n - cut + ins_n;
}

static char *repeat(const char *a, size_t times, const char *b)
{
	size_t an = strlen(a), bn = strlen(b);
	char *s = malloc(times * (an + bn) + 1);

	for (size_t i = 0; i < times; i++)
		memcpy(s + i * an, a, an);
	for (size_t i = 0; i < times; i++)
		memcpy(s + times * an + i * bn, b, bn);
	s[times * (an + bn)] = 0;
	return s;
}

static int fuzz(int n_files, char **files)
{
	struct json_object *vars = json_tokener_parse(
		"{\"messages\": [{\"role\": \"system\", \"content\": \" s \"}, {\"role\": "
		"\"user\", \"content\": \"u\"}, {\"role\": \"assistant\", \"content\": "
		"\"a\"}], \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", "
		"\"add_generation_prompt\": true}");
	const char *hostile[][3] = {
		{ "((((", "", "))))" }, { "{% if true %}", "", "{% endif %}" },
		{ "{% for i in range(3) %}", "", "{% endfor %}" }, { "[", "", "]" },
		{ "{{ 1", "", " }}" }, { "not ", "", "" }, { "-", "", "1" },
	};
	const char *env = getenv("JINJA_FUZZ_POINTS");
	size_t runs = 0, ok = 0, points = env ? strtoul(env, NULL, 10) : 97;
	int bad = 0;

	for (int f = 0; f < n_files && !bad; f++) {
		FILE *fp = fopen(files[f], "rb");
		size_t n;
		char *src = fp ? slurp(fp, &n) : NULL, *buf;

		if (fp)
			fclose(fp);
		if (!src)
			return fprintf(stderr, "%s: cannot read\n", files[f]), 2;
		buf = malloc(n + 64);
		for (size_t p = 0; p <= n && !bad; p += 1 + n / (points ? points : 1)) {
			bad |= fuzz_one(src, p, vars, &ok); /* cut short */
			runs++;
			if (p < n) {
				bad |= fuzz_one(buf, splice(buf, src, n, p, 1, "", 0), vars, &ok);
				runs++;
			}
			for (size_t k = 0; k < sizeof(snippets) / sizeof(*snippets) && !bad; k++) {
				size_t len = strlen(snippets[k]) + !strcmp(snippets[k], "\0");

				bad |= fuzz_one(buf, splice(buf, src, n, p, 0, snippets[k], len), vars, &ok);
				runs++;
			}
		}
		free(buf);
		free(src);
	}
	for (size_t h = 0; h < sizeof(hostile) / sizeof(*hostile) && !bad; h++) {
		char *a = repeat(hostile[h][0], 20000, hostile[h][2]);
		size_t n = strlen(a);
		char *s = malloc(n + 8);

		memcpy(s, "{{ ", 3);
		memcpy(s + 3, a, n);
		memcpy(s + 3 + n, " }}", 4);
		bad |= fuzz_one(a, n, vars, &ok) | fuzz_one(s, n + 6, vars, &ok);
		runs += 2;
		free(a);
		free(s);
	}
	{
		static const char *const big[] = {
			"{% for i in range(999999) %}{% for j in range(999999) %}x{% endfor %}{% endfor %}",
			"{% set ns = namespace(s='x') %}{% for i in range(99) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
			"{% set ns = namespace(l=[1]) %}{% for i in range(99) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
			"{{ range(999999999999) }}", "{{ 'x' * 99 }}",
		};

		for (size_t i = 0; i < sizeof(big) / sizeof(*big) && !bad; i++, runs++)
			bad |= fuzz_one(big[i], strlen(big[i]), vars, &ok);
	}
	json_object_put(vars);
	printf("%zu inputs: %zu rendered, %zu refused\n", runs, ok, runs - ok);
	return bad;
}

int main(int argc, char **argv)
{
	struct st_jinja *t;
	struct json_object *vars = NULL;
	FILE *f;
	char *src, *out;
	size_t n, out_n;
	int ret;

	if (argc >= 2 && !strcmp(argv[1], "--fuzz"))
		return fuzz(argc - 2, argv + 2);
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
	ret = st_jinja_parse(src, n, &t);
	if (ret == 0) {
		ret = st_jinja_render(t, vars, &out, &out_n);
		st_jinja_free(t);
	}
	if (ret == 0) {
		fwrite(out, 1, out_n, stdout);
		free(out);
	} else {
		fprintf(stderr, "error: %s\n", st_error_last());
	}
	json_object_put(vars);
	free(src);
	return ret ? 1 : 0;
}

/* A tokenizer.json and its tokenizer_config.json, read into the parts of
 * tok_internal.h (encode.c runs text through them, decode.c back). Every
 * key that is not implemented is refused here, at open, naming it. */
#include "tok_internal.h"

#include "strata/file.h"

#include <errno.h>
#include <json-c/json.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* GPT-2's split, what a ByteLevel pre-tokenizer with use_regex runs */
static const char gpt2_pattern[] =
	"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* --- reading -------------------------------------------------------------------- */

/* The JSON object of the file at path (strata/file.h: 0, -ENOENT, -EINVAL
 * naming the line json-c stopped at, -ENOMEM or the errno of reading). */
static int read_json(const char *path, struct json_object **out)
{
	return st_file_read_json(path, INT32_MAX, out); /* the most json-c reads */
}

static struct json_object *get(struct json_object *o, const char *key)
{
	struct json_object *v;

	if (!o || !json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null))
		return NULL;
	return v;
}

static const char *get_str(struct json_object *o, const char *key, size_t *len)
{
	struct json_object *v = get(o, key);

	if (!v || !json_object_is_type(v, json_type_string))
		return NULL;
	if (len)
		*len = (size_t)json_object_get_string_len(v);
	return json_object_get_string(v);
}

/* A string the tokenizer puts into the text it matches (a normalizer's or
 * pre-tokenizer's replacement): the matching takes the text as valid UTF-8
 * without checking it again, so a string that is not is refused here.
 * 0 or -EINVAL. */
static int need_utf8(const char *file, const char *where, const char *key, const char *s,
		     size_t len)
{
	if (tok_utf8_valid(s, len))
		return 0;
	return st_error_set(-EINVAL, "%s: %s.%s is not UTF-8", file, where, key);
}

static bool get_bool(struct json_object *o, const char *key, bool dflt)
{
	struct json_object *v = get(o, key);

	return v ? json_object_get_boolean(v) : dflt;
}

static char *dup_n(const char *s, size_t n)
{
	char *d = malloc(n + 1);

	if (d) {
		memcpy(d, s, n);
		d[n] = 0;
	}
	return d;
}

/* A {"String": s} or {"Regex": r} pattern. */
static int parse_pattern(struct json_object *o, const char *file, const char *key,
			 struct tok_re *re)
{
	struct json_object *p = get(o, "pattern");
	const char *s;
	size_t n;
	char what[PATH_MAX + 64];

	snprintf(what, sizeof(what), "%s: %s.pattern", file, key);
	if (!p || !json_object_is_type(p, json_type_object))
		return st_error_set(-EINVAL, "%s: missing or not an object", what);
	if ((s = get_str(p, "String", &n)))
		return tok_re_compile(re, s, n, true, what);
	if ((s = get_str(p, "Regex", &n)))
		return tok_re_compile(re, s, n, false, what);
	return st_error_set(-EINVAL, "%s: expected {\"String\": ...} or {\"Regex\": ...}", what);
}

/* A value from the file, fit for a one-line message (static: one at a time). */
static const char *shown(const char *s)
{
	static char buf[48];

	return s ? tok_printable(s, strlen(s), buf, sizeof(buf)) : "(missing)";
}

static int unsupported(const char *file, const char *key, const char *type)
{
	return st_error_set(-EINVAL, "%s: %s.type: %s is not supported (docs/tokenizer.md)",
			    file, key, shown(type));
}

/* --- normalizer ----------------------------------------------------------------- */

static int add_norm(struct st_tokenizer *t, struct tok_norm n)
{
	struct tok_norm *v = realloc(t->norm, (t->n_norm + 1) * sizeof(*v));

	if (!v)
		return st_error_set(-ENOMEM, "tokenizer: out of memory");
	t->norm = v;
	t->norm[t->n_norm++] = n;
	return 0;
}

static int parse_normalizer(struct st_tokenizer *t, struct json_object *o, int depth)
{
	const char *type = get_str(o, "type", NULL), *s;
	struct tok_norm n = { 0 };
	size_t len;
	int ret;

	if (depth > 8)
		return st_error_set(-EINVAL, "%s: normalizer: nested too deep", t->file);
	if (!type)
		return unsupported(t->file, "normalizer", NULL);
	if (strcmp(type, "Sequence") == 0) {
		struct json_object *a = get(o, "normalizers");

		if (!a || !json_object_is_type(a, json_type_array))
			return st_error_set(-EINVAL, "%s: normalizer.normalizers: missing",
					    t->file);
		for (size_t i = 0; i < json_object_array_length(a); i++)
			if ((ret = parse_normalizer(t, json_object_array_get_idx(a, i), depth + 1)))
				return ret;
		return 0;
	}
	n.kind = TOK_NORM_UNICODE;
	if (strcmp(type, "NFC") == 0)
		n.uform = TOK_NFC;
	else if (strcmp(type, "NFD") == 0)
		n.uform = TOK_NFD;
	else if (strcmp(type, "NFKC") == 0)
		n.uform = TOK_NFKC;
	else if (strcmp(type, "NFKD") == 0)
		n.uform = TOK_NFKD;
	else if (strcmp(type, "Lowercase") == 0)
		n.uform = TOK_LOWER;
	else if (strcmp(type, "Prepend") == 0) {
		n.kind = TOK_NORM_PREPEND;
		if (!(s = get_str(o, "prepend", &len)))
			return st_error_set(-EINVAL, "%s: normalizer.prepend: missing", t->file);
		if ((ret = need_utf8(t->file, "normalizer", "prepend", s, len)))
			return ret;
		if (!(n.a = dup_n(s, len)))
			return st_error_set(-ENOMEM, "tokenizer: out of memory");
		n.a_len = len;
	} else if (strcmp(type, "Replace") == 0) {
		n.kind = TOK_NORM_REPLACE;
		if (!(s = get_str(o, "content", &len)))
			return st_error_set(-EINVAL, "%s: normalizer.content: missing", t->file);
		if ((ret = need_utf8(t->file, "normalizer", "content", s, len)))
			return ret;
		if ((ret = parse_pattern(o, t->file, "normalizer", &n.re)))
			return ret;
		if (!(n.a = dup_n(s, len))) {
			tok_re_fini(&n.re);
			return st_error_set(-ENOMEM, "tokenizer: out of memory");
		}
		n.a_len = len;
	} else if (strcmp(type, "Strip") == 0) {
		n.kind = TOK_NORM_STRIP;
		n.left = get_bool(o, "strip_left", false);
		n.right = get_bool(o, "strip_right", false);
	} else
		return unsupported(t->file, "normalizer", type);
	if ((ret = add_norm(t, n))) {
		free(n.a);
		tok_re_fini(&n.re);
	}
	return ret;
}

/* --- pre-tokenizer ---------------------------------------------------------------- */

static int add_pre(struct st_tokenizer *t, struct tok_pre p)
{
	struct tok_pre *v = realloc(t->pre, (t->n_pre + 1) * sizeof(*v));

	if (!v)
		return st_error_set(-ENOMEM, "tokenizer: out of memory");
	t->pre = v;
	t->pre[t->n_pre++] = p;
	return 0;
}

static int parse_prepend(struct st_tokenizer *t, struct json_object *o, const char *key,
			 enum tok_prepend *out)
{
	const char *s = get_str(o, "prepend_scheme", NULL);

	if (!s) { /* before tokenizers 0.14: add_prefix_space */
		*out = get_bool(o, "add_prefix_space", true) ? TOK_PREPEND_ALWAYS
							       : TOK_PREPEND_NEVER;
		return 0;
	}
	if (strcmp(s, "always") == 0)
		*out = TOK_PREPEND_ALWAYS;
	else if (strcmp(s, "first") == 0)
		*out = TOK_PREPEND_FIRST;
	else if (strcmp(s, "never") == 0)
		*out = TOK_PREPEND_NEVER;
	else
		return st_error_set(-EINVAL, "%s: %s.prepend_scheme: \"%s\" is not one of "
				    "always, first, never", t->file, key, shown(s));
	return 0;
}

static int parse_pre(struct st_tokenizer *t, struct json_object *o, int depth)
{
	const char *type = get_str(o, "type", NULL), *s;
	struct tok_pre p = { 0 };
	size_t len;
	int ret;

	if (depth > 8)
		return st_error_set(-EINVAL, "%s: pre_tokenizer: nested too deep", t->file);
	if (!type)
		return unsupported(t->file, "pre_tokenizer", NULL);
	if (strcmp(type, "Sequence") == 0) {
		struct json_object *a = get(o, "pretokenizers");

		if (!a || !json_object_is_type(a, json_type_array))
			return st_error_set(-EINVAL, "%s: pre_tokenizer.pretokenizers: missing",
					    t->file);
		for (size_t i = 0; i < json_object_array_length(a); i++)
			if ((ret = parse_pre(t, json_object_array_get_idx(a, i), depth + 1)))
				return ret;
		return 0;
	}
	if (strcmp(type, "Split") == 0) {
		const char *b = get_str(o, "behavior", NULL);

		p.kind = TOK_PRE_SPLIT;
		if (!b || strcmp(b, "Isolated") == 0)
			p.behavior = TOK_SPLIT_ISOLATED;
		else if (strcmp(b, "Removed") == 0)
			p.behavior = TOK_SPLIT_REMOVED;
		else if (strcmp(b, "MergedWithPrevious") == 0)
			p.behavior = TOK_SPLIT_MERGED_PREV;
		else if (strcmp(b, "MergedWithNext") == 0)
			p.behavior = TOK_SPLIT_MERGED_NEXT;
		else
			return st_error_set(-EINVAL, "%s: pre_tokenizer.behavior: %s is not "
					    "supported (docs/tokenizer.md)", t->file, shown(b));
		/* invert: the pattern matches the pieces, not the delimiters;
		 * with Removed (tiktoken's patterns, GPT-4o's file) what is
		 * between matches goes */
		if (get_bool(o, "invert", false)) {
			if (p.behavior != TOK_SPLIT_REMOVED)
				return st_error_set(-EINVAL, "%s: pre_tokenizer.invert: true is "
						    "supported with the behavior Removed only "
						    "(docs/tokenizer.md)", t->file);
			p.behavior = TOK_SPLIT_KEEP_MATCHES;
		}
		if ((ret = parse_pattern(o, t->file, "pre_tokenizer", &p.re)))
			return ret;
	} else if (strcmp(type, "ByteLevel") == 0) {
		p.kind = TOK_PRE_BYTELEVEL;
		/* a key Hugging Face requires; absent reads as false, as the
		 * reference reads it */
		p.add_prefix_space = get_bool(o, "add_prefix_space", false);
		p.use_regex = get_bool(o, "use_regex", true);
		if (p.use_regex &&
		    (ret = tok_re_compile(&p.re, gpt2_pattern, sizeof(gpt2_pattern) - 1, false,
					  "ByteLevel")))
			return ret;
		t->byte_level = true;
	} else if (strcmp(type, "Metaspace") == 0) {
		p.kind = TOK_PRE_METASPACE;
		if (!(s = get_str(o, "replacement", &len)) || len == 0)
			return st_error_set(-EINVAL, "%s: pre_tokenizer.replacement: missing",
					    t->file);
		if ((ret = need_utf8(t->file, "pre_tokenizer", "replacement", s, len)))
			return ret;
		if ((ret = parse_prepend(t, o, "pre_tokenizer", &p.prepend)))
			return ret;
		p.split = get_bool(o, "split", true);
		if (!(p.a = dup_n(s, len)))
			return st_error_set(-ENOMEM, "tokenizer: out of memory");
		p.a_len = len;
	} else
		return unsupported(t->file, "pre_tokenizer", type);
	if ((ret = add_pre(t, p))) {
		free(p.a);
		tok_re_fini(&p.re);
	}
	return ret;
}

/* --- decoder ------------------------------------------------------------------------ */

static int add_dec(struct st_tokenizer *t, struct tok_dec d)
{
	struct tok_dec *v = realloc(t->dec, (t->n_dec + 1) * sizeof(*v));

	if (!v)
		return st_error_set(-ENOMEM, "tokenizer: out of memory");
	t->dec = v;
	t->dec[t->n_dec++] = d;
	return 0;
}

static int parse_decoder(struct st_tokenizer *t, struct json_object *o, int depth)
{
	const char *type = get_str(o, "type", NULL), *s;
	struct tok_dec d = { 0 };
	size_t len;
	int ret;

	if (depth > 8)
		return st_error_set(-EINVAL, "%s: decoder: nested too deep", t->file);
	if (!type)
		return unsupported(t->file, "decoder", NULL);
	if (strcmp(type, "Sequence") == 0) {
		struct json_object *a = get(o, "decoders");

		if (!a || !json_object_is_type(a, json_type_array))
			return st_error_set(-EINVAL, "%s: decoder.decoders: missing", t->file);
		for (size_t i = 0; i < json_object_array_length(a); i++)
			if ((ret = parse_decoder(t, json_object_array_get_idx(a, i), depth + 1)))
				return ret;
		return 0;
	}
	if (strcmp(type, "ByteLevel") == 0)
		d.kind = TOK_DEC_BYTELEVEL;
	else if (strcmp(type, "ByteFallback") == 0)
		d.kind = TOK_DEC_BYTEFALLBACK;
	else if (strcmp(type, "Fuse") == 0)
		d.kind = TOK_DEC_FUSE;
	else if (strcmp(type, "Replace") == 0) {
		struct json_object *p = get(o, "pattern");
		const char *c = get_str(o, "content", &d.b_len);

		d.kind = TOK_DEC_REPLACE;
		if (!p || !(s = get_str(p, "String", &len)))
			return st_error_set(-EINVAL, "%s: decoder.pattern: only {\"String\": ...} "
					    "is supported (docs/tokenizer.md)", t->file);
		if (!c)
			return st_error_set(-EINVAL, "%s: decoder.content: missing", t->file);
		d.a = dup_n(s, len);
		d.a_len = len;
		d.b = dup_n(c, d.b_len);
	} else if (strcmp(type, "Strip") == 0) {
		struct json_object *st = get(o, "start"), *sp = get(o, "stop");

		d.kind = TOK_DEC_STRIP;
		if (!(s = get_str(o, "content", &len)) || len == 0)
			return st_error_set(-EINVAL, "%s: decoder.content: missing", t->file);
		d.start = st ? json_object_get_int(st) : 0;
		d.stop = sp ? json_object_get_int(sp) : 0;
		if (d.start < 0 || d.stop < 0)
			return st_error_set(-EINVAL, "%s: decoder.start/stop: negative", t->file);
		d.a = dup_n(s, len);
		d.a_len = len;
	} else if (strcmp(type, "Metaspace") == 0) {
		enum tok_prepend pp;

		d.kind = TOK_DEC_METASPACE;
		if (!(s = get_str(o, "replacement", &len)) || len == 0)
			return st_error_set(-EINVAL, "%s: decoder.replacement: missing", t->file);
		if ((ret = parse_prepend(t, o, "decoder", &pp)))
			return ret;
		d.strip_first = pp != TOK_PREPEND_NEVER;
		d.a = dup_n(s, len);
		d.a_len = len;
	} else
		return unsupported(t->file, "decoder", type);
	if ((d.a_len && !d.a) || (d.b_len && !d.b) || (ret = add_dec(t, d))) {
		free(d.a);
		free(d.b);
		return st_error_set(-ENOMEM, "tokenizer: out of memory");
	}
	return 0;
}

/* --- post-processor ------------------------------------------------------------------ */

static int push_u32(uint32_t **v, size_t *n, uint32_t x)
{
	uint32_t *p = realloc(*v, (*n + 1) * sizeof(*p));

	if (!p)
		return st_error_set(-ENOMEM, "tokenizer: out of memory");
	*v = p;
	p[(*n)++] = x;
	return 0;
}

static int parse_template(struct st_tokenizer *t, struct json_object *o)
{
	struct json_object *single = get(o, "single"), *specials = get(o, "special_tokens");
	bool after = false;
	int ret;

	if (!single || !json_object_is_type(single, json_type_array))
		return st_error_set(-EINVAL, "%s: post_processor.single: missing", t->file);
	for (size_t i = 0; i < json_object_array_length(single); i++) {
		struct json_object *item = json_object_array_get_idx(single, i);
		struct json_object *sp = get(item, "SpecialToken"), *seq = get(item, "Sequence");
		struct json_object *ids;
		const char *name;

		if (seq) {
			after = true;
			continue;
		}
		if (!sp || !(name = get_str(sp, "id", NULL)))
			return st_error_set(-EINVAL, "%s: post_processor.single[%zu]: expected "
					    "a SpecialToken or a Sequence", t->file, i);
		char pk[48];

		tok_printable(name, strlen(name), pk, sizeof(pk));
		ids = get(get(specials, name), "ids");
		if (!ids || !json_object_is_type(ids, json_type_array))
			return st_error_set(-EINVAL, "%s: post_processor.special_tokens[\"%s\"]."
					    "ids: missing", t->file, pk);
		for (size_t k = 0; k < json_object_array_length(ids); k++) {
			int64_t id = json_object_get_int64(json_object_array_get_idx(ids, k));

			if (id < 0 || id > UINT32_MAX)
				return st_error_set(-EINVAL, "%s: post_processor.special_tokens"
						    "[\"%s\"]: id %lld", t->file, pk,
						    (long long)id);
			ret = after ? push_u32(&t->suffix, &t->n_suffix, (uint32_t)id)
				    : push_u32(&t->prefix, &t->n_prefix, (uint32_t)id);
			if (ret)
				return ret;
		}
	}
	return 0;
}

static int parse_post(struct st_tokenizer *t, struct json_object *o, int depth)
{
	const char *type = get_str(o, "type", NULL);
	int ret;

	if (depth > 8)
		return st_error_set(-EINVAL, "%s: post_processor: nested too deep", t->file);
	if (!type)
		return unsupported(t->file, "post_processor", NULL);
	if (strcmp(type, "Sequence") == 0) {
		struct json_object *a = get(o, "processors");

		if (!a || !json_object_is_type(a, json_type_array))
			return st_error_set(-EINVAL, "%s: post_processor.processors: missing",
					    t->file);
		for (size_t i = 0; i < json_object_array_length(a); i++)
			if ((ret = parse_post(t, json_object_array_get_idx(a, i), depth + 1)))
				return ret;
		return 0;
	}
	if (strcmp(type, "ByteLevel") == 0)
		return 0; /* offsets only */
	if (strcmp(type, "TemplateProcessing") == 0)
		return parse_template(t, o);
	if (strcmp(type, "BertProcessing") == 0 || strcmp(type, "RobertaProcessing") == 0) {
		struct json_object *cls = get(o, "cls"), *sep = get(o, "sep");

		if (!cls || !sep || !json_object_is_type(cls, json_type_array) ||
		    !json_object_is_type(sep, json_type_array) ||
		    json_object_array_length(cls) != 2 || json_object_array_length(sep) != 2)
			return st_error_set(-EINVAL, "%s: post_processor.cls/sep: expected "
					    "[token, id]", t->file);
		if ((ret = push_u32(&t->prefix, &t->n_prefix, (uint32_t)json_object_get_int64(
					    json_object_array_get_idx(cls, 1)))))
			return ret;
		return push_u32(&t->suffix, &t->n_suffix,
				(uint32_t)json_object_get_int64(json_object_array_get_idx(sep, 1)));
	}
	return unsupported(t->file, "post_processor", type);
}

/* --- added tokens ------------------------------------------------------------------ */

static int cmp_len_desc(const void *a, const void *b, void *ctx)
{
	const struct tok_added *v = ctx;
	const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	if (v[x].len != v[y].len)
		return v[x].len > v[y].len ? -1 : 1;
	return x < y ? -1 : x > y;
}

static int cmp_nlen_desc(const void *a, const void *b, void *ctx)
{
	const struct tok_added *v = ctx;
	const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	if (v[x].nlen != v[y].nlen)
		return v[x].nlen > v[y].nlen ? -1 : 1;
	return x < y ? -1 : x > y;
}

/* Index tokens [i : pick(i)] of t->added by first byte, longest first (the
 * first that matches is the longest, as a trie's leftmost-longest match). */
static void index_added(struct st_tokenizer *t, bool norm, uint32_t *first, uint32_t *by_first)
{
	uint32_t count[257] = { 0 }, fill[256];

	for (uint32_t i = 0; i < t->n_added; i++)
		if (!!t->added[i].ncontent == norm)
			count[(uint8_t)(norm ? t->added[i].ncontent : t->added[i].content)[0]]++;
	first[0] = 0;
	for (unsigned b = 0; b < 256; b++)
		first[b + 1] = first[b] + count[b];
	memcpy(fill, first, sizeof(fill));
	for (uint32_t i = 0; i < t->n_added; i++)
		if (!!t->added[i].ncontent == norm)
			by_first[fill[(uint8_t)(norm ? t->added[i].ncontent
						     : t->added[i].content)[0]]++] = i;
	for (unsigned b = 0; b < 256; b++)
		if (first[b + 1] - first[b] > 1)
			qsort_r(by_first + first[b], first[b + 1] - first[b], sizeof(uint32_t),
				norm ? cmp_nlen_desc : cmp_len_desc, t->added);
}

static int parse_added(struct st_tokenizer *t, struct json_object *a)
{
	size_t n;

	if (a && !json_object_is_type(a, json_type_array))
		return st_error_set(-EINVAL, "%s: added_tokens: not an array", t->file);
	n = a ? json_object_array_length(a) : 0;
	t->added = calloc(n + 1, sizeof(*t->added));
	t->by_first = calloc(n + 1, sizeof(*t->by_first));
	t->nby_first = calloc(n + 1, sizeof(*t->nby_first));
	if (!t->added || !t->by_first || !t->nby_first)
		return st_error_set(-ENOMEM, "tokenizer: out of memory");
	for (size_t i = 0; i < n; i++) {
		struct json_object *o = json_object_array_get_idx(a, i), *idv = get(o, "id");
		const char *c;
		size_t len;
		int64_t id;

		if (!(c = get_str(o, "content", &len)) || len == 0 || !idv ||
		    (id = json_object_get_int64(idv)) < 0 || id >= (1ll << 24))
			return st_error_set(-EINVAL, "%s: added_tokens[%zu]: expected content "
					    "and an id in [0, 2^24)", t->file, i);
		if (!tok_utf8_valid(c, len))
			return st_error_set(-EINVAL, "%s: added_tokens[%zu]: content is not "
					    "UTF-8", t->file, i);
		t->added[i] = (struct tok_added){
			.content = dup_n(c, len), .len = len, .id = (uint32_t)id,
			.lstrip = get_bool(o, "lstrip", false),
			.rstrip = get_bool(o, "rstrip", false),
			.special = get_bool(o, "special", false),
			.normalized = get_bool(o, "normalized", false),
		};
		if (!t->added[i].content)
			return st_error_set(-ENOMEM, "tokenizer: out of memory");
		t->n_added++;
		/* normalized: matched in normalised text, as its content
		 * normalised (the normalizers are read by now) */
		if (t->added[i].normalized && t->n_norm) {
			const char *r;
			size_t rn;
			int ret = tok_normalize(t, c, len, &r, &rn);

			if (ret)
				return ret;
			if (rn) {
				if (!(t->added[i].ncontent = dup_n(r, rn)))
					return st_error_set(-ENOMEM, "tokenizer: out of memory");
				t->added[i].nlen = rn;
				t->n_nadded++;
			}
		}
	}
	index_added(t, false, t->first, t->by_first);
	index_added(t, true, t->nfirst, t->nby_first);
	return 0;
}

/* --- tokenizer_config.json ------------------------------------------------------------ */

/* A token named by the config: "text" or {"content": "text", ...}. */
static const char *config_token(struct json_object *cfg, const char *key)
{
	struct json_object *v = get(cfg, key);

	if (!v)
		return NULL;
	if (json_object_is_type(v, json_type_string))
		return json_object_get_string(v);
	return get_str(v, "content", NULL);
}

static int apply_config(struct st_tokenizer *t, struct json_object *cfg, const char *path)
{
	const char *bos = config_token(cfg, "bos_token"), *eos = config_token(cfg, "eos_token");
	struct json_object *v, *extra = get(cfg, "additional_special_tokens");
	int ret;

	t->cleanup = get_bool(cfg, "clean_up_tokenization_spaces", true);
	if (eos)
		t->eos_id = st_tokenizer_token_id(t, eos);
	if ((v = get(cfg, "add_bos_token"))) {
		t->n_prefix = 0;
		if (json_object_get_boolean(v)) {
			int64_t id = bos ? st_tokenizer_token_id(t, bos) : -1;

			if (id < 0)
				return st_error_set(-EINVAL, "%s: add_bos_token is true but "
						    "bos_token names no token", path);
			if ((ret = push_u32(&t->prefix, &t->n_prefix, (uint32_t)id)))
				return ret;
		}
	}
	if ((v = get(cfg, "add_eos_token"))) {
		t->n_suffix = 0;
		if (json_object_get_boolean(v)) {
			if (t->eos_id < 0)
				return st_error_set(-EINVAL, "%s: add_eos_token is true but "
						    "eos_token names no token", path);
			if ((ret = push_u32(&t->suffix, &t->n_suffix, (uint32_t)t->eos_id)))
				return ret;
		}
	}
	if (extra && json_object_is_type(extra, json_type_array))
		for (size_t i = 0; i < json_object_array_length(extra); i++) {
			struct json_object *e = json_object_array_get_idx(extra, i);
			const char *s = json_object_is_type(e, json_type_string)
						? json_object_get_string(e)
						: get_str(e, "content", NULL);
			int64_t id = s ? st_tokenizer_token_id(t, s) : -1;

			if (id >= 0 && (uint32_t)id < t->n_ids)
				t->special[id] = 1;
		}
	return 0;
}

/* --- open / close ------------------------------------------------------------------------ */

void st_tokenizer_close(struct st_tokenizer *t)
{
	if (!t)
		return;
	for (size_t i = 0; i < t->n_norm; i++) {
		free(t->norm[i].a);
		tok_re_fini(&t->norm[i].re);
	}
	for (size_t i = 0; i < t->n_pre; i++) {
		free(t->pre[i].a);
		tok_re_fini(&t->pre[i].re);
	}
	for (size_t i = 0; i < t->n_dec; i++) {
		free(t->dec[i].a);
		free(t->dec[i].b);
	}
	for (size_t i = 0; t->added && i < t->n_added; i++) {
		free(t->added[i].content);
		free(t->added[i].ncontent);
	}
	free(t->norm);
	free(t->pre);
	free(t->dec);
	free(t->added);
	free(t->by_first);
	free(t->nby_first);
	tok_buf_fini(&t->ntext);
	free(t->special);
	free(t->added_of);
	free(t->prefix);
	free(t->suffix);
	tok_bpe_destroy(t->bpe);
	tok_buf_fini(&t->text);
	tok_buf_fini(&t->a);
	tok_buf_fini(&t->b);
	tok_spans_fini(&t->sp);
	tok_spans_fini(&t->sp2);
	free(t->file);
	free(t);
}

int st_tokenizer_open(const char *path, struct st_tokenizer **out)
{
	struct st_tokenizer *t;
	struct json_object *root = NULL, *cfg = NULL, *model, *o;
	char file[PATH_MAX], cfg_path[PATH_MAX];
	struct stat sb;
	const char *type;
	int ret;

	*out = NULL;
	if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
		snprintf(file, sizeof(file), "%s/tokenizer.json", path);
		snprintf(cfg_path, sizeof(cfg_path), "%s/tokenizer_config.json", path);
	} else {
		const char *slash = strrchr(path, '/');

		snprintf(file, sizeof(file), "%s", path);
		if (slash)
			snprintf(cfg_path, sizeof(cfg_path), "%.*s/tokenizer_config.json",
				 (int)(slash - path), path);
		else
			snprintf(cfg_path, sizeof(cfg_path), "tokenizer_config.json");
	}
	t = calloc(1, sizeof(*t));
	if (!t || !(t->file = strdup(file))) {
		free(t);
		return st_error_set(-ENOMEM, "tokenizer: out of memory");
	}
	t->eos_id = -1;
	t->cleanup = true;
	if ((ret = read_json(file, &root)))
		goto out;
	model = get(root, "model");
	type = get_str(model, "type", NULL);
	if (!model || !json_object_is_type(model, json_type_object)) {
		ret = st_error_set(-EINVAL, "%s: model: missing", file);
		goto out;
	}
	if (type && strcmp(type, "BPE") != 0) {
		ret = st_error_set(-EINVAL, "%s: model.type: %s is not supported (strata "
				   "reads BPE models; docs/tokenizer.md)", file, shown(type));
		goto out;
	}
	if ((o = get(root, "normalizer")) && (ret = parse_normalizer(t, o, 0)))
		goto out;
	if ((o = get(root, "pre_tokenizer")) && (ret = parse_pre(t, o, 0)))
		goto out;
	if ((o = get(root, "post_processor")) && (ret = parse_post(t, o, 0)))
		goto out;
	if ((o = get(root, "decoder")) && (ret = parse_decoder(t, o, 0)))
		goto out;
	if ((o = get(root, "truncation")) || (o = get(root, "padding"))) {
		ret = st_error_set(-EINVAL, "%s: %s: set; strata writes whole documents, "
				   "without truncation or padding", file,
				   get(root, "truncation") ? "truncation" : "padding");
		goto out;
	}
	if ((ret = tok_bpe_create(model, t->byte_level, file, &t->bpe)))
		goto out;
	if ((ret = parse_added(t, get(root, "added_tokens"))))
		goto out;
	t->n_ids = tok_bpe_vocab(t->bpe);
	for (size_t i = 0; i < t->n_added; i++)
		if (t->added[i].id + 1 > t->n_ids)
			t->n_ids = t->added[i].id + 1;
	t->special = calloc(t->n_ids, 1);
	t->added_of = calloc(t->n_ids, sizeof(*t->added_of));
	if (!t->special || !t->added_of) {
		ret = st_error_set(-ENOMEM, "tokenizer: out of memory");
		goto out;
	}
	for (size_t i = 0; i < t->n_added; i++) {
		t->added_of[t->added[i].id] = (uint32_t)i + 1;
		t->special[t->added[i].id] = t->added[i].special;
	}
	for (size_t i = 0; i < t->n_prefix; i++)
		if (t->prefix[i] >= t->n_ids) {
			ret = st_error_set(-EINVAL, "%s: post_processor: id %u is past the "
					   "vocabulary", file, t->prefix[i]);
			goto out;
		}
	for (size_t i = 0; i < t->n_suffix; i++)
		if (t->suffix[i] >= t->n_ids) {
			ret = st_error_set(-EINVAL, "%s: post_processor: id %u is past the "
					   "vocabulary", file, t->suffix[i]);
			goto out;
		}
	ret = read_json(cfg_path, &cfg);
	if (ret == -ENOENT)
		ret = 0;
	else if (ret == 0)
		ret = apply_config(t, cfg, cfg_path);
out:
	json_object_put(root);
	json_object_put(cfg);
	if (ret) {
		st_tokenizer_close(t);
		return ret;
	}
	*out = t;
	return 0;
}

uint32_t st_tokenizer_vocab(const struct st_tokenizer *t)
{
	return t->n_ids;
}

const char *st_tokenizer_kind(const struct st_tokenizer *t)
{
	return t->byte_level ? "byte-level BPE" : "BPE";
}

size_t st_tokenizer_prefix(const struct st_tokenizer *t, const uint32_t **ids)
{
	*ids = t->prefix;
	return t->n_prefix;
}

size_t st_tokenizer_suffix(const struct st_tokenizer *t, const uint32_t **ids)
{
	*ids = t->suffix;
	return t->n_suffix;
}

int64_t st_tokenizer_eos_id(const struct st_tokenizer *t)
{
	return t->eos_id;
}

int64_t st_tokenizer_token_id(const struct st_tokenizer *t, const char *s)
{
	size_t n = strlen(s);

	for (size_t i = 0; i < t->n_added; i++)
		if (t->added[i].len == n && memcmp(t->added[i].content, s, n) == 0)
			return t->added[i].id;
	return tok_bpe_lookup(t->bpe, s, n);
}

bool st_tokenizer_is_special(const struct st_tokenizer *t, uint32_t id)
{
	return id < t->n_ids && t->special[id];
}

size_t st_tokenizer_added(const struct st_tokenizer *t, size_t i, const char **text)
{
	if (i >= t->n_added) {
		*text = NULL;
		return 0;
	}
	*text = t->added[i].content;
	return t->added[i].len;
}

size_t st_tokenizer_n_added(const struct st_tokenizer *t)
{
	return t->n_added;
}

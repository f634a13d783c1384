/* strata: rendering a parsed Jinja template (strata/jinja.h) with the
 * values and rules of @huggingface/jinja: its value types (integer and
 * float kept apart, undefined apart from none), JavaScript's loose `==`,
 * `+` that joins a string with anything, strings measured and indexed in
 * UTF-16 units but sliced by code point, and output as JavaScript prints
 * (numbers as Number.prototype.toString, lists and objects as JSON).
 *
 * All values of a render live in one arena, freed when it ends; errors set
 * cx->err once and every step returns NULL after it. */
#include "jinja_internal.h"

#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unicode/ustring.h>

#define JN_MAX_STEPS 10000000ull
#define JN_MAX_EVAL_DEPTH 400
#define JN_MAX_VALUE_BYTES (256ull << 20)
#define JN_MAX_OUT_BYTES (256ull << 20)

enum vt { V_UNDEF, V_NULL, V_BOOL, V_INT, V_FLOAT, V_STR, V_ARRAY, V_OBJECT, V_NS, V_FUNC };

enum fn {
	F_RAISE, F_RANGE, F_STRFTIME, F_NAMESPACE, F_UPPER, F_LOWER, F_STRIP, F_TITLE,
	F_CAPITALIZE, F_RSTRIP, F_LSTRIP, F_STARTSWITH, F_ENDSWITH, F_SPLIT, F_REPLACE,
	F_GET, F_ITEMS, F_KEYS, F_VALUES, F_MACRO,
};

struct val;
struct kv {
	const char *k;
	size_t kn;
	struct val *v;
};

struct val {
	enum vt t;
	bool b;     /* BOOL; ARRAY: a tuple; OBJECT: keyword arguments */
	double num; /* INT, FLOAT */
	const char *s;
	size_t n;   /* STR */
	struct val **items;
	size_t len; /* ARRAY */
	struct kv *kv;
	size_t nkv, cap; /* OBJECT, NS */
	enum fn fn;
	struct val *self; /* FUNC: the string or object of a method */
	const struct jn_node *macro; /* F_MACRO: its node, */
	struct scope *env;           /* and the scope it was defined in */
};

struct scope {
	struct scope *parent;
	struct val vars; /* an OBJECT */
};

struct cx {
	struct jn_arena a;
	char *out;
	size_t n, cap;
	int err;
	char msg[256];
	int ctl; /* 1 break, 2 continue */
	uint64_t steps;
	int depth;
};

static struct val undef_v = { .t = V_UNDEF }, null_v = { .t = V_NULL },
		  true_v = { .t = V_BOOL, .b = true }, false_v = { .t = V_BOOL };

static const char *const type_names[] = {
	"UndefinedValue", "NullValue", "BooleanValue", "IntegerValue", "FloatValue",
	"StringValue", "ArrayValue", "ObjectValue", "NamespaceValue", "FunctionValue",
};

ST_PRINTF(2, 3)
static void *fail(struct cx *cx, const char *fmt, ...)
{
	va_list ap;

	if (cx->err)
		return NULL;
	cx->err = -EINVAL;
	va_start(ap, fmt);
	vsnprintf(cx->msg, sizeof(cx->msg), fmt, ap);
	va_end(ap);
	return NULL;
}

static void *oom(struct cx *cx)
{
	if (!cx->err) {
		cx->err = -E2BIG;
		snprintf(cx->msg, sizeof(cx->msg), "the render needs more than %llu MiB of values",
			 JN_MAX_VALUE_BYTES >> 20);
	}
	return NULL;
}

static void *alloc(struct cx *cx, size_t bytes)
{
	void *p = jn_arena_alloc(&cx->a, bytes);

	return p ? p : oom(cx);
}

static struct val *mk(struct cx *cx, enum vt t)
{
	struct val *v = alloc(cx, sizeof(*v));

	if (v)
		v->t = t;
	return v;
}

static struct val *mk_num(struct cx *cx, enum vt t, double x)
{
	struct val *v = mk(cx, t);

	if (v)
		v->num = x;
	return v;
}

static struct val *mk_str(struct cx *cx, const char *s, size_t n, bool copy)
{
	struct val *v = mk(cx, V_STR);
	char *c;

	if (!v)
		return NULL;
	if (copy) {
		if (!(c = alloc(cx, n + 1)))
			return NULL;
		memcpy(c, s, n);
		s = c;
	}
	v->s = s;
	v->n = n;
	return v;
}

static struct val *mk_bool(bool b)
{
	return b ? &true_v : &false_v;
}

static struct val *mk_array(struct cx *cx, size_t len)
{
	struct val *v = mk(cx, V_ARRAY);

	if (v && len && !(v->items = alloc(cx, len * sizeof(*v->items))))
		return NULL;
	if (v)
		v->len = len;
	return v;
}

static struct val *mk_fn(struct cx *cx, enum fn fn, struct val *self)
{
	struct val *v = mk(cx, V_FUNC);

	if (v) {
		v->fn = fn;
		v->self = self;
	}
	return v;
}

static struct val *obj_get(const struct val *o, const char *k, size_t kn)
{
	for (size_t i = 0; i < o->nkv; i++)
		if (o->kv[i].kn == kn && !memcmp(o->kv[i].k, k, kn))
			return o->kv[i].v;
	return NULL;
}

static bool obj_set(struct cx *cx, struct val *o, const char *k, size_t kn, struct val *v)
{
	for (size_t i = 0; i < o->nkv; i++)
		if (o->kv[i].kn == kn && !memcmp(o->kv[i].k, k, kn)) {
			o->kv[i].v = v;
			return true;
		}
	if (o->nkv == o->cap) {
		size_t cap = o->cap ? o->cap * 2 : 8;
		struct kv *kv = alloc(cx, cap * sizeof(*kv));

		if (!kv)
			return false;
		if (o->nkv)
			memcpy(kv, o->kv, o->nkv * sizeof(*kv));
		o->kv = kv;
		o->cap = cap;
	}
	o->kv[o->nkv++] = (struct kv){ k, kn, v };
	return true;
}

static bool is_num(const struct val *v)
{
	return v->t == V_INT || v->t == V_FLOAT;
}

static bool is_str(const struct val *v, const char *s)
{
	return v->t == V_STR && v->n == strlen(s) && !memcmp(v->s, s, v->n);
}

static bool name_is(const struct jn_node *nd, const char *s)
{
	return nd->n == strlen(s) && !memcmp(nd->s, s, nd->n);
}

/* --- text: a growing buffer ------------------------------------------------ */

struct sb {
	struct cx *cx;
	char *p;
	size_t n, cap;
};

static bool sb_put(struct sb *b, const char *s, size_t n)
{
	if (b->n + n + 1 > b->cap) {
		size_t cap = (b->n + n + 1) * 2;
		char *p;

		if (cap > JN_MAX_OUT_BYTES || !(p = realloc(b->p, cap))) {
			oom(b->cx);
			return false;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = 0;
	return true;
}

static bool sb_puts(struct sb *b, const char *s)
{
	return sb_put(b, s, strlen(s));
}

/* The buffer's text as a string value (copied into the arena). */
static struct val *sb_val(struct sb *b)
{
	struct val *v = b->cx->err ? NULL : mk_str(b->cx, b->p ? b->p : "", b->n, true);

	free(b->p);
	b->p = NULL;
	return v;
}

static bool out_put(struct cx *cx, const char *s, size_t n)
{
	struct sb b = { .cx = cx, .p = cx->out, .n = cx->n, .cap = cx->cap };
	bool ok = sb_put(&b, s, n);

	cx->out = b.p;
	cx->n = b.n;
	cx->cap = b.cap;
	return ok;
}

/* --- numbers and JSON as JavaScript writes them ------------------------------ */

/* Number.prototype.toString(): the shortest digits that read back, in
 * fixed notation for exponents -7 < e < 21, else d.ddde+x. o: 40 bytes. */
static void js_num(double x, char *o, size_t on)
{
	char e[40], d[20];
	int k = 0, n, p;
	size_t at = 0;

	if (isnan(x) || isinf(x) || x == 0) {
		snprintf(o, on, "%s", isnan(x) ? "NaN" : x == 0 ? "0" :
			 x < 0 ? "-Infinity" : "Infinity");
		return;
	}
	if (x < 0) {
		o[at++] = '-';
		x = -x;
	}
	for (p = 1; p <= 17; p++) {
		snprintf(e, sizeof(e), "%.*e", p - 1, x);
		if (strtod(e, NULL) == x)
			break;
	}
	for (const char *c = e; *c && *c != 'e'; c++)
		if (*c != '.')
			d[k++] = *c;
	while (k > 1 && d[k - 1] == '0')
		k--;
	n = atoi(strchr(e, 'e') + 1) + 1;
	if (k <= n && n <= 21) {
		memcpy(o + at, d, (size_t)k);
		memset(o + at + k, '0', (size_t)(n - k));
		at += (size_t)n;
	} else if (n > 0 && n <= 21) {
		memcpy(o + at, d, (size_t)n);
		o[at + (size_t)n] = '.';
		memcpy(o + at + (size_t)n + 1, d + n, (size_t)(k - n));
		at += (size_t)k + 1;
	} else if (n > -6 && n <= 0) {
		memcpy(o + at, "0.", 2);
		memset(o + at + 2, '0', (size_t)-n);
		memcpy(o + at + 2 - n, d, (size_t)k);
		at += (size_t)(2 - n + k);
	} else {
		o[at++] = d[0];
		if (k > 1) {
			o[at++] = '.';
			memcpy(o + at, d + 1, (size_t)k - 1);
			at += (size_t)k - 1;
		}
		at += (size_t)snprintf(o + at, on - at, "e%c%d", n - 1 < 0 ? '-' : '+', abs(n - 1));
	}
	o[at] = 0;
}

static bool json_str(struct sb *b, const char *s, size_t n, bool ascii)
{
	char u[16];

	if (!sb_put(b, "\"", 1))
		return false;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		const char *esc = NULL;

		switch (c) {
		case '"': esc = "\\\""; break;
		case '\\': esc = "\\\\"; break;
		case '\b': esc = "\\b"; break;
		case '\f': esc = "\\f"; break;
		case '\n': esc = "\\n"; break;
		case '\r': esc = "\\r"; break;
		case '\t': esc = "\\t"; break;
		default: break;
		}
		if (esc) {
			if (!sb_puts(b, esc))
				return false;
		} else if (c < 0x20 || (ascii && c == 0x7f)) {
			snprintf(u, sizeof(u), "\\u%04x", c);
			if (!sb_puts(b, u))
				return false;
		} else if (ascii && c >= 0x80) {
			uint32_t cp;
			size_t len = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : 4;

			if (i + len > n)
				len = n - i;
			cp = len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
			for (size_t j = 1; j < len; j++)
				cp = (cp << 6) | ((unsigned char)s[i + j] & 0x3f);
			if (cp >= 0x10000)
				snprintf(u, sizeof(u), "\\u%04x\\u%04x", 0xd800 + ((cp - 0x10000) >> 10),
					 0xdc00 + ((cp - 0x10000) & 0x3ff));
			else
				snprintf(u, sizeof(u), "\\u%04x", cp);
			if (!sb_puts(b, u))
				return false;
			i += len - 1;
		} else if (!sb_put(b, s + i, 1)) {
			return false;
		}
	}
	return sb_put(b, "\"", 1);
}

struct json_opts {
	int indent;
	bool ascii, undef_null;
	const char *item_sep, *key_sep;
};

static bool to_json(struct cx *cx, struct sb *b, const struct val *v, const struct json_opts *o,
		    int depth);

static bool json_pad(struct sb *b, const struct json_opts *o, int depth)
{
	if (!sb_put(b, "\n", 1))
		return false;
	for (int i = 0; i < depth * o->indent; i++)
		if (!sb_put(b, " ", 1))
			return false;
	return true;
}

static bool json_container(struct cx *cx, struct sb *b, const struct val *v,
			   const struct json_opts *o, int depth)
{
	bool arr = v->t == V_ARRAY;
	size_t n = arr ? v->len : v->nkv;

	if (depth > JN_MAX_EVAL_DEPTH)
		return fail(cx, "tojson: nesting too deep");
	if (!sb_put(b, arr ? "[" : "{", 1))
		return false;
	for (size_t i = 0; i < n; i++) {
		if (i && !sb_puts(b, o->item_sep))
			return false;
		if (o->indent && !json_pad(b, o, depth + 1))
			return false;
		if (!arr && (!json_str(b, v->kv[i].k, v->kv[i].kn, o->ascii) ||
			     !sb_puts(b, o->key_sep)))
			return false;
		if (!to_json(cx, b, arr ? v->items[i] : v->kv[i].v, o, depth + 1))
			return false;
	}
	if (o->indent && n && !json_pad(b, o, depth))
		return false;
	return sb_put(b, arr ? "]" : "}", 1);
}

static bool to_json(struct cx *cx, struct sb *b, const struct val *v, const struct json_opts *o,
		    int depth)
{
	char num[40];

	switch (v->t) {
	case V_NULL:
		return sb_puts(b, "null");
	case V_UNDEF:
		return sb_puts(b, o->undef_null ? "null" : "undefined");
	case V_BOOL:
		return sb_puts(b, v->b ? "true" : "false");
	case V_INT:
	case V_FLOAT:
		if (!isfinite(v->num))
			return sb_puts(b, "null");
		js_num(v->num, num, sizeof(num));
		return sb_puts(b, num);
	case V_STR:
		return json_str(b, v->s, v->n, o->ascii);
	case V_ARRAY:
		if (v->b)
			return fail(cx, "Cannot convert to JSON: TupleValue");
		return json_container(cx, b, v, o, depth);
	case V_OBJECT:
		if (v->b)
			return fail(cx, "Cannot convert to JSON: KeywordArgumentsValue");
		return json_container(cx, b, v, o, depth);
	case V_NS:
		return json_container(cx, b, v, o, depth);
	default:
		return fail(cx, "Cannot convert to JSON: %s", type_names[v->t]);
	}
}

static struct val *json_val(struct cx *cx, const struct val *v, const struct json_opts *o)
{
	struct sb b = { .cx = cx };

	to_json(cx, &b, v, o, 0);
	return sb_val(&b);
}

static const struct json_opts json_default = { 0, false, true, ", ", ": " };
static const struct json_opts json_display = { 0, false, false, ", ", ": " };

/* What the template prints for v (RuntimeValue.toString()). */
static bool display(struct cx *cx, struct sb *b, const struct val *v)
{
	char num[48];

	switch (v->t) {
	case V_STR:
		return sb_put(b, v->s, v->n);
	case V_BOOL:
		return sb_puts(b, v->b ? "true" : "false");
	case V_INT:
		js_num(v->num, num, sizeof(num));
		return sb_puts(b, num);
	case V_FLOAT:
		if (v->num == 0 && signbit(v->num))
			return sb_puts(b, "-0.0");
		if (isfinite(v->num) && fmod(v->num, 1) == 0 && fabs(v->num) < 1e21)
			snprintf(num, sizeof(num), "%.1f", v->num);
		else
			js_num(v->num, num, sizeof(num));
		return sb_puts(b, num);
	case V_UNDEF:
		return sb_puts(b, "undefined");
	case V_NULL:
		return sb_puts(b, "null");
	case V_ARRAY:
	case V_OBJECT:
	case V_NS:
		return to_json(cx, b, v, &json_display, 0);
	default:
		return fail(cx, "cannot print a function");
	}
}

/* value.toString() of the JavaScript value under v (for + and ~). */
static bool js_string(struct cx *cx, struct sb *b, const struct val *v)
{
	char num[48];

	switch (v->t) {
	case V_INT:
	case V_FLOAT:
		js_num(v->num, num, sizeof(num));
		return sb_puts(b, num);
	case V_ARRAY:
		for (size_t i = 0; i < v->len; i++)
			if ((i && !sb_put(b, ",", 1)) || !display(cx, b, v->items[i]))
				return false;
		return true;
	case V_OBJECT:
	case V_NS:
		return sb_puts(b, "[object Map]");
	case V_FUNC:
		return fail(cx, "cannot make a string of a function");
	default:
		return display(cx, b, v);
	}
}

/* --- UTF-8 and UTF-16 -------------------------------------------------------- */

static size_t cp_len(const char *s, size_t n)
{
	unsigned char c = (unsigned char)s[0];
	size_t len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : 4;

	return len > n ? n : len;
}

static size_t utf16_len(const char *s, size_t n)
{
	size_t units = 0;

	for (size_t i = 0; i < n; i += cp_len(s + i, n - i))
		units += cp_len(s + i, n - i) == 4 ? 2 : 1;
	return units;
}

static const char *ws_trim_start(const char *s, const char *end)
{
	size_t k;

	while ((k = jn_ws_len(s, end)))
		s += k;
	return s;
}

static const char *ws_trim_end(const char *s, const char *end)
{
	size_t k;

	while ((k = jn_ws_len_back(s, end)))
		end -= k;
	return end;
}

/* toUpperCase / toLowerCase: ICU's full case mapping (root locale). */
static struct val *str_case(struct cx *cx, const struct val *v, bool upper)
{
	UErrorCode e = U_ZERO_ERROR;
	int32_t n16 = 0, m16, n8 = 0;
	UChar *a, *b;
	char *o;
	bool ascii = true;

	for (size_t i = 0; i < v->n; i++)
		ascii &= (unsigned char)v->s[i] < 0x80;
	if (ascii) {
		if (!(o = alloc(cx, v->n + 1)))
			return NULL;
		for (size_t i = 0; i < v->n; i++) {
			char c = v->s[i];

			o[i] = upper && c >= 'a' && c <= 'z' ? (char)(c - 32) :
			       !upper && c >= 'A' && c <= 'Z' ? (char)(c + 32) : c;
		}
		return mk_str(cx, o, v->n, false);
	}
	if (v->n > INT32_MAX / 4 || !(a = alloc(cx, (v->n + 1) * sizeof(UChar))) ||
	    !(b = alloc(cx, (v->n * 3 + 1) * sizeof(UChar))))
		return oom(cx);
	u_strFromUTF8Lenient(a, (int32_t)v->n + 1, &n16, v->s, (int32_t)v->n, &e);
	m16 = upper ? u_strToUpper(b, (int32_t)v->n * 3 + 1, a, n16, "", &e) :
		      u_strToLower(b, (int32_t)v->n * 3 + 1, a, n16, "", &e);
	if (U_FAILURE(e) || !(o = alloc(cx, (size_t)m16 * 3 + 1)))
		return fail(cx, "case mapping failed");
	u_strToUTF8(o, m16 * 3 + 1, &n8, b, m16, &e);
	return U_FAILURE(e) ? fail(cx, "case mapping failed") : mk_str(cx, o, (size_t)n8, false);
}

/* s.at(i) in UTF-16 units; half of a surrogate pair reads as U+FFFD. */
static struct val *str_at(struct cx *cx, const struct val *v, double idx)
{
	double len = (double)utf16_len(v->s, v->n);
	size_t unit = 0;

	if (idx < 0)
		idx += len;
	if (idx < 0 || idx >= len || idx != floor(idx))
		return &undef_v;
	for (size_t i = 0; i < v->n; i += cp_len(v->s + i, v->n - i)) {
		size_t l = cp_len(v->s + i, v->n - i), units = l == 4 ? 2 : 1;

		if ((double)(unit + units) > idx)
			return units == 2 ? mk_str(cx, "\xef\xbf\xbd", 3, false) :
					    mk_str(cx, v->s + i, l, false);
		unit += units;
	}
	return &undef_v;
}

/* --- JavaScript's == and === ------------------------------------------------- */

/* StringToNumber: a decimal literal or 0x/0o/0b, whitespace around; else NaN. */
static double js_str_num(const char *s, size_t n)
{
	const char *end = ws_trim_end(s, s + n), *p;
	char buf[400];
	size_t len;

	s = ws_trim_start(s, end);
	if (s == end)
		return 0;
	len = (size_t)(end - s);
	if (len >= sizeof(buf))
		return NAN;
	memcpy(buf, s, len);
	buf[len] = 0;
	p = buf + (buf[0] == '+' || buf[0] == '-');
	if (!strcmp(p, "Infinity"))
		return buf[0] == '-' ? -INFINITY : INFINITY;
	if (p == buf && len > 2 && buf[0] == '0' && strchr("xXoObB", buf[1])) {
		int base = strchr("xX", buf[1]) ? 16 : strchr("oO", buf[1]) ? 8 : 2;
		double x = 0;

		for (p = buf + 2; *p; p++) {
			int d = *p >= '0' && *p <= '9' ? *p - '0' :
				(*p | 0x20) >= 'a' && (*p | 0x20) <= 'f' ? (*p | 0x20) - 'a' + 10 : 99;

			if (d < 0 || d >= base)
				return NAN;
			x = x * base + d;
		}
		return x;
	}
	{
		const char *q = p;
		bool digits = false;

		while (*q >= '0' && *q <= '9')
			q++, digits = true;
		if (*q == '.')
			for (q++; *q >= '0' && *q <= '9'; q++)
				digits = true;
		if (!digits)
			return NAN;
		if (*q == 'e' || *q == 'E') {
			q++;
			q += *q == '+' || *q == '-';
			if (!(*q >= '0' && *q <= '9'))
				return NAN;
			while (*q >= '0' && *q <= '9')
				q++;
		}
		return *q ? NAN : strtod(buf, NULL);
	}
}

static bool loose_eq(struct cx *cx, const struct val *a, const struct val *b)
{
	bool an = a->t == V_UNDEF || a->t == V_NULL, bn = b->t == V_UNDEF || b->t == V_NULL;

	if (an || bn)
		return an && bn;
	if (is_num(a) && is_num(b))
		return a->num == b->num;
	if (a->t == V_STR && b->t == V_STR)
		return a->n == b->n && !memcmp(a->s, b->s, a->n);
	if (a->t == V_BOOL && b->t == V_BOOL)
		return a->b == b->b;
	if (a->t == V_BOOL || b->t == V_BOOL) {
		struct val x = { .t = V_INT };

		x.num = a->t == V_BOOL ? a->b : b->b;
		return loose_eq(cx, a->t == V_BOOL ? &x : a, b->t == V_BOOL ? &x : b);
	}
	if (is_num(a) && b->t == V_STR)
		return a->num == js_str_num(b->s, b->n);
	if (a->t == V_STR && is_num(b))
		return b->num == js_str_num(a->s, a->n);
	if (a->t == b->t || (a->t >= V_ARRAY && b->t >= V_ARRAY))
		return a == b;
	{ /* an object against a string or number: its string */
		const struct val *o = a->t >= V_ARRAY ? a : b, *p = o == a ? b : a;
		struct sb s = { .cx = cx };
		struct val *sv;

		if (o->t == V_FUNC || !js_string(cx, &s, o) || !(sv = sb_val(&s)))
			return false;
		return loose_eq(cx, sv, p);
	}
}

static bool strict_eq(const struct val *a, const struct val *b)
{
	if (is_num(a) && is_num(b))
		return a->num == b->num;
	if (a->t != b->t)
		return false;
	switch (a->t) {
	case V_UNDEF:
	case V_NULL:
		return true;
	case V_BOOL:
		return a->b == b->b;
	case V_STR:
		return a->n == b->n && !memcmp(a->s, b->s, a->n);
	default:
		return a == b;
	}
}

static bool truthy(const struct val *v)
{
	switch (v->t) {
	case V_BOOL: return v->b;
	case V_INT:
	case V_FLOAT: return v->num != 0 && !isnan(v->num);
	case V_STR: return v->n > 0;
	case V_ARRAY: return v->len > 0;
	case V_OBJECT: return v->nkv > 0;
	case V_NS:
	case V_FUNC: return true;
	default: return false;
	}
}

/* --- scopes ---------------------------------------------------------------- */

static struct scope *scope_new(struct cx *cx, struct scope *parent)
{
	struct scope *s = alloc(cx, sizeof(*s));

	if (s) {
		s->parent = parent;
		s->vars.t = V_OBJECT;
	}
	return s;
}

static struct val *lookup(const struct scope *s, const char *k, size_t kn)
{
	for (; s; s = s->parent) {
		struct val *v = obj_get(&s->vars, k, kn);

		if (v)
			return v;
	}
	return &undef_v;
}

/* --- evaluation ------------------------------------------------------------- */

static struct val *eval(struct cx *cx, const struct jn_node *nd, struct scope *sc);
static void render_block(struct cx *cx, struct jn_node *const *list, size_t len,
			 struct scope *sc);

/* Call arguments: the positional ones, and the keyword ones (or NULL). */
struct args {
	struct val **pos;
	size_t n;
	struct val *kw;
};

static bool eval_args(struct cx *cx, const struct jn_node *call, struct scope *sc,
		      struct args *a)
{
	*a = (struct args){ 0 };
	if (call->len && !(a->pos = alloc(cx, call->len * sizeof(*a->pos))))
		return false;
	for (size_t i = 0; i < call->len; i++) /* positional first, as JavaScript does */
		if (call->list[i]->kind != JN_KWARG &&
		    !(a->pos[a->n++] = eval(cx, call->list[i], sc)))
			return false;
	for (size_t i = 0; i < call->len; i++) {
		const struct jn_node *k = call->list[i];
		struct val *v;

		if (k->kind != JN_KWARG)
			continue;
		if (!a->kw && !(a->kw = mk(cx, V_OBJECT)))
			return false;
		a->kw->b = true;
		if (obj_get(a->kw, k->s, k->n))
			return fail(cx, "Got multiple values for keyword argument '%.*s'",
				    (int)k->n, k->s);
		if (!(v = eval(cx, k->a, sc)) || !obj_set(cx, a->kw, k->s, k->n, v))
			return false;
	}
	return true;
}

static struct val *kwarg(const struct args *a, const char *name)
{
	return a->kw ? obj_get(a->kw, name, strlen(name)) : NULL;
}

static struct val *call_fn(struct cx *cx, const struct val *f, const struct args *a);

static struct val *str_split(struct cx *cx, const struct val *s, const struct args *a)
{
	const struct val *sep = a->n > 0 ? a->pos[0] : &null_v;
	const struct val *max = a->n > 1 ? a->pos[1] : NULL;
	double maxsplit = max ? max->num : -1;
	const char *p = s->s, *end = s->s + s->n;
	struct val *out = mk_array(cx, 0);
	size_t cap = 0;

	if (!(sep->t == V_STR || sep->t == V_NULL))
		return fail(cx, "sep argument must be a string or null");
	if (max && max->t != V_INT)
		return fail(cx, "maxsplit argument must be a number");
	if (sep->t == V_STR && !sep->n)
		return fail(cx, "empty separator");
	if (sep->t == V_NULL)
		p = ws_trim_start(p, end);
	while (out) {
		const char *q;

		if (sep->t == V_NULL) {
			if (p == end)
				break;
			for (q = p; q < end && !jn_ws_len(q, end); q += cp_len(q, (size_t)(end - q)))
				;
		} else {
			q = memmem(p, (size_t)(end - p), sep->s, sep->n);
		}
		if (maxsplit >= 0 && (double)out->len >= maxsplit)
			q = NULL;
		if (!q)
			q = end;
		if (out->len == cap) {
			struct val **items = alloc(cx, (cap = cap ? cap * 2 : 8) * sizeof(*items));

			if (!items)
				return NULL;
			if (out->len)
				memcpy(items, out->items, out->len * sizeof(*items));
			out->items = items;
		}
		if (!(out->items[out->len++] = mk_str(cx, p, (size_t)(q - p), false)))
			return NULL;
		if (q == end)
			break;
		p = sep->t == V_NULL ? ws_trim_start(q, end) : q + sep->n;
		if (sep->t == V_NULL && maxsplit >= 0 && (double)out->len >= maxsplit && p < end) {
			/* the rest goes whole, trailing whitespace and all */
			continue;
		}
	}
	return out;
}

static struct val *str_affix(struct cx *cx, const struct val *s, const struct args *a, bool start)
{
	const struct val *pat = a->n ? a->pos[0] : NULL;

	if (!pat)
		return fail(cx, "%s() requires at least one argument",
			    start ? "startswith" : "endswith");
	for (size_t i = 0; i < (pat->t == V_ARRAY ? pat->len : 1); i++) {
		const struct val *p = pat->t == V_ARRAY ? pat->items[i] : pat;

		if (p->t != V_STR)
			return fail(cx, "%s() argument must be a string or tuple of strings",
				    start ? "startswith" : "endswith");
		if (p->n <= s->n && !memcmp(start ? s->s : s->s + s->n - p->n, p->s, p->n))
			return &true_v;
	}
	return &false_v;
}

static struct val *str_replace(struct cx *cx, const struct val *s, const struct args *a)
{
	const struct val *old = a->n > 0 ? a->pos[0] : NULL, *new = a->n > 1 ? a->pos[1] : NULL;
	const struct val *count = a->n > 2 ? a->pos[2] : kwarg(a, "count");
	double left = count && count->t == V_INT && count->num >= 0 ? count->num : INFINITY;
	struct sb b = { .cx = cx };
	const char *p = s->s, *end = s->s + s->n;

	if (!old || !new)
		return fail(cx, "replace() requires at least two arguments");
	if (old->t != V_STR || new->t != V_STR)
		return fail(cx, "replace() arguments must be strings");
	if (count && count->t != V_INT && count->t != V_NULL)
		return fail(cx, "replace() count argument must be a number or null");
	if (!old->n)
		return fail(cx, "replace() with an empty string is not supported");
	for (const char *q; left > 0 && (q = memmem(p, (size_t)(end - p), old->s, old->n)); left--) {
		if (!sb_put(&b, p, (size_t)(q - p)) || !sb_put(&b, new->s, new->n))
			break;
		p = q + old->n;
	}
	sb_put(&b, p, (size_t)(end - p));
	return sb_val(&b);
}

static struct val *str_method(struct cx *cx, const struct val *f, const struct args *a)
{
	const struct val *s = f->self;
	const char *b = s->s, *e = s->s + s->n;

	switch (f->fn) {
	case F_UPPER:
	case F_LOWER:
		return str_case(cx, s, f->fn == F_UPPER);
	case F_STRIP: /* JavaScript's trim: any argument is ignored */
		e = ws_trim_end(b, e);
		b = ws_trim_start(b, e);
		break;
	case F_LSTRIP:
		b = ws_trim_start(b, e);
		break;
	case F_RSTRIP:
		e = ws_trim_end(b, e);
		break;
	case F_TITLE:
	case F_CAPITALIZE: {
		char *o = alloc(cx, s->n + 1);

		if (!o)
			return NULL;
		memcpy(o, s->s, s->n);
		for (size_t i = 0; i < s->n; i++) {
			bool word = (o[i] >= 'a' && o[i] <= 'z') || (o[i] >= 'A' && o[i] <= 'Z') ||
				    (o[i] >= '0' && o[i] <= '9') || o[i] == '_';
			bool prev = i && ((s->s[i - 1] >= 'a' && s->s[i - 1] <= 'z') ||
					  (s->s[i - 1] >= 'A' && s->s[i - 1] <= 'Z') ||
					  (s->s[i - 1] >= '0' && s->s[i - 1] <= '9') ||
					  s->s[i - 1] == '_');

			if ((f->fn == F_TITLE ? word && !prev : i == 0) && o[i] >= 'a' && o[i] <= 'z')
				o[i] = (char)(o[i] - 32);
		}
		if (f->fn == F_CAPITALIZE && s->n && (unsigned char)s->s[0] >= 0x80)
			return fail(cx, "capitalize of a non-ASCII first letter is not supported");
		return mk_str(cx, o, s->n, false);
	}
	case F_STARTSWITH:
	case F_ENDSWITH:
		return str_affix(cx, s, a, f->fn == F_STARTSWITH);
	case F_SPLIT:
		return str_split(cx, s, a);
	case F_REPLACE:
		return str_replace(cx, s, a);
	default:
		return fail(cx, "unknown string method");
	}
	return mk_str(cx, b, (size_t)(e - b), false);
}

static struct val *obj_pairs(struct cx *cx, const struct val *o, int which)
{
	struct val *out = mk_array(cx, o->nkv);

	for (size_t i = 0; out && i < o->nkv; i++) {
		struct val *k = mk_str(cx, o->kv[i].k, o->kv[i].kn, false), *pair;

		if (!k)
			return NULL;
		if (which == 0) {
			if (!(pair = mk_array(cx, 2)))
				return NULL;
			pair->items[0] = k;
			pair->items[1] = o->kv[i].v;
		}
		out->items[i] = which == 0 ? pair : which == 1 ? k : o->kv[i].v;
	}
	return out;
}

static struct val *fn_range(struct cx *cx, const struct args *a)
{
	double start = 0, stop, step = 1;
	struct val *out;
	size_t n = 0;

	for (size_t i = 0; i < a->n; i++)
		if (!is_num(a->pos[i]))
			return fail(cx, "range() takes numbers");
	if (a->n == 0 || a->n > 3)
		return fail(cx, "range() takes 1 to 3 arguments");
	stop = a->pos[0]->num;
	if (a->n > 1) {
		start = stop;
		stop = a->pos[1]->num;
	}
	if (a->n > 2)
		step = a->pos[2]->num;
	if (step == 0)
		return fail(cx, "range() step must not be zero");
	for (double i = start; step > 0 ? i < stop : i > stop; i += step)
		if (++n > 1000000)
			return fail(cx, "range() of more than 10^6 numbers");
	if (!(out = mk_array(cx, n)))
		return NULL;
	for (size_t i = 0; i < n; i++) {
		double x = start + (double)i * step;

		if (!(out->items[i] = mk_num(cx, x == floor(x) ? V_INT : V_FLOAT, x)))
			return NULL;
	}
	return out;
}

/* strftime_now(format): %Y %m %d %b %B %H %M %% as @huggingface/jinja
 * formats them (English month names); the time is SOURCE_DATE_EPOCH when
 * set, else now; local time. */
static struct val *fn_strftime(struct cx *cx, const struct args *a)
{
	static const char *const months[] = { "January", "February", "March", "April", "May",
					      "June", "July", "August", "September", "October",
					      "November", "December" };
	const char *epoch = getenv("SOURCE_DATE_EPOCH");
	time_t now = epoch ? (time_t)strtoll(epoch, NULL, 10) : time(NULL);
	const struct val *f = a->n ? a->pos[0] : NULL;
	struct sb b = { .cx = cx };
	struct tm tm;
	char part[32];

	if (!f || f->t != V_STR)
		return fail(cx, "strftime_now() takes a format string");
	localtime_r(&now, &tm);
	for (size_t i = 0; i < f->n; i++) {
		const char *c = f->s + i;

		if (*c != '%' || i + 1 >= f->n || !strchr("YmdbBHM%", c[1]) || !c[1]) {
			sb_put(&b, c, 1);
			continue;
		}
		switch (c[1]) {
		case 'Y': snprintf(part, sizeof(part), "%d", tm.tm_year + 1900); break;
		case 'm': snprintf(part, sizeof(part), "%02d", tm.tm_mon + 1); break;
		case 'd': snprintf(part, sizeof(part), "%02d", tm.tm_mday); break;
		case 'b': snprintf(part, sizeof(part), "%.3s", months[tm.tm_mon]); break;
		case 'B': snprintf(part, sizeof(part), "%s", months[tm.tm_mon]); break;
		case 'H': snprintf(part, sizeof(part), "%02d", tm.tm_hour); break;
		case 'M': snprintf(part, sizeof(part), "%02d", tm.tm_min); break;
		default: snprintf(part, sizeof(part), "%%"); break;
		}
		sb_puts(&b, part);
		i++;
	}
	return sb_val(&b);
}

static struct val *fn_namespace(struct cx *cx, const struct args *a)
{
	struct val *ns = mk(cx, V_NS);

	if (!ns)
		return NULL;
	if (a->n > 1)
		return fail(cx, "namespace expected at most 1 argument, got %zu", a->n);
	if (a->n == 1) {
		const struct val *src = a->pos[0];

		if (src->t != V_OBJECT)
			return fail(cx, "namespace() of a %s is not supported", type_names[src->t]);
		for (size_t i = 0; i < src->nkv; i++)
			if (!obj_set(cx, ns, src->kv[i].k, src->kv[i].kn, src->kv[i].v))
				return NULL;
	}
	for (size_t i = 0; a->kw && i < a->kw->nkv; i++)
		if (!obj_set(cx, ns, a->kw->kv[i].k, a->kw->kv[i].kn, a->kw->kv[i].v))
			return NULL;
	return ns;
}

static bool param_name(const struct jn_node *p, const struct val *name)
{
	return name->n == p->n && !memcmp(name->s, p->s, p->n);
}

/* A macro's call: its parameters bound in a scope of the one it was
 * defined in (positional, then by keyword, then defaults, evaluated
 * there), its body rendered to a string. */
static struct val *macro_call(struct cx *cx, const struct val *f, const struct args *a)
{
	const struct jn_node *m = f->macro;
	struct scope *sc = scope_new(cx, f->env);
	size_t mark = cx->n;
	struct val *v;

	if (!sc)
		return NULL;
	if (a->n > m->len)
		return fail(cx, "macro '%.*s' takes not more than %zu argument(s)", (int)m->n, m->s,
			    m->len);
	for (size_t i = 0; i < m->len; i++) {
		const struct jn_node *p = m->list[i];

		v = i < a->n ? a->pos[i] : a->kw ? obj_get(a->kw, p->s, p->n) : NULL;
		if (!obj_set(cx, &sc->vars, p->s, p->n, v ? v : &undef_v))
			return NULL;
	}
	for (size_t k = 0; a->kw && k < a->kw->nkv; k++) {
		bool known = false;

		for (size_t i = a->n; i < m->len; i++)
			known |= param_name(m->list[i], &(struct val){ .s = a->kw->kv[k].k,
								       .n = a->kw->kv[k].kn });
		if (!known)
			return fail(cx, "macro '%.*s' takes no keyword argument '%.*s'", (int)m->n,
				    m->s, (int)a->kw->kv[k].kn, a->kw->kv[k].k);
	}
	for (size_t i = a->n; i < m->len; i++) {
		const struct jn_node *p = m->list[i];

		if (p->kind == JN_KWARG && !(a->kw && obj_get(a->kw, p->s, p->n)) &&
		    (!(v = eval(cx, p->a, sc)) || !obj_set(cx, &sc->vars, p->s, p->n, v)))
			return NULL;
	}
	render_block(cx, m->list2, m->len2, sc);
	v = cx->err ? NULL : mk_str(cx, cx->out ? cx->out + mark : "", cx->n - mark, true);
	cx->n = mark;
	return v;
}

static struct val *call_fn(struct cx *cx, const struct val *f, const struct args *a)
{
	switch (f->fn) {
	case F_MACRO:
		return macro_call(cx, f, a);
	case F_RAISE: {
		struct sb b = { .cx = cx };
		struct val *m;

		if (a->n && !js_string(cx, &b, a->pos[0]))
			return NULL;
		if (!(m = sb_val(&b)))
			return NULL;
		return fail(cx, "raise_exception: %.*s", (int)ST_MIN(m->n, 200), m->s);
	}
	case F_RANGE:
		return fn_range(cx, a);
	case F_STRFTIME:
		return fn_strftime(cx, a);
	case F_NAMESPACE:
		return fn_namespace(cx, a);
	case F_GET: {
		const struct val *k = a->n ? a->pos[0] : &undef_v, *v;

		if (k->t != V_STR)
			return fail(cx, "Object key must be a string: got %s", type_names[k->t]);
		v = obj_get(f->self, k->s, k->n);
		return (struct val *)(v ? v : a->n > 1 ? a->pos[1] : &null_v);
	}
	case F_ITEMS:
		return obj_pairs(cx, f->self, 0);
	case F_KEYS:
		return obj_pairs(cx, f->self, 1);
	case F_VALUES:
		return obj_pairs(cx, f->self, 2);
	default:
		return str_method(cx, f, a);
	}
}

/* The methods and properties of a value (RuntimeValue.builtins). */
static struct val *builtin(struct cx *cx, struct val *o, const struct val *name)
{
	static const struct { const char *name; enum fn fn; } str_fns[] = {
		{ "upper", F_UPPER }, { "lower", F_LOWER }, { "strip", F_STRIP },
		{ "title", F_TITLE }, { "capitalize", F_CAPITALIZE }, { "rstrip", F_RSTRIP },
		{ "lstrip", F_LSTRIP }, { "startswith", F_STARTSWITH }, { "endswith", F_ENDSWITH },
		{ "split", F_SPLIT }, { "replace", F_REPLACE },
	}, obj_fns[] = {
		{ "get", F_GET }, { "items", F_ITEMS }, { "keys", F_KEYS }, { "values", F_VALUES },
	};

	if (is_str(name, "length") && (o->t == V_STR || o->t == V_ARRAY))
		return mk_num(cx, V_INT, (double)(o->t == V_STR ? utf16_len(o->s, o->n) : o->len));
	for (size_t i = 0; o->t == V_STR && i < ST_ARRAY_LEN(str_fns); i++)
		if (is_str(name, str_fns[i].name))
			return mk_fn(cx, str_fns[i].fn, o);
	for (size_t i = 0; o->t == V_OBJECT && i < ST_ARRAY_LEN(obj_fns); i++)
		if (is_str(name, obj_fns[i].name))
			return mk_fn(cx, obj_fns[i].fn, o);
	if (o->t == V_OBJECT && is_str(name, "dictsort"))
		return fail(cx, "dictsort is not supported");
	return &undef_v;
}

static struct val *slice(struct cx *cx, struct val *o, const struct jn_node *sl,
			 struct scope *sc)
{
	struct val *part[3] = { &undef_v, &undef_v, &undef_v }, *out;
	const struct jn_node *nodes[3] = { sl->a, sl->b, sl->c };
	const char **cps = NULL;
	double len, start, stop, step, dir;
	size_t n = 0, cap;

	if (o->t != V_ARRAY && o->t != V_STR)
		return fail(cx, "Slice object must be an array or string");
	for (int i = 0; i < 3; i++) {
		if (nodes[i] && !(part[i] = eval(cx, nodes[i], sc)))
			return NULL;
		if (part[i]->t != V_INT && part[i]->t != V_UNDEF)
			return fail(cx, "Slice indices must be integers or undefined");
	}
	if (o->t == V_STR) { /* Array.from(string): code points */
		if (!(cps = alloc(cx, (o->n + 1) * sizeof(*cps))))
			return NULL;
		for (size_t i = 0; i < o->n; i += cp_len(o->s + i, o->n - i))
			cps[n++] = o->s + i;
		cps[n] = o->s + o->n;
	}
	len = o->t == V_STR ? (double)n : (double)o->len;
	step = part[2]->t == V_INT ? part[2]->num : 1;
	dir = step > 0 ? 1 : step < 0 ? -1 : 0;
	if (dir >= 0) {
		start = part[0]->t == V_INT ? part[0]->num : 0;
		stop = part[1]->t == V_INT ? part[1]->num : len;
		start = start < 0 ? fmax(len + start, 0) : fmin(start, len);
		stop = stop < 0 ? fmax(len + stop, 0) : fmin(stop, len);
	} else {
		start = part[0]->t == V_INT ? part[0]->num : len - 1;
		stop = part[1]->t == V_INT ? part[1]->num : -1;
		start = start < 0 ? fmax(len + start, -1) : fmin(start, len - 1);
		stop = stop < -1 ? fmax(len + stop, -1) : fmin(stop, len - 1);
	}
	cap = (size_t)len + 1;
	if (o->t == V_STR) {
		struct sb b = { .cx = cx };

		for (double i = start; dir != 0 && dir * i < dir * stop; i += step)
			if (!sb_put(&b, cps[(size_t)i], (size_t)(cps[(size_t)i + 1] - cps[(size_t)i])))
				break;
		return sb_val(&b);
	}
	if (!(out = mk_array(cx, cap)))
		return NULL;
	out->len = 0;
	for (double i = start; dir != 0 && dir * i < dir * stop; i += step)
		out->items[out->len++] = o->items[(size_t)i];
	return out;
}

static struct val *member(struct cx *cx, const struct jn_node *nd, struct scope *sc)
{
	struct val *o = eval(cx, nd->a, sc), *prop, *v = NULL;

	if (!o)
		return NULL;
	if (nd->flag && nd->b->kind == JN_SLICE)
		return slice(cx, o, nd->b, sc);
	if (nd->flag)
		prop = eval(cx, nd->b, sc);
	else if (nd->b->kind == JN_INT)
		prop = mk_num(cx, V_INT, nd->b->num);
	else
		prop = mk_str(cx, nd->b->s, nd->b->n, false);
	if (!prop)
		return NULL;
	if (o->t == V_OBJECT || o->t == V_NS) {
		if (prop->t != V_STR)
			return fail(cx, "Cannot access property with non-string: got %s",
				    type_names[prop->t]);
		v = obj_get(o, prop->s, prop->n);
		if (!v && o->t == V_OBJECT)
			v = builtin(cx, o, prop);
	} else if (o->t == V_ARRAY || o->t == V_STR) {
		if (prop->t == V_INT) {
			double i = prop->num;

			if (o->t == V_STR)
				return str_at(cx, o, i);
			if (i < 0)
				i += (double)o->len;
			v = i >= 0 && i < (double)o->len ? o->items[(size_t)i] : NULL;
		} else if (prop->t == V_STR) {
			v = builtin(cx, o, prop);
		} else {
			return fail(cx, "Cannot access property with non-string/non-number: got %s",
				    type_names[prop->t]);
		}
	} else if (prop->t != V_STR) {
		return fail(cx, "Cannot access property with non-string: got %s",
			    type_names[prop->t]);
	}
	return cx->err ? NULL : v ? v : &undef_v;
}

/* The test named t[0..n) of v; arg is the second operand of equalto/eq
 * (selectattr's value), NULL for `is`. */
static bool test_named(struct cx *cx, const struct val *v, const char *t, size_t n,
		       const struct val *arg, bool *res)
{
#define T(x) (n == strlen(x) && !memcmp(t, x, n))
	if (T("boolean")) *res = v->t == V_BOOL;
	else if (T("callable")) *res = v->t == V_FUNC;
	else if (T("odd") || T("even")) {
		if (v->t != V_INT)
			return fail(cx, "cannot %.*s on %s", (int)n, t, type_names[v->t]);
		*res = (fmod(v->num, 2) != 0) == T("odd");
	} else if (T("false") || T("true")) *res = v->t == V_BOOL && v->b == T("true");
	else if (T("none")) *res = v->t == V_NULL;
	else if (T("string")) *res = v->t == V_STR;
	else if (T("number")) *res = is_num(v);
	else if (T("integer")) *res = v->t == V_INT;
	else if (T("iterable")) *res = (v->t == V_ARRAY && !v->b) || v->t == V_STR;
	else if (T("mapping")) *res = v->t == V_OBJECT;
	else if (T("sequence")) *res = v->t == V_ARRAY || v->t == V_OBJECT || v->t == V_STR;
	else if (T("lower") || T("upper")) {
		struct val *c;

		if (v->t != V_STR)
			return fail(cx, "test %.*s of a %s", (int)n, t, type_names[v->t]);
		if (!(c = str_case(cx, v, T("upper"))))
			return false;
		*res = c->n == v->n && !memcmp(c->s, v->s, v->n);
	} else if (T("defined")) *res = v->t != V_UNDEF;
	else if (T("equalto") || T("eq")) *res = arg ? strict_eq(v, arg) : v->t == V_UNDEF;
	else if (T("undefined")) *res = v->t == V_UNDEF;
	else
		return fail(cx, "Unknown test: %.*s", (int)n, t);
#undef T
	return true;
}

static bool run_test(struct cx *cx, const struct val *v, const struct jn_node *nd, bool *res)
{
	if (!test_named(cx, v, nd->s, nd->n, NULL, res))
		return false;
	if (nd->flag)
		*res = !*res;
	return true;
}

/* --- operators --------------------------------------------------------------- */

static struct val *concat(struct cx *cx, const struct val *a, const struct val *b)
{
	struct sb s = { .cx = cx };

	if (!js_string(cx, &s, a) || !js_string(cx, &s, b)) {
		free(s.p);
		return NULL;
	}
	return sb_val(&s);
}

static struct val *arith(struct cx *cx, enum jn_op op, const struct val *l, const struct val *r)
{
	double a = l->num, b = r->num;
	enum vt t = l->t == V_FLOAT || r->t == V_FLOAT ? V_FLOAT : V_INT;

	switch (op) {
	case JN_OP_ADD: return mk_num(cx, t, a + b);
	case JN_OP_SUB: return mk_num(cx, t, a - b);
	case JN_OP_MUL: return mk_num(cx, t, a * b);
	case JN_OP_DIV: return mk_num(cx, V_FLOAT, a / b);
	case JN_OP_FLOORDIV: return mk_num(cx, t, floor(a / b));
	case JN_OP_MOD: return mk_num(cx, t, fmod(a, b));
	case JN_OP_LT: return mk_bool(a < b);
	case JN_OP_GT: return mk_bool(a > b);
	case JN_OP_LE: return mk_bool(a <= b);
	case JN_OP_GE: return mk_bool(a >= b);
	default: return NULL;
	}
}

static const char *op_name(enum jn_op op)
{
	static const char *const names[] = {
		"", "and", "or", "not", "==", "!=", "<", ">", "<=", ">=", "in", "not in", "+",
		"-", "~", "*", "/", "//", "%", "**",
	};

	return names[op];
}

static struct val *binary_rest(struct cx *cx, enum jn_op op, const struct val *l,
			       const struct val *r)
{
	bool in = op == JN_OP_IN || op == JN_OP_NOTIN;

	if (l->t == V_UNDEF || r->t == V_UNDEF) {
		if (r->t == V_UNDEF && in)
			return mk_bool(op == JN_OP_NOTIN);
		if (op == JN_OP_CAT && l->t != V_NULL && r->t != V_NULL)
			return concat(cx, l->t == V_UNDEF ? mk_str(cx, "", 0, false) : l,
				      r->t == V_UNDEF ? mk_str(cx, "", 0, false) : r);
		return fail(cx, "Cannot perform operation %s on undefined values", op_name(op));
	}
	if (l->t == V_NULL || r->t == V_NULL)
		return fail(cx, "Cannot perform operation on null values");
	if (op == JN_OP_CAT)
		return concat(cx, l, r);
	if (op == JN_OP_POW && (is_num(l) || l->t == V_BOOL) && (is_num(r) || r->t == V_BOOL)) {
		double a = l->t == V_BOOL ? l->b : l->num, b = r->t == V_BOOL ? r->b : r->num;
		double x = pow(a, b);

		if (a == 0 && b < 0)
			return fail(cx, "0.0 cannot be raised to a negative power");
		if (!isfinite(x))
			return fail(cx, "Exponentiation result is not a finite real number");
		return mk_num(cx, l->t == V_FLOAT || r->t == V_FLOAT || b < 0 ? V_FLOAT : V_INT, x);
	}
	if (l->t == V_ARRAY && r->t == V_ARRAY && op == JN_OP_ADD) {
		struct val *out = mk_array(cx, l->len + r->len);

		if (out && l->len)
			memcpy(out->items, l->items, l->len * sizeof(*out->items));
		if (out && r->len)
			memcpy(out->items + l->len, r->items, r->len * sizeof(*out->items));
		return out;
	}
	if (r->t == V_ARRAY && in) {
		bool found = false;

		for (size_t i = 0; i < r->len && !found; i++)
			found = strict_eq(r->items[i], l);
		return mk_bool(found == (op == JN_OP_IN));
	}
	if ((l->t == V_STR || r->t == V_STR) && op == JN_OP_ADD)
		return concat(cx, l, r);
	if (l->t == V_STR && r->t == V_STR && in)
		return mk_bool((memmem(r->s, r->n, l->s, l->n) != NULL || !l->n) ==
			       (op == JN_OP_IN));
	if (l->t == V_STR && r->t == V_OBJECT && in)
		return mk_bool((obj_get(r, l->s, l->n) != NULL) == (op == JN_OP_IN));
	return fail(cx, "Unknown operator \"%s\" between %s and %s", op_name(op),
		    type_names[l->t], type_names[r->t]);
}

static struct val *binary(struct cx *cx, const struct jn_node *nd, struct scope *sc)
{
	struct val *l = eval(cx, nd->a, sc), *r;

	if (!l)
		return NULL;
	if (nd->op == JN_OP_AND)
		return truthy(l) ? eval(cx, nd->b, sc) : l;
	if (nd->op == JN_OP_OR)
		return truthy(l) ? l : eval(cx, nd->b, sc);
	if (!(r = eval(cx, nd->b, sc)))
		return NULL;
	if (nd->op == JN_OP_EQ || nd->op == JN_OP_NE) {
		bool eq = loose_eq(cx, l, r);

		return cx->err ? NULL : mk_bool(eq == (nd->op == JN_OP_EQ));
	}
	if (is_num(l) && is_num(r) && nd->op != JN_OP_CAT && nd->op != JN_OP_POW) {
		struct val *v = arith(cx, nd->op, l, r);

		return v || cx->err ? v :
		       fail(cx, "Unknown operator \"%s\" between %s and %s", op_name(nd->op),
			    type_names[l->t], type_names[r->t]);
	}
	return binary_rest(cx, nd->op, l, r);
}

static struct val *unary(struct cx *cx, const struct jn_node *nd, struct scope *sc)
{
	struct val *v = eval(cx, nd->a, sc);
	double x;

	if (!v)
		return NULL;
	if (nd->op == JN_OP_NOT)
		return mk_bool(!truthy(v));
	if (!is_num(v) && v->t != V_BOOL)
		return fail(cx, "Unknown operator \"%s\" for %s", op_name(nd->op),
			    type_names[v->t]);
	x = v->t == V_BOOL ? v->b : v->num;
	return mk_num(cx, v->t == V_FLOAT ? V_FLOAT : V_INT, nd->op == JN_OP_SUB ? -x : x);
}

/* --- filters ----------------------------------------------------------------- */

static struct val *join_items(struct cx *cx, const struct val *v, const struct val *sep)
{
	struct sb b = { .cx = cx };

	if (v->t == V_STR) { /* Array.from(string): code points */
		for (size_t i = 0; i < v->n; i += cp_len(v->s + i, v->n - i))
			if ((i && !sb_put(&b, sep->s, sep->n)) ||
			    !sb_put(&b, v->s + i, cp_len(v->s + i, v->n - i)))
				break;
		return sb_val(&b);
	}
	for (size_t i = 0; i < v->len; i++) {
		const struct val *x = v->items[i];

		if (i && !sb_put(&b, sep->s, sep->n))
			break;
		if (x->t != V_UNDEF && x->t != V_NULL && !js_string(cx, &b, x))
			break;
	}
	return sb_val(&b);
}

static struct val *indent(struct cx *cx, const struct val *s, const struct args *a)
{
	const struct val *w = a->n > 0 ? a->pos[0] : kwarg(a, "width");
	const struct val *first = a->n > 1 ? a->pos[1] : kwarg(a, "first");
	const struct val *blank = a->n > 2 ? a->pos[2] : kwarg(a, "blank");
	char pad[256];
	size_t pn;
	struct sb b = { .cx = cx };
	const char *p = s->s, *end = s->s + s->n;

	if (w && w->t != V_INT && w->t != V_STR)
		return fail(cx, "width must be an integer or a string");
	if (w && w->t == V_STR) {
		pn = ST_MIN(w->n, sizeof(pad));
		memcpy(pad, w->s, pn);
	} else {
		pn = (size_t)fmin(fmax(w ? w->num : 4, 0), sizeof(pad));
		memset(pad, ' ', pn);
	}
	for (bool line0 = true;; line0 = false) {
		const char *nl = memchr(p, '\n', (size_t)(end - p)), *e = nl ? nl : end;

		if (!((!(first && truthy(first)) && line0) || (!(blank && truthy(blank)) && e == p)))
			sb_put(&b, pad, pn);
		sb_put(&b, p, (size_t)(e - p));
		if (!nl)
			break;
		sb_put(&b, "\n", 1);
		p = nl + 1;
	}
	return sb_val(&b);
}

static struct val *filter_tojson(struct cx *cx, const struct val *v, const struct args *a)
{
	struct json_opts o = json_default;
	const struct val *ind = kwarg(a, "indent"), *asc = kwarg(a, "ensure_ascii");
	const struct val *sort = kwarg(a, "sort_keys"), *sep = kwarg(a, "separators");
	char item[64], key[64];

	if (ind && ind->t != V_INT && ind->t != V_NULL)
		return fail(cx, "If set, indent must be a number");
	if (asc && asc->t != V_BOOL)
		return fail(cx, "If set, ensure_ascii must be a boolean");
	if (sort && (sort->t != V_BOOL || sort->b))
		return fail(cx, "tojson(sort_keys=true) is not supported");
	o.indent = ind && ind->t == V_INT ? (int)fmin(fmax(ind->num, 0), 64) : 0;
	o.ascii = asc && asc->b;
	if (o.indent)
		o.item_sep = ",";
	if (sep && sep->t == V_ARRAY) {
		if (sep->len != 2 || sep->items[0]->t != V_STR || sep->items[1]->t != V_STR)
			return fail(cx, "separators must be a tuple of two strings");
		snprintf(item, sizeof(item), "%.*s", (int)sep->items[0]->n, sep->items[0]->s);
		snprintf(key, sizeof(key), "%.*s", (int)sep->items[1]->n, sep->items[1]->s);
		o.item_sep = item;
		o.key_sep = key;
	} else if (sep && sep->t != V_NULL) {
		return fail(cx, "If set, separators must be a tuple of two strings");
	}
	return json_val(cx, v, &o);
}

/* parseInt(s, 10) / parseFloat(s): the longest number at the start (after
 * whitespace); none gives dflt, or 0. */
static struct val *str_number(struct cx *cx, const struct val *v, bool integer,
			      struct val *dflt)
{
	const char *end = v->s + v->n, *p = ws_trim_start(v->s, end), *q = p;
	char buf[400];
	bool digits = false;

	q += q < end && (*q == '+' || *q == '-');
	if (!integer && (size_t)(end - q) >= 8 && !memcmp(q, "Infinity", 8))
		return mk_num(cx, V_FLOAT, *p == '-' ? -INFINITY : INFINITY);
	for (; q < end && *q >= '0' && *q <= '9'; q++)
		digits = true;
	if (!integer && q < end && *q == '.')
		for (q++; q < end && *q >= '0' && *q <= '9'; q++)
			digits = true;
	if (!integer && digits && q < end && (*q == 'e' || *q == 'E')) {
		const char *e = q + 1;

		e += e < end && (*e == '+' || *e == '-');
		if (e < end && *e >= '0' && *e <= '9') {
			for (q = e; q < end && *q >= '0' && *q <= '9'; q++)
				;
		}
	}
	if (!digits || (size_t)(q - p) >= sizeof(buf))
		return dflt ? dflt : mk_num(cx, integer ? V_INT : V_FLOAT, 0);
	memcpy(buf, p, (size_t)(q - p));
	buf[q - p] = 0;
	return mk_num(cx, integer ? V_INT : V_FLOAT, strtod(buf, NULL) + 0.0);
}

static struct val *filter_plain(struct cx *cx, struct val *v, const struct jn_node *f)
{
#define F(x) name_is(f, x)
	if (F("safe"))
		return v;
	if (F("tojson"))
		return json_val(cx, v, &json_default);
	switch (v->t) {
	case V_ARRAY:
		if (F("list"))
			return v;
		if (F("first") || F("last")) {
			if (!v->len)
				return fail(cx, "%.*s of an empty list", (int)f->n, f->s);
			return v->items[F("first") ? 0 : v->len - 1];
		}
		if (F("length"))
			return mk_num(cx, V_INT, (double)v->len);
		if (F("reverse")) {
			struct val *o = mk_array(cx, v->len);

			for (size_t i = 0; o && i < v->len; i++)
				o->items[i] = v->items[v->len - 1 - i];
			return o;
		}
		if (F("join"))
			return join_items(cx, v, mk_str(cx, "", 0, false));
		if (F("string"))
			return json_val(cx, v, &json_display);
		break;
	case V_STR:
		if (F("length"))
			return mk_num(cx, V_INT, (double)utf16_len(v->s, v->n));
		if (F("upper") || F("lower"))
			return str_case(cx, v, F("upper"));
		if (F("title") || F("capitalize") || F("trim")) {
			struct val fn = { .t = V_FUNC, .self = v };
			struct args none = { 0 };

			fn.fn = F("title") ? F_TITLE : F("capitalize") ? F_CAPITALIZE : F_STRIP;
			return str_method(cx, &fn, &none);
		}
		if (F("indent")) {
			struct args none = { 0 };

			return indent(cx, v, &none);
		}
		if (F("join") || F("string"))
			return v;
		if (F("int") || F("float"))
			return str_number(cx, v, F("int"), NULL);
		break;
	case V_INT:
	case V_FLOAT:
		if (F("abs"))
			return mk_num(cx, v->t, fabs(v->num));
		if (F("int"))
			return mk_num(cx, V_INT, trunc(v->num) + 0.0);
		if (F("float"))
			return mk_num(cx, V_FLOAT, v->num);
		if (F("string")) {
			struct sb b = { .cx = cx };

			display(cx, &b, v);
			return sb_val(&b);
		}
		break;
	case V_OBJECT:
		if (F("items"))
			return obj_pairs(cx, v, 0);
		if (F("length"))
			return mk_num(cx, V_INT, (double)v->nkv);
		if (F("keys") || F("values"))
			return obj_pairs(cx, v, F("keys") ? 1 : 2);
		break;
	case V_BOOL:
		if (F("bool"))
			return v;
		if (F("int") || F("float"))
			return mk_num(cx, F("int") ? V_INT : V_FLOAT, v->b);
		if (F("string"))
			return mk_str(cx, v->b ? "true" : "false", v->b ? 4 : 5, false);
		break;
	default:
		return fail(cx, "Cannot apply filter \"%.*s\" to type: %s", (int)f->n, f->s,
			    type_names[v->t]);
	}
	return fail(cx, "Unknown or unsupported %s filter: %.*s", type_names[v->t], (int)f->n,
		    f->s);
#undef F
}

/* item.a.b.0 (getAttributeValue): objects by key, lists by index. */
static struct val *attr_path(struct cx *cx, struct val *item, const struct val *path)
{
	const char *p = path->s, *end = path->s + path->n;

	for (;;) {
		const char *dot = memchr(p, '.', (size_t)(end - p)), *e = dot ? dot : end;

		if (item->t == V_OBJECT || item->t == V_NS) {
			item = obj_get(item, p, (size_t)(e - p));
		} else if (item->t == V_ARRAY) {
			char num[32];
			char *stop;
			long i;

			snprintf(num, sizeof(num), "%.*s", (int)ST_MIN((size_t)(e - p), 30), p);
			i = strtol(num, &stop, 10);
			item = stop != num && i >= 0 && (size_t)i < item->len ? item->items[i] : NULL;
		} else {
			item = NULL;
		}
		if (!item || !dot)
			return item ? item : (cx->err ? NULL : &undef_v);
		p = dot + 1;
	}
}

static struct val *select_attr(struct cx *cx, const struct val *v, const struct jn_node *call,
			       const struct args *a, bool select)
{
	const struct val *attr = a->n > 0 ? a->pos[0] : NULL, *test = a->n > 1 ? a->pos[1] : NULL;
	struct val *out = mk_array(cx, v->len);

	for (size_t i = 0; i < v->len; i++)
		if (v->items[i]->t != V_OBJECT && v->items[i]->t != V_NS)
			return fail(cx, "`%s` can only be applied to array of objects",
				    select ? "selectattr" : "rejectattr");
	for (size_t i = 0; i < call->len; i++)
		if (call->list[i]->kind != JN_STR)
			return fail(cx, "arguments of `%s` must be strings",
				    select ? "selectattr" : "rejectattr");
	if (!out || !attr)
		return out ? fail(cx, "selectattr needs an attribute") : NULL;
	out->len = 0;
	for (size_t i = 0; i < v->len; i++) {
		const struct val *x = obj_get(v->items[i], attr->s, attr->n);
		bool res = false;

		if (x && test && !test_named(cx, x, test->s, test->n, a->n > 2 ? a->pos[2] : &undef_v,
					     &res))
			return NULL;
		if (x && !test)
			res = truthy(x);
		if (res == select)
			out->items[out->len++] = v->items[i];
	}
	return out;
}

static struct val *map_attr(struct cx *cx, const struct val *v, const struct args *a)
{
	const struct val *attr = kwarg(a, "attribute");
	struct val *dflt = kwarg(a, "default"), *out;

	if (!attr)
		return fail(cx, "`map` expressions without `attribute` set are not currently "
			    "supported.");
	if (attr->t != V_STR)
		return fail(cx, "attribute must be a string");
	if (!(out = mk_array(cx, v->len)))
		return NULL;
	for (size_t i = 0; i < v->len; i++) {
		struct val *x;

		if (v->items[i]->t != V_OBJECT && v->items[i]->t != V_NS)
			return fail(cx, "items in map must be an object");
		if (!(x = attr_path(cx, v->items[i], attr)))
			return NULL;
		out->items[i] = x->t == V_UNDEF && dflt ? dflt : x;
	}
	return out;
}

static struct val *filter_call(struct cx *cx, struct val *v, const struct jn_node *call,
			       struct scope *sc)
{
	const struct jn_node *f = call->a;
	struct args a;

	if (f->kind != JN_IDENT)
		return fail(cx, "unknown filter");
	if (!eval_args(cx, call, sc, &a))
		return NULL;
#define F(x) name_is(f, x)
	if (F("tojson"))
		return filter_tojson(cx, v, &a);
	if (F("join")) {
		const struct val *sep = a.n ? a.pos[0] : kwarg(&a, "separator");

		if (v->t != V_STR && v->t != V_ARRAY)
			return fail(cx, "Cannot apply filter \"join\" to type: %s", type_names[v->t]);
		if (sep && sep->t != V_STR)
			return fail(cx, "separator must be a string");
		return join_items(cx, v, sep ? sep : mk_str(cx, "", 0, false));
	}
	if (F("default")) {
		struct val *d = a.n ? a.pos[0] : mk_str(cx, "", 0, false);
		const struct val *flag = a.n > 1 ? a.pos[1] : kwarg(&a, "boolean");

		if (flag && flag->t != V_BOOL)
			return fail(cx, "`default` filter flag must be a boolean");
		return v->t == V_UNDEF || (flag && flag->b && !truthy(v)) ? d : v;
	}
	if (F("int") || F("float")) {
		struct val *d = a.n ? a.pos[0] : kwarg(&a, "default");

		if (v->t == V_STR)
			return str_number(cx, v, F("int"), d);
		if (is_num(v) || v->t == V_BOOL) {
			double x = v->t == V_BOOL ? v->b : v->num;

			return mk_num(cx, F("int") ? V_INT : V_FLOAT, F("int") ? trunc(x) + 0.0 : x);
		}
		return fail(cx, "Cannot apply filter \"%.*s\" to type: %s", (int)f->n, f->s,
			    type_names[v->t]);
	}
	if (v->t == V_ARRAY && (F("selectattr") || F("rejectattr")))
		return select_attr(cx, v, call, &a, F("selectattr"));
	if (v->t == V_ARRAY && F("map"))
		return map_attr(cx, v, &a);
	if (v->t == V_STR && F("indent"))
		return indent(cx, v, &a);
	if (v->t == V_STR && F("replace"))
		return str_replace(cx, v, &a);
	if (v->t == V_OBJECT) {
		struct val *m = builtin(cx, v, mk_str(cx, f->s, f->n, false));

		if (m && m->t == V_FUNC)
			return call_fn(cx, m, &a);
	}
	return fail(cx, "Unknown or unsupported filter: %.*s(...) on %s", (int)f->n, f->s,
		    type_names[v->t]);
#undef F
}

static struct val *filter(struct cx *cx, const struct jn_node *nd, struct scope *sc)
{
	struct val *v = eval(cx, nd->a, sc);

	if (!v)
		return NULL;
	if (nd->b->kind == JN_CALL)
		return filter_call(cx, v, nd->b, sc);
	return filter_plain(cx, v, nd->b);
}

/* --- expressions ------------------------------------------------------------- */

static struct val *call(struct cx *cx, const struct jn_node *nd, struct scope *sc)
{
	struct args a;
	struct val *f;

	if (!eval_args(cx, nd, sc, &a) || !(f = eval(cx, nd->a, sc)))
		return NULL;
	if (f->t != V_FUNC)
		return fail(cx, "Cannot call something that is not a function: got %s",
			    type_names[f->t]);
	return call_fn(cx, f, &a);
}

static struct val *literal_list(struct cx *cx, const struct jn_node *nd, struct scope *sc)
{
	struct val *v = mk_array(cx, nd->len);

	for (size_t i = 0; v && i < nd->len; i++)
		if (!(v->items[i] = eval(cx, nd->list[i], sc)))
			return NULL;
	if (v)
		v->b = nd->kind == JN_TUPLE;
	return v;
}

static struct val *literal_object(struct cx *cx, const struct jn_node *nd, struct scope *sc)
{
	struct val *v = mk(cx, V_OBJECT);

	for (size_t i = 0; v && i < nd->len; i++) {
		struct val *k = eval(cx, nd->list[i], sc), *x;

		if (!k)
			return NULL;
		if (k->t != V_STR)
			return fail(cx, "Object keys must be strings: got %s", type_names[k->t]);
		if (!(x = eval(cx, nd->list2[i], sc)) || !obj_set(cx, v, k->s, k->n, x))
			return NULL;
	}
	return v;
}

static struct val *eval_kind(struct cx *cx, const struct jn_node *nd, struct scope *sc)
{
	struct val *c;

	switch (nd->kind) {
	case JN_IDENT: return lookup(sc, nd->s, nd->n);
	case JN_INT: return mk_num(cx, V_INT, nd->num);
	case JN_FLOAT: return mk_num(cx, V_FLOAT, nd->num);
	case JN_STR:
	case JN_TEXT: return mk_str(cx, nd->s, nd->n, false);
	case JN_BIN: return binary(cx, nd, sc);
	case JN_UNARY: return unary(cx, nd, sc);
	case JN_MEMBER: return member(cx, nd, sc);
	case JN_CALL: return call(cx, nd, sc);
	case JN_FILTER: return filter(cx, nd, sc);
	case JN_TEST: {
		struct val *v = eval(cx, nd->a, sc);
		bool res = false;

		return v && run_test(cx, v, nd, &res) ? mk_bool(res) : NULL;
	}
	case JN_TERNARY:
		if (!(c = eval(cx, nd->b, sc)))
			return NULL;
		return eval(cx, truthy(c) ? nd->a : nd->c, sc);
	case JN_SELECT:
		if (!(c = eval(cx, nd->b, sc)))
			return NULL;
		return truthy(c) ? eval(cx, nd->a, sc) : &undef_v;
	case JN_ARRAY:
	case JN_TUPLE: return literal_list(cx, nd, sc);
	case JN_OBJECT: return literal_object(cx, nd, sc);
	case JN_SLICE: return fail(cx, "a slice outside [ ]");
	case JN_KWARG: return fail(cx, "a keyword argument outside a call");
	default: return fail(cx, "a statement where an expression was expected");
	}
}

static struct val *eval(struct cx *cx, const struct jn_node *nd, struct scope *sc)
{
	struct val *v;

	if (cx->err)
		return NULL;
	if (!nd)
		return &undef_v;
	if (++cx->steps > JN_MAX_STEPS) {
		cx->err = -E2BIG;
		snprintf(cx->msg, sizeof(cx->msg), "the render takes more than 10^7 steps");
		return NULL;
	}
	if (++cx->depth > JN_MAX_EVAL_DEPTH) {
		cx->depth--;
		return fail(cx, "expressions nested deeper than %d", JN_MAX_EVAL_DEPTH);
	}
	v = eval_kind(cx, nd, sc);
	cx->depth--;
	return cx->err ? NULL : v;
}

/* --- statements -------------------------------------------------------------- */

static void assign(struct cx *cx, const struct jn_node *target, struct val *v, struct scope *sc)
{
	if (target->kind == JN_IDENT) {
		obj_set(cx, &sc->vars, target->s, target->n, v);
	} else if (target->kind == JN_TUPLE) {
		if (v->t != V_ARRAY) {
			fail(cx, "Cannot unpack non-iterable type in set: %s", type_names[v->t]);
			return;
		}
		if (v->len != target->len) {
			fail(cx, "Too %s items to unpack in set", target->len > v->len ? "few" : "many");
			return;
		}
		for (size_t i = 0; i < target->len && !cx->err; i++) {
			if (target->list[i]->kind != JN_IDENT) {
				fail(cx, "Cannot unpack to non-identifier in set");
				return;
			}
			obj_set(cx, &sc->vars, target->list[i]->s, target->list[i]->n, v->items[i]);
		}
	} else if (target->kind == JN_MEMBER) {
		struct val *o = eval(cx, target->a, sc);

		if (!o)
			return;
		if (o->t != V_NS)
			fail(cx, "cannot assign attribute on non-namespace object");
		else if (target->b->kind != JN_IDENT || target->flag)
			fail(cx, "Cannot assign to member with non-identifier property");
		else
			obj_set(cx, o, target->b->s, target->b->n, v);
	} else {
		fail(cx, "Invalid LHS inside assignment expression");
	}
}

static void exec_set(struct cx *cx, const struct jn_node *nd, struct scope *sc)
{
	struct val *v;

	if (nd->b) {
		v = eval(cx, nd->b, sc);
	} else {
		size_t mark = cx->n;

		render_block(cx, nd->list, nd->len, sc);
		v = cx->err ? NULL : mk_str(cx, cx->out ? cx->out + mark : "", cx->n - mark, true);
		cx->n = mark;
	}
	if (v)
		assign(cx, nd->a, v, sc);
}

static struct val *loop_object(struct cx *cx, size_t i, size_t n, struct val *const *items)
{
	struct val *o = mk(cx, V_OBJECT);
	const struct { const char *k; double x; } ints[] = {
		{ "index", (double)i + 1 }, { "index0", (double)i }, { "revindex", (double)(n - i) },
		{ "revindex0", (double)(n - i - 1) },
	};

	for (size_t k = 0; o && k < ST_ARRAY_LEN(ints); k++) {
		struct val *x = mk_num(cx, V_INT, ints[k].x);

		if (!x || !obj_set(cx, o, ints[k].k, strlen(ints[k].k), x))
			return NULL;
	}
	if (!o || !obj_set(cx, o, "first", 5, mk_bool(i == 0)) ||
	    !obj_set(cx, o, "last", 4, mk_bool(i == n - 1)) ||
	    !obj_set(cx, o, "length", 6, mk_num(cx, V_INT, (double)n)) ||
	    !obj_set(cx, o, "previtem", 8, i > 0 ? items[i - 1] : &undef_v) ||
	    !obj_set(cx, o, "nextitem", 8, i + 1 < n ? items[i + 1] : &undef_v))
		return NULL;
	return o;
}

static bool bind_loop(struct cx *cx, const struct jn_node *var, struct val *item,
		      struct scope *sc)
{
	if (var->kind == JN_IDENT)
		return obj_set(cx, &sc->vars, var->s, var->n, item);
	for (size_t j = 0; j < var->len; j++) {
		if (var->list[j]->kind != JN_IDENT)
			return fail(cx, "Cannot unpack non-identifier type");
		if (!obj_set(cx, &sc->vars, var->list[j]->s, var->list[j]->n,
			     j < item->len ? item->items[j] : &undef_v))
			return false;
	}
	return true;
}

/* The items a for loop runs over: checked, and those its `if` selects. */
static struct val *loop_items(struct cx *cx, const struct jn_node *nd, struct scope *sc)
{
	const struct jn_node *iter = nd->b, *test = NULL;
	struct val *it, *out;

	if (iter->kind == JN_SELECT) {
		test = iter->b;
		iter = iter->a;
	}
	if (!(it = eval(cx, iter, sc)))
		return NULL;
	if (it->t != V_ARRAY && it->t != V_OBJECT)
		return fail(cx, "Expected iterable or object type in for loop: got %s",
			    type_names[it->t]);
	if (it->t == V_OBJECT && !(it = obj_pairs(cx, it, 1)))
		return NULL;
	if (!(out = mk_array(cx, it->len)))
		return NULL;
	out->len = 0;
	for (size_t i = 0; i < it->len; i++) {
		struct val *cur = it->items[i];

		if (nd->a->kind == JN_TUPLE) {
			if (cur->t != V_ARRAY || cur->b)
				return fail(cx, "Cannot unpack non-iterable type: %s",
					    type_names[cur->t]);
			if (cur->len != nd->a->len)
				return fail(cx, "Too %s items to unpack",
					    nd->a->len > cur->len ? "few" : "many");
		}
		if (test) {
			struct scope *ls = scope_new(cx, sc);
			struct val *ok;

			if (!ls || !bind_loop(cx, nd->a, cur, ls) || !(ok = eval(cx, test, ls)))
				return NULL;
			if (!truthy(ok))
				continue;
		}
		out->items[out->len++] = cur;
	}
	return out;
}

static void render_for(struct cx *cx, const struct jn_node *nd, struct scope *parent)
{
	struct scope *sc = scope_new(cx, parent);
	struct val *items = sc ? loop_items(cx, nd, sc) : NULL;
	bool none = true;

	for (size_t i = 0; items && i < items->len && !cx->err; i++) {
		size_t mark = cx->n;
		struct val *loop = loop_object(cx, i, items->len, items->items);

		if (!loop || !obj_set(cx, &sc->vars, "loop", 4, loop) ||
		    !bind_loop(cx, nd->a, items->items[i], sc))
			return;
		render_block(cx, nd->list, nd->len, sc);
		if (cx->ctl) { /* the iteration's text goes, as a thrown break drops it */
			int ctl = cx->ctl;

			cx->n = mark;
			cx->ctl = 0;
			if (ctl == 1)
				break;
			continue;
		}
		none = false;
	}
	if (items && none && !cx->err)
		render_block(cx, nd->list2, nd->len2, sc);
}

static void render_block(struct cx *cx, struct jn_node *const *list, size_t len,
			 struct scope *sc)
{
	for (size_t i = 0; i < len && !cx->err && !cx->ctl; i++) {
		const struct jn_node *nd = list[i];
		struct val *v;

		switch (nd->kind) {
		case JN_TEXT:
			out_put(cx, nd->s, nd->n);
			break;
		case JN_IF:
			if ((v = eval(cx, nd->a, sc)))
				render_block(cx, truthy(v) ? nd->list : nd->list2,
					     truthy(v) ? nd->len : nd->len2, sc);
			break;
		case JN_FOR:
			if (++cx->depth > JN_MAX_EVAL_DEPTH)
				fail(cx, "blocks nested deeper than %d", JN_MAX_EVAL_DEPTH);
			else
				render_for(cx, nd, sc);
			cx->depth--;
			break;
		case JN_SET:
			exec_set(cx, nd, sc);
			break;
		case JN_COMMENT:
			break;
		case JN_MACRO:
			if ((v = mk_fn(cx, F_MACRO, NULL))) {
				v->macro = nd;
				v->env = sc;
				obj_set(cx, &sc->vars, nd->s, nd->n, v);
			}
			break;
		case JN_BREAK:
		case JN_CONTINUE:
			cx->ctl = nd->kind == JN_BREAK ? 1 : 2;
			break;
		default:
			if ((v = eval(cx, nd, sc)) && v->t != V_NULL && v->t != V_UNDEF) {
				struct sb b = { .cx = cx, .p = cx->out, .n = cx->n, .cap = cx->cap };

				display(cx, &b, v);
				cx->out = b.p;
				cx->n = b.n;
				cx->cap = b.cap;
			}
		}
	}
}

/* --- JSON in, render out ------------------------------------------------------ */

/* An array index key ("0", "17"): JavaScript lists those first, ascending. */
static bool index_key(const char *k, double *x)
{
	size_t n = strlen(k);

	if (!n || n > 10 || (n > 1 && k[0] == '0'))
		return false;
	for (size_t i = 0; i < n; i++)
		if (k[i] < '0' || k[i] > '9')
			return false;
	*x = strtod(k, NULL);
	return *x < 4294967295.0;
}

static struct val *from_json(struct cx *cx, struct json_object *j, int depth)
{
	if (depth > 64)
		return fail(cx, "the JSON nests deeper than 64");
	switch (json_object_get_type(j)) {
	case json_type_null: return &null_v;
	case json_type_boolean: return mk_bool(json_object_get_boolean(j));
	case json_type_int: return mk_num(cx, V_INT, (double)json_object_get_int64(j));
	case json_type_double: {
		double x = json_object_get_double(j);

		return mk_num(cx, isfinite(x) && x == floor(x) ? V_INT : V_FLOAT, x);
	}
	case json_type_string:
		return mk_str(cx, json_object_get_string(j), (size_t)json_object_get_string_len(j),
			      false);
	case json_type_array: {
		size_t n = json_object_array_length(j);
		struct val *v = mk_array(cx, n);

		for (size_t i = 0; v && i < n; i++)
			if (!(v->items[i] = from_json(cx, json_object_array_get_idx(j, i), depth + 1)))
				return NULL;
		return v;
	}
	default: {
		struct val *v = mk(cx, V_OBJECT);

		for (int pass = 0; v && pass < 2; pass++) {
			for (;;) { /* indices first (ascending), then the rest in order */
				const char *best = NULL;
				double bx = 0, x = 0;

				json_object_object_foreach(j, k, sub) {
					(void)sub;
					if (obj_get(v, k, strlen(k)) || index_key(k, &x) != (pass == 0))
						continue;
					if (pass == 1) {
						best = k;
						break;
					}
					if (!best || x < bx) {
						best = k;
						bx = x;
					}
				}
				if (!best)
					break;
				{
					struct val *x2 = from_json(cx, json_object_object_get(j, best),
								   depth + 1);

					if (!x2 || !obj_set(cx, v, best, strlen(best), x2))
						return NULL;
				}
			}
		}
		return v;
	}
	}
}

static bool set_globals(struct cx *cx, struct scope *g, struct json_object *vars)
{
	static const struct { const char *k; enum fn fn; } fns[] = {
		{ "namespace", F_NAMESPACE }, { "raise_exception", F_RAISE }, { "range", F_RANGE },
		{ "strftime_now", F_STRFTIME },
	};
	static const struct { const char *k; struct val *v; } consts[] = {
		{ "false", &false_v }, { "true", &true_v }, { "none", &null_v },
		{ "True", &true_v }, { "False", &false_v }, { "None", &null_v },
	};

	for (size_t i = 0; i < ST_ARRAY_LEN(fns); i++)
		if (!obj_set(cx, &g->vars, fns[i].k, strlen(fns[i].k), mk_fn(cx, fns[i].fn, NULL)))
			return false;
	for (size_t i = 0; i < ST_ARRAY_LEN(consts); i++)
		if (!obj_set(cx, &g->vars, consts[i].k, strlen(consts[i].k), consts[i].v))
			return false;
	if (!vars)
		return true;
	if (!json_object_is_type(vars, json_type_object))
		return fail(cx, "the variables are not a JSON object");
	json_object_object_foreach(vars, k, v) {
		struct val *x;

		if (obj_get(&g->vars, k, strlen(k)))
			return fail(cx, "Variable already declared: %s", k);
		if (!(x = from_json(cx, v, 0)) || !obj_set(cx, &g->vars, k, strlen(k), x))
			return false;
	}
	return true;
}

int st_jinja_render(const struct st_jinja *t, struct json_object *vars, char **out, size_t *n)
{
	struct cx cx = { .a = { .cap_bytes = JN_MAX_VALUE_BYTES } };
	struct scope *g = scope_new(&cx, NULL);

	*out = NULL;
	*n = 0;
	if (g && set_globals(&cx, g, vars))
		render_block(&cx, t->body, t->len, g);
	if (!cx.err && cx.ctl)
		fail(&cx, "break or continue outside a loop");
	if (!cx.err && !cx.out)
		out_put(&cx, "", 0);
	jn_arena_fini(&cx.a);
	if (cx.err) {
		free(cx.out);
		return st_error_set(cx.err, "template: %s", cx.msg);
	}
	*out = cx.out;
	*n = cx.n;
	return 0;
}

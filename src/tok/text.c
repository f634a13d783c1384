/* Text for the tokenizer: buffers, UTF-8 as the WHATWG decoder reads it,
 * GPT-2's byte alphabet, patterns through PCRE2 and Unicode forms through
 * ICU. */
#include "tok_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

/* --- buffers --------------------------------------------------------------- */

int tok_buf_reserve(struct tok_buf *b, size_t extra)
{
	size_t cap;
	char *p;

	if (b->n + extra + 1 <= b->cap)
		return 0;
	cap = b->cap ? b->cap : 256;
	while (cap < b->n + extra + 1)
		cap *= 2;
	p = realloc(b->p, cap);
	if (!p)
		return st_error_set(-ENOMEM, "tokenizer: out of memory (%zu bytes)", cap);
	b->p = p;
	b->cap = cap;
	return 0;
}

int tok_buf_put(struct tok_buf *b, const void *s, size_t n)
{
	int ret = tok_buf_reserve(b, n);

	if (ret)
		return ret;
	if (n)
		memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = 0;
	return 0;
}

void tok_buf_fini(struct tok_buf *b)
{
	free(b->p);
	*b = (struct tok_buf){ 0 };
}

int tok_spans_push(struct tok_spans *s, size_t off, size_t len)
{
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 64;
		struct tok_span *v = realloc(s->v, cap * sizeof(*v));

		if (!v)
			return st_error_set(-ENOMEM, "tokenizer: out of memory");
		s->v = v;
		s->cap = cap;
	}
	s->v[s->n++] = (struct tok_span){ off, len };
	return 0;
}

void tok_spans_fini(struct tok_spans *s)
{
	free(s->v);
	*s = (struct tok_spans){ 0 };
}

int tok_ids_push(struct st_tok_ids *v, uint32_t id)
{
	if (v->n == v->cap) {
		size_t cap = v->cap ? v->cap * 2 : 256;
		uint32_t *p = realloc(v->ids, cap * sizeof(*p));

		if (!p)
			return st_error_set(-ENOMEM, "tokenizer: out of memory");
		v->ids = p;
		v->cap = cap;
	}
	v->ids[v->n++] = id;
	return 0;
}

void st_tok_ids_fini(struct st_tok_ids *v)
{
	if (!v)
		return;
	free(v->ids);
	*v = (struct st_tok_ids){ 0 };
}

/* --- UTF-8 ----------------------------------------------------------------- */

/* Length of the valid sequence at s (1..4), or 0 when it is not one; *sub
 * is then the length of its maximal subpart (what one U+FFFD replaces). */
static size_t utf8_seq(const uint8_t *s, size_t n, size_t *sub)
{
	uint8_t c = s[0], lo = 0x80, hi = 0xbf;
	size_t need, i;

	*sub = 1;
	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		need = 1;
	else if (c >= 0xe0 && c <= 0xef) {
		need = 2;
		if (c == 0xe0)
			lo = 0xa0;
		else if (c == 0xed)
			hi = 0x9f;
	} else if (c >= 0xf0 && c <= 0xf4) {
		need = 3;
		if (c == 0xf0)
			lo = 0x90;
		else if (c == 0xf4)
			hi = 0x8f;
	} else
		return 0;
	for (i = 1; i <= need; i++) {
		if (i >= n || s[i] < lo || s[i] > hi) {
			*sub = i;
			return 0;
		}
		lo = 0x80;
		hi = 0xbf;
	}
	return need + 1;
}

bool tok_utf8_valid(const char *s, size_t n)
{
	const uint8_t *p = (const uint8_t *)s;
	size_t i = 0, sub, k;

	while (i < n) {
		if (p[i] < 0x80) {
			i++;
			continue;
		}
		k = utf8_seq(p + i, n - i, &sub);
		if (!k)
			return false;
		i += k;
	}
	return true;
}

int tok_utf8_sanitize(struct tok_buf *dst, const char *src, size_t n)
{
	const uint8_t *p = (const uint8_t *)src;
	size_t i = 0, run = 0, sub, k;
	int ret;

	dst->n = 0;
	if ((ret = tok_buf_reserve(dst, n)))
		return ret;
	while (i < n) {
		k = p[i] < 0x80 ? 1 : utf8_seq(p + i, n - i, &sub);
		if (k) {
			i += k;
			continue;
		}
		if ((ret = tok_buf_put(dst, src + run, i - run)) ||
		    (ret = tok_buf_put(dst, "\xef\xbf\xbd", 3)))
			return ret;
		i += sub;
		run = i;
	}
	return tok_buf_put(dst, src + run, n - run);
}

uint32_t tok_utf8_get(const char *s, size_t n, size_t *len)
{
	const uint8_t *p = (const uint8_t *)s;
	size_t need = p[0] < 0x80 ? 1 : p[0] < 0xe0 ? 2 : p[0] < 0xf0 ? 3 : 4;

	/* a sequence cut short (only in text that was not sanitised, such as
	 * a vocabulary string): one byte */
	if (need > n)
		need = 1;
	*len = need;
	switch (need) {
	case 1: return p[0];
	case 2: return (uint32_t)(p[0] & 0x1f) << 6 | (p[1] & 0x3f);
	case 3:
		return (uint32_t)(p[0] & 0x0f) << 12 | (uint32_t)(p[1] & 0x3f) << 6 |
		       (p[2] & 0x3f);
	default:
		return (uint32_t)(p[0] & 0x07) << 18 | (uint32_t)(p[1] & 0x3f) << 12 |
		       (uint32_t)(p[2] & 0x3f) << 6 | (p[3] & 0x3f);
	}
}

const char *tok_printable(const char *s, size_t n, char *buf, size_t cap)
{
	size_t k = 0;

	for (size_t i = 0; i < n && k + 1 < cap; i++)
		buf[k++] = (unsigned char)s[i] < 0x20 ? '?' : s[i];
	buf[k] = 0;
	return buf;
}

size_t tok_utf8_put(uint32_t cp, char *out)
{
	uint8_t *o = (uint8_t *)out;

	if (cp < 0x80) {
		o[0] = (uint8_t)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (uint8_t)(0xc0 | cp >> 6);
		o[1] = (uint8_t)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		o[0] = (uint8_t)(0xe0 | cp >> 12);
		o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
		o[2] = (uint8_t)(0x80 | (cp & 0x3f));
		return 3;
	}
	o[0] = (uint8_t)(0xf0 | cp >> 18);
	o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
	o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
	o[3] = (uint8_t)(0x80 | (cp & 0x3f));
	return 4;
}

size_t st_utf8_complete(const char *text, size_t bytes)
{
	const uint8_t *p = (const uint8_t *)text;
	size_t i = bytes, back = 0;

	/* step back over at most 3 continuation bytes to a lead byte */
	while (i > 0 && back < 4 && (p[i - 1] & 0xc0) == 0x80) {
		i--;
		back++;
	}
	if (i == 0)
		return bytes;
	{
		uint8_t c = p[i - 1];
		size_t need = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;

		if (c >= 0xc0 && back + 1 < need)
			return i - 1;
	}
	return bytes;
}

bool tok_is_space(uint32_t cp)
{
	return u_hasBinaryProperty((UChar32)cp, UCHAR_WHITE_SPACE);
}

/* --- GPT-2's byte alphabet ---------------------------------------------------- */

/* Printable Latin-1 bytes stand for themselves; the others (controls,
 * space, DEL, NBSP, soft hyphen) are given 256, 257, ... in byte order, so
 * no byte is whitespace or a control in the vocabulary. */
static bool byte_printable(unsigned b)
{
	return (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
}

uint32_t tok_byte_char(uint8_t b)
{
	unsigned n = 0;

	if (byte_printable(b))
		return b;
	for (unsigned i = 0; i < b; i++)
		n += !byte_printable(i);
	return 256 + n;
}

int tok_char_byte(uint32_t cp)
{
	static int16_t back[324];
	static bool ready;

	if (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE)) {
		int16_t tmp[324];

		for (unsigned i = 0; i < 324; i++)
			tmp[i] = -1;
		for (unsigned b = 0; b < 256; b++)
			tmp[tok_byte_char((uint8_t)b)] = (int16_t)b;
		memcpy(back, tmp, sizeof(back));
		__atomic_store_n(&ready, true, __ATOMIC_RELEASE);
	}
	return cp < 324 ? back[cp] : -1;
}

/* --- patterns (PCRE2) ----------------------------------------------------------- */

int tok_re_compile(struct tok_re *re, const char *pattern, size_t len,
		   bool literal, const char *what)
{
	int err;
	PCRE2_SIZE at;
	uint32_t opt = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);

	re->code = pcre2_compile((PCRE2_SPTR)pattern, len, opt, &err, &at, NULL);
	if (!re->code) {
		PCRE2_UCHAR msg[256];

		pcre2_get_error_message(err, msg, sizeof(msg));
		return st_error_set(-EINVAL, "%s: the pattern does not compile at "
				    "offset %zu: %s", what, (size_t)at, (char *)msg);
	}
	/* JIT is a speed-up, not a need: without it pcre2_match interprets */
	(void)pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE);
	re->md = pcre2_match_data_create_from_pattern(re->code, NULL);
	if (!re->md) {
		pcre2_code_free(re->code);
		re->code = NULL;
		return st_error_set(-ENOMEM, "%s: out of memory", what);
	}
	return 0;
}

void tok_re_fini(struct tok_re *re)
{
	if (re->md)
		pcre2_match_data_free(re->md);
	if (re->code)
		pcre2_code_free(re->code);
	re->md = NULL;
	re->code = NULL;
}

int tok_re_next(struct tok_re *re, const char *s, size_t n, size_t start,
		size_t *mb, size_t *me)
{
	/* the text is valid UTF-8 (sanitised on the way in) */
	int rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK | PCRE2_NOTEMPTY,
			     re->md, NULL);
	PCRE2_SIZE *ov;

	if (rc == PCRE2_ERROR_NOMATCH)
		return 0;
	if (rc < 0) {
		PCRE2_UCHAR msg[256];

		pcre2_get_error_message(rc, msg, sizeof(msg));
		return st_error_set(-EINVAL, "tokenizer: pattern match failed: %s",
				    (char *)msg);
	}
	ov = pcre2_get_ovector_pointer(re->md);
	*mb = ov[0];
	*me = ov[1];
	return 1;
}

/* --- Unicode forms (ICU) -------------------------------------------------------- */

static bool all_ascii(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] >= 0x80)
			return false;
	return true;
}

int tok_unicode_apply(enum tok_uform form, struct tok_buf *dst,
		      const char *src, size_t n)
{
	UErrorCode st = U_ZERO_ERROR;
	const UNormalizer2 *nz = NULL;
	UChar *u = NULL, *v = NULL;
	int32_t ulen = 0, vlen, olen = 0;
	int ret = 0;

	dst->n = 0;
	if (n > INT32_MAX / 4)
		return st_error_set(-EINVAL, "tokenizer: a section of %zu bytes is "
				    "too long to normalise", n);
	if (all_ascii(src, n) && form != TOK_LOWER)
		return tok_buf_put(dst, src, n); /* every form of ASCII is itself */
	switch (form) {
	case TOK_NFC: nz = unorm2_getNFCInstance(&st); break;
	case TOK_NFD: nz = unorm2_getNFDInstance(&st); break;
	case TOK_NFKC: nz = unorm2_getNFKCInstance(&st); break;
	case TOK_NFKD: nz = unorm2_getNFKDInstance(&st); break;
	case TOK_LOWER: break;
	}
	if (U_FAILURE(st))
		return st_error_set(-EINVAL, "tokenizer: ICU: %s", u_errorName(st));
	u = malloc(sizeof(UChar) * (n + 1));
	if (!u)
		return st_error_set(-ENOMEM, "tokenizer: out of memory");
	u_strFromUTF8(u, (int32_t)n + 1, &ulen, src, (int32_t)n, &st);
	if (U_FAILURE(st)) {
		ret = st_error_set(-EINVAL, "tokenizer: ICU: %s", u_errorName(st));
		goto out;
	}
	if (nz && unorm2_quickCheck(nz, u, ulen, &st) == UNORM_YES && U_SUCCESS(st)) {
		ret = tok_buf_put(dst, src, n);
		goto out;
	}
	st = U_ZERO_ERROR;
	/* a form or the lower case can grow the text: room for 4x, then retry
	 * at the size ICU asks for */
	vlen = ulen * 4 + 16;
	for (int pass = 0; pass < 2; pass++) {
		free(v);
		v = malloc(sizeof(UChar) * (size_t)vlen);
		if (!v) {
			ret = st_error_set(-ENOMEM, "tokenizer: out of memory");
			goto out;
		}
		st = U_ZERO_ERROR;
		if (nz)
			olen = unorm2_normalize(nz, u, ulen, v, vlen, &st);
		else
			olen = u_strToLower(v, vlen, u, ulen, "", &st);
		if (st != U_BUFFER_OVERFLOW_ERROR)
			break;
		vlen = olen + 1;
	}
	if (U_FAILURE(st)) {
		ret = st_error_set(-EINVAL, "tokenizer: ICU: %s", u_errorName(st));
		goto out;
	}
	if ((ret = tok_buf_reserve(dst, (size_t)olen * 3 + 1)))
		goto out;
	{
		int32_t got = 0;

		st = U_ZERO_ERROR;
		u_strToUTF8(dst->p, (int32_t)(dst->cap - 1), &got, v, olen, &st);
		if (U_FAILURE(st)) {
			ret = st_error_set(-EINVAL, "tokenizer: ICU: %s", u_errorName(st));
			goto out;
		}
		dst->n = (size_t)got;
		dst->p[dst->n] = 0;
	}
out:
	free(u);
	free(v);
	return ret;
}

/* strata: the Jinja template's lexer and parser (strata/jinja.h), written
 * to read a template as @huggingface/jinja reads it: the same
 * preprocessing (trim_blocks, lstrip_blocks, the `generation` tag dropped),
 * the same tokens and the same precedence:
 *   if-else < or < and < not < comparison and `in` < + - ~ < * / // %
 *   < ** < `is` test < `|` filter < unary sign < call, member < primary. */
#include "jinja_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- arena ---------------------------------------------------------------- */

struct jn_chunk {
	struct jn_chunk *next;
	size_t used, size;
	_Alignas(16) unsigned char data[];
};

void *jn_arena_alloc(struct jn_arena *a, size_t bytes)
{
	struct jn_chunk *c = a->head;

	bytes = (bytes + 15) & ~(size_t)15;
	if (!c || c->size - c->used < bytes) {
		size_t size = bytes > 65536 ? bytes : 65536;

		if (a->cap_bytes && a->used_bytes + size > a->cap_bytes)
			return NULL;
		if (!(c = malloc(sizeof(*c) + size)))
			return NULL;
		c->next = a->head;
		c->used = 0;
		c->size = size;
		a->head = c;
		a->used_bytes += size;
	}
	c->used += bytes;
	return memset(c->data + c->used - bytes, 0, bytes);
}

void jn_arena_fini(struct jn_arena *a)
{
	while (a->head) {
		struct jn_chunk *next = a->head->next;

		free(a->head);
		a->head = next;
	}
	a->used_bytes = 0;
}

/* --- whitespace as JavaScript's \s ---------------------------------------- */

static uint32_t utf8_at(const unsigned char *p, const unsigned char *end, size_t *len)
{
	if (p[0] < 0x80 || end - p < 2) {
		*len = 1;
		return p[0];
	}
	if ((p[0] & 0xe0) == 0xc0) {
		*len = 2;
		return ((uint32_t)(p[0] & 0x1f) << 6) | (p[1] & 0x3f);
	}
	if ((p[0] & 0xf0) == 0xe0 && end - p >= 3) {
		*len = 3;
		return ((uint32_t)(p[0] & 0x0f) << 12) | ((uint32_t)(p[1] & 0x3f) << 6) |
		       (p[2] & 0x3f);
	}
	*len = 1;
	return 0xfffd;
}

static bool is_ws_cp(uint32_t c)
{
	if (c <= 32)
		return c == 32 || (c >= 9 && c <= 13);
	return c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 ||
	       c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000 || c == 0xfeff;
}

size_t jn_ws_len(const char *p, const char *end)
{
	size_t len;

	if (p >= end)
		return 0;
	return is_ws_cp(utf8_at((const unsigned char *)p, (const unsigned char *)end, &len)) ?
		       len : 0;
}

size_t jn_ws_len_back(const char *start, const char *p)
{
	for (size_t k = 1; k <= 3 && (size_t)(p - start) >= k; k++) {
		const unsigned char *q = (const unsigned char *)p - k;

		if ((q[0] & 0xc0) == 0x80) /* a continuation byte: further back */
			continue;
		return jn_ws_len((const char *)q, p) == k ? k : 0;
	}
	return 0;
}

/* --- preprocessing ---------------------------------------------------------- */

struct buf {
	char *p;
	size_t n, cap;
};

static int buf_put(struct buf *b, const char *s, size_t n)
{
	if (b->n + n + 1 > b->cap) {
		size_t cap = (b->n + n + 1) * 2;
		char *p = realloc(b->p, cap);

		if (!p)
			return -ENOMEM;
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = 0;
	return 0;
}

static bool line_start(const char *s, size_t i)
{
	const unsigned char *u = (const unsigned char *)s;

	if (i == 0 || s[i - 1] == '\n' || s[i - 1] == '\r')
		return true;
	return i >= 3 && u[i - 3] == 0xe2 && u[i - 2] == 0x80 &&
	       (u[i - 1] == 0xa8 || u[i - 1] == 0xa9);
}

/* ^[ \t]*({[#%-]) with the m flag: spaces before a block tag go. */
static int lstrip_blocks(const char *s, size_t n, struct buf *out)
{
	for (size_t i = 0; i < n;) {
		if (line_start(s, i)) {
			size_t j = i;

			while (j < n && (s[j] == ' ' || s[j] == '\t'))
				j++;
			if (j + 1 < n && s[j] == '{' && strchr("#%-", s[j + 1]) && s[j + 1]) {
				i = j;
			} else if (j > i) {
				if (buf_put(out, s + i, j - i))
					return -ENOMEM;
				i = j;
				continue;
			}
		}
		if (buf_put(out, s + i, 1))
			return -ENOMEM;
		i++;
	}
	return 0;
}

/* ([#%-]})\n: the newline after a block tag goes. */
static int trim_blocks(const char *s, size_t n, struct buf *out)
{
	for (size_t i = 0; i < n;) {
		if (i + 2 < n && strchr("#%-", s[i]) && s[i] && s[i + 1] == '}' &&
		    s[i + 2] == '\n') {
			if (buf_put(out, s + i, 2))
				return -ENOMEM;
			i += 3;
			continue;
		}
		if (buf_put(out, s + i, 1))
			return -ENOMEM;
		i++;
	}
	return 0;
}

static size_t skip_ws(const char *s, size_t i, size_t n)
{
	size_t k;

	while ((k = jn_ws_len(s + i, s + n)))
		i += k;
	return i;
}

/* {%(-?)\s*(?:end)?generation\s*(-?)%}(\s*) at i: its length, the flags. */
static size_t generation_tag(const char *s, size_t i, size_t n, bool *lstrip, bool *rstrip,
			     size_t *after)
{
	size_t j = i + 2;

	if (j > n || s[i] != '{' || s[i + 1] != '%')
		return 0;
	*lstrip = j < n && s[j] == '-';
	j = skip_ws(s, j + *lstrip, n);
	if (n - j >= 3 && !memcmp(s + j, "end", 3))
		j += 3;
	if (n - j < 10 || memcmp(s + j, "generation", 10))
		return 0;
	j = skip_ws(s, j + 10, n);
	*rstrip = j < n && s[j] == '-';
	j += *rstrip;
	if (n - j < 2 || s[j] != '%' || s[j + 1] != '}')
		return 0;
	j += 2;
	*after = skip_ws(s, j, n) - j;
	return j + *after - i;
}

static int drop_generation(const char *s, size_t n, struct buf *out)
{
	size_t last = 0;

	for (size_t i = 0; i + 1 < n; i++) {
		bool ls, rs;
		size_t after, len = generation_tag(s, i, n, &ls, &rs, &after), end = i;

		if (!len)
			continue;
		while (ls && end > last && jn_ws_len_back(s + last, s + end))
			end -= jn_ws_len_back(s + last, s + end);
		if (buf_put(out, s + last, end - last) ||
		    (!rs && buf_put(out, s + i + len - after, after)))
			return -ENOMEM;
		last = i + len;
		i = last - 1;
	}
	return buf_put(out, s + last, n - last);
}

static int preprocess(const char *src, size_t n, struct buf *out)
{
	struct buf a = { 0 }, b = { 0 };
	int ret;

	if (n && src[n - 1] == '\n')
		n--;
	ret = lstrip_blocks(src, n, &a);
	if (!ret)
		ret = trim_blocks(a.p ? a.p : "", a.n, &b);
	if (!ret)
		ret = drop_generation(b.p ? b.p : "", b.n, out);
	if (!ret && !out->p)
		ret = buf_put(out, "", 0);
	free(a.p);
	free(b.p);
	return ret;
}

/* --- lexer ------------------------------------------------------------------- */

enum tok_type {
	T_TEXT, T_NUM, T_STR, T_IDENT, T_EQUALS, T_LPAREN, T_RPAREN, T_OPEN_STMT,
	T_CLOSE_STMT, T_OPEN_EXPR, T_CLOSE_EXPR, T_LBRACKET, T_RBRACKET, T_LBRACE,
	T_RBRACE, T_COMMA, T_DOT, T_COLON, T_PIPE, T_ADD, T_MUL, T_POW, T_CMP, T_UNARY,
	T_COMMENT, T_NONE,
};

struct tok {
	enum tok_type type;
	const char *s; /* in the arena */
	size_t n;
};

struct lexer {
	struct jn_arena *arena;
	const char *src;
	size_t n, at;
	struct tok *toks;
	size_t len, cap;
	int brace_depth;
	char err[160];
};

static int lex_fail(struct lexer *lx, const char *what)
{
	if (!lx->err[0])
		snprintf(lx->err, sizeof(lx->err), "%s at byte %zu", what, lx->at);
	return -EINVAL;
}

static int lex_push(struct lexer *lx, enum tok_type type, const char *s, size_t n)
{
	char *copy;

	if (lx->len == lx->cap) {
		size_t cap = lx->cap ? lx->cap * 2 : 256;
		struct tok *t = realloc(lx->toks, cap * sizeof(*t));

		if (!t)
			return -ENOMEM;
		lx->toks = t;
		lx->cap = cap;
	}
	if (!(copy = jn_arena_alloc(lx->arena, n + 1)))
		return -ENOMEM;
	memcpy(copy, s, n);
	lx->toks[lx->len++] = (struct tok){ type, copy, n };
	return 0;
}

static enum tok_type last_type(const struct lexer *lx)
{
	return lx->len ? lx->toks[lx->len - 1].type : T_NONE;
}

static bool is_word(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '_';
}

static bool is_digit(char c)
{
	return c >= '0' && c <= '9';
}

/* consumeWhile: the input may not end while the predicate holds. */
static int lex_while(struct lexer *lx, bool (*pred)(char), size_t *start)
{
	*start = lx->at;
	while (lx->at < lx->n && pred(lx->src[lx->at]))
		if (++lx->at >= lx->n)
			return lex_fail(lx, "unexpected end of input");
	return 0;
}

static int lex_skip_ws_inside(struct lexer *lx)
{
	size_t k;

	while ((k = jn_ws_len(lx->src + lx->at, lx->src + lx->n)))
		if ((lx->at += k) >= lx->n)
			return lex_fail(lx, "unexpected end of input");
	return 0;
}

static void strip_trailing_ws(struct lexer *lx)
{
	struct tok *t;
	size_t k;

	if (!lx->len || (t = &lx->toks[lx->len - 1])->type != T_TEXT)
		return;
	while ((k = jn_ws_len_back(t->s, t->s + t->n)))
		t->n -= k;
	if (!t->n)
		lx->len--;
}

static void skip_leading_ws(struct lexer *lx)
{
	size_t k;

	while ((k = jn_ws_len(lx->src + lx->at, lx->src + lx->n)))
		lx->at += k;
}

static int hex_val(char c)
{
	if (is_digit(c))
		return c - '0';
	c = (char)(c | 0x20);
	return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static size_t put_utf8(char *o, uint32_t c)
{
	if (c < 0x80) {
		o[0] = (char)c;
		return 1;
	}
	if (c < 0x800) {
		o[0] = (char)(0xc0 | (c >> 6));
		o[1] = (char)(0x80 | (c & 0x3f));
		return 2;
	}
	if (c >= 0xd800 && c <= 0xdfff)
		c = 0xfffd; /* a lone surrogate reaches UTF-8 as U+FFFD in node too */
	o[0] = (char)(0xe0 | (c >> 12));
	o[1] = (char)(0x80 | ((c >> 6) & 0x3f));
	o[2] = (char)(0x80 | (c & 0x3f));
	return 3;
}

static int lex_string(struct lexer *lx, char quote)
{
	char *o = malloc(lx->n - lx->at + 1);
	size_t on = 0;
	int ret;

	if (!o)
		return -ENOMEM;
	for (;;) {
		char c;

		if (lx->at >= lx->n) {
			free(o);
			return lex_fail(lx, "unexpected end of input in a string");
		}
		if ((c = lx->src[lx->at]) == quote)
			break;
		lx->at++;
		if (c != '\\') {
			o[on++] = c;
			continue;
		}
		if (lx->at >= lx->n) {
			free(o);
			return lex_fail(lx, "unexpected end of input in a string");
		}
		c = lx->src[lx->at++];
		if (c == 'x' || c == 'u') {
			int digits = c == 'x' ? 2 : 4;
			uint32_t v = 0;

			for (int i = 0; i < digits; i++) {
				int h = lx->at + (size_t)i < lx->n ? hex_val(lx->src[lx->at + i]) : -1;

				if (h < 0) {
					free(o);
					return lex_fail(lx, "invalid hexadecimal escape");
				}
				v = v * 16 + (uint32_t)h;
			}
			lx->at += (size_t)digits;
			on += put_utf8(o + on, v);
			continue;
		}
		switch (c) {
		case 'n': o[on++] = '\n'; break;
		case 't': o[on++] = '\t'; break;
		case 'r': o[on++] = '\r'; break;
		case 'b': o[on++] = '\b'; break;
		case 'f': o[on++] = '\f'; break;
		case 'v': o[on++] = '\v'; break;
		case '\'': case '"': case '\\': o[on++] = c; break;
		default:
			free(o);
			return lex_fail(lx, "unexpected escaped character");
		}
	}
	lx->at++;
	ret = lex_push(lx, T_STR, o, on);
	free(o);
	return ret;
}

static int lex_text(struct lexer *lx)
{
	size_t end = lx->at;

	while (end < lx->n) {
		const char *brace = memchr(lx->src + end, '{', lx->n - end);

		if (!brace) {
			end = lx->n;
			break;
		}
		end = (size_t)(brace - lx->src);
		if (end + 1 < lx->n && strchr("%{#", lx->src[end + 1]) && lx->src[end + 1])
			break;
		end++;
	}
	if (end > lx->n)
		end = lx->n;
	if (end == lx->at)
		return 1;
	if (lex_push(lx, T_TEXT, lx->src + lx->at, end - lx->at))
		return -ENOMEM;
	lx->at = end;
	return 0;
}

static int lex_comment(struct lexer *lx)
{
	const char *end;
	bool before, after;

	lx->at += 2;
	before = lx->at < lx->n && lx->src[lx->at] == '-';
	lx->at += before;
	end = memmem(lx->src + lx->at, lx->n - lx->at, "#}", 2);
	if (!end)
		return lex_fail(lx, "missing end of comment tag");
	after = end > lx->src + lx->at && end[-1] == '-';
	if (before)
		strip_trailing_ws(lx);
	if (lex_push(lx, T_COMMENT, "", 0))
		return -ENOMEM;
	lx->at = (size_t)(end - lx->src) + 2;
	if (after)
		skip_leading_ws(lx);
	return 0;
}

struct rule {
	const char *seq;
	enum tok_type type;
};

static const struct rule rules[] = {
	{ "{%", T_OPEN_STMT }, { "%}", T_CLOSE_STMT }, { "{{", T_OPEN_EXPR },
	{ "}}", T_CLOSE_EXPR }, { "(", T_LPAREN }, { ")", T_RPAREN }, { "{", T_LBRACE },
	{ "}", T_RBRACE }, { "[", T_LBRACKET }, { "]", T_RBRACKET }, { ",", T_COMMA },
	{ ".", T_DOT }, { ":", T_COLON }, { "|", T_PIPE }, { "<=", T_CMP }, { ">=", T_CMP },
	{ "==", T_CMP }, { "!=", T_CMP }, { "<", T_CMP }, { ">", T_CMP }, { "+", T_ADD },
	{ "-", T_ADD }, { "~", T_ADD }, { "**", T_POW }, { "*", T_MUL }, { "//", T_MUL },
	{ "/", T_MUL }, { "%", T_MUL }, { "=", T_EQUALS },
};

static int lex_rule(struct lexer *lx)
{
	for (size_t i = 0; i < ST_ARRAY_LEN(rules); i++) {
		size_t len = strlen(rules[i].seq);

		if (rules[i].type == T_CLOSE_EXPR && lx->brace_depth > 0)
			continue;
		if (lx->n - lx->at < len || memcmp(lx->src + lx->at, rules[i].seq, len))
			continue;
		if (lex_push(lx, rules[i].type, rules[i].seq, len))
			return -ENOMEM;
		if (rules[i].type == T_OPEN_EXPR)
			lx->brace_depth = 0;
		else if (rules[i].type == T_LBRACE)
			lx->brace_depth++;
		else if (rules[i].type == T_RBRACE)
			lx->brace_depth--;
		lx->at += len;
		return 0;
	}
	return 1;
}

static int lex_number(struct lexer *lx, const char *sign)
{
	size_t start, fstart;
	char num[128];
	int len;

	if (lex_while(lx, is_digit, &start))
		return -EINVAL;
	len = snprintf(num, sizeof(num), "%s%.*s", sign, (int)ST_MIN(lx->at - start, 60),
		       lx->src + start);
	if ((*sign || last_type(lx) != T_DOT) && lx->at - start > 0 && lx->at + 1 < lx->n &&
	    lx->src[lx->at] == '.' && is_digit(lx->src[lx->at + 1])) {
		lx->at++;
		if (lex_while(lx, is_digit, &fstart))
			return -EINVAL;
		len += snprintf(num + len, sizeof(num) - (size_t)len, ".%.*s",
				(int)ST_MIN(lx->at - fstart, 60), lx->src + fstart);
	}
	if (!*sign || lx->at > start)
		return lex_push(lx, T_NUM, num, (size_t)len) ? -ENOMEM : 0;
	return lex_push(lx, T_UNARY, sign, 1) ? -ENOMEM : 0;
}

static int lex_sign(struct lexer *lx, char c)
{
	enum tok_type last = last_type(lx);
	char sign[2] = { c, 0 };

	if (last == T_TEXT || last == T_NONE)
		return lex_fail(lx, "unexpected character");
	if (last == T_IDENT || last == T_NUM || last == T_STR || last == T_RPAREN ||
	    last == T_RBRACKET)
		return 1;
	lx->at++;
	return lex_number(lx, sign);
}

static int lex_one(struct lexer *lx)
{
	enum tok_type last = last_type(lx);
	const char *s = lx->src;
	char c;
	int ret;

	if (last == T_NONE || last == T_CLOSE_STMT || last == T_CLOSE_EXPR ||
	    last == T_COMMENT) {
		if ((ret = lex_text(lx)) <= 0)
			return ret;
	}
	if (s[lx->at] == '{' && lx->at + 1 < lx->n) {
		char next = s[lx->at + 1];

		if (next == '#')
			return lex_comment(lx);
		if (lx->at + 2 < lx->n && s[lx->at + 2] == '-' && (next == '%' || next == '{')) {
			strip_trailing_ws(lx);
			if (lex_push(lx, next == '%' ? T_OPEN_STMT : T_OPEN_EXPR,
				     next == '%' ? "{%" : "{{", 2))
				return -ENOMEM;
			if (next == '{')
				lx->brace_depth = 0;
			lx->at += 3;
			return 0;
		}
	}
	if (lex_skip_ws_inside(lx))
		return -EINVAL;
	c = s[lx->at];
	if (c == '-' && lx->at + 2 < lx->n && s[lx->at + 2] == '}' &&
	    (s[lx->at + 1] == '%' || s[lx->at + 1] == '}')) {
		if (lex_push(lx, s[lx->at + 1] == '%' ? T_CLOSE_STMT : T_CLOSE_EXPR,
			     s[lx->at + 1] == '%' ? "%}" : "}}", 2))
			return -ENOMEM;
		lx->at += 3;
		skip_leading_ws(lx);
		return 0;
	}
	if ((c == '-' || c == '+') && (ret = lex_sign(lx, c)) <= 0)
		return ret;
	if ((ret = lex_rule(lx)) <= 0)
		return ret;
	if (c == '\'' || c == '"') {
		lx->at++;
		return lex_string(lx, c);
	}
	if (is_digit(c))
		return lex_number(lx, "");
	if (is_word(c)) {
		size_t start;

		if (lex_while(lx, is_word, &start))
			return -EINVAL;
		return lex_push(lx, T_IDENT, s + start, lx->at - start) ? -ENOMEM : 0;
	}
	return lex_fail(lx, "unexpected character");
}

/* --- parser ------------------------------------------------------------------ */

#define JN_MAX_DEPTH 200

struct parser {
	struct jn_arena *arena;
	const struct tok *t;
	size_t n, at;
	int depth;
	int err;
	char msg[160];
};

static void *pfail(struct parser *p, const char *what)
{
	if (!p->err) {
		p->err = -EINVAL;
		snprintf(p->msg, sizeof(p->msg), "%s (token %zu)", what, p->at);
	}
	return NULL;
}

static struct jn_node *node_new(struct parser *p, enum jn_node_kind kind)
{
	struct jn_node *nd = jn_arena_alloc(p->arena, sizeof(*nd));

	if (!nd && !p->err) {
		p->err = -ENOMEM;
		snprintf(p->msg, sizeof(p->msg), "out of memory");
	}
	if (nd)
		nd->kind = kind;
	return nd;
}

/* A growing list of nodes, copied into the arena when done. */
struct nlist {
	struct jn_node **v;
	size_t n, cap;
};

static bool nlist_push(struct parser *p, struct nlist *l, struct jn_node *nd)
{
	if (!nd)
		return false;
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 8;
		struct jn_node **v = realloc(l->v, cap * sizeof(*v));

		if (!v) {
			p->err = -ENOMEM;
			return false;
		}
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = nd;
	return true;
}

static struct jn_node **nlist_done(struct parser *p, struct nlist *l, size_t *len)
{
	struct jn_node **v = NULL;

	if (!p->err && l->n && (v = jn_arena_alloc(p->arena, l->n * sizeof(*v))))
		memcpy(v, l->v, l->n * sizeof(*v));
	else if (!p->err && l->n)
		p->err = -ENOMEM;
	*len = v ? l->n : 0;
	free(l->v);
	l->v = NULL;
	return v;
}

static bool is_type(const struct parser *p, enum tok_type type)
{
	return p->at < p->n && p->t[p->at].type == type;
}

static bool is_word_tok(const struct parser *p, size_t off, const char *w)
{
	return p->at + off < p->n && p->t[p->at + off].type == T_IDENT &&
	       strlen(w) == p->t[p->at + off].n && !memcmp(p->t[p->at + off].s, w, strlen(w));
}

static bool is_stmt(const struct parser *p, const char *w)
{
	return is_type(p, T_OPEN_STMT) && is_word_tok(p, 1, w);
}

static bool expect(struct parser *p, enum tok_type type, const char *what)
{
	if (!is_type(p, type)) {
		pfail(p, what);
		return false;
	}
	p->at++;
	return true;
}

static bool expect_word(struct parser *p, const char *w, const char *what)
{
	if (!is_word_tok(p, 0, w)) {
		pfail(p, what);
		return false;
	}
	p->at++;
	return true;
}

static struct jn_node *parse_expr(struct parser *p);
static struct jn_node *parse_primary(struct parser *p);
static struct jn_node *parse_any(struct parser *p);

static bool enter(struct parser *p)
{
	if (p->err)
		return false;
	if (++p->depth > JN_MAX_DEPTH) {
		pfail(p, "nesting deeper than 200");
		return false;
	}
	return true;
}

static struct jn_node *leave(struct parser *p, struct jn_node *nd)
{
	p->depth--;
	return p->err ? NULL : nd;
}

static struct jn_node *bin(struct parser *p, enum jn_op op, struct jn_node *a, struct jn_node *b)
{
	struct jn_node *nd;

	if (!a || !b || !(nd = node_new(p, JN_BIN)))
		return NULL;
	nd->op = op;
	nd->a = a;
	nd->b = b;
	return nd;
}

/* Statements up to one of the stop words ({% word), each a body item. */
static struct jn_node **parse_block(struct parser *p, const char *const *stops, size_t *len)
{
	struct nlist l = { 0 };

	for (;;) {
		bool stop = false;

		for (size_t i = 0; stops[i]; i++)
			stop |= is_stmt(p, stops[i]);
		if (stop || p->err)
			break;
		if (p->at >= p->n) {
			pfail(p, "unexpected end of template: a block is not closed");
			break;
		}
		if (!nlist_push(p, &l, parse_any(p)))
			break;
	}
	return nlist_done(p, &l, len);
}

static struct jn_node *parse_args(struct parser *p, struct jn_node *callee)
{
	struct jn_node *call = node_new(p, JN_CALL);
	struct nlist l = { 0 };
	bool kw_seen = false;

	if (!call || !expect(p, T_LPAREN, "expected ( for the arguments"))
		return NULL;
	call->a = callee;
	while (!p->err && !is_type(p, T_RPAREN)) {
		struct jn_node *arg;

		if (p->at >= p->n) {
			pfail(p, "unexpected end of template in the arguments");
			break;
		}
		if (is_type(p, T_POW) || (is_type(p, T_MUL) && p->t[p->at].s[0] == '*')) {
			pfail(p, "argument unpacking (* and **) is not supported");
			break;
		}
		if (!(arg = parse_expr(p)))
			break;
		if (is_type(p, T_EQUALS)) {
			struct jn_node *kw;

			p->at++;
			if (arg->kind != JN_IDENT) {
				pfail(p, "expected an identifier for a keyword argument");
				break;
			}
			if (!(kw = node_new(p, JN_KWARG)))
				break;
			kw->s = arg->s;
			kw->n = arg->n;
			kw->a = parse_expr(p);
			arg = kw;
			kw_seen = true;
		} else if (kw_seen) {
			pfail(p, "positional arguments must come before keyword arguments");
			break;
		}
		if (!nlist_push(p, &l, arg))
			break;
		if (is_type(p, T_COMMA))
			p->at++;
	}
	call->list = nlist_done(p, &l, &call->len);
	if (!expect(p, T_RPAREN, "expected ) after the arguments"))
		return NULL;
	return call;
}

static struct jn_node *parse_subscript(struct parser *p)
{
	struct jn_node *part[3] = { 0 }, *nd;
	size_t n = 0;
	bool slice = false;

	while (!p->err && !is_type(p, T_RBRACKET)) {
		if (p->at >= p->n)
			return pfail(p, "unexpected end of template in [ ]");
		if (n == 3)
			return pfail(p, "expected 0-3 arguments for a slice");
		if (is_type(p, T_COLON)) {
			part[n++] = NULL;
			p->at++;
			slice = true;
		} else {
			part[n++] = parse_expr(p);
			if (is_type(p, T_COLON)) {
				p->at++;
				slice = true;
			}
		}
	}
	if (p->err)
		return NULL;
	if (n == 0)
		return pfail(p, "expected an index or a slice in [ ]");
	if (!slice)
		return part[0];
	if (!(nd = node_new(p, JN_SLICE)))
		return NULL;
	nd->a = part[0];
	nd->b = part[1];
	nd->c = part[2];
	return nd;
}

static struct jn_node *parse_member(struct parser *p, struct jn_node *obj)
{
	while (obj && (is_type(p, T_DOT) || is_type(p, T_LBRACKET))) {
		bool computed = is_type(p, T_LBRACKET);
		struct jn_node *nd = node_new(p, JN_MEMBER), *prop;

		p->at++;
		if (!nd)
			return NULL;
		if (computed) {
			prop = parse_subscript(p);
			if (!expect(p, T_RBRACKET, "expected ]"))
				return NULL;
		} else {
			prop = parse_primary(p);
			if (prop && prop->kind != JN_IDENT && prop->kind != JN_INT)
				return pfail(p, "expected an identifier or an integer after .");
		}
		if (!prop)
			return NULL;
		nd->a = obj;
		nd->b = prop;
		nd->flag = computed;
		obj = nd;
	}
	return obj;
}

static struct jn_node *parse_call_chain(struct parser *p, struct jn_node *callee)
{
	struct jn_node *e;

	if (!enter(p))
		return NULL;
	e = parse_member(p, parse_args(p, callee));
	if (e && is_type(p, T_LPAREN))
		e = parse_call_chain(p, e);
	return leave(p, e);
}

static struct jn_node *parse_call_member(struct parser *p)
{
	struct jn_node *m = parse_member(p, parse_primary(p));

	if (m && is_type(p, T_LPAREN))
		return parse_call_chain(p, m);
	return m;
}

static struct jn_node *parse_sign(struct parser *p)
{
	if (!enter(p))
		return NULL;
	if (p->at < p->n && (p->t[p->at].type == T_UNARY || p->t[p->at].type == T_ADD) &&
	    (p->t[p->at].s[0] == '-' || p->t[p->at].s[0] == '+')) {
		struct jn_node *nd = node_new(p, JN_UNARY);

		if (!nd)
			return leave(p, NULL);
		nd->op = p->t[p->at++].s[0] == '-' ? JN_OP_SUB : JN_OP_ADD;
		nd->a = parse_sign(p);
		return leave(p, nd);
	}
	return leave(p, parse_call_member(p));
}

static struct jn_node *parse_filter(struct parser *p)
{
	struct jn_node *e = parse_sign(p);

	while (e && is_type(p, T_PIPE)) {
		struct jn_node *nd = node_new(p, JN_FILTER), *f;

		p->at++;
		if (!nd || !(f = parse_primary(p)))
			return NULL;
		if (f->kind != JN_IDENT)
			return pfail(p, "expected a filter name after |");
		if (is_type(p, T_LPAREN))
			f = parse_call_chain(p, f);
		nd->a = e;
		nd->b = f;
		e = nd;
	}
	return e;
}

static struct jn_node *parse_test(struct parser *p)
{
	struct jn_node *e = parse_filter(p);

	while (e && is_word_tok(p, 0, "is")) {
		struct jn_node *nd = node_new(p, JN_TEST), *name;

		p->at++;
		if (!nd)
			return NULL;
		if (is_word_tok(p, 0, "not")) {
			nd->flag = true;
			p->at++;
		}
		if (!(name = parse_primary(p)))
			return NULL;
		if (name->kind != JN_IDENT)
			return pfail(p, "expected a test name after is");
		nd->a = e;
		nd->s = name->s;
		nd->n = name->n;
		e = nd;
	}
	return e;
}

static enum jn_op op_of(const struct tok *t)
{
	static const struct { const char *s; enum jn_op op; } ops[] = {
		{ "==", JN_OP_EQ }, { "!=", JN_OP_NE }, { "<", JN_OP_LT }, { ">", JN_OP_GT },
		{ "<=", JN_OP_LE }, { ">=", JN_OP_GE }, { "+", JN_OP_ADD }, { "-", JN_OP_SUB },
		{ "~", JN_OP_CAT }, { "*", JN_OP_MUL }, { "/", JN_OP_DIV },
		{ "//", JN_OP_FLOORDIV }, { "%", JN_OP_MOD }, { "**", JN_OP_POW },
	};

	for (size_t i = 0; i < ST_ARRAY_LEN(ops); i++)
		if (t->n == strlen(ops[i].s) && !memcmp(t->s, ops[i].s, t->n))
			return ops[i].op;
	return JN_OP_NONE;
}

static struct jn_node *parse_pow(struct parser *p)
{
	struct jn_node *e = parse_test(p);

	while (e && is_type(p, T_POW)) {
		p->at++;
		e = bin(p, JN_OP_POW, e, parse_test(p));
	}
	return e;
}

static struct jn_node *parse_mul(struct parser *p)
{
	struct jn_node *e = parse_pow(p);

	while (e && is_type(p, T_MUL)) {
		enum jn_op op = op_of(&p->t[p->at++]);

		e = bin(p, op, e, parse_pow(p));
	}
	return e;
}

static struct jn_node *parse_add(struct parser *p)
{
	struct jn_node *e = parse_mul(p);

	while (e && is_type(p, T_ADD)) {
		enum jn_op op = op_of(&p->t[p->at++]);

		e = bin(p, op, e, parse_mul(p));
	}
	return e;
}

static struct jn_node *parse_compare(struct parser *p)
{
	struct jn_node *e = parse_add(p);

	while (e) {
		enum jn_op op;

		if (is_word_tok(p, 0, "not") && is_word_tok(p, 1, "in")) {
			op = JN_OP_NOTIN;
			p->at += 2;
		} else if (is_word_tok(p, 0, "in")) {
			op = JN_OP_IN;
			p->at++;
		} else if (is_type(p, T_CMP)) {
			op = op_of(&p->t[p->at++]);
		} else {
			break;
		}
		e = bin(p, op, e, parse_add(p));
	}
	return e;
}

static struct jn_node *parse_not(struct parser *p)
{
	struct jn_node *nd = NULL;

	if (!enter(p))
		return NULL;
	while (!p->err && is_word_tok(p, 0, "not")) {
		p->at++;
		if (!(nd = node_new(p, JN_UNARY)))
			return leave(p, NULL);
		nd->op = JN_OP_NOT;
		nd->a = parse_not(p);
	}
	return leave(p, nd ? nd : parse_compare(p));
}

static struct jn_node *parse_and(struct parser *p)
{
	struct jn_node *e = parse_not(p);

	while (e && is_word_tok(p, 0, "and")) {
		p->at++;
		e = bin(p, JN_OP_AND, e, parse_not(p));
	}
	return e;
}

static struct jn_node *parse_or(struct parser *p)
{
	struct jn_node *e = parse_and(p);

	while (e && is_word_tok(p, 0, "or")) {
		p->at++;
		e = bin(p, JN_OP_OR, e, parse_and(p));
	}
	return e;
}

static struct jn_node *parse_expr(struct parser *p)
{
	struct jn_node *a, *nd;

	if (!enter(p))
		return NULL;
	a = parse_or(p);
	if (!a || !is_word_tok(p, 0, "if"))
		return leave(p, a);
	p->at++;
	if (!(nd = node_new(p, JN_SELECT)))
		return leave(p, NULL);
	nd->a = a;
	nd->b = parse_or(p);
	if (is_word_tok(p, 0, "else")) {
		p->at++;
		nd->kind = JN_TERNARY;
		nd->c = parse_expr(p);
	}
	return leave(p, nd);
}

/* expr, expr, ... as a tuple (or one expression). */
static struct jn_node *parse_sequence(struct parser *p, bool primary)
{
	struct jn_node *first = primary ? parse_primary(p) : parse_expr(p), *tuple;
	struct nlist l = { 0 };

	if (!first || !is_type(p, T_COMMA))
		return first;
	if (!(tuple = node_new(p, JN_TUPLE)) || !nlist_push(p, &l, first))
		return NULL;
	while (!p->err && is_type(p, T_COMMA)) {
		p->at++;
		if (!nlist_push(p, &l, primary ? parse_primary(p) : parse_expr(p)))
			break;
	}
	tuple->list = nlist_done(p, &l, &tuple->len);
	return p->err ? NULL : tuple;
}

static struct jn_node *parse_list_literal(struct parser *p)
{
	struct jn_node *nd = node_new(p, JN_ARRAY);
	struct nlist l = { 0 };

	while (nd && !p->err && !is_type(p, T_RBRACKET)) {
		if (p->at >= p->n) {
			pfail(p, "unexpected end of template in [ ]");
			break;
		}
		if (!nlist_push(p, &l, parse_expr(p)))
			break;
		if (is_type(p, T_COMMA))
			p->at++;
	}
	if (nd)
		nd->list = nlist_done(p, &l, &nd->len);
	else
		free(l.v);
	p->at++;
	return p->err ? NULL : nd;
}

static struct jn_node *parse_object_literal(struct parser *p)
{
	struct jn_node *nd = node_new(p, JN_OBJECT);
	struct nlist k = { 0 }, v = { 0 };

	while (nd && !p->err && !is_type(p, T_RBRACE)) {
		if (p->at >= p->n) {
			pfail(p, "unexpected end of template in { }");
			break;
		}
		if (!nlist_push(p, &k, parse_expr(p)) ||
		    !expect(p, T_COLON, "expected : between a key and its value") ||
		    !nlist_push(p, &v, parse_expr(p)))
			break;
		if (is_type(p, T_COMMA))
			p->at++;
	}
	if (nd) {
		nd->list = nlist_done(p, &k, &nd->len);
		nd->list2 = nlist_done(p, &v, &nd->len2);
	} else {
		free(k.v);
		free(v.v);
	}
	p->at++;
	return p->err ? NULL : nd;
}

static struct jn_node *parse_primary(struct parser *p)
{
	const struct tok *t;
	struct jn_node *nd;

	if (!enter(p))
		return NULL;
	if (p->at >= p->n)
		return leave(p, pfail(p, "unexpected end of template in an expression"));
	t = &p->t[p->at++];
	switch (t->type) {
	case T_NUM:
		if ((nd = node_new(p, memchr(t->s, '.', t->n) ? JN_FLOAT : JN_INT)))
			nd->num = strtod(t->s, NULL);
		return leave(p, nd);
	case T_STR: {
		size_t n = t->n, at = p->at;
		char *s;

		while (at < p->n && p->t[at].type == T_STR)
			n += p->t[at++].n;
		if (!(nd = node_new(p, JN_STR)) || !(s = jn_arena_alloc(p->arena, n + 1)))
			return leave(p, NULL);
		memcpy(s, t->s, t->n);
		for (n = t->n; is_type(p, T_STR); p->at++) {
			memcpy(s + n, p->t[p->at].s, p->t[p->at].n);
			n += p->t[p->at].n;
		}
		nd->s = s;
		nd->n = n;
		return leave(p, nd);
	}
	case T_IDENT:
		if ((nd = node_new(p, JN_IDENT))) {
			nd->s = t->s;
			nd->n = t->n;
		}
		return leave(p, nd);
	case T_LPAREN:
		nd = parse_sequence(p, false);
		if (!expect(p, T_RPAREN, "expected )"))
			return leave(p, NULL);
		return leave(p, nd);
	case T_LBRACKET:
		return leave(p, parse_list_literal(p));
	case T_LBRACE:
		return leave(p, parse_object_literal(p));
	default:
		return leave(p, pfail(p, "unexpected token in an expression"));
	}
}

static struct jn_node *parse_if(struct parser *p)
{
	static const char *const stops[] = { "elif", "else", "endif", NULL };
	static const char *const endif[] = { "endif", NULL };
	struct jn_node *nd = node_new(p, JN_IF);

	if (!nd || !enter(p))
		return NULL;
	nd->a = parse_expr(p);
	if (!expect(p, T_CLOSE_STMT, "expected %} after if"))
		return leave(p, NULL);
	nd->list = parse_block(p, stops, &nd->len);
	if (is_stmt(p, "elif")) {
		struct nlist l = { 0 };

		p->at += 2;
		nlist_push(p, &l, parse_if(p));
		nd->list2 = nlist_done(p, &l, &nd->len2);
	} else if (is_stmt(p, "else")) {
		p->at += 2;
		if (expect(p, T_CLOSE_STMT, "expected %} after else"))
			nd->list2 = parse_block(p, endif, &nd->len2);
	}
	return leave(p, nd);
}

static struct jn_node *parse_for(struct parser *p)
{
	static const char *const stops[] = { "endfor", "else", NULL };
	static const char *const endfor[] = { "endfor", NULL };
	struct jn_node *nd = node_new(p, JN_FOR);

	if (!nd)
		return NULL;
	nd->a = parse_sequence(p, true);
	if (nd->a && nd->a->kind != JN_IDENT && nd->a->kind != JN_TUPLE)
		return pfail(p, "expected a name or names for the loop variable");
	if (!expect_word(p, "in", "expected in after the loop variable"))
		return NULL;
	nd->b = parse_expr(p);
	if (!expect(p, T_CLOSE_STMT, "expected %} after for"))
		return NULL;
	nd->list = parse_block(p, stops, &nd->len);
	if (is_stmt(p, "else")) {
		p->at += 2;
		if (expect(p, T_CLOSE_STMT, "expected %} after else"))
			nd->list2 = parse_block(p, endfor, &nd->len2);
	}
	return p->err ? NULL : nd;
}

static struct jn_node *parse_set_rest(struct parser *p, struct jn_node *nd);

static struct jn_node *parse_set(struct parser *p)
{
	struct jn_node *nd = node_new(p, JN_SET);

	if (!nd || !enter(p))
		return NULL;
	nd = parse_set_rest(p, nd);
	return leave(p, nd);
}

static struct jn_node *parse_set_rest(struct parser *p, struct jn_node *nd)
{
	static const char *const endset[] = { "endset", NULL };

	nd->a = parse_sequence(p, false);
	if (is_type(p, T_EQUALS)) {
		p->at++;
		nd->b = parse_sequence(p, false);
	} else {
		if (!expect(p, T_CLOSE_STMT, "expected = or %} after set"))
			return NULL;
		nd->list = parse_block(p, endset, &nd->len);
		if (!expect(p, T_OPEN_STMT, "expected {% endset %}") || !expect_word(p, "endset", "expected endset"))
			return NULL;
	}
	if (!expect(p, T_CLOSE_STMT, "expected %} after set"))
		return NULL;
	return p->err ? NULL : nd;
}

/* {% macro name(a, b=default) %} body: the parameters are a call's
 * arguments, each a name or name=default, no name twice. */
static struct jn_node *parse_macro(struct parser *p)
{
	static const char *const endmacro[] = { "endmacro", NULL };
	struct jn_node *name = parse_primary(p), *nd, *args;

	if (!name || name->kind != JN_IDENT)
		return pfail(p, "expected a name after macro");
	if (!(args = parse_args(p, NULL)) || !(nd = node_new(p, JN_MACRO)))
		return NULL;
	for (size_t i = 0; i < args->len; i++) {
		if (args->list[i]->kind != JN_IDENT && args->list[i]->kind != JN_KWARG)
			return pfail(p, "expected a name for a macro parameter");
		for (size_t k = 0; k < i; k++)
			if (args->list[k]->n == args->list[i]->n &&
			    !memcmp(args->list[k]->s, args->list[i]->s, args->list[i]->n))
				return pfail(p, "a macro parameter named twice");
	}
	nd->s = name->s;
	nd->n = name->n;
	nd->list = args->list;
	nd->len = args->len;
	if (!expect(p, T_CLOSE_STMT, "expected %} after the macro's parameters"))
		return NULL;
	nd->list2 = parse_block(p, endmacro, &nd->len2);
	return p->err ? NULL : nd;
}

static bool close_with(struct parser *p, const char *word)
{
	char what[48];

	snprintf(what, sizeof(what), "expected {%% %s %%}", word);
	return expect(p, T_OPEN_STMT, what) && expect_word(p, word, what) &&
	       expect(p, T_CLOSE_STMT, what);
}

static struct jn_node *parse_statement(struct parser *p)
{
	const struct tok *w;
	struct jn_node *nd = NULL;

	p->at++;
	if (!is_type(p, T_IDENT))
		return pfail(p, "expected a statement name after {%");
	w = &p->t[p->at++];
#define IS(x) (w->n == strlen(x) && !memcmp(w->s, x, w->n))
	if (IS("set"))
		return parse_set(p);
	if (IS("if")) {
		nd = parse_if(p);
		return nd && close_with(p, "endif") ? nd : NULL;
	}
	if (IS("for")) {
		if (!enter(p))
			return NULL;
		nd = parse_for(p);
		nd = nd && close_with(p, "endfor") ? nd : NULL;
		return leave(p, nd);
	}
	if (IS("break") || IS("continue")) {
		nd = node_new(p, IS("break") ? JN_BREAK : JN_CONTINUE);
		return expect(p, T_CLOSE_STMT, "expected %}") ? nd : NULL;
	}
	if (IS("macro")) {
		if (!enter(p))
			return NULL;
		nd = parse_macro(p);
		nd = nd && close_with(p, "endmacro") ? nd : NULL;
		return leave(p, nd);
	}
	if (IS("call") || IS("filter") || IS("include") || IS("extends") || IS("import") ||
	    IS("block"))
		return pfail(p, "this statement is not supported (call, filter, include, "
			     "extends, import, block)");
#undef IS
	return pfail(p, "unknown statement");
}

static struct jn_node *parse_any(struct parser *p)
{
	const struct tok *t = &p->t[p->at];
	struct jn_node *nd;

	switch (t->type) {
	case T_COMMENT:
		p->at++;
		return node_new(p, JN_COMMENT);
	case T_TEXT:
		p->at++;
		if ((nd = node_new(p, JN_TEXT))) {
			nd->s = t->s;
			nd->n = t->n;
		}
		return nd;
	case T_OPEN_STMT:
		return parse_statement(p);
	case T_OPEN_EXPR:
		p->at++;
		nd = parse_expr(p);
		return expect(p, T_CLOSE_EXPR, "expected }}") ? nd : NULL;
	default:
		return pfail(p, "unexpected token outside {{ }} and {% %}");
	}
}

int st_jinja_parse(const char *src, size_t n, struct st_jinja **out)
{
	struct st_jinja *t = calloc(1, sizeof(*t));
	struct buf pre = { 0 };
	struct lexer lx = { 0 };
	struct parser p = { 0 };
	struct nlist body = { 0 };
	int ret;

	*out = NULL;
	if (!t)
		return st_error_set(-ENOMEM, "template: out of memory");
	if ((ret = preprocess(src, n, &pre)) < 0) {
		free(t);
		return st_error_set(ret, "template: out of memory");
	}
	lx = (struct lexer){ .arena = &t->arena, .src = pre.p, .n = pre.n };
	while (lx.at < lx.n && (ret = lex_one(&lx)) == 0)
		;
	free(pre.p);
	if (ret < 0) {
		free(lx.toks);
		st_jinja_free(t);
		return st_error_set(ret, "template: %s", ret == -ENOMEM ? "out of memory" : lx.err);
	}
	p = (struct parser){ .arena = &t->arena, .t = lx.toks, .n = lx.len };
	while (!p.err && p.at < p.n)
		if (!nlist_push(&p, &body, parse_any(&p)) && !p.err)
			pfail(&p, "syntax error");
	t->body = nlist_done(&p, &body, &t->len);
	free(lx.toks);
	if (p.err) {
		st_jinja_free(t);
		return st_error_set(p.err, "template: %s", p.msg);
	}
	*out = t;
	return 0;
}

void st_jinja_free(struct st_jinja *t)
{
	if (!t)
		return;
	jn_arena_fini(&t->arena);
	free(t);
}

/* strata: the Jinja interpreter's parts (strata/jinja.h): an arena, the
 * syntax tree jinja_parse.c builds and jinja_run.c walks, and the UTF-8
 * helpers both use. */
#ifndef STRATA_JINJA_INTERNAL_H
#define STRATA_JINJA_INTERNAL_H

#include "strata/jinja.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bump allocator: everything of a template (or of one render) is freed at
 * once. jn_arena_alloc returns zeroed memory, or NULL past the cap. */
struct jn_chunk;
struct jn_arena {
	struct jn_chunk *head;
	size_t used_bytes, cap_bytes;
};

void *jn_arena_alloc(struct jn_arena *a, size_t bytes);
void jn_arena_fini(struct jn_arena *a);

enum jn_node_kind {
	JN_TEXT, JN_INT, JN_FLOAT, JN_STR, JN_IDENT, JN_ARRAY, JN_TUPLE, JN_OBJECT,
	JN_BIN, JN_UNARY, JN_MEMBER, JN_SLICE, JN_CALL, JN_KWARG, JN_FILTER, JN_TEST,
	JN_SELECT, JN_TERNARY, JN_IF, JN_FOR, JN_SET, JN_BREAK, JN_CONTINUE, JN_COMMENT,
	JN_MACRO,
};

/* Binary and unary operators. */
enum jn_op {
	JN_OP_NONE, JN_OP_AND, JN_OP_OR, JN_OP_NOT, JN_OP_EQ, JN_OP_NE, JN_OP_LT, JN_OP_GT,
	JN_OP_LE, JN_OP_GE, JN_OP_IN, JN_OP_NOTIN, JN_OP_ADD, JN_OP_SUB, JN_OP_CAT,
	JN_OP_MUL, JN_OP_DIV, JN_OP_FLOORDIV, JN_OP_MOD, JN_OP_POW,
};

/* One node. Which fields mean what, by kind:
 *   TEXT, STR, IDENT, KWARG(name), TEST(name)  s, n
 *   INT, FLOAT                                 num
 *   ARRAY, TUPLE                               list
 *   OBJECT                                     list (keys), list2 (values)
 *   BIN a op b; UNARY op a; TERNARY a if b else c; SELECT a if b
 *   MEMBER a[b] (flag: computed); SLICE a:b:c (each may be NULL)
 *   CALL a(list); KWARG s=a; FILTER a | b (b an IDENT or a CALL)
 *   TEST a is [not: flag] s
 *   IF a: list else list2; FOR a in b: list else list2
 *   SET a = b, or a from the block list when b is NULL
 *   MACRO s(list: IDENTs and KWARGs, the parameters): list2 */
struct jn_node {
	enum jn_node_kind kind;
	enum jn_op op;
	bool flag;
	const char *s;
	size_t n;
	double num;
	struct jn_node *a, *b, *c;
	struct jn_node **list, **list2;
	size_t len, len2;
};

struct st_jinja {
	struct jn_arena arena;
	struct jn_node **body;
	size_t len;
};

/* Bytes of the whitespace character at p (JavaScript's \s: ASCII spaces,
 * U+00A0, U+1680, U+2000-200A, U+2028/9, U+202F, U+205F, U+3000, U+FEFF),
 * or 0. */
size_t jn_ws_len(const char *p, const char *end);
/* Bytes of the whitespace character that ends [start, p), or 0. */
size_t jn_ws_len_back(const char *start, const char *p);

#endif

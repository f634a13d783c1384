/* Shared by src/tok only: the tokenizer's parts and their helpers. */
#ifndef STRATA_TOK_INTERNAL_H
#define STRATA_TOK_INTERNAL_H

#include "strata/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* --- growable byte buffers and piece lists ------------------------------- */

struct tok_buf {
	char *p;
	size_t n, cap;
};

int tok_buf_reserve(struct tok_buf *b, size_t extra);
int tok_buf_put(struct tok_buf *b, const void *s, size_t n);
void tok_buf_fini(struct tok_buf *b);

/* A piece of pre-tokenized text: bytes [off, off+len) of a tok_buf. */
struct tok_span {
	size_t off, len;
};

struct tok_spans {
	struct tok_span *v;
	size_t n, cap;
};

int tok_spans_push(struct tok_spans *s, size_t off, size_t len);
void tok_spans_fini(struct tok_spans *s);

int tok_ids_push(struct st_tok_ids *v, uint32_t id);

/* --- text (text.c) -------------------------------------------------------- */

/* Copy src to dst with every maximal invalid UTF-8 subsequence replaced by
 * U+FFFD (the WHATWG decoder). Returns 0 or -ENOMEM. */
int tok_utf8_sanitize(struct tok_buf *dst, const char *src, size_t n);
/* True when s[0..n) is valid UTF-8. */
bool tok_utf8_valid(const char *s, size_t n);
/* Decode one code point of valid UTF-8 at s (n > 0); sets *len. */
uint32_t tok_utf8_get(const char *s, size_t n, size_t *len);
/* s[0..n) for a one-line message: at most cap-1 bytes, controls as '?'. */
const char *tok_printable(const char *s, size_t n, char *buf, size_t cap);
/* Encode cp into out[4]; returns the bytes written. */
size_t tok_utf8_put(uint32_t cp, char *out);
/* Unicode White_Space (what trimming beside added tokens removes). */
bool tok_is_space(uint32_t cp);

/* GPT-2's bytes_to_unicode(): the code point standing for each byte, and
 * back (-1 for a code point that stands for no byte). */
uint32_t tok_byte_char(uint8_t b);
int tok_char_byte(uint32_t cp);

/* A compiled pattern: a tokenizer.json {"Regex": ...} or {"String": ...}. */
struct tok_re {
	pcre2_code *code;
	pcre2_match_data *md;
};

/* Compile; what names the key for errors. Returns 0 or -EINVAL. */
int tok_re_compile(struct tok_re *re, const char *pattern, size_t len,
		   bool literal, const char *what);
void tok_re_fini(struct tok_re *re);
/* The next match in s[0..n) at or after start: sets *mb, *me (byte
 * offsets) and returns 1, or 0 for none, or -EINVAL on a match error. */
int tok_re_next(struct tok_re *re, const char *s, size_t n, size_t start,
		size_t *mb, size_t *me);

enum tok_uform { TOK_NFC, TOK_NFD, TOK_NFKC, TOK_NFKD, TOK_LOWER };

/* dst = the form of src[0..n) (ICU). Returns 0, -ENOMEM or -EINVAL. */
int tok_unicode_apply(enum tok_uform form, struct tok_buf *dst,
		      const char *src, size_t n);

/* --- the parts ------------------------------------------------------------ */

enum tok_norm_kind {
	TOK_NORM_UNICODE, /* uform */
	TOK_NORM_PREPEND, /* a */
	TOK_NORM_REPLACE, /* re -> a */
	TOK_NORM_STRIP,   /* left, right */
};

struct tok_norm {
	enum tok_norm_kind kind;
	enum tok_uform uform;
	char *a;
	size_t a_len;
	struct tok_re re;
	bool left, right;
};

enum tok_split_behavior {
	TOK_SPLIT_ISOLATED,
	TOK_SPLIT_REMOVED,
	TOK_SPLIT_MERGED_PREV,
	TOK_SPLIT_MERGED_NEXT,
	TOK_SPLIT_KEEP_MATCHES, /* invert + Removed: only the matches */
};

enum tok_pre_kind {
	TOK_PRE_SPLIT,     /* re, behavior */
	TOK_PRE_BYTELEVEL, /* add_prefix_space, use_regex (re: GPT-2's) */
	TOK_PRE_METASPACE, /* a (replacement), prepend, split */
};

enum tok_prepend { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER };

struct tok_pre {
	enum tok_pre_kind kind;
	struct tok_re re;
	enum tok_split_behavior behavior;
	bool add_prefix_space, use_regex, split;
	enum tok_prepend prepend;
	char *a;
	size_t a_len;
};

enum tok_dec_kind {
	TOK_DEC_BYTELEVEL,
	TOK_DEC_REPLACE,     /* a -> b */
	TOK_DEC_BYTEFALLBACK,
	TOK_DEC_FUSE,
	TOK_DEC_STRIP,       /* a (one character), start, stop */
	TOK_DEC_METASPACE,   /* a (replacement), strip_first */
};

struct tok_dec {
	enum tok_dec_kind kind;
	char *a, *b;
	size_t a_len, b_len;
	int start, stop;
	bool strip_first;
};

struct tok_added {
	char *content;
	size_t len;
	uint32_t id;
	bool lstrip, rstrip, special;
	/* normalized: true with a normalizer there: matched in normalised
	 * text, as its content normalised (ncontent); else ncontent is NULL */
	bool normalized;
	char *ncontent;
	size_t nlen;
};

/* --- the BPE model (bpe.c) ------------------------------------------------ */

struct tok_bpe;

/* Build from tokenizer.json's "model" object. byte_level: the vocabulary is
 * in GPT-2's byte alphabet (a ByteLevel pre-tokenizer is there), so its
 * strings are turned into the bytes they stand for and words are split into
 * bytes; otherwise into UTF-8 characters. file names it in errors. Returns
 * 0, -EINVAL or -ENOMEM. */
struct json_object;
int tok_bpe_create(struct json_object *model, bool byte_level,
		   const char *file, struct tok_bpe **out);
void tok_bpe_destroy(struct tok_bpe *m);
/* Append the ids of one pre-tokenized word. Returns 0, -ENOMEM, -EINVAL
 * (no token for a piece, no unk). */
int tok_bpe_word(struct tok_bpe *m, const char *w, size_t n,
		 struct st_tok_ids *out);
/* Largest id + 1, the id of a vocabulary string as tokenizer.json writes it
 * (-1 if none), that string for an id (NULL if none), the unk id (-1). */
uint32_t tok_bpe_vocab(const struct tok_bpe *m);
int64_t tok_bpe_lookup(const struct tok_bpe *m, const char *s, size_t n);
const char *tok_bpe_string(const struct tok_bpe *m, uint32_t id,
			   size_t *len);
int64_t tok_bpe_unk(const struct tok_bpe *m);
bool tok_bpe_fuse_unk(const struct tok_bpe *m);

/* --- the tokenizer -------------------------------------------------------- */

struct st_tokenizer {
	char *file;
	struct tok_bpe *bpe;
	bool byte_level;

	struct tok_added *added;
	size_t n_added;
	/* added tokens by first byte, longest first: first[b] .. first[b+1]
	 * index by_first[] */
	uint32_t first[257];
	uint32_t *by_first;
	/* the same for the added tokens matched in normalised text */
	uint32_t nfirst[257];
	uint32_t *nby_first;
	size_t n_nadded;
	/* id -> is special (added with special: true, or named by
	 * tokenizer_config.json's additional_special_tokens) */
	uint8_t *special;
	/* id -> added token index + 1 (0: not added) */
	uint32_t *added_of;
	uint32_t n_ids; /* ids covered by special[] and added_of[] */

	struct tok_norm *norm;
	size_t n_norm;
	struct tok_pre *pre;
	size_t n_pre;
	struct tok_dec *dec;
	size_t n_dec;

	uint32_t *prefix, *suffix;
	size_t n_prefix, n_suffix;
	int64_t eos_id;
	bool cleanup;

	/* scratch reused by encode */
	struct tok_buf text, a, b, ntext;
	struct tok_spans sp, sp2;
};

/* Normalise s[0..n) through t's normalizers into t->a or t->b; *res
 * points at the result (s itself when there are none). encode.c. */
int tok_normalize(struct st_tokenizer *t, const char *s, size_t n, const char **res,
		  size_t *res_n);
/* Bytes of Unicode white space at the end / start of s[0..n). */
size_t tok_trim_end(const char *s, size_t n);
size_t tok_trim_start(const char *s, size_t n);

int tok_decode_run(const struct st_tokenizer *t, const uint32_t *ids,
		   size_t n, unsigned flags, struct tok_buf *out);

#endif

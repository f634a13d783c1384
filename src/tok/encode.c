/* Encoding: text through the parts of a tokenizer (tok_internal.h) in
 * Hugging Face's order: added tokens split out of the raw text, then per
 * section the normalizers, the pre-tokenizers and the BPE model. */
#include "tok_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* --- encode ------------------------------------------------------------------------------ */

size_t tok_trim_end(const char *s, size_t n)
{
	while (n > 0) {
		size_t k = 1, at = n - 1;

		while (at > 0 && ((uint8_t)s[at] & 0xc0) == 0x80)
			at--;
		if (!tok_is_space(tok_utf8_get(s + at, n - at, &k)))
			break;
		n = at;
	}
	return n;
}

size_t tok_trim_start(const char *s, size_t n)
{
	size_t i = 0, k;

	while (i < n && tok_is_space(tok_utf8_get(s + i, n - i, &k)))
		i += k;
	return i;
}

/* dst = src with every (non-empty) match of re replaced by r. */
static int replace_all(struct tok_re *re, const char *src, size_t n, const char *r,
		       size_t rn, struct tok_buf *dst)
{
	size_t at = 0, mb, me;
	int ret, got = 0;

	dst->n = 0;
	if ((ret = tok_buf_reserve(dst, n)))
		return ret;
	while (at < n && (got = tok_re_next(re, src, n, at, &mb, &me)) == 1) {
		if ((ret = tok_buf_put(dst, src + at, mb - at)) || (ret = tok_buf_put(dst, r, rn)))
			return ret;
		at = me;
	}
	if (got < 0)
		return got;
	return tok_buf_put(dst, src + at, n - at);
}

/* Normalise s[0..n) into one of t->a / t->b; *res points at the result. */
int tok_normalize(struct st_tokenizer *t, const char *s, size_t n, const char **res,
		  size_t *res_n)
{
	struct tok_buf *cur = NULL, *bufs[2] = { &t->a, &t->b };
	int which = 0, ret = 0;

	for (size_t i = 0; i < t->n_norm; i++) {
		struct tok_norm *nm = &t->norm[i];
		struct tok_buf *dst = bufs[which];

		switch (nm->kind) {
		case TOK_NORM_UNICODE:
			ret = tok_unicode_apply(nm->uform, dst, s, n);
			break;
		case TOK_NORM_PREPEND:
			dst->n = 0;
			ret = n ? tok_buf_put(dst, nm->a, nm->a_len) : 0;
			if (!ret)
				ret = tok_buf_put(dst, s, n);
			break;
		case TOK_NORM_REPLACE:
			ret = replace_all(&nm->re, s, n, nm->a, nm->a_len, dst);
			break;
		case TOK_NORM_STRIP: {
			size_t b = nm->left ? tok_trim_start(s, n) : 0;
			size_t e = nm->right ? tok_trim_end(s, n) : n;

			dst->n = 0;
			ret = tok_buf_put(dst, s + b, e > b ? e - b : 0);
			break;
		}
		}
		if (ret)
			return ret;
		cur = dst;
		s = cur->p;
		n = cur->n;
		which ^= 1;
	}
	*res = s;
	*res_n = n;
	return 0;
}

/* Split each piece of sp (over buf) by re into out. Empty matches never
 * split (PCRE2_NOTEMPTY). */
static int split_pieces(struct tok_re *re, enum tok_split_behavior bh, const char *buf,
			struct tok_spans *sp, struct tok_spans *out)
{
	int ret, got = 0;

	out->n = 0;
	for (size_t i = 0; i < sp->n; i++) {
		const char *s = buf + sp->v[i].off;
		size_t n = sp->v[i].len, at = 0, mb, me, base = sp->v[i].off;
		size_t pending = SIZE_MAX; /* MergedWithNext: start of the match held */

		while (at < n && (got = tok_re_next(re, s, n, at, &mb, &me)) == 1) {
			switch (bh) {
			case TOK_SPLIT_ISOLATED:
				if (mb > at && (ret = tok_spans_push(out, base + at, mb - at)))
					return ret;
				if ((ret = tok_spans_push(out, base + mb, me - mb)))
					return ret;
				break;
			case TOK_SPLIT_REMOVED:
				if (mb > at && (ret = tok_spans_push(out, base + at, mb - at)))
					return ret;
				break;
			case TOK_SPLIT_KEEP_MATCHES:
				if ((ret = tok_spans_push(out, base + mb, me - mb)))
					return ret;
				break;
			case TOK_SPLIT_MERGED_PREV:
				if ((ret = tok_spans_push(out, base + at, me - at)))
					return ret;
				break;
			case TOK_SPLIT_MERGED_NEXT:
				if (pending != SIZE_MAX) {
					if ((ret = tok_spans_push(out, base + pending, mb - pending)))
						return ret;
				} else if (mb > at && (ret = tok_spans_push(out, base + at, mb - at)))
					return ret;
				pending = mb;
				break;
			}
			at = me;
		}
		if (got < 0)
			return got;
		if (pending != SIZE_MAX)
			at = pending;
		if (at < n && bh != TOK_SPLIT_KEEP_MATCHES &&
		    (ret = tok_spans_push(out, base + at, n - at)))
			return ret;
	}
	return 0;
}

static void swap_spans(struct st_tokenizer *t)
{
	struct tok_spans tmp = t->sp;

	t->sp = t->sp2;
	t->sp2 = tmp;
}

/* Pieces that are rewritten (a prefix added, spaces replaced) are copied
 * into the other buffer; *buf follows. */
static int pre_metaspace(struct st_tokenizer *t, struct tok_pre *p, size_t section,
			 struct tok_buf **buf)
{
	struct tok_buf *src = *buf, *dst = src == &t->a ? &t->b : &t->a;
	int ret;

	dst->n = 0;
	t->sp2.n = 0;
	for (size_t i = 0; i < t->sp.n; i++) {
		const char *s = src->p + t->sp.v[i].off;
		size_t n = t->sp.v[i].len, start = dst->n;
		bool has = n >= p->a_len && memcmp(s, p->a, p->a_len) == 0;

		if (!has && (p->prepend == TOK_PREPEND_ALWAYS ||
			     (p->prepend == TOK_PREPEND_FIRST && section == 0 && i == 0)))
			if ((ret = tok_buf_put(dst, p->a, p->a_len)))
				return ret;
		for (size_t k = 0; k < n; k++)
			if ((ret = s[k] == ' ' ? tok_buf_put(dst, p->a, p->a_len)
					       : tok_buf_put(dst, s + k, 1)))
				return ret;
		if (!p->split) {
			if ((ret = tok_spans_push(&t->sp2, start, dst->n - start)))
				return ret;
			continue;
		}
		/* split before each replacement (MergedWithNext) */
		{
			size_t at = start;

			for (size_t k = start + 1; k + p->a_len <= dst->n; k++)
				if (memcmp(dst->p + k, p->a, p->a_len) == 0) {
					if ((ret = tok_spans_push(&t->sp2, at, k - at)))
						return ret;
					at = k;
				}
			if (dst->n > at && (ret = tok_spans_push(&t->sp2, at, dst->n - at)))
				return ret;
		}
	}
	swap_spans(t);
	*buf = dst;
	return 0;
}

static int pre_bytelevel(struct st_tokenizer *t, struct tok_pre *p, struct tok_buf **buf)
{
	struct tok_buf *src = *buf, *dst = src == &t->a ? &t->b : &t->a;
	int ret;

	if (p->add_prefix_space) {
		dst->n = 0;
		t->sp2.n = 0;
		for (size_t i = 0; i < t->sp.n; i++) {
			const char *s = src->p + t->sp.v[i].off;
			size_t n = t->sp.v[i].len, start = dst->n;

			if ((n == 0 || s[0] != ' ') && (ret = tok_buf_put(dst, " ", 1)))
				return ret;
			if ((ret = tok_buf_put(dst, s, n)) ||
			    (ret = tok_spans_push(&t->sp2, start, dst->n - start)))
				return ret;
		}
		swap_spans(t);
		*buf = dst;
		src = dst;
	}
	if (p->use_regex) {
		if ((ret = split_pieces(&p->re, TOK_SPLIT_ISOLATED, src->p, &t->sp, &t->sp2)))
			return ret;
		swap_spans(t);
	}
	return 0;
}

/* The added token of index (first, by_first) starting at s (the longest),
 * or NULL. */
static const struct tok_added *added_at(const struct st_tokenizer *t, const uint32_t *first,
					const uint32_t *by_first, bool norm, const char *s,
					size_t n)
{
	uint8_t b = (uint8_t)s[0];

	for (uint32_t k = first[b]; k < first[b + 1]; k++) {
		const struct tok_added *a = &t->added[by_first[k]];
		const char *c = norm ? a->ncontent : a->content;
		size_t len = norm ? a->nlen : a->len;

		if (len <= n && memcmp(c, s, len) == 0)
			return a;
	}
	return NULL;
}

/* Pre-tokenise buf->p[0..n) and run the model over the pieces. */
static int encode_pretok(struct st_tokenizer *t, struct tok_buf *buf, size_t n,
			 size_t section, struct st_tok_ids *out)
{
	size_t first = out->n;
	int ret;

	if (n == 0)
		return 0;
	t->sp.n = 0;
	if ((ret = tok_spans_push(&t->sp, 0, n)))
		return ret;
	for (size_t i = 0; i < t->n_pre; i++) {
		struct tok_pre *p = &t->pre[i];

		switch (p->kind) {
		case TOK_PRE_SPLIT:
			ret = split_pieces(&p->re, p->behavior, buf->p, &t->sp, &t->sp2);
			if (!ret)
				swap_spans(t);
			break;
		case TOK_PRE_BYTELEVEL:
			ret = pre_bytelevel(t, p, &buf);
			break;
		case TOK_PRE_METASPACE:
			ret = pre_metaspace(t, p, section, &buf);
			break;
		}
		if (ret)
			return ret;
	}
	for (size_t i = 0; i < t->sp.n; i++)
		if ((ret = tok_bpe_word(t->bpe, buf->p + t->sp.v[i].off, t->sp.v[i].len, out)))
			return ret;
	if (tok_bpe_fuse_unk(t->bpe) && tok_bpe_unk(t->bpe) >= 0) {
		uint32_t unk = (uint32_t)tok_bpe_unk(t->bpe);
		size_t w = first;

		for (size_t r = first; r < out->n; r++)
			if (!(out->ids[r] == unk && w > first && out->ids[w - 1] == unk))
				out->ids[w++] = out->ids[r];
		out->n = w;
	}
	return 0;
}

/* One section of text between the added tokens matched in the raw text:
 * normalise; split out the added tokens that match normalised text
 * (normalized: true, when there is a normalizer), as Hugging Face does;
 * pre-tokenise and BPE what is between. *section counts the sections so
 * far (a Metaspace prepend_scheme "first" looks at it). */
static int encode_section(struct st_tokenizer *t, const char *s, size_t n, size_t *section,
			  struct st_tok_ids *out)
{
	size_t pos = 0, start = 0;
	bool rstrip = false;
	const char *r = s;
	size_t rn = n;
	int ret;

	if (n == 0)
		return 0;
	if (t->n_norm && (ret = tok_normalize(t, s, n, &r, &rn)))
		return ret;
	if (rn == 0)
		return 0;
	if (!t->n_nadded) {
		if (r != t->a.p) {
			t->a.n = 0;
			if ((ret = tok_buf_put(&t->a, r, rn)))
				return ret;
		}
		ret = encode_pretok(t, &t->a, rn, *section, out);
		(*section)++;
		return ret;
	}
	/* the normalised text stays in ntext while its pieces go through a */
	t->ntext.n = 0;
	if ((ret = tok_buf_put(&t->ntext, r, rn)))
		return ret;
	r = t->ntext.p;
	while (pos <= rn) {
		const struct tok_added *a = pos < rn && t->nfirst[(uint8_t)r[pos] + 1] >
							t->nfirst[(uint8_t)r[pos]]
			? added_at(t, t->nfirst, t->nby_first, true, r + pos, rn - pos) : NULL;
		size_t b = start, e = pos;

		if (!a && pos < rn) {
			pos++;
			continue;
		}
		if (rstrip)
			b += tok_trim_start(r + b, e - b);
		if (a && a->lstrip)
			e = b + tok_trim_end(r + b, e - b);
		if (e > b) {
			t->a.n = 0;
			if ((ret = tok_buf_put(&t->a, r + b, e - b)) ||
			    (ret = encode_pretok(t, &t->a, e - b, *section, out)))
				return ret;
			(*section)++;
		}
		if (!a)
			break;
		if ((ret = tok_ids_push(out, a->id)))
			return ret;
		(*section)++;
		rstrip = a->rstrip;
		pos += a->nlen;
		start = pos;
	}
	return 0;
}

int st_tokenizer_encode(struct st_tokenizer *t, const char *text, size_t bytes,
			unsigned flags, struct st_tok_ids *out)
{
	size_t pos = 0, start = 0, section = 0;
	bool rstrip = false;
	int ret;

	if (!tok_utf8_valid(text, bytes)) {
		if ((ret = tok_utf8_sanitize(&t->text, text, bytes)))
			return ret;
		text = t->text.p;
		bytes = t->text.n;
	}
	if (flags & ST_TOK_ADD_SPECIAL)
		for (size_t i = 0; i < t->n_prefix; i++)
			if ((ret = tok_ids_push(out, t->prefix[i])))
				return ret;
	while (pos < bytes) {
		const struct tok_added *a = t->first[(uint8_t)text[pos] + 1] >
						    t->first[(uint8_t)text[pos]]
					    ? added_at(t, t->first, t->by_first, false, text + pos,
						       bytes - pos)
					    : NULL;
		size_t b, e;

		if (!a) {
			pos++;
			continue;
		}
		b = start;
		e = pos;
		if (rstrip)
			b += tok_trim_start(text + b, e - b);
		if (a->lstrip)
			e = b + tok_trim_end(text + b, e - b);
		if (pos > start) {
			size_t before = section;

			if ((ret = encode_section(t, text + b, e - b, &section, out)))
				return ret;
			/* a raw section counts once in the reference, even when it
			 * normalises or trims to nothing */
			if (section == before)
				section++;
		}
		if ((ret = tok_ids_push(out, a->id)))
			return ret;
		section++;
		rstrip = a->rstrip;
		pos += a->len;
		start = pos;
	}
	if (start < bytes) {
		size_t b = start + (rstrip ? tok_trim_start(text + start, bytes - start) : 0);

		if ((ret = encode_section(t, text + b, bytes - b, &section, out)))
			return ret;
	}
	if (flags & ST_TOK_ADD_SPECIAL)
		for (size_t i = 0; i < t->n_suffix; i++)
			if ((ret = tok_ids_push(out, t->suffix[i])))
				return ret;
	return 0;
}

int st_tokenizer_decode(const struct st_tokenizer *t, const uint32_t *ids, size_t n,
			unsigned flags, char **text, size_t *bytes)
{
	struct tok_buf out = { 0 };
	int ret = tok_decode_run(t, ids, n, flags, &out);

	if (!ret)
		ret = tok_buf_put(&out, "", 0);
	if (ret) {
		tok_buf_fini(&out);
		return ret;
	}
	*text = out.p;
	*bytes = out.n;
	return 0;
}

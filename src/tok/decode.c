/* Decoding: ids to their token strings, then tokenizer.json's decoders over
 * that list of strings in order, then the join and
 * clean_up_tokenization_spaces. */
#include "tok_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* A list of strings: item i is buf[sp.v[i]]; added[i] is set while item i
 * is still the text of one added token (ByteLevel passes those through). */
struct dlist {
	struct tok_buf buf;
	struct tok_spans sp;
	uint8_t *added;
	size_t added_cap;
};

static void dlist_fini(struct dlist *l)
{
	tok_buf_fini(&l->buf);
	tok_spans_fini(&l->sp);
	free(l->added);
}

static void dlist_clear(struct dlist *l)
{
	l->buf.n = 0;
	l->sp.n = 0;
}

/* Append an item made of the bytes added to buf since start. */
static int dlist_close(struct dlist *l, size_t start, bool added)
{
	int ret = tok_spans_push(&l->sp, start, l->buf.n - start);

	if (ret)
		return ret;
	if (l->sp.n > l->added_cap) {
		size_t cap = l->sp.cap;
		uint8_t *p = realloc(l->added, cap);

		if (!p)
			return st_error_set(-ENOMEM, "tokenizer: out of memory");
		l->added = p;
		l->added_cap = cap;
	}
	l->added[l->sp.n - 1] = added;
	return 0;
}

static int dlist_add(struct dlist *l, const char *s, size_t n, bool added)
{
	size_t start = l->buf.n;
	int ret = tok_buf_put(&l->buf, s, n);

	return ret ? ret : dlist_close(l, start, added);
}

/* buf += s with every occurrence of a replaced by b. */
static int put_replaced(struct tok_buf *buf, const char *s, size_t n, const char *a,
			size_t an, const char *b, size_t bn)
{
	size_t at = 0;
	int ret;

	if (an == 0)
		return tok_buf_put(buf, s, n);
	for (size_t i = 0; i + an <= n;) {
		if (memcmp(s + i, a, an) == 0) {
			if ((ret = tok_buf_put(buf, s + at, i - at)) ||
			    (ret = tok_buf_put(buf, b, bn)))
				return ret;
			i += an;
			at = i;
		} else
			i++;
	}
	return tok_buf_put(buf, s + at, n - at);
}

/* Bytes -> text as TextDecoder reads it (invalid UTF-8 to U+FFFD), or
 * as they are with ST_TOK_RAW. */
static int put_bytes_as_text(struct tok_buf *dst, const char *s, size_t n,
			     struct tok_buf *tmp, unsigned flags)
{
	int ret;

	if ((flags & ST_TOK_RAW) || tok_utf8_valid(s, n))
		return tok_buf_put(dst, s, n);
	if ((ret = tok_utf8_sanitize(tmp, s, n)))
		return ret;
	return tok_buf_put(dst, tmp->p, tmp->n);
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* "<0xNN>" -> NN, else -1 */
static int byte_token(const char *s, size_t n)
{
	int h, l;

	if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
		return -1;
	h = hexval(s[3]);
	l = hexval(s[4]);
	return h < 0 || l < 0 ? -1 : h * 16 + l;
}

static int step(const struct tok_dec *d, struct dlist *in, struct dlist *out,
		struct tok_buf *tmp, struct tok_buf *raw, unsigned flags)
{
	/* an empty list may have no buffer yet: its spans are all (0, 0) */
	const char *base = in->buf.p ? in->buf.p : "";
	int ret;

	dlist_clear(out);
	switch (d->kind) {
	case TOK_DEC_BYTELEVEL:
		/* runs of non-added tokens: characters to the bytes they stand
		 * for, then those bytes read as UTF-8 */
		for (size_t i = 0; i < in->sp.n;) {
			if (in->added[i]) {
				if ((ret = dlist_add(out, base + in->sp.v[i].off, in->sp.v[i].len,
						     true)))
					return ret;
				i++;
				continue;
			}
			raw->n = 0;
			for (; i < in->sp.n && !in->added[i]; i++) {
				const char *s = base + in->sp.v[i].off;
				size_t n = in->sp.v[i].len, k;

				for (size_t j = 0; j < n; j += k) {
					uint32_t cp = tok_utf8_get(s + j, n - j, &k);
					int b = tok_char_byte(cp);
					char c = (char)b;

					if (k > n - j)
						k = n - j;
					ret = b >= 0 ? tok_buf_put(raw, &c, 1)
						     : tok_buf_put(raw, s + j, k);
					if (ret)
						return ret;
				}
			}
			{
				size_t start = out->buf.n;

				if ((ret = put_bytes_as_text(&out->buf, raw->p, raw->n, tmp, flags)) ||
				    (ret = dlist_close(out, start, false)))
					return ret;
			}
		}
		return 0;
	case TOK_DEC_BYTEFALLBACK:
		for (size_t i = 0; i < in->sp.n;) {
			int b = byte_token(base + in->sp.v[i].off, in->sp.v[i].len);
			size_t start;

			if (b < 0) {
				if ((ret = dlist_add(out, base + in->sp.v[i].off, in->sp.v[i].len,
						     in->added[i])))
					return ret;
				i++;
				continue;
			}
			raw->n = 0;
			for (; i < in->sp.n &&
			       (b = byte_token(base + in->sp.v[i].off, in->sp.v[i].len)) >= 0;
			     i++) {
				char c = (char)b;

				if ((ret = tok_buf_put(raw, &c, 1)))
					return ret;
			}
			start = out->buf.n;
			if ((ret = put_bytes_as_text(&out->buf, raw->p, raw->n, tmp, flags)) ||
			    (ret = dlist_close(out, start, false)))
				return ret;
		}
		return 0;
	case TOK_DEC_FUSE: {
		size_t start = out->buf.n;

		for (size_t i = 0; i < in->sp.n; i++)
			if ((ret = tok_buf_put(&out->buf, base + in->sp.v[i].off, in->sp.v[i].len)))
				return ret;
		return dlist_close(out, start, false);
	}
	case TOK_DEC_REPLACE:
	case TOK_DEC_METASPACE:
		for (size_t i = 0; i < in->sp.n; i++) {
			const char *s = base + in->sp.v[i].off;
			size_t n = in->sp.v[i].len, start = out->buf.n;

			if (d->kind == TOK_DEC_REPLACE)
				ret = put_replaced(&out->buf, s, n, d->a, d->a_len, d->b, d->b_len);
			else
				ret = put_replaced(&out->buf, s, n, d->a, d->a_len, " ", 1);
			if (ret)
				return ret;
			if (d->kind == TOK_DEC_METASPACE && d->strip_first && i == 0 &&
			    out->buf.n > start && out->buf.p[start] == ' ') {
				memmove(out->buf.p + start, out->buf.p + start + 1,
					out->buf.n - start - 1);
				out->buf.n--;
			}
			if ((ret = dlist_close(out, start, false)))
				return ret;
		}
		return 0;
	case TOK_DEC_STRIP:
		for (size_t i = 0; i < in->sp.n; i++) {
			const char *s = base + in->sp.v[i].off;
			size_t n = in->sp.v[i].len, b = 0, e = n;

			for (int k = 0; k < d->start && b + d->a_len <= e &&
					memcmp(s + b, d->a, d->a_len) == 0; k++)
				b += d->a_len;
			for (int k = 0; k < d->stop && e >= b + d->a_len &&
					memcmp(s + e - d->a_len, d->a, d->a_len) == 0; k++)
				e -= d->a_len;
			if ((ret = dlist_add(out, s + b, e - b, false)))
				return ret;
		}
		return 0;
	}
	return 0;
}

/* clean_up_tokenization: the English spacing artefacts, in the order
 * Hugging Face removes them */
static int cleanup(struct tok_buf *text, struct tok_buf *tmp)
{
	static const char *const pairs[][2] = {
		{ " .", "." }, { " ?", "?" }, { " !", "!" }, { " ,", "," },
		{ " ' ", "'" }, { " n't", "n't" }, { " 'm", "'m" }, { " 's", "'s" },
		{ " 've", "'ve" }, { " 're", "'re" },
	};
	int ret;

	if (text->n == 0)
		return 0;
	for (size_t i = 0; i < ST_ARRAY_LEN(pairs); i++) {
		struct tok_buf swap;

		if (!memmem(text->p, text->n, pairs[i][0], strlen(pairs[i][0])))
			continue;
		tmp->n = 0;
		if ((ret = put_replaced(tmp, text->p, text->n, pairs[i][0], strlen(pairs[i][0]),
					pairs[i][1], strlen(pairs[i][1]))))
			return ret;
		swap = *text;
		*text = *tmp;
		*tmp = swap;
	}
	return 0;
}

int tok_decode_run(const struct st_tokenizer *t, const uint32_t *ids, size_t n,
		   unsigned flags, struct tok_buf *out)
{
	struct dlist l[2] = { 0 };
	struct tok_buf tmp = { 0 }, raw = { 0 };
	int cur = 0, ret = 0;

	out->n = 0;
	for (size_t i = 0; i < n && !ret; i++) {
		uint32_t id = ids[i];
		const char *s = NULL;
		size_t len = 0;
		bool added = false;

		if (id < t->n_ids && t->added_of[id]) {
			const struct tok_added *a = &t->added[t->added_of[id] - 1];

			s = a->content;
			len = a->len;
			added = true;
		} else
			s = tok_bpe_string(t->bpe, id, &len);
		if (!s)
			continue; /* no token: nothing */
		if ((flags & ST_TOK_SKIP_SPECIAL) && id < t->n_ids && t->special[id])
			continue;
		ret = dlist_add(&l[cur], s, len, added);
	}
	for (size_t k = 0; k < t->n_dec && !ret; k++) {
		ret = step(&t->dec[k], &l[cur], &l[cur ^ 1], &tmp, &raw, flags);
		cur ^= 1;
	}
	/* no decoder: the tokens joined by spaces, as Hugging Face does */
	for (size_t i = 0; i < l[cur].sp.n && !ret; i++) {
		if (t->n_dec == 0 && i)
			ret = tok_buf_put(out, " ", 1);
		if (!ret)
			ret = tok_buf_put(out, l[cur].buf.p + l[cur].sp.v[i].off,
					  l[cur].sp.v[i].len);
	}
	if (!ret && t->cleanup && !(flags & ST_TOK_NO_CLEANUP))
		ret = cleanup(out, &tmp);
	dlist_fini(&l[0]);
	dlist_fini(&l[1]);
	tok_buf_fini(&tmp);
	tok_buf_fini(&raw);
	return ret;
}

/* The BPE model: a vocabulary, merges by rank, and the merge loop.
 *
 * A word is split into symbols (bytes for a byte-level vocabulary, UTF-8
 * characters otherwise) kept as a doubly linked list over an array; every
 * adjacent pair that is a merge goes into a binary heap keyed by (rank,
 * position), so the lowest rank merges first and, among equal ranks, the
 * leftmost, as Hugging Face's tokenizers do. An entry is checked when it is
 * popped (both symbols still there with the ids it was made from), so a
 * merge only pushes the two pairs it creates: O(n log n) per word. Words
 * under 256 bytes are cached (a table cleared when full), which is what
 * makes real text fast: most words repeat. */
#include "tok_internal.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* a string -> id table over one of the two string sets, open addressing */
struct tok_map {
	uint32_t *slot; /* id + 1, 0 empty */
	uint32_t *hash; /* the key's hash, to skip most compares */
	size_t cap;     /* power of two */
};

struct merge_slot {
	uint64_t key;   /* left << 32 | right, ~0 empty */
	uint32_t rank;
	uint32_t id;    /* the merged token */
};

struct sym {
	int64_t id;     /* -1: no token */
	uint32_t off, len;
	int32_t prev, next;
};

struct cand {
	uint32_t rank;
	uint32_t pos;
	uint32_t left, right;
};

struct cache_slot {
	uint64_t hash;  /* 0 empty */
	uint32_t key_off, key_len;
	uint32_t ids_off, ids_n;
};

#define CACHE_SLOTS (1u << 18)
#define CACHE_WORD_MAX 256

struct tok_bpe {
	uint32_t n_vocab;         /* largest id + 1 */
	/* per id: the string as tokenizer.json writes it and the bytes the
	 * model matches (the same unless byte-level); offsets into pool */
	uint32_t *json_off, *json_len, *model_off, *model_len;
	struct tok_buf pool;
	struct tok_map by_json, by_model;

	struct merge_slot *merges;
	size_t merge_cap;

	bool byte_level, byte_fallback, fuse_unk, ignore_merges;
	/* no token holds U+2581 after another character: a SentencePiece
	 * word (no pre-tokenizer splits it) can be cut before each U+2581
	 * that follows another character without changing the result, and
	 * the pieces are cached */
	bool meta_split;
	int64_t unk;
	int64_t byte_id[256];     /* the single-byte symbols (byte-level) */
	int64_t fallback_id[256]; /* <0xNN> */

	/* scratch for one word */
	struct sym *syms;
	struct cand *heap;
	size_t syms_cap, heap_cap;

	/* the word cache */
	struct cache_slot *cache;
	size_t cache_used;
	struct tok_buf cache_keys;
	uint32_t *cache_ids;
	size_t cache_ids_n, cache_ids_cap;
};

static uint32_t hash32(const char *s, size_t n)
{
	uint32_t h = (uint32_t)XXH3_64bits(s, n);

	return h ? h : 1;
}

static const char *str_of(const struct tok_bpe *m, bool json, uint32_t id, size_t *len)
{
	if (json) {
		*len = m->json_len[id];
		return m->pool.p + m->json_off[id];
	}
	*len = m->model_len[id];
	return m->pool.p + m->model_off[id];
}

static int64_t map_find(const struct tok_bpe *m, const struct tok_map *map, bool json,
			const char *s, size_t n)
{
	uint32_t h = hash32(s, n);
	size_t mask = map->cap - 1, i = h & mask;

	for (;; i = (i + 1) & mask) {
		uint32_t e = map->slot[i];
		size_t len;
		const char *k;

		if (!e)
			return -1;
		if (map->hash[i] != h)
			continue;
		k = str_of(m, json, e - 1, &len);
		if (len == n && memcmp(k, s, n) == 0)
			return e - 1;
	}
}

/* Insert id under its string; the first id of a string wins. */
static void map_add(struct tok_bpe *m, struct tok_map *map, bool json, uint32_t id)
{
	size_t n;
	const char *s = str_of(m, json, id, &n);
	uint32_t h = hash32(s, n);
	size_t mask = map->cap - 1, i = h & mask;

	for (;; i = (i + 1) & mask) {
		uint32_t e = map->slot[i];
		size_t len;
		const char *k;

		if (!e) {
			map->slot[i] = id + 1;
			map->hash[i] = h;
			return;
		}
		if (map->hash[i] != h)
			continue;
		k = str_of(m, json, e - 1, &len);
		if (len == n && memcmp(k, s, n) == 0)
			return;
	}
}

static size_t pow2_at_least(size_t n)
{
	size_t c = 16;

	while (c < n)
		c *= 2;
	return c;
}

static int map_init(struct tok_map *map, size_t n)
{
	map->cap = pow2_at_least(n * 2);
	map->slot = calloc(map->cap, sizeof(*map->slot));
	map->hash = calloc(map->cap, sizeof(*map->hash));
	if (!map->slot || !map->hash)
		return st_error_set(-ENOMEM, "tokenizer: out of memory");
	return 0;
}

/* The bytes a byte-level string stands for, appended to b; a character
 * outside the alphabet keeps its UTF-8 (it can then match no byte). */
static int to_model_bytes(struct tok_buf *b, const char *s, size_t n)
{
	size_t i = 0, k;
	int ret;

	while (i < n) {
		uint32_t cp = tok_utf8_get(s + i, n - i, &k);
		int byte = tok_char_byte(cp);

		if (byte >= 0) {
			char c = (char)byte;

			ret = tok_buf_put(b, &c, 1);
		} else
			ret = tok_buf_put(b, s + i, k);
		if (ret)
			return ret;
		i += k;
	}
	return 0;
}

static bool jbool(struct json_object *o, const char *key, bool dflt)
{
	struct json_object *v;

	if (!json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null))
		return dflt;
	return json_object_get_boolean(v);
}

/* A string key that must be absent, null or "" (a feature not built). */
static int refuse_nonempty(struct json_object *model, const char *key, const char *file)
{
	struct json_object *v;

	if (!json_object_object_get_ex(model, key, &v) || json_object_is_type(v, json_type_null))
		return 0;
	if (json_object_is_type(v, json_type_string) && json_object_get_string_len(v) == 0)
		return 0;
	return st_error_set(-EINVAL, "%s: model.%s: %s is not supported", file, key,
			    json_object_to_json_string(v));
}

/* Fibonacci hashing of a pair: inline, and the high bits are well mixed */
static inline size_t pair_slot(uint64_t key, size_t mask)
{
	return (size_t)((key * 0x9e3779b97f4a7c15ull) >> 29) & mask;
}

static int merge_add(struct tok_bpe *m, uint32_t left, uint32_t right, uint32_t rank,
		     uint32_t id)
{
	uint64_t key = (uint64_t)left << 32 | right;
	size_t mask = m->merge_cap - 1, i = pair_slot(key, mask);

	for (;; i = (i + 1) & mask) {
		if (m->merges[i].key == ~0ull) {
			m->merges[i] = (struct merge_slot){ key, rank, id };
			return 0;
		}
		if (m->merges[i].key == key) {
			/* a repeated merge: the last line wins, as in Hugging
			 * Face's tokenizers (a map filled in order) and the JS
			 * reference */
			m->merges[i].rank = rank;
			m->merges[i].id = id;
			return 0;
		}
	}
}

static inline const struct merge_slot *merge_find(const struct tok_bpe *m, uint32_t left,
						  uint32_t right)
{
	uint64_t key = (uint64_t)left << 32 | right;
	size_t mask = m->merge_cap - 1, i = pair_slot(key, mask);

	for (;; i = (i + 1) & mask) {
		if (m->merges[i].key == key)
			return &m->merges[i];
		if (m->merges[i].key == ~0ull)
			return NULL;
	}
}

/* One merge of tokenizer.json: "a b" (before tokenizers 0.20) or ["a", "b"]. */
static int merge_parts(struct json_object *e, const char **a, size_t *al, const char **b,
		       size_t *bl)
{
	if (json_object_is_type(e, json_type_string)) {
		const char *s = json_object_get_string(e), *sp = strchr(s, ' ');

		if (!sp)
			return -1;
		*a = s;
		*al = (size_t)(sp - s);
		*b = sp + 1;
		*bl = strlen(sp + 1);
		return 0;
	}
	if (json_object_is_type(e, json_type_array) && json_object_array_length(e) == 2) {
		struct json_object *x = json_object_array_get_idx(e, 0);
		struct json_object *y = json_object_array_get_idx(e, 1);

		if (!json_object_is_type(x, json_type_string) ||
		    !json_object_is_type(y, json_type_string))
			return -1;
		*a = json_object_get_string(x);
		*al = (size_t)json_object_get_string_len(x);
		*b = json_object_get_string(y);
		*bl = (size_t)json_object_get_string_len(y);
		return 0;
	}
	return -1;
}

static int64_t model_lookup(const struct tok_bpe *m, const char *s, size_t n)
{
	return map_find(m, &m->by_model, false, s, n);
}

int tok_bpe_create(struct json_object *model, bool byte_level, const char *file,
		   struct tok_bpe **out)
{
	struct json_object *vocab, *merges, *v;
	struct tok_bpe *m;
	struct tok_buf tmp = { 0 };
	size_t n_merges;
	int ret;

	*out = NULL;
	if (!json_object_object_get_ex(model, "vocab", &vocab) ||
	    !json_object_is_type(vocab, json_type_object))
		return st_error_set(-EINVAL, "%s: model.vocab: missing or not an object", file);
	if (!json_object_object_get_ex(model, "merges", &merges) ||
	    !json_object_is_type(merges, json_type_array))
		return st_error_set(-EINVAL, "%s: model.merges: missing or not an array", file);
	if ((ret = refuse_nonempty(model, "continuing_subword_prefix", file)) ||
	    (ret = refuse_nonempty(model, "end_of_word_suffix", file)))
		return ret;
	if (json_object_object_get_ex(model, "dropout", &v) &&
	    !json_object_is_type(v, json_type_null) && json_object_get_double(v) != 0)
		return st_error_set(-EINVAL, "%s: model.dropout: %s is not supported (encoding "
				    "would not be deterministic)", file,
				    json_object_to_json_string(v));
	m = calloc(1, sizeof(*m));
	if (!m)
		return st_error_set(-ENOMEM, "tokenizer: out of memory");
	m->byte_level = byte_level;
	m->byte_fallback = jbool(model, "byte_fallback", false);
	m->fuse_unk = jbool(model, "fuse_unk", false);
	m->ignore_merges = jbool(model, "ignore_merges", false);
	m->unk = -1;

	/* ids and strings */
	{
		uint32_t max_id = 0;
		size_t count = 0;

		json_object_object_foreach(vocab, key, val) {
			int64_t id;

			(void)key;
			if (!json_object_is_type(val, json_type_int) ||
			    (id = json_object_get_int64(val)) < 0 || id >= (1ll << 31)) {
				char pk[48];

				ret = st_error_set(-EINVAL, "%s: model.vocab[\"%s\"]: the id must "
						   "be an integer in [0, 2^31)", file,
						   tok_printable(key, strlen(key), pk, sizeof(pk)));
				goto fail;
			}
			if ((uint32_t)id > max_id)
				max_id = (uint32_t)id;
			count++;
		}
		if (count == 0) {
			ret = st_error_set(-EINVAL, "%s: model.vocab is empty", file);
			goto fail;
		}
		if (max_id >= 16u * 1024 * 1024) {
			ret = st_error_set(-EINVAL, "%s: model.vocab: id %u is past 2^24; not a "
					   "vocabulary strata takes", file, max_id);
			goto fail;
		}
		m->n_vocab = max_id + 1;
		m->json_off = calloc(m->n_vocab, sizeof(uint32_t));
		m->json_len = calloc(m->n_vocab, sizeof(uint32_t));
		m->model_off = calloc(m->n_vocab, sizeof(uint32_t));
		m->model_len = calloc(m->n_vocab, sizeof(uint32_t));
		if (!m->json_off || !m->json_len || !m->model_off || !m->model_len ||
		    tok_buf_put(&m->pool, "", 0)) {
			ret = st_error_set(-ENOMEM, "tokenizer: out of memory");
			goto fail;
		}
		/* offset 0 is an empty string: ids the vocabulary skips */
		if ((ret = tok_buf_put(&m->pool, "\0", 1)))
			goto fail;
		json_object_object_foreach(vocab, key2, val2) {
			uint32_t id = (uint32_t)json_object_get_int64(val2);
			size_t klen = strlen(key2);

			if (m->json_len[id] || m->model_len[id]) {
				ret = st_error_set(-EINVAL, "%s: model.vocab: id %u is given to "
						   "two strings", file, id);
				goto fail;
			}
			if (m->pool.n + klen * 2 + 2 > UINT32_MAX) {
				ret = st_error_set(-EINVAL, "%s: model.vocab is too large", file);
				goto fail;
			}
			m->json_off[id] = (uint32_t)m->pool.n;
			m->json_len[id] = (uint32_t)klen;
			if ((ret = tok_buf_put(&m->pool, key2, klen + 1)))
				goto fail;
			if (byte_level) {
				size_t at = m->pool.n;

				if ((ret = to_model_bytes(&m->pool, key2, klen)))
					goto fail;
				m->model_off[id] = (uint32_t)at;
				m->model_len[id] = (uint32_t)(m->pool.n - at);
			} else {
				m->model_off[id] = m->json_off[id];
				m->model_len[id] = m->json_len[id];
			}
		}
		if ((ret = map_init(&m->by_json, count)) || (ret = map_init(&m->by_model, count)))
			goto fail;
		for (uint32_t id = 0; id < m->n_vocab; id++) {
			if (!m->json_len[id])
				continue;
			map_add(m, &m->by_json, true, id);
			map_add(m, &m->by_model, false, id);
		}
	}

	if (!byte_level && map_find(m, &m->by_model, false, "\xe2\x96\x81", 3) >= 0) {
		m->meta_split = true;
		for (uint32_t id = 0; id < m->n_vocab && m->meta_split; id++) {
			const char *t = m->pool.p + m->model_off[id];
			size_t len = m->model_len[id];

			for (size_t i = 1; i + 3 <= len; i++)
				if (memcmp(t + i, "\xe2\x96\x81", 3) == 0 &&
				    !(i >= 3 && memcmp(t + i - 3, "\xe2\x96\x81", 3) == 0) &&
				    ((uint8_t)t[i] & 0xc0) != 0x80) {
					m->meta_split = false;
					break;
				}
		}
	}

	/* merges: ids of both parts and of the result, by rank */
	n_merges = json_object_array_length(merges);
	m->merge_cap = pow2_at_least(n_merges * 2 + 1);
	m->merges = malloc(m->merge_cap * sizeof(*m->merges));
	if (!m->merges) {
		ret = st_error_set(-ENOMEM, "tokenizer: out of memory");
		goto fail;
	}
	memset(m->merges, 0xff, m->merge_cap * sizeof(*m->merges));
	for (size_t r = 0; r < n_merges; r++) {
		const char *a, *b;
		size_t al, bl;
		int64_t ia, ib, ic;

		if (merge_parts(json_object_array_get_idx(merges, r), &a, &al, &b, &bl)) {
			ret = st_error_set(-EINVAL, "%s: model.merges[%zu]: expected \"a b\" or "
					   "[\"a\", \"b\"]", file, r);
			goto fail;
		}
		tmp.n = 0;
		if (byte_level) {
			size_t a_end;

			if ((ret = to_model_bytes(&tmp, a, al)))
				goto fail;
			a_end = tmp.n;
			if ((ret = to_model_bytes(&tmp, b, bl)))
				goto fail;
			ia = model_lookup(m, tmp.p, a_end);
			ib = model_lookup(m, tmp.p + a_end, tmp.n - a_end);
		} else {
			if ((ret = tok_buf_put(&tmp, a, al)) || (ret = tok_buf_put(&tmp, b, bl)))
				goto fail;
			ia = model_lookup(m, a, al);
			ib = model_lookup(m, b, bl);
		}
		ic = model_lookup(m, tmp.p, tmp.n);
		/* a merge whose parts or result are not tokens can never apply */
		if (ia < 0 || ib < 0 || ic < 0)
			continue;
		merge_add(m, (uint32_t)ia, (uint32_t)ib, (uint32_t)r, (uint32_t)ic);
	}
	tok_buf_fini(&tmp);

	if (json_object_object_get_ex(model, "unk_token", &v) &&
	    json_object_is_type(v, json_type_string)) {
		m->unk = map_find(m, &m->by_json, true, json_object_get_string(v),
				  (size_t)json_object_get_string_len(v));
	}
	for (unsigned b = 0; b < 256; b++) {
		char name[8], c = (char)b;

		snprintf(name, sizeof(name), "<0x%02X>", b);
		m->fallback_id[b] = map_find(m, &m->by_json, true, name, 6);
		m->byte_id[b] = model_lookup(m, &c, 1);
	}
	/* the cache (6 MiB) comes with the first word: opening stays cheap */
	*out = m;
	return 0;
fail:
	tok_buf_fini(&tmp);
	tok_bpe_destroy(m);
	return ret;
}

void tok_bpe_destroy(struct tok_bpe *m)
{
	if (!m)
		return;
	free(m->json_off);
	free(m->json_len);
	free(m->model_off);
	free(m->model_len);
	tok_buf_fini(&m->pool);
	free(m->by_json.slot);
	free(m->by_json.hash);
	free(m->by_model.slot);
	free(m->by_model.hash);
	free(m->merges);
	free(m->syms);
	free(m->heap);
	free(m->cache);
	tok_buf_fini(&m->cache_keys);
	free(m->cache_ids);
	free(m);
}

uint32_t tok_bpe_vocab(const struct tok_bpe *m)
{
	return m->n_vocab;
}

int64_t tok_bpe_lookup(const struct tok_bpe *m, const char *s, size_t n)
{
	return map_find(m, &m->by_json, true, s, n);
}

const char *tok_bpe_string(const struct tok_bpe *m, uint32_t id, size_t *len)
{
	if (id >= m->n_vocab || !m->json_len[id])
		return NULL;
	return str_of(m, true, id, len);
}

int64_t tok_bpe_unk(const struct tok_bpe *m)
{
	return m->unk;
}

bool tok_bpe_fuse_unk(const struct tok_bpe *m)
{
	return m->fuse_unk;
}

/* --- the heap ------------------------------------------------------------------ */

static inline bool cand_less(const struct cand *a, const struct cand *b)
{
	return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct cand *h, size_t *n, struct cand c)
{
	size_t i = (*n)++;

	while (i > 0) {
		size_t p = (i - 1) / 2;

		if (!cand_less(&c, &h[p]))
			break;
		h[i] = h[p];
		i = p;
	}
	h[i] = c;
}

static struct cand heap_pop(struct cand *h, size_t *n)
{
	struct cand top = h[0], last = h[--(*n)];
	size_t i = 0;

	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, s = i;
		const struct cand *best = &last;

		if (l < *n && cand_less(&h[l], best)) {
			s = l;
			best = &h[l];
		}
		if (r < *n && cand_less(&h[r], best))
			s = r;
		if (s == i)
			break;
		h[i] = h[s];
		i = s;
	}
	if (*n)
		h[i] = last;
	return top;
}

/* Push the pair (pos, next of pos) when it is a merge. */
static inline void consider(struct tok_bpe *m, size_t *nh, int32_t pos)
{
	const struct sym *s = m->syms;
	const struct merge_slot *ms;
	int32_t nx;

	if (pos < 0 || (nx = s[pos].next) < 0 || s[pos].id < 0 || s[nx].id < 0)
		return;
	ms = merge_find(m, (uint32_t)s[pos].id, (uint32_t)s[nx].id);
	if (ms)
		heap_push(m->heap, nh, (struct cand){ ms->rank, (uint32_t)pos,
						       (uint32_t)s[pos].id, (uint32_t)s[nx].id });
}

/* --- the cache ------------------------------------------------------------------ */

static void cache_clear(struct tok_bpe *m)
{
	memset(m->cache, 0, CACHE_SLOTS * sizeof(*m->cache));
	m->cache_used = 0;
	m->cache_keys.n = 0;
	m->cache_ids_n = 0;
}

static const struct cache_slot *cache_get(const struct tok_bpe *m, const char *w, size_t n,
					  uint64_t h)
{
	size_t i = h & (CACHE_SLOTS - 1);

	if (!m->cache)
		return NULL;
	for (;; i = (i + 1) & (CACHE_SLOTS - 1)) {
		const struct cache_slot *c = &m->cache[i];

		if (!c->hash)
			return NULL;
		if (c->hash == h && c->key_len == n &&
		    memcmp(m->cache_keys.p + c->key_off, w, n) == 0)
			return c;
	}
}

static void cache_put(struct tok_bpe *m, const char *w, size_t n, uint64_t h,
		      const uint32_t *ids, size_t k)
{
	size_t i;

	if (!m->cache && !(m->cache = calloc(CACHE_SLOTS, sizeof(*m->cache))))
		return; /* no cache: every word is merged */
	if (m->cache_used >= CACHE_SLOTS / 2 || m->cache_ids_n + k > (1u << 22))
		cache_clear(m);
	if (m->cache_ids_n + k > m->cache_ids_cap) {
		size_t cap = m->cache_ids_cap ? m->cache_ids_cap * 2 : 4096;
		uint32_t *p;

		while (cap < m->cache_ids_n + k)
			cap *= 2;
		p = realloc(m->cache_ids, cap * sizeof(*p));
		if (!p)
			return; /* a cache that cannot grow just misses */
		m->cache_ids = p;
		m->cache_ids_cap = cap;
	}
	if (tok_buf_reserve(&m->cache_keys, n))
		return;
	for (i = h & (CACHE_SLOTS - 1); m->cache[i].hash; i = (i + 1) & (CACHE_SLOTS - 1))
		;
	m->cache[i] = (struct cache_slot){ h, (uint32_t)m->cache_keys.n, (uint32_t)n,
					   (uint32_t)m->cache_ids_n, (uint32_t)k };
	memcpy(m->cache_keys.p + m->cache_keys.n, w, n);
	m->cache_keys.n += n;
	memcpy(m->cache_ids + m->cache_ids_n, ids, k * sizeof(*ids));
	m->cache_ids_n += k;
	m->cache_used++;
}

/* --- one word -------------------------------------------------------------------- */

static int grow(struct tok_bpe *m, size_t n)
{
	if (n > m->syms_cap) {
		size_t cap = pow2_at_least(n);
		struct sym *s = realloc(m->syms, cap * sizeof(*s));

		if (!s)
			return st_error_set(-ENOMEM, "tokenizer: out of memory");
		m->syms = s;
		m->syms_cap = cap;
	}
	/* every merge pushes at most 2: n + 2n entries at most */
	if (3 * n > m->heap_cap) {
		size_t cap = pow2_at_least(3 * n);
		struct cand *h = realloc(m->heap, cap * sizeof(*h));

		if (!h)
			return st_error_set(-ENOMEM, "tokenizer: out of memory");
		m->heap = h;
		m->heap_cap = cap;
	}
	return 0;
}

/* The ids of a symbol that is no token: its bytes as <0xNN> when the model
 * falls back to bytes and has them all, else unk. */
static int emit_unknown(struct tok_bpe *m, const char *s, size_t n, struct st_tok_ids *out)
{
	int ret;

	if (m->byte_fallback) {
		bool all = true;

		for (size_t i = 0; i < n; i++)
			all = all && m->fallback_id[(uint8_t)s[i]] >= 0;
		if (all) {
			for (size_t i = 0; i < n; i++)
				if ((ret = tok_ids_push(out, (uint32_t)m->fallback_id[(uint8_t)s[i]])))
					return ret;
			return 0;
		}
	}
	if (m->unk < 0) {
		char pk[48];

		return st_error_set(-EINVAL, "tokenizer: \"%s\" has no token and the model "
				    "has no unk_token", tok_printable(s, n, pk, sizeof(pk)));
	}
	return tok_ids_push(out, (uint32_t)m->unk);
}

static int word_one(struct tok_bpe *m, const char *w, size_t n, struct st_tok_ids *out);

/* Words of at most this many symbols merge by a scan for the lowest rank
 * over an array of the adjacent pairs' ranks (two entries change a merge):
 * fewer lookups and no heap for the short words that most text is. */
#define SHORT_WORD 48

static void merge_short(struct tok_bpe *m, size_t nsym)
{
	struct sym *s = m->syms;
	uint32_t rank[SHORT_WORD], id[SHORT_WORD];
	int32_t at[SHORT_WORD]; /* live symbols in order */
	size_t n = nsym;

	for (size_t i = 0; i < n; i++)
		at[i] = (int32_t)i;
	for (size_t i = 0; i + 1 < n; i++) {
		const struct merge_slot *ms = s[i].id >= 0 && s[i + 1].id >= 0
			? merge_find(m, (uint32_t)s[i].id, (uint32_t)s[i + 1].id) : NULL;

		rank[i] = ms ? ms->rank : UINT32_MAX;
		id[i] = ms ? ms->id : 0;
	}
	while (n > 1) {
		size_t best = 0;

		for (size_t i = 1; i + 1 < n; i++)
			if (rank[i] < rank[best])
				best = i;
		if (rank[best] == UINT32_MAX)
			break;
		/* at[best] absorbs at[best + 1] */
		{
			struct sym *l = &s[at[best]], *r = &s[at[best + 1]];

			l->id = id[best];
			l->len += r->len;
			r->len = 0;
			l->next = r->next;
			if (l->next >= 0)
				s[l->next].prev = at[best];
		}
		memmove(at + best + 1, at + best + 2, (n - best - 2) * sizeof(*at));
		memmove(rank + best, rank + best + 1, (n - best - 2) * sizeof(*rank));
		memmove(id + best, id + best + 1, (n - best - 2) * sizeof(*id));
		n--;
		for (size_t k = best ? best - 1 : 0; k <= best && k + 1 < n; k++) {
			const struct sym *a = &s[at[k]], *b = &s[at[k + 1]];
			const struct merge_slot *ms = a->id >= 0 && b->id >= 0
				? merge_find(m, (uint32_t)a->id, (uint32_t)b->id) : NULL;

			rank[k] = ms ? ms->rank : UINT32_MAX;
			id[k] = ms ? ms->id : 0;
		}
	}
}

int tok_bpe_word(struct tok_bpe *m, const char *w, size_t n, struct st_tok_ids *out)
{
	size_t at = 0;
	int ret;

	if (!m->meta_split || n < 4)
		return word_one(m, w, n, out);
	for (size_t i = 1; i + 3 <= n; i++)
		if (memcmp(w + i, "\xe2\x96\x81", 3) == 0 &&
		    !(i >= 3 && memcmp(w + i - 3, "\xe2\x96\x81", 3) == 0)) {
			if ((ret = word_one(m, w + at, i - at, out)))
				return ret;
			at = i;
			i += 2;
		}
	return word_one(m, w + at, n - at, out);
}

static int word_one(struct tok_bpe *m, const char *w, size_t n, struct st_tok_ids *out)
{
	size_t first = out->n, nsym = 0, nh = 0, i, k;
	uint64_t h = 0;
	int64_t whole;
	int ret;

	if (n == 0)
		return 0;
	if (n < CACHE_WORD_MAX) {
		const struct cache_slot *c;

		h = XXH3_64bits(w, n) | 1;
		c = cache_get(m, w, n, h);
		if (c) {
			for (i = 0; i < c->ids_n; i++)
				if ((ret = tok_ids_push(out, m->cache_ids[c->ids_off + i])))
					return ret;
			return 0;
		}
	}
	if (m->ignore_merges && (whole = model_lookup(m, w, n)) >= 0) {
		if ((ret = tok_ids_push(out, (uint32_t)whole)))
			return ret;
		goto done;
	}
	if ((ret = grow(m, n)))
		return ret;
	for (i = 0; i < n; i += k) {
		struct sym *s = &m->syms[nsym];

		if (m->byte_level) {
			k = 1;
			s->id = m->byte_id[(uint8_t)w[i]];
		} else {
			(void)tok_utf8_get(w + i, n - i, &k);
			if (k > n - i)
				k = n - i;
			s->id = model_lookup(m, w + i, k);
		}
		s->off = (uint32_t)i;
		s->len = (uint32_t)k;
		s->prev = (int32_t)nsym - 1;
		s->next = (int32_t)nsym + 1;
		nsym++;
	}
	m->syms[nsym - 1].next = -1;
	if (nsym <= SHORT_WORD) {
		merge_short(m, nsym);
		goto emit;
	}
	for (i = 0; i + 1 < nsym; i++)
		consider(m, &nh, (int32_t)i);
	while (nh) {
		struct cand c = heap_pop(m->heap, &nh);
		struct sym *s = m->syms;
		int32_t p = (int32_t)c.pos, nx = s[p].next;
		const struct merge_slot *ms;

		if (s[p].len == 0 || nx < 0 || s[p].id != (int64_t)c.left ||
		    s[nx].id != (int64_t)c.right)
			continue; /* stale: one side has merged since */
		ms = merge_find(m, c.left, c.right);
		s[p].id = ms->id;
		s[p].len += s[nx].len;
		s[nx].len = 0;
		s[p].next = s[nx].next;
		if (s[p].next >= 0)
			s[s[p].next].prev = p;
		consider(m, &nh, s[p].prev);
		consider(m, &nh, p);
	}
emit:
	for (int32_t p = 0; p >= 0; p = m->syms[p].next) {
		const struct sym *s = &m->syms[p];

		ret = s->id >= 0 ? tok_ids_push(out, (uint32_t)s->id)
				 : emit_unknown(m, w + s->off, s->len, out);
		if (ret)
			return ret;
	}
done:
	if (n < CACHE_WORD_MAX)
		cache_put(m, w, n, h, out->ids + first, out->n - first);
	return 0;
}

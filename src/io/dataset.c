/* Token files (raw bytes, llm.c shards) and the deterministic batch sampler.
 * Files are mmapped: a 10 GB shard costs nothing until a window touches it. */
#include "strata/dataset.h"

#include "strata/file.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "st_dataset_write_llmc writes host uint16 as little-endian"
#endif

#define ST_LLMC_HEADER_BYTES (ST_LLMC_HEADER_INTS * 4)

struct st_dataset {
	char *path;
	enum st_dataset_format format;
	void *map;
	size_t map_bytes;
	const uint8_t *tokens;  /* first token in the map */
	unsigned tok_bytes;     /* 1 (bytes), 2 (llm.c uint16) or 4 (uint32), LE */
	uint64_t n_tokens;
	uint32_t max_token;
	struct st_shard_ext ext; /* pointers into map */
	bool owned;             /* map is malloc'd (st_dataset_concat) */
};

static inline uint32_t tok(const struct st_dataset *ds, uint64_t i)
{
	if (ds->tok_bytes == 1)
		return ds->tokens[i];
	if (ds->tok_bytes == 4)
		return (uint32_t)ds->tokens[4 * i] |
		       (uint32_t)ds->tokens[4 * i + 1] << 8 |
		       (uint32_t)ds->tokens[4 * i + 2] << 16 |
		       (uint32_t)ds->tokens[4 * i + 3] << 24;
	return (uint32_t)ds->tokens[2 * i] |
	       (uint32_t)ds->tokens[2 * i + 1] << 8;
}

static int32_t le32(const uint8_t *p)
{
	return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 |
			 (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);

	return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Validates the llm.c header against the file size; sets the token width
 * (2: GPT-2's uint16 shards, 4: the uint32 ones llm.c writes for Llama 3). */
static uint64_t le64(const uint8_t *p)
{
	return (uint64_t)(uint32_t)le32(p) | (uint64_t)(uint32_t)le32(p + 4) << 32;
}

static uint64_t pad8(uint64_t x)
{
	return (x + 7) & ~(uint64_t)7;
}

/* Where the trailer's parts start, for n tokens of w bytes and flags. */
static void trailer_layout(unsigned w, uint64_t n, uint32_t flags,
			   uint64_t n_docs, uint64_t *mask_off,
			   uint64_t *docs_off, uint64_t *end)
{
	uint64_t off = ST_LLMC_HEADER_BYTES + (uint64_t)w * n;

	*mask_off = off;
	if (flags & ST_SHARD_MASK)
		off += n;
	if (flags & ST_SHARD_DOCS) {
		off = pad8(off);
		*docs_off = off;
		off += 8 * n_docs;
	} else {
		*docs_off = off;
	}
	*end = off;
}

/* The extension's header fields; the trailer's size they imply. */
static int ext_check(const char *path, const uint8_t *hdr, unsigned w,
		     uint64_t n, uint64_t file_bytes, uint32_t *flags,
		     uint64_t *n_docs, uint64_t *hash)
{
	uint64_t mask_off, docs_off, end;

	*flags = 0;
	*n_docs = 0;
	*hash = 0;
	if ((uint32_t)le32(hdr + 12) != ST_SHARD_EXT_MAGIC)
		return 0;
	*flags = (uint32_t)le32(hdr + 16);
	*hash = le64(hdr + 20);
	*n_docs = le64(hdr + 28);
	if (*flags & ~(ST_SHARD_MASK | ST_SHARD_DOCS))
		return st_error_set(-EINVAL, "%s: unknown shard flags 0x%x "
				    "(a newer strata wrote it?)", path, *flags);
	if (!(*flags & ST_SHARD_DOCS) && *n_docs)
		return st_error_set(-EINVAL, "%s: %llu documents but no "
				    "document flag", path,
				    (unsigned long long)*n_docs);
	if (*n_docs > n)
		return st_error_set(-EINVAL, "%s: %llu documents in %llu "
				    "tokens", path, (unsigned long long)*n_docs,
				    (unsigned long long)n);
	trailer_layout(w, n, *flags, *n_docs, &mask_off, &docs_off, &end);
	if (file_bytes != end)
		return st_error_set(-EINVAL, "%s: header says %llu tokens%s%s "
				    "(%llu bytes) but the file is %llu bytes",
				    path, (unsigned long long)n,
				    *flags & ST_SHARD_MASK ? ", a mask" : "",
				    *flags & ST_SHARD_DOCS ? ", documents" : "",
				    (unsigned long long)end,
				    (unsigned long long)file_bytes);
	return 0;
}

static int llmc_check(const char *path, int fd, uint64_t file_bytes,
		      uint64_t *n_tokens, unsigned *tok_bytes,
		      uint32_t *flags, uint64_t *n_docs, uint64_t *hash)
{
	uint8_t hdr[ST_LLMC_HEADER_BYTES];
	int32_t magic, version, count;
	int err;

	if (file_bytes < ST_LLMC_HEADER_BYTES)
		return st_error_set(-EINVAL, "%s: file is %llu bytes, shorter "
				    "than the %d-byte llm.c shard header",
				    path, (unsigned long long)file_bytes,
				    ST_LLMC_HEADER_BYTES);
	err = st_file_pread_full(fd, hdr, sizeof(hdr), 0, path);
	if (err)
		return err;
	magic = le32(hdr);
	version = le32(hdr + 4);
	count = le32(hdr + 8);
	if (magic != ST_LLMC_MAGIC && magic != ST_LLMC32_MAGIC)
		return st_error_set(-EINVAL, "%s: bad magic %d, expected %d "
				    "or %d for an llm.c token shard", path, magic,
				    ST_LLMC_MAGIC, ST_LLMC32_MAGIC);
	if (magic == ST_LLMC_MAGIC && version != ST_LLMC_VERSION)
		return st_error_set(-EINVAL, "%s: unsupported llm.c shard "
				    "version %d, expected %d (uint16 tokens)",
				    path, version, ST_LLMC_VERSION);
	if (magic == ST_LLMC32_MAGIC && version != ST_LLMC32_VERSION)
		return st_error_set(-EINVAL, "%s: unsupported llm.c shard "
				    "version %d, expected %d (uint32 tokens)",
				    path, version, ST_LLMC32_VERSION);
	*tok_bytes = magic == ST_LLMC32_MAGIC ? 4 : 2;
	if (count <= 0)
		return st_error_set(-EINVAL, "%s: header says %d tokens", path,
				    count);
	if ((uint32_t)le32(hdr + 12) == ST_SHARD_EXT_MAGIC) {
		*n_tokens = (uint64_t)count;
		return ext_check(path, hdr, *tok_bytes, *n_tokens, file_bytes,
				 flags, n_docs, hash);
	}
	*flags = 0;
	*n_docs = 0;
	*hash = 0;
	if (file_bytes - ST_LLMC_HEADER_BYTES != *tok_bytes * (uint64_t)count)
		return st_error_set(-EINVAL, "%s: header says %d tokens (%llu "
				    "bytes) but the file holds %llu bytes of "
				    "tokens", path, count,
				    *tok_bytes * (unsigned long long)count,
				    (unsigned long long)(file_bytes -
							 ST_LLMC_HEADER_BYTES));
	*n_tokens = (uint64_t)count;
	return 0;
}

static int ext_valid(const char *path, uint64_t n, const struct st_shard_ext *ext)
{
	if (!ext)
		return 0;
	for (uint64_t i = 0; ext->mask && i < n; i++)
		if (ext->mask[i] > 1)
			return st_error_set(-EINVAL, "%s: mask byte %llu is %u, "
					    "not 0 or 1", path,
					    (unsigned long long)i, ext->mask[i]);
	for (uint64_t d = 0; ext->doc_starts && d < ext->n_docs; d++) {
		uint64_t s = ext->doc_starts[d];

		if ((d == 0 && s != 0) || s >= n ||
		    (d && s <= ext->doc_starts[d - 1]))
			return st_error_set(-EINVAL, "%s: document %llu starts at "
					    "token %llu: starts must rise from 0 "
					    "below %llu", path, (unsigned long long)d,
					    (unsigned long long)s,
					    (unsigned long long)n);
	}
	return 0;
}

/* Point ds->ext into the mapping and check the mask's bytes and the
 * documents' order. */
static int ext_open(struct st_dataset *ds, uint32_t flags, uint64_t n_docs,
		    uint64_t hash)
{
	uint64_t mask_off, docs_off, end;
	const uint8_t *base = ds->map;

	ds->ext = (struct st_shard_ext){ .tokenizer_hash = hash };
	if (!flags)
		return 0;
	trailer_layout(ds->tok_bytes, ds->n_tokens, flags, n_docs, &mask_off,
		       &docs_off, &end);
	if (flags & ST_SHARD_MASK)
		ds->ext.mask = base + mask_off;
	if (flags & ST_SHARD_DOCS) {
		ds->ext.doc_starts = (const uint64_t *)(const void *)(base + docs_off);
		ds->ext.n_docs = n_docs;
	}
	return ext_valid(ds->path, ds->n_tokens, &ds->ext);
}

int st_dataset_open(struct st_dataset **out, const char *path,
		    enum st_dataset_format format)
{
	struct st_dataset *ds;
	uint64_t file_bytes, n_tokens = 0, n_docs = 0, hash = 0;
	unsigned tok_bytes = 1;
	uint32_t flags = 0;
	int fd, err;

	*out = NULL;
	err = st_file_open_regular(path, &fd, &file_bytes);
	if (err)
		return err;
	if (file_bytes == 0) {
		close(fd);
		return st_error_set(-EINVAL, "%s: file is empty", path);
	}
	if (format == ST_DATASET_AUTO) {
		uint8_t m[4] = { 0 };

		format = ST_DATASET_BYTES;
		if (file_bytes >= 4 &&
		    !st_file_pread_full(fd, m, 4, 0, path) &&
		    (le32(m) == ST_LLMC_MAGIC || le32(m) == ST_LLMC32_MAGIC))
			format = ST_DATASET_LLMC;
		/* A .bin that is not a shard is a broken shard, not text. */
		if (ends_with(path, ".bin"))
			format = ST_DATASET_LLMC;
	}
	if (format == ST_DATASET_LLMC) {
		err = llmc_check(path, fd, file_bytes, &n_tokens, &tok_bytes,
				 &flags, &n_docs, &hash);
		if (err) {
			close(fd);
			return err;
		}
	} else if (format == ST_DATASET_BYTES) {
		n_tokens = file_bytes;
	} else {
		close(fd);
		return st_error_set(-EINVAL, "%s: unknown dataset format %d",
				    path, (int)format);
	}
	if (file_bytes > SIZE_MAX) {
		close(fd);
		return st_error_set(-EFBIG, "%s: too large to map", path);
	}

	ds = calloc(1, sizeof(*ds));
	if (!ds || !(ds->path = strdup(path))) {
		free(ds);
		close(fd);
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	}
	ds->format = format;
	ds->n_tokens = n_tokens;
	ds->map_bytes = (size_t)file_bytes;
	ds->map = mmap(NULL, ds->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
	err = -errno;
	close(fd);
	if (ds->map == MAP_FAILED) {
		ds->map = NULL;
		st_error_set(err, "%s: mmap: %s", path, strerror(-err));
		st_dataset_close(ds);
		return err;
	}
	ds->tok_bytes = tok_bytes;
	ds->tokens = (const uint8_t *)ds->map +
		     (format == ST_DATASET_LLMC ? ST_LLMC_HEADER_BYTES : 0);
	for (uint64_t i = 0; i < n_tokens; i++)
		ds->max_token = ST_MAX(ds->max_token, tok(ds, i));
	err = ext_open(ds, flags, n_docs, hash);
	if (err) {
		st_dataset_close(ds);
		return err;
	}
	/* batches are int32: a uint32 shard's ids must fit */
	if (ds->max_token > INT32_MAX) {
		err = st_error_set(-EINVAL, "%s: token %u is past 2^31-1, the "
				   "largest id a batch holds", path, ds->max_token);
		st_dataset_close(ds);
		return err;
	}
	*out = ds;
	return 0;
}

/* Token i of part p as the concatenation's width w holds it. */
static void put_tok(uint8_t *dst, unsigned w, uint32_t v)
{
	for (unsigned b = 0; b < w; b++)
		dst[b] = (uint8_t)(v >> (8 * b));
}

/* The concatenation's extension: one tokenizer hash (the known ones
 * agree), a mask when a part has one (all ones for a part without), the
 * document starts when every part has them. */
static int concat_ext(struct st_dataset *const *parts, int n, uint64_t *hash, bool *mask,
		      bool *docs, uint64_t *n_docs)
{
	int known = -1;

	*hash = 0;
	*mask = false;
	*docs = true;
	*n_docs = 0;
	for (int i = 0; i < n; i++) {
		const struct st_shard_ext *e = &parts[i]->ext;

		if (parts[i]->format != parts[0]->format)
			return st_error_set(-EINVAL, "%s is %s, %s is %s: several files are all "
					    "token shards or all text", parts[0]->path,
					    parts[0]->format == ST_DATASET_LLMC ? "a token shard"
										: "text",
					    parts[i]->path,
					    parts[i]->format == ST_DATASET_LLMC ? "a token shard"
										: "text");
		if (e->tokenizer_hash && known >= 0 && e->tokenizer_hash != *hash)
			return st_error_set(-EINVAL, "%s and %s were made by different "
					    "tokenizers (hash %016llx and %016llx)",
					    parts[known]->path, parts[i]->path,
					    (unsigned long long)*hash,
					    (unsigned long long)e->tokenizer_hash);
		if (e->tokenizer_hash && known < 0) {
			known = i;
			*hash = e->tokenizer_hash;
		}
		*mask |= e->mask != NULL;
		*docs &= e->doc_starts != NULL;
		*n_docs += e->n_docs;
	}
	if (!*docs)
		*n_docs = 0;
	return 0;
}

int st_dataset_concat(struct st_dataset **out, struct st_dataset *const *parts, int n,
		      const char *name)
{
	struct st_dataset *ds;
	uint64_t total = 0, hash, n_docs, off = 0, d = 0;
	unsigned w = 1;
	bool mask, docs;
	size_t bytes;
	int err;

	*out = NULL;
	if (n < 1)
		return st_error_set(-EINVAL, "%s: no files", name);
	err = concat_ext(parts, n, &hash, &mask, &docs, &n_docs);
	if (err)
		return err;
	for (int i = 0; i < n; i++) {
		total += parts[i]->n_tokens;
		w = ST_MAX(w, parts[i]->tok_bytes);
	}
	/* tokens, then the mask, then the starts (8-aligned) */
	bytes = (size_t)pad8(total * w + (mask ? total : 0)) + (size_t)(8 * n_docs);
	ds = calloc(1, sizeof(*ds));
	if (ds) {
		ds->path = strdup(name);
		ds->map = malloc(bytes ? bytes : 1);
	}
	if (!ds || !ds->path || !ds->map) {
		if (ds)
			free(ds->map);
		st_dataset_close(ds);
		return st_error_set(-ENOMEM, "%s: out of memory for %llu tokens", name,
				    (unsigned long long)total);
	}
	ds->owned = true;
	ds->format = parts[0]->format;
	ds->n_tokens = total;
	ds->tok_bytes = w;
	ds->tokens = ds->map;
	ds->ext.tokenizer_hash = hash;
	if (mask)
		ds->ext.mask = (uint8_t *)ds->map + total * w;
	if (docs && n_docs) {
		ds->ext.doc_starts = (const uint64_t *)(const void *)((uint8_t *)ds->map +
								      pad8(total * w + (mask ? total : 0)));
		ds->ext.n_docs = n_docs;
	}
	for (int i = 0; i < n; i++) {
		const struct st_dataset *p = parts[i];
		uint8_t *dst = (uint8_t *)ds->map + off * w;

		for (uint64_t t = 0; t < p->n_tokens; t++)
			put_tok(dst + t * w, w, tok(p, t));
		if (mask && p->ext.mask)
			memcpy((uint8_t *)ds->ext.mask + off, p->ext.mask, p->n_tokens);
		else if (mask)
			memset((uint8_t *)ds->ext.mask + off, 1, p->n_tokens);
		for (uint64_t k = 0; ds->ext.doc_starts && k < p->ext.n_docs; k++)
			((uint64_t *)ds->ext.doc_starts)[d++] = off + p->ext.doc_starts[k];
		ds->max_token = ST_MAX(ds->max_token, p->max_token);
		off += p->n_tokens;
	}
	*out = ds;
	return 0;
}

void st_dataset_close(struct st_dataset *ds)
{
	if (!ds)
		return;
	if (ds->map && ds->owned)
		free(ds->map);
	else if (ds->map)
		munmap(ds->map, ds->map_bytes);
	free(ds->path);
	free(ds);
}

uint64_t st_dataset_tokens(const struct st_dataset *ds)
{
	return ds->n_tokens;
}

enum st_dataset_format st_dataset_format(const struct st_dataset *ds)
{
	return ds->format;
}

uint32_t st_dataset_max_token(const struct st_dataset *ds)
{
	return ds->max_token;
}

struct st_shard_ext st_dataset_ext(const struct st_dataset *ds)
{
	return ds->ext;
}

static void put_le32(uint8_t *p, uint32_t v)
{
	for (int b = 0; b < 4; b++)
		p[b] = (uint8_t)(v >> (8 * b));
}

static uint32_t ext_flags(const struct st_shard_ext *ext)
{
	if (!ext)
		return 0;
	return (ext->mask ? ST_SHARD_MASK : 0) |
	       (ext->doc_starts ? ST_SHARD_DOCS : 0);
}

void st_shard_header(uint8_t *hdr, unsigned tok_bytes, uint64_t n_tokens,
		     const struct st_shard_ext *ext)
{
	uint32_t flags = ext_flags(ext);

	memset(hdr, 0, ST_LLMC_HEADER_BYTES);
	put_le32(hdr, tok_bytes == 4 ? ST_LLMC32_MAGIC : ST_LLMC_MAGIC);
	put_le32(hdr + 4, tok_bytes == 4 ? ST_LLMC32_VERSION : ST_LLMC_VERSION);
	put_le32(hdr + 8, (uint32_t)n_tokens);
	if (!ext || (!flags && !ext->tokenizer_hash))
		return;
	put_le32(hdr + 12, ST_SHARD_EXT_MAGIC);
	put_le32(hdr + 16, flags);
	put_le32(hdr + 20, (uint32_t)ext->tokenizer_hash);
	put_le32(hdr + 24, (uint32_t)(ext->tokenizer_hash >> 32));
	put_le32(hdr + 28, (uint32_t)(flags & ST_SHARD_DOCS ? ext->n_docs : 0));
	put_le32(hdr + 32, (uint32_t)((flags & ST_SHARD_DOCS ? ext->n_docs : 0) >> 32));
}


int st_shard_trailer_write(struct st_file_atomic *f, unsigned tok_bytes,
			   uint64_t n_tokens, const struct st_shard_ext *ext)
{
	static const uint8_t zeros[8];
	uint32_t flags = ext_flags(ext);
	uint64_t mask_off, docs_off, end, at;
	int err = 0;

	if (!flags)
		return 0;
	trailer_layout(tok_bytes, n_tokens, flags, ext->n_docs, &mask_off,
		       &docs_off, &end);
	at = mask_off;
	if (flags & ST_SHARD_MASK) {
		err = st_file_atomic_write(f, ext->mask, (size_t)n_tokens);
		at += n_tokens;
	}
	if (!err && (flags & ST_SHARD_DOCS)) {
		err = st_file_atomic_write(f, zeros, (size_t)(docs_off - at));
		if (!err)
			err = st_file_atomic_write(f, ext->doc_starts,
						   (size_t)(8 * ext->n_docs));
	}
	return err;
}

int st_dataset_write_shard(const char *path, const void *tokens,
			   unsigned tok_bytes, uint64_t n_tokens,
			   const struct st_shard_ext *ext)
{
	uint8_t hdr[ST_LLMC_HEADER_BYTES];
	struct st_file_atomic f;
	int err;

	if (n_tokens == 0 || n_tokens > INT32_MAX)
		return st_error_set(-EINVAL, "%s: %llu tokens; an llm.c shard "
				    "holds 1..%d", path,
				    (unsigned long long)n_tokens, INT32_MAX);
	if (tok_bytes != 2 && tok_bytes != 4)
		return st_error_set(-EINVAL, "%s: tokens of %u bytes; a shard "
				    "holds 2 or 4", path, tok_bytes);
	err = ext_valid(path, n_tokens, ext);
	if (err)
		return err;
	st_shard_header(hdr, tok_bytes, n_tokens, ext);
	err = st_file_atomic_open(&f, path);
	if (err)
		return err;
	err = st_file_atomic_write(&f, hdr, sizeof(hdr));
	if (!err)
		err = st_file_atomic_write(&f, tokens,
					   (size_t)tok_bytes * n_tokens);
	if (!err)
		err = st_shard_trailer_write(&f, tok_bytes, n_tokens, ext);
	if (err) {
		st_file_atomic_abort(&f);
		return err;
	}
	return st_file_atomic_commit(&f);
}

int st_file_hash(const char *path, uint64_t *hash)
{
	XXH3_state_t *st = XXH3_createState();
	uint8_t buf[1 << 16];
	uint64_t bytes, at = 0;
	int fd, err;

	if (!st)
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	err = st_file_open_regular(path, &fd, &bytes);
	if (err) {
		XXH3_freeState(st);
		return err;
	}
	XXH3_64bits_reset(st);
	while (!err && at < bytes) {
		size_t n = (size_t)ST_MIN((uint64_t)sizeof(buf), bytes - at);

		err = st_file_pread_full(fd, buf, n, at, path);
		if (!err)
			XXH3_64bits_update(st, buf, n);
		at += n;
	}
	close(fd);
	*hash = XXH3_64bits_digest(st);
	XXH3_freeState(st);
	return err;
}

int st_dataset_write_llmc(const char *path, const uint16_t *tokens,
			  uint64_t n_tokens)
{
	return st_dataset_write_shard(path, tokens, 2, n_tokens, NULL);
}

/* ---- sampler ----------------------------------------------------------- */

/* splitmix64 expands the seed into xoshiro's state (its authors' advice:
 * never an all-zero state, and nearby seeds give unrelated streams). */
static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

/* xoshiro256** */
static uint64_t xoshiro_next(uint64_t s[4])
{
	uint64_t r = rotl(s[1] * 5, 7) * 9;
	uint64_t t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return r;
}

/* Uniform in [0, bound), bound > 0, without modulo bias: draws below
 * 2^64 mod bound are rejected. Integer only, so identical everywhere. */
static uint64_t uniform(uint64_t s[4], uint64_t bound)
{
	uint64_t threshold = (0 - bound) % bound;

	for (;;) {
		uint64_t x = xoshiro_next(s);

		if (x >= threshold)
			return x % bound;
	}
}

static void cursor_seed(struct st_cursor *c)
{
	uint64_t x = c->seed;

	for (int i = 0; i < 4; i++)
		c->rng[i] = splitmix64(&x);
	c->step = 0;
	c->epoch = c->doc = c->chunk = 0;
}

/* ---- documents --------------------------------------------------------- */

/* Position i of epoch e's document order over n documents: a Feistel
 * permutation of [0, 4^h) keyed by (seed, epoch), walked until it lands in
 * [0, n) (a bijection of [0, n)); no table, so the loader owns nothing. */
static uint64_t permute(uint64_t i, uint64_t n, uint64_t seed, uint64_t epoch)
{
	unsigned h = 1;

	while (h < 31 && (1ull << (2 * h)) < n)
		h++;
	const uint64_t m = (1ull << h) - 1, key = seed ^ (epoch * 0x9e3779b97f4a7c15ull);

	do {
		uint64_t l = i >> h, r = i & m;

		for (uint64_t k = 0; k < 4; k++) {
			uint64_t x = key + k * 0xbf58476d1ce4e5b9ull + r, t = r;

			r = l ^ (splitmix64(&x) & m);
			l = t;
		}
		i = l << h | r;
	} while (i >= n);
	return i;
}

/* The current document's tokens [*a, *b) (clipped to the range). */
static void doc_span(const struct st_loader *ld, uint64_t *a, uint64_t *b)
{
	const struct st_shard_ext *e = &ld->ds->ext;
	const struct st_cursor *c = &ld->cur;
	const uint64_t n = ld->doc_hi - ld->doc_lo;
	const uint64_t d = ld->doc_lo + (c->shuffle ? permute(c->doc, n, c->seed, c->epoch) : c->doc);

	*a = e->doc_starts[d];
	*b = d + 1 < e->n_docs ? e->doc_starts[d + 1] : ld->ds->n_tokens;
	*b = ST_MIN(*b, c->end_tok);
}

/* The next piece: the current document from its chunk, at most T+1
 * tokens; [*a, *b). */
static void piece(const struct st_loader *ld, uint64_t *a, uint64_t *b)
{
	uint64_t d0, d1;

	doc_span(ld, &d0, &d1);
	*a = d0 + ld->cur.chunk;
	*b = ST_MIN(d1, *a + ld->cur.seq + 1);
}

/* Past the piece [a, b): on in the document by T (the next piece starts
 * at this one's last token, which was a target here and is an input
 * there), or on to the next document, the next epoch after the last. */
static void piece_done(struct st_loader *ld, uint64_t b)
{
	struct st_cursor *c = &ld->cur;
	uint64_t d0, d1;

	doc_span(ld, &d0, &d1);
	if (b < d1) {
		c->chunk += c->seq;
		return;
	}
	c->chunk = 0;
	if (++c->doc == ld->doc_hi - ld->doc_lo) {
		c->doc = 0;
		c->epoch++;
	}
}

/* One row: whole pieces packed in order while they fit in T+1 tokens, the
 * rest padding (input 0, target ignored); a piece's first token is no
 * target (the targets stay within a document). seg (may be NULL): each
 * input position's piece start in the row (the padding is one piece of
 * its own). in, tg NULL: only counted. Returns the row's counted
 * targets. */
static uint64_t doc_row(struct st_loader *ld, int32_t *in, int32_t *tg, int32_t *seg)
{
	const struct st_dataset *ds = ld->ds;
	const uint32_t T = ld->cur.seq;
	uint64_t used = 0, counted = 0;

	for (uint32_t j = 0; in && j < T; j++) {
		in[j] = 0;
		tg[j] = ST_LOADER_IGNORED;
	}
	for (;;) {
		uint64_t a, b;

		piece(ld, &a, &b);
		if (b - a < 2) { /* a document of one token: no target */
			piece_done(ld, b);
			continue;
		}
		if (used && used + (b - a) > (uint64_t)T + 1)
			break;
		const uint64_t start = used;

		for (uint64_t i = a; i < b; i++, used++) {
			bool counts = i > a && (!ds->ext.mask || ds->ext.mask[i]);

			if (seg && used < T)
				seg[used] = (int32_t)start;
			if (in && used < T)
				in[used] = (int32_t)tok(ds, i);
			if (in && counts)
				tg[used - 1] = (int32_t)tok(ds, i);
			counted += counts;
		}
		piece_done(ld, b);
		if (used == (uint64_t)T + 1)
			break;
	}
	for (uint64_t j = used; seg && j < T; j++)
		seg[j] = (int32_t)used;
	return counted;
}

/* A batch of B rows (into in, tg, seg when not NULL); its counted
 * targets. */
static uint64_t doc_batch(struct st_loader *ld, int32_t *in, int32_t *tg, int32_t *seg)
{
	const uint32_t B = ld->cur.batch, T = ld->cur.seq;
	uint64_t counted = 0;

	for (uint32_t r = 0; r < B; r++)
		counted += doc_row(ld, in ? in + (size_t)r * T : NULL,
				   tg ? tg + (size_t)r * T : NULL,
				   seg ? seg + (size_t)r * T : NULL);
	ld->cur.step++;
	return counted;
}

/* The documents that start in the range; refuses a shard without
 * document starts, or a range where none has a target. */
static int docs_init(struct st_loader *ld)
{
	const struct st_dataset *ds = ld->ds;
	const struct st_shard_ext *e = &ds->ext;
	const struct st_cursor *c = &ld->cur;
	bool any = false;

	if (!e->doc_starts)
		return st_error_set(-EINVAL, "%s: --samples documents: the file has no "
				    "document starts (a token shard from strata tokenize has "
				    "them; --samples windows reads any file)", ds->path);
	ld->doc_lo = ld->doc_hi = 0;
	while (ld->doc_lo < e->n_docs && e->doc_starts[ld->doc_lo] < c->begin_tok)
		ld->doc_lo++;
	ld->doc_hi = ld->doc_lo;
	while (ld->doc_hi < e->n_docs && e->doc_starts[ld->doc_hi] < c->end_tok) {
		uint64_t end = ld->doc_hi + 1 < e->n_docs ? e->doc_starts[ld->doc_hi + 1]
							   : ds->n_tokens;

		any |= ST_MIN(end, c->end_tok) - e->doc_starts[ld->doc_hi] >= 2;
		ld->doc_hi++;
	}
	if (!any)
		return st_error_set(-EINVAL, "%s: --samples documents: no document of two "
				    "tokens or more in the %s", ds->path,
				    c->begin_tok ? "val split" : "range read");
	return 0;
}

static const char *split_name(enum st_split s)
{
	return s == ST_SPLIT_TRAIN ? "train split" :
	       s == ST_SPLIT_VAL ? "val split" : "dataset";
}

int st_loader_init(struct st_loader *ld, const struct st_dataset *ds,
		   const struct st_loader_config *cfg)
{
	uint64_t n = ds->n_tokens, n_val = 0, bt;
	struct st_cursor c = { 0 };

	if (cfg->batch == 0 || cfg->seq == 0 ||
	    __builtin_mul_overflow((uint64_t)cfg->batch, cfg->seq, &bt) ||
	    bt > INT32_MAX)
		return st_error_set(-EINVAL, "%s: batch B=%u x T=%u is not in "
				    "1..2^31-1 tokens", ds->path, cfg->batch,
				    cfg->seq);
	if (cfg->split != ST_SPLIT_ALL) {
		if (cfg->split != ST_SPLIT_TRAIN && cfg->split != ST_SPLIT_VAL)
			return st_error_set(-EINVAL, "%s: unknown split %d",
					    ds->path, (int)cfg->split);
		if (!(cfg->val_fraction > 0.0 && cfg->val_fraction < 1.0))
			return st_error_set(-EINVAL, "%s: val fraction %g is not "
					    "in (0, 1)", ds->path,
					    cfg->val_fraction);
		n_val = (uint64_t)((double)n * cfg->val_fraction);
	}
	c.batch = cfg->batch;
	c.seq = cfg->seq;
	c.shuffle = cfg->shuffle ? 1 : 0;
	c.samples = cfg->samples == ST_SAMPLES_DOCUMENTS ? ST_SAMPLES_DOCUMENTS
							 : ST_SAMPLES_WINDOWS;
	c.seed = cfg->seed;
	c.begin_tok = cfg->split == ST_SPLIT_VAL ? n - n_val : 0;
	c.end_tok = cfg->split == ST_SPLIT_TRAIN ? n - n_val : n;
	if (c.end_tok - c.begin_tok < (uint64_t)cfg->seq + 1)
		return st_error_set(-EINVAL, "%s: the %s holds %llu tokens, "
				    "fewer than T+1 = %llu", ds->path,
				    split_name(cfg->split),
				    (unsigned long long)(c.end_tok - c.begin_tok),
				    (unsigned long long)cfg->seq + 1);
	cursor_seed(&c);
	ld->ds = ds;
	ld->cur = c;
	return c.samples == ST_SAMPLES_DOCUMENTS ? docs_init(ld) : 0;
}

/* Row b's first token, relative to the range (a shuffled cursor draws). */
static uint64_t row_start(struct st_cursor *c, uint32_t b)
{
	const uint64_t n = c->end_tok - c->begin_tok;

	if (c->shuffle) /* Whole windows only: no wrap across the end. */
		return uniform(c->rng, n - c->seq);
	/* (s*B + b) * T mod n; 128 bits so no step overflows. */
	unsigned __int128 row = (unsigned __int128)c->step * c->batch + b;

	return (uint64_t)((row * c->seq) % n);
}

void st_loader_next(struct st_loader *ld, int32_t *inputs, int32_t *targets)
{
	st_loader_next_seg(ld, inputs, targets, NULL);
}

void st_loader_next_seg(struct st_loader *ld, int32_t *inputs, int32_t *targets, int32_t *seg)
{
	const struct st_dataset *ds = ld->ds;
	const uint8_t *mask = ds->ext.mask;
	struct st_cursor *c = &ld->cur;
	const uint64_t n = c->end_tok - c->begin_tok;
	const uint32_t B = c->batch, T = c->seq;

	if (c->samples == ST_SAMPLES_DOCUMENTS) {
		(void)doc_batch(ld, inputs, targets, seg);
		return;
	}
	if (seg) /* a window is one document */
		memset(seg, 0, sizeof(int32_t) * (size_t)B * T);
	// inputs, targets are (B,T)
	for (uint32_t b = 0; b < B; b++) {
		int32_t *in = inputs + (size_t)b * T;
		int32_t *tg = targets + (size_t)b * T;
		uint64_t at = row_start(c, b);
		uint32_t prev = tok(ds, c->begin_tok + at);

		for (uint32_t t = 0; t < T; t++) {
			uint32_t next;

			if (++at == n)
				at = 0;
			next = tok(ds, c->begin_tok + at);
			in[t] = (int32_t)prev;
			/* the mask byte of the target's own token */
			tg[t] = mask && !mask[c->begin_tok + at] ? ST_LOADER_IGNORED
								 : (int32_t)next;
			prev = next;
		}
	}
	c->step++;
}

void st_loader_skip(struct st_loader *ld)
{
	struct st_cursor *c = &ld->cur;

	if (c->samples == ST_SAMPLES_DOCUMENTS) {
		(void)doc_batch(ld, NULL, NULL, NULL);
		return;
	}
	for (uint32_t b = 0; c->shuffle && b < c->batch; b++)
		(void)row_start(c, b);
	c->step++;
}

bool st_loader_masked(const struct st_loader *ld)
{
	/* documents pad their rows with ignored targets */
	return ld->ds->ext.mask != NULL || ld->cur.samples == ST_SAMPLES_DOCUMENTS;
}

uint64_t st_loader_count(const struct st_loader *ld, uint32_t batches)
{
	const uint8_t *mask = ld->ds->ext.mask;
	struct st_cursor c = ld->cur;
	const uint64_t n = c.end_tok - c.begin_tok;
	uint64_t count = 0;

	if (c.samples == ST_SAMPLES_DOCUMENTS) {
		struct st_loader copy = *ld;

		for (uint32_t i = 0; i < batches; i++)
			count += doc_batch(&copy, NULL, NULL, NULL);
		return count;
	}

	for (uint32_t i = 0; i < batches; i++, c.step++)
		for (uint32_t b = 0; b < c.batch; b++) {
			uint64_t at = row_start(&c, b);

			for (uint32_t t = 0; t < c.seq; t++) {
				if (++at == n)
					at = 0;
				count += mask ? mask[c.begin_tok + at] : 1;
			}
		}
	return count;
}

void st_loader_rewind(struct st_loader *ld)
{
	cursor_seed(&ld->cur);
}

int st_loader_seek(struct st_loader *ld, const struct st_cursor *c)
{
	const struct st_cursor *h = &ld->cur;

	if (c->samples != h->samples)
		return st_error_set(-EINVAL, "%s: cursor was saved with --samples %s; this "
				    "loader samples %s", ld->ds->path,
				    c->samples == ST_SAMPLES_DOCUMENTS ? "documents" : "windows",
				    h->samples == ST_SAMPLES_DOCUMENTS ? "documents" : "windows");
	if (c->samples == ST_SAMPLES_DOCUMENTS &&
	    (c->doc >= ld->doc_hi - ld->doc_lo || c->chunk % (c->seq ? c->seq : 1)))
		return st_error_set(-EINVAL, "%s: cursor's document %llu (chunk %llu) is "
				    "not one of the %llu read", ld->ds->path,
				    (unsigned long long)c->doc, (unsigned long long)c->chunk,
				    (unsigned long long)(ld->doc_hi - ld->doc_lo));
	if (c->batch != h->batch || c->seq != h->seq ||
	    c->shuffle != h->shuffle || c->seed != h->seed)
		return st_error_set(-EINVAL, "%s: cursor was saved with B=%u "
				    "T=%u shuffle=%u seed=%llu; this loader has "
				    "B=%u T=%u shuffle=%u seed=%llu",
				    ld->ds->path, c->batch, c->seq, c->shuffle,
				    (unsigned long long)c->seed, h->batch,
				    h->seq, h->shuffle,
				    (unsigned long long)h->seed);
	if (c->begin_tok != h->begin_tok || c->end_tok != h->end_tok)
		return st_error_set(-EINVAL, "%s: cursor was saved over tokens "
				    "[%llu, %llu); this loader reads [%llu, "
				    "%llu) (another file or split?)",
				    ld->ds->path,
				    (unsigned long long)c->begin_tok,
				    (unsigned long long)c->end_tok,
				    (unsigned long long)h->begin_tok,
				    (unsigned long long)h->end_tok);
	if (c->shuffle && c->samples == ST_SAMPLES_WINDOWS &&
	    !(c->rng[0] | c->rng[1] | c->rng[2] | c->rng[3]))
		return st_error_set(-EINVAL, "%s: cursor's generator state is "
				    "all zero", ld->ds->path);
	ld->cur = *c;
	return 0;
}

/* ---- cursor serialisation ---------------------------------------------- */

#define ST_CURSOR_MAGIC 0x52435453u /* "STCR" */
#define ST_CURSOR_VERSION 1u      /* windows */
#define ST_CURSOR_VERSION_DOCS 2u /* documents */

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
	return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

/* Layout: magic, version, B, T, shuffle, samples (u32 each; samples 0 in
 * version 1); seed, begin, end, step (u64 each); then rng[4] (windows,
 * version 1) or epoch, doc, chunk, 0 (documents, version 2; u64 each);
 * XXH64 of the 88 bytes before it. Windows still write version 1, so their
 * cursors are the bytes they always were. */
void st_cursor_pack(const struct st_cursor *c, uint8_t *out)
{
	const bool docs = c->samples == ST_SAMPLES_DOCUMENTS;
	const uint64_t d[4] = { c->epoch, c->doc, c->chunk, 0 };

	put32(out + 0, ST_CURSOR_MAGIC);
	put32(out + 4, docs ? ST_CURSOR_VERSION_DOCS : ST_CURSOR_VERSION);
	put32(out + 8, c->batch);
	put32(out + 12, c->seq);
	put32(out + 16, c->shuffle);
	put32(out + 20, c->samples);
	put64(out + 24, c->seed);
	put64(out + 32, c->begin_tok);
	put64(out + 40, c->end_tok);
	put64(out + 48, c->step);
	for (int i = 0; i < 4; i++)
		put64(out + 56 + 8 * i, docs ? d[i] : c->rng[i]);
	put64(out + 88, XXH64(out, 88, 0));
}

int st_cursor_unpack(struct st_cursor *c, const uint8_t *in, size_t bytes)
{
	if (bytes != ST_CURSOR_BYTES)
		return st_error_set(-EINVAL, "cursor is %zu bytes, expected %d",
				    bytes, ST_CURSOR_BYTES);
	if (get32(in) != ST_CURSOR_MAGIC)
		return st_error_set(-EINVAL, "cursor has a bad magic number");
	if (get32(in + 4) != ST_CURSOR_VERSION &&
	    get32(in + 4) != ST_CURSOR_VERSION_DOCS)
		return st_error_set(-EINVAL, "cursor version %u, expected %u or %u",
				    get32(in + 4), ST_CURSOR_VERSION,
				    ST_CURSOR_VERSION_DOCS);
	if (get64(in + 88) != XXH64(in, 88, 0))
		return st_error_set(-EINVAL, "cursor checksum mismatch "
				    "(corrupted)");
	memset(c, 0, sizeof(*c));
	c->samples = get32(in + 20);
	if (c->samples != (get32(in + 4) == ST_CURSOR_VERSION_DOCS
				   ? ST_SAMPLES_DOCUMENTS : ST_SAMPLES_WINDOWS))
		return st_error_set(-EINVAL, "cursor version %u with samples %u",
				    get32(in + 4), c->samples);
	c->batch = get32(in + 8);
	c->seq = get32(in + 12);
	c->shuffle = get32(in + 16);
	c->seed = get64(in + 24);
	c->begin_tok = get64(in + 32);
	c->end_tok = get64(in + 40);
	c->step = get64(in + 48);
	if (c->samples == ST_SAMPLES_DOCUMENTS) {
		c->epoch = get64(in + 56);
		c->doc = get64(in + 64);
		c->chunk = get64(in + 72);
	} else {
		for (int i = 0; i < 4; i++)
			c->rng[i] = get64(in + 56 + 8 * i);
	}
	return 0;
}

/* strata: token datasets and the batch sampler.
 *
 * Two file formats, mmapped read-only:
 *   bytes  - any file (raw text); each byte is one token, vocabulary 256.
 *   llm.c  - a token shard as llm.c writes it: a header of 256 int32
 *            (little-endian) with [0] = 20240520 (magic), [1] = 1 (version),
 *            [2] = token count, then count uint16 tokens; or, for
 *            vocabularies past 65535 (llm.c's Llama 3 shards), [0] =
 *            20240801, [1] = 7 and count uint32 tokens.
 *   strata's extension of an llm.c shard (docs/formats.md): header [3] =
 *            ST_SHARD_EXT_MAGIC marks it; [4] = flags (ST_SHARD_MASK,
 *            ST_SHARD_DOCS); [5], [6] = the low and high 32 bits of the
 *            tokenizer's hash (XXH3-64 of its tokenizer.json bytes; 0 when
 *            unknown); [7], [8] = the low and high 32 bits of the document
 *            count D. After the count tokens come, when flagged, the loss
 *            mask (count bytes, each 0 or 1: token i is a target the loss
 *            counts), zero bytes up to a multiple of 8 from the file's
 *            start, then D uint64 document starts (token offsets, the first
 *            0, strictly increasing, each < count). A shard with only the
 *            hash has no trailer, so llm.c itself still reads it.
 *
 * A loader samples batches of B windows of T+1 tokens from a token range
 * (all, train or val split) and fills inputs (B,T) and targets (B,T), the
 * targets being the inputs shifted by one token. Its whole state is a cursor
 * of plain integers, so saving the cursor and seeking to it later resumes the
 * exact same batch sequence.
 *   shuffle off: step s, row b starts at token (s*B + b)*T of the range,
 *                llm.c's contiguous order; indices wrap modulo the range
 *                length, so a window may continue from the end to the start.
 *   shuffle on:  each window start is uniform in [0, n - T - 1], drawn from
 *                a xoshiro256** generator seeded by splitmix64(seed), whose
 *                state is in the cursor: identical on every machine.
 * Functions return 0 or -errno; the detail is in st_error_last(). */
#ifndef STRATA_DATASET_H
#define STRATA_DATASET_H

#include "strata/common.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ST_LLMC_MAGIC 20240520
#define ST_LLMC_VERSION 1
#define ST_LLMC_HEADER_INTS 256
#define ST_LLMC32_MAGIC 20240801 /* uint32 tokens */
#define ST_LLMC32_VERSION 7

#define ST_SHARD_EXT_MAGIC 0x41525453 /* "STRA", little-endian */
#define ST_SHARD_MASK 1u /* a loss mask follows the tokens */
#define ST_SHARD_DOCS 2u /* document starts follow */

enum st_dataset_format {
	ST_DATASET_AUTO,  /* llm.c when the llm.c magic is there or the name
			     ends in ".bin" (then a bad header is an error);
			     bytes otherwise */
	ST_DATASET_BYTES,
	ST_DATASET_LLMC,
};

struct st_dataset;

/* Open and validate a token file. Returns 0, -EINVAL for a malformed or
 * empty file (bad magic, bad version, token count vs. file size), or the
 * errno of open/mmap. */
int st_dataset_open(struct st_dataset **out, const char *path,
		    enum st_dataset_format format);

/* Several datasets as one, in memory: their tokens in the order given
 * (the concatenation is one token stream: a window may span the end of one
 * and the start of the next); the widest token width; a loss mask when one
 * of them has one (all ones for a part without: every token counts); the
 * document starts shifted by the tokens before each part, when every part
 * has them; the tokenizer hash that the parts which know one agree on.
 * name (e.g. the user's list) names it in errors. The parts stay the
 * caller's (close them when done). Returns 0, -EINVAL (text mixed with
 * shards, two tokenizers) or -ENOMEM. */
int st_dataset_concat(struct st_dataset **out, struct st_dataset *const *parts, int n,
		      const char *name);

/* Unmap and free. NULL does nothing. */
void st_dataset_close(struct st_dataset *ds);

/* Number of tokens in the file. */
uint64_t st_dataset_tokens(const struct st_dataset *ds);

/* Format actually used (never AUTO). */
enum st_dataset_format st_dataset_format(const struct st_dataset *ds);

/* Largest token id in the file (for a check against the model's vocab). */
uint32_t st_dataset_max_token(const struct st_dataset *ds);

/* Write tokens[0..n) as an llm.c shard (version 1), atomically (temporary
 * file, fsync, rename). n must fit in int32. Returns 0 or -errno. */
int st_dataset_write_llmc(const char *path, const uint16_t *tokens,
			  uint64_t n_tokens);

/* What strata's extension carries (all optional; a zeroed struct writes a
 * plain llm.c shard). */
struct st_shard_ext {
	uint64_t tokenizer_hash;    /* 0: unknown */
	const uint8_t *mask;        /* n_tokens bytes of 0/1, or NULL */
	const uint64_t *doc_starts; /* n_docs offsets, or NULL */
	uint64_t n_docs;
};

/* The extension of an open llm.c shard (a zeroed struct for a plain shard
 * or a bytes file); its pointers point into the mapping. */
struct st_shard_ext st_dataset_ext(const struct st_dataset *ds);

/* Fill hdr (ST_LLMC_HEADER_INTS int32) for n tokens of tok_bytes (2 or 4)
 * with ext's fields; for writers that stream the tokens after it. */
void st_shard_header(uint8_t *hdr, unsigned tok_bytes, uint64_t n_tokens,
		     const struct st_shard_ext *ext);

/* Write what follows the n tokens for ext (mask, padding, document
 * starts) at the end of f. Returns 0 or -errno. */
struct st_file_atomic;
int st_shard_trailer_write(struct st_file_atomic *f, unsigned tok_bytes,
			   uint64_t n_tokens, const struct st_shard_ext *ext);

/* Write a whole shard: header, tokens (tok_bytes 2 or 4, host order =
 * little-endian), trailer; atomically. ext may be NULL. Refuses (-EINVAL) a
 * mask byte other than 0/1 or document starts that are not as above. */
int st_dataset_write_shard(const char *path, const void *tokens,
			   unsigned tok_bytes, uint64_t n_tokens,
			   const struct st_shard_ext *ext);

/* XXH3-64 of a file's bytes (a tokenizer.json's identity in a shard).
 * Returns 0 or -errno (the detail names the file). */
int st_file_hash(const char *path, uint64_t *hash);

enum st_split {
	ST_SPLIT_ALL,
	ST_SPLIT_TRAIN, /* the first (1 - val_fraction) of the tokens */
	ST_SPLIT_VAL,   /* the last floor(n * val_fraction) tokens */
};

/* What a row is (docs/finetune.md, "Training on chat data"). */
enum st_samples {
	ST_SAMPLES_WINDOWS,   /* a window of T+1 tokens anywhere (text) */
	ST_SAMPLES_DOCUMENTS, /* whole documents packed in order, in epochs */
};

struct st_loader_config {
	uint32_t batch;       /* B rows per batch */
	uint32_t seq;         /* T tokens per row */
	int shuffle;          /* 0: contiguous order, 1: seeded random windows
				 (documents: each epoch's order shuffled) */
	enum st_samples samples;
	uint64_t seed;
	enum st_split split;
	double val_fraction;  /* in (0, 1) for TRAIN and VAL; e.g. 0.1 */
};

/* The sampler's whole state: plain integers, safe to copy and store. The
 * config fields are there so a cursor is refused by a loader that samples
 * differently. */
struct st_cursor {
	uint32_t batch, seq, shuffle;
	uint32_t samples;            /* enum st_samples */
	uint64_t seed;
	uint64_t begin_tok, end_tok; /* the token range [begin, end) sampled */
	uint64_t step;               /* batches drawn so far */
	uint64_t rng[4];             /* xoshiro256** state (windows, shuffle) */
	/* documents: the epoch (from 0), the position in its order of the
	 * document the next row starts with, and the token offset in it of
	 * the next piece (a multiple of T) */
	uint64_t epoch, doc, chunk;
};

/* Bytes of a packed cursor: magic, version and the fields, little-endian. */
#define ST_CURSOR_BYTES 96

/* Serialise c into out[ST_CURSOR_BYTES], independent of the host. */
void st_cursor_pack(const struct st_cursor *c, uint8_t *out);

/* Parse a packed cursor. Returns 0, or -EINVAL when bytes is not
 * ST_CURSOR_BYTES or the magic/version is wrong. */
int st_cursor_unpack(struct st_cursor *c, const uint8_t *in, size_t bytes);

/* A sampler over one dataset. The dataset is borrowed and must outlive it.
 * Owns nothing: no fini. */
struct st_loader {
	const struct st_dataset *ds;
	struct st_cursor cur;
	uint64_t doc_lo, doc_hi; /* documents: those starting in the range */
};

/* Set up ld at step 0 of cfg's split. Returns 0, or -EINVAL when B or T is
 * 0, B*T overflows, val_fraction is out of range, or the split holds fewer
 * than T+1 tokens (the detail gives both counts); documents: when the file
 * has no document starts, or no document in the range has a target.
 *
 * Documents (ST_SAMPLES_DOCUMENTS): the documents that start in the range
 * (the last ends at the range's end), in file order or, shuffled, in an
 * order drawn per epoch from (seed, epoch). A document is cut into pieces
 * of at most T+1 tokens, piece k starting at token k*T (so each of its
 * tokens after the first is a target once). A row packs whole pieces in
 * order while they fit in T+1 tokens; what is left is padding (input 0,
 * target ignored). No row starts inside a piece, and no target crosses
 * from one document to the next (a piece's first token is no target).
 * After the last document the next epoch begins. */
int st_loader_init(struct st_loader *ld, const struct st_dataset *ds,
		   const struct st_loader_config *cfg);

/* A target the loss mask leaves out: its token's mask byte is 0 (model.h's
 * ST_TARGET_IGNORED, transformers' -100). */
#define ST_LOADER_IGNORED (-1)

/* Fill inputs (B,T) and targets (B,T) with the next batch and advance one
 * step. Window row b = tokens [s, s+T] gives inputs s..s+T-1 and targets
 * s+1..s+T; with a loss mask, target j is ST_LOADER_IGNORED when the mask
 * byte of token s+1+j is 0. Never fails and never allocates. */
void st_loader_next(struct st_loader *ld, int32_t *inputs, int32_t *targets);

/* The same, and seg (B,T) when not NULL: for each input position, the
 * position in its row where its document starts (documents: the piece it
 * belongs to, the padding after the last piece one more; windows: all 0).
 * What attention kept within documents reads (model.h's batch.seg,
 * strata train --packing isolated). */
void st_loader_next_seg(struct st_loader *ld, int32_t *inputs, int32_t *targets,
			int32_t *seg);

/* Whether a target may be ignored: the dataset has a loss mask, or rows
 * are documents (their padding). The loss is then the mean over the
 * counted targets (st_loader_count). */
bool st_loader_masked(const struct st_loader *ld);

/* The counted targets (mask byte 1; all of them without a mask) of the
 * next `batches` batches, as st_loader_next() would draw them; the loader
 * does not move. A masked step's divisor, known before its backward. */
uint64_t st_loader_count(const struct st_loader *ld, uint32_t batches);

/* Advance one step exactly as st_loader_next() would, filling nothing:
 * the batches another data-parallel rank takes. Never fails. */
void st_loader_skip(struct st_loader *ld);

/* Back to step 0 with the generator reseeded (e.g. before each eval). */
void st_loader_rewind(struct st_loader *ld);

/* Continue from a saved cursor (ld->cur is the one to save). Returns 0, or
 * -EINVAL when the cursor was made with a different B, T, shuffle, seed or
 * token range (the detail shows both) or its range does not fit the
 * dataset. */
int st_loader_seek(struct st_loader *ld, const struct st_cursor *c);

#endif

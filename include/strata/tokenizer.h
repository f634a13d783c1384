/* strata: Hugging Face tokenizers (tokenizer.json), text in and ids out.
 *
 * What a tokenizer.json holds is run in Hugging Face's order:
 *   added tokens   split out of the raw text first (longest match, leftmost),
 *                  lstrip/rstrip trimming the whitespace beside them;
 *   normalizer     NFC/NFD/NFKC/NFKD (ICU), Lowercase, Prepend, Replace,
 *                  Strip, Sequence;
 *   pre-tokenizer  Split (a regex run by PCRE2 in UTF + UCP mode, JIT),
 *                  ByteLevel, Metaspace, Sequence;
 *   model          BPE: merges by rank over a linked list of symbols with a
 *                  heap, a cache of words, byte fallback (<0xNN>), unk and
 *                  fuse_unk, ignore_merges;
 *   post-processor TemplateProcessing, ByteLevel, Sequence (the BOS/EOS a
 *                  document gets), overridden by tokenizer_config.json's
 *                  add_bos_token / add_eos_token where it says so;
 *   decoder        ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace,
 *                  Sequence; then clean_up_tokenization_spaces.
 * A key with a value strata does not implement is refused at open, naming
 * the key (docs/tokenizer.md lists what is and is not supported).
 *
 * Text that is not valid UTF-8 is read as the WHATWG decoder (and so
 * Python's errors="replace" and JavaScript's TextDecoder) reads it: each
 * maximal invalid subsequence becomes U+FFFD.
 *
 * Functions return 0 or -errno; the detail is in st_error_last(). A
 * tokenizer is not thread-safe (encode keeps a cache): one per thread. */
#ifndef STRATA_TOKENIZER_H
#define STRATA_TOKENIZER_H

#include "strata/common.h"

#include <stddef.h>
#include <stdint.h>

struct st_tokenizer;

/* A growable list of token ids; zero-initialise, st_tok_ids_fini() frees. */
struct st_tok_ids {
	uint32_t *ids;
	size_t n, cap;
};

void st_tok_ids_fini(struct st_tok_ids *v);

/* Open path: a directory holding tokenizer.json, or a tokenizer.json file.
 * tokenizer_config.json beside it is read when present (BOS/EOS, extra
 * special tokens, clean_up_tokenization_spaces). Returns 0, -ENOENT when
 * there is no tokenizer.json, -EINVAL for a malformed file or an
 * unsupported key (the detail names the file and the key), -ENOMEM, or the
 * errno of reading. */
int st_tokenizer_open(const char *path, struct st_tokenizer **out);

/* Free. NULL does nothing. */
void st_tokenizer_close(struct st_tokenizer *t);

/* One past the largest token id (model vocabulary and added tokens). */
uint32_t st_tokenizer_vocab(const struct st_tokenizer *t);

/* The model's kind for messages: "byte-level BPE" or "BPE". Borrowed. */
const char *st_tokenizer_kind(const struct st_tokenizer *t);

/* The ids a document starts and ends with (the post-processor's template,
 * or tokenizer_config.json's add_bos_token/add_eos_token). Sets *ids
 * (borrowed) and returns how many (0 for none). */
size_t st_tokenizer_prefix(const struct st_tokenizer *t, const uint32_t **ids);
size_t st_tokenizer_suffix(const struct st_tokenizer *t, const uint32_t **ids);

/* The id of the token whose text is s (an added token or a vocabulary
 * entry as written in tokenizer.json), or -1. */
int64_t st_tokenizer_token_id(const struct st_tokenizer *t, const char *s);

/* Whether id is a special token (added with "special": true, or named by
 * tokenizer_config.json's additional_special_tokens). */
bool st_tokenizer_is_special(const struct st_tokenizer *t, uint32_t id);

/* The added tokens: how many, and the text of the i-th (*text borrowed;
 * returns its length, 0 past the end). */
size_t st_tokenizer_n_added(const struct st_tokenizer *t);
size_t st_tokenizer_added(const struct st_tokenizer *t, size_t i, const char **text);

/* The id tokenizer_config.json names as eos_token, or -1. */
int64_t st_tokenizer_eos_id(const struct st_tokenizer *t);

enum {
	ST_TOK_ADD_SPECIAL = 1u << 0, /* encode: add the prefix and suffix */
	ST_TOK_SKIP_SPECIAL = 1u << 1, /* decode: leave special tokens out */
	ST_TOK_NO_CLEANUP = 1u << 2,  /* decode: no clean_up_tokenization */
	ST_TOK_RAW = 1u << 3,         /* decode: bytes as the tokens give them,
					 invalid UTF-8 kept (one token's bytes) */
};

/* Append the ids of text[0..bytes) to out. flags: ST_TOK_ADD_SPECIAL.
 * Returns 0, -ENOMEM, or -EINVAL when a piece has no token and the model
 * has neither byte fallback nor an unk token. */
int st_tokenizer_encode(struct st_tokenizer *t, const char *text,
			size_t bytes, unsigned flags, struct st_tok_ids *out);

/* The text of ids[0..n) as a NUL-terminated malloc'd string (*text, the
 * caller frees; *bytes its length, without the NUL). flags:
 * ST_TOK_SKIP_SPECIAL, ST_TOK_NO_CLEANUP. Ids past the vocabulary, or that
 * name no token, decode to nothing. Returns 0 or -ENOMEM. */
int st_tokenizer_decode(const struct st_tokenizer *t, const uint32_t *ids,
			size_t n, unsigned flags, char **text, size_t *bytes);

/* Bytes of text up to which every UTF-8 sequence is complete: a prefix
 * that a stream can print now (generate's output as it grows). */
size_t st_utf8_complete(const char *text, size_t bytes);

#endif

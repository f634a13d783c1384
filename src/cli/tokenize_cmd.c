/* strata: `strata tokenize`, text or chat data to an llm.c token shard with
 * a Hugging Face tokenizer (strata/tokenizer.h), with strata's extension
 * (strata/dataset.h): the hash of the tokenizer.json that made it, and for
 * chat and prompt-completion data the loss mask and the document starts.
 *
 * --format text (the default): each FILE (or standard input, `-`) is one
 * document, or with --lines each of its non-empty lines; each document gets
 * the ids the tokenizer adds to a sequence (its post-processor, or
 * tokenizer_config.json's add_bos_token / add_eos_token), or those
 * --bos/--eos name.
 * --format chat: JSON lines {"messages": [{"role", "content"}...]}, each
 * rendered with the model's chat template (strata/chat.h) and tokenized
 * as the text it renders (no BOS/EOS added: the template writes them);
 * the mask is 1 on each assistant reply from its first token through the
 * first special token of its span (the end of turn), docs/tokenizer.md.
 * --format prompt-completion: {"prompt", "completion"} lines; BOS, the
 * tokens of prompt + completion as one text, EOS; the mask is 1 from the
 * first token that reaches into the completion through EOS.
 * The shard is llm.c's: uint16 tokens (magic 20240520, version 1) when
 * every id fits, uint32 (20240801, version 7) otherwise; what `strata train
 * --data` reads. The output appears whole or not at all: written under a
 * temporary name OUT.tmp.XXXXXX (removed on any failure and on
 * SIGINT/SIGTERM/SIGHUP; one a killed run left is removed by the next run
 * once its writer is gone), fsynced, renamed. */
#include "cli.h"
#include "strata/chat.h"
#include "strata/dataset.h"
#include "strata/file.h"
#include "strata/tokenizer.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <json-c/json.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void tok_usage(FILE *f)
{
	fprintf(f,
"usage: strata tokenize --tokenizer DIR|tokenizer.json --out FILE.bin\n"
"                       [--format text|chat|prompt-completion] [--lines]\n"
"                       [--bos TOKEN|none] [--eos TOKEN|none]\n"
"                       [--chat-template FILE] [--text-out FILE] [FILE...|-]\n"
"\n"
"Text or chat data to an llm.c token shard (what strata train --data reads), with\n"
"a Hugging Face tokenizer: DIR holds tokenizer.json (and tokenizer_config.json),\n"
"or name the tokenizer.json. The shard records the tokenizer's hash.\n"
"  --format text     (default) each FILE is one document (standard input when\n"
"                    none, or -); with --lines each non-empty line is one.\n"
"                    Invalid UTF-8 is read as U+FFFD.\n"
"  --format chat     JSON lines {\"messages\": [{\"role\": ..., \"content\": ...}, ...]},\n"
"                    rendered with tokenizer_config.json's chat_template; the loss\n"
"                    mask is 1 on the assistant's replies (and their end of turn)\n"
"  --format prompt-completion  JSON lines {\"prompt\": ..., \"completion\": ...};\n"
"                    the mask is 1 on the completion and EOS\n"
"  --chat-template FILE  a Jinja template instead of tokenizer_config.json's\n"
"  --text-out FILE   also write each conversation's text, one JSON string a line\n"
"  --bos TOKEN|none  what starts each document (default: what the tokenizer's\n"
"                    post-processor or tokenizer_config.json's add_bos_token adds;\n"
"                    not for chat, whose template writes it)\n"
"  --eos TOKEN|none  what ends each document (default: the same, add_eos_token;\n"
"                    prompt-completion: that or tokenizer_config.json's eos_token)\n"
"Chat and prompt-completion shards carry the mask and the document starts\n"
"(docs/formats.md). Tokens are uint16 when every id fits (llm.c's GPT-2 shards),\n"
"uint32 otherwise (llm.c's Llama 3 shards: magic 20240801, version 7).\n"
"Progress goes to stderr; the shard appears whole or not at all.\n"
"See docs/tokenizer.md.\n");
}

/* The temporary outputs, removed when the command dies or a signal ends
 * it; static for the handler. */
static char tmp_path[4096], text_tmp_path[4096];

static void tmp_remove(int code)
{
	(void)code;
	if (tmp_path[0])
		unlink(tmp_path);
	if (text_tmp_path[0])
		unlink(text_tmp_path);
	tmp_path[0] = text_tmp_path[0] = 0;
}

static void on_signal(int sig)
{
	if (tmp_path[0])
		unlink(tmp_path);
	if (text_tmp_path[0])
		unlink(text_tmp_path);
	signal(sig, SIG_DFL);
	raise(sig);
}

static void catch_signals(void)
{
	static const int sigs[] = { SIGINT, SIGTERM, SIGHUP };
	struct sigaction sa = { .sa_handler = on_signal };

	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < ST_ARRAY_LEN(sigs); i++)
		sigaction(sigs[i], &sa, NULL);
}

enum tok_format { FMT_TEXT, FMT_CHAT, FMT_PC };

struct out {
	struct st_file_atomic f;
	const char *path;
	unsigned width;      /* bytes per token: 2 or 4 */
	uint8_t buf[1 << 16];
	size_t used;
	uint64_t tokens;
	bool masked;         /* chat, prompt-completion: a mask and documents */
	uint8_t *mask;       /* [tokens] */
	uint64_t *docs;      /* document starts */
	size_t mask_cap, n_docs, docs_cap;
};

static void out_flush(struct out *o)
{
	int ret;

	if (!o->used)
		return;
	if ((ret = st_file_atomic_write(&o->f, o->buf, o->used)) < 0)
		st_cli_die(1, "--out %s: %s", o->path, st_error_last());
	o->used = 0;
}

static void *grow(void *p, size_t *cap, size_t need, size_t elem, const char *what)
{
	if (need <= *cap)
		return p;
	*cap = need > 2 * *cap ? need : 2 * *cap;
	if (!(p = realloc(p, *cap * elem)))
		st_cli_die(1, "tokenize: out of memory for the %s", what);
	return p;
}

/* Append n tokens; their mask bytes are m[i] (m may be NULL: all mval). */
static void out_ids_mask(struct out *o, const uint32_t *ids, size_t n, const uint8_t *m,
			 uint8_t mval)
{
	if (o->tokens + n > INT32_MAX)
		st_cli_die(2, "--out %s: more than %d tokens, the most an llm.c shard holds: "
			   "split the input", o->path, INT32_MAX);
	if (o->masked) {
		o->mask = grow(o->mask, &o->mask_cap, o->tokens + n, 1, "loss mask");
		for (size_t i = 0; i < n; i++)
			o->mask[o->tokens + i] = m ? m[i] : mval;
	}
	for (size_t i = 0; i < n; i++) {
		if (o->used + 4 > sizeof(o->buf))
			out_flush(o);
		for (unsigned b = 0; b < o->width; b++)
			o->buf[o->used++] = (uint8_t)(ids[i] >> (8 * b));
	}
	o->tokens += n;
}

static void out_ids(struct out *o, const uint32_t *ids, size_t n)
{
	out_ids_mask(o, ids, n, NULL, 0);
}

static void out_doc_start(struct out *o)
{
	o->docs = grow(o->docs, &o->docs_cap, o->n_docs + 1, sizeof(*o->docs), "documents");
	o->docs[o->n_docs++] = o->tokens;
}

/* --bos / --eos: a token's text, "none", or NULL for the tokenizer's own. */
static size_t special_ids(struct st_tokenizer *t, const char *flag, const char *arg,
			  const uint32_t *dflt, size_t n_dflt, uint32_t *one, const uint32_t **ids)
{
	int64_t id;

	if (!arg) {
		*ids = dflt;
		return n_dflt;
	}
	if (strcmp(arg, "none") == 0)
		return 0;
	if ((id = st_tokenizer_token_id(t, arg)) < 0)
		st_cli_die(2, "%s %s: the tokenizer has no such token", flag, arg);
	*one = (uint32_t)id;
	*ids = one;
	return 1;
}

/* The text of path (mapped) or of standard input (read). */
static const char *input_open(const char *path, size_t *bytes, bool *mapped)
{
	if (strcmp(path, "-") != 0) {
		uint64_t n;
		int fd, ret = st_file_open_regular(path, &fd, &n);
		void *p;

		if (ret < 0)
			st_cli_die(st_cli_input_exit(ret), "%s", st_error_last());
		*bytes = (size_t)n;
		*mapped = true;
		if (n == 0) {
			close(fd);
			*mapped = false;
			return "";
		}
		p = mmap(NULL, (size_t)n, PROT_READ, MAP_PRIVATE, fd, 0);
		close(fd);
		if (p == MAP_FAILED)
			st_cli_die(1, "%s: mmap: %s", path, strerror(errno));
		return p;
	}
	{
		size_t cap = 1 << 20, n = 0;
		ssize_t got;
		char *buf = malloc(cap);

		while (buf && (got = read(0, buf + n, cap - n)) != 0) {
			if (got < 0) {
				if (errno == EINTR)
					continue;
				st_cli_die(1, "standard input: read: %s", strerror(errno));
			}
			n += (size_t)got;
			if (n == cap)
				buf = realloc(buf, cap *= 2);
		}
		if (!buf)
			st_cli_die(1, "standard input: out of memory");
		*bytes = n;
		*mapped = false;
		return buf;
	}
}

static void input_close(const char *text, size_t bytes, bool mapped)
{
	if (mapped)
		munmap((void *)text, bytes);
	else if (bytes)
		free((void *)text);
}

/* What a run needs: the options, the tokenizer, the outputs. */
struct tok_piece;

struct job {
	enum tok_format format;
	const char *tpath, *bos_arg, *eos_arg, *template_file, *text_out;
	const char *const *inputs;
	size_t n_inputs, total_bytes, done_bytes;
	bool lines, quiet;
	struct st_tokenizer *t;
	struct st_chat *chat;
	const uint32_t *pre, *suf;
	size_t n_pre, n_suf;
	uint32_t bos_one, eos_one;
	uint64_t docs, t0, last, masked_tokens;
	struct st_tok_ids ids;
	struct out o;
	struct st_file_atomic text_f;
	bool text_open;
	struct tok_piece *pieces; /* [vocab], chat only */
	uint64_t split_convs;     /* conversations tokenized in pieces */
};

static void progress(struct job *j)
{
	uint64_t now = st_now_ns();
	double s;

	if (j->quiet || now - j->last <= 2000000000ull)
		return;
	s = (double)(now - j->t0) / 1e9;
	fprintf(stderr, "tokenize: %.1f of %.1f MB, %llu tokens, %.1f MB/s\n",
		(double)j->done_bytes / 1e6, (double)j->total_bytes / 1e6,
		(unsigned long long)j->o.tokens, (double)j->done_bytes / 1e6 / s);
	j->last = now;
}

static void encode(struct job *j, const char *where, const char *text, size_t n)
{
	int ret;

	j->ids.n = 0;
	if ((ret = st_tokenizer_encode(j->t, text, n, 0, &j->ids)) < 0)
		st_cli_die(ret == -ENOMEM ? 1 : 2, "%s: %s", where, st_error_last());
}

/* --- text ------------------------------------------------------------------- */

static void tokenize_text(struct job *j)
{
	for (size_t i = 0; i < j->n_inputs; i++) {
		bool mapped;
		size_t bytes, at = 0;
		const char *text = input_open(j->inputs[i], &bytes, &mapped);

		while (at < bytes || (!j->lines && at == 0)) {
			size_t end = bytes;

			if (j->lines) {
				const char *nl = memchr(text + at, '\n', bytes - at);

				end = nl ? (size_t)(nl - text) + 1 : bytes;
				if (end - at == 1 && text[at] == '\n') { /* an empty line */
					at = end;
					continue;
				}
			}
			encode(j, j->inputs[i], text + at, end - at);
			if (j->ids.n || !j->lines) {
				out_ids(&j->o, j->pre, j->n_pre);
				out_ids(&j->o, j->ids.ids, j->ids.n);
				out_ids(&j->o, j->suf, j->n_suf);
				j->docs++;
			}
			j->done_bytes += end - at;
			at = end;
			progress(j);
			if (bytes == 0)
				break;
		}
		input_close(text, bytes, mapped);
	}
}

/* --- chat and prompt-completion ---------------------------------------------- */

static void text_out(struct job *j, const char *s, size_t n)
{
	struct json_object *o;
	const char *js;
	int ret;

	if (!j->text_open)
		return;
	if (!(o = json_object_new_string_len(s, (int)n)))
		st_cli_die(1, "--text-out: out of memory");
	js = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
					    JSON_C_TO_STRING_NOSLASHESCAPE);
	if ((ret = st_file_atomic_write(&j->text_f, js, strlen(js))) < 0 ||
	    (ret = st_file_atomic_write(&j->text_f, "\n", 1)) < 0)
		st_cli_die(1, "--text-out %s: %s", j->text_out, st_error_last());
	json_object_put(o);
}

static const char *str_member(struct json_object *o, const char *key, size_t *n)
{
	struct json_object *v;

	if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string))
		return NULL;
	*n = (size_t)json_object_get_string_len(v);
	return json_object_get_string(v);
}

/* The mask of a reply's tokens: 1 through the first special token (the
 * end of turn the template writes), 0 after it. */
static void span_mask(const struct job *j, uint8_t *m)
{
	bool on = true;

	for (size_t i = 0; i < j->ids.n; i++) {
		m[i] = on;
		if (st_tokenizer_is_special(j->t, j->ids.ids[i]))
			on = false;
	}
}

/* A span bound inside an added token's text (two renders that part in
 * the middle of "<|im_end|>") moves to take the whole token in: to its
 * end for a span's end, to its start for a span's begin. */
static size_t snap_bound(const struct job *j, const char *text, size_t n, size_t b, bool end)
{
	for (size_t i = 0; i < st_tokenizer_n_added(j->t); i++) {
		const char *a;
		size_t len = st_tokenizer_added(j->t, i, &a);

		for (size_t p = b > len ? b - len + 1 : 0; len > 1 && p < b; p++)
			if (p + len <= n && p + len > b && !memcmp(text + p, a, len))
				return end ? p + len : p;
	}
	return b;
}

static size_t snap_spans(const struct job *j, const char *text, size_t n,
			 struct st_chat_span *spans, size_t n_spans)
{
	size_t kept = 0;

	for (size_t s = 0; s < n_spans; s++) {
		size_t b = snap_bound(j, text, n, spans[s].begin, false);
		size_t e = snap_bound(j, text, n, spans[s].end, true);

		if (kept && b < spans[kept - 1].end)
			b = spans[kept - 1].end;
		if (b < e)
			spans[kept++] = (struct st_chat_span){ b, e };
	}
	return kept;
}

static void chat_check(const char *where, struct json_object *obj)
{
	struct json_object *msgs;
	size_t n;

	if (!json_object_object_get_ex(obj, "messages", &msgs) ||
	    !json_object_is_type(msgs, json_type_array))
		st_cli_die(2, "%s: no \"messages\" list (--format chat reads {\"messages\": "
			   "[{\"role\": ..., \"content\": ...}, ...]})", where);
	if (!(n = json_object_array_length(msgs)))
		st_cli_die(2, "%s: \"messages\" is empty", where);
	for (size_t i = 0; i < n; i++) {
		struct json_object *m = json_object_array_get_idx(msgs, i);
		size_t len;

		if (!json_object_is_type(m, json_type_object) || !str_member(m, "role", &len) ||
		    !str_member(m, "content", &len))
			st_cli_die(2, "%s: message %zu has no string \"role\" and \"content\"",
				   where, i);
	}
}

/* Each token's bytes (decoded alone, raw), cached by id. */
struct tok_piece {
	char *p;
	size_t n;
	bool done;
};

static const struct tok_piece *piece(struct job *j, uint32_t id)
{
	struct tok_piece *pc;

	if (!j->pieces && !(j->pieces = calloc(st_tokenizer_vocab(j->t), sizeof(*j->pieces))))
		st_cli_die(1, "tokenize: out of memory");
	if (id >= st_tokenizer_vocab(j->t))
		return NULL;
	pc = &j->pieces[id];
	if (!pc->done && st_tokenizer_decode(j->t, &id, 1, ST_TOK_RAW | ST_TOK_NO_CLEANUP,
					     &pc->p, &pc->n) < 0)
		st_cli_die(1, "tokenize: out of memory");
	pc->done = true;
	return pc;
}

/* off[i] = where token i of j->ids starts in text; false when the tokens'
 * bytes, one after the other, are not the text (a tokenizer whose pieces
 * do not decode alone to what they encoded: SentencePiece's "▁"). */
static bool token_offsets(struct job *j, const char *text, size_t n, size_t *off)
{
	size_t at = 0;

	for (size_t i = 0; i < j->ids.n; i++) {
		const struct tok_piece *pc = piece(j, j->ids.ids[i]);

		if (!pc || at + pc->n > n || memcmp(text + at, pc->p, pc->n))
			return false;
		off[i] = at;
		at += pc->n;
	}
	off[j->ids.n] = at;
	return at == n;
}

/* The mask from the whole text's tokens: in each span, the tokens whose
 * bytes overlap it, from the first through the first special one. */
static void mask_by_offsets(struct job *j, const size_t *off, const struct st_chat_span *spans,
			    size_t n_spans, uint8_t *m)
{
	size_t i = 0;

	memset(m, 0, j->ids.n);
	for (size_t s = 0; s < n_spans; s++) {
		while (i < j->ids.n && off[i + 1] <= spans[s].begin)
			i++;
		for (; i < j->ids.n && off[i] < spans[s].end; i++) {
			m[i] = 1;
			if (st_tokenizer_is_special(j->t, j->ids.ids[i])) {
				i++;
				break;
			}
		}
	}
}

/* The text tokenized in pieces at the spans' bounds (for a tokenizer
 * token_offsets() cannot follow); the mask as above within each span. */
static void chat_by_segments(struct job *j, const char *where, const char *text, size_t n,
			     const struct st_chat_span *spans, size_t n_spans)
{
	uint8_t *m = NULL;
	size_t m_cap = 0, at = 0;

	for (size_t s = 0; s <= n_spans; s++) {
		size_t begin = s < n_spans ? spans[s].begin : n;

		encode(j, where, text + at, begin - at);
		out_ids(&j->o, j->ids.ids, j->ids.n);
		if (s == n_spans)
			break;
		encode(j, where, text + begin, spans[s].end - begin);
		m = grow(m, &m_cap, j->ids.n + 1, 1, "loss mask");
		span_mask(j, m);
		for (size_t i = 0; i < j->ids.n; i++)
			j->masked_tokens += m[i];
		out_ids_mask(&j->o, j->ids.ids, j->ids.n, m, 0);
		at = spans[s].end;
	}
	j->split_convs++;
	free(m);
}

static void chat_line(struct job *j, const char *where, struct json_object *obj)
{
	struct json_object *msgs;
	struct st_chat_span *spans;
	char *text;
	size_t n, n_spans, *off;
	uint8_t *m;
	int ret;

	chat_check(where, obj);
	json_object_object_get_ex(obj, "messages", &msgs);
	if ((ret = st_chat_render(j->chat, msgs, json_object_array_length(msgs), false, &text,
				  &n)) < 0 ||
	    !(spans = malloc(json_object_array_length(msgs) * sizeof(*spans))) ||
	    (ret = st_chat_spans(j->chat, msgs, text, n, spans, &n_spans)) < 0)
		st_cli_die(ret == -ENOMEM ? 1 : 2, "%s: the chat template: %s", where,
			   ret ? st_error_last() : "out of memory");
	n_spans = snap_spans(j, text, n, spans, n_spans);
	text_out(j, text, n);
	out_doc_start(&j->o);
	encode(j, where, text, n);
	if (!(off = malloc((j->ids.n + 1) * sizeof(*off))) || !(m = malloc(j->ids.n + 1)))
		st_cli_die(1, "tokenize: out of memory");
	if (token_offsets(j, text, n, off)) {
		mask_by_offsets(j, off, spans, n_spans, m);
		for (size_t i = 0; i < j->ids.n; i++)
			j->masked_tokens += m[i];
		out_ids_mask(&j->o, j->ids.ids, j->ids.n, m, 0);
	} else {
		chat_by_segments(j, where, text, n, spans, n_spans);
	}
	free(m);
	free(off);
	free(spans);
	free(text);
}

/* How many of the whole text's tokens (j->ids) belong to the prompt
 * (its first pn bytes): by the tokens' bytes when they give back the text
 * (the first token that reaches into the completion starts it), else the
 * prompt's own tokens when they begin the whole text's; SIZE_MAX when
 * neither holds (the two are then tokenized apart). */
static size_t prompt_tokens(struct job *j, const char *where, const char *both, size_t pn,
			    size_t n)
{
	size_t *off = malloc((j->ids.n + 1) * sizeof(*off)), k = SIZE_MAX;
	struct st_tok_ids whole = j->ids;

	if (!off)
		st_cli_die(1, "tokenize: out of memory");
	if (token_offsets(j, both, n, off)) {
		for (k = 0; k < j->ids.n && off[k + 1] <= pn; k++)
			;
		free(off);
		return k;
	}
	free(off);
	j->ids = (struct st_tok_ids){ 0 };
	encode(j, where, both, pn);
	if (j->ids.n <= whole.n && !memcmp(j->ids.ids, whole.ids, j->ids.n * sizeof(*whole.ids)))
		k = j->ids.n;
	st_tok_ids_fini(&j->ids);
	j->ids = whole;
	return k;
}

/* BOS, prompt + completion as one text, EOS; the mask from the first token
 * of the completion (prompt_tokens()) through EOS. */
static void pc_line(struct job *j, const char *where, struct json_object *obj)
{
	size_t pn, cn, k;
	const char *p = str_member(obj, "prompt", &pn), *c = str_member(obj, "completion", &cn);
	char *both;

	if (!p || !c)
		st_cli_die(2, "%s: no string \"prompt\" and \"completion\" (--format "
			   "prompt-completion reads {\"prompt\": ..., \"completion\": ...})", where);
	if (!(both = malloc(pn + cn + 1)))
		st_cli_die(1, "tokenize: out of memory");
	memcpy(both, p, pn);
	memcpy(both + pn, c, cn);
	text_out(j, both, pn + cn);
	out_doc_start(&j->o);
	out_ids(&j->o, j->pre, j->n_pre);
	encode(j, where, both, pn + cn);
	if ((k = prompt_tokens(j, where, both, pn, pn + cn)) != SIZE_MAX) {
		out_ids(&j->o, j->ids.ids, k);
		out_ids_mask(&j->o, j->ids.ids + k, j->ids.n - k, NULL, 1);
		j->masked_tokens += j->ids.n - k;
	} else {
		encode(j, where, p, pn);
		out_ids(&j->o, j->ids.ids, j->ids.n);
		encode(j, where, c, cn);
		out_ids_mask(&j->o, j->ids.ids, j->ids.n, NULL, 1);
		j->masked_tokens += j->ids.n;
		j->split_convs++;
	}
	out_ids_mask(&j->o, j->suf, j->n_suf, NULL, 1);
	j->masked_tokens += j->n_suf;
	free(both);
}

static void jsonl_file(struct job *j, const char *path)
{
	bool mapped;
	size_t bytes, at = 0, line = 0;
	const char *text = input_open(path, &bytes, &mapped);
	struct json_tokener *tk = json_tokener_new();

	if (!tk)
		st_cli_die(1, "tokenize: out of memory");
	json_tokener_set_flags(tk, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
	while (at < bytes) {
		const char *nl = memchr(text + at, '\n', bytes - at);
		size_t end = nl ? (size_t)(nl - text) : bytes, len = end - at, k = 0;
		char where[4200];
		struct json_object *obj;

		line++;
		snprintf(where, sizeof(where), "%s:%zu", strcmp(path, "-") ? path : "stdin", line);
		while (k < len && text[at + k] && strchr(" \t\r", text[at + k]))
			k++;
		if (k < len) {
			if (len > INT32_MAX)
				st_cli_die(2, "%s: a line of more than 2 GiB", where);
			json_tokener_reset(tk);
			obj = json_tokener_parse_ex(tk, text + at, (int)len);
			for (k = obj ? json_tokener_get_parse_end(tk) : len;
			     k < len && text[at + k] && strchr(" \t\r", text[at + k]); k++)
				;
			if (!obj || !json_object_is_type(obj, json_type_object) || k < len)
				st_cli_die(2, "%s: not one JSON object (%s)", where,
					   obj ? "extra text or not an object" :
					   json_tokener_error_desc(json_tokener_get_error(tk)));
			if (j->format == FMT_CHAT)
				chat_line(j, where, obj);
			else
				pc_line(j, where, obj);
			j->docs++;
			json_object_put(obj);
		}
		j->done_bytes += end - at + (nl != NULL);
		at = end + 1;
		progress(j);
	}
	json_tokener_free(tk);
	input_close(text, bytes, mapped);
}

/* --- guards -------------------------------------------------------------------- */

/* Refuse an output that is one of the inputs or of the tokenizer's files
 * (or each other), by any path (st_cli_same_file): `--out X X` would replace the
 * text with its tokens, `--out DIR/tokenizer.json` the tokenizer. */
static void same_file_check(const struct job *j, const char *flag, const char *path)
{
	static const char *const tok_files[] = { "tokenizer.json", "tokenizer_config.json" };
	struct stat sb;
	char file[PATH_MAX + 32];

	if (!path || stat(path, &sb) < 0) /* a new file is none of them */
		return;
	for (size_t i = 0; i < j->n_inputs; i++)
		if (strcmp(j->inputs[i], "-") && st_cli_same_file(path, j->inputs[i]))
			st_cli_die(2, "%s %s is the input %s: tokenize would overwrite it", flag,
				   path, j->inputs[i]);
	if (j->template_file && st_cli_same_file(path, j->template_file))
		st_cli_die(2, "%s %s is the --chat-template %s: tokenize would overwrite it", flag,
			   path, j->template_file);
	if (!j->tpath || stat(j->tpath, &sb) < 0)
		return;
	for (size_t i = 0; i < (S_ISDIR(sb.st_mode) ? ST_ARRAY_LEN(tok_files) : 1); i++) {
		if (S_ISDIR(sb.st_mode))
			snprintf(file, sizeof(file), "%s/%s", j->tpath, tok_files[i]);
		else
			snprintf(file, sizeof(file), "%s", j->tpath);
		if (st_cli_same_file(path, file))
			st_cli_die(2, "%s %s is the tokenizer's %s: tokenize would overwrite it",
				   flag, path, file);
	}
}

/* Remove the OUT.tmp.XXXXXX a killed tokenize left: one no process holds
 * locked (each run flocks its own) and unchanged for a minute (not one
 * a run has just created and not locked yet). */
static void stale_tmp_clean(const char *out, bool quiet)
{
	char dir[PATH_MAX], name[PATH_MAX], path[2 * PATH_MAX];
	const char *slash = strrchr(out, '/');
	size_t nlen;
	struct dirent *de;
	DIR *d;

	snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - out) + (slash == out) : 1,
		 slash ? out : ".");
	snprintf(name, sizeof(name), "%s.tmp.", slash ? slash + 1 : out);
	nlen = strlen(name);
	if (!(d = opendir(dir)))
		return;
	while ((de = readdir(d))) {
		struct stat sb;
		int fd;

		if (strncmp(de->d_name, name, nlen) || strlen(de->d_name) != nlen + 6)
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)) < 0)
			continue;
		if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && time(NULL) - sb.st_mtime > 60 &&
		    flock(fd, LOCK_EX | LOCK_NB) == 0 && unlink(path) == 0 && !quiet)
			fprintf(stderr, "strata: note: removed %s, left by a tokenize that "
				"did not finish\n", path);
		close(fd);
	}
	closedir(d);
}

static void out_open(struct job *j)
{
	int ret;

	stale_tmp_clean(j->o.path, j->quiet);
	if ((ret = st_file_atomic_open(&j->o.f, j->o.path)) < 0)
		st_cli_die(st_cli_input_exit(ret) == 2 ? 2 : 1, "--out %s: %s", j->o.path,
			   st_error_last());
	snprintf(tmp_path, sizeof(tmp_path), "%s", j->o.f.tmp_path);
	st_cli_at_die(tmp_remove);
	catch_signals();
	flock(j->o.f.fd, LOCK_EX | LOCK_NB);
	if (j->text_out) {
		stale_tmp_clean(j->text_out, j->quiet);
		if ((ret = st_file_atomic_open(&j->text_f, j->text_out)) < 0)
			st_cli_die(st_cli_input_exit(ret) == 2 ? 2 : 1, "--text-out %s: %s",
				   j->text_out, st_error_last());
		snprintf(text_tmp_path, sizeof(text_tmp_path), "%s", j->text_f.tmp_path);
		flock(j->text_f.fd, LOCK_EX | LOCK_NB);
		j->text_open = true;
	}
}

/* --- the command ---------------------------------------------------------------- */

static void parse_args(int argc, char **argv, struct job *j)
{
	static const struct option longs[] = {
		{ "tokenizer", 1, 0, 't' }, { "out", 1, 0, 'o' }, { "lines", 0, 0, 'l' },
		{ "bos", 1, 0, 'b' }, { "eos", 1, 0, 'e' }, { "format", 1, 0, 'f' },
		{ "chat-template", 1, 0, 'c' }, { "text-out", 1, 0, 'x' }, { "help", 0, 0, 'h' },
		{ 0 },
	};
	static const char *const stdin_only[] = { "-" };
	int c;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		switch (c) {
		case 't': j->tpath = optarg; break;
		case 'o': j->o.path = optarg; break;
		case 'l': j->lines = true; break;
		case 'b': j->bos_arg = optarg; break;
		case 'e': j->eos_arg = optarg; break;
		case 'c': j->template_file = optarg; break;
		case 'x': j->text_out = optarg; break;
		case 'f':
			if (!strcmp(optarg, "text"))
				j->format = FMT_TEXT;
			else if (!strcmp(optarg, "chat"))
				j->format = FMT_CHAT;
			else if (!strcmp(optarg, "prompt-completion"))
				j->format = FMT_PC;
			else
				st_cli_die(2, "--format %s: text, chat or prompt-completion", optarg);
			break;
		case 'h': tok_usage(stdout); exit(0);
		default: st_cli_bad_option("tokenize", longs, argv[optind - 1]);
		}
	}
	if (!j->tpath || !j->o.path)
		st_cli_die(2, "tokenize: --tokenizer DIR and --out FILE are required");
	if (j->format != FMT_TEXT && j->lines)
		st_cli_die(2, "--lines is for --format text (JSON lines are one a line)");
	if (j->format == FMT_TEXT && (j->template_file || j->text_out))
		st_cli_die(2, "--chat-template and --text-out are for --format chat or "
			   "prompt-completion");
	if (j->format == FMT_CHAT && (j->bos_arg || j->eos_arg))
		st_cli_die(2, "--bos/--eos: with --format chat the template writes them");
	if (j->template_file && j->format != FMT_CHAT)
		st_cli_die(2, "--chat-template is for --format chat");
	j->inputs = optind < argc ? (const char *const *)argv + optind : stdin_only;
	j->n_inputs = optind < argc ? (size_t)(argc - optind) : 1;
}

static void check_inputs(struct job *j)
{
	struct stat sb;

	if (stat(j->o.path, &sb) == 0 && S_ISDIR(sb.st_mode))
		st_cli_die(2, "--out %s is a directory; tokenize writes a file", j->o.path);
	if (j->text_out && !strcmp(j->text_out, j->o.path))
		st_cli_die(2, "--text-out and --out are both %s", j->o.path);
	for (size_t i = 0; i < j->n_inputs; i++) {
		if (strcmp(j->inputs[i], "-") == 0)
			continue;
		if (stat(j->inputs[i], &sb) < 0)
			st_cli_die(2, "%s: %s", j->inputs[i], strerror(errno));
		if (!S_ISREG(sb.st_mode))
			st_cli_die(2, "%s: not a regular file", j->inputs[i]);
		j->total_bytes += (size_t)sb.st_size;
	}
	same_file_check(j, "--out", j->o.path);
	same_file_check(j, "--text-out", j->text_out);
}

/* The tokenizer, its hash, its chat template, the ids around a document. */
static uint64_t open_tokenizer(struct job *j)
{
	char file[PATH_MAX];
	const uint32_t *dp, *ds;
	size_t n_dp, n_ds;
	uint64_t hash = 0;
	struct stat sb;
	int ret;

	if ((ret = st_tokenizer_open(j->tpath, &j->t)) < 0)
		st_cli_die(st_cli_input_exit(ret), "--tokenizer %s: %s", j->tpath,
			   st_cli_unprefix(st_error_last(), j->tpath));
	if (stat(j->tpath, &sb) == 0 && S_ISDIR(sb.st_mode))
		snprintf(file, sizeof(file), "%s/tokenizer.json", j->tpath);
	else
		snprintf(file, sizeof(file), "%s", j->tpath);
	if ((ret = st_file_hash(file, &hash)) < 0)
		st_cli_die(1, "--tokenizer %s: %s", j->tpath, st_error_last());
	if (j->format == FMT_CHAT &&
	    (ret = st_chat_open(j->tpath, j->template_file, &j->chat)) < 0)
		st_cli_die(st_cli_input_exit(ret), "--tokenizer %s: %s", j->tpath, st_error_last());
	n_dp = st_tokenizer_prefix(j->t, &dp);
	n_ds = st_tokenizer_suffix(j->t, &ds);
	j->n_pre = special_ids(j->t, "--bos", j->bos_arg, dp, n_dp, &j->bos_one, &j->pre);
	j->n_suf = special_ids(j->t, "--eos", j->eos_arg, ds, n_ds, &j->eos_one, &j->suf);
	if (j->format == FMT_PC && !j->eos_arg && !j->n_suf && st_tokenizer_eos_id(j->t) >= 0) {
		j->eos_one = (uint32_t)st_tokenizer_eos_id(j->t);
		j->suf = &j->eos_one;
		j->n_suf = 1;
	}
	j->o.width = st_tokenizer_vocab(j->t) > 65536 ? 4 : 2;
	j->o.masked = j->format != FMT_TEXT;
	if (!j->quiet && j->format == FMT_TEXT && j->n_pre + j->n_suf == 0)
		fprintf(stderr, "strata: note: documents are not separated: the tokenizer adds "
			"no BOS/EOS (--bos TOKEN or --eos TOKEN adds one)\n");
	return hash;
}

static void commit(struct job *j, uint64_t hash)
{
	struct st_shard_ext ext = { .tokenizer_hash = hash };
	uint8_t hdr[ST_LLMC_HEADER_INTS * 4];
	sigset_t set;
	int ret;

	out_flush(&j->o);
	if (j->o.tokens == 0)
		st_cli_die(2, "tokenize: no tokens: the input is empty (an llm.c shard holds at "
			   "least one)");
	if (j->o.masked) {
		ext.mask = j->o.mask;
		ext.doc_starts = j->o.docs;
		ext.n_docs = j->o.n_docs;
		if ((ret = st_shard_trailer_write(&j->o.f, j->o.width, j->o.tokens, &ext)) < 0)
			st_cli_die(1, "--out %s: %s", j->o.path, st_error_last());
	}
	st_shard_header(hdr, j->o.width, j->o.tokens, &ext);
	if (pwrite(j->o.f.fd, hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr))
		st_cli_die(1, "--out %s: writing the header: %s", j->o.path, strerror(errno));
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGHUP);
	sigprocmask(SIG_BLOCK, &set, NULL);
	ret = j->text_open ? st_file_atomic_commit(&j->text_f) : 0;
	if (ret == 0) {
		text_tmp_path[0] = 0;
		ret = st_file_atomic_commit(&j->o.f);
		tmp_path[0] = 0;
	}
	sigprocmask(SIG_UNBLOCK, &set, NULL);
	if (ret < 0)
		st_cli_die(1, "--out %s: %s", j->o.path, st_error_last());
	st_cli_at_die(NULL);
}

int st_cli_tokenize(int argc, char **argv)
{
	static struct job j;
	uint8_t hdr[ST_LLMC_HEADER_INTS * 4] = { 0 };
	uint64_t hash;
	int ret;

	j.quiet = getenv("ST_QUIET") && strcmp(getenv("ST_QUIET"), "0");
	parse_args(argc, argv, &j);
	check_inputs(&j);
	hash = open_tokenizer(&j);
	out_open(&j);
	if ((ret = st_file_atomic_write(&j.o.f, hdr, sizeof(hdr))) < 0)
		st_cli_die(1, "--out %s: %s", j.o.path, st_error_last());
	j.t0 = j.last = st_now_ns();
	if (j.format == FMT_TEXT)
		tokenize_text(&j);
	else
		for (size_t i = 0; i < j.n_inputs; i++)
			jsonl_file(&j, j.inputs[i]);
	commit(&j, hash);
	{
		double s = (double)(st_now_ns() - j.t0) / 1e9;

		printf("tokenize: %llu tokens (uint%u) from %llu %s, %.1f MB of text in %.1f s, "
		       "to %s", (unsigned long long)j.o.tokens, j.o.width * 8,
		       (unsigned long long)j.docs, j.format == FMT_CHAT ? "conversations" :
		       j.format == FMT_PC ? "examples" : "documents",
		       (double)j.done_bytes / 1e6, s, j.o.path);
		if (j.o.masked)
			printf("; %llu tokens in the loss mask", (unsigned long long)j.masked_tokens);
		printf("\n");
	}
	if (j.split_convs && !j.quiet)
		fprintf(stderr, "strata: note: %llu %s tokenized in pieces at the %s (this "
			"tokenizer's tokens do not decode one by one to the text; "
			"docs/tokenizer.md)\n", (unsigned long long)j.split_convs,
			j.format == FMT_CHAT ? "conversations" : "examples",
			j.format == FMT_CHAT ? "assistant's bounds" : "completion");
	for (size_t i = 0; j.pieces && i < st_tokenizer_vocab(j.t); i++)
		free(j.pieces[i].p);
	free(j.pieces);
	st_tok_ids_fini(&j.ids);
	st_chat_close(j.chat);
	st_tokenizer_close(j.t);
	free(j.o.mask);
	free(j.o.docs);
	return 0;
}

/* --- for generate and eval ------------------------------------------------- */

static bool is_file(const char *p)
{
	struct stat sb;

	return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

bool st_cli_tokenizer_dir(const char *ckpt, char *out, size_t n)
{
	char dir[4096], cand[4096 + 32];
	struct stat sb;

	/* beside the checkpoint: in DIR, in DIR/.. (a step-N of a --save DIR),
	 * or beside a file */
	if (stat(ckpt, &sb) == 0 && S_ISDIR(sb.st_mode))
		snprintf(dir, sizeof(dir), "%s", ckpt);
	else {
		const char *slash = strrchr(ckpt, '/');

		snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - ckpt) : 1,
			 slash ? ckpt : ".");
	}
	snprintf(cand, sizeof(cand), "%s/tokenizer.json", dir);
	if (is_file(cand)) {
		snprintf(out, n, "%s", dir);
		return true;
	}
	snprintf(cand, sizeof(cand), "%s/../tokenizer.json", dir);
	if (is_file(cand)) {
		/* "ck/step-000004/.." is named "ck" (the path people gave) */
		const char *slash = strrchr(dir, '/'), *last = slash ? slash + 1 : dir;

		if (!strcmp(last, ".") || !strcmp(last, "..") || !*last)
			snprintf(out, n, "%s/..", dir);
		else if (!slash)
			snprintf(out, n, ".");
		else
			snprintf(out, n, "%.*s", slash == dir ? 1 : (int)(slash - dir), dir);
		return true;
	}
	return false;
}

/* The files of a Hugging Face tokenizer as save_pretrained() writes them
 * beside the model (tokenizer.json first: the one a copy needs), and what
 * inference reads with them: generation_config.json (the special tokens'
 * ids, sampling defaults) and SentencePiece's tokenizer.model (the slow
 * tokenizers of Llama 2 and Mistral). */
static const char *const tokenizer_files[] = { "tokenizer.json", "tokenizer_config.json",
					       "special_tokens_map.json", "generation_config.json",
					       "tokenizer.model" };

int st_cli_tokenizer_copy(const char *from, const char *to)
{
	int copied = 0;

	for (size_t i = 0; i < sizeof(tokenizer_files) / sizeof(tokenizer_files[0]); i++) {
		char src[4200], dst[4200];
		struct st_file_atomic f;
		char *buf = NULL;
		size_t bytes = 0;
		int ret;

		snprintf(src, sizeof(src), "%s/%s", from, tokenizer_files[i]);
		snprintf(dst, sizeof(dst), "%s/%s", to, tokenizer_files[i]);
		if (!is_file(src))
			continue;
		if (access(dst, F_OK) == 0) /* already there: left as it is */
			continue;
		ret = st_file_read_small(src, (size_t)1 << 30, &buf, &bytes);
		if (ret < 0)
			st_cli_die(1, "%s: %s", src, strerror(-ret));
		ret = st_file_atomic_open(&f, dst);
		if (ret == 0)
			ret = st_file_atomic_write(&f, buf, bytes);
		if (ret == 0)
			ret = st_file_atomic_commit_new(&f);
		else
			st_file_atomic_abort(&f);
		free(buf);
		if (ret < 0 && ret != -EEXIST)
			st_cli_die(1, "%s: %s", dst, strerror(-ret));
		copied += ret == 0;
	}
	return copied;
}

struct st_tokenizer *st_cli_tokenizer(const char *given, const char *ckpt)
{
	struct st_tokenizer *t;
	char dir[4096], cand[4096 + 32];
	const char *src = given;
	int ret;

	if (!src) {
		if (!st_cli_tokenizer_dir(ckpt, dir, sizeof(dir)))
			return NULL;
		snprintf(cand, sizeof(cand), "%s/tokenizer.json", dir);
		src = cand;
	}
	if ((ret = st_tokenizer_open(src, &t)) < 0)
		st_cli_die(st_cli_input_exit(ret), "--tokenizer %s: %s", src,
			   st_cli_unprefix(st_error_last(), src));
	return t;
}

int st_cli_text_shard(struct st_tokenizer *t, const char *text_path, char *out, size_t n)
{
	static struct out o;
	const uint32_t *pre, *suf;
	size_t n_pre = st_tokenizer_prefix(t, &pre), n_suf = st_tokenizer_suffix(t, &suf);
	uint8_t hdr[ST_LLMC_HEADER_INTS * 4] = { 0 };
	struct st_tok_ids ids = { 0 };
	const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
	size_t bytes;
	bool mapped;
	const char *text;
	int fd, ret;

	snprintf(out, n, "%s/strata-eval-XXXXXX", dir);
	if ((fd = mkstemp(out)) < 0)
		st_cli_die(1, "%s: %s", out, strerror(errno));
	o = (struct out){ .f = { .fd = fd, .path = out, .tmp_path = NULL }, .path = out,
			  .width = st_tokenizer_vocab(t) > 65536 ? 4 : 2 };
	snprintf(tmp_path, sizeof(tmp_path), "%s", out);
	st_cli_at_die(tmp_remove);
	if (write(fd, hdr, sizeof(hdr)) != (ssize_t)sizeof(hdr))
		st_cli_die(1, "%s: %s", out, strerror(errno));
	text = input_open(text_path, &bytes, &mapped);
	if ((ret = st_tokenizer_encode(t, text, bytes, 0, &ids)) < 0)
		st_cli_die(ret == -ENOMEM ? 1 : 2, "--data %s: %s", text_path, st_error_last());
	out_ids(&o, pre, n_pre);
	out_ids(&o, ids.ids, ids.n);
	out_ids(&o, suf, n_suf);
	out_flush(&o);
	if (o.tokens == 0)
		st_cli_die(2, "--data %s: no tokens", text_path);
	{
		const int32_t head[3] = { o.width == 4 ? ST_LLMC32_MAGIC : ST_LLMC_MAGIC,
					  o.width == 4 ? ST_LLMC32_VERSION : ST_LLMC_VERSION,
					  (int32_t)o.tokens };

		for (int i = 0; i < 3; i++)
			for (int b = 0; b < 4; b++)
				hdr[4 * i + b] = (uint8_t)((uint32_t)head[i] >> (8 * b));
		if (pwrite(fd, hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr))
			st_cli_die(1, "%s: %s", out, strerror(errno));
	}
	close(fd);
	if (mapped)
		munmap((void *)text, bytes);
	else if (bytes)
		free((void *)text);
	st_tok_ids_fini(&ids);
	return 0;
}

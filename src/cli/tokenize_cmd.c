/* strata: `strata tokenize`, text to an llm.c token shard with a Hugging
 * Face tokenizer (strata/tokenizer.h).
 *
 * Each FILE (or standard input, `-`) is one document, or with --lines each
 * of its non-empty lines; each document gets the ids the tokenizer adds to
 * a sequence (its post-processor, or tokenizer_config.json's
 * add_bos_token / add_eos_token), or those --bos/--eos name. The shard is
 * llm.c's: uint16 tokens (magic 20240520, version 1) when every id fits,
 * uint32 (20240801, version 7, as llm.c writes Llama 3's) otherwise; what
 * `strata train --data` reads.
 * The output appears whole or not at all: written under a temporary name
 * (removed on any failure and on SIGINT/SIGTERM/SIGHUP), fsynced, renamed. */
#include "cli.h"
#include "strata/dataset.h"
#include "strata/file.h"
#include "strata/tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static void tok_usage(FILE *f)
{
	fprintf(f,
"usage: strata tokenize --tokenizer DIR|tokenizer.json --out FILE.bin [--lines]\n"
"                       [--bos TOKEN|none] [--eos TOKEN|none] [FILE...|-]\n"
"\n"
"Text to an llm.c token shard (what strata train --data reads), with a Hugging\n"
"Face tokenizer: DIR holds tokenizer.json (and tokenizer_config.json), or name\n"
"the tokenizer.json. Each FILE is one document (standard input when none, or\n"
"-); with --lines each non-empty line is one. Invalid UTF-8 is read as U+FFFD.\n"
"Tokens are uint16 when every id fits (llm.c's GPT-2 shards), uint32 otherwise\n"
"(llm.c's Llama 3 shards: magic 20240801, version 7).\n"
"  --bos TOKEN|none  what starts each document (default: what the tokenizer's\n"
"                    post-processor or tokenizer_config.json's add_bos_token adds)\n"
"  --eos TOKEN|none  what ends each document (default: the same, add_eos_token)\n"
"Progress goes to stderr; the shard appears whole or not at all.\n");
}

/* The temporary output, removed when the command dies or a signal ends
 * it; static for the handler. */
static char tmp_path[4096];

static void tmp_remove(int code)
{
	(void)code;
	if (tmp_path[0])
		unlink(tmp_path);
	tmp_path[0] = 0;
}

static void on_signal(int sig)
{
	if (tmp_path[0])
		unlink(tmp_path);
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

struct out {
	struct st_file_atomic f;
	const char *path;
	unsigned width;      /* bytes per token: 2 or 4 */
	uint8_t buf[1 << 16];
	size_t used;
	uint64_t tokens;
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

static void out_ids(struct out *o, const uint32_t *ids, size_t n)
{
	if (o->tokens + n > INT32_MAX)
		st_cli_die(2, "--out %s: more than %d tokens, the most an llm.c shard holds: "
			   "split the input", o->path, INT32_MAX);
	for (size_t i = 0; i < n; i++) {
		if (o->used + 4 > sizeof(o->buf))
			out_flush(o);
		for (unsigned b = 0; b < o->width; b++)
			o->buf[o->used++] = (uint8_t)(ids[i] >> (8 * b));
	}
	o->tokens += n;
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

int st_cli_tokenize(int argc, char **argv)
{
	static const struct option longs[] = {
		{ "tokenizer", 1, 0, 't' }, { "out", 1, 0, 'o' }, { "lines", 0, 0, 'l' },
		{ "bos", 1, 0, 'b' }, { "eos", 1, 0, 'e' }, { "help", 0, 0, 'h' }, { 0 },
	};
	const char *tpath = NULL, *bos_arg = NULL, *eos_arg = NULL;
	const char *const stdin_only[] = { "-" };
	const char *const *inputs;
	const uint32_t *pre = NULL, *suf = NULL, *dp, *ds;
	uint32_t bos_one, eos_one;
	size_t n_pre, n_suf, n_dp, n_ds, n_inputs, total_bytes = 0, done_bytes = 0;
	uint64_t docs = 0, t0, last;
	struct st_tokenizer *t;
	struct st_tok_ids ids = { 0 };
	static struct out o;
	bool lines = false, quiet = getenv("ST_QUIET") && strcmp(getenv("ST_QUIET"), "0");
	uint8_t hdr[ST_LLMC_HEADER_INTS * 4] = { 0 };
	int c, ret;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		switch (c) {
		case 't': tpath = optarg; break;
		case 'o': o.path = optarg; break;
		case 'l': lines = true; break;
		case 'b': bos_arg = optarg; break;
		case 'e': eos_arg = optarg; break;
		case 'h': tok_usage(stdout); return 0;
		default: st_cli_bad_option("tokenize", longs, argv[optind - 1]);
		}
	}
	if (!tpath || !o.path)
		st_cli_die(2, "tokenize: --tokenizer DIR and --out FILE are required");
	{
		struct stat sb;

		if (stat(o.path, &sb) == 0 && S_ISDIR(sb.st_mode))
			st_cli_die(2, "--out %s is a directory; tokenize writes a file", o.path);
	}
	inputs = optind < argc ? (const char *const *)argv + optind : stdin_only;
	n_inputs = optind < argc ? (size_t)(argc - optind) : 1;
	for (size_t i = 0; i < n_inputs; i++) {
		struct stat sb;

		if (strcmp(inputs[i], "-") == 0)
			continue;
		if (stat(inputs[i], &sb) < 0)
			st_cli_die(2, "%s: %s", inputs[i], strerror(errno));
		if (!S_ISREG(sb.st_mode))
			st_cli_die(2, "%s: not a regular file", inputs[i]);
		total_bytes += (size_t)sb.st_size;
	}
	if ((ret = st_tokenizer_open(tpath, &t)) < 0)
		st_cli_die(st_cli_input_exit(ret), "--tokenizer %s: %s", tpath,
			   st_cli_unprefix(st_error_last(), tpath));
	n_dp = st_tokenizer_prefix(t, &dp);
	n_ds = st_tokenizer_suffix(t, &ds);
	n_pre = special_ids(t, "--bos", bos_arg, dp, n_dp, &bos_one, &pre);
	n_suf = special_ids(t, "--eos", eos_arg, ds, n_ds, &eos_one, &suf);
	o.width = st_tokenizer_vocab(t) > 65536 ? 4 : 2;
	if (!quiet && n_pre + n_suf == 0)
		fprintf(stderr, "strata: note: documents are not separated: the tokenizer adds "
			"no BOS/EOS (--bos TOKEN or --eos TOKEN adds one)\n");

	if ((ret = st_file_atomic_open(&o.f, o.path)) < 0)
		st_cli_die(st_cli_input_exit(ret) == 2 ? 2 : 1, "--out %s: %s", o.path,
			   st_error_last());
	snprintf(tmp_path, sizeof(tmp_path), "%s", o.f.tmp_path);
	st_cli_at_die(tmp_remove);
	catch_signals();
	if ((ret = st_file_atomic_write(&o.f, hdr, sizeof(hdr))) < 0)
		st_cli_die(1, "--out %s: %s", o.path, st_error_last());

	t0 = last = st_now_ns();
	for (size_t i = 0; i < n_inputs; i++) {
		bool mapped;
		size_t bytes, at = 0;
		const char *text = input_open(inputs[i], &bytes, &mapped);

		while (at < bytes || (!lines && at == 0)) {
			size_t end = bytes;
			uint64_t now;

			if (lines) {
				const char *nl = memchr(text + at, '\n', bytes - at);

				end = nl ? (size_t)(nl - text) + 1 : bytes;
				if (end - at == 1 && text[at] == '\n') { /* an empty line */
					at = end;
					continue;
				}
			}
			ids.n = 0;
			if ((ret = st_tokenizer_encode(t, text + at, end - at, 0, &ids)) < 0)
				st_cli_die(ret == -ENOMEM ? 1 : 2, "%s: %s", inputs[i],
					   st_error_last());
			if (ids.n || !lines) {
				out_ids(&o, pre, n_pre);
				out_ids(&o, ids.ids, ids.n);
				out_ids(&o, suf, n_suf);
				docs++;
			}
			done_bytes += end - at;
			at = end;
			now = st_now_ns();
			if (!quiet && now - last > 2000000000ull) {
				double s = (double)(now - t0) / 1e9;

				fprintf(stderr, "tokenize: %.1f of %.1f MB, %llu tokens, %.1f MB/s\n",
					(double)done_bytes / 1e6, (double)total_bytes / 1e6,
					(unsigned long long)o.tokens, (double)done_bytes / 1e6 / s);
				last = now;
			}
			if (bytes == 0)
				break;
		}
		if (mapped)
			munmap((void *)text, bytes);
		else if (bytes)
			free((void *)text);
	}
	out_flush(&o);
	if (o.tokens == 0)
		st_cli_die(2, "tokenize: no tokens: the input is empty (an llm.c shard holds at "
			   "least one)");
	{
		const int32_t head[3] = { o.width == 4 ? ST_LLMC32_MAGIC : ST_LLMC_MAGIC,
					  o.width == 4 ? ST_LLMC32_VERSION : ST_LLMC_VERSION,
					  (int32_t)o.tokens };

		for (int i = 0; i < 3; i++)
			for (int b = 0; b < 4; b++)
				hdr[4 * i + b] = (uint8_t)((uint32_t)head[i] >> (8 * b));
		if (pwrite(o.f.fd, hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr))
			st_cli_die(1, "--out %s: writing the header: %s", o.path, strerror(errno));
	}
	{
		sigset_t set;

		sigemptyset(&set);
		sigaddset(&set, SIGINT);
		sigaddset(&set, SIGTERM);
		sigaddset(&set, SIGHUP);
		sigprocmask(SIG_BLOCK, &set, NULL);
		ret = st_file_atomic_commit(&o.f);
		tmp_path[0] = 0;
		sigprocmask(SIG_UNBLOCK, &set, NULL);
	}
	st_cli_at_die(NULL);
	if (ret < 0)
		st_cli_die(1, "--out %s: %s", o.path, st_error_last());
	{
		double s = (double)(st_now_ns() - t0) / 1e9;

		printf("tokenize: %llu tokens (uint%u) from %llu documents, %.1f MB of text "
		       "in %.1f s, to %s\n", (unsigned long long)o.tokens, o.width * 8,
		       (unsigned long long)docs, (double)done_bytes / 1e6, s, o.path);
	}
	st_tok_ids_fini(&ids);
	st_tokenizer_close(t);
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

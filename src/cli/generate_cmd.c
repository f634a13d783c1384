/* `strata generate`: a prompt continued from a checkpoint, text in and out
 * through its tokenizer (or bytes, for a byte-level model); the model runs
 * in the reference trainer (strata/train.h), with a KV cache
 * (st_model_decode_*) where it can: fp32, the whole text within the
 * model's context. */
#include "cli.h"
#include "strata/io.h"
#include "strata/model.h"
#include "strata/optim.h"
#include "strata/tokenizer.h"
#include "strata/train.h"
#include "strata/weights.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The first of n values that is not finite, or -1. */
static long first_nonfinite(const float *x, uint64_t n)
{
	uint64_t k = st_f32_find_bad(x, n, false);

	return k == n ? -1 : (long)k;
}

/* Print what decoding toks[0..n) gives past the prompt's text (base
 * bytes) and past what is printed already, up to the last complete UTF-8
 * character (all of it at the end). Decoding the whole sequence, not the
 * new token alone, keeps what the decoders do across tokens (a byte
 * fallback split over tokens, the space a Metaspace token starts with). */
static int tok_put_new(struct st_tokenizer *tk, const int32_t *toks, int n, size_t base,
		       size_t *printed, bool end)
{
	uint32_t *ids = malloc(sizeof(*ids) * (size_t)n);
	char *txt;
	size_t bytes, upto;
	int ret;

	if (!ids)
		return st_error_set(-ENOMEM, "out of memory");
	for (int i = 0; i < n; i++)
		ids[i] = (uint32_t)toks[i];
	ret = st_tokenizer_decode(tk, ids, (size_t)n, ST_TOK_SKIP_SPECIAL | ST_TOK_NO_CLEANUP,
				  &txt, &bytes);
	free(ids);
	if (ret < 0)
		return ret;
	upto = end ? bytes : st_utf8_complete(txt, bytes);
	if (upto > base + *printed) {
		fwrite(txt + base + *printed, 1, upto - base - *printed, stdout);
		fflush(stdout);
		*printed = upto - base;
	}
	free(txt);
	return 0;
}

static uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Sample from logits with temperature and top-k (0 = all); greedy at 0. */
static int sample(float *logits, int V, double temp, int top_k, uint64_t *rng)
{
	double u, sum = 0, acc = 0, mx = -INFINITY, kth = -INFINITY;
	int best = 0;

	for (int i = 0; i < V; i++)
		if (logits[i] > logits[best])
			best = i;
	if (temp <= 0)
		return best;
	if (top_k > 0 && top_k < V) {
		/* the k-th largest value, by repeated max below a bound */
		double bound = INFINITY;

		for (int k = 0; k < top_k; k++) {
			double m = -INFINITY;

			for (int i = 0; i < V; i++)
				if (logits[i] < bound && logits[i] > m)
					m = logits[i];
			bound = m;
		}
		kth = bound;
	}
	for (int i = 0; i < V; i++)
		if (logits[i] >= kth && logits[i] > mx)
			mx = logits[i];
	for (int i = 0; i < V; i++)
		sum += logits[i] >= kth ? exp((logits[i] - mx) / temp) : 0;
	u = (double)(splitmix(rng) >> 11) / 9007199254740992.0 * sum;
	for (int i = 0; i < V; i++) {
		if (logits[i] < kth)
			continue;
		acc += exp((logits[i] - mx) / temp);
		if (acc > u)
			return i;
	}
	return best;
}

static void gen_usage(FILE *f)
{
	fprintf(f,
"usage: strata generate --ckpt PATH [--prompt TEXT] [--tokenizer DIR|FILE] [--tokens N]\n"
"                       [--temperature X] [--top-k K] [--seed N] [--threads N]\n"
"                       [--compute-dtype fp32|bf16]\n"
"\n"
"Continue TEXT and print the result. Text goes in and out through the\n"
"checkpoint's Hugging Face tokenizer: --tokenizer (a directory with\n"
"tokenizer.json, or the file), else a tokenizer.json in the checkpoint's\n"
"directory or the one above it. Without one the model must be byte-level\n"
"(vocab 256): each byte is a token. Generation stops at the tokenizer's EOS.\n"
"--ckpt: a strata checkpoint (a --save DIR or one step-N in it), a Hugging Face\n"
"directory (GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM) or\n"
"model.safetensors (config.json beside it), or an llm.c model file.\n"
"  --tokens N        tokens to generate (default 200)\n"
"  --temperature X   0 is greedy (default 0.8)\n"
"  --top-k K         sample among the K likeliest, 0 for all (default 40)\n"
"  --compute-dtype fp32|bf16  the tensors between the model's ops (default fp32;\n"
"                    docs/model.md, \"bf16 compute\")\n"
"The prompt runs once and each new token reuses its keys and values (a KV\n"
"cache) at fp32 while the text fits the model's context; bf16, or a longer\n"
"text, recomputes the whole window for each token.\n");
}

/* Every unit's weights as the trainer's forward reads them, and a decoder
 * for max positions into *dec; NULL (and *dec NULL) where the model does
 * not decode with a cache (the recompute path then). */
static void **gen_decoder(struct st_trainer *t, int max, struct st_decode **dec)
{
	const struct st_model *m = st_trainer_model(t);
	int U = st_model_unit_count(m);
	void **p;
	int ret;

	*dec = NULL;
	if ((ret = st_model_decode_begin(m, max, dec)) < 0) {
		if (ret != -ENOTSUP)
			st_cli_die(1, "generate: %s", st_error_last());
		return NULL;
	}
	p = calloc((size_t)U, sizeof(*p));
	if (!p)
		st_cli_die(1, "generate: out of memory");
	for (int u = 0; u < U; u++) {
		p[u] = malloc(st_model_unit_layout(m, u)->elems * sizeof(float));
		if (!p[u])
			st_cli_die(1, "generate: out of memory for the weights");
		(void)st_trainer_unit_weights(t, u, p[u]);
	}
	return p;
}

static void gen_decoder_free(struct st_trainer *t, void **params, struct st_decode *dec)
{
	if (params)
		for (int u = 0; u < st_model_unit_count(st_trainer_model(t)); u++)
			free(params[u]);
	free(params);
	st_model_decode_end(dec);
}

/* The weights opened, until they are read: nothing left for
 * LeakSanitizer when a refusal exits first. */
static struct st_weights *open_w;

static void close_w(int code)
{
	(void)code;
	st_weights_close(open_w);
	open_w = NULL;
}

int st_cli_generate(int argc, char **argv)
{
	static const struct option longs[] = {
		{ "ckpt", 1, 0, 'c' }, { "prompt", 1, 0, 'p' }, { "tokens", 1, 0, 'n' },
		{ "temperature", 1, 0, 't' }, { "top-k", 1, 0, 'k' }, { "seed", 1, 0, 's' },
		{ "threads", 1, 0, 'j' }, { "tokenizer", 1, 0, 'z' }, { "help", 0, 0, 'h' },
		{ "compute-dtype", 1, 0, 'D' },
		/* hidden: the recompute path, for the tests and benchmarks */
		{ "no-kv-cache", 0, 0, 'R' }, { 0 },
	};
	const char *ckpt = NULL, *prompt = "\n", *tok_path = NULL;
	enum st_precision compute = ST_PRECISION_FP32;
	struct st_tokenizer *tk;
	struct st_tok_ids pids = { 0 };
	size_t printed = 0, base = 0;
	int n = 200, top_k = 40, threads = 0, c, len;
	bool kv = true;
	struct st_decode *dec = NULL;
	void **params = NULL;
	double temp = 0.8;
	uint64_t rng = 1337;
	struct st_train_config cfg;
	struct st_trainer *t;
	struct st_weights *w;
	int32_t *toks;
	float *logits;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		switch (c) {
		case 'c': ckpt = optarg; break;
		case 'p': prompt = optarg; break;
		case 'n': n = (int)st_cli_long("--tokens", optarg, 0, 1 << 20); break;
		case 't': temp = st_cli_double("--temperature", optarg, 0, 100); break;
		case 'k': top_k = (int)st_cli_long("--top-k", optarg, 0, 1 << 30); break;
		case 's': rng = (uint64_t)st_cli_long("--seed", optarg, 0, 0x7fffffffffffffffL); break;
		case 'j': threads = (int)st_cli_long("--threads", optarg, 1, 4096); break;
		case 'z': tok_path = optarg; break;
		case 'D':
			if (st_precision_parse(optarg, &compute) < 0)
				st_cli_die(2, "--compute-dtype %s: expected fp32 or bf16", optarg);
			break;
		case 'R': kv = false; break;
		case 'h': gen_usage(stdout); return 0;
		default: st_cli_bad_option("generate", longs, argv[optind - 1]);
		}
	}
	if (optind < argc)
		st_cli_die(2, "generate: unexpected argument %s", argv[optind]);
	if (!ckpt)
		st_cli_die(2, "generate: --ckpt PATH is required");
	if (!*prompt)
		st_cli_die(2, "generate: --prompt must not be empty");
	st_train_config_default(&cfg);
	w = st_cli_open_ckpt(ckpt, &cfg.model);
	open_w = w; /* closed if the prompt is refused before it is read */
	st_cli_at_die(close_w);
	tk = st_cli_tokenizer(tok_path, ckpt);
	if (!tk && cfg.model.vocab != 256)
		st_cli_die(2, "generate: --ckpt %s has a vocabulary of %d and no tokenizer.json "
			   "beside it: name one with --tokenizer (a byte-level model has 256)",
			   ckpt, cfg.model.vocab);
	if (tk && st_tokenizer_vocab(tk) > (uint32_t)cfg.model.vocab)
		st_cli_die(2, "generate: the tokenizer has %u ids, more than the model's "
			   "vocabulary of %d", st_tokenizer_vocab(tk), cfg.model.vocab);
	set_threads_cli(threads);
	if (tk) {
		const uint32_t *pre;
		size_t n_pre = st_tokenizer_prefix(tk, &pre);
		char *txt;

		/* the prompt starts a document: BOS, no EOS */
		if (n_pre) {
			pids.ids = malloc(sizeof(uint32_t) * n_pre);
			if (!pids.ids)
				st_cli_die(1, "generate: out of memory");
			memcpy(pids.ids, pre, sizeof(uint32_t) * n_pre);
			pids.n = pids.cap = n_pre;
		}
		if (st_tokenizer_encode(tk, prompt, strlen(prompt), 0, &pids) < 0)
			st_cli_die(2, "generate: --prompt: %s", st_error_last());
		len = (int)pids.n;
		if (st_tokenizer_decode(tk, pids.ids, pids.n, ST_TOK_SKIP_SPECIAL | ST_TOK_NO_CLEANUP,
					&txt, &base) < 0)
			st_cli_die(1, "generate: %s", st_error_last());
		free(txt);
	} else
		len = (int)strlen(prompt);
	if (len == 0)
		st_cli_die(2, "generate: --prompt gives no tokens");
	/* the window the prompt and --tokens need, not the model's whole
	 * context (past it, the last ctx tokens, as before) */
	cfg.batch = 1;
	cfg.seq = (int)ST_MIN((int64_t)cfg.model.ctx, (int64_t)len + n);
	if (st_trainer_create(&cfg, &t) < 0)
		st_cli_die(1, "%s", st_error_last());
	if (st_trainer_set_precision(t, compute) < 0)
		st_cli_die(2, "%s", st_error_last());
	st_cli_at_die(NULL);
	open_w = NULL;
	st_cli_load_ckpt(t, w, ckpt);
	toks = malloc(sizeof(*toks) * (size_t)(len + n));
	logits = malloc(sizeof(*logits) * (size_t)cfg.model.vocab);
	if (!toks || !logits)
		st_cli_die(1, "generate: out of memory");
	for (int i = 0; i < len; i++)
		toks[i] = tk ? (int32_t)pids.ids[i] : (unsigned char)prompt[i];
	if (kv && compute == ST_PRECISION_FP32 && (int64_t)len + n <= cfg.model.ctx)
		params = gen_decoder(t, len + n, &dec);
	fputs(prompt, stdout);
	for (int i = 0; i < n; i++) {
		long bad;
		char v[32];

		if ((dec ? st_model_decode_step(dec, (const void *const *)params,
						i ? toks + len + i - 1 : toks, i ? 1 : len, logits)
			 : st_trainer_logits(t, toks, len + i, logits)) < 0)
			st_cli_die(1, "%s", st_error_last());
		/* finite weights can still overflow: sampling from NaN would
		 * print garbage and exit 0 */
		if ((bad = first_nonfinite(logits, (uint64_t)cfg.model.vocab)) >= 0) {
			putchar('\n');
			st_cli_die(1, "generate: --ckpt %s: logit %ld of token %d is %s: the model's "
				   "values are not finite (it overflows), nothing more generated",
				   ckpt, bad, i + 1, st_f32_name(logits[bad], v, sizeof(v)));
		}
		toks[len + i] = sample(logits, cfg.model.vocab, temp, top_k, &rng);
		if (!tk) {
			putchar(toks[len + i]);
			fflush(stdout);
			continue;
		}
		if (toks[len + i] == st_tokenizer_eos_id(tk))
			break;
		if (tok_put_new(tk, toks, len + i + 1, base, &printed, false) < 0)
			st_cli_die(1, "generate: %s", st_error_last());
	}
	if (tk)
		(void)tok_put_new(tk, toks, len + n, base, &printed, true);
	putchar('\n');
	free(toks);
	free(logits);
	gen_decoder_free(t, params, dec);
	st_tok_ids_fini(&pids);
	st_tokenizer_close(tk);
	st_trainer_destroy(t);
	return 0;
}

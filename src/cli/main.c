/* strata: the command line. `strata train | plan | info | generate | eval | export`.
 * Flags become one config struct; everything else is in the seams below.
 * Bad input: one line on stderr and exit 2, before anything is written. */
#include "cli.h"
#include "strata/io.h"
#include "strata/optim.h"
#include "strata/tokenizer.h"
#include "strata/train.h"
#include "strata/weights.h"

#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


/* The weights of --ckpt PATH (strata/weights.h: a checkpoint, verified; a
 * Hugging Face model; an llm.c model file) and their model, or exit 2. */
static struct st_weights *open_ckpt(const char *path, struct st_model_config *mc)
{
	struct st_weights *w;
	int ret = st_weights_open(path, &w);

	if (ret == 0)
		ret = st_weights_config(w, mc);
	if (ret < 0)
		st_cli_die(st_cli_input_exit(ret), "--ckpt %s: %s", path,
			   st_cli_unprefix(st_error_last(), path));
	return w;
}

/* Every value is checked as it is read: a NaN or Inf is refused (exit 2)
 * naming the tensor and its index. */
static void load_ckpt(struct st_trainer *t, struct st_weights *w, const char *path)
{
	int ret = st_trainer_load_weights(t, w);

	if (ret < 0) {
		char why[1024];

		/* closed before the exit: nothing of it is left for LeakSanitizer
		 * to find unreachable, wherever the compiler kept w */
		snprintf(why, sizeof(why), "%s", st_cli_unprefix(st_error_last(), path));
		st_weights_close(w);
		st_cli_die(st_cli_input_exit(ret), "--ckpt %s: %s", path, why);
	}
	st_weights_close(w);
}

/* The first of n values that is not finite, or -1. */
static long first_nonfinite(const float *x, uint64_t n)
{
	uint64_t k = st_f32_find_bad(x, n, false);

	return k == n ? -1 : (long)k;
}

/* --- generate --------------------------------------------------------------- */

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
"                    docs/model.md, \"bf16 compute\")\n");
}

static int cmd_generate(int argc, char **argv)
{
	static const struct option longs[] = {
		{ "ckpt", 1, 0, 'c' }, { "prompt", 1, 0, 'p' }, { "tokens", 1, 0, 'n' },
		{ "temperature", 1, 0, 't' }, { "top-k", 1, 0, 'k' }, { "seed", 1, 0, 's' },
		{ "threads", 1, 0, 'j' }, { "tokenizer", 1, 0, 'z' }, { "help", 0, 0, 'h' },
		{ "compute-dtype", 1, 0, 'D' }, { 0 },
	};
	const char *ckpt = NULL, *prompt = "\n", *tok_path = NULL;
	enum st_precision compute = ST_PRECISION_FP32;
	struct st_tokenizer *tk;
	struct st_tok_ids pids = { 0 };
	size_t printed = 0, base = 0;
	int n = 200, top_k = 40, threads = 0, c, len;
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
		case 'h': gen_usage(stdout); return 0;
		default: st_cli_die(2, "generate: unknown or incomplete option %s (see strata generate --help)",
			     argv[optind - 1]);
		}
	}
	if (optind < argc)
		st_cli_die(2, "generate: unexpected argument %s", argv[optind]);
	if (!ckpt)
		st_cli_die(2, "generate: --ckpt PATH is required");
	if (!*prompt)
		st_cli_die(2, "generate: --prompt must not be empty");
	st_train_config_default(&cfg);
	w = open_ckpt(ckpt, &cfg.model);
	tk = st_cli_tokenizer(tok_path, ckpt);
	if (!tk && cfg.model.vocab != 256)
		st_cli_die(2, "generate: --ckpt %s has a vocabulary of %d and no tokenizer.json "
			   "beside it: name one with --tokenizer (a byte-level model has 256)",
			   ckpt, cfg.model.vocab);
	if (tk && st_tokenizer_vocab(tk) > (uint32_t)cfg.model.vocab)
		st_cli_die(2, "generate: the tokenizer has %u ids, more than the model's "
			   "vocabulary of %d", st_tokenizer_vocab(tk), cfg.model.vocab);
	set_threads_cli(threads);
	cfg.batch = 1;
	cfg.seq = cfg.model.ctx;
	if (st_trainer_create(&cfg, &t) < 0)
		st_cli_die(1, "%s", st_error_last());
	if (st_trainer_set_precision(t, compute) < 0)
		st_cli_die(2, "%s", st_error_last());
	load_ckpt(t, w, ckpt);
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
	toks = malloc(sizeof(*toks) * (size_t)(len + n));
	logits = malloc(sizeof(*logits) * (size_t)cfg.model.vocab);
	if (!toks || !logits)
		st_cli_die(1, "generate: out of memory");
	for (int i = 0; i < len; i++)
		toks[i] = tk ? (int32_t)pids.ids[i] : (unsigned char)prompt[i];
	fputs(prompt, stdout);
	for (int i = 0; i < n; i++) {
		long bad;
		char v[32];

		if (st_trainer_logits(t, toks, len + i, logits) < 0)
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
	st_tok_ids_fini(&pids);
	st_tokenizer_close(tk);
	st_trainer_destroy(t);
	return 0;
}

/* --- eval ------------------------------------------------------------------- */

static int cmd_eval(int argc, char **argv)
{
	static const struct option longs[] = {
		{ "ckpt", 1, 0, 'c' }, { "data", 1, 0, 'd' }, { "batch", 1, 0, 'B' },
		{ "seq", 1, 0, 'T' }, { "batches", 1, 0, 'n' }, { "threads", 1, 0, 'j' },
		{ "precision", 1, 0, 'p' }, { "tokenizer", 1, 0, 'z' }, { "help", 0, 0, 'h' },
		{ "compute-dtype", 1, 0, 'D' },
		{ 0 },
	};
	const char *ckpt = NULL, *data = NULL, *tok_path = NULL;
	struct st_tokenizer *tk;
	char shard[4096];
	int B = 4, T = 0, nb = 0, threads = 0, c;
	bool bf16 = true;
	enum st_precision compute = ST_PRECISION_FP32;
	struct st_train_config cfg;
	struct st_trainer *t;
	struct st_weights *w;
	struct st_dataset *ds;
	struct st_loader ld;
	struct st_loader_config lc;
	double loss;
	uint64_t avail;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		switch (c) {
		case 'c': ckpt = optarg; break;
		case 'd': data = optarg; break;
		case 'B': B = (int)st_cli_long("--batch", optarg, 1, 1 << 16); break;
		case 'T': T = (int)st_cli_long("--seq", optarg, 1, 1 << 20); break;
		case 'n': nb = (int)st_cli_long("--batches", optarg, 1, 1 << 30); break;
		case 'j': threads = (int)st_cli_long("--threads", optarg, 1, 4096); break;
		case 'z': tok_path = optarg; break;
		case 'p':
			if (strcmp(optarg, "bf16") != 0 && strcmp(optarg, "fp32") != 0)
				st_cli_die(2, "--precision %s: expected bf16 or fp32", optarg);
			bf16 = strcmp(optarg, "bf16") == 0;
			break;
		case 'D':
			if (st_precision_parse(optarg, &compute) < 0)
				st_cli_die(2, "--compute-dtype %s: expected fp32 or bf16", optarg);
			break;
		case 'h':
			printf("usage: strata eval --ckpt PATH --data FILE [--tokenizer DIR|FILE] [--batch B]\n"
			       "                   [--seq T] [--batches N] [--precision bf16|fp32] [--threads N]\n"
			       "                   [--compute-dtype fp32|bf16]\n"
			       "\nMean cross-entropy of the model over FILE, read in order\n"
			       "(llm.c's contiguous windows). Defaults: B=4, T=min(ctx,256), as many\n"
			       "batches as the file holds, at most 100. --precision: the weights the\n"
			       "forward reads, the master weights rounded to bf16 as in training\n"
			       "(default) or as they are (fp32, as llm.c's train_gpt2.c reads an\n"
			       "export --format llmc). --compute-dtype: the tensors between the\n"
			       "model's ops (default fp32; bf16: docs/model.md). --ckpt: a strata checkpoint (a --save DIR\n"
			       "or one step-N in it), a Hugging Face directory (GPT2LMHeadModel,\n"
			       "LlamaForCausalLM, Qwen2ForCausalLM) or model.safetensors\n"
			       "(config.json beside it), an llm.c model file.\n"
			       "--data: an llm.c token shard, or text: bytes for a byte-level model,\n"
			       "else tokenized (one document) with --tokenizer or the tokenizer.json\n"
			       "beside the checkpoint (as strata generate finds it).\n");
			return 0;
		default: st_cli_die(2, "eval: unknown or incomplete option %s (see strata eval --help)",
			     argv[optind - 1]);
		}
	}
	if (optind < argc)
		st_cli_die(2, "eval: unexpected argument %s", argv[optind]);
	if (!ckpt || !data)
		st_cli_die(2, "eval: --ckpt PATH and --data FILE are required");
	st_train_config_default(&cfg);
	w = open_ckpt(ckpt, &cfg.model);
	if (T == 0)
		T = ST_MIN(cfg.model.ctx, 256);
	if (T > cfg.model.ctx)
		st_cli_die(2, "--seq %d is longer than the model's context of %d", T, cfg.model.ctx);
	set_threads_cli(threads);
	/* text for a tokenizer: an explicit --tokenizer, or a model that is
	 * not byte-level with a tokenizer beside it; a token shard as it is */
	tk = NULL;
	if (tok_path || cfg.model.vocab != 256) {
		struct st_dataset *probe;
		size_t dl = strlen(data);
		/* a .bin is a shard, broken or not (st_cli_open_data says why) */
		bool is_shard = dl > 4 && strcmp(data + dl - 4, ".bin") == 0;

		if (!is_shard && st_dataset_open(&probe, data, ST_DATASET_AUTO) == 0) {
			is_shard = st_dataset_format(probe) == ST_DATASET_LLMC;
			st_dataset_close(probe);
		}
		if (!is_shard) {
			tk = st_cli_tokenizer(tok_path, ckpt);
			/* as strata train reads it: a model trained on a text's
			 * bytes is evaluated on them, but say so */
			if (!tk)
				st_warn("--data %s is text and --ckpt %s (vocabulary %d) has no "
					"tokenizer.json beside it: its bytes are the ids (name a "
					"tokenizer with --tokenizer)", data, ckpt, cfg.model.vocab);
			else if (st_tokenizer_vocab(tk) > (uint32_t)cfg.model.vocab)
				st_cli_die(2, "eval: the tokenizer has %u ids, more than the model's "
					   "vocabulary of %d", st_tokenizer_vocab(tk),
					   cfg.model.vocab);
		}
	}
	if (tk) {
		st_cli_text_shard(tk, data, shard, sizeof(shard));
		ds = st_cli_open_data(shard, cfg.model.vocab);
		unlink(shard);
		st_cli_at_die(NULL);
		st_tokenizer_close(tk);
	} else
		ds = st_cli_open_data(data, cfg.model.vocab);
	avail = st_dataset_tokens(ds) > 1 ? (st_dataset_tokens(ds) - 1) / ((uint64_t)B * T) : 0;
	if (avail == 0)
		st_cli_die(2, "--data %s: fewer than B*T+1 = %d tokens", data, B * T + 1);
	if (nb == 0)
		nb = (int)ST_MIN(avail, 100);
	if ((uint64_t)nb > avail) /* the loader would wrap around and count batches twice */
		st_cli_die(2, "eval: --batches %d: --data %s holds %llu batches of %d x %d tokens",
			   nb, data, (unsigned long long)avail, B, T);
	cfg.batch = B;
	cfg.seq = T;
	cfg.bf16 = bf16;
	lc = (struct st_loader_config){ .batch = (uint32_t)B, .seq = (uint32_t)T, .shuffle = 0,
					.split = ST_SPLIT_ALL };
	if (st_loader_init(&ld, ds, &lc) < 0)
		st_cli_die(2, "--data %s: %s", data, st_error_last());
	if (st_trainer_create(&cfg, &t) < 0)
		st_cli_die(1, "%s", st_error_last());
	if (st_trainer_set_precision(t, compute) < 0)
		st_cli_die(2, "%s", st_error_last());
	load_ckpt(t, w, ckpt);
	{
		/* batch by batch, for the progress: the same sum, in the same
		 * order, as st_trainer_eval over all nb */
		struct st_cli_progress pr = { 0 };
		double sum = 0, l;

		st_cli_progress(&pr, "eval", 0, nb, "batches"); /* the clock starts */
		for (int i = 0; i < nb; i++) {
			if (st_trainer_eval(t, &ld, 1, &l) < 0)
				st_cli_die(1, "%s", st_error_last());
			sum += l;
			st_cli_progress(&pr, "eval", i + 1, nb, "batches");
		}
		loss = sum / nb;
	}
	if (!isfinite(loss)) /* finite weights whose forward overflows */
		st_cli_die(1, "eval: --ckpt %s: the loss over %d batches is %s: the model's values "
			   "are not finite (it overflows)", ckpt, nb, isnan(loss) ? "nan" : "inf");
	printf("loss %.6f over %d batches of %d x %d tokens\n", loss, nb, B, T);
	st_trainer_destroy(t);
	st_dataset_close(ds);
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f,
"usage: strata COMMAND [options]\n"
"\n"
"  train      train a GPT-2 or LLaMA family model (the default with no command)\n"
"  plan       print where every shard would live, and the predicted step\n"
"  generate   continue a prompt from a checkpoint (text through its tokenizer)\n"
"  eval       mean loss of a checkpoint on a data file\n"
"  info       what strata finds on this machine, in --nvme dirs, or in a checkpoint\n"
"  export     a checkpoint's weights for transformers (hf) or llm.c (llmc)\n"
"  tokenize   text to an llm.c token shard with a Hugging Face tokenizer\n"
"\n"
"strata COMMAND --help for each command's options.\n");
}

static int dispatch(int argc, char **argv, const char *cmd)
{
	if (argc > 1 && cmd[0] == '-') /* flags without a command: train */
		return st_cli_train(argc, argv);
	if (strcmp(cmd, "train") == 0)
		return st_cli_train(argc - 1, argv + 1);
	if (strcmp(cmd, "plan") == 0)
		return st_cli_plan(argc - 1, argv + 1);
	if (strcmp(cmd, "export") == 0)
		return st_cli_export(argc - 1, argv + 1);
	if (strcmp(cmd, "info") == 0)
		return st_cli_info(argc - 1, argv + 1);
	if (strcmp(cmd, "generate") == 0)
		return cmd_generate(argc - 1, argv + 1);
	if (strcmp(cmd, "eval") == 0)
		return cmd_eval(argc - 1, argv + 1);
	if (strcmp(cmd, "tokenize") == 0)
		return st_cli_tokenize(argc - 1, argv + 1);
	st_cli_die(2, "unknown command %s (see strata --help)", cmd);
}

int main(int argc, char **argv)
{
	const char *cmd = argc > 1 ? argv[1] : "train", *name = cmd;
	int rc;

	if (argc > 1 && (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0)) {
		usage(stdout);
		rc = 0;
	} else if (strcmp(cmd, "--version") == 0) {
		printf("strata %d.%d\n", ST_VERSION_MAJOR, ST_VERSION_MINOR);
		rc = 0;
	} else {
		if (cmd[0] == '-') /* flags without a command are train's */
			name = "train";
		rc = dispatch(argc, argv, cmd);
	}
	/* what every command printed: a full disk or a closed pipe under
	 * stdout is a failure, not a success with nothing in the file */
	errno = 0;
	if (fflush(stdout) != 0 || ferror(stdout))
		/* stdio keeps no errno of an earlier failed write, only its flag */
		st_cli_die(1, "%s: cannot write the output: %s", name,
			   errno ? strerror(errno) : "an earlier write to it failed");
	return rc;
}

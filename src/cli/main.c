/* strata: the command line. `strata train | generate | eval`.
 * Flags become one config struct; everything else is in the seams below.
 * Bad input: one line on stderr and exit 2, before anything is written. */
#include "strata/io.h"
#include "strata/optim.h"
#include "strata/train.h"

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

#define DEFAULT_DATA "/usr/share/common-licenses/GPL-3"

static void die(int code, const char *fmt, ...) ST_PRINTF(2, 3);
static void die(int code, const char *fmt, ...)
{
	va_list ap;

	fputs("strata: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(code);
}

static long parse_long(const char *flag, const char *s, long lo, long hi)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		die(2, "%s %s: expected a whole number from %ld to %ld", flag, s, lo, hi);
	return v;
}

static double parse_double(const char *flag, const char *s, double lo, double hi)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
		die(2, "%s %s: expected a number from %g to %g", flag, s, lo, hi);
	return v;
}

static void set_threads(int n)
{
	if (n > 0) {
		omp_set_num_threads(n);
		openblas_set_num_threads(n);
	}
}

static struct st_dataset *open_data(const char *path, int vocab)
{
	struct st_dataset *ds;
	struct stat st;

	if (stat(path, &st) < 0)
		die(2, "--data %s: %s", path, strerror(errno));
	if (!S_ISREG(st.st_mode))
		die(2, "--data %s: not a regular file", path);
	if (st_dataset_open(&ds, path, ST_DATASET_AUTO) < 0)
		die(2, "--data %s: %s", path, st_error_last());
	if (st_dataset_max_token(ds) >= (uint32_t)vocab)
		die(2, "--data %s: token %u is outside the model's vocabulary of %d", path,
		    st_dataset_max_token(ds), vocab);
	return ds;
}

/* Model config from DIR/config.json. */
static void read_ckpt_config(const char *dir, struct st_model_config *mc)
{
	struct st_gpt2_config gc;
	char path[4096];

	snprintf(path, sizeof(path), "%.4000s/config.json", dir);
	if (st_gpt2_config_read(path, &gc) < 0)
		die(2, "--ckpt %s: %s", dir, st_error_last());
	*mc = (struct st_model_config){ .n_layer = (int)gc.n_layer, .n_embd = (int)gc.n_embd,
					.n_head = (int)gc.n_head, .vocab = (int)gc.vocab_size,
					.ctx = (int)gc.n_positions };
}

static void load_ckpt(struct st_trainer *t, const char *dir)
{
	char path[4096];

	snprintf(path, sizeof(path), "%.4000s/model.safetensors", dir);
	if (st_trainer_load_weights(t, path) < 0)
		die(2, "%s", st_error_last());
}

static const char *fmt_eta(double s, char *buf, size_t n)
{
	if (!isfinite(s) || s < 0)
		snprintf(buf, n, "?");
	else if (s < 60)
		snprintf(buf, n, "%.0fs", s);
	else if (s < 3600)
		snprintf(buf, n, "%dm%02ds", (int)s / 60, (int)s % 60);
	else
		snprintf(buf, n, "%dh%02dm", (int)s / 3600, (int)s % 3600 / 60);
	return buf;
}

/* --- train ----------------------------------------------------------------- */

static void train_usage(FILE *f)
{
	fprintf(f,
"usage: strata train [options]\n"
"\n"
"Train a GPT-2 family model. With no options: the tiny byte-level model on\n"
"%s for 100 steps.\n"
"\n"
"model and data\n"
"  --model NAME|DIMS    %s, or layers=L,dim=C,heads=H,vocab=V,ctx=T (default tiny)\n"
"  --init DIR           start from the weights of a checkpoint (config.json + model.safetensors)\n"
"  --data FILE          raw text/bytes (vocab 256) or an llm.c .bin token shard\n"
"  --batch B            sequences per micro-batch (default 8)\n"
"  --seq T              tokens per sequence (default 128)\n"
"  --grad-accum N       micro-batches per step (default 1)\n"
"  --shuffle on|off     random windows, or llm.c's contiguous order (default on)\n"
"optimizer\n"
"  --steps N            optimizer steps (default 100; 0 writes the initial checkpoint)\n"
"  --lr X               peak learning rate (default 1e-3)\n"
"  --lr-schedule cosine|constant   (default cosine, down to lr/10)\n"
"  --warmup N           linear warm-up steps (default 10)\n"
"  --wd X               decoupled weight decay on matrices and embeddings (default 0.1)\n"
"  --beta1 X --beta2 X --eps X      AdamW (default 0.9, 0.95, 1e-8)\n"
"  --clip X             global gradient-norm clip, 0 disables (default 1.0)\n"
"run\n"
"  --seed N             initialisation and sampling seed (default 1337)\n"
"  --precision bf16|fp32  working weights W (default bf16; master weights are fp32)\n"
"  --threads N          OpenMP threads (default: OMP_NUM_THREADS or all cores)\n"
"  --save DIR           write a checkpoint there at the end (Hugging Face GPT-2 layout)\n"
"  --metrics FILE       one JSON object per step: step, loss, lr, grad_norm, tokens_per_s\n"
"  --log-every N        print every Nth step (default 1)\n"
"  -h, --help\n", DEFAULT_DATA, st_model_preset_list());
}

static int cmd_train(int argc, char **argv)
{
	static const struct option longs[] = {
		{ "model", 1, 0, 'm' }, { "data", 1, 0, 'd' }, { "batch", 1, 0, 'B' },
		{ "seq", 1, 0, 'T' }, { "steps", 1, 0, 's' }, { "grad-accum", 1, 0, 'a' },
		{ "lr", 1, 0, 'l' }, { "lr-schedule", 1, 0, 'S' }, { "warmup", 1, 0, 'w' },
		{ "wd", 1, 0, 'W' }, { "beta1", 1, 0, '1' }, { "beta2", 1, 0, '2' },
		{ "eps", 1, 0, 'e' }, { "clip", 1, 0, 'c' }, { "seed", 1, 0, 'r' },
		{ "precision", 1, 0, 'p' }, { "shuffle", 1, 0, 'u' }, { "threads", 1, 0, 'j' },
		{ "save", 1, 0, 'o' }, { "metrics", 1, 0, 'M' }, { "init", 1, 0, 'i' },
		{ "log-every", 1, 0, 'L' }, { "help", 0, 0, 'h' }, { 0 },
	};
	struct st_train_config cfg;
	const char *data = DEFAULT_DATA, *save = NULL, *metrics = NULL, *init = NULL;
	int shuffle = 1, threads = 0, log_every = 1, c;
	bool model_given = false;
	struct st_trainer *t;
	struct st_dataset *ds;
	struct st_loader ld;
	struct st_loader_config lc;
	FILE *mf = NULL;
	uint64_t t0;
	char mtmp[4096];

	st_train_config_default(&cfg);
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		switch (c) {
		case 'm':
			if (st_model_config_parse(optarg, &cfg.model) < 0)
				die(2, "--model %s: %s", optarg, st_error_last());
			model_given = true;
			break;
		case 'd': data = optarg; break;
		case 'B': cfg.batch = (int)parse_long("--batch", optarg, 1, 1 << 16); break;
		case 'T': cfg.seq = (int)parse_long("--seq", optarg, 1, 1 << 20); break;
		case 's': cfg.steps = (int)parse_long("--steps", optarg, 0, 1 << 30); break;
		case 'a': cfg.grad_accum = (int)parse_long("--grad-accum", optarg, 1, 1 << 16); break;
		case 'l': cfg.lr = parse_double("--lr", optarg, 0, 10); break;
		case 'S':
			if (strcmp(optarg, "cosine") == 0)
				cfg.schedule = ST_LR_COSINE;
			else if (strcmp(optarg, "constant") == 0)
				cfg.schedule = ST_LR_CONSTANT;
			else
				die(2, "--lr-schedule %s: expected cosine or constant", optarg);
			break;
		case 'w': cfg.warmup = (int)parse_long("--warmup", optarg, 0, 1 << 30); break;
		case 'W': cfg.wd = parse_double("--wd", optarg, 0, 10); break;
		case '1': cfg.beta1 = parse_double("--beta1", optarg, 0, 0.999999); break;
		case '2': cfg.beta2 = parse_double("--beta2", optarg, 0, 0.999999); break;
		case 'e': cfg.eps = parse_double("--eps", optarg, 0, 1); break;
		case 'c': cfg.clip = parse_double("--clip", optarg, 0, 1e9); break;
		case 'r': cfg.seed = (uint64_t)parse_long("--seed", optarg, 0, 0x7fffffffffffffffL); break;
		case 'p':
			if (strcmp(optarg, "bf16") == 0)
				cfg.bf16 = true;
			else if (strcmp(optarg, "fp32") == 0)
				cfg.bf16 = false;
			else
				die(2, "--precision %s: expected bf16 or fp32", optarg);
			break;
		case 'u':
			if (strcmp(optarg, "on") == 0)
				shuffle = 1;
			else if (strcmp(optarg, "off") == 0)
				shuffle = 0;
			else
				die(2, "--shuffle %s: expected on or off", optarg);
			break;
		case 'j': threads = (int)parse_long("--threads", optarg, 1, 4096); break;
		case 'o': save = optarg; break;
		case 'M': metrics = optarg; break;
		case 'i': init = optarg; break;
		case 'L': log_every = (int)parse_long("--log-every", optarg, 1, 1 << 30); break;
		case 'h': train_usage(stdout); return 0;
		default: die(2, "train: unknown or incomplete option %s (see strata train --help)",
			     argv[optind - 1]);
		}
	}
	if (optind < argc)
		die(2, "train: unexpected argument %s", argv[optind]);
	if (init) {
		struct st_model_config mc;

		read_ckpt_config(init, &mc);
		if (model_given && memcmp(&mc, &cfg.model, sizeof(mc)) != 0)
			die(2, "--model differs from the model in --init %s", init);
		cfg.model = mc;
	}
	if (cfg.seq > cfg.model.ctx)
		die(2, "--seq %d is longer than the model's context of %d", cfg.seq, cfg.model.ctx);
	if (save) {
		struct stat st;

		if (stat(save, &st) == 0 && !S_ISDIR(st.st_mode))
			die(2, "--save %s exists and is not a directory", save);
	}
	set_threads(threads);
	ds = open_data(data, cfg.model.vocab);
	lc = (struct st_loader_config){ .batch = (uint32_t)cfg.batch, .seq = (uint32_t)cfg.seq,
					.shuffle = shuffle, .seed = cfg.seed,
					.split = ST_SPLIT_ALL };
	if (st_loader_init(&ld, ds, &lc) < 0)
		die(2, "--data %s: %s", data, st_error_last());
	if (metrics) {
		snprintf(mtmp, sizeof(mtmp), "%s", metrics);
		mf = fopen(metrics, "w");
		if (!mf)
			die(2, "--metrics %s: %s", metrics, strerror(errno));
	}
	if (st_trainer_create(&cfg, &t) < 0)
		die(1, "%s", st_error_last());
	if (init)
		load_ckpt(t, init);
	printf("strata train: %.2fM params, %d layers, dim %d, %d heads, vocab %d | data %s (%llu tokens) | "
	       "B=%d T=%d accum %d | %d threads | adam %s\n",
	       (double)st_model_param_count(st_trainer_model(t)) / 1e6, cfg.model.n_layer, cfg.model.n_embd, cfg.model.n_head,
	       cfg.model.vocab, data, (unsigned long long)st_dataset_tokens(ds), cfg.batch,
	       cfg.seq, cfg.grad_accum, omp_get_max_threads(),
	       st_optim_path_name(st_optim_path_get()));
	fflush(stdout);
	t0 = st_now_ns();
	for (int s = 0; s < cfg.steps; s++) {
		struct st_step_result r;
		uint64_t s0 = st_now_ns();
		double dt, tps;
		char eta[32];

		if (st_trainer_step(t, &ld, s, &r) < 0)
			die(1, "step %d: %s", s + 1, st_error_last());
		dt = (double)(st_now_ns() - s0) / 1e9;
		tps = (double)cfg.batch * cfg.seq * cfg.grad_accum / dt;
		if ((s + 1) % log_every == 0 || s + 1 == cfg.steps || r.skipped)
			printf("step %*d/%d | loss %.6f | lr %.3e | norm %.4f%s | %.0f tok/s | ETA %s\n",
			       (int)log10(cfg.steps) + 1, s + 1, cfg.steps, r.loss, r.lr, r.grad_norm,
			       r.skipped ? " (non-finite: skipped)" : "", tps,
			       fmt_eta((double)(st_now_ns() - t0) / 1e9 / (s + 1) * (cfg.steps - s - 1),
				       eta, sizeof(eta)));
		if (mf) {
			fprintf(mf, "{\"step\":%d,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,"
				    "\"tokens_per_s\":%.1f%s}\n", s + 1, r.loss, r.lr,
				r.skipped ? 0.0 : r.grad_norm, tps, r.skipped ? ",\"skipped\":true" : "");
			fflush(mf);
		}
		fflush(stdout);
	}
	if (mf && fclose(mf) != 0)
		die(1, "--metrics %s: %s", mtmp, strerror(errno));
	if (save) {
		if (st_trainer_save(t, save) < 0)
			die(1, "--save %s: %s", save, st_error_last());
		printf("saved %s\n", save);
	}
	st_trainer_destroy(t);
	st_dataset_close(ds);
	return 0;
}

/* --- generate --------------------------------------------------------------- */

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
"usage: strata generate --ckpt DIR [--prompt TEXT] [--tokens N] [--temperature X]\n"
"                       [--top-k K] [--seed N] [--threads N]\n"
"\n"
"Continue TEXT with a byte-level (vocab 256) checkpoint and print the result.\n"
"  --tokens N        bytes to generate (default 200)\n"
"  --temperature X   0 is greedy (default 0.8)\n"
"  --top-k K         sample among the K likeliest, 0 for all (default 40)\n");
}

static int cmd_generate(int argc, char **argv)
{
	static const struct option longs[] = {
		{ "ckpt", 1, 0, 'c' }, { "prompt", 1, 0, 'p' }, { "tokens", 1, 0, 'n' },
		{ "temperature", 1, 0, 't' }, { "top-k", 1, 0, 'k' }, { "seed", 1, 0, 's' },
		{ "threads", 1, 0, 'j' }, { "help", 0, 0, 'h' }, { 0 },
	};
	const char *ckpt = NULL, *prompt = "\n";
	int n = 200, top_k = 40, threads = 0, c, len;
	double temp = 0.8;
	uint64_t rng = 1337;
	struct st_train_config cfg;
	struct st_trainer *t;
	int32_t *toks;
	float *logits;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		switch (c) {
		case 'c': ckpt = optarg; break;
		case 'p': prompt = optarg; break;
		case 'n': n = (int)parse_long("--tokens", optarg, 0, 1 << 20); break;
		case 't': temp = parse_double("--temperature", optarg, 0, 100); break;
		case 'k': top_k = (int)parse_long("--top-k", optarg, 0, 1 << 30); break;
		case 's': rng = (uint64_t)parse_long("--seed", optarg, 0, 0x7fffffffffffffffL); break;
		case 'j': threads = (int)parse_long("--threads", optarg, 1, 4096); break;
		case 'h': gen_usage(stdout); return 0;
		default: die(2, "generate: unknown or incomplete option %s (see strata generate --help)",
			     argv[optind - 1]);
		}
	}
	if (optind < argc)
		die(2, "generate: unexpected argument %s", argv[optind]);
	if (!ckpt)
		die(2, "generate: --ckpt DIR is required");
	if (!*prompt)
		die(2, "generate: --prompt must not be empty");
	st_train_config_default(&cfg);
	read_ckpt_config(ckpt, &cfg.model);
	if (cfg.model.vocab != 256)
		die(2, "generate: --ckpt %s has a vocabulary of %d; generate needs a byte-level model (256)",
		    ckpt, cfg.model.vocab);
	set_threads(threads);
	cfg.batch = 1;
	cfg.seq = cfg.model.ctx;
	if (st_trainer_create(&cfg, &t) < 0)
		die(1, "%s", st_error_last());
	load_ckpt(t, ckpt);
	len = (int)strlen(prompt);
	toks = malloc(sizeof(*toks) * (size_t)(len + n));
	logits = malloc(sizeof(*logits) * 256);
	for (int i = 0; i < len; i++)
		toks[i] = (unsigned char)prompt[i];
	fputs(prompt, stdout);
	for (int i = 0; i < n; i++) {
		if (st_trainer_logits(t, toks, len + i, logits) < 0)
			die(1, "%s", st_error_last());
		toks[len + i] = sample(logits, 256, temp, top_k, &rng);
		putchar(toks[len + i]);
		fflush(stdout);
	}
	putchar('\n');
	free(toks);
	free(logits);
	st_trainer_destroy(t);
	return 0;
}

/* --- eval ------------------------------------------------------------------- */

static int cmd_eval(int argc, char **argv)
{
	static const struct option longs[] = {
		{ "ckpt", 1, 0, 'c' }, { "data", 1, 0, 'd' }, { "batch", 1, 0, 'B' },
		{ "seq", 1, 0, 'T' }, { "batches", 1, 0, 'n' }, { "threads", 1, 0, 'j' },
		{ "help", 0, 0, 'h' }, { 0 },
	};
	const char *ckpt = NULL, *data = NULL;
	int B = 4, T = 0, nb = 0, threads = 0, c;
	struct st_train_config cfg;
	struct st_trainer *t;
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
		case 'B': B = (int)parse_long("--batch", optarg, 1, 1 << 16); break;
		case 'T': T = (int)parse_long("--seq", optarg, 1, 1 << 20); break;
		case 'n': nb = (int)parse_long("--batches", optarg, 1, 1 << 30); break;
		case 'j': threads = (int)parse_long("--threads", optarg, 1, 4096); break;
		case 'h':
			printf("usage: strata eval --ckpt DIR --data FILE [--batch B] [--seq T] [--batches N]\n"
			       "\nMean cross-entropy of the checkpoint over FILE, read in order\n"
			       "(llm.c's contiguous windows). Defaults: B=4, T=min(ctx,256), as many\n"
			       "batches as the file holds, at most 100.\n");
			return 0;
		default: die(2, "eval: unknown or incomplete option %s (see strata eval --help)",
			     argv[optind - 1]);
		}
	}
	if (optind < argc)
		die(2, "eval: unexpected argument %s", argv[optind]);
	if (!ckpt || !data)
		die(2, "eval: --ckpt DIR and --data FILE are required");
	st_train_config_default(&cfg);
	read_ckpt_config(ckpt, &cfg.model);
	if (T == 0)
		T = ST_MIN(cfg.model.ctx, 256);
	if (T > cfg.model.ctx)
		die(2, "--seq %d is longer than the model's context of %d", T, cfg.model.ctx);
	set_threads(threads);
	ds = open_data(data, cfg.model.vocab);
	avail = st_dataset_tokens(ds) > 1 ? (st_dataset_tokens(ds) - 1) / ((uint64_t)B * T) : 0;
	if (avail == 0)
		die(2, "--data %s: fewer than B*T+1 = %d tokens", data, B * T + 1);
	if (nb == 0)
		nb = (int)ST_MIN(avail, 100);
	cfg.batch = B;
	cfg.seq = T;
	lc = (struct st_loader_config){ .batch = (uint32_t)B, .seq = (uint32_t)T, .shuffle = 0,
					.split = ST_SPLIT_ALL };
	if (st_loader_init(&ld, ds, &lc) < 0)
		die(2, "--data %s: %s", data, st_error_last());
	if (st_trainer_create(&cfg, &t) < 0)
		die(1, "%s", st_error_last());
	load_ckpt(t, ckpt);
	if (st_trainer_eval(t, &ld, nb, &loss) < 0)
		die(1, "%s", st_error_last());
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
"  train      train a GPT-2 family model (the default with no command)\n"
"  generate   continue a prompt with a byte-level checkpoint\n"
"  eval       mean loss of a checkpoint on a data file\n"
"\n"
"strata COMMAND --help for each command's options.\n");
}

int main(int argc, char **argv)
{
	const char *cmd = argc > 1 ? argv[1] : "train";

	if (argc > 1 && (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0)) {
		usage(stdout);
		return 0;
	}
	if (strcmp(cmd, "--version") == 0) {
		printf("strata %d.%d\n", ST_VERSION_MAJOR, ST_VERSION_MINOR);
		return 0;
	}
	if (argc > 1 && cmd[0] == '-') /* flags without a command: train */
		return cmd_train(argc, argv);
	if (strcmp(cmd, "train") == 0)
		return cmd_train(argc - 1, argv + 1);
	if (strcmp(cmd, "generate") == 0)
		return cmd_generate(argc - 1, argv + 1);
	if (strcmp(cmd, "eval") == 0)
		return cmd_eval(argc - 1, argv + 1);
	die(2, "unknown command %s (see strata --help)", cmd);
}

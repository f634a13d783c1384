/* `strata generate`: a prompt continued from a checkpoint, text in and out
 * through its tokenizer (or bytes, for a byte-level model). Where it can
 * (fp32, the whole text within the model's context) it decodes with a KV
 * cache (st_model_decode_*) on --device: the weights and the decoder in the
 * device's memory, sized by the prompt and --tokens. Else the model runs
 * in the reference trainer (strata/train.h) on the host, recomputing. */
#include "cli.h"
#include "strata/compute.h"
#include "strata/device.h"
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
"                       [--compute-dtype fp32|bf16] [--device auto|cpu|cpu-strict|cuda]\n"
"                       [--gpu-mem SIZE|auto]\n"
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
"  --device D        where the KV cache decodes (default $ST_DEVICE, else auto:\n"
"                    cuda when a GPU is usable, else cpu)\n"
"  --gpu-mem SIZE    the most the device may take (default auto: on cuda the\n"
"                    GPU's free memory less a margin); it takes what the fp32\n"
"                    weights and the cache for the prompt and --tokens need\n"
"The prompt runs once and each new token reuses its keys and values (a KV\n"
"cache) at fp32 while the text fits the model's context, on --device; bf16,\n"
"or a longer text, recomputes the whole window for each token on the host.\n");
}

/* The decoder on a device: its compute, a model bound to it, every unit's
 * fp32 weights and the decoder (st_model_decode_begin_in) in its arena. */
struct gen_dev {
	struct st_device *dev;
	struct st_compute *c;
	struct st_model *m;
	void **params; /* device pointers */
	struct st_decode *dec;
};

#define GEN_ALIGN 256

/* The arena's bytes: the weights, then the decoder for max positions and
 * a prompt of rows tokens. */
static uint64_t gen_dev_bytes(const struct st_model *m, int max, int rows, uint64_t *w_bytes)
{
	*w_bytes = 0;
	for (int u = 0; u < st_model_unit_count(m); u++)
		*w_bytes += st_align_up(st_model_unit_layout(m, u)->elems * sizeof(float),
					GEN_ALIGN);
	return *w_bytes + st_model_decode_bytes(m, max, rows);
}

/* The arena a decoder of need bytes takes on device name, refused with
 * what to raise when --gpu-mem (or, on cuda, the GPU's free memory less
 * the margin of --gpu-mem auto) is less. */
static uint64_t gen_dev_budget(const char *name, const char *gpu_mem, uint64_t need,
			       uint64_t w_bytes, const struct st_device_probe *probe)
{
	char a[32], b[32], c[32], d[32], why[256];
	uint64_t have;

	if (gpu_mem && strcmp(gpu_mem, "auto") != 0)
		have = st_cli_size("--gpu-mem", gpu_mem);
	else if (strcmp(name, "cuda") == 0)
		have = st_cli_gpu_mem_auto(name, probe, why, sizeof(why));
	else
		return need;
	if (need > have)
		st_cli_die(2, "generate: the %s device needs %s: the fp32 weights (%s) and the KV "
			   "cache with its workspace for the prompt and --tokens (%s); --gpu-mem "
			   "is %s: raise it, or shorten --tokens", name,
			   st_format_bytes(need, a, sizeof(a)), st_format_bytes(w_bytes, b, sizeof(b)),
			   st_format_bytes(need - w_bytes, c, sizeof(c)),
			   st_format_bytes(have, d, sizeof(d)));
	return need;
}

/* Open --device (auto: cuda when usable), bind a model to its compute,
 * copy the trainer's weights in, and begin a decoder for max positions
 * whose first step (the prompt) is rows tokens. false (nothing open) for
 * a family that does not decode with a cache. */
static bool gen_dev_open(struct gen_dev *g, struct st_trainer *t, const char *device,
			 const char *gpu_mem, int max, int rows)
{
	const struct st_model *tm = st_trainer_model(t);
	struct st_device_config dc = { 0 };
	struct st_device_probe probe;
	const struct st_device_ops *ops;
	const char *name;
	char why[256], *base;
	uint64_t w_bytes, need, arena_bytes, off = 0, most = 0;
	float *host;

	memset(g, 0, sizeof(*g));
	if (!st_model_decodes(tm))
		return false;
	name = st_cli_device(device, &probe, why, sizeof(why));
	if (!(ops = st_device_find(name)))
		st_cli_die(2, "generate: --device %s: not built into this binary (auto, %s)", name,
			   st_device_list());
	if (strcmp(name, "cuda") == 0 && !probe.usable)
		st_cli_die(2, "generate: --device cuda: no usable GPU (%s)", probe.what);
	if (st_model_create(st_model_config(tm), &g->m) < 0)
		st_cli_die(1, "generate: %s", st_error_last());
	need = gen_dev_bytes(g->m, max, rows, &w_bytes);
	dc.mem_bytes = gen_dev_budget(name, gpu_mem, need, w_bytes, &probe);
	if (st_device_create(ops, &dc, &g->dev) < 0 || st_compute_create(g->dev, &g->c) < 0)
		st_cli_die(1, "generate: --device %s: %s", name, st_error_last());
	st_model_set_compute(g->m, g->c);
	base = st_device_arena(g->dev, &arena_bytes);
	for (int u = 0; u < st_model_unit_count(g->m); u++)
		most = ST_MAX(most, st_model_unit_layout(g->m, u)->elems);
	g->params = calloc((size_t)st_model_unit_count(g->m), sizeof(*g->params));
	host = malloc(most * sizeof(float));
	if (!g->params || !host)
		st_cli_die(1, "generate: out of memory");
	for (int u = 0; u < st_model_unit_count(g->m); u++) {
		size_t bytes = st_model_unit_layout(g->m, u)->elems * sizeof(float);

		g->params[u] = base + off;
		(void)st_trainer_unit_weights(t, u, host);
		st_compute_from_host(g->c, g->params[u], host, bytes);
		off += st_align_up(bytes, GEN_ALIGN);
	}
	free(host);
	if (st_compute_take_error(g->c) < 0 ||
	    st_model_decode_begin_in(g->m, max, rows, base + off, arena_bytes - off, &g->dec) < 0)
		st_cli_die(1, "generate: --device %s: %s", name, st_error_last());
	return true;
}

static void gen_dev_close(struct gen_dev *g)
{
	st_model_decode_end(g->dec);
	free(g->params);
	if (g->m)
		st_model_destroy(g->m);
	if (g->c)
		st_compute_destroy(g->c);
	if (g->dev)
		st_device_destroy(g->dev);
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
		{ "compute-dtype", 1, 0, 'D' }, { "device", 1, 0, 'd' }, { "gpu-mem", 1, 0, 'g' },
		/* hidden: the recompute path, for the tests and benchmarks */
		{ "no-kv-cache", 0, 0, 'R' }, { 0 },
	};
	const char *ckpt = NULL, *prompt = "\n", *tok_path = NULL, *device = NULL, *gpu_mem = NULL;
	enum st_precision compute = ST_PRECISION_FP32;
	struct st_tokenizer *tk;
	struct st_tok_ids pids = { 0 };
	size_t printed = 0, base = 0;
	int n = 200, top_k = 40, threads = 0, c, len;
	bool kv = true;
	struct gen_dev g = { 0 };
	bool dec = false;
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
		case 'd':
			if (strcmp(optarg, "auto") != 0 && !st_device_find(optarg))
				st_cli_die(2, "--device %s: not a device built into this binary "
					   "(auto, %s)", optarg, st_device_list());
			device = optarg;
			break;
		case 'g':
			if (strcmp(optarg, "auto") != 0)
				(void)st_cli_size("--gpu-mem", optarg);
			gpu_mem = optarg;
			break;
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
		dec = gen_dev_open(&g, t, device ? device : st_cli_device_default(), gpu_mem,
				   len + n, len);
	fputs(prompt, stdout);
	for (int i = 0; i < n; i++) {
		long bad;
		char v[32];

		if ((dec ? st_model_decode_step(g.dec, (const void *const *)g.params,
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
	gen_dev_close(&g);
	st_tok_ids_fini(&pids);
	st_tokenizer_close(tk);
	st_trainer_destroy(t);
	return 0;
}

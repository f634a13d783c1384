/* `strata eval`: a checkpoint's mean loss on a data file, read in order;
 * the model runs in the tiered engine's forward alone (st_engine_eval) on
 * --device, its tiers sized by --gpu-mem, --host-mem and --nvme for this B
 * and T, or with --reference in the in-memory reference trainer
 * (st_trainer_eval), which the engine matches bit for bit. */
#include "cli.h"
#include "strata/engine.h"
#include "strata/io.h"
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

/* What eval's flags set. */
struct eval_args {
	const char *ckpt, *data, *tok_path;
	int B, T, nb, threads;
	bool bf16, reference;
	enum st_precision compute;
	struct st_engine_config ec; /* device, budgets, nvme, W's home */
	const char *nvme;
	struct st_cli_budgets bud;
};

static void eval_usage(void)
{
	printf("usage: strata eval --ckpt PATH --data FILE [--tokenizer DIR|FILE] [--batch B]\n"
	       "                   [--seq T] [--batches N] [--precision bf16|fp32] [--threads N]\n"
	       "                   [--compute-dtype fp32|bf16] [--device auto|cpu|cuda]\n"
	       "                   [--gpu-mem SIZE|auto] [--host-mem SIZE|auto] [--nvme DIR[,DIR..]]\n"
	       "                   [--offload-params auto|none|host|nvme] [--reference]\n"
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
	       "beside the checkpoint (as strata generate finds it); several shards\n"
	       "as FILE,FILE,... or a pattern ('dir/*.bin', sorted), read as one.\n"
	       "A shard's loss mask is honoured: the mean over its counted targets.\n"
	       "A shard made by another tokenizer than the model's is refused.\n"
	       "\nThe model runs in the tiered engine's forward alone, as train's\n"
	       "validation does (docs/engine.md, \"The forward alone\"): W and the\n"
	       "forward's buffers only, planned for this B and T, W streamed from its\n"
	       "home.\n"
	       "  --device auto|cpu|cpu-strict|cuda  where (default $ST_DEVICE, else auto:\n"
	       "                       cuda when a GPU is usable)\n"
	       "  --gpu-mem SIZE|auto  device budget (default auto: the GPU's free memory less a\n"
	       "                       margin; on the cpu devices a quarter of MemAvailable)\n"
	       "  --host-mem SIZE|auto pinned host budget (default auto: half of MemAvailable on\n"
	       "                       cuda, a quarter within RLIMIT_MEMLOCK on the cpu devices)\n"
	       "  --nvme DIR[,DIR..]   an nvme tier for W (default none)\n"
	       "  --offload-params auto|none|host|nvme  the home of W (default auto)\n"
	       "  --reference          the in-memory reference trainer instead, on the cpu (the\n"
	       "                       whole model and a training state in RAM, 18 B/param or\n"
	       "                       more); the engine gives its numbers bit for bit\n"
	       "A budget the model cannot fit in is refused (exit 2), naming the tier.\n");
}

/* The flags into *a; true for --help (printed). Bad input exits 2. */
static bool eval_parse(int argc, char **argv, struct eval_args *a)
{
	static const struct option longs[] = {
		{ "ckpt", 1, 0, 'c' }, { "data", 1, 0, 'd' }, { "batch", 1, 0, 'B' },
		{ "seq", 1, 0, 'T' }, { "batches", 1, 0, 'n' }, { "threads", 1, 0, 'j' },
		{ "precision", 1, 0, 'p' }, { "tokenizer", 1, 0, 'z' }, { "help", 0, 0, 'h' },
		{ "compute-dtype", 1, 0, 'D' }, { "device", 1, 0, 'v' }, { "gpu-mem", 1, 0, 'G' },
		{ "host-mem", 1, 0, 'H' }, { "nvme", 1, 0, 'N' }, { "offload-params", 1, 0, 'P' },
		{ "reference", 0, 0, 'R' },
		{ 0 },
	};
	int c;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		switch (c) {
		case 'c': a->ckpt = optarg; break;
		case 'd':
			if (a->data)
				st_cli_die(2, "eval: --data given twice (%s, then %s): name several "
					   "files in one --data FILE,FILE or a pattern", a->data, optarg);
			a->data = optarg;
			break;
		case 'B': a->B = (int)st_cli_long("--batch", optarg, 1, 1 << 16); break;
		case 'T': a->T = (int)st_cli_long("--seq", optarg, 1, 1 << 20); break;
		case 'n': a->nb = (int)st_cli_long("--batches", optarg, 1, 1 << 30); break;
		case 'j': a->threads = (int)st_cli_long("--threads", optarg, 1, 4096); break;
		case 'z': a->tok_path = optarg; break;
		case 'p':
			if (strcmp(optarg, "bf16") != 0 && strcmp(optarg, "fp32") != 0)
				st_cli_die(2, "--precision %s: expected bf16 or fp32", optarg);
			a->bf16 = strcmp(optarg, "bf16") == 0;
			break;
		case 'D':
			if (st_precision_parse(optarg, &a->compute) < 0)
				st_cli_die(2, "--compute-dtype %s: expected fp32 or bf16", optarg);
			break;
		case 'v':
			if (strcmp(optarg, "auto") != 0 && !st_device_find(optarg))
				st_cli_die(2, "--device %s: not a device built into this binary "
					   "(auto, %s)", optarg, st_device_list());
			a->ec.device = optarg;
			break;
		case 'G': st_cli_budget_arg(&a->bud, true, optarg, &a->ec.gpu_mem_bytes); break;
		case 'H': st_cli_budget_arg(&a->bud, false, optarg, &a->ec.host_mem_bytes); break;
		case 'N': a->nvme = optarg; break;
		case 'P': a->ec.params = st_cli_offload("--offload-params", optarg, true); break;
		case 'R': a->reference = true; break;
		case 'h': eval_usage(); return true;
		default: st_cli_bad_option("eval", longs, argv[optind - 1]);
		}
	}
	if (optind < argc)
		st_cli_die(2, "eval: unexpected argument %s", argv[optind]);
	if (!a->ckpt || !a->data)
		st_cli_die(2, "eval: --ckpt PATH and --data FILE are required");
	return false;
}

/* --data as the model reads it: a token shard (or several), or text
 * tokenized with the model's tokenizer (or read as bytes). */
static struct st_dataset *eval_data(const struct eval_args *a, const struct st_model_config *mc)
{
	struct st_tokenizer *tk = NULL;
	struct st_dataset *ds;
	char shard[4096];

	/* text for a tokenizer: an explicit --tokenizer, or a model that is
	 * not byte-level with a tokenizer beside it; a token shard as it is;
	 * a list of files or a pattern: token shards (or text read as bytes) */
	if ((a->tok_path || mc->vocab != 256) && !st_cli_data_is_list(a->data)) {
		struct st_dataset *probe;
		size_t dl = strlen(a->data);
		/* a .bin is a shard, broken or not (st_cli_open_data says why) */
		bool is_shard = dl > 4 && strcmp(a->data + dl - 4, ".bin") == 0;

		if (!is_shard && st_dataset_open(&probe, a->data, ST_DATASET_AUTO) == 0) {
			is_shard = st_dataset_format(probe) == ST_DATASET_LLMC;
			st_dataset_close(probe);
		}
		if (!is_shard) {
			tk = st_cli_tokenizer(a->tok_path, a->ckpt);
			/* as strata train reads it: a model trained on a text's
			 * bytes is evaluated on them, but say so */
			if (!tk)
				st_warn("--data %s is text and --ckpt %s (vocabulary %d) has no "
					"tokenizer.json beside it: its bytes are the ids (name a "
					"tokenizer with --tokenizer)", a->data, a->ckpt, mc->vocab);
			else if (st_tokenizer_vocab(tk) > (uint32_t)mc->vocab)
				st_cli_die(2, "eval: the tokenizer has %u ids, more than the model's "
					   "vocabulary of %d", st_tokenizer_vocab(tk), mc->vocab);
		}
	}
	if (tk) {
		st_cli_text_shard(tk, a->data, shard, sizeof(shard));
		ds = st_cli_open_data(shard, mc->vocab);
		unlink(shard);
		st_cli_at_die(NULL);
		st_tokenizer_close(tk);
	} else {
		char tdir[4096];

		ds = st_cli_open_data_list(a->data, mc->vocab);
		/* a shard made by another tokenizer than the model's */
		st_cli_check_shard_tokenizer(ds, "--data", a->data, a->tok_path ? a->tok_path
					     : st_cli_tokenizer_dir(a->ckpt, tdir, sizeof(tdir)) ? tdir
					     : NULL);
	}
	return ds;
}

/* What runs the batches: the engine's forward alone, or the reference
 * trainer; either gives a batch's sum and count (eval_one). */
struct evaluator {
	struct st_engine *e;
	struct st_trainer *t;
};

static int eval_one(struct evaluator *ev, struct st_loader *ld, double *sum, uint64_t *count)
{
	if (ev->e)
		return st_engine_eval(ev->e, ld, 1, sum, count);
	*count = 1;
	/* a loss mask: the sum over its counted targets */
	return st_loader_masked(ld) ? st_trainer_eval_sum(ev->t, ld, 1, sum, count)
				    : st_trainer_eval(ev->t, ld, 1, sum);
}

/* The engine of the eval: the forward alone (W and the forward's buffers,
 * no training state), this B and T, W where --offload-params says; w
 * loaded into it (a NaN or Inf refused). */
static struct st_engine *eval_engine(struct eval_args *a, const struct st_train_config *cfg,
				     struct st_weights *w)
{
	struct st_engine_config *ec = &a->ec;
	struct st_engine *e;
	int ret;

	ec->train = *cfg;
	ec->compute_dtype = a->compute;
	if (a->nvme) {
		st_cli_check_dirs("--nvme", a->nvme, true);
		ec->nvme_dirs = a->nvme;
	}
	ec->forward_only = true;
	ret = st_engine_create(ec, &e);
	if (ret < 0) {
		st_weights_close(w);
		st_cli_die(ret == -ENOSPC || ret == -EINVAL || ret == -ENODEV || ret == -ENOTSUP
			   ? 2 : 1, "eval: %s", st_error_last());
	}
	ret = st_engine_load_weights(e, w);
	if (ret < 0) {
		char why[1024];

		snprintf(why, sizeof(why), "%s", st_cli_unprefix(st_error_last(), a->ckpt));
		st_weights_close(w);
		st_engine_destroy(e);
		st_cli_die(st_cli_input_exit(ret), "--ckpt %s: %s", a->ckpt, why);
	}
	st_weights_close(w);
	return e;
}

/* The batches, one by one for the progress: the mean over them (a loss
 * mask: over their counted targets). */
static double eval_run(struct evaluator *ev, struct st_loader *ld, const struct eval_args *a)
{
	struct st_cli_progress pr = { 0 };
	double sum = 0, l;
	uint64_t counted = 0, c;

	st_cli_progress(&pr, "eval", 0, a->nb, "batches"); /* the clock starts */
	for (int i = 0; i < a->nb; i++) {
		if (eval_one(ev, ld, &l, &c) < 0)
			st_cli_die(1, "%s", st_error_last());
		sum += l;
		counted += c;
		st_cli_progress(&pr, "eval", i + 1, a->nb, "batches");
	}
	if (!counted)
		st_cli_die(2, "eval: --data %s: the loss mask counts no target in %d batches",
			   a->data, a->nb);
	return sum / (double)counted;
}

int st_cli_eval(int argc, char **argv)
{
	struct eval_args a = { .B = 4, .bf16 = true, .compute = ST_PRECISION_FP32,
			       .ec = { .device = st_cli_device_default() },
			       .bud = { .auto_default = true } };
	struct st_train_config cfg;
	struct st_weights *w;
	struct st_dataset *ds;
	struct st_loader ld;
	struct st_loader_config lc;
	struct evaluator ev = { 0 };
	double loss;
	uint64_t avail;

	if (eval_parse(argc, argv, &a))
		return 0;
	st_train_config_default(&cfg);
	w = st_cli_open_ckpt(a.ckpt, &cfg.model);
	if (a.T == 0)
		a.T = ST_MIN(cfg.model.ctx, 256);
	if (a.T > cfg.model.ctx)
		st_cli_die(2, "--seq %d is longer than the model's context of %d", a.T,
			   cfg.model.ctx);
	set_threads_cli(a.threads);
	ds = eval_data(&a, &cfg.model);
	avail = st_dataset_tokens(ds) > 1 ? (st_dataset_tokens(ds) - 1) / ((uint64_t)a.B * a.T)
					  : 0;
	if (avail == 0)
		st_cli_die(2, "--data %s: fewer than B*T+1 = %d tokens", a.data, a.B * a.T + 1);
	if (a.nb == 0)
		a.nb = (int)ST_MIN(avail, 100);
	if ((uint64_t)a.nb > avail) /* the loader would wrap around and count batches twice */
		st_cli_die(2, "eval: --batches %d: --data %s holds %llu batches of %d x %d tokens",
			   a.nb, a.data, (unsigned long long)avail, a.B, a.T);
	cfg.batch = a.B;
	cfg.seq = a.T;
	cfg.bf16 = a.bf16;
	lc = (struct st_loader_config){ .batch = (uint32_t)a.B, .seq = (uint32_t)a.T,
					.shuffle = 0, .split = ST_SPLIT_ALL };
	if (st_loader_init(&ld, ds, &lc) < 0)
		st_cli_die(2, "--data %s: %s", a.data, st_error_last());
	if (a.reference) {
		if (st_trainer_create(&cfg, &ev.t) < 0)
			st_cli_die(1, "%s", st_error_last());
		if (st_trainer_set_precision(ev.t, a.compute) < 0)
			st_cli_die(2, "%s", st_error_last());
		st_cli_load_ckpt(ev.t, w, a.ckpt);
	} else {
		st_cli_budgets_resolve(&a.bud, &a.ec.device, &a.ec.gpu_mem_bytes,
				       &a.ec.host_mem_bytes);
		ev.e = eval_engine(&a, &cfg, w);
	}
	loss = eval_run(&ev, &ld, &a);
	if (!isfinite(loss)) /* finite weights whose forward overflows */
		st_cli_die(1, "eval: --ckpt %s: the loss over %d batches is %s: the model's values "
			   "are not finite (it overflows)", a.ckpt, a.nb, isnan(loss) ? "nan" : "inf");
	printf("loss %.6f over %d batches of %d x %d tokens\n", loss, a.nb, a.B, a.T);
	st_engine_destroy(ev.e);
	st_trainer_destroy(ev.t);
	st_dataset_close(ds);
	return 0;
}

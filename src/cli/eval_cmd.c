/* `strata eval`: a checkpoint's mean loss on a data file, read in order;
 * the model runs in the reference trainer (st_trainer_eval). */
#include "cli.h"
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

int st_cli_eval(int argc, char **argv)
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
		case 'd':
			if (data)
				st_cli_die(2, "eval: --data given twice (%s, then %s): name several "
					   "files in one --data FILE,FILE or a pattern", data, optarg);
			data = optarg;
			break;
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
			       "beside the checkpoint (as strata generate finds it); several shards\n"
			       "as FILE,FILE,... or a pattern ('dir/*.bin', sorted), read as one.\n"
			       "A shard's loss mask is honoured: the mean over its counted targets.\n"
			       "A shard made by another tokenizer than the model's is refused.\n");
			return 0;
		default: st_cli_bad_option("eval", longs, argv[optind - 1]);
		}
	}
	if (optind < argc)
		st_cli_die(2, "eval: unexpected argument %s", argv[optind]);
	if (!ckpt || !data)
		st_cli_die(2, "eval: --ckpt PATH and --data FILE are required");
	st_train_config_default(&cfg);
	w = st_cli_open_ckpt(ckpt, &cfg.model);
	if (T == 0)
		T = ST_MIN(cfg.model.ctx, 256);
	if (T > cfg.model.ctx)
		st_cli_die(2, "--seq %d is longer than the model's context of %d", T, cfg.model.ctx);
	set_threads_cli(threads);
	/* text for a tokenizer: an explicit --tokenizer, or a model that is
	 * not byte-level with a tokenizer beside it; a token shard as it is */
	tk = NULL;
	/* a list of files or a pattern: token shards (or text read as bytes) */
	if ((tok_path || cfg.model.vocab != 256) && !st_cli_data_is_list(data)) {
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
	} else {
		char tdir[4096];

		ds = st_cli_open_data_list(data, cfg.model.vocab);
		/* a shard made by another tokenizer than the model's */
		st_cli_check_shard_tokenizer(ds, data, tok_path ? tok_path
					     : st_cli_tokenizer_dir(ckpt, tdir, sizeof(tdir)) ? tdir
					     : NULL);
	}
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
	st_cli_load_ckpt(t, w, ckpt);
	{
		/* batch by batch, for the progress: the same sum, in the same
		 * order, as st_trainer_eval over all nb */
		struct st_cli_progress pr = { 0 };
		const bool masked = st_loader_masked(&ld);
		double sum = 0, l;
		uint64_t counted = 0, c;

		st_cli_progress(&pr, "eval", 0, nb, "batches"); /* the clock starts */
		for (int i = 0; i < nb; i++) {
			/* a loss mask: the mean over every counted target */
			if ((masked ? st_trainer_eval_sum(t, &ld, 1, &l, &c)
				    : st_trainer_eval(t, &ld, 1, &l)) < 0)
				st_cli_die(1, "%s", st_error_last());
			sum += l;
			counted += masked ? c : 0;
			st_cli_progress(&pr, "eval", i + 1, nb, "batches");
		}
		if (masked && !counted)
			st_cli_die(2, "eval: --data %s: the loss mask counts no target in %d batches",
				   data, nb);
		loss = masked ? sum / (double)counted : sum / nb;
	}
	if (!isfinite(loss)) /* finite weights whose forward overflows */
		st_cli_die(1, "eval: --ckpt %s: the loss over %d batches is %s: the model's values "
			   "are not finite (it overflows)", ckpt, nb, isnan(loss) ? "nan" : "inf");
	printf("loss %.6f over %d batches of %d x %d tokens\n", loss, nb, B, T);
	st_trainer_destroy(t);
	st_dataset_close(ds);
	return 0;
}

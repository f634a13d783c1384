/* `strata train`: flags -> one run configuration, and one call of
 * st_run_train() (src/train/run.c: the plan printed first; one progress
 * line per step with the tiers' use and the links' speed; metrics, trace,
 * checkpoints and resume). Bad input exits 2 before anything is allocated
 * or written; an I/O failure mid-run exits 1 naming file, offset and
 * errno, and the last checkpoint stays loadable. The signals that stop a
 * run are handled here: the run reads the flag. */
#include "cli.h"
#include "strata/ckpt.h"
#include "strata/comm.h"
#include "strata/device.h"
#include "strata/family.h"
#include "strata/run.h"
#include "strata/weights.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <json-c/json.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The demo's budgets: small enough that the tiny model uses all three
 * tiers (W streamed from host, the optimizer on nvme: part of each, as the
 * planner's split fills vram and host first). */
#define DEFAULT_GPU_MEM "16M"
#define DEFAULT_HOST_MEM "12M"
#define DEFAULT_NVME "/var/tmp"

static void train_usage(FILE *f)
{
	fprintf(f,
"usage: strata train [options]\n"
"\n"
"Train a GPT-2 or LLaMA family model with its state in three tiers (vram, pinned\n"
"host, nvme). With no options: the tiny byte-level model on\n"
"%s for 100 steps, with budgets small\n"
"enough that every tier is used; the plan is printed first.\n"
"\n"
"model and data\n"
"  --model NAME|DIMS    %s, or layers=L,dim=C,heads=H,vocab=V,ctx=T (default tiny)\n"
"                       either may follow FAMILY: (families: %s); LLaMA's dims:\n"
"                       llama:layers=L,dim=C,heads=H,kv-heads=K,ffn=F,vocab=V,ctx=T\n"
"                       with optional keys for head size, rope and head (docs/model.md)\n"
"  --init FILE|DIR      start from weights: a Hugging Face directory (GPT-2, LLaMA, Qwen2;\n"
"                       one file or shards) or model.safetensors, a strata checkpoint, an\n"
"                       llm.c model file (gpt2_124M.bin); without --model, the model they\n"
"                       say (config.json, llm.c header); with --save, the tokenizer files\n"
"                       beside it are copied into the --save DIR\n"
"  --data FILE          raw text/bytes (vocab 256) or an llm.c .bin token shard; several\n"
"                       as FILE,FILE,... or a pattern ('dir/*.bin', sorted): one token\n"
"                       stream in that order. A shard's loss mask is honoured (the loss:\n"
"                       the mean over the step's counted targets); one made by another\n"
"                       tokenizer than the model's is refused (docs/finetune.md)\n"
"  --batch B --seq T    sequences per micro-batch, tokens per sequence (default 8, 128)\n"
"  --grad-accum N|auto  micro-batches per step (default 1); auto: what strata plan\n"
"                       --grad-accum auto takes (compute-bound, or near the best tok/s)\n"
"  --shuffle on|off     random windows, or llm.c's contiguous order (default on);\n"
"                       documents: each epoch's order shuffled, or the file's\n"
"  --samples windows|documents\n"
"                       a row is a window of T+1 tokens anywhere (default), or whole\n"
"                       documents of the shard packed in order, in epochs (a long one\n"
"                       in pieces of T+1 tokens; docs/finetune.md)\n"
"  --packing packed|isolated\n"
"                       documents: attention over the whole row, across the documents\n"
"                       packed in it (default), or within each document only (a\n"
"                       block-diagonal causal mask; positions still count 0..T-1)\n"
"device and tiers\n"
"  --device auto|cpu|cpu-strict|cuda  where the model runs (default $ST_DEVICE, else\n"
"                       auto: cuda when a GPU is usable, else cpu; said before the plan)\n"
"                       built here: %s\n"
"                       cpu-strict: the cpu device whose memory the host cannot\n"
"                       touch, as a GPU's (docs/gpu.md, \"Strict mode\")\n"
"  --gpu-mem SIZE|auto  device budget (the device's arena; SIZE as 512M, 2.3G); auto:\n"
"                       the GPU's free memory less max(1 GiB, 5%% of its total), or\n"
"                       on the cpu devices a quarter of MemAvailable (default: auto\n"
"                       on cuda, %s on the cpu devices: the demo's)\n"
"  --host-mem SIZE|auto pinned host budget; auto: half of MemAvailable on cuda, a\n"
"                       quarter on the cpu devices within RLIMIT_MEMLOCK's hard limit\n"
"                       (the host tier mlocks it) (default: auto on cuda, %s on\n"
"                       the cpu devices); docs/plan.md, \"Budgets\"\n"
"  --nvme DIR[,DIR..]   swap directories, striped (default %s; 'none' for no nvme tier)\n"
"  --nvme-mem SIZE      nvme budget (default: what the plan needs)\n"
"  --offload-params auto|none|host|nvme   home of W (default auto)\n"
"  --offload-optim auto|host|nvme|vram    home of G, P, M, V (default auto; vram:\n"
"                                         AdamW on the device, W in vram too)\n"
"  --optim-state fp32|bf16|q8  Adam's M and V (default fp32; bf16 or q8: 8-bit\n"
"                       blocks with fp32 scales, fewer bytes in every tier and\n"
"                       in the AdamW sweep; not with --offload-optim vram nor at\n"
"                       world > 1; docs/optim.md)\n"
"  --offload-activations auto|vram|host   activation checkpoints' home (default\n"
"                       auto: vram when the budget holds them, else host)\n"
"  --prefetch N         units fetched ahead (0, the default: as many as the budget allows)\n"
"  --recompute auto|all|none  which blocks' backward recomputes their forward: all\n"
"                       (the least vram), none (every block keeps its forward in vram;\n"
"                       exit 2 when it does not fit), auto (default: as many as the vram\n"
"                       budget holds after everything else); the numbers are the same\n"
"  --schedule batch-first|layer-first|auto  the micro-batches' order (default\n"
"                       batch-first; layer-first: each unit runs all --grad-accum\n"
"                       micro-batches while its W is in vram, so W and G cross once a\n"
"                       step; auto: layer-first when it fits and is predicted faster);\n"
"                       the numbers are the same\n"
"  --update after|in-backward|auto  when a unit's AdamW runs (default after: the\n"
"                       sweep after the backward, fused with the next forward;\n"
"                       in-backward: as soon as its G is final, speculating that the\n"
"                       clip does not apply, P, M, V written copy-on-write on nvme and\n"
"                       committed once the norm is known, else the step runs again; a\n"
"                       step after one the clip applied to updates after; auto:\n"
"                       in-backward when every P, M, V is on nvme and it is predicted\n"
"                       faster than after, on those homes and on the homes planned\n"
"                       for after); the numbers are the same\n"
"  --aio-block SIZE --aio-depth N         nvme request size and queue depth (1M, 32)\n"
"  --rates FILE         the planner's rates from a rates file (strata plan --calibrate)\n"
"  --rates-refresh FILE write the rates this run measures (steps 2 to 4: compute, copies,\n"
"                       nvme and AdamW from each queue's busy time and bytes) to FILE\n"
"  --verify-reads on|off  check every nvme read against the XXH3 of what was\n"
"                       written (default on: a mismatch stops the run, exit 1)\n"
"data parallelism (mpirun -np N strata train ...; docs/zero.md)\n"
"  --zero 0|1|2|3       ZeRO stage: 0 every rank holds everything, 1 shards P, M, V,\n"
"                       2 also G, 3 also W (default 0). Each rank takes micro-batch r\n"
"                       of every N, so N ranks at --grad-accum A read what one reads\n"
"                       at N*A; budgets are per rank; rank 0 prints and saves\n"
"optimizer\n"
"  --steps N            optimizer steps (default 100)\n"
"  --lr X --lr-schedule cosine|constant --warmup N   (1e-3, cosine to lr/10, 10)\n"
"  --wd X               decoupled weight decay on matrices and embeddings (0.1)\n"
"  --beta1 X --beta2 X --eps X   (0.9, 0.95, 1e-8)\n"
"  --clip X             global gradient-norm clip, 0 disables (1.0)\n"
"run\n"
"  --seed N             initialisation and sampling seed (1337)\n"
"  --precision bf16|fp32  working weights W (bf16; master weights are fp32)\n"
"  --compute-dtype fp32|bf16  the tensors between the model's ops (default fp32, the\n"
"                       reference); bf16: bf16 W and activations, fp32 norms, softmax,\n"
"                       loss and gradient accumulation (docs/model.md); exit 2 when the\n"
"                       device does not run every op the bf16 path needs\n"
"  --threads N          OpenMP threads (default: OMP_NUM_THREADS or all cores)\n"
"  --save DIR           checkpoints go to DIR/step-N, DIR/latest points at the newest\n"
"                       (one run saves into a DIR at a time; a DIR holding another\n"
"                       run's checkpoints only with --resume naming that run)\n"
"  --save-every N       also every N steps (default: only at the end, or when stopped)\n"
"  --keep K             keep the newest K checkpoints (default 3; 0 keeps all)\n"
"  --shard-size SIZE    a checkpoint file over SIZE is sharded as transformers shards\n"
"                       (model-0000K-of-0000N.safetensors + index; default 5e9 bytes)\n"
"  --resume DIR|auto    continue bit-identically from a checkpoint (or DIR/latest);\n"
"                       auto: from --save DIR when it has one, else from the start.\n"
"                       Flags not given are the saved run's (model, data, optimizer,\n"
"                       schedule; --save: DIR); --steps M past the saved total extends\n"
"                       the run, the added steps at the schedule's final LR\n"
"  --val-data FILE      a validation set (text or a token shard, as --data), scored\n"
"                       after every --eval-every N steps and the last: val_loss in the\n"
"                       progress line and --metrics; the same batches each time\n"
"  --eval-every N       steps between evaluations (needs --val-data)\n"
"  --val-batches K      batches of --val-data, read in order from its start (default:\n"
"                       what it holds, at most %d)\n"
"  --keep-best          save at every evaluation and point DIR/best at the checkpoint\n"
"                       of the lowest val_loss (DIR/best.json), kept whatever --keep\n"
"                       prunes (needs --save, --val-data)\n"
"  --metrics FILE       one JSON object per step (loss, lr, grad_norm, tokens_per_s,\n"
"                       bytes per link, peak per tier, busy time per queue)\n"
"  --trace FILE         Chrome trace-event JSON, one lane per queue (open in Perfetto)\n"
"  --log-every N        print every Nth step (default 1)\n"
"  --max-skipped N      stop (exit 1) after N steps in a row whose gradient was not\n"
"                       finite, each skipped (default 10; 0 never stops)\n"
"  -h, --help\n"
"testing\n"
"  --test-fault SPEC    inject a fault into the nvme tier through the fault tier\n"
"                       (docs/reliability.md); may be given twice, a fault and a\n"
"                       corruption. SPEC is KIND@N[+M][:ARG]:\n"
"                       eio, short, enospc, delay (ARG: ms, default 100) at the Nth\n"
"                       operation of the nvme tier (allocations and requests, from 1),\n"
"                       again every M after; bit, zero-byte, page-ff (ARG: the byte\n"
"                       in the write, default 0), stale, other-page (ARG: the offset\n"
"                       of the source page in the tier) at the Nth write\n"
"\n"
"Ctrl-C or SIGTERM stops the run at the end of a step, saves it there when\n"
"--save is given, and exits 130; a second one stops it at once. Under mpirun\n"
"the ranks stop alike: a Ctrl-C to mpirun gives them 2 x its\n"
"odls_base_sigkill_timeout (2 s by default) to end the step and save; SIGUSR1\n"
"to mpirun (forwarded) stops them with no deadline (docs/zero.md).\n"
"Values that are not finite: --init and --resume refuse weights or optimizer\n"
"state holding a NaN or Inf (exit 2, naming the tensor and index); a save whose\n"
"state is not finite is refused (exit 1), so `latest` always names a finite one.\n",
		ST_DEFAULT_DATA, st_model_preset_list(), st_family_list(), st_device_list(), DEFAULT_GPU_MEM,
	        DEFAULT_HOST_MEM, DEFAULT_NVME, ST_RUN_VAL_BATCHES);
}



/* --test-fault KIND@N[+M][:ARG] into f (docs/reliability.md). Bad input
 * exits 2 with one line. */
static void parse_test_fault(const char *spec, struct st_fault_config *f)
{
	static const struct { const char *name; int fault; int corrupt; } kinds[] = {
		{ "eio", ST_FAULT_EIO, 0 }, { "short", ST_FAULT_SHORT, 0 },
		{ "enospc", ST_FAULT_ENOSPC, 0 }, { "delay", ST_FAULT_DELAY, 0 },
		{ "bit", 0, ST_CORRUPT_BIT }, { "zero-byte", 0, ST_CORRUPT_ZERO_BYTE },
		{ "page-ff", 0, ST_CORRUPT_PAGE_FF }, { "stale", 0, ST_CORRUPT_STALE },
		{ "other-page", 0, ST_CORRUPT_OTHER_PAGE },
	};
	const char *at = strchr(spec, '@');
	char *end;
	unsigned long long n, every = 0, arg = 0;
	bool has_arg = false;
	size_t k;

	for (k = 0; at && k < ST_ARRAY_LEN(kinds); k++)
		if (strlen(kinds[k].name) == (size_t)(at - spec) &&
		    strncmp(spec, kinds[k].name, (size_t)(at - spec)) == 0)
			break;
	if (!at || k == ST_ARRAY_LEN(kinds) || at[1] < '0' || at[1] > '9')
		goto bad;
	errno = 0;
	n = strtoull(at + 1, &end, 10);
	if (*end == '+') {
		if (end[1] < '0' || end[1] > '9' || kinds[k].corrupt)
			goto bad;
		every = strtoull(end + 1, &end, 10);
	}
	if (*end == ':') {
		if (end[1] < '0' || end[1] > '9' || kinds[k].fault == ST_FAULT_EIO ||
		    kinds[k].fault == ST_FAULT_SHORT || kinds[k].fault == ST_FAULT_ENOSPC ||
		    kinds[k].corrupt == ST_CORRUPT_STALE)
			goto bad;
		arg = strtoull(end + 1, &end, 10);
		has_arg = true;
	}
	if (*end || errno || n == 0 || n > (1ull << 40) || every > (1ull << 40) ||
	    arg > (1ull << 50))
		goto bad;
	if (kinds[k].fault) {
		if (f->kind != ST_FAULT_NONE)
			st_cli_die(2, "--test-fault %s: one fault (eio, short, enospc, delay) "
				   "at a time", spec);
		f->kind = (enum st_fault_kind)kinds[k].fault;
		f->nth = n;
		f->every = every;
		if (f->kind == ST_FAULT_DELAY)
			f->delay_ns = (has_arg ? arg : 100) * 1000000ull;
		return;
	}
	if (f->corrupt.kind != ST_CORRUPT_NONE)
		st_cli_die(2, "--test-fault %s: one corruption (bit, zero-byte, page-ff, stale, "
			   "other-page) at a time", spec);
	if (kinds[k].corrupt == ST_CORRUPT_OTHER_PAGE && !has_arg)
		goto bad;
	f->corrupt = (struct st_fault_corrupt){ .kind = (enum st_corrupt_kind)kinds[k].corrupt,
						.nth_write = n };
	if (kinds[k].corrupt == ST_CORRUPT_OTHER_PAGE)
		f->corrupt.src_off_bytes = arg;
	else
		f->corrupt.at_bytes = arg;
	return;
bad:
	st_cli_die(2, "--test-fault %s: expected KIND@N[+M][:ARG], KIND one of eio, short, "
		   "enospc, delay, bit, zero-byte, page-ff, stale, other-page "
		   "(see strata train --help)", spec);
}

/* A flag as it was given (train_resume_line() repeats some). */
struct typed_flag {
	int c;           /* getopt value */
	const char *arg; /* its argument, or NULL */
};

/* Everything train's flags set: the run's configuration, and what the
 * command itself does with them. */
struct train_args {
	struct st_run_config run;
	const char *nvme;       /* --nvme DIR[,DIR..] or "none" */
	const char *rates_file; /* --rates */
	const char *val_name;   /* --val-data */
	int threads;
	bool accum_auto, keep_given, data_given;
	bool given[1100];       /* the flags given, by getopt value */
	struct typed_flag typed[128]; /* the flags as given, in order */
	int ntyped;
	int ckpt_accum;         /* --resume without --grad-accum: the saved
				 * step's micro-batches over every rank */
	struct st_cli_budgets bud;    /* --device, --gpu-mem, --host-mem */
};

static const char default_model[] = "tiny";

/* Set by the signal handlers; the run reads it (st_run_config.stop). */
static volatile sig_atomic_t stop_requested;

/* The first SIGINT or SIGTERM asks for a stop; either one after it has the
 * default action (sigaction is async-signal-safe). */
static void on_signal(int sig)
{
	struct sigaction dfl = { .sa_handler = SIG_DFL };

	(void)sig;
	sigaction(SIGINT, &dfl, NULL);
	sigaction(SIGTERM, &dfl, NULL);
	stop_requested = 1;
}

/* A rank under mpirun. A Ctrl-C (or SIGTERM) to mpirun starts its kill
 * sequence: SIGCONT to every rank at once, SIGTERM odls_base_sigkill_timeout
 * seconds later, SIGKILL as long again after. So the SIGCONT asks for the
 * stop (every rank then ends the step, agrees, saves and exits), and the
 * SIGTERM that follows is part of the same request, not a second one.
 * SIGUSR1, which mpirun forwards to every rank without killing any, asks
 * for the same stop with no deadline. */
static atomic_int stop_signal; /* the first signal of a rank's stop */

static void on_signal_rank(int sig)
{
	int none = 0;

	atomic_compare_exchange_strong(&stop_signal, &none, sig);
	stop_requested = 1;
	/* During its kill sequence mpirun sleeps and no longer reads the
	 * ranks' output: once the pipe is full a progress line would block
	 * the save until the SIGKILL. Output that does not fit is dropped. */
	if (sig != SIGUSR1)
		for (int fd = 1; fd <= 2; fd++) {
			int fl = fcntl(fd, F_GETFL);

			if (fl >= 0)
				fcntl(fd, F_SETFL, fl | O_NONBLOCK);
		}
}

/* st_run_config.armed: from here a Ctrl-C or SIGTERM only asks for a stop:
 * in start-up, the run ends before its first step; after, at the end of a
 * step. */
static void arm_signals(void *arg)
{
	const struct train_args *a = arg;
	struct sigaction sa = { .sa_handler = on_signal };

	if (a->run.engine.world > 1) {
		struct st_comm_launch l;

		st_comm_launch(&l);
		if (l.launcher && strcmp(l.launcher, "mpirun") == 0) {
			sa.sa_handler = on_signal_rank;
			sigaction(SIGCONT, &sa, NULL);
		}
		sigaction(SIGUSR1, &sa, NULL);
	}
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}

/* st_run_config.started: the tokenizer beside --init goes with the
 * checkpoints, into --save DIR, where generate, eval and export find it
 * (one above step-N). */
static void copy_tokenizer(void *arg, const char *init)
{
	const struct train_args *a = arg;
	char tdir[4096];

	if (init && a->run.save && st_cli_tokenizer_dir(init, tdir, sizeof(tdir)) &&
	    st_cli_tokenizer_copy(tdir, a->run.save) > 0)
		printf("the tokenizer of %s: copied into %s\n", init, a->run.save);
	/* its special tokens' ids, for the export's config.json */
	if (init && a->run.save && a->run.engine.rank == 0)
		st_cli_generation_config(init, a->run.save);
}

/* Whether checkpoint dir ck is one of the --save directory whose
 * resolved checkpoint is sck (the same parent, or the same directory). */
static bool same_dir_of(const char *ck, const char *sck)
{
	char *a = strdup(ck), *b = strdup(sck);
	bool same;

	if (!a || !b)
		st_cli_die(1, "out of memory");
	same = st_cli_same_file(ck, sck) || st_cli_same_file(dirname(a), dirname(b));
	free(a);
	free(b);
	return same;
}

/* Under mpirun a Ctrl-C reaches mpirun, which sends every rank SIGCONT
 * (a stop, agreed at the step's end, then the save), SIGTERM and, 2 x
 * odls_base_sigkill_timeout seconds after the first (2 by default),
 * SIGKILL: a save that takes longer is lost, the last checkpoint staying
 * whole. Rank 0 says so once when that timeout is short (docs/zero.md,
 * Faults). */
static void zero_sigkill_note(const struct st_engine_config *ec, const char *save)
{
	struct st_comm_launch l;
	const char *v = getenv("OMPI_MCA_odls_base_sigkill_timeout");

	st_comm_launch(&l);
	if (ec->world == 1 || ec->rank != 0 || !save || !l.launcher ||
	    strcmp(l.launcher, "mpirun") != 0 || (v && atoi(v) >= 10))
		return;
	fprintf(stderr, "strata: note: a Ctrl-C to mpirun kills the ranks %d s after it asks "
		"them to stop (2 x odls_base_sigkill_timeout), so a stop's save may be cut short "
		"(the last checkpoint stays whole): for more time, give mpirun --mca "
		"odls_base_sigkill_timeout 30, or stop with kill -USR1 <mpirun's pid> (no "
		"deadline)\n", 2 * (v ? atoi(v) : 1));
}


/* A saved config's value of key, or NULL. */
static struct json_object *saved(struct json_object *o, const char *key)
{
	struct json_object *v = NULL;

	return json_object_object_get_ex(o, key, &v) ? v : NULL;
}

/* The saved config's values for the flags not given (numbers: the run
 * compares them at resume, so they are what it saved). */
static void train_saved_flags(struct train_args *a, struct json_object *o)
{
	struct st_run_config *rc = &a->run;
	struct st_train_config *cfg = &rc->engine.train;
	static char data[4096];
	struct json_object *v;

	if (!a->given['d'] && (v = saved(o, "data"))) {
		snprintf(data, sizeof(data), "%s", json_object_get_string(v));
		rc->data_name = data;
	}
	if (!a->given['B'] && (v = saved(o, "batch")))
		cfg->batch = json_object_get_int(v);
	if (!a->given['T'] && (v = saved(o, "seq")))
		cfg->seq = json_object_get_int(v);
	if (!a->given['a'] && (v = saved(o, "grad_accum")))
		a->ckpt_accum = json_object_get_int(v);
	if (!a->given['s'] && (v = saved(o, "steps")))
		cfg->steps = json_object_get_int(v);
	if (!a->given['l'] && (v = saved(o, "lr")))
		cfg->lr = json_object_get_double(v);
	if (!a->given['S'] && (v = saved(o, "schedule")))
		cfg->schedule = strcmp(json_object_get_string(v), "constant") == 0 ?
				ST_LR_CONSTANT : ST_LR_COSINE;
	if (!a->given['w'] && (v = saved(o, "warmup")))
		cfg->warmup = json_object_get_int(v);
	if (!a->given['W'] && (v = saved(o, "wd")))
		cfg->wd = json_object_get_double(v);
	if (!a->given['1'] && (v = saved(o, "beta1")))
		cfg->beta1 = json_object_get_double(v);
	if (!a->given['2'] && (v = saved(o, "beta2")))
		cfg->beta2 = json_object_get_double(v);
	if (!a->given['e'] && (v = saved(o, "eps")))
		cfg->eps = json_object_get_double(v);
	if (!a->given['c'] && (v = saved(o, "clip")))
		cfg->clip = json_object_get_double(v);
	if (!a->given['r'] && (v = saved(o, "seed")))
		cfg->seed = (uint64_t)json_object_get_int64(v);
	if (!a->given['p'] && (v = saved(o, "precision")))
		cfg->bf16 = strcmp(json_object_get_string(v), "bf16") == 0;
	if (!a->given['u'] && (v = saved(o, "shuffle")))
		rc->shuffle = json_object_get_boolean(v);
	if (!a->given[1040] && (v = saved(o, "samples")) &&
	    strcmp(json_object_get_string(v), "documents") == 0) /* absent: windows */
		rc->samples = ST_SAMPLES_DOCUMENTS;
	if (!a->given[1041] && (v = saved(o, "packing")) &&
	    strcmp(json_object_get_string(v), "isolated") == 0) /* absent: packed */
		cfg->isolate = true;
	if (!a->given[1003] && (v = saved(o, "compute_dtype")))
		st_precision_parse(json_object_get_string(v), &rc->engine.compute_dtype);
	/* a run extended past its total keeps the schedule it had */
	if ((v = saved(o, "schedule_steps")) || (v = saved(o, "steps")))
		cfg->schedule_steps = json_object_get_int(v) == cfg->steps ? 0 :
				      json_object_get_int(v);
}

/* The --save DIR of checkpoint dir, which --resume path resolved to: path
 * when dir was found in it (its latest, say); else, for a step-N (or a
 * link to one, as DIR/best), its parent; else path. */
static void train_save_of(const char *path, const char *dir, char *out, size_t n)
{
	char *copy = strdup(dir), real[PATH_MAX];
	bool is_step;

	if (!copy)
		st_cli_die(1, "out of memory");
	is_step = strncmp(basename(copy), "step-", 5) == 0 ||
		  (realpath(dir, real) && strncmp(basename(real), "step-", 5) == 0);
	free(copy);
	copy = strdup(dir);
	if (!copy)
		st_cli_die(1, "out of memory");
	if (is_step && strcmp(path, dir) == 0)
		snprintf(out, n, "%s", dirname(copy));
	else
		snprintf(out, n, "%s", path);
	free(copy);
}

/* --resume DIR (or auto, with a checkpoint in --save): the run as it was
 * saved, for every flag not given: the model (the checkpoint's
 * config.json), the data, the batch, the optimizer and the schedule, and
 * --save (where its tokenizer is). Then --steps M past the saved total
 * extends the run. A --save DIR that holds another run's checkpoints is
 * refused unless --resume names that run. */
static void train_from_ckpt(struct train_args *a)
{
	struct st_run_config *rc = &a->run;
	static char model_text[512], save[4096];
	struct st_ckpt_trainer tr;
	struct json_object *o;
	const char *from = rc->resume;
	char *dir = NULL, p[4200];
	bool is_auto = from && strcmp(from, "auto") == 0;

	if (rc->save && (!from || is_auto || st_ckpt_resolve(from, &dir) == 0)) {
		char *sdir = NULL;

		if (st_ckpt_resolve(rc->save, &sdir) == 0 && !is_auto &&
		    !(dir && same_dir_of(dir, sdir)))
			st_cli_die(2, "--save %s holds another run's checkpoints (%s): resume "
				   "it with --resume %s, or save elsewhere", rc->save, sdir,
				   rc->save);
		free(sdir);
		free(dir);
		dir = NULL;
	}
	if (!from)
		return;
	if (is_auto)
		from = rc->save;
	if (!from || st_ckpt_resolve(from, &dir) < 0)
		return; /* the run says why (or starts afresh: auto) */
	snprintf(p, sizeof(p), "%s/%s", dir, ST_CKPT_TRAINER_FILE);
	if (st_ckpt_trainer_read(p, &tr) < 0) {
		free(dir);
		return; /* the run's resume refuses it, naming what */
	}
	o = json_tokener_parse(tr.config_json ? tr.config_json : "{}");
	st_ckpt_trainer_fini(&tr);
	if (o && !a->given['m'] && !rc->init) {
		struct st_model_config gc;
		struct json_object *v = saved(o, "model");

		snprintf(p, sizeof(p), "%s/%s", dir, ST_CKPT_CONFIG_FILE);
		if (v && st_model_config_read(p, &gc) == 0) {
			rc->engine.train.model = gc;
			snprintf(model_text, sizeof(model_text), "%s", json_object_get_string(v));
			rc->model_text = model_text;
		}
	}
	if (o)
		train_saved_flags(a, o);
	json_object_put(o);
	if (!rc->save && !is_auto) {
		train_save_of(rc->resume, dir, save, sizeof(save));
		rc->save = save;
	}
	free(dir);
}

/* --grad-accum auto: the plan this run will make, at N = 1, says which N
 * hides the I/O (strata plan's hide_best_accum); one line says what. */
static void train_accum_auto(struct st_engine_config *ec)
{
	struct st_train_config *cfg = &ec->train;
	struct st_model *m;
	struct st_plan plan;
	struct st_plan_input pin = {
		.batch = cfg->batch, .seq = cfg->seq, .grad_accum = 1, .bf16 = cfg->bf16,
		.gpu_mem_bytes = ec->gpu_mem_bytes, .host_mem_bytes = ec->host_mem_bytes,
		.nvme_mem_bytes = ec->nvme_mem_bytes, .have_nvme = ec->nvme_dirs != NULL,
		.params = ec->params, .optim = ec->optim, .prefetch = ec->prefetch,
		.rates = ec->rates, .world = ec->world, .rank = ec->rank, .zero = ec->zero,
		.host_compute = st_device_on_host(ec->device),
		.activations = ec->activations, .recompute = ec->recompute,
		/* the hiding N of the schedule asked (auto: batch-first's) */
		.schedule = ec->schedule,
		.optim_state = ec->optim_state,
		/* as the engine's own plan (engine.c) */
		.optim_vram_auto = ec->device && strcmp(ec->device, "cuda") == 0 &&
				   ec->optim_state == ST_OPTIM_STATE_F32,
	};
	int ret;

	if (st_model_create(&cfg->model, &m) < 0)
		st_cli_die(2, "--model: %s", st_error_last());
	if (st_model_set_precision(m, ec->compute_dtype) < 0)
		st_cli_die(2, "%s", st_error_last());
	pin.model = m;
	if (!pin.host_compute) {
		if (pin.rates.compute_flops <= 0)
			pin.rates.compute_flops = ST_PLAN_CUDA_COMPUTE_FLOPS;
		if (pin.rates.copy_bps <= 0)
			pin.rates.copy_bps = ST_PLAN_CUDA_COPY_BPS;
	}
	ret = st_plan_make(&pin, &plan);
	if (ret < 0)
		st_cli_die(ret == -ENOSPC || ret == -EINVAL ? 2 : 1, "%s", st_error_last());
	cfg->grad_accum = plan.hide_best_accum > 0 ? plan.hide_best_accum : 1;
	printf("--grad-accum auto: %d (%s; predicted step %.3f s)\n", cfg->grad_accum,
	       plan.hide_accum ? "the smallest at which compute bounds the step"
			       : "never compute-bound up to 64; the smallest within 10% of the best tokens/s",
	       plan.hide_best_step_s);
	st_plan_fini(&plan);
	st_model_destroy(m);
}

static const struct option train_longs[] = {
	{ "model", 1, 0, 'm' }, { "data", 1, 0, 'd' }, { "batch", 1, 0, 'B' },
	{ "seq", 1, 0, 'T' }, { "steps", 1, 0, 's' }, { "grad-accum", 1, 0, 'a' },
	{ "lr", 1, 0, 'l' }, { "lr-schedule", 1, 0, 'S' }, { "warmup", 1, 0, 'w' },
	{ "wd", 1, 0, 'W' }, { "beta1", 1, 0, '1' }, { "beta2", 1, 0, '2' },
	{ "eps", 1, 0, 'e' }, { "clip", 1, 0, 'c' }, { "seed", 1, 0, 'r' },
	{ "precision", 1, 0, 'p' }, { "shuffle", 1, 0, 'u' }, { "threads", 1, 0, 'j' },
	{ "save", 1, 0, 'o' }, { "metrics", 1, 0, 'M' }, { "init", 1, 0, 'i' },
	{ "log-every", 1, 0, 'L' }, { "gpu-mem", 1, 0, 'G' }, { "host-mem", 1, 0, 'H' },
	{ "nvme", 1, 0, 'N' }, { "nvme-mem", 1, 0, 'Z' }, { "offload-params", 1, 0, 'P' },
	{ "offload-optim", 1, 0, 'O' }, { "prefetch", 1, 0, 'F' },
	{ "aio-block", 1, 0, 'K' }, { "aio-depth", 1, 0, 'Q' }, { "trace", 1, 0, 'X' },
	{ "save-every", 1, 0, 'E' }, { "keep", 1, 0, 'k' }, { "resume", 1, 0, 'R' },
	{ "shard-size", 1, 0, 1000 }, { "samples", 1, 0, 1040 },
	{ "packing", 1, 0, 1041 },
	{ "device", 1, 0, 'D' }, { "verify-reads", 1, 0, 'V' },
	{ "test-fault", 1, 0, 'y' }, { "max-skipped", 1, 0, 'x' },
	{ "zero", 1, 0, 'z' }, { "recompute", 1, 0, 1001 },
	{ "schedule", 1, 0, 1004 }, { "update", 1, 0, 1014 },
	{ "compute-dtype", 1, 0, 1003 },
	{ "offload-activations", 1, 0, 1002 },
	{ "rates", 1, 0, 1011 }, { "rates-refresh", 1, 0, 1012 },
	{ "optim-state", 1, 0, 1013 },
	{ "val-data", 1, 0, 1020 }, { "eval-every", 1, 0, 1021 },
	{ "val-batches", 1, 0, 1022 }, { "keep-best", 0, 0, 1023 },
	{ "help", 0, 0, 'h' },
	{ 0 },
};

/* How the run runs, which a checkpoint does not keep (where and with
 * which budgets, what it validates, logs and keeps): the flags that the
 * stop line repeats after --resume DIR. What changes the numbers is in
 * trainer.json and comes back with --resume alone (train_saved_flags). */
static const int resume_repeats[] = {
	'D', 'G', 'H', 'N', 'Z', 'P', 'O', 'F', 'K', 'Q', 'j', 'V', 'x', 'z', 'k', 'E', 'L',
	'M', 1001, 1002, 1004, 1011, 1013, 1014, 1020, 1021, 1022, 1023,
};

/* s as one shell word: as it is when it holds only safe characters, else
 * in single quotes (a ' as '\''); appended to out (n bytes). */
static void shell_word(const char *s, char *out, size_t n)
{
	size_t l = strlen(out);
	bool plain = *s != '\0';

	for (const char *p = s; *p; p++)
		if (!isalnum((unsigned char)*p) && !strchr("_./,:=+-@%", *p))
			plain = false;
	if (plain) {
		snprintf(out + l, n - l, "%s", s);
		return;
	}
	if (l + 1 < n)
		out[l++] = '\'';
	for (const char *p = s; *p && l + 5 < n; p++) {
		if (*p == '\'') {
			memcpy(out + l, "'\\''", 4);
			l += 4;
		} else {
			out[l++] = *p;
		}
	}
	if (l + 1 < n)
		out[l++] = '\'';
	out[l] = '\0';
}

/* The command the stop line gives: strata train --resume DIR, then the
 * flags of resume_repeats given to this run, in their order. */
static void train_resume_line(const struct train_args *a, const char *save, char *out,
			      size_t n)
{
	snprintf(out, n, "strata train --resume ");
	shell_word(save, out, n);
	for (int i = 0; i < a->ntyped; i++) {
		const struct option *o = train_longs;
		bool repeat = false;

		for (size_t k = 0; k < ST_ARRAY_LEN(resume_repeats); k++)
			repeat |= resume_repeats[k] == a->typed[i].c;
		while (repeat && o->name && o->val != a->typed[i].c)
			o++;
		if (!repeat || !o->name)
			continue;
		snprintf(out + strlen(out), n - strlen(out), " --%s", o->name);
		if (a->typed[i].arg) {
			snprintf(out + strlen(out), n - strlen(out), " ");
			shell_word(a->typed[i].arg, out, n);
		}
	}
}

/* The tokens of ds (given as `flag name`) are the model's: a shard made
 * by another tokenizer than the one of --init or the resumed run (its
 * hash), or a text's bytes where that model has a tokenizer (a fine-tune,
 * or a validation, on noise), exit 2 with the command to run. */
static void train_check_tokens(const struct train_args *a, struct st_dataset *ds,
			       const char *flag, const char *name)
{
	const struct st_run_config *rc = &a->run;
	const char *from = rc->init ? rc->init
			   : !rc->resume ? NULL
			   : strcmp(rc->resume, "auto") ? rc->resume : rc->save;
	char tdir[4096];

	if (!from || !st_cli_tokenizer_dir(from, tdir, sizeof(tdir)))
		return;
	st_cli_check_shard_tokenizer(ds, flag, name, tdir);
	if (rc->engine.train.model.vocab != 256 && st_dataset_format(ds) == ST_DATASET_BYTES) {
		if (rc->data != ds) /* nothing left for LeakSanitizer */
			st_dataset_close(rc->data);
		st_dataset_close(ds);
		st_cli_die(2, "%s %s is text, and %s %s has a tokenizer: give its ids (strata "
			   "tokenize --tokenizer %s --out FILE.bin %s)", flag, name,
			   rc->init ? "--init" : "the run of --resume", from, tdir, name);
	}
}

/* The flags into *a; true for --help (printed). Bad input exits 2. */
static bool train_parse(int argc, char **argv, struct train_args *a)
{
	struct st_run_config *rc = &a->run;
	struct st_engine_config *ec = &rc->engine;
	struct st_train_config *cfg = &ec->train;
	const char *data_seen = NULL;
	int c;

	*a = (struct train_args){
		.run = { .engine = { .device = st_cli_device_default(),
				     .recompute = ST_RECOMPUTE_AUTO },
			 .data_name = ST_DEFAULT_DATA, .model_text = default_model, .shuffle = true,
			 .log_every = 1, .keep = 3, .max_skipped = 10 },
		.nvme = DEFAULT_NVME,
	};
	st_train_config_default(cfg);
	ec->gpu_mem_bytes = st_cli_size("--gpu-mem", DEFAULT_GPU_MEM);
	ec->host_mem_bytes = st_cli_size("--host-mem", DEFAULT_HOST_MEM);
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", train_longs, NULL)) != -1) {
		if (c > 0 && c < (int)ST_ARRAY_LEN(a->given))
			a->given[c] = true;
		if (c > 0 && a->ntyped < (int)ST_ARRAY_LEN(a->typed))
			a->typed[a->ntyped++] = (struct typed_flag){ c, optarg };
		switch (c) {
		case 'm':
			if (st_model_config_parse(optarg, &cfg->model) < 0)
				st_cli_die(2, "--model %s: %s", optarg, st_error_last());
			rc->model_text = optarg;
			break;
		case 'd': /* one --data, a list in it: not a silent replacement */
			if (data_seen)
				st_cli_die(2, "--data given twice (%s, then %s): name several "
					   "files in one --data FILE,FILE or a pattern", data_seen,
					   optarg);
			rc->data_name = data_seen = optarg;
			a->data_given = true;
			break;
		case 'B': cfg->batch = (int)st_cli_long("--batch", optarg, 1, 1 << 16); break;
		case 'T': cfg->seq = (int)st_cli_long("--seq", optarg, 1, 1 << 20); break;
		case 's': cfg->steps = (int)st_cli_long("--steps", optarg, 0, 1 << 30); break;
		case 'a':
			a->accum_auto = strcmp(optarg, "auto") == 0;
			cfg->grad_accum = a->accum_auto ? 1 :
					  (int)st_cli_long("--grad-accum", optarg, 1, 1 << 16);
			break;
		case 'l': cfg->lr = st_cli_double("--lr", optarg, 0, 10); break;
		case 'S':
			if (strcmp(optarg, "cosine") == 0)
				cfg->schedule = ST_LR_COSINE;
			else if (strcmp(optarg, "constant") == 0)
				cfg->schedule = ST_LR_CONSTANT;
			else
				st_cli_die(2, "--lr-schedule %s: expected cosine or constant", optarg);
			break;
		case 'w': cfg->warmup = (int)st_cli_long("--warmup", optarg, 0, 1 << 30); break;
		case 'W': cfg->wd = st_cli_double("--wd", optarg, 0, 10); break;
		case '1': cfg->beta1 = st_cli_double("--beta1", optarg, 0, 0.999999); break;
		case '2': cfg->beta2 = st_cli_double("--beta2", optarg, 0, 0.999999); break;
		case 'e': cfg->eps = st_cli_double("--eps", optarg, 0, 1); break;
		case 'c': cfg->clip = st_cli_double("--clip", optarg, 0, 1e9); break;
		case 'r': cfg->seed = (uint64_t)st_cli_long("--seed", optarg, 0, 0x7fffffffffffffffL); break;
		case 'p':
			if (strcmp(optarg, "bf16") == 0)
				cfg->bf16 = true;
			else if (strcmp(optarg, "fp32") == 0)
				cfg->bf16 = false;
			else
				st_cli_die(2, "--precision %s: expected bf16 or fp32", optarg);
			break;
		case 'V':
			if (strcmp(optarg, "on") == 0)
				ec->no_verify_reads = false;
			else if (strcmp(optarg, "off") == 0)
				ec->no_verify_reads = true;
			else
				st_cli_die(2, "--verify-reads %s: expected on or off", optarg);
			break;
		case 'u':
			if (strcmp(optarg, "on") == 0)
				rc->shuffle = true;
			else if (strcmp(optarg, "off") == 0)
				rc->shuffle = false;
			else
				st_cli_die(2, "--shuffle %s: expected on or off", optarg);
			break;
		case 1040:
			if (strcmp(optarg, "documents") == 0)
				rc->samples = ST_SAMPLES_DOCUMENTS;
			else if (strcmp(optarg, "windows") == 0)
				rc->samples = ST_SAMPLES_WINDOWS;
			else
				st_cli_die(2, "--samples %s: expected documents or windows", optarg);
			break;
		case 1041:
			if (strcmp(optarg, "isolated") == 0)
				cfg->isolate = true;
			else if (strcmp(optarg, "packed") == 0)
				cfg->isolate = false;
			else
				st_cli_die(2, "--packing %s: expected packed or isolated", optarg);
			break;
		case 'j': a->threads = (int)st_cli_long("--threads", optarg, 1, 4096); break;
		case 'o': rc->save = optarg; break;
		case 'M': rc->metrics = optarg; break;
		case 'i': rc->init = optarg; break;
		case 'L': rc->log_every = (int)st_cli_long("--log-every", optarg, 1, 1 << 30); break;
		case 'G':
			st_cli_budget_arg(&a->bud, true, optarg, &ec->gpu_mem_bytes);
			break;
		case 'H':
			st_cli_budget_arg(&a->bud, false, optarg, &ec->host_mem_bytes);
			break;
		case 'N': a->nvme = optarg; break;
		case 'Z': ec->nvme_mem_bytes = st_cli_size("--nvme-mem", optarg); break;
		case 'P': ec->params = st_cli_offload("--offload-params", optarg, true); break;
		case 'O': ec->optim = st_cli_offload("--offload-optim", optarg, false); break;
		case 1002: ec->activations = st_cli_offload_act(optarg); break;
		case 'F': ec->prefetch = (int)st_cli_long("--prefetch", optarg, 0, 1 << 16); break;
		case 'K': {
			uint64_t b = st_cli_size("--aio-block", optarg);

			if (!st_is_pow2(b) || b < 4096 || b > (1u << 30))
				st_cli_die(2, "--aio-block %s: a power of two from 4K to 1G", optarg);
			ec->aio_block_bytes = b;
			break;
		}
		case 'Q': ec->aio_depth = (unsigned)st_cli_long("--aio-depth", optarg, 1, 4096); break;
		case 'X': rc->trace = optarg; break;
		case 'E': rc->save_every = (int)st_cli_long("--save-every", optarg, 1, 1 << 30); break;
		case 'k':
			rc->keep = (int)st_cli_long("--keep", optarg, 0, 1 << 20);
			a->keep_given = true;
			break;
		case 1000:
			ec->ckpt_shard_bytes = st_cli_size("--shard-size", optarg);
			break;
		case 1001: ec->recompute = st_cli_recompute(optarg); break;
		case 1004: ec->schedule = st_cli_schedule(optarg); break;
		case 1014:
			ec->update = st_cli_update_order(optarg);
			break;
		case 1003:
			if (st_precision_parse(optarg, &ec->compute_dtype) < 0)
				st_cli_die(2, "--compute-dtype %s: expected fp32 or bf16", optarg);
			break;
		case 'R': rc->resume = optarg; break;
		case 'x': rc->max_skipped = (int)st_cli_long("--max-skipped", optarg, 0, 1 << 30); break;
		case 'D':
			if (strcmp(optarg, "auto") != 0 && !st_device_find(optarg))
				st_cli_die(2, "--device %s: not a device built into this binary "
					   "(auto, %s)", optarg, st_device_list());
			ec->device = optarg;
			break;
		case 'y': parse_test_fault(optarg, &ec->nvme_fault); break;
		case 'z': ec->zero = (int)st_cli_long("--zero", optarg, 0, 3); break;
		case 1011: a->rates_file = optarg; break;
		case 1012: rc->rates_refresh = optarg; break;
		case 1013:
			if (st_optim_state_parse(optarg, &ec->optim_state) < 0)
				st_cli_die(2, "--optim-state %s: expected fp32, bf16 or q8", optarg);
			break;
		case 1020: a->val_name = optarg; break;
		case 1021: rc->eval_every = (int)st_cli_long("--eval-every", optarg, 1, 1 << 30); break;
		case 1022: rc->val_batches = (int)st_cli_long("--val-batches", optarg, 1, 1 << 20); break;
		case 1023: rc->keep_best = true; break;
		case 'h': train_usage(stdout); return true;
		default:
			st_cli_bad_option("train", train_longs, argv[optind - 1]);
		}
	}
	if (optind < argc)
		st_cli_die(2, "train: unexpected argument %s", argv[optind]);
	return false;
}

/* The model, the tiers and the rates the flags give, checked before the
 * plan; the world this rank is in. */
static void train_check_model(struct train_args *a)
{
	struct st_run_config *rc = &a->run;
	struct st_engine_config *ec = &rc->engine;
	struct st_train_config *cfg = &ec->train;
	int ret;

	if (cfg->isolate && rc->samples != ST_SAMPLES_DOCUMENTS)
		st_cli_die(2, "--packing isolated needs --samples documents (a window of text "
			   "is one document)");
	st_cli_budgets_resolve(&a->bud, &ec->device, &ec->gpu_mem_bytes, &ec->host_mem_bytes);
	if (st_run_world(ec) < 0)
		st_cli_die(2, "%s", st_error_last());
	if (ec->world > 1 && ec->optim_state != ST_OPTIM_STATE_F32) {
		/* before any rank joins the others: rank 0 says why, all exit 2 */
		if (ec->rank > 0)
			exit(2);
		st_cli_die(2, "--optim-state %s: not with ZeRO at world > 1 (docs/optim.md); use fp32",
			   st_optim_state_name(ec->optim_state));
	}
	if (ec->world == 1 && ec->zero == 3)
		fprintf(stderr, "strata: --zero 3 with one rank shards nothing: it trains as "
			"--zero 0\n");
	zero_sigkill_note(ec, rc->save);
	if (strcmp(a->nvme, "none") != 0) {
		st_cli_check_dirs("--nvme", a->nvme, true);
		ec->nvme_dirs = a->nvme;
	}
	if ((ec->nvme_fault.kind != ST_FAULT_NONE ||
	     ec->nvme_fault.corrupt.kind != ST_CORRUPT_NONE) && !ec->nvme_dirs)
		st_cli_die(2, "--test-fault needs an nvme tier (--nvme DIR)");
	static char init_model[512];
	if (rc->init) {
		/* what cannot be read is said now, before the plan, not as a
		 * misfit of the default model with the data later */
		struct st_weights *w;
		struct st_model_config gc;

		ret = st_weights_open(rc->init, &w);
		if (ret < 0)
			st_cli_die(st_cli_input_exit(ret), "--init %s: %s", rc->init,
				   st_cli_unprefix(st_error_last(), rc->init));
		/* no --model: the model --init's config.json says; without one
		 * (a bare model.safetensors) the shape is not known: said now,
		 * not as the tiny model's misfit later */
		if (rc->model_text == default_model && st_weights_config(w, &gc) < 0) {
			st_weights_close(w);
			st_cli_die(2, "--init %s: no config.json beside the weights, so the model's "
				   "shape is not known: put the model's config.json there, or name "
				   "the model with --model", rc->init);
		}
		if (rc->model_text == default_model) {
			char dims[480];

			cfg->model = gc;
			snprintf(init_model, sizeof(init_model), "%s:%s",
				 st_model_config_family(&gc)->name,
				 st_model_config_format(&gc, dims, sizeof(dims)));
			rc->model_text = init_model;
		}
		st_weights_close(w);
	}
	if (cfg->seq > cfg->model.ctx)
		st_cli_die(2, "--seq %d is longer than the model's context of %d", cfg->seq,
			   cfg->model.ctx);
	if (a->rates_file) {
		ret = st_plan_rates_read(a->rates_file, &ec->rates);
		if (ret < 0)
			st_cli_die(st_cli_input_exit(ret), "--rates %s", st_error_last());
	}
	if (rc->rates_refresh && cfg->steps < 2)
		st_cli_die(2, "--rates-refresh needs --steps 2 or more (it measures steps 2 to 4)");
	if (a->accum_auto)
		train_accum_auto(ec);
}

/* The flags about the run's files, which go together or not at all. */
static void train_check_run(const struct train_args *a)
{
	const struct st_run_config *rc = &a->run;
	const struct st_engine_config *ec = &rc->engine;

	if (rc->save_every && !rc->save)
		st_cli_die(2, "--save-every needs --save DIR");
	if (ec->optim_state != ST_OPTIM_STATE_F32 && ec->optim == ST_OFFLOAD_VRAM)
		st_cli_die(2, "--optim-state %s: not with --offload-optim vram (the device's AdamW "
			   "takes fp32 M and V); use host or nvme",
			   st_optim_state_name(ec->optim_state));
	if (a->keep_given && !rc->save)
		st_cli_die(2, "--keep needs --save DIR (it prunes the checkpoints there)");
	if (rc->metrics && rc->trace) {
		/* rank 0 writes the metrics, and at world > 1 its trace is
		 * TRACE.rank-0: the names that would meet; every rank refuses */
		char t0[4200];

		snprintf(t0, sizeof(t0), ec->world > 1 ? "%s.rank-0" : "%s", rc->trace);
		if (st_cli_same_file(rc->metrics, t0))
			st_cli_die(2, "--metrics and --trace are both %s: give each a file of its "
				   "own", rc->metrics);
	}
	if (rc->save) {
		struct stat st;

		if (stat(rc->save, &st) == 0 && !S_ISDIR(st.st_mode))
			st_cli_die(2, "--save %s exists and is not a directory", rc->save);
	}
	if (rc->resume && strcmp(rc->resume, "auto") == 0 && !rc->save)
		st_cli_die(2, "--resume auto needs --save DIR (it resumes from there)");
	if (rc->init && rc->resume && strcmp(rc->resume, "auto") != 0)
		st_cli_die(2, "--init and --resume do not go together");
	if (!a->val_name && (rc->eval_every || rc->val_batches || rc->keep_best))
		st_cli_die(2, "%s needs --val-data FILE (the validation set)",
			   rc->eval_every ? "--eval-every" : rc->val_batches ? "--val-batches"
			   : "--keep-best");
	if (a->val_name && !rc->eval_every)
		st_cli_die(2, "--val-data needs --eval-every N (score it after every N steps)");
	if (rc->keep_best && !rc->save)
		st_cli_die(2, "--keep-best needs --save DIR (it keeps DIR/best)");
}

/* No --data: the demo's text, unless --init (or the run --resume takes)
 * brings a tokenizer (its model reads token ids, not the text's bytes); then, and when the demo's text
 * is not on the machine, the user is told to name the data, with no word
 * of a file they never typed. */
static void train_check_data(const struct train_args *a)
{
	const struct st_run_config *rc = &a->run;
	const char *from = rc->init;
	char tdir[4096];

	/* given, or the resumed run's own (train_saved_flags) */
	if (a->data_given || strcmp(rc->data_name, ST_DEFAULT_DATA) != 0)
		return;
	if (!from && rc->resume) /* the run's tokenizer is in its --save DIR */
		from = strcmp(rc->resume, "auto") == 0 ? rc->save : rc->resume;
	if (from && st_cli_tokenizer_dir(from, tdir, sizeof(tdir)))
		st_cli_die(2, "no --data: name the training data, token ids of the model's "
			   "tokenizer (strata tokenize --tokenizer %s --out FILE.bin TEXT; then "
			   "--data FILE.bin)", tdir);
	if (access(rc->data_name, R_OK) < 0)
		st_cli_die(2, "no --data: name the training data with --data FILE (the demo's "
			   "text %s is not here: %s)", rc->data_name, strerror(errno));
}

int st_cli_train(int argc, char **argv)
{
	struct train_args a;
	struct st_run_config *rc = &a.run;
	const struct st_engine_config *ec = &rc->engine;
	const struct st_train_config *cfg = &ec->train;
	struct st_run_result res;
	struct st_dataset *ds;
	int ret;

	if (train_parse(argc, argv, &a))
		return 0;
	train_from_ckpt(&a);
	train_check_model(&a);
	if (a.ckpt_accum > 0) { /* the saved micro-batches over this world */
		if (a.ckpt_accum % ec->world)
			st_cli_die(2, "--resume: the checkpoint's step is %d micro-batches, which "
				   "%d ranks cannot share: give --grad-accum", a.ckpt_accum,
				   ec->world);
		rc->engine.train.grad_accum = a.ckpt_accum / ec->world;
	}
	train_check_run(&a);
	set_threads_cli(a.threads);
	train_check_data(&a);
	ds = st_cli_open_data_list(rc->data_name, cfg->model.vocab);
	rc->data = ds;
	train_check_tokens(&a, ds, "--data", rc->data_name);
	if (a.val_name) {
		rc->val_data = st_cli_open_data(a.val_name, cfg->model.vocab);
		train_check_tokens(&a, rc->val_data, "--val-data", a.val_name);
	}
	/* rank 0 prints, saves and holds the lock; the others write only their
	 * slices and say nothing but their errors */
	if (ec->rank > 0 && !freopen("/dev/null", "w", stdout))
		st_cli_die(1, "/dev/null: %s", strerror(errno));
	st_cli_budgets_print(&a.bud, ec->device, ec->gpu_mem_bytes, ec->host_mem_bytes);
	rc->data = ds;
	rc->stop = &stop_requested;
	rc->out = stdout;
	rc->armed = arm_signals;
	rc->started = copy_tokenizer;
	rc->arg = &a;
	ret = st_run_train(rc, &res);
	if (ret < 0 && res.quiet) { /* rank 0 says why */
		fflush(stderr);
		exit(res.exit_code);
	}
	if (ret < 0)
		st_cli_die(res.exit_code, "%s", st_error_last());
	st_dataset_close(ds);
	if (rc->val_data)
		st_dataset_close(rc->val_data);
	if (!res.stopped)
		return 0;
	/* every rank agreed on the stop and saved: they all exit 130,
	 * finishing MPI, rather than ending the job */
	if (ec->world > 1)
		st_comm_exit_together();
	if (rc->save && ec->rank == 0) {
		char line[8192];

		train_resume_line(&a, rc->save, line, sizeof(line));
		fprintf(stderr, "strata: stopped after step %d, saved in %s (go on with: %s)\n",
			res.steps_done, rc->save, line);
	}
	else if (ec->rank == 0)
		fprintf(stderr, "strata: stopped after step %d (nothing saved: no --save)\n",
			res.steps_done);
	/* mpirun's kill sequence: it no longer answers MPI_Finalize, which
	 * would wait for its SIGKILL; the state is saved and every rank is
	 * past its last collective, so leave now */
	if (ec->world > 1 && atomic_load(&stop_signal) && atomic_load(&stop_signal) != SIGUSR1) {
		fflush(stdout);
		fflush(stderr);
		_exit(130);
	}
	return 130;
}

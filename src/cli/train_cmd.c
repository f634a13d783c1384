/* `strata train`: flags -> one engine config; the plan printed first; one
 * progress line per step with the tiers' use and the links' speed; metrics,
 * trace, checkpoints and resume. Bad input exits 2 before anything is
 * allocated or written; an I/O failure mid-run exits 1 naming file, offset
 * and errno, and the last checkpoint stays loadable. */
#include "cli.h"
#include "strata/weights.h"
#include "strata/ckpt.h"
#include "strata/comm.h"
#include "strata/device.h"
#include "strata/engine.h"
#include "strata/family.h"
#include "strata/io.h"
#include "strata/optim.h"
#include "strata/trace.h"

#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <json-c/json.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
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
"  --data FILE          raw text/bytes (vocab 256) or an llm.c .bin token shard\n"
"  --batch B --seq T    sequences per micro-batch, tokens per sequence (default 8, 128)\n"
"  --grad-accum N|auto  micro-batches per step (default 1); auto: what strata plan\n"
"                       --grad-accum auto takes (compute-bound, or near the best tok/s)\n"
"  --shuffle on|off     random windows, or llm.c's contiguous order (default on)\n"
"device and tiers\n"
"  --device cpu|cuda    where the model runs (default cpu; built here: %s)\n"
"  --gpu-mem SIZE       device budget (default %s; the device's arena)\n"
"  --host-mem SIZE      pinned host budget (default %s)\n"
"  --nvme DIR[,DIR..]   swap directories, striped (default %s; 'none' for no nvme tier)\n"
"  --nvme-mem SIZE      nvme budget (default: what the plan needs)\n"
"  --offload-params auto|none|host|nvme   home of W (default auto)\n"
"  --offload-optim auto|host|nvme|vram    home of G, P, M, V (default auto; vram:\n"
"                                         AdamW on the device, W in vram too)\n"
"  --offload-activations auto|vram|host   activation checkpoints' home (default\n"
"                       auto: vram when the budget holds them, else host)\n"
"  --prefetch N         units fetched ahead (0, the default: as many as the budget allows)\n"
"  --recompute auto|all|none  which blocks' backward recomputes their forward: all\n"
"                       (the least vram), none (every block keeps its forward in vram;\n"
"                       exit 2 when it does not fit), auto (default: as many as the vram\n"
"                       budget holds after everything else); the numbers are the same\n"
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
"                       (one run saves into a DIR at a time)\n"
"  --save-every N       also every N steps (default: only at the end, or when stopped)\n"
"  --keep K             keep the newest K checkpoints (default 3; 0 keeps all)\n"
"  --shard-size SIZE    a checkpoint file over SIZE is sharded as transformers shards\n"
"                       (model-0000K-of-0000N.safetensors + index; default 5e9 bytes)\n"
"  --resume DIR|auto    continue bit-identically from a checkpoint (or DIR/latest);\n"
"                       auto: from --save DIR when it has one, else from the start\n"
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
	        DEFAULT_HOST_MEM, DEFAULT_NVME);
}

static const char *gbps(double bytes, double ns, char *buf, size_t n)
{
	snprintf(buf, n, "%.2f", ns > 0 ? bytes / ns : 0.0);
	return buf;
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

/* Set by the signal handler, which may run on any thread: a lock-free
 * atomic, which C11 allows a handler to store to. */
static atomic_int stop_requested;

/* What a run that stops early must undo: before its first step, bad input
 * (exit 2) leaves nothing behind, so the trace's temporary file goes and a
 * --save DIR made by this run is removed, with the parents it made (all
 * still empty); a run that fails later keeps the trace it has so far. */
static struct {
	struct st_trace *trace;
	const char *save;
	char *made; /* the topmost directory of --save DIR that this run made */
	bool started;
} run;

/* rmdir path, then its parents up to top (each only if empty). */
static void remove_made(const char *path, const char *top)
{
	char *p = strdup(path), *slash;
	size_t n = p ? strlen(p) : 0;

	while (n > 1 && p[n - 1] == '/')
		p[--n] = '\0';
	while (p && rmdir(p) == 0 && strcmp(p, top) != 0 && (slash = strrchr(p, '/')) &&
	       slash != p)
		*slash = '\0';
	free(p);
}

static void undo_run(int code)
{
	(void)code;
	if (run.started) {
		st_trace_close(run.trace);
	} else {
		st_trace_abort(run.trace);
		if (run.made)
			remove_made(run.save, run.made);
	}
	run.trace = NULL;
}

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

/* The training configuration, saved in trainer.json and checked at resume:
 * everything that changes the numbers. */
static char *config_json(const struct st_train_config *c, enum st_precision compute,
			 const char *model_text,
			 const char *data, int shuffle, int world, int zero)
{
	json_object *o = json_object_new_object();
	char *s;

	json_object_object_add(o, "model", json_object_new_string(model_text));
	json_object_object_add(o, "data", json_object_new_string(data));
	json_object_object_add(o, "batch", json_object_new_int(c->batch));
	json_object_object_add(o, "seq", json_object_new_int(c->seq));
	/* the micro-batches of a step over every rank: what the numbers
	 * depend on, so a checkpoint resumes at another world size (N ranks
	 * at --grad-accum A are one rank at N * A) */
	json_object_object_add(o, "grad_accum", json_object_new_int(c->grad_accum * world));
	json_object_object_add(o, "steps", json_object_new_int(c->steps));
	json_object_object_add(o, "lr", json_object_new_double(c->lr));
	json_object_object_add(o, "schedule", json_object_new_string(
					     c->schedule == ST_LR_COSINE ? "cosine" : "constant"));
	json_object_object_add(o, "warmup", json_object_new_int(c->warmup));
	json_object_object_add(o, "wd", json_object_new_double(c->wd));
	json_object_object_add(o, "beta1", json_object_new_double(c->beta1));
	json_object_object_add(o, "beta2", json_object_new_double(c->beta2));
	json_object_object_add(o, "eps", json_object_new_double(c->eps));
	json_object_object_add(o, "clip", json_object_new_double(c->clip));
	json_object_object_add(o, "seed", json_object_new_int64((int64_t)c->seed));
	json_object_object_add(o, "precision", json_object_new_string(c->bf16 ? "bf16" : "fp32"));
	json_object_object_add(o, "shuffle", json_object_new_boolean(shuffle));
	/* how it computed: not compared at resume (a run may go on in
	 * another precision), and absent at fp32 as before it existed */
	if (compute != ST_PRECISION_FP32)
		json_object_object_add(o, "compute_dtype",
				       json_object_new_string(st_precision_name(compute)));
	if (world > 1) { /* where it ran: not compared at resume */
		json_object_object_add(o, "world", json_object_new_int(world));
		json_object_object_add(o, "zero", json_object_new_int(zero));
	}
	s = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
	json_object_put(o);
	return s;
}

/* What the user can go on from, for the lines of a run that stops: the
 * checkpoint `--resume SAVE` would take now. */
static const char *last_ckpt(const char *save, char *buf, size_t bytes)
{
	char *dir = NULL;

	if (!save)
		snprintf(buf, bytes, "nothing is saved (no --save)");
	else if (st_ckpt_resolve(save, &dir) == 0)
		snprintf(buf, bytes, "the last checkpoint is %s", dir);
	else
		snprintf(buf, bytes, "no checkpoint in %s", save);
	free(dir);
	return buf;
}

/* path with its directory made absolute and free of links (realpath), the
 * file's own name kept as given: "./m" and "$PWD/m" are one name. */
static void canonical(const char *path, char *out, size_t n)
{
	const char *slash = strrchr(path, '/');
	char dir[4096], real[PATH_MAX];

	snprintf(dir, sizeof(dir), "%.*s", !slash ? 1 : slash == path ? 1 : (int)(slash - path),
		 !slash ? "." : path);
	if (realpath(dir, real))
		snprintf(out, n, "%s/%s", real, slash ? slash + 1 : path);
	else
		snprintf(out, n, "%s", path);
}

/* Whether paths a and b name one file, existing or not: the same
 * canonical name, or, when both exist, the same inode. */
static bool same_file(const char *a, const char *b)
{
	char ca[PATH_MAX + 256], cb[PATH_MAX + 256];
	struct stat sa, sb;

	canonical(a, ca, sizeof(ca));
	canonical(b, cb, sizeof(cb));
	if (strcmp(ca, cb) == 0)
		return true;
	return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
	       sa.st_ino == sb.st_ino;
}

/* A number of a --metrics line: JSON has no NaN or Inf, so one that is
 * not finite is null and its key goes into the line's "nonfinite" list. */
static void metric(FILE *f, const char *key, const char *fmt, double v, char *nonfinite,
		   size_t bytes)
{
	fprintf(f, ",\"%s\":", key);
	if (isfinite(v)) {
		fprintf(f, fmt, v);
		return;
	}
	fputs("null", f);
	snprintf(nonfinite + strlen(nonfinite), bytes - strlen(nonfinite), "%s\"%s\"",
		 nonfinite[0] ? "," : "", key);
}

/* The world this process is a rank of: what the launcher says (mpirun,
 * srun), with the backend for the device (docs/zero.md). */
static void zero_world(struct st_engine_config *ec)
{
	struct st_comm_launch l;

	st_comm_launch(&l);
	ec->world = l.launcher && l.world > 0 ? l.world : 1;
	ec->rank = l.launcher && l.rank >= 0 ? l.rank : 0;
	if (st_comm_auto(ec->device, &ec->comm_ops) < 0)
		st_cli_die(2, "%s", st_error_last());
	if (ec->world == 1 && ec->zero == 3)
		fprintf(stderr, "strata: --zero 3 with one rank shards nothing: it trains as "
			"--zero 0\n");
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

/* Every rank runs the same configuration on the same data: one line per
 * setting and the data's size, compared across the ranks before anything
 * is allocated (st_comm_agree, on a communicator of its own). A mismatch
 * ends every rank with exit 2 and one line (rank 0's) naming the first
 * difference. */
/* Lines every rank must have alike, compared on c; exit 2 on every rank,
 * rank 0 naming the first difference, when they are not. */
static void agree_or_exit(struct st_comm *c, int rank, const char *const *lines, int n)
{
	struct st_comm_disagreement dis;
	int ret = st_comm_agree(c, lines, n, &dis);

	if (ret < 0)
		st_cli_die(1, "the ranks' agreement on the configuration: %s", st_error_last());
	if (ret == 1) {
		if (rank == 0)
			fprintf(stderr, "strata: the ranks do not run the same configuration: rank "
				"%d has %s where rank 0 has %s\n", dis.rank, dis.rank_text,
				dis.rank0_text);
		fflush(stderr);
		exit(2);
	}
}

static void zero_agree(const struct st_engine_config *ec, const char *cfg_json,
		       const struct st_dataset *ds, const char *run_line, const char *save,
		       struct st_cli_world *wi)
{
	struct st_device_config dc = { .mem_bytes = 1 << 20 };
	struct st_device *d = NULL;
	struct st_comm *c = NULL;
	json_object *o = json_tokener_parse(cfg_json);
	char *lines[64], buf[256];
	int n = 0, ret;

	if (ec->world == 1 || !o)
		goto out;
	json_object_object_foreach(o, key, val) {
		size_t len;

		if (n >= 61)
			break;
		len = strlen(key) + strlen(json_object_to_json_string(val)) + 2;
		lines[n] = malloc(len);
		if (lines[n])
			snprintf(lines[n++], len, "%s=%s", key, json_object_to_json_string(val));
	}
	snprintf(buf, sizeof(buf), "data tokens=%llu max=%u",
		 (unsigned long long)st_dataset_tokens(ds), st_dataset_max_token(ds));
	lines[n++] = strdup(buf);
	/* what decides which collectives a step runs besides the model: the
	 * saves, the resume, the metrics' gathers */
	lines[n++] = strdup(run_line);
	/* BLAS's kernels decide the forward's and backward's bits: a
	 * DYNAMIC_ARCH OpenBLAS picks them by the CPU (or OPENBLAS_CORETYPE),
	 * so nodes with other CPUs would train apart, silently */
	snprintf(buf, sizeof(buf), "blas=%s", openblas_get_config());
	buf[strcspn(buf, "\n")] = 0;
	lines[n++] = strdup(buf);
	/* host lines: over mpi where built (nccl, the cuda device's, needs a GPU) */
	ret = st_device_create(st_device_find("cpu"), &dc, &d);
	if (ret == 0)
		ret = st_comm_create(st_comm_find("mpi") ? st_comm_find("mpi") : ec->comm_ops, d,
				     NULL, &c);
	if (ret < 0)
		st_cli_die(1, "the ranks' agreement on the configuration: %s", st_error_last());
	for (int i = 0; i < n; i++)
		if (!lines[i])
			st_cli_die(1, "the ranks' agreement on the configuration: out of memory");
	agree_or_exit(c, ec->rank, (const char *const *)lines, n);
	st_cli_zero_nodes(c, ec->rank, save, wi);
	st_comm_destroy(c);
	st_device_destroy(d);
	for (int i = 0; i < n; i++)
		free(lines[i]);
out:
	json_object_put(o);
}

/* Whether any rank has flag (a stop asked for): every rank stops after the
 * same step, or their collectives would no longer pair up. */
static bool zero_any(struct st_engine *e, bool flag)
{
	struct st_comm *c = st_engine_comm(e);
	int w = st_comm_world(c);
	int32_t mine = flag, *all;
	bool any = false;

	if (w == 1)
		return flag;
	if (!(all = calloc((size_t)w, sizeof(*all))))
		st_cli_die(1, "the ranks' stop flags: out of memory");
	if (st_comm_host_allgather(c, &mine, all, sizeof(mine)) < 0)
		st_cli_die(1, "the ranks' stop flags: %s", st_error_last());
	for (int i = 0; i < w; i++)
		any = any || all[i];
	free(all);
	return any;
}

/* Every rank's peak per tier (world > 1, --metrics: collective), into
 * *all: [world * ST_HOME_COUNT], 0 for a tier a rank does not have. */
static void zero_peaks(struct st_engine *e, const struct st_engine_stats *es, uint64_t **all)
{
	struct st_comm *c = st_engine_comm(e);
	uint64_t mine[ST_HOME_COUNT];

	if (!*all && !(*all = calloc((size_t)st_comm_world(c) * ST_HOME_COUNT, sizeof(**all))))
		st_cli_die(1, "out of memory");
	for (int h = 0; h < ST_HOME_COUNT; h++)
		mine[h] = es->has_tier[h] ? es->peak_bytes[h] : 0;
	if (st_comm_host_allgather(c, mine, *all, sizeof(mine)) < 0)
		st_cli_die(1, "the ranks' peaks: %s", st_error_last());
}

/* A metrics line's ZeRO part (world > 1): each collective of the step
 * (calls, bytes as strata/comm.h counts them, the comm queue's busy time)
 * and every rank's peak per tier. */
static void zero_metrics(FILE *mf, const struct st_comm_stats *a, const struct st_comm_stats *b,
			 const uint64_t *peaks, int world)
{
	fprintf(mf, "},\"comm\":{");
	for (int k = 0, first = 1; k < ST_COMM_KINDS; k++) {
		uint64_t calls = b->kind[k].calls - a->kind[k].calls;

		if (!calls)
			continue;
		fprintf(mf, "%s\"%s\":{\"calls\":%llu,\"bytes\":%llu,\"busy_s\":%.6f}",
			first ? "" : ",", st_comm_kind_name((enum st_comm_kind)k),
			(unsigned long long)calls,
			(unsigned long long)(b->kind[k].bytes - a->kind[k].bytes),
			(double)(b->kind[k].busy_ns - a->kind[k].busy_ns) / 1e9);
		first = 0;
	}
	fprintf(mf, "},\"rank_peak\":[");
	for (int q = 0; peaks && q < world; q++) {
		fprintf(mf, "%s{", q ? "," : "");
		for (int h = 0; h < ST_HOME_COUNT; h++)
			fprintf(mf, "%s\"%s\":%llu", h ? "," : "", st_home_name(h),
				(unsigned long long)peaks[q * ST_HOME_COUNT + h]);
		fprintf(mf, "}");
	}
	fprintf(mf, "]");
}

/* Fields that must match between the run and the checkpoint it resumes. */
static void check_resume_config(const char *saved, const char *now)
{
	static const char *keys[] = { "model", "batch", "seq", "grad_accum", "lr", "schedule",
				      "warmup", "wd", "beta1", "beta2", "eps", "clip", "seed",
				      "precision", "shuffle", "steps" };
	json_object *a = saved ? json_tokener_parse(saved) : NULL, *b = json_tokener_parse(now);

	if (!a)
		st_cli_die(2, "--resume: the checkpoint has no training configuration");
	for (size_t i = 0; i < ST_ARRAY_LEN(keys); i++) {
		json_object *x = NULL, *y = NULL;

		json_object_object_get_ex(a, keys[i], &x);
		json_object_object_get_ex(b, keys[i], &y);
		if (!json_object_equal(x, y))
			st_cli_die(2, "--resume: %s is %s in the checkpoint but %s now", keys[i],
				   x ? json_object_to_json_string(x) : "absent",
				   y ? json_object_to_json_string(y) : "absent");
	}
	json_object_put(a);
	json_object_put(b);
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
		.host_compute = !ec->device || strcmp(ec->device, "cpu") == 0,
		.activations = ec->activations, .recompute = ec->recompute,
		/* as the engine's own plan (engine.c) */
		.optim_vram_auto = ec->device && strcmp(ec->device, "cuda") == 0,
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

/* --rates-refresh FILE: the rates steps first..last measured (busy time and
 * bytes of every queue, summed), and for a rate this run did not measure
 * (no nvme tier, say) the one it ran with unless that was the default;
 * written atomically. */
static void train_rates_refresh(struct st_engine *e, const char *file, const double *busy,
				const double *bytes, double nvme_busy, int n, int first, int last)
{
	const struct st_plan *p = st_engine_plan(e);
	struct st_plan pn = *p;
	struct st_plan_rates r, used = p->rates;
	char meas[256];
	int ret;

	/* the plan's FLOPs and AdamW bytes are per step: n steps' worth */
	pn.compute_flops_step = p->compute_flops_step * n;
	pn.adam_bytes = p->adam_bytes * (uint64_t)n;
	st_plan_rates_from_lanes(&pn, busy, bytes, nvme_busy, &r);
	for (int i = 0; i < ST_RATE_COUNT; i++)
		if (used.source[i] == ST_RATE_SRC_DEFAULT)
			st_plan_rate_set(&used, (enum st_rate)i, 0);
	st_plan_rates_merge(&r, &used);
	snprintf(meas, sizeof(meas), "{\"source\": \"strata train\", \"steps\": [%d, %d]}",
		 first, last);
	ret = st_plan_rates_write(file, &r, meas);
	if (ret < 0)
		st_cli_die(1, "--rates-refresh %s", st_error_last());
	printf("rates from steps %d-%d written to %s: compute %.1f GFLOP/s, nvme %.2f / %.2f "
	       "GB/s, adam %.2f GB/s (0: not measured, the run's rate or null kept)\n", first,
	       last, file, r.compute_flops / 1e9, r.nvme_read_bps / 1e9, r.nvme_write_bps / 1e9,
	       r.adam_bps / 1e9);
}

int st_cli_train(int argc, char **argv)
{
	static const struct option longs[] = {
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
		{ "shard-size", 1, 0, 1000 },
		{ "device", 1, 0, 'D' }, { "verify-reads", 1, 0, 'V' },
		{ "test-fault", 1, 0, 'y' }, { "max-skipped", 1, 0, 'x' },
		{ "zero", 1, 0, 'z' }, { "recompute", 1, 0, 1001 },
		{ "compute-dtype", 1, 0, 1003 },
		{ "offload-activations", 1, 0, 1002 },
		{ "rates", 1, 0, 1011 }, { "rates-refresh", 1, 0, 1012 },
		{ "help", 0, 0, 'h' },
		{ 0 },
	};
	struct st_engine_config ec = { .device = "cpu", .recompute = ST_RECOMPUTE_AUTO };
	struct st_train_config *cfg = &ec.train;
	const char *data = ST_DEFAULT_DATA, *save = NULL, *metrics = NULL, *init = NULL;
	static const char default_model[] = "tiny";
	const char *model_text = default_model, *trace_path = NULL, *resume = NULL;
	const char *nvme = DEFAULT_NVME;
	int shuffle = 1, threads = 0, log_every = 1, save_every = 0, keep = 3, c;
	int max_skipped = 10, skipped_in_row = 0;
	bool want_metrics = false, accum_auto = false, keep_given = false;
	const char *rates_file = NULL, *refresh = NULL;
	double rf_busy[ST_LANE_COUNT] = { 0 }, rf_bytes[ST_LANE_COUNT] = { 0 };
	double rf_nvme = 0;
	int rf_steps = 0, rf_last = 0;
	struct st_comm_stats cs0, cs1;
	uint64_t *rank_peaks = NULL;
	struct st_engine *e;
	struct st_dataset *ds;
	struct st_loader ld;
	struct st_cli_world wi = { .nodes = 1 };
	struct st_loader_config lc;
	struct st_trace *trace = NULL;
	FILE *mf = NULL;
	uint64_t t0, start_step = 0;
	int done_steps;
	bool stopped = false;
	char *auto_dir = NULL; /* what --resume auto resumes from */
	int save_lock = -1;
	char *cfg_json;
	struct sigaction sa = { .sa_handler = on_signal };
	int ret;

	st_train_config_default(cfg);
	ec.gpu_mem_bytes = st_cli_size("--gpu-mem", DEFAULT_GPU_MEM);
	ec.host_mem_bytes = st_cli_size("--host-mem", DEFAULT_HOST_MEM);
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		switch (c) {
		case 'm':
			if (st_model_config_parse(optarg, &cfg->model) < 0)
				st_cli_die(2, "--model %s: %s", optarg, st_error_last());
			model_text = optarg;
			break;
		case 'd': data = optarg; break;
		case 'B': cfg->batch = (int)st_cli_long("--batch", optarg, 1, 1 << 16); break;
		case 'T': cfg->seq = (int)st_cli_long("--seq", optarg, 1, 1 << 20); break;
		case 's': cfg->steps = (int)st_cli_long("--steps", optarg, 0, 1 << 30); break;
		case 'a':
			accum_auto = strcmp(optarg, "auto") == 0;
			cfg->grad_accum = accum_auto ? 1 :
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
				ec.no_verify_reads = false;
			else if (strcmp(optarg, "off") == 0)
				ec.no_verify_reads = true;
			else
				st_cli_die(2, "--verify-reads %s: expected on or off", optarg);
			break;
		case 'u':
			if (strcmp(optarg, "on") == 0)
				shuffle = 1;
			else if (strcmp(optarg, "off") == 0)
				shuffle = 0;
			else
				st_cli_die(2, "--shuffle %s: expected on or off", optarg);
			break;
		case 'j': threads = (int)st_cli_long("--threads", optarg, 1, 4096); break;
		case 'o': save = optarg; break;
		case 'M': metrics = optarg; break;
		case 'i': init = optarg; break;
		case 'L': log_every = (int)st_cli_long("--log-every", optarg, 1, 1 << 30); break;
		case 'G': ec.gpu_mem_bytes = st_cli_size("--gpu-mem", optarg); break;
		case 'H': ec.host_mem_bytes = st_cli_size("--host-mem", optarg); break;
		case 'N': nvme = optarg; break;
		case 'Z': ec.nvme_mem_bytes = st_cli_size("--nvme-mem", optarg); break;
		case 'P': ec.params = st_cli_offload("--offload-params", optarg, true); break;
		case 'O': ec.optim = st_cli_offload("--offload-optim", optarg, false); break;
		case 1002: ec.activations = st_cli_offload_act(optarg); break;
		case 'F': ec.prefetch = (int)st_cli_long("--prefetch", optarg, 0, 1 << 16); break;
		case 'K': {
			uint64_t b = st_cli_size("--aio-block", optarg);

			if (!st_is_pow2(b) || b < 4096 || b > (1u << 30))
				st_cli_die(2, "--aio-block %s: a power of two from 4K to 1G", optarg);
			ec.aio_block_bytes = b;
			break;
		}
		case 'Q': ec.aio_depth = (unsigned)st_cli_long("--aio-depth", optarg, 1, 4096); break;
		case 'X': trace_path = optarg; break;
		case 'E': save_every = (int)st_cli_long("--save-every", optarg, 1, 1 << 30); break;
		case 'k':
			keep = (int)st_cli_long("--keep", optarg, 0, 1 << 20);
			keep_given = true;
			break;
		case 1000:
			ec.ckpt_shard_bytes = st_cli_size("--shard-size", optarg);
			break;
		case 1001: ec.recompute = st_cli_recompute(optarg); break;
		case 1003:
			if (st_precision_parse(optarg, &ec.compute_dtype) < 0)
				st_cli_die(2, "--compute-dtype %s: expected fp32 or bf16", optarg);
			break;
		case 'R': resume = optarg; break;
		case 'x': max_skipped = (int)st_cli_long("--max-skipped", optarg, 0, 1 << 30); break;
		case 'D':
			if (!st_device_find(optarg))
				st_cli_die(2, "--device %s: not a device built into this binary (%s)",
					   optarg, st_device_list());
			ec.device = optarg;
			break;
		case 'y': parse_test_fault(optarg, &ec.nvme_fault); break;
		case 'z': ec.zero = (int)st_cli_long("--zero", optarg, 0, 3); break;
		case 1011: rates_file = optarg; break;
		case 1012: refresh = optarg; break;
		case 'h': train_usage(stdout); return 0;
		default:
			st_cli_die(2, "train: unknown or incomplete option %s (see strata train --help)",
				   argv[optind - 1]);
		}
	}
	if (optind < argc)
		st_cli_die(2, "train: unexpected argument %s", argv[optind]);
	zero_world(&ec);
	zero_sigkill_note(&ec, save);
	if (strcmp(nvme, "none") != 0) {
		st_cli_check_dirs("--nvme", nvme, true);
		ec.nvme_dirs = nvme;
	}
	if ((ec.nvme_fault.kind != ST_FAULT_NONE ||
	     ec.nvme_fault.corrupt.kind != ST_CORRUPT_NONE) && !ec.nvme_dirs)
		st_cli_die(2, "--test-fault needs an nvme tier (--nvme DIR)");
	static char init_model[512];
	if (init) {
		/* what cannot be read is said now, before the plan, not as a
		 * misfit of the default model with the data later */
		struct st_weights *w;
		struct st_model_config gc;

		ret = st_weights_open(init, &w);
		if (ret < 0)
			st_cli_die(st_cli_input_exit(ret), "--init %s: %s", init,
				   st_cli_unprefix(st_error_last(), init));
		/* no --model: the model --init's config.json says (a file without
		 * one, a bare model.safetensors, leaves the default) */
		if (model_text == default_model && st_weights_config(w, &gc) == 0) {
			char dims[480];

			cfg->model = gc;
			snprintf(init_model, sizeof(init_model), "%s:%s",
				 st_model_config_family(&gc)->name,
				 st_model_config_format(&gc, dims, sizeof(dims)));
			model_text = init_model;
		}
		st_weights_close(w);
	}
	if (cfg->seq > cfg->model.ctx)
		st_cli_die(2, "--seq %d is longer than the model's context of %d", cfg->seq,
			   cfg->model.ctx);
	if (rates_file) {
		ret = st_plan_rates_read(rates_file, &ec.rates);
		if (ret < 0)
			st_cli_die(st_cli_input_exit(ret), "--rates %s", st_error_last());
	}
	if (refresh && cfg->steps < 2)
		st_cli_die(2, "--rates-refresh needs --steps 2 or more (it measures steps 2 to 4)");
	if (accum_auto)
		train_accum_auto(&ec);
	if (save_every && !save)
		st_cli_die(2, "--save-every needs --save DIR");
	if (keep_given && !save)
		st_cli_die(2, "--keep needs --save DIR (it prunes the checkpoints there)");
	if (metrics && trace_path) {
		/* rank 0 writes the metrics, and at world > 1 its trace is
		 * TRACE.rank-0: the names that would meet; every rank refuses */
		char t0[4200];

		snprintf(t0, sizeof(t0), ec.world > 1 ? "%s.rank-0" : "%s", trace_path);
		if (same_file(metrics, t0))
			st_cli_die(2, "--metrics and --trace are both %s: give each a file of its "
				   "own", metrics);
	}
	if (save) {
		struct stat st;

		if (stat(save, &st) == 0 && !S_ISDIR(st.st_mode))
			st_cli_die(2, "--save %s exists and is not a directory", save);
	}
	if (resume && strcmp(resume, "auto") == 0 && !save)
		st_cli_die(2, "--resume auto needs --save DIR (it resumes from there)");
	if (init && resume && strcmp(resume, "auto") != 0)
		st_cli_die(2, "--init and --resume do not go together");
	set_threads_cli(threads);
	ds = st_cli_open_data(data, cfg->model.vocab);
	if (init && cfg->model.vocab != 256 && st_dataset_format(ds) == ST_DATASET_BYTES) {
		char tdir[4096];

		/* a model that ships a tokenizer, fed the text's bytes as ids:
		 * a fine-tune on noise */
		if (st_cli_tokenizer_dir(init, tdir, sizeof(tdir)))
			st_cli_die(2, "--data %s is text, and --init %s has a tokenizer: train on "
				   "its ids (strata tokenize --tokenizer %s --out FILE.bin %s)",
				   data, init, tdir, data);
	}
	lc = (struct st_loader_config){ .batch = (uint32_t)cfg->batch, .seq = (uint32_t)cfg->seq,
					.shuffle = shuffle, .seed = cfg->seed,
					.split = ST_SPLIT_ALL };
	if (st_loader_init(&ld, ds, &lc) < 0)
		st_cli_die(2, "--data %s: %s", data, st_error_last());
	cfg_json = config_json(cfg, ec.compute_dtype, model_text, data, shuffle, ec.world, ec.zero);
	{
		char run_line[8400];

		snprintf(run_line, sizeof(run_line),
			 "run save=%s save-every=%d keep=%d resume=%s metrics=%d",
			 save ? save : "-", save_every, keep, resume ? resume : "-",
			 metrics != NULL);
		zero_agree(&ec, cfg_json, ds, run_line, save, &wi);
	}

	/* One run saves into a DIR at a time: a second one (a restart while
	 * the first still runs, say) would prune and relink the first's. The
	 * lock comes before anything is read from DIR or allocated, so a
	 * second run is refused before it has done any of that. */
	st_cli_at_die(undo_run);
	run.save = save;
	/* rank 0 prints, saves and holds the lock; the others write only their
	 * slices (through st_engine_save) and say nothing but their errors */
	if (ec.rank > 0 && !freopen("/dev/null", "w", stdout))
		st_cli_die(1, "/dev/null: %s", strerror(errno));
	want_metrics = metrics != NULL; /* every rank gathers what rank 0 writes */
	if (ec.rank > 0)
		metrics = NULL;
	if (save && ec.rank == 0 && st_ckpt_lock(save, &save_lock, &run.made) < 0)
		st_cli_die(2, "--save %s", st_error_last());
	/* From here a Ctrl-C or SIGTERM only asks for a stop: in start-up, the
	 * run ends before its first step; after, at the end of a step. */
	if (ec.world > 1) {
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
	/* --resume auto: one command line for a job's first start and its
	 * restarts. Only "no checkpoint there" starts afresh (from --init, if
	 * given); a damaged one is refused below as with --resume DIR. */
	if (resume && strcmp(resume, "auto") == 0) {
		ret = st_ckpt_resolve(save, &auto_dir);
		if (ret < 0 && ret != -ENOENT)
			st_cli_die(2, "--resume auto: %s", st_error_last());
		resume = auto_dir;
		if (!resume) {
			printf("no checkpoint in %s yet: starting at step 0\n", save);
		} else if (init) {
			printf("a checkpoint in %s: resuming from it, not from --init %s\n", save,
			       init);
			init = NULL;
		}
	}

	/* The plan decides before anything is allocated: a budget that cannot
	 * work is refused here, with exit 2. */
	if (trace_path && ec.world > 1) { /* one file per rank */
		static char tp[4200];

		snprintf(tp, sizeof(tp), "%s.rank-%d", trace_path, ec.rank);
		trace_path = tp;
	}
	if (trace_path && st_trace_create(&trace, trace_path) < 0)
		st_cli_die(2, "--trace %s: %s", trace_path, st_error_last());
	ec.trace = run.trace = trace;
	ret = st_engine_create(&ec, &e);
	if (ret == -ENOSPC || ret == -EINVAL || ret == -ENODEV || ret == -ENOTSUP)
		st_cli_die(2, "%s", st_error_last());
	if (ret < 0)
		st_cli_die(1, "%s", st_error_last());
	{
		struct st_plan_input pin = {
			.model = st_engine_model(e), .batch = cfg->batch, .seq = cfg->seq,
			.grad_accum = cfg->grad_accum, .bf16 = cfg->bf16,
			.gpu_mem_bytes = ec.gpu_mem_bytes, .host_mem_bytes = ec.host_mem_bytes,
			.nvme_mem_bytes = ec.nvme_mem_bytes, .have_nvme = ec.nvme_dirs != NULL,
			.params = ec.params, .optim = ec.optim, .prefetch = ec.prefetch,
			.host_compute = strcmp(ec.device, "cpu") == 0,
			.activations = ec.activations,
			.recompute = ec.recompute,
		};

		st_plan_print(st_engine_plan(e), &pin, stdout);
	}
	if (init) {
		struct st_weights *w;
		struct st_model_config gc;
		char dims[256];
		int ret = st_weights_open(init, &w);

		/* a file that says which model it holds must hold --model's
		 * (a bare model.safetensors: its tensors' shapes are checked) */
		if (ret == 0 && st_weights_config(w, &gc) == 0 &&
		    !st_model_config_equal(&gc, &cfg->model))
			ret = st_error_set(-EINVAL, "it holds %s, not the model --model gives",
					   st_model_config_format(&gc, dims, sizeof(dims)));
		if (ret == 0)
			ret = st_engine_load_weights(e, w);
		st_weights_close(w);
		if (ret < 0)
			st_cli_die(st_cli_input_exit(ret), "--init %s: %s", init,
				   st_cli_unprefix(st_error_last(), init));
	}
	if (resume) {
		char *saved = NULL;

		if (st_engine_resume(e, resume, &start_step, &ld.cur, &saved) < 0)
			st_cli_die(2, "--resume %s: %s", resume,
				   st_cli_unprefix(st_error_last(), resume));
		check_resume_config(saved, cfg_json);
		free(saved);
		if (st_loader_seek(&ld, &ld.cur) < 0)
			st_cli_die(2, "--resume %s: %s", resume, st_error_last());
		printf("resumed from %s at step %llu\n", resume, (unsigned long long)start_step);
	}
	if (ec.world > 1) { /* every rank resumed the same checkpoint (--resume auto) */
		char line[4200];
		const char *lines[] = { line };

		snprintf(line, sizeof(line), "resumed from=%s step=%llu", resume ? resume : "-",
			 (unsigned long long)start_step);
		agree_or_exit(st_engine_comm(e), ec.rank, lines, 1);
	}
	if (metrics) {
		mf = fopen(metrics, resume ? "a" : "w");
		if (!mf)
			st_cli_die(2, "--metrics %s: %s", metrics, strerror(errno));
	}
	printf("strata train: %.2fM params, %d layers, dim %d, %d heads, vocab %d | data %s "
	       "(%llu tokens) | B=%d T=%d accum %d | device %s | %d threads | adam %s\n",
	       (double)st_model_param_count(st_engine_model(e)) / 1e6, cfg->model.n_layer,
	       cfg->model.dim, cfg->model.n_head, cfg->model.vocab, data,
	       (unsigned long long)st_dataset_tokens(ds), cfg->batch, cfg->seq, cfg->grad_accum,
	       ec.device, omp_get_max_threads(), st_optim_path_name(st_optim_path_get()));
	if (ec.world > 1)
		printf("world: %d ranks on %d node%s: %s | --zero %d | comm %s | blas %s\n",
		       ec.world, wi.nodes, wi.nodes == 1 ? "" : "s", wi.hosts, ec.zero,
		       st_comm_name(st_engine_comm(e)), openblas_get_corename());
	fflush(stdout);
	if (stop_requested)
		st_cli_die(130, "stopped before the first step (nothing saved)");
	run.started = true;
	/* the tokenizer beside --init goes with the checkpoints: into --save
	 * DIR, where generate, eval and export find it (one above step-N) */
	if (init && save) {
		char tdir[4096];

		if (st_cli_tokenizer_dir(init, tdir, sizeof(tdir)) &&
		    st_cli_tokenizer_copy(tdir, save) > 0)
			printf("the tokenizer of %s: copied into %s\n", init, save);
	}
	done_steps = (int)start_step;
	t0 = st_now_ns();
	for (int s = (int)start_step; s < cfg->steps; s++) {
		struct st_step_result r;
		struct st_engine_stats es;
		double dt, tps;
		char eta[32], a[16], b[16], cc[16], d[16];
		/* A stop asked for (Ctrl-C, SIGTERM) ends the run after the step
		 * it comes in, saved. */
		bool stopping = zero_any(e, stop_requested);
		bool saving = save && ((save_every && (s + 1) % save_every == 0) ||
				       s + 1 == cfg->steps || stopping);
		/* The next step's first forward runs in this step's update sweep,
		 * unless the state is saved (or the run ends) after this step. */
		bool follows = s + 1 < cfg->steps && !saving && !stopping;

		st_comm_get_stats(st_engine_comm(e), &cs0);
		if (st_engine_step(e, &ld, s, follows, &r) < 0)
			st_cli_die(1, "step %d: %s", s + 1, st_error_last());
		st_comm_get_stats(st_engine_comm(e), &cs1);
		done_steps = s + 1;
		st_engine_get_stats(e, &es);
		if (want_metrics && ec.world > 1)
			zero_peaks(e, &es, &rank_peaks);
		dt = (double)es.step_ns / 1e9;
		tps = (double)cfg->batch * cfg->seq * cfg->grad_accum / dt;
		/* --rates-refresh: steps 2 to 4 of this run (or to its last) */
		if (refresh && s > (int)start_step && rf_steps < 3) {
			for (int l = 0; l < ST_LANE_COUNT; l++) {
				rf_busy[l] += (double)es.busy_ns[l] / 1e9;
				rf_bytes[l] += (double)es.bytes[l];
			}
			rf_nvme += (double)es.nvme_busy_ns / 1e9;
			rf_steps++;
			rf_last = s + 1;
			if (rf_steps == 3 || s + 1 == cfg->steps)
				train_rates_refresh(e, refresh, rf_busy, rf_bytes, rf_nvme, rf_steps,
						    (int)start_step + 2, rf_last);
		}
		if ((s + 1) % log_every == 0 || s + 1 == cfg->steps || r.skipped) {
			char u[3][32], pk[3][32];

			for (int h = 0; h < ST_HOME_COUNT; h++) {
				st_format_bytes(es.used_bytes[h], u[h], sizeof(u[h]));
				st_format_bytes(es.peak_bytes[h], pk[h], sizeof(pk[h]));
			}
			struct rusage ru;

			getrusage(RUSAGE_SELF, &ru);
			printf("step %*d/%d | loss %.6f | lr %.3e | norm %.4f%s | %.0f tok/s | %.2f s | ETA %s\n"
			       "    vram %s (peak %s) host %s (peak %s)%s%s%s%s%s | GB/s h2d %s d2h %s "
			       "nvme r %s w %s | rss %.0f MiB\n",
			       (int)log10(cfg->steps) + 1, s + 1, cfg->steps, r.loss, r.lr, r.grad_norm,
			       r.skipped ? " (non-finite: skipped)" : "", tps, dt,
			       st_cli_eta((double)(st_now_ns() - t0) / 1e9 / (s + 1 - (int)start_step) *
						  (cfg->steps - s - 1), eta, sizeof(eta)),
			       u[0], pk[0], u[1], pk[1], es.has_tier[2] ? " nvme " : "",
			       es.has_tier[2] ? u[2] : "", es.has_tier[2] ? " (peak " : "",
			       es.has_tier[2] ? pk[2] : "", es.has_tier[2] ? ")" : "",
			       gbps(es.bytes[ST_LANE_H2D], es.step_ns, a, sizeof(a)),
			       gbps(es.bytes[ST_LANE_D2H], es.step_ns, b, sizeof(b)),
			       gbps(es.bytes[ST_LANE_NVME_READ], es.step_ns, cc, sizeof(cc)),
			       gbps(es.bytes[ST_LANE_NVME_WRITE], es.step_ns, d, sizeof(d)),
			       ru.ru_maxrss / 1024.0);
		}
		if (mf) {
			/* a finite step's line is what it always was, byte for byte */
			char nf[128] = "";

			fprintf(mf, "{\"step\":%d", s + 1);
			metric(mf, "loss", "%.9g", r.loss, nf, sizeof(nf));
			metric(mf, "lr", "%.9g", r.lr, nf, sizeof(nf));
			metric(mf, "grad_norm", "%.9g", r.grad_norm, nf, sizeof(nf));
			metric(mf, "tokens_per_s", "%.1f", tps, nf, sizeof(nf));
			metric(mf, "model_tflops", "%.4f",
			       tps * st_model_flops_per_token(st_engine_model(e), cfg->seq) / 1e12, nf,
			       sizeof(nf));
			metric(mf, "step_s", "%.6f", dt, nf, sizeof(nf));
			fprintf(mf, "%s%s%s%s,\"bytes\":{", r.skipped ? ",\"skipped\":true" : "",
				nf[0] ? ",\"nonfinite\":[" : "", nf, nf[0] ? "]" : "");
			for (int l = ST_LANE_H2D; l <= ST_LANE_NVME_WRITE; l++)
				fprintf(mf, "%s\"%s\":%llu", l == ST_LANE_H2D ? "" : ",",
					l == ST_LANE_H2D ? "h2d" : l == ST_LANE_D2H ? "d2h"
					: l == ST_LANE_NVME_READ ? "nvme_read" : "nvme_write",
					(unsigned long long)es.bytes[l]);
			fprintf(mf, "},\"peak\":{");
			for (int h = 0, first = 1; h < ST_HOME_COUNT; h++) {
				if (!es.has_tier[h])
					continue;
				fprintf(mf, "%s\"%s\":%llu", first ? "" : ",", st_home_name(h),
					(unsigned long long)es.peak_bytes[h]);
				first = 0;
			}
			fprintf(mf, "},\"busy_s\":{");
			for (int l = 0; l < ST_LANE_COUNT; l++)
				fprintf(mf, "%s\"%s\":%.6f", l ? "," : "",
					l == ST_LANE_COMPUTE ? "compute" : l == ST_LANE_H2D ? "h2d"
					: l == ST_LANE_D2H ? "d2h" : l == ST_LANE_NVME_READ ? "nvme_read"
					: l == ST_LANE_NVME_WRITE ? "nvme_write" : "adam",
					(double)es.busy_ns[l] / 1e9);
			if (ec.world > 1) /* closes busy_s */
				zero_metrics(mf, &cs0, &cs1, rank_peaks, ec.world);
			fprintf(mf, ec.world > 1 ? "}\n" : "}}\n");
			errno = 0;
			if (fflush(mf) != 0 || ferror(mf)) /* a full disk: say so now */
				st_cli_die(1, "--metrics %s: %s", metrics,
					   errno ? strerror(errno) : "an earlier write to it failed");
		}
		fflush(stdout);
		/* A stop that came during a step which began the next one saves
		 * too: with the cursor of this step's end (ld has given the next
		 * batch), and the run ends there. Read once: a signal between two
		 * reads must not end the run unsaved. */
		stopped = zero_any(e, stop_requested);
		/* Steps whose gradient is not finite are skipped (the state stays
		 * that of the last good step); a run of them means the run has
		 * gone bad: it stops, unsaved, and says what to go on from. */
		skipped_in_row = r.skipped ? skipped_in_row + 1 : 0;
		if (max_skipped && skipped_in_row >= max_skipped) {
			char last[4200];

			st_cli_die(1, "%d steps in a row had a non-finite gradient (last at step %d): "
				   "stopped; %s", skipped_in_row, s + 1,
				   last_ckpt(save, last, sizeof(last)));
		}
		if (saving || (save && stopped)) {
			ret = st_engine_save(e, save, (uint64_t)s + 1, st_engine_step_end_cursor(e),
					     cfg_json, keep);
			if (ret < 0) {
				char why[1024], last[4200];

				/* a state that is not finite: refused, latest unchanged */
				snprintf(why, sizeof(why), "%s", st_error_last());
				st_cli_die(1, "--save %s: step %d: %s%s%s", save, s + 1, why,
					   ret == -EINVAL ? "; " : "",
					   ret == -EINVAL ? last_ckpt(save, last, sizeof(last)) : "");
			}
			printf("saved step %d in %s\n", s + 1, save);
		}
		if (stopped)
			break;
	}
	if (save && cfg->steps == 0) {
		if (st_engine_save(e, save, 0, &ld.cur, cfg_json, keep) < 0)
			st_cli_die(1, "--save %s: %s", save, st_error_last());
		printf("saved step 0 in %s\n", save);
	}
	if (mf && fclose(mf) != 0)
		st_cli_die(1, "--metrics %s: %s", metrics, strerror(errno));
	run.trace = NULL;
	if (trace && st_trace_close(trace) < 0)
		st_cli_die(1, "--trace %s: %s", trace_path, st_error_last());
	st_cli_at_die(NULL);
	st_ckpt_unlock(save_lock);
	free(run.made);
	free(auto_dir);
	st_engine_destroy(e);
	st_dataset_close(ds);
	free(cfg_json);
	free(rank_peaks);
	if (stopped && done_steps < cfg->steps) {
		/* every rank agreed on the stop (zero_any) and saved: they all
		 * exit 130, finishing MPI, rather than ending the job */
		if (ec.world > 1)
			st_comm_exit_together();
		if (save && ec.rank == 0)
			fprintf(stderr, "strata: stopped after step %d, saved in %s (go on with "
				"--resume %s)\n", done_steps, save, save);
		else if (ec.rank == 0)
			fprintf(stderr, "strata: stopped after step %d (nothing saved: no --save)\n",
				done_steps);
		/* mpirun's kill sequence: it no longer answers MPI_Finalize,
		 * which would wait for its SIGKILL; the state is saved and every
		 * rank is past its last collective, so leave now */
		if (ec.world > 1 && atomic_load(&stop_signal) &&
		    atomic_load(&stop_signal) != SIGUSR1) {
			fflush(stdout);
			fflush(stderr);
			_exit(130);
		}
		return 130;
	}
	return 0;
}

/* Shared by the strata subcommands (src/cli only). */
#ifndef STRATA_CLI_H
#define STRATA_CLI_H

#include "strata/common.h"
#include "strata/dataset.h"

#include <stdbool.h>
#include <stddef.h>

/* A text every Debian ships: the default training data. */
#define ST_DEFAULT_DATA "/usr/share/common-licenses/GPL-3"

/* "strata: <message>" on stderr and exit(code), after the function
 * st_cli_at_die() named (if any) has undone what the command started. */
_Noreturn void st_cli_die(int code, const char *fmt, ...) ST_PRINTF(2, 3);
/* fn(code) runs in st_cli_die() before it exits; one at a time, NULL for
 * none. */
void st_cli_at_die(void (*fn)(int code));
/* The exit code for a failure to read input the user named: 2 when it is
 * bad input (-ENOENT, -ENOTDIR: missing; -EINVAL: malformed, damaged, of
 * another model), 1 when the system failed (any other -errno). */
int st_cli_input_exit(int err);
/* msg without a leading "path: ": a reader's message names the file it
 * read, which is the one the user named when PATH was a file, and the
 * caller's "--flag PATH: " says that already. Borrowed from msg. */
const char *st_cli_unprefix(const char *msg, const char *path);
/* An option getopt_long() refused (arg: argv[optind - 1]): "--lr needs a
 * value", or "unknown option --learning-rate: did you mean --lr?" with the
 * nearest of longs (st_cli_nearest_option()); exit 2, one line. */
struct option;
_Noreturn void st_cli_bad_option(const char *cmd, const struct option *longs, const char *arg);
/* The name in longs nearest to given (an option's name without "--", up
 * to any '='): its words' initials (learning-rate: lr), a word of it that
 * is a whole name (max-steps: steps), else the smallest edit distance, at
 * most a third of given's length; NULL when none is near. '_' reads as
 * '-'. */
const char *st_cli_nearest_option(const struct option *longs, const char *given);
/* The device a --device value names: "auto" is cuda when a GPU is usable
 * (the cuda device's probe: GPU 0, or this rank's local one under a
 * launcher), else cpu, with why[n] saying which and why; "cuda" is
 * probed too (*p: its free memory for --gpu-mem auto); any other value is
 * returned as it is (*p zeroed, why empty). src/cli/cli_device.c. */
struct st_device_probe;
/* The default of --device: $ST_DEVICE when set (auto or a built device;
 * else exit 2), else auto. The test suite sets ST_DEVICE=cpu, so that its
 * tests keep the cpu device on a machine with a GPU unless they name one. */
const char *st_cli_device_default(void);
const char *st_cli_device(const char *asked, struct st_device_probe *p, char *why, size_t n);
/* --gpu-mem auto: on the cuda device the GPU's free memory (*p, its
 * probe) less a margin of max(ST_CLI_GPU_MARGIN_MIN, 5% of its total) for
 * what the process takes beside the arena (the CUDA context, cuBLASLt's
 * workspace, NCCL's buffers), in whole MiB; on the cpu devices, whose
 * arena is host memory, a quarter of MemAvailable. --host-mem auto: half
 * of MemAvailable on the cuda device (pinned through cudaHostRegister), a
 * quarter on the cpu devices, there within RLIMIT_MEMLOCK's hard limit
 * (the host tier mlocks its region), in whole pages. Under a launcher the
 * ranks of a node share MemAvailable. why[n] says how; exit 2 when
 * nothing can be taken. */
#define ST_CLI_GPU_MARGIN_MIN (1024ull * ST_MiB)
uint64_t st_cli_gpu_mem_auto(const char *device, const struct st_device_probe *p, char *why,
			     size_t n);
uint64_t st_cli_host_mem_auto(const char *device, char *why, size_t n);
/* "--gpu-mem auto: 5.67 GiB (why)" and the host's, for those with a why. */
void st_cli_print_auto_budgets(uint64_t gpu, const char *gpu_why, uint64_t host,
			       const char *host_why);
/* --device, --gpu-mem and --host-mem as train and eval take them: the
 * flags' values (st_cli_budget_arg()), then st_cli_budgets_resolve():
 * --device auto resolved, on cuda the budgets not given are auto (wherever
 * auto_default asks, on every device), the auto ones computed; then
 * st_cli_budgets_print() says what auto chose. */
#include "strata/device.h"
struct st_cli_budgets {
	bool gpu_auto, host_auto;     /* --gpu-mem auto, --host-mem auto */
	bool gpu_given, host_given;
	bool auto_default;            /* a budget not given is auto on every device */
	char device_why[512];         /* --device auto: which and why */
	char gpu_why[256], host_why[256];
	struct st_device_probe probe; /* the GPU's, for --gpu-mem auto */
};
/* --gpu-mem (gpu) or --host-mem's value: SIZE into *bytes, or auto. */
void st_cli_budget_arg(struct st_cli_budgets *b, bool gpu, const char *arg, uint64_t *bytes);
void st_cli_budgets_resolve(struct st_cli_budgets *b, const char **device, uint64_t *gpu_bytes,
			    uint64_t *host_bytes);
void st_cli_budgets_print(const struct st_cli_budgets *b, const char *device, uint64_t gpu_bytes,
			  uint64_t host_bytes);
/* Strict number parsing for flag; exit 2 with one line when out of range. */
long st_cli_long(const char *flag, const char *s, long lo, long hi);
double st_cli_double(const char *flag, const char *s, double lo, double hi);
/* A byte size for flag ("512M", "4G"); exit 2 with one line when it is
 * not one, or when it is 0. */
uint64_t st_cli_size(const char *flag, const char *s);
/* --offload-params / --offload-optim values; none only where allowed. */
#include "strata/plan.h"
enum st_offload st_cli_offload(const char *flag, const char *s, bool allow_none);
/* --offload-activations auto|vram|host: AUTO, NONE or HOST (else exit 2) */
enum st_offload st_cli_offload_act(const char *s);
/* --recompute auto|all|none. */
enum st_recompute st_cli_recompute(const char *s);
/* --schedule batch-first|layer-first|auto. */
enum st_schedule st_cli_schedule(const char *s);
/* --update after|in-backward|auto. */
enum st_update_order st_cli_update_order(const char *s);
/* Every directory of DIR[,DIR...] exists (and is writable when asked);
 * exit 2 with one line naming the first that is not. */
void st_cli_check_dirs(const char *flag, const char *list, bool writable);
/* OpenMP and BLAS threads (0: leave the default). */
void set_threads_cli(int n);
/* Open a token file for a model of the given vocabulary, or exit 2. */
struct st_dataset *st_cli_open_data(const char *path, int vocab);
/* A --data list: FILE[,FILE...], each a path or a glob(3) pattern (its
 * matches sorted, as glob sorts them), read in that order as one token
 * stream (st_dataset_concat); a single path is st_cli_open_data's. Exit 2
 * on a bad list, a pattern without a match or a bad file. */
struct st_dataset *st_cli_open_data_list(const char *spec, int vocab);
/* Whether paths a and b name one file, existing or not: the same
 * canonical name (the directory through realpath, the file's own name as
 * given), or, when both exist, the same inode. */
bool st_cli_same_file(const char *a, const char *b);
/* Exit 2, naming the strata tokenize command to run, when ds (given as
 * `flag data`, e.g. "--data") records a tokenizer (hash non-zero) other
 * than tok's: a tokenizer.json, or a folder holding one. tok NULL or an
 * unknown hash (0): nothing to check. */
void st_cli_check_shard_tokenizer(const struct st_dataset *ds, const char *flag,
				  const char *data, const char *tok);
/* Whether spec is a list or a pattern (not one file's name). */
bool st_cli_data_is_list(const char *spec);

/* Progress of long work on stderr: st_cli_progress(&p, "eval", done,
 * total, "batches") prints "eval: 12 of 100 batches, ETA 1m05s" at most
 * every 2 s, from 2 s after the first call (p zeroed before it: make that
 * call, with done 0, as the work starts); nothing under ST_QUIET. */
struct st_cli_progress {
	uint64_t t0, last;
};
void st_cli_progress(struct st_cli_progress *p, const char *what, double done, double total,
		     const char *unit);

int st_cli_train(int argc, char **argv);
int st_cli_plan(int argc, char **argv);
int st_cli_info(int argc, char **argv);
int st_cli_export(int argc, char **argv);
int st_cli_tokenize(int argc, char **argv);
int st_cli_generate(int argc, char **argv);
int st_cli_eval(int argc, char **argv);

/* The weights of --ckpt PATH (strata/weights.h: a checkpoint, verified; a
 * Hugging Face model; an llm.c model file) and their model into *mc, or
 * exit 2 (generate, eval). */
struct st_weights;
struct st_model_config;
struct st_trainer;
struct st_weights *st_cli_open_ckpt(const char *path, struct st_model_config *mc);
/* w into t, then w closed; a NaN or Inf is refused (exit 2) naming the
 * tensor and its index. */
void st_cli_load_ckpt(struct st_trainer *t, struct st_weights *w, const char *path);

/* The tokenizer for generate and eval: --tokenizer's (given, or NULL),
 * else a tokenizer.json beside the checkpoint (in ckpt, in ckpt/.., or
 * beside a file), else NULL. A file that does not open: exit 2. */
struct st_tokenizer;
struct st_tokenizer *st_cli_tokenizer(const char *given, const char *ckpt);
/* The directory of the tokenizer.json beside ckpt (in it, in ckpt/.., or
 * beside a file), into out[n]; false when there is none. */
bool st_cli_tokenizer_dir(const char *ckpt, char *out, size_t n);
/* Copy a Hugging Face tokenizer's files (tokenizer.json,
 * tokenizer_config.json, special_tokens_map.json, those present) from
 * directory from into to, each written whole or not at all; a file already
 * in to is left. Returns how many were copied; exit 1 naming the file on a
 * system error. */
int st_cli_tokenizer_copy(const char *from, const char *to);
/* --init's special tokens (bos_token_id, eos_token_id as an id or a list,
 * pad_token_id, from its config.json) into to/generation_config.json, as
 * save_pretrained() derives it, unless to has one (copied from --init by
 * st_cli_tokenizer_copy()) or --init's config.json names none. True when
 * written; exit 1 naming the file on a system error (src/cli/hf_meta.c). */
bool st_cli_generation_config(const char *init, const char *to);
/* Into the exported config.json at config: the special tokens' ids of the
 * source src (its config.json, else the generation_config.json beside it
 * or in tok_dir, NULL for none) and torch_dtype (bfloat16 or float32). */
void st_cli_hf_inference_keys(const char *config, const char *src, const char *tok_dir,
			      bool bf16);
/* text_path tokenized as one document (with the tokenizer's BOS/EOS) into
 * a new temporary llm.c shard, its path in out[n]; removed if the command
 * dies; the caller unlinks it once opened. Exit 2/1 on failure. */
int st_cli_text_shard(struct st_tokenizer *t, const char *text_path, char *out, size_t n);

#endif

/* strata: `strata export`, a checkpoint's weights for other programs:
 *   hf    a directory with model.safetensors (fp32 or bf16) and config.json,
 *         what transformers' from_pretrained() loads, with no optimizer
 *         state; above --shard-size (default 5e9 bytes) shards and
 *         model.safetensors.index.json, as save_pretrained() writes them
 *         and as a checkpoint holds them (strata/ckpt.h);
 *   llmc  one file in llm.c's GPT-2 model format (what train_gpt2.c reads
 *         as gpt2_124M.bin): 256 int32 of header (magic 20240326, version
 *         3 for fp32 or 5 for bf16, maxT, V, L, NH, C, padded V), then the
 *         parameters grouped by kind across layers, matrices as
 *         (out, in) where GPT-2's Conv1D keeps (in, out), the vocabulary
 *         padded to a multiple of 128 with zero rows.
 * The source is any that strata/weights.h reads: a strata checkpoint
 * (verified first), a Hugging Face directory (one file or shards), an llm.c
 * model file.
 * One tensor is in memory at a time.
 * The output appears whole or not at all: written under a temporary name
 * (removed on any failure and on SIGINT/SIGTERM/SIGHUP), fsynced, renamed
 * unless something is at --out by then. */
#include "cli.h"
#include "strata/ckpt.h"
#include "strata/family.h"
#include "strata/file.h"
#include "strata/io.h"
#include "strata/model.h"
#include "strata/optim.h"
#include "strata/weights.h"

#include <json-c/json.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

static void export_usage(FILE *f)
{
	fprintf(f,
"usage: strata export --ckpt SRC --out PATH [--format hf|llmc] [--dtype fp32|bf16]\n"
"                     [--shard-size SIZE]\n"
"\n"
"Write a model's weights for other programs: a checkpoint's fp32 master\n"
"weights P, or the weights of a Hugging Face directory or an llm.c model\n"
"file. SRC is a --save directory (its latest checkpoint), one step-N in it,\n"
"any directory with config.json and model.safetensors (or its shards and\n"
"model.safetensors.index.json), or an llm.c\n"
"model file (version 3 or 5, e.g. gpt2_124M.bin). A strata checkpoint is\n"
"verified first (sizes and XXH64). PATH must not exist; it appears whole or\n"
"not at all.\n"
"  --format hf     PATH is a directory: model.safetensors + config.json, for\n"
"                  transformers (from_pretrained), strata eval, generate and\n"
"                  --init (default); above --shard-size, shards\n"
"                  model-0000K-of-0000N.safetensors and their index,\n"
"                  model.safetensors.index.json, as save_pretrained writes them;\n"
"                  the tokenizer files beside SRC (tokenizer.json, ...) too\n"
"  --shard-size SIZE  most tensor data in a shard (default 5e9 bytes,\n"
"                  transformers' \"5GB\"; SIZE as 512M or 2G is binary units)\n"
"  --format llmc   PATH is one file in llm.c's GPT-2 model format\n"
"                  (train_gpt2.c's gpt2_124M.bin: version 3 is fp32, 5 is bf16)\n"
"  --dtype fp32|bf16  element type written (default fp32; bf16 rounds to\n"
"                  nearest even, as the working weights W are)\n"
"  -h, --help\n");
}

/* An output tensor: HF name and shape. */
struct out_tensor {
	char name[ST_MODEL_NAME_BYTES];
	int ndim;
	uint64_t shape[2];
};

/* The output's temporary (PATH.tmp.*), removed when the command dies or a
 * signal ends it: a directory (hf; tmp_dirfd open on it) or a file. Kept
 * in static storage, since a signal handler removes it. */
static char tmp_path[4096];
static int tmp_dirfd = -1;

/* Remove the temporary; async-signal-safe (getdents64, unlinkat, rmdir). */
static void tmp_remove(void)
{
	if (tmp_dirfd >= 0) { /* ours alone: whatever is in it goes */
		char buf[4096] __attribute__((aligned(8)));
		long n;

		lseek(tmp_dirfd, 0, SEEK_SET);
		while ((n = getdents64(tmp_dirfd, buf, sizeof(buf))) > 0)
			for (long off = 0; off < n;) {
				struct dirent64 *de = (struct dirent64 *)(buf + off);

				if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
					unlinkat(tmp_dirfd, de->d_name, 0);
				off += de->d_reclen;
			}
		rmdir(tmp_path);
	} else if (tmp_path[0]) {
		unlink(tmp_path);
	}
}

/* The temporary is no longer ours to remove (published, or gone). */
static void tmp_forget(void)
{
	if (tmp_dirfd >= 0)
		close(tmp_dirfd);
	tmp_dirfd = -1;
	tmp_path[0] = '\0';
}

static void undo(int code)
{
	(void)code;
	tmp_remove();
	tmp_forget();
}

static void on_signal(int sig)
{
	tmp_remove();
	signal(sig, SIG_DFL);
	raise(sig);
}

/* Signals that end the command: the temporary goes first. */
static void catch_signals(void)
{
	static const int sigs[] = { SIGINT, SIGTERM, SIGHUP };
	struct sigaction sa = { .sa_handler = on_signal };

	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < ST_ARRAY_LEN(sigs); i++)
		sigaddset(&sa.sa_mask, sigs[i]);
	for (size_t i = 0; i < ST_ARRAY_LEN(sigs); i++)
		sigaction(sigs[i], &sa, NULL);
}

/* Block those signals around publishing (the temporary becomes PATH). */
static void block_signals(bool block)
{
	sigset_t set;

	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGHUP);
	sigprocmask(block ? SIG_BLOCK : SIG_UNBLOCK, &set, NULL);
}

static void die_read(int ret)
{
	st_cli_die(st_cli_input_exit(ret), "%s", st_error_last());
}

/* Every tensor of the model in the checkpoint's order, from the model's
 * unit layouts. *n_out tensors; the largest's element count in *max_elems. */
static struct out_tensor *model_tensors(const struct st_model_config *mc, size_t *n_out,
					uint64_t *max_elems)
{
	struct st_model *m;
	struct out_tensor *t = NULL;
	size_t n = 0, cap = 0;

	*max_elems = 0;
	if (st_model_create(mc, &m) < 0)
		st_cli_die(2, "config.json: %s", st_error_last());
	for (int u = 0; u < st_model_unit_count(m); u++) {
		const struct st_unit_layout *ul = st_model_unit_layout(m, u);

		for (int i = 0; i < ul->n_tensors; i++) {
			const struct st_tensor_layout *tl = &ul->tensors[i];

			if (n == cap) {
				cap = cap ? 2 * cap : 64;
				t = realloc(t, cap * sizeof(*t));
				if (!t)
					st_cli_die(1, "out of memory");
			}
			snprintf(t[n].name, sizeof(t[n].name), "%s", tl->name);
			t[n].ndim = tl->ndim;
			t[n].shape[0] = (uint64_t)tl->shape[0];
			t[n].shape[1] = tl->ndim == 2 ? (uint64_t)tl->shape[1] : 1;
			*max_elems = ST_MAX(*max_elems, tl->n_elems);
			n++;
		}
	}
	st_model_destroy(m);
	*n_out = n;
	return t;
}

/* Every tensor there, of the right shape and a float type, before anything
 * is written: exit 2 naming the first that is not. */
static void check_all(struct st_weights *w, const struct out_tensor *t, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (st_weights_check(w, t[i].name, t[i].ndim, t[i].shape) < 0)
			st_cli_die(2, "%s", st_error_last());
}

/* --- hf ------------------------------------------------------------------------- */

struct hf_fill {
	struct st_weights *w;
	const struct out_tensor *t;
	bool bf16;
	size_t cached; /* index of the tensor in f32, or SIZE_MAX */
	float *f32;
	size_t n; /* tensors */
	struct st_cli_progress progress;
};

static int hf_fill(void *ctx, size_t ti, uint64_t off, void *buf, size_t len)
{
	struct hf_fill *h = ctx;

	if (h->cached != ti) {
		const struct out_tensor *t = &h->t[ti];
		int ret = st_weights_read(h->w, t->name, t->ndim, t->shape, h->f32);

		if (ret < 0)
			return ret; /* the writer removes its temporary, then we die */
		h->cached = ti;
		st_cli_progress(&h->progress, "export", (double)ti + 1, (double)h->n, "tensors");
	}
	if (!h->bf16) {
		memcpy(buf, (const char *)h->f32 + off, len);
		return 0;
	}
	for (size_t k = 0; k < len / 2; k++)
		((uint16_t *)buf)[k] = st_bf16_from_f32(h->f32[off / 2 + k]);
	return 0;
}

/* The architecture the config.json at path names (its architectures[0],
 * "LlamaForCausalLM", "Qwen2ForCausalLM", "GPT2LMHeadModel"), into arch;
 * the family's title when it names none. */
static void written_architecture(const char *path, const struct st_model_config *gc,
				 char *arch, size_t size)
{
	struct json_object *root = json_object_from_file(path), *v;

	snprintf(arch, size, "%s", st_model_config_family(gc)->title);
	if (root && json_object_object_get_ex(root, "architectures", &v) &&
	    json_object_is_type(v, json_type_array) && json_object_array_length(v) > 0 &&
	    json_object_is_type(json_object_array_get_idx(v, 0), json_type_string))
		snprintf(arch, size, "%s", json_object_get_string(json_object_array_get_idx(v, 0)));
	json_object_put(root);
}

static uint64_t export_hf(struct st_weights *w, const struct st_model_config *gc,
			  const char *src, const char *out, bool bf16, uint64_t shard_bytes,
			  size_t *n_files, char *arch, size_t arch_size)
{
	struct st_ckpt_layout l;
	struct st_sf_meta meta[] = { { "format", "pt" }, { "producer", "strata" } };
	struct hf_fill h = { .w = w, .bf16 = bf16, .cached = SIZE_MAX };
	struct st_ckpt_tensor *ct;
	struct out_tensor *t;
	uint64_t max_elems, params = 0;
	size_t n;
	char p[4096];
	int ret;

	t = model_tensors(gc, &n, &max_elems);
	check_all(w, t, n);
	ct = calloc(n, sizeof(*ct));
	h.f32 = malloc(max_elems * sizeof(float));
	if (!ct || !h.f32)
		st_cli_die(1, "out of memory");
	for (size_t i = 0; i < n; i++) {
		ct[i] = (struct st_ckpt_tensor){ .name = t[i].name,
						 .dtype = bf16 ? ST_SF_BF16 : ST_SF_F32,
						 .ndim = t[i].ndim,
						 .shape = { t[i].shape[0], t[i].shape[1] } };
		params += t[i].shape[0] * t[i].shape[1];
	}
	h.t = t;
	h.n = n;
	st_cli_progress(&h.progress, "export", 0, (double)n, "tensors"); /* the clock starts */
	snprintf(p, sizeof(p), "%.4000s.tmp.%ld", out, (long)getpid());
	block_signals(true); /* the directory is ours to remove from its first instant */
	if (mkdir(p, 0755) < 0) {
		ret = -errno;
		st_cli_die(ret == -EACCES || ret == -ENOENT || ret == -ENOTDIR || ret == -EROFS ? 2 : 1,
			   "--out %s: cannot create %s: %s", out, p, strerror(-ret));
	}
	snprintf(tmp_path, sizeof(tmp_path), "%s", p);
	tmp_dirfd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	block_signals(false);
	if (tmp_dirfd < 0)
		st_cli_die(1, "%s: %s", p, strerror(errno));
	ret = st_ckpt_layout_init(&l, ST_CKPT_MODEL_STEM, ct, n, meta, 2, shard_bytes);
	if (ret < 0)
		st_cli_die(ret == -EINVAL ? 2 : 1, "--out %s: %s", out, st_error_last());
	*n_files = l.n_files;
	ret = st_ckpt_layout_write(tmp_path, &l, ct, hf_fill, &h, NULL);
	st_ckpt_layout_fini(&l);
	if (ret < 0)
		die_read(ret);
	snprintf(p, sizeof(p), "%.4000s/%s", tmp_path, ST_CKPT_CONFIG_FILE);
	if (st_model_config_write(p, gc) < 0)
		st_cli_die(1, "%s", st_error_last());
	written_architecture(p, gc, arch, arch_size);
	/* the tokenizer beside the source (a --save DIR's, a Hugging Face
	 * directory's) goes with the model, as save_pretrained() puts it,
	 * and what inference reads into config.json */
	{
		char tdir[4096], cfg[4200];
		bool tok = st_cli_tokenizer_dir(src, tdir, sizeof(tdir));

		if (tok)
			st_cli_tokenizer_copy(tdir, tmp_path);
		snprintf(cfg, sizeof(cfg), "%.4000s/%s", tmp_path, ST_CKPT_CONFIG_FILE);
		st_cli_hf_inference_keys(cfg, st_weights_name(w), tok ? tdir : NULL, bf16);
	}
	/* both files are fsynced by their writers: publish the directory,
	 * unless something took PATH meanwhile */
	block_signals(true);
	ret = st_file_rename_new(tmp_path, out);
	if (ret < 0 && access(tmp_path, F_OK) == 0)
		st_cli_die(ret == -EEXIST || ret == -ENOTEMPTY ? 2 : 1, "--out %s", st_error_last());
	tmp_forget();
	block_signals(false);
	if (ret < 0)
		st_cli_die(1, "--out %s", st_error_last());
	free(h.f32);
	free(ct);
	free(t);
	return params;
}

/* --- llmc ----------------------------------------------------------------------- */

static void llmc_write(struct st_file_atomic *f, const float *x, uint64_t n, bool bf16,
		       uint16_t *tmp)
{
	int ret;

	if (bf16) {
		for (uint64_t k = 0; k < n; k++)
			tmp[k] = st_bf16_from_f32(x[k]);
		ret = st_file_atomic_write(f, tmp, n * sizeof(uint16_t));
	} else {
		ret = st_file_atomic_write(f, x, n * sizeof(float));
	}
	if (ret < 0)
		st_cli_die(1, "%s", st_error_last());
}

static uint64_t export_llmc(struct st_weights *w, const struct st_model_config *gc,
			    const char *out, bool bf16)
{
	uint64_t Vp = st_llmc_padded_vocab((uint64_t)gc->vocab), params = 0;
	uint64_t max_elems, C = (uint64_t)gc->dim;
	int32_t header[ST_LLMC_HEADER_INTS];
	struct st_file_atomic f;
	struct out_tensor *all;
	size_t n_all;
	float *a, *b;
	uint16_t *h16;
	int c;

	if (st_llmc_header_fill(gc, bf16, header) < 0)
		st_cli_die(2, "%s", st_error_last());
	all = model_tensors(gc, &n_all, &max_elems);
	check_all(w, all, n_all);
	/* a: any tensor as the file holds it (padded); b: the largest
	 * transposed matrix, 4C x C; h16: what is written, in bf16 */
	for (int g = 0; g < ST_LLMC_KINDS; g++)
		max_elems = ST_MAX(max_elems, st_llmc_kind_elems(gc, Vp, g));
	a = malloc(max_elems * sizeof(float));
	b = malloc(4 * C * C * sizeof(float));
	h16 = bf16 ? malloc(max_elems * sizeof(uint16_t)) : NULL;
	if (!a || !b || (bf16 && !h16))
		st_cli_die(1, "out of memory");
	block_signals(true);
	c = st_file_atomic_open(&f, out);
	if (c < 0)
		st_cli_die(c == -ENOENT || c == -EACCES || c == -ENOTDIR || c == -EROFS ? 2 : 1,
			   "--out %s", st_error_last());
	snprintf(tmp_path, sizeof(tmp_path), "%s", f.tmp_path);
	block_signals(false);
	if (st_file_atomic_write(&f, header, sizeof(header)) < 0)
		st_cli_die(1, "%s", st_error_last());
	struct st_cli_progress pr = { 0 };
	size_t done = 0;

	st_cli_progress(&pr, "export", 0, (double)n_all, "tensors"); /* the clock starts */

	for (int g = 0; g < ST_LLMC_KINDS; g++) {
		int layers = st_llmc_kinds[g].per_layer ? gc->n_layer : 1;

		for (int l = 0; l < layers; l++) {
			struct out_tensor t = { 0 };
			const struct out_tensor *like = NULL;
			uint64_t n;

			st_llmc_tensor_name(g, l, t.name, sizeof(t.name));
			for (size_t i = 0; i < n_all && !like; i++)
				if (strcmp(all[i].name, t.name) == 0)
					like = &all[i];
			if (!like)
				st_cli_die(1, "export: the model has no tensor %s", t.name);
			t = *like;
			n = t.shape[0] * t.shape[1];
			c = st_weights_read(w, t.name, t.ndim, t.shape, a);
			if (c < 0)
				die_read(c);
			if (st_llmc_kinds[g].transpose) {
				st_llmc_transpose(b, a, t.shape[0], t.shape[1]);
				llmc_write(&f, b, n, bf16, h16);
			} else { /* zero padding to the file's size (the vocabulary's) */
				uint64_t n_file = st_llmc_kind_elems(gc, Vp, g);

				memset(a + n, 0, (n_file - n) * sizeof(float));
				llmc_write(&f, a, n_file, bf16, h16);
			}
			params += t.shape[0] * t.shape[1];
			st_cli_progress(&pr, "export", (double)++done, (double)n_all, "tensors");
		}
	}
	block_signals(true); /* fsync, close, rename: then the file is PATH's */
	c = st_file_atomic_commit_new(&f); /* removes the temporary when not renamed */
	tmp_forget();
	block_signals(false);
	if (c < 0)
		st_cli_die(c == -EEXIST ? 2 : 1, "--out %s", st_error_last());
	free(a);
	free(b);
	free(h16);
	free(all);
	return params;
}

int st_cli_export(int argc, char **argv)
{
	static const struct option longs[] = {
		{ "ckpt", 1, 0, 'c' }, { "out", 1, 0, 'o' }, { "format", 1, 0, 'f' },
		{ "dtype", 1, 0, 'd' }, { "shard-size", 1, 0, 's' }, { "help", 0, 0, 'h' },
		{ 0 },
	};
	const char *ckpt = NULL, *format = "hf", *dtype = "fp32";
	uint64_t shard_bytes = 0;
	size_t n_files = 1;
	char out[4096] = "", arch[128] = "";
	struct st_weights *w;
	struct st_model_config gc;
	struct stat sb;
	uint64_t params;
	bool bf16;
	int c;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		switch (c) {
		case 'c': ckpt = optarg; break;
		case 'o':
			if (strlen(optarg) >= sizeof(out))
				st_cli_die(2, "--out: a path of %zu bytes is too long", strlen(optarg));
			snprintf(out, sizeof(out), "%s", optarg);
			for (size_t n = strlen(out); n > 1 && out[n - 1] == '/';)
				out[--n] = '\0'; /* "dir/" names dir: the temporary goes next to it */
			break;
		case 'f': format = optarg; break;
		case 'd': dtype = optarg; break;
		case 's': shard_bytes = st_cli_size("--shard-size", optarg); break;
		case 'h': export_usage(stdout); return 0;
		default:
			st_cli_bad_option("export", longs, argv[optind - 1]);
		}
	}
	if (optind < argc)
		st_cli_die(2, "export: unexpected argument %s", argv[optind]);
	if (!ckpt || !out[0])
		st_cli_die(2, "export: --ckpt SRC and --out PATH are required");
	if (strcmp(format, "hf") != 0 && strcmp(format, "llmc") != 0)
		st_cli_die(2, "--format %s: expected hf or llmc", format);
	if (strcmp(dtype, "fp32") != 0 && strcmp(dtype, "bf16") != 0)
		st_cli_die(2, "--dtype %s: expected fp32 or bf16", dtype);
	bf16 = strcmp(dtype, "bf16") == 0;
	if (lstat(out, &sb) == 0)
		st_cli_die(2, "--out %s exists; export writes a new %s", out,
			   strcmp(format, "hf") == 0 ? "directory" : "file");
	c = st_weights_open(ckpt, &w);
	if (c == 0)
		c = st_weights_config(w, &gc);
	if (c < 0)
		st_cli_die(st_cli_input_exit(c), "--ckpt %s: %s", ckpt, st_error_last());
	st_cli_at_die(undo);
	catch_signals();
	if (shard_bytes && strcmp(format, "hf") != 0)
		st_cli_die(2, "--shard-size: only --format hf is sharded");
	params = strcmp(format, "hf") == 0 ? export_hf(w, &gc, ckpt, out, bf16, shard_bytes, &n_files,
						       arch, sizeof(arch))
					   : export_llmc(w, &gc, out, bf16);
	st_cli_at_die(NULL);
	if (strcmp(format, "hf") == 0 && n_files > 1)
		printf("exported %s (%llu parameters, %s) to %s as a Hugging Face %s directory "
		       "(%s) in %zu shards\n", st_weights_name(w), (unsigned long long)params,
		       dtype, out, arch, st_model_config_family(&gc)->title, n_files);
	else if (strcmp(format, "hf") == 0)
		printf("exported %s (%llu parameters, %s) to %s as a Hugging Face %s directory "
		       "(%s)\n", st_weights_name(w), (unsigned long long)params, dtype, out, arch,
		       st_model_config_family(&gc)->title);
	else
		printf("exported %s (%llu parameters, %s) to %s as an llm.c model file\n",
		       st_weights_name(w), (unsigned long long)params, dtype, out);
	st_weights_close(w);
	return 0;
}

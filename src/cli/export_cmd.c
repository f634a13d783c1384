/* strata: `strata export`, a checkpoint's weights for other programs:
 *   hf    a directory with model.safetensors (fp32 or bf16) and config.json,
 *         what transformers' GPT2LMHeadModel.from_pretrained() loads, with
 *         no optimizer state;
 *   llmc  one file in llm.c's GPT-2 model format (what train_gpt2.c reads
 *         as gpt2_124M.bin): 256 int32 of header (magic 20240326, version
 *         3 for fp32 or 5 for bf16, maxT, V, L, NH, C, padded V), then the
 *         parameters grouped by kind across layers, matrices as
 *         (out, in) where GPT-2's Conv1D keeps (in, out), the vocabulary
 *         padded to a multiple of 128 with zero rows.
 * The source is a strata checkpoint (verified first), a directory with
 * config.json and a GPT-2 model.safetensors (fp32, bf16 or fp16, with or
 * without the "transformer." prefix), or an llm.c model file (read back
 * into Conv1D layout, the padding rows dropped). One tensor is in memory
 * at a time.
 * The output appears whole or not at all: written under a temporary name
 * (removed on any failure and on SIGINT/SIGTERM/SIGHUP), fsynced, renamed
 * unless something is at --out by then. */
#include "cli.h"
#include "strata/ckpt.h"
#include "strata/file.h"
#include "strata/io.h"
#include "strata/model.h"
#include "strata/optim.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#define LLMC_MAGIC 20240326
#define LLMC_VERSION_F32 3
#define LLMC_VERSION_BF16 5
#define LLMC_VOCAB_MULTIPLE 128

static void export_usage(FILE *f)
{
	fprintf(f,
"usage: strata export --ckpt DIR --out PATH [--format hf|llmc] [--dtype fp32|bf16]\n"
"\n"
"Write a model's weights for other programs: a checkpoint's fp32 master\n"
"weights P, or the weights of a Hugging Face GPT-2 directory or an llm.c model\n"
"file. DIR is a --save directory (its latest checkpoint), one step-N in it,\n"
"any directory with config.json and a GPT-2 model.safetensors, or an llm.c\n"
"model file (version 3 or 5, e.g. gpt2_124M.bin). A strata checkpoint is\n"
"verified first (sizes and XXH64). PATH must not exist; it appears whole or\n"
"not at all.\n"
"  --format hf     PATH is a directory: model.safetensors + config.json, for\n"
"                  transformers (GPT2LMHeadModel.from_pretrained), strata eval,\n"
"                  generate and --init (default)\n"
"  --format llmc   PATH is one file in llm.c's GPT-2 model format\n"
"                  (train_gpt2.c's gpt2_124M.bin: version 3 is fp32, 5 is bf16)\n"
"  --dtype fp32|bf16  element type written (default fp32; bf16 rounds to\n"
"                  nearest even, as the working weights W are)\n"
"  -h, --help\n");
}

/* llm.c's parameter order: each kind for every layer in turn; transpose:
 * a Conv1D (in, out) matrix that llm.c keeps as (out, in); a kind's
 * elements per layer are cc * C * C + c * C (wte and wpe: see
 * llmc_kind_elems()). */
static const struct {
	const char *suffix;
	bool per_layer, transpose;
	unsigned cc, c;
} llmc_order[] = {
	{ "wte.weight", false, false, 0, 0 },      { "wpe.weight", false, false, 0, 0 },
	{ "ln_1.weight", true, false, 0, 1 },      { "ln_1.bias", true, false, 0, 1 },
	{ "attn.c_attn.weight", true, true, 3, 0 }, { "attn.c_attn.bias", true, false, 0, 3 },
	{ "attn.c_proj.weight", true, true, 1, 0 }, { "attn.c_proj.bias", true, false, 0, 1 },
	{ "ln_2.weight", true, false, 0, 1 },      { "ln_2.bias", true, false, 0, 1 },
	{ "mlp.c_fc.weight", true, true, 4, 0 },   { "mlp.c_fc.bias", true, false, 0, 4 },
	{ "mlp.c_proj.weight", true, true, 4, 0 }, { "mlp.c_proj.bias", true, false, 0, 1 },
	{ "ln_f.weight", false, false, 0, 1 },     { "ln_f.bias", false, false, 0, 1 },
};

/* The weights being exported. */
struct src {
	char *dir;
	char *path; /* dir/model.safetensors, or the llm.c file */
	struct st_gpt2_config gc;
	struct st_ckpt_reader *r; /* safetensors, or NULL for an llm.c file: */
	int fd;                   /* the llm.c file */
	unsigned esize;           /* its element size: 4 (version 3) or 2 (5) */
	uint64_t vp;              /* its padded vocabulary */
};

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

static bool exists(const char *dir, const char *name)
{
	char p[4096];
	struct stat sb;

	snprintf(p, sizeof(p), "%.4000s/%s", dir, name);
	return stat(p, &sb) == 0;
}

/* Exit for a source that cannot be read: 2 when it is bad input (missing,
 * not a directory, malformed or damaged: -EINVAL), else 1 (an I/O error). */
static void die_src(int ret, const char *dir)
{
	st_cli_die(ret == -EINVAL || ret == -ENOENT || ret == -ENOTDIR ? 2 : 1, "--ckpt %s: %s",
		   dir, st_error_last());
}

/* A Hugging Face config.json's fields that would make another model than
 * the GPT-2 strata computes and export writes (its config.json has GPT-2's
 * fixed values): refused. */
static void check_hf_config(const char *path, const char *dir)
{
	struct json_object *root = json_object_from_file(path), *v;

	if (!root)
		st_cli_die(2, "--ckpt %s: %s is not JSON", dir, path);
	if (json_object_object_get_ex(root, "tie_word_embeddings", &v) &&
	    json_object_is_type(v, json_type_boolean) && !json_object_get_boolean(v))
		st_cli_die(2, "--ckpt %s: an untied head (tie_word_embeddings false) is not GPT-2 "
			   "as strata trains it", dir);
	if (json_object_object_get_ex(root, "activation_function", &v) &&
	    strcmp(json_object_get_string(v), "gelu_new") != 0)
		st_cli_die(2, "--ckpt %s: activation_function %s; strata's GPT-2 uses gelu_new",
			   dir, json_object_get_string(v));
	if (json_object_object_get_ex(root, "layer_norm_epsilon", &v) &&
	    json_object_get_double(v) != 1e-5)
		st_cli_die(2, "--ckpt %s: layer_norm_epsilon %g; strata's GPT-2 uses 1e-05", dir,
			   json_object_get_double(v));
	json_object_put(root);
}

/* dst (cols x rows) = src (rows x cols) transposed: Conv1D's (in, out)
 * and llm.c's (out, in), either way. */
static void transpose(float *dst, const float *src, uint64_t rows, uint64_t cols)
{
	for (uint64_t i = 0; i < rows; i++)
		for (uint64_t j = 0; j < cols; j++)
			dst[j * rows + i] = src[i * cols + j];
}

/* Elements per layer of llm.c's kind g. */
static uint64_t llmc_kind_elems(const struct st_gpt2_config *gc, uint64_t vp, size_t g)
{
	uint64_t C = (uint64_t)gc->n_embd;

	if (g == 0)
		return vp * C; /* wte, padded */
	if (g == 1)
		return (uint64_t)gc->n_positions * C;
	return llmc_order[g].cc * C * C + llmc_order[g].c * C;
}

/* An llm.c model file as the source: header checked, size checked. */
static void llmc_open(struct src *s, const char *path)
{
	int32_t h[256];
	uint64_t bytes = 0, elems = 0;
	int ret;

	ret = st_file_open_regular(path, &s->fd, &bytes);
	if (ret == 0)
		ret = st_file_pread_full(s->fd, h, sizeof(h), 0, path);
	if (ret < 0)
		die_src(ret == -EIO && bytes < sizeof(h) ? -EINVAL : ret, path);
	if (h[0] != LLMC_MAGIC)
		st_cli_die(2, "--ckpt %s: neither a checkpoint directory nor an llm.c model file "
			   "(magic %d, not %d)", path, h[0], LLMC_MAGIC);
	if (h[1] != LLMC_VERSION_F32 && h[1] != LLMC_VERSION_BF16)
		st_cli_die(2, "--ckpt %s: llm.c model version %d (3 and 5 are known)", path, h[1]);
	for (int i = 2; i < 8; i++)
		if (h[i] <= 0)
			st_cli_die(2, "--ckpt %s: llm.c header field %d is %d", path, i, h[i]);
	if (h[7] < h[3] || h[6] % h[5] != 0)
		st_cli_die(2, "--ckpt %s: llm.c header: padded vocab %d < vocab %d, or %d heads do "
			   "not divide dim %d", path, h[7], h[3], h[5], h[6]);
	s->gc = (struct st_gpt2_config){ .n_positions = h[2], .vocab_size = h[3],
					 .n_layer = h[4], .n_head = h[5], .n_embd = h[6] };
	s->vp = (uint64_t)h[7];
	s->esize = h[1] == LLMC_VERSION_F32 ? 4 : 2;
	for (size_t g = 0; g < ST_ARRAY_LEN(llmc_order); g++)
		elems += llmc_kind_elems(&s->gc, s->vp, g) *
			 (llmc_order[g].per_layer ? (uint64_t)s->gc.n_layer : 1);
	if (bytes != sizeof(h) + elems * s->esize)
		st_cli_die(2, "--ckpt %s: %llu bytes; its header says %llu", path,
			   (unsigned long long)bytes,
			   (unsigned long long)(sizeof(h) + elems * s->esize));
	s->dir = strdup(path);
	s->path = strdup(path);
	if (!s->dir || !s->path)
		st_cli_die(1, "out of memory");
}

/* Tensor t (a Hugging Face name) from the llm.c file, as fp32 in Conv1D
 * layout. Returns 0 or -errno. */
static int llmc_read(struct src *s, const struct out_tensor *t, float *out)
{
	uint64_t n = t->shape[0] * t->shape[1], off = 256 * sizeof(int32_t) / s->esize;
	const char *suffix = t->name;
	int layer = 0, len = 0;
	float *tmp = NULL;
	void *raw;
	size_t g;
	int ret;

	if (sscanf(t->name, "h.%d.%n", &layer, &len) == 1 && len > 0)
		suffix = t->name + len;
	for (g = 0; g < ST_ARRAY_LEN(llmc_order); g++) {
		if (strcmp(llmc_order[g].suffix, suffix) == 0)
			break;
		off += llmc_kind_elems(&s->gc, s->vp, g) *
		       (llmc_order[g].per_layer ? (uint64_t)s->gc.n_layer : 1);
	}
	if (g == ST_ARRAY_LEN(llmc_order))
		return st_error_set(-EINVAL, "%s: no tensor %s in llm.c's layout", s->path, t->name);
	off += (uint64_t)layer * llmc_kind_elems(&s->gc, s->vp, g);
	raw = malloc(n * s->esize);
	if (llmc_order[g].transpose)
		tmp = malloc(n * sizeof(float));
	if (!raw || (llmc_order[g].transpose && !tmp)) {
		free(raw);
		return st_error_set(-ENOMEM, "out of memory");
	}
	ret = st_file_pread_full(s->fd, raw, n * s->esize, off * s->esize, s->path);
	if (ret == 0) {
		float *dst = tmp ? tmp : out;

		for (uint64_t k = 0; k < n; k++)
			dst[k] = s->esize == 4 ? ((const float *)raw)[k]
					       : st_f32_from_bf16(((const uint16_t *)raw)[k]);
		if (tmp) /* stored (out, in) = (shape[1], shape[0]) */
			transpose(out, tmp, t->shape[1], t->shape[0]);
	}
	free(raw);
	free(tmp);
	return ret;
}

/* Find the checkpoint (or HF directory, or llm.c file), verify it, read
 * its config. */
static void src_open(struct src *s, const char *dir)
{
	char p[4096];
	int ret;

	struct stat sb;

	memset(s, 0, sizeof(*s));
	s->fd = -1;
	if (stat(dir, &sb) < 0)
		st_cli_die(2, "--ckpt %s: %s", dir, strerror(errno));
	if (S_ISREG(sb.st_mode)) {
		llmc_open(s, dir);
		return;
	}
	if (!exists(dir, ST_CKPT_TRAINER_FILE) && exists(dir, ST_CKPT_OPTIM_FILE))
		st_cli_die(2, "--ckpt %s: a strata checkpoint without its %s (damaged)", dir,
			   ST_CKPT_TRAINER_FILE);
	if (!exists(dir, ST_CKPT_TRAINER_FILE) && exists(dir, ST_CKPT_CONFIG_FILE) &&
	    exists(dir, ST_CKPT_MODEL_FILE)) {
		s->dir = strdup(dir); /* a Hugging Face directory: nothing to verify */
		snprintf(p, sizeof(p), "%.4000s/%s", dir, ST_CKPT_CONFIG_FILE);
		check_hf_config(p, dir);
	} else {
		struct st_ckpt_trainer tr;

		ret = st_ckpt_resolve(dir, &s->dir);
		if (ret < 0)
			st_cli_die(ret == -ENOENT || ret == -ENOTDIR ? 2 : 1, "--ckpt %s",
				   st_error_last());
		snprintf(p, sizeof(p), "%.4000s/%s", s->dir, ST_CKPT_TRAINER_FILE);
		ret = st_ckpt_trainer_read(p, &tr);
		if (ret == 0) {
			ret = st_ckpt_verify(s->dir, &tr);
			st_ckpt_trainer_fini(&tr);
		}
		if (ret < 0)
			die_src(ret, dir);
	}
	if (!s->dir)
		st_cli_die(1, "out of memory");
	snprintf(p, sizeof(p), "%.4000s/%s", s->dir, ST_CKPT_CONFIG_FILE);
	ret = st_gpt2_config_read(p, &s->gc);
	if (ret < 0)
		die_src(ret, dir);
	snprintf(p, sizeof(p), "%.4000s/%s", s->dir, ST_CKPT_MODEL_FILE);
	s->path = strdup(p);
	if (!s->path)
		st_cli_die(1, "out of memory");
	ret = st_ckpt_reader_open(&s->r, s->path);
	if (ret < 0)
		die_src(ret, dir);
}

static void src_close(struct src *s)
{
	st_ckpt_reader_close(s->r);
	if (s->fd >= 0)
		close(s->fd);
	free(s->dir);
	free(s->path);
}

/* The source's tensor for t: name (or "transformer." name), shape, a float
 * type. Returns 0; -EINVAL (bad input) with the detail. */
static int src_find(struct src *s, const struct out_tensor *t, const struct st_sf_info **out)
{
	const struct st_safetensors *sf = st_ckpt_reader_file(s->r);
	const struct st_sf_info *info = st_safetensors_find(sf, t->name);
	char alt[ST_MODEL_NAME_BYTES + 16];

	if (!info) {
		snprintf(alt, sizeof(alt), "transformer.%s", t->name);
		info = st_safetensors_find(sf, alt);
	}
	if (!info)
		return st_error_set(-EINVAL, "%s: tensor %s is missing", s->path, t->name);
	if (info->ndim != t->ndim || info->shape[0] != t->shape[0] ||
	    (t->ndim == 2 && info->shape[1] != t->shape[1]))
		return st_error_set(-EINVAL, "%s: tensor %s has the wrong shape for config.json's model",
				    s->path, t->name);
	if (info->dtype != ST_SF_F32 && info->dtype != ST_SF_BF16 && info->dtype != ST_SF_F16)
		return st_error_set(-EINVAL, "%s: tensor %s is %s, not a float type", s->path, t->name,
				    st_sf_dtype_name(info->dtype));
	*out = info;
	return 0;
}

/* Tensor t of the source as fp32 into out (t->shape[0] * t->shape[1]
 * elements). Returns 0, src_find()'s -EINVAL, or -errno from reading. */
static int src_read(struct src *s, const struct out_tensor *t, float *out)
{
	const struct st_sf_info *info;
	uint64_t n = t->shape[0] * t->shape[1];
	void *raw;
	int ret;

	if (!s->r)
		return llmc_read(s, t, out);
	ret = src_find(s, t, &info);
	if (ret < 0)
		return ret;
	if (info->dtype == ST_SF_F32)
		return st_ckpt_reader_pread(s->r, info, 0, out, n * sizeof(float));
	raw = malloc(n * sizeof(uint16_t));
	if (!raw)
		return st_error_set(-ENOMEM, "out of memory");
	ret = st_ckpt_reader_pread(s->r, info, 0, raw, n * sizeof(uint16_t));
	for (uint64_t k = 0; ret == 0 && k < n; k++) {
		uint16_t h = ((const uint16_t *)raw)[k];

		out[k] = info->dtype == ST_SF_BF16 ? st_f32_from_bf16(h) : st_f32_from_f16(h);
	}
	free(raw);
	return ret;
}

static void die_read(int ret)
{
	st_cli_die(ret == -EINVAL ? 2 : 1, "%s", st_error_last());
}

/* Every tensor of the model in the checkpoint's order, from the model's
 * unit layouts. *n_out tensors; the largest's element count in *max_elems. */
static struct out_tensor *model_tensors(const struct st_gpt2_config *gc, size_t *n_out,
					uint64_t *max_elems)
{
	struct st_model_config mc = { .n_layer = (int)gc->n_layer, .n_embd = (int)gc->n_embd,
				      .n_head = (int)gc->n_head, .vocab = (int)gc->vocab_size,
				      .ctx = (int)gc->n_positions };
	struct st_model *m;
	struct out_tensor *t = NULL;
	size_t n = 0, cap = 0;

	*max_elems = 0;
	if (st_model_create(&mc, &m) < 0)
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
static void src_check(struct src *s, const struct out_tensor *t, size_t n)
{
	const struct st_sf_info *info;

	if (!s->r)
		return; /* an llm.c file: its header made the model, its size is checked */
	for (size_t i = 0; i < n; i++)
		if (src_find(s, &t[i], &info) < 0)
			st_cli_die(2, "%s", st_error_last());
}

/* --- hf ------------------------------------------------------------------------- */

struct hf_fill {
	struct src *s;
	const struct out_tensor *t;
	bool bf16;
	size_t cached; /* index of the tensor in f32, or SIZE_MAX */
	float *f32;
};

static int hf_fill(void *ctx, size_t ti, uint64_t off, void *buf, size_t len)
{
	struct hf_fill *h = ctx;

	if (h->cached != ti) {
		int ret = src_read(h->s, &h->t[ti], h->f32);

		if (ret < 0)
			return ret; /* the writer removes its temporary, then we die */
		h->cached = ti;
	}
	if (!h->bf16) {
		memcpy(buf, (const char *)h->f32 + off, len);
		return 0;
	}
	for (size_t k = 0; k < len / 2; k++)
		((uint16_t *)buf)[k] = st_bf16_from_f32(h->f32[off / 2 + k]);
	return 0;
}

static uint64_t export_hf(struct src *s, const char *out, bool bf16)
{
	struct st_sf_meta meta[] = { { "format", "pt" }, { "producer", "strata" } };
	struct hf_fill h = { .s = s, .bf16 = bf16, .cached = SIZE_MAX };
	struct st_ckpt_tensor *ct;
	struct out_tensor *t;
	uint64_t max_elems, params = 0;
	size_t n;
	char p[4096];
	int ret;

	t = model_tensors(&s->gc, &n, &max_elems);
	src_check(s, t, n);
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
	snprintf(p, sizeof(p), "%.4000s/%s", tmp_path, ST_CKPT_MODEL_FILE);
	ret = st_ckpt_write_safetensors(p, ct, n, meta, 2, hf_fill, &h, NULL, NULL);
	if (ret < 0)
		die_read(ret);
	snprintf(p, sizeof(p), "%.4000s/%s", tmp_path, ST_CKPT_CONFIG_FILE);
	if (st_gpt2_config_write(p, &s->gc) < 0)
		st_cli_die(1, "%s", st_error_last());
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

static uint64_t export_llmc(struct src *s, const char *out, bool bf16)
{
	const struct st_gpt2_config *gc = &s->gc;
	uint64_t V = (uint64_t)gc->vocab_size, C = (uint64_t)gc->n_embd, params = 0;
	uint64_t Vp = (V + LLMC_VOCAB_MULTIPLE - 1) / LLMC_VOCAB_MULTIPLE * LLMC_VOCAB_MULTIPLE;
	uint64_t max_elems;
	int32_t header[256] = { 0 };
	struct st_file_atomic f;
	struct out_tensor *all;
	size_t n_all;
	float *a, *b;
	uint16_t *h16;
	int c;

	if (gc->n_positions > INT32_MAX || Vp > INT32_MAX || gc->n_layer > INT32_MAX ||
	    gc->n_head > INT32_MAX || gc->n_embd > INT32_MAX)
		st_cli_die(2, "--format llmc: the model's sizes do not fit llm.c's int32 header");
	all = model_tensors(gc, &n_all, &max_elems);
	src_check(s, all, n_all);
	/* a: any tensor, wte with its padding; b: the largest transposed
	 * matrix, 4C x C; h16: what is written, in bf16 */
	max_elems = ST_MAX(max_elems, Vp * C);
	a = malloc(max_elems * sizeof(float));
	b = malloc(4 * C * C * sizeof(float));
	h16 = bf16 ? malloc(max_elems * sizeof(uint16_t)) : NULL;
	if (!a || !b || (bf16 && !h16))
		st_cli_die(1, "out of memory");
	header[0] = LLMC_MAGIC;
	header[1] = bf16 ? LLMC_VERSION_BF16 : LLMC_VERSION_F32;
	header[2] = (int32_t)gc->n_positions;
	header[3] = (int32_t)V;
	header[4] = (int32_t)gc->n_layer;
	header[5] = (int32_t)gc->n_head;
	header[6] = (int32_t)C;
	header[7] = (int32_t)Vp;
	block_signals(true);
	c = st_file_atomic_open(&f, out);
	if (c < 0)
		st_cli_die(c == -ENOENT || c == -EACCES || c == -ENOTDIR || c == -EROFS ? 2 : 1,
			   "--out %s", st_error_last());
	snprintf(tmp_path, sizeof(tmp_path), "%s", f.tmp_path);
	block_signals(false);
	if (st_file_atomic_write(&f, header, sizeof(header)) < 0)
		st_cli_die(1, "%s", st_error_last());
	for (size_t g = 0; g < ST_ARRAY_LEN(llmc_order); g++) {
		int layers = llmc_order[g].per_layer ? (int)gc->n_layer : 1;

		for (int l = 0; l < layers; l++) {
			struct out_tensor t = { 0 };
			const struct out_tensor *like = NULL;
			uint64_t n;

			if (llmc_order[g].per_layer)
				snprintf(t.name, sizeof(t.name), "h.%d.%s", l, llmc_order[g].suffix);
			else
				snprintf(t.name, sizeof(t.name), "%s", llmc_order[g].suffix);
			for (size_t i = 0; i < n_all && !like; i++)
				if (strcmp(all[i].name, t.name) == 0)
					like = &all[i];
			if (!like)
				st_cli_die(1, "export: the model has no tensor %s", t.name);
			t = *like;
			n = t.shape[0] * t.shape[1];
			c = src_read(s, &t, a);
			if (c < 0)
				die_read(c);
			if (llmc_order[g].transpose) {
				transpose(b, a, t.shape[0], t.shape[1]);
				llmc_write(&f, b, n, bf16, h16);
			} else {
				if (g == 0) { /* wte: zero rows up to Vp */
					memset(a + n, 0, (Vp - V) * C * sizeof(float));
					n = Vp * C;
				}
				llmc_write(&f, a, n, bf16, h16);
			}
			params += t.shape[0] * t.shape[1];
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
		{ "dtype", 1, 0, 'd' }, { "help", 0, 0, 'h' }, { 0 },
	};
	const char *ckpt = NULL, *format = "hf", *dtype = "fp32";
	char out[4096] = "";
	struct src s;
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
		case 'h': export_usage(stdout); return 0;
		default:
			st_cli_die(2, "export: unknown or incomplete option %s (see strata export --help)",
				   argv[optind - 1]);
		}
	}
	if (optind < argc)
		st_cli_die(2, "export: unexpected argument %s", argv[optind]);
	if (!ckpt || !out[0])
		st_cli_die(2, "export: --ckpt DIR and --out PATH are required");
	if (strcmp(format, "hf") != 0 && strcmp(format, "llmc") != 0)
		st_cli_die(2, "--format %s: expected hf or llmc", format);
	if (strcmp(dtype, "fp32") != 0 && strcmp(dtype, "bf16") != 0)
		st_cli_die(2, "--dtype %s: expected fp32 or bf16", dtype);
	bf16 = strcmp(dtype, "bf16") == 0;
	if (lstat(out, &sb) == 0)
		st_cli_die(2, "--out %s exists; export writes a new %s", out,
			   strcmp(format, "hf") == 0 ? "directory" : "file");
	src_open(&s, ckpt);
	st_cli_at_die(undo);
	catch_signals();
	params = strcmp(format, "hf") == 0 ? export_hf(&s, out, bf16) : export_llmc(&s, out, bf16);
	st_cli_at_die(NULL);
	printf("exported %s (%llu parameters, %s) to %s as %s\n", s.dir, (unsigned long long)params,
	       dtype, out,
	       strcmp(format, "hf") == 0 ? "a Hugging Face GPT-2 directory" : "an llm.c model file");
	src_close(&s);
	return 0;
}

/* A model's weights from a strata checkpoint, a Hugging Face directory or
 * file, or an llm.c model file (strata/weights.h). */
#include "strata/weights.h"
#include "sf_internal.h"
#include "strata/ckpt.h"
#include "strata/family.h"
#include "strata/file.h"
#include "strata/optim.h" /* st_f32_from_bf16(), st_f32_from_f16(): inline */

#include <errno.h>
#include <fnmatch.h>
#include <json-c/json.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const struct st_llmc_kind st_llmc_kinds[ST_LLMC_KINDS] = {
	{ "wte.weight", false, false, 0, 0, 0 },      { "wpe.weight", false, false, 0, 0, 0 },
	{ "ln_1.weight", true, false, 0, 1, 0 },      { "ln_1.bias", true, false, 0, 1, 0 },
	{ "attn.c_attn.weight", true, true, 3, 0, 1 }, { "attn.c_attn.bias", true, false, 0, 3, 0 },
	{ "attn.c_proj.weight", true, true, 1, 0, 1 }, { "attn.c_proj.bias", true, false, 0, 1, 0 },
	{ "ln_2.weight", true, false, 0, 1, 0 },      { "ln_2.bias", true, false, 0, 1, 0 },
	{ "mlp.c_fc.weight", true, true, 4, 0, 1 },   { "mlp.c_fc.bias", true, false, 0, 4, 0 },
	{ "mlp.c_proj.weight", true, true, 4, 0, 4 }, { "mlp.c_proj.bias", true, false, 0, 1, 0 },
	{ "ln_f.weight", false, false, 0, 1, 0 },     { "ln_f.bias", false, false, 0, 1, 0 },
};

uint64_t st_llmc_kind_elems(const struct st_model_config *mc, uint64_t vp, int g)
{
	uint64_t C = (uint64_t)mc->dim;

	if (g == 0)
		return vp * C; /* the token embedding, padded */
	if (g == 1)
		return (uint64_t)mc->ctx * C;
	return st_llmc_kinds[g].cc * C * C + st_llmc_kinds[g].c * C;
}

uint64_t st_llmc_padded_vocab(uint64_t V)
{
	return (V + ST_LLMC_VOCAB_MULTIPLE - 1) / ST_LLMC_VOCAB_MULTIPLE * ST_LLMC_VOCAB_MULTIPLE;
}

int st_llmc_header_fill(const struct st_model_config *mc, bool bf16,
			int32_t header[ST_LLMC_HEADER_INTS])
{
	uint64_t Vp = st_llmc_padded_vocab((uint64_t)mc->vocab);

	if (st_model_config_family(mc) != st_family_find("gpt2"))
		return st_error_set(-EINVAL, "--format llmc: llm.c's files hold GPT-2 models, "
				    "not %s", st_model_config_family(mc)->title);
	if (Vp > INT32_MAX)
		return st_error_set(-EINVAL, "--format llmc: the model's sizes do not fit llm.c's "
				    "int32 header");
	memset(header, 0, ST_LLMC_HEADER_INTS * sizeof(int32_t));
	header[0] = ST_LLMC_MODEL_MAGIC;
	header[1] = bf16 ? ST_LLMC_MODEL_BF16 : ST_LLMC_MODEL_F32;
	header[2] = mc->ctx;
	header[3] = mc->vocab;
	header[4] = mc->n_layer;
	header[5] = mc->n_head;
	header[6] = mc->dim;
	header[7] = (int32_t)Vp;
	return 0;
}

void st_llmc_tensor_name(int g, int l, char *buf, size_t bytes)
{
	if (st_llmc_kinds[g].per_layer)
		snprintf(buf, bytes, "h.%d.%s", l, st_llmc_kinds[g].suffix);
	else
		snprintf(buf, bytes, "%s", st_llmc_kinds[g].suffix);
}

void st_llmc_transpose(float *dst, const float *src, uint64_t rows, uint64_t cols)
{
	for (uint64_t i = 0; i < rows; i++)
		for (uint64_t j = 0; j < cols; j++)
			dst[j * rows + i] = src[i * cols + j];
}

struct st_weights {
	const char *format;        /* st_weights_format() */
	char *name;                /* for messages */
	char *path;                /* the file read: model.safetensors or llm.c's */
	struct st_model_config gc;
	bool have_config;
	struct st_ckpt_set *r;     /* safetensors (one file or shards), or NULL
				    * for an llm.c file: */
	int fd;
	unsigned esize;            /* 4 (version 3) or 2 (version 5) */
	uint64_t vp;               /* padded vocabulary */
};

static char *join(const char *dir, const char *name)
{
	size_t n = strlen(dir) + strlen(name) + 2;
	char *p = malloc(n);

	if (p)
		snprintf(p, n, "%s/%s", dir, name);
	return p;
}

static bool exists_in(const char *dir, const char *name)
{
	char *p = join(dir, name);
	struct stat sb;
	bool yes = p && stat(p, &sb) == 0;

	free(p);
	return yes;
}

/* The llm.c file path, already open as w->fd: header and size checked. */
static int llmc_open(struct st_weights *w, const char *path, uint64_t bytes)
{
	int32_t h[ST_LLMC_HEADER_INTS];
	uint64_t elems = 0;
	int ret = st_file_pread_full(w->fd, h, sizeof(h), 0, path);

	if (ret < 0)
		return bytes < sizeof(h) ? st_error_set(-EINVAL, "%s: %llu bytes, shorter than "
							"llm.c's header", path,
							(unsigned long long)bytes)
					 : ret;
	if (h[1] != ST_LLMC_MODEL_F32 && h[1] != ST_LLMC_MODEL_BF16)
		return st_error_set(-EINVAL, "%s: llm.c model version %d (3 and 5 are known)", path,
				    h[1]);
	for (int i = 2; i < 8; i++)
		if (h[i] <= 0)
			return st_error_set(-EINVAL, "%s: llm.c header field %d is %d", path, i, h[i]);
	if (h[7] < h[3] || h[6] % h[5] != 0)
		return st_error_set(-EINVAL, "%s: llm.c header: padded vocab %d < vocab %d, or %d "
				    "heads do not divide dim %d", path, h[7], h[3], h[5], h[6]);
	w->gc = (struct st_model_config){ .family = st_family_find("gpt2"), .ctx = h[2],
					  .vocab = h[3], .n_layer = h[4], .n_head = h[5],
					  .dim = h[6] };
	w->have_config = true;
	w->vp = (uint64_t)h[7];
	w->esize = h[1] == ST_LLMC_MODEL_F32 ? 4 : 2;
	w->format = w->esize == 4 ? "llm.c model file, version 3 (fp32)"
				  : "llm.c model file, version 5 (bf16)";
	if (h[6] > 65536 || h[4] > 4096) /* far past any GPT-2; keeps the sums below in range */
		return st_error_set(-EINVAL, "%s: llm.c header: %d layers of dim %d", path, h[4],
				    h[6]);
	for (int g = 0; g < ST_LLMC_KINDS; g++)
		elems += st_llmc_kind_elems(&w->gc, w->vp, g) *
			 (st_llmc_kinds[g].per_layer ? (uint64_t)w->gc.n_layer : 1);
	if (bytes != sizeof(h) + elems * w->esize)
		return st_error_set(-EINVAL, "%s: %llu bytes; its llm.c header says %llu", path,
				    (unsigned long long)bytes,
				    (unsigned long long)(sizeof(h) + elems * w->esize));
	return 0;
}

/* A file: llm.c's (by its magic), else safetensors (config.json beside). */
static int open_file(struct st_weights *w, const char *path)
{
	uint64_t bytes = 0;
	int32_t magic = 0;
	char *copy, *cfg;
	int ret = st_file_open_regular(path, &w->fd, &bytes);

	if (ret < 0)
		return ret;
	if (bytes >= sizeof(magic))
		ret = st_file_pread_full(w->fd, &magic, sizeof(magic), 0, path);
	if (ret == 0 && magic == ST_LLMC_MODEL_MAGIC) {
		char msg[512];

		ret = llmc_open(w, path, bytes);
		if (ret != -EINVAL)
			return ret;
		/* a safetensors header of exactly that length starts alike */
		snprintf(msg, sizeof(msg), "%s", st_error_last());
		w->have_config = false;
		if (st_ckpt_set_open_file(&w->r, path) < 0)
			return st_error_set(ret, "%s", msg); /* the llm.c reading's */
		ret = 0;
	} else {
		ret = ret < 0 ? ret : st_ckpt_set_open_file(&w->r, path);
	}
	close(w->fd);
	w->fd = -1;
	if (ret < 0)
		return ret;
	w->format = "Hugging Face safetensors";
	/* the config.json beside it, when a family reads it (a file given by
	 * name may sit next to anything) */
	copy = strdup(path);
	cfg = copy ? join(dirname(copy), ST_CKPT_CONFIG_FILE) : NULL;
	if (!cfg)
		ret = st_error_set(-ENOMEM, "out of memory");
	else if (access(cfg, F_OK) == 0 && st_model_config_read(cfg, &w->gc) == 0) {
		w->have_config = true;
		ret = st_model_config_hf_check(cfg);
	}
	free(copy);
	free(cfg);
	return ret;
}

/* A file of a checkpoint's weights: model.safetensors, its shards or their
 * index (what a strata checkpoint verifies before --init reads it). */
static bool is_model_file(const char *name)
{
	size_t n = strlen(name), k = strlen(ST_CKPT_MODEL_STEM);
	const char *ext = ".safetensors";

	if (strncmp(name, ST_CKPT_MODEL_STEM, k) != 0)
		return false;
	if (strcmp(name + k, ST_CKPT_INDEX_SUFFIX) == 0 || strcmp(name + k, ".safetensors") == 0)
		return true;
	return name[k] == '-' && n > k + strlen(ext) && strcmp(name + n - strlen(ext), ext) == 0;
}

/* A directory: a strata checkpoint (verified) or a Hugging Face one. */
static int open_dir(struct st_weights *w, const char *path)
{
	char *dir = NULL, *p;
	int ret, kind;
	bool trainer = exists_in(path, ST_CKPT_TRAINER_FILE);
	bool config = exists_in(path, ST_CKPT_CONFIG_FILE);

	if (!trainer && (exists_in(path, ST_CKPT_OPTIM_FILE) ||
			 exists_in(path, ST_CKPT_OPTIM_STEM ST_CKPT_INDEX_SUFFIX)))
		return st_error_set(-EINVAL, "%s: a strata checkpoint without its %s (damaged)",
				    path, ST_CKPT_TRAINER_FILE);
	kind = trainer ? 0 : st_ckpt_set_kind(path, ST_CKPT_MODEL_STEM);
	if (kind < 0)
		return kind;
	if (!trainer && !config && kind == 1) { /* its model.safetensors alone */
		char *file = join(path, ST_CKPT_MODEL_FILE);

		w->name = strdup(path);
		w->path = file;
		return file && w->name ? open_file(w, file) : st_error_set(-ENOMEM, "out of memory");
	}
	if (!trainer && config && kind == 0)
		return st_error_set(-EINVAL, "%s: config.json but no %s or %s%s%s", path,
				    ST_CKPT_MODEL_FILE, ST_CKPT_MODEL_STEM, ST_CKPT_INDEX_SUFFIX,
				    exists_in(path, "pytorch_model.bin") ||
				    exists_in(path, "pytorch_model.bin.index.json")
				    ? " (pytorch_model.bin is a pickle: strata reads safetensors)"
				    : "");
	if (!trainer && kind > 0) {
		dir = strdup(path); /* Hugging Face's: nothing to verify */
		w->format = "Hugging Face safetensors";
		if (config) {
			p = dir ? join(dir, ST_CKPT_CONFIG_FILE) : NULL;
			ret = p ? st_model_config_hf_check(p) : st_error_set(-ENOMEM, "out of memory");
			free(p);
		} else {
			ret = dir ? 0 : st_error_set(-ENOMEM, "out of memory");
		}
	} else {
		struct st_ckpt_trainer tr;

		w->format = "strata checkpoint";
		ret = st_ckpt_resolve(path, &dir);
		p = ret == 0 ? join(dir, ST_CKPT_TRAINER_FILE) : NULL;
		if (ret == 0 && !p)
			ret = st_error_set(-ENOMEM, "out of memory");
		if (ret == 0)
			ret = st_ckpt_trainer_read(p, &tr);
		free(p);
		if (ret == 0 && (ret = st_ckpt_check(dir, &tr)) < 0)
			st_ckpt_trainer_fini(&tr);
		if (ret == 0) { /* what is read here: the weights and the config */
			size_t k = 0;

			for (size_t i = 0; i < tr.n_files; i++)
				if (is_model_file(tr.files[i].name) ||
				    strcmp(tr.files[i].name, ST_CKPT_CONFIG_FILE) == 0)
					tr.files[k++] = tr.files[i];
			tr.n_files = k;
			ret = st_ckpt_verify(dir, &tr);
			st_ckpt_trainer_fini(&tr);
		}
	}
	w->name = dir;
	if (ret < 0)
		return ret;
	p = join(dir, ST_CKPT_CONFIG_FILE);
	ret = !p ? st_error_set(-ENOMEM, "out of memory")
		 : access(p, F_OK) == 0 || trainer ? st_model_config_read(p, &w->gc) : -ENOENT;
	free(p);
	w->have_config = ret == 0;
	if (ret == 0 || ret == -ENOENT) {
		ret = st_ckpt_set_open(&w->r, dir, ST_CKPT_MODEL_STEM);
		w->path = ret == 0 ? strdup(st_ckpt_set_path(w->r)) : NULL;
		if (ret == 0 && !w->path)
			ret = st_error_set(-ENOMEM, "out of memory");
	}
	return ret;
}

/* The name of a file's tensor as the model calls it: without the
 * "transformer." prefix transformers' GPT2LMHeadModel saves. */
static const char *model_name(const char *name)
{
	static const char prefix[] = "transformer.";

	return strncmp(name, prefix, sizeof(prefix) - 1) == 0 ? name + sizeof(prefix) - 1 : name;
}

/* With the model known: every tensor of it there, a float type, of its
 * shape; every other tensor of the files one the family derives (its
 * hf_derived list). So --init refuses a file before it reads a byte. */
static int check_model(struct st_weights *w)
{
	const struct st_family_ops *f = st_model_config_family(&w->gc);
	struct st_model *m;
	int ret = st_model_create(&w->gc, &m);

	if (ret < 0)
		return ret;
	for (int u = 0; ret == 0 && u < st_model_unit_count(m); u++) {
		const struct st_unit_layout *ul = st_model_unit_layout(m, u);

		for (int i = 0; ret == 0 && i < ul->n_tensors; i++) {
			const struct st_tensor_layout *tl = &ul->tensors[i];
			uint64_t shape[2] = { (uint64_t)tl->shape[0], (uint64_t)tl->shape[1] };

			ret = st_weights_check(w, tl->name, tl->ndim, shape);
		}
	}
	for (size_t k = 0; ret == 0 && k < st_ckpt_set_files(w->r); k++) {
		const struct st_safetensors *sf = st_ckpt_reader_file(st_ckpt_set_reader(w->r, k));

		for (size_t i = 0; ret == 0 && i < st_safetensors_count(sf); i++) {
			const char *name = model_name(st_safetensors_at(sf, i)->name);
			bool known = false;

			for (int u = 0; !known && u < st_model_unit_count(m); u++) {
				const struct st_unit_layout *ul = st_model_unit_layout(m, u);

				for (int j = 0; !known && j < ul->n_tensors; j++)
					known = strcmp(ul->tensors[j].name, name) == 0;
			}
			for (size_t d = 0; !known && f->hf_derived && f->hf_derived[d]; d++)
				known = fnmatch(f->hf_derived[d], name, 0) == 0;
			if (!known) {
				char shown[ST_SF_SHOW_LEN];

				ret = st_error_set(-EINVAL, "%s%s%s: tensor %s is not one of the "
						   "model's (%s) and not one %s derives",
						   st_ckpt_set_index_name(w->r)[0] ? w->name : w->path,
						   st_ckpt_set_index_name(w->r)[0] ? "/" : "",
						   st_ckpt_set_index_name(w->r)[0]
						   ? st_ckpt_set_file_name(w->r, k) : "",
						   st_sf_show(st_safetensors_at(sf, i)->name, shown),
						   f->title, f->title);
			}
		}
	}
	st_model_destroy(m);
	return ret;
}

int st_weights_open(const char *path, struct st_weights **out)
{
	struct st_weights *w = calloc(1, sizeof(*w));
	struct stat sb;
	int ret;

	*out = NULL;
	if (!w)
		return st_error_set(-ENOMEM, "out of memory");
	w->fd = -1;
	if (stat(path, &sb) < 0) {
		ret = -errno;
		st_error_set(ret, "%s: %s", path, strerror(-ret));
	} else if (S_ISDIR(sb.st_mode)) {
		ret = open_dir(w, path);
	} else {
		w->name = strdup(path);
		w->path = strdup(path);
		ret = w->name && w->path ? open_file(w, path)
					 : st_error_set(-ENOMEM, "out of memory");
	}
	if (ret == 0 && w->r && w->have_config)
		ret = check_model(w);
	if (ret < 0) {
		st_weights_close(w);
		return ret;
	}
	*out = w;
	return 0;
}

void st_weights_close(struct st_weights *w)
{
	if (!w)
		return;
	st_ckpt_set_close(w->r);
	if (w->fd >= 0)
		close(w->fd);
	free(w->name);
	free(w->path);
	free(w);
}

const char *st_weights_name(const struct st_weights *w)
{
	return w->name;
}

const struct st_ckpt_set *st_weights_set(const struct st_weights *w)
{
	return w->r;
}

const char *st_weights_format(const struct st_weights *w)
{
	return w->format;
}

int st_weights_config(const struct st_weights *w, struct st_model_config *out)
{
	if (!w->have_config)
		return st_error_set(-ENOENT, "%s: no config.json beside it", w->path);
	*out = w->gc;
	return 0;
}

/* llm.c's kind g and layer of a Hugging Face name, and its element offset
 * in the file (header included), or -EINVAL. */
static int llmc_locate(const struct st_weights *w, const char *name, int *g_out,
		       uint64_t *off_out)
{
	uint64_t off = ST_LLMC_HEADER_INTS * sizeof(int32_t) / w->esize;
	const char *suffix = name;
	int layer = 0, len = 0, g;

	if (sscanf(name, "h.%d.%n", &layer, &len) == 1 && len > 0)
		suffix = name + len;
	for (g = 0; g < ST_LLMC_KINDS; g++) {
		if (strcmp(st_llmc_kinds[g].suffix, suffix) == 0 &&
		    st_llmc_kinds[g].per_layer == (len > 0))
			break;
		off += st_llmc_kind_elems(&w->gc, w->vp, g) *
		       (st_llmc_kinds[g].per_layer ? (uint64_t)w->gc.n_layer : 1);
	}
	if (g == ST_LLMC_KINDS || layer < 0 || layer >= w->gc.n_layer)
		return st_error_set(-EINVAL, "%s: tensor %s is missing", w->path, name);
	*g_out = g;
	*off_out = off + (uint64_t)layer * st_llmc_kind_elems(&w->gc, w->vp, g);
	return 0;
}

/* The llm.c file's shape of kind g in Hugging Face's layout. */
static void llmc_shape(const struct st_weights *w, int g, int *ndim, uint64_t shape[2])
{
	uint64_t C = (uint64_t)w->gc.dim;

	*ndim = 2;
	shape[1] = C;
	if (g == 0) {
		shape[0] = (uint64_t)w->gc.vocab; /* the padding rows are not the model's */
	} else if (g == 1) {
		shape[0] = (uint64_t)w->gc.ctx;
	} else if (st_llmc_kinds[g].cc) { /* (in, out) */
		shape[0] = st_llmc_kinds[g].in * C;
		shape[1] = st_llmc_kinds[g].cc * C / st_llmc_kinds[g].in;
	} else {
		*ndim = 1;
		shape[0] = st_llmc_kinds[g].c * C;
		shape[1] = 1;
	}
}

/* The safetensors entry for name and the file holding it, or NULL. */
static const struct st_sf_info *sf_find(const struct st_weights *w, const char *name,
					const struct st_ckpt_reader **r)
{
	const struct st_sf_info *info = st_ckpt_set_lookup(w->r, name, r);
	char alt[256];

	if (!info) {
		snprintf(alt, sizeof(alt), "transformer.%s", name);
		info = st_ckpt_set_lookup(w->r, alt, r);
	}
	return info;
}

int st_weights_check(struct st_weights *w, const char *name, int ndim, const uint64_t *shape)
{
	uint64_t have[2] = { 0, 1 };
	const char *where = w->path;
	int have_ndim;

	if (!w->r) {
		int g;
		uint64_t off;
		int ret = llmc_locate(w, name, &g, &off);

		if (ret < 0)
			return ret;
		llmc_shape(w, g, &have_ndim, have);
	} else {
		const struct st_ckpt_reader *rd = NULL;
		const struct st_sf_info *info = sf_find(w, name, &rd);

		if (!info)
			return st_error_set(-EINVAL, "%s: tensor %s is missing", w->path, name);
		where = st_ckpt_reader_path(rd); /* the shard that holds it */
		if (info->dtype != ST_SF_F32 && info->dtype != ST_SF_BF16 &&
		    info->dtype != ST_SF_F16)
			return st_error_set(-EINVAL, "%s: tensor %s is %s, not a float type", where,
					    name, st_sf_dtype_name(info->dtype));
		have_ndim = info->ndim;
		have[0] = info->ndim > 0 ? info->shape[0] : 1;
		have[1] = info->ndim > 1 ? info->shape[1] : 1;
	}
	if (have_ndim != ndim || have[0] != shape[0] || (ndim == 2 && have[1] != shape[1])) {
		char a[48], b[48];

		if (have_ndim == 1)
			snprintf(a, sizeof(a), "[%llu]", (unsigned long long)have[0]);
		else
			snprintf(a, sizeof(a), "[%llu,%llu]", (unsigned long long)have[0],
				 (unsigned long long)have[1]);
		if (ndim == 1)
			snprintf(b, sizeof(b), "[%llu]", (unsigned long long)shape[0]);
		else
			snprintf(b, sizeof(b), "[%llu,%llu]", (unsigned long long)shape[0],
				 (unsigned long long)shape[1]);
		return st_error_set(-EINVAL, "%s: tensor %s has the wrong shape for the model: "
				    "%s, the model's is %s", where, name,
				    have_ndim > 2 ? "more than 2 dimensions" : a, b);
	}
	return 0;
}

/* Every value of a tensor just read must be finite: a NaN or Inf loaded
 * would make every step skip (train) or every loss NaN (eval). The index
 * is in the tensor's Hugging Face layout, whatever the file's. */
static int check_finite(const char *path, const char *name, const float *x, uint64_t n)
{
	uint64_t k = st_f32_find_bad(x, n, false);
	char v[32];

	if (k == n)
		return 0;
	return st_error_set(-EINVAL, "%s: %s[%llu] is %s: not finite weights are refused",
			    path, name, (unsigned long long)k, st_f32_name(x[k], v, sizeof(v)));
}

int st_weights_read(struct st_weights *w, const char *name, int ndim, const uint64_t *shape,
		    float *out)
{
	uint64_t n = shape[0] * (ndim == 2 ? shape[1] : 1);
	const struct st_sf_info *info = NULL;
	const struct st_ckpt_reader *rd = NULL;
	float *tmp = NULL;
	void *raw = NULL;
	unsigned esize;
	int ret = st_weights_check(w, name, ndim, shape);

	if (ret < 0)
		return ret;
	if (w->r) {
		const unsigned char *half;

		info = sf_find(w, name, &rd);
		if (info->dtype == ST_SF_F32) {
			ret = st_ckpt_reader_pread(rd, info, 0, out, n * sizeof(float));
			return ret < 0 ? ret : check_finite(st_ckpt_reader_path(rd), name, out, n);
		}
		/* In place, so a tensor costs no memory past out: the 2n bytes
		 * go to out's upper half, and widening forward never overtakes
		 * them (value k lands in bytes [4k, 4k + 4), below 2n + 2(k + 1)
		 * where the next one not yet widened starts). */
		half = (const unsigned char *)out + n * sizeof(uint16_t);
		ret = st_ckpt_reader_pread(rd, info, 0, (void *)half, n * sizeof(uint16_t));
		for (uint64_t k = 0; ret == 0 && k < n; k++) {
			uint16_t h; /* read as bytes: out's floats and these alias */

			memcpy(&h, half + 2 * k, sizeof(h));
			out[k] = info->dtype == ST_SF_F16 ? st_f32_from_f16(h) : st_f32_from_bf16(h);
		}
		return ret < 0 ? ret : check_finite(st_ckpt_reader_path(rd), name, out, n);
	}
	esize = w->esize;
	raw = malloc(n * esize);
	if (!raw)
		return st_error_set(-ENOMEM, "out of memory");
	{ /* llm.c's file */
		int g;
		uint64_t off;

		llmc_locate(w, name, &g, &off);
		if (st_llmc_kinds[g].transpose && !(tmp = malloc(n * sizeof(float))))
			ret = st_error_set(-ENOMEM, "out of memory");
		if (ret == 0)
			ret = st_file_pread_full(w->fd, raw, n * esize, off * esize, w->path);
	}
	for (uint64_t k = 0; ret == 0 && k < n; k++) {
		float *dst = tmp ? tmp : out;

		if (esize == 4)
			dst[k] = ((const float *)raw)[k];
		else
			dst[k] = st_f32_from_bf16(((const uint16_t *)raw)[k]);
	}
	if (ret == 0 && tmp) /* llm.c's (out, in) = (shape[1], shape[0]) */
		st_llmc_transpose(out, tmp, shape[1], shape[0]);
	free(raw);
	free(tmp);
	return ret < 0 ? ret : check_finite(w->path, name, out, n);
}

int st_weights_read_unit(struct st_weights *w, const struct st_model *m, int u, float *p)
{
	const struct st_unit_layout *ul = st_model_unit_layout(m, u);
	int ret = 0;

	memset(p, 0, ul->elems * sizeof(float));
	for (int i = 0; ret == 0 && i < ul->n_tensors; i++) {
		const struct st_tensor_layout *tl = &ul->tensors[i];
		uint64_t shape[2] = { (uint64_t)tl->shape[0], (uint64_t)tl->shape[1] };

		ret = st_weights_read(w, tl->name, tl->ndim, shape, p + tl->offset_elems);
	}
	return ret;
}

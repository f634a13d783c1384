/* Checkpoints of the tiered engine: streamed out of the tiers unit by unit
 * (a model whose state lives on nvme never has to fit in RAM), and read
 * back the same way after every file is checked against trainer.json. */
#include "strata/ckpt.h"
#include "engine_internal.h"
#include "strata/comm.h"
#include "strata/engine.h"
#include "strata/io.h"
#include "strata/optim.h"
#include "strata/weights.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

struct fill_ctx {
	struct st_engine *e;
	const struct st_ckpt_tensor *t; /* [tensor]: names for messages */
	char bad[256];        /* the first value refused, "" when none */
	size_t bad_ti;        /* and its tensor */
	int *unit;            /* [tensor] */
	uint64_t *off_elems;  /* [tensor] */
	enum st_state *state; /* [tensor] */
	float *unit_buf;      /* one unit's state, E floats */
	int staged;           /* unit * ST_STATE_COUNT + state in unit_buf, or -1 */
	int *reads;           /* the save's (state, unit) reads so far */
};

/* A state must be finite (and V, Adam's second moment, >= 0) to be saved,
 * and to be resumed from: a checkpoint that holds a NaN would make every
 * step after a resume skip, and `latest` would name it. x holds elements
 * [first, first + n) of tensor name. On a bad value: -EINVAL, and why[]
 * says which. */
static int check_state(enum st_state s, const char *name, const float *x, uint64_t first,
		       uint64_t n, char *why, size_t why_bytes)
{
	uint64_t k = st_f32_find_bad(x, n, s == ST_STATE_V);
	char v[32];

	if (k == n)
		return 0;
	snprintf(why, why_bytes, "%s[%llu] is %s", name, (unsigned long long)(first + k),
		 st_f32_name(x[k], v, sizeof(v)));
	return st_error_set(-EINVAL, "%s", why);
}

static int fill(void *vctx, size_t ti, uint64_t off, void *buf, size_t len)
{
	struct fill_ctx *c = vctx;
	int u = c->unit[ti], key = u * ST_STATE_COUNT + (int)c->state[ti], ret;

	if (c->staged != key) {
		(*c->reads)++;
		ret = st_engine_read_state(c->e, u, c->state[ti], c->unit_buf);
		if (ret < 0)
			return ret;
		c->staged = key;
	}
	memcpy(buf, (const char *)(c->unit_buf + c->off_elems[ti]) + off, len);
	c->bad_ti = ti;
	return check_state(c->state[ti], c->t[ti].name, buf, off / sizeof(float),
			   len / sizeof(float), c->bad, sizeof(c->bad));
}

/* The tensors of the model in unit order, once per state with its name
 * suffix. */
static int list_tensors(const struct st_model *m, const enum st_state *states,
			const char *const *suffixes, int nstates,
			struct st_ckpt_tensor **out, char ***names, int **unit,
			uint64_t **off, enum st_state **st, size_t *n_out)
{
	size_t n = 0, cap = 0;
	int U = st_model_unit_count(m);

	for (int u = 0; u < U; u++)
		cap += (size_t)st_model_unit_layout(m, u)->n_tensors * (size_t)nstates;
	*out = calloc(cap, sizeof(**out));
	*names = calloc(cap, sizeof(char *));
	*unit = calloc(cap, sizeof(int));
	*off = calloc(cap, sizeof(uint64_t));
	*st = calloc(cap, sizeof(enum st_state));
	if (!*out || !*names || !*unit || !*off || !*st)
		return -ENOMEM;
	for (int k = 0; k < nstates; k++)
	for (int u = 0; u < U; u++) {
		const char *suffix = suffixes[k];
		const struct st_unit_layout *ul = st_model_unit_layout(m, u);

		for (int i = 0; i < ul->n_tensors; i++, n++) {
			const struct st_tensor_layout *tl = &ul->tensors[i];
			size_t l = strlen(tl->name) + strlen(suffix) + 1;

			(*names)[n] = malloc(l);
			if (!(*names)[n])
				return -ENOMEM;
			snprintf((*names)[n], l, "%s%s", tl->name, suffix);
			(*out)[n] = (struct st_ckpt_tensor){ .name = (*names)[n], .dtype = ST_SF_F32,
							     .ndim = tl->ndim };
			(*out)[n].shape[0] = (uint64_t)tl->shape[0];
			(*out)[n].shape[1] = (uint64_t)tl->shape[1];
			(*unit)[n] = u;
			(*off)[n] = tl->offset_elems;
			(*st)[n] = states[k];
		}
	}
	*n_out = n;
	return 0;
}

static void free_list(struct st_ckpt_tensor *t, char **names, int *unit, uint64_t *off,
		      enum st_state *st, size_t n)
{
	free(st);
	for (size_t i = 0; names && i < n; i++)
		free(names[i]);
	free(names);
	free(t);
	free(unit);
	free(off);
}

static uint64_t max_unit_elems(const struct st_model *m)
{
	uint64_t E = 0;

	for (int u = 0; u < st_model_unit_count(m); u++)
		E = ST_MAX(E, st_model_unit_layout(m, u)->elems);
	return E;
}

/* The safetensors metadata of stem's files: the optimizer's also names a
 * compact M and V's format (docs/optim.md: the tensors hold M and V
 * decoded to fp32, so any --optim-state can resume them). */
static size_t ckpt_meta(const struct st_engine *e, const char *stem, struct st_sf_meta meta[3])
{
	size_t n = 0;

	meta[n++] = (struct st_sf_meta){ "format", "pt" };
	meta[n++] = (struct st_sf_meta){ "producer", "strata" };
	if (e->mv_state != ST_OPTIM_STATE_F32 && !strcmp(stem, ST_CKPT_OPTIM_STEM))
		meta[n++] = (struct st_sf_meta){ "strata_optim_state",
						 st_optim_state_name(e->mv_state) };
	return n;
}

/* Stream the given states of every unit into dir as stem's files: one
 * STEM.safetensors, or shards and their index above the shard size. */
static int write_state_file(struct st_engine *e, const char *dir, const char *stem,
			    const enum st_state *states, const char *const *suffixes,
			    int nstates, struct st_ckpt_trainer *tr, int *reads)
{
	const struct st_model *m = st_engine_model(e);
	struct st_sf_meta meta[3];
	size_t n_meta = ckpt_meta(e, stem, meta);
	struct st_ckpt_tensor *t = NULL;
	struct st_ckpt_layout l = { 0 };
	char **names = NULL;
	int *unit = NULL;
	uint64_t *off = NULL;
	size_t n = 0;
	struct fill_ctx c = { .e = e, .staged = -1, .reads = reads };
	enum st_state *st = NULL;
	int ret = list_tensors(m, states, suffixes, nstates, &t, &names, &unit, &off, &st, &n);

	if (ret == 0 && posix_memalign((void **)&c.unit_buf, ST_PAGE_BYTES,
				       max_unit_elems(m) * sizeof(float)))
		ret = -ENOMEM;
	c.t = t;
	c.unit = unit;
	c.off_elems = off;
	c.state = st;
	if (ret == 0)
		ret = st_ckpt_layout_init(&l, stem, t, n, meta, n_meta,
					  e->cfg.ckpt_shard_bytes);
	if (ret == 0)
		ret = st_ckpt_layout_write(dir, &l, t, fill, &c, tr);
	if (ret < 0 && c.bad[0]) /* not the temporary file's name: it is gone */
		ret = st_error_set(-EINVAL, "%s: %s: a state that is not finite is not saved",
				   l.files[l.file_of[c.bad_ti]].name, c.bad);
	st_ckpt_layout_fini(&l);
	free(c.unit_buf);
	free_list(t, names, unit, off, st, n);
	return ret;
}

static int save_files(struct st_engine *e, const char *dir, uint64_t step,
		      const struct st_cursor *cursor, const char *config_json, int keep,
		      int *reads);

/* ---- at N ranks: every rank writes its ranges into the shared files ------------- */

/* One set of files (model: P; optimizer: M, V): its tensors and layout,
 * the same on every rank. */
struct fileset {
	struct st_ckpt_tensor *t;
	char **names;
	int *unit;
	uint64_t *off;
	enum st_state *st;
	size_t n;
	struct st_ckpt_layout l;
};

static int set_init(struct st_engine *e, const char *stem, const enum st_state *states,
		    const char *const *suffixes, int nstates, struct fileset *x)
{
	struct st_sf_meta meta[3];
	size_t n_meta = ckpt_meta(e, stem, meta);
	int ret = list_tensors(st_engine_model(e), states, suffixes, nstates, &x->t, &x->names,
			       &x->unit, &x->off, &x->st, &x->n);

	if (ret == 0)
		ret = st_ckpt_layout_init(&x->l, stem, x->t, x->n, meta, n_meta,
					  e->cfg.ckpt_shard_bytes);
	return ret;
}

static void set_fini(struct fileset *x)
{
	st_ckpt_layout_fini(&x->l);
	free_list(x->t, x->names, x->unit, x->off, x->st, x->n);
}

static int pwrite_all(int fd, const void *buf, size_t len, uint64_t off, const char *path)
{
	while (len) {
		ssize_t n = pwrite(fd, buf, len, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return st_error_set(n < 0 ? -errno : -EIO, "%s: write at %llu: %s", path,
					    (unsigned long long)off,
					    n < 0 ? strerror(errno) : "no progress");
		buf = (const char *)buf + n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

/* This rank's range of every tensor of x (elements [r S_u, (r+1) S_u) of
 * its unit, read from its own shards: nothing is exchanged) into the files
 * rank 0 made in tmp, each value checked as a one-rank save checks it;
 * then fsynced (the files may be on a file system the ranks share). */
static int write_parts(struct st_engine *e, const char *tmp, struct fileset *x)
{
	int nf = (int)x->l.n_files, ret = 0;
	int *fd = calloc((size_t)nf, sizeof(int));
	char path[4096], why[256];
	float *buf = NULL;
	uint64_t E = 0;

	for (int u = 0; u < e->n_units; u++)
		E = ST_MAX(E, e->padded_elems[u]);
	if (!fd || posix_memalign((void **)&buf, ST_PAGE_BYTES, E * sizeof(float))) {
		free(fd);
		return st_error_set(-ENOMEM, "out of memory");
	}
	for (int f = 0; f < nf; f++)
		fd[f] = -1;
	for (int f = 0; f < nf && ret == 0; f++) {
		snprintf(path, sizeof(path), "%.4000s/%s", tmp, x->l.files[f].name);
		fd[f] = open(path, O_WRONLY | O_CLOEXEC);
		if (fd[f] < 0)
			ret = st_error_set(-errno, "%s: %s", path, strerror(errno));
	}
	for (size_t i = 0; i < x->n && ret == 0;) {
		int u = x->unit[i];
		enum st_state s = x->st[i];
		uint64_t lo, n;

		ret = st_eng_read_own(e, u, s, buf, &lo, &n);
		/* the tensors of (u, s) follow one another in the list */
		for (; ret == 0 && i < x->n && x->unit[i] == u && x->st[i] == s; i++) {
			uint64_t t0 = x->off[i], t1 = t0 + x->l.size_bytes[i] / sizeof(float);
			uint64_t a = ST_MAX(t0, lo), b = ST_MIN(t1, lo + n);
			int f = (int)x->l.file_of[i];

			if (a >= b)
				continue;
			snprintf(path, sizeof(path), "%.4000s/%s", tmp, x->l.files[f].name);
			ret = check_state(s, x->t[i].name, buf + (a - lo), a - t0, b - a, why,
					  sizeof(why));
			if (ret < 0)
				ret = st_error_set(-EINVAL, "%s: %s: a state that is not finite "
						   "is not saved", x->l.files[f].name, why);
			else
				ret = pwrite_all(fd[f], buf + (a - lo), (b - a) * sizeof(float),
						 x->l.offset[i] + (a - t0) * sizeof(float), path);
		}
	}
	for (int f = 0; f < nf; f++) {
		if (fd[f] >= 0 && ret == 0 && fsync(fd[f]) < 0)
			ret = st_error_set(-errno, "%s: fsync: %s", x->l.files[f].name,
					   strerror(errno));
		if (fd[f] >= 0)
			close(fd[f]);
	}
	free(fd);
	free(buf);
	return ret;
}

/* A rank's result and its message, exchanged. */
struct rank_result {
	int32_t ret;
	char msg[508];
};

static void result_of(struct rank_result *r, int ret)
{
	r->ret = ret;
	snprintf(r->msg, sizeof(r->msg), "%s", ret < 0 ? st_error_last() : "");
}

/* Rank 0's trainer.json and config.json over the parts written, then the
 * commit. */
static int finish_ranks(struct st_engine *e, struct st_ckpt_dir *d, struct fileset *sets,
			uint64_t step, const struct st_cursor *cursor, const char *config_json,
			int keep)
{
	struct st_ckpt_trainer tr = { 0 };
	char path[4096];
	int ret = 0;

	for (int k = 0; k < 2 && ret == 0; k++) {
		for (size_t f = 0; f < sets[k].l.n_files && ret == 0; f++)
			ret = st_ckpt_trainer_add_hashed(&tr, d->tmp, sets[k].l.files[f].name);
		if (ret == 0)
			ret = st_ckpt_layout_write_index(d->tmp, &sets[k].l, sets[k].t, &tr);
	}
	if (ret == 0) {
		snprintf(path, sizeof(path), "%.4000s/%s", d->tmp, ST_CKPT_CONFIG_FILE);
		ret = st_model_config_write(path, st_model_config(st_engine_model(e)));
	}
	if (ret == 0)
		ret = st_ckpt_trainer_add_hashed(&tr, d->tmp, ST_CKPT_CONFIG_FILE);
	if (ret == 0) {
		tr.step = step;
		tr.seed = st_engine_seed(e);
		tr.cursor_bytes = ST_CURSOR_BYTES;
		st_cursor_pack(cursor, tr.cursor);
		ret = config_json ? st_ckpt_trainer_set_config(&tr, config_json) : 0;
	}
	if (ret == 0) {
		snprintf(path, sizeof(path), "%.4000s/%s", d->tmp, ST_CKPT_TRAINER_FILE);
		ret = st_ckpt_trainer_write(path, &tr);
	}
	st_ckpt_trainer_fini(&tr);
	if (ret < 0) {
		st_ckpt_dir_abort(d);
		return ret;
	}
	return st_ckpt_dir_commit(d, keep > 0 ? (unsigned)keep : 0);
}

/* At N ranks: rank 0 starts the checkpoint directory and makes every file
 * with its header and its full size (st_ckpt_layout_create); every rank
 * pwrite()s its ranges of every tensor into them, in parallel, from its
 * own shards; once all are done (their results exchanged: the barrier),
 * rank 0 sums the files, writes the index, config.json and trainer.json
 * and commits, atomically as one rank does. The files are one rank's
 * files, byte for byte: the checkpoint resumes at any world size and
 * stage. Every rank returns the same result. */
static int save_ranks(struct st_engine *e, const char *dir, uint64_t step,
		      const struct st_cursor *cursor, const char *config_json, int keep)
{
	static const enum st_state p_state[] = { ST_STATE_P };
	static const enum st_state mv_states[] = { ST_STATE_M, ST_STATE_V };
	static const char *const p_suffix[] = { "" };
	static const char *const mv_suffix[] = { ST_CKPT_SUFFIX_EXP_AVG,
						 ST_CKPT_SUFFIX_EXP_AVG_SQ };
	struct st_comm *c = e->comm;
	struct fileset sets[2] = { 0 };
	struct st_ckpt_dir d = { 0 };
	struct rank_result mine, *all = NULL;
	struct { int32_t ret; char tmp[4096]; } start = { 0 };
	bool root = e->rank == 0;
	/* ranks wait here for the slowest writer and for rank 0's hashing and
	 * commit, legitimately longer than the watchdog's limit for a big
	 * model: no limit while saving (a rank that dies still ends the job:
	 * mpirun sees it) */
	double timeout_s = st_comm_set_timeout(c, 0);
	int ret = set_init(e, ST_CKPT_MODEL_STEM, p_state, p_suffix, 1, &sets[0]);

	if (ret == 0)
		ret = set_init(e, ST_CKPT_OPTIM_STEM, mv_states, mv_suffix, 2, &sets[1]);
	all = calloc((size_t)e->world, sizeof(*all));
	if (!all && ret == 0)
		ret = st_error_set(-ENOMEM, "out of memory");
	/* every rank reaches the exchanges below, whatever failed before */
	if (root) {
		if (ret == 0)
			ret = st_ckpt_dir_begin(&d, dir, step);
		for (int k = 0; k < 2 && ret == 0; k++)
			for (size_t f = 0; f < sets[k].l.n_files && ret == 0; f++)
				ret = st_ckpt_layout_create(d.tmp, &sets[k].l, f);
		start.ret = ret;
		snprintf(start.tmp, sizeof(start.tmp), "%s", d.tmp ? d.tmp : "");
		if (ret < 0)
			st_ckpt_dir_abort(&d); /* begun, then a file failed */
	}
	if (st_comm_host_broadcast(c, &start, sizeof(start), 0) < 0)
		st_comm_abort(c, 1);
	/* a rank whose own set-up failed writes nothing and says so below,
	 * so rank 0 aborts instead of committing files with holes */
	if (start.ret == 0 && ret == 0) {
		ret = write_parts(e, start.tmp, &sets[0]);
		if (ret == 0)
			ret = write_parts(e, start.tmp, &sets[1]);
	} else if (start.ret < 0 && !root) {
		ret = st_error_set(start.ret, "checkpoint: rank 0 could not start it");
	}
	result_of(&mine, ret);
	if (!all || st_comm_host_allgather(c, &mine, all, sizeof(mine)) < 0)
		st_comm_abort(c, 1);
	for (int q = 0; q < e->world && ret == 0; q++)
		if (all[q].ret < 0)
			ret = st_error_set(all[q].ret, "rank %d: %s", q, all[q].msg);
	if (root && start.ret == 0) {
		if (ret == 0)
			ret = finish_ranks(e, &d, sets, step, cursor, config_json, keep);
		else
			st_ckpt_dir_abort(&d);
	}
	result_of(&mine, ret);
	if (st_comm_host_broadcast(c, &mine, sizeof(mine), 0) < 0)
		st_comm_abort(c, 1);
	free(all);
	set_fini(&sets[0]);
	set_fini(&sets[1]);
	st_comm_set_timeout(c, timeout_s);
	return mine.ret < 0 ? st_error_set(mine.ret, "%s", mine.msg) : 0;
}

int st_engine_save(struct st_engine *e, const char *dir, uint64_t step,
		   const struct st_cursor *cursor, const char *config_json, int keep)
{
	int reads = 0;

	if (e->cfg.forward_only)
		return st_error_set(-EINVAL, "engine: the forward alone has no state to save");
	if (e->world > 1)
		return save_ranks(e, dir, step, cursor, config_json, keep);
	return save_files(e, dir, step, cursor, config_json, keep, &reads);
}

static int save_files(struct st_engine *e, const char *dir, uint64_t step,
		      const struct st_cursor *cursor, const char *config_json, int keep,
		      int *reads)
{
	const struct st_model_config *mc = st_model_config(st_engine_model(e));
	struct st_ckpt_trainer tr = { 0 };
	struct st_ckpt_dir d;
	char path[4096];
	int ret;

	ret = st_ckpt_dir_begin(&d, dir, step);
	if (ret < 0)
		return ret;
	static const enum st_state p_state[] = { ST_STATE_P };
	static const enum st_state mv_states[] = { ST_STATE_M, ST_STATE_V };
	static const char *const p_suffix[] = { "" };
	static const char *const mv_suffix[] = { ST_CKPT_SUFFIX_EXP_AVG,
						 ST_CKPT_SUFFIX_EXP_AVG_SQ };

	/* P is model.safetensors (fp32 master weights, Hugging Face names);
	 * optimizer.safetensors holds M and V under PyTorch's AdamW names. */
	ret = write_state_file(e, d.tmp, ST_CKPT_MODEL_STEM, p_state, p_suffix, 1, &tr, reads);
	if (ret == 0)
		ret = write_state_file(e, d.tmp, ST_CKPT_OPTIM_STEM, mv_states, mv_suffix, 2, &tr,
				       reads);
	if (ret == 0) {
		snprintf(path, sizeof(path), "%.4000s/%s", d.tmp, ST_CKPT_CONFIG_FILE);
		ret = st_model_config_write(path, mc);
	}
	if (ret == 0)
		ret = st_ckpt_trainer_add_hashed(&tr, d.tmp, ST_CKPT_CONFIG_FILE);
	if (ret == 0) {
		tr.step = step;
		tr.seed = st_engine_seed(e);
		tr.cursor_bytes = ST_CURSOR_BYTES;
		st_cursor_pack(cursor, tr.cursor);
		ret = config_json ? st_ckpt_trainer_set_config(&tr, config_json) : 0;
	}
	if (ret == 0) {
		snprintf(path, sizeof(path), "%.4000s/%s", d.tmp, ST_CKPT_TRAINER_FILE);
		ret = st_ckpt_trainer_write(path, &tr);
	}
	st_ckpt_trainer_fini(&tr);
	if (ret < 0) {
		st_ckpt_dir_abort(&d);
		return ret;
	}
	return st_ckpt_dir_commit(&d, keep > 0 ? (unsigned)keep : 0);
}

/* Read unit u's state s (its tensors' names + suffix) from r, the file
 * path, into buf (padding zero), checking every value as st_engine_save()
 * does. */
static int read_unit(const struct st_model *m, const struct st_ckpt_set *set, int u,
		     enum st_state s, const char *suffix, float *buf)
{
	const struct st_unit_layout *ul = st_model_unit_layout(m, u);
	int ret = 0;

	memset(buf, 0, ul->elems * sizeof(float));
	for (int i = 0; ret == 0 && i < ul->n_tensors; i++) {
		const struct st_tensor_layout *tl = &ul->tensors[i];
		const struct st_sf_info *info;
		const struct st_ckpt_reader *r = NULL;
		uint64_t shape[2] = { (uint64_t)tl->shape[0], (uint64_t)tl->shape[1] };
		char name[ST_MODEL_NAME_BYTES + 32];

		snprintf(name, sizeof(name), "%s%s", tl->name, suffix);
		ret = st_ckpt_set_find(set, name, ST_SF_F32, tl->ndim, shape, &info, &r);
		if (ret == 0)
			ret = st_ckpt_reader_pread(r, info, 0, buf + tl->offset_elems,
						   tl->n_elems * sizeof(float));
		if (ret == 0) {
			char why[256];

			ret = check_state(s, name, buf + tl->offset_elems, 0, tl->n_elems, why,
					  sizeof(why));
			if (ret < 0)
				ret = st_error_set(ret, "%s: %s: %s", st_ckpt_set_path(set), why,
						   s == ST_STATE_V ? "Adam's second moment must be "
						   "finite and >= 0" : "values that are not finite are "
						   "refused");
		}
	}
	return ret;
}

int st_engine_resume(struct st_engine *e, const char *path, uint64_t *step,
		     struct st_cursor *cursor, char **config_json)
{
	const struct st_model *m = st_engine_model(e);
	const struct st_model_config *mc = st_model_config(m);
	struct st_ckpt_trainer tr = { 0 };
	struct st_model_config gc;
	char *dir = NULL, p[4096];
	int U = st_model_unit_count(m), ret;
	float *buf[3] = { 0 };

	ret = st_ckpt_resolve(path, &dir);
	if (ret < 0)
		return ret;
	snprintf(p, sizeof(p), "%.4000s/%s", dir, ST_CKPT_TRAINER_FILE);
	ret = st_ckpt_trainer_read(p, &tr);
	if (ret == 0)
		ret = st_ckpt_check(dir, &tr);
	if (ret == 0)
		ret = st_ckpt_verify(dir, &tr);
	if (ret == 0) {
		snprintf(p, sizeof(p), "%.4000s/%s", dir, ST_CKPT_CONFIG_FILE);
		ret = st_model_config_read(p, &gc);
	}
	if (ret == 0 && !st_model_config_equal(&gc, mc)) {
		char dims[256];

		ret = st_error_set(-EINVAL, "%s holds a different model (%s)", dir,
				   st_model_config_format(&gc, dims, sizeof(dims)));
	}
	if (ret == 0 && st_cursor_unpack(cursor, tr.cursor, tr.cursor_bytes) < 0)
		ret = st_error_set(-EINVAL, "%s/trainer.json: bad sampler cursor", dir);
	/* Unit by unit: three unit-sized buffers, whatever the model's size. */
	if (ret == 0) {
		struct st_ckpt_set *rm = NULL, *ro = NULL;
		uint64_t E = max_unit_elems(m);

		for (int k = 0; k < 3; k++)
			if (!(buf[k] = malloc(E * sizeof(float))))
				ret = -ENOMEM;
		if (ret == 0)
			ret = st_ckpt_set_open(&rm, dir, ST_CKPT_MODEL_STEM);
		if (ret == 0)
			ret = st_ckpt_set_open(&ro, dir, ST_CKPT_OPTIM_STEM);
		for (int u = 0; ret == 0 && u < U; u++) {
			ret = read_unit(m, rm, u, ST_STATE_P, "", buf[0]);
			if (ret == 0)
				ret = read_unit(m, ro, u, ST_STATE_M, ST_CKPT_SUFFIX_EXP_AVG, buf[1]);
			if (ret == 0)
				ret = read_unit(m, ro, u, ST_STATE_V, ST_CKPT_SUFFIX_EXP_AVG_SQ,
						buf[2]);
			if (ret == 0)
				ret = st_engine_write_state(e, u, buf[0], buf[1], buf[2]);
		}
		st_ckpt_set_close(rm);
		st_ckpt_set_close(ro);
		for (int k = 0; k < 3; k++)
			free(buf[k]);
	}
	if (ret == 0) {
		*step = tr.step;
		if (config_json)
			*config_json = tr.config_json ? strdup(tr.config_json) : NULL;
	}
	st_ckpt_trainer_fini(&tr);
	free(dir);
	return ret;
}

int st_engine_load_weights(struct st_engine *e, struct st_weights *w)
{
	const struct st_model *m = st_engine_model(e);
	float *p = NULL;
	int ret = 0;

	if (posix_memalign((void **)&p, ST_PAGE_BYTES, max_unit_elems(m) * sizeof(float)))
		return st_error_set(-ENOMEM, "out of memory");
	for (int u = 0; ret == 0 && u < st_model_unit_count(m); u++) {
		ret = st_weights_read_unit(w, m, u, p);
		if (ret == 0)
			ret = st_engine_write_state(e, u, p, NULL, NULL);
	}
	free(p);
	return ret;
}

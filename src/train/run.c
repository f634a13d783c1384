/* The training run (strata/run.h): the loop of `strata train` as a library
 * call. Before the first step it refuses bad input with nothing left
 * behind; after, a failure keeps the last checkpoint loadable and the
 * trace so far. Messages go to the caller as st_error_last() with the
 * exit code a tool should give; the lines a run prints go to cfg->out. */
#include "strata/run.h"
#include "strata/ckpt.h"
#include "strata/comm.h"
#include "strata/dataset.h"
#include "strata/device.h"
#include "strata/family.h"
#include "strata/file.h"
#include "strata/optim.h"
#include "strata/trace.h"
#include "strata/train.h"
#include "strata/weights.h"
#include "run_zero.h"

#include <cblas.h>
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* One run's state, from st_run_train()'s start to its end. */
struct run {
	const struct st_run_config *cfg;
	struct st_run_result *res;
	struct st_engine_config ec; /* cfg's, with the trace */
	struct st_loader ld;
	struct st_engine *e;
	struct st_trace *trace;
	const char *trace_path; /* TRACE.rank-R at world > 1 */
	char trace_rank[4200];
	const char *init, *resume; /* as resolved: --resume auto, say */
	char *auto_dir;		   /* what --resume auto resumes from */
	char *cfg_json;
	const char *metrics;	   /* rank 0's; NULL on the others */
	bool want_metrics;	   /* every rank gathers what rank 0 writes */
	FILE *mf;
	int save_lock;
	char *made; /* the topmost directory of --save DIR that this run made */
	bool started;
	struct st_run_nodes wi;
	uint64_t start_step, t0;
	uint64_t *rank_peaks;
	int skipped_in_row;
	/* validation: its loader (rewound each time); --keep-best's lowest
	 * loss so far */
	struct st_loader vld;
	int val_batches; /* --val-batches, or its default */
	double best_loss;
	/* --rates-refresh: what steps 2 to 4 measured */
	double rf_busy[ST_LANE_COUNT], rf_bytes[ST_LANE_COUNT], rf_nvme;
	int rf_steps;
};

/* A failure with the exit code a tool should give it. */
static int fail(struct run *r, int exit_code, int ret)
{
	r->res->exit_code = exit_code;
	return ret;
}

static void say(const struct run *r, const char *fmt, ...) ST_PRINTF(2, 3);
static void say(const struct run *r, const char *fmt, ...)
{
	va_list ap;

	if (!r->cfg->out)
		return;
	va_start(ap, fmt);
	vfprintf(r->cfg->out, fmt, ap);
	va_end(ap);
}

/* The exit code for a failure to read input the user named: 2 when it is
 * bad input (missing, malformed, damaged, of another model), 1 when the
 * system failed. */
static int input_exit(int err)
{
	return err == -ENOENT || err == -ENOTDIR || err == -EINVAL ? 2 : 1;
}

/* msg without a leading "path: ": the caller's "--flag PATH: " says it. */
static const char *unprefix(const char *msg, const char *path)
{
	size_t n = strlen(path);

	return strncmp(msg, path, n) == 0 && strncmp(msg + n, ": ", 2) == 0 ? msg + n + 2 : msg;
}

static const char *gbps(double bytes, double ns, char *buf, size_t n)
{
	snprintf(buf, n, "%.2f", ns > 0 ? bytes / ns : 0.0);
	return buf;
}

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

/* The training configuration, saved in trainer.json and checked at resume:
 * everything that changes the numbers. */
static char *config_json(const struct st_run_config *rc)
{
	const struct st_engine_config *ec = &rc->engine;
	const struct st_train_config *c = &ec->train;
	json_object *o = json_object_new_object();
	char *s;

	json_object_object_add(o, "model", json_object_new_string(rc->model_text));
	json_object_object_add(o, "data", json_object_new_string(rc->data_name));
	json_object_object_add(o, "batch", json_object_new_int(c->batch));
	json_object_object_add(o, "seq", json_object_new_int(c->seq));
	/* the micro-batches of a step over every rank: what the numbers
	 * depend on, so a checkpoint resumes at another world size (N ranks
	 * at --grad-accum A are one rank at N * A) */
	json_object_object_add(o, "grad_accum", json_object_new_int(c->grad_accum * ec->world));
	json_object_object_add(o, "steps", json_object_new_int(c->steps));
	/* an extended run: the total its schedule spans (absent: steps) */
	if (c->schedule_steps > 0 && c->schedule_steps != c->steps)
		json_object_object_add(o, "schedule_steps", json_object_new_int(c->schedule_steps));
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
	json_object_object_add(o, "shuffle", json_object_new_boolean(rc->shuffle));
	if (rc->samples == ST_SAMPLES_DOCUMENTS) /* absent: windows, as before it existed */
		json_object_object_add(o, "samples", json_object_new_string("documents"));
	if (c->isolate) /* absent: packed, as before it existed */
		json_object_object_add(o, "packing", json_object_new_string("isolated"));
	/* how it computed: not compared at resume (a run may go on in
	 * another precision), and absent at fp32 as before it existed */
	if (ec->compute_dtype != ST_PRECISION_FP32)
		json_object_object_add(o, "compute_dtype",
				       json_object_new_string(st_precision_name(ec->compute_dtype)));
	if (ec->world > 1) { /* where it ran: not compared at resume */
		json_object_object_add(o, "world", json_object_new_int(ec->world));
		json_object_object_add(o, "zero", json_object_new_int(ec->zero));
	}
	s = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
	json_object_put(o);
	return s;
}

/* The steps a saved config's LR schedule spans: "schedule_steps", else
 * "steps". */
static long long sched_steps(json_object *o)
{
	json_object *v = NULL;

	if (!json_object_object_get_ex(o, "schedule_steps", &v))
		json_object_object_get_ex(o, "steps", &v);
	return v ? (long long)json_object_get_int64(v) : -1;
}

/* Fields that must match between the run and the checkpoint it resumes.
 * Returns 0 or -EINVAL naming the first that does not. */
static int check_resume_config(const char *saved, const char *now)
{
	static const char *keys[] = { "model", "batch", "seq", "grad_accum", "lr", "schedule",
				      "warmup", "wd", "beta1", "beta2", "eps", "clip", "seed",
				      "precision", "shuffle", "samples", "packing" };
	json_object *a = saved ? json_tokener_parse(saved) : NULL, *b = json_tokener_parse(now);
	int ret = 0;

	if (!a)
		ret = st_error_set(-EINVAL, "--resume: the checkpoint has no training "
				   "configuration");
	for (size_t i = 0; a && ret == 0 && i < ST_ARRAY_LEN(keys); i++) {
		json_object *x = NULL, *y = NULL;

		json_object_object_get_ex(a, keys[i], &x);
		json_object_object_get_ex(b, keys[i], &y);
		if (!json_object_equal(x, y))
			ret = st_error_set(-EINVAL, "--resume: %s is %s in the checkpoint but %s now",
					   keys[i], x ? json_object_to_json_string(x) : "absent",
					   y ? json_object_to_json_string(y) : "absent");
	}
	/* --steps may grow (or shrink) across a resume; the schedule's span
	 * may not */
	if (a && ret == 0 && sched_steps(a) != sched_steps(b))
		ret = st_error_set(-EINVAL, "--resume: the LR schedule spans %lld steps in the "
				   "checkpoint but %lld now", sched_steps(a), sched_steps(b));
	json_object_put(a);
	json_object_put(b);
	return ret;
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

/* --rates-refresh FILE: the rates steps first..last measured (busy time and
 * bytes of every queue, summed), and for a rate this run did not measure
 * (no nvme tier, say) the one it ran with unless that was the default;
 * written atomically. */
static int rates_refresh(struct run *r, int first, int last)
{
	const struct st_plan *p = st_engine_plan(r->e);
	const char *file = r->cfg->rates_refresh;
	struct st_plan_rates rt, used = p->rates;
	char meas[256];
	int ret;

	st_plan_rates_from_lanes(p, r->rf_steps, r->rf_busy, r->rf_bytes, r->rf_nvme, &rt);
	for (int i = 0; i < ST_RATE_COUNT; i++)
		if (used.source[i] == ST_RATE_SRC_DEFAULT)
			st_plan_rate_set(&used, (enum st_rate)i, 0);
	st_plan_rates_merge(&rt, &used);
	snprintf(meas, sizeof(meas), "{\"source\": \"strata train\", \"steps\": [%d, %d]}",
		 first, last);
	ret = st_plan_rates_write(file, &rt, meas);
	if (ret < 0)
		return fail(r, 1, st_error_set(ret, "--rates-refresh %s", st_error_last()));
	say(r, "rates from steps %d-%d written to %s: compute %.1f GFLOP/s, nvme %.2f / %.2f "
	    "GB/s, adam %.2f GB/s (0: not measured, the run's rate or null kept)\n", first,
	    last, file, rt.compute_flops / 1e9, rt.nvme_read_bps / 1e9, rt.nvme_write_bps / 1e9,
	    rt.adam_bps / 1e9);
	return 0;
}

/* --init: the weights to start from, which must be --model's when the
 * file says which model it holds (a bare model.safetensors: its tensors'
 * shapes are checked). */
static int run_init(struct run *r)
{
	struct st_weights *w;
	struct st_model_config gc;
	char dims[256];
	int ret = st_weights_open(r->init, &w);

	if (ret == 0 && st_weights_config(w, &gc) == 0 &&
	    !st_model_config_equal(&gc, &r->ec.train.model))
		ret = st_error_set(-EINVAL, "it holds %s, not the model --model gives",
				   st_model_config_format(&gc, dims, sizeof(dims)));
	if (ret == 0)
		ret = st_engine_load_weights(r->e, w);
	st_weights_close(w);
	if (ret < 0)
		return fail(r, input_exit(ret), st_error_set(ret, "--init %s: %s", r->init,
							      unprefix(st_error_last(), r->init)));
	return 0;
}

/* --resume: the state and the data's cursor, from a checkpoint of this
 * configuration. */
static int run_resume(struct run *r)
{
	char *saved = NULL;
	int ret = st_engine_resume(r->e, r->resume, &r->start_step, &r->ld.cur, &saved);

	if (ret < 0)
		return fail(r, 2, st_error_set(ret, "--resume %s: %s", r->resume,
					       unprefix(st_error_last(), r->resume)));
	ret = check_resume_config(saved, r->cfg_json);
	free(saved);
	if (ret < 0)
		return fail(r, 2, ret);
	if (r->start_step > (uint64_t)r->ec.train.steps)
		return fail(r, 2, st_error_set(-EINVAL, "--resume %s: the checkpoint is at step "
					       "%llu, past --steps %d", r->resume,
					       (unsigned long long)r->start_step,
					       r->ec.train.steps));
	ret = st_loader_seek(&r->ld, &r->ld.cur);
	if (ret < 0)
		return fail(r, 2, st_error_set(ret, "--resume %s: %s", r->resume, st_error_last()));
	say(r, "resumed from %s at step %llu\n", r->resume, (unsigned long long)r->start_step);
	return 0;
}

/* --val-data: contiguous batches from the file's start, as strata eval
 * reads them; the file must hold val_batches of them. */
static int val_prepare(struct run *r)
{
	const struct st_run_config *c = r->cfg;
	const struct st_train_config *tc = &c->engine.train;
	struct st_loader_config lc = { .batch = (uint32_t)tc->batch, .seq = (uint32_t)tc->seq,
				       .shuffle = 0, .split = ST_SPLIT_ALL };
	uint64_t n = st_dataset_tokens(c->val_data);
	uint64_t avail = n > 1 ? (n - 1) / ((uint64_t)tc->batch * tc->seq) : 0;
	int ret;

	if (c->eval_every < 1 || c->val_batches < 0)
		return fail(r, 2, st_error_set(-EINVAL, "--val-data needs --eval-every N >= 1"));
	/* default: what the file holds, at most ST_RUN_VAL_BATCHES */
	r->val_batches = c->val_batches ? c->val_batches
					: (int)ST_MIN(avail, (uint64_t)ST_RUN_VAL_BATCHES);
	if (avail == 0 || avail < (uint64_t)r->val_batches)
		return fail(r, 2, st_error_set(-EINVAL, "--val-data: it holds %llu batches of %d x "
					       "%d tokens, fewer than --val-batches %d",
					       (unsigned long long)avail, tc->batch, tc->seq,
					       ST_MAX(r->val_batches, 1)));
	ret = st_loader_init(&r->vld, c->val_data, &lc);
	if (ret < 0)
		return fail(r, 2, st_error_set(ret, "--val-data: %s", st_error_last()));
	return 0;
}

/* The validation loss of the state after a step: the engine's forward
 * alone (st_engine_eval) over the same batches each time (the loader
 * rewound). Collective at world > 1: every rank scores every batch, the
 * numbers of one rank. */
static int val_loss(struct run *r, double *loss)
{
	double sum;
	uint64_t count;
	int ret;

	st_loader_rewind(&r->vld);
	ret = st_engine_eval(r->e, &r->vld, r->val_batches, &sum, &count);
	if (ret < 0)
		return fail(r, 1, st_error_set(ret, "validation: %s", st_error_last()));
	*loss = count ? sum / (double)count : NAN;
	return 0;
}

/* --keep-best: step's checkpoint (just saved) becomes DIR/best when its
 * loss is the lowest so far: best.json, then the link, each atomic. */
static int val_best(struct run *r, int step, double loss)
{
	const char *dir = r->cfg->save;
	char name[64], path[4200], tmp[4300], text[256];
	struct st_file_atomic f;
	int ret, n;

	if (r->ec.rank != 0 || !(loss < r->best_loss))
		return 0;
	r->best_loss = loss;
	snprintf(name, sizeof(name), "step-%06d", step);
	n = snprintf(text, sizeof(text), "{\"checkpoint\": \"%s\", \"step\": %d, "
		     "\"val_loss\": %.9g}\n", name, step, loss);
	snprintf(path, sizeof(path), "%s/%s", dir, ST_CKPT_BEST_JSON);
	ret = st_file_atomic_open(&f, path);
	if (ret == 0)
		ret = st_file_atomic_write(&f, text, (size_t)n);
	if (ret == 0)
		ret = st_file_atomic_commit(&f);
	else
		st_file_atomic_abort(&f);
	snprintf(path, sizeof(path), "%s/%s", dir, ST_CKPT_BEST);
	snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
	unlink(tmp);
	if (ret == 0 && (symlink(name, tmp) < 0 || rename(tmp, path) < 0))
		ret = st_error_set(-errno, "%s: %s", path, strerror(errno));
	if (ret < 0)
		return fail(r, 1, st_error_set(ret, "--keep-best: %s", st_error_last()));
	say(r, "best so far: step %d, val_loss %.6f (%s/%s)\n", step, loss, dir, ST_CKPT_BEST);
	return 0;
}

/* --keep-best on a resume: the loss of the best checkpoint there, from
 * DIR/best.json (none: the first evaluation sets it). */
static void val_best_read(struct run *r)
{
	char path[4200], *text = NULL;
	struct json_object *o, *v;
	size_t len;

	snprintf(path, sizeof(path), "%s/%s", r->cfg->save, ST_CKPT_BEST_JSON);
	if (st_file_read_small(path, 4096, &text, &len) < 0)
		return;
	o = json_tokener_parse(text);
	if (o && json_object_object_get_ex(o, "val_loss", &v))
		r->best_loss = json_object_get_double(v);
	json_object_put(o);
	free(text);
}

/* Before anything is allocated: the data, the ranks' agreement, the
 * --save lock (one run saves into a DIR at a time: a second one, a
 * restart while the first still runs, would prune and relink the
 * first's), and what --resume auto resumes from. */
static int run_prepare(struct run *r)
{
	const struct st_run_config *c = r->cfg;
	const struct st_train_config *tc = &c->engine.train;
	struct st_loader_config lc = { .batch = (uint32_t)tc->batch, .seq = (uint32_t)tc->seq,
				       .shuffle = c->shuffle, .seed = tc->seed,
				       .samples = c->samples, .split = ST_SPLIT_ALL };
	char run_line[8400];
	int ret;

	ret = st_loader_init(&r->ld, c->data, &lc);
	if (ret < 0)
		return fail(r, 2, st_error_set(ret, "--data %s: %s", c->data_name, st_error_last()));
	if (c->val_data && (ret = val_prepare(r)) < 0)
		return ret;
	if (!(r->cfg_json = config_json(c)))
		return fail(r, 1, st_error_set(-ENOMEM, "out of memory"));
	/* the schedule orders the collectives of a step: every rank's the same */
	snprintf(run_line, sizeof(run_line),
		 "run save=%s save-every=%d keep=%d resume=%s metrics=%d schedule=%s",
		 c->save ? c->save : "-", c->save_every, c->keep, c->resume ? c->resume : "-",
		 c->metrics != NULL, st_schedule_name(c->engine.schedule));
	ret = st_run_zero_agree(&r->ec, r->cfg_json, c->data, run_line, c->save, &r->wi, r->res);
	if (ret < 0)
		return ret;
	/* rank 0 prints, saves and holds the lock; the others write only
	 * their slices (through st_engine_save) */
	r->want_metrics = c->metrics != NULL;
	r->metrics = r->ec.rank == 0 ? c->metrics : NULL;
	if (c->save && r->ec.rank == 0) {
		ret = st_ckpt_lock(c->save, &r->save_lock, &r->made);
		if (ret < 0)
			return fail(r, 2, st_error_set(ret, "--save %s", st_error_last()));
	}
	/* From here a stop asked for ends the run before its first step, or
	 * at the end of a step. */
	if (c->armed)
		c->armed(c->arg);
	/* --resume auto: one command line for a job's first start and its
	 * restarts. Only "no checkpoint there" starts afresh (from --init, if
	 * given); a damaged one is refused as with --resume DIR. */
	if (r->resume && strcmp(r->resume, "auto") == 0) {
		ret = st_ckpt_resolve(c->save, &r->auto_dir);
		if (ret < 0 && ret != -ENOENT)
			return fail(r, 2, st_error_set(ret, "--resume auto: %s", st_error_last()));
		r->resume = r->auto_dir;
		if (!r->resume) {
			say(r, "no checkpoint in %s yet: starting at step 0\n", c->save);
		} else if (r->init) {
			say(r, "a checkpoint in %s: resuming from it, not from --init %s\n", c->save,
			    r->init);
			r->init = NULL;
		}
	}
	return 0;
}

/* The plan decides before anything is allocated (a budget that cannot
 * work is refused, exit 2), then the engine, its weights or the resumed
 * state, and the lines that open the run. */
static int run_open(struct run *r)
{
	const struct st_run_config *c = r->cfg;
	const struct st_train_config *tc = &r->ec.train;
	int ret;

	r->trace_path = c->trace;
	if (c->trace && r->ec.world > 1) { /* one file per rank */
		snprintf(r->trace_rank, sizeof(r->trace_rank), "%s.rank-%d", c->trace, r->ec.rank);
		r->trace_path = r->trace_rank;
	}
	if (r->trace_path && (ret = st_trace_create(&r->trace, r->trace_path)) < 0)
		return fail(r, 2, st_error_set(ret, "--trace %s: %s", r->trace_path,
					       st_error_last()));
	r->ec.trace = r->trace;
	ret = st_engine_create(&r->ec, &r->e);
	if (ret < 0)
		return fail(r, ret == -ENOSPC || ret == -EINVAL || ret == -ENODEV ||
			    ret == -ENOTSUP ? 2 : 1, ret);
	if (c->out) {
		struct st_plan_input pin = {
			.model = st_engine_model(r->e), .batch = tc->batch, .seq = tc->seq,
			.grad_accum = tc->grad_accum, .bf16 = tc->bf16,
			.optim_state = r->ec.optim_state,
			.gpu_mem_bytes = r->ec.gpu_mem_bytes, .host_mem_bytes = r->ec.host_mem_bytes,
			.nvme_mem_bytes = r->ec.nvme_mem_bytes, .have_nvme = r->ec.nvme_dirs != NULL,
			.params = r->ec.params, .optim = r->ec.optim, .prefetch = r->ec.prefetch,
			.host_compute = st_device_on_host(r->ec.device),
			.activations = r->ec.activations,
			.recompute = r->ec.recompute,
		};

		st_plan_print(st_engine_plan(r->e), &pin, c->out);
	}
	if (r->init && (ret = run_init(r)) < 0)
		return ret;
	if (r->resume && (ret = run_resume(r)) < 0)
		return ret;
	r->best_loss = INFINITY;
	if (c->keep_best && r->resume)
		val_best_read(r);
	if (r->ec.world > 1) { /* every rank resumed the same checkpoint (--resume auto) */
		char line[4200];
		const char *lines[] = { line };

		snprintf(line, sizeof(line), "resumed from=%s step=%llu",
			 r->resume ? r->resume : "-", (unsigned long long)r->start_step);
		ret = st_run_zero_lines(st_engine_comm(r->e), r->ec.rank, lines, 1, r->res);
		if (ret < 0)
			return ret;
	}
	if (r->metrics && !(r->mf = fopen(r->metrics, r->resume ? "a" : "w")))
		return fail(r, 2, st_error_set(-errno, "--metrics %s: %s", r->metrics,
					       strerror(errno)));
	say(r, "strata train: %.2fM params, %d layers, dim %d, %d heads, vocab %d | data %s "
	    "(%llu tokens) | B=%d T=%d accum %d | device %s | %d threads | adam %s\n",
	    (double)st_model_param_count(st_engine_model(r->e)) / 1e6, tc->model.n_layer,
	    tc->model.dim, tc->model.n_head, tc->model.vocab, c->data_name,
	    (unsigned long long)st_dataset_tokens(c->data), tc->batch, tc->seq, tc->grad_accum,
	    r->ec.device, omp_get_max_threads(), st_optim_path_name(st_optim_path_get()));
	if (r->ec.world > 1)
		say(r, "world: %d ranks on %d node%s: %s | --zero %d | comm %s | blas %s\n",
		    r->ec.world, r->wi.nodes, r->wi.nodes == 1 ? "" : "s", r->wi.hosts, r->ec.zero,
		    st_comm_name(st_engine_comm(r->e)), openblas_get_corename());
	if (c->out)
		fflush(c->out);
	if (c->stop && *c->stop)
		return fail(r, 130, st_error_set(-EINTR, "stopped before the first step (nothing "
						 "saved)"));
	return 0;
}

/* --samples documents: the epochs done at the step's end (2.5: half of the
 * third); -1 for windows. */
static double epochs_done(const struct run *r)
{
	const struct st_cursor *c = st_engine_step_end_cursor(r->e);
	const uint64_t n = r->ld.doc_hi - r->ld.doc_lo;

	if (c->samples != ST_SAMPLES_DOCUMENTS || !n)
		return -1;
	return (double)c->epoch + (double)c->doc / (double)n;
}

/* A step's progress line (two lines: the loss, then the tiers and links). */
static void progress_line(struct run *r, int s, const struct st_step_result *st, double val,
			  const struct st_engine_stats *es, double tps, double dt)
{
	const struct st_train_config *tc = &r->ec.train;
	char u[3][32], pk[3][32], et[32], a[16], b[16], cc[16], d[16], ep[32] = "";
	struct rusage ru;

	for (int h = 0; h < ST_HOME_COUNT; h++) {
		st_format_bytes(es->used_bytes[h], u[h], sizeof(u[h]));
		st_format_bytes(es->peak_bytes[h], pk[h], sizeof(pk[h]));
	}
	getrusage(RUSAGE_SELF, &ru);
	char vl[48] = "";

	if (!isnan(val)) /* an evaluation after this step */
		snprintf(vl, sizeof(vl), " | val_loss %.6f", val);
	if (epochs_done(r) >= 0)
		snprintf(ep, sizeof(ep), " | epoch %.2f", epochs_done(r));
	say(r, "step %*d/%d%s | loss %.6f%s | lr %.3e | norm %.4f%s | %.0f tok/s | %.2f s | ETA %s\n"
	    "    vram %s (peak %s) host %s (peak %s)%s%s%s%s%s | GB/s h2d %s d2h %s "
	    "nvme r %s w %s | rss %.0f MiB\n",
	    (int)log10(tc->steps) + 1, s + 1, tc->steps, ep, st->loss, vl, st->lr, st->grad_norm,
	    st->skipped ? " (non-finite: skipped)"
	    : st->empty ? " (no target the loss mask counts: skipped)" : "", tps, dt,
	    st_format_eta((double)(st_now_ns() - r->t0) / 1e9 / (s + 1 - (int)r->start_step) *
		(tc->steps - s - 1), et, sizeof(et)),
	    u[0], pk[0], u[1], pk[1], es->has_tier[2] ? " nvme " : "",
	    es->has_tier[2] ? u[2] : "", es->has_tier[2] ? " (peak " : "",
	    es->has_tier[2] ? pk[2] : "", es->has_tier[2] ? ")" : "",
	    gbps(es->bytes[ST_LANE_H2D], es->step_ns, a, sizeof(a)),
	    gbps(es->bytes[ST_LANE_D2H], es->step_ns, b, sizeof(b)),
	    gbps(es->bytes[ST_LANE_NVME_READ], es->step_ns, cc, sizeof(cc)),
	    gbps(es->bytes[ST_LANE_NVME_WRITE], es->step_ns, d, sizeof(d)),
	    ru.ru_maxrss / 1024.0);
}

/* A step's --metrics line; a finite step's line is what it always was,
 * byte for byte. Returns 0, or -EIO when the file cannot take it. */
static int metrics_line(struct run *r, int s, const struct st_step_result *st, double val,
			const struct st_engine_stats *es, double tps, double dt,
			const struct st_comm_stats *cs0, const struct st_comm_stats *cs1)
{
	FILE *mf = r->mf;
	char nf[128] = "";

	fprintf(mf, "{\"step\":%d", s + 1);
	metric(mf, "loss", "%.9g", st->loss, nf, sizeof(nf));
	metric(mf, "lr", "%.9g", st->lr, nf, sizeof(nf));
	metric(mf, "grad_norm", "%.9g", st->grad_norm, nf, sizeof(nf));
	if (!isnan(val)) /* only after an evaluation: other lines are as they were */
		metric(mf, "val_loss", "%.9g", val, nf, sizeof(nf));
	metric(mf, "tokens_per_s", "%.1f", tps, nf, sizeof(nf));
	metric(mf, "model_tflops", "%.4f",
	       tps * st_model_flops_per_token(st_engine_model(r->e), r->ec.train.seq) / 1e12, nf,
	       sizeof(nf));
	metric(mf, "step_s", "%.6f", dt, nf, sizeof(nf));
	if (epochs_done(r) >= 0)
		fprintf(mf, ",\"epoch\":%.6f", epochs_done(r));
	fprintf(mf, "%s%s%s%s%s%s%s,\"bytes\":{", st->empty ? ",\"empty\":true" : "",
		st->skipped ? ",\"skipped\":true" : "",
		st->in_backward ? ",\"in_backward\":true" : "",
		st->replayed ? ",\"replayed\":true" : "", nf[0] ? ",\"nonfinite\":[" : "",
		nf, nf[0] ? "]" : "");
	for (int l = ST_LANE_H2D; l <= ST_LANE_NVME_WRITE; l++)
		fprintf(mf, "%s\"%s\":%llu", l == ST_LANE_H2D ? "" : ",",
			l == ST_LANE_H2D ? "h2d" : l == ST_LANE_D2H ? "d2h"
			: l == ST_LANE_NVME_READ ? "nvme_read" : "nvme_write",
			(unsigned long long)es->bytes[l]);
	fprintf(mf, "},\"peak\":{");
	for (int h = 0, first = 1; h < ST_HOME_COUNT; h++) {
		if (!es->has_tier[h])
			continue;
		fprintf(mf, "%s\"%s\":%llu", first ? "" : ",", st_home_name(h),
			(unsigned long long)es->peak_bytes[h]);
		first = 0;
	}
	fprintf(mf, "},\"busy_s\":{");
	for (int l = 0; l < ST_LANE_COUNT; l++)
		fprintf(mf, "%s\"%s\":%.6f", l ? "," : "",
			l == ST_LANE_COMPUTE ? "compute" : l == ST_LANE_H2D ? "h2d"
			: l == ST_LANE_D2H ? "d2h" : l == ST_LANE_NVME_READ ? "nvme_read"
			: l == ST_LANE_NVME_WRITE ? "nvme_write" : "adam",
			(double)es->busy_ns[l] / 1e9);
	if (r->ec.world > 1) /* closes busy_s */
		st_run_zero_metrics(mf, cs0, cs1, r->rank_peaks, r->ec.world);
	fprintf(mf, r->ec.world > 1 ? "}\n" : "}}\n");
	errno = 0;
	if (fflush(mf) != 0 || ferror(mf)) /* a full disk: say so now */
		return fail(r, 1, st_error_set(errno ? -errno : -EIO, "--metrics %s: %s", r->metrics,
					       errno ? strerror(errno)
						     : "an earlier write to it failed"));
	return 0;
}

/* What one step reports: its lines, --rates-refresh's sums, the caller's
 * hook. */
static int step_report(struct run *r, int s, const struct st_step_result *st, double val,
		       const struct st_comm_stats *cs0, const struct st_comm_stats *cs1)
{
	const struct st_run_config *c = r->cfg;
	const struct st_train_config *tc = &r->ec.train;
	struct st_engine_stats es;
	double dt, tps;
	int ret;

	st_engine_get_stats(r->e, &es);
	if (r->want_metrics && r->ec.world > 1 &&
	    (ret = st_run_zero_peaks(r->e, &es, &r->rank_peaks)) < 0)
		return fail(r, 1, ret);
	dt = (double)es.step_ns / 1e9;
	tps = (double)tc->batch * tc->seq * tc->grad_accum / dt;
	/* --rates-refresh: steps 2 to 4 of this run (or to its last) */
	if (c->rates_refresh && s > (int)r->start_step && r->rf_steps < 3) {
		for (int l = 0; l < ST_LANE_COUNT; l++) {
			r->rf_busy[l] += (double)es.busy_ns[l] / 1e9;
			r->rf_bytes[l] += (double)es.bytes[l];
		}
		r->rf_nvme += (double)es.nvme_busy_ns / 1e9;
		r->rf_steps++;
		if ((r->rf_steps == 3 || s + 1 == tc->steps) &&
		    (ret = rates_refresh(r, (int)r->start_step + 2, s + 1)) < 0)
			return ret;
	}
	if ((s + 1) % c->log_every == 0 || s + 1 == tc->steps || st->skipped)
		progress_line(r, s, st, val, &es, tps, dt);
	if (r->mf && (ret = metrics_line(r, s, st, val, &es, tps, dt, cs0, cs1)) < 0)
		return ret;
	if (c->out)
		fflush(c->out);
	if (c->on_step) {
		struct st_run_step rs = { .step = s + 1, .loss = st->loss, .lr = st->lr,
					  .grad_norm = st->grad_norm, .skipped = st->skipped,
					  .val_loss = val };

		c->on_step(c->arg, &rs);
	}
	return 0;
}

/* The steps, from the resumed one to the last or to a stop. */
static int run_steps(struct run *r)
{
	const struct st_run_config *c = r->cfg;
	const struct st_train_config *tc = &r->ec.train;
	int ret;

	r->res->steps_done = (int)r->start_step;
	r->t0 = st_now_ns();
	for (int s = (int)r->start_step; s < tc->steps; s++) {
		struct st_step_result st;
		struct st_comm_stats cs0, cs1;
		bool stopping, stopped, saving, follows, evaluating;
		double val = NAN;

		/* A stop asked for (Ctrl-C, SIGTERM) ends the run after the step
		 * it comes in, saved. */
		if ((ret = st_run_zero_any(r->e, c->stop && *c->stop, &stopping)) < 0)
			return fail(r, 1, ret);
		evaluating = c->val_data && ((s + 1) % c->eval_every == 0 || s + 1 == tc->steps);
		saving = c->save && ((c->save_every && (s + 1) % c->save_every == 0) ||
				     s + 1 == tc->steps || stopping || (c->keep_best && evaluating));
		/* The next step's first forward runs in this step's update sweep,
		 * unless the state is saved or scored (or the run ends) after this
		 * step: the same numbers either way. */
		follows = s + 1 < tc->steps && !saving && !stopping && !evaluating;
		st_comm_get_stats(st_engine_comm(r->e), &cs0);
		if ((ret = st_engine_step(r->e, &r->ld, s, follows, &st)) < 0)
			return fail(r, 1, st_error_set(ret, "step %d: %s", s + 1, st_error_last()));
		st_comm_get_stats(st_engine_comm(r->e), &cs1);
		r->res->steps_done = s + 1;
		if (evaluating && (ret = val_loss(r, &val)) < 0)
			return ret;
		if ((ret = step_report(r, s, &st, val, &cs0, &cs1)) < 0)
			return ret;
		/* A stop that came during a step which began the next one saves
		 * too: with the cursor of this step's end (ld has given the next
		 * batch), and the run ends there. Read once: a signal between two
		 * reads must not end the run unsaved. */
		if ((ret = st_run_zero_any(r->e, c->stop && *c->stop, &stopped)) < 0)
			return fail(r, 1, ret);
		/* Steps whose gradient is not finite are skipped (the state stays
		 * that of the last good step); a run of them means the run has
		 * gone bad: it stops, unsaved, and says what to go on from. */
		r->skipped_in_row = st.skipped ? r->skipped_in_row + 1 : 0;
		if (c->max_skipped && r->skipped_in_row >= c->max_skipped) {
			char last[4200];

			return fail(r, 1, st_error_set(-ERANGE, "%d steps in a row had a non-finite "
						       "gradient (last at step %d): stopped; %s",
						       r->skipped_in_row, s + 1,
						       last_ckpt(c->save, last, sizeof(last))));
		}
		if (saving || (c->save && stopped)) {
			ret = st_engine_save(r->e, c->save, (uint64_t)s + 1,
					     st_engine_step_end_cursor(r->e), r->cfg_json, c->keep);
			if (ret < 0) {
				char why[1024], last[4200];

				/* a state that is not finite: refused, latest unchanged */
				snprintf(why, sizeof(why), "%s", st_error_last());
				return fail(r, 1, st_error_set(ret, "--save %s: step %d: %s%s%s", c->save,
							       s + 1, why, ret == -EINVAL ? "; " : "",
							       ret == -EINVAL ? last_ckpt(c->save, last,
											  sizeof(last)) : ""));
			}
			say(r, "saved step %d in %s\n", s + 1, c->save);
			if (c->keep_best && evaluating && (ret = val_best(r, s + 1, val)) < 0)
				return ret;
		}
		if (stopped) {
			r->res->stopped = s + 1 < tc->steps;
			break;
		}
	}
	if (c->save && tc->steps == 0) {
		if ((ret = st_engine_save(r->e, c->save, 0, &r->ld.cur, r->cfg_json, c->keep)) < 0)
			return fail(r, 1, st_error_set(ret, "--save %s: %s", c->save, st_error_last()));
		say(r, "saved step 0 in %s\n", c->save);
	}
	return 0;
}

/* The end of a run, failed or not: a failure before the first step
 * leaves nothing behind (the trace's temporary file goes, and a --save
 * DIR this run made is removed with the parents it made, all still
 * empty); one after keeps the trace so far. */
static int run_close(struct run *r, int ret)
{
	char why[4096] = "";
	int rc;

	if (r->mf && fclose(r->mf) != 0 && ret == 0)
		ret = fail(r, 1, st_error_set(-errno, "--metrics %s: %s", r->metrics,
					      strerror(errno)));
	if (ret < 0)
		snprintf(why, sizeof(why), "%s", st_error_last());
	/* A rank whose peers may wait for it in a collective cannot drain its
	 * queues: at world > 1 a failed run leaves its engine to the process's
	 * end, which ends the job (strata/comm.h). A failed run's engine goes
	 * before its trace, which it reports to. */
	if (ret < 0 && r->ec.world == 1) {
		st_engine_destroy(r->e);
		r->e = NULL;
	}
	if (ret < 0 && !r->started) {
		st_trace_abort(r->trace);
		if (r->made)
			remove_made(r->cfg->save, r->made);
	} else if (r->trace && (rc = st_trace_close(r->trace)) < 0 && ret == 0) {
		snprintf(why, sizeof(why), "--trace %s: %s", r->trace_path, st_error_last());
		ret = fail(r, 1, rc);
	}
	if (ret == 0 || r->ec.world == 1)
		st_engine_destroy(r->e);
	st_ckpt_unlock(r->save_lock);
	free(r->made);
	free(r->auto_dir);
	free(r->cfg_json);
	free(r->rank_peaks);
	if (ret < 0)
		st_error_set(ret, "%s", why);
	return ret;
}

int st_run_train(const struct st_run_config *cfg, struct st_run_result *out)
{
	struct run r = { .cfg = cfg, .res = out, .ec = cfg->engine, .init = cfg->init,
			 .resume = cfg->resume, .save_lock = -1 };
	int ret;

	*out = (struct st_run_result){ .exit_code = 1 };
	ret = run_prepare(&r);
	if (ret == 0)
		ret = run_open(&r);
	if (ret == 0) {
		r.started = true;
		/* e.g. the tokenizer beside --init goes into --save DIR */
		if (cfg->started)
			cfg->started(cfg->arg, r.init);
		ret = run_steps(&r);
	}
	ret = run_close(&r, ret);
	if (ret == 0)
		out->exit_code = 0;
	return ret;
}

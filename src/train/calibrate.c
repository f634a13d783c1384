/* strata: `strata plan --calibrate FILE`, this machine's rates measured
 * once (docs/plan.md, "Measured rates"):
 *   compute  fwd + bwd of one block of the model at the plan's B and T on
 *            the device's compute, timed by the device (a compute span);
 *            FLOPs as the planner counts them (the block's share of
 *            st_model_flops_per_token, times 4/3 for the recompute)
 *   copy     pinned host <-> vram through the vram tier's copy queues
 *   adam     the optim library's AdamW over a few hundred MB (30 B per
 *            parameter, as the planner counts it)
 *   nvme     an nvme-bench --json file, or a replay of the engine's update
 *            sweep through the nvme tier (io_uring, O_DIRECT) on the --nvme
 *            directories (below); its files are unlinked at open, so
 *            nothing stays behind
 *   cores    the cpu device: a bf16 W widened on the compute, and the XXH3
 *            sums of engine_sums.c, over 128 MiB each
 * Each figure is the best of a few rounds after a warm-up. The measuring is
 * library work (strata/calibrate.h); the CLI parses and prints. */
#include "strata/calibrate.h"
#include "strata/compute.h"
#include "strata/device.h"
#include "strata/file.h"
#include "strata/model.h"
#include "strata/optim.h"
#include "strata/plan.h"
#include "strata/tier.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdarg.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define CAL_COPY_BYTES (128ull << 20)
#define CAL_ADAM_ELEMS (8u << 20)      /* 8 Mi parameters: 144 MiB of G, P, M, V, W */
#define CAL_ROUNDS 3
#define CAL_COMPUTE_S 0.5              /* aim for this much timed compute a round */

/* One calibration: where its lines go, and how its failure ended. */
struct cal {
	FILE *log;
	int exit_code; /* of the failure: 2 bad input, 1 a system failure */
};

static void cal_say(const struct cal *k, const char *fmt, ...) ST_PRINTF(2, 3);
static void cal_say(const struct cal *k, const char *fmt, ...)
{
	va_list ap;

	if (!k->log)
		return;
	va_start(ap, fmt);
	vfprintf(k->log, fmt, ap);
	va_end(ap);
}

/* A failure: ret (-errno) with its message, and the exit code a tool
 * should give it. */
static int cal_err(struct cal *k, int exit_code, int ret, const char *fmt, ...) ST_PRINTF(4, 5);
static int cal_err(struct cal *k, int exit_code, int ret, const char *fmt, ...)
{
	char msg[2048];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	k->exit_code = exit_code;
	return st_error_set(ret, "%s", msg);
}

static int cal_fail(struct cal *k, int ret, const char *what)
{
	return cal_err(k, ret == -EINVAL || ret == -ENODEV ? 2 : 1, ret, "--calibrate: %s: %s",
		       what, st_error_last());
}

/* The first block unit (else unit 0) and its FLOPs per token: the model's
 * count with one block more or less, so the family's own formula decides. */
static int cal_block(struct cal *k, const struct st_model *m, double *flops_per_token, int T,
		     int *unit)
{
	const struct st_model_config *cfg = st_model_config(m);
	struct st_model_config c2 = *cfg;
	struct st_model *m2;
	int u = 0, ret;

	for (int i = 0; i < st_model_unit_count(m); i++)
		if (st_model_unit_layout(m, i)->kind == ST_UNIT_BLOCK) {
			u = i;
			break;
		}
	c2.n_layer = cfg->n_layer > 1 ? cfg->n_layer - 1 : cfg->n_layer + 1;
	ret = st_model_create(&c2, &m2);
	if (ret < 0)
		return cal_fail(k, ret, "the model with one block less");
	*flops_per_token = fabs(st_model_flops_per_token(m, T) - st_model_flops_per_token(m2, T));
	st_model_destroy(m2);
	*unit = u;
	return 0;
}

static void cal_fill(float *p, size_t n, float scale)
{
	for (size_t i = 0; i < n; i++)
		p[i] = scale * sinf((float)(i % 9973) * 0.37f);
}

/* compute: FLOP/s of fwd + bwd of one block, device-timed, into *flops */
static int cal_compute(struct cal *k, const struct st_plan_input *in, struct st_compute *cx,
		       struct st_tier *vram, json_object *meas, double *flops)
{
	struct st_model *m;
	const struct st_unit_layout *lay;
	double fpt = 0, per_iter, secs = 0;
	int B = in->batch, T = in->seq, u = 0, iters = 1, ret;
	size_t act, work, elems;
	struct st_extent ext;
	char *base;
	float *host;
	struct st_model_batch batch = { .B = B, .T = T, .loss_scale = 1 };

	ret = st_model_create(st_model_config(in->model), &m);
	if (ret < 0)
		return cal_fail(k, ret, "the model");
	st_model_set_compute(m, cx);
	ret = cal_block(k, m, &fpt, T, &u);
	if (ret < 0)
		goto out_model;
	lay = st_model_unit_layout(m, u);
	elems = lay->elems;
	act = st_model_act_bytes(m, u > 0 ? u - 1 : 0, B, T);
	if (!act)
		act = (size_t)B * T * 4;
	work = st_model_work_bytes(m, u, B, T);
	/* W, grad, x, y, dy, dx, work, tokens and targets */
	uint64_t need = elems * 8 + 4 * ((act + 4095) & ~(size_t)4095) + work + 2 * (size_t)B * T * 4 +
			16 * 4096;
	ret = st_tier_alloc(vram, need, &ext);
	if (ret < 0) {
		ret = cal_fail(k, ret, "vram for one block");
		goto out_model;
	}
	base = st_tier_addr(vram, &ext);
	float *w = (float *)base;
	float *g = w + elems;
	size_t a4 = ((act + 4095) & ~(size_t)4095) / 4;
	float *x = g + elems, *y = x + a4, *dy = y + a4, *dx = dy + a4;
	int32_t *tok = (int32_t *)(dx + a4), *tgt = tok + (size_t)B * T;
	void *wk = tgt + (size_t)B * T;

	host = malloc(elems > a4 ? elems * 4 : a4 * 4);
	if (!host) {
		ret = cal_err(k, 1, -ENOMEM, "--calibrate: out of memory");
		goto out_ext;
	}
	if (st_model_init_unit(m, u, 1, host) < 0) {
		free(host);
		ret = cal_fail(k, -EINVAL, "the block's initialisation");
		goto out_ext;
	}
	st_compute_from_host(cx, w, host, elems * 4);
	cal_fill(host, a4, 1.0f);
	st_compute_from_host(cx, x, host, a4 * 4);
	cal_fill(host, a4, 1e-3f);
	st_compute_from_host(cx, dy, host, a4 * 4);
	st_compute_zero(cx, g, elems * 4);
	st_compute_zero(cx, tok, (size_t)B * T * 8);
	free(host);
	batch.tokens = tok;
	batch.targets = tgt;
	per_iter = fpt * B * T * 4.0 / 3.0;
	cal_say(k, "calibrate: compute: fwd + bwd of unit %d (%zu elements) at B=%d T=%d "
		"on %s, %.2f GFLOP each\n", u, elems, B, T, st_compute_name(cx), per_iter / 1e9);
	for (int round = 0; round <= CAL_ROUNDS; round++) {
		struct st_compute_span sp[4];
		int n;

		st_compute_span_begin(cx, "calibrate");
		for (int i = 0; ret == 0 && i < iters; i++) {
			ret = st_model_fwd(m, u, &batch, w, NULL, x, y, NULL, wk, work);
			if (ret == 0)
				ret = st_model_bwd(m, u, &batch, w, NULL, x, dy, dx, g, NULL, NULL, wk,
						   work);
		}
		st_compute_span_end(cx);
		if (ret < 0) {
			ret = cal_fail(k, ret, "the block's fwd/bwd");
			goto out_ext;
		}
		ret = st_compute_sync(cx);
		if (ret < 0) {
			ret = cal_fail(k, ret, "the device's compute");
			goto out_ext;
		}
		n = st_compute_take_spans(cx, sp, 4);
		double t = n > 0 ? (double)(sp[n - 1].t1_ns - sp[n - 1].t0_ns) / 1e9 : 0;

		if (!(t > 0)) {
			ret = cal_err(k, 1, -EIO, "--calibrate: the device did not time its compute");
			goto out_ext;
		}
		if (round == 0) { /* warm-up: size the rounds from it */
			iters = (int)ceil(CAL_COMPUTE_S / t);
			iters = iters < 1 ? 1 : iters > 50 ? 50 : iters;
			continue;
		}
		if (secs == 0 || t / iters < secs)
			secs = t / iters;
		cal_say(k, "calibrate: compute: round %d/%d: %d x fwd+bwd in %.3f s, %.1f GFLOP/s\n",
			round, CAL_ROUNDS, iters, t, per_iter * iters / t / 1e9);
	}
	json_object *o = json_object_new_object();

	json_object_object_add(o, "unit", json_object_new_int(u));
	json_object_object_add(o, "flops_per_fwd_bwd", json_object_new_double(per_iter));
	json_object_object_add(o, "seconds_per_fwd_bwd", json_object_new_double(secs));
	json_object_object_add(o, "compute", json_object_new_string(st_compute_name(cx)));
	json_object_object_add(meas, "compute", o);
	*flops = per_iter / secs;
out_ext:
	st_tier_free(vram, &ext);
out_model:
	st_model_destroy(m);
	return ret;
}

/* One timed transfer of len bytes between buf and ext, in requests of io
 * bytes all in flight; seconds into *secs. */
static int cal_io(struct cal *k, struct st_tier *t, enum st_io_op op, struct st_extent *ext,
		  void *buf, uint64_t len, uint64_t io, const char *what, double *secs)
{
	struct st_tier_io ios[64];
	struct st_tier_cqe cqe[64];
	unsigned n = (unsigned)(len / io), done = 0;
	uint64_t t0 = st_now_ns();
	int ret;

	for (unsigned i = 0; i < n; i++)
		ios[i] = (struct st_tier_io){ .op = op, .ext = *ext, .ext_off_bytes = i * io,
					      .len_bytes = io, .buf = (char *)buf + i * io };
	ret = st_tier_submit(t, ios, n);
	if (ret < 0)
		return cal_fail(k, ret, what);
	while (done < n) {
		int got = st_tier_reap(t, cqe, 64, 1);

		if (got < 0)
			return cal_fail(k, got, what);
		for (int i = 0; i < got; i++)
			if (cqe[i].res < 0) {
				st_error_set((int)cqe[i].res, "%s", st_tier_error(t));
				return cal_fail(k, (int)cqe[i].res, what);
			}
		done += (unsigned)got;
	}
	*secs = (double)(st_now_ns() - t0) / 1e9;
	return 0;
}

static double cal_best(double a, double b)
{
	return a == 0 || b < a ? b : a;
}

/* vbytes of vram and hbytes of pinned host for a measure (what names it) */
static int cal_bufs(struct cal *k, struct st_tier *vram, uint64_t vbytes, struct st_extent *ve,
		    struct st_tier *host, uint64_t hbytes, struct st_extent *he, const char *what)
{
	int ret = st_tier_alloc(vram, vbytes, ve);

	if (ret < 0)
		return cal_fail(k, ret, what);
	ret = st_tier_alloc(host, hbytes, he);
	if (ret < 0) {
		st_tier_free(vram, ve);
		return cal_fail(k, ret, what);
	}
	return 0;
}

/* pinned host <-> vram through the vram tier's copy queues, into *bps */
static int cal_copy(struct cal *k, struct st_tier *vram, struct st_tier *host, json_object *meas,
		    double *bps)
{
	struct st_extent ve, he;
	double h2d = 0, d2h = 0;
	int ret;

	ret = cal_bufs(k, vram, CAL_COPY_BYTES, &ve, host, CAL_COPY_BYTES, &he,
		       "buffers for the copies");
	if (ret < 0)
		return ret;
	void *hb = st_tier_addr(host, &he);

	memset(hb, 0x3c, CAL_COPY_BYTES);
	for (int round = 0; ret == 0 && round <= CAL_ROUNDS; round++) {
		double a = 0, b = 0;

		ret = cal_io(k, vram, ST_IO_WRITE, &ve, hb, CAL_COPY_BYTES, CAL_COPY_BYTES / 8,
			     "host -> vram copy", &a);
		if (ret == 0)
			ret = cal_io(k, vram, ST_IO_READ, &ve, hb, CAL_COPY_BYTES,
				     CAL_COPY_BYTES / 8, "vram -> host copy", &b);
		if (ret < 0 || round == 0)
			continue;
		h2d = cal_best(h2d, a);
		d2h = cal_best(d2h, b);
		cal_say(k, "calibrate: copies: round %d/%d: host -> vram %.2f GB/s, "
			"vram -> host %.2f GB/s\n", round, CAL_ROUNDS, CAL_COPY_BYTES / a / 1e9,
			CAL_COPY_BYTES / b / 1e9);
	}
	if (ret == 0) {
		/* what a failed transfer left in flight ends with the tier */
		st_tier_free(vram, &ve);
		st_tier_free(host, &he);
	}
	if (ret < 0)
		return ret;
	json_object *o = json_object_new_object();

	json_object_object_add(o, "bytes", json_object_new_int64((int64_t)CAL_COPY_BYTES));
	json_object_object_add(o, "h2d_s", json_object_new_double(h2d));
	json_object_object_add(o, "d2h_s", json_object_new_double(d2h));
	json_object_object_add(meas, "copy", o);
	*bps = 2.0 * CAL_COPY_BYTES / (h2d + d2h);
	return 0;
}

/* AdamW through the optim library, 30 B per parameter, into *bps */
static int cal_adam(struct cal *k, bool bf16, json_object *meas, double *bps)
{
	size_t n = CAL_ADAM_ELEMS;
	float *g = malloc(n * 4), *p = malloc(n * 4), *m = calloc(n, 4), *v = calloc(n, 4);
	void *w = malloc(n * (bf16 ? 2 : 4));
	struct st_adam_hparams hp = { .lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
				      .weight_decay = 0.1f, .grad_scale = 1, .step = 1 };
	struct st_adam_bufs b = { .g = g, .g_dtype = ST_OPTIM_F32, .p = p, .m = m, .v = v, .w = w,
				  .w_dtype = bf16 ? ST_OPTIM_BF16 : ST_OPTIM_F32 };
	double best = 0;
	int ret = 0;

	if (!g || !p || !m || !v || !w)
		ret = cal_err(k, 1, -ENOMEM, "--calibrate: out of memory for AdamW's %zu MiB",
			      n * 18 >> 20);
	if (ret == 0) {
		cal_fill(g, n, 1e-3f);
		cal_fill(p, n, 0.02f);
	}
	for (int round = 0; ret == 0 && round <= CAL_ROUNDS; round++) {
		uint64_t t0 = st_now_ns();

		hp.step = (uint64_t)round + 1;
		ret = st_adam_update(&hp, &b, n, ST_ADAM_GRAD_CHECKED, NULL);
		if (ret < 0) {
			ret = cal_fail(k, ret, "AdamW");
			break;
		}
		double t = (double)(st_now_ns() - t0) / 1e9;

		if (round == 0)
			continue;
		best = cal_best(best, t);
		cal_say(k, "calibrate: adam: round %d/%d: %zu parameters in %.3f s, %.2f GB/s "
			"(30 B each)\n", round, CAL_ROUNDS, n, t, n * 30.0 / t / 1e9);
	}
	free(g);
	free(p);
	free(m);
	free(v);
	free(w);
	if (ret < 0)
		return ret;
	json_object *o = json_object_new_object();

	json_object_object_add(o, "elems", json_object_new_int64((int64_t)n));
	json_object_object_add(o, "seconds", json_object_new_double(best));
	json_object_object_add(o, "threads", json_object_new_int(omp_get_max_threads()));
	json_object_object_add(o, "path", json_object_new_string(st_optim_path_name(
		st_optim_path_get())));
	json_object_object_add(meas, "adam", o);
	*bps = n * 30.0 / best;
	return 0;
}

/* --- nvme: the engine's update sweep, replayed -------------------------------
 *
 * The engine's nvme traffic is the update sweep's (most of it: G, P, M, V
 * read and P, M, V, W written, 30 B a parameter of 34 with everything on
 * nvme) and the W fetches. The sweep goes tile by tile: the next tile's G,
 * P, M, V load into one of two staging sets while AdamW runs on this one,
 * and P, M, V and the new W go back from it; every byte read is checked
 * and every byte written summed (XXH3, engine_sums.c) on the host's
 * cores. The calibration does the same through the same tier (1 MiB
 * pieces, 32 in flight, the staging registered as fixed buffers), over
 * cal_nvme_bytes() of files: more than a virtualised disk's cache, so the
 * reads come from the drive. The files are written once (the fill), then
 * swept CAL_ROUNDS times; of each sweep, as the engine's lanes are timed:
 * the read lane's busy time (a read in flight, from its submission to
 * its reaping), the write lane's, and the tier's (either in flight).
 * The planner predicts nvme time as read / r + write / w (one drive), so,
 * as --rates-refresh does with a run's lanes (st_plan_rates_from_lanes),
 * both lanes' times are scaled by the tier's busy time over their sum:
 * r = read bytes / (read busy x f), w likewise, which give the sweep's
 * busy time back. The best sweep (the least tier busy time) is kept. */

#define CAL_NVME_DEFAULT_BYTES (2ull << 30)
#define CAL_NVME_WINDOW 8u
#define CAL_SUM_BLOCK (256u << 10)

/* The file size: $STRATA_CALIBRATE_NVME_BYTES (tests, a small disk), else
 * 2 GiB. */
static int cal_nvme_bytes(struct cal *k, uint64_t *bytes)
{
	const char *e = getenv("STRATA_CALIBRATE_NVME_BYTES");
	uint64_t b = 0;

	if (e && *e && st_parse_size(e, &b) < 0)
		return cal_err(k, 2, -EINVAL, "STRATA_CALIBRATE_NVME_BYTES=%s: not a size", e);
	*bytes = b ? b : CAL_NVME_DEFAULT_BYTES;
	return 0;
}

/* engine_sums.c's tile sum: the XXH3 of the XXH3s of its 256 KiB blocks,
 * the blocks on all threads; into *sum */
static int cal_sum(struct cal *k, const void *p, uint64_t len, uint64_t *sum)
{
	uint64_t nb = (len + CAL_SUM_BLOCK - 1) / CAL_SUM_BLOCK;
	uint64_t *h = malloc(nb * sizeof(*h));

	if (!h)
		return cal_err(k, 1, -ENOMEM, "--calibrate: out of memory");
#pragma omp parallel for schedule(static) if (nb > 1)
	for (uint64_t b = 0; b < nb; b++)
		h[b] = XXH3_64bits((const char *)p + b * CAL_SUM_BLOCK,
				   ST_MIN((uint64_t)CAL_SUM_BLOCK, len - b * CAL_SUM_BLOCK));
	*sum = XXH3_64bits(h, nb * sizeof(*h));
	free(h);
	return 0;
}

/* --- the cpu device's cores: widens and sums ----------------------------
 *
 * On the cpu device two passes over memory run on the cores beside the
 * model's FLOPs (docs/plan.md, "Predicted time per step"): the widen of
 * each bf16 W a unit's pass uses (st_compute_bf16_to_f32 on the compute,
 * 2 B read and 4 written an element) and the XXH3 sums of every nvme byte
 * read and written (engine_sums.c's tile sum: 256 KiB blocks on all
 * threads). Each is timed here as the engine runs it: the widen in a
 * compute span (device-timed), the sum on the host's OpenMP threads, over
 * CAL_COPY_BYTES. Only the cpu device: on a GPU a widen is a kernel among
 * the FLOPs and the sums run beside it on the host. */
static int cal_cores(struct cal *k, struct st_compute *cx, struct st_tier *vram,
		     struct st_tier *host, json_object *meas, double *widen_bps, double *sum_bps)
{
	uint64_t n = CAL_COPY_BYTES / 6 & ~4095ull; /* elements: 2 B in, 4 B out */
	uint64_t tile = (uint64_t)ST_UPDATE_TILE_ELEMS * 4; /* the engine sums a tile at a time */
	struct st_extent ve, he;
	double tw = 0, ts = 0;
	int ret;

	ret = cal_bufs(k, vram, n * 6, &ve, host, CAL_COPY_BYTES, &he,
		       "buffers for the widens and sums");
	if (ret < 0)
		return ret;
	uint16_t *src = st_tier_addr(vram, &ve);
	float *dst = (float *)(src + n);
	char *hb = st_tier_addr(host, &he);

	for (uint64_t i = 0; i < n; i++)
		src[i] = (uint16_t)(0x3c00u + (i % 977));
	memset(hb, 0x5a, CAL_COPY_BYTES);
	for (int round = 0; ret == 0 && round <= CAL_ROUNDS; round++) {
		struct st_compute_span sp[4];
		uint64_t t0, h = 0;
		int got;

		st_compute_span_begin(cx, "calibrate");
		st_compute_bf16_to_f32(cx, dst, src, n);
		st_compute_span_end(cx);
		ret = st_compute_sync(cx);
		if (ret < 0) {
			ret = cal_fail(k, ret, "the widen");
			break;
		}
		got = st_compute_take_spans(cx, sp, 4);
		double a = got > 0 ? (double)(sp[got - 1].t1_ns - sp[got - 1].t0_ns) / 1e9 : 0;

		/* bf16 to fp32 is exact: the high half of each fp32 */
		for (uint64_t i = 0; ret == 0 && i < n; i += 4093) {
			uint32_t bits;

			memcpy(&bits, &dst[i], 4);
			if (bits != (uint32_t)src[i] << 16)
				ret = cal_err(k, 1, -EIO, "--calibrate: the widen of element %llu "
					      "gave %08x for %04x", (unsigned long long)i, bits, src[i]);
		}
		t0 = st_now_ns();
		for (uint64_t off = 0; ret == 0 && off < CAL_COPY_BYTES; off += tile)
			ret = cal_sum(k, hb + off, ST_MIN(tile, CAL_COPY_BYTES - off), &h);
		double b = (double)(st_now_ns() - t0) / 1e9;

		if (ret < 0 || round == 0)
			continue;
		if (!(a > 0) || !(b > 0)) {
			ret = cal_err(k, 1, -EIO, "--calibrate: the cores' passes were not timed");
			break;
		}
		tw = cal_best(tw, a);
		ts = cal_best(ts, b);
		cal_say(k, "calibrate: cores: round %d/%d: widen %.2f GB/s (2 + 4 B an element), "
			"sums %.2f GB/s\n", round, CAL_ROUNDS, n * 6.0 / a / 1e9,
			CAL_COPY_BYTES / b / 1e9);
	}
	st_tier_free(vram, &ve);
	st_tier_free(host, &he);
	if (ret < 0)
		return ret;
	json_object *o = json_object_new_object();

	json_object_object_add(o, "widen_elems", json_object_new_int64((int64_t)n));
	json_object_object_add(o, "widen_s", json_object_new_double(tw));
	json_object_object_add(o, "sum_bytes", json_object_new_int64((int64_t)CAL_COPY_BYTES));
	json_object_object_add(o, "sum_s", json_object_new_double(ts));
	json_object_object_add(meas, "cores", o);
	*widen_bps = n * 6.0 / tw;
	*sum_bps = CAL_COPY_BYTES / ts;
	return 0;
}

/* The replay's state. A failure is kept in err: from there every request
 * and wait does nothing, and the sweep's loops end. */
struct cal_nv {
	struct cal *k;
	int err;
	struct st_tier *nv;
	struct st_extent ext;
	uint64_t tile, tiles, wb;   /* elements a tile, tiles, W's bytes each */
	char *set[2];               /* G, P, M, V (tile x 4 B each), W (tile x wb) */
	unsigned pending[2][2];     /* [set][read, write] requests in flight */
	uint64_t *sums;             /* [tiles * 5] */
	unsigned lane_n[2];         /* [read, write] in flight */
	uint64_t lane_t0[2], lane_ns[2]; /* busy since, busy so far */
};

/* A lane's count of requests in flight moves by d: its busy time runs
 * while it is above 0. */
static void cal_lane(struct cal_nv *c, int rw, int d)
{
	uint64_t now = st_now_ns();

	if (d > 0 && c->lane_n[rw]++ == 0)
		c->lane_t0[rw] = now;
	if (d < 0 && --c->lane_n[rw] == 0)
		c->lane_ns[rw] += now - c->lane_t0[rw];
}

static uint64_t cal_off(const struct cal_nv *c, uint64_t i, int s)
{
	return s < 4 ? (i * 4 + (uint64_t)s) * c->tile * 4 : c->tiles * c->tile * 16 + i * c->tile * c->wb;
}

/* Reap one or more completions (min_wait of them); count them off. */
static void cal_nv_reap(struct cal_nv *c, unsigned min_wait)
{
	struct st_tier_cqe cqe[64];
	int k = c->err ? 0 : st_tier_reap(c->nv, cqe, 64, min_wait);

	if (k < 0)
		c->err = cal_err(c->k, 1, k, "--calibrate: nvme: %s (%s)", st_tier_error(c->nv),
				 strerror(-k));
	for (int i = 0; i < k; i++) {
		uintptr_t tag = (uintptr_t)cqe[i].user;

		if (cqe[i].res < 0 && !c->err)
			c->err = cal_err(c->k, 1, (int)cqe[i].res, "--calibrate: nvme %s: %s (%s)",
					 tag & 1 ? "write" : "read", st_tier_error(c->nv),
					 strerror((int)-cqe[i].res));
		c->pending[tag >> 1][tag & 1]--;
		cal_lane(c, (int)(tag & 1), -1);
	}
}

static void cal_nv_wait(struct cal_nv *c, int set, int rw)
{
	while (c->pending[set][rw] && !c->err)
		cal_nv_reap(c, 1);
}

static void cal_nv_submit(struct cal_nv *c, int set, int rw, uint64_t off, void *buf,
			  uint64_t len)
{
	struct st_tier_io io = { .op = rw ? ST_IO_WRITE : ST_IO_READ, .ext = c->ext,
				 .ext_off_bytes = off, .len_bytes = len, .buf = buf,
				 .user = (void *)(uintptr_t)(set * 2 + rw) };
	int ret = c->err ? c->err : st_tier_submit(c->nv, &io, 1);

	if (ret < 0) {
		if (!c->err)
			c->err = cal_err(c->k, 1, ret, "--calibrate: nvme: %s (%s)",
					 st_tier_error(c->nv), strerror(-ret));
		return;
	}
	c->pending[set][rw]++;
	cal_lane(c, rw, +1);
}

/* One tile's G, P, M, V into set s. */
static void cal_sweep_load(struct cal_nv *c, int s, uint64_t i)
{
	cal_nv_wait(c, s, 1); /* the set's last stores are out */
	for (int k = 0; k < 4; k++)
		cal_nv_submit(c, s, 0, cal_off(c, i, k), c->set[s] + k * c->tile * 4, c->tile * 4);
}

/* Tile i in set s: check its sums, AdamW, sum and store P, M, V, W. */
static void cal_sweep_update(struct cal_nv *c, int s, uint64_t i, int round, bool check)
{
	float *g = (float *)c->set[s], *p = g + c->tile, *m = p + c->tile, *v = m + c->tile;
	void *w = v + c->tile;
	struct st_adam_hparams hp = { .lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
				      .weight_decay = 0.1f, .grad_scale = 1,
				      .step = (uint64_t)round + 1 };
	struct st_adam_bufs b = { .g = g, .g_dtype = ST_OPTIM_F32, .p = p, .m = m, .v = v, .w = w,
				  .w_dtype = c->wb == 2 ? ST_OPTIM_BF16 : ST_OPTIM_F32 };
	int ret;

	cal_nv_wait(c, s, 0);
	for (int k = 0; !c->err && k < 4; k++) {
		uint64_t h = 0;

		if ((ret = cal_sum(c->k, c->set[s] + k * c->tile * 4, c->tile * 4, &h)) < 0)
			c->err = ret;
		else if (check && h != c->sums[i * 5 + k])
			c->err = cal_err(c->k, 1, -EIO, "--calibrate: nvme: tile %llu state %d read "
					 "back wrong (sum %016llx, wrote %016llx)",
					 (unsigned long long)i, k, (unsigned long long)h,
					 (unsigned long long)c->sums[i * 5 + k]);
	}
	if (c->err)
		return;
	ret = st_adam_update(&hp, &b, c->tile, ST_ADAM_GRAD_CHECKED, NULL);
	if (ret < 0) {
		c->err = cal_fail(c->k, ret, "AdamW in the nvme sweep");
		return;
	}
	/* G is not written back by the update; P, M, V and W are */
	for (int k = 1; !c->err && k <= 4; k++) {
		uint64_t len = k < 4 ? c->tile * 4 : c->tile * c->wb;

		if ((ret = cal_sum(c->k, c->set[s] + k * c->tile * 4, len, &c->sums[i * 5 + k])) < 0)
			c->err = ret;
		cal_nv_submit(c, s, 1, cal_off(c, i, k), c->set[s] + k * c->tile * 4, len);
	}
}

/* The replay of one update sweep over every tile; the tier's busy time,
 * and the read and write lanes' in lane_s. */
static double cal_nv_sweep(struct cal_nv *c, int round, double *wall_s, double lane_s[2])
{
	struct st_tier_stats a, b;
	uint64_t t0 = st_now_ns();

	c->lane_ns[0] = c->lane_ns[1] = 0;
	st_tier_get_stats(c->nv, &a);
	cal_sweep_load(c, 0, 0);
	for (uint64_t i = 0; !c->err && i < c->tiles; i++) {
		if (i + 1 < c->tiles)
			cal_sweep_load(c, (int)((i + 1) % 2), i + 1);
		cal_sweep_update(c, (int)(i % 2), i, round, true);
	}
	cal_nv_wait(c, 0, 1);
	cal_nv_wait(c, 1, 1);
	if (!c->err && st_tier_sync(c->nv) < 0)
		c->err = cal_err(c->k, 1, -EIO, "--calibrate: nvme sync: %s", st_tier_error(c->nv));
	st_tier_get_stats(c->nv, &b);
	*wall_s = (double)(st_now_ns() - t0) / 1e9;
	lane_s[0] = (double)c->lane_ns[0] / 1e9;
	lane_s[1] = (double)c->lane_ns[1] / 1e9;
	return (double)(b.busy_ns - a.busy_ns) / 1e9;
}

/* The nvme rates as the engine's update sweep sees them (above). */
static int cal_nvme(struct cal *k, const struct st_plan_input *in, const char *dirs, double *rd,
		    double *wr, json_object *meas)
{
	uint64_t want = 0, tile = 0, set_bytes, file;
	struct st_tier *nv = NULL, *host = NULL;
	struct st_extent he;
	struct cal_nv c = { .k = k, .wb = in->bf16 ? 2 : 4 };
	double busy = 0, wall = 0, lane[2] = { 0, 0 }, sweep_rd, sweep_wr;
	int ret;

	if ((ret = cal_nvme_bytes(k, &want)) < 0)
		return ret;
	/* the engine's update tile: the largest unit, at most 8 Mi elements */
	for (int u = 0; u < st_model_unit_count(in->model); u++)
		tile = ST_MAX(tile, (uint64_t)st_model_unit_layout(in->model, u)->elems);
	tile = ST_MIN((tile + 4095) & ~4095ull, (uint64_t)ST_UPDATE_TILE_ELEMS);
	c.tile = tile;
	c.tiles = ST_MAX(want / (tile * (16 + c.wb)), 2ull);
	file = c.tiles * tile * (16 + c.wb);
	set_bytes = tile * (16 + c.wb);
	{
		struct st_tier_config nc = { .budget_bytes = file, .dirs = dirs };
		struct st_tier_config hc = { .budget_bytes = 2 * set_bytes + (4ull << 20) };

		ret = st_tier_create(&st_tier_nvme_ops, &nc, &nv);
		if (ret < 0)
			return cal_err(k, ret == -ENOENT || ret == -ENOTDIR ? 2 : 1, ret,
				       "--calibrate: --nvme %s: %s", dirs, st_error_last());
		ret = st_tier_create(&st_tier_host_ops, &hc, &host);
		if (ret < 0) {
			ret = cal_fail(k, ret, "the nvme sweep's staging");
			goto out;
		}
	}
	c.nv = nv;
	ret = st_tier_alloc(nv, file, &c.ext);
	if (ret == 0)
		ret = st_tier_alloc(host, 2 * set_bytes, &he);
	if (ret < 0) {
		ret = cal_fail(k, ret, "nvme extents");
		goto out;
	}
	c.set[0] = st_tier_addr(host, &he);
	c.set[1] = c.set[0] + set_bytes;
	{
		struct st_tier_buffer tb = { c.set[0], (2 * set_bytes + 4095) & ~4095ull };

		ret = st_tier_register_buffers(nv, &tb, 1);
		if (ret < 0) {
			ret = cal_fail(k, ret, "the staging as nvme buffers");
			goto out;
		}
	}
	c.sums = calloc(c.tiles * 5, sizeof(*c.sums));
	if (!c.sums) {
		ret = cal_err(k, 1, -ENOMEM, "--calibrate: out of memory");
		goto out;
	}
	/* G, P, M, V small and positive (V must be), W anything */
	for (int s = 0; s < 2; s++)
		for (uint64_t i = 0; i < tile * 4; i++)
			((float *)c.set[s])[i] = 1e-3f * (1.5f + sinf((float)(i % 9973) * 0.37f));
	cal_say(k, "calibrate: nvme: %s, %llu MiB of files (%llu tiles of %llu elements: "
		"G, P, M, V, W), the update sweep replayed, %d rounds\n", st_tier_describe(nv),
		(unsigned long long)(file >> 20), (unsigned long long)c.tiles,
		(unsigned long long)tile, CAL_ROUNDS);
	/* the fill: every tile's G, P, M, V and W written, their sums kept */
	for (int s = 0; s < 5; s++) {
		uint64_t h;

		if ((ret = cal_sum(k, c.set[0] + s * tile * 4, s < 4 ? tile * 4 : tile * c.wb, &h)) < 0)
			goto out;
		for (uint64_t i = 0; i < c.tiles; i++)
			c.sums[i * 5 + s] = h;
	}
	for (uint64_t i = 0; !c.err && i < c.tiles; i++)
		for (int s = 0; !c.err && s < 5; s++) {
			while (c.pending[0][1] >= CAL_NVME_WINDOW && !c.err)
				cal_nv_reap(&c, 1);
			cal_nv_submit(&c, 0, 1, cal_off(&c, i, s), c.set[0] + s * tile * 4,
				      s < 4 ? tile * 4 : tile * c.wb);
		}
	cal_nv_wait(&c, 0, 1);
	if (!c.err && st_tier_sync(nv) < 0)
		c.err = cal_err(k, 1, -EIO, "--calibrate: nvme sync: %s", st_tier_error(nv));
	sweep_rd = (double)c.tiles * tile * 16;
	sweep_wr = (double)c.tiles * tile * (12 + c.wb);
	for (int round = 1; !c.err && round <= CAL_ROUNDS; round++) {
		double sw_wall, ln[2], sw = cal_nv_sweep(&c, round, &sw_wall, ln);

		if (c.err)
			break;
		if (busy == 0 || sw < busy) {
			busy = sw;
			wall = sw_wall;
			lane[0] = ln[0];
			lane[1] = ln[1];
		}
		cal_say(k, "calibrate: nvme: round %d/%d: sweep %.2f GB/s read + write in "
			"%.3f s busy (%.3f s wall; read lane %.3f s, write lane %.3f s)\n", round,
			CAL_ROUNDS, (sweep_rd + sweep_wr) / sw / 1e9, sw, sw_wall, ln[0], ln[1]);
	}
	if ((ret = c.err) < 0)
		goto out;
	{
		double f = lane[0] + lane[1] > busy ? busy / (lane[0] + lane[1]) : 1;

		*rd = sweep_rd / (lane[0] * f);
		*wr = sweep_wr / (lane[1] * f);
		cal_say(k, "calibrate: nvme: the lanes' busy times scaled by %.2f (the tier's "
			"over their sum)\n", f);
		json_object *o = json_object_new_object();

		json_object_object_add(o, "source", json_object_new_string("run"));
		json_object_object_add(o, "dirs", json_object_new_string(dirs));
		json_object_object_add(o, "bytes", json_object_new_int64((int64_t)file));
		json_object_object_add(o, "tile_elems", json_object_new_int64((int64_t)tile));
		json_object_object_add(o, "sweep_read_bytes", json_object_new_int64((int64_t)sweep_rd));
		json_object_object_add(o, "sweep_write_bytes",
				       json_object_new_int64((int64_t)sweep_wr));
		json_object_object_add(o, "sweep_busy_s", json_object_new_double(busy));
		json_object_object_add(o, "sweep_wall_s", json_object_new_double(wall));
		json_object_object_add(o, "sweep_read_lane_s", json_object_new_double(lane[0]));
		json_object_object_add(o, "sweep_write_lane_s", json_object_new_double(lane[1]));
		json_object_object_add(o, "scale", json_object_new_double(f));
		json_object_object_add(meas, "nvme", o);
	}
	st_tier_unregister_buffers(nv);
	st_tier_free(host, &he);
	st_tier_free(nv, &c.ext);
out:
	/* a failure's extents and requests end with their tiers */
	free(c.sums);
	st_tier_destroy(nv);
	st_tier_destroy(host);
	return ret;
}

/* The device, its compute and the vram and host tiers the measures use:
 * one block's buffers and the copies' buffer, with room to spare. */
static int cal_open(struct cal *k, const struct st_plan_input *in, const char *device,
		    struct st_device **dev, struct st_compute **cx, struct st_tier **vram,
		    struct st_tier **host, char *dims, size_t dims_bytes)
{
	const struct st_device_ops *dops = st_device_find(device);
	const struct st_unit_layout *lay = st_model_unit_layout(in->model, 0);
	uint64_t big = 0, work = 0, act, need;
	int ret;

	for (int u = 0; u < st_model_unit_count(in->model); u++) {
		lay = st_model_unit_layout(in->model, u);
		if (lay->kind == ST_UNIT_BLOCK && lay->elems > big)
			big = lay->elems;
		if (!big && u == st_model_unit_count(in->model) - 1)
			big = st_model_unit_layout(in->model, 0)->elems;
	}
	act = st_model_act_bytes(in->model, 0, in->batch, in->seq);
	for (int u = 0; u < st_model_unit_count(in->model); u++) {
		uint64_t wb = st_model_work_bytes(in->model, u, in->batch, in->seq);

		work = wb > work ? wb : work;
	}
	need = big * 8 + 4 * (act + 4096) + work + 2ull * in->batch * in->seq * 4 + (1ull << 20);
	need = (need > CAL_COPY_BYTES ? need : CAL_COPY_BYTES) + (64ull << 20);
	need = (need + (2ull << 20) - 1) & ~((2ull << 20) - 1);
	struct st_device_config dc = { .mem_bytes = need };
	struct st_tier_config vc = { .budget_bytes = need };
	struct st_tier_config hc = { .budget_bytes = CAL_COPY_BYTES + (4ull << 20) };

	ret = st_device_create(dops, &dc, dev);
	if (ret < 0)
		return cal_err(k, ret == -ENODEV ? 2 : 1, ret, "--calibrate: device %s: %s", device,
			       st_error_last());
	cal_say(k, "calibrate: %s at B=%d T=%d on %s (%d threads): vram %llu MiB, "
		"pinned host %llu MiB\n",
		st_model_config_format(st_model_config(in->model), dims, dims_bytes),
		in->batch, in->seq, device, omp_get_max_threads(),
		(unsigned long long)(need >> 20), (unsigned long long)(hc.budget_bytes >> 20));
	ret = st_compute_create(*dev, cx);
	if (ret < 0)
		return cal_fail(k, ret, "the device's compute");
	vc.device = *dev;
	hc.device = *dev;
	ret = st_tier_create(&st_tier_vram_ops, &vc, vram);
	if (ret == 0)
		ret = st_tier_create(&st_tier_host_ops, &hc, host);
	if (ret < 0)
		return cal_fail(k, ret, "the vram and host tiers");
	return 0;
}

/* compute, copies, AdamW, the cpu device's widens and sums, and the nvme
 * (from nvme_bench, a run on nvme_dirs, or neither) into *r and meas. */
static int cal_measure(struct cal *k, const struct st_plan_input *in, const char *device,
		       const char *nvme_dirs, const char *nvme_bench, struct st_compute *cx,
		       struct st_tier *vram, struct st_tier *host, json_object *meas,
		       struct st_plan_rates *r)
{
	int ret;

	if ((ret = cal_compute(k, in, cx, vram, meas, &r->compute_flops)) < 0)
		return ret;
	cal_say(k, "calibrate: compute %.1f GFLOP/s\n", r->compute_flops / 1e9);
	if ((ret = cal_copy(k, vram, host, meas, &r->copy_bps)) < 0)
		return ret;
	cal_say(k, "calibrate: copies %.2f GB/s (host -> vram and back)\n", r->copy_bps / 1e9);
	if ((ret = cal_adam(k, in->bf16, meas, &r->adam_bps)) < 0)
		return ret;
	cal_say(k, "calibrate: adam %.2f GB/s\n", r->adam_bps / 1e9);
	if (st_device_on_host(device)) {
		if ((ret = cal_cores(k, cx, vram, host, meas, &r->widen_bps, &r->sum_bps)) < 0)
			return ret;
		cal_say(k, "calibrate: cores: widen %.2f GB/s, sums %.2f GB/s\n",
			r->widen_bps / 1e9, r->sum_bps / 1e9);
	}
	if (nvme_bench) {
		json_object *o = json_object_new_object();

		json_object_object_add(o, "source", json_object_new_string(nvme_bench));
		json_object_object_add(meas, "nvme", o);
	} else if (nvme_dirs) {
		ret = cal_nvme(k, in, nvme_dirs, &r->nvme_read_bps, &r->nvme_write_bps, meas);
		if (ret < 0)
			return ret;
	} else {
		cal_say(k, "calibrate: nvme: not measured (no --nvme DIR or --nvme-bench "
			"FILE): the file says null, the default\n");
	}
	if (r->nvme_read_bps > 0)
		cal_say(k, "calibrate: nvme %.2f GB/s read, %.2f GB/s write\n",
			r->nvme_read_bps / 1e9, r->nvme_write_bps / 1e9);
	return 0;
}

int st_calibrate(const struct st_plan_input *in, const char *device, const char *nvme_dirs,
		 const char *nvme_bench, const char *file, FILE *log, struct st_plan_rates *out,
		 int *exit_code)
{
	struct cal k = { .log = log, .exit_code = 1 };
	struct st_device *dev = NULL;
	struct st_compute *cx = NULL;
	struct st_tier *vram = NULL, *host = NULL;
	struct st_plan_rates r;
	json_object *meas = NULL;
	char dims[512] = "";
	int ret;

	memset(&r, 0, sizeof(r));
	if (!st_device_find(device)) {
		ret = cal_err(&k, 2, -ENODEV, "--calibrate: device %s is not built into this "
			      "binary (%s)", device, st_device_list());
		goto out;
	}
	/* what can be refused is refused before anything is measured: the
	 * nvme-bench file, and a FILE that cannot be written */
	if (nvme_bench && (ret = st_plan_rates_from_nvme_bench(nvme_bench, &r)) < 0) {
		ret = cal_err(&k, 2, ret, "--nvme-bench %s", st_error_last());
		goto out;
	}
	{
		struct st_file_atomic f;

		ret = st_file_atomic_open(&f, file);
		if (ret < 0) { /* a path that cannot be, as export's --out: bad input */
			ret = cal_err(&k, ret == -ENOENT || ret == -EACCES || ret == -ENOTDIR ||
				      ret == -EROFS ? 2 : 1, ret, "--calibrate %s: %s", file,
				      strerror(-ret));
			goto out;
		}
		st_file_atomic_abort(&f);
	}
	ret = cal_open(&k, in, device, &dev, &cx, &vram, &host, dims, sizeof(dims));
	if (ret < 0)
		goto out;
	meas = json_object_new_object();
	json_object_object_add(meas, "device", json_object_new_string(device));
	json_object_object_add(meas, "model", json_object_new_string(dims));
	json_object_object_add(meas, "batch", json_object_new_int(in->batch));
	json_object_object_add(meas, "seq", json_object_new_int(in->seq));
	json_object_object_add(meas, "threads", json_object_new_int(omp_get_max_threads()));
	ret = cal_measure(&k, in, device, nvme_dirs, nvme_bench, cx, vram, host, meas, &r);
	if (ret < 0)
		goto out;
	st_tier_destroy(host);
	st_tier_destroy(vram);
	st_compute_destroy(cx);
	st_device_destroy(dev);
	host = vram = NULL;
	cx = NULL;
	dev = NULL;
	ret = st_plan_rates_write(file, &r, json_object_to_json_string(meas));
	if (ret < 0) {
		ret = cal_err(&k, ret == -EINVAL ? 2 : 1, ret, "--calibrate %s", st_error_last());
		goto out;
	}
	cal_say(&k, "calibrate: wrote %s\n", file);
	for (int i = 0; i < ST_RATE_COUNT; i++)
		if (st_plan_rate_get(&r, (enum st_rate)i) > 0)
			r.source[i] = ST_RATE_SRC_FILE;
	*out = r;
out:
	json_object_put(meas);
	st_tier_destroy(host);
	st_tier_destroy(vram);
	st_compute_destroy(cx);
	st_device_destroy(dev);
	if (exit_code)
		*exit_code = ret < 0 ? k.exit_code : 0;
	return ret;
}

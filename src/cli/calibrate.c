/* strata: `strata plan --calibrate FILE`, this machine's rates measured
 * once (docs/plan.md, "Measured rates"):
 *   compute  fwd + bwd of one block of the model at the plan's B and T on
 *            the device's compute, timed by the device (a compute span);
 *            FLOPs as the planner counts them (the block's share of
 *            st_model_flops_per_token, times 4/3 for the recompute)
 *   copy     pinned host <-> vram through the vram tier's copy queues
 *   adam     the optim library's AdamW over a few hundred MB (30 B per
 *            parameter, as the planner counts it)
 *   nvme     an nvme-bench --json file, or a short write, read, and both at
 *            once (recorded, not used) through
 *            the nvme tier (io_uring, O_DIRECT) on the --nvme directories;
 *            its files are unlinked at open, so nothing stays behind
 * Each figure is the best of a few rounds after a warm-up. */
#include "cli.h"
#include "strata/compute.h"
#include "strata/device.h"
#include "strata/file.h"
#include "strata/model.h"
#include "strata/optim.h"
#include "strata/plan.h"
#include "strata/tier.h"

#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CAL_COPY_BYTES (128ull << 20)
#define CAL_ADAM_ELEMS (8u << 20)      /* 8 Mi parameters: 144 MiB of G, P, M, V, W */
#define CAL_NVME_BYTES (256ull << 20)
#define CAL_NVME_IO_BYTES (16ull << 20)
#define CAL_ROUNDS 3
#define CAL_COMPUTE_S 0.5              /* aim for this much timed compute a round */

static void cal_fail(int ret, const char *what)
{
	st_cli_die(ret == -EINVAL || ret == -ENODEV ? 2 : 1, "--calibrate: %s: %s", what,
		   st_error_last());
}

/* The first block unit (else unit 0) and its FLOPs per token: the model's
 * count with one block more or less, so the family's own formula decides. */
static int cal_block(const struct st_model *m, double *flops_per_token, int T)
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
		cal_fail(ret, "the model with one block less");
	*flops_per_token = fabs(st_model_flops_per_token(m, T) - st_model_flops_per_token(m2, T));
	st_model_destroy(m2);
	return u;
}

static void cal_fill(float *p, size_t n, float scale)
{
	for (size_t i = 0; i < n; i++)
		p[i] = scale * sinf((float)(i % 9973) * 0.37f);
}

/* compute: FLOP/s of fwd + bwd of one block, device-timed */
static double cal_compute(const struct st_plan_input *in, struct st_device *dev,
			  struct st_compute *cx, struct st_tier *vram, json_object *meas)
{
	struct st_model *m;
	const struct st_unit_layout *lay;
	double fpt, per_iter, secs = 0;
	int B = in->batch, T = in->seq, u, iters = 1, ret;
	size_t act, work, elems;
	struct st_extent ext;
	char *base;
	float *host;
	struct st_model_batch batch = { .B = B, .T = T, .loss_scale = 1 };

	(void)dev;
	ret = st_model_create(st_model_config(in->model), &m);
	if (ret < 0)
		cal_fail(ret, "the model");
	st_model_set_compute(m, cx);
	u = cal_block(m, &fpt, T);
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
	if (ret < 0)
		cal_fail(ret, "vram for one block");
	base = st_tier_addr(vram, &ext);
	float *w = (float *)base;
	float *g = w + elems;
	size_t a4 = ((act + 4095) & ~(size_t)4095) / 4;
	float *x = g + elems, *y = x + a4, *dy = y + a4, *dx = dy + a4;
	int32_t *tok = (int32_t *)(dx + a4), *tgt = tok + (size_t)B * T;
	void *wk = tgt + (size_t)B * T;

	host = malloc(elems > a4 ? elems * 4 : a4 * 4);
	if (!host)
		st_cli_die(1, "--calibrate: out of memory");
	if (st_model_init_unit(m, u, 1, host) < 0)
		cal_fail(-EINVAL, "the block's initialisation");
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
	fprintf(stderr, "calibrate: compute: fwd + bwd of unit %d (%zu elements) at B=%d T=%d "
		"on %s, %.2f GFLOP each\n", u, elems, B, T, st_compute_name(cx), per_iter / 1e9);
	for (int round = 0; round <= CAL_ROUNDS; round++) {
		struct st_compute_span sp[4];
		int n;

		st_compute_span_begin(cx, "calibrate");
		for (int i = 0; i < iters; i++) {
			ret = st_model_fwd(m, u, &batch, w, NULL, x, y, NULL, wk, work);
			if (ret == 0)
				ret = st_model_bwd(m, u, &batch, w, NULL, x, dy, dx, g, NULL, NULL, wk,
						   work);
			if (ret < 0)
				cal_fail(ret, "the block's fwd/bwd");
		}
		st_compute_span_end(cx);
		ret = st_compute_sync(cx);
		if (ret < 0)
			cal_fail(ret, "the device's compute");
		n = st_compute_take_spans(cx, sp, 4);
		double t = n > 0 ? (double)(sp[n - 1].t1_ns - sp[n - 1].t0_ns) / 1e9 : 0;

		if (!(t > 0))
			st_cli_die(1, "--calibrate: the device did not time its compute");
		if (round == 0) { /* warm-up: size the rounds from it */
			iters = (int)ceil(CAL_COMPUTE_S / t);
			iters = iters < 1 ? 1 : iters > 50 ? 50 : iters;
			continue;
		}
		if (secs == 0 || t / iters < secs)
			secs = t / iters;
		fprintf(stderr, "calibrate: compute: round %d/%d: %d x fwd+bwd in %.3f s, %.1f GFLOP/s\n",
			round, CAL_ROUNDS, iters, t, per_iter * iters / t / 1e9);
	}
	st_tier_free(vram, &ext);
	json_object *o = json_object_new_object();

	json_object_object_add(o, "unit", json_object_new_int(u));
	json_object_object_add(o, "flops_per_fwd_bwd", json_object_new_double(per_iter));
	json_object_object_add(o, "seconds_per_fwd_bwd", json_object_new_double(secs));
	json_object_object_add(o, "compute", json_object_new_string(st_compute_name(cx)));
	json_object_object_add(meas, "compute", o);
	st_model_destroy(m);
	return per_iter / secs;
}

/* One timed transfer of len bytes between buf and ext, in requests of io
 * bytes all in flight; seconds. */
static double cal_io(struct st_tier *t, enum st_io_op op, struct st_extent *ext, void *buf,
		     uint64_t len, uint64_t io, const char *what)
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
		cal_fail(ret, what);
	while (done < n) {
		int k = st_tier_reap(t, cqe, 64, 1);

		if (k < 0)
			cal_fail(k, what);
		for (int i = 0; i < k; i++)
			if (cqe[i].res < 0) {
				st_error_set((int)cqe[i].res, "%s", st_tier_error(t));
				cal_fail((int)cqe[i].res, what);
			}
		done += (unsigned)k;
	}
	return (double)(st_now_ns() - t0) / 1e9;
}

static double cal_best(double a, double b)
{
	return a == 0 || b < a ? b : a;
}

/* pinned host <-> vram through the vram tier's copy queues */
static double cal_copy(struct st_tier *vram, struct st_tier *host, json_object *meas)
{
	struct st_extent ve, he;
	double h2d = 0, d2h = 0;
	int ret;

	ret = st_tier_alloc(vram, CAL_COPY_BYTES, &ve);
	if (ret == 0)
		ret = st_tier_alloc(host, CAL_COPY_BYTES, &he);
	if (ret < 0)
		cal_fail(ret, "buffers for the copies");
	void *hb = st_tier_addr(host, &he);

	memset(hb, 0x3c, CAL_COPY_BYTES);
	for (int round = 0; round <= CAL_ROUNDS; round++) {
		double a = cal_io(vram, ST_IO_WRITE, &ve, hb, CAL_COPY_BYTES, CAL_COPY_BYTES / 8,
				  "host -> vram copy");
		double b = cal_io(vram, ST_IO_READ, &ve, hb, CAL_COPY_BYTES, CAL_COPY_BYTES / 8,
				  "vram -> host copy");

		if (round == 0)
			continue;
		h2d = cal_best(h2d, a);
		d2h = cal_best(d2h, b);
		fprintf(stderr, "calibrate: copies: round %d/%d: host -> vram %.2f GB/s, "
			"vram -> host %.2f GB/s\n", round, CAL_ROUNDS, CAL_COPY_BYTES / a / 1e9,
			CAL_COPY_BYTES / b / 1e9);
	}
	st_tier_free(vram, &ve);
	st_tier_free(host, &he);
	json_object *o = json_object_new_object();

	json_object_object_add(o, "bytes", json_object_new_int64((int64_t)CAL_COPY_BYTES));
	json_object_object_add(o, "h2d_s", json_object_new_double(h2d));
	json_object_object_add(o, "d2h_s", json_object_new_double(d2h));
	json_object_object_add(meas, "copy", o);
	return 2.0 * CAL_COPY_BYTES / (h2d + d2h);
}

/* AdamW through the optim library, 30 B per parameter */
static double cal_adam(const char *wdtype, bool bf16, json_object *meas)
{
	size_t n = CAL_ADAM_ELEMS;
	float *g = malloc(n * 4), *p = malloc(n * 4), *m = calloc(n, 4), *v = calloc(n, 4);
	void *w = malloc(n * (bf16 ? 2 : 4));
	struct st_adam_hparams hp = { .lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
				      .weight_decay = 0.1f, .grad_scale = 1, .step = 1 };
	struct st_adam_bufs b = { .g = g, .g_dtype = ST_OPTIM_F32, .p = p, .m = m, .v = v, .w = w,
				  .w_dtype = bf16 ? ST_OPTIM_BF16 : ST_OPTIM_F32 };
	double best = 0;

	(void)wdtype;
	if (!g || !p || !m || !v || !w)
		st_cli_die(1, "--calibrate: out of memory for AdamW's %zu MiB", n * 18 >> 20);
	cal_fill(g, n, 1e-3f);
	cal_fill(p, n, 0.02f);
	for (int round = 0; round <= CAL_ROUNDS; round++) {
		uint64_t t0 = st_now_ns();
		int ret;

		hp.step = (uint64_t)round + 1;
		ret = st_adam_update(&hp, &b, n, ST_ADAM_GRAD_CHECKED, NULL);
		if (ret < 0)
			cal_fail(ret, "AdamW");
		double t = (double)(st_now_ns() - t0) / 1e9;

		if (round == 0)
			continue;
		best = cal_best(best, t);
		fprintf(stderr, "calibrate: adam: round %d/%d: %zu parameters in %.3f s, %.2f GB/s "
			"(30 B each)\n", round, CAL_ROUNDS, n, t, n * 30.0 / t / 1e9);
	}
	free(g);
	free(p);
	free(m);
	free(v);
	free(w);
	json_object *o = json_object_new_object();

	json_object_object_add(o, "elems", json_object_new_int64((int64_t)n));
	json_object_object_add(o, "seconds", json_object_new_double(best));
	json_object_object_add(o, "threads", json_object_new_int(omp_get_max_threads()));
	json_object_object_add(o, "path", json_object_new_string(st_optim_path_name(
		st_optim_path_get())));
	json_object_object_add(meas, "adam", o);
	return n * 30.0 / best;
}

/* a short write, then read, through the nvme tier the engine uses */
static void cal_nvme(const char *dirs, struct st_tier *host, double *rd, double *wr,
		     json_object *meas)
{
	struct st_tier_config nc = { .budget_bytes = CAL_NVME_BYTES, .dirs = dirs };
	struct st_tier *nv;
	struct st_extent ne, he;
	double r = 0, w = 0, mx = 0;
	int ret;

	ret = st_tier_create(&st_tier_nvme_ops, &nc, &nv);
	if (ret < 0)
		st_cli_die(ret == -ENOENT || ret == -ENOTDIR ? 2 : 1, "--calibrate: --nvme %s: %s",
			   dirs, st_error_last());
	ret = st_tier_alloc(nv, CAL_NVME_BYTES, &ne);
	if (ret == 0)
		ret = st_tier_alloc(host, CAL_NVME_IO_BYTES, &he);
	if (ret < 0)
		cal_fail(ret, "nvme extents");
	void *hb = st_tier_addr(host, &he);

	memset(hb, 0xa5, CAL_NVME_IO_BYTES);
	fprintf(stderr, "calibrate: nvme: %s, %llu MiB written then read, %d rounds\n",
		st_tier_describe(nv), (unsigned long long)(CAL_NVME_BYTES >> 20), CAL_ROUNDS);
	for (int round = 0; round <= CAL_ROUNDS; round++) {
		struct st_tier_io ios[64];
		struct st_tier_cqe cqe[64];
		unsigned n = (unsigned)(CAL_NVME_BYTES / CAL_NVME_IO_BYTES);
		double t[3];

		for (int op = 0; op < 3; op++) { /* write, then read, then both at once */
			uint64_t t0 = st_now_ns();
			unsigned done = 0;

			for (unsigned i = 0; i < n; i++)
				ios[i] = (struct st_tier_io){
					.op = op == 0 || (op == 2 && i % 2) ? ST_IO_WRITE : ST_IO_READ,
					.ext = ne,
					.ext_off_bytes = i * CAL_NVME_IO_BYTES,
					.len_bytes = CAL_NVME_IO_BYTES, .buf = hb };
			ret = st_tier_submit(nv, ios, n);
			while (ret == 0 && done < n) {
				int k = st_tier_reap(nv, cqe, 64, 1);

				if (k < 0) {
					ret = k;
					break;
				}
				for (int i = 0; i < k; i++)
					if (cqe[i].res < 0)
						ret = (int)cqe[i].res;
				done += (unsigned)k;
			}
			if (ret == 0 && op != 1)
				ret = st_tier_sync(nv); /* the drive's write-back counts */
			if (ret < 0)
				st_cli_die(1, "--calibrate: nvme %s: %s (%s)", op ? "read" : "write",
					   st_tier_error(nv), strerror(-ret));
			t[op] = (double)(st_now_ns() - t0) / 1e9;
		}
		if (round == 0)
			continue;
		w = cal_best(w, t[0]);
		r = cal_best(r, t[1]);
		mx = cal_best(mx, t[2]);
		fprintf(stderr, "calibrate: nvme: round %d/%d: write %.2f GB/s, read %.2f GB/s, "
			"both at once %.2f GB/s\n", round, CAL_ROUNDS, CAL_NVME_BYTES / t[0] / 1e9,
			CAL_NVME_BYTES / t[1] / 1e9, CAL_NVME_BYTES / t[2] / 1e9);
	}
	st_tier_free(host, &he);
	st_tier_free(nv, &ne);
	st_tier_destroy(nv);
	*rd = CAL_NVME_BYTES / r;
	*wr = CAL_NVME_BYTES / w;
	json_object *o = json_object_new_object();

	json_object_object_add(o, "source", json_object_new_string("run"));
	json_object_object_add(o, "dirs", json_object_new_string(dirs));
	json_object_object_add(o, "bytes", json_object_new_int64((int64_t)CAL_NVME_BYTES));
	json_object_object_add(o, "write_s", json_object_new_double(w));
	json_object_object_add(o, "read_s", json_object_new_double(r));
	/* half the requests reads, half writes, all in flight: not a rate the
	 * planner uses (it adds read and write times), a check of that */
	json_object_object_add(o, "mixed_s", json_object_new_double(mx));
	json_object_object_add(meas, "nvme", o);
}

void st_cli_calibrate(const struct st_plan_input *in, const char *device,
		      const char *nvme_dirs, const char *nvme_bench, const char *file,
		      struct st_plan_rates *out)
{
	const struct st_device_ops *dops = st_device_find(device);
	const struct st_model_config *cfg = st_model_config(in->model);
	struct st_device *dev;
	struct st_compute *cx;
	struct st_tier *vram, *host;
	struct st_plan_rates r;
	json_object *meas = json_object_new_object();
	char dims[512];
	int ret;

	memset(&r, 0, sizeof(r));
	if (!dops)
		st_cli_die(2, "--calibrate: device %s is not built into this binary (%s)", device,
			   st_device_list());
	/* what can be refused is refused before anything is measured: the
	 * nvme-bench file, and a FILE that cannot be written */
	if (nvme_bench) {
		ret = st_plan_rates_from_nvme_bench(nvme_bench, &r);
		if (ret < 0)
			st_cli_die(2, "--nvme-bench %s", st_error_last());
	}
	{
		struct st_file_atomic f;

		ret = st_file_atomic_open(&f, file);
		if (ret < 0)
			st_cli_die(1, "--calibrate %s: %s", file, strerror(-ret));
		st_file_atomic_abort(&f);
	}
	/* one block's buffers and the copies' buffer, with room to spare */
	{
		const struct st_unit_layout *lay = st_model_unit_layout(in->model, 0);
		uint64_t big = 0;

		for (int u = 0; u < st_model_unit_count(in->model); u++) {
			lay = st_model_unit_layout(in->model, u);
			if (lay->kind == ST_UNIT_BLOCK && lay->elems > big)
				big = lay->elems;
			if (!big && u == st_model_unit_count(in->model) - 1)
				big = st_model_unit_layout(in->model, 0)->elems;
		}
		uint64_t act = st_model_act_bytes(in->model, 0, in->batch, in->seq);
		uint64_t work = 0;

		for (int u = 0; u < st_model_unit_count(in->model); u++) {
			uint64_t wb = st_model_work_bytes(in->model, u, in->batch, in->seq);

			work = wb > work ? wb : work;
		}
		uint64_t need = big * 8 + 4 * (act + 4096) + work + 2ull * in->batch * in->seq * 4 +
				(1ull << 20);

		need = (need > CAL_COPY_BYTES ? need : CAL_COPY_BYTES) + (64ull << 20);
		need = (need + (2ull << 20) - 1) & ~((2ull << 20) - 1);
		struct st_device_config dc = { .mem_bytes = need };
		struct st_tier_config vc = { .budget_bytes = need };
		struct st_tier_config hc = { .budget_bytes = CAL_COPY_BYTES + CAL_NVME_IO_BYTES +
							     (4ull << 20) };

		ret = st_device_create(dops, &dc, &dev);
		if (ret < 0)
			st_cli_die(ret == -ENODEV ? 2 : 1, "--calibrate: device %s: %s", device,
				   st_error_last());
		fprintf(stderr, "calibrate: %s at B=%d T=%d on %s (%d threads): vram %llu MiB, "
			"pinned host %llu MiB\n", st_model_config_format(cfg, dims, sizeof(dims)),
			in->batch, in->seq, device, omp_get_max_threads(),
			(unsigned long long)(need >> 20), (unsigned long long)(hc.budget_bytes >> 20));
		ret = st_compute_create(dev, &cx);
		if (ret < 0)
			cal_fail(ret, "the device's compute");
		vc.device = dev;
		hc.device = dev;
		ret = st_tier_create(&st_tier_vram_ops, &vc, &vram);
		if (ret == 0)
			ret = st_tier_create(&st_tier_host_ops, &hc, &host);
		if (ret < 0)
			cal_fail(ret, "the vram and host tiers");
	}
	json_object_object_add(meas, "device", json_object_new_string(device));
	json_object_object_add(meas, "model", json_object_new_string(dims));
	json_object_object_add(meas, "batch", json_object_new_int(in->batch));
	json_object_object_add(meas, "seq", json_object_new_int(in->seq));
	json_object_object_add(meas, "threads", json_object_new_int(omp_get_max_threads()));
	r.compute_flops = cal_compute(in, dev, cx, vram, meas);
	fprintf(stderr, "calibrate: compute %.1f GFLOP/s\n", r.compute_flops / 1e9);
	r.copy_bps = cal_copy(vram, host, meas);
	fprintf(stderr, "calibrate: copies %.2f GB/s (host -> vram and back)\n", r.copy_bps / 1e9);
	r.adam_bps = cal_adam(NULL, in->bf16, meas);
	fprintf(stderr, "calibrate: adam %.2f GB/s\n", r.adam_bps / 1e9);
	if (nvme_bench) {
		json_object *o = json_object_new_object();

		json_object_object_add(o, "source", json_object_new_string(nvme_bench));
		json_object_object_add(meas, "nvme", o);
	} else if (nvme_dirs) {
		cal_nvme(nvme_dirs, host, &r.nvme_read_bps, &r.nvme_write_bps, meas);
	} else {
		fprintf(stderr, "calibrate: nvme: not measured (no --nvme DIR or --nvme-bench "
			"FILE): the file says null, the default\n");
	}
	if (r.nvme_read_bps > 0)
		fprintf(stderr, "calibrate: nvme %.2f GB/s read, %.2f GB/s write\n",
			r.nvme_read_bps / 1e9, r.nvme_write_bps / 1e9);
	st_tier_destroy(host);
	st_tier_destroy(vram);
	st_compute_destroy(cx);
	st_device_destroy(dev);
	ret = st_plan_rates_write(file, &r, json_object_to_json_string(meas));
	json_object_put(meas);
	if (ret < 0)
		st_cli_die(ret == -EINVAL ? 2 : 1, "--calibrate %s", st_error_last());
	fprintf(stderr, "calibrate: wrote %s\n", file);
	for (int i = 0; i < ST_RATE_COUNT; i++)
		if (st_plan_rate_get(&r, (enum st_rate)i) > 0)
			r.source[i] = ST_RATE_SRC_FILE;
	*out = r;
}

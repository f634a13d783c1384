/* split-bench: does the planner's split placement pay (docs/plan.md,
 * "Placement policy")?
 *
 * A model whose optimizer state (G, P, M, V) is about twice the host
 * budget, two engines over the same data and seed at the same budgets,
 * stepped alternately in one process so the machine's noise falls on both:
 * S planned by the policy (auto: about half the optimizer state in host, the
 * rest on nvme), U with the optimizer forced to nvme (the uniform row the
 * old policy took). It prints, per round and as medians, the step time of
 * each, the ratio S/U (goal <= 0.6) and the nvme bytes each moved, with
 * the planned bytes and predicted steps beside them. The losses of S and U
 * must be bit-identical at every step, and are checked. */
#include "strata/device.h"
#include "strata/engine.h"
#include "strata/trace.h"
#include "bench_pair.h"
#include "bench_stats.h"

#include <errno.h>
#include <getopt.h>
#include <json-c/json.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#define PROG "split-bench"
#define die2(msg, arg) bench_die2(PROG, msg, arg)

static double median(const double *v, int n)
{
	double *c = malloc(sizeof(*c) * (size_t)n), m;

	if (!c) {
		fprintf(stderr, "split-bench: out of memory\n");
		exit(1);
	}
	memcpy(c, v, sizeof(*c) * (size_t)n); /* v keeps its step order */
	m = bench_median(c, n);
	free(c);
	return m;
}

static void usage(FILE *f)
{
	fprintf(f,
"usage: split-bench [--model DIMS] [--batch B] [--seq T] [--grad-accum N]\n"
"                   [--steps N] [--nvme DIR] [--gpu-mem SIZE] [--host-mem SIZE]\n"
"                   [--threads N] [--json FILE] [--device cpu|cuda] [--data FILE]\n"
"                   [--trace PREFIX]\n"
"\n"
"Step time and nvme bytes of the planner's split placement (S: auto) against\n"
"the optimizer all on nvme (U: --offload-optim nvme) at the same budgets,\n"
"stepped alternately in one run; losses checked bit-identical.\n"
"Defaults: --model layers=8,dim=768,heads=12,vocab=256,ctx=256 --batch 1\n"
"--seq 32 --grad-accum 1 --steps 6 --nvme /var/tmp --gpu-mem 2G --host-mem:\n"
"what U needs plus half the optimizer state (so the state is about twice\n"
"what host has for it) --device cpu --data /usr/share/common-licenses/GPL-3\n"
"(any file: its bytes are the tokens). The nvme files are unlinked at\n"
"creation, so nothing is left in DIR. --trace PREFIX writes each engine's\n"
"Chrome trace (as strata train --trace) to PREFIX-S.json and PREFIX-U.json.\n");
}

/* What U (the optimizer on nvme) takes of host at k = 1, plus half the
 * optimizer state: the host budget for a state twice the room it gets. */
static uint64_t default_host(const struct st_engine_config *c)
{
	struct st_model *m;
	struct st_plan p;
	struct st_plan_input in = {
		.batch = c->train.batch, .seq = c->train.seq, .grad_accum = c->train.grad_accum,
		.bf16 = c->train.bf16, .gpu_mem_bytes = c->gpu_mem_bytes,
		.host_mem_bytes = 1ull << 40, .have_nvme = true, .params = c->params,
		.optim = ST_OFFLOAD_NVME, .prefetch = 1,
	};
	uint64_t state = 0, host;

	if (st_model_create(&c->train.model, &m) < 0)
		die2("bad --model", NULL);
	in.model = m;
	if (st_plan_make(&in, &p) < 0) {
		fprintf(stderr, "split-bench: %s\n", st_error_last());
		exit(2);
	}
	for (int u = 0; u < p.units; u++)
		for (int s = ST_STATE_G; s < ST_STATE_COUNT; s++)
			state += p.state_bytes[u * ST_STATE_COUNT + s];
	host = p.total_bytes[ST_HOME_HOST] + state / 2;
	st_plan_fini(&p);
	st_model_destroy(m);
	return host;
}

static void placement_line(const struct st_plan *p, const char *name)
{
	int host = 0, nvme = 0;

	for (int u = 0; u < p->units; u++)
		for (int s = ST_STATE_G; s < ST_STATE_COUNT; s++) {
			host += st_plan_home(p, u, (enum st_state)s) == ST_HOME_HOST;
			nvme += st_plan_home(p, u, (enum st_state)s) == ST_HOME_NVME;
		}
	printf("  %s: G, P, M, V shards in host %d, on nvme %d (of %d units)%s; host %.1f of "
	       "%.1f MiB, nvme %.1f MiB\n", name, host, nvme, p->units, p->split ? ", split" : "",
	       p->total_bytes[ST_HOME_HOST] / 1048576.0, p->budget_bytes[ST_HOME_HOST] / 1048576.0,
	       p->total_bytes[ST_HOME_NVME] / 1048576.0);
}

int main(int argc, char **argv)
{
	static const struct option longs[] = {
		BENCH_OPTS_LONGS, { "grad-accum", 1, 0, 'A' }, { "trace", 1, 0, 'X' },
		{ "help", 0, 0, 'h' }, { 0 },
	};
	struct bench_opts o = {
		.model = "layers=8,dim=768,heads=12,vocab=256,ctx=256", .nvme = "/var/tmp",
		.device = "cpu", .data = "/usr/share/common-licenses/GPL-3",
		.batch = 1, .seq = 32, .steps = 6, .gpu = 2ull << 30, .host = 0,
	};
	const char *trace = NULL;
	struct st_trace *tr_s = NULL, *tr_u = NULL;
	int accum = 1, c;
	struct st_engine_config cs, cu;
	struct st_engine *es, *eu;
	struct bench_pair bp;
	double *ts, *tu, *ratio, *rs, *ru_, *ws, *wu;
	/* per lane and step: what each engine's queues were busy with */
	double *busy_s[ST_LANE_COUNT], *busy_u[ST_LANE_COUNT];

	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		if (bench_opts_take(&o, PROG, c, optarg))
			continue;
		switch (c) {
		case 'A': accum = bench_int(PROG, "grad-accum", optarg, 1024); break;
		case 'X': trace = optarg; break;
		case 'h': usage(stdout); return 0;
		default: die2("unknown or incomplete option ", argv[optind - 1]);
		}
	}
	if (optind < argc)
		die2("unexpected argument ", argv[optind]);
	/* the names the rest of the run reads them by */
	const char *model = o.model, *nvme = o.nvme, *device = o.device, *data = o.data;
	const char *json = o.json;
	const int batch = o.batch, seq = o.seq, steps = o.steps;
	uint64_t host = o.host;

	if (o.threads)
		omp_set_num_threads(o.threads);
	bench_opts_apply(&o, PROG, &cs);
	cs.train.grad_accum = accum;
	cs.nvme_dirs = nvme;
	cs.params = ST_OFFLOAD_AUTO;
	cs.optim = ST_OFFLOAD_AUTO;
	if (!host)
		host = default_host(&cs);
	cs.host_mem_bytes = host;
	cu = cs;
	cu.optim = ST_OFFLOAD_NVME;
	if (trace) {
		char p[4096];

		for (int k = 0; k < 2; k++) {
			snprintf(p, sizeof(p), "%s-%s.json", trace, k ? "U" : "S");
			if (st_trace_create(k ? &tr_u : &tr_s, p) < 0) {
				fprintf(stderr, "split-bench: --trace %s: %s\n", p, st_error_last());
				st_trace_abort(tr_s);
				return 2;
			}
		}
		cs.trace = tr_s;
		cu.trace = tr_u;
	}
	{
		const struct st_engine_config cfg[2] = { cs, cu };
		const char *names[2] = { "split", "uniform" };
		int ret = bench_pair_open(&bp, PROG, data, cfg, names);

		if (ret)
			exit(bench_pair_fail(&bp, ret, tr_s, tr_u));
		es = bp.e[0];
		eu = bp.e[1];
	}
	ts = calloc((size_t)steps, sizeof(double));
	tu = calloc((size_t)steps, sizeof(double));
	ratio = calloc((size_t)steps, sizeof(double));
	rs = calloc((size_t)steps, sizeof(double));
	ru_ = calloc((size_t)steps, sizeof(double));
	ws = calloc((size_t)steps, sizeof(double));
	wu = calloc((size_t)steps, sizeof(double));
	for (int l = 0; l < ST_LANE_COUNT; l++) {
		busy_s[l] = calloc((size_t)steps, sizeof(double));
		busy_u[l] = calloc((size_t)steps, sizeof(double));
		if (!busy_s[l] || !busy_u[l]) {
			fprintf(stderr, "split-bench: out of memory\n");
			exit(bench_pair_fail(&bp, 1, tr_s, tr_u));
		}
	}
	if (!ts || !tu || !ratio || !rs || !ru_ || !ws || !wu) {
		fprintf(stderr, "split-bench: out of memory\n");
		exit(bench_pair_fail(&bp, 1, tr_s, tr_u));
	}
	fprintf(stderr, "split-bench: %s, B=%d T=%d N=%d, %.1fM params, device %s, %d threads, "
		"host budget %.1f MiB; 1 warm-up + %d steps each, alternating\n", model, batch, seq,
		accum, (double)st_model_param_count(st_engine_model(es)) / 1e6, device,
		omp_get_max_threads(), host / 1048576.0, steps);
	for (int s = 0; s <= steps; s++) {
		struct st_step_result r[2];
		struct st_engine_stats ss, su;

		if (bench_pair_step(&bp, s, s < steps, r))
			exit(bench_pair_fail(&bp, 1, tr_s, tr_u));
		st_engine_get_stats(es, &ss);
		st_engine_get_stats(eu, &su);
		fprintf(stderr, "  step %d%s: split %.3f s, uniform %.3f s, ratio %.3f; nvme MB "
			"r/w split %.1f/%.1f, uniform %.1f/%.1f (loss %.6f both)\n", s,
			s == 0 ? " (warm-up)" : "", ss.step_ns / 1e9, su.step_ns / 1e9,
			(double)ss.step_ns / (double)su.step_ns, ss.bytes[ST_LANE_NVME_READ] / 1e6,
			ss.bytes[ST_LANE_NVME_WRITE] / 1e6, su.bytes[ST_LANE_NVME_READ] / 1e6,
			su.bytes[ST_LANE_NVME_WRITE] / 1e6, r[0].loss);
		if (s == 0)
			continue;
		ts[s - 1] = ss.step_ns / 1e9;
		tu[s - 1] = su.step_ns / 1e9;
		ratio[s - 1] = ts[s - 1] / tu[s - 1];
		rs[s - 1] = (double)ss.bytes[ST_LANE_NVME_READ];
		ws[s - 1] = (double)ss.bytes[ST_LANE_NVME_WRITE];
		ru_[s - 1] = (double)su.bytes[ST_LANE_NVME_READ];
		wu[s - 1] = (double)su.bytes[ST_LANE_NVME_WRITE];
		for (int l = 0; l < ST_LANE_COUNT; l++) {
			busy_s[l][s - 1] = ss.busy_ns[l] / 1e9;
			busy_u[l][s - 1] = su.busy_ns[l] / 1e9;
		}
	}
	{
		const struct st_plan *ps = st_engine_plan(es), *pu = st_engine_plan(eu);
		double ms = median(ts, steps), mu = median(tu, steps), mr = median(ratio, steps);
		double nbs = median(rs, steps) + median(ws, steps);
		double nbu = median(ru_, steps) + median(wu, steps);
		struct rusage ru;

		getrusage(RUSAGE_SELF, &ru);
		printf("split-bench: %s, B=%d T=%d N=%d, %.1fM params, device %s, host budget "
		       "%.1f MiB\n", model, batch, seq, accum,
		       (double)st_model_param_count(st_engine_model(es)) / 1e6, device,
		       host / 1048576.0);
		placement_line(ps, "split (S)  ");
		placement_line(pu, "uniform (U)");
		printf("  step, split (S)             %8.3f s  (median of %d; predicted %.3f s, "
		       "bound by %s)\n", ms, steps, ps->t_step_s, ps->bound);
		printf("  step, optimizer on nvme (U) %8.3f s  (predicted %.3f s, bound by %s)\n", mu,
		       pu->t_step_s, pu->bound);
		printf("  ratio S/U                   %8.3f    (median of the rounds' ratios; "
		       "goal <= 0.6)\n", mr);
		printf("  nvme bytes per step: S %.1f MB, U %.1f MB, S/U %.3f (planned %.1f / %.1f MB)\n",
		       nbs / 1e6, nbu / 1e6, nbs / nbu,
		       (double)(ps->nvme_read_bytes + ps->nvme_write_bytes) / 1e6,
		       (double)(pu->nvme_read_bytes + pu->nvme_write_bytes) / 1e6);
		for (int k = 0; k < 2; k++) {
			printf("  busy per step, %s (medians):", k ? "U" : "S");
			for (int l = 0; l < ST_LANE_COUNT; l++)
				printf(" %s %.3f s%s", st_lane_name((enum st_lane)l),
				       median(k ? busy_u[l] : busy_s[l], steps),
				       l + 1 < ST_LANE_COUNT ? "," : "\n");
		}
		printf("  peak RSS %.0f MB\n", ru.ru_maxrss / 1024.0);
		if (json) {
			json_object *o = json_object_new_object();

			json_object_object_add(o, "model", json_object_new_string(model));
			json_object_object_add(o, "device", json_object_new_string(device));
			json_object_object_add(o, "host_budget_bytes", json_object_new_int64((int64_t)host));
			json_object_object_add(o, "steps", json_object_new_int(steps));
			json_object_object_add(o, "step_split_s", json_object_new_double(ms));
			json_object_object_add(o, "step_uniform_s", json_object_new_double(mu));
			json_object_object_add(o, "ratio", json_object_new_double(mr));
			json_object_object_add(o, "nvme_bytes_split", json_object_new_double(nbs));
			json_object_object_add(o, "nvme_bytes_uniform", json_object_new_double(nbu));
			json_object_object_add(o, "predicted_step_split_s",
					       json_object_new_double(ps->t_step_s));
			json_object_object_add(o, "predicted_step_uniform_s",
					       json_object_new_double(pu->t_step_s));
			if (bench_out_write(PROG, json,
					    json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY)) < 0)
				exit(bench_pair_fail(&bp, 1, tr_s, tr_u));
			json_object_put(o);
		}
	}
	bench_pair_close(&bp);
	/* S's failure removes U's temporary too: a failed run leaves no
	 * PREFIX-U.json.tmp.XXXXXX behind the S file its line names */
	for (int k = 0; k < 2; k++)
		if (st_trace_close(k ? tr_u : tr_s) < 0) {
			fprintf(stderr, "split-bench: --trace: %s\n", st_error_last());
			if (!k)
				st_trace_abort(tr_u);
			exit(1); /* its buffers stay reachable, for LeakSanitizer */
		}
	free(ts);
	free(tu);
	free(ratio);
	free(rs);
	free(ru_);
	free(ws);
	free(wu);
	for (int l = 0; l < ST_LANE_COUNT; l++) {
		free(busy_s[l]);
		free(busy_u[l]);
	}
	return 0;
}

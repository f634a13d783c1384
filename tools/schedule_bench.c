/* schedule-bench: what --schedule layer-first saves against batch-first
 * (docs/engine.md, "Schedules"), on a model whose state lives on nvme.
 *
 * Two engines over the same data and seed, stepped alternately in one
 * process (each going first every other step, so the machine's noise falls
 * on both): A batch-first (old), B layer-first (new), both with W, G, P,
 * M, V on nvme, the same budgets and --grad-accum N (default 4). It prints
 * each one's nvme bytes and step time per step, the medians of the
 * per-step ratios B/A of nvme bytes (goal <= 0.55) and of step time (goal
 * <= 0.6), the bytes per link of each against its plan, and the model's
 * state against the host budget (the benchmark is meant for a state that
 * does not fit there). The losses and gradient norms of A and B are
 * checked bit-identical every step (bench_pair.h). */
#include "strata/engine.h"
#include "bench_pair.h"
#include "bench_stats.h"

#include <cblas.h>
#include <getopt.h>
#include <stdbool.h>
#include <json-c/json.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG "schedule-bench"
#define die2(msg, arg) bench_die2(PROG, msg, arg)

static void usage(FILE *f)
{
	fprintf(f,
"usage: schedule-bench [--model DIMS] [--batch B] [--seq T] [--steps N]\n"
"                      [--grad-accum N] [--nvme DIR] [--gpu-mem SIZE]\n"
"                      [--host-mem SIZE] [--threads N] [--json FILE]\n"
"                      [--device cpu|cuda] [--data FILE] [--update | --and-update]\n"
"                      [--rates FILE] [--clip X]\n"
"\n"
"nvme bytes and step time of --schedule layer-first (B) against batch-first\n"
"(A), every state on nvme, stepped alternately in one run; the medians of\n"
"the per-step ratios B/A (goals: nvme bytes <= 0.55, step <= 0.6).\n"
"--update: B is batch-first with --update in-backward against A, today's\n"
"update after the backward, at --grad-accum 1 unless given, without a clip\n"
"(goals: step <= 0.85; nvme bytes 30/38 at N = 1: B neither writes nor\n"
"reads back the final G). --and-update: B is layer-first with --update\n"
"in-backward, A batch-first with the update after, no clip.\n"
"--clip X: both engines' clip (default 0 with --update and --and-update).\n"
"A step of B that the clip applies to runs its forward and backward\n"
"again (replayed); the step after it updates after the backward, as A.\n"
"Defaults: --model layers=4,dim=512,heads=8,vocab=256,ctx=256 --batch 1\n"
"--seq 64 --steps 5 --grad-accum 4 --nvme /var/tmp --gpu-mem 1G\n"
"--host-mem 160M --device cpu --data /usr/share/common-licenses/GPL-3.\n"
"--rates FILE: both engines plan with a rates file (strata plan --calibrate\n"
"at the same shape), so that the predicted steps of A and B, printed with\n"
"predicted/measured - 1, are the calibrated planner's (the rates change no\n"
"placement here: every state is on nvme).\n");
}

static uint64_t nvme_bytes(const struct st_engine_stats *s)
{
	return s->bytes[ST_LANE_NVME_READ] + s->bytes[ST_LANE_NVME_WRITE];
}

static uint64_t plan_nvme(const struct st_plan *p)
{
	return p->nvme_read_bytes + p->nvme_write_bytes;
}

int main(int argc, char **argv)
{
	static const struct option longs[] = {
		BENCH_OPTS_LONGS, { "grad-accum", 1, 0, 'N' }, { "help", 0, 0, 'h' },
		{ "update", 0, 0, 'U' }, { "and-update", 0, 0, 'W' }, { "rates", 1, 0, 'R' },
		{ "clip", 1, 0, 'C' }, { 0 },
	};
	struct bench_opts o = {
		.model = "layers=4,dim=512,heads=8,vocab=256,ctx=256", .nvme = "/var/tmp",
		.device = "cpu", .data = "/usr/share/common-licenses/GPL-3",
		.batch = 1, .seq = 64, .steps = 5, .gpu = 1ull << 30, .host = 160ull << 20,
	};
	int c, accum = -1, held = 0, replayed = 0;
	double clip = -1;
	bool upd = false, and_upd = false;
	const char *rates_file = NULL;
	struct st_engine_config cfg[2];
	struct bench_pair bp;
	double *t[2], *rt, *rb;
	uint64_t last[2][ST_LANE_COUNT];
	uint64_t state_bytes = 0;

	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		if (bench_opts_take(&o, PROG, c, optarg))
			continue;
		switch (c) {
		case 'N': accum = bench_int(PROG, "grad-accum", optarg, 1024); break;
		case 'U': upd = true; break;
		case 'W': and_upd = true; break;
		case 'R': rates_file = optarg; break;
		case 'C': {
			char *end;

			clip = strtod(optarg, &end);
			if (end == optarg || *end || !(clip >= 0 && clip <= 1e9))
				die2("--clip wants a number in [0, 1e9], not ", optarg);
			break;
		}
		case 'h': usage(stdout); return 0;
		default: die2("unknown or incomplete option ", argv[optind - 1]);
		}
	}
	if (optind < argc)
		die2("unexpected argument ", argv[optind]);
	if (accum < 0)
		accum = upd ? 1 : 4;
	if (accum < 2 && !upd)
		die2("--grad-accum must be at least 2 (at 1 the schedules are one)", NULL);
	bench_opts_apply(&o, PROG, &cfg[0]);
	if (o.threads) {
		omp_set_num_threads(o.threads);
		openblas_set_num_threads(o.threads);
	}
	cfg[0].train.grad_accum = accum;
	cfg[0].host_mem_bytes = o.host;
	cfg[0].nvme_dirs = o.nvme;
	cfg[0].params = ST_OFFLOAD_NVME;
	cfg[0].optim = ST_OFFLOAD_NVME;
	cfg[0].activations = ST_OFFLOAD_NONE;
	cfg[0].recompute = ST_RECOMPUTE_ALL;
	cfg[0].schedule = ST_SCHEDULE_BATCH_FIRST;
	if (rates_file && st_plan_rates_read(rates_file, &cfg[0].rates) < 0) {
		fprintf(stderr, "%s: --rates %s\n", PROG, st_error_last());
		return 2;
	}
	/* --update: no clip unless given, so that every step's
	 * speculation holds */
	if (upd || and_upd)
		cfg[0].train.clip = 0;
	if (clip >= 0)
		cfg[0].train.clip = (float)clip;
	cfg[1] = cfg[0];
	cfg[1].update = upd || and_upd ? ST_UPDATE_IN_BACKWARD : ST_UPDATE_AFTER;
	if (!upd)
		cfg[1].schedule = ST_SCHEDULE_LAYER_FIRST;
	{
		const char *names[2] = { upd ? "update after" : "batch-first",
					 upd ? "update in-backward" : "layer-first" };
		int ret = bench_pair_open(&bp, PROG, o.data, cfg, names);

		if (ret)
			exit(bench_pair_fail(&bp, ret, NULL, NULL));
	}
	for (int k = 0; k < 2; k++) {
		t[k] = calloc((size_t)o.steps, sizeof(double));
		if (!t[k])
			exit(bench_pair_fail(&bp, 1, NULL, NULL));
	}
	rt = calloc((size_t)o.steps, sizeof(double));
	rb = calloc((size_t)o.steps, sizeof(double));
	if (!rt || !rb)
		exit(bench_pair_fail(&bp, 1, NULL, NULL));
	{
		const struct st_plan *p = st_engine_plan(bp.e[0]);

		for (int i = 0; i < p->units * ST_STATE_COUNT; i++)
			state_bytes += p->state_bytes[i];
	}
	fprintf(stderr, "%s: %s, B=%d T=%d N=%d, %.1fM params, state %.1f MB on nvme, host "
		"budget %.1f MB, device %s, %d threads; 1 warm-up + %d steps each, "
		"alternating\n", PROG, o.model, o.batch, o.seq, accum,
		(double)st_model_param_count(st_engine_model(bp.e[0])) / 1e6, state_bytes / 1e6,
		o.host / 1e6, o.device, omp_get_max_threads(), o.steps);
	for (int s = 0; s <= o.steps; s++) {
		struct st_step_result r[2];
		struct st_engine_stats st[2];

		/* every step fused with the next one's forward, as a run's */
		if (bench_pair_step(&bp, s, true, r))
			exit(bench_pair_fail(&bp, 1, NULL, NULL));
		for (int k = 0; k < 2; k++) {
			st_engine_get_stats(bp.e[k], &st[k]);
			memcpy(last[k], st[k].bytes, sizeof(last[k]));
		}
		fprintf(stderr, "  step %d%s: A %.3f s %.1f MB nvme, B %.3f s %.1f MB nvme "
			"(loss %.6f both)\n", s, s == 0 ? " (warm-up)" : "", st[0].step_ns / 1e9,
			nvme_bytes(&st[0]) / 1e6, st[1].step_ns / 1e9, nvme_bytes(&st[1]) / 1e6,
			r[0].loss);
		if (s == 0)
			continue;
		held += r[1].in_backward;
		replayed += r[1].replayed;
		for (int k = 0; k < 2; k++)
			t[k][s - 1] = st[k].step_ns / 1e9;
		rt[s - 1] = t[1][s - 1] / t[0][s - 1];
		rb[s - 1] = (double)nvme_bytes(&st[1]) / (double)nvme_bytes(&st[0]);
	}
	{
		const struct st_plan *pa = st_engine_plan(bp.e[0]), *pb = st_engine_plan(bp.e[1]);
		double ma = bench_median(t[0], o.steps), mb = bench_median(t[1], o.steps);
		double mrt = bench_median(rt, o.steps), mrb = bench_median(rb, o.steps);
		static const enum st_lane lanes[] = { ST_LANE_H2D, ST_LANE_D2H, ST_LANE_NVME_READ,
						      ST_LANE_NVME_WRITE };

		printf("%s: %s, B=%d T=%d, --grad-accum %d, device %s, %d threads\n", PROG, o.model,
		       o.batch, o.seq, accum, o.device, omp_get_max_threads());
		printf("  %.1fM params; state %.1f MB on nvme, host budget %.1f MB%s\n",
		       (double)st_model_param_count(st_engine_model(bp.e[0])) / 1e6,
		       state_bytes / 1e6, o.host / 1e6,
		       state_bytes > o.host ? " (the state does not fit there)" : "");
		printf("  step, %-20s %8.3f s  (median of %d)\n", upd ? "update after (A)" :
		       "batch-first (A)", ma, o.steps);
		printf("  step, %-20s %8.3f s\n", upd ? "in-backward (B)" : "layer-first (B)", mb);
		if (upd || and_upd)
			printf("  B's update in the backward: %d of %d steps held, %d of them "
			       "replayed\n", held, o.steps, replayed);
		printf("  median of per-step ratios B/A: nvme bytes %.3f (goal %s), step "
		       "time %.3f (goal %s)\n", mrb,
		       upd ? "30/38 at N = 1" : "<= 0.55", mrt, upd ? "<= 0.85" : "<= 0.6");
		printf("  bytes per step (last step; plan: one step unfused):\n");
		for (size_t i = 0; i < ST_ARRAY_LEN(lanes); i++) {
			uint64_t pla[] = { pa->h2d_bytes, pa->d2h_bytes, pa->nvme_read_bytes,
					   pa->nvme_write_bytes };
			uint64_t plb[] = { pb->h2d_bytes, pb->d2h_bytes, pb->nvme_read_bytes,
					   pb->nvme_write_bytes };

			printf("    %-10s A %9.1f MB (plan %9.1f)  B %9.1f MB (plan %9.1f)\n",
			       st_lane_name(lanes[i]), last[0][lanes[i]] / 1e6, pla[i] / 1e6,
			       last[1][lanes[i]] / 1e6, plb[i] / 1e6);
		}
		printf("  planned nvme bytes B/A %.3f; predicted step A %.3f s, B %.3f s "
		       "(%s rates)\n", (double)plan_nvme(pb) / (double)plan_nvme(pa), pa->t_step_s,
		       pb->t_step_s, rates_file ? "--rates FILE's" : "the default");
		printf("  predicted/measured - 1: A %+.1f%%, B %+.1f%%; predicted ratio B/A %.3f "
		       "(measured %.3f)\n", (pa->t_step_s / ma - 1) * 100,
		       (pb->t_step_s / mb - 1) * 100, pb->t_step_s / pa->t_step_s, mrt);
		if (o.json) {
			json_object *j = json_object_new_object();

			json_object_object_add(j, "model", json_object_new_string(o.model));
			json_object_object_add(j, "device", json_object_new_string(o.device));
			json_object_object_add(j, "grad_accum", json_object_new_int(accum));
			json_object_object_add(j, "compare", json_object_new_string(
								     upd ? "update" : "schedule"));
			json_object_object_add(j, "state_bytes", json_object_new_int64((int64_t)state_bytes));
			json_object_object_add(j, "host_budget_bytes",
					       json_object_new_int64((int64_t)o.host));
			json_object_object_add(j, "step_batch_first_s", json_object_new_double(ma));
			json_object_object_add(j, "step_layer_first_s", json_object_new_double(mb));
			json_object_object_add(j, "median_ratio_nvme_bytes", json_object_new_double(mrb));
			json_object_object_add(j, "median_ratio_step", json_object_new_double(mrt));
			json_object_object_add(j, "rates", json_object_new_string(
								   rates_file ? rates_file : "default"));
			json_object_object_add(j, "predicted_a_s", json_object_new_double(pa->t_step_s));
			json_object_object_add(j, "predicted_b_s", json_object_new_double(pb->t_step_s));
			json_object_object_add(j, "planned_ratio_nvme_bytes",
					       json_object_new_double((double)plan_nvme(pb) /
								      (double)plan_nvme(pa)));
			if (bench_out_write(PROG, o.json,
					    json_object_to_json_string_ext(j, JSON_C_TO_STRING_PRETTY)) < 0)
				exit(bench_pair_fail(&bp, 1, NULL, NULL));
			json_object_put(j);
		}
	}
	bench_pair_close(&bp);
	free(t[0]);
	free(t[1]);
	free(rt);
	free(rb);
	return 0;
}

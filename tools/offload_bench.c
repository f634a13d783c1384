/* offload-bench: what does streaming from nvme cost against keeping
 * everything in (device) memory, on a model where compute dominates?
 *
 * Two engines over the same data and seed, stepped alternately in one
 * process (so the machine's noise falls on both): A with every W in vram and
 * the optimizer in host memory, B with params and optimizer on nvme. It
 * prints the median step time of each and their ratio (goal: B/A <= 1.25),
 * B's overlap efficiency (the busiest queue's busy time over the step time;
 * goal >= 0.8), and the planner's predicted step time against the measured
 * one. The losses of A and B must be bit-identical, and are checked.
 * Tokens/s and model TFLOP/s (strata/model.h's count: recompute not
 * counted) of each, too: on a GPU (--device cuda) that is the table of
 * docs/gpu.md.
 * --act-ab: A is everything in vram, B the same with the activation
 * checkpoints on the host (--offload-activations host), so B/A is what the
 * activation offload costs (goal <= 1.1 on the cpu device). Every mode also
 * prints the median of the per-step ratios B/A. */
#include "strata/device.h"
#include "strata/engine.h"
#include "strata/trace.h"
#include "bench_pair.h"
#include "bench_stats.h"

#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <json-c/json.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#define PROG "offload-bench"
#define die2(msg, arg) bench_die2(PROG, msg, arg)

static void usage(FILE *f)
{
	fprintf(f,
"usage: offload-bench [--model DIMS] [--batch B] [--seq T] [--steps N]\n"
"                     [--nvme DIR] [--gpu-mem SIZE] [--host-mem SIZE]\n"
"                     [--threads N] [--trace FILE] [--json FILE]\n"
"                     [--device cpu|cuda] [--data FILE] [--verify-ab | --act-ab]\n"
"                     [--rates FILE]\n"
"\n"
"Step time with params and optimizer on nvme (B) against everything in\n"
"vram (A), stepped alternately in one run; overlap efficiency of B from its\n"
"queues; the planner's prediction against the measurement.\n"
"Defaults: --model layers=4,dim=512,heads=8,vocab=256,ctx=256 --batch 4\n"
"--seq 256 --steps 4 --nvme /var/tmp --gpu-mem 256M --host-mem 256M (for B;\n"
"A gets what it needs) --device cpu --data /usr/share/common-licenses/GPL-3\n"
"(any file: its bytes are the tokens).\n"
"--verify-ab: A is B with --verify-reads off instead, so B/A is what the\n"
"nvme checksums cost.\n"
"--act-ab: A is everything in vram, B the same with the activation\n"
"checkpoints on the host, so B/A is what the activation offload costs.\n"
"--rates FILE: also predict A and B with a rates file (strata plan --calibrate);\n"
"the predictions with the default rates, the file's and the rates measured in\n"
"this run are printed with their error against the measured median step.\n");
}

int main(int argc, char **argv)
{
	static const struct option longs[] = {
		BENCH_OPTS_LONGS, { "trace", 1, 0, 'X' }, { "verify-ab", 0, 0, 'V' },
		{ "act-ab", 0, 0, 'a' }, { "rates", 1, 0, 'R' }, { "help", 0, 0, 'h' }, { 0 },
	};
	struct bench_opts o = {
		.model = "layers=4,dim=512,heads=8,vocab=256,ctx=256", .nvme = "/var/tmp",
		.device = "cpu", .data = "/usr/share/common-licenses/GPL-3",
		.batch = 4, .seq = 256, .steps = 4, .gpu = 256ull << 20, .host = 256ull << 20,
	};
	const char *trace_path = NULL, *rates_file = NULL;
	struct st_plan_rates file_rates;
	double a_busy[ST_LANE_COUNT] = { 0 }, a_bytes[ST_LANE_COUNT] = { 0 };
	double b_busy[ST_LANE_COUNT] = { 0 }, b_bytes[ST_LANE_COUNT] = { 0 }, b_nvme = 0;
	int c;
	bool verify_ab = false, act_ab = false;
	struct st_engine_config ca, cb;
	struct st_engine *ea, *eb;
	struct bench_pair bp;
	struct st_trace *trace = NULL;
	double *ta, *tb, *eff, *ratio, busy_max = 0;
	const char *busiest = "compute";

	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		if (bench_opts_take(&o, PROG, c, optarg))
			continue;
		switch (c) {
		case 'X': trace_path = optarg; break;
		case 'V': verify_ab = true; break;
		case 'R': rates_file = optarg; break;
		case 'a': act_ab = true; break;
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

	if (verify_ab && act_ab)
		die2("--verify-ab and --act-ab are two different benchmarks", NULL);
	bench_opts_apply(&o, PROG, &ca);
	if (rates_file && st_plan_rates_read(rates_file, &file_rates) < 0) {
		fprintf(stderr, "offload-bench: --rates %s\n", st_error_last());
		return 2;
	}
	if (o.threads) {
		omp_set_num_threads(o.threads);
		openblas_set_num_threads(o.threads);
	}
	cb = ca;
	/* A: in memory. B: on nvme, with the budgets given. */
	ca.gpu_mem_bytes = 64ull << 30;
	ca.host_mem_bytes = 64ull << 30;
	ca.params = ST_OFFLOAD_NONE;
	ca.optim = ST_OFFLOAD_HOST;
	cb.gpu_mem_bytes = o.gpu;
	cb.host_mem_bytes = o.host;
	cb.nvme_dirs = nvme;
	cb.params = ST_OFFLOAD_NVME;
	cb.optim = ST_OFFLOAD_NVME;
	if (verify_ab) { /* A: B without the nvme checksums */
		ca = cb;
		ca.no_verify_reads = true;
	}
	if (act_ab) { /* B: A with the checkpoints on the host */
		ca.activations = ST_OFFLOAD_NONE;
		cb = ca;
		cb.activations = ST_OFFLOAD_HOST;
	}
	if (trace_path && st_trace_create(&trace, trace_path) < 0) {
		fprintf(stderr, "offload-bench: --trace %s: %s\n", trace_path, st_error_last());
		return 2;
	}
	cb.trace = trace;
	{
		const struct st_engine_config cfg[2] = { ca, cb };
		const char *names[2] = { "in-memory", "nvme" };
		int ret = bench_pair_open(&bp, PROG, data, cfg, names);

		if (ret)
			exit(bench_pair_fail(&bp, ret, trace, NULL));
		ea = bp.e[0];
		eb = bp.e[1];
	}
	ta = calloc((size_t)steps, sizeof(double));
	tb = calloc((size_t)steps, sizeof(double));
	eff = calloc((size_t)steps, sizeof(double));
	ratio = calloc((size_t)steps, sizeof(double));
	fprintf(stderr, "offload-bench: %s, B=%d T=%d, %.1fM params, device %s, %d threads; "
		"1 warm-up + %d steps each, alternating\n", model, batch, seq,
		(double)st_model_param_count(st_engine_model(ea)) / 1e6, device,
		omp_get_max_threads(), steps);
	for (int s = 0; s <= steps; s++) {
		struct st_step_result r[2];
		struct st_engine_stats sa, sb;

		if (bench_pair_step(&bp, s, s < steps, r))
			exit(bench_pair_fail(&bp, 1, trace, NULL));
		st_engine_get_stats(ea, &sa);
		st_engine_get_stats(eb, &sb);
		fprintf(stderr, "  step %d%s: A %.3f s, B %.3f s (loss %.6f both)\n", s,
			s == 0 ? " (warm-up)" : "", sa.step_ns / 1e9, sb.step_ns / 1e9, r[0].loss);
		if (s == 0)
			continue;
		ta[s - 1] = sa.step_ns / 1e9;
		tb[s - 1] = sb.step_ns / 1e9;
		ratio[s - 1] = tb[s - 1] / ta[s - 1];
		/* What each resource did, for the prediction with the rates measured here. */
		for (int l = 0; l < ST_LANE_COUNT; l++) {
			a_busy[l] += sa.busy_ns[l] / 1e9;
			a_bytes[l] += (double)sa.bytes[l];
			b_busy[l] += sb.busy_ns[l] / 1e9;
			b_bytes[l] += (double)sb.bytes[l];
		}
		b_nvme += sb.nvme_busy_ns / 1e9;
		busy_max = 0;
		for (int l = 0; l < ST_LANE_COUNT; l++)
			if (sb.busy_ns[l] / 1e9 > busy_max) {
				busy_max = sb.busy_ns[l] / 1e9;
				busiest = st_lane_name(l);
			}
		eff[s - 1] = busy_max / tb[s - 1];
	}
	{
		const struct st_plan *pb = st_engine_plan(eb), *pa = st_engine_plan(ea);
		struct st_engine_stats sa, sb;
		double ma = bench_median(ta, steps), mb = bench_median(tb, steps), me = bench_median(eff, steps);
		double mr = bench_median(ratio, steps);
		const char *name_a = verify_ab ? "nvme, --verify-reads off (A)"
				     : act_ab ? "checkpoints in vram (A)     "
					      : "everything in vram (A)     ";
		const char *name_b = act_ab ? "checkpoints on the host (B) "
					    : "params+optim on nvme (B)   ";
		const char *goal = verify_ab ? "1.03: the nvme checksums' cost"
				   : act_ab ? "1.1: the activation offload's cost" : "1.25";
		struct rusage ru;
		double calibrated = 0, pred[3][2] = { { 0 } };
		struct st_plan_rates here_rates;
		double tokens = (double)batch * seq;
		double tflop = st_model_flops_per_token(st_engine_model(ea), seq) * tokens / 1e12;

		st_engine_get_stats(ea, &sa);
		st_engine_get_stats(eb, &sb);
		getrusage(RUSAGE_SELF, &ru);
		printf("offload-bench: %s, B=%d T=%d, device %s\n", model, batch, seq, device);
		printf("  step, %-28s %8.3f s  (median of %d; %.0f tok/s, "
		       "%.3f model TFLOP/s)\n", name_a, ma, steps, tokens / ma, tflop / ma);
		printf("  step, %-28s %8.3f s  (%.0f tok/s, %.3f model TFLOP/s)\n",
		       name_b, mb, tokens / mb, tflop / mb);
		printf("  ratio B/A                         %8.3f   (goal <= %s)\n", mb / ma, goal);
		printf("  median of per-step ratios B/A     %8.3f\n", mr);
		if (act_ab)
			printf("  B: %d of %d checkpoints to the host and back, %.1f MB h2d and "
			       "%.1f MB d2h per step (A: %.1f, %.1f)\n", pb->act_offloaded,
			       pb->units - 1, pb->h2d_bytes / 1e6, pb->d2h_bytes / 1e6,
			       pa->h2d_bytes / 1e6, pa->d2h_bytes / 1e6);
		printf("  overlap efficiency of B           %8.3f   (busiest queue: %s; goal >= 0.8)\n",
		       me, busiest);
		printf("  predicted step of B (planner)     %8.3f s  (bound by %s; measured/predicted %.2f)\n",
		       pb->t_step_s, pb->bound, mb / pb->t_step_s);
		printf("  predicted step of A (planner)     %8.3f s  (measured/predicted %.2f)\n",
		       pa->t_step_s, ma / pa->t_step_s);
		{
			/* The prediction error: A and B, each planned as its engine
			 * was, with the default rates, the --rates file's, and the
			 * rates this run measured (each engine's own lanes). */
			struct st_plan_rates here_a, here_b, none;
			const struct st_plan_rates *sets[3] = { &none, rates_file ? &file_rates : NULL,
								&here_b };
			const char *names[3] = { "default rates", "--rates FILE", "rates measured here" };
			memset(&none, 0, sizeof(none));
			st_plan_rates_from_lanes(pa, steps, a_busy, a_bytes, 0, &here_a);
			st_plan_rates_from_lanes(pb, steps, b_busy, b_bytes, b_nvme, &here_b);
			/* compute and AdamW from A (in memory, nothing else on the
			 * cores but them), nvme from B; the copy rate is no lane's
			 * (st_plan_rates_from_lanes): the file's, or the default */
			here_b.compute_flops = here_a.compute_flops;
			here_b.adam_bps = here_a.adam_bps;
			if (rates_file) {
				here_b.copy_bps = file_rates.copy_bps;
				here_b.widen_bps = file_rates.widen_bps;
				here_b.sum_bps = file_rates.sum_bps;
			}
			here_rates = here_b;
			printf("  prediction error (predicted/measured - 1), measured A %.3f s, B %.3f s:\n",
			       ma, mb);
			for (int k = 0; k < 3; k++) {
				double t[2];

				if (!sets[k])
					continue;
				for (int ab = 0; ab < 2; ab++) {
					struct st_plan_input pin = {
						.model = st_engine_model(ab ? eb : ea), .batch = batch,
						.seq = seq, .grad_accum = 1, .bf16 = ca.train.bf16,
						.gpu_mem_bytes = ab ? cb.gpu_mem_bytes : ca.gpu_mem_bytes,
						.host_mem_bytes = ab ? cb.host_mem_bytes : ca.host_mem_bytes,
						.have_nvme = (ab ? cb.nvme_dirs : ca.nvme_dirs) != NULL,
						.params = ab ? cb.params : ca.params,
						.optim = ab ? cb.optim : ca.optim,
						.rates = *sets[k],
						.host_compute = strcmp(device, "cpu") == 0,
						.prefetch = ab ? cb.prefetch : ca.prefetch,
						.activations = ab ? cb.activations : ca.activations,
						.recompute = ab ? cb.recompute : ca.recompute,
					};
					struct st_plan pc;

					if (strcmp(device, "cuda") == 0) {
						if (!(pin.rates.compute_flops > 0))
							pin.rates.compute_flops = ST_PLAN_CUDA_COMPUTE_FLOPS;
						if (!(pin.rates.copy_bps > 0))
							pin.rates.copy_bps = ST_PLAN_CUDA_COPY_BPS;
					}
					t[ab] = 0;
					if (st_plan_make(&pin, &pc) == 0) {
						t[ab] = pc.t_step_s;
						st_plan_fini(&pc);
					}
				}
				printf("    %-22s A %8.3f s %+6.1f%%   B %8.3f s %+6.1f%%\n", names[k],
				       t[0], (t[0] / ma - 1) * 100, t[1], (t[1] / mb - 1) * 100);
				pred[k][0] = t[0];
				pred[k][1] = t[1];
			}
		}
		calibrated = pred[2][1];
		printf("    rates measured here: compute %.1f GFLOP/s, adam %.1f GB/s (A); nvme read "
		       "%.2f GB/s, write %.2f GB/s (B); copy %.2f GB/s (--rates, or 0: the default)\n",
		       here_rates.compute_flops / 1e9, here_rates.adam_bps / 1e9,
		       here_rates.nvme_read_bps / 1e9, here_rates.nvme_write_bps / 1e9,
		       here_rates.copy_bps / 1e9);
		printf("  B per step: nvme read %.1f MB, write %.1f MB; compute busy %.3f s; peak RSS %.0f MB\n",
		       sb.bytes[ST_LANE_NVME_READ] / 1e6, sb.bytes[ST_LANE_NVME_WRITE] / 1e6,
		       sb.busy_ns[ST_LANE_COMPUTE] / 1e9, ru.ru_maxrss / 1024.0);
		printf("  peak vram tier use: A %.1f MiB, B %.1f MiB\n",
		       sa.peak_bytes[ST_HOME_VRAM] / 1048576.0, sb.peak_bytes[ST_HOME_VRAM] / 1048576.0);
		if (json) {
			json_object *o = json_object_new_object();

			json_object_object_add(o, "device", json_object_new_string(device));
			/* with verify_ab, "vram" is B with --verify-reads off */
			json_object_object_add(o, "verify_ab", json_object_new_boolean(verify_ab));
			json_object_object_add(o, "model", json_object_new_string(model));
			json_object_object_add(o, "tokens_per_step", json_object_new_double(tokens));
			json_object_object_add(o, "tokens_per_s_vram", json_object_new_double(tokens / ma));
			json_object_object_add(o, "tokens_per_s_nvme", json_object_new_double(tokens / mb));
			json_object_object_add(o, "model_tflops_vram", json_object_new_double(tflop / ma));
			json_object_object_add(o, "model_tflops_nvme", json_object_new_double(tflop / mb));
			json_object_object_add(o, "step_vram_s", json_object_new_double(ma));
			json_object_object_add(o, "step_nvme_s", json_object_new_double(mb));
			json_object_object_add(o, "ratio", json_object_new_double(mb / ma));
			json_object_object_add(o, "act_ab", json_object_new_boolean(act_ab));
			json_object_object_add(o, "median_step_ratio", json_object_new_double(mr));
			json_object_object_add(o, "overlap_efficiency", json_object_new_double(me));
			json_object_object_add(o, "busiest_queue", json_object_new_string(busiest));
			json_object_object_add(o, "predicted_step_nvme_s", json_object_new_double(pb->t_step_s));
			json_object_object_add(o, "predicted_step_vram_s", json_object_new_double(pa->t_step_s));
			json_object_object_add(o, "predicted_step_nvme_calibrated_s",
					       json_object_new_double(calibrated));
			{
				static const char *keys[3] = { "default", "file", "here" };
				json_object *pe = json_object_new_object();

				for (int k = 0; k < 3; k++) {
					json_object *q;

					if (!pred[k][0])
						continue;
					q = json_object_new_object();
					json_object_object_add(q, "vram_s", json_object_new_double(pred[k][0]));
					json_object_object_add(q, "nvme_s", json_object_new_double(pred[k][1]));
					json_object_object_add(q, "vram_error",
							       json_object_new_double(pred[k][0] / ma - 1));
					json_object_object_add(q, "nvme_error",
							       json_object_new_double(pred[k][1] / mb - 1));
					json_object_object_add(pe, keys[k], q);
				}
				json_object_object_add(o, "prediction", pe);
			}
			json_object_object_add(o, "peak_vram_mib_vram",
					       json_object_new_double(sa.peak_bytes[ST_HOME_VRAM] / 1048576.0));
			json_object_object_add(o, "peak_vram_mib_nvme",
					       json_object_new_double(sb.peak_bytes[ST_HOME_VRAM] / 1048576.0));
			if (bench_out_write(PROG, json,
					    json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY)) < 0)
				exit(bench_pair_fail(&bp, 1, trace, NULL));
			json_object_put(o);
		}
	}
	bench_pair_close(&bp);
	if (trace && st_trace_close(trace) < 0) {
		fprintf(stderr, "offload-bench: --trace: %s\n", st_error_last());
		exit(1); /* its buffers stay reachable, for LeakSanitizer */
	}
	free(ta);
	free(tb);
	free(eff);
	free(ratio);
	return 0;
}

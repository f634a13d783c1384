/* strata: `strata plan`, the placement planner as a user meets it: the
 * homes of every shard, the pools, each tier against its budget and its
 * minimum, the traffic and the predicted time of a step. Bad input or a
 * budget that cannot work: one line on stderr, exit 2. */
#include "cli.h"
#include "strata/calibrate.h"
#include "strata/device.h"
#include "strata/family.h"
#include "strata/plan.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void plan_usage(FILE *f)
{
	fprintf(f,
"usage: strata plan [options] [--gpu-mem SIZE] [--host-mem SIZE] [--nvme DIR[,DIR...]]\n"
"\n"
"Where every shard of the model lives (vram, pinned host, nvme), the pools the\n"
"engine will allocate, each tier against its budget and minimum, the traffic of\n"
"one optimizer step and its predicted time. Exit 2 when a budget cannot work.\n"
"\n"
"model and batch\n"
"  --model NAME|DIMS|DIR  %s, or layers=L,dim=C,heads=H,vocab=V,ctx=T (default tiny)\n"
"                         either may follow FAMILY: (families: %s);\n"
"                         llama:layers=L,dim=C,heads=H,kv-heads=K,ffn=F,vocab=V,ctx=T\n"
"                         with optional keys for head size, rope and head (docs/model.md);\n"
"                         or a Hugging Face model directory (its config.json)\n"
"  --batch B              sequences per micro-batch (default 8)\n"
"  --seq T                tokens per sequence, at most the model's ctx (default 128)\n"
"  --grad-accum N|auto    micro-batches per step (default 1); auto: the smallest N\n"
"                         (up to 64) at which compute bounds the step, or else\n"
"                         the smallest within 10%% of the best tokens/s\n"
"  --precision bf16|fp32  working weights W (default bf16)\n"
"  --compute-dtype fp32|bf16  the tensors between the model's ops (default fp32;\n"
"                         bf16 halves the saved forward: docs/model.md)\n"
"budgets (sizes such as 512M, 2G, 1.5G; a fraction of a page rounds down to one)\n"
"  --gpu-mem SIZE|auto    vram budget (default 256M, or auto on a usable GPU); auto:\n"
"                         the GPU's free memory less max(1 GiB, 5%% of its total), on\n"
"                         the cpu device a quarter of MemAvailable\n"
"  --host-mem SIZE|auto   pinned host budget (default 1G, or auto on a usable GPU);\n"
"                         auto: half of MemAvailable on cuda, a quarter on the cpu\n"
"                         device within RLIMIT_MEMLOCK's hard limit\n"
"  --nvme DIR[,DIR...]    directories of the nvme tier (must exist; nothing is written)\n"
"  --nvme-mem SIZE        nvme budget (default: unlimited, the plan says what it needs)\n"
"placement\n"
"  --offload-params auto|none|host|nvme   home of W (default auto)\n"
"  --offload-optim auto|host|nvme|vram    home of G, P, M, V (default auto; vram:\n"
"                                         AdamW on the device, W in vram too)\n"
"  --optim-state fp32|bf16|q8  Adam's M and V (default fp32; bf16 or q8: 8-bit\n"
"                       blocks with fp32 scales, fewer bytes in every tier and\n"
"                       in the AdamW sweep; not with --offload-optim vram nor at\n"
"                       world > 1; docs/optim.md)\n"
"  --offload-activations auto|vram|host   activation checkpoints' home (default\n"
"                         auto: vram when the budget holds them with the rest,\n"
"                         else host)\n"
"  --prefetch N           units of W loaded ahead of compute; 0 = as many as fit (default)\n"
"  --recompute auto|all|none  which blocks' backward recomputes their forward: all\n"
"                         (the least vram), none (every block keeps its forward in vram;\n"
"                         exit 2 when it does not fit), auto (default: as many keep as the\n"
"                         vram budget holds after everything else, the last block first)\n"
"  --schedule batch-first|layer-first|auto  the micro-batches' order (default\n"
"                         batch-first; layer-first: each unit runs every micro-batch\n"
"                         while its W is in vram, W and G cross once a step)\n"
"  --update after|in-backward|auto  when a unit's AdamW runs (default after;\n"
"                         in-backward: once its G is final, speculating that the clip\n"
"                         does not apply; P, M, V on nvme, one more copy of them there;\n"
"                         auto: the faster, each with its own placement)\n"
"data parallelism (docs/zero.md): the plan of one rank\n"
"  --world N              data-parallel ranks (default 1)\n"
"  --rank R               the rank planned (default 0; every rank's plan is the same)\n"
"  --zero 0|1|2|3         ZeRO stage (default 0)\n"
"  --net-gbps X           GB/s a rank's collectives move over the network (default 10)\n"
"rates for the prediction (defaults are those of a 2-core VM without a GPU)\n"
"  --device auto|cpu|cuda the device's default compute and copy rates (default\n"
"                         $ST_DEVICE, else auto: cuda when a GPU is usable, else cpu;\n"
"                         the plan says which and why; cuda: fp32 matmuls at 15\n"
"                         TFLOP/s, copies at 20 GB/s)\n"
"  --nvme-bench FILE      nvme read/write GB/s from `nvme-bench --json FILE`\n"
"  --compute-gflops X     device matmul GFLOP/s (default 50)\n"
"  --copy-gbps X          host<->vram GB/s (default 8)\n"
"  --adam-gbps X          CPU AdamW GB/s, 30 B per parameter (default 10)\n"
"  --widen-gbps X         cpu device: GB/s of W's widens on the cores, bytes read and\n"
"                         written (6 an element, bf16 to fp32; default: the copy rate)\n"
"  --sum-gbps X           cpu device: GB/s of the nvme bytes' sums on the cores\n"
"                         (default: the copy rate)\n"
"  --rates FILE           the rates of a rates file (strata plan --calibrate, strata\n"
"                         train --rates-refresh); the flags above override it\n"
"  --calibrate FILE       measure this machine's rates first (compute at the model's\n"
"                         shapes on --device, pinned copies, AdamW, the cpu\n"
"                         device's widens and sums, and the nvme:\n"
"                         --nvme-bench's figures, or a short run on the first\n"
"                         --nvme DIR) and write them to FILE; then plan with them\n"
"output\n"
"  --json                 the plan as JSON (per-unit rows included)\n"
"  --verbose              also the home and bytes of every unit's states\n"
"  -h, --help\n", st_model_preset_list(), st_family_list());
}

int st_cli_plan(int argc, char **argv)
{
	static const struct option longs[] = {
		{ "model", 1, 0, 'm' }, { "batch", 1, 0, 'B' }, { "seq", 1, 0, 'T' },
		{ "grad-accum", 1, 0, 'a' }, { "precision", 1, 0, 'p' },
		{ "gpu-mem", 1, 0, 'g' }, { "host-mem", 1, 0, 'H' }, { "nvme", 1, 0, 'n' },
		{ "nvme-mem", 1, 0, 'N' }, { "offload-params", 1, 0, 'P' },
		{ "offload-optim", 1, 0, 'O' }, { "prefetch", 1, 0, 'k' },
		{ "nvme-bench", 1, 0, 'b' }, { "compute-gflops", 1, 0, 'c' },
		{ "copy-gbps", 1, 0, 'C' }, { "adam-gbps", 1, 0, 'A' },
		{ "world", 1, 0, 'w' }, { "rank", 1, 0, 'r' }, { "zero", 1, 0, 'z' },
		{ "offload-activations", 1, 0, 1001 },
		{ "net-gbps", 1, 0, 'G' }, { "device", 1, 0, 'd' }, { "recompute", 1, 0, 'R' },
		{ "schedule", 1, 0, 1006 }, { "update", 1, 0, 1008 },
		{ "rates", 1, 0, 1003 }, { "calibrate", 1, 0, 1004 },
		{ "compute-dtype", 1, 0, 1005 }, { "optim-state", 1, 0, 1007 },
		{ "widen-gbps", 1, 0, 1009 }, { "sum-gbps", 1, 0, 1010 },
		{ "json", 0, 0, 'j' }, { "verbose", 0, 0, 'v' }, { "help", 0, 0, 'h' }, { 0 },
	};
	struct st_plan_input in = {
		.batch = 8, .seq = 128, .grad_accum = 1, .bf16 = true,
		.gpu_mem_bytes = 256 * ST_MiB, .host_mem_bytes = 1 * ST_GiB,
		.params = ST_OFFLOAD_AUTO, .optim = ST_OFFLOAD_AUTO,
		.recompute = ST_RECOMPUTE_AUTO,
	};
	struct st_model_config mc;
	struct st_model *model;
	struct st_plan plan;
	const char *model_text = "tiny", *nvme = NULL, *bench = NULL;
	const char *rates_file = NULL, *calibrate = NULL, *device = st_cli_device_default();
	const char *gpu_mem = NULL, *host_mem = NULL; /* as given */
	char device_why[512] = "", gpu_why[256] = "", host_why[256] = "";
	bool json = false, verbose = false, nvme_mem_given = false, cuda = false;
	enum st_precision compute_dtype = ST_PRECISION_FP32;
	bool accum_auto = false;
	int c, ret;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		switch (c) {
		case 'm': model_text = optarg; break;
		case 'B': in.batch = (int)st_cli_long("--batch", optarg, 1, 1 << 16); break;
		case 'T': in.seq = (int)st_cli_long("--seq", optarg, 1, 1 << 20); break;
		case 'a':
			accum_auto = strcmp(optarg, "auto") == 0;
			in.grad_accum = accum_auto ? 1 :
					(int)st_cli_long("--grad-accum", optarg, 1, 1 << 16);
			break;
		case 'p':
			if (strcmp(optarg, "bf16") == 0)
				in.bf16 = true;
			else if (strcmp(optarg, "fp32") == 0)
				in.bf16 = false;
			else
				st_cli_die(2, "--precision %s: expected bf16 or fp32", optarg);
			break;
		case 'g':
			gpu_mem = optarg;
			if (strcmp(optarg, "auto") != 0)
				in.gpu_mem_bytes = st_cli_size("--gpu-mem", optarg);
			break;
		case 'H':
			host_mem = optarg;
			if (strcmp(optarg, "auto") != 0)
				in.host_mem_bytes = st_cli_size("--host-mem", optarg);
			break;
		case 'n': nvme = optarg; break;
		case 'N':
			in.nvme_mem_bytes = st_cli_size("--nvme-mem", optarg);
			nvme_mem_given = true;
			break;
		case 'P': in.params = st_cli_offload("--offload-params", optarg, true); break;
		case 'O': in.optim = st_cli_offload("--offload-optim", optarg, false); break;
		case 1001: in.activations = st_cli_offload_act(optarg); break;
		case 'k': in.prefetch = (int)st_cli_long("--prefetch", optarg, 0, 1 << 20); break;
		case 'b': bench = optarg; break;
		case 'R': in.recompute = st_cli_recompute(optarg); break;
		case 1006: in.schedule = st_cli_schedule(optarg); break;
		case 1008: in.update = st_cli_update_order(optarg); break;
		case 1007:
			if (st_optim_state_parse(optarg, &in.optim_state) < 0)
				st_cli_die(2, "--optim-state %s: expected fp32, bf16 or q8", optarg);
			break;
		case 1005:
			if (st_precision_parse(optarg, &compute_dtype) < 0)
				st_cli_die(2, "--compute-dtype %s: expected fp32 or bf16", optarg);
			break;
		case 'c':
			in.rates.compute_flops = st_cli_double("--compute-gflops", optarg, 1e-6, 1e9) * 1e9;
			break;
		case 'C':
			in.rates.copy_bps = st_cli_double("--copy-gbps", optarg, 1e-6, 1e9) * 1e9;
			break;
		case 'A':
			in.rates.adam_bps = st_cli_double("--adam-gbps", optarg, 1e-6, 1e9) * 1e9;
			break;
		case 1009:
			in.rates.widen_bps = st_cli_double("--widen-gbps", optarg, 1e-6, 1e9) * 1e9;
			break;
		case 1010:
			in.rates.sum_bps = st_cli_double("--sum-gbps", optarg, 1e-6, 1e9) * 1e9;
			break;
		case 'w': in.world = (int)st_cli_long("--world", optarg, 1, 4096); break;
		case 'r': in.rank = (int)st_cli_long("--rank", optarg, 0, 4095); break;
		case 'z': in.zero = (int)st_cli_long("--zero", optarg, 0, 3); break;
		case 'G':
			in.rates.net_bps = st_cli_double("--net-gbps", optarg, 1e-6, 1e9) * 1e9;
			break;
		case 'd':
			if (strcmp(optarg, "cuda") != 0 && strcmp(optarg, "cpu") != 0 &&
			    strcmp(optarg, "auto") != 0)
				st_cli_die(2, "--device %s: expected auto, cpu or cuda", optarg);
			device = optarg;
			break;
		case 'j': json = true; break;
		case 'v': verbose = true; break;
		case 1003: rates_file = optarg; break;
		case 1004: calibrate = optarg; break;
		case 'h': plan_usage(stdout); return 0;
		default:
			st_cli_bad_option("plan", longs, argv[optind - 1]);
		}
	}
	if (optind < argc)
		st_cli_die(2, "plan: unexpected argument %s", argv[optind]);
	{
		struct st_device_probe probe;

		device = st_cli_device(device, &probe, device_why, sizeof(device_why));
		cuda = strcmp(device, "cuda") == 0;
		/* on a usable GPU the budgets not given are what it has (a plan
		 * for a GPU elsewhere keeps the defaults) */
		if (cuda && probe.usable) {
			gpu_mem = gpu_mem ? gpu_mem : "auto";
			host_mem = host_mem ? host_mem : "auto";
		}
		if (gpu_mem && strcmp(gpu_mem, "auto") == 0)
			in.gpu_mem_bytes = st_cli_gpu_mem_auto(device, &probe, gpu_why,
							       sizeof(gpu_why));
		if (host_mem && strcmp(host_mem, "auto") == 0)
			in.host_mem_bytes = st_cli_host_mem_auto(device, host_why, sizeof(host_why));
	}
	if (in.rank >= (in.world > 1 ? in.world : 1))
		st_cli_die(2, "--rank %d: outside --world %d", in.rank, in.world > 1 ? in.world : 1);
	in.host_compute = !cuda;
	in.optim_vram_auto = cuda && in.optim_state == ST_OPTIM_STATE_F32; /* as engine.c */
	if (in.optim_state != ST_OPTIM_STATE_F32 && in.optim == ST_OFFLOAD_VRAM)
		st_cli_die(2, "--optim-state %s: not with --offload-optim vram (the device's AdamW "
			   "takes fp32 M and V); use host or nvme", st_optim_state_name(in.optim_state));
	if (in.optim_state != ST_OPTIM_STATE_F32 && in.world > 1)
		st_cli_die(2, "--optim-state %s: not with ZeRO at world > 1 (docs/optim.md); use fp32",
			   st_optim_state_name(in.optim_state));
	struct stat st;
	/* a directory with a config.json, or the config.json itself: a path
	 * with a '/' (presets and dimensions have none), or a name that is no
	 * preset and no dimensions but a directory here ("plan --model dir") */
	bool is_path = strchr(model_text, '/') != NULL;
	if (!is_path && stat(model_text, &st) == 0 && S_ISDIR(st.st_mode) &&
	    !strchr(model_text, '=') && !strchr(model_text, ':') &&
	    st_model_config_parse(model_text, &mc) < 0)
		is_path = true;
	if (is_path) {
		char path[4200];

		if (stat(model_text, &st) < 0)
			st_cli_die(errno == ENOENT || errno == ENOTDIR ? 2 : 1, "--model %s: %s",
				   model_text, strerror(errno));
		snprintf(path, sizeof(path), "%s%s", model_text,
			 S_ISDIR(st.st_mode) ? "/config.json" : "");
		ret = st_model_config_read(path, &mc);
		if (ret < 0)
			st_cli_die(ret == -ENOENT || ret == -EINVAL ? 2 : 1, "--model %s: %s",
				   model_text, st_error_last());
	} else if (st_model_config_parse(model_text, &mc) < 0) {
		st_cli_die(2, "--model %s: %s", model_text, st_error_last());
	}
	if (in.seq > mc.ctx)
		st_cli_die(2, "--seq %d is longer than the model's context of %d", in.seq, mc.ctx);
	if (nvme)
		st_cli_check_dirs("--nvme", nvme, false);
	else if (nvme_mem_given)
		st_cli_die(2, "--nvme-mem needs --nvme DIR");
	in.have_nvme = nvme != NULL;
	if (bench && st_plan_rates_from_nvme_bench(bench, &in.rates) < 0)
		st_cli_die(2, "--nvme-bench %s", st_error_last());
	if (bench) /* a measurement, as a file's */
		in.rates.source[ST_RATE_NVME_READ] = in.rates.source[ST_RATE_NVME_WRITE] =
			ST_RATE_SRC_FILE;
	if (rates_file && calibrate)
		st_cli_die(2, "--rates and --calibrate do not go together (--calibrate "
			   "measures the rates --rates would read)");
	if (rates_file) {
		struct st_plan_rates fr;

		ret = st_plan_rates_read(rates_file, &fr);
		if (ret < 0)
			st_cli_die(st_cli_input_exit(ret), "--rates %s", st_error_last());
		st_plan_rates_merge(&in.rates, &fr);
	}
	if (st_model_create(&mc, &model) < 0)
		st_cli_die(2, "--model %s: %s", model_text, st_error_last());
	if (st_model_set_precision(model, compute_dtype) < 0)
		st_cli_die(2, "%s", st_error_last());
	if (in.prefetch > st_model_unit_count(model))
		st_cli_die(2, "--prefetch %d: the model has only %d units", in.prefetch,
			 st_model_unit_count(model));
	in.model = model;
	if (calibrate) {
		struct st_plan_rates mr;
		int code;

		/* progress on stderr; exit 2 on bad input, 1 on a system failure */
		if (st_calibrate(&in, cuda ? "cuda" : "cpu", nvme, bench, calibrate, stderr, &mr,
				 &code) < 0)
			st_cli_die(code, "%s", st_error_last());
		st_plan_rates_merge(&in.rates, &mr);
	}
	/* the devices' defaults where nothing else gave a rate */
	if (cuda && in.rates.compute_flops == 0) {
		in.rates.compute_flops = ST_PLAN_CUDA_COMPUTE_FLOPS;
		in.rates.source[ST_RATE_COMPUTE] = ST_RATE_SRC_DEVICE;
	}
	if (cuda && in.rates.copy_bps == 0) {
		in.rates.copy_bps = ST_PLAN_CUDA_COPY_BPS;
		in.rates.source[ST_RATE_COPY] = ST_RATE_SRC_DEVICE;
	}
	ret = st_plan_make(&in, &plan);
	if (ret == 0 && accum_auto) {
		int n = plan.hide_best_accum > 0 ? plan.hide_best_accum : 1;

		fprintf(json ? stderr : stdout, "--grad-accum auto: %d (%s)\n", n,
			plan.hide_accum ? "the smallest at which compute bounds the step" :
			"never compute-bound up to 64; the smallest within 10% of the best tokens/s");
		st_plan_fini(&plan);
		in.grad_accum = n;
		ret = st_plan_make(&in, &plan);
	}
	if (ret < 0)
		st_cli_die(ret == -ENOSPC || ret == -EINVAL ? 2 : 1, "%s", st_error_last());
	if (json) {
		char *text = st_plan_json(&plan, &in);

		if (!text)
			st_cli_die(1, "plan: out of memory");
		puts(text);
		free(text);
	} else {
		printf("strata plan: %s\n", model_text);
		if (device_why[0])
			printf("device: %s (--device auto: %s)\n", device, device_why);
		st_cli_print_auto_budgets(in.gpu_mem_bytes, gpu_why[0] ? gpu_why : NULL,
					  in.host_mem_bytes, host_why[0] ? host_why : NULL);
		if (st_model_config_family(&mc) != st_family_default()) {
			char words[512];

			printf("%s\n", st_model_config_describe(&mc, words, sizeof(words)));
		}
		st_plan_print(&plan, &in, stdout);
		if (verbose)
			st_plan_print_units(&plan, &in, stdout);
	}
	st_plan_fini(&plan);
	st_model_destroy(model);
	return 0; /* main() checks that stdout was written */
}

/* strata: `strata info`, what strata finds before a run: on this machine
 * (the build, the CPU and the AdamW kernel it picks, memory, huge pages and
 * the locked-memory limit, NUMA, the GPU or why there is none, io_uring),
 * in the --nvme directories (each probed with the nvme tier itself: a
 * write and a read back through io_uring), and in a checkpoint directory
 * (--ckpt: what --resume would take, every step-N there, --verify their
 * sizes and XXH64). Text, or --json. Exit 2 for bad input, 1 when a probe
 * or a checkpoint fails.
 *
 * In parts (info.h): this file parses the flags and picks the output;
 * info_machine.c and info_ckpt.c each build their JSON and print its
 * text. */
#include "cli.h"
#include "info.h"

#include <getopt.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void info_usage(FILE *f)
{
	fprintf(f,
"usage: strata info [--nvme DIR[,DIR...]] [--json]\n"
"       strata info --ckpt PATH [--verify] [--json]\n"
"\n"
"What strata finds on this machine: the build, the CPU and the AdamW kernel it\n"
"picks, memory, huge pages, the locked-memory limit (the host tier's pinned\n"
"memory without a GPU), NUMA, the GPU (or why there is none), io_uring.\n"
"  --nvme DIR[,DIR...]  also each directory's file system and free space, and\n"
"                       whether the nvme tier works there: it writes 1 MiB and\n"
"                       reads it back through io_uring, with O_DIRECT or, where\n"
"                       the file system refuses it, buffered (nothing is left)\n"
"\n"
"With --ckpt, a checkpoint directory instead (a --save DIR or one step-N in\n"
"it): the checkpoint --resume DIR would take, with its step, architecture,\n"
"model, weights (parameters, tensors, dtypes, shards), training config and\n"
"files, and every step-N directory there. Other weights (a Hugging Face\n"
"directory, one model.safetensors or shards with model.safetensors.index.json;\n"
"a model.safetensors file; an llm.c model file): what they are, the\n"
"architecture and model, whether every tensor of it is there with its shape,\n"
"and the files: values, tensors and dtypes, each shard with its size.\n"
"  --verify             check each listed checkpoint's files: size and XXH64;\n"
"                       other weights: read every tensor, every value finite\n"
"\n"
"  --json               the same as one JSON object\n"
"  -h, --help\n"
"Exit status: 0 (a machine without a GPU or io_uring too); 1 when an --nvme\n"
"probe fails or a listed checkpoint is damaged; 2 for bad input (a flag, a\n"
"missing directory, no checkpoint there).\n");
}

int st_cli_info(int argc, char **argv)
{
	static const struct option longs[] = {
		{ "nvme", 1, 0, 'n' }, { "ckpt", 1, 0, 'c' }, { "verify", 0, 0, 'v' },
		{ "json", 0, 0, 'j' }, { "help", 0, 0, 'h' }, { 0 },
	};
	const char *nvme = NULL, *ckpt = NULL;
	bool json = false, verify = false, bad = false;
	struct json_object *out;
	struct st_model_config mc = { 0 };
	int c;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		switch (c) {
		case 'n': nvme = optarg; break;
		case 'c': ckpt = optarg; break;
		case 'v': verify = true; break;
		case 'j': json = true; break;
		case 'h': info_usage(stdout); return 0;
		default:
			st_cli_bad_option("info", longs, argv[optind - 1]);
		}
	}
	if (optind < argc)
		st_cli_die(2, "info: unexpected argument %s", argv[optind]);
	if (ckpt && nvme)
		st_cli_die(2, "info: --ckpt and --nvme are separate uses (see strata info --help)");
	if (verify && !ckpt)
		st_cli_die(2, "info: --verify needs --ckpt DIR");
	if (nvme) /* before the machine's probes, which may take a GPU's seconds */
		st_cli_check_dirs("--nvme", nvme, true);
	if (ckpt) {
		out = st_cli_info_ckpt_json(ckpt, verify, &bad, &mc);
	} else {
		out = st_cli_info_machine_json();
		if (nvme) {
			struct json_object *dirs = json_object_new_array();
			char *list, *save = NULL;

			list = strdup(nvme);
			if (!list)
				st_cli_die(1, "out of memory");
			for (char *d = strtok_r(list, ",", &save); d; d = strtok_r(NULL, ",", &save)) {
				struct json_object *r = st_cli_info_probe_dir(d);

				if (!json_object_get_boolean(jobj(r, "ok"))) {
					/* the exit status's reason, where errors go too */
					fprintf(stderr, "strata: info: --nvme %s: %s\n", d,
						jstr(r, "error"));
					bad = true;
				}
				json_object_array_add(dirs, r);
			}
			free(list);
			json_object_object_add(out, "nvme", dirs);
		}
	}
	if (json) {
		puts(json_object_to_json_string_ext(out, JSON_C_TO_STRING_PRETTY |
							   JSON_C_TO_STRING_NOSLASHESCAPE));
	} else if (ckpt && jstr(out, "format")) {
		st_cli_info_print_weights(out, verify, &mc);
	} else if (ckpt) {
		st_cli_info_print_ckpt(out, verify, &mc);
	} else {
		struct json_object *dirs = jobj(out, "nvme");

		st_cli_info_print_machine(out);
		for (size_t i = 0; dirs && i < json_object_array_length(dirs); i++)
			st_cli_info_print_dir(json_object_array_get_idx(dirs, i));
	}
	json_object_put(out);
	return bad ? 1 : 0; /* main() checks that stdout was written */
}

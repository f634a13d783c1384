/* strata: the command line. `strata train | plan | info | generate | eval | export`.
 * Each command is a file of its own (train_cmd.c, eval_cmd.c, ...): flags
 * become one config struct; everything else is in the seams below.
 * Bad input: one line on stderr and exit 2, before anything is written. */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static void usage(FILE *f)
{
	fprintf(f,
"usage: strata COMMAND [options]\n"
"\n"
"  train      train a GPT-2 or LLaMA family model (the default with no command)\n"
"  plan       print where every shard would live, and the predicted step\n"
"  generate   continue a prompt from a checkpoint (text through its tokenizer)\n"
"  eval       mean loss of a checkpoint on a data file\n"
"  info       what strata finds on this machine, in --nvme dirs, or in a checkpoint\n"
"  export     a checkpoint's weights for transformers (hf) or llm.c (llmc)\n"
"  tokenize   text to an llm.c token shard with a Hugging Face tokenizer\n"
"\n"
"strata COMMAND --help for each command's options.\n");
}

static int dispatch(int argc, char **argv, const char *cmd)
{
	if (argc > 1 && cmd[0] == '-') /* flags without a command: train */
		return st_cli_train(argc, argv);
	if (strcmp(cmd, "train") == 0)
		return st_cli_train(argc - 1, argv + 1);
	if (strcmp(cmd, "plan") == 0)
		return st_cli_plan(argc - 1, argv + 1);
	if (strcmp(cmd, "export") == 0)
		return st_cli_export(argc - 1, argv + 1);
	if (strcmp(cmd, "info") == 0)
		return st_cli_info(argc - 1, argv + 1);
	if (strcmp(cmd, "generate") == 0)
		return st_cli_generate(argc - 1, argv + 1);
	if (strcmp(cmd, "eval") == 0)
		return st_cli_eval(argc - 1, argv + 1);
	if (strcmp(cmd, "tokenize") == 0)
		return st_cli_tokenize(argc - 1, argv + 1);
	st_cli_die(2, "unknown command %s (see strata --help)", cmd);
}

int main(int argc, char **argv)
{
	const char *cmd = argc > 1 ? argv[1] : "train", *name = cmd;
	int rc;

	if (argc > 1 && (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0)) {
		usage(stdout);
		rc = 0;
	} else if (strcmp(cmd, "--version") == 0) {
		printf("strata %d.%d\n", ST_VERSION_MAJOR, ST_VERSION_MINOR);
		rc = 0;
	} else {
		if (cmd[0] == '-') /* flags without a command are train's */
			name = "train";
		rc = dispatch(argc, argv, cmd);
	}
	/* what every command printed: a full disk or a closed pipe under
	 * stdout is a failure, not a success with nothing in the file */
	errno = 0;
	if (fflush(stdout) != 0 || ferror(stdout))
		/* stdio keeps no errno of an earlier failed write, only its flag */
		st_cli_die(1, "%s: cannot write the output: %s", name,
			   errno ? strerror(errno) : "an earlier write to it failed");
	return rc;
}

/* Helpers shared by the strata subcommands. */
#include "cli.h"
#include "strata/train.h"
#include "strata/weights.h"

#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void (*at_die)(int code);

void st_cli_at_die(void (*fn)(int code))
{
	at_die = fn;
}

void st_cli_die(int code, const char *fmt, ...)
{
	va_list ap;

	if (at_die) {
		void (*fn)(int) = at_die;

		at_die = NULL; /* a die inside it does not come back here */
		fn(code);
	}
	fflush(stdout);
	/* one write: under mpirun another process's lines share stderr, and
	 * the line must not be cut by them */
	{
		char line[2048];
		int n = snprintf(line, sizeof(line), "strata: ");

		va_start(ap, fmt);
		vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
		va_end(ap);
		n = (int)strlen(line);
		line[n++] = '\n';
		fwrite(line, 1, (size_t)n, stderr);
	}
	exit(code);
}

int st_cli_input_exit(int err)
{
	return err == -ENOENT || err == -ENOTDIR || err == -EINVAL ? 2 : 1;
}

const char *st_cli_unprefix(const char *msg, const char *path)
{
	size_t n = strlen(path);

	return strncmp(msg, path, n) == 0 && strncmp(msg + n, ": ", 2) == 0 ? msg + n + 2 : msg;
}

long st_cli_long(const char *flag, const char *s, long lo, long hi)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		st_cli_die(2, "%s %s: expected a whole number from %ld to %ld", flag, s, lo, hi);
	return v;
}

double st_cli_double(const char *flag, const char *s, double lo, double hi)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
		st_cli_die(2, "%s %s: expected a number from %g to %g", flag, s, lo, hi);
	return v;
}

uint64_t st_cli_size(const char *flag, const char *s)
{
	uint64_t v;

	/* "2.3G": whole pages (4 KiB) below it */
	if (st_parse_size_paged(s, 4096, &v) < 0 || v == 0)
		st_cli_die(2, "%s %s: expected a size such as 512M, 2G or 2.3G", flag, s);
	return v;
}

enum st_offload st_cli_offload(const char *flag, const char *s, bool allow_none)
{
	if (strcmp(s, "auto") == 0)
		return ST_OFFLOAD_AUTO;
	if (allow_none && strcmp(s, "none") == 0)
		return ST_OFFLOAD_NONE;
	if (strcmp(s, "host") == 0)
		return ST_OFFLOAD_HOST;
	if (strcmp(s, "nvme") == 0)
		return ST_OFFLOAD_NVME;
	/* the optimizer's state only (--offload-optim): AdamW on the device */
	if (!allow_none && strcmp(s, "vram") == 0)
		return ST_OFFLOAD_VRAM;
	st_cli_die(2, "%s %s: expected %s", flag, s,
		   allow_none ? "auto, none, host or nvme" : "auto, host, nvme or vram");
}

enum st_offload st_cli_offload_act(const char *s)
{
	if (strcmp(s, "auto") == 0)
		return ST_OFFLOAD_AUTO;
	if (strcmp(s, "vram") == 0)
		return ST_OFFLOAD_NONE;
	if (strcmp(s, "host") == 0)
		return ST_OFFLOAD_HOST;
	st_cli_die(2, "--offload-activations %s: expected auto, vram or host", s);
}

enum st_recompute st_cli_recompute(const char *s)
{
	if (strcmp(s, "auto") == 0)
		return ST_RECOMPUTE_AUTO;
	if (strcmp(s, "all") == 0)
		return ST_RECOMPUTE_ALL;
	if (strcmp(s, "none") == 0)
		return ST_RECOMPUTE_NONE;
	st_cli_die(2, "--recompute %s: expected auto, all or none", s);
}

enum st_schedule st_cli_schedule(const char *s)
{
	if (strcmp(s, "batch-first") == 0)
		return ST_SCHEDULE_BATCH_FIRST;
	if (strcmp(s, "layer-first") == 0)
		return ST_SCHEDULE_LAYER_FIRST;
	if (strcmp(s, "auto") == 0)
		return ST_SCHEDULE_AUTO;
	st_cli_die(2, "--schedule %s: expected batch-first, layer-first or auto", s);
}

enum st_update_order st_cli_update_order(const char *s)
{
	for (int u = ST_UPDATE_AFTER; u <= ST_UPDATE_AUTO; u++)
		if (strcmp(s, st_update_order_name((enum st_update_order)u)) == 0)
			return (enum st_update_order)u;
	st_cli_die(2, "--update %s: expected after, in-backward or auto", s);
}

void st_cli_check_dirs(const char *flag, const char *list, bool writable)
{
	const char *p = list;

	if (!*list)
		st_cli_die(2, "%s: expected DIR[,DIR...]", flag);
	while (*p) {
		size_t n = strcspn(p, ",");
		char dir[4096];
		struct stat st;

		if (n == 0 || n >= sizeof(dir))
			st_cli_die(2, "%s %s: expected DIR[,DIR...]", flag, list);
		memcpy(dir, p, n);
		dir[n] = 0;
		if (stat(dir, &st) < 0)
			st_cli_die(2, "%s %s: %s", flag, dir, strerror(errno));
		if (!S_ISDIR(st.st_mode))
			st_cli_die(2, "%s %s: not a directory", flag, dir);
		if (writable && access(dir, W_OK | X_OK) < 0)
			st_cli_die(2, "%s %s: %s", flag, dir, strerror(errno));
		p += n;
		if (*p == ',' && !*++p)
			st_cli_die(2, "%s %s: expected DIR[,DIR...]", flag, list);
	}
}

void set_threads_cli(int n)
{
	if (n > 0) {
		omp_set_num_threads(n);
		openblas_set_num_threads(n);
	}
}

struct st_dataset *st_cli_open_data(const char *path, int vocab)
{
	struct st_dataset *ds;
	struct stat st;

	if (stat(path, &st) < 0)
		st_cli_die(2, "--data %s: %s", path, strerror(errno));
	if (!S_ISREG(st.st_mode))
		st_cli_die(2, "--data %s: not a regular file", path);
	if (st_dataset_open(&ds, path, ST_DATASET_AUTO) < 0)
		st_cli_die(2, "--data %s: %s", path, st_error_last());
	if (st_dataset_max_token(ds) >= (uint32_t)vocab)
		st_cli_die(2, "--data %s: token %u is outside the model's vocabulary of %d", path,
			   st_dataset_max_token(ds), vocab);
	return ds;
}

bool st_cli_data_is_list(const char *spec)
{
	return strpbrk(spec, ",*?[") != NULL;
}

static void data_add(const char *path, char ***v, size_t *n)
{
	*v = realloc(*v, (*n + 1) * sizeof(**v));
	if (!*v || !((*v)[*n] = strdup(path)))
		st_cli_die(1, "out of memory");
	(*n)++;
}

/* Append the files of one --data item (a path, or a pattern's matches in
 * glob's sorted order) to *v. */
static void data_item(const char *item, char ***v, size_t *n)
{
	glob_t g;
	int rc;

	if (!*item)
		st_cli_die(2, "--data: an empty name in the list (FILE,FILE,... or a pattern)");
	if (!strpbrk(item, "*?[")) {
		data_add(item, v, n);
		return;
	}
	rc = glob(item, 0, NULL, &g);
	if (rc == GLOB_NOMATCH)
		st_cli_die(2, "--data %s: the pattern matches no file", item);
	if (rc != 0)
		st_cli_die(1, "--data %s: %s", item,
			   rc == GLOB_NOSPACE ? "out of memory" : "a folder could not be read");
	for (size_t i = 0; i < g.gl_pathc; i++) /* a match is a name, not a pattern */
		data_add(g.gl_pathv[i], v, n);
	globfree(&g);
}

/* What st_cli_open_data_list holds while it works: in a static, so that
 * what an exit on a bad file leaves is reachable (LeakSanitizer). */
static struct {
	char *copy, **files;
	size_t n;
	struct st_dataset **parts;
} data_list;

struct st_dataset *st_cli_open_data_list(const char *spec, int vocab)
{
	struct st_dataset *ds;
	char *save = NULL;

	if (!st_cli_data_is_list(spec))
		return st_cli_open_data(spec, vocab);
	if (*spec == ',' || spec[strlen(spec) - 1] == ',' || strstr(spec, ",,"))
		st_cli_die(2, "--data %s: an empty name in the list (FILE,FILE,... or a pattern)",
			   spec);
	if (!(data_list.copy = strdup(spec)))
		st_cli_die(1, "out of memory");
	for (char *it = strtok_r(data_list.copy, ",", &save); it; it = strtok_r(NULL, ",", &save))
		data_item(it, &data_list.files, &data_list.n);
	data_list.parts = calloc(data_list.n, sizeof(*data_list.parts));
	if (!data_list.parts)
		st_cli_die(1, "out of memory");
	for (size_t i = 0; i < data_list.n; i++)
		data_list.parts[i] = st_cli_open_data(data_list.files[i], vocab);
	if (st_dataset_concat(&ds, data_list.parts, (int)data_list.n, spec) < 0)
		st_cli_die(2, "--data %s: %s", spec, st_error_last());
	for (size_t i = 0; i < data_list.n; i++) {
		st_dataset_close(data_list.parts[i]);
		free(data_list.files[i]);
	}
	free(data_list.parts);
	free(data_list.files);
	free(data_list.copy);
	memset(&data_list, 0, sizeof(data_list));
	return ds;
}

/* path with its directory made absolute and free of links (realpath), the
 * file's own name kept as given: "./m" and "$PWD/m" are one name. */
static void canonical(const char *path, char *out, size_t n)
{
	const char *slash = strrchr(path, '/');
	char dir[4096], real[PATH_MAX];

	snprintf(dir, sizeof(dir), "%.*s", !slash ? 1 : slash == path ? 1 : (int)(slash - path),
		 !slash ? "." : path);
	if (realpath(dir, real))
		snprintf(out, n, "%s/%s", real, slash ? slash + 1 : path);
	else
		snprintf(out, n, "%s", path);
}

bool st_cli_same_file(const char *a, const char *b)
{
	char ca[PATH_MAX + 256], cb[PATH_MAX + 256];
	struct stat sa, sb;

	canonical(a, ca, sizeof(ca));
	canonical(b, cb, sizeof(cb));
	if (strcmp(ca, cb) == 0)
		return true;
	return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
	       sa.st_ino == sb.st_ino;
}

void st_cli_check_shard_tokenizer(const struct st_dataset *ds, const char *flag,
				  const char *data, const char *tok)
{
	const uint64_t made_by = st_dataset_ext(ds).tokenizer_hash;
	char json[4200], dir[4200];
	struct stat sb;
	uint64_t h;

	if (!made_by || !tok) /* unknown (a plain llm.c shard), or no tokenizer */
		return;
	if (stat(tok, &sb) == 0 && S_ISDIR(sb.st_mode)) {
		snprintf(dir, sizeof(dir), "%s", tok);
		snprintf(json, sizeof(json), "%s/tokenizer.json", tok);
	} else { /* strata tokenize takes the file too */
		snprintf(dir, sizeof(dir), "%s", tok);
		snprintf(json, sizeof(json), "%s", tok);
	}
	if (st_file_hash(json, &h) < 0)
		st_cli_die(1, "%s", st_error_last());
	if (h != made_by)
		st_cli_die(2, "%s %s was made by another tokenizer (hash %016llx) than the "
			   "model's %s (%016llx): make it again with strata tokenize --tokenizer "
			   "%s --out FILE.bin TEXT...", flag, data, (unsigned long long)made_by, json,
			   (unsigned long long)h, dir);
}

void st_cli_progress(struct st_cli_progress *p, const char *what, double done, double total,
		     const char *unit)
{
	const char *q = getenv("ST_QUIET");
	uint64_t now = st_now_ns();
	char eta[32];

	if (!p->t0)
		p->t0 = p->last = now;
	if ((q && *q && strcmp(q, "0") != 0) || now - p->last < 2000000000ull || done <= 0)
		return;
	p->last = now;
	fprintf(stderr, "%s: %.0f of %.0f %s, ETA %s\n", what, done, total, unit,
		st_format_eta((double)(now - p->t0) / 1e9 * (total - done) / done, eta, sizeof(eta)));
}

/* The weights of --ckpt PATH (strata/weights.h: a checkpoint, verified; a
 * Hugging Face model; an llm.c model file) and their model, or exit 2. */
struct st_weights *st_cli_open_ckpt(const char *path, struct st_model_config *mc)
{
	struct st_weights *w;
	int ret = st_weights_open(path, &w);

	if (ret == 0)
		ret = st_weights_config(w, mc);
	if (ret < 0)
		st_cli_die(st_cli_input_exit(ret), "--ckpt %s: %s", path,
			   st_cli_unprefix(st_error_last(), path));
	return w;
}

/* Every value is checked as it is read: a NaN or Inf is refused (exit 2)
 * naming the tensor and its index. */
void st_cli_load_ckpt(struct st_trainer *t, struct st_weights *w, const char *path)
{
	int ret = st_trainer_load_weights(t, w);

	if (ret < 0) {
		char why[1024];

		/* closed before the exit: nothing of it is left for LeakSanitizer
		 * to find unreachable, wherever the compiler kept w */
		snprintf(why, sizeof(why), "%s", st_cli_unprefix(st_error_last(), path));
		st_weights_close(w);
		st_cli_die(st_cli_input_exit(ret), "--ckpt %s: %s", path, why);
	}
	st_weights_close(w);
}

/* The edit distance between a[0..na) and b[0..nb): insertions,
 * deletions, substitutions and swaps of two neighbours (dtpye: dtype) one
 * each; a number over 64 for names that long. */
static int edit_distance(const char *a, size_t na, const char *b, size_t nb)
{
	int d[65][65];

	if (na > 64 || nb > 64)
		return 65;
	for (size_t i = 0; i <= na; i++)
		d[i][0] = (int)i;
	for (size_t j = 0; j <= nb; j++)
		d[0][j] = (int)j;
	for (size_t i = 1; i <= na; i++)
		for (size_t j = 1; j <= nb; j++) {
			int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);

			best = ST_MIN(best, d[i - 1][j] + 1);
			best = ST_MIN(best, d[i][j - 1] + 1);
			if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
				best = ST_MIN(best, d[i - 2][j - 2] + 1);
			d[i][j] = best;
		}
	return d[na][nb];
}

/* The first letters of name's words ("learning-rate": "lr"), into out. */
static void initials(const char *name, size_t n, char *out, size_t cap)
{
	size_t k = 0;

	for (size_t i = 0; i < n && k + 1 < cap; i++)
		if (i == 0 || name[i - 1] == '-')
			out[k++] = name[i];
	out[k] = '\0';
}

const char *st_cli_nearest_option(const struct option *longs, const char *given)
{
	char name[65], init[65];
	size_t n = strcspn(given, "=");
	const char *best = NULL;
	int best_d = 1 << 30;

	if (n == 0 || n >= sizeof(name))
		return NULL;
	for (size_t i = 0; i < n; i++) /* learning_rate, Learning-Rate: learning-rate */
		name[i] = given[i] == '_' ? '-' : (char)(given[i] | 0x20);
	name[n] = '\0';
	initials(name, n, init, sizeof(init));
	for (const struct option *o = longs; o->name; o++) {
		size_t on = strlen(o->name);
		int d = edit_distance(name, n, o->name, on);

		/* a word of it that is the option's whole name (max-steps:
		 * steps, batch-size: batch), or its words' initials (lr, wd) */
		if (strchr(name, '-') && strcmp(init, o->name) == 0)
			d = 0;
		else if (on >= 3 && strstr(name, o->name) &&
			 (strstr(name, o->name) == name || strstr(name, o->name)[-1] == '-'))
			d = 1;
		if (d < best_d) {
			best_d = d;
			best = o->name;
		}
	}
	/* a typo: a third of the name's letters at most */
	return best && (size_t)best_d * 3 <= n ? best : NULL;
}

/* arg's name (its first n bytes after "--") the start of several
 * options: exit 2 naming them (getopt_long takes a unique prefix). */
static void ambiguous(const char *cmd, const struct option *longs, const char *arg, size_t n)
{
	char names[512];
	size_t len = 0;
	int k = 0;

	names[0] = '\0';
	for (const struct option *o = longs; o->name; o++)
		if (strncmp(o->name, arg + 2, n) == 0 && len < sizeof(names)) {
			int w = snprintf(names + len, sizeof(names) - len, "%s--%s", k ? ", " : "",
					 o->name);

			len += w > 0 ? (size_t)w : 0;
			k++;
		}
	if (k > 1)
		st_cli_die(2, "%s: option %.*s is ambiguous: %s (see strata %s --help)", cmd,
			   (int)(n + 2), arg, names, cmd);
}

void st_cli_bad_option(const char *cmd, const struct option *longs, const char *arg)
{
	const char *near;
	size_t n;

	if (strncmp(arg, "--", 2) != 0 || !arg[2])
		st_cli_die(2, "%s: unknown option %s (see strata %s --help)", cmd, arg, cmd);
	n = strcspn(arg + 2, "=");
	for (const struct option *o = longs; o->name; o++) {
		if (strlen(o->name) != n || strncmp(o->name, arg + 2, n) != 0)
			continue;
		if (o->has_arg == no_argument && arg[2 + n] == '=')
			st_cli_die(2, "%s: --%s takes no value (see strata %s --help)", cmd, o->name, cmd);
		st_cli_die(2, "%s: --%s needs a value (see strata %s --help)", cmd, o->name, cmd);
	}
	ambiguous(cmd, longs, arg, n);
	near = st_cli_nearest_option(longs, arg + 2);
	if (near)
		st_cli_die(2, "%s: unknown option %.*s: did you mean --%s? (see strata %s --help)",
			   cmd, (int)(n + 2), arg, near, cmd);
	st_cli_die(2, "%s: unknown option %.*s (see strata %s --help)", cmd, (int)(n + 2), arg, cmd);
}

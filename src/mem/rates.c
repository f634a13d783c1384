/* strata: the rates file (`strata plan --calibrate FILE`, `--rates FILE`,
 * `strata train --rates-refresh FILE`): the machine's measured rates as one
 * JSON object, read strictly (an unknown, missing, negative or non-numeric
 * field is refused in one line) and written atomically (a temporary renamed
 * into place). docs/plan.md describes the format. */
#include "strata/plan.h"

#include "strata/file.h"

#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ST_RATES_FORMAT 1

/* The file's key of each rate, in enum st_rate's order. */
static const char *const st_rate_keys[ST_RATE_COUNT] = {
	"compute_flops", "copy_bps", "nvme_read_bps", "nvme_write_bps", "adam_bps", "net_bps",
	"widen_bps", "sum_bps",
};

/* Rates a file written before they were measured lacks: absent = null. */
static bool rate_optional(int i)
{
	return i == ST_RATE_WIDEN || i == ST_RATE_SUM;
}

static double *rate_slot(struct st_plan_rates *r, int i)
{
	double *slots[ST_RATE_COUNT] = { &r->compute_flops, &r->copy_bps, &r->nvme_read_bps,
					 &r->nvme_write_bps, &r->adam_bps, &r->net_bps,
					 &r->widen_bps, &r->sum_bps };

	return slots[i];
}

double st_plan_rate_get(const struct st_plan_rates *r, enum st_rate i)
{
	return *rate_slot((struct st_plan_rates *)r, i);
}

void st_plan_rate_set(struct st_plan_rates *r, enum st_rate i, double v)
{
	*rate_slot(r, i) = v;
}

const char *st_rate_key(enum st_rate i)
{
	return (unsigned)i < ST_RATE_COUNT ? st_rate_keys[i] : "?";
}

const char *st_rate_source_name(enum st_rate_source s)
{
	static const char *const names[] = { "default", "flag", "file", "device" };

	return (unsigned)s < ST_ARRAY_LEN(names) ? names[s] : "?";
}

void st_plan_rates_merge(struct st_plan_rates *dst, const struct st_plan_rates *src)
{
	for (int i = 0; i < ST_RATE_COUNT; i++) {
		double *d = rate_slot(dst, i);
		double s = st_plan_rate_get(src, (enum st_rate)i);

		if (*d > 0 || !(s > 0))
			continue;
		*d = s;
		dst->source[i] = src->source[i] ? src->source[i] : ST_RATE_SRC_FLAG;
	}
}

/* A rates or nvme-bench file is a few kilobytes; a larger one (a trace
 * given by mistake) is refused as bad input. */
#define ST_RATES_MAX_BYTES (16u << 20)

/* The JSON object of path (strata/file.h): -errno naming the file when it
 * cannot be read, -EINVAL in one line when it is not a JSON object. */
static int json_load(const char *path, json_object **root)
{
	return st_file_read_json(path, ST_RATES_MAX_BYTES, root);
}

int st_plan_rates_read(const char *path, struct st_plan_rates *out)
{
	struct st_plan_rates r;
	json_object *root, *v;
	bool seen[ST_RATE_COUNT] = { false };
	int ret = 0;

	memset(&r, 0, sizeof(r));
	ret = json_load(path, &root);
	if (ret < 0)
		return ret;
	if (!json_object_object_get_ex(root, "strata_rates", &v) ||
	    !json_object_is_type(v, json_type_int) || json_object_get_int(v) != ST_RATES_FORMAT) {
		json_object_put(root);
		return st_error_set(-EINVAL, "%s: no \"strata_rates\": %d (not a rates file of "
				    "this version: write it with strata plan --calibrate)", path,
				    ST_RATES_FORMAT);
	}
	json_object_object_foreach(root, key, val) {
		int i;

		if (strcmp(key, "strata_rates") == 0 || strcmp(key, "measured") == 0)
			continue;
		for (i = 0; i < ST_RATE_COUNT; i++)
			if (strcmp(key, st_rate_keys[i]) == 0)
				break;
		if (i == ST_RATE_COUNT) {
			ret = st_error_set(-EINVAL, "%s: unknown field \"%s\"", path, key);
			break;
		}
		seen[i] = true;
		if (json_object_is_type(val, json_type_null))
			continue; /* not measured: the default */
		if (!json_object_is_type(val, json_type_double) &&
		    !json_object_is_type(val, json_type_int)) {
			ret = st_error_set(-EINVAL, "%s: \"%s\" is not a number (or null)", path, key);
			break;
		}
		double x = json_object_get_double(val);

		if (!isfinite(x) || !(x > 0)) {
			ret = st_error_set(-EINVAL, "%s: \"%s\" is %g, not a positive number", path,
					   key, x);
			break;
		}
		*rate_slot(&r, i) = x;
		r.source[i] = ST_RATE_SRC_FILE;
	}
	for (int i = 0; ret == 0 && i < ST_RATE_COUNT; i++)
		if (!seen[i] && !rate_optional(i))
			ret = st_error_set(-EINVAL, "%s: no \"%s\" (a number, or null for the "
					   "default)", path, st_rate_keys[i]);
	json_object_put(root);
	if (ret == 0)
		*out = r;
	return ret;
}

int st_plan_rates_write(const char *path, const struct st_plan_rates *r, const char *measured)
{
	struct st_file_atomic f;
	json_object *root = json_object_new_object(), *m = NULL;
	const char *text;
	int ret;

	if (!root)
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	json_object_object_add(root, "strata_rates", json_object_new_int(ST_RATES_FORMAT));
	for (int i = 0; i < ST_RATE_COUNT; i++) {
		double x = st_plan_rate_get(r, (enum st_rate)i);

		json_object_object_add(root, st_rate_keys[i],
				       x > 0 && isfinite(x) ? json_object_new_double(x) : NULL);
	}
	if (measured) {
		m = json_tokener_parse(measured);
		if (!m) {
			json_object_put(root);
			return st_error_set(-EINVAL, "%s: the \"measured\" text is not JSON", path);
		}
		json_object_object_add(root, "measured", m);
	}
	text = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY |
						    JSON_C_TO_STRING_NOSLASHESCAPE);
	ret = st_file_atomic_open(&f, path);
	if (ret == 0) {
		ret = st_file_atomic_write(&f, text, strlen(text));
		if (ret == 0)
			ret = st_file_atomic_write(&f, "\n", 1);
		if (ret == 0)
			ret = st_file_atomic_commit(&f);
		else
			st_file_atomic_abort(&f);
	}
	json_object_put(root);
	if (ret < 0)
		return st_error_set(ret, "%s: %s", path, strerror(-ret));
	return 0;
}

int st_plan_rates_from_lanes(const struct st_plan *p, int steps, const double busy_s[6],
			     const double bytes[6], double nvme_busy_s, struct st_plan_rates *out)
{
	/* the plan's FLOPs, AdamW bytes and widens are per step; the lanes'
	 * busy times are summed over the steps */
	double flops = p->compute_flops_step * steps, widen_s = p->t_widen_s * steps;
	uint64_t adam_bytes = p->adam_bytes * (uint64_t)steps;
	/* The planner adds read and write times (one disk); the two lanes'
	 * busy times overlap where reads and writes were in flight together,
	 * so each is scaled by the disk's own busy time over their sum: the
	 * rates then give that busy time back. */
	double sum = busy_s[3] + busy_s[4];
	double f = nvme_busy_s > 0 && sum > 0 && nvme_busy_s < sum ? nvme_busy_s / sum : 1;
	/* the engine's lanes: compute, h2d, d2h, nvme read, nvme write, adam.
	 * Not the copies: a copy queue is busy from a copy's submission, and
	 * the engine submits W's copy before the compute's event it waits for
	 * (st_tier_io.after), so the h2d lane's busy time holds the compute it
	 * waited on and bytes over it is no bandwidth (on this machine's
	 * offload-bench B, 0.02 GB/s against 18 GB/s measured alone). */
	int n = 0;
	bool dev_optim = false;

	/* Nor the compute when some unit's optimizer runs on the device: its
	 * AdamW, folds and sums are compute spans too, not the model's FLOPs. */
	for (int u = 0; u < p->units; u++)
		dev_optim |= st_plan_home(p, u, ST_STATE_P) == ST_HOME_VRAM;
	memset(out, 0, sizeof(*out));
	/* the compute's busy time holds the widens (cpu device: t_widen_s,
	 * at widen_bps), which the prediction adds to the FLOPs' time */
	if (!dev_optim && busy_s[0] > widen_s && flops > 0) {
		out->compute_flops = flops / (busy_s[0] - widen_s);
		n++;
	}
	if (busy_s[3] > 0 && bytes[3] > 0) {
		out->nvme_read_bps = bytes[3] / (busy_s[3] * f);
		n++;
	}
	if (busy_s[4] > 0 && bytes[4] > 0) {
		out->nvme_write_bps = bytes[4] / (busy_s[4] * f);
		n++;
	}
	if (busy_s[5] > 0 && adam_bytes > 0) {
		out->adam_bps = (double)adam_bytes / busy_s[5];
		n++;
	}
	for (int i = 0; i < ST_RATE_COUNT; i++)
		if (st_plan_rate_get(out, (enum st_rate)i) > 0)
			out->source[i] = ST_RATE_SRC_FILE;
	return n;
}

int st_plan_rates_from_nvme_bench(const char *path, struct st_plan_rates *rates)
{
	json_object *root, *best, *v;
	double rd, wr;
	int ret;

	ret = json_load(path, &root);
	if (ret < 0)
		return ret;
	if (!json_object_object_get_ex(root, "best", &best) ||
	    !json_object_is_type(best, json_type_object)) {
		json_object_put(root);
		return st_error_set(-EINVAL, "%s: no \"best\" object (write it with nvme-bench --json)",
				    path);
	}
	rd = wr = -1;
	if (json_object_object_get_ex(best, "read_gbps", &v) &&
	    (json_object_is_type(v, json_type_double) || json_object_is_type(v, json_type_int)))
		rd = json_object_get_double(v);
	if (json_object_object_get_ex(best, "write_gbps", &v) &&
	    (json_object_is_type(v, json_type_double) || json_object_is_type(v, json_type_int)))
		wr = json_object_get_double(v);
	json_object_put(root);
	if (!(rd > 0) || !(wr > 0) || !isfinite(rd) || !isfinite(wr))
		return st_error_set(-EINVAL, "%s: best.read_gbps and best.write_gbps must be positive "
				    "numbers (was the benchmark run with both read and write?)", path);
	rates->nvme_read_bps = rd * 1e9;
	rates->nvme_write_bps = wr * 1e9;
	return 0;
}

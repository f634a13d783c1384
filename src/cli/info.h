/* What the parts of `strata info` share (src/cli only): info_cmd.c parses
 * the flags and picks the output, info_machine.c looks at this machine and
 * the --nvme directories, info_ckpt.c at a checkpoint or other weights
 * (--ckpt). Each part builds one JSON object, which --json prints as it is
 * and its text is printed from. */
#ifndef STRATA_CLI_INFO_H
#define STRATA_CLI_INFO_H

#include "strata/common.h"
#include "strata/model.h"

#include <json-c/json.h>
#include <stdbool.h>
#include <stdint.h>

/* json-c helpers: add a value to an object */
static inline void put_str(struct json_object *o, const char *k, const char *v)
{
	json_object_object_add(o, k, v ? json_object_new_string(v) : NULL);
}

static inline void put_int(struct json_object *o, const char *k, int64_t v)
{
	json_object_object_add(o, k, json_object_new_int64(v));
}

static inline void put_bool(struct json_object *o, const char *k, bool v)
{
	json_object_object_add(o, k, json_object_new_boolean(v));
}

static inline const char *jstr(struct json_object *o, const char *k)
{
	struct json_object *v;

	return json_object_object_get_ex(o, k, &v) && v ? json_object_get_string(v) : NULL;
}

static inline int64_t jint(struct json_object *o, const char *k)
{
	struct json_object *v;

	return json_object_object_get_ex(o, k, &v) && v ? json_object_get_int64(v) : -1;
}

static inline struct json_object *jobj(struct json_object *o, const char *k)
{
	struct json_object *v = NULL;

	json_object_object_get_ex(o, k, &v);
	return v;
}

static inline const char *bytes_or_unknown(int64_t v, char *buf, size_t n)
{
	return v < 0 ? "unknown" : st_format_bytes((uint64_t)v, buf, n);
}

/* --- the machine (info_machine.c) --- */

/* The build, CPU, memory, NUMA, GPU, io_uring and comm of this machine. */
struct json_object *st_cli_info_machine_json(void);
/* The nvme tier probed on dir: {dir, fs, free_bytes, tier, ok, error}. */
struct json_object *st_cli_info_probe_dir(const char *dir);
/* The text of st_cli_info_machine_json() and of one probe, on stdout. */
void st_cli_info_print_machine(struct json_object *m);
void st_cli_info_print_dir(struct json_object *d);

/* --- a checkpoint or other weights (info_ckpt.c) --- */

/* The checkpoint --resume dir takes and every step-N beside it, or other
 * weights at dir (then with "format"); *bad when something is damaged;
 * the model into *mc (n_layer 0 when unknown). Exits 2 or 1 on failure. */
struct json_object *st_cli_info_ckpt_json(const char *dir, bool verify, bool *bad,
					  struct st_model_config *mc);
/* Their text, on stdout. */
void st_cli_info_print_weights(struct json_object *o, bool verify,
			       const struct st_model_config *mc);
void st_cli_info_print_ckpt(struct json_object *o, bool verify,
			    const struct st_model_config *mc);

#endif

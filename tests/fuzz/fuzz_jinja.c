/* libFuzzer target for the Jinja interpreter (src/tok/jinja_*.c) that
 * renders chat templates: the input is a template, parsed and rendered
 * with a small conversation, with and without the generation prompt. It
 * renders or is refused (-EINVAL, -E2BIG past the render's bounds);
 * anything else aborts. */
#include "strata/jinja.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const vars_json[] = {
		"{\"messages\": [{\"role\": \"system\", \"content\": \" s\\n\"}, {\"role\": \"user\", "
		"\"content\": \"u \\u00e9\"}, {\"role\": \"assistant\", \"content\": \"<think>a</think>b\"}], "
		"\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": false}",
		"{\"messages\": [{\"role\": \"user\", \"content\": \"\"}], \"add_generation_prompt\": true}",
	};
	struct st_jinja *t;
	int ret = st_jinja_parse((const char *)data, size, &t);

	if (ret) {
		if (ret != -EINVAL && ret != -ENOMEM)
			abort();
		return 0;
	}
	for (size_t i = 0; i < 2; i++) {
		struct json_object *vars = json_tokener_parse(vars_json[i]);
		char *out;
		size_t n;

		ret = st_jinja_render(t, vars, &out, &n);
		if (ret == 0)
			free(out);
		else if (ret != -EINVAL && ret != -E2BIG && ret != -ENOMEM)
			abort();
		json_object_put(vars);
	}
	st_jinja_free(t);
	return 0;
}

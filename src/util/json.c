/* A small JSON file, read whole and parsed with json-c, for the readers of
 * strata's and Hugging Face's JSON files (rates, config.json,
 * tokenizer.json): one message for each way such a file is not what it
 * should be. */
#include "strata/common.h"
#include "strata/file.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdlib.h>

/* How deep the objects and arrays may nest: json-c's default is 32, and a
 * tokenizer.json's normalizers and pre-tokenizers nest deeper. */
#define ST_JSON_DEPTH 64

int st_file_read_json(const char *path, size_t max_bytes, struct json_object **out)
{
	struct json_tokener *tk;
	struct json_object *root;
	enum json_tokener_error e;
	size_t bytes, at, line = 1;
	char *text;
	int ret;

	*out = NULL;
	if (max_bytes > (size_t)INT32_MAX) /* json-c takes an int length */
		max_bytes = (size_t)INT32_MAX;
	/* a file larger than any such file is bad input, not a failure to
	 * read: the message stays, the code says so */
	if ((ret = st_file_read_small(path, max_bytes, &text, &bytes)))
		return ret == -EFBIG ? -EINVAL : ret;
	tk = json_tokener_new_ex(ST_JSON_DEPTH);
	if (!tk) {
		free(text);
		return st_error_set(-ENOMEM, "%s: out of memory", path);
	}
	root = json_tokener_parse_ex(tk, text, (int)bytes);
	e = json_tokener_get_error(tk);
	at = json_tokener_get_parse_end(tk);
	json_tokener_free(tk);
	if (root && e == json_tokener_success && at < bytes) {
		/* whitespace after the value is fine, anything else is not */
		while (at < bytes && (text[at] == ' ' || text[at] == '\t' || text[at] == '\n' ||
				      text[at] == '\r'))
			at++;
	}
	if (!root || e != json_tokener_success || at < bytes) {
		for (size_t i = 0; i < at && i < bytes; i++)
			line += text[i] == '\n';
		ret = st_error_set(-EINVAL, "%s: not JSON (line %zu: %s)", path, line,
				   bytes == 0 ? "the file is empty"
				   : root && e == json_tokener_success ? "text after the value"
				   : e == json_tokener_continue ? "the file ends inside a value"
								: json_tokener_error_desc(e));
		json_object_put(root);
		free(text);
		return ret;
	}
	free(text);
	if (!json_object_is_type(root, json_type_object)) {
		json_object_put(root);
		return st_error_set(-EINVAL, "%s: not a JSON object", path);
	}
	*out = root;
	return 0;
}

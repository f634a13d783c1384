/* strata: chat templates and the assistant's spans (strata/chat.h). */
#include "strata/chat.h"
#include "strata/jinja.h"

#include <errno.h>
#include <json-c/json.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct st_chat {
	struct st_jinja *tpl;
	char *bos, *eos; /* NULL: undefined in the template */
};

/* A special token of the config: a string or {"content": ...}. */
static char *config_token(struct json_object *cfg, const char *key)
{
	struct json_object *o, *c;

	if (!json_object_object_get_ex(cfg, key, &o) || !o)
		return NULL;
	if (json_object_is_type(o, json_type_object) &&
	    json_object_object_get_ex(o, "content", &c))
		o = c;
	return json_object_is_type(o, json_type_string) ? strdup(json_object_get_string(o))
							: NULL;
}

static void config_path(const char *path, char *out, size_t n)
{
	struct stat sb;
	const char *slash = strrchr(path, '/');

	if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
		snprintf(out, n, "%s/tokenizer_config.json", path);
	else if (slash)
		snprintf(out, n, "%.*s/tokenizer_config.json", (int)(slash - path), path);
	else
		snprintf(out, n, "tokenizer_config.json");
}

static int read_file(const char *path, char **text, size_t *bytes)
{
	FILE *f = fopen(path, "rb");
	size_t cap = 1 << 16, n = 0, got;
	char *p = NULL, *q;

	*text = NULL;
	if (!f)
		return st_error_set(-errno, "%s: %s", path, strerror(errno));
	do {
		if (!(q = realloc(p, cap *= 2))) {
			free(p);
			fclose(f);
			return st_error_set(-ENOMEM, "%s: out of memory", path);
		}
		p = q;
		n += got = fread(p + n, 1, cap - n - 1, f);
	} while (got > 0 && n + 1 == cap);
	fclose(f);
	p[n] = 0;
	*text = p;
	*bytes = n;
	return 0;
}

static int template_of(struct json_object *cfg, const char *cfg_file, const char *tfile,
		       struct st_jinja **tpl)
{
	struct json_object *o = NULL;
	char *text = NULL;
	size_t n;
	int ret;

	if (tfile) {
		if ((ret = read_file(tfile, &text, &n)) < 0)
			return ret;
	} else if (!cfg || !json_object_object_get_ex(cfg, "chat_template", &o) || !o) {
		return st_error_set(-ENOENT, "%s has no chat_template (give one with "
				    "--chat-template FILE)", cfg_file);
	} else if (!json_object_is_type(o, json_type_string)) {
		return st_error_set(-EINVAL, "%s: chat_template is not a string (a list of "
				    "named templates is not supported: give one with "
				    "--chat-template FILE)", cfg_file);
	}
	ret = text ? st_jinja_parse(text, n, tpl) :
		     st_jinja_parse(json_object_get_string(o),
				    (size_t)json_object_get_string_len(o), tpl);
	if (ret < 0)
		st_error_set(ret, "%s: %s", tfile ? tfile : cfg_file, st_error_last());
	free(text);
	return ret;
}

int st_chat_open(const char *path, const char *template_file, struct st_chat **out)
{
	char cfg_file[PATH_MAX];
	struct json_object *cfg = NULL;
	struct st_chat *c;
	struct stat sb;
	int ret;

	*out = NULL;
	config_path(path, cfg_file, sizeof(cfg_file));
	if (stat(cfg_file, &sb) == 0 && !(cfg = json_object_from_file(cfg_file)))
		return st_error_set(-EINVAL, "%s: not JSON", cfg_file);
	if (cfg && !json_object_is_type(cfg, json_type_object)) {
		json_object_put(cfg);
		return st_error_set(-EINVAL, "%s: not a JSON object", cfg_file);
	}
	if (!(c = calloc(1, sizeof(*c)))) {
		json_object_put(cfg);
		return st_error_set(-ENOMEM, "chat template: out of memory");
	}
	ret = template_of(cfg, cfg_file, template_file, &c->tpl);
	if (!ret && cfg) {
		c->bos = config_token(cfg, "bos_token");
		c->eos = config_token(cfg, "eos_token");
	}
	json_object_put(cfg);
	if (ret < 0) {
		st_chat_close(c);
		return ret;
	}
	*out = c;
	return 0;
}

void st_chat_close(struct st_chat *c)
{
	if (!c)
		return;
	st_jinja_free(c->tpl);
	free(c->bos);
	free(c->eos);
	free(c);
}

int st_chat_render(const struct st_chat *c, struct json_object *messages, size_t n_msgs,
		   bool add_generation_prompt, char **text, size_t *bytes)
{
	struct json_object *vars = json_object_new_object(), *msgs = json_object_new_array();
	int ret;

	if (!vars || !msgs) {
		json_object_put(vars);
		json_object_put(msgs);
		return st_error_set(-ENOMEM, "chat template: out of memory");
	}
	for (size_t i = 0; i < n_msgs && i < json_object_array_length(messages); i++)
		json_object_array_add(msgs, json_object_get(json_object_array_get_idx(messages, i)));
	json_object_object_add(vars, "messages", msgs);
	if (c->bos)
		json_object_object_add(vars, "bos_token", json_object_new_string(c->bos));
	if (c->eos)
		json_object_object_add(vars, "eos_token", json_object_new_string(c->eos));
	json_object_object_add(vars, "add_generation_prompt",
			       json_object_new_boolean(add_generation_prompt));
	ret = st_jinja_render(c->tpl, vars, text, bytes);
	json_object_put(vars);
	return ret;
}

static size_t common_prefix(const char *a, size_t an, const char *b, size_t bn)
{
	size_t i = 0;

	while (i < an && i < bn && a[i] == b[i])
		i++;
	return i;
}

static int prefix_with(const struct st_chat *c, struct json_object *messages, size_t k,
		       bool gen, const char *text, size_t bytes, size_t *at)
{
	char *part;
	size_t n;
	int ret = st_chat_render(c, messages, k, gen, &part, &n);

	if (ret < 0)
		return ret;
	*at = common_prefix(part, n, text, bytes);
	free(part);
	return 0;
}

int st_chat_spans(const struct st_chat *c, struct json_object *messages, const char *text,
		  size_t bytes, struct st_chat_span *spans, size_t *n)
{
	size_t m = json_object_array_length(messages), last_end = 0;
	int ret;

	*n = 0;
	for (size_t k = 0; k < m; k++) {
		struct json_object *msg = json_object_array_get_idx(messages, k), *role;
		size_t s, e;

		if (!json_object_object_get_ex(msg, "role", &role) ||
		    strcmp(json_object_get_string(role), "assistant"))
			continue;
		if ((ret = prefix_with(c, messages, k, true, text, bytes, &s)) < 0 ||
		    (ret = prefix_with(c, messages, k + 1, false, text, bytes, &e)) < 0)
			return ret;
		if (s < last_end)
			s = last_end;
		if (s >= e)
			continue;
		spans[(*n)++] = (struct st_chat_span){ s, e };
		last_end = e;
	}
	return 0;
}

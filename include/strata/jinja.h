/* strata: a small Jinja interpreter for chat templates.
 *
 * It renders the chat_template of a Hugging Face tokenizer_config.json the
 * way @huggingface/jinja (the npm package transformers.js renders chat
 * templates with) does, byte for byte: its lexer (trim_blocks and
 * lstrip_blocks on, the template's one trailing newline dropped, `-`
 * whitespace control), its operators (JavaScript's loose `==`, `+` joining
 * a string with anything), its filters, tests and string methods (`strip`,
 * `lstrip`, `rstrip` trim whitespace and ignore an argument, as it does),
 * and its JSON (`tojson`, objects and lists printed as JSON), macros too.
 * What it does not do: call and filter blocks, `*`/`**` argument
 * unpacking, `{% include %}`/`{% extends %}`, and the filters no chat
 * template of docs/tokenizer.md uses; each is refused with an error that
 * names it.
 *
 * Safe on any input: the parser refuses nesting deeper than 200, a render
 * stops (-E2BIG) past 10^7 evaluation steps or 256 MiB of values, so a
 * hostile template neither crashes nor runs away.
 * strftime_now() reads the clock, or SOURCE_DATE_EPOCH when it is set.
 * Functions return 0 or -errno with st_error_set() detail. */
#ifndef STRATA_JINJA_H
#define STRATA_JINJA_H

#include "strata/common.h"

#include <stddef.h>

struct st_jinja;
struct json_object;

/* Parse a template of n bytes (UTF-8). Returns 0, -EINVAL for a syntax
 * error (the detail says what and where), -ENOMEM. */
int st_jinja_parse(const char *src, size_t n, struct st_jinja **out);

/* Free a parsed template; NULL does nothing. */
void st_jinja_free(struct st_jinja *t);

/* Render t with the members of the json-c object vars as its variables
 * (borrowed; JSON numbers that are whole are integers, as in JavaScript).
 * *out is malloc'd, NUL-terminated, *n bytes long. Returns 0, -EINVAL for
 * an error of the template (raise_exception, an unknown filter, an
 * operation on the wrong types: the detail says which), -E2BIG past the
 * limits above, -ENOMEM. */
int st_jinja_render(const struct st_jinja *t, struct json_object *vars, char **out,
		    size_t *n);

#endif

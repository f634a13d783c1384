/* strata: a model's chat template (tokenizer_config.json's chat_template,
 * strata/jinja.h) and where the assistant's turns lie in what it renders.
 *
 * render(messages, bos_token, eos_token, add_generation_prompt) is the
 * contract: the template gets exactly these variables; bos_token and
 * eos_token are tokenizer_config.json's (a string, or the "content" of an
 * object), left undefined when it has none.
 *
 * An assistant message k (role "assistant") spans the bytes [s, e) of the
 * whole conversation's text T = render(messages), where
 *   s = the longest common prefix of render(messages[:k], generation
 *       prompt on) and T: where the template starts the reply;
 *   e = the longest common prefix of render(messages[:k+1]) and T: where
 *       its turn ends (the next turn's first bytes may be in it when the
 *       two continue alike; the loss mask stops at the span's first
 *       special token, docs/tokenizer.md).
 * Functions return 0 or -errno with st_error_set() detail. */
#ifndef STRATA_CHAT_H
#define STRATA_CHAT_H

#include "strata/common.h"

#include <stddef.h>

struct st_chat;
struct json_object;

/* The template of the tokenizer at path (a directory holding
 * tokenizer_config.json, or a tokenizer.json beside one), or the file
 * template_file when not NULL (bos/eos still from the config when there
 * is one). Returns 0, -ENOENT when there is no chat template (the detail
 * says where it looked), -EINVAL for a malformed config or template. */
int st_chat_open(const char *path, const char *template_file, struct st_chat **out);

/* Free; NULL does nothing. */
void st_chat_close(struct st_chat *c);

/* Render the first n_msgs of messages (a json-c array of message objects,
 * borrowed). *text is malloc'd. Returns 0, or -EINVAL for an error of
 * the template (raise_exception...), -E2BIG, -ENOMEM. */
int st_chat_render(const struct st_chat *c, struct json_object *messages, size_t n_msgs,
		   bool add_generation_prompt, char **text, size_t *bytes);

struct st_chat_span {
	size_t begin, end; /* bytes of the rendered text */
};

/* The spans of the assistant messages in text (= render(messages) whole),
 * in order, at most one per message: spans[] must hold as many as there
 * are messages. Sets *n. An assistant message the template renders
 * nothing for (s >= e) has no span. Returns 0 or what render returns. */
int st_chat_spans(const struct st_chat *c, struct json_object *messages, const char *text,
		  size_t bytes, struct st_chat_span *spans, size_t *n);

#endif

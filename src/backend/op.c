/* The op list's names and signatures (strata/op.h), from ST_OP_LIST. */
#include "strata/op.h"

#include <assert.h>
#include <errno.h>
#include <string.h>

#define ST_OP_NAME_(name, str, sig) [ST_OP_##name] = str,
static const char *const op_names[ST_OP_COUNT] = { ST_OP_LIST(ST_OP_NAME_) };
#undef ST_OP_NAME_

#define ST_OP_SIG_(name, str, sig) [ST_OP_##name] = sig,
static const char *const op_sigs[ST_OP_COUNT] = { ST_OP_LIST(ST_OP_SIG_) };
#undef ST_OP_SIG_

const char *st_op_name(enum st_op_kind kind)
{
	return (unsigned)kind < ST_OP_COUNT ? op_names[kind] : "?";
}

int st_op_tensors(enum st_op_kind kind)
{
	assert((unsigned)kind < ST_OP_COUNT);
	return (int)strlen(op_sigs[kind]);
}

enum st_dtype st_op_ref_dtype(enum st_op_kind kind, int slot)
{
	assert(slot >= 0 && slot < st_op_tensors(kind));
	switch (op_sigs[kind][slot]) {
	case 'b':
		return ST_DTYPE_BF16;
	case 'i':
		return ST_DTYPE_I32;
	case 'u':
		return ST_DTYPE_U8;
	default:
		return ST_DTYPE_F32;
	}
}

bool st_op_is_ref(enum st_op_kind kind, const enum st_dtype *dtypes)
{
	int n = st_op_tensors(kind);

	for (int k = 0; k < n; k++)
		if (dtypes[k] != st_op_ref_dtype(kind, k))
			return false;
	return true;
}

const char *st_precision_name(enum st_precision p)
{
	return p == ST_PRECISION_BF16 ? "bf16" : "fp32";
}

int st_precision_parse(const char *s, enum st_precision *out)
{
	if (strcmp(s, "fp32") == 0)
		*out = ST_PRECISION_FP32;
	else if (strcmp(s, "bf16") == 0)
		*out = ST_PRECISION_BF16;
	else
		return -EINVAL;
	return 0;
}

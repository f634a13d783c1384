/* Private to tiers/: what a tier implementation may call on its core. */
#ifndef STRATA_TIER_IMPL_H
#define STRATA_TIER_IMPL_H

#include "strata/tier.h"

/* Record the detail of a failed request on the tier (st_tier_error()) and
 * on this thread (st_error_last()). Returns err. */
int st_tier_set_error(struct st_tier *t, int err, const char *fmt, ...)
	ST_PRINTF(3, 4);

/* The ops table t was created with. */
const struct st_tier_ops *st_tier_ops_of(const struct st_tier *t);

/* Budget the core reserved for this tier (after rounding). */
uint64_t st_tier_budget(const struct st_tier *t);

#endif

/* This machine's rates for the planner, measured (`strata plan --calibrate
 * FILE`; docs/plan.md, "Measured rates"). */
#ifndef STRATA_CALIBRATE_H
#define STRATA_CALIBRATE_H

#include "strata/plan.h"

#include <stdio.h>

/* Measure the rates for the plan input in (its model, B and T) on device
 * ("cpu" or "cuda"): compute, pinned copies, AdamW, on the cpu device its
 * widens and sums on the cores, and the nvme (from
 * nvme_bench, an nvme-bench --json file, when given; else a short replay of
 * the update sweep on the first directory of nvme_dirs; neither: left to
 * the default). Each measure's lines go to log (NULL: none). Writes file
 * atomically and fills *out (sources: file). Returns 0 or -errno with the
 * detail in st_error_last(); *exit_code (when not NULL) is what a tool
 * should exit with: 2 for bad input, 1 for a system failure (naming the
 * file and errno), 0 on success. */
int st_calibrate(const struct st_plan_input *in, const char *device, const char *nvme_dirs,
		 const char *nvme_bench, const char *file, FILE *log, struct st_plan_rates *out,
		 int *exit_code);

#endif

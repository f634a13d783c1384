/* src/io private: what the checkpoint files' parts (ckpt_files.c,
 * ckpt_trainer.c, ckpt_dir.c) share. */
#ifndef STRATA_IO_CKPT_INTERNAL_H
#define STRATA_IO_CKPT_INTERNAL_H

#include "strata/common.h"

/* malloc'd printf, NULL when out of memory. */
char *st_ckpt_fmt(const char *fmt, ...) ST_PRINTF(1, 2);

#endif

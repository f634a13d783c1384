/* src/io private, transitional: the file helpers moved to strata/file.h
 * (src/util) so src/sched can use them too. These old names keep
 * src/io/config.c building until it calls the st_file_* names; then this
 * header goes. New code includes strata/file.h. */
#ifndef STRATA_IO_FILE_H
#define STRATA_IO_FILE_H

#include "strata/file.h"

#define st_atomic_file st_file_atomic
#define st_atomic_file_open st_file_atomic_open
#define st_atomic_file_write st_file_atomic_write
#define st_atomic_file_commit st_file_atomic_commit
#define st_atomic_file_abort st_file_atomic_abort
#define st_read_small_file st_file_read_small

#endif

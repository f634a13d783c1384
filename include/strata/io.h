/* strata: files. safetensors (strata/safetensors.h), token datasets and the
 * batch sampler (strata/dataset.h). A model's config.json is its family's
 * (st_model_config_read() / st_model_config_write(), strata/model.h).
 * Formats: docs/formats.md. */
#ifndef STRATA_IO_H
#define STRATA_IO_H

#include "strata/common.h"
#include "strata/dataset.h"
#include "strata/model.h"
#include "strata/safetensors.h"

#endif

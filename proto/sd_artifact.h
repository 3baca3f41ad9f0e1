/* Names a save's `file` artifacts may not take: the ones the daemon writes itself. */
#ifndef SD_ARTIFACT_H
#define SD_ARTIFACT_H

#include "sd_error.h"

/* Refuses (SHARDD_E_INVALID_ARGUMENT, naming the path) an artifact named
 * like one of the save's own files, whatever shape the save ends up with:
 * PREFIX.safetensors.index.json, PREFIX.safetensors,
 * PREFIX-NNNNN-of-NNNNN.safetensors, or a temporary ".shardd-tmp-" name. */
int sd_artifact_name_check(const char *prefix, const char *name, sd_error *err);

#endif

/* Artifact names reserved for the checkpoint's own files: a `file` may not shadow the index or a shard. */
#include <string.h>

#include "sd_artifact.h"

#define TMP_PREFIX ".shardd-tmp-"

/* Skips one or more decimal digits; NULL when there are none. */
static const char *digits(const char *p) {
  const char *q = p;
  while (*q >= '0' && *q <= '9') q++;
  return q == p ? NULL : q;
}

/* "-NNNNN-of-NNNNN.safetensors" (any digit count: plan.c widens past 99999 files). */
static int is_shard_suffix(const char *p) {
  if (*p++ != '-' || !(p = digits(p)) || strncmp(p, "-of-", 4) != 0 || !(p = digits(p + 4))) return 0;
  return strcmp(p, ".safetensors") == 0;
}

int sd_artifact_name_check(const char *prefix, const char *name, sd_error *err) {
  if (strncmp(name, TMP_PREFIX, strlen(TMP_PREFIX)) == 0)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "file '%.300s': names starting with '" TMP_PREFIX "' are the daemon's temporary files", name);
  size_t n = strlen(prefix);
  if (strncmp(name, prefix, n) != 0) return 0;
  const char *rest = name + n;
  if (strcmp(rest, ".safetensors.index.json") == 0)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "file '%.300s': that is the name of the checkpoint's index, which the daemon writes", name);
  if (strcmp(rest, ".safetensors") == 0 || is_shard_suffix(rest))
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "file '%.300s': that is the name of one of the checkpoint's shards, which the daemon writes",
                   name);
  return 0;
}

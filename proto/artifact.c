/* Artifact names reserved for the checkpoint's own files (a `file` may not shadow the index or a shard), and files sent in parts joined in rank order. */
#include <stdlib.h>
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

static int piece_rank_cmp(const void *a, const void *b) {
  uint32_t x = (*(const sd_file_piece *const *)a)->rank, y = (*(const sd_file_piece *const *)b)->rank;
  return x < y ? -1 : x > y;
}

int sd_files_join(const sd_file_piece *in, size_t n, const sd_plan *plan, sd_file_out *out, size_t *nout,
                  sd_error *err) {
  const sd_file_piece **parts = malloc((n ? n : 1) * sizeof *parts);
  if (!parts) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory joining files");
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    size_t seen = 0;
    while (seen < k && strcmp(out[seen].name, in[i].name) != 0) seen++;
    if (seen < k) continue; /* joined with the first piece of its name */
    out[k] = (sd_file_out){.name = in[i].name, .data = in[i].data, .len = in[i].len};
    if (in[i].part) {
      size_t np = 0, len = 0;
      for (size_t j = i; j < n; j++) {
        if (strcmp(in[j].name, in[i].name) != 0) continue;
        parts[np++] = &in[j];
        len += in[j].len;
      }
      qsort(parts, np, sizeof *parts, piece_rank_cmp);
      uint8_t *joined = malloc(len ? len : 1);
      if (!joined) {
        for (size_t f = 0; f < k; f++) free(out[f].owned);
        free(parts);
        return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory joining file '%s'", in[i].name);
      }
      size_t at = 0;
      for (size_t p = 0; p < np; p++) {
        if (parts[p]->len) memcpy(joined + at, parts[p]->data, parts[p]->len);
        at += parts[p]->len;
      }
      out[k] = (sd_file_out){.name = in[i].name, .data = joined, .len = len, .owned = joined};
    }
    k++;
  }
  free(parts);
  for (size_t f = 0; f < k; f++) {
    int clash = plan->needs_index && strcmp(out[f].name, plan->index_name) == 0;
    for (size_t j = 0; j < plan->nfiles && !clash; j++) clash = strcmp(out[f].name, plan->files[j].name) == 0;
    if (!clash) continue;
    sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "file '%s' has the name of a checkpoint file", out[f].name);
    for (size_t g = 0; g < k; g++) free(out[g].owned);
    return err ? err->code : SHARDD_E_INVALID_ARGUMENT;
  }
  *nout = k;
  return 0;
}

/* A save's `file` artifacts: the names they may not take (the ones the daemon writes itself), and files sent in parts joined. */
#ifndef SD_ARTIFACT_H
#define SD_ARTIFACT_H

#include <stddef.h>
#include <stdint.h>

#include "sd_error.h"
#include "sd_format.h"

/* One `file` as a rank sent it: the whole file, or (part) that rank's part of it. */
typedef struct {
  const char *name;
  const uint8_t *data;
  size_t len;
  uint32_t rank;
  int part;
} sd_file_piece;

/* A file of the checkpoint: data is a piece's, or owned (malloc'd, the caller frees it) when
 * parts were joined. */
typedef struct {
  const char *name;
  const uint8_t *data;
  size_t len;
  uint8_t *owned;
} sd_file_out;

/* Every name of in[] once, in the order first sent: a whole file as it is, the parts of a file
 * joined in rank order (a rank with no part adds nothing). The callers keep one piece per name
 * and rank. A name of one of plan's files (a shard, the index) is refused with
 * SHARDD_E_INVALID_ARGUMENT naming it. out[] has room for n. On failure nothing is left to free. */
int sd_files_join(const sd_file_piece *in, size_t n, const sd_plan *plan, sd_file_out *out, size_t *nout,
                  sd_error *err);

/* Refuses (SHARDD_E_INVALID_ARGUMENT, naming the path) an artifact named
 * like one of the save's own files, whatever shape the save ends up with:
 * PREFIX.safetensors.index.json, PREFIX.safetensors,
 * PREFIX-NNNNN-of-NNNNN.safetensors, or a temporary ".shardd-tmp-" name. */
int sd_artifact_name_check(const char *prefix, const char *name, sd_error *err);

#endif

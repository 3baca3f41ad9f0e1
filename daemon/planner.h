/* Turns a save every rank has declared or sealed into a write plan (planner.c): coverage, shard plan, write ops, index, artifacts. */
#ifndef SD_PLANNER_H
#define SD_PLANNER_H

#include "publish.h"
#include "save.h"

typedef struct sd_planned {
  sd_tensor *tensors;       /* names borrowed from the save */
  size_t ntensors;
  sd_plan plan;
  int have_plan;
  sd_write_op *ops;         /* sorted by file, then offset */
  size_t nops;
  sd_shm_span *spans;       /* the shm regions the ops read from */
  size_t nspans;
  char *index_json;
  size_t index_len;
  sd_artifact *artifacts;   /* each file once, its bytes the save's, or joined from its parts (owned) */
  size_t nartifacts;
  uint8_t **joined;         /* the buffers of files joined from parts */
  size_t njoined;
  uint64_t data_bytes;      /* tensor bytes written (replicas once) */
  uint64_t total_bytes;     /* every byte of every file, headers and index included */
  uint64_t nfiles;          /* shards + index + artifacts */
  /* Streaming (some puts deferred): which ops may be read, and each slice's
   * ops (slice_ops[slice_first[id] .. slice_first[id + 1]]) to flag when
   * its bytes arrive. NULL when every byte was in place at planning. */
  uint8_t *op_ready;
  size_t *slice_first;
  size_t *slice_ops;
  size_t nslices;
} sd_planned;

/* Errors name the tensor or file (coverage: overlap/gap; collisions with
 * shard names: invalid_argument). */
int sd_planner_build(const sd_save *save, sd_planned *out, sd_error *err);
void sd_planned_free(sd_planned *p);
/* A deferred slice's bytes are in place: flags its ops; returns how many. */
size_t sd_planned_slice_ready(sd_planned *p, const sd_slice *sl);

#endif

/* Private to publish_job.c and publish_start.c: one publish's state, shared by the job that writes it and the start that lays it out. */
#ifndef SD_PUBLISH_INT_H
#define SD_PUBLISH_INT_H

#include <sys/types.h>

#include "fileset.h"
#include "publish.h"

#define DIR_TAG SD_FILESET_NONE /* the fsync of a folder, not of a file */
#define LATE_TAG (SD_FILESET_NONE - 1) /* the late file's write or fsync */

typedef enum {
  PH_WRITE,                /* data, headers, artifacts, index; each file fsynced when whole */
  PH_LATE,                 /* checksums on: the index (or a single file's header) with them, and its fsync */
  PH_DIRSYNC,              /* the temporary folder */
  PH_PARENTSYNC,           /* after the rename: the folder holding ROOT/DIR */
} pub_phase;

struct sd_publish {
  sd_wjob job;             /* first: the writer hands it back to us */
  char *root_path, *rel_dir, *tag, *tmp_name;
  const char *base;        /* last part of rel_dir */
  int root_fd, parent_fd, tmp_fd;
  unsigned created_parents;
  int overwrite;
  int record_owner;
  uid_t owner_uid;
  int owner_trusted;

  size_t nfiles;           /* shards, then artifacts, then the index */
  const char **names;      /* per file: into the plan, the artifact copy or the plan's index name */
  int *fds;                /* per file, -1 once the set took it over */
  uint32_t index_file;     /* the index's position in files, or DIR_TAG when there is none */
  unsigned file_mode, dir_mode;
  uint8_t *artifact_bytes;
  char *artifact_names;    /* copied artifact names */

  sd_fill_file *fill_files; /* the bytes of every file */
  const sd_write_op *ops;  /* sorted: the caller's, or own_ops */
  size_t nops;
  sd_write_op *own_ops;    /* a sorted copy when the caller's ops were not sorted */
  sd_shm_span *spans;      /* the request's, sorted by base */
  size_t nspans;
  const uint8_t *op_ready;
  sd_fileset *fs;          /* the files' writes and fsyncs, and the publish's first failure */

  /* Checksums (plan->checksums): the data's CRC-32C shares per file, and
   * the bytes that record them, written once every data byte has passed:
   * the index (left empty until then), or a single file's header (written
   * first with a placeholder, then again over it). */
  const sd_plan *plan;
  uint32_t *sums;
  uint8_t *late;           /* NULL: nothing late; else block-aligned, zeros from late_len to the block's end */
  size_t late_len, late_sent;
  uint32_t late_file;
  int late_fd, late_busy, late_synced, late_odirect, late_padded;

  uint64_t bytes_total;
  int released;

  pub_phase phase;
  int hold;                /* sources may still change: do not publish yet */
  int dir_queued, dir_done;
  int renamed, exchanged;

  sd_publish_released_cb on_released;
  sd_publish_done_cb on_done;
  void *ud;
};

/* publish_job.c, for the start: the writer job's table, and the ways out before it is attached. */
extern const sd_wjob_ops sd_publish_ops;
/* Only failures are logged here; the daemon's logger reports the rest. */
void sd_publish_log(const sd_publish *p, const char *msg);
/* Leaves no trace: the rename undone if it happened, the temporary folder
 * and any parent folders this save created removed. */
void sd_publish_discard(sd_publish *p);
void sd_publish_free(sd_publish *p);

#endif

/* Private to publish_job.c and publish_start.c: one publish's state, shared by the job that writes it and the start that lays it out. */
#ifndef SD_PUBLISH_INT_H
#define SD_PUBLISH_INT_H

#include <sys/types.h>

#include "direct.h"
#include "publish.h"

#define DIR_TAG 0xffffffffu   /* the fsync of a folder, not of a file */

typedef struct {
  const char *name;        /* points into the plan, the request copy or artifact copy */
  int fd;
  int slot;                /* fixed-file slot, -1 none, -2 not asked for yet */
  int direct;              /* opened O_DIRECT: whole blocks only */
  int trim;                /* longer than size (padding, preallocation): cut before fsync */
  uint64_t size;           /* final length */
  uint64_t left;           /* bytes not yet written; 0 queues its fsync */
} pub_file;

typedef enum {
  PH_WRITE,                /* data, headers, artifacts, index; each file fsynced when whole */
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

  size_t nfiles;           /* shards, then artifacts, then the index */
  pub_file *files;
  uint32_t index_file;     /* the index's position in files, or DIR_TAG when there is none */
  unsigned file_mode, dir_mode;
  uint8_t *artifact_bytes;
  char *names;             /* copied artifact names */

  sd_fill fill;            /* the bytes of every file, and the staging cursor */
  sd_fill_file *fill_files;
  sd_write_op *own_ops;    /* a sorted copy when the caller's ops were not sorted */
  sd_shm_span *spans;      /* the request's, sorted by base */
  sd_chunk *wq, **wq_tail; /* filled chunks waiting for the ring */
  sd_direct zc;            /* zero-copy writes of fill */
  uint64_t bytes_direct;   /* file bytes written straight from the clients' segments */
  uint64_t bytes_gathered; /* ... of them gathered from several sources in one writev (not in bytes_direct) */
  uint64_t bytes_sealed;   /* source bytes staged from sealed memfds (no shrink check, no guard) */
  int said_buffered;       /* the O_DIRECT fallback was logged */
  uint32_t *ready;         /* files whose bytes are all written, awaiting fsync */
  size_t ready_head, ready_tail, nsynced;

  uint64_t ops_left;       /* bytes still to read from callers' sources */
  uint64_t bytes_total, bytes_written;
  int released;

  pub_phase phase;
  int hold;                /* sources may still change: do not publish yet */
  int dir_queued, dir_done;
  int renamed, exchanged;

  int failed;
  sd_error err;

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

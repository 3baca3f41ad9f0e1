/* Private glue between pathsafe.c, writer.c and publish.c; the rest of the daemon uses publish.h. */
#ifndef SD_PUBLISH_INT_H
#define SD_PUBLISH_INT_H

#include <stdint.h>

#include "publish.h"

/* ------------------------------------------------------------------------ *
 * Paths (pathsafe.c)
 * ------------------------------------------------------------------------ */
/* Temporary folders are named with this prefix, so a restarted daemon can
 * recognise (and remove) what a crashed one left behind. */
#define SD_TMP_PREFIX ".shardd-tmp-"
/* Deepest folder sd_cleanup_stale and sd_path_remove_tree descend into. */
#define SD_WALK_DEPTH_MAX 64

/* openat2(dirfd, path, flags, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS);
 * returns the fd or -errno. */
int sd_openat_beneath(int dirfd, const char *path, int flags, unsigned mode);

/* Opens (O_RDONLY | O_DIRECTORY) the folder holding the last part of rel,
 * creating the missing folders on the way (mode 0755) when create is set.
 * *created counts the folders it made, deepest last, so a failed save can
 * remove them again with sd_path_unmake_parents. *base points into rel at
 * its last part. */
int sd_path_open_parent(int root_fd, const char *rel, int create, int *parent_fd,
                        unsigned *created, const char **base, sd_error *err);
/* Removes (if empty) the `created` deepest folders above rel's last part. */
void sd_path_unmake_parents(int root_fd, const char *rel, unsigned created);

/* Deletes dirfd/name and everything below it without following a symlink;
 * a symlink inside is unlinked, never its target. */
int sd_path_remove_tree(int dirfd, const char *name, sd_error *err);

/* ------------------------------------------------------------------------ *
 * Writer jobs (writer.c): a job hands the ring one request at a time and
 * hears back once each request is whole (short writes are finished by the
 * writer) or failed.
 * ------------------------------------------------------------------------ */
#define SD_IO_CHUNK (16u << 20) /* largest single write handed to the ring */

typedef enum { SD_IO_WRITE, SD_IO_FSYNC } sd_io_kind;

typedef struct sd_wjob sd_wjob;

typedef struct sd_io {
  sd_io_kind kind;
  int fd;
  uint32_t tag;            /* the job's own label (a file index) */
  uint64_t off;            /* file offset of src[0] */
  const uint8_t *src;
  uint32_t len;            /* <= SD_IO_CHUNK */
  /* writer-private */
  uint32_t done;           /* bytes already written by earlier short writes */
  sd_wjob *job;
  struct sd_io *next;
} sd_io;

typedef struct {
  /* Fill io (kind, fd, tag, off, src, len) with the next request, or return
   * 0 when the job has nothing ready. Must not call user callbacks. */
  int (*next)(sd_wjob *job, sd_io *io);
  /* A request ended: res is its full length or fsync's 0 on success, else
   * -errno (io->done then says how far a write got). Must not call user
   * callbacks: the writer is mid-batch. */
  void (*complete)(sd_wjob *job, const sd_io *io, int res);
  /* Bytes the kernel took, for every positive write result (short ones too). */
  void (*progress)(sd_wjob *job, uint32_t bytes);
  /* Called after each batch of completions and after a kick: the safe
   * point to change phase, call user callbacks, or detach and free. */
  void (*poll)(sd_wjob *job);
  /* The writer is closing: fail with SHARDD_E_SHUTTING_DOWN. */
  void (*shutdown)(sd_wjob *job);
} sd_wjob_ops;

struct sd_wjob {
  const sd_wjob_ops *ops;
  sd_writer *w;
  unsigned inflight;       /* requests on the ring (read-only for the job) */
  int exhausted;           /* writer-private: next() said 0 this round */
  sd_wjob *prev, *next;
};

/* Joins the round-robin; the writer holds the loop alive while any job is attached. */
int sd_writer_attach(sd_writer *w, sd_wjob *job, sd_error *err);
/* Leaves it; only with job->inflight == 0. */
void sd_writer_detach(sd_writer *w, sd_wjob *job);
/* Asks for a poll of every job and a fill of the ring on the next loop turn. */
void sd_writer_kick(sd_writer *w);
/* Fills the ring from every job and submits once (no user callbacks). */
void sd_writer_pump(sd_writer *w);

#endif

/* Private glue between pathsafe.c, writer.c and publish.c; the rest of the daemon uses publish.h. */
#ifndef SD_PUBLISH_INT_H
#define SD_PUBLISH_INT_H

#include <stdint.h>

#include "publish.h"
#include "staging.h"

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
 * writer) or failed. Data reaches the ring through staging chunks: the
 * writer lends the job an idle chunk (stage), the copy worker fills it off
 * the loop thread (fill), the job gets it back (filled) and hands its write
 * to the ring (next), then returns the chunk (sd_writer_chunk_put).
 * ------------------------------------------------------------------------ */
#define SD_IO_CHUNK (16u << 20) /* largest single write handed to the ring */

typedef enum { SD_IO_WRITE, SD_IO_FSYNC } sd_io_kind;

typedef struct sd_wjob sd_wjob;

typedef struct sd_io {
  sd_io_kind kind;
  int fd;                  /* a fixed-file slot when fixed is set */
  int fixed;
  int buf_index;           /* registered buffer holding src, or -1 (preset) */
  uint32_t tag;            /* the job's own label (a file index) */
  uint64_t off;            /* file offset of src[0] */
  const uint8_t *src;
  uint32_t len;            /* <= SD_IO_CHUNK */
  sd_chunk *chunk;         /* the staging chunk src lies in, if any */
  /* writer-private */
  uint32_t done;           /* bytes already written by earlier short writes */
  sd_wjob *job;
  struct sd_io *next;
} sd_io;

typedef struct {
  /* Fill io (kind, fd, tag, off, src, len, ...) with the next request, or
   * return 0 when the job has nothing ready. Must not call user callbacks. */
  int (*next)(sd_wjob *job, sd_io *io);
  /* A request ended: res is its full length or fsync's 0 on success, else
   * -errno (io->done then says how far a write got). Must not call user
   * callbacks: the writer is mid-batch. */
  void (*complete)(sd_wjob *job, const sd_io *io, int res);
  /* Bytes the kernel took, for every positive write result (short ones
   * too); io->done does not count them yet. */
  void (*progress)(sd_wjob *job, const sd_io *io, uint32_t bytes);
  /* Loop thread: take chunk c for the next stretch of data (set c->file,
   * off, len, cursor), or return 0 when nothing is left to stage now. */
  int (*stage)(sd_wjob *job, sd_chunk *c);
  /* Copy worker thread: fill c->buf. Reads only what stays unchanged while
   * the job lives; touches nothing the loop thread writes. */
  void (*fill)(sd_wjob *job, sd_chunk *c);
  /* Loop thread: c is back from the worker, filled or with c->fault set.
   * Must not call user callbacks. */
  void (*filled)(sd_wjob *job, sd_chunk *c);
  /* Called after each batch of completions and after a kick: the safe
   * point to change phase, call user callbacks, or detach and free. */
  void (*poll)(sd_wjob *job);
  /* Fail with code (the writer is closing: SHARDD_E_SHUTTING_DOWN; no
   * staging memory: SHARDD_E_NO_MEMORY) and why. */
  void (*fail)(sd_wjob *job, int code, const char *why);
} sd_wjob_ops;

struct sd_wjob {
  const sd_wjob_ops *ops;
  sd_writer *w;
  unsigned inflight;       /* requests on the ring (read-only for the job) */
  unsigned filling;        /* chunks with the copy worker (read-only for the job) */
  int exhausted;           /* writer-private: next() said 0 this round */
  int staged_all;          /* writer-private: stage() said 0 this round */
  sd_wjob *prev, *next;
};

/* Joins the round-robin; the writer holds the loop alive while any job is attached. */
int sd_writer_attach(sd_writer *w, sd_wjob *job, sd_error *err);
/* Leaves it; only with job->inflight == 0 and job->filling == 0. */
void sd_writer_detach(sd_writer *w, sd_wjob *job);
/* Asks for a poll of every job and a fill of the ring on the next loop turn. */
void sd_writer_kick(sd_writer *w);
/* Fills the ring from every job and submits once, and hands idle staging
 * chunks to the copy worker (no user callbacks). */
void sd_writer_pump(sd_writer *w);
/* Gives a chunk back once its write is done (or will never be made). */
void sd_writer_chunk_put(sd_writer *w, sd_chunk *c);
/* A fixed-file slot for fd, or -1 (then use fd itself); unslot before close. */
int sd_writer_file_slot(sd_writer *w, int fd);
void sd_writer_file_unslot(sd_writer *w, int slot);
/* 1 when the writer was told never to use O_DIRECT. */
int sd_writer_buffered(const sd_writer *w);
/* Counts a data write as direct or buffered (sd_writer_stats). */
void sd_writer_count_write(sd_writer *w, int direct);

/* ------------------------------------------------------------------------ *
 * A publish's bytes (pubfill.c): every file is a head (header, artifact or
 * index bytes, at offset 0) followed by the data writes that land in it;
 * files are cut into chunk-sized stretches at multiples of the chunk size,
 * so every write but a file's last is whole aligned blocks.
 * ------------------------------------------------------------------------ */
typedef struct {
  const uint8_t *head;     /* heap memory */
  uint64_t head_len;
  uint64_t size;           /* the file's final length */
} sd_fill_file;

typedef struct {
  const sd_fill_file *files;
  size_t nfiles;
  const sd_write_op *ops;  /* sorted by file, then offset, none overlapping */
  size_t nops;
  const sd_shm_span *spans; /* sorted by base, none overlapping */
  size_t nspans;
  const uint8_t *ready;    /* ops[i] may be read once ready[i] is set; NULL: all may */
  /* the loop thread's cursor: where the next stretch starts */
  uint32_t file;
  uint64_t off;
  size_t op;
  size_t scan;             /* ops before this one are known ready */
} sd_fill;

/* Pure: the next stretch, at most cap bytes (a multiple of SD_DIO_ALIGN)
 * of one file: sets c->file, off, len and cursor and advances. Returns 0
 * once every byte of every file has been handed out, or while a write in
 * the next stretch is not ready (whole stretches only, so a slow source
 * does not turn into many small writes). */
int sd_fill_next(sd_fill *f, uint32_t cap, sd_chunk *c);
/* Copies the stretch into c->buf: the head, the data writes (shared
 * sources inside a span with preadv, gathered by source run; others with
 * memcpy, a fault in a shared one setting c->fault and fault_off instead of
 * killing the process), zeros for bytes no write covers and up to
 * sd_align_up(len). Sets c->src_bytes. */
void sd_fill_copy(const sd_fill *f, sd_chunk *c);

#endif

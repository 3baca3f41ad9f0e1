/* One set of files written from spans through the writer (fileset.c): a publish's files, a node's share of a multi-node save, the leader's own files. */
#ifndef SD_FILESET_H
#define SD_FILESET_H

#include <stddef.h>
#include <stdint.h>

#include "pubfill.h"
#include "sd_error.h"
#include "writer.h"

/* Every file is a head and the writes that land in it (pubfill.c). The
 * aligned middles of slices placed congruent to their file offsets go
 * zero-copy from the clients' segments (direct.c), the rest is cut into
 * aligned stretches the copy workers fill; the ring writes both with
 * O_DIRECT, buffered where the file system refuses it, in the writer's
 * counters. A durable set fsyncs each file once it is whole. Folders,
 * renames and phases are the caller's. A segment a client shrank fails
 * the set with SHARDD_E_IO (the caller names the region). */
typedef struct sd_fileset sd_fileset;

typedef struct {
  uint64_t written;        /* bytes of the files (never a last block's padding) */
  uint64_t zero_copy;      /* of those, written straight from the clients' segments (zero-copy) */
  uint64_t gathered;       /* ... gathered from several segments in one writev (not in zero_copy) */
  uint64_t sealed;         /* source bytes staged from sealed memfds (no shrink check, no guard) */
} sd_fileset_counts;

/* err NULL: every byte of every file is written (and, durable, fsynced). */
typedef void (*sd_fileset_cb)(void *ud, const sd_error *err);

#define SD_FILESET_NONE 0xffffffffu /* no file: a message about the folder itself */

typedef struct {
  /* per file, open for writing (O_DIRECT is set here when taken); read at
   * the start: a durable set owns them from then on, closing each once it
   * is fsynced (and registering it with the ring as a fixed file meanwhile),
   * any other leaves them to the caller */
  const int *fds;
  /* by_name: the files were made in this folder and closed (fds NULL); each is
   * opened by its name when its first write or fsync is issued and closed
   * once fsynced, so a durable set holds only the files being written, not
   * all of them (a save of 100,000 files under a descriptor limit of 1,024).
   * The set does not own dir_fd. */
  int by_name, dir_fd;
  const char *const *names; /* per file, for messages */
  const sd_fill_file *files; /* per file: head (at its offset 0) and size */
  /* per file (NULL: all 0): where in the descriptor's file it starts, a
   * multiple of SD_DIO_ALIGN. A file may be a region of a larger one whose
   * other parts are written by someone else; a region whose size is not
   * whole blocks ends the real file (its padded last block is cut back). */
  const uint64_t *bases;
  size_t nfiles;
  const sd_write_op *ops;  /* sorted by file, then offset, none overlapping; ops[i].file indexes fds */
  size_t nops;
  const uint8_t *op_ready; /* streaming: ops[i] is read only once op_ready[i] is set (then poke); NULL: all are */
  const sd_shm_span *spans; /* segments the SD_WOP_SHARED sources lie in, sorted by base (may be 0) */
  size_t nspans;
  int durable;             /* fsync each file once whole */
  int gather;              /* plan gathered writes of several segments too (sd_fill_plan_gather) */
  const char *dir;         /* messages name a file dir/name; NULL: by its name alone */
  const char *where;       /* named by the warning that O_DIRECT is refused, read at the start (by name: kept); NULL: the file */
  const char *tag;         /* the save, for messages */
  /* Test points (crashpoint.h): NULL for a publish's (write, fsync, and
   * index for index_file); a name is the one point of the whole set: reached
   * at its start, and every write's answer passes it. */
  const char *point;
  uint32_t index_file;
  const int *stop;         /* may be NULL; once nonzero, nothing more is staged and the set ends early */
  /* per file (NULL: no checksums): XORed with the CRC-32C share
   * (sd_checksum.h) of every data byte as it passes: staged bytes on the copy
   * workers, zero-copy ones read from the clients' segments before their
   * write and again once it is done: bytes that changed in between fail the
   * set with SHARDD_E_BAD_STATE naming the rank (sd_shm_span.rank). Shares count against the end of the file as given (a region's
   * end: its owner shifts them to the real file's); heads are never
   * counted, bytes no write covers are zeros. Whole once every source has
   * been read (sd_fileset_released), and at the callback. */
  uint32_t *sums;
  /* may be NULL: counts.written and counts.zero_copy added here too as they go (a caller's running totals) */
  uint64_t *bytes_written, *bytes_zero_copy;
  sd_fileset_cb cb;        /* sd_fileset_start: on the loop, once; the set is gone by then */
  void *ud;
} sd_fileset_req;

/* The set as a writer job of its own, for callers that need nothing
 * around the writes. Everything req points to must stay valid until the
 * callback. On failure (no callback) the descriptors stay the caller's. */
int sd_fileset_start(sd_writer *w, const sd_fileset_req *req, sd_error *err);

/* The set alone, for a caller whose own writer job drives it (the publish:
 * its phases around the writes) through the calls below, which mirror
 * sd_wjob_ops. Nothing is attached; sd_fileset_free once nothing is in
 * flight. On failure the descriptors stay the caller's. */
int sd_fileset_new(sd_writer *w, const sd_fileset_req *req, sd_fileset **out, sd_error *err);
void sd_fileset_free(sd_fileset *s);
/* Closes the descriptors a durable set still owns (nothing in flight). */
void sd_fileset_close(sd_fileset *s);

int sd_fileset_next(sd_fileset *s, sd_io *io);
void sd_fileset_complete(sd_fileset *s, const sd_io *io, int res);
void sd_fileset_progress(sd_fileset *s, const sd_io *io, uint32_t bytes);
int sd_fileset_stage(sd_fileset *s, sd_chunk *c);
void sd_fileset_fill(sd_fileset *s, sd_chunk *c);
void sd_fileset_filled(sd_fileset *s, sd_chunk *c);
/* Gives back the filled chunks not yet on the ring (after a failure). */
void sd_fileset_drop(sd_fileset *s);

/* The first failure wins: later ones are usually its consequences. */
void sd_fileset_failf(sd_fileset *s, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* errno e of what (a write at off, an fsync, ...) on file f (SD_FILESET_NONE: the folder), as one error. */
void sd_fileset_fail_errno(sd_fileset *s, int e, uint32_t f, const char *what, uint64_t off);
/* The failure, or NULL. */
const sd_error *sd_fileset_error(const sd_fileset *s);
/* 1 once every source byte was read (staged or written zero-copy): the sources are never read again. */
int sd_fileset_released(const sd_fileset *s);
/* 1 once every file is whole (durable: and fsynced). */
int sd_fileset_done(const sd_fileset *s);
const sd_fileset_counts *sd_fileset_counts_of(const sd_fileset *s);

#endif

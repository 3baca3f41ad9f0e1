/* Whole files written into descriptors the caller opened, through the writer's staging and O_DIRECT (filejob.c): a node's share of a multi-node save. */
#ifndef SD_FILEJOB_H
#define SD_FILEJOB_H

#include <stddef.h>
#include <stdint.h>

#include "pubfill.h"
#include "sd_error.h"
#include "writer.h"

/* The same staged path as a publish (pubfill.c cuts the files into aligned
 * stretches, the copy workers fill them, the ring writes them with
 * O_DIRECT, buffered where the file system refuses it), the same writer
 * counters; but no folder, no fsync and no rename: the caller owns those. */
typedef struct sd_filejob sd_filejob;

/* err NULL: every byte of every file is written (not yet durable). */
typedef void (*sd_filejob_cb)(void *ud, const sd_error *err);

typedef struct {
  const int *fds;          /* per file, open for writing; O_DIRECT is set here when taken */
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
  const sd_shm_span *spans; /* segments the SD_WOP_SHARED sources lie in, sorted by base (may be 0) */
  size_t nspans;
  const int *stop;         /* may be NULL; once nonzero, nothing more is staged and the job ends early */
  const char *tag;         /* the save, for messages */
  sd_filejob_cb cb;        /* on the loop, once; the job is gone by then */
  void *ud;
} sd_filejob_req;

/* Everything req points to must stay valid until the callback. */
int sd_filejob_start(sd_writer *w, const sd_filejob_req *req, sd_error *err);

#endif

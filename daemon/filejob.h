/* Whole files written into descriptors the caller opened, through the writer's staging and O_DIRECT (filejob.c): a node's share of a multi-node save. */
#ifndef SD_FILEJOB_H
#define SD_FILEJOB_H

#include <stddef.h>
#include <stdint.h>

#include "pubfill.h"
#include "sd_error.h"
#include "writer.h"

/* The same path as a publish: the aligned middles of slices placed
 * congruent to their file offsets go zero-copy from the clients' segments
 * (direct.c), the rest is cut into aligned stretches the copy workers fill
 * (pubfill.c); the ring writes both with O_DIRECT, buffered where the file
 * system refuses it, in the same writer counters. But no folder, no fsync
 * and no rename: the caller owns those. A segment a client shrank fails the
 * job with SHARDD_E_IO (the caller names the region). */
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
  /* may be NULL: bytes of the files written (never a last block's padding), and of those the ones
   * written zero-copy from the segments, added as they go */
  uint64_t *bytes_written, *bytes_direct;
  const char *tag;         /* the save, for messages */
  sd_filejob_cb cb;        /* on the loop, once; the job is gone by then */
  void *ud;
} sd_filejob_req;

/* Everything req points to must stay valid until the callback. */
int sd_filejob_start(sd_writer *w, const sd_filejob_req *req, sd_error *err);

#endif

/* Zero-copy writes driven for a writer job (direct.c): the pieces on the ring, their resubmits after an O_DIRECT refusal, for fileset.c. */
#ifndef SD_DIRECT_H
#define SD_DIRECT_H

#include <stdint.h>

#include "pubfill.h"
#include "writer.h"

#define SD_DIRECT_INFLIGHT 16 /* zero-copy writes of one job on the ring at once */

/* A zero-copy piece as it was first handed out, before any of it went to
 * the ring: a resubmit moves the piece (and a short write its iovecs) past
 * what went out, this stays. Its bytes are hashed before the write and again
 * once it has all gone out; the two must agree, or the rank changed its
 * memory under the write (fileset.c). */
typedef struct {
  uint32_t file;
  uint64_t off, len;
  const uint8_t *src;      /* plain: the bytes */
  const struct iovec *iov; /* gathered: niov pieces, a copy of the ones handed out */
  int niov;
  uint32_t *before;        /* per iovec (plain: [0]): its CRC-32C register read before the write */
} sd_zero_copy_first;

typedef struct {
  sd_fill_zero_copy *plan;    /* f->zc: the stretches (owned) */
  sd_fill_piece pieces[SD_DIRECT_INFLIGHT]; /* on the ring, or waiting to go again */
  sd_zero_copy_first first[SD_DIRECT_INFLIGHT]; /* each piece as first handed out */
  uint32_t plain_before[SD_DIRECT_INFLIGHT];
  unsigned pfree[SD_DIRECT_INFLIGHT], npfree, predo[SD_DIRECT_INFLIGHT], npredo;
  /* when some stretches are gathered, SD_GATHER_IOV entries per piece of each: the ones handed
   * to the ring (a short write moves them), their copy as first handed out, and the registers */
  struct iovec *giov, *gfirst;
  uint32_t *gbefore;
} sd_zero_copy;

/* Plans f's zero-copy stretches (sd_fill_plan_zero_copy, SD_ZERO_COPY_MIN) into
 * f->zc, unless probe_fd (an O_DIRECT file of the job; -1: none is, the
 * stretches then go zero-copy through the page cache) sits on a device that
 * wants coarser direct-I/O alignment than SD_DIO_ALIGN (statx
 * STATX_DIOALIGN): then all is staged. With gather, and where the device
 * says what it takes, inner-dimension rows of several segments that meet its
 * alignment are planned as gathered writes too (sd_fill_plan_gather). */
void sd_zero_copy_init(sd_zero_copy *d, sd_fill *f, int probe_fd, int gather);
void sd_zero_copy_free(sd_zero_copy *d);
/* The next zero-copy write: one to resubmit first (*fresh 0), then the next
 * ready stretch of f (*fresh 1: its sd_zero_copy_first_of is set, before
 * still to fill); NULL when none is (or all slots are on the ring). */
sd_fill_piece *sd_zero_copy_next(sd_zero_copy *d, sd_fill *f, int *fresh);
/* pc as it was first handed out. */
sd_zero_copy_first *sd_zero_copy_first_of(sd_zero_copy *d, const sd_fill_piece *pc);
/* Fills io with pc's write (the caller sets fd and off): its bytes, its
 * iovecs when gathered, and the registered buffer slot it goes from when its
 * segment was pinned at attach (sd_writer_pin; else -1, a plain write that
 * pins its pages itself). */
void sd_zero_copy_io(const sd_fill *f, sd_fill_piece *pc, sd_io *io);
/* pc's write (io) ended with res (-errno, or its length; io->done bytes went
 * out before a failure). *wrote: bytes of it now in the file (their pages leave
 * the daemon's page tables). A segment the client shrank fails with -EFAULT.
 * can_buffer: the file is O_DIRECT and the job still writes, so -EINVAL
 * means the file system refused a direct write: then *to_buffered is set,
 * the caller turns the file buffered, and the rest of pc (if any) goes again
 * first. Returns 1 when pc goes again, 0 when it ended well, else -errno. */
int sd_zero_copy_complete(sd_zero_copy *d, sd_fill_piece *pc, int res, const sd_io *io, int can_buffer, uint64_t *wrote,
                       int *to_buffered);
/* What sd_zero_copy_complete will return for the same arguments, changing
 * nothing: 0 says the piece has all gone out, before its pages are dropped. */
int sd_zero_copy_outcome(const sd_fill_piece *pc, int res, const sd_io *io, int can_buffer);

#endif

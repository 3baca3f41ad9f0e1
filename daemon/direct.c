/* Zero-copy writes straight from the clients' segments, driven for a set of files (fileset.c): a publish's, a node's share of a multi-node save. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "crashpoint.h"
#include "direct.h"

void sd_zero_copy_init(sd_zero_copy *d, sd_fill *f, int probe_fd, int gather) {
  memset(d, 0, sizeof *d);
  for (unsigned k = 0; k < SD_DIRECT_INFLIGHT; k++) d->pfree[d->npfree++] = SD_DIRECT_INFLIGHT - 1 - k;
  f->zc = NULL;
  f->nzc = 0;
  struct statx sx;
  uint32_t mem = 0, off = 0;
  if (probe_fd >= 0 && statx(probe_fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
    if (sx.stx_dio_offset_align > SD_DIO_ALIGN || sx.stx_dio_mem_align > SD_DIO_ALIGN) return;
    mem = sx.stx_dio_mem_align, off = sx.stx_dio_offset_align;
  }
  size_t n = 0;
  d->plan = sd_fill_plan_zero_copy(f, SD_ZERO_COPY_MIN, &n);
  if (gather && mem && off) d->plan = sd_fill_plan_gather(f, d->plan, &n, mem, off, SD_ZERO_COPY_MIN, sd_test_gather_min_piece(SD_GATHER_MIN_PIECE));
  for (size_t i = 0; i < n && !d->giov; i++)
    if (d->plan[i].gather && (!(d->giov = malloc(2 * SD_DIRECT_INFLIGHT * SD_GATHER_IOV * sizeof *d->giov)) ||
                              !(d->gbefore = malloc(SD_DIRECT_INFLIGHT * SD_GATHER_IOV * sizeof *d->gbefore)))) {
      free(d->giov);
      d->giov = NULL;
      free(d->plan); /* no memory for the iovecs: everything is staged */
      d->plan = NULL;
      n = 0;
    }
  if (d->giov) d->gfirst = d->giov + SD_DIRECT_INFLIGHT * SD_GATHER_IOV;
  f->zc = d->plan;
  f->nzc = n;
}

void sd_zero_copy_free(sd_zero_copy *d) {
  free(d->plan);
  d->plan = NULL;
  free(d->giov);
  d->giov = d->gfirst = NULL;
  free(d->gbefore);
  d->gbefore = NULL;
}

sd_fill_piece *sd_zero_copy_next(sd_zero_copy *d, sd_fill *f, int *fresh) {
  *fresh = 0;
  if (d->npredo) return &d->pieces[d->predo[--d->npredo]];
  if (!d->npfree) return NULL;
  unsigned k = d->pfree[d->npfree - 1];
  sd_fill_piece *pc = &d->pieces[k];
  pc->iov = d->giov ? d->giov + (size_t)k * SD_GATHER_IOV : NULL;
  if (!sd_fill_next_zero_copy(f, SD_ZERO_COPY_PIECE, pc)) return NULL;
  d->npfree--;
  *fresh = 1;
  sd_zero_copy_first *first = &d->first[k];
  *first = (sd_zero_copy_first){.file = pc->file, .off = pc->off, .len = pc->len, .src = pc->src, .niov = pc->niov,
                                .before = &d->plain_before[k]};
  if (pc->niov) {
    struct iovec *keep = d->gfirst + (size_t)k * SD_GATHER_IOV;
    memcpy(keep, pc->iov, (size_t)pc->niov * sizeof *keep);
    first->iov = keep;
    first->before = d->gbefore + (size_t)k * SD_GATHER_IOV;
  }
  return pc;
}

sd_zero_copy_first *sd_zero_copy_first_of(sd_zero_copy *d, const sd_fill_piece *pc) {
  return &d->first[pc - d->pieces];
}

void sd_zero_copy_io(const sd_fill *f, sd_fill_piece *pc, sd_io *io) {
  io->kind = SD_IO_WRITE;
  io->tag = pc->file;
  io->src = pc->src;
  io->len = pc->len;
  io->iov = pc->niov ? pc->iov : NULL;
  io->iovcnt = pc->niov;
  io->req = pc;
  const sd_shm_span *sp = pc->niov ? NULL : sd_span_find(f->spans, f->nspans, pc->src);
  io->buf_index = sp && pc->len <= sp->len - (uint64_t)(pc->src - sp->base)
                      ? sd_pin_slot(sp->pin, sp->base, pc->src, pc->len)
                      : -1;
}

int sd_zero_copy_outcome(const sd_fill_piece *pc, int res, const sd_io *io, int can_buffer) {
  if (res == -EINVAL && can_buffer) return io->done < pc->len ? 1 : 0;
  return res < 0 ? res : 0;
}

int sd_zero_copy_complete(sd_zero_copy *d, sd_fill_piece *pc, int res, const sd_io *io, int can_buffer, uint64_t *wrote,
                       int *to_buffered) {
  unsigned k = (unsigned)(pc - d->pieces);
  uint32_t done = res >= 0 ? pc->len : io->done;
  /* A fixed-buffer write never mapped the pages: nothing to drop. */
  if (done && !pc->niov && io->buf_index < 0) sd_shared_drop(pc->src, done);
  for (int i = 0; i < io->iovcnt && res >= 0; i++) sd_shared_drop(io->iov[i].iov_base, io->iov[i].iov_len);
  *wrote = done;
  *to_buffered = 0;
  if (res == -EINVAL && can_buffer) {
    *to_buffered = 1;
    if (done < pc->len) { /* the rest again, through the page cache */
      pc->off += done;
      if (pc->niov) pc->iov = io->iov, pc->niov = io->iovcnt; /* a short write moved them past what went out */
      else pc->src += done;
      pc->len -= done;
      d->predo[d->npredo++] = k;
      return 1;
    }
    res = 0; /* all of it went out after all */
  }
  d->pfree[d->npfree++] = k;
  return res < 0 ? res : 0;
}

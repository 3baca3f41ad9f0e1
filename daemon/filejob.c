/* Whole files written into descriptors the caller opened the way a publish writes: zero-copy from the segments where slices line up (direct.c), staged (pubfill.c) for the rest, with O_DIRECT: a node's share of a multi-node save. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "direct.h"
#include "crashpoint.h"
#include "filejob.h"
#include "log.h"

typedef struct {
  int fd;
  int direct;              /* O_DIRECT set: whole blocks only */
  int trim;                /* written past its size (a padded last block): cut back at the end */
  uint64_t base;           /* where in the descriptor's file it starts */
  uint64_t size, left;     /* bytes not yet written */
} fj_file;

struct sd_filejob {
  sd_wjob job;             /* first: the writer hands the job back as this */
  sd_filejob_req r;
  sd_fill fill;
  sd_direct zc;            /* zero-copy writes of fill */
  fj_file *f;
  sd_chunk *wq, **wq_tail; /* filled chunks waiting for the ring */
  int failed, said_buffered;
  sd_error err;
};

static void fj_fail(sd_filejob *j, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fj_fail(sd_filejob *j, int code, const char *fmt, ...) {
  if (j->failed) return;
  j->failed = 1;
  j->err.code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(j->err.msg, sizeof j->err.msg, fmt, ap);
  va_end(ap);
  sd_writer_kick(j->job.w);
}

static void drop_waiting(sd_filejob *j) {
  while (j->wq) {
    sd_chunk *c = j->wq;
    j->wq = c->next;
    sd_writer_chunk_put(j->job.w, c);
  }
  j->wq_tail = &j->wq;
}

/* Buffered from now on: the file system took O_DIRECT at open but refused a write. */
static void go_buffered(sd_filejob *j, fj_file *ff, const char *name, int e) {
  int fl = fcntl(ff->fd, F_GETFL);
  if (fl >= 0) fcntl(ff->fd, F_SETFL, fl & ~O_DIRECT);
  ff->direct = 0;
  if (!j->said_buffered) {
    j->said_buffered = 1;
    sd_log_warn("save '%s': writing buffered: %s refuses O_DIRECT (%s)", j->r.tag, name, strerror(e));
  }
}

/* O_DIRECT when the file system takes it, the blocks allocated up front
 * and the size rounded up to whole blocks, cut back once all is written. */
static void go_direct(sd_filejob *j, size_t i) {
  fj_file *ff = &j->f[i];
  if (sd_writer_buffered(j->job.w) || ff->size == 0) return;
  int fl = fcntl(ff->fd, F_GETFL);
  if (fl < 0 || fcntl(ff->fd, F_SETFL, fl | O_DIRECT) < 0) {
    go_buffered(j, ff, j->r.names[i], errno);
    return;
  }
  ff->direct = 1;
  /* Blocks up front; only a region that ends the file grows it to whole blocks. */
  off_t sized = (off_t)sd_align_up(ff->size);
  int last = (uint64_t)sized > ff->size;
  if (fallocate(ff->fd, 0, (off_t)ff->base, sized) == 0 || (last && ftruncate(ff->fd, (off_t)ff->base + sized) == 0))
    ff->trim = last;
  else if (last)
    ff->trim = 1; /* the padded write itself grows it: cut back all the same */
}

/* ------------------------------------------------------------------------ *
 * The job as the writer sees it
 * ------------------------------------------------------------------------ */
static int stopped(const sd_filejob *j) { return j->failed || (j->r.stop && *j->r.stop); }

/* A zero-copy write from a client's segment: one to resubmit first, then the next stretch. */
static int direct_next(sd_filejob *j, sd_io *io) {
  sd_fill_piece *pc = sd_direct_next(&j->zc, &j->fill);
  if (!pc) return 0;
  fj_file *ff = &j->f[pc->file];
  sd_direct_io(&j->fill, pc, io);
  io->count = sd_io_count_of(ff->direct);
  io->fd = ff->fd;
  io->off = ff->base + pc->off;
  return 1;
}

static int job_next(sd_wjob *job, sd_io *io) {
  sd_filejob *j = (sd_filejob *)job;
  sd_chunk *c = j->wq;
  if (stopped(j)) return 0;
  if (!c) return direct_next(j, io);
  j->wq = c->next;
  if (!j->wq) j->wq_tail = &j->wq;
  c->next = NULL;
  fj_file *ff = &j->f[c->file];
  uint32_t len = ff->direct ? (uint32_t)sd_align_up(c->len) : c->len;
  if (c->done == 0) io->count = sd_io_count_of(ff->direct);
  io->kind = SD_IO_WRITE;
  io->fd = ff->fd;
  io->buf_index = c->buf_index;
  io->tag = c->file;
  io->off = ff->base + c->off + c->done;
  io->src = c->buf + c->done;
  io->len = len - c->done;
  io->chunk = c;
  return 1;
}

/* len more bytes of file i are written; once all are, a padded last block is cut back. */
static void file_wrote(sd_filejob *j, uint32_t i, uint64_t len) {
  fj_file *ff = &j->f[i];
  if ((ff->left -= len) > 0) return;
  if (ff->trim && ftruncate(ff->fd, (off_t)(ff->base + ff->size)) < 0)
    fj_fail(j, sd_err_from_errno(errno), "%s: truncate to its size: %s", j->r.names[i],
            strerror(errno));
}

static void write_failed(sd_filejob *j, const char *name, uint64_t off, int res) {
  if (res == -EFAULT)
    fj_fail(j, SHARDD_E_IO, "%s: a write at offset %llu straight from shared memory faulted: a client's shared memory "
            "is shorter than when it was attached", name, (unsigned long long)off);
  else
    fj_fail(j, sd_err_from_errno(-res), "%s: write at offset %llu failed: %s",
            name, (unsigned long long)off, strerror(-res));
}

/* A zero-copy write ended; a segment the client shrank makes it fail with EFAULT. */
static void direct_complete(sd_filejob *j, const sd_io *io, int res) {
  sd_fill_piece *pc = io->req;
  fj_file *ff = &j->f[pc->file];
  uint64_t done;
  int buffered;
  res = sd_direct_complete(&j->zc, pc, res, io, ff->direct && !stopped(j), &done, &buffered);
  if (buffered) go_buffered(j, ff, j->r.names[pc->file], EINVAL);
  if (res == 1) {
    ff->left -= done;
    return;
  }
  if (res < 0) {
    write_failed(j, j->r.names[pc->file], io->off + io->done, res);
    return;
  }
  file_wrote(j, pc->file, done);
}

static void job_complete(sd_wjob *job, const sd_io *io, int res) {
  sd_filejob *j = (sd_filejob *)job;
  sd_chunk *c = io->chunk;
  res = sd_fault_point("filejob", res); /* tests: the kernel's answer replaced (SHARDD_TEST_FAULT) */
  if (!c) {
    direct_complete(j, io, res);
    return;
  }
  fj_file *ff = &j->f[c->file];
  const char *name = j->r.names[c->file];
  if (res == -EINVAL && ff->direct && !stopped(j)) {
    /* What went out stays; the rest goes again through the page cache. */
    go_buffered(j, ff, name, EINVAL);
    uint64_t done = (uint64_t)c->done + io->done;
    c->done = done < c->len ? (uint32_t)done : c->len;
    if (c->done < c->len) {
      c->next = j->wq;
      j->wq = c;
      if (!c->next) j->wq_tail = &c->next;
      return;
    }
    res = (int)c->len;
  }
  sd_writer_chunk_put(job->w, c);
  if (res < 0) {
    write_failed(j, name, io->off + io->done, res);
    return;
  }
  file_wrote(j, c->file, c->len);
}

/* Bytes of the files themselves, never the padding of a last block. */
static void job_progress(sd_wjob *job, const sd_io *io, uint32_t bytes) {
  sd_filejob *j = (sd_filejob *)job;
  const sd_chunk *c = io->chunk;
  if (!c) {
    if (j->r.bytes_direct) *j->r.bytes_direct += bytes;
    if (j->r.bytes_written) *j->r.bytes_written += bytes;
    return;
  }
  uint64_t before = (uint64_t)c->done + io->done, after = before + bytes;
  if (j->r.bytes_written)
    *j->r.bytes_written += (after < c->len ? after : c->len) - (before < c->len ? before : c->len);
}

static int job_stage(sd_wjob *job, sd_chunk *c) {
  sd_filejob *j = (sd_filejob *)job;
  return stopped(j) ? 0 : sd_fill_next(&j->fill, c->cap, c);
}

static void job_fill(sd_wjob *job, sd_chunk *c) {
  sd_fill_copy(&((sd_filejob *)job)->fill, c);
}

static void job_filled(sd_wjob *job, sd_chunk *c) {
  sd_filejob *j = (sd_filejob *)job;
  if (c->fault)
    fj_fail(j, SHARDD_E_IO, "%s: reading the bytes for offset %llu %s", j->r.names[c->file],
            (unsigned long long)c->fault_off,
            c->fault == EFAULT    ? "faulted (SIGBUS): a client's shared memory is shorter than when it was attached"
            : c->fault == ENODATA ? "came up short: a client's shared memory is shorter than when it was attached"
                                  : strerror(c->fault));
  if (stopped(j)) {
    sd_writer_chunk_put(job->w, c);
    return;
  }
  c->next = NULL;
  *j->wq_tail = c;
  j->wq_tail = &c->next;
}

static void finish(sd_filejob *j) {
  sd_writer_detach(j->job.w, &j->job);
  sd_filejob_cb cb = j->r.cb;
  void *ud = j->r.ud;
  sd_error err = j->err;
  int failed = j->failed;
  sd_direct_free(&j->zc);
  free(j->f);
  free(j);
  cb(ud, failed ? &err : NULL);
}

static void job_poll(sd_wjob *job) {
  sd_filejob *j = (sd_filejob *)job;
  if (!j->failed && j->r.stop && *j->r.stop) fj_fail(j, SHARDD_E_ABORTED, "save '%s': stopped", j->r.tag);
  if (j->failed) drop_waiting(j);
  if (job->inflight || job->filling) return;
  if (j->failed) {
    finish(j);
    return;
  }
  for (size_t i = 0; i < j->r.nfiles; i++)
    if (j->f[i].left) return;
  finish(j);
}

static void job_fail(sd_wjob *job, int code, const char *why) {
  fj_fail((sd_filejob *)job, code, "%s", why);
}

static const sd_wjob_ops fj_ops = {.next = job_next, .complete = job_complete, .progress = job_progress,
                                   .stage = job_stage, .fill = job_fill, .filled = job_filled,
                                   .poll = job_poll, .fail = job_fail};

int sd_filejob_start(sd_writer *w, const sd_filejob_req *req, sd_error *err) {
  sd_filejob *j = calloc(1, sizeof *j);
  if (j) j->f = calloc(req->nfiles ? req->nfiles : 1, sizeof *j->f);
  if (!j || !j->f) {
    if (j) free(j);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "save '%s': no memory for its files' writes", req->tag);
  }
  j->job.ops = &fj_ops;
  j->job.w = w;
  j->r = *req;
  j->wq_tail = &j->wq;
  j->fill = (sd_fill){.files = req->files, .nfiles = req->nfiles, .ops = req->ops, .nops = req->nops,
                      .spans = req->spans, .nspans = req->nspans};
  for (size_t i = 0; i < req->nfiles; i++) {
    j->f[i].fd = req->fds[i];
    j->f[i].size = j->f[i].left = req->files[i].size;
    j->f[i].base = req->bases ? req->bases[i] : 0;
    go_direct(j, i);
  }
  int probe = -1;
  for (size_t i = 0; i < req->nfiles && probe < 0; i++)
    if (j->f[i].direct) probe = j->f[i].fd;
  sd_direct_init(&j->zc, &j->fill, probe, 0);
  sd_crash_point("filejob"); /* tests: a stall here lets a client shrink its segment under the writes */
  if (sd_writer_attach(w, &j->job, err) != 0) {
    sd_direct_free(&j->zc);
    free(j->f);
    free(j);
    return err->code;
  }
  sd_writer_pump(w);
  sd_writer_kick(w); /* a poll soon: files of no bytes end the job there */
  return 0;
}

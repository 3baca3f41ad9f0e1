/* The writer's raw requests: writes of any length and fsyncs from callers with their own buffers (the multi-node path), carried by one more job on the ring. */
#include <errno.h>
#include <stdlib.h>

#include "writer_int.h"

/* A raw request (sd_writer_raw_*): one piece of it on the ring at a time. */
typedef struct sd_rawreq {
  int fsync, fd;
  const uint8_t *buf;
  uint64_t len, off, done;
  int res;                 /* the outcome, once complete */
  sd_writer_raw_cb cb;
  void *ud;
  struct sd_rawreq *next;
} rawreq;

/* ------------------------------------------------------------------------ *
 * Raw requests: one more job, whose requests come with their own buffers.
 * ------------------------------------------------------------------------ */
static void raw_push(rawreq ***tail, rawreq *r) {
  r->next = NULL;
  **tail = r;
  *tail = &r->next;
}

static int raw_next(sd_wjob *job, sd_io *io) {
  sd_rawjob *rj = (sd_rawjob *)job;
  rawreq *r = rj->wait;
  if (!r || rj->failing) return 0;
  rj->wait = r->next;
  if (!rj->wait) rj->wait_tail = &rj->wait;
  io->req = r;
  io->fd = r->fd;
  if (r->fsync) {
    io->kind = SD_IO_FSYNC;
    return 1;
  }
  uint64_t left = r->len - r->done;
  /* The pieces of a multi-node save that are not whole files of this node
   * (headers, received bytes, shared mode's in-place writes) go through
   * the page cache: counted as such, beside the staged ones. */
  io->count = SD_IO_COUNT_BUFFERED;
  io->kind = SD_IO_WRITE;
  io->src = r->buf + r->done;
  io->off = r->off + r->done;
  io->len = (uint32_t)(left > SD_IO_CHUNK ? SD_IO_CHUNK : left);
  return 1;
}

static void raw_complete(sd_wjob *job, const sd_io *io, int res) {
  sd_rawjob *rj = (sd_rawjob *)job;
  rawreq *r = io->req;
  if (io->kind == SD_IO_WRITE && res >= 0) {
    r->done += io->len;
    if (r->done < r->len) {
      raw_push(&rj->wait_tail, r); /* the next piece, behind what waits already */
      return;
    }
  }
  r->res = res < 0 ? res : 0;
  raw_push(&rj->done_tail, r);
}

static void raw_progress(sd_wjob *job, const sd_io *io, uint32_t bytes) {
  (void)job;
  (void)io;
  (void)bytes;
}

static int raw_stage(sd_wjob *job, sd_chunk *c) {
  (void)job;
  (void)c;
  return 0; /* the buffers are the caller's: nothing to stage */
}

static void raw_fill(sd_wjob *job, sd_chunk *c) {
  (void)job;
  (void)c;
}

static void raw_filled(sd_wjob *job, sd_chunk *c) {
  (void)job;
  (void)c;
}

/* The safe point: callbacks run here, and may queue more requests. */
static void raw_poll(sd_wjob *job) {
  sd_rawjob *rj = (sd_rawjob *)job;
  if (rj->failing) {
    while (rj->wait) {
      rawreq *r = rj->wait;
      rj->wait = r->next;
      r->res = -ESHUTDOWN;
      raw_push(&rj->done_tail, r);
    }
    rj->wait_tail = &rj->wait;
  }
  while (rj->done) {
    rawreq *r = rj->done;
    rj->done = r->next;
    if (!rj->done) rj->done_tail = &rj->done;
    rj->pending--;
    sd_writer_raw_cb cb = r->cb;
    void *ud = r->ud;
    int res = r->res;
    free(r);
    cb(ud, res);
  }
  if (rj->attached && rj->pending == 0) {
    rj->attached = 0;
    sd_writer_detach(job->w, job);
  }
}

static void raw_fail(sd_wjob *job, int code, const char *why) {
  (void)code;
  (void)why;
  sd_rawjob *rj = (sd_rawjob *)job;
  rj->failing = 1;
  sd_writer_kick(job->w);
}

static const sd_wjob_ops raw_ops = {.next = raw_next, .complete = raw_complete, .progress = raw_progress,
                                    .stage = raw_stage, .fill = raw_fill, .filled = raw_filled,
                                    .poll = raw_poll, .fail = raw_fail};

static int raw_add(sd_writer *w, rawreq *r) {
  sd_rawjob *rj = &w->raw;
  if (w->closing) {
    free(r);
    return -ESHUTDOWN;
  }
  if (!rj->job.ops) {
    /* Made at the first request: the ring that holds this job calls nothing of this file. */
    rj->job.ops = &raw_ops;
    rj->wait_tail = &rj->wait;
    rj->done_tail = &rj->done;
  }
  if (!rj->attached) {
    sd_error err = {0};
    if (sd_writer_attach(w, &rj->job, &err) != 0) {
      free(r);
      return -ESHUTDOWN;
    }
    rj->attached = 1;
  }
  rj->pending++;
  raw_push(&rj->wait_tail, r);
  /* Inside a poll the writer pumps once every job has been polled. */
  if (!w->polling) sd_writer_pump(w);
  return 0;
}

int sd_writer_raw_write(sd_writer *w, int fd, const void *buf, uint64_t len, uint64_t off, sd_writer_raw_cb cb,
                        void *ud) {
  rawreq *r = calloc(1, sizeof *r);
  if (!r) return -ENOMEM;
  r->fd = fd;
  r->buf = buf;
  r->len = len;
  r->off = off;
  r->cb = cb;
  r->ud = ud;
  return raw_add(w, r);
}

int sd_writer_raw_fsync(sd_writer *w, int fd, sd_writer_raw_cb cb, void *ud) {
  rawreq *r = calloc(1, sizeof *r);
  if (!r) return -ENOMEM;
  r->fsync = 1;
  r->fd = fd;
  r->cb = cb;
  r->ud = ud;
  return raw_add(w, r);
}

unsigned sd_writer_raw_pending(const sd_writer *w) { return w->raw.pending; }

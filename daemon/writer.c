/* The daemon's single io_uring: batched submissions fed round-robin from every job, completions reaped on the libuv loop. */
#include <errno.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "publish_int.h"

#define SD_REAP_BATCH 64
#define SD_QD_MAX 4096

struct sd_writer {
  uv_loop_t *loop;
  struct io_uring ring;
  int efd;
  uv_poll_t poll;          /* eventfd readable: completions are waiting */
  uv_async_t kick;         /* work appeared outside a completion (start, cancel) */
  unsigned handles_open;

  unsigned qd;
  unsigned inflight;       /* SQEs handed to the ring and not yet reaped */
  sd_io *slots;            /* qd of them; a request holds one until it ends */
  sd_io *free_slots;
  sd_io *retry;            /* short writes to resubmit for the remainder */
  sd_io **retry_tail;

  sd_wjob *jobs;           /* round-robin list; rr is where the next fill starts */
  sd_wjob *rr;
  unsigned njobs;
  int polling;             /* inside poll_jobs: do not recurse */

  int closing;
  void (*close_cb)(void *ud);
  void *close_ud;
};

/* Errors of the writer itself (not of a save) have no one to report to. */
static void wlog(const char *fmt, const char *what, int e) {
  fprintf(stderr, fmt, what, strerror(e));
}

/* ------------------------------------------------------------------------ *
 * Submission
 * ------------------------------------------------------------------------ */
static void prep(sd_writer *w, sd_io *io, struct io_uring_sqe *sqe) {
  if (io->kind == SD_IO_FSYNC)
    io_uring_prep_fsync(sqe, io->fd, 0);
  else
    io_uring_prep_write(sqe, io->fd, io->src + io->done, io->len - io->done, io->off + io->done);
  io_uring_sqe_set_data(sqe, io);
  w->inflight++;
}

/* The next request: a short write's remainder first, then one request
 * from each job in turn, so several saves in flight share the queue depth
 * instead of the first one taking it all. */
static sd_io *next_request(sd_writer *w) {
  sd_io *io = w->retry;
  if (io) {
    w->retry = io->next;
    if (!w->retry) w->retry_tail = &w->retry;
    return io;
  }
  io = w->free_slots;
  if (!io || !w->jobs) return NULL;
  sd_wjob *start = w->rr ? w->rr : w->jobs, *j = start;
  do {
    sd_wjob *nj = j->next ? j->next : w->jobs;
    if (!j->exhausted) {
      memset(io, 0, sizeof *io);
      if (j->ops->next(j, io)) {
        w->free_slots = w->free_slots->next;
        io->job = j;
        io->next = NULL;
        j->inflight++;
        w->rr = nj;
        return io;
      }
      j->exhausted = 1; /* asked once per fill is enough */
    }
    j = nj;
  } while (j != start);
  return NULL;
}

void sd_writer_pump(sd_writer *w) {
  unsigned queued = 0;
  sd_io *io;
  while (w->inflight < w->qd && (io = next_request(w))) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&w->ring);
    if (!sqe) {
      /* The kernel did not take the last batch (EAGAIN); park the request
       * with the retries and try again on the next completion or kick. */
      io->next = w->retry;
      w->retry = io;
      if (!io->next) w->retry_tail = &io->next;
      break;
    }
    prep(w, io, sqe);
    queued++;
  }
  for (sd_wjob *j = w->jobs; j; j = j->next) j->exhausted = 0;
  if (queued || io_uring_sq_ready(&w->ring)) {
    int rc;
    do rc = io_uring_submit(&w->ring); while (rc == -EINTR);
    if (rc == -EAGAIN || rc == -EBUSY)
      sd_writer_kick(w); /* the SQEs stay queued; nothing may complete to retry them */
    else if (rc < 0)
      wlog("shardd: writer: %s: %s\n", "submit", -rc);
  }
}

/* ------------------------------------------------------------------------ *
 * Completion
 * ------------------------------------------------------------------------ */
static void finish_close(sd_writer *w);

static void poll_jobs(sd_writer *w) {
  if (w->polling) return;
  w->polling = 1;
  for (sd_wjob *j = w->jobs; j; ) {
    sd_wjob *next = j->next; /* j may detach and free itself */
    j->ops->poll(j);
    j = next;
  }
  w->polling = 0;
  if (w->closing && !w->jobs && w->inflight == 0) finish_close(w);
}

static void reap(sd_writer *w) {
  struct io_uring_cqe *cqes[SD_REAP_BATCH];
  unsigned n;
  while ((n = io_uring_peek_batch_cqe(&w->ring, cqes, SD_REAP_BATCH)) > 0) {
    for (unsigned i = 0; i < n; i++) {
      sd_io *io = io_uring_cqe_get_data(cqes[i]);
      int res = cqes[i]->res;
      w->inflight--;
      sd_wjob *j = io->job;
      if (io->kind == SD_IO_WRITE && res > 0) {
        j->ops->progress(j, (uint32_t)res);
        io->done += (uint32_t)res;
        if (io->done < io->len) {
          /* Short write: the rest goes out again ahead of new work. */
          io->next = NULL;
          *w->retry_tail = io;
          w->retry_tail = &io->next;
          continue;
        }
        res = (int)io->len;
      } else if (io->kind == SD_IO_WRITE && res == 0 && io->len > 0) {
        res = -EIO; /* a regular file that takes nothing and says no error */
      }
      j->inflight--;
      j->ops->complete(j, io, res);
      io->next = w->free_slots;
      w->free_slots = io;
    }
    io_uring_cq_advance(&w->ring, n);
  }
}

static void on_eventfd(uv_poll_t *h, int status, int events) {
  (void)events;
  sd_writer *w = h->data;
  if (status < 0) {
    wlog("shardd: writer: %s: %s\n", "eventfd poll", -status);
    return;
  }
  uint64_t v;
  /* Clear before reaping, so a completion landing after the reap rearms us. */
  while (read(w->efd, &v, sizeof v) < 0 && errno == EINTR) {}
  reap(w);
  poll_jobs(w);
  sd_writer_pump(w);
}

static void on_kick(uv_async_t *h) {
  sd_writer *w = h->data;
  reap(w);
  poll_jobs(w);
  sd_writer_pump(w);
}

void sd_writer_kick(sd_writer *w) {
  if (!uv_is_closing((uv_handle_t *)&w->kick)) uv_async_send(&w->kick);
}

/* ------------------------------------------------------------------------ *
 * Jobs
 * ------------------------------------------------------------------------ */
int sd_writer_attach(sd_writer *w, sd_wjob *job, sd_error *err) {
  if (w->closing) return sd_fail(err, SHARDD_E_SHUTTING_DOWN, "the writer is shutting down");
  job->w = w;
  job->inflight = 0;
  job->exhausted = 0;
  job->prev = NULL;
  job->next = w->jobs;
  if (w->jobs) w->jobs->prev = job;
  w->jobs = job;
  if (w->njobs++ == 0) uv_ref((uv_handle_t *)&w->poll);
  return 0;
}

void sd_writer_detach(sd_writer *w, sd_wjob *job) {
  if (job->prev) job->prev->next = job->next;
  else w->jobs = job->next;
  if (job->next) job->next->prev = job->prev;
  if (w->rr == job) w->rr = job->next;
  job->prev = job->next = NULL;
  if (--w->njobs == 0) uv_unref((uv_handle_t *)&w->poll);
}

/* ------------------------------------------------------------------------ *
 * Life cycle
 * ------------------------------------------------------------------------ */
int sd_writer_init(sd_writer **out, uv_loop_t *loop, unsigned queue_depth, sd_error *err) {
  *out = NULL;
  if (queue_depth == 0) queue_depth = 64;
  if (queue_depth > SD_QD_MAX) queue_depth = SD_QD_MAX;
  sd_writer *w = calloc(1, sizeof *w);
  if (!w) return sd_fail(err, SHARDD_E_NO_MEMORY, "writer");
  w->slots = calloc(queue_depth, sizeof *w->slots);
  if (!w->slots) {
    free(w);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "writer slots");
  }
  w->loop = loop;
  w->qd = queue_depth;
  w->retry_tail = &w->retry;
  for (unsigned i = 0; i < queue_depth; i++) {
    w->slots[i].next = w->free_slots;
    w->free_slots = &w->slots[i];
  }
  /* SUBMIT_ALL: one bad request must not hold back the rest of a batch.
   * Not COOP_TASKRUN: the loop sleeps in epoll_wait and must still be woken. */
  int rc = io_uring_queue_init(queue_depth, &w->ring, IORING_SETUP_SUBMIT_ALL);
  if (rc == -EINVAL) rc = io_uring_queue_init(queue_depth, &w->ring, 0);
  if (rc < 0) {
    free(w->slots);
    free(w);
    return sd_fail(err, SHARDD_E_IO, "io_uring setup failed: %s", strerror(-rc));
  }
  w->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (w->efd < 0 || (rc = io_uring_register_eventfd(&w->ring, w->efd)) < 0) {
    int e = w->efd < 0 ? errno : -rc;
    if (w->efd >= 0) close(w->efd);
    io_uring_queue_exit(&w->ring);
    free(w->slots);
    free(w);
    return sd_fail(err, SHARDD_E_IO, "io_uring eventfd: %s", strerror(e));
  }
  uv_poll_init(loop, &w->poll, w->efd);
  uv_async_init(loop, &w->kick, on_kick);
  w->poll.data = w->kick.data = w;
  w->handles_open = 2;
  uv_poll_start(&w->poll, UV_READABLE, on_eventfd);
  /* Neither handle keeps the loop alive on its own: only attached jobs do. */
  uv_unref((uv_handle_t *)&w->poll);
  uv_unref((uv_handle_t *)&w->kick);
  *out = w;
  return 0;
}

static void on_handle_closed(uv_handle_t *h) {
  sd_writer *w = h->data;
  if (--w->handles_open) return;
  io_uring_queue_exit(&w->ring);
  close(w->efd);
  void (*cb)(void *) = w->close_cb;
  void *ud = w->close_ud;
  free(w->slots);
  free(w);
  if (cb) cb(ud);
}

static void finish_close(sd_writer *w) {
  if (w->handles_open != 2 || uv_is_closing((uv_handle_t *)&w->poll)) return;
  uv_close((uv_handle_t *)&w->poll, on_handle_closed);
  uv_close((uv_handle_t *)&w->kick, on_handle_closed);
}

void sd_writer_close(sd_writer *w, void (*cb)(void *ud), void *ud) {
  if (w->closing) return;
  w->closing = 1;
  w->close_cb = cb;
  w->close_ud = ud;
  for (sd_wjob *j = w->jobs; j; j = j->next) j->ops->shutdown(j);
  /* Keep the loop alive until the ring is drained and the handles closed. */
  uv_ref((uv_handle_t *)&w->kick);
  sd_writer_kick(w);
}

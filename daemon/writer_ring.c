/* The writer's ring: the daemon's one io_uring, batched submissions fed round-robin from every job (publishes, file sets, raw requests), completions reaped on the libuv loop. */
#include <errno.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "log.h"
#include "writer_int.h"

#define SD_REAP_BATCH 64
#define SD_QD_MAX 4096

/* Errors of the writer itself (not of a save) have no one to report to. */
static void wlog(const char *what, int e) {
  sd_log_error("writer: %s: %s", what, strerror(e));
}

/* ------------------------------------------------------------------------ *
 * Submission
 * ------------------------------------------------------------------------ */
static void prep(sd_writer *w, sd_io *io, struct io_uring_sqe *sqe) {
  if (io->kind == SD_IO_FSYNC)
    io_uring_prep_fsync(sqe, io->fd, 0);
  else if (io->iov)
    io_uring_prep_writev(sqe, io->fd, io->iov, (unsigned)io->iovcnt, io->off + io->done);
  else if (io->buf_index >= 0)
    io_uring_prep_write_fixed(sqe, io->fd, io->src + io->done, io->len - io->done,
                              io->off + io->done, io->buf_index);
  else
    io_uring_prep_write(sqe, io->fd, io->src + io->done, io->len - io->done, io->off + io->done);
  if (io->fixed) io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE);
  if (io->kind == SD_IO_WRITE && io->done == 0) {
    w->st.writes_fixed_buf += io->buf_index >= 0;
    w->st.writes_fixed_file += io->fixed != 0;
  }
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
  /* The free list's link lives in the slot the job fills: kept aside, or
   * clearing the slot would cut the list to this one slot (one request in
   * flight however deep the ring). */
  sd_io *rest = io->next;
  sd_wjob *start = w->rr ? w->rr : w->jobs, *j = start;
  do {
    sd_wjob *nj = j->next ? j->next : w->jobs;
    if (!j->exhausted) {
      memset(io, 0, sizeof *io);
      io->buf_index = -1;
      if (j->ops->next(j, io)) {
        int odirect = io->kind == SD_IO_WRITE && io->count == SD_IO_COUNT_ODIRECT;
        w->slot_odirect[io - w->slots] = (unsigned char)odirect;
        if (io->kind == SD_IO_WRITE && io->count != SD_IO_UNCOUNTED) {
          if (odirect)
            w->st.writes_odirect++;
          else
            w->st.writes_buffered++;
        }
        /* A job's write without a staging chunk is a zero-copy one (retries not counted again); the raw job's
         * buffers are its callers' own, not clients' segments. */
        if (io->kind == SD_IO_WRITE && !io->chunk && j != &w->raw.job) w->st.writes_zero_copy++;
        w->free_slots = rest;
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
  io->next = rest;
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
      wlog("submit", -rc);
  }
  if (sd_writer_stage(w)) sd_writer_kick(w);
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
  sd_fdpool_wake(&w->files); /* completions made busy descriptors idle */
  if (w->closing && !w->jobs && w->inflight == 0 && w->trips_busy == 0 && w->pins_busy == 0) finish_close(w);
}

/* A copy trip is back: its chunks are with their jobs again, ready to go to the ring. */
static void on_trip_back(sd_writer *w) {
  poll_jobs(w);
  sd_writer_pump(w);
}

int sd_writer_file_slot(sd_writer *w, int fd) {
  return sd_staging_file_slot(&w->stg, fd);
}

void sd_writer_file_unslot(sd_writer *w, int slot) {
  sd_staging_file_unslot(&w->stg, slot);
}

int sd_writer_buffered(const sd_writer *w) {
  return w->buffered;
}

void sd_writer_get_stats(const sd_writer *w, sd_writer_stats *out) {
  *out = w->st;
  out->staging_bytes = sd_staging_bytes(&w->stg);
  out->staging_peak = (uint64_t)w->stg.peak * w->stg.chunk_bytes;
  out->staging_max = (uint64_t)w->stg.max * w->stg.chunk_bytes;
  out->registered = w->stg.sparse && !w->stg.reg_failed;
  out->pinned_bytes = w->stg.pinned;
  out->files_open = w->files.nopen;
  out->files_open_peak = w->files.peak;
  out->max_open_files = w->files.cap;
  out->files_reopened = w->files.closes_idle;
}

sd_fdpool *sd_writer_fdpool(sd_writer *w) {
  return &w->files;
}

/* Past the bytes a short gathered write took: whole entries are skipped, the one it stopped in is cut. */
static void iov_advance(sd_io *io, size_t n) {
  while (io->iovcnt > 0 && n >= io->iov->iov_len) {
    n -= io->iov->iov_len;
    io->iov++;
    io->iovcnt--;
  }
  if (io->iovcnt > 0) {
    io->iov->iov_base = (uint8_t *)io->iov->iov_base + n;
    io->iov->iov_len -= n;
  }
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
        if (w->slot_odirect[io - w->slots])
          w->st.bytes_odirect += (uint64_t)res;
        else
          w->st.bytes_buffered += (uint64_t)res;
        j->ops->progress(j, io, (uint32_t)res);
        io->done += (uint32_t)res;
        if (io->done < io->len) {
          if (io->iov) iov_advance(io, (size_t)res);
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
    wlog("eventfd poll", -status);
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
  job->filling = 0;
  job->exhausted = 0;
  job->staged_all = 0;
  uv_timer_stop(&w->trim);
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
  if (w->stage_rr == job) w->stage_rr = job->next;
  job->prev = job->next = NULL;
  if (--w->njobs == 0) {
    uv_unref((uv_handle_t *)&w->poll);
    if (!w->closing) sd_writer_trim_later(w);
  }
}

/* ------------------------------------------------------------------------ *
 * Life cycle
 * ------------------------------------------------------------------------ */
int sd_writer_init(sd_writer **out, uv_loop_t *loop, unsigned queue_depth, sd_error *err) {
  sd_writer_opts o = {.queue_depth = queue_depth};
  return sd_writer_init_opts(out, loop, &o, err);
}

int sd_writer_init_opts(sd_writer **out, uv_loop_t *loop, const sd_writer_opts *o, sd_error *err) {
  *out = NULL;
  unsigned queue_depth = o->queue_depth;
  if (queue_depth == 0) queue_depth = 64;
  if (queue_depth > SD_QD_MAX) queue_depth = SD_QD_MAX;
  sd_writer *w = calloc(1, sizeof *w);
  if (!w) return sd_fail(err, SHARDD_E_NO_MEMORY, "writer");
  int rc;
  w->slots = calloc(queue_depth, sizeof *w->slots);
  w->slot_odirect = calloc(queue_depth, 1);
  if (!w->slots || !w->slot_odirect) {
    rc = sd_fail(err, SHARDD_E_NO_MEMORY, "writer slots");
    goto no_ring;
  }
  w->loop = loop;
  w->qd = queue_depth;
  w->retry_tail = &w->retry;
  w->trip_back = on_trip_back;
  for (unsigned i = 0; i < queue_depth; i++) {
    w->slots[i].next = w->free_slots;
    w->free_slots = &w->slots[i];
  }
  /* SUBMIT_ALL: one bad request must not hold back the rest of a batch.
   * Not COOP_TASKRUN: the loop sleeps in epoll_wait and must still be woken. */
  rc = io_uring_queue_init(queue_depth, &w->ring, IORING_SETUP_SUBMIT_ALL);
  if (rc == -EINVAL) rc = io_uring_queue_init(queue_depth, &w->ring, 0);
  if (rc < 0) {
    rc = sd_fail(err, SHARDD_E_IO, "io_uring setup failed: %s", strerror(-rc));
    goto no_ring;
  }
  w->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (w->efd < 0 || (rc = io_uring_register_eventfd(&w->ring, w->efd)) < 0) {
    int e = w->efd < 0 ? errno : -rc;
    if (w->efd >= 0) close(w->efd);
    rc = sd_fail(err, SHARDD_E_IO, "io_uring eventfd: %s", strerror(e));
    goto no_efd;
  }
  uint64_t staging = o->staging_bytes ? o->staging_bytes : (uint64_t)SD_STAGING_DEFAULT_MIB << 20;
  uint64_t chunk = o->chunk_bytes ? o->chunk_bytes : SD_STAGING_CHUNK;
  /* A small staging still gets two chunks, smaller ones, within its size. */
  if (chunk > SD_IO_CHUNK) chunk = SD_IO_CHUNK;
  if (staging / 2 < chunk) chunk = staging / 2 / SD_DIO_ALIGN * SD_DIO_ALIGN;
  if (chunk < SD_DIO_ALIGN) chunk = SD_DIO_ALIGN;
  if ((rc = sd_staging_init(&w->stg, &w->ring, staging, (uint32_t)chunk, err)) != 0) goto no_staging;
  w->buffered = o->buffered;
  sd_fdpool_init(&w->files, o->max_open_files);
  if ((rc = sd_writer_trips_init(w, o->copy_threads, err)) != 0) goto no_trips;
  sd_bus_guard_install();
  uv_poll_init(loop, &w->poll, w->efd);
  uv_async_init(loop, &w->kick, on_kick);
  uv_timer_init(loop, &w->trim);
  w->poll.data = w->kick.data = w->trim.data = w;
  w->handles_open = 3;
  uv_poll_start(&w->poll, UV_READABLE, on_eventfd);
  /* No handle keeps the loop alive on its own: only attached jobs do. */
  uv_unref((uv_handle_t *)&w->poll);
  uv_unref((uv_handle_t *)&w->kick);
  uv_unref((uv_handle_t *)&w->trim);
  *out = w;
  return 0;
no_trips:
  sd_staging_free(&w->stg);
no_staging:
  close(w->efd);
no_efd:
  io_uring_queue_exit(&w->ring);
no_ring:
  free(w->slots);
  free(w->slot_odirect);
  free(w);
  return rc;
}

static void on_handle_closed(uv_handle_t *h) {
  sd_writer *w = h->data;
  if (--w->handles_open) return;
  sd_staging_free(&w->stg);
  io_uring_queue_exit(&w->ring);
  close(w->efd);
  void (*cb)(void *) = w->close_cb;
  void *ud = w->close_ud;
  free(w->slots);
  free(w->slot_odirect);
  free(w->trips);
  free(w);
  if (cb) cb(ud);
}

static void finish_close(sd_writer *w) {
  if (w->handles_open != 3 || uv_is_closing((uv_handle_t *)&w->poll)) return;
  uv_close((uv_handle_t *)&w->poll, on_handle_closed);
  uv_close((uv_handle_t *)&w->kick, on_handle_closed);
  uv_close((uv_handle_t *)&w->trim, on_handle_closed);
}

void sd_writer_close(sd_writer *w, void (*cb)(void *ud), void *ud) {
  if (w->closing) return;
  w->closing = 1;
  w->close_cb = cb;
  w->close_ud = ud;
  uv_timer_stop(&w->trim);
  for (sd_wjob *j = w->jobs; j; j = j->next) j->ops->fail(j, SHARDD_E_SHUTTING_DOWN, "the daemon is shutting down");
  /* Keep the loop alive until the ring is drained and the handles closed. */
  uv_ref((uv_handle_t *)&w->kick);
  sd_writer_kick(w);
}

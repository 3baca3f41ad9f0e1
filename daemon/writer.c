/* The daemon's one io_uring: batched submissions fed round-robin from every job (publishes, and the raw writes of multi-node saves), staging chunks filled by up to copy_threads copy trips at once, completions reaped on the libuv loop. */
#include <errno.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "log.h"
#include "writer.h"

#define SD_REAP_BATCH 64
#define SD_QD_MAX 4096
/* Chunks per trip to the copy worker: enough to get the disk going at the
 * start of a save, few enough that the first writes leave early. With
 * several trips the staging is shared out so that every trip gets some. */
#define SD_COPY_BATCH 4
/* Staging memory goes back to the system once the writer has been idle this long. */
#define SD_TRIM_MS 10000

/* A raw request (sd_writer_raw_*): one piece of it on the ring at a time. */
typedef struct rawreq {
  int fsync, fd;
  const uint8_t *buf;
  uint64_t len, off, done;
  int res;                 /* the outcome, once complete */
  sd_writer_raw_cb cb;
  void *ud;
  struct rawreq *next;
} rawreq;

/* One trip to a copy worker: the chunks it fills, off the loop thread. */
typedef struct copytrip {
  uv_work_t req;
  struct sd_writer *w;
  sd_chunk *batch;
  struct copytrip *next;   /* idle list */
} copytrip;

/* The job that carries raw requests; attached while any is pending. */
typedef struct {
  sd_wjob job;
  rawreq *wait, **wait_tail; /* the next piece not yet handed to the ring, in order */
  rawreq *done, **done_tail; /* ended, callback not yet run */
  unsigned pending;
  int attached;
  int failing;             /* the writer is closing: what waits ends with -ESHUTDOWN */
} rawjob;

struct sd_writer {
  uv_loop_t *loop;
  struct io_uring ring;
  int efd;
  uv_poll_t poll;          /* eventfd readable: completions are waiting */
  uv_async_t kick;         /* work appeared outside a completion (start, cancel) */
  uv_timer_t trim;         /* idle: give the staging memory back */
  unsigned handles_open;

  sd_staging stg;
  int buffered;            /* never O_DIRECT */
  copytrip *trips;         /* copy_threads of them */
  copytrip *idle_trips;
  unsigned ntrips, trips_busy;
  unsigned trip_batch;     /* chunks per trip */
  sd_wjob *stage_rr;       /* the job the next staging round starts with */
  sd_writer_stats st;

  unsigned qd;
  unsigned inflight;       /* SQEs handed to the ring and not yet reaped */
  sd_io *slots;            /* qd of them; a request holds one until it ends */
  unsigned char *slot_direct; /* per slot: its write goes through O_DIRECT (byte counts) */
  sd_io *free_slots;
  sd_io *retry;            /* short writes to resubmit for the remainder */
  sd_io **retry_tail;

  sd_wjob *jobs;           /* round-robin list; rr is where the next fill starts */
  sd_wjob *rr;
  unsigned njobs;
  int polling;             /* inside poll_jobs: do not recurse */

  rawjob raw;

  int closing;
  void (*close_cb)(void *ud);
  void *close_ud;
};

/* Errors of the writer itself (not of a save) have no one to report to. */
static void wlog(const char *what, int e) {
  sd_log_error("writer: %s: %s", what, strerror(e));
}

/* ------------------------------------------------------------------------ *
 * Submission
 * ------------------------------------------------------------------------ */
static void stage(sd_writer *w);
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
  sd_wjob *start = w->rr ? w->rr : w->jobs, *j = start;
  do {
    sd_wjob *nj = j->next ? j->next : w->jobs;
    if (!j->exhausted) {
      memset(io, 0, sizeof *io);
      io->buf_index = -1;
      if (j->ops->next(j, io)) {
        int direct = io->kind == SD_IO_WRITE && io->count == SD_IO_COUNT_DIRECT;
        w->slot_direct[io - w->slots] = (unsigned char)direct;
        if (io->kind == SD_IO_WRITE && io->count != SD_IO_UNCOUNTED) {
          if (direct)
            w->st.writes_direct++;
          else
            w->st.writes_buffered++;
        }
        /* A publish's write without a staging chunk is a zero-copy one (retries not counted again). */
        if (io->kind == SD_IO_WRITE && !io->chunk && j != &w->raw.job) w->st.writes_zero_copy++;
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
      wlog("submit", -rc);
  }
  stage(w);
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
  if (w->closing && !w->jobs && w->inflight == 0 && w->trips_busy == 0) finish_close(w);
}

/* ------------------------------------------------------------------------ *
 * Staging: idle chunks go round-robin to the jobs with data left, one
 * chunk per job per turn, so a large save cannot starve a small one. Up to
 * copy_threads trips are with the copy workers at once, each with its own
 * chunks, so copying takes that many cores at most; the staging size still
 * bounds the memory, whatever the number of trips.
 * ------------------------------------------------------------------------ */
static void copy_work(uv_work_t *req) {
  copytrip *t = req->data;
  sd_bus_guard_install();
  for (sd_chunk *c = t->batch; c; c = c->next) c->job->ops->fill(c->job, c);
}

static void copy_done(uv_work_t *req, int status) {
  (void)status; /* never cancelled: close waits for every trip to end */
  copytrip *t = req->data;
  sd_writer *w = t->w;
  sd_chunk *c = t->batch;
  t->batch = NULL;
  t->next = w->idle_trips;
  w->idle_trips = t;
  w->trips_busy--;
  while (c) {
    sd_chunk *next = c->next;
    sd_wjob *j = c->job;
    c->next = NULL;
    j->filling--;
    j->ops->filled(j, c);
    c = next;
  }
  poll_jobs(w);
  sd_writer_pump(w);
}

/* Up to max chunks for one trip, round-robin over the jobs; NULL when no
 * job has anything to stage now or every chunk is busy. */
static sd_chunk *stage_batch(sd_writer *w, unsigned max) {
  sd_chunk *head = NULL, **tail = &head;
  unsigned n = 0, idle = 0; /* idle: jobs in a row that staged nothing */
  sd_wjob *j = w->stage_rr ? w->stage_rr : w->jobs;
  while (n < max && idle < w->njobs) {
    sd_wjob *nj = j->next ? j->next : w->jobs;
    if (!j->staged_all) {
      sd_chunk *c = sd_staging_get(&w->stg);
      if (!c && w->stg.busy > 0) break; /* every chunk is busy: wait for one to come back */
      if (!c) {
        /* Not one chunk could be had, and none will come back. */
        j->ops->fail(j, SHARDD_E_NO_MEMORY, "no memory for a staging buffer");
        j->staged_all = 1;
        sd_writer_kick(w);
      } else if (j->ops->stage(j, c)) {
        c->job = j;
        j->filling++;
        *tail = c;
        tail = &c->next;
        n++;
        idle = 0;
        j = nj;
        continue;
      } else {
        sd_staging_put(&w->stg, c);
        j->staged_all = 1;
      }
    }
    idle++;
    j = nj;
  }
  w->stage_rr = j;
  return head;
}

static void stage(sd_writer *w) {
  while (w->idle_trips && w->jobs) {
    sd_chunk *head = stage_batch(w, w->trip_batch);
    if (!head) break;
    copytrip *t = w->idle_trips;
    w->idle_trips = t->next;
    t->next = NULL;
    t->batch = head;
    if (++w->trips_busy > w->st.copy_trips_peak) w->st.copy_trips_peak = w->trips_busy;
    w->st.copy_trips++;
    if (uv_queue_work(w->loop, &t->req, copy_work, copy_done) < 0) {
      /* Cannot happen with a valid loop; fill on this thread rather than stall
       * (copy_done stages the next trip itself). */
      copy_work(&t->req);
      copy_done(&t->req, 0);
      break;
    }
  }
  for (sd_wjob *k = w->jobs; k; k = k->next) k->staged_all = 0;
}

void sd_writer_chunk_put(sd_writer *w, sd_chunk *c) {
  sd_staging_put(&w->stg, c);
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
}

static void on_trim(uv_timer_t *t);

int sd_writer_pin(sd_writer *w, uint8_t *base, uint64_t len) {
  if (w->closing) return 0;
  int pin = sd_staging_pin(&w->stg, base, len);
  /* A pinned arena means a job that will save: its staging is made now, at attach, not in its first
   * save (bench_multi (z) against (Z): ~0.06 s/GiB of the first save went to faulting and registering it). */
  if (pin) sd_staging_prefill(&w->stg);
  return pin;
}

void sd_writer_unpin(sd_writer *w, int pin, uint64_t len) {
  if (w->closing) return;
  sd_staging_unpin(&w->stg, pin, len);
  if (w->stg.pinned == 0 && !w->jobs) uv_timer_start(&w->trim, on_trim, SD_TRIM_MS, 0);
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
        if (w->slot_direct[io - w->slots])
          w->st.bytes_direct += (uint64_t)res;
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
static void on_trim(uv_timer_t *t) {
  sd_writer *w = t->data;
  /* Clients' segments pinned: a job is attached and saves again soon; its staging stays, already faulted in
   * and registered (bench_multi (Z): a save after the trim paid ~0.06 s/GiB more to get it back). */
  if (!w->jobs && w->trips_busy == 0 && w->stg.pinned == 0) sd_staging_trim(&w->stg);
}

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
    if (!w->closing) uv_timer_start(&w->trim, on_trim, SD_TRIM_MS, 0);
  }
}

/* ------------------------------------------------------------------------ *
 * Raw requests: one more job, whose requests come with their own buffers.
 * ------------------------------------------------------------------------ */
static void raw_push(rawreq ***tail, rawreq *r) {
  r->next = NULL;
  **tail = r;
  *tail = &r->next;
}

static int raw_next(sd_wjob *job, sd_io *io) {
  rawjob *rj = (rawjob *)job;
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
  rawjob *rj = (rawjob *)job;
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
  rawjob *rj = (rawjob *)job;
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
  rawjob *rj = (rawjob *)job;
  rj->failing = 1;
  sd_writer_kick(job->w);
}

static const sd_wjob_ops raw_ops = {.next = raw_next, .complete = raw_complete, .progress = raw_progress,
                                    .stage = raw_stage, .fill = raw_fill, .filled = raw_filled,
                                    .poll = raw_poll, .fail = raw_fail};

static int raw_add(sd_writer *w, rawreq *r) {
  rawjob *rj = &w->raw;
  if (w->closing) {
    free(r);
    return -ESHUTDOWN;
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

/* ------------------------------------------------------------------------ *
 * Life cycle
 * ------------------------------------------------------------------------ */
unsigned sd_writer_default_copy_threads(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 1) n = 1;
  return n > SD_COPY_THREADS_DEFAULT_MAX ? SD_COPY_THREADS_DEFAULT_MAX : (unsigned)n;
}

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
  w->slots = calloc(queue_depth, sizeof *w->slots);
  w->slot_direct = calloc(queue_depth, 1);
  if (!w->slots || !w->slot_direct) {
    free(w->slots);
    free(w->slot_direct);
    free(w);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "writer slots");
  }
  w->loop = loop;
  w->qd = queue_depth;
  w->retry_tail = &w->retry;
  w->raw.job.ops = &raw_ops;
  w->raw.wait_tail = &w->raw.wait;
  w->raw.done_tail = &w->raw.done;
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
    free(w->slot_direct);
    free(w);
    return sd_fail(err, SHARDD_E_IO, "io_uring setup failed: %s", strerror(-rc));
  }
  w->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (w->efd < 0 || (rc = io_uring_register_eventfd(&w->ring, w->efd)) < 0) {
    int e = w->efd < 0 ? errno : -rc;
    if (w->efd >= 0) close(w->efd);
    io_uring_queue_exit(&w->ring);
    free(w->slots);
    free(w->slot_direct);
    free(w);
    return sd_fail(err, SHARDD_E_IO, "io_uring eventfd: %s", strerror(e));
  }
  uint64_t staging = o->staging_bytes ? o->staging_bytes : (uint64_t)SD_STAGING_DEFAULT_MIB << 20;
  uint64_t chunk = o->chunk_bytes ? o->chunk_bytes : SD_STAGING_CHUNK;
  /* A small staging still gets two chunks, smaller ones, within its size. */
  if (chunk > SD_IO_CHUNK) chunk = SD_IO_CHUNK;
  if (staging / 2 < chunk) chunk = staging / 2 / SD_DIO_ALIGN * SD_DIO_ALIGN;
  if (chunk < SD_DIO_ALIGN) chunk = SD_DIO_ALIGN;
  rc = sd_staging_init(&w->stg, &w->ring, staging, (uint32_t)chunk, err);
  if (rc) {
    close(w->efd);
    io_uring_queue_exit(&w->ring);
    free(w->slots);
    free(w->slot_direct);
    free(w);
    return rc;
  }
  w->buffered = o->buffered;
  w->ntrips = o->copy_threads ? o->copy_threads : sd_writer_default_copy_threads();
  w->trips = calloc(w->ntrips, sizeof *w->trips);
  if (!w->trips) {
    sd_staging_free(&w->stg);
    close(w->efd);
    io_uring_queue_exit(&w->ring);
    free(w->slots);
    free(w->slot_direct);
    free(w);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "writer copy trips");
  }
  for (unsigned i = w->ntrips; i-- > 0;) {
    w->trips[i].w = w;
    w->trips[i].req.data = &w->trips[i];
    w->trips[i].next = w->idle_trips;
    w->idle_trips = &w->trips[i];
  }
  /* Half the staging on its way through the copy workers at most, the rest
   * for the ring, shared out so that every trip can have some. */
  w->trip_batch = w->stg.max / 2 / w->ntrips;
  if (w->trip_batch > SD_COPY_BATCH) w->trip_batch = SD_COPY_BATCH;
  if (w->trip_batch == 0) w->trip_batch = 1;
  w->st.copy_threads = w->ntrips;
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
  free(w->slot_direct);
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

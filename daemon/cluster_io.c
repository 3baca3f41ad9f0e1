/* The multi-node writer's io_uring: queued writes and fsyncs, short writes resumed, completions reaped on the loop. */
#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "cluster_io.h"

#define CHUNK_MAX (64ull << 20) /* largest single write handed to the kernel */

typedef struct creq {
  int fsync, fd;
  const uint8_t *buf;
  uint64_t len, off, done;
  uint32_t cur;            /* bytes of the write in flight */
  int res;                 /* the outcome, once complete */
  sd_cio_cb cb;
  void *ud;
  struct creq *next;
} creq;

struct sd_cring {
  struct io_uring ring;
  int efd;
  uv_poll_t poll;
  unsigned qd, inflight, pending;
  creq *q, **qtail;        /* waiting for a ring slot */
  int reaping, closing;
};

static void enqueue(sd_cring *r, creq *c) {
  c->next = NULL;
  *r->qtail = c;
  r->qtail = &c->next;
}

/* Hands queued requests to the ring, as many as it has room for. */
static void flush(sd_cring *r) {
  unsigned queued = 0;
  while (r->q && r->inflight < r->qd) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
    if (!sqe) break;
    creq *c = r->q;
    r->q = c->next;
    if (!r->q) r->qtail = &r->q;
    if (c->fsync) {
      io_uring_prep_fsync(sqe, c->fd, 0);
    } else {
      uint64_t left = c->len - c->done;
      c->cur = (uint32_t)(left > CHUNK_MAX ? CHUNK_MAX : left);
      io_uring_prep_write(sqe, c->fd, c->buf + c->done, c->cur, c->off + c->done);
    }
    io_uring_sqe_set_data(sqe, c);
    r->inflight++;
    queued++;
  }
  if (queued || io_uring_sq_ready(&r->ring)) {
    int rc;
    do rc = io_uring_submit(&r->ring); while (rc == -EINTR);
    (void)rc; /* -EAGAIN leaves the SQEs queued; the next completion or request submits them */
  }
}

static void reap(sd_cring *r) {
  /* Completions first, callbacks after: a callback may queue work, which
   * flush() then hands over in the same turn. */
  creq *done = NULL, **dtail = &done;
  struct io_uring_cqe *cqe;
  while (io_uring_peek_cqe(&r->ring, &cqe) == 0) {
    creq *c = io_uring_cqe_get_data(cqe);
    int res = cqe->res;
    io_uring_cqe_seen(&r->ring, cqe);
    r->inflight--;
    if (!c->fsync && res > 0) {
      c->done += (uint64_t)res;
      if (c->done < c->len) {
        enqueue(r, c); /* short write or the next chunk */
        continue;
      }
      res = 0;
    } else if (!c->fsync && res == 0 && c->len > 0) {
      res = -EIO; /* a regular file that takes nothing and reports no error */
    }
    c->res = res < 0 ? res : 0;
    c->next = NULL;
    *dtail = c;
    dtail = &c->next;
  }
  while (done) {
    creq *c = done;
    done = c->next;
    int res = c->res;
    r->pending--;
    sd_cio_cb cb = c->cb;
    void *ud = c->ud;
    free(c);
    cb(ud, res);
  }
}

static void on_event(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  sd_cring *r = h->data;
  uint64_t v;
  while (read(r->efd, &v, sizeof v) < 0 && errno == EINTR) {
  }
  r->reaping = 1;
  reap(r);
  r->reaping = 0;
  flush(r);
}

static int add(sd_cring *r, creq *c) {
  if (r->closing) {
    free(c);
    return -ESHUTDOWN;
  }
  r->pending++;
  enqueue(r, c);
  if (!r->reaping) flush(r);
  return 0;
}

int sd_cring_write(sd_cring *r, int fd, const void *buf, uint64_t len, uint64_t off, sd_cio_cb cb, void *ud) {
  creq *c = calloc(1, sizeof *c);
  if (!c) return -ENOMEM;
  c->fd = fd;
  c->buf = buf;
  c->len = len;
  c->off = off;
  c->cb = cb;
  c->ud = ud;
  return add(r, c);
}

int sd_cring_fsync(sd_cring *r, int fd, sd_cio_cb cb, void *ud) {
  creq *c = calloc(1, sizeof *c);
  if (!c) return -ENOMEM;
  c->fsync = 1;
  c->fd = fd;
  c->cb = cb;
  c->ud = ud;
  return add(r, c);
}

unsigned sd_cring_pending(const sd_cring *r) { return r->pending; }

int sd_cring_init(sd_cring **out, uv_loop_t *loop, unsigned qd, sd_error *err) {
  *out = NULL;
  sd_cring *r = calloc(1, sizeof *r);
  if (!r) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory for the peer writer");
  r->qd = qd ? qd : 64;
  r->qtail = &r->q;
  int rc = io_uring_queue_init(r->qd, &r->ring, 0);
  if (rc < 0) {
    free(r);
    return sd_fail(err, SHARDD_E_IO, "io_uring setup for the peer writer failed: %s", strerror(-rc));
  }
  r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (r->efd < 0 || (rc = io_uring_register_eventfd(&r->ring, r->efd)) < 0) {
    int e = r->efd < 0 ? errno : -rc;
    if (r->efd >= 0) close(r->efd);
    io_uring_queue_exit(&r->ring);
    free(r);
    return sd_fail(err, SHARDD_E_IO, "io_uring eventfd for the peer writer: %s", strerror(e));
  }
  uv_poll_init(loop, &r->poll, r->efd);
  r->poll.data = r;
  uv_poll_start(&r->poll, UV_READABLE, on_event);
  /* Pending requests belong to saves, which keep the daemon alive themselves. */
  uv_unref((uv_handle_t *)&r->poll);
  *out = r;
  return 0;
}

static void on_closed(uv_handle_t *h) {
  sd_cring *r = h->data;
  io_uring_queue_exit(&r->ring);
  close(r->efd);
  free(r);
}

void sd_cring_close(sd_cring *r) {
  if (!r || r->closing) return;
  r->closing = 1;
  uv_close((uv_handle_t *)&r->poll, on_closed);
}

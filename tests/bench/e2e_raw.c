/* Phase (a) of the end-to-end benchmark: one io_uring O_DIRECT sequential writer, the device's limit. */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_e2e.h"
#include "synth.h"

typedef struct {
  uint64_t off;             /* file offset of the buffer's first byte */
  uint32_t len, done;       /* bytes to write, and written so far (short writes) */
} slot;

static void queue_write(struct io_uring *ring, const sd_e2e_raw *r, uint8_t *bufs,
                        size_t bufsize, slot *s, unsigned i) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(ring); /* never NULL: at most qd in flight */
  uint8_t *p = bufs + (size_t)i * bufsize + s->done;
  if (r->fixed_bufs)
    io_uring_prep_write_fixed(sqe, 0, p, s->len - s->done, s->off + s->done, (int)i);
  else
    io_uring_prep_write(sqe, 0, p, s->len - s->done, s->off + s->done);
  sqe->flags |= IOSQE_FIXED_FILE;
  io_uring_sqe_set_data64(sqe, i);
}

/* One attempt; returns -EINVAL when an O_DIRECT write was refused, so the
 * caller retries buffered, 0 when done (r->ok tells whether it worked). */
static int attempt(const char *path, uint64_t bytes, unsigned qd, size_t bufsize, uint8_t *bufs,
                   sd_e2e_raw *r) {
  double t0 = sd_e2e_now(), c0 = sd_e2e_self_cpu();
  int refused = 0;
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | (r->direct ? O_DIRECT : 0), 0644);
  if (fd < 0 && r->direct && errno == EINVAL) {
    r->direct = 0;
    sd_e2e_fmt(r->note, sizeof r->note, "O_DIRECT refused at open (EINVAL): buffered writes");
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  }
  if (fd < 0) {
    sd_e2e_fmt(r->note, sizeof r->note, "open %s: %s", path, strerror(errno));
    return 0;
  }
  /* Allocated up front, as the daemon does its files: extents are not
   * allocated write by write, so this is the device's limit, not ext4's. */
  r->preallocated = fallocate(fd, 0, 0, (off_t)bytes) == 0;
  struct io_uring ring;
  int rc = io_uring_queue_init(qd, &ring, 0);
  if (rc < 0) {
    sd_e2e_fmt(r->note, sizeof r->note, "io_uring_queue_init: %s", strerror(-rc));
    close(fd);
    return 0;
  }
  rc = io_uring_register_files(&ring, &fd, 1);
  if (rc < 0) {
    sd_e2e_fmt(r->note, sizeof r->note, "io_uring_register_files: %s", strerror(-rc));
    io_uring_queue_exit(&ring);
    close(fd);
    return 0;
  }
  struct iovec *iov = calloc(qd, sizeof *iov);
  slot *slots = calloc(qd, sizeof *slots);
  unsigned *free_slots = calloc(qd, sizeof *free_slots);
  if (!iov || !slots || !free_slots) {
    sd_e2e_fmt(r->note, sizeof r->note, "out of memory");
    goto out;
  }
  for (unsigned i = 0; i < qd; i++) {
    iov[i].iov_base = bufs + (size_t)i * bufsize;
    iov[i].iov_len = bufsize;
    free_slots[i] = qd - 1 - i;
  }
  /* Registered buffers count against RLIMIT_MEMLOCK; plain writes still
   * measure the device, only with a little more CPU. */
  r->fixed_bufs = io_uring_register_buffers(&ring, iov, qd) == 0;

  uint64_t next = 0, written = 0;
  unsigned nfree = qd, inflight = 0;
  while (written < bytes && !refused) {
    while (nfree > 0 && next < bytes) {
      unsigned i = free_slots[--nfree];
      uint64_t len = bytes - next < bufsize ? bytes - next : bufsize;
      slots[i] = (slot){.off = next, .len = (uint32_t)len, .done = 0};
      queue_write(&ring, r, bufs, bufsize, &slots[i], i);
      next += len;
      inflight++;
    }
    rc = io_uring_submit_and_wait(&ring, 1);
    if (rc < 0 && rc != -EINTR) {
      sd_e2e_fmt(r->note, sizeof r->note, "io_uring_submit_and_wait: %s", strerror(-rc));
      goto drain;
    }
    struct io_uring_cqe *cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&ring, head, cqe) {
      seen++;
      unsigned i = (unsigned)io_uring_cqe_get_data64(cqe);
      slot *s = &slots[i];
      if (cqe->res == -EINVAL && r->direct) {
        refused = 1;
      } else if (cqe->res <= 0) {
        sd_e2e_fmt(r->note, sizeof r->note, "write at offset %llu: %s", (unsigned long long)s->off,
                 cqe->res ? strerror(-cqe->res) : "wrote nothing");
        io_uring_cq_advance(&ring, seen);
        inflight--;
        goto drain;
      } else if (s->done + (uint32_t)cqe->res < s->len) {
        s->done += (uint32_t)cqe->res; /* short write: the rest goes again */
        queue_write(&ring, r, bufs, bufsize, s, i);
        continue;
      } else {
        written += s->len;
      }
      free_slots[nfree++] = i;
      inflight--;
    }
    io_uring_cq_advance(&ring, seen);
  }
  if (refused) goto drain;
  if (fsync(fd) != 0) {
    sd_e2e_fmt(r->note, sizeof r->note, "fsync: %s", strerror(errno));
    goto out;
  }
  r->seconds = sd_e2e_now() - t0;
  r->cpu_s = sd_e2e_self_cpu() - c0;
  r->bytes = written;
  r->ok = 1;
  goto out;
drain:
  /* Nothing may still write into the buffers once we return. */
  while (inflight > 0) {
    struct io_uring_cqe *cqe;
    if (io_uring_wait_cqe(&ring, &cqe) < 0) break;
    io_uring_cqe_seen(&ring, cqe);
    inflight--;
  }
out:
  io_uring_queue_exit(&ring);
  close(fd);
  free(iov);
  free(slots);
  free(free_slots);
  return refused ? -EINVAL : 0;
}

void sd_e2e_raw_write(const char *path, uint64_t bytes, unsigned qd, size_t bufsize,
                      sd_e2e_raw *out) {
  memset(out, 0, sizeof *out);
  uint8_t *bufs = NULL;
  if (posix_memalign((void **)&bufs, 4096, (size_t)qd * bufsize) != 0) {
    sd_e2e_fmt(out->note, sizeof out->note, "cannot allocate %u x %zu bytes of buffers", qd, bufsize);
    return;
  }
  /* Incompressible, like model weights; a virtual disk that dedups or
   * compresses zeros would otherwise flatter the limit. */
  sd_synth_fill(sd_synth_key("raw", 0), 0, (size_t)qd * bufsize, bufs);
  /* Direct I/O needs whole blocks; round up to the buffer size. */
  bytes = (bytes + bufsize - 1) / bufsize * bufsize;
  out->direct = 1;
  if (attempt(path, bytes, qd, bufsize, bufs, out) == -EINVAL) {
    out->direct = 0;
    out->fixed_bufs = 0;
    attempt(path, bytes, qd, bufsize, bufs, out);
    if (out->ok)
      sd_e2e_fmt(out->note, sizeof out->note, "O_DIRECT write refused (EINVAL): buffered writes");
  }
  free(bufs);
}

/* Staging buffers for O_DIRECT writes (allocated on demand, registered with the ring), fixed-file slots, and the SIGBUS guard for shared-memory copies. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "log.h"
#include "staging.h"

#define SD_FILE_SLOTS 256u

/* ------------------------------------------------------------------------ *
 * The pool
 * ------------------------------------------------------------------------ */
int sd_staging_init(sd_staging *s, struct io_uring *ring, uint64_t bytes, uint32_t chunk_bytes,
                    sd_error *err) {
  memset(s, 0, sizeof *s);
  s->ring = ring;
  s->chunk_bytes = (uint32_t)sd_align_up(chunk_bytes ? chunk_bytes : SD_DIO_ALIGN);
  uint64_t n = bytes / s->chunk_bytes;
  /* Two at least: one being filled while the other is written. */
  if (n < 2) n = 2;
  if (n > 65536) n = 65536;
  s->max = (unsigned)n;
  s->chunks = calloc(s->max, sizeof *s->chunks);
  s->slot_free = calloc(SD_FILE_SLOTS, sizeof *s->slot_free);
  if (!s->chunks || !s->slot_free) {
    free(s->chunks);
    free(s->slot_free);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "staging table");
  }
  for (unsigned i = 0; i < s->max; i++) s->chunks[i].buf_index = -1;
  /* Sparse tables let buffers and files come and go with the load; a
   * kernel without them still gets plain writes through plain fds. */
  s->sparse = io_uring_register_buffers_sparse(ring, s->max + SD_PIN_SLOTS) == 0;
  if (s->sparse) s->pin_used = calloc(SD_PIN_SLOTS, 1);
  else s->sparse = io_uring_register_buffers_sparse(ring, s->max) == 0;
  if (io_uring_register_files_sparse(ring, SD_FILE_SLOTS) == 0) {
    s->nslots = SD_FILE_SLOTS;
    for (unsigned i = 0; i < SD_FILE_SLOTS; i++) s->slot_free[i] = SD_FILE_SLOTS - 1 - i;
    s->nslot_free = SD_FILE_SLOTS;
  }
  return 0;
}

static int chunk_alloc(sd_staging *s, sd_chunk *c, unsigned idx) {
  /* mmap rather than malloc: page aligned, and munmap gives it back to the
   * system at once when the daemon goes quiet. */
  void *p = mmap(NULL, s->chunk_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return -1;
  /* Huge pages where the system allows them: a chunk is faulted in, zeroed and pinned for the ring
   * 512 pages at a time, which is most of what a trimmed staging costs a save to get back. Not while
   * clients' segments are pinned: registering a huge page makes the kernel compare it with every page
   * of every registered buffer (io_uring's memlock accounting), which measured far dearer. */
  if (!s->pinned) madvise(p, s->chunk_bytes, MADV_HUGEPAGE);
  c->buf = p;
  c->cap = s->chunk_bytes;
  c->buf_index = -1;
  if (s->sparse && !s->reg_failed) {
    struct iovec iov = {p, s->chunk_bytes};
    int rc = io_uring_register_buffers_update_tag(s->ring, idx, &iov, NULL, 1);
    if (rc == 1) {
      c->buf_index = (int)idx;
    } else {
      /* Pinning counts against RLIMIT_MEMLOCK for unprivileged daemons:
       * carry on with plain writes from the same aligned buffers. */
      s->reg_failed = 1;
      sd_log_warn("writer: cannot register staging buffers with io_uring (%s; raise "
                  "LimitMEMLOCK/ulimit -l above the staging size): using unregistered buffers",
                  strerror(rc < 0 ? -rc : EINVAL));
    }
  }
  if (++s->live > s->peak) s->peak = s->live;
  return 0;
}

static void chunk_release(sd_staging *s, sd_chunk *c, unsigned idx) {
  if (c->buf_index >= 0) {
    struct iovec iov = {NULL, 0};
    io_uring_register_buffers_update_tag(s->ring, idx, &iov, NULL, 1);
  }
  munmap(c->buf, c->cap);
  c->buf = NULL;
  c->buf_index = -1;
  s->live--;
}

void sd_staging_prefill(sd_staging *s) {
  for (unsigned i = 0; i < s->max; i++) {
    sd_chunk *c = &s->chunks[i];
    if (c->buf || chunk_alloc(s, c, i) != 0) continue;
    if (c->buf_index < 0) memset(c->buf, 0, c->cap); /* registering faulted the pages in; fault them here otherwise */
    c->next = s->free;
    s->free = c;
  }
}

sd_chunk *sd_staging_get(sd_staging *s) {
  sd_chunk *c = s->free;
  if (c) {
    s->free = c->next;
  } else {
    if (s->live == s->max) return NULL;
    unsigned i = 0;
    while (i < s->max && s->chunks[i].buf) i++;
    if (i == s->max || chunk_alloc(s, &s->chunks[i], i) != 0) return NULL;
    c = &s->chunks[i];
  }
  s->busy++;
  c->next = NULL;
  c->job = NULL;
  c->done = 0;
  c->fault = 0;
  c->src_bytes = 0;
  c->src_sealed = 0;
  return c;
}

void sd_staging_put(sd_staging *s, sd_chunk *c) {
  c->job = NULL;
  c->next = s->free;
  s->free = c;
  s->busy--;
}

void sd_staging_trim(sd_staging *s) {
  while (s->free) {
    sd_chunk *c = s->free;
    s->free = c->next;
    chunk_release(s, c, (unsigned)(c - s->chunks));
  }
}

void sd_staging_free(sd_staging *s) {
  for (unsigned i = 0; i < s->max; i++)
    if (s->chunks[i].buf) chunk_release(s, &s->chunks[i], i);
  free(s->chunks);
  free(s->slot_free);
  free(s->pin_used);
  memset(s, 0, sizeof *s);
}

uint64_t sd_staging_bytes(const sd_staging *s) {
  return (uint64_t)s->live * s->chunk_bytes;
}

int sd_staging_file_slot(sd_staging *s, int fd) {
  if (s->nslot_free == 0) return -1;
  unsigned slot = s->slot_free[s->nslot_free - 1];
  if (io_uring_register_files_update(s->ring, slot, &fd, 1) != 1) return -1;
  s->nslot_free--;
  return (int)slot;
}

void sd_staging_file_unslot(sd_staging *s, int slot) {
  if (slot < 0 || (unsigned)slot >= s->nslots) return;
  int none = -1;
  io_uring_register_files_update(s->ring, (unsigned)slot, &none, 1);
  s->slot_free[s->nslot_free++] = (unsigned)slot;
}

/* ------------------------------------------------------------------------ *
 * The SIGBUS guard
 * ------------------------------------------------------------------------ */
_Thread_local sigjmp_buf *volatile sd_bus_guard;

static struct sigaction prev_bus;
static pthread_once_t bus_once = PTHREAD_ONCE_INIT;

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
  sigjmp_buf *jb = sd_bus_guard;
  if (jb) {
    sd_bus_guard = NULL;
    siglongjmp(*jb, 1);
  }
  /* Not a guarded copy: whatever handled SIGBUS before us, else the
   * default action once the faulting instruction runs again. */
  if ((prev_bus.sa_flags & SA_SIGINFO) && prev_bus.sa_sigaction) {
    prev_bus.sa_sigaction(sig, si, uc);
  } else if (prev_bus.sa_handler != SIG_DFL && prev_bus.sa_handler != SIG_IGN) {
    prev_bus.sa_handler(sig);
  } else {
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGBUS, &dfl, NULL);
  }
}

static void install_once(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &prev_bus);
}

void sd_bus_guard_install(void) {
  pthread_once(&bus_once, install_once);
  /* A synchronous SIGBUS that is blocked kills the process outright. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGBUS);
  pthread_sigmask(SIG_UNBLOCK, &set, NULL);
}

/* ------------------------------------------------------------------------ *
 * Pinned segments
 * ------------------------------------------------------------------------ */
/* Empties the n pin slots from `first` on (pin slots count after the chunks' slots). */
static void unregister_slots(sd_staging *s, unsigned first, unsigned n) {
  struct iovec none[64] = {{0}};
  for (unsigned i = 0; i < n; i += 64)
    io_uring_register_buffers_update_tag(s->ring, s->max + first + i, none, NULL, n - i < 64 ? n - i : 64);
}

int sd_staging_pin_begin(sd_staging *s, uint8_t *base, uint64_t len, sd_pin_job *j) {
  if (!s->pin_used || len == 0 || s->reg_failed) return -1;
  unsigned n = (unsigned)((len + SD_PIN_PIECE - 1) / SD_PIN_PIECE), first = 0, run = 0;
  for (unsigned i = 0; i < SD_PIN_SLOTS && run < n; i++) {
    run = s->pin_used[i] ? 0 : run + 1;
    if (run == 1) first = i;
  }
  if (run < n) return -1;
  memset(s->pin_used + first, 1, n); /* taken now: another pin running meanwhile picks other slots */
  *j = (sd_pin_job){.base = base, .len = len, .first = first, .n = n};
  return 0;
}

void sd_staging_pin_register(const sd_staging *s, sd_pin_job *j) {
  uint64_t span = sd_align_up(j->len); /* the mapping's whole pages */
  if (mprotect(j->base, span, PROT_READ | PROT_WRITE) != 0) {
    j->rc = -errno;
    return;
  }
  struct iovec iov[64];
  int rc = 0;
  while (j->done < j->n && rc >= 0) {
    unsigned k = 0;
    for (; k < 64 && j->done + k < j->n; k++) {
      uint64_t at = (uint64_t)(j->done + k) * SD_PIN_PIECE;
      iov[k] = (struct iovec){j->base + at, (size_t)(j->len - at < SD_PIN_PIECE ? j->len - at : SD_PIN_PIECE)};
    }
    rc = io_uring_register_buffers_update_tag(s->ring, s->max + j->first + j->done, iov, NULL, k);
    if (rc >= 0) j->done += k;
  }
  mprotect(j->base, span, PROT_READ); /* pinned pages stay registered: nothing writes through the mapping */
  j->rc = rc < 0 ? rc : 0;
}

int sd_staging_pin_end(sd_staging *s, sd_pin_job *j, int keep) {
  if (j->rc < 0 || !keep) {
    unregister_slots(s, j->first, j->done);
    memset(s->pin_used + j->first, 0, j->n);
    if (j->rc < 0 && !s->pin_failed) {
      sd_log_info("writer: cannot pin a %llu-byte client segment for fixed-buffer writes (%s; raise "
                  "LimitMEMLOCK/ulimit -l): its zero-copy writes pin their pages one write at a time",
                  (unsigned long long)j->len, strerror(-j->rc));
      s->pin_failed = 1;
    }
    return 0;
  }
  s->pinned += j->len;
  sd_log_debug("writer: pinned a %llu-byte client segment in buffer slots %u..%u", (unsigned long long)j->len,
               s->max + j->first, s->max + j->first + j->n - 1);
  return (int)(s->max + j->first) + 1;
}

void sd_staging_unpin(sd_staging *s, int pin, uint64_t len) {
  if (!pin || !s->pin_used) return;
  unsigned first = (unsigned)(pin - 1) - s->max, n = (unsigned)((len + SD_PIN_PIECE - 1) / SD_PIN_PIECE);
  unregister_slots(s, first, n);
  memset(s->pin_used + first, 0, n);
  s->pinned -= len;
}

void sd_shared_drop(const uint8_t *p, uint64_t len) {
  if (len == 0) return;
  static long page;
  if (!page) page = sysconf(_SC_PAGESIZE);
  uintptr_t a = (uintptr_t)p & ~(uintptr_t)(page - 1);
  uintptr_t b = ((uintptr_t)p + len + (uintptr_t)page - 1) & ~(uintptr_t)(page - 1);
  madvise((void *)a, b - a, MADV_DONTNEED);
}

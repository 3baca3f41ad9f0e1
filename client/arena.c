/* libshardd arenas: sealed memfds passed to the daemon (or named POSIX shm), which the trainer fills and the daemon reads. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "client_int.h"
#include "shardd/shardd.h"

static void arena_name(char *buf, size_t n) {
  static unsigned long counter;
  unsigned long k = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
  uint64_t rnd = 0;
  if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd)
    rnd = (uint64_t)sd_client_now_ms() * 0x9E3779B97F4A7C15ull ^ (uintptr_t)buf;
  snprintf(buf, n, "/shardd-%ld-%lu-%016" PRIx64, (long)getpid(), k, rnd);
}

/* SHARDD_ARENA=shm: named POSIX shm attached by name (old daemons, tools
 * that open the segment by name); otherwise a sealed memfd. */
static int use_memfd(void) {
  const char *v = getenv("SHARDD_ARENA");
  return !(v && strcmp(v, "shm") == 0);
}

static int size_fd(shardd_client *c, int fd, size_t size, const char *what) {
  while (ftruncate(fd, (off_t)size) < 0) {
    if (errno == EINTR) continue;
    int e = errno;
    /* A memfd past RLIMIT_FSIZE is out of room as much as a full tmpfs is. */
    return sd_client_fail(c, e == EFBIG ? SHARDD_E_NO_SPACE : sd_err_from_errno(e), "cannot size %s to %zu bytes: %s",
                          what, size, strerror(e));
  }
  return 0;
}

#ifdef MADV_POPULATE_WRITE
#define SD_MADV_POPULATE_WRITE MADV_POPULATE_WRITE
#else
#define SD_MADV_POPULATE_WRITE 23 /* Linux 5.14's value; older kernels refuse it (EINVAL) */
#endif

/* The segment's pages allocated at once: 1, or 0 where the file system cannot (the caller then
 * faults them in); -1 (rc set) when the memory is not there, which the pages' first touch would
 * otherwise meet as a SIGBUS. */
static int allocate_pages(shardd_client *c, int fd, size_t size, int *rc) {
  int r;
  while ((r = fallocate(fd, 0, 0, (off_t)size)) < 0 && errno == EINTR) {
  }
  if (r == 0) return 1;
  if (errno != ENOSPC && errno != ENOMEM) return 0;
  *rc = sd_client_fail(c, SHARDD_E_NO_SPACE, "cannot allocate the arena's %zu bytes: %s", size, strerror(errno));
  return -1;
}

/* An anonymous memfd sealed against shrinking (F_SEAL_SEAL fixes the seal
 * set): the daemon can map it with no fear of a shrink, and needs no right
 * to any file, since the descriptor itself is the permission. It may grow
 * and stays writable: the trainer fills it. */
static int make_memfd(shardd_client *c, shardd_arena *a, size_t size, int *rc) {
  static unsigned long counter;
  unsigned long k = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
  char mname[48];
  snprintf(mname, sizeof mname, "shardd-%ld-%lu", (long)getpid(), k);
  snprintf(a->name, sizeof a->name, "memfd:%s", mname);
  int fd = memfd_create(mname, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    *rc = sd_client_fail(c, sd_err_from_errno(errno), "memfd_create %s: %s", mname,
                         strerror(errno));
    return -1;
  }
  *rc = size_fd(c, fd, size, a->name);
  if (!*rc && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) < 0)
    *rc = sd_client_fail(c, SHARDD_E_IO, "cannot seal %s: %s", a->name, strerror(errno));
  if (*rc) {
    close(fd);
    return -1;
  }
  return fd;
}

static int make_shm(shardd_client *c, shardd_arena *a, size_t size, int *rc) {
  int fd = -1;
  for (int tries = 0; fd < 0 && tries < 8; tries++) {
    arena_name(a->name, sizeof a->name);
    fd = shm_open(a->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    *rc = sd_client_fail(c, SHARDD_E_IO, "shm_open %s: %s", a->name, strerror(errno));
    return -1;
  }
  char what[80];
  snprintf(what, sizeof what, "shm %s", a->name);
  *rc = size_fd(c, fd, size, what);
  if (*rc) {
    close(fd);
    shm_unlink(a->name);
    return -1;
  }
  return fd;
}

static int arena_create(shardd_client *c, size_t size, shardd_arena **out, int memfd) {
  if (!c) return SHARDD_E_INVALID_ARGUMENT;
  if (!out) return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "arena_create: out is NULL");
  *out = NULL;
  if (size == 0) return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "arena size must be at least 1 byte");
  if ((uint64_t)size > (uint64_t)INT64_MAX)
    return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "arena size %zu is too large", size);
  int rc = sd_client_conn_check(c);
  if (rc) return rc;
  shardd_arena *a = calloc(1, sizeof *a);
  if (!a) return sd_client_fail(c, SHARDD_E_NO_MEMORY, "cannot allocate the arena");

  a->memfd = memfd;
  int fd = a->memfd ? make_memfd(c, a, size, &rc) : make_shm(c, a, size, &rc);
  if (fd < 0) {
    free(a);
    return rc;
  }
  int e;
  /* Allocating the pages now keeps that cost out of the first save's copies: in one call
   * (fallocate) rather than a fault per page, then mapped writable in one more. */
  int bulk = allocate_pages(c, fd, size, &rc);
  if (bulk < 0) {
    close(fd);
    if (!a->memfd) shm_unlink(a->name);
    free(a);
    return rc;
  }
  a->base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | (bulk ? 0 : MAP_POPULATE), fd, 0);
  e = errno;
  if (a->base == MAP_FAILED) {
    close(fd);
    if (!a->memfd) shm_unlink(a->name);
    rc = sd_client_fail(c, sd_err_from_errno(e), "mmap %s (%zu bytes): %s",
               a->name, size, strerror(e));
    free(a);
    return rc;
  }
  a->size = size;
  /* MAP_POPULATE on a shared mapping only read-faults: the first store to
   * each page still takes a write fault (about 6 us a page on a VM, more
   * than the copy itself). MADV_POPULATE_WRITE (Linux 5.14) maps every page
   * writable in one call; else one store per page here moves that cost out of
   * the save, where the trainer is blocked, into this one-time setup. */
  if (!bulk || madvise(a->base, size, SD_MADV_POPULATE_WRITE) != 0) {
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) page = 4096;
    for (size_t off = 0; off < size; off += (size_t)page) ((volatile char *)a->base)[off] = 0;
  }

  json_t *r = NULL;
  if (a->memfd)
    rc = sd_client_request_fd(c, json_pack("{s:s, s:b}", "op", "attach", "fd", 1), fd, &r);
  else
    rc = sd_client_request(c, json_pack("{s:s, s:s}", "op", "attach", "shm", a->name), &r);
  close(fd); /* the daemon has its own now; the mapping keeps the memory */
  if (!rc) {
    json_t *reg = json_object_get(r, "region");
    if (!json_is_integer(reg))
      rc = sd_client_fail(c, SHARDD_E_PROTOCOL, "attach reply has no integer 'region'");
    else
      a->region = json_integer_value(reg);
    json_decref(r);
  }
  if (rc) {
    munmap(a->base, size);
    if (!a->memfd) shm_unlink(a->name);
    free(a);
    return rc;
  }
  a->c = c;
  a->next = c->arenas;
  c->arenas = a;
  *out = a;
  return sd_client_ok(c);
}

SHARDD_EXPORT int shardd_arena_create(shardd_client *c, size_t size, shardd_arena **out) {
  int memfd = use_memfd();
  int rc = arena_create(c, size, out, memfd);
  /* A daemon from before descriptor attach asks for the name it expects. */
  if (memfd && c && rc == SHARDD_E_INVALID_ARGUMENT && strstr(c->err, "missing field 'shm'"))
    rc = arena_create(c, size, out, 0);
  return rc;
}

SHARDD_EXPORT void *shardd_arena_data(shardd_arena *a) { return a ? a->base : NULL; }
SHARDD_EXPORT size_t shardd_arena_size(const shardd_arena *a) { return a ? a->size : 0; }
SHARDD_EXPORT const char *shardd_arena_name(const shardd_arena *a) { return a ? a->name : ""; }

SHARDD_EXPORT int shardd_arena_destroy(shardd_arena *a) {
  if (!a) return 0;
  int rc = 0;
  shardd_client *c = a->c;
  if (c) {
    for (shardd_arena **p = &c->arenas; *p; p = &(*p)->next) {
      if (*p == a) {
        *p = a->next;
        break;
      }
    }
    if (c->fd >= 0)
      rc = sd_client_request(c, json_pack("{s:s, s:I}", "op", "detach", "region", (json_int_t)a->region), NULL);
    else
      sd_client_ok(c);
  }
  munmap(a->base, a->size);
  if (!a->memfd) shm_unlink(a->name);
  free(a);
  return rc;
}

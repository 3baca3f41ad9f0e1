/* Shared-memory regions: client shm segments (named, or sealed memfds passed over the socket) mapped read-only and refcounted. */
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "region.h"
#include "sd_grow.h"

static uint64_t live;

uint64_t sd_region_live(void) { return live; }

static int name_check(const char *name, sd_error *err) {
  size_t n = strlen(name);
  if (n < 2 || name[0] != '/' || n > SD_SHM_NAME_MAX || strchr(name + 1, '/'))
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "field 'shm' must be a POSIX shm name like '/x' (one leading '/', no other, "
                   "at most %d bytes), got '%.300s'", SD_SHM_NAME_MAX, name);
  return 0;
}

int sd_region_may_attach(const sd_region_peer *p, uid_t owner_uid, gid_t owner_gid) {
  if (owner_uid == p->uid) return 1;
  if (p->trusted_gid < 0 || (long)owner_gid != p->trusted_gid) return 0;
  if (p->gid == owner_gid) return 1;
  for (size_t i = 0; i < p->ngroups; i++)
    if (p->groups[i] == owner_gid) return 1;
  return 0;
}

int sd_region_check(const sd_region *r, sd_error *err) {
  if (r->sealed) return 0;
  struct stat st;
  if (fstat(r->fd, &st) != 0)
    return sd_fail(err, SHARDD_E_IO, "cannot stat shm '%s': %s", r->name, strerror(errno));
  if ((uint64_t)st.st_size < r->size)
    return sd_fail(err, SHARDD_E_OUT_OF_RANGE,
                   "shm '%s' shrank from %llu to %llu bytes after it was attached", r->name,
                   (unsigned long long)r->size, (unsigned long long)st.st_size);
  return 0;
}

/* Maps fd read-only into a new region (taking over fd on success). */
static int map_fd(int fd, uint64_t size, const char *name, int sealed, sd_region **out, sd_error *err) {
  void *base = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED)
    return sd_fail(err, sd_err_from_errno(errno), "cannot map %s%s%s: %s",
                   sealed ? "" : "shm '", name, sealed ? "" : "'", strerror(errno));
  sd_region *r = calloc(1, sizeof *r);
  if (!r) {
    munmap(base, (size_t)size);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory attaching '%s'", name);
  }
  r->refs = 1;
  r->base = base;
  r->size = size;
  r->fd = fd;
  r->sealed = sealed;
  snprintf(r->name, sizeof r->name, "%s", name);
  live++;
  *out = r;
  return 0;
}

int sd_region_open(const char *name, const sd_region_peer *peer, sd_region **out, sd_error *err) {
  *out = NULL;
  int rc = name_check(name, err);
  if (rc) return rc;
  /* glibc adds O_NOFOLLOW | O_CLOEXEC: a symlink planted in /dev/shm is refused. */
  int fd = shm_open(name, O_RDONLY, 0);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT) return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "no shm segment '%s'", name);
    return sd_fail(err, sd_err_from_errno(e), "cannot open shm '%s': %s", name, strerror(e));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    rc = sd_fail(err, SHARDD_E_IO, "cannot stat shm '%s': %s", name, strerror(errno));
    goto out;
  }
  if (!S_ISREG(st.st_mode)) {
    rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "shm '%s' is not a regular segment", name);
    goto out;
  }
  /* Only the peer's own memory (or its trusted group's): otherwise any
   * local user could make the daemon publish another user's secrets. */
  if (!sd_region_may_attach(peer, st.st_uid, st.st_gid)) {
    rc = sd_fail(err, SHARDD_E_PERMISSION,
                 "shm '%s' is owned by uid %u (group %u), not by the caller (uid %u)%s", name,
                 (unsigned)st.st_uid, (unsigned)st.st_gid, (unsigned)peer->uid,
                 peer->trusted_gid >= 0 ? " nor by a trusted group it belongs to" : "");
    goto out;
  }
  if (st.st_size <= 0) {
    rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "shm '%s' is empty", name);
    goto out;
  }
  rc = map_fd(fd, (uint64_t)st.st_size, name, 0, out, err);
  if (!rc) fd = -1;
out:
  if (fd >= 0) close(fd);
  return rc;
}

/* What /proc says the descriptor is ("/memfd:NAME (deleted)", "pipe:[N]", a
 * path), for the memfd check and the messages; "" when /proc is not there. */
static void fd_link(int fd, char *buf, size_t n) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t k = readlink(path, buf, n - 1);
  buf[k > 0 ? (size_t)k : 0] = '\0';
}

int sd_region_adopt(int fd, sd_region **out, sd_error *err) {
  *out = NULL;
  char link[SD_SHM_NAME_MAX + 64], name[SD_SHM_NAME_MAX + 1];
  fd_link(fd, link, sizeof link);
  int rc = 0;
  /* Only a memfd can carry F_SEAL_SHRINK (a /dev/shm file reports a fixed
   * F_SEAL_SEAL; other files and pipes fail F_GET_SEALS), and /proc names
   * memfds "/memfd:NAME", so a file or pipe is refused either way. */
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (link[0] && strncmp(link, "/memfd:", 7) != 0)) {
    rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                 "attach: the descriptor sent is not a memfd (it is '%.200s'); pass a memfd sealed with "
                 "F_SEAL_SHRINK, or attach POSIX shm by its 'shm' name",
                 link[0] ? link : "not sealable");
    goto out;
  }
  if (link[0]) {
    char *del = strstr(link, " (deleted)");
    if (del) *del = '\0';
    snprintf(name, sizeof name, "memfd:%.200s", link + 7);
  } else {
    snprintf(name, sizeof name, "memfd");
  }
  if (!(seals & F_SEAL_SHRINK)) {
    rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                 "attach: %s is not sealed against shrinking (F_SEAL_SHRINK); seal it with fcntl(F_ADD_SEALS) "
                 "before passing it",
                 name);
    goto out;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    rc = sd_fail(err, SHARDD_E_IO, "cannot stat %s: %s", name, strerror(errno));
    goto out;
  }
  if (!S_ISREG(st.st_mode) || st.st_size <= 0) {
    rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "attach: %s is %s", name,
                 S_ISREG(st.st_mode) ? "empty" : "not a regular memfd");
    goto out;
  }
  /* A hugetlbfs memfd can fault with SIGBUS when the huge page pool runs dry,
   * seal or not: it keeps the defences of a named segment. */
  struct statfs sfs;
  int sealed = !(fstatfs(fd, &sfs) == 0 && (unsigned long)sfs.f_type == (unsigned long)HUGETLBFS_MAGIC);
  rc = map_fd(fd, (uint64_t)st.st_size, name, sealed, out, err);
  if (!rc) fd = -1;
out:
  if (fd >= 0) close(fd);
  return rc;
}

void sd_region_ref(sd_region *r) { r->refs++; }

void sd_region_unref(sd_region *r) {
  if (!r || --r->refs > 0) return;
  if (r->pin && r->unpin) r->unpin(r->unpin_ctx, r->pin, r->size);
  munmap((void *)r->base, (size_t)r->size);
  if (r->fd >= 0) close(r->fd);
  live--;
  free(r);
}

/* ------------------------------------------------------------------------ *
 * Per-connection table
 * ------------------------------------------------------------------------ */
int sd_region_table_add(sd_region_table *t, sd_region *r, uint32_t *id, sd_error *err) {
  if (SD_GROW(t->v, t->cap, t->n + 1, 8))
    return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory attaching '%s'", r->name);
  if (t->next_id == UINT32_MAX)
    return sd_fail(err, SHARDD_E_LIMIT, "this connection has used up its region ids");
  *id = ++t->next_id;
  t->v[t->n].id = *id;
  t->v[t->n].r = r;
  t->n++;
  return 0;
}

sd_region *sd_region_table_get(const sd_region_table *t, uint64_t id) {
  for (size_t i = 0; i < t->n; i++)
    if (t->v[i].id == id) return t->v[i].r;
  return NULL;
}

int sd_region_table_remove(sd_region_table *t, uint64_t id, sd_error *err) {
  for (size_t i = 0; i < t->n; i++) {
    if (t->v[i].id != id) continue;
    sd_region_unref(t->v[i].r);
    t->v[i] = t->v[--t->n];
    return 0;
  }
  return sd_fail(err, SHARDD_E_NO_SUCH_REGION, "no region %llu on this connection",
                 (unsigned long long)id);
}

void sd_region_table_clear(sd_region_table *t) {
  for (size_t i = 0; i < t->n; i++) sd_region_unref(t->v[i].r);
  free(t->v);
  memset(t, 0, sizeof *t);
}

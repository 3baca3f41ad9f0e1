/* One daemon per root, one per node name: POSIX record locks on ROOT/.shardd-lock, whose holders' pids the kernel tells. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rootlock.h"

/* Byte 0 stands for the root; a node name for one byte far past it, at a
 * 40-bit hash of the name (two names of one cluster meet by chance with a
 * probability near 2^-40). Record locks, unlike flock, name their holder's
 * pid (F_GETLK) and work over NFS, where roots are shared. */
static off_t node_byte(const char *node) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (const unsigned char *p = (const unsigned char *)node; *p; p++) h = (h ^ *p) * 1099511628211ull;
  return (off_t)(1 + (h & ((1ull << 40) - 1)));
}

/* 0 when taken; else the holder's pid (-1 if the kernel does not say) and errno in *e. */
static int take(int fd, short type, off_t at, pid_t *holder, int *e) {
  struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = at, .l_len = 1};
  if (fcntl(fd, F_SETLK, &fl) == 0) return 0;
  *e = errno;
  if (*e != EAGAIN && *e != EACCES) return -1;
  struct flock q = {.l_type = type, .l_whence = SEEK_SET, .l_start = at, .l_len = 1};
  *holder = fcntl(fd, F_GETLK, &q) == 0 && q.l_type != F_UNLCK ? q.l_pid : -1;
  return -1;
}

int sd_root_lock(int root_fd, const char *root_path, const char *node, int *lock_fd, sd_error *err) {
  *lock_fd = -1;
  /* O_NONBLOCK and the fstat: whatever was planted under the name, opening it must not wait. */
  int fd = openat(root_fd, SD_LOCK_NAME, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0)
    return sd_fail(err, sd_err_from_errno(errno), "root '%s': cannot open %s to hold the root: %s", root_path,
                   SD_LOCK_NAME, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return sd_fail(err, SHARDD_E_BAD_PATH, "root '%s': %s is not a regular file", root_path, SD_LOCK_NAME);
  }
  pid_t holder = -1;
  int e = 0;
  if (take(fd, node ? F_RDLCK : F_WRLCK, 0, &holder, &e) != 0) {
    close(fd);
    if (e != EAGAIN && e != EACCES)
      return sd_fail(err, sd_err_from_errno(e), "root '%s': cannot lock %s: %s", root_path, SD_LOCK_NAME, strerror(e));
    if (node)
      return sd_fail(err, SHARDD_E_CONFLICT,
                     "root '%s' is held by a single-node shardd (pid %d): daemons with peers share a root only with "
                     "each other",
                     root_path, (int)holder);
    return sd_fail(err, SHARDD_E_CONFLICT,
                   "root '%s' is held by another shardd (pid %d): one daemon per root; stop it, or give this one "
                   "another root",
                   root_path, (int)holder);
  }
  if (node && take(fd, F_WRLCK, node_byte(node), &holder, &e) != 0) {
    close(fd);
    if (e != EAGAIN && e != EACCES)
      return sd_fail(err, sd_err_from_errno(e), "root '%s': cannot lock %s: %s", root_path, SD_LOCK_NAME, strerror(e));
    return sd_fail(err, SHARDD_E_CONFLICT,
                   "node name '%s' is held on root '%s' by another shardd (pid %d): each daemon sharing a root needs "
                   "its own node_name",
                   node, root_path, (int)holder);
  }
  *lock_fd = fd;
  return 0;
}

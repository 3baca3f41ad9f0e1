/* Checkpoint ownership on disk: an xattr on the published folder; the checkpoint's files stay as they are. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "owner.h"
#include "pathsafe.h"

int sd_owner_record(int dirfd, uid_t uid) {
  char v[16];
  int n = snprintf(v, sizeof v, "%u", (unsigned)uid);
  if (fsetxattr(dirfd, SD_OWNER_XATTR, v, (size_t)n, 0) == 0) return 0;
  int e = errno;
  /* Only root may write trusted.*; it is the fallback where user.* is refused. */
  if (geteuid() == 0 && fsetxattr(dirfd, SD_OWNER_XATTR_TRUSTED, v, (size_t)n, 0) == 0) return 0;
  return -e;
}

static int read_one(int dirfd, const char *name, uid_t *uid) {
  char v[16];
  ssize_t n = fgetxattr(dirfd, name, v, sizeof v - 1);
  if (n < 0) return errno == ENODATA || errno == ENOTSUP || errno == EPERM ? 0 : -errno;
  v[n] = 0;
  char *end = NULL;
  unsigned long u = strtoul(v, &end, 10);
  if (n == 0 || *end || u > (uid_t)-1) return -EINVAL;
  *uid = (uid_t)u;
  return 1;
}

int sd_owner_read(int dirfd, uid_t *uid) {
  int rc = read_one(dirfd, SD_OWNER_XATTR, uid);
  if (rc != 0) return rc;
  return read_one(dirfd, SD_OWNER_XATTR_TRUSTED, uid);
}

int sd_owner_of(int root_fd, const char *rel, int *found, uid_t *uid, sd_error *err) {
  *found = 0;
  /* Not O_DIRECTORY: a plain file in the way has no owner either; O_NONBLOCK: a FIFO must not hang us. */
  int fd = sd_openat_beneath(root_fd, rel, O_RDONLY | O_NONBLOCK | O_CLOEXEC, 0);
  if (fd < 0)
    return sd_fail(err, -fd == ELOOP || -fd == EXDEV ? SHARDD_E_BAD_PATH : SHARDD_E_IO,
                   "cannot open '%s' to read its owner: %s", rel, strerror(-fd));
  int rc = sd_owner_read(fd, uid);
  close(fd);
  if (rc < 0) return sd_fail(err, SHARDD_E_IO, "cannot read the owner of '%s': %s", rel, strerror(-rc));
  *found = rc;
  return 0;
}

/* Resolves, creates and removes paths beneath the daemon's root without ever following a symlink. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "pathsafe.h"

/* ------------------------------------------------------------------------ *
 * Checks on names (pure)
 * ------------------------------------------------------------------------ */
/* Control characters make names that listings and logs show wrongly (or
 * that rewrite a log line): refused everywhere a client names a path. */
static int find_control(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] == 0x7F) return (int)i;
  return -1;
}

int sd_path_check_rel(const char *rel, sd_error *err) {
  if (!rel || !rel[0]) return sd_fail(err, SHARDD_E_BAD_PATH, "dir is empty");
  size_t len = strnlen(rel, SD_REL_PATH_MAX + 1);
  if (len > SD_REL_PATH_MAX)
    return sd_fail(err, SHARDD_E_BAD_PATH, "dir is longer than %d bytes", SD_REL_PATH_MAX);
  if (rel[0] == '/')
    return sd_fail(err, SHARDD_E_BAD_PATH, "dir '%s' is absolute; it must be relative to the root",
                   rel);
  int ctl = find_control(rel, len);
  if (ctl >= 0)
    return sd_fail(err, SHARDD_E_BAD_PATH, "dir has control character 0x%02x at byte %d",
                   (unsigned char)rel[ctl], ctl);
  const char *p = rel;
  while (1) {
    const char *end = strchr(p, '/');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n == 0)
      return sd_fail(err, SHARDD_E_BAD_PATH, "dir '%s' has an empty part", rel);
    if ((n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
      return sd_fail(err, SHARDD_E_BAD_PATH, "dir '%s' has a '%.*s' part", rel, (int)n, p);
    if (n > NAME_MAX)
      return sd_fail(err, SHARDD_E_BAD_PATH, "dir '%s' has a part longer than %d bytes", rel,
                     NAME_MAX);
    /* A restarted daemon deletes such folders as leftovers of a crash. */
    if (n >= sizeof SD_TMP_PREFIX - 1 && !strncmp(p, SD_TMP_PREFIX, sizeof SD_TMP_PREFIX - 1))
      return sd_fail(err, SHARDD_E_BAD_PATH, "dir '%s' has a part starting with '%s', which is reserved",
                     rel, SD_TMP_PREFIX);
    if (n >= sizeof SD_DEL_PREFIX - 1 && !strncmp(p, SD_DEL_PREFIX, sizeof SD_DEL_PREFIX - 1))
      return sd_fail(err, SHARDD_E_BAD_PATH, "dir '%s' has a part starting with '%s', which is reserved",
                     rel, SD_DEL_PREFIX);
    /* The root's lock file (rootlock.h). */
    if (n >= sizeof SD_LOCK_PREFIX - 1 && !strncmp(p, SD_LOCK_PREFIX, sizeof SD_LOCK_PREFIX - 1))
      return sd_fail(err, SHARDD_E_BAD_PATH, "dir '%s' has a part starting with '%s', which is reserved",
                     rel, SD_LOCK_PREFIX);
    if (!end) break;
    p = end + 1;
  }
  return 0;
}

int sd_path_check_name(const char *name, sd_error *err) {
  if (!name || !name[0]) return sd_fail(err, SHARDD_E_BAD_PATH, "file name is empty");
  size_t len = strnlen(name, NAME_MAX + 1);
  if (len > NAME_MAX)
    return sd_fail(err, SHARDD_E_BAD_PATH, "file name is longer than %d bytes", NAME_MAX);
  if (strchr(name, '/'))
    return sd_fail(err, SHARDD_E_BAD_PATH, "file name '%s' contains '/'", name);
  int ctl = find_control(name, len);
  if (ctl >= 0)
    return sd_fail(err, SHARDD_E_BAD_PATH, "file name has control character 0x%02x at byte %d",
                   (unsigned char)name[ctl], ctl);
  if (!strcmp(name, ".") || !strcmp(name, ".."))
    return sd_fail(err, SHARDD_E_BAD_PATH, "file name '%s' is not a plain name", name);
  return 0;
}

/* ------------------------------------------------------------------------ *
 * Resolution beneath the root
 * ------------------------------------------------------------------------ */
/* Without openat2 (kernels before 5.6, valgrind before 3.20): the same rules
 * one part at a time, each opened with O_NOFOLLOW beneath the last, so no
 * symlink is ever followed and no ".." or absolute path is taken. */
static int openat_walk(int dirfd, const char *path, int flags, unsigned mode) {
  if (path[0] == '/') return -EXDEV;
  int cur = dirfd, rc = 0;
  const char *p = path;
  char part[NAME_MAX + 1];
  for (;;) {
    const char *end = strchr(p, '/');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    while (end && end[1] == '/') end++; /* "a//b" as openat2 reads it */
    if (n > NAME_MAX) {
      rc = -ENAMETOOLONG;
      break;
    }
    memcpy(part, p, n);
    part[n] = '\0';
    if (!strcmp(part, "..")) {
      rc = -EXDEV;
      break;
    }
    if (!n) memcpy(part, ".", 2);
    int last = !end || !end[1];
    int f = last ? flags : O_PATH | O_DIRECTORY;
    int fd = openat(cur, part, f | O_NOFOLLOW | O_CLOEXEC, (flags & O_CREAT) ? mode : 0);
    if (fd < 0) {
      rc = -errno;
      struct stat st;
      if (rc == -ENOTDIR && fstatat(cur, part, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) rc = -ELOOP;
      break;
    }
    /* O_PATH | O_NOFOLLOW opens a symlink itself instead of refusing it */
    struct stat st;
    if ((f & O_PATH) && fstat(fd, &st) == 0 && S_ISLNK(st.st_mode)) {
      close(fd);
      rc = -ELOOP;
      break;
    }
    if (cur != dirfd) close(cur);
    cur = fd;
    if (last) return fd;
    p = end + 1;
  }
  if (cur != dirfd) close(cur);
  return rc;
}

int sd_openat_beneath(int dirfd, const char *path, int flags, unsigned mode) {
  static int no_openat2;
  if (no_openat2) return openat_walk(dirfd, path, flags, mode);
  struct open_how how;
  memset(&how, 0, sizeof how);
  how.flags = (uint64_t)(flags | O_CLOEXEC);
  how.mode = (flags & O_CREAT) ? mode : 0;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS;
  long fd;
  do {
    fd = syscall(SYS_openat2, dirfd, path, &how, sizeof how);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0 && errno == ENOSYS) {
    no_openat2 = 1;
    return openat_walk(dirfd, path, flags, mode);
  }
  return fd < 0 ? -errno : (int)fd;
}

/* Errors every resolution reports the same way: a symlink or an escape. */
static int resolve_fail(sd_error *err, int e, const char *rel) {
  if (e == ELOOP || e == EXDEV)
    return sd_fail(err, SHARDD_E_BAD_PATH, "'%s' goes through a symlink or leaves the root", rel);
  if (e == ENOTDIR)
    return sd_fail(err, SHARDD_E_BAD_PATH, "a part of '%s' is not a folder", rel);
  return sd_fail(err, sd_err_from_errno(e), "'%s': %s", rel, strerror(e));
}

int sd_root_open(const char *root, int *fd, sd_error *err) {
  *fd = -1;
  if (!root || !root[0]) return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "root is empty");
  size_t len = strlen(root);
  if (len >= 4096) return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "root path is too long");
  /* mkdir -p: the root itself is the operator's choice, so a symlink in it is fine. */
  char buf[4096];
  memcpy(buf, root, len + 1);
  for (char *p = buf + 1; ; p++) {
    if (*p == '/' || *p == '\0') {
      char c = *p;
      *p = '\0';
      if (mkdir(buf, 0755) < 0 && errno != EEXIST)
        return sd_fail(err, SHARDD_E_IO, "cannot create root '%s': %s", buf, strerror(errno));
      *p = c;
      if (c == '\0') break;
    }
  }
  int f = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (f < 0) return sd_fail(err, SHARDD_E_IO, "cannot open root '%s': %s", root, strerror(errno));
  *fd = f;
  return 0;
}

int sd_path_exists(int root_fd, const char *rel, int *exists, sd_error *err) {
  *exists = 0;
  int rc = sd_path_check_rel(rel, err);
  if (rc) return rc;
  int fd = sd_openat_beneath(root_fd, rel, O_PATH, 0);
  if (fd >= 0) {
    close(fd);
    *exists = 1;
    return 0;
  }
  if (fd == -ENOENT) return 0;
  return resolve_fail(err, -fd, rel);
}

int sd_path_open_parent(int root_fd, const char *rel, int create, int *parent_fd,
                        unsigned *created, const char **base, sd_error *err) {
  *parent_fd = -1;
  *created = 0;
  int rc = sd_path_check_rel(rel, err);
  if (rc) return rc;
  const char *slash = strrchr(rel, '/');
  *base = slash ? slash + 1 : rel;

  int cur = sd_openat_beneath(root_fd, ".", O_RDONLY | O_DIRECTORY, 0);
  if (cur < 0) return resolve_fail(err, -cur, ".");
  char part[NAME_MAX + 1];
  for (const char *p = rel; p < *base; ) {
    const char *end = strchr(p, '/');
    size_t n = (size_t)(end - p);
    memcpy(part, p, n);
    part[n] = '\0';
    int next = sd_openat_beneath(cur, part, O_RDONLY | O_DIRECTORY, 0), made = 0;
    if (next == -ENOENT && create) {
      if (mkdirat(cur, part, 0755) == 0)
        made = 1;
      else if (errno != EEXIST)
        next = -errno;
      *created += (unsigned)made;
      if (next == -ENOENT) next = sd_openat_beneath(cur, part, O_RDONLY | O_DIRECTORY, 0);
      /* The new entry must survive a crash as much as the checkpoint below it. */
      if (made && next >= 0 && fsync(cur) < 0) {
        close(next);
        next = -errno;
      }
    }
    close(cur);
    if (next < 0) {
      /* Take back what this call made: the `created` deepest folders of
       * rel up to `part` (the "/." stands for the part below them). */
      char upto[SD_REL_PATH_MAX + 3];
      size_t len = (size_t)(end - rel);
      memcpy(upto, rel, len);
      memcpy(upto + len, made ? "/." : "", made ? 3 : 1);
      sd_path_unmake_parents(root_fd, upto, *created);
      *created = 0;
      return resolve_fail(err, -next, rel);
    }
    cur = next;
    p = end + 1;
  }
  *parent_fd = cur;
  return 0;
}

void sd_path_unmake_parents(int root_fd, const char *rel, unsigned created) {
  char buf[SD_REL_PATH_MAX + 3];
  size_t len = strnlen(rel, SD_REL_PATH_MAX + 2);
  memcpy(buf, rel, len);
  buf[len] = '\0';
  for (unsigned i = 0; i < created; i++) {
    char *slash = strrchr(buf, '/');
    if (!slash) return;
    *slash = '\0';
    /* Only empty folders go, so a concurrent save's folder is never touched;
     * the path was resolved beneath the root moments ago by this thread. */
    int pfd = root_fd;
    char *dslash = strrchr(buf, '/');
    const char *leaf = buf;
    if (dslash) {
      *dslash = '\0';
      pfd = sd_openat_beneath(root_fd, buf, O_PATH | O_DIRECTORY, 0);
      *dslash = '/';
      leaf = dslash + 1;
      if (pfd < 0) return;
    }
    int rc = unlinkat(pfd, leaf, AT_REMOVEDIR);
    if (pfd != root_fd) close(pfd);
    if (rc < 0) return;
  }
}

/* ------------------------------------------------------------------------ *
 * Removal and stale-folder cleanup
 * ------------------------------------------------------------------------ */
static int is_dir_entry(int dirfd, const struct dirent *de) {
  if (de->d_type == DT_DIR) return 1;
  if (de->d_type != DT_UNKNOWN) return 0;
  struct stat st;
  if (fstatat(dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) return 0;
  return S_ISDIR(st.st_mode);
}

static int remove_tree_at(int dirfd, const char *name, unsigned depth, sd_error *err) {
  if (unlinkat(dirfd, name, AT_REMOVEDIR) == 0 || errno == ENOENT) return 0;
  if (errno == ENOTDIR) {
    if (unlinkat(dirfd, name, 0) == 0 || errno == ENOENT) return 0;
    return sd_fail(err, SHARDD_E_IO, "cannot remove '%s': %s", name, strerror(errno));
  }
  if (errno != ENOTEMPTY && errno != EEXIST)
    return sd_fail(err, SHARDD_E_IO, "cannot remove '%s': %s", name, strerror(errno));
  if (depth >= SD_WALK_DEPTH_MAX)
    return sd_fail(err, SHARDD_E_LIMIT, "'%s' is nested deeper than %d folders", name,
                   SD_WALK_DEPTH_MAX);
  int fd = sd_openat_beneath(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW, 0);
  if (fd == -ENOENT) return 0; /* removed meanwhile (by a peer daemon sharing the root) */
  if (fd < 0) return sd_fail(err, SHARDD_E_IO, "cannot open '%s': %s", name, strerror(-fd));
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return sd_fail(err, SHARDD_E_IO, "cannot read '%s': %s", name, strerror(errno));
  }
  int rc = 0;
  struct dirent *de;
  while (rc == 0 && (de = readdir(d))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    if (is_dir_entry(fd, de))
      rc = remove_tree_at(fd, de->d_name, depth + 1, err);
    else if (unlinkat(fd, de->d_name, 0) < 0 && errno != ENOENT)
      rc = sd_fail(err, SHARDD_E_IO, "cannot remove '%s/%s': %s", name, de->d_name,
                   strerror(errno));
  }
  closedir(d);
  if (rc) return rc;
  if (unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
    return sd_fail(err, SHARDD_E_IO, "cannot remove '%s': %s", name, strerror(errno));
  return 0;
}

int sd_path_remove_tree(int dirfd, const char *name, sd_error *err) {
  return remove_tree_at(dirfd, name, 0, err);
}

/* Removes path/name (path: the folder's place under the root, for the log). */
static int remove_logged(int dirfd, const char *path, const char *name, sd_error *err) {
  int rc = sd_path_remove_tree(dirfd, name, err);
  if (!rc) sd_log_info("start-up: removed the stale folder '%s%s%s'", path, *path ? "/" : "", name);
  return rc;
}

/* owner: only folders whose name starts with it (NULL: every temporary folder).
 * path: dirfd's place under the root ("" for the root), grown as it descends. */
static int cleanup_at(int dirfd, unsigned depth, const char *owner, char *path, size_t plen, sd_error *err) {
  int fd = sd_openat_beneath(dirfd, ".", O_RDONLY | O_DIRECTORY, 0);
  if (fd < 0) return sd_fail(err, SHARDD_E_IO, "cannot read a folder under the root: %s",
                             strerror(-fd));
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return sd_fail(err, SHARDD_E_IO, "cannot read a folder under the root: %s", strerror(errno));
  }
  int rc = 0;
  struct dirent *de;
  while (rc == 0 && (de = readdir(d))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    if (!is_dir_entry(fd, de)) continue; /* symlinks included: never followed */
    if (!strncmp(de->d_name, SD_TMP_PREFIX, sizeof SD_TMP_PREFIX - 1)) {
      if (!owner || !strncmp(de->d_name, owner, strlen(owner))) rc = remove_logged(fd, path, de->d_name, err);
    } else if (!strncmp(de->d_name, SD_DEL_PREFIX, sizeof SD_DEL_PREFIX - 1)) {
      /* Renamed away for deletion: nobody's save, on any node; a peer may be removing it too. */
      rc = remove_logged(fd, path, de->d_name, err);
    } else if (depth + 1 < SD_WALK_DEPTH_MAX) {
      size_t nl = strlen(de->d_name);
      if (plen + nl + 2 > SD_WALK_PATH_MAX) continue; /* no checkpoint path is this long */
      int sub = sd_openat_beneath(fd, de->d_name, O_PATH | O_DIRECTORY | O_NOFOLLOW, 0);
      if (sub < 0) continue; /* raced away, or not ours to read */
      size_t sl = plen ? plen + 1 : 0;
      if (plen) path[plen] = '/';
      memcpy(path + sl, de->d_name, nl + 1);
      rc = cleanup_at(sub, depth + 1, owner, path, sl + nl, err);
      path[plen] = '\0';
      close(sub);
    }
  }
  closedir(d);
  return rc;
}

int sd_cleanup_stale(int root_fd, sd_error *err) {
  char path[SD_WALK_PATH_MAX] = "";
  return cleanup_at(root_fd, 0, NULL, path, 0, err);
}

int sd_cleanup_stale_owned(int root_fd, const char *owner_prefix, sd_error *err) {
  char path[SD_WALK_PATH_MAX] = "";
  return cleanup_at(root_fd, 0, owner_prefix, path, 0, err);
}

/* Checkpoint deletion and keep_last: shardd's own folders only, by their owner only, renamed away atomically, removed off the loop. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "owner.h"
#include "pathsafe.h"
#include "retention.h"
#include "sd_grow.h"

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n > k && strcmp(s + n - k, suffix) == 0;
}

/* Every checkpoint shardd writes has a .safetensors file or an index at its top. */
static int has_shardd_file(int dirfd) {
  int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return 0;
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return 0;
  }
  int found = 0;
  struct dirent *de;
  while (!found && (de = readdir(d))) {
    if (de->d_name[0] == '.' ||
        !(ends_with(de->d_name, ".safetensors") || ends_with(de->d_name, ".safetensors.index.json")))
      continue;
    struct stat st;
    found = fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
  }
  closedir(d);
  return found;
}

static int open_fail(sd_error *err, int e, const char *rel) {
  if (e == ENOENT) return sd_fail(err, SHARDD_E_NOT_FOUND, "'%s' does not exist under the root", rel);
  if (e == ENOTDIR)
    return sd_fail(err, SHARDD_E_NOT_CHECKPOINT, "'%s' is not a folder, so not a checkpoint shardd wrote", rel);
  if (e == ELOOP || e == EXDEV)
    return sd_fail(err, SHARDD_E_BAD_PATH, "'%s' goes through a symlink or leaves the root", rel);
  return sd_fail(err, SHARDD_E_IO, "cannot open '%s': %s", rel, strerror(e));
}

/* sd_retention_check on parent_fd/name; rel names it in messages. *id (may be NULL) gets the folder's
 * device and inode, so the rename that follows can tell it moved what was checked. */
static int check_at(int parent_fd, const char *name, const char *rel, uid_t *owner, struct stat *id, sd_error *err) {
  if (!strncmp(name, ".shardd-", 8))
    return sd_fail(err, SHARDD_E_NOT_CHECKPOINT, "'%s' is a temporary folder of shardd, not a checkpoint", rel);
  struct stat st;
  /* O_NOFOLLOW | O_DIRECTORY says ENOTDIR for a symlink: name it for what it is. */
  if (fstatat(parent_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
    return open_fail(err, ELOOP, rel);
  int fd = sd_openat_beneath(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0);
  if (fd < 0) return open_fail(err, -fd, rel);
  uid_t u = 0;
  int rc = 0, orc = 0;
  if (fstat(fd, &st) < 0)
    rc = sd_fail(err, SHARDD_E_IO, "cannot stat '%s': %s", rel, strerror(errno));
  else if (st.st_uid != geteuid())
    /* The daemon creates every checkpoint folder: a user's own folder is theirs to remove, not ours. */
    rc = sd_fail(err, SHARDD_E_NOT_CHECKPOINT, "'%s' belongs to uid %u, not the daemon's uid %u: shardd did not write it",
                 rel, (unsigned)st.st_uid, (unsigned)geteuid());
  else if ((orc = sd_owner_read(fd, &u)) < 0)
    rc = sd_fail(err, SHARDD_E_IO, "cannot read the owner of '%s': %s", rel, strerror(-orc));
  else if (orc == 0)
    rc = sd_fail(err, SHARDD_E_NOT_CHECKPOINT, "'%s' has no recorded owner (%s): shardd did not write it", rel,
                 SD_OWNER_XATTR);
  else if (!has_shardd_file(fd))
    rc = sd_fail(err, SHARDD_E_NOT_CHECKPOINT, "'%s' holds no .safetensors file or index: not a checkpoint", rel);
  close(fd);
  if (!rc) *owner = u;
  if (!rc && id) *id = st;
  return rc;
}

/* The folder holding rel's last part, opened beneath the root; *base points into rel. */
static int open_parent(int root_fd, const char *rel, int *pfd, const char **base, sd_error *err) {
  const char *slash = strrchr(rel, '/');
  *base = slash ? slash + 1 : rel;
  char up[SD_REL_PATH_MAX + 1];
  size_t n = slash ? (size_t)(slash - rel) : 0;
  if (n >= sizeof up) return sd_fail(err, SHARDD_E_BAD_PATH, "'%.200s' is too long", rel);
  memcpy(up, slash ? rel : ".", slash ? n : 1);
  up[slash ? n : 1] = 0;
  int fd = sd_openat_beneath(root_fd, up, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  if (fd < 0) return open_fail(err, -fd, rel);
  *pfd = fd;
  return 0;
}

int sd_retention_check(int root_fd, const char *rel, uid_t *owner, sd_error *err) {
  int rc = sd_path_check_rel(rel, err), pfd = -1;
  const char *base = NULL;
  if (rc || (rc = open_parent(root_fd, rel, &pfd, &base, err))) return rc;
  rc = check_at(pfd, base, rel, owner, NULL, err);
  close(pfd);
  return rc;
}

/* ------------------------------------------------------------------------ *
 * Removal on a worker thread: the names are hidden already, so nothing
 * waits for it; a crash part-way leaves a hidden name start-up removes.
 * ------------------------------------------------------------------------ */
typedef struct {
  uv_work_t req;
  int parent_fd;           /* owned */
  size_t n, failed;
  sd_error err;            /* the first failure */
  char **names;            /* hidden names in parent_fd */
} removal;

static void removal_free(removal *r) {
  for (size_t i = 0; i < r->n; i++) free(r->names[i]);
  free(r->names);
  if (r->parent_fd >= 0) close(r->parent_fd);
  free(r);
}

static void removal_work(uv_work_t *req) {
  removal *r = req->data;
  for (size_t i = 0; i < r->n; i++) {
    sd_error e = {0};
    if (sd_path_remove_tree(r->parent_fd, r->names[i], &e) != 0 && r->failed++ == 0) r->err = e;
  }
}

static void removal_done(uv_work_t *req, int status) {
  removal *r = req->data;
  if (status || r->failed)
    sd_log_warn("removing %zu of %zu deleted checkpoints failed (%s); start-up removes what is left under '%s*'",
                r->failed ? r->failed : r->n, r->n, status ? uv_strerror(status) : r->err.msg, SD_DEL_PREFIX);
  removal_free(r);
}

/* Renames parent_fd/base (checked, as *id) to a fresh hidden name it appends to r. */
static int hide(removal *r, const char *base, const char *rel, const struct stat *id, sd_error *err) {
  uint32_t rnd = 0;
  if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) rnd = (uint32_t)getpid() ^ (uint32_t)(uintptr_t)r;
  char hidden[NAME_MAX + 1];
  /* A shortened name: only a trace for a human reading the folder. */
  snprintf(hidden, sizeof hidden, "%s%.200s-%08x", SD_DEL_PREFIX, base, (unsigned)rnd);
  char *copy = strdup(hidden);
  char **names = copy ? realloc(r->names, (r->n + 1) * sizeof *names) : NULL;
  if (!names) {
    free(copy);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory deleting '%s'", rel);
  }
  r->names = names;
  if (renameat2(r->parent_fd, base, r->parent_fd, hidden, RENAME_NOREPLACE) < 0) {
    int e = errno;
    free(copy);
    return e == ENOENT ? sd_fail(err, SHARDD_E_NOT_FOUND, "'%s' does not exist under the root", rel)
                       : sd_fail(err, SHARDD_E_IO, "cannot rename '%s' away to delete it: %s", rel, strerror(e));
  }
  /* Swapped for another folder since the check (only a writer of the parent could): put it back. */
  struct stat st;
  if (fstatat(r->parent_fd, hidden, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_dev != id->st_dev ||
      st.st_ino != id->st_ino) {
    int back = renameat2(r->parent_fd, hidden, r->parent_fd, base, RENAME_NOREPLACE);
    free(copy);
    return sd_fail(err, SHARDD_E_CONFLICT, "'%s' changed while it was being deleted; %s", rel,
                   back == 0 ? "nothing was deleted" : "it is left under a hidden name");
  }
  r->names[r->n++] = copy;
  return 0;
}

/* The renames must survive a crash before anyone is told they happened. */
static int finish(uv_loop_t *loop, removal *r, const char *what, sd_error *err) {
  if (r->n && fsync(r->parent_fd) < 0)
    sd_fail(err, SHARDD_E_IO, "cannot fsync the folder of %s after renaming it away: %s", what, strerror(errno));
  if (r->n == 0) {
    removal_free(r);
    return err->code;
  }
  r->req.data = r;
  if (uv_queue_work(loop, &r->req, removal_work, removal_done) != 0) {
    removal_work(&r->req); /* cannot happen with a live loop; never leave the names behind */
    removal_done(&r->req, 0);
  }
  return err->code;
}

int sd_retention_delete(uv_loop_t *loop, int root_fd, const char *rel, uid_t uid, sd_error *err) {
  int rc = sd_path_check_rel(rel, err), pfd = -1;
  const char *base = NULL;
  uid_t owner = 0;
  struct stat id;
  if (rc || (rc = open_parent(root_fd, rel, &pfd, &base, err))) return rc;
  if ((rc = check_at(pfd, base, rel, &owner, &id, err)) == 0 && owner != uid)
    rc = sd_fail(err, SHARDD_E_PERMISSION, "'%s' was committed by uid %u; uid %u may not delete it (only its owner may)",
                 rel, (unsigned)owner, (unsigned)uid);
  removal *r = rc ? NULL : calloc(1, sizeof *r);
  if (!rc && !r) rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory deleting '%s'", rel);
  if (rc) {
    close(pfd);
    return rc;
  }
  r->parent_fd = pfd;
  if ((rc = hide(r, base, rel, &id, err)) != 0) {
    removal_free(r);
    return rc;
  }
  char what[SD_REL_PATH_MAX + 8];
  snprintf(what, sizeof what, "'%s'", rel);
  return finish(loop, r, what, err);
}

/* ------------------------------------------------------------------------ *
 * keep_last
 * ------------------------------------------------------------------------ */
typedef struct {
  char *name;
  struct stat st;          /* as checked: identity and ctime */
} candidate;

/* Newest first; equal times by name, newest-sorting name first (step numbers). */
static int by_newest(const void *a, const void *b) {
  const candidate *x = a, *y = b;
  if (x->st.st_ctim.tv_sec != y->st.st_ctim.tv_sec) return x->st.st_ctim.tv_sec < y->st.st_ctim.tv_sec ? 1 : -1;
  if (x->st.st_ctim.tv_nsec != y->st.st_ctim.tv_nsec) return x->st.st_ctim.tv_nsec < y->st.st_ctim.tv_nsec ? 1 : -1;
  return -strcmp(x->name, y->name);
}

/* rel of a sibling of rel (whose last part starts at base) named name. */
static void sibling(char *out, size_t n, const char *rel, const char *base, const char *name) {
  snprintf(out, n, "%.*s%s", (int)(base - rel), rel, name);
}

/* The checkpoints of uid beside rel, except rel itself and busy ones. */
static int collect(int pfd, const char *rel, const char *base, uid_t uid, sd_retention_busy_fn busy, void *ud,
                   candidate **out, size_t *nout, sd_error *err) {
  int fd = openat(pfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d) {
    if (fd >= 0) close(fd);
    return sd_fail(err, SHARDD_E_IO, "cannot read the folder of '%s': %s", rel, strerror(errno));
  }
  candidate *c = NULL;
  size_t n = 0, cap = 0;
  int rc = 0;
  struct dirent *de;
  while (!rc && (de = readdir(d))) {
    char srel[SD_REL_PATH_MAX + NAME_MAX + 2];
    sibling(srel, sizeof srel, rel, base, de->d_name);
    sd_error ignored = {0};
    uid_t owner = 0;
    struct stat st;
    if (de->d_name[0] == '.' || !strcmp(de->d_name, base) || (busy && busy(ud, srel)) ||
        check_at(pfd, de->d_name, srel, &owner, &st, &ignored) != 0 || owner != uid)
      continue;
    if (SD_GROW(c, cap, n + 1, 16)) {
      rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory listing the folder of '%s'", rel);
      break;
    }
    c[n].st = st;
    if (!(c[n].name = strdup(de->d_name))) rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory");
    else n++;
  }
  closedir(d);
  *out = c;
  *nout = n;
  return rc;
}

int sd_retention_keep_last(uv_loop_t *loop, int root_fd, const char *rel, uid_t uid, unsigned n,
                           sd_retention_busy_fn busy, void *ud, sd_error *err) {
  if (n == 0) return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "keep_last must be at least 1");
  int rc = sd_path_check_rel(rel, err), pfd = -1;
  const char *base = NULL;
  if (rc || (rc = open_parent(root_fd, rel, &pfd, &base, err))) return rc;
  candidate *c = NULL;
  size_t nc = 0;
  removal *r = NULL;
  rc = collect(pfd, rel, base, uid, busy, ud, &c, &nc, err);
  /* rel itself is the newest: n - 1 of the others stay. */
  if (!rc && nc >= n && !(r = calloc(1, sizeof *r))) rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory");
  if (r) {
    r->parent_fd = pfd;
    pfd = -1;
    qsort(c, nc, sizeof *c, by_newest);
    for (size_t i = n - 1; i < nc; i++) {
      char srel[SD_REL_PATH_MAX + NAME_MAX + 2];
      sibling(srel, sizeof srel, rel, base, c[i].name);
      sd_error e = {0};
      if (hide(r, c[i].name, srel, &c[i].st, &e) != 0) {
        sd_log_warn("keep_last=%u: cannot delete '%s': %s", n, srel, e.msg);
        if (!rc) rc = sd_fail(err, e.code, "%s", e.msg);
      } else {
        sd_log_info("keep_last=%u: deleted '%s' (uid %u), older than the newest %u beside '%s'", n, srel, (unsigned)uid,
                    n, rel);
      }
    }
  }
  size_t deleted = r ? r->n : 0;
  sd_error ferr = {0};
  if (r && finish(loop, r, "older checkpoints", &ferr) != 0 && !rc) rc = sd_fail(err, ferr.code, "%s", ferr.msg);
  for (size_t i = 0; i < nc; i++) free(c[i].name);
  free(c);
  if (pfd >= 0) close(pfd);
  return rc ? rc : (int)deleted;
}

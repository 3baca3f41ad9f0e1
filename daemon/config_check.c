/* Daemon settings held against the system (groups, listen addresses), and where each one came from, for the messages. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config_check.h"
#include "config_int.h"
#include "peer_auth.h"

void sd_config_flag_name(const sd_config_key *k, char *buf, size_t n) {
  snprintf(buf, n, "%s", k->name);
  for (char *p = buf; *p; p++)
    if (*p == '_') *p = '-';
}

/* Where key k's value came from, for messages: the option, the file line, or the default. */
void sd_config_where(const sd_config *c, const struct sd_config_src *src, const unsigned *lines,
                     const sd_config_key *k, char *buf, size_t n) {
  size_t ki = (size_t)(k - sd_config_keys);
  for (size_t i = src ? src->ncli : 0; i-- > 0;) {
    if (src->cli[i].key == ki) {
      char flag[64];
      sd_config_flag_name(k, flag, sizeof flag);
      snprintf(buf, n, "option --%s", flag);
      return;
    }
  }
  if (lines && lines[ki] && c->config_path)
    snprintf(buf, n, "%s:%u: key '%s'", c->config_path, lines[ki], k->name);
  else
    snprintf(buf, n, "key '%s' (default)", k->name);
}

/* A group key (name or number) to its gid; -1 when empty. */
static int resolve_group(sd_config *c, const unsigned *lines, const char *key, const char *value, long *out,
                         sd_error *err) {
  *out = -1;
  if (!value || !*value) return 0;
  unsigned long long gid = 0;
  const char *end = NULL;
  if (sd_config_digits(value, 10, &gid, &end) == 0 && !*end && gid < (1ULL << 31)) {
    *out = (long)gid;
    return 0;
  }
  struct group gr, *res = NULL;
  char buf[4096];
  if (getgrnam_r(value, &gr, buf, sizeof buf, &res) == 0 && res) {
    *out = (long)res->gr_gid;
    return 0;
  }
  char w[512];
  sd_config_where(c, c->src, lines, sd_config_find_key(key), w, sizeof w);
  return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "%s: no group named '%.100s'", w, value);
}

/* An ADDR:PORT key's shape, so --check-config catches it (binding is at start). */
static int check_addr(sd_config *c, const unsigned *lines, const char *key, const char *value, sd_error *err) {
  char host[256], w[512];
  unsigned port;
  sd_error e = {0};
  if (!*value || sd_peer_addr_split(value, host, sizeof host, &port, &e) == 0) return 0;
  sd_config_where(c, c->src, lines, sd_config_find_key(key), w, sizeof w);
  return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "%s: must be HOST:PORT or [IPV6]:PORT, the port 0 to 65535, got '%.100s'",
                 w, value);
}

int sd_config_check(sd_config *c, const unsigned *lines, sd_error *err) {
  int rc = resolve_group(c, lines, "socket_group", c->socket_group, &c->socket_gid, err);
  if (!rc) rc = resolve_group(c, lines, "trusted_group", c->trusted_group, &c->trusted_gid, err);
  if (!rc) rc = check_addr(c, lines, "peer_listen", c->peer_listen, err);
  return rc ? rc : check_addr(c, lines, "metrics_listen", c->metrics_listen, err);
}

/* The failed step of the root probe, in the operator's words: the root, the daemon's user, the errno. */
static int root_refused(const char *root, const char *step, int e, sd_error *err) {
  struct passwd pw, *res = NULL;
  char buf[1024], user[300];
  uid_t uid = geteuid();
  if (getpwuid_r(uid, &pw, buf, sizeof buf, &res) == 0 && res)
    snprintf(user, sizeof user, "'%.200s' (uid %u)", pw.pw_name, (unsigned)uid);
  else
    snprintf(user, sizeof user, "uid %u", (unsigned)uid);
  return sd_fail(err, e == ENOSPC || e == EDQUOT ? SHARDD_E_NO_SPACE : e == EACCES || e == EPERM || e == EROFS
                                                                          ? SHARDD_E_PERMISSION
                                                                          : SHARDD_E_IO,
                 "root '%s': the daemon's user %s cannot %s there: %s (%s); every save needs to create, "
                 "write, fsync and rename in the root (fix its owner or mode, or choose another root)",
                 root, user, step, strerror(e), strerrorname_np(e) ? strerrorname_np(e) : "?");
}

int sd_config_check_root(const char *root, sd_error *err) {
  /* What every save does, on a folder named like a save's temporary one, so that start-up's
   * clean-up removes it should the daemon die half-way. */
  char dir[128], moved[128];
  snprintf(dir, sizeof dir, ".shardd-tmp-probe-%ld", (long)getpid());
  snprintf(moved, sizeof moved, ".shardd-tmp-probe-%ld-renamed", (long)getpid());
  int rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (rootfd < 0) return root_refused(root, "open the folder", errno, err);
  int rc = 0, fd = -1, e = 0;
  char file[300];
  const char *step = "create a folder";
  if (mkdirat(rootfd, dir, 0700) < 0) {
    e = errno;
    goto out;
  }
  step = "create a file";
  snprintf(file, sizeof file, "%s/probe", dir);
  fd = openat(rootfd, file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    e = errno;
    goto undo;
  }
  step = "write a file";
  if (write(fd, "shardd\n", 7) != 7) {
    e = errno ? errno : ENOSPC;
    goto undo;
  }
  step = "fsync a file";
  if (fsync(fd) < 0) {
    e = errno;
    goto undo;
  }
  step = "rename a folder";
  if (renameat(rootfd, dir, rootfd, moved) < 0) {
    e = errno;
    goto undo;
  }
  snprintf(dir, sizeof dir, "%s", moved);
  snprintf(file, sizeof file, "%s/probe", dir);
  step = "fsync the root";
  if (fsync(rootfd) < 0) e = errno;
undo:
  if (fd >= 0) close(fd);
  unlinkat(rootfd, file, 0);
  unlinkat(rootfd, dir, AT_REMOVEDIR);
out:
  if (e) rc = root_refused(root, step, e, err);
  close(rootfd);
  return rc;
}

/* The Unix socket clients connect to: stale-socket cleanup, configured mode and group, accept into sessions. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <libgen.h>
#include <limits.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "listener.h"
#include "log.h"

static void on_connection(void *ud, int fd) {
  sd_daemon *d = ud;
  d->on_client(d, fd);
}

#define BACKLOG 128

/* A socket file nobody answers on is left over from a crash: remove it.
 * One somebody answers on belongs to a running daemon: refuse to steal it. */
static int clear_stale(const char *path, sd_error *err) {
  struct stat st;
  if (lstat(path, &st) != 0) {
    if (errno == ENOENT) return 0;
    return sd_fail(err, SHARDD_E_IO, "cannot stat socket '%s': %s", path, strerror(errno));
  }
  if (!S_ISSOCK(st.st_mode))
    return sd_fail(err, SHARDD_E_EXISTS, "'%s' exists and is not a socket; not touching it", path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return sd_fail(err, SHARDD_E_IO, "socket: %s", strerror(errno));
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
  int e = errno;
  close(fd);
  if (rc == 0) return sd_fail(err, SHARDD_E_EXISTS, "another daemon is listening on '%s'", path);
  if (e != ECONNREFUSED && e != ENOENT)
    return sd_fail(err, SHARDD_E_IO, "cannot probe socket '%s': %s", path, strerror(e));
  if (unlink(path) != 0 && errno != ENOENT)
    return sd_fail(err, SHARDD_E_IO, "cannot remove stale socket '%s': %s", path, strerror(errno));
  sd_log_info("removed stale socket %s", path);
  return 0;
}

int sd_listener_open(sd_daemon *d, sd_error *err) {
  const char *path = d->cfg->socket_path;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "socket path '%s' is longer than %zu bytes", path,
                   sizeof sa.sun_path - 1);
  char parent[PATH_MAX];
  snprintf(parent, sizeof parent, "%s", path);
  /* The parent (e.g. /run/shardd) may not exist yet on a fresh machine. */
  const char *folder = dirname(parent);
  if (mkdir(folder, 0755) != 0 && errno != EEXIST)
    return sd_fail(err, SHARDD_E_IO,
                   "cannot create '%s', the folder of socket '%s': %s (choose another with --socket, or set"
                   " $SHARDD_SOCKET or $XDG_RUNTIME_DIR)",
                   folder, path, strerror(errno));
  int rc = clear_stale(path, err);
  if (rc) return rc;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return sd_fail(err, SHARDD_E_IO, "socket: %s", strerror(errno));
  /* Bound and listening under a temporary name, then renamed into place:
   * once PATH exists it accepts connections, so clients may poll for it. */
  char tmp[sizeof sa.sun_path];
  if ((size_t)snprintf(tmp, sizeof tmp, "%s.%d", path, (int)getpid()) >= sizeof tmp)
    snprintf(tmp, sizeof tmp, "%s", path);
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", tmp);
  unlink(tmp);
  /* Created with the final mode, so there is no moment a stranger may connect. */
  mode_t mode = (mode_t)(d->cfg->socket_mode & 0777);
  mode_t old = umask(0777 & ~mode);
  rc = bind(fd, (struct sockaddr *)&sa, sizeof sa);
  int e = errno;
  umask(old);
  if (rc != 0) {
    close(fd);
    return sd_fail(err, SHARDD_E_IO, "cannot bind '%s': %s", tmp, strerror(e));
  }
  if (chmod(tmp, mode) != 0) sd_log_warn("cannot chmod %s: %s", tmp, strerror(errno));
  /* The group is set while the socket still has its private name: the
   * group's members can reach it from the moment it appears. */
  if (d->cfg->socket_gid >= 0 && chown(tmp, (uid_t)-1, (gid_t)d->cfg->socket_gid) != 0) {
    e = errno;
    close(fd);
    unlink(tmp);
    return sd_fail(err, SHARDD_E_PERMISSION, "cannot give socket '%s' group %ld: %s", path, d->cfg->socket_gid,
                   strerror(e));
  }
  if (listen(fd, BACKLOG) != 0) {
    e = errno;
    close(fd);
    unlink(tmp);
    return sd_fail(err, SHARDD_E_IO, "cannot listen on '%s': %s", path, strerror(e));
  }
  if ((rc = sd_acceptor_start(&d->server, d->loop, fd, "the client socket", on_connection, d)) != 0) {
    unlink(tmp);
    return sd_fail(err, SHARDD_E_IO, "cannot listen on '%s': %s", path, uv_strerror(rc));
  }
  /* NOREPLACE: a daemon started at the same moment must not lose its socket to us. */
  rc = strcmp(tmp, path) == 0 ? 0 : renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE);
  if (rc != 0 && errno == EINVAL) rc = rename(tmp, path);
  if (rc != 0) {
    e = errno;
    sd_acceptor_stop(&d->server);
    unlink(tmp);
    return sd_fail(err, SHARDD_E_IO, "cannot move the socket to '%s': %s", path, strerror(e));
  }
  d->listening = 1;
  return 0;
}

/* Set when systemd passed the socket: its file belongs to shardd.socket. */
static int adopted;

int sd_listener_adopt(sd_daemon *d, int fd, sd_error *err) {
  int rc;
  /* systemd made it listen already (Backlog= in shardd.socket). */
  if ((rc = sd_acceptor_start(&d->server, d->loop, fd, "the client socket", on_connection, d)) != 0) {
    return sd_fail(err, SHARDD_E_IO, "cannot accept on the socket systemd passed (fd %d): %s", fd,
                   uv_strerror(rc));
  }
  adopted = 1;
  d->listening = 1;
  return 0;
}

void sd_listener_close(sd_daemon *d) {
  if (!d->listening) return;
  d->listening = 0;
  sd_acceptor_stop(&d->server);
  if (adopted) return;
  if (unlink(d->cfg->socket_path) != 0 && errno != ENOENT)
    sd_log_warn("cannot remove %s: %s", d->cfg->socket_path, strerror(errno));
}

/* sd_notify and socket-activation protocols spoken directly, without libsystemd. */
/*
 * Why not libsystemd: both protocols are tiny and stable (a datagram of
 * "KEY=VALUE\n" lines to the socket named by NOTIFY_SOCKET; descriptors from 3
 * upwards announced by LISTEN_PID/LISTEN_FDS), so speaking them directly costs
 * about as much code as wrapping the library would. Skipping it keeps one
 * shared library (and its own dependency chain) off every GPU node, lets the
 * daemon build where systemd headers are absent, and works the same under any
 * supervisor that implements the protocols, e.g. inside containers with
 * podman/conmon or s6, where libsystemd is often not installed.
 */
#include "sdnotify.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ *
 * Pure helpers
 * ------------------------------------------------------------------------ */

int sd_sys_parse_u64(const char *s, uint64_t *out) {
  if (!s || !*s) return -1;
  uint64_t v = 0;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '9') return -1;
    unsigned d = (unsigned)(*p - '0');
    if (v > (UINT64_MAX - d) / 10) return -1;
    v = v * 10 + d;
  }
  *out = v;
  return 0;
}

int sd_sys_notify_address(const char *spec, struct sockaddr_un *sa, socklen_t *len,
                          sd_error *err) {
  if (!spec || (spec[0] != '/' && spec[0] != '@'))
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "NOTIFY_SOCKET=\"%s\": expected an absolute path or an @abstract name",
                   spec ? spec : "");
  size_t n = strlen(spec);
  if (n < 2 && spec[0] == '@')
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "NOTIFY_SOCKET=\"@\": empty abstract name");
  /* A path socket needs room for its terminating NUL; an abstract name does
   * not, its length is carried by the address length instead. */
  if (n > sizeof sa->sun_path - (spec[0] == '/' ? 1 : 0))
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "NOTIFY_SOCKET is %zu bytes long, more than sun_path holds (%zu)", n,
                   sizeof sa->sun_path);
  memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  memcpy(sa->sun_path, spec, n);
  if (spec[0] == '@') {
    sa->sun_path[0] = '\0';
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
  } else {
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
  }
  return 0;
}

/* ------------------------------------------------------------------------ *
 * Notifications
 * ------------------------------------------------------------------------ */

int sd_sys_notify_send(const char *msg, sd_error *err) {
  const char *spec = getenv("NOTIFY_SOCKET");
  if (!spec || !*spec) return 0;
  if (!msg || !*msg) return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "empty notification");

  struct sockaddr_un sa;
  socklen_t salen;
  int rc = sd_sys_notify_address(spec, &sa, &salen, err);
  if (rc < 0) return rc;

  /* A fresh socket per message keeps this stateless and thread-safe; the
   * daemon notifies a few times a minute, so the cost does not matter.
   * MSG_DONTWAIT: the event loop must never stall behind a busy service
   * manager; a full queue drops this one message and says so. */
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return sd_fail(err, SHARDD_E_IO, "notify: socket(AF_UNIX, SOCK_DGRAM): %s", strerror(errno));
  size_t n = strlen(msg);
  ssize_t w;
  do {
    w = sendto(fd, msg, n, MSG_NOSIGNAL | MSG_DONTWAIT, (const struct sockaddr *)&sa, salen);
  } while (w < 0 && errno == EINTR);
  int saved = errno;
  close(fd);
  if (w < 0)
    return sd_fail(err, sd_err_from_errno(saved),
                   "notify: sending to NOTIFY_SOCKET=%s: %s", spec, strerror(saved));
  if ((size_t)w != n)
    return sd_fail(err, SHARDD_E_IO, "notify: short datagram to NOTIFY_SOCKET=%s (%zd of %zu bytes)",
                   spec, w, n);
  return 1;
}

int sd_sys_vnotify(const char *fmt, va_list ap) {
  char *msg = NULL;
  if (vasprintf(&msg, fmt, ap) < 0) return SHARDD_E_NO_MEMORY;
  int rc = sd_sys_notify_send(msg, NULL);
  free(msg);
  return rc;
}

int sd_sys_notify(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = sd_sys_vnotify(fmt, ap);
  va_end(ap);
  return rc;
}

/* A newline inside a value would end the assignment and start a bogus one. */
static void one_line(char *s) {
  for (; *s; s++)
    if (*s == '\n') *s = ' ';
}

/* Sends prefix followed by the formatted text flattened to one line. */
static int notify_value(const char *prefix, const char *fmt, va_list ap) {
  char *text = NULL, *msg = NULL;
  if (vasprintf(&text, fmt, ap) < 0) return SHARDD_E_NO_MEMORY;
  one_line(text);
  int rc = SHARDD_E_NO_MEMORY;
  if (asprintf(&msg, "%s%s", prefix, text) >= 0) rc = sd_sys_notify_send(msg, NULL);
  free(msg);
  free(text);
  return rc;
}

static int notify_value_f(const char *prefix, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int notify_value_f(const char *prefix, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = notify_value(prefix, fmt, ap);
  va_end(ap);
  return rc;
}

int sd_sys_notify_ready(const char *status) {
  if (!status) return sd_sys_notify_send("READY=1", NULL);
  /* One datagram, so systemd never shows "ready" with a stale status. */
  return notify_value_f("READY=1\nSTATUS=", "%s", status);
}

int sd_sys_notify_status(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = notify_value("STATUS=", fmt, ap);
  va_end(ap);
  return rc;
}

int sd_sys_notify_watchdog(void) { return sd_sys_notify_send("WATCHDOG=1", NULL); }
int sd_sys_notify_reloading(void) { return sd_sys_notify_send("RELOADING=1", NULL); }
int sd_sys_notify_stopping(void) { return sd_sys_notify_send("STOPPING=1", NULL); }

uint64_t sd_sys_watchdog_usec(void) {
  uint64_t usec, pid;
  if (sd_sys_parse_u64(getenv("WATCHDOG_USEC"), &usec) < 0 || usec == 0) return 0;
  /* WATCHDOG_PID is optional; when present it must name us, or the watchdog
   * belongs to a parent that passed its environment down. */
  const char *p = getenv("WATCHDOG_PID");
  if (p && (sd_sys_parse_u64(p, &pid) < 0 || pid != (uint64_t)getpid())) return 0;
  return usec;
}

/* ------------------------------------------------------------------------ *
 * Socket activation
 * ------------------------------------------------------------------------ */

static void unset_listen_env(void) {
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
}

int sd_sys_listen_fds(int *fds, int max, sd_error *err) {
  const char *spid = getenv("LISTEN_PID");
  const char *sfds = getenv("LISTEN_FDS");
  uint64_t pid, n;
  int rc = 0;

  if (!spid || !sfds) goto out;
  if (sd_sys_parse_u64(spid, &pid) < 0 || pid == 0) {
    rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "LISTEN_PID=\"%s\" is not a process id", spid);
    goto out;
  }
  if (pid != (uint64_t)getpid()) goto out;   /* meant for a process that exec'd us */
  if (sd_sys_parse_u64(sfds, &n) < 0 || n > 4096) {
    rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "LISTEN_FDS=\"%s\" is not a descriptor count",
                 sfds);
    goto out;
  }
  if (n > (uint64_t)(max < 0 ? 0 : max)) {
    rc = sd_fail(err, SHARDD_E_LIMIT,
                 "socket activation passed %llu sockets; shardd takes at most %d",
                 (unsigned long long)n, max);
    goto out;
  }
  for (int i = 0; i < (int)n; i++) {
    int fd = SD_SYS_LISTEN_FDS_START + i;
    int flags = fcntl(fd, F_GETFD);
    if (flags < 0) {
      rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "LISTEN_FDS=%s but descriptor %d is not open: %s", sfds, fd, strerror(errno));
      goto out;
    }
    /* Our children (none today) must not inherit the listening socket. */
    if (!(flags & FD_CLOEXEC) && fcntl(fd, F_SETFD, flags | FD_CLOEXEC) < 0) {
      rc = sd_fail(err, SHARDD_E_IO, "marking descriptor %d close-on-exec: %s", fd,
                   strerror(errno));
      goto out;
    }
    fds[i] = fd;
  }
  rc = (int)n;
out:
  unset_listen_env();
  return rc;
}

int sd_sys_is_unix_stream_listener(int fd) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  int type = 0, listening = 0;
  socklen_t ilen = sizeof type;
  if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0 || ss.ss_family != AF_UNIX) return 0;
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &ilen) < 0 || type != SOCK_STREAM) return 0;
  ilen = sizeof listening;
  if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ilen) < 0) return 0;
  return listening != 0;
}

/* libshardd: the client side of protocol v1 (connection, request/reply matching, waits, status). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "client_int.h"
#include "sd_error.h"
#include "sd_linebuf.h"
#include "shardd/shardd.h"

/* shardd_connect has no client to hold its message on failure. */
static __thread char connect_err[SD_CLIENT_ERR_MAX];

/* ------------------------------------------------------------------------ *
 * Error helpers
 * ------------------------------------------------------------------------ */
static int vfail_into(char *buf, int code, const char *fmt, va_list ap) {
  int n = snprintf(buf, SD_CLIENT_ERR_MAX, "%s: ", sd_err_name(code));
  if (n < 0 || n >= SD_CLIENT_ERR_MAX) n = 0;
  vsnprintf(buf + n, SD_CLIENT_ERR_MAX - (size_t)n, fmt, ap);
  return code;
}

int sd_client_fail(shardd_client *c, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfail_into(c->err, code, fmt, ap);
  va_end(ap);
  return code;
}

int sd_client_ok(shardd_client *c) {
  c->err[0] = '\0';
  return 0;
}

/* ------------------------------------------------------------------------ *
 * Time
 * ------------------------------------------------------------------------ */
int64_t sd_client_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* -1 means no deadline. */
static int64_t deadline_in(int timeout_ms) { return timeout_ms < 0 ? -1 : sd_client_now_ms() + timeout_ms; }

static int remaining_ms(int64_t deadline) {
  if (deadline < 0) return -1;
  int64_t left = deadline - sd_client_now_ms();
  if (left <= 0) return 0;
  return left > INT_MAX ? INT_MAX : (int)left;
}

/* ------------------------------------------------------------------------ *
 * Socket I/O
 * ------------------------------------------------------------------------ */
static int conn_lost(shardd_client *c, int code, const char *why) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  return sd_client_fail(c, code, "connection to the daemon lost: %s", why);
}

int sd_client_conn_check(shardd_client *c) {
  if (c->fd < 0) return sd_client_fail(c, SHARDD_E_CONNECT, "connection to the daemon is closed");
  return 0;
}

/* Waits for events on the socket; 0 when ready, SHARDD_E_TIMEOUT otherwise. */
static int wait_fd(shardd_client *c, short events, int64_t deadline) {
  for (;;) {
    struct pollfd p = {.fd = c->fd, .events = events};
    int n = poll(&p, 1, remaining_ms(deadline));
    if (n > 0) return 0;
    if (n == 0) return SHARDD_E_TIMEOUT;
    if (errno != EINTR) return conn_lost(c, SHARDD_E_IO, strerror(errno));
  }
}

/* A half-written line cannot be taken back, so any failure here ends the
 * connection; MSG_NOSIGNAL keeps a dead daemon from killing the trainer. */
static ssize_t send_some(shardd_client *c, const char *buf, size_t len) {
  if (!c->passing) return send(c->fd, buf, len, MSG_NOSIGNAL);
  /* The descriptor rides on the line's first bytes: the daemon files it
   * under the line those bytes belong to. */
  union {
    char b[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } ctl;
  memset(&ctl, 0, sizeof ctl);
  struct iovec iov = {(void *)buf, len};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b};
  struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(cm), &c->pass_fd, sizeof(int));
  ssize_t n = sendmsg(c->fd, &m, MSG_NOSIGNAL);
  if (n > 0) c->passing = 0;
  return n;
}

static int send_all(shardd_client *c, const char *buf, size_t len, int64_t deadline) {
  while (len > 0) {
    ssize_t n = send_some(c, buf, len);
    if (n > 0) {
      buf += n;
      len -= (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int rc = wait_fd(c, POLLOUT, deadline);
      if (rc == SHARDD_E_TIMEOUT) {
        conn_lost(c, SHARDD_E_TIMEOUT, "");
        return sd_client_fail(c, SHARDD_E_TIMEOUT, "daemon did not read a request in time; disconnected");
      }
      if (rc) return rc;
      continue;
    }
    return conn_lost(c, SHARDD_E_CONNECT, n == 0 ? "send returned 0" : strerror(errno));
  }
  return 0;
}

/* Reads whatever is available (at least one byte) into the line buffer. */
static int recv_some(shardd_client *c, int64_t deadline) {
  for (;;) {
    size_t avail;
    char *dst = sd_linebuf_reserve(&c->in, 64 * 1024, &avail);
    if (!dst) return sd_client_fail(c, SHARDD_E_NO_MEMORY, "cannot grow the receive buffer");
    ssize_t n = recv(c->fd, dst, avail, 0);
    if (n > 0) {
      sd_linebuf_commit(&c->in, (size_t)n);
      return 0;
    }
    if (n == 0) return conn_lost(c, SHARDD_E_CONNECT, "the daemon closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      int rc = wait_fd(c, POLLIN, deadline);
      if (rc == SHARDD_E_TIMEOUT) return sd_client_fail(c, SHARDD_E_TIMEOUT, "no reply from the daemon in time");
      if (rc) return rc;
      continue;
    }
    return conn_lost(c, SHARDD_E_CONNECT, strerror(errno));
  }
}

/* ------------------------------------------------------------------------ *
 * Reply matching
 *
 * Replies come in request order except wait replies, which come whenever a
 * save ends, and events may be interleaved anywhere. We only ever await one
 * reply at a time, so: the awaited id is returned, a reply to an outstanding
 * wait is parked in `early`, events update `released`, and anything else is
 * the late reply to a request that timed out and is dropped.
 * ------------------------------------------------------------------------ */
static const char *wait_save_for_id(shardd_client *c, json_int_t id) {
  const char *save;
  json_t *v;
  json_object_foreach(c->waits, save, v) {
    if (json_integer_value(v) == id) return save;
  }
  return NULL;
}

static void id_key(char *buf, size_t n, json_int_t id) { snprintf(buf, n, "%" JSON_INTEGER_FORMAT, id); }

/* Handles one line. Returns 1 and *reply when it is the awaited reply. */
static int dispatch(shardd_client *c, char *line, size_t len, json_int_t want, json_t **reply) {
  json_error_t je;
  json_t *m = json_loadb(line, len, 0, &je);
  if (!m || !json_is_object(m)) {
    json_decref(m);
    conn_lost(c, SHARDD_E_PROTOCOL, "");
    return sd_client_fail(c, SHARDD_E_PROTOCOL, "daemon sent a line that is not a JSON object (%s)",
                 m ? "not an object" : je.text);
  }
  json_t *ev = json_object_get(m, "event");
  if (ev) {
    const char *save = json_string_value(json_object_get(m, "save"));
    if (json_is_string(ev) && strcmp(json_string_value(ev), "released") == 0 && save)
      json_object_set_new(c->released, save, json_true());
    /* Unknown events are ignored so newer daemons can add some. */
    json_decref(m);
    return 0;
  }
  json_t *idv = json_object_get(m, "id");
  if (json_is_integer(idv) && json_integer_value(idv) == want) {
    *reply = m;
    return 1;
  }
  /* A reply without a usable id answers a line the daemon could not parse;
   * only a non-wait request can be waiting for it in order. */
  if ((!idv || json_is_null(idv)) && want > 0 && !wait_save_for_id(c, want)) {
    *reply = m;
    return 1;
  }
  if (json_is_integer(idv)) {
    const char *save = wait_save_for_id(c, json_integer_value(idv));
    if (save) {
      char key[32];
      id_key(key, sizeof key, json_integer_value(idv));
      /* The save has ended, so its memory will not be read again. */
      json_object_set_new(c->released, save, json_true());
      json_object_set_new(c->early, key, m);
      return 0;
    }
  }
  json_decref(m);
  return 0;
}

/* Processes buffered lines; stops at the awaited reply. Returns 1 (found),
 * 0 (buffer exhausted) or a negative code. */
static int pump(shardd_client *c, json_int_t want, json_t **reply) {
  for (;;) {
    char *line;
    size_t len;
    sd_error e;
    int r = sd_linebuf_next(&c->in, &line, &len, &e);
    if (r == 0) return 0;
    if (r < 0) {
      conn_lost(c, SHARDD_E_PROTOCOL, "");
      return sd_client_fail(c, SHARDD_E_PROTOCOL, "daemon sent a line over %u bytes", SD_CLIENT_MAX_LINE);
    }
    r = dispatch(c, line, len, want, reply);
    if (r) return r;
  }
}

static int await_reply(shardd_client *c, json_int_t id, int64_t deadline, json_t **reply) {
  char key[32];
  id_key(key, sizeof key, id);
  json_t *parked = json_object_get(c->early, key);
  if (parked) {
    *reply = json_incref(parked);
    json_object_del(c->early, key);
    return 0;
  }
  for (;;) {
    int r = pump(c, id, reply);
    if (r == 1) return 0;
    if (r < 0) return r;
    r = sd_client_conn_check(c);
    if (r) return r;
    r = recv_some(c, deadline);
    if (r) return r;
  }
}

/* Stamps req with a fresh id and sends it as one line; steals req. */
static int send_request(shardd_client *c, json_t *req, json_int_t *id) {
  if (!req) return sd_client_fail(c, SHARDD_E_NO_MEMORY, "cannot build the request");
  int rc = sd_client_conn_check(c);
  if (rc) {
    json_decref(req);
    return rc;
  }
  *id = ++c->next_id;
  json_object_set_new(req, "id", json_integer(*id));
  size_t len = json_dumpb(req, NULL, 0, JSON_COMPACT);
  char *buf = len ? malloc(len + 1) : NULL;
  if (!buf) {
    json_decref(req);
    return sd_client_fail(c, SHARDD_E_NO_MEMORY, "cannot encode the request");
  }
  json_dumpb(req, buf, len, JSON_COMPACT);
  json_decref(req);
  buf[len] = '\n';
  rc = send_all(c, buf, len + 1, deadline_in(c->timeout_ms));
  free(buf);
  return rc;
}

/* Turns an ok:false reply into the mapped code and "code: message". */
static int reply_error(shardd_client *c, json_t *r) {
  json_t *e = json_object_get(r, "error");
  const char *code = json_string_value(json_object_get(e, "code"));
  const char *msg = json_string_value(json_object_get(e, "message"));
  int rc = sd_err_from_name(code);
  if (rc == 0) rc = SHARDD_E_PROTOCOL;
  snprintf(c->err, sizeof c->err, "%s: %s", code ? code : sd_err_name(rc),
           msg ? msg : sd_err_message(rc));
  return rc;
}

/* Checks ok; on success *reply keeps the reply (or it is released when reply is NULL). */
static int finish_reply(shardd_client *c, json_t *r, json_t **reply) {
  json_t *ok = json_object_get(r, "ok");
  int rc;
  if (json_is_true(ok)) {
    if (reply) {
      *reply = r;
      return sd_client_ok(c);
    }
    rc = sd_client_ok(c);
  } else if (json_is_false(ok)) {
    rc = reply_error(c, r);
  } else {
    rc = sd_client_fail(c, SHARDD_E_PROTOCOL, "daemon reply has no boolean 'ok'");
  }
  json_decref(r);
  return rc;
}

int sd_client_pipeline(shardd_client *c, size_t window, sd_client_line_fn line, void *ctx, size_t *failed,
                       int64_t *accepted) {
  if (window == 0) window = 1;
  json_int_t *ids = malloc(window * sizeof *ids); /* a ring: request k's id at k % window */
  sd_buf out = {0};
  if (!ids) return sd_client_fail(c, SHARDD_E_NO_MEMORY, "cannot hold %zu request ids", window);
  size_t sent = 0, got = 0, first_at = 0;
  int first = 0, rc = 0, more = 1;
  int64_t first_accepted = -1;
  char msg[sizeof c->err];
  while (!rc && (more || got < sent)) {
    while (more && sent - got < window && !rc) {
      out.len = 0;
      json_int_t id = c->next_id + 1;
      int r = line(c, ctx, sent, id, &out);
      if (r < 0) {
        rc = -r;
        first_at = sent;
      } else if (r > 0) more = 0;
      else if (out.oom) rc = sd_client_fail(c, SHARDD_E_NO_MEMORY, "cannot encode request %zu", sent);
      else if (!(rc = sd_client_conn_check(c))) {
        c->next_id = id;
        ids[sent++ % window] = id;
        rc = send_all(c, out.p, out.len, deadline_in(c->timeout_ms));
      }
    }
    if (rc || got == sent) break;
    json_t *r;
    rc = await_reply(c, ids[got % window], deadline_in(c->timeout_ms), &r);
    if (rc) break;
    json_t *acc = json_object_get(r, "accepted");
    int64_t nacc = json_is_integer(acc) ? (int64_t)json_integer_value(acc) : -1;
    int e = finish_reply(c, r, NULL);
    if (e && !first) {
      first = e;
      first_at = got;
      first_accepted = nacc;
      snprintf(msg, sizeof msg, "%s", c->err);
      more = 0; /* the caller gives up at the first refusal: nothing more is sent */
    }
    got++;
  }
  free(ids);
  free(out.p);
  if (accepted) *accepted = first ? first_accepted : -1;
  if (rc) { /* a local refusal (at first_at) or a broken connection: what was not answered is lost */
    if (failed) *failed = first || first_at ? first_at : got;
    if (first) snprintf(c->err, sizeof c->err, "%s", msg);
    return first ? first : rc;
  }
  if (first) {
    snprintf(c->err, sizeof c->err, "%s", msg);
    if (failed) *failed = first_at;
  }
  return first;
}

/* Requests sent ahead of their replies: enough to hide round trips, few
 * enough that the replies owed never reach the daemon's output limit while
 * this side is only writing. */
#define SD_CLIENT_WINDOW 256

typedef struct {
  json_t **reqs;
  size_t n;
} json_lines;

static int json_line(shardd_client *c, void *ctx, size_t k, json_int_t id, sd_buf *out) {
  json_lines *l = ctx;
  if (k >= l->n) return 1;
  json_t *req = l->reqs[k];
  l->reqs[k] = NULL;
  if (!req) return -sd_client_fail(c, SHARDD_E_NO_MEMORY, "cannot build the request");
  json_object_set_new(req, "id", json_integer(id));
  size_t len = json_dumpb(req, NULL, 0, JSON_COMPACT);
  if (!len) {
    json_decref(req);
    return -sd_client_fail(c, SHARDD_E_NO_MEMORY, "cannot encode the request");
  }
  sd_buf_reserve(out, len + 1);
  if (!out->oom) out->len = json_dumpb(req, out->p, len, JSON_COMPACT);
  json_decref(req);
  sd_buf_putc(out, '\n');
  return 0;
}

int sd_client_request_many(shardd_client *c, json_t **reqs, size_t n, size_t *failed) {
  json_lines l = {reqs, n};
  int rc = sd_client_pipeline(c, SD_CLIENT_WINDOW, json_line, &l, failed, NULL);
  for (size_t k = 0; k < n; k++) json_decref(reqs[k]);
  return rc;
}

/* One request, one reply (for every op but wait). */
int sd_client_request(shardd_client *c, json_t *req, json_t **reply) {
  json_int_t id;
  int rc = send_request(c, req, &id);
  if (rc) return rc;
  json_t *r;
  rc = await_reply(c, id, deadline_in(c->timeout_ms), &r);
  if (rc) return rc;
  return finish_reply(c, r, reply);
}

int sd_client_request_fd(shardd_client *c, json_t *req, int fd, json_t **reply) {
  c->pass_fd = fd;
  c->passing = 1;
  json_int_t id;
  int rc = send_request(c, req, &id);
  c->passing = 0;
  if (rc) return rc;
  json_t *r;
  rc = await_reply(c, id, deadline_in(c->timeout_ms), &r);
  if (rc) return rc;
  return finish_reply(c, r, reply);
}

/* ------------------------------------------------------------------------ *
 * Error helpers (public)
 * ------------------------------------------------------------------------ */
SHARDD_EXPORT const char *shardd_strerror(int err) { return sd_err_message(err); }
SHARDD_EXPORT const char *shardd_err_name(int err) { return sd_err_name(err); }
SHARDD_EXPORT int shardd_err_from_name(const char *name) { return sd_err_from_name(name); }

/* ------------------------------------------------------------------------ *
 * Connection
 * ------------------------------------------------------------------------ */
int sd_client_connect_fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfail_into(connect_err, code, fmt, ap);
  va_end(ap);
  return code;
}

static int env_timeout_ms(void) {
  const char *s = getenv("SHARDD_TIMEOUT_MS");
  if (!s || !*s) return SD_CLIENT_DEFAULT_TIMEOUT_MS;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || v > INT_MAX) return SD_CLIENT_DEFAULT_TIMEOUT_MS;
  return v < 0 ? -1 : (int)v;
}

static int unix_connect(const char *path, int *fd_out) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t plen = strlen(path);
  if (plen == 0 || plen >= sizeof sa.sun_path)
    return sd_client_connect_fail(SHARDD_E_CONNECT, "socket path '%s' is empty or longer than %zu bytes", path,
                        sizeof sa.sun_path - 1);
  memcpy(sa.sun_path, path, plen + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return sd_client_connect_fail(SHARDD_E_CONNECT, "socket: %s", strerror(errno));
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    int e = errno;
    if (e == EINTR) {
      /* The connection carries on in the background; wait for its outcome. */
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      int n;
      do n = poll(&p, 1, -1);
      while (n < 0 && errno == EINTR);
      socklen_t sl = sizeof e;
      if (n < 0) e = errno;
      else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &sl) < 0) e = errno;
    }
    if (e) {
      close(fd);
      return sd_client_connect_fail(SHARDD_E_CONNECT, "cannot connect to %s: %s", path, strerror(e));
    }
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
    close(fd);
    return sd_client_connect_fail(SHARDD_E_CONNECT, "fcntl: %s", strerror(errno));
  }
  *fd_out = fd;
  return 0;
}

static char *json_text(json_t *v) {
  if (json_is_string(v)) return strdup(json_string_value(v));
  if (v) return json_dumps(v, JSON_COMPACT);
  return strdup("");
}

SHARDD_EXPORT int shardd_connect(const char *socket_path, shardd_client **out) {
  if (!out) return sd_client_connect_fail(SHARDD_E_INVALID_ARGUMENT, "shardd_connect: out is NULL");
  *out = NULL;
  connect_err[0] = '\0';
  const char *path = socket_path;
  /* A longer path could not be connected to anyway. */
  char xdg_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
  if (!path) path = getenv("SHARDD_SOCKET");
  if (!path || !*path) {
    /* The daemon's own default (daemon/config.c): an unprivileged daemon
     * listens in the user's runtime folder. */
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    path = SHARDD_DEFAULT_SOCKET;
    if (geteuid() != 0 && xdg && *xdg &&
        (size_t)snprintf(xdg_path, sizeof xdg_path, "%s/shardd.sock", xdg) < sizeof xdg_path)
      path = xdg_path;
  }

  shardd_client *c = calloc(1, sizeof *c);
  if (!c) return sd_client_connect_fail(SHARDD_E_NO_MEMORY, "cannot allocate the client");
  c->fd = -1;
  c->timeout_ms = env_timeout_ms();
  sd_linebuf_init(&c->in, SD_CLIENT_MAX_LINE);
  c->waits = json_object();
  c->early = json_object();
  c->released = json_object();
  int rc;
  if (!c->waits || !c->early || !c->released) {
    rc = sd_client_connect_fail(SHARDD_E_NO_MEMORY, "cannot allocate the client");
    goto fail;
  }
  rc = unix_connect(path, &c->fd);
  if (rc) goto fail;

  json_t *r = NULL;
  rc = sd_client_request(c, json_pack("{s:s, s:i}", "op", "hello", "proto", SHARDD_PROTO_VERSION), &r);
  if (rc) {
    int n = snprintf(connect_err, sizeof connect_err, "%s", c->err);
    if (n >= 0 && (size_t)n < sizeof connect_err)
      snprintf(connect_err + n, sizeof connect_err - (size_t)n, " (hello on %s)", path);
    goto fail;
  }
  json_t *proto = json_object_get(r, "proto");
  if (!json_is_integer(proto) || json_integer_value(proto) != SHARDD_PROTO_VERSION) {
    json_decref(r);
    rc = sd_client_connect_fail(SHARDD_E_UNSUPPORTED_PROTO, "daemon on %s does not speak protocol %d", path,
                      SHARDD_PROTO_VERSION);
    goto fail;
  }
  json_int_t v;
  if ((v = json_integer_value(json_object_get(r, "max_line"))) > 0) c->max_line = (uint64_t)v;
  if ((v = json_integer_value(json_object_get(r, "max_puts"))) > 0) c->max_puts = (uint64_t)v;
  c->node = json_text(json_object_get(r, "node"));
  c->server = json_text(json_object_get(r, "server"));
  json_decref(r);
  if (!c->node || !c->server) {
    rc = sd_client_connect_fail(SHARDD_E_NO_MEMORY, "cannot allocate the client");
    goto fail;
  }
  *out = c;
  return sd_client_ok(c);
fail:
  shardd_close(c);
  return rc;
}

SHARDD_EXPORT void shardd_close(shardd_client *c) {
  if (!c) return;
  if (c->fd >= 0) close(c->fd);
  /* Arenas outlive their client: destroy then only unmaps and unlinks, and
   * the daemon drops the regions of a closed connection by itself. */
  for (shardd_arena *a = c->arenas; a; a = a->next) a->c = NULL;
  sd_linebuf_free(&c->in);
  json_decref(c->waits);
  json_decref(c->early);
  json_decref(c->released);
  free(c->node);
  free(c->server);
  free(c);
}

SHARDD_EXPORT const char *shardd_last_error(const shardd_client *c) { return c ? c->err : connect_err; }

SHARDD_EXPORT const char *shardd_node_name(const shardd_client *c) {
  return c && c->node ? c->node : "";
}

static int parse_result(shardd_client *c, const char *save, json_t *r, shardd_result *out) {
  const char *state = json_string_value(json_object_get(r, "state"));
  if (!state || strcmp(state, "committed") != 0)
    return sd_client_fail(c, SHARDD_E_PROTOCOL, "wait for '%s' answered ok with state '%s'", save,
                 state ? state : "(none)");
  if (!out) return 0;
  memset(out, 0, sizeof *out);
  const char *dir = json_string_value(json_object_get(r, "dir"));
  if (dir) {
    if (strlen(dir) >= sizeof out->dir)
      return sd_client_fail(c, SHARDD_E_PROTOCOL, "wait for '%s': dir is longer than %zu bytes", save,
                   sizeof out->dir - 1);
    strcpy(out->dir, dir);
  }
  json_int_t v;
  if ((v = json_integer_value(json_object_get(r, "files"))) > 0) out->files = (uint64_t)v;
  if ((v = json_integer_value(json_object_get(r, "tensors"))) > 0) out->tensors = (uint64_t)v;
  if ((v = json_integer_value(json_object_get(r, "bytes"))) > 0) out->bytes = (uint64_t)v;
  return 0;
}

/* The daemon went away while a rank waited for its save: the save may have been published just
 * before (a rename is the last step), so the rank is told it does not know, never that it failed. */
static int wait_lost(shardd_client *c, const char *save, int rc) {
  if (rc != SHARDD_E_CONNECT) return rc;
  char why[sizeof c->err];
  snprintf(why, sizeof why, "%s", c->err);
  return sd_client_fail(c, SHARDD_E_OUTCOME_UNKNOWN, "save '%s': the daemon was lost while this rank waited for "
                        "it (%s); whether it was published is not known here: see whether its folder holds it "
                        "(shardctl verify), or `shardctl outcome` with the path and attempt a node's daemon named",
                        save, why);
}

SHARDD_EXPORT int shardd_wait(shardd_client *c, const char *save, int timeout_ms, shardd_result *out) {
  if (!c) return SHARDD_E_INVALID_ARGUMENT;
  if (!save) return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "wait: save id is NULL");
  int64_t deadline = deadline_in(timeout_ms);
  /* A wait that timed out stays in flight; asking again reuses it. */
  json_t *pending = json_object_get(c->waits, save);
  json_int_t id;
  int rc;
  if (pending) {
    id = json_integer_value(pending);
  } else {
    json_t *req = json_pack("{s:s, s:s}", "op", "wait", "save", save);
    if (!req) return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "wait: save id is not valid UTF-8");
    rc = send_request(c, req, &id);
    if (rc) return wait_lost(c, save, rc);
    json_object_set_new(c->waits, save, json_integer(id));
  }
  json_t *r;
  rc = await_reply(c, id, deadline, &r);
  if (rc == SHARDD_E_TIMEOUT)
    return sd_client_fail(c, SHARDD_E_TIMEOUT, "save '%s' did not end within %d ms", save, timeout_ms);
  if (rc) return wait_lost(c, save, rc);
  json_object_del(c->waits, save);
  json_object_set_new(c->released, save, json_true());
  json_t *ok;
  rc = finish_reply(c, r, &ok);
  if (rc) return rc;
  rc = parse_result(c, save, ok, out);
  json_decref(ok);
  return rc;
}

SHARDD_EXPORT int shardd_wait_released(shardd_client *c, const char *save, int timeout_ms) {
  if (!c) return SHARDD_E_INVALID_ARGUMENT;
  if (!save) return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "wait_released: save id is NULL");
  int64_t deadline = deadline_in(timeout_ms);
  for (;;) {
    json_t *none = NULL;
    /* id 0 is never used, so this only files events and parked replies. */
    int rc = pump(c, 0, &none);
    if (rc < 0) return rc;
    if (json_object_get(c->released, save)) return sd_client_ok(c);
    rc = sd_client_conn_check(c);
    if (rc) return rc;
    rc = recv_some(c, deadline);
    if (rc == SHARDD_E_TIMEOUT)
      return sd_client_fail(c, SHARDD_E_TIMEOUT, "save '%s': no 'released' within %d ms", save, timeout_ms);
    if (rc) return rc;
  }
}

SHARDD_EXPORT void shardd_free(void *p) { free(p); }

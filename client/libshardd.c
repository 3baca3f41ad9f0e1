/* libshardd: the client side of protocol v1 (connection, request/reply matching, arenas, saves). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "sd_base64.h"
#include "sd_error.h"
#include "sd_format.h"
#include "sd_linebuf.h"
#include "shardd/shardd.h"

/* A status reply lists every save in flight; leave it plenty of room while
 * still refusing a daemon that streams an endless line. */
#define SD_CLIENT_MAX_LINE (64u * 1024u * 1024u)
/* Non-wait requests are validated and answered at once by the daemon, so a
 * silent daemon for this long is treated as hung rather than busy. */
#define SD_CLIENT_DEFAULT_TIMEOUT_MS 120000
#define SD_CLIENT_ERR_MAX (SD_ERRMSG_MAX + 64)

struct shardd_arena {
  shardd_client *c;        /* NULL once the client is closed */
  shardd_arena *next;      /* the client's list, so close can orphan us */
  void *base;
  size_t size;
  int64_t region;
  char name[64];
};

struct shardd_client {
  int fd;                  /* -1 once the connection is lost */
  int timeout_ms;          /* for non-wait requests; < 0 forever */
  int64_t next_id;
  sd_linebuf in;
  json_t *waits;           /* save -> id of the wait request still unanswered */
  json_t *early;           /* "id" -> wait reply that arrived while we awaited something else */
  json_t *released;        /* save -> true once "released" (or the save's end) was seen */
  shardd_arena *arenas;
  char *node;
  char *server;
  char err[SD_CLIENT_ERR_MAX];
};

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

static int cfail(shardd_client *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int cfail(shardd_client *c, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfail_into(c->err, code, fmt, ap);
  va_end(ap);
  return code;
}

static int cok(shardd_client *c) {
  c->err[0] = '\0';
  return 0;
}

/* ------------------------------------------------------------------------ *
 * Time
 * ------------------------------------------------------------------------ */
static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* -1 means no deadline. */
static int64_t deadline_in(int timeout_ms) { return timeout_ms < 0 ? -1 : now_ms() + timeout_ms; }

static int remaining_ms(int64_t deadline) {
  if (deadline < 0) return -1;
  int64_t left = deadline - now_ms();
  if (left <= 0) return 0;
  return left > INT_MAX ? INT_MAX : (int)left;
}

/* ------------------------------------------------------------------------ *
 * Socket I/O
 * ------------------------------------------------------------------------ */
static int conn_lost(shardd_client *c, int code, const char *why) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  return cfail(c, code, "connection to the daemon lost: %s", why);
}

static int conn_check(shardd_client *c) {
  if (c->fd < 0) return cfail(c, SHARDD_E_CONNECT, "connection to the daemon is closed");
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
static int send_all(shardd_client *c, const char *buf, size_t len, int64_t deadline) {
  while (len > 0) {
    ssize_t n = send(c->fd, buf, len, MSG_NOSIGNAL);
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
        return cfail(c, SHARDD_E_TIMEOUT, "daemon did not read a request in time; disconnected");
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
    if (!dst) return cfail(c, SHARDD_E_NO_MEMORY, "cannot grow the receive buffer");
    ssize_t n = recv(c->fd, dst, avail, 0);
    if (n > 0) {
      sd_linebuf_commit(&c->in, (size_t)n);
      return 0;
    }
    if (n == 0) return conn_lost(c, SHARDD_E_CONNECT, "the daemon closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      int rc = wait_fd(c, POLLIN, deadline);
      if (rc == SHARDD_E_TIMEOUT) return cfail(c, SHARDD_E_TIMEOUT, "no reply from the daemon in time");
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
    return cfail(c, SHARDD_E_PROTOCOL, "daemon sent a line that is not a JSON object (%s)",
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
      return cfail(c, SHARDD_E_PROTOCOL, "daemon sent a line over %u bytes", SD_CLIENT_MAX_LINE);
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
    r = conn_check(c);
    if (r) return r;
    r = recv_some(c, deadline);
    if (r) return r;
  }
}

/* Stamps req with a fresh id and sends it as one line; steals req. */
static int send_request(shardd_client *c, json_t *req, json_int_t *id) {
  if (!req) return cfail(c, SHARDD_E_NO_MEMORY, "cannot build the request");
  int rc = conn_check(c);
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
    return cfail(c, SHARDD_E_NO_MEMORY, "cannot encode the request");
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
      return cok(c);
    }
    rc = cok(c);
  } else if (json_is_false(ok)) {
    rc = reply_error(c, r);
  } else {
    rc = cfail(c, SHARDD_E_PROTOCOL, "daemon reply has no boolean 'ok'");
  }
  json_decref(r);
  return rc;
}

/* One request, one reply (for every op but wait). */
static int request(shardd_client *c, json_t *req, json_t **reply) {
  json_int_t id;
  int rc = send_request(c, req, &id);
  if (rc) return rc;
  json_t *r;
  rc = await_reply(c, id, deadline_in(c->timeout_ms), &r);
  if (rc) return rc;
  return finish_reply(c, r, reply);
}

/* ------------------------------------------------------------------------ *
 * Field encoding
 * ------------------------------------------------------------------------ */
static json_t *u64_json(uint64_t v) { return v > (uint64_t)INT64_MAX ? NULL : json_integer((json_int_t)v); }

static int set_u64(shardd_client *c, json_t *obj, const char *key, uint64_t v) {
  json_t *j = u64_json(v);
  if (!j) return cfail(c, SHARDD_E_INVALID_ARGUMENT, "%s %" PRIu64 " does not fit in a JSON integer", key, v);
  json_object_set_new(obj, key, j);
  return 0;
}

static int set_dims(shardd_client *c, json_t *obj, const char *key, const char *name, int ndim,
                    const uint64_t *v) {
  json_t *a = json_array();
  for (int i = 0; i < ndim; i++) {
    json_t *j = u64_json(v[i]);
    if (!j) {
      json_decref(a);
      return cfail(c, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': %s[%d] = %" PRIu64 " is too large",
                   name, key, i, v[i]);
    }
    json_array_append_new(a, j);
  }
  json_object_set_new(obj, key, a);
  return 0;
}

/* Validates a tensor description, computes its slice's byte size, and builds
 * the common part of a put request. */
static int put_request(shardd_client *c, const char *save, const shardd_tensor_desc *t,
                       json_t **out, uint64_t *nbytes) {
  *out = NULL;
  if (!save) return cfail(c, SHARDD_E_INVALID_ARGUMENT, "put: save id is NULL");
  if (!t || !t->name) return cfail(c, SHARDD_E_INVALID_ARGUMENT, "put: tensor name is NULL");
  const char *name = t->name;
  if (!t->dtype) return cfail(c, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': dtype is NULL", name);
  sd_dtype dt;
  sd_error e;
  if (sd_dtype_parse(t->dtype, &dt, &e)) return cfail(c, e.code, "tensor '%s': %s", name, e.msg);
  if (t->ndim < 0 || t->ndim > SD_MAX_DIMS)
    return cfail(c, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': ndim %d is outside 0..%d", name,
                 t->ndim, SD_MAX_DIMS);
  if (t->ndim > 0 && !t->shape)
    return cfail(c, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': shape is NULL", name);
  if (!t->start != !t->count)
    return cfail(c, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': give both start and count, or neither",
                 name);
  int sliced = t->start != NULL && t->ndim > 0;
  uint64_t n = sd_dtype_size(dt);
  for (int i = 0; i < t->ndim; i++) {
    uint64_t dim = sliced ? t->count[i] : t->shape[i];
    if (sliced && (t->start[i] > t->shape[i] || t->count[i] > t->shape[i] - t->start[i]))
      return cfail(c, SHARDD_E_INVALID_ARGUMENT,
                   "tensor '%s': box start %" PRIu64 " count %" PRIu64 " exceeds shape %" PRIu64
                   " in dimension %d",
                   name, t->start[i], t->count[i], t->shape[i], i);
    if (dim != 0 && n > UINT64_MAX / dim)
      return cfail(c, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': byte size overflows", name);
    n *= dim;
  }
  json_t *req = json_pack("{s:s, s:s, s:s, s:s}", "op", "put", "save", save, "name", name, "dtype",
                          t->dtype);
  if (!req) return cfail(c, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': name or save is not valid UTF-8", name);
  int rc = set_dims(c, req, "shape", name, t->ndim, t->shape);
  if (!rc && sliced) rc = set_dims(c, req, "start", name, t->ndim, t->start);
  if (!rc && sliced) rc = set_dims(c, req, "count", name, t->ndim, t->count);
  if (!rc && t->index >= 0) json_object_set_new(req, "index", json_integer(t->index));
  if (rc) {
    json_decref(req);
    return rc;
  }
  *out = req;
  *nbytes = n;
  return 0;
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
static int connect_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int connect_fail(int code, const char *fmt, ...) {
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
    return connect_fail(SHARDD_E_CONNECT, "socket path '%s' is empty or longer than %zu bytes", path,
                        sizeof sa.sun_path - 1);
  memcpy(sa.sun_path, path, plen + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return connect_fail(SHARDD_E_CONNECT, "socket: %s", strerror(errno));
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
      return connect_fail(SHARDD_E_CONNECT, "cannot connect to %s: %s", path, strerror(e));
    }
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
    close(fd);
    return connect_fail(SHARDD_E_CONNECT, "fcntl: %s", strerror(errno));
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
  if (!out) return connect_fail(SHARDD_E_INVALID_ARGUMENT, "shardd_connect: out is NULL");
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
  if (!c) return connect_fail(SHARDD_E_NO_MEMORY, "cannot allocate the client");
  c->fd = -1;
  c->timeout_ms = env_timeout_ms();
  sd_linebuf_init(&c->in, SD_CLIENT_MAX_LINE);
  c->waits = json_object();
  c->early = json_object();
  c->released = json_object();
  int rc;
  if (!c->waits || !c->early || !c->released) {
    rc = connect_fail(SHARDD_E_NO_MEMORY, "cannot allocate the client");
    goto fail;
  }
  rc = unix_connect(path, &c->fd);
  if (rc) goto fail;

  json_t *r = NULL;
  rc = request(c, json_pack("{s:s, s:i}", "op", "hello", "proto", SHARDD_PROTO_VERSION), &r);
  if (rc) {
    int n = snprintf(connect_err, sizeof connect_err, "%s", c->err);
    if (n >= 0 && (size_t)n < sizeof connect_err)
      snprintf(connect_err + n, sizeof connect_err - (size_t)n, " (hello on %s)", path);
    goto fail;
  }
  json_t *proto = json_object_get(r, "proto");
  if (!json_is_integer(proto) || json_integer_value(proto) != SHARDD_PROTO_VERSION) {
    json_decref(r);
    rc = connect_fail(SHARDD_E_UNSUPPORTED_PROTO, "daemon on %s does not speak protocol %d", path,
                      SHARDD_PROTO_VERSION);
    goto fail;
  }
  c->node = json_text(json_object_get(r, "node"));
  c->server = json_text(json_object_get(r, "server"));
  json_decref(r);
  if (!c->node || !c->server) {
    rc = connect_fail(SHARDD_E_NO_MEMORY, "cannot allocate the client");
    goto fail;
  }
  *out = c;
  return cok(c);
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

/* ------------------------------------------------------------------------ *
 * Arenas
 * ------------------------------------------------------------------------ */
static void arena_name(char *buf, size_t n) {
  static unsigned long counter;
  unsigned long k = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
  uint64_t rnd = 0;
  if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd)
    rnd = (uint64_t)now_ms() * 0x9E3779B97F4A7C15ull ^ (uintptr_t)buf;
  snprintf(buf, n, "/shardd-%ld-%lu-%016" PRIx64, (long)getpid(), k, rnd);
}

SHARDD_EXPORT int shardd_arena_create(shardd_client *c, size_t size, shardd_arena **out) {
  if (!c) return SHARDD_E_INVALID_ARGUMENT;
  if (!out) return cfail(c, SHARDD_E_INVALID_ARGUMENT, "arena_create: out is NULL");
  *out = NULL;
  if (size == 0) return cfail(c, SHARDD_E_INVALID_ARGUMENT, "arena size must be at least 1 byte");
  if ((uint64_t)size > (uint64_t)INT64_MAX)
    return cfail(c, SHARDD_E_INVALID_ARGUMENT, "arena size %zu is too large", size);
  int rc = conn_check(c);
  if (rc) return rc;
  shardd_arena *a = calloc(1, sizeof *a);
  if (!a) return cfail(c, SHARDD_E_NO_MEMORY, "cannot allocate the arena");

  int fd = -1;
  for (int tries = 0; fd < 0 && tries < 8; tries++) {
    arena_name(a->name, sizeof a->name);
    fd = shm_open(a->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    rc = cfail(c, SHARDD_E_IO, "shm_open %s: %s", a->name, strerror(errno));
    free(a);
    return rc;
  }
  int e = 0;
  while (ftruncate(fd, (off_t)size) < 0) {
    if (errno != EINTR) {
      e = errno;
      break;
    }
  }
  if (e) {
    close(fd);
    shm_unlink(a->name);
    rc = cfail(c, e == ENOSPC || e == EFBIG ? SHARDD_E_NO_SPACE : SHARDD_E_IO,
               "cannot size shm %s to %zu bytes: %s", a->name, size, strerror(e));
    free(a);
    return rc;
  }
  /* Allocating the pages now keeps that cost out of the first save's copies. */
  a->base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  e = errno;
  close(fd);
  if (a->base == MAP_FAILED) {
    shm_unlink(a->name);
    rc = cfail(c, e == ENOMEM ? SHARDD_E_NO_MEMORY : SHARDD_E_IO, "mmap shm %s (%zu bytes): %s",
               a->name, size, strerror(e));
    free(a);
    return rc;
  }
  a->size = size;
  /* MAP_POPULATE on a shared mapping only read-faults: the first store to
   * each page still takes a write fault (about 6 us a page on a VM, more
   * than the copy itself). One store per page here moves that cost out of
   * the save, where the trainer is blocked, into this one-time setup. */
  long page = sysconf(_SC_PAGESIZE);
  if (page <= 0) page = 4096;
  for (size_t off = 0; off < size; off += (size_t)page) ((volatile char *)a->base)[off] = 0;

  json_t *r = NULL;
  rc = request(c, json_pack("{s:s, s:s}", "op", "attach", "shm", a->name), &r);
  if (!rc) {
    json_t *reg = json_object_get(r, "region");
    if (!json_is_integer(reg))
      rc = cfail(c, SHARDD_E_PROTOCOL, "attach reply has no integer 'region'");
    else
      a->region = json_integer_value(reg);
    json_decref(r);
  }
  if (rc) {
    munmap(a->base, size);
    shm_unlink(a->name);
    free(a);
    return rc;
  }
  a->c = c;
  a->next = c->arenas;
  c->arenas = a;
  *out = a;
  return cok(c);
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
      rc = request(c, json_pack("{s:s, s:I}", "op", "detach", "region", (json_int_t)a->region), NULL);
    else
      cok(c);
  }
  munmap(a->base, a->size);
  shm_unlink(a->name);
  free(a);
  return rc;
}

/* ------------------------------------------------------------------------ *
 * Saves
 * ------------------------------------------------------------------------ */
/* The multi-node fields; the daemon checks them further. */
static int begin_peers(shardd_client *c, json_t *req, const shardd_save_opts *o) {
  if (o->node_rank < 0 || o->node_rank >= o->nnodes)
    return cfail(c, SHARDD_E_INVALID_ARGUMENT, "begin: node_rank %d is outside nnodes %d", o->node_rank, o->nnodes);
  json_t *leader = o->leader ? json_string(o->leader) : NULL;
  if (!leader)
    return cfail(c, SHARDD_E_INVALID_ARGUMENT, "begin: nnodes is %d but leader is NULL or not valid UTF-8", o->nnodes);
  json_object_set_new(req, "nnodes", json_integer(o->nnodes));
  json_object_set_new(req, "node_rank", json_integer(o->node_rank));
  json_object_set_new(req, "leader", leader);
  if (o->write_mode) {
    json_t *m = json_string(o->write_mode);
    if (!m) return cfail(c, SHARDD_E_INVALID_ARGUMENT, "begin: write_mode is not valid UTF-8");
    json_object_set_new(req, "write_mode", m);
  }
  return 0;
}

/* A non-negative decimal environment variable: 1 when set, 0 when unset, -1 when malformed. */
static int env_int(const char *name, int *out) {
  const char *s = getenv(name);
  if (!s || !*s) return 0;
  char *end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < 0 || v > INT_MAX) {
    connect_fail(SHARDD_E_INVALID_ARGUMENT, "environment variable %s='%.40s' is not a non-negative integer", name, s);
    return -1;
  }
  *out = (int)v;
  return 1;
}

SHARDD_EXPORT int shardd_save_opts_from_env(shardd_save_opts *o, char *leader_buf, size_t leader_len) {
  if (!o) return connect_fail(SHARDD_E_INVALID_ARGUMENT, "shardd_save_opts_from_env: opts is NULL");
  int rank = 0, world = 0, nnodes = 1, node = 0, local_rank = 0, local_world = 0, port = SHARDD_DEFAULT_PEER_PORT;
  int r;
  if ((r = env_int("RANK", &rank)) < 0) return SHARDD_E_INVALID_ARGUMENT;
  if (r == 0) return connect_fail(SHARDD_E_INVALID_ARGUMENT, "environment variable RANK is not set (run under torchrun)");
  if ((r = env_int("WORLD_SIZE", &world)) < 0) return SHARDD_E_INVALID_ARGUMENT;
  if (r == 0 || world < 1)
    return connect_fail(SHARDD_E_INVALID_ARGUMENT, "environment variable WORLD_SIZE is not set or is 0");
  if (rank >= world)
    return connect_fail(SHARDD_E_INVALID_ARGUMENT, "RANK=%d is outside WORLD_SIZE=%d", rank, world);
  int has_lw = env_int("LOCAL_WORLD_SIZE", &local_world);
  if (has_lw < 0) return SHARDD_E_INVALID_ARGUMENT;
  r = env_int("NNODES", &nnodes);
  if (r == 0) r = env_int("GROUP_WORLD_SIZE", &nnodes);
  if (r < 0) return SHARDD_E_INVALID_ARGUMENT;
  if (r == 0) nnodes = has_lw && local_world > 0 && world % local_world == 0 ? world / local_world : 1;
  if (nnodes < 1 || nnodes > world)
    return connect_fail(SHARDD_E_INVALID_ARGUMENT, "nnodes %d does not fit WORLD_SIZE=%d", nnodes, world);
  r = env_int("NODE_RANK", &node);
  if (r == 0) r = env_int("GROUP_RANK", &node);
  if (r < 0) return SHARDD_E_INVALID_ARGUMENT;
  if (r == 0 && nnodes > 1)
    return connect_fail(SHARDD_E_INVALID_ARGUMENT, "%d nodes but neither NODE_RANK nor GROUP_RANK is set", nnodes);
  if (node >= nnodes)
    return connect_fail(SHARDD_E_INVALID_ARGUMENT, "NODE_RANK=%d is outside %d nodes", node, nnodes);
  r = env_int("LOCAL_RANK", &local_rank);
  if (r < 0) return SHARDD_E_INVALID_ARGUMENT;
  if (r > 0 && has_lw > 0 && local_rank >= local_world)
    return connect_fail(SHARDD_E_INVALID_ARGUMENT, "LOCAL_RANK=%d is outside LOCAL_WORLD_SIZE=%d", local_rank,
                        local_world);
  o->rank = rank;
  o->world_size = world;
  o->nnodes = nnodes;
  o->node_rank = node;
  if (nnodes <= 1) {
    o->leader = NULL;
    return 0;
  }
  const char *explicit_leader = getenv("SHARDD_LEADER");
  const char *addr = getenv("MASTER_ADDR");
  if ((r = env_int("SHARDD_PEER_PORT", &port)) < 0) return SHARDD_E_INVALID_ARGUMENT;
  if (port < 1 || port > 65535)
    return connect_fail(SHARDD_E_INVALID_ARGUMENT, "SHARDD_PEER_PORT=%d is not a TCP port", port);
  if (!leader_buf || leader_len == 0)
    return connect_fail(SHARDD_E_INVALID_ARGUMENT, "shardd_save_opts_from_env: no buffer for the leader address");
  int n;
  if (explicit_leader && *explicit_leader)
    n = snprintf(leader_buf, leader_len, "%s", explicit_leader);
  else if (!addr || !*addr)
    return connect_fail(SHARDD_E_INVALID_ARGUMENT, "%d nodes but MASTER_ADDR (or SHARDD_LEADER) is not set", nnodes);
  else if (strchr(addr, ':') && addr[0] != '[')
    n = snprintf(leader_buf, leader_len, "[%s]:%d", addr, port); /* an IPv6 literal */
  else
    n = snprintf(leader_buf, leader_len, "%s:%d", addr, port);
  if (n < 0 || (size_t)n >= leader_len)
    return connect_fail(SHARDD_E_INVALID_ARGUMENT, "the leader address does not fit in %zu bytes", leader_len);
  o->leader = leader_buf;
  return 0;
}

SHARDD_EXPORT int shardd_begin(shardd_client *c, const shardd_save_opts *o) {
  if (!c) return SHARDD_E_INVALID_ARGUMENT;
  if (!o || !o->save || !o->dir)
    return cfail(c, SHARDD_E_INVALID_ARGUMENT, "begin: opts, save and dir are required");
  if (o->world_size < 1 || o->rank < 0 || o->rank >= o->world_size)
    return cfail(c, SHARDD_E_INVALID_ARGUMENT, "begin: rank %d is outside world_size %d", o->rank,
                 o->world_size);
  json_t *req = json_pack("{s:s, s:s, s:s, s:i, s:i}", "op", "begin", "save", o->save, "dir", o->dir,
                          "rank", o->rank, "world_size", o->world_size);
  if (!req) return cfail(c, SHARDD_E_INVALID_ARGUMENT, "begin: save or dir is not valid UTF-8");
  int rc = 0;
  if (o->max_shard_size) rc = set_u64(c, req, "max_shard_size", o->max_shard_size);
  if (!rc && o->prefix) {
    json_t *p = json_string(o->prefix);
    if (!p) rc = cfail(c, SHARDD_E_INVALID_ARGUMENT, "begin: prefix is not valid UTF-8");
    else json_object_set_new(req, "prefix", p);
  }
  if (!rc && o->nmetadata) {
    json_t *md = json_object();
    for (size_t i = 0; !rc && i < o->nmetadata; i++) {
      const char *k = o->metadata ? o->metadata[2 * i] : NULL;
      const char *v = o->metadata ? o->metadata[2 * i + 1] : NULL;
      json_t *jv = v ? json_string(v) : NULL;
      if (!k || !jv || json_object_set_new(md, k, jv) < 0)
        rc = cfail(c, SHARDD_E_INVALID_ARGUMENT,
                   "begin: metadata pair %zu is NULL or not valid UTF-8", i);
    }
    json_object_set_new(req, "metadata", md);
  }
  if (!rc && o->overwrite) json_object_set_new(req, "overwrite", json_true());
  if (!rc && o->nnodes > 1) rc = begin_peers(c, req, o);
  if (rc) {
    json_decref(req);
    return rc;
  }
  /* A save id may be reused after the save ended; an old "released" must not
   * let the caller overwrite memory the new save still needs. */
  json_object_del(c->released, o->save);
  return request(c, req, NULL);
}

/* copy: 0 the bytes are in place, 1 copy src there first, 2 they will be
 * in place later ("deferred", then shardd_ready or shardd_seal). */
static int put_arena(shardd_client *c, const char *save, const shardd_tensor_desc *t, shardd_arena *a,
                     uint64_t offset, const void *src, size_t len, int copy) {
  if (!c) return SHARDD_E_INVALID_ARGUMENT;
  json_t *req;
  uint64_t nbytes;
  int rc = put_request(c, save, t, &req, &nbytes);
  if (rc) return rc;
  if (!a || a->c != c) {
    json_decref(req);
    return cfail(c, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': arena is NULL or belongs to another client",
                 t->name);
  }
  if (offset > a->size || nbytes > a->size - offset) {
    json_decref(req);
    return cfail(c, SHARDD_E_OUT_OF_RANGE,
                 "tensor '%s': %" PRIu64 " bytes at offset %" PRIu64 " lie outside the %zu-byte arena",
                 t->name, nbytes, offset, a->size);
  }
  if (copy == 1) {
    if (len != nbytes) {
      json_decref(req);
      return cfail(c, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': got %zu bytes, the slice has %" PRIu64,
                   t->name, len, nbytes);
    }
    if (len) memcpy((char *)a->base + offset, src, len);
  }
  json_object_set_new(req, "region", json_integer(a->region));
  json_object_set_new(req, "offset", json_integer((json_int_t)offset));
  if (copy == 2) json_object_set_new(req, "deferred", json_true());
  return request(c, req, NULL);
}

SHARDD_EXPORT int shardd_put(shardd_client *c, const char *save, const shardd_tensor_desc *t,
                             shardd_arena *a, uint64_t offset) {
  return put_arena(c, save, t, a, offset, NULL, 0, 0);
}

SHARDD_EXPORT int shardd_put_deferred(shardd_client *c, const char *save, const shardd_tensor_desc *t,
                                      shardd_arena *a, uint64_t offset) {
  return put_arena(c, save, t, a, offset, NULL, 0, 2);
}

SHARDD_EXPORT int shardd_put_copy(shardd_client *c, const char *save, const shardd_tensor_desc *t,
                                  shardd_arena *a, uint64_t offset, const void *src, size_t len) {
  if (c && len && !src) return cfail(c, SHARDD_E_INVALID_ARGUMENT, "put_copy: src is NULL");
  return put_arena(c, save, t, a, offset, src, len, 1);
}

/* Sets key to the base64 text of data. */
static int set_b64(shardd_client *c, json_t *req, const char *key, const void *data, size_t len) {
  size_t elen = sd_b64_encoded_len(len);
  char *b = elen < SIZE_MAX ? malloc(elen + 1) : NULL;
  if (!b) return cfail(c, SHARDD_E_NO_MEMORY, "cannot encode %zu bytes as base64", len);
  sd_b64_encode(data, len, b);
  /* Base64 is ASCII, so jansson's UTF-8 scan of a possibly large string is wasted work. */
  json_t *s = json_stringn_nocheck(b, elen);
  free(b);
  if (!s) return cfail(c, SHARDD_E_NO_MEMORY, "cannot encode %zu bytes as base64", len);
  json_object_set_new(req, key, s);
  return 0;
}

SHARDD_EXPORT int shardd_put_inline(shardd_client *c, const char *save, const shardd_tensor_desc *t,
                                    const void *data, size_t len) {
  if (!c) return SHARDD_E_INVALID_ARGUMENT;
  json_t *req;
  uint64_t nbytes;
  int rc = put_request(c, save, t, &req, &nbytes);
  if (rc) return rc;
  if (len != nbytes || (len && !data)) {
    json_decref(req);
    return cfail(c, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': got %zu bytes, the slice has %" PRIu64,
                 t->name, data || !len ? len : 0, nbytes);
  }
  rc = set_b64(c, req, "data", data, len);
  if (rc) {
    json_decref(req);
    return rc;
  }
  return request(c, req, NULL);
}

SHARDD_EXPORT int shardd_file(shardd_client *c, const char *save, const char *path, const void *data,
                              size_t len) {
  if (!c) return SHARDD_E_INVALID_ARGUMENT;
  if (!save || !path || (len && !data))
    return cfail(c, SHARDD_E_INVALID_ARGUMENT, "file: save, path and data are required");
  json_t *req = json_pack("{s:s, s:s, s:s}", "op", "file", "save", save, "path", path);
  if (!req) return cfail(c, SHARDD_E_INVALID_ARGUMENT, "file '%s': save or path is not valid UTF-8", path);
  int rc = set_b64(c, req, "data", data, len);
  if (rc) {
    json_decref(req);
    return rc;
  }
  return request(c, req, NULL);
}

static int simple_op(shardd_client *c, const char *op, const char *save) {
  if (!c) return SHARDD_E_INVALID_ARGUMENT;
  if (!save) return cfail(c, SHARDD_E_INVALID_ARGUMENT, "%s: save id is NULL", op);
  json_t *req = json_pack("{s:s, s:s}", "op", op, "save", save);
  if (!req) return cfail(c, SHARDD_E_INVALID_ARGUMENT, "%s: save id is not valid UTF-8", op);
  return request(c, req, NULL);
}

SHARDD_EXPORT int shardd_seal(shardd_client *c, const char *save) { return simple_op(c, "seal", save); }
SHARDD_EXPORT int shardd_declared(shardd_client *c, const char *save) { return simple_op(c, "declared", save); }

SHARDD_EXPORT int shardd_ready(shardd_client *c, const char *save, shardd_arena *a, uint64_t upto) {
  if (!c) return SHARDD_E_INVALID_ARGUMENT;
  if (!save) return cfail(c, SHARDD_E_INVALID_ARGUMENT, "ready: save id is NULL");
  if (!a || a->c != c) return cfail(c, SHARDD_E_INVALID_ARGUMENT, "ready: arena is NULL or belongs to another client");
  if (upto > a->size)
    return cfail(c, SHARDD_E_OUT_OF_RANGE, "ready: %" PRIu64 " is past the end of the %zu-byte arena", upto, a->size);
  json_t *req = json_pack("{s:s, s:s, s:I, s:I}", "op", "ready", "save", save, "region", (json_int_t)a->region,
                          "upto", (json_int_t)upto);
  if (!req) return cfail(c, SHARDD_E_INVALID_ARGUMENT, "ready: save id is not valid UTF-8");
  return request(c, req, NULL);
}
SHARDD_EXPORT int shardd_abort(shardd_client *c, const char *save) { return simple_op(c, "abort", save); }

static int parse_result(shardd_client *c, const char *save, json_t *r, shardd_result *out) {
  const char *state = json_string_value(json_object_get(r, "state"));
  if (!state || strcmp(state, "committed") != 0)
    return cfail(c, SHARDD_E_PROTOCOL, "wait for '%s' answered ok with state '%s'", save,
                 state ? state : "(none)");
  if (!out) return 0;
  memset(out, 0, sizeof *out);
  const char *dir = json_string_value(json_object_get(r, "dir"));
  if (dir) {
    if (strlen(dir) >= sizeof out->dir)
      return cfail(c, SHARDD_E_PROTOCOL, "wait for '%s': dir is longer than %zu bytes", save,
                   sizeof out->dir - 1);
    strcpy(out->dir, dir);
  }
  json_int_t v;
  if ((v = json_integer_value(json_object_get(r, "files"))) > 0) out->files = (uint64_t)v;
  if ((v = json_integer_value(json_object_get(r, "tensors"))) > 0) out->tensors = (uint64_t)v;
  if ((v = json_integer_value(json_object_get(r, "bytes"))) > 0) out->bytes = (uint64_t)v;
  return 0;
}

SHARDD_EXPORT int shardd_wait(shardd_client *c, const char *save, int timeout_ms, shardd_result *out) {
  if (!c) return SHARDD_E_INVALID_ARGUMENT;
  if (!save) return cfail(c, SHARDD_E_INVALID_ARGUMENT, "wait: save id is NULL");
  int64_t deadline = deadline_in(timeout_ms);
  /* A wait that timed out stays in flight; asking again reuses it. */
  json_t *pending = json_object_get(c->waits, save);
  json_int_t id;
  int rc;
  if (pending) {
    id = json_integer_value(pending);
  } else {
    json_t *req = json_pack("{s:s, s:s}", "op", "wait", "save", save);
    if (!req) return cfail(c, SHARDD_E_INVALID_ARGUMENT, "wait: save id is not valid UTF-8");
    rc = send_request(c, req, &id);
    if (rc) return rc;
    json_object_set_new(c->waits, save, json_integer(id));
  }
  json_t *r;
  rc = await_reply(c, id, deadline, &r);
  if (rc == SHARDD_E_TIMEOUT)
    return cfail(c, SHARDD_E_TIMEOUT, "save '%s' did not end within %d ms", save, timeout_ms);
  if (rc) return rc;
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
  if (!save) return cfail(c, SHARDD_E_INVALID_ARGUMENT, "wait_released: save id is NULL");
  int64_t deadline = deadline_in(timeout_ms);
  for (;;) {
    json_t *none = NULL;
    /* id 0 is never used, so this only files events and parked replies. */
    int rc = pump(c, 0, &none);
    if (rc < 0) return rc;
    if (json_object_get(c->released, save)) return cok(c);
    rc = conn_check(c);
    if (rc) return rc;
    rc = recv_some(c, deadline);
    if (rc == SHARDD_E_TIMEOUT)
      return cfail(c, SHARDD_E_TIMEOUT, "save '%s': no 'released' within %d ms", save, timeout_ms);
    if (rc) return rc;
  }
}

SHARDD_EXPORT int shardd_status(shardd_client *c, char **json_out) {
  if (!c) return SHARDD_E_INVALID_ARGUMENT;
  if (!json_out) return cfail(c, SHARDD_E_INVALID_ARGUMENT, "status: json_out is NULL");
  *json_out = NULL;
  json_t *r;
  /* With the daemon's counters (the "metrics" object), for shardctl metrics. */
  int rc = request(c, json_pack("{s:s, s:b}", "op", "status", "metrics", 1), &r);
  if (rc) return rc;
  json_object_del(r, "id");
  json_object_del(r, "ok");
  *json_out = json_dumps(r, JSON_COMPACT);
  json_decref(r);
  if (!*json_out) return cfail(c, SHARDD_E_NO_MEMORY, "cannot encode the status reply");
  return 0;
}

SHARDD_EXPORT void shardd_free(void *p) { free(p); }

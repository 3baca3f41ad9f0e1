/* The HTTP metrics endpoint: libmicrohttpd answers on its own thread, the event loop renders the text (proto/prom.c). */
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "acceptor.h"
#include "log.h"
#include "metrics_http.h"
#include "ops.h"
#include "peer_auth.h"
#include "sd_prom.h"
#include "shardd/shardd.h"

/* How long a scrape waits for the loop before it gets 503 (a loop stuck
 * this long is what the systemd watchdog is for). */
#define RENDER_WAIT_S 10

/* Why a request: the HTTP thread must not read the daemon's state, which
 * only the loop thread touches. On each scrape it bumps `asked`, wakes the
 * loop with uv_async_send and waits on `cv` until the loop has rendered a
 * snapshot at least that new. Rendering on demand (rather than a timer
 * refreshing a snapshot) keeps the figures current at the moment of the
 * scrape, costs nothing while nobody scrapes, and the loop never blocks on
 * the HTTP thread: it holds the mutex only to swap the text in. */
struct sd_metrics_http {
  sd_daemon *d;
  struct MHD_Daemon *mhd;
  uv_async_t wake;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t asked, answered; /* under mu */
  char *text;               /* under mu: the latest rendering */
  size_t len;
  int stopping;             /* under mu */
};

/* ------------------------------------------------------------------------ *
 * The loop thread
 * ------------------------------------------------------------------------ */
static void on_wake(uv_async_t *a) {
  sd_metrics_http *h = a->data;
  pthread_mutex_lock(&h->mu);
  uint64_t target = h->asked;
  int want = target > h->answered && !h->stopping;
  pthread_mutex_unlock(&h->mu);
  if (!want) return;
  json_t *st = json_object();
  char *text = NULL;
  size_t len = 0;
  if (st) {
    sd_ops_status_fill(h->d, st, 1);
    text = sd_prom_render(st, json_object_get(st, "metrics"), SHARDD_VERSION_STRING, &len);
    json_decref(st);
  }
  pthread_mutex_lock(&h->mu);
  free(h->text);
  h->text = text; /* NULL (out of memory): the waiters answer 500 */
  h->len = len;
  h->answered = target;
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
}

/* ------------------------------------------------------------------------ *
 * The HTTP thread
 * ------------------------------------------------------------------------ */
static enum MHD_Result reply(struct MHD_Connection *conn, unsigned code, const char *body, size_t len,
                             const char *type, const char *allow) {
  struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
  if (!r) return MHD_NO;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  if (allow) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
  enum MHD_Result ret = MHD_queue_response(conn, code, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result plain(struct MHD_Connection *conn, unsigned code, const char *msg, const char *allow) {
  return reply(conn, code, msg, strlen(msg), "text/plain; charset=utf-8", allow);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **state) {
  (void)version;
  (void)upload;
  (void)upload_size;
  (void)state;
  sd_metrics_http *h = cls;
  if (strcmp(url, "/metrics") != 0) return plain(conn, MHD_HTTP_NOT_FOUND, "not found: try /metrics\n", NULL);
  if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
    return plain(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed: /metrics takes GET\n", "GET, HEAD");

  pthread_mutex_lock(&h->mu);
  uint64_t mine = ++h->asked;
  uv_async_send(&h->wake);
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_sec += RENDER_WAIT_S;
  int rc = 0;
  while (h->answered < mine && !h->stopping && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&h->cv, &h->mu, &until);
  enum MHD_Result ret;
  if (h->answered >= mine && h->text)
    ret = reply(conn, MHD_HTTP_OK, h->text, h->len, "text/plain; version=0.0.4; charset=utf-8", NULL);
  else if (h->answered >= mine)
    ret = plain(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory rendering the metrics\n", NULL);
  else
    ret = plain(conn, MHD_HTTP_SERVICE_UNAVAILABLE,
                h->stopping ? "shardd is shutting down\n" : "shardd's event loop did not answer in time\n", NULL);
  pthread_mutex_unlock(&h->mu);
  return ret;
}

/* ------------------------------------------------------------------------ *
 * Start and stop
 * ------------------------------------------------------------------------ */
static int bind_listener(const char *addr, int *out, unsigned *bound_port, sd_error *err) {
  char host[256];
  unsigned port = 0;
  sd_error e = {0};
  if (sd_peer_addr_split(addr, host, sizeof host, &port, &e) != 0)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "metrics_listen '%.100s' must be HOST:PORT or [IPV6]:PORT, the port 0 to 65535", addr);
  struct sockaddr_storage ss;
  const char *why = NULL;
  int fd = -1, rc = sd_tcp_listen(host, port, 64, 0, &fd, &ss, &why);
  if (rc == 1) return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "cannot serve metrics on %s: %s", addr, why);
  if (rc < 0) return sd_fail(err, SHARDD_E_IO, "cannot serve metrics on %s: %s", addr, strerror(-rc));
  *bound_port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                         : ntohs(((struct sockaddr_in *)&ss)->sin_port);
  *out = fd;
  return 0;
}

static void free_http(sd_metrics_http *h) {
  pthread_cond_destroy(&h->cv);
  pthread_mutex_destroy(&h->mu);
  free(h->text);
  free(h);
}

int sd_metrics_http_start(sd_daemon *d, const char *addr, sd_metrics_http **out, sd_error *err) {
  *out = NULL;
  int fd = -1;
  unsigned port = 0;
  int rc = bind_listener(addr, &fd, &port, err);
  if (rc) return rc;
  sd_metrics_http *h = calloc(1, sizeof *h);
  if (!h) {
    close(fd);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory");
  }
  h->d = d;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&h->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&h->mu, NULL);
  uv_async_init(d->loop, &h->wake, on_wake);
  h->wake.data = h;
  uv_unref((uv_handle_t *)&h->wake); /* scrapes alone do not keep the daemon running */
  /* The HTTP thread inherits this mask: signals stay with the loop's thread. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  h->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO, 0, NULL, NULL, on_request, h,
                            MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_LIMIT, (unsigned)16,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (!h->mhd) {
    close(fd);
    uv_close((uv_handle_t *)&h->wake, NULL);
    uv_run(d->loop, UV_RUN_NOWAIT); /* the handle is closed before h goes */
    free_http(h);
    return sd_fail(err, SHARDD_E_IO, "cannot serve metrics on %s: libmicrohttpd did not start", addr);
  }
  /* The host as given (brackets kept), the port as bound: port 0 shows the one picked. */
  sd_log_info("metrics: serving http://%.*s:%u/metrics", (int)(strrchr(addr, ':') - addr), addr, port);
  *out = h;
  return 0;
}

static void on_wake_closed(uv_handle_t *a) { free_http(a->data); }

void sd_metrics_http_stop(sd_metrics_http *h) {
  if (!h) return;
  pthread_mutex_lock(&h->mu);
  h->stopping = 1;
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
  /* Joins the HTTP thread; a scrape waiting for us has just been told to give up. */
  MHD_stop_daemon(h->mhd);
  h->mhd = NULL;
  uv_close((uv_handle_t *)&h->wake, on_wake_closed);
}

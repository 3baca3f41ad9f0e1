/* Accepting connections without starving: the descriptor limit, a budget, the spare descriptor on EMFILE. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "acceptor.h"
#include "log.h"

/* Accepts per wakeup: other work (replies, the writer) runs in between. */
#define ACCEPT_BATCH 64
/* EMFILE is logged at once, then at most this often with a count. */
#define EMFILE_LOG_MS 10000
#define RETRY_MS 100

void sd_fd_limit_raise(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    sd_log_warn("cannot read the descriptor limit: %s", strerror(errno));
    return;
  }
  rlim_t was = rl.rlim_cur;
  if (rl.rlim_cur != rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
      sd_log_warn("cannot raise the descriptor limit from %llu to %llu: %s", (unsigned long long)was,
                  (unsigned long long)rl.rlim_max, strerror(errno));
      return;
    }
  }
  sd_log_info("descriptor limit: %llu (soft was %llu, hard %llu)", (unsigned long long)rl.rlim_cur,
              (unsigned long long)was, (unsigned long long)rl.rlim_max);
}

uint64_t sd_fd_limit(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return UINT64_MAX;
  return rl.rlim_cur;
}

int sd_fd_over_budget(int fd, unsigned reserve) {
  uint64_t limit = sd_fd_limit();
  return limit != UINT64_MAX && (uint64_t)fd + 1 + reserve > limit;
}

/* One descriptor held back for the moment the table is full: freeing it
 * lets accept take the waiting connection off the queue (and close it),
 * instead of the listener waking forever on a connection it cannot take. */
static int spare_fd = -1;

static void spare_open(void) {
  if (spare_fd < 0) spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

static void log_dropped(sd_acceptor *a, int e) {
  uint64_t now = uv_now(a->poll.loop);
  if (a->logged_at && now - a->logged_at < EMFILE_LOG_MS) return;
  sd_log_warn("%s: out of descriptors (%s, limit %llu): closed %llu connection%s unanswered with the spare"
              " descriptor since the last report; raise LimitNOFILE or lower max_connections",
              a->what, strerror(e), (unsigned long long)sd_fd_limit(),
              (unsigned long long)(a->dropped - a->dropped_logged), a->dropped - a->dropped_logged == 1 ? "" : "s");
  a->logged_at = now ? now : 1;
  a->dropped_logged = a->dropped;
}

static void on_poll(uv_poll_t *h, int status, int events);

static void on_retry(uv_timer_t *t) {
  sd_acceptor *a = t->data;
  if (a->closing || a->polling) return;
  spare_open();
  if (uv_poll_start(&a->poll, UV_READABLE, on_poll) == 0) a->polling = 1;
}

/* EMFILE/ENFILE: 0 when a connection was taken off the queue and closed,
 * -1 when there was no spare to make room with. */
static int drop_one(sd_acceptor *a, int e) {
  if (spare_fd < 0) spare_open();
  if (spare_fd < 0) return -1;
  close(spare_fd);
  spare_fd = -1;
  int c = accept4(a->fd, NULL, NULL, SOCK_CLOEXEC);
  int ae = errno;
  if (c >= 0) close(c);
  spare_open();
  if (c >= 0) {
    a->dropped++;
    log_dropped(a, e);
  }
  return c >= 0 || ae == EAGAIN || ae == EWOULDBLOCK ? 0 : -1;
}

static void on_poll(uv_poll_t *h, int status, int events) {
  (void)events;
  sd_acceptor *a = h->data;
  if (status < 0) {
    sd_log_warn("%s: %s", a->what, uv_strerror(status));
    return;
  }
  for (int i = 0; i < ACCEPT_BATCH && !a->closing; i++) {
    int fd = accept4(a->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      a->on_accept(a->ud, fd);
      continue;
    }
    int e = errno;
    if (e == EAGAIN || e == EWOULDBLOCK) return;
    if (e == EINTR || e == ECONNABORTED) continue;
    if ((e == EMFILE || e == ENFILE) && drop_one(a, e) == 0) continue;
    /* No descriptor to make room with, or an unexpected error: pause, not spin. */
    if (e != EMFILE && e != ENFILE) sd_log_warn("%s: accept failed: %s", a->what, strerror(e));
    else log_dropped(a, e);
    uv_poll_stop(&a->poll);
    a->polling = 0;
    uv_timer_start(&a->retry, on_retry, RETRY_MS, 0);
    return;
  }
}

int sd_acceptor_start(sd_acceptor *a, uv_loop_t *loop, int listen_fd, const char *what, sd_accept_fn fn,
                      void *ud) {
  memset(a, 0, sizeof *a);
  a->fd = listen_fd;
  a->what = what;
  a->on_accept = fn;
  a->ud = ud;
  spare_open();
  int fl = fcntl(listen_fd, F_GETFL);
  int rc = fl < 0 || fcntl(listen_fd, F_SETFL, fl | O_NONBLOCK) < 0 ? uv_translate_sys_error(errno) : 0;
  if (!rc) rc = uv_poll_init(loop, &a->poll, listen_fd);
  if (rc) {
    close(listen_fd);
    a->fd = -1;
    a->closing = 1;
    return rc;
  }
  a->poll.data = a;
  uv_timer_init(loop, &a->retry);
  a->retry.data = a;
  a->open_handles = 2;
  uv_unref((uv_handle_t *)&a->retry);
  rc = uv_poll_start(&a->poll, UV_READABLE, on_poll);
  if (rc) {
    sd_acceptor_stop(a);
    return rc;
  }
  a->polling = 1;
  return 0;
}

static void on_closed(uv_handle_t *h) {
  sd_acceptor *a = h->data;
  if (--a->open_handles == 0 && a->on_stopped) a->on_stopped(a->ud);
}

void sd_acceptor_stop(sd_acceptor *a) {
  if (a->closing) return;
  a->closing = 1;
  a->polling = 0;
  uv_close((uv_handle_t *)&a->poll, on_closed);
  uv_close((uv_handle_t *)&a->retry, on_closed);
  if (a->fd >= 0) close(a->fd);
  a->fd = -1;
}

int sd_tcp_listen(const char *host, unsigned port, int backlog, int nonblock, int *out, struct sockaddr_storage *ss,
                  const char **why) {
  char ports[16];
  snprintf(ports, sizeof ports, "%u", port);
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  int g = getaddrinfo(host, ports, &hints, &res);
  if (g != 0 || !res) {
    *why = gai_strerror(g);
    return 1;
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), 0), on = 1;
  int rc = fd < 0 ? -errno : 0;
  if (!rc && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) < 0) rc = -errno;
  if (!rc && bind(fd, res->ai_addr, res->ai_addrlen) < 0) rc = -errno;
  if (!rc && listen(fd, backlog) < 0) rc = -errno;
  freeaddrinfo(res);
  socklen_t len = sizeof *ss;
  if (!rc && getsockname(fd, (struct sockaddr *)ss, &len) < 0) rc = -errno;
  if (rc < 0) {
    if (fd >= 0) close(fd);
    return rc;
  }
  *out = fd;
  return 0;
}

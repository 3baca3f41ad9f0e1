/* shardd entry point: settings, root, writer, socket (bound or from systemd), signals, notifications, clean shutdown. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "acceptor.h"
#include "cluster.h"
#include "config.h"
#include "config_check.h"
#include "listener.h"
#include "log.h"
#include "metrics.h"
#include "metrics_http.h"
#include "ops.h"
#include "pathsafe.h"
#include "publish.h"
#include "save.h"
#include "sdnotify.h"
#include "session.h"

/* systemd gets STATUS= at most this often, and only when the text changed. */
#define STATUS_PERIOD_MS 1000

static sd_daemon daemon_state;
static sd_config cfg;               /* SIGHUP updates the reloadable settings in place */
static uv_signal_t sig_term, sig_int, sig_hup;
static uv_timer_t watchdog_timer, status_timer;
static int idle_done, activated;
/* ROOT/.shardd-lock, held until the process exits (rootlock.h). */
static int root_lock_fd = -1;
static char socket_shown[PATH_MAX]; /* what the daemon listens on, for logs */
static char last_status[256];
static sd_metrics_http *metrics_http; /* GET /metrics, with metrics_listen */

/* ------------------------------------------------------------------------ *
 * Logging and systemd notifications
 * ------------------------------------------------------------------------ */
static void apply_log_settings(const sd_config *c) {
  sd_log_set_level(c->log_level);
  sd_log_set_syslog_prefix(c->log_syslog_prefix == SD_SYSLOG_YES ||
                           (c->log_syslog_prefix == SD_SYSLOG_AUTO && sd_log_stderr_is_journal()));
}

static void status_text(const sd_daemon *d, char *buf, size_t n) {
  size_t writing = 0;
  for (const sd_save *s = d->saves; s; s = s->next) writing += s->state == SD_SAVE_WRITING;
  snprintf(buf, n, "%zu save%s in flight (%zu writing), %zu client%s; %llu committed, %llu failed", d->nsaves,
           d->nsaves == 1 ? "" : "s", writing, d->nsessions, d->nsessions == 1 ? "" : "s",
           (unsigned long long)d->counters.saves_committed, (unsigned long long)d->counters.saves_failed);
}

static void notify_status(const sd_daemon *d) {
  char buf[sizeof last_status];
  status_text(d, buf, sizeof buf);
  if (strcmp(buf, last_status) == 0) return;
  snprintf(last_status, sizeof last_status, "%s", buf);
  if (sd_sys_notify_status("%s", buf) < 0) sd_log_debug("cannot send STATUS= to systemd");
}

static void on_status_tick(uv_timer_t *t) { notify_status(t->data); }

/* From the loop thread on purpose: a stuck loop stops the pings and
 * systemd restarts the daemon. */
static void on_watchdog(uv_timer_t *t) {
  (void)t;
  if (sd_sys_notify_watchdog() < 0) sd_log_debug("cannot send WATCHDOG=1 to systemd");
}

static void start_notify_timers(sd_daemon *d) {
  uint64_t wd = sd_sys_watchdog_usec();
  if (wd) {
    uint64_t ms = wd / 2000 ? wd / 2000 : 1;
    uv_timer_init(d->loop, &watchdog_timer);
    uv_timer_start(&watchdog_timer, on_watchdog, ms, ms);
    uv_unref((uv_handle_t *)&watchdog_timer);
    sd_log_debug("systemd watchdog: %llu ms, pinging every %llu ms", (unsigned long long)(wd / 1000),
                 (unsigned long long)ms);
  }
  const char *ns = getenv("NOTIFY_SOCKET");
  if (ns && *ns) {
    uv_timer_init(d->loop, &status_timer);
    status_timer.data = d;
    uv_timer_start(&status_timer, on_status_tick, STATUS_PERIOD_MS, STATUS_PERIOD_MS);
    uv_unref((uv_handle_t *)&status_timer);
  }
}

/* ------------------------------------------------------------------------ *
 * Signals
 * ------------------------------------------------------------------------ */

static void on_writer_closed(void *ud) {
  sd_daemon *d = ud;
  d->writer = NULL;
}

/* Shutdown, second half: nothing is in flight any more. */
static void on_idle(sd_daemon *d) {
  if (idle_done) return;
  idle_done = 1;
  sd_session_close_all(d);
  sd_cluster_shutdown(d);
  if (d->writer) sd_writer_close(d->writer, on_writer_closed, d);
  /* Still armed (a second signal exits at once) but no longer keeping the loop alive. */
  uv_unref((uv_handle_t *)&sig_term);
  uv_unref((uv_handle_t *)&sig_int);
}

static void on_signal(uv_signal_t *h, int signum) {
  sd_daemon *d = h->data;
  if (d->shutting_down) {
    sd_log_warn("second %s: exiting now", strsignal(signum));
    if (!activated) unlink(d->cfg->socket_path);
    _exit(1);
  }
  sd_sys_notify_stopping();
  sd_log_info("%s: shutting down (%zu saves in flight, %zu clients)", strsignal(signum), d->nsaves,
              d->nsessions);
  d->shutting_down = 1;
  d->on_idle = on_idle;
  /* First, while the loop still runs: the HTTP thread is joined here, its uv handle closed by the loop. */
  sd_metrics_http_stop(metrics_http);
  metrics_http = NULL;
  sd_listener_close(d);
  sd_save_fail_all(d, SHARDD_E_SHUTTING_DOWN, "the daemon is shutting down");
  if (d->nsaves == 0) on_idle(d);
}

/* SIGHUP: reread the file; apply what may change while running, say what may not. */
static void on_hup(uv_signal_t *h, int signum) {
  (void)signum;
  sd_daemon *d = h->data;
  if (d->shutting_down) return;
  sd_sys_notify_reloading();
  sd_log_info("SIGHUP: rereading the configuration (%s)", cfg.config_path ? cfg.config_path : "no config file");
  unsigned applied = 0;
  sd_error err = {0};
  if (sd_config_reload(&cfg, &applied, &err) != 0) {
    sd_log_error("reload failed, nothing changed: %s", err.msg);
    d->counters.reloads++;
    d->counters.reloads_failed++;
  } else {
    apply_log_settings(&cfg);
    sd_log_info("reload done: %u setting%s applied", applied, applied == 1 ? "" : "s");
    d->counters.reloads++;
  }
  sd_sys_notify_ready(last_status[0] ? last_status : NULL);
}

/* ------------------------------------------------------------------------ *
 * Start-up
 * ------------------------------------------------------------------------ */
/* Socket activation: *fd gets the first descriptor systemd passed, or -1 when none. */
static int activation_fd(int *fd, sd_error *err) {
  int fds[8];
  *fd = -1;
  int n = sd_sys_listen_fds(fds, 8, err);
  if (n <= 0) return n;
  if (!sd_sys_is_unix_stream_listener(fds[0]))
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "socket activation passed descriptor %d, which is not a listening Unix stream socket", fds[0]);
  for (int i = 1; i < n; i++) {
    sd_log_warn("socket activation passed %d sockets; only the first is used, descriptor %d is closed", n, fds[i]);
    close(fds[i]);
  }
  struct sockaddr_un sa;
  socklen_t len = sizeof sa;
  memset(&sa, 0, sizeof sa);
  if (getsockname(fds[0], (struct sockaddr *)&sa, &len) == 0 && sa.sun_path[0])
    snprintf(socket_shown, sizeof socket_shown, "%.*s", (int)sizeof sa.sun_path, sa.sun_path);
  else
    snprintf(socket_shown, sizeof socket_shown, "descriptor %d from systemd", fds[0]);
  *fd = fds[0];
  return 0;
}

static void close_walk(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h)) uv_close(h, NULL);
}

/* Descriptors 0-2 stay taken (on /dev/null when closed at start), so a
 * descriptor a client passes never lands there: libuv never closes those. */
static void stdio_hold(void) {
  for (int fd = 0; fd < 3; fd++) {
    if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
    int n = open("/dev/null", O_RDWR);
    if (n > 2) close(n);
  }
}

/* libuv sizes its threadpool once, at the first uv_queue_work: it must hold
 * every copy trip plus the multi-node forwarding copies and folder work
 * (cluster_xfer.c, cluster_lead.c, cluster_base.c), or copies queue behind
 * fsyncs. A larger UV_THREADPOOL_SIZE from the environment stays. */
static void size_threadpool(unsigned copy_threads) {
  unsigned want = copy_threads + 4;
  const char *env = getenv("UV_THREADPOOL_SIZE");
  if (env && *env && strtoul(env, NULL, 10) >= want) return;
  if (want > 1024) want = 1024; /* libuv's own cap */
  char buf[16];
  snprintf(buf, sizeof buf, "%u", want);
  setenv("UV_THREADPOOL_SIZE", buf, 1);
}

int main(int argc, char **argv) {
  int code = 0;
  stdio_hold();
  if (sd_config_load(&cfg, argc, argv, &code)) {
    sd_config_free(&cfg);
    return code;
  }
  apply_log_settings(&cfg);
  signal(SIGPIPE, SIG_IGN);
  sd_fd_limit_raise();

  sd_error err = {0};
  sd_daemon *d = &daemon_state;
  d->counters.t_start = uv_hrtime();
  d->root_fd = -1;
  /* The floors meet here: the save core tells the sessions, saves on several
   * nodes carry the cluster's hooks, connections go to the sessions. */
  d->save_owner = &sd_session_save_owner;
  d->multi_node = &sd_cluster_save_ext;
  d->on_client = sd_session_accept;
  d->on_request = sd_ops_dispatch;
  d->metrics_view = sd_metrics_json;
  /* First: the variables are meant for this process alone and are removed
   * from the environment before anything could inherit them. */
  int listen_fd = -1;
  if (activation_fd(&listen_fd, &err) != 0) goto fail;
  if (sd_config_prepare_root(&cfg, &err) != 0) goto fail;
  /* Now, not after the ranks have copied their bytes for a first save that then cannot publish. */
  if (sd_config_check_root(cfg.root, &err) != 0) goto fail;
  d->cfg = &cfg;
  d->loop = uv_default_loop();
  if (gethostname(d->node, sizeof d->node - 1) != 0) snprintf(d->node, sizeof d->node, "localhost");

  if (sd_root_open(cfg.root, &d->root_fd, &err) != 0) goto fail;
  if (sd_cluster_claim_root(&cfg, d->root_fd, &root_lock_fd, &err) != 0) goto fail;
  size_threadpool(cfg.copy_threads);
  sd_writer_opts wopts = {.queue_depth = cfg.queue_depth, .staging_bytes = (uint64_t)cfg.staging_mib << 20,
                          .copy_threads = cfg.copy_threads, .max_open_files = cfg.max_open_files};
  if (sd_writer_init_opts(&d->writer, d->loop, &wopts, &err) != 0) goto fail;
  uv_signal_init(d->loop, &sig_term);
  uv_signal_init(d->loop, &sig_int);
  sig_term.data = sig_int.data = d;
  uv_signal_start(&sig_term, on_signal, SIGTERM);
  uv_signal_start(&sig_int, on_signal, SIGINT);
  uv_signal_init(d->loop, &sig_hup);
  sig_hup.data = d;
  uv_signal_start(&sig_hup, on_hup, SIGHUP);
  uv_unref((uv_handle_t *)&sig_hup);
  if (listen_fd >= 0) {
    activated = 1;
    if (sd_listener_adopt(d, listen_fd, &err) != 0) goto fail;
    sd_log_info("socket activation: accepting on %s (settings socket, socket_mode and socket_group are systemd's"
                " to apply)", socket_shown);
  } else {
    if (sd_listener_open(d, &err) != 0) goto fail;
    snprintf(socket_shown, sizeof socket_shown, "%s", cfg.socket_path);
  }
  if (sd_cluster_init(d, &err) != 0) goto fail; /* peer daemons, with --peer-listen */
  if (*cfg.metrics_listen && sd_metrics_http_start(d, cfg.metrics_listen, &metrics_http, &err) != 0) goto fail;

  sd_log_info("shardd %s listening on %s, root %s%s%s", SHARDD_VERSION_STRING, socket_shown, cfg.root,
              cfg.config_path ? ", config " : "", cfg.config_path ? cfg.config_path : "");
  start_notify_timers(d);
  status_text(d, last_status, sizeof last_status);
  if (sd_sys_notify_ready(last_status) < 0) sd_log_warn("cannot send READY=1 to systemd (NOTIFY_SOCKET)");
  uv_run(d->loop, UV_RUN_DEFAULT);

  uv_walk(d->loop, close_walk, NULL);
  uv_run(d->loop, UV_RUN_DEFAULT);
  if (uv_loop_close(d->loop) != 0) sd_log_debug("the event loop still had handles at exit");
  sd_save_history_free(d);
  close(d->root_fd);
  sd_log_info("stopped");
  sd_config_free(&cfg);
  return 0;

fail:
  sd_log_error("%s: %s", sd_err_name(err.code), err.msg);
  sd_sys_notify_status("failed to start: %s", err.msg);
  sd_listener_close(d); /* a socket already bound must not outlive us */
  if (d->writer) sd_writer_close(d->writer, NULL, NULL);
  if (d->root_fd >= 0) close(d->root_fd);
  sd_config_free(&cfg);
  return 1;
}

/* shardd entry point: settings, root, writer, socket, signals, and a clean shutdown. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "listener.h"
#include "log.h"
#include "ops.h"
#include "publish.h"
#include "save.h"
#include "session.h"

static sd_daemon daemon_state;
static uv_signal_t sig_term, sig_int;
static int idle_done;

static void on_writer_closed(void *ud) {
  sd_daemon *d = ud;
  d->writer = NULL;
}

/* Shutdown, second half: nothing is in flight any more. */
static void on_idle(sd_daemon *d) {
  if (idle_done) return;
  idle_done = 1;
  sd_session_close_all(d);
  if (d->writer) sd_writer_close(d->writer, on_writer_closed, d);
  /* Still armed (a second signal exits at once) but no longer keeping the loop alive. */
  uv_unref((uv_handle_t *)&sig_term);
  uv_unref((uv_handle_t *)&sig_int);
}

static void on_signal(uv_signal_t *h, int signum) {
  sd_daemon *d = h->data;
  if (d->shutting_down) {
    sd_log_warn("second %s: exiting now", strsignal(signum));
    unlink(d->cfg->socket_path);
    _exit(1);
  }
  sd_log_info("%s: shutting down (%zu saves in flight, %zu clients)", strsignal(signum), d->nsaves,
              d->nsessions);
  d->shutting_down = 1;
  d->on_idle = on_idle;
  sd_listener_close(d);
  sd_save_fail_all(d, SHARDD_E_SHUTTING_DOWN, "the daemon is shutting down");
  if (d->nsaves == 0) on_idle(d);
}

static void close_walk(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h)) uv_close(h, NULL);
}

int main(int argc, char **argv) {
  sd_config cfg;
  int code = 0;
  if (sd_config_parse(&cfg, argc, argv, &code)) {
    sd_config_free(&cfg);
    return code;
  }
  sd_log_set_level(cfg.log_level);
  signal(SIGPIPE, SIG_IGN);

  sd_error err = {0};
  sd_daemon *d = &daemon_state;
  d->root_fd = -1;
  if (sd_config_prepare_root(&cfg, &err) != 0) goto fail;
  d->cfg = &cfg;
  d->loop = uv_default_loop();
  if (gethostname(d->node, sizeof d->node - 1) != 0) snprintf(d->node, sizeof d->node, "localhost");

  if (sd_root_open(cfg.root, &d->root_fd, &err) != 0) goto fail;
  if (sd_cleanup_stale(d->root_fd, &err) != 0) {
    sd_log_warn("cleaning stale temporary folders: %s", err.msg);
    sd_error_clear(&err);
  }
  if (sd_writer_init(&d->writer, d->loop, cfg.queue_depth, &err) != 0) goto fail;
  uv_signal_init(d->loop, &sig_term);
  uv_signal_init(d->loop, &sig_int);
  sig_term.data = sig_int.data = d;
  uv_signal_start(&sig_term, on_signal, SIGTERM);
  uv_signal_start(&sig_int, on_signal, SIGINT);
  if (sd_listener_open(d, &err) != 0) goto fail;

  sd_log_info("shardd %s listening on %s, root %s", SHARDD_VERSION_STRING, cfg.socket_path, cfg.root);
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
  if (d->writer) sd_writer_close(d->writer, NULL, NULL);
  if (d->root_fd >= 0) close(d->root_fd);
  sd_config_free(&cfg);
  return 1;
}

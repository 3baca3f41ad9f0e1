/* systemd integration through a real daemon: sd_notify messages, socket activation with the LISTEN_PID check, journal log prefixes. */
#include <criterion/criterion.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "ops_util.h"

TestSuite(systemd, .init = o_scratch, .fini = h_teardown, .timeout = 100);

/* ------------------------------------------------------------------------ *
 * A stand-in for systemd's notify socket
 * ------------------------------------------------------------------------ */
static int notify_fd = -1;
static char notify_env[PATH_MAX + 32];

static void notify_open(void) {
  char path[PATH_MAX];
  o_path(path, sizeof path, "notify");
  cr_assert_lt(strlen(path), sizeof(((struct sockaddr_un *)0)->sun_path));
  notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  cr_assert(notify_fd >= 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  memcpy(sa.sun_path, path, strlen(path) + 1);
  cr_assert_eq(bind(notify_fd, (struct sockaddr *)&sa, sizeof sa), 0, "bind %s: %s", path, strerror(errno));
  snprintf(notify_env, sizeof notify_env, "NOTIFY_SOCKET=%s", path);
}

/* Reads datagrams until one holds want (all of them appended to seen);
 * fails after a generous bound so a missing message cannot hang the suite. */
static void notify_expect(const char *want, char *seen, size_t n) {
  for (int waited = 0; waited < 20000;) {
    struct pollfd p = {.fd = notify_fd, .events = POLLIN};
    int r = poll(&p, 1, 100);
    if (r <= 0) {
      waited += 100;
      continue;
    }
    char msg[4096];
    ssize_t len = recv(notify_fd, msg, sizeof msg - 1, 0);
    if (len <= 0) continue;
    msg[len] = 0;
    size_t have = strlen(seen);
    snprintf(seen + have, n - have, "%s\n--\n", msg);
    if (strstr(msg, want)) return;
  }
  cr_assert_fail("the daemon never sent '%s'; it sent:\n%s", want, seen);
}

static char seen[1 << 16];

Test(systemd, notify_ready_status_watchdog_reloading_stopping) {
  notify_open();
  /* 200 ms watchdog: pings every 100 ms. */
  const char *env[] = {notify_env, "WATCHDOG_USEC=200000", NULL};
  o_start(NULL, env);
  notify_expect("READY=1", seen, sizeof seen);
  cr_assert(strstr(seen, "STATUS=0 saves in flight"), "READY=1 came without STATUS=:\n%s", seen);
  notify_expect("WATCHDOG=1", seen, sizeof seen);

  /* A save in flight shows in STATUS= (sent when the text changes). */
  shardd_client *c = NULL;
  cr_assert_eq(shardd_connect(H.sock, &c), 0, "%s", shardd_last_error(NULL));
  shardd_save_opts o = {.save = "held", .dir = "held", .rank = 0, .world_size = 2};
  cr_assert_eq(shardd_begin(c, &o), 0, "%s", shardd_last_error(c));
  notify_expect("STATUS=1 save in flight (0 writing), 1 client;", seen, sizeof seen);
  cr_assert_eq(shardd_abort(c, "held"), 0, "%s", shardd_last_error(c));
  shardd_close(c);
  notify_expect("STATUS=0 saves in flight (0 writing), 0 clients; 0 committed, 1 failed", seen, sizeof seen);

  /* SIGHUP: RELOADING=1, then READY=1 again. */
  seen[0] = 0;
  cr_assert_eq(kill(H.pid, SIGHUP), 0);
  notify_expect("RELOADING=1", seen, sizeof seen);
  notify_expect("READY=1", seen, sizeof seen);

  cr_assert_eq(kill(H.pid, SIGTERM), 0);
  notify_expect("STOPPING=1", seen, sizeof seen);
  int st = h_reap(H.pid);
  H.pid = 0;
  cr_assert(o_exited(st, 0), "status 0x%x", st);
  close(notify_fd);
}

/* ------------------------------------------------------------------------ *
 * Socket activation
 * ------------------------------------------------------------------------ */
static int listen_at(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cr_assert(fd >= 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  cr_assert_lt(strlen(path), sizeof sa.sun_path);
  memcpy(sa.sun_path, path, strlen(path) + 1);
  cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0, "bind: %s", strerror(errno));
  cr_assert_eq(listen(fd, 16), 0);
  return fd;
}

/* Like systemd: the socket is descriptor 3, LISTEN_FDS=1, and LISTEN_PID is
 * set by the process itself right before exec, so it is the daemon's pid. */
static void start_activated(int fd, const char *listen_pid, const char *bound) {
  char cmd[4 * PATH_MAX];
  snprintf(cmd, sizeof cmd, "LISTEN_PID=%s LISTEN_FDS=1 exec \"$SHARDD\" --root '%s' --socket '%s' --log-level debug",
           listen_pid, H.root, bound);
  const char *argv[] = {"/bin/sh", "-c", cmd, NULL};
  o_spawn(argv, NULL, fd);
}

Test(systemd, socket_activation_serves_and_leaves_the_socket) {
  int fd = listen_at(H.sock);
  char unused[PATH_MAX];
  o_path(unused, sizeof unused, "not-this.sock");
  start_activated(fd, "$$", unused);
  close(fd);
  /* Serves on the passed socket: a status and a whole save through it. */
  h_expect_serving();
  char *log = o_log_wait("socket activation: accepting on");
  cr_assert(strstr(log, H.sock), "the log does not name the passed socket:\n%s", log);
  free(log);
  cr_assert(!h_exists(unused), "the daemon bound --socket although systemd passed one");
  o_stop();
  /* systemd owns the socket file: it survives the daemon. */
  cr_assert(h_exists(H.sock), "the daemon removed the socket systemd passed");
}

Test(systemd, socket_activation_for_another_pid_is_ignored) {
  char passed[PATH_MAX];
  o_path(passed, sizeof passed, "passed.sock");
  int fd = listen_at(passed);
  /* LISTEN_PID names another process (pid 1): the variables are not ours,
   * so the daemon binds --socket itself. */
  start_activated(fd, "1", H.sock);
  close(fd);
  o_wait_accepts(H.sock);
  h_expect_serving();
  cr_assert(!o_log_has("socket activation"), "activation variables for pid 1 were used");
  h_daemon_stop(&H); /* also asserts the daemon's own socket is removed */
}

Test(systemd, socket_activation_rejects_a_non_listening_descriptor) {
  int fds[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  start_activated(fds[0], "$$", H.sock);
  int st = h_reap(H.pid);
  H.pid = 0;
  close(fds[0]);
  close(fds[1]);
  cr_assert(o_exited(st, 1), "status 0x%x", st);
  char *log = o_log_wait("not a listening Unix stream socket");
  free(log);
}

/* ------------------------------------------------------------------------ *
 * Log lines for the journal
 * ------------------------------------------------------------------------ */
Test(systemd, syslog_priority_prefixes) {
  const char *extra[] = {"--log-syslog-prefix", "--log-level", "debug", NULL};
  o_start(extra, NULL);
  h_expect_serving();
  o_stop();
  char *log = h_slurp(H.log, NULL);
  cr_assert(strncmp(log, "<6>info: shardd ", 16) == 0 || strstr(log, "\n<6>info: shardd "),
            "no '<6>info: shardd ...' line:\n%s", log);
  cr_assert(strstr(log, "\n<7>debug: client "), "no '<7>debug:' line:\n%s", log);
  cr_assert(strstr(log, "\n<6>info: committed save 'serving-1'"), "no '<6>info:' summary line:\n%s", log);
  /* Each record is one line that starts with a priority. */
  for (char *p = log; *p; p = strchr(p, '\n') + 1) {
    cr_assert(p[0] == '<' && p[2] == '>', "a line without a priority: %.80s", p);
    if (!strchr(p, '\n')) break;
  }
  free(log);
}

Test(systemd, journal_stream_turns_prefixes_on) {
  /* JOURNAL_STREAM names stderr's device and inode when stderr is the
   * journal; the log file stands in for the journal's stream here. */
  o_write(H.log, "");
  struct stat sb;
  cr_assert_eq(stat(H.log, &sb), 0);
  char env[128];
  snprintf(env, sizeof env, "JOURNAL_STREAM=%llu:%llu", (unsigned long long)sb.st_dev, (unsigned long long)sb.st_ino);
  const char *envs[] = {env, NULL};
  o_start(NULL, envs);
  o_stop();
  char *log = h_slurp(H.log, NULL);
  cr_assert(log[0] == '<' && log[2] == '>', "JOURNAL_STREAM did not turn prefixes on:\n%s", log);
  free(log);

  /* A JOURNAL_STREAM that is not stderr (say, inherited from a parent
   * whose stderr went to the journal) leaves plain timestamps. */
  o_write(H.log, "");
  const char *other[] = {"JOURNAL_STREAM=1:1", NULL};
  o_start(NULL, other);
  o_stop();
  log = h_slurp(H.log, NULL);
  cr_assert(log[0] >= '0' && log[0] <= '9', "prefixes although stderr is not the journal:\n%s", log);
  free(log);
}

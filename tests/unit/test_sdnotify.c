/* sd_notify datagrams and socket activation: real sockets, bytes and descriptors checked. */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sdnotify.h"

/* ------------------------------------------------------------------------ *
 * Helpers
 * ------------------------------------------------------------------------ */

static void clean_env(void) {
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
}

static char tmpdir[64];

/* A datagram socket bound where NOTIFY_SOCKET will point: a file under a fresh
 * temporary directory, or an abstract name when abstract is set. */
static int bind_notify_socket(int abstract, char *spec, size_t specsz) {
  struct sockaddr_un sa;
  socklen_t len;
  if (abstract) {
    static unsigned counter;
    snprintf(spec, specsz, "@shardd-test-sdnotify-%d-%u", (int)getpid(), counter++);
  } else {
    strcpy(tmpdir, "/tmp/shardd-sdnotify-XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
    snprintf(spec, specsz, "%s/notify", tmpdir);
  }
  cr_assert_eq(sd_sys_notify_address(spec, &sa, &len, NULL), 0);
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  cr_assert_geq(fd, 0);
  cr_assert_eq(bind(fd, (struct sockaddr *)&sa, len), 0, "bind %s: %s", spec, strerror(errno));
  cr_assert_eq(setenv("NOTIFY_SOCKET", spec, 1), 0);
  return fd;
}

static void unbind_notify_socket(int fd, const char *spec) {
  close(fd);
  if (spec[0] == '/') {
    unlink(spec);
    rmdir(tmpdir);
  }
}

/* AF_UNIX datagrams are queued on the receiver before sendto returns, so the
 * message is either there now or was never sent: no waiting needed. */
static void expect_datagram(int fd, const char *want) {
  char buf[4096];
  ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
  cr_assert_geq(n, 0, "no datagram waiting (want \"%s\"): %s", want, strerror(errno));
  cr_assert_eq((size_t)n, strlen(want), "got %zd bytes \"%.*s\", want \"%s\"", n, (int)n, buf,
               want);
  cr_assert_eq(memcmp(buf, want, (size_t)n), 0, "got \"%.*s\", want \"%s\"", (int)n, buf, want);
}

static void expect_no_datagram(int fd) {
  char buf[64];
  cr_assert_lt(recv(fd, buf, sizeof buf, MSG_DONTWAIT), 0);
  cr_assert_eq(errno, EAGAIN);
}

/* Runs fn in a forked child, so it may overwrite descriptors 3 and up (which
 * belong to criterion in this process). fn returns NULL or what went wrong. */
typedef const char *(*child_fn)(void);

static void run_in_child(child_fn fn) {
  int p[2];
  cr_assert_eq(pipe(p), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    int out = fcntl(p[1], F_DUPFD_CLOEXEC, 64);
    if (out < 0) _exit(3);
    close(p[0]);
    close(p[1]);
    const char *why = fn();
    if (why && write(out, why, strlen(why)) < 0) _exit(4);
    _exit(0);
  }
  close(p[1]);
  char why[1024];
  size_t got = 0;
  ssize_t n;
  while (got < sizeof why - 1 && (n = read(p[0], why + got, sizeof why - 1 - got)) != 0) {
    if (n < 0 && errno == EINTR) continue;
    cr_assert_gt(n, 0);
    got += (size_t)n;
  }
  why[got] = '\0';
  close(p[0]);
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child died (status %d)", status);
  cr_assert_eq(got, 0, "child: %s", why);
}

static char child_msg[1024];

#define CHILD_CHECK(cond, ...)                                           \
  do {                                                                   \
    if (!(cond)) {                                                       \
      snprintf(child_msg, sizeof child_msg, "line %d: ", __LINE__);      \
      size_t l_ = strlen(child_msg);                                     \
      snprintf(child_msg + l_, sizeof child_msg - l_, __VA_ARGS__);      \
      return child_msg;                                                  \
    }                                                                    \
  } while (0)

static void set_listen_env(long pid, const char *nfds) {
  char buf[32];
  snprintf(buf, sizeof buf, "%ld", pid);
  setenv("LISTEN_PID", buf, 1);
  setenv("LISTEN_FDS", nfds, 1);
  setenv("LISTEN_FDNAMES", "shardd.socket", 1);
}

static int listen_env_gone(void) {
  return !getenv("LISTEN_PID") && !getenv("LISTEN_FDS") && !getenv("LISTEN_FDNAMES");
}

TestSuite(sdnotify, .init = clean_env);

/* ------------------------------------------------------------------------ *
 * Pure helpers
 * ------------------------------------------------------------------------ */

Test(sdnotify, parse_u64_is_strict) {
  uint64_t v = 7;
  cr_assert_eq(sd_sys_parse_u64("0", &v), 0);
  cr_assert_eq(v, 0);
  cr_assert_eq(sd_sys_parse_u64("30000000", &v), 0);
  cr_assert_eq(v, 30000000u);
  cr_assert_eq(sd_sys_parse_u64("18446744073709551615", &v), 0);
  cr_assert_eq(v, UINT64_MAX);
  v = 7;
  const char *bad[] = {"", "18446744073709551616", "-1", "+1", " 1", "1 ", "1x", "0x10", "1.5"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    cr_assert_eq(sd_sys_parse_u64(bad[i], &v), -1, "accepted \"%s\"", bad[i]);
  cr_assert_eq(sd_sys_parse_u64(NULL, &v), -1);
  cr_assert_eq(v, 7, "a refused value must not touch the output");
}

Test(sdnotify, address_forms) {
  struct sockaddr_un sa;
  socklen_t len;
  sd_error err;

  cr_assert_eq(sd_sys_notify_address("/run/systemd/notify", &sa, &len, &err), 0);
  cr_assert_eq(sa.sun_family, AF_UNIX);
  cr_assert_str_eq(sa.sun_path, "/run/systemd/notify");
  cr_assert_eq(len, offsetof(struct sockaddr_un, sun_path) + strlen("/run/systemd/notify") + 1);

  cr_assert_eq(sd_sys_notify_address("@org/systemd/x", &sa, &len, &err), 0);
  cr_assert_eq(sa.sun_path[0], '\0');
  cr_assert_eq(memcmp(sa.sun_path + 1, "org/systemd/x", 13), 0);
  cr_assert_eq(len, offsetof(struct sockaddr_un, sun_path) + 14, "abstract length excludes a NUL");

  sd_error_clear(&err);
  cr_assert_eq(sd_sys_notify_address("run/notify", &sa, &len, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_eq(err.code, SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "NOTIFY_SOCKET=\"run/notify\""), "message: %s", err.msg);
  cr_assert_eq(sd_sys_notify_address("@", &sa, &len, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "empty abstract name"), "message: %s", err.msg);
  cr_assert_eq(sd_sys_notify_address("vsock:2:1234", &sa, &len, &err), SHARDD_E_INVALID_ARGUMENT);

  /* sun_path is 108 bytes: a path of 107 fits with its NUL, 108 does not;
   * an abstract name may use all 108. */
  char longp[sizeof sa.sun_path + 2];
  memset(longp, 'a', sizeof longp);
  longp[0] = '/';
  longp[sizeof sa.sun_path - 1] = '\0';
  cr_assert_eq(sd_sys_notify_address(longp, &sa, &len, &err), 0);
  longp[sizeof sa.sun_path - 1] = 'a';
  longp[sizeof sa.sun_path] = '\0';
  cr_assert_eq(sd_sys_notify_address(longp, &sa, &len, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "more than sun_path holds"), "message: %s", err.msg);
  longp[0] = '@';
  cr_assert_eq(sd_sys_notify_address(longp, &sa, &len, &err), 0);
  cr_assert_eq(len, sizeof sa);
  longp[sizeof sa.sun_path] = 'a';
  longp[sizeof sa.sun_path + 1] = '\0';
  cr_assert_eq(sd_sys_notify_address(longp, &sa, &len, &err), SHARDD_E_INVALID_ARGUMENT);
}

/* ------------------------------------------------------------------------ *
 * Notifications
 * ------------------------------------------------------------------------ */

Test(sdnotify, without_notify_socket_nothing_is_sent) {
  cr_assert_eq(sd_sys_notify_ready("serving"), 0);
  cr_assert_eq(sd_sys_notify_watchdog(), 0);
  setenv("NOTIFY_SOCKET", "", 1);
  cr_assert_eq(sd_sys_notify_stopping(), 0);
}

Test(sdnotify, ready_and_status_to_a_path_socket) {
  char spec[128];
  int fd = bind_notify_socket(0, spec, sizeof spec);

  cr_assert_eq(sd_sys_notify_ready("serving /var/lib/shardd/checkpoints"), 1);
  expect_datagram(fd, "READY=1\nSTATUS=serving /var/lib/shardd/checkpoints");
  cr_assert_eq(sd_sys_notify_ready(NULL), 1);
  expect_datagram(fd, "READY=1");
  cr_assert_eq(sd_sys_notify_status("%d saves in flight, %d clients", 2, 8), 1);
  expect_datagram(fd, "STATUS=2 saves in flight, 8 clients");
  /* A newline in the text must not start a second assignment. */
  cr_assert_eq(sd_sys_notify_status("save %s failed:\nWATCHDOG=1", "s1"), 1);
  expect_datagram(fd, "STATUS=save s1 failed: WATCHDOG=1");
  cr_assert_eq(sd_sys_notify_ready("line1\nline2"), 1);
  expect_datagram(fd, "READY=1\nSTATUS=line1 line2");
  expect_no_datagram(fd);

  unbind_notify_socket(fd, spec);
}

Test(sdnotify, watchdog_reload_stop_to_an_abstract_socket) {
  char spec[128];
  int fd = bind_notify_socket(1, spec, sizeof spec);
  cr_assert_eq(spec[0], '@');

  cr_assert_eq(sd_sys_notify_watchdog(), 1);
  cr_assert_eq(sd_sys_notify_reloading(), 1);
  cr_assert_eq(sd_sys_notify_stopping(), 1);
  cr_assert_eq(sd_sys_notify("EXTEND_TIMEOUT_USEC=%llu", 60000000ULL), 1);
  expect_datagram(fd, "WATCHDOG=1");
  expect_datagram(fd, "RELOADING=1");
  expect_datagram(fd, "STOPPING=1");
  expect_datagram(fd, "EXTEND_TIMEOUT_USEC=60000000");
  expect_no_datagram(fd);

  unbind_notify_socket(fd, spec);
}

Test(sdnotify, unreachable_socket_is_an_io_error_naming_it) {
  sd_error err;
  sd_error_clear(&err);
  setenv("NOTIFY_SOCKET", "/nonexistent-shardd-dir/notify", 1);
  cr_assert_eq(sd_sys_notify_send("READY=1", &err), SHARDD_E_IO);
  cr_assert(strstr(err.msg, "/nonexistent-shardd-dir/notify"), "message: %s", err.msg);
  cr_assert_eq(sd_sys_notify_watchdog(), SHARDD_E_IO);

  setenv("NOTIFY_SOCKET", "relative/notify", 1);
  cr_assert_eq(sd_sys_notify_send("READY=1", &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "relative/notify"), "message: %s", err.msg);
}

Test(sdnotify, full_queue_fails_instead_of_blocking) {
  char spec[128];
  int fd = bind_notify_socket(1, spec, sizeof spec);
  /* Nobody reads: the receiver's queue fills (max_dgram_qlen or buffer
   * space), and then a send must fail at once rather than stall the loop. */
  int rc = 1, sent = 0;
  sd_error err;
  sd_error_clear(&err);
  while (sent < 1000000 && (rc = sd_sys_notify_send("WATCHDOG=1", &err)) == 1) sent++;
  cr_assert_eq(rc, SHARDD_E_IO, "after %d datagrams: rc %d", sent, rc);
  cr_assert_gt(sent, 0);
  cr_assert(strstr(err.msg, spec), "message: %s", err.msg);
  expect_datagram(fd, "WATCHDOG=1");
  unbind_notify_socket(fd, spec);
}

/* ------------------------------------------------------------------------ *
 * Watchdog
 * ------------------------------------------------------------------------ */

Test(sdnotify, watchdog_usec) {
  char pid[32];
  cr_assert_eq(sd_sys_watchdog_usec(), 0);
  setenv("WATCHDOG_USEC", "30000000", 1);
  cr_assert_eq(sd_sys_watchdog_usec(), 30000000u);

  snprintf(pid, sizeof pid, "%d", (int)getpid());
  setenv("WATCHDOG_PID", pid, 1);
  cr_assert_eq(sd_sys_watchdog_usec(), 30000000u);
  snprintf(pid, sizeof pid, "%d", (int)getpid() + 1);
  setenv("WATCHDOG_PID", pid, 1);
  cr_assert_eq(sd_sys_watchdog_usec(), 0, "the watchdog of another process");
  setenv("WATCHDOG_PID", "me", 1);
  cr_assert_eq(sd_sys_watchdog_usec(), 0);
  unsetenv("WATCHDOG_PID");

  const char *bad[] = {"", "0", "-30000000", "30s", "99999999999999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("WATCHDOG_USEC", bad[i], 1);
    cr_assert_eq(sd_sys_watchdog_usec(), 0, "WATCHDOG_USEC=\"%s\" accepted", bad[i]);
  }
}

/* ------------------------------------------------------------------------ *
 * Socket activation
 * ------------------------------------------------------------------------ */

Test(sdnotify, listen_fds_absent) {
  int fds[4] = {-1, -1, -1, -1};
  cr_assert_eq(sd_sys_listen_fds(fds, 4, NULL), 0);
  cr_assert_eq(fds[0], -1);
  setenv("LISTEN_FDS", "1", 1);   /* without LISTEN_PID it is not for us */
  cr_assert_eq(sd_sys_listen_fds(fds, 4, NULL), 0);
  cr_assert(listen_env_gone());
}

Test(sdnotify, listen_fds_for_another_process_are_ignored_and_unset) {
  int fds[4] = {-1, -1, -1, -1};
  set_listen_env((long)getpid() + 1, "1");
  cr_assert_eq(sd_sys_listen_fds(fds, 4, NULL), 0);
  cr_assert_eq(fds[0], -1);
  cr_assert(listen_env_gone(), "a child would inherit the variables");
}

Test(sdnotify, listen_fds_malformed) {
  int fds[4];
  sd_error err;
  set_listen_env((long)getpid(), "one");
  cr_assert_eq(sd_sys_listen_fds(fds, 4, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "LISTEN_FDS=\"one\""), "message: %s", err.msg);
  cr_assert(listen_env_gone());

  setenv("LISTEN_PID", "abc", 1);
  setenv("LISTEN_FDS", "1", 1);
  cr_assert_eq(sd_sys_listen_fds(fds, 4, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "LISTEN_PID=\"abc\""), "message: %s", err.msg);
  cr_assert(listen_env_gone());

  set_listen_env((long)getpid(), "3");
  cr_assert_eq(sd_sys_listen_fds(fds, 2, &err), SHARDD_E_LIMIT);
  cr_assert(strstr(err.msg, "passed 3 sockets") && strstr(err.msg, "at most 2"), "message: %s",
            err.msg);
  cr_assert(listen_env_gone());
}

/* In the child: a bound, listening Unix socket on fd 3 and one end of a
 * socketpair on fd 4, announced as systemd would. */
static const char *child_two_sockets(void) {
  char dir[] = "/tmp/shardd-listen-XXXXXX";
  CHILD_CHECK(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s/shardd.sock", dir);

  int l = socket(AF_UNIX, SOCK_STREAM, 0);
  CHILD_CHECK(l >= 0, "socket: %s", strerror(errno));
  CHILD_CHECK(bind(l, (struct sockaddr *)&sa, sizeof sa) == 0, "bind: %s", strerror(errno));
  CHILD_CHECK(listen(l, 4) == 0, "listen: %s", strerror(errno));
  int sv[2];
  CHILD_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair: %s", strerror(errno));
  /* Move our own descriptors out of the way before dup2 lands on 3 and 4. */
  int peer = fcntl(sv[1], F_DUPFD, 20);
  int lfd = fcntl(l, F_DUPFD, 20);
  int pfd = fcntl(sv[0], F_DUPFD, 20);
  CHILD_CHECK(peer >= 0 && lfd >= 0 && pfd >= 0, "F_DUPFD: %s", strerror(errno));
  close(l);
  close(sv[0]);
  close(sv[1]);
  CHILD_CHECK(dup2(lfd, 3) == 3 && dup2(pfd, 4) == 4, "dup2: %s", strerror(errno));
  close(lfd);
  close(pfd);
  CHILD_CHECK(!(fcntl(3, F_GETFD) & FD_CLOEXEC), "dup2 left FD_CLOEXEC set");

  set_listen_env((long)getpid(), "2");
  int fds[4] = {-1, -1, -1, -1};
  sd_error err;
  sd_error_clear(&err);
  int n = sd_sys_listen_fds(fds, 4, &err);
  CHILD_CHECK(n == 2, "sd_sys_listen_fds returned %d (%s)", n, err.msg);
  CHILD_CHECK(fds[0] == 3 && fds[1] == 4 && fds[2] == -1, "fds %d %d %d", fds[0], fds[1], fds[2]);
  CHILD_CHECK(listen_env_gone(), "LISTEN_* still set");
  CHILD_CHECK(fcntl(3, F_GETFD) & FD_CLOEXEC, "fd 3 not close-on-exec");
  CHILD_CHECK(fcntl(4, F_GETFD) & FD_CLOEXEC, "fd 4 not close-on-exec");
  CHILD_CHECK(sd_sys_is_unix_stream_listener(3) == 1, "fd 3 not seen as a listener");
  CHILD_CHECK(sd_sys_is_unix_stream_listener(4) == 0, "a connected socketpair seen as a listener");

  /* They are the real sockets: a client reaches fd 3, bytes cross fd 4. */
  int c = socket(AF_UNIX, SOCK_STREAM, 0);
  CHILD_CHECK(connect(c, (struct sockaddr *)&sa, sizeof sa) == 0, "connect: %s", strerror(errno));
  int a = accept(3, NULL, NULL);
  CHILD_CHECK(a >= 0, "accept on fd 3: %s", strerror(errno));
  CHILD_CHECK(write(c, "hello\n", 6) == 6, "write: %s", strerror(errno));
  char buf[8] = {0};
  CHILD_CHECK(read(a, buf, sizeof buf) == 6 && memcmp(buf, "hello\n", 6) == 0, "read \"%s\"", buf);
  CHILD_CHECK(write(peer, "ping", 4) == 4, "write: %s", strerror(errno));
  memset(buf, 0, sizeof buf);
  CHILD_CHECK(read(4, buf, sizeof buf) == 4 && memcmp(buf, "ping", 4) == 0, "read \"%s\"", buf);

  close(a);
  close(c);
  unlink(sa.sun_path);
  rmdir(dir);
  return NULL;
}

Test(sdnotify, listen_fds_returns_inherited_sockets) { run_in_child(child_two_sockets); }

static const char *child_closed_fd(void) {
  close(3);
  set_listen_env((long)getpid(), "1");
  int fds[1] = {-1};
  sd_error err;
  sd_error_clear(&err);
  int n = sd_sys_listen_fds(fds, 1, &err);
  CHILD_CHECK(n == SHARDD_E_INVALID_ARGUMENT, "returned %d", n);
  CHILD_CHECK(strstr(err.msg, "descriptor 3 is not open"), "message: %s", err.msg);
  CHILD_CHECK(listen_env_gone(), "LISTEN_* still set");
  return NULL;
}

Test(sdnotify, listen_fds_names_a_missing_descriptor) { run_in_child(child_closed_fd); }

static const char *child_not_a_socket(void) {
  int p[2];
  CHILD_CHECK(pipe(p) == 0, "pipe: %s", strerror(errno));
  CHILD_CHECK(dup2(p[0], 3) == 3, "dup2: %s", strerror(errno));
  CHILD_CHECK(sd_sys_is_unix_stream_listener(3) == 0, "a pipe seen as a listener");
  int d = socket(AF_UNIX, SOCK_DGRAM, 0);
  CHILD_CHECK(d >= 0 && dup2(d, 3) == 3, "dup2: %s", strerror(errno));
  CHILD_CHECK(sd_sys_is_unix_stream_listener(3) == 0, "a datagram socket seen as a listener");
  return NULL;
}

Test(sdnotify, listener_check_refuses_other_descriptors) { run_in_child(child_not_a_socket); }

/* Helpers for the operations tests: daemons started with any flags and environment, programs run with output captured, logs polled. */
#include "ops_util.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Bounds that only stop a hung test; nothing asserts a duration. */
#define O_DEADLINE_MS 20000

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
  }
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void o_scratch(void) {
  memset(&H, 0, sizeof H);
  snprintf(H.base, sizeof H.base, "/tmp/shardd-ops-XXXXXX");
  cr_assert_not_null(mkdtemp(H.base), "mkdtemp: %s", strerror(errno));
  snprintf(H.root, sizeof H.root, "%s/root", H.base);
  snprintf(H.sock, sizeof H.sock, "%s/sock", H.base);
  snprintf(H.log, sizeof H.log, "%s/shardd.log", H.base);
  snprintf(H.outside, sizeof H.outside, "%s/outside", H.base);
  cr_assert_eq(mkdir(H.outside, 0755), 0);
}

const char *o_path(char *buf, size_t n, const char *name) {
  snprintf(buf, n, "%s/%s", H.base, name);
  return buf;
}

void o_write(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f, "fopen %s: %s", path, strerror(errno));
  fputs(text, f);
  cr_assert_eq(fclose(f), 0);
}

int o_exited(int st, int code) { return WIFEXITED(st) && WEXITSTATUS(st) == code; }

static void put_env(const char *const *env) {
  for (size_t i = 0; env && env[i]; i++) putenv((char *)env[i]);
}

int o_run(char *out, size_t n, const char *const *env, const char *prog, ...) {
  const char *argv[64];
  int k = 0;
  argv[k++] = prog;
  va_list ap;
  va_start(ap, prog);
  for (const char *a; k < 63 && (a = va_arg(ap, const char *));) argv[k++] = a;
  va_end(ap);
  argv[k] = NULL;
  int pfd[2];
  cr_assert_eq(pipe2(pfd, O_CLOEXEC), 0);
  fflush(NULL);
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(pfd[1], 1);
    dup2(pfd[1], 2);
    put_env(env);
    execv(prog, (char *const *)argv);
    _exit(127);
  }
  close(pfd[1]);
  size_t got = 0;
  for (;;) {
    char tmp[4096];
    ssize_t r = read(pfd[0], tmp, sizeof tmp);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    size_t take = (size_t)r;
    if (got + take > n - 1) take = n - 1 - got;
    memcpy(out + got, tmp, take);
    got += take;
  }
  close(pfd[0]);
  out[got] = 0;
  return h_reap(pid);
}

pid_t o_spawn(const char *const *argv, const char *const *env, int fd3) {
  int logfd = open(H.log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  cr_assert(logfd >= 0, "open %s: %s", H.log, strerror(errno));
  fflush(NULL);
  pid_t pid = fork();
  cr_assert(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int nul = open("/dev/null", O_RDONLY);
    dup2(nul, 0);
    dup2(logfd, 1);
    dup2(logfd, 2);
    if (fd3 >= 0 && fd3 != 3) {
      dup2(fd3, 3); /* dup2 clears close-on-exec on the copy */
    } else if (fd3 == 3) {
      fcntl(3, F_SETFD, 0);
    }
    put_env(env);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  close(logfd);
  H.pid = pid;
  return pid;
}

static int accepts(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  int ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
  close(fd);
  return ok;
}

static void dump_log(void) {
  char *log = h_slurp(H.log, NULL);
  if (log) {
    size_t n = strlen(log);
    fprintf(stderr, "---- shardd log (%s), last bytes ----\n%s\n----\n", H.log, n > 4000 ? log + n - 4000 : log);
  }
  free(log);
}

void o_wait_accepts(const char *path) {
  int64_t deadline = now_ms() + O_DEADLINE_MS;
  while (!accepts(path)) {
    int st;
    if (H.pid && waitpid(H.pid, &st, WNOHANG) == H.pid) {
      H.pid = 0;
      dump_log();
      cr_assert_fail("shardd exited before accepting on %s (status 0x%x)", path, st);
    }
    if (now_ms() > deadline) {
      dump_log();
      cr_assert_fail("shardd did not accept on %s within %d ms", path, O_DEADLINE_MS);
    }
    sleep_ms(5);
  }
}

void o_start(const char *const *extra, const char *const *env) {
  const char *argv[64];
  int k = 0;
  argv[k++] = getenv("SHARDD");
  cr_assert(argv[0] && *argv[0], "SHARDD is not set (meson test sets it)");
  argv[k++] = "--root";
  argv[k++] = H.root;
  argv[k++] = "--socket";
  argv[k++] = H.sock;
  for (size_t i = 0; extra && extra[i] && k < 63; i++) argv[k++] = extra[i];
  argv[k] = NULL;
  o_spawn(argv, env, -1);
  o_wait_accepts(H.sock);
}

void o_stop(void) {
  pid_t pid = H.pid;
  cr_assert(pid > 0, "no daemon to stop");
  H.pid = 0;
  cr_assert_eq(kill(pid, SIGTERM), 0, "kill: %s", strerror(errno));
  int st = h_reap(pid);
  if (!o_exited(st, 0)) dump_log();
  cr_assert(o_exited(st, 0), "shardd ended with status 0x%x after SIGTERM", st);
}

int o_log_has(const char *needle) {
  char *log = h_slurp(H.log, NULL);
  int has = log && strstr(log, needle);
  free(log);
  return has;
}

char *o_log_wait(const char *needle) {
  int64_t deadline = now_ms() + O_DEADLINE_MS;
  for (;;) {
    char *log = h_slurp(H.log, NULL);
    if (log && strstr(log, needle)) return log;
    free(log);
    if (now_ms() > deadline) {
      dump_log();
      cr_assert_fail("shardd's log never said \"%s\"", needle);
    }
    sleep_ms(10);
  }
}

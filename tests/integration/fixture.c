/* One launcher for every integration suite: scratch folders, daemons started with any flags, environment and limits, clean stops, logs, captured programs. */
#include "fixture.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

h_daemon H;

void f_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
  }
}

int64_t f_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

char *h_slurp(const char *path, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NULL;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap + 1);
  for (;;) {
    if (n == cap) {
      cap *= 2;
      buf = realloc(buf, cap + 1);
    }
    ssize_t r = read(fd, buf + n, cap - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    n += (size_t)r;
  }
  close(fd);
  buf[n] = 0;
  if (len) *len = n;
  return buf;
}

/* ------------------------------------------------------------------------ *
 * Scratch folders
 * ------------------------------------------------------------------------ */
static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  remove(p);
  return 0;
}

void f_scratch(h_daemon *d, const char *tag) {
  memset(d, 0, sizeof *d);
  snprintf(d->base, sizeof d->base, "/tmp/shardd-%s-XXXXXX", tag);
  cr_assert_not_null(mkdtemp(d->base), "mkdtemp: %s", strerror(errno));
  snprintf(d->root, sizeof d->root, "%s/root", d->base);
  snprintf(d->sock, sizeof d->sock, "%s/sock", d->base);
  snprintf(d->log, sizeof d->log, "%s/shardd.log", d->base);
  snprintf(d->outside, sizeof d->outside, "%s/outside", d->base);
  if (mkdir(d->outside, 0755) == 0) return;
  int err = errno;
  /* A failed .init skips .fini: leave nothing behind. */
  nftw(d->base, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  cr_assert_fail("mkdir %s: %s", d->outside, strerror(err));
}

void f_scratch_remove(const char *base) {
  const char *keep = getenv("H_KEEP");
  if (keep && *keep && strcmp(keep, "0") != 0) {
    fprintf(stderr, "kept %s\n", base);
    return;
  }
  nftw(base, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* ------------------------------------------------------------------------ *
 * Starting
 * ------------------------------------------------------------------------ */
static void put_env(const char *const *env) {
  for (size_t i = 0; env && env[i]; i++) putenv((char *)env[i]);
}

/* The child's side of f_spawn: only async-signal-safe calls until exec. */
static void exec_child(const char *const *argv, const f_opts *o, int logfd, int fd3) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  struct rlimit rl = {o->nofile, o->nofile};
  if (o->nofile && setrlimit(RLIMIT_NOFILE, &rl) != 0) _exit(126);
  int nul = open("/dev/null", O_RDONLY);
  dup2(nul, 0);
  dup2(logfd, 1);
  dup2(logfd, 2);
  if (fd3 >= 0 && fd3 != 3) {
    dup2(fd3, 3); /* dup2 clears close-on-exec on the copy */
  } else if (fd3 == 3) {
    fcntl(3, F_SETFD, 0);
  }
  /* Small test models gather their rows as a large one would (the daemon's default is 64 KiB). */
  setenv("SHARDD_TEST_GATHER_MIN_PIECE", "0", 0);
  put_env(o->env);
  execvp(argv[0], (char *const *)argv);
  fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
  _exit(127);
}

static int spawn(h_daemon *d, const char *const *argv, const f_opts *o, int fd3, char *why, size_t n) {
  static const f_opts none;
  int logfd = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (logfd < 0) {
    snprintf(why, n, "open %.300s: %s", d->log, strerror(errno));
    return -1;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    snprintf(why, n, "fork: %s", strerror(errno));
    close(logfd);
    return -1;
  }
  if (pid == 0) exec_child(argv, o ? o : &none, logfd, fd3);
  close(logfd);
  d->pid = pid;
  return 0;
}

pid_t f_spawn(h_daemon *d, const char *const *argv, const f_opts *o, int fd3) {
  char why[512];
  if (spawn(d, argv, o, fd3, why, sizeof why) != 0) cr_assert_fail("%s", why);
  return d->pid;
}

int f_accepts(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t n = strlen(path);
  if (n >= sizeof sa.sun_path) {
    close(fd);
    return 0;
  }
  memcpy(sa.sun_path, path, n + 1);
  int ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
  close(fd);
  return ok;
}

int f_try_wait_accepts(h_daemon *d, const char *path, char *why, size_t n) {
  int64_t deadline = f_now_ms() + F_ACCEPT_MS;
  while (!f_accepts(path)) {
    int st;
    if (d->pid && waitpid(d->pid, &st, WNOHANG) == d->pid) {
      d->pid = 0;
      f_dump_log(d);
      snprintf(why, n, "shardd exited before accepting on %.300s (status 0x%x)", path, st);
      return -1;
    }
    if (f_now_ms() > deadline) {
      f_dump_log(d);
      if (d->pid) {
        kill(d->pid, SIGKILL);
        waitpid(d->pid, &st, 0);
        d->pid = 0;
      }
      snprintf(why, n, "shardd did not accept on %.300s within %d ms", path, F_ACCEPT_MS);
      return -1;
    }
    f_sleep_ms(2);
  }
  return 0;
}

void f_wait_accepts(h_daemon *d, const char *path) {
  char why[512];
  if (f_try_wait_accepts(d, path, why, sizeof why) != 0) cr_assert_fail("%s", why);
}

int f_try_start(h_daemon *d, const f_opts *o, char *why, size_t n) {
  static const f_opts none;
  if (!o) o = &none;
  const char *bin = getenv("SHARDD");
  if (!bin || !*bin) {
    snprintf(why, n, "environment variable SHARDD is not set (meson test sets it)");
    return -1;
  }
  const char *argv[128];
  int k = 0;
  static char wrap[1024];
  const char *w = getenv("SHARDD_WRAPPER");
  if (w && *w) {
    snprintf(wrap, sizeof wrap, "%s", w);
    for (char *t = strtok(wrap, " "); t && k < 32; t = strtok(NULL, " ")) argv[k++] = t;
  }
  argv[k++] = bin;
  argv[k++] = "--root";
  argv[k++] = d->root;
  argv[k++] = "--socket";
  argv[k++] = d->sock;
  if (!o->default_log_level) {
    argv[k++] = "--log-level";
    argv[k++] = "debug";
  }
  if (o->peer_token) {
    /* Port 0: the kernel picks a free one; status tells which. */
    const char *peer[] = {"--peer-listen", "127.0.0.1:0", "--peer-token-file", o->peer_token, "--peer-timeout", "2"};
    for (size_t i = 0; i < sizeof peer / sizeof peer[0]; i++) argv[k++] = peer[i];
    if (o->node_name) {
      argv[k++] = "--node-name";
      argv[k++] = o->node_name;
    }
  }
  for (size_t i = 0; o->extra && o->extra[i] && k < 127; i++) argv[k++] = o->extra[i];
  argv[k] = NULL;
  if (spawn(d, argv, o, -1, why, n) != 0) return -1;
  return f_try_wait_accepts(d, d->sock, why, n);
}

void f_start(h_daemon *d, const f_opts *o) {
  char why[512];
  if (f_try_start(d, o, why, sizeof why) != 0) cr_assert_fail("%s", why);
}

/* ------------------------------------------------------------------------ *
 * Stopping
 * ------------------------------------------------------------------------ */
int f_reap(pid_t pid, int ms) {
  int st = 0;
  int64_t deadline = f_now_ms() + ms;
  for (;;) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return st;
    cr_assert(r == 0, "waitpid %d: %s", (int)pid, strerror(errno));
    if (f_now_ms() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      cr_assert_fail("process %d did not finish within %d ms; killed it", (int)pid, ms);
    }
    f_sleep_ms(2);
  }
}

void f_stop(h_daemon *d, int socket_gone) {
  if (!d->pid) return;
  pid_t pid = d->pid;
  d->pid = 0;
  /* A test that failed while it had the daemon stopped (SIGSTOP) must not also time out here. */
  kill(pid, SIGCONT);
  cr_assert_eq(kill(pid, SIGTERM), 0, "kill: %s", strerror(errno));
  int st = 0;
  int64_t deadline = f_now_ms() + F_STOP_MS;
  while (waitpid(pid, &st, WNOHANG) != pid) {
    if (f_now_ms() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      f_dump_log(d);
      cr_assert_fail("shardd did not exit within %d ms of SIGTERM", F_STOP_MS);
    }
    f_sleep_ms(2);
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) f_dump_log(d);
  cr_assert(WIFEXITED(st), "shardd died of signal %d after SIGTERM", WIFSIGNALED(st) ? WTERMSIG(st) : -1);
  cr_assert_eq(WEXITSTATUS(st), 0, "shardd exited %d after SIGTERM (sanitizer report or shutdown error)",
               WEXITSTATUS(st));
  struct stat sb;
  if (socket_gone) cr_assert(lstat(d->sock, &sb) != 0, "shardd left its socket %s behind", d->sock);
}

void f_reap_killed(h_daemon *d) {
  cr_assert(d->pid > 0, "no daemon to reap");
  int st = 0;
  int64_t deadline = f_now_ms() + F_STOP_MS;
  while (waitpid(d->pid, &st, WNOHANG) != d->pid) {
    if (f_now_ms() > deadline) {
      kill(d->pid, SIGKILL);
      waitpid(d->pid, &st, 0);
      f_dump_log(d);
      cr_assert_fail("the daemon did not die");
    }
    f_sleep_ms(2);
  }
  d->pid = 0;
  if (!(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)) f_dump_log(d);
  cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the daemon ended with status 0x%x, not SIGKILL", st);
  /* A killed daemon leaves its socket: the next start removes it as stale. */
}

/* ------------------------------------------------------------------------ *
 * Logs and captured programs
 * ------------------------------------------------------------------------ */
void f_dump_log(const h_daemon *d) {
  char *log = h_slurp(d->log, NULL);
  if (log) {
    size_t n = strlen(log);
    fprintf(stderr, "---- shardd log (%s), last bytes ----\n%s\n----\n", d->log, n > 4000 ? log + n - 4000 : log);
  }
  free(log);
}

int f_log_count(const char *path, const char *needle) {
  char *log = h_slurp(path, NULL);
  if (!log) return 0;
  int n = 0;
  for (const char *p = log; (p = strstr(p, needle)); p += strlen(needle)) n++;
  free(log);
  return n;
}

char *f_log_wait(const h_daemon *d, const char *needle) {
  int64_t deadline = f_now_ms() + F_ACCEPT_MS;
  for (;;) {
    char *log = h_slurp(d->log, NULL);
    if (log && strstr(log, needle)) return log;
    free(log);
    if (f_now_ms() > deadline) {
      f_dump_log(d);
      cr_assert_fail("shardd's log never said \"%s\"", needle);
    }
    f_sleep_ms(10);
  }
}

int f_run(char *out, size_t n, const char *const *env, const char *const *argv) {
  int pfd[2];
  cr_assert_eq(pipe2(pfd, O_CLOEXEC), 0);
  fflush(NULL);
  pid_t pid = fork();
  cr_assert(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(pfd[1], 1);
    dup2(pfd[1], 2);
    put_env(env);
    execv(argv[0], (char *const *)argv);
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
    if (n && got + take > n - 1) take = n - 1 - got;
    memcpy(out + got, tmp, take);
    got += take;
  }
  close(pfd[0]);
  if (n) out[got] = 0;
  return f_reap(pid, 90000);
}

int f_run_va(char *out, size_t n, const char *const *env, const char *const *head, va_list ap) {
  const char *argv[64];
  int k = 0;
  while (head[k] && k < 63) {
    argv[k] = head[k];
    k++;
  }
  for (const char *a; k < 63 && (a = va_arg(ap, const char *));) argv[k++] = a;
  argv[k] = NULL;
  return f_run(out, n, env, argv);
}

/* One launcher for every integration suite: scratch folders, daemons started with any flags, environment and limits, clean stops, logs, captured programs. */
#ifndef SD_IT_FIXTURE_H
#define SD_IT_FIXTURE_H

#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* A daemon under test and its scratch folder: the root, the socket, the log
 * and an `outside` folder that escape tests watch. */
typedef struct {
  pid_t pid;                /* 0 once stopped */
  char base[256];
  char root[PATH_MAX];
  char sock[PATH_MAX];
  char log[PATH_MAX];
  char outside[PATH_MAX];
} h_daemon;

/* The current test's daemon (one per test process). */
extern h_daemon H;

/* How a daemon is started. Zero is `$SHARDD --root R --socket S --log-level debug`. */
typedef struct {
  const char *const *extra;   /* more flags after those (NULL-terminated, may be NULL) */
  const char *const *env;     /* "K=V" entries added in the child (NULL-terminated, may be NULL) */
  int default_log_level;      /* no --log-level flag: the operations tests check what the default logs */
  unsigned nofile;            /* soft and hard RLIMIT_NOFILE in the child (`ulimit -n`); 0: inherited */
  const char *peer_token;     /* listen for peers on 127.0.0.1:0 with this token file, peer timeout 2 s */
  const char *node_name;      /* --node-name, with peer_token */
} f_opts;

/* Bounds that only stop a hung test; no test asserts a duration. */
#define F_ACCEPT_MS 60000
#define F_STOP_MS 60000
#define F_WAIT_MS 60000

/* Polls every 10 ms until cond holds or F_WAIT_MS have passed; the caller then asserts what it
 * needs. Only for what a passing run always reaches: a busy machine makes it later, never absent. */
#define F_POLL(cond)                                                                   \
  for (int64_t f_poll_until_ = f_now_ms() + F_WAIT_MS; !(cond) && f_now_ms() < f_poll_until_;) \
  f_sleep_ms(10)

void f_sleep_ms(int ms);
int64_t f_now_ms(void);

/* d gets a fresh folder /tmp/shardd-TAG-XXXXXX with root, sock, shardd.log and
 * an empty `outside`; no daemon. */
void f_scratch(h_daemon *d, const char *tag);
/* Removes the scratch folder, unless H_KEEP is set (then it says where it is). */
void f_scratch_remove(const char *base);

/* Forks argv (NULL-terminated; argv[0] found on PATH) with o's environment and
 * limits, stdin from /dev/null, stdout and stderr appended to d->log, and fd3
 * (when >= 0) as descriptor 3. Sets d->pid; waits for nothing. */
pid_t f_spawn(h_daemon *d, const char *const *argv, const f_opts *o, int fd3);
/* Starts $SHARDD on d's root and socket as o says (o may be NULL); honours
 * SHARDD_WRAPPER="valgrind -q ..." (scripts/valgrind.sh). Returns once the
 * socket accepts. f_try_start reports instead of asserting: 0, or -1 with why. */
void f_start(h_daemon *d, const f_opts *o);
int f_try_start(h_daemon *d, const f_opts *o, char *why, size_t n);
/* Waits until path accepts connections while d->pid lives (the daemon is
 * killed after F_ACCEPT_MS); the f_try_ form reports instead of asserting. */
void f_wait_accepts(h_daemon *d, const char *path);
int f_try_wait_accepts(h_daemon *d, const char *path, char *why, size_t n);
/* Whether path accepts a connection now. */
int f_accepts(const char *path);

/* SIGTERM; asserts exit status 0, and with socket_gone that d->sock was
 * removed. Nothing to do once d->pid is 0. */
void f_stop(h_daemon *d, int socket_gone);
/* d was killed (by itself or by us): reaps it, asserts it died of SIGKILL. */
void f_reap_killed(h_daemon *d);
/* Waits for pid, killing it after ms; returns the raw wait status. */
int f_reap(pid_t pid, int ms);

/* Reads a whole file (malloc'd, NUL-terminated); NULL when it cannot. */
char *h_slurp(const char *path, size_t *len);
/* The last bytes of d's log on stderr, to explain a failure. */
void f_dump_log(const h_daemon *d);
/* Times needle appears in the file at path (0 when it cannot be read). */
int f_log_count(const char *path, const char *needle);
/* Waits until d's log holds needle; returns the log (malloc'd). */
char *f_log_wait(const h_daemon *d, const char *needle);

/* Runs argv (NULL-terminated) with env added, stdout and stderr into out
 * (n bytes, NUL-terminated); returns the wait status. */
int f_run(char *out, size_t n, const char *const *env, const char *const *argv);
/* f_run of head (NULL-terminated) followed by the NULL-terminated strings in ap. */
int f_run_va(char *out, size_t n, const char *const *env, const char *const *head, va_list ap);

#endif

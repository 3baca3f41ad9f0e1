/* Raw-protocol clients, daemons with extra flags, tree hashes and /proc probes for the hostile, limits, permission and fault suites. */
#include "xclient.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <grp.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ *
 * The daemon
 * ------------------------------------------------------------------------ */
void x_init(void) { f_scratch(&H, "xt"); }

void x_fini(void) { h_teardown(); }

void x_start(const char *const *extra) { x_start_nofile(extra, 0); }

void x_start_nofile(const char *const *extra, unsigned nofile) {
  f_opts o = {.extra = extra, .nofile = nofile};
  f_start(&H, &o);
}

void x_reap_killed(void) { f_reap_killed(&H); }

int x_log_count(const char *needle) { return f_log_count(H.log, needle); }

/* ------------------------------------------------------------------------ *
 * Connections
 * ------------------------------------------------------------------------ */
x_conn *x_try_connect(const char *sock) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return NULL;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    return NULL;
  }
  x_conn *c = calloc(1, sizeof *c);
  c->fd = fd;
  return c;
}

x_conn *x_connect(void) {
  x_conn *c = x_try_connect(H.sock);
  cr_assert_not_null(c, "cannot connect to %s: %s", H.sock, strerror(errno));
  return c;
}

void x_close(x_conn *c) {
  if (!c) return;
  close(c->fd);
  free(c->buf);
  free(c);
}

void x_send(x_conn *c, const void *data, size_t len) {
  const char *p = data;
  while (len) {
    ssize_t w = send(c->fd, p, len, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return; /* the daemon may have hung up on purpose */
    p += w;
    len -= (size_t)w;
  }
}

void x_sendf(x_conn *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  int n = vasprintf(&s, fmt, ap);
  va_end(ap);
  cr_assert(n >= 0);
  x_send(c, s, (size_t)n);
  x_send(c, "\n", 1);
  free(s);
}

char *x_read_line(x_conn *c, int timeout_ms) {
  int64_t deadline = f_now_ms() + timeout_ms;
  for (;;) {
    char *nl = c->len ? memchr(c->buf, '\n', c->len) : NULL;
    if (nl) {
      size_t n = (size_t)(nl - c->buf);
      char *line = malloc(n + 1);
      memcpy(line, c->buf, n);
      line[n] = 0;
      memmove(c->buf, nl + 1, c->len - n - 1);
      c->len -= n + 1;
      return line;
    }
    if (c->eof) return NULL;
    int64_t left = deadline - f_now_ms();
    if (left <= 0) return NULL;
    struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
    int pr = poll(&pfd, 1, (int)left);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) return NULL;
    if (c->cap - c->len < 65536) {
      c->cap = c->cap ? c->cap * 2 : 131072;
      c->buf = realloc(c->buf, c->cap);
    }
    ssize_t r = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      c->eof = 1;
      continue;
    }
    c->len += (size_t)r;
  }
}

json_t *x_read(x_conn *c, int timeout_ms) {
  char *line = x_read_line(c, timeout_ms);
  if (!line) return NULL;
  json_error_t je;
  json_t *j = json_loads(line, 0, &je);
  cr_assert_not_null(j, "the daemon sent a line that is not JSON: '%s' (%s)", line, je.text);
  free(line);
  return j;
}

json_t *x_reply(x_conn *c) {
  for (;;) {
    json_t *j = x_read(c, X_REPLY_MS);
    cr_assert_not_null(j, "no reply from the daemon (connection %s)", c->eof ? "closed" : "silent");
    if (json_object_get(j, "event")) {
      json_decref(j);
      continue;
    }
    return j;
  }
}

json_t *x_call(x_conn *c, const char *line) {
  x_send(c, line, strlen(line));
  x_send(c, "\n", 1);
  return x_reply(c);
}

json_t *x_callf(x_conn *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  int n = vasprintf(&s, fmt, ap);
  va_end(ap);
  cr_assert(n >= 0);
  json_t *r = x_call(c, s);
  free(s);
  return r;
}

int x_wait_eof(x_conn *c, int timeout_ms) {
  int64_t deadline = f_now_ms() + timeout_ms;
  for (;;) {
    char *l = x_read_line(c, (int)(deadline - f_now_ms() > 0 ? deadline - f_now_ms() : 0));
    if (!l) return c->eof && c->len == 0;
    free(l);
  }
}

static char *dump(const json_t *j) {
  return j ? json_dumps(j, JSON_COMPACT) : strdup("(none)");
}

void x_ok(json_t *r, const char *what) {
  char *s = dump(r);
  cr_assert(json_is_true(json_object_get(r, "ok")), "%s: expected ok, got %s", what, s);
  free(s);
  json_decref(r);
}

void x_err(json_t *r, const char *code, const char *frag, const char *what) {
  char *s = dump(r);
  json_t *e = json_object_get(r, "error");
  const char *got = json_string_value(json_object_get(e, "code"));
  const char *msg = json_string_value(json_object_get(e, "message"));
  cr_assert(json_is_false(json_object_get(r, "ok")), "%s: expected %s, got %s", what, code, s);
  cr_assert(got && !strcmp(got, code), "%s: expected code %s, got %s", what, code, s);
  cr_assert(msg && *msg, "%s: error without a message: %s", what, s);
  if (frag) cr_assert(strstr(msg, frag), "%s: message lacks '%s': %s", what, frag, s);
  free(s);
  json_decref(r);
}

void x_status_ok(x_conn *c, int nsaves) {
  json_t *r = x_call(c, "{\"op\":\"status\",\"id\":\"st\"}");
  char *s = dump(r);
  cr_assert(json_is_true(json_object_get(r, "ok")), "status fails: %s", s);
  json_t *saves = json_object_get(r, "saves");
  cr_assert(json_is_array(saves), "status without saves: %s", s);
  if (nsaves >= 0) cr_assert_eq((int)json_array_size(saves), nsaves, "saves in flight: %s", s);
  free(s);
  json_decref(r);
}

void x_serving(void) { h_expect_serving(); }

/* ------------------------------------------------------------------------ *
 * Probes
 * ------------------------------------------------------------------------ */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
  return h;
}

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static uint64_t hash_at(uint64_t h, const char *path, const char *rel) {
  struct stat st;
  if (lstat(path, &st) != 0) return h;
  h = fnv(h, rel, strlen(rel) + 1);
  h = fnv(h, S_ISDIR(st.st_mode) ? "d" : S_ISLNK(st.st_mode) ? "l" : "f", 1);
  if (S_ISREG(st.st_mode)) {
    size_t len = 0;
    char *data = h_slurp(path, &len);
    cr_assert_not_null(data, "cannot read %s", path);
    h = fnv(h, &len, sizeof len);
    h = fnv(h, data, len);
    free(data);
  } else if (S_ISDIR(st.st_mode)) {
    DIR *d = opendir(path);
    cr_assert_not_null(d, "opendir %s", path);
    char **names = NULL;
    size_t n = 0;
    for (struct dirent *de; (de = readdir(d));) {
      if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
      names = realloc(names, (n + 1) * sizeof *names);
      names[n++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, name_cmp);
    for (size_t i = 0; i < n; i++) {
      char sub[PATH_MAX], subrel[PATH_MAX];
      snprintf(sub, sizeof sub, "%s/%s", path, names[i]);
      snprintf(subrel, sizeof subrel, "%s/%s", rel, names[i]);
      h = hash_at(h, sub, subrel);
      free(names[i]);
    }
    free(names);
  }
  return h;
}

uint64_t x_tree_hash(const char *dir) {
  if (!h_exists(dir)) return 0;
  return hash_at(1469598103934665603ULL, dir, ".");
}

int x_fd_count(pid_t pid) {
  char p[64];
  snprintf(p, sizeof p, "/proc/%d/fd", (int)pid);
  DIR *d = opendir(p);
  cr_assert_not_null(d, "opendir %s: %s", p, strerror(errno));
  int n = 0;
  for (struct dirent *de; (de = readdir(d));)
    if (de->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

long x_rss_kib(pid_t pid) {
  char p[64];
  snprintf(p, sizeof p, "/proc/%d/status", (int)pid);
  char *s = h_slurp(p, NULL);
  cr_assert_not_null(s, "cannot read %s", p);
  const char *v = strstr(s, "VmRSS:");
  long kib = v ? strtol(v + 6, NULL, 10) : -1;
  free(s);
  cr_assert(kib > 0, "no VmRSS in %s", p);
  return kib;
}

int x_shm_create(const char *name, size_t size, unsigned seed, uint8_t **map) {
  shm_unlink(name);
  int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
  cr_assert(fd >= 0, "shm_open %s: %s", name, strerror(errno));
  cr_assert_eq(ftruncate(fd, (off_t)size), 0, "ftruncate: %s", strerror(errno));
  uint8_t *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  cr_assert(m != MAP_FAILED, "mmap: %s", strerror(errno));
  for (size_t i = 0; i < size; i++) m[i] = (uint8_t)((i * 7 + seed) & 0xff);
  if (map)
    *map = m;
  else
    munmap(m, size);
  return fd;
}

int x_steps_as(uid_t uid, gid_t gid, const x_step *steps, size_t n) {
  fflush(NULL);
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    if (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0) _exit(100);
    x_conn *c = x_try_connect(H.sock);
    if (!c) _exit(101);
    for (size_t i = 0; i < n; i++) {
      x_send(c, steps[i].line, strlen(steps[i].line));
      x_send(c, "\n", 1);
      char *r = NULL;
      do {
        free(r);
        r = x_read_line(c, X_REPLY_MS);
      } while (r && strstr(r, "\"event\""));
      if (!r || !strstr(r, steps[i].want)) {
        fprintf(stderr, "uid %u step %zu '%s': wanted '%s', got '%s'\n", (unsigned)uid, i + 1, steps[i].line,
                steps[i].want, r ? r : "(nothing)");
        _exit((int)(i + 1));
      }
      free(r);
    }
    x_close(c);
    _exit(0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  cr_assert(WIFEXITED(st), "client as uid %u died (status 0x%x)", (unsigned)uid, st);
  return WEXITSTATUS(st);
}

/* Benchmark: (m) two daemons on loopback sharing a root, two ranks each, against (c) one daemon with four; and a copy-bound save (every matrix split on its inner dimension) at copy_threads 1 and 2. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_e2e.h"
#include "shardd/shardd.h"

extern char **environ;

#define GIB 1073741824.0
#define NRANKS 4
#define MAXD 2
#define CKPT_DIR "bench-ckpt"

typedef sd_e2e_opts options;

/* One save: how fast, at what CPU, and how the daemons wrote it. */
typedef struct {
  const char *label;
  int ran, ok;
  uint64_t bytes;
  double seconds, cpu_s, load_before, load_after;
  double blocked, memcpy_s;     /* the slowest rank's */
  uint64_t direct, buffered, fwd, trips_peak, peak_anon;
  double attach_cpu;             /* the daemons' CPU from up to every rank ready: connects, attaches, pinning */
  uint64_t pinned;               /* the daemons' pinned_bytes then */
  uint64_t zc, gathered, copied; /* the daemons' totals: bytes written zero-copy from one rank's segment, gathered from several, copied */
  char note[768];
} run;

static double pct(uint64_t part, const run *r) {
  uint64_t all = r->zc + r->gathered + r->copied;
  return all ? 100.0 * (double)part / (double)all : 0.0;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_multi [options]\n"
          "The model of bench_e2e's (c), written durably: (a) raw O_DIRECT before and after, (c) one shardd\n"
          "with 4 example ranks, (m) two shardds on loopback sharing the root with 2 ranks each (TP pairs:\n"
          "every file can be written where its bytes are held), slices placed for zero-copy writes\n"
          "(--place, like bench_e2e's (z)), (k1)/(k2) one shardd, every matrix split on\n"
          "its inner dimension (copy-bound), copy_threads 1 and 2, and (f) one shardd, every matrix split\n"
          "on dim 0 and placed (FSDP-like: all zero-copy but the header), (z) (c) with placed ranks.\n"
          "(C), (Z), (F): the ranks of (c), (z), (f) save twice over the same connections and arenas, as a\n"
          "trainer saving every N steps does; only the second save, 11 s after the first (past the daemon's\n"
          "10 s idle staging trim when no arena is pinned), is measured: the steady state.\n"
          "Never fails on a time; exits 1 when a checkpoint is wrong.\n"
          "  --gib N  --quick (0.25)  --dir PARENT  --shardd PATH  --rank-bin PATH  --max-shard-size N\n"
          "  --phases LIST (any of a c C z Z m k f F; default acCzZmkfF)  --timeout S (default 3600)  --keep\n");
}

static pid_t spawn_io(char *const argv[], int in_fd, int out_fd, int err_fd) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (in_fd >= 0) posix_spawn_file_actions_adddup2(&fa, in_fd, STDIN_FILENO);
  if (out_fd >= 0) posix_spawn_file_actions_adddup2(&fa, out_fd, STDOUT_FILENO);
  if (err_fd >= 0) posix_spawn_file_actions_adddup2(&fa, err_fd, STDERR_FILENO);
  pid_t pid;
  int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    fprintf(stderr, "bench_multi: cannot start %s: %s\n", argv[0], strerror(rc));
    return -1;
  }
  return pid;
}

static int read_line(int fd, char *line, size_t len, double deadline) {
  size_t n = 0;
  while (n < len - 1) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    double left = deadline - sd_e2e_now();
    if (left <= 0 || poll(&p, 1, (int)(left * 1000) + 1) <= 0) return -1;
    if (read(fd, line + n, 1) != 1) return -1;
    if (line[n] == '\n') break;
    n++;
  }
  line[n] = '\0';
  return 0;
}

/* The daemon's status with metrics, or NULL while it is not up. */
static json_t *status_of(const char *sock) {
  shardd_client *c = NULL;
  if (shardd_connect(sock, &c) != 0) return NULL;
  char *js = NULL;
  json_t *st = NULL;
  if (shardd_status(c, &js) == 0) st = json_loads(js, 0, NULL);
  shardd_free(js);
  shardd_close(c);
  return st;
}

static uint64_t num(const json_t *o, const char *a, const char *b) {
  const json_t *v = json_object_get(o, a);
  if (b) v = json_object_get(v, b);
  return json_is_integer(v) ? (uint64_t)json_integer_value(v) : 0;
}

/* ------------------------------------------------------------------------ *
 * One save: nd daemons on one root, four ranks, the daemons' own figures
 * ------------------------------------------------------------------------ */
/* The daemons' byte counters (status totals and writer metrics), added with sign: a repeated
 * save's figures are the daemons' totals at its end minus those at its start. */
static void add_counters(char sock[][PATH_MAX], const pid_t *dp, int nd, run *r, int sign) {
  for (int d = 0; d < nd; d++) {
    json_t *st = dp[d] > 0 ? status_of(sock[d]) : NULL;
    r->direct += (uint64_t)sign * num(st, "metrics", "write_bytes_odirect");
    r->buffered += (uint64_t)sign * num(st, "metrics", "write_bytes_buffered");
    r->fwd += (uint64_t)sign * num(st, "peers", "bytes_forwarded");
    r->zc += (uint64_t)sign * num(st, "totals", "bytes_zero_copy");
    r->gathered += (uint64_t)sign * num(st, "totals", "bytes_gathered");
    r->copied += (uint64_t)sign * num(st, "totals", "bytes_copied");
    uint64_t tp = num(st, "metrics", "copy_trips_peak");
    if (sign > 0 && tp > r->trips_peak) r->trips_peak = tp;
    json_decref(st);
  }
}

#define MAX_REPEAT 8
#define WARM_PAUSE_S 11
/* The checkpoints of a repeated phase's earlier saves (DIR.wK): not measured, not kept. */
static void rm_warm(const char *ckpt, int repeat) {
  for (int k = 1; k < repeat; k++) {
    char w[PATH_MAX + 32];
    sd_e2e_fmt(w, sizeof w, "%s.w%d", ckpt, k);
    sd_e2e_rmtree(w);
  }
}

/* split 1: every matrix on its inner dimension, 2: on dim 0; repeat > 1: the ranks save that many times
 * over the same connections and arenas (a trainer saving every N steps) and only the last save is measured. */
static int run_save(const options *o, const char *work, const sd_e2e_model *m, int nd, unsigned copy_threads,
                    int split, int place, int repeat, run *r) {
  r->ran = 1;
  char root[PATH_MAX], tok[PATH_MAX], sock[MAXD][PATH_MAX], log[MAXD][PATH_MAX], addr[MAXD][64] = {{0}};
  char ct[16], ckpt[PATH_MAX + 16];
  sd_e2e_fmt(root, sizeof root, "%s/root", work);
  sd_e2e_fmt(tok, sizeof tok, "%s/token", work);
  sd_e2e_fmt(ckpt, sizeof ckpt, "%s/" CKPT_DIR, root);
  sd_e2e_fmt(ct, sizeof ct, "%u", copy_threads);
  mkdir(root, 0755);
  sd_e2e_rmtree(ckpt); /* a failed phase before left its checkpoints */
  rm_warm(ckpt, MAX_REPEAT);
  int tfd = open(tok, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (tfd < 0 || write(tfd, "bench-multi-secret-0123456789\n", 30) != 30) {
    sd_e2e_fmt(r->note, sizeof r->note, "FAILED: cannot write %s", tok);
    if (tfd >= 0) close(tfd);
    return -1;
  }
  close(tfd);
  pid_t dp[MAXD] = {0};
  int rc = 0;
  for (int d = 0; d < nd && rc == 0; d++) {
    char name[16];
    sd_e2e_fmt(name, sizeof name, "node%d", d);
    sd_e2e_fmt(sock[d], sizeof sock[d], "/tmp/shardd-bench-multi-%d-%d.sock", (int)getpid(), d);
    sd_e2e_fmt(log[d], sizeof log[d], "%s/shardd-%d.log", work, d);
    int lfd = open(log[d], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    char *argv[20] = {(char *)o->shardd, "--root", root, "--socket", sock[d], "--log-level", "info"};
    int n = 7;
    if (copy_threads) argv[n++] = "--copy-threads", argv[n++] = ct;
    if (nd > 1) {
      argv[n++] = "--peer-listen", argv[n++] = "127.0.0.1:0", argv[n++] = "--peer-token-file", argv[n++] = tok;
      argv[n++] = "--node-name", argv[n++] = name;
    }
    argv[n] = NULL;
    dp[d] = spawn_io(argv, -1, lfd, lfd);
    if (lfd >= 0) close(lfd);
    json_t *st = NULL;
    for (int i = 0; i < 400 && dp[d] > 0 && !(st = status_of(sock[d])); i++) usleep(25000);
    if (!st) {
      sd_e2e_fmt(r->note, sizeof r->note, "FAILED: daemon %d did not come up (log: %s)", d, log[d]);
      rc = -1;
    } else {
      const char *l = json_string_value(json_object_get(json_object_get(st, "peers"), "listen"));
      sd_e2e_fmt(addr[d], sizeof addr[d], "%s", l ? l : "");
      json_decref(st);
    }
  }

  double cpu_up = 0; /* the daemons' CPU once up, before any rank connects */
  for (int d = 0; d < nd && rc == 0; d++) cpu_up += sd_e2e_proc_cpu(dp[d]);
  char nums[7][32], rk[NRANKS][16], nr[NRANKS][8];
  sd_e2e_fmt(nums[0], 32, "%" PRIu64, m->hidden);
  sd_e2e_fmt(nums[1], 32, "%" PRIu64, m->intermediate);
  sd_e2e_fmt(nums[2], 32, "%" PRIu64, m->layers);
  sd_e2e_fmt(nums[3], 32, "%" PRIu64, m->vocab);
  sd_e2e_fmt(nums[4], 32, "%" PRIu64, m->max_shard_size);
  sd_e2e_fmt(nums[5], 32, "%d", nd);
  sd_e2e_fmt(nums[6], 32, "%d", repeat);
  pid_t pids[NRANKS] = {0};
  int out[NRANKS] = {-1, -1, -1, -1}, go[NRANKS] = {-1, -1, -1, -1}, started = 0;
  for (int k = 0; k < NRANKS && rc == 0; k++) {
    int d = nd > 1 ? k / 2 : 0;
    sd_e2e_fmt(rk[k], sizeof rk[k], "%d", k);
    sd_e2e_fmt(nr[k], sizeof nr[k], "%d", d);
    char *argv[48] = {(char *)o->rank_bin, "--socket", sock[d], "--save", "bench", "--dir", CKPT_DIR, "--rank",
                      rk[k], "--world-size", "4", "--tp", "2", "--hidden", nums[0], "--intermediate", nums[1],
                      "--layers", nums[2], "--vocab", nums[3], "--dtype", "BF16", "--max-shard-size", nums[4],
                      "--start-barrier"};
    int n = 26;
    if (split == 1) argv[n++] = "--split-inner";
    if (split == 2) argv[n++] = "--split-dim0";
    if (place) argv[n++] = "--place";
    if (repeat > 1) argv[n++] = "--repeat", argv[n++] = nums[6];
    if (nd > 1) {
      argv[n++] = "--nnodes", argv[n++] = nums[5], argv[n++] = "--node-rank", argv[n++] = nr[k];
      argv[n++] = "--leader", argv[n++] = addr[0];
    }
    argv[n] = NULL;
    int p[2], g[2];
    if (pipe2(p, O_CLOEXEC) || pipe2(g, O_CLOEXEC)) {
      rc = -1;
      break;
    }
    pids[k] = spawn_io(argv, g[0], p[1], -1);
    close(p[1]);
    close(g[0]);
    out[k] = p[0];
    go[k] = g[1];
    if (pids[k] < 0) rc = -1;
    else started++;
  }
  /* The rank's barrier: ready/go before each memcpy pass and each save; the last starts the measured save. */
  double t0 = sd_e2e_now(), deadline = t0 + o->timeout_s, cpu0 = 0;
  int rounds = 2 + repeat;
  for (int round = 0; round < rounds && rc == 0; round++) {
    char line[64];
    for (int k = 0; k < NRANKS && rc == 0; k++)
      if (read_line(out[k], line, sizeof line, deadline) != 0 || strcmp(line, "ready") != 0) rc = -1;
    if (rc == 0 && round == 0) {
      for (int d = 0; d < nd; d++) {
        r->attach_cpu += sd_e2e_proc_cpu(dp[d]);
        json_t *st = status_of(sock[d]);
        r->pinned += num(st, "metrics", "pinned_bytes");
        json_decref(st);
      }
      r->attach_cpu -= cpu_up;
    }
    if (rc == 0 && round == rounds - 1) {
      /* A trainer's saves are minutes apart: the pause lets the machine age the ranks' idle pages
       * and, were no arena pinned, the daemon give its staging back (writer_int.h SD_TRIM_MS, 10 s). */
      if (repeat > 1) sleep(WARM_PAUSE_S);
      sync();
      r->load_before = sd_e2e_load1();
      for (int d = 0; d < nd; d++) cpu0 += sd_e2e_proc_cpu(dp[d]);
      if (repeat > 1) add_counters(sock, dp, nd, r, -1);
    }
    for (int k = 0; k < NRANKS && rc == 0; k++)
      if (write(go[k], "go\n", 3) != 3) rc = -1;
  }
  for (int k = 0; k < NRANKS; k++)
    if (go[k] >= 0) close(go[k]);
  if (rc != 0) {
    for (int k = 0; k < NRANKS; k++)
      if (pids[k] > 0) kill(pids[k], SIGKILL);
  }
  int left = started, ok_ranks = 0;
  while (left > 0) {
    uint64_t anon = 0;
    for (int d = 0; d < nd; d++) anon += sd_e2e_proc_status(dp[d], "RssAnon");
    if (anon > r->peak_anon) r->peak_anon = anon;
    for (int k = 0; k < NRANKS; k++) {
      int st;
      if (pids[k] <= 0 || waitpid(pids[k], &st, WNOHANG) != pids[k]) continue;
      pids[k] = 0;
      left--;
      ok_ranks += WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    if (left > 0 && sd_e2e_now() > deadline) {
      for (int k = 0; k < NRANKS; k++)
        if (pids[k] > 0) kill(pids[k], SIGKILL);
      deadline = 1e300;
      rc = -1;
    }
    if (left > 0) usleep(20000);
  }
  for (int d = 0; d < nd && rc == 0; d++) r->cpu_s += sd_e2e_proc_cpu(dp[d]);
  r->cpu_s -= cpu0;
  r->load_after = sd_e2e_load1();
  if (ok_ranks < NRANKS) rc = -1;
  /* Every wait returns at the commit: the longest begin-to-commit is the save's window. */
  for (int k = 0; k < NRANKS; k++) {
    char buf[8192];
    size_t got = 0; /* the rank has exited: read to the end */
    ssize_t n;
    while (out[k] >= 0 && got < sizeof buf - 1 && (n = read(out[k], buf + got, sizeof buf - 1 - got)) > 0)
      got += (size_t)n;
    buf[got] = '\0';
    if (out[k] >= 0) close(out[k]);
    /* The summary is the last line the rank printed. */
    size_t len = strlen(buf);
    while (len > 0 && buf[len - 1] == '\n') buf[--len] = '\0';
    char *line = strrchr(buf, '\n');
    json_t *j = len ? json_loads(line ? line + 1 : buf, 0, NULL) : NULL;
    double span = json_number_value(json_object_get(j, "blocked_s")) + json_number_value(json_object_get(j, "wait_s"));
    if (span > r->seconds) r->seconds = span;
    double b = json_number_value(json_object_get(j, "blocked_s")), c = json_number_value(json_object_get(j, "memcpy_s"));
    if (b > r->blocked) r->blocked = b;
    if (c > r->memcpy_s) r->memcpy_s = c;
    const char *state = json_string_value(json_object_get(j, "state"));
    if (!state || strcmp(state, "committed") != 0) {
      const char *why = json_string_value(json_object_get(j, "message"));
      if (rc == 0 || !r->note[0])
        sd_e2e_fmt(r->note, sizeof r->note, "FAILED: rank %d: %s %s (logs in %s)", k, state ? state : "no summary",
                   why ? why : "", work);
      rc = -1;
    }
    json_decref(j);
  }
  add_counters(sock, dp, nd, r, 1);
  for (int d = 0; d < nd; d++) {
    if (dp[d] > 0) {
      kill(dp[d], SIGTERM);
      int s2;
      waitpid(dp[d], &s2, 0);
    }
    unlink(sock[d]);
  }
  char msg[400] = "";
  if (rc == 0) {
    rc = sd_e2e_verify(ckpt, m, msg, sizeof msg);
    DIR *dir = opendir(ckpt);
    struct dirent *e;
    while (dir && (e = readdir(dir))) {
      struct stat sb;
      char p[PATH_MAX + 300];
      sd_e2e_fmt(p, sizeof p, "%s/%s", ckpt, e->d_name);
      if (stat(p, &sb) == 0 && S_ISREG(sb.st_mode)) r->bytes += (uint64_t)sb.st_size;
    }
    if (dir) closedir(dir);
    sd_e2e_fmt(r->note, sizeof r->note, "%sverify: %s; zero-copy %.1f MiB, gathered %.1f MiB, copied %.1f MiB (%.1f%% direct, %.1f%% gathered); before the save: %.2f GiB of arenas pinned, attach CPU %.3f s",
               rc ? "FAILED: " : "", msg, (double)r->zc / 1048576.0, (double)r->gathered / 1048576.0,
               (double)r->copied / 1048576.0, pct(r->zc, r), pct(r->gathered, r), (double)r->pinned / GIB, r->attach_cpu);
  }
  r->ok = rc == 0;
  if (rc == 0 && !o->keep) sd_e2e_rmtree(ckpt);
  rm_warm(ckpt, repeat);
  return rc;
}

static void raw(const char *work, const sd_e2e_model *m, run *r) {
  char path[PATH_MAX];
  sd_e2e_fmt(path, sizeof path, "%s/raw.bin", work);
  sd_e2e_raw x;
  sync();
  r->ran = 1;
  r->load_before = sd_e2e_load1();
  sd_e2e_raw_write(path, m->file_bytes, 32, 4u << 20, &x);
  r->load_after = sd_e2e_load1();
  r->ok = x.ok;
  r->bytes = x.bytes;
  r->seconds = x.seconds;
  r->cpu_s = x.cpu_s;
  sd_e2e_fmt(r->note, sizeof r->note, "%s%s, qd 32, 4 MiB buffers%s%s", x.ok ? "" : "FAILED: ",
             x.direct ? "O_DIRECT" : "buffered", x.note[0] ? "; " : "", x.note);
  unlink(path);
}

/* ------------------------------------------------------------------------ *
 * Report
 * ------------------------------------------------------------------------ */
static double gbps(const run *r) { return r->ok && r->seconds > 0 ? (double)r->bytes / r->seconds / 1e9 : 0; }
static double spg(const run *r) { return r->bytes ? r->cpu_s / ((double)r->bytes / GIB) : 0; }

static void row(const run *r, double rawg) {
  if (!r->ran) return;
  printf("%-34s %12" PRIu64 " %8.3f %7.3f %6.2f %9.3f %9.1f %9.1f %5" PRIu64 " %8.2f %8.1f %5.2f-%5.2f\n", r->label, r->bytes,
         r->seconds, gbps(r), rawg > 0 ? gbps(r) / rawg : 0, spg(r), (double)r->direct / 1048576.0,
         (double)r->buffered / 1048576.0, r->trips_peak, r->memcpy_s > 0 ? r->blocked / r->memcpy_s : 0,
         (double)r->peak_anon / 1048576.0,
         r->load_before, r->load_after);
}

int main(int argc, char **argv) {
  options o = {.gib = 4, .parent = "/var/tmp", .phases = "acCzZmkfF", .timeout_s = 3600};
  int rc = sd_e2e_parse_opts(&o, argc, argv, "bench_multi", usage);
  if (rc >= 0) return rc;
  if (!o.shardd || !o.rank_bin) {
    fprintf(stderr, "bench_multi: need --shardd and --rank-bin (or SHARDD_BIN, SHARDD_EXAMPLE_RANK)\n");
    return 2;
  }
  sd_e2e_model m = {0};
  if (sd_e2e_build_model(&m, o.gib, o.max_shard_size) != 0 || sd_e2e_plan_model(&m) != 0) return 2;
  char work[PATH_MAX];
  sd_e2e_fmt(work, sizeof work, "%s/shardd-bench-multi.XXXXXX", o.parent);
  if (!mkdtemp(work)) {
    fprintf(stderr, "bench_multi: cannot make a folder under %s: %s\n", o.parent, strerror(errno));
    return 2;
  }
  char machine[2048];
  sd_e2e_machine(work, machine, sizeof machine);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  printf("shardd multi-node and copy benchmark (bench_multi)\n%s", machine);
  printf("model    bench_e2e's: %zu tensors, %" PRIu64 " bytes (%.2f GiB), %zu files; 4 ranks TP=2 x DP=2\n", m.n,
         m.tensor_bytes, (double)m.tensor_bytes / GIB, m.nfiles);
  fflush(stdout);

  /* Capital letters: the same save run twice over the same arenas, the second measured (steady state). */
  run a = {.label = "(a) raw io_uring writer"}, a2 = {.label = "(a) raw again, last"};
  struct {
    char key;
    int nd, split, place, repeat;
    unsigned copy_threads;
    run r;
  } ph[] = {
      {'c', 1, 0, 0, 1, 0, {.label = "(c) 1 daemon, 4 ranks"}},
      {'C', 1, 0, 0, 2, 0, {.label = "(C) (c), 2nd save, same arenas"}},
      {'z', 1, 0, 1, 1, 0, {.label = "(z) 1 daemon, 4 placed ranks"}},
      {'Z', 1, 0, 1, 2, 0, {.label = "(Z) (z), 2nd save, same arenas"}},
      {'m', 2, 0, 1, 1, 0, {.label = "(m) 2 daemons, 2 placed ranks each"}},
      {'k', 1, 1, 0, 1, 1, {.label = "(k1) inner splits, copy_threads 1"}},
      {'k', 1, 1, 0, 1, 2, {.label = "(k2) inner splits, copy_threads 2"}},
      {'f', 1, 2, 1, 1, 0, {.label = "(f) dim-0 splits only, placed"}},
      {'F', 1, 2, 1, 2, 0, {.label = "(F) (f), 2nd save, same arenas"}},
  };
  enum { NPH = sizeof ph / sizeof ph[0] };
  run *c = &ph[0].r, *mm = &ph[4].r, *k1 = &ph[5].r, *k2 = &ph[6].r;
  int fail = 0, do_a = strchr(o.phases, 'a') != NULL;
  if (do_a) raw(work, &m, &a);
  for (size_t i = 0; i < NPH; i++)
    if (strchr(o.phases, ph[i].key) &&
        run_save(&o, work, &m, ph[i].nd, ph[i].copy_threads, ph[i].split, ph[i].place, ph[i].repeat, &ph[i].r) != 0)
      fail = 1;
  if (do_a) raw(work, &m, &a2);

  double ra = gbps(&a) > 0 && gbps(&a2) > 0 ? (gbps(&a) + gbps(&a2)) / 2 : gbps(&a) > 0 ? gbps(&a) : gbps(&a2);
  printf("\n%-34s %12s %8s %7s %6s %9s %9s %9s %5s %8s %8s %11s\n", "phase", "bytes", "seconds", "GB/s", "/raw",
         "CPU s/GiB", "direct MiB", "buf MiB", "trips", "blk/cpy", "anon MiB", "load 1m");
  const run *all[NPH + 2] = {&a};
  for (size_t i = 0; i < NPH; i++) all[i + 1] = &ph[i].r;
  all[NPH + 1] = &a2;
  for (size_t i = 0; i < NPH + 2; i++) row(all[i], ra);
  printf("  /raw = against the mean of the raw runs before and after; CPU = every daemon of the phase (utime+stime);\n"
         "  direct/buf = the daemons' write_bytes_odirect / write_bytes_buffered; trips = copy_trips_peak;\n"
         "  blk/cpy = the slowest rank's blocked time over its plain memcpy; anon = peak RssAnon, daemons summed\n");
  for (size_t i = 0; i < NPH + 2; i++)
    if (all[i]->ran) printf("  %s: %s\n", all[i]->label, all[i]->note);
  if (gbps(mm) > 0 && gbps(c) > 0)
    printf("(m)/(c) = %.2f (bytes forwarded between the daemons: %" PRIu64 ")\n", gbps(mm) / gbps(c), mm->fwd);
  if (gbps(k1) > 0 && gbps(k2) > 0)
    printf("copy stage: (k2)/(k1) = %.2f in GB/s, CPU %.3f vs %.3f s/GiB, on %ld online cores%s\n",
           gbps(k2) / gbps(k1), spg(k2), spg(k1), cores,
           cores <= 2 ? " (two cores also run the 4 ranks: little room to scale)" : "");
  printf("cores for 25 GB/s at the measured daemon CPU:");
  for (size_t i = 1; i <= NPH; i++)
    if (all[i]->ok) printf(" %.4s %.1f", all[i]->label, spg(all[i]) * 25e9 / GIB);
  printf("\n");
  if (!o.keep && !fail) sd_e2e_rmtree(work);
  else printf("kept     %s\n", work);
  free(m.t);
  free(m.st);
  return fail;
}

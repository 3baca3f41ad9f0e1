/* Benchmark: a simulated cluster here: N real daemons on loopback sharing a root, R rank clients each (all in this one process, over real connections), saving DeepSeek-V3's tensor table in FSDP2, HSDP or Megatron EP x PP layout; prints the leader's coordination costs per N x R. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_e2e.h"
#include "cluster_model.h"
#include "sd_reader.h"
#include "shardd/shardd.h"

#define MAX_NODES 256
#define MAX_POINTS 32
/* The released checkpoint's shard size, scaled with the bytes (factor squared) so the file map
 * keeps about the real number of files. */
#define HF_SHARD 5000000000ULL

typedef struct {
  const char *shardd, *tmpdir;
  int points[MAX_POINTS][2], npoints;
  int layout, fp8, layers, check, keep;
  unsigned factor;
  int timeout_s;
  const char *peer_timeout; /* --peer-timeout for the daemons; NULL: their default */
  const char *staging_mib;  /* --staging-mib for the daemons; NULL: their default */
  const char *csv;          /* a file each point's row is appended to (tests/bench/cluster_fit.py) */
} options;

typedef struct {
  pid_t pid;
  char sock[PATH_MAX], log[PATH_MAX];
} daemon_t;

/* What one N x R point measured. */
typedef struct {
  int ok;
  char err[2 * PATH_MAX];
  size_t declared;         /* slice descriptions the ranks sent their daemons */
  double decl_s;           /* the ranks' begin..seal, all of them (one process, one after another) */
  double plan_s;           /* last seal to the last node's assignment */
  double done_commit_s;    /* the leader's last done to its publish */
  double total_s;          /* first begin to the last rank's committed */
  double seal_commit_s;    /* last seal to the last rank's committed */
  uint64_t lead_recv, node_sent_max, node_sent_sum; /* peer bytes less the forwarded tensor bytes */
  uint64_t lead_rss, node_rss_max;                  /* peak RSS (VmHWM), bytes */
  double lead_cpu, node_cpu_max;                    /* user + system seconds */
  double blocked_s;        /* the longest a daemon's loop was blocked (its heartbeats late), any node */
  uint64_t files, tensors, bytes;
  double man_bytes, boxes;  /* the leader's log: manifest and table frames from other nodes, boxes in its plan */
  double lead_plan_s;       /* the leader's log: its last manifest to its plan made and folder created */
  double load0, load1;      /* the load average (1 min) when the point began and ended */
} point;

static double now_real(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------------------ *
 * Daemons
 * ------------------------------------------------------------------------ */
static int start_daemon(const options *o, daemon_t *d, const char *base, const char *root, const char *token, int k,
                        const char *peer_listen) {
  char name[32];
  snprintf(name, sizeof name, "node%d", k);
  if (snprintf(d->sock, sizeof d->sock, "%s/%s.sock", base, name) >= (int)sizeof d->sock ||
      snprintf(d->log, sizeof d->log, "%s/%s.log", base, name) >= (int)sizeof d->log)
    return -1;
  d->pid = fork();
  if (d->pid < 0) return -1;
  if (d->pid == 0) {
    int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    const char *argv[20] = {o->shardd, "--root", root, "--socket", d->sock, "--peer-listen", peer_listen,
                            "--peer-token-file", token, "--node-name", name, "--log-level", "info"};
    int a = 13;
    if (o->peer_timeout) argv[a++] = "--peer-timeout", argv[a++] = o->peer_timeout;
    if (o->staging_mib) argv[a++] = "--staging-mib", argv[a++] = o->staging_mib;
    argv[a] = NULL;
    execv(o->shardd, (char *const *)argv);
    _exit(127);
  }
  for (int i = 0; i < 3000; i++) {
    shardd_client *c = NULL;
    if (shardd_connect(d->sock, &c) == 0) {
      shardd_close(c);
      return 0;
    }
    int st;
    if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
      d->pid = 0;
      return -1;
    }
    sleep_ms(10);
  }
  return -1;
}

static void stop_daemon(daemon_t *d) {
  if (d->pid <= 0) return;
  kill(d->pid, SIGTERM);
  int st;
  for (int i = 0; i < 3000 && waitpid(d->pid, &st, WNOHANG) != d->pid; i++) sleep_ms(10);
  if (kill(d->pid, 0) == 0) {
    kill(d->pid, SIGKILL);
    waitpid(d->pid, &st, 0);
  }
  d->pid = 0;
}

/* The "peers" object of the daemon's status (its listen address, its byte counters), or NULL. */
static json_t *peers_of(const daemon_t *d) {
  shardd_client *c = NULL;
  char *js = NULL;
  json_t *st = NULL, *peers = NULL;
  if (shardd_connect(d->sock, &c) == 0 && shardd_status(c, &js) == 0 && (st = json_loads(js, 0, NULL)))
    peers = json_incref(json_object_get(st, "peers"));
  json_decref(st);
  shardd_free(js);
  if (c) shardd_close(c);
  return peers;
}

static uint64_t u64_of(json_t *o, const char *key) { return (uint64_t)json_integer_value(json_object_get(o, key)); }

static double loadavg(void) {
  double l = -1;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f) {
    if (fscanf(f, "%lf", &l) != 1) l = -1;
    fclose(f);
  }
  return l;
}

/* The wall-clock time (seconds) of the last log line holding needle, 0 when none; a number that
 * follows `after` in that line into *num. */
static double log_time(const char *path, const char *needle, const char *after, double *num) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char line[4096];
  double t = 0;
  while (fgets(line, sizeof line, f)) {
    if (!strstr(line, needle)) continue;
    struct tm tm = {0};
    int ms = 0;
    if (sscanf(line, "%d-%d-%d %d:%d:%d.%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
               &tm.tm_sec, &ms) != 7)
      continue;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    tm.tm_isdst = -1;
    t = (double)mktime(&tm) + ms / 1000.0;
    const char *a = after ? strstr(line, after) : NULL;
    if (a && num) {
      /* "..., 0.123 s after the last done": the number just before `after` */
      const char *q = a;
      while (q > line && q[-1] == ' ') q--;
      while (q > line && (q[-1] == '.' || (q[-1] >= '0' && q[-1] <= '9'))) q--;
      *num = strtod(q, NULL);
    }
  }
  fclose(f);
  return t;
}

/* ------------------------------------------------------------------------ *
 * Ranks: one client, one arena each, all in this process
 * ------------------------------------------------------------------------ */
typedef struct {
  shardd_client *c;
  shardd_arena *a;
} rank_t;

/* Rank r (begun) declares its boxes of every tensor it holds (empty ones too, as FSDP2 does today)
 * with put_many, its bytes in its arena, then seals. */
static int rank_save(const options *o, const cm_model *m, rank_t *rk, int r, int nodes, int per_node,
                     const char *save, size_t *declared, char *err, size_t en) {
  size_t n = m->n, k = 0;
  shardd_tensor_desc *d = malloc(n * sizeof *d);
  uint64_t *box = malloc(n * 4 * sizeof *box), *off = malloc(n * sizeof *off);
  int rc = -1;
  if (!d || !box || !off) {
    snprintf(err, en, "out of memory");
    goto out;
  }
  uint64_t at = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t *start = box + 4 * k, *count = start + 2;
    if (!cm_box(o->layout, m, i, r, nodes, per_node, start, count)) continue;
    const cm_tensor *t = &m->t[i];
    d[k] = (shardd_tensor_desc){.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .shape = t->shape,
                                .start = start, .count = count, .index = (int64_t)i};
    uint64_t len = count[0] * (t->ndim > 1 ? count[1] : 1) * t->esize;
    off[k] = at;
    at += (len + 63) & ~63ULL;
    k++;
  }
  if ((rc = shardd_arena_create(rk->c, at ? at : 64, &rk->a)) != 0) {
    snprintf(err, en, "rank %d: arena of %llu bytes: %s", r, (unsigned long long)at, shardd_last_error(rk->c));
    goto out;
  }
  uint8_t *p = shardd_arena_data(rk->a);
  for (uint64_t i = 0; i < at; i += 4096) p[i] = (uint8_t)(r + i / 4096); /* touched, and not all zero */
  size_t failed = 0;
  if ((k && (rc = shardd_put_many(rk->c, save, d, off, k, rk->a, 0, &failed)) != 0) ||
      (rc = shardd_seal(rk->c, save)) != 0) {
    snprintf(err, en, "rank %d: %s: %s", r, shardd_err_name(rc), shardd_last_error(rk->c));
    goto out;
  }
  *declared += k;
out:
  free(d);
  free(box);
  free(off);
  return rc;
}

static int rm_tree(const char *path) {
  pid_t p = fork();
  if (p == 0) {
    execlp("rm", "rm", "-rf", path, (char *)NULL);
    _exit(127);
  }
  int st;
  waitpid(p, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static void run_point(const options *o, const cm_model *m, int nodes, int per_node, point *pt) {
  memset(pt, 0, sizeof *pt);
  pt->load0 = loadavg();
  char base[PATH_MAX], root[PATH_MAX], token[PATH_MAX];
  snprintf(base, sizeof base, "%s/shardd-cluster-XXXXXX", o->tmpdir);
  if (!mkdtemp(base)) {
    snprintf(pt->err, sizeof pt->err, "mkdtemp %s: %s", base, strerror(errno));
    return;
  }
  if (snprintf(root, sizeof root, "%s/root", base) >= (int)sizeof root ||
      snprintf(token, sizeof token, "%s/token", base) >= (int)sizeof token) {
    snprintf(pt->err, sizeof pt->err, "the scratch folder's path is too long");
    return;
  }
  mkdir(root, 0755);
  int tf = open(token, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (tf < 0 || write(tf, "bench-cluster-secret-0123456789abcdef", 37) != 37) {
    snprintf(pt->err, sizeof pt->err, "token file: %s", strerror(errno));
    if (tf >= 0) close(tf);
    return;
  }
  close(tf);
  int world = nodes * per_node;
  daemon_t *dm = calloc((size_t)nodes, sizeof *dm);
  rank_t *rk = calloc((size_t)world, sizeof *rk);
  char leader[64] = "";
  if (!dm || !rk) {
    snprintf(pt->err, sizeof pt->err, "out of memory");
    goto out;
  }
  for (int k = 0; k < nodes; k++) {
    if (start_daemon(o, &dm[k], base, root, token, k, "127.0.0.1:0") != 0) {
      snprintf(pt->err, sizeof pt->err, "node %d did not start (see %s)", k, dm[k].log);
      goto out;
    }
    if (k == 0) {
      json_t *peers = peers_of(&dm[0]);
      const char *listen = json_string_value(json_object_get(peers, "listen"));
      snprintf(leader, sizeof leader, "%s", listen ? listen : "");
      json_decref(peers);
    }
  }
  uint64_t mss = HF_SHARD / ((uint64_t)o->factor * o->factor);
  shardd_save_opts so = {.save = "cluster", .dir = "deepseek-v3", .world_size = (uint32_t)world,
                         .max_shard_size = mss ? mss : 1, .nnodes = (uint32_t)nodes, .leader = leader};
  double t_first = now_real(), t_seal = 0;
  /* Every rank begins first, as a job's ranks reach a save at about the same time (one process
   * declaring them one after another would otherwise look like ranks that never came, past
   * join_timeout); then they declare and seal in turn, one rank of each node after another, so
   * no node's ranks sit silent past idle_timeout while the others are served. */
  for (int r = 0; r < world; r++) {
    shardd_save_opts ro = so;
    ro.rank = (uint32_t)r;
    ro.node_rank = (uint32_t)(r / per_node);
    int rc = shardd_connect(dm[r / per_node].sock, &rk[r].c);
    if (rc == 0) rc = shardd_begin(rk[r].c, &ro);
    if (rc != 0) {
      snprintf(pt->err, sizeof pt->err, "rank %d: %s: %s", r, shardd_err_name(rc),
               rk[r].c ? shardd_last_error(rk[r].c) : shardd_last_error(NULL));
      goto out;
    }
  }
  for (int j = 0; j < per_node; j++)
    for (int k = 0; k < nodes; k++) {
      int r = k * per_node + j;
      if (rank_save(o, m, &rk[r], r, nodes, per_node, so.save, &pt->declared, pt->err, sizeof pt->err) != 0) goto out;
      t_seal = now_real();
    }
  pt->decl_s = t_seal - t_first;
  for (int r = 0; r < world; r++) {
    shardd_result res;
    int rc = shardd_wait(rk[r].c, so.save, o->timeout_s * 1000, &res);
    if (rc != 0) {
      snprintf(pt->err, sizeof pt->err, "rank %d: %s: %s", r, shardd_err_name(rc), shardd_last_error(rk[r].c));
      goto out;
    }
    pt->files = res.files, pt->tensors = res.tensors, pt->bytes = res.bytes;
  }
  pt->total_s = now_real() - t_first;
  pt->seal_commit_s = now_real() - t_seal;
  /* what the daemons say and the kernel counts, before they stop */
  for (int k = 0; k < nodes; k++) {
    json_t *peers = peers_of(&dm[k]);
    uint64_t data_in = u64_of(peers, "bytes_received"), data_out = u64_of(peers, "bytes_forwarded");
    uint64_t in = u64_of(peers, "net_bytes_received"), out = u64_of(peers, "net_bytes_sent");
    json_decref(peers);
    uint64_t rss = sd_e2e_proc_status(dm[k].pid, "VmHWM");
    double cpu = sd_e2e_proc_cpu(dm[k].pid);
    if (k == 0) {
      pt->lead_recv = in > data_in ? in - data_in : 0;
      pt->lead_rss = rss;
      pt->lead_cpu = cpu;
    } else {
      uint64_t sent = out > data_out ? out - data_out : 0;
      pt->node_sent_sum += sent;
      if (sent > pt->node_sent_max) pt->node_sent_max = sent;
      if (rss > pt->node_rss_max) pt->node_rss_max = rss;
      if (cpu > pt->node_cpu_max) pt->node_cpu_max = cpu;
    }
  }
  double last_assign = 0;
  for (int k = 0; k < nodes; k++) {
    double t = log_time(dm[k].log, "files (", NULL, NULL), late = 0;
    if (t > last_assign) last_assign = t;
    if (log_time(dm[k].log, "heartbeats ran", "s late", &late) > 0 && late > pt->blocked_s) pt->blocked_s = late;
  }
  pt->plan_s = last_assign > 0 ? last_assign - t_seal : -1;
  pt->done_commit_s = -1;
  log_time(dm[0].log, "published", "s after the last done", &pt->done_commit_s);
  pt->man_bytes = pt->boxes = pt->lead_plan_s = -1;
  log_time(dm[0].log, "bytes of manifest and table frames", " bytes of manifest", &pt->man_bytes);
  log_time(dm[0].log, "bytes of manifest and table frames", " boxes from", &pt->boxes);
  log_time(dm[0].log, "bytes of manifest and table frames", " s\n", &pt->lead_plan_s);
  pt->load1 = loadavg();
  if (o->check) {
    /* the strict reader over the published folder: every tensor there, the index and shards agree */
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", root, so.dir) >= (int)sizeof path) goto out;
    shardd_ckpt *c = NULL;
    int rc = shardd_ckpt_open(path, &c);
    if (rc != 0) {
      snprintf(pt->err, sizeof pt->err, "reading %s back: %s: %s", path, shardd_err_name(rc),
               shardd_last_error(NULL));
      goto out;
    }
    size_t nt = shardd_ckpt_count(c);
    shardd_ckpt_close(c);
    if (nt != m->n) {
      snprintf(pt->err, sizeof pt->err, "the checkpoint holds %zu tensors, the model %zu", nt, m->n);
      goto out;
    }
  }
  pt->ok = 1;
out:
  for (int r = 0; rk && r < world; r++) {
    if (rk[r].a) shardd_arena_destroy(rk[r].a);
    if (rk[r].c) shardd_close(rk[r].c);
  }
  for (int k = 0; dm && k < nodes; k++) stop_daemon(&dm[k]);
  if (!pt->ok && dm) fprintf(stderr, "bench_cluster: %dx%d: %s (logs kept in %s)\n", nodes, per_node, pt->err, base);
  else if (!o->keep) rm_tree(base);
  free(dm);
  free(rk);
}

/* ------------------------------------------------------------------------ *
 * Command line and the table
 * ------------------------------------------------------------------------ */
static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_cluster --shardd PATH [--points 1x8,2x8,...] [--layout fsdp2|hsdp|ep-pp] [--fp8]\n"
          "                     [--factor F] [--layers L] [--tmp DIR] [--timeout S] [--peer-timeout S]\n"
          "                     [--staging-mib N] [--csv FILE] [--check] [--keep]\n"
          "N daemons on loopback sharing one root, R ranks each held by this process over real\n"
          "connections, save DeepSeek-V3's tensor table (its names, dtypes and shapes; every dim divided\n"
          "by F, default 128, and the shard size by F^2, so the file map keeps about the real file count)\n"
          "in the given layout: fsdp2 (dim 0 chunked over every rank, empty boxes declared), hsdp (chunked\n"
          "over the 8 ranks of a node, every node a replica), ep-pp (Megatron: 8 pipeline stages, experts\n"
          "over the ranks of a stage, the rest replicated). --fp8: F8_E4M3 linear weights with their F32\n"
          "weight_scale_inv (about 90k tensors). --layers L: the first L layers only (a small case).\n"
          "--check reads the published checkpoint back with the strict reader. Prints per N x R: the\n"
          "ranks' declaration time (every rank begun, then each declares and seals in turn), last seal to last\n"
          "assign (planning; -1 on one node, which plans alone), last seal to the last rank's committed,\n"
          "peer bytes received by the leader and sent by the busiest node and all nodes (forwarded tensor\n"
          "bytes excluded: the metadata), peak RSS (MiB) and CPU seconds of the leader and the busiest\n"
          "other node, the leader's last done to its publish, and the longest any daemon's loop was\n"
          "blocked (its heartbeats late: past --peer-timeout, default the daemons' 30 s, a peer is lost);\n"
          "from the leader's log: the manifest and table frames it received (man_MiB), the boxes it\n"
          "planned with, and its last manifest to the plan made and folder created (lplan_s); the 1-minute\n"
          "load average at the point's start. --staging-mib N: each daemon's staging (default theirs,\n"
          "128; 64 daemons of 128 MiB locked each may not fit a small machine). --csv FILE: every point's\n"
          "row appended to FILE, for tests/bench/cluster_fit.py.\n");
}

static int parse_points(const char *s, options *o) {
  o->npoints = 0;
  while (*s) {
    int n, r, used;
    if (sscanf(s, "%dx%d%n", &n, &r, &used) != 2 || n < 1 || n > MAX_NODES || r < 1 || r > 64 ||
        o->npoints == MAX_POINTS)
      return -1;
    o->points[o->npoints][0] = n;
    o->points[o->npoints][1] = r;
    o->npoints++;
    s += used;
    if (*s == ',') s++;
    else if (*s) return -1;
  }
  return o->npoints ? 0 : -1;
}

static void mib(char *out, size_t n, uint64_t b) { snprintf(out, n, "%.2f", (double)b / 1048576.0); }

int main(int argc, char **argv) {
  options o = {.tmpdir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", .factor = 128, .timeout_s = 3600};
  parse_points("1x8", &o);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--shardd") && v) o.shardd = argv[++i];
    else if (!strcmp(a, "--points") && v) {
      if (parse_points(argv[++i], &o)) {
        fprintf(stderr, "bench_cluster: --points wants NxR[,NxR...], got '%s'\n", v);
        return 2;
      }
    } else if (!strcmp(a, "--layout") && v) {
      i++;
      o.layout = !strcmp(v, "fsdp2") ? CM_FSDP : !strcmp(v, "hsdp") ? CM_HSDP : !strcmp(v, "ep-pp") ? CM_EP : -1;
      if (o.layout < 0) {
        fprintf(stderr, "bench_cluster: --layout is fsdp2, hsdp or ep-pp, got '%s'\n", v);
        return 2;
      }
    } else if (!strcmp(a, "--factor") && v) o.factor = (unsigned)atoi(argv[++i]);
    else if (!strcmp(a, "--layers") && v) o.layers = atoi(argv[++i]);
    else if (!strcmp(a, "--tmp") && v) o.tmpdir = argv[++i];
    else if (!strcmp(a, "--timeout") && v) o.timeout_s = atoi(argv[++i]);
    else if (!strcmp(a, "--peer-timeout") && v) o.peer_timeout = argv[++i];
    else if (!strcmp(a, "--staging-mib") && v) o.staging_mib = argv[++i];
    else if (!strcmp(a, "--csv") && v) o.csv = argv[++i];
    else if (!strcmp(a, "--fp8")) o.fp8 = 1;
    else if (!strcmp(a, "--check")) o.check = 1;
    else if (!strcmp(a, "--keep")) o.keep = 1;
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else {
      usage(stderr);
      return 2;
    }
  }
  if (!o.shardd || o.factor < 1 || o.timeout_s < 1) {
    usage(stderr);
    return 2;
  }
  /* a request (the ranks' batches of puts) may wait on a busy daemon as long as a point may take */
  char tmo[32];
  snprintf(tmo, sizeof tmo, "%d", o.timeout_s * 1000);
  setenv("SHARDD_TIMEOUT_MS", tmo, 1);
  /* 64 x 8 ranks in this process: a connection and an arena each */
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  cm_model m;
  if (cm_deepseek_v3(&m, o.factor, o.fp8, o.layers) != 0) {
    fprintf(stderr, "bench_cluster: out of memory building the model\n");
    return 1;
  }
  printf("bench_cluster: DeepSeek-V3%s, %zu tensors, %d layers, dims / %u: %.1f MiB; layout %s\n",
         o.fp8 ? " fp8" : " bf16", m.n, m.layers, o.factor, (double)m.bytes / 1048576.0, cm_layout_name(o.layout));
  printf("%-6s %10s %8s %8s %8s %10s %10s %10s %9s %8s %9s %8s %8s %8s %6s %8s %8s %8s %5s\n", "NxR", "declared",
         "decl_s", "plan_s", "seal->c", "lead_MiB", "node_MiB", "nodes_MiB", "lead_RSS", "lead_s", "node_RSS",
         "node_s", "done->c", "blocked", "files", "man_MiB", "boxes", "lplan_s", "load");
  fflush(stdout);
  int bad = 0;
  for (int p = 0; p < o.npoints; p++) {
    point pt;
    run_point(&o, &m, o.points[p][0], o.points[p][1], &pt);
    char nxr[16], lr[16], ns[16], nss[16], lrss[16], nrss[16];
    snprintf(nxr, sizeof nxr, "%dx%d", o.points[p][0], o.points[p][1]);
    if (!pt.ok) {
      printf("%-6s failed: %s\n", nxr, pt.err);
      bad = 1;
      continue;
    }
    mib(lr, sizeof lr, pt.lead_recv);
    mib(ns, sizeof ns, pt.node_sent_max);
    mib(nss, sizeof nss, pt.node_sent_sum);
    mib(lrss, sizeof lrss, pt.lead_rss);
    mib(nrss, sizeof nrss, pt.node_rss_max);
    printf("%-6s %10zu %8.2f %8.2f %8.2f %10s %10s %10s %9s %8.2f %9s %8.2f %8.3f %8.1f %6llu %8.2f %8.0f %8.3f "
           "%5.1f\n", nxr, pt.declared, pt.decl_s, pt.plan_s, pt.seal_commit_s, lr, ns, nss, lrss, pt.lead_cpu, nrss,
           pt.node_cpu_max, pt.done_commit_s, pt.blocked_s, (unsigned long long)pt.files,
           pt.man_bytes >= 0 ? pt.man_bytes / 1048576.0 : -1.0, pt.boxes, pt.lead_plan_s, pt.load0);
    fflush(stdout);
    FILE *cf = o.csv ? fopen(o.csv, "a") : NULL;
    if (cf) {
      fprintf(cf, "%s,%s,%zu,%d,%d,%zu,%.3f,%.3f,%.3f,%llu,%llu,%llu,%llu,%.3f,%llu,%.3f,%.3f,%.1f,%.0f,%.0f,%.3f,%.2f,%.2f\n",
              cm_layout_name(o.layout), o.fp8 ? "fp8" : "bf16", m.n, o.points[p][0], o.points[p][1], pt.declared,
              pt.decl_s, pt.plan_s, pt.seal_commit_s, (unsigned long long)pt.lead_recv,
              (unsigned long long)pt.node_sent_max, (unsigned long long)pt.node_sent_sum,
              (unsigned long long)pt.lead_rss, pt.lead_cpu, (unsigned long long)pt.node_rss_max, pt.node_cpu_max,
              pt.done_commit_s, pt.blocked_s, pt.man_bytes, pt.boxes, pt.lead_plan_s, pt.load0, pt.load1);
      fclose(cf);
    }
  }
  cm_free(&m);
  return bad;
}

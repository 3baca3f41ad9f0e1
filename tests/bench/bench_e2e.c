/* Benchmark: the same checkpoint written durably by (a) a raw O_DIRECT writer, (b) one serial writer, (c) shardd with 4 ranks ((s) streamed, (z) placed for zero-copy). */
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
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_e2e.h"
#include "sd_writer_sync.h"
#include "synth.h"

extern char **environ;

#define TP 2
#define SAVE_ID "bench"
#define CKPT_DIR "bench-ckpt"

typedef sd_e2e_opts options;

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_e2e [options]\n"
          "Writes one Llama-shaped BF16 checkpoint three ways on the same file system, each durable:\n"
          "(a) raw io_uring O_DIRECT sequential writer, (b) the serial sync writer, (c) shardd with 4\n"
          "example ranks (TP=2 x DP=2) through shared memory; prints one table. Never fails on a time;\n"
          "exits 1 only when (b) or (c) leaves a checkpoint the strict reader or the byte check refuses.\n"
          "  --gib N              model size in GiB (default 4; fractions allowed)\n"
          "  --quick              0.25 GiB (what meson's benchmark() runs)\n"
          "  --dir PARENT         make the work folder under PARENT (default /var/tmp)\n"
          "  --shardd PATH        daemon binary (default $SHARDD_BIN, else next to this build)\n"
          "  --rank-bin PATH      example rank (default $SHARDD_EXAMPLE_RANK, else next to this build)\n"
          "  --phases LIST        any of a, b, c, s, z (default abcsz): s is (c) with streaming ranks,\n"
          "                       z (c) with slices placed for zero-copy writes (shardd_place)\n"
          "  --max-shard-size N   bytes per shard file (default: a quarter of the model)\n"
          "  --timeout S          kill the ranks if they run longer than S seconds (default 3600;\n"
          "                       a busy 2-core machine needs minutes just to generate 4 GiB)\n"
          "  --keep               keep the work folder (kept anyway when a phase fails)\n"
          "  --raw-buf-mib N      (a)'s write size (default 4: shardd's staging chunk; qd 32)\n");
}

/* ------------------------------------------------------------------------ *
 * Small helpers
 * ------------------------------------------------------------------------ */
/* Bytes and a "name:size;" listing of the regular files in dir. */
static uint64_t dir_listing(const char *dir, char *list, size_t len) {
  struct dirent **ents;
  int n = scandir(dir, &ents, NULL, alphasort);
  uint64_t total = 0;
  size_t used = 0;
  if (list && len) list[0] = '\0';
  for (int i = 0; i < n; i++) {
    char p[PATH_MAX];
    struct stat sb;
    sd_e2e_fmt(p, sizeof p, "%s/%s", dir, ents[i]->d_name);
    if (stat(p, &sb) == 0 && S_ISREG(sb.st_mode)) {
      total += (uint64_t)sb.st_size;
      if (list && used < len) {
        int w = sd_e2e_fmt(list + used, len - used, "%s:%lld;", ents[i]->d_name, (long long)sb.st_size);
        if (w > 0) used += (size_t)w;
      }
    }
    free(ents[i]);
  }
  if (n >= 0) free(ents);
  return total;
}

static int pidfd_open_(pid_t pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }

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
    fprintf(stderr, "bench_e2e: cannot start %s: %s\n", argv[0], strerror(rc));
    return -1;
  }
  return pid;
}

static pid_t spawn(char *const argv[], int out_fd, int err_fd) { return spawn_io(argv, -1, out_fd, err_fd); }

/* Reads one line (up to '\n', never past it) from fd within timeout_s;
 * returns 0 when it is exactly "ready". */
static int read_ready(int fd, double deadline) {
  char line[16];
  size_t n = 0;
  while (n < sizeof line - 1) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    double left = deadline - sd_e2e_now();
    if (left <= 0 || poll(&p, 1, (int)(left * 1000) + 1) <= 0) return -1;
    if (read(fd, line + n, 1) != 1) return -1;
    if (line[n] == '\n') break;
    n++;
  }
  line[n] = '\0';
  return strcmp(line, "ready") == 0 ? 0 : -1;
}

/* Waits up to timeout_s for pid to exit; returns its wait status or -1. */
static int wait_exit(pid_t pid, double timeout_s) {
  int pfd = pidfd_open_(pid), st;
  if (pfd >= 0) {
    struct pollfd p = {.fd = pfd, .events = POLLIN};
    poll(&p, 1, (int)(timeout_s * 1000));
    close(pfd);
  }
  pid_t r = waitpid(pid, &st, pfd >= 0 ? WNOHANG : 0);
  return r == pid ? st : -1;
}

static int socket_ready(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  sd_e2e_fmt(sa.sun_path, sizeof sa.sun_path, "%s", path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  int ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
  close(fd);
  return ok;
}

/* ------------------------------------------------------------------------ *
 * Phases
 * ------------------------------------------------------------------------ */

static void phase_raw(const char *work, const sd_e2e_model *m, size_t bufsize, phase *ph) {
  char path[PATH_MAX];
  sd_e2e_fmt(path, sizeof path, "%s/raw.bin", work);
  sd_e2e_raw r;
  sync();
  ph->ran = 1;
  ph->load_before = sd_e2e_load1();
  sd_e2e_raw_write(path, m->file_bytes, 32, bufsize, &r);
  ph->load_after = sd_e2e_load1();
  ph->ok = r.ok;
  ph->bytes = r.bytes;
  ph->seconds = r.seconds;
  ph->cpu_s = r.cpu_s;
  sd_e2e_fmt(ph->note, sizeof ph->note, "%s%s, qd 32, %zu MiB buffers%s, one file%s%s%s",
           r.ok ? "" : "FAILED: ", r.direct ? "O_DIRECT" : "buffered", bufsize >> 20,
           r.fixed_bufs ? " (registered)" : "", r.preallocated ? " (fallocated first)" : "",
           r.note[0] ? "; " : "", r.note);
  unlink(path);
}

static int phase_serial(const char *work, const sd_e2e_model *m, phase *ph, char *listing,
                        size_t llen, int keep) {
  ph->ran = 1;
  uint8_t *buf = malloc(m->tensor_bytes ? m->tensor_bytes : 1);
  const void **data = calloc(m->n, sizeof *data);
  if (!buf || !data) {
    sd_e2e_fmt(ph->note, sizeof ph->note, "FAILED: cannot hold the %.2f GiB model in memory",
             (double)m->tensor_bytes / GIB);
    free(buf);
    free(data);
    return -1;
  }
  /* The trainer's tensors already sit in memory: generated before timing. */
  uint64_t off = 0;
  for (size_t i = 0; i < m->n; i++) {
    sd_synth_fill(m->t[i].key, 0, m->t[i].nbytes, buf + off);
    data[i] = buf + off;
    off += m->t[i].nbytes;
  }
  char dir[PATH_MAX];
  sd_e2e_fmt(dir, sizeof dir, "%s/serial-ckpt", work);
  sd_plan_opts po = {.max_shard_size = m->max_shard_size, .metadata = sd_e2e_example_md, .nmetadata = 3};
  sd_write_result res;
  sd_error err;
  sync();
  ph->load_before = sd_e2e_load1();
  double t0 = sd_e2e_now(), c0 = sd_e2e_self_cpu();
  int rc = sd_write_checkpoint_sync(dir, m->st, data, m->n, &po, &res, &err);
  ph->seconds = sd_e2e_now() - t0;
  ph->cpu_s = sd_e2e_self_cpu() - c0;
  ph->load_after = sd_e2e_load1();
  free(buf);
  free(data);
  if (rc != 0) {
    sd_e2e_fmt(ph->note, sizeof ph->note, "FAILED: %s", err.msg);
    return -1;
  }
  ph->bytes = dir_listing(dir, listing, llen);
  char msg[400];
  rc = sd_e2e_verify(dir, m, msg, sizeof msg);
  ph->ok = rc == 0;
  sd_e2e_fmt(ph->note, sizeof ph->note, "%s%zu files; verify: %s", rc ? "FAILED: " : "", res.nfiles, msg);
  if (!keep && rc == 0) sd_e2e_rmtree(dir);
  return rc;
}


static void parse_rank(const char *text, rank_out *r) {
  sd_e2e_fmt(r->state, sizeof r->state, "no output");
  /* The summary is the last line the rank printed. */
  size_t n = strlen(text);
  while (n > 0 && text[n - 1] == '\n') n--;
  const char *line = text + n;
  while (line > text && line[-1] != '\n') line--;
  json_t *j = n ? json_loadb(line, (size_t)(text + n - line), 0, NULL) : NULL;
  if (!j) return;
  const char *st = json_string_value(json_object_get(j, "state"));
  sd_e2e_fmt(r->state, sizeof r->state, "%s", st ? st : "?");
  r->bytes = (uint64_t)json_integer_value(json_object_get(j, "bytes"));
  r->blocked = json_number_value(json_object_get(j, "blocked_s"));
  r->memcpy_s = json_number_value(json_object_get(j, "memcpy_s"));
  r->setup = json_number_value(json_object_get(j, "setup_s"));
  r->begin = json_number_value(json_object_get(j, "begin_s"));
  r->puts = json_number_value(json_object_get(j, "puts_s"));
  r->seal = json_number_value(json_object_get(j, "seal_s"));
  r->wait = json_number_value(json_object_get(j, "wait_s"));
  const char *msg = json_string_value(json_object_get(j, "message"));
  if (msg) sd_e2e_fmt(r->error, sizeof r->error, "%s", msg);
  json_decref(j);
}

/* Removes the shm segments of ranks that died without cleaning up. */
static void unlink_rank_shm(const pid_t *pids) {
  DIR *d = opendir("/dev/shm");
  struct dirent *e;
  if (!d) return;
  while ((e = readdir(d))) {
    for (int r = 0; r < NRANKS; r++) {
      char pre[64];
      int n = sd_e2e_fmt(pre, sizeof pre, "shardd-%d-", (int)pids[r]);
      if (pids[r] > 0 && strncmp(e->d_name, pre, (size_t)n) == 0) {
        char nm[300];
        sd_e2e_fmt(nm, sizeof nm, "/%s", e->d_name);
        shm_unlink(nm);
      }
    }
  }
  closedir(d);
}

/* The daemon's summary line, and (streamed saves, debug log) how much it
 * had written when the last rank sealed. */
static void read_daemon_line(const char *log, char *out, size_t len, char *sealed, size_t slen) {
  FILE *f = fopen(log, "r");
  char line[1024];
  out[0] = sealed[0] = '\0';
  if (!f) return;
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = '\0';
    if (strstr(line, "committed save") || strstr(line, "failed")) sd_e2e_fmt(out, len, "%s", line);
    const char *w = strstr(line, "every rank sealed with");
    if (w) sd_e2e_fmt(sealed, slen, "%s", w);
  }
  fclose(f);
}

static int run_ranks(const options *o, const sd_e2e_model *m, const char *sock, pid_t dpid,
                     int streamed, phase *ph, shardd_stats *s) { /* streamed 2: (z), placed */
  char nums[8][32], rk[NRANKS][16];
  sd_e2e_fmt(nums[0], 32, "%" PRIu64, m->hidden);
  sd_e2e_fmt(nums[1], 32, "%" PRIu64, m->intermediate);
  sd_e2e_fmt(nums[2], 32, "%" PRIu64, m->layers);
  sd_e2e_fmt(nums[3], 32, "%" PRIu64, m->vocab);
  sd_e2e_fmt(nums[4], 32, "%" PRIu64, m->max_shard_size);
  sd_e2e_fmt(nums[5], 32, "%d", NRANKS);
  sd_e2e_fmt(nums[6], 32, "%d", TP);
  pid_t pids[NRANKS] = {0};
  int pipes[NRANKS] = {-1, -1, -1, -1}, pfds[NRANKS] = {-1, -1, -1, -1};
  int gos[NRANKS] = {-1, -1, -1, -1};
  double end[NRANKS] = {0};
  int left = 0, rc = 0;

  double t0 = sd_e2e_now();
  for (int r = 0; r < NRANKS; r++) {
    sd_e2e_fmt(rk[r], sizeof rk[r], "%d", r);
    char *argv[] = {(char *)o->rank_bin, "--socket", (char *)sock, "--save", SAVE_ID, "--dir",
                    CKPT_DIR, "--rank", rk[r], "--world-size", nums[5], "--tp", nums[6],
                    "--hidden", nums[0], "--intermediate", nums[1], "--layers", nums[2],
                    "--vocab", nums[3], "--dtype", "BF16", "--max-shard-size", nums[4],
                    "--start-barrier", streamed == 1 ? "--stream" : streamed == 2 ? "--place" : NULL, NULL};
    int p[2], g[2];
    if (pipe2(p, O_CLOEXEC) != 0) break;
    if (pipe2(g, O_CLOEXEC) != 0) {
      close(p[0]);
      close(p[1]);
      break;
    }
    pids[r] = spawn_io(argv, g[0], p[1], -1);
    close(p[1]);
    close(g[0]);
    pipes[r] = p[0];
    gos[r] = g[1];
    if (pids[r] < 0) break;
    pfds[r] = pidfd_open_(pids[r]);
    left++;
  }
  if (left < NRANKS) {
    /* A save with a missing rank never ends: stop the others. */
    for (int r = 0; r < NRANKS; r++)
      if (pids[r] > 0) kill(pids[r], SIGKILL);
    rc = -1;
  }
  /* Each rank generates its tensors, connects and makes its arena, then
   * waits: a trainer's ranks reach a checkpoint step together, so the save
   * is timed from one start signal, not from staggered process start-up. */
  /* Three times: the first two gos start the two passes of every rank's
   * memcpy baseline at once, the third the save. */
  double deadline = t0 + o->timeout_s, t_go = 0, cpu0 = 0;
  for (int round = 0; round < 3; round++) {
    for (int r = 0; r < NRANKS && rc == 0; r++)
      if (read_ready(pipes[r], deadline) != 0) {
        fprintf(stderr, "bench_e2e: rank %d did not get ready (see its stderr)\n", r);
        rc = -1;
      }
    if (rc != 0) {
      for (int r = 0; r < NRANKS; r++)
        if (pids[r] > 0) kill(pids[r], SIGKILL);
    }
    if (round == 0) s->ready_s = sd_e2e_now() - t0;
    if (round == 2) {
      sync();
      cpu0 = sd_e2e_proc_cpu(dpid);
      ph->load_before = sd_e2e_load1();
      t_go = sd_e2e_now();
    }
    for (int r = 0; r < NRANKS; r++)
      if (gos[r] >= 0 && write(gos[r], "go\n", 3) != 3) rc = -1;
  }
  for (int r = 0; r < NRANKS; r++)
    if (gos[r] >= 0) close(gos[r]);
  /* Reap ranks as they finish; meanwhile sample the daemon's memory. */
  while (left > 0) {
    struct pollfd p[NRANKS];
    for (int r = 0; r < NRANKS; r++) p[r] = (struct pollfd){.fd = end[r] == 0 ? pfds[r] : -1, .events = POLLIN};
    poll(p, NRANKS, 20);
    uint64_t anon = sd_e2e_proc_status(dpid, "RssAnon"), shm = sd_e2e_proc_status(dpid, "RssShmem");
    if (anon > s->peak_anon) s->peak_anon = anon;
    if (shm > s->peak_shmem) s->peak_shmem = shm;
    for (int r = 0; r < NRANKS; r++) {
      int st;
      struct rusage ru;
      if (pids[r] <= 0 || end[r] != 0 || wait4(pids[r], &st, WNOHANG, &ru) != pids[r]) continue;
      end[r] = sd_e2e_now();
      left--;
      close(pfds[r]);
      s->r[r].exit_ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
      s->r[r].signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
      s->r[r].cpu = (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                    (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
    }
    if (left > 0 && sd_e2e_now() > deadline) {
      fprintf(stderr, "bench_e2e: ranks still running after %.1f s; killing them\n", deadline - t0);
      for (int r = 0; r < NRANKS; r++)
        if (pids[r] > 0 && end[r] == 0) kill(pids[r], SIGKILL);
      deadline = 1e300;
      rc = -1;
    }
  }
  double t1 = sd_e2e_now();
  ph->load_after = sd_e2e_load1();
  s->wall_s = t1 - t0;
  s->go_s = t1 - t_go;
  s->daemon_cpu_s = sd_e2e_proc_cpu(dpid) - cpu0;
  s->hwm = sd_e2e_proc_status(dpid, "VmHWM");
  s->anon_end = sd_e2e_proc_status(dpid, "RssAnon");
  s->shmem_end = sd_e2e_proc_status(dpid, "RssShmem");
  unlink_rank_shm(pids);

  double lo = 1e300, hi = 0, tail = 1e300;
  for (int r = 0; r < NRANKS; r++) {
    char buf[8192];
    ssize_t n = pipes[r] >= 0 ? read(pipes[r], buf, sizeof buf - 1) : -1;
    buf[n > 0 ? n : 0] = '\0';
    if (pipes[r] >= 0) close(pipes[r]);
    s->r[r].rank = r;
    parse_rank(buf, &s->r[r]);
    if (s->r[r].signal) sd_e2e_fmt(s->r[r].state, sizeof s->r[r].state, "signal %d", s->r[r].signal);
    if (!s->r[r].exit_ok || strcmp(s->r[r].state, "committed") != 0) rc = -1;
    /* Every wait returns at the commit: begin-to-commit is longest for the
     * rank that began first, so the longest is the save's whole window. */
    double span = s->r[r].blocked + s->r[r].wait;
    if (span > hi) hi = span;
    if (span < lo) lo = span;
    /* The daemon plans and writes once the last rank seals; that rank's
     * wait is the shortest. */
    if (s->r[r].wait < tail) tail = s->r[r].wait;
  }
  s->tail_s = tail < 1e300 ? tail : 0;
  s->window_s = hi;
  s->spread_s = hi - lo;
  return rc;
}

static int phase_shardd(const options *o, const char *work, const sd_e2e_model *m, int streamed,
                        const char *serial_listing, phase *ph, shardd_stats *s) {
  ph->ran = 1;
  char root[PATH_MAX], sock[PATH_MAX], log[PATH_MAX], ckpt[PATH_MAX + 16];
  sd_e2e_fmt(root, sizeof root, "%s/root", work);
  sd_e2e_fmt(log, sizeof log, "%s/shardd.log", work);
  sd_e2e_fmt(sock, sizeof sock, "%s/shardd.sock", work);
  if (strlen(sock) >= sizeof((struct sockaddr_un *)0)->sun_path)
    sd_e2e_fmt(sock, sizeof sock, "/tmp/shardd-bench-%d.sock", (int)getpid());
  sd_e2e_fmt(ckpt, sizeof ckpt, "%s/" CKPT_DIR, root);
  mkdir(root, 0755);
  int lfd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  char *dargv[] = {(char *)o->shardd, "--root", root, "--socket", sock, "--log-level", "debug", NULL};
  pid_t dpid = spawn(dargv, lfd, lfd);
  if (lfd >= 0) close(lfd);
  if (dpid < 0) {
    sd_e2e_fmt(ph->note, sizeof ph->note, "FAILED: cannot start %s", o->shardd);
    return -1;
  }
  int up = 0, st;
  for (int i = 0; i < 400 && !up; i++) {
    up = socket_ready(sock);
    if (!up && waitpid(dpid, &st, WNOHANG) == dpid) break;
    if (!up) usleep(25000);
  }
  if (!up) {
    sd_e2e_fmt(ph->note, sizeof ph->note, "FAILED: the daemon did not come up (log: %s)", log);
    kill(dpid, SIGKILL);
    waitpid(dpid, &st, 0);
    return -1;
  }

  int rc = run_ranks(o, m, sock, dpid, streamed, ph, s);

  /* Stop the daemon as an operator would; it must exit cleanly. */
  kill(dpid, SIGTERM);
  s->daemon_exit = wait_exit(dpid, 30);
  if (s->daemon_exit == -1) {
    kill(dpid, SIGKILL);
    waitpid(dpid, &st, 0);
  }
  read_daemon_line(log, s->daemon_line, sizeof s->daemon_line, s->sealed_line, sizeof s->sealed_line);

  char listing[4096], msg[400] = "";
  ph->bytes = dir_listing(ckpt, listing, sizeof listing);
  s->same_layout = serial_listing && serial_listing[0] && strcmp(listing, serial_listing) == 0;
  ph->seconds = s->window_s;
  ph->cpu_s = s->daemon_cpu_s;
  int verified = rc == 0;
  if (verified) rc = sd_e2e_verify(ckpt, m, msg, sizeof msg);
  ph->ok = rc == 0;
  if (!verified) {
    for (int r = 0; r < NRANKS; r++)
      if (!s->r[r].exit_ok || strcmp(s->r[r].state, "committed") != 0) {
        sd_e2e_fmt(msg, sizeof msg, "rank %d: %s%s%s (daemon log: %s)", r, s->r[r].state,
                   s->r[r].error[0] ? ": " : "", s->r[r].error, log);
        break;
      }
  }
  sd_e2e_fmt(ph->note, sizeof ph->note, "%s%s%s", rc ? "FAILED: " : "", verified ? "verify: " : "", msg);
  if (!o->keep && rc == 0) sd_e2e_rmtree(ckpt);
  return rc;
}

/* ------------------------------------------------------------------------ *
 * main
 * ------------------------------------------------------------------------ */
int main(int argc, char **argv) {
  options o = {.gib = 4, .parent = "/var/tmp", .phases = "abcsz", .timeout_s = 3600, .raw_buf_mib = 4};
  int rc = sd_e2e_parse_opts(&o, argc, argv, "bench_e2e", usage);
  if (rc >= 0) return rc;
  int do_a = strchr(o.phases, 'a') != NULL, do_b = strchr(o.phases, 'b') != NULL,
      do_c = strchr(o.phases, 'c') != NULL, do_s = strchr(o.phases, 's') != NULL,
      do_z = strchr(o.phases, 'z') != NULL;
  if ((do_c || do_s || do_z) && (!o.shardd || !o.rank_bin)) {
    fprintf(stderr, "bench_e2e: need --shardd and --rank-bin (or SHARDD_BIN, SHARDD_EXAMPLE_RANK)\n");
    return 2;
  }

  sd_e2e_model m = {0};
  if (sd_e2e_build_model(&m, o.gib, o.max_shard_size) != 0 || sd_e2e_plan_model(&m) != 0) return 2;
  char work[PATH_MAX];
  sd_e2e_fmt(work, sizeof work, "%s/shardd-bench.XXXXXX", o.parent);
  if (!mkdtemp(work)) {
    fprintf(stderr, "bench_e2e: cannot make a folder under %s: %s\n", o.parent, strerror(errno));
    return 2;
  }

  char machine[2048];
  sd_e2e_machine(work, machine, sizeof machine);
  printf("shardd end-to-end benchmark (bench_e2e)\n%s", machine);
  printf("model    Llama-shaped BF16: hidden %" PRIu64 ", intermediate %" PRIu64 ", %" PRIu64
         " layers, vocab %" PRIu64 "; %zu tensors, %" PRIu64 " bytes (%.2f GiB)\n"
         "         max shard %" PRIu64 " bytes -> %zu files + index, %" PRIu64 " bytes on disk\n",
         m.hidden, m.intermediate, m.layers, m.vocab, m.n, m.tensor_bytes,
         (double)m.tensor_bytes / GIB, m.max_shard_size, m.nfiles, m.file_bytes);
  printf("ranks    4 x %s (TP=2 x DP=2), %.2f GiB each\ndaemon   %s\n",
         o.rank_bin ? o.rank_bin : "-", (double)m.rank_bytes / GIB,
         o.shardd ? o.shardd : "-");
  printf("cache    page cache not dropped (needs root, unreliable): every phase ends with fsync,\n"
         "         sync(2) runs before each, and each phase's output is deleted before the next\n");
  if ((do_c || do_s || do_z) && sd_e2e_mem_available() < 9 * m.rank_bytes)
    printf("WARNING  (c) needs about %.1f GiB of memory (4 ranks x tensors + arena), %.1f GiB available\n",
           8.0 * (double)m.rank_bytes / GIB, (double)sd_e2e_mem_available() / GIB);
  fflush(stdout);

  phase a = {0}, a2 = {0}, b = {0}, c = {0}, st = {0}, z = {0};
  shardd_stats s, ss, zs;
  memset(&s, 0, sizeof s);
  memset(&ss, 0, sizeof ss);
  memset(&zs, 0, sizeof zs);
  char serial_listing[4096] = "";
  int fail = 0;
  if (do_a) phase_raw(work, &m, (size_t)o.raw_buf_mib << 20, &a);
  if (do_b && phase_serial(work, &m, &b, serial_listing, sizeof serial_listing, o.keep) != 0) fail = 1;
  if (do_c && phase_shardd(&o, work, &m, 0, serial_listing, &c, &s) != 0) fail = 1;
  if (do_s && phase_shardd(&o, work, &m, 1, serial_listing, &st, &ss) != 0) fail = 1;
  if (do_z && phase_shardd(&o, work, &m, 2, serial_listing, &z, &zs) != 0) fail = 1;
  if (do_a && (do_b || do_c || do_s || do_z)) phase_raw(work, &m, (size_t)o.raw_buf_mib << 20, &a2);
  sd_e2e_report(&m, &a, &a2, &b, &c, &s, &st, &ss, &z, &zs);

  /* A failed phase keeps its folder (daemon log, checkpoint) for a look. */
  if (!o.keep && !fail) sd_e2e_rmtree(work);
  else printf("\nkept     %s\n", work);
  free(m.t);
  free(m.st);
  return fail;
}

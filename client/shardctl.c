/* shardctl: checks and lists checkpoints offline, and talks to a running shardd (status, watch, metrics, abort). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "sd_checksum.h"
#include "sd_layout.h"
#include "sd_prom.h"
#include "sd_reader.h"
#include "shardd/shardd.h"
#include "shardctl_status.h"

/* Exit codes: 0 success, 1 invalid checkpoint or failed request, 2 usage. */
enum { EXIT_INVALID = 1, EXIT_USAGE = 2, EXIT_PENDING = 3, EXIT_UNPUBLISHED = 4 };

static const char usage_text[] =
    "usage: shardctl [--socket PATH] COMMAND [ARGS]\n"
    "\n"
    "Offline checks (no daemon needed):\n"
    "  verify [--deep] DIR|FILE\n"
    "                     strict check of a checkpoint folder (index + shards) or one\n"
    "                     .safetensors file; prints a one-line summary, or the first\n"
    "                     problem on stderr and exits 1. --deep also reads every data\n"
    "                     byte and compares each file's CRC-32C with the one shardd\n"
    "                     recorded (bad_checksum names each file that differs); a\n"
    "                     checkpoint without recorded checksums is read but not\n"
    "                     compared, says so, and exits 0\n"
    "  inspect DIR|FILE   table of tensors (name, dtype, shape, file, bytes), by file\n"
    "                     then offset\n"
    "\n"
    "Daemon commands:\n"
    "  status [--json]    the daemon's saves in flight (state, ranks begun and sealed,\n"
    "                     bytes written and planned), clients, regions and totals, as a\n"
    "                     table, or the daemon's JSON reply with --json\n"
    "  watch [--count N] [--interval SECONDS]\n"
    "                     live progress bars of the saves in flight, redrawn every\n"
    "                     0.5 s until Ctrl-C (or N times)\n"
    "  metrics            the daemon's counters in Prometheus text format\n"
    "  abort SAVE         fail save SAVE for every rank (error code 'aborted')\n"
    "  rm DIR             delete checkpoint DIR (relative to the daemon's root, or\n"
    "                     absolute beneath it); only the uid that committed it may\n"
    "\n"
    "Options:\n"
    "  --socket PATH      daemon socket (default: $SHARDD_SOCKET, else\n"
    "                     $XDG_RUNTIME_DIR/shardd.sock when not root, else\n"
    "                     " SHARDD_DEFAULT_SOCKET ")\n"
    "  -h, --help         this help\n"
    "  -V, --version      version\n";

static const char *plural(uint64_t n, const char *one, const char *many) {
  return n == 1 ? one : many;
}

/* ------------------------------------------------------------------------ *
 * Loading a folder or a single file
 * ------------------------------------------------------------------------ */

/* Fills c from a folder, or from one file as a one-file checkpoint without
 * index, so verify and inspect treat both alike. */
static int load(const char *path, sd_ckpt *c, sd_error *err) {
  struct stat st;
  memset(c, 0, sizeof *c);
  if (stat(path, &st) == 0 && !S_ISDIR(st.st_mode)) return sd_ckpt_read_single(path, c, err);
  return sd_ckpt_read(path, c, err);
}

/* The code leads the message, so scripts can tell stale or missing files (bad_file_set) from damage
 * (bad_format) or an unreadable disk (io_error). */
static int load_checked(const char *path, sd_ckpt *c) {
  sd_error err;
  sd_error_clear(&err);
  int rc = load(path, c, &err);
  if (rc) fprintf(stderr, "invalid: %s: %s: %s\n", path, sd_err_name(rc), err.msg);
  return rc;
}

static void print_summary(FILE *out, const char *lead, const char *path, const sd_ckpt *c) {
  fprintf(out, "%s%s: %zu %s, %" PRIu64 " %s, %" PRIu64 " %s, %" PRIu64 " %s\n", lead, path,
          c->nfiles, plural(c->nfiles, "file", "files"), c->ntensors,
          plural(c->ntensors, "tensor", "tensors"), c->total_size,
          plural(c->total_size, "byte", "bytes"), c->total_parameters,
          plural(c->total_parameters, "parameter", "parameters"));
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Opens file i of a checked checkpoint: inside the folder, or the single file itself. */
static int open_file(const char *path, int dfd, const sd_ckpt *c, size_t i, sd_error *err) {
  struct stat st;
  return dfd >= 0 ? sd_open_regular(dfd, c->files[i].name, NULL, &st, err)
                  : sd_open_regular(AT_FDCWD, path, c->files[i].name, &st, err);
}

/* Every file's data read and its CRC-32C compared; every damaged file gets its own invalid: line,
 * so one run names them all. */
static int verify_deep(const char *path, const sd_ckpt *c) {
  struct stat st;
  int dfd = stat(path, &st) == 0 && S_ISDIR(st.st_mode) ? open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
  size_t with = 0, bad = 0;
  uint64_t bytes = 0;
  double t0 = now_s();
  for (size_t i = 0; i < c->nfiles; i++) {
    sd_error err;
    sd_error_clear(&err);
    const sd_ckpt_file *f = &c->files[i];
    uint32_t got = 0;
    int fd = open_file(path, dfd, c, i, &err);
    int rc = fd < 0 ? err.code : sd_ckpt_file_verify(c, i, fd, &got, &err);
    if (fd >= 0) close(fd);
    char hex[SD_CHECKSUM_HEX + 1];
    sd_crc32c_hex(got, hex);
    if (rc) {
      fprintf(stderr, "invalid: %s: %s: %s\n", path, sd_err_name(rc), err.msg);
      printf("  %s: %s\n", f->name, rc == SHARDD_E_CHECKSUM ? "BAD checksum" : sd_err_name(rc));
      bad++;
      continue;
    }
    bytes += f->h.data_size;
    with += f->has_crc != 0;
    printf("  %s: %s crc32c %s\n", f->name, f->has_crc ? "ok" : "read, no checksum recorded:", hex);
  }
  double dt = now_s() - t0;
  if (dfd >= 0) close(dfd);
  if (bad) return EXIT_INVALID;
  char rate[64] = "";
  if (dt > 0) snprintf(rate, sizeof rate, ", %.2f GB/s", (double)bytes / dt / 1e9);
  if (with == 0)
    printf("no checksums recorded: %s: every data byte was read (%" PRIu64 " bytes in %.3f s%s) but there was "
           "nothing to compare it with (written with checksums = off, or not by shardd)\n",
           path, bytes, dt, rate);
  else
    printf("checksums: %s: %zu of %zu %s match (%" PRIu64 " bytes read in %.3f s%s)\n", path, with, c->nfiles,
           plural(c->nfiles, "file", "files"), bytes, dt, rate);
  return 0;
}

static int cmd_verify(const char *path, int deep) {
  sd_ckpt c;
  if (load_checked(path, &c) != 0) return EXIT_INVALID;
  int rc = deep ? verify_deep(path, &c) : 0;
  if (rc == 0) print_summary(stdout, "ok: ", path, &c);
  sd_ckpt_free(&c);
  return rc;
}

/* ------------------------------------------------------------------------ *
 * inspect
 * ------------------------------------------------------------------------ */

/* Terminal columns taken by UTF-8 text: one per code point is close enough
 * for tensor names. */
static size_t text_width(const char *s) {
  size_t w = 0;
  for (; *s; s++) w += ((unsigned char)*s & 0xC0) != 0x80;
  return w;
}

static void pad(size_t have, size_t want) {
  for (; have < want; have++) putchar(' ');
}

typedef struct {
  char *name;   /* cleaned for the terminal */
  char shape[SD_MAX_DIMS * 22 + 4];
  const char *dtype;
  const char *file;
  char bytes[24];
} row;

static int cmd_inspect(const char *path) {
  sd_ckpt c;
  if (load_checked(path, &c) != 0) return EXIT_INVALID;
  row *rows = calloc(c.ntensors ? c.ntensors : 1, sizeof *rows);
  if (!rows) {
    fprintf(stderr, "shardctl: out of memory\n");
    sd_ckpt_free(&c);
    return EXIT_INVALID;
  }
  size_t w[5] = {strlen("NAME"), strlen("DTYPE"), strlen("SHAPE"), strlen("FILE"),
                 strlen("BYTES")};
  size_t n = 0;
  /* Files come sorted by name and each header sorted by offset. */
  for (size_t f = 0; f < c.nfiles; f++) {
    for (size_t t = 0; t < c.files[f].h.ntensors; t++, n++) {
      const sd_st_tensor *st = &c.files[f].h.tensors[t];
      row *r = &rows[n];
      size_t len = strlen(st->name);
      r->name = malloc(len + 4);
      if (r->name) sd_msgstr(r->name, len + 4, st->name, len);
      r->dtype = sd_dtype_name(st->dtype);
      size_t k = (size_t)snprintf(r->shape, sizeof r->shape, "[");
      for (uint32_t d = 0; d < st->ndim; d++)
        k += (size_t)snprintf(r->shape + k, sizeof r->shape - k, "%s%" PRIu64, d ? ", " : "",
                              st->shape[d]);
      snprintf(r->shape + k, sizeof r->shape - k, "]");
      r->file = c.files[f].name;
      snprintf(r->bytes, sizeof r->bytes, "%" PRIu64, st->end - st->begin);
      const char *cols[5] = {r->name ? r->name : "?", r->dtype, r->shape, r->file, r->bytes};
      for (int i = 0; i < 5; i++)
        if (text_width(cols[i]) > w[i]) w[i] = text_width(cols[i]);
    }
  }
  static const char *heads[5] = {"NAME", "DTYPE", "SHAPE", "FILE", "BYTES"};
  for (size_t i = 0; i <= n; i++) {
    const char *cols[5];
    if (i == 0) memcpy(cols, heads, sizeof cols);
    else {
      row *r = &rows[i - 1];
      const char *v[5] = {r->name ? r->name : "?", r->dtype, r->shape, r->file, r->bytes};
      memcpy(cols, v, sizeof cols);
    }
    for (int k = 0; k < 4; k++) {
      fputs(cols[k], stdout);
      pad(text_width(cols[k]), w[k] + 2);
    }
    pad(text_width(cols[4]), w[4]); /* numbers right-aligned */
    fputs(cols[4], stdout);
    putchar('\n');
  }
  print_summary(stdout, "", path, &c);
  for (size_t i = 0; i < n; i++) free(rows[i].name);
  free(rows);
  sd_ckpt_free(&c);
  return 0;
}

/* ------------------------------------------------------------------------ *
 * Daemon commands (through libshardd)
 * ------------------------------------------------------------------------ */

static int connect_or_report(const char *cmd, const char *socket, shardd_client **c) {
  int rc = shardd_connect(socket, c);
  if (rc != 0) {
    const char *why = shardd_last_error(NULL);
    /* The library's message already names the socket it tried. */
    if (why && *why) fprintf(stderr, "shardctl: %s: %s\n", cmd, why);
    else
      fprintf(stderr, "shardctl: %s: cannot connect to %s: %s\n", cmd,
              socket ? socket : "the default socket", shardd_strerror(rc));
    return EXIT_INVALID;
  }
  return 0;
}

/* The daemon's status reply, parsed; NULL after printing why not. */
static json_t *fetch_status(const char *cmd, shardd_client *c) {
  char *json = NULL;
  if (shardd_status(c, &json) != 0) {
    fprintf(stderr, "shardctl: %s: %s\n", cmd, shardd_last_error(c));
    return NULL;
  }
  json_error_t je;
  json_t *v = json_loads(json, 0, &je);
  if (!v || !json_is_object(v)) fprintf(stderr, "shardctl: %s: the daemon's reply is not a JSON object\n", cmd);
  shardd_free(json);
  return v;
}

static int cmd_status(const char *socket, int as_json) {
  shardd_client *c;
  if (connect_or_report("status", socket, &c)) return EXIT_INVALID;
  json_t *st = fetch_status("status", c);
  shardd_close(c);
  if (!st) return EXIT_INVALID;
  if (as_json) {
    char *text = json_dumps(st, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (text) puts(text);
    free(text);
  } else {
    shardctl_print_status_table(stdout, st);
  }
  json_decref(st);
  return 0;
}

/* ------------------------------------------------------------------------ *
 * watch: live progress bars
 * ------------------------------------------------------------------------ */
static volatile sig_atomic_t interrupted;
static void on_interrupt(int sig) {
  (void)sig;
  interrupted = 1;
}

/* Redraws every interval_ms until Ctrl-C, or count frames when count > 0. */
static int cmd_watch(const char *socket, long count, long interval_ms) {
  shardd_client *c;
  if (connect_or_report("watch", socket, &c)) return EXIT_INVALID;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_interrupt; /* no SA_RESTART: the sleep ends at once */
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  int tty = isatty(STDOUT_FILENO), ex = 0;
  char node[256];
  snprintf(node, sizeof node, "%s", shardd_node_name(c) ? shardd_node_name(c) : "?");
  for (long frame = 0; !interrupted && (count <= 0 || frame < count); frame++) {
    json_t *st = fetch_status("watch", c);
    if (!st) {
      ex = EXIT_INVALID;
      break;
    }
    /* A terminal is redrawn in place (cursor home, clear); a pipe gets
     * frames one after another, separated by a blank line. */
    if (tty) fputs("\033[H\033[2J", stdout);
    else if (frame) putchar('\n');
    shardctl_print_watch_frame(stdout, st, node);
    fflush(stdout);
    json_decref(st);
    if (count > 0 && frame + 1 >= count) break;
    struct timespec ts = {interval_ms / 1000, (interval_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
  shardd_close(c);
  return ex;
}

/* ------------------------------------------------------------------------ *
 * metrics: Prometheus text (proto/prom.c renders it; the HTTP endpoint too)
 * ------------------------------------------------------------------------ */
static int cmd_metrics(const char *socket) {
  shardd_client *c;
  if (connect_or_report("metrics", socket, &c)) return EXIT_INVALID;
  json_t *st = fetch_status("metrics", c);
  shardd_close(c);
  if (!st) return EXIT_INVALID;
  const json_t *m = json_object_get(st, "metrics");
  int ex = 0;
  if (!json_is_object(m)) {
    fprintf(stderr, "shardctl: metrics: the daemon's status reply has no \"metrics\" object (an older shardd?)\n");
    ex = EXIT_INVALID;
  } else {
    size_t len = 0;
    char *text = sd_prom_render(st, m, NULL, &len);
    if (!text || fwrite(text, 1, len, stdout) != len) {
      fprintf(stderr, "shardctl: metrics: %s\n", text ? strerror(errno) : "out of memory");
      ex = EXIT_INVALID;
    }
    free(text);
  }
  json_decref(st);
  return ex;
}

static int cmd_rm(const char *socket, const char *dir) {
  shardd_client *c;
  if (connect_or_report("rm", socket, &c)) return EXIT_INVALID;
  int ex = 0, rc = shardd_delete(c, dir);
  if (rc != 0) {
    fprintf(stderr, "shardctl: rm %s: %s: %s\n", dir, shardd_err_name(rc), shardd_last_error(c));
    ex = EXIT_INVALID;
  } else {
    printf("deleted: %s\n", dir);
  }
  shardd_close(c);
  return ex;
}

static int cmd_abort(const char *socket, const char *save) {
  shardd_client *c;
  if (connect_or_report("abort", socket, &c)) return EXIT_INVALID;
  int ex = 0;
  if (shardd_abort(c, save) != 0) {
    fprintf(stderr, "shardctl: abort %s: %s\n", save, shardd_last_error(c));
    ex = EXIT_INVALID;
  } else {
    printf("aborted: %s\n", save);
  }
  shardd_close(c);
  return ex;
}

/* ------------------------------------------------------------------------ *
 * outcome: the attempt id a multi-node save's leader records on its folder
 * ------------------------------------------------------------------------ */
static int usage_error(const char *fmt, const char *arg);

/* 1 when the folder fd records attempt, 0 when it records another or none. */
static int records(int fd, const char *attempt) {
  char v[SD_ATTEMPT_LEN + 1];
  ssize_t n = fgetxattr(fd, SD_ATTEMPT_XATTR, v, sizeof v);
  if (n < 0) n = fgetxattr(fd, SD_ATTEMPT_XATTR_TRUSTED, v, sizeof v);
  return n == SD_ATTEMPT_LEN && memcmp(v, attempt, SD_ATTEMPT_LEN) == 0;
}

static int cmd_outcome(const char *path, const char *attempt) {
  size_t n = strlen(attempt);
  if (n != SD_ATTEMPT_LEN || strspn(attempt, "0123456789abcdef") != n)
    return usage_error("outcome: ATTEMPT is 16 hex digits, got '%s'", attempt);
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0 && records(fd, attempt)) {
    close(fd);
    printf("committed: %s holds attempt %s\n", path, attempt);
    return 0;
  }
  if (fd < 0 && errno != ENOENT) {
    fprintf(stderr, "shardctl: outcome %s: %s\n", path, strerror(errno));
    return EXIT_INVALID;
  }
  if (fd >= 0) close(fd);
  /* Not there: is the attempt's temporary folder still beside it (the leader may yet rename it)? */
  char parent[PATH_MAX];
  snprintf(parent, sizeof parent, "%s", path);
  char *slash = strrchr(parent, '/');
  if (slash && slash > parent) *slash = '\0';
  else snprintf(parent, sizeof parent, slash ? "/" : ".");
  DIR *d = opendir(parent);
  if (!d) {
    fprintf(stderr, "shardctl: outcome %s: cannot read %s: %s\n", path, parent, strerror(errno));
    return EXIT_INVALID;
  }
  int ex = EXIT_UNPUBLISHED;
  char found[NAME_MAX + 1] = "";
  for (struct dirent *de; ex == EXIT_UNPUBLISHED && (de = readdir(d));) {
    if (strncmp(de->d_name, ".shardd-tmp-", 12) != 0) continue;
    int t = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (t < 0) continue;
    size_t len = strlen(de->d_name), sl = strlen(SD_WITHDRAWN_SUFFIX);
    int withdrawn = len > sl && !strcmp(de->d_name + len - sl, SD_WITHDRAWN_SUFFIX);
    if (records(t, attempt)) {
      snprintf(found, sizeof found, "%s", de->d_name);
      if (!withdrawn) ex = EXIT_PENDING;
    }
    close(t);
  }
  closedir(d);
  if (ex == EXIT_PENDING)
    printf("pending: attempt %s is not published at %s yet; its temporary folder %s/%s is still there (its leader "
           "may still rename it in; a restarted leader removes it)\n", attempt, path, parent, found);
  else
    printf("not published: %s does not hold attempt %s, and %s\n", path, attempt,
           found[0] ? "a node withdrew its folder, so it never will be" : "no folder of it is left to publish");
  return ex;
}

/* ------------------------------------------------------------------------ *
 * Command line
 * ------------------------------------------------------------------------ */

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "shardctl: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\nTry 'shardctl --help'.\n");
  return EXIT_USAGE;
}

/* A positive number of digits only. */
static int parse_positive(const char *s, long max, long *out) {
  char *end;
  if (!*s || *s < '0' || *s > '9') return -1;
  long v = strtol(s, &end, 10);
  if (*end || v <= 0 || v > max) return -1;
  *out = v;
  return 0;
}

/* "0.5" seconds -> 500 ms; between 10 ms and an hour. */
static int parse_interval(const char *s, long *ms) {
  char *end;
  if (!*s || *s == '-' || *s == '+') return -1;
  double v = strtod(s, &end);
  if (*end || !(v >= 0.01 && v <= 3600)) return -1;
  *ms = (long)(v * 1000 + 0.5);
  return 0;
}

/* `shardctl COMMAND --help`: that command's own entry of usage_text (its line and the indented lines
 * under it), with the --socket option for the commands that reach the daemon. */
static int command_help(const char *cmd) {
  size_t n = strlen(cmd);
  for (const char *p = strstr(usage_text, "\n  "); p; p = strstr(p + 1, "\n  ")) {
    const char *entry = p + 3;
    if (strncmp(entry, cmd, n) != 0 || (entry[n] != ' ' && entry[n] != '\n')) continue;
    const char *eol = strchr(entry, '\n'), *end = eol;
    while (!strncmp(end + 1, "     ", 5)) end = strchr(end + 1, '\n');
    /* The synopsis, then the description, which may start on the synopsis' own line. */
    const char *gap = strstr(entry, "  ");
    const char *desc = gap && gap < eol ? gap + strspn(gap, " ") : NULL;
    int offline = !strcmp(cmd, "verify") || !strcmp(cmd, "inspect");
    printf("usage: shardctl%s %.*s\n", offline ? "" : " [--socket PATH]", (int)((desc ? gap : eol) - entry), entry);
    if (desc) printf("%21s%.*s\n", "", (int)(eol - desc), desc);
    if (end > eol) printf("%.*s\n", (int)(end - eol - 1), eol + 1);
    if (!offline) {
      const char *opt = strstr(usage_text, "  --socket PATH");
      printf("\n%.*s\n", (int)(strstr(opt, "\n  -h") - opt), opt);
    }
    return 0;
  }
  return usage_error("unknown command '%s'", cmd);
}

int main(int argc, char **argv) {
  const char *socket = getenv("SHARDD_SOCKET");
  if (socket && !*socket) socket = NULL;
  const char *pos[3];
  int npos = 0, opts_done = 0, as_json = 0, deep = 0, help = 0;
  long count = 0, interval_ms = 500;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!opts_done && a[0] == '-' && a[1]) {
      if (!strcmp(a, "--")) {
        opts_done = 1;
      } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
        help = 1;
      } else if (!strcmp(a, "-V") || !strcmp(a, "--version")) {
        printf("shardctl %s (protocol %d)\n", SHARDD_VERSION_STRING, SHARDD_PROTO_VERSION);
        return 0;
      } else if (!strcmp(a, "--socket")) {
        if (++i >= argc) return usage_error("%s needs a path", a);
        socket = argv[i];
      } else if (!strncmp(a, "--socket=", 9)) {
        socket = a + 9;
      } else if (!strcmp(a, "--json")) {
        as_json = 1;
      } else if (!strcmp(a, "--deep")) {
        deep = 1;
      } else if (!strcmp(a, "--once")) {
        count = 1;
      } else if (!strcmp(a, "--count") || !strcmp(a, "--interval")) {
        if (++i >= argc) return usage_error("%s needs a value", a);
        if (a[2] == 'c' ? parse_positive(argv[i], 1000000000L, &count) : parse_interval(argv[i], &interval_ms))
          return usage_error(a[2] == 'c' ? "--count needs a positive whole number, got '%s'"
                                         : "--interval needs seconds between 0.01 and 3600, got '%s'",
                             argv[i]);
      } else {
        return usage_error("unknown option '%s'", a);
      }
      continue;
    }
    if (npos == 3) return usage_error("unexpected argument '%s'", a);
    pos[npos++] = a;
  }
  if (help) {
    if (npos) return command_help(pos[0]);
    fputs(usage_text, stdout);
    return 0;
  }
  if (npos == 0) {
    fputs(usage_text, stderr);
    return EXIT_USAGE;
  }
  const char *cmd = pos[0];
  int daemon_only = !strcmp(cmd, "status") || !strcmp(cmd, "watch") || !strcmp(cmd, "metrics");
  int want = daemon_only ? 1 : 2;
  if (!strcmp(cmd, "outcome")) want = 3;
  if (strcmp(cmd, "verify") && strcmp(cmd, "inspect") && !daemon_only && strcmp(cmd, "abort") && strcmp(cmd, "rm") &&
      want != 3)
    return usage_error("unknown command '%s'", cmd);
  if (as_json && strcmp(cmd, "status")) return usage_error("--json goes with status, not %s", cmd);
  if (deep && strcmp(cmd, "verify")) return usage_error("--deep goes with verify, not %s", cmd);
  if ((count || interval_ms != 500) && strcmp(cmd, "watch"))
    return usage_error("--count, --once and --interval go with watch, not %s", cmd);
  if (npos != want)
    return usage_error(want == 1 ? "%s takes no argument"
                       : !strcmp(cmd, "abort") ? "%s needs exactly one SAVE"
                       : !strcmp(cmd, "rm")    ? "%s needs exactly one DIR"
                       : want == 3             ? "%s needs DIR and ATTEMPT"
                                               : "%s needs exactly one DIR or FILE",
                       cmd);
  if (want == 3) return cmd_outcome(pos[1], pos[2]);
  if (!strcmp(cmd, "verify")) return cmd_verify(pos[1], deep);
  if (!strcmp(cmd, "inspect")) return cmd_inspect(pos[1]);
  if (!strcmp(cmd, "status")) return cmd_status(socket, as_json);
  if (!strcmp(cmd, "watch")) return cmd_watch(socket, count, interval_ms);
  if (!strcmp(cmd, "metrics")) return cmd_metrics(socket);
  if (!strcmp(cmd, "rm")) return cmd_rm(socket, pos[1]);
  return cmd_abort(socket, pos[1]);
}

/* shardctl: checks and lists checkpoints offline, and talks to a running shardd (status, abort). */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "sd_layout.h"
#include "sd_reader.h"
#include "shardd/shardd.h"

/* Exit codes: 0 success, 1 invalid checkpoint or failed request, 2 usage. */
enum { EXIT_INVALID = 1, EXIT_USAGE = 2 };

static const char usage_text[] =
    "usage: shardctl [--socket PATH] COMMAND [ARGS]\n"
    "\n"
    "Offline checks (no daemon needed):\n"
    "  verify DIR|FILE    strict check of a checkpoint folder (index + shards) or one\n"
    "                     .safetensors file; prints a one-line summary, or the first\n"
    "                     problem on stderr and exits 1\n"
    "  inspect DIR|FILE   table of tensors (name, dtype, shape, file, bytes), by file\n"
    "                     then offset\n"
    "\n"
    "Daemon commands:\n"
    "  status             the daemon's saves in flight, clients, regions and totals\n"
    "  abort SAVE         fail save SAVE for every rank (error code 'aborted')\n"
    "\n"
    "Options:\n"
    "  --socket PATH      daemon socket (default: $SHARDD_SOCKET, else " SHARDD_DEFAULT_SOCKET
    ")\n"
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
  if (stat(path, &st) == 0 && !S_ISDIR(st.st_mode)) {
    c->files = calloc(1, sizeof *c->files);
    if (!c->files) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory");
    const char *base = strrchr(path, '/');
    c->files[0].name = strdup(base ? base + 1 : path);
    if (!c->files[0].name) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory");
    c->nfiles = 1;
    int rc = sd_st_read_fileat(AT_FDCWD, path, c->files[0].name, &c->files[0].h, err);
    if (rc) {
      sd_ckpt_free(c);
      return rc;
    }
    c->ntensors = c->files[0].h.ntensors;
    c->total_parameters = c->files[0].h.total_parameters;
    c->total_size = c->files[0].h.data_size;
    return 0;
  }
  return sd_ckpt_read(path, c, err);
}

static void print_summary(FILE *out, const char *lead, const char *path, const sd_ckpt *c) {
  fprintf(out, "%s%s: %zu %s, %" PRIu64 " %s, %" PRIu64 " %s, %" PRIu64 " %s\n", lead, path,
          c->nfiles, plural(c->nfiles, "file", "files"), c->ntensors,
          plural(c->ntensors, "tensor", "tensors"), c->total_size,
          plural(c->total_size, "byte", "bytes"), c->total_parameters,
          plural(c->total_parameters, "parameter", "parameters"));
}

static int cmd_verify(const char *path) {
  sd_ckpt c;
  sd_error err;
  sd_error_clear(&err);
  if (load(path, &c, &err) != 0) {
    fprintf(stderr, "invalid: %s: %s\n", path, err.msg);
    return EXIT_INVALID;
  }
  print_summary(stdout, "ok: ", path, &c);
  sd_ckpt_free(&c);
  return 0;
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
  sd_error err;
  sd_error_clear(&err);
  if (load(path, &c, &err) != 0) {
    fprintf(stderr, "invalid: %s: %s\n", path, err.msg);
    return EXIT_INVALID;
  }
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

static int cmd_status(const char *socket) {
  shardd_client *c;
  if (connect_or_report("status", socket, &c)) return EXIT_INVALID;
  char *json = NULL;
  int rc = shardd_status(c, &json);
  int ex = 0;
  if (rc != 0) {
    fprintf(stderr, "shardctl: status: %s\n", shardd_last_error(c));
    ex = EXIT_INVALID;
  } else {
    /* Pretty JSON for now; a table (and --json) comes with the operations work. */
    json_error_t je;
    json_t *v = json_loads(json, 0, &je);
    char *pretty = v ? json_dumps(v, JSON_INDENT(2)) : NULL;
    puts(pretty ? pretty : json);
    free(pretty);
    json_decref(v);
  }
  shardd_free(json);
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
 * Command line
 * ------------------------------------------------------------------------ */

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "shardctl: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\nTry 'shardctl --help'.\n");
  return EXIT_USAGE;
}

int main(int argc, char **argv) {
  const char *socket = getenv("SHARDD_SOCKET");
  if (socket && !*socket) socket = NULL;
  const char *pos[3];
  int npos = 0, opts_done = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!opts_done && a[0] == '-' && a[1]) {
      if (!strcmp(a, "--")) {
        opts_done = 1;
      } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
        fputs(usage_text, stdout);
        return 0;
      } else if (!strcmp(a, "-V") || !strcmp(a, "--version")) {
        printf("shardctl %s (protocol %d)\n", SHARDD_VERSION_STRING, SHARDD_PROTO_VERSION);
        return 0;
      } else if (!strcmp(a, "--socket")) {
        if (++i >= argc) return usage_error("%s needs a path", a);
        socket = argv[i];
      } else if (!strncmp(a, "--socket=", 9)) {
        socket = a + 9;
      } else {
        return usage_error("unknown option '%s'", a);
      }
      continue;
    }
    if (npos == 3) return usage_error("unexpected argument '%s'", a);
    pos[npos++] = a;
  }
  if (npos == 0) {
    fputs(usage_text, stderr);
    return EXIT_USAGE;
  }
  const char *cmd = pos[0];
  int want = !strcmp(cmd, "status") ? 1 : 2;
  if (strcmp(cmd, "verify") && strcmp(cmd, "inspect") && strcmp(cmd, "status") &&
      strcmp(cmd, "abort"))
    return usage_error("unknown command '%s'", cmd);
  if (npos != want)
    return usage_error(want == 1 ? "%s takes no argument"
                       : !strcmp(cmd, "abort") ? "%s needs exactly one SAVE"
                                               : "%s needs exactly one DIR or FILE",
                       cmd);
  if (!strcmp(cmd, "verify")) return cmd_verify(pos[1]);
  if (!strcmp(cmd, "inspect")) return cmd_inspect(pos[1]);
  if (!strcmp(cmd, "status")) return cmd_status(socket);
  return cmd_abort(socket, pos[1]);
}

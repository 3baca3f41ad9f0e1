/* Daemon settings: defaults that let shardd run unprivileged from a checkout, and command-line parsing. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "shardd/shardd.h"

#define DEFAULT_QUEUE_DEPTH 64
#define DEFAULT_KEEP_RESULTS 64

void sd_config_usage(FILE *out) {
  fprintf(out,
          "usage: shardd [options]\n"
          "\n"
          "Per-node checkpoint daemon: ranks hand it tensor slices over shared memory and it\n"
          "writes a Hugging Face sharded safetensors checkpoint, published atomically.\n"
          "\n"
          "  -r, --root DIR          checkpoint root, created if missing\n"
          "                          (default: /var/lib/shardd as root, else ./checkpoints)\n"
          "  -s, --socket PATH       Unix socket to listen on (default: $SHARDD_SOCKET, else\n"
          "                          /run/shardd/shardd.sock as root, else\n"
          "                          $XDG_RUNTIME_DIR/shardd.sock, else /tmp/shardd-UID.sock)\n"
          "  -l, --log-level LEVEL   error, warn, info (default) or debug\n"
          "      --max-line BYTES    longest request line (default 16777216)\n"
          "      --queue-depth N     io_uring queue depth (default %d)\n"
          "      --keep-results N    finished saves remembered for late waits (default %d)\n"
          "  -h, --help              show this help\n"
          "  -V, --version           show the version\n",
          DEFAULT_QUEUE_DEPTH, DEFAULT_KEEP_RESULTS);
}

static char *default_socket(void) {
  const char *env = getenv("SHARDD_SOCKET");
  if (env && *env) return strdup(env);
  if (geteuid() == 0) return strdup(SHARDD_DEFAULT_SOCKET);
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  char buf[PATH_MAX];
  if (xdg && *xdg)
    snprintf(buf, sizeof buf, "%s/shardd.sock", xdg);
  else
    snprintf(buf, sizeof buf, "/tmp/shardd-%u.sock", (unsigned)geteuid());
  return strdup(buf);
}

static int parse_count(const char *opt, const char *s, unsigned long long lo, unsigned long long hi,
                       unsigned long long *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *end || s[0] == '-' || v < lo || v > hi) {
    fprintf(stderr, "shardd: %s must be an integer in [%llu, %llu], got '%s'\n", opt, lo, hi, s);
    return -1;
  }
  *out = v;
  return 0;
}

enum { OPT_MAX_LINE = 256, OPT_QUEUE_DEPTH, OPT_KEEP_RESULTS };

int sd_config_parse(sd_config *c, int argc, char **argv, int *exit_code) {
  static const struct option longopts[] = {
      {"root", required_argument, NULL, 'r'},
      {"socket", required_argument, NULL, 's'},
      {"log-level", required_argument, NULL, 'l'},
      {"max-line", required_argument, NULL, OPT_MAX_LINE},
      {"queue-depth", required_argument, NULL, OPT_QUEUE_DEPTH},
      {"keep-results", required_argument, NULL, OPT_KEEP_RESULTS},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, 'V'},
      {NULL, 0, NULL, 0},
  };
  memset(c, 0, sizeof *c);
  c->log_level = SD_LOG_INFO;
  c->max_line = 16u * 1024u * 1024u;
  c->queue_depth = DEFAULT_QUEUE_DEPTH;
  c->keep_results = DEFAULT_KEEP_RESULTS;
  *exit_code = 0;
  int ch;
  unsigned long long v;
  optind = 1;
  while ((ch = getopt_long(argc, argv, "r:s:l:hV", longopts, NULL)) != -1) {
    switch (ch) {
      case 'r':
        free(c->root);
        c->root = strdup(optarg);
        break;
      case 's':
        free(c->socket_path);
        c->socket_path = strdup(optarg);
        break;
      case 'l':
        if (sd_log_parse_level(optarg, &c->log_level) != 0) {
          fprintf(stderr, "shardd: unknown log level '%s' (error, warn, info, debug)\n", optarg);
          goto usage;
        }
        break;
      case OPT_MAX_LINE:
        if (parse_count("--max-line", optarg, 1024, 1ULL << 31, &v)) goto usage;
        c->max_line = (size_t)v;
        break;
      case OPT_QUEUE_DEPTH:
        if (parse_count("--queue-depth", optarg, 1, 4096, &v)) goto usage;
        c->queue_depth = (unsigned)v;
        break;
      case OPT_KEEP_RESULTS:
        if (parse_count("--keep-results", optarg, 1, 1000000, &v)) goto usage;
        c->keep_results = (unsigned)v;
        break;
      case 'h':
        sd_config_usage(stdout);
        return 1;
      case 'V':
        printf("shardd %s (protocol %d)\n", SHARDD_VERSION_STRING, SHARDD_PROTO_VERSION);
        return 1;
      default:
        goto usage;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "shardd: unexpected argument '%s'\n", argv[optind]);
    goto usage;
  }
  if (!c->root) c->root = strdup(geteuid() == 0 ? "/var/lib/shardd" : "checkpoints");
  if (!c->socket_path) c->socket_path = default_socket();
  if (!c->root || !c->socket_path) {
    fprintf(stderr, "shardd: out of memory\n");
    *exit_code = 1;
    return 1;
  }
  if (!*c->root || !*c->socket_path) {
    fprintf(stderr, "shardd: --root and --socket must not be empty\n");
    goto usage;
  }
  return 0;
usage:
  fprintf(stderr, "Try 'shardd --help'.\n");
  *exit_code = 2;
  return 1;
}

/* mkdir -p: parents are created too, so a fresh checkout needs no setup. */
static int mkdirs(const char *path, sd_error *err) {
  char buf[PATH_MAX];
  size_t n = strlen(path);
  if (n >= sizeof buf) return sd_fail(err, SHARDD_E_BAD_PATH, "root '%s' is too long", path);
  memcpy(buf, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] != '/' && buf[i] != '\0') continue;
    char saved = buf[i];
    buf[i] = '\0';
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
      return sd_fail(err, SHARDD_E_IO, "cannot create '%s': %s", buf, strerror(errno));
    buf[i] = saved;
  }
  return 0;
}

int sd_config_prepare_root(sd_config *c, sd_error *err) {
  int rc = mkdirs(c->root, err);
  if (rc) return rc;
  char *abs = realpath(c->root, NULL);
  if (!abs) return sd_fail(err, SHARDD_E_IO, "cannot resolve root '%s': %s", c->root, strerror(errno));
  struct stat st;
  if (stat(abs, &st) != 0 || !S_ISDIR(st.st_mode)) {
    rc = sd_fail(err, SHARDD_E_BAD_PATH, "root '%s' is not a directory", abs);
    free(abs);
    return rc;
  }
  free(c->root);
  c->root = abs;
  return 0;
}

void sd_config_free(sd_config *c) {
  free(c->root);
  free(c->socket_path);
  c->root = c->socket_path = NULL;
}

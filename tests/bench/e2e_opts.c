/* The options bench_e2e and bench_multi share: one parser, the checks of its values, and where the daemon and the example rank are found. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_e2e.h"

/* rel resolved against this executable's folder, when it is an executable there; else NULL. */
static const char *exe_sibling(const char *rel, char *buf, size_t len) {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return NULL;
  self[n] = '\0';
  char *slash = strrchr(self, '/');
  if (!slash) return NULL;
  *slash = '\0';
  sd_e2e_fmt(buf, len, "%s/%s", self, rel);
  return access(buf, X_OK) == 0 ? buf : NULL;
}

int sd_e2e_parse_opts(sd_e2e_opts *o, int argc, char **argv, const char *prog, void (*usage)(FILE *f)) {
  static const struct option lo[] = {
      {"gib", required_argument, 0, 'g'},      {"quick", no_argument, 0, 'q'},
      {"dir", required_argument, 0, 'd'},      {"shardd", required_argument, 0, 's'},
      {"rank-bin", required_argument, 0, 'r'}, {"phases", required_argument, 0, 'p'},
      {"max-shard-size", required_argument, 0, 'm'}, {"keep", no_argument, 0, 'k'},
      {"timeout", required_argument, 0, 't'},
      {"raw-buf-mib", required_argument, 0, 'R'},
      {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
  int ch;
  char *end;
  while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (ch) {
      case 'g':
        o->gib = strtod(optarg, &end);
        if (*end || !(o->gib >= 0.01 && o->gib <= 1024)) {
          fprintf(stderr, "%s: --gib wants a number in [0.01, 1024], not '%s'\n", prog, optarg);
          return 2;
        }
        break;
      case 'q': o->gib = 0.25; break;
      case 'd': o->parent = optarg; break;
      case 's': o->shardd = optarg; break;
      case 'r': o->rank_bin = optarg; break;
      case 'p': o->phases = optarg; break;
      case 'm':
        o->max_shard_size = strtoull(optarg, &end, 10);
        if (*end) {
          usage(stderr);
          return 2;
        }
        break;
      case 'k': o->keep = 1; break;
      case 'R': {
        unsigned long v = strtoul(optarg, &end, 10);
        if (*end || v < 1 || v > 64) {
          fprintf(stderr, "%s: --raw-buf-mib wants 1 to 64, not '%s'\n", prog, optarg);
          return 2;
        }
        o->raw_buf_mib = (unsigned)v;
        break;
      }
      case 't':
        o->timeout_s = strtod(optarg, &end);
        if (*end || !(o->timeout_s > 0)) {
          fprintf(stderr, "%s: --timeout wants a positive number of seconds, not '%s'\n", prog, optarg);
          return 2;
        }
        break;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  if (optind != argc) {
    usage(stderr);
    return 2;
  }
  if (!o->shardd) o->shardd = getenv("SHARDD_BIN");
  if (!o->shardd) o->shardd = exe_sibling("../../daemon/shardd", o->shardd_buf, sizeof o->shardd_buf);
  if (!o->rank_bin) o->rank_bin = getenv("SHARDD_EXAMPLE_RANK");
  if (!o->rank_bin)
    o->rank_bin = exe_sibling("../../client/shardd-example-rank", o->rank_bin_buf, sizeof o->rank_bin_buf);
  return -1;
}

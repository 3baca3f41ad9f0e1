/* Daemon settings applied: built from the defaults, the file and the command line at start-up (--help, --check-config), again at SIGHUP, and the root made. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "config_check.h"
#include "config_int.h"
#include "sd_confline.h"
#include "shardd/shardd.h"

/* ------------------------------------------------------------------------ *
 * Building the settings: defaults, file, command line
 * ------------------------------------------------------------------------ */
static int read_file(const char *path, char **text, size_t *len, sd_error *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return sd_fail(err, SHARDD_E_IO, "cannot open config file '%s': %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (1 << 20)) {
    close(fd);
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "config file '%s' is not a regular file of at most 1 MiB", path);
  }
  char *buf = malloc((size_t)st.st_size + 1);
  size_t got = 0;
  while (buf && got < (size_t)st.st_size) {
    ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  int e = errno;
  close(fd);
  if (!buf) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory reading '%s'", path);
  if (got < (size_t)st.st_size) {
    free(buf);
    return sd_fail(err, SHARDD_E_IO, "cannot read config file '%s': %s", path, strerror(e));
  }
  *text = buf;
  *len = got;
  return 0;
}

/* Defaults, then the file at path (NULL: none), then the command-line
 * values in src. lines gets the file line of each key. */
static int build(sd_config *c, const char *path, unsigned *lines, sd_error *err) {
  int rc = sd_config_defaults(c, err);
  if (rc) return rc;
  free(c->config_path);
  c->config_path = path ? strdup(path) : NULL;
  if (path) {
    if (!c->config_path) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory");
    char *text = NULL;
    size_t len = 0;
    rc = read_file(path, &text, &len, err);
    if (rc) return rc;
    rc = sd_config_parse_text(c, text, len, path, lines, err);
    free(text);
    if (rc) return rc;
  }
  for (size_t i = 0; c->src && i < c->src->ncli; i++) {
    const sd_config_cli *v = &c->src->cli[i];
    const sd_config_key *k = &sd_config_keys[v->key];
    sd_error e = {0};
    if (sd_config_set(c, k, v->value, &e) != 0) {
      char flag[64];
      sd_config_flag_name(k, flag, sizeof flag);
      return sd_fail(err, e.code, "option --%s: %s", flag, e.msg);
    }
  }
  return sd_config_check(c, lines, err);
}

/* --config PATH, else the default file when it exists, else none. */
static const char *config_file(const sd_config *c, const char *given) {
  if (c->src && c->src->explicit_config) return given;
  return access(SD_DEFAULT_CONFIG, F_OK) == 0 ? SD_DEFAULT_CONFIG : NULL;
}

/* ------------------------------------------------------------------------ *
 * Start-up
 * ------------------------------------------------------------------------ */
enum { OPT_CONFIG = 1000, OPT_CHECK, OPT_KEY0 };

static const char *arg_name(const sd_config_key *k) {
  switch (k->type) {
    case SD_CT_PATH: return "PATH";
    case SD_CT_STR: return "NAME";
    case SD_CT_NUM: return "N";
    case SD_CT_BYTES: return "BYTES";
    case SD_CT_MODE: return "MODE";
    case SD_CT_ENUM: return "WHICH";
  }
  return "VALUE";
}

void sd_config_usage(FILE *out) {
  fprintf(out,
          "usage: shardd [options]\n"
          "\n"
          "Per-node checkpoint daemon: ranks hand it tensor slices over shared memory and it\n"
          "writes a Hugging Face sharded safetensors checkpoint, published atomically.\n"
          "\n"
          "      --config FILE          read settings from FILE (default: " SD_DEFAULT_CONFIG
          " when it\n"
          "                             exists); the options below override it\n"
          "      --check-config         validate the settings, print them (key = value) and exit\n");
  for (size_t i = 0; i < sd_config_nkeys; i++) {
    const sd_config_key *k = &sd_config_keys[i];
    char flag[64], lead[128], choices[128] = "";
    sd_config_flag_name(k, flag, sizeof flag);
    if (k->type == SD_CT_ENUM) {
      snprintf(choices, sizeof choices, "%s", k->choices);
      for (char *p = choices; *p; p++)
        if (*p == '|') *p = ',';
    }
    if (k->bare)
      snprintf(lead, sizeof lead, "--%s[=%s]", flag, k->type == SD_CT_ENUM ? "WHICH" : arg_name(k));
    else
      snprintf(lead, sizeof lead, "--%s %s", flag, arg_name(k));
    char opt[160];
    snprintf(opt, sizeof opt, "%c%c%c %s", k->shortopt ? '-' : ' ', k->shortopt ? k->shortopt : ' ',
             k->shortopt ? ',' : ' ', lead);
    /* Long flags get their help on the next line, aligned with the others. */
    if (strlen(opt) > 26) fprintf(out, "  %s\n  %-26s %s", opt, "", k->help);
    else fprintf(out, "  %-26s %s", opt, k->help);
    if (*choices) fprintf(out, "; WHICH: %s", choices);
    if (k->def && *k->def) fprintf(out, " (default %s)", k->def);
    fputc('\n', out);
  }
  fprintf(out,
          "  -h, --help                 show this help\n"
          "  -V, --version              show the version\n"
          "\n"
          "Each option but --config, --check-config, --help and --version is also a config-file\n"
          "key: its name with '_' for '-' (socket_mode = 0660). SIGHUP rereads the file.\n");
}

static void print_effective(const sd_config *c, FILE *out) {
  fprintf(out, "# shardd %s effective settings; config file: %s\n", SHARDD_VERSION_STRING,
          c->config_path ? c->config_path : "none");
  for (size_t i = 0; i < sd_config_nkeys; i++) {
    /* Quoted where the plain reading would not give it back: the output is a valid file. */
    char v[PATH_MAX + 64], q[2 * sizeof v + 3];
    sd_config_format(c, &sd_config_keys[i], v, sizeof v);
    sd_conf_quote(v, q, sizeof q);
    fprintf(out, "%s =%s%s\n", sd_config_keys[i].name, *q ? " " : "", q);
  }
}

static int add_cli(struct sd_config_src *src, const sd_config_key *k, const char *value) {
  sd_config_cli *n = realloc(src->cli, (src->ncli + 1) * sizeof *n);
  if (!n) return -1;
  src->cli = n;
  n[src->ncli].key = (size_t)(k - sd_config_keys);
  n[src->ncli].value = strdup(value);
  if (!n[src->ncli].value) return -1;
  src->ncli++;
  return 0;
}

int sd_config_load(sd_config *c, int argc, char **argv, int *exit_code) {
  memset(c, 0, sizeof *c);
  c->socket_gid = -1;
  c->trusted_gid = -1;
  *exit_code = 0;
  struct option *longopts = calloc(sd_config_nkeys + 5, sizeof *longopts);
  char (*names)[64] = calloc(sd_config_nkeys, sizeof *names);
  c->src = calloc(1, sizeof *c->src);
  if (c->src) c->src->file_line = calloc(sd_config_nkeys, sizeof *c->src->file_line);
  char shortopts[64] = "hV";
  const char *given = NULL;
  int check = 0, ch;
  sd_error err = {0};
  if (!longopts || !names || !c->src || !c->src->file_line) goto nomem;
  size_t nl = 0, ns = 2;
  longopts[nl++] = (struct option){"config", required_argument, NULL, OPT_CONFIG};
  longopts[nl++] = (struct option){"check-config", no_argument, NULL, OPT_CHECK};
  longopts[nl++] = (struct option){"help", no_argument, NULL, 'h'};
  longopts[nl++] = (struct option){"version", no_argument, NULL, 'V'};
  for (size_t i = 0; i < sd_config_nkeys; i++) {
    const sd_config_key *k = &sd_config_keys[i];
    sd_config_flag_name(k, names[i], sizeof names[i]);
    longopts[nl++] = (struct option){names[i], k->bare ? optional_argument : required_argument, NULL,
                                     OPT_KEY0 + (int)i};
    if (k->shortopt && ns + 3 < sizeof shortopts) {
      shortopts[ns++] = (char)k->shortopt;
      shortopts[ns++] = ':';
      if (k->bare) shortopts[ns++] = ':';
    }
  }
  optind = 1;
  while ((ch = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
    const sd_config_key *k = NULL;
    if (ch >= OPT_KEY0 && ch < OPT_KEY0 + (int)sd_config_nkeys) {
      k = &sd_config_keys[ch - OPT_KEY0];
    } else {
      for (size_t i = 0; i < sd_config_nkeys && !k; i++)
        if (ch < 256 && sd_config_keys[i].shortopt == ch) k = &sd_config_keys[i];
    }
    if (k) {
      /* A stray "--log-syslog-prefix no" would take "no" as an argument
       * only with '='; keep the bare value then. */
      if (add_cli(c->src, k, optarg ? optarg : k->bare) != 0) goto nomem;
      continue;
    }
    switch (ch) {
      case OPT_CONFIG: given = optarg; c->src->explicit_config = 1; break;
      case OPT_CHECK: check = 1; break;
      case 'h': sd_config_usage(stdout); goto done;
      case 'V': printf("shardd %s (protocol %d)\n", SHARDD_VERSION_STRING, SHARDD_PROTO_VERSION); goto done;
      default: goto usage;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "shardd: unexpected argument '%s'\n", argv[optind]);
    goto usage;
  }
  if (given && !*given) {
    fprintf(stderr, "shardd: --config needs a file name\n");
    goto usage;
  }
  if (build(c, config_file(c, given), c->src->file_line, &err) != 0) {
    fprintf(stderr, "shardd: %s\n", err.msg);
    if (check) fprintf(stderr, "shardd: the configuration is invalid\n");
    *exit_code = 1;
    goto done;
  }
  free(longopts);
  free(names);
  if (check) {
    struct stat st;
    /* A root that does not exist yet is made at start; one that does must take a save's steps. */
    if (stat(c->root, &st) == 0 && sd_config_check_root(c->root, &err) != 0) {
      fprintf(stderr, "shardd: %s\n", err.msg);
      *exit_code = 1;
      return 1;
    }
    print_effective(c, stdout);
    return 1;
  }
  return 0;
usage:
  fprintf(stderr, "Try 'shardd --help'.\n");
  *exit_code = 2;
  goto done;
nomem:
  fprintf(stderr, "shardd: out of memory\n");
  *exit_code = 1;
done:
  free(longopts);
  free(names);
  return 1;
}

/* ------------------------------------------------------------------------ *
 * SIGHUP
 * ------------------------------------------------------------------------ */
int sd_config_reload(sd_config *live, unsigned *applied, sd_error *err) {
  *applied = 0;
  sd_config fresh;
  memset(&fresh, 0, sizeof fresh);
  fresh.src = live->src;
  unsigned *lines = calloc(sd_config_nkeys, sizeof *lines);
  if (!lines) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory rereading the configuration");
  int rc = build(&fresh, config_file(live, live->config_path), lines, err);
  if (rc) {
    fresh.src = NULL;
    sd_config_free(&fresh);
    free(lines);
    return rc;
  }
  if ((fresh.config_path == NULL) != (live->config_path == NULL) ||
      (fresh.config_path && strcmp(fresh.config_path, live->config_path) != 0))
    sd_log_info("reload: config file is now %s", fresh.config_path ? fresh.config_path : "none");
  for (size_t i = 0; i < sd_config_nkeys; i++) {
    const sd_config_key *k = &sd_config_keys[i];
    char was[PATH_MAX + 64], now[PATH_MAX + 64], w[512];
    if (k->offset == offsetof(sd_config, root) && live->root_given)
      snprintf(was, sizeof was, "%s", live->root_given);
    else
      sd_config_format(live, k, was, sizeof was);
    sd_config_format(&fresh, k, now, sizeof now);
    if (strcmp(was, now) == 0) continue;
    sd_config_where(&fresh, fresh.src, lines, k, w, sizeof w);
    if (k->reload == SD_RELOAD) {
      sd_config_move(live, &fresh, k);
      (*applied)++;
      sd_log_info("reload: applied %s = %s (was %s)", k->name, now, was);
    } else {
      sd_log_warn("reload: cannot change %s while shardd runs: keeping %s, %s says %s; restart shardd to apply it",
                  k->name, was, w, now);
    }
  }
  char *tmp = live->config_path;
  live->config_path = fresh.config_path;
  fresh.config_path = tmp;
  memcpy(live->src->file_line, lines, sd_config_nkeys * sizeof *lines);
  free(lines);
  fresh.src = NULL;
  sd_config_free(&fresh);
  return 0;
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
  /* The configured spelling is kept: SIGHUP compares the file against it. */
  if (!c->root_given) c->root_given = c->root;
  else free(c->root);
  c->root = abs;
  return 0;
}

/* Daemon settings, parsed: the key table, each value as text and back, the defaults that run unprivileged from a checkout, a config file's text. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "config.h"
#include "config_int.h"
#include "sd_confline.h"
#include "shardd/shardd.h"

/* ------------------------------------------------------------------------ *
 * The key table: one line per setting (how to add one: config.h)
 * ------------------------------------------------------------------------ */
#define FIELD(f) offsetof(sd_config, f), sizeof(((sd_config *)0)->f)
#define SD_KEY_PATH(name, f, def, reload, shortopt, help) \
  {name, SD_CT_PATH, FIELD(f), def, 0, 0, NULL, NULL, reload, shortopt, help}
#define SD_KEY_STR(name, f, def, reload, help) {name, SD_CT_STR, FIELD(f), def, 0, 0, NULL, NULL, reload, 0, help}
#define SD_KEY_NUM(name, f, def, lo, hi, reload, help) \
  {name, SD_CT_NUM, FIELD(f), def, lo, hi, NULL, NULL, reload, 0, help}
#define SD_KEY_BYTES(name, f, def, lo, hi, reload, help) \
  {name, SD_CT_BYTES, FIELD(f), def, lo, hi, NULL, NULL, reload, 0, help}
#define SD_KEY_MODE(name, f, def, reload, help) {name, SD_CT_MODE, FIELD(f), def, 0, 0777, NULL, NULL, reload, 0, help}
#define SD_KEY_ENUM(name, f, def, choices, bare, reload, shortopt, help) \
  {name, SD_CT_ENUM, FIELD(f), def, 0, 0, choices, bare, reload, shortopt, help}

const sd_config_key sd_config_keys[] = {
    SD_KEY_PATH("root", root, NULL, SD_FIXED, 'r',
                "checkpoint root, created if missing (default: /var/lib/shardd as root, else ./checkpoints)"),
    SD_KEY_PATH("socket", socket_path, NULL, SD_FIXED, 's',
                "Unix socket to listen on (default: $SHARDD_SOCKET, else $XDG_RUNTIME_DIR/shardd.sock"
                " when not root, else " SHARDD_DEFAULT_SOCKET ")"),
    SD_KEY_MODE("socket_mode", socket_mode, "0660", SD_FIXED, "permission bits of the socket file"),
    SD_KEY_STR("socket_group", socket_group, "", SD_FIXED,
               "group owning the socket file, name or number (empty: the daemon's group)"),
    SD_KEY_ENUM("log_level", log_level, "info", "error|warn|info|debug", NULL, SD_RELOAD, 'l',
                "least severe level logged"),
    SD_KEY_ENUM("log_syslog_prefix", log_syslog_prefix, "auto", "auto|yes|no", "yes", SD_RELOAD, 0,
                "prefix lines with syslog priorities <N> (auto: when stderr is the systemd journal)"),
    SD_KEY_BYTES("max_line", max_line, "16777216", 1024, 1ULL << 31, SD_RELOAD,
                 "longest request line in bytes (new connections); lines over 16 KiB are parsed off the loop"),
    SD_KEY_NUM("queue_depth", queue_depth, "64", 1, 4096, SD_FIXED, "io_uring queue depth"),
    SD_KEY_NUM("staging_mib", staging_mib, "128", 8, 65536, SD_FIXED,
               "MiB of aligned staging buffers for direct I/O, registered with io_uring (locked memory)"),
    SD_KEY_NUM("copy_threads", copy_threads, NULL, 1, 256, SD_FIXED,
               "staging copies in flight at once, each on a thread of its own (default: the online cores, at most 8)"),
    SD_KEY_ENUM("checksums", checksums, "on", "off|on", "on", SD_RELOAD, 0,
                "record each shard file's data CRC-32C in the index (a single file: its header) for verify --deep"
                " and load(verify=True); off saves its cost (new saves)"),
    SD_KEY_NUM("keep_results", keep_results, "64", 1, 1000000, SD_FIXED,
               "finished saves remembered for late waits"),
    /* limits and permissions */
    SD_KEY_NUM("max_connections", max_connections, "1024", 1, 1000000, SD_RELOAD, "connections open at once"),
    SD_KEY_NUM("max_saves", max_saves, "64", 1, 1000000, SD_RELOAD, "saves in flight at once"),
    SD_KEY_NUM("max_tensors", max_tensors, "1000000", 1, 1ULL << 32, SD_RELOAD, "tensors in one save"),
    SD_KEY_NUM("max_slices", max_slices, "10000000", 1, 1ULL << 36, SD_RELOAD,
               "slices in one save, every rank's puts counted"),
    SD_KEY_NUM("max_name_len", max_name_len, "1024", 1, 1024, SD_RELOAD, "bytes in a tensor name (at most 1024)"),
    SD_KEY_NUM("max_dims", max_dims, "16", 0, 16, SD_RELOAD, "dimensions of a tensor (at most 16)"),
    SD_KEY_BYTES("max_header", max_header, "100000000", 1, 100000000, SD_RELOAD,
                 "JSON header of one shard file in bytes (the format allows 100000000)"),
    SD_KEY_NUM("max_regions", max_regions, "64", 1, 1000000, SD_RELOAD, "shm regions attached per connection"),
    SD_KEY_BYTES("max_output", max_output, "67108864", 4096, 1ULL << 40, SD_RELOAD,
                 "replies a client leaves unread before it is disconnected"),
    SD_KEY_NUM("line_timeout", line_timeout, "60", 0, 86400, SD_RELOAD,
               "seconds a partial request line may stall before the connection is closed (0: never)"),
    SD_KEY_STR("trusted_group", trusted_group, "", SD_FIXED,
               "members of this group may attach shm segments the group owns and overwrite any checkpoint"
               " (empty: none)"),
    SD_KEY_MODE("file_mode", file_mode, "0644", SD_RELOAD, "permission bits of checkpoint files"),
    SD_KEY_MODE("dir_mode", dir_mode, "0755", SD_RELOAD, "permission bits of checkpoint folders"),
    /* local hardening: inline bytes held in memory, descriptors kept free */
    SD_KEY_BYTES("max_inline_bytes_per_save", max_inline_bytes_per_save, "67108864", 1, 1ULL << 40, SD_RELOAD,
                 "bytes of inline put data and file contents one save may hold in memory"),
    SD_KEY_BYTES("max_inline_bytes", max_inline_bytes, "268435456", 1, 1ULL << 40, SD_RELOAD,
                 "bytes of inline put data and file contents all saves together may hold in memory"),
    SD_KEY_NUM("fd_reserve", fd_reserve, "64", 0, 1000000, SD_RELOAD,
               "descriptors kept free for the writer's files: connections are refused past the limit minus these"),
    SD_KEY_NUM("max_open_files", max_open_files, NULL, 1, 1000000, SD_FIXED,
               "checkpoint files all saves together hold open while writing; writes to further files wait until"
               " one is closed (default: a quarter of the descriptor limit, at least 16, at most 1024)"),
    /* peer daemons */
    SD_KEY_STR("peer_listen", peer_listen, "", SD_FIXED,
               "ADDR:PORT to listen on for peer daemons; multi-node saves need it (empty: off)"),
    SD_KEY_STR("peer_token_file", peer_token_file, "", SD_FIXED,
               "file holding the cluster secret peers authenticate with (mode 0600)"),
    SD_KEY_NUM("peer_timeout", peer_timeout, "30", 1, 3600, SD_FIXED,
               "seconds a silent peer daemon is given before its saves fail with peer_lost"),
    /* deadlines: no save waits forever (proto/PROTOCOL.md, "Deadlines") */
    SD_KEY_NUM("join_timeout", join_timeout, "300", 0, 604800, SD_RELOAD,
               "seconds every rank (every node) of a save has to begin after the first did (0: never)"),
    SD_KEY_NUM("idle_timeout", idle_timeout, "600", 0, 604800, SD_RELOAD,
               "seconds a save's unsealed ranks may all stay silent before it fails with timeout (0: never)"),
    SD_KEY_NUM("history_window", history_window, "300", 0, 86400, SD_RELOAD,
               "seconds an ended save's id answers a late begin with its outcome (0: ids are free at once)"),
    SD_KEY_STR("node_name", node_name, "", SD_FIXED, "this daemon's name among its peers (empty: the host name)"),
    /* hostile peers (peer side) */
    SD_KEY_NUM("peer_handshake_timeout", peer_handshake_timeout, "10", 1, 3600, SD_FIXED,
               "seconds a peer connection has to log in (prove the token) before it is closed"),
    SD_KEY_NUM("peer_max_unauth", peer_max_unauth, "64", 1, 100000, SD_FIXED,
               "peer connections not yet logged in at once; past it the oldest is closed"),
    SD_KEY_NUM("max_leader_saves", max_leader_saves, "64", 1, 1000000, SD_RELOAD,
               "multi-node saves this daemon leads at once, recently failed ones included"),
    /* monitoring */
    SD_KEY_STR("metrics_listen", metrics_listen, "", SD_FIXED,
               "ADDR:PORT to serve Prometheus metrics over HTTP at /metrics (empty: off)"),
};
const size_t sd_config_nkeys = sizeof sd_config_keys / sizeof sd_config_keys[0];

const sd_config_key *sd_config_find_key(const char *name) {
  for (size_t i = 0; i < sd_config_nkeys; i++)
    if (strcmp(sd_config_keys[i].name, name) == 0) return &sd_config_keys[i];
  return NULL;
}

/* ------------------------------------------------------------------------ *
 * Values: text to field and back
 * ------------------------------------------------------------------------ */
static void *field(sd_config *c, const sd_config_key *k) { return (char *)c + k->offset; }
static const void *cfield(const sd_config *c, const sd_config_key *k) { return (const char *)c + k->offset; }

static void store_uint(void *p, size_t size, unsigned long long v) {
  uint8_t u8 = (uint8_t)v;
  uint16_t u16 = (uint16_t)v;
  uint32_t u32 = (uint32_t)v;
  uint64_t u64 = v;
  switch (size) {
    case 1: memcpy(p, &u8, 1); break;
    case 2: memcpy(p, &u16, 2); break;
    case 4: memcpy(p, &u32, 4); break;
    default: memcpy(p, &u64, 8); break;
  }
}

static unsigned long long load_uint(const void *p, size_t size) {
  uint8_t u8;
  uint16_t u16;
  uint32_t u32;
  uint64_t u64;
  switch (size) {
    case 1: memcpy(&u8, p, 1); return u8;
    case 2: memcpy(&u16, p, 2); return u16;
    case 4: memcpy(&u32, p, 4); return u32;
    default: memcpy(&u64, p, 8); return u64;
  }
}

/* The largest value a field of this size holds: the table's bound may not exceed it. */
static unsigned long long size_max(size_t size) {
  return size >= 8 ? UINT64_MAX : (1ULL << (size * 8)) - 1;
}

int sd_config_digits(const char *s, int base, unsigned long long *out, const char **end) {
  unsigned long long v = 0;
  const char *p = s;
  for (; *p; p++) {
    int d = (*p >= '0' && *p <= '9') ? *p - '0' : -1;
    if (d < 0 || d >= base) break;
    if (v > (UINT64_MAX - (unsigned)d) / (unsigned)base) return -1;
    v = v * (unsigned)base + (unsigned)d;
  }
  if (p == s) return -1;
  *out = v;
  *end = p;
  return 0;
}

/* "a|b|c": index of value, or -1. */
static int choice_index(const char *choices, const char *value) {
  size_t n = strlen(value);
  int i = 0;
  for (const char *p = choices; p; i++) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (len == n && strncmp(p, value, n) == 0) return i;
    p = bar ? bar + 1 : NULL;
  }
  return -1;
}

static void choice_name(const char *choices, int index, char *buf, size_t n) {
  const char *p = choices;
  for (int i = 0; i < index && p; i++) {
    p = strchr(p, '|');
    if (p) p++;
  }
  if (!p) {
    snprintf(buf, n, "%d", index);
    return;
  }
  const char *bar = strchr(p, '|');
  snprintf(buf, n, "%.*s", (int)(bar ? bar - p : (long)strlen(p)), p);
}

int sd_config_set(sd_config *c, const sd_config_key *k, const char *value, sd_error *err) {
  void *p = field(c, k);
  unsigned long long v = 0;
  const char *end = NULL;
  switch (k->type) {
    case SD_CT_PATH:
      if (!*value) return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "must not be empty");
      /* fall through */
    case SD_CT_STR: {
      char *copy = strdup(value);
      if (!copy) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory");
      char **sp = p;
      free(*sp);
      *sp = copy;
      return 0;
    }
    case SD_CT_NUM:
    case SD_CT_BYTES: {
      unsigned long long hi = k->hi < size_max(k->size) ? k->hi : size_max(k->size);
      int bad = sd_config_digits(value, 10, &v, &end) != 0;
      if (!bad && *end && k->type == SD_CT_BYTES && !end[1]) {
        const char *units = "KMGT", *u = strchr(units, *end >= 'a' ? *end - 'a' + 'A' : *end);
        unsigned shift = u && *end ? 10u * (unsigned)(u - units + 1) : 0;
        bad = !shift || v > (UINT64_MAX >> shift);
        if (!bad) v <<= shift;
      } else if (!bad && *end) {
        bad = 1;
      }
      if (bad || v < k->lo || v > hi) {
        if (k->type == SD_CT_BYTES)
          return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                         "must be a byte count in [%llu, %llu] (suffix K, M, G or T allowed), got '%.100s'",
                         k->lo, hi, value);
        return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "must be an integer in [%llu, %llu], got '%.100s'", k->lo,
                       hi, value);
      }
      store_uint(p, k->size, v);
      return 0;
    }
    case SD_CT_MODE:
      if (sd_config_digits(value, 8, &v, &end) != 0 || *end || strlen(value) > 4 || v > 0777)
        return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "must be octal permission bits such as 0660, got '%.100s'",
                       value);
      store_uint(p, k->size, v);
      return 0;
    case SD_CT_ENUM: {
      int i = choice_index(k->choices, value);
      if (i < 0) {
        char list[256];
        size_t j = 0;
        for (const char *q = k->choices; *q && j + 3 < sizeof list; q++) {
          if (*q == '|') {
            list[j++] = ',';
            list[j++] = ' ';
          } else {
            list[j++] = *q;
          }
        }
        list[j] = '\0';
        return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "must be one of %s, got '%.100s'", list, value);
      }
      store_uint(p, k->size, (unsigned long long)i);
      return 0;
    }
  }
  return sd_fail(err, SHARDD_E_INTERNAL, "key '%s' has an unknown type", k->name);
}

void sd_config_format(const sd_config *c, const sd_config_key *k, char *buf, size_t n) {
  const void *p = cfield(c, k);
  switch (k->type) {
    case SD_CT_PATH:
    case SD_CT_STR: {
      const char *const *sp = p;
      snprintf(buf, n, "%s", *sp ? *sp : "");
      return;
    }
    case SD_CT_NUM:
    case SD_CT_BYTES: snprintf(buf, n, "%llu", load_uint(p, k->size)); return;
    case SD_CT_MODE: snprintf(buf, n, "%04llo", load_uint(p, k->size)); return;
    case SD_CT_ENUM: choice_name(k->choices, (int)load_uint(p, k->size), buf, n); return;
  }
  snprintf(buf, n, "?");
}

/* ------------------------------------------------------------------------ *
 * Defaults
 * ------------------------------------------------------------------------ */
/* Must agree with the client library's default (client/libshardd.c). */
static char *default_socket(void) {
  const char *env = getenv("SHARDD_SOCKET");
  if (env && *env) return strdup(env);
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  if (geteuid() != 0 && xdg && *xdg) {
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s/shardd.sock", xdg);
    return strdup(buf);
  }
  return strdup(SHARDD_DEFAULT_SOCKET);
}

/* The online cores, at most 8 (writer.h: SD_COPY_THREADS_DEFAULT_MAX): past
 * that a copy stage outruns any one node's disks. */
static char *default_copy_threads(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  char buf[16];
  snprintf(buf, sizeof buf, "%ld", n < 1 ? 1 : n > 8 ? 8 : n);
  return strdup(buf);
}

/* A quarter of the descriptor limit the daemon runs with (it raises its soft
 * limit to the hard one at start), at least 16, at most 1024: the rest is
 * for connections, segments and peers, and more files open at once than
 * writes in flight (queue_depth) gains nothing but fewer reopenings. */
static char *default_max_open_files(void) {
  struct rlimit rl;
  unsigned long long n = 1024;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_max != RLIM_INFINITY) n = (unsigned long long)rl.rlim_max / 4;
  char buf[24];
  snprintf(buf, sizeof buf, "%llu", n < 16 ? 16 : n > 1024 ? 1024 : n);
  return strdup(buf);
}

int sd_config_defaults(sd_config *c, sd_error *err) {
  c->socket_gid = -1;
  c->trusted_gid = -1;
  for (size_t i = 0; i < sd_config_nkeys; i++) {
    const sd_config_key *k = &sd_config_keys[i];
    int rc;
    if (k->def) {
      rc = sd_config_set(c, k, k->def, err);
    } else {
      char *v = strcmp(k->name, "socket") == 0         ? default_socket()
                : strcmp(k->name, "copy_threads") == 0 ? default_copy_threads()
                : strcmp(k->name, "max_open_files") == 0 ? default_max_open_files()
                                                       : strdup(geteuid() == 0 ? "/var/lib/shardd" : "checkpoints");
      rc = v ? sd_config_set(c, k, v, err) : sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory");
      free(v);
    }
    if (rc) return rc;
  }
  return 0;
}

/* ------------------------------------------------------------------------ *
 * The config file's text (pure)
 * ------------------------------------------------------------------------ */
int sd_config_parse_text(sd_config *c, const char *text, size_t len, const char *file, unsigned *lines,
                         sd_error *err) {
  unsigned *seen = calloc(sd_config_nkeys, sizeof *seen);
  if (!seen) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory");
  char line[4096], why[256];
  unsigned lineno = 0;
  int rc = 0;
  for (size_t pos = 0; pos < len && !rc;) {
    const char *nl = memchr(text + pos, '\n', len - pos);
    size_t n = nl ? (size_t)(nl - (text + pos)) : len - pos;
    lineno++;
    if (memchr(text + pos, '\0', n)) {
      rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "%s:%u: the line holds a NUL byte", file, lineno);
      break;
    }
    if (n >= sizeof line) {
      rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "%s:%u: the line is longer than %zu bytes", file, lineno,
                   sizeof line - 1);
      break;
    }
    memcpy(line, text + pos, n);
    line[n] = '\0';
    pos += n + 1;
    char *s = NULL, *value = NULL;
    sd_conf_line_kind kind = sd_conf_line(line, &s, &value, why, sizeof why);
    if (kind == SD_CONF_BLANK) continue;
    if (kind == SD_CONF_BAD_LINE) {
      rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "%s:%u: %s", file, lineno, why);
      break;
    }
    if (kind == SD_CONF_BAD_VALUE) {
      rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "%s:%u: key '%.200s': %s", file, lineno, s, why);
      break;
    }
    const sd_config_key *k = sd_config_find_key(s);
    if (!k) {
      rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "%s:%u: unknown key '%.200s'", file, lineno, s);
      break;
    }
    size_t ki = (size_t)(k - sd_config_keys);
    if (seen[ki]) {
      rc = sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "%s:%u: key '%s' is already set on line %u", file, lineno,
                   k->name, seen[ki]);
      break;
    }
    seen[ki] = lineno;
    sd_error e = {0};
    if (sd_config_set(c, k, value, &e) != 0) rc = sd_fail(err, e.code, "%s:%u: key '%s': %s", file, lineno, k->name, e.msg);
  }
  if (!rc && lines) memcpy(lines, seen, sd_config_nkeys * sizeof *seen);
  free(seen);
  return rc;
}

/* ------------------------------------------------------------------------ *
 * Values kept or let go
 * ------------------------------------------------------------------------ */
void sd_config_move(sd_config *to, sd_config *from, const sd_config_key *k) {
  if (k->type == SD_CT_STR || k->type == SD_CT_PATH) {
    char **t = field(to, k), **f = field(from, k);
    free(*t);
    *t = *f;
    *f = NULL;
  } else {
    memcpy(field(to, k), field(from, k), k->size);
  }
}

void sd_config_free(sd_config *c) {
  for (size_t i = 0; i < sd_config_nkeys; i++) {
    const sd_config_key *k = &sd_config_keys[i];
    if (k->type != SD_CT_STR && k->type != SD_CT_PATH) continue;
    char **sp = field(c, k);
    free(*sp);
    *sp = NULL;
  }
  free(c->config_path);
  free(c->root_given);
  c->config_path = c->root_given = NULL;
  if (c->src) {
    for (size_t i = 0; i < c->src->ncli; i++) free(c->src->cli[i].value);
    free(c->src->cli);
    free(c->src->file_line);
    free(c->src);
    c->src = NULL;
  }
}

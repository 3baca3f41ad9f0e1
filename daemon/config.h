/* Daemon settings: one key table shared by the config file, the command line, --check-config and SIGHUP. */
#ifndef SD_CONFIG_H
#define SD_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "log.h"
#include "sd_error.h"

/* ------------------------------------------------------------------------ *
 * Adding a setting (limits, staging size, peer options, ...) takes:
 *
 *   1. a field in sd_config below, in the "settings" group. Numbers may be
 *      any unsigned integer type (unsigned, size_t, uint64_t); strings are
 *      char * (owned, freed by sd_config_free);
 *   2. ONE line in sd_config_keys[] in config.c, e.g.
 *        SD_KEY_NUM("max_connections", max_connections, "1024", 1, 1000000, SD_RELOAD,
 *                   "connections open at once"),
 *      The key is the config-file name; the command-line flag is the same
 *      with '-' for '_' (--max-connections), generated from the table, as
 *      are --help, --check-config output and SIGHUP handling. SD_RELOAD
 *      means SIGHUP overwrites the field in the running daemon's sd_config
 *      (code reading d->cfg->field at the time of use sees the new value);
 *      SD_FIXED means SIGHUP logs that it cannot change while running;
 *   3. its documentation, with the default, in etc/shardd.conf.in and in
 *      doc/man/shardd.8 (tests/integration/test_config.c checks every key
 *      --check-config prints appears in both).
 * ------------------------------------------------------------------------ */

enum { SD_SYSLOG_AUTO, SD_SYSLOG_YES, SD_SYSLOG_NO };

struct sd_config_src;

typedef struct sd_config {
  /* ---- settings: one line each in the key table in config.c ---- */
  char *root;              /* checkpoint root; absolute after sd_config_prepare_root */
  char *socket_path;
  unsigned socket_mode;    /* permission bits of the socket file */
  char *socket_group;      /* group owning the socket file; "" keeps the daemon's */
  sd_log_level log_level;
  int log_syslog_prefix;   /* SD_SYSLOG_*: "<N>" priority prefixes for journald */
  size_t max_line;         /* longest request line, '\n' excluded */
  unsigned queue_depth;    /* io_uring entries */
  unsigned staging_mib;    /* direct-I/O staging buffers: bounds the writer's memory */
  unsigned copy_threads;   /* staging copies in flight at once (libuv threadpool) */
  int checksums;           /* 1: each shard file's data CRC-32C recorded (sd_checksum.h) */
  unsigned keep_results;   /* finished saves remembered for late `wait`s */
  /* limits and permissions: a request over a limit gets limit_exceeded naming it */
  unsigned max_connections; /* open connections */
  unsigned max_saves;      /* saves in flight */
  uint64_t max_tensors;    /* tensors per save */
  uint64_t max_slices;     /* slices per save, every rank's puts counted */
  unsigned max_name_len;   /* bytes of a tensor name (<= SD_NAME_MAX) */
  unsigned max_dims;       /* dimensions of a tensor (<= SD_MAX_DIMS) */
  uint64_t max_header;     /* JSON header bytes of one shard (<= SD_HEADER_MAX) */
  unsigned max_regions;    /* shm regions attached per connection */
  size_t max_output;       /* unread reply bytes before a client is dropped */
  unsigned line_timeout;   /* seconds a partial request line may stall; 0: never */
  char *trusted_group;     /* members may attach shm owned by this group; "" none */
  unsigned file_mode;      /* checkpoint files */
  unsigned dir_mode;       /* checkpoint folders */
  /* local hardening */
  uint64_t max_inline_bytes_per_save; /* inline put data + file contents held by one save */
  uint64_t max_inline_bytes;          /* the same, all saves together */
  unsigned fd_reserve;     /* descriptors connections may not take (writer's files, refusals) */
  unsigned max_open_files; /* checkpoint files the writer holds open at once (fdpool.h), every save together */
  /* peer daemons (cluster.c, proto/PEERS.md) */
  char *peer_listen;       /* "ADDR:PORT" for peer daemons; "" (default): no multi-node saves */
  char *peer_token_file;   /* the shared secret peers prove they hold */
  unsigned peer_timeout;   /* seconds a silent peer is given before its saves fail */
  char *node_name;         /* this daemon's name among its peers; "": the host name */
  unsigned join_timeout;   /* default seconds for every rank to begin after the first; 0: never */
  unsigned idle_timeout;   /* default seconds a save's unsealed ranks may all be silent; 0: never */
  unsigned history_window; /* seconds an ended save's id answers a late begin */
  /* hostile peers (peer side: peer_conn.c, cluster_lead.c) */
  unsigned peer_handshake_timeout; /* seconds a peer connection has to log in */
  unsigned peer_max_unauth;        /* peer connections not logged in at once */
  unsigned max_leader_saves;       /* leader states (cluster_lead.c), failed ones kept for late nodes included */
  /* monitoring */
  char *metrics_listen;    /* "ADDR:PORT" serving GET /metrics (metrics_http.c); "" (default): off */

  /* ---- derived; not keys ---- */
  char *config_path;       /* the file read, NULL when none */
  char *root_given;        /* root as configured, before it was made absolute */
  long socket_gid;         /* socket_group resolved, -1 when none */
  long trusted_gid;        /* trusted_group resolved, -1 when none */
  struct sd_config_src *src; /* command-line values and where each key came from */
} sd_config;

/* ------------------------------------------------------------------------ *
 * The key table
 * ------------------------------------------------------------------------ */
typedef enum {
  SD_CT_STR,    /* any text, may be empty */
  SD_CT_PATH,   /* non-empty text */
  SD_CT_NUM,    /* decimal unsigned integer in [lo, hi] */
  SD_CT_BYTES,  /* like NUM, with an optional K, M, G or T suffix (powers of 1024) */
  SD_CT_MODE,   /* octal permission bits, at most 0777 */
  SD_CT_ENUM,   /* one of the '|'-separated choices, stored as its index (int) */
} sd_config_type;

enum { SD_FIXED = 0, SD_RELOAD = 1 };

typedef struct {
  const char *name;        /* config-file key; flag --name with '-' for '_' */
  sd_config_type type;
  size_t offset, size;     /* the field in sd_config */
  const char *def;         /* default as text; NULL: computed at start-up */
  unsigned long long lo, hi;
  const char *choices;     /* SD_CT_ENUM: "a|b|c" */
  const char *bare;        /* flag value when given without one; NULL: value required */
  int reload;              /* SD_RELOAD or SD_FIXED */
  int shortopt;            /* single-letter flag, or 0 */
  const char *help;
} sd_config_key;

extern const sd_config_key sd_config_keys[];
extern const size_t sd_config_nkeys;

const sd_config_key *sd_config_find_key(const char *name);
/* The value of key k in c as the config file would spell it. */
void sd_config_format(const sd_config *c, const sd_config_key *k, char *buf, size_t n);
/* Key k's value moved from one sd_config to another: a string changes owner. */
void sd_config_move(sd_config *to, sd_config *from, const sd_config_key *k);

/* ------------------------------------------------------------------------ *
 * Pure parsing (no I/O, config.c): unit-tested directly
 * ------------------------------------------------------------------------ */
/* Every key to its default (computed ones: root and socket depend on the
 * effective uid and the environment, copy_threads on the online cores). */
int sd_config_defaults(sd_config *c, sd_error *err);
/* Sets one key from text; err says what is wrong with the value. */
int sd_config_set(sd_config *c, const sd_config_key *k, const char *value, sd_error *err);
/* Applies a config file's text: `key = value` lines, blank lines, and
 * comments from a '#' at the start of a line or after a blank; a value in
 * double or single quotes is the text inside them (proto/sd_confline.h,
 * shardd.conf(5)). Unknown keys, lines without '=', an unclosed quote, text
 * after a closing quote, repeated keys and bad values are errors naming
 * "FILE:LINE" and the key. lines[i] (may be NULL) gets the line that set key i. */
int sd_config_parse_text(sd_config *c, const char *text, size_t len, const char *file,
                         unsigned *lines, sd_error *err);

/* ------------------------------------------------------------------------ *
 * Start-up and reload (config_apply.c, with config_check.c's checks
 * against the system; sd_config_free is config.c's)
 * ------------------------------------------------------------------------ */
/* Defaults, then the config file (--config PATH, else /etc/shardd/shardd.conf
 * when it exists), then the command line. Returns 0 to run, or 1 when the
 * process should exit now with *exit_code: after --help, --version or
 * --check-config, or on an error (printed; 1 for an invalid setting, 2 for
 * a command-line usage error). */
int sd_config_load(sd_config *c, int argc, char **argv, int *exit_code);
/* SIGHUP: rereads the file and the same command line. Settings marked
 * SD_RELOAD that changed are applied to live in place and logged; each
 * changed SD_FIXED one is logged as not applied. An invalid file changes
 * nothing (logged, returns its code). *applied counts the changed keys. */
int sd_config_reload(sd_config *live, unsigned *applied, sd_error *err);
/* Creates the root (and missing parents) and makes c->root absolute. */
int sd_config_prepare_root(sd_config *c, sd_error *err);
void sd_config_free(sd_config *c);
void sd_config_usage(FILE *out);

#define SD_DEFAULT_CONFIG "/etc/shardd/shardd.conf"

#endif

/* The daemon's shared state: its loop, settings, root, writer, saves, sessions and the one set of counters. */
#ifndef SD_DAEMON_H
#define SD_DAEMON_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "acceptor.h"
#include "config.h"
#include "publish.h"

struct sd_save;
struct sd_session;
struct sd_save_result;
struct sd_save_owner_ops;
struct sd_save_ext_ops;

/* Codes are small negative numbers (shardd.h); room to spare for new ones. */
#define SD_COUNT_CODES 64
/* Upper bounds (seconds) of the save duration histogram; +Inf is implied. */
#define SD_DURATION_NBUCKETS 12

/* Everything counts from the daemon's start; bumped on the loop thread only. The
 * save core counts ends, the protocol layer puts and connections, main reloads. */
typedef struct sd_counters {
  uint64_t t_start;                 /* uv_hrtime at start */
  uint64_t connections, puts, bytes_put;
  uint64_t saves_committed, saves_failed, failed_by_code[SD_COUNT_CODES];
  uint64_t files_committed, bytes_committed;
  uint64_t bytes_zero_copy, bytes_gathered, bytes_copied; /* of bytes_committed: zero-copy from the segments, gathered, through staging */
  uint64_t bytes_copied_sealed;     /* of bytes_copied: source bytes from sealed memfds (no shrink check, no guard) */
  double duration_sum, write_sum;
  uint64_t duration_buckets[SD_DURATION_NBUCKETS]; /* not cumulative; summed when reported */
  uint64_t reloads, reloads_failed;
} sd_counters;

typedef struct sd_daemon {
  uv_loop_t *loop;
  const sd_config *cfg;
  int root_fd;
  sd_writer *writer;
  char node[256];                 /* host name, for hello */
  sd_acceptor server;             /* the client socket */
  int listening;

  struct sd_save *saves;          /* in flight */
  size_t nsaves;
  struct sd_session *sessions;
  size_t nsessions;
  uint64_t next_session_id;

  /* Finished saves, newest last, so a late `wait` still gets its answer. */
  struct sd_save_result *history;
  size_t hist_cap, hist_len, hist_head;
  /* Ticks while saves are in flight: join and idle deadlines (save_deadline.c). */
  uv_timer_t deadline_timer;
  int deadline_ready;

  sd_counters counters;
  uint64_t inline_bytes;          /* inline put data and file contents held by saves in flight */
  struct sd_cluster *cluster;     /* peer daemons (cluster.c); NULL without --peer-listen */

  /* Set by main: who hears what saves do (the protocol layer), and what a
   * save spanning several nodes is extended with (the cluster). */
  const struct sd_save_owner_ops *save_owner;
  const struct sd_save_ext_ops *multi_node;
  /* Set by main: answers one request line of connection s (the protocol). */
  void (*on_request)(struct sd_session *s, const char *line, size_t len);
  /* Set by main: takes over a connection accepted on the client socket. */
  void (*on_client)(struct sd_daemon *d, int fd);
  /* Set by main: the `metrics` object of the status reply. */
  struct json_t *(*metrics_view)(const struct sd_daemon *d);

  int shutting_down;
  /* Called (once per transition) when shutting down and no save is left. */
  void (*on_idle)(struct sd_daemon *d);
} sd_daemon;

#endif

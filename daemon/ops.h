/* The daemon's shared state and the protocol v1 request handlers. */
#ifndef SD_OPS_H
#define SD_OPS_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "acceptor.h"
#include "config.h"
#include "publish.h"

struct sd_save;
struct sd_session;
struct sd_save_result;

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

  uint64_t saves_committed, saves_failed, bytes_committed;
  uint64_t inline_bytes;          /* inline put data and file contents held by saves in flight */
  struct sd_cluster *cluster;     /* peer daemons (cluster.c); NULL without --peer-listen */

  int shutting_down;
  /* Called (once per transition) when shutting down and no save is left. */
  void (*on_idle)(struct sd_daemon *d);
} sd_daemon;

/* Parses one request line and answers it on s (or later, for `wait`). */
void sd_ops_dispatch(struct sd_session *s, const char *line, size_t len);

#endif

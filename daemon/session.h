/* One client connection: line reading, request dispatch, ordered replies, events, graceful close. */
#ifndef SD_SESSION_H
#define SD_SESSION_H

#include <jansson.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "daemon.h"
#include "region.h"
#include "sd_linebuf.h"

struct sd_save;

typedef struct {
  struct sd_save *save;
  uint32_t rank;
} sd_member;

/* A descriptor that came with the client's bytes (SCM_RIGHTS), held for the
 * line it belongs to until that line is handled. */
typedef struct {
  uint64_t line;
  int fd;                   /* -2: several came with that line (all closed) */
} sd_line_fd;

#define SD_SESSION_LINE_FDS 8

typedef struct sd_session {
  sd_daemon *d;
  uv_pipe_t pipe;
  uv_shutdown_t shutdown_req;
  uint64_t id;
  uid_t uid;
  gid_t gid;
  pid_t pid;
  gid_t *groups;            /* supplementary groups (SO_PEERGROUPS), for the trusted group */
  size_t ngroups;
  uint64_t partial_since;   /* loop time (ms) an unfinished line started stalling; 0: none */
  sd_linebuf lb;
  char *obuf;               /* replies batched while a read is being handled */
  size_t olen, ocap;
  sd_region_table regions;
  sd_member *members;       /* saves this connection is a rank of */
  size_t nmembers, mcap;
  unsigned pending_waits;
  uint64_t since;           /* loop time (ms) it connected */
  int spoke;                /* it sent at least one request */
  uint64_t nl_seen;         /* '\n' bytes received: the number of the line now arriving */
  uint64_t lines_done;      /* lines handed to on_request */
  sd_line_fd fds[SD_SESSION_LINE_FDS];
  size_t nfds;
  /* While a line is handled: the descriptor that came with it (the handler
   * takes it by setting -1; the session closes any it leaves), -1 none,
   * -2 more than one came (all closed). */
  int line_fd;
  /* A long line is parsed off the loop (session_parse.c); meanwhile no later
   * line is handled and nothing is read. Its request then comes to the
   * handler here (reference handed over; the line itself NULL). */
  struct sd_line_parse *parse;
  json_t *line_req;
  struct sd_puts_scan *line_puts; /* or a puts line of libshardd's shape, scanned (sd_puts_scan.h) */
  int reading, paused, eof, eof_handled, pumping, closing;
  struct sd_session *prev, *next;
} sd_session;

/* Takes over fd, a connection just accepted on the client socket. Past
 * max_connections or the descriptor budget (fd_reserve), the oldest
 * connection that has said nothing for a while makes room; without one,
 * the new connection gets limit_exceeded and is closed. */
void sd_session_accept(sd_daemon *d, int fd);
/* Queues msg (reference stolen) as one line; dropped once the session closes. */
void sd_session_send(sd_session *s, json_t *msg);
/* Hands what replies wait in this batch to the socket now, before slow work
 * (the last seal plans and opens files: that rank should not wait for it). */
void sd_session_flush(sd_session *s);
/* Closes after the queued replies are flushed. */
void sd_session_close(sd_session *s);
/* Closes every session (shutdown). */
void sd_session_close_all(sd_daemon *d);


/* The rank s plays in save, or -1. */
int sd_session_rank_of(const sd_session *s, const struct sd_save *save);
/* What the save core tells the connections that are its ranks and waiters (main wires it). */
extern const struct sd_save_owner_ops sd_session_save_owner;

/* 1 when the peer's primary or supplementary groups include gid (gid < 0: none configured). */
int sd_session_in_group(const sd_session *s, long gid);

#endif

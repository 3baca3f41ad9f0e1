/* One client connection: reads lines, dispatches requests in order, queues replies and events, closes gracefully. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cluster.h"
#include "log.h"
#include "retention.h"
#include "save.h"
#include "sd_grow.h"
#include "sd_msg.h"
#include "session.h"
#include "session_parse.h"

/* A client that stops reading its replies is not read from until they drain: its output stays bounded. */
#define WRITE_HIGH_WATER (4u << 20)
#define READ_CHUNK (64u << 10)
#define OUT_BATCH (256u << 10)

typedef struct {
  uv_write_t req;
  sd_session *s;
  char *buf;
} write_req;

static void pump(sd_session *s);
static void maybe_finish(sd_session *s);
static void on_closed(uv_handle_t *h);
static void saves_forget(sd_daemon *d, sd_session *s);

/* Pausing starts below the output cap: a client that merely reads slowly is throttled long before it is dropped. */
static size_t high_water(const sd_session *s) {
  size_t cap = s->d->cfg->max_output;
  return cap && cap / 2 < WRITE_HIGH_WATER ? cap / 2 : WRITE_HIGH_WATER;
}

/* A client that never reads: past max_output of unread replies and events it is dropped at once, unflushed. */
static int over_output_cap(sd_session *s) {
  size_t queued = uv_stream_get_write_queue_size((uv_stream_t *)&s->pipe) + s->olen;
  size_t cap = s->d->cfg->max_output;
  if (!cap || queued <= cap || s->closing) return 0;
  sd_log_warn("client %llu (pid %d, uid %u): %zu bytes of replies unread, over max_output=%zu; disconnecting",
              (unsigned long long)s->id, (int)s->pid, (unsigned)s->uid, queued, cap);
  s->closing = 1;
  s->olen = 0;
  if (s->reading) uv_read_stop((uv_stream_t *)&s->pipe);
  s->reading = 0;
  uv_close((uv_handle_t *)&s->pipe, on_closed);
  return 1;
}

/* ------------------------------------------------------------------------ *
 * Output
 * ------------------------------------------------------------------------ */
static void on_write(uv_write_t *req, int status) {
  write_req *w = (write_req *)req;
  sd_session *s = w->s;
  free(w->buf);
  free(w);
  if (status < 0 && status != UV_ECANCELED) {
    sd_log_debug("client %llu: write failed: %s", (unsigned long long)s->id, uv_strerror(status));
    sd_session_close(s);
    return;
  }
  if (s->paused && !s->closing && uv_stream_get_write_queue_size((uv_stream_t *)&s->pipe) < high_water(s) / 4) {
    s->paused = 0;
    pump(s);
  }
}

static void write_buf(sd_session *s, char *buf, size_t len) {
  write_req *w = malloc(sizeof *w);
  if (!w) {
    free(buf);
    sd_log_error("client %llu: out of memory queueing a reply; closing", (unsigned long long)s->id);
    sd_session_close(s);
    return;
  }
  w->s = s;
  w->buf = buf;
  uv_buf_t b = uv_buf_init(buf, (unsigned)len);
  if (uv_write(&w->req, (uv_stream_t *)&s->pipe, &b, 1, on_write) < 0) {
    free(buf);
    free(w);
    sd_session_close(s);
    return;
  }
  over_output_cap(s);
}

static void flush(sd_session *s) {
  if (s->olen == 0) return;
  if (s->closing) {
    s->olen = 0;
    return;
  }
  char *buf = s->obuf;
  size_t len = s->olen;
  s->obuf = NULL;
  s->olen = s->ocap = 0;
  write_buf(s, buf, len);
}
void sd_session_flush(sd_session *s) { flush(s); }

void sd_session_send(sd_session *s, json_t *msg) {
  if (!msg) return;
  if (s->closing) {
    json_decref(msg);
    return;
  }
  size_t len = 0;
  char *buf = sd_msg_dump(msg, &len);
  json_decref(msg);
  if (!buf) {
    sd_log_error("client %llu: out of memory encoding a reply; closing", (unsigned long long)s->id);
    sd_session_close(s);
    return;
  }
  if (!s->pumping) {
    write_buf(s, buf, len);
    return;
  }
  /* Replies to one batch of requests leave in one write, not one each. */
  if (SD_GROW(s->obuf, s->ocap, s->olen + len, 4096)) {
    free(buf);
    sd_log_error("client %llu: out of memory queueing a reply; closing", (unsigned long long)s->id);
    sd_session_close(s);
    return;
  }
  memcpy(s->obuf + s->olen, buf, len);
  s->olen += len;
  free(buf);
  if (s->olen >= OUT_BATCH) flush(s);
}

/* ------------------------------------------------------------------------ *
 * Closing: teardown happens in a callback, never inside the call that asked
 * for it, so ending one save can never free another mid-iteration.
 * ------------------------------------------------------------------------ */
static void on_closed(uv_handle_t *h) {
  sd_session *s = h->data;
  sd_daemon *d = s->d;
  saves_forget(d, s);
  for (size_t i = 0; i < s->nfds; i++)
    if (s->fds[i].fd >= 0) close(s->fds[i].fd);
  s->nfds = 0;
  if (s->parse) sd_line_parse_orphan(s->parse);
  sd_region_table_clear(&s->regions);
  sd_linebuf_free(&s->lb);
  free(s->groups);
  free(s->obuf);
  free(s->members);
  if (s->prev) s->prev->next = s->next;
  else d->sessions = s->next;
  if (s->next) s->next->prev = s->prev;
  d->nsessions--;
  sd_log_debug("client %llu gone", (unsigned long long)s->id);
  free(s);
}

static void on_shutdown(uv_shutdown_t *req, int status) {
  (void)status;
  sd_session *s = req->data;
  uv_close((uv_handle_t *)&s->pipe, on_closed);
}

void sd_session_close(sd_session *s) {
  if (s->closing) return;
  flush(s);
  s->closing = 1;
  if (s->reading) uv_read_stop((uv_stream_t *)&s->pipe);
  s->reading = 0;
  /* Flush what is queued (a final error reply, answered waits) first. */
  s->shutdown_req.data = s;
  if (uv_shutdown(&s->shutdown_req, (uv_stream_t *)&s->pipe, on_shutdown) != 0)
    uv_close((uv_handle_t *)&s->pipe, on_closed);
}

void sd_session_close_all(sd_daemon *d) {
  for (sd_session *s = d->sessions; s; s = s->next) sd_session_close(s);
}

/* A half-closed peer (it sent EOF but may still read) is closed once it has nothing left to hear about. */
static void maybe_finish(sd_session *s) {
  if (s->eof_handled && !s->closing && !s->pumping && !s->parse && s->pending_waits == 0) sd_session_close(s);
}

/* ------------------------------------------------------------------------ *
 * What the save core tells this connection, as its ranks and waiters
 * ------------------------------------------------------------------------ */
int sd_session_rank_of(const sd_session *s, const struct sd_save *save) {
  for (size_t i = 0; i < s->nmembers; i++)
    if (s->members[i].save == save) return (int)s->members[i].rank;
  return -1;
}

static int owner_rank_of(const void *owner, const struct sd_save *save) { return sd_session_rank_of(owner, save); }

static int owner_joined(void *owner, struct sd_save *save, uint32_t rank) {
  sd_session *s = owner;
  if (SD_GROW(s->members, s->mcap, s->nmembers + 1, 4)) return -1;
  s->members[s->nmembers].save = save;
  s->members[s->nmembers].rank = rank;
  s->nmembers++;
  return 0;
}

static void owner_left(void *owner, struct sd_save *save) {
  sd_session *s = owner;
  for (size_t i = 0; i < s->nmembers; i++) {
    if (s->members[i].save == save) {
      s->members[i] = s->members[--s->nmembers];
      return;
    }
  }
}

static void owner_released(void *owner, const struct sd_save *save) {
  sd_session_send(owner, sd_msg_event("released", save->id));
}

static void owner_waited(void *owner, json_t *reply) {
  sd_session *s = owner;
  if (reply) sd_session_send(s, reply);
  if (s->pending_waits) s->pending_waits--;
  maybe_finish(s);
}

static int dir_in_flight(void *ud, const char *rel) {
  for (const sd_save *v = ((sd_daemon *)ud)->saves; v; v = v->next)
    if (strcmp(v->dir, rel) == 0) return 1;
  return 0;
}

/* keep_last, once the commit is answered: a failure is logged, the save stays committed. */
static void owner_committed(struct sd_save *save, const char *final_path) {
  (void)final_path;
  if (!save->keep_last || !sd_cluster_save_leads(save)) return;
  sd_daemon *d = save->d;
  sd_error err = {0};
  int n = sd_retention_keep_last(d->loop, d->root_fd, save->dir, save->owner_uid, save->keep_last, dir_in_flight, d,
                                 &err);
  if (n < 0)
    sd_log_warn("save '%s' committed, but keep_last=%u failed (%s): %s", save->id, save->keep_last,
                sd_err_name(err.code), err.msg);
  else if (n > 0)
    sd_log_info("save '%s': keep_last=%u deleted %d older checkpoints of uid %u", save->id, save->keep_last, n,
                (unsigned)save->owner_uid);
}

const sd_save_owner_ops sd_session_save_owner = {
    .rank_of = owner_rank_of,
    .joined = owner_joined,
    .left = owner_left,
    .released = owner_released,
    .waited = owner_waited,
    .committed = owner_committed,
};

/* The connection is closing: its waits are dropped, its unsealed ranks lost. */
static void saves_forget(sd_daemon *d, sd_session *s) {
  size_t dropped = sd_save_drop_waiters(d, s);
  s->pending_waits = s->pending_waits > dropped ? s->pending_waits - (unsigned)dropped : 0;
  /* Work on a copy: failing a save edits membership lists. */
  size_t n = s->nmembers;
  sd_member *m = s->members;
  s->members = NULL;
  s->nmembers = s->mcap = 0;
  for (size_t i = 0; i < n; i++) sd_save_rank_forget(m[i].save, m[i].rank);
  for (size_t i = 0; i < n; i++) sd_save_rank_lost(d, m[i].save, m[i].rank);
  free(m);
}

/* ------------------------------------------------------------------------ *
 * Input
 * ------------------------------------------------------------------------ */
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  sd_session *s = h->data;
  size_t avail = 0;
  char *p = sd_linebuf_reserve(&s->lb, READ_CHUNK, &avail);
  if (avail > (1u << 20)) avail = 1u << 20;
  *buf = uv_buf_init(p, p ? (unsigned)avail : 0);
}

static void read_start(sd_session *s);

/* ------------------------------------------------------------------------ *
 * Descriptors passed with a line (attach of a memfd). libuv's ipc pipe
 * receives them (recvmsg, SCM_RIGHTS, MSG_CMSG_CLOEXEC) and queues them;
 * each is taken out at once, so none waits in libuv and none is lost.
 * ------------------------------------------------------------------------ */
static void free_handle(uv_handle_t *h) { free(h); }

/* The next queued descriptor as a plain fd; -1 when not kept (closed), -3 out of memory (queued; close the session). */
static int fd_accept(sd_session *s) {
  uv_pipe_t *tmp = malloc(sizeof *tmp);
  if (!tmp) return -3;
  if (uv_pipe_init(s->d->loop, tmp, 0) != 0) {
    free(tmp);
    return -3;
  }
  int fd = -1;
  uv_os_fd_t f;
  /* uv_accept adopts any descriptor into a pipe handle (and closes it if it
   * cannot); a duplicate leaves libuv its own to close with the handle. */
  if (uv_accept((uv_stream_t *)&s->pipe, (uv_stream_t *)tmp) == 0 && uv_fileno((uv_handle_t *)tmp, &f) == 0)
    fd = fcntl(f, F_DUPFD_CLOEXEC, 3);
  uv_close((uv_handle_t *)tmp, free_handle);
  return fd;
}

/* Files every queued descriptor under `line`: one per line; a second for
 * the same line, or one past the table, is closed and spoils that line's. */
static void fds_receive(sd_session *s, uint64_t line) {
  while (!s->closing && uv_pipe_pending_count(&s->pipe) > 0) {
    int fd = fd_accept(s);
    if (fd == -3) {
      sd_log_error("client %llu: out of memory receiving a descriptor; closing", (unsigned long long)s->id);
      sd_session_close(s); /* libuv closes what is still queued */
      return;
    }
    sd_line_fd *e = NULL;
    for (size_t i = 0; i < s->nfds && !e; i++)
      if (s->fds[i].line == line) e = &s->fds[i];
    if (!e && s->nfds < SD_SESSION_LINE_FDS && line != UINT64_MAX) {
      e = &s->fds[s->nfds++];
      e->line = line;
      e->fd = fd;
      if (fd < 0) e->fd = -2;
      continue;
    }
    /* debug: the client hears of it in the reply, and a log line per line
     * would let one client flood the log */
    sd_log_debug("client %llu (pid %d): closed a descriptor it sent %s", (unsigned long long)s->id, (int)s->pid,
                e ? "with a line that already carried one" : "beyond what the daemon holds");
    if (fd >= 0) close(fd);
    if (e && e->fd >= 0) close(e->fd);
    if (e) e->fd = -2;
  }
}

/* The descriptor of the line about to be handled, into s->line_fd. */
static void line_fd_take(sd_session *s) {
  uint64_t line = s->lines_done++;
  s->line_fd = -1;
  for (size_t i = 0; i < s->nfds; i++) {
    if (s->fds[i].line != line) continue;
    s->line_fd = s->fds[i].fd;
    s->fds[i] = s->fds[--s->nfds];
    return;
  }
}

/* The peer sent EOF and all its lines are handled: unable to seal, its unsealed ranks are lost now. */
static void peer_finished(sd_session *s) {
  if (s->eof_handled) return;
  s->eof_handled = 1;
  for (size_t i = 0; i < s->nmembers;) {
    struct sd_save *save = s->members[i].save;
    uint32_t rank = s->members[i].rank;
    /* A streamed save may be writing already; it still needs every seal. */
    if (save->ranks[rank].state == SD_RANK_BEGUN && !save->err.code) {
      sd_save_fail(save, SHARDD_E_CLIENT_LOST, "rank %u of save '%s' disconnected before seal", rank, save->id);
      i = 0; /* ending the save edited the list */
      continue;
    }
    i++;
  }
}

static void pump(sd_session *s);
static void on_parsed(void *ud, json_t *req, sd_puts_scan *scan, const sd_error *err);

/* A long line to a worker (NULL: it could not start), told what decides whether its scan may be used. */
static sd_line_parse *parse_off_loop(sd_session *s, const char *line, size_t len) {
  sd_line_scan_limits lim = {s->d->cfg->max_name_len, s->d->cfg->max_dims, 0};
  for (size_t i = 0; i < s->nfds; i++) lim.with_fd |= s->fds[i].line == s->lines_done;
  return sd_line_parse_start(s->d->loop, line, len, &lim, on_parsed, s);
}

/* The handler, and what the session does around it: the line's descriptor. */
static void handle(sd_session *s, const char *line, size_t len) {
  line_fd_take(s);
  s->d->on_request(s, line, len);
  /* A descriptor the handler did not take (a stray one) goes now. */
  if (s->line_fd >= 0) close(s->line_fd);
  s->line_fd = -1;
}

/* A long line is parsed: it is handled, then the lines behind it. */
static void on_parsed(void *ud, json_t *req, sd_puts_scan *scan, const sd_error *err) {
  sd_session *s = ud;
  s->parse = NULL;
  if (s->closing) {
    sd_line_parse_drop(s->d->loop, req);
    sd_line_scan_free(scan);
    return;
  }
  if (scan) {
    s->line_puts = scan;
    handle(s, NULL, 0);
    s->line_puts = NULL;
    sd_line_scan_free(scan);
  } else if (req) {
    s->line_req = json_incref(req); /* the handler's reference; this one is dropped off the loop after it */
    handle(s, NULL, 0);
    json_decref(s->line_req); /* NULL once the handler took it */
    s->line_req = NULL;
    sd_line_parse_drop(s->d->loop, req);
  } else {
    line_fd_take(s); /* its descriptor, if any, goes with it */
    if (s->line_fd >= 0) close(s->line_fd);
    s->line_fd = -1;
    sd_session_send(s, sd_msg_error_from(NULL, err));
  }
  pump(s);
}

static void pump(sd_session *s) {
  if (s->pumping) return;
  s->pumping = 1;
  while (!s->closing && !s->parse) {
    if (uv_stream_get_write_queue_size((uv_stream_t *)&s->pipe) + s->olen > high_water(s)) {
      s->paused = 1;
      break;
    }
    char *line;
    size_t len;
    sd_error err = {0};
    int rc = sd_linebuf_next(&s->lb, &line, &len, &err);
    if (rc == 0) break;
    if (rc < 0) {
      /* Framing is lost: say why, then hang up. */
      if (err.code == SHARDD_E_BAD_REQUEST)
        sd_fail(&err, SHARDD_E_LIMIT, "request line longer than max_line=%zu bytes; closing the connection",
                s->d->cfg->max_line);
      sd_log_warn("client %llu (pid %d): %s", (unsigned long long)s->id, (int)s->pid, err.msg);
      sd_session_send(s, sd_msg_error_from(NULL, &err));
      s->pumping = 0;
      sd_session_close(s);
      return;
    }
    s->partial_since = 0;
    s->spoke = 1;
    /* A long line goes to a worker; the lines behind it wait (handled in order). */
    if (len > SD_PARSE_OFF_LOOP && (s->parse = parse_off_loop(s, line, len))) break;
    handle(s, line, len);
  }
  s->pumping = 0;
  flush(s);
  if (s->closing) return;
  if (s->paused || s->parse) {
    if (s->reading) uv_read_stop((uv_stream_t *)&s->pipe);
    s->reading = 0;
  } else if (!s->eof) {
    read_start(s);
  } else {
    /* Every line the peer sent before EOF is answered; only now is it lost. */
    peer_finished(s);
  }
  maybe_finish(s);
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  sd_session *s = stream->data;
  if (nread > 0) {
    /* The kernel hands a message's descriptors to the read that ends in (or
     * at the end of) that message's bytes, never later, so they belong to
     * the line holding this read's last byte. */
    const char *p = buf->base, *end = p + nread - 1;
    uint64_t line = s->nl_seen;
    for (const char *q = p; (q = memchr(q, '\n', (size_t)(end - q))); q++) line++;
    s->nl_seen = line + (*end == '\n');
    fds_receive(s, line);
    sd_linebuf_commit(&s->lb, (size_t)nread);
    pump(s);
    /* The sweep below hangs up on a line left unfinished for too long. */
    if (!s->closing && !s->partial_since && sd_linebuf_pending(&s->lb) > 0)
      s->partial_since = uv_now(s->d->loop);
    return;
  }
  fds_receive(s, UINT64_MAX); /* none come without bytes; closed if they do */
  if (nread == 0) return;
  if (nread == UV_ENOBUFS) {
    sd_log_error("client %llu: out of memory reading a request; closing", (unsigned long long)s->id);
    sd_session_close(s);
    return;
  }
  uv_read_stop(stream);
  s->reading = 0;
  s->eof = 1;
  if (nread != UV_EOF) {
    sd_log_debug("client %llu: read failed: %s", (unsigned long long)s->id, uv_strerror((int)nread));
    sd_session_close(s);
    return;
  }
  /* Complete lines already received are still answered; an unterminated
   * tail is dropped (the peer can no longer finish it). */
  pump(s);
}

static void read_start(sd_session *s) {
  if (s->reading || s->closing || s->eof) return;
  if (uv_read_start((uv_stream_t *)&s->pipe, on_alloc, on_read) == 0) s->reading = 1;
}

/* ------------------------------------------------------------------------ *
 * Stalled partial lines: one daemon-wide timer, not one per connection
 * ------------------------------------------------------------------------ */
#define SWEEP_MS 500

static uv_timer_t sweep_timer;
static int sweep_started;

static void on_sweep(uv_timer_t *t) {
  sd_daemon *d = t->data;
  uint64_t limit = (uint64_t)d->cfg->line_timeout * 1000;
  if (!limit) return;
  uint64_t now = uv_now(d->loop);
  for (sd_session *s = d->sessions; s; s = s->next) {
    /* A paused client is not being read (nor one whose long line is being parsed), so its line cannot finish. */
    if (s->closing || s->paused || s->parse || !s->partial_since || now - s->partial_since < limit) continue;
    sd_error err = {0};
    sd_fail(&err, SHARDD_E_LIMIT, "request line unfinished for %u s (line_timeout=%u); closing the connection",
            d->cfg->line_timeout, d->cfg->line_timeout);
    sd_log_warn("client %llu (pid %d, uid %u): %s", (unsigned long long)s->id, (int)s->pid, (unsigned)s->uid,
                err.msg);
    sd_session_send(s, sd_msg_error_from(NULL, &err));
    sd_session_close(s); /* frees s later, in a callback: the walk stays valid */
  }
}

static void sweep_start(sd_daemon *d) {
  if (sweep_started) return;
  sweep_started = 1;
  uv_timer_init(d->loop, &sweep_timer);
  sweep_timer.data = d;
  uv_timer_start(&sweep_timer, on_sweep, SWEEP_MS, SWEEP_MS);
  uv_unref((uv_handle_t *)&sweep_timer); /* never what keeps the daemon running */
}

int sd_session_in_group(const sd_session *s, long gid) {
  if (gid < 0) return 0;
  if ((long)s->gid == gid) return 1;
  for (size_t i = 0; i < s->ngroups; i++)
    if ((long)s->groups[i] == gid) return 1;
  return 0;
}

/* Supplementary groups of the peer, for the trusted-group shm check. */
static void read_groups(sd_session *s, int fd) {
  socklen_t len = 0;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, NULL, &len) != 0 && errno != ERANGE) return;
  if (len == 0) return;
  s->groups = malloc(len);
  if (!s->groups) return;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, s->groups, &len) != 0) {
    free(s->groups);
    s->groups = NULL;
    return;
  }
  s->ngroups = len / sizeof(gid_t);
}

/* ------------------------------------------------------------------------ *
 * Accept
 * ------------------------------------------------------------------------ */
/* A connection silent this long may be closed to make room when the daemon is full. */
#define SILENT_EVICT_MS 1000
/* Refusals are logged at once, then at most this often with a count: a flood must not flood the log. */
#define REFUSE_LOG_MS 10000

static int over_limit(sd_daemon *d, int fd, sd_error *err) {
  const sd_config *cfg = d->cfg;
  if (cfg->max_connections && d->nsessions >= cfg->max_connections)
    return sd_fail(err, SHARDD_E_LIMIT, "too many connections (max_connections=%u); try again later",
                   cfg->max_connections);
  if (sd_fd_over_budget(fd, cfg->fd_reserve))
    return sd_fail(err, SHARDD_E_LIMIT,
                   "too many open descriptors (descriptor limit %llu, fd_reserve=%u kept for the writer);"
                   " try again later",
                   (unsigned long long)sd_fd_limit(), cfg->fd_reserve);
  return 0;
}

/* The oldest connection that never sent a request and holds nothing (no save, region, wait); newest listed first. */
static sd_session *oldest_silent(sd_daemon *d) {
  uint64_t now = uv_now(d->loop);
  sd_session *found = NULL;
  for (sd_session *s = d->sessions; s; s = s->next)
    if (!s->closing && !s->spoke && !s->nmembers && !s->regions.n && !s->pending_waits &&
        now - s->since >= SILENT_EVICT_MS)
      found = s;
  return found;
}

/* Refusals and evictions are counted apart, so neither hides the other. */
typedef struct {
  uint64_t count, logged, at;
} rate_log;
static rate_log refusals, evictions;

static void log_refused(sd_daemon *d, rate_log *rl, pid_t pid, uid_t uid, const char *why) {
  uint64_t now = uv_now(d->loop);
  rl->count++;
  if (rl->at && now - rl->at < REFUSE_LOG_MS) return;
  sd_log_warn("client (pid %d, uid %u) refused: %s (%llu like it since the last report)", (int)pid, (unsigned)uid,
              why, (unsigned long long)(rl->count - rl->logged));
  rl->logged = rl->count;
  rl->at = now ? now : 1;
}

/* No session, no queue: one line if the socket takes it now, then closed (no descriptor held past this call). */
static void refuse(sd_daemon *d, int fd, const sd_error *err) {
  struct ucred cred = {0};
  socklen_t clen = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) cred.pid = 0;
  log_refused(d, &refusals, cred.pid, cred.uid, err->msg);
  size_t len = 0;
  json_t *msg = sd_msg_error_from(NULL, err);
  char *line = msg ? sd_msg_dump(msg, &len) : NULL;
  json_decref(msg);
  if (line && send(fd, line, len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
    sd_log_debug("refused client: %s", strerror(errno));
  free(line);
  close(fd);
}

/* Makes room for fd when the daemon is full: 0 if there is (now or once a silent one closes), else err says why. */
static int admit(sd_daemon *d, int fd, sd_error *err) {
  if (!over_limit(d, fd, err)) return 0;
  sd_session *victim = oldest_silent(d);
  if (!victim) return err->code;
  sd_error why = {0};
  sd_fail(&why, SHARDD_E_LIMIT, "closing this connection: it sent no request for %llu ms and the daemon is full (%s)",
          (unsigned long long)(uv_now(d->loop) - victim->since), err->msg);
  log_refused(d, &evictions, victim->pid, victim->uid, why.msg);
  sd_session_send(victim, sd_msg_error_from(NULL, &why));
  sd_session_close(victim);
  sd_error_clear(err);
  return 0;
}

void sd_session_accept(sd_daemon *d, int fd) {
  sd_error lim = {0};
  if (admit(d, fd, &lim)) {
    refuse(d, fd, &lim);
    return;
  }
  sd_session *s = calloc(1, sizeof *s);
  if (!s) {
    sd_log_error("out of memory accepting a client");
    close(fd);
    return;
  }
  s->d = d;
  s->line_fd = -1;
  /* ipc: reads go through recvmsg, so descriptors sent with attach arrive. */
  if (uv_pipe_init(d->loop, &s->pipe, 1) != 0) {
    close(fd);
    free(s);
    return;
  }
  s->pipe.data = s;
  sd_linebuf_init(&s->lb, d->cfg->max_line);
  s->id = ++d->next_session_id;
  s->since = uv_now(d->loop);
  s->next = d->sessions;
  if (d->sessions) d->sessions->prev = s;
  d->sessions = s;
  d->nsessions++;
  if (uv_pipe_open(&s->pipe, fd) != 0) {
    close(fd);
    s->closing = 1;
    uv_close((uv_handle_t *)&s->pipe, on_closed);
    return;
  }
  struct ucred cred;
  socklen_t clen = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) {
    sd_log_warn("cannot read the credentials of a client; refusing it");
    s->closing = 1;
    uv_close((uv_handle_t *)&s->pipe, on_closed);
    return;
  }
  s->uid = cred.uid;
  s->gid = cred.gid;
  s->pid = cred.pid;
  read_groups(s, fd);
  sweep_start(d);
  sd_log_debug("client %llu connected (pid %d, uid %u)", (unsigned long long)s->id, (int)s->pid,
               (unsigned)s->uid);
  d->counters.connections++;
  read_start(s);
}

/* Accepting connections without starving: the descriptor limit, its budget, and the spare-descriptor trick. */
#ifndef SD_ACCEPTOR_H
#define SD_ACCEPTOR_H

#include <stdint.h>
#include <uv.h>

/* ------------------------------------------------------------------------ *
 * The process's descriptor limit
 * ------------------------------------------------------------------------ */
/* Raises the soft RLIMIT_NOFILE to the hard limit (start-up, once) and logs
 * what it became: a daemon started by hand gets what systemd's
 * LimitNOFILE= gives the unit. */
void sd_fd_limit_raise(void);
/* The soft limit now. */
uint64_t sd_fd_limit(void);
/* 1 when fd, just opened, leaves fewer than `reserve` descriptors free:
 * the kernel hands out the lowest free number, so every one below fd is in use. */
int sd_fd_over_budget(int fd, unsigned reserve);

/* ------------------------------------------------------------------------ *
 * A listening socket. libuv's own accept path (uv_listen) meets EMFILE by
 * silently accepting and closing every pending connection; here that stays
 * (one at a time, so the listener never spins), but it is logged, and
 * the owner sees every connection it does get as a plain descriptor.
 * ------------------------------------------------------------------------ */
/* Gets each accepted descriptor (CLOEXEC, non-blocking); it owns it. */
typedef void (*sd_accept_fn)(void *ud, int fd);

typedef struct sd_acceptor {
  uv_poll_t poll;
  uv_timer_t retry;         /* no spare descriptor left: polling pauses briefly */
  int fd;
  const char *what;         /* "the client socket", for logs */
  sd_accept_fn on_accept;
  void *ud;
  uint64_t dropped;         /* connections closed unanswered for want of a descriptor */
  uint64_t logged_at;       /* loop time of the last EMFILE log line; 0: none yet */
  uint64_t dropped_logged;
  int polling, closing;
  unsigned open_handles;
  /* Optional: called once both handles are closed after sd_acceptor_stop, so an
   * owner that frees the memory holding the acceptor knows when it may. */
  void (*on_stopped)(void *ud);
} sd_acceptor;

/* Takes over listen_fd (a listening socket; closed on failure too). Returns 0 or a libuv error. */
int sd_acceptor_start(sd_acceptor *a, uv_loop_t *loop, int listen_fd, const char *what, sd_accept_fn fn,
                      void *ud);
/* Stops accepting and closes the listening socket. */
void sd_acceptor_stop(sd_acceptor *a);

/* A listening TCP socket on host:port (numeric port; 0 takes a free one),
 * close-on-exec, SO_REUSEADDR, nonblocking when asked; *ss gets the address
 * it is bound to. 0, -errno, or 1 when the address does not resolve (*why
 * says why). */
struct sockaddr_storage;
int sd_tcp_listen(const char *host, unsigned port, int backlog, int nonblock, int *fd, struct sockaddr_storage *ss,
                  const char **why);

#endif

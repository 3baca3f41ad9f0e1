/* Internals shared by libshardd's source files: the client and arena structs and the plumbing helpers. */
#ifndef SD_CLIENT_INT_H
#define SD_CLIENT_INT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "sd_error.h"
#include "sd_layout.h"
#include "sd_linebuf.h"
#include "shardd/shardd.h"

/* A status reply lists every save in flight; leave it plenty of room while
 * still refusing a daemon that streams an endless line. */
#define SD_CLIENT_MAX_LINE (64u * 1024u * 1024u)
/* Non-wait requests are validated and answered at once by the daemon, so a
 * silent daemon for this long is treated as hung rather than busy. */
#define SD_CLIENT_DEFAULT_TIMEOUT_MS 120000
#define SD_CLIENT_ERR_MAX (SD_ERRMSG_MAX + 64)

struct shardd_arena {
  shardd_client *c;        /* NULL once the client is closed */
  shardd_arena *next;      /* the client's list, so close can orphan us */
  void *base;
  size_t size;
  int64_t region;
  int memfd;               /* a sealed memfd passed to the daemon (else named POSIX shm) */
  char name[64];
};

struct shardd_client {
  int fd;                  /* -1 once the connection is lost */
  int timeout_ms;          /* for non-wait requests; < 0 forever */
  int64_t next_id;
  sd_linebuf in;
  json_t *waits;           /* save -> id of the wait request still unanswered */
  json_t *early;           /* "id" -> wait reply that arrived while we awaited something else */
  json_t *released;        /* save -> true once "released" (or the save's end) was seen */
  shardd_arena *arenas;
  int pass_fd, passing;    /* passing: the next request carries pass_fd (SCM_RIGHTS) */
  uint64_t max_line;       /* the daemon's, from hello (0: not said) */
  uint64_t max_puts;       /* slices one puts line may hold (0: the daemon has no puts) */
  char *node;
  char *server;
  char err[SD_CLIENT_ERR_MAX];
};

/* Error helpers: the message goes to c->err (or, with no client, to the
 * thread's connect error) and the code is returned. */
int sd_client_fail(shardd_client *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int sd_client_ok(shardd_client *c);
int sd_client_connect_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

int64_t sd_client_now_ms(void);
int sd_client_conn_check(shardd_client *c);
/* One request, one reply (for every op but wait); steals req. */
int sd_client_request(shardd_client *c, json_t *req, json_t **reply);
/* The same, the request's line carrying fd (SCM_RIGHTS, one sendmsg); fd stays the caller's. */
int sd_client_request_fd(shardd_client *c, json_t *req, int fd, json_t **reply);
/* Writes request number k into out (empty), with id `id` and its '\n': 0; none left: 1; a local
 * refusal: minus its code, its message in c->err. */
typedef int (*sd_client_line_fn)(shardd_client *c, void *ctx, size_t k, json_int_t id, sd_buf *out);
/* Requests made by `line` one after the other, at most `window` unanswered at a time, none
 * made after the first refusal, every reply to those sent read. Returns the first failure, its request's number in *failed, its message in c->err
 * and its reply's "accepted" (-1 when it has none) in *accepted. */
int sd_client_pipeline(shardd_client *c, size_t window, sd_client_line_fn line, void *ctx, size_t *failed,
                       int64_t *accepted);
/* n requests (stolen) through sd_client_pipeline. Returns the first failure, its index in *failed and its message. */
int sd_client_request_many(shardd_client *c, json_t **reqs, size_t n, size_t *failed);

#endif

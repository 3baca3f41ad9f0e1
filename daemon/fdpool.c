/* Shard files opened by name on demand and closed when idle past the cap: the daemon's writes hold a bounded number of descriptors however many files they write. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include "fdpool.h"

struct sd_fdent {
  int fd;                  /* -1: closed */
  uint32_t busy;           /* requests in flight on it: never closed meanwhile */
  int idle;                /* on the pool's idle list (open and not busy) */
  sd_fdent *prev, *next;
  sd_fdset *set;
};

struct sd_fdset {
  sd_fdpool *pool;
  int dir_fd, oflags;
  const char *const *names;
  size_t n;
  sd_fdset_hook on_open, on_close;
  void *ud;
  sd_fdent e[];
};

void sd_fdpool_init(sd_fdpool *p, unsigned cap) {
  *p = (sd_fdpool){.cap = cap};
}

void sd_fdpool_wait(sd_fdpool *p, sd_fdwaiter *w) {
  if (w->queued) return;
  w->queued = 1;
  w->prev = NULL;
  w->next = p->waiters;
  if (p->waiters) p->waiters->prev = w;
  p->waiters = w;
}

void sd_fdpool_unwait(sd_fdpool *p, sd_fdwaiter *w) {
  if (!w->queued) return;
  w->queued = 0;
  if (w->prev) w->prev->next = w->next;
  else p->waiters = w->next;
  if (w->next) w->next->prev = w->prev;
  w->prev = w->next = NULL;
}

/* A descriptor can be had now: under the cap (none: 0), or an idle file to close for it. */
static int pool_room(const sd_fdpool *p) {
  return !p->cap || p->nopen < p->cap || p->idle_head;
}

void sd_fdpool_wake(sd_fdpool *p) {
  /* The ones waiting now, each taken off before its call, which may queue it
   * again (no room left for it): those wait for the next wake. */
  sd_fdwaiter *w = p->waiters;
  for (sd_fdwaiter *x = w; x; x = x->next) x->queued = 0;
  p->waiters = NULL;
  while (w && pool_room(p)) {
    sd_fdwaiter *next = w->next;
    w->prev = w->next = NULL;
    w->cb(w);
    w = next;
  }
  while (w) { /* no room after all: back in the queue */
    sd_fdwaiter *next = w->next;
    sd_fdpool_wait(p, w);
    w = next;
  }
}

static void idle_unlink(sd_fdpool *p, sd_fdent *e) {
  if (!e->idle) return;
  e->idle = 0;
  if (e->prev) e->prev->next = e->next;
  else p->idle_head = e->next;
  if (e->next) e->next->prev = e->prev;
  else p->idle_tail = e->prev;
  e->prev = e->next = NULL;
}

static void idle_append(sd_fdpool *p, sd_fdent *e) {
  e->idle = 1;
  e->next = NULL;
  e->prev = p->idle_tail;
  if (p->idle_tail) p->idle_tail->next = e;
  else p->idle_head = e;
  p->idle_tail = e;
}

/* An open entry with nothing in flight is closed. */
static void ent_close(sd_fdent *e) {
  sd_fdset *s = e->set;
  sd_fdpool *p = s->pool;
  idle_unlink(p, e);
  if (s->on_close) s->on_close(s->ud, (uint32_t)(e - s->e), e->fd);
  close(e->fd);
  e->fd = -1;
  p->nopen--;
}

int sd_fdset_new(sd_fdpool *p, int dir_fd, const char *const *names, size_t n, int oflags, sd_fdset **out) {
  sd_fdset *s = calloc(1, sizeof *s + n * sizeof s->e[0]);
  if (!(*out = s)) return -ENOMEM;
  *s = (sd_fdset){.pool = p, .dir_fd = dir_fd, .oflags = oflags, .names = names, .n = n};
  for (size_t i = 0; i < n; i++) s->e[i] = (sd_fdent){.fd = -1, .set = s};
  return 0;
}

void sd_fdset_hooks(sd_fdset *s, sd_fdset_hook on_open, sd_fdset_hook on_close, void *ud) {
  s->on_open = on_open;
  s->on_close = on_close;
  s->ud = ud;
}

int sd_fdset_room(const sd_fdset *s) {
  return pool_room(s->pool);
}

int sd_fdset_ready(const sd_fdset *s, uint32_t i) {
  return s->e[i].fd >= 0 || sd_fdset_room(s);
}

int sd_fdset_get(sd_fdset *s, uint32_t i) {
  sd_fdent *e = &s->e[i];
  sd_fdpool *p = s->pool;
  if (e->fd >= 0) {
    if (e->busy++ == 0) idle_unlink(p, e);
    return e->fd;
  }
  if (p->cap && p->nopen >= p->cap) {
    if (!p->idle_head) return -EAGAIN;
    ent_close(p->idle_head);
    p->closes_idle++;
  }
  int fd;
  /* Out of descriptors for another reason (connections): one idle file less makes room. */
  while ((fd = openat(s->dir_fd, s->names[i], s->oflags | O_CLOEXEC | O_NOFOLLOW)) < 0 &&
         (errno == EMFILE || errno == ENFILE) && p->idle_head) {
    ent_close(p->idle_head);
    p->closes_idle++;
  }
  if (fd < 0) return -errno;
  e->fd = fd;
  e->busy = 1;
  p->opens++;
  if (++p->nopen > p->peak) p->peak = p->nopen;
  if (s->on_open) s->on_open(s->ud, i, fd);
  return fd;
}

void sd_fdset_put(sd_fdset *s, uint32_t i) {
  sd_fdent *e = &s->e[i];
  if (e->busy && --e->busy == 0 && e->fd >= 0) idle_append(s->pool, e);
}

sd_fdpool *sd_fdset_pool(sd_fdset *s) {
  return s->pool;
}

int sd_fdset_fd(const sd_fdset *s, uint32_t i) {
  return s->e[i].fd;
}

void sd_fdset_close(sd_fdset *s, uint32_t i) {
  sd_fdent *e = &s->e[i];
  if (e->fd >= 0 && !e->busy) ent_close(e);
}

void sd_fdset_free(sd_fdset *s) {
  if (!s) return;
  for (size_t i = 0; i < s->n; i++) {
    s->e[i].busy = 0;
    if (s->e[i].fd >= 0) ent_close(&s->e[i]);
  }
  free(s);
}

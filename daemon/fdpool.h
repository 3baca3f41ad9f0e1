/* Shard files opened by name when a write needs them, under one cap on the descriptors the daemon's writes hold at once (fdpool.c). */
#ifndef SD_FDPOOL_H
#define SD_FDPOOL_H

#include <stddef.h>
#include <stdint.h>

/* A save of 100,000 files must not need 100,000 descriptors, nor several
 * saves in flight more than the process may open. Every file a save writes
 * is named in a set (one per file set, one per node's share of a
 * multi-node save); its descriptor is opened when a request needs it and
 * held while requests are in flight on it ("busy"). Past the cap, an idle
 * descriptor (open, nothing in flight) of any set is closed, the one idle
 * longest first, before another opens; when every descriptor is busy, the
 * caller waits for a completion (which frees one) and asks again. A closed
 * file loses nothing: its written bytes are the inode's, and the fsync on
 * a later descriptor makes them durable; a writeback error no descriptor
 * has seen is reported to the next one opened (errseq). */
typedef struct sd_fdent sd_fdent;
typedef struct sd_fdset sd_fdset;

/* One who found every descriptor busy and waits for one (a node's writes
 * through the ring, which nothing else asks again): embedded in its owner. */
typedef struct sd_fdwaiter {
  void (*cb)(struct sd_fdwaiter *w);
  struct sd_fdwaiter *prev, *next;
  int queued;
} sd_fdwaiter;

typedef struct {
  unsigned cap;            /* descriptors open at once; 0: no cap */
  unsigned nopen, peak;    /* open now, the most at once since the start */
  uint64_t opens, closes_idle; /* opened; closed while idle to make room (reopened later if needed) */
  sd_fdent *idle_head, *idle_tail; /* open and idle, the longest idle first */
  sd_fdwaiter *waiters;    /* waiting for room */
} sd_fdpool;

void sd_fdpool_init(sd_fdpool *p, unsigned cap);
/* w->cb is called (once) by sd_fdpool_wake when there is room again;
 * queueing one already queued does nothing. */
void sd_fdpool_wait(sd_fdpool *p, sd_fdwaiter *w);
void sd_fdpool_unwait(sd_fdpool *p, sd_fdwaiter *w);
/* Calls the waiters if a descriptor can be had: the writer calls it after
 * each batch of completions, which is when busy descriptors become idle. */
void sd_fdpool_wake(sd_fdpool *p);
/* The pool a set draws from. */
sd_fdpool *sd_fdset_pool(sd_fdset *s);

/* A set's file i was opened as fd / is about to be closed (the hooks of
 * sd_fdset_hooks, so the owner can set O_DIRECT, register it with the ring,
 * or take the registration back). */
typedef void (*sd_fdset_hook)(void *ud, uint32_t i, int fd);

/* n files named names[i] in dir_fd (plain names of files the caller made;
 * never followed as symlinks), opened with oflags | O_CLOEXEC | O_NOFOLLOW.
 * names and dir_fd must outlive the set. -ENOMEM or 0. */
int sd_fdset_new(sd_fdpool *p, int dir_fd, const char *const *names, size_t n, int oflags, sd_fdset **out);
void sd_fdset_hooks(sd_fdset *s, sd_fdset_hook on_open, sd_fdset_hook on_close, void *ud);
/* 1 when sd_fdset_get(s, i) would not be refused for the cap: i is open, or
 * the pool is under its cap, or some descriptor is idle. */
int sd_fdset_ready(const sd_fdset *s, uint32_t i);
/* 1 when some file (whichever) could be had now. */
int sd_fdset_room(const sd_fdset *s);
/* File i's descriptor, held busy until sd_fdset_put: opened if it is not
 * (an idle one of any set closed first at the cap). -EAGAIN: every
 * descriptor is busy; -errno: the open failed. */
int sd_fdset_get(sd_fdset *s, uint32_t i);
void sd_fdset_put(sd_fdset *s, uint32_t i);
/* File i's descriptor now, or -1 (for a call made while it is busy). */
int sd_fdset_fd(const sd_fdset *s, uint32_t i);
/* Closes file i now if it is open and not busy (its last request is done). */
void sd_fdset_close(sd_fdset *s, uint32_t i);
/* Closes every file not busy; frees the set once none is (the caller's
 * requests are all done by then). NULL is fine. */
void sd_fdset_free(sd_fdset *s);

#endif

/* Staging for O_DIRECT writes: aligned buffers registered with the ring, fixed-file slots, and a copy that survives a vanishing source. */
#ifndef SD_STAGING_H
#define SD_STAGING_H

#include <liburing.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

#include "sd_error.h"

/* O_DIRECT wants buffer address, file offset and length aligned to the
 * logical block size; 4 KiB covers every common device and file system. */
#define SD_DIO_ALIGN 4096u

static inline uint64_t sd_align_up(uint64_t v) {
  return (v + SD_DIO_ALIGN - 1) & ~(uint64_t)(SD_DIO_ALIGN - 1);
}

struct sd_wjob;

/* ------------------------------------------------------------------------ *
 * A staging chunk: cap bytes, SD_DIO_ALIGN-aligned, holding one stretch of
 * one file at a time. A job holds it from staging until its write is done.
 * ------------------------------------------------------------------------ */
typedef struct sd_chunk {
  uint8_t *buf;
  uint32_t cap;
  int buf_index;           /* registered buffer, or -1: written with a plain write */
  /* set by the job that holds it (loop thread) */
  struct sd_wjob *job;
  uint32_t file;           /* the job's own file label */
  uint64_t off;            /* file offset of buf[0]: a multiple of SD_DIO_ALIGN */
  uint32_t len;            /* file bytes in buf; buf is zeroed from len to sd_align_up(len) */
  uint32_t done;           /* bytes already on disk (a write that must be resumed) */
  size_t cursor;           /* job-private: where the fill starts */
  /* set by the fill (worker thread) */
  uint64_t src_bytes;      /* bytes read from callers' sources */
  uint64_t src_sealed;     /* of them: from sealed spans */
  int fault;               /* reading a source failed, buf is incomplete: EFAULT for a
                            * SIGBUS, ENODATA for a short read, else the read's errno */
  uint64_t fault_off;      /* the file offset whose source failed */
  uint32_t sum;            /* the job's: its data bytes' CRC-32C share (sd_checksum.h), when it keeps sums */
  struct sd_chunk *next;
} sd_chunk;

typedef struct {
  struct io_uring *ring;
  sd_chunk *chunks;        /* max of them; buf == NULL until first needed */
  unsigned max, live, busy, peak;
  uint32_t chunk_bytes;
  sd_chunk *free;          /* live and idle */
  int sparse;              /* the ring has a sparse table of max buffer slots */
  int reg_failed;          /* registering failed once (RLIMIT_MEMLOCK): plain writes */
  unsigned *slot_free;     /* fixed-file slots */
  unsigned nslots, nslot_free;
  uint8_t *pin_used;       /* SD_PIN_SLOTS buffer slots after the chunks' (sd_staging_pin), NULL: none */
  uint64_t pinned;         /* bytes of clients' segments registered now */
  int pin_failed;          /* the kernel refused a pin once (RLIMIT_MEMLOCK): said once in the log */
} sd_staging;

/* Up to `bytes` of staging in chunks of chunk_bytes (at least two chunks),
 * allocated on demand. Never fails for want of io_uring features: without
 * buffer or file registration the writes are plain ones. */
int sd_staging_init(sd_staging *s, struct io_uring *ring, uint64_t bytes, uint32_t chunk_bytes,
                    sd_error *err);
/* An idle chunk, allocating (and registering) one if fewer than max are
 * live; NULL when every chunk is busy or memory is short. */
sd_chunk *sd_staging_get(sd_staging *s);
void sd_staging_put(sd_staging *s, sd_chunk *c);
/* Allocates (and registers) every chunk not yet live, idle: a save about to
 * come then finds its staging ready. */
void sd_staging_prefill(sd_staging *s);
/* Frees every idle chunk (the daemon went quiet). */
void sd_staging_trim(sd_staging *s);
void sd_staging_free(sd_staging *s);
/* Bytes of staging allocated now. */
uint64_t sd_staging_bytes(const sd_staging *s);

/* ------------------------------------------------------------------------ *
 * Pinned segments. A client's sealed memfd (it can never shrink) is
 * registered with the ring once, at attach, in pieces of SD_PIN_PIECE: its
 * zero-copy writes then go as fixed-buffer writes, with no pinning, page
 * faults or page-table work per write and save. io_uring pins for writing,
 * so the mapping is writable only while the kernel pins it.
 * ------------------------------------------------------------------------ */
#define SD_PIN_SLOTS 4096u
#define SD_PIN_PIECE (1ull << 30) /* io_uring's largest registered buffer */

/* Registering the page-aligned mapping [base, base + len) pins (and, for a
 * sparse segment, allocates) every page of it: seconds for some GiB. So it
 * goes in three steps, the middle one on any thread while the loop goes on:
 * begin takes consecutive buffer slots for its pieces (-1: it stays
 * unpinned: no table, no room; that costs only speed), register pins, end
 * (keep 0: the writer is closing) returns 1 + its first slot, or 0 when it
 * stays unpinned (RLIMIT_MEMLOCK), its slots given back. */
typedef struct {
  uint8_t *base;
  uint64_t len;
  unsigned first, n, done; /* slots taken, and registered so far */
  int rc;                  /* register's result: 0 or -errno */
} sd_pin_job;
int sd_staging_pin_begin(sd_staging *s, uint8_t *base, uint64_t len, sd_pin_job *j);
void sd_staging_pin_register(const sd_staging *s, sd_pin_job *j);
int sd_staging_pin_end(sd_staging *s, sd_pin_job *j, int keep);
void sd_staging_unpin(sd_staging *s, int pin, uint64_t len);
/* The buffer slot holding [src, src + len) of a segment pinned as `pin` at
 * base, or -1 when the range crosses a piece boundary (written unfixed). */
static inline int sd_pin_slot(int pin, const uint8_t *base, const uint8_t *src, uint64_t len) {
  uint64_t at = (uint64_t)(src - base);
  if (!pin || at / SD_PIN_PIECE != (at + len - 1) / SD_PIN_PIECE) return -1;
  return pin - 1 + (int)(at / SD_PIN_PIECE);
}

/* A fixed-file slot holding fd, or -1 when none is free (use fd itself). */
int sd_staging_file_slot(sd_staging *s, int fd);
void sd_staging_file_unslot(sd_staging *s, int slot);

/* ------------------------------------------------------------------------ *
 * Copies from clients' shared memory: a client that shrinks its segment
 * makes the daemon's read fault with SIGBUS. A thread arms the guard around
 * such a copy; the fault then jumps back to its sigsetjmp instead of killing
 * the daemon. Any other SIGBUS keeps its default (fatal) meaning.
 *
 *   sigjmp_buf jb;
 *   if (sigsetjmp(jb, 1)) { ...faulted: sd_bus_guard is already NULL... }
 *   sd_bus_guard = &jb;  ...memcpy...  sd_bus_guard = NULL;
 * ------------------------------------------------------------------------ */
extern __thread sigjmp_buf *volatile sd_bus_guard;
/* Installs the process-wide SIGBUS handler (once) and unblocks SIGBUS in
 * the calling thread. */
void sd_bus_guard_install(void);

/* Drops from the page tables the whole pages under [p, p + len) of a shared
 * mapping: the data stays in the segment and is faulted back if read again. */
void sd_shared_drop(const uint8_t *p, uint64_t len);

#endif

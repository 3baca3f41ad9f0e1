/* A publish's bytes (pubfill.c): the data writes of a save and the stretches of files they are staged in. */
#ifndef SD_PUBFILL_H
#define SD_PUBFILL_H

#include <stdint.h>
#include <sys/uio.h>

#include "staging.h"

/* ------------------------------------------------------------------------ *
 * The data writes of a publish
 * ------------------------------------------------------------------------ */
typedef struct {
  uint32_t file;           /* index into plan->files */
  uint64_t file_offset;    /* absolute offset in that file */
  const uint8_t *src;      /* shm mapping or heap; valid until the done callback */
  uint64_t len;
  uint32_t flags;          /* SD_WOP_* */
  uint32_t slice;          /* the caller's label (save_end.c: which slice it copies) */
} sd_write_op;

/* src lies in a client's MAP_SHARED mapping. When a sealed span holds it
 * (a memfd that cannot shrink) or another span does, its bytes are read
 * with preadv from the segment's descriptor: none of its pages enters the daemon's page
 * tables, and a segment the client shrank reads short instead of faulting.
 * Otherwise they are copied from the mapping under a SIGBUS guard. Pages
 * read through a mapping are dropped from the daemon's page tables, so its
 * resident memory stays at its staging size however large the checkpoint.
 * Never set it for private (heap) memory: dropping those pages would zero
 * them. */
#define SD_WOP_SHARED 1u

/* A client's shared-memory segment: mapped at base, len bytes, readable
 * through fd. */
typedef struct {
  const uint8_t *base;
  uint64_t len;
  int fd;
  int sealed;              /* sd_region.sealed: it can never be shorter than len */
  int pin;                 /* sd_region.pin: registered with the ring (0: not) */
  uint32_t rank;           /* whose segment it is, for messages */
} sd_shm_span;

/* Pure: the span of spans (n of them, sorted by base, none overlapping) that
 * src lies in, or NULL (heap memory, or outside every segment). */
const sd_shm_span *sd_span_find(const sd_shm_span *spans, size_t n, const uint8_t *src);

/* ------------------------------------------------------------------------ *
 * A publish's bytes (pubfill.c): every file is a head (header, artifact or
 * index bytes, at offset 0) followed by the data writes that land in it;
 * files are cut into chunk-sized stretches at multiples of the chunk size
 * (and at the zero-copy stretches' ends, which are aligned too), so every
 * write but a file's last is whole aligned blocks.
 * ------------------------------------------------------------------------ */
typedef struct {
  const uint8_t *head;     /* heap memory */
  uint64_t head_len;
  uint64_t size;           /* the file's final length */
} sd_fill_file;

/* ------------------------------------------------------------------------ *
 * Zero-copy stretches: the aligned middle of a write whose shared source
 * sits at an address congruent to its file offset (mod SD_DIO_ALIGN) goes
 * to the ring straight from the client's mapping, with no staging copy;
 * its unaligned head and tail, and every other write, are staged.
 * ------------------------------------------------------------------------ */
#define SD_ZERO_COPY_MIN (64u << 10)   /* smaller middles are staged: not worth a write of their own */
#define SD_ZERO_COPY_PIECE (8u << 20)  /* largest zero-copy write handed to the ring */

typedef struct {
  uint32_t file;
  uint64_t off, len;       /* multiples of SD_DIO_ALIGN (a gathered one's: of the device's offset alignment) */
  size_t op;               /* the write (index in sd_fill.ops) it is the middle of; a gathered one's first */
  uint64_t sent;           /* loop thread: bytes of it handed out so far */
  size_t op_end;           /* gathered: one past its last write (0: op + 1) */
  int gather;              /* one writev from several writes' sources (sd_fill_plan_gather) */
} sd_fill_zero_copy;

/* One zero-copy write for the ring: from src, or (niov > 0) gathered from
 * niov pieces of several sources. */
typedef struct {
  uint32_t file;
  uint64_t off;
  const uint8_t *src;
  uint32_t len;
  size_t op;
  struct iovec *iov;       /* the caller's SD_GATHER_IOV entries, kept across calls */
  int niov;
} sd_fill_piece;

/* ------------------------------------------------------------------------ *
 * Gathered stretches: an inner-dimension split interleaves several ranks'
 * row fragments in the file. Where the device's direct-I/O alignment
 * (statx STATX_DIOALIGN) allows, an aligned file range whose every piece
 * starts at a source address aligned to the memory alignment and is a
 * multiple of the offset alignment long is one writev whose iovecs point
 * into the ranks' segments: no staging copy.
 * ------------------------------------------------------------------------ */
/* Pieces (row fragments) smaller than this are staged, not gathered. Measured
 * here (bench_multi (k), every matrix split on its inner dimension, 4 GiB):
 * gathering 4 KiB fragments ran 0.40 GB/s at 1.27 s/GiB of daemon CPU, copying
 * them 1.07 GB/s at 0.32 s/GiB, so only large fragments are worth a gather. */
#define SD_GATHER_MIN_PIECE (64u << 10)
#define SD_GATHER_IOV 1024          /* iovecs in one gathered write (IOV_MAX) */
#define SD_GATHER_BYTES (8u << 20)  /* bytes in one gathered write */

typedef struct {
  const sd_fill_file *files;
  size_t nfiles;
  const sd_write_op *ops;  /* sorted by file, then offset, none overlapping */
  size_t nops;
  const sd_shm_span *spans; /* sorted by base, none overlapping */
  size_t nspans;
  const uint8_t *ready;    /* ops[i] may be read once ready[i] is set; NULL: all may */
  /* the loop thread's cursor: where the next stretch starts */
  uint32_t file;
  uint64_t off;
  size_t op;
  size_t scan;             /* ops before this one are known ready */
  /* zero-copy stretches, sorted; staged stretches go around them */
  sd_fill_zero_copy *zc;
  size_t nzc;
  size_t dskip;            /* the staging cursor: the next one it must not stage */
  size_t dnext;            /* the first one with bytes not yet handed out */
} sd_fill;

/* Sets f's sources: a copy of spans sorted by base (returned, for the
 * caller to free; NULL: no memory). */
sd_shm_span *sd_fill_set_spans(sd_fill *f, const sd_shm_span *spans, size_t n);
/* 1 when ops are in file and offset order. */
int sd_fill_ops_sorted(const sd_write_op *ops, size_t n);
/* Sets f's writes: ops itself when sorted, else a sorted copy of the
 * non-empty ones in *own (for the caller to free). -1: no memory. */
int sd_fill_set_ops(sd_fill *f, const sd_write_op *ops, size_t n, sd_write_op **own);
/* Pure: the zero-copy stretches of f's writes (malloc'd, NULL when none or
 * out of memory: then everything is staged). Only SD_WOP_SHARED writes
 * qualify, with a middle of at least min_len. */
sd_fill_zero_copy *sd_fill_plan_zero_copy(const sd_fill *f, uint64_t min_len, size_t *n);
/* Pure: adds to the zero-copy stretches d (n of them, sorted; taken over,
 * may be NULL) the gathered stretches of f's shared writes outside them,
 * for a device taking direct I/O from addresses aligned to mem_align at
 * offsets and lengths aligned to off_align (powers of two, at most
 * SD_DIO_ALIGN); pieces shorter than min_piece are left to staging (see
 * SD_GATHER_MIN_PIECE). Each is one write of at most SD_GATHER_IOV pieces and
 * SD_GATHER_BYTES, at least min_len long. Returns the merged stretches,
 * sorted (*n updated); on no memory, d as it was. */
sd_fill_zero_copy *sd_fill_plan_gather(const sd_fill *f, sd_fill_zero_copy *d, size_t *n, uint32_t mem_align,
                                    uint32_t off_align, uint64_t min_len, uint64_t min_piece);
/* Pure: the next zero-copy write, at most max bytes (a gathered one whole,
 * its iovecs written to out->iov, which the caller points at SD_GATHER_IOV
 * entries and which is kept), or 0 when none is
 * ready (streaming: its writes' ready flags) or left. Stretches go out in
 * file order, except that a ready one up to SD_ZERO_COPY_AHEAD stretches past
 * the first unready one goes first (ranks fill their memory in their own
 * order, not the file's). */
#define SD_ZERO_COPY_AHEAD 256
int sd_fill_next_zero_copy(sd_fill *f, uint32_t max, sd_fill_piece *out);

/* Pure: the next stretch, at most cap bytes (a multiple of SD_DIO_ALIGN)
 * of one file: sets c->file, off, len and cursor and advances. Returns 0
 * once every byte of every file has been handed out, or while a write in
 * the next stretch is not ready (whole stretches only, so a slow source
 * does not turn into many small writes). */
int sd_fill_next(sd_fill *f, uint32_t cap, sd_chunk *c);
/* Copies the stretch into c->buf: the head, the data writes (shared
 * sources inside a span with preadv, gathered by source run, those of sealed
 * spans counted; others with memcpy, a fault in a shared
 * one setting c->fault and fault_off instead of killing the process), zeros
 * for bytes no write covers and up to sd_align_up(len). Sets c->src_bytes
 * and c->src_sealed. The SIGBUS guard is armed only if a shared source
 * outside every span is met. */
void sd_fill_copy(const sd_fill *f, sd_chunk *c);

#endif

/* A publish's bytes cut into aligned staging stretches, and the copy that fills one (run on the copy worker thread). */
#include <setjmp.h>
#include <string.h>

#include "publish_int.h"

int sd_fill_next(sd_fill *f, uint32_t cap, sd_chunk *c) {
  while (f->file < f->nfiles && f->off >= f->files[f->file].size) {
    f->file++;
    f->off = 0;
  }
  if (f->file >= f->nfiles) return 0;
  uint64_t len = f->files[f->file].size - f->off;
  if (len > cap) len = cap;
  /* Writes wholly before this stretch were handed out with earlier ones;
   * a write crossing the boundary is the first of this one. */
  while (f->op < f->nops) {
    const sd_write_op *op = &f->ops[f->op];
    if (op->file > f->file || (op->file == f->file && op->file_offset + op->len > f->off)) break;
    f->op++;
  }
  c->file = f->file;
  c->off = f->off;
  c->len = (uint32_t)len;
  c->cursor = f->op;
  f->off += len;
  return 1;
}

/* ------------------------------------------------------------------------ *
 * Dropping read pages of shared sources. Slices of one rank follow each
 * other in its segment, and an inner-dimension split interleaves rows of a
 * few sources in the file: a handful of open runs merges them, so a chunk
 * costs a few madvise calls rather than one per row.
 * ------------------------------------------------------------------------ */
#define RUNS 4

typedef struct {
  const uint8_t *a, *b;
} run;

static void runs_add(run *r, unsigned *n, const uint8_t *src, uint64_t len) {
  for (unsigned i = 0; i < *n; i++)
    if (r[i].b == src) {
      r[i].b = src + len;
      return;
    }
  if (*n == RUNS) {
    sd_shared_drop(r[0].a, (uint64_t)(r[0].b - r[0].a));
    memmove(r, r + 1, (RUNS - 1) * sizeof *r);
    (*n)--;
  }
  r[(*n)++] = (run){src, src + len};
}

/* What the guarded copy has done so far: in memory, not in registers, so
 * it is still true after a fault jumps back into sd_fill_copy. */
typedef struct {
  size_t i;                /* the write being copied */
  uint64_t pos;            /* bytes of the stretch before pos are in place */
  uint64_t copied;         /* bytes read from sources */
  run runs[RUNS];
  unsigned nruns;
} copy_state;

__attribute__((noinline)) static void copy_ops(const sd_fill *f, sd_chunk *c, copy_state *st) {
  const uint64_t a = c->off, b = c->off + c->len;
  uint8_t *const dst = c->buf;
  for (; st->i < f->nops; st->i++) {
    const sd_write_op *op = &f->ops[st->i];
    if (op->file != c->file || op->file_offset >= b) break;
    if (op->len == 0) continue;
    uint64_t lo = op->file_offset > a ? op->file_offset : a;
    uint64_t hi = op->file_offset + op->len < b ? op->file_offset + op->len : b;
    if (lo > st->pos) memset(dst + (st->pos - a), 0, lo - st->pos);
    const uint8_t *src = op->src + (lo - op->file_offset);
    memcpy(dst + (lo - a), src, hi - lo);
    st->copied += hi - lo;
    st->pos = hi;
    if (op->flags & SD_WOP_SHARED) runs_add(st->runs, &st->nruns, src, hi - lo);
  }
}

void sd_fill_copy(const sd_fill *f, sd_chunk *c) {
  const sd_fill_file *ff = &f->files[c->file];
  copy_state st = {.i = c->cursor, .pos = c->off};
  c->src_bytes = 0;
  c->fault = 0;
  if (ff->head_len > c->off) {
    uint64_t e = ff->head_len < c->off + c->len ? ff->head_len : c->off + c->len;
    memcpy(c->buf, ff->head + c->off, e - c->off);
    st.pos = e;
  }
  sigjmp_buf jb;
  if (sigsetjmp(jb, 1)) {
    const sd_write_op *op = &f->ops[((volatile copy_state *)&st)->i];
    c->fault = 1;
    c->fault_off = op->file_offset > c->off ? op->file_offset : c->off;
    return;
  }
  sd_bus_guard = &jb;
  copy_ops(f, c, &st);
  sd_bus_guard = NULL;
  c->src_bytes = st.copied;
  /* Bytes no write covers read back as zeros, and so does the padding of
   * a file's last block. */
  uint64_t end = c->off + sd_align_up(c->len);
  if (end > c->off + c->cap) end = c->off + c->cap;
  if (st.pos < end) memset(c->buf + (st.pos - c->off), 0, end - st.pos);
  for (unsigned k = 0; k < st.nruns; k++)
    sd_shared_drop(st.runs[k].a, (uint64_t)(st.runs[k].b - st.runs[k].a));
}

/* A publish's bytes cut into aligned staging stretches, zero-copy and gathered stretches, and the copy that fills a staged one (run on the copy worker thread). */
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "pubfill.h"
#include "sd_grow.h"

static int span_cmp(const void *a, const void *b) {
  const sd_shm_span *x = a, *y = b;
  return x->base < y->base ? -1 : x->base > y->base;
}

static int op_cmp(const void *a, const void *b) {
  const sd_write_op *x = a, *y = b;
  if (x->file != y->file) return x->file < y->file ? -1 : 1;
  if (x->file_offset != y->file_offset) return x->file_offset < y->file_offset ? -1 : 1;
  return 0;
}

sd_shm_span *sd_fill_set_spans(sd_fill *f, const sd_shm_span *spans, size_t n) {
  sd_shm_span *own = malloc(n * sizeof *own);
  if (!own) return NULL;
  memcpy(own, spans, n * sizeof *own);
  qsort(own, n, sizeof *own, span_cmp);
  f->spans = own;
  f->nspans = n;
  return own;
}

int sd_fill_ops_sorted(const sd_write_op *ops, size_t n) {
  for (size_t i = 1; i < n; i++)
    if (op_cmp(&ops[i - 1], &ops[i]) > 0) return 0;
  return 1;
}

int sd_fill_set_ops(sd_fill *f, const sd_write_op *ops, size_t n, sd_write_op **own) {
  *own = NULL;
  if (sd_fill_ops_sorted(ops, n)) {
    f->ops = ops;
    f->nops = n;
    return 0;
  }
  size_t k = 0;
  for (size_t i = 0; i < n; i++) k += ops[i].len > 0;
  if (!(*own = malloc((k ? k : 1) * sizeof **own))) return -1;
  k = 0;
  for (size_t i = 0; i < n; i++)
    if (ops[i].len > 0) (*own)[k++] = ops[i];
  qsort(*own, k, sizeof **own, op_cmp);
  f->ops = *own;
  f->nops = k;
  return 0;
}

/* The staging cursor steps over zero-copy stretches; 1 when one begins at f->off. */
static int skip_zero_copy(sd_fill *f) {
  while (f->dskip < f->nzc) {
    const sd_fill_zero_copy *d = &f->zc[f->dskip];
    if (d->file > f->file || (d->file == f->file && d->off + d->len > f->off)) break;
    f->dskip++;
  }
  if (f->dskip >= f->nzc) return 0;
  const sd_fill_zero_copy *d = &f->zc[f->dskip];
  if (d->file != f->file || d->off != f->off) return 0;
  f->off += d->len;
  f->dskip++;
  return 1;
}

int sd_fill_next(sd_fill *f, uint32_t cap, sd_chunk *c) {
  do {
    while (f->file < f->nfiles && f->off >= f->files[f->file].size) {
      f->file++;
      f->off = 0;
    }
    if (f->file >= f->nfiles) return 0;
  } while (skip_zero_copy(f));
  uint64_t len = f->files[f->file].size - f->off;
  if (len > cap) len = cap;
  if (f->dskip < f->nzc) {
    /* Stop where the next zero-copy stretch begins (an aligned offset). */
    const sd_fill_zero_copy *d = &f->zc[f->dskip];
    if (d->file == f->file && d->off < f->off + len) len = d->off - f->off;
  }
  /* Writes wholly before this stretch were handed out with earlier ones;
   * a write crossing the boundary is the first of this one. */
  while (f->op < f->nops) {
    const sd_write_op *op = &f->ops[f->op];
    if (op->file > f->file || (op->file == f->file && op->file_offset + op->len > f->off)) break;
    f->op++;
  }
  if (f->ready) {
    /* Readiness only grows, so the scan resumes where it stopped. */
    if (f->scan < f->op) f->scan = f->op;
    for (; f->scan < f->nops; f->scan++) {
      const sd_write_op *op = &f->ops[f->scan];
      if (op->file > f->file || (op->file == f->file && op->file_offset >= f->off + len)) break;
      if (!f->ready[f->scan]) return 0;
    }
  }
  c->file = f->file;
  c->off = f->off;
  c->len = (uint32_t)len;
  c->cursor = f->op;
  f->off += len;
  return 1;
}

sd_fill_zero_copy *sd_fill_plan_zero_copy(const sd_fill *f, uint64_t min_len, size_t *n) {
  sd_fill_zero_copy *d = NULL;
  size_t cap = 0;
  *n = 0;
  for (size_t i = 0; i < f->nops; i++) {
    const sd_write_op *op = &f->ops[i];
    if (!(op->flags & SD_WOP_SHARED) || ((uintptr_t)op->src - op->file_offset) % SD_DIO_ALIGN) continue;
    uint64_t a = sd_align_up(op->file_offset), b = (op->file_offset + op->len) & ~(uint64_t)(SD_DIO_ALIGN - 1);
    if (b <= a || b - a < min_len) continue;
    if (SD_GROW(d, cap, *n + 1, 64)) {
      free(d);
      *n = 0;
      return NULL;
    }
    d[(*n)++] = (sd_fill_zero_copy){op->file, a, b - a, i, 0, i + 1, 0};
  }
  return d;
}

/* ------------------------------------------------------------------------ *
 * Gathered stretches
 * ------------------------------------------------------------------------ */
typedef struct {
  sd_fill_zero_copy *v;
  size_t n, cap;
  int oom;
} dlist;

static void dlist_add(dlist *l, sd_fill_zero_copy d) {
  if (l->oom) return;
  if (SD_GROW(l->v, l->cap, l->n + 1, 64)) {
    l->oom = 1;
    return;
  }
  l->v[l->n++] = d;
}

/* The stretch being gathered: file bytes [off, off + len) from writes [op, op_end). */
typedef struct {
  sd_fill_zero_copy cur;
  unsigned niov;
  const uint8_t *next_src; /* where the last piece's source ends: a piece going on from it shares its iovec */
  uint64_t min_len;
  uint64_t min_piece;      /* smaller pieces are staged */
} gather_run;

/* Staged stretches begin and end on SD_DIO_ALIGN (a staged last block goes
 * out padded to it), so a gathered one is cut to whole SD_DIO_ALIGN blocks;
 * only its pieces inside need no more than the device's alignment. */
static void gather_close(gather_run *g, dlist *out) {
  uint64_t a = sd_align_up(g->cur.off), b = (g->cur.off + g->cur.len) & ~(uint64_t)(SD_DIO_ALIGN - 1);
  if (g->cur.len && b > a && b - a >= g->min_len) {
    g->cur.len = b - a;
    g->cur.off = a;
    dlist_add(out, g->cur);
  }
  g->cur.len = 0;
  g->niov = 0;
}

/* One piece of a write: file bytes [lo, hi) of ops[i], source src. */
static void gather_piece(gather_run *g, dlist *out, uint32_t file, size_t i, uint64_t lo, uint64_t hi,
                         const uint8_t *src, uint64_t mask) {
  if (lo >= hi) return;
  if (hi - lo < g->min_piece || (((uintptr_t)src | lo | hi) & mask)) {
    gather_close(g, out);
    return;
  }
  while (lo < hi) {
    int joins = g->cur.len && g->cur.file == file && g->cur.off + g->cur.len == lo;
    if (!joins || g->cur.len >= SD_GATHER_BYTES || (g->niov >= SD_GATHER_IOV && src != g->next_src)) {
      gather_close(g, out);
      g->cur = (sd_fill_zero_copy){file, lo, 0, i, 0, i + 1, 1};
    }
    uint64_t take = hi - lo;
    if (take > SD_GATHER_BYTES - g->cur.len) take = SD_GATHER_BYTES - g->cur.len;
    if (!g->cur.len || src != g->next_src) g->niov++;
    g->cur.len += take;
    g->cur.op_end = i + 1;
    lo += take;
    src += take;
    g->next_src = src;
  }
}

sd_fill_zero_copy *sd_fill_plan_gather(const sd_fill *f, sd_fill_zero_copy *d, size_t *n, uint32_t mem_align,
                                    uint32_t off_align, uint64_t min_len, uint64_t min_piece) {
  if (!mem_align || !off_align || mem_align > SD_DIO_ALIGN || off_align > SD_DIO_ALIGN) return d;
  /* Linux checks each iovec's address against the memory alignment and its
   * length against the offset (logical block) alignment. */
  const uint64_t mask = (uint64_t)(mem_align > off_align ? mem_align : off_align) - 1;
  dlist out = {0};
  gather_run g = {.min_len = min_len ? min_len : 1, .min_piece = min_piece};
  size_t k = 0; /* the next zero-copy stretch */
  for (size_t i = 0; i < f->nops; i++) {
    const sd_write_op *op = &f->ops[i];
    if (op->len == 0) continue;
    if (!(op->flags & SD_WOP_SHARED)) {
      gather_close(&g, &out);
      continue;
    }
    uint64_t lo = op->file_offset, hi = op->file_offset + op->len;
    while (k < *n && d[k].op < i) k++;
    if (k < *n && d[k].op == i) {
      /* A zero-copy middle: the pieces around it may still gather. */
      gather_piece(&g, &out, op->file, i, lo, d[k].off, op->src, mask);
      gather_close(&g, &out);
      lo = d[k].off + d[k].len;
    }
    gather_piece(&g, &out, op->file, i, lo, hi, op->src + (lo - op->file_offset), mask);
  }
  gather_close(&g, &out);
  if (out.oom || !out.n) {
    free(out.v);
    return d;
  }
  /* Merge: both lists are sorted and never overlap. */
  sd_fill_zero_copy *m = malloc((*n + out.n) * sizeof *m);
  if (!m) {
    free(out.v);
    return d;
  }
  size_t a = 0, b = 0, j = 0;
  while (a < *n || b < out.n) {
    int take_a = b >= out.n || (a < *n && (d[a].file < out.v[b].file ||
                                           (d[a].file == out.v[b].file && d[a].off < out.v[b].off)));
    m[j++] = take_a ? d[a++] : out.v[b++];
  }
  free(d);
  free(out.v);
  *n = j;
  return m;
}

static int stretch_ready(const sd_fill *f, const sd_fill_zero_copy *d) {
  if (!f->ready) return 1;
  for (size_t i = d->op, end = d->op_end > d->op ? d->op_end : d->op + 1; i < end; i++)
    if (!f->ready[i]) return 0;
  return 1;
}

/* The iovecs of a gathered stretch: its writes' pieces, one iovec per run of one source. */
static int gather_iov(const sd_fill *f, const sd_fill_zero_copy *d, struct iovec *iov) {
  int n = 0;
  const uint64_t a = d->off, b = d->off + d->len;
  for (size_t i = d->op; i < d->op_end; i++) {
    const sd_write_op *op = &f->ops[i];
    uint64_t lo = op->file_offset > a ? op->file_offset : a;
    uint64_t hi = op->file_offset + op->len < b ? op->file_offset + op->len : b;
    if (hi <= lo) continue;
    uint8_t *src = (uint8_t *)(uintptr_t)(op->src + (lo - op->file_offset));
    if (n && (uint8_t *)iov[n - 1].iov_base + iov[n - 1].iov_len == src)
      iov[n - 1].iov_len += hi - lo;
    else
      iov[n++] = (struct iovec){src, hi - lo};
  }
  return n;
}

int sd_fill_next_zero_copy(sd_fill *f, uint32_t max, sd_fill_piece *out) {
  while (f->dnext < f->nzc && f->zc[f->dnext].sent >= f->zc[f->dnext].len) f->dnext++;
  sd_fill_zero_copy *d = NULL;
  for (size_t i = f->dnext; i < f->nzc && i - f->dnext < SD_ZERO_COPY_AHEAD && !d; i++)
    if (f->zc[i].sent < f->zc[i].len && stretch_ready(f, &f->zc[i])) d = &f->zc[i];
  if (!d) return 0;
  const sd_write_op *op = &f->ops[d->op];
  out->file = d->file;
  out->op = d->op;
  if (d->gather) {
    out->off = d->off;
    out->src = NULL;
    out->len = (uint32_t)d->len;
    out->niov = gather_iov(f, d, out->iov);
    d->sent = d->len;
    return 1;
  }
  uint64_t len = d->len - d->sent;
  if (len > max) len = max;
  out->off = d->off + d->sent;
  out->src = op->src + (out->off - op->file_offset);
  out->len = (uint32_t)len;
  out->niov = 0;
  d->sent += len;
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

/* ------------------------------------------------------------------------ *
 * Reading shared sources through their segment's descriptor: the pieces
 * of one source run (consecutive bytes of one segment, e.g. the rows of an
 * inner-dimension slice) go into one preadv, scattered to their places in
 * the chunk. A few runs stay open at once, for interleaved sources.
 * ------------------------------------------------------------------------ */
#define IOVS 256

typedef struct {
  int fd;
  uint64_t start, next;    /* segment offsets: first byte, one past the last */
  struct iovec iov[IOVS];
  int n;
} pread_run;

/* What the copy has done so far: in memory, not in registers, so it is
 * still true after a fault jumps back into sd_fill_copy. */
typedef struct {
  size_t i;                /* the write being copied */
  uint64_t pos;            /* bytes of the stretch before pos are in place */
  uint64_t copied;         /* bytes read from sources */
  uint64_t sealed;         /* of them: from sealed spans */
  run runs[RUNS];          /* mapping pages to drop */
  unsigned nruns;
  pread_run pr[RUNS];
  unsigned npr;
  const sd_shm_span *span; /* the last span a source was found in */
  int err;                 /* a read failed: ENODATA for a short one */
  uint64_t err_off;        /* the file offset it was reading for */
} copy_state;

const sd_shm_span *sd_span_find(const sd_shm_span *spans, size_t n, const uint8_t *src) {
  size_t lo = 0, hi = n; /* the last span whose base <= src */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (spans[mid].base <= src) lo = mid + 1;
    else hi = mid;
  }
  if (lo == 0) return NULL;
  const sd_shm_span *sp = &spans[lo - 1];
  return (uint64_t)(src - sp->base) < sp->len ? sp : NULL;
}

static const sd_shm_span *span_of(const sd_fill *f, copy_state *st, const uint8_t *src, uint64_t len) {
  const sd_shm_span *sp = st->span;
  if (!sp || src < sp->base || (uint64_t)(src - sp->base) >= sp->len) {
    if (!(sp = sd_span_find(f->spans, f->nspans, src))) return NULL;
    st->span = sp;
  }
  return len <= sp->len - (uint64_t)(src - sp->base) ? sp : NULL;
}

static void pread_flush(const sd_chunk *c, copy_state *st, pread_run *r) {
  struct iovec *v = r->iov;
  int n = r->n;
  uint64_t off = r->start;
  while (n > 0 && !st->err) {
    ssize_t got = preadv(r->fd, v, n > IOV_MAX ? IOV_MAX : n, (off_t)off);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      st->err = got < 0 ? errno : ENODATA;
      st->err_off = c->off + (uint64_t)((uint8_t *)v->iov_base - c->buf);
      break;
    }
    off += (uint64_t)got;
    while (n > 0 && (size_t)got >= v->iov_len) {
      got -= (ssize_t)v->iov_len;
      v++;
      n--;
    }
    if (n > 0) {
      v->iov_base = (uint8_t *)v->iov_base + got;
      v->iov_len -= (size_t)got;
    }
  }
  r->n = 0;
}

static void pread_add(const sd_chunk *c, copy_state *st, int fd, uint64_t foff, uint8_t *dst, uint64_t len) {
  pread_run *r = NULL;
  for (unsigned k = 0; k < st->npr && !r; k++)
    if (st->pr[k].fd == fd && st->pr[k].next == foff) r = &st->pr[k];
  if (r) {
    struct iovec *last = r->n > 0 ? &r->iov[r->n - 1] : NULL;
    if (last && (uint8_t *)last->iov_base + last->iov_len == dst)
      last->iov_len += len;
    else
      r->iov[r->n++] = (struct iovec){dst, len};
    r->next += len;
  } else {
    if (st->npr == RUNS) {
      pread_flush(c, st, &st->pr[0]);
      memmove(st->pr, st->pr + 1, (RUNS - 1) * sizeof *st->pr);
      st->npr--;
    }
    r = &st->pr[st->npr++];
    r->fd = fd;
    r->start = foff;
    r->next = foff + len;
    r->iov[0] = (struct iovec){dst, len};
    r->n = 1;
  }
  if (r->n == IOVS) {
    pread_flush(c, st, r);
    r->start = r->next; /* the run carries on in a fresh batch */
  }
}

/* Copies the stretch's writes from st->i on. Unguarded, it stops (returning
 * 1, the write not begun) at a shared source outside every span: the caller
 * arms the SIGBUS guard and calls again to go on. */
__attribute__((noinline)) static int copy_ops(const sd_fill *f, sd_chunk *c, copy_state *st, int guarded) {
  const uint64_t a = c->off, b = c->off + c->len;
  uint8_t *const dst = c->buf;
  for (; st->i < f->nops && !st->err; st->i++) {
    const sd_write_op *op = &f->ops[st->i];
    if (op->file != c->file || op->file_offset >= b) break;
    if (op->len == 0) continue;
    uint64_t lo = op->file_offset > a ? op->file_offset : a;
    uint64_t hi = op->file_offset + op->len < b ? op->file_offset + op->len : b;
    if (lo > st->pos) memset(dst + (st->pos - a), 0, lo - st->pos);
    const uint8_t *src = op->src + (lo - op->file_offset);
    const sd_shm_span *sp = (op->flags & SD_WOP_SHARED) ? span_of(f, st, src, hi - lo) : NULL;
    if ((op->flags & SD_WOP_SHARED) && !sp && !guarded) return 1;
    if (sp && sp->sealed) {
      /* Size cannot drop (sd_region_adopt saw F_SEAL_SHRINK; seals are never removed): no check, no guard.
       * Still read through the descriptor: a fresh mapping's first touch cost more CPU than preadv's
       * in-kernel copy when measured here (0.6-0.7 vs 0.4-0.6 s/GiB). */
      pread_add(c, st, sp->fd, (uint64_t)(src - sp->base), dst + (lo - a), hi - lo);
      st->sealed += hi - lo;
    } else if (sp) {
      pread_add(c, st, sp->fd, (uint64_t)(src - sp->base), dst + (lo - a), hi - lo);
    } else {
      memcpy(dst + (lo - a), src, hi - lo);
      if (op->flags & SD_WOP_SHARED) runs_add(st->runs, &st->nruns, src, hi - lo);
    }
    st->copied += hi - lo;
    st->pos = hi;
  }
  for (unsigned k = 0; k < st->npr; k++) pread_flush(c, st, &st->pr[k]);
  return 0;
}

void sd_fill_copy(const sd_fill *f, sd_chunk *c) {
  const sd_fill_file *ff = &f->files[c->file];
  copy_state *st = &(copy_state){.i = c->cursor, .pos = c->off};
  c->src_bytes = 0;
  c->src_sealed = 0;
  c->fault = 0;
  if (ff->head_len > c->off) {
    uint64_t e = ff->head_len < c->off + c->len ? ff->head_len : c->off + c->len;
    memcpy(c->buf, ff->head + c->off, e - c->off);
    st->pos = e;
  }
  if (copy_ops(f, c, st, 0)) {
    sigjmp_buf jb;
    if (sigsetjmp(jb, 1)) {
      const sd_write_op *op = &f->ops[((volatile copy_state *)st)->i];
      c->fault = EFAULT;
      c->fault_off = op->file_offset > c->off ? op->file_offset : c->off;
      return;
    }
    sd_bus_guard = &jb;
    copy_ops(f, c, st, 1);
    sd_bus_guard = NULL;
  }
  if (st->err) {
    c->fault = st->err;
    c->fault_off = st->err_off;
    return;
  }
  c->src_bytes = st->copied;
  c->src_sealed = st->sealed;
  /* Bytes no write covers read back as zeros, and so does the padding of
   * a file's last block. */
  uint64_t end = c->off + sd_align_up(c->len);
  if (end > c->off + c->cap) end = c->off + c->cap;
  if (st->pos < end) memset(c->buf + (st->pos - c->off), 0, end - st->pos);
  for (unsigned k = 0; k < st->nruns; k++)
    sd_shared_drop(st->runs[k].a, (uint64_t)(st->runs[k].b - st->runs[k].a));
}

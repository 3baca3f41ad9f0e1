/* A node's part of a multi-node save, its own blocks: the regions made only of its bytes, written through a file set (fileset.c) as a single-node save's files are, zero-copy and O_DIRECT where they can. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_int.h"
#include "fileset.h"
#include "log.h"
#include "region.h"
#include "sd_checksum.h"
#include "sd_grow.h"

/* ------------------------------------------------------------------------ *
 * Regions made only of this node's bytes (its header and its own ranks'
 * slices, in blocks of SD_XFER_BLOCK): the single-node path (fileset.c,
 * pubfill.c), staged by the copy workers and written with O_DIRECT, in the
 * writer's counters. A whole file of them (a pipeline layout, any file that
 * takes nothing from other nodes) is one region. Blocks that also take
 * other nodes' bytes (forwarded here, or written in place by them in shared
 * mode) go through the ring as the pieces arrive, buffered: they share
 * pages with bytes that come later or from elsewhere. Regions are whole
 * aligned blocks, so the two never share a page.
 * ------------------------------------------------------------------------ */
typedef struct sd_xstaged {
  sd_csave *cs;
  size_t n, cap;           /* regions */
  uint32_t *lf;            /* region -> files[] */
  uint64_t *bases;         /* region -> its offset in the file */
  const char **names;      /* region -> its file's name: the set opens a descriptor of its own for each (O_DIRECT) */
  sd_fill_file *files;
  sd_write_op *ops;
  size_t nops, opcap;
  sd_shm_span *spans;
  uint32_t *sums;          /* per region (cs->sums set): its checksum share against the region's end (fileset.c) */
  size_t nspans;
  uint64_t data;           /* slice bytes in the regions */
} sd_xstaged;

static void xs_free(sd_xstaged *xs) {
  if (!xs) return;
  free(xs->lf);
  free(xs->bases);
  free(xs->names);
  free(xs->files);
  free(xs->ops);
  free(xs->spans);
  free(xs->sums);
  free(xs);
}

static int op_cmp(const void *a, const void *b) {
  const sd_write_op *x = a, *y = b;
  if (x->file != y->file) return x->file < y->file ? -1 : 1;
  return x->file_offset < y->file_offset ? -1 : x->file_offset > y->file_offset;
}

static int span_cmp(const void *a, const void *b) {
  const sd_shm_span *x = a, *y = b;
  return x->base < y->base ? -1 : x->base > y->base;
}

static void on_staged(void *ud, const sd_error *err) {
  sd_xstaged *xs = ud;
  sd_csave *cs = xs->cs;
  cs->io--;
  cs->staged = NULL;
  if (cs->failing) {
    xs_free(xs);
    if (cs->io == 0) sd_node_finish_failed(cs);
    return;
  }
  if (err) {
    xs_free(xs);
    sd_log_debug("save '%s': node %u: its own files: %s", cs->save->id, cs->node_rank, err->msg);
    if (err->code == SHARDD_E_IO && sd_xfer_fail_if_shrunk(cs)) return;
    sd_node_fail_io(cs, err->code, "node %u ('%s'): %s", cs->node_rank, cs->cl->node, err->msg);
    return;
  }
  /* cs->bytes_written and bytes_zero_copy grew as the job wrote */
  for (size_t k = 0; k < xs->n; k++) {
    sd_cfile *f = &cs->files[xs->lf[k]];
    sd_xfer_wrote(cs, xs->lf[k], xs->files[k].size);
    /* a region's share counts against its own end: moved to the file's */
    if (xs->sums) cs->sums[xs->lf[k]] ^= sd_crc32c_shift(xs->sums[k], f->size - (xs->bases[k] + xs->files[k].size));
  }
  cs->bytes_local += xs->data;
  cs->cl->bytes_local += xs->data;
  xs_free(xs);
  sd_xfer_progress(cs);
}

static int blk_len(const sd_cfile *f, uint64_t b) {
  uint64_t end = (b + 1) * (uint64_t)SD_XFER_BLOCK;
  return (int)((end < f->size ? end : f->size) - b * SD_XFER_BLOCK);
}

/* Adds [off, off + len) of file f to its blocks' counts of own bytes. */
static void cover(uint32_t *cov, uint64_t off, uint64_t len) {
  while (len > 0) {
    uint64_t b = off / SD_XFER_BLOCK, room = (b + 1) * SD_XFER_BLOCK - off, k = len < room ? len : room;
    cov[b] += (uint32_t)k;
    off += k;
    len -= k;
  }
}

/* The region holding offset off of files[lf] (off in an own block). */
static size_t region_of(const sd_xstaged *xs, uint32_t lf, uint64_t off) {
  size_t lo = 0, hi = xs->n; /* regions are sorted by file, then base */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (xs->lf[mid] < lf || (xs->lf[mid] == lf && xs->bases[mid] <= off)) lo = mid + 1;
    else hi = mid;
  }
  return lo - 1;
}

static int add_region(sd_xstaged *xs, uint32_t lf, const char *name, uint64_t base, uint64_t size,
                      const uint8_t *head, uint64_t head_len) {
  /* four arrays of one length: each grows from the same capacity to the same one */
  size_t a = xs->cap, b = a, d = a, e = a, need = xs->n + 1;
  if (SD_GROW(xs->lf, a, need, 16) || SD_GROW(xs->bases, b, need, 16) || SD_GROW(xs->names, d, need, 16) ||
      SD_GROW(xs->files, e, need, 16))
    return -1;
  xs->cap = a;
  xs->lf[xs->n] = lf;
  xs->bases[xs->n] = base;
  xs->names[xs->n] = name;
  xs->files[xs->n] = (sd_fill_file){head, head_len, size};
  xs->n++;
  return 0;
}

static int add_op(sd_xstaged *xs, uint32_t region, uint64_t off, const uint8_t *src, uint64_t len) {
  if (SD_GROW(xs->ops, xs->opcap, xs->nops + 1, 1024)) return -1;
  uint32_t flags = sd_span_find(xs->spans, xs->nspans, src) ? SD_WOP_SHARED : 0;
  xs->ops[xs->nops++] = (sd_write_op){region, off, src, len, flags, 0};
  xs->data += len;
  return 0;
}

/* Finds each file's own blocks (f->own) and makes them regions. */
static int find_regions(sd_csave *cs, sd_xstaged *xs) {
  uint64_t hoff = 0;
  for (size_t i = 0; i < cs->nfiles; i++) {
    sd_cfile *f = &cs->files[i];
    uint64_t nb = (f->size + SD_XFER_BLOCK - 1) / SD_XFER_BLOCK;
    const uint8_t *head = cs->hdrs + hoff;
    hoff += f->hdr_len;
    if (nb == 0) continue;
    uint32_t *cov = calloc(nb, sizeof *cov);
    f->own = calloc(nb, 1);
    if (!cov || !f->own) {
      free(cov);
      return -1;
    }
    cover(cov, 0, f->hdr_len);
    for (size_t k = 0; k < cs->nops; k++)
      if (cs->ops[k].lf == i) cover(cov, cs->ops[k].off, cs->ops[k].len);
    uint64_t nown = 0;
    for (uint64_t b = 0; b < nb; b++) nown += f->own[b] = cov[b] == (uint32_t)blk_len(f, b);
    free(cov);
    if (!nown) {
      free(f->own);
      f->own = NULL;
      continue;
    }
    for (uint64_t b = 0; b < nb;) {
      if (!f->own[b]) {
        b++;
        continue;
      }
      uint64_t e = b;
      while (e < nb && f->own[e]) e++;
      uint64_t base = b * SD_XFER_BLOCK, end = e * SD_XFER_BLOCK < f->size ? e * SD_XFER_BLOCK : f->size;
      uint64_t hl = f->hdr_len > base ? f->hdr_len - base : 0;
      if (add_region(xs, (uint32_t)i, f->name, base, end - base, head + (hl ? base : 0), hl < end - base ? hl : end - base))
        return -1;
      b = e;
    }
  }
  return 0;
}

/* Moves the parts of the local writes that fall in own blocks into xs;
 * the rest stay in cs->ops, cut at block edges. */
static int split_ops(sd_csave *cs, sd_xstaged *xs) {
  sd_lop *keep = NULL;
  size_t nkeep = 0, cap = 0;
  for (size_t i = 0; i < cs->nops; i++) {
    const sd_lop o = cs->ops[i];
    const sd_cfile *f = &cs->files[o.lf];
    for (uint64_t at = 0; at < o.len;) {
      uint64_t off = o.off + at, b = off / SD_XFER_BLOCK, end = off;
      int own = f->own && f->own[b];
      /* a run of blocks of the same kind */
      while (end < o.off + o.len && (f->own && f->own[end / SD_XFER_BLOCK]) == own)
        end = (end / SD_XFER_BLOCK + 1) * SD_XFER_BLOCK;
      if (end > o.off + o.len) end = o.off + o.len;
      if (own) {
        size_t r = region_of(xs, o.lf, off);
        if (add_op(xs, (uint32_t)r, off - xs->bases[r], o.src + at, end - off)) goto oom;
      } else {
        if (SD_GROW(keep, cap, nkeep + 1, 1024)) goto oom;
        keep[nkeep++] = (sd_lop){o.lf, off, o.src + at, end - off, 0};
      }
      at = end - o.off;
    }
  }
  free(cs->ops);
  cs->ops = keep;
  cs->nops = nkeep;
  if (xs->nops) qsort(xs->ops, xs->nops, sizeof *xs->ops, op_cmp);
  return 0;
oom:
  free(keep);
  return -1;
}

static int collect_spans(sd_csave *cs, sd_xstaged *xs) {
  size_t cap = 0;
  for (size_t i = 0; i < cs->nslices; i++) {
    const sd_region *r = cs->slices[i].sl->region;
    if (!r) continue;
    if (SD_GROW(xs->spans, cap, xs->nspans + 1, 64)) return -1;
    xs->spans[xs->nspans++] = (sd_shm_span){r->base, r->size, r->fd, r->sealed, r->pin, cs->slices[i].sl->rank};
  }
  if (xs->nspans) qsort(xs->spans, xs->nspans, sizeof *xs->spans, span_cmp);
  size_t u = 0; /* one span per segment */
  for (size_t i = 0; i < xs->nspans; i++)
    if (u == 0 || xs->spans[i].base != xs->spans[u - 1].base) xs->spans[u++] = xs->spans[i];
  xs->nspans = u;
  return 0;
}

int sd_xfer_begin(sd_csave *cs, sd_error *err) {
  sd_xstaged *xs = calloc(1, sizeof *xs);
  int rc = 0;
  if (!xs) {
    rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory");
    goto out;
  }
  if (find_regions(cs, xs) != 0 || collect_spans(cs, xs) != 0 || split_ops(cs, xs) != 0 ||
      (cs->sums && xs->n && !(xs->sums = calloc(xs->n, sizeof *xs->sums)))) {
    rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory");
    goto out;
  }
  /* the headers first, as before the file set's own writes */
  uint32_t bad = 0;
  if ((rc = sd_xfer_queue_headers(cs, &bad)) != 0) {
    rc = sd_fail(err, sd_err_from_errno(-rc), "cannot write %s/%s: %s", cs->save->dir, cs->files[bad].name,
                 strerror(-rc));
    goto out;
  }
  if (xs->n) {
    sd_writer *w = cs->cl->d->writer;
    if (!w) {
      rc = sd_fail(err, SHARDD_E_SHUTTING_DOWN, "the daemon is shutting down");
      goto out;
    }
    xs->cs = cs;
    /* by name: each region's descriptor opened when written, under max_open_files; its own, so
     * O_DIRECT on it leaves the ring's buffered writes to the same file alone */
    sd_fileset_req r = {.by_name = 1, .dir_fd = cs->tmp_fd, .names = xs->names, .files = xs->files, .bases = xs->bases,
                        .nfiles = xs->n, .ops = xs->ops, .nops = xs->nops, .spans = xs->spans,
                        .nspans = xs->nspans, .dir = cs->save->dir, .point = "filejob", .stop = &cs->failing,
                        .bytes_written = &cs->bytes_written, .bytes_zero_copy = &cs->bytes_zero_copy, .tag = cs->save->id,
                        .sums = xs->sums, .cb = on_staged, .ud = xs};
    cs->io++;
    cs->staged = xs;
    if ((rc = sd_fileset_start(w, &r, err)) != 0) {
      cs->io--;
      cs->staged = NULL;
      goto out;
    }
    xs = NULL;
  }
out:
  xs_free(xs);
  return rc;
}

/* Turns a save every rank has declared into a write plan: coverage per tensor, shard plan, byte runs, index, artifacts. */
#include <stdlib.h>
#include <string.h>

#include "planner.h"
#include "sd_artifact.h"
#include "sd_grow.h"

static void box_of(const sd_save_tensor *t, const sd_slice *sl, sd_box *b) {
  memset(b, 0, sizeof *b);
  memcpy(b->start, sl->dims, t->ndim * sizeof(uint64_t));
  memcpy(b->count, sl->dims + t->ndim, t->ndim * sizeof(uint64_t));
}

/* Replicas are written once: keep[] marks the copy each group keeps. The
 * boxes buffer is reused across tensors so memory stays at one tensor's worth. */
static int check_coverage(const sd_save *save, uint8_t *keep, sd_error *err) {
  sd_box *boxes = NULL;
  size_t cap = 0, k = 0;
  int rc = 0;
  for (size_t i = 0; i < save->ntensors && rc == 0; i++) {
    const sd_save_tensor *t = save->tensors[i];
    if (t->nslices > cap) {
      free(boxes);
      cap = t->nslices;
      boxes = malloc(cap * sizeof *boxes);
      if (!boxes) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory checking tensor '%s'", t->name);
    }
    for (size_t j = 0; j < t->nslices; j++) box_of(t, t->slices[j], &boxes[j]);
    rc = sd_coverage_check(t->name, t->ndim, t->shape, boxes, t->nslices, keep + k, err);
    k += t->nslices;
  }
  free(boxes);
  return rc;
}

typedef struct {
  sd_planned *p;
  size_t cap;
  uint32_t file;
  const uint8_t *src;
  int shared;               /* src lies in a client's shm mapping */
  uint32_t slice;
} run_ctx;

static int add_run(void *ud, uint64_t dst, uint64_t src, uint64_t len) {
  run_ctx *c = ud;
  sd_planned *p = c->p;
  if (len == 0) return 0;
  if (SD_GROW(p->ops, c->cap, p->nops + 1, 1024)) return SHARDD_E_NO_MEMORY;
  p->ops[p->nops++] = (sd_write_op){.file = c->file, .file_offset = dst, .src = c->src + src, .len = len,
                                    .flags = c->shared ? SD_WOP_SHARED : 0, .slice = c->slice};
  return 0;
}

static int op_cmp(const void *a, const void *b) {
  const sd_write_op *x = a, *y = b;
  if (x->file != y->file) return x->file < y->file ? -1 : 1;
  if (x->file_offset != y->file_offset) return x->file_offset < y->file_offset ? -1 : 1;
  return 0;
}

/* The writer reads shared memory through the region's descriptor. */
static int add_span(sd_planned *p, const sd_region *r, uint32_t rank, size_t *cap) {
  if (p->nspans && p->spans[p->nspans - 1].base == r->base) return 0;
  for (size_t i = 0; i < p->nspans; i++)
    if (p->spans[i].base == r->base) return 0;
  if (SD_GROW(p->spans, *cap, p->nspans + 1, 8)) return SHARDD_E_NO_MEMORY;
  p->spans[p->nspans++] = (sd_shm_span){r->base, r->size, r->fd, r->sealed, r->pin, rank};
  return 0;
}

/* Streaming: each slice's ops, by a counting sort of their labels, and
 * the ready flags of the ops whose bytes are already in place. */
static int index_ops(const sd_save *save, sd_planned *p, size_t nslices) {
  p->nslices = nslices;
  p->op_ready = malloc(p->nops ? p->nops : 1);
  p->slice_first = calloc(nslices + 1, sizeof *p->slice_first);
  p->slice_ops = malloc((p->nops ? p->nops : 1) * sizeof *p->slice_ops);
  if (!p->op_ready || !p->slice_first || !p->slice_ops) return SHARDD_E_NO_MEMORY;
  for (size_t i = 0; i < p->nops; i++) p->slice_first[p->ops[i].slice + 1]++;
  for (size_t s = 0; s < nslices; s++) p->slice_first[s + 1] += p->slice_first[s];
  size_t *fill = malloc((nslices ? nslices : 1) * sizeof *fill);
  if (!fill) return SHARDD_E_NO_MEMORY;
  memcpy(fill, p->slice_first, nslices * sizeof *fill);
  for (size_t i = 0; i < p->nops; i++) p->slice_ops[fill[p->ops[i].slice]++] = i;
  free(fill);
  for (size_t i = 0; i < save->ntensors; i++) {
    const sd_save_tensor *t = save->tensors[i];
    for (size_t j = 0; j < t->nslices; j++) {
      const sd_slice *sl = t->slices[j];
      for (size_t k = p->slice_first[sl->id]; k < p->slice_first[sl->id + 1]; k++)
        p->op_ready[p->slice_ops[k]] = !sl->deferred;
    }
  }
  return 0;
}

size_t sd_planned_slice_ready(sd_planned *p, const sd_slice *sl) {
  if (!p->op_ready || sl->id >= p->nslices) return 0;
  size_t n = 0;
  for (size_t k = p->slice_first[sl->id]; k < p->slice_first[sl->id + 1]; k++, n++)
    p->op_ready[p->slice_ops[k]] = 1;
  return n;
}

static int build_ops(const sd_save *save, sd_planned *p, const uint8_t *keep, sd_error *err) {
  run_ctx c = {.p = p};
  size_t k = 0, span_cap = 0;
  int deferred = 0;
  for (size_t i = 0; i < save->ntensors; i++) {
    const sd_save_tensor *t = save->tensors[i];
    const sd_plan_loc *loc = &p->plan.loc[i];
    unsigned esize = sd_dtype_size(t->dtype);
    for (size_t j = 0; j < t->nslices; j++, k++) {
      sd_slice *sl = t->slices[j];
      sl->id = (uint32_t)k;
      deferred |= sl->deferred;
      if (!keep[k]) continue;
      sd_box b;
      box_of(t, sl, &b);
      c.slice = (uint32_t)k;
      c.file = loc->file;
      c.src = sl->region ? sl->region->base + sl->offset : sl->data;
      c.shared = sl->region != NULL;
      int rc = sl->region ? add_span(p, sl->region, sl->rank, &span_cap) : 0;
      if (!rc) rc = sd_box_runs(t->ndim, t->shape, esize, &b, loc->file_offset, add_run, &c);
      if (rc) return sd_fail(err, rc, "out of memory planning the writes of tensor '%s'", t->name);
    }
  }
  /* File order, then offset order: the writer sees sequential runs it can merge. */
  if (p->nops > 1) qsort(p->ops, p->nops, sizeof *p->ops, op_cmp);
  if (deferred && index_ops(save, p, k) != 0)
    return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory planning the writes of save '%s'", save->id);
  return 0;
}

/* Each file once (the parts of one joined in rank order); none may replace a shard or the index. */
static int check_artifacts(const sd_save *save, sd_planned *p, sd_error *err) {
  if (save->nfiles == 0) return 0;
  sd_file_piece *in = calloc(save->nfiles, sizeof *in);
  sd_file_out *out = calloc(save->nfiles, sizeof *out);
  p->artifacts = calloc(save->nfiles, sizeof *p->artifacts);
  p->joined = calloc(save->nfiles, sizeof *p->joined);
  int rc = !in || !out || !p->artifacts || !p->joined ? sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory planning files")
                                                       : 0;
  size_t n = 0;
  for (size_t i = 0; !rc && i < save->nfiles; i++) {
    const sd_save_artifact *f = &save->files[i];
    in[i] = (sd_file_piece){.name = f->name, .data = f->data, .len = f->len, .rank = f->rank, .part = f->part};
  }
  if (!rc) rc = sd_files_join(in, save->nfiles, &p->plan, out, &n, err);
  for (size_t i = 0; !rc && i < n; i++) {
    if (out[i].owned) p->joined[p->njoined++] = out[i].owned;
    p->artifacts[p->nartifacts++] = (sd_artifact){.name = out[i].name, .data = out[i].data, .len = out[i].len};
  }
  free(in);
  free(out);
  return rc;
}

int sd_planner_build(const sd_save *save, sd_planned *p, sd_error *err) {
  memset(p, 0, sizeof *p);
  size_t nslices = 0;
  for (size_t i = 0; i < save->ntensors; i++) nslices += save->tensors[i]->nslices;
  uint8_t *keep = malloc(nslices ? nslices : 1);
  p->tensors = calloc(save->ntensors ? save->ntensors : 1, sizeof *p->tensors);
  if (!keep || !p->tensors) {
    free(keep);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory planning save '%s'", save->id);
  }
  p->ntensors = save->ntensors;
  for (size_t i = 0; i < save->ntensors; i++) {
    const sd_save_tensor *t = save->tensors[i];
    sd_tensor *o = &p->tensors[i];
    o->name = t->name;
    o->dtype = t->dtype;
    o->ndim = t->ndim;
    memcpy(o->shape, t->shape, sizeof o->shape);
    o->index = t->index;
    o->prefix = t->prefix;
  }
  int rc = check_coverage(save, keep, err);
  if (rc) goto out;
  sd_plan_opts opts = {
      .max_shard_size = save->max_shard_size,
      .prefix = save->prefix,
      .metadata = save->metadata,
      .nmetadata = save->nmetadata,
      .checksums = save->d && save->d->cfg ? save->d->cfg->checksums : 1,
      .total_parameters = save->total_parameters >= 0 ? (uint64_t)save->total_parameters : 0,
      .has_total_parameters = save->total_parameters >= 0,
      .names_unique = 1, /* a save holds each name once (its name table) */
  };
  rc = sd_plan_build(&p->plan, p->tensors, p->ntensors, &opts, err);
  if (rc) goto out;
  p->have_plan = 1;
  /* The format caps a header at SD_HEADER_MAX; the daemon may be set lower. */
  uint64_t max_header = save->d && save->d->cfg ? save->d->cfg->max_header : SD_HEADER_MAX;
  for (size_t i = 0; i < p->plan.nfiles; i++) {
    if (p->plan.files[i].header_size - 8 <= max_header) continue;
    rc = sd_fail(err, SHARDD_E_LIMIT, "%s: header of %llu bytes is over max_header=%llu", p->plan.files[i].name,
                 (unsigned long long)(p->plan.files[i].header_size - 8), (unsigned long long)max_header);
    goto out;
  }
  rc = build_ops(save, p, keep, err);
  if (rc) goto out;
  if (p->plan.needs_index) {
    p->index_json = sd_index_encode(&p->plan, p->tensors, &p->index_len, err);
    if (!p->index_json) {
      rc = err && err->code ? err->code : SHARDD_E_INTERNAL;
      goto out;
    }
  }
  rc = check_artifacts(save, p, err);
  if (rc) goto out;
  p->data_bytes = p->plan.total_size;
  p->total_bytes = p->index_len;
  for (size_t i = 0; i < p->plan.nfiles; i++) p->total_bytes += p->plan.files[i].file_size;
  for (size_t i = 0; i < p->nartifacts; i++) p->total_bytes += p->artifacts[i].len;
  p->nfiles = p->plan.nfiles + (p->plan.needs_index ? 1 : 0) + p->nartifacts;
out:
  free(keep);
  return rc;
}

void sd_planned_free(sd_planned *p) {
  if (!p) return;
  if (p->have_plan) sd_plan_free(&p->plan);
  free(p->tensors);
  free(p->ops);
  free(p->spans);
  free(p->index_json);
  free(p->artifacts);
  for (size_t i = 0; i < p->njoined; i++) free(p->joined[i]);
  free(p->joined);
  free(p->op_ready);
  free(p->slice_first);
  free(p->slice_ops);
  memset(p, 0, sizeof *p);
}

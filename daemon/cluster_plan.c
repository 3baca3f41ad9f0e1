/* The leader's planning for a multi-node save: merged manifests, coverage, shard plan, file owners, who writes what. Pure. */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_plan.h"
#include "sd_checksum.h"
#include "sd_grow.h"
#include "sd_layout.h"

/* ------------------------------------------------------------------------ *
 * Manifest: tensors hashed by name, order of first description kept
 * ------------------------------------------------------------------------ */
SD_NAMED_TABLE(tensor, sd_cmanifest, sd_ctensor, tensors, ntensors, tcap, names, 64)

int sd_cmanifest_tensor(sd_cmanifest *m, const char *name, sd_dtype dtype, uint32_t ndim, const uint64_t *shape,
                        int64_t index, uint32_t node, uint32_t rank, uint32_t *ti, sd_error *err) {
  if (ndim > SD_MAX_DIMS)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "tensor '%s' has more than %d dimensions", name, SD_MAX_DIMS);
  uint64_t numel = 0;
  int rc = sd_tensor_numel(name, ndim, shape, &numel, err);
  if (rc) return rc;
  uint32_t at = sd_nameidx_find(&m->names, name, tensor_name, m);
  if (at != SD_NAMEIDX_NONE) {
    sd_ctensor *t = m->tensors[at];
    if (t->dtype != dtype || t->ndim != ndim || memcmp(t->shape, shape, ndim * sizeof(uint64_t)) != 0) {
      char was[256], now[256];
      return sd_fail(err, SHARDD_E_MISMATCH,
                     "tensor '%s': rank %u (node %u) declares %s %s, rank %u (node %u) declared %s %s", name, rank,
                     node, sd_dtype_name(dtype), sd_fmt_dims(now, sizeof now, ndim, shape), t->first_rank,
                     t->first_node, sd_dtype_name(t->dtype), sd_fmt_dims(was, sizeof was, t->ndim, t->shape));
    }
    if (index >= 0 && t->index >= 0 && index != t->index)
      return sd_fail(err, SHARDD_E_MISMATCH, "tensor '%s': rank %u (node %u) gives index %lld, another gave %lld",
                     name, rank, node, (long long)index, (long long)t->index);
    if (index >= 0) t->index = index;
    *ti = at;
    return 0;
  }
  sd_ctensor *t = calloc(1, sizeof *t);
  if (t) t->name = strdup(name);
  if (!t || !t->name || tensor_add(m, t) != 0) {
    if (t) free(t->name);
    free(t);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory recording tensor '%s'", name);
  }
  t->dtype = dtype;
  t->ndim = ndim;
  memcpy(t->shape, shape, ndim * sizeof(uint64_t));
  t->index = index >= 0 ? index : -1;
  t->first_rank = rank;
  t->first_node = node;
  *ti = (uint32_t)(m->ntensors - 1);
  return 0;
}

#define SLICE_BLOCK (1u << 20)

/* n bytes (8-aligned) from the manifest's blocks. */
static void *carve(sd_cmanifest *m, size_t n) {
  n = (n + 7) & ~(size_t)7;
  if (n > SLICE_BLOCK) return NULL;
  if (!m->nblocks || m->bused + n > SLICE_BLOCK) {
    if (SD_GROW(m->blocks, m->bcap, m->nblocks + 1, 16)) return NULL;
    uint8_t *b = malloc(SLICE_BLOCK);
    if (!b) return NULL;
    m->blocks[m->nblocks++] = b;
    m->bused = 0;
  }
  void *p = m->blocks[m->nblocks - 1] + m->bused;
  m->bused += n;
  return p;
}

int sd_cmanifest_box(sd_cmanifest *m, uint32_t ti, uint32_t node, uint32_t rank, uint64_t id, const uint64_t *start,
                     const uint64_t *count, const uint64_t *parts, uint32_t nparts, sd_error *err) {
  sd_ctensor *t = m->tensors[ti];
  uint32_t ndim = t->ndim;
  uint64_t psum = 0;
  for (uint32_t p = 0; p < nparts; p++) psum += parts[p] < count[0] ? parts[p] : count[0] + 1;
  /* One count c: an even split of count[0] into 2 to SD_CPARTS_MAX parts. */
  uint64_t even = nparts == 1 && ndim && parts[0] ? count[0] / parts[0] + (count[0] % parts[0] != 0) : 0;
  if (nparts > SD_CPARTS_MAX || (nparts && ndim == 0) ||
      (nparts == 1 ? even < 2 || even > SD_CPARTS_MAX : nparts && psum != count[0]))
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': node %u's box is cut into parts that are not it",
                   t->name, node);
  sd_box box;
  memset(&box, 0, sizeof box);
  memcpy(box.start, start, ndim * sizeof(uint64_t));
  memcpy(box.count, count, ndim * sizeof(uint64_t));
  int rc = sd_box_check(t->name, ndim, t->shape, &box, err);
  if (rc) return rc;
  uint64_t numel = 0;
  rc = sd_tensor_numel(t->name, ndim, count, &numel, err);
  if (rc) return rc;
  unsigned esize = sd_dtype_size(t->dtype);
  if (numel > UINT64_MAX / esize)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': the slice's byte size overflows", t->name);
  sd_cslice *sl = carve(m, sizeof *sl + (2 * ndim + nparts) * sizeof(uint64_t));
  if (!sl || SD_GROW(t->slices, t->cap, t->nslices + 1, 2))
    return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory recording tensor '%s'", t->name);
  sl->node = node;
  sl->rank = rank;
  sl->id = id;
  sl->len = numel * esize;
  sl->nparts = nparts;
  sl->part = 0;
  memcpy(sl->dims, start, ndim * sizeof(uint64_t));
  memcpy(sl->dims + ndim, count, ndim * sizeof(uint64_t));
  if (nparts) memcpy(sl->dims + 2 * ndim, parts, nparts * sizeof(uint64_t));
  t->slices[t->nslices++] = sl;
  m->nslices++;
  m->bytes += sl->len;
  return 0;
}

/* t's merged boxes replaced by their parts, each a box of its own naming its part: what the nodes
 * put, for a check that told a partial overlap of merged boxes (a part may be another node's
 * replica). 0, or -1 out of memory. */
/* The parts of s: how many, and each one's count along dim 0 into c (SD_CPARTS_MAX of room). */
static uint32_t parts_of(const sd_cslice *s, uint32_t nd, uint64_t *c) {
  const uint64_t *v = s->dims + 2 * nd;
  if (s->nparts != 1) {
    memcpy(c, v, s->nparts * sizeof *c);
    return s->nparts;
  }
  uint64_t whole = s->dims[nd] / v[0] + (s->dims[nd] % v[0] != 0);
  for (uint64_t i = 0; i < whole; i++) c[i] = i + 1 < whole ? v[0] : s->dims[nd] - v[0] * (whole - 1);
  return (uint32_t)whole;
}

static int split_parts(sd_cmanifest *m, sd_ctensor *t) {
  size_t n = 0;
  uint64_t cnt[SD_CPARTS_MAX];
  for (size_t j = 0; j < t->nslices; j++) n += t->slices[j]->nparts ? parts_of(t->slices[j], t->ndim, cnt) : 1;
  sd_cslice **v = malloc(n * sizeof *v);
  if (!v) return -1;
  size_t k = 0;
  uint32_t nd = t->ndim;
  for (size_t j = 0; j < t->nslices; j++) {
    sd_cslice *s = t->slices[j];
    if (!s->nparts) {
      v[k++] = s;
      continue;
    }
    uint64_t at = s->dims[0], per = s->dims[nd] ? s->len / s->dims[nd] : 0; /* bytes per unit of dim 0 */
    uint32_t np = parts_of(s, nd, cnt);
    for (uint32_t p = 0; p < np; p++) {
      sd_cslice *c = carve(m, sizeof *c + 2 * nd * sizeof(uint64_t));
      if (!c) {
        free(v);
        return -1;
      }
      *c = *s;
      c->nparts = 0;
      c->part = p + 1;
      memcpy(c->dims, s->dims, 2 * nd * sizeof(uint64_t));
      c->dims[0] = at;
      c->dims[nd] = cnt[p];
      c->len = per * c->dims[nd];
      at += c->dims[nd];
      v[k++] = c;
    }
  }
  m->nslices += n - t->nslices;
  free(t->slices);
  t->slices = v;
  t->nslices = t->cap = n;
  return 0;
}

int sd_cmanifest_slice(sd_cmanifest *m, const char *name, sd_dtype dtype, uint32_t ndim,
                       const uint64_t *shape, int64_t index, uint32_t node, uint32_t rank, uint64_t id,
                       const uint64_t *start, const uint64_t *count, sd_error *err) {
  uint32_t ti;
  int rc = sd_cmanifest_tensor(m, name, dtype, ndim, shape, index, node, rank, &ti, err);
  return rc ? rc : sd_cmanifest_box(m, ti, node, rank, id, start, count, NULL, 0, err);
}

/* ------------------------------------------------------------------------ *
 * Tables, known by digest
 * ------------------------------------------------------------------------ */
sd_ctable_hash *sd_ctable_hash_new(void) {
  EVP_MD_CTX *c = EVP_MD_CTX_new();
  if (c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) != 1) {
    EVP_MD_CTX_free(c);
    c = NULL;
  }
  return (sd_ctable_hash *)c;
}

static void put_le(uint8_t *b, uint64_t v) {
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}

void sd_ctable_hash_add(sd_ctable_hash *h, const char *name, sd_dtype dtype, uint32_t ndim, const uint64_t *shape,
                        int64_t index, const char *prefix) {
  if (!h) return;
  uint8_t b[8 * (3 + SD_MAX_DIMS)];
  size_t n = 0;
  put_le(b + n, (uint64_t)dtype), n += 8;
  put_le(b + n, ndim), n += 8;
  for (uint32_t d = 0; d < ndim && d < SD_MAX_DIMS; d++) put_le(b + n, shape[d]), n += 8;
  put_le(b + n, (uint64_t)(index < 0 ? -1 : index)), n += 8;
  EVP_DigestUpdate((EVP_MD_CTX *)h, name, strlen(name) + 1);
  EVP_DigestUpdate((EVP_MD_CTX *)h, b, n);
  if (prefix) EVP_DigestUpdate((EVP_MD_CTX *)h, prefix, strlen(prefix) + 1);
}

int sd_ctable_hash_end(sd_ctable_hash *h, uint8_t out[SD_CTABLE_DIGEST]) {
  if (!h) return -1;
  unsigned len = 0;
  int ok = EVP_DigestFinal_ex((EVP_MD_CTX *)h, out, &len) == 1 && len == SD_CTABLE_DIGEST;
  EVP_MD_CTX_free((EVP_MD_CTX *)h);
  return ok ? 0 : -1;
}

void sd_ctable_hex(const uint8_t digest[SD_CTABLE_DIGEST], char *out) {
  static const char x[] = "0123456789abcdef";
  for (size_t i = 0; i < SD_CTABLE_DIGEST; i++) {
    out[2 * i] = x[digest[i] >> 4];
    out[2 * i + 1] = x[digest[i] & 15];
  }
  out[2 * SD_CTABLE_DIGEST] = 0;
}

int sd_ctable_unhex(const char *hex, uint8_t digest[SD_CTABLE_DIGEST]) {
  if (!hex || strlen(hex) != 2 * SD_CTABLE_DIGEST) return -1;
  for (size_t i = 0; i < 2 * SD_CTABLE_DIGEST; i++) {
    char c = hex[i];
    int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (v < 0) return -1;
    if (i & 1) digest[i / 2] |= (uint8_t)v;
    else digest[i / 2] = (uint8_t)(v << 4);
  }
  return 0;
}

int sd_cmanifest_file(sd_cmanifest *m, const char *name, const uint8_t *data, size_t len, uint32_t rank, int part,
                      sd_error *err) {
  for (size_t i = 0; i < m->nfiles; i++) {
    sd_cartifact *f = &m->files[i];
    if (strcmp(f->name, name) != 0 || (part && f->part && f->rank != rank)) continue;
    if (f->part == part && f->len == len && (len == 0 || memcmp(f->data, data, len) == 0)) return 0;
    if (f->part != part)
      return sd_fail(err, SHARDD_E_CONFLICT, "file '%s': rank %u sends %s, rank %u %s", name, rank,
                     part ? "its part of it" : "all of it", f->rank, f->part ? "its part" : "all of it");
    return sd_fail(err, SHARDD_E_CONFLICT, "file '%s': rank %u sends different contents than rank %u", name,
                   rank, f->rank);
  }
  if (SD_GROW(m->files, m->fcap, m->nfiles + 1, 4))
    return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory recording file '%s'", name);
  char *n = strdup(name);
  uint8_t *d = malloc(len ? len : 1);
  if (!n || !d) {
    free(n);
    free(d);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory recording file '%s'", name);
  }
  if (len) memcpy(d, data, len);
  m->files[m->nfiles++] = (sd_cartifact){.name = n, .data = d, .len = len, .rank = rank, .part = part};
  m->bytes += len;
  return 0;
}

int sd_cmanifest_prefix(sd_cmanifest *m, const char *name, const char *prefix, uint32_t node, sd_error *err) {
  sd_ctensor *t = tensor_find(m, name);
  if (!t) return sd_fail(err, SHARDD_E_INTERNAL, "tensor '%s': node %u gives a prefix before any slice", name, node);
  if (!t->prefix_given) {
    t->prefix_given = 1;
    if (prefix && !(t->prefix = strdup(prefix)))
      return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory recording tensor '%s'", name);
    return 0;
  }
  if (!prefix == !t->prefix && (!prefix || strcmp(prefix, t->prefix) == 0)) return 0;
  return sd_fail(err, SHARDD_E_MISMATCH, "tensor '%s': node %u puts it in files of prefix '%.100s', rank %u (node %u) "
                 "in '%.100s' ('' is the save's own)", name, node, prefix ? prefix : "", t->first_rank, t->first_node,
                 t->prefix ? t->prefix : "");
}

void sd_cmanifest_free(sd_cmanifest *m) {
  for (size_t i = 0; i < m->ntensors; i++) {
    sd_ctensor *t = m->tensors[i];
    free(t->slices);
    free(t->name);
    free(t->prefix);
    free(t);
  }
  for (size_t i = 0; i < m->nfiles; i++) {
    free(m->files[i].name);
    free(m->files[i].data);
  }
  for (size_t i = 0; i < m->nblocks; i++) free(m->blocks[i]);
  free(m->blocks);
  free(m->tensors);
  sd_nameidx_free(&m->names);
  free(m->files);
  memset(m, 0, sizeof *m);
}

/* ------------------------------------------------------------------------ *
 * Planning
 * ------------------------------------------------------------------------ */
typedef struct {
  uint32_t tensor;
  uint32_t n;              /* replicas in the group */
  size_t first;            /* into the members array */
  uint64_t len;
} group;

/* Sorting one tensor's slices by box puts identical boxes side by side. */
static int slice_box_cmp(const void *a, const void *b, void *ud) {
  const sd_cslice *x = *(const sd_cslice *const *)a, *y = *(const sd_cslice *const *)b;
  uint32_t ndim = *(const uint32_t *)ud;
  int c = memcmp(x->dims, y->dims, 2 * ndim * sizeof(uint64_t));
  if (c) return c;
  if (x->node != y->node) return x->node < y->node ? -1 : 1;
  if (x->id != y->id) return x->id < y->id ? -1 : 1;
  return x->part < y->part ? -1 : x->part > y->part;
}

static int write_cmp(const void *a, const void *b) {
  const sd_cwrite *x = a, *y = b;
  if (x->node != y->node) return x->node < y->node ? -1 : 1;
  if (x->file != y->file) return x->file < y->file ? -1 : 1;
  if (x->base != y->base) return x->base < y->base ? -1 : 1;
  if (x->id != y->id) return x->id < y->id ? -1 : 1;
  return x->part < y->part ? -1 : x->part > y->part;
}

/* Replica groups of every tensor, after its coverage is checked. */
static int build_groups(sd_cmanifest *m, const sd_cslice ***members_out, group **groups_out,
                        size_t *ngroups_out, sd_error *err) {
  /* Room for the parts of merged boxes, should some tensor need them split. */
  size_t room = 0;
  uint64_t cnt[SD_CPARTS_MAX];
  for (size_t i = 0; i < m->ntensors; i++)
    for (size_t j = 0; j < m->tensors[i]->nslices; j++) {
      const sd_cslice *s = m->tensors[i]->slices[j];
      room += s->nparts ? parts_of(s, m->tensors[i]->ndim, cnt) : 1;
    }
  const sd_cslice **members = malloc((room ? room : 1) * sizeof *members);
  group *groups = malloc((room ? room : 1) * sizeof *groups);
  sd_box *boxes = NULL;
  uint8_t *keep = NULL;
  size_t cap = 0, nm = 0, ng = 0;
  int rc = 0;
  if (!members || !groups) {
    rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory checking coverage");
    goto out;
  }
  for (size_t i = 0; i < m->ntensors && rc == 0; i++) {
    sd_ctensor *t = m->tensors[i];
    int split = 0;
  again:
    if (t->nslices > cap) {
      free(boxes);
      free(keep);
      cap = t->nslices;
      boxes = malloc(cap * sizeof *boxes);
      keep = malloc(cap);
      if (!boxes || !keep) {
        rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory checking tensor '%s'", t->name);
        break;
      }
    }
    for (size_t j = 0; j < t->nslices; j++) {
      memset(&boxes[j], 0, sizeof boxes[j]);
      memcpy(boxes[j].start, t->slices[j]->dims, t->ndim * sizeof(uint64_t));
      memcpy(boxes[j].count, t->slices[j]->dims + t->ndim, t->ndim * sizeof(uint64_t));
    }
    rc = sd_coverage_check(t->name, t->ndim, t->shape, boxes, t->nslices, keep, err);
    if (rc == SHARDD_E_OVERLAP && !split) {
      /* Merged boxes that overlap partly may be replicas part by part: checked again so. */
      int merged = 0;
      for (size_t j = 0; j < t->nslices; j++) merged |= t->slices[j]->nparts != 0;
      if (merged) {
        split = 1;
        if (split_parts(m, t) != 0) {
          rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory checking tensor '%s'", t->name);
          break;
        }
        memset(err, 0, sizeof *err);
        rc = 0;
        goto again;
      }
    }
    if (rc) break;
    /* Past the check, boxes are either identical or disjoint. */
    const sd_cslice **mine = members + nm;
    for (size_t j = 0; j < t->nslices; j++) mine[j] = t->slices[j];
    uint32_t ndim = t->ndim;
    if (t->nslices > 1) qsort_r(mine, t->nslices, sizeof *mine, slice_box_cmp, &ndim);
    for (size_t j = 0; j < t->nslices;) {
      size_t k = j + 1;
      while (k < t->nslices && memcmp(mine[k]->dims, mine[j]->dims, 2 * t->ndim * sizeof(uint64_t)) == 0) k++;
      groups[ng++] = (group){.tensor = (uint32_t)i, .n = (uint32_t)(k - j), .first = nm + j, .len = mine[j]->len};
      j = k;
    }
    nm += t->nslices;
  }
out:
  free(boxes);
  free(keep);
  if (rc) {
    free(members);
    free(groups);
    return rc;
  }
  *members_out = members;
  *groups_out = groups;
  *ngroups_out = ng;
  return 0;
}

/* The leader's own files: each once (parts joined in rank order), none named like a shard or the index. */
static int join_artifacts(const sd_cmanifest *m, sd_cplan *p, sd_error *err) {
  if (m->nfiles == 0) return 0;
  sd_file_piece *in = calloc(m->nfiles, sizeof *in);
  p->artifacts = calloc(m->nfiles, sizeof *p->artifacts);
  int rc = !in || !p->artifacts ? sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory planning files") : 0;
  for (size_t i = 0; !rc && i < m->nfiles; i++) {
    const sd_cartifact *f = &m->files[i];
    in[i] = (sd_file_piece){.name = f->name, .data = f->data, .len = f->len, .rank = f->rank, .part = f->part};
  }
  if (!rc) rc = sd_files_join(in, m->nfiles, &p->plan, p->artifacts, &p->nartifacts, err);
  free(in);
  return rc;
}

/* Lowest `load` among the replicas' nodes (ties: the lowest node). */
static const sd_cslice *least_loaded(const sd_cslice **mem, uint32_t n, const uint64_t *load) {
  const sd_cslice *best = mem[0];
  for (uint32_t k = 1; k < n; k++) {
    const sd_cslice *c = mem[k];
    if (load[c->node] < load[best->node] || (load[c->node] == load[best->node] && c->node < best->node)) best = c;
  }
  return best;
}

int sd_cplan_build(sd_cmanifest *m, uint32_t nnodes, sd_write_mode mode, const sd_plan_opts *opts,
                   sd_cplan *p, sd_error *err) {
  memset(p, 0, sizeof *p);
  p->nnodes = nnodes;
  p->mode = mode;
  if (nnodes == 0 || nnodes > SD_NNODES_MAX)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "nnodes must be 1 to %d", SD_NNODES_MAX);
  for (size_t i = 0; i < m->ntensors; i++)
    for (size_t j = 0; j < m->tensors[i]->nslices; j++)
      if (m->tensors[i]->slices[j]->node >= nnodes)
        return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "tensor '%s': a slice comes from node %u of %u",
                       m->tensors[i]->name, m->tensors[i]->slices[j]->node, nnodes);

  const sd_cslice **members = NULL;
  group *groups = NULL;
  size_t ngroups = 0;
  uint64_t *held = NULL, *assigned = NULL, *written = NULL;
  size_t *stamp = NULL;
  int rc = build_groups(m, &members, &groups, &ngroups, err);
  if (rc) return rc;

  p->tensors = calloc(m->ntensors ? m->ntensors : 1, sizeof *p->tensors);
  if (!p->tensors) {
    rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory planning");
    goto out;
  }
  p->ntensors = m->ntensors;
  for (size_t i = 0; i < m->ntensors; i++) {
    const sd_ctensor *t = m->tensors[i];
    p->tensors[i] = (sd_tensor){.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .index = t->index,
                                .prefix = t->prefix};
    memcpy(p->tensors[i].shape, t->shape, sizeof t->shape);
  }
  rc = sd_plan_build(&p->plan, p->tensors, p->ntensors, opts, err);
  if (rc) goto out;
  p->have_plan = 1;
  rc = join_artifacts(m, p, err);
  if (rc) goto out;

  size_t nf = p->plan.nfiles;
  held = calloc((nf ? nf : 1) * nnodes, sizeof *held);
  assigned = calloc(nnodes, sizeof *assigned);
  written = calloc(nnodes, sizeof *written);
  stamp = malloc(nnodes * sizeof *stamp);
  p->owner = calloc(nf ? nf : 1, sizeof *p->owner);
  p->expect = calloc((nf ? nf : 1) * nnodes, sizeof *p->expect);
  p->local_bytes = calloc(nnodes, sizeof *p->local_bytes);
  p->fwd_bytes = calloc(nnodes, sizeof *p->fwd_bytes);
  p->file_bytes = calloc(nnodes, sizeof *p->file_bytes);
  p->writes = malloc((ngroups ? ngroups : 1) * sizeof *p->writes);
  if (!held || !assigned || !written || !stamp || !p->owner || !p->expect || !p->local_bytes || !p->fwd_bytes ||
      !p->file_bytes || !p->writes) {
    rc = sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory assigning files to nodes");
    goto out;
  }
  for (uint32_t n = 0; n < nnodes; n++) stamp[n] = (size_t)-1;

  /* What each node could write of each file without receiving a byte. */
  for (size_t g = 0; g < ngroups; g++) {
    uint32_t f = p->plan.loc[groups[g].tensor].file;
    for (uint32_t k = 0; k < groups[g].n; k++) {
      uint32_t node = members[groups[g].first + k]->node;
      if (stamp[node] == g) continue; /* two replicas on one node count once */
      stamp[node] = g;
      held[(size_t)f * nnodes + node] += groups[g].len;
    }
  }
  for (size_t f = 0; f < nf; f++) {
    uint32_t best = 0;
    for (uint32_t n = 1; n < nnodes; n++) {
      uint64_t hb = held[f * nnodes + best], hn = held[f * nnodes + n];
      if (hn > hb || (hn == hb && assigned[n] < assigned[best])) best = n;
    }
    p->owner[f] = best;
    assigned[best] += p->plan.files[f].file_size;
    p->file_bytes[best] += p->plan.files[f].file_size;
  }

  /* Who writes each replica group, from which copy. */
  for (size_t g = 0; g < ngroups; g++) {
    const group *gr = &groups[g];
    if (gr->len == 0) continue; /* zero-size tensors have no bytes to move */
    const sd_plan_loc *loc = &p->plan.loc[gr->tensor];
    uint32_t owner = p->owner[loc->file];
    const sd_cslice **mem = members + gr->first;
    const sd_cslice *pick = NULL;
    uint32_t dest;
    if (mode == SD_WRITE_OWNER) {
      for (uint32_t k = 0; k < gr->n && !pick; k++)
        if (mem[k]->node == owner) pick = mem[k];
      if (!pick) pick = least_loaded(mem, gr->n, p->fwd_bytes);
      dest = owner;
    } else {
      pick = least_loaded(mem, gr->n, written);
      dest = pick->node;
    }
    written[dest] += gr->len;
    if (dest == pick->node) p->local_bytes[pick->node] += gr->len;
    else p->fwd_bytes[pick->node] += gr->len;
    p->expect[(size_t)dest * nf + loc->file] += gr->len;
    p->writes[p->nwrites++] = (sd_cwrite){.id = pick->id, .part = pick->part, .node = pick->node, .dest = dest, .file = loc->file,
                                          .base = loc->file_offset, .len = gr->len};
  }
  if (p->nwrites > 1) qsort(p->writes, p->nwrites, sizeof *p->writes, write_cmp);

  if (p->plan.needs_index) {
    p->index_json = sd_index_encode(&p->plan, p->tensors, &p->index_len, err);
    if (!p->index_json) {
      rc = err && err->code ? err->code : SHARDD_E_INTERNAL;
      goto out;
    }
  }
  p->total_bytes = p->index_len;
  for (size_t f = 0; f < nf; f++) p->total_bytes += p->plan.files[f].file_size;
  for (size_t i = 0; i < p->nartifacts; i++) p->total_bytes += p->artifacts[i].len;
  p->nfiles_total = nf + (p->plan.needs_index ? 1 : 0) + p->nartifacts;
out:
  free(members);
  free(groups);
  free(held);
  free(assigned);
  free(written);
  free(stamp);
  if (rc) sd_cplan_free(p);
  return rc;
}

void sd_cplan_free(sd_cplan *p) {
  if (p->have_plan) sd_plan_free(&p->plan);
  free(p->tensors);
  free(p->owner);
  free(p->writes);
  free(p->expect);
  free(p->local_bytes);
  free(p->fwd_bytes);
  free(p->file_bytes);
  free(p->index_json);
  for (size_t i = 0; i < p->nartifacts; i++) free(p->artifacts[i].owned);
  free(p->artifacts);
  memset(p, 0, sizeof *p);
}

/* ------------------------------------------------------------------------ *
 * A node's report against its assignment
 * ------------------------------------------------------------------------ */
uint64_t sd_cplan_assigned(const sd_cplan *P, uint32_t k, size_t f) {
  return (P->owner[f] == k ? P->plan.files[f].header_size : 0) + P->expect[(size_t)k * P->plan.nfiles + f];
}

const char *sd_cplan_done_mismatch(const sd_cplan *P, uint32_t k, const char *dir, json_t *files, json_t *sums,
                                   uint32_t *shares, char *buf, size_t n) {
  size_t nf = P->plan.nfiles, want = 0;
  for (size_t f = 0; f < nf; f++) want += sd_cplan_assigned(P, k, f) != 0;
  if (!json_is_array(files) || json_array_size(files) != want) {
    snprintf(buf, n, "%zu files, the plan gave it %zu", json_array_size(files), want);
    return buf;
  }
  uint8_t *seen = calloc(nf ? nf : 1, 1);
  if (!seen) return "a done the leader had no memory to check";
  const char *bad = NULL;
  for (size_t i = 0; i < want && !bad; i++) {
    json_t *e = json_array_get(files, i), *jf = json_array_get(e, 0), *jb = json_array_get(e, 1);
    if (json_array_size(e) != 2 || !json_is_integer(jf) || !json_is_integer(jb) || json_integer_value(jf) < 0 ||
        (uint64_t)json_integer_value(jf) >= nf) {
      snprintf(buf, n, "a malformed file entry (%zu)", i);
      bad = buf;
      break;
    }
    size_t f = (size_t)json_integer_value(jf);
    uint64_t exp = sd_cplan_assigned(P, k, f);
    if (!exp)
      snprintf(buf, n, "%s/%s, which was not assigned to it", dir, P->plan.files[f].name);
    else if (seen[f]++)
      snprintf(buf, n, "%s/%s twice", dir, P->plan.files[f].name);
    else if ((uint64_t)json_integer_value(jb) != exp)
      snprintf(buf, n, "%lld bytes of %s/%s, the plan gave it %llu", (long long)json_integer_value(jb), dir,
               P->plan.files[f].name, (unsigned long long)exp);
    else
      continue;
    bad = buf;
  }
  free(seen);
  if (bad || !shares) return bad;
  if (!json_is_array(sums)) return "no checksum shares";
  if (json_array_size(sums) != want) return "checksum shares for other files than it wrote";
  for (size_t i = 0; i < want; i++) {
    json_t *e = json_array_get(sums, i), *jf = json_array_get(e, 0);
    const char *hex = json_string_value(json_array_get(e, 1));
    if (json_array_size(e) != 2 || !json_is_integer(jf) || !hex || sd_crc32c_parse(hex, &shares[i]) != 0)
      return "a malformed checksum share";
    json_int_t f = json_integer_value(json_array_get(json_array_get(files, i), 0));
    if (json_integer_value(jf) != f) return "checksum shares for other files than it wrote";
    if (shares[i] && !P->expect[(size_t)k * nf + (size_t)f]) {
      snprintf(buf, n, "a checksum share for %s/%s, into which it writes no data", dir, P->plan.files[f].name);
      return buf;
    }
  }
  return NULL;
}

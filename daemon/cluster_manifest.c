/* What a node tells the leader its ranks hold: their boxes merged and numbered, in frames of bounded size, and the tensor table once, by digest, sent only when the leader asks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_int.h"
#include "log.h"
#include "sd_base64.h"
#include "sd_grow.h"

/* ------------------------------------------------------------------------ *
 * Boxes: a node's ranks' slices of one tensor, merged
 * ------------------------------------------------------------------------ */
/* Orders one tensor's slices so that identical boxes sit side by side and boxes that meet end to
 * end along dim 0 follow each other: by every other dim's start and count, then dim 0's. */
static int box_cmp(const void *a, const void *b, void *ud) {
  const sd_slice *x = *(sd_slice *const *)a, *y = *(sd_slice *const *)b;
  uint32_t nd = *(const uint32_t *)ud;
  for (uint32_t d = 1; d < nd; d++) {
    if (x->dims[d] != y->dims[d]) return x->dims[d] < y->dims[d] ? -1 : 1;
    if (x->dims[nd + d] != y->dims[nd + d]) return x->dims[nd + d] < y->dims[nd + d] ? -1 : 1;
  }
  if (nd && x->dims[0] != y->dims[0]) return x->dims[0] < y->dims[0] ? -1 : 1;
  if (nd && x->dims[nd] != y->dims[nd]) return x->dims[nd] < y->dims[nd] ? -1 : 1;
  return x->rank < y->rank ? -1 : x->rank > y->rank;
}

typedef struct {
  sd_csave *cs;
  json_t *boxes;           /* of the frame being filled */
  json_t *first;           /* the fields only the first frame carries, until it goes */
  int oom;
} framer;

static void flush(framer *f, int last, json_t *tail) {
  json_t *m = json_pack("{s:s,s:o}", "t", "manifest", "boxes", f->boxes);
  f->boxes = json_array();
  if (!m || !f->boxes) f->oom = 1;
  if (m && f->first) {
    json_object_update(m, f->first);
    json_decref(f->first);
    f->first = NULL;
  }
  if (m && tail) json_object_update(m, tail);
  if (m && !last) json_object_set_new(m, "more", json_true());
  if (!f->oom) sd_node_to_leader(f->cs, m);
  else json_decref(m);
}

/* Box [ti, id, rank, start..., count...] of table entry ti, its members from mem[0..n). */
static int emit_box(framer *f, uint32_t ti, const sd_save_tensor *t, sd_slice **mem, size_t n, const uint64_t *dims) {
  sd_csave *cs = f->cs;
  if (SD_GROW(cs->boxes, cs->bcap, cs->nboxes + 1, 256) || SD_GROW(cs->slices, cs->scap, cs->nslices + n, 256))
    return -1;
  uint64_t len = 0;
  for (size_t i = 0; i < n; i++) {
    cs->slices[cs->nslices + i] = (sd_cslice_ref){(sd_save_tensor *)t, mem[i]};
    len += mem[i]->len;
  }
  cs->boxes[cs->nboxes] = (sd_cbox){.first = (uint32_t)cs->nslices, .n = (uint32_t)n, .len = len};
  json_t *e = json_array();
  json_array_append_new(e, json_integer(ti));
  json_array_append_new(e, json_integer((json_int_t)cs->nboxes));
  json_array_append_new(e, json_integer(mem[0]->rank));
  for (uint32_t d = 0; d < 2 * t->ndim; d++) json_array_append_new(e, json_integer((json_int_t)dims[d]));
  /* Merged: each part's count along dim 0, should the leader have to check it part by part; one
   * value c when the parts are c, c, ..., and a last of at most c (an even split, as FSDP's). */
  int even = n > 1;
  for (size_t i = 1; even && i < n; i++)
    even = i + 1 < n ? mem[i]->dims[t->ndim] == mem[0]->dims[t->ndim] : mem[i]->dims[t->ndim] <= mem[0]->dims[t->ndim];
  for (size_t i = 0; n > 1 && i < (even ? 1 : n); i++)
    json_array_append_new(e, json_integer((json_int_t)mem[i]->dims[t->ndim]));
  if (json_array_append_new(f->boxes, e) != 0) return -1;
  cs->nboxes++;
  cs->nslices += n;
  if (json_array_size(f->boxes) >= SD_MANIFEST_BOXES) flush(f, 0, NULL);
  return f->oom ? -1 : 0;
}

/* The boxes with bytes of the fresh ranks' slices of t: identical ones once (a replica here adds
 * nothing to write), those that meet along dim 0 as one (what FSDP's and HSDP's shards of one
 * node are), so the leader hears of about one box per tensor and node. */
static int tensor_boxes(framer *f, uint32_t ti, sd_save_tensor *t, const uint8_t *fresh, sd_slice ***tmp,
                        size_t *tcap) {
  size_t n = 0;
  for (size_t j = 0; j < t->nslices; j++) {
    sd_slice *s = t->slices[j];
    if (!fresh[s->rank] || s->len == 0) continue;
    if (SD_GROW(*tmp, *tcap, n + 1, 64)) return -1;
    (*tmp)[n++] = s;
  }
  if (!n) return 0;
  sd_slice **v = *tmp;
  uint32_t nd = t->ndim;
  if (n > 1) qsort_r(v, n, sizeof *v, box_cmp, &nd);
  uint64_t dims[2 * SD_MAX_DIMS];
  size_t start = 0, kept = 0;
  memcpy(dims, v[0]->dims, 2 * nd * sizeof *dims);
  for (size_t j = 1; j <= n; j++) {
    if (j < n && !memcmp(v[j]->dims, v[j - 1]->dims, 2 * nd * sizeof *dims)) {
      continue; /* a replica of the one before */
    }
    if (j < n) {
      int meets = nd > 0 && kept + 1 < SD_MERGE_MAX && dims[0] + dims[nd] == v[j]->dims[0];
      for (uint32_t d = 1; d < nd && meets; d++) meets = dims[d] == v[j]->dims[d] && dims[nd + d] == v[j]->dims[nd + d];
      if (meets) {
        dims[nd] += v[j]->dims[nd];
        v[start + ++kept] = v[j];
        continue;
      }
    }
    if (emit_box(f, ti, t, v + start, kept + 1, dims) != 0) return -1;
    if (j < n) {
      start = j;
      kept = 0;
      memcpy(dims, v[j]->dims, 2 * nd * sizeof *dims);
    }
  }
  return 0;
}

/* ------------------------------------------------------------------------ *
 * seal: what the newly sealed ranks hold, never their bytes
 * ------------------------------------------------------------------------ */
void sd_node_sealed(sd_csave *cs) {
  sd_save *save = cs->save;
  /* One manifest for the ranks of this node together, once every rank that began here sealed: the
   * leader plans only after the last seal anyway (a rank that begins here later sends its own). */
  for (uint32_t r = 0; r < save->world_size; r++)
    if (save->ranks[r].state == SD_RANK_BEGUN) return;
  uint8_t *fresh = calloc(save->world_size, 1);
  json_t *ranks = json_array();
  sd_ctable *nt = realloc(cs->tables, (cs->ntables + 1) * sizeof *nt);
  if (nt) cs->tables = nt;
  if (!fresh || !ranks || !nt) {
    free(fresh);
    json_decref(ranks);
    sd_node_fail_held(cs, SHARDD_E_NO_MEMORY, "out of memory describing save '%s' to the leader", save->id);
    return;
  }
  size_t nfresh = 0;
  for (uint32_t r = 0; r < save->world_size; r++) {
    if (save->ranks[r].state != SD_RANK_SEALED || cs->reported[r]) continue;
    cs->reported[r] = fresh[r] = 1;
    json_array_append_new(ranks, json_integer(r));
    nfresh++;
  }
  if (nfresh == 0) {
    free(fresh);
    json_decref(ranks);
    return;
  }
  /* The table: every tensor one of these ranks declared, empty boxes included, so the leader checks
   * its dtype and shape against the other nodes' (this node's ranks agreed with each other already). */
  sd_ctable *tab = &cs->tables[cs->ntables];
  memset(tab, 0, sizeof *tab);
  tab->t = malloc((save->ntensors ? save->ntensors : 1) * sizeof *tab->t);
  sd_ctable_hash *hash = sd_ctable_hash_new();
  framer f = {.cs = cs, .boxes = json_array(), .first = json_object()};
  int oom = !tab->t || !hash || !f.boxes || !f.first;
  for (size_t i = 0; i < save->ntensors && !oom; i++) {
    sd_save_tensor *t = save->tensors[i];
    for (size_t j = 0; j < t->nslices; j++)
      if (fresh[t->slices[j]->rank]) {
        tab->t[tab->n++] = t;
        sd_ctable_hash_add(hash, t->name, t->dtype, t->ndim, t->shape, t->index, t->prefix);
        break;
      }
  }
  oom |= sd_ctable_hash_end(hash, tab->digest) != 0;
  if (!oom) cs->ntables++;
  char hex[2 * SD_CTABLE_DIGEST + 1];
  sd_ctable_hex(tab->digest, hex);
  if (!oom) {
    json_object_set_new(f.first, "ranks", ranks);
    ranks = NULL;
    json_object_set_new(f.first, "table", json_pack("{s:I,s:s}", "n", (json_int_t)tab->n, "digest", hex));
  }
  sd_slice **tmp = NULL;
  size_t tcap = 0;
  for (size_t i = 0; i < tab->n && !oom; i++) oom = tensor_boxes(&f, (uint32_t)i, tab->t[i], fresh, &tmp, &tcap) != 0;
  free(tmp);
  json_t *files = json_array();
  for (size_t i = 0; i < save->nfiles && !oom; i++) {
    sd_save_artifact *a = &save->files[i];
    if (!fresh[a->rank]) continue;
    char *b = malloc(sd_b64_encoded_len(a->len) + 1);
    if (!b) {
      oom = 1;
      break;
    }
    sd_b64_encode(a->data, a->len, b);
    json_t *fe = json_pack("{s:s,s:i,s:s}", "path", a->name, "rank", (int)a->rank, "data", b);
    if (fe && a->part) json_object_set_new(fe, "part", json_true());
    json_array_append_new(files, fe);
    free(b);
  }
  free(fresh);
  json_decref(ranks);
  if (!oom && !f.oom) {
    /* "sums": this node can hash what it writes (PEERS.md); a leader asks only nodes that all can */
    json_t *tail = json_pack("{s:o,s:b}", "files", files, "sums", 1);
    files = NULL;
    flush(&f, 1, tail);
    json_decref(tail);
  }
  json_decref(files);
  json_decref(f.boxes);
  json_decref(f.first);
  if (oom || f.oom)
    sd_node_fail_held(cs, SHARDD_E_NO_MEMORY, "out of memory describing save '%s' to the leader", save->id);
  else
    sd_log_debug("save '%s': described %zu ranks to the leader: %zu tensors, %zu boxes so far", save->id, nfresh,
                 tab->n, cs->nboxes);
}

/* ------------------------------------------------------------------------ *
 * The table, when the leader asks for it
 * ------------------------------------------------------------------------ */
static json_t *u64_array(const uint64_t *v, uint32_t n) {
  json_t *a = json_array();
  for (uint32_t i = 0; i < n; i++) json_array_append_new(a, json_integer((json_int_t)v[i]));
  return a;
}

void sd_node_send_table(sd_csave *cs, json_t *h) {
  const char *want = json_string_value(json_object_get(h, "digest"));
  const sd_ctable *tab = NULL;
  char hex[2 * SD_CTABLE_DIGEST + 1];
  for (size_t i = 0; want && i < cs->ntables && !tab; i++) {
    sd_ctable_hex(cs->tables[i].digest, hex);
    if (!strcmp(hex, want)) tab = &cs->tables[i];
  }
  if (!tab) {
    sd_node_fail_held(cs, SHARDD_E_INTERNAL, "save '%s': the leader asked for a tensor table this node never described",
                      cs->save->id);
    return;
  }
  /* [name, dtype, shape, index (-1: none), the rank that declared it first, and its file prefix if it has one] */
  for (size_t at = 0; at < tab->n || at == 0; at += SD_TABLE_TENSORS) {
    json_t *ts = json_array();
    for (size_t i = at; i < tab->n && i < at + SD_TABLE_TENSORS; i++) {
      const sd_save_tensor *t = tab->t[i];
      json_t *e = json_pack("[s,s,o,I,i]", t->name, sd_dtype_name(t->dtype), u64_array(t->shape, t->ndim),
                            (json_int_t)(t->index >= 0 ? t->index : -1), (int)t->first_rank);
      if (e && t->prefix) json_array_append_new(e, json_string(t->prefix));
      json_array_append_new(ts, e);
    }
    json_t *m = json_pack("{s:s,s:s,s:I,s:o}", "t", "table", "digest", hex, "from", (json_int_t)at, "tensors", ts);
    if (m && at + SD_TABLE_TENSORS < tab->n) json_object_set_new(m, "more", json_true());
    if (!m) {
      sd_node_fail_held(cs, SHARDD_E_NO_MEMORY, "out of memory describing save '%s' to the leader", cs->save->id);
      return;
    }
    sd_node_to_leader(cs, m);
    if (tab->n == 0) break;
  }
}

void sd_node_tables_free(sd_csave *cs) {
  for (size_t i = 0; i < cs->ntables; i++) free(cs->tables[i].t);
  free(cs->tables);
  cs->tables = NULL;
  cs->ntables = 0;
}

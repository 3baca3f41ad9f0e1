/* The leader's part of collecting: each node's manifest frames (its boxes, checked as they come) and the tensor tables, asked once per digest, merged by name and checked against each other. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_lead_int.h"
#include "pathsafe.h"
#include "sd_base64.h"
#include "sd_grow.h"
#include "sd_msg.h"

void sd_lead_man_free(sd_lead *L) {
  for (size_t i = 0; i < L->ntables; i++) {
    free(L->tables[i].map);
    if (L->tables[i].hash) {
      uint8_t d[SD_CTABLE_DIGEST];
      sd_ctable_hash_end(L->tables[i].hash, d);
    }
  }
  free(L->tables);
  L->tables = NULL;
  L->ntables = 0;
  for (uint32_t k = 0; L->nodes && k < L->nnodes; k++) {
    free(L->nodes[k].held);
    L->nodes[k].held = NULL;
    L->nodes[k].nheld = L->nodes[k].hcap = 0;
  }
}

static int ready_now(const sd_lead *L) {
  if (L->nsealed != L->ws || L->ncollecting) return 0;
  for (size_t i = 0; i < L->ntables; i++)
    if (!L->tables[i].complete) return 0;
  return 1;
}

/* A box [entry, id, rank, start..., count...] (v, n values) of node k against its table's tensor. */
static int apply_box(sd_lead *L, uint32_t k, const ltable *tab, const uint64_t *v, size_t n, sd_error *err) {
  uint32_t ti = tab->map[v[0]];
  const sd_ctensor *t = L->man.tensors[ti];
  if (n < 3 + 2 * (size_t)t->ndim)
    return sd_fail(err, SHARDD_E_INTERNAL, "tensor '%s': node %u sent a malformed slice", t->name, k);
  size_t np = n - 3 - 2 * (size_t)t->ndim; /* a merged box's parts, or one count for an even split */
  const uint64_t *parts = v + 3 + 2 * t->ndim, *count = v + 3 + t->ndim;
  return sd_cmanifest_box(&L->man, ti, k, (uint32_t)v[2], v[1], v + 3, count, parts, (uint32_t)np, err);
}

/* ------------------------------------------------------------------------ *
 * Manifest frames
 * ------------------------------------------------------------------------ */
static int first_frame(sd_lead *L, uint32_t k, json_t *h, sd_error *err) {
  json_t *ranks = json_object_get(h, "ranks"), *table = json_object_get(h, "table");
  uint8_t digest[SD_CTABLE_DIGEST];
  json_t *jn = json_object_get(table, "n");
  if (!json_is_array(ranks) || !json_is_integer(jn) || json_integer_value(jn) < 0 ||
      json_integer_value(jn) > (json_int_t)UINT32_MAX || sd_ctable_unhex(json_string_value(json_object_get(table, "digest")), digest))
    return sd_fail(err, SHARDD_E_INTERNAL, "save '%s': node %u sent a malformed manifest", L->id, k);
  for (size_t i = 0; i < json_array_size(ranks); i++) {
    json_t *r = json_array_get(ranks, i);
    json_int_t rv = json_is_integer(r) ? json_integer_value(r) : -1;
    if (rv < 0 || rv >= (json_int_t)L->ws)
      return sd_fail(err, SHARDD_E_CONFLICT, "save '%s': node %u seals rank %lld, outside world_size %u", L->id, k,
                     (long long)rv, L->ws);
    if (L->rank_node[rv] >= 0)
      return sd_fail(err, SHARDD_E_CONFLICT, "save '%s': rank %lld began on node %d and on node %u", L->id,
                     (long long)rv, L->rank_node[rv], k);
    L->rank_node[rv] = (int32_t)k;
    L->nsealed++;
  }
  uint32_t n = (uint32_t)json_integer_value(jn);
  size_t i = 0;
  while (i < L->ntables && memcmp(L->tables[i].digest, digest, SD_CTABLE_DIGEST)) i++;
  if (i == L->ntables) {
    /* A table not seen yet; others naming it wait for it. */
    ltable *nt = realloc(L->tables, (L->ntables + 1) * sizeof *nt);
    if (!nt) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory on the leader");
    L->tables = nt;
    ltable *t = &L->tables[L->ntables];
    memset(t, 0, sizeof *t);
    memcpy(t->digest, digest, SD_CTABLE_DIGEST);
    t->n = n;
    t->from = k;
    t->map = malloc((n ? n : 1) * sizeof *t->map);
    t->hash = n ? sd_ctable_hash_new() : NULL;
    if (!t->map || (n && !t->hash)) {
      free(t->map);
      if (t->hash) sd_ctable_hash_end(t->hash, digest);
      return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory on the leader");
    }
    t->complete = n == 0;
    L->ntables++;
  } else if (L->tables[i].n != n) {
    return sd_fail(err, SHARDD_E_INTERNAL, "save '%s': node %u sent a malformed manifest (its table)", L->id, k);
  } else if (k == 0 && !L->tables[i].asked) {
    L->tables[i].from = 0;
  }
  L->nodes[k].table = (int32_t)i;
  L->nodes[k].collecting = 1;
  L->ncollecting++;
  return 0;
}

static int last_frame(sd_lead *L, uint32_t k, json_t *h, sd_error *err) {
  json_t *files = json_object_get(h, "files");
  if (!json_is_array(files)) return sd_fail(err, SHARDD_E_INTERNAL, "save '%s': node %u sent a malformed manifest", L->id, k);
  L->nodes[k].sums = json_is_true(json_object_get(h, "sums"));
  for (size_t i = 0; i < json_array_size(files); i++) {
    json_t *f = json_array_get(files, i);
    const char *path = json_string_value(json_object_get(f, "path"));
    const char *data = json_string_value(json_object_get(f, "data"));
    json_int_t rank = json_integer_value(json_object_get(f, "rank"));
    uint8_t *bytes = NULL;
    size_t len = 0;
    int part = 0; /* that rank's part of the file */
    if (!path || !data || sd_path_check_name(path, err) || sd_msg_bool(f, "part", 0, &part, err) < 0 ||
        sd_b64_decode(data, json_string_length(json_object_get(f, "data")), &bytes, &len, err))
      return sd_fail(err, SHARDD_E_INTERNAL, "save '%s': node %u sent a malformed file", L->id, k);
    int rc = sd_cmanifest_file(&L->man, path, bytes, len, (uint32_t)rank, part, err);
    free(bytes);
    if (rc) return rc;
  }
  L->nodes[k].collecting = 0;
  L->ncollecting--;
  return 0;
}

int sd_lead_manifest(sd_lead *L, uint32_t k, json_t *h, int *ready, sd_error *err) {
  *ready = 0;
  if (L->state != L_COLLECT)
    return sd_fail(err, SHARDD_E_INTERNAL, "save '%s': node %u described slices after planning started", L->id, k);
  lnode *n = &L->nodes[k];
  int rc = n->collecting ? 0 : first_frame(L, k, h, err);
  if (rc) return rc;
  const ltable *tab = &L->tables[n->table];
  json_t *boxes = json_object_get(h, "boxes");
  if (!json_is_array(boxes)) return sd_fail(err, SHARDD_E_INTERNAL, "save '%s': node %u sent a malformed manifest", L->id, k);
  for (size_t i = 0; i < json_array_size(boxes); i++) {
    json_t *b = json_array_get(boxes, i);
    uint64_t v[3 + 2 * SD_MAX_DIMS + SD_MERGE_MAX];
    size_t nv = json_array_size(b);
    if (nv < 3 || nv > 3 + 2 * SD_MAX_DIMS + SD_MERGE_MAX)
      return sd_fail(err, SHARDD_E_INTERNAL, "save '%s': node %u sent a malformed slice", L->id, k);
    for (size_t j = 0; j < nv; j++) {
      json_t *e = json_array_get(b, j);
      if (!json_is_integer(e) || json_integer_value(e) < 0)
        return sd_fail(err, SHARDD_E_INTERNAL, "save '%s': node %u sent a malformed slice", L->id, k);
      v[j] = (uint64_t)json_integer_value(e);
    }
    if (v[0] >= tab->n) return sd_fail(err, SHARDD_E_INTERNAL, "save '%s': node %u sent a malformed slice", L->id, k);
    if (v[2] >= L->ws || L->rank_node[v[2]] != (int32_t)k)
      return sd_fail(err, SHARDD_E_CONFLICT, "save '%s': node %u describes a slice of rank %llu, not one of its own",
                     L->id, k, (unsigned long long)v[2]);
    if (tab->complete) {
      if ((rc = apply_box(L, k, tab, v, nv, err)) != 0) return rc;
      continue;
    }
    /* Its table has not come yet: held as numbers, checked once it has. */
    if (SD_GROW(n->held, n->hcap, n->nheld + nv + 2, 1024))
      return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory on the leader");
    n->held[n->nheld++] = nv;
    n->held[n->nheld++] = (uint64_t)n->table;
    memcpy(n->held + n->nheld, v, nv * sizeof *v);
    n->nheld += nv;
  }
  if (!json_is_true(json_object_get(h, "more")) && (rc = last_frame(L, k, h, err)) != 0) return rc;
  *ready = ready_now(L);
  return 0;
}

int sd_lead_next_ask(sd_lead *L, uint32_t *node) {
  int all_in = L->nsealed == L->ws && !L->ncollecting;
  for (size_t i = 0; i < L->ntables; i++) {
    ltable *t = &L->tables[i];
    if (t->complete || t->asked || (t->from != 0 && !all_in)) continue;
    t->asked = 1;
    *node = t->from;
    return (int)i;
  }
  return -1;
}

/* ------------------------------------------------------------------------ *
 * Table frames
 * ------------------------------------------------------------------------ */
static int table_entry(sd_lead *L, uint32_t k, ltable *tab, json_t *e, sd_error *err) {
  const char *name = json_string_value(json_array_get(e, 0));
  const char *dtype = json_string_value(json_array_get(e, 1));
  json_t *shape = json_array_get(e, 2), *ji = json_array_get(e, 3), *jr = json_array_get(e, 4);
  const char *prefix = json_string_value(json_array_get(e, 5)); /* a file series of its own */
  uint64_t dims[SD_MAX_DIMS];
  sd_dtype dt;
  size_t nd = json_array_size(shape);
  int ok = (json_array_size(e) == 5 || (json_array_size(e) == 6 && prefix && !sd_prefix_check(prefix, err))) && name &&
           !sd_name_check(name, strlen(name), err) && dtype &&
           !sd_dtype_parse(dtype, &dt, err) && json_is_array(shape) && nd <= SD_MAX_DIMS && json_is_integer(ji) &&
           json_integer_value(ji) >= -1 && json_is_integer(jr);
  for (size_t d = 0; ok && d < nd; d++) {
    json_t *v = json_array_get(shape, d);
    ok = json_is_integer(v) && json_integer_value(v) >= 0;
    if (ok) dims[d] = (uint64_t)json_integer_value(v);
  }
  if (!ok) return sd_fail(err, SHARDD_E_INTERNAL, "save '%s': node %u sent a malformed tensor", L->id, k);
  json_int_t rank = json_integer_value(jr);
  if (rank < 0 || rank >= (json_int_t)L->ws || L->rank_node[rank] != (int32_t)k)
    return sd_fail(err, SHARDD_E_CONFLICT, "tensor '%s': node %u names rank %lld, not one of its own", name, k,
                   (long long)rank);
  int64_t index = json_integer_value(ji);
  sd_ctable_hash_add(tab->hash, name, dt, (uint32_t)nd, dims, index, prefix);
  int rc = sd_cmanifest_tensor(&L->man, name, dt, (uint32_t)nd, dims, index, k, (uint32_t)rank, &tab->map[tab->filled++],
                               err);
  return rc ? rc : sd_cmanifest_prefix(&L->man, name, prefix, k, err);
}

int sd_lead_table(sd_lead *L, uint32_t k, json_t *h, int *ready, sd_error *err) {
  *ready = 0;
  uint8_t digest[SD_CTABLE_DIGEST];
  json_t *ts = json_object_get(h, "tensors"), *from = json_object_get(h, "from");
  size_t i = 0;
  if (L->state != L_COLLECT || sd_ctable_unhex(json_string_value(json_object_get(h, "digest")), digest))
    return sd_fail(err, SHARDD_E_INTERNAL, "save '%s': node %u sent a table nobody asked for", L->id, k);
  while (i < L->ntables && memcmp(L->tables[i].digest, digest, SD_CTABLE_DIGEST)) i++;
  ltable *tab = i < L->ntables ? &L->tables[i] : NULL;
  if (!tab || tab->complete || !tab->asked || tab->from != k)
    return sd_fail(err, SHARDD_E_INTERNAL, "save '%s': node %u sent a table nobody asked for", L->id, k);
  if (!json_is_array(ts) || json_integer_value(from) != (json_int_t)tab->filled ||
      json_array_size(ts) > tab->n - tab->filled)
    return sd_fail(err, SHARDD_E_INTERNAL, "save '%s': node %u sent a malformed table", L->id, k);
  int rc = 0;
  for (size_t j = 0; j < json_array_size(ts) && !rc; j++) rc = table_entry(L, k, tab, json_array_get(ts, j), err);
  if (rc || tab->filled < tab->n) return rc;
  uint8_t got[SD_CTABLE_DIGEST];
  int bad = sd_ctable_hash_end(tab->hash, got) != 0;
  tab->hash = NULL;
  if (bad || memcmp(got, tab->digest, SD_CTABLE_DIGEST))
    return sd_fail(err, SHARDD_E_INTERNAL, "save '%s': node %u sent a table that does not match its digest", L->id, k);
  tab->complete = 1;
  /* The boxes that waited for it, from every node that named it. */
  for (uint32_t n = 0; n < L->nnodes && !rc; n++) {
    lnode *ln = &L->nodes[n];
    size_t kept = 0;
    for (size_t at = 0; at < ln->nheld && !rc;) {
      size_t nv = (size_t)ln->held[at];
      if (ln->held[at + 1] == i) rc = apply_box(L, n, tab, ln->held + at + 2, nv, err);
      else {
        memmove(ln->held + kept, ln->held + at, (nv + 2) * sizeof *ln->held);
        kept += nv + 2;
      }
      at += nv + 2;
    }
    ln->nheld = kept;
  }
  *ready = !rc && ready_now(L);
  return rc;
}

/* ------------------------------------------------------------------------ *
 * What a frame of each may weigh
 * ------------------------------------------------------------------------ */
size_t sd_lead_manifest_cap(const sd_cluster *cl, const sd_peer *p, int table) {
  int expected = 0;
  for (const sd_lead *L = cl->leads; L && !expected; L = L->next)
    for (uint32_t k = 0; L->state == L_COLLECT && k < L->nnodes && !expected; k++) {
      if (L->nodes[k].link != p) continue;
      if (!table) expected = 1;
      for (size_t i = 0; table && i < L->ntables; i++)
        expected |= L->tables[i].asked && L->tables[i].from == k && !L->tables[i].complete;
    }
  const sd_config *cfg = cl->d->cfg;
  if (!expected || !cfg) return SD_PEER_CONTROL_MAX;
  /* Integers at most 20 digits and a separator; names escaped at worst 6 to a byte. */
  double n = SD_PEER_CONTROL_MAX;
  if (table)
    n += (double)SD_TABLE_TENSORS * (6.0 * cfg->max_name_len + 96 + 21.0 * cfg->max_dims);
  else
    n += (double)SD_MANIFEST_BOXES * (21.0 * (3 + 2 * cfg->max_dims + SD_MERGE_MAX) + 2) +
         1.4 * (double)cfg->max_inline_bytes_per_save;
  return n < SD_PEER_HEADER_MAX ? (size_t)n : SD_PEER_HEADER_MAX;
}

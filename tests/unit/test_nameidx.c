/* The name -> index hash table: growth, collisions, wraparound, and a linear search over random names as the oracle. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sd_nameidx.h"

/* The caller's side: a growable array of owned names, reallocated as it grows
 * (the table must never keep a pointer into it). */
typedef struct {
  char **v;
  size_t n, cap;
} names;

static const char *name_at(const void *ctx, uint32_t i) {
  const names *ns = ctx;
  cr_assert_lt(i, ns->n, "the table handed back index %u of %zu", i, ns->n);
  return ns->v[i];
}

static void names_push(names *ns, const char *s) {
  if (ns->n == ns->cap) {
    ns->cap = ns->cap ? ns->cap * 2 : 4;
    ns->v = realloc(ns->v, ns->cap * sizeof *ns->v);
    cr_assert_not_null(ns->v);
  }
  ns->v[ns->n] = strdup(s);
  cr_assert_not_null(ns->v[ns->n]);
  ns->n++;
}

static void names_free(names *ns) {
  for (size_t i = 0; i < ns->n; i++) free(ns->v[i]);
  free(ns->v);
  memset(ns, 0, sizeof *ns);
}

/* Insert into the table first, then the array, as the daemon does. */
static void add(sd_nameidx *ix, names *ns, const char *s) {
  cr_assert_eq(sd_nameidx_insert(ix, s, (uint32_t)ns->n, name_at, ns), 0, "insert '%s'", s);
  names_push(ns, s);
}

static uint32_t find(const sd_nameidx *ix, const names *ns, const char *s) {
  return sd_nameidx_find(ix, s, name_at, ns);
}

static uint32_t linear(const names *ns, const char *s) {
  for (size_t i = 0; i < ns->n; i++)
    if (strcmp(ns->v[i], s) == 0) return (uint32_t)i;
  return SD_NAMEIDX_NONE;
}

/* Deterministic, so a failure reproduces. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint64_t rnd(void) {
  uint64_t x = rng_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return rng_state = x;
}

static void random_name(char *buf, size_t maxlen) {
  /* A small alphabet and short names: duplicates and near-misses are common. */
  static const char alpha[] = "abcdefgh.0123_";
  size_t len = 1 + rnd() % maxlen;
  for (size_t i = 0; i < len; i++) buf[i] = alpha[rnd() % (sizeof alpha - 1)];
  buf[len] = '\0';
}

/* ------------------------------------------------------------------------ *
 * Basics
 * ------------------------------------------------------------------------ */
Test(nameidx, hash_is_fnv1a_steps) {
  /* The basis the daemon has always used (see sd_nameidx.h), then FNV-1a steps. */
  const uint64_t basis = 1469598103934665603ULL, prime = 1099511628211ULL;
  cr_assert_eq(sd_nameidx_hash(""), basis);
  cr_assert_eq(sd_nameidx_hash("a"), (basis ^ 'a') * prime);
  cr_assert_eq(sd_nameidx_hash("ab"), (((basis ^ 'a') * prime) ^ 'b') * prime);
  /* Bytes are unsigned: a high byte must not sign-extend. */
  cr_assert_eq(sd_nameidx_hash("\xff"), (basis ^ 0xffULL) * prime);
  cr_assert_neq(sd_nameidx_hash("ab"), sd_nameidx_hash("ba"));
}

Test(nameidx, empty_table_finds_nothing_and_allocates_nothing) {
  names ns = {0};
  sd_nameidx ix;
  sd_nameidx_init(&ix);
  cr_assert_null(ix.slots);
  cr_assert_eq(ix.cap, 0);
  cr_assert_eq(find(&ix, &ns, ""), SD_NAMEIDX_NONE);
  cr_assert_eq(find(&ix, &ns, "model.embed_tokens.weight"), SD_NAMEIDX_NONE);
  cr_assert_eq(sd_nameidx_reserve(&ix, 0, name_at, &ns), 0);
  cr_assert_null(ix.slots);
  sd_nameidx_free(&ix);
  sd_nameidx_free(&ix); /* twice is harmless */

  sd_nameidx zero = {0}; /* all zero is as good as init */
  cr_assert_eq(find(&zero, &ns, "x"), SD_NAMEIDX_NONE);
  add(&zero, &ns, "x");
  cr_assert_eq(find(&zero, &ns, "x"), 0);
  sd_nameidx_free(&zero);
  names_free(&ns);
}

Test(nameidx, the_empty_name_is_a_name) {
  names ns = {0};
  sd_nameidx ix = {0};
  add(&ix, &ns, "a");
  cr_assert_eq(find(&ix, &ns, ""), SD_NAMEIDX_NONE);
  add(&ix, &ns, "");
  cr_assert_eq(find(&ix, &ns, ""), 1);
  cr_assert_eq(find(&ix, &ns, "a"), 0);
  sd_nameidx_free(&ix);
  names_free(&ns);
}

Test(nameidx, many_inserts_grow_and_keep_every_index) {
  names ns = {0};
  sd_nameidx ix = {0};
  char buf[64];
  size_t last_cap = 0, growths = 0;
  for (uint32_t i = 0; i < 20000; i++) {
    snprintf(buf, sizeof buf, "layers.%u.mlp.weight", i);
    cr_assert_eq(find(&ix, &ns, buf), SD_NAMEIDX_NONE, "'%s' before its insert", buf);
    add(&ix, &ns, buf);
    cr_assert_eq(ix.n, (size_t)i + 1);
    cr_assert_geq(ix.cap, 2 * ix.n, "never more than half full");
    cr_assert_eq(ix.cap & (ix.cap - 1), 0, "cap %zu is a power of two", ix.cap);
    if (ix.cap != last_cap) {
      /* First table 128 slots, then doubling. */
      cr_assert_eq(ix.cap, last_cap ? last_cap * 2 : 128);
      last_cap = ix.cap;
      growths++;
      for (uint32_t j = 0; j <= i; j++) cr_assert_eq(find(&ix, &ns, ns.v[j]), j, "after growth to %zu", ix.cap);
    }
  }
  cr_assert_eq(ix.cap, 65536);
  cr_assert_eq(growths, 10);
  for (uint32_t i = 0; i < 20000; i++) {
    snprintf(buf, sizeof buf, "layers.%u.mlp.weight", i);
    cr_assert_eq(find(&ix, &ns, buf), i);
    snprintf(buf, sizeof buf, "layers.%u.mlp.bias", i);
    cr_assert_eq(find(&ix, &ns, buf), SD_NAMEIDX_NONE);
  }
  size_t used = 0;
  for (size_t s = 0; s < ix.cap; s++) used += ix.slots[s] != 0;
  cr_assert_eq(used, 20000);
  sd_nameidx_free(&ix);
  names_free(&ns);
}

Test(nameidx, reserve_sizes_once_and_keeps_entries) {
  names ns = {0};
  sd_nameidx ix = {0};
  add(&ix, &ns, "a");
  add(&ix, &ns, "b");
  cr_assert_eq(ix.cap, 128);
  cr_assert_eq(sd_nameidx_reserve(&ix, 64, name_at, &ns), 0);
  cr_assert_eq(ix.cap, 128, "64 entries fit 128 slots");
  cr_assert_eq(sd_nameidx_reserve(&ix, 1000, name_at, &ns), 0);
  cr_assert_eq(ix.cap, 2048);
  cr_assert_eq(ix.n, 2);
  cr_assert_eq(find(&ix, &ns, "a"), 0);
  cr_assert_eq(find(&ix, &ns, "b"), 1);
  uint64_t *slots = ix.slots;
  char buf[32];
  for (int i = 0; i < 998; i++) {
    snprintf(buf, sizeof buf, "r%d", i);
    add(&ix, &ns, buf);
  }
  cr_assert_eq(ix.slots, slots, "no rehash within the reservation");
  for (int i = 0; i < 24; i++) {
    snprintf(buf, sizeof buf, "s%d", i);
    add(&ix, &ns, buf);
  }
  cr_assert_eq(ix.n, 1024);
  cr_assert_eq(ix.slots, slots, "1024 entries still fit 2048 slots");
  cr_assert_eq(ix.cap, 2048);
  add(&ix, &ns, "one more");
  cr_assert_eq(ix.cap, 4096);
  for (uint32_t i = 0; i < ns.n; i++) cr_assert_eq(find(&ix, &ns, ns.v[i]), i);
  sd_nameidx_free(&ix);
  names_free(&ns);
}

Test(nameidx, an_index_that_cannot_be_stored_is_refused) {
  names ns = {0};
  sd_nameidx ix = {0};
  add(&ix, &ns, "a");
  cr_assert_eq(sd_nameidx_insert(&ix, "z", SD_NAMEIDX_NONE, name_at, &ns), -1);
  cr_assert_eq(ix.n, 1);
  cr_assert_eq(find(&ix, &ns, "z"), SD_NAMEIDX_NONE);
  cr_assert_eq(find(&ix, &ns, "a"), 0);
  sd_nameidx_free(&ix);
  names_free(&ns);
}

/* ------------------------------------------------------------------------ *
 * Collisions: names whose hashes agree modulo the capacity
 * ------------------------------------------------------------------------ */
/* Up to `want` names "<stem><k>" whose home slot in a table of `cap` is `home`. */
static size_t colliding(char out[][32], size_t want, size_t cap, size_t home, const char *stem) {
  size_t got = 0;
  char buf[32];
  for (unsigned k = 0; got < want && k < 10000000; k++) {
    snprintf(buf, sizeof buf, "%s%u", stem, k);
    if ((sd_nameidx_hash(buf) & (cap - 1)) == home) memcpy(out[got++], buf, sizeof buf);
  }
  return got;
}

Test(nameidx, one_home_slot_shared_by_many_names) {
  char same[48][32];
  cr_assert_eq(colliding(same, 48, 128, 17, "c"), 48);
  names ns = {0};
  sd_nameidx ix = {0};
  /* 40 inserted (the table stays at 128 slots), 8 held back as absent names with the same home. */
  for (size_t i = 0; i < 40; i++) add(&ix, &ns, same[i]);
  cr_assert_eq(ix.cap, 128);
  for (size_t s = 17; s < 17 + 40; s++) cr_assert_neq(ix.slots[s], 0, "run of 40 from slot 17");
  cr_assert_eq(ix.slots[16], 0);
  cr_assert_eq(ix.slots[57], 0);
  for (uint32_t i = 0; i < 40; i++) cr_assert_eq(find(&ix, &ns, same[i]), i, "'%s'", same[i]);
  for (size_t i = 40; i < 48; i++) cr_assert_eq(find(&ix, &ns, same[i]), SD_NAMEIDX_NONE, "'%s'", same[i]);
  sd_nameidx_free(&ix);
  names_free(&ns);
}

Test(nameidx, probes_wrap_past_the_last_slot) {
  char last[30][32], first[5][32];
  cr_assert_eq(colliding(last, 30, 128, 127, "w"), 30);
  cr_assert_eq(colliding(first, 5, 128, 0, "f"), 5);
  names ns = {0};
  sd_nameidx ix = {0};
  for (size_t i = 0; i < 30; i++) add(&ix, &ns, last[i]); /* slot 127, then 0..28 */
  for (size_t i = 0; i < 4; i++) add(&ix, &ns, first[i]); /* pushed past them: 29..32 */
  cr_assert_eq(ix.cap, 128);
  cr_assert_neq(ix.slots[127], 0);
  cr_assert_eq(ix.slots[126], 0);
  for (size_t s = 0; s < 33; s++) cr_assert_neq(ix.slots[s], 0, "slot %zu", s);
  cr_assert_eq(ix.slots[33], 0);
  for (uint32_t i = 0; i < ns.n; i++) cr_assert_eq(find(&ix, &ns, ns.v[i]), i, "'%s'", ns.v[i]);
  cr_assert_eq(find(&ix, &ns, first[4]), SD_NAMEIDX_NONE);
  sd_nameidx_free(&ix);
  names_free(&ns);
}

Test(nameidx, colliding_names_survive_growth) {
  /* Same home in 256 slots (so also in 128): they collide before and after the first growth. */
  char same[60][32];
  cr_assert_eq(colliding(same, 60, 256, 200, "g"), 60);
  names ns = {0};
  sd_nameidx ix = {0};
  char buf[32];
  for (size_t i = 0; i < 60; i++) {
    add(&ix, &ns, same[i]);
    snprintf(buf, sizeof buf, "filler%zu", i);
    add(&ix, &ns, buf);
  }
  cr_assert_eq(ix.cap, 256);
  for (uint32_t i = 0; i < ns.n; i++) cr_assert_eq(find(&ix, &ns, ns.v[i]), i, "'%s'", ns.v[i]);
  sd_nameidx_free(&ix);
  names_free(&ns);
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* ------------------------------------------------------------------------ *
 * The oracle: 100,000 random names against a linear search
 * ------------------------------------------------------------------------ */
Test(nameidx, random_names_agree_with_linear_search, .timeout = 100) {
  names ns = {0};
  sd_nameidx ix = {0};
  char buf[32];
  size_t dups = 0;
  /* Many duplicates among the draws: each is inserted only when the table says it is new. */
  for (int i = 0; i < 100000; i++) {
    random_name(buf, 12);
    uint32_t k = find(&ix, &ns, buf);
    if (k == SD_NAMEIDX_NONE) {
      add(&ix, &ns, buf);
    } else {
      cr_assert_str_eq(ns.v[k], buf);
      dups++;
    }
  }
  cr_assert_gt(dups, 1000, "the alphabet gives duplicates (%zu)", dups);
  cr_assert_gt(ns.n, 50000);
  for (uint32_t i = 0; i < ns.n; i++) cr_assert_eq(find(&ix, &ns, ns.v[i]), i);

  /* No name twice in the array: sorted neighbours differ. */
  char **sorted = malloc(ns.n * sizeof *sorted);
  cr_assert_not_null(sorted);
  memcpy(sorted, ns.v, ns.n * sizeof *sorted);
  qsort(sorted, ns.n, sizeof *sorted, cmp_names);
  for (size_t i = 1; i < ns.n; i++) cr_assert_str_neq(sorted[i - 1], sorted[i]);
  free(sorted);

  /* Fresh draws (present or not), and one-byte edits of present names. */
  size_t hits = 0, misses = 0;
  for (int q = 0; q < 3000; q++) {
    if (q % 2) {
      random_name(buf, 14);
    } else {
      const char *src = ns.v[rnd() % ns.n];
      size_t len = strlen(src);
      memcpy(buf, src, len + 1);
      if (q % 4 == 0) buf[rnd() % len] ^= 1;
    }
    uint32_t want = linear(&ns, buf);
    cr_assert_eq(find(&ix, &ns, buf), want, "'%s'", buf);
    if (want == SD_NAMEIDX_NONE) misses++;
    else hits++;
  }
  cr_assert_gt(hits, 500);
  cr_assert_gt(misses, 200);
  sd_nameidx_free(&ix);
  names_free(&ns);
}

/* SD_NAMED_TABLE: the table save_request.c and cluster_plan.c keep their tensors in. */
typedef struct {
  char *name;
  int value;
} rec;

typedef struct {
  rec **recs;
  size_t nrecs, rcap;
  sd_nameidx idx;
} owner;

SD_NAMED_TABLE(rec, owner, rec, recs, nrecs, rcap, idx, 2)

Test(nameidx, named_table_keeps_order_and_finds_by_name) {
  owner o = {0};
  rec r[40];
  char names_[40][16];
  for (int i = 0; i < 40; i++) {
    snprintf(names_[i], sizeof names_[i], "t.%d", 39 - i);
    r[i] = (rec){names_[i], i};
    cr_assert_eq(rec_add(&o, &r[i]), 0);
  }
  cr_assert_eq(o.nrecs, 40);
  cr_assert_geq(o.rcap, 40);
  for (int i = 0; i < 40; i++) {
    cr_assert_eq(o.recs[i], &r[i], "the order of first add is kept");
    rec *f = rec_find(&o, names_[i]);
    cr_assert(f && f->value == i, "'%s' found", names_[i]);
  }
  cr_assert_null(rec_find(&o, "t.40"));
  sd_nameidx_free(&o.idx);
  free(o.recs);
}

static size_t reads;
static const char *counted_name_at(const void *ctx, uint32_t i) {
  reads++;
  return name_at(ctx, i);
}

/* Each slot keeps a tag of its name's hash: growing reads no name, and a lookup reads about one. */
Test(nameidx, names_are_read_only_where_the_hash_tags_agree) {
  names ns = {0};
  sd_nameidx ix = {0};
  char buf[64];
  reads = 0;
  for (int i = 0; i < 5000; i++) {
    snprintf(buf, sizeof buf, "model.layers.%d.mlp.experts.%d.down_proj.weight", i / 64, i % 64);
    names_push(&ns, buf);
    cr_assert_eq(sd_nameidx_insert(&ix, buf, (uint32_t)i, counted_name_at, &ns), 0);
  }
  cr_assert_eq(reads, 0, "inserting and growing read %zu names", reads);
  for (int i = 0; i < 5000; i++) cr_assert_eq(sd_nameidx_find(&ix, ns.v[i], counted_name_at, &ns), (uint32_t)i);
  cr_assert_lt(reads, 5100, "5000 hits read %zu names", reads);
  reads = 0;
  for (int i = 0; i < 5000; i++) {
    snprintf(buf, sizeof buf, "model.layers.%d.mlp.experts.%d.up_proj.weight", i / 64, i % 64);
    cr_assert_eq(sd_nameidx_find(&ix, buf, counted_name_at, &ns), SD_NAMEIDX_NONE);
  }
  cr_assert_lt(reads, 50, "5000 misses read %zu names", reads);
  sd_nameidx_free(&ix);
  names_free(&ns);
}

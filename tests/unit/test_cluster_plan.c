/* The leader's planner: file owners, replica choice, forwarding, shared mode, and errors naming tensors and nodes. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_plan.h"

/* A row split of a [rows, cols] F32 tensor: one slice of `n` rows starting at `r0`. */
static void rows(sd_cmanifest *m, const char *name, uint64_t R, uint64_t C, uint64_t r0, uint64_t n, uint32_t node,
                 uint32_t rank, uint64_t id, int64_t index) {
  uint64_t shape[2] = {R, C}, start[2] = {r0, 0}, count[2] = {n, C};
  sd_error err = {0};
  cr_assert_eq(sd_cmanifest_slice(m, name, SD_DT_F32, 2, shape, index, node, rank, id, start, count, &err), 0, "%s",
               err.msg);
}

static sd_plan_opts opts(uint64_t mss) {
  sd_plan_opts o = {.max_shard_size = mss, .prefix = "model"};
  return o;
}

static uint64_t sum(const uint64_t *v, uint32_t n) {
  uint64_t s = 0;
  for (uint32_t i = 0; i < n; i++) s += v[i];
  return s;
}

/* Every kept byte is written exactly once: local + forwarded == data. */
static void check_accounting(const sd_cplan *p) {
  uint64_t data = 0, exp = 0;
  for (size_t i = 0; i < p->nwrites; i++) data += p->writes[i].len;
  for (size_t i = 0; i < (size_t)p->nnodes * p->plan.nfiles; i++) exp += p->expect[i];
  cr_assert_eq(data, p->plan.total_size);
  cr_assert_eq(exp, data);
  cr_assert_eq(sum(p->local_bytes, p->nnodes) + sum(p->fwd_bytes, p->nnodes), data);
  for (size_t f = 0; f < p->plan.nfiles; f++) {
    uint64_t in = 0;
    for (uint32_t k = 0; k < p->nnodes; k++) in += p->expect[(size_t)k * p->plan.nfiles + f];
    cr_assert_eq(in, p->plan.files[f].data_size, "file %zu: %llu bytes planned, data is %llu", f,
                 (unsigned long long)in, (unsigned long long)p->plan.files[f].data_size);
  }
}

Test(cluster_plan, pipeline_layout_writes_every_file_where_it_is_held) {
  /* 3 nodes, each holding two whole 256-byte tensors in state-dict order; a
   * shard holds exactly two tensors, so each file's bytes sit on one node. */
  sd_cmanifest m = {0};
  for (uint32_t node = 0; node < 3; node++)
    for (uint32_t j = 0; j < 2; j++) {
      char name[32];
      snprintf(name, sizeof name, "layers.%u.w", node * 2 + j);
      rows(&m, name, 8, 8, 0, 8, node, node * 2 + j, j, node * 2 + j);
    }
  sd_cplan p;
  sd_error err = {0};
  sd_plan_opts o = opts(512);
  cr_assert_eq(sd_cplan_build(&m, 3, SD_WRITE_OWNER, &o, &p, &err), 0, "%s", err.msg);
  cr_assert_eq(p.plan.nfiles, 3);
  for (uint32_t f = 0; f < 3; f++) cr_assert_eq(p.owner[f], f, "file %u belongs where its layers are", f);
  cr_assert_eq(sum(p.fwd_bytes, 3), 0, "nothing crosses the network");
  for (size_t i = 0; i < p.nwrites; i++) cr_assert_eq(p.writes[i].dest, p.writes[i].node);
  check_accounting(&p);
  sd_cplan_free(&p);
  sd_cmanifest_free(&m);
}

Test(cluster_plan, split_tensors_are_forwarded_to_the_owner) {
  /* One tensor of 6 x 4 F32 rows split over 3 nodes, 2 rows each; node 1 holds 4 rows of a second one. */
  sd_cmanifest m = {0};
  for (uint32_t node = 0; node < 3; node++) rows(&m, "a", 6, 4, 2 * node, 2, node, node, 0, 0);
  rows(&m, "b", 4, 4, 0, 4, 1, 1, 1, 1);
  sd_cplan p;
  sd_error err = {0};
  sd_plan_opts o = opts(1000);
  cr_assert_eq(sd_cplan_build(&m, 3, SD_WRITE_OWNER, &o, &p, &err), 0, "%s", err.msg);
  cr_assert_eq(p.plan.nfiles, 1);
  cr_assert_eq(p.owner[0], 1, "node 1 holds most of the file (32 + 64 bytes)");
  cr_assert_eq(p.fwd_bytes[0], 32);
  cr_assert_eq(p.fwd_bytes[2], 32);
  cr_assert_eq(p.local_bytes[1], 96);
  cr_assert_eq(p.expect[1 * 1 + 0], 160);
  check_accounting(&p);
  sd_cplan_free(&p);
  sd_cmanifest_free(&m);
}

Test(cluster_plan, replicas_prefer_the_writing_node_and_ties_balance) {
  /* Every node holds all of four equal tensors (pure data parallel). Each
   * file is a tie; bytes balance; every byte is written where it is. */
  sd_cmanifest m = {0};
  for (uint32_t node = 0; node < 3; node++)
    for (uint32_t j = 0; j < 6; j++) {
      char name[32];
      snprintf(name, sizeof name, "t%u", j);
      rows(&m, name, 4, 4, 0, 4, node, node, j, j);
    }
  sd_cplan p;
  sd_error err = {0};
  sd_plan_opts o = opts(64);
  cr_assert_eq(sd_cplan_build(&m, 3, SD_WRITE_OWNER, &o, &p, &err), 0, "%s", err.msg);
  cr_assert_eq(p.plan.nfiles, 6);
  cr_assert_eq(p.nwrites, 6, "replicas are written once");
  for (uint32_t k = 0; k < 3; k++) cr_assert_eq(p.file_bytes[k], 2 * p.plan.files[0].file_size, "node %u", k);
  cr_assert_eq(sum(p.fwd_bytes, 3), 0);
  check_accounting(&p);
  sd_cplan_free(&p);
  sd_cmanifest_free(&m);
}

Test(cluster_plan, shared_mode_forwards_nothing) {
  sd_cmanifest m = {0};
  for (uint32_t node = 0; node < 3; node++) rows(&m, "a", 6, 4, 2 * node, 2, node, node, 0, 0);
  /* a replica on nodes 0 and 2: written once, by one of them */
  rows(&m, "n", 1, 4, 0, 1, 0, 0, 1, 1);
  rows(&m, "n", 1, 4, 0, 1, 2, 2, 1, 1);
  sd_cplan p;
  sd_error err = {0};
  sd_plan_opts o = opts(1000);
  cr_assert_eq(sd_cplan_build(&m, 3, SD_WRITE_SHARED, &o, &p, &err), 0, "%s", err.msg);
  cr_assert_eq(sum(p.fwd_bytes, 3), 0);
  cr_assert_eq(p.nwrites, 4);
  for (size_t i = 0; i < p.nwrites; i++) cr_assert_eq(p.writes[i].dest, p.writes[i].node);
  /* one file: each node writes its own rows; the replica goes to the less
   * loaded of its holders (a tie between 0 and 2: the lower node) */
  cr_assert_eq(p.expect[0], 32 + 16);
  cr_assert_eq(p.expect[1], 32);
  cr_assert_eq(p.expect[2], 32);
  check_accounting(&p);
  sd_cplan_free(&p);
  sd_cmanifest_free(&m);
}

Test(cluster_plan, disagreements_name_tensor_ranks_and_nodes) {
  sd_cmanifest m = {0};
  rows(&m, "w", 4, 4, 0, 2, 0, 0, 0, -1);
  uint64_t shape[2] = {4, 5}, start[2] = {2, 0}, count[2] = {2, 5};
  sd_error err = {0};
  cr_assert_eq(sd_cmanifest_slice(&m, "w", SD_DT_F32, 2, shape, -1, 2, 5, 0, start, count, &err), SHARDD_E_MISMATCH);
  cr_assert(strstr(err.msg, "tensor 'w': rank 5 (node 2) declares F32 [4,5], rank 0 (node 0) declared F32 [4,4]"),
            "%s", err.msg);
  uint64_t s4[2] = {4, 4}, c4[2] = {2, 4};
  cr_assert_eq(sd_cmanifest_slice(&m, "w", SD_DT_BF16, 2, s4, -1, 1, 3, 0, start, c4, &err), SHARDD_E_MISMATCH);
  rows(&m, "w", 4, 4, 2, 2, 1, 2, 0, 7);
  cr_assert_eq(sd_cmanifest_slice(&m, "w", SD_DT_F32, 2, s4, 8, 1, 3, 1, start, c4, &err), SHARDD_E_MISMATCH);
  cr_assert(strstr(err.msg, "index 8"), "%s", err.msg);
  /* a box outside the shape */
  uint64_t big[2] = {3, 4};
  cr_assert_eq(sd_cmanifest_slice(&m, "w", SD_DT_F32, 2, s4, -1, 1, 3, 2, start, big, &err),
               SHARDD_E_INVALID_ARGUMENT);
  /* files: same bytes kept once, different bytes conflict */
  cr_assert_eq(sd_cmanifest_file(&m, "config.json", (const uint8_t *)"{}", 2, 0, 0, &err), 0);
  cr_assert_eq(sd_cmanifest_file(&m, "config.json", (const uint8_t *)"{}", 2, 4, 0, &err), 0);
  cr_assert_eq(m.nfiles, 1);
  cr_assert_eq(sd_cmanifest_file(&m, "config.json", (const uint8_t *)"[]", 2, 4, 0, &err), SHARDD_E_CONFLICT);
  cr_assert(strstr(err.msg, "rank 4"), "%s", err.msg);
  sd_cmanifest_free(&m);
}

/* A node whose ranks hold nothing of a tensor (a router of 8 rows over 16
 * ranks, 8 per node) still declares it; its boxes are empty, never moved. */
Test(cluster_plan, empty_slices_across_nodes) {
  for (int mode = 0; mode < 2; mode++) {
    sd_cmanifest m = {0};
    uint64_t id[2] = {0};
    for (uint32_t r = 0; r < 16; r++) {
      uint32_t node = r / 8;
      uint64_t a = 8ull * r / 16, z = 8ull * (r + 1) / 16;
      rows(&m, "router", 8, 4, a, z - a, node, r, id[node]++, 0);
    }
    /* a bias of 3 over both nodes' 4 ranks each: node 1 holds it all */
    for (uint32_t r = 0; r < 8; r++) {
      uint64_t a = r < 4 ? 0 : 3ull * (r - 4) / 4, z = r < 4 ? 0 : 3ull * (r - 3) / 4;
      uint64_t shape[1] = {3}, start[1] = {a}, count[1] = {z - a};
      sd_error err = {0};
      cr_assert_eq(sd_cmanifest_slice(&m, "bias", SD_DT_F32, 1, shape, 1, r / 4, r, id[r / 4]++, start, count, &err),
                   0, "%s", err.msg);
    }
    sd_cplan p;
    sd_error err = {0};
    sd_plan_opts o = opts(0);
    cr_assert_eq(sd_cplan_build(&m, 2, mode ? SD_WRITE_SHARED : SD_WRITE_OWNER, &o, &p, &err), 0, "%s", err.msg);
    check_accounting(&p);
    cr_assert_eq(p.nwrites, 8 + 3, "one write per non-empty slice");
    for (size_t i = 0; i < p.nwrites; i++) cr_assert_gt(p.writes[i].len, 0);
    sd_cplan_free(&p);
    sd_cmanifest_free(&m);
  }
  /* only empty boxes: a gap naming the tensor */
  sd_cmanifest m = {0};
  rows(&m, "router", 8, 4, 0, 0, 0, 0, 0, -1);
  rows(&m, "router", 8, 4, 8, 0, 1, 1, 0, -1);
  sd_cplan p;
  sd_error err = {0};
  sd_plan_opts o = opts(0);
  cr_assert_eq(sd_cplan_build(&m, 2, SD_WRITE_OWNER, &o, &p, &err), SHARDD_E_GAP);
  cr_assert_str_eq(err.msg, "tensor 'router': element [0,0] is not covered");
  /* an empty box still declares dtype and shape: a disagreement is a mismatch */
  uint64_t shape[2] = {8, 5}, start[2] = {8, 0}, count[2] = {0, 5};
  cr_assert_eq(sd_cmanifest_slice(&m, "router", SD_DT_F32, 2, shape, -1, 1, 3, 1, start, count, &err),
               SHARDD_E_MISMATCH);
  cr_assert(strstr(err.msg, "tensor 'router': rank 3 (node 1) declares F32 [8,5], rank 0 (node 0) declared F32 [8,4]"),
            "%s", err.msg);
  sd_cmanifest_free(&m);
}

Test(cluster_plan, coverage_errors_across_nodes) {
  sd_cplan p;
  sd_error err = {0};
  sd_plan_opts o = opts(0);
  /* rows 0-1 on node 0, rows 3-3 on node 1: row 2 missing */
  sd_cmanifest m = {0};
  rows(&m, "gap", 4, 2, 0, 2, 0, 0, 0, -1);
  rows(&m, "gap", 4, 2, 3, 1, 1, 1, 0, -1);
  cr_assert_eq(sd_cplan_build(&m, 2, SD_WRITE_OWNER, &o, &p, &err), SHARDD_E_GAP);
  cr_assert(strstr(err.msg, "'gap'"), "%s", err.msg);
  sd_cmanifest_free(&m);
  /* rows 0-2 and 2-3 overlap */
  sd_cmanifest m2 = {0};
  rows(&m2, "ov", 4, 2, 0, 3, 0, 0, 0, -1);
  rows(&m2, "ov", 4, 2, 2, 2, 1, 1, 0, -1);
  cr_assert_eq(sd_cplan_build(&m2, 2, SD_WRITE_OWNER, &o, &p, &err), SHARDD_E_OVERLAP);
  cr_assert(strstr(err.msg, "'ov'"), "%s", err.msg);
  sd_cmanifest_free(&m2);
  /* a file named like the index */
  sd_cmanifest m3 = {0};
  rows(&m3, "a", 2, 2, 0, 2, 0, 0, 0, 0);
  rows(&m3, "b", 2, 2, 0, 2, 1, 1, 0, 1);
  cr_assert_eq(sd_cmanifest_file(&m3, "model.safetensors.index.json", (const uint8_t *)"x", 1, 1, 0, &err), 0);
  sd_plan_opts small = opts(16);
  cr_assert_eq(sd_cplan_build(&m3, 2, SD_WRITE_OWNER, &small, &p, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "model.safetensors.index.json"), "%s", err.msg);
  sd_cmanifest_free(&m3);
  /* a slice from a node beyond nnodes */
  sd_cmanifest m4 = {0};
  rows(&m4, "a", 2, 2, 0, 2, 5, 0, 0, 0);
  cr_assert_eq(sd_cplan_build(&m4, 2, SD_WRITE_OWNER, &o, &p, &err), SHARDD_E_INVALID_ARGUMENT);
  sd_cmanifest_free(&m4);
}

Test(cluster_plan, randomized_layouts_write_every_byte_once) {
  srand(4);
  for (int iter = 0; iter < 200; iter++) {
    uint32_t nnodes = 2 + (uint32_t)(rand() % 4);
    sd_cmanifest m = {0};
    int nt = 1 + rand() % 12;
    uint64_t id[8] = {0};
    for (int t = 0; t < nt; t++) {
      char name[32];
      snprintf(name, sizeof name, "t.%d", t);
      uint64_t R = 1 + (uint64_t)(rand() % 9), C = 1 + (uint64_t)(rand() % 5);
      int replicas = 1 + rand() % 3;
      /* cut the rows into pieces; each piece held by `replicas` random nodes */
      uint64_t r0 = 0;
      while (r0 < R) {
        uint64_t n = 1 + (uint64_t)(rand() % (int)(R - r0));
        for (int k = 0; k < replicas; k++) {
          uint32_t node = (uint32_t)(rand() % (int)nnodes);
          rows(&m, name, R, C, r0, n, node, node, id[node]++, t);
        }
        r0 += n;
      }
      /* uneven splits: ranks left an empty box of the tensor, anywhere from row 0 to R */
      int empties = rand() % 3;
      for (int k = 0; k < empties; k++) {
        uint32_t node = (uint32_t)(rand() % (int)nnodes);
        rows(&m, name, R, C, (uint64_t)(rand() % (int)(R + 1)), 0, node, node, id[node]++, t);
      }
    }
    sd_cplan p;
    sd_error err = {0};
    sd_plan_opts o = opts(1 + (uint64_t)(rand() % 400));
    sd_write_mode mode = rand() % 2 ? SD_WRITE_SHARED : SD_WRITE_OWNER;
    cr_assert_eq(sd_cplan_build(&m, nnodes, mode, &o, &p, &err), 0, "iter %d: %s", iter, err.msg);
    check_accounting(&p);
    for (size_t i = 0; i < p.nwrites; i++) {
      const sd_cwrite *w = &p.writes[i];
      cr_assert_gt(w->len, 0, "an empty slice has nothing to write");
      if (mode == SD_WRITE_OWNER) cr_assert_eq(w->dest, p.owner[w->file]);
      else cr_assert_eq(w->dest, w->node);
    }
    sd_cplan_free(&p);
    sd_cmanifest_free(&m);
  }
}

/* m planned over nnodes in owner mode, shards of mss bytes. */
static void planned(sd_cmanifest *m, uint32_t nnodes, uint64_t mss, sd_cplan *p) {
  sd_error err = {0};
  sd_plan_opts o = opts(mss);
  cr_assert_eq(sd_cplan_build(m, nnodes, SD_WRITE_OWNER, &o, p, &err), 0, "%s", err.msg);
}

/* A node's done against its assignment: only its own files, each once, with the plan's bytes, and
 * with checksums one well-formed share per file in the same order. */
static const char *done_of(const sd_cplan *p, uint32_t k, const char *files, const char *sums, int with_sums) {
  static char buf[512];
  json_t *jf = json_loads(files, 0, NULL), *js = sums ? json_loads(sums, 0, NULL) : NULL;
  uint32_t shares[8];
  const char *bad = sd_cplan_done_mismatch(p, k, "run/s", jf, js, with_sums ? shares : NULL, buf, sizeof buf);
  json_decref(jf);
  json_decref(js);
  return bad;
}

Test(cluster_plan, a_done_must_match_the_assignment_exactly) {
  /* two nodes, a whole 256-byte tensor each, one file each */
  sd_cmanifest m = {0};
  rows(&m, "a", 8, 8, 0, 8, 0, 0, 0, 0);
  rows(&m, "b", 8, 8, 0, 8, 1, 1, 0, 1);
  sd_cplan p;
  planned(&m, 2, 256, &p);
  cr_assert_eq(p.plan.nfiles, 2);
  cr_assert_eq(p.owner[1], 1, "node 1 writes file 1");
  uint64_t n1 = sd_cplan_assigned(&p, 1, 1);
  cr_assert_eq(n1, p.plan.files[1].file_size, "all of it, header and data");
  cr_assert_eq(sd_cplan_assigned(&p, 1, 0), 0, "nothing of node 0's file");
  char ok[64], twice[96], other[96], bytes[64];
  snprintf(ok, sizeof ok, "[[1,%llu]]", (unsigned long long)n1);
  snprintf(twice, sizeof twice, "[[1,%llu],[1,%llu]]", (unsigned long long)n1, (unsigned long long)n1);
  snprintf(other, sizeof other, "[[0,0]]");
  snprintf(bytes, sizeof bytes, "[[1,%llu]]", (unsigned long long)n1 - 1);
  cr_assert_null(done_of(&p, 1, ok, NULL, 0));
  cr_assert_null(done_of(&p, 1, ok, "[[1,\"0badcafe\"]]", 1));
  cr_assert_str_eq(done_of(&p, 1, other, NULL, 0), "run/s/model-00001-of-00002.safetensors, which was not assigned to it");
  cr_assert(strstr(done_of(&p, 1, twice, NULL, 0), "2 files, the plan gave it 1"));
  cr_assert(strstr(done_of(&p, 1, bytes, NULL, 0), "bytes of run/s/model-00002-of-00002.safetensors, the plan gave it"));
  cr_assert_str_eq(done_of(&p, 1, "[[null,0]]", NULL, 0), "a malformed file entry (0)");
  cr_assert_str_eq(done_of(&p, 1, "[[1]]", NULL, 0), "a malformed file entry (0)");
  cr_assert_str_eq(done_of(&p, 1, "{}", NULL, 0), "0 files, the plan gave it 1");
  cr_assert_str_eq(done_of(&p, 1, ok, NULL, 1), "no checksum shares");
  cr_assert_str_eq(done_of(&p, 1, ok, "[[1,\"xyz\"]]", 1), "a malformed checksum share");
  cr_assert_str_eq(done_of(&p, 1, ok, "[[0,\"0badcafe\"]]", 1), "checksum shares for other files than it wrote");
  cr_assert_str_eq(done_of(&p, 1, ok, "[]", 1), "checksum shares for other files than it wrote");
  sd_cplan_free(&p);
  sd_cmanifest_free(&m);
}

/* A node's boxes merged along dim 0 (parts of 4 and 4 rows of an [8, 4] F32 tensor) against another
 * node's box of the first 4 rows: checked again part by part, the first part is its replica and the
 * second is written from the merged box's part alone; a box that meets neither part exactly is
 * still an overlap, named as the ranks put the boxes. */
Test(cluster_plan, merged_boxes_are_checked_part_by_part_where_they_overlap) {
  uint64_t shape[2] = {8, 4}, s0[2] = {0, 0}, c8[2] = {8, 4}, c4[2] = {4, 4}, parts[2] = {4, 4};
  sd_error err = {0};
  for (int round = 0; round < 3; round++) {
    int bad = round == 2, even = round == 1; /* even: the parts as one count, an even split */
    sd_cmanifest m = {0};
    uint32_t ti;
    cr_assert_eq(sd_cmanifest_tensor(&m, "w", SD_DT_F32, 2, shape, -1, 0, 0, &ti, &err), 0, "%s", err.msg);
    cr_assert_eq(sd_cmanifest_box(&m, ti, 0, 0, 7, s0, c8, parts, even ? 1 : 2, &err), 0, "%s", err.msg);
    uint64_t s1[2] = {bad ? 2 : 0, 0};
    cr_assert_eq(sd_cmanifest_tensor(&m, "w", SD_DT_F32, 2, shape, -1, 1, 2, &ti, &err), 0, "%s", err.msg);
    cr_assert_eq(sd_cmanifest_box(&m, ti, 1, 2, 3, s1, c4, NULL, 0, &err), 0, "%s", err.msg);
    sd_cplan p;
    sd_plan_opts o = opts(1u << 20);
    int rc = sd_cplan_build(&m, 2, SD_WRITE_OWNER, &o, &p, &err);
    if (bad) {
      cr_assert_eq(rc, SHARDD_E_OVERLAP);
      cr_assert(strstr(err.msg, "'w'") && strstr(err.msg, "start=[2,0] count=[4,4]"), "%s", err.msg);
    } else {
      cr_assert_eq(rc, 0, "%s", err.msg);
      cr_assert_eq(p.nwrites, 2, "one write per part");
      for (size_t i = 0; i < p.nwrites; i++) {
        const sd_cwrite *w = &p.writes[i];
        cr_assert_eq(w->len, 64);
        cr_assert(w->node == 0 || w->part == 0, "node 1's box is whole");
        if (w->node == 0) cr_assert(w->part == 1 || w->part == 2, "node 0 writes a part, not its merged box");
      }
      check_accounting(&p);
      sd_cplan_free(&p);
    }
    sd_cmanifest_free(&m);
  }
  /* Parts that do not add up to the box are refused. */
  sd_cmanifest m = {0};
  uint32_t ti;
  uint64_t wrong[2] = {4, 3};
  cr_assert_eq(sd_cmanifest_tensor(&m, "w", SD_DT_F32, 2, shape, -1, 0, 0, &ti, &err), 0);
  cr_assert_eq(sd_cmanifest_box(&m, ti, 0, 0, 7, s0, c8, wrong, 2, &err), SHARDD_E_INVALID_ARGUMENT);
  uint64_t one[1] = {8}; /* an even split into one part is no split */
  cr_assert_eq(sd_cmanifest_box(&m, ti, 0, 0, 7, s0, c8, one, 1, &err), SHARDD_E_INVALID_ARGUMENT);
  sd_cmanifest_free(&m);
}

/* An [8, 8] tensor `name` at `index`, rows 0-3 on node 0 (rank 0), rows 4-7 on node 1 (rank 1). */
static void halves(sd_cmanifest *m, const char *name, int64_t index) {
  rows(m, name, 8, 8, 0, 4, 0, 0, (uint64_t)index, index);
  rows(m, name, 8, 8, 4, 4, 1, 1, (uint64_t)index, index);
}

/* A tensor of another file prefix (an optimizer's) makes files of its own on the leader too, the
 * prefix agreed by every node that describes it. */
Test(cluster_plan, a_prefix_every_node_gives_makes_a_file_series_of_its_own) {
  sd_cmanifest m = {0};
  sd_error err = {0};
  halves(&m, "w", 0);
  halves(&m, "w.exp_avg", 1);
  cr_assert_eq(sd_cmanifest_prefix(&m, "w", NULL, 0, &err), 0, "%s", err.msg);
  cr_assert_eq(sd_cmanifest_prefix(&m, "w", NULL, 1, &err), 0, "%s", err.msg);
  cr_assert_eq(sd_cmanifest_prefix(&m, "w.exp_avg", "optimizer", 0, &err), 0, "%s", err.msg);
  cr_assert_eq(sd_cmanifest_prefix(&m, "w.exp_avg", "optimizer", 1, &err), 0, "%s", err.msg);
  sd_cplan p;
  sd_plan_opts o = opts(0);
  cr_assert_eq(sd_cplan_build(&m, 2, SD_WRITE_OWNER, &o, &p, &err), 0, "%s", err.msg);
  cr_assert_eq(p.plan.nfiles, 2);
  cr_assert_str_eq(p.plan.files[0].name, "model.safetensors");
  cr_assert_str_eq(p.plan.files[1].name, "optimizer.safetensors");
  cr_assert_eq(p.plan.needs_index, 1);
  check_accounting(&p);
  sd_cplan_free(&p);
  /* A node that leaves the prefix out, or gives another, disagrees. */
  cr_assert_eq(sd_cmanifest_prefix(&m, "w.exp_avg", NULL, 2, &err), SHARDD_E_MISMATCH);
  cr_assert(strstr(err.msg, "tensor 'w.exp_avg': node 2 puts it in files of prefix ''"), "%s", err.msg);
  cr_assert_eq(sd_cmanifest_prefix(&m, "w", "optim", 1, &err), SHARDD_E_MISMATCH);
  cr_assert(strstr(err.msg, "prefix 'optim', rank 0 (node 0) in ''"), "%s", err.msg);
  sd_cmanifest_free(&m);
}

/* Parts of one file from ranks on two nodes: the leader writes them joined in rank order. */
Test(cluster_plan, file_parts_from_every_node_are_joined_in_rank_order) {
  sd_cmanifest m = {0};
  sd_error err = {0};
  halves(&m, "w", 0);
  cr_assert_eq(sd_cmanifest_file(&m, "b.jsonl", (const uint8_t *)"one\n", 4, 1, 1, &err), 0, "%s", err.msg);
  cr_assert_eq(sd_cmanifest_file(&m, "b.jsonl", (const uint8_t *)"zero\n", 5, 0, 1, &err), 0, "%s", err.msg);
  /* The same part again is kept once; another part from that rank, or the name as a whole file, conflicts. */
  cr_assert_eq(sd_cmanifest_file(&m, "b.jsonl", (const uint8_t *)"one\n", 4, 1, 1, &err), 0, "%s", err.msg);
  cr_assert_eq(sd_cmanifest_file(&m, "b.jsonl", (const uint8_t *)"two\n", 4, 1, 1, &err), SHARDD_E_CONFLICT);
  cr_assert_eq(sd_cmanifest_file(&m, "b.jsonl", (const uint8_t *)"x", 1, 2, 0, &err), SHARDD_E_CONFLICT);
  cr_assert(strstr(err.msg, "file 'b.jsonl': rank 2 sends all of it, rank 1 its part"), "%s", err.msg);
  sd_cplan p;
  sd_plan_opts o = opts(0);
  cr_assert_eq(sd_cplan_build(&m, 2, SD_WRITE_OWNER, &o, &p, &err), 0, "%s", err.msg);
  cr_assert_eq(p.nartifacts, 1);
  cr_assert_eq(p.artifacts[0].len, 9);
  cr_assert_eq(memcmp(p.artifacts[0].data, "zero\none\n", 9), 0);
  cr_assert_eq(p.nfiles_total, 2);
  cr_assert_eq(p.total_bytes, p.plan.files[0].file_size + 9);
  sd_cplan_free(&p);
  sd_cmanifest_free(&m);
}

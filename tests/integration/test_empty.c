/* Empty slices through a real daemon: uneven splits leave ranks an empty box, or nothing at all; bytes checked on disk. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"
#include "xclient.h"

TestSuite(empty, .init = h_setup, .fini = h_teardown, .timeout = 200);

#define BOX1(r, nm, dt, s0, a0, c0, hw) \
  {.rank = (r), .name = (nm), .dtype = (dt), .ndim = 1, .shape = {(s0)}, .boxed = 1, .start = {(a0)}, \
   .count = {(c0)}, .how = (hw)}
#define BOX2(r, nm, dt, s0, s1, a0, a1, c0, c1, hw)                                                        \
  {.rank = (r), .name = (nm), .dtype = (dt), .ndim = 2, .shape = {(s0), (s1)}, .boxed = 1,                \
   .start = {(a0), (a1)}, .count = {(c0), (c1)}, .how = (hw)}

/* Every rank's report is clean and the committed bytes equal what ranks sent. */
static void expect_exact(h_script *s) {
  for (int r = 0; r < s->opts.world_size; r++)
    cr_assert_eq(s->sh->r[r].rc, 0, "rank %d %s: %s", r, s->sh->r[r].step, s->sh->r[r].msg);
  h_expect_committed(s);
  h_check_script(s);
}

/* ------------------------------------------------------------------------ *
 * Uneven splits on one node
 * ------------------------------------------------------------------------ */
/* torch.tensor_split of a bias of 3 over 4 ranks (the last one gets [3, 3)),
 * DTensor Shard(1) of 2 columns over 3 ranks (the third gets none), an
 * empty box in the middle of a 3-d tensor; rank 3 holds nothing of `cols`
 * at all. Each way of putting carries an empty slice. */
Test(empty, uneven_splits_three_over_four_and_two_columns_over_three) {
  static const h_put puts[] = {
      BOX1(0, "model.layers.0.router.bias", "F32", 3, 0, 1, H_ARENA),
      BOX1(1, "model.layers.0.router.bias", "F32", 3, 1, 1, H_COPY),
      BOX1(2, "model.layers.0.router.bias", "F32", 3, 2, 1, H_INLINE),
      BOX1(3, "model.layers.0.router.bias", "F32", 3, 3, 0, H_ARENA),
      BOX2(0, "cols", "BF16", 5, 2, 0, 0, 5, 1, H_ARENA),
      BOX2(1, "cols", "BF16", 5, 2, 0, 1, 5, 1, H_ARENA),
      BOX2(2, "cols", "BF16", 5, 2, 0, 2, 5, 0, H_COPY),
      {.rank = 0, .name = "x3", .dtype = "I16", .ndim = 3, .shape = {2, 3, 4}, .boxed = 1, .start = {0, 0, 0},
       .count = {2, 2, 4}},
      {.rank = 1, .name = "x3", .dtype = "I16", .ndim = 3, .shape = {2, 3, 4}, .boxed = 1, .start = {0, 2, 0},
       .count = {2, 1, 4}},
      {.rank = 2, .name = "x3", .dtype = "I16", .ndim = 3, .shape = {2, 3, 4}, .boxed = 1, .start = {0, 1, 0},
       .count = {2, 0, 4}, .how = H_INLINE},
      {.rank = 3, .name = "x3", .dtype = "I16", .ndim = 3, .shape = {2, 3, 4}, .boxed = 1, .start = {1, 1, 1},
       .count = {1, 2, 0}, .how = H_COPY},
      /* a zero-size tensor beside them still works as before */
      {.rank = -1, .name = "zero", .dtype = "F32", .ndim = 2, .shape = {0, 4}},
      {.rank = -1, .name = "dense", .dtype = "F64", .ndim = 2, .shape = {4, 3}},
  };
  h_script s = {.opts = {.save = "uneven", .dir = "ck/uneven", .world_size = 4},
                .puts = puts, .nputs = sizeof puts / sizeof puts[0], .seed = 61};
  h_run(&s);
  expect_exact(&s);
  cr_assert_eq(s.sh->r[0].res.tensors, 5);
  sd_ckpt c;
  h_ckpt_read("ck/uneven", &c);
  cr_assert_eq(c.total_size, 3 * 4 + 5 * 2 * 2 + 2 * 3 * 4 * 2 + 4 * 3 * 8, "every byte once (%llu)",
               (unsigned long long)c.total_size);
  sd_ckpt_free(&c);
  h_shared_free(s.sh);
}

/* DTensor Shard(0) of a router of 8 experts over 16 ranks: ranks 8-15 get
 * start 8, count 0 of it and of its bias, and hold only a replica besides. */
Test(empty, eight_rows_over_sixteen_ranks) {
  static h_put puts[3 * 16];
  size_t n = 0;
  for (int r = 0; r < 16; r++) {
    uint64_t a = r < 8 ? (uint64_t)r : 8, c = r < 8 ? 1 : 0;
    int how = r % 3 == 0 ? H_ARENA : r % 3 == 1 ? H_COPY : H_INLINE;
    puts[n++] = (h_put)BOX2(r, "mlp.router.weight", "BF16", 8, 16, a, 0, c, 16, how);
    puts[n++] = (h_put)BOX1(r, "mlp.router.bias", "F32", 8, a, c, how);
    puts[n++] = (h_put){.rank = r, .name = "norm", .dtype = "F32", .ndim = 1, .shape = {16}};
  }
  h_script s = {.opts = {.save = "router", .dir = "ck/router", .world_size = 16},
                .puts = puts, .nputs = n, .seed = 62};
  h_run(&s);
  expect_exact(&s);
  h_shared_free(s.sh);
}

/* A rank may put only empty boxes; it then needs no shared memory at all
 * (arena_if_bytes: it creates none and its puts name no region). */
Test(empty, a_rank_putting_only_empty_boxes_needs_no_arena) {
  static const h_put puts[] = {
      BOX2(0, "w", "F32", 6, 4, 0, 0, 3, 4, H_ARENA),
      BOX2(1, "w", "F32", 6, 4, 3, 0, 3, 4, H_COPY),
      BOX2(2, "w", "F32", 6, 4, 6, 0, 0, 4, H_ARENA),
      BOX2(2, "w", "F32", 6, 4, 2, 1, 3, 0, H_COPY),
      BOX1(0, "b", "U8", 5, 0, 5, H_INLINE),
      BOX1(2, "b", "U8", 5, 5, 0, H_INLINE),
      BOX1(2, "b", "U8", 5, 0, 0, H_ARENA),
  };
  static const h_file files[] = {{.rank = 2, .path = "config.json", .data = "{}\n", .len = 3}};
  h_script s = {.opts = {.save = "onlyempty", .dir = "ck/onlyempty", .world_size = 3},
                .puts = puts, .nputs = sizeof puts / sizeof puts[0], .files = files, .nfiles = 1,
                .seed = 63, .arena_if_bytes = 1};
  h_run(&s);
  expect_exact(&s);
  cr_assert_eq(s.sh->r[2].shm[0], 0, "rank 2 created no arena");
  cr_assert_eq(s.sh->r[2].res.files, 2, "shard + config.json");
  h_shared_free(s.sh);
}

/* ------------------------------------------------------------------------ *
 * What an empty box still says: the tensor's dtype and shape
 * ------------------------------------------------------------------------ */
Test(empty, a_shape_or_dtype_mismatch_on_an_empty_box_fails_the_save) {
  static const h_put shape_puts[] = {
      BOX1(0, "model.layers.0.router.bias", "F32", 3, 0, 3, H_ARENA),
      BOX1(1, "model.layers.0.router.bias", "F32", 4, 4, 0, H_INLINE),
  };
  h_script s = {.opts = {.save = "shape", .dir = "ck/shape", .world_size = 2}, .puts = shape_puts, .nputs = 2,
                .seed = 64, .wait_after_fail = 1};
  h_run(&s);
  h_expect_failed(&s, SHARDD_E_MISMATCH, "tensor 'model.layers.0.router.bias'", "[4]", "[3]", (char *)NULL);
  h_expect_unpublished("ck/shape");
  h_shared_free(s.sh);

  static const h_put dtype_puts[] = {
      BOX2(0, "cols", "BF16", 5, 2, 0, 0, 5, 2, H_ARENA),
      BOX2(1, "cols", "F16", 5, 2, 0, 2, 5, 0, H_ARENA),
  };
  h_script t = {.opts = {.save = "dtype", .dir = "ck/dtype", .world_size = 2}, .puts = dtype_puts, .nputs = 2,
                .seed = 65, .wait_after_fail = 1};
  h_run(&t);
  h_expect_failed(&t, SHARDD_E_MISMATCH, "tensor 'cols'", "F16", "BF16", (char *)NULL);
  h_expect_unpublished("ck/dtype");
  h_shared_free(t.sh);
  h_expect_serving();
}

/* Only empty boxes cover the tensor: a gap naming it, and nothing published. */
Test(empty, a_tensor_covered_only_by_empty_boxes_is_a_gap) {
  static const h_put puts[] = {
      BOX1(0, "model.layers.0.router.bias", "F32", 3, 3, 0, H_ARENA),
      BOX1(1, "model.layers.0.router.bias", "F32", 3, 0, 0, H_INLINE),
      BOX1(1, "fine", "F32", 3, 0, 3, H_INLINE),
  };
  h_script s = {.opts = {.save = "gap", .dir = "ck/gap", .world_size = 2}, .puts = puts, .nputs = 3,
                .seed = 66, .wait_after_fail = 1};
  h_run(&s);
  h_expect_failed(&s, SHARDD_E_GAP, "tensor 'model.layers.0.router.bias': element [0] is not covered",
                  (char *)NULL);
  h_expect_unpublished("ck/gap");
  h_shared_free(s.sh);
  h_expect_serving();
}

/* ------------------------------------------------------------------------ *
 * The protocol by hand: what an empty put needs (no region, no offset, no
 * data; or a region with an offset within it), and the bounds kept
 * ------------------------------------------------------------------------ */
Test(empty, raw_protocol_puts_of_empty_slices) {
  char shm[64];
  snprintf(shm, sizeof shm, "/shardd-it-empty-%d", (int)getpid());
  uint8_t *map = NULL;
  int fd = x_shm_create(shm, 16, 3, &map);
  x_conn *c = x_connect();
  json_t *r = x_callf(c, "{\"op\":\"attach\",\"id\":1,\"shm\":\"%s\"}", shm);
  cr_assert(json_is_true(json_object_get(r, "ok")));
  json_decref(r);
  x_ok(x_call(c, "{\"op\":\"begin\",\"save\":\"raw\",\"dir\":\"ck/raw\",\"rank\":0,\"world_size\":1}"), "begin");
  static const char *const fine[] = {
      /* no source at all */
      "{\"op\":\"put\",\"save\":\"raw\",\"name\":\"b\",\"dtype\":\"F32\",\"shape\":[4],\"start\":[4],\"count\":[0]}",
      /* a region, the offset at its very end */
      "{\"op\":\"put\",\"save\":\"raw\",\"name\":\"b\",\"dtype\":\"F32\",\"shape\":[4],\"start\":[0],\"count\":[0],"
      "\"region\":1,\"offset\":16}",
      /* deferred, with and without a region: nothing to wait for */
      "{\"op\":\"put\",\"save\":\"raw\",\"name\":\"b\",\"dtype\":\"F32\",\"shape\":[4],\"start\":[2],\"count\":[0],"
      "\"region\":1,\"offset\":7,\"deferred\":true}",
      "{\"op\":\"put\",\"save\":\"raw\",\"name\":\"b\",\"dtype\":\"F32\",\"shape\":[4],\"start\":[1],\"count\":[0],"
      "\"deferred\":true}",
      /* inline, zero bytes */
      "{\"op\":\"put\",\"save\":\"raw\",\"name\":\"b\",\"dtype\":\"F32\",\"shape\":[4],\"start\":[3],\"count\":[0],"
      "\"data\":\"\"}",
      /* the bytes: the whole tensor from the region */
      "{\"op\":\"put\",\"save\":\"raw\",\"name\":\"b\",\"dtype\":\"F32\",\"shape\":[4],\"region\":1,\"offset\":0}",
  };
  for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++) {
    r = x_call(c, fine[i]);
    cr_assert(json_is_true(json_object_get(r, "ok")), "put %zu: %s", i, json_dumps(r, 0));
    cr_assert_eq(json_integer_value(json_object_get(r, "bytes")), i + 1 < sizeof fine / sizeof fine[0] ? 0 : 16);
    json_decref(r);
  }
  /* refused, the save unharmed */
  x_err(x_call(c, "{\"op\":\"put\",\"save\":\"raw\",\"name\":\"b\",\"dtype\":\"F32\",\"shape\":[4],\"start\":[5],"
                  "\"count\":[0]}"),
        "invalid_argument", "lies outside shape [4]", "an empty box past the end");
  x_err(x_call(c, "{\"op\":\"put\",\"save\":\"raw\",\"name\":\"b\",\"dtype\":\"F32\",\"shape\":[4],\"start\":[0],"
                  "\"count\":[0],\"region\":1,\"offset\":17}"),
        "out_of_range", "region 1", "an offset past the region");
  x_err(x_call(c, "{\"op\":\"put\",\"save\":\"raw\",\"name\":\"b\",\"dtype\":\"F32\",\"shape\":[4],\"start\":[0],"
                  "\"count\":[0],\"region\":9,\"offset\":0}"),
        "no_such_region", NULL, "an unknown region");
  x_err(x_call(c, "{\"op\":\"put\",\"save\":\"raw\",\"name\":\"b\",\"dtype\":\"F32\",\"shape\":[4],\"start\":[0],"
                  "\"count\":[0],\"region\":1}"),
        "invalid_argument", "'offset'", "a region without an offset");
  x_err(x_call(c, "{\"op\":\"put\",\"save\":\"raw\",\"name\":\"b\",\"dtype\":\"F32\",\"shape\":[4],\"start\":[0],"
                  "\"count\":[0],\"data\":\"AAAA\"}"),
        "invalid_argument", "the slice needs 0", "inline bytes for an empty slice");
  x_ok(x_call(c, "{\"op\":\"seal\",\"save\":\"raw\"}"), "seal");
  r = x_call(c, "{\"op\":\"wait\",\"save\":\"raw\"}");
  cr_assert_str_eq(json_string_value(json_object_get(r, "state")), "committed", "%s", json_dumps(r, 0));
  json_decref(r);
  h_check_bytes("ck/raw", "b", map, 16);
  /* A shape mismatch given by an empty box fails the save, naming the tensor. */
  x_ok(x_call(c, "{\"op\":\"begin\",\"save\":\"raw2\",\"dir\":\"ck/raw2\",\"rank\":0,\"world_size\":1}"), "begin");
  x_ok(x_call(c, "{\"op\":\"put\",\"save\":\"raw2\",\"name\":\"b\",\"dtype\":\"F32\",\"shape\":[4],\"region\":1,"
                 "\"offset\":0}"),
       "put");
  x_err(x_call(c, "{\"op\":\"put\",\"save\":\"raw2\",\"name\":\"b\",\"dtype\":\"F32\",\"shape\":[5],\"start\":[5],"
                  "\"count\":[0]}"),
        "mismatch", "tensor 'b'", "an empty box of another shape");
  x_err(x_call(c, "{\"op\":\"wait\",\"save\":\"raw2\"}"), "mismatch", "tensor 'b'", "the save failed");
  h_expect_unpublished("ck/raw2");
  x_close(c);
  munmap(map, 16);
  close(fd);
  shm_unlink(shm);
}

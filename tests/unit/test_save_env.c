/* shardd_save_opts_from_env: torchrun-style variables to rank, world size and multi-node topology. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "shardd/shardd.h"

static void clear_env(void) {
  const char *vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NNODES", "GROUP_WORLD_SIZE",
                        "NODE_RANK", "GROUP_RANK", "MASTER_ADDR", "SHARDD_PEER_PORT", "SHARDD_LEADER"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

TestSuite(save_env, .init = clear_env);

Test(save_env, one_node) {
  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "4", 1);
  shardd_save_opts o = {.save = "s", .dir = "d"};
  char buf[64];
  cr_assert_eq(shardd_save_opts_from_env(&o, buf, sizeof buf), 0, "%s", shardd_last_error(NULL));
  cr_assert_eq(o.rank, 3);
  cr_assert_eq(o.world_size, 4);
  cr_assert_eq(o.nnodes, 1);
  cr_assert_null(o.leader);
  cr_assert_str_eq(o.save, "s", "other fields are left alone");
}

Test(save_env, torchrun_multi_node) {
  setenv("RANK", "9", 1);
  setenv("WORLD_SIZE", "16", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("LOCAL_WORLD_SIZE", "8", 1);
  setenv("GROUP_RANK", "1", 1);
  setenv("MASTER_ADDR", "node-a.cluster", 1);
  shardd_save_opts o = {0};
  char buf[64];
  /* No NNODES: GROUP_WORLD_SIZE, else WORLD_SIZE / LOCAL_WORLD_SIZE. */
  cr_assert_eq(shardd_save_opts_from_env(&o, buf, sizeof buf), 0, "%s", shardd_last_error(NULL));
  cr_assert_eq(o.nnodes, 2);
  cr_assert_eq(o.node_rank, 1);
  cr_assert_str_eq(o.leader, "node-a.cluster:7077");
  setenv("NNODES", "4", 1);
  setenv("NODE_RANK", "3", 1);
  setenv("SHARDD_PEER_PORT", "9000", 1);
  setenv("MASTER_ADDR", "fd00::1", 1);
  cr_assert_eq(shardd_save_opts_from_env(&o, buf, sizeof buf), 0, "%s", shardd_last_error(NULL));
  cr_assert_eq(o.nnodes, 4);
  cr_assert_eq(o.node_rank, 3);
  cr_assert_str_eq(o.leader, "[fd00::1]:9000");
  setenv("SHARDD_LEADER", "10.0.0.1:7100", 1);
  cr_assert_eq(shardd_save_opts_from_env(&o, buf, sizeof buf), 0);
  cr_assert_str_eq(o.leader, "10.0.0.1:7100");
}

Test(save_env, errors_name_the_variable) {
  shardd_save_opts o = {0};
  char buf[64];
  cr_assert_eq(shardd_save_opts_from_env(&o, buf, sizeof buf), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(shardd_last_error(NULL), "RANK"), "%s", shardd_last_error(NULL));
  setenv("RANK", "2", 1);
  setenv("WORLD_SIZE", "two", 1);
  cr_assert_eq(shardd_save_opts_from_env(&o, buf, sizeof buf), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(shardd_last_error(NULL), "WORLD_SIZE='two'"), "%s", shardd_last_error(NULL));
  setenv("WORLD_SIZE", "4", 1);
  setenv("NNODES", "2", 1);
  cr_assert_eq(shardd_save_opts_from_env(&o, buf, sizeof buf), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(shardd_last_error(NULL), "NODE_RANK"), "%s", shardd_last_error(NULL));
  setenv("NODE_RANK", "1", 1);
  cr_assert_eq(shardd_save_opts_from_env(&o, buf, sizeof buf), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(shardd_last_error(NULL), "MASTER_ADDR"), "%s", shardd_last_error(NULL));
  setenv("MASTER_ADDR", "a-very-long-host-name-that-does-not-fit", 1);
  char small[16];
  cr_assert_eq(shardd_save_opts_from_env(&o, small, sizeof small), SHARDD_E_INVALID_ARGUMENT);
  setenv("NODE_RANK", "2", 1);
  cr_assert_eq(shardd_save_opts_from_env(&o, buf, sizeof buf), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(shardd_last_error(NULL), "NODE_RANK=2"), "%s", shardd_last_error(NULL));
}

/* Prints, as JSON, what the Python binding re-declares from C: shardd.h's struct layouts, the dtype table, and which save ids the request parser takes. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "sd_format.h"
#include "sd_request.h"
#include "shardd/shardd.h"

/* One struct: its size and each field's offset, as "name": [offset, size]. */
#define FIELD(t, f) printf("%s\"%s\": [%zu, %zu]", first ? "" : ", ", #f, offsetof(t, f), sizeof(((t *)0)->f)), first = 0
#define STRUCT(t, body)                                                   \
  do {                                                                    \
    int first = 1;                                                        \
    printf("%s\"%s\": {\"sizeof\": %zu, \"fields\": {", sep, #t, sizeof(t)); \
    body;                                                                 \
    printf("}}");                                                         \
    sep = ", ";                                                           \
  } while (0)

int main(int argc, char **argv) {
  const char *sep = "";
  printf("{\"structs\": {");
  STRUCT(shardd_save_opts, FIELD(shardd_save_opts, save); FIELD(shardd_save_opts, dir);
         FIELD(shardd_save_opts, rank); FIELD(shardd_save_opts, world_size);
         FIELD(shardd_save_opts, max_shard_size); FIELD(shardd_save_opts, prefix);
         FIELD(shardd_save_opts, metadata); FIELD(shardd_save_opts, nmetadata);
         FIELD(shardd_save_opts, overwrite); FIELD(shardd_save_opts, nnodes);
         FIELD(shardd_save_opts, node_rank); FIELD(shardd_save_opts, leader);
         FIELD(shardd_save_opts, write_mode); FIELD(shardd_save_opts, keep_last);
         FIELD(shardd_save_opts, join_timeout); FIELD(shardd_save_opts, idle_timeout);
         FIELD(shardd_save_opts, total_parameters));
  STRUCT(shardd_tensor_desc, FIELD(shardd_tensor_desc, name); FIELD(shardd_tensor_desc, dtype);
         FIELD(shardd_tensor_desc, ndim); FIELD(shardd_tensor_desc, shape); FIELD(shardd_tensor_desc, start);
         FIELD(shardd_tensor_desc, count); FIELD(shardd_tensor_desc, index));
  STRUCT(shardd_result, FIELD(shardd_result, dir); FIELD(shardd_result, files); FIELD(shardd_result, tensors);
         FIELD(shardd_result, bytes));
  STRUCT(shardd_tensor_info, FIELD(shardd_tensor_info, name); FIELD(shardd_tensor_info, dtype);
         FIELD(shardd_tensor_info, ndim); FIELD(shardd_tensor_info, shape); FIELD(shardd_tensor_info, nbytes);
         FIELD(shardd_tensor_info, file));
  printf("}, \"dtypes\": {");
  for (unsigned i = 0; i < SD_DT__COUNT; i++)
    printf("%s\"%s\": %u", i ? ", " : "", sd_dtype_name((sd_dtype)i), sd_dtype_size((sd_dtype)i));
  /* The ids to judge come as arguments, so the Python side picks the hard cases. */
  printf("}, \"save_ids\": {");
  for (int i = 1; i < argc; i++) {
    sd_error err = {0};
    printf("%s\"%s\": %s", i > 1 ? ", " : "", argv[i], sd_save_id_check(argv[i], &err) == 0 ? "true" : "false");
  }
  printf("}}\n");
  return 0;
}

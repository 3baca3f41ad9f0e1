/* bench_cluster's model: DeepSeek-V3's tensor table (names, dtypes, shapes; every dim divided by a factor) and each rank's boxes of it in a real parallel layout. */
#ifndef SD_BENCH_CLUSTER_MODEL_H
#define SD_BENCH_CLUSTER_MODEL_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  char *name;
  const char *dtype;       /* "BF16", "F8_E4M3", "F32" */
  unsigned esize;
  int ndim;
  uint64_t shape[2];       /* scaled */
  int layer;               /* transformer layer, -1 for embed/norm/head */
  int expert;              /* routed expert, -1 otherwise */
} cm_tensor;

typedef struct {
  cm_tensor *t;
  size_t n;
  uint64_t bytes;          /* of the scaled model */
  int layers;
} cm_model;

/* DeepSeek-V3 (config of deepseek-ai/DeepSeek-V3: 61 layers, the first 3 dense, 256 routed experts
 * and one shared per MoE layer, MLA attention, one multi-token-prediction layer as layer 61; 163,840
 * of vocabulary rounded as the checkpoint has it, 129,280), with fp8 = 1 every 2-d linear weight in
 * F8_E4M3 with its F32 weight_scale_inv over 128 x 128 blocks (the released checkpoint), else every
 * tensor BF16. Dims divided by factor (rounded up, at least 1); layers < 62 keeps the first ones
 * (a small case). */
int cm_deepseek_v3(cm_model *m, unsigned factor, int fp8, int layers);
void cm_free(cm_model *m);

enum { CM_FSDP, CM_HSDP, CM_EP };
/* Rank r of world (nodes x per_node)'s box of tensor t: start[], count[] (an empty box has a
 * zero count). FSDP: dim 0 chunked over every rank as torch.chunk does (ceil, the last ranks may
 * get nothing). HSDP: chunked over the per_node ranks of a node, every node a replica.
 * EP: pipeline stages of whole layers (PP = per_node ... see cluster_model.c) and experts over
 * the expert-parallel ranks; what a rank does not hold it does not declare (returns 0). Returns
 * 1 when the rank declares the tensor. */
int cm_box(int layout, const cm_model *m, size_t t, int rank, int nodes, int per_node, uint64_t *start,
           uint64_t *count);
const char *cm_layout_name(int layout);

#endif

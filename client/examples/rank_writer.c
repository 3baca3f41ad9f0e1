/* shardd-example-rank: one training rank handing its tensor-parallel slices of a synthetic Llama model to shardd. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "shardd/shardd.h"
#include "synth.h"

/* ------------------------------------------------------------------------ *
 * Options
 * ------------------------------------------------------------------------ */
typedef struct {
  const char *socket, *save, *dir, *dtype, *file, *leader;
  int rank, world_size, tp, nnodes, node_rank, split_inner, split_dim0;
  uint64_t hidden, layers, vocab, intermediate, max_shard_size, seed;
  int no_wait, kill_before_seal, start_barrier, stream, place, repeat, overwrite, keep_last;
} opts;

static void usage(FILE *f) {
  fprintf(f,
          "usage: shardd-example-rank [options]\n"
          "  --socket PATH         daemon socket (default $SHARDD_SOCKET or " SHARDD_DEFAULT_SOCKET ")\n"
          "  --save ID             save id shared by all ranks (default example)\n"
          "  --dir REL             checkpoint folder relative to the daemon root (default example)\n"
          "  --rank R              this rank (default 0)\n"
          "  --world-size W        ranks in the save, W = TP x DP (default 1)\n"
          "  --tp T                tensor-parallel degree (default 1)\n"
          "  --hidden H            hidden size (default 256)\n"
          "  --layers L            decoder layers (default 2)\n"
          "  --vocab V             vocabulary size (default 1000)\n"
          "  --intermediate I      MLP size (default 688)\n"
          "  --dtype D             BF16, F32 or any whole-byte safetensors dtype (default BF16)\n"
          "  --max-shard-size N    bytes per shard file (default: the daemon's, 5e9)\n"
          "  --seed S              content seed (default 0)\n"
          "  --split-inner         split every matrix along its inner dimension (rows interleave\n"
          "                        in the file: the daemon copies, a copy-bound case)\n"
          "  --split-dim0          split every matrix along its first dimension (FSDP-like: each\n"
          "                        rank's piece is one contiguous stretch of the file)\n"
          "  --nnodes N --node-rank K --leader HOST:PORT\n"
          "                        a multi-node save: N daemons, this rank's is node K\n"
          "  --file NAME           rank 0 also writes a Llama config.json-style file named NAME\n"
          "  --overwrite           replace DIR if it holds a checkpoint (swapped in atomically)\n"
          "  --keep-last N         once committed, keep only the newest N checkpoints beside DIR\n"
          "  --no-wait             seal, then exit without waiting for the commit\n"
          "  --kill-before-seal    put everything, then exit(3) without sealing\n"
          "  --stream              put every slice deferred, say 'declared', then copy and send\n"
          "                        'ready' every 64 MiB: the daemon writes while this rank copies\n"
          "  --place               arena offsets from shardd_place: whole tensors and dim-0 pieces\n"
          "                        lie congruent to their file offsets, so the daemon writes them\n"
          "                        with no copy (zero-copy placement)\n"
          "  --start-barrier       once connected, print 'ready' and wait for a line on stdin\n"
          "                        before each of the two memcpy baseline passes and before each\n"
          "                        save (2 + N times), so ranks do each together as a trainer's\n"
          "                        ranks do at a checkpoint step (EOF: exit 1)\n"
          "  --repeat N            save N times over the same connection and arena (a trainer\n"
          "                        saving every N steps); saves 1..N-1 go to DIR.wK as SAVE.wK,\n"
          "                        each after its own start signal; the last save's times print\n"
          "Prints one JSON line: rank, bytes, blocked_s (begin+puts+seal, copies included),\n"
          "memcpy_s (the faster of two plain memcpys of the same bytes into the arena), state, files.\n");
}

static int parse_u64(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  if (!s || !*s || *s == '-') return -1;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end) return -1;
  *out = v;
  return 0;
}

static int parse_int(const char *s, int *out) {
  uint64_t v;
  if (parse_u64(s, &v) || v > 1000000) return -1;
  *out = (int)v;
  return 0;
}

static const struct {
  const char *name;
  unsigned size;
  const char *torch;
} dtypes[] = {
    {"BF16", 2, "bfloat16"}, {"F16", 2, "float16"},   {"F32", 4, "float32"},
    {"F64", 8, "float64"},   {"I8", 1, "int8"},       {"U8", 1, "uint8"},
    {"BOOL", 1, "bool"},     {"I16", 2, "int16"},     {"U16", 2, "uint16"},
    {"I32", 4, "int32"},     {"U32", 4, "uint32"},    {"I64", 8, "int64"},
    {"U64", 8, "uint64"},    {"C64", 8, "complex64"}, {"F8_E5M2", 1, "float8_e5m2"},
    {"F8_E4M3", 1, "float8_e4m3fn"}, {"F8_E8M0", 1, "float8_e8m0fnu"},
    {"F8_E4M3FNUZ", 1, "float8_e4m3fnuz"}, {"F8_E5M2FNUZ", 1, "float8_e5m2fnuz"},
};

static int find_dtype(const char *s) {
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (strcmp(s, dtypes[i].name) == 0) return (int)i;
  return -1;
}

/* ------------------------------------------------------------------------ *
 * The model: which slice of which tensor this rank holds
 * ------------------------------------------------------------------------ */
typedef struct {
  char name[96];
  int ndim;
  uint64_t shape[2], start[2], count[2];
  int64_t index;       /* state-dict position, so shards follow HF's order */
  uint64_t nbytes;     /* of this rank's slice */
  uint64_t offset;     /* in the private copy (and the arena, unless placed) */
  uint64_t aoff;       /* in the arena */
} slice;

typedef struct {
  slice *v;
  size_t n, cap;
  uint64_t total;      /* arena bytes, with alignment */
  uint64_t model_bytes; /* bytes of the whole (global) model */
} slices;

enum { REPLICATED = -1 };

/* Rank t of tp gets [n*t/tp, n*(t+1)/tp): balanced, and uneven sizes work. */
static void split(uint64_t n, int tp, int t, uint64_t *s, uint64_t *c) {
  uint64_t a = n * (uint64_t)t / (uint64_t)tp, b = n * (uint64_t)(t + 1) / (uint64_t)tp;
  *s = a;
  *c = b - a;
}

static void add(slices *ss, const opts *o, int tp_rank, unsigned esize, const char *name, int ndim,
                uint64_t d0, uint64_t d1, int split_dim) {
  if (ss->n == ss->cap) {
    ss->cap = ss->cap ? ss->cap * 2 : 64;
    ss->v = realloc(ss->v, ss->cap * sizeof *ss->v);
    if (!ss->v) {
      perror("realloc");
      exit(1);
    }
  }
  slice *t = &ss->v[ss->n];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->ndim = ndim;
  t->shape[0] = d0;
  t->shape[1] = d1;
  t->index = (int64_t)ss->n;
  uint64_t whole = esize * d0 * (ndim == 2 ? d1 : 1);
  ss->model_bytes += whole;
  for (int d = 0; d < ndim; d++) {
    t->start[d] = 0;
    t->count[d] = t->shape[d];
  }
  if (split_dim != REPLICATED && ndim == 2 && o->split_inner) split_dim = 1;
  if (split_dim != REPLICATED && ndim == 2 && o->split_dim0) split_dim = 0;
  if (split_dim != REPLICATED) split(t->shape[split_dim], o->tp, tp_rank, &t->start[split_dim], &t->count[split_dim]);
  t->nbytes = esize * t->count[0] * (ndim == 2 ? t->count[1] : 1);
  /* A split finer than the dimension leaves some ranks an empty slice
   * (hidden 3 over tp 4): they put it all the same, as a trainer would. */
  t->offset = t->aoff = ss->total;
  ss->total += (t->nbytes + 63) & ~(uint64_t)63;
  ss->n++;
}

static void build_model(slices *ss, const opts *o, int tp_rank, unsigned esize) {
  const uint64_t H = o->hidden, I = o->intermediate, V = o->vocab;
  char name[96];
  add(ss, o, tp_rank, esize, "model.embed_tokens.weight", 2, V, H, 0);
  for (uint64_t l = 0; l < o->layers; l++) {
    static const char *const qkv[] = {"q_proj", "k_proj", "v_proj"};
    for (int k = 0; k < 3; k++) {
      snprintf(name, sizeof name, "model.layers.%" PRIu64 ".self_attn.%s.weight", l, qkv[k]);
      add(ss, o, tp_rank, esize, name, 2, H, H, 0); /* column-parallel */
    }
    snprintf(name, sizeof name, "model.layers.%" PRIu64 ".self_attn.o_proj.weight", l);
    add(ss, o, tp_rank, esize, name, 2, H, H, 1); /* row-parallel */
    snprintf(name, sizeof name, "model.layers.%" PRIu64 ".mlp.gate_proj.weight", l);
    add(ss, o, tp_rank, esize, name, 2, I, H, 0);
    snprintf(name, sizeof name, "model.layers.%" PRIu64 ".mlp.up_proj.weight", l);
    add(ss, o, tp_rank, esize, name, 2, I, H, 0);
    snprintf(name, sizeof name, "model.layers.%" PRIu64 ".mlp.down_proj.weight", l);
    add(ss, o, tp_rank, esize, name, 2, H, I, 1);
    snprintf(name, sizeof name, "model.layers.%" PRIu64 ".input_layernorm.weight", l);
    add(ss, o, tp_rank, esize, name, 1, H, 0, REPLICATED);
    snprintf(name, sizeof name, "model.layers.%" PRIu64 ".post_attention_layernorm.weight", l);
    add(ss, o, tp_rank, esize, name, 1, H, 0, REPLICATED);
  }
  add(ss, o, tp_rank, esize, "model.norm.weight", 1, H, 0, REPLICATED);
  add(ss, o, tp_rank, esize, "lm_head.weight", 2, V, H, 0);
}

/* ------------------------------------------------------------------------ *
 * Output
 * ------------------------------------------------------------------------ */
static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
    else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
    else fputc(ch, f);
  }
  fputc('"', f);
}

/* Reports the failure, then releases the arena so a failed rank leaves
 * nothing behind in /dev/shm. */
static int fail(const opts *o, const char *what, int rc, shardd_client *c, shardd_arena *a) {
  const char *msg = shardd_last_error(c);
  fprintf(stderr, "shardd-example-rank %d: %s failed: %s\n", o->rank, what,
          msg && *msg ? msg : shardd_strerror(rc));
  printf("{\"rank\":%d,\"state\":\"failed\",\"step\":\"%s\",\"error\":\"%s\",\"message\":", o->rank,
         what, shardd_err_name(rc));
  json_str(stdout, msg && *msg ? msg : shardd_strerror(rc));
  printf("}\n");
  fflush(stdout);
  shardd_arena_destroy(a);
  shardd_close(c);
  return 1;
}

static char *config_json(const opts *o, int dt) {
  uint64_t heads = o->hidden % 64 == 0 && o->hidden ? o->hidden / 64 : 1;
  char *s = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&s, &n);
  if (!f) return NULL;
  fprintf(f,
          "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
          "  \"hidden_size\": %" PRIu64 ",\n  \"intermediate_size\": %" PRIu64 ",\n"
          "  \"num_hidden_layers\": %" PRIu64 ",\n  \"num_attention_heads\": %" PRIu64 ",\n"
          "  \"num_key_value_heads\": %" PRIu64 ",\n  \"vocab_size\": %" PRIu64 ",\n"
          "  \"rms_norm_eps\": 1e-05,\n  \"tie_word_embeddings\": false,\n"
          "  \"torch_dtype\": \"%s\"\n}\n",
          o->hidden, o->intermediate, o->layers, heads, heads, o->vocab, dtypes[dt].torch);
  fclose(f);
  return s;
}

#define STREAM_STEP (64u << 20)

static int send_config(const opts *o, const char *save, int dt, shardd_client *c, shardd_arena *a, int *status) {
  char *cfg = config_json(o, dt);
  if (!cfg) {
    *status = fail(o, "file", SHARDD_E_NO_MEMORY, c, a);
    return -1;
  }
  int rc = shardd_file(c, save, o->file, cfg, strlen(cfg));
  free(cfg);
  if (rc) {
    *status = fail(o, "file", rc, c, a);
    return -1;
  }
  return 0;
}

/* The trainer's weights: huge pages where the kernel offers them, since
 * faulting gigabytes in 4 KiB pages costs more than generating them on a
 * virtual machine. Freed by exit. */
static uint8_t *model_alloc(size_t n) {
  void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  madvise(p, n, MADV_HUGEPAGE); /* advice only: fine if refused */
  return p;
}

/* Says "ready" on stdout and waits for any line on stdin. */
static int wait_for_go(void) {
  char line[64];
  printf("ready\n");
  fflush(stdout);
  return fgets(line, sizeof line, stdin) ? 0 : -1;
}

/* ------------------------------------------------------------------------ *
 * main
 * ------------------------------------------------------------------------ */
/* --place: this rank's arena offsets by the placement rule (shardd_place);
 * offsets grow in put order, so streaming's ready marks still work. */
static int place_slices(slices *ss, const opts *o, int dt, unsigned esize, uint64_t *end) {
  (void)esize;
  shardd_tensor_desc *d = calloc(ss->n ? ss->n : 1, sizeof *d);
  uint64_t *off = calloc(ss->n ? ss->n : 1, sizeof *off);
  int rc = d && off ? 0 : SHARDD_E_NO_MEMORY;
  for (size_t i = 0; i < ss->n && !rc; i++) {
    slice *t = &ss->v[i];
    d[i] = (shardd_tensor_desc){.name = t->name, .dtype = dtypes[dt].name, .ndim = t->ndim, .shape = t->shape,
                                .start = t->start, .count = t->count, .index = t->index};
  }
  if (!rc) rc = shardd_place(d, ss->n, o->max_shard_size, 0, off, end);
  for (size_t i = 0; i < ss->n && !rc; i++) ss->v[i].aoff = off[i];
  if (rc) fprintf(stderr, "shardd-example-rank: place: %s\n", shardd_last_error(NULL));
  free(d);
  free(off);
  return rc;
}

/* One save's times (the JSON line's), and its result once committed. */
typedef struct {
  double blocked, begin_s, puts_s, seal_s, wait_s;
  shardd_result res;
  const char *state;
} save_times;

/* One save of the arena's slices as save_id into save_dir, timed from begin
 * to seal (blocked) and to the commit (wait). Returns 0, or -1 with *status
 * set by fail(). */
static int save_once(const opts *o, const char *save_id, const char *save_dir, int dt, unsigned esize,
                     const slices *ss, uint8_t *model, size_t total, shardd_client *c, shardd_arena *a,
                     save_times *tm, int *status) {
  double t0 = now_s();
  char ws[16], tps[16];
  snprintf(ws, sizeof ws, "%d", o->world_size);
  snprintf(tps, sizeof tps, "%d", o->tp);
  const char *md[] = {"shardd_example", "rank_writer", "tp", tps, "world_size", ws};
  shardd_save_opts so = {.save = save_id, .dir = save_dir, .rank = o->rank, .world_size = o->world_size,
                         .max_shard_size = o->max_shard_size, .metadata = md, .nmetadata = 3,
                         .nnodes = o->nnodes, .node_rank = o->node_rank, .leader = o->leader,
                         .overwrite = o->overwrite, .keep_last = o->keep_last};
  int rc = shardd_begin(c, &so);
  if (rc) {
    *status = fail(o, "begin", rc, c, a);
    return -1;
  }
  tm->begin_s = now_s() - t0;
  double t_puts = now_s();
  /* Copy everything (unless streaming), then put it all in one batch: one
   * round trip's wait rather than one per slice. */
  uint8_t *arena = shardd_arena_data(a);
  shardd_tensor_desc *descs = calloc(ss->n ? ss->n : 1, sizeof *descs);
  uint64_t *offs = calloc(ss->n ? ss->n : 1, sizeof *offs);
  if (!descs || !offs) {
    free(descs);
    free(offs);
    *status = fail(o, "put", SHARDD_E_NO_MEMORY, c, a);
    return -1;
  }
  size_t k = 0;
  for (size_t i = 0; i < ss->n; i++) {
    slice *t = &ss->v[i];
    int whole = t->nbytes == esize * t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1);
    descs[k] = (shardd_tensor_desc){.name = t->name, .dtype = dtypes[dt].name, .ndim = t->ndim,
                                    .shape = t->shape, .start = whole ? NULL : t->start,
                                    .count = whole ? NULL : t->count, .index = t->index};
    offs[k++] = t->aoff;
    if (!o->stream) memcpy(arena + t->aoff, model + t->offset, (size_t)t->nbytes);
  }
  size_t refused = 0;
  rc = shardd_put_many(c, save_id, descs, offs, k, a, o->stream, &refused);
  free(descs);
  free(offs);
  if (rc) {
    *status = fail(o, "put", rc, c, a);
    return -1;
  }
  if (o->stream) {
    /* The file goes first: nothing may be added once declared. */
    if (o->file && o->rank == 0 && send_config(o, save_id, dt, c, a, status) != 0) return -1;
    rc = shardd_declared(c, save_id);
    if (rc) {
      *status = fail(o, "declared", rc, c, a);
      return -1;
    }
    /* Slices sit in the arena in put order: copy front to back, saying how
     * far the bytes are ready every STREAM_STEP. */
    uint8_t *dst = shardd_arena_data(a);
    uint64_t said = 0;
    for (size_t i = 0; i < ss->n; i++) {
      slice *t = &ss->v[i];
      memcpy(dst + t->aoff, model + t->offset, (size_t)t->nbytes);
      uint64_t end = t->aoff + t->nbytes;
      if (end - said >= STREAM_STEP) {
        rc = shardd_ready(c, save_id, a, end);
        if (rc) {
          *status = fail(o, "ready", rc, c, a);
          return -1;
        }
        said = end;
      }
    }
  }
  if (!o->stream && o->file && o->rank == 0 && send_config(o, save_id, dt, c, a, status) != 0) return -1;
  if (o->kill_before_seal) {
    /* Die as a crashed trainer would, without leaking the segment. */
    shm_unlink(shardd_arena_name(a));
    munmap(model, total);
    free(ss->v);
    exit(3);
  }
  tm->puts_s = now_s() - t_puts;
  double t_seal = now_s();
  rc = shardd_seal(c, save_id);
  if (rc) {
    *status = fail(o, "seal", rc, c, a);
    return -1;
  }
  tm->seal_s = now_s() - t_seal;
  tm->blocked = now_s() - t0;

  if (!o->no_wait) {
    double tw = now_s();
    rc = shardd_wait(c, save_id, -1, &tm->res);
    if (rc) {
      *status = fail(o, "wait", rc, c, a);
      return -1;
    }
    tm->wait_s = now_s() - tw;
    tm->state = "committed";
  }
  return 0;
}

int main(int argc, char **argv) {
  opts o = {.save = "example", .dir = "example", .dtype = "BF16", .world_size = 1, .tp = 1,
            .hidden = 256, .layers = 2, .vocab = 1000, .intermediate = 688, .repeat = 1};
  enum { O_SOCKET = 256, O_SAVE, O_DIR, O_RANK, O_WS, O_TP, O_HIDDEN, O_LAYERS, O_VOCAB, O_INTER,
         O_DTYPE, O_MSS, O_SEED, O_FILE, O_NOWAIT, O_KILL, O_BARRIER, O_STREAM, O_PLACE, O_INNER, O_DIM0, O_NNODES, O_NODE,
         O_LEADER, O_REPEAT, O_OVERWRITE, O_KEEP, O_HELP };
  static const struct option lo[] = {
      {"socket", required_argument, 0, O_SOCKET}, {"save", required_argument, 0, O_SAVE},
      {"dir", required_argument, 0, O_DIR},       {"rank", required_argument, 0, O_RANK},
      {"world-size", required_argument, 0, O_WS}, {"tp", required_argument, 0, O_TP},
      {"hidden", required_argument, 0, O_HIDDEN}, {"layers", required_argument, 0, O_LAYERS},
      {"vocab", required_argument, 0, O_VOCAB},   {"intermediate", required_argument, 0, O_INTER},
      {"dtype", required_argument, 0, O_DTYPE},   {"max-shard-size", required_argument, 0, O_MSS},
      {"seed", required_argument, 0, O_SEED},     {"file", required_argument, 0, O_FILE},
      {"no-wait", no_argument, 0, O_NOWAIT},      {"kill-before-seal", no_argument, 0, O_KILL},
      {"start-barrier", no_argument, 0, O_BARRIER}, {"stream", no_argument, 0, O_STREAM},
      {"place", no_argument, 0, O_PLACE},
      {"split-inner", no_argument, 0, O_INNER},   {"split-dim0", no_argument, 0, O_DIM0},   {"nnodes", required_argument, 0, O_NNODES},
      {"node-rank", required_argument, 0, O_NODE}, {"leader", required_argument, 0, O_LEADER},
      {"repeat", required_argument, 0, O_REPEAT}, {"overwrite", no_argument, 0, O_OVERWRITE},
      {"keep-last", required_argument, 0, O_KEEP},
      {"help", no_argument, 0, O_HELP},           {0, 0, 0, 0}};
  int ch, bad = 0;
  while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (ch) {
      case O_SOCKET: o.socket = optarg; break;
      case O_SAVE: o.save = optarg; break;
      case O_DIR: o.dir = optarg; break;
      case O_RANK: bad |= parse_int(optarg, &o.rank); break;
      case O_WS: bad |= parse_int(optarg, &o.world_size); break;
      case O_TP: bad |= parse_int(optarg, &o.tp); break;
      case O_HIDDEN: bad |= parse_u64(optarg, &o.hidden); break;
      case O_LAYERS: bad |= parse_u64(optarg, &o.layers); break;
      case O_VOCAB: bad |= parse_u64(optarg, &o.vocab); break;
      case O_INTER: bad |= parse_u64(optarg, &o.intermediate); break;
      case O_DTYPE: o.dtype = optarg; break;
      case O_MSS: bad |= parse_u64(optarg, &o.max_shard_size); break;
      case O_SEED: bad |= parse_u64(optarg, &o.seed); break;
      case O_FILE: o.file = optarg; break;
      case O_NOWAIT: o.no_wait = 1; break;
      case O_KILL: o.kill_before_seal = 1; break;
      case O_BARRIER: o.start_barrier = 1; break;
      case O_STREAM: o.stream = 1; break;
      case O_PLACE: o.place = 1; break;
      case O_INNER: o.split_inner = 1; break;
      case O_DIM0: o.split_dim0 = 1; break;
      case O_NNODES: bad |= parse_int(optarg, &o.nnodes); break;
      case O_NODE: bad |= parse_int(optarg, &o.node_rank); break;
      case O_LEADER: o.leader = optarg; break;
      case O_REPEAT: bad |= parse_int(optarg, &o.repeat); break;
      case O_OVERWRITE: o.overwrite = 1; break;
      case O_KEEP: bad |= parse_int(optarg, &o.keep_last); break;
      case O_HELP: usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
    if (bad) {
      fprintf(stderr, "shardd-example-rank: bad number for --%s: '%s'\n", lo[ch - O_SOCKET].name, optarg);
      return 2;
    }
  }
  int dt = find_dtype(o.dtype);
  const uint64_t lim = 1ull << 24; /* keeps every product below 2^64 */
  if (optind != argc || dt < 0 || o.tp < 1 || o.repeat < 1 || o.repeat > 1000 || o.world_size < 1 || o.world_size % o.tp != 0 ||
      o.rank >= o.world_size || o.hidden > lim || o.vocab > lim || o.intermediate > lim ||
      o.layers > 100000) {
    fprintf(stderr, "shardd-example-rank: need a known dtype, 0 <= rank < world-size, world-size a "
                    "multiple of tp, sizes <= 2^24\n");
    usage(stderr);
    return 2;
  }
  unsigned esize = dtypes[dt].size;
  int tp_rank = o.rank % o.tp, dp_rank = o.rank / o.tp;

  slices ss = {0};
  build_model(&ss, &o, tp_rank, esize);
  uint64_t arena_bytes = ss.total;
  if (o.place && place_slices(&ss, &o, dt, esize, &arena_bytes) != 0) return 1;
  size_t total = ss.total ? (size_t)ss.total : 64;
  uint64_t bytes = 0;
  size_t nput = ss.n;
  for (size_t i = 0; i < ss.n; i++) bytes += ss.v[i].nbytes;

  /* The "trainer's" tensors: generated before timing starts, like weights
   * that already sit in host memory. */
  uint8_t *model = model_alloc(total);
  if (!model) {
    perror("mmap");
    return 1;
  }
  for (size_t i = 0; i < ss.n; i++) {
    slice *t = &ss.v[i];
    sd_synth_fill_box(sd_synth_key(t->name, o.seed), t->ndim, t->shape, t->start, t->count, esize,
                      model + t->offset);
  }

  int status = 0;
  double t_setup = now_s();
  shardd_client *c;
  int rc = shardd_connect(o.socket, &c);
  if (rc) {
    status = fail(&o, "connect", rc, NULL, NULL);
    goto done;
  }
  shardd_arena *a;
  rc = shardd_arena_create(c, arena_bytes > total ? (size_t)arena_bytes : total, &a);
  if (rc) {
    status = fail(&o, "arena_create", rc, c, NULL);
    goto done;
  }
  double setup_s = now_s() - t_setup;

  /* Baseline: a plain memcpy of the same bytes into the (pre-faulted)
   * shared memory, the floor for what handing them over can cost. With a
   * start barrier every rank copies at once, as they do in the save. */
  /* The faster of two passes, each started together with the other ranks
   * when there is a barrier: a first pass over memory can be slowed by what
   * the machine is doing (khugepaged, say), and this is meant as the floor. */
  double memcpy_s = 0;
  for (int pass = 0; pass < 2; pass++) {
    if (o.start_barrier && wait_for_go() != 0) goto no_go;
    uint8_t *dst = shardd_arena_data(a);
    double t0 = now_s();
    for (size_t i = 0; i < ss.n; i++)
      memcpy(dst + ss.v[i].aoff, model + ss.v[i].offset, ss.v[i].nbytes);
    /* The copies are dead stores otherwise; make them observable. */
    __asm__ volatile("" : : "r"(dst) : "memory");
    double t = now_s() - t0;
    if (pass == 0 || t < memcpy_s) memcpy_s = t;
  }
  /* --repeat: the same connection and arena save again, as a trainer saves
   * every N steps; every save but the last goes to DIR.wK (id SAVE.wK), and
   * only the last one's times are printed. */
  save_times tm = {.state = "sealed"};
  char save_id[512], save_dir[4096];
  for (int rep = 1; rep <= o.repeat; rep++) {
    if (o.start_barrier && wait_for_go() != 0) goto no_go;
    if (rep < o.repeat) {
      snprintf(save_id, sizeof save_id, "%s.w%d", o.save, rep);
      snprintf(save_dir, sizeof save_dir, "%s.w%d", o.dir, rep);
    } else {
      snprintf(save_id, sizeof save_id, "%s", o.save);
      snprintf(save_dir, sizeof save_dir, "%s", o.dir);
    }
    if (save_once(&o, save_id, save_dir, dt, esize, &ss, model, total, c, a, &tm, &status) != 0) goto done;
  }
  rc = shardd_arena_destroy(a);
  if (rc) {
    status = fail(&o, "arena_destroy", rc, c, NULL);
    goto done;
  }
  shardd_close(c);

  printf("{\"rank\":%d,\"tp_rank\":%d,\"dp_rank\":%d,\"tensors\":%zu,\"bytes\":%" PRIu64
         ",\"model_bytes\":%" PRIu64 ",\"blocked_s\":%.6f,\"memcpy_s\":%.6f,\"setup_s\":%.6f"
         ",\"begin_s\":%.6f,\"puts_s\":%.6f,\"seal_s\":%.6f,\"wait_s\":%.6f,\"state\":\"%s\""
         ",\"files\":%" PRIu64 ",\"dir\":",
         o.rank, tp_rank, dp_rank, nput, bytes, ss.model_bytes, tm.blocked, memcpy_s, setup_s, tm.begin_s,
         tm.puts_s, tm.seal_s, tm.wait_s, tm.state, tm.res.files);
  json_str(stdout, tm.res.dir);
  printf("}\n");
  goto done;
no_go:
  fprintf(stderr, "shardd-example-rank %d: stdin closed before the start signal\n", o.rank);
  shardd_arena_destroy(a);
  shardd_close(c);
  status = 1;
done:
  munmap(model, total);
  free(ss.v);
  return status;
}

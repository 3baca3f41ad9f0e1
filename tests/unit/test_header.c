/* File headers: exact bytes, reference-writer tensor order, metadata rules, padding to 4 KiB, the size limit. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "sd_format.h"

static uint64_t le64(const char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)(unsigned char)p[i] << (8 * i);
  return v;
}

static sd_tensor mk(const char *name, sd_dtype dt, uint32_t ndim, uint64_t d0, uint64_t d1) {
  sd_tensor t = {.name = name, .dtype = dt, .ndim = ndim, .index = -1};
  t.shape[0] = d0;
  t.shape[1] = d1;
  return t;
}

/* The JSON text of file 0 without its padding, and checks the padding. */
static char *json_of(const sd_plan *p, size_t f) {
  const sd_plan_file *pf = &p->files[f];
  uint64_t len = le64(pf->header);
  cr_assert_eq(len + 8, pf->header_size);
  size_t j = len;
  while (j > 0 && pf->header[8 + j - 1] == ' ') j--;
  cr_assert_eq(pf->header[8 + j - 1], '}');
  char *s = malloc(j + 1);
  memcpy(s, pf->header + 8, j);
  s[j] = '\0';
  return s;
}

Test(header, exact_bytes_of_a_small_file) {
  sd_tensor t[] = {mk("b", SD_DT_F32, 2, 2, 3), mk("a", SD_DT_F16, 1, 4, 0), mk("c", SD_DT_F64, 0, 0, 0)};
  sd_plan p;
  sd_error err = {0};
  cr_assert_eq(sd_plan_build(&p, t, 3, NULL, &err), 0, "%s", err.msg);
  const char *want =
      "{\"__metadata__\":{\"format\":\"pt\"},"
      "\"c\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[8,32]},"
      "\"a\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[32,40]}}";
  const sd_plan_file *f = &p.files[0];
  cr_assert_eq(f->header_size, 4096);
  const unsigned char prefix[8] = {0xF8, 0x0F, 0, 0, 0, 0, 0, 0}; /* 4088 */
  cr_assert_eq(memcmp(f->header, prefix, 8), 0);
  cr_assert_eq(memcmp(f->header + 8, want, strlen(want)), 0, "got %.300s", f->header + 8);
  for (size_t i = 8 + strlen(want); i < 4096; i++) cr_assert_eq(f->header[i], ' ', "pad at %zu", i);
  cr_assert_eq(f->data_size, 40);
  cr_assert_eq(f->file_size, 4136);
  cr_assert_eq(f->ntensors, 3);
  cr_assert_eq(f->tensors[0], 2);
  cr_assert_eq(f->tensors[1], 0);
  cr_assert_eq(f->tensors[2], 1);
  cr_assert_eq(p.loc[2].file_offset, 4096);
  cr_assert_eq(p.loc[0].file_offset, 4104);
  cr_assert_eq(p.loc[1].file_offset, 4128);
  cr_assert_eq(p.loc[1].nbytes, 8);
  sd_plan_free(&p);
}

Test(header, order_is_element_size_then_name_bytes) {
  sd_tensor t[] = {mk("a", SD_DT_F32, 1, 1, 0), mk("z", SD_DT_F64, 1, 1, 0),
                   mk("b", SD_DT_BF16, 1, 3, 0), mk("a16", SD_DT_F16, 1, 1, 0),
                   mk("B", SD_DT_BOOL, 1, 3, 0),  mk("A", SD_DT_U8, 1, 1, 0),
                   mk("e0", SD_DT_F32, 2, 0, 5),  mk("Z", SD_DT_C64, 1, 1, 0)};
  sd_plan p;
  cr_assert_eq(sd_plan_build(&p, t, 8, NULL, NULL), 0);
  const char *want[] = {"Z", "z", "a", "e0", "a16", "b", "A", "B"};
  uint64_t begin[] = {0, 8, 16, 20, 20, 22, 28, 29};
  for (int i = 0; i < 8; i++) {
    uint32_t ti = p.files[0].tensors[i];
    cr_assert_str_eq(t[ti].name, want[i]);
    cr_assert_eq(p.loc[ti].data_begin, begin[i], "%s", want[i]);
  }
  char *j = json_of(&p, 0);
  cr_assert(strstr(j, "\"e0\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[20,20]}"), "%s", j);
  free(j);
  sd_plan_free(&p);
}

Test(header, metadata_sorted_escaped_and_format_forced) {
  sd_kv kv[] = {{"z", "1"}, {"format", "tf"}, {"a", "x\"y\n\x01\\"}, {"\xc3\xa9", "v\xc3\xa9"}, {"", ""}};
  sd_plan_opts o = {.metadata = kv, .nmetadata = 5};
  sd_tensor t[] = {mk("q\"\\\xc3\xa9", SD_DT_U8, 1, 2, 0)};
  sd_plan p;
  sd_error err = {0};
  cr_assert_eq(sd_plan_build(&p, t, 1, &o, &err), 0, "%s", err.msg);
  char *j = json_of(&p, 0);
  cr_assert_str_eq(j,
                   "{\"__metadata__\":{\"format\":\"pt\",\"\":\"\",\"a\":\"x\\\"y\\n\\u0001\\\\\","
                   "\"z\":\"1\",\"\xc3\xa9\":\"v\xc3\xa9\"},"
                   "\"q\\\"\\\\\xc3\xa9\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}");
  free(j);
  sd_plan_free(&p);
}

Test(header, bad_metadata_is_refused) {
  sd_tensor t[] = {mk("w", SD_DT_U8, 1, 2, 0)};
  sd_plan p;
  sd_error err = {0};
  sd_kv dup[] = {{"k", "1"}, {"j", "0"}, {"k", "2"}};
  sd_plan_opts o = {.metadata = dup, .nmetadata = 3};
  cr_assert_eq(sd_plan_build(&p, t, 1, &o, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "metadata key 'k' is given twice");
  sd_kv nul[] = {{"k", NULL}};
  o = (sd_plan_opts){.metadata = nul, .nmetadata = 1};
  cr_assert_eq(sd_plan_build(&p, t, 1, &o, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "metadata entry 0 has no value");
  sd_kv bad[] = {{"k", "\xed\xa0\x80"}};
  o = (sd_plan_opts){.metadata = bad, .nmetadata = 1};
  cr_assert_eq(sd_plan_build(&p, t, 1, &o, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "metadata 'k' is not valid UTF-8");
  /* Two "format" entries are both overridden, not a duplicate. */
  sd_kv fmt[] = {{"format", "a"}, {"format", "b"}};
  o = (sd_plan_opts){.metadata = fmt, .nmetadata = 2};
  cr_assert_eq(sd_plan_build(&p, t, 1, &o, &err), 0, "%s", err.msg);
  sd_plan_free(&p);
}

/* Header of an empty checkpoint whose one metadata value has vlen bytes. */
static int plan_with_value(size_t vlen, sd_plan *p, sd_error *err) {
  char *v = malloc(vlen + 1);
  memset(v, 'x', vlen);
  v[vlen] = '\0';
  sd_kv kv[] = {{"k", v}};
  sd_plan_opts o = {.metadata = kv, .nmetadata = 1};
  int rc = sd_plan_build(p, NULL, 0, &o, err);
  free(v);
  return rc;
}

static const size_t fixed_json = sizeof("{\"__metadata__\":{\"format\":\"pt\",\"k\":\"\"}}") - 1;

Test(header, padding_makes_data_start_on_4k) {
  sd_plan p;
  sd_error err = {0};
  cr_assert_eq(plan_with_value(4088 - fixed_json, &p, &err), 0, "%s", err.msg);
  cr_assert_eq(p.files[0].header_size, 4096, "JSON of exactly 4088 bytes needs no padding");
  cr_assert_eq(p.files[0].header[8 + 4087], '}');
  sd_plan_free(&p);
  cr_assert_eq(plan_with_value(4089 - fixed_json, &p, &err), 0, "%s", err.msg);
  cr_assert_eq(p.files[0].header_size, 8192);
  cr_assert_eq(le64(p.files[0].header), 8184);
  cr_assert_eq(p.files[0].header[8 + 4088], '}');
  cr_assert_eq(p.files[0].header[8 + 4089], ' ');
  sd_plan_free(&p);
}

Test(header, size_limit_counts_the_padding, .timeout = 60) {
  /* The largest padded length within 100,000,000 is 24414*4096 - 8. */
  const size_t largest = 24414ULL * 4096 - 8;
  sd_plan p;
  sd_error err = {0};
  cr_assert_eq(plan_with_value(largest - fixed_json, &p, &err), 0, "%s", err.msg);
  cr_assert_eq(p.files[0].header_size, largest + 8);
  cr_assert_eq(le64(p.files[0].header), largest);
  sd_plan_free(&p);
  cr_assert_eq(plan_with_value(largest - fixed_json + 1, &p, &err), SHARDD_E_LIMIT);
  cr_assert_str_eq(err.msg,
                   "model.safetensors: header of 100003832 bytes (0 tensors) exceeds the format's "
                   "limit of 100000000 bytes");
  cr_assert_eq(p.nfiles, 0);
}

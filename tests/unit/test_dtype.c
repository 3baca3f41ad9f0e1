/* Dtype table: every whole-byte safetensors dtype parses and round-trips; F4/F6 and unknown names are refused. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "sd_format.h"

static const struct {
  const char *name;
  unsigned size;
} expected[] = {
    {"BOOL", 1},       {"U8", 1},          {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
    {"F8_E8M0", 1},    {"F8_E4M3FNUZ", 1}, {"F8_E5M2FNUZ", 1},        {"I16", 2},
    {"U16", 2},        {"F16", 2},         {"BF16", 2}, {"I32", 4},    {"U32", 4},
    {"F32", 4},        {"C64", 8},         {"F64", 8},  {"I64", 8},    {"U64", 8},
};

Test(dtype, every_whole_byte_dtype_round_trips) {
  size_t n = sizeof expected / sizeof expected[0];
  cr_assert_eq(SD_DT__COUNT, n);
  for (size_t i = 0; i < n; i++) {
    sd_dtype dt = SD_DT__COUNT;
    sd_error err = {0};
    cr_assert_eq(sd_dtype_parse(expected[i].name, &dt, &err), 0, "%s", expected[i].name);
    cr_assert_str_eq(sd_dtype_name(dt), expected[i].name);
    cr_assert_eq(sd_dtype_size(dt), expected[i].size, "%s", expected[i].name);
  }
}

Test(dtype, enum_follows_the_map) {
  cr_assert_eq(SD_DT_BOOL, 0);
  cr_assert_str_eq(sd_dtype_name(SD_DT_BF16), "BF16");
  cr_assert_eq(sd_dtype_size(SD_DT_C64), 8);
  cr_assert_eq(sd_dtype_size(SD_DT_F8_E8M0), 1);
}

Test(dtype, sub_byte_dtypes_are_refused_clearly) {
  const char *names[] = {"F4", "F6_E2M3", "F6_E3M2"};
  for (size_t i = 0; i < 3; i++) {
    sd_error err = {0};
    sd_dtype dt = SD_DT_U8;
    cr_assert_eq(sd_dtype_parse(names[i], &dt, &err), SHARDD_E_INVALID_ARGUMENT);
    cr_assert_eq(err.code, SHARDD_E_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, names[i]), "%s", err.msg);
    cr_assert(strstr(err.msg, "sub-byte dtypes (F4, F6) are not supported"), "%s", err.msg);
    cr_assert_eq(dt, SD_DT_U8, "output untouched on failure");
  }
}

Test(dtype, unknown_names_are_named) {
  const char *names[] = {"F128", "f32", "", "F32 ", "F8_E4M3FN", "bfloat16", "F4x"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    sd_error err = {0};
    sd_dtype dt;
    cr_assert_eq(sd_dtype_parse(names[i], &dt, &err), SHARDD_E_INVALID_ARGUMENT, "%s", names[i]);
    char want[64];
    snprintf(want, sizeof want, "unknown dtype '%s'", names[i]);
    cr_assert_str_eq(err.msg, want);
  }
}

Test(dtype, hostile_names_stay_printable) {
  sd_error err = {0};
  sd_dtype dt;
  cr_assert_eq(sd_dtype_parse("F\x01\xff\xc3\xa9", &dt, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "unknown dtype 'F??\xc3\xa9'");
  char longname[300];
  memset(longname, 'X', sizeof longname - 1);
  longname[sizeof longname - 1] = '\0';
  cr_assert_eq(sd_dtype_parse(longname, &dt, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "...'"), "long names are cut: %s", err.msg);
  cr_assert_lt(strlen(err.msg), 100);
  cr_assert_eq(sd_dtype_parse(NULL, &dt, &err), SHARDD_E_INVALID_ARGUMENT);
}

Test(dtype, out_of_range_values) {
  cr_assert_str_eq(sd_dtype_name(SD_DT__COUNT), "invalid");
  cr_assert_eq(sd_dtype_size(SD_DT__COUNT), 0);
  cr_assert_eq(sd_dtype_size((sd_dtype)-1), 0);
}

Test(dtype, error_may_be_null) {
  sd_dtype dt;
  cr_assert_eq(sd_dtype_parse("nope", &dt, NULL), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_eq(sd_dtype_parse("I64", &dt, NULL), 0);
  cr_assert_eq(dt, SD_DT_I64);
}

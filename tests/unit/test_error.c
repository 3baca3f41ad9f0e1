/* The errno -> code map and the code <-> wire name tables (proto/error.c), pinned row by row. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "sd_error.h"

/* Every errno a writer, opener or mapper reports, with the code a client sees for it. A row that changes
 * here changes what a trainer is told, so the table is the contract. */
static const struct {
  int e;
  int code;
} errno_rows[] = {
    {ENOSPC, SHARDD_E_NO_SPACE},   {EDQUOT, SHARDD_E_NO_SPACE},   {ENOMEM, SHARDD_E_NO_MEMORY},
    {ENOBUFS, SHARDD_E_NO_MEMORY}, {EACCES, SHARDD_E_PERMISSION}, {EPERM, SHARDD_E_PERMISSION},
    {EIO, SHARDD_E_IO},            {EFBIG, SHARDD_E_IO},          {EFAULT, SHARDD_E_IO},
    {EROFS, SHARDD_E_IO},          {EBADF, SHARDD_E_IO},          {EINVAL, SHARDD_E_IO},
    {ENOENT, SHARDD_E_IO},         {0, SHARDD_E_IO},              {-ENOSPC, SHARDD_E_IO},
};

Test(error, errno_map_table) {
  for (size_t i = 0; i < sizeof errno_rows / sizeof errno_rows[0]; i++)
    cr_expect_eq(sd_err_from_errno(errno_rows[i].e), errno_rows[i].code, "errno %d (%s): got %s, want %s",
                 errno_rows[i].e, strerror(errno_rows[i].e < 0 ? -errno_rows[i].e : errno_rows[i].e),
                 sd_err_name(sd_err_from_errno(errno_rows[i].e)), sd_err_name(errno_rows[i].code));
}

Test(error, names_round_trip) {
#define XX(name, num, wire, text)                                   \
  cr_expect_eq(sd_err_from_name(sd_err_name(SHARDD_E_##name)), SHARDD_E_##name, "%s", wire); \
  cr_expect_str_eq(sd_err_message(SHARDD_E_##name), text);
  SHARDD_ERRNO_MAP(XX)
#undef XX
  cr_expect_str_eq(sd_err_name(0), "ok");
  cr_expect_str_eq(sd_err_name(9999), "unknown");
  cr_expect_eq(sd_err_from_name("no-such-name"), SHARDD_E_PROTOCOL);
  cr_expect_eq(sd_err_from_name(NULL), SHARDD_E_PROTOCOL);
}

Test(error, fail_records_and_returns_the_code) {
  sd_error err;
  cr_expect_eq(sd_fail(&err, SHARDD_E_NO_SPACE, "%s/%d", "a", 7), SHARDD_E_NO_SPACE);
  cr_expect_eq(err.code, SHARDD_E_NO_SPACE);
  cr_expect_str_eq(err.msg, "a/7");
  cr_expect_eq(sd_fail(NULL, SHARDD_E_IO, "x"), SHARDD_E_IO);
  sd_error_clear(&err);
  cr_expect_eq(err.code, 0);
  cr_expect_str_eq(err.msg, "");
}

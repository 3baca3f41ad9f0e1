/* The protocol v1 request handlers. */
#ifndef SD_OPS_H
#define SD_OPS_H

#include "daemon.h"

struct sd_session;

/* Parses one request line and answers it on s (or later, for `wait`). */
void sd_ops_dispatch(struct sd_session *s, const char *line, size_t len);

#endif

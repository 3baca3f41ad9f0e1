/* shardctl's tables and progress bars of a daemon's status reply (shardctl_status.c). */
#ifndef SHARDCTL_STATUS_H
#define SHARDCTL_STATUS_H

#include <stdio.h>

#include <jansson.h>

/* `shardctl status`: the saves in flight as a table, then clients, totals and peers. */
void shardctl_print_status_table(FILE *out, const json_t *st);
/* One frame of `shardctl watch`, headed by the daemon's node name. */
void shardctl_print_watch_frame(FILE *out, const json_t *st, const char *node);

#endif

/* The Unix socket clients connect to: stale-socket cleanup, permissions, accept. */
#ifndef SD_LISTENER_H
#define SD_LISTENER_H

#include "daemon.h"
#include "sd_error.h"

#define SD_SOCKET_MODE 0660

/* Binds d->cfg->socket_path (removing a stale socket nobody listens on) and
 * starts accepting: each connection goes to d->on_client. */
int sd_listener_open(sd_daemon *d, sd_error *err);
/* Accepts on fd, a listening Unix socket passed by systemd socket
 * activation; its file is left in place on close (systemd owns it). */
int sd_listener_adopt(sd_daemon *d, int fd, sd_error *err);
/* Stops accepting and removes the socket file (unless adopted). */
void sd_listener_close(sd_daemon *d);

#endif

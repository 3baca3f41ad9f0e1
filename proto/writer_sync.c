/* placeholder: writer_sync.c is being written. */
typedef int sd_placeholder_writer_sync_;

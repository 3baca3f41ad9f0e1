/* placeholder: header.c is being written. */
typedef int sd_placeholder_header_;

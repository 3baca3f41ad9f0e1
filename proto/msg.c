/* placeholder: msg.c is being written. */
typedef int sd_placeholder_msg_;

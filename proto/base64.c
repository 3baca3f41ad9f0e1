/* placeholder: base64.c is being written. */
typedef int sd_placeholder_base64_;

/* placeholder: tensor.c is being written. */
typedef int sd_placeholder_tensor_;

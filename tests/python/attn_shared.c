/* The implementation of attn.h as a shared library (make build/libattn.so), so that
   tests/python/check_numpy.py can call every ATTN_API function through ctypes. */
#define ATTN_IMPLEMENTATION
#include "attn.h"

/* Base-128 varints (protobuf's, and Kafka's after zigzag): shared by the C extensions that write them. */
#ifndef FORESTFLOW_VARINT_H
#define FORESTFLOW_VARINT_H

#include <stddef.h>
#include <stdint.h>

static inline size_t varint_len(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline char *put_varint(char *out, uint64_t v) {
    while (v >= 0x80) {
        *out++ = (char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    *out++ = (char)v;
    return out;
}

#endif

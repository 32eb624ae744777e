/* Base-128 varints (protobuf's, and Kafka's after zigzag): shared by the C extensions that write them. */
#ifndef FORESTFLOW_VARINT_H
#define FORESTFLOW_VARINT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

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

/* ``len`` bytes of ``data`` after their length as a varint (a length-delimited field's value); returns the end. */
static inline char *put_delimited(char *out, const void *data, size_t len) {
    out = put_varint(out, (uint64_t)len);
    memcpy(out, data, len);
    return out + len;
}

/* Reads the varint at in[0..size); returns the bytes it took, or 0 if it runs past size or past 10 bytes. */
static inline size_t get_varint(const unsigned char *in, size_t size, uint64_t *value) {
    uint64_t v = 0;
    for (size_t i = 0; i < size && i < 10; i++) {
        v |= (uint64_t)(in[i] & 0x7F) << (7 * i);
        if (!(in[i] & 0x80)) {
            *value = v;
            return i + 1;
        }
    }
    return 0;
}

#endif

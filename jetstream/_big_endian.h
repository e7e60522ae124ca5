/* Big-endian integers read from and written to byte buffers, for the C parts that handle the
 * record batch format and the socket API's frames (jetstream/stream/_format_c.c,
 * jetstream/server/_gets_c.c, jetstream/compaction/_scan_c.c). */
#ifndef JETSTREAM_BIG_ENDIAN_H
#define JETSTREAM_BIG_ENDIAN_H

#include <stdint.h>

static inline uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint64_t be64(const unsigned char *p) {
    return ((uint64_t)be32(p) << 32) | be32(p + 4);
}

static inline void put_u16(char *w, uint16_t v) {
    w[0] = (char)(v >> 8);
    w[1] = (char)v;
}

static inline void put_u32(char *w, uint32_t v) {
    w[0] = (char)(v >> 24);
    w[1] = (char)(v >> 16);
    w[2] = (char)(v >> 8);
    w[3] = (char)v;
}

static inline void put_u64(char *w, uint64_t v) {
    put_u32(w, (uint32_t)(v >> 32));
    put_u32(w + 4, (uint32_t)v);
}

#endif

/* Decimal digits without snprintf, for the C parts that write lengths and offsets
 * (jetstream/server/_nats_wire_c.c, jetstream/protocol/_ack_c.c). */
#ifndef JETSTREAM_DECIMAL_H
#define JETSTREAM_DECIMAL_H

/* The number of decimal digits of `v`. */
static inline int decimal_len(unsigned long long v) {
    int len = 1;
    while (v >= 10) {
        v /= 10;
        len++;
    }
    return len;
}

/* Write `v` as its `len` decimal digits at `w`. */
static inline void put_decimal(char *w, unsigned long long v, int len) {
    for (int i = len - 1; i >= 0; i--) {
        w[i] = (char)('0' + v % 10);
        v /= 10;
    }
}

#endif

/* GET requests answered in bulk (jetstream.server.bulk_gets): the request frames of a run of
 * GETs taken from a connection's buffer, and their response frames written from key index
 * entries (jetstream.compaction.key_index).
 *
 * take_gets(buf, pos, frame_bytes_max, header_bytes_max, limit, out, bounds) -> int
 *   From `buf[pos]` on, each whole frame that is a GET request without payload, whose
 *   header is a fixmap of distinct fixstr keys among stream (required, a stream name),
 *   partition (required), key (required, bin), min_offset, max_wait_ms and read_replica,
 *   each value of its field's type and within `bounds` (partition_max, key_bytes_max,
 *   offset_max, wait_ms_max), with nothing after the map, is appended to `out` as
 *   (correlation_id, stream, partition, key, min_offset, max_wait_ms, read_replica), the
 *   absent fields at their defaults (-1, 0, False): the fields of the GetRequest that
 *   decoding the frame gives. It stops at the first frame it does not take (cut short, too
 *   long, another op, any other header: the frame decoder decides it) or once `out` holds
 *   `limit`, and returns the position after the frames it took.
 *
 * encode_gets(cids, keys, raws, covered, header_bytes_max) -> (bytes, declined)
 *   The RESPONSE frames answering GET request `cids[i]` for `keys[i]`, whose key index entry
 *   is `raws[i]` (None: the key was never seen), in order, joined: what encode_response
 *   gives for the GetResponse that the key index's get and the KV handler make of them,
 *   with `covered` as covered_offset. `declined` lists the indexes it leaves out, for the
 *   Python code to answer: entries cut short or of a shape it does not write (a header name
 *   that is not ASCII, a header name twice, an offset under -1) and headers over
 *   `header_bytes_max`.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../_big_endian.h"

#define FIXED_BYTES 10
#define PREFIX_BYTES 14
#define KIND_REQUEST 1
#define KIND_RESPONSE 2
#define OP_GET 13
#define STREAM_CHARS_MAX 64

/* -- take_gets ------------------------------------------------------------------------- */

typedef struct {
    long long partition_max, key_bytes_max, offset_max, wait_ms_max;
} bounds_t;

typedef struct {
    const char *stream, *key;
    Py_ssize_t stream_len, key_len;
    long long partition, min_offset, max_wait_ms;
    int read_replica;
} get_t;

/* The msgpack integer at h[*at] (any width) as a signed 64-bit value: 1 (advanced), or 0:
 * not an integer, cut short, or a uint64 over INT64_MAX. */
static int read_int(const unsigned char *h, Py_ssize_t size, Py_ssize_t *at, long long *v) {
    const Py_ssize_t i = *at;
    if (i >= size) return 0;
    const unsigned char tag = h[i];
    Py_ssize_t width;
    if (tag <= 0x7f) {
        *v = tag;
        *at = i + 1;
        return 1;
    }
    if (tag >= 0xe0) {
        *v = (long long)(signed char)tag;
        *at = i + 1;
        return 1;
    }
    switch (tag) {
    case 0xcc: case 0xd0: width = 1; break;
    case 0xcd: case 0xd1: width = 2; break;
    case 0xce: case 0xd2: width = 4; break;
    case 0xcf: case 0xd3: width = 8; break;
    default: return 0;
    }
    if (i + 1 + width > size) return 0;
    const unsigned char *p = h + i + 1;
    const int is_signed = tag >= 0xd0;
    uint64_t u;
    if (width == 1) u = p[0];
    else if (width == 2) u = ((uint64_t)p[0] << 8) | p[1];
    else if (width == 4) u = be32(p);
    else u = be64(p);
    if (is_signed) {
        if (width == 1) *v = (int8_t)u;
        else if (width == 2) *v = (int16_t)u;
        else if (width == 4) *v = (int32_t)u;
        else *v = (int64_t)u;
    } else {
        if (u > (uint64_t)INT64_MAX) return 0;
        *v = (long long)u;
    }
    *at = i + 1 + width;
    return 1;
}

static int is_name_char(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-';
}

enum { F_STREAM = 1, F_PARTITION = 2, F_KEY = 4, F_MIN_OFFSET = 8, F_WAIT = 16,
       F_REPLICA = 32 };

static int field_of(const unsigned char *k, Py_ssize_t n) {
#define IS(name) ((size_t)n == sizeof(name) - 1 && memcmp(k, name, (size_t)n) == 0)
    if (IS("stream")) return F_STREAM;
    if (IS("partition")) return F_PARTITION;
    if (IS("key")) return F_KEY;
    if (IS("min_offset")) return F_MIN_OFFSET;
    if (IS("max_wait_ms")) return F_WAIT;
    if (IS("read_replica")) return F_REPLICA;
#undef IS
    return 0;
}

/* The header `h` of a GET request as its fields: 1, or 0 to decline. */
static int read_get(const unsigned char *h, Py_ssize_t size, const bounds_t *b, get_t *g) {
    if (size < 1 || (h[0] & 0xf0) != 0x80) return 0;
    const int entries = h[0] & 0x0f;
    Py_ssize_t at = 1;
    int seen = 0;
    g->min_offset = -1;
    g->max_wait_ms = 0;
    g->read_replica = 0;
    for (int e = 0; e < entries; e++) {
        if (at >= size || (h[at] & 0xe0) != 0xa0) return 0;
        const Py_ssize_t n = h[at] & 0x1f;
        if (at + 1 + n > size) return 0;
        const int field = field_of(h + at + 1, n);
        if (field == 0 || (seen & field)) return 0;
        seen |= field;
        at += 1 + n;
        if (at >= size) return 0;
        const unsigned char tag = h[at];
        long long v;
        switch (field) {
        case F_STREAM: {
            Py_ssize_t len, head;
            if ((tag & 0xe0) == 0xa0) {
                len = tag & 0x1f;
                head = 1;
            } else if (tag == 0xd9 && at + 2 <= size) {
                len = h[at + 1];
                head = 2;
            } else {
                return 0;
            }
            if (len < 1 || len > STREAM_CHARS_MAX || at + head + len > size) return 0;
            for (Py_ssize_t i = 0; i < len; i++)
                if (!is_name_char(h[at + head + i])) return 0;
            g->stream = (const char *)h + at + head;
            g->stream_len = len;
            at += head + len;
            break;
        }
        case F_KEY: {
            Py_ssize_t len, head;
            if (tag == 0xc4 && at + 2 <= size) {
                len = h[at + 1];
                head = 2;
            } else if (tag == 0xc5 && at + 3 <= size) {
                len = ((Py_ssize_t)h[at + 1] << 8) | h[at + 2];
                head = 3;
            } else if (tag == 0xc6 && at + 5 <= size) {
                len = (Py_ssize_t)be32(h + at + 1);
                head = 5;
            } else {
                return 0;
            }
            if (len > b->key_bytes_max || len > size - at - head) return 0;
            g->key = (const char *)h + at + head;
            g->key_len = len;
            at += head + len;
            break;
        }
        case F_REPLICA:
            if (tag != 0xc2 && tag != 0xc3) return 0;
            g->read_replica = tag == 0xc3;
            at += 1;
            break;
        default:
            if (!read_int(h, size, &at, &v)) return 0;
            if (field == F_PARTITION) {
                if (v < 0 || v > b->partition_max) return 0;
                g->partition = v;
            } else if (field == F_MIN_OFFSET) {
                if (v < -1 || v > b->offset_max) return 0;
                g->min_offset = v;
            } else {
                if (v < 0 || v > b->wait_ms_max) return 0;
                g->max_wait_ms = v;
            }
        }
    }
    return at == size && (seen & (F_STREAM | F_PARTITION | F_KEY)) ==
                             (F_STREAM | F_PARTITION | F_KEY);
}

static PyObject *get_tuple(uint32_t cid, const get_t *g) {
    return Py_BuildValue("(ks#Ly#LLO)", (unsigned long)cid, g->stream, g->stream_len,
                         g->partition, g->key, g->key_len, g->min_offset, g->max_wait_ms,
                         g->read_replica ? Py_True : Py_False);
}

static PyObject *take_gets(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "take_gets takes 7 arguments");
        return NULL;
    }
    PyObject *out = args[5], *bounds = args[6];
    if (!PyList_Check(out) || !PyTuple_Check(bounds) || PyTuple_GET_SIZE(bounds) != 4) {
        PyErr_SetString(PyExc_TypeError, "take_gets wants a list and a 4-tuple of bounds");
        return NULL;
    }
    bounds_t b = {
        PyLong_AsLongLong(PyTuple_GET_ITEM(bounds, 0)),
        PyLong_AsLongLong(PyTuple_GET_ITEM(bounds, 1)),
        PyLong_AsLongLong(PyTuple_GET_ITEM(bounds, 2)),
        PyLong_AsLongLong(PyTuple_GET_ITEM(bounds, 3)),
    };
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    const Py_ssize_t frame_max = PyLong_AsSsize_t(args[2]);
    const Py_ssize_t header_max = PyLong_AsSsize_t(args[3]);
    const Py_ssize_t limit = PyLong_AsSsize_t(args[4]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *buf = view.buf;
    const Py_ssize_t size = view.len;
    if (pos < 0) pos = 0;
    while (PyList_GET_SIZE(out) < limit && size - pos >= PREFIX_BYTES) {
        const unsigned char *f = buf + pos;
        const uint32_t length = be32(f);
        if (length < FIXED_BYTES || (Py_ssize_t)length > frame_max ||
            (Py_ssize_t)length > size - pos - 4)
            break;
        const uint32_t header_length = be32(f + 10);
        if (f[8] != KIND_REQUEST || f[9] != OP_GET || header_length != length - FIXED_BYTES ||
            (Py_ssize_t)header_length > header_max)
            break;
        get_t g = {0};
        if (!read_get(f + PREFIX_BYTES, header_length, &b, &g)) break;
        PyObject *item = get_tuple(be32(f + 4), &g);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            PyBuffer_Release(&view);
            return NULL;
        }
        Py_DECREF(item);
        pos += 4 + (Py_ssize_t)length;
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(pos);
}

/* -- encode_gets ----------------------------------------------------------------------- */

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} out_t;

static int reserve(out_t *o, Py_ssize_t more) {
    if (o->len + more <= o->cap) return 1;
    Py_ssize_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + more) cap *= 2;
    char *grown = PyMem_Realloc(o->data, (size_t)cap);
    if (grown == NULL) {
        PyErr_NoMemory();
        return 0;
    }
    o->data = grown;
    o->cap = cap;
    return 1;
}

/* The longest msgpack head of an int, a bin, a str or a map: a tag and 8 bytes. */
#define HEAD_MAX 9

/* Write `v` as msgpack-python packs an int: the smallest encoding. Returns bytes written. */
static int put_int(char *w, long long v) {
    if (v >= 0) {
        const uint64_t u = (uint64_t)v;
        if (u < 128) { w[0] = (char)u; return 1; }
        if (u < 256) { w[0] = (char)0xcc; w[1] = (char)u; return 2; }
        if (u < 65536) { w[0] = (char)0xcd; put_u16(w + 1, (uint16_t)u); return 3; }
        if (u < 4294967296ULL) { w[0] = (char)0xce; put_u32(w + 1, (uint32_t)u); return 5; }
        w[0] = (char)0xcf;
        put_u64(w + 1, u);
        return 9;
    }
    if (v >= -32) { w[0] = (char)(unsigned char)(0xe0 | (v + 32)); return 1; }
    if (v >= -128) { w[0] = (char)0xd0; w[1] = (char)(signed char)v; return 2; }
    if (v >= -32768) { w[0] = (char)0xd1; put_u16(w + 1, (uint16_t)v); return 3; }
    if (v >= -2147483648LL) { w[0] = (char)0xd2; put_u32(w + 1, (uint32_t)v); return 5; }
    w[0] = (char)0xd3;
    put_u64(w + 1, (uint64_t)v);
    return 9;
}

static int put_len(char *w, Py_ssize_t n, int small_tag, Py_ssize_t small_max,
                   unsigned char tag8, unsigned char tag16, unsigned char tag32) {
    if (small_tag >= 0 && n <= small_max) { w[0] = (char)(small_tag | n); return 1; }
    if (tag8 && n < 256) { w[0] = (char)tag8; w[1] = (char)n; return 2; }
    if (n < 65536) { w[0] = (char)tag16; put_u16(w + 1, (uint16_t)n); return 3; }
    w[0] = (char)tag32;
    put_u32(w + 1, (uint32_t)n);
    return 5;
}

#define PUT_BIN(w, n) put_len(w, n, -1, 0, 0xc4, 0xc5, 0xc6)
#define PUT_STR(w, n) put_len(w, n, 0xa0, 31, 0xd9, 0xda, 0xdb)
#define PUT_MAP(w, n) put_len(w, n, 0x80, 15, 0, 0xde, 0xdf)

static void put_raw(out_t *o, const void *data, Py_ssize_t n) {
    memcpy(o->data + o->len, data, (size_t)n);
    o->len += n;
}

static void put_key(out_t *o, const char *name) {
    const Py_ssize_t n = (Py_ssize_t)strlen(name);
    o->data[o->len++] = (char)(0xa0 | n);
    put_raw(o, name, n);
}

typedef struct {
    int found, deleted;
    long long offset, timestamp;
    const char *value; /* NULL: nil */
    Py_ssize_t value_len;
    const unsigned char *headers; /* the entry's header list */
    Py_ssize_t header_bytes;
    int header_count;
} answer_t;

#define ENTRY_BYTES 27
#define TOMBSTONE 1
#define HASHED 2
#define HEADERS_CHECKED_MAX 64

/* `raw` (a key index entry) for `key` as an answer: 1, or 0 to decline. */
static int read_entry(const unsigned char *raw, Py_ssize_t size, const char *key,
                      Py_ssize_t key_len, answer_t *a) {
    if (size < ENTRY_BYTES) return 0;
    a->offset = (long long)be64(raw);
    a->timestamp = (long long)be64(raw + 8);
    const unsigned flags = raw[16];
    const Py_ssize_t stored_len = be32(raw + 17), value_len = be32(raw + 21);
    const int count = (raw[25] << 8) | raw[26];
    Py_ssize_t p = ENTRY_BYTES;
    if (flags & HASHED) {
        if (stored_len > size - p) return 0;
        if (stored_len != key_len || memcmp(raw + p, key, (size_t)key_len) != 0) {
            a->found = 0; /* another key with the same hash */
            return 1;
        }
        p += stored_len;
    }
    if (value_len > size - p || a->offset < -1) return 0;
    a->found = 1;
    a->deleted = (flags & TOMBSTONE) != 0;
    a->value = a->deleted ? NULL : (const char *)raw + p;
    a->value_len = value_len;
    p += value_len;
    if (count > HEADERS_CHECKED_MAX) return 0;
    const unsigned char *names[HEADERS_CHECKED_MAX];
    Py_ssize_t name_lens[HEADERS_CHECKED_MAX];
    const Py_ssize_t headers_at = p;
    for (int i = 0; i < count; i++) {
        if (size - p < 2) return 0;
        const Py_ssize_t n = (raw[p] << 8) | raw[p + 1];
        if (n > size - p - 2) return 0;
        for (Py_ssize_t c = 0; c < n; c++)
            if (raw[p + 2 + c] & 0x80) return 0;
        for (int j = 0; j < i; j++)
            if (name_lens[j] == n && memcmp(names[j], raw + p + 2, (size_t)n) == 0) return 0;
        names[i] = raw + p + 2;
        name_lens[i] = n;
        p += 2 + n;
        if (size - p < 4) return 0;
        const Py_ssize_t v = be32(raw + p);
        if (v > size - p - 4) return 0;
        p += 4 + v;
    }
    a->headers = raw + headers_at;
    a->header_bytes = p - headers_at;
    a->header_count = count;
    return 1;
}

/* Append the RESPONSE frame of `a` for `cid`: 1, 0 when its header is over `header_max`
 * (nothing appended), -1 on error. */
static int put_answer(out_t *o, uint32_t cid, const answer_t *a, long long covered,
                      Py_ssize_t header_max) {
    /* The map's head, its keys (found, deleted, offset, timestamp_ms, value, headers and
     * covered_offset: 63 bytes with their fixstr heads), three ints, two bools, the value's
     * and the headers' heads, and each header's two heads. */
    const Py_ssize_t bound = 1 + 64 + 3 * HEAD_MAX + 2 + HEAD_MAX + a->value_len + HEAD_MAX +
                             a->header_bytes + 2 * HEAD_MAX * a->header_count;
    if (!reserve(o, PREFIX_BYTES + bound)) return -1;
    const Py_ssize_t frame_at = o->len;
    o->len += PREFIX_BYTES;
    const Py_ssize_t header_at = o->len;
    o->data[o->len++] = (char)0x87;
    put_key(o, "found");
    o->data[o->len++] = (char)(a->found ? 0xc3 : 0xc2);
    put_key(o, "deleted");
    o->data[o->len++] = (char)(a->found && a->deleted ? 0xc3 : 0xc2);
    put_key(o, "offset");
    o->len += put_int(o->data + o->len, a->found ? a->offset : -1);
    put_key(o, "timestamp_ms");
    o->len += put_int(o->data + o->len, a->found ? a->timestamp : -1);
    put_key(o, "value");
    if (a->found && a->value != NULL) {
        o->len += PUT_BIN(o->data + o->len, a->value_len);
        put_raw(o, a->value, a->value_len);
    } else {
        o->data[o->len++] = (char)0xc0;
    }
    put_key(o, "headers");
    const int count = a->found ? a->header_count : 0;
    o->len += PUT_MAP(o->data + o->len, count);
    const unsigned char *h = a->headers;
    for (int i = 0; i < count; i++) {
        const Py_ssize_t n = (h[0] << 8) | h[1];
        o->len += PUT_STR(o->data + o->len, n);
        put_raw(o, h + 2, n);
        h += 2 + n;
        const Py_ssize_t v = be32(h);
        o->len += PUT_BIN(o->data + o->len, v);
        put_raw(o, h + 4, v);
        h += 4 + v;
    }
    put_key(o, "covered_offset");
    o->len += put_int(o->data + o->len, covered);
    const Py_ssize_t header_len = o->len - header_at;
    if (header_len > header_max) {
        o->len = frame_at;
        return 0;
    }
    char *w = o->data + frame_at;
    put_u32(w, (uint32_t)(FIXED_BYTES + header_len));
    put_u32(w + 4, cid);
    w[8] = KIND_RESPONSE;
    w[9] = OP_GET;
    put_u32(w + 10, (uint32_t)header_len);
    return 1;
}

static PyObject *encode_gets(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "encode_gets takes 5 arguments");
        return NULL;
    }
    PyObject *cids = args[0], *keys = args[1], *raws = args[2];
    if (!PyList_Check(cids) || !PyList_Check(keys) || !PyList_Check(raws) ||
        PyList_GET_SIZE(keys) != PyList_GET_SIZE(cids) ||
        PyList_GET_SIZE(raws) != PyList_GET_SIZE(cids)) {
        PyErr_SetString(PyExc_TypeError, "encode_gets wants three lists of one length");
        return NULL;
    }
    const long long covered = PyLong_AsLongLong(args[3]);
    const Py_ssize_t header_max = PyLong_AsSsize_t(args[4]);
    if (PyErr_Occurred()) return NULL;
    if (covered < 0) {
        PyErr_SetString(PyExc_ValueError, "covered must not be negative");
        return NULL;
    }
    PyObject *declined = PyList_New(0);
    if (declined == NULL) return NULL;
    out_t o = {NULL, 0, 0};
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(cids); i++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *raw = PyList_GET_ITEM(raws, i);
        const unsigned long cid = PyLong_AsUnsignedLong(PyList_GET_ITEM(cids, i));
        if (cid == (unsigned long)-1 && PyErr_Occurred()) goto fail;
        if (!PyBytes_Check(key) || (raw != Py_None && !PyBytes_Check(raw))) {
            PyErr_SetString(PyExc_TypeError, "keys must be bytes, raws bytes or None");
            goto fail;
        }
        answer_t a = {0};
        int taken = cid <= 0xffffffffUL;
        if (taken && raw != Py_None)
            taken = read_entry((const unsigned char *)PyBytes_AS_STRING(raw),
                               PyBytes_GET_SIZE(raw), PyBytes_AS_STRING(key),
                               PyBytes_GET_SIZE(key), &a);
        if (taken) {
            taken = put_answer(&o, (uint32_t)cid, &a, covered, header_max);
            if (taken < 0) goto fail;
        }
        if (!taken) {
            PyObject *index = PyLong_FromSsize_t(i);
            if (index == NULL || PyList_Append(declined, index) < 0) {
                Py_XDECREF(index);
                goto fail;
            }
            Py_DECREF(index);
        }
    }
    PyObject *data = PyBytes_FromStringAndSize(o.data ? o.data : "", o.len);
    PyMem_Free(o.data);
    if (data == NULL) {
        Py_DECREF(declined);
        return NULL;
    }
    PyObject *result = PyTuple_Pack(2, data, declined);
    Py_DECREF(data);
    Py_DECREF(declined);
    return result;
fail:
    PyMem_Free(o.data);
    Py_DECREF(declined);
    return NULL;
}

static PyMethodDef methods[] = {
    {"take_gets", (PyCFunction)(void (*)(void))take_gets, METH_FASTCALL,
     "take_gets(buf, pos, frame_bytes_max, header_bytes_max, limit, out, bounds) -> int:"
     " see jetstream.server.bulk_gets."},
    {"encode_gets", (PyCFunction)(void (*)(void))encode_gets, METH_FASTCALL,
     "encode_gets(cids, keys, raws, covered, header_bytes_max) -> (bytes, declined):"
     " see jetstream.server.bulk_gets."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_gets_c",
    "GET requests answered in bulk, in C (jetstream.server.bulk_gets).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__gets_c(void) { return PyModule_Create(&module_def); }

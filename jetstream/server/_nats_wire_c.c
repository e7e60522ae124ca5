/* The hot loops of jetstream.server.nats_wire in C: the encoding of PUB commands (below), and
 * NatsParser's loop over MSG and HMSG operations whose control line is plain ASCII and whose
 * headers, if any, are a publisher's Nats-Msg-Id alone:
 *
 * parse(buf, pos, batches, line_max, payload_max, headers_max, msg_id_block, msg_id_key)
 *     -> (pos, need, slow)
 *
 * It parses from `pos` what it can, appending (subject, reply, headers, data) tuples to
 * `batches[sid][0]` and adding payload bytes to `batches[sid][1]`, exactly as the Python loop
 * does, and returns where it stopped: at the end of `buf` (need 1), before an operation that
 * has not wholly arrived (need: the bytes from `pos` it needs), or, with `slow` true, before
 * anything else (a control operation, other headers, non-ASCII, any field the Python loop
 * would refuse or read differently). The caller parses that one operation in Python (which
 * raises the Python loop's errors word for word) and calls again. So the C path never
 * decides anything the Python path would decide otherwise: it only declines.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../_decimal.h"
#include <string.h>

#define FIELDS_MAX 7
#define DIGITS_MAX 18

/* The first "\r\n" wholly inside [p, p + len), or NULL. */
static const char *find_crlf(const char *p, Py_ssize_t len) {
    const char *end = p + len;
    while (p < end) {
        const char *cr = memchr(p, '\r', (size_t)(end - p));
        if (cr == NULL || cr + 1 >= end) return NULL;
        if (cr[1] == '\n') return cr;
        p = cr + 1;
    }
    return NULL;
}

/* A non-negative decimal of 1..DIGITS_MAX ASCII digits, or -1. */
static long long parse_size(const char *p, Py_ssize_t len) {
    if (len < 1 || len > DIGITS_MAX) return -1;
    long long v = 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        if (p[i] < '0' || p[i] > '9') return -1;
        v = v * 10 + (p[i] - '0');
    }
    return v;
}

/* bytes.count(b"\r\n") over [p, p + len): non-overlapping, as Python counts. */
static Py_ssize_t count_crlf(const char *p, Py_ssize_t len) {
    Py_ssize_t count = 0;
    for (Py_ssize_t i = 0; i + 1 < len;) {
        if (p[i] == '\r' && p[i + 1] == '\n') {
            count++;
            i += 2;
        } else {
            i++;
        }
    }
    return count;
}

static int is_ascii(const char *p, Py_ssize_t len) {
    for (Py_ssize_t i = 0; i < len; i++)
        if ((unsigned char)p[i] >= 0x80) return 0;
    return 1;
}

/* What str.strip() strips of an ASCII string (Py_UNICODE_ISSPACE below 128). */
static int is_space(char c) {
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f');
}

typedef struct {
    PyObject *batches;   /* borrowed: sid -> [messages, payload bytes] */
    PyObject *sid;       /* owned: the sid of `pair`, or NULL */
    const char *sid_at;  /* its bytes in the buffer */
    Py_ssize_t sid_len;
    PyObject *pair;      /* owned */
    PyObject *msgs;      /* owned: pair[0] */
    long long nbytes;    /* payload bytes parsed for `pair` and not yet added to pair[1] */
    PyObject *subject;   /* owned: the last subject, reused while the next one is equal */
    const char *subject_at;
    Py_ssize_t subject_len;
} state_t;

/* Add `nbytes` to pair[1]; 0, or -1 with an exception set. */
static int flush_bytes(state_t *st) {
    if (st->pair == NULL || st->nbytes == 0) return 0;
    PyObject *old = PyList_GET_ITEM(st->pair, 1);
    PyObject *add = PyLong_FromLongLong(st->nbytes);
    if (add == NULL) return -1;
    PyObject *sum = PyNumber_Add(old, add);
    Py_DECREF(add);
    if (sum == NULL) return -1;
    PyList_SetItem(st->pair, 1, sum); /* steals `sum`, drops `old` */
    st->nbytes = 0;
    return 0;
}

/* Make `pair` the one of the sid at [at, at + len); 0, or -1 with an exception set. */
static int select_sid(state_t *st, const char *at, Py_ssize_t len) {
    if (st->sid != NULL && st->sid_len == len && memcmp(st->sid_at, at, (size_t)len) == 0)
        return 0;
    if (flush_bytes(st) < 0) return -1;
    PyObject *sid = PyUnicode_DecodeASCII(at, len, NULL);
    if (sid == NULL) return -1;
    PyObject *pair = PyDict_GetItemWithError(st->batches, sid); /* borrowed */
    if (pair == NULL) {
        if (PyErr_Occurred()) goto fail;
        PyObject *msgs = PyList_New(0);
        if (msgs == NULL) goto fail;
        PyObject *zero = PyLong_FromLong(0);
        if (zero == NULL) {
            Py_DECREF(msgs);
            goto fail;
        }
        pair = PyList_New(2);
        if (pair == NULL) {
            Py_DECREF(msgs);
            Py_DECREF(zero);
            goto fail;
        }
        PyList_SET_ITEM(pair, 0, msgs);
        PyList_SET_ITEM(pair, 1, zero);
        int bad = PyDict_SetItem(st->batches, sid, pair);
        Py_DECREF(pair); /* the dict holds it */
        if (bad < 0) goto fail;
    }
    if (!PyList_CheckExact(pair) || PyList_GET_SIZE(pair) != 2 ||
            !PyList_CheckExact(PyList_GET_ITEM(pair, 0))) {
        PyErr_SetString(PyExc_TypeError, "batches must map a sid to [list, int]");
        goto fail;
    }
    Py_INCREF(pair);
    Py_XSETREF(st->pair, pair);
    Py_INCREF(PyList_GET_ITEM(pair, 0));
    Py_XSETREF(st->msgs, PyList_GET_ITEM(pair, 0));
    Py_XSETREF(st->sid, sid);
    st->sid_at = at;
    st->sid_len = len;
    return 0;
fail:
    Py_DECREF(sid);
    return -1;
}

/* The subject at [at, at + len) as a new reference (the last one again when equal). */
static PyObject *subject_of(state_t *st, const char *at, Py_ssize_t len) {
    if (st->subject == NULL || st->subject_len != len ||
            memcmp(st->subject_at, at, (size_t)len) != 0) {
        PyObject *subject = PyUnicode_DecodeASCII(at, len, NULL);
        if (subject == NULL) return NULL;
        Py_XSETREF(st->subject, subject);
        st->subject_at = at;
        st->subject_len = len;
    }
    Py_INCREF(st->subject);
    return st->subject;
}

static PyObject *parse(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *buf_obj, *batches, *id_block_obj, *id_key;
    Py_ssize_t pos, line_max;
    long long payload_max, headers_max;
    if (!PyArg_ParseTuple(args, "O!nO!nLLO!U:parse", &PyBytes_Type, &buf_obj, &pos,
                          &PyDict_Type, &batches, &line_max, &payload_max, &headers_max,
                          &PyBytes_Type, &id_block_obj, &id_key))
        return NULL;
    const char *b = PyBytes_AS_STRING(buf_obj);
    const Py_ssize_t n = PyBytes_GET_SIZE(buf_obj);
    const char *id_block = PyBytes_AS_STRING(id_block_obj);
    const Py_ssize_t id_block_len = PyBytes_GET_SIZE(id_block_obj);
    if (pos < 0 || pos > n || line_max < 1) {
        PyErr_SetString(PyExc_ValueError, "bad position or limit");
        return NULL;
    }
    state_t st = {batches, NULL, NULL, 0, NULL, NULL, 0, NULL, NULL, 0};
    Py_ssize_t need = 1;
    int slow = 0;
    int failed = 0;
    while (pos < n) {
        Py_ssize_t window = line_max + 2 < n - pos ? line_max + 2 : n - pos;
        const char *eolp = find_crlf(b + pos, window);
        if (eolp == NULL) {
            if (n - pos > line_max + 1) {
                slow = 1; /* too long a line: Python raises */
            } else {
                need = n - pos + 1;
            }
            break;
        }
        const char *line = b + pos;
        const Py_ssize_t line_len = eolp - line;
        /* Fields split on single spaces; anything unusual goes to Python. */
        const char *at[FIELDS_MAX];
        Py_ssize_t len[FIELDS_MAX];
        int nf = 0;
        Py_ssize_t start_i = 0;
        int odd = 0;
        for (Py_ssize_t i = 0; i <= line_len; i++) {
            if (i == line_len || line[i] == ' ') {
                if (nf == FIELDS_MAX || i == start_i) {
                    odd = 1; /* too many fields, or an empty one */
                    break;
                }
                at[nf] = line + start_i;
                len[nf] = i - start_i;
                nf++;
                start_i = i + 1;
            } else if ((unsigned char)line[i] >= 0x80) {
                odd = 1;
                break;
            }
        }
        if (odd || nf < 4) {
            slow = 1;
            break;
        }
        const int is_msg = len[0] == 3 && memcmp(at[0], "MSG", 3) == 0 && nf <= 5;
        const int is_hmsg = len[0] == 4 && memcmp(at[0], "HMSG", 4) == 0 && nf == 6;
        if (!is_msg && !is_hmsg) {
            slow = 1;
            break;
        }
        const long long size = parse_size(at[nf - 1], len[nf - 1]);
        long long hdr_size = 0;
        if (size < 0) {
            slow = 1;
            break;
        }
        if (is_msg) {
            if (size > payload_max) {
                slow = 1;
                break;
            }
        } else {
            hdr_size = parse_size(at[4], len[4]);
            if (hdr_size < 0 || hdr_size > size || size - hdr_size > payload_max ||
                    size > payload_max + headers_max) {
                slow = 1;
                break;
            }
        }
        const Py_ssize_t start = (eolp - b) + 2;
        if ((long long)(n - start) < size + 2) {
            need = (Py_ssize_t)(start + size + 2 - pos);
            break;
        }
        const Py_ssize_t end = start + (Py_ssize_t)size;
        if (b[end] != '\r' || b[end + 1] != '\n') {
            slow = 1;
            break;
        }
        PyObject *headers = NULL;
        if (is_hmsg) {
            const char *block = b + start;
            const Py_ssize_t hlen = (Py_ssize_t)hdr_size;
            if (hlen < id_block_len + 4 || memcmp(block, id_block, (size_t)id_block_len) != 0 ||
                    memcmp(block + hlen - 4, "\r\n\r\n", 4) != 0 ||
                    count_crlf(block, hlen) != 3 || !is_ascii(block, hlen)) {
                slow = 1; /* other headers: Python's parse_headers */
                break;
            }
            const char *v = block + id_block_len;
            Py_ssize_t vlen = hlen - id_block_len - 4;
            while (vlen > 0 && is_space(v[0])) {
                v++;
                vlen--;
            }
            while (vlen > 0 && is_space(v[vlen - 1])) vlen--;
            PyObject *value = PyUnicode_DecodeASCII(v, vlen, NULL);
            if (value == NULL) {
                failed = 1;
                break;
            }
            headers = PyDict_New();
            if (headers == NULL || PyDict_SetItem(headers, id_key, value) < 0) {
                Py_DECREF(value);
                Py_XDECREF(headers);
                failed = 1;
                break;
            }
            Py_DECREF(value);
        }
        if (select_sid(&st, at[2], len[2]) < 0) {
            Py_XDECREF(headers);
            failed = 1;
            break;
        }
        PyObject *subject = subject_of(&st, at[1], len[1]);
        PyObject *reply = nf == (is_msg ? 5 : 6)
            ? PyUnicode_DecodeASCII(at[3], len[3], NULL) : (Py_INCREF(Py_None), Py_None);
        const Py_ssize_t data_at = start + (Py_ssize_t)hdr_size;
        PyObject *data = PyBytes_FromStringAndSize(b + data_at, end - data_at);
        PyObject *msg = NULL;
        if (subject != NULL && reply != NULL && data != NULL)
            msg = PyTuple_Pack(4, subject, reply, headers != NULL ? headers : Py_None, data);
        Py_XDECREF(subject);
        Py_XDECREF(reply);
        Py_XDECREF(data);
        Py_XDECREF(headers);
        if (msg == NULL || PyList_Append(st.msgs, msg) < 0) {
            Py_XDECREF(msg);
            failed = 1;
            break;
        }
        Py_DECREF(msg);
        st.nbytes += size - hdr_size;
        pos = end + 2;
    }
    /* What was parsed stays takeable, with its byte count, even after a failure. */
    if (flush_bytes(&st) < 0) failed = 1;
    Py_XDECREF(st.sid);
    Py_XDECREF(st.pair);
    Py_XDECREF(st.msgs);
    Py_XDECREF(st.subject);
    if (failed) return NULL;
    return Py_BuildValue("nnO", pos, need, slow ? Py_True : Py_False);
}

/* pub_commands(messages) -> bytes | None: `PUB <subject> <#bytes>\r\n<payload>\r\n` for
 * each (subject, payload) tuple, as jetstream.server.nats_wire.pub_commands makes them; None
 * (the caller encodes in Python, raising its errors) unless every item is a tuple of an ASCII
 * str subject without space, tab, CR or LF, and a bytes payload. */
static PyObject *pub_commands(PyObject *module, PyObject *arg) {
    (void)module;
    PyObject *seq = PySequence_Fast(arg, "messages must be a sequence");
    if (seq == NULL) return NULL;
    const Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = items[i];
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2) goto decline;
        PyObject *subject = PyTuple_GET_ITEM(item, 0);
        PyObject *payload = PyTuple_GET_ITEM(item, 1);
        if (!PyUnicode_CheckExact(subject) || !PyUnicode_IS_ASCII(subject) ||
                !PyBytes_CheckExact(payload))
            goto decline;
        const Py_ssize_t slen = PyUnicode_GET_LENGTH(subject);
        const char *sdata = (const char *)PyUnicode_1BYTE_DATA(subject);
        if (slen == 0) goto decline;
        for (Py_ssize_t j = 0; j < slen; j++) {
            const char c = sdata[j];
            if (c == ' ' || c == '\t' || c == '\r' || c == '\n') goto decline;
        }
        const Py_ssize_t plen = PyBytes_GET_SIZE(payload);
        total += 4 + slen + 1 + decimal_len((unsigned long long)plen) + 2 + plen + 2;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    char *w = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *subject = PyTuple_GET_ITEM(items[i], 0);
        PyObject *payload = PyTuple_GET_ITEM(items[i], 1);
        const Py_ssize_t slen = PyUnicode_GET_LENGTH(subject);
        const Py_ssize_t plen = PyBytes_GET_SIZE(payload);
        memcpy(w, "PUB ", 4);
        w += 4;
        memcpy(w, PyUnicode_1BYTE_DATA(subject), (size_t)slen);
        w += slen;
        *w++ = ' ';
        const int dlen = decimal_len((unsigned long long)plen);
        put_decimal(w, (unsigned long long)plen, dlen);
        w += dlen;
        *w++ = '\r';
        *w++ = '\n';
        memcpy(w, PyBytes_AS_STRING(payload), (size_t)plen);
        w += plen;
        *w++ = '\r';
        *w++ = '\n';
    }
    Py_DECREF(seq);
    return out;
decline:
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"pub_commands", pub_commands, METH_O,
     "pub_commands(messages) -> bytes | None: see jetstream.server.nats_wire.pub_commands."},
    {"parse", parse, METH_VARARGS,
     "parse(buf, pos, batches, line_max, payload_max, headers_max, msg_id_block, msg_id_key)"
     " -> (pos, need, slow): see jetstream.server.nats_wire."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_nats_wire_c",
    "The NATS parser's hot loop in C (jetstream.server.nats_wire).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__nats_wire_c(void) { return PyModule_Create(&module_def); }

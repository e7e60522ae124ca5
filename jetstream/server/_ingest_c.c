/* The loop of jetstream.server.ingest_batch.take_messages in C, for plain NATS messages.
 *
 * take_plain(msgs, start, max_bytes, policy, record_type, no_headers, msg_id,
 *            msg_id_chars_max, envelope_prefix, records, targets, expects, policies) -> int
 *
 * From `msgs[start]` on, each message (subject, reply, headers, data) it can take becomes
 * what the Python loop makes of it: a `record_type` tuple (value, key, headers, subject,
 * None) appended to `records`; when the message is acked (a policy other than "none")
 * and the reply is not empty, a target (index, reply, correlation id, policy, batch ack)
 * appended to `targets`; when `expects` is a list, the record's expectation appended to it
 * (None, or its message id). It takes, with a str subject and a reply that is None or a
 * str:
 * - a plain message: bytes data not over `max_bytes` that do not start with
 *   `envelope_prefix`, with NATS headers that are None, empty (the record gets
 *   `no_headers`), or `msg_id` alone with a str value of 1..`msg_id_chars_max` characters
 *   (the record gets {msg_id: value in UTF-8}; that needs `expects` to be a list);
 * - an envelope of the usual fields (read_published below), its value not over `max_bytes`:
 *   its value, key, correlation id, policy (one of `policies`: leader, all, none; else the
 *   stream's) and batch ack, the NATS headers ignored, as the Python loop does.
 *
 * It returns the index of the first message it does not take, or len(msgs): the caller
 * runs the Python loop on that one message, which decides it (and raises or refuses what is
 * wrong with it), and calls again from the next. The caller does not call it while messages
 * are refused for want of replicas (refuse_all).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

typedef struct {
    Py_ssize_t max_bytes, id_chars_max;
    PyTypeObject *record_type;
    PyObject *policy, *no_headers, *msg_id_name, *prefix; /* borrowed */
    PyObject *records, *targets, *expects;
    PyObject *policies[3]; /* borrowed: AckPolicy LEADER, ALL, NONE */
} plain_t;

/* The usual fields of an envelope (jetstream.protocol.envelope.Published), read from its
 * msgpack body when it is a fixmap of distinct fixstr keys among "value" (required), "key",
 * "correlation_id", "ack_policy" and "batch_ack", with a bin or nil value and key, an ASCII
 * correlation id of at most 256 characters or nil, a policy of "leader", "all", "none" or nil,
 * a bool or nil batch_ack, and nothing after the map. Anything else is declined (0), and the
 * Python loop decides: an ack inbox, headers, expectations, another encoding. */
typedef struct {
    const char *value, *key, *corr;
    Py_ssize_t value_len, key_len, corr_len; /* -1: nil */
    int policy;                               /* -1: nil, else an index in policies */
    int batch_ack;
} published_t;

#define CORRELATION_ID_CHARS_MAX 256

/* The length of the msgpack bin (bin 8/16/32) or str (fixstr, str 8) at body[at] and the size
 * of its head, or -1: another type, or a head cut short. */
static Py_ssize_t span_of(const unsigned char *body, Py_ssize_t size, Py_ssize_t at, int bin,
                          Py_ssize_t *head) {
    const unsigned char tag = body[at];
    if (bin && tag == 0xc4 && at + 2 <= size) {
        *head = 2;
        return body[at + 1];
    }
    if (bin && tag == 0xc5 && at + 3 <= size) {
        *head = 3;
        return ((Py_ssize_t)body[at + 1] << 8) | body[at + 2];
    }
    if (bin && tag == 0xc6 && at + 5 <= size) {
        *head = 5;
        return ((Py_ssize_t)body[at + 1] << 24) | ((Py_ssize_t)body[at + 2] << 16) |
               ((Py_ssize_t)body[at + 3] << 8) | body[at + 4];
    }
    if (!bin && (tag & 0xe0) == 0xa0) {
        *head = 1;
        return tag & 0x1f;
    }
    if (!bin && tag == 0xd9 && at + 2 <= size) {
        *head = 2;
        return body[at + 1];
    }
    return -1;
}

/* A msgpack nil, or a bin (`bin`) or an ASCII str (else), at body[*at]: 1 (advanced past it;
 * nil: data NULL and len -1), 0 to decline. */
static int read_bytes(const unsigned char *body, Py_ssize_t size, Py_ssize_t *at, int bin,
                      const char **data, Py_ssize_t *len) {
    if (*at >= size) return 0;
    if (body[*at] == 0xc0) {
        *data = NULL;
        *len = -1;
        *at += 1;
        return 1;
    }
    Py_ssize_t head = 0;
    const Py_ssize_t n = span_of(body, size, *at, bin, &head);
    if (n < 0 || n > size - *at - head) return 0;
    const unsigned char *s = body + *at + head;
    if (!bin)
        for (Py_ssize_t i = 0; i < n; i++)
            if (s[i] & 0x80) return 0;
    *data = (const char *)s;
    *len = n;
    *at += head + n;
    return 1;
}

static int key_is(const unsigned char *k, Py_ssize_t n, const char *name) {
    return (size_t)n == strlen(name) && memcmp(k, name, (size_t)n) == 0;
}

/* `body` (after the envelope's prefix) as the usual fields: 1, or 0 to decline. */
static int read_published(const unsigned char *body, Py_ssize_t size, published_t *p) {
    if (size < 1 || (body[0] & 0xf0) != 0x80) return 0;
    const int entries = body[0] & 0x0f;
    Py_ssize_t at = 1;
    unsigned seen = 0;
    p->value = p->key = p->corr = NULL;
    p->value_len = p->key_len = p->corr_len = -1;
    p->policy = -1;
    p->batch_ack = 0;
    for (int e = 0; e < entries; e++) {
        if (at >= size || (body[at] & 0xe0) != 0xa0) return 0;
        const Py_ssize_t klen = body[at] & 0x1f;
        if (klen > size - at - 1) return 0;
        const unsigned char *k = body + at + 1;
        at += 1 + klen;
        unsigned bit;
        if (key_is(k, klen, "value")) {
            bit = 1;
            if (!read_bytes(body, size, &at, 1, &p->value, &p->value_len)) return 0;
        } else if (key_is(k, klen, "key")) {
            bit = 2;
            if (!read_bytes(body, size, &at, 1, &p->key, &p->key_len)) return 0;
        } else if (key_is(k, klen, "correlation_id")) {
            bit = 4;
            if (!read_bytes(body, size, &at, 0, &p->corr, &p->corr_len) ||
                    p->corr_len > CORRELATION_ID_CHARS_MAX)
                return 0;
        } else if (key_is(k, klen, "ack_policy")) {
            bit = 8;
            const char *s;
            Py_ssize_t n;
            if (!read_bytes(body, size, &at, 0, &s, &n)) return 0;
            if (n < 0) p->policy = -1;
            else if (n == 6 && memcmp(s, "leader", 6) == 0) p->policy = 0;
            else if (n == 3 && memcmp(s, "all", 3) == 0) p->policy = 1;
            else if (n == 4 && memcmp(s, "none", 4) == 0) p->policy = 2;
            else return 0;
        } else if (key_is(k, klen, "batch_ack")) {
            bit = 16;
            if (at >= size) return 0;
            if (body[at] == 0xc3) p->batch_ack = 1;
            else if (body[at] == 0xc2 || body[at] == 0xc0) p->batch_ack = 0;
            else return 0;
            at += 1;
        } else {
            return 0;
        }
        if (seen & bit) return 0; /* a key twice: msgpack keeps the last; Python decides */
        seen |= bit;
    }
    return (seen & 1) && at == size;
}

/* 1 when `msg` was plain and taken, 0 to decline, -1 with an exception set. */
static int take_one(PyObject *msg, const plain_t *a) {
    const Py_ssize_t max_bytes = a->max_bytes, id_chars_max = a->id_chars_max;
    PyObject *policy = a->policy, *no_headers = a->no_headers, *msg_id_name = a->msg_id_name;
    int acked = policy != a->policies[2]; /* the stream's policy is not "none" */
    PyObject *prefix = a->prefix, *records = a->records, *targets = a->targets;
    PyObject *expects = a->expects;
    PyTypeObject *record_type = a->record_type;

    if (!PyTuple_CheckExact(msg) || PyTuple_GET_SIZE(msg) != 4) return 0;
    PyObject *subject = PyTuple_GET_ITEM(msg, 0), *reply = PyTuple_GET_ITEM(msg, 1);
    PyObject *nats_headers = PyTuple_GET_ITEM(msg, 2), *data = PyTuple_GET_ITEM(msg, 3);
    if (!PyUnicode_CheckExact(subject) || !PyBytes_CheckExact(data)) return 0;
    if (reply != Py_None && !PyUnicode_CheckExact(reply)) return 0;
    const Py_ssize_t size = PyBytes_GET_SIZE(data), prefix_size = PyBytes_GET_SIZE(prefix);
    PyObject *headers, *expect = Py_None; /* headers: a new reference */
    PyObject *value = data, *key = Py_None, *corr = Py_None; /* new references when read */
    int batch_ack = 0, own_fields = 0;
    if (size >= prefix_size &&
            memcmp(PyBytes_AS_STRING(data), PyBytes_AS_STRING(prefix), prefix_size) == 0) {
        published_t p;
        if (!read_published((const unsigned char *)PyBytes_AS_STRING(data) + prefix_size,
                            size - prefix_size, &p) ||
                p.value_len > max_bytes)
            return 0;
        if (p.policy >= 0) {
            policy = a->policies[p.policy];
            acked = policy != a->policies[2];
        }
        batch_ack = p.batch_ack;
        value = p.value_len < 0 ? Py_NewRef(Py_None)
                                : PyBytes_FromStringAndSize(p.value, p.value_len);
        key = p.key_len < 0 ? Py_NewRef(Py_None) : PyBytes_FromStringAndSize(p.key, p.key_len);
        corr = p.corr_len < 0 ? Py_NewRef(Py_None)
                              : PyUnicode_DecodeASCII(p.corr, p.corr_len, NULL);
        own_fields = 1;
        if (value == NULL || key == NULL || corr == NULL) goto fail_fields;
        headers = Py_NewRef(no_headers);
    } else if (size > max_bytes) {
        return 0;
    } else if (nats_headers == Py_None ||
            (PyDict_CheckExact(nats_headers) && PyDict_GET_SIZE(nats_headers) == 0)) {
        headers = Py_NewRef(no_headers);
    } else {
        if (!PyDict_CheckExact(nats_headers) || PyDict_GET_SIZE(nats_headers) != 1 ||
                expects == Py_None)
            return 0;
        PyObject *id = PyDict_GetItemWithError(nats_headers, msg_id_name);
        if (id == NULL) {
            if (PyErr_Occurred()) PyErr_Clear();
            return 0;
        }
        if (!PyUnicode_CheckExact(id)) return 0;
        const Py_ssize_t chars = PyUnicode_GET_LENGTH(id);
        if (chars < 1 || chars > id_chars_max) return 0;
        PyObject *encoded = PyUnicode_AsUTF8String(id);
        if (encoded == NULL) { /* a lone surrogate: Python raises */
            PyErr_Clear();
            return 0;
        }
        headers = PyDict_New();
        if (headers == NULL) {
            Py_DECREF(encoded);
            return -1;
        }
        const int set = PyDict_SetItem(headers, msg_id_name, encoded);
        Py_DECREF(encoded);
        if (set < 0) {
            Py_DECREF(headers);
            return -1;
        }
        expect = id;
    }

    const int wants_ack = acked && reply != Py_None && PyUnicode_GET_LENGTH(reply) > 0;
    PyObject *target = NULL;
    if (wants_ack) {
        PyObject *index = PyLong_FromSsize_t(PyList_GET_SIZE(records));
        if (index == NULL) goto fail;
        target = PyTuple_Pack(5, index, reply, corr, policy, batch_ack ? Py_True : Py_False);
        Py_DECREF(index);
        if (target == NULL) goto fail;
    }
    PyObject *record = record_type->tp_alloc(record_type, 5);
    if (record == NULL) goto fail;
    PyTuple_SET_ITEM(record, 0, Py_NewRef(value));
    PyTuple_SET_ITEM(record, 1, Py_NewRef(key));
    PyTuple_SET_ITEM(record, 2, headers); /* the reference moves into the record */
    headers = NULL;
    PyTuple_SET_ITEM(record, 3, Py_NewRef(subject));
    PyTuple_SET_ITEM(record, 4, Py_NewRef(Py_None));
    int result = 1;
    if ((expects != Py_None && PyList_Append(expects, expect) < 0) ||
            (target != NULL && PyList_Append(targets, target) < 0) ||
            PyList_Append(records, record) < 0)
        result = -1;
    Py_DECREF(record);
    Py_XDECREF(target);
    if (own_fields) {
        Py_DECREF(value);
        Py_DECREF(key);
        Py_DECREF(corr);
    }
    return result;

fail:
    Py_XDECREF(headers);
    Py_XDECREF(target);
fail_fields:
    if (own_fields) {
        Py_XDECREF(value);
        Py_XDECREF(key);
        Py_XDECREF(corr);
    }
    return -1;
}

static PyObject *take_plain(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "take_plain takes 13 arguments");
        return NULL;
    }
    PyObject *policies = args[12];
    if (!PyTuple_CheckExact(policies) || PyTuple_GET_SIZE(policies) != 3) {
        PyErr_SetString(PyExc_TypeError, "policies must be (leader, all, none)");
        return NULL;
    }
    PyObject *msgs = args[0], *records = args[9], *targets = args[10], *expects = args[11];
    if (!PyList_CheckExact(msgs) || !PyList_CheckExact(records) ||
            !PyList_CheckExact(targets) || (expects != Py_None && !PyList_CheckExact(expects))) {
        PyErr_SetString(PyExc_TypeError, "msgs, records and targets must be lists, expects a "
                                         "list or None");
        return NULL;
    }
    if (!PyLong_CheckExact(args[2]) || !PyLong_CheckExact(args[7]) ||
            !PyBytes_CheckExact(args[8]) || !PyUnicode_CheckExact(args[6]) ||
            !PyType_Check(args[4]) ||
            !PyType_IsSubtype((PyTypeObject *)args[4], &PyTuple_Type) ||
            ((PyTypeObject *)args[4])->tp_basicsize != PyTuple_Type.tp_basicsize) {
        PyErr_SetString(PyExc_TypeError, "take_plain: bad limits, msg_id, prefix or "
                                         "record_type");
        return NULL;
    }
    plain_t a = {
        .max_bytes = PyLong_AsSsize_t(args[2]), .id_chars_max = PyLong_AsSsize_t(args[7]),
        .record_type = (PyTypeObject *)args[4],
        .policy = args[3], .no_headers = args[5], .msg_id_name = args[6], .prefix = args[8],
        .records = records, .targets = targets, .expects = expects,
        .policies = {PyTuple_GET_ITEM(policies, 0), PyTuple_GET_ITEM(policies, 1),
                     PyTuple_GET_ITEM(policies, 2)},
    };
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    if ((a.max_bytes == -1 || a.id_chars_max == -1 || i == -1) && PyErr_Occurred())
        return NULL;
    if (i < 0) i = 0;
    for (; i < PyList_GET_SIZE(msgs); i++) {
        const int taken = take_one(PyList_GET_ITEM(msgs, i), &a);
        if (taken < 0) return NULL;
        if (taken == 0) break;
    }
    return PyLong_FromSsize_t(i);
}

static PyMethodDef methods[] = {
    {"take_plain", (PyCFunction)(void (*)(void))take_plain, METH_FASTCALL,
     "take_plain(msgs, start, max_bytes, policy, record_type, no_headers, msg_id,"
     " msg_id_chars_max, envelope_prefix, records, targets, expects, policies) -> int:"
     " see jetstream.server.ingest_batch.take_messages."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_ingest_c",
    "The ingest batch's loop in C (jetstream.server.ingest_batch).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__ingest_c(void) { return PyModule_Create(&module_def); }

/* The records loop of jetstream.stream.format.encode_batch_parts in C.
 *
 * encode_records(records, now_ms, record_bytes_max, record_type)
 *     -> (body, first_ts, max_ts) | None
 *
 * `records` are format.Record tuples (`record_type`: other objects are declined) (value, key, headers, subject, timestamp_ms), given
 * consecutive offset deltas; `record_bytes_max` < 0 means no limit. It returns the records'
 * bytes exactly as the Python loop joins them, with the batch's first and largest timestamp,
 * or None (the caller then runs the Python loop, which raises its errors) for anything it does
 * not encode itself: headers that are not a dict of str to bytes, a value, key, subject or
 * timestamp of another type, a subject or header name that is not valid UTF-8, a field out of
 * its range, a record over the limit.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "../_big_endian.h"
#include <string.h>

#define RECORD_HEADER_BYTES 28
#define NULL_VALUE_LENGTH 0xFFFFFFFFu

typedef struct {
    const char *key, *value, *subject;
    Py_ssize_t key_len, value_len, subject_len; /* key_len -1: none; value_len -1: null */
    long long ts;
    PyObject *headers;      /* borrowed: a dict with items, or NULL */
    Py_ssize_t header_bytes; /* their encoded size */
} fields_t;

/* The encoded size of `headers` (a dict of str -> bytes): >= 0, -2 to decline. */
static Py_ssize_t header_bytes_of(PyObject *headers) {
    if (!PyDict_CheckExact(headers) || PyDict_GET_SIZE(headers) > 0xFFFF) return -2;
    Py_ssize_t at = 0, total = 0, name_len;
    PyObject *name, *value;
    while (PyDict_Next(headers, &at, &name, &value)) {
        if (!PyUnicode_CheckExact(name) || !PyBytes_CheckExact(value) ||
                PyBytes_GET_SIZE(value) > (Py_ssize_t)UINT32_MAX)
            return -2;
        if (PyUnicode_AsUTF8AndSize(name, &name_len) == NULL) {
            PyErr_Clear(); /* not valid UTF-8: Python raises */
            return -2;
        }
        if (name_len > 0xFFFF) return -2; /* Python's struct.pack raises */
        total += 2 + name_len + 4 + PyBytes_GET_SIZE(value);
    }
    return total;
}

/* `obj`'s bytes (None: NULL and length -1): 1, or 0 when it is neither bytes nor None. */
static int bytes_or_none(PyObject *obj, const char **data, Py_ssize_t *len) {
    if (obj == Py_None) {
        *data = NULL;
        *len = -1;
        return 1;
    }
    if (!PyBytes_CheckExact(obj)) return 0;
    *data = PyBytes_AS_STRING(obj);
    *len = PyBytes_GET_SIZE(obj);
    return 1;
}

/* The fields of one record: 1, 0 to decline, -1 with an exception set. */
static int fields_of(PyObject *record, PyObject *record_type, long long now_ms, fields_t *f) {
    if ((PyObject *)Py_TYPE(record) != record_type || PyTuple_GET_SIZE(record) != 5) return 0;
    PyObject *value = PyTuple_GET_ITEM(record, 0);
    PyObject *key = PyTuple_GET_ITEM(record, 1);
    PyObject *headers = PyTuple_GET_ITEM(record, 2);
    PyObject *subject = PyTuple_GET_ITEM(record, 3);
    PyObject *ts = PyTuple_GET_ITEM(record, 4);
    if (!bytes_or_none(value, &f->value, &f->value_len) ||
            !bytes_or_none(key, &f->key, &f->key_len))
        return 0;
    const int has_headers = PyObject_IsTrue(headers);
    if (has_headers < 0) {
        PyErr_Clear();
        return 0;
    }
    f->headers = NULL;
    f->header_bytes = 0;
    if (has_headers) {
        f->header_bytes = header_bytes_of(headers);
        if (f->header_bytes < 0) return 0;
        f->headers = headers;
    }
    if (!PyUnicode_CheckExact(subject)) return 0;
    f->subject = PyUnicode_AsUTF8AndSize(subject, &f->subject_len);
    if (f->subject == NULL) {
        PyErr_Clear(); /* not valid UTF-8: Python raises */
        return 0;
    }
    if (ts == Py_None) {
        f->ts = now_ms;
    } else if (PyLong_CheckExact(ts)) {
        int overflow = 0;
        f->ts = PyLong_AsLongLongAndOverflow(ts, &overflow);
        if (overflow || (f->ts == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
    } else {
        return 0;
    }
    return 1;
}

static PyObject *encode_records(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *records, *record_type;
    long long now_ms, record_bytes_max;
    if (!PyArg_ParseTuple(args, "OLLO!:encode_records", &records, &now_ms, &record_bytes_max,
                          &PyType_Type, &record_type))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)record_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "record_type must be a tuple type");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(records, "records must be a sequence");
    if (seq == NULL) return NULL;
    const Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    if (count == 0 || count > (Py_ssize_t)UINT32_MAX) goto decline;
    fields_t f;
    long long first_ts = 0, max_ts = 0;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        const int got = fields_of(items[i], record_type, now_ms, &f);
        if (got < 0) goto fail;
        if (got == 0) goto decline;
        if (i == 0) first_ts = max_ts = f.ts;
        if (f.ts > max_ts) max_ts = f.ts;
        long long ts_delta;
        if (__builtin_sub_overflow(f.ts, first_ts, &ts_delta)) goto decline;
        if (f.subject_len > 0xFFFF || f.key_len > INT32_MAX ||
                f.value_len >= (Py_ssize_t)NULL_VALUE_LENGTH)
            goto decline;
        const long long length = RECORD_HEADER_BYTES - 4 + (f.value_len < 0 ? 0 : f.value_len)
            + f.subject_len + (f.key_len < 0 ? 0 : f.key_len) + f.header_bytes;
        if (length > (long long)UINT32_MAX) goto decline;
        if (record_bytes_max >= 0 && length + 4 > record_bytes_max) goto decline;
        total += (Py_ssize_t)length + 4;
    }
    PyObject *body = PyBytes_FromStringAndSize(NULL, total);
    if (body == NULL) goto fail;
    char *w = PyBytes_AS_STRING(body);
    for (Py_ssize_t i = 0; i < count; i++) {
        if (fields_of(items[i], record_type, now_ms, &f) != 1) { /* the same record: it cannot change */
            Py_DECREF(body);
            goto fail_or_decline;
        }
        const Py_ssize_t value_len = f.value_len < 0 ? 0 : f.value_len;
        const Py_ssize_t key_len = f.key_len < 0 ? 0 : f.key_len;
        const uint32_t length = (uint32_t)(RECORD_HEADER_BYTES - 4 + value_len + f.subject_len
                                           + key_len + f.header_bytes);
        put_u32(w, length);
        put_u32(w + 4, (uint32_t)i);
        put_u64(w + 8, (uint64_t)(f.ts - first_ts));
        put_u32(w + 16, f.key_len < 0 ? 0xFFFFFFFFu : (uint32_t)f.key_len);
        put_u32(w + 20, f.value_len < 0 ? NULL_VALUE_LENGTH : (uint32_t)f.value_len);
        put_u16(w + 24, (uint16_t)f.subject_len);
        put_u16(w + 26, (uint16_t)(f.headers == NULL ? 0 : PyDict_GET_SIZE(f.headers)));
        w += RECORD_HEADER_BYTES;
        if (key_len) memcpy(w, f.key, (size_t)key_len);
        w += key_len;
        if (value_len) memcpy(w, f.value, (size_t)value_len);
        w += value_len;
        if (f.subject_len) memcpy(w, f.subject, (size_t)f.subject_len);
        w += f.subject_len;
        if (f.headers != NULL) {
            Py_ssize_t at = 0, name_len;
            PyObject *name, *hvalue;
            while (PyDict_Next(f.headers, &at, &name, &hvalue)) {
                const char *name_data = PyUnicode_AsUTF8AndSize(name, &name_len);
                const Py_ssize_t hlen = PyBytes_GET_SIZE(hvalue);
                put_u16(w, (uint16_t)name_len);
                memcpy(w + 2, name_data, (size_t)name_len);
                w += 2 + name_len;
                put_u32(w, (uint32_t)hlen);
                memcpy(w + 4, PyBytes_AS_STRING(hvalue), (size_t)hlen);
                w += 4 + hlen;
            }
        }
    }
    Py_DECREF(seq);
    return Py_BuildValue("NLL", body, first_ts, max_ts);
fail_or_decline:
    if (PyErr_Occurred()) goto fail;
decline:
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef methods[] = {
    {"encode_records", encode_records, METH_VARARGS,
     "encode_records(records, now_ms, record_bytes_max, record_type)"
     " -> (body, first_ts, max_ts) | None:"
     " see jetstream.stream.format.encode_batch_parts."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_format_c",
    "The record batch encoder's loop in C (jetstream.stream.format).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__format_c(void) { return PyModule_Create(&module_def); }

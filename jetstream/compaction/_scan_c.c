/* The records loop of jetstream.compaction.offset_map.scan_keys in C.
 *
 * scan_keys(buf, pos, size, base_offset, last_offset_delta, record_count) -> list | None
 *
 * (offset, key or None, is_tombstone) of each record of the batch of `size` bytes at `pos`
 * of `buf`, whose header says `base_offset`, `last_offset_delta` and `record_count`: what
 * the Python loop gives. It returns None (the caller then runs the Python loop, which raises
 * its errors or reads what it reads) for a record header or record that runs past the batch,
 * an offset delta past the last, records that do not end where the batch does, and a key
 * that runs past its record.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "../_big_endian.h"

#define BATCH_HEADER_BYTES 47
#define RECORD_HEADER_BYTES 28
#define NULL_VALUE_LENGTH 0xFFFFFFFFu

static PyObject *scan_keys(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "scan_keys takes 6 arguments");
        return NULL;
    }
    const Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    const Py_ssize_t size = PyLong_AsSsize_t(args[2]);
    const long long base = PyLong_AsLongLong(args[3]);
    const long long last_delta = PyLong_AsLongLong(args[4]);
    const Py_ssize_t count = PyLong_AsSsize_t(args[5]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *buf = view.buf;
    PyObject *out = NULL;
    if (pos < 0 || size < BATCH_HEADER_BYTES || count < 0 || pos > view.len - size)
        goto decline;
    const Py_ssize_t end = pos + size;
    out = PyList_New(count);
    if (out == NULL) goto fail;
    Py_ssize_t p = pos + BATCH_HEADER_BYTES;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (p + RECORD_HEADER_BYTES > end) goto decline;
        const unsigned char *r = buf + p;
        const Py_ssize_t rec_end = p + 4 + (Py_ssize_t)be32(r);
        const uint32_t delta = be32(r + 4);
        const int32_t key_len = (int32_t)be32(r + 16);
        const uint32_t value_len = be32(r + 20);
        if (rec_end > end || (long long)delta > last_delta) goto decline;
        PyObject *key;
        if (key_len >= 0) {
            const Py_ssize_t start = p + RECORD_HEADER_BYTES;
            if (start + key_len > rec_end) goto decline;
            key = PyBytes_FromStringAndSize((const char *)buf + start, key_len);
        } else {
            key = Py_NewRef(Py_None);
        }
        if (key == NULL) goto fail;
        PyObject *offset = PyLong_FromLongLong(base + (long long)delta);
        if (offset == NULL) {
            Py_DECREF(key);
            goto fail;
        }
        PyObject *info = PyTuple_New(3);
        if (info == NULL) {
            Py_DECREF(key);
            Py_DECREF(offset);
            goto fail;
        }
        PyTuple_SET_ITEM(info, 0, offset);
        PyTuple_SET_ITEM(info, 1, key);
        PyTuple_SET_ITEM(info, 2, Py_NewRef(value_len == NULL_VALUE_LENGTH ? Py_True : Py_False));
        PyList_SET_ITEM(out, i, info);
        p = rec_end;
    }
    if (p != end) goto decline;
    PyBuffer_Release(&view);
    return out;
decline:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    return NULL;
}

static PyMethodDef methods[] = {
    {"scan_keys", (PyCFunction)(void (*)(void))scan_keys, METH_FASTCALL,
     "scan_keys(buf, pos, size, base_offset, last_offset_delta, record_count) -> list | None:"
     " see jetstream.compaction.offset_map.scan_keys."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_scan_c",
    "The cleaner's record key scan in C (jetstream.compaction.offset_map).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__scan_c(void) { return PyModule_Create(&module_def); }

/* The targets loop of jetstream.protocol.ack.AckEncoder.encode_targets in C:
 *
 * encode_targets(targets, start, base, records, record_type, prefix, tails,
 *                leader_policy, leader_out, all_policy, all_out, all_targets) -> (at, end)
 *
 * From `targets[start]` on, it does what the Python loop does for each (index, inbox,
 * correlation id, policy, batch ack) target it can do itself: a single ack, correlation id
 * None, policy `leader_policy` or `all_policy` (the very objects), the record at `index` an
 * exact `record_type` whose subject is an exact str, and the (subject, policy) tail already
 * in the encoder's `tails` cache (an exact bytes). For such a target it appends
 * (inbox, None) to `all_targets` when the policy is `all_policy`, then
 * (inbox, prefix + b"%d" % (base + index) + tail) to `leader_out` or `all_out`.
 * It stops at the first target it declines (anything else: a batch ack, a correlation id,
 * another policy or type, an index out of range, an offset outside [0, 2**63), a tail not
 * cached yet) and returns `at`, its index, or len(targets), and `end`: past the targets
 * after it that it would decline as surely (a batch ack, a correlation id). The caller
 * encodes targets[at:end] in Python (which fills the cache, clearing it when full) and calls
 * again from `end`. The cache is only read here, with one lookup of the same key per target
 * as Python does, so the C path never decides anything the Python path would decide
 * otherwise: it only declines.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../_decimal.h"
#include <string.h>

#define NARGS 12
#define TARGET_FIELDS 5
#define SUBJECT_FIELD 3

/* prefix + decimal(offset) + tail, a new bytes object, or NULL with an exception set. */
static PyObject *ack_of(PyObject *prefix, unsigned long long offset, PyObject *tail) {
    const Py_ssize_t plen = PyBytes_GET_SIZE(prefix);
    const Py_ssize_t tlen = PyBytes_GET_SIZE(tail);
    const int dlen = decimal_len(offset);
    PyObject *ack = PyBytes_FromStringAndSize(NULL, plen + dlen + tlen);
    if (ack == NULL) return NULL;
    char *w = PyBytes_AS_STRING(ack);
    memcpy(w, PyBytes_AS_STRING(prefix), (size_t)plen);
    put_decimal(w + plen, offset, dlen);
    memcpy(w + plen + dlen, PyBytes_AS_STRING(tail), (size_t)tlen);
    return ack;
}

/* Append (a, b) to `list`; 0, or -1 with an exception set. */
static int append_pair(PyObject *list, PyObject *a, PyObject *b) {
    PyObject *pair = PyTuple_New(2);
    if (pair == NULL) return -1;
    Py_INCREF(a);
    PyTuple_SET_ITEM(pair, 0, a);
    Py_INCREF(b);
    PyTuple_SET_ITEM(pair, 1, b);
    const int bad = PyList_Append(list, pair);
    Py_DECREF(pair);
    return bad;
}

/* Whether C declines `target` whatever the cache holds: a batch ack, a correlation id. */
static int surely_declined(PyObject *target) {
    return !PyTuple_CheckExact(target) || PyTuple_GET_SIZE(target) != TARGET_FIELDS ||
        PyTuple_GET_ITEM(target, 2) != Py_None || PyTuple_GET_ITEM(target, 4) != Py_False;
}

static PyObject *encode_targets(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != NARGS) {
        PyErr_Format(PyExc_TypeError, "encode_targets takes %d arguments (%zd given)", NARGS,
                     nargs);
        return NULL;
    }
    PyObject *targets = args[0], *base_obj = args[2], *records = args[3];
    PyObject *record_type = args[4], *prefix = args[5], *tails = args[6];
    PyObject *leader_policy = args[7], *leader_out = args[8];
    PyObject *all_policy = args[9], *all_out = args[10], *all_targets = args[11];
    const Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    if (!PyList_Check(targets) || start < 0 || start > PyList_GET_SIZE(targets)) {
        PyErr_SetString(PyExc_ValueError, "start must be an index of the targets list");
        return NULL;
    }
    if (leader_policy == all_policy) {
        PyErr_SetString(PyExc_ValueError, "the leader and all policies must differ");
        return NULL;
    }
    /* Anything but the plain types the broker passes: all of it to Python. */
    if (!PyList_CheckExact(targets) || !PyList_CheckExact(records) ||
            !PyType_Check(record_type) ||
            !PyType_IsSubtype((PyTypeObject *)record_type, &PyTuple_Type) ||
            !PyBytes_CheckExact(prefix) || !PyDict_CheckExact(tails) ||
            !PyList_CheckExact(leader_out) || !PyList_CheckExact(all_out) ||
            !PyList_CheckExact(all_targets) || !PyLong_CheckExact(base_obj))
        return Py_BuildValue("nn", start, start + (start < PyList_GET_SIZE(targets)));
    int overflow = 0;
    const long long base = PyLong_AsLongLongAndOverflow(base_obj, &overflow);
    if (base == -1 && PyErr_Occurred()) return NULL;
    if (overflow || base < 0)
        return Py_BuildValue("nn", start, start + (start < PyList_GET_SIZE(targets)));

    PyObject *key = NULL; /* owned: the last (subject, policy) looked up, reused while equal */
    Py_ssize_t k = start;
    for (; k < PyList_GET_SIZE(targets); k++) {
        PyObject *target = PyList_GET_ITEM(targets, k);
        if (surely_declined(target)) break;
        PyObject *index_obj = PyTuple_GET_ITEM(target, 0);
        PyObject *policy = PyTuple_GET_ITEM(target, 3);
        if ((policy != leader_policy && policy != all_policy) || !PyLong_CheckExact(index_obj))
            break;
        const Py_ssize_t index = PyLong_AsSsize_t(index_obj);
        if (index == -1 && PyErr_Occurred()) {
            PyErr_Clear(); /* too large: Python raises its IndexError */
            break;
        }
        if (index < 0 || index >= PyList_GET_SIZE(records)) break;
        long long offset;
        if (__builtin_add_overflow(base, (long long)index, &offset)) break;
        PyObject *record = PyList_GET_ITEM(records, index);
        if ((PyObject *)Py_TYPE(record) != record_type ||
                PyTuple_GET_SIZE(record) <= SUBJECT_FIELD)
            break;
        PyObject *subject = PyTuple_GET_ITEM(record, SUBJECT_FIELD);
        if (!PyUnicode_CheckExact(subject)) break;
        /* A lookup can run Python code (a cached key's __eq__): hold what is read. */
        Py_INCREF(target);
        if (key == NULL || PyTuple_GET_ITEM(key, 0) != subject ||
                PyTuple_GET_ITEM(key, 1) != policy) {
            PyObject *new_key = PyTuple_Pack(2, subject, policy);
            if (new_key == NULL) {
                Py_DECREF(target);
                goto fail;
            }
            Py_XSETREF(key, new_key);
        }
        PyObject *tail = PyDict_GetItemWithError(tails, key); /* borrowed */
        if (tail == NULL || !PyBytes_CheckExact(tail)) {
            Py_DECREF(target);
            if (PyErr_Occurred()) goto fail;
            break; /* not cached: Python encodes it and caches its tail */
        }
        Py_INCREF(tail);
        PyObject *inbox = PyTuple_GET_ITEM(target, 1);
        PyObject *ack = ack_of(prefix, (unsigned long long)offset, tail);
        Py_DECREF(tail);
        int bad = ack == NULL;
        if (!bad && policy == all_policy) bad = append_pair(all_targets, inbox, Py_None) < 0;
        if (!bad) bad = append_pair(policy == leader_policy ? leader_out : all_out, inbox,
                                    ack) < 0;
        Py_XDECREF(ack);
        Py_DECREF(target);
        if (bad) goto fail;
    }
    Py_XDECREF(key);
    Py_ssize_t end = k;
    if (end < PyList_GET_SIZE(targets)) {
        end++;
        while (end < PyList_GET_SIZE(targets) && surely_declined(PyList_GET_ITEM(targets, end)))
            end++;
    }
    return Py_BuildValue("nn", k, end);
fail:
    Py_XDECREF(key);
    return NULL;
}

static PyMethodDef methods[] = {
    {"encode_targets", (PyCFunction)(void (*)(void))encode_targets, METH_FASTCALL,
     "encode_targets(targets, start, base, records, record_type, prefix, tails,"
     " leader_policy, leader_out, all_policy, all_out, all_targets) -> (at, end):"
     " see jetstream.protocol.ack.AckEncoder.encode_targets."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_ack_c",
    "The ack encoder's targets loop in C (jetstream.protocol.ack).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__ack_c(void) { return PyModule_Create(&module_def); }
